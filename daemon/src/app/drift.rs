//! One drift run of one environment at a commit: a correcting run reapplies it through
//! [`deploy_env`], a detect-only run reads and records what differs (`gitplane drift`, the
//! daemon's drift schedule).

use gitplane_state::Store;

use super::{AppError, Engine, EnvOutcome, Observer, deploy_env};
use crate::deploy::Target;
use crate::drift::{DetectOptions, DetectReport};
use crate::model::DriftMode;
use crate::reconcile::ApplyOptions;

/// How a drift run ended, for the caller to report.
#[derive(Debug)]
pub enum DriftOutcome {
    /// The environment corrects drift: the commit was reapplied, every resource's driver
    /// called; `corrected` resources came back with outputs other than those recorded.
    Corrected {
        outcome: EnvOutcome,
        corrected: usize,
    },
    /// Detect-only: what differs is recorded, nothing was changed.
    Detected(DetectReport),
}

/// Runs a drift run of `target`'s environment at `commit` (its last good one), as the
/// environment's `drift:` says, or detect-only with `detect_only`. `halt`'s stop flag and lease
/// halt either kind of run; `observer` hears a correcting one.
///
/// The caller holds the environment's apply lock and reports the outcome: nothing here prints.
pub fn drift_env(
    store: &mut Store,
    engine: &Engine<'_>,
    target: &Target,
    commit: &str,
    detect_only: bool,
    halt: &DetectOptions,
    observer: &mut dyn Observer,
) -> Result<DriftOutcome, AppError> {
    if drift_mode(target, detect_only) == DriftMode::Correct {
        let options = ApplyOptions {
            drift: true,
            stop: halt.stop.clone(),
            lease: halt.lease.clone(),
            lock: halt.lock.clone(),
            ..ApplyOptions::default()
        };
        let outcome = deploy_env(store, engine, target, commit, &options, observer)?;
        let corrected = match &outcome {
            EnvOutcome::Ran { report, .. } => store.outputs_changed(report.deployment)?.len(),
            EnvOutcome::Pinned { .. } => 0,
        };
        return Ok(DriftOutcome::Corrected { outcome, corrected });
    }
    let report = engine.runtime.block_on(crate::drift::detect(
        store,
        engine.drivers,
        engine.settings,
        target,
        commit,
        halt,
    ))?;
    Ok(DriftOutcome::Detected(report))
}

/// How a drift run of `target` goes: as its environment's `drift:` says, or detect-only.
pub fn drift_mode(target: &Target, detect_only: bool) -> DriftMode {
    if detect_only {
        DriftMode::Detect
    } else {
        target.graph.drift
    }
}
