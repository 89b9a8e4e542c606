//! The resource graph of one environment: resources as nodes, dependencies as edges, a DAG.
//!
//! Edges point from a resource to the resource it depends on (consumer to provider), so in
//! daggy's terms a node's children are what it needs and its parents are its dependents.
//! [`build`] is a pure function of the loaded repository.

mod build;
mod choose;
mod guresid;
mod matching;
mod render;

use std::collections::HashMap;
use std::fmt;

use daggy::petgraph::visit::EdgeRef;
use daggy::{Dag, NodeIndex};
use serde_json::Value;

use crate::model::placeholder::{Segment, SelectorDirection, StoreRef};
use crate::model::template::Template;
use crate::model::{Property, SourceLocation};

pub use crate::model::placeholder::Read;
pub use build::{BuildError, build, build_apps};
pub use choose::{candidates as choice_candidates, choose};
pub use guresid::{GuresId, hex};
pub use matching::{
    Candidate, MatchContext, Mismatch, NoMatch, Verdict, explain_match, match_definition,
};
pub use render::{to_dot, to_mermaid};

/// Why an edge exists. The order is the precedence when two reasons join the same pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EdgeKind {
    /// Reserved for edges the environment itself implies.
    Implicit,
    /// A workload needs one of its Score resources.
    Dependency,
    /// `is_dependent` or `match_dependents` of a co-provisioned resource.
    Coprovision,
    /// A `${resources...>TYPE}` or `<TYPE` selector.
    Selector,
    /// A placeholder reads an output of the other resource.
    Reference,
}

impl EdgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::Implicit => "implicit",
            EdgeKind::Dependency => "dependency",
            EdgeKind::Coprovision => "coprovision",
            EdgeKind::Selector => "selector",
            EdgeKind::Reference => "reference",
        }
    }
}

impl fmt::Display for EdgeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placeholder after graph building: which resources' outputs it reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Binding {
    /// `${resources.DESC.outputs.PATH}` (or `.values`, `.secrets`, `.guresid`) in a definition,
    /// `${resources.NAME...}` in a Score file: what one resource provides.
    Output {
        target: GuresId,
        /// Which part of the resource: any output, its non-secret or its secret outputs, or its
        /// GUResID.
        read: Read,
        /// Starts with the output name; empty for a whole part (`.values`) and for `.guresid`.
        path: Vec<Segment>,
        /// Older Score's `properties` entry for the output read: its default and secrecy.
        property: Option<Box<Property>>,
    },
    /// `${resources.DESC>TYPE.outputs.PATH}` or `<TYPE`, or a chain of such steps: the output
    /// of every resource the last step selected, as an array ordered by res_id, then class,
    /// then GUResID.
    Selector {
        /// The descriptor as written, such as `workload>aws-policy`.
        written: String,
        /// The resource DESC names.
        base: GuresId,
        /// Each step's direction and resource type, applied to the set the step before selected
        /// (at first, the base alone). Never empty.
        steps: Vec<(SelectorDirection, String)>,
        path: Vec<Segment>,
        /// Filled in once every node and non-selector edge exists.
        targets: Vec<GuresId>,
    },
    /// `secret_refs: {store, ref}`: no resource provides it; the host's secret store does.
    /// `value` stays empty until [`ResourceGraph::fill_stored_secrets`] reads the stores, which
    /// planning and applying do and validating does not.
    Stored {
        secret: StoreRef,
        /// Where the definition names it, for errors.
        location: SourceLocation,
        value: Option<StoredValue>,
    },
}

/// A value read from a secret store. It never prints: `Debug` shows `***`.
#[derive(Clone, PartialEq)]
pub struct StoredValue(pub Value);

impl fmt::Debug for StoredValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// One name a workload reads through an interface: `${resources.RESOURCE.NAME}` is served by
/// the provider's output OUTPUT, which carries `$id` ID.
#[derive(Debug, Clone, PartialEq)]
pub struct InterfaceUse {
    pub resource: String,
    pub name: String,
    pub id: String,
    pub provider: GuresId,
    pub output: String,
    /// Whether an existing resource was reused (GetOrCreate's "get").
    pub reused: bool,
}

impl Binding {
    /// The resource a binding names (a selector's base) and the path a `binding` row records:
    /// `outputs.pghost`, or `workload>aws-policy.outputs.name` for a selector; `None` for a
    /// stored secret, which no resource provides.
    pub fn provided(&self) -> Option<(&GuresId, String)> {
        Some(match self {
            Binding::Stored { .. } => return None,
            Binding::Output {
                target, read, path, ..
            } => (target, read_path(*read, path)),
            Binding::Selector {
                written,
                base,
                path,
                ..
            } => (
                base,
                format!(
                    "{written}.outputs.{}",
                    crate::model::placeholder::path_to_string(path)
                ),
            ),
        })
    }
}

/// `outputs.pghost`, `values`, `secrets.password`, `guresid`: what a binding reads of its
/// resource, as a `binding` row records it.
pub fn read_path(read: Read, path: &[Segment]) -> String {
    if path.is_empty() {
        read.as_str().to_owned()
    } else {
        format!(
            "{}.{}",
            read.as_str(),
            crate::model::placeholder::path_to_string(path)
        )
    }
}

/// Why a resource is in the graph.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    Workload {
        file: String,
    },
    /// A Score resource dependency of a workload.
    Requested {
        workload: String,
        name: String,
        location: SourceLocation,
    },
    Implicit,
    Referenced {
        by: GuresId,
        definition: String,
    },
    Coprovisioned {
        by: GuresId,
        definition: String,
    },
}

/// One resource to provision.
#[derive(Debug, Clone)]
pub struct ResourceNode {
    pub guresid: GuresId,
    /// `None` for resources shared by every app of the environment.
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub definition: String,
    pub driver_type: String,
    pub driver_account: Option<String>,
    pub deletion_policy: crate::records::DeletionPolicy,
    /// `false`: keeps the values it was last bound to until `gitplane resolve`.
    pub auto_update: bool,
    /// Digest of what the definition and the request say, before any placeholder resolves: a
    /// change of it updates even a pinned resource.
    pub template_hash: String,
    /// For a workload: the resources it requested by interface, and which output of which
    /// resource serves each name it reads.
    pub interfaces: Vec<InterfaceUse>,
    /// The resource's own inputs (`resource` in a driver request): Score params, or for a
    /// workload its whole Score file.
    pub params: Template<Binding>,
    pub values: Template<Binding>,
    pub secrets: Template<Binding>,
    /// Boxed: read only to explain a resource.
    pub origin: Box<Origin>,
}

impl ResourceNode {
    /// `app/type.class#res_id`, how people name a resource.
    pub fn label(&self) -> String {
        label(
            self.app.as_deref(),
            &self.res_type,
            &self.class,
            &self.res_id,
        )
    }

    /// Whether its secrets read a secret store, whose values may change with no commit.
    pub fn reads_secret_store(&self) -> bool {
        self.secrets
            .placeholders("")
            .iter()
            .any(|p| matches!(p.expr, Binding::Stored { .. }))
    }

    /// Whether it reads a `<` selector: the resources that depend on another, which any app
    /// may add to.
    pub fn selects_dependents(&self) -> bool {
        [&self.values, &self.secrets].iter().any(|t| {
            t.placeholders("").iter().any(|p| {
                matches!(&p.expr, Binding::Selector { steps, .. }
                    if steps.iter().any(|(d, _)| *d == SelectorDirection::Dependents))
            })
        })
    }
}

/// `app/type.class#res_id` (`-` for no app), how people name a resource everywhere.
pub fn label(app: Option<&str>, res_type: &str, class: &str, res_id: &str) -> String {
    format!("{}/{res_type}.{class}#{res_id}", app.unwrap_or("-"))
}

/// The DAG of one environment at one commit.
#[derive(Debug, Clone)]
pub struct ResourceGraph {
    pub env: String,
    pub env_type: String,
    /// What `${context.org.id}` reads (`org` in `gitplane.yaml`); drivers see it too.
    pub org: String,
    /// The environment's deletion guard: the percent of its resources a commit may delete.
    pub deletion_threshold: f64,
    /// The environment's drift schedule.
    pub schedule: Option<crate::model::Schedule>,
    /// What its drift runs do: correct or only detect.
    pub drift: crate::model::DriftMode,
    /// The commit has no file for the environment ([`ResourceGraph::removed`]): every
    /// resource recorded for it goes.
    pub env_removed: bool,
    dag: Dag<ResourceNode, EdgeKind>,
    index: HashMap<GuresId, NodeIndex>,
    /// Provisioning order: each node after everything it depends on. The one topological order
    /// of the graph (petgraph's), which plan and reconciler both follow.
    order: Vec<NodeIndex>,
}

/// An edge by GUResID: `from` depends on `to`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Edge {
    pub from: GuresId,
    pub to: GuresId,
    pub kind: EdgeKind,
}

impl ResourceGraph {
    /// The graph of an environment whose file the commit no longer has: nothing, so every
    /// resource recorded for it is an orphan (and the deletion guard holds their deletion).
    pub fn removed(env: &str) -> ResourceGraph {
        ResourceGraph {
            env: env.to_owned(),
            env_type: String::new(),
            org: crate::model::DEFAULT_ORG.to_owned(),
            deletion_threshold: 0.0,
            schedule: None,
            drift: Default::default(),
            env_removed: true,
            dag: Dag::new(),
            index: HashMap::new(),
            order: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.dag.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.dag.node_count() == 0
    }

    pub fn nodes(&self) -> impl Iterator<Item = &ResourceNode> {
        self.dag.raw_nodes().iter().map(|n| &n.weight)
    }

    /// The node of `id`: a [`GuresId`], or the text of one read back from state.
    pub fn get<Q>(&self, id: &Q) -> Option<&ResourceNode>
    where
        GuresId: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.index.get(id).map(|&i| &self.dag[i])
    }

    /// Whether the graph has `id` (a [`GuresId`], or the text of one).
    pub fn contains<Q>(&self, id: &Q) -> bool
    where
        GuresId: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.index.contains_key(id)
    }

    /// Every edge, sorted for stable output.
    pub fn edges(&self) -> Vec<Edge> {
        let mut edges: Vec<Edge> = self
            .dag
            .graph()
            .edge_references()
            .map(|e| Edge {
                from: self.dag[e.source()].guresid.clone(),
                to: self.dag[e.target()].guresid.clone(),
                kind: *e.weight(),
            })
            .collect();
        edges.sort();
        edges
    }

    /// Every edge as `(from, to, kind)`, in the graph's own order (unsorted, allocation-free).
    pub fn edge_iter(&self) -> impl Iterator<Item = (&GuresId, &GuresId, EdgeKind)> {
        self.dag.graph().edge_references().map(|e| {
            (
                &self.dag[e.source()].guresid,
                &self.dag[e.target()].guresid,
                *e.weight(),
            )
        })
    }

    /// What `id` depends on directly, with why.
    pub fn edges_from(&self, id: &GuresId) -> Vec<(&GuresId, EdgeKind)> {
        let Some(&i) = self.index.get(id) else {
            return Vec::new();
        };
        self.dag
            .graph()
            .edges(i)
            .map(|e| (&self.dag[e.target()].guresid, *e.weight()))
            .collect()
    }

    /// What depends on `id` directly.
    pub fn dependents(&self, id: &GuresId) -> Vec<&GuresId> {
        let Some(&i) = self.index.get(id) else {
            return Vec::new();
        };
        self.dag
            .graph()
            .neighbors_directed(i, daggy::petgraph::Direction::Incoming)
            .map(|n| &self.dag[n].guresid)
            .collect()
    }

    /// What `id` depends on directly.
    pub fn dependencies(&self, id: &GuresId) -> Vec<&GuresId> {
        let Some(&i) = self.index.get(id) else {
            return Vec::new();
        };
        self.dag
            .graph()
            .neighbors(i)
            .map(|n| &self.dag[n].guresid)
            .collect()
    }

    /// Every secret-store reference in the graph, each once, with where the first definition
    /// (in GUResID order) that reads it names it.
    pub fn stored_secrets(&self) -> Vec<(&StoreRef, &SourceLocation)> {
        let mut seen: std::collections::BTreeMap<&StoreRef, (&GuresId, &SourceLocation)> =
            std::collections::BTreeMap::new();
        for node in self.nodes() {
            if matches!(node.secrets, Template::Value(_)) {
                continue;
            }
            for placed in node.secrets.placeholders("secrets") {
                if let Binding::Stored {
                    secret, location, ..
                } = placed.expr
                {
                    let first = seen.entry(secret).or_insert((&node.guresid, location));
                    if node.guresid < *first.0 {
                        *first = (&node.guresid, location);
                    }
                }
            }
        }
        seen.into_iter().map(|(s, (_, l))| (s, l)).collect()
    }

    /// Puts each stored secret's value where it is read; one missing from `values` stays
    /// unread, and resolving it is an error.
    pub fn fill_stored_secrets(&mut self, values: &HashMap<StoreRef, Value>) {
        if values.is_empty() {
            return;
        }
        for n in self.dag.graph().node_indices().collect::<Vec<_>>() {
            self.dag[n]
                .secrets
                .for_each_expr_mut(&mut |b: &mut Binding| {
                    if let Binding::Stored { secret, value, .. } = b {
                        *value = values.get(secret).cloned().map(StoredValue);
                    }
                });
        }
    }

    /// Resources in provisioning order: each after everything it depends on. The order is a
    /// function of the graph alone (the builder adds nodes and edges in a fixed order), so runs
    /// are reproducible.
    pub fn provisioning_order(&self) -> impl ExactSizeIterator<Item = &ResourceNode> {
        self.order.iter().map(|&n| &self.dag[n])
    }

    /// Makes a graph of a DAG, computing its provisioning order once.
    fn new(
        env: &crate::model::Environment,
        org: &str,
        dag: Dag<ResourceNode, EdgeKind>,
        index: HashMap<GuresId, NodeIndex>,
    ) -> ResourceGraph {
        // Edges point from consumer to provider, so a topological order lists consumers
        // first; provisioning is its reverse. A daggy DAG has no cycle, so this cannot fail.
        let mut order = daggy::petgraph::algo::toposort(dag.graph(), None)
            .unwrap_or_else(|_| dag.graph().node_indices().collect());
        order.reverse();
        ResourceGraph {
            env: env.id.clone(),
            env_type: env.env_type.clone(),
            org: org.to_owned(),
            deletion_threshold: env.deletion_threshold,
            schedule: env.schedule.clone(),
            drift: env.drift,
            env_removed: false,
            dag,
            index,
            order,
        }
    }
}

/// The JSON of `gitplane graph --format json` (docs/repository.md, section 6).
pub fn to_json(graph: &ResourceGraph, commit: &str) -> Value {
    let mut nodes: Vec<&ResourceNode> = graph.nodes().collect();
    nodes.sort_by(|a, b| a.guresid.cmp(&b.guresid));
    serde_json::json!({
        "env": graph.env,
        "commit": commit,
        "nodes": nodes.iter().map(|n| serde_json::json!({
            "guresid": n.guresid.as_str(),
            "app": n.app,
            "type": n.res_type,
            "class": n.class,
            "id": n.res_id,
            "definition": n.definition,
            "driver": n.driver_type,
        })).collect::<Vec<_>>(),
        "edges": graph.edges().iter().map(|e| serde_json::json!({
            "from": e.from.as_str(),
            "to": e.to.as_str(),
            "kind": e.kind.as_str(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod seed_000;
#[cfg(test)]
pub(crate) mod tests;
