//! Explain a resource: why it is what it is (`gitplane explain`, the status page's resource view).
//!
//! Six parts, read from the state and from one commit's graph: the resource as recorded; the
//! definition it matched and why every other definition of its type lost; each input and the
//! chain of bindings it comes from, back to a literal in some file (or to a driver's output);
//! its outputs (secret ones by name only); its links both ways; and its operations, newest
//! first. Secret values never appear: not in the table, not in the JSON.

use gitplane_state::{BindingRecord, LinkRecord, ResourceOperation, ResourceRecord, Store};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::text::{Table, short};
use super::{AppError, Context};
use crate::deploy::Rejected;
use crate::graph::{
    self, Binding, GuresId, MatchContext, Origin, Read, ResourceGraph, ResourceNode, Verdict,
};
use crate::model::placeholder::{Part, Segment, StoreRef, path_to_string};
use crate::model::template::{Template, insert_as_text, lookup_path};
use crate::model::{Choice, Definition, Repository};

/// How many hops a binding chain is followed before it is cut short.
const MAX_DEPTH: usize = 16;

/// How an explanation is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Sections of aligned text, for people.
    Table,
    /// One JSON object, pretty-printed.
    Json,
}

/// An explanation, rendered, and what kept part of it from being read from the commit, for the
/// caller to report.
#[derive(Debug, Default)]
pub struct Explained {
    /// The explanation, newline-ended; `None` when the commit was needed and could not be read.
    pub text: Option<String>,
    /// The commit (its id) did not build: the explanation says so and shows the recorded state.
    pub rejected: Option<(String, Rejected)>,
    /// The commit's files did not load.
    pub load_errors: Vec<String>,
}

/// Explains `resource` (a GUResID or `app/type.class#id`): a recorded resource, or else one of
/// the commit's graph that the next apply would create.
pub fn explain(
    ctx: &Context,
    rev: Option<&str>,
    resource: &str,
    format: Format,
) -> Result<Explained, AppError> {
    let store = if ctx.state_exists() {
        let store = ctx.open_store()?;
        super::check_repository(ctx, &store)?;
        Some(store)
    } else {
        None
    };
    let recorded = match &store {
        Some(s) => match super::find_resource(s, ctx, resource) {
            Ok(found) => Some(found),
            Err(AppError::NoResource { .. }) => None,
            Err(e) => return Err(e),
        },
        None => None,
    };
    match (store, recorded) {
        (Some(store), Some(found)) => explain_recorded(ctx, rev, resource, (&store, found), format),
        (store, _) => explain_planned(ctx, rev, resource, store.as_ref(), format),
    }
}

/// A resource the state records, against the commit's graph when it is still in it.
fn explain_recorded(
    ctx: &Context,
    rev: Option<&str>,
    resource: &str,
    (store, (guresid, env)): (&Store, (String, String)),
    format: Format,
) -> Result<Explained, AppError> {
    let Some(found) = store
        .resources_by_guresid(std::slice::from_ref(&guresid), true)?
        .pop()
    else {
        return Err(AppError::NoResource {
            resource: resource.to_owned(),
        });
    };
    // Only its app and the global resources it reaches are read and built (all of them for a
    // global resource), and only their records: the cost is the app's, not the environment's.
    let apps = found.app.as_ref().map(|app| BTreeSet::from([app.clone()]));
    let bindings = store.current_bindings(&guresid)?;
    let links = match store.resource_links(&env, &guresid)? {
        Some((deployment, links)) => Links {
            deployment: Some(deployment),
            links,
        },
        // Its environment has no links recorded.
        None => Links {
            deployment: None,
            links: Vec::new(),
        },
    };
    let mut records: HashMap<String, ResourceRecord> = match &apps {
        Some(apps) => store.resources_of_apps(&env, apps, true)?,
        None => store.resources(&env)?,
    }
    .into_iter()
    .map(|r| (r.guresid.clone(), r))
    .collect();
    let others: Vec<String> = links
        .links
        .iter()
        .flat_map(|l| [&l.consumer, &l.provider])
        .chain(bindings.iter().map(|b| &b.provided))
        .filter(|g| !records.contains_key(g.as_str()))
        .cloned()
        .collect();
    if !others.is_empty() {
        records.extend(
            store
                .resources_by_guresid(&others, true)?
                .into_iter()
                .map(|r| (r.guresid.clone(), r)),
        );
    }
    records.insert(guresid.clone(), found);
    let rec = &records[&guresid];

    let mut commit = None;
    let mut explained = Explained::default();
    let mut loaded: Option<(Repository, ResourceGraph)> = None;
    let graph_note = match super::load_and_build_part(ctx, rev, &env, apps.as_ref()) {
        Ok((snapshot, Ok(mut built))) => {
            commit = Some(snapshot.commit.clone());
            let graph = built.graphs.pop();
            match (crate::model::load(&snapshot.files), graph) {
                (Ok(repo), Some(graph)) => {
                    let in_graph = graph.contains(guresid.as_str());
                    loaded = Some((repo, graph));
                    (!in_graph).then(|| {
                        format!(
                            "not in the graph of environment {env} at commit {}: it is an \
                             orphan, which the next apply {}",
                            short(&snapshot.commit),
                            match rec.deletion_policy {
                                gitplane_state::DeletionPolicy::Delete => "deletes",
                                gitplane_state::DeletionPolicy::Orphan => {
                                    "forgets (deletion_policy: orphan)"
                                }
                            }
                        )
                    })
                }
                _ => Some(format!(
                    "environment {env} has no graph at commit {}",
                    short(&snapshot.commit)
                )),
            }
        }
        Ok((snapshot, Err(rejected))) => {
            commit = Some(snapshot.commit.clone());
            let note = format!(
                "commit {} does not build ({} error(s), on stderr): only the recorded state is \
                 shown",
                short(&snapshot.commit),
                rejected.errors.len()
            );
            explained.rejected = Some((snapshot.commit.clone(), rejected));
            Some(note)
        }
        Err(AppError::UnknownEnv { commit: at, .. }) => Some(format!(
            "environment {env} is not in commit {at}: the resource is an orphan"
        )),
        Err(e) => return Err(e),
    };

    let operations = store.resource_operations(&guresid)?;

    let explainer = loaded.as_ref().and_then(|(repo, graph)| {
        let node = graph.get(guresid.as_str())?;
        Some(Explainer {
            repo,
            graph,
            records: &records,
            bindings: &bindings,
            node,
            rec,
        })
    });
    let (matching, inputs) = match &explainer {
        Some(x) => (Some(x.matching()), x.inputs()),
        None => (None, recorded_inputs(rec, &bindings, &records)),
    };
    let explanation = Explanation {
        rec,
        planned: false,
        records: &records,
        graph: loaded.as_ref().map(|(_, g)| g),
        commit,
        graph_note,
        matching,
        inputs,
        links,
        operations,
    };
    explained.text = Some(explanation.render(format));
    Ok(explained)
}

/// A resource of the commit's graph that nothing records yet: how it matched and where its
/// inputs will come from.
fn explain_planned(
    ctx: &Context,
    rev: Option<&str>,
    resource: &str,
    store: Option<&Store>,
    format: Format,
) -> Result<Explained, AppError> {
    let (snapshot, result) = super::load_and_build(ctx, rev, super::Need::Graphs)?;
    let built = match result {
        Ok(built) => built,
        Err(rejected) => {
            return Ok(Explained {
                rejected: Some((snapshot.commit.clone(), rejected)),
                ..Explained::default()
            });
        }
    };
    let found: Vec<&ResourceNode> = built
        .graphs
        .iter()
        .flat_map(|g| g.nodes())
        .filter(|n| n.guresid.as_str() == resource || n.label() == resource)
        .collect();
    let (graph, node) = match found.as_slice() {
        [node] => {
            let graph = built
                .graphs
                .iter()
                .find(|g| g.contains(&node.guresid))
                .ok_or_else(|| AppError::NoResource {
                    resource: resource.to_owned(),
                })?;
            (graph, *node)
        }
        [] => {
            return Err(AppError::UnknownResource {
                resource: resource.to_owned(),
                commit: short(&snapshot.commit).to_owned(),
            });
        }
        _ => {
            let mut envs: Vec<&str> = built
                .graphs
                .iter()
                .filter(|g| found.iter().any(|n| g.contains(&n.guresid)))
                .map(|g| g.env.as_str())
                .collect();
            envs.dedup();
            return Err(AppError::AmbiguousInGraph {
                resource: resource.to_owned(),
                envs: envs.join(", "),
            });
        }
    };
    let repo = match crate::model::load(&snapshot.files) {
        Ok(repo) => repo,
        Err(errors) => {
            return Ok(Explained {
                load_errors: errors.iter().map(ToString::to_string).collect(),
                ..Explained::default()
            });
        }
    };
    let records: HashMap<String, ResourceRecord> = match store {
        Some(s) => s
            .resources(&graph.env)?
            .into_iter()
            .map(|r| (r.guresid.clone(), r))
            .collect(),
        None => HashMap::new(),
    };
    let rec = crate::plan::record_of(node, &graph.env, &snapshot.commit);
    let explainer = Explainer {
        repo: &repo,
        graph,
        records: &records,
        bindings: &[],
        node,
        rec: &rec,
    };
    let links = Links {
        deployment: None,
        links: graph
            .edges()
            .into_iter()
            .filter(|e| e.from == node.guresid || e.to == node.guresid)
            .map(|e| LinkRecord {
                consumer: e.from.to_string(),
                provider: e.to.to_string(),
                kind: e.kind.as_str().to_owned(),
                update_type: "-".to_owned(),
            })
            .collect(),
    };
    let explanation = Explanation {
        rec: &rec,
        planned: true,
        records: &records,
        graph: Some(graph),
        commit: Some(snapshot.commit.clone()),
        graph_note: Some(format!(
            "not recorded yet: the next apply of commit {} creates it",
            short(&snapshot.commit)
        )),
        matching: Some(explainer.matching()),
        inputs: explainer.inputs(),
        links,
        operations: Vec::new(),
    };
    Ok(Explained {
        text: Some(explanation.render(format)),
        ..Explained::default()
    })
}

impl Explanation<'_> {
    fn render(&self, format: Format) -> String {
        match format {
            Format::Table => self.table(),
            Format::Json => {
                serde_json::to_string_pretty(&self.json())
                    .expect("a serde_json::Value always serialises")
                    + "\n"
            }
        }
    }
}

/// A value as it may be shown: never a secret's.
#[derive(Debug, Clone, PartialEq)]
enum Shown {
    Value(Value),
    Secret,
    Unknown,
}

impl Shown {
    fn text(&self) -> String {
        match self {
            Shown::Value(v) => v.to_string(),
            Shown::Secret => "(secret)".to_owned(),
            Shown::Unknown => "(not known)".to_owned(),
        }
    }

    /// `"value"` (absent when secret or not known) and `"secret"` for JSON.
    fn json_into(&self, obj: &mut serde_json::Map<String, Value>) {
        obj.insert("secret".into(), Value::Bool(*self == Shown::Secret));
        obj.insert(
            "value".into(),
            match self {
                Shown::Value(v) => v.clone(),
                _ => Value::Null,
            },
        );
    }
}

/// How a definition stood in the match.
struct CandidateView {
    definition: String,
    rule: Option<String>,
    location: String,
    matched: bool,
    chosen: bool,
    specificity: Vec<&'static str>,
    reason: String,
}

struct Matching {
    definition: String,
    driver: String,
    /// `app_id: shop, env_id: ...`: what the rules were compared against.
    context: String,
    context_json: Value,
    candidates: Vec<CandidateView>,
    /// How it was chosen: by criteria, a label selector, a class-ref, as the default.
    how: String,
}

/// One input of the resource: a leaf of its values, secrets or resource (Score params).
struct Input {
    path: String,
    value: Shown,
    /// Where it is written (`file:line`).
    at: Option<String>,
    /// For an input without placeholders: a note on it (context placeholders made it, or the
    /// commit has another value).
    literal: Option<Option<String>>,
    /// One chain per placeholder in it.
    sources: Vec<Trace>,
}

/// Where one placeholder's value comes from.
enum Trace {
    /// An output of another resource.
    Output {
        provider: String,
        label: String,
        output: String,
        value: Shown,
        then: Next,
    },
    /// `${resources.DESC>TYPE.outputs...}`: the output of every selected resource.
    Selector {
        written: String,
        output: String,
        value: Shown,
        targets: Vec<Trace>,
    },
    /// `secret_refs: {store, ref}`: read from a secret store on the host; always secret.
    Stored { secret: StoreRef, value: Shown },
}

/// What an output is, at the provider.
enum Next {
    /// Nothing more is known (the resource was explained from state alone).
    Nothing,
    /// An echo provider's output is its own input at the same path.
    Input {
        input: String,
        definition: String,
        /// A literal: its value (`None` when secret) and where it is written.
        literal: Option<(Option<Value>, Option<String>)>,
        secret: bool,
        sources: Vec<Trace>,
    },
    /// The provider's driver computes it.
    Driver { driver: String, definition: String },
    /// Why the chain stops here.
    Stop(String),
}

struct Links {
    deployment: Option<i64>,
    links: Vec<LinkRecord>,
}

/// What explaining needs from the commit: its definitions and the environment's graph.
struct Explainer<'a> {
    repo: &'a Repository,
    graph: &'a ResourceGraph,
    records: &'a HashMap<String, ResourceRecord>,
    bindings: &'a [BindingRecord],
    node: &'a ResourceNode,
    rec: &'a ResourceRecord,
}

/// A leaf of an input template.
enum Leaf<'a> {
    Literal(&'a Value),
    /// One whole placeholder (no parts), or a string made of text and placeholders (its parts).
    Placeholders(Vec<&'a Binding>, Option<&'a [Part<Binding>]>),
}

/// Collects the leaves of `t` with their paths (`values.a.b[0]`, as `Template::placeholders`
/// writes them) and the segments below the prefix.
fn leaves<'a>(
    t: &'a Template<Binding>,
    path: String,
    segments: Vec<Segment>,
    out: &mut Vec<(String, Vec<Segment>, Leaf<'a>)>,
) {
    let child = |path: &str, k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    let with = |segments: &[Segment], s: Segment| {
        let mut v = segments.to_vec();
        v.push(s);
        v
    };
    match t {
        Template::Value(Value::Null) if segments.is_empty() => {}
        Template::Value(v) => literal_leaves(v, path, segments, out),
        Template::Whole(b) => out.push((path, segments, Leaf::Placeholders(vec![b], None))),
        Template::Str(parts) => {
            let exprs = parts
                .iter()
                .filter_map(|p| match p {
                    Part::Expr(e) => Some(&**e),
                    Part::Text(_) => None,
                })
                .collect();
            out.push((path, segments, Leaf::Placeholders(exprs, Some(parts))));
        }
        Template::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                leaves(
                    item,
                    format!("{path}[{i}]"),
                    with(&segments, Segment::Index(i)),
                    out,
                );
            }
        }
        Template::Object(fields) => {
            for (k, item) in fields {
                leaves(
                    item,
                    child(&path, k),
                    with(&segments, Segment::Key(k.clone())),
                    out,
                );
            }
        }
    }
}

fn literal_leaves<'a>(
    v: &'a Value,
    path: String,
    segments: Vec<Segment>,
    out: &mut Vec<(String, Vec<Segment>, Leaf<'a>)>,
) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, item) in map {
                let mut s = segments.clone();
                s.push(Segment::Key(k.clone()));
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                literal_leaves(item, p, s, out);
            }
        }
        _ => out.push((path, segments, Leaf::Literal(v))),
    }
}

/// What the template holds at `path`.
enum Found<'a> {
    Literal(&'a Value),
    /// Placeholders, each with the part of `path` below it (reading into the value it gives).
    Placeholders(Vec<(&'a Binding, Vec<Segment>)>),
    Missing,
}

fn template_at<'a>(t: &'a Template<Binding>, path: &[Segment]) -> Found<'a> {
    match (t, path.split_first()) {
        (Template::Value(v), _) => lookup_path(v, path).map_or(Found::Missing, Found::Literal),
        (Template::Whole(b), _) => Found::Placeholders(vec![(b, path.to_vec())]),
        (Template::Str(parts), None) => Found::Placeholders(
            parts
                .iter()
                .filter_map(|p| match p {
                    Part::Expr(e) => Some((&**e, Vec::new())),
                    Part::Text(_) => None,
                })
                .collect(),
        ),
        (Template::Object(fields), Some((Segment::Key(k), rest))) => fields
            .iter()
            .find(|(name, _)| name == k)
            .map_or(Found::Missing, |(_, t)| template_at(t, rest)),
        (Template::Array(items), Some((Segment::Index(i), rest))) => items
            .get(*i)
            .map_or(Found::Missing, |t| template_at(t, rest)),
        (Template::Array(_) | Template::Object(_), None) => Found::Placeholders(
            t.placeholders("")
                .into_iter()
                .map(|p| (p.expr, Vec::new()))
                .collect(),
        ),
        _ => Found::Missing,
    }
}

/// The 1-based line (in `source`) of the key path `keys` in a YAML document, and the line's
/// text. Block style only: a key written in flow style (`{a: b}`) is not found.
fn locate_keys<'s>(source: &'s str, keys: &[&str]) -> Option<(usize, &'s str)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut start = 0;
    let mut parent: Option<usize> = None;
    let mut found = None;
    for key in keys {
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().skip(start) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("---") {
                continue;
            }
            let indent = line.len() - trimmed.len();
            if parent.is_some_and(|p| indent <= p) {
                break;
            }
            let item = trimmed.strip_prefix("- ").unwrap_or(trimmed);
            let quoted = [key.to_string(), format!("\"{key}\""), format!("'{key}'")];
            if quoted.iter().any(|q| {
                item.strip_prefix(q.as_str())
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            }) {
                hit = Some((i, indent + (trimmed.len() - item.len())));
                break;
            }
        }
        let (i, indent) = hit?;
        found = Some(i);
        start = i + 1;
        parent = Some(indent);
    }
    found.map(|i| (i + 1, lines[i]))
}

/// The keys of `segments` up to the first index.
fn keys_of(segments: &[Segment]) -> Vec<&str> {
    segments
        .iter()
        .map_while(|s| match s {
            Segment::Key(k) => Some(k.as_str()),
            Segment::Index(_) => None,
        })
        .collect()
}

/// `file:line` of `driver_inputs.<section>.<segments>` in a definition, and whether the line
/// holds context placeholders.
fn definition_location(def: &Definition, section: &str, segments: &[Segment]) -> (String, bool) {
    // A secret may be written under `secret_refs` as well as under `secrets`.
    let sections: &[&str] = if section == "secrets" {
        &["secrets", "secret_refs"]
    } else {
        &[section]
    };
    let paths: Vec<Vec<&str>> = sections
        .iter()
        .map(|section| {
            let mut keys = vec!["driver_inputs", *section];
            keys.extend(keys_of(segments));
            keys
        })
        .collect();
    // The deepest key that can be found, in whichever section has it.
    let deepest = paths.iter().map(Vec::len).max().unwrap_or(2);
    for n in (2..=deepest).rev() {
        for keys in paths.iter().filter(|k| k.len() >= n) {
            if let Some((line, text)) = locate_keys(&def.source, &keys[..n]) {
                return (
                    format!("{}:{}", def.location.file, line + def.line_offset),
                    text.contains("${context."),
                );
            }
        }
    }
    (def.locate(section).to_string(), false)
}

/// `file:line` of rule `index` of a definition's criteria.
fn rule_location(def: &Definition, index: Option<usize>) -> String {
    let fallback = || def.locate("criteria").to_string();
    let Some((criteria, _)) = locate_keys(&def.source, &["criteria"]) else {
        return fallback();
    };
    let Some(index) = index else {
        return fallback();
    };
    let lines: Vec<&str> = def.source.lines().collect();
    let criteria_indent = lines[criteria - 1].len() - lines[criteria - 1].trim_start().len();
    let mut item_indent = None;
    let mut seen = 0;
    for (i, line) in lines.iter().enumerate().skip(criteria) {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent < criteria_indent || (indent == criteria_indent && !trimmed.starts_with('-')) {
            break;
        }
        if !trimmed.starts_with('-') || item_indent.is_some_and(|w| w != indent) {
            continue;
        }
        item_indent = Some(indent);
        if seen == index {
            return format!("{}:{}", def.location.file, i + 1 + def.line_offset);
        }
        seen += 1;
    }
    fallback()
}

fn is_echo(driver: &str) -> bool {
    matches!(driver, "echo" | "humanitec/echo")
}

impl<'a> Explainer<'a> {
    fn definition(&self, id: &str) -> Option<&'a Definition> {
        self.repo.definitions.iter().find(|d| d.id == id)
    }

    fn label(&self, id: &GuresId) -> String {
        label_of(id.as_str(), Some(self.graph), self.records)
    }

    /// How the request asked to be served: a Score resource's annotations, else criteria.
    fn choice(&self) -> Choice {
        let node = self.node;
        if let (Origin::Requested { workload, name, .. }, Some(app)) = (&*node.origin, &node.app)
            && let Some(res) = self
                .repo
                .apps
                .get(app)
                .and_then(|a| a.workloads.get(workload))
                .and_then(|w| w.resources.get(name))
        {
            return res.choice.clone();
        }
        Choice::Criteria
    }

    fn matching(&self) -> Matching {
        let node = self.node;
        let ctx = MatchContext {
            app_id: node.app.as_deref(),
            env_id: &self.graph.env,
            env_type: &self.graph.env_type,
            res_type: &node.res_type,
            class: &node.class,
            res_id: &node.res_id,
        };
        let of_type: Vec<&Definition> = self
            .repo
            .definitions
            .iter()
            .filter(|d| d.res_type == node.res_type)
            .collect();
        let by_id: BTreeMap<&str, &Definition> = self
            .repo
            .definitions
            .iter()
            .map(|d| (d.id.as_str(), d))
            .collect();
        let choice = self.choice();
        let explained = graph::explain_match(&of_type, &ctx);
        let by_criteria = explained
            .first()
            .filter(|c| c.matched)
            .map(|c| c.definition.id.clone());
        let chosen_def = by_id.get(node.definition.as_str()).copied();
        // How the definition was chosen, in a sentence.
        let how = match &choice {
            Choice::Labels(selector) => format!(
                "chosen by the label selector {} (specificity of its criteria, then weight, then \
                 id)",
                selector
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Choice::Definition(id) => format!("named by class-ref {id}: no matching"),
            _ if node.definition.starts_with("provided/") => format!(
                "user-provided in environments/{}.yaml: registered with its outputs, never \
                 provisioned",
                self.graph.env
            ),
            _ if by_criteria.as_deref() == Some(node.definition.as_str()) => {
                "chosen by criteria: the most specific matching rule".to_owned()
            }
            _ if chosen_def.is_some_and(|d| d.default) => {
                "no rule matches: the type's default definition serves".to_owned()
            }
            _ => format!(
                "chosen outside criteria{}",
                by_criteria
                    .as_ref()
                    .map(|c| format!(" (by criteria alone it would be {c})"))
                    .unwrap_or_default()
            ),
        };
        // Label selectors and class-refs say for themselves why each definition lost.
        let chooser: Option<HashMap<String, String>> = match &choice {
            Choice::Labels(_) | Choice::Definition(_) => Some(
                graph::choice_candidates(&of_type, &by_id, &ctx, &choice)
                    .into_iter()
                    .map(|(id, _, why)| (id, why))
                    .collect(),
            ),
            _ => None,
        };
        let mut candidates: Vec<CandidateView> = explained
            .iter()
            .map(|c| {
                let chosen = c.definition.id == node.definition;
                let reason = match (&chooser, &c.verdict) {
                    (Some(why), _) => why.get(&c.definition.id).cloned().unwrap_or_default(),
                    (None, _) if chosen && !c.matched => {
                        "no rule matches: it is the type's default definition".to_owned()
                    }
                    (None, Verdict::Chosen { .. }) if !chosen => {
                        format!("matches best by criteria, but {} serves", node.definition)
                    }
                    (None, v) => v.to_string(),
                };
                CandidateView {
                    definition: c.definition.id.clone(),
                    rule: c.rule.map(ToString::to_string),
                    location: rule_location(c.definition, c.rule_index),
                    matched: c.matched,
                    chosen,
                    specificity: c.specificity.clone(),
                    reason,
                }
            })
            .collect();
        // The one chosen first; the rest keep the criteria order.
        candidates.sort_by_key(|c| !c.chosen);
        Matching {
            definition: node.definition.clone(),
            driver: node.driver_type.clone(),
            context: ctx.to_string(),
            context_json: json!({
                "app_id": node.app,
                "env_id": self.graph.env,
                "env_type": self.graph.env_type,
                "type": node.res_type,
                "res_id": node.res_id,
                "class": node.class,
            }),
            how,
            candidates,
        }
    }

    /// Every input of the node, in values, secrets, resource order.
    fn inputs(&self) -> Vec<Input> {
        let node = self.node;
        let mut out = Vec::new();
        for (template, prefix) in [
            (&node.values, "values"),
            (&node.secrets, "secrets"),
            (&node.params, "resource"),
        ] {
            let mut found = Vec::new();
            leaves(template, prefix.to_owned(), Vec::new(), &mut found);
            for (path, segments, leaf) in found {
                let secret = prefix == "secrets";
                match leaf {
                    Leaf::Literal(literal) => {
                        // A workload's resource input is its whole Score file: only its
                        // placeholders are worth listing.
                        if prefix == "resource" && node.res_type == "workload" {
                            continue;
                        }
                        let (location, context) = self.input_location(prefix, &segments);
                        let applied = self.applied(prefix, &segments);
                        let value = if secret {
                            Shown::Secret
                        } else {
                            applied.clone().unwrap_or(Shown::Value(literal.clone()))
                        };
                        let mut notes = Vec::new();
                        if context {
                            notes.push("from context placeholders".to_owned());
                        }
                        if !secret && applied.is_some_and(|a| a != Shown::Value(literal.clone())) {
                            notes.push(format!("{literal} in this commit: not applied yet"));
                        }
                        out.push(Input {
                            path,
                            value,
                            at: location,
                            literal: Some((!notes.is_empty()).then(|| notes.join("; "))),
                            sources: Vec::new(),
                        });
                    }
                    Leaf::Placeholders(bindings, parts) => {
                        let sources: Vec<Trace> = bindings
                            .iter()
                            .map(|b| self.trace_first(&path, b))
                            .collect();
                        let from_secret = sources.iter().any(|t| match t {
                            Trace::Output { value, .. }
                            | Trace::Selector { value, .. }
                            | Trace::Stored { value, .. } => *value == Shown::Secret,
                        });
                        let value = if secret || from_secret {
                            Shown::Secret
                        } else {
                            self.applied(prefix, &segments)
                                .unwrap_or_else(|| composed(parts, &sources))
                        };
                        out.push(Input {
                            path,
                            value,
                            at: self.input_location(prefix, &segments).0,
                            literal: None,
                            sources,
                        });
                    }
                }
            }
        }
        out
    }

    /// The value last sent to the driver at `prefix.segments` (non-secret inputs only).
    fn applied(&self, prefix: &str, segments: &[Segment]) -> Option<Shown> {
        if prefix == "secrets" {
            return None;
        }
        let inputs = self.rec.inputs.parse().ok()?;
        let section = inputs.get(prefix)?;
        lookup_path(section, segments).map(|v| Shown::Value(v.clone()))
    }

    /// Where an input of the node is written, and whether context placeholders made it.
    fn input_location(&self, prefix: &str, segments: &[Segment]) -> (Option<String>, bool) {
        let node = self.node;
        if prefix != "resource" {
            return match self.definition(&node.definition) {
                Some(def) => {
                    let (loc, context) = definition_location(def, prefix, segments);
                    (Some(loc), context)
                }
                None => (None, false),
            };
        }
        // Score params: under `resources.NAME.params` of the requesting workload file.
        if let Origin::Requested {
            workload,
            name,
            location,
        } = &*node.origin
        {
            let source = node
                .app
                .as_ref()
                .and_then(|app| self.repo.apps.get(app))
                .and_then(|app| app.workloads.get(workload));
            if let Some(w) = source {
                let mut keys = vec!["resources", name.as_str(), "params"];
                keys.extend(keys_of(segments));
                for n in (2..=keys.len()).rev() {
                    if let Some((line, _)) = locate_keys(&w.source, &keys[..n]) {
                        return (Some(format!("{}:{line}", w.file)), false);
                    }
                }
            }
            return (Some(location.to_string()), false);
        }
        // A workload's resource input is its Score file.
        if let Origin::Workload { file } = &*node.origin {
            let workload = self
                .repo
                .apps
                .values()
                .flat_map(|a| a.workloads.values())
                .find(|w| w.file == *file);
            if let Some(w) = workload {
                let keys = keys_of(segments);
                for n in (1..=keys.len()).rev() {
                    if let Some((line, _)) = locate_keys(&w.source, &keys[..n]) {
                        return (Some(format!("{file}:{line}")), false);
                    }
                }
            }
            return (Some(file.clone()), false);
        }
        if let Origin::Coprovisioned { definition, .. } = &*node.origin
            && let Some(def) = self.definition(definition)
        {
            return (Some(def.locate("provision").to_string()), false);
        }
        (None, false)
    }

    /// The chain of the node's own placeholder: values as last applied from the recorded
    /// bindings.
    fn trace_first(&self, needed_path: &str, b: &Binding) -> Trace {
        let recorded = |provided: &GuresId, provided_path: &str| -> Option<Shown> {
            self.bindings
                .iter()
                .find(|r| {
                    r.needed_path == needed_path
                        && r.provided == provided.as_str()
                        && r.provided_path == provided_path
                })
                .map(|r| match &r.value {
                    _ if r.secret => Shown::Secret,
                    Some(v) => Shown::Value(v.clone()),
                    None => Shown::Unknown,
                })
        };
        let mut visited = vec![(self.node.guresid.to_string(), needed_path.to_owned())];
        let value = b
            .provided()
            .and_then(|(provided, provided_path)| recorded(provided, &provided_path));
        match b {
            Binding::Stored { secret, .. } => Trace::Stored {
                secret: secret.clone(),
                value: Shown::Secret,
            },
            // What is read is not one output: say what it is instead of following it.
            Binding::Output {
                target, read, path, ..
            } if *read == Read::Guresid || (*read != Read::Outputs && path.is_empty()) => {
                Trace::Output {
                    provider: target.to_string(),
                    label: self.label(target),
                    output: graph::read_path(*read, path),
                    value: value.unwrap_or(match read {
                        Read::Guresid => Shown::Value(Value::String(target.to_string())),
                        Read::Secrets => Shown::Secret,
                        _ => Shown::Unknown,
                    }),
                    then: Next::Stop(
                        match read {
                            Read::Guresid => "its GUResID, known before it is provisioned",
                            Read::Secrets => "all of its secret outputs",
                            _ => "all of its non-secret outputs",
                        }
                        .to_owned(),
                    ),
                }
            }
            Binding::Output { target, path, .. } => {
                self.trace_output(target, path, value, &mut visited, 0)
            }
            Binding::Selector {
                written,
                targets,
                path,
                ..
            } => self.trace_selector(written, targets, path, value, &mut visited, 0),
        }
    }

    fn trace_selector(
        &self,
        written: &str,
        targets: &[GuresId],
        path: &[Segment],
        value: Option<Shown>,
        visited: &mut Vec<(String, String)>,
        depth: usize,
    ) -> Trace {
        let targets: Vec<Trace> = targets
            .iter()
            .map(|t| self.trace_output(t, path, None, visited, depth + 1))
            .collect();
        let value = value.unwrap_or_else(|| {
            let mut values = Vec::new();
            for t in &targets {
                match t {
                    Trace::Output {
                        value: Shown::Value(v),
                        ..
                    } => values.push(v.clone()),
                    Trace::Output {
                        value: Shown::Secret,
                        ..
                    } => return Shown::Secret,
                    _ => return Shown::Unknown,
                }
            }
            Shown::Value(Value::Array(values))
        });
        Trace::Selector {
            written: written.to_owned(),
            output: format!("outputs.{}", path_to_string(path)),
            value,
            targets,
        }
    }

    /// Output `path` of `target`, and what that output is at the provider.
    fn trace_output(
        &self,
        target: &GuresId,
        path: &[Segment],
        value: Option<Shown>,
        visited: &mut Vec<(String, String)>,
        depth: usize,
    ) -> Trace {
        let value =
            value.unwrap_or_else(|| recorded_output(self.records.get(target.as_str()), path));
        let then = self.then(target, path, value == Shown::Secret, visited, depth);
        Trace::Output {
            provider: target.to_string(),
            label: self.label(target),
            output: format!("outputs.{}", path_to_string(path)),
            value,
            then,
        }
    }

    fn then(
        &self,
        target: &GuresId,
        path: &[Segment],
        secret_output: bool,
        visited: &mut Vec<(String, String)>,
        depth: usize,
    ) -> Next {
        let Some(provider) = self.graph.get(target) else {
            return Next::Stop("not in the graph at this commit".into());
        };
        if !is_echo(&provider.driver_type) {
            return Next::Driver {
                driver: provider.driver_type.clone(),
                definition: provider.definition.clone(),
            };
        }
        // Echo: outputs are its values, secret outputs its secrets (values first, as
        // resolution looks them up).
        let (section, found) = match (
            secret_output,
            template_at(&provider.values, path),
            template_at(&provider.secrets, path),
        ) {
            (false, f @ (Found::Literal(_) | Found::Placeholders(_)), _) => ("values", f),
            (_, _, f @ (Found::Literal(_) | Found::Placeholders(_))) => ("secrets", f),
            _ => {
                return Next::Stop(format!(
                    "its driver {} echoes values and secrets, and neither has {}",
                    provider.driver_type,
                    path_to_string(path)
                ));
            }
        };
        let secret = section == "secrets";
        let input = format!("{section}.{}", path_to_string(path));
        let key = (target.to_string(), input.clone());
        if visited.contains(&key) {
            return Next::Stop("a cycle: this input was already traced above".into());
        }
        if depth >= MAX_DEPTH {
            return Next::Stop(format!("more hops follow: cut at {MAX_DEPTH}"));
        }
        let def = self.definition(&provider.definition);
        match found {
            Found::Literal(v) => Next::Input {
                input,
                definition: provider.definition.clone(),
                literal: Some((
                    (!secret).then(|| v.clone()),
                    def.map(|d| definition_location(d, section, path).0),
                )),
                secret,
                sources: Vec::new(),
            },
            Found::Placeholders(list) => {
                visited.push(key);
                let sources = list
                    .into_iter()
                    .map(|(b, rest)| match b {
                        Binding::Output {
                            target: next,
                            path: p,
                            ..
                        } => {
                            let mut full = p.clone();
                            full.extend(rest);
                            self.trace_output(next, &full, None, visited, depth + 1)
                        }
                        Binding::Selector {
                            written,
                            targets,
                            path: p,
                            ..
                        } => self.trace_selector(written, targets, p, None, visited, depth + 1),
                        Binding::Stored { secret, .. } => Trace::Stored {
                            secret: secret.clone(),
                            value: Shown::Secret,
                        },
                    })
                    .collect();
                visited.pop();
                Next::Input {
                    input,
                    definition: provider.definition.clone(),
                    literal: None,
                    secret,
                    sources,
                }
            }
            Found::Missing => Next::Stop("not found".into()),
        }
    }
}

/// The value of an input from its placeholders' values: the one value of a whole placeholder,
/// or the string its text and values make (as resolution inserts them).
fn composed(parts: Option<&[Part<Binding>]>, sources: &[Trace]) -> Shown {
    let value = |t: &Trace| match t {
        Trace::Output { value, .. }
        | Trace::Selector { value, .. }
        | Trace::Stored { value, .. } => value.clone(),
    };
    let Some(parts) = parts else {
        return sources.first().map_or(Shown::Unknown, value);
    };
    let mut out = String::new();
    let mut next = sources.iter();
    for p in parts {
        match p {
            Part::Text(t) => out.push_str(t),
            Part::Expr(_) => match next.next().map(value) {
                Some(Shown::Value(v)) => out.push_str(&insert_as_text(&v)),
                Some(other) => return other,
                None => return Shown::Unknown,
            },
        }
    }
    Shown::Value(Value::String(out))
}

/// Output `path` of a recorded resource: its value, or only that it is secret.
fn recorded_output(rec: Option<&ResourceRecord>, path: &[Segment]) -> Shown {
    let Some(rec) = rec else {
        return Shown::Unknown;
    };
    if let Some(v) = lookup_path(&rec.outputs, path) {
        return Shown::Value(v.clone());
    }
    if lookup_path(&rec.secret_outputs, path).is_some() {
        return Shown::Secret;
    }
    Shown::Unknown
}

fn label_of(
    guresid: &str,
    graph: Option<&ResourceGraph>,
    records: &HashMap<String, ResourceRecord>,
) -> String {
    if let Some(n) = graph.and_then(|g| g.get(guresid)) {
        return n.label();
    }
    records
        .get(guresid)
        .map(crate::plan::record_label)
        .unwrap_or_else(|| guresid.to_owned())
}

/// The inputs of a resource known from state alone: its recorded bindings, one input per
/// needed path.
fn recorded_inputs(
    rec: &ResourceRecord,
    bindings: &[BindingRecord],
    records: &HashMap<String, ResourceRecord>,
) -> Vec<Input> {
    let mut by_path: BTreeMap<&str, Vec<&BindingRecord>> = BTreeMap::new();
    for b in bindings {
        by_path.entry(&b.needed_path).or_default().push(b);
    }
    let bound = |path: &str| {
        by_path.keys().any(|p| {
            *p == path
                || p.strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        })
    };
    let mut out: Vec<Input> = Vec::new();
    let inputs = rec.inputs.parse().unwrap_or(Value::Null);
    // The values sent that no placeholder made, and the names of the secrets.
    if let Some(values) = inputs.get("values") {
        let mut found = Vec::new();
        literal_leaves(values, "values".to_owned(), Vec::new(), &mut found);
        for (path, _, leaf) in found {
            if let Leaf::Literal(v) = leaf
                && !bound(&path)
            {
                out.push(Input {
                    path,
                    value: Shown::Value(v.clone()),
                    at: None,
                    literal: Some(None),
                    sources: Vec::new(),
                });
            }
        }
    }
    let secret_names = rec
        .secret_inputs
        .parse()
        .unwrap_or(Value::Null)
        .get("secrets")
        .and_then(Value::as_object)
        .map(|m| m.keys().map(|k| format!("secrets.{k}")).collect::<Vec<_>>())
        .unwrap_or_default();
    for path in secret_names {
        if !bound(&path) {
            out.push(Input {
                path,
                value: Shown::Secret,
                at: None,
                literal: Some(None),
                sources: Vec::new(),
            });
        }
    }
    for (path, list) in &by_path {
        let shown = |b: &BindingRecord| match &b.value {
            _ if b.secret => Shown::Secret,
            Some(v) => Shown::Value(v.clone()),
            None => Shown::Unknown,
        };
        let secret = path.starts_with("secrets") || list.iter().any(|b| b.secret);
        // The input as last sent; a placeholder may be only part of it.
        let value = match parse_path(path).split_first() {
            _ if secret => Shown::Secret,
            Some((Segment::Key(section), rest)) => inputs
                .get(section)
                .and_then(|v| lookup_path(v, rest))
                .map_or(Shown::Unknown, |v| Shown::Value(v.clone())),
            _ => Shown::Unknown,
        };
        out.push(Input {
            path: (*path).to_owned(),
            value,
            at: None,
            literal: None,
            sources: list
                .iter()
                .map(|b| Trace::Output {
                    provider: b.provided.clone(),
                    label: label_of(&b.provided, None, records),
                    output: b.provided_path.clone(),
                    value: shown(b),
                    then: Next::Nothing,
                })
                .collect(),
        });
    }
    // values, secrets, resource; by path within each.
    let section = |path: &str| match path.split(['.', '[']).next() {
        Some("values") => 0,
        Some("secrets") => 1,
        _ => 2,
    };
    out.sort_by(|a, b| (section(&a.path), &a.path).cmp(&(section(&b.path), &b.path)));
    out
}

/// `values.a.b[0]` as segments (keys holding dots or brackets are not told apart).
fn parse_path(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Segment::Key(key.to_owned()));
        }
        while let Some(close) = rest.find(']') {
            match rest[1..close].parse() {
                Ok(i) => out.push(Segment::Index(i)),
                Err(_) => out.push(Segment::Key(rest[1..close].to_owned())),
            }
            rest = &rest[close + 1..];
        }
    }
    out
}

/// Everything `explain` shows.
struct Explanation<'a> {
    rec: &'a ResourceRecord,
    /// Not recorded yet: `rec` is what the graph says, with nothing provisioned.
    planned: bool,
    records: &'a HashMap<String, ResourceRecord>,
    graph: Option<&'a ResourceGraph>,
    /// The commit the graph was built from.
    commit: Option<String>,
    /// Why the resource could not be explained from the graph.
    graph_note: Option<String>,
    matching: Option<Matching>,
    inputs: Vec<Input>,
    links: Links,
    operations: Vec<ResourceOperation>,
}

impl Explanation<'_> {
    fn label(&self, guresid: &str) -> String {
        label_of(guresid, self.graph, self.records)
    }

    fn depends_on(&self) -> impl Iterator<Item = &LinkRecord> {
        self.links
            .links
            .iter()
            .filter(|l| l.consumer == self.rec.guresid)
    }

    fn dependents(&self) -> impl Iterator<Item = &LinkRecord> {
        self.links
            .links
            .iter()
            .filter(|l| l.provider == self.rec.guresid)
    }

    fn secret_output_names(&self) -> Vec<&str> {
        self.rec
            .secret_outputs
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// The text form: one section per question a reader asks, in the order they ask them.
    fn table(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(s.trim_end());
            out.push('\n');
        };
        self.about_section(&mut line);
        self.definition_section(&mut line);
        self.inputs_section(&mut line);
        self.outputs_section(&mut line);
        self.links_section(&mut line);
        self.operations_section(&mut line);
        out
    }

    /// The short commit the explanation is read at, `-` for the recorded state alone.
    fn at(&self) -> &str {
        self.commit.as_deref().map(short).unwrap_or("-")
    }

    /// What the resource is and where it stands: its label, ids, status, definition, driver.
    fn about_section(&self, line: &mut impl FnMut(String)) {
        let rec = self.rec;
        line(crate::plan::record_label(rec));
        let (status, provisioned_from) = if self.planned {
            ("not provisioned yet".to_owned(), "-".to_owned())
        } else {
            (
                rec.status.as_str().to_owned(),
                format!("{} (last provisioned from)", rec.commit_id),
            )
        };
        let mut about = vec![
            ("guresid", rec.guresid.clone()),
            ("env", rec.env.clone()),
            ("status", status),
            ("commit", provisioned_from),
            ("definition", rec.definition.clone()),
            ("driver", rec.driver.clone()),
        ];
        if let Some(e) = &rec.error {
            about.push(("error", e.clone()));
        }
        for (k, v) in about {
            line(format!("  {k:<11} {v}"));
        }
    }

    /// Which definition provisions it and why that one: every candidate with its rule and result.
    fn definition_section(&self, line: &mut impl FnMut(String)) {
        let rec = self.rec;
        let at = self.at();
        line(String::new());
        match &self.matching {
            Some(m) => {
                line(format!(
                    "DEFINITION at commit {at}: {} (driver {})",
                    m.definition, m.driver
                ));
                if let (true, Some(note)) = (self.planned, &self.graph_note) {
                    line(format!("  {note}"));
                }
                line(format!("  {}", m.how));
                line(format!("  the resource: {}", m.context));
                let mut t = Table::new(&["CANDIDATE", "RESULT", "RULE", "AT", "WHY"]);
                for c in &m.candidates {
                    t.row(vec![
                        c.definition.clone(),
                        if c.chosen {
                            "chosen"
                        } else if c.matched {
                            "lost"
                        } else {
                            "no match"
                        }
                        .to_owned(),
                        c.rule.clone().unwrap_or_else(|| "-".into()),
                        c.location.clone(),
                        c.reason.clone(),
                    ]);
                }
                out_push(line, &t.render("  "));
            }
            None => {
                line("DEFINITION".to_owned());
                if let Some(note) = &self.graph_note {
                    line(format!("  {note}"));
                }
                line(format!(
                    "  recorded: {} (driver {})",
                    rec.definition, rec.driver
                ));
            }
        }
    }

    /// Each input, its value, and where in which file it comes from.
    fn inputs_section(&self, line: &mut impl FnMut(String)) {
        let at = self.at();
        line(String::new());
        if self.planned {
            line(format!(
                "INPUTS (where each comes from at commit {at}; values of resources not \
                 provisioned yet are not known)"
            ));
        } else if self.matching.is_some() {
            line(format!(
                "INPUTS (values as last applied; where each comes from at commit {at})"
            ));
        } else {
            line("INPUTS (as last applied, from the recorded bindings)".to_owned());
        }
        if self.inputs.is_empty() {
            line("  none".to_owned());
        }
        for input in &self.inputs {
            let mut head = format!("  {} = {}", input.path, input.value.text());
            let mut what = Vec::new();
            match (&input.literal, &input.at) {
                (Some(_), Some(at)) => what.push(format!("literal at {at}")),
                (Some(_), None) => what.push("literal".to_owned()),
                (None, Some(at)) => what.push(format!("at {at}")),
                (None, None) => {}
            }
            what.extend(input.literal.clone().flatten());
            if !what.is_empty() {
                head.push_str(&format!("  ({})", what.join(", ")));
            }
            line(head);
            for t in &input.sources {
                render_trace(t, "    ", line);
            }
        }
    }

    /// Its outputs as last applied; secret outputs by name only.
    fn outputs_section(&self, line: &mut impl FnMut(String)) {
        let rec = self.rec;
        line(String::new());
        line(
            if self.planned {
                "OUTPUTS"
            } else {
                "OUTPUTS (as last applied)"
            }
            .to_owned(),
        );
        match rec.outputs.as_object() {
            _ if self.planned => line("  not known until it is provisioned".to_owned()),
            Some(m) if !m.is_empty() => {
                for (k, v) in m {
                    line(format!("  {k} = {v}"));
                }
            }
            _ => line("  none".to_owned()),
        }
        let secrets = self.secret_output_names();
        if !secrets.is_empty() {
            line(format!(
                "  secret outputs (values hidden): {}",
                secrets.join(", ")
            ));
        }
    }

    /// What it depends on and what depends on it.
    fn links_section(&self, line: &mut impl FnMut(String)) {
        let at = self.at();
        let source = match self.links.deployment {
            Some(d) => format!("links of deployment {d}"),
            None if self.planned => format!("edges of the graph at commit {at}"),
            None => "edges as last applied".to_owned(),
        };
        for (title, list, other_is_provider) in [
            ("DEPENDS ON", self.depends_on().collect::<Vec<_>>(), true),
            ("DEPENDED ON BY", self.dependents().collect(), false),
        ] {
            line(String::new());
            line(format!("{title} ({source})"));
            if list.is_empty() {
                line("  nothing".to_owned());
                continue;
            }
            let mut t = Table::new(&["RESOURCE", "KIND", "UPDATE TYPE", "GURESID"]);
            for l in list {
                let other = if other_is_provider {
                    &l.provider
                } else {
                    &l.consumer
                };
                t.row(vec![
                    self.label(other),
                    l.kind.clone(),
                    l.update_type.clone(),
                    other.clone(),
                ]);
            }
            out_push(line, &t.render("  "));
        }
    }

    /// What deployments did to it, newest first.
    fn operations_section(&self, line: &mut impl FnMut(String)) {
        line(String::new());
        line("OPERATIONS (newest first)".to_owned());
        if self.operations.is_empty() {
            line("  none".to_owned());
        } else {
            let mut t = Table::new(&[
                "DEPLOYMENT",
                "COMMIT",
                "ACTION",
                "STATUS",
                "ATTEMPTS",
                "STARTED",
                "REASON",
                "ERROR",
            ]);
            for o in &self.operations {
                t.row(vec![
                    o.operation.deployment.to_string(),
                    o.commit_id.as_deref().map(short).unwrap_or("-").to_owned(),
                    o.operation.action.clone(),
                    o.operation.status.clone(),
                    o.attempts.to_string(),
                    o.started_at.clone(),
                    o.operation.reason.clone(),
                    o.operation.error.clone().unwrap_or_default(),
                ]);
            }
            out_push(line, &t.render("  "));
        }
    }

    fn json(&self) -> Value {
        let rec = self.rec;
        let link = |l: &LinkRecord, other: &str| {
            json!({
                "guresid": other,
                "label": self.label(other),
                "kind": l.kind,
                "update_type": l.update_type,
            })
        };
        json!({
            "resource": {
                "label": crate::plan::record_label(rec),
                "guresid": rec.guresid,
                "env": rec.env,
                "app": rec.app,
                "type": rec.res_type,
                "class": rec.class,
                "id": rec.res_id,
                "status": if self.planned { "planned" } else { rec.status.as_str() },
                "commit": (!self.planned).then_some(&rec.commit_id),
                "definition": rec.definition,
                "driver": rec.driver,
                "error": rec.error,
            },
            "commit": self.commit,
            "in_graph": self.matching.is_some(),
            "recorded": !self.planned,
            "note": self.graph_note,
            "match": self.matching.as_ref().map(|m| json!({
                "definition": m.definition,
                "driver": m.driver,
                "context": m.context_json,
                "how": m.how,
                "candidates": m.candidates.iter().map(|c| json!({
                    "definition": c.definition,
                    "chosen": c.chosen,
                    "matched": c.matched,
                    "rule": c.rule,
                    "location": c.location,
                    "specificity": c.specificity,
                    "reason": c.reason,
                })).collect::<Vec<_>>(),
            })),
            "inputs": self.inputs.iter().map(|i| {
                let mut obj = serde_json::Map::new();
                obj.insert("path".into(), json!(i.path));
                i.value.json_into(&mut obj);
                obj.insert("location".into(), json!(i.at));
                obj.insert("literal".into(), Value::Bool(i.literal.is_some()));
                obj.insert("note".into(), json!(i.literal.clone().flatten()));
                obj.insert("from".into(), i.sources.iter().map(trace_json).collect());
                Value::Object(obj)
            }).collect::<Vec<_>>(),
            "outputs": {
                "values": rec.outputs,
                "secret_names": self.secret_output_names(),
            },
            "links": {
                "deployment": self.links.deployment,
                "depends_on": self.depends_on().map(|l| link(l, &l.provider)).collect::<Vec<_>>(),
                "dependents": self.dependents().map(|l| link(l, &l.consumer)).collect::<Vec<_>>(),
            },
            "operations": self.operations.iter().map(|o| json!({
                "id": o.operation.id,
                "deployment": o.operation.deployment,
                "env": o.env,
                "commit": o.commit_id,
                "kind": o.kind,
                "action": o.operation.action,
                "reason": o.operation.reason,
                "status": o.operation.status,
                "attempts": o.attempts,
                "error": o.operation.error,
                "started_at": o.started_at,
                "finished_at": o.finished_at,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Feeds a rendered table, line by line, to `line`.
fn out_push(line: &mut impl FnMut(String), text: &str) {
    for l in text.lines() {
        line(l.to_owned());
    }
}

fn render_trace(t: &Trace, indent: &str, line: &mut impl FnMut(String)) {
    match t {
        Trace::Output {
            label,
            output,
            value,
            then,
            ..
        } => {
            line(format!("{indent}<- {label} {output} = {}", value.text()));
            let deeper = format!("{indent}   ");
            match then {
                Next::Nothing => {}
                Next::Input {
                    input,
                    definition,
                    literal: Some((value, location)),
                    secret,
                    ..
                } => {
                    let what = match (value, secret) {
                        (Some(v), false) => format!("the literal {v}"),
                        _ => "a secret literal".to_owned(),
                    };
                    let at = location
                        .as_ref()
                        .map(|l| format!(" at {l}"))
                        .unwrap_or_default();
                    line(format!(
                        "{deeper}its {input} is {what}{at} (definition {definition})"
                    ));
                }
                Next::Input {
                    input,
                    definition,
                    sources,
                    ..
                } => {
                    line(format!(
                        "{deeper}its {input} (definition {definition}) comes from:"
                    ));
                    for s in sources {
                        render_trace(s, &format!("{deeper}  "), line);
                    }
                }
                Next::Driver { driver, definition } => line(format!(
                    "{deeper}an output of driver {driver} (definition {definition})"
                )),
                Next::Stop(why) => line(format!("{deeper}({why})")),
            }
        }
        Trace::Selector {
            written,
            output,
            value,
            targets,
        } => {
            line(format!(
                "{indent}<- selector {written} {output} = {}",
                value.text()
            ));
            for s in targets {
                render_trace(s, &format!("{indent}   "), line);
            }
        }
        Trace::Stored { secret, value } => {
            line(format!("{indent}<- secret {secret} = {}", value.text()));
        }
    }
}

fn trace_json(t: &Trace) -> Value {
    match t {
        Trace::Output {
            provider,
            label,
            output,
            value,
            then,
        } => {
            let mut obj = serde_json::Map::new();
            obj.insert("provider".into(), json!(provider));
            obj.insert("label".into(), json!(label));
            obj.insert("output".into(), json!(output));
            value.json_into(&mut obj);
            obj.insert(
                "then".into(),
                match then {
                    Next::Nothing => Value::Null,
                    Next::Input {
                        input,
                        definition,
                        literal,
                        secret,
                        sources,
                    } => json!({
                        "input": input,
                        "definition": definition,
                        "secret": secret,
                        "literal": literal.as_ref().map(|(value, location)| json!({
                            "value": value,
                            "location": location,
                        })),
                        "from": sources.iter().map(trace_json).collect::<Vec<_>>(),
                    }),
                    Next::Driver { driver, definition } => {
                        json!({"driver": driver, "definition": definition})
                    }
                    Next::Stop(why) => json!({"stop": why}),
                },
            );
            Value::Object(obj)
        }
        Trace::Selector {
            written,
            output,
            value,
            targets,
        } => {
            let mut obj = serde_json::Map::new();
            obj.insert("selector".into(), json!(written));
            obj.insert("output".into(), json!(output));
            value.json_into(&mut obj);
            obj.insert("targets".into(), targets.iter().map(trace_json).collect());
            Value::Object(obj)
        }
        Trace::Stored { secret, value } => {
            let mut obj = serde_json::Map::new();
            // `null`: the ref names no store, and the host's default store serves it.
            let store = (!secret.in_default_store()).then_some(&secret.store);
            obj.insert("store".into(), json!(store));
            obj.insert("ref".into(), json!(secret.reference));
            obj.insert("version".into(), json!(secret.version));
            value.json_into(&mut obj);
            Value::Object(obj)
        }
    }
}
