//! The plan: what applying a graph would do to the recorded state, and why.
//!
//! [`plan`] is a pure function of an environment's graph and its recorded resources and links.
//! It also owns how a resource's inputs are resolved ([`resolve_inputs`]) and hashed
//! ([`inputs_hash`]), so the plan and the reconciler can never disagree about what "changed"
//! means.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use crate::records::{BindingRecord, LinkRecord, ResourceRecord, ResourceStatus, StoredJson};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::graph::{Binding, GuresId, Read, ResourceGraph, ResourceNode};
use crate::model::Property;
use crate::model::placeholder::path_to_string;
use crate::model::template::{Resolved, lookup_path};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Create,
    Update,
    /// Its inputs read outputs of resources that change in this plan: whether it changes is
    /// known after apply.
    MaybeUpdate,
    /// `auto_update: false`: kept as last bound though upstream values changed (stale).
    Pinned,
    Unchanged,
    Delete,
    /// Its definition says `deletion_policy: orphan`: forget it, do not delete it.
    Forget,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::MaybeUpdate => "update?",
            Action::Pinned => "pinned",
            Action::Unchanged => "unchanged",
            Action::Delete => "delete",
            Action::Forget => "forget",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One resource's part of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub guresid: GuresId,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub action: Action,
    pub reason: String,
    /// For [`Action::MaybeUpdate`]: each input that reads an output of a resource changing first,
    /// as `values.host <- app/type.class#id outputs.NAME`.
    pub known_after_apply: Vec<String>,
    /// Each input that changes, as `values.port: 5432 -> 6432` (secrets:
    /// `secrets.password: changed (secret)`): for an update whose inputs are known, all of them;
    /// for [`Action::MaybeUpdate`], those that change whatever the outputs it reads become.
    pub changes: Vec<String>,
}

impl Step {
    pub fn label(&self) -> String {
        crate::graph::label(
            self.app.as_deref(),
            &self.res_type,
            &self.class,
            &self.res_id,
        )
    }
}

/// The steps for one environment: puts in provisioning order, then deletions in reverse
/// dependency order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub env: String,
    pub steps: Vec<Step>,
}

impl Plan {
    pub fn count(&self, action: Action) -> usize {
        self.steps.iter().filter(|s| s.action == action).count()
    }

    pub fn changes_nothing(&self) -> bool {
        self.steps.iter().all(|s| s.action == Action::Unchanged)
    }
}

/// The inputs a driver receives for one resource, every placeholder resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedInputs {
    pub resource: Value,
    /// Whether a secret flowed into `resource` (a workload's Score file that reads a password),
    /// so it must be kept with the secrets.
    pub resource_is_secret: bool,
    pub values: Value,
    pub secrets: Value,
    /// The secret values that flowed into `resource`, to hide wherever it is shown.
    pub resource_secrets: Vec<Value>,
}

/// Why a resource's inputs cannot be resolved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "reads output '{path}' of {target}, which it does not provide (its outputs: {available})"
    )]
    MissingOutput {
        target: String,
        path: String,
        available: String,
    },
    #[error(
        "driver_inputs.values reads the secret output '{path}' of {target}: move it under \
         driver_inputs.secrets"
    )]
    SecretInValues { target: String, path: String },
    /// Planning and applying read every secret store before resolving anything.
    #[error("reads the secret {secret}, which was not read from its store")]
    NotRead { secret: String },
    /// An upstream resource changes first; only the reconciler can resolve this.
    #[error("reads outputs of {target}, which are known after apply")]
    KnownAfterApply { target: String },
}

/// The outputs of provisioned resources, as a lookup for resolution.
pub trait Outputs {
    /// `(outputs, secret_outputs)` of `id`, or `None` when not known (yet).
    fn outputs(&self, id: &GuresId) -> Option<(&Value, &Value)>;
    /// How people name `id`, for messages.
    fn label(&self, id: &GuresId) -> String;
}

impl Outputs for HashMap<GuresId, (Value, Value, String)> {
    fn outputs(&self, id: &GuresId) -> Option<(&Value, &Value)> {
        self.get(id).map(|(o, s, _)| (o, s))
    }

    fn label(&self, id: &GuresId) -> String {
        self.get(id)
            .map(|(_, _, l)| l.clone())
            .unwrap_or_else(|| id.to_string())
    }
}

/// The recorded resources of an environment by GUResID, and the outputs of those a plan or an
/// apply has found to stay as they are: what unchanged inputs resolve to. Borrows the records
/// rather than copying 50 000 output objects.
pub struct Recorded<'a> {
    pub by_id: HashMap<&'a str, &'a ResourceRecord>,
    /// Resources whose recorded outputs are current.
    stable: HashSet<&'a str>,
}

impl<'a> Recorded<'a> {
    pub fn new(records: &'a [ResourceRecord]) -> Self {
        Recorded {
            by_id: records.iter().map(|r| (r.guresid.as_str(), r)).collect(),
            stable: HashSet::new(),
        }
    }

    /// Marks a recorded resource's outputs current.
    pub fn stable(&mut self, id: &GuresId) {
        if let Some((&key, _)) = self.by_id.get_key_value(id.as_str()) {
            self.stable.insert(key);
        }
    }

    pub fn get(&self, id: &str) -> Option<&'a ResourceRecord> {
        self.by_id.get(id).copied()
    }
}

impl Outputs for Recorded<'_> {
    fn outputs(&self, id: &GuresId) -> Option<(&Value, &Value)> {
        if !self.stable.contains(id.as_str()) {
            return None;
        }
        self.by_id
            .get(id.as_str())
            .map(|r| (&r.outputs, &r.secret_outputs))
    }

    fn label(&self, id: &GuresId) -> String {
        match self.by_id.get(id.as_str()) {
            Some(r) => record_label(r),
            None => id.to_string(),
        }
    }
}

/// Resolves a node's inputs against upstream outputs.
pub fn resolve_inputs(
    node: &ResourceNode,
    upstream: &impl Outputs,
) -> Result<ResolvedInputs, ResolveError> {
    let mut lookup = |b: &Binding| resolve_binding(upstream, b);
    // The first placeholder under `values` that reads a secret, to tell the user what to move.
    let mut first_secret: Option<(&GuresId, &[crate::model::placeholder::Segment])> = None;
    let values = node.values.resolve(&mut |b: &Binding| {
        let r = lookup(b)?;
        if r.secret && first_secret.is_none() {
            first_secret = match b {
                Binding::Output { target, path, .. } => Some((target, path)),
                Binding::Selector { base, path, .. } => Some((base, path)),
                // Only `secret_refs` reads stores, and those join `secrets`.
                Binding::Stored { .. } => None,
            };
        }
        Ok::<_, ResolveError>(r)
    })?;
    if let Some((target, path)) = first_secret {
        return Err(ResolveError::SecretInValues {
            target: upstream.label(target),
            path: path_to_string(path),
        });
    }
    let secrets = node.secrets.resolve(&mut lookup)?;
    let mut resource_secrets = Vec::new();
    let resource = node.params.resolve(&mut |b: &Binding| {
        let r = lookup(b)?;
        if r.secret {
            resource_secrets.push(r.value.clone());
        }
        Ok::<_, ResolveError>(r)
    })?;
    Ok(ResolvedInputs {
        resource: resource.value,
        resource_is_secret: resource.secret,
        values: values.value,
        secrets: secrets.value,
        resource_secrets,
    })
}

/// The value a binding reads: one output, or for a selector the array of every selected
/// resource's output; secret if any part is.
fn resolve_binding(upstream: &impl Outputs, b: &Binding) -> Result<Resolved, ResolveError> {
    match b {
        Binding::Stored { value: Some(v), .. } => Ok(Resolved {
            value: v.0.clone(),
            secret: true,
        }),
        Binding::Stored {
            secret,
            value: None,
            ..
        } => Err(ResolveError::NotRead {
            secret: secret.to_string(),
        }),
        Binding::Output {
            target,
            read,
            path,
            property,
        } => output_of(upstream, target, *read, path, property.as_deref()),
        Binding::Selector { targets, path, .. } => {
            let mut values = Vec::with_capacity(targets.len());
            let mut secret = false;
            for target in targets {
                let r = output_of(upstream, target, Read::Outputs, path, None)?;
                secret |= r.secret;
                values.push(r.value);
            }
            Ok(Resolved {
                value: Value::Array(values),
                secret,
            })
        }
    }
}

/// What `read` names of `target`: one output (or a value inside it) or a whole part of its
/// outputs, and whether it is secret; or its GUResID, known before it is provisioned. A Score
/// `property` fills a missing output with its default and makes the value secret if it says so.
fn output_of(
    upstream: &impl Outputs,
    target: &GuresId,
    read: Read,
    path: &[crate::model::placeholder::Segment],
    property: Option<&Property>,
) -> Result<Resolved, ResolveError> {
    if read == Read::Guresid {
        return Ok(Resolved {
            value: Value::String(target.to_string()),
            secret: false,
        });
    }
    let Some((outputs, secrets)) = upstream.outputs(target) else {
        return Err(ResolveError::KnownAfterApply {
            target: target.to_string(),
        });
    };
    let declared_secret = property.is_some_and(|p| p.secret);
    let found = match read {
        Read::Values => lookup_path(outputs, path).map(|v| (v, false)),
        Read::Secrets => lookup_path(secrets, path).map(|v| (v, true)),
        _ => lookup_path(outputs, path)
            .map(|v| (v, false))
            .or_else(|| lookup_path(secrets, path).map(|v| (v, true))),
    };
    if let Some((v, secret)) = found {
        return Ok(Resolved {
            value: v.clone(),
            secret: secret || declared_secret,
        });
    }
    if let Some(default) = property.and_then(|p| p.default.as_ref()) {
        return Ok(Resolved {
            value: default.clone(),
            secret: declared_secret,
        });
    }
    let parts = match read {
        Read::Values => vec![outputs],
        Read::Secrets => vec![secrets],
        _ => vec![outputs, secrets],
    };
    let mut available: Vec<&String> = parts
        .into_iter()
        .filter_map(Value::as_object)
        .flat_map(|m| m.keys())
        .collect();
    available.sort();
    Err(ResolveError::MissingOutput {
        target: upstream.label(target),
        path: match read {
            Read::Outputs => path_to_string(path),
            _ => crate::graph::read_path(read, path),
        },
        available: if available.is_empty() {
            "none".to_owned()
        } else {
            available
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

/// The inputs as recorded: what `resource.inputs` may show, and what only `resource_secret`
/// holds (the secrets, and the resource's own inputs when a secret flowed into them), each as
/// the JSON text state keeps.
pub fn split_inputs(inputs: &ResolvedInputs) -> (StoredJson, StoredJson) {
    let (public, secret) = halves(inputs);
    (
        StoredJson::from_text(to_json(&public)),
        StoredJson::from_text(to_json(&secret)),
    )
}

/// The non-secret half of the inputs: `{"resource", "values"}`, or `{"values"}` when a secret
/// flowed into `resource`.
#[derive(serde::Serialize)]
struct PublicInputs<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<&'a Value>,
    values: &'a Value,
}

/// The secret half: `{"secrets"}`, or `{"resource", "secrets"}`.
#[derive(serde::Serialize)]
struct SecretInputs<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<&'a Value>,
    secrets: &'a Value,
}

fn halves(inputs: &ResolvedInputs) -> (PublicInputs<'_>, SecretInputs<'_>) {
    let (public, secret) = if inputs.resource_is_secret {
        (None, Some(&inputs.resource))
    } else {
        (Some(&inputs.resource), None)
    };
    (
        PublicInputs {
            resource: public,
            values: &inputs.values,
        },
        SecretInputs {
            resource: secret,
            secrets: &inputs.secrets,
        },
    )
}

/// Compact JSON, as `serde_json::Value::to_string` writes it: the fields of the structs above
/// are in the order a sorted map would put them, so the text is the same.
fn to_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("JSON values and strings always serialise")
}

/// A digest of what a driver receives for a resource, but its secrets: a change means the
/// resource must be updated. Secrets stay out because a digest of a guessable password beside
/// the rest of what was hashed (in `resource.inputs`) would let anyone who reads the `resource`
/// table test guesses; [`same_inputs`] compares them with `resource_secret` instead.
pub fn inputs_hash(node: &ResourceNode, inputs: &ResolvedInputs) -> String {
    /// `{"account", "definition", "driver", "inputs"}`, keys sorted as in a JSON map, so equal
    /// inputs give equal text, written straight into the digest.
    #[derive(serde::Serialize)]
    struct Hashed<'a> {
        account: &'a Option<String>,
        definition: &'a str,
        driver: &'a str,
        inputs: PublicInputs<'a>,
    }
    struct Digest(Sha256);
    impl std::io::Write for Digest {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let hashed = Hashed {
        account: &node.driver_account,
        definition: &node.definition,
        driver: &node.driver_type,
        inputs: halves(inputs).0,
    };
    let mut digest = Digest(Sha256::new());
    serde_json::to_writer(&mut digest, &hashed).expect("JSON values and strings always serialise");
    crate::graph::hex(&digest.0.finalize())
}

/// Whether `rec` was provisioned with exactly `inputs` (whose [`inputs_hash`] is `hash`),
/// secrets included: a rotated password must reach the driver.
pub fn same_inputs(rec: &ResourceRecord, hash: &str, inputs: &ResolvedInputs) -> bool {
    rec.inputs_hash == hash && rec.secret_inputs.as_str() == to_json(&halves(inputs).1)
}

/// `app/type.class#res_id` of a recorded resource.
pub fn record_label(rec: &ResourceRecord) -> String {
    crate::graph::label(rec.app.as_deref(), &rec.res_type, &rec.class, &rec.res_id)
}

/// What `node` is recorded as before anything is known of it: failed, with no outputs and no
/// inputs sent. Callers fill in what they learn.
pub fn record_of(node: &ResourceNode, env: &str, commit: &str) -> ResourceRecord {
    let empty = || Value::Object(Default::default());
    ResourceRecord {
        guresid: node.guresid.to_string(),
        env: env.to_owned(),
        app: node.app.clone(),
        res_type: node.res_type.clone(),
        class: node.class.clone(),
        res_id: node.res_id.clone(),
        definition: node.definition.clone(),
        driver: node.driver_type.clone(),
        account: node.driver_account.clone(),
        deletion_policy: node.deletion_policy,
        template_hash: node.template_hash.clone(),
        status: ResourceStatus::Failed,
        inputs_hash: String::new(),
        outputs: empty(),
        secret_outputs: empty(),
        inputs: Default::default(),
        secret_inputs: Default::default(),
        error: None,
        commit_id: commit.to_owned(),
    }
}

/// Compares `graph` with the recorded resources and links of its environment.
pub fn plan(graph: &ResourceGraph, recorded: &[ResourceRecord], links: &[LinkRecord]) -> Plan {
    let mut known = Recorded::new(recorded);
    // Every recorded output as it is now: what a resource's inputs resolve to when nothing it
    // reads changes, which leaves only the changes of its own.
    let mut as_recorded = Recorded::new(recorded);
    as_recorded.stable = as_recorded.by_id.keys().copied().collect();
    let mut steps = Vec::with_capacity(graph.len());
    for node in graph.provisioning_order() {
        let rec = known.get(node.guresid.as_str());
        let (action, mut reason, mut changes) = put_action(node, rec, &known);
        let known_after_apply = if action == Action::MaybeUpdate {
            pending_inputs(graph, node, &known)
        } else {
            Vec::new()
        };
        if action == Action::MaybeUpdate
            && let Some(rec) = rec
        {
            // What it reads may change, but its own inputs may change for sure too (an image
            // bump): those are known now, and a review must not hide them behind the maybe.
            changes = known_changes(node, rec, &as_recorded, &known_after_apply);
            if !changes.is_empty() {
                reason = "inputs changed; more known after apply:".into();
            }
        }
        if action == Action::Unchanged {
            known.stable(&node.guresid);
        }
        steps.push(Step {
            guresid: node.guresid.clone(),
            app: node.app.clone(),
            res_type: node.res_type.clone(),
            class: node.class.clone(),
            res_id: node.res_id.clone(),
            action,
            reason,
            known_after_apply,
            changes,
        });
    }
    let orphans: Vec<&ResourceRecord> = recorded
        .iter()
        .filter(|r| !graph.contains(r.guresid.as_str()))
        .collect();
    for rec in deletion_order(&orphans, links) {
        let (action, reason) = match rec.deletion_policy {
            crate::records::DeletionPolicy::Delete => (Action::Delete, "no longer in the graph"),
            crate::records::DeletionPolicy::Orphan => (
                Action::Forget,
                "no longer in the graph; deletion_policy orphan: forgotten, not deleted",
            ),
        };
        steps.push(Step {
            guresid: GuresId::from_recorded(rec.guresid.clone()),
            app: rec.app.clone(),
            res_type: rec.res_type.clone(),
            class: rec.class.clone(),
            res_id: rec.res_id.clone(),
            action,
            reason: reason.into(),
            known_after_apply: Vec::new(),
            changes: Vec::new(),
        });
    }
    if !orphans.is_empty() {
        note_remaining_consumers(graph, &mut steps, links);
    }
    Plan {
        env: graph.env.clone(),
        steps,
    }
}

fn put_action(
    node: &ResourceNode,
    rec: Option<&ResourceRecord>,
    stable: &Recorded<'_>,
) -> (Action, String, Vec<String>) {
    let Some(rec) = rec else {
        return (Action::Create, "new resource".into(), Vec::new());
    };
    if rec.status == ResourceStatus::Failed {
        return (
            Action::Update,
            "the last apply failed: retry".into(),
            Vec::new(),
        );
    }
    if rec.definition != node.definition {
        let why = format!(
            "definition changed from '{}' to '{}'",
            rec.definition, node.definition
        );
        return (Action::Update, why, Vec::new());
    }
    if rec.driver != node.driver_type {
        let why = format!(
            "driver changed from '{}' to '{}'",
            rec.driver, node.driver_type
        );
        return (Action::Update, why, Vec::new());
    }
    let pinned = !node.auto_update && rec.template_hash == node.template_hash;
    match resolve_inputs(node, stable) {
        Ok(inputs) if same_inputs(rec, &inputs_hash(node, &inputs), &inputs) => {
            (Action::Unchanged, String::new(), Vec::new())
        }
        Ok(inputs) if pinned => (
            Action::Pinned,
            "auto_update: false: keeps the values it was last bound to, which are stale; \
             `gitplane resolve` takes the new ones"
                .into(),
            input_changes(rec, &inputs),
        ),
        Ok(inputs) => (
            Action::Update,
            "inputs changed".into(),
            input_changes(rec, &inputs),
        ),
        Err(ResolveError::KnownAfterApply { .. }) if pinned => (
            Action::Pinned,
            "auto_update: false: keeps the values it was last bound to, even if what it reads \
             changes in this apply"
                .into(),
            Vec::new(),
        ),
        Err(ResolveError::KnownAfterApply { .. }) => (
            Action::MaybeUpdate,
            "inputs known after apply:".into(),
            Vec::new(),
        ),
        Err(e) => (
            Action::Update,
            format!("inputs do not resolve: {e}"),
            Vec::new(),
        ),
    }
}

/// The inputs of `node` that change whatever the outputs it reads become: its inputs resolved
/// against the recorded outputs, against what `rec` was last provisioned with, leaving out the
/// inputs that read an output known only after apply (`pending`, as [`pending_inputs`] gives
/// them). Empty when they do not resolve that way (a provider not recorded yet).
fn known_changes(
    node: &ResourceNode,
    rec: &ResourceRecord,
    as_recorded: &Recorded<'_>,
    pending: &[String],
) -> Vec<String> {
    let Ok(inputs) = resolve_inputs(node, as_recorded) else {
        return Vec::new();
    };
    let pending: Vec<&str> = pending
        .iter()
        .map(|p| p.split_once(" <- ").map_or(p.as_str(), |(path, _)| path))
        .collect();
    let overlaps = |change: &str| {
        let path = change.split_once(": ").map_or(change, |(path, _)| path);
        pending.iter().any(|p| {
            let within = |inner: &str, outer: &str| {
                inner == outer
                    || inner
                        .strip_prefix(outer)
                        .is_some_and(|rest| rest.starts_with('.'))
            };
            within(path, p) || within(p, path)
        })
    };
    input_changes(rec, &inputs)
        .into_iter()
        .filter(|c| !overlaps(c))
        .collect()
}

/// The inputs that differ between what `rec` was last provisioned with and `inputs`. Only
/// resources that change pay for reading what they were last sent.
fn input_changes(rec: &ResourceRecord, inputs: &ResolvedInputs) -> Vec<String> {
    let mut out = Vec::new();
    // A column that does not parse shows every input as new rather than hiding the change.
    let old_inputs = rec.inputs.parse().unwrap_or(Value::Null);
    let old_values = old_inputs.get("values").unwrap_or(&Value::Null);
    diff_values("values", old_values, &inputs.values, false, &mut out);
    let old_secret_inputs = rec.secret_inputs.parse().unwrap_or(Value::Null);
    if inputs.resource_is_secret {
        // Which parts changed, never to what: a secret flowed into them.
        let old = old_secret_inputs.get("resource").unwrap_or(&Value::Null);
        diff_values("resource", old, &inputs.resource, true, &mut out);
    } else {
        let old = old_inputs.get("resource").unwrap_or(&Value::Null);
        diff_values("resource", old, &inputs.resource, false, &mut out);
    }
    let old_secrets = old_secret_inputs.get("secrets").unwrap_or(&Value::Null);
    diff_values("secrets", old_secrets, &inputs.secrets, true, &mut out);
    out
}

fn diff_values(path: &str, old: &Value, new: &Value, secret: bool, out: &mut Vec<String>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let child = format!("{path}.{k}");
                diff_values(
                    &child,
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    secret,
                    out,
                );
            }
        }
        _ if secret => out.push(format!("{path}: changed (secret)")),
        _ => out.push(format!("{path}: {old} -> {new}")),
    }
}

/// Every placeholder of `node` as a binding, resolved against `upstream`: which value of which
/// provider reaches which input. Placeholders whose provider is not known yet are left out;
/// secret values are not kept.
pub fn bindings_of(node: &ResourceNode, upstream: &impl Outputs) -> Vec<BindingRecord> {
    let mut out = Vec::new();
    for (template, prefix) in [
        (&node.values, "values"),
        (&node.secrets, "secrets"),
        (&node.params, "resource"),
    ] {
        for placed in template.placeholders(prefix) {
            // A stored secret is no link between resources.
            let Some((provided, provided_path)) = placed.expr.provided() else {
                continue;
            };
            let Ok(resolved) = resolve_binding(upstream, placed.expr) else {
                continue;
            };
            let secret = resolved.secret || prefix == "secrets";
            let interface = match placed.expr {
                Binding::Output {
                    target,
                    path: output,
                    ..
                } => node
                    .interfaces
                    .iter()
                    .find(|u| {
                        u.provider == *target
                            && output.first()
                                == Some(&crate::model::placeholder::Segment::Key(u.output.clone()))
                    })
                    .map(|u| format!("{} = {}", u.name, u.id)),
                Binding::Selector { .. } | Binding::Stored { .. } => None,
            };
            out.push(BindingRecord {
                interface,
                needed: node.guresid.to_string(),
                needed_path: placed.path,
                provided: provided.to_string(),
                provided_path,
                data_type: data_type(&resolved.value).to_owned(),
                inserted: !placed.whole
                    && (resolved.value.is_object() || resolved.value.is_array()),
                value: (!secret).then_some(resolved.value),
                secret,
            });
        }
    }
    out
}

/// A placeholder of a resource as the binding it would record once applied: its value when it
/// is known before apply and not secret.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedBinding {
    pub needed_path: String,
    pub provided: GuresId,
    pub provided_path: String,
    pub secret: bool,
    /// `None` for a secret, or for a value known only after apply.
    pub value: Option<Value>,
    /// Whether the value is known before apply (the provider stays as recorded).
    pub known: bool,
}

/// Every placeholder of `node` that reads another resource, resolved against `upstream` where
/// it can be: what [`bindings_of`] would record after apply, as far as a plan can tell.
pub fn planned_bindings(node: &ResourceNode, upstream: &impl Outputs) -> Vec<PlannedBinding> {
    let mut out = Vec::new();
    for (template, prefix) in [
        (&node.values, "values"),
        (&node.secrets, "secrets"),
        (&node.params, "resource"),
    ] {
        for placed in template.placeholders(prefix) {
            let Some((provided, provided_path)) = placed.expr.provided() else {
                continue;
            };
            let declared_secret = match placed.expr {
                Binding::Output { property, .. } => property.as_ref().is_some_and(|p| p.secret),
                _ => false,
            };
            let (secret, value, known) = match resolve_binding(upstream, placed.expr) {
                Ok(r) => {
                    let secret = r.secret || prefix == "secrets";
                    (secret, (!secret).then_some(r.value), true)
                }
                Err(_) => (prefix == "secrets" || declared_secret, None, false),
            };
            out.push(PlannedBinding {
                needed_path: placed.path,
                provided: provided.clone(),
                provided_path,
                secret,
                value,
                known,
            });
        }
    }
    out
}

fn data_type(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int",
        _ => "json",
    }
}

/// Reference counting made visible: a resource that loses a consumer to a deletion but stays,
/// says who still uses it.
fn note_remaining_consumers(graph: &ResourceGraph, steps: &mut [Step], links: &[LinkRecord]) {
    let deleted: HashSet<&str> = steps
        .iter()
        .filter(|s| matches!(s.action, Action::Delete | Action::Forget))
        .map(|s| s.guresid.as_str())
        .collect();
    let lost: HashSet<&str> = links
        .iter()
        .filter(|l| deleted.contains(l.consumer.as_str()) && !deleted.contains(l.provider.as_str()))
        .map(|l| l.provider.as_str())
        .collect();
    for step in steps.iter_mut() {
        if !lost.contains(step.guresid.as_str()) {
            continue;
        }
        let mut users: Vec<String> = graph
            .dependents(&step.guresid)
            .into_iter()
            .filter_map(|id| graph.get(id).map(ResourceNode::label))
            .collect();
        users.sort();
        if users.is_empty() {
            continue;
        }
        let note = format!("kept: a consumer goes, still used by {}", users.join(", "));
        step.reason = if step.reason.is_empty() {
            note
        } else {
            format!("{}; {note}", step.reason)
        };
    }
}

/// The inputs of `node` that read outputs of resources not yet stable.
fn pending_inputs(
    graph: &ResourceGraph,
    node: &ResourceNode,
    stable: &Recorded<'_>,
) -> Vec<String> {
    let label = |id: &GuresId| {
        graph
            .get(id)
            .map(ResourceNode::label)
            .unwrap_or_else(|| id.to_string())
    };
    let mut out = Vec::new();
    for (template, prefix) in [
        (&node.values, "values"),
        (&node.secrets, "secrets"),
        (&node.params, "resource"),
    ] {
        for placed in template.placeholders(prefix) {
            let path = placed.path;
            match placed.expr {
                Binding::Output {
                    target,
                    read,
                    path: output,
                    ..
                } if *read != Read::Guresid && stable.outputs(target).is_none() => {
                    out.push(format!(
                        "{path} <- {} {}",
                        label(target),
                        crate::graph::read_path(*read, output)
                    ));
                }
                Binding::Selector {
                    written,
                    targets,
                    path: output,
                    ..
                } if targets.iter().any(|t| stable.outputs(t).is_none()) => {
                    out.push(format!(
                        "{path} <- selector {written} outputs.{}",
                        path_to_string(output)
                    ));
                }
                _ => {}
            }
        }
    }
    out
}

/// Why the deletion guard holds a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// Labels of the resources the plan would delete.
    pub deletions: Vec<String>,
    pub reason: String,
}

/// How many resources an environment has recorded, and how many of them a plan's scope
/// covers (the apps a commit made gitplane read; all of them for a whole deployment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedCount {
    pub environment: usize,
    pub in_scope: usize,
}

impl RecordedCount {
    /// A plan of the whole environment.
    pub fn whole(recorded: usize) -> RecordedCount {
        RecordedCount {
            environment: recorded,
            in_scope: recorded,
        }
    }
}

/// The deletion guard: holds a plan that would delete more than `threshold` percent of the
/// resources its environment has recorded, or that would leave it with none. Judged on the
/// whole environment whatever part of it the plan covers: the resources outside its scope stay.
pub fn deletion_guard(plan: &Plan, recorded: RecordedCount, threshold: f64) -> Option<Held> {
    let deletions: Vec<String> = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::Delete)
        .map(Step::label)
        .collect();
    if deletions.is_empty() || recorded.environment == 0 {
        return None;
    }
    let kept_in_scope = plan
        .steps
        .iter()
        .filter(|s| !matches!(s.action, Action::Delete | Action::Forget))
        .count();
    let remaining = recorded.environment.saturating_sub(recorded.in_scope) + kept_in_scope;
    let total = recorded.environment;
    let share = deletions.len() as f64 * 100.0 / total as f64;
    let reason = if remaining == 0 {
        format!(
            "it would delete all {} resources of environment {}",
            deletions.len(),
            plan.env
        )
    } else if share > threshold {
        format!(
            "it would delete {} of {total} resources of environment {} ({share:.0}%, above \
             the {threshold}% threshold)",
            deletions.len(),
            plan.env
        )
    } else {
        return None;
    };
    Some(Held { deletions, reason })
}

/// Orphans ordered so each is deleted before anything it depends on: a topological order of
/// the orphans and the recorded links between them (petgraph's, on a graph in GUResID order, so
/// the order is reproducible).
pub fn deletion_order<'a>(
    orphans: &[&'a ResourceRecord],
    links: &[LinkRecord],
) -> Vec<&'a ResourceRecord> {
    use daggy::petgraph::graph::{DiGraph, NodeIndex};
    let mut sorted: Vec<&'a ResourceRecord> = orphans.to_vec();
    sorted.sort_by(|a, b| a.guresid.cmp(&b.guresid));
    let mut g: DiGraph<&'a ResourceRecord, ()> = DiGraph::with_capacity(sorted.len(), 0);
    let index: HashMap<&str, NodeIndex> = sorted
        .iter()
        .map(|r| (r.guresid.as_str(), g.add_node(*r)))
        .collect();
    for l in links {
        if let (Some(&from), Some(&to)) = (
            index.get(l.consumer.as_str()),
            index.get(l.provider.as_str()),
        ) {
            g.add_edge(from, to, ());
        }
    }
    match daggy::petgraph::algo::toposort(&g, None) {
        Ok(order) => order.into_iter().map(|n| g[n]).collect(),
        // Recorded links form a DAG; should they not, everything still gets deleted.
        Err(_) => sorted,
    }
}

/// What tests of the planning code start from: a commit's graph, and what applying it with
/// echo drivers records, computed without I/O.
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    use std::collections::{BTreeMap, HashMap};

    use crate::records::{BindingRecord, LinkRecord, ResourceRecord, ResourceStatus};
    use serde_json::Value;

    use super::{bindings_of, inputs_hash, record_of, resolve_inputs, split_inputs};
    use crate::graph::{GuresId, ResourceGraph};

    /// The files of `repo-template/`, as a commit gives them.
    pub fn template_files() -> BTreeMap<String, Vec<u8>> {
        crate::repo_template::TEMPLATE
            .iter()
            .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
            .collect()
    }

    /// Environment `env`'s graph of `files`.
    pub fn graph(files: &BTreeMap<String, Vec<u8>>, env: &str) -> ResourceGraph {
        let repo = crate::model::load(files).unwrap();
        let env = repo.environments.iter().find(|e| e.id == env).unwrap();
        crate::graph::build(&repo, env).unwrap()
    }

    /// What applying a graph with echo drivers records: resources, links and bindings.
    pub struct Applied {
        pub records: Vec<ResourceRecord>,
        pub links: Vec<LinkRecord>,
        pub bindings: HashMap<String, Vec<BindingRecord>>,
    }

    pub fn applied(graph: &ResourceGraph) -> Applied {
        let mut outputs: HashMap<GuresId, (Value, Value, String)> = HashMap::new();
        let mut records = Vec::new();
        let mut bindings = HashMap::new();
        for node in graph.provisioning_order() {
            let inputs = resolve_inputs(node, &outputs).unwrap();
            bindings.insert(node.guresid.to_string(), bindings_of(node, &outputs));
            let (public, secret) = split_inputs(&inputs);
            records.push(ResourceRecord {
                status: ResourceStatus::Ready,
                inputs_hash: inputs_hash(node, &inputs),
                outputs: inputs.values.clone(),
                secret_outputs: inputs.secrets.clone(),
                inputs: public,
                secret_inputs: secret,
                ..record_of(node, &graph.env, "c1")
            });
            outputs.insert(
                node.guresid.clone(),
                (inputs.values, inputs.secrets, node.label()),
            );
        }
        let links = graph
            .edge_iter()
            .map(|(from, to, kind)| LinkRecord {
                consumer: from.to_string(),
                provider: to.to_string(),
                kind: kind.as_str().to_owned(),
                update_type: "None".to_owned(),
            })
            .collect();
        Applied {
            records,
            links,
            bindings,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::graph::tests::template_files;

    fn graph(files: &BTreeMap<String, Vec<u8>>) -> ResourceGraph {
        test_support::graph(files, "development")
    }

    fn applied(graph: &ResourceGraph) -> (Vec<ResourceRecord>, Vec<LinkRecord>) {
        let applied = test_support::applied(graph);
        (applied.records, applied.links)
    }

    /// The template applied, then one edit planned: the plan, and each step that is not
    /// unchanged.
    fn plan_after_edit(path: &str, from: &str, to: &str) -> (Plan, Vec<(String, Action)>) {
        let mut files = template_files();
        let (records, edges) = applied(&graph(&files));
        edit(&mut files, path, from, to);
        let p = plan(&graph(&files), &records, &edges);
        let changed = actions(&p)
            .into_iter()
            .filter(|(_, a)| *a != Action::Unchanged)
            .collect();
        (p, changed)
    }

    fn actions(plan: &Plan) -> Vec<(String, Action)> {
        plan.steps
            .iter()
            .map(|s| (format!("{}#{}", s.res_type, s.res_id), s.action))
            .collect()
    }

    fn edit(files: &mut BTreeMap<String, Vec<u8>>, path: &str, from: &str, to: &str) {
        let text = String::from_utf8(files[path].clone()).unwrap();
        assert!(text.contains(from), "{from} not in {path}");
        files.insert(path.into(), text.replacen(from, to, 1).into_bytes());
    }

    /// Finding: removing some apps was judged on the part the commit made gitplane read, so it
    /// was held as "all resources" although the other apps stay, while the same removal with a
    /// definition change (every app read) went through. The verdict counts the whole
    /// environment.
    #[test]
    fn the_deletion_guard_judges_the_whole_environment_whatever_the_scope_read() {
        let (records, links) = applied(&graph(&template_files()));
        assert_eq!(records.len(), 6);
        // The part read holds six resources, and the commit deletes all of them.
        let p = plan(&ResourceGraph::removed("development"), &records, &links);
        let part = |environment| RecordedCount {
            environment,
            in_scope: 6,
        };
        assert_eq!(
            deletion_guard(&p, part(12), 50.0),
            None,
            "6 of 12 is not above 50%"
        );
        let held = deletion_guard(&p, part(10), 50.0).unwrap();
        assert_eq!(held.deletions.len(), 6);
        assert!(
            held.reason
                .starts_with("it would delete 6 of 10 resources of environment development (60%"),
            "{}",
            held.reason
        );
        let all = deletion_guard(&p, RecordedCount::whole(6), 90.0).unwrap();
        assert_eq!(
            all.reason,
            "it would delete all 6 resources of environment development"
        );
    }

    #[test]
    fn empty_state_creates_everything_in_provisioning_order() {
        let g = graph(&template_files());
        let p = plan(&g, &[], &[]);
        assert_eq!(p.count(Action::Create), 6);
        let order: Vec<&GuresId> = p.steps.iter().map(|s| &s.guresid).collect();
        let expected: Vec<&GuresId> = g.provisioning_order().map(|n| &n.guresid).collect();
        assert_eq!(order, expected);
    }

    #[test]
    fn applied_state_plans_no_change() {
        let g = graph(&template_files());
        let (records, edges) = applied(&g);
        assert!(plan(&g, &records, &edges).changes_nothing());
    }

    #[test]
    fn a_changed_value_updates_its_resource_and_marks_readers_known_after_apply() {
        let (p, changed) =
            plan_after_edit("definitions/base-env.yaml", "pgport: 5432", "pgport: 6432");
        // Every resource reads base-env, directly or not: whether each changes is known after
        // apply, when base-env's new outputs are.
        assert_eq!(changed[0], ("base-env#base-env".to_owned(), Action::Update));
        assert_eq!(changed.len(), 6);
        assert!(
            changed[1..].iter().all(|(_, a)| *a == Action::MaybeUpdate),
            "{changed:?}"
        );
        assert_eq!(p.count(Action::Create) + p.count(Action::Delete), 0);
    }

    #[test]
    fn secrets_stay_out_of_the_digest_yet_a_rotated_one_updates() {
        let g = graph(&template_files());
        let (mut recorded, edges) = applied(&g);
        let db = recorded
            .iter()
            .position(|r| r.res_id == "modules.backend.externals.db")
            .unwrap();
        let node = g.get(recorded[db].guresid.as_str()).unwrap();
        let mut outputs: HashMap<GuresId, (Value, Value, String)> = HashMap::new();
        for r in &recorded {
            outputs.insert(
                GuresId::from_recorded(r.guresid.clone()),
                (
                    r.outputs.clone(),
                    r.secret_outputs.clone(),
                    r.res_id.clone(),
                ),
            );
        }
        let inputs = resolve_inputs(node, &outputs).unwrap();
        let mut rotated = inputs.clone();
        rotated.secrets["password"] = serde_json::json!("rotated-password");
        assert_ne!(inputs.secrets, rotated.secrets);
        assert_eq!(inputs_hash(node, &inputs), inputs_hash(node, &rotated));

        // What was last sent is in resource_secret: a different secret there means update.
        recorded[db].secret_inputs = serde_json::json!({"secrets": rotated.secrets}).into();
        let p = plan(&g, &recorded, &edges);
        let step = p
            .steps
            .iter()
            .find(|s| s.res_id == "modules.backend.externals.db")
            .unwrap();
        assert_eq!(step.action, Action::Update);
        assert_eq!(step.changes, ["secrets.password: changed (secret)"]);
    }

    /// The digest and the recorded text are those of a sorted JSON map, byte for byte, as
    /// earlier versions wrote them: a change here would update every resource ever recorded.
    #[test]
    fn inputs_are_hashed_and_recorded_as_sorted_json_maps() {
        use sha2::Digest as _;
        let g = graph(&template_files());
        let node = g.nodes().find(|n| n.res_type == "postgres").unwrap();
        for resource_is_secret in [false, true] {
            let inputs = ResolvedInputs {
                resource: serde_json::json!({"z": [1, {"b": "\u{e9}\"", "a": null}], "a": 1.5}),
                resource_is_secret,
                values: serde_json::json!({"port": 5432, "host": "db"}),
                secrets: serde_json::json!({"password": "p"}),
                resource_secrets: Vec::new(),
            };
            let (public, secret) = if resource_is_secret {
                (
                    serde_json::json!({"values": inputs.values}),
                    serde_json::json!({"resource": inputs.resource, "secrets": inputs.secrets}),
                )
            } else {
                (
                    serde_json::json!({"resource": inputs.resource, "values": inputs.values}),
                    serde_json::json!({"secrets": inputs.secrets}),
                )
            };
            let canonical = serde_json::json!({
                "definition": node.definition,
                "driver": node.driver_type,
                "account": node.driver_account,
                "inputs": public,
            });
            let expected = crate::graph::hex(&Sha256::digest(canonical.to_string().as_bytes()));
            assert_eq!(inputs_hash(node, &inputs), expected);
            let (p, s) = split_inputs(&inputs);
            assert_eq!(p.as_str(), public.to_string());
            assert_eq!(s.as_str(), secret.to_string());
        }
    }

    #[test]
    fn a_changed_literal_updates_only_its_resource() {
        let (_, changed) = plan_after_edit("definitions/redis.yaml", "port: 6379", "port: 6380");
        assert_eq!(
            changed[0],
            ("redis#shared.cache".to_owned(), Action::Update)
        );
        // Both workloads read the cache's port: they can only be decided after apply.
        assert!(
            changed[1..]
                .iter()
                .all(|(n, a)| n.starts_with("workload#") && *a == Action::MaybeUpdate)
        );
        assert_eq!(changed.len(), 3);
    }

    /// Finding: an image bump vanished from a plan when the same workload also read an output
    /// that may change: only "may update (known after apply)" was shown.
    #[test]
    fn a_known_change_is_listed_beside_what_is_known_after_apply() {
        let mut files = template_files();
        let (records, edges) = applied(&graph(&files));
        edit(
            &mut files,
            "definitions/redis.yaml",
            "port: 6379",
            "port: 6380",
        );
        edit(
            &mut files,
            "workloads/shop/backend.yaml",
            "backend:1.4.2",
            "backend:1.5.0",
        );
        let p = plan(&graph(&files), &records, &edges);
        let step = |res_id: &str| {
            p.steps
                .iter()
                .find(|s| s.res_type == "workload" && s.res_id == res_id)
                .unwrap_or_else(|| panic!("no workload {res_id}"))
        };
        let backend = step("modules.backend");
        assert_eq!(backend.action, Action::MaybeUpdate);
        assert_eq!(backend.changes.len(), 1, "{backend:?}");
        assert!(
            backend.changes[0].starts_with("resource.containers.api.image: "),
            "{backend:?}"
        );
        assert_eq!(
            backend.known_after_apply,
            [
                "resource.containers.api.variables.CACHE_URL <- shop/redis.default#shared.cache \
                 outputs.host",
                "resource.containers.api.variables.CACHE_URL <- shop/redis.default#shared.cache \
                 outputs.port"
            ],
        );
        assert_eq!(backend.reason, "inputs changed; more known after apply:");
        // The frontend reads the same port and changes nothing of its own: a maybe, no change.
        let frontend = step("modules.frontend");
        assert_eq!(frontend.action, Action::MaybeUpdate);
        assert_eq!(frontend.changes, Vec::<String>::new());
        assert_eq!(frontend.reason, "inputs known after apply:");
    }

    #[test]
    fn orphans_are_deleted_dependents_first() {
        let mut files = template_files();
        let (records, edges) = applied(&graph(&files));
        files.remove("workloads/shop/frontend.yaml");
        let p = plan(&graph(&files), &records, &edges);
        let deletes: Vec<String> = p
            .steps
            .iter()
            .filter(|s| s.action == Action::Delete)
            .map(|s| format!("{}#{}", s.res_type, s.res_id))
            .collect();
        assert_eq!(
            deletes,
            [
                "workload#modules.frontend",
                "dns#modules.frontend.externals.dns"
            ]
        );
        assert!(
            p.steps
                .iter()
                .rev()
                .take(2)
                .all(|s| s.action == Action::Delete),
            "deletions come last"
        );
    }

    #[test]
    fn a_secret_read_under_values_is_refused() {
        let mut files = template_files();
        edit(
            &mut files,
            "definitions/dns.yaml",
            "host: ${context.app.id}",
            "pw: ${resources.base-env#base-env.outputs.pgpassword}\n      host: ${context.app.id}",
        );
        let g = graph(&files);
        let (records, _) = applied(&graph(&template_files()));
        let upstream: HashMap<GuresId, (Value, Value, String)> = records
            .iter()
            .map(|r| {
                (
                    GuresId::from_recorded(r.guresid.clone()),
                    (
                        r.outputs.clone(),
                        r.secret_outputs.clone(),
                        r.res_type.clone(),
                    ),
                )
            })
            .collect();
        let dns = g.nodes().find(|n| n.res_type == "dns").unwrap();
        let err = resolve_inputs(dns, &upstream).unwrap_err();
        assert_eq!(
            err,
            ResolveError::SecretInValues {
                target: "base-env".into(),
                path: "pgpassword".into()
            }
        );
    }
}
