//! What the daemon tells the world about its deployments, from one place: the metrics, the
//! status page's live updates and the notifications all hear the same events.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use gitplane_state::{Counts, DeploymentStatus};
use tokio::sync::watch;

use crate::config::{NotifyConfig, NotifyEvent};
use crate::notifications::Notifier;
use crate::repo::CommitInfo;
use crate::serve::metrics::Metrics;

/// A deployment that ended: succeeded, failed (a driver failed, or the commit did not build),
/// or held by the deletion guard.
#[derive(Debug, Clone)]
pub struct DeploymentEvent {
    pub env: String,
    /// The deployment's id in state (`gitplane history`).
    pub deployment: i64,
    /// `commit` or `drift` (a scheduled re-apply of the last good commit).
    pub kind: &'static str,
    pub commit: Option<String>,
    /// Who made the commit and its message's first line, when the repository has it.
    pub commit_info: Option<CommitInfo>,
    pub status: DeploymentStatus,
    pub counts: Counts,
    pub duration_seconds: f64,
    /// `resource: error` for each failed resource, or why the commit did not build, or for a
    /// held deployment what it would delete. Drivers' messages, secrets already scrubbed.
    pub failures: Vec<String>,
    /// For a drift run: the resources whose outputs had changed outside gitplane.
    pub drifted: Vec<String>,
}

impl DeploymentEvent {
    /// A commit that did not load or build, recorded as a failed deployment of `env` that
    /// called no driver.
    pub fn not_built(
        (env, deployment): (&str, i64),
        commit: &str,
        commit_info: Option<CommitInfo>,
        errors: Vec<String>,
    ) -> DeploymentEvent {
        DeploymentEvent {
            env: env.to_owned(),
            deployment,
            kind: "commit",
            commit: Some(commit.to_owned()),
            commit_info,
            status: DeploymentStatus::Failed,
            counts: Counts::default(),
            duration_seconds: 0.0,
            failures: errors,
            drifted: Vec::new(),
        }
    }

    /// Which notifications it is: one for its status, and `drift` when a drift run found some.
    /// A drift run that succeeded is not announced as a deployment: it runs every few minutes,
    /// and only what it found is news.
    pub fn kinds(&self) -> Vec<NotifyEvent> {
        let mut kinds = Vec::new();
        match self.status {
            DeploymentStatus::Succeeded if self.kind == "drift" => {}
            DeploymentStatus::Succeeded => kinds.push(NotifyEvent::Succeeded),
            DeploymentStatus::Failed => kinds.push(NotifyEvent::Failed),
            DeploymentStatus::Held => kinds.push(NotifyEvent::Held),
            DeploymentStatus::Running | DeploymentStatus::Superseded => {}
        }
        if !self.drifted.is_empty() {
            kinds.push(NotifyEvent::Drift);
        }
        kinds
    }
}

/// The daemon's listeners for its own events.
pub struct Events {
    pub metrics: Arc<Metrics>,
    /// Bumped whenever state changes in a way the status page shows.
    changes: watch::Sender<u64>,
    /// Replaced when SIGHUP reloads the host config.
    notifier: RwLock<Option<Notifier>>,
}

impl Events {
    pub fn new(targets: &[NotifyConfig]) -> Events {
        Events {
            metrics: Arc::new(Metrics::new()),
            changes: watch::channel(0).0,
            notifier: RwLock::new(Notifier::start(targets)),
        }
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

    #[test]
    fn a_drift_run_is_news_only_when_it_found_or_broke_something() {
        let mut event = DeploymentEvent::not_built(("dev", 1), "abc", None, vec!["x".into()]);
        assert_eq!(event.kinds(), [NotifyEvent::Failed]);
        event.status = DeploymentStatus::Succeeded;
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
}
