//! `notify:`: POSTs deployment events to the host config's targets, with retries, off the
//! reconcile path.

use crate::config::NotifyConfig;
use crate::events::DeploymentEvent;

/// Sends events to the notification targets from a task of its own.
pub struct Notifier {
    targets: Vec<NotifyConfig>,
}

impl Notifier {
    /// `None` when there is no target.
    pub fn start(targets: &[NotifyConfig]) -> Option<Notifier> {
        (!targets.is_empty()).then(|| Notifier {
            targets: targets.to_vec(),
        })
    }

    /// Queues `event` for the targets that want it; never waits.
    pub fn send(&self, event: &DeploymentEvent) {
        let _ = (&self.targets, event);
    }
}
