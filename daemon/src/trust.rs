//! Whether a state and a repository belong together: the check a daemon makes before it takes
//! a lease, and commands make before they read or write a state with a repository.
//!
//! A state records the repository it serves the first time a daemon or a writing command uses
//! it with one: the root commit of the watched ref's history and where it was read from. From
//! then on, a repository is the same one when that root commit is in its object database: one
//! lookup, no walk, and a clone, a mirror or a fork that shares the history all pass. Another
//! repository is refused before anything is written, with both named.

use std::path::Path;

use gitplane_state::{StateError, Store};

use crate::repo::{ConfigRepo, RepoError};

/// A repository that is not the one the state serves: both, as the user knows them.
#[derive(Debug, thiserror::Error)]
#[error(
    "state {state} belongs to repository {recorded_url} (root commit {recorded_root}, recorded \
     {recorded_at}), but {url} is another repository ({root}): a state serves one repository. \
     Point gitplane at {recorded_url}, or give this repository a state of its own; nothing was \
     changed"
)]
pub struct OtherRepository {
    pub state: String,
    pub recorded_url: String,
    pub recorded_root: String,
    pub recorded_at: String,
    pub url: String,
    /// `root commit ID`, or why there is none.
    pub root: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(transparent)]
    OtherRepository(Box<OtherRepository>),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// Where a repository was read from, as a state records it: a local path made absolute, or a
/// remote's URL without its credentials.
pub fn shown_location(local: &Path, remote_url: Option<&str>) -> String {
    match remote_url {
        Some(url) => crate::watch::redact_url_credentials(url, url),
        None => std::fs::canonicalize(local)
            .or_else(|_| std::path::absolute(local))
            .unwrap_or_else(|_| local.to_owned())
            .display()
            .to_string(),
    }
}

/// Checks that `repo` (read from `shown`, watching `watched`: a ref, or HEAD when `None`) is
/// the repository `store` serves. With `record`, a state that records none yet records this
/// one (the root commit of the watched ref's history): what a daemon's start and a command
/// that writes do. A repository with no commit yet records nothing.
pub fn check_repository(
    store: &Store,
    repo: &ConfigRepo,
    shown: &str,
    watched: Option<&str>,
    record: bool,
) -> Result<(), TrustError> {
    let recorded = match store.repository()? {
        Some(recorded) => recorded,
        None if !record => return Ok(()),
        None => {
            let Ok(head) = repo.resolve(watched) else {
                return Ok(());
            };
            let root = repo.root_commit(&head)?;
            let recorded = store.record_repository(&root, shown)?;
            // Another process may have recorded its own repository first.
            if recorded.root_commit == root {
                return Ok(());
            }
            recorded
        }
    };
    if repo.has_commit(&recorded.root_commit) {
        return Ok(());
    }
    // Only to say what this repository is: its history is walked in this error path alone.
    let root = match repo.resolve(watched) {
        Ok(head) => match repo.root_commit(&head) {
            Ok(root) => format!("root commit {root}"),
            Err(e) => format!("its root commit cannot be read: {e}"),
        },
        Err(_) => format!("no commit at {}", watched.unwrap_or("HEAD")),
    };
    Err(TrustError::OtherRepository(Box::new(OtherRepository {
        state: store.path().display().to_string(),
        recorded_url: recorded.url,
        recorded_root: recorded.root_commit,
        recorded_at: recorded.recorded_at,
        url: shown.to_owned(),
        root,
    })))
}
