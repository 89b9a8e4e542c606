//! The `gitplane` command line: arguments, the commands, and what each prints.

mod actor;
mod ask;
mod explain;
mod hook;
mod init;
mod manifests;
mod output;
mod progress;
mod report;
mod surgery;
mod workflow;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use gitplane_state::{ApplyLock, CopyError, DeploymentStatus, KeySource, StateError, Store};

use crate::app::{
    self, AppError, Commit, Context, EnvOutcome, Need, existing_store, find_resource,
    load_and_build, recorded_envs, target_envs, targets,
};
use crate::config::{ConfigError, HostConfig, RepoSource, SecretSourceError, StateKind};
use crate::deploy::{Built, Reach, Rejected, Target};
use crate::drivers::Registry;
use crate::graph;
use crate::plan;
use crate::reconcile::{self, ApplyOptions, Settings};
use crate::repo::{RepoError, Snapshot};
use crate::stores::SecretStores;

use actor::Actor;

/// `gitplane --version`: the version, and the commit the binary was built from with its date
/// (set by the build script; `unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GITPLANE_COMMIT"),
    ", ",
    env!("GITPLANE_COMMIT_DATE"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "gitplane",
    version = VERSION,
    about = "A git-native platform orchestrator: commits of Score workloads and Resource \
             Definitions in, provisioned resources and recorded state out."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct Common {
    /// The host configuration; default: /etc/gitplane/gitplane.yaml when it exists.
    #[arg(long, env = "GITPLANE_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// The config repository (bare or not), or a folder inside it [default: the host config's
    /// repo, else the current directory].
    #[arg(long, env = "GITPLANE_REPO", global = true)]
    pub repo: Option<PathBuf>,
    /// The state: a SQLite file or a postgres:// URL [default: the host config's state, else
    /// ./gitplane.db].
    #[arg(long, env = "GITPLANE_STATE", global = true)]
    pub state: Option<PathBuf>,
    /// Only this environment (repeat for several); default: every environment.
    #[arg(long = "env", value_name = "ENV", global = true)]
    pub envs: Vec<String>,
}

impl Common {
    /// What a command runs with: the host config, with `--repo` and `--state` applied over it.
    fn context(&self) -> Result<Context, CliError> {
        let host = HostConfig::load(self.config.as_deref()).map_err(CliError::Config)?;
        let (state, state_password_error) = state_setting(
            self.state
                .clone()
                .or_else(|| host.state.clone())
                .unwrap_or_else(|| PathBuf::from("gitplane.db")),
            &host,
        )?;
        // A remote is read from the mirror the daemon keeps; commands that read only the
        // state never open it.
        let (repo, mirror_of) = match (&self.repo, &host.repo) {
            (Some(repo), _) => (repo.clone(), None),
            (None, Some(RepoSource::Local(path))) => (path.clone(), None),
            (None, Some(RepoSource::Remote { url, .. })) => (
                crate::config::mirror_for_commands(&state),
                Some(crate::watch::redact_url_credentials(url, url)),
            ),
            (None, None) => (PathBuf::from("."), None),
        };
        Ok(Context {
            repo,
            mirror_of,
            state,
            envs: self.envs.clone(),
            default_rev: host.git_ref.clone(),
            drivers: host.registry(),
            stores: host.secret_stores(),
            host,
            state_password_error,
        })
    }
}

/// The state a command works on, ready to open, and why `state_password` could not be read
/// (for the caller to tell when it opens the state). A PostgreSQL URL must parse; a password
/// written in it moves out of it (to the state crate, which connects with it, ahead of
/// `state_password`), so no message or log line that names the state can show it. A SQLite
/// path is kept as written.
pub(crate) fn state_setting(
    state: PathBuf,
    host: &HostConfig,
) -> Result<(PathBuf, Option<SecretSourceError>), CliError> {
    let Some(text) = state.to_str() else {
        return Ok((state, None));
    };
    match crate::config::state_kind(text).map_err(CliError::StateSetting)? {
        StateKind::Sqlite => Ok((state, None)),
        StateKind::Postgres => {
            let (url, password) =
                crate::config::split_url_password(text).map_err(CliError::StateSetting)?;
            let unread = match password {
                Some(password) => {
                    gitplane_state::set_postgres_password(Some(password));
                    None
                }
                None => crate::config::apply_state_password(host).err(),
            };
            Ok((PathBuf::from(url), unread))
        }
    }
}

/// Who runs a command that changes the state, for the action log `history` shows.
#[derive(Debug, Clone, Args)]
pub struct By {
    /// Who runs it, recorded with what it did [default: the login name of the user running
    /// gitplane, else uid:N].
    #[arg(long, value_name = "WHO")]
    pub by: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct Rev {
    /// A branch, tag or commit id (full or short); default: the host config's ref, else the
    /// repository's HEAD.
    #[arg(long, visible_alias = "ref", value_name = "REF")]
    pub rev: Option<String>,
}

/// Which resources `status` shows (each repeatable; all of them when none is given).
#[derive(Debug, Clone, Default, Args)]
pub struct StatusFilter {
    /// Only the resources of this app (`-` for the environment's global ones).
    #[arg(long = "app", value_name = "APP")]
    pub apps: Vec<String>,
    /// Only resources of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub types: Vec<String>,
    /// Only resources with this status.
    #[arg(long = "status", value_enum, value_name = "STATUS")]
    pub statuses: Vec<StatusArg>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    Ready,
    Failed,
}

impl StatusFilter {
    /// The resources it lets through, ordered by app, then type, class and id.
    fn apply(
        &self,
        resources: Vec<gitplane_state::ResourceRecord>,
    ) -> Vec<gitplane_state::ResourceRecord> {
        let mut kept: Vec<_> = resources
            .into_iter()
            .filter(|r| {
                let app = r.app.as_deref().unwrap_or("-");
                let status = match r.status {
                    gitplane_state::ResourceStatus::Ready => StatusArg::Ready,
                    gitplane_state::ResourceStatus::Failed => StatusArg::Failed,
                };
                (self.apps.is_empty() || self.apps.iter().any(|a| a == app))
                    && (self.types.is_empty() || self.types.contains(&r.res_type))
                    && (self.statuses.is_empty() || self.statuses.contains(&status))
            })
            .collect();
        kept.sort_by(|a, b| {
            (&a.app, &a.res_type, &a.class, &a.res_id).cmp(&(
                &b.app,
                &b.res_type,
                &b.class,
                &b.res_id,
            ))
        });
        kept
    }
}

/// How `gitplane plan` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    /// Every step of each environment, with its reason.
    Table,
    /// What would change, by environment and app, as JSON (docs/plan.md).
    Json,
    /// What would change, by environment and app, for a terminal.
    Text,
    /// What would change, by environment and app: a pull-request comment.
    Markdown,
    /// Every step of each environment with its reason, as JSON (the table's content).
    StepsJson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    Table,
    Json,
    /// Graphviz: `gitplane graph --env E --format dot | dot -Tsvg > graph.svg`.
    Dot,
    /// A Mermaid flowchart.
    Mermaid,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make a new config repository from the built-in template, committed.
    Init { dir: PathBuf },
    /// Print a completion script for a shell: `gitplane completion bash >
    /// /etc/bash_completion.d/gitplane`, `gitplane completion zsh > "${fpath[1]}/_gitplane"`,
    /// `gitplane completion fish > ~/.config/fish/completions/gitplane.fish`.
    Completion { shell: clap_complete::Shell },
    /// Make a repository from the template in DIR, apply it, and show what happened.
    Quickstart {
        #[arg(default_value = "gitplane-quickstart")]
        dir: PathBuf,
    },
    /// Load and build every environment of a commit; exit non-zero on any error.
    Validate {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        /// Run as a git pre-receive hook: read `<old> <new> <ref>` lines on stdin and reject the
        /// push if the new commit of the watched ref does not load or build.
        #[arg(long, conflicts_with = "rev")]
        pre_receive: bool,
    },
    /// Show what apply would do, with reasons; changes nothing. `--ref BRANCH --format
    /// markdown` reviews a pull request's head.
    Plan {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        #[arg(long, short = 'o', value_enum, default_value_t = PlanFormat::Table)]
        format: PlanFormat,
        /// Exit 0 when nothing would change, 2 when something would, 1 on an error (a commit
        /// that does not load or build, a ref that names nothing).
        #[arg(long)]
        detailed_exitcode: bool,
    },
    /// Reconcile once: provision, update and delete resources, and record it all.
    Apply {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        #[command(flatten)]
        by: By,
    },
    /// Show the recorded resources of each environment.
    Status {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        filter: StatusFilter,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// List deployments per commit, newest first.
    History {
        #[command(flatten)]
        common: Common,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Release a deployment held by the deletion guard, and apply it: lists what it deletes
    /// and asks first (--yes does not ask; without a terminal to ask on, --yes is needed).
    Approve {
        #[command(flatten)]
        common: Common,
        /// The held deployment's id (see `gitplane history`).
        deployment: i64,
        /// Approve without asking (scripts): the deletions are still listed.
        #[arg(long, short = 'y')]
        yes: bool,
        #[command(flatten)]
        by: By,
    },
    /// Print a report from the state: resources, deployments, failures, links, consumers,
    /// orphans or drift.
    Report {
        #[command(flatten)]
        common: Common,
        #[arg(value_enum)]
        name: report::ReportName,
        /// For `consumers`: the resource (GUResID, or `app/type.class#id` with --env).
        resource: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = report::ReportFormat::Table)]
        format: report::ReportFormat,
    },
    /// Explain one resource: its definition and why it matched, where each input comes from,
    /// its outputs, its links both ways and its history.
    Explain {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        /// The resource: a GUResID, or `app/type.class#id` (with --env when several match).
        resource: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Bind a pinned resource (`auto_update: false`) to the current values of what it reads,
    /// and apply its environment.
    Resolve {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        /// The resource: a GUResID, or `app/type.class#id` (with --env when several match).
        resource: String,
        #[command(flatten)]
        by: By,
    },
    /// Deploy an earlier commit to one environment (--env) and pin it there: later commits
    /// are planned, not applied, until `gitplane unpin`.
    Rollback {
        #[command(flatten)]
        common: Common,
        /// The commit (or branch, or tag) to go back to.
        #[arg(long, value_name = "COMMIT")]
        to: String,
        /// Why, recorded with the pin and shown by `status` and `history`.
        #[arg(long, short = 'm')]
        reason: String,
        /// Pin a commit that is neither in the watched ref's history nor was ever deployed to
        /// the environment (an unmerged branch, say); recorded with the pin.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        by: By,
    },
    /// Freeze one environment (--env) at the commit it runs, with no deployment: later
    /// commits are planned, not applied, until `gitplane unpin`.
    Pin {
        #[command(flatten)]
        common: Common,
        /// Why, recorded with the pin and shown by `status` and `history`.
        #[arg(long, short = 'm')]
        reason: String,
        #[command(flatten)]
        by: By,
    },
    /// Release the pin of one environment (--env) and apply the newest commit of the watched
    /// ref to it.
    Unpin {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        by: By,
        /// Only release the pin; the next commit (or the daemon's next look) applies.
        #[arg(long)]
        no_apply: bool,
    },
    /// Ask the running daemon to look now: fetch the remote, read the watched ref, and deploy
    /// each environment (--env; default: every one the watched ref declares) that is not at
    /// its commit; a failed deployment waiting for its retry runs at once. A daemon on this
    /// host is told at once (SIGUSR1), one on another host at its next look.
    Reconcile {
        #[command(flatten)]
        common: Common,
        /// Wait until each environment's deployment ends (or the daemon says why it deploys
        /// nothing); exit 1 when one failed, is held, or did not end in time.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (humantime: 90s, 10m, 1h30m).
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Table)]
        format: Format,
        #[command(flatten)]
        by: By,
    },
    /// Watch the repository and reconcile every new commit until stopped.
    Daemon {
        #[command(flatten)]
        common: Common,
    },
    /// Run one drift run of each environment now, at its last good commit: as its file's
    /// `drift:` says (correct or detect), or detect-only with --detect. Exits 0 when nothing
    /// differs, 2 when drift was found, 1 on errors.
    Drift {
        #[command(flatten)]
        common: Common,
        /// Only detect and record what differs, whatever the environment's `drift:` says.
        #[arg(long)]
        detect: bool,
        #[command(flatten)]
        by: By,
    },
    /// Look after the state file.
    State {
        #[command(subcommand)]
        action: StateCommand,
    },
    /// Print the Kubernetes manifests an environment's deployment applies (what the last
    /// apply recorded), as a stream `kubectl apply -f -` takes. Secret values are hidden.
    Manifests {
        #[command(flatten)]
        common: Common,
        /// Only this app's deployment (repeat for several); default: every app.
        #[arg(long = "app", value_name = "APP")]
        apps: Vec<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = manifests::ManifestFormat::Yaml)]
        format: manifests::ManifestFormat,
        /// Show secret values (needs the state key) instead of `(secret)`.
        #[arg(long)]
        show_secrets: bool,
    },
    /// Show the resource graph of a commit.
    Graph {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        /// Only this app's resources and the global ones they reach (repeat for several); only
        /// its folder is read, whatever the size of the environment.
        #[arg(long = "app", value_name = "APP")]
        apps: Vec<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = GraphFormat::Table)]
        format: GraphFormat,
    },
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Prune the history that `history.keep` (or --keep) no longer keeps, and give the space
    /// back to the file system. Current resources, links and bindings are never removed.
    Vacuum {
        #[command(flatten)]
        common: Common,
        /// How much history to keep: a number of deployments per environment (1000) or an age
        /// (90d); default: the host config's history.keep, else all of it.
        #[arg(long)]
        keep: Option<String>,
        #[command(flatten)]
        by: By,
    },
    /// Seal every secret of the state file with a new key, and put the new key in place of
    /// the old one (a key file: the host config's state_key, else <state>.key). Deployments
    /// wait meanwhile; a running daemon picks the new key up before its next deployment.
    Rekey {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        by: By,
    },
    /// Forget one resource (RESOURCE: a GUResID, or `app/type.class#id` with --env when
    /// several match): no driver is called; the next apply creates it if the repository still
    /// has it. Refused while a deployment runs in its environment.
    Rm {
        #[command(flatten)]
        common: Common,
        resource: String,
        #[command(flatten)]
        by: By,
    },
    /// Adopt a resource that exists outside gitplane (one --env): record it with the outputs
    /// of FILE (`{"values": {...}, "secrets": {...}}`) and the driver cookie of --cookie FILE,
    /// so that the next apply updates it, never creates it.
    Import {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        rev: Rev,
        /// The resource as the commit's graph names it: `app/type.class#id` or its GUResID.
        resource: String,
        /// The resource's outputs: `{"values": {...}, "secrets": {...}}`.
        #[arg(long, value_name = "FILE")]
        outputs: PathBuf,
        /// The driver cookie to send with the first update (the file's text).
        #[arg(long, value_name = "FILE")]
        cookie: Option<PathBuf>,
        #[command(flatten)]
        by: By,
    },
    /// Move a recorded resource to a new app or res_id (FROM: a GUResID or `app/type.class#id`;
    /// TO: `app/type.class#id`), or every resource of app FROM to app TO (an app folder
    /// renamed): the driver's instance is kept, nothing is deleted or created.
    Mv {
        #[command(flatten)]
        common: Common,
        from: String,
        to: String,
        #[command(flatten)]
        by: By,
    },
    /// Release the apply lock of ENV when its holder is gone (its process ended on this host,
    /// or it has not renewed the lock for 30 s); a live holder's lock is refused.
    Unlock {
        #[command(flatten)]
        common: Common,
        #[arg(value_name = "ENV")]
        lock_env: String,
        #[command(flatten)]
        by: By,
    },
    /// Copy a SQLite state to FILE while gitplane runs (SQLite's online backup API), check the
    /// copy with PRAGMA integrity_check and open it as a state. PostgreSQL: use pg_dump.
    Backup {
        #[command(flatten)]
        common: Common,
        file: PathBuf,
        #[command(flatten)]
        by: By,
    },
    /// Copy a whole state, history included, into an empty one: from SQLite to PostgreSQL or
    /// back. Both are opened with the host config's state_key (else, for a SQLite source, its
    /// <file>.key), since sealed secrets are copied as they are. Stop the daemons first.
    Copy {
        /// The host configuration; default: /etc/gitplane/gitplane.yaml when it exists.
        #[arg(long, env = "GITPLANE_CONFIG")]
        config: Option<PathBuf>,
        /// The state to read: sqlite:PATH, a path, or a postgres:// URL.
        #[arg(long)]
        from: String,
        /// The empty state to fill: sqlite:PATH, a path, or a postgres:// URL.
        #[arg(long)]
        to: String,
        #[command(flatten)]
        by: By,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Init(#[from] init::InitError),
    #[error(transparent)]
    App(#[from] AppError),
    #[error("{0}: pass exactly one --env (`gitplane status` lists the environments)")]
    OneEnv(String),
    #[error("no app '{app}' is recorded in environment '{env}' (recorded: {known})")]
    UnknownApp {
        app: String,
        env: String,
        known: String,
    },
    #[error("deployment {deployment} is not held: `gitplane history` lists held deployments")]
    NotHeld { deployment: i64 },
    #[error("environment '{env}' is not pinned: `gitplane status` shows the pins")]
    NotPinned { env: String },
    #[error("rollback: --reason is empty: say why, it is recorded with the pin")]
    NoReason,
    #[error("pin: --reason is empty: say why, it is recorded with the pin")]
    NoPinReason,
    #[error(
        "environment '{env}' is pinned already (at {commit} by {by}): `gitplane unpin --env \
         {env}` first"
    )]
    AlreadyPinned {
        env: String,
        commit: String,
        by: String,
    },
    #[error("environment '{env}' has no successful deployment to pin: apply it first")]
    NothingToPin { env: String },
    #[error(
        "rollback: commit {commit} is not in the history of {watched} and was never deployed \
         to {env}: it may be unreviewed. Pass --force to pin {env} there anyway (recorded with \
         the pin); nothing was changed"
    )]
    OutsideHistory {
        commit: String,
        env: String,
        watched: String,
    },
    #[error(
        "approve: deployment {deployment} deletes {count} resource(s) of {env}, and there is no \
         terminal to ask on: pass --yes to approve it; nothing was changed"
    )]
    ApproveNeedsYes {
        deployment: i64,
        env: String,
        count: usize,
    },
    #[error("{0}")]
    StateSetting(String),
    #[error(transparent)]
    StatePassword(SecretSourceError),
    #[error(transparent)]
    Copy(#[from] CopyError),
    #[error("--from {path}: no such state file")]
    NoCopySource { path: PathBuf },
    #[error("--from and --to name the same state ({state})")]
    CopyOntoItself { state: String },
    #[error(
        "--from {from}: a PostgreSQL source is opened with the host config's state_key, and \
         there is none: name the key its secrets are sealed with (state_key: {{file: PATH}})"
    )]
    CopyNeedsKey { from: String },
    #[error("host config: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Config(Vec<ConfigError>),
    #[error(
        "the state key comes from a systemd credential or a file gitplane does not write: \
         rekey needs a key file (state_key: {{file: PATH}})"
    )]
    KeyNotAFile,
    #[error("{path}: cannot write the new state key: {source}")]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Daemon(crate::daemon::DaemonError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("--keep {keep}: {message}")]
    Keep { keep: String, message: String },
    #[error(transparent)]
    Surgery(#[from] surgery::SurgeryError),
    #[error(
        "no gitplane daemon runs on {state}: none on this host has a live process, and none on \
         another host reported itself in the last 2 minutes. Start it (`systemctl start \
         gitplane`), or use `gitplane apply`; nothing was asked"
    )]
    NoDaemon { state: String },
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// How a command ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandResult {
    Success,
    /// The command ran and reported a failure (invalid commit, failed resources).
    Failure,
    /// `gitplane drift` found resources that differ from what was recorded (exit code 2).
    Drifted,
    /// `gitplane plan --detailed-exitcode` found something to change (exit code 2).
    Changes,
}

pub fn run(cli: Cli) -> Result<CommandResult, CliError> {
    let stdout = &mut std::io::stdout().lock();
    match cli.command {
        Command::Init { dir } => {
            init::init(&dir)?;
            writeln!(
                stdout,
                "Created a config repository in {} (environments development and production, \
                 app shop).\nNext: gitplane apply --repo {} --state {}",
                dir.display(),
                dir.display(),
                dir.join("gitplane.db").display()
            )?;
            Ok(CommandResult::Success)
        }
        Command::Quickstart { dir } => quickstart(&dir, stdout),
        Command::Completion { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            // Into a buffer: clap_complete panics when its writer fails (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "gitplane", &mut script);
            stdout.write_all(&script)?;
            Ok(CommandResult::Success)
        }
        Command::Validate {
            common,
            rev,
            pre_receive,
        } => {
            let ctx = common.context()?;
            if pre_receive {
                hook::pre_receive(&ctx, &mut std::io::stdin().lock(), stdout)
            } else {
                validate(&ctx, ctx.rev(rev.rev.as_deref()), stdout)
            }
        }
        Command::Plan {
            common,
            rev,
            format,
            detailed_exitcode,
        } => {
            let ctx = common.context()?;
            let (result, changes) = show_plan(&ctx, ctx.rev(rev.rev.as_deref()), format, stdout)?;
            Ok(match result {
                CommandResult::Success if detailed_exitcode && changes => CommandResult::Changes,
                result => result,
            })
        }
        Command::Apply { common, rev, by } => {
            let ctx = common.context()?;
            apply(
                &ctx,
                ctx.rev(rev.rev.as_deref()),
                &Actor::of(by.by.as_deref()),
                stdout,
            )
        }
        Command::Status {
            common,
            filter,
            format,
        } => status(&common.context()?, &filter, format, stdout),
        Command::History { common, format } => history(&common.context()?, format, stdout),
        Command::Report {
            common,
            name,
            resource,
            format,
        } => report::report(
            &common.context()?,
            name,
            resource.as_deref(),
            format,
            stdout,
        ),
        Command::Explain {
            common,
            rev,
            resource,
            format,
        } => {
            let ctx = common.context()?;
            explain::explain(&ctx, ctx.rev(rev.rev.as_deref()), &resource, format, stdout)
        }
        Command::Resolve {
            common,
            rev,
            resource,
            by,
        } => {
            let ctx = common.context()?;
            let actor = Actor::of(by.by.as_deref());
            resolve(&ctx, ctx.rev(rev.rev.as_deref()), &resource, &actor, stdout)
        }
        Command::Approve {
            common,
            deployment,
            yes,
            by,
        } => approve(
            &common.context()?,
            deployment,
            yes,
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::Rollback {
            common,
            to,
            reason,
            force,
            by,
        } => workflow::rollback(
            &common.context()?,
            workflow::Rollback {
                to: &to,
                reason: &reason,
                force,
            },
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::Reconcile {
            common,
            wait,
            timeout,
            format,
            by,
        } => ask::reconcile(
            &common.context()?,
            &ask::Ask {
                wait,
                timeout,
                format,
            },
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::Pin { common, reason, by } => workflow::pin(
            &common.context()?,
            &reason,
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::Unpin {
            common,
            by,
            no_apply,
        } => workflow::unpin(
            &common.context()?,
            &Actor::of(by.by.as_deref()),
            no_apply,
            stdout,
        ),
        Command::Daemon { common } => {
            let host = HostConfig::load(common.config.as_deref()).map_err(CliError::Config)?;
            // The daemon, unlike the other commands, can mirror a remote.
            let source = match (&common.repo, &host.repo) {
                (Some(repo), _) => RepoSource::Local(repo.clone()),
                (None, Some(source)) => source.clone(),
                (None, None) => RepoSource::Local(PathBuf::from(".")),
            };
            let (state, unread) = state_setting(
                common
                    .state
                    .clone()
                    .or_else(|| host.state.clone())
                    .unwrap_or_else(|| PathBuf::from("gitplane.db")),
                &host,
            )?;
            if let Some(e) = unread {
                return Err(CliError::StatePassword(e));
            }
            crate::daemon::run(crate::daemon::DaemonOptions {
                source,
                state,
                envs: common.envs.clone(),
                config_path: common.config.clone(),
                host,
            })
            .map_err(CliError::Daemon)?;
            Ok(CommandResult::Success)
        }
        Command::Graph {
            common,
            rev,
            apps,
            format,
        } => {
            let ctx = common.context()?;
            show_graph(&ctx, ctx.rev(rev.rev.as_deref()), &apps, format, stdout)
        }
        Command::Manifests {
            common,
            apps,
            format,
            show_secrets,
        } => manifests::manifests(&common.context()?, &apps, format, show_secrets, stdout),
        Command::Drift { common, detect, by } => drift(
            &common.context()?,
            detect,
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::State {
            action: StateCommand::Vacuum { common, keep, by },
        } => vacuum(
            &common.context()?,
            keep.as_deref(),
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::State {
            action: StateCommand::Rekey { common, by },
        } => rekey(&common.context()?, &Actor::of(by.by.as_deref()), stdout),
        Command::State {
            action:
                StateCommand::Rm {
                    common,
                    resource,
                    by,
                },
        } => surgery::rm(
            &common.context()?,
            &resource,
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::State {
            action:
                StateCommand::Import {
                    common,
                    rev,
                    resource,
                    outputs,
                    cookie,
                    by,
                },
        } => {
            let ctx = common.context()?;
            surgery::import(
                &ctx,
                (&resource, ctx.rev(rev.rev.as_deref())),
                (&outputs, cookie.as_deref()),
                &Actor::of(by.by.as_deref()),
                stdout,
            )
        }
        Command::State {
            action:
                StateCommand::Mv {
                    common,
                    from,
                    to,
                    by,
                },
        } => surgery::mv(
            &common.context()?,
            (&from, &to),
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::State {
            action:
                StateCommand::Unlock {
                    common,
                    lock_env,
                    by,
                },
        } => surgery::unlock(
            &common.context()?,
            &lock_env,
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::State {
            action: StateCommand::Backup { common, file, by },
        } => surgery::backup(
            &common.context()?,
            &file,
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
        Command::State {
            action:
                StateCommand::Copy {
                    config,
                    from,
                    to,
                    by,
                },
        } => copy(
            config.as_deref(),
            (&from, &to),
            &Actor::of(by.by.as_deref()),
            stdout,
        ),
    }
}

/// `gitplane state rekey`: seals every secret with a new key, then puts that key in place.
///
/// The new key is written to `<key>.new` first and renamed over the old key only after the
/// secrets are sealed with it: stopped in between, the next open finds `<key>.new` matching
/// the secrets and finishes the rename.
fn rekey(ctx: &Context, actor: &Actor, stdout: &mut impl Write) -> Result<CommandResult, CliError> {
    let mut store = existing_store(ctx)?;
    let gitplane_state::KeySource::File(key_file) = store.key_source() else {
        return Err(CliError::KeyNotAFile);
    };
    // No deployment may seal with the old key while the secrets move to the new one.
    let _locks = store
        .environments()?
        .iter()
        .map(|env| ApplyLock::acquire(&ctx.state, env, true))
        .collect::<Result<Vec<_>, _>>()?;
    // The key in force first: should an earlier rekey have stopped before putting its key in
    // place, that key is still `<key>.new`, and this finishes it before the name is reused.
    store.key_id()?;
    let key = gitplane_state::StateKey::generate();
    let pending = gitplane_state::pending_key_path(&key_file);
    let _ = std::fs::remove_file(&pending);
    key.write_new(&pending)
        .map_err(|source| CliError::KeyFile {
            path: pending.clone(),
            source,
        })?;
    let resealed = store.rekey(&key)?;
    std::fs::rename(&pending, &key_file).map_err(|source| CliError::KeyFile {
        path: key_file.clone(),
        source,
    })?;
    actor.record(
        &store,
        "state rekey",
        None,
        None,
        &format!(
            "{resealed} secret value(s) sealed with the new key {}",
            key.id
        ),
    )?;
    writeln!(
        stdout,
        "{}: {resealed} secret value(s) sealed with the new key {} ({})",
        store.path().display(),
        key.id,
        key_file.display()
    )?;
    Ok(CommandResult::Success)
}

/// A state named by `state copy --from/--to`: `sqlite:PATH`, a path, or a PostgreSQL URL
/// (kept whole: the state crate connects with its password and never shows it).
fn copy_location(text: &str) -> Result<(PathBuf, StateKind), CliError> {
    if let Some(path) = text.strip_prefix("sqlite:") {
        return Ok((PathBuf::from(path), StateKind::Sqlite));
    }
    let kind = crate::config::state_kind(text).map_err(CliError::StateSetting)?;
    Ok((PathBuf::from(text), kind))
}

/// `gitplane state copy`: copies every deployment, resource and their history from one state
/// into an empty one, in one transaction on the destination.
fn copy(
    config: Option<&Path>,
    (from, to): (&str, &str),
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let host = HostConfig::load(config).map_err(CliError::Config)?;
    let (from_path, from_kind) = copy_location(from)?;
    let (to_path, to_kind) = copy_location(to)?;
    let same = match (from_kind, to_kind) {
        (StateKind::Sqlite, StateKind::Sqlite) => {
            from_path.canonicalize().ok().is_some()
                && from_path.canonicalize().ok() == to_path.canonicalize().ok()
        }
        (StateKind::Postgres, StateKind::Postgres) => {
            crate::config::split_url_password(from).map(|(u, _)| u)
                == crate::config::split_url_password(to).map(|(u, _)| u)
        }
        _ => false,
    };
    if same {
        return Err(CliError::CopyOntoItself {
            state: from_path.display().to_string(),
        });
    }
    if from_kind == StateKind::Postgres || to_kind == StateKind::Postgres {
        crate::config::apply_state_password(&host).map_err(CliError::StatePassword)?;
    }
    // Reading never creates a state: a source that is not there is a mistake.
    if from_kind == StateKind::Sqlite && !from_path.exists() {
        return Err(CliError::NoCopySource { path: from_path });
    }
    // Sealed secrets move as they are, so both sides open them with one key.
    let (key, source_key_file) = match (&host.state_key, from_kind) {
        (Some(key), _) => (key.clone(), None),
        (None, StateKind::Sqlite) => {
            let real = from_path
                .canonicalize()
                .unwrap_or_else(|_| from_path.clone());
            let key = KeySource::beside(&real);
            let file = match &key {
                KeySource::File(p) | KeySource::Provided(p) => Some(p.clone()),
                KeySource::Credential(_) => None,
            };
            (key, file)
        }
        (None, StateKind::Postgres) => {
            return Err(CliError::CopyNeedsKey {
                from: gitplane_state::PgTarget::parse(from, None)
                    .map(|t| t.shown().to_owned())
                    .unwrap_or_else(|_| "(a PostgreSQL URL)".to_owned()),
            });
        }
    };
    let source = Store::open_keyed(&from_path, Some(&key))?;
    let created = to_kind == StateKind::Sqlite && !to_path.exists();
    let copied = Store::open_keyed(&to_path, Some(&key))
        .map_err(CliError::from)
        .and_then(|mut destination| {
            let report = gitplane_state::copy_state(&source, &mut destination)?;
            Ok((report, destination))
        });
    let (report, destination) = match copied {
        Ok(done) => done,
        Err(e) => {
            // A file this copy created holds nothing worth keeping.
            if created {
                for suffix in ["", "-wal", "-shm"] {
                    let mut name = to_path.as_os_str().to_owned();
                    name.push(suffix);
                    let _ = std::fs::remove_file(&name);
                }
            }
            return Err(e);
        }
    };
    // The copy is recorded in the state it filled (the source is left as it was).
    actor.record(
        &destination,
        "state copy",
        None,
        None,
        &format!(
            "copied {} deployment(s) and {} resource(s) from {}",
            report.rows("deployment"),
            report.rows("resource"),
            source.path().display()
        ),
    )?;
    let shown_to = destination.path().to_owned();
    let others: Vec<String> = report
        .tables
        .iter()
        .filter(|(t, _)| t != "deployment" && t != "resource")
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    let other_rows: u64 = report
        .tables
        .iter()
        .filter(|(t, _)| t != "deployment" && t != "resource")
        .map(|(_, n)| n)
        .sum();
    writeln!(
        stdout,
        "copied {} deployments, {} resources and {other_rows} other rows ({}) from {} to {}",
        report.rows("deployment"),
        report.rows("resource"),
        others.join(", "),
        source.path().display(),
        shown_to.display()
    )?;
    if let Some(file) = source_key_file {
        writeln!(
            stdout,
            "The secrets stay sealed with the source's state key {}: the destination's host \
             config needs state_key: {{file: {}}}",
            file.display(),
            file.display()
        )?;
    }
    Ok(CommandResult::Success)
}

/// `gitplane state vacuum`: prunes by retention, then rebuilds the file.
fn vacuum(
    ctx: &Context,
    keep: Option<&str>,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let keep = match keep {
        None => ctx.host.history,
        Some(text) => Some(parse_keep(text)?),
    };
    let mut store = existing_store(ctx)?;
    let pruned = if let Some(keep) = keep {
        let p = store.prune(keep)?;
        let pruned = format!(
            "pruned {} deployment(s), {} operation(s), {} history row(s) and {} commit(s) seen",
            p.deployments, p.operations, p.history_rows, p.commits_seen
        );
        writeln!(stdout, "{pruned}")?;
        pruned
    } else {
        writeln!(
            stdout,
            "no history.keep in the host config and no --keep: all history is kept"
        )?;
        "pruned nothing".to_owned()
    };
    let (before, after) = store.vacuum()?;
    let mb = |b: u64| b as f64 / 1_048_576.0;
    let sizes = format!("{:.1} MB -> {:.1} MB", mb(before), mb(after));
    actor.record(
        &store,
        "state vacuum",
        None,
        None,
        &format!("{pruned}; {sizes}"),
    )?;
    writeln!(stdout, "{}: {sizes}", store.path().display())?;
    Ok(CommandResult::Success)
}

/// `--keep 1000` (deployments per environment) or `--keep 90d`.
fn parse_keep(text: &str) -> Result<gitplane_state::Retention, CliError> {
    crate::config::parse_retention(text).map_err(|message| CliError::Keep {
        keep: text.to_owned(),
        message,
    })
}

/// The commit and its graphs, or `None` once a rejected commit's errors are reported.
fn built_or_report(
    ctx: &Context,
    rev: Option<&str>,
    need: Need,
) -> Result<Option<(Snapshot, Built)>, CliError> {
    let (snapshot, result) = load_and_build(ctx, rev, need)?;
    match result {
        Ok(built) => Ok(Some((snapshot, built))),
        Err(rejected) => {
            report_rejected(&snapshot.commit, &rejected);
            Ok(None)
        }
    }
}

/// A list command's JSON: always an array, one object per environment, however many there are
/// (a script must not break the day a second environment appears).
fn print_json(stdout: &mut impl Write, items: Vec<serde_json::Value>) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(&serde_json::Value::Array(items))
        .expect("a serde_json::Value always serialises");
    writeln!(stdout, "{text}")?;
    Ok(())
}

pub(crate) fn validate(
    ctx: &Context,
    rev: Option<&str>,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let Some((snapshot, built)) = built_or_report(ctx, rev, Need::Graphs)? else {
        return Ok(CommandResult::Failure);
    };
    writeln!(
        stdout,
        "ok: commit {} is valid: {}",
        output::short(&snapshot.commit),
        output::built_summary(&built)
    )?;
    Ok(CommandResult::Success)
}

fn show_plan(
    ctx: &Context,
    rev: Option<&str>,
    format: PlanFormat,
    stdout: &mut impl Write,
) -> Result<(CommandResult, bool), CliError> {
    let format = match format {
        PlanFormat::Table => Format::Table,
        PlanFormat::StepsJson => Format::Json,
        PlanFormat::Text | PlanFormat::Markdown | PlanFormat::Json => {
            let review = app::plan_ref(ctx, rev)?;
            let text = match format {
                PlanFormat::Text => review.to_text(),
                PlanFormat::Markdown => review.to_markdown(),
                _ => {
                    serde_json::to_string_pretty(&review.to_json())
                        .expect("a serde_json::Value always serialises")
                        + "\n"
                }
            };
            stdout.write_all(text.as_bytes())?;
            if !review.rejected.is_empty() {
                for e in &review.rejected {
                    eprintln!("error: {e}");
                }
                return Ok((CommandResult::Failure, false));
            }
            return Ok((CommandResult::Success, review.changes_anything()));
        }
    };
    // Planning never creates a state file.
    let store = if ctx.state_exists() {
        Some(ctx.open_store()?)
    } else {
        None
    };
    let commit = Commit::resolve(ctx, rev, store.as_ref())?;
    let targets = match targets(ctx, &commit, store.as_ref(), Reach::Changes)? {
        Ok(targets) => targets,
        Err(rejected) => {
            report_rejected(commit.id(), &rejected);
            return Ok((CommandResult::Failure, false));
        }
    };
    let mut json = Vec::new();
    let mut changes = false;
    for t in &targets {
        let (recorded, links) = match &store {
            Some(s) => crate::deploy::recorded_in_scope(s, t)?,
            None => (Vec::new(), Vec::new()),
        };
        let p = plan::plan(&t.graph, &recorded, &links);
        changes |= p
            .steps
            .iter()
            .any(|s| !matches!(s.action, plan::Action::Unchanged | plan::Action::Pinned));
        // The verdict apply would give: judged here as there.
        let held = match &store {
            Some(s) => reconcile::guard_verdict(s, t, &p, recorded.len())?,
            None => None,
        };
        match format {
            Format::Table => {
                write!(stdout, "{}", output::plan_table(&p, &t.scope, commit.id()))?;
                if let Some(held) = &held {
                    writeln!(
                        stdout,
                        "  held by the deletion guard: {}; apply records it held, and \
                         `gitplane approve` releases it",
                        held.reason
                    )?;
                }
            }
            Format::Json => {
                let mut value = output::plan_json(&p, &t.scope, commit.id());
                if let (Some(held), Some(fields)) = (&held, value.as_object_mut()) {
                    fields.insert(
                        "held".to_owned(),
                        serde_json::json!({"reason": held.reason, "deletions": held.deletions}),
                    );
                }
                json.push(value);
            }
        }
    }
    if format == Format::Json {
        print_json(stdout, json)?;
    }
    Ok((CommandResult::Success, changes))
}

fn show_graph(
    ctx: &Context,
    rev: Option<&str>,
    apps: &[String],
    format: GraphFormat,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let (commit, built) = if apps.is_empty() {
        match built_or_report(ctx, rev, Need::Graphs)? {
            Some((snapshot, built)) => (snapshot.commit, built),
            None => return Ok(CommandResult::Failure),
        }
    } else {
        let apps = apps.iter().cloned().collect();
        match app::load_and_build_apps(ctx, rev, &apps)? {
            (commit, Ok(built)) => (commit, built),
            (commit, Err(rejected)) => {
                report_rejected(&commit, &rejected);
                return Ok(CommandResult::Failure);
            }
        }
    };
    let commit = &commit;
    match format {
        GraphFormat::Json => {
            print_json(
                stdout,
                built
                    .graphs
                    .iter()
                    .map(|g| graph::to_json(g, commit))
                    .collect(),
            )?;
        }
        GraphFormat::Table => {
            for g in &built.graphs {
                writeln!(stdout, "{}", output::graph_table(g, commit))?;
            }
        }
        GraphFormat::Dot => {
            for g in &built.graphs {
                write!(stdout, "{}", graph::to_dot(g, commit))?;
            }
        }
        GraphFormat::Mermaid => {
            for g in &built.graphs {
                write!(stdout, "{}", graph::to_mermaid(g, commit))?;
            }
        }
    }
    Ok(CommandResult::Success)
}

fn report_rejected(commit: &str, rejected: &Rejected) {
    for e in &rejected.errors {
        eprintln!("error: {e}");
    }
    eprintln!(
        "commit {} rejected: {} error(s); nothing was changed",
        output::short(commit),
        rejected.errors.len()
    );
}

fn apply(
    ctx: &Context,
    rev: Option<&str>,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let mut parsed = gitplane_core::model::LoadCache::default();
    // A first apply creates the state: only once the repository and its environments read.
    let (commit, mut store, whole) = if ctx.state_exists() {
        // Into an empty database, every app is read whatever the state says (see
        // `Reach::Whole`): that is read and built while the schema is made. Stored secrets are
        // read once the repository is known to be the state's.
        Commit::resolve_opening(ctx, rev, |commit| {
            app::targets_unread(ctx, commit, (None, Reach::Whole), &mut parsed)
        })?
    } else {
        Commit::resolve(ctx, rev, None)?;
        let store = ctx.open_store()?;
        (Commit::resolve(ctx, rev, Some(&store))?, store, None)
    };
    commit.claim(ctx, &store)?;
    // Locked before anything is read from the state: which apps changed is judged against the
    // fingerprints another apply could be writing. Through the store's own connection: an
    // apply that changes little opens one connection to PostgreSQL, not two.
    let locks = commit
        .envs
        .iter()
        .map(|env| ApplyLock::acquire_with(&store, env, false))
        .collect::<Result<Vec<_>, _>>()?;
    let targets = match whole {
        Some(built) => built.map(|built| app::read_secrets(ctx, built)),
        None => app::targets_parsed_into(ctx, &commit, (Some(&store), Reach::Changes), &mut parsed),
    }?;
    let targets = match targets {
        Ok(targets) => targets,
        Err(rejected) => {
            report_rejected(commit.id(), &rejected);
            let error = rejected.errors.join("\n");
            for env in &rejected.envs {
                let id = store.failed_deployment(env, Some(commit.id()), &error)?;
                let detail = format!(
                    "commit {} rejected: {} error(s)",
                    output::short(commit.id()),
                    rejected.errors.len()
                );
                actor.record(&store, "apply", Some(env), Some(id), &detail)?;
            }
            return Ok(CommandResult::Failure);
        }
    };
    let outcome = apply_targets(
        ctx,
        &mut store,
        commit.id(),
        &targets,
        (&ApplyOptions::default(), &locks),
        &Attribution::of(actor, "apply"),
        stdout,
    );
    app::free_in_background((targets, parsed));
    outcome
}

/// Who an apply is for, and how its action rows read: the command, and what it did beyond
/// applying (put before each environment's outcome).
pub(crate) struct Attribution<'a> {
    pub actor: &'a Actor,
    pub command: &'a str,
    pub detail: Option<String>,
}

impl<'a> Attribution<'a> {
    pub(crate) fn of(actor: &'a Actor, command: &'a str) -> Self {
        Attribution {
            actor,
            command,
            detail: None,
        }
    }

    /// Records the action for `env`: `outcome`, after the detail if there is one.
    fn record(
        &self,
        store: &Store,
        env: &str,
        deployment: Option<i64>,
        outcome: &str,
    ) -> Result<(), CliError> {
        let detail = match &self.detail {
            Some(detail) => format!("{detail}; {outcome}"),
            None => outcome.to_owned(),
        };
        self.actor
            .record(store, self.command, Some(env), deployment, &detail)
    }
}

/// Reconciles each target in turn, with progress on stderr and a summary line per environment,
/// and records an action for each (see [`Attribution`]). The caller holds the environments'
/// apply locks.
///
/// The state key is checked first: a key that is not the one the state is sealed with stops
/// the command before any deployment is recorded or driver called.
fn apply_targets(
    ctx: &Context,
    store: &mut Store,
    commit: &str,
    targets: &[Target],
    (options, locks): (&ApplyOptions, &[ApplyLock]),
    attribution: &Attribution<'_>,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    store.check_key()?;
    let settings = Settings::from_config(&ctx.host);
    let runtime = runtime()?;
    let engine = engine(ctx, &settings, &runtime);
    let mut outcome = CommandResult::Success;
    let mut prune_failed = None;
    for t in targets {
        // An environment whose lock another process took starts no more driver calls.
        let options = ApplyOptions {
            lock: locks
                .iter()
                .find(|l| l.env() == t.graph.env)
                .map(ApplyLock::hold),
            ..options.clone()
        };
        let mut progress = progress::Shown::new(&t.graph.env, commit);
        let ran = app::deploy_env(store, &engine, t, commit, &options, &mut progress)?;
        progress.finish();
        let (shown, prune_error) =
            report_env(store, &t.graph.env, commit, ran, attribution, stdout)?;
        outcome = worse(outcome, shown);
        // The deployment is recorded: the others go on, and the command fails at the end.
        if prune_failed.is_none() {
            prune_failed = prune_error;
        }
    }
    if let Some(e) = prune_failed {
        return Err(e.into());
    }
    Ok(outcome)
}

/// The runtime a command's driver calls run on.
fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .map_err(CliError::Runtime)
}

/// What applying takes from the host config, on `runtime`.
fn engine<'a>(
    ctx: &'a Context,
    settings: &'a Settings,
    runtime: &'a tokio::runtime::Runtime,
) -> app::Engine<'a> {
    app::Engine {
        drivers: &ctx.drivers,
        settings,
        history: ctx.host.history,
        runtime: runtime.handle(),
    }
}

/// Tells how applying `commit` to `env` ended: a line on stdout (the failures on stderr) and an
/// action row (see [`Attribution`]). Returns how the command fares for it, and why pruning
/// after it failed, if it did.
fn report_env(
    store: &Store,
    env: &str,
    commit: &str,
    ran: EnvOutcome,
    attribution: &Attribution<'_>,
    stdout: &mut impl Write,
) -> Result<(CommandResult, Option<StateError>), CliError> {
    let (report, prune_error) = match ran {
        EnvOutcome::Pinned { pin, plan } => {
            writeln!(
                stdout,
                "{env}: pinned at {} by {} ({}): commit {} is planned, not applied ({plan}).\n  \
                 `gitplane unpin --env {env}` releases the pin and applies it.",
                output::short(&pin.commit_id),
                pin.pinned_by,
                pin.reason,
                output::short(commit),
            )?;
            let outcome = format!(
                "commit {} planned, not applied: pinned at {}",
                output::short(commit),
                output::short(&pin.commit_id)
            );
            attribution.record(store, env, None, &outcome)?;
            return Ok((CommandResult::Failure, None));
        }
        EnvOutcome::Ran {
            report,
            prune_error,
        } => (report, prune_error),
    };
    if report.resumed {
        eprintln!(
            "{}: resumed deployment {}, which an earlier run did not finish",
            report.env, report.deployment
        );
    }
    let c = report.counts;
    let summary = match report.status {
        DeploymentStatus::Held => format!(
            "commit {}: held by the deletion guard",
            output::short(commit)
        ),
        status => format!(
            "commit {}: {}: {} created, {} updated, {} deleted, {} failed",
            output::short(commit),
            status.as_str(),
            c.created,
            c.updated,
            c.deleted,
            c.failed
        ),
    };
    attribution.record(store, &report.env, Some(report.deployment), &summary)?;
    if report.status == DeploymentStatus::Held {
        writeln!(
            stdout,
            "{}: deployment {} held by the deletion guard: {}; nothing was changed.\n  \
             Approve it with `gitplane approve {}`, or push a commit that deletes less.",
            report.env,
            report.deployment,
            report.failures.join("; "),
            report.deployment
        )?;
        return Ok((CommandResult::Failure, prune_error));
    }
    writeln!(
        stdout,
        "{}: deployment {} {}: {} created, {} updated, {} deleted, {} unchanged, {} failed",
        report.env,
        report.deployment,
        report.status.as_str(),
        c.created,
        c.updated,
        c.deleted,
        c.unchanged,
        c.failed
    )?;
    if report.status != DeploymentStatus::Succeeded {
        for f in &report.failures {
            eprintln!("error: {}: {f}", report.env);
        }
        return Ok((CommandResult::Failure, prune_error));
    }
    Ok((CommandResult::Success, prune_error))
}

/// `gitplane approve`: lists what a held deployment deletes, asks (unless `yes`), then releases
/// it and applies it. Without a terminal to ask on and without `yes`, it refuses and changes
/// nothing.
fn approve(
    ctx: &Context,
    deployment: i64,
    yes: bool,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let mut store = existing_store(ctx)?;
    let Some(record) = store
        .deployments(None)?
        .into_iter()
        .find(|d| d.id == deployment)
    else {
        return Err(CliError::NotHeld { deployment });
    };
    let env = record.env.clone();
    let deletions = record.held.clone().unwrap_or_default();
    // Asked before the lock is taken: the environment's deployments need not wait for a
    // person to answer. Releasing it below checks again that it is still the one to approve.
    if record.status == DeploymentStatus::Held {
        write!(stdout, "{}", held_list(&record, &deletions))?;
        if !yes {
            if !std::io::stdin().is_terminal() {
                return Err(CliError::ApproveNeedsYes {
                    deployment,
                    env,
                    count: deletions.len(),
                });
            }
            write!(
                stdout,
                "Delete these {} resource(s) of {env}? [y/N] ",
                deletions.len()
            )?;
            stdout.flush()?;
            let mut answer = String::new();
            std::io::stdin().read_line(&mut answer)?;
            if !matches!(answer.trim().to_lowercase().as_str(), "y" | "yes") {
                writeln!(
                    stdout,
                    "Not approved: deployment {deployment} stays held; nothing was changed."
                )?;
                return Ok(CommandResult::Failure);
            }
        }
    }
    let lock = ApplyLock::acquire(&ctx.state, &env, false)?;
    let Some((env, commit)) = store.release_held(deployment)? else {
        return Err(CliError::NotHeld { deployment });
    };
    workflow::announce(
        ctx,
        actor,
        workflow::Announce {
            event: crate::config::NotifyEvent::Approved,
            env: &env,
            commit: Some(&commit),
            deployment: Some(deployment),
            reason: Some(&format!("approved {} deletion(s)", deletions.len())),
        },
    );
    let held = Context {
        envs: vec![env],
        ..ctx.clone()
    };
    let attribution = Attribution {
        actor,
        command: "approve",
        detail: Some(format!("approved {} deletion(s)", deletions.len())),
    };
    let resolved = Commit::resolve(&held, Some(&commit), Some(&store))?;
    resolved.claim(&held, &store)?;
    match targets(&held, &resolved, Some(&store), Reach::Whole)? {
        Ok(targets) => {
            let options = ApplyOptions {
                approved: Some(deployment),
                ..ApplyOptions::default()
            };
            apply_targets(
                &held,
                &mut store,
                resolved.id(),
                &targets,
                (&options, std::slice::from_ref(&lock)),
                &attribution,
                stdout,
            )
        }
        Err(rejected) => {
            report_rejected(resolved.id(), &rejected);
            let error = rejected.errors.join("\n");
            store.finish_deployment(
                deployment,
                DeploymentStatus::Failed,
                &Default::default(),
                Some(&error),
            )?;
            attribution.record(
                &store,
                &record.env,
                Some(deployment),
                &format!("commit {} rejected", output::short(resolved.id())),
            )?;
            Ok(CommandResult::Failure)
        }
    }
}

/// What a held deployment deletes, by app (global resources last), for `approve` to show
/// before it asks.
fn held_list(record: &gitplane_state::DeploymentRecord, deletions: &[String]) -> String {
    let mut by_app: std::collections::BTreeMap<Option<&str>, Vec<&str>> = Default::default();
    for label in deletions {
        // A label is `app/type.class#id`, `-` for a resource of no app (a global one).
        let (app, rest) = label.split_once('/').unwrap_or(("-", label));
        by_app
            .entry((app != "-").then_some(app))
            .or_default()
            .push(rest);
    }
    let mut out = format!(
        "Deployment {} of {} (commit {}) is held: {}\nIt deletes {} resource(s):\n",
        record.id,
        record.env,
        record
            .commit_id
            .as_deref()
            .map(output::short)
            .unwrap_or("-"),
        record
            .error
            .as_deref()
            .unwrap_or("held by the deletion guard"),
        deletions.len()
    );
    // `None` (no app) sorts first in a BTreeMap: globals are listed after the apps.
    let apps = by_app.iter().filter(|(app, _)| app.is_some());
    for (app, resources) in apps.chain(by_app.iter().filter(|(app, _)| app.is_none())) {
        let name = app.map_or_else(
            || "global resources (no app)".to_owned(),
            |a| format!("app {a}"),
        );
        out.push_str(&format!("  {name} ({}):\n", resources.len()));
        for resource in resources {
            out.push_str(&format!("    {resource}\n"));
        }
    }
    out
}

/// `gitplane resolve`: applies the resource's environment with the resource unpinned.
fn resolve(
    ctx: &Context,
    rev: Option<&str>,
    resource: &str,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let mut store = existing_store(ctx)?;
    let (guresid, env) = find_resource(&store, ctx, resource)?;
    let scoped = Context {
        envs: vec![env.clone()],
        ..ctx.clone()
    };
    let lock = ApplyLock::acquire(&ctx.state, &env, false)?;
    let commit = Commit::resolve(&scoped, rev, Some(&store))?;
    commit.claim(&scoped, &store)?;
    let targets = match targets(&scoped, &commit, Some(&store), Reach::Whole)? {
        Ok(targets) => targets,
        Err(rejected) => {
            report_rejected(commit.id(), &rejected);
            return Ok(CommandResult::Failure);
        }
    };
    let options = ApplyOptions {
        resolve: [guresid].into(),
        ..ApplyOptions::default()
    };
    let attribution = Attribution {
        actor,
        command: "resolve",
        detail: Some(format!("bound {resource} to current values")),
    };
    apply_targets(
        &scoped,
        &mut store,
        commit.id(),
        &targets,
        (&options, std::slice::from_ref(&lock)),
        &attribution,
        stdout,
    )
}

/// `gitplane drift`: one drift run of each environment (`--env`, else every recorded one) at
/// its last good commit, under the environment's lock.
fn drift(
    ctx: &Context,
    detect: bool,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let mut store = existing_store(ctx)?;
    let envs = recorded_envs(ctx, &store)?;
    let settings = Settings::from_config(&ctx.host);
    let runtime = runtime()?;
    let engine = engine(ctx, &settings, &runtime);
    let mut outcome = CommandResult::Success;
    for env in &envs {
        let lock = ApplyLock::acquire(&ctx.state, env, false)?;
        let Some(commit) = store.last_good_commit(env)? else {
            writeln!(
                stdout,
                "{env}: no deployment succeeded yet: nothing to compare"
            )?;
            continue;
        };
        let one = Context {
            envs: vec![env.clone()],
            ..ctx.clone()
        };
        let resolved = Commit::resolve(&one, Some(&commit), Some(&store))?;
        resolved.claim(&one, &store)?;
        let targets = match targets(&one, &resolved, Some(&store), Reach::Whole)? {
            Ok(targets) => targets,
            Err(rejected) => {
                report_rejected(resolved.id(), &rejected);
                outcome = CommandResult::Failure;
                continue;
            }
        };
        for target in &targets {
            if app::drift_mode(target, detect) == crate::model::DriftMode::Correct {
                // As for any apply: a key the state is not sealed with stops it before it starts.
                store.check_key()?;
            }
            let mut progress = progress::Shown::new(env, resolved.id());
            let ran = app::drift_env(
                &mut store,
                &engine,
                target,
                resolved.id(),
                detect,
                &crate::drift::DetectOptions {
                    lock: Some(lock.hold()),
                    ..Default::default()
                },
                &mut progress,
            )?;
            progress.finish();
            let report = match ran {
                app::DriftOutcome::Corrected {
                    outcome: ran,
                    corrected,
                } => {
                    let attribution = Attribution {
                        actor,
                        command: "drift",
                        detail: Some("drift run (correct)".to_owned()),
                    };
                    let (ran, prune_error) =
                        report_env(&store, env, resolved.id(), ran, &attribution, stdout)?;
                    if let Some(e) = prune_error {
                        return Err(e.into());
                    }
                    writeln!(
                        stdout,
                        "{env}: drift: {corrected} resource(s) had changed and were corrected"
                    )?;
                    outcome = worse(outcome, ran);
                    if corrected > 0 {
                        outcome = worse(outcome, CommandResult::Drifted);
                    }
                    continue;
                }
                app::DriftOutcome::Detected(report) => report,
            };
            for f in &report.findings {
                writeln!(
                    stdout,
                    "{env}: {}: {} ({}): {}",
                    f.label,
                    f.finding.what.as_str(),
                    f.finding.source.as_str(),
                    f.finding.detail
                )?;
            }
            for failure in &report.failures {
                eprintln!("error: {env}: {failure}");
            }
            actor.record(
                &store,
                "drift",
                Some(env),
                Some(report.deployment),
                &format!(
                    "drift run (detect): {} resource(s) differ, {} not read",
                    report.resources(),
                    report.failures.len()
                ),
            )?;
            writeln!(
                stdout,
                "{env}: drift run {} (detect) at {}: {} resource(s) differ, {} as recorded, \
                 {} not read; nothing was changed",
                report.deployment,
                output::short(resolved.id()),
                report.resources(),
                report.unchanged,
                report.failures.len()
            )?;
            if !report.failures.is_empty() {
                outcome = worse(outcome, CommandResult::Failure);
            }
            if !report.findings.is_empty() {
                outcome = worse(outcome, CommandResult::Drifted);
            }
        }
    }
    Ok(outcome)
}

/// The outcome that says more: drift found over a failure over success, so a cron job can
/// tell "drift" (2) apart.
fn worse(a: CommandResult, b: CommandResult) -> CommandResult {
    use CommandResult::*;
    match (a, b) {
        (Drifted, _) | (_, Drifted) => Drifted,
        (Failure, _) | (_, Failure) => Failure,
        _ => Success,
    }
}

/// `gitplane history`: deployments per commit, newest first.
fn history(
    ctx: &Context,
    format: Format,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let store = existing_store(ctx)?;
    let mut deployments = store.deployments(None)?;
    if !ctx.envs.is_empty() {
        deployments.retain(|d| ctx.envs.contains(&d.env));
    }
    let mut pins = store.pins(None)?;
    if !ctx.envs.is_empty() {
        pins.retain(|p| ctx.envs.contains(&p.env));
    }
    // Who did what by hand: of the environments shown, and those of the whole state.
    let mut actions = store.actions(None)?;
    if !ctx.envs.is_empty() {
        actions.retain(|a| a.env.as_ref().is_none_or(|e| ctx.envs.contains(e)));
    }
    // Detect-only drift runs, said as such: they changed nothing.
    let detect_runs: std::collections::BTreeMap<i64, gitplane_state::DetectRun> = store
        .detect_runs(None)?
        .into_iter()
        .map(|r| (r.deployment, r))
        .collect();
    match format {
        Format::Json => {
            let mut items: Vec<serde_json::Value> = deployments
                .iter()
                .map(|d| {
                    let mut item = output::history_json(d);
                    if let (Some(run), Some(fields)) =
                        (detect_runs.get(&d.id), item.as_object_mut())
                    {
                        fields.insert("kind".into(), "drift".into());
                        fields.insert("drift_mode".into(), "detect".into());
                        fields.insert("findings".into(), run.findings.into());
                        fields.insert("resources_differ".into(), run.resources.into());
                    }
                    item
                })
                .collect();
            workflow::history_json_pins(&mut items, &pins);
            workflow::history_json_actions(&mut items, &actions);
            writeln!(
                stdout,
                "{}",
                serde_json::to_string_pretty(&items)
                    .expect("a serde_json::Value always serialises")
            )?;
        }
        Format::Table => {
            write!(stdout, "{}", output::history_table(&deployments))?;
            for d in &deployments {
                if let Some(run) = detect_runs.get(&d.id) {
                    writeln!(
                        stdout,
                        "deployment {}: drift run (detect): {} finding(s), {} resource(s) \
                         differ; nothing was changed",
                        d.id, run.findings, run.resources
                    )?;
                }
            }
            if !pins.is_empty() {
                write!(stdout, "\npins:\n{}", workflow::history_lines(&pins))?;
            }
            if !actions.is_empty() {
                write!(stdout, "\nactions:\n{}", workflow::action_lines(&actions))?;
            }
        }
    }
    Ok(CommandResult::Success)
}

/// `drift: 2 resources differ (detected T, not corrected)`, from the newest detect run.
fn detect_line(run: &gitplane_state::DetectRun) -> String {
    let at = run.finished_at.as_deref().unwrap_or("-");
    if run.resources == 0 {
        format!("drift: none detected (checked {at})")
    } else {
        format!(
            "drift: {} resource(s) differ (detected {at}, not corrected); \
             `gitplane report drift-detected` lists them",
            run.resources
        )
    }
}

fn status(
    ctx: &Context,
    filter: &StatusFilter,
    format: Format,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let store = existing_store(ctx)?;
    let postgres = store.backend() == gitplane_state::db::Backend::Postgres;
    let mut json = Vec::new();
    for mut status in app::status::status(ctx, &store)? {
        status.resources = filter.apply(std::mem::take(&mut status.resources));
        let env = &status.env;
        let (pin, preview) = (status.pin.as_ref(), status.preview.as_ref());
        let lease = status.lease.as_ref();
        match format {
            Format::Table => {
                let table = output::status_table(
                    env,
                    status.commit.as_deref(),
                    status.deployments.first(),
                    lease,
                    &status.resources,
                );
                // The pin and preview lines go under the heading line.
                let (heading, rest) = table.split_once('\n').unwrap_or((&table, ""));
                writeln!(
                    stdout,
                    "{heading}\n{}{rest}",
                    workflow::status_lines(pin, preview)
                )?
            }
            Format::Json => {
                let mut json_status = output::status_json(
                    env,
                    status.commit.as_deref(),
                    postgres.then_some(lease),
                    &status.resources,
                );
                workflow::status_fields(&mut json_status, pin, preview);
                if let (Some(run), Some(fields)) = (&status.detected, json_status.as_object_mut()) {
                    fields.insert(
                        "drift".into(),
                        serde_json::json!({
                            "deployment": run.deployment,
                            "commit": run.commit_id,
                            "detected_at": run.finished_at,
                            "status": run.status,
                            "resources_differ": run.resources,
                            "findings": run.findings,
                            "corrected": false,
                        }),
                    );
                }
                json.push(json_status);
            }
        }
        if let (Format::Table, Some(run)) = (format, &status.detected) {
            writeln!(stdout, "  {}", detect_line(run))?;
        }
    }
    if format == Format::Json {
        print_json(stdout, json)?;
    }
    Ok(CommandResult::Success)
}

fn quickstart(dir: &Path, stdout: &mut impl Write) -> Result<CommandResult, CliError> {
    if !dir.join(".git").exists() {
        init::init(dir)?;
        writeln!(
            stdout,
            "Created a config repository from the template in {}\n",
            dir.display()
        )?;
    } else {
        writeln!(stdout, "Using the config repository in {}\n", dir.display())?;
    }
    let ctx = Context {
        repo: dir.to_owned(),
        mirror_of: None,
        state: dir.join("gitplane.db"),
        envs: Vec::new(),
        default_rev: None,
        host: HostConfig::default(),
        drivers: Registry::builtin(),
        stores: SecretStores::default(),
        state_password_error: None,
    };
    if apply(&ctx, None, &Actor::of(None), stdout)? == CommandResult::Failure {
        return Ok(CommandResult::Failure);
    }
    writeln!(stdout)?;
    status(&ctx, &StatusFilter::default(), Format::Table, stdout)?;
    let (snapshot, result) = load_and_build(
        &Context {
            envs: vec!["development".into()],
            ..ctx.clone()
        },
        None,
        Need::Graphs,
    )?;
    if let Ok(built) = result {
        for g in &built.graphs {
            writeln!(stdout, "{}", output::graph_table(g, &snapshot.commit))?;
        }
    }
    let state = std::path::absolute(&ctx.state).unwrap_or(ctx.state.clone());
    writeln!(
        stdout,
        "State: {}\n  sqlite3 {} 'SELECT env, app, type, res_id, status FROM current_resources'\n\
         Edit the files in {}, commit, and run `gitplane apply --repo {} --state {}` again.",
        state.display(),
        state.display(),
        dir.display(),
        dir.display(),
        state.display()
    )?;
    Ok(CommandResult::Success)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// docs/cli.md has a section for every command, and names every flag in it: a command or
    /// flag added without its documentation fails here.
    #[test]
    fn docs_cli_names_every_command_and_flag() {
        let docs = include_str!("../../../docs/cli.md");
        let mut missing = Vec::new();
        let mut stack: Vec<(String, clap::Command)> = Cli::command()
            .get_subcommands()
            .map(|c| (c.get_name().to_owned(), c.clone()))
            .collect();
        while let Some((path, command)) = stack.pop() {
            if path.ends_with("help") {
                continue;
            }
            let subcommands: Vec<_> = command
                .get_subcommands()
                .filter(|c| c.get_name() != "help")
                .collect();
            if !subcommands.is_empty() {
                stack.extend(
                    subcommands
                        .into_iter()
                        .map(|c| (format!("{path} {}", c.get_name()), c.clone())),
                );
                continue;
            }
            let heading = format!("## `gitplane {path}`\n");
            let Some(start) = docs.find(&heading) else {
                missing.push(format!("no section {heading:?}"));
                continue;
            };
            let section = &docs[start + heading.len()..];
            let section = &section[..section.find("\n## ").unwrap_or(section.len())];
            for arg in command.get_arguments() {
                if let Some(long) = arg.get_long()
                    && !section.contains(&format!("--{long}"))
                {
                    missing.push(format!("gitplane {path}: --{long}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "docs/cli.md lacks (regenerate the help blocks with `gitplane COMMAND --help`):\n{}",
            missing.join("\n")
        );
    }
}
