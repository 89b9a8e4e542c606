//! Detect-only drift runs: read each resource through its driver (or compare with what was
//! recorded), record what differs, change nothing.
//!
//! The comparison ([`compare_read`], [`compare_inputs`], [`differences`]) is pure. [`detect`]
//! runs it over an environment: one read per recorded resource through the driver-call engine
//! ([`crate::calls`]) that `reconcile` uses, so with the same permits, retries and stop checks:
//! no read starts once gitplane stops or the lease is gone. It never calls a driver's put or
//! delete and writes nothing but its own deployment row and findings, once, at the end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use gitplane_state::{
    DetectRunRecord, DriftFinding, ResourceRecord, ResourceStatus, StateError, Store,
};
use serde_json::Value;
use tokio::task::JoinSet;

use crate::calls::{Call, Caller, Failure, Halt, Limits, call_until_done};
use crate::deploy::Target;
use crate::drivers::leaks::{self, Needles};
use crate::drivers::{
    Cookie, Driver, DriverError, DriverRequest, OwnedRequest, ReadOutcome, Registry,
};
use crate::graph::ResourceNode;
use crate::plan::{self, Recorded};
use crate::reconcile::Settings;

/// How much of one public value a finding quotes, in characters.
const MAX_VALUE_CHARS: usize = 80;
/// How many differing paths one finding lists; the rest are counted.
const MAX_PATHS: usize = 20;
/// How deep the comparison walks into nested outputs; deeper differences are reported at
/// this depth.
const MAX_DEPTH: usize = 32;

/// Where a finding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The driver's read path answered.
    Driver,
    /// What gitplane recorded, compared with what it would send now.
    Recorded,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Driver => "driver",
            Source::Recorded => "recorded",
        }
    }
}

/// What differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Outputs,
    SecretOutputs,
    /// The driver says the resource does not exist.
    Missing,
    /// Something upstream changed that the resource has not taken.
    Inputs,
}

impl What {
    pub fn as_str(self) -> &'static str {
        match self {
            What::Outputs => "outputs",
            What::SecretOutputs => "secret outputs",
            What::Missing => "missing",
            What::Inputs => "inputs",
        }
    }
}

/// One difference of one resource. `detail` never holds a secret value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub source: Source,
    pub what: What,
    pub detail: String,
}

/// One path where two JSON values differ: `None` where a side has nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference<'a> {
    pub path: String,
    pub old: Option<&'a Value>,
    pub new: Option<&'a Value>,
}

/// Where `old` and `new` differ, as dotted paths (`a.b`, `list[2]`), sorted.
pub fn differences<'a>(old: &'a Value, new: &'a Value) -> Vec<Difference<'a>> {
    let mut found = Vec::new();
    walk(String::new(), Some(old), Some(new), 0, &mut found);
    found
}

fn walk<'a>(
    path: String,
    old: Option<&'a Value>,
    new: Option<&'a Value>,
    depth: usize,
    found: &mut Vec<Difference<'a>>,
) {
    if old == new {
        return;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) if depth < MAX_DEPTH => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                walk(join(key), a.get(key), b.get(key), depth + 1, found);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if depth < MAX_DEPTH => {
            for i in 0..a.len().max(b.len()) {
                walk(format!("{path}[{i}]"), a.get(i), b.get(i), depth + 1, found);
            }
        }
        _ => found.push(Difference {
            path: if path.is_empty() {
                "(the whole value)".to_owned()
            } else {
                path
            },
            old,
            new,
        }),
    }
}

/// A public value as a finding quotes it: compact JSON, cut short.
fn quoted(value: Option<&Value>) -> String {
    let Some(value) = value else {
        return "(none)".to_owned();
    };
    let text = value.to_string();
    if text.chars().count() <= MAX_VALUE_CHARS {
        text
    } else {
        let mut cut: String = text.chars().take(MAX_VALUE_CHARS - 1).collect();
        cut.push('…');
        cut
    }
}

/// `path: old → new; …` for public values.
pub fn public_detail(differences: &[Difference<'_>]) -> String {
    listed(differences, |d| {
        format!("{}: {} → {}", d.path, quoted(d.old), quoted(d.new))
    })
}

/// The paths alone, for secret values: which differ, never what they hold.
pub fn secret_detail(differences: &[Difference<'_>]) -> String {
    listed(differences, |d| d.path.clone())
}

fn listed(differences: &[Difference<'_>], show: impl Fn(&Difference<'_>) -> String) -> String {
    let mut parts: Vec<String> = differences.iter().take(MAX_PATHS).map(show).collect();
    if differences.len() > MAX_PATHS {
        parts.push(format!("and {} more", differences.len() - MAX_PATHS));
    }
    parts.join("; ")
}

/// What a driver's read says against what was recorded for the resource.
pub fn compare_read(recorded: &ResourceRecord, read: &ReadOutcome) -> Vec<Finding> {
    match read {
        ReadOutcome::NoReadPath => Vec::new(),
        ReadOutcome::Missing => vec![Finding {
            source: Source::Driver,
            what: What::Missing,
            detail: "the driver says it does not exist".to_owned(),
        }],
        ReadOutcome::Found {
            outputs,
            secret_outputs,
        } => {
            let mut findings = Vec::new();
            let public = differences(&recorded.outputs, outputs);
            if !public.is_empty() {
                findings.push(Finding {
                    source: Source::Driver,
                    what: What::Outputs,
                    detail: public_detail(&public),
                });
            }
            let secret = differences(&recorded.secret_outputs, secret_outputs);
            if !secret.is_empty() {
                findings.push(Finding {
                    source: Source::Driver,
                    what: What::SecretOutputs,
                    detail: format!("secret outputs differ: {}", secret_detail(&secret)),
                });
            }
            findings
        }
    }
}

/// The inputs `node` resolves to now, from the recorded outputs of what it reads, against
/// those recorded for it: a difference means something upstream changed that it has not
/// taken. `None` when they are the same.
pub fn compare_inputs(
    recorded: &ResourceRecord,
    node: &ResourceNode,
    upstream: &Recorded<'_>,
) -> Option<Finding> {
    let inputs = match plan::resolve_inputs(node, upstream) {
        Ok(inputs) => inputs,
        Err(e) => {
            return Some(Finding {
                source: Source::Recorded,
                what: What::Inputs,
                detail: format!("its inputs no longer resolve: {e}"),
            });
        }
    };
    let hash = plan::inputs_hash(node, &inputs);
    if plan::same_inputs(recorded, &hash, &inputs) {
        return None;
    }
    let (public, secret) = plan::split_inputs(&inputs);
    let mut parts = Vec::new();
    if let (Ok(old), Ok(new)) = (recorded.inputs.parse(), public.parse()) {
        let d = differences(&old, &new);
        if !d.is_empty() {
            parts.push(public_detail(&d));
        }
    }
    if recorded.secret_inputs != secret {
        match (recorded.secret_inputs.parse(), secret.parse()) {
            (Ok(old), Ok(new)) => {
                let d = differences(&old, &new);
                if !d.is_empty() {
                    parts.push(format!("secret inputs differ: {}", secret_detail(&d)));
                }
            }
            _ => parts.push("secret inputs differ".to_owned()),
        }
    }
    if parts.is_empty() {
        // The hash covers the definition, driver and account too.
        parts.push("its definition, driver or account changed".to_owned());
    }
    Some(Finding {
        source: Source::Recorded,
        what: What::Inputs,
        detail: parts.join("; "),
    })
}

/// What stops a detect run from starting new reads.
#[derive(Clone, Default)]
pub struct DetectOptions {
    /// Set when gitplane is stopping.
    pub stop: Option<Arc<AtomicBool>>,
    /// The environment's lease, when daemons share a PostgreSQL state.
    pub lease: Option<Arc<gitplane_state::LeaseHold>>,
    /// The environment's apply lock.
    pub lock: Option<Arc<gitplane_state::LockHold>>,
}

impl DetectOptions {
    /// What stops this run's reads.
    fn halt(&self) -> Halt {
        Halt {
            stop: self.stop.clone(),
            lease: self.lease.clone(),
            lock: self.lock.clone(),
        }
    }
}

/// A read, as the call engine makes it.
struct Read;

impl Call for Read {
    type Answer = ReadOutcome;

    fn operation(&self) -> &'static str {
        "read"
    }

    fn call(
        &self,
        driver: &dyn Driver,
        request: &DriverRequest<'_>,
    ) -> Result<(Option<ReadOutcome>, Cookie), DriverError> {
        driver
            .read(request)
            .map(|read| (Some(read), Cookie::Unchanged))
    }
}

/// How one read ended: its resource's position among those read, and the read or why not.
type ReadEnded = (usize, Result<ReadOutcome, Failure>);

/// Keeps a read task's end with the others.
fn collect(
    joined: Result<ReadEnded, tokio::task::JoinError>,
    answers: &mut Vec<ReadEnded>,
    failures: &mut Vec<String>,
) {
    match joined {
        Ok(ended) => answers.push(ended),
        // The engine catches a driver's panic; a task itself failing is gitplane's bug.
        Err(e) => failures.push(format!("a read task failed: {e}")),
    }
}

/// A finding with the resource it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceFinding {
    pub guresid: String,
    /// `app/type.class#id`.
    pub label: String,
    pub finding: Finding,
}

/// What a detect run found.
#[derive(Debug, Clone)]
pub struct DetectReport {
    pub env: String,
    pub deployment: i64,
    pub findings: Vec<ResourceFinding>,
    /// Resources looked at that were as recorded.
    pub unchanged: usize,
    /// Reads that failed or did not run, with why.
    pub failures: Vec<String>,
}

impl DetectReport {
    /// How many resources differ.
    pub fn resources(&self) -> usize {
        let mut ids: Vec<&str> = self.findings.iter().map(|f| f.guresid.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// The inputs recorded for `rec`, as its last put sent them (the secret half holds the
/// resource's own inputs when a secret flowed into them), and whether the resource's own
/// inputs are public.
fn recorded_inputs(rec: &ResourceRecord) -> Result<(Value, Value, Value, bool), String> {
    let damaged = |half: &str| format!("its recorded {half} inputs are not JSON");
    let mut public = rec.inputs.parse().map_err(|_| damaged("public"))?;
    let mut secret = rec.secret_inputs.parse().map_err(|_| damaged("secret"))?;
    let take = |v: &mut Value, key: &str| {
        v.as_object_mut()
            .and_then(|m| m.remove(key))
            .unwrap_or(Value::Null)
    };
    let values = take(&mut public, "values");
    let secrets = take(&mut secret, "secrets");
    let (resource, shown) = match take(&mut public, "resource") {
        Value::Null => (take(&mut secret, "resource"), false),
        r => (r, true),
    };
    Ok((resource, values, secrets, shown))
}

/// A read as a put's answer would be recorded: a public output holding a secret the call
/// received, or recorded as a secret output alone (one a put found holding a secret, maybe
/// one that reached the driver through its resource's inputs), is secret. Warns of each
/// leak, naming the definition and the output, never the value.
fn secure_read(read: ReadOutcome, needles: &Needles, rec: &ResourceRecord) -> ReadOutcome {
    let ReadOutcome::Found {
        mut outputs,
        mut secret_outputs,
    } = read
    else {
        return read;
    };
    let label = plan::record_label(rec);
    for leak in leaks::separate(needles, &mut outputs, &mut secret_outputs) {
        tracing::warn!("{}", leak.message(&rec.definition, &label));
    }
    if let (Value::Object(public), Value::Object(recorded_secret)) =
        (&mut outputs, &rec.secret_outputs)
    {
        let kept_secret: Vec<String> = public
            .keys()
            .filter(|name| {
                recorded_secret.contains_key(*name) && rec.outputs.get(name.as_str()).is_none()
            })
            .cloned()
            .collect();
        if !kept_secret.is_empty() && !secret_outputs.is_object() {
            secret_outputs = Value::Object(Default::default());
        }
        for name in kept_secret {
            if let (Some(value), Value::Object(secret)) =
                (public.remove(&name), &mut secret_outputs)
            {
                secret.entry(name).or_insert(value);
            }
        }
    }
    ReadOutcome::Found {
        outputs,
        secret_outputs,
    }
}

/// The record to compare a read with: one made before public outputs were checked for secrets
/// is compared as a put would record it now, so that a finding never quotes a secret.
fn secure_record<'r>(rec: &'r ResourceRecord, needles: &Needles) -> Cow<'r, ResourceRecord> {
    if !needles.found_in_value(&rec.outputs) {
        return Cow::Borrowed(rec);
    }
    let mut secured = rec.clone();
    leaks::separate(needles, &mut secured.outputs, &mut secured.secret_outputs);
    Cow::Owned(secured)
}

/// Runs a detect-only drift run of `target`'s environment at `commit` (the last good one) and
/// records it. The caller holds the environment's lock.
pub async fn detect(
    store: &mut Store,
    drivers: &Registry,
    settings: &Settings,
    target: &Target,
    commit: &str,
    options: &DetectOptions,
) -> Result<DetectReport, StateError> {
    let started_at = chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let graph = &target.graph;
    let env = graph.env.clone();
    let recorded = store.resources(&env)?;
    let ready: Vec<&ResourceRecord> = recorded
        .iter()
        .filter(|r| r.status == ResourceStatus::Ready)
        .collect();
    let mut findings = input_findings(graph, &recorded, &ready);
    let mut failures = Vec::new();
    let (answers, mut needles) = read_all(
        store,
        (drivers, settings),
        graph,
        &ready,
        options,
        &mut failures,
    )
    .await?;
    findings.extend(read_findings(&ready, answers, &mut needles, &mut failures));
    findings.sort_by(|a, b| {
        (&a.label, a.finding.what.as_str()).cmp(&(&b.label, b.finding.what.as_str()))
    });
    // One finding per resource and kind (the table's key): the driver's word first.
    findings.dedup_by(|b, a| a.guresid == b.guresid && a.finding.what == b.finding.what);
    let unchanged = ready
        .iter()
        .filter(|rec| !findings.iter().any(|f| f.guresid == rec.guresid))
        .count();
    failures.sort();
    let rows: Vec<DriftFinding> = findings
        .iter()
        .filter_map(|f| {
            let rec = ready.iter().find(|r| r.guresid == f.guresid)?;
            Some(DriftFinding {
                guresid: rec.guresid.clone(),
                app: rec.app.clone(),
                res_type: rec.res_type.clone(),
                class: rec.class.clone(),
                res_id: rec.res_id.clone(),
                source: f.finding.source.as_str().to_owned(),
                what: f.finding.what.as_str().to_owned(),
                detail: f.finding.detail.clone(),
            })
        })
        .collect();
    let error = (!failures.is_empty()).then(|| failures.join("\n"));
    let deployment = store.record_detect_run(&DetectRunRecord {
        env: &env,
        commit,
        started_at: &started_at,
        unchanged: unchanged as i64,
        failed: failures.len() as i64,
        error: error.as_deref(),
        findings: &rows,
    })?;
    Ok(DetectReport {
        env,
        deployment,
        findings,
        unchanged,
        failures,
    })
}

/// What the recorded inputs show of `ready`'s resources against `graph`, in `ready`'s order:
/// inputs the commit would now give differently, as far as the recorded upstream outputs tell.
fn input_findings(
    graph: &crate::graph::ResourceGraph,
    recorded: &[ResourceRecord],
    ready: &[&ResourceRecord],
) -> Vec<ResourceFinding> {
    let mut upstream = Recorded::new(recorded);
    for rec in recorded {
        if rec.status == ResourceStatus::Ready
            && let Some(node) = graph.get(rec.guresid.as_str())
        {
            upstream.stable(&node.guresid);
        }
    }
    ready
        .iter()
        .filter_map(|rec| {
            let node = graph.get(rec.guresid.as_str())?;
            let finding = compare_inputs(rec, node, &upstream)?;
            Some(ResourceFinding {
                guresid: rec.guresid.clone(),
                label: plan::record_label(rec),
                finding,
            })
        })
        .collect()
}

/// Reads each of `ready` through its driver's read path, in process or through the call
/// engine (a permit taken before a read's task is spawned, the halt flags read once it is
/// held): the reads that ended, by position in `ready`, and per read the secret values its
/// call received, which no public output may hold. What could not be read goes to
/// `failures`.
async fn read_all(
    store: &Store,
    (drivers, settings): (&Registry, &Settings),
    graph: &crate::graph::ResourceGraph,
    ready: &[&ResourceRecord],
    options: &DetectOptions,
    failures: &mut Vec<String>,
) -> Result<(Vec<ReadEnded>, HashMap<usize, Needles>), StateError> {
    let halt = options.halt();
    let mut limits = Limits::new(settings.concurrency);
    let mut reads: JoinSet<ReadEnded> = JoinSet::new();
    let mut answers: Vec<ReadEnded> = Vec::new();
    let mut needles: HashMap<usize, Needles> = HashMap::new();
    for (i, rec) in ready.iter().enumerate() {
        let label = plan::record_label(rec);
        let Some(registered) = drivers.get(&rec.driver) else {
            failures.push(format!(
                "{label}: driver '{}' is not registered on this host",
                rec.driver
            ));
            continue;
        };
        let (job, secrets) = match read_request(store, settings, graph, rec)? {
            Ok(request) => request,
            Err(why) => {
                failures.push(format!("{label}: {why}"));
                continue;
            }
        };
        needles.insert(i, secrets);
        let driver = registered.driver.clone();
        if driver.in_process() {
            let read = driver.read(&job.request());
            answers.push((i, read.map_err(|e| Failure::Failed(e.message))));
            continue;
        }
        if let Some(halted) = halt.halted() {
            failures.push(format!("{label}: not read: {}", halted.cause()));
            continue;
        }
        let permits = limits.of(&rec.driver, registered.concurrency);
        // Taken before the read's task is spawned; reads that end meanwhile are collected.
        let held = loop {
            tokio::select! {
                held = permits.acquire() => break held,
                Some(joined) = reads.join_next() => collect(joined, &mut answers, failures),
            }
        };
        if let Some(halted) = halt.halted() {
            failures.push(format!("{label}: not read: {}", halted.cause()));
            continue;
        }
        let caller = Caller {
            driver,
            driver_type: rec.driver.clone(),
            permits,
            retry: settings.retry,
            halt: halt.clone(),
            observer: settings.calls.clone(),
        };
        reads.spawn(async move {
            // A read changes nothing: there is no call to journal.
            let (_, read) = call_until_done(Read, job, caller, held, |_, _| {}).await;
            (i, read)
        });
    }
    while let Some(joined) = reads.join_next().await {
        collect(joined, &mut answers, failures);
    }
    Ok((answers, needles))
}

/// The read request of `rec` (its recorded inputs, its account's credentials, its cookie) and
/// the secret values the call receives; `Ok(Err(why))` when it cannot be made.
fn read_request(
    store: &Store,
    settings: &Settings,
    graph: &crate::graph::ResourceGraph,
    rec: &ResourceRecord,
) -> Result<Result<(OwnedRequest, Needles), String>, StateError> {
    let (resource, values, secrets, resource_shown) = match recorded_inputs(rec) {
        Ok(inputs) => inputs,
        Err(why) => return Ok(Err(why)),
    };
    let account = match &rec.account {
        None => None,
        Some(name) => match (settings.accounts)(name) {
            Ok(v) => Some(v),
            Err(why) => return Ok(Err(why.to_string())),
        },
    };
    // As the put's: what the public inputs show is not looked for.
    let shown = resource_shown.then_some(&resource);
    let needles = Needles::of_call(
        std::iter::once(&secrets).chain(&account),
        std::iter::once(&values).chain(shown),
    );
    let request = OwnedRequest {
        guresid: rec.guresid.clone(),
        org: graph.org.clone(),
        env: graph.env.clone(),
        app: rec.app.clone(),
        res_type: rec.res_type.clone(),
        class: rec.class.clone(),
        res_id: rec.res_id.clone(),
        resource,
        values,
        secrets,
        account,
        cookie: store.cookie(&rec.guresid)?,
    };
    Ok(Ok((request, needles)))
}

/// What the reads that answered found, in `ready`'s order, each checked for leaked secrets
/// first; reads that failed or were halted go to `failures`.
fn read_findings(
    ready: &[&ResourceRecord],
    answers: Vec<ReadEnded>,
    needles: &mut HashMap<usize, Needles>,
    failures: &mut Vec<String>,
) -> Vec<ResourceFinding> {
    let mut found: Vec<(usize, Vec<Finding>)> = Vec::new();
    for (i, result) in answers {
        let rec = ready[i];
        match result {
            Ok(read) => {
                let needles = needles.remove(&i).unwrap_or_default();
                let read = secure_read(read, &needles, rec);
                let recorded = secure_record(rec, &needles);
                found.push((i, compare_read(&recorded, &read)));
            }
            Err(Failure::Halted(halted)) => failures.push(format!(
                "{}: not read: {}",
                plan::record_label(rec),
                halted.cause()
            )),
            Err(Failure::Failed(why)) => {
                failures.push(format!("{}: {why}", plan::record_label(rec)));
            }
        }
    }
    found.sort_by_key(|(i, _)| *i);
    found
        .into_iter()
        .flat_map(|(i, findings)| {
            let rec = ready[i];
            findings.into_iter().map(move |finding| ResourceFinding {
                guresid: rec.guresid.clone(),
                label: plan::record_label(rec),
                finding,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {

    use gitplane_state::DeletionPolicy;
    use serde_json::json;

    use super::*;
    use crate::graph::ResourceGraph;
    use crate::plan::test_support;

    fn record(outputs: Value, secret_outputs: Value) -> ResourceRecord {
        ResourceRecord {
            guresid: "g1".into(),
            env: "development".into(),
            app: Some("shop".into()),
            res_type: "postgres".into(),
            class: "default".into(),
            res_id: "shared.db".into(),
            definition: "pg".into(),
            driver: "echo".into(),
            account: None,
            deletion_policy: DeletionPolicy::Delete,
            template_hash: String::new(),
            status: ResourceStatus::Ready,
            inputs_hash: String::new(),
            outputs,
            secret_outputs,
            inputs: gitplane_state::StoredJson::new(&json!({})),
            secret_inputs: gitplane_state::StoredJson::new(&json!({})),
            error: None,
            commit_id: "c1".into(),
        }
    }

    #[test]
    fn a_read_as_recorded_finds_nothing() {
        let rec = record(
            json!({"host": "db", "port": 5432}),
            json!({"password": "s3cret"}),
        );
        let read = ReadOutcome::Found {
            outputs: json!({"port": 5432, "host": "db"}),
            secret_outputs: json!({"password": "s3cret"}),
        };
        assert!(compare_read(&rec, &read).is_empty());
        assert!(compare_read(&rec, &ReadOutcome::NoReadPath).is_empty());
    }

    #[test]
    fn changed_outputs_are_named_with_public_values_and_secrets_by_name_alone() {
        let rec = record(
            json!({"host": "db", "port": 5432, "tags": ["a"], "gone": true}),
            json!({"password": "s3cret", "user": "app"}),
        );
        let read = ReadOutcome::Found {
            outputs: json!({"host": "db2", "port": 5432, "tags": ["a", "b"], "new": {"x": 1}}),
            secret_outputs: json!({"password": "hunter2", "user": "app"}),
        };
        let findings = compare_read(&rec, &read);
        assert_eq!(findings.len(), 2, "{findings:?}");
        assert_eq!(findings[0].what, What::Outputs);
        assert_eq!(findings[0].source, Source::Driver);
        assert_eq!(
            findings[0].detail,
            "gone: true → (none); host: \"db\" → \"db2\"; new: (none) → {\"x\":1}; \
             tags[1]: (none) → \"b\""
        );
        assert_eq!(findings[1].what, What::SecretOutputs);
        assert_eq!(findings[1].detail, "secret outputs differ: password");
        for f in &findings {
            assert!(!f.detail.contains("s3cret") && !f.detail.contains("hunter2"));
        }
    }

    #[test]
    fn a_read_holding_a_secret_compares_as_a_put_records_it_and_quotes_no_secret() {
        let needles = Needles::of([&json!({"password": "s3cret-pw"})]);
        // What a put recorded: the leaking dsn moved to the secret outputs, and `token`, which
        // held a secret of the Score file (not among the read's secrets), too.
        let rec = record(
            json!({"host": "db"}),
            json!({"dsn": "postgres://u:s3cret-pw@db", "token": "from-the-score-file"}),
        );
        let read = ReadOutcome::Found {
            outputs: json!({
                "host": "db",
                "dsn": "postgres://u:s3cret-pw@db",
                "token": "from-the-score-file",
            }),
            secret_outputs: json!({}),
        };
        let read = secure_read(read, &needles, &rec);
        assert!(compare_read(&rec, &read).is_empty(), "{read:?}");

        // A record made before outputs were checked: compared as it would be recorded now.
        let old = record(
            json!({"host": "db", "dsn": "postgres://u:s3cret-pw@db"}),
            json!({}),
        );
        let changed = ReadOutcome::Found {
            outputs: json!({"host": "db2", "dsn": "postgres://u:s3cret-pw@db2"}),
            secret_outputs: json!({}),
        };
        let changed = secure_read(changed, &needles, &old);
        let findings = compare_read(&secure_record(&old, &needles), &changed);
        assert_eq!(findings.len(), 2, "{findings:?}");
        assert_eq!(findings[0].detail, "host: \"db\" → \"db2\"");
        assert_eq!(findings[1].detail, "secret outputs differ: dsn");
        assert!(matches!(secure_record(&rec, &needles), Cow::Borrowed(_)));
    }

    #[test]
    fn a_missing_resource_is_one_finding() {
        let rec = record(json!({}), json!({}));
        let findings = compare_read(&rec, &ReadOutcome::Missing);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].what, What::Missing);
    }

    #[test]
    fn details_stay_short_however_large_the_outputs() {
        let old: serde_json::Map<String, Value> = (0..1000)
            .map(|i| (format!("k{i}"), json!("x".repeat(500))))
            .collect();
        let new: serde_json::Map<String, Value> = (0..1000)
            .map(|i| (format!("k{i}"), json!("y".repeat(500))))
            .collect();
        let rec = record(Value::Object(old), json!({}));
        let read = ReadOutcome::Found {
            outputs: Value::Object(new),
            secret_outputs: json!({}),
        };
        let detail = &compare_read(&rec, &read)[0].detail;
        assert!(detail.chars().count() < 5_000, "{}", detail.len());
        assert!(detail.ends_with("and 980 more"), "{detail}");
        // Deep nesting is cut off, not recursed into without end.
        let mut deep = json!(1);
        for _ in 0..200 {
            deep = json!({ "a": deep });
        }
        assert_eq!(differences(&deep, &json!({"a": 2})).len(), 1);
    }

    fn inputs_findings(
        graph: &ResourceGraph,
        records: &[ResourceRecord],
    ) -> Vec<(String, Finding)> {
        let mut upstream = Recorded::new(records);
        for node in graph.nodes() {
            upstream.stable(&node.guresid);
        }
        records
            .iter()
            .filter_map(|rec| {
                let node = graph.get(rec.guresid.as_str())?;
                compare_inputs(rec, node, &upstream).map(|f| (rec.guresid.clone(), f))
            })
            .collect()
    }

    #[test]
    fn an_upstream_change_not_taken_downstream_is_an_inputs_finding() {
        let graph =
            test_support::graph(&crate::plan::test_support::template_files(), "development");
        let mut records = test_support::applied(&graph).records;
        assert!(inputs_findings(&graph, &records).is_empty());
        // Every provider's public outputs move on outside of its consumers' knowledge.
        let providers: Vec<String> = graph.edge_iter().map(|(_, to, _)| to.to_string()).collect();
        for rec in records
            .iter_mut()
            .filter(|r| providers.contains(&r.guresid))
        {
            if let Value::Object(map) = &mut rec.outputs {
                for v in map.values_mut() {
                    if let Value::String(s) = v {
                        s.push_str("-moved");
                    }
                }
            }
        }
        let found = inputs_findings(&graph, &records);
        assert!(!found.is_empty());
        for (guresid, f) in &found {
            assert_eq!((f.source, f.what), (Source::Recorded, What::Inputs));
            // Public inputs are shown with their values; where a secret flowed in (a workload
            // reading a password), the paths alone.
            match f.detail.split_once("secret inputs differ: ") {
                Some((_, secret)) => assert!(!secret.contains("-moved"), "{}", f.detail),
                None => assert!(f.detail.contains("-moved"), "{guresid}: {}", f.detail),
            }
            // Only consumers can have taken an old value.
            assert!(
                graph
                    .edge_iter()
                    .any(|(from, _, _)| from.as_str() == guresid),
                "{guresid}"
            );
        }
    }
}
