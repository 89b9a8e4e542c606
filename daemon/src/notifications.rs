//! `notify:`: POSTs deployment events to the host config's targets, with retries, off the
//! reconcile path.
//!
//! Each target has a bounded queue and a thread of its own, so a slow or broken target holds up
//! neither the deployments nor the other targets. [`Notifier::send`] builds the bodies (bounded
//! in size) and queues them; it never waits on the network. A full queue drops its oldest
//! notification. When the daemon exits, whatever is still queued is dropped; when SIGHUP replaces
//! the notifier, the old targets' threads deliver what they had queued and end.
//!
//! A target's URL may itself be a secret (Slack's incoming webhooks), so no log line and no
//! error names it: logs say `notify[0]`, the event and the status or the kind of error.

use std::collections::{BTreeSet, VecDeque};
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use gitplane_state::{Counts, DeploymentStatus};
use serde_json::{Value, json};
use tracing::{debug, error, info, warn};

use crate::repo::CommitInfo;
use ureq::Agent;

use crate::config::{NotifyConfig, NotifyEvent, NotifyFormat, NotifyUrl};

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
    /// The environment's condition before: the status of its previous deployment of a commit
    /// that finished applying, with that deployment's error; `None` before any. It decides
    /// which deployments are news ([`DeploymentEvent::kinds`]).
    pub previous: Option<(DeploymentStatus, Option<String>)>,
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
            previous: None,
        }
    }

    /// Which notifications it is: one per change of the environment's condition, and `drift`
    /// when a drift run found some.
    ///
    /// - a success after a failure is `recovered`, whatever it changed;
    /// - a success that created, updated and deleted nothing (a restart, a reload, a commit
    ///   that touched nothing here) is not news; one that changed something is `succeeded`;
    /// - a failure after a failure with the same error (a retry, the next commit failing the
    ///   same way) is not news; a first failure, or one with a different error, is `failed`;
    /// - a held deployment is always `held`: it waits for someone.
    ///
    /// A drift run is not a deployment of a commit: it never counts as a commit's condition
    /// before. Its own condition before is the drift run before it: one that succeeded is not
    /// announced (it runs every few minutes, and only what it found is news) unless the one
    /// before failed (`recovered`); one that failed is, unless the one before failed the same
    /// way.
    pub fn kinds(&self) -> Vec<NotifyEvent> {
        let mut kinds = Vec::new();
        let previous_failure = match &self.previous {
            Some((DeploymentStatus::Failed, error)) => Some(error.as_deref().unwrap_or_default()),
            _ => None,
        };
        let c = &self.counts;
        let changed = c.created + c.updated + c.deleted > 0;
        match self.status {
            DeploymentStatus::Succeeded if previous_failure.is_some() => {
                kinds.push(NotifyEvent::Recovered)
            }
            DeploymentStatus::Succeeded if self.kind == "drift" => {}
            DeploymentStatus::Succeeded if changed => kinds.push(NotifyEvent::Succeeded),
            DeploymentStatus::Succeeded => {}
            DeploymentStatus::Failed
                if previous_failure == Some(self.failures.join("\n").as_str()) => {}
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

/// Notifications a target may have waiting; more drop the oldest.
pub const MAX_QUEUED: usize = 1_000;
/// The bytes of bodies a target may have waiting, likewise: bodies are bounded, but a thousand
/// of the largest would still be a lot of memory for a target that is down.
const MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Failures (and drifted resources) a JSON body lists; the rest are counted in a last entry.
const MAX_LISTED: usize = 20;
/// Characters of one failure message, author or commit message in a body.
const MAX_ENTRY_CHARS: usize = 1_000;
/// Failures a Slack message shows.
const SLACK_FAILURES: usize = 3;
/// Characters of one failure in a Slack message.
const SLACK_FAILURE_CHARS: usize = 300;
/// Characters of a whole Slack message; Slack folds long messages away anyway.
const SLACK_MAX_CHARS: usize = 3_000;
/// The wait before the second attempt; each later wait doubles, up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// For tests only: the base wait between attempts in milliseconds, instead of one second, so
/// a test of retries need not sleep for seconds. Not documented for users.
pub const BACKOFF_TEST_ENV: &str = "GITPLANE_NOTIFY_TEST_BACKOFF_MS";
/// The largest `url_file` read; a URL is far shorter.
const MAX_URL_FILE_BYTES: u64 = 8 * 1024;
const USER_AGENT: &str = concat!("gitplane/", env!("CARGO_PKG_VERSION"));

/// Sends events to the notification targets, each from a thread of its own.
pub struct Notifier {
    targets: Vec<Target>,
}

/// One target's filter and the queue its thread reads.
struct Target {
    name: String,
    format: NotifyFormat,
    events: BTreeSet<NotifyEvent>,
    queue: Arc<Queue>,
}

impl Notifier {
    /// Starts a thread per target; `None` when there is no target.
    pub fn start(targets: &[NotifyConfig]) -> Option<Notifier> {
        let base = match std::env::var(BACKOFF_TEST_ENV)
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            Some(ms) => Duration::from_millis(ms),
            None => BASE_BACKOFF,
        };
        let mut started = Vec::new();
        for config in targets {
            let queue = Arc::new(Queue::default());
            let delivery = Delivery::new(config.clone(), base);
            let thread_queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(config.name.clone())
                .spawn(move || delivery.run(&thread_queue));
            if let Err(e) = spawned {
                error!(notify = %config.name, error = %e, "cannot start the notification thread; this target gets no notifications");
                continue;
            }
            started.push(Target {
                name: config.name.clone(),
                format: config.format,
                events: config.events.clone(),
                queue,
            });
        }
        (!started.is_empty()).then_some(Notifier { targets: started })
    }

    /// Queues `event` once per kind it is ([`DeploymentEvent::kinds`]) for each target that
    /// wants that kind; never waits.
    pub fn send(&self, event: &DeploymentEvent) {
        for kind in event.kinds() {
            for target in self.targets.iter().filter(|t| t.events.contains(&kind)) {
                let body = match target.format {
                    NotifyFormat::Json => json_body(kind, event),
                    NotifyFormat::Slack => slack_body(kind, event),
                };
                let body = match serde_json::to_vec(&body) {
                    Ok(body) => body,
                    Err(e) => {
                        error!(notify = %target.name, error = %e, "cannot encode a notification");
                        continue;
                    }
                };
                target.queue.push(
                    &target.name,
                    Notification {
                        event: kind,
                        env: event.env.clone(),
                        deployment: event.deployment,
                        body,
                    },
                );
            }
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        for target in &self.targets {
            target.queue.close();
        }
    }
}

/// One POST to make: the body is built when queued, so the queue's size is bounded.
#[derive(Debug)]
struct Notification {
    event: NotifyEvent,
    /// For logs.
    env: String,
    deployment: i64,
    body: Vec<u8>,
}

/// A target's waiting notifications, shared by [`Notifier`] (which pushes) and the target's
/// thread (which pops).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    items: VecDeque<Notification>,
    /// The sum of the bodies' lengths in `items`.
    bytes: usize,
    /// The notifier was dropped: deliver what is left, then end.
    closed: bool,
    /// Notifications dropped since the queue was last empty; a warning is logged on the first.
    dropped: u64,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, name: &str, notification: Notification) {
        let mut state = self.lock();
        while state.items.len() >= MAX_QUEUED
            || state.bytes + notification.body.len() > MAX_QUEUED_BYTES
        {
            let Some(oldest) = state.items.pop_front() else {
                break;
            };
            state.bytes -= oldest.body.len();
            state.dropped += 1;
            if state.dropped == 1 {
                warn!(notify = %name, "too many notifications are waiting: the oldest are dropped until the target catches up");
            }
        }
        state.bytes += notification.body.len();
        state.items.push_back(notification);
        self.ready.notify_one();
    }

    /// The next notification; `None` once closed and empty.
    fn pop(&self, name: &str) -> Option<Notification> {
        let mut state = self.lock();
        loop {
            if let Some(n) = state.items.pop_front() {
                state.bytes -= n.body.len();
                if state.items.is_empty() && state.dropped > 0 {
                    warn!(notify = %name, dropped = state.dropped, "the notification queue caught up; some notifications were dropped");
                    state.dropped = 0;
                }
                return Some(n);
            }
            if state.closed {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// How one target's notifications are POSTed.
struct Delivery {
    config: NotifyConfig,
    agent: Agent,
    /// The wait after the first failed attempt.
    base_backoff: Duration,
}

/// What one POST came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Delivered(u16),
    /// Worth another attempt: no answer, a time-out, 408, 429 or 5xx.
    Retry(String),
    /// Another attempt would get the same answer.
    Final(String),
}

impl Delivery {
    fn new(config: NotifyConfig, base_backoff: Duration) -> Delivery {
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            // A redirect would send the body somewhere the host config does not name.
            .max_redirects(0)
            .user_agent(USER_AGENT)
            .build()
            .into();
        Delivery {
            config,
            agent,
            base_backoff,
        }
    }

    fn run(&self, queue: &Queue) {
        while let Some(n) = queue.pop(&self.config.name) {
            self.deliver(&n);
        }
    }

    /// Up to `attempts` POSTs of one notification, waiting longer after each failure.
    fn deliver(&self, n: &Notification) {
        let name = &self.config.name;
        let event = n.event.name();
        let attempts = self.config.attempts.max(1);
        for attempt in 1..=attempts {
            match self.post(&n.body) {
                Outcome::Delivered(status) => {
                    debug!(notify = %name, event, env = %n.env, deployment = n.deployment, status, attempt, "notification sent");
                    return;
                }
                Outcome::Final(why) => {
                    warn!(notify = %name, event, env = %n.env, deployment = n.deployment, attempt, "notification not sent: {why}; not retried");
                    return;
                }
                Outcome::Retry(why) if attempt == attempts => {
                    warn!(notify = %name, event, env = %n.env, deployment = n.deployment, attempts, "notification not sent: {why}; given up after {attempts} attempts");
                    return;
                }
                Outcome::Retry(why) => {
                    let wait = backoff(self.base_backoff, attempt);
                    info!(notify = %name, event, env = %n.env, deployment = n.deployment, attempt, "notification not sent: {why}; trying again in {wait:?}");
                    std::thread::sleep(wait);
                }
            }
        }
    }

    /// One POST. Reads `url_file` now, so a rotated URL needs no restart.
    fn post(&self, body: &[u8]) -> Outcome {
        let url = match &self.config.url {
            NotifyUrl::Url(url) => url.clone(),
            NotifyUrl::File(path) => match read_url_file(path) {
                Ok(url) => url,
                Err(outcome) => return outcome,
            },
        };
        let sent = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body);
        match sent {
            // The answer's body is never read: nothing in it matters, and it could be large.
            Ok(response) => status_outcome(response.status().as_u16()),
            Err(e) => transport_outcome(&e),
        }
    }
}

/// The URL in `path`, trimmed. A file that cannot be read may be in the middle of a rotation:
/// worth another attempt. Its content is never quoted.
fn read_url_file(path: &std::path::Path) -> Result<String, Outcome> {
    let mut text = String::new();
    let read = std::fs::File::open(path)
        .and_then(|f| f.take(MAX_URL_FILE_BYTES).read_to_string(&mut text));
    if let Err(e) = read {
        return Err(Outcome::Retry(format!(
            "cannot read url_file {}: {}",
            path.display(),
            e.kind()
        )));
    }
    let url = text.trim();
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url.to_owned())
    } else {
        Err(Outcome::Final(format!(
            "url_file {} does not hold a URL starting with http:// or https://",
            path.display()
        )))
    }
}

/// 2xx is delivered; 408, 429 and 5xx may pass on a later attempt; anything else (another 4xx,
/// a redirect, which is not followed) will not.
fn status_outcome(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered(status),
        408 | 429 | 500..=599 => Outcome::Retry(format!("the target answered {status}")),
        300..=399 => Outcome::Final(format!(
            "the target answered {status} (a redirect, not followed)"
        )),
        _ => Outcome::Final(format!("the target answered {status}")),
    }
}

/// No answer. Said in fixed words: some of ureq's messages quote the URL.
fn transport_outcome(error: &ureq::Error) -> Outcome {
    use ureq::Error as E;
    match error {
        E::BadUri(_) | E::Http(_) | E::RequireHttpsOnly(_) => {
            Outcome::Final("the URL is not valid".to_owned())
        }
        E::InvalidProxyUrl => Outcome::Final("the proxy URL is not valid".to_owned()),
        E::RedirectFailed | E::TooManyRedirects => {
            Outcome::Final("the target redirected (not followed)".to_owned())
        }
        E::Timeout(which) => Outcome::Retry(format!("timed out ({which})")),
        E::HostNotFound => Outcome::Retry("host not found".to_owned()),
        E::ConnectionFailed => Outcome::Retry("connection failed".to_owned()),
        E::Io(e) => Outcome::Retry(format!("connection error ({})", e.kind())),
        E::Tls(_) | E::Pem(_) | E::Rustls(_) => Outcome::Retry("TLS error".to_owned()),
        E::Protocol(_) => Outcome::Retry("the answer is not valid HTTP".to_owned()),
        _ => Outcome::Retry("request failed".to_owned()),
    }
}

/// The wait after failed attempt `attempt` (1-based): base, 2 × base, 4 × base… at most 30 s.
fn backoff(base: Duration, attempt: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

/// Something a person did with the CLI that changes what an environment runs: a rollback, an
/// approval, a pin or an unpin.
#[derive(Debug, Clone)]
pub struct CliEvent {
    /// [`NotifyEvent::Rollback`], [`NotifyEvent::Approved`], [`NotifyEvent::Pinned`] or
    /// [`NotifyEvent::Unpinned`].
    pub event: NotifyEvent,
    pub env: String,
    /// Who did it (`--by`, else the user the command ran as) and on which host.
    pub actor: String,
    pub host: String,
    /// The commit the environment is pinned at, rolled back to, or approved.
    pub commit: Option<String>,
    /// The deployment approved, or the one the command's apply recorded.
    pub deployment: Option<i64>,
    /// The reason given (`--reason`), or what the command did.
    pub reason: Option<String>,
}

/// The longest the CLI waits for its notifications, every target together: a target that is
/// down must not hold up the command.
pub const CLI_WAIT: Duration = Duration::from_secs(5);

/// Sends `event` to each of `targets` that wants it, in parallel, one `POST` each (a command
/// does not wait through retries), waiting at most [`CLI_WAIT`] in all. Returns a line for
/// each target the event did not reach, naming the target (`notify[0]`), never its URL.
pub fn notify_cli(targets: &[NotifyConfig], event: &CliEvent) -> Vec<String> {
    let wanted: Vec<&NotifyConfig> = targets
        .iter()
        .filter(|t| t.events.contains(&event.event))
        .collect();
    let deadline = std::time::Instant::now() + CLI_WAIT;
    let (done_tx, done) = std::sync::mpsc::channel::<(String, Outcome)>();
    let mut waiting = BTreeSet::new();
    let mut problems = Vec::new();
    for config in wanted {
        let body = match config.format {
            NotifyFormat::Json => cli_json_body(event),
            NotifyFormat::Slack => cli_slack_body(event),
        };
        let body = match serde_json::to_vec(&body) {
            Ok(body) => body,
            Err(e) => {
                problems.push(format!(
                    "{}: cannot encode the notification: {e}",
                    config.name
                ));
                continue;
            }
        };
        let mut config = config.clone();
        config.timeout = config.timeout.min(CLI_WAIT);
        let delivery = Delivery::new(config.clone(), BASE_BACKOFF);
        let done_tx = done_tx.clone();
        let name = config.name.clone();
        // A thread still waiting at the deadline is left behind: the command exits without it.
        let spawned = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let _ = done_tx.send((config.name.clone(), delivery.post(&body)));
            });
        match spawned {
            Ok(_) => {
                waiting.insert(name);
            }
            Err(e) => problems.push(format!("{name}: cannot start sending: {e}")),
        }
    }
    drop(done_tx);
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((name, outcome)) = done.recv_timeout(left) else {
            break;
        };
        waiting.remove(&name);
        match outcome {
            Outcome::Delivered(_) => {}
            Outcome::Retry(why) | Outcome::Final(why) => {
                problems.push(format!("{name}: {} not sent: {why}", event.event.name()))
            }
        }
    }
    for name in waiting {
        problems.push(format!(
            "{name}: {} not sent: no answer within {}s",
            event.event.name(),
            CLI_WAIT.as_secs()
        ));
    }
    problems
}

/// The JSON body of a [`CliEvent`]; docs/notifications.md describes every field.
fn cli_json_body(event: &CliEvent) -> Value {
    json!({
        "event": event.event.name(),
        "env": event.env,
        "actor": truncate(&event.actor, MAX_ENTRY_CHARS),
        "host": truncate(&event.host, MAX_ENTRY_CHARS),
        "commit": event.commit,
        "deployment": event.deployment,
        "reason": event.reason.as_deref().map(|r| truncate(r, MAX_ENTRY_CHARS)),
        "gitplane_version": env!("CARGO_PKG_VERSION"),
    })
}

/// The Slack form of a [`CliEvent`].
fn cli_slack_body(event: &CliEvent) -> Value {
    let env = escape(&event.env);
    let actor = escape(&truncate(&event.actor, 100));
    let commit = event
        .commit
        .as_deref()
        .map(|c| format!("`{}`", escape(&c.chars().take(12).collect::<String>())))
        .unwrap_or_else(|| "its commit".to_owned());
    let deployment = event
        .deployment
        .map(|d| format!("deployment {d}"))
        .unwrap_or_else(|| "a held deployment".to_owned());
    let mut text = match event.event {
        NotifyEvent::Rollback => format!(":rewind: *{env}* rolled back to {commit} by {actor}"),
        NotifyEvent::Approved => {
            format!(":heavy_check_mark: {deployment} to *{env}* approved by {actor}")
        }
        NotifyEvent::Pinned => format!(":pushpin: *{env}* pinned at {commit} by {actor}"),
        NotifyEvent::Unpinned => format!(":arrow_forward: *{env}* unpinned by {actor}"),
        other => format!("*{env}*: {} by {actor}", other.name()),
    };
    if let Some(reason) = &event.reason {
        text.push_str(&format!("\n> {}", escape(&truncate(reason, 300))));
    }
    json!({"text": truncate(&text, SLACK_MAX_CHARS)})
}

/// The body of `format: json`; docs/notifications.md describes every field.
fn json_body(kind: NotifyEvent, event: &DeploymentEvent) -> Value {
    let info = event.commit_info.as_ref();
    json!({
        "event": kind.name(),
        "env": event.env,
        "deployment": event.deployment,
        "kind": event.kind,
        "commit": event.commit,
        "author": info.map(|i| truncate(&i.author, MAX_ENTRY_CHARS)),
        "message": info.map(|i| truncate(&i.summary, MAX_ENTRY_CHARS)),
        "status": event.status.as_str(),
        "counts": {
            "created": event.counts.created,
            "updated": event.counts.updated,
            "deleted": event.counts.deleted,
            "unchanged": event.counts.unchanged,
            "failed": event.counts.failed,
        },
        "duration_seconds": (event.duration_seconds * 1000.0).round() / 1000.0,
        "failures": capped_list(&event.failures, MAX_LISTED, MAX_ENTRY_CHARS),
        "drifted": capped_list(&event.drifted, MAX_LISTED, MAX_ENTRY_CHARS),
        "gitplane_version": env!("CARGO_PKG_VERSION"),
    })
}

/// The first `max` entries, each cut to `chars`, and `… and N more` when some were left out.
fn capped_list(entries: &[String], max: usize, chars: usize) -> Vec<String> {
    let mut out: Vec<String> = entries
        .iter()
        .take(max)
        .map(|e| truncate(e, chars))
        .collect();
    if entries.len() > max {
        out.push(format!("… and {} more", entries.len() - max));
    }
    out
}

/// `text` cut to at most `max` characters, ending in `…` when cut.
fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max.saturating_sub(1)) {
        Some((end, _)) if text[end..].chars().nth(1).is_some() => {
            format!("{}…", &text[..end])
        }
        _ => text.to_owned(),
    }
}

/// The body of `format: slack`: `{"text": ...}` for people, in Slack's mrkdwn.
fn slack_body(kind: NotifyEvent, event: &DeploymentEvent) -> Value {
    let env = escape(&event.env);
    let commit = event
        .commit
        .as_deref()
        .map(|c| format!(" of `{}`", escape(&c.chars().take(12).collect::<String>())))
        .unwrap_or_default();
    let what = if event.kind == "drift" {
        format!("drift run {}{commit}", event.deployment)
    } else {
        format!("deployment {}{commit}", event.deployment)
    };
    let headline = match kind {
        NotifyEvent::Succeeded => format!(":white_check_mark: {what} to *{env}* succeeded"),
        NotifyEvent::Failed => format!(":x: {what} to *{env}* failed"),
        NotifyEvent::Recovered => format!(
            ":white_check_mark: {what} to *{env}* succeeded: *{env}* recovered from its failure"
        ),
        NotifyEvent::Held => format!(
            ":warning: {what} to *{env}* is held by the deletion guard: approve it with \
             `gitplane approve {}`",
            event.deployment
        ),
        NotifyEvent::Drift => format!(
            ":mag: drift found in *{env}*: {} resource(s) had changed outside gitplane \
             ({what})",
            event.drifted.len()
        ),
        // Sent by the CLI, never for a deployment's end.
        NotifyEvent::Rollback
        | NotifyEvent::Approved
        | NotifyEvent::Pinned
        | NotifyEvent::Unpinned => format!("{what} to *{env}*: {}", kind.name()),
    };
    let mut lines = vec![headline];
    if let Some(info) = &event.commit_info {
        lines.push(format!(
            "> {} ({})",
            escape(&truncate(&info.summary, 200)),
            escape(&truncate(&info.author, 100))
        ));
    }
    let c = &event.counts;
    lines.push(format!(
        "created {}, updated {}, deleted {}, unchanged {}, failed {} in {:.1} s",
        c.created, c.updated, c.deleted, c.unchanged, c.failed, event.duration_seconds
    ));
    let listed: &[String] = match kind {
        NotifyEvent::Drift => &event.drifted,
        _ if event.status == DeploymentStatus::Succeeded => &[],
        _ => &event.failures,
    };
    for entry in capped_list(listed, SLACK_FAILURES, SLACK_FAILURE_CHARS) {
        lines.push(format!("• {}", escape(&entry)));
    }
    json!({"text": truncate(&lines.join("\n"), SLACK_MAX_CHARS)})
}

/// Slack's three control characters, so a commit message cannot mention `<!channel>` or make a
/// link.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::CommitInfo;
    use gitplane_state::Counts;

    fn event(status: DeploymentStatus) -> DeploymentEvent {
        DeploymentEvent {
            env: "production".to_owned(),
            deployment: 42,
            kind: "commit",
            commit: Some("0123456789abcdef0123456789abcdef01234567".to_owned()),
            commit_info: Some(CommitInfo {
                author: "Ada".to_owned(),
                summary: "Move the database <!channel> & more".to_owned(),
                time: 0,
            }),
            status,
            counts: Counts {
                created: 1,
                updated: 2,
                deleted: 0,
                unchanged: 5,
                failed: 1,
            },
            duration_seconds: 1.23456,
            failures: vec!["modules.app.externals.db: quota exceeded".to_owned()],
            drifted: Vec::new(),
            previous: None,
        }
    }

    #[test]
    fn a_drift_run_failing_as_the_one_before_is_not_news_and_one_that_succeeds_after_is() {
        let failure = Some("modules.app.externals.db: quota exceeded".to_owned());
        let mut e = event(DeploymentStatus::Failed);
        e.kind = "drift";
        assert_eq!(
            e.kinds(),
            [NotifyEvent::Failed],
            "the first failing drift run"
        );
        e.previous = Some((DeploymentStatus::Failed, failure.clone()));
        assert!(e.kinds().is_empty(), "failing the same way again");
        e.previous = Some((DeploymentStatus::Failed, Some("another error".to_owned())));
        assert_eq!(e.kinds(), [NotifyEvent::Failed], "failing another way");
        let mut ok = event(DeploymentStatus::Succeeded);
        ok.kind = "drift";
        assert!(
            ok.kinds().is_empty(),
            "a drift run that succeeds is not news"
        );
        ok.previous = Some((DeploymentStatus::Failed, failure));
        assert_eq!(ok.kinds(), [NotifyEvent::Recovered]);
    }

    #[test]
    fn the_json_body_has_every_documented_field() {
        let body = json_body(NotifyEvent::Failed, &event(DeploymentStatus::Failed));
        let keys: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys.iter().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([
                "event",
                "env",
                "deployment",
                "kind",
                "commit",
                "author",
                "message",
                "status",
                "counts",
                "duration_seconds",
                "failures",
                "drifted",
                "gitplane_version",
            ])
        );
        assert_eq!(body["event"], "deployment.failed");
        assert_eq!(body["status"], "failed");
        assert_eq!(body["deployment"], 42);
        assert_eq!(body["author"], "Ada");
        assert_eq!(body["counts"]["unchanged"], 5);
        assert_eq!(body["duration_seconds"], 1.235);
        assert_eq!(
            body["failures"],
            json!(["modules.app.externals.db: quota exceeded"])
        );
    }

    #[test]
    fn a_body_stays_small_whatever_the_failures() {
        let mut e = event(DeploymentStatus::Failed);
        e.failures = (0..10_000)
            .map(|i| format!("r{i}: {}", "x".repeat(100_000)))
            .collect();
        e.drifted = (0..10_000).map(|i| format!("g{i}")).collect();
        e.commit_info = Some(CommitInfo {
            author: "a".repeat(100_000),
            summary: "m".repeat(100_000),
            time: 0,
        });
        let json = serde_json::to_vec(&json_body(NotifyEvent::Failed, &e)).unwrap();
        assert!(json.len() < 64 * 1024, "{} bytes", json.len());
        let body = json_body(NotifyEvent::Failed, &e);
        let failures = body["failures"].as_array().unwrap();
        assert_eq!(failures.len(), MAX_LISTED + 1);
        assert_eq!(failures[MAX_LISTED], "… and 9980 more");
        assert!(failures[0].as_str().unwrap().ends_with('…'));
        let slack = serde_json::to_vec(&slack_body(NotifyEvent::Failed, &e)).unwrap();
        assert!(slack.len() < 4 * SLACK_MAX_CHARS, "{} bytes", slack.len());
    }

    #[test]
    fn the_slack_text_says_what_happened_and_cannot_mention_the_channel() {
        let body = slack_body(NotifyEvent::Failed, &event(DeploymentStatus::Failed));
        let text = body["text"].as_str().unwrap();
        assert!(
            text.starts_with(":x: deployment 42 of `0123456789ab` to *production* failed"),
            "{text}"
        );
        assert!(text.contains("Move the database &lt;!channel&gt; &amp; more (Ada)"));
        assert!(text.contains("created 1, updated 2, deleted 0, unchanged 5, failed 1"));
        assert!(text.contains("• modules.app.externals.db: quota exceeded"));
        assert!(!text.contains("<!channel>"));

        let ok = slack_body(NotifyEvent::Succeeded, &event(DeploymentStatus::Succeeded));
        let text = ok["text"].as_str().unwrap();
        assert!(text.contains("succeeded"), "{text}");
        assert!(
            !text.contains("quota"),
            "a success lists no failures: {text}"
        );
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "ab…");
        assert_eq!(truncate("ééééé", 3), "éé…");
        assert_eq!(truncate("", 3), "");
    }

    #[test]
    fn only_answers_that_may_change_are_retried() {
        assert_eq!(status_outcome(200), Outcome::Delivered(200));
        assert_eq!(status_outcome(204), Outcome::Delivered(204));
        for status in [408, 429, 500, 502, 503, 599] {
            assert!(
                matches!(status_outcome(status), Outcome::Retry(_)),
                "{status}"
            );
        }
        for status in [301, 302, 400, 401, 403, 404, 410, 422] {
            assert!(
                matches!(status_outcome(status), Outcome::Final(_)),
                "{status}"
            );
        }
        assert!(matches!(
            transport_outcome(&ureq::Error::ConnectionFailed),
            Outcome::Retry(_)
        ));
        assert!(matches!(
            transport_outcome(&ureq::Error::Timeout(ureq::Timeout::Global)),
            Outcome::Retry(_)
        ));
        assert!(matches!(
            transport_outcome(&ureq::Error::Io(
                std::io::ErrorKind::ConnectionRefused.into()
            )),
            Outcome::Retry(_)
        ));
        let bad = ureq::Error::BadUri("https://hooks.example/T0/s3cr3t".to_owned());
        match transport_outcome(&bad) {
            Outcome::Final(why) => assert!(!why.contains("s3cr3t"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn waits_double_up_to_thirty_seconds() {
        let waits: Vec<u64> = (1..=8)
            .map(|a| backoff(BASE_BACKOFF, a).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(BASE_BACKOFF, u32::MAX), MAX_BACKOFF);
    }

    fn drain(queue: &Queue) -> Vec<i64> {
        queue.close();
        let mut seen = Vec::new();
        while let Some(n) = queue.pop("notify[0]") {
            seen.push(n.deployment);
        }
        seen
    }

    fn push(queue: &Queue, deployment: i64, body_bytes: usize) {
        queue.push(
            "notify[0]",
            Notification {
                event: NotifyEvent::Succeeded,
                env: "e".to_owned(),
                deployment,
                body: vec![b' '; body_bytes],
            },
        );
    }

    #[test]
    fn a_full_queue_drops_the_oldest() {
        let queue = Queue::default();
        for deployment in 0..(MAX_QUEUED as i64 + 5) {
            push(&queue, deployment, 10);
        }
        let seen = drain(&queue);
        assert_eq!(seen.len(), MAX_QUEUED);
        assert_eq!(seen[0], 5);
        assert_eq!(seen.last(), Some(&(MAX_QUEUED as i64 + 4)));
        assert_eq!(queue.lock().bytes, 0);
    }

    #[test]
    fn queued_bodies_are_bounded_in_bytes_too() {
        let queue = Queue::default();
        let body = MAX_QUEUED_BYTES / 4;
        for deployment in 0..6 {
            push(&queue, deployment, body);
        }
        assert_eq!(queue.lock().bytes, 4 * body);
        assert_eq!(drain(&queue), [2, 3, 4, 5]);
    }

    #[test]
    fn a_url_file_is_read_when_sent_and_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("url");
        assert!(matches!(read_url_file(&path), Err(Outcome::Retry(_))));
        std::fs::write(&path, "  https://hooks.example/T0/s3cr3t\n").unwrap();
        assert_eq!(
            read_url_file(&path),
            Ok("https://hooks.example/T0/s3cr3t".to_owned())
        );
        std::fs::write(&path, "hooks.example/T0/s3cr3t").unwrap();
        match read_url_file(&path) {
            Err(Outcome::Final(why)) => assert!(!why.contains("s3cr3t"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
