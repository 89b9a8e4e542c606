//! The host config's service settings: the daemon's HTTP listener (`http:`) and where it sends
//! notifications (`notify:`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{nonzero, parse_duration};
use crate::stores::SecretStores;

/// `http:`: the daemon's HTTP listener, off unless set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    /// The bearer token every route but the webhook and the health checks requires. Required
    /// when `listen` is not a loopback address.
    pub token: Option<SecretSource>,
    /// The shared secret push webhooks are signed with; without it `/hooks/git` is off.
    pub webhook_secret: Option<SecretSource>,
    /// Where the plan of a pull request's head is POSTed; without it pull-request webhooks
    /// are acknowledged and ignored.
    pub plan_hook: Option<PlanHook>,
    pub limits: HttpLimits,
}

/// What clients may hold of the listener: connections, time and bytes. Anyone who can reach
/// the port gets this far, token or not, so every one of them is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; more are answered 503 at once. `None`: the default,
    /// [`DEFAULT_MAX_CONNECTIONS`], lowered to what the open-file limit allows.
    pub max_connections: Option<usize>,
    /// How long a client has to send a request's headers, from when its connection opens or
    /// its previous response ends (so it also closes kept-alive connections that send nothing).
    pub header_timeout: Duration,
    /// How long reading a request's body (a webhook, the login form) may take.
    pub body_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed.
    pub idle_timeout: Duration,
    /// The largest webhook body, in bytes.
    pub max_body: usize,
}

pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// GitHub caps its webhook payloads at 25 MB: no forge sends more.
pub const MAX_BODY_CEILING: usize = 25 * 1024 * 1024;

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: None,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            // A push or pull-request payload of GitHub, GitLab or Gitea is tens of KiB.
            max_body: 1024 * 1024,
        }
    }
}

/// `http.plan_hook`: where the daemon POSTs the plan of a pull request's head commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanHook {
    /// Never logged: it may carry a token of its own.
    pub url: String,
    /// Sent as `Authorization: Bearer`, read at each POST (a rotated file is seen at once).
    pub token: Option<SecretSource>,
    /// How long one POST may take.
    pub timeout: Duration,
}

/// Where a secret the host config needs comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    File(PathBuf),
    /// A secret store of the host config and a reference in it.
    Store {
        store: String,
        reference: String,
    },
}

/// A secret that could not be read, without its value.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: {message}")]
pub struct SecretSourceError {
    pub what: String,
    pub message: String,
}

impl SecretSource {
    /// Reads the secret now (a rotated file is seen on the next read), trimmed of surrounding
    /// whitespace; `what` names the setting in errors.
    pub fn read(&self, what: &str, stores: &SecretStores) -> Result<String, SecretSourceError> {
        let fail = |message: String| SecretSourceError {
            what: what.to_owned(),
            message,
        };
        let text = match self {
            SecretSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| fail(format!("cannot read {}: {}", path.display(), e.kind())))?,
            SecretSource::Store { store, reference } => {
                match stores
                    .read(store, reference, None)
                    .map_err(|e| fail(e.to_string()))?
                {
                    serde_json::Value::String(s) => s,
                    _ => {
                        return Err(fail(format!(
                            "secret store '{store}' gave an object for '{reference}': name one \
                             field with {reference}#FIELD"
                        )));
                    }
                }
            }
        };
        let text = text.trim().to_owned();
        if text.is_empty() {
            return Err(fail("the secret is empty".to_owned()));
        }
        Ok(text)
    }
}

/// Which deployment events a notification target hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotifyEvent {
    /// A deployment finished and succeeded.
    Succeeded,
    Failed,
    /// Held by the deletion guard until approved.
    Held,
    /// A drift run found resources changed outside gitplane.
    Drift,
    /// A deployment succeeded after the environment's previous one failed.
    Recovered,
    /// `gitplane rollback` put an environment back at an earlier commit.
    Rollback,
    /// `gitplane approve` let a held deployment through.
    Approved,
    /// `gitplane pin` froze an environment at what it runs.
    Pinned,
    /// `gitplane unpin` released an environment.
    Unpinned,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 9] = [
        NotifyEvent::Succeeded,
        NotifyEvent::Failed,
        NotifyEvent::Held,
        NotifyEvent::Drift,
        NotifyEvent::Recovered,
        NotifyEvent::Rollback,
        NotifyEvent::Approved,
        NotifyEvent::Pinned,
        NotifyEvent::Unpinned,
    ];

    /// The event's name in the JSON body: `deployment.succeeded`, `drift.found`...
    pub fn name(self) -> &'static str {
        match self {
            NotifyEvent::Succeeded => "deployment.succeeded",
            NotifyEvent::Failed => "deployment.failed",
            NotifyEvent::Held => "deployment.held",
            NotifyEvent::Drift => "drift.found",
            NotifyEvent::Recovered => "deployment.recovered",
            NotifyEvent::Rollback => "env.rollback",
            NotifyEvent::Approved => "deployment.approved",
            NotifyEvent::Pinned => "env.pinned",
            NotifyEvent::Unpinned => "env.unpinned",
        }
    }
}

/// The body a notification target receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotifyFormat {
    /// gitplane's event, as JSON.
    #[default]
    Json,
    /// `{"text": ...}`, as Slack's (and Mattermost's, Rocket.Chat's) incoming webhooks take.
    Slack,
}

/// Where to send a URL: written in the config, or read from a file when sent (a Slack webhook
/// URL is itself a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyUrl {
    Url(String),
    File(PathBuf),
}

/// One `notify:` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyConfig {
    /// How logs name it: `notify[0]`; its URL may hold a secret, so it is never logged.
    pub name: String,
    pub url: NotifyUrl,
    pub format: NotifyFormat,
    pub events: BTreeSet<NotifyEvent>,
    /// How long one POST may take.
    pub timeout: Duration,
    /// POSTs in all, the first included, before a notification is given up.
    pub attempts: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpFile {
    listen: String,
    token_file: Option<PathBuf>,
    token_secret: Option<SecretRefFile>,
    webhook_secret_file: Option<PathBuf>,
    webhook_secret: Option<SecretRefFile>,
    plan_hook: Option<PlanHookFile>,
    max_connections: Option<u32>,
    header_timeout: Option<String>,
    body_timeout: Option<String>,
    idle_timeout: Option<String>,
    max_body: Option<SizeFile>,
}

/// `65536` or `1MiB`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum SizeFile {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanHookFile {
    url: String,
    token_file: Option<PathBuf>,
    timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SecretRefFile {
    store: String,
    #[serde(rename = "ref")]
    reference: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NotifyFile {
    url: Option<String>,
    url_file: Option<PathBuf>,
    #[serde(default)]
    format: NotifyFormat,
    events: Option<Vec<NotifyEvent>>,
    timeout: Option<String>,
    attempts: Option<u32>,
}

/// The most POSTs one notification may take.
const MAX_NOTIFY_ATTEMPTS: u32 = 20;

/// A problem found in `http:` or `notify:`: the text to find its line by, and what is wrong.
pub(super) type Problem = (String, String);

fn secret_source(
    key: &str,
    file: Option<PathBuf>,
    secret: Option<SecretRefFile>,
    problems: &mut Vec<Problem>,
) -> Option<SecretSource> {
    match (file, secret) {
        (None, None) => None,
        (Some(path), None) if path.is_absolute() => Some(SecretSource::File(path)),
        (Some(path), None) => {
            problems.push((
                format!("{key}_file"),
                format!(
                    "http.{key}_file '{}' must be an absolute path",
                    path.display()
                ),
            ));
            None
        }
        (None, Some(r)) => Some(SecretSource::Store {
            store: r.store,
            reference: r.reference,
        }),
        (Some(_), Some(_)) => {
            let secret_key = if key == "token" {
                "token_secret"
            } else {
                "webhook_secret"
            };
            problems.push((
                format!("{key}_file"),
                format!("http: give {key}_file or {secret_key}, not both"),
            ));
            None
        }
    }
}

pub(super) fn http(raw: HttpFile, problems: &mut Vec<Problem>) -> Option<HttpConfig> {
    let listen = match raw.listen.parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            problems.push((
                "listen:".to_owned(),
                format!(
                    "http.listen '{}' is not an address and port: write e.g. 127.0.0.1:9470 or \
                     [::1]:9470",
                    raw.listen
                ),
            ));
            return None;
        }
    };
    let token = secret_source("token", raw.token_file, raw.token_secret, problems);
    let webhook_secret = secret_source(
        "webhook_secret",
        raw.webhook_secret_file,
        raw.webhook_secret,
        problems,
    );
    if token.is_none() && !listen.ip().is_loopback() {
        problems.push((
            "listen:".to_owned(),
            format!(
                "http.listen {listen} is reachable from other hosts, so the listener needs a \
                 token: set http.token_file (or token_secret) to a file holding a long random \
                 string, or listen on 127.0.0.1"
            ),
        ));
    }
    let plan_hook = raw.plan_hook.and_then(|h| plan_hook(h, problems));
    if plan_hook.is_some() && webhook_secret.is_none() {
        problems.push((
            "plan_hook:".to_owned(),
            "http.plan_hook needs http.webhook_secret_file (or webhook_secret): pull-request \
             webhooks must be signed"
                .to_owned(),
        ));
    }
    let limits = HttpLimits {
        max_connections: match raw.max_connections {
            Some(0) => {
                problems.push((
                    "max_connections:".to_owned(),
                    "http.max_connections must be at least 1".to_owned(),
                ));
                None
            }
            n => n.map(|n| n as usize),
        },
        header_timeout: limit_time("header_timeout", raw.header_timeout, problems)
            .unwrap_or(HttpLimits::default().header_timeout),
        body_timeout: limit_time("body_timeout", raw.body_timeout, problems)
            .unwrap_or(HttpLimits::default().body_timeout),
        idle_timeout: limit_time("idle_timeout", raw.idle_timeout, problems)
            .unwrap_or(HttpLimits::default().idle_timeout),
        max_body: raw
            .max_body
            .and_then(|m| max_body(m, problems))
            .unwrap_or(HttpLimits::default().max_body),
    };
    Some(HttpConfig {
        listen,
        token,
        webhook_secret,
        plan_hook,
        limits,
    })
}

/// One of `http:`'s time limits, when set and valid.
fn limit_time(key: &str, text: Option<String>, problems: &mut Vec<Problem>) -> Option<Duration> {
    let text = text?;
    match parse_duration(&text).and_then(|d| nonzero(&text, d, key)) {
        Ok(d) => Some(d),
        Err(message) => {
            problems.push((format!("{key}:"), format!("http.{key} {message}")));
            None
        }
    }
}

/// `http.max_body`, when valid: more than nothing, at most what a forge sends.
fn max_body(raw: SizeFile, problems: &mut Vec<Problem>) -> Option<usize> {
    use crate::model::yaml::{parse_size, show_size};
    let bytes = match raw {
        SizeFile::Bytes(n) => Ok(n),
        SizeFile::Text(t) => parse_size(&t),
    };
    let problem = match bytes {
        Ok(0) => "must be more than 0: write e.g. 1MiB".to_owned(),
        Ok(n) if n > MAX_BODY_CEILING as u64 => format!(
            "{} is more than any forge sends (at most {})",
            show_size(n),
            show_size(MAX_BODY_CEILING as u64)
        ),
        Ok(n) => return Some(n as usize),
        Err(message) => message,
    };
    problems.push(("max_body:".to_owned(), format!("http.max_body {problem}")));
    None
}

fn plan_hook(raw: PlanHookFile, problems: &mut Vec<Problem>) -> Option<PlanHook> {
    if !(raw.url.starts_with("http://") || raw.url.starts_with("https://")) {
        problems.push((
            "plan_hook:".to_owned(),
            "http.plan_hook.url must start with http:// or https://".to_owned(),
        ));
        return None;
    }
    let token = match raw.token_file {
        Some(path) if path.is_absolute() => Some(SecretSource::File(path)),
        Some(path) => {
            problems.push((
                "token_file:".to_owned(),
                format!(
                    "http.plan_hook.token_file '{}' must be an absolute path",
                    path.display()
                ),
            ));
            return None;
        }
        None => None,
    };
    let timeout = match raw.timeout.as_deref() {
        None => Duration::from_secs(30),
        Some(t) => match parse_duration(t).and_then(|d| nonzero(t, d, "timeout")) {
            Ok(d) => d,
            Err(message) => {
                problems.push((
                    "timeout:".to_owned(),
                    format!("http.plan_hook.timeout {message}"),
                ));
                return None;
            }
        },
    };
    Some(PlanHook {
        url: raw.url,
        token,
        timeout,
    })
}

pub(super) fn notify(raw: Vec<NotifyFile>, problems: &mut Vec<Problem>) -> Vec<NotifyConfig> {
    let mut out = Vec::new();
    for (i, n) in raw.into_iter().enumerate() {
        let name = format!("notify[{i}]");
        let url = match (n.url, n.url_file) {
            (Some(url), None) if url.starts_with("http://") || url.starts_with("https://") => {
                NotifyUrl::Url(url)
            }
            (Some(_), None) => {
                problems.push((
                    "url:".to_owned(),
                    format!("{name}: url must start with http:// or https://"),
                ));
                continue;
            }
            (None, Some(path)) if path.is_absolute() => NotifyUrl::File(path),
            (None, Some(path)) => {
                problems.push((
                    "url_file:".to_owned(),
                    format!(
                        "{name}: url_file '{}' must be an absolute path",
                        path.display()
                    ),
                ));
                continue;
            }
            _ => {
                problems.push((
                    "notify:".to_owned(),
                    format!(
                        "{name} needs exactly one of url or url_file (a file holding the URL, \
                         for URLs that carry a secret)"
                    ),
                ));
                continue;
            }
        };
        let timeout = match n.timeout.as_deref() {
            None => Duration::from_secs(10),
            Some(t) => match parse_duration(t).and_then(|d| nonzero(t, d, "timeout")) {
                Ok(d) => d,
                Err(message) => {
                    problems.push(("timeout:".to_owned(), format!("{name}: timeout {message}")));
                    continue;
                }
            },
        };
        let attempts = n.attempts.unwrap_or(5);
        // Waits double up to 30 s: 20 attempts already keep one notification going for
        // about eight minutes, while the target's later events wait behind it.
        if !(1..=MAX_NOTIFY_ATTEMPTS).contains(&attempts) {
            problems.push((
                "attempts:".to_owned(),
                format!("{name}: attempts must be from 1 to {MAX_NOTIFY_ATTEMPTS}"),
            ));
            continue;
        }
        let events: BTreeSet<NotifyEvent> = match n.events {
            None => NotifyEvent::ALL.into_iter().collect(),
            Some(events) if events.is_empty() => {
                problems.push((
                    "events:".to_owned(),
                    format!(
                        "{name}: events is empty: list some of succeeded, failed, held, drift, \
                         recovered, rollback, approved, pinned, unpinned, or leave it out for all"
                    ),
                ));
                continue;
            }
            Some(events) => events.into_iter().collect(),
        };
        out.push(NotifyConfig {
            name,
            url,
            format: n.format,
            events,
            timeout,
            attempts,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::HostConfig;

    /// The messages of a host config that does not parse, each with its line.
    fn errors(text: &str) -> Vec<String> {
        HostConfig::parse("host.yaml", text)
            .expect_err("refused")
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn a_reachable_listener_needs_a_token_and_loopback_does_not() {
        let e = errors("http:\n  listen: 0.0.0.0:9470\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("host.yaml:2: http.listen 0.0.0.0:9470 is reachable"));
        let e = errors("http: {listen: \"[::]:9470\"}\n");
        assert!(e[0].contains("needs a token"), "{e:?}");
        for ok in [
            "http: {listen: 127.0.0.1:9470}\n",
            "http: {listen: \"[::1]:9470\"}\n",
            "http: {listen: 0.0.0.0:9470, token_file: /etc/gitplane/token}\n",
        ] {
            let config = HostConfig::parse("host.yaml", ok).expect(ok);
            assert!(config.http.is_some());
        }
    }

    #[test]
    fn secret_sources_are_one_of_two_forms() {
        let e = errors(
            "http:\n  listen: 127.0.0.1:1\n  token_file: /t\n  token_secret: {store: v, ref: x}\n",
        );
        assert!(
            e.iter()
                .any(|m| m.contains("give token_file or token_secret, not both")),
            "{e:?}"
        );
        let e = errors("http:\n  listen: 127.0.0.1:1\n  webhook_secret: {store: v, ref: x}\n");
        assert!(
            e[0].starts_with("host.yaml:3: http: secret store 'v' is not configured"),
            "{e:?}"
        );
    }

    #[test]
    fn the_listener_limits_have_defaults_and_are_checked() {
        let config = HostConfig::parse("host.yaml", "http: {listen: 127.0.0.1:1}\n").unwrap();
        let limits = config.http.unwrap().limits;
        assert_eq!(limits, super::HttpLimits::default());
        assert_eq!(limits.max_connections, None);
        assert_eq!(limits.max_body, 1 << 20);
        let config = HostConfig::parse(
            "host.yaml",
            "http:\n  listen: 127.0.0.1:1\n  max_connections: 64\n  header_timeout: 2s\n  \
             body_timeout: 500ms\n  idle_timeout: 1m\n  max_body: 64KiB\n",
        )
        .unwrap();
        let limits = config.http.unwrap().limits;
        assert_eq!(limits.max_connections, Some(64));
        assert_eq!(limits.header_timeout, std::time::Duration::from_secs(2));
        assert_eq!(limits.body_timeout, std::time::Duration::from_millis(500));
        assert_eq!(limits.idle_timeout, std::time::Duration::from_secs(60));
        assert_eq!(limits.max_body, 65536);
        let e = errors(
            "http:\n  listen: 127.0.0.1:1\n  max_connections: 0\n  header_timeout: 0s\n  \
             body_timeout: soon\n  max_body: 26MiB\n  idle_timeout: 1 fortnight\n",
        );
        assert_eq!(
            e,
            [
                "host.yaml:3: http.max_connections must be at least 1",
                "host.yaml:4: http.header_timeout '0s' is no time at all: a time limit must be \
                 longer than zero, e.g. 30s, 2m or 500ms",
                "host.yaml:5: http.body_timeout 'soon' is not a duration: write e.g. 30s, 1h30m, \
                 500ms, 90d",
                "host.yaml:6: http.max_body 26 MiB is more than any forge sends (at most 25 MiB)",
                "host.yaml:7: http.idle_timeout '1 fortnight': unknown unit 'fortnight' (use ms, \
                 s, m, h, d or w, and combine them: 1h30m)",
            ]
        );
        let e = errors("http:\n  listen: 127.0.0.1:1\n  max_body: 0\n");
        assert_eq!(
            e,
            ["host.yaml:3: http.max_body must be more than 0: write e.g. 1MiB"]
        );
        let e = errors("http:\n  listen: 127.0.0.1:1\n  max_body: lots\n");
        assert_eq!(
            e,
            ["host.yaml:3: http.max_body 'lots' is not a size: write e.g. 65536, 64KiB or 1MiB"]
        );
    }

    #[test]
    fn a_plan_hook_is_checked() {
        let e = errors(
            "http:\n  listen: 127.0.0.1:1\n  webhook_secret_file: /s\n  plan_hook: {url: ftp://x}\n",
        );
        assert!(e[0].contains("plan_hook.url must start with http"), "{e:?}");
        let e = errors("http:\n  listen: 127.0.0.1:1\n  plan_hook: {url: http://x}\n");
        assert!(
            e[0].starts_with("host.yaml:3: http.plan_hook needs http.webhook_secret_file"),
            "{e:?}"
        );
        let e = errors(
            "http:\n  listen: 127.0.0.1:1\n  webhook_secret_file: /s\n  plan_hook:\n    \
             url: http://x\n    token_file: t\n",
        );
        assert!(e[0].contains("must be an absolute path"), "{e:?}");
        let config = HostConfig::parse(
            "host.yaml",
            "http:\n  listen: 127.0.0.1:1\n  webhook_secret_file: /s\n  plan_hook:\n    \
             url: https://bot.example/plan\n    token_file: /t\n    timeout: 5s\n",
        )
        .unwrap();
        let hook = config.http.unwrap().plan_hook.unwrap();
        assert_eq!(hook.url, "https://bot.example/plan");
        assert_eq!(hook.timeout, std::time::Duration::from_secs(5));
    }

    #[test]
    fn notify_entries_are_checked() {
        let e = errors("notify:\n  - {url: ftp://x}\n");
        assert!(
            e[0].contains("notify[0]: url must start with http://"),
            "{e:?}"
        );
        let e = errors("notify:\n  - {url: http://x, url_file: /u}\n");
        assert!(
            e[0].contains("needs exactly one of url or url_file"),
            "{e:?}"
        );
        let e = errors("notify:\n  - url: http://x\n    attempts: 21\n");
        assert!(
            e[0].starts_with("host.yaml:3: notify[0]: attempts must be from 1 to 20"),
            "{e:?}"
        );
        let e = errors("notify:\n  - url: http://x\n    events: []\n");
        assert!(e[0].contains("events is empty"), "{e:?}");
        let e = errors("notify:\n  - url: http://x\n    events: [deployed]\n");
        assert!(e[0].contains("host.yaml:3"), "{e:?}");
        let config = HostConfig::parse(
            "host.yaml",
            "notify:\n  - url: http://x\n    format: slack\n",
        )
        .unwrap();
        assert_eq!(config.notify[0].events.len(), super::NotifyEvent::ALL.len());
        assert_eq!(config.notify[0].format, super::NotifyFormat::Slack);
    }
}
