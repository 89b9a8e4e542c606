//! Knowing when to look again: file events on a repository's refs, a mirror of a remote fetched
//! on an interval, and cron schedules for drift runs.
//!
//! Nothing here says *what* changed: every signal means "resolve the watched ref again"
//! (level-triggered), so a lost or duplicated event costs nothing but a look.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
pub fn fetch_mirror(url: &str, mirror: &Path, limit: Duration) -> Result<(), WatchError> {
    // A token in the URL (`https://user:TOKEN@host/...`) must never reach a message or a log.
    let hide = |text: String| redact_url_credentials(&text, url);
    let result = if mirror.join("HEAD").exists() {
        run_git_within(
            Some(mirror),
            &["fetch", "--prune", "--quiet", "origin"],
            limit,
        )
    } else {
        if let Some(parent) = mirror.parent() {
            std::fs::create_dir_all(parent).map_err(|e| WatchError::Git {
                args: hide(format!("clone --mirror {url}")),
                message: e.to_string(),
            })?;
        }
        let target = mirror.to_string_lossy().into_owned();
        run_git_within(None, &["clone", "--mirror", "--quiet", url, &target], limit)
    };
    result.map_err(|GitFailed { args, message }| WatchError::Git {
        args: hide(args),
        message: hide(message),
    })
}

/// `text` with the credentials of `url` (its user-info, `user:password@`) replaced by `***`,
/// wherever they occur.
pub fn redact_url_credentials(text: &str, url: &str) -> String {
    let Some((_, rest)) = url.split_once("://") else {
        return text.to_owned();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    match authority.rsplit_once('@') {
        Some((userinfo, _)) if !userinfo.is_empty() => text.replace(userinfo, "***"),
        _ => text.to_owned(),
    }
}

/// A `git` command that did not succeed: its arguments, and what it said.
#[derive(Debug)]
pub struct GitFailed {
    pub args: String,
    pub message: String,
}

/// How long a local `git` command (init, commit) may take.
const LOCAL_GIT_LIMIT: Duration = Duration::from_secs(120);

/// Runs the `git` program (in `dir`, if given), never prompting for a password.
pub fn run_git(dir: Option<&Path>, args: &[&str]) -> Result<(), GitFailed> {
    run_git_within(dir, args, LOCAL_GIT_LIMIT)
}

/// Runs `git` for at most `limit`: a remote that stops answering must not stall the daemon,
/// so past it git is killed with every process it started (ssh, remote helpers).
pub fn run_git_within(dir: Option<&Path>, args: &[&str], limit: Duration) -> Result<(), GitFailed> {
    let failed = |message: String| GitFailed {
        args: args.join(" "),
        message,
    };
    let mut cmd = Command::new("git");
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    // Never wait for a password on a terminal nobody reads.
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| failed(e.to_string()))?;
    let stderr = child.stderr.take().map(|mut pipe| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                kill_group(&mut child);
                return Err(failed(format!(
                    "no answer within {}s: git was stopped (a remote that does not respond?)",
                    limit.as_secs()
                )));
            }
            Err(e) => {
                kill_group(&mut child);
                return Err(failed(e.to_string()));
            }
        }
    };
    let text = stderr
        .and_then(|t| t.join().ok())
        .unwrap_or_default()
        .trim()
        .to_owned();
    if status.success() {
        Ok(())
    } else {
        Err(failed(text))
    }
}

/// Kills `child`'s process group and reaps it.
fn kill_group(child: &mut std::process::Child) {
    if let Some(group) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// When `schedule` next fires after `now`.
pub fn next_fire(schedule: &cron::Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule.after(&now).next()
}

#[cfg(test)]
mod tests {

    #[test]
    fn credentials_in_a_url_are_hidden() {
        let url = "https://bot:ghp_T0KEN@git.example.com/platform.git";
        assert_eq!(
            redact_url_credentials(&format!("fatal: unable to access '{url}/': 403"), url),
            "fatal: unable to access 'https://***@git.example.com/platform.git/': 403"
        );
        let token_only = "https://ghp_T0KEN@git.example.com/p.git";
        assert_eq!(
            redact_url_credentials(token_only, token_only),
            "https://***@git.example.com/p.git"
        );
        // Nothing to hide: an @ in the path is not user-info.
        let plain = "https://git.example.com/team@corp/p.git";
        assert_eq!(redact_url_credentials(plain, plain), plain);
        assert_eq!(redact_url_credentials("x", "/srv/git/p.git"), "x");
    }
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
