//! Output for people (aligned tables) and for programs (JSON), never with secret values.

use gitplane_state::{DeploymentRecord, LeaseRecord, ResourceRecord};
use serde_json::{Value, json};

use crate::deploy::Scope;
use crate::graph::ResourceGraph;
use crate::plan::{Action, Plan};

pub use crate::app::text::{Table, short};

pub fn plan_table(plan: &Plan, scope: &Scope, commit: &str) -> String {
    let mut t = Table::new(&["ACTION", "RESOURCE", "REASON"]);
    for step in &plan.steps {
        t.row(vec![
            step.action.to_string(),
            step.label(),
            step.reason.clone(),
        ]);
        for line in step.changes.iter().chain(&step.known_after_apply) {
            t.row(vec![String::new(), String::new(), format!("  {line}")]);
        }
    }
    let unread = match scope.unchanged_apps {
        0 => String::new(),
        apps => format!(
            "  ({} of them in {apps} app(s) whose files and definitions are as last deployed: \
             not read)\n",
            scope.unchanged_resources
        ),
    };
    format!(
        "{} @ {}\n{}  {} to create, {} to update, {} may update, {} pinned, {} unchanged, {} to delete\n{unread}",
        plan.env,
        short(commit),
        t.render("  "),
        plan.count(Action::Create),
        plan.count(Action::Update),
        plan.count(Action::MaybeUpdate),
        plan.count(Action::Pinned),
        plan.count(Action::Unchanged) as i64 + scope.unchanged_resources,
        plan.count(Action::Delete),
    )
}

pub fn plan_json(plan: &Plan, scope: &Scope, commit: &str) -> Value {
    json!({
        "env": plan.env,
        "commit": commit,
        // Apps whose files and definitions are as last deployed are not read: their resources
        // are unchanged and not listed in `steps`.
        "unchanged_apps": scope.unchanged_apps,
        "unchanged_resources": scope.unchanged_resources,
        "steps": plan.steps.iter().map(|s| json!({
            "guresid": s.guresid.as_str(),
            "app": s.app,
            "type": s.res_type,
            "class": s.class,
            "id": s.res_id,
            "action": s.action.as_str(),
            "reason": s.reason,
            "known_after_apply": s.known_after_apply,
            "changes": s.changes,
        })).collect::<Vec<_>>(),
    })
}

/// Who reconciles an environment, when daemons share a PostgreSQL state: `null` without a
/// lease.
fn lease_json(lease: Option<&LeaseRecord>) -> Value {
    match lease {
        Some(l) => json!({
            "daemon": l.daemon,
            "generation": l.generation,
            "expires_at": l.expires_at,
            "current": l.current,
        }),
        None => Value::Null,
    }
}

/// `lease: held by host:pid (generation N) until T`, `lease: free (expired T)`, or, for a
/// lease its holder gave up (it names no daemon), `lease: free (given up)`.
pub fn lease_line(lease: &LeaseRecord) -> String {
    if lease.daemon.is_empty() {
        "lease: free (given up)".to_owned()
    } else if lease.current {
        format!(
            "lease: held by {} (generation {}) until {}",
            lease.daemon, lease.generation, lease.expires_at
        )
    } else {
        format!("lease: free (expired {})", lease.expires_at)
    }
}

/// One environment in `status --format json`. `lease` is given for a PostgreSQL state only
/// (`Some(None)`: no daemon holds one): a SQLite state has no leases, and its output no key.
pub fn status_json(
    env: &str,
    commit: Option<&str>,
    lease: Option<Option<&LeaseRecord>>,
    resources: &[ResourceRecord],
) -> Value {
    let mut status = json!({
        "env": env,
        "commit": commit,
        "resources": resources.iter().map(|r| json!({
            "guresid": r.guresid,
            "app": r.app,
            "type": r.res_type,
            "class": r.class,
            "id": r.res_id,
            "definition": r.definition,
            "driver": r.driver,
            "status": r.status.as_str(),
            // Only non-secret outputs are ever recorded in this column.
            "outputs": r.outputs,
        })).collect::<Vec<_>>(),
    });
    if let Some(fields) = status.as_object_mut() {
        let apps = app_summaries(resources)
            .into_iter()
            .map(|a| {
                json!({
                    "app": a.app,
                    "status": a.status(),
                    "resources": a.resources,
                    "failed": a.failed,
                    "ready": a.resources - a.failed,
                })
            })
            .collect::<Vec<_>>();
        fields.insert("apps".to_owned(), Value::Array(apps));
        if let Some(lease) = lease {
            fields.insert("lease".to_owned(), lease_json(lease));
        }
    }
    status
}

/// One app of an environment at a glance: how many resources, how many failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSummary {
    /// `-` for the environment's global resources.
    pub app: String,
    pub resources: usize,
    pub failed: usize,
}

impl AppSummary {
    /// The app's worst resource status.
    pub fn status(&self) -> &'static str {
        if self.failed > 0 { "failed" } else { "ready" }
    }
}

/// Each app of `resources`, worst first (most failed resources), then by name.
pub fn app_summaries(resources: &[ResourceRecord]) -> Vec<AppSummary> {
    let mut by_app: std::collections::BTreeMap<&str, AppSummary> = Default::default();
    for r in resources {
        let app = r.app.as_deref().unwrap_or("-");
        let summary = by_app.entry(app).or_insert_with(|| AppSummary {
            app: app.to_owned(),
            resources: 0,
            failed: 0,
        });
        summary.resources += 1;
        if r.status == gitplane_state::ResourceStatus::Failed {
            summary.failed += 1;
        }
    }
    let mut apps: Vec<AppSummary> = by_app.into_values().collect();
    apps.sort_by(|a, b| b.failed.cmp(&a.failed).then_with(|| a.app.cmp(&b.app)));
    apps
}

/// The one-line-per-app summary `status` prints above the table: `  shop  6 resources: 1
/// failed, 5 ready  FAILED`.
fn app_lines(resources: &[ResourceRecord]) -> String {
    let mut t = Table::new(&["APP", "RESOURCES", "STATUS"]);
    for a in app_summaries(resources) {
        let counts = match a.failed {
            0 => format!("{} ready", a.resources),
            failed => format!("{failed} failed, {} ready", a.resources - failed),
        };
        let status = a.status().to_uppercase();
        t.row(vec![a.app, counts, status]);
    }
    t.render("  ")
}

pub fn status_table(
    env: &str,
    commit: Option<&str>,
    latest: Option<&DeploymentRecord>,
    lease: Option<&LeaseRecord>,
    resources: &[ResourceRecord],
) -> String {
    let mut t = Table::new(&[
        "APP",
        "TYPE",
        "CLASS",
        "ID",
        "STATUS",
        "DEFINITION",
        "GURESID",
    ]);
    for r in resources {
        t.row(vec![
            r.app.clone().unwrap_or_else(|| "-".into()),
            r.res_type.clone(),
            r.class.clone(),
            r.res_id.clone(),
            r.status.as_str().to_owned(),
            r.definition.clone(),
            r.guresid.clone(),
        ]);
    }
    let last = match latest {
        Some(d) => format!(
            "last deployment {} {} at {}",
            d.id,
            d.status.as_str(),
            d.finished_at.as_deref().unwrap_or(&d.started_at)
        ),
        None => "never deployed".to_owned(),
    };
    let lease = lease
        .map(|l| format!("  {}\n", lease_line(l)))
        .unwrap_or_default();
    let apps = if resources.is_empty() {
        String::new()
    } else {
        format!("{}\n", app_lines(resources))
    };
    format!(
        "{env} @ {} ({last}), {} resources\n{lease}{apps}{}",
        commit.map(short).unwrap_or("-"),
        resources.len(),
        t.render("  ")
    )
}

pub fn graph_table(graph: &ResourceGraph, commit: &str) -> String {
    let mut nodes = Table::new(&["RESOURCE", "DEFINITION", "DRIVER", "GURESID"]);
    let mut sorted: Vec<_> = graph.nodes().collect();
    sorted.sort_by_key(|n| n.label());
    for n in &sorted {
        nodes.row(vec![
            n.label(),
            n.definition.clone(),
            n.driver_type.clone(),
            n.guresid.to_string(),
        ]);
    }
    let mut edges = Table::new(&["RESOURCE", "DEPENDS ON", "KIND"]);
    let mut rows: Vec<Vec<String>> = graph
        .edges()
        .iter()
        .map(|e| {
            let label = |id| graph.get(id).map(|n| n.label()).unwrap_or_default();
            vec![label(&e.from), label(&e.to), e.kind.to_string()]
        })
        .collect();
    rows.sort();
    for r in rows {
        edges.row(r);
    }
    format!(
        "{} @ {}: {} resources, {} edges\n{}\n{}",
        graph.env,
        short(commit),
        graph.len(),
        graph.edges().len(),
        nodes.render("  "),
        edges.render("  ")
    )
}

/// One deployment in `history --format json`.
pub fn history_json(d: &DeploymentRecord) -> Value {
    json!({
        "id": d.id,
        "env": d.env,
        "commit": d.commit_id,
        "status": d.status.as_str(),
        "started_at": d.started_at,
        "finished_at": d.finished_at,
        "created": d.counts.created,
        "updated": d.counts.updated,
        "deleted": d.counts.deleted,
        "unchanged": d.counts.unchanged,
        "failed": d.counts.failed,
        "held": d.held,
        "attempt": d.attempt,
    })
}

pub fn history_table(deployments: &[DeploymentRecord]) -> String {
    let mut t = Table::new(&[
        "ID", "ENV", "COMMIT", "STATUS", "STARTED", "FINISHED", "CREATED", "UPDATED", "DELETED",
        "FAILED",
    ]);
    for d in deployments {
        t.row(vec![
            d.id.to_string(),
            d.env.clone(),
            d.commit_id.as_deref().map(short).unwrap_or("-").to_owned(),
            // A retry by the daemon of a deployment that did not finish says which.
            match d.attempt {
                1 => d.status.as_str().to_owned(),
                n => format!("{} (retry {})", d.status.as_str(), n - 1),
            },
            d.started_at.clone(),
            d.finished_at.clone().unwrap_or_else(|| "-".into()),
            d.counts.created.to_string(),
            d.counts.updated.to_string(),
            d.counts.deleted.to_string(),
            d.counts.failed.to_string(),
        ]);
    }
    t.render("")
}

/// `development (6 resources, 7 edges), production (...)`: what a valid commit builds.
pub fn built_summary(built: &crate::deploy::Built) -> String {
    built
        .graphs
        .iter()
        .map(|g| {
            format!(
                "{} ({} resources, {} edges)",
                g.env,
                g.len(),
                g.edges().len()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_reads_as_held_expired_or_given_up() {
        let lease = |daemon: &str, current: bool| LeaseRecord {
            env: "dev".into(),
            daemon: daemon.into(),
            generation: 4,
            expires_at: "2026-01-01T00:00:15.000Z".into(),
            current,
        };
        assert_eq!(
            lease_line(&lease("mgmt-a:41", true)),
            "lease: held by mgmt-a:41 (generation 4) until 2026-01-01T00:00:15.000Z"
        );
        assert_eq!(
            lease_line(&lease("mgmt-a:41", false)),
            "lease: free (expired 2026-01-01T00:00:15.000Z)"
        );
        assert_eq!(lease_line(&lease("", false)), "lease: free (given up)");
        assert_eq!(lease_json(None), Value::Null);
        assert_eq!(lease_json(Some(&lease("mgmt-a:41", true)))["current"], true);
    }
}
