//! Building an environment's resource graph from the loaded repository (docs/repository.md, section 3).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::convert::Infallible;

use daggy::{Dag, NodeIndex};
use serde_json::Value;

use super::choose::choose;
use super::matching::MatchContext;
use super::{Binding, EdgeKind, GuresId, InterfaceUse, Origin, ResourceGraph, ResourceNode};
use crate::model::placeholder::{
    ContextKey, Expr, Read, Segment, SelectorDirection, path_to_string,
};
use crate::model::template::{Mapped, Template, lookup_path};
use crate::model::{
    App, AppValues, Choice, DEFAULT_CLASS, Definition, DriverAccount, Environment, Repository,
    SharedResource, SourceLocation, Workload,
};

/// Why an environment's graph cannot be built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BuildError {
    #[error(
        "{location}: no definition of type '{res_type}' matches {resource} ({context}); {}",
        closest(candidates)
    )]
    NoMatch {
        location: SourceLocation,
        resource: String,
        res_type: String,
        context: String,
        candidates: Vec<String>,
    },
    #[error(
        "{location}: workload '{workload}' reads '${{resources.{name}...}}', but its resources \
         section declares no '{name}'"
    )]
    UnknownScoreResource {
        location: SourceLocation,
        workload: String,
        name: String,
    },
    #[error("{location}: workload '{workload}' reads '${{metadata.{path}}}', which is not set")]
    UnknownMetadata {
        location: SourceLocation,
        workload: String,
        path: String,
    },
    #[error(
        "dependency loop: {}: a resource cannot depend on itself, directly or through others; \
         remove one of these references",
        members.join(" -> ")
    )]
    Loop {
        /// Each resource on the loop with the definition that made the edge, ending where it
        /// started.
        members: Vec<String>,
    },
    #[error(
        "{location}: shared resource {resource} is requested with different params by \
         workloads '{first}' and '{second}': make them equal or give them different ids"
    )]
    SharedParamsConflict {
        location: SourceLocation,
        resource: String,
        first: String,
        second: String,
    },
    #[error(
        "{location}: the selector '{selector}' of {resource} names a resource that is not in the \
         graph: selectors add edges, never resources"
    )]
    SelectorBase {
        location: SourceLocation,
        selector: String,
        resource: String,
    },
    #[error(
        "{location}: no resource provides the $ids {ids} that '{resource}' asks for, and \
         definition '{definition}', which would create one, does not declare them under provides"
    )]
    InterfaceUnserved {
        location: SourceLocation,
        resource: String,
        ids: String,
        definition: String,
    },
    #[error(
        "{location}: environment '{env}' has no shared resource '{name}' (it has: {known}); \
         declare it under shared_resources in environments/{env}.yaml"
    )]
    UnknownSharedResource {
        location: SourceLocation,
        env: String,
        name: String,
        known: String,
    },
    #[error(
        "{location}: shared resource '{name}' is a '{actual}', but the request asks for a \
         '{wanted}'"
    )]
    SharedResourceType {
        location: SourceLocation,
        name: String,
        wanted: String,
        actual: String,
    },
    #[error(
        "{location}: the driver_account of {resource} is the account of {target} \
         ('{written}'), whose definition '{definition}' names no driver_account: give it one"
    )]
    AccountOfUnnamed {
        location: SourceLocation,
        resource: String,
        written: String,
        target: String,
        definition: String,
    },
    #[error(
        "{location}: workload '{workload}' reads '${{values.{key}}}', which app '{app}' does not \
         set for environment '{env}': add it under values (or environments.{env}) in \
         workloads/{app}/values.yaml"
    )]
    UnknownValue {
        location: SourceLocation,
        workload: String,
        key: String,
        app: String,
        env: String,
    },
    #[error(
        "{location}: workload '{workload}' reads '${{shared.{id}...}}', but no workload of app \
         '{app}' declares a resource with 'id: {id}' and environment '{env}' has no \
         shared_resources entry '{id}'"
    )]
    UnknownSharedId {
        location: SourceLocation,
        workload: String,
        id: String,
        app: String,
        env: String,
    },
    #[error(
        "{location}: workload '{workload}' reads '${{shared.{id}...}}', which names several \
         resources shared under id '{id}': {}; give them different ids",
        resources.join(", ")
    )]
    AmbiguousShared {
        location: SourceLocation,
        workload: String,
        id: String,
        resources: Vec<String>,
    },
    #[error(
        "{location}: resource '{name}' of type 'service' names workload '{name}' of app '{app}', \
         which has no such workload (it has: {known}); a service resource is named after the \
         workload it reaches"
    )]
    UnknownServiceWorkload {
        location: SourceLocation,
        app: String,
        name: String,
        known: String,
    },
    #[error(
        "{location}: workload '{workload}' reads '${{resources.{name}.{path}}}', but service \
         '{name}' gives only name, ports.PORT-NAME and (with one port) port"
    )]
    UnknownServiceOutput {
        location: SourceLocation,
        workload: String,
        name: String,
        path: String,
    },
    #[error("{location}: environment '{env}' lists app '{app}', which has no workloads")]
    UnknownApp {
        location: SourceLocation,
        env: String,
        app: String,
    },
}

fn closest(candidates: &[String]) -> String {
    if candidates.is_empty() {
        "no definition of that type exists: add one under definitions/".to_owned()
    } else {
        format!("closest candidates: {}", candidates.join(", "))
    }
}

/// Builds the graph of `env`; returns every error found, not only the first.
pub fn build(repo: &Repository, env: &Environment) -> Result<ResourceGraph, Vec<BuildError>> {
    build_apps(repo, env, None)
}

/// Builds the part of `env`'s graph that the apps of `only` make: their resources and the
/// global ones they reach (every app when `None`). Each app's resources are a function of its
/// own workloads, the definitions and the environment, so a part built alone equals that part
/// of the whole graph, but for selectors held by global resources, which see every app.
pub fn build_apps(
    repo: &Repository,
    env: &Environment,
    only: Option<&std::collections::BTreeSet<String>>,
) -> Result<ResourceGraph, Vec<BuildError>> {
    let provided: Vec<Definition> = env
        .shared_resources
        .values()
        .filter_map(|r| {
            r.provided.as_ref().map(|outputs| {
                super::choose::provided_definition(&r.name, &r.res_type, outputs, &r.location)
            })
        })
        .collect();
    let catalog = Catalog::new(repo, &provided);
    let apps: Vec<(&String, &App)> = repo
        .apps
        .iter()
        .filter(|(id, _)| env.runs_app(id) && only.is_none_or(|o| o.contains(*id)))
        .collect();
    // Asking for the cores reads the process's CPU limits: only when it could matter.
    let threads = if apps.len() >= IN_PARTS_FROM || cfg!(test) {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        1
    };
    let built = if threads > 1 && apps.len() >= IN_PARTS_FROM {
        build_in_parts(repo, env, &catalog, &apps, threads)
    } else {
        None
    };
    let built = built.unwrap_or_else(|| build_in_turn(repo, env, &catalog, &apps, only));
    #[cfg(test)]
    if threads > 1 && apps.len() < IN_PARTS_FROM {
        // The core's tests build small graphs: each is built in parts too, and must come out
        // the same, node for node and edge for edge (see [`shape`]).
        let parts = build_in_parts(repo, env, &catalog, &apps, 3)
            .unwrap_or_else(|| build_in_turn(repo, env, &catalog, &apps, only));
        assert_eq!(
            shape(&parts),
            shape(&built),
            "a graph built in parts differs"
        );
    }
    built
}

/// How many apps make building in parts worth its threads.
const IN_PARTS_FROM: usize = 64;

/// Builds the graph one app after another, every app on the same builder.
fn build_in_turn(
    repo: &Repository,
    env: &Environment,
    catalog: &Catalog<'_>,
    apps: &[(&String, &App)],
    only: Option<&std::collections::BTreeSet<String>>,
) -> Result<ResourceGraph, Vec<BuildError>> {
    let mut b = Builder::new(repo, env, catalog);
    b.errors = unknown_apps(repo, env, only);
    for (app_id, app) in apps {
        b.add_app(app_id, app);
    }
    b.complete()
}

/// Builds the apps in `threads` runs of consecutive apps, each run in turn on a builder of its
/// own and the runs at once, then joins the runs' parts to the first's in app order, as
/// [`build_in_turn`] would have added them: the same nodes with the same indices and the same
/// edges in the same order, whatever the threads' timing. An app's resources are a function of
/// its own files, the definitions and the environment; the global resources it reaches are
/// built again by each run that reaches them, and kept from the first.
///
/// `None` when something would be reported: the errors are then found by building in turn,
/// which reports them in the order it meets them.
fn build_in_parts(
    repo: &Repository,
    env: &Environment,
    catalog: &Catalog<'_>,
    apps: &[(&String, &App)],
    threads: usize,
) -> Option<Result<ResourceGraph, Vec<BuildError>>> {
    if !unknown_apps(repo, env, None).is_empty() {
        return None;
    }
    let chunk = apps.len().div_ceil(threads).max(1);
    let builders: Vec<Builder<'_>> = std::thread::scope(|scope| {
        let workers: Vec<_> = apps
            .chunks(chunk)
            .enumerate()
            .map(|(i, apps)| {
                scope.spawn(move || {
                    let mut b = Builder::new(repo, env, catalog);
                    // The first chunk's builder is the one the others join.
                    b.record_edges = i > 0;
                    for (app_id, app) in apps {
                        b.add_app(app_id, app);
                    }
                    b
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut builders = builders.into_iter();
    let mut b = builders.next()?;
    if !b.errors.is_empty() {
        return None;
    }
    for part in builders {
        if !b.absorb(part.into_part()) {
            return None;
        }
    }
    Some(b.complete())
}

/// An `apps` entry of `env` naming an app the repository does not have, for each such entry
/// of the apps of `only` (every app when `None`).
fn unknown_apps(
    repo: &Repository,
    env: &Environment,
    only: Option<&std::collections::BTreeSet<String>>,
) -> Vec<BuildError> {
    env.apps
        .iter()
        .flatten()
        .filter(|app| only.is_none_or(|o| o.contains(*app)) && !repo.apps.contains_key(*app))
        .map(|app| BuildError::UnknownApp {
            location: env.location.clone(),
            env: env.id.clone(),
            app: app.clone(),
        })
        .collect()
}

/// The definitions, by type and by id, that every builder of an environment's graph reads.
struct Catalog<'r> {
    by_type: HashMap<&'r str, Vec<&'r Definition>>,
    /// Every definition by id, user-provided resources' included: class-refs name them.
    by_id: BTreeMap<&'r str, &'r Definition>,
}

impl<'r> Catalog<'r> {
    fn new(repo: &'r Repository, provided: &'r [Definition]) -> Self {
        let mut by_type: HashMap<&str, Vec<&Definition>> = HashMap::new();
        for def in &repo.definitions {
            by_type.entry(def.res_type.as_str()).or_default().push(def);
        }
        let by_id = repo
            .definitions
            .iter()
            .chain(provided)
            .map(|d| (d.id.as_str(), d))
            .collect();
        Catalog { by_type, by_id }
    }
}

/// A run of apps' part of the graph, built on its own builder (see [`build_in_parts`]): its
/// nodes in the order they were made, with what was recorded about them by node index in that
/// order.
struct Part<'r> {
    nodes: Vec<(ResourceNode, &'r Definition)>,
    /// Every `edge` call, in order: replayed, they make the same edges and report the same
    /// loops as when the calls were made on one builder.
    edges: Vec<(NodeIndex, NodeIndex, EdgeKind)>,
    match_dependents: Vec<(NodeIndex, NodeIndex)>,
    selectors: Vec<NodeIndex>,
    accounts_of: Vec<(NodeIndex, NodeIndex)>,
    spec_hashes: Vec<(NodeIndex, String)>,
    /// The part found something to report.
    failed: bool,
}

struct Request<'a> {
    app: Option<&'a str>,
    res_type: &'a str,
    class: &'a str,
    res_id: &'a str,
    params: Value,
    origin: Origin,
    choice: &'a Choice,
}

const BY_CRITERIA: &Choice = &Choice::Criteria;

struct Builder<'r> {
    env: &'r Environment,
    /// Each app's values, which its Score files read as `${values.KEY}`.
    values: &'r BTreeMap<String, std::sync::Arc<AppValues>>,
    /// What `${context.org.id}` reads.
    org: &'r str,
    catalog: &'r Catalog<'r>,
    dag: Dag<ResourceNode, EdgeKind>,
    index: HashMap<GuresId, NodeIndex>,
    /// The definition each node matched, to expand it.
    matched: HashMap<NodeIndex, &'r Definition>,
    /// Each app's nodes: what a request by interface may reuse, without a walk of every app.
    of_app: HashMap<String, Vec<NodeIndex>>,
    /// Resources that matched no definition, so each is reported once.
    unmatched: HashSet<GuresId>,
    queue: VecDeque<NodeIndex>,
    /// `(co-provisioning, co-provisioned)` pairs whose dependents must also depend on the second.
    match_dependents: Vec<(NodeIndex, NodeIndex)>,
    /// Nodes that hold selectors.
    selectors: Vec<NodeIndex>,
    /// `driver_account: ${resources.DESC.account}`: each such node and the node DESC names,
    /// whose account it takes once every node exists.
    accounts_of: Vec<(NodeIndex, NodeIndex)>,
    /// Each workload node's Score file, hashed.
    spec_hashes: HashMap<NodeIndex, String>,
    loops: HashSet<Vec<GuresId>>,
    errors: Vec<BuildError>,
    /// Whether `edge` calls are kept in `edge_calls`: a run's [`Part`] is made of them.
    record_edges: bool,
    edge_calls: Vec<(NodeIndex, NodeIndex, EdgeKind)>,
}

impl<'r> Builder<'r> {
    fn new(repo: &'r Repository, env: &'r Environment, catalog: &'r Catalog<'r>) -> Self {
        Builder {
            env,
            values: &repo.values,
            org: &repo.org,
            catalog,
            dag: Dag::new(),
            index: HashMap::new(),
            matched: HashMap::new(),
            of_app: HashMap::new(),
            unmatched: HashSet::new(),
            queue: VecDeque::new(),
            match_dependents: Vec::new(),
            selectors: Vec::new(),
            accounts_of: Vec::new(),
            spec_hashes: HashMap::new(),
            loops: HashSet::new(),
            errors: Vec::new(),
            record_edges: false,
            edge_calls: Vec::new(),
        }
    }

    /// Adds app `app_id`'s resources and the global ones they reach.
    fn add_app(&mut self, app_id: &'r str, app: &'r App) {
        for res_type in &self.env.implicit_resources {
            self.ensure(
                Request {
                    app: Some(app_id),
                    res_type,
                    class: DEFAULT_CLASS,
                    res_id: res_type,
                    params: Value::Null,
                    origin: Origin::Implicit,
                    choice: BY_CRITERIA,
                },
                &self.env.location,
            );
        }
        let mut pending = Vec::new();
        for workload in app.workloads.values() {
            if let Some(p) = self.workload(app_id, workload) {
                pending.push((workload, p));
            }
        }
        self.drain();
        // Requests by interface reuse what exists: they are served once everything else of
        // the app is in the graph.
        for (workload, p) in &mut pending {
            self.interfaces(app_id, workload, p);
        }
        self.drain();
        for (workload, p) in &mut pending {
            self.services(app_id, app, workload, p);
        }
        for (workload, p) in pending {
            self.workload_spec(app_id, workload, p);
        }
        // `${shared.ID}` may name an environment's global resource no request added yet.
        self.drain();
    }

    /// Once every app is in: the edges that need every node, then the graph.
    fn complete(mut self) -> Result<ResourceGraph, Vec<BuildError>> {
        self.match_dependents();
        self.select();
        self.accounts();
        self.finish()
    }

    /// What this builder made of its apps, for [`Builder::absorb`].
    fn into_part(self) -> Part<'r> {
        let failed = !self.errors.is_empty();
        let matched = self.matched;
        let nodes = self
            .dag
            .into_graph()
            .into_nodes_edges()
            .0
            .into_iter()
            .enumerate()
            .map(|(i, node)| (node.weight, matched[&NodeIndex::new(i)]))
            .collect();
        Part {
            nodes,
            edges: self.edge_calls,
            match_dependents: self.match_dependents,
            selectors: self.selectors,
            accounts_of: self.accounts_of,
            spec_hashes: self.spec_hashes.into_iter().collect(),
            failed,
        }
    }

    /// Adds a part as if its apps had been built on this builder: its new nodes in the
    /// order they were made, then its edge calls in order. What the part did to a node this
    /// builder had already (a global resource an earlier app reached) was done here when that
    /// node was made, and is left out: expanding a global resource makes only global ones, so
    /// an edge whose two ends were here already came from such an expansion.
    ///
    /// False when the part cannot stand for building the app here: it, or adding it, found
    /// something to report.
    fn absorb(&mut self, part: Part<'r>) -> bool {
        if part.failed {
            return false;
        }
        let before = self.dag.node_count();
        let mut at: Vec<NodeIndex> = Vec::with_capacity(part.nodes.len());
        for (node, def) in part.nodes {
            if let Some(&n) = self.index.get(&node.guresid) {
                // Requested by this app too: a global resource's params are its entry's, but
                // a conflict would be reported here, which building in turn does best.
                if matches!(*node.origin, Origin::Requested { .. })
                    && matches!(*self.dag[n].origin, Origin::Requested { .. })
                    && self.dag[n].params != node.params
                {
                    return false;
                }
                at.push(n);
                continue;
            }
            let guresid = node.guresid.clone();
            let n = self.dag.add_node(node);
            self.index.insert(guresid, n);
            self.matched.insert(n, def);
            at.push(n);
        }
        let new = |n: NodeIndex| at[n.index()].index() >= before;
        for (from, to, kind) in part.edges {
            if new(from) || new(to) {
                self.edge(at[from.index()], at[to.index()], kind);
            }
        }
        let pairs = |pairs: Vec<(NodeIndex, NodeIndex)>| {
            pairs
                .into_iter()
                .filter(|&(n, _)| new(n))
                .map(|(n, m)| (at[n.index()], at[m.index()]))
                .collect::<Vec<_>>()
        };
        self.match_dependents.extend(pairs(part.match_dependents));
        self.accounts_of.extend(pairs(part.accounts_of));
        self.selectors.extend(
            part.selectors
                .into_iter()
                .filter(|&n| new(n))
                .map(|n| at[n.index()]),
        );
        self.spec_hashes.extend(
            part.spec_hashes
                .into_iter()
                .map(|(n, hash)| (at[n.index()], hash)),
        );
        self.errors.is_empty()
    }

    fn finish(mut self) -> Result<ResourceGraph, Vec<BuildError>> {
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        // What the definition and the request say, hashed once per definition.
        let mut of_definition: HashMap<&str, String> = HashMap::new();
        for def in self.matched.values() {
            of_definition
                .entry(def.id.as_str())
                .or_insert_with(|| hex_digest(&[def.id.as_bytes(), def.source.as_bytes()]));
        }
        let hash_of = |i: usize| {
            let n = NodeIndex::new(i);
            let node = &self.dag[n];
            let request = match &node.params {
                Template::Value(v) => v.to_string(),
                // A workload: its Score file, whose text was hashed when it was read.
                _ => self.spec_hashes.get(&n).cloned().unwrap_or_default(),
            };
            hex_digest(&[
                of_definition[self.matched[&n].id.as_str()].as_bytes(),
                node.driver_type.as_bytes(),
                node.driver_account.as_deref().unwrap_or("").as_bytes(),
                request.as_bytes(),
            ])
        };
        let hashes = on_cores(self.dag.node_count(), &hash_of);
        for (i, hash) in hashes.into_iter().enumerate() {
            self.dag[NodeIndex::new(i)].template_hash = hash;
        }
        Ok(ResourceGraph::new(self.env, self.org, self.dag, self.index))
    }

    /// The node for a resource, created and matched if new. `None` when nothing matches.
    fn ensure(&mut self, req: Request<'_>, requested_at: &SourceLocation) -> Option<NodeIndex> {
        let guresid = GuresId::new(&self.env.id, req.app, req.res_type, req.class, req.res_id);
        if let Some(&n) = self.index.get(&guresid) {
            self.check_shared_params(n, &req, requested_at);
            return Some(n);
        }
        if self.unmatched.contains(&guresid) {
            return None;
        }
        let ctx = MatchContext {
            app_id: req.app,
            env_id: &self.env.id,
            env_type: &self.env.env_type,
            res_type: req.res_type,
            class: req.class,
            res_id: req.res_id,
        };
        let candidates = self
            .catalog
            .by_type
            .get(req.res_type)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let def = match choose(candidates, &self.catalog.by_id, &ctx, req.choice) {
            Ok(def) => def,
            Err(no) => {
                self.errors.push(BuildError::NoMatch {
                    location: requested_at.clone(),
                    resource: super::label(req.app, req.res_type, req.class, req.res_id),
                    res_type: req.res_type.to_owned(),
                    context: ctx.to_string(),
                    candidates: no.candidates,
                });
                self.unmatched.insert(guresid);
                return None;
            }
        };
        let node = ResourceNode {
            guresid: guresid.clone(),
            app: req.app.map(str::to_owned),
            res_type: req.res_type.to_owned(),
            class: req.class.to_owned(),
            res_id: req.res_id.to_owned(),
            definition: def.id.clone(),
            driver_type: def.driver_type.clone(),
            // `${resources.DESC.account}` is filled in by `accounts`.
            driver_account: match &def.driver_account {
                Some(DriverAccount::Named(account)) => Some(account.clone()),
                Some(DriverAccount::Of { .. }) | None => None,
            },
            deletion_policy: def.deletion_policy,
            auto_update: def.auto_update,
            template_hash: String::new(),
            interfaces: Vec::new(),
            params: Template::Value(req.params),
            values: Template::default(),
            secrets: Template::default(),
            origin: Box::new(req.origin),
        };
        let app = node.app.clone();
        let n = self.dag.add_node(node);
        if let Some(app) = app {
            self.of_app.entry(app).or_default().push(n);
        }
        self.index.insert(guresid, n);
        self.matched.insert(n, def);
        self.queue.push_back(n);
        Some(n)
    }

    fn check_shared_params(&mut self, n: NodeIndex, req: &Request<'_>, at: &SourceLocation) {
        let (
            Origin::Requested {
                workload: first, ..
            },
            Origin::Requested {
                workload: second, ..
            },
        ) = (&*self.dag[n].origin, &req.origin)
        else {
            return;
        };
        if self.dag[n].params != Template::Value(req.params.clone()) {
            self.errors.push(BuildError::SharedParamsConflict {
                location: at.clone(),
                resource: self.dag[n].label(),
                first: first.clone(),
                second: second.clone(),
            });
        }
    }

    fn workload(&mut self, app: &str, workload: &'r Workload) -> Option<PendingWorkload> {
        let res_id = format!("modules.{}", workload.name);
        let w = self.ensure(
            Request {
                app: Some(app),
                res_type: "workload",
                class: DEFAULT_CLASS,
                res_id: &res_id,
                params: Value::Null,
                origin: Origin::Workload {
                    file: workload.file.clone(),
                },
                choice: BY_CRITERIA,
            },
            &SourceLocation::file(&workload.file),
        )?;
        let mut by_name: HashMap<String, NodeIndex> = HashMap::new();
        for (name, res) in &workload.resources {
            if matches!(res.choice, Choice::Interface(_)) || is_service(res) {
                continue;
            }
            let origin = Origin::Requested {
                workload: workload.name.clone(),
                name: name.clone(),
                location: res.location.clone(),
            };
            let target = if let Choice::Resource(shared) = &res.choice {
                self.shared_resource(shared, &res.res_type, origin, &res.location)
            } else {
                let res_id = match &res.id {
                    Some(id) => format!("shared.{id}"),
                    None => format!("modules.{}.externals.{name}", workload.name),
                };
                self.ensure(
                    Request {
                        app: Some(app),
                        res_type: &res.res_type,
                        class: &res.class,
                        res_id: &res_id,
                        params: res.params.clone(),
                        origin,
                        choice: &res.choice,
                    },
                    &res.location,
                )
            };
            if let Some(t) = target {
                self.edge(w, t, EdgeKind::Dependency);
                by_name.insert(name.clone(), t);
            }
        }
        Some(PendingWorkload {
            w,
            by_name,
            services: HashMap::new(),
        })
    }

    /// Links each `service` resource of the workload to the workload of the app it names (as
    /// score-humanitec did: `${resources.NAME.X}` read `${modules.NAME.service.X}`): an edge,
    /// and the outputs its Score file says (the Service's name and ports).
    fn services(&mut self, app_id: &str, app: &App, workload: &Workload, p: &mut PendingWorkload) {
        for (name, res) in workload.resources.iter().filter(|(_, r)| is_service(r)) {
            let Some(target) = app.workloads.get(name) else {
                self.errors.push(BuildError::UnknownServiceWorkload {
                    location: res.location.clone(),
                    app: app_id.to_owned(),
                    name: name.clone(),
                    known: app.workloads.keys().cloned().collect::<Vec<_>>().join(", "),
                });
                continue;
            };
            let guresid = GuresId::new(
                &self.env.id,
                Some(app_id),
                "workload",
                DEFAULT_CLASS,
                &format!("modules.{name}"),
            );
            // A workload that did not build has said why already.
            if let Some(&t) = self.index.get(&guresid) {
                self.edge(p.w, t, EdgeKind::Dependency);
            }
            p.services.insert(name.clone(), service_outputs(target));
        }
    }

    /// Serves the workload's requests by interface: GetOrCreate. A user-provided resource of
    /// the environment, then a resource of the app, whose outputs carry every `$id` asked for;
    /// else one is created from the request's type, whose definition must declare them.
    fn interfaces(&mut self, app: &str, workload: &'r Workload, p: &mut PendingWorkload) {
        for (name, res) in &workload.resources {
            let Choice::Interface(wanted) = &res.choice else {
                continue;
            };
            let origin = Origin::Requested {
                workload: workload.name.clone(),
                name: name.clone(),
                location: res.location.clone(),
            };
            let mut served: Option<(NodeIndex, BTreeMap<String, String>, bool)> = None;
            // User-provided resources first, then globals, each by name.
            let shared: Vec<&SharedResource> = {
                let all = self.env.shared_resources.values();
                let (provided, global): (Vec<_>, Vec<_>) = all.partition(|r| r.provided.is_some());
                provided.into_iter().chain(global).collect()
            };
            for shared in shared {
                let provides = match &shared.provided {
                    Some(_) => Some(shared.provides.clone()),
                    // A global's outputs are its definition's: find it without creating it.
                    None => self.global_definition(shared).map(|d| d.provides.clone()),
                };
                if let Some(map) = provides.as_ref().and_then(|p| covers(p, wanted))
                    && let Some(n) = self.shared_resource(
                        &shared.name,
                        &shared.res_type,
                        origin.clone(),
                        &res.location,
                    )
                {
                    served = Some((n, map, true));
                    break;
                }
            }
            if served.is_none() {
                let mut existing: Vec<(String, NodeIndex, BTreeMap<String, String>)> = self
                    .of_app
                    .get(app)
                    .into_iter()
                    .flatten()
                    .copied()
                    .filter(|&n| self.dag[n].res_type != "workload")
                    .filter_map(|n| {
                        let def = self.matched.get(&n)?;
                        covers(&def.provides, wanted).map(|m| (self.dag[n].label(), n, m))
                    })
                    .collect();
                existing.sort_by(|a, b| a.0.cmp(&b.0));
                if let Some((_, n, map)) = existing.into_iter().next() {
                    served = Some((n, map, true));
                }
            }
            if served.is_none() {
                let res_id = match &res.id {
                    Some(id) => format!("shared.{id}"),
                    None => format!("modules.{}.externals.{name}", workload.name),
                };
                if let Some(n) = self.ensure(
                    Request {
                        app: Some(app),
                        res_type: &res.res_type,
                        class: &res.class,
                        res_id: &res_id,
                        params: res.params.clone(),
                        origin,
                        choice: BY_CRITERIA,
                    },
                    &res.location,
                ) {
                    let def = self.matched[&n];
                    match covers(&def.provides, wanted) {
                        Some(map) => served = Some((n, map, false)),
                        None => self.errors.push(BuildError::InterfaceUnserved {
                            location: res.location.clone(),
                            resource: name.clone(),
                            ids: wanted.values().cloned().collect::<Vec<_>>().join(", "),
                            definition: def.id.clone(),
                        }),
                    }
                }
            }
            let Some((n, map, reused)) = served else {
                continue;
            };
            self.edge(p.w, n, EdgeKind::Dependency);
            p.by_name.insert(name.clone(), n);
            for (consumer_name, output) in map {
                let use_ = InterfaceUse {
                    resource: name.clone(),
                    id: wanted[&consumer_name].clone(),
                    name: consumer_name,
                    provider: self.dag[n].guresid.clone(),
                    output,
                    reused,
                };
                self.dag[p.w].interfaces.push(use_);
            }
        }
    }

    /// Resolves the workload's own placeholders into its inputs (its Score file).
    fn workload_spec(&mut self, app: &str, workload: &'r Workload, p: PendingWorkload) {
        let PendingWorkload {
            w,
            by_name,
            services: p_services,
        } = p;
        self.spec_hashes
            .insert(w, hex_digest(&[workload.source.as_bytes()]));
        let renames: HashMap<(String, String), String> = self.dag[w]
            .interfaces
            .iter()
            .map(|u| ((u.resource.clone(), u.name.clone()), u.output.clone()))
            .collect();
        let spec = workload.spec.try_map(&mut |expr: &Expr| {
            Ok::<_, Infallible>(match expr {
                Expr::ScoreResource { name, path } => match by_name.get(name.as_str()) {
                    Some(&t) => {
                        self.edge(w, t, EdgeKind::Reference);
                        let property = match path.first() {
                            Some(Segment::Key(first)) => workload
                                .resources
                                .get(name)
                                .and_then(|r| r.properties.get(first))
                                .map(|p| Box::new(p.clone())),
                            _ => None,
                        };
                        let mut path = path.clone();
                        // Through an interface, the workload's name for an output is mapped to
                        // the provider's.
                        if let Some(Segment::Key(first)) = path.first()
                            && let Some(output) = renames.get(&(name.clone(), first.clone()))
                        {
                            path[0] = Segment::Key(output.clone());
                        }
                        // `${resources.NAME}` is the whole resource: its non-secret outputs,
                        // what score-compose and score-k8s look up for a volume's `source`.
                        let read = if path.is_empty() {
                            Read::Values
                        } else {
                            Read::Outputs
                        };
                        Mapped::Expr(Binding::Output {
                            target: self.dag[t].guresid.clone(),
                            read,
                            path,
                            property,
                        })
                    }
                    None if p_services.contains_key(name) => {
                        match lookup_path(&p_services[name], path) {
                            Some(v) => Mapped::Value(v.clone()),
                            None => {
                                let path = path_to_string(path);
                                self.errors.push(BuildError::UnknownServiceOutput {
                                    location: workload_location(
                                        workload,
                                        &format!("resources.{name}.{path}"),
                                    ),
                                    workload: workload.name.clone(),
                                    name: name.clone(),
                                    path,
                                });
                                Mapped::Value(Value::Null)
                            }
                        }
                    }
                    None => {
                        if !workload.resources.contains_key(name) {
                            self.errors.push(BuildError::UnknownScoreResource {
                                location: workload_location(workload, &format!("resources.{name}")),
                                workload: workload.name.clone(),
                                name: name.clone(),
                            });
                        }
                        Mapped::Value(Value::Null)
                    }
                },
                Expr::ScoreMetadata { path } => match lookup_path(&workload.metadata, path) {
                    Some(v) => Mapped::Value(v.clone()),
                    None => {
                        let path = path_to_string(path);
                        self.errors.push(BuildError::UnknownMetadata {
                            location: workload_location(workload, &format!("metadata.{path}")),
                            workload: workload.name.clone(),
                            path,
                        });
                        Mapped::Value(Value::Null)
                    }
                },
                Expr::ScoreValue { key } => {
                    match self.values.get(app).and_then(|v| v.get(&self.env.id, key)) {
                        Some(v) => Mapped::Value(v.clone()),
                        None => {
                            self.errors.push(BuildError::UnknownValue {
                                location: workload_location(workload, &format!("values.{key}")),
                                workload: workload.name.clone(),
                                key: key.clone(),
                                app: app.to_owned(),
                                env: self.env.id.clone(),
                            });
                            Mapped::Value(Value::Null)
                        }
                    }
                }
                Expr::ScoreShared { id, path } => match self.shared_by_id(app, workload, id) {
                    Some(t) => {
                        self.edge(w, t, EdgeKind::Reference);
                        Mapped::Expr(Binding::Output {
                            target: self.dag[t].guresid.clone(),
                            read: if path.is_empty() {
                                Read::Values
                            } else {
                                Read::Outputs
                            },
                            path: path.clone(),
                            property: None,
                        })
                    }
                    None => Mapped::Value(Value::Null),
                },
                // The Score dialect parses none of these.
                Expr::Resource { .. } | Expr::Context(_) | Expr::Stored(_) => {
                    Mapped::Value(Value::Null)
                }
            })
        });
        let Ok(spec) = spec;
        self.dag[w].params = spec;
    }

    /// `${shared.ID}`: the app's resource shared under `id: ID` (a Score resource of one of its
    /// workloads), else the environment's `shared_resources` entry ID; an error naming both
    /// places when neither has it, or when the app shares two resources of different types
    /// under ID.
    fn shared_by_id(&mut self, app: &str, workload: &Workload, id: &str) -> Option<NodeIndex> {
        let location = workload_location(workload, &format!("shared.{id}"));
        let res_id = format!("shared.{id}");
        let mut in_app: Vec<NodeIndex> = self
            .of_app
            .get(app)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&n| self.dag[n].res_id == res_id)
            .collect();
        in_app.sort_by(|&a, &b| self.dag[a].guresid.cmp(&self.dag[b].guresid));
        match in_app.as_slice() {
            [one] => return Some(*one),
            [] => {}
            several => {
                self.errors.push(BuildError::AmbiguousShared {
                    location,
                    workload: workload.name.clone(),
                    id: id.to_owned(),
                    resources: several.iter().map(|&n| self.dag[n].label()).collect(),
                });
                return None;
            }
        }
        match self.env.shared_resources.get(id) {
            Some(shared) => {
                let origin = Origin::Requested {
                    workload: workload.name.clone(),
                    name: format!("shared.{id}"),
                    location: location.clone(),
                };
                let res_type = shared.res_type.clone();
                self.shared_resource(id, &res_type, origin, &location)
            }
            None => {
                self.errors.push(BuildError::UnknownSharedId {
                    location,
                    workload: workload.name.clone(),
                    id: id.to_owned(),
                    app: app.to_owned(),
                    env: self.env.id.clone(),
                });
                None
            }
        }
    }

    /// The environment's shared resource `name` (global or user-provided), which belongs to no
    /// app: created the first time an app refers to it.
    fn shared_resource(
        &mut self,
        name: &str,
        res_type: &str,
        origin: Origin,
        at: &SourceLocation,
    ) -> Option<NodeIndex> {
        let Some(shared) = self.env.shared_resources.get(name) else {
            self.errors.push(BuildError::UnknownSharedResource {
                location: at.clone(),
                env: self.env.id.clone(),
                name: name.to_owned(),
                known: self
                    .env
                    .shared_resources
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
            return None;
        };
        if shared.res_type != res_type {
            self.errors.push(BuildError::SharedResourceType {
                location: at.clone(),
                name: name.to_owned(),
                wanted: res_type.to_owned(),
                actual: shared.res_type.clone(),
            });
            return None;
        }
        let res_id = format!("globals.{name}");
        let choice = match &shared.provided {
            Some(_) => Choice::Definition(format!("provided/{name}")),
            None => Choice::Criteria,
        };
        self.ensure(
            Request {
                app: None,
                res_type: &shared.res_type,
                class: &shared.class,
                res_id: &res_id,
                params: shared.params.clone(),
                origin,
                choice: &choice,
            },
            &shared.location,
        )
    }

    /// The definition a global shared resource would match, without adding it to the graph.
    fn global_definition(&self, shared: &SharedResource) -> Option<&'r Definition> {
        let res_id = format!("globals.{}", shared.name);
        let ctx = MatchContext {
            app_id: None,
            env_id: &self.env.id,
            env_type: &self.env.env_type,
            res_type: &shared.res_type,
            class: &shared.class,
            res_id: &res_id,
        };
        let candidates = self
            .catalog
            .by_type
            .get(shared.res_type.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        choose(candidates, &self.catalog.by_id, &ctx, BY_CRITERIA).ok()
    }

    /// Expands queued nodes until nothing new appears.
    fn drain(&mut self) {
        while let Some(n) = self.queue.pop_front() {
            self.expand(n);
        }
    }

    /// Resolves the matched definition's references (adding resources and edges) and
    /// co-provisions what it lists.
    fn expand(&mut self, n: NodeIndex) {
        let def = self.matched[&n];
        let values = self.map_definition_template(n, def, &def.values);
        let secrets = self.map_definition_template(n, def, &def.secrets);
        self.dag[n].values = values;
        self.dag[n].secrets = secrets;

        for d in &def.depends_on {
            let at = def.locate(&d.key);
            if let Some(t) = self.referenced(n, def, (&d.res_type, &d.class, &d.id), &at) {
                self.edge(n, t, EdgeKind::Dependency);
            }
        }

        if let Some(DriverAccount::Of { desc, written }) = &def.driver_account {
            let at = def.locate(written);
            if let Some(t) = self.referenced(n, def, (&desc.res_type, &desc.class, &desc.id), &at) {
                self.edge(n, t, EdgeKind::Reference);
                self.accounts_of.push((n, t));
            }
        }

        for p in &def.provision {
            let node = &self.dag[n];
            let app = node.app.clone();
            let class = p.class.clone().unwrap_or_else(|| node.class.clone());
            let res_id = p.id.clone().unwrap_or_else(|| node.res_id.clone());
            let by = node.guresid.clone();
            let Some(c) = self.ensure(
                Request {
                    app: app.as_deref(),
                    res_type: &p.res_type,
                    class: &class,
                    res_id: &res_id,
                    params: p.params.clone(),
                    origin: Origin::Coprovisioned {
                        by,
                        definition: def.id.clone(),
                    },
                    choice: BY_CRITERIA,
                },
                &def.locate(&p.key),
            ) else {
                continue;
            };
            if p.is_dependent {
                self.edge(c, n, EdgeKind::Coprovision);
            }
            if p.match_dependents {
                self.match_dependents.push((n, c));
            }
        }
    }

    /// The resource `(type, class, id)` that definition `def` of node `n` names (class and id
    /// default to `n`'s), added and matched if new; `None` when nothing matches it.
    fn referenced(
        &mut self,
        n: NodeIndex,
        def: &Definition,
        (res_type, class, id): (&str, &Option<String>, &Option<String>),
        at: &SourceLocation,
    ) -> Option<NodeIndex> {
        let node = &self.dag[n];
        let app = node.app.clone();
        let class = class.clone().unwrap_or_else(|| node.class.clone());
        let res_id = id.clone().unwrap_or_else(|| node.res_id.clone());
        let by = node.guresid.clone();
        self.ensure(
            Request {
                app: app.as_deref(),
                res_type,
                class: &class,
                res_id: &res_id,
                params: Value::Null,
                origin: Origin::Referenced {
                    by,
                    definition: def.id.clone(),
                },
                choice: BY_CRITERIA,
            },
            at,
        )
    }

    fn map_definition_template(
        &mut self,
        n: NodeIndex,
        def: &'r Definition,
        template: &Template<Expr>,
    ) -> Template<Binding> {
        let mapped = template.try_map(&mut |expr: &Expr| {
            Ok::<_, Infallible>(match expr {
                Expr::Context(key) => Mapped::Value(Value::String(self.context_value(n, *key))),
                Expr::Resource { desc, read, path } => {
                    let node = &self.dag[n];
                    if !desc.selectors.is_empty() {
                        // Selectors add edges, never nodes: the base must exist once the graph
                        // is complete, which `select` checks.
                        let base = GuresId::new(
                            &self.env.id,
                            node.app.as_deref(),
                            &desc.res_type,
                            desc.class.as_deref().unwrap_or(&node.class),
                            desc.id.as_deref().unwrap_or(&node.res_id),
                        );
                        self.selectors.push(n);
                        return Ok(Mapped::Expr(Binding::Selector {
                            written: desc.to_string(),
                            base,
                            steps: desc.selectors.clone(),
                            path: path.clone(),
                            targets: Vec::new(),
                        }));
                    }
                    let at = def.locate(&desc.to_string());
                    match self.referenced(n, def, (&desc.res_type, &desc.class, &desc.id), &at) {
                        Some(t) => {
                            self.edge(n, t, EdgeKind::Reference);
                            Mapped::Expr(Binding::Output {
                                target: self.dag[t].guresid.clone(),
                                read: *read,
                                path: path.clone(),
                                property: None,
                            })
                        }
                        None => Mapped::Value(Value::Null),
                    }
                }
                Expr::Stored(secret) => Mapped::Expr(Binding::Stored {
                    secret: secret.clone(),
                    location: def.locate_store_ref(&secret.reference),
                    value: None,
                }),
                Expr::ScoreResource { .. }
                | Expr::ScoreMetadata { .. }
                | Expr::ScoreValue { .. }
                | Expr::ScoreShared { .. } => Mapped::Value(Value::Null),
            })
        });
        let Ok(mapped) = mapped;
        mapped
    }

    fn context_value(&self, n: NodeIndex, key: ContextKey) -> String {
        let node = &self.dag[n];
        match key {
            ContextKey::AppId => node.app.clone().unwrap_or_default(),
            ContextKey::EnvId => self.env.id.clone(),
            ContextKey::EnvType => self.env.env_type.clone(),
            ContextKey::OrgId => self.org.to_owned(),
            ContextKey::ResId => node.res_id.clone(),
            ContextKey::ResType => node.res_type.clone(),
            ContextKey::ResClass => node.class.clone(),
            ContextKey::ResGuresId => node.guresid.to_string(),
        }
    }

    /// `match_dependents`: whatever depends on the co-provisioning resource also depends on the
    /// co-provisioned one. Run once every node and reference edge exists.
    fn match_dependents(&mut self) {
        for (r, c) in std::mem::take(&mut self.match_dependents) {
            let dependents: Vec<NodeIndex> = self
                .dag
                .graph()
                .neighbors_directed(r, daggy::petgraph::Direction::Incoming)
                .filter(|&p| p != c)
                .collect();
            for p in dependents {
                self.edge(p, c, EdgeKind::Coprovision);
            }
        }
    }

    /// Resolves every selector against the graph as it stands before any selector edge, so the
    /// result does not depend on the order selectors are visited in, then adds their edges.
    fn select(&mut self) {
        let mut edges: Vec<(NodeIndex, NodeIndex)> = Vec::new();
        let mut holders = std::mem::take(&mut self.selectors);
        holders.sort();
        holders.dedup();
        for n in holders {
            let def = self.matched[&n];
            let mut templates = [
                std::mem::take(&mut self.dag[n].values),
                std::mem::take(&mut self.dag[n].secrets),
            ];
            for t in &mut templates {
                t.for_each_expr_mut(&mut |b: &mut Binding| {
                    let Binding::Selector {
                        written,
                        base,
                        steps,
                        targets,
                        ..
                    } = b
                    else {
                        return;
                    };
                    let Some(&base_node) = self.index.get(base) else {
                        self.errors.push(BuildError::SelectorBase {
                            location: def.locate(written),
                            selector: written.clone(),
                            resource: self.dag[n].label(),
                        });
                        return;
                    };
                    let g = self.dag.graph();
                    // A set at each step, so a resource two paths reach is selected once.
                    let mut selected: BTreeSet<NodeIndex> = BTreeSet::from([base_node]);
                    for (direction, selected_type) in steps.iter() {
                        let direction = match direction {
                            SelectorDirection::DependedOn => daggy::petgraph::Direction::Outgoing,
                            SelectorDirection::Dependents => daggy::petgraph::Direction::Incoming,
                        };
                        selected = selected
                            .iter()
                            .flat_map(|&s| g.neighbors_directed(s, direction))
                            .filter(|&s| self.dag[s].res_type == *selected_type)
                            .collect();
                    }
                    let mut selected: Vec<NodeIndex> = selected.into_iter().collect();
                    selected.sort_by(|&a, &b| {
                        let (a, b) = (&self.dag[a], &self.dag[b]);
                        (&a.res_id, &a.class, &a.guresid).cmp(&(&b.res_id, &b.class, &b.guresid))
                    });
                    *targets = selected
                        .iter()
                        .map(|&s| self.dag[s].guresid.clone())
                        .collect();
                    edges.extend(selected.into_iter().map(|s| (n, s)));
                });
            }
            let [values, secrets] = templates;
            self.dag[n].values = values;
            self.dag[n].secrets = secrets;
        }
        for (from, to) in edges {
            self.edge(from, to, EdgeKind::Selector);
        }
    }

    /// Gives each `driver_account: ${resources.DESC.account}` the account of the resource DESC
    /// names, following such references from resource to resource (the edges keep them
    /// acyclic) until a definition names an account.
    fn accounts(&mut self) {
        let of: HashMap<NodeIndex, NodeIndex> = self.accounts_of.iter().copied().collect();
        for (n, t) in std::mem::take(&mut self.accounts_of) {
            let mut at = t;
            while let Some(&next) = of.get(&at) {
                at = next;
            }
            let end = self.matched[&at];
            match (&self.dag[at].driver_account, &end.driver_account) {
                (Some(account), _) => self.dag[n].driver_account = Some(account.clone()),
                // Reported once, at the reference to the resource without an account; a
                // reference that matched nothing is reported already.
                (None, None) if at == t => {
                    let def = self.matched[&n];
                    if let Some(DriverAccount::Of { written, .. }) = &def.driver_account {
                        self.errors.push(BuildError::AccountOfUnnamed {
                            location: def.locate(written),
                            resource: self.dag[n].label(),
                            written: written.clone(),
                            target: self.dag[at].label(),
                            definition: end.id.clone(),
                        });
                    }
                }
                (None, _) => {}
            }
        }
    }

    /// Adds `from -> to`, keeping the strongest kind when the pair already has an edge; a loop
    /// is recorded with every resource on it.
    fn edge(&mut self, from: NodeIndex, to: NodeIndex, kind: EdgeKind) {
        if self.record_edges {
            self.edge_calls.push((from, to, kind));
        }
        if let Some(e) = self.dag.find_edge(from, to) {
            if let Some(w) = self.dag.edge_weight_mut(e)
                && kind > *w
            {
                *w = kind;
            }
            return;
        }
        if from == to || self.dag.add_edge(from, to, kind).is_err() {
            self.report_loop(from, to);
        }
    }

    fn report_loop(&mut self, from: NodeIndex, to: NodeIndex) {
        // The new edge from -> to closes a loop with an existing path to ~> from.
        let mut path = self.path(to, from).unwrap_or_else(|| vec![to]);
        path.insert(0, from);
        let mut key: Vec<GuresId> = path.iter().map(|&n| self.dag[n].guresid.clone()).collect();
        key.sort();
        key.dedup();
        if !self.loops.insert(key) {
            return;
        }
        let members = path
            .iter()
            .map(|&n| {
                let node = &self.dag[n];
                let def = self.matched.get(&n).map(|d| d.location.to_string());
                format!(
                    "{} (definition '{}'{})",
                    node.label(),
                    node.definition,
                    def.map(|l| format!(" in {l}")).unwrap_or_default()
                )
            })
            .collect();
        self.errors.push(BuildError::Loop { members });
    }

    /// A path along dependency edges from `start` to `goal`, both included.
    fn path(&self, start: NodeIndex, goal: NodeIndex) -> Option<Vec<NodeIndex>> {
        let g = self.dag.graph();
        let mut came_from: HashMap<NodeIndex, NodeIndex> = HashMap::new();
        let mut queue = VecDeque::from([start]);
        let mut seen = HashSet::from([start]);
        while let Some(n) = queue.pop_front() {
            if n == goal {
                let mut path = vec![n];
                let mut cur = n;
                while let Some(&prev) = came_from.get(&cur) {
                    path.push(prev);
                    cur = prev;
                }
                path.reverse();
                return Some(path);
            }
            for next in g.neighbors(n) {
                if seen.insert(next) {
                    came_from.insert(next, n);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// `f` of each of `0..len`, in order: on every core when there are many.
fn on_cores<T: Send>(len: usize, f: &(impl Fn(usize) -> T + Sync)) -> Vec<T> {
    // Asking for the cores reads the process's CPU limits: only when it could matter.
    let threads = if len < 4096 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    if threads < 2 {
        return (0..len).map(f).collect();
    }
    let chunk = len.div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..len)
            .step_by(chunk)
            .map(|start| scope.spawn(move || (start..len.min(start + chunk)).map(f).collect()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w: std::thread::ScopedJoinHandle<'_, Vec<T>>| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// SHA-256 of NUL-separated parts, as hex.
fn hex_digest(parts: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
        hasher.update([0u8]);
    }
    super::hex(&hasher.finalize())
}

/// A workload node and its resources by name, between the two phases of building it.
struct PendingWorkload {
    w: NodeIndex,
    by_name: HashMap<String, NodeIndex>,
    /// Its `service` resources by name: the outputs of the workload each names.
    services: HashMap<String, Value>,
}

/// A Score resource of type `service`: another workload of the app, not a provisioned resource
/// (unless an annotation chooses a definition or a shared resource for it).
fn is_service(res: &crate::model::ScoreResource) -> bool {
    res.res_type == "service" && res.choice == Choice::Criteria
}

/// What a `service` resource gives: the name of the workload's Service (the workload's name),
/// its `service.ports` by name, and `port` when it has exactly one.
fn service_outputs(target: &Workload) -> Value {
    let mut ports = serde_json::Map::new();
    if let Some(Value::Object(declared)) = literal_at(&target.spec, &["service", "ports"]) {
        for (port_name, port) in declared {
            if let Some(number) = port.get("port") {
                ports.insert(port_name, number.clone());
            }
        }
    }
    let mut outputs = serde_json::json!({ "name": target.name });
    if ports.len() == 1
        && let Some(only) = ports.values().next()
    {
        outputs["port"] = only.clone();
    }
    outputs["ports"] = Value::Object(ports);
    outputs
}

/// The value at object keys `path` of a template, when it holds no placeholder.
fn literal_at(t: &Template<Expr>, path: &[&str]) -> Option<Value> {
    let Some((key, rest)) = path.split_first() else {
        return t.literal();
    };
    match t {
        Template::Object(fields) => {
            let (_, child) = fields.iter().find(|(k, _)| k == key)?;
            literal_at(child, rest)
        }
        Template::Value(v) => {
            let pointer: String = path.iter().map(|k| format!("/{k}")).collect();
            v.pointer(&pointer).cloned()
        }
        _ => None,
    }
}

/// If `provides` (output to `$id`) carries every `$id` of `wanted` (name to `$id`): which
/// output serves each name.
fn covers(
    provides: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, String>> {
    wanted
        .iter()
        .map(|(name, id)| {
            provides
                .iter()
                .find(|(_, pid)| *pid == id)
                .map(|(output, _)| (name.clone(), output.clone()))
        })
        .collect()
}

fn workload_location(workload: &Workload, needle: &str) -> SourceLocation {
    SourceLocation {
        file: workload.file.clone(),
        line: crate::model::line_of(&workload.source, needle),
        column: None,
    }
}

/// `env`'s graph built in turn and in parts on `threads` threads (`None` when the parts found
/// something to report), each as its [`shape`].
#[cfg(test)]
pub(super) fn built_both_ways(
    repo: &Repository,
    env: &Environment,
    threads: usize,
) -> (String, Option<String>) {
    let provided = Vec::new();
    let catalog = Catalog::new(repo, &provided);
    let apps: Vec<(&String, &App)> = repo
        .apps
        .iter()
        .filter(|(id, _)| env.runs_app(id))
        .collect();
    let in_turn = build_in_turn(repo, env, &catalog, &apps, None);
    let in_parts = build_in_parts(repo, env, &catalog, &apps, threads);
    (shape(&in_turn), in_parts.as_ref().map(shape))
}

/// Everything a build came out with, in order: each node by index, each edge by index, the
/// provisioning order, or the errors.
#[cfg(test)]
pub(super) fn shape(built: &Result<ResourceGraph, Vec<BuildError>>) -> String {
    use std::fmt::Write;
    let g = match built {
        Ok(g) => g,
        Err(errors) => return format!("{errors:?}"),
    };
    let mut out = String::new();
    for (i, node) in g.dag.raw_nodes().iter().enumerate() {
        let _ = writeln!(out, "node {i}: {:?}", node.weight);
    }
    for e in g.dag.raw_edges() {
        let _ = writeln!(
            out,
            "edge {} -> {}: {:?}",
            e.source().index(),
            e.target().index(),
            e.weight
        );
    }
    let mut index: Vec<_> = g.index.iter().map(|(k, v)| (k, v.index())).collect();
    index.sort();
    let _ = writeln!(out, "index {index:?}\norder {:?}", g.order);
    out
}

#[cfg(test)]
mod on_cores_tests {
    /// Whatever thread works out an item, the items come back in order: a graph's template
    /// hashes are each its node's.
    #[test]
    fn items_worked_out_on_every_core_come_back_in_order() {
        for len in [0, 1, 4095, 4096, 10_001] {
            let squares = super::on_cores(len, &|i| i * i);
            assert_eq!(
                squares,
                (0..len).map(|i| i * i).collect::<Vec<_>>(),
                "{len}"
            );
        }
    }
}
