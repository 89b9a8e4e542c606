//! Spreads the environments over the daemons that share a PostgreSQL state: a thread keeps
//! this daemon's leases (renews, balances, takes over) and tells the main loop which
//! environments it gained and lost.
//!
//! With a SQLite state there is one daemon and no leases: every environment is this daemon's.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gitplane_state::{LeaseHold, Leases, StateError};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// A change of the environments this daemon holds.
#[derive(Debug)]
pub enum LeaseEvent {
    Gained(String),
    Lost(String),
    /// The database answers again after failing: look at the repository now rather than at
    /// the next poll (a commit noticed meanwhile could not be read).
    Recovered,
}

/// What the lease thread and the rest of the daemon share.
#[derive(Default)]
pub struct Shard {
    /// Every environment of the newest commit: what the daemons share out.
    envs: Mutex<BTreeSet<String>>,
    /// The preview environments (one per matching branch): shared out too.
    previews: Mutex<BTreeSet<String>>,
    /// Environments in the middle of a reconcile: kept even beyond this daemon's share, until
    /// the reconcile ends.
    busy: Mutex<BTreeSet<String>>,
    holds: Mutex<HashMap<String, Arc<LeaseHold>>>,
}

impl Shard {
    pub fn set_envs(&self, envs: impl IntoIterator<Item = String>) {
        *self.envs.lock().unwrap_or_else(|e| e.into_inner()) = envs.into_iter().collect();
    }

    pub fn set_previews(&self, envs: impl IntoIterator<Item = String>) {
        *self.previews.lock().unwrap_or_else(|e| e.into_inner()) = envs.into_iter().collect();
    }

    /// Every environment the daemons share out: the newest commit's and the previews.
    fn all_envs(&self) -> BTreeSet<String> {
        let mut envs = self.envs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        envs.extend(
            self.previews
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
        envs
    }

    /// The lease of `env`, if this daemon holds it now.
    pub fn hold(&self, env: &str) -> Option<Arc<LeaseHold>> {
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(env)
            .filter(|h| h.holds())
            .cloned()
    }

    /// The environments this daemon holds.
    pub fn held(&self) -> BTreeSet<String> {
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Marks `env` busy until the guard drops.
    pub fn busy(self: &Arc<Self>, env: &str) -> BusyGuard {
        self.busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(env.to_owned());
        BusyGuard {
            shard: self.clone(),
            env: env.to_owned(),
        }
    }
}

pub struct BusyGuard {
    shard: Arc<Shard>,
    env: String,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.shard
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.env);
    }
}

/// The lease thread, started.
pub struct Keeper {
    pub shard: Arc<Shard>,
    /// Leases gained and lost.
    pub events: mpsc::UnboundedReceiver<LeaseEvent>,
    /// Ends after `stop` is set, once it gave the leases up.
    pub thread: JoinHandle<()>,
}

/// Joins the daemons of the state at `state` and starts the thread that keeps this one's
/// leases, beating every fifth of `ttl` until `stop` is set; then it gives its leases up.
pub fn start(state: &Path, ttl: Duration, stop: Arc<AtomicBool>) -> Result<Keeper, StateError> {
    let leases = Leases::join(state, ttl)?;
    let shard = Arc::new(Shard::default());
    let (tx, rx) = mpsc::unbounded_channel();
    let kept = shard.clone();
    let thread = std::thread::Builder::new()
        .name("leases".into())
        .spawn(move || keep(leases, &kept, &tx, &stop))
        .map_err(|source| StateError::Create {
            path: state.to_owned(),
            source,
        })?;
    Ok(Keeper {
        shard,
        events: rx,
        thread,
    })
}

fn keep(
    mut leases: Leases,
    shard: &Shard,
    events: &mpsc::UnboundedSender<LeaseEvent>,
    stop: &AtomicBool,
) {
    let interval = leases.interval();
    info!(
        daemon = leases.daemon(),
        "sharing the state's environments with other daemons"
    );
    let mut failing = false;
    while !stop.load(Ordering::SeqCst) {
        let envs = shard.all_envs();
        let busy = shard.busy.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match leases.beat(&envs, &busy) {
            Ok(beat) => {
                if failing {
                    info!("the state's database answers again: leases renewed");
                    failing = false;
                    let _ = events.send(LeaseEvent::Recovered);
                }
                let mut holds = shard.holds.lock().unwrap_or_else(|e| e.into_inner());
                for env in beat.lost {
                    holds.remove(&env);
                    warn!(
                        env,
                        "lease lost: another daemon reconciles this environment now"
                    );
                    let _ = events.send(LeaseEvent::Lost(env));
                }
                for hold in beat.gained {
                    let fence = hold.fence();
                    info!(
                        env = fence.env,
                        generation = fence.generation,
                        daemons = beat.live,
                        "lease taken"
                    );
                    holds.insert(fence.env.clone(), hold.clone());
                    let _ = events.send(LeaseEvent::Gained(fence.env.clone()));
                }
            }
            Err(e) => {
                // The leases lapse by themselves if this goes on: their holds say so to the
                // workers, and other daemons take them over.
                if !failing {
                    warn!(error = %e, "cannot renew the leases; retrying");
                    failing = true;
                }
            }
        }
        sleep_unless_stopped(interval, stop);
    }
    leases.release_all();
}

fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) {
    let step = Duration::from_millis(100);
    let mut slept = Duration::ZERO;
    while slept < total && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(step);
        slept += step;
    }
}
