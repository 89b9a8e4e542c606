//! Apply one environment: the pin check, the reconcile, and the pruning after it, one way for
//! every caller (`apply`, `approve`, `resolve`, `rollback`, `unpin`, a correcting drift run, the
//! daemon's workers).

use gitplane_state::{EnvPin, Retention, StateError, Store};

use super::{AppError, RECLAIM_PAGES};
use crate::deploy::{self, Target};
use crate::drivers::Registry;
use crate::reconcile::{self, ApplyOptions, ApplyReport, Event, Settings};

/// What applying takes from the host config in force, and the runtime driver calls run on.
pub struct Engine<'a> {
    pub drivers: &'a Registry,
    pub settings: &'a Settings,
    /// `history.keep`: what pruning after the deployment keeps; `None` keeps everything.
    pub history: Option<Retention>,
    /// The runtime the reconcile's tasks run on. [`deploy_env`] blocks on it, so it is called
    /// from a thread that may block (the CLI's, a blocking task's, or within `block_in_place`).
    pub runtime: &'a tokio::runtime::Handle,
}

/// What a caller hears of an apply as it runs. A closure taking the reconcile's events is one
/// that does not care when the reconcile starts.
pub trait Observer: Send {
    /// The pin check passed: the reconcile starts now.
    fn starting(&mut self) {}
    /// A step of the reconcile.
    fn event(&mut self, event: &Event<'_>);
}

impl<F: FnMut(&Event<'_>) + Send> Observer for F {
    fn event(&mut self, event: &Event<'_>) {
        self(event)
    }
}

/// How applying one environment ended, for the caller to report.
#[derive(Debug)]
pub enum EnvOutcome {
    /// A rollback's pin holds the environment at another commit: `commit` was planned (the
    /// plan's summary), not applied, and nothing was recorded.
    Pinned { pin: EnvPin, plan: String },
    /// The deployment ran, or was held by the deletion guard: its report, and whether pruning
    /// the history after it failed (the deployment is recorded either way).
    Ran {
        report: ApplyReport,
        prune_error: Option<StateError>,
    },
}

/// Applies `commit` to `target`'s environment: unless `options` is a drift run or removes the
/// environment, a pin on another commit stops it before any driver call; else it reconciles
/// (calling the drivers on `engine.runtime`, telling `observer` when it starts and each step),
/// then prunes the history `engine.history` no longer keeps. A reconcile cut short by a state
/// error is that error, and nothing is pruned.
///
/// The caller holds the environment's apply lock (`ApplyLock::acquire`, or
/// `ApplyLock::acquire_leased` under a lease) and reports the outcome: nothing here prints or
/// logs.
pub fn deploy_env(
    store: &mut Store,
    engine: &Engine<'_>,
    target: &Target,
    commit: &str,
    options: &ApplyOptions,
    observer: &mut dyn Observer,
) -> Result<EnvOutcome, AppError> {
    // A pinned environment takes only its pin's commit (a drift run re-applies that one).
    if !options.drift
        && !options.removing_env
        && let Some((pin, plan)) = deploy::held_by_pin(store, target, commit)?
    {
        return Ok(EnvOutcome::Pinned { pin, plan });
    }
    observer.starting();
    let report = engine.runtime.block_on(reconcile::apply(
        store,
        engine.drivers,
        engine.settings,
        target,
        commit,
        options,
        &mut |event: &Event<'_>| observer.event(event),
    ))?;
    // History the host config no longer keeps goes after each deployment, so a state only the
    // CLI writes stays bounded too; a little space goes back each time.
    let prune_error = match engine.history {
        Some(keep) => store
            .prune(keep)
            .and_then(|_| store.reclaim(RECLAIM_PAGES))
            .err(),
        None => None,
    };
    Ok(EnvOutcome::Ran {
        report,
        prune_error,
    })
}
