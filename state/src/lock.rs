//! The per-environment apply lock, held in the state itself, exclusive on SQLite and PostgreSQL.
//!
//! SQLite serialises single writes, but an apply is many writes that must not interleave with
//! another apply's to the same environment. The lock is a row of `env_lock` in the state, so
//! every name the file is reached by (a symlink, a hard link, another relative path) finds the
//! same lock. A holder renews its row while it works; a row whose process is gone (same host) or
//! that nobody renewed for [`STALE_AFTER`] is taken over, so a killed apply never leaves its
//! environment locked for good.
//!
//! Taking is a compare-and-swap on the row as it was read: an insert that does nothing when a
//! row appeared meanwhile, or an update of the holder that was read. PostgreSQL at READ
//! COMMITTED lets two takers read the same stale row, so an unconditional write would let both
//! win; with the swap, the second finds the row changed, touches nothing and looks again.
//! A holder learns through [`LockHold`] when its lock is no longer its own: the row names
//! another holder, or it could not renew it for [`STALE_AFTER`] (others may have taken it).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::db::{Conn, OptionalExtension, params};
use crate::{Fence, NOW, Result, StateError, state_error};

/// A lock not renewed for this long belongs to a holder that froze or died elsewhere.
const STALE_AFTER: Duration = Duration::from_secs(30);
/// How often a holder renews its lock: well inside [`STALE_AFTER`].
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How often a waiting process looks again.
const POLL: Duration = Duration::from_millis(200);

/// How long a lock lives unrenewed, and how often its holder renews it (shorter in tests).
#[derive(Debug, Clone, Copy)]
struct Timing {
    stale_after: Duration,
    renew_every: Duration,
}

const TIMING: Timing = Timing {
    stale_after: STALE_AFTER,
    renew_every: RENEW_EVERY,
};

/// The tokens of the locks this process holds now. A row with this process's pid and another
/// token was left by a lock of ours whose release could not be written (the database was
/// away): it is gone, and taken over at once rather than after [`STALE_AFTER`].
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held while one process applies to one environment of a state; released on drop.
#[derive(Debug)]
pub struct ApplyLock {
    hold: Arc<LockHold>,
    /// The token the row carries while it is ours.
    token: String,
    release: Option<mpsc::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

/// Whether a taken lock is still its holder's, for the work done under it to check before it
/// starts anything more (a driver call). Once lost, it stays lost.
#[derive(Debug)]
pub struct LockHold {
    env: String,
    stale_after: Duration,
    /// When the last write that found the row ours was sent: the row's `renewed_at` is no
    /// earlier, so others judge it stale no sooner than `stale_after` from here.
    confirmed: Mutex<Instant>,
    lost: AtomicBool,
}

impl LockHold {
    /// The environment the lock is of.
    pub fn env(&self) -> &str {
        &self.env
    }

    /// Whether the lock is still ours: no other holder took the row, and it was renewed
    /// recently enough that nobody may have.
    pub fn holds(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return false;
        }
        let confirmed = *self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if confirmed.elapsed() >= self.stale_after {
            self.lose();
            return false;
        }
        true
    }

    fn renewed(&self, sent: Instant) {
        *self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = sent;
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }
}

/// Who holds a lock, as the row says.
struct Holder {
    /// The holding lock's token: a takeover replaces exactly this holder.
    token: String,
    pid: i64,
    host: String,
    /// Seconds since the holder last renewed the row.
    silent_for: f64,
    /// The lease generation a daemon took it under; `None` for a command.
    generation: Option<i64>,
}

impl ApplyLock {
    /// Takes the lock of environment `env` of the state `state`, which a [`Store`] has opened
    /// (and so migrated) already. With `wait`, blocks until it is free; without, fails at once
    /// if another process has it.
    pub fn acquire(state: &Path, env: &str, wait: bool) -> Result<ApplyLock> {
        ApplyLock::take(state, env, wait, None, TIMING)
    }

    /// Takes the lock of `env` for the daemon holding its lease at `fence`, waiting for a
    /// command that holds it. A lock taken under an older generation of the lease is broken at
    /// once: its holder lost the lease, and the fence refuses every write it could still make.
    pub fn acquire_leased(state: &Path, fence: &Fence) -> Result<ApplyLock> {
        ApplyLock::take(state, &fence.env, true, Some(fence.generation), TIMING)
    }

    /// Takes the lock of `env` like [`ApplyLock::acquire`], on PostgreSQL through `store`'s
    /// own session rather than a connection of its own: a command that applies for less than
    /// a renewal period opens one connection, not two. Renewals run beside the store's work
    /// (and its transactions), so they open their own connection, at the first renewal. The
    /// lock is released through the store's session when dropped: drop it outside the store's
    /// transactions, from the thread that uses the store. On SQLite it is
    /// [`ApplyLock::acquire`] of the store's file.
    pub fn acquire_with(store: &crate::Store, env: &str, wait: bool) -> Result<ApplyLock> {
        match store.conn.share() {
            Some(session) => ApplyLock::take_through(
                store.path(),
                Link::Shared {
                    session,
                    renewals: None,
                },
                env,
                (wait, None),
                TIMING,
            ),
            None => ApplyLock::acquire(store.path(), env, wait),
        }
    }

    /// The environment the lock is of.
    pub fn env(&self) -> &str {
        self.hold.env()
    }

    /// Whether the lock is still ours (see [`LockHold::holds`]).
    pub fn holds(&self) -> bool {
        self.hold.holds()
    }

    /// What tells whether the lock is still ours, to hand to the work done under it.
    pub fn hold(&self) -> Arc<LockHold> {
        self.hold.clone()
    }

    fn take(
        state: &Path,
        env: &str,
        wait: bool,
        generation: Option<i64>,
        timing: Timing,
    ) -> Result<ApplyLock> {
        // A connection of its own (the renewer thread keeps it), with no key: the lock never
        // touches a secret.
        let link = Link::Own(crate::connect(state)?);
        ApplyLock::take_through(state, link, env, (wait, generation), timing)
    }

    fn take_through(
        state: &Path,
        mut link: Link,
        env: &str,
        (wait, generation): (bool, Option<i64>),
        timing: Timing,
    ) -> Result<ApplyLock> {
        // No transaction: each write below is a swap on what was read, so nothing needs
        // holding between the read and the write.
        let conn = link.main();
        let e = |source| state_error(state, source);
        let token = token();
        let host = host_name();
        let confirmed = loop {
            let holder = read_holder(conn, env).map_err(e)?;
            if let Some(h) = &holder
                && !h.is_gone(&host, timing.stale_after)
                && !h.is_older(generation)
            {
                if !wait {
                    return Err(StateError::Busy {
                        path: state.to_owned(),
                        env: env.to_owned(),
                        holder: format!("process {} on {}", h.pid, h.host),
                    });
                }
                std::thread::sleep(POLL);
                continue;
            }
            #[cfg(test)]
            tests::between_read_and_swap(env);
            let sent = Instant::now();
            // Live before the row says so: another taker of this process that reads the row
            // the moment it is written must find it held.
            live().insert(token.clone());
            let swapped = match &holder {
                None => conn.execute(
                    &format!(
                        "INSERT INTO env_lock
                           (env, holder, pid, host, acquired_at, renewed_at, generation)
                         VALUES (?1, ?2, ?3, ?4, {NOW}, {NOW}, ?5)
                         ON CONFLICT (env) DO NOTHING"
                    ),
                    params![env, token, std::process::id(), host, generation],
                ),
                Some(gone) => conn.execute(
                    &format!(
                        "UPDATE env_lock SET holder = ?2, pid = ?3, host = ?4,
                             acquired_at = {NOW}, renewed_at = {NOW}, generation = ?5
                         WHERE env = ?1 AND holder = ?6"
                    ),
                    params![env, token, std::process::id(), host, generation, gone.token],
                ),
            }
            .map_err(e)
            .inspect_err(|_| {
                live().remove(&token);
            })?;
            if swapped == 1 {
                break sent;
            }
            live().remove(&token);
            // Another taker changed the row between our read and our write: read it again.
        };
        let hold = Arc::new(LockHold {
            env: env.to_owned(),
            stale_after: timing.stale_after,
            confirmed: Mutex::new(confirmed),
            lost: AtomicBool::new(false),
        });
        let (release, released) = mpsc::channel::<()>();
        let renewing = hold.clone();
        let renewed_token = token.clone();
        let renewer = std::thread::Builder::new()
            .name(format!("lock {env}"))
            .spawn(move || {
                renew_until_released(
                    &mut link,
                    &renewing,
                    &renewed_token,
                    timing.renew_every,
                    &released,
                )
            })
            .map_err(|source| StateError::Create {
                path: state.to_owned(),
                source,
            })?;
        Ok(ApplyLock {
            hold,
            token,
            release: Some(release),
            renewer: Some(renewer),
        })
    }
}

/// Who held a lock that [`release_gone`] released.
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    /// `process PID on HOST`.
    pub holder: String,
    /// Seconds since it last renewed the lock.
    pub silent_for: f64,
}

/// The holder of `env`'s lock, with how long it has not renewed it; `None` when unlocked.
fn read_holder(conn: &Conn, env: &str) -> crate::db::DbResult<Option<Holder>> {
    conn.query_row(
        "SELECT holder, pid, host,
                (julianday('now') - julianday(renewed_at)) * 86400.0, generation
         FROM env_lock WHERE env = ?1",
        [env],
        |r| {
            Ok(Holder {
                token: r.get(0)?,
                pid: r.get(1)?,
                host: r.get(2)?,
                silent_for: r.get(3)?,
                generation: r.get(4)?,
            })
        },
    )
    .optional()
}

/// Releases the lock of `env` when its holder is gone: its process ended (on this host), or it
/// has not renewed the lock for longer than a live holder ever would. A live holder's lock is
/// refused as [`StateError::Busy`], naming it; an environment without a lock as
/// [`StateError::NotLocked`]. The delete is a swap on the holder that was read, like a taking.
pub fn release_gone(state: &Path, env: &str) -> Result<Released> {
    let conn = crate::connect(state)?;
    let e = |source| state_error(state, source);
    let holder = read_holder(&conn, env).map_err(e)?;
    let not_locked = || StateError::NotLocked {
        path: state.to_owned(),
        env: env.to_owned(),
    };
    let Some(h) = holder else {
        return Err(not_locked());
    };
    let named = format!("process {} on {}", h.pid, h.host);
    if !h.is_gone(&host_name(), TIMING.stale_after) {
        return Err(StateError::Busy {
            path: state.to_owned(),
            env: env.to_owned(),
            holder: format!("{named}, renewed {:.0}s ago", h.silent_for),
        });
    }
    let deleted = conn
        .execute(
            "DELETE FROM env_lock WHERE env = ?1 AND holder = ?2",
            params![env, h.token],
        )
        .map_err(e)?;
    if deleted == 0 {
        // Taken over meanwhile by a live taker, or released: not the gone holder's any more.
        return Err(not_locked());
    }
    Ok(Released {
        holder: named,
        silent_for: h.silent_for,
    })
}

impl Drop for ApplyLock {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
        live().remove(&self.token);
    }
}

impl Holder {
    /// Whether a daemon took this lock under an older generation of the lease than `mine`.
    fn is_older(&self, mine: Option<i64>) -> bool {
        matches!((mine, self.generation), (Some(mine), Some(theirs)) if theirs < mine)
    }

    /// Whether the holder is no more: its process ended (on this host), or it has not renewed
    /// the lock for longer than a live holder ever would.
    fn is_gone(&self, this_host: &str, stale_after: Duration) -> bool {
        if self.silent_for > stale_after.as_secs_f64() {
            return true;
        }
        if self.host != this_host {
            return false;
        }
        if self.pid == i64::from(std::process::id()) {
            return !live().contains(&self.token);
        }
        !process_alive(self.pid)
    }
}

/// Renews the row every `every` until the lock is dropped, then deletes it if it is still
/// ours. A renewal that finds the row another holder's loses the lock, and renewing stops; one
/// that fails (the database is away) is retried at the next tick, and the lock is lost only
/// once [`LockHold::holds`] finds it unrenewed for longer than others wait. Lost that way, the
/// row is still renewed while it is ours: the holder finishes the calls it has in flight, and
/// nobody should take the lock over meanwhile.
fn renew_until_released(
    link: &mut Link,
    hold: &LockHold,
    token: &str,
    every: Duration,
    released: &mpsc::Receiver<()>,
) {
    let mut taken = false;
    while let Err(mpsc::RecvTimeoutError::Timeout) = released.recv_timeout(every) {
        if taken {
            continue;
        }
        let sent = Instant::now();
        // Not connected (the database is away): as a renewal that failed.
        let Some(conn) = link.renewals() else {
            continue;
        };
        match conn.execute(
            &format!("UPDATE env_lock SET renewed_at = {NOW} WHERE env = ?1 AND holder = ?2"),
            params![hold.env, token],
        ) {
            Ok(0) => {
                taken = true;
                hold.lose();
            }
            Ok(_) => hold.renewed(sent),
            Err(_) => {}
        }
    }
    // The release need not wait for the disk: should a server crash undo it, the row names a
    // holder that is gone (its process ended, or its token is no live lock of this process),
    // and it is taken over as such. It can only keep the lock held longer, never less.
    let _ = link.main().transaction_unflushed().and_then(|tx| {
        tx.execute(
            "DELETE FROM env_lock WHERE env = ?1 AND holder = ?2",
            params![hold.env, token],
        )?;
        tx.commit()
    });
}

/// Where a lock reads and writes its row.
enum Link {
    /// A connection of its own, for everything; the renewer keeps it.
    Own(Conn),
    /// The PostgreSQL session of the store that took the lock: taking and releasing go
    /// through it; renewals, which run beside the store's work and its transactions, through
    /// a connection of their own, made at the first renewal.
    Shared {
        session: Conn,
        renewals: Option<Box<Conn>>,
    },
}

impl Link {
    /// The connection taking and releasing go through.
    fn main(&self) -> &Conn {
        match self {
            Link::Own(conn) => conn,
            Link::Shared { session, .. } => session,
        }
    }

    /// The connection renewals go through, connecting if need be; `None` while it cannot.
    fn renewals(&mut self) -> Option<&Conn> {
        match self {
            Link::Own(conn) => Some(conn),
            Link::Shared { session, renewals } => {
                if renewals.is_none()
                    && let Conn::Pg(pg) = session
                {
                    *renewals = pg.open_again().ok().map(|c| Box::new(Conn::Pg(c)));
                }
                renewals.as_deref()
            }
        }
    }
}

/// A token no other lock, in this process or another, carries.
pub(crate) fn token() -> String {
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
pub(crate) fn process_alive(pid: i64) -> bool {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Barrier, LazyLock};

    use super::*;
    use crate::Store;
    use crate::tests::each_backend;

    /// Takers of one environment held between their read and their swap until all of them have
    /// read: the interleaving where an unconditional write lets several win.
    struct Race {
        barrier: Barrier,
        /// Takers still to be held: a taker that reads again after losing the swap goes on.
        left: AtomicUsize,
    }

    static RACES: LazyLock<Mutex<BTreeMap<String, Arc<Race>>>> = LazyLock::new(Mutex::default);

    pub(super) fn between_read_and_swap(env: &str) {
        let race = RACES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(env)
            .cloned();
        if let Some(race) = race
            && race
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            race.barrier.wait();
        }
    }

    /// `takers` threads taking the lock of `env` at once, each reading the row before any of
    /// them writes; returns what each got.
    fn race(state: &Path, env: &str, takers: usize) -> Vec<Result<ApplyLock>> {
        RACES.lock().unwrap().insert(
            env.to_owned(),
            Arc::new(Race {
                barrier: Barrier::new(takers),
                left: AtomicUsize::new(takers),
            }),
        );
        let got = std::thread::scope(|s| {
            let threads: Vec<_> = (0..takers)
                .map(|_| s.spawn(|| ApplyLock::acquire(state, env, false)))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        });
        RACES.lock().unwrap().remove(env);
        got
    }

    /// A row for `env` whose holder, on another host, last renewed it a minute ago.
    fn stale_row(store: &Store, env: &str) {
        store
            .conn
            .execute(
                "INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at)
                 VALUES (?1, 'ghost', 1, 'elsewhere',
                   strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds'),
                   strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds'))",
                [env],
            )
            .unwrap();
    }

    fn holder_of(store: &Store, env: &str) -> Option<String> {
        store
            .conn
            .query_row("SELECT holder FROM env_lock WHERE env = ?1", [env], |r| {
                r.get(0)
            })
            .optional()
            .unwrap()
    }

    #[test]
    fn a_row_a_lock_of_this_process_left_behind_is_taken_over_at_once() {
        // A lock dropped while the database was away could not delete its row: the row names
        // this process, renewed moments ago, with a token no live lock of ours carries.
        each_backend(|store| {
            let state = store.path().to_owned();
            store
                .conn
                .execute(
                    &format!(
                        "INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at)
                         VALUES ('left', 'left-behind', ?1, ?2, {NOW}, {NOW})"
                    ),
                    params![std::process::id(), host_name()],
                )
                .unwrap();
            let lock = ApplyLock::acquire(&state, "left", false).expect("taken over at once");
            assert!(lock.holds());
            // A live lock of this process is another matter: a second taker waits for it.
            assert!(matches!(
                ApplyLock::acquire(&state, "left", false),
                Err(StateError::Busy { .. })
            ));
        });
    }

    #[test]
    fn of_takers_racing_for_a_free_or_stale_lock_exactly_one_wins() {
        const TAKERS: usize = 6;
        const ROUNDS: usize = 10;
        each_backend(|store| {
            let state = store.path().to_owned();
            for round in 0..ROUNDS {
                // Even rounds race to insert the row, odd ones to take a stale holder's over.
                let env = format!("race-{round}");
                if round % 2 == 1 {
                    stale_row(&store, &env);
                }
                let got = race(&state, &env, TAKERS);
                let winners: Vec<&ApplyLock> = got.iter().filter_map(|r| r.as_ref().ok()).collect();
                assert_eq!(
                    winners.len(),
                    1,
                    "round {round} on {:?}: {got:?}",
                    store.backend()
                );
                for lost in got.iter().filter_map(|r| r.as_ref().err()) {
                    assert!(matches!(lost, StateError::Busy { .. }), "{lost}");
                }
                assert!(winners[0].holds());
                assert_ne!(holder_of(&store, &env).as_deref(), Some("ghost"));
                drop(got);
                assert_eq!(holder_of(&store, &env), None, "released on drop");
            }
        });
    }

    /// The backends connected to the store's PostgreSQL database (each test has its own);
    /// `None` on SQLite.
    fn sessions(store: &Store) -> Option<i64> {
        (store.backend() == crate::db::Backend::Postgres).then(|| {
            store
                .conn
                .query_row(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()",
                    params![],
                    |r| r.get(0),
                )
                .unwrap()
        })
    }

    #[test]
    fn a_lock_taken_through_a_stores_session_opens_no_connection_and_still_excludes() {
        each_backend(|store| {
            let state = store.path().to_owned();
            let before = sessions(&store);
            let lock = ApplyLock::acquire_with(&store, "dev", false).unwrap();
            assert!(lock.holds());
            assert_eq!(sessions(&store), before, "{:?}", store.backend());
            assert!(holder_of(&store, "dev").is_some());
            // Another taker, on a connection of its own, finds it held; so does one through
            // the same store.
            assert!(matches!(
                ApplyLock::acquire(&state, "dev", false),
                Err(StateError::Busy { .. })
            ));
            assert!(matches!(
                ApplyLock::acquire_with(&store, "dev", false),
                Err(StateError::Busy { .. })
            ));
            drop(lock);
            assert_eq!(holder_of(&store, "dev"), None, "released on drop");
            let next = ApplyLock::acquire(&state, "dev", false).expect("free once released");
            assert!(next.holds());
        });
    }

    #[test]
    fn renewals_of_a_lock_taken_through_a_stores_session_do_not_wait_for_its_transaction() {
        // Were renewals sent on the store's session, they would join whatever transaction it
        // has open: unseen by others until it ends, undone if it rolls back.
        each_backend(|store| {
            let Some(session) = store.conn.share() else {
                return; // SQLite: the lock has its own connection (acquire_with is acquire).
            };
            let timing = Timing {
                stale_after: STALE_AFTER,
                renew_every: Duration::from_millis(20),
            };
            let link = Link::Shared {
                session,
                renewals: None,
            };
            let lock =
                ApplyLock::take_through(store.path(), link, "dev", (false, None), timing).unwrap();
            let other = crate::connect(store.path()).unwrap();
            let renewed_at = || -> String {
                other
                    .query_row(
                        "SELECT renewed_at FROM env_lock WHERE env = 'dev'",
                        params![],
                        |r| r.get(0),
                    )
                    .unwrap()
            };
            let tx = store.conn.transaction().unwrap();
            let taken = renewed_at();
            gitplane_testkit::eventually(
                "a renewal seen by another connection while the store's transaction is open",
                Duration::from_secs(10),
                || (renewed_at() != taken).then_some(()),
            );
            drop(tx);
            assert!(lock.holds());
            drop(lock);
            assert_eq!(holder_of(&store, "dev"), None);
        });
    }

    #[test]
    fn a_holder_whose_row_another_took_learns_it_lost_the_lock() {
        each_backend(|store| {
            let state = store.path().to_owned();
            let timing = Timing {
                stale_after: STALE_AFTER,
                renew_every: Duration::from_millis(20),
            };
            let lock = ApplyLock::take(&state, "dev", false, None, timing).unwrap();
            let hold = lock.hold();
            assert!(hold.holds());
            store
                .conn
                .execute(
                    "UPDATE env_lock SET holder = 'thief' WHERE env = 'dev'",
                    params![],
                )
                .unwrap();
            gitplane_testkit::eventually(
                "the renewer to notice the lock was taken",
                Duration::from_secs(10),
                || (!hold.holds()).then_some(()),
            );
            assert!(!lock.holds());
            drop(lock);
            // Releasing a lost lock leaves the new holder's row alone.
            assert_eq!(holder_of(&store, "dev").as_deref(), Some("thief"));
        });
    }

    #[test]
    fn a_holder_that_cannot_renew_for_the_stale_time_has_lost_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.db");
        let _store = Store::open(&state).unwrap();
        let timing = Timing {
            stale_after: Duration::from_millis(800),
            renew_every: Duration::from_millis(20),
        };
        let lock = ApplyLock::take(&state, "dev", false, None, timing).unwrap();
        // Another writer holds the file: every renewal waits for it (up to the busy timeout,
        // far longer than the stale time) and none succeeds.
        let blocker = rusqlite::Connection::open(&state).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let blocked = Instant::now();
        gitplane_testkit::eventually(
            "the lock lost without a renewal",
            Duration::from_secs(5),
            || (!lock.holds()).then_some(()),
        );
        // Not lost before others could judge it stale: the last renewal was at most one tick
        // before the writer came.
        assert!(
            blocked.elapsed() >= timing.stale_after - 2 * timing.renew_every,
            "lost after {:?}",
            blocked.elapsed()
        );
        blocker.execute_batch("ROLLBACK").unwrap();
        // Lost stays lost, though the row is ours again. Not a wait for an event: renewals get
        // their chance, to show that none takes the lock back.
        std::thread::sleep(3 * timing.renew_every);
        assert!(!lock.holds());
    }
}
