//! What the drivers can tell about a graph before any call: a definition's inputs in a shape
//! its driver does not take, and a read of an output its driver does not give.
//!
//! Both are found by `validate`, the pre-receive hook and every plan, with the file and line,
//! instead of half-way through an apply. A driver that cannot tell without a call (an HTTP
//! driver, Terraform code from a module source) is not second-guessed.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;

use gitplane_core::graph::{Binding, GuresId, Origin, ResourceGraph, ResourceNode};
use gitplane_core::model::placeholder::{Expr, Read, Segment};
use gitplane_core::model::template::{Resolved, Template};
use gitplane_core::model::{Definition, Repository, SourceLocation, line_of};
use rayon::prelude::*;
use serde_json::Value;

use crate::drivers::Registry;

/// The outputs each definition's driver says it gives (`None`: only a call can tell).
type KnownOutputs<'g> = HashMap<&'g str, Option<BTreeSet<String>>>;

/// Every problem the drivers find in `graph`, as `file:line: ...` messages.
pub fn problems(repo: &Repository, graph: &ResourceGraph, drivers: &Registry) -> Vec<String> {
    let definitions: HashMap<&str, &Definition> = repo
        .definitions
        .iter()
        .map(|d| (d.id.as_str(), d))
        .collect();
    let mut errors = Vec::new();
    let mut known: KnownOutputs<'_> = HashMap::new();
    for node in graph.nodes() {
        if known.contains_key(node.definition.as_str()) {
            continue;
        }
        let gives = match (
            definitions.get(node.definition.as_str()),
            drivers.get(&node.driver_type),
        ) {
            (Some(def), Some(registered)) => {
                let (values, secrets) = (shape(&def.values), shape(&def.secrets));
                for p in registered.driver.check_inputs(&values, &secrets) {
                    errors.push(format!(
                        "{}: definition '{}' (driver_type {}): {}",
                        locate_input(def, &p.path),
                        def.id,
                        node.driver_type,
                        p.reason
                    ));
                }
                registered.driver.known_outputs(&values, &secrets)
            }
            // A user-provided resource, or a driver the host lacks (reported on its own).
            _ => None,
        };
        known.insert(node.definition.as_str(), gives);
    }
    // Every placeholder of every node is looked at: at tens of thousands of resources, that
    // is spread over the cores (the errors are sorted after, so their order is the same).
    let nodes: Vec<&ResourceNode> = graph.nodes().collect();
    errors.par_extend(
        nodes
            .par_iter()
            .flat_map_iter(|node| unknown_reads(repo, graph, &known, node)),
    );
    errors.sort();
    errors.dedup();
    errors
}

/// What `node`'s placeholders read of outputs their targets' drivers say they do not give.
fn unknown_reads(
    repo: &Repository,
    graph: &ResourceGraph,
    known: &KnownOutputs<'_>,
    node: &ResourceNode,
) -> Vec<String> {
    let mut errors = Vec::new();
    // A workload's `params` are its Score file; `values` and `secrets` its definition's.
    for (template, in_score) in [
        (&node.values, false),
        (&node.secrets, false),
        (&node.params, true),
    ] {
        for placed in template.placeholders("") {
            let (targets, read, path, has_default): (&[GuresId], Read, &[Segment], bool) =
                match placed.expr {
                    Binding::Output {
                        target,
                        read,
                        path,
                        property,
                    } => (
                        std::slice::from_ref(target),
                        *read,
                        path,
                        property.as_ref().is_some_and(|p| p.default.is_some()),
                    ),
                    Binding::Selector { targets, path, .. } => {
                        (targets, Read::Outputs, path, false)
                    }
                    Binding::Stored { .. } => continue,
                };
            // `.values`, `.secrets` whole, `.guresid`, and older Score's defaults read
            // nothing a driver must give.
            let (Read::Outputs | Read::Values | Read::Secrets, Some(Segment::Key(name))) =
                (read, path.first())
            else {
                continue;
            };
            if has_default {
                continue;
            }
            for target in targets {
                if let Some(gives) = unknown_output(graph, known, target, name) {
                    errors.push(format!(
                        "{}: {} reads output '{name}' of {}",
                        locate_read(repo, node, name, in_score),
                        node.label(),
                        gives
                    ));
                }
            }
        }
    }
    errors
}

/// When `target`'s driver says it gives no output `name`: the target and what it gives.
fn unknown_output(
    graph: &ResourceGraph,
    known: &KnownOutputs<'_>,
    target: &GuresId,
    name: &str,
) -> Option<String> {
    let target = graph.get(target)?;
    let gives = known.get(target.definition.as_str())?.as_ref()?;
    if gives.contains(name) {
        return None;
    }
    let gives = if gives.is_empty() {
        "none".to_owned()
    } else {
        gives.iter().cloned().collect::<Vec<_>>().join(", ")
    };
    Some(format!(
        "{}, which its definition '{}' (driver_type {}) does not give; it gives: {gives}",
        target.label(),
        target.definition,
        target.driver_type,
    ))
}

/// A definition's inputs with every placeholder left as text: the shape a driver checks.
fn shape(template: &Template<Expr>) -> Value {
    let Ok(resolved) = template.resolve(&mut |_: &Expr| {
        Ok::<_, Infallible>(Resolved {
            value: Value::String("${...}".to_owned()),
            secret: false,
        })
    });
    resolved.value
}

/// Where an input (`values.templates.outputs`) is written: the line of its last key.
fn locate_input(def: &Definition, path: &str) -> SourceLocation {
    let key = path.rsplit('.').next().unwrap_or(path);
    def.locate(&format!("{key}:"))
}

/// Where `node` reads output `name`: in its Score file (`in_score`), else in its definition.
fn locate_read(
    repo: &Repository,
    node: &ResourceNode,
    name: &str,
    in_score: bool,
) -> SourceLocation {
    let needles = [
        format!("outputs.{name}}}"),
        format!(".{name}}}"),
        format!("outputs.{name}"),
        format!(".{name}"),
    ];
    let find = |source: &str| needles.iter().find_map(|n| line_of(source, n));
    if let (true, Origin::Workload { file }) = (in_score, &*node.origin) {
        let workload = node
            .app
            .as_deref()
            .and_then(|app| repo.apps.get(app))
            .and_then(|app| app.workloads.values().find(|w| w.file == *file));
        if let Some(line) = workload.and_then(|w| find(&w.source)) {
            return SourceLocation::at(file, line);
        }
    }
    match repo.definitions.iter().find(|d| d.id == node.definition) {
        Some(def) => match find(&def.source) {
            Some(line) => SourceLocation::at(&def.location.file, line + def.line_offset),
            None => def.location.clone(),
        },
        None => SourceLocation::file("definitions/"),
    }
}
