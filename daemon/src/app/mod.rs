//! The application layer: what gitplane does for one request, shared by the CLI, the daemon and
//! the HTTP listener.
//!
//! Apply one environment ([`deploy_env`]), run its drift run ([`drift_env`]), plan a ref for
//! review ([`plan_ref`]), explain a resource ([`explain`]), read an environment's status
//! ([`status`]), and what they stand on: the [`Context`] a request runs with (host config,
//! drivers, secret stores, state, repository), the commit it reads ([`Commit`]) and the
//! deployment targets built from it ([`targets`]). Nothing here parses arguments or prints: each
//! caller reports the outcome its own way (the CLI as lines on stdout, the daemon as logs and
//! events, the listener as JSON). The listener and the daemon never import the CLI; a test keeps
//! it so.

mod apply;
mod drift;
pub mod explain;
mod plan;
pub mod status;
pub mod text;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gitplane_state::{StateError, Store};

use crate::config::{HostConfig, SecretSourceError};
use crate::deploy::{self, Built, Reach, Rejected, Target};
use crate::drivers::Registry;
use crate::model::LoadCache;
use crate::repo::{ConfigRepo, RepoError, Snapshot};
use crate::stores::SecretStores;
use crate::trust::TrustError;

pub use apply::{Engine, EnvOutcome, Observer, deploy_env};
pub use drift::{DriftOutcome, drift_env, drift_mode};
pub use plan::plan_ref;
pub use text::short;

/// Free pages returned to the file system after a prune, at most (4 MB with 4 kB pages): a
/// little each time keeps every apply quick.
pub const RECLAIM_PAGES: u32 = 1024;

/// What a request runs with: the host config, with the repository and state it names (or the
/// ones a command was given instead).
#[derive(Debug, Clone)]
pub struct Context {
    pub repo: PathBuf,
    /// When `repo` is the daemon's mirror of a remote (`repo: {url}` in the host config): the
    /// remote's URL, without credentials, for a message when the mirror is not there.
    pub mirror_of: Option<String>,
    /// A SQLite file, or a PostgreSQL URL without its password.
    pub state: PathBuf,
    /// The environments asked for; empty: every one.
    pub envs: Vec<String>,
    /// The ref to read when none is given (the host config's `ref`).
    pub default_rev: Option<String>,
    pub host: HostConfig,
    pub drivers: Registry,
    pub stores: SecretStores,
    /// Why `state_password` could not be read, told when the state is opened: commands that
    /// never open it (`validate` in a pre-receive hook, run by whoever pushes) need no password.
    pub state_password_error: Option<SecretSourceError>,
}

impl Context {
    /// The context of a daemon's request (the listener's plans and explanations): its
    /// repository (the mirror, for a remote) and state, under the host config in force, whose
    /// state password the daemon already applied.
    pub fn of_daemon(repo: PathBuf, state: PathBuf, envs: Vec<String>, host: HostConfig) -> Self {
        Context {
            repo,
            mirror_of: None,
            state,
            envs,
            default_rev: host.git_ref.clone(),
            drivers: host.registry(),
            stores: host.secret_stores(),
            host,
            state_password_error: None,
        }
    }

    /// The config repository: `repo`, or the daemon's mirror of the host config's remote, which
    /// must be there (the daemon made it), else the error says where it was looked for.
    pub fn open_repo(&self) -> Result<ConfigRepo, AppError> {
        if let Some(url) = &self.mirror_of
            && !self.repo.exists()
        {
            return Err(AppError::NoMirror {
                url: url.clone(),
                mirror: self.repo.clone(),
            });
        }
        Ok(ConfigRepo::open(&self.repo)?)
    }

    /// Whether the state is there to read: a SQLite file that exists, or a PostgreSQL database
    /// (reached, and its schema made if it has none, when opened).
    pub fn state_exists(&self) -> bool {
        is_postgres(&self.state) || self.state.exists()
    }

    /// Opens (creating if needed) the state file, with the state key the host config names.
    pub fn open_store(&self) -> Result<Store, AppError> {
        self.open_store_noting(&|| {})
    }

    /// [`Context::open_store`], calling `fresh` when the state is a database with no schema yet
    /// (see [`Store::open_keyed_noting`]).
    fn open_store_noting(&self, fresh: &dyn Fn()) -> Result<Store, AppError> {
        if let Some(e) = &self.state_password_error {
            return Err(AppError::StatePassword(e.clone()));
        }
        Ok(Store::open_keyed_noting(
            &self.state,
            self.host.state_key.as_ref(),
            fresh,
        )?)
    }

    pub fn host(&self) -> deploy::Host<'_> {
        deploy::Host {
            drivers: &self.drivers,
            stores: &self.stores,
        }
    }

    /// The revision to read: `rev`, else the host config's ref (else, `None`, HEAD).
    pub fn rev<'a>(&'a self, rev: Option<&'a str>) -> Option<&'a str> {
        rev.or(self.default_rev.as_deref())
    }

    /// This context for one environment.
    pub fn only(&self, env: &str) -> Context {
        Context {
            envs: vec![env.to_owned()],
            ..self.clone()
        }
    }

    /// Checks that `repo` is the repository `store` serves (see [`crate::trust`]); with
    /// `record`, a state that records none yet records this one.
    pub fn check_repository(
        &self,
        repo: &ConfigRepo,
        store: &Store,
        record: bool,
    ) -> Result<(), AppError> {
        let shown = crate::trust::shown_location(&self.repo, None);
        crate::trust::check_repository(store, repo, &shown, self.default_rev.as_deref(), record)?;
        Ok(())
    }
}

/// Whether `state` names a PostgreSQL database.
fn is_postgres(state: &Path) -> bool {
    state.to_str().is_some_and(gitplane_state::is_postgres_url)
}

/// Why a request could not be served. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Trust(#[from] TrustError),
    #[error(transparent)]
    Deploy(#[from] deploy::DeployError),
    #[error(transparent)]
    StatePassword(SecretSourceError),
    #[error("{path}: no state file: run `gitplane apply` first, or pass --state")]
    NoState { path: PathBuf },
    #[error("no app '{app}' in commit {commit} (apps: {known})")]
    UnknownApp {
        app: String,
        commit: String,
        known: String,
    },
    #[error("no environment '{env}' in commit {commit} (environments: {known})")]
    UnknownEnv {
        env: String,
        commit: String,
        known: String,
    },
    #[error(
        "the host config's repo is the remote {url}, whose mirror the daemon keeps at {}; it is \
         not there (has the daemon run on this host, with this state?): pass --repo with a clone \
         of the repository",
        mirror.display()
    )]
    NoMirror { url: String, mirror: PathBuf },
    #[error(
        "commit {commit} declares no environment (no environments/<id>.yaml) and the state \
         records none: nothing to plan or apply; add an environment file (`gitplane init DIR` \
         makes a repository with two)"
    )]
    NoEnvironments { commit: String },
    #[error("{state}: no environment '{env}' is recorded (recorded: {known})")]
    UnknownStateEnv {
        env: String,
        state: PathBuf,
        known: String,
    },
    #[error("no recorded resource is {resource}: `gitplane status` lists them")]
    NoResource { resource: String },
    #[error(
        "no resource is {resource}, neither recorded nor in the graph of commit {commit}: \
         `gitplane status` and `gitplane graph` list them"
    )]
    UnknownResource { resource: String, commit: String },
    #[error("{resource} is recorded in several environments ({envs}): pass --env")]
    AmbiguousResource { resource: String, envs: String },
    #[error("{resource} is in the graphs of several environments ({envs}): pass --env")]
    AmbiguousInGraph { resource: String, envs: String },
}

/// Checks that the repository a request reads is the one `store` serves, when there is one to
/// read: `explain` shows a recorded resource even without it.
pub fn check_repository(ctx: &Context, store: &Store) -> Result<(), AppError> {
    match ctx.open_repo() {
        Ok(repo) => ctx.check_repository(&repo, store, false),
        Err(_) => Ok(()),
    }
}

/// The state, which must exist: reading requests never create one.
pub fn existing_store(ctx: &Context) -> Result<Store, AppError> {
    if !ctx.state_exists() {
        return Err(AppError::NoState {
            path: ctx.state.clone(),
        });
    }
    ctx.open_store()
}

/// What a request needs of a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Its graphs, as validate, graph and explain show them.
    Graphs,
    /// Its graphs with every stored secret read, to plan or apply.
    Inputs,
}

/// Reads the commit, loads it and builds the graph of each selected environment.
pub fn load_and_build(
    ctx: &Context,
    rev: Option<&str>,
    need: Need,
) -> Result<(Snapshot, Result<Built, Rejected>), AppError> {
    let repo = ctx.open_repo()?;
    let snapshot = repo.load(rev)?;
    let envs = target_envs(&snapshot, &ctx.envs)?;
    let mut result = deploy::build(&snapshot, &envs, ctx.host());
    if need == Need::Inputs
        && let Ok(built) = &mut result
        && let Err(rejected) = built.read_stored_secrets(&ctx.stores)
    {
        result = Err(rejected);
    }
    Ok((snapshot, result))
}

/// Like [`load_and_build`] for environment `env` alone, reading and building only the apps
/// `apps` and the global resources they reach (see [`deploy::build_apps`]); every app when
/// `None`. Commands about part of an environment cost in proportion to that part.
pub fn load_and_build_part(
    ctx: &Context,
    rev: Option<&str>,
    env: &str,
    apps: Option<&BTreeSet<String>>,
) -> Result<(Snapshot, Result<Built, Rejected>), AppError> {
    let Some(apps) = apps else {
        return load_and_build(&ctx.only(env), rev, Need::Graphs);
    };
    let repo = ctx.open_repo()?;
    let commit = repo.resolve(rev)?;
    let layout = repo.layout(&commit)?;
    select_envs(
        &deploy::environments_in(&layout),
        &commit,
        &[env.to_owned()],
    )?;
    let (snapshot, graph) = deploy::build_apps(&repo, &commit, env, apps, ctx.host())?;
    Ok((snapshot, graph.map(|g| Built { graphs: vec![g] })))
}

/// The graphs of the apps `apps` (and the global resources they reach) in each environment
/// asked for, at `rev`, for `graph --app`: only those apps' folders are read. The commit's id
/// with them; an app the commit does not have is an error naming those it has.
pub fn load_and_build_apps(
    ctx: &Context,
    rev: Option<&str>,
    apps: &BTreeSet<String>,
) -> Result<(String, Result<Built, Rejected>), AppError> {
    let repo = ctx.open_repo()?;
    let commit = repo.resolve(rev)?;
    let layout = repo.layout(&commit)?;
    if let Some(app) = apps.iter().find(|a| !layout.apps.contains_key(*a)) {
        return Err(AppError::UnknownApp {
            app: app.clone(),
            commit: short(&commit).to_owned(),
            known: layout.apps.keys().cloned().collect::<Vec<_>>().join(", "),
        });
    }
    let envs = select_envs(&deploy::environments_in(&layout), &commit, &ctx.envs)?;
    let mut graphs = Vec::new();
    for env in &envs {
        match deploy::build_apps(&repo, &commit, env, apps, ctx.host())?.1 {
            Ok(graph) => graphs.push(graph),
            Err(rejected) => return Ok((commit, Err(rejected))),
        }
    }
    Ok((commit, Ok(Built { graphs })))
}

/// Environments named by the commit's `environments/` files, or the ones asked for.
pub fn target_envs(snapshot: &Snapshot, asked: &[String]) -> Result<Vec<String>, AppError> {
    select_envs(&deploy::environments_of(snapshot), &snapshot.commit, asked)
}

/// `asked` (every one of `known` when empty), each checked against `known`.
pub fn select_envs(
    known: &BTreeSet<String>,
    commit: &str,
    asked: &[String],
) -> Result<Vec<String>, AppError> {
    if asked.is_empty() {
        return Ok(known.iter().cloned().collect());
    }
    for env in asked {
        if !known.contains(env) {
            return Err(AppError::UnknownEnv {
                env: env.clone(),
                commit: short(commit).to_owned(),
                known: known.iter().cloned().collect::<Vec<_>>().join(", "),
            });
        }
    }
    let mut asked = asked.to_vec();
    asked.sort();
    asked.dedup();
    Ok(asked)
}

/// What [`Commit::resolve_opening`] read while the state opened.
enum Read<T> {
    /// The repository, and the commit's layout in it or why it could not be read.
    Layout(
        ConfigRepo,
        Result<crate::repo::Layout, crate::repo::RepoError>,
    ),
    /// The commit, its environments known without the state (empty), and what was worked out
    /// on them.
    Fresh(Commit, T),
}

/// A resolved commit of the config repository, its layout, and the environments a request
/// works on (those asked for, else every one of the commit).
pub struct Commit {
    repo: ConfigRepo,
    layout: crate::repo::Layout,
    pub envs: Vec<String>,
}

impl Commit {
    /// The commit `rev` names; with `store`, its environments include those removed since
    /// (recorded resources, no file), whose resources a deployment deletes, and the repository
    /// must be the one the state serves.
    pub fn resolve(
        ctx: &Context,
        rev: Option<&str>,
        store: Option<&Store>,
    ) -> Result<Commit, AppError> {
        let repo = ctx.open_repo()?;
        if let Some(store) = store {
            ctx.check_repository(&repo, store, false)?;
        }
        let id = repo.resolve(rev)?;
        Commit::at(ctx, repo, &id, store)
    }

    /// [`Commit::resolve`] with the state, opened ([`Context::open_store`]) on a thread of its
    /// own while the commit and its layout are read: connecting to PostgreSQL and reading the
    /// repository wait on different things. The state's error comes first, as when it is
    /// opened first, and the repository is checked against the state before anything else.
    ///
    /// When the state is a database with no schema yet, nothing is recorded in it, so the
    /// commit's environments are known without it and `while_fresh` runs on them while the
    /// schema is made (a first apply parses the repository meanwhile). Its result comes back
    /// only if the state, once open, still gives the same environments (another first apply
    /// may have recorded some in between); else `None`, and the caller works it out again.
    pub fn resolve_opening<T>(
        ctx: &Context,
        rev: Option<&str>,
        while_fresh: impl FnOnce(&Commit) -> T,
    ) -> Result<(Commit, Store, Option<T>), AppError> {
        let (fresh_told, fresh) = std::sync::mpsc::channel::<()>();
        let (opened, read) = std::thread::scope(|scope| {
            let open = move || {
                ctx.open_store_noting(&|| {
                    let _ = fresh_told.send(());
                })
            };
            let opening = std::thread::Builder::new()
                .name("open-state".into())
                .spawn_scoped(scope, open);
            // The repository, and the commit's layout in it (its error told only once the
            // repository is known to be the state's).
            let read = ctx.open_repo().map(|repo| {
                let layout = repo.resolve(rev).and_then(|id| repo.layout(&id));
                (repo, layout)
            });
            let (opened, read) = match opening {
                Ok(thread) => {
                    // Told at once for an empty database; else the thread ends first.
                    let read = match read {
                        Ok((repo, Ok(layout))) if fresh.recv().is_ok() => {
                            Commit::with_layout(ctx, repo, layout, None).map(|commit| {
                                let worked = while_fresh(&commit);
                                Read::Fresh(commit, worked)
                            })
                        }
                        Ok((repo, layout)) => Ok(Read::Layout(repo, layout)),
                        Err(e) => Err(e),
                    };
                    let opened = thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (opened, read)
                }
                // No thread to spare: opened here, after.
                Err(_) => (
                    ctx.open_store(),
                    read.map(|(repo, layout)| Read::Layout(repo, layout)),
                ),
            };
            (opened, read)
        });
        let store = opened?;
        match read? {
            Read::Layout(repo, layout) => {
                ctx.check_repository(&repo, &store, false)?;
                let commit = Commit::with_layout(ctx, repo, layout?, Some(&store))?;
                Ok((commit, store, None))
            }
            Read::Fresh(commit, worked) => {
                ctx.check_repository(&commit.repo, &store, false)?;
                let known = deploy::environments_to_deploy(&commit.layout, Some(&store))?;
                let envs = select_envs(&known, commit.id(), &ctx.envs)?;
                if envs == commit.envs {
                    Ok((commit, store, Some(worked)))
                } else {
                    Ok((Commit { envs, ..commit }, store, None))
                }
            }
        }
    }

    /// Commit `id` of `repo` (checked against `store` already), as [`Commit::resolve`] gives it.
    fn at(
        ctx: &Context,
        repo: ConfigRepo,
        id: &str,
        store: Option<&Store>,
    ) -> Result<Commit, AppError> {
        let layout = repo.layout(id)?;
        Commit::with_layout(ctx, repo, layout, store)
    }

    /// [`Commit::at`] of a layout read already.
    fn with_layout(
        ctx: &Context,
        repo: ConfigRepo,
        layout: crate::repo::Layout,
        store: Option<&Store>,
    ) -> Result<Commit, AppError> {
        let id = layout.commit.clone();
        let known = deploy::environments_to_deploy(&layout, store)?;
        if known.is_empty() {
            return Err(AppError::NoEnvironments {
                commit: short(&id).to_owned(),
            });
        }
        let envs = select_envs(&known, &id, &ctx.envs)?;
        Ok(Commit { repo, layout, envs })
    }

    /// The commit's id.
    pub fn id(&self) -> &str {
        &self.layout.commit
    }

    /// The repository it was read from.
    pub fn repo(&self) -> &ConfigRepo {
        &self.repo
    }

    /// Records the repository as the one `store` serves, if it records none yet: a request
    /// that writes with a repository does, before it writes.
    pub fn claim(&self, ctx: &Context, store: &Store) -> Result<(), AppError> {
        ctx.check_repository(&self.repo, store, true)
    }
}

/// What a deployment of each of `commit`'s environments looks at, stored secrets read (see
/// [`deploy::targets`]); or why the commit is rejected, as a whole.
pub fn targets(
    ctx: &Context,
    commit: &Commit,
    store: Option<&Store>,
    reach: Reach,
) -> Result<Result<Vec<Target>, Rejected>, AppError> {
    let mut cache = LoadCache::default();
    let result = targets_parsed_into(ctx, commit, (store, reach), &mut cache);
    free_in_background(cache);
    result
}

/// [`targets`], the parsed files left in `cache`: a caller that does the work next frees
/// them (and the targets) when it is done, rather than while it works.
pub fn targets_parsed_into(
    ctx: &Context,
    commit: &Commit,
    scope: (Option<&Store>, Reach),
    cache: &mut LoadCache,
) -> Result<Result<Vec<Target>, Rejected>, AppError> {
    let built = targets_unread(ctx, commit, scope, cache)?;
    Ok(read_secrets(ctx, built))
}

/// [`targets_parsed_into`] without the stored secrets read: all that may be worked out before
/// the repository is known to be the one the state serves ([`read_secrets`] reads them).
pub fn targets_unread(
    ctx: &Context,
    commit: &Commit,
    (store, reach): (Option<&Store>, Reach),
    cache: &mut LoadCache,
) -> Result<Result<Vec<Target>, Rejected>, AppError> {
    Ok(deploy::targets(
        &commit.repo,
        &commit.layout,
        &commit.envs,
        (store, reach),
        ctx.host(),
        cache,
    )?)
}

/// Reads the stored secrets of `built`'s targets (see [`deploy::read_target_secrets`]).
pub fn read_secrets(
    ctx: &Context,
    built: Result<Vec<Target>, Rejected>,
) -> Result<Vec<Target>, Rejected> {
    let mut targets = built?;
    deploy::read_target_secrets(&mut targets, &ctx.stores)?;
    Ok(targets)
}

/// Frees `value` on a thread of its own. The parsed files and graphs of tens of thousands of
/// resources take a tenth of a second to free, which the caller need not wait for; a command
/// that exits first leaves them to the system.
pub fn free_in_background<T: Send + 'static>(value: T) {
    // Should no thread start, the value is freed here, as it would have been.
    let _ = std::thread::Builder::new()
        .name("free".to_owned())
        .spawn(move || drop(value));
}

/// The environments a reading request looks at: those asked for (each must be recorded), else
/// every recorded one.
pub fn recorded_envs(ctx: &Context, store: &Store) -> Result<Vec<String>, AppError> {
    let known = store.environments()?;
    for env in &ctx.envs {
        if !known.contains(env) {
            return Err(AppError::UnknownStateEnv {
                env: env.clone(),
                state: store.path().to_owned(),
                known: known.join(", "),
            });
        }
    }
    Ok(if ctx.envs.is_empty() {
        known
    } else {
        ctx.envs.clone()
    })
}

/// Finds a recorded resource by GUResID or `app/type.class#id` (in the asked environments, or
/// any): its GUResID and environment.
pub fn find_resource(
    store: &Store,
    ctx: &Context,
    wanted: &str,
) -> Result<(String, String), AppError> {
    let mut found = store.find_resources(&ctx.envs, wanted)?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(AppError::NoResource {
            resource: wanted.to_owned(),
        }),
        _ => Err(AppError::AmbiguousResource {
            resource: wanted.to_owned(),
            envs: found
                .into_iter()
                .map(|(_, e)| e)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod first_apply_tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use gitplane_state::{
        DeletionPolicy, JournalEntry, KeySource, OperationStart, ResourceRecord, ResourceStatus,
        Store,
    };

    use super::{Commit, Context};
    use crate::config::HostConfig;

    fn git(repo: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .current_dir(repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    /// A repository with one environment, and a context on a new database of the shared server.
    fn context(dir: &Path, database: String) -> (Context, KeySource) {
        let repo = dir.join("repo");
        std::fs::create_dir_all(repo.join("environments")).unwrap();
        std::fs::write(
            repo.join("environments/development.yaml"),
            "type: development\n",
        )
        .unwrap();
        git(&repo, &["init", "-q"]);
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", "one environment"]);
        let key = KeySource::File(dir.join("state.key"));
        let host = HostConfig {
            state_key: Some(key.clone()),
            ..HostConfig::default()
        };
        let ctx = Context::of_daemon(repo, PathBuf::from(database), Vec::new(), host);
        (ctx, key)
    }

    /// What another first apply leaves: a resource of environment `env`.
    fn record_one(store: &mut Store, env: &str) {
        let d = store.begin_deployment(env, "c0").unwrap();
        let ops = store
            .begin_operations(&[OperationStart {
                deployment: d,
                guresid: "g-other",
                app: None,
                res_type: "dns",
                class: "default",
                res_id: "shared.dns",
                action: "create",
                reason: "new",
            }])
            .unwrap();
        let record = ResourceRecord {
            guresid: "g-other".into(),
            env: env.into(),
            app: None,
            res_type: "dns".into(),
            class: "default".into(),
            res_id: "shared.dns".into(),
            definition: "def".into(),
            driver: "echo".into(),
            account: None,
            deletion_policy: DeletionPolicy::Delete,
            template_hash: String::new(),
            status: ResourceStatus::Ready,
            inputs_hash: "h".into(),
            outputs: serde_json::json!({}),
            secret_outputs: serde_json::json!({}),
            inputs: serde_json::json!({}).into(),
            secret_inputs: serde_json::json!({}).into(),
            error: None,
            commit_id: "c0".into(),
        };
        store
            .journal(&[JournalEntry::Put {
                operation: ops[0],
                attempts: 1,
                deployment: d,
                record: &record,
                outputs_changed: Some(true),
                new: true,
                manifests: None,
                sealed: None,
            }])
            .unwrap();
    }

    #[test]
    fn what_a_first_apply_works_out_while_the_schema_is_made_is_kept_only_if_the_state_agrees() {
        let Some(pg) = gitplane_testkit::shared_or_skip("PostgreSQL") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let (ctx, _) = context(dir.path(), pg.database());
        // An empty database: the work is done while the schema is made, and kept.
        let (commit, _store, worked) =
            Commit::resolve_opening(&ctx, None, |commit| commit.envs.clone()).unwrap();
        assert_eq!(worked, Some(vec!["development".to_owned()]));
        assert_eq!(commit.envs, ["development"]);
        // A schema made already: nothing is worked out ahead.
        let (_, _, worked) = Commit::resolve_opening(&ctx, None, |_| -> () {
            panic!("worked out ahead on a state that has a schema")
        })
        .unwrap();
        assert_eq!(worked, None);

        // Another first apply records an environment while this one works: its work is dropped,
        // and the environments are the state's (the other's resources go, having no file here).
        let dir = tempfile::tempdir().unwrap();
        let (ctx, key) = context(dir.path(), pg.database());
        let (commit, _store, worked) = Commit::resolve_opening(&ctx, None, |_| {
            // Opened once the schema is made (the migration holds the database's lock).
            let mut other = Store::open_keyed(&ctx.state, Some(&key)).unwrap();
            record_one(&mut other, "staging");
            "worked"
        })
        .unwrap();
        assert_eq!(worked, None);
        assert_eq!(commit.envs, ["development", "staging"]);
    }
}
