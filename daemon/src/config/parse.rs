//! Reading a host config file into a [`HostConfig`]: one function per section, each checking
//! its values and saying what is wrong at the line it is on. Every error of the file is
//! collected, and they are reported in the order of their lines.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::{
    AccountFile, AccountSource, ConfigError, DEFAULT_CONCURRENCY, DEFAULT_LEASE_TTL,
    DEFAULT_PARALLEL_ENVIRONMENTS, DEFAULT_STOP_TIMEOUT, DeploymentRetry, DriverConfig, DriverFile,
    HistoryFile, HostConfig, HostConfigFile, KeepFile, LeasesFile, MAX_LEASE_TTL, MIN_LEASE_TTL,
    PreviewConfig, PreviewTrust, PreviewsFile, RepoFile, RepoSource, RetryFile, RetryPolicy,
    SecretSource, SecretStoreFile, StateKeyFile, StateKind, StatePasswordFile, TerraformFile,
    nonzero, parse_duration, parse_retention, service, state_kind,
};
use crate::drivers::TerraformConfig;
use crate::model::yaml::{self, Doc, Limits};
use crate::model::{SourceLocation, line_of};
use crate::stores::StoreConfig;

/// The errors of one file, each at the line of the text it names.
struct Errors<'t> {
    file: &'t str,
    text: &'t str,
    found: Vec<ConfigError>,
}

impl Errors<'_> {
    /// An error at the first line holding `needle`.
    fn at(&mut self, needle: &str, message: String) {
        self.found.push(ConfigError {
            location: SourceLocation {
                file: self.file.to_owned(),
                line: line_of(self.text, needle),
                column: None,
            },
            message,
        });
    }

    /// A time limit or an interval: zero is an error, since it would fail every call at once,
    /// or spin.
    fn duration(&mut self, needle: &str, value: Option<&String>, default: Duration) -> Duration {
        match value {
            None => default,
            Some(v) => match parse_duration(v).and_then(|d| nonzero(v, d, needle)) {
                Ok(d) => d,
                Err(message) => {
                    self.at(needle, message);
                    default
                }
            },
        }
    }

    /// A wait between retries: zero is allowed (retrying at once is a choice, not a mistake).
    fn delay(&mut self, needle: &str, value: Option<&String>, default: Duration) -> Duration {
        match value {
            None => default,
            Some(v) => parse_duration(v).unwrap_or_else(|message| {
                self.at(needle, message);
                default
            }),
        }
    }
}

/// Reads the host config `text` of `file`.
pub(super) fn host_config(file: &str, text: &str) -> Result<HostConfig, Vec<ConfigError>> {
    let raw = read(file, text)?;
    let mut errors = Errors {
        file,
        text,
        found: Vec::new(),
    };
    let e = &mut errors;
    let repo = repo(e, raw.repo);
    let (retry, deployment_retry) = retries(e, raw.retry);
    let watch_interval = raw
        .watch_interval
        .as_ref()
        .map(|w| e.duration("watch_interval", Some(w), Duration::from_secs(30)));
    let stop_timeout = e.duration(
        "stop_timeout",
        raw.stop_timeout.as_ref(),
        DEFAULT_STOP_TIMEOUT,
    );
    let drivers = drivers(e, raw.drivers);
    let terraform = terraform(e, raw.terraform);
    let accounts = accounts(e, raw.accounts);
    let (secret_stores, primary_secret_store) = secret_stores(e, raw.secret_stores);
    let concurrency = raw.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if concurrency == 0 {
        e.at("concurrency", "concurrency must be at least 1".into());
    }
    let parallel_environments = raw
        .parallel_environments
        .unwrap_or(DEFAULT_PARALLEL_ENVIRONMENTS);
    if parallel_environments == 0 {
        e.at(
            "parallel_environments",
            "parallel_environments must be at least 1".into(),
        );
    }
    let history = raw.history.and_then(|h| history(e, h));
    let (state_key, state_password) = state(
        e,
        (&raw.state, raw.state_key, raw.state_password),
        &secret_stores,
    );
    let lease_ttl = lease_ttl(e, raw.leases);
    let previews = raw.previews.and_then(|p| previews(e, p));
    let mut problems = Vec::new();
    let http = raw.http.and_then(|h| service::http(h, &mut problems));
    let notify = service::notify(raw.notify, &mut problems);
    for source in http.iter().flat_map(|h| [&h.token, &h.webhook_secret]) {
        if let Some(SecretSource::Store { store, .. }) = source
            && !secret_stores.contains_key(store)
        {
            problems.push((
                format!("store: {store}"),
                format!("http: secret store '{store}' is not configured in secret_stores"),
            ));
        }
    }
    for (needle, message) in problems {
        e.at(&needle, message);
    }
    if !errors.found.is_empty() {
        // In the order of the file; errors without a line last.
        errors
            .found
            .sort_by_key(|e| e.location.line.unwrap_or(usize::MAX));
        return Err(errors.found);
    }
    Ok(HostConfig {
        path: None,
        repo,
        git_ref: raw.git_ref,
        state: raw.state,
        state_password,
        lease_ttl,
        concurrency,
        parallel_environments,
        retry,
        deployment_retry,
        watch_interval,
        stop_timeout,
        drivers,
        accounts,
        secret_stores,
        primary_secret_store,
        history,
        state_key,
        terraform,
        http,
        notify,
        previews,
    })
}

/// The file's YAML as its sections, within the size limits; an error that stops the reading
/// (bad YAML, an unknown key) is the only one reported.
fn read(file: &str, text: &str) -> Result<HostConfigFile, Vec<ConfigError>> {
    let limits = Limits::default();
    let doc = Doc {
        kind: "the host config",
        setting: None,
    };
    let too_large = limits.check_file(text.as_bytes(), None);
    too_large
        .and_then(|()| yaml::from_str(text, &limits, doc))
        .map_err(|e| {
            vec![ConfigError {
                location: SourceLocation {
                    file: file.to_owned(),
                    line: e.line,
                    column: e.line.and(e.column),
                },
                message: e.message,
            }]
        })
}

/// `repo:` a path, or `{url, interval}`.
fn repo(e: &mut Errors<'_>, raw: Option<RepoFile>) -> Option<RepoSource> {
    match raw? {
        RepoFile::Path(p) => Some(RepoSource::Local(p)),
        RepoFile::Remote(r) => Some(RepoSource::Remote {
            interval: e.duration("interval", r.interval.as_ref(), Duration::from_secs(60)),
            url: r.url,
        }),
    }
}

/// `retry:`: the driver calls' policy and the daemon's deployments' (`retry.deployments`).
fn retries(e: &mut Errors<'_>, raw: Option<RetryFile>) -> (RetryPolicy, DeploymentRetry) {
    let Some(r) = raw else {
        return (RetryPolicy::default(), DeploymentRetry::default());
    };
    let deployments = match &r.deployments {
        None => DeploymentRetry::default(),
        Some(d) => {
            let defaults = DeploymentRetry::default();
            DeploymentRetry {
                // Located by the section: `interval` alone is also the remote's.
                interval: e.duration("deployments:", d.interval.as_ref(), defaults.interval),
                max_interval: e.duration(
                    "max_interval",
                    d.max_interval.as_ref(),
                    defaults.max_interval,
                ),
                max_attempts: d.max_attempts.unwrap_or(defaults.max_attempts),
            }
        }
    };
    let defaults = RetryPolicy::default();
    let calls = RetryPolicy {
        attempts: r.attempts.unwrap_or(defaults.attempts),
        initial_delay: e.delay(
            "initial_delay",
            r.initial_delay.as_ref(),
            defaults.initial_delay,
        ),
        max_delay: e.delay("max_delay", r.max_delay.as_ref(), defaults.max_delay),
        poll_interval: e.duration(
            "poll_interval",
            r.poll_interval.as_ref(),
            defaults.poll_interval,
        ),
        poll_timeout: e.duration(
            "poll_timeout",
            r.poll_timeout.as_ref(),
            defaults.poll_timeout,
        ),
    };
    if calls.attempts == 0 {
        e.at("attempts", "retry.attempts must be at least 1".into());
    }
    (calls, deployments)
}

/// `drivers:`: each an `http` or an `exec` driver, never one of the built-in names.
fn drivers(
    e: &mut Errors<'_>,
    raw: BTreeMap<String, DriverFile>,
) -> BTreeMap<String, DriverConfig> {
    let mut drivers = BTreeMap::new();
    for (name, d) in raw {
        let needle = format!("{name}:");
        let config = match (d.http, d.exec) {
            (Some(h), None) => DriverConfig::Http {
                timeout: e.duration(&name, h.timeout.as_ref(), Duration::from_secs(30)),
                url: h.url,
                concurrency: h.concurrency,
            },
            (None, Some(x)) => DriverConfig::Exec {
                timeout: e.duration(&name, x.timeout.as_ref(), Duration::from_secs(120)),
                command: x.command,
                concurrency: x.concurrency,
                env: x.env.unwrap_or_default(),
            },
            _ => {
                e.at(
                    &needle,
                    format!("driver '{name}' needs exactly one of http or exec"),
                );
                continue;
            }
        };
        if let Some(message) = driver_problem(&name, &config) {
            e.at(&needle, message);
        }
        // Humanitec's Kubernetes and Terraform drivers may be replaced by a host's own (an
        // HTTP driver that really applies Ingresses, say); these may not.
        if matches!(
            name.as_str(),
            "echo" | "humanitec/echo" | "template" | "humanitec/template"
        ) || name == crate::drivers::PROVIDED_DRIVER
        {
            e.at(
                &needle,
                format!("driver '{name}' is built in and cannot be replaced"),
            );
        }
        drivers.insert(name, config);
    }
    drivers
}

/// What is wrong with driver `name`'s settings, if anything.
fn driver_problem(name: &str, config: &DriverConfig) -> Option<String> {
    match config {
        DriverConfig::Http { url, .. }
            if !(url.starts_with("http://") || url.starts_with("https://")) =>
        {
            Some(format!(
                "driver '{name}': url '{url}' must start with http:// or https://"
            ))
        }
        DriverConfig::Exec { env, .. }
            if env.iter().any(|v| v.is_empty() || v.contains(['=', '\0'])) =>
        {
            Some(format!(
                "driver '{name}': env lists names of environment variables to pass (such as \
                 AWS_REGION), not assignments"
            ))
        }
        DriverConfig::Exec { command, .. } if command.is_empty() => {
            Some(format!("driver '{name}': command is empty"))
        }
        DriverConfig::Exec { command, .. } if !Path::new(&command[0]).is_absolute() => {
            Some(format!(
                "driver '{name}': the program '{}' must be an absolute path (no shell, no PATH lookup)",
                command[0]
            ))
        }
        DriverConfig::Http {
            concurrency: Some(0),
            ..
        }
        | DriverConfig::Exec {
            concurrency: Some(0),
            ..
        } => Some(format!("driver '{name}': concurrency must be at least 1")),
        _ => None,
    }
}

/// `terraform:`: the program, its home, its time limit, concurrency and environment.
fn terraform(e: &mut Errors<'_>, raw: Option<TerraformFile>) -> TerraformConfig {
    let mut terraform = TerraformConfig::default();
    let Some(t) = raw else {
        return terraform;
    };
    terraform.timeout = e.duration("terraform:", t.timeout.as_ref(), terraform.timeout);
    for (key, path) in [("program", &t.program), ("home", &t.home)] {
        if let Some(path) = path
            && !path.is_absolute()
        {
            e.at(
                &format!("{key}:"),
                format!(
                    "terraform.{key} '{}' must be an absolute path",
                    path.display()
                ),
            );
        }
    }
    if t.concurrency == Some(0) {
        e.at(
            "terraform:",
            "terraform.concurrency must be at least 1".to_owned(),
        );
    }
    let env = t.env.unwrap_or_default();
    if env.iter().any(|v| v.is_empty() || v.contains(['=', '\0'])) {
        e.at(
            "terraform:",
            "terraform.env lists names of environment variables to pass (such as \
             TF_PLUGIN_CACHE_DIR), not assignments"
                .to_owned(),
        );
    }
    terraform.program = t.program;
    terraform.home = t.home;
    terraform.env = env;
    if let Some(n) = t.concurrency {
        terraform.concurrency = Some(n);
    }
    terraform
}

/// `accounts:`: each read from a file or from gitplane's environment.
fn accounts(
    e: &mut Errors<'_>,
    raw: BTreeMap<String, AccountFile>,
) -> BTreeMap<String, AccountSource> {
    let mut accounts = BTreeMap::new();
    for (name, a) in raw {
        match (a.file, a.env) {
            (Some(f), None) => {
                accounts.insert(name, AccountSource::File(f));
            }
            (None, Some(v)) => {
                accounts.insert(name, AccountSource::Env(v));
            }
            _ => e.at(
                &format!("{name}:"),
                format!("account '{name}' needs exactly one of file or env"),
            ),
        }
    }
    accounts
}

/// `secret_stores:`: each a `dir` or a `vault`, and the one marked primary.
fn secret_stores(
    e: &mut Errors<'_>,
    raw: BTreeMap<String, SecretStoreFile>,
) -> (BTreeMap<String, StoreConfig>, Option<String>) {
    let mut stores = BTreeMap::new();
    let mut primary: Option<String> = None;
    for (name, store) in raw {
        let needle = format!("{name}:");
        if store.primary {
            match &primary {
                Some(first) => e.at(
                    &needle,
                    format!(
                        "secret stores '{first}' and '{name}' are both marked primary: keep \
                         `primary: true` on one (it serves refs that name no store)"
                    ),
                ),
                None => primary = Some(name.clone()),
            }
        }
        let config = match (store.dir, store.vault) {
            (Some(path), None) if path.is_absolute() => StoreConfig::Dir { path },
            (Some(path), None) => {
                e.at(
                    &needle,
                    format!(
                        "secret store '{name}': dir '{}' must be an absolute path",
                        path.display()
                    ),
                );
                continue;
            }
            (None, Some(v)) => {
                if !(v.url.starts_with("http://") || v.url.starts_with("https://")) {
                    e.at(
                        &needle,
                        format!(
                            "secret store '{name}': url '{}' must start with http:// or https://",
                            v.url
                        ),
                    );
                }
                if !v.token_file.is_absolute() {
                    e.at(
                        &needle,
                        format!(
                            "secret store '{name}': token_file '{}' must be an absolute path",
                            v.token_file.display()
                        ),
                    );
                }
                let timeout = match v
                    .timeout
                    .as_deref()
                    .map(|t| parse_duration(t).and_then(|d| nonzero(t, d, "timeout")))
                {
                    None => Duration::from_secs(10),
                    Some(Ok(t)) => t,
                    Some(Err(message)) => {
                        e.at(&needle, format!("secret store '{name}': timeout {message}"));
                        Duration::from_secs(10)
                    }
                };
                StoreConfig::Vault {
                    timeout,
                    url: v.url,
                    token_file: v.token_file,
                    mount: v.mount.unwrap_or_else(|| "secret".to_owned()),
                }
            }
            _ => {
                e.at(
                    &needle,
                    format!("secret store '{name}' needs exactly one of dir or vault"),
                );
                continue;
            }
        };
        stores.insert(name, config);
    }
    (stores, primary)
}

/// `history: {keep: N | AGE}`.
fn history(e: &mut Errors<'_>, h: HistoryFile) -> Option<gitplane_state::Retention> {
    let text = match h.keep {
        KeepFile::Deployments(n) => n.to_string(),
        KeepFile::Age(text) => text,
    };
    parse_retention(&text)
        .map_err(|message| e.at("keep", format!("history.keep: {message}")))
        .ok()
}

/// `state:`, `state_key:` and `state_password:` together: a PostgreSQL state needs a key
/// written out, and only a PostgreSQL state takes a password (from a configured store).
fn state(
    e: &mut Errors<'_>,
    (state, state_key, state_password): (
        &Option<std::path::PathBuf>,
        Option<StateKeyFile>,
        Option<StatePasswordFile>,
    ),
    secret_stores: &BTreeMap<String, StoreConfig>,
) -> (Option<gitplane_state::KeySource>, Option<SecretSource>) {
    let state_key_written = state_key.is_some();
    let key = match state_key {
        None => None,
        Some(StateKeyFile {
            file: Some(path),
            credential: None,
        }) => Some(gitplane_state::KeySource::File(path)),
        Some(StateKeyFile {
            file: None,
            credential: Some(name),
        }) if !name.is_empty() && !name.contains('/') => {
            Some(gitplane_state::KeySource::Credential(name))
        }
        Some(_) => {
            e.at(
                "state_key:",
                "state_key needs exactly one of file (a key file, created if missing) or \
                 credential (the name of a systemd LoadCredential)"
                    .to_owned(),
            );
            None
        }
    };
    let postgres = match state.as_deref().and_then(Path::to_str) {
        Some(state) => match state_kind(state) {
            Ok(kind) => kind == StateKind::Postgres,
            Err(message) => {
                e.at("state:", message);
                true
            }
        },
        None => false,
    };
    if postgres && !state_key_written {
        e.at(
            "state:",
            "a PostgreSQL state needs state_key (state_key: {file: PATH} or {credential: \
             NAME}): every host that shares the database must seal secrets with the same \
             key, which cannot be the default <state>.key beside a file"
                .to_owned(),
        );
    }
    let password = match state_password {
        None => None,
        Some(_) if !postgres => {
            e.at(
                "state_password:",
                format!(
                    "state_password is only for a PostgreSQL state, and state is {}: set \
                     state: postgres://USER@HOST:PORT/DATABASE, or remove state_password",
                    match state {
                        Some(path) => format!("the SQLite file {}", path.display()),
                        None => "not set (the SQLite file ./gitplane.db)".to_owned(),
                    }
                ),
            );
            None
        }
        Some(p) if !secret_stores.contains_key(&p.store) => {
            e.at(
                "state_password:",
                format!(
                    "state_password: secret store '{}' is not configured in secret_stores",
                    p.store
                ),
            );
            None
        }
        Some(p) => Some(SecretSource::Store {
            store: p.store,
            reference: p.reference,
        }),
    };
    (key, password)
}

/// `leases: {ttl}`, within its bounds.
fn lease_ttl(e: &mut Errors<'_>, raw: Option<LeasesFile>) -> Duration {
    let Some(ttl_text) = raw.and_then(|l| l.ttl) else {
        return DEFAULT_LEASE_TTL;
    };
    match parse_duration(&ttl_text) {
        Ok(ttl) if (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) => ttl,
        Ok(_) => {
            e.at(
                "ttl:",
                format!(
                    "leases.ttl '{ttl_text}' is out of range: it must be between 3s (a \
                     heartbeat every 600 ms) and 10m (how long an environment may wait for \
                     another daemon when its own died)"
                ),
            );
            DEFAULT_LEASE_TTL
        }
        Err(message) => {
            e.at("ttl:", format!("leases.ttl: {message}"));
            DEFAULT_LEASE_TTL
        }
    }
}

/// `previews: {branches, type, ttl, trust}`; `None` when any of it is wrong.
fn previews(e: &mut Errors<'_>, p: PreviewsFile) -> Option<PreviewConfig> {
    let mut ok = true;
    let branches = if p.branches.trim().is_empty() || p.branches.contains(char::is_whitespace) {
        Err(format!(
            "previews.branches '{}' is not a branch pattern: write e.g. \"pr-*\"",
            p.branches
        ))
    } else {
        super::BranchPattern::new(&p.branches).map_err(|why| format!("previews.branches {why}"))
    };
    let branches = match branches {
        Ok(pattern) => Some(pattern),
        Err(message) => {
            e.at("branches:", message);
            ok = false;
            None
        }
    };
    if !super::valid_env_type(&p.env_type) {
        e.at(
            "previews",
            format!(
                "previews.type '{}' is not an environment type: use lowercase letters, digits \
                 and '-', e.g. development",
                p.env_type
            ),
        );
        ok = false;
    }
    let ttl = match p.ttl.as_deref().map(parse_duration) {
        None => None,
        Some(Ok(ttl)) if ttl >= Duration::from_secs(1) => Some(ttl),
        Some(Ok(_)) => {
            e.at("previews", "previews.ttl must be at least 1s".to_owned());
            ok = false;
            None
        }
        Some(Err(message)) => {
            e.at("previews", format!("previews.ttl: {message}"));
            ok = false;
            None
        }
    };
    let trust = match p.trust.as_deref() {
        None | Some("workloads") => PreviewTrust::Workloads,
        Some("branch") => PreviewTrust::Branch,
        Some(other) => {
            e.at(
                "trust:",
                format!(
                    "previews.trust '{other}' is not 'workloads' (a preview runs the branch's \
                     workloads with the watched ref's platform) or 'branch' (it runs the whole \
                     branch: whoever can push one can run code on the host)"
                ),
            );
            ok = false;
            PreviewTrust::Workloads
        }
    };
    ok.then_some(PreviewConfig {
        branches: branches?,
        env_type: p.env_type,
        ttl,
        trust,
    })
}
