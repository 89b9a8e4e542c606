//! The reconciler: runs a plan through the drivers and records every step in state.
//!
//! Resources are provisioned each after everything it depends on; a resource whose upstream
//! failed is skipped and recorded as blocked; deletions run last, in reverse dependency order,
//! and only when every create and update succeeded. Every driver call is journalled before it
//! starts and after it ends.

use std::collections::{HashMap, HashSet};

use gitplane_state::{
    Counts, DeploymentStatus, OperationStart, ResourceRecord, ResourceStatus, StateError, Store,
};
use serde_json::Value;

use crate::drivers::{DeleteRequest, PutRequest, Registry};
use crate::graph::{GuresId, ResourceGraph, ResourceNode};
use crate::plan::{Action, Plan, Step, edge_records, inputs_hash, plan, resolve_inputs};

/// What happened to one resource, for progress output.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    pub label: String,
    pub action: Action,
    pub outcome: Outcome<'a>,
}

#[derive(Debug, Clone)]
pub enum Outcome<'a> {
    Done,
    Failed(&'a str),
    Skipped(&'a str),
}

/// How an apply of one environment ended.
#[derive(Debug, Clone)]
pub struct ApplyReport {
    pub env: String,
    pub deployment: i64,
    pub status: DeploymentStatus,
    pub counts: Counts,
    /// `label: error` for every failed or skipped resource.
    pub failures: Vec<String>,
}

/// Applies `graph` (built from `commit`) to its environment.
pub fn apply(
    store: &mut Store,
    drivers: &Registry,
    graph: &ResourceGraph,
    commit: &str,
    on_event: &mut dyn FnMut(&Event<'_>),
) -> Result<ApplyReport, StateError> {
    let recorded = store.resources(&graph.env)?;
    let recorded_edges = store.edges(&graph.env)?;
    let plan = plan(graph, &recorded, &recorded_edges);
    let deployment = store.begin_deployment(&graph.env, commit)?;
    let mut run = Run {
        store,
        drivers,
        graph,
        commit,
        deployment,
        on_event,
        recorded: recorded.iter().map(|r| (r.guresid.clone(), r)).collect(),
        outputs: HashMap::new(),
        broken: HashSet::new(),
        deleted: HashSet::new(),
        counts: Counts::default(),
        failures: Vec::new(),
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
    run.execute(&plan)?;

    // Orphans not deleted in this run stay recorded, and so do their edges.
    let remaining: HashSet<&str> = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::Delete && !run.deleted.contains(&s.guresid))
        .map(|s| s.guresid.as_str())
        .collect();
    let mut edges = edge_records(graph);
    // Orphans not deleted yet keep their edges, so a later apply deletes them in order.
    edges.extend(
        recorded_edges
            .into_iter()
            .filter(|e| remaining.contains(e.from.as_str()) || remaining.contains(e.to.as_str())),
    );
    edges.sort();
    edges.dedup_by(|a, b| a.from == b.from && a.to == b.to);
    let Run {
        store,
        counts,
        failures,
        ..
    } = run;
    store.replace_edges(&graph.env, &edges)?;
    let status = if counts.failed == 0 {
        DeploymentStatus::Succeeded
    } else {
        DeploymentStatus::Failed
    };
    let error = (!failures.is_empty()).then(|| failures.join("\n"));
    store.finish_deployment(deployment, status, &counts, error.as_deref())?;
    Ok(ApplyReport {
        env: graph.env.clone(),
        deployment,
        status,
        counts,
        failures,
    })
}

struct Run<'a, 'e> {
    store: &'a mut Store,
    drivers: &'a Registry,
    graph: &'a ResourceGraph,
    commit: &'a str,
    deployment: i64,
    on_event: &'e mut dyn FnMut(&Event<'_>),
    recorded: HashMap<String, &'a ResourceRecord>,
    /// Outputs and secret outputs of every ready resource, as provisioned so far.
    outputs: HashMap<GuresId, (Value, Value, String)>,
    /// Resources that failed or were skipped: their dependents are blocked.
    broken: HashSet<GuresId>,
    /// Orphans deleted in this run.
    deleted: HashSet<GuresId>,
    counts: Counts,
    failures: Vec<String>,
}

impl Run<'_, '_> {
    fn execute(&mut self, plan: &Plan) -> Result<(), StateError> {
        for step in plan.steps.iter().filter(|s| s.action != Action::Delete) {
            let Some(node) = self.graph.get(&step.guresid) else {
                continue;
            };
            self.put(node, step)?;
        }
        let deletes: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| s.action == Action::Delete)
            .collect();
        if !deletes.is_empty() && !self.broken.is_empty() {
            let why = format!(
                "held back: {} resource(s) failed in this deployment, and deleting now could \
                 remove what they still need",
                self.broken.len()
            );
            for step in deletes {
                self.skip(step, "delete", &why)?;
            }
            return Ok(());
        }
        for step in deletes {
            self.delete(step)?;
        }
        Ok(())
    }

    fn put(&mut self, node: &ResourceNode, step: &Step) -> Result<(), StateError> {
        let label = node.label();
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
            let why = format!("blocked: {blocker} failed");
            self.broken.insert(node.guresid.clone());
            return self.skip(step, action, &why);
        }
        let inputs = match resolve_inputs(node, &self.outputs) {
            Ok(inputs) => inputs,
            Err(e) => {
                let error = format!("inputs do not resolve: {e}");
                let op = self.begin(step, action, &step.reason)?;
                return self.fail_before_driver(node, op, action, &error);
            }
        };
        let hash = inputs_hash(node, &inputs);
        if let Some(rec) = self.recorded.get(node.guresid.as_str())
            && rec.status == ResourceStatus::Ready
            && rec.inputs_hash == hash
            && rec.definition == node.definition
            && rec.driver == node.driver_type
        {
            self.counts.unchanged += 1;
            return Ok(());
        }
        let reason = match step.action {
            Action::MaybeUpdate => "inputs changed after upstream resources changed".to_owned(),
            Action::Unchanged => "inputs changed".to_owned(),
            _ => step.reason.clone(),
        };
        let op = self.begin(step, action, &reason)?;
        let Some(driver) = self.drivers.get(&node.driver_type) else {
            let error = format!("no driver '{}' is registered", node.driver_type);
            return self.fail_before_driver(node, op, action, &error);
        };
        let request = PutRequest {
            guresid: node.guresid.as_str(),
            env: &self.graph.env,
            app: node.app.as_deref(),
            res_type: &node.res_type,
            class: &node.class,
            res_id: &node.res_id,
            resource: &inputs.resource,
            values: &inputs.values,
            secrets: &inputs.secrets,
        };
        match driver.put(&request) {
            Ok(done) => {
                let record = self.record(
                    node,
                    ResourceStatus::Ready,
                    hash,
                    done.outputs.clone(),
                    done.secret_outputs.clone(),
                    None,
                );
                self.store.finish_put(op, self.deployment, &record)?;
                self.outputs.insert(
                    node.guresid.clone(),
                    (done.outputs, done.secret_outputs, label.clone()),
                );
                if action == "create" {
                    self.counts.created += 1;
                } else {
                    self.counts.updated += 1;
                }
                (self.on_event)(&Event {
                    label,
                    action: if action == "create" {
                        Action::Create
                    } else {
                        Action::Update
                    },
                    outcome: Outcome::Done,
                });
                Ok(())
            }
            Err(e) => self.fail_put(node, op, action, &e.message),
        }
    }

    fn fail_put(
        &mut self,
        node: &ResourceNode,
        op: i64,
        action: &str,
        error: &str,
    ) -> Result<(), StateError> {
        // A failed update keeps the outputs last provisioned: dependents may still use them.
        let (outputs, secrets, hash) = match self.recorded.get(node.guresid.as_str()) {
            Some(rec) => (
                rec.outputs.clone(),
                rec.secret_outputs.clone(),
                rec.inputs_hash.clone(),
            ),
            None => (empty(), empty(), String::new()),
        };
        let record = self.record(
            node,
            ResourceStatus::Failed,
            hash,
            outputs,
            secrets,
            Some(error.to_owned()),
        );
        self.store.finish_put(op, self.deployment, &record)?;
        self.failed(node.label(), &node.guresid, action, error);
        Ok(())
    }

    /// No driver was called, so the resource itself is as it was: only the operation fails.
    fn fail_before_driver(
        &mut self,
        node: &ResourceNode,
        op: i64,
        action: &str,
        error: &str,
    ) -> Result<(), StateError> {
        self.store.fail_operation(op, error)?;
        self.failed(node.label(), &node.guresid, action, error);
        Ok(())
    }

    fn failed(&mut self, label: String, guresid: &GuresId, action: &str, error: &str) {
        self.broken.insert(guresid.clone());
        self.counts.failed += 1;
        self.failures.push(format!("{label}: {error}"));
        (self.on_event)(&Event {
            label,
            action: action_of(action),
            outcome: Outcome::Failed(error),
        });
    }

    fn delete(&mut self, step: &Step) -> Result<(), StateError> {
        let Some(rec) = self.recorded.get(step.guresid.as_str()).copied() else {
            return Ok(());
        };
        let op = self.begin(step, "delete", &step.reason)?;
        let request = DeleteRequest {
            guresid: &rec.guresid,
            env: &rec.env,
            app: rec.app.as_deref(),
            res_type: &rec.res_type,
            class: &rec.class,
            res_id: &rec.res_id,
        };
        let result = match self.drivers.get(&rec.driver) {
            Some(driver) => driver.delete(&request).map_err(|e| e.message),
            None => Err(format!("no driver '{}' is registered", rec.driver)),
        };
        let label = step.label();
        match result {
            Ok(()) => {
                self.store.finish_delete(op, &rec.guresid, None)?;
                self.deleted.insert(step.guresid.clone());
                self.counts.deleted += 1;
                (self.on_event)(&Event {
                    label,
                    action: Action::Delete,
                    outcome: Outcome::Done,
                });
            }
            Err(error) => {
                self.store.finish_delete(op, &rec.guresid, Some(&error))?;
                self.failed(label, &step.guresid, "delete", &error);
            }
        }
        Ok(())
    }

    fn skip(&mut self, step: &Step, action: &str, why: &str) -> Result<(), StateError> {
        self.store
            .skipped_operation(&self.start(step, action, &step.reason), why)?;
        self.counts.failed += 1;
        self.failures.push(format!("{}: {why}", step.label()));
        (self.on_event)(&Event {
            label: step.label(),
            action: action_of(action),
            outcome: Outcome::Skipped(why),
        });
        Ok(())
    }

    fn begin(&mut self, step: &Step, action: &str, reason: &str) -> Result<i64, StateError> {
        self.store
            .begin_operation(&self.start(step, action, reason))
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

    fn record(
        &self,
        node: &ResourceNode,
        status: ResourceStatus,
        inputs_hash: String,
        outputs: Value,
        secret_outputs: Value,
        error: Option<String>,
    ) -> ResourceRecord {
        ResourceRecord {
            guresid: node.guresid.to_string(),
            env: self.graph.env.clone(),
            app: node.app.clone(),
            res_type: node.res_type.clone(),
            class: node.class.clone(),
            res_id: node.res_id.clone(),
            definition: node.definition.clone(),
            driver: node.driver_type.clone(),
            status,
            inputs_hash,
            outputs,
            secret_outputs,
            error,
            commit_id: self.commit.to_owned(),
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

/// `app/type.class#res_id` of a recorded resource.
pub fn record_label(rec: &ResourceRecord) -> String {
    crate::graph::label(rec.app.as_deref(), &rec.res_type, &rec.class, &rec.res_id)
}

fn empty() -> Value {
    Value::Object(Default::default())
}
