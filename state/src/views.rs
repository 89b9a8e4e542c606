//! What the daemon's status page reads: recent deployments with the driver calls they made,
//! held ones, failed and in-progress resources, and one resource's record, each from one pass
//! over an index and never a secret value.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

use crate::db::{DbResult, OptionalExtension, Row, params};
use crate::{DeploymentRecord, LinkRecord, Result, Store, damaged, deployment_row};

/// A deployment as the status page lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentSummary {
    pub record: DeploymentRecord,
    /// `commit` or `drift`.
    pub kind: String,
    /// Driver calls made (`SUM(operation.attempts)`): polls and retries included.
    pub calls: i64,
}

/// A resource whose last driver call failed, with the driver's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedResource {
    pub guresid: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub error: Option<String>,
    pub updated_at: String,
}

/// A resource as a node of the status page's graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub guresid: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    /// `ready`, `failed`, `orphaned` (out of the graph, kept), `in_progress` (an operation
    /// started in a deployment still running) or `blocked` (a ghost whose create was skipped).
    pub status: &'static str,
    /// Not recorded yet: a create in progress, or a ghost (`blocked`, or `failed` before it
    /// was made).
    pub recorded: bool,
    /// Why a ghost is not there: the skipped or failed operation's message.
    pub reason: Option<String>,
}

/// How many graph nodes of one app and type have one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCount {
    pub app: Option<String>,
    pub res_type: String,
    pub status: &'static str,
    pub count: usize,
}

/// The graph nodes of an environment counted, for the status page's filters and app list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCensus {
    /// Every node of the environment, by type.
    pub types: BTreeMap<String, usize>,
    /// The nodes of the type asked for (of every type when none), by app (`None`: of no app)
    /// and status (as [`NodeRow::status`]; no zero counts).
    pub apps: BTreeMap<Option<String>, BTreeMap<&'static str, usize>>,
}

impl NodeCensus {
    /// The census of `counts` (nodes by app, type and status), its apps of `res_type`'s
    /// nodes alone when given.
    pub fn of_counts(counts: &[NodeCount], res_type: Option<&str>) -> Self {
        let mut census = NodeCensus::default();
        for c in counts {
            *census.types.entry(c.res_type.clone()).or_default() += c.count;
            if res_type.is_none_or(|t| t == c.res_type) {
                census.add(c.app.clone(), c.status, c.count);
            }
        }
        census
    }

    /// How many nodes there are.
    pub fn total(&self) -> usize {
        self.types.values().sum()
    }

    fn add(&mut self, app: Option<String>, status: &'static str, n: usize) {
        if n > 0 {
            *self.apps.entry(app).or_default().entry(status).or_default() += n;
        }
    }

    fn take(&mut self, app: &Option<String>, status: &'static str, n: usize) {
        if let Some(statuses) = self.apps.get_mut(app)
            && let Some(count) = statuses.get_mut(status)
        {
            *count = count.saturating_sub(n);
            if *count == 0 {
                statuses.remove(status);
            }
        }
    }
}

/// Which app's nodes [`Store::graph_nodes_of`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppFilter<'a> {
    All,
    /// The resources of no app.
    NoApp,
    App(&'a str),
}

/// One resource's record, its secret columns left out.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceView {
    pub guresid: String,
    pub env: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub definition: String,
    pub driver: String,
    pub account: Option<String>,
    pub deletion_policy: String,
    pub status: String,
    pub error: Option<String>,
    /// Non-secret outputs, a JSON object.
    pub outputs: Value,
    /// Non-secret inputs last sent: `{"values", "resource"}`.
    pub inputs: Value,
    pub commit_id: String,
    pub deployment_id: i64,
    pub created_at: String,
    pub updated_at: String,
    pub orphan_since: Option<String>,
    pub orphan_reason: Option<String>,
}

/// The columns [`deployment_row`] reads, then the kind and the calls made.
const SUMMARY_COLUMNS: &str = "d.id, d.env, d.commit_id, d.status, d.started_at, d.finished_at,
    d.created, d.updated, d.deleted, d.unchanged, d.failed, d.error, d.held, d.attempt, d.kind,
    (SELECT COALESCE(SUM(o.attempts), 0) FROM operation o WHERE o.deployment_id = d.id)";

fn summary_row(r: &Row<'_>) -> DbResult<DeploymentSummary> {
    Ok(DeploymentSummary {
        record: deployment_row(r)?,
        kind: r.get(14)?,
        calls: r.get(15)?,
    })
}

impl Store {
    /// The newest `limit` deployments of `env`, newest first, with the calls each made.
    pub fn recent_deployments(&self, env: &str, limit: usize) -> Result<Vec<DeploymentSummary>> {
        self.query(
            &format!(
                "SELECT {SUMMARY_COLUMNS} FROM deployment d WHERE d.env = ?1
                 ORDER BY d.id DESC LIMIT ?2"
            ),
            params![env, limit as i64],
            summary_row,
        )
    }

    /// The deployments of `env` the deletion guard holds (waiting for `gitplane approve`),
    /// newest first.
    pub fn held_deployments(&self, env: &str) -> Result<Vec<DeploymentSummary>> {
        self.query(
            &format!(
                "SELECT {SUMMARY_COLUMNS} FROM deployment d
                 WHERE d.env = ?1 AND d.status = 'held' ORDER BY d.id DESC"
            ),
            [env],
            summary_row,
        )
    }

    /// The resources of `env` whose last driver call failed, at most `limit`, by app, type
    /// and id; and how many there are in all.
    pub fn failed_resources(&self, env: &str, limit: usize) -> Result<(Vec<FailedResource>, i64)> {
        let failed = self.query(
            "SELECT guresid, app, type, class, res_id, error, updated_at FROM resource
             WHERE env = ?1 AND status = 'failed' ORDER BY app, type, res_id LIMIT ?2",
            params![env, limit as i64],
            |r| {
                Ok(FailedResource {
                    guresid: r.get(0)?,
                    app: r.get(1)?,
                    res_type: r.get(2)?,
                    class: r.get(3)?,
                    res_id: r.get(4)?,
                    error: r.get(5)?,
                    updated_at: r.get(6)?,
                })
            },
        )?;
        let total = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM resource WHERE env = ?1 AND status = 'failed'")
            .and_then(|mut s| s.query_row([env], |r| r.get(0)))
            .map_err(self.err())?;
        Ok((failed, total))
    }

    /// Every resource of `env` as a graph node, by GUResID: the recorded ones, those a
    /// running deployment is creating (in progress, not recorded yet), and the ghosts of the
    /// newest finished deployment (see [`Store::graph_nodes_of`]).
    pub fn graph_nodes(&self, env: &str) -> Result<Vec<NodeRow>> {
        self.graph_nodes_of(env, AppFilter::All, None)
    }

    /// The graph nodes of `env` that `app` (and `res_type`, when given) keeps, by GUResID. Besides the recorded resources
    /// (read through the `(env, app)` index when one app is asked for): those a running
    /// deployment is creating (`in_progress`), and ghosts: resources the newest finished
    /// deployment of a commit wanted but state does not record, because their operation was
    /// skipped (`blocked`: something they depend on failed, or the run stopped first) or
    /// failed before the resource existed (`failed`); `reason` says why.
    pub fn graph_nodes_of(
        &self,
        env: &str,
        app: AppFilter<'_>,
        res_type: Option<&str>,
    ) -> Result<Vec<NodeRow>> {
        let (mut in_progress, mut ghosts) = self.unrecorded_nodes(env, app)?;
        if let Some(t) = res_type {
            in_progress.retain(|_, n| n.res_type == t);
            ghosts.retain(|_, n| n.res_type == t);
        }
        let node = |r: &Row<'_>| {
            let guresid: String = r.get(0)?;
            let status = match (r.get::<_, String>(5)?.as_str(), r.get::<_, bool>(6)?) {
                (_, true) => "orphaned",
                ("ready", false) => "ready",
                ("failed", false) => "failed",
                (other, false) => {
                    return Err(damaged(
                        "resource",
                        guresid,
                        format!("status '{other}' is neither 'ready' nor 'failed'"),
                    ));
                }
            };
            Ok(NodeRow {
                guresid,
                app: r.get(1)?,
                res_type: r.get(2)?,
                class: r.get(3)?,
                res_id: r.get(4)?,
                status,
                recorded: true,
                reason: None,
            })
        };
        const COLUMNS: &str =
            "SELECT guresid, app, type, class, res_id, status, orphan_since IS NOT NULL";
        // The type is checked in the (env, app, type) index before a row is read.
        const TYPE: &str = "(CAST(?2 AS TEXT) IS NULL OR type = ?2)";
        let mut nodes = match app {
            AppFilter::All => self.query(
                &format!("{COLUMNS} FROM resource WHERE env = ?1 AND {TYPE} ORDER BY guresid"),
                params![env, res_type],
                node,
            )?,
            AppFilter::NoApp => self.query(
                &format!(
                    "{COLUMNS} FROM resource WHERE env = ?1 AND app IS NULL AND {TYPE}
                     ORDER BY guresid"
                ),
                params![env, res_type],
                node,
            )?,
            AppFilter::App(name) => self.query(
                &format!(
                    "{COLUMNS} FROM resource WHERE env = ?1 AND app = ?3 AND {TYPE}
                     ORDER BY guresid"
                ),
                params![env, res_type, name],
                node,
            )?,
        };
        for node in &mut nodes {
            if in_progress.remove(&node.guresid).is_some() {
                node.status = "in_progress";
            }
            // Recorded after all (made by a later run of another process): no ghost.
            ghosts.remove(&node.guresid);
        }
        if !in_progress.is_empty() || !ghosts.is_empty() {
            nodes.extend(in_progress.into_values());
            nodes.extend(ghosts.into_values());
            nodes.sort_by(|a, b| a.guresid.cmp(&b.guresid));
        }
        Ok(nodes)
    }

    /// The nodes of `env` (of `app`) state may not record: the operations in progress, and
    /// the ghosts of the newest finished deployment of a commit, by GUResID.
    #[allow(clippy::type_complexity)]
    fn unrecorded_nodes(
        &self,
        env: &str,
        app: AppFilter<'_>,
    ) -> Result<(HashMap<String, NodeRow>, HashMap<String, NodeRow>)> {
        let keep = |a: &Option<String>| match app {
            AppFilter::All => true,
            AppFilter::NoApp => a.is_none(),
            AppFilter::App(name) => a.as_deref() == Some(name),
        };
        // The operations started in the running deployments of `env`: a handful of rows,
        // found through the deployment index and then the operation index.
        let running = self.query(
            "SELECT o.guresid, o.app, o.type, o.class, o.res_id
             FROM deployment d JOIN operation o ON o.deployment_id = d.id
             WHERE d.env = ?1 AND d.status = 'running' AND o.status = 'started'",
            [env],
            |r| {
                Ok(NodeRow {
                    guresid: r.get(0)?,
                    app: r.get(1)?,
                    res_type: r.get(2)?,
                    class: r.get(3)?,
                    res_id: r.get(4)?,
                    status: "in_progress",
                    recorded: false,
                    reason: None,
                })
            },
        )?;
        let in_progress: HashMap<String, NodeRow> = running
            .into_iter()
            .filter(|n| keep(&n.app))
            .map(|n| (n.guresid.clone(), n))
            .collect();
        // What the newest finished deployment of a commit could not do: its failed and
        // skipped operations (found through the operation index), the unrecorded ones kept
        // below.
        let missed = self.query(
            "SELECT o.guresid, o.app, o.type, o.class, o.res_id, o.status, o.error
             FROM operation o
             WHERE o.deployment_id = (SELECT MAX(d.id) FROM deployment d
                                      WHERE d.env = ?1 AND d.kind = 'commit'
                                        AND d.status IN ('succeeded', 'failed'))
               AND (o.status = 'failed' OR o.status = 'skipped' OR o.status = 'interrupted')
               AND o.action = 'create'
             ORDER BY o.id",
            [env],
            |r| {
                let status: String = r.get(5)?;
                Ok(NodeRow {
                    guresid: r.get(0)?,
                    app: r.get(1)?,
                    res_type: r.get(2)?,
                    class: r.get(3)?,
                    res_id: r.get(4)?,
                    status: if status == "failed" {
                        "failed"
                    } else {
                        "blocked"
                    },
                    recorded: false,
                    reason: r.get(6)?,
                })
            },
        )?;
        let ghosts: HashMap<String, NodeRow> = missed
            .into_iter()
            .filter(|n| keep(&n.app) && !in_progress.contains_key(&n.guresid))
            .map(|n| (n.guresid.clone(), n))
            .collect();
        Ok((in_progress, ghosts))
    }

    /// Whether state records resources or deployments of `env`: two index seeks.
    pub fn has_environment(&self, env: &str) -> Result<bool> {
        let found = self.query(
            "SELECT 1 WHERE EXISTS (SELECT 1 FROM resource WHERE env = ?1)
                         OR EXISTS (SELECT 1 FROM deployment WHERE env = ?1)",
            [env],
            |r| r.get::<_, i64>(0),
        )?;
        Ok(!found.is_empty())
    }

    /// The nodes of `env` counted (see [`NodeCensus`]) without reading a resource's row: the
    /// `(type, env)` and `(env, app, type)` indexes counted, the failed and orphaned resources
    /// (few) found through their own indexes, and the unrecorded nodes added.
    pub fn node_census(&self, env: &str, res_type: Option<&str>) -> Result<NodeCensus> {
        let mut census = NodeCensus::default();
        // Read in the `(type, env)` index's order, already grouped: `env || ''` keeps
        // SQLite from reading the rows through `(env, app, type)` and sorting them by type.
        for (t, n) in self.query(
            "SELECT type, COUNT(*) FROM resource WHERE env || '' = ?1 GROUP BY type",
            [env],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        )? {
            census.types.insert(t, n as usize);
        }
        // Every resource of the type counted ready, then those failed or orphaned moved.
        for (app, n) in self.query(
            "SELECT app, COUNT(*) FROM resource
             WHERE env = ?1 AND (CAST(?2 AS TEXT) IS NULL OR type = ?2) GROUP BY app",
            params![env, res_type],
            |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1)?)),
        )? {
            census.add(app, "ready", n as usize);
        }
        let unusual = self.query(
            "SELECT app, type, 'failed' FROM resource
             WHERE env = ?1 AND status = 'failed' AND orphan_since IS NULL
             UNION ALL
             SELECT app, type, 'orphaned' FROM resource
             WHERE env = ?1 AND orphan_since IS NOT NULL",
            [env],
            |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            },
        )?;
        for (app, t, status) in unusual {
            if res_type.is_none_or(|want| want == t) {
                let status = if status == "failed" {
                    "failed"
                } else {
                    "orphaned"
                };
                census.take(&app, "ready", 1);
                census.add(app, status, 1);
            }
        }
        // In progress or ghosts, unless recorded after all: their recorded status counts.
        let (in_progress, ghosts) = self.unrecorded_nodes(env, AppFilter::All)?;
        let recorded: HashSet<String> = {
            let ids: Vec<&str> = in_progress
                .keys()
                .chain(ghosts.keys())
                .map(String::as_str)
                .collect();
            self.recorded_of(env, &ids)?
        };
        for n in in_progress.into_values().chain(ghosts.into_values()) {
            if recorded.contains(&n.guresid) {
                continue;
            }
            *census.types.entry(n.res_type.clone()).or_default() += 1;
            if res_type.is_none_or(|want| want == n.res_type) {
                census.add(n.app, n.status, 1);
            }
        }
        Ok(census)
    }

    /// The current links of `env` with either end among `guresids`, by consumer and provider:
    /// each end found through its own index (`link_current` by consumer,
    /// `link_current_provider` by provider), never by reading the environment's links.
    pub fn links_around(&self, env: &str, guresids: &[&str]) -> Result<Vec<LinkRecord>> {
        if guresids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(guresids).expect("strings serialise");
        // `env || ''` keeps SQLite from reading the provider half through the environment's
        // part of `link_current` (every link of the environment) rather than by provider.
        self.query(
            "SELECT consumer, provider, kind, update_type FROM link
             WHERE env = ?1 AND valid_to IS NULL
               AND consumer IN (SELECT value FROM json_each(?2))
             UNION
             SELECT consumer, provider, kind, update_type FROM link
             WHERE env || '' = ?1 AND valid_to IS NULL
               AND provider IN (SELECT value FROM json_each(?2))
             ORDER BY 1, 2",
            params![env, ids],
            |r| {
                Ok(LinkRecord {
                    consumer: r.get(0)?,
                    provider: r.get(1)?,
                    kind: r.get(2)?,
                    update_type: r.get(3)?,
                })
            },
        )
    }

    /// The recorded resources of `env` among `guresids`, as graph nodes (their status as
    /// recorded), by GUResID: names for the other ends of one resource's links.
    pub fn nodes_named(&self, env: &str, guresids: &[&str]) -> Result<Vec<NodeRow>> {
        if guresids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(guresids).expect("strings serialise");
        self.query(
            "SELECT guresid, app, type, class, res_id, status, orphan_since IS NOT NULL
             FROM resource WHERE env = ?1 AND guresid IN (SELECT value FROM json_each(?2))
             ORDER BY guresid",
            params![env, ids],
            |r| {
                Ok(NodeRow {
                    guresid: r.get(0)?,
                    app: r.get(1)?,
                    res_type: r.get(2)?,
                    class: r.get(3)?,
                    res_id: r.get(4)?,
                    status: match (r.get::<_, String>(5)?.as_str(), r.get::<_, bool>(6)?) {
                        (_, true) => "orphaned",
                        ("failed", false) => "failed",
                        _ => "ready",
                    },
                    recorded: true,
                    reason: None,
                })
            },
        )
    }

    /// Which of `guresids` state records in `env`.
    fn recorded_of(&self, env: &str, guresids: &[&str]) -> Result<HashSet<String>> {
        if guresids.is_empty() {
            return Ok(HashSet::new());
        }
        let ids = serde_json::to_string(guresids).expect("strings serialise");
        Ok(self
            .query(
                "SELECT guresid FROM resource
                 WHERE env = ?1 AND guresid IN (SELECT value FROM json_each(?2))",
                params![env, ids],
                |r| r.get::<_, String>(0),
            )?
            .into_iter()
            .collect())
    }

    /// The record of `guresid` in `env` without its secrets, or `None` when state has none.
    pub fn resource_view(&self, env: &str, guresid: &str) -> Result<Option<ResourceView>> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT guresid, env, app, type, class, res_id, definition, driver, account,
                        deletion_policy, status, error, outputs, inputs, commit_id,
                        deployment_id, created_at, updated_at, orphan_since, orphan_reason
                 FROM resource WHERE guresid = ?1 AND env = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![guresid, env], |r| {
                    Ok((
                        ResourceView {
                            guresid: r.get(0)?,
                            env: r.get(1)?,
                            app: r.get(2)?,
                            res_type: r.get(3)?,
                            class: r.get(4)?,
                            res_id: r.get(5)?,
                            definition: r.get(6)?,
                            driver: r.get(7)?,
                            account: r.get(8)?,
                            deletion_policy: r.get(9)?,
                            status: r.get(10)?,
                            error: r.get(11)?,
                            outputs: Value::Null,
                            inputs: Value::Null,
                            commit_id: r.get(14)?,
                            deployment_id: r.get(15)?,
                            created_at: r.get(16)?,
                            updated_at: r.get(17)?,
                            orphan_since: r.get(18)?,
                            orphan_reason: r.get(19)?,
                        },
                        r.get::<_, String>(12)?,
                        r.get::<_, String>(13)?,
                    ))
                })
                .optional()
            })
            .map_err(self.err())?;
        let Some((mut view, outputs, inputs)) = row else {
            return Ok(None);
        };
        view.outputs = self.json(guresid, "outputs", &outputs)?;
        view.inputs = self.json(guresid, "inputs", &inputs)?;
        Ok(Some(view))
    }

    /// The names of the secret outputs of `guresid`, sorted; their values never leave SQLite.
    /// Needs the state key.
    pub fn secret_output_names(&self, guresid: &str) -> Result<Vec<String>> {
        let sealed: Option<String> = self
            .conn
            .query_row(
                "SELECT outputs FROM resource_secret WHERE guresid = ?1",
                [guresid],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())?;
        let outputs = self.open_sealed(sealed, &format!("resource_secret.outputs:{guresid}"))?;
        let Some(outputs) = outputs else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> =
            match self.json(guresid, "resource_secret.outputs", &outputs)? {
                serde_json::Value::Object(map) => map.into_iter().map(|(k, _)| k).collect(),
                _ => Vec::new(),
            };
        names.sort();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::tests::{record, start};
    use crate::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        (dir, store)
    }

    #[test]
    fn a_deployment_counts_every_driver_call_of_its_operations() {
        crate::tests::each_backend(|mut store| {
            let d = store.begin_deployment("development", "c1").unwrap();
            let op = store.begin_operation(&start(d)).unwrap();
            store.finish_put(op, 3, d, &record("g1"), None).unwrap();
            let op = store
                .begin_operation(&OperationStart {
                    guresid: "g2",
                    ..start(d)
                })
                .unwrap();
            store.finish_put(op, 2, d, &record("g2"), None).unwrap();
            store
                .finish_deployment(d, DeploymentStatus::Succeeded, &Counts::default(), None)
                .unwrap();
            // A deployment that changed nothing made no call.
            let quiet = store.begin_deployment("development", "c2").unwrap();
            let other = store.begin_deployment("production", "c2").unwrap();

            let recent = store.recent_deployments("development", 10).unwrap();
            assert_eq!(
                recent
                    .iter()
                    .map(|d| (d.record.id, d.calls, d.kind.as_str()))
                    .collect::<Vec<_>>(),
                [(quiet, 0, "commit"), (d, 5, "commit")]
            );
            assert_eq!(store.recent_deployments("development", 1).unwrap().len(), 1);
            assert_eq!(
                store.recent_deployments("production", 10).unwrap()[0]
                    .record
                    .id,
                other
            );
        });
    }

    #[test]
    fn held_deployments_say_what_they_would_delete() {
        let (_dir, store) = store();
        let held = store
            .held_deployment(
                "development",
                "c1",
                &["a".into(), "b".into()],
                "2 of 3",
                50.0,
            )
            .unwrap();
        store.begin_deployment("development", "c0").unwrap();
        let found = store.held_deployments("development").unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].record.id, held);
        assert_eq!(
            found[0].record.held,
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(found[0].record.error.as_deref(), Some("2 of 3"));
        assert!(store.held_deployments("production").unwrap().is_empty());
    }

    #[test]
    fn nodes_are_ready_failed_orphaned_or_in_progress() {
        crate::tests::each_backend(|mut store| {
            let d = store.begin_deployment("development", "c1").unwrap();
            for (g, failed) in [("g1", false), ("g2", true), ("g3", false)] {
                let op = store
                    .begin_operation(&OperationStart {
                        guresid: g,
                        ..start(d)
                    })
                    .unwrap();
                let mut rec = record(g);
                if failed {
                    rec.status = ResourceStatus::Failed;
                    rec.error = Some("quota exceeded".into());
                }
                store.finish_put(op, 1, d, &rec, None).unwrap();
            }
            store
                .mark_orphans("development", &[("g3".into(), "kept".into())], None)
                .unwrap();
            store
                .finish_deployment(d, DeploymentStatus::Failed, &Counts::default(), None)
                .unwrap();
            // A running deployment updating g1 and creating g0, not recorded yet.
            let running = store.begin_deployment("development", "c2").unwrap();
            for g in ["g1", "g0"] {
                store
                    .begin_operation(&OperationStart {
                        guresid: g,
                        ..start(running)
                    })
                    .unwrap();
            }

            let nodes = store.graph_nodes("development").unwrap();
            assert_eq!(
                nodes
                    .iter()
                    .map(|n| (n.guresid.as_str(), n.status, n.recorded))
                    .collect::<Vec<_>>(),
                [
                    ("g0", "in_progress", false),
                    ("g1", "in_progress", true),
                    ("g2", "failed", true),
                    ("g3", "orphaned", true),
                ]
            );
            assert_eq!(
                store.resource_counts().unwrap(),
                [
                    ("development".to_owned(), "failed".to_owned(), 1),
                    ("development".to_owned(), "orphaned".to_owned(), 1),
                    ("development".to_owned(), "ready".to_owned(), 1)
                ]
            );
            let census = store.node_census("development", None).unwrap();
            // g1 counts as its recorded status; g0, not recorded, as in progress.
            assert_eq!(
                census.apps[&Some("shop".to_owned())]
                    .iter()
                    .map(|(s, n)| (*s, *n))
                    .collect::<Vec<_>>(),
                [
                    ("failed", 1),
                    ("in_progress", 1),
                    ("orphaned", 1),
                    ("ready", 1)
                ]
            );
            assert_eq!(census.total(), 4);
            let (failed, total) = store.failed_resources("development", 10).unwrap();
            assert_eq!(total, 1);
            assert_eq!(failed[0].guresid, "g2");
            assert_eq!(failed[0].error.as_deref(), Some("quota exceeded"));
            assert!(store.graph_nodes("production").unwrap().is_empty());
        });
    }

    #[test]
    fn a_resource_view_holds_no_secret_and_names_its_secret_outputs() {
        crate::tests::each_backend(|mut store| {
            let d = store.begin_deployment("development", "c1").unwrap();
            let op = store.begin_operation(&start(d)).unwrap();
            store.finish_put(op, 1, d, &record("g1"), None).unwrap();

            let view = store.resource_view("development", "g1").unwrap().unwrap();
            assert_eq!(view.outputs, json!({"host": "db"}));
            assert_eq!(view.inputs, json!({"values": {"host": "db"}}));
            assert_eq!(view.definition, "pg");
            assert!(!format!("{view:?}").contains("s3cret"));
            assert_eq!(store.secret_output_names("g1").unwrap(), ["password"]);
            assert!(store.resource_view("production", "g1").unwrap().is_none());
            assert!(store.secret_output_names("g9").unwrap().is_empty());
        });
    }

    #[test]
    fn ghosts_are_what_the_newest_deployment_wanted_and_did_not_make() {
        crate::tests::each_backend(|mut store| {
            let d = store.begin_deployment("development", "c1").unwrap();
            // Made: the shop's db, and a global dns.
            let op = store.begin_operation(&start(d)).unwrap();
            store.finish_put(op, 1, d, &record("g1"), None).unwrap();
            let op = store
                .begin_operation(&OperationStart {
                    guresid: "dns",
                    app: None,
                    res_type: "dns",
                    res_id: "shared.dns",
                    ..start(d)
                })
                .unwrap();
            let mut dns = record("dns");
            dns.app = None;
            dns.res_type = "dns".into();
            dns.res_id = "shared.dns".into();
            store.finish_put(op, 1, d, &dns, None).unwrap();
            // Not made: billing's queue failed before its driver was called, and its worker
            // was skipped for it.
            let queue = store
                .begin_operation(&OperationStart {
                    guresid: "q1",
                    app: Some("billing"),
                    res_type: "queue",
                    res_id: "modules.worker.externals.jobs",
                    ..start(d)
                })
                .unwrap();
            let worker = store
                .begin_operation(&OperationStart {
                    guresid: "w1",
                    app: Some("billing"),
                    res_type: "workload",
                    res_id: "modules.worker",
                    ..start(d)
                })
                .unwrap();
            store
                .journal(&[
                    JournalEntry::Failed {
                        operation: queue,
                        attempts: 0,
                        error: "values may not read a secret output",
                    },
                    JournalEntry::Skipped {
                        operation: worker,
                        why: "blocked: queue#modules.worker.externals.jobs failed",
                    },
                ])
                .unwrap();
            store
                .record_link_changes(
                    d,
                    "development",
                    &LinkChanges {
                        removed: Vec::new(),
                        added: vec![
                            LinkRecord {
                                consumer: "w1".into(),
                                provider: "q1".into(),
                                kind: "reference".into(),
                                update_type: "NeedsProvides".into(),
                            },
                            LinkRecord {
                                consumer: "g1".into(),
                                provider: "dns".into(),
                                kind: "reference".into(),
                                update_type: "NeedsProvides".into(),
                            },
                        ],
                    },
                )
                .unwrap();
            store
                .finish_deployment(d, DeploymentStatus::Failed, &Counts::default(), None)
                .unwrap();

            let all = store.graph_nodes("development").unwrap();
            assert_eq!(
                all.iter()
                    .map(|n| (
                        n.guresid.as_str(),
                        n.status,
                        n.recorded,
                        n.reason.as_deref()
                    ))
                    .collect::<Vec<_>>(),
                [
                    ("dns", "ready", true, None),
                    ("g1", "ready", true, None),
                    (
                        "q1",
                        "failed",
                        false,
                        Some("values may not read a secret output")
                    ),
                    (
                        "w1",
                        "blocked",
                        false,
                        Some("blocked: queue#modules.worker.externals.jobs failed")
                    ),
                ]
            );
            // One app alone, through the (env, app) index: its ghosts too.
            let billing = store
                .graph_nodes_of("development", AppFilter::App("billing"), None)
                .unwrap();
            assert_eq!(
                billing
                    .iter()
                    .map(|n| n.guresid.as_str())
                    .collect::<Vec<_>>(),
                ["q1", "w1"]
            );
            let global = store
                .graph_nodes_of("development", AppFilter::NoApp, None)
                .unwrap();
            assert_eq!(global.len(), 1);
            assert_eq!(global[0].guresid, "dns");
            // By type, ghosts included.
            let workloads = store
                .graph_nodes_of("development", AppFilter::All, Some("workload"))
                .unwrap();
            assert_eq!(
                workloads
                    .iter()
                    .map(|n| n.guresid.as_str())
                    .collect::<Vec<_>>(),
                ["w1"]
            );
            let shop_dns = store
                .graph_nodes_of("development", AppFilter::App("shop"), Some("dns"))
                .unwrap();
            assert!(shop_dns.is_empty());
            // Its links, and those reaching out of it (to count them), without the rest.
            let shop = store
                .graph_nodes_of("development", AppFilter::App("shop"), None)
                .unwrap();
            assert_eq!(shop.len(), 1);
            let links = store.links_around("development", &["g1"]).unwrap();
            assert_eq!(
                links
                    .iter()
                    .map(|l| (l.consumer.as_str(), l.provider.as_str()))
                    .collect::<Vec<_>>(),
                [("g1", "dns")]
            );
            assert_eq!(
                store.links_around("development", &["dns"]).unwrap().len(),
                1
            );
            assert!(store.links_around("development", &[]).unwrap().is_empty());
            // The census holds the ghosts: by type, and by app and status.
            let census = store.node_census("development", None).unwrap();
            let types: Vec<(&str, usize)> =
                census.types.iter().map(|(t, n)| (t.as_str(), *n)).collect();
            assert_eq!(
                types,
                [("dns", 1), ("postgres", 1), ("queue", 1), ("workload", 1)]
            );
            let apps = |census: &NodeCensus| {
                census
                    .apps
                    .iter()
                    .flat_map(|(a, statuses)| {
                        statuses.iter().map(move |(s, n)| (a.clone(), *s, *n))
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                apps(&census),
                [
                    (None, "ready", 1),
                    (Some("billing".into()), "blocked", 1),
                    (Some("billing".into()), "failed", 1),
                    (Some("shop".into()), "ready", 1),
                ]
            );
            // Of one type: the apps of that type's nodes alone, every type still listed.
            let workloads = store.node_census("development", Some("workload")).unwrap();
            assert_eq!(apps(&workloads), [(Some("billing".into()), "blocked", 1)]);
            assert_eq!(workloads.types, census.types);

            // A later deployment that makes the queue and worker leaves no ghost; a held one
            // (which ran nothing) does not hide the failed one's.
            store
                .held_deployment("development", "c2", &["g1".into()], "1 of 4", 10.0)
                .unwrap();
            assert_eq!(store.graph_nodes("development").unwrap().len(), 4);
            let next = store.begin_deployment("development", "c3").unwrap();
            for g in ["q1", "w1"] {
                let op = store
                    .begin_operation(&OperationStart {
                        guresid: g,
                        ..start(next)
                    })
                    .unwrap();
                store.finish_put(op, 1, next, &record(g), None).unwrap();
            }
            store
                .finish_deployment(next, DeploymentStatus::Succeeded, &Counts::default(), None)
                .unwrap();
            let after = store.graph_nodes("development").unwrap();
            assert!(after.iter().all(|n| n.recorded && n.reason.is_none()));
            assert!(store.graph_nodes("production").unwrap().is_empty());
        });
    }
}
