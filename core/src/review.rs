//! What a commit would change, for review: every environment's plan against its state, grouped
//! by app, as Markdown (a pull-request comment), JSON or text.
//!
//! Pure: [`compare`] takes an environment's graph, plan and recorded state (resources, links,
//! the current bindings of the resources whose bindings may change) and says what would be
//! created, updated and deleted, and which links and bindings would come and go. The renderers
//! order everything by environment, app, type, class and id and print no time, so the same
//! commit against the same state gives the same bytes. Secret values never enter a [`Review`]:
//! a secret input or binding shows as `(secret)`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::records::{BindingRecord, LinkRecord, ResourceRecord};
use serde_json::{Value, json};

use crate::graph::{GuresId, ResourceGraph};
use crate::plan::{Action, Held, Plan, Recorded, Step, planned_bindings, record_label};

/// A resource as a review names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Resource {
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub guresid: String,
    /// `app/type.class#id` (`type.class#id` for a global resource).
    pub label: String,
}

impl Resource {
    fn of_step(step: &Step) -> Resource {
        Resource {
            res_type: step.res_type.clone(),
            class: step.class.clone(),
            res_id: step.res_id.clone(),
            guresid: step.guresid.to_string(),
            label: step.label(),
        }
    }

    fn json(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("resource".into(), json!(self.label));
        m.insert("guresid".into(), json!(self.guresid));
        m.insert("type".into(), json!(self.res_type));
        m.insert("class".into(), json!(self.class));
        m.insert("id".into(), json!(self.res_id));
        m
    }
}

/// A resource the commit would update, or may update.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Updated {
    pub resource: Resource,
    /// Whether it changes is known only after apply: it reads outputs of resources that change
    /// first, and none of its own inputs changes.
    pub maybe: bool,
    pub reason: String,
    /// Each input that changes for sure, secrets as `secrets.NAME: changed (secret)`; listed
    /// beside `known_after_apply` when the resource also reads outputs that may change.
    pub changes: Vec<String>,
    /// Each input that reads an output of a resource changing first, as
    /// `values.host <- LABEL outputs.host`.
    pub known_after_apply: Vec<String>,
}

/// A resource the commit would remove from the state.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deleted {
    pub resource: Resource,
    /// `deletion_policy: orphan`: forgotten, not deleted.
    pub forget: bool,
}

/// A link between two resources (consumer → provider), by label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Link {
    pub consumer: String,
    pub provider: String,
    pub kind: String,
}

/// Which input of which resource a binding fills.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BindingKey {
    pub resource: String,
    /// The input's path, such as `values.host` or `resource.containers.api.variables.DB_HOST`.
    pub input: String,
}

/// What a binding reads: an output of a provider, and the value it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingEnd {
    pub provider: String,
    /// The provider's output path, such as `outputs.host`.
    pub output: String,
    pub value: BoundValue,
}

/// What a binding carries: a value, a secret (never shown), or a value known after apply.
#[derive(Debug, Clone, PartialEq)]
pub enum BoundValue {
    Value(Value),
    Secret,
    KnownAfterApply,
}

impl BoundValue {
    fn json(&self) -> Value {
        match self {
            BoundValue::Value(v) => v.clone(),
            BoundValue::Secret | BoundValue::KnownAfterApply => Value::Null,
        }
    }

    fn text(&self) -> String {
        match self {
            BoundValue::Value(v) => v.to_string(),
            BoundValue::Secret => "(secret)".to_owned(),
            BoundValue::KnownAfterApply => "(known after apply)".to_owned(),
        }
    }
}

/// The links and bindings that come, go or change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wiring {
    pub links_added: Vec<Link>,
    pub links_removed: Vec<Link>,
    pub bindings_added: Vec<(BindingKey, BindingEnd)>,
    pub bindings_removed: Vec<(BindingKey, BindingEnd)>,
    /// An input that reads another output, or whose non-secret value changes: key, from, to.
    pub bindings_changed: Vec<(BindingKey, BindingEnd, BindingEnd)>,
}

/// One app's part of an environment's review (`app: None`: the global resources).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppReview {
    pub app: Option<String>,
    pub created: Vec<Resource>,
    pub updated: Vec<Updated>,
    pub deleted: Vec<Deleted>,
    pub wiring: Wiring,
}

impl AppReview {
    fn is_empty(&self) -> bool {
        self.created.is_empty()
            && self.updated.is_empty()
            && self.deleted.is_empty()
            && self.wiring == Wiring::default()
    }
}

/// One environment's review.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvReview {
    pub env: String,
    /// The deletion guard would hold the deployment: nothing would change until approved.
    pub held: Option<Held>,
    /// Apps with something to review, global resources first, then by name.
    pub apps: Vec<AppReview>,
}

/// What a commit would change in each environment; or why it would be rejected.
#[derive(Debug, Clone, PartialEq)]
pub struct Review {
    pub commit: String,
    /// The ref as asked for (`--ref`), `None` for HEAD.
    pub reference: Option<String>,
    pub environments: Vec<EnvReview>,
    /// Why the commit does not load or build (it would change nothing); empty when it does.
    pub rejected: Vec<String>,
    /// When the commit lacks commits of the watched ref: the plan is of its merge into it.
    pub merge: Option<MergeNote>,
}

/// A branch behind the watched ref, planned as its merge into it: the watched ref's newer
/// commits are kept, never shown as reverted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeNote {
    /// The watched ref, as the host config names it (`main`).
    pub into: String,
    /// The watched ref's commit the branch is merged into.
    pub into_commit: String,
    /// The newest commit both have.
    pub base: String,
    /// How many commits the watched ref has that the branch lacks.
    pub behind: usize,
    /// Files both changed since `base`, differently: the review is then rejected.
    pub conflicts: Vec<String>,
}

impl MergeNote {
    /// `the branch is 2 commits behind main (0123456789ab): this plan shows the result of
    /// merging it into main`.
    fn sentence(&self, quote: impl Fn(&str) -> String) -> String {
        format!(
            "the branch is {} commit{} behind {} ({}): this plan shows the result of merging \
             it into {}",
            self.behind,
            if self.behind == 1 { "" } else { "s" },
            quote(&self.into),
            quote(self.into_commit.get(..12).unwrap_or(&self.into_commit)),
            quote(&self.into),
        )
    }
}

/// The longest Markdown [`Review::to_markdown`] gives, in bytes: under the 65 536 characters
/// GitHub takes in a comment, with room for a bot's own words.
pub const MARKDOWN_LIMIT: usize = 60_000;

/// An environment's graph, plan and recorded state: what [`compare`] needs.
pub struct EnvState<'a> {
    pub graph: &'a ResourceGraph,
    pub plan: &'a Plan,
    pub recorded: &'a [ResourceRecord],
    pub links: &'a [LinkRecord],
    /// The current bindings of the resources [`bindings_to_read`] names, by GUResID (those
    /// without any may be left out).
    pub bindings: &'a HashMap<String, Vec<BindingRecord>>,
    pub held: Option<Held>,
}

/// The resources whose bindings an apply of `plan` would take again: those it creates or may
/// update, and unchanged ones whose definition's template changed. The caller reads their
/// current bindings for [`compare`].
pub fn bindings_to_read<'p>(
    plan: &'p Plan,
    graph: &ResourceGraph,
    recorded: &[ResourceRecord],
) -> Vec<&'p GuresId> {
    let by_id: HashMap<&str, &ResourceRecord> =
        recorded.iter().map(|r| (r.guresid.as_str(), r)).collect();
    plan.steps
        .iter()
        .filter(|s| match s.action {
            Action::Create | Action::Update | Action::MaybeUpdate => true,
            Action::Unchanged => match (graph.get(&s.guresid), by_id.get(s.guresid.as_str())) {
                (Some(node), Some(rec)) => rec.template_hash != node.template_hash,
                _ => false,
            },
            Action::Pinned | Action::Delete | Action::Forget => false,
        })
        .map(|s| &s.guresid)
        .collect()
}

/// What applying `state.plan` would change in its environment, by app.
pub fn compare(state: &EnvState<'_>) -> EnvReview {
    let graph = state.graph;
    let mut known = Recorded::new(state.recorded);
    for s in &state.plan.steps {
        if s.action == Action::Unchanged {
            known.stable(&s.guresid);
        }
    }
    let label = |id: &str| -> String {
        graph
            .get(id)
            .map(|n| n.label())
            .or_else(|| known.get(id).map(record_label))
            .unwrap_or_else(|| id.to_owned())
    };
    let app_of = |id: &str| -> Option<String> {
        graph
            .get(id)
            .map(|n| n.app.clone())
            .or_else(|| known.get(id).map(|r| r.app.clone()))
            .flatten()
    };
    let mut apps: BTreeMap<Option<String>, AppReview> = BTreeMap::new();

    for step in &state.plan.steps {
        let resource = Resource::of_step(step);
        let entry = app_entry(&mut apps, step.app.clone());
        match step.action {
            Action::Create => entry.created.push(resource),
            Action::Update | Action::MaybeUpdate => entry.updated.push(Updated {
                resource,
                maybe: step.action == Action::MaybeUpdate && step.changes.is_empty(),
                reason: step.reason.clone(),
                changes: step.changes.clone(),
                known_after_apply: step.known_after_apply.clone(),
            }),
            Action::Delete | Action::Forget => entry.deleted.push(Deleted {
                resource,
                forget: step.action == Action::Forget,
            }),
            Action::Pinned | Action::Unchanged => {}
        }
    }

    // Links: the graph's edges against the recorded ones.
    let wanted: BTreeSet<(&str, &str, &str)> = graph
        .edge_iter()
        .map(|(from, to, kind)| (from.as_str(), to.as_str(), kind.as_str()))
        .collect();
    let had: BTreeSet<(&str, &str, &str)> = state
        .links
        .iter()
        .map(|l| (l.consumer.as_str(), l.provider.as_str(), l.kind.as_str()))
        .collect();
    let link = |(consumer, provider, kind): &(&str, &str, &str)| Link {
        consumer: label(consumer),
        provider: label(provider),
        kind: (*kind).to_owned(),
    };
    for l in wanted.difference(&had) {
        app_entry(&mut apps, app_of(l.0))
            .wiring
            .links_added
            .push(link(l));
    }
    for l in had.difference(&wanted) {
        app_entry(&mut apps, app_of(l.0))
            .wiring
            .links_removed
            .push(link(l));
    }

    // Bindings: what each resource that binds again would bind, against what it has bound.
    for id in bindings_to_read(state.plan, graph, state.recorded) {
        let Some(node) = graph.get(id) else {
            continue;
        };
        let resource = node.label();
        let mut new: BTreeMap<String, Vec<BindingEnd>> = BTreeMap::new();
        for b in planned_bindings(node, &known) {
            let value = match (b.secret, b.value) {
                (true, _) => BoundValue::Secret,
                (false, Some(v)) if b.known => BoundValue::Value(v),
                _ => BoundValue::KnownAfterApply,
            };
            new.entry(b.needed_path).or_default().push(BindingEnd {
                provider: label(b.provided.as_str()),
                output: b.provided_path,
                value,
            });
        }
        let mut old: BTreeMap<String, Vec<BindingEnd>> = BTreeMap::new();
        for b in state.bindings.get(id.as_str()).into_iter().flatten() {
            let value = match (&b.value, b.secret) {
                (Some(v), false) => BoundValue::Value(v.clone()),
                _ => BoundValue::Secret,
            };
            old.entry(b.needed_path.clone())
                .or_default()
                .push(BindingEnd {
                    provider: label(&b.provided),
                    output: b.provided_path.clone(),
                    value,
                });
        }
        let wiring = &mut app_entry(&mut apps, node.app.clone()).wiring;
        let inputs: BTreeSet<&String> = new.keys().chain(old.keys()).collect();
        for input in inputs {
            let key = BindingKey {
                resource: resource.clone(),
                input: input.clone(),
            };
            let (before, after) = match_bindings(
                old.get(input).map(Vec::as_slice).unwrap_or_default(),
                new.get(input).map(Vec::as_slice).unwrap_or_default(),
                &key,
                wiring,
            );
            match (before.as_slice(), after.as_slice()) {
                // The input reads something else now.
                ([from], [to]) => {
                    wiring
                        .bindings_changed
                        .push((key, (*from).clone(), (*to).clone()));
                }
                _ => {
                    for b in before {
                        wiring.bindings_removed.push((key.clone(), b.clone()));
                    }
                    for b in after {
                        wiring.bindings_added.push((key.clone(), b.clone()));
                    }
                }
            }
        }
    }

    let mut apps: Vec<AppReview> = apps.into_values().filter(|a| !a.is_empty()).collect();
    for a in &mut apps {
        a.created.sort();
        a.updated.sort();
        a.deleted.sort();
        a.wiring.links_added.sort();
        a.wiring.links_removed.sort();
        a.wiring.bindings_added.sort_by(|x, y| x.0.cmp(&y.0));
        a.wiring.bindings_removed.sort_by(|x, y| x.0.cmp(&y.0));
        a.wiring.bindings_changed.sort_by(|x, y| x.0.cmp(&y.0));
    }
    EnvReview {
        env: graph.env.clone(),
        held: state.held.clone(),
        apps,
    }
}

/// Counts over a review, or over one environment of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub create: usize,
    pub update: usize,
    pub maybe_update: usize,
    pub delete: usize,
    pub forget: usize,
    pub links_added: usize,
    pub links_removed: usize,
    pub bindings_added: usize,
    pub bindings_removed: usize,
    pub bindings_changed: usize,
}

impl Counts {
    fn add_app(&mut self, a: &AppReview) {
        self.create += a.created.len();
        self.update += a.updated.iter().filter(|u| !u.maybe).count();
        self.maybe_update += a.updated.iter().filter(|u| u.maybe).count();
        self.delete += a.deleted.iter().filter(|d| !d.forget).count();
        self.forget += a.deleted.iter().filter(|d| d.forget).count();
        self.links_added += a.wiring.links_added.len();
        self.links_removed += a.wiring.links_removed.len();
        self.bindings_added += a.wiring.bindings_added.len();
        self.bindings_removed += a.wiring.bindings_removed.len();
        self.bindings_changed += a.wiring.bindings_changed.len();
    }

    fn of_env(e: &EnvReview) -> Counts {
        let mut c = Counts::default();
        for a in &e.apps {
            c.add_app(a);
        }
        c
    }

    /// The table cells after the name: create, update, delete, links, bindings.
    fn cells(&self) -> String {
        let update = if self.maybe_update > 0 {
            format!("{} (+{} may)", self.update, self.maybe_update)
        } else {
            self.update.to_string()
        };
        let delete = if self.forget > 0 {
            format!("{} (+{} forget)", self.delete, self.forget)
        } else {
            self.delete.to_string()
        };
        format!(
            "{} | {update} | {delete} | +{} −{} | +{} −{} ~{}",
            self.create,
            self.links_added,
            self.links_removed,
            self.bindings_added,
            self.bindings_removed,
            self.bindings_changed
        )
    }

    fn links(&self) -> usize {
        self.links_added + self.links_removed
    }

    fn bindings(&self) -> usize {
        self.bindings_added + self.bindings_removed + self.bindings_changed
    }

    /// `2 to create, 1 to update, 0 to delete`, then what else is not zero.
    fn phrase(&self) -> String {
        let mut s = format!(
            "{} to create, {} to update, {} to delete",
            self.create, self.update, self.delete
        );
        for (n, what) in [
            (self.maybe_update, "may update"),
            (self.forget, "to forget"),
            (self.links(), "link change(s)"),
            (self.bindings(), "binding change(s)"),
        ] {
            if n > 0 {
                let _ = write!(s, ", {n} {what}");
            }
        }
        s
    }
}

impl EnvReview {
    pub fn counts(&self) -> Counts {
        Counts::of_env(self)
    }

    /// Whether applying would change anything here.
    pub fn changes_anything(&self) -> bool {
        !self.apps.is_empty()
    }
}

impl Review {
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for e in &self.environments {
            for a in &e.apps {
                c.add_app(a);
            }
        }
        c
    }

    /// Whether applying would change anything in any environment (a rejected commit changes
    /// nothing).
    pub fn changes_anything(&self) -> bool {
        self.changed_envs() > 0
    }

    fn changed_envs(&self) -> usize {
        self.environments
            .iter()
            .filter(|e| e.changes_anything())
            .count()
    }

    fn short(&self) -> &str {
        self.commit.get(..12).unwrap_or(&self.commit)
    }

    /// `2 to create, 1 to update, 0 to delete in 2 environments`, or `no changes`.
    fn summary_phrase(&self) -> String {
        if !self.rejected.is_empty() {
            return format!(
                "rejected: {} error(s); a deployment would change nothing",
                self.rejected.len()
            );
        }
        let envs = self.changed_envs();
        if envs == 0 {
            return "no changes".to_owned();
        }
        let mut s = format!(
            "{} in {envs} environment{}",
            self.counts().phrase(),
            if envs == 1 { "" } else { "s" }
        );
        let held = self
            .environments
            .iter()
            .filter(|e| e.held.is_some())
            .count();
        if held > 0 {
            let _ = write!(s, "; {held} held by the deletion guard");
        }
        s
    }

    /// The JSON form, documented in docs/plan.md.
    pub fn to_json(&self) -> Value {
        let c = self.counts();
        json!({
            "commit": self.commit,
            "ref": self.reference,
            "rejected": if self.rejected.is_empty() {
                Value::Null
            } else {
                json!({"errors": self.rejected})
            },
            "summary": {
                "create": c.create,
                "update": c.update,
                "maybe_update": c.maybe_update,
                "delete": c.delete,
                "forget": c.forget,
                "links_added": c.links_added,
                "links_removed": c.links_removed,
                "bindings_added": c.bindings_added,
                "bindings_removed": c.bindings_removed,
                "bindings_changed": c.bindings_changed,
                "environments_changed": self.changed_envs(),
                "environments_held": self.environments.iter().filter(|e| e.held.is_some()).count(),
            },
            "environments": self.environments.iter().map(env_json).collect::<Vec<_>>(),
            "merge": self.merge.as_ref().map(|m| json!({
                "into": m.into,
                "into_commit": m.into_commit,
                "base": m.base,
                "behind": m.behind,
                "conflicts": m.conflicts,
            })),
        })
    }

    /// The Markdown form, for a pull-request comment: at most [`MARKDOWN_LIMIT`] bytes (see
    /// [`Review::to_markdown_within`]).
    pub fn to_markdown(&self) -> String {
        self.to_markdown_within(MARKDOWN_LIMIT)
    }

    /// The Markdown form in at most `limit` bytes (so as many characters at most). When the
    /// whole of it is longer, a summary: the counts per environment, then each environment's
    /// table of counts per app (every app with a change), then the details of as many apps as
    /// fit, each environment whose details are cut saying how many resources it left out and
    /// which command shows them.
    pub fn to_markdown_within(&self, limit: usize) -> String {
        let mut out = self.markdown_header();
        if !self.rejected.is_empty() {
            out.push('\n');
            for e in &self.rejected {
                let _ = writeln!(out, "- {}", escape(e));
            }
            return out;
        }
        let changed: Vec<&EnvReview> = self
            .environments
            .iter()
            .filter(|e| e.changes_anything())
            .collect();
        let mut full = out.clone();
        for e in &changed {
            markdown_env(&mut full, e);
        }
        if full.len() <= limit {
            return full;
        }

        let _ = writeln!(
            out,
            "\nThis plan is too long for one comment: below are the counts of every \
             environment and app, and the details of those that fit.\n"
        );
        out.push_str("| Environment | Apps | Create | Update | Delete | Links | Bindings |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
        for e in &changed {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                escape(&e.env),
                e.apps.len(),
                e.counts().cells()
            );
        }
        let summaries: Vec<String> = changed.iter().map(|e| markdown_env_summary(e)).collect();
        // What every environment prints besides its apps' details: its summary, the
        // `<details>` block around them and the line saying what was left out.
        let cut_lines: Vec<String> = changed.iter().map(|e| self.cut_line(e, 0, 0)).collect();
        let frame = |e: &EnvReview| details_open(e).len() + "</details>\n".len();
        let fixed: usize = out.len()
            + summaries.iter().map(String::len).sum::<usize>()
            + changed.iter().map(|e| frame(e)).sum::<usize>()
            // A count in a cut line may have more digits than the 0 measured.
            + cut_lines.iter().map(|l| l.len() + 40).sum::<usize>();
        let mut budget = limit.saturating_sub(fixed);
        if fixed > limit {
            // Even the tables do not fit (thousands of apps): the per-environment counts stay,
            // each environment says how to see it.
            for e in &changed {
                let _ = write!(
                    out,
                    "\n### {}: {}\n{}",
                    escape(&e.env),
                    e.counts().phrase(),
                    self.cut_line(e, e.apps.iter().map(resources_of).sum(), e.apps.len())
                );
            }
            return out;
        }
        for (e, summary) in changed.iter().zip(&summaries) {
            out.push_str(summary);
            out.push_str(&details_open(e));
            let mut shown = 0;
            for a in &e.apps {
                let block = markdown_app_details(a);
                if block.len() > budget {
                    break;
                }
                budget -= block.len();
                out.push_str(&block);
                shown += 1;
            }
            out.push_str("</details>\n");
            let left: Vec<&AppReview> = e.apps[shown..].iter().collect();
            if !left.is_empty() {
                let resources = left.iter().map(|a| resources_of(a)).sum();
                out.push_str(&self.cut_line(e, resources, left.len()));
            }
        }
        out
    }

    /// The line an environment whose details were cut ends with.
    fn cut_line(&self, e: &EnvReview, resources: usize, apps: usize) -> String {
        let reference = self.reference.as_deref().unwrap_or(self.short());
        format!(
            "\n**{resources} more resource{} in {apps} app{} not shown here**: run \
             {} to see every change.\n",
            if resources == 1 { "" } else { "s" },
            if apps == 1 { "" } else { "s" },
            code(&format!(
                "gitplane plan --ref {reference} --env {} --format text",
                e.env
            )),
        )
    }

    fn markdown_header(&self) -> String {
        let mut out = String::new();
        let reference = match &self.reference {
            Some(r) => format!(" (ref {})", code(r)),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "**gitplane plan** for {}{reference}: {}",
            code(self.short()),
            self.summary_phrase()
        );
        if let Some(m) = &self.merge {
            let _ = writeln!(out, "\n> {}.", capitalised(&m.sentence(code)));
        }
        out
    }

    /// The text form: the same as the Markdown, for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let reference = match &self.reference {
            Some(r) => format!(" (ref {r})"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "plan for {}{reference}: {}",
            self.short(),
            self.summary_phrase()
        );
        if let Some(m) = &self.merge {
            let _ = writeln!(out, "  {}", m.sentence(str::to_owned));
        }
        for e in &self.rejected {
            let _ = writeln!(out, "  error: {e}");
        }
        for e in self.environments.iter().filter(|e| e.changes_anything()) {
            let _ = writeln!(out, "\n{}: {}", e.env, e.counts().phrase());
            if let Some(held) = &e.held {
                let _ = writeln!(
                    out,
                    "  held by the deletion guard: {}; `gitplane approve` releases it",
                    held.reason
                );
            }
            for a in &e.apps {
                let _ = writeln!(out, "  {}", app_title(a));
                for line in entries(a) {
                    let _ = writeln!(out, "    {}", line.text());
                    for detail in &line.details {
                        let _ = writeln!(out, "        {detail}");
                    }
                }
            }
        }
        out
    }
}

fn app_entry(
    apps: &mut BTreeMap<Option<String>, AppReview>,
    name: Option<String>,
) -> &mut AppReview {
    apps.entry(name.clone()).or_insert_with(|| AppReview {
        app: name,
        ..AppReview::default()
    })
}

/// Pairs the bindings an input had with those it would have by provider and output: a pair
/// whose known, non-secret value differs goes to `wiring` as changed. Returns those left
/// unpaired, old and new.
fn match_bindings<'b>(
    old: &'b [BindingEnd],
    new: &'b [BindingEnd],
    key: &BindingKey,
    wiring: &mut Wiring,
) -> (Vec<&'b BindingEnd>, Vec<&'b BindingEnd>) {
    let mut before: Vec<&BindingEnd> = old.iter().collect();
    let mut after = Vec::new();
    for n in new {
        let paired = before
            .iter()
            .position(|o| o.provider == n.provider && o.output == n.output);
        match paired {
            Some(i) => {
                let o = before.remove(i);
                if let (BoundValue::Value(a), BoundValue::Value(b)) = (&o.value, &n.value)
                    && a != b
                {
                    wiring
                        .bindings_changed
                        .push((key.clone(), o.clone(), n.clone()));
                }
            }
            None => after.push(n),
        }
    }
    (before, after)
}

fn env_json(e: &EnvReview) -> Value {
    json!({
        "env": e.env,
        "held": e.held.as_ref().map(|h| json!({
            "reason": h.reason,
            "resources": h.deletions,
        })),
        "apps": e.apps.iter().map(app_json).collect::<Vec<_>>(),
    })
}

fn app_json(a: &AppReview) -> Value {
    let with = |r: &Resource, extra: Vec<(&str, Value)>| {
        let mut m = r.json();
        for (k, v) in extra {
            m.insert(k.to_owned(), v);
        }
        Value::Object(m)
    };
    let end = |e: &BindingEnd| {
        json!({
            "provider": e.provider,
            "output": e.output,
            "secret": matches!(e.value, BoundValue::Secret),
            "known_after_apply": matches!(e.value, BoundValue::KnownAfterApply),
            "value": e.value.json(),
        })
    };
    let bound = |(k, e): &(BindingKey, BindingEnd)| {
        let mut v = end(e);
        v["resource"] = json!(k.resource);
        v["input"] = json!(k.input);
        v
    };
    let link = |l: &Link| json!({"consumer": l.consumer, "provider": l.provider, "kind": l.kind});
    json!({
        "app": a.app,
        "created": a.created.iter().map(|r| with(r, vec![])).collect::<Vec<_>>(),
        "updated": a.updated.iter().map(|u| with(&u.resource, vec![
            ("maybe", json!(u.maybe)),
            ("reason", json!(u.reason)),
            ("changes", json!(u.changes)),
            ("known_after_apply", json!(u.known_after_apply)),
        ])).collect::<Vec<_>>(),
        "deleted": a.deleted.iter().map(|d| with(&d.resource, vec![
            ("forget", json!(d.forget)),
        ])).collect::<Vec<_>>(),
        "links": {
            "added": a.wiring.links_added.iter().map(link).collect::<Vec<_>>(),
            "removed": a.wiring.links_removed.iter().map(link).collect::<Vec<_>>(),
        },
        "bindings": {
            "added": a.wiring.bindings_added.iter().map(bound).collect::<Vec<_>>(),
            "removed": a.wiring.bindings_removed.iter().map(bound).collect::<Vec<_>>(),
            "changed": a.wiring.bindings_changed.iter().map(|(k, from, to)| json!({
                "resource": k.resource,
                "input": k.input,
                "from": end(from),
                "to": end(to),
            })).collect::<Vec<_>>(),
        },
    })
}

fn app_title(a: &AppReview) -> String {
    match &a.app {
        Some(app) => format!("app {app}"),
        None => "global resources".to_owned(),
    }
}

/// One line of an app's changes: a sign, a verb, what (a resource, a link or a binding) and
/// what follows it, then indented details. Each part is plain text; the renderers quote it.
struct Entry {
    verb: &'static str,
    subject: String,
    rest: Option<String>,
    details: Vec<String>,
}

impl Entry {
    fn text(&self) -> String {
        match &self.rest {
            Some(rest) => format!("{} {} {rest}", self.verb, self.subject),
            None => format!("{} {}", self.verb, self.subject),
        }
    }

    fn markdown(&self) -> String {
        match &self.rest {
            Some(rest) => format!("{} {} {}", self.verb, code(&self.subject), escape(rest)),
            None => format!("{} {}", self.verb, code(&self.subject)),
        }
    }
}

fn binding_subject(k: &BindingKey, e: &BindingEnd) -> String {
    format!("{} {} <- {} {}", k.resource, k.input, e.provider, e.output)
}

fn entries(a: &AppReview) -> Vec<Entry> {
    let mut out = Vec::new();
    for r in &a.created {
        out.push(Entry {
            verb: "create",
            subject: r.label.clone(),
            rest: None,
            details: Vec::new(),
        });
    }
    for u in &a.updated {
        out.push(Entry {
            verb: if u.maybe { "may update" } else { "update" },
            subject: u.resource.label.clone(),
            rest: (!u.reason.is_empty())
                .then(|| format!("({})", u.reason.trim_end_matches(':').replace(":;", ";"))),
            details: u
                .changes
                .iter()
                .cloned()
                .chain(
                    u.known_after_apply
                        .iter()
                        .map(|k| format!("{k} (known after apply)")),
                )
                .collect(),
        });
    }
    for d in &a.deleted {
        out.push(Entry {
            verb: if d.forget { "forget" } else { "delete" },
            subject: d.resource.label.clone(),
            rest: d
                .forget
                .then(|| "(deletion_policy orphan: kept, no longer managed)".to_owned()),
            details: Vec::new(),
        });
    }
    for (verb, links) in [
        ("link added", &a.wiring.links_added),
        ("link removed", &a.wiring.links_removed),
    ] {
        for l in links {
            out.push(Entry {
                verb,
                subject: format!("{} -> {}", l.consumer, l.provider),
                rest: Some(format!("({})", l.kind)),
                details: Vec::new(),
            });
        }
    }
    for (verb, bindings) in [
        ("binding added", &a.wiring.bindings_added),
        ("binding removed", &a.wiring.bindings_removed),
    ] {
        for (k, e) in bindings {
            out.push(Entry {
                verb,
                subject: binding_subject(k, e),
                rest: Some(format!("= {}", e.value.text())),
                details: Vec::new(),
            });
        }
    }
    for (k, from, to) in &a.wiring.bindings_changed {
        let rest = if from.provider == to.provider && from.output == to.output {
            format!(": {} -> {}", from.value.text(), to.value.text())
        } else {
            format!(
                "(was {} {} = {}) = {}",
                from.provider,
                from.output,
                from.value.text(),
                to.value.text()
            )
        };
        out.push(Entry {
            verb: "binding changed",
            subject: binding_subject(k, to),
            rest: Some(rest),
            details: Vec::new(),
        });
    }
    out
}

/// An environment's heading, the deletion guard's verdict and its table of counts per app (every
/// app with a change, however many).
fn markdown_env_summary(e: &EnvReview) -> String {
    let mut out = String::new();
    let c = e.counts();
    let _ = writeln!(out, "\n### {}: {}\n", escape(&e.env), c.phrase());
    if let Some(held) = &e.held {
        let _ = writeln!(
            out,
            "> **Held by the deletion guard**: {}. Nothing changes here until `gitplane approve` \
             releases the deployment. It would delete: {}\n",
            escape(&held.reason),
            held.deletions
                .iter()
                .map(|d| code(d))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out.push_str("| App | Create | Update | Delete | Links | Bindings |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|\n");
    for a in &e.apps {
        let mut c = Counts::default();
        c.add_app(a);
        let app = match &a.app {
            Some(app) => escape(app),
            None => "*(global)*".to_owned(),
        };
        let _ = writeln!(out, "| {app} | {} |", c.cells());
    }
    out
}

/// One app's changes, resource by resource, for the `<details>` block.
fn markdown_app_details(a: &AppReview) -> String {
    let mut out = String::new();
    let title = match &a.app {
        Some(app) => format!("app {}", code(app)),
        None => "global resources".to_owned(),
    };
    let _ = writeln!(out, "**{title}**\n");
    for entry in entries(a) {
        let _ = writeln!(out, "- {}", entry.markdown());
        for d in &entry.details {
            let _ = writeln!(out, "  - {}", code(d));
        }
    }
    out.push('\n');
    out
}

fn markdown_env(out: &mut String, e: &EnvReview) {
    out.push_str(&markdown_env_summary(e));
    out.push_str(&details_open(e));
    for a in &e.apps {
        out.push_str(&markdown_app_details(a));
    }
    out.push_str("</details>\n");
}

fn details_open(e: &EnvReview) -> String {
    format!(
        "\n<details><summary>{}: changes by resource</summary>\n\n",
        html(&e.env)
    )
}

/// The resources an app's review lists (created, updated, deleted).
fn resources_of(a: &AppReview) -> usize {
    a.created.len() + a.updated.len() + a.deleted.len()
}

/// `text` as a Markdown code span, whatever it holds: the fence is one backtick longer than
/// any run of backticks inside, and line breaks become spaces.
fn code(text: &str) -> String {
    let text = text.replace(['\n', '\r'], " ");
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    // A span that starts or ends with a backtick needs a space inside its fence; CommonMark
    // strips one space at each end.
    if text.starts_with('`') || text.ends_with('`') || longest > 0 {
        format!("{fence} {text} {fence}")
    } else {
        format!("{fence}{text}{fence}")
    }
}

/// `text` as Markdown that shows it literally: every character Markdown or a table could read
/// as syntax is escaped, and line breaks become spaces.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\r' => out.push(' '),
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '!' | '~' | '&' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `text` for HTML (inside `<summary>`).
fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests;
