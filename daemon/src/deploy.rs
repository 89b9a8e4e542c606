//! One commit, from its files to its graphs: load, build every selected environment, check
//! that every driver and secret store it uses is configured, and (to plan or apply) read its
//! stored secrets. The commit is accepted or rejected as a whole.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gitplane_state::{AppFingerprint, StateError, Store};

use crate::drivers::Registry;
use crate::graph::{self, ResourceGraph};
use crate::model::placeholder::StoreRef;
use crate::model::{self, LoadCache, Repository, SourceLocation};
use crate::repo::{ConfigRepo, Layout, Snapshot};
use crate::stores::{SecretStores, StoreError};

/// What the host provides a commit: its drivers and its secret stores.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    pub drivers: &'a Registry,
    pub stores: &'a SecretStores,
}

/// A commit that did not load or build: every error, and the environments it was meant for.
#[derive(Debug, Clone)]
pub struct Rejected {
    pub envs: Vec<String>,
    pub errors: Vec<String>,
}

/// A commit's graphs, one per selected environment.
#[derive(Debug, Clone)]
pub struct Built {
    pub graphs: Vec<ResourceGraph>,
}

/// The environment a path names, if it is an environment's file (`environments/<id>.yaml`).
pub fn environment_file(path: &str) -> Option<&str> {
    let name = path.strip_prefix("environments/")?;
    if name.contains('/') {
        return None;
    }
    name.strip_suffix(".yaml")
        .or_else(|| name.strip_suffix(".yml"))
}

/// The environments a commit declares: the names of its `environments/*.yaml` files, which
/// are known even when the files do not parse.
pub fn environments_of(snapshot: &Snapshot) -> BTreeSet<String> {
    snapshot
        .files
        .keys()
        .filter_map(|p| environment_file(p))
        .map(str::to_owned)
        .collect()
}

/// The environments a commit's layout declares (its `environments/*.yaml` files).
pub fn environments_in(layout: &Layout) -> BTreeSet<String> {
    layout
        .shared
        .keys()
        .filter_map(|p| environment_file(p))
        .map(str::to_owned)
        .collect()
}

/// The environments a deployment of a commit covers: those it declares, and those `store`
/// has resources of that it no longer declares (their file was removed: their resources are to
/// be deleted, through the deletion guard).
pub fn environments_to_deploy(
    layout: &Layout,
    store: Option<&Store>,
) -> Result<BTreeSet<String>, StateError> {
    let mut envs = environments_in(layout);
    if let Some(store) = store {
        envs.extend(store.environments_with_resources()?);
    }
    Ok(envs)
}

/// Loads the model and builds every environment of `envs`.
pub fn build(snapshot: &Snapshot, envs: &[String], host: Host<'_>) -> Result<Built, Rejected> {
    let reject = |errors: Vec<String>| Rejected {
        envs: envs.to_vec(),
        errors,
    };
    let repo: Repository = model::load_cached(&snapshot.files, &mut LoadCache::default())
        .map_err(|errors| reject(errors.iter().map(ToString::to_string).collect()))?;
    let mut graphs = Vec::new();
    let mut errors = Vec::new();
    for env in &repo.environments {
        if !envs.contains(&env.id) {
            continue;
        }
        match graph::build(&repo, env) {
            Ok(g) => {
                errors.extend(host_errors(&repo, &g, host));
                graphs.push(g);
            }
            Err(errs) => errors.extend(errs.iter().map(|e| format!("environment {}: {e}", env.id))),
        }
    }
    if errors.is_empty() {
        Ok(Built { graphs })
    } else {
        errors.dedup();
        Err(reject(errors))
    }
}

/// What stops a graph that built from being applied on this host: a driver or a secret store
/// it names that the host does not offer, inputs its driver does not take, an output read that
/// its driver does not give.
fn host_errors(repo: &Repository, graph: &ResourceGraph, host: Host<'_>) -> Vec<String> {
    let mut errors = unknown_drivers(repo, graph, host.drivers);
    errors.extend(crate::preflight::problems(repo, graph, host.drivers));
    errors.extend(unusable_stored_secrets(graph, host.stores));
    errors
}

impl Built {
    /// Reads every secret the graphs take from a secret store (see [`read_stored_secrets`]).
    pub fn read_stored_secrets(&mut self, stores: &SecretStores) -> Result<(), Rejected> {
        let mut graphs: Vec<&mut ResourceGraph> = self.graphs.iter_mut().collect();
        read_stored_secrets(&mut graphs, stores)
    }
}

/// Reads every secret `graphs` take from a secret store, each once, and puts the values where
/// they are read. Planning and applying need them; validating does not. A secret that cannot be
/// read rejects the commit.
pub fn read_stored_secrets(
    graphs: &mut [&mut ResourceGraph],
    stores: &SecretStores,
) -> Result<(), Rejected> {
    {
        let mut wanted: BTreeMap<&StoreRef, &SourceLocation> = BTreeMap::new();
        for g in graphs.iter() {
            for (secret, location) in g.stored_secrets() {
                wanted.entry(secret).or_insert(location);
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let refs: Vec<(&str, &str, Option<&str>)> = wanted
            .keys()
            .map(|s| (s.store.as_str(), s.reference.as_str(), s.version.as_deref()))
            .collect();
        let read = stores.read_all(&refs);
        let mut values: HashMap<StoreRef, serde_json::Value> = HashMap::new();
        let mut errors = Vec::new();
        for ((secret, location), result) in wanted.into_iter().zip(read) {
            match result {
                Ok(v) => {
                    values.insert(secret.clone(), v);
                }
                Err(e) => errors.push(format!("{location}: secret_refs: {e}")),
            }
        }
        if !errors.is_empty() {
            errors.sort();
            return Err(Rejected {
                envs: graphs.iter().map(|g| g.env.clone()).collect(),
                errors,
            });
        }
        for g in graphs.iter_mut() {
            g.fill_stored_secrets(&values);
        }
        Ok(())
    }
}

/// A definition that names a secret store the host does not configure, or a ref or version
/// its store cannot serve, cannot be applied; this much is known without reading a secret.
fn unusable_stored_secrets(graph: &ResourceGraph, stores: &SecretStores) -> Vec<String> {
    graph
        .stored_secrets()
        .into_iter()
        .filter_map(|(secret, location)| {
            let error = stores
                .check(&secret.store, &secret.reference, secret.version.as_deref())
                .err()?;
            Some(match error {
                StoreError::UnknownStore { .. } => {
                    format!("{location}: secret_refs: {error}: add it under secret_stores")
                }
                _ => format!("{location}: secret_refs: {error}"),
            })
        })
        .collect()
}

/// A definition whose `driver_type` has no driver cannot be applied.
fn unknown_drivers(repo: &Repository, graph: &ResourceGraph, drivers: &Registry) -> Vec<String> {
    let used: BTreeSet<(&str, &str)> = graph
        .nodes()
        .filter(|n| drivers.get(&n.driver_type).is_none())
        .map(|n| (n.definition.as_str(), n.driver_type.as_str()))
        .collect();
    used.into_iter()
        .map(|(def, driver)| {
            let location = repo
                .definitions
                .iter()
                .find(|d| d.id == def)
                .map(|d| d.locate("driver_type").to_string())
                .unwrap_or_default();
            format!(
                "{location}: definition '{def}' uses driver_type '{driver}', which is not \
                 registered (registered: {})",
                drivers.names().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

/// Bumped when what a graph is built into changes without gitplane's version changing, so
/// fingerprints recorded before do not match.
const GRAPH_FORMAT: u32 = 1;

/// What the host adds to every app's fingerprint: the drivers and secret stores it offers,
/// which decide whether a commit is accepted.
pub fn host_print(host: Host<'_>) -> String {
    let mut parts: Vec<String> = host
        .drivers
        .names()
        .map(|d| format!("driver\0{d}"))
        .collect();
    parts.extend(host.stores.describe());
    digest(parts.iter().map(String::as_str))
}

/// Each app's fingerprint in `env` at the commit of `layout`: a digest of its folder's tree id
/// and of everything the whole environment's graph is made of (the definitions folder, the
/// environment's file, the settings, misplaced workload files, the host's drivers and stores,
/// gitplane's version). Two commits that give an app the same fingerprint give it the same
/// resources, so an app whose fingerprint a deployment recorded need not be read again.
pub fn fingerprints(layout: &Layout, env: &str, host_print: &str) -> BTreeMap<String, String> {
    let version = format!("{}/{GRAPH_FORMAT}", env!("CARGO_PKG_VERSION"));
    let mut shared = vec![
        "gitplane/app-fingerprint/v1".to_owned(),
        version,
        env.to_owned(),
        host_print.to_owned(),
    ];
    for (path, id) in &layout.shared {
        let other_env = environment_file(path).is_some_and(|e| e != env);
        if !other_env {
            shared.push(format!("{path}\0{id}"));
        }
    }
    let shared = digest(shared.iter().map(String::as_str));
    layout
        .apps
        .iter()
        .map(|(app, tree)| (app.clone(), digest([shared.as_str(), app, tree])))
        .collect()
}

fn digest<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    crate::graph::hex(&hasher.finalize())
}

/// Which part of an environment a deployment looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The apps looked at; `None`: every one, and every recorded resource outside the graph is
    /// an orphan.
    pub apps: Option<BTreeSet<String>>,
    /// Each app's fingerprint at this commit (apps of the commit's tree).
    pub fingerprints: BTreeMap<String, String>,
    /// The apps not looked at: their fingerprints are as recorded, so nothing of theirs changes.
    pub unchanged_apps: usize,
    /// Their resources.
    pub unchanged_resources: i64,
}

impl Scope {
    /// Every app of the environment.
    pub fn whole(fingerprints: BTreeMap<String, String>) -> Scope {
        Scope {
            apps: None,
            fingerprints,
            unchanged_apps: 0,
            unchanged_resources: 0,
        }
    }

    /// The apps whose fingerprint is new or changed, and those gone from the tree that still
    /// have resources or a fingerprint; the whole environment when that is every app.
    /// `unprinted` are the apps with resources and no fingerprint
    /// ([`Store::apps_without_fingerprint`]): with `recorded`, every app that has resources.
    pub fn of_changes(
        fingerprints: BTreeMap<String, String>,
        recorded: &HashMap<String, AppFingerprint>,
        unprinted: &BTreeSet<String>,
    ) -> Scope {
        let mut changed = BTreeSet::new();
        let mut unchanged_apps = 0;
        let mut unchanged_resources = 0;
        for (app, fingerprint) in &fingerprints {
            match recorded.get(app) {
                Some(r) if r.fingerprint == *fingerprint => {
                    unchanged_apps += 1;
                    unchanged_resources += r.resources;
                }
                _ => {
                    changed.insert(app.clone());
                }
            }
        }
        for app in recorded.keys().chain(unprinted) {
            if !fingerprints.contains_key(app) {
                changed.insert(app.clone());
            }
        }
        if unchanged_apps == 0 {
            return Scope::whole(fingerprints);
        }
        Scope {
            apps: Some(changed),
            fingerprints,
            unchanged_apps,
            unchanged_resources,
        }
    }

    pub fn is_whole(&self) -> bool {
        self.apps.is_none()
    }

    /// [`Scope::of_changes`] of `env` as `store` records it. When the census of the
    /// environment's newest deployment has no app without fingerprint and the digest of the
    /// fingerprints it left equals that of `fingerprints`, nothing changed: no fingerprint is
    /// read one by one (10 000 rows at 50 000 resources).
    pub fn of_changes_in(
        store: &Store,
        env: &str,
        fingerprints: BTreeMap<String, String>,
    ) -> Result<Scope, StateError> {
        let census = store.census(env)?;
        if let Some(census) = &census
            && census.unprinted.is_empty()
            && let Some((digest, resources)) = &census.prints
            && !fingerprints.is_empty()
            && *digest == gitplane_state::fingerprints_digest(prints(&fingerprints))
        {
            return Ok(Scope {
                apps: Some(BTreeSet::new()),
                unchanged_apps: fingerprints.len(),
                unchanged_resources: *resources,
                fingerprints,
            });
        }
        let unprinted = match census {
            Some(census) => census.unprinted,
            None => store.apps_without_fingerprint(env)?,
        };
        Ok(Scope::of_changes(
            fingerprints,
            &store.fingerprints(env)?,
            &unprinted,
        ))
    }

    /// What the digest of the fingerprints a deployment of this scope leaves recorded is made
    /// of, with the sum of their resources: every app of the commit but `cleared` (those it
    /// did not look at keep fingerprints equal to the commit's; those it looked at are
    /// recorded with the commit's or cleared). `clean` are the resources of those it recorded.
    pub fn prints_after(&self, cleared: &[&str], clean: i64) -> (String, i64) {
        let cleared: std::collections::HashSet<&str> = cleared.iter().copied().collect();
        let digest = gitplane_state::fingerprints_digest(
            prints(&self.fingerprints).filter(|(app, _)| !cleared.contains(app)),
        );
        (digest, self.unchanged_resources + clean)
    }
}

fn prints(fingerprints: &BTreeMap<String, String>) -> impl Iterator<Item = (&str, &str)> {
    fingerprints.iter().map(|(a, f)| (a.as_str(), f.as_str()))
}

/// One environment of a commit, ready to plan or apply: its graph, whole or of the apps that
/// changed, and the scope it covers.
#[derive(Debug, Clone)]
pub struct Target {
    pub graph: ResourceGraph,
    pub scope: Scope,
}

/// How a deployment of one environment chooses its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The apps that changed since their fingerprints were recorded.
    Changes,
    /// Every app: drift runs, approvals, `resolve`, and whatever has no state yet.
    Whole,
}

/// Builds what a deployment of `env` at the commit of `layout` looks at: the apps that changed
/// (with `Reach::Changes` and a store), else everything. Falls back to the whole environment
/// where apps meet through global resources in ways a part cannot see: a global resource that
/// selects its dependents (`<`), or one that a changed app stops using.
pub fn target(
    repo: &ConfigRepo,
    layout: &Layout,
    env: &str,
    (store, reach): (Option<&Store>, Reach),
    host: Host<'_>,
    cache: &mut LoadCache,
) -> Result<Result<Target, Rejected>, DeployError> {
    if let Some(store) = store
        && !environments_in(layout).contains(env)
        && store.resource_count(env)? > 0
    {
        tracing::warn!(
            env,
            "the commit has no file for this environment: its resources go"
        );
        return Ok(Ok(Target {
            graph: ResourceGraph::removed(env),
            scope: Scope::whole(BTreeMap::new()),
        }));
    }
    let fingerprints = fingerprints(layout, env, &host_print(host));
    let scope = match (store, reach) {
        // A global orphan kept after its delete failed is retried by a whole deployment.
        (Some(store), Reach::Changes) if !store.has_global_orphans(env)? => {
            Scope::of_changes_in(store, env, fingerprints)?
        }
        _ => Scope::whole(fingerprints),
    };
    if let (Some(apps), Some(store)) = (&scope.apps, store) {
        let snapshot = repo.snapshot_of(&layout.commit, Some(apps))?;
        let graph = match build_one(&snapshot, env, Some(apps), host, cache) {
            Ok(graph) => graph,
            Err(rejected) => return Ok(Err(rejected)),
        };
        match needs_whole(store, env, apps, &graph)? {
            None => {
                tracing::info!(
                    env,
                    changed = apps.len(),
                    unchanged = scope.unchanged_apps,
                    "reading only the apps that changed: {} changed, {} as last deployed",
                    apps.len(),
                    scope.unchanged_apps
                );
                return Ok(Ok(Target { graph, scope }));
            }
            Some(why) => tracing::info!(env, "reading the whole environment: {why}"),
        }
    } else {
        tracing::info!(env, "reading the whole environment");
    }
    let snapshot = repo.snapshot(&layout.commit)?;
    Ok(
        build_one(&snapshot, env, None, host, cache).map(|graph| Target {
            graph,
            scope: Scope::whole(scope.fingerprints),
        }),
    )
}

/// What a deployment of each of `envs` at the commit of `layout` looks at (see [`target`]). The
/// commit is rejected as a whole when one environment does not load or build, each error told
/// once (a file that does not parse would otherwise be reported for every environment).
pub fn targets(
    repo: &ConfigRepo,
    layout: &Layout,
    envs: &[String],
    scope: (Option<&Store>, Reach),
    host: Host<'_>,
    cache: &mut LoadCache,
) -> Result<Result<Vec<Target>, Rejected>, DeployError> {
    let mut targets = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    for env in envs {
        match target(repo, layout, env, scope, host, cache)? {
            Ok(t) => targets.push(t),
            Err(rejected) => {
                for e in rejected.errors {
                    if !errors.contains(&e) {
                        errors.push(e);
                    }
                }
            }
        }
    }
    Ok(if errors.is_empty() {
        Ok(targets)
    } else {
        Err(Rejected {
            envs: envs.to_vec(),
            errors,
        })
    })
}

/// Reads the stored secrets of every target's graph (see [`read_stored_secrets`]).
pub fn read_target_secrets(targets: &mut [Target], stores: &SecretStores) -> Result<(), Rejected> {
    let mut graphs: Vec<&mut ResourceGraph> = targets.iter_mut().map(|t| &mut t.graph).collect();
    read_stored_secrets(&mut graphs, stores)
}

/// `env`'s graph at `commit` of the apps `apps` and the global resources they reach, with the
/// snapshot it was built from (only the files those apps need), for commands about part of an
/// environment (`explain`, `graph --app`): they cost in proportion to the part. The whole
/// environment is read instead when a global resource selects its dependents, which any app
/// may be (as deployments do, see [`target`]).
pub fn build_apps(
    repo: &ConfigRepo,
    commit: &str,
    env: &str,
    apps: &BTreeSet<String>,
    host: Host<'_>,
) -> Result<(Snapshot, Result<ResourceGraph, Rejected>), DeployError> {
    let mut cache = LoadCache::default();
    let snapshot = repo.snapshot_of(commit, Some(apps))?;
    let graph = build_one(&snapshot, env, Some(apps), host, &mut cache);
    let selector = graph.as_ref().ok().and_then(|g| {
        g.nodes()
            .find(|n| n.app.is_none() && n.selects_dependents())
            .map(|n| n.label())
    });
    if let Some(selector) = selector {
        tracing::info!(
            env,
            "reading the whole environment: global resource {selector} selects its dependents, \
             which any app may be"
        );
        let snapshot = repo.snapshot(commit)?;
        let graph = build_one(&snapshot, env, None, host, &mut cache);
        return Ok((snapshot, graph));
    }
    Ok((snapshot, graph))
}

/// Loads `snapshot` and builds `env`'s graph of `apps` (every app when `None`).
fn build_one(
    snapshot: &Snapshot,
    env: &str,
    apps: Option<&BTreeSet<String>>,
    host: Host<'_>,
    cache: &mut LoadCache,
) -> Result<ResourceGraph, Rejected> {
    let reject = |errors: Vec<String>| Rejected {
        envs: vec![env.to_owned()],
        errors,
    };
    let repo: Repository = tracing::debug_span!("parse files")
        .in_scope(|| model::load_cached(&snapshot.files, cache))
        .map_err(|errors| reject(errors.iter().map(ToString::to_string).collect()))?;
    let Some(environment) = repo.environments.iter().find(|e| e.id == env) else {
        return Err(reject(vec![format!(
            "environments/{env}.yaml: the commit has no environment '{env}'"
        )]));
    };
    let graph = tracing::debug_span!("build graph")
        .in_scope(|| graph::build_apps(&repo, environment, apps));
    let graph = graph.map_err(|errs| {
        reject(
            errs.iter()
                .map(|e| format!("environment {env}: {e}"))
                .collect(),
        )
    })?;
    let mut errors =
        tracing::debug_span!("check drivers").in_scope(|| host_errors(&repo, &graph, host));
    if errors.is_empty() {
        Ok(graph)
    } else {
        errors.dedup();
        Err(reject(errors))
    }
}

/// Why a graph of some apps cannot stand for them, if it cannot: a global resource in it selects
/// its dependents (which any app may be), or a changed app's recorded resources use a global one
/// the part no longer has (another app may still use it, or nobody).
fn needs_whole(
    store: &Store,
    env: &str,
    apps: &BTreeSet<String>,
    graph: &ResourceGraph,
) -> Result<Option<String>, StateError> {
    let selector = graph
        .nodes()
        .find(|n| n.app.is_none() && n.selects_dependents());
    if let Some(node) = selector {
        return Ok(Some(format!(
            "global resource {} selects its dependents, which any app may be",
            node.label()
        )));
    }
    let recorded = store.resources_of_apps(env, apps, true)?;
    let globals: HashMap<&str, &gitplane_state::ResourceRecord> = recorded
        .iter()
        .filter(|r| r.app.is_none())
        .map(|r| (r.guresid.as_str(), r))
        .collect();
    let consumers: Vec<&str> = recorded
        .iter()
        .filter(|r| r.app.is_some())
        .map(|r| r.guresid.as_str())
        .collect();
    let dropped = store
        .links_from(env, &consumers)?
        .into_iter()
        .find_map(|l| match globals.get(l.provider.as_str()) {
            Some(g) if !graph.contains(l.provider.as_str()) => Some(crate::plan::record_label(g)),
            _ => None,
        });
    Ok(dropped.map(|g| format!("a changed app no longer uses global resource {g}")))
}

/// What stops a commit from being read or built, besides the commit itself.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(transparent)]
    Repo(#[from] crate::repo::RepoError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// The pin (`gitplane rollback`) that holds `target`'s environment at a commit other than
/// `commit`, if any: then `commit` is not to be applied, and its plan (JSON counts) is recorded
/// with the pin as the newest commit held back.
pub fn held_by_pin(
    store: &Store,
    target: &Target,
    commit: &str,
) -> Result<Option<(gitplane_state::EnvPin, String)>, StateError> {
    let env = &target.graph.env;
    let Some(pin) = store.pin_of(env)? else {
        return Ok(None);
    };
    if pin.commit_id == commit {
        return Ok(None);
    }
    let (recorded, links) = recorded_in_scope(store, target)?;
    let plan = crate::plan::plan(&target.graph, &recorded, &links);
    let summary = pin_plan_summary(&plan);
    store.pin_waiting(env, commit, &summary)?;
    Ok(Some((pin, summary)))
}

/// What a plan held back by a pin would do, as the JSON counts the pin records.
pub fn pin_plan_summary(plan: &crate::plan::Plan) -> String {
    use crate::plan::Action;
    let count = |actions: &[Action]| actions.iter().map(|a| plan.count(*a)).sum::<usize>();
    serde_json::json!({
        "create": count(&[Action::Create]),
        "update": count(&[Action::Update, Action::MaybeUpdate]),
        "delete": count(&[Action::Delete, Action::Forget]),
        "unchanged": count(&[Action::Unchanged, Action::Pinned]),
    })
    .to_string()
}

/// The recorded resources and links an apply of `target` looks at: all of its environment's,
/// or those of the apps it covers and of the global resources its graph has (a global one
/// outside it stays, since other apps may use it).
pub fn recorded_in_scope(
    store: &Store,
    target: &Target,
) -> Result<
    (
        Vec<gitplane_state::ResourceRecord>,
        Vec<gitplane_state::LinkRecord>,
    ),
    StateError,
> {
    let env = &target.graph.env;
    match &target.scope.apps {
        None => Ok((store.resources(env)?, store.links(env)?)),
        Some(apps) => {
            let mut recorded = store.resources_of_apps(env, apps, true)?;
            recorded.retain(|r| r.app.is_some() || target.graph.contains(r.guresid.as_str()));
            // A resource not recorded yet may have links already: an earlier run that could
            // not provision it recorded them.
            let mut ids: Vec<&str> = recorded.iter().map(|r| r.guresid.as_str()).collect();
            ids.extend(target.graph.nodes().map(|n| n.guresid.as_str()));
            ids.sort_unstable();
            ids.dedup();
            let links = store.links_from(env, &ids)?;
            Ok((recorded, links))
        }
    }
}
