//! Knowing when to look again: file events on a repository's refs, a mirror of a remote fetched
//! on an interval, and cron schedules for drift runs.
//!
//! Nothing here says *what* changed: every signal means "resolve the watched ref again"
//! (level-triggered), so a lost or duplicated event costs nothing but a look.

use std::path::{Path, PathBuf};
use std::process::Command;

use chrono::{DateTime, Utc};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch {path}: {message}")]
    Notify { path: PathBuf, message: String },
    #[error("git {args}: {message}")]
    Git { args: String, message: String },
}

/// Watches the refs of the repository whose git directory is `git_dir`: loose refs under
/// `refs/` and, in the directory itself, `packed-refs` and `HEAD` (which git replaces by
/// rename, so the directory is watched, not the files). Each relevant event sends a wake-up on
/// `wake`, a channel of capacity 1, so a burst of events becomes one look.
///
/// The returned watcher stops when dropped.
pub fn watch_refs(
    git_dir: &Path,
    wake: mpsc::Sender<()>,
) -> Result<notify::RecommendedWatcher, WatchError> {
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(e) if relevant(&e) => {
                // Full means a look is already pending, which covers this event too.
                let _ = wake.try_send(());
            }
            Ok(_) => {}
            // An overflow or a watch error: look anyway; the periodic check covers the rest.
            Err(_) => {
                let _ = wake.try_send(());
            }
        })
        .map_err(|e| WatchError::Notify {
            path: git_dir.to_owned(),
            message: e.to_string(),
        })?;
    for (path, mode) in [
        (git_dir.join("refs"), RecursiveMode::Recursive),
        (git_dir.to_owned(), RecursiveMode::NonRecursive),
    ] {
        watcher.watch(&path, mode).map_err(|e| WatchError::Notify {
            path: path.clone(),
            message: e.to_string(),
        })?;
    }
    Ok(watcher)
}

/// Reads (including our own gix reads) and lock files in flight are not changes.
fn relevant(event: &notify::Event) -> bool {
    if matches!(event.kind, EventKind::Access(_)) {
        return false;
    }
    event.paths.iter().any(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        !name.ends_with(".lock")
            && (p.components().any(|c| c.as_os_str() == "refs")
                || name == "packed-refs"
                || name == "HEAD")
    })
}

/// Makes `mirror` a bare mirror of `url` (cloning it the first time) and fetches.
///
/// This uses the `git` program rather than gix: gix's network support would add a transport,
/// TLS and credential stack to every build for a job `git` already does with the host's SSH
/// keys, credential helpers and proxies, which a platform team has configured for `git` anyway.
pub fn fetch_mirror(url: &str, mirror: &Path) -> Result<(), WatchError> {
    if mirror.join("HEAD").exists() {
        git(Some(mirror), &["fetch", "--prune", "--quiet", "origin"])
    } else {
        if let Some(parent) = mirror.parent() {
            std::fs::create_dir_all(parent).map_err(|e| WatchError::Git {
                args: format!("clone --mirror {url}"),
                message: e.to_string(),
            })?;
        }
        let target = mirror.to_string_lossy().into_owned();
        git(None, &["clone", "--mirror", "--quiet", url, &target])
    }
}

fn git(dir: Option<&Path>, args: &[&str]) -> Result<(), WatchError> {
    run_git(dir, args).map_err(|GitFailed { args, message }| WatchError::Git { args, message })
}

/// A `git` command that did not succeed: its arguments, and what it said.
#[derive(Debug)]
pub struct GitFailed {
    pub args: String,
    pub message: String,
}

/// Runs the `git` program (in `dir`, if given), never prompting for a password.
pub fn run_git(dir: Option<&Path>, args: &[&str]) -> Result<(), GitFailed> {
    let failed = |message: String| GitFailed {
        args: args.join(" "),
        message,
    };
    let mut cmd = Command::new("git");
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    // Never wait for a password on a terminal nobody reads.
    cmd.args(args).env("GIT_TERMINAL_PROMPT", "0");
    let out = cmd.output().map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

/// When `schedule` next fires after `now`.
pub fn next_fire(schedule: &cron::Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule.after(&now).next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn ref_updates_wake_and_reads_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let git_dir = dir.path();
        std::fs::create_dir_all(git_dir.join("refs/heads")).unwrap();
        std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let _watcher = watch_refs(git_dir, tx).unwrap();

        // A read is not a change.
        let _ = std::fs::read(git_dir.join("HEAD")).unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), rx.recv())
                .await
                .is_err(),
            "a read woke the daemon"
        );
        // git writes main.lock and renames it over main.
        std::fs::write(git_dir.join("refs/heads/main.lock"), "abc\n").unwrap();
        std::fs::rename(
            git_dir.join("refs/heads/main.lock"),
            git_dir.join("refs/heads/main"),
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("a ref update wakes the daemon");
        // packed-refs, replaced by rename too.
        while rx.try_recv().is_ok() {}
        std::fs::write(git_dir.join("packed-refs.new"), "x\n").unwrap();
        std::fs::rename(git_dir.join("packed-refs.new"), git_dir.join("packed-refs")).unwrap();
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("packed-refs wakes the daemon");
    }

    #[test]
    fn crontab_schedules_fire_on_time() {
        let s = crate::model::Schedule::parse("*/15 * * * *").unwrap();
        let now: DateTime<Utc> = "2026-11-21T10:07:00Z".parse().unwrap();
        assert_eq!(
            next_fire(&s.cron, now).unwrap().to_rfc3339(),
            "2026-11-21T10:15:00+00:00"
        );
        assert!(crate::model::Schedule::parse("every day").is_err());
    }
}
