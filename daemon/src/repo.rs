//! Reading a commit of the config repository straight from git's object database, no checkout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The files of one commit that gitplane reads, by repository path.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The full commit id (40 hex characters).
    pub commit: String,
    pub files: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("{path}: not a git repository (or none above it): {message}")]
    Open { path: PathBuf, message: String },
    #[error("{path}: cannot resolve revision '{rev}': {message}")]
    Revision {
        path: PathBuf,
        rev: String,
        message: String,
    },
    #[error("{path}: the repository has no commits yet (HEAD is unborn): commit something first")]
    Unborn { path: PathBuf },
    #[error("{path}: cannot read commit {commit}: {message}")]
    Read {
        path: PathBuf,
        commit: String,
        message: String,
    },
}

/// The folders and files of the repository format (DESIGN.md section 2).
fn wanted(path: &str) -> bool {
    path == "gitplane.yaml"
        || path.starts_with("environments/")
        || path.starts_with("workloads/")
        || path.starts_with("definitions/")
}

/// A config repository, bare or not, opened isolated from the user's git configuration.
pub struct ConfigRepo {
    repo: gix::Repository,
    path: PathBuf,
}

impl ConfigRepo {
    /// Opens the repository at `path`, or the one that contains it.
    pub fn open(path: &Path) -> Result<Self, RepoError> {
        let repo = gix::discover_opts(path, Default::default(), gix::open::Options::isolated())
            .map_err(|e| RepoError::Open {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        Ok(ConfigRepo {
            repo,
            path: path.to_owned(),
        })
    }

    /// Resolves `rev` (a branch, tag or commit id; `None` is HEAD) to a full commit id.
    pub fn resolve(&self, rev: Option<&str>) -> Result<String, RepoError> {
        let id = match rev {
            None => {
                let head = self.repo.head_id().map_err(|_| RepoError::Unborn {
                    path: self.path.clone(),
                })?;
                head.detach()
            }
            Some(rev) => self
                .repo
                .rev_parse_single(rev)
                .map_err(|e| RepoError::Revision {
                    path: self.path.clone(),
                    rev: rev.to_owned(),
                    message: format!(
                        "no branch, tag or commit of that name ({})",
                        e.to_string().trim()
                    ),
                })?
                .detach(),
        };
        let commit = self
            .repo
            .find_object(id)
            .and_then(|o| o.peel_to_commit())
            .map_err(|e| RepoError::Revision {
                path: self.path.clone(),
                rev: rev.unwrap_or("HEAD").to_owned(),
                message: e.to_string(),
            })?;
        Ok(commit.id.to_string())
    }

    /// Reads every file of the repository format at `commit`.
    pub fn snapshot(&self, commit: &str) -> Result<Snapshot, RepoError> {
        let read_err = |message: String| RepoError::Read {
            path: self.path.clone(),
            commit: commit.to_owned(),
            message,
        };
        let id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(|e| read_err(e.to_string()))?;
        let tree = self
            .repo
            .find_commit(id)
            .and_then(|c| c.tree())
            .map_err(|e| read_err(e.to_string()))?;
        let entries = tree
            .traverse()
            .breadthfirst
            .files()
            .map_err(|e| read_err(e.to_string()))?;
        let mut files = BTreeMap::new();
        for entry in entries {
            if !entry.mode.is_blob() {
                continue;
            }
            let path = entry.filepath.to_string();
            if !wanted(&path) {
                continue;
            }
            let blob = self
                .repo
                .find_blob(entry.oid)
                .map_err(|e| read_err(format!("{path}: {e}")))?;
            files.insert(path, blob.data.clone());
        }
        Ok(Snapshot {
            commit: commit.to_owned(),
            files,
        })
    }

    /// Resolves `rev` and reads its files.
    pub fn load(&self, rev: Option<&str>) -> Result<Snapshot, RepoError> {
        let commit = self.resolve(rev)?;
        self.snapshot(&commit)
    }
}
