//! The host configuration (`/etc/gitplane/gitplane.yaml`): where the repository and state are,
//! which drivers run programs or reach networks, resource accounts, secret stores and
//! concurrency limits.
//!
//! It lives on the management host, never in the config repository: credentials stay on the
//! host. [`HostConfig::load`] validates the whole file and reports every problem with its line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::drivers::{ExecDriver, HttpDriver, Registry, TerraformConfig};
use crate::model::{SourceLocation, line_of};
use crate::stores::{SecretStores, StoreConfig};

mod parse;
mod service;

pub use service::{
    DEFAULT_MAX_CONNECTIONS, HttpConfig, HttpLimits, NotifyConfig, NotifyEvent, NotifyFormat,
    NotifyUrl, SecretSource, SecretSourceError,
};

/// The default host configuration file, read when it exists and `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/gitplane/gitplane.yaml";

/// How many driver calls may run at once when the config does not say.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Deployments the daemon runs at once, across its environments (`parallel_environments`).
pub const DEFAULT_PARALLEL_ENVIRONMENTS: usize = 8;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{location}: {message}")]
pub struct ConfigError {
    pub location: SourceLocation,
    pub message: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum AccountError {
    #[error("resource account '{0}' is not configured in the host config's accounts")]
    Unknown(String),
    #[error("resource account '{name}': cannot read {path}: {message}")]
    File {
        name: String,
        path: PathBuf,
        message: String,
    },
    #[error("resource account '{name}': environment variable {var} is not set")]
    Env { name: String, var: String },
}

/// Where the config repository is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoSource {
    /// A local repository, usually bare, that people push to.
    Local(PathBuf),
    /// A remote fetched on an interval into a local mirror.
    Remote { url: String, interval: Duration },
}

/// A driver that runs a program or reaches a network, registered by `driver_type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverConfig {
    Http {
        url: String,
        timeout: Duration,
        concurrency: Option<usize>,
    },
    Exec {
        command: Vec<String>,
        timeout: Duration,
        concurrency: Option<usize>,
        /// Variables of gitplane's environment the program gets besides PATH, HOME and LANG.
        env: Vec<String>,
    },
}

/// Where a resource account's credentials are read from, at the moment a driver needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountSource {
    File(PathBuf),
    Env(String),
}

/// How transient driver failures are retried and in-progress resources polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls in all, the first included, before a transient failure is final.
    pub attempts: u32,
    /// The first wait; each next one doubles, with jitter, up to `max_delay`.
    pub initial_delay: Duration,
    pub max_delay: Duration,
    /// The first wait between polls of an in-progress resource, doubling up to `max_delay`.
    pub poll_interval: Duration,
    /// How long a resource may stay in progress before it fails.
    pub poll_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            poll_timeout: Duration::from_secs(3600),
        }
    }
}

/// How long driver calls in flight may run on after SIGTERM: well inside systemd's default
/// `TimeoutStopSec` (90 s).
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an environment's lease outlives its holder's last heartbeat (`leases.ttl`) when the
/// config does not say: a daemon that dies is replaced within about this long.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
/// The shortest lease: a holder beats five times per lease, and a beat is a few round trips to
/// the database, which a busy server or network may take a second over.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(3);
/// The longest lease: an environment whose daemon died waits this long for another.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(600);

/// The host configuration, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// The file it was read from; `None` for the built-in defaults.
    pub path: Option<PathBuf>,
    pub repo: Option<RepoSource>,
    pub git_ref: Option<String>,
    /// A SQLite file, or a PostgreSQL URL (`postgres://user@host:port/db`), kept as written:
    /// never resolved against a folder.
    pub state: Option<PathBuf>,
    /// `state_password`: the PostgreSQL state's password, from a secret store; see
    /// [`apply_state_password`].
    pub state_password: Option<SecretSource>,
    /// `leases.ttl`: how long an environment's lease outlives its holder's last heartbeat, when
    /// daemons share a PostgreSQL state.
    pub lease_ttl: Duration,
    pub concurrency: usize,
    /// `parallel_environments`: deployments (and drift runs) the daemon runs at once; the
    /// others wait their turn in their environment's queue.
    pub parallel_environments: usize,
    pub retry: RetryPolicy,
    /// How the daemon retries deployments that did not finish (`retry.deployments`).
    pub deployment_retry: DeploymentRetry,
    /// How often the daemon resolves the watched ref even without a file event.
    pub watch_interval: Option<Duration>,
    /// How long the daemon lets driver calls in flight run on after SIGTERM.
    pub stop_timeout: Duration,
    pub drivers: BTreeMap<String, DriverConfig>,
    pub accounts: BTreeMap<String, AccountSource>,
    /// Where `secret_refs: {store, ref}` values are read from, by store name.
    pub secret_stores: BTreeMap<String, StoreConfig>,
    /// The store marked `primary: true`: it serves `secret_refs: {ref}` that name no store.
    pub primary_secret_store: Option<String>,
    /// `history.keep`: how much history state keeps; `None` keeps all of it.
    pub history: Option<gitplane_state::Retention>,
    /// Where the key that seals secrets in the state file comes from; `None`: `<state>.key`.
    pub state_key: Option<gitplane_state::KeySource>,
    /// How the built-in Terraform driver runs Terraform.
    pub terraform: TerraformConfig,
    /// `http:`: the daemon's HTTP listener; `None`: off.
    pub http: Option<HttpConfig>,
    /// `notify:`: where the daemon POSTs deployment events.
    pub notify: Vec<NotifyConfig>,
    /// `previews:`: an environment per matching branch; `None`: off.
    pub previews: Option<PreviewConfig>,
}

/// How deployments that did not finish are retried (`retry: {deployments: ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeploymentRetry {
    /// The wait before the first retry; each next one doubles, with jitter.
    pub interval: Duration,
    /// The longest wait between two retries.
    pub max_interval: Duration,
    /// Retries of one commit before it is left failed; 0: no limit (a newer commit still ends
    /// them).
    pub max_attempts: u32,
}

impl Default for DeploymentRetry {
    fn default() -> Self {
        DeploymentRetry {
            interval: Duration::from_secs(60),
            max_interval: Duration::from_secs(3600),
            max_attempts: 0,
        }
    }
}

impl DeploymentRetry {
    /// The wait before retry number `retry` (1 for the first): `interval * 2^(retry-1)`,
    /// capped at `max_interval`, times a factor in [0.5, 1.0] drawn from `salt`, so the
    /// environments a database outage cut do not all come back at the same instant.
    pub fn delay(&self, retry: u32, salt: u64) -> Duration {
        let exp = self
            .interval
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        let capped = exp.min(self.max_interval);
        let factor = 0.5 + (salt % 501) as f64 / 1000.0;
        capped.mul_f64(factor)
    }
}

/// A branch name pattern, as a glob: `*` is any run of characters (slashes included), `?` one
/// character, `{pr,feature}-*` either form, `[0-9]` one of a class.
#[derive(Debug, Clone)]
pub struct BranchPattern {
    text: String,
    matcher: globset::GlobMatcher,
}

impl BranchPattern {
    pub fn new(text: &str) -> Result<BranchPattern, String> {
        let glob = globset::GlobBuilder::new(text)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("'{text}' is not a branch pattern: {}", e.kind()))?;
        Ok(BranchPattern {
            text: text.to_owned(),
            matcher: glob.compile_matcher(),
        })
    }

    /// Whether branch `name` (without `refs/heads/`) matches.
    pub fn matches(&self, name: &str) -> bool {
        self.matcher.is_match(name)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for BranchPattern {
    fn eq(&self, other: &BranchPattern) -> bool {
        self.text == other.text
    }
}

impl Eq for BranchPattern {}

/// Where a daemon keeps the mirror of a remote repository (`repo: {url}`): beside the state
/// file; with a PostgreSQL state (no file), in the service's state directory (systemd's
/// `StateDirectory=`, given as `$STATE_DIRECTORY`), else the working directory.
pub fn mirror_path(state: &Path) -> PathBuf {
    if state.to_str().is_some_and(gitplane_state::is_postgres_url) {
        return std::env::var_os("STATE_DIRECTORY")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join("mirror.git");
    }
    state
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("mirror.git")
}

/// Where a command run by a person finds the daemon's mirror: where [`mirror_path`] says, else,
/// for a PostgreSQL state outside systemd's environment, in the packaged unit's state
/// directory (`/var/lib/gitplane`), where the service keeps it.
pub fn mirror_for_commands(state: &Path) -> PathBuf {
    let mirror = mirror_path(state);
    let service = Path::new(SERVICE_STATE_DIRECTORY).join("mirror.git");
    let postgres = state.to_str().is_some_and(gitplane_state::is_postgres_url);
    if postgres
        && !mirror.exists()
        && std::env::var_os("STATE_DIRECTORY").is_none()
        && service.exists()
    {
        return service;
    }
    mirror
}

/// The state directory of the packaged systemd unit (`StateDirectory=gitplane`).
pub const SERVICE_STATE_DIRECTORY: &str = "/var/lib/gitplane";

/// `previews: {branches: "pr-*", type: development, ttl: 72h}`: the daemon makes an
/// environment for each branch whose name matches `branches`, of type `env_type`, and removes it
/// when the branch is deleted or `ttl` passes without a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewConfig {
    /// Which branches get a preview.
    pub branches: BranchPattern,
    /// The environment type the previews have: it chooses their definitions.
    pub env_type: String,
    /// How long a preview lives after its branch's last push; `None`: until the branch goes.
    pub ttl: Option<Duration>,
    /// What a preview takes from its branch (`previews.trust`).
    pub trust: PreviewTrust,
}

/// `previews.trust`: how much of a branch a preview environment runs.
///
/// Whoever can push a matching branch decides what the preview deploys. With `workloads` (the
/// default) that is the branch's Score files alone: definitions, environment files,
/// `gitplane.yaml` (and so drivers, accounts, secret stores and Terraform) come from the
/// watched ref, which the platform team reviews. With `branch` the whole branch is deployed, so
/// whoever can push a matching branch can run code on the host with its credentials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PreviewTrust {
    #[default]
    Workloads,
    Branch,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            path: None,
            repo: None,
            git_ref: None,
            state: None,
            state_password: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            concurrency: DEFAULT_CONCURRENCY,
            parallel_environments: DEFAULT_PARALLEL_ENVIRONMENTS,
            retry: RetryPolicy::default(),
            deployment_retry: DeploymentRetry::default(),
            watch_interval: None,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            drivers: BTreeMap::new(),
            accounts: BTreeMap::new(),
            secret_stores: BTreeMap::new(),
            primary_secret_store: None,
            history: None,
            state_key: None,
            terraform: TerraformConfig::default(),
            http: None,
            notify: Vec::new(),
            previews: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostConfigFile {
    repo: Option<RepoFile>,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    state: Option<PathBuf>,
    state_password: Option<StatePasswordFile>,
    leases: Option<LeasesFile>,
    concurrency: Option<usize>,
    parallel_environments: Option<usize>,
    retry: Option<RetryFile>,
    watch_interval: Option<String>,
    stop_timeout: Option<String>,
    #[serde(default)]
    drivers: BTreeMap<String, DriverFile>,
    #[serde(default)]
    accounts: BTreeMap<String, AccountFile>,
    #[serde(default)]
    secret_stores: BTreeMap<String, SecretStoreFile>,
    history: Option<HistoryFile>,
    state_key: Option<StateKeyFile>,
    terraform: Option<TerraformFile>,
    http: Option<service::HttpFile>,
    #[serde(default)]
    notify: Vec<service::NotifyFile>,
    previews: Option<PreviewsFile>,
}

/// `previews: {branches: "pr-*", type: development, ttl: 72h}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PreviewsFile {
    branches: String,
    #[serde(rename = "type")]
    env_type: String,
    ttl: Option<String>,
    trust: Option<String>,
}

/// `terraform:`: how the built-in Terraform driver runs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TerraformFile {
    program: Option<PathBuf>,
    timeout: Option<String>,
    concurrency: Option<usize>,
    env: Option<Vec<String>>,
    home: Option<PathBuf>,
}

/// `state_password: {store: NAME, ref: KEY}`: a secret store of this config and a reference in it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatePasswordFile {
    store: String,
    #[serde(rename = "ref")]
    reference: String,
}

/// `leases: {ttl: 15s}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeasesFile {
    ttl: Option<String>,
}

/// `state_key: {file: PATH}` (created if missing) or `{credential: NAME}` (systemd's
/// `LoadCredential`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateKeyFile {
    file: Option<PathBuf>,
    credential: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryFile {
    keep: KeepFile,
}

/// `keep: 1000` (deployments per environment) or `keep: 90d` (an age).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum KeepFile {
    Deployments(u64),
    Age(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretStoreFile {
    dir: Option<PathBuf>,
    vault: Option<VaultFile>,
    /// Serves refs that name no store, as HPO's primary secret store does.
    #[serde(default)]
    primary: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultFile {
    url: String,
    token_file: PathBuf,
    mount: Option<String>,
    timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RepoFile {
    Path(PathBuf),
    Remote(RemoteFile),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoteFile {
    url: String,
    interval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryFile {
    attempts: Option<u32>,
    deployments: Option<DeploymentRetryFile>,
    initial_delay: Option<String>,
    max_delay: Option<String>,
    poll_interval: Option<String>,
    poll_timeout: Option<String>,
}

/// `retry: {deployments: {interval: 1m, max_interval: 1h, max_attempts: 0}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeploymentRetryFile {
    interval: Option<String>,
    max_interval: Option<String>,
    max_attempts: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DriverFile {
    http: Option<HttpFile>,
    exec: Option<ExecFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    url: String,
    timeout: Option<String>,
    concurrency: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecFile {
    command: Vec<String>,
    timeout: Option<String>,
    concurrency: Option<usize>,
    env: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccountFile {
    file: Option<PathBuf>,
    env: Option<String>,
}

/// Which database a state setting names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL database, by URL.
    Postgres,
}

/// Environment ids are file names elsewhere (`environments/<id>.yaml`) and labels in drivers:
/// kept to what both accept.
pub const MAX_ENV_ID: usize = 63;

/// Whether `text` can be an environment type: lowercase letters, digits and `-`.
pub fn valid_env_type(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_ENV_ID
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// What `state` names: a PostgreSQL URL, which must parse, or a SQLite file. A value that
/// starts like a PostgreSQL URL but is not one (`postgres:host/db`) is refused rather than taken
/// for a file of that name. Messages never quote the value, which may hold a password.
pub fn state_kind(state: &str) -> Result<StateKind, String> {
    if gitplane_state::is_postgres_url(state) {
        return gitplane_state::PgTarget::parse(state, None)
            .map(|_| StateKind::Postgres)
            .map_err(|reason| format!("state: {reason}"));
    }
    let lower = state.get(..11).unwrap_or(state).to_ascii_lowercase();
    if lower.starts_with("postgres:") || lower.starts_with("postgresql:") {
        return Err("state starts like a PostgreSQL URL but is not one: write \
             postgres://USER@HOST:PORT/DATABASE (or postgresql://...)"
            .to_owned());
    }
    Ok(StateKind::Sqlite)
}

/// `url` without its password, and the password, percent-decoded: from the user part
/// (`postgres://user:PASSWORD@host/db`) or a `password=` parameter, read as the PostgreSQL
/// driver reads them. The caller hands the password to the state crate and names the state by
/// what is left, so no message or log line that names the state can show it.
pub fn split_url_password(url: &str) -> Result<(String, Option<String>), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_owned(), None));
    };
    let mut password = None;
    // The driver takes the credentials up to the first '@'.
    let rest = match rest.split_once('@') {
        Some((credentials, after)) => match credentials.split_once(':') {
            Some((user, secret)) => {
                password = Some(percent_decoded(secret)?);
                format!("{user}@{after}")
            }
            None => rest.to_owned(),
        },
        None => rest.to_owned(),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let mut kept = Vec::new();
            for pair in query.split('&') {
                match pair.split_once('=') {
                    Some((key, value)) if percent_decoded(key)? == "password" => {
                        password = Some(percent_decoded(value)?);
                    }
                    _ => kept.push(pair),
                }
            }
            if kept.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", kept.join("&"))
            }
        }
        None => rest,
    };
    Ok((format!("{scheme}://{rest}"), password))
}

/// `%XX` escapes decoded; a `%` not followed by two hex digits stays as it is.
fn percent_decoded(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| "state: a %-escape of the URL does not decode to UTF-8 text".to_owned())
}

/// Reads `state_password` from its secret store now and hands it to the state crate, which
/// opens PostgreSQL states with it (ahead of `PGPASSWORD`); without `state_password`, forgets
/// any set before. Call it before a store of the host's state is opened, and again after the
/// host config is reloaded (the password may have been rotated). Its errors never carry the
/// password.
pub fn apply_state_password(host: &HostConfig) -> Result<(), SecretSourceError> {
    let password = match &host.state_password {
        None => None,
        Some(source) => Some(source.read("state_password", &host.secret_stores())?),
    };
    gitplane_state::set_postgres_password(password);
    Ok(())
}

/// Parses how much history to keep (`history.keep`, `gitplane state vacuum --keep`): a number
/// of deployments per environment (`1000`) or an age (`90d`).
pub fn parse_retention(text: &str) -> Result<gitplane_state::Retention, String> {
    use gitplane_state::Retention;
    if let Ok(n) = text.parse::<u64>() {
        return match n {
            0 => Err("keep at least 1 deployment, or an age such as 90d".to_owned()),
            n => Ok(Retention::Deployments(n)),
        };
    }
    match parse_duration(text)? {
        age if age.is_zero() => Err("keep more than no time".to_owned()),
        age => Ok(Retention::Age(age)),
    }
}

/// Parses a duration as `humantime` reads one (`30s`, `2m`, `1h30m`, `1h 30m`, `500ms`, `90d`,
/// `2w`), or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(seconds) = t.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(t).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } => format!(
            "'{text}': unknown unit '{unit}' (use ms, s, m, h, d or w, and combine them: 1h30m)"
        ),
        _ => format!("'{text}' is not a duration: write e.g. 30s, 1h30m, 500ms, 90d"),
    })
}

/// What keeps `program` from being started, found without starting it: it does not exist, is
/// not a file, or nobody may execute it. `None` when it looks runnable, and when this user may
/// not look: only the service can tell then, when it runs the program.
fn program_problem(program: &Path) -> Option<&'static str> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(program) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist"),
        Err(_) => None,
        Ok(m) if !m.is_file() => Some("is not a file"),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Some("is not executable (chmod +x)"),
        Ok(_) => None,
    }
}

/// `duration` unless it is zero, which no time limit or interval may be.
fn nonzero(text: &str, duration: Duration, what: &str) -> Result<Duration, String> {
    if !duration.is_zero() {
        return Ok(duration);
    }
    let what = what.trim_end_matches(':');
    let example = if what.contains("interval") {
        "30s"
    } else {
        "30s, 2m or 500ms"
    };
    Err(format!(
        "'{text}' is no time at all: {} must be longer than zero, e.g. {example}",
        if what.contains("interval") {
            "an interval"
        } else {
            "a time limit"
        }
    ))
}

impl HostConfig {
    /// Reads `path`; or, when `path` is `None`, [`DEFAULT_PATH`] if it exists, else defaults.
    pub fn load(path: Option<&Path>) -> Result<HostConfig, Vec<ConfigError>> {
        let path = match path {
            Some(p) => p.to_owned(),
            None if Path::new(DEFAULT_PATH).exists() => PathBuf::from(DEFAULT_PATH),
            None => return Ok(HostConfig::default()),
        };
        let file = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| {
            vec![ConfigError {
                location: SourceLocation::file(&file),
                message: format!("cannot read the host config: {e}"),
            }]
        })?;
        let mut config = HostConfig::parse(&file, &text)?;
        let missing = config.missing_paths(&file, &text);
        if !missing.is_empty() {
            return Err(missing);
        }
        config.path = Some(path);
        Ok(config)
    }

    /// The programs and account files this config names that are not there, found without
    /// reading an account or running a program, so that `validate` (and every other command)
    /// says so instead of the first driver call. Only what this user can see is judged: the
    /// pre-receive hook runs as the pushing user, who need not see into the service's folders.
    fn missing_paths(&self, file: &str, text: &str) -> Vec<ConfigError> {
        let at = |name: &str, message: String| ConfigError {
            location: SourceLocation {
                file: file.to_owned(),
                line: line_of(text, &format!("{name}:")),
                column: None,
            },
            message,
        };
        let mut errors = Vec::new();
        for (name, driver) in &self.drivers {
            if let DriverConfig::Exec { command, .. } = driver
                && let Some(program) = command.first()
                && let Some(problem) = program_problem(Path::new(program))
            {
                errors.push(at(
                    name,
                    format!(
                        "driver '{name}': the program {program} {problem}: install it there, or \
                         correct the command"
                    ),
                ));
            }
        }
        if let Some(program) = &self.terraform.program
            && let Some(problem) = program_problem(program)
        {
            errors.push(at(
                "terraform",
                format!(
                    "terraform.program {} {problem}: install Terraform or OpenTofu there, or \
                     correct the path",
                    program.display()
                ),
            ));
        }
        let secret_files = self.http.iter().flat_map(|h| {
            [
                ("token_file", &h.token),
                ("webhook_secret_file", &h.webhook_secret),
            ]
        });
        for (key, source) in secret_files {
            if let Some(SecretSource::File(path)) = source
                && let Err(e) = std::fs::metadata(path)
                && e.kind() == std::io::ErrorKind::NotFound
            {
                errors.push(at(
                    key,
                    format!(
                        "http.{key} {} does not exist: put the secret there, or correct the path",
                        path.display()
                    ),
                ));
            }
        }
        for (name, source) in &self.accounts {
            let AccountSource::File(path) = source else {
                continue;
            };
            let problem = match std::fs::metadata(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist"),
                Ok(m) if m.is_dir() => Some("is a folder, not a file"),
                _ => None,
            };
            if let Some(problem) = problem {
                errors.push(at(
                    name,
                    format!(
                        "account '{name}': the file {} {problem}: put the account's \
                         credentials there, or correct the path",
                        path.display()
                    ),
                ));
            }
        }
        errors
    }

    /// Parses and validates the text of a host config file named `file`.
    pub fn parse(file: &str, text: &str) -> Result<HostConfig, Vec<ConfigError>> {
        parse::host_config(file, text)
    }

    /// The secret stores this config names.
    pub fn secret_stores(&self) -> SecretStores {
        SecretStores::new(self.secret_stores.clone())
            .with_primary(self.primary_secret_store.clone())
    }

    /// The built-in drivers plus every driver this config registers.
    pub fn registry(&self) -> Registry {
        let mut registry = Registry::builtin();
        // Before the configured drivers: one of them may take a Terraform driver's name.
        registry.register_terraform(&self.terraform);
        for (name, config) in &self.drivers {
            match config {
                DriverConfig::Http {
                    url,
                    timeout,
                    concurrency,
                } => {
                    registry.register(name, Arc::new(HttpDriver::new(url, *timeout)), *concurrency)
                }
                DriverConfig::Exec {
                    command,
                    timeout,
                    concurrency,
                    env,
                } => registry.register(
                    name,
                    Arc::new(ExecDriver::new(command.clone(), *timeout, env.clone())),
                    *concurrency,
                ),
            }
        }
        registry
    }

    /// Reads a resource account's credentials now (so rotating them needs no restart): a JSON
    /// document if the source holds one, else its text, trimmed.
    pub fn account(&self, name: &str) -> Result<Value, AccountError> {
        let text = match self.accounts.get(name) {
            None => return Err(AccountError::Unknown(name.to_owned())),
            Some(AccountSource::File(path)) => {
                std::fs::read_to_string(path).map_err(|e| AccountError::File {
                    name: name.to_owned(),
                    path: path.clone(),
                    message: e.kind().to_string(),
                })?
            }
            Some(AccountSource::Env(var)) => std::env::var(var).map_err(|_| AccountError::Env {
                name: name.to_owned(),
                var: var.clone(),
            })?,
        };
        Ok(serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.trim().to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors a host config `text` (as `host.yaml`) gives, as the user reads them.
    fn errors(text: &str) -> Vec<String> {
        HostConfig::parse("host.yaml", text)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(
            parse_duration("90d").unwrap(),
            Duration::from_secs(90 * 86_400)
        );
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("2w").unwrap(),
            Duration::from_secs(14 * 86_400)
        );
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn the_design_example_loads() {
        let text = r#"
repo: /srv/git/platform.git          # or a remote: {url: ..., interval: 60s}
ref: refs/heads/main
state: /var/lib/gitplane/state.db
concurrency: 16
drivers:
  acme/queue:
    http: {url: "http://127.0.0.1:8181/queue/", timeout: 30s, concurrency: 8}
  acme/dns:
    exec: {command: ["/usr/lib/gitplane/drivers/dns", "--zone", "example.com"], timeout: 120s}
accounts:
  aws-prod: {file: /etc/gitplane/accounts/aws-prod.json}
"#;
        let c = HostConfig::parse("gitplane.yaml", text).unwrap();
        assert_eq!(
            c.repo,
            Some(RepoSource::Local("/srv/git/platform.git".into()))
        );
        assert_eq!(c.git_ref.as_deref(), Some("refs/heads/main"));
        assert_eq!(c.concurrency, 16);
        assert_eq!(
            c.drivers["acme/queue"],
            DriverConfig::Http {
                url: "http://127.0.0.1:8181/queue/".into(),
                timeout: Duration::from_secs(30),
                concurrency: Some(8)
            }
        );
        assert!(
            matches!(&c.drivers["acme/dns"], DriverConfig::Exec { command, .. } if command.len() == 3)
        );
        assert_eq!(
            c.accounts["aws-prod"],
            AccountSource::File("/etc/gitplane/accounts/aws-prod.json".into())
        );
        let registry = c.registry();
        assert_eq!(
            registry.get("acme/queue").and_then(|r| r.concurrency),
            Some(8)
        );
        assert!(registry.get("humanitec/echo").is_some());
    }

    #[test]
    fn previews_are_read_and_each_bad_key_is_reported_with_its_line() {
        let c = HostConfig::parse(
            "host.yaml",
            "previews: {branches: \"pr-*\", type: development, ttl: 72h}\n",
        )
        .unwrap();
        assert_eq!(
            c.previews,
            Some(PreviewConfig {
                branches: BranchPattern::new("pr-*").unwrap(),
                env_type: "development".into(),
                ttl: Some(Duration::from_secs(72 * 3600)),
                trust: PreviewTrust::Workloads,
            })
        );
        let trusting = HostConfig::parse(
            "host.yaml",
            "previews: {branches: \"pr-*\", type: development, trust: branch}\n",
        )
        .unwrap();
        assert_eq!(trusting.previews.unwrap().trust, PreviewTrust::Branch);
        assert_eq!(
            errors(
                "concurrency: 2\npreviews:\n  branches: \"pr-*\"\n  type: Dev Env\n  ttl: 3 fortnights\n"
            ),
            [
                "host.yaml:2: previews.type 'Dev Env' is not an environment type: use lowercase \
                 letters, digits and '-', e.g. development",
                "host.yaml:2: previews.ttl: '3 fortnights': unknown unit 'fortnights' (use ms, \
                 s, m, h, d or w, and combine them: 1h30m)",
            ]
        );
        assert_eq!(
            errors("previews:\n  branches: \"\"\n  type: dev\n"),
            ["host.yaml:2: previews.branches '' is not a branch pattern: write e.g. \"pr-*\""]
        );
        assert!(errors("previews: {branches: x}\n")[0].contains("missing field `type`"));
        assert!(
            errors("previews:\n  branches: x\n  type: dev\n  trust: everyone\n")[0]
                .starts_with("host.yaml:4: previews.trust 'everyone' is not 'workloads'"),
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_line_in_the_order_of_the_file() {
        let text = "concurrency: 0\nparallel_environments: 0\ndrivers:\n  a/b:\n    exec: {command: [relative/prog]}\n  c/d:\n    http: {url: ftp://x}\n  e/f: {}\naccounts:\n  acct: {}\n";
        let errors: Vec<String> = HostConfig::parse("host.yaml", text)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "host.yaml:1: concurrency must be at least 1",
                "host.yaml:2: parallel_environments must be at least 1",
                "host.yaml:4: driver 'a/b': the program 'relative/prog' must be an absolute path (no shell, no PATH lookup)",
                "host.yaml:6: driver 'c/d': url 'ftp://x' must start with http:// or https://",
                "host.yaml:8: driver 'e/f' needs exactly one of http or exec",
                "host.yaml:10: account 'acct' needs exactly one of file or env",
            ]
        );
    }

    #[test]
    fn a_primary_store_serves_refs_that_name_none() {
        let text = "secret_stores:\n  files: {dir: /run/credentials/gitplane}\n  vault:\n    \
                    vault: {url: \"http://v:8200\", token_file: /t}\n    primary: true\n";
        let c = HostConfig::parse("host.yaml", text).unwrap();
        assert_eq!(c.primary_secret_store.as_deref(), Some("vault"));
        assert_eq!(c.secret_stores().default_store(), Ok("vault"));
        let c = HostConfig::parse("host.yaml", &text.replace("    primary: true\n", "")).unwrap();
        assert_eq!(c.primary_secret_store, None);
        assert!(c.secret_stores().default_store().is_err());
        let both = text.replace(
            "{dir: /run/credentials/gitplane}",
            "{dir: /r, primary: true}",
        );
        let errors: Vec<String> = HostConfig::parse("host.yaml", &both)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "host.yaml:3: secret stores 'files' and 'vault' are both marked primary: keep \
              `primary: true` on one (it serves refs that name no store)"
            ]
        );
    }

    #[test]
    fn history_keeps_a_number_of_deployments_or_an_age() {
        let keep = |text: &str| HostConfig::parse("host.yaml", text).map(|c| c.history);
        assert_eq!(keep("concurrency: 4\n").unwrap(), None);
        assert_eq!(
            keep("history: {keep: 1000}\n").unwrap(),
            Some(gitplane_state::Retention::Deployments(1000))
        );
        assert_eq!(
            keep("history:\n  keep: 90d\n").unwrap(),
            Some(gitplane_state::Retention::Age(Duration::from_secs(
                90 * 86_400
            )))
        );
        let errors = |text: &str| -> Vec<String> {
            keep(text)
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            errors("concurrency: 2\nhistory:\n  keep: 0\n"),
            ["host.yaml:3: history.keep: keep at least 1 deployment, or an age such as 90d"]
        );
        assert_eq!(
            errors("history: {keep: forever}\n"),
            [
                "host.yaml:1: history.keep: 'forever' is not a duration: write e.g. 30s, 1h30m, 500ms, 90d"
            ]
        );
        assert!(errors("history: {keep: 10, days: 3}\n")[0].contains("unknown field `days`"));
    }

    #[test]
    fn a_time_limit_of_zero_is_refused() {
        assert_eq!(
            errors("drivers:\n  a/b:\n    http: {url: \"http://h\", timeout: 0s}\n"),
            [
                "host.yaml:2: '0s' is no time at all: a time limit must be longer than zero, e.g. \
              30s, 2m or 500ms"
            ]
        );
        assert_eq!(
            errors("retry:\n  poll_timeout: 0ms\n")[0],
            "host.yaml:2: '0ms' is no time at all: a time limit must be longer than zero, e.g. \
             30s, 2m or 500ms"
        );
        assert_eq!(
            errors("watch_interval: 0\n")[0],
            "host.yaml:1: '0' is no time at all: an interval must be longer than zero, e.g. 30s"
        );
        assert!(
            errors(
                "secret_stores:\n  v: {vault: {url: \"http://v\", token_file: /t, timeout: 0s}}\n"
            )[0]
            .starts_with("host.yaml:2: secret store 'v': timeout '0s' is no time at all")
        );
        // A retry may wait no time at all.
        let c =
            HostConfig::parse("host.yaml", "retry: {initial_delay: 0s, max_delay: 0s}\n").unwrap();
        assert!(c.retry.initial_delay.is_zero());
    }

    #[test]
    fn deployment_retries_are_read_and_a_zero_interval_is_refused() {
        let c = HostConfig::parse(
            "host.yaml",
            "retry:\n  attempts: 3\n  deployments: {interval: 2s, max_interval: 10s, max_attempts: 4}\n",
        )
        .unwrap();
        assert_eq!(
            c.deployment_retry,
            DeploymentRetry {
                interval: Duration::from_secs(2),
                max_interval: Duration::from_secs(10),
                max_attempts: 4
            }
        );
        assert_eq!(c.retry.attempts, 3);
        assert_eq!(
            HostConfig::parse("host.yaml", "").unwrap().deployment_retry,
            DeploymentRetry::default()
        );
        let e = errors("retry:\n  deployments:\n    interval: 0s\n");
        assert!(e[0].starts_with("host.yaml:2:"), "{e:?}");
        assert!(e[0].contains("no time at all"), "{e:?}");
        let e = errors("retry: {deployments: {every: 1m}}\n");
        assert!(e[0].contains("every"), "{e:?}");
    }

    #[test]
    fn missing_programs_and_account_files_are_found_before_any_call() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let runnable = dir.path().join("driver");
        std::fs::write(&runnable, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&runnable, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let account = dir.path().join("account.json");
        std::fs::write(&account, "{}").unwrap();
        let d = dir.path().display();
        let text = format!(
            "drivers:\n  ok/x:\n    exec: {{command: [{d}/driver]}}\n  gone/x:\n    exec: \
             {{command: [{d}/nowhere]}}\n  plain/x:\n    exec: {{command: [{d}/plain]}}\n  \
             folder/x:\n    exec: {{command: [{d}]}}\naccounts:\n  here: {{file: {d}/account.json}}\n  \
             gone: {{file: {d}/missing.json}}\n  env: {{env: SOME_VAR}}\n"
        );
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, &text).unwrap();
        let errors: Vec<String> = HostConfig::load(Some(&path))
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        let p = path.display();
        assert_eq!(
            errors,
            [
                format!(
                    "{p}:8: driver 'folder/x': the program {d} is not a file: install it there, or correct the command"
                ),
                format!(
                    "{p}:4: driver 'gone/x': the program {d}/nowhere does not exist: install it there, or correct the command"
                ),
                format!(
                    "{p}:6: driver 'plain/x': the program {d}/plain is not executable (chmod +x): install it there, or correct the command"
                ),
                format!(
                    "{p}:12: account 'gone': the file {d}/missing.json does not exist: put the account's credentials there, or correct the path"
                ),
            ]
        );
    }

    #[test]
    fn the_terraform_section_sets_the_built_in_driver() {
        use crate::drivers::TerraformConfig;
        let c = HostConfig::parse("host.yaml", "concurrency: 2\n").unwrap();
        assert_eq!(c.terraform, TerraformConfig::default());
        assert!(c.registry().get("humanitec/terraform").is_some());
        let text = "terraform:\n  program: /usr/bin/tofu\n  timeout: 45m\n  concurrency: 2\n  \
                    env: [TF_PLUGIN_CACHE_DIR, HTTPS_PROXY]\n  home: /var/lib/gitplane/tf\n\
                    drivers:\n  humanitec/terraform-runner:\n    http: {url: \"http://127.0.0.1:9/\"}\n";
        let c = HostConfig::parse("host.yaml", text).unwrap();
        assert_eq!(
            c.terraform,
            TerraformConfig {
                program: Some("/usr/bin/tofu".into()),
                timeout: Duration::from_secs(45 * 60),
                concurrency: Some(2),
                env: vec!["TF_PLUGIN_CACHE_DIR".into(), "HTTPS_PROXY".into()],
                home: Some("/var/lib/gitplane/tf".into()),
            }
        );
        let registry = c.registry();
        assert_eq!(
            registry
                .get("humanitec/terraform")
                .and_then(|r| r.concurrency),
            Some(2)
        );
        // A driver the host config registers under a Terraform name takes its place.
        assert_eq!(
            registry
                .get("humanitec/terraform-runner")
                .and_then(|r| r.concurrency),
            None
        );
        let errors: Vec<String> = HostConfig::parse(
            "host.yaml",
            "terraform:\n  program: tofu\n  timeout: 0s\n  concurrency: 0\n  env: [A=b]\n  \
             home: relative\n",
        )
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            errors,
            [
                "host.yaml:1: '0s' is no time at all: a time limit must be longer than zero, \
                 e.g. 30s, 2m or 500ms",
                "host.yaml:1: terraform.concurrency must be at least 1",
                "host.yaml:1: terraform.env lists names of environment variables to pass (such \
                 as TF_PLUGIN_CACHE_DIR), not assignments",
                "host.yaml:2: terraform.program 'tofu' must be an absolute path",
                "host.yaml:6: terraform.home 'relative' must be an absolute path",
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, "terraform:\n  program: /nonexistent/terraform\n").unwrap();
        let errors = HostConfig::load(Some(&path)).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .message
                .starts_with("terraform.program /nonexistent/terraform does not exist"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = HostConfig::parse("host.yaml", "concurency: 4\n").unwrap_err();
        assert_eq!(err[0].location.line, Some(1));
        assert!(
            err[0].message.contains("unknown field `concurency`"),
            "{}",
            err[0]
        );
    }

    #[test]
    fn accounts_are_read_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acct.json");
        std::fs::write(&path, r#"{"key": "k1"}"#).unwrap();
        let text = format!(
            "accounts:\n  a: {{file: {}}}\n  b: {{env: GITPLANE_TEST_ACCOUNT_B}}\n",
            path.display()
        );
        let c = HostConfig::parse("host.yaml", &text).unwrap();
        assert_eq!(c.account("a").unwrap(), serde_json::json!({"key": "k1"}));
        std::fs::write(&path, "plain-token\n").unwrap();
        assert_eq!(c.account("a").unwrap(), serde_json::json!("plain-token"));
        assert!(matches!(c.account("b"), Err(AccountError::Env { .. })));
        assert!(matches!(c.account("zzz"), Err(AccountError::Unknown(_))));
    }

    #[test]
    fn a_postgresql_state_stays_a_url_with_its_key_password_and_lease_time() {
        let text = "state: postgres://gp@db.example:5432/gitplane\n\
                    state_key: {credential: gitplane-state-key}\n\
                    secret_stores:\n  files: {dir: /run/secrets}\n\
                    state_password: {store: files, ref: pg}\n\
                    leases: {ttl: 30s}\n";
        let c = HostConfig::parse("host.yaml", text).unwrap();
        assert_eq!(
            c.state.as_deref(),
            Some(Path::new("postgres://gp@db.example:5432/gitplane"))
        );
        assert_eq!(
            c.state_password,
            Some(SecretSource::Store {
                store: "files".into(),
                reference: "pg".into()
            })
        );
        assert_eq!(c.lease_ttl, Duration::from_secs(30));
        let sqlite = HostConfig::parse("host.yaml", "state: relative/state.db\n").unwrap();
        assert_eq!(
            sqlite.state.as_deref(),
            Some(Path::new("relative/state.db"))
        );
        assert_eq!(sqlite.lease_ttl, DEFAULT_LEASE_TTL);
        assert_eq!(sqlite.state_password, None);
    }

    #[test]
    fn lease_times_outside_their_range_are_refused_at_their_line() {
        for (ttl, ok) in [("3s", true), ("10m", true), ("2s", false), ("11m", false)] {
            let text = format!("concurrency: 4\nleases:\n  ttl: {ttl}\n");
            match HostConfig::parse("host.yaml", &text) {
                Ok(c) => {
                    assert!(ok, "{ttl} accepted");
                    assert_eq!(Some(c.lease_ttl), parse_duration(ttl).ok());
                }
                Err(e) => {
                    assert!(!ok, "{ttl} refused: {e:?}");
                    assert_eq!(e[0].location.line, Some(3));
                    assert!(e[0].message.contains("out of range"), "{}", e[0]);
                }
            }
        }
        let e = HostConfig::parse("host.yaml", "leases: {ttl: soon}\n").unwrap_err();
        assert!(
            e[0].message
                .starts_with("leases.ttl: 'soon' is not a duration"),
            "{}",
            e[0]
        );
    }

    #[test]
    fn state_urls_are_checked_without_quoting_them() {
        assert_eq!(state_kind("state.db"), Ok(StateKind::Sqlite));
        assert_eq!(
            state_kind("/var/lib/postgres/state.db"),
            Ok(StateKind::Sqlite)
        );
        assert_eq!(state_kind("postgresql://db/x"), Ok(StateKind::Postgres));
        for bad in [
            "postgres://gp:s3cret@db:port/x",
            "postgres:s3cret@db/x",
            "Postgres://gp:s3cret@db/x",
            "postgres://gp:s3cret@db/x?nonsense=1",
        ] {
            let message = state_kind(bad).unwrap_err();
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn a_password_in_a_url_is_taken_out_of_it() {
        let split = |url: &str| split_url_password(url).unwrap();
        assert_eq!(
            split("postgres://gp:s%40cr%3At@db:5432/x"),
            (
                "postgres://gp@db:5432/x".to_owned(),
                Some("s@cr:t".to_owned())
            )
        );
        assert_eq!(
            split("postgresql://db/x?sslmode=disable&password=p%20w&user=gp"),
            (
                "postgresql://db/x?sslmode=disable&user=gp".to_owned(),
                Some("p w".to_owned())
            )
        );
        assert_eq!(
            split("postgres://db/x?password=pw"),
            ("postgres://db/x".to_owned(), Some("pw".to_owned()))
        );
        assert_eq!(
            split("postgres://gp@db/x"),
            ("postgres://gp@db/x".to_owned(), None)
        );
        assert_eq!(split("postgres://gp:100%@db/x").1.as_deref(), Some("100%"));
        assert!(split_url_password("postgres://gp:%ff@db/x").is_err());
    }

    #[test]
    fn the_state_password_is_read_from_its_store_and_handed_to_the_state() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pg"), "s3cret\n").unwrap();
        let text = format!(
            "state: postgres://gp@db/x\nstate_key: {{file: /k}}\n\
             secret_stores:\n  files: {{dir: {}}}\n\
             state_password: {{store: files, ref: pg}}\n",
            dir.path().display()
        );
        let c = HostConfig::parse("host.yaml", &text).unwrap();
        apply_state_password(&c).unwrap();
        std::fs::remove_file(dir.path().join("pg")).unwrap();
        let e = apply_state_password(&c).unwrap_err();
        assert!(e.to_string().starts_with("state_password: "), "{e}");
        gitplane_state::set_postgres_password(None);
    }
}
