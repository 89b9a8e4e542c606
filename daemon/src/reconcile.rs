//! The reconciler: runs a plan through the drivers, in parallel and in dependency order, and
//! records every step in state so a crash at any point resumes without duplicating a resource.
//!
//! One task (the caller's) owns the [`Store`] and decides what runs; driver calls run on
//! blocking threads, each resource's calls (polls and retries included) in a task of its own.
//! A resource starts only once everything it depends on is done; one whose upstream failed is
//! skipped as blocked while the rest goes on. Deletions run after every create and update, each
//! orphan after the orphans that depend on it, and only when nothing failed.
//!
//! Crash safety rests on three things: an operation is journalled before its first call; a
//! driver cookie is kept in state as soon as a driver sets it; and drivers are idempotent per
//! GUResID. After a crash the next apply resumes the interrupted deployment (same commit) and
//! calls the driver again with the same GUResID and cookie.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gitplane_state::{
    Counts, DeploymentStatus, OperationStart, ResourceRecord, ResourceStatus, StateError, Store,
};
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::config::{HostConfig, RetryPolicy};
use crate::drivers::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, ErrorKind, PutOutcome, Registry,
};
use crate::graph::{EdgeKind, GuresId, ResourceGraph, ResourceNode};
use crate::plan::{
    Action, Plan, ResolvedInputs, Step, deletion_guard, edge_records, inputs_hash, plan,
    resolve_inputs, same_inputs, split_inputs,
};

/// Progress, for people watching an apply.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// The plan is made: `total` resources may change (create, update, update?, delete).
    Planned { total: usize },
    /// A driver call for this resource is about to start.
    Started { label: &'a str, action: Action },
    /// This resource is done with.
    Finished {
        label: &'a str,
        action: Action,
        outcome: Outcome<'a>,
    },
}

#[derive(Debug, Clone)]
pub enum Outcome<'a> {
    Done,
    /// An `update?` turned out to change nothing.
    Unchanged,
    Failed(&'a str),
    Skipped(&'a str),
}

/// How an apply of one environment ended.
#[derive(Debug, Clone)]
pub struct ApplyReport {
    pub env: String,
    pub deployment: i64,
    /// Whether this apply picked up a deployment that a crash had cut off.
    pub resumed: bool,
    pub status: DeploymentStatus,
    pub counts: Counts,
    /// `label: error` for every failed or skipped resource.
    pub failures: Vec<String>,
}

/// Reads a resource account's credentials by name.
pub type AccountReader = Arc<dyn Fn(&str) -> Result<Value, String> + Send + Sync>;

/// What the reconciler needs from the host configuration.
#[derive(Clone)]
pub struct Settings {
    pub concurrency: usize,
    pub retry: RetryPolicy,
    pub accounts: AccountReader,
}

impl Settings {
    pub fn from_config(config: &HostConfig) -> Self {
        let config = config.clone();
        Settings {
            concurrency: config.concurrency,
            retry: config.retry,
            accounts: Arc::new(move |name| config.account(name).map_err(|e| e.to_string())),
        }
    }
}

/// How one apply runs, beyond what the host config says.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// The held deployment `gitplane approve` released: run as it, past the deletion guard.
    pub approved: Option<i64>,
    /// A drift run: call the driver for every resource, changed or not, so drivers repair what
    /// changed outside gitplane.
    pub drift: bool,
    /// Set when gitplane is stopping: no new driver call starts, calls in flight finish, and
    /// what did not run is recorded as skipped.
    pub stop: Option<Arc<AtomicBool>>,
    /// GUResIDs of pinned resources (`auto_update: false`) to bind to current values anyway:
    /// `gitplane resolve`.
    pub resolve: HashSet<String>,
}

impl ApplyOptions {
    fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
    }
}

/// Applies `graph` (built from `commit`) to its environment.
///
/// A plan that trips the deletion guard is recorded as a held deployment and nothing changes,
/// unless `options.approved` names the held deployment that `gitplane approve` released.
pub async fn apply(
    store: &mut Store,
    drivers: &Registry,
    settings: &Settings,
    graph: &ResourceGraph,
    commit: &str,
    options: &ApplyOptions,
    on_event: &mut (dyn FnMut(&Event<'_>) + Send),
) -> Result<ApplyReport, StateError> {
    let recorded = store.resources(&graph.env)?;
    let recorded_edges = store.edges(&graph.env)?;
    let plan = plan(graph, &recorded, &recorded_edges);
    let (deployment, resumed) = match options.approved {
        Some(id) => (id, false),
        None => {
            if let Some(held) = deletion_guard(&plan, recorded.len(), graph.deletion_threshold) {
                let id =
                    store.held_deployment(&graph.env, commit, &held.deletions, &held.reason)?;
                return Ok(ApplyReport {
                    env: graph.env.clone(),
                    deployment: id,
                    resumed: false,
                    status: DeploymentStatus::Held,
                    counts: Counts::default(),
                    failures: vec![held.reason],
                });
            }
            store.begin_or_resume_deployment(&graph.env, commit, options.drift)?
        }
    };
    on_event(&Event::Planned {
        total: plan
            .steps
            .iter()
            .filter(|s| s.action != Action::Unchanged)
            .count(),
    });
    let mut run = Run {
        options,
        store,
        drivers,
        settings,
        graph,
        commit,
        deployment,
        on_event,
        recorded: recorded.iter().map(|r| (r.guresid.clone(), r)).collect(),
        outputs: HashMap::new(),
        broken: HashSet::new(),
        deleted: HashSet::new(),
        unchanged: 0,
        failed: 0,
        failures: Vec::new(),
        bindings: Vec::new(),
        pinned: HashSet::new(),
        kept: HashMap::new(),
        global: Arc::new(Semaphore::new(settings.concurrency.max(1))),
        per_driver: HashMap::new(),
    };
    for rec in &recorded {
        if rec.status == ResourceStatus::Ready {
            run.outputs.insert(
                GuresId::from_recorded(rec.guresid.clone()),
                (
                    rec.outputs.clone(),
                    rec.secret_outputs.clone(),
                    record_label(rec),
                ),
            );
        }
    }
    run.puts(&plan).await?;
    run.deletes(&plan, &recorded_edges).await?;

    // Orphans not deleted in this run stay recorded, and so do their edges.
    let remaining: HashSet<&str> = plan
        .steps
        .iter()
        .filter(|s| matches!(s.action, Action::Delete | Action::Forget))
        .filter(|s| !run.deleted.contains(&s.guresid))
        .map(|s| s.guresid.as_str())
        .collect();
    let mut edges = edge_records(graph);
    edges.extend(
        recorded_edges
            .into_iter()
            .filter(|e| remaining.contains(e.from.as_str()) || remaining.contains(e.to.as_str())),
    );
    edges.sort();
    edges.dedup_by(|a, b| a.from == b.from && a.to == b.to);
    let orphans: Vec<(String, String)> = remaining
        .iter()
        .map(|g| {
            let why = run
                .kept
                .get(&GuresId::from_recorded((*g).to_owned()))
                .cloned()
                .unwrap_or_else(|| "not deleted yet".to_owned());
            ((*g).to_owned(), why)
        })
        .collect();
    let links = link_records(graph, &run.bindings);
    let Run {
        store,
        unchanged,
        failed,
        failures,
        bindings,
        ..
    } = run;
    store.record_links(deployment, &graph.env, &links, &bindings)?;
    store.mark_orphans(&graph.env, &orphans)?;
    store.replace_edges(&graph.env, &edges)?;
    let mut counts = store.operation_counts(deployment)?;
    counts.unchanged = unchanged;
    counts.failed = failed;
    let status = if failed == 0 {
        DeploymentStatus::Succeeded
    } else {
        DeploymentStatus::Failed
    };
    let error = (!failures.is_empty()).then(|| failures.join("\n"));
    store.finish_deployment(deployment, status, &counts, error.as_deref())?;
    Ok(ApplyReport {
        env: graph.env.clone(),
        deployment,
        resumed,
        status,
        counts,
        failures,
    })
}

/// Outputs, secret outputs and label of every ready resource.
type OutputMap = HashMap<GuresId, (Value, Value, String)>;

struct Run<'a, 'e> {
    options: &'a ApplyOptions,
    store: &'a mut Store,
    drivers: &'a Registry,
    settings: &'a Settings,
    graph: &'a ResourceGraph,
    commit: &'a str,
    deployment: i64,
    on_event: &'e mut (dyn FnMut(&Event<'_>) + Send),
    recorded: HashMap<String, &'a ResourceRecord>,
    outputs: OutputMap,
    /// Resources that failed or were skipped: their dependents are blocked.
    broken: HashSet<GuresId>,
    /// Orphans deleted in this run.
    deleted: HashSet<GuresId>,
    unchanged: i64,
    failed: i64,
    failures: Vec<String>,
    /// The bindings of every resource resolved in this run.
    bindings: Vec<gitplane_state::BindingRecord>,
    /// Resources kept as last bound (`auto_update: false`) although their inputs changed.
    pinned: HashSet<GuresId>,
    /// Why each orphan that was not deleted is kept.
    kept: HashMap<GuresId, String>,
    /// Permits for driver calls: one global limit, and one per driver that sets its own.
    global: Arc<Semaphore>,
    per_driver: HashMap<String, Arc<Semaphore>>,
}

/// Put or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Put,
    Delete,
}

/// Everything one driver call needs, owned, so it can move to a blocking thread.
struct Job {
    operation: Operation,
    guresid: String,
    env: String,
    app: Option<String>,
    res_type: String,
    class: String,
    res_id: String,
    resource: Value,
    values: Value,
    secrets: Value,
    account: Option<Value>,
    cookie: Option<String>,
}

impl Job {
    fn request(&self) -> DriverRequest<'_> {
        DriverRequest {
            guresid: &self.guresid,
            env: &self.env,
            app: self.app.as_deref(),
            res_type: &self.res_type,
            class: &self.class,
            res_id: &self.res_id,
            resource: &self.resource,
            values: &self.values,
            secrets: &self.secrets,
            account: self.account.as_ref(),
            cookie: self.cookie.as_deref(),
        }
    }
}

/// How a job's calls ended.
struct JobResult {
    guresid: GuresId,
    operation_id: i64,
    attempts: i64,
    outcome: Result<(Value, Value), String>,
    /// For puts: what the resource is recorded with on success.
    hash: String,
    inputs: Option<ResolvedInputs>,
}

/// What a spawned job's result carries back besides the driver's answer.
struct Spawn {
    guresid: GuresId,
    operation_id: i64,
    hash: String,
    inputs: Option<ResolvedInputs>,
}

/// What starting a resource led to.
enum Started {
    /// Running in a task; its result comes from the join set.
    Spawned,
    /// Decided at once (unchanged, blocked, or failed before any call).
    Settled,
}

impl Run<'_, '_> {
    async fn puts(&mut self, plan: &Plan) -> Result<(), StateError> {
        let steps: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| !matches!(s.action, Action::Delete | Action::Forget))
            .collect();
        let prerequisites: HashMap<GuresId, Vec<GuresId>> = steps
            .iter()
            .map(|s| {
                let deps = self
                    .graph
                    .dependencies(&s.guresid)
                    .into_iter()
                    .cloned()
                    .collect();
                (s.guresid.clone(), deps)
            })
            .collect();
        self.schedule(&steps, &prerequisites, Operation::Put).await
    }

    async fn deletes(
        &mut self,
        plan: &Plan,
        recorded_edges: &[gitplane_state::EdgeRecord],
    ) -> Result<(), StateError> {
        let steps: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::Delete | Action::Forget))
            .collect();
        if steps.is_empty() {
            return Ok(());
        }
        if !self.broken.is_empty() {
            let why = format!(
                "held back: {} resource(s) failed in this deployment, and deleting now could \
                 remove what they still need",
                self.broken.len()
            );
            for step in steps {
                let action = if step.action == Action::Forget {
                    "forget"
                } else {
                    "delete"
                };
                self.skip(step, action, &why)?;
                self.kept.insert(step.guresid.clone(), why.clone());
            }
            return Ok(());
        }
        let steps: Vec<&Step> = steps
            .into_iter()
            .filter(|s| s.action == Action::Delete)
            .collect();
        // An orphan waits for the orphans that depend on it.
        let orphans: HashSet<&str> = steps.iter().map(|s| s.guresid.as_str()).collect();
        let mut prerequisites: HashMap<GuresId, Vec<GuresId>> = steps
            .iter()
            .map(|s| (s.guresid.clone(), Vec::new()))
            .collect();
        for e in recorded_edges {
            if orphans.contains(e.from.as_str())
                && orphans.contains(e.to.as_str())
                && let Some(p) = prerequisites.get_mut(&GuresId::from_recorded(e.to.clone()))
            {
                p.push(GuresId::from_recorded(e.from.clone()));
            }
        }
        self.schedule(&steps, &prerequisites, Operation::Delete)
            .await?;
        self.forget(plan)
    }

    /// `deletion_policy: orphan`: after the deletions, gitplane stops managing these resources;
    /// no driver is called, the resources themselves stay.
    fn forget(&mut self, plan: &Plan) -> Result<(), StateError> {
        let forget: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| s.action == Action::Forget)
            .collect();
        for step in forget {
            // No driver is called: the resource stays, gitplane stops managing it.
            let op = self
                .store
                .begin_operation(&self.start(step, "forget", &step.reason))?;
            self.store
                .finish_delete(op, 0, step.guresid.as_str(), None)?;
            self.deleted.insert(step.guresid.clone());
            (self.on_event)(&Event::Finished {
                label: &step.label(),
                action: Action::Forget,
                outcome: Outcome::Done,
            });
        }
        Ok(())
    }

    /// Runs `steps`, each once its prerequisites are done, as many at once as permits allow.
    async fn schedule(
        &mut self,
        steps: &[&Step],
        prerequisites: &HashMap<GuresId, Vec<GuresId>>,
        operation: Operation,
    ) -> Result<(), StateError> {
        let by_id: HashMap<&GuresId, &Step> = steps.iter().map(|s| (&s.guresid, *s)).collect();
        let mut waiting: HashMap<&GuresId, usize> = HashMap::new();
        let mut unlocks: HashMap<&GuresId, Vec<&GuresId>> = HashMap::new();
        for s in steps {
            let pre: Vec<&GuresId> = prerequisites
                .get(&s.guresid)
                .into_iter()
                .flatten()
                .filter(|p| by_id.contains_key(p))
                .collect();
            waiting.insert(&s.guresid, pre.len());
            for p in pre {
                unlocks.entry(p).or_default().push(&s.guresid);
            }
        }
        // Plan order breaks ties, so runs are reproducible.
        let mut ready: VecDeque<&GuresId> = steps
            .iter()
            .map(|s| &s.guresid)
            .filter(|id| waiting[id] == 0)
            .collect();
        let (calls_tx, mut calls_rx) = mpsc::unbounded_channel::<CallEnded>();
        let mut tasks: JoinSet<JobResult> = JoinSet::new();
        let mut finished: Vec<GuresId> = Vec::new();
        loop {
            while let Some(id) = ready.pop_front() {
                let step = by_id[id];
                if self.options.stopping() {
                    let action = match operation {
                        Operation::Put if self.recorded.contains_key(step.guresid.as_str()) => {
                            "update"
                        }
                        Operation::Put => "create",
                        Operation::Delete => "delete",
                    };
                    if step.action != Action::Unchanged || self.options.drift {
                        self.skip(step, action, "stopped: gitplane is shutting down")?;
                    } else {
                        self.unchanged += 1;
                    }
                    finished.push(id.clone());
                    continue;
                }
                let started = match operation {
                    Operation::Put => self.start_put(step, &mut tasks, &calls_tx)?,
                    Operation::Delete => self.start_delete(step, &mut tasks, &calls_tx)?,
                };
                if let Started::Settled = started {
                    finished.push(id.clone());
                }
            }
            for id in finished.drain(..) {
                for next in unlocks.get(&id).into_iter().flatten() {
                    let w = waiting.get_mut(next).expect("every step has a count");
                    *w -= 1;
                    if *w == 0 {
                        ready.push_back(next);
                    }
                }
            }
            if !ready.is_empty() {
                continue;
            }
            if tasks.is_empty() {
                break;
            }
            tokio::select! {
                Some(call) = calls_rx.recv() => self.journal_call(&call)?,
                Some(joined) = tasks.join_next() => {
                    // The calls a task made are journalled before its result is.
                    while let Ok(call) = calls_rx.try_recv() {
                        self.journal_call(&call)?;
                    }
                    let result = joined.expect("job tasks catch driver panics themselves");
                    let id = result.guresid.clone();
                    let step = by_id[&id];
                    match operation {
                        Operation::Put => self.finish_put(step, result)?,
                        Operation::Delete => self.finish_delete(step, result)?,
                    }
                    finished.push(id);
                }
            }
        }
        Ok(())
    }

    /// Journals one finished driver call: how many calls the operation has made, and the
    /// cookie the driver wants kept.
    fn journal_call(&mut self, call: &CallEnded) -> Result<(), StateError> {
        let cookie = match &call.cookie {
            Cookie::Unchanged => None,
            Cookie::Set(c) => Some(Some(c.as_str())),
            Cookie::Cleared => Some(None),
        };
        self.store
            .record_call(call.operation, call.attempts, &call.guresid, cookie)
    }

    fn start_put(
        &mut self,
        step: &Step,
        tasks: &mut JoinSet<JobResult>,
        calls_tx: &mpsc::UnboundedSender<CallEnded>,
    ) -> Result<Started, StateError> {
        let Some(node) = self.graph.get(&step.guresid) else {
            return Ok(Started::Settled);
        };
        let action = if self.recorded.contains_key(node.guresid.as_str()) {
            "update"
        } else {
            "create"
        };
        if let Some(blocker) = self
            .graph
            .dependencies(&node.guresid)
            .into_iter()
            .find(|d| self.broken.contains(*d))
        {
            let blocker = self
                .graph
                .get(blocker)
                .map(ResourceNode::label)
                .unwrap_or_else(|| blocker.to_string());
            self.skip(step, action, &format!("blocked: {blocker} failed"))?;
            return Ok(Started::Settled);
        }
        let inputs = match resolve_inputs(node, &self.outputs) {
            Ok(inputs) => inputs,
            Err(e) => {
                let error = format!("inputs do not resolve: {e}");
                self.fail_before_call(step, action, &error)?;
                return Ok(Started::Settled);
            }
        };
        let hash = inputs_hash(node, &inputs);
        let recorded = self
            .recorded
            .get(node.guresid.as_str())
            .copied()
            .filter(|rec| {
                rec.status == ResourceStatus::Ready
                    && rec.definition == node.definition
                    && rec.driver == node.driver_type
            });
        // auto_update: false keeps a resource as last bound while only what it reads changed.
        if let Some(rec) = recorded
            && !self.options.drift
            && !node.auto_update
            && rec.template_hash == node.template_hash
            && !same_inputs(rec, &hash, &inputs)
            && !self.options.resolve.contains(node.guresid.as_str())
        {
            self.unchanged += 1;
            self.pinned.insert(node.guresid.clone());
            let previous = self.store.latest_bindings(node.guresid.as_str())?;
            self.bindings.extend(previous);
            return Ok(Started::Settled);
        }
        self.bindings
            .extend(crate::plan::bindings_of(node, &self.outputs));
        if let Some(rec) = recorded
            && !self.options.drift
            && same_inputs(rec, &hash, &inputs)
        {
            if rec.template_hash != node.template_hash {
                self.store
                    .set_template_hash(node.guresid.as_str(), &node.template_hash)?;
            }
            self.unchanged += 1;
            if step.action != Action::Unchanged {
                (self.on_event)(&Event::Finished {
                    label: &step.label(),
                    action: Action::Update,
                    outcome: Outcome::Unchanged,
                });
            }
            return Ok(Started::Settled);
        }
        let account = match &node.driver_account {
            None => None,
            Some(name) => match (self.settings.accounts)(name) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail_before_call(step, action, &e)?;
                    return Ok(Started::Settled);
                }
            },
        };
        let Some(registered) = self.drivers.get(&node.driver_type).cloned() else {
            let error = format!("no driver '{}' is registered", node.driver_type);
            self.fail_before_call(step, action, &error)?;
            return Ok(Started::Settled);
        };
        let reason = match step.action {
            _ if self.options.drift && step.action == Action::Unchanged => {
                "drift run: re-applied so the driver can repair drift".to_owned()
            }
            Action::MaybeUpdate | Action::Unchanged => "inputs changed".to_owned(),
            _ => step.reason.clone(),
        };
        let operation_id = self
            .store
            .begin_operation(&self.start(step, action, &reason))?;
        let job = Job {
            operation: Operation::Put,
            guresid: node.guresid.to_string(),
            env: self.graph.env.clone(),
            app: node.app.clone(),
            res_type: node.res_type.clone(),
            class: node.class.clone(),
            res_id: node.res_id.clone(),
            resource: inputs.resource.clone(),
            values: inputs.values.clone(),
            secrets: inputs.secrets.clone(),
            account,
            cookie: self.store.cookie(node.guresid.as_str())?,
        };
        (self.on_event)(&Event::Started {
            label: &step.label(),
            action: action_of(action),
        });
        let spawned = Spawn {
            guresid: node.guresid.clone(),
            operation_id,
            hash,
            inputs: Some(inputs),
        };
        self.spawn(tasks, calls_tx, job, &node.driver_type, registered, spawned);
        Ok(Started::Spawned)
    }

    fn finish_put(&mut self, step: &Step, result: JobResult) -> Result<(), StateError> {
        let Some(node) = self.graph.get(&step.guresid) else {
            return Ok(());
        };
        let action = if self.recorded.contains_key(node.guresid.as_str()) {
            "update"
        } else {
            "create"
        };
        let label = node.label();
        match result.outcome {
            Ok((outputs, secret_outputs)) => {
                let inputs = result.inputs.unwrap_or(ResolvedInputs {
                    resource: Value::Null,
                    resource_is_secret: false,
                    values: Value::Null,
                    secrets: Value::Null,
                });
                // What a delete will need again; anything a secret flowed into stays secret.
                let (public, secret) = split_inputs(&inputs);
                let record = ResourceRecord {
                    status: ResourceStatus::Ready,
                    inputs_hash: result.hash,
                    outputs: outputs.clone(),
                    secret_outputs: secret_outputs.clone(),
                    inputs: public,
                    secret_inputs: secret,
                    error: None,
                    ..self.record(node)
                };
                let changed = self.recorded.get(node.guresid.as_str()).is_none_or(|rec| {
                    rec.outputs != record.outputs || rec.secret_outputs != record.secret_outputs
                });
                self.store.finish_put(
                    result.operation_id,
                    result.attempts,
                    self.deployment,
                    &record,
                    Some(changed),
                )?;
                self.outputs.insert(
                    node.guresid.clone(),
                    (outputs, secret_outputs, label.clone()),
                );
                (self.on_event)(&Event::Finished {
                    label: &label,
                    action: action_of(action),
                    outcome: Outcome::Done,
                });
            }
            Err(error) => {
                // A failed update keeps what was last provisioned: dependents may still use it.
                let previous = self.recorded.get(node.guresid.as_str()).copied();
                let record = ResourceRecord {
                    status: ResourceStatus::Failed,
                    error: Some(error.clone()),
                    ..previous.cloned().unwrap_or_else(|| self.record(node))
                };
                let record = ResourceRecord {
                    definition: node.definition.clone(),
                    driver: node.driver_type.clone(),
                    commit_id: self.commit.to_owned(),
                    ..record
                };
                self.store.finish_put(
                    result.operation_id,
                    result.attempts,
                    self.deployment,
                    &record,
                    None,
                )?;
                self.failed(label, &node.guresid, action, &error);
            }
        }
        Ok(())
    }

    fn start_delete(
        &mut self,
        step: &Step,
        tasks: &mut JoinSet<JobResult>,
        calls_tx: &mpsc::UnboundedSender<CallEnded>,
    ) -> Result<Started, StateError> {
        let Some(rec) = self.recorded.get(step.guresid.as_str()).copied() else {
            return Ok(Started::Settled);
        };
        let account = match &rec.account {
            None => None,
            Some(name) => match (self.settings.accounts)(name) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail_before_call(step, "delete", &e)?;
                    return Ok(Started::Settled);
                }
            },
        };
        let Some(registered) = self.drivers.get(&rec.driver).cloned() else {
            let error = format!("no driver '{}' is registered", rec.driver);
            self.fail_before_call(step, "delete", &error)?;
            return Ok(Started::Settled);
        };
        let operation_id = self
            .store
            .begin_operation(&self.start(step, "delete", &step.reason))?;
        let job = Job {
            operation: Operation::Delete,
            guresid: rec.guresid.clone(),
            env: rec.env.clone(),
            app: rec.app.clone(),
            res_type: rec.res_type.clone(),
            class: rec.class.clone(),
            res_id: rec.res_id.clone(),
            resource: rec
                .inputs
                .get("resource")
                .or_else(|| rec.secret_inputs.get("resource"))
                .cloned()
                .unwrap_or(Value::Null),
            values: rec.inputs.get("values").cloned().unwrap_or(Value::Null),
            secrets: rec
                .secret_inputs
                .get("secrets")
                .cloned()
                .unwrap_or(Value::Null),
            account,
            cookie: self.store.cookie(&rec.guresid)?,
        };
        (self.on_event)(&Event::Started {
            label: &step.label(),
            action: Action::Delete,
        });
        let spawned = Spawn {
            guresid: step.guresid.clone(),
            operation_id,
            hash: String::new(),
            inputs: None,
        };
        self.spawn(tasks, calls_tx, job, &rec.driver, registered, spawned);
        Ok(Started::Spawned)
    }

    fn finish_delete(&mut self, step: &Step, result: JobResult) -> Result<(), StateError> {
        let label = step.label();
        match result.outcome {
            Ok(_) => {
                self.store.finish_delete(
                    result.operation_id,
                    result.attempts,
                    step.guresid.as_str(),
                    None,
                )?;
                self.deleted.insert(step.guresid.clone());
                (self.on_event)(&Event::Finished {
                    label: &label,
                    action: Action::Delete,
                    outcome: Outcome::Done,
                });
            }
            Err(error) => {
                self.store.finish_delete(
                    result.operation_id,
                    result.attempts,
                    step.guresid.as_str(),
                    Some(&error),
                )?;
                self.kept
                    .insert(step.guresid.clone(), format!("its delete failed: {error}"));
                self.failed(label, &step.guresid, "delete", &error);
            }
        }
        Ok(())
    }

    /// Runs `job`'s calls in a task of their own, under the global and the driver's permits.
    fn spawn(
        &mut self,
        tasks: &mut JoinSet<JobResult>,
        calls_tx: &mpsc::UnboundedSender<CallEnded>,
        job: Job,
        driver_type: &str,
        registered: crate::drivers::Registered,
        spawned: Spawn,
    ) {
        let permits = self.permits(driver_type, registered.concurrency);
        let retry = self.settings.retry;
        let calls = calls_tx.clone();
        let stop = self.options.stop.clone();
        tasks.spawn(async move {
            let (attempts, outcome) = call_until_done(
                job,
                spawned.operation_id,
                registered.driver,
                permits,
                retry,
                calls,
                stop,
            )
            .await;
            JobResult {
                guresid: spawned.guresid,
                operation_id: spawned.operation_id,
                attempts,
                outcome,
                hash: spawned.hash,
                inputs: spawned.inputs,
            }
        });
    }

    fn permits(&mut self, driver: &str, limit: Option<usize>) -> Permits {
        let local = limit.map(|n| {
            self.per_driver
                .entry(driver.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(n.max(1))))
                .clone()
        });
        Permits {
            global: self.global.clone(),
            local,
        }
    }

    /// No driver was called, so the resource itself is as it was: only the operation fails.
    fn fail_before_call(
        &mut self,
        step: &Step,
        action: &str,
        error: &str,
    ) -> Result<(), StateError> {
        let op = self
            .store
            .begin_operation(&self.start(step, action, &step.reason))?;
        self.store.fail_operation(op, 0, error)?;
        self.failed(step.label(), &step.guresid, action, error);
        Ok(())
    }

    fn failed(&mut self, label: String, guresid: &GuresId, action: &str, error: &str) {
        self.broken.insert(guresid.clone());
        self.failed += 1;
        self.failures.push(format!("{label}: {error}"));
        (self.on_event)(&Event::Finished {
            label: &label,
            action: action_of(action),
            outcome: Outcome::Failed(error),
        });
    }

    fn skip(&mut self, step: &Step, action: &str, why: &str) -> Result<(), StateError> {
        self.store
            .skipped_operation(&self.start(step, action, &step.reason), why)?;
        self.broken.insert(step.guresid.clone());
        self.failed += 1;
        self.failures.push(format!("{}: {why}", step.label()));
        (self.on_event)(&Event::Finished {
            label: &step.label(),
            action: action_of(action),
            outcome: Outcome::Skipped(why),
        });
        Ok(())
    }

    fn start<'s>(&self, step: &'s Step, action: &'s str, reason: &'s str) -> OperationStart<'s> {
        OperationStart {
            deployment: self.deployment,
            guresid: step.guresid.as_str(),
            app: step.app.as_deref(),
            res_type: &step.res_type,
            class: &step.class,
            res_id: &step.res_id,
            action,
            reason,
        }
    }

    /// A record of `node` as this run provisions it; outputs and inputs are filled by callers.
    fn record(&self, node: &ResourceNode) -> ResourceRecord {
        crate::plan::record_of(node, &self.graph.env, self.commit)
    }
}

/// The links of a graph: each edge, consumer to provider, with its update type.
fn link_records(
    graph: &ResourceGraph,
    bindings: &[gitplane_state::BindingRecord],
) -> Vec<gitplane_state::LinkRecord> {
    graph
        .edges()
        .into_iter()
        .map(|e| {
            let (consumer, provider) = (e.from.to_string(), e.to.to_string());
            let update_type = match e.kind {
                EdgeKind::Reference | EdgeKind::Selector => {
                    let mut over = bindings
                        .iter()
                        .filter(|b| b.needed == consumer && b.provided == provider)
                        .peekable();
                    if over.peek().is_some() && over.all(|b| b.inserted) {
                        "Insert"
                    } else {
                        "NeedsProvides"
                    }
                }
                EdgeKind::Dependency | EdgeKind::Coprovision | EdgeKind::Implicit => "None",
            };
            gitplane_state::LinkRecord {
                consumer,
                provider,
                kind: e.kind.as_str().to_owned(),
                update_type: update_type.to_owned(),
            }
        })
        .collect()
}

/// One driver call that ended, to journal.
struct CallEnded {
    guresid: String,
    operation: i64,
    /// Calls the operation has made so far.
    attempts: i64,
    cookie: Cookie,
}

/// The permits a driver call holds: the global one and, if its driver has a limit, its own.
struct Permits {
    global: Arc<Semaphore>,
    local: Option<Arc<Semaphore>>,
}

/// Calls the driver until the resource is done, polling while it is in progress and retrying
/// transient failures with exponential backoff and jitter. Permits are held only during calls,
/// so a resource that waits between polls leaves room for others.
///
/// Every call is reported to `calls` as it ends (with the cookie the driver set), before the
/// next one starts and before this returns, so the journal is never behind the driver.
/// Returns the number of calls and the outputs or the error.
async fn call_until_done(
    mut job: Job,
    operation: i64,
    driver: Arc<dyn Driver>,
    permits: Permits,
    retry: RetryPolicy,
    calls: mpsc::UnboundedSender<CallEnded>,
    stop: Option<Arc<AtomicBool>>,
) -> (i64, Result<(Value, Value), String>) {
    let stopping = || stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
    let started = Instant::now();
    let mut attempts: i64 = 0;
    let mut transient_failures: u32 = 0;
    let mut poll_delay = retry.poll_interval;
    loop {
        attempts += 1;
        let answer = {
            let _global = permits.global.acquire().await.expect("never closed");
            let _local = match &permits.local {
                Some(s) => Some(s.acquire().await.expect("never closed")),
                None => None,
            };
            let driver = driver.clone();
            tokio::task::spawn_blocking(move || {
                let answer = match job.operation {
                    Operation::Put => driver.put(&job.request()).map(|o| match o {
                        PutOutcome::Done {
                            outputs,
                            secret_outputs,
                            cookie,
                        } => (Some((outputs, secret_outputs)), cookie),
                        PutOutcome::InProgress { cookie } => (None, cookie),
                    }),
                    Operation::Delete => driver.delete(&job.request()).map(|o| match o {
                        DeleteOutcome::Done => (Some((empty(), empty())), Cookie::Cleared),
                        DeleteOutcome::InProgress { cookie } => (None, cookie),
                    }),
                };
                (job, answer)
            })
            .await
        };
        let (returned, answer) = match answer {
            Ok(pair) => pair,
            Err(panic) => {
                return (attempts, Err(format!("the driver panicked: {panic}")));
            }
        };
        job = returned;
        let cookie = match &answer {
            Ok((_, cookie)) => cookie.clone(),
            Err(_) => Cookie::Unchanged,
        };
        match &cookie {
            Cookie::Unchanged => {}
            Cookie::Set(c) => job.cookie = Some(c.clone()),
            Cookie::Cleared => job.cookie = None,
        }
        // The receiver lives as long as any job; a send can only fail when it is gone.
        let _ = calls.send(CallEnded {
            guresid: job.guresid.clone(),
            operation,
            attempts,
            cookie,
        });
        match answer {
            Ok((done, _)) => {
                if let Some(outputs) = done {
                    return (attempts, Ok(outputs));
                }
                if started.elapsed() >= retry.poll_timeout {
                    let error = format!(
                        "still in progress after {}s (retry.poll_timeout)",
                        retry.poll_timeout.as_secs()
                    );
                    return (attempts, Err(error));
                }
                if stopping() {
                    let error = "stopped while in progress (gitplane is shutting down); the next \
                                 run calls the driver again with the same cookie";
                    return (attempts, Err(error.to_owned()));
                }
                tokio::time::sleep(poll_delay).await;
                poll_delay = (poll_delay * 2).min(retry.max_delay.max(retry.poll_interval));
            }
            Err(DriverError {
                kind: ErrorKind::Transient,
                message,
            }) => {
                transient_failures += 1;
                if transient_failures >= retry.attempts {
                    let error = format!("{message} (gave up after {transient_failures} attempts)");
                    return (attempts, Err(error));
                }
                if stopping() {
                    return (
                        attempts,
                        Err(format!(
                            "{message} (not retried: gitplane is shutting down)"
                        )),
                    );
                }
                tokio::time::sleep(backoff(&retry, transient_failures, &job.guresid)).await;
            }
            Err(DriverError {
                kind: ErrorKind::Final,
                message,
            }) => return (attempts, Err(message)),
        }
    }
}

/// `initial_delay * 2^(n-1)`, capped at `max_delay`, times a random factor in [0.5, 1.5) so
/// resources that failed together do not retry together.
fn backoff(retry: &RetryPolicy, failures: u32, salt: &str) -> Duration {
    let exp = retry
        .initial_delay
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    let capped = exp.min(retry.max_delay);
    let random = std::collections::hash_map::RandomState::new().hash_one((salt, failures));
    let factor = 0.5 + (random % 1000) as f64 / 1000.0;
    capped.mul_f64(factor)
}

fn action_of(action: &str) -> Action {
    match action {
        "create" => Action::Create,
        "delete" => Action::Delete,
        _ => Action::Update,
    }
}

/// `app/type.class#res_id` of a recorded resource.
pub fn record_label(rec: &ResourceRecord) -> String {
    crate::graph::label(rec.app.as_deref(), &rec.res_type, &rec.class, &rec.res_id)
}

fn empty() -> Value {
    Value::Object(Default::default())
}
