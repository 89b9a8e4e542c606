//! What the daemon tells the world about its deployments, from one place: the metrics, the
//! status page's live updates and the notifications all hear the same events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::NotifyConfig;
use crate::metrics::Metrics;
use crate::notifications::Notifier;

pub use crate::notifications::DeploymentEvent;

/// The daemon's listeners for its own events.
pub struct Events {
    pub metrics: Arc<Metrics>,
    /// Bumped whenever state changes in a way the status page shows.
    changes: watch::Sender<u64>,
    /// Replaced when SIGHUP reloads the host config.
    notifier: RwLock<Option<Notifier>>,
    /// The deployments running now, by environment: how far each has got.
    progress: Mutex<BTreeMap<String, Progress>>,
}

/// How far a running deployment has got, as the daemon hears it: state records the operations
/// that started, not how many the plan holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Resources the plan may change.
    pub total: usize,
    /// Those done with (succeeded, unchanged, failed or skipped).
    pub done: usize,
    /// The labels of those whose driver call is under way.
    pub in_flight: BTreeSet<String>,
}

impl Events {
    pub fn new(targets: &[NotifyConfig]) -> Events {
        Events {
            metrics: Arc::new(Metrics::new()),
            changes: watch::channel(0).0,
            notifier: RwLock::new(Notifier::start(targets)),
            progress: Mutex::new(BTreeMap::new()),
        }
    }

    /// A deployment of `env` made its plan: `total` resources may change.
    pub fn planned(&self, env: &str, total: usize) {
        self.with_progress(|p| {
            p.insert(
                env.to_owned(),
                Progress {
                    total,
                    ..Progress::default()
                },
            );
        });
    }

    /// A driver call for `label` in `env` is about to start.
    pub fn step_started(&self, env: &str, label: &str) {
        self.with_progress(|p| {
            p.entry(env.to_owned())
                .or_default()
                .in_flight
                .insert(label.to_owned());
        });
    }

    /// `label` in `env` is done with.
    pub fn step_finished(&self, env: &str, label: &str) {
        self.with_progress(|p| {
            let progress = p.entry(env.to_owned()).or_default();
            progress.in_flight.remove(label);
            progress.done += 1;
        });
    }

    /// The deployment of `env` is over, however it ended.
    pub fn run_over(&self, env: &str) {
        self.with_progress(|p| {
            p.remove(env);
        });
    }

    /// How far the deployment running in `env` has got, if one runs in this daemon.
    pub fn progress(&self, env: &str) -> Option<Progress> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(env)
            .cloned()
    }

    fn with_progress(&self, change: impl FnOnce(&mut BTreeMap<String, Progress>)) {
        change(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The host config was reloaded: notifications go to its targets from now on.
    pub fn set_targets(&self, targets: &[NotifyConfig]) {
        *self.notifier.write().unwrap_or_else(|e| e.into_inner()) = Notifier::start(targets);
    }

    /// A receiver that sees each change of state the page shows (the value only counts them).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// State changed: a deployment started, or a resource finished.
    pub fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// An environment's deployment of a commit started `since` after the commit was noticed.
    pub fn push_started(&self, since: Duration) {
        self.metrics.push_started(since);
    }

    /// A deployment ended: counted, shown, and sent to the notification targets that want it.
    pub fn finished(&self, event: DeploymentEvent) {
        self.metrics.deployment_finished(
            &event.env,
            event.kind == "drift",
            event.status,
            Duration::from_secs_f64(event.duration_seconds.max(0.0)),
        );
        self.changed();
        if let Some(n) = self
            .notifier
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            n.send(&event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NotifyEvent;
    use gitplane_state::DeploymentStatus;

    #[test]
    fn progress_counts_steps_done_and_in_flight_until_the_run_is_over() {
        let events = Events::new(&[]);
        assert_eq!(events.progress("dev"), None);
        events.planned("dev", 3);
        events.step_started("dev", "redis#cache");
        events.step_started("dev", "postgres#db");
        events.step_finished("dev", "redis#cache");
        let p = events.progress("dev").unwrap();
        assert_eq!((p.done, p.total), (1, 3));
        assert_eq!(p.in_flight.into_iter().collect::<Vec<_>>(), ["postgres#db"]);
        assert_eq!(events.progress("prod"), None, "per environment");
        events.run_over("dev");
        assert_eq!(events.progress("dev"), None);
    }

    #[test]
    fn a_drift_run_is_news_only_when_it_found_or_broke_something() {
        let mut event = DeploymentEvent::not_built(("dev", 1), "abc", None, vec!["x".into()]);
        assert_eq!(event.kinds(), [NotifyEvent::Failed]);
        event.status = DeploymentStatus::Succeeded;
        event.counts.updated = 1;
        assert_eq!(event.kinds(), [NotifyEvent::Succeeded]);
        event.kind = "drift";
        assert_eq!(event.kinds(), []);
        event.drifted = vec!["guresid".into()];
        assert_eq!(event.kinds(), [NotifyEvent::Drift]);
        event.status = DeploymentStatus::Failed;
        assert_eq!(event.kinds(), [NotifyEvent::Failed, NotifyEvent::Drift]);
        event.status = DeploymentStatus::Held;
        assert_eq!(event.kinds(), [NotifyEvent::Held, NotifyEvent::Drift]);
    }

    #[test]
    fn only_a_change_of_condition_is_news() {
        let failed = |error: &str| Some((DeploymentStatus::Failed, Some(error.to_owned())));
        let ok = Some((DeploymentStatus::Succeeded, None));
        let mut event = DeploymentEvent::not_built(("dev", 2), "abc", None, vec!["x".into()]);
        // A failure: news the first time, not again with the same error, news with another.
        for (previous, kinds) in [
            (None, vec![NotifyEvent::Failed]),
            (ok.clone(), vec![NotifyEvent::Failed]),
            (failed("x"), vec![]),
            (failed("y"), vec![NotifyEvent::Failed]),
        ] {
            event.previous = previous.clone();
            assert_eq!(event.kinds(), kinds, "after {previous:?}");
        }
        // A success: news when it changed something, or ends a failure.
        event.status = DeploymentStatus::Succeeded;
        event.failures.clear();
        for (previous, updated, kinds) in [
            (None, 0, vec![]),
            (ok.clone(), 0, vec![]),
            (ok.clone(), 1, vec![NotifyEvent::Succeeded]),
            (failed("x"), 0, vec![NotifyEvent::Recovered]),
            (failed("x"), 1, vec![NotifyEvent::Recovered]),
        ] {
            event.previous = previous.clone();
            event.counts.updated = updated;
            assert_eq!(
                event.kinds(),
                kinds,
                "after {previous:?}, {updated} updated"
            );
        }
        // Held waits for someone, whatever came before.
        event.status = DeploymentStatus::Held;
        event.previous = ok;
        assert_eq!(event.kinds(), [NotifyEvent::Held]);
    }
}
