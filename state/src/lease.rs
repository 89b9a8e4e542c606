//! Leases of environments held by daemons that share a PostgreSQL state: which daemon
//! reconciles which environment, renewed by a heartbeat, taken over when it lapses, and the
//! fence every write of a holder passes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::db::{Backend, Conn, DbError, DbResult, OptionalExtension, Tx, params};
use crate::{NOW, Result, state_error};

/// A lease a store writes under: `daemon` holds `env` at `generation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub env: String,
    pub daemon: String,
    pub generation: i64,
}

/// Refuses the transaction unless every fence still holds; on PostgreSQL the lease rows stay
/// locked (shared) until it ends, so a takeover waits for it rather than slipping in before it
/// commits.
pub(crate) fn check_fences(tx: &Tx<'_>, fences: &[Fence]) -> DbResult<()> {
    if fences.is_empty() {
        return Ok(());
    }
    let mut stmt = tx.prepare_cached(fence_query(tx))?;
    for f in fences {
        if !stmt.exists(params![f.env, f.daemon, f.generation])? {
            return Err(fenced(f));
        }
    }
    Ok(())
}

/// [`check_fences`] without waiting for PostgreSQL (see [`crate::db::Stmt::run_expecting_row`]):
/// a fence that moved fails the transaction at its next call that waits, at the latest its
/// commit, and until then the lease rows it found stay locked as they would.
pub(crate) fn check_fences_pipelined(tx: &Tx<'_>, fences: &[Fence]) -> DbResult<()> {
    if fences.is_empty() {
        return Ok(());
    }
    let mut stmt = tx.prepare_cached(fence_query(tx))?;
    for f in fences {
        stmt.run_expecting_row(params![f.env, f.daemon, f.generation], fenced(f))?;
    }
    Ok(())
}

fn fence_query(tx: &Tx<'_>) -> &'static str {
    match tx.backend() {
        Backend::Postgres => {
            "SELECT 1 FROM env_lease WHERE env = ?1 AND daemon = ?2 AND generation = ?3 FOR SHARE"
        }
        Backend::Sqlite => {
            "SELECT 1 FROM env_lease WHERE env = ?1 AND daemon = ?2 AND generation = ?3"
        }
    }
}

fn fenced(f: &Fence) -> DbError {
    DbError::Fenced {
        env: f.env.clone(),
        generation: f.generation,
    }
}

/// A lease as its holder sees it: valid until a moment of its own monotonic clock, so a holder
/// that froze (SIGSTOP, a stalled VM) knows when it wakes that it may no longer write, before
/// the fence tells it.
#[derive(Debug)]
pub struct LeaseHold {
    fence: Fence,
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
}

impl LeaseHold {
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Whether the lease is still this daemon's: renewed recently enough and not lost.
    pub fn holds(&self) -> bool {
        !self.lost.load(Ordering::SeqCst)
            && Instant::now() < *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewed(&self, until: Instant) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }
}

/// What one heartbeat changed.
#[derive(Debug, Default)]
pub struct Beat {
    /// Leases taken this beat.
    pub gained: Vec<Arc<LeaseHold>>,
    /// Environments whose lease this daemon no longer has (taken over, or given up to balance).
    pub lost: Vec<String>,
    /// Daemons seen alive, this one included.
    pub live: usize,
}

/// One daemon's leases: its membership row, the leases it holds, and the heartbeat that renews,
/// balances and takes them. It has a connection of its own.
pub struct Leases {
    conn: Conn,
    path: PathBuf,
    daemon: String,
    host: String,
    ttl: Duration,
    held: BTreeMap<String, Arc<LeaseHold>>,
    beats: u64,
}

/// A lease's time as SQL's date modifier (`'+15.000 seconds'`).
fn modifier(d: Duration) -> String {
    format!("+{:.3} seconds", d.as_secs_f64())
}

/// Now plus the date modifier in parameter `param` (`?2`), as SQL.
fn now_plus(param: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', {param})")
}

impl Leases {
    /// Joins the daemons sharing the state at `state` (a store opened it already), as
    /// `host:pid`. `ttl`: how long a lease outlives its last renewal.
    pub fn join(state: &Path, ttl: Duration) -> Result<Leases> {
        let conn = crate::connect(state)?;
        let host = crate::lock::host_name();
        let daemon = format!("{host}:{}", std::process::id());
        Ok(Leases {
            conn,
            path: state.to_owned(),
            daemon,
            host,
            ttl,
            held: BTreeMap::new(),
            beats: 0,
        })
    }

    pub fn daemon(&self) -> &str {
        &self.daemon
    }

    /// How often to beat: five times per lease time, so a lease survives a few lost beats.
    pub fn interval(&self) -> Duration {
        self.ttl / 5
    }

    /// The lease of `env`, if this daemon holds it.
    pub fn hold(&self, env: &str) -> Option<Arc<LeaseHold>> {
        self.held.get(env).cloned()
    }

    /// One heartbeat: reports this daemon alive, renews its leases, gives up those beyond its
    /// share of `envs` (not those in `busy`, until they finish), and takes free or expired ones
    /// up to its share. The first beat only reports, so daemons that start together count each
    /// other before they take anything.
    pub fn beat(&mut self, envs: &BTreeSet<String>, busy: &BTreeSet<String>) -> Result<Beat> {
        let started = Instant::now();
        let e = |source| state_error(&self.path, source);
        let ttl = modifier(self.ttl);
        let mut beat = Beat::default();
        self.conn
            .execute(
                &format!(
                    "INSERT INTO daemon (id, host, pid, started_at, seen_at)
                     VALUES (?1, ?2, ?3, {NOW}, {NOW})
                     ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at"
                ),
                params![self.daemon, self.host, std::process::id()],
            )
            .map_err(e)?;
        beat.live = self
            .conn
            .query_row(
                "SELECT COUNT(*) FROM daemon
                 WHERE seen_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)",
                params![format!("-{:.3} seconds", self.ttl.as_secs_f64())],
                |r| r.get::<_, i64>(0),
            )
            .map_err(e)? as usize;
        // Daemons gone for a day are forgotten: a restart is a new daemon, and the table must
        // not grow with restarts.
        if self.beats.is_multiple_of(100) {
            self.conn
                .execute(
                    "DELETE FROM daemon
                     WHERE seen_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 day')",
                    params![],
                )
                .map_err(e)?;
        }
        // Renew all of ours at once (a lease given up names no daemon); what is no longer ours
        // was taken over.
        self.conn
            .execute(
                &format!(
                    "UPDATE env_lease SET expires_at = {} WHERE daemon = ?1",
                    now_plus("?2")
                ),
                params![self.daemon, ttl],
            )
            .map_err(e)?;
        let ours: BTreeMap<String, i64> = self
            .conn
            .prepare_cached("SELECT env, generation FROM env_lease WHERE daemon = ?1")
            .and_then(|mut s| {
                s.query_map([&self.daemon], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<DbResult<_>>()
            })
            .map_err(e)?;
        // Valid by our clock from before the renewal, less a margin for clocks that drift.
        let until = started + self.ttl.mul_f64(0.8);
        let mut lost = Vec::new();
        for (env, hold) in &self.held {
            if ours.get(env) == Some(&hold.fence.generation) {
                hold.renewed(until);
            } else {
                lost.push(env.clone());
            }
        }
        self.beats += 1;
        let share = if beat.live == 0 || envs.is_empty() {
            0
        } else {
            envs.len().div_ceil(beat.live)
        };
        // Give up what is gone from the repository, and what is beyond our share.
        let mut keep = 0;
        for (env, hold) in &self.held {
            if lost.contains(env) {
                continue;
            }
            let wanted = envs.contains(env) && keep < share;
            if wanted || busy.contains(env) {
                keep += 1;
                continue;
            }
            self.conn
                .execute(
                    "UPDATE env_lease SET expires_at = '1970-01-01T00:00:00.000Z', daemon = ''
                     WHERE env = ?1 AND daemon = ?2 AND generation = ?3",
                    params![env, self.daemon, hold.fence.generation],
                )
                .map_err(e)?;
            lost.push(env.clone());
        }
        for env in &lost {
            if let Some(hold) = self.held.remove(env) {
                hold.lose();
            }
        }
        beat.lost = lost;
        if self.beats < 2 {
            return Ok(beat);
        }
        // Take free or expired leases up to our share, each daemon preferring different ones
        // (rendezvous hashing), so that they seldom contend for the same row.
        let mut free: Vec<&String> = envs
            .iter()
            .filter(|e| !self.held.contains_key(*e))
            .collect();
        free.sort_by_key(|env| preference(env, &self.daemon));
        for env in free {
            if self.held.len() >= share {
                break;
            }
            let taken: Option<i64> = self
                .conn
                .prepare_cached(&format!(
                    "INSERT INTO env_lease (env, daemon, generation, acquired_at, expires_at)
                     VALUES (?1, ?2, 1, {NOW}, {plus})
                     ON CONFLICT (env) DO UPDATE SET daemon = excluded.daemon,
                         generation = env_lease.generation + 1,
                         acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
                     WHERE env_lease.expires_at < {NOW}
                     RETURNING generation",
                    plus = now_plus("?3"),
                ))
                .and_then(|mut s| s.query_row(params![env, self.daemon, ttl], |r| r.get(0)))
                .optional()
                .map_err(e)?;
            if let Some(generation) = taken {
                let hold = Arc::new(LeaseHold {
                    fence: Fence {
                        env: env.clone(),
                        daemon: self.daemon.clone(),
                        generation,
                    },
                    valid_until: Mutex::new(until),
                    lost: AtomicBool::new(false),
                });
                self.held.insert(env.clone(), hold.clone());
                beat.gained.push(hold);
            }
        }
        Ok(beat)
    }

    /// Gives every lease up (a daemon stopping cleanly): the others take them at their next
    /// beat instead of after the lease time.
    pub fn release_all(&mut self) {
        for (env, hold) in std::mem::take(&mut self.held) {
            hold.lose();
            let _ = self.conn.execute(
                "UPDATE env_lease SET expires_at = '1970-01-01T00:00:00.000Z', daemon = ''
                 WHERE env = ?1 AND daemon = ?2 AND generation = ?3",
                params![env, self.daemon, hold.fence.generation],
            );
        }
        let _ = self.conn.execute(
            "UPDATE daemon SET seen_at = '1970-01-01T00:00:00.000Z' WHERE id = ?1",
            [&self.daemon],
        );
    }
}

/// How much `daemon` prefers `env`: lower first.
fn preference(env: &str, daemon: &str) -> [u8; 8] {
    let digest = Sha256::new()
        .chain_update(env.as_bytes())
        .chain_update([0])
        .chain_update(daemon.as_bytes())
        .finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&digest[..8]);
    out
}

/// A row of `env_lease`, for `gitplane status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub env: String,
    pub daemon: String,
    pub generation: i64,
    pub expires_at: String,
    /// Whether it has not expired.
    pub current: bool,
}

impl crate::Store {
    /// Every environment's lease, by environment.
    pub fn leases(&self) -> Result<Vec<LeaseRecord>> {
        self.query(
            &format!(
                "SELECT env, daemon, generation, expires_at, expires_at > {NOW}
                 FROM env_lease ORDER BY env"
            ),
            params![],
            |r| {
                Ok(LeaseRecord {
                    env: r.get(0)?,
                    daemon: r.get(1)?,
                    generation: r.get(2)?,
                    expires_at: r.get(3)?,
                    current: r.get(4)?,
                })
            },
        )
    }

    /// Makes every write of this store check `fences` (and refuse once one moved on).
    pub fn set_fences(&mut self, fences: Vec<Fence>) {
        self.fences = fences;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    fn envs(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// `beats` heartbeats of each daemon in turn.
    fn beat_all(daemons: &mut [Leases], all: &BTreeSet<String>, beats: usize) {
        for _ in 0..beats {
            for d in daemons.iter_mut() {
                d.beat(all, &BTreeSet::new()).unwrap();
            }
        }
    }

    /// Daemons of one process differ by their id only: give each its own.
    fn daemon(state: &Path, n: usize, ttl: Duration) -> Leases {
        let mut l = Leases::join(state, ttl).unwrap();
        l.daemon = format!("{}#{n}", l.daemon);
        l
    }

    #[test]
    fn daemons_share_the_environments_and_a_stopped_one_hands_them_over() {
        crate::tests::each_backend(|store| {
            let state = store.path().to_owned();
            let all = envs(&["a", "b", "c", "d", "e", "f"]);
            let ttl = Duration::from_secs(30);
            let mut daemons: Vec<Leases> = (0..3).map(|n| daemon(&state, n, ttl)).collect();
            beat_all(&mut daemons, &all, 3);
            for d in &daemons {
                assert_eq!(d.held.len(), 2, "{} holds {:?}", d.daemon, d.held.keys());
            }
            let leases = store.leases().unwrap();
            assert_eq!(leases.len(), 6);
            assert!(leases.iter().all(|l| l.current && l.generation == 1));
            // One stops: the other two take its two at once, with the next generation.
            let mut gone = daemons.remove(0);
            let given_up: Vec<String> = gone.held.keys().cloned().collect();
            gone.release_all();
            beat_all(&mut daemons, &all, 2);
            for d in &daemons {
                assert_eq!(d.held.len(), 3, "{} holds {:?}", d.daemon, d.held.keys());
            }
            for env in &given_up {
                let l = store
                    .leases()
                    .unwrap()
                    .into_iter()
                    .find(|l| &l.env == env)
                    .unwrap();
                assert_eq!(l.generation, 2, "{env}");
            }
        });
    }

    const LEASE_TTL: Duration = Duration::from_secs(30);

    /// A first daemon holds `dev`, and `store` writes under its lease: the daemon and its hold.
    fn writing_under_a_lease(store: &mut Store) -> (Leases, Arc<LeaseHold>) {
        let mut first = daemon(store.path(), 1, LEASE_TTL);
        beat_all(std::slice::from_mut(&mut first), &envs(&["dev"]), 2);
        let hold = first.hold("dev").expect("the only daemon holds dev");
        assert!(hold.holds());
        store.set_fences(vec![hold.fence().clone()]);
        (first, hold)
    }

    /// The first daemon froze: its lease of `dev` ran out, and a second daemon took it.
    fn taken_over(store: &Store) -> Leases {
        store
            .conn
            .execute(
                "UPDATE env_lease SET expires_at = '2000-01-01T00:00:00.000Z'",
                params![],
            )
            .unwrap();
        let mut second = daemon(store.path(), 2, LEASE_TTL);
        beat_all(std::slice::from_mut(&mut second), &envs(&["dev"]), 2);
        second
    }

    #[test]
    fn a_write_under_a_lease_that_moved_on_is_refused_and_changes_nothing() {
        crate::tests::each_backend(|mut store| {
            let all = envs(&["dev"]);
            let (mut first, hold) = writing_under_a_lease(&mut store);
            let d = store.begin_deployment("dev", "c1").unwrap();
            let second = taken_over(&store);
            assert_eq!(second.hold("dev").unwrap().fence().generation, 2);
            let before = store.deployments(None).unwrap();
            let e = store
                .finish_deployment(
                    d,
                    crate::DeploymentStatus::Succeeded,
                    &Default::default(),
                    None,
                )
                .unwrap_err()
                .to_string();
            assert!(e.contains("lease of environment dev moved on"), "{e}");
            assert!(store.begin_deployment("dev", "c2").is_err());
            // A batch of the journal (on PostgreSQL its rows go a statement per table) is
            // refused whole, before anything is gathered.
            let e = store.batch().err().expect("a fenced batch").to_string();
            assert!(e.contains("lease of environment dev moved on"), "{e}");
            let operations: i64 = store
                .conn
                .query_row("SELECT COUNT(*) FROM operation", params![], |r| r.get(0))
                .unwrap();
            assert_eq!(operations, 0);
            assert_eq!(store.deployments(None).unwrap(), before);
            // The old holder learns it at its next beat, and its hold says so.
            let beat = first.beat(&all, &BTreeSet::new()).unwrap();
            assert_eq!(beat.lost, ["dev"]);
            assert!(!hold.holds());
            // The new holder writes.
            store.set_fences(vec![second.hold("dev").unwrap().fence().clone()]);
            store.begin_deployment("dev", "c2").unwrap();
        });
    }

    /// One put of `guresid`, started and ended, for the journal's writer.
    fn one_put(deployment: i64, guresid: &str) -> crate::OwnedBatch {
        crate::OwnedBatch {
            deployment,
            env: "dev".into(),
            starts: vec![crate::StartRow {
                guresid: guresid.into(),
                app: Some("shop".into()),
                res_type: "postgres".into(),
                class: "default".into(),
                res_id: format!("{guresid}.db"),
                action: "create",
                reason: "new".into(),
            }],
            puts: vec![crate::EndedPut {
                attempts: 1,
                record: Box::new(crate::tests::record(guresid)),
                outputs_changed: Some(true),
                new: true,
                manifests: None,
                sealed: None,
            }],
            bindings: Vec::new(),
            spent: Box::new(()),
        }
    }

    #[test]
    fn the_journals_writer_writes_under_its_stores_lease_and_is_refused_once_it_moved_on() {
        crate::tests::each_backend(|mut store| {
            let _first = writing_under_a_lease(&mut store);
            let d = store.begin_deployment("dev", "c1").unwrap();
            let mut writer = crate::JournalWriter::start(&store).unwrap();
            writer.send(one_put(d, "g1")).unwrap();
            writer.drain().expect("written while the lease holds");
            let _second = taken_over(&store);
            writer.send(one_put(d, "g2")).unwrap();
            let e = writer.drain().expect_err("a fenced batch").to_string();
            assert!(e.contains("lease of environment dev moved on"), "{e}");
            let written: Vec<String> = store
                .conn
                .prepare_cached("SELECT guresid FROM operation ORDER BY id")
                .unwrap()
                .query_map(params![], |r| r.get(0))
                .unwrap()
                .collect::<crate::db::DbResult<Vec<String>>>()
                .unwrap();
            assert_eq!(written, ["g1"]);
        });
    }

    #[test]
    fn a_lease_not_renewed_in_time_no_longer_holds_by_its_holders_clock() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.db");
        drop(Store::open(&state).unwrap());
        let mut leases = daemon(&state, 1, Duration::from_millis(600));
        beat_all(std::slice::from_mut(&mut leases), &envs(&["dev"]), 2);
        let hold = leases.hold("dev").unwrap();
        assert!(hold.holds());
        // Not a wait for an event: the lease's time runs out with no renewal.
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            !hold.holds(),
            "a frozen holder must stop before the database says so"
        );
    }
}
