//! The status page's data, as JSON: environments, deployments, the resource graph and one
//! resource's details, never a secret value; and `/api/events`, the page's live updates.
//!
//! docs/status-page.md is the contract: the shapes below are what people script against.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::{Extension, Json, Router};
use futures_util::Stream;
#[cfg(test)]
use gitplane_state::NodeCount;
use gitplane_state::{
    AppFilter, BindingRecord, DeploymentSummary, DriftFinding, EnvPin, FailedResource, LinkRecord,
    NodeCensus, NodeRow, PreviewRecord, ResourceView, StateError, Store,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{Semaphore, watch};

use super::layout::{self, NODE_HEIGHT, NODE_WIDTH};
use super::{ApiError, Shared};
use crate::repo::{CommitInfo, ConfigRepo};

/// Deployments listed per environment.
const RECENT_DEPLOYMENTS: usize = 15;
/// Failed resources listed per environment (the total is given too).
const FAILED_SHOWN: usize = 50;
/// More matching nodes than this, without an app chosen, and the graph answers with the apps
/// to choose from instead: a drawing of thousands of boxes helps nobody.
pub const GRAPH_LIMIT: usize = 400;
/// No answer draws more nodes than this, app or not: it bounds the response and the browser.
pub const GRAPH_HARD_LIMIT: usize = 10_000;
/// The longest search text taken.
const QUERY_MAX: usize = 200;
/// Commits whose author and message are remembered.
const COMMIT_CACHE: usize = 1_024;
/// The shortest time between two events of one stream: a burst of changes is one refresh.
const EVENT_GAP: Duration = Duration::from_millis(250);
/// A comment on an idle stream, so proxies and the browser keep it open (and the listener:
/// more often when `http.idle_timeout` is shorter).
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The app filter's name for the resources no app owns.
pub const GLOBAL_APP: &str = "(global)";

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/envs/{env}/graph", get(graph))
        .route("/api/envs/{env}/apps", get(apps))
        .route("/api/envs/{env}/resources/{guresid}", get(resource))
        .route(
            "/api/envs/{env}/resources/{guresid}/explain",
            get(resource_explain),
        )
        .route("/api/events", get(events))
        .layer(Extension(Arc::new(ApiState::default())))
}

/// What the API keeps between requests.
struct ApiState {
    commits: Mutex<CommitCache>,
    /// `explain` reads and builds the commit's whole environment: one at a time, so clicks on
    /// many resources queue instead of building many graphs at once.
    explains: Semaphore,
}

impl Default for ApiState {
    fn default() -> Self {
        ApiState {
            commits: Mutex::new(CommitCache::default()),
            explains: Semaphore::new(1),
        }
    }
}

/// Who made each commit and what it says, read from git once: commits never change.
#[derive(Default)]
struct CommitCache {
    known: HashMap<String, Option<CommitInfo>>,
    /// Oldest first, to forget the oldest when full.
    order: VecDeque<String>,
}

impl CommitCache {
    /// The info of each commit of `commits`, reading the ones it lacks from `repo`.
    fn fill(&mut self, repo: &std::path::Path, commits: &[&str]) {
        let missing: Vec<&str> = commits
            .iter()
            .copied()
            .filter(|c| !self.known.contains_key(*c))
            .collect();
        if missing.is_empty() {
            return;
        }
        let opened = ConfigRepo::open(repo).ok();
        for commit in missing {
            let info = opened.as_ref().and_then(|r| r.commit_info(commit).ok());
            if self.order.len() >= COMMIT_CACHE
                && let Some(old) = self.order.pop_front()
            {
                self.known.remove(&old);
            }
            self.known.insert(commit.to_owned(), info);
            self.order.push_back(commit.to_owned());
        }
    }

    fn get(&self, commit: &str) -> Option<&CommitInfo> {
        self.known.get(commit).and_then(Option::as_ref)
    }
}

// ---------------------------------------------------------------------------------------------
// GET /api/overview

#[derive(Debug, Serialize)]
struct Overview {
    environments: Vec<EnvOverview>,
}

#[derive(Debug, Serialize)]
struct EnvOverview {
    env: String,
    /// Resources by status: `ready`, `failed`, `orphaned`.
    resources: BTreeMap<String, i64>,
    /// Newest first.
    deployments: Vec<DeploymentJson>,
    /// Held by the deletion guard, waiting for `gitplane approve`.
    held: Vec<DeploymentJson>,
    failed: Vec<FailedJson>,
    failed_total: i64,
    /// The pin a rollback or `gitplane pin` holds the environment at.
    pin: Option<PinJson>,
    /// What the newest detect-only drift run found, when it found something.
    drift: Option<DriftJson>,
    /// Its preview record, while it is a live preview environment.
    preview: Option<PreviewJson>,
    /// How far the deployment running now has got (one this daemon runs).
    progress: Option<ProgressJson>,
}

#[derive(Debug, Serialize)]
struct PinJson {
    commit: String,
    by: String,
    reason: String,
    since: String,
    forced: bool,
    /// The newest commit held back while pinned, with its message when the repository has it.
    waiting_commit: Option<String>,
    waiting_summary: Option<String>,
    waiting_author: Option<String>,
}

impl PinJson {
    fn new(pin: EnvPin, commits: &CommitCache) -> PinJson {
        let waiting = pin.waiting_commit.as_deref().and_then(|c| commits.get(c));
        PinJson {
            waiting_summary: waiting.map(|i| i.summary.clone()),
            waiting_author: waiting.map(|i| i.author.clone()),
            commit: pin.commit_id,
            by: pin.pinned_by,
            reason: pin.reason,
            since: pin.pinned_at,
            forced: pin.forced,
            waiting_commit: pin.waiting_commit,
        }
    }
}

#[derive(Debug, Serialize)]
struct DriftJson {
    /// The detect run (a deployment of kind `drift`).
    deployment: i64,
    commit: Option<String>,
    finished_at: Option<String>,
    /// Resources with a finding, and findings in all.
    resources: i64,
    findings_total: i64,
    /// At most [`FAILED_SHOWN`]: what differs, public values only.
    findings: Vec<FindingJson>,
}

#[derive(Debug, Serialize)]
struct FindingJson {
    guresid: String,
    app: Option<String>,
    #[serde(rename = "type")]
    res_type: String,
    class: String,
    res_id: String,
    /// `driver` or `recorded`.
    source: String,
    /// `outputs`, `secret outputs`, `missing` or `inputs`.
    what: String,
    /// Which paths differ; a secret's name, never its value.
    detail: String,
}

impl From<DriftFinding> for FindingJson {
    fn from(f: DriftFinding) -> Self {
        FindingJson {
            guresid: f.guresid,
            app: f.app,
            res_type: f.res_type,
            class: f.class,
            res_id: f.res_id,
            source: f.source,
            what: f.what,
            detail: f.detail,
        }
    }
}

#[derive(Debug, Serialize)]
struct PreviewJson {
    branch: String,
    commit: Option<String>,
    created_at: String,
    pushed_at: String,
    /// `pushed_at` plus the host config's `previews.ttl`; null without a ttl.
    expires_at: Option<String>,
    /// The newest branch head not deployed, and why.
    refused_commit: Option<String>,
    refused_why: Option<String>,
}

impl PreviewJson {
    fn new(p: PreviewRecord, ttl: Option<Duration>) -> PreviewJson {
        let expires_at = ttl.and_then(|ttl| {
            let pushed = chrono::DateTime::parse_from_rfc3339(&p.pushed_at).ok()?;
            let ttl = chrono::Duration::from_std(ttl).ok()?;
            Some(
                (pushed + ttl)
                    .with_timezone(&chrono::Utc)
                    .format("%Y-%m-%dT%H:%M:%S%.3fZ")
                    .to_string(),
            )
        });
        PreviewJson {
            branch: p.branch,
            commit: p.commit_id,
            created_at: p.created_at,
            pushed_at: p.pushed_at,
            expires_at,
            refused_commit: p.refused_commit,
            refused_why: p.refused_why,
        }
    }
}

#[derive(Debug, Serialize)]
struct ProgressJson {
    /// Resources done with, of `total` the plan may change.
    done: usize,
    total: usize,
    /// The labels of the resources whose driver call is under way.
    in_flight: Vec<String>,
}

#[derive(Debug, Serialize)]
struct DeploymentJson {
    id: i64,
    kind: String,
    commit: Option<String>,
    author: Option<String>,
    summary: Option<String>,
    /// When the commit was authored, seconds since the epoch.
    commit_time: Option<i64>,
    status: &'static str,
    started_at: String,
    finished_at: Option<String>,
    created: i64,
    updated: i64,
    deleted: i64,
    unchanged: i64,
    failed: i64,
    /// Driver calls made, polls and retries included.
    calls: i64,
    error: Option<String>,
    /// For a held deployment: the resources it would delete.
    would_delete: Option<Vec<String>>,
}

impl DeploymentJson {
    fn new(summary: DeploymentSummary, commits: &CommitCache) -> DeploymentJson {
        let d = summary.record;
        let info = d.commit_id.as_deref().and_then(|c| commits.get(c));
        DeploymentJson {
            id: d.id,
            kind: summary.kind,
            author: info.map(|i| i.author.clone()),
            summary: info.map(|i| i.summary.clone()),
            commit_time: info.map(|i| i.time),
            commit: d.commit_id,
            status: d.status.as_str(),
            started_at: d.started_at,
            finished_at: d.finished_at,
            created: d.counts.created,
            updated: d.counts.updated,
            deleted: d.counts.deleted,
            unchanged: d.counts.unchanged,
            failed: d.counts.failed,
            calls: summary.calls,
            error: d.error,
            would_delete: d.held,
        }
    }
}

#[derive(Debug, Serialize)]
struct FailedJson {
    guresid: String,
    app: Option<String>,
    #[serde(rename = "type")]
    res_type: String,
    class: String,
    res_id: String,
    /// The driver's message.
    error: Option<String>,
    updated_at: String,
}

impl From<FailedResource> for FailedJson {
    fn from(f: FailedResource) -> Self {
        FailedJson {
            guresid: f.guresid,
            app: f.app,
            res_type: f.res_type,
            class: f.class,
            res_id: f.res_id,
            error: f.error,
            updated_at: f.updated_at,
        }
    }
}

async fn overview(
    State(shared): State<Arc<Shared>>,
    Extension(api): Extension<Arc<ApiState>>,
) -> Result<Json<Overview>, ApiError> {
    let repo = shared.repo.clone();
    let ttl = shared
        .host
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .previews
        .as_ref()
        .and_then(|p| p.ttl);
    let events = shared.events.clone();
    let overview = shared
        .read(move |store| {
            let mut counts: HashMap<String, BTreeMap<String, i64>> = HashMap::new();
            for (env, status, n) in store.resource_counts()? {
                counts.entry(env).or_default().insert(status, n);
            }
            let pins = store.pins(None)?;
            let previews = store.previews()?;
            let mut read = Vec::new();
            for env in store.environments()? {
                let deployments = store.recent_deployments(&env, RECENT_DEPLOYMENTS)?;
                let held = store.held_deployments(&env)?;
                let resources = counts.remove(&env).unwrap_or_default();
                // The counts say whether any resource can be failed (an orphan may be): with
                // none, the environment's rows are not read twice more to find no failure.
                let (failed, failed_total) =
                    if resources.contains_key("failed") || resources.contains_key("orphaned") {
                        store.failed_resources(&env, FAILED_SHOWN)?
                    } else {
                        (Vec::new(), 0)
                    };
                let pin = pins
                    .iter()
                    .find(|p| p.env == env && p.unpinned_at.is_none())
                    .cloned();
                let preview = previews.iter().find(|p| p.env == env && p.live()).cloned();
                let drift = match store.last_detect_run(&env)? {
                    Some(run) if run.findings > 0 => {
                        let findings = store.drift_findings(run.deployment)?;
                        Some(DriftJson {
                            deployment: run.deployment,
                            commit: run.commit_id,
                            finished_at: run.finished_at,
                            resources: run.resources,
                            findings_total: run.findings,
                            findings: findings
                                .into_iter()
                                .take(FAILED_SHOWN)
                                .map(FindingJson::from)
                                .collect(),
                        })
                    }
                    _ => None,
                };
                let extra = Extra {
                    pin,
                    drift,
                    preview,
                };
                read.push((
                    env,
                    deployments,
                    held,
                    failed,
                    failed_total,
                    resources,
                    extra,
                ));
            }
            let mut commits = api.commits.lock().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<&str> = read
                .iter()
                .flat_map(|(_, d, h, ..)| d.iter().chain(h))
                .filter_map(|d| d.record.commit_id.as_deref())
                .chain(
                    read.iter()
                        .filter_map(|r| r.6.pin.as_ref()?.waiting_commit.as_deref()),
                )
                .collect();
            commits.fill(&repo, &ids);
            let environments = read
                .into_iter()
                .map(
                    |(env, deployments, held, failed, failed_total, resources, extra)| {
                        let running = deployments
                            .first()
                            .is_some_and(|d| d.record.status.as_str() == "running");
                        let progress = running.then(|| events.progress(&env)).flatten().map(|p| {
                            ProgressJson {
                                done: p.done,
                                total: p.total,
                                in_flight: p.in_flight.into_iter().collect(),
                            }
                        });
                        EnvOverview {
                            resources,
                            deployments: deployments
                                .into_iter()
                                .map(|d| DeploymentJson::new(d, &commits))
                                .collect(),
                            held: held
                                .into_iter()
                                .map(|d| DeploymentJson::new(d, &commits))
                                .collect(),
                            failed: failed.into_iter().map(FailedJson::from).collect(),
                            failed_total,
                            pin: extra.pin.map(|p| PinJson::new(p, &commits)),
                            drift: extra.drift,
                            preview: extra.preview.map(|p| PreviewJson::new(p, ttl)),
                            progress,
                            env,
                        }
                    },
                )
                .collect();
            Ok(Overview { environments })
        })
        .await?;
    Ok(Json(overview))
}

/// What the overview reads of an environment besides its deployments and resources.
struct Extra {
    pin: Option<EnvPin>,
    drift: Option<DriftJson>,
    preview: Option<PreviewRecord>,
}

// ---------------------------------------------------------------------------------------------
// GET /api/envs/{env}/graph

/// The graph's filters, all optional.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct GraphQuery {
    /// One app's resources; [`GLOBAL_APP`] for those of no app.
    pub app: Option<String>,
    /// One resource type.
    #[serde(rename = "type")]
    pub res_type: Option<String>,
    /// Text the app, type, res_id or GUResID contains (case-insensitive).
    pub q: Option<String>,
    /// `list`: the matching nodes without a layout (no edges, every `x`, `y` 0), up to
    /// [`GRAPH_HARD_LIMIT`] whether an app is chosen or not.
    pub view: Option<String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct GraphView {
    pub env: String,
    /// More than [`GRAPH_LIMIT`] nodes matched without an app chosen (or more than
    /// [`GRAPH_HARD_LIMIT`] with one): `nodes` and `edges` are empty; choose from `apps`.
    pub too_large: bool,
    /// Resources the filters matched.
    pub matched: usize,
    pub limit: usize,
    /// The environment's census, in an answer without `app` alone: one app's answer reads
    /// that app, not the environment, and the page asks `/apps` for the list.
    #[serde(flatten)]
    pub census: Option<AppsView>,
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
    pub width: f64,
    pub height: f64,
    pub node_width: f64,
    pub node_height: f64,
}

/// The environment counted for the page's app list and filters: the graph's answer without
/// an app, and `GET /api/envs/{env}/apps`.
#[derive(Debug, Serialize, PartialEq)]
pub struct AppsView {
    /// Resources in the environment.
    pub total: usize,
    /// The apps of the resources the type and text filters match (whatever `app` is), with
    /// how many each has (`name` null: resources of no app).
    pub apps: Vec<Count>,
    /// Every type of the environment's resources, for the type filter.
    pub types: Vec<Count>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Count {
    pub name: Option<String>,
    pub count: usize,
    /// For an app: the worst status of its resources (see [`worst`]); `null` for a type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    /// For an app: how many of its resources are failed or blocked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<usize>,
}

/// Statuses from worst to best: an app shows the first its resources have.
const WORST_FIRST: [&str; 5] = ["failed", "blocked", "orphaned", "in_progress", "ready"];

/// The worse of two statuses, by [`WORST_FIRST`].
fn worst(a: &'static str, b: &'static str) -> &'static str {
    let rank = |s: &str| WORST_FIRST.iter().position(|w| *w == s).unwrap_or(0);
    if rank(b) < rank(a) { b } else { a }
}

/// Per app: resources, failed or blocked ones, worst status.
#[derive(Default)]
struct AppTally {
    count: usize,
    failed: usize,
    status: Option<&'static str>,
}

impl AppTally {
    fn add(&mut self, status: &'static str, n: usize) {
        self.count += n;
        if matches!(status, "failed" | "blocked") {
            self.failed += n;
        }
        self.status = Some(self.status.map_or(status, |s| worst(s, status)));
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct GraphNode {
    pub guresid: String,
    pub app: Option<String>,
    #[serde(rename = "type")]
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    /// `ready`, `failed`, `orphaned`, `in_progress` or `blocked`.
    pub status: &'static str,
    /// A ghost: wanted by the graph, not recorded (blocked, or failed before it was made).
    pub ghost: bool,
    /// Why a ghost is not there.
    pub reason: Option<String>,
    /// The centre of its box, and its layer (0: depends on nothing shown).
    pub x: f64,
    pub y: f64,
    pub layer: usize,
    /// Links to resources the filters left out.
    pub hidden_links: usize,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct GraphEdge {
    /// Depends on `provider`.
    pub consumer: String,
    pub provider: String,
    /// `dependency`, `reference`, `coprovision`, `selector` or `implicit`.
    pub kind: String,
    pub update_type: String,
    /// Where the edge bends: the centre of each free slot it runs through, from the consumer
    /// to the provider (empty between neighbouring layers).
    pub points: Vec<[f64; 2]>,
}

async fn graph(
    State(shared): State<Arc<Shared>>,
    Path(env): Path<String>,
    Query(query): Query<GraphQuery>,
) -> Result<Json<GraphView>, ApiError> {
    searchable(query.q.as_deref())?;
    let read_env = env.clone();
    let Some((selected, links)) = shared
        .read(move |store| read_graph(store, &read_env, &query))
        .await?
    else {
        return Err(no_environment(&env));
    };
    let view = tokio::task::spawn_blocking(move || lay_out(selected, &links))
        .await
        .map_err(|e| ApiError::Internal(format!("the layout task failed: {e}")))?;
    Ok(Json(view))
}

/// Refuses a search text longer than [`QUERY_MAX`] before any read.
fn searchable(q: Option<&str>) -> Result<(), ApiError> {
    match q {
        Some(q) if q.len() > QUERY_MAX => Err(ApiError::BadRequest(format!(
            "q: at most {QUERY_MAX} bytes"
        ))),
        _ => Ok(()),
    }
}

fn no_environment(env: &str) -> ApiError {
    ApiError::NotFound(format!("no environment '{env}' in the state"))
}

// ---------------------------------------------------------------------------------------------
// GET /api/envs/{env}/apps

/// The census's filters, both optional: as the graph's (`app` and `view` are ignored).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct AppsQuery {
    /// The apps of one resource type.
    #[serde(rename = "type")]
    pub res_type: Option<String>,
    /// The apps of the resources whose app, type, res_id or GUResID contains it.
    pub q: Option<String>,
}

#[derive(Debug, Serialize)]
struct AppsJson {
    env: String,
    #[serde(flatten)]
    view: AppsView,
}

async fn apps(
    State(shared): State<Arc<Shared>>,
    Path(env): Path<String>,
    Query(query): Query<AppsQuery>,
) -> Result<Json<AppsJson>, ApiError> {
    searchable(query.q.as_deref())?;
    let read_env = env.clone();
    match shared
        .read(move |store| read_apps(store, &read_env, &query))
        .await?
    {
        Some(view) => Ok(Json(AppsJson { env, view })),
        None => Err(no_environment(&env)),
    }
}

/// `env`'s census for the page's app list and filters, read from `store`; `None` when state
/// knows no environment `env`. Without text to search it is counted from indexes; with text,
/// from every node of the environment.
pub fn read_apps(
    store: &Store,
    env: &str,
    query: &AppsQuery,
) -> Result<Option<AppsView>, StateError> {
    if !store.has_environment(env)? {
        return Ok(None);
    }
    let filters = Filters::of(query.res_type.as_deref(), query.q.as_deref());
    Ok(Some(if filters.needle.is_some() {
        count_apps(&store.graph_nodes(env)?, None, &filters)
    } else {
        count_apps(
            &[],
            Some(&store.node_census(env, filters.res_type)?),
            &filters,
        )
    }))
}

/// What `query` asks of `env`'s graph, read from `store` and selected, with the links the
/// layout needs; `None` when state knows no environment `env`.
///
/// With an app chosen, only that app's nodes are read (by index) and the links touching
/// them: nothing of the other apps, whose census `/apps` answers apart. Without one and
/// without text to search, nothing is read for the whole environment but its counts, from
/// indexes; the nodes are those of the type asked for, and none when they are too many to
/// answer with anyway.
pub fn read_graph(
    store: &Store,
    env: &str,
    query: &GraphQuery,
) -> Result<Option<(Selected, Vec<LinkRecord>)>, StateError> {
    if !store.has_environment(env)? {
        return Ok(None);
    }
    let app = query.app.as_deref().filter(|a| !a.is_empty());
    let res_type = query.res_type.as_deref().filter(|t| !t.is_empty());
    let searching = query.q.as_deref().is_some_and(|q| !q.is_empty());
    let (nodes, census) = match app {
        Some(app) => {
            let filter = if app == GLOBAL_APP {
                AppFilter::NoApp
            } else {
                AppFilter::App(app)
            };
            (store.graph_nodes_of(env, filter, res_type)?, None)
        }
        None if searching => (store.graph_nodes(env)?, None),
        None => {
            let census = store.node_census(env, res_type)?;
            let list = query.view.as_deref() == Some("list");
            let nodes = if too_large(census_matched(&census, None), false, list) {
                Vec::new()
            } else {
                store.graph_nodes_of(env, AppFilter::All, res_type)?
            };
            (nodes, Some(census))
        }
    };
    let selected = select(env.to_owned(), nodes, query, census.as_ref());
    // The links of what is drawn alone: none for a list or an answer too large.
    let links = store.links_around(env, &selected.drawn())?;
    Ok(Some((selected, links)))
}

/// Whether `matched` nodes are too many to answer with: more than [`GRAPH_HARD_LIMIT`], or
/// more than [`GRAPH_LIMIT`] to draw without an app chosen.
fn too_large(matched: usize, app_chosen: bool, list: bool) -> bool {
    matched > GRAPH_HARD_LIMIT || (matched > GRAPH_LIMIT && !app_chosen && !list)
}

/// The part of `env`'s graph `query` asks for, laid out. Pure.
///
/// `counts`, when given, counts the whole environment's nodes (by app, type and status) and
/// `nodes` holds the chosen type's alone: the apps, types and total then come from it (as a
/// [`NodeCensus`] of the query's type).
#[cfg(test)]
pub fn graph_view(
    env: String,
    nodes: Vec<NodeRow>,
    links: &[LinkRecord],
    query: &GraphQuery,
    counts: Option<&[NodeCount]>,
) -> GraphView {
    let res_type = query.res_type.as_deref().filter(|t| !t.is_empty());
    let census = counts.map(|c| NodeCensus::of_counts(c, res_type));
    lay_out(select(env, nodes, query, census.as_ref()), links)
}

/// How many of `census`'s nodes (of the type it was taken for) `app` keeps.
fn census_matched(census: &NodeCensus, app: Option<&str>) -> usize {
    census
        .apps
        .iter()
        .filter(|(a, _)| match app {
            None => true,
            Some(GLOBAL_APP) => a.is_none(),
            Some(name) => a.as_deref() == Some(name),
        })
        .flat_map(|(_, statuses)| statuses.values())
        .sum()
}

/// What a graph answer holds before its layout: the view (complete unless `draw`), and the
/// nodes to draw.
pub struct Selected {
    view: GraphView,
    shown: Vec<NodeRow>,
    /// The nodes are to be laid out (with their links); else `view` is the answer.
    draw: bool,
}

impl Selected {
    /// The GUResIDs to draw, whose links the layout needs; none when nothing is drawn.
    pub fn drawn(&self) -> Vec<&str> {
        if !self.draw {
            return Vec::new();
        }
        self.shown.iter().map(|n| n.guresid.as_str()).collect()
    }
}

/// The type and text filters of a graph or census query: the lower-cased text to search for
/// (none when empty) and the type.
struct Filters<'q> {
    res_type: Option<&'q str>,
    needle: Option<String>,
}

impl<'q> Filters<'q> {
    fn of(res_type: Option<&'q str>, q: Option<&str>) -> Self {
        Filters {
            res_type: res_type.filter(|t| !t.is_empty()),
            needle: q.map(str::to_lowercase).filter(|q| !q.is_empty()),
        }
    }

    /// Whether `n` is of the type and contains the text asked for.
    fn keep(&self, n: &NodeRow) -> bool {
        self.res_type.is_none_or(|t| n.res_type == t)
            && self.needle.as_ref().is_none_or(|q| {
                n.res_id.to_lowercase().contains(q.as_str())
                    || n.guresid.contains(q.as_str())
                    || n.res_type.to_lowercase().contains(q.as_str())
                    || n.app
                        .as_ref()
                        .is_some_and(|a| a.to_lowercase().contains(q.as_str()))
            })
    }
}

/// The census the app list and filters show: from `census` when given (taken for the
/// filters' type), else counted from `nodes`, the whole environment's. Pure.
fn count_apps(nodes: &[NodeRow], census: Option<&NodeCensus>, filters: &Filters<'_>) -> AppsView {
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    let mut tallies: BTreeMap<Option<String>, AppTally> = BTreeMap::new();
    let total = match census {
        Some(census) => {
            for (t, n) in &census.types {
                *types.entry(t.as_str()).or_default() += n;
            }
            for (a, statuses) in &census.apps {
                let tally = tallies.entry(a.clone()).or_default();
                for (status, n) in statuses {
                    tally.add(status, *n);
                }
            }
            census.total()
        }
        None => {
            for n in nodes {
                *types.entry(n.res_type.as_str()).or_default() += 1;
            }
            // The apps to choose from: those of the resources the other filters found,
            // whichever app is chosen.
            for n in nodes.iter().filter(|n| filters.keep(n)) {
                tallies.entry(n.app.clone()).or_default().add(n.status, 1);
            }
            nodes.len()
        }
    };
    AppsView {
        total,
        apps: tallies
            .into_iter()
            .map(|(a, t)| Count {
                name: a,
                count: t.count,
                status: t.status,
                failed: Some(t.failed),
            })
            .collect(),
        types: types
            .into_iter()
            .map(|(t, count)| Count {
                name: Some(t.to_owned()),
                count,
                status: None,
                failed: None,
            })
            .collect(),
    }
}

/// The part of `env`'s graph `query` asks for, filtered and counted, not laid out. Pure.
///
/// Without an app chosen, `nodes` are the environment's (or, with `census`, those of the
/// query's type alone: `census` counts the rest) and the answer carries the census; with one,
/// they may be that app's alone and the answer carries none.
pub fn select(
    env: String,
    nodes: Vec<NodeRow>,
    query: &GraphQuery,
    census: Option<&NodeCensus>,
) -> Selected {
    let filters = Filters::of(query.res_type.as_deref(), query.q.as_deref());
    let app = query.app.as_deref().filter(|a| !a.is_empty());
    let in_app = |n: &NodeRow| match app {
        None => true,
        Some(GLOBAL_APP) => n.app.is_none(),
        Some(a) => n.app.as_deref() == Some(a),
    };
    let counted = app.is_none().then(|| count_apps(&nodes, census, &filters));
    let mut shown: Vec<NodeRow> = nodes
        .into_iter()
        .filter(|n| filters.keep(n) && in_app(n))
        .collect();
    let list = query.view.as_deref() == Some("list");
    // Without text to search, the counts say how many match: `nodes` may have been left
    // unread, the answer being too large anyway.
    let matched = match census {
        Some(census) if filters.needle.is_none() => census_matched(census, app),
        _ => shown.len(),
    };
    let too_large = too_large(matched, app.is_some(), list);
    let mut view = GraphView {
        env,
        too_large,
        matched,
        limit: GRAPH_LIMIT,
        census: counted,
        nodes: Vec::new(),
        edges: Vec::new(),
        width: 0.0,
        height: 0.0,
        node_width: NODE_WIDTH,
        node_height: NODE_HEIGHT,
    };
    if too_large {
        return Selected {
            view,
            shown: Vec::new(),
            draw: false,
        };
    }
    // Grouped by app and type, so the layout's starting order keeps them together.
    shown.sort_by(|a, b| {
        (&a.app, &a.res_type, &a.res_id, &a.guresid).cmp(&(
            &b.app,
            &b.res_type,
            &b.res_id,
            &b.guresid,
        ))
    });
    if list {
        view.nodes = shown
            .into_iter()
            .map(|n| GraphNode {
                ghost: !n.recorded && n.status != "in_progress",
                guresid: n.guresid,
                app: n.app,
                res_type: n.res_type,
                class: n.class,
                res_id: n.res_id,
                status: n.status,
                reason: n.reason,
                x: 0.0,
                y: 0.0,
                layer: 0,
                hidden_links: 0,
            })
            .collect();
        return Selected {
            view,
            shown: Vec::new(),
            draw: false,
        };
    }
    Selected {
        view,
        shown,
        draw: true,
    }
}

/// `selected`'s nodes laid out with those of `links` between them (the others counted as
/// hidden). Pure.
pub fn lay_out(selected: Selected, links: &[LinkRecord]) -> GraphView {
    let Selected {
        mut view,
        shown,
        draw,
    } = selected;
    if !draw {
        return view;
    }
    let index: HashMap<&str, usize> = shown
        .iter()
        .enumerate()
        .map(|(i, n)| (n.guresid.as_str(), i))
        .collect();
    let mut hidden = vec![0; shown.len()];
    let mut pairs = Vec::new();
    for l in links {
        match (
            index.get(l.consumer.as_str()),
            index.get(l.provider.as_str()),
        ) {
            (Some(&c), Some(&p)) => {
                pairs.push((c, p));
                view.edges.push(GraphEdge {
                    consumer: l.consumer.clone(),
                    provider: l.provider.clone(),
                    kind: l.kind.clone(),
                    update_type: l.update_type.clone(),
                    points: Vec::new(),
                });
            }
            (Some(&c), None) => hidden[c] += 1,
            (None, Some(&p)) => hidden[p] += 1,
            (None, None) => {}
        }
    }
    let placed = layout::layered(shown.len(), &pairs);
    view.width = placed.width;
    view.height = placed.height;
    for (edge, route) in view.edges.iter_mut().zip(placed.waypoints) {
        edge.points = route.into_iter().map(|(x, y)| [x, y]).collect();
    }
    view.nodes = shown
        .into_iter()
        .zip(placed.nodes)
        .zip(hidden)
        .map(|((n, p), hidden_links)| GraphNode {
            guresid: n.guresid,
            app: n.app,
            res_type: n.res_type,
            class: n.class,
            res_id: n.res_id,
            status: n.status,
            ghost: !n.recorded && n.status != "in_progress",
            reason: n.reason,
            x: p.x,
            y: p.y,
            layer: p.layer,
            hidden_links,
        })
        .collect();
    view
}

// ---------------------------------------------------------------------------------------------
// GET /api/envs/{env}/resources/{guresid}

#[derive(Debug, Serialize)]
struct ResourceJson {
    guresid: String,
    env: String,
    app: Option<String>,
    #[serde(rename = "type")]
    res_type: String,
    class: String,
    res_id: String,
    definition: String,
    driver: String,
    account: Option<String>,
    deletion_policy: String,
    /// `ready` or `failed`; `orphaned` shows in `orphan_since`.
    status: String,
    error: Option<String>,
    commit: String,
    deployment: i64,
    created_at: String,
    updated_at: String,
    orphan_since: Option<String>,
    orphan_reason: Option<String>,
    /// The non-secret inputs last sent to the driver: `{"values", "resource"}`.
    inputs: Value,
    outputs: Value,
    /// The names of the secret outputs, never their values; `null` when the state key could
    /// not be read (see `secret_outputs_error`).
    secret_outputs: Option<Vec<String>>,
    secret_outputs_error: Option<String>,
    links: Vec<LinkJson>,
    bindings: Vec<BindingJson>,
    /// `gitplane explain`'s text; `null` with `explain_error` when it could not run.
    explain: Option<String>,
    explain_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct LinkJson {
    /// `provider`: this resource depends on `other`; `consumer`: `other` depends on it.
    role: &'static str,
    other: Label,
    kind: String,
    update_type: String,
}

#[derive(Debug, Serialize)]
struct BindingJson {
    /// Where in this resource's inputs: `values.host`, `secrets.password`.
    needed_path: String,
    provider: Label,
    /// `outputs.host`, or a selector's `workload>aws-policy.outputs.name`.
    provided_path: String,
    data_type: String,
    /// `null` for a secret.
    value: Option<Value>,
    secret: bool,
    inserted: bool,
    interface: Option<String>,
}

/// Another resource, by GUResID and, when state records it, what people call it.
#[derive(Debug, Serialize)]
struct Label {
    guresid: String,
    #[serde(rename = "type")]
    res_type: Option<String>,
    res_id: Option<String>,
    app: Option<String>,
}

type Read = (
    Option<ResourceView>,
    Result<Vec<String>, String>,
    Vec<LinkRecord>,
    Vec<BindingRecord>,
    HashMap<String, NodeRow>,
);

/// `GET /api/envs/{env}/resources/{guresid}?explain=false`: without `explain`'s text, which
/// builds the whole environment (seconds at 50 000 resources); the page asks for it apart.
#[derive(Debug, Deserialize)]
struct ResourceQuery {
    explain: Option<bool>,
}

async fn resource(
    State(shared): State<Arc<Shared>>,
    Extension(api): Extension<Arc<ApiState>>,
    Path((env, guresid)): Path<(String, String)>,
    Query(asked): Query<ResourceQuery>,
) -> Result<Json<ResourceJson>, ApiError> {
    let (read_env, read_guresid) = (env.clone(), guresid.clone());
    let (view, secret_names, links, bindings, labels): Read = shared
        .read(move |store| {
            let Some(view) = store.resource_view(&read_env, &read_guresid)? else {
                return Ok((None, Ok(Vec::new()), Vec::new(), Vec::new(), HashMap::new()));
            };
            // Without the state key the names are unknown; the rest of the page still shows.
            let names = store
                .secret_output_names(&read_guresid)
                .map_err(|e| e.to_string());
            let links = store
                .resource_links(&read_env, &read_guresid)?
                .map(|(_, l)| l)
                .unwrap_or_default();
            let bindings = store.current_bindings(&read_guresid)?;
            // Names for the other ends: one read of the environment's nodes, no JSON parsed.
            let wanted: HashSet<&str> = links
                .iter()
                .flat_map(|l| [l.consumer.as_str(), l.provider.as_str()])
                .chain(bindings.iter().map(|b| b.provided.as_str()))
                .collect();
            let wanted: Vec<&str> = wanted.into_iter().collect();
            let labels = store
                .nodes_named(&read_env, &wanted)?
                .into_iter()
                .map(|n| (n.guresid.clone(), n))
                .collect();
            Ok((Some(view), names, links, bindings, labels))
        })
        .await?;
    let Some(view) = view else {
        return Err(ApiError::NotFound(format!(
            "no resource {guresid} recorded in environment '{env}' (one being created shows \
             once its driver answers)"
        )));
    };
    let (explain, explain_error) = if asked.explain == Some(false) {
        (None, None)
    } else {
        match explain(&shared, &api, &env, &guresid).await {
            Ok(text) => (Some(text), None),
            Err(e) => (None, Some(e)),
        }
    };
    let label = |g: &str| {
        let n = labels.get(g);
        Label {
            guresid: g.to_owned(),
            res_type: n.map(|n| n.res_type.clone()),
            res_id: n.map(|n| n.res_id.clone()),
            app: n.and_then(|n| n.app.clone()),
        }
    };
    let links = links
        .into_iter()
        .map(|l| {
            let (role, other) = if l.consumer == guresid {
                ("provider", &l.provider)
            } else {
                ("consumer", &l.consumer)
            };
            LinkJson {
                role,
                other: label(other),
                kind: l.kind,
                update_type: l.update_type,
            }
        })
        .collect();
    let bindings = bindings
        .into_iter()
        .map(|b| BindingJson {
            needed_path: b.needed_path,
            provider: label(&b.provided),
            provided_path: b.provided_path,
            data_type: b.data_type,
            // State keeps no value for a secret; this says so even of a damaged row.
            value: if b.secret { None } else { b.value },
            secret: b.secret,
            inserted: b.inserted,
            interface: b.interface,
        })
        .collect();
    let (secret_outputs, secret_outputs_error) = match secret_names {
        Ok(names) => (Some(names), None),
        Err(e) => (None, Some(e)),
    };
    Ok(Json(ResourceJson {
        guresid: view.guresid,
        env: view.env,
        app: view.app,
        res_type: view.res_type,
        class: view.class,
        res_id: view.res_id,
        definition: view.definition,
        driver: view.driver,
        account: view.account,
        deletion_policy: view.deletion_policy,
        status: view.status,
        error: view.error,
        commit: view.commit_id,
        deployment: view.deployment_id,
        created_at: view.created_at,
        updated_at: view.updated_at,
        orphan_since: view.orphan_since,
        orphan_reason: view.orphan_reason,
        inputs: view.inputs,
        outputs: view.outputs,
        secret_outputs,
        secret_outputs_error,
        links,
        bindings,
        explain,
        explain_error,
    }))
}

#[derive(Debug, Serialize)]
struct ExplainJson {
    explain: Option<String>,
    explain_error: Option<String>,
}

/// `GET /api/envs/{env}/resources/{guresid}/explain`: `gitplane explain`'s text alone.
async fn resource_explain(
    State(shared): State<Arc<Shared>>,
    Extension(api): Extension<Arc<ApiState>>,
    Path((env, guresid)): Path<(String, String)>,
) -> Json<ExplainJson> {
    Json(match explain(&shared, &api, &env, &guresid).await {
        Ok(text) => ExplainJson {
            explain: Some(text),
            explain_error: None,
        },
        Err(e) => ExplainJson {
            explain: None,
            explain_error: Some(e),
        },
    })
}

/// `gitplane explain`'s text for `guresid`, against the host config in force.
async fn explain(
    shared: &Arc<Shared>,
    api: &ApiState,
    env: &str,
    guresid: &str,
) -> Result<String, String> {
    let _permit = api
        .explains
        .acquire()
        .await
        .map_err(|_| "explain is unavailable while the daemon stops".to_owned())?;
    let host = shared
        .host
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let ctx = crate::app::Context::of_daemon(
        shared.repo.clone(),
        shared.state.clone(),
        vec![env.to_owned()],
        host,
    );
    let guresid = guresid.to_owned();
    tokio::task::spawn_blocking(move || {
        let explained =
            crate::app::explain::explain(&ctx, None, &guresid, crate::app::explain::Format::Table)
                .map_err(|e| e.to_string())?;
        Ok(explained.text.unwrap_or_default())
    })
    .await
    .map_err(|e| format!("the explain task failed: {e}"))?
}

// ---------------------------------------------------------------------------------------------
// GET /api/events

async fn events(
    State(shared): State<Arc<Shared>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(change_events(
        shared.events.subscribe(),
        shared.stop.clone(),
        EVENT_GAP,
    ))
    .keep_alive(KeepAlive::new().interval(KEEP_ALIVE.min(shared.limits().idle_timeout / 2)))
}

/// A `hello` event, then a `change` event (its data: the change counter) after each change of
/// state, at most one per `gap`; ends when `stop` turns true or the daemon drops the channel.
fn change_events(
    changes: watch::Receiver<u64>,
    stop: watch::Receiver<bool>,
    gap: Duration,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    struct Watching {
        changes: watch::Receiver<u64>,
        stop: watch::Receiver<bool>,
        /// When the last event went out; `None` before the first.
        last: Option<tokio::time::Instant>,
    }
    let start = Watching {
        changes,
        stop,
        last: None,
    };
    futures_util::stream::unfold(start, move |mut s| async move {
        if *s.stop.borrow() {
            return None;
        }
        let Some(last) = s.last else {
            let n = *s.changes.borrow_and_update();
            s.last = Some(tokio::time::Instant::now());
            return Some((Ok(Event::default().event("hello").data(n.to_string())), s));
        };
        tokio::select! {
            changed = s.changes.changed() => changed.ok()?,
            _ = s.stop.wait_for(|stop| *stop) => return None,
        }
        // Changes that arrive while this waits go out together.
        tokio::select! {
            () = tokio::time::sleep_until(last + gap) => {}
            _ = s.stop.wait_for(|stop| *stop) => return None,
        }
        let n = *s.changes.borrow_and_update();
        s.last = Some(tokio::time::Instant::now());
        Some((Ok(Event::default().event("change").data(n.to_string())), s))
    })
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    fn node(guresid: &str, app: Option<&str>, res_type: &str, res_id: &str) -> NodeRow {
        NodeRow {
            guresid: guresid.into(),
            app: app.map(str::to_owned),
            res_type: res_type.into(),
            class: "default".into(),
            res_id: res_id.into(),
            status: "ready",
            recorded: true,
            reason: None,
        }
    }

    fn link(consumer: &str, provider: &str) -> LinkRecord {
        LinkRecord {
            consumer: consumer.into(),
            provider: provider.into(),
            kind: "reference".into(),
            update_type: "NeedsProvides".into(),
        }
    }

    /// `apps` apps of `per_app` workloads, each reading the one global dns.
    fn estate(apps: usize, per_app: usize) -> (Vec<NodeRow>, Vec<LinkRecord>) {
        let mut nodes = vec![node("dns", None, "dns", "shared.dns")];
        let mut links = Vec::new();
        for a in 0..apps {
            for w in 0..per_app {
                let g = format!("w{a}-{w}");
                nodes.push(node(
                    &g,
                    Some(&format!("app{a}")),
                    "workload",
                    &format!("modules.web{w}"),
                ));
                links.push(link(&g, "dns"));
            }
        }
        (nodes, links)
    }

    fn view(nodes: Vec<NodeRow>, links: &[LinkRecord], query: GraphQuery) -> GraphView {
        graph_view("dev".into(), nodes, links, &query, None)
    }

    /// The census an answer without an app carries.
    fn census(v: &GraphView) -> &AppsView {
        v.census
            .as_ref()
            .expect("an answer without an app counts the environment")
    }

    #[test]
    fn a_small_environment_is_drawn_whole() {
        let (nodes, links) = estate(2, 3);
        let v = view(nodes, &links, GraphQuery::default());
        assert!(!v.too_large);
        assert_eq!(
            (census(&v).total, v.matched, v.nodes.len(), v.edges.len()),
            (7, 7, 7, 6)
        );
        assert!(v.nodes.iter().all(|n| n.hidden_links == 0));
        let dns = v.nodes.iter().find(|n| n.guresid == "dns").unwrap();
        assert_eq!(dns.layer, 0, "the provider is left of its consumers");
    }

    #[test]
    fn a_large_environment_offers_its_apps_until_one_is_chosen() {
        let (nodes, links) = estate(5, 100);
        let v = view(nodes.clone(), &links, GraphQuery::default());
        assert!(v.too_large);
        assert!(v.nodes.is_empty() && v.edges.is_empty());
        assert_eq!(v.matched, 501);
        assert_eq!(census(&v).apps.len(), 6);
        assert_eq!(
            census(&v).apps[0],
            Count {
                name: None,
                count: 1,
                status: Some("ready"),
                failed: Some(0),
            }
        );
        assert_eq!(
            census(&v).apps[1],
            Count {
                name: Some("app0".into()),
                count: 100,
                status: Some("ready"),
                failed: Some(0),
            }
        );

        let one = view(
            nodes.clone(),
            &links,
            GraphQuery {
                app: Some("app3".into()),
                ..Default::default()
            },
        );
        assert!(!one.too_large);
        assert_eq!(one.nodes.len(), 100);
        assert_eq!(one.census, None, "one app's answer counts nothing else");
        // The global dns is outside the app: each workload's link to it is counted, not drawn.
        assert!(one.edges.is_empty());
        assert!(one.nodes.iter().all(|n| n.hidden_links == 1));

        // Narrowed enough by type and text, no app is needed.
        let found = view(
            nodes,
            &links,
            GraphQuery {
                res_type: Some("workload".into()),
                q: Some("WEB7".into()),
                ..Default::default()
            },
        );
        assert!(!found.too_large);
        assert_eq!(found.matched, 5 * 11, "web7 and web70..web79 of each app");
    }

    #[test]
    fn the_global_filter_shows_resources_of_no_app() {
        let (nodes, links) = estate(2, 2);
        let v = view(
            nodes,
            &links,
            GraphQuery {
                app: Some(GLOBAL_APP.into()),
                ..Default::default()
            },
        );
        assert_eq!(v.nodes.len(), 1);
        assert_eq!(v.nodes[0].hidden_links, 4);
    }

    fn preview(pushed_at: &str) -> PreviewRecord {
        PreviewRecord {
            env: "pr-7".into(),
            branch: "pr-7".into(),
            env_type: "development".into(),
            commit_id: Some("abc".into()),
            created_at: "2026-11-20T08:00:00.000Z".into(),
            pushed_at: pushed_at.into(),
            removing_at: None,
            removed_at: None,
            removed_why: None,
            platform_commit: None,
            refused_commit: None,
            refused_why: None,
        }
    }

    #[test]
    fn a_preview_expires_its_ttl_after_its_last_push() {
        let ttl = Some(Duration::from_secs(72 * 3600));
        let p = PreviewJson::new(preview("2026-11-21T23:20:50.123Z"), ttl);
        assert_eq!(p.branch, "pr-7");
        assert_eq!(p.expires_at.as_deref(), Some("2026-11-24T23:20:50.123Z"));
        // No ttl: kept until the branch goes; a time state did not write: no guess.
        assert_eq!(
            PreviewJson::new(preview("2026-11-21T23:20:50.123Z"), None).expires_at,
            None
        );
        assert_eq!(PreviewJson::new(preview("t"), ttl).expires_at, None);
    }

    #[test]
    fn an_app_shows_its_worst_status_and_search_finds_apps_and_types() {
        let (mut nodes, links) = estate(3, 2);
        nodes[2].status = "failed";
        nodes.push(NodeRow {
            status: "blocked",
            recorded: false,
            reason: Some("blocked: its queue failed".into()),
            ..node("ghost", Some("app2"), "workload", "modules.worker")
        });
        let v = view(nodes.clone(), &links, GraphQuery::default());
        let status: Vec<(Option<&str>, Option<&str>, Option<usize>)> = census(&v)
            .apps
            .iter()
            .map(|a| (a.name.as_deref(), a.status, a.failed))
            .collect();
        assert_eq!(
            status,
            [
                (None, Some("ready"), Some(0)),
                (Some("app0"), Some("failed"), Some(1)),
                (Some("app1"), Some("ready"), Some(0)),
                (Some("app2"), Some("blocked"), Some(1)),
            ]
        );
        let ghost = v.nodes.iter().find(|n| n.guresid == "ghost").unwrap();
        assert!(ghost.ghost);
        assert_eq!(ghost.reason.as_deref(), Some("blocked: its queue failed"));
        assert_eq!(worst("blocked", "failed"), "failed");
        assert_eq!(worst("ready", "orphaned"), "orphaned");

        // The search text matches an app's name and a type too.
        let by_app = view(
            nodes.clone(),
            &links,
            GraphQuery {
                q: Some("APP1".into()),
                ..Default::default()
            },
        );
        assert_eq!(by_app.matched, 2);
        let by_type = view(
            nodes.clone(),
            &links,
            GraphQuery {
                q: Some("dns".into()),
                ..Default::default()
            },
        );
        assert_eq!(by_type.matched, 1);

        // The list view: nodes without a layout, past the graph's limit.
        let (many, many_links) = estate(5, 100);
        let list = view(
            many,
            &many_links,
            GraphQuery {
                view: Some("list".into()),
                ..Default::default()
            },
        );
        assert!(!list.too_large);
        assert_eq!(list.nodes.len(), 501);
        assert!(list.edges.is_empty());
    }

    #[test]
    fn counted_apps_answer_a_large_environment_without_its_nodes() {
        let count = |app: Option<&str>, res_type: &str, status, count| NodeCount {
            app: app.map(str::to_owned),
            res_type: res_type.into(),
            status,
            count,
        };
        let counts = [
            count(None, "dns", "ready", 1),
            count(Some("a"), "workload", "ready", 300),
            count(Some("a"), "workload", "failed", 2),
            count(Some("b"), "workload", "ready", 200),
            count(Some("b"), "redis", "blocked", 1),
        ];
        let v = graph_view(
            "dev".into(),
            Vec::new(),
            &[],
            &GraphQuery::default(),
            Some(&counts),
        );
        assert!(v.too_large);
        assert_eq!((census(&v).total, v.matched), (504, 504));
        let apps: Vec<(Option<&str>, usize, Option<&str>)> = census(&v)
            .apps
            .iter()
            .map(|a| (a.name.as_deref(), a.count, a.status))
            .collect();
        assert_eq!(
            apps,
            [
                (None, 1, Some("ready")),
                (Some("a"), 302, Some("failed")),
                (Some("b"), 201, Some("blocked")),
            ]
        );
        // By type: the apps of that type alone, and few enough to draw.
        let redis = graph_view(
            "dev".into(),
            vec![NodeRow {
                status: "blocked",
                recorded: false,
                ..node("r", Some("b"), "redis", "modules.web.externals.cache")
            }],
            &[],
            &GraphQuery {
                res_type: Some("redis".into()),
                ..Default::default()
            },
            Some(&counts),
        );
        assert!(!redis.too_large);
        assert_eq!(
            (redis.matched, redis.nodes.len(), census(&redis).apps.len()),
            (1, 1, 1)
        );
        assert_eq!(
            census(&redis).types.len(),
            3,
            "every type of the environment"
        );
    }

    /// A state with two apps, a global, an orphaned global, a failed resource, two ghosts and
    /// links between apps and to the global: what the page reads of `development`.
    fn two_apps(store: &mut Store) {
        use gitplane_state::{Counts, DeploymentStatus};
        // (guresid, app, type, res_id, what became of it)
        let made: [Made<'_>; 8] = [
            ("dns", None, "dns", "shared.dns", "ready"),
            (
                "s-db",
                Some("shop"),
                "postgres",
                "modules.web.externals.db",
                "ready",
            ),
            ("s-web", Some("shop"), "workload", "modules.web", "ready"),
            (
                "s-cache",
                Some("shop"),
                "redis",
                "modules.web.externals.cache",
                "failed",
            ),
            (
                "b-db",
                Some("billing"),
                "postgres",
                "modules.worker.externals.db",
                "ready",
            ),
            ("old-dns", None, "dns", "shared.old-dns", "ready"),
            (
                "b-q",
                Some("billing"),
                "queue",
                "modules.worker.externals.jobs",
                "ghost failed",
            ),
            (
                "b-w",
                Some("billing"),
                "workload",
                "modules.worker",
                "ghost blocked",
            ),
        ];
        let links = [
            ("s-web", "s-db"),
            ("s-web", "s-cache"),
            ("s-db", "dns"),
            ("b-db", "dns"),
            ("b-w", "b-q"),
            ("b-w", "b-db"),
            ("b-w", "s-web"),
        ];
        let d = record(store, &made, &links);
        store
            .mark_orphans("development", &[("old-dns".into(), "kept".into())], None)
            .unwrap();
        store
            .finish_deployment(d, DeploymentStatus::Failed, &Counts::default(), None)
            .unwrap();
    }

    /// A resource a deployment meant to make: (guresid, app, type, res_id, what became of
    /// it: `ready`, `failed`, `ghost failed` or `ghost blocked`).
    type Made<'a> = (&'a str, Option<&'a str>, &'a str, &'a str, &'a str);

    /// A deployment of `development` at commit c1 that made `made` and linked `links`
    /// (consumer, provider), left running: its id.
    fn record(store: &mut Store, made: &[Made<'_>], links: &[(&str, &str)]) -> i64 {
        use gitplane_state::{
            DeletionPolicy, JournalEntry, LinkChanges, OperationStart, ResourceRecord,
            ResourceStatus,
        };
        let d = store.begin_deployment("development", "c1").unwrap();
        let ops = store
            .begin_operations(
                &made
                    .iter()
                    .map(|(g, app, t, res_id, _)| OperationStart {
                        deployment: d,
                        guresid: g,
                        app: *app,
                        res_type: t,
                        class: "default",
                        res_id,
                        action: "create",
                        reason: "new",
                    })
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let records: Vec<ResourceRecord> = made
            .iter()
            .map(|(g, app, t, res_id, what)| ResourceRecord {
                guresid: (*g).into(),
                env: "development".into(),
                app: app.map(str::to_owned),
                res_type: (*t).into(),
                class: "default".into(),
                res_id: (*res_id).into(),
                definition: "def".into(),
                driver: "echo".into(),
                account: None,
                deletion_policy: DeletionPolicy::Delete,
                template_hash: String::new(),
                status: if *what == "failed" {
                    ResourceStatus::Failed
                } else {
                    ResourceStatus::Ready
                },
                inputs_hash: "h".into(),
                outputs: serde_json::json!({}),
                secret_outputs: serde_json::json!({}),
                inputs: serde_json::json!({}).into(),
                secret_inputs: serde_json::json!({}).into(),
                error: (*what == "failed").then(|| "quota exceeded".to_owned()),
                commit_id: "c1".into(),
            })
            .collect();
        let entries: Vec<JournalEntry<'_>> = made
            .iter()
            .zip(&ops)
            .zip(&records)
            .map(|(((_, _, _, _, what), &operation), record)| match *what {
                "ghost failed" => JournalEntry::Failed {
                    operation,
                    attempts: 0,
                    error: "values may not read a secret output",
                },
                "ghost blocked" => JournalEntry::Skipped {
                    operation,
                    why: "blocked: queue#modules.worker.externals.jobs failed",
                },
                _ => JournalEntry::Put {
                    operation,
                    attempts: 1,
                    deployment: d,
                    record,
                    outputs_changed: Some(true),
                    new: true,
                    manifests: None,
                    sealed: None,
                },
            })
            .collect();
        store.journal(&entries).unwrap();
        store
            .record_link_changes(
                d,
                "development",
                &LinkChanges {
                    removed: Vec::new(),
                    added: links
                        .iter()
                        .map(|(c, p)| LinkRecord {
                            consumer: (*c).into(),
                            provider: (*p).into(),
                            kind: "reference".into(),
                            update_type: "NeedsProvides".into(),
                        })
                        .collect(),
                },
            )
            .unwrap();
        d
    }

    #[test]
    fn one_apps_graph_is_the_whole_graph_filtered() {
        let check = |mut store: Store| {
            two_apps(&mut store);
            // The whole environment read, then selected: what the answer must equal.
            let whole = |query: &GraphQuery| {
                let nodes = store.graph_nodes("development").unwrap();
                let ids: Vec<&str> = nodes.iter().map(|n| n.guresid.as_str()).collect();
                let links = store.links_around("development", &ids).unwrap();
                lay_out(select("development".into(), nodes, query, None), &links)
            };
            let mut asked = 0;
            for app in [
                None,
                Some("shop"),
                Some("billing"),
                Some(GLOBAL_APP),
                Some("none"),
            ] {
                for res_type in [None, Some("postgres"), Some("workload"), Some("dns")] {
                    for view in [None, Some("list")] {
                        let query = GraphQuery {
                            app: app.map(str::to_owned),
                            res_type: res_type.map(str::to_owned),
                            q: None,
                            view: view.map(str::to_owned),
                        };
                        let (selected, links) = read_graph(&store, "development", &query)
                            .unwrap()
                            .expect("a known environment");
                        let answer = lay_out(selected, &links);
                        assert_eq!(answer, whole(&query), "{query:?}");
                        asked += 1;
                    }
                }
            }
            assert_eq!(asked, 40);
            // The census `/apps` answers is the one the whole environment's answer carries,
            // for each type and search.
            for res_type in [None, Some("postgres"), Some("workload"), Some("dns")] {
                for q in [None, Some("SHOP"), Some("dns"), Some("nothing")] {
                    let query = AppsQuery {
                        res_type: res_type.map(str::to_owned),
                        q: q.map(str::to_owned),
                    };
                    let counted = read_apps(&store, "development", &query)
                        .unwrap()
                        .expect("a known environment");
                    let answer = whole(&GraphQuery {
                        res_type: query.res_type.clone(),
                        q: query.q.clone(),
                        ..Default::default()
                    });
                    assert_eq!(Some(counted), answer.census, "{query:?}");
                }
            }
            // What the page shows of one app: its ghosts with their reasons, the failed
            // resource and the links leaving the app; and, from `/apps`, every app with its
            // worst status.
            let billing = read_graph(
                &store,
                "development",
                &GraphQuery {
                    app: Some("billing".into()),
                    ..Default::default()
                },
            )
            .unwrap()
            .map(|(s, l)| lay_out(s, &l))
            .unwrap();
            let nodes: Vec<(&str, &str, bool, usize)> = billing
                .nodes
                .iter()
                .map(|n| (n.guresid.as_str(), n.status, n.ghost, n.hidden_links))
                .collect();
            assert_eq!(
                nodes,
                [
                    ("b-db", "ready", false, 1),
                    ("b-q", "failed", true, 0),
                    ("b-w", "blocked", true, 1),
                ]
            );
            assert_eq!(billing.edges.len(), 2);
            assert_eq!(billing.census, None);
            let counted = read_apps(&store, "development", &AppsQuery::default())
                .unwrap()
                .expect("a known environment");
            let apps: Vec<_> = counted
                .apps
                .iter()
                .map(|a| (a.name.as_deref(), a.count, a.status, a.failed))
                .collect();
            assert_eq!(
                apps,
                [
                    (None, 2, Some("orphaned"), Some(0)),
                    (Some("billing"), 3, Some("failed"), Some(2)),
                    (Some("shop"), 3, Some("failed"), Some(1)),
                ]
            );
            assert_eq!((counted.total, billing.matched), (8, 3));
            assert!(
                read_graph(&store, "production", &GraphQuery::default())
                    .unwrap()
                    .is_none()
            );
            assert!(
                read_apps(&store, "production", &AppsQuery::default())
                    .unwrap()
                    .is_none()
            );
        };
        let dir = tempfile::tempdir().unwrap();
        check(Store::open(&dir.path().join("state.db")).unwrap());
        if let Some(pg) = gitplane_testkit::shared_or_skip("the PostgreSQL half") {
            let key = gitplane_state::KeySource::File(dir.path().join("pg.key"));
            check(Store::open_keyed(std::path::Path::new(&pg.database()), Some(&key)).unwrap());
        }
    }

    /// `apps` apps of a workload and its database each, the databases reading one global
    /// dns, app0's database failed and its workload a ghost blocked by it: the JSON the graph
    /// answers for app0.
    fn app0_answer(apps: usize) -> String {
        use gitplane_state::{Counts, DeploymentStatus};
        let names: Vec<[String; 3]> = (0..apps)
            .map(|a| [format!("app{a}"), format!("{a}-db"), format!("{a}-web")])
            .collect();
        let mut made: Vec<Made<'_>> = vec![("dns", None, "dns", "shared.dns", "ready")];
        let mut links = Vec::new();
        for (a, [app, db, web]) in names.iter().enumerate() {
            let (db_is, web_is) = if a == 0 {
                ("failed", "ghost blocked")
            } else {
                ("ready", "ready")
            };
            made.push((db, Some(app), "postgres", "modules.web.externals.db", db_is));
            made.push((web, Some(app), "workload", "modules.web", web_is));
            links.push((web.as_str(), db.as_str()));
            links.push((db.as_str(), "dns"));
        }
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        let d = record(&mut store, &made, &links);
        store
            .finish_deployment(d, DeploymentStatus::Failed, &Counts::default(), None)
            .unwrap();
        let query = GraphQuery {
            app: Some("app0".into()),
            ..Default::default()
        };
        let (selected, links) = read_graph(&store, "development", &query)
            .unwrap()
            .expect("a known environment");
        serde_json::to_string(&lay_out(selected, &links)).unwrap()
    }

    #[test]
    fn one_apps_answer_is_the_same_among_three_apps_or_three_hundred() {
        let among_three = app0_answer(3);
        let among_300 = app0_answer(300);
        assert_eq!(
            among_three.len(),
            among_300.len(),
            "bytes of app0's answer among 3 apps and among 300"
        );
        assert_eq!(
            among_three, among_300,
            "one app's answer carries nothing of the other apps"
        );
        // What is there is the app: its failed database and the ghost it blocked, their link,
        // and the database's link to the global dns counted.
        let answer: Value = serde_json::from_str(&among_300).unwrap();
        let nodes: Vec<(&str, &str, bool, u64)> = answer["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["guresid"].as_str().unwrap(),
                    n["status"].as_str().unwrap(),
                    n["ghost"].as_bool().unwrap(),
                    n["hidden_links"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [("0-db", "failed", false, 1), ("0-web", "blocked", true, 0)]
        );
        assert_eq!(answer["edges"].as_array().unwrap().len(), 1);
        assert_eq!(answer["matched"], 2);
        for key in ["apps", "types", "total"] {
            assert!(answer.get(key).is_none(), "{key} in {answer}");
        }
    }

    #[tokio::test]
    async fn events_merge_bursts_and_end_when_the_daemon_stops() {
        let (changes, changes_rx) = watch::channel(0u64);
        let (stop, stop_rx) = watch::channel(false);
        let mut events = Box::pin(change_events(changes_rx, stop_rx, EVENT_GAP));
        assert!(events.next().await.is_some(), "hello");
        let burst = tokio::spawn(async move {
            for _ in 0..20 {
                changes.send_modify(|n| *n += 1);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            changes
        });
        let deadline = tokio::time::Instant::now() + Duration::from_millis(450);
        let mut seen = 0;
        while let Ok(event) = tokio::time::timeout_at(deadline, events.next()).await {
            assert!(event.is_some());
            seen += 1;
        }
        assert!(
            (1..=2).contains(&seen),
            "{seen} events for a burst of 20 changes in 100 ms"
        );
        let _changes = burst.await.unwrap();
        stop.send(true).unwrap();
        let end = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        assert!(matches!(end, Ok(None)), "the stream ends on stop");
    }
}
