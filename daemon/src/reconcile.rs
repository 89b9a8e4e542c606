//! The reconciler: runs a plan through the drivers, in parallel and in dependency order, and
//! records every step in state so a crash at any point resumes without duplicating a resource.
//!
//! One task (the caller's) owns the [`Store`] and decides what runs; driver calls run through
//! the call engine ([`crate::calls`]) on blocking threads, each resource's calls (polls and
//! retries included) in a task of its own, spawned once its first call's permits are taken.
//! A resource starts only once everything it depends on is done; one whose upstream failed is
//! skipped as blocked while the rest goes on. Deletions run after every create and update, each
//! orphan after the orphans that depend on it, and only when nothing failed.
//!
//! Work follows the change: a resource the plan found unchanged costs no driver call, no
//! resolution and no write, so a commit that changes nothing records its deployment and nothing
//! else. Links and bindings are written as what changed (rows valid from one deployment to
//! another), and journal writes go in batches, one transaction per batch.
//!
//! Crash safety rests on three things: an operation is journalled before its first call; a
//! driver cookie is kept in state as soon as a driver sets it; and drivers are idempotent per
//! GUResID. After a crash the next apply resumes the interrupted deployment (same commit) and
//! calls the driver again with the same GUResID and cookie.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use gitplane_state::{
    BindingRecord, Counts, DeploymentStatus, Ended, EndedPut, JournalEntry, LinkChanges,
    LinkRecord, ManifestsRecord, OperationStart, OwnedBatch, ResourceRecord, ResourceStatus,
    SealedPut, Sealer, StartRow, StateError, Store,
};
use rayon::prelude::*;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::calls::{Call, Caller, Failure, Halt, Halted, Held, Limits, Permits, call_until_done};
use crate::config::{HostConfig, RetryPolicy};
use crate::deploy::{Scope, Target};
use crate::drivers::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, ErrorKind, Manifest, OwnedRequest,
    PutOutcome, Registry, leaks,
};
use crate::graph::{EdgeKind, GuresId, ResourceGraph, ResourceNode};
use crate::manifests;
use crate::plan::{
    Action, Outputs, Plan, ResolveError, ResolvedInputs, Step, bindings_of, deletion_guard,
    inputs_hash, plan, record_label, resolve_inputs, same_inputs, split_inputs,
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
    /// Nothing more can start until a driver answers, which may take a while: what was
    /// reported so far should be shown now.
    Waiting,
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

pub use crate::calls::{CallObserver, CallResult};

/// What the reconciler needs from the host configuration.
#[derive(Clone)]
pub struct Settings {
    pub concurrency: usize,
    pub retry: RetryPolicy,
    pub accounts: AccountReader,
    /// Told of every driver call; `None` outside the daemon.
    pub calls: Option<Arc<dyn CallObserver>>,
}

impl Settings {
    pub fn from_config(config: &HostConfig) -> Self {
        let config = config.clone();
        Settings {
            concurrency: config.concurrency,
            retry: config.retry,
            accounts: Arc::new(move |name| config.account(name).map_err(|e| e.to_string())),
            calls: None,
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
    /// The environment's lease, when daemons share a PostgreSQL state: once it is no longer
    /// held (taken over, or not renewed in time) no new driver call starts, as when stopping.
    pub lease: Option<Arc<gitplane_state::LeaseHold>>,
    /// The environment's apply lock: once another process took it over, or it went unrenewed
    /// long enough that one may have, no new driver call starts, as when stopping.
    pub lock: Option<Arc<gitplane_state::LockHold>>,
    /// GUResIDs of pinned resources (`auto_update: false`) to bind to current values anyway:
    /// `gitplane resolve`.
    pub resolve: HashSet<String>,
    /// The environment itself goes (a preview whose branch was deleted or whose time ran out):
    /// deleting all of it is the point, so the deletion guard does not hold it.
    pub removing_env: bool,
}

impl ApplyOptions {
    /// What stops this apply's driver calls.
    fn halt(&self) -> Halt {
        Halt {
            stop: self.stop.clone(),
            lease: self.lease.clone(),
            lock: self.lock.clone(),
        }
    }
}

/// The deletion guard's verdict on `plan`, the plan of `target` against the `in_scope`
/// resources its scope read: the one verdict `apply`, `plan` and the pull-request review give.
///
/// It is judged on the whole environment's recorded resources, whatever part of it the commit
/// made gitplane read, so removing apps is judged alike whether or not the commit also changed
/// what every app reads. A commit is judged by the threshold in force, or by its own where that
/// is lower: a commit that raises the threshold must not let through its own mass deletion.
pub fn guard_verdict(
    store: &Store,
    target: &Target,
    plan: &Plan,
    in_scope: usize,
) -> Result<Option<crate::plan::Held>, StateError> {
    // Only deletions are held: a plan without any needs no count of what is recorded.
    if !plan.steps.iter().any(|s| s.action == Action::Delete) {
        return Ok(None);
    }
    let graph = &target.graph;
    let environment = match target.scope.apps {
        None => in_scope,
        Some(_) => usize::try_from(store.resource_count(&graph.env)?).unwrap_or(usize::MAX),
    };
    let threshold = match store.threshold_in_force(&graph.env)? {
        Some(in_force) => in_force.min(graph.deletion_threshold),
        None => graph.deletion_threshold,
    };
    let recorded = crate::plan::RecordedCount {
        environment,
        in_scope,
    };
    let Some(mut held) = deletion_guard(plan, recorded, threshold) else {
        return Ok(None);
    };
    if graph.env_removed {
        held.reason.push_str(&format!(
            " (the commit has no environments/{}.yaml: the environment was removed)",
            graph.env
        ));
    }
    if threshold < graph.deletion_threshold {
        held.reason.push_str(&format!(
            " (this commit raises the threshold to {}%, which takes effect once it is applied)",
            graph.deletion_threshold
        ));
    }
    Ok(Some(held))
}

/// Applies `target` (built from `commit`) to its environment.
///
/// A plan that trips the deletion guard is recorded as a held deployment and nothing changes,
/// unless `options.approved` names the held deployment that `gitplane approve` released. With
/// a target of some apps, the others are left as they are and counted as unchanged.
pub async fn apply(
    store: &mut Store,
    drivers: &Registry,
    settings: &Settings,
    target: &Target,
    commit: &str,
    options: &ApplyOptions,
    on_event: &mut (dyn FnMut(&Event<'_>) + Send),
) -> Result<ApplyReport, StateError> {
    let graph = &target.graph;
    let planning = tracing::debug_span!("plan").entered();
    let (recorded, links) = crate::deploy::recorded_in_scope(store, target)?;
    let plan = plan(graph, &recorded, &links);
    drop(planning);
    let (deployment, resumed) = match options.approved {
        Some(id) => (id, false),
        None if options.removing_env => {
            store.begin_or_resume_deployment(&graph.env, commit, false, graph.deletion_threshold)?
        }
        None => {
            if let Some(held) = guard_verdict(store, target, &plan, recorded.len())? {
                let id = store.held_deployment(
                    &graph.env,
                    commit,
                    &held.deletions,
                    &held.reason,
                    graph.deletion_threshold,
                )?;
                return Ok(ApplyReport {
                    env: graph.env.clone(),
                    deployment: id,
                    resumed: false,
                    status: DeploymentStatus::Held,
                    counts: Counts::default(),
                    failures: vec![held.reason],
                });
            }
            store.begin_or_resume_deployment(
                &graph.env,
                commit,
                options.drift,
                graph.deletion_threshold,
            )?
        }
    };
    // Until this deployment ends, the apps it looks at are not as any fingerprint says: should
    // it stop half way, the next one must look at them again, whatever commit it brings.
    store.record_fingerprints(
        &graph.env,
        deployment,
        &[],
        &looked_at(&target.scope, &recorded),
    )?;
    on_event(&Event::Planned {
        total: plan
            .steps
            .iter()
            .filter(|s| s.action != Action::Unchanged)
            .count(),
    });
    let recorded_by_id: HashMap<&str, &ResourceRecord> =
        recorded.iter().map(|r| (r.guresid.as_str(), r)).collect();
    let done_before = if resumed {
        store.operated(deployment)?
    } else {
        HashSet::new()
    };
    let mut run = Run {
        options,
        journal: Journal::new(store),
        drivers,
        settings,
        graph,
        commit,
        deployment,
        on_event,
        outputs: RunOutputs {
            graph,
            recorded: &recorded_by_id,
            fresh: HashMap::new(),
        },
        broken: HashSet::new(),
        deleted: HashSet::new(),
        unchanged: 0,
        done_before,
        succeeded: Counts::default(),
        failed: 0,
        failures: Vec::new(),
        bindings: Vec::new(),
        bound: None,
        looked_for_bindings: false,
        rebound: HashSet::new(),
        inserting: HashSet::new(),
        readers: HashMap::new(),
        pinned: HashSet::new(),
        template_hashes: Vec::new(),
        ended: Vec::new(),
        kept: HashMap::new(),
        cookies: HashMap::new(),
        cookies_kept: true,
        limits: Limits::new(settings.concurrency),
        halt: options.halt(),
    };
    let span = tracing::debug_span!("puts");
    run.puts(&plan).instrument(span).await?;
    let span = tracing::debug_span!("deletes");
    run.deletes(&plan, &links).instrument(span).await?;
    let recording = tracing::debug_span!("record graph").entered();
    let orphans = run.record_graph(&plan, &links)?;
    run.record_fingerprints(&target.scope, &recorded, &orphans)?;
    drop(recording);
    let _finishing = tracing::debug_span!("finish").entered();
    let Run {
        journal,
        unchanged,
        succeeded,
        failed,
        failures,
        ..
    } = run;
    let store = journal.into_store();
    let scope_ids: Option<Vec<&str>> = target
        .scope
        .apps
        .as_ref()
        .map(|_| recorded.iter().map(|r| r.guresid.as_str()).collect());
    store.mark_orphans(&graph.env, &orphans, scope_ids.as_deref())?;
    // A resumed deployment counts what it did before too; a new one, only this run.
    let mut counts = if resumed {
        store.operation_counts(deployment)?
    } else {
        // Every apply of the debug build (every test) checks the two ways agree.
        if cfg!(debug_assertions) {
            let read = store.operation_counts(deployment)?;
            assert_eq!(succeeded, read, "counts of this run");
        }
        succeeded
    };
    counts.unchanged = unchanged + target.scope.unchanged_resources;
    counts.failed = failed;
    let status = if failed == 0 {
        DeploymentStatus::Succeeded
    } else {
        DeploymentStatus::Failed
    };
    let error = (!failures.is_empty()).then(|| failures.join("\n"));
    store.finish_deployment(deployment, status, &counts, error.as_deref())?;
    if options.drift {
        store.compact_drift_run(deployment)?;
    }
    Ok(ApplyReport {
        env: graph.env.clone(),
        deployment,
        resumed,
        status,
        counts,
        failures,
    })
}

/// The apps a deployment of `scope` looks at: its apps, or every app of the commit and of the
/// state.
fn looked_at<'s>(scope: &'s Scope, recorded: &'s [ResourceRecord]) -> Vec<&'s str> {
    match &scope.apps {
        Some(apps) => apps.iter().map(String::as_str).collect(),
        None => scope
            .fingerprints
            .keys()
            .map(String::as_str)
            .chain(recorded.iter().filter_map(|r| r.app.as_deref()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
    }
}

/// The outputs a resource's inputs resolve against during an apply: those provisioned in this
/// run, else those recorded (a resource starts only after everything it reads is done, so a
/// recorded output it can see is current).
struct RunOutputs<'a> {
    graph: &'a ResourceGraph,
    recorded: &'a HashMap<&'a str, &'a ResourceRecord>,
    fresh: HashMap<GuresId, (Value, Value)>,
}

impl Outputs for RunOutputs<'_> {
    fn outputs(&self, id: &GuresId) -> Option<(&Value, &Value)> {
        if let Some((o, s)) = self.fresh.get(id) {
            return Some((o, s));
        }
        self.recorded
            .get(id.as_str())
            .filter(|r| r.status == ResourceStatus::Ready)
            .map(|r| (&r.outputs, &r.secret_outputs))
    }

    fn label(&self, id: &GuresId) -> String {
        match (self.graph.get(id), self.recorded.get(id.as_str())) {
            (Some(node), _) => node.label(),
            (None, Some(rec)) => record_label(rec),
            (None, None) => id.to_string(),
        }
    }
}

struct Run<'a, 'e> {
    options: &'a ApplyOptions,
    journal: Journal<'a>,
    drivers: &'a Registry,
    settings: &'a Settings,
    graph: &'a ResourceGraph,
    commit: &'a str,
    deployment: i64,
    on_event: &'e mut (dyn FnMut(&Event<'_>) + Send),
    outputs: RunOutputs<'a>,
    /// Resources that failed or were skipped: their dependents are blocked.
    broken: HashSet<GuresId>,
    /// Orphans deleted (or forgotten) in this run.
    deleted: HashSet<GuresId>,
    unchanged: i64,
    /// Resources an earlier run of a resumed deployment created, updated or deleted.
    done_before: HashSet<String>,
    /// What this run's operations that succeeded did: a deployment's counts (see
    /// [`Store::operation_counts`]) without reading its operations back. Each step runs once
    /// in a run, so each resource is counted once for what was done to it.
    succeeded: Counts,
    failed: i64,
    failures: Vec<String>,
    /// The bindings of resources resolved in this run not written yet (they go in batches);
    /// the resources not resolved keep theirs.
    bindings: Vec<(&'a GuresId, Vec<BindingRecord>)>,
    /// The resources of `env` that had current bindings when the run began, read when a run
    /// binds many: only those need their rows looked up.
    bound: Option<HashSet<String>>,
    /// Whether the run asked if `env` had any current binding (see `bound`).
    looked_for_bindings: bool,
    /// Every resource resolved in this run, and the pinned ones, which keep their bindings.
    rebound: HashSet<&'a GuresId>,
    /// `(consumer, provider)` of links over which every binding inserts a whole object into a
    /// string (update type `Insert`), among the resources resolved in this run.
    inserting: HashSet<(&'a GuresId, String)>,
    /// How many scheduled puts still have to read each resource's outputs: a resource's fresh
    /// outputs go once none does, so an apply holds few at a time.
    readers: HashMap<&'a GuresId, u32>,
    /// Resources kept as last bound (`auto_update: false`) though what they read changed.
    pinned: HashSet<&'a GuresId>,
    /// Resources whose definition or request changed though their inputs did not.
    template_hashes: Vec<(String, String)>,
    /// Operations that ended before any driver call, journalled in one batch.
    ended: Vec<(&'a Step, &'static str, Ended, String)>,
    /// Why each orphan that was not deleted is kept.
    kept: HashMap<GuresId, String>,
    /// The driver cookies of the steps about to start, read for the batch at once (`None`: it
    /// has none); a step not listed reads its own.
    cookies: HashMap<String, Option<String>>,
    /// Whether the state kept any driver cookie when the steps being scheduled began: with
    /// none (a first apply), none of them has one to read, as each starts once and only its
    /// own calls set its cookie.
    cookies_kept: bool,
    /// Permits for driver calls: one global limit, and one per driver that sets its own.
    limits: Limits,
    /// What stops new driver calls.
    halt: Halt,
}

/// The state as a run writes it: batches answered in process go to a writer of their own (see
/// [`JournalWriter`]), and every other use of the store waits for them first. The store is
/// reached through [`Journal::store`] alone, so no write and no driver call can overtake a batch
/// sent (a driver call is journalled, through the store, before it starts).
mod journal {
    use gitplane_state::{JournalWriter, OwnedBatch, StateError, Store};

    pub(super) struct Journal<'a> {
        store: &'a mut Store,
        /// Started by the first batch sent.
        writer: Option<JournalWriter>,
    }

    impl<'a> Journal<'a> {
        pub(super) fn new(store: &'a mut Store) -> Journal<'a> {
            Journal {
                store,
                writer: None,
            }
        }

        /// The store, once every batch sent is committed (the first error of one, if any).
        pub(super) fn store(&mut self) -> Result<&mut Store, StateError> {
            if let Some(writer) = &mut self.writer {
                writer.drain()?;
            }
            Ok(self.store)
        }

        /// The store for reads that no batch sent can change: the driver cookies of resources
        /// about to start (a batch sent sets none: its drivers answer in process).
        pub(super) fn reads(&self) -> &Store {
            self.store
        }

        /// Sends `batch` to be written after those sent before.
        pub(super) fn send(&mut self, batch: OwnedBatch) -> Result<(), StateError> {
            let writer = match &mut self.writer {
                Some(writer) => writer,
                None => self.writer.insert(JournalWriter::start(self.store)?),
            };
            writer.send(batch)
        }

        /// Waits for every batch sent, and ends the writer.
        pub(super) fn finish_writes(&mut self) -> Result<(), StateError> {
            match self.writer.take() {
                Some(mut writer) => writer.drain(),
                None => Ok(()),
            }
        }

        /// The store, the writer ended (see [`Journal::finish_writes`]).
        pub(super) fn into_store(self) -> &'a mut Store {
            debug_assert!(
                self.writer.is_none(),
                "batches sent are written by the puts"
            );
            self.store
        }
    }
}
use journal::Journal;

/// How many operations start together: journalled in one transaction, and, for drivers that
/// answer in process, answered and recorded in the next.
const BATCH: usize = 2048;

/// From how many independent items a step of a batch spreads over the cores (rayon's pool,
/// `RAYON_NUM_THREADS`): below it, handing them to other threads costs more than it saves.
const PARALLEL_FROM: usize = 32;

/// `f` of each of `items`, in their order: on every core when there are many. Nothing that
/// decides what is recorded depends on which thread ran what.
fn in_order<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    if items.len() < PARALLEL_FROM {
        items.iter().map(f).collect()
    } else {
        items.par_iter().map(f).collect()
    }
}

/// Put or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Put,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Put => "put",
            Operation::Delete => "delete",
        }
    }
}

/// Everything one driver call needs, owned, so it can move to a blocking thread.
struct Job {
    operation: Operation,
    call: OwnedRequest,
    /// For a put whose call receives secrets: what its public outputs (and recorded
    /// manifests) are checked against.
    leaks: Option<Arc<LeakCheck>>,
}

/// A put or delete, as the call engine makes it.
struct Change {
    operation: Operation,
    leaks: Option<Arc<LeakCheck>>,
}

impl Call for Change {
    type Answer = Answer;

    fn operation(&self) -> &'static str {
        self.operation.as_str()
    }

    fn call(
        &self,
        driver: &dyn Driver,
        request: &DriverRequest<'_>,
    ) -> Result<(Option<Answer>, Cookie), DriverError> {
        match self.operation {
            Operation::Put => driver
                .put(request)
                .map(|o| put_answer(o, self.leaks.as_deref())),
            Operation::Delete => driver.delete(request).map(|o| match o {
                DeleteOutcome::Done => (Some(Answer::none()), Cookie::Cleared),
                DeleteOutcome::InProgress { cookie } => (None, cookie),
            }),
        }
    }
}

/// The secret values a put's call received, and whose they are: no public output of its
/// answer may hold one (see [`leaks`]).
struct LeakCheck {
    needles: leaks::Needles,
    /// The definition's id and the resource's label, for the warning.
    definition: String,
    label: String,
}

impl LeakCheck {
    /// The check of a put of `node` with `inputs` and the account's credentials; `None` when
    /// the call receives no secret to look for.
    fn of(node: &ResourceNode, inputs: &ResolvedInputs, account: Option<&Value>) -> Option<Self> {
        let shown = (!inputs.resource_is_secret).then_some(&inputs.resource);
        let needles = leaks::Needles::of_call(
            std::iter::once(&inputs.secrets)
                .chain(&inputs.resource_secrets)
                .chain(account),
            std::iter::once(&inputs.values).chain(shown),
        );
        (!needles.is_empty()).then(|| LeakCheck {
            needles,
            definition: node.definition.clone(),
            label: node.label(),
        })
    }

    /// Moves every public output holding a secret into the secret outputs, with a warning
    /// that names the output but never its value.
    fn secure(&self, outputs: &mut Value, secret_outputs: &mut Value) {
        for leak in leaks::separate(&self.needles, outputs, secret_outputs) {
            tracing::warn!("{}", leak.message(&self.definition, &self.label));
        }
    }
}

/// What a put reads of the run, worked out before it starts: a pure function of its node and
/// the outputs it reads, so a batch's are worked out on every core (see [`Run::resolve_puts`]).
struct Resolved {
    /// Its inputs with their hash, or why they do not resolve.
    inputs: Result<(ResolvedInputs, String), ResolveError>,
    /// Its bindings, unless it was rebound already.
    bindings: Option<Vec<BindingRecord>>,
    /// What its driver call takes when it needs one and no account (whose credentials the
    /// run reads as it starts the call).
    call: Option<CallParts>,
}

/// The parts of a put's call worked out with its inputs.
struct CallParts {
    leaks: Option<Arc<LeakCheck>>,
}

impl Resolved {
    fn of(node: &ResourceNode, outputs: &RunOutputs<'_>, rebound: bool, drift: bool) -> Resolved {
        let inputs = resolve_inputs(node, outputs).map(|inputs| {
            let hash = inputs_hash(node, &inputs);
            (inputs, hash)
        });
        let bindings = (!rebound).then(|| bindings_of(node, outputs));
        // A call is likely unless the resource is recorded ready with the same inputs; a
        // guess that is wrong only costs this work, or leaves it to the start.
        let call = match &inputs {
            Ok((inputs, hash)) if node.driver_account.is_none() => {
                let unchanged = outputs
                    .recorded
                    .get(node.guresid.as_str())
                    .is_some_and(|rec| {
                        rec.status == ResourceStatus::Ready
                            && rec.definition == node.definition
                            && rec.driver == node.driver_type
                            && same_inputs(rec, hash, inputs)
                    });
                (drift || !unchanged).then(|| CallParts {
                    leaks: LeakCheck::of(node, inputs, None).map(Arc::new),
                })
            }
            _ => None,
        };
        Resolved {
            inputs,
            bindings,
            call,
        }
    }
}

/// `resource`, `values` and `secrets` of a put, moved into its request: `inputs` keeps the rest
/// until the call answers, and [`give_back`] (or [`copy_back`]) makes them whole again. Tens
/// of thousands of puts (a first apply) would otherwise copy and free them once more each.
fn call_values(inputs: &mut ResolvedInputs) -> (Value, Value, Value) {
    (
        std::mem::take(&mut inputs.resource),
        std::mem::take(&mut inputs.values),
        std::mem::take(&mut inputs.secrets),
    )
}

/// The values [`call_values`] moved into `call`, moved back into `inputs` once the call is done.
fn give_back(inputs: &mut Option<ResolvedInputs>, call: OwnedRequest) {
    if let Some(inputs) = inputs {
        inputs.resource = call.resource;
        inputs.values = call.values;
        inputs.secrets = call.secrets;
    }
}

/// The values [`call_values`] moved into `call`, copied back into `inputs`: the call takes its
/// request to a task of its own.
fn copy_back(inputs: &mut Option<ResolvedInputs>, call: &OwnedRequest) {
    if let Some(inputs) = inputs {
        inputs.resource = call.resource.clone();
        inputs.values = call.values.clone();
        inputs.secrets = call.secrets.clone();
    }
}

/// A put's answer as the reconciler takes it: done (its public outputs checked for secrets the
/// call received) or not yet, and the cookie.
fn put_answer(outcome: PutOutcome, leaks: Option<&LeakCheck>) -> (Option<Answer>, Cookie) {
    match outcome {
        PutOutcome::Done {
            mut outputs,
            mut secret_outputs,
            cookie,
            manifests,
        } => {
            if let Some(check) = leaks {
                check.secure(&mut outputs, &mut secret_outputs);
            }
            let answer = Answer {
                outputs,
                secret_outputs,
                manifests,
            };
            (Some(answer), cookie)
        }
        PutOutcome::InProgress { cookie } => (None, cookie),
    }
}

/// A job ready to start once its operation is journalled.
struct Ready {
    job: Job,
    action: &'static str,
    reason: String,
    registered: crate::drivers::Registered,
    driver_type: String,
    hash: String,
    inputs: Option<ResolvedInputs>,
}

/// A job waiting for its driver call's permits.
struct Queued {
    /// Its step's position in the steps being scheduled.
    step: usize,
    ready: Box<Ready>,
    permits: Permits,
}

/// What a resource's calls came to, or why not.
type CallOutcome = Result<Answer, String>;

/// The manifests a put records: the driver's, and for a workload whose driver gives no pod
/// template the Deployment (and Service) Humanitec would generate from its Score file; for a
/// workload, its `update` output applied to them.
fn workload_manifests_of(
    node: &ResourceNode,
    answer: &Answer,
    inputs: Option<&ResolvedInputs>,
) -> Result<Vec<Manifest>, String> {
    let mut manifests = answer.manifests.clone();
    if node.res_type != manifests::WORKLOAD_TYPE {
        return Ok(manifests);
    }
    if !manifests::has_pod_template(&manifests) {
        let name = node.res_id.strip_prefix("modules.").unwrap_or(&node.res_id);
        let secrets: Vec<&Value> = inputs
            .map(|i| i.resource_secrets.iter().collect())
            .unwrap_or_default();
        manifests.extend(manifests::workload_objects(
            node.app.as_deref(),
            name,
            inputs.map_or(&Value::Null, |i| &i.resource),
            &manifests::volume_sources(&node.params),
            &secrets,
        ));
    }
    if let Some(update) = answer.outputs.get("update") {
        manifests::apply_update(&mut manifests, update).map_err(|reason| {
            format!(
                "definition '{}' gives output 'update' that gitplane cannot apply to the \
                 workload's objects: {reason}",
                node.definition
            )
        })?;
    }
    Ok(manifests)
}

/// What a driver gave for a resource: its outputs, secret outputs and manifests.
#[derive(Debug)]
struct Answer {
    outputs: Value,
    secret_outputs: Value,
    manifests: Vec<Manifest>,
}

impl Answer {
    /// A delete's answer: nothing.
    fn none() -> Answer {
        Answer {
            outputs: empty(),
            secret_outputs: empty(),
            manifests: Vec::new(),
        }
    }
}

/// Bindings to write, each resource's with whether it had bindings to look up.
type BindingsToWrite<'a> = Vec<(&'a str, bool, Vec<BindingRecord>)>;

/// How a job's calls ended.
struct JobResult {
    /// Its step's position in the steps being scheduled.
    step: usize,
    operation_id: i64,
    attempts: i64,
    outcome: CallOutcome,
    /// For puts: what the resource is recorded with on success.
    hash: String,
    inputs: Option<ResolvedInputs>,
    /// For puts: the secrets its call received, to hide in the manifests it records.
    leaks: Option<Arc<LeakCheck>>,
    /// Set when no call was made: the halt flags were up once its permits were taken.
    stopped: Option<Halted>,
}

/// What starting a resource led to.
enum Started {
    /// A driver call to make, once journalled.
    Job(Box<Ready>),
    /// Decided at once (unchanged, blocked, or failed before any call).
    Settled,
}

/// A finished job's record, journalled with the calls that led to it.
enum Finished {
    Put {
        step: usize,
        result: JobResult,
        record: Box<ResourceRecord>,
        outputs_changed: Option<bool>,
        /// Not recorded when the apply began.
        new: bool,
        /// For a succeeded put: the manifests to record.
        manifests: Option<ManifestsRecord>,
        /// The record and manifests sealed for the journal; `None` leaves that to the writer
        /// (which reports why it cannot).
        sealed: Option<SealedPut>,
    },
    Delete {
        step: usize,
        result: JobResult,
    },
    /// No call was made: gitplane stopped, or the lease was lost, once its permits were taken.
    Skipped {
        step: usize,
        result: JobResult,
        action: Action,
        why: String,
    },
}

impl<'a> Run<'a, '_> {
    async fn puts(&mut self, plan: &'a Plan) -> Result<(), StateError> {
        let mut steps: Vec<&'a Step> = Vec::new();
        for step in &plan.steps {
            match step.action {
                Action::Delete | Action::Forget => {}
                // The plan resolved it against outputs that stay as they are: nothing to do,
                // unless its definition's text changed (a new template hash, and maybe new
                // bindings). A drift run calls every driver.
                Action::Unchanged if !self.options.drift => self.unchanged_step(step),
                _ => steps.push(step),
            }
        }
        let position: HashMap<&GuresId, usize> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| (&s.guresid, i))
            .collect();
        for s in &steps {
            for d in self.graph.dependencies(&s.guresid) {
                if let Some((&id, _)) = position.get_key_value(d) {
                    *self.readers.entry(id).or_default() += 1;
                }
            }
        }
        let prerequisites: Vec<Vec<usize>> = steps
            .iter()
            .map(|s| {
                self.graph
                    .dependencies(&s.guresid)
                    .into_iter()
                    .filter_map(|d| position.get(d).copied())
                    .collect()
            })
            .collect();
        let scheduled = self.schedule(&steps, &prerequisites, Operation::Put).await;
        // Only puts send batches to be written apart: the writer ends with them.
        let written = self.journal.finish_writes();
        scheduled.and(written)
    }

    /// Counts `id` as unchanged, unless an earlier run of this same (resumed) deployment
    /// already counted it as created or updated: then it is that, not unchanged.
    fn count_unchanged(&mut self, id: &GuresId) {
        if !self.done_before.contains(id.as_str()) {
            self.unchanged += 1;
        }
    }

    fn unchanged_step(&mut self, step: &'a Step) {
        self.count_unchanged(&step.guresid);
        let (Some(node), Some(rec)) = (
            self.graph.get(&step.guresid),
            self.outputs.recorded.get(step.guresid.as_str()),
        ) else {
            return;
        };
        if rec.template_hash != node.template_hash {
            self.template_hashes
                .push((rec.guresid.clone(), node.template_hash.clone()));
            self.rebind(node);
        }
    }

    /// Takes `node`'s bindings as they resolve now.
    fn rebind(&mut self, node: &'a ResourceNode) {
        self.rebind_with(node, None);
    }

    /// Takes `node`'s bindings: `bindings` when they were resolved already.
    fn rebind_with(&mut self, node: &'a ResourceNode, bindings: Option<Vec<BindingRecord>>) {
        if !self.rebound.insert(&node.guresid) {
            return;
        }
        let bindings = bindings.unwrap_or_else(|| bindings_of(node, &self.outputs));
        let mut all_inserted: HashMap<&str, bool> = HashMap::new();
        for b in &bindings {
            *all_inserted.entry(b.provided.as_str()).or_insert(true) &= b.inserted;
        }
        for (provider, all) in all_inserted {
            if all {
                self.inserting.insert((&node.guresid, provider.to_owned()));
            }
        }
        self.bindings.push((&node.guresid, bindings));
    }

    /// The bindings taken so far, to write, each with whether its resource had bindings to
    /// look up. For a few, each is looked up; once a run binds many (a first apply, a drift
    /// run), the environment's list is read once.
    fn bindings_to_write(&mut self) -> Result<BindingsToWrite<'a>, StateError> {
        // A run that binds nothing (a no-op) asks the state nothing.
        if self.bindings.is_empty() {
            return Ok(Vec::new());
        }
        if self.bound.is_none() && !std::mem::replace(&mut self.looked_for_bindings, true) {
            // An environment with no binding yet (its first apply) has none to look up: one
            // query, rather than one a resource (a round trip each on PostgreSQL).
            if !self.journal.store()?.has_bindings(&self.graph.env)? {
                self.bound = Some(HashSet::new());
            }
        }
        if self.bound.is_none() && self.bindings.len() >= BATCH {
            self.bound = Some(self.journal.store()?.bound(&self.graph.env)?);
        }
        let bound = self.bound.as_ref();
        Ok(std::mem::take(&mut self.bindings)
            .into_iter()
            .map(|(id, b)| {
                (
                    id.as_str(),
                    bound.is_none_or(|s| s.contains(id.as_str())),
                    b,
                )
            })
            .collect())
    }

    /// Writes the bindings taken so far.
    fn flush_bindings(&mut self) -> Result<(), StateError> {
        let bindings = self.bindings_to_write()?;
        self.journal
            .store()?
            .record_bindings(self.deployment, &self.graph.env, &bindings)
    }

    /// `step` has read what it depends on: the outputs nobody else still has to read go.
    fn read_done(&mut self, step: &Step) {
        for d in self.graph.dependencies(&step.guresid) {
            if let Some(n) = self.readers.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    self.readers.remove(d);
                    self.outputs.fresh.remove(d);
                }
            }
        }
    }

    async fn deletes(&mut self, plan: &'a Plan, links: &[LinkRecord]) -> Result<(), StateError> {
        let steps: Vec<&'a Step> = plan
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
                self.skip(step, action, &why);
                self.kept.insert(step.guresid.clone(), why.clone());
            }
            return self.flush_ended();
        }
        let (deletes, forgets): (Vec<&'a Step>, Vec<&'a Step>) =
            steps.into_iter().partition(|s| s.action == Action::Delete);
        // An orphan waits for the orphans that depend on it.
        let position: HashMap<&str, usize> = deletes
            .iter()
            .enumerate()
            .map(|(i, s)| (s.guresid.as_str(), i))
            .collect();
        let mut prerequisites: Vec<Vec<usize>> = vec![Vec::new(); deletes.len()];
        for l in links {
            if let (Some(&consumer), Some(&provider)) = (
                position.get(l.consumer.as_str()),
                position.get(l.provider.as_str()),
            ) {
                prerequisites[provider].push(consumer);
            }
        }
        self.schedule(&deletes, &prerequisites, Operation::Delete)
            .await?;
        self.forget(&forgets)
    }

    /// `deletion_policy: orphan`: after the deletions, gitplane stops managing these resources;
    /// no driver is called, the resources themselves stay.
    fn forget(&mut self, steps: &[&'a Step]) -> Result<(), StateError> {
        if steps.is_empty() {
            return Ok(());
        }
        let starts: Vec<OperationStart<'_>> = steps
            .iter()
            .map(|s| self.start(s, "forget", &s.reason))
            .collect();
        let ids = self.journal.store()?.begin_operations(&starts)?;
        let entries: Vec<JournalEntry<'_>> = steps
            .iter()
            .zip(&ids)
            .map(|(s, &operation)| JournalEntry::Delete {
                operation,
                attempts: 0,
                deployment: self.deployment,
                env: &self.graph.env,
                guresid: s.guresid.as_str(),
                error: None,
            })
            .collect();
        self.journal.store()?.journal(&entries)?;
        for step in steps {
            self.deleted.insert(step.guresid.clone());
            (self.on_event)(&Event::Finished {
                label: &step.label(),
                action: Action::Forget,
                outcome: Outcome::Done,
            });
        }
        Ok(())
    }

    /// Runs `steps`, each once its prerequisites (positions in `steps`) are done, as many at
    /// once as permits allow. A call's permits are taken before its task is spawned, and the
    /// halt flags read right after: a job waiting for permits when gitplane stops (or the lease
    /// is lost) is skipped, its call never made. Operations about to start are journalled
    /// together, and so are the calls and results that arrive together.
    async fn schedule(
        &mut self,
        steps: &[&'a Step],
        prerequisites: &[Vec<usize>],
        operation: Operation,
    ) -> Result<(), StateError> {
        // Steps to run are what may read a cookie.
        if !steps.is_empty() {
            self.cookies_kept = self.journal.store()?.keeps_cookies()?;
        }
        let mut waiting: Vec<usize> = prerequisites.iter().map(Vec::len).collect();
        let mut unlocks: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
        for (i, pre) in prerequisites.iter().enumerate() {
            for &p in pre {
                unlocks[p].push(i);
            }
        }
        // Plan order breaks ties, so runs are reproducible.
        let mut ready: VecDeque<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
        let (calls_tx, mut calls_rx) = mpsc::unbounded_channel::<CallEnded>();
        let mut tasks: JoinSet<JobResult> = JoinSet::new();
        let mut finished: Vec<usize> = Vec::new();
        // Jobs whose inputs are resolved, waiting for their call's permits, in order.
        let mut queued: VecDeque<Queued> = VecDeque::new();
        // Permits taken while waiting, for the first queued job.
        let mut head: Option<Held> = None;
        loop {
            let mut starting: Vec<(usize, Box<Ready>)> = Vec::new();
            let preparing = tracing::trace_span!("prepare batch").entered();
            self.read_cookies(
                ready
                    .iter()
                    .take(BATCH.saturating_sub(queued.len()))
                    .map(|&i| steps[i].guresid.as_str()),
            )?;
            // A batch at a time: resolved inputs wait in memory only until their calls start.
            // Steps that settle without a call leave room for more, so a batch is picked again
            // until it is full or nothing is ready.
            while queued.len() + starting.len() < BATCH && !ready.is_empty() {
                let room = BATCH - queued.len() - starting.len();
                let picked: Vec<usize> = std::iter::from_fn(|| ready.pop_front())
                    .take(room)
                    .collect();
                let resolved = match operation {
                    Operation::Put if self.halt.halted().is_none() => {
                        self.resolve_puts(steps, &picked)
                    }
                    _ => picked.iter().map(|_| None).collect(),
                };
                for (i, resolved) in picked.into_iter().zip(resolved) {
                    self.start_step(steps, i, resolved, operation, &mut starting, &mut finished)?;
                }
            }
            // Only this batch's starts may use them: its calls write cookies.
            self.cookies.clear();
            drop(preparing);
            self.flush_ended()?;
            finished.extend(self.run_batch(steps, starting, &mut queued, operation)?);
            finished.extend(self.start_calls(
                steps,
                &mut queued,
                head.take(),
                &mut tasks,
                &calls_tx,
            )?);
            if self.bindings.len() >= BATCH {
                self.flush_bindings()?;
            }
            for i in finished.drain(..) {
                for &next in &unlocks[i] {
                    waiting[next] -= 1;
                    if waiting[next] == 0 {
                        ready.push_back(next);
                    }
                }
            }
            if !ready.is_empty() && queued.len() < BATCH {
                continue;
            }
            if tasks.is_empty() && queued.is_empty() {
                break;
            }
            // Wait for one thing to happen (a call or a job ends, or the first queued job's
            // permits come free), then take everything else that already has.
            (self.on_event)(&Event::Waiting);
            let mut calls: Vec<CallEnded> = Vec::new();
            let mut results: Vec<JobResult> = Vec::new();
            let next = queued.front().map(|q| q.permits.clone());
            let permits = async {
                match &next {
                    Some(permits) => permits.acquire().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(call) = calls_rx.recv() => calls.push(call),
                Some(joined) = tasks.join_next() => {
                    results.push(joined.expect("job tasks catch driver panics themselves"));
                }
                held = permits => head = Some(held),
            }
            while let Some(joined) = tasks.try_join_next() {
                results.push(joined.expect("job tasks catch driver panics themselves"));
            }
            // A task reports its calls before it ends, so every call of a finished job is in
            // the channel now, and is journalled before the job's result.
            while let Ok(call) = calls_rx.try_recv() {
                calls.push(call);
            }
            if !calls.is_empty() || !results.is_empty() {
                let done = self.finish_jobs(steps, calls, results, operation)?;
                finished.extend(done);
            }
        }
        Ok(())
    }

    /// Reads the driver cookies of the steps of `guresids` in one query, for [`Run::cookie`].
    fn read_cookies<'g>(
        &mut self,
        guresids: impl Iterator<Item = &'g str>,
    ) -> Result<(), StateError> {
        if !self.cookies_kept {
            return Ok(());
        }
        let guresids: Vec<&str> = guresids.collect();
        let mut found = self.journal.reads().cookies(&guresids)?;
        self.cookies = guresids
            .into_iter()
            .map(|g| (g.to_owned(), found.remove(g)))
            .collect();
        Ok(())
    }

    /// The driver cookie of `guresid`: read with its batch's, or now.
    fn cookie(&mut self, guresid: &str) -> Result<Option<String>, StateError> {
        match self.cookies.remove(guresid) {
            Some(cookie) => Ok(cookie),
            None if !self.cookies_kept => Ok(None),
            None => self.journal.reads().cookie(guresid),
        }
    }

    /// Runs a batch of operations. Drivers that answer in process are called first: their
    /// answers have no effect outside gitplane, so their operations are journalled as started
    /// and ended in one transaction, with the records and the bindings taken so far (one
    /// commit a batch rather than three). The other jobs are queued for their calls' permits.
    /// Returns the steps done.
    fn run_batch(
        &mut self,
        steps: &[&'a Step],
        starting: Vec<(usize, Box<Ready>)>,
        queued: &mut VecDeque<Queued>,
        operation: Operation,
    ) -> Result<Vec<usize>, StateError> {
        let answering = tracing::trace_span!("answer in process").entered();
        let observer = self.settings.calls.as_deref();
        // In-process calls are independent of one another: they run on every core, their
        // answers taken in the batch's order.
        let answers = in_order(&starting, |(_, ready)| {
            let driver = &*ready.registered.driver;
            driver
                .in_process()
                .then(|| answer_in_process(driver, &ready.job, (&ready.driver_type, observer)))
                .flatten()
        });
        let mut answered = Vec::new();
        for ((i, ready), answer) in starting.into_iter().zip(answers) {
            match answer {
                Some(outcome) => {
                    (self.on_event)(&Event::Started {
                        label: &steps[i].label(),
                        action: action_of(ready.action),
                    });
                    answered.push((i, ready, outcome));
                }
                None => {
                    let permits = self
                        .limits
                        .of(&ready.driver_type, ready.registered.concurrency);
                    queued.push_back(Queued {
                        step: i,
                        ready,
                        permits,
                    });
                }
            }
        }
        drop(answering);
        self.record_answers(steps, answered, operation)
    }

    /// Journals in-process answers: their operations, started and ended, their records and the
    /// bindings taken so far, in one transaction.
    fn record_answers(
        &mut self,
        steps: &[&'a Step],
        answered: Vec<(usize, Box<Ready>, CallOutcome)>,
        operation: Operation,
    ) -> Result<Vec<usize>, StateError> {
        if answered.is_empty() {
            return Ok(Vec::new());
        }
        let mut started = Vec::with_capacity(answered.len());
        let mut results = Vec::with_capacity(answered.len());
        for (i, ready, outcome) in answered {
            let Ready {
                job,
                action,
                reason,
                hash,
                mut inputs,
                ..
            } = *ready;
            give_back(&mut inputs, job.call);
            started.push((i, action, reason));
            results.push(JobResult {
                step: i,
                // Known once journalled, below.
                operation_id: 0,
                attempts: 1,
                outcome,
                hash,
                inputs,
                leaks: job.leaks,
                stopped: None,
            });
        }
        let finished =
            tracing::trace_span!("records").in_scope(|| self.finished(steps, results, operation));
        // With one thread to run on, writing apart would only add the copies and the hand-over.
        if finished.len() >= PARALLEL_FROM
            && rayon::current_num_threads() > 1
            && finished.iter().all(|f| matches!(f, Finished::Put { .. }))
        {
            return self.send_answered(steps, &started, finished);
        }
        let starts: Vec<OperationStart<'_>> = started
            .iter()
            .map(|(i, action, reason)| self.start(steps[*i], action, reason))
            .collect();
        self.commit_batch(steps, &starts, &[], finished)
    }

    /// Hands a batch of puts answered in process to the writer, to be journalled while the next
    /// batch is prepared, and lets what depends on them go on: their answers have no effect
    /// outside gitplane, and what does (a driver call, any other write) waits for the writer
    /// first ([`Journal::store`]). The positions of the steps done.
    fn send_answered(
        &mut self,
        steps: &[&'a Step],
        started: &[(usize, &'static str, String)],
        finished: Vec<Finished>,
    ) -> Result<Vec<usize>, StateError> {
        let _span = tracing::trace_span!("send batch").entered();
        let bindings = self
            .bindings_to_write()?
            .into_iter()
            .map(|(guresid, bound, records)| (guresid.to_owned(), bound, records))
            .collect();
        let starts = started
            .iter()
            .map(|(i, action, reason)| {
                let step = steps[*i];
                StartRow {
                    guresid: step.guresid.to_string(),
                    app: step.app.clone(),
                    res_type: step.res_type.clone(),
                    class: step.class.clone(),
                    res_id: step.res_id.clone(),
                    action,
                    reason: reason.clone(),
                }
            })
            .collect();
        let mut puts = Vec::with_capacity(finished.len());
        let mut spent = Vec::with_capacity(finished.len());
        let mut done = Vec::with_capacity(finished.len());
        for f in finished {
            let Finished::Put {
                step,
                result,
                record,
                outputs_changed,
                new,
                manifests,
                sealed,
            } = f
            else {
                unreachable!("only puts are sent");
            };
            self.put_finished(steps[step], &record);
            done.push(step);
            puts.push(EndedPut {
                attempts: result.attempts,
                record,
                outputs_changed,
                new,
                manifests,
                sealed,
            });
            spent.push(result);
        }
        self.journal.send(OwnedBatch {
            deployment: self.deployment,
            env: self.graph.env.clone(),
            starts,
            puts,
            bindings,
            spent: Box::new(spent),
        })?;
        Ok(done)
    }

    /// Starts the calls of the queued jobs whose permits are free, in order (`head`: permits
    /// already taken for the first one). With the permits held the halt flags are read once
    /// more: when set, no call starts and every queued job is skipped, to be done by the next
    /// run. The positions of the steps skipped.
    fn start_calls(
        &mut self,
        steps: &[&'a Step],
        queued: &mut VecDeque<Queued>,
        mut head: Option<Held>,
        tasks: &mut JoinSet<JobResult>,
        calls_tx: &mpsc::UnboundedSender<CallEnded>,
    ) -> Result<Vec<usize>, StateError> {
        let mut calling = Vec::new();
        let mut waiting = VecDeque::with_capacity(queued.len());
        for q in queued.drain(..) {
            match head.take().or_else(|| q.permits.try_acquire()) {
                Some(held) => calling.push((q, held)),
                None => waiting.push_back(q),
            }
        }
        *queued = waiting;
        if let Some(halted) = self.halt.halted() {
            let why = halted.skip_reason();
            let mut skipped = Vec::new();
            for q in calling.into_iter().map(|(q, _)| q).chain(queued.drain(..)) {
                self.skip(steps[q.step], q.ready.action, &why);
                skipped.push(q.step);
            }
            self.flush_ended()?;
            return Ok(skipped);
        }
        self.spawn_calls(steps, calling, tasks, calls_tx)?;
        Ok(Vec::new())
    }

    /// Journals the operations of `calling` in one transaction, then spawns their calls, each
    /// with the permits taken for it.
    fn spawn_calls(
        &mut self,
        steps: &[&'a Step],
        calling: Vec<(Queued, Held)>,
        tasks: &mut JoinSet<JobResult>,
        calls_tx: &mpsc::UnboundedSender<CallEnded>,
    ) -> Result<(), StateError> {
        if calling.is_empty() {
            return Ok(());
        }
        let starts: Vec<OperationStart<'_>> = calling
            .iter()
            .map(|(q, _)| self.start(steps[q.step], q.ready.action, &q.ready.reason))
            .collect();
        let ids = self.journal.store()?.begin_operations(&starts)?;
        for ((q, held), operation_id) in calling.into_iter().zip(ids) {
            let Queued {
                step: i,
                ready,
                permits,
            } = q;
            (self.on_event)(&Event::Started {
                label: &steps[i].label(),
                action: action_of(ready.action),
            });
            let Ready {
                job,
                registered,
                driver_type,
                hash,
                mut inputs,
                ..
            } = *ready;
            let Job {
                operation,
                call: request,
                leaks,
            } = job;
            copy_back(&mut inputs, &request);
            let caller = Caller {
                driver: registered.driver,
                driver_type,
                permits,
                retry: self.settings.retry,
                halt: self.halt.clone(),
                observer: self.settings.calls.clone(),
            };
            let change = Change {
                operation,
                leaks: leaks.clone(),
            };
            let calls = calls_tx.clone();
            let guresid = request.guresid.clone();
            let ended = move |attempts, cookie| {
                // The receiver lives as long as any job; a send can only fail when it is gone.
                let _ = calls.send(CallEnded {
                    guresid: guresid.clone(),
                    operation: operation_id,
                    attempts,
                    cookie,
                });
            };
            tasks.spawn(async move {
                let (attempts, outcome) =
                    call_until_done(change, request, caller, held, ended).await;
                let (outcome, stopped) = match outcome {
                    Ok(answer) => (Ok(answer), None),
                    Err(Failure::Halted(halted)) => (Err(halted.skip_reason()), Some(halted)),
                    Err(Failure::Failed(why)) => (Err(why), None),
                };
                JobResult {
                    step: i,
                    operation_id,
                    attempts,
                    outcome,
                    hash,
                    inputs,
                    leaks,
                    stopped,
                }
            });
        }
        Ok(())
    }

    /// Journals calls and finished jobs, with the bindings taken so far, in one transaction,
    /// then acts on the results; the positions of the steps that are done.
    fn finish_jobs(
        &mut self,
        steps: &[&'a Step],
        calls: Vec<CallEnded>,
        results: Vec<JobResult>,
        operation: Operation,
    ) -> Result<Vec<usize>, StateError> {
        let finished = self.finished(steps, results, operation);
        self.commit_batch(steps, &[], &calls, finished)
    }

    /// Journals, in one transaction, the operations `starts` (when any: one per finished job,
    /// in order, started and ended in this batch), the calls that ended, the finished jobs and
    /// the bindings taken so far; then acts on the results. The positions of the steps done.
    fn commit_batch(
        &mut self,
        steps: &[&'a Step],
        starts: &[OperationStart<'_>],
        calls: &[CallEnded],
        finished: Vec<Finished>,
    ) -> Result<Vec<usize>, StateError> {
        let _span = tracing::trace_span!("commit batch").entered();
        let bindings = self.bindings_to_write()?;
        let (deployment, graph) = (self.deployment, self.graph);
        let mut batch = self.journal.store()?.batch()?;
        let ids = if starts.is_empty() {
            None
        } else {
            Some(batch.begin_operations(starts)?)
        };
        batch.journal(&journal_entries(
            (deployment, &graph.env),
            steps,
            calls,
            &finished,
            ids.as_deref(),
        ))?;
        batch.record_bindings(deployment, &graph.env, &bindings)?;
        batch.commit()?;
        Ok(self.after_journal(steps, finished))
    }

    /// What finished jobs record, each independently of the others: on every core when there
    /// are many, in the order of `results`.
    fn finished(
        &self,
        steps: &[&'a Step],
        results: Vec<JobResult>,
        operation: Operation,
    ) -> Vec<Finished> {
        let sealer = self.journal.reads().sealer();
        let recorder = Recorder {
            graph: self.graph,
            recorded: self.outputs.recorded,
            commit: self.commit,
            sealer: &sealer,
        };
        let finish = |result: JobResult| recorder.finished(steps, result, operation);
        if results.len() < PARALLEL_FROM {
            results.into_iter().map(finish).collect()
        } else {
            results.into_par_iter().map(finish).collect()
        }
    }

    /// After finished jobs are journalled: their outputs serve what depends on them, and
    /// people hear of them. The positions of their steps.
    fn after_journal(&mut self, steps: &[&'a Step], finished: Vec<Finished>) -> Vec<usize> {
        let mut done = Vec::with_capacity(finished.len());
        for f in finished {
            match f {
                Finished::Put { step, record, .. } => {
                    self.put_finished(steps[step], &record);
                    done.push(step);
                }
                Finished::Delete { step, result } => {
                    self.delete_finished(steps[step], result);
                    done.push(step);
                }
                Finished::Skipped {
                    step, action, why, ..
                } => {
                    self.skipped(steps[step], action, &why);
                    done.push(step);
                }
            }
        }
        done
    }

    /// Journals the operations that ended before any call.
    fn flush_ended(&mut self) -> Result<(), StateError> {
        if self.ended.is_empty() {
            return Ok(());
        }
        let ended = std::mem::take(&mut self.ended);
        let ops: Vec<(OperationStart<'_>, Ended, &str)> = ended
            .iter()
            .map(|(step, action, how, why)| {
                (self.start(step, action, &step.reason), *how, why.as_str())
            })
            .collect();
        self.journal.store()?.ended_operations(&ops)
    }

    /// Starts step `i`: settled at once (skipped, failed before its call, unchanged), or a job
    /// for the batch. `resolved` is what [`Run::resolve_puts`] worked out for it, if it did.
    fn start_step(
        &mut self,
        steps: &[&'a Step],
        i: usize,
        resolved: Option<Resolved>,
        operation: Operation,
        starting: &mut Vec<(usize, Box<Ready>)>,
        finished: &mut Vec<usize>,
    ) -> Result<(), StateError> {
        let step = steps[i];
        if let Some(halted) = self.halt.halted() {
            let action = match operation {
                Operation::Put if self.outputs.recorded.contains_key(step.guresid.as_str()) => {
                    "update"
                }
                Operation::Put => "create",
                Operation::Delete => "delete",
            };
            if step.action != Action::Unchanged || self.options.drift {
                self.skip(step, action, &halted.skip_reason());
            } else {
                self.count_unchanged(&step.guresid);
            }
            finished.push(i);
            return Ok(());
        }
        let started = match operation {
            Operation::Put => {
                let started = self.start_put(step, resolved)?;
                self.read_done(step);
                started
            }
            Operation::Delete => self.start_delete(step)?,
        };
        match started {
            Started::Job(job) => starting.push((i, job)),
            Started::Settled => finished.push(i),
        }
        Ok(())
    }

    /// What each of the puts `picked` reads of the run, worked out on every core: the steps
    /// of a batch are all ready, so none of them reads what another one writes, and the
    /// outputs they read stay until the last of them has started (see [`Run::read_done`]).
    fn resolve_puts(&self, steps: &[&'a Step], picked: &[usize]) -> Vec<Option<Resolved>> {
        let (graph, outputs, rebound) = (self.graph, &self.outputs, &self.rebound);
        let drift = self.options.drift;
        in_order(picked, |&i| {
            let node = graph.get(&steps[i].guresid)?;
            Some(Resolved::of(
                node,
                outputs,
                rebound.contains(&node.guresid),
                drift,
            ))
        })
    }

    fn start_put(
        &mut self,
        step: &'a Step,
        resolved: Option<Resolved>,
    ) -> Result<Started, StateError> {
        let Some(node) = self.graph.get(&step.guresid) else {
            return Ok(Started::Settled);
        };
        let action = if self.outputs.recorded.contains_key(node.guresid.as_str()) {
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
            self.skip(step, action, &format!("blocked: {blocker} failed"));
            return Ok(Started::Settled);
        }
        let Resolved {
            inputs,
            bindings,
            call,
        } = match resolved {
            Some(resolved) => resolved,
            None => Resolved::of(
                node,
                &self.outputs,
                self.rebound.contains(&node.guresid),
                self.options.drift,
            ),
        };
        let (inputs, hash) = match inputs {
            Ok(resolved) => resolved,
            Err(e) => {
                let error = format!("inputs do not resolve: {e}");
                self.fail_before_call(step, action, &error);
                return Ok(Started::Settled);
            }
        };
        let recorded = self
            .outputs
            .recorded
            .get(node.guresid.as_str())
            .copied()
            .filter(|rec| {
                rec.status == ResourceStatus::Ready
                    && rec.definition == node.definition
                    && rec.driver == node.driver_type
            });
        // auto_update: false keeps a resource as last bound while only what it reads changed;
        // it keeps its bindings too.
        if let Some(rec) = recorded
            && !self.options.drift
            && !node.auto_update
            && rec.template_hash == node.template_hash
            && !same_inputs(rec, &hash, &inputs)
            && !self.options.resolve.contains(node.guresid.as_str())
        {
            self.count_unchanged(&node.guresid);
            self.rebound.insert(&node.guresid);
            self.pinned.insert(&node.guresid);
            return Ok(Started::Settled);
        }
        self.rebind_with(node, bindings);
        if let Some(rec) = recorded
            && !self.options.drift
            && same_inputs(rec, &hash, &inputs)
        {
            if rec.template_hash != node.template_hash {
                self.template_hashes
                    .push((rec.guresid.clone(), node.template_hash.clone()));
            }
            self.count_unchanged(&node.guresid);
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
                    self.fail_before_call(step, action, &e);
                    return Ok(Started::Settled);
                }
            },
        };
        let Some(registered) = self.drivers.get(&node.driver_type).cloned() else {
            let error = format!("no driver '{}' is registered", node.driver_type);
            self.fail_before_call(step, action, &error);
            return Ok(Started::Settled);
        };
        let reason = match step.action {
            _ if self.options.drift && step.action == Action::Unchanged => {
                "drift run: re-applied so the driver can repair drift".to_owned()
            }
            Action::MaybeUpdate | Action::Unchanged => "inputs changed".to_owned(),
            _ => step.reason.clone(),
        };
        let leaks = match call {
            Some(call) if account.is_none() => call.leaks,
            _ => LeakCheck::of(node, &inputs, account.as_ref()).map(Arc::new),
        };
        let mut inputs = inputs;
        let (resource, values, secrets) = call_values(&mut inputs);
        let job = Job {
            operation: Operation::Put,
            leaks,
            call: OwnedRequest {
                guresid: node.guresid.to_string(),
                org: self.graph.org.clone(),
                env: self.graph.env.clone(),
                app: node.app.clone(),
                res_type: node.res_type.clone(),
                class: node.class.clone(),
                res_id: node.res_id.clone(),
                resource,
                values,
                secrets,
                account,
                cookie: self.cookie(node.guresid.as_str())?,
            },
        };
        Ok(Started::Job(Box::new(Ready {
            job,
            action,
            reason,
            registered,
            driver_type: node.driver_type.clone(),
            hash,
            inputs: Some(inputs),
        })))
    }

    /// After a put's record is journalled: its outputs serve what depends on it.
    fn put_finished(&mut self, step: &Step, record: &ResourceRecord) {
        let label = step.label();
        let action = if self.outputs.recorded.contains_key(step.guresid.as_str()) {
            Action::Update
        } else {
            Action::Create
        };
        match record.status {
            ResourceStatus::Ready => {
                match action {
                    Action::Update => self.succeeded.updated += 1,
                    _ => self.succeeded.created += 1,
                }
                if self.readers.contains_key(&step.guresid) {
                    self.outputs.fresh.insert(
                        step.guresid.clone(),
                        (record.outputs.clone(), record.secret_outputs.clone()),
                    );
                }
                (self.on_event)(&Event::Finished {
                    label: &label,
                    action,
                    outcome: Outcome::Done,
                });
            }
            ResourceStatus::Failed => {
                let error = record.error.clone().unwrap_or_default();
                self.failed(label, &step.guresid, action, &error);
            }
        }
    }

    fn start_delete(&mut self, step: &'a Step) -> Result<Started, StateError> {
        let Some(rec) = self.outputs.recorded.get(step.guresid.as_str()).copied() else {
            return Ok(Started::Settled);
        };
        let account = match &rec.account {
            None => None,
            Some(name) => match (self.settings.accounts)(name) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail_before_call(step, "delete", &e);
                    return Ok(Started::Settled);
                }
            },
        };
        let Some(registered) = self.drivers.get(&rec.driver).cloned() else {
            let error = format!("no driver '{}' is registered", rec.driver);
            self.fail_before_call(step, "delete", &error);
            return Ok(Started::Settled);
        };
        // A delete sends again what the resource was last provisioned with.
        let (inputs, secret_inputs) = match (rec.inputs.parse(), rec.secret_inputs.parse()) {
            (Ok(i), Ok(s)) => (i, s),
            (Err(e), _) | (_, Err(e)) => {
                let error = format!(
                    "the inputs state recorded for it do not parse ({e}): the driver cannot be \
                     sent what it was provisioned with"
                );
                self.fail_before_call(step, "delete", &error);
                return Ok(Started::Settled);
            }
        };
        let job = Job {
            operation: Operation::Delete,
            leaks: None,
            call: OwnedRequest {
                guresid: rec.guresid.clone(),
                org: self.graph.org.clone(),
                env: rec.env.clone(),
                app: rec.app.clone(),
                res_type: rec.res_type.clone(),
                class: rec.class.clone(),
                res_id: rec.res_id.clone(),
                resource: inputs
                    .get("resource")
                    .or_else(|| secret_inputs.get("resource"))
                    .cloned()
                    .unwrap_or(Value::Null),
                values: inputs.get("values").cloned().unwrap_or(Value::Null),
                secrets: secret_inputs.get("secrets").cloned().unwrap_or(Value::Null),
                account,
                cookie: self.cookie(&rec.guresid)?,
            },
        };
        Ok(Started::Job(Box::new(Ready {
            job,
            action: "delete",
            reason: step.reason.clone(),
            registered,
            driver_type: rec.driver.clone(),
            hash: String::new(),
            inputs: None,
        })))
    }

    /// After a delete is journalled.
    fn delete_finished(&mut self, step: &Step, result: JobResult) {
        let label = step.label();
        match result.outcome {
            Ok(_) => {
                self.succeeded.deleted += 1;
                self.deleted.insert(step.guresid.clone());
                (self.on_event)(&Event::Finished {
                    label: &label,
                    action: Action::Delete,
                    outcome: Outcome::Done,
                });
            }
            Err(error) => {
                self.kept
                    .insert(step.guresid.clone(), format!("its delete failed: {error}"));
                self.failed(label, &step.guresid, Action::Delete, &error);
            }
        }
    }

    /// Records the run's links and bindings as what changed, and what it learnt of templates;
    /// returns the orphans still recorded, each with why it is kept.
    ///
    /// The links wanted are the graph's edges, and the recorded links of orphans that stay. A
    /// resource whose links changed is bound again even if nothing else about it did; a link's
    /// update type follows its consumer's bindings, so one whose consumer was not bound again
    /// keeps it.
    fn record_graph(
        &mut self,
        plan: &'a Plan,
        links: &[LinkRecord],
    ) -> Result<Vec<(String, String)>, StateError> {
        let remaining: HashSet<&str> = plan
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::Delete | Action::Forget))
            .filter(|s| !self.deleted.contains(&s.guresid))
            .map(|s| s.guresid.as_str())
            .collect();
        // The links of deleted resources ended with their deletes.
        let current: Vec<LinkRecord> = links
            .iter()
            .filter(|l| {
                !self.deleted.contains(l.consumer.as_str())
                    && !self.deleted.contains(l.provider.as_str())
            })
            .cloned()
            .collect();
        let mut recorded_out: HashMap<&str, Vec<&LinkRecord>> = HashMap::new();
        for l in &current {
            recorded_out.entry(l.consumer.as_str()).or_default().push(l);
        }
        let graph = self.graph;
        for node in graph.nodes() {
            if self.rebound.contains(&node.guresid) || self.broken.contains(&node.guresid) {
                continue;
            }
            let edges = graph.edges_from(&node.guresid);
            let recorded = recorded_out
                .get(node.guresid.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let same = edges.len() == recorded.len()
                && edges.iter().all(|(to, kind)| {
                    recorded
                        .iter()
                        .any(|l| l.provider == to.as_str() && l.kind == kind.as_str())
                });
            if !same {
                self.rebind(node);
            }
        }
        let recorded_type: HashMap<(&str, &str), &LinkRecord> = current
            .iter()
            .map(|l| ((l.consumer.as_str(), l.provider.as_str()), l))
            .collect();
        let mut wanted: Vec<LinkRecord> = Vec::with_capacity(current.len());
        for e in graph.edge_iter() {
            let (consumer, provider) = (e.0.as_str(), e.1.as_str());
            let update_type = match e.2 {
                EdgeKind::Reference | EdgeKind::Selector => {
                    if self.rebound.contains(e.0) {
                        if self.inserting.contains(&(e.0, provider.to_owned())) {
                            "Insert"
                        } else {
                            "NeedsProvides"
                        }
                    } else {
                        recorded_type
                            .get(&(consumer, provider))
                            .map(|l| l.update_type.as_str())
                            .unwrap_or("NeedsProvides")
                    }
                }
                EdgeKind::Dependency | EdgeKind::Coprovision | EdgeKind::Implicit => "None",
            };
            wanted.push(LinkRecord {
                consumer: consumer.to_owned(),
                provider: provider.to_owned(),
                kind: e.2.as_str().to_owned(),
                update_type: update_type.to_owned(),
            });
        }
        wanted.extend(
            current
                .iter()
                .filter(|l| {
                    remaining.contains(l.consumer.as_str())
                        || remaining.contains(l.provider.as_str())
                })
                .cloned(),
        );
        let changes = LinkChanges::between(&current, wanted);
        self.journal
            .store()?
            .record_link_changes(self.deployment, &self.graph.env, &changes)?;
        self.flush_bindings()?;
        self.journal
            .store()?
            .set_template_hashes(&self.template_hashes)?;
        Ok(remaining
            .into_iter()
            .map(|g| {
                let why = self
                    .kept
                    .get(g)
                    .cloned()
                    .unwrap_or_else(|| "not deleted yet".to_owned());
                (g.to_owned(), why)
            })
            .collect())
    }

    /// Records the fingerprint of each app of `scope` this run left all ready, and forgets
    /// the others': an app keeps a fingerprint only while a later commit with the same one
    /// would find nothing to do there. Reading a secret store, a resource may change with no
    /// commit at all, so an app that reads one (itself or through a global resource) keeps
    /// none.
    fn record_fingerprints(
        &mut self,
        scope: &Scope,
        recorded: &[ResourceRecord],
        orphans: &[(String, String)],
    ) -> Result<(), StateError> {
        let graph = self.graph;
        let mut unclean: HashSet<&str> = HashSet::new();
        let mut resources: HashMap<&str, i64> = HashMap::new();
        // Global resources that read a secret store, directly or through their upstream.
        let mut volatile: HashSet<&GuresId> = HashSet::new();
        for node in graph.provisioning_order() {
            let reads_store = node.reads_secret_store();
            let upstream = graph
                .dependencies(&node.guresid)
                .into_iter()
                .any(|d| volatile.contains(d));
            if let Some(app) = &node.app {
                *resources.entry(app.as_str()).or_default() += 1;
                let broken =
                    self.broken.contains(&node.guresid) || self.pinned.contains(&node.guresid);
                if broken || reads_store || upstream {
                    unclean.insert(app.as_str());
                }
            } else if reads_store || upstream {
                volatile.insert(&node.guresid);
            }
        }
        let by_id: HashMap<&str, &ResourceRecord> =
            recorded.iter().map(|r| (r.guresid.as_str(), r)).collect();
        for (orphan, _) in orphans {
            if let Some(app) = by_id.get(orphan.as_str()).and_then(|r| r.app.as_deref()) {
                unclean.insert(app);
            }
        }
        let mut clean = Vec::new();
        let mut cleared = Vec::new();
        for app in looked_at(scope, recorded) {
            match scope.fingerprints.get(app) {
                Some(fingerprint) if !unclean.contains(app) => clean.push((
                    app,
                    gitplane_state::AppFingerprint {
                        fingerprint: fingerprint.clone(),
                        resources: resources.get(app).copied().unwrap_or(0),
                    },
                )),
                _ => cleared.push(app),
            }
        }
        let clean: Vec<(&str, &gitplane_state::AppFingerprint)> =
            clean.iter().map(|(a, f)| (*a, f)).collect();
        let (digest, resources) =
            scope.prints_after(&cleared, clean.iter().map(|(_, f)| f.resources).sum());
        self.journal.store()?.record_fingerprints_and_census(
            &graph.env,
            self.deployment,
            (&clean, &cleared),
            Some((&digest, resources)),
        )
    }

    /// No driver was called, so the resource itself is as it was: only the operation fails.
    fn fail_before_call(&mut self, step: &'a Step, action: &'static str, error: &str) {
        self.ended
            .push((step, action, Ended::Failed, error.to_owned()));
        self.failed(step.label(), &step.guresid, action_of(action), error);
    }

    fn failed(&mut self, label: String, guresid: &GuresId, action: Action, error: &str) {
        self.broken.insert(guresid.clone());
        self.failed += 1;
        self.failures.push(format!("{label}: {error}"));
        (self.on_event)(&Event::Finished {
            label: &label,
            action,
            outcome: Outcome::Failed(error),
        });
    }

    /// `step` is not done in this run: its operation starts and ends as skipped.
    fn skip(&mut self, step: &'a Step, action: &'static str, why: &str) {
        self.ended
            .push((step, action, Ended::Skipped, why.to_owned()));
        self.skipped(step, action_of(action), why);
    }

    /// `step` was skipped, and its operation journalled so: what depends on it is blocked.
    fn skipped(&mut self, step: &Step, action: Action, why: &str) {
        self.broken.insert(step.guresid.clone());
        self.failed += 1;
        self.failures.push(format!("{}: {why}", step.label()));
        (self.on_event)(&Event::Finished {
            label: &step.label(),
            action,
            outcome: Outcome::Skipped(why),
        });
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
}

/// What finished jobs record: all they need of the run, to be shared between threads.
struct Recorder<'r> {
    graph: &'r ResourceGraph,
    recorded: &'r HashMap<&'r str, &'r ResourceRecord>,
    commit: &'r str,
    sealer: &'r Sealer,
}

impl Recorder<'_> {
    /// A record of `node` as this run provisions it; outputs and inputs are filled by callers.
    fn record(&self, node: &ResourceNode) -> ResourceRecord {
        crate::plan::record_of(node, &self.graph.env, self.commit)
    }

    /// What the finished job `result` of `steps` records.
    fn finished(&self, steps: &[&Step], result: JobResult, operation: Operation) -> Finished {
        match (operation, result.stopped) {
            (_, Some(halted)) => Finished::Skipped {
                step: result.step,
                action: match operation {
                    Operation::Delete => Action::Delete,
                    Operation::Put
                        if self
                            .recorded
                            .contains_key(steps[result.step].guresid.as_str()) =>
                    {
                        Action::Update
                    }
                    Operation::Put => Action::Create,
                },
                why: halted.skip_reason(),
                result,
            },
            (Operation::Put, None) => self.put_record(steps[result.step], result),
            (Operation::Delete, None) => Finished::Delete {
                step: result.step,
                result,
            },
        }
    }

    /// What a finished put records.
    fn put_record(&self, step: &Step, mut result: JobResult) -> Finished {
        let node = self
            .graph
            .get(&step.guresid)
            .expect("only steps of graph nodes are put");
        let previous = self.recorded.get(node.guresid.as_str()).copied();
        // A workload's objects, its `update` output applied; one that cannot be applied fails
        // the put, as a refusal of the driver's answer would.
        let mut workload_manifests = None;
        if let Ok(answer) = &result.outcome {
            match workload_manifests_of(node, answer, result.inputs.as_ref()) {
                Ok(m) => workload_manifests = Some(m),
                Err(e) => result.outcome = Err(e),
            }
        }
        match &result.outcome {
            Ok(Answer {
                outputs,
                secret_outputs,
                manifests: _,
            }) => {
                let none;
                let inputs = match &result.inputs {
                    Some(inputs) => inputs,
                    None => {
                        none = ResolvedInputs {
                            resource: Value::Null,
                            resource_is_secret: false,
                            values: Value::Null,
                            secrets: Value::Null,
                            resource_secrets: Vec::new(),
                        };
                        &none
                    }
                };
                // What a delete will need again; anything a secret flowed into stays secret.
                let (public, secret) = split_inputs(inputs);
                let record = ResourceRecord {
                    status: ResourceStatus::Ready,
                    inputs_hash: result.hash.clone(),
                    outputs: outputs.clone(),
                    secret_outputs: secret_outputs.clone(),
                    inputs: public,
                    secret_inputs: secret,
                    error: None,
                    ..self.record(node)
                };
                let changed = previous.is_none_or(|rec| {
                    rec.outputs != record.outputs || rec.secret_outputs != record.secret_outputs
                });
                let manifests = workload_manifests.unwrap_or_default();
                // Secret values reach manifests through the driver's secret inputs, its secret
                // outputs, or (in a workload's Score file) the secret outputs it reads; and,
                // encoded or not, through anything its call received, the account included.
                let mut secrets = vec![&inputs.secrets, secret_outputs];
                secrets.extend(&inputs.resource_secrets);
                let needles = result.leaks.as_ref().map(|l| &l.needles);
                let manifests = manifests::to_record(manifests, &secrets, needles);
                let sealed = self.sealer.seal(&record, Some(&manifests)).ok();
                Finished::Put {
                    step: result.step,
                    result,
                    record: Box::new(record),
                    outputs_changed: Some(changed),
                    new: previous.is_none(),
                    manifests: Some(manifests),
                    sealed,
                }
            }
            Err(error) => {
                // A failed update keeps what was last provisioned: dependents may still use it.
                let record = ResourceRecord {
                    status: ResourceStatus::Failed,
                    error: Some(error.clone()),
                    definition: node.definition.clone(),
                    driver: node.driver_type.clone(),
                    commit_id: self.commit.to_owned(),
                    ..previous.cloned().unwrap_or_else(|| self.record(node))
                };
                let sealed = self.sealer.seal(&record, None).ok();
                Finished::Put {
                    step: result.step,
                    result,
                    record: Box::new(record),
                    outputs_changed: None,
                    new: previous.is_none(),
                    manifests: None,
                    sealed,
                }
            }
        }
    }
}

/// One driver call that ended, to journal.
struct CallEnded {
    guresid: String,
    operation: i64,
    /// Calls the operation has made so far.
    attempts: i64,
    cookie: Cookie,
}

/// The journal entries of `calls` and `finished` jobs (in that order: a call is journalled
/// before its operation's result), with the operation ids `ids` gave the finished ones when
/// they started in the same batch.
fn journal_entries<'f>(
    (deployment, env): (i64, &'f str),
    steps: &[&'f Step],
    calls: &'f [CallEnded],
    finished: &'f [Finished],
    ids: Option<&[i64]>,
) -> Vec<JournalEntry<'f>> {
    let mut entries: Vec<JournalEntry<'f>> = calls
        .iter()
        .map(|call| JournalEntry::Call {
            operation: call.operation,
            attempts: call.attempts,
            guresid: &call.guresid,
            cookie: match &call.cookie {
                Cookie::Unchanged => None,
                Cookie::Set(c) => Some(Some(c.as_str())),
                Cookie::Cleared => Some(None),
            },
        })
        .collect();
    for (k, f) in finished.iter().enumerate() {
        let operation = |result: &JobResult| ids.map_or(result.operation_id, |ids| ids[k]);
        entries.push(match f {
            Finished::Put {
                result,
                record,
                outputs_changed,
                new,
                manifests,
                sealed,
                ..
            } => JournalEntry::Put {
                operation: operation(result),
                attempts: result.attempts,
                deployment,
                record,
                outputs_changed: *outputs_changed,
                new: *new,
                manifests: manifests.as_ref(),
                sealed: sealed.as_ref(),
            },
            Finished::Delete { step, result } => JournalEntry::Delete {
                operation: operation(result),
                attempts: result.attempts,
                deployment,
                env,
                guresid: steps[*step].guresid.as_str(),
                error: result.outcome.as_ref().err().map(String::as_str),
            },
            Finished::Skipped { result, why, .. } => JournalEntry::Skipped {
                operation: operation(result),
                why,
            },
        });
    }
    entries
}

/// The answer of a driver that answers in process, when it is final (done, or an error that
/// calling again cannot mend); `None` sends the job through the usual calls, polls and retries.
/// Such a driver sets no cookie.
fn answer_in_process(
    driver: &dyn Driver,
    job: &Job,
    (driver_type, observer): (&str, Option<&dyn CallObserver>),
) -> Option<CallOutcome> {
    let request = job.call.request();
    let started = Instant::now();
    let observe = |result: CallResult| {
        if let Some(o) = observer {
            o.call_ended(
                driver_type,
                job.operation.as_str(),
                result,
                started.elapsed(),
            );
        }
    };
    let failed = |e: &DriverError| match e.kind {
        ErrorKind::Transient => CallResult::TransientError,
        ErrorKind::Final => CallResult::FinalError,
    };
    match job.operation {
        Operation::Put => {
            let answer = driver.put(&request);
            observe(match &answer {
                Ok(PutOutcome::Done { .. }) => CallResult::Done,
                Ok(PutOutcome::InProgress { .. }) => CallResult::InProgress,
                Err(e) => failed(e),
            });
            match answer {
                Ok(
                    done @ PutOutcome::Done {
                        cookie: Cookie::Unchanged,
                        ..
                    },
                ) => put_answer(done, job.leaks.as_deref()).0.map(Ok),
                Err(DriverError {
                    kind: ErrorKind::Final,
                    message,
                    ..
                }) => Some(Err(message)),
                _ => None,
            }
        }
        Operation::Delete => {
            let answer = driver.delete(&request);
            observe(match &answer {
                Ok(DeleteOutcome::Done) => CallResult::Done,
                Ok(DeleteOutcome::InProgress { .. }) => CallResult::InProgress,
                Err(e) => failed(e),
            });
            match answer {
                Ok(DeleteOutcome::Done) => Some(Ok(Answer::none())),
                Err(DriverError {
                    kind: ErrorKind::Final,
                    message,
                    ..
                }) => Some(Err(message)),
                _ => None,
            }
        }
    }
}

fn action_of(action: &str) -> Action {
    match action {
        "create" => Action::Create,
        "delete" => Action::Delete,
        _ => Action::Update,
    }
}

fn empty() -> Value {
    Value::Object(Default::default())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;
    use std::sync::mpsc as sync_mpsc;
    use std::time::Duration;

    use gitplane_state::Leases;
    use gitplane_testkit::{HttpServer, Reply};

    use super::*;
    use crate::deploy::Scope;
    use crate::drivers::HttpDriver;

    /// An HTTP driver on 127.0.0.1 that answers every PUT at once, except the first, which it
    /// holds until the test lets it go: the test acts while that call runs.
    struct HeldDriver {
        url: String,
        /// The GUResIDs of the PUTs that arrived, in order.
        puts: Arc<Mutex<Vec<String>>>,
        arrived: sync_mpsc::Receiver<()>,
        release: sync_mpsc::Sender<()>,
        _server: HttpServer,
    }

    impl HeldDriver {
        fn start() -> HeldDriver {
            let puts: Arc<Mutex<Vec<String>>> = Arc::default();
            let (arrived_tx, arrived) = sync_mpsc::channel();
            let (release, released) = sync_mpsc::channel::<()>();
            let released = Mutex::new(released);
            let arrived_tx = Mutex::new(arrived_tx);
            let seen = puts.clone();
            let server = HttpServer::start(move |request| {
                let guresid = request.last_segment().to_owned();
                let first = {
                    let mut seen = seen.lock().expect("not poisoned");
                    seen.push(guresid.clone());
                    seen.len() == 1
                };
                if first {
                    let _ = arrived_tx.lock().expect("not poisoned").send(());
                    let _ = released.lock().expect("not poisoned").recv();
                }
                Reply::text(
                    200,
                    format!(
                        r#"{{"id":"{guresid}","type":"queue","resource":{{"values":{{}},"secrets":{{}}}}}}"#
                    ),
                )
            });
            HeldDriver {
                url: format!("{}/driver", server.url),
                puts,
                arrived,
                release,
                _server: server,
            }
        }

        fn puts(&self) -> Vec<String> {
            self.puts.lock().expect("not poisoned").clone()
        }
    }

    /// One app whose workload (echo) reads `n` queues of the `test/http` driver.
    fn queues(n: usize) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        files.insert(
            "environments/test.yaml".to_owned(),
            b"type: test\nimplicit_resources: []\n".to_vec(),
        );
        files.insert(
            "definitions/platform.yaml".to_owned(),
            b"apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: queue\n\
              entity:\n  type: queue\n  driver_type: test/http\n  criteria:\n    - {}\n---\n\
              apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: wl\n\
              entity:\n  type: workload\n  driver_type: echo\n  criteria:\n    - {}\n"
                .to_vec(),
        );
        let resources: String = (0..n)
            .map(|i| format!("  q{i:02}:\n    type: queue\n"))
            .collect();
        files.insert(
            "workloads/shop/api.yaml".to_owned(),
            format!(
                "apiVersion: score.dev/v1b1\nmetadata:\n  name: api\ncontainers:\n  main:\n    \
                 image: x\nresources:\n{resources}"
            )
            .into_bytes(),
        );
        files
    }

    /// Finding 3 of issue 25, for leases: calls waiting for the driver's one permit used to
    /// start once it freed, though another daemon may have taken the environment meanwhile.
    #[test]
    fn a_lost_lease_starts_no_queued_call() {
        let driver = HeldDriver::start();
        let graph = crate::plan::test_support::graph(&queues(20), "test");
        let target = Target {
            graph,
            scope: Scope::whole(Default::default()),
        };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let state = dir.path().join("state.db");
        let mut store = Store::open(&state).expect("a new state");
        let mut leases = Leases::join(&state, Duration::from_secs(30)).expect("join");
        let envs = BTreeSet::from(["test".to_owned()]);
        // The first beat only reports the daemon; the second takes the lease.
        for _ in 0..2 {
            leases.beat(&envs, &BTreeSet::new()).expect("a heartbeat");
        }
        let hold = leases
            .hold("test")
            .expect("the only daemon holds the lease");
        let mut drivers = Registry::builtin();
        drivers.register(
            "test/http",
            Arc::new(HttpDriver::new(&driver.url, Duration::from_secs(10))),
            Some(1),
        );
        let settings = Settings {
            concurrency: 16,
            retry: RetryPolicy::default(),
            accounts: Arc::new(|_| Err("no accounts".to_owned())),
            calls: None,
        };
        let options = ApplyOptions {
            lease: Some(hold),
            ..ApplyOptions::default()
        };
        let applying = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let report = runtime.block_on(apply(
                &mut store,
                &drivers,
                &settings,
                &target,
                "c1",
                &options,
                &mut |_| {},
            ));
            (report, store)
        });
        driver
            .arrived
            .recv_timeout(Duration::from_secs(30))
            .expect("the first call reaches the driver");
        // Another daemon may have the environment now: the other 19 calls must not start.
        leases.release_all();
        driver.release.send(()).expect("the driver waits");
        let (report, store) = applying.join().expect("the apply does not panic");
        let report = report.expect("the state takes every write");
        assert_eq!(driver.puts().len(), 1, "calls after the lease was lost");
        assert_eq!(report.status, DeploymentStatus::Failed);
        let why = "stopped: this daemon no longer holds the environment's lease";
        assert_eq!(
            report.failures.iter().filter(|f| f.ends_with(why)).count(),
            20,
            "19 queues and the workload: {:?}",
            report.failures
        );
        let counts = store
            .operation_counts(report.deployment)
            .expect("the counts");
        assert_eq!(counts.created, 1, "{counts:?}");
    }
}
