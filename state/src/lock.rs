//! The per-environment apply lock, held in the state file itself.
//!
//! SQLite serialises single writes, but an apply is many writes that must not interleave with
//! another apply's to the same environment. The lock is a row of `env_lock` in the state file,
//! so every name the file is reached by (a symlink, a hard link, another relative path) finds
//! the same lock. A holder renews its row while it works; a row whose process is gone (same
//! host) or that nobody renewed for [`STALE_AFTER`] is taken over, so a killed apply never
//! leaves its environment locked for good.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::db::{Conn, OptionalExtension, params};
use crate::{Fence, NOW, Result, StateError, state_error};

/// A lock not renewed for this long belongs to a holder that froze or died elsewhere.
const STALE_AFTER: Duration = Duration::from_secs(30);
/// How often a holder renews its lock: well inside [`STALE_AFTER`].
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How often a waiting process looks again.
const POLL: Duration = Duration::from_millis(200);

/// Held while one process applies to one environment of a state file; released on drop.
#[derive(Debug)]
pub struct ApplyLock {
    release: Option<mpsc::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

/// Who holds a lock, as the row says.
struct Holder {
    pid: i64,
    host: String,
    /// Seconds since the holder last renewed the row.
    silent_for: f64,
    /// The lease generation a daemon took it under; `None` for a command.
    generation: Option<i64>,
}

impl ApplyLock {
    /// Takes the lock of environment `env` of the state file `state`, which a [`Store`] has
    /// opened (and so migrated) already. With `wait`, blocks until it is free; without, fails
    /// at once if another process has it.
    pub fn acquire(state: &Path, env: &str, wait: bool) -> Result<ApplyLock> {
        ApplyLock::take(state, env, wait, None)
    }

    /// Takes the lock of `env` for the daemon holding its lease at `fence`, waiting for a
    /// command that holds it. A lock taken under an older generation of the lease is broken at
    /// once: its holder lost the lease, and the fence refuses every write it could still make.
    pub fn acquire_leased(state: &Path, fence: &Fence) -> Result<ApplyLock> {
        ApplyLock::take(state, &fence.env, true, Some(fence.generation))
    }

    fn take(state: &Path, env: &str, wait: bool, generation: Option<i64>) -> Result<ApplyLock> {
        // A connection of its own (the renewer thread keeps it), with no key: the lock never
        // touches a secret.
        let conn = crate::connect(state)?;
        let token = token();
        let host = host_name();
        loop {
            let tx = conn.transaction().map_err(|e| state_error(state, e))?;
            let holder = tx
                .query_row(
                    "SELECT pid, host, (julianday('now') - julianday(renewed_at)) * 86400.0,
                            generation
                     FROM env_lock WHERE env = ?1",
                    [env],
                    |r| {
                        Ok(Holder {
                            pid: r.get(0)?,
                            host: r.get(1)?,
                            silent_for: r.get(2)?,
                            generation: r.get(3)?,
                        })
                    },
                )
                .optional()
                .map_err(|e| state_error(state, e))?;
            match holder {
                Some(h) if !h.is_gone(&host) && !h.is_older(generation) => {
                    drop(tx);
                    if !wait {
                        return Err(StateError::Busy {
                            path: state.to_owned(),
                            env: env.to_owned(),
                            holder: format!("process {} on {}", h.pid, h.host),
                        });
                    }
                    std::thread::sleep(POLL);
                }
                _ => {
                    tx.execute(
                        &format!(
                            "INSERT INTO env_lock
                               (env, holder, pid, host, acquired_at, renewed_at, generation)
                             VALUES (?1, ?2, ?3, ?4, {NOW}, {NOW}, ?5)
                             ON CONFLICT (env) DO UPDATE SET holder = excluded.holder,
                                 pid = excluded.pid, host = excluded.host,
                                 acquired_at = excluded.acquired_at,
                                 renewed_at = excluded.renewed_at,
                                 generation = excluded.generation"
                        ),
                        params![env, token, std::process::id(), host, generation],
                    )
                    .map_err(|e| state_error(state, e))?;
                    tx.commit().map_err(|e| state_error(state, e))?;
                    break;
                }
            }
        }
        let (release, released) = mpsc::channel::<()>();
        let env = env.to_owned();
        let renewer = std::thread::Builder::new()
            .name(format!("lock {env}"))
            .spawn(move || renew_until_released(conn, &env, &token, &released))
            .map_err(|source| StateError::Create {
                path: state.to_owned(),
                source,
            })?;
        Ok(ApplyLock {
            release: Some(release),
            renewer: Some(renewer),
        })
    }
}

impl Drop for ApplyLock {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
    }
}

impl Holder {
    /// Whether a daemon took this lock under an older generation of the lease than `mine`.
    fn is_older(&self, mine: Option<i64>) -> bool {
        matches!((mine, self.generation), (Some(mine), Some(theirs)) if theirs < mine)
    }

    /// Whether the holder is no more: its process ended (on this host), or it has not renewed
    /// the lock for longer than a live holder ever would.
    fn is_gone(&self, this_host: &str) -> bool {
        if self.silent_for > STALE_AFTER.as_secs_f64() {
            return true;
        }
        self.host == this_host && !process_alive(self.pid)
    }
}

/// Renews the row every [`RENEW_EVERY`] until the lock is dropped, then deletes it. A failed
/// renewal is retried at the next tick: the lock only goes stale after [`STALE_AFTER`].
fn renew_until_released(conn: Conn, env: &str, token: &str, released: &mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = released.recv_timeout(RENEW_EVERY) {
        let _ = conn.execute(
            &format!("UPDATE env_lock SET renewed_at = {NOW} WHERE env = ?1 AND holder = ?2"),
            params![env, token],
        );
    }
    let _ = conn.execute(
        "DELETE FROM env_lock WHERE env = ?1 AND holder = ?2",
        params![env, token],
    );
}

/// A token no other lock, in this process or another, carries.
fn token() -> String {
    static TAKEN: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        TAKEN.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Whether process `pid` exists (signal 0 delivers nothing; EPERM means it exists but is
/// another user's).
fn process_alive(pid: i64) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}
