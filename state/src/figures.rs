//! What the daemon's metrics read from state at each scrape: per environment its resources by
//! status, held deployments, last success, and what its condition is made of (the newest
//! finished deployment, a running one, a pin, the newest detect run's findings). Read from state
//! rather than counted in memory, so they are right after a restart and after a CLI `approve`;
//! each is one grouped query over the deployment, pin or finding tables, never over resources
//! but for the one count by status.

use crate::db::params;
use crate::{Result, Store};

/// The state's figures at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Every environment with resources or deployments recorded.
    pub envs: Vec<String>,
    /// `(env, status, count)`: status is `ready`, `failed` or `orphaned` (no longer in the
    /// graph, kept by its deletion policy or the guard).
    pub resources: Vec<(String, String, i64)>,
    /// `(env, held deployments)`, for environments that have any.
    pub held: Vec<(String, i64)>,
    /// `(env, seconds since the epoch)` of each environment's newest succeeded deployment.
    pub last_success: Vec<(String, f64)>,
    /// `(env, status)` of each environment's newest finished deployment (`succeeded`, `failed`
    /// or `held`): detect-only drift runs (they change nothing) and held deployments a newer
    /// commit superseded are passed by, so a failure stays the last word until a deployment
    /// succeeds, however long ago it was.
    pub last_finished: Vec<(String, String)>,
    /// Environments with a deployment running.
    pub running: Vec<String>,
    /// `(env, attempt)` of each environment's newest deployment of a commit: 1 for a first
    /// attempt, 2 for the first retry (`retry.deployments`).
    pub attempts: Vec<(String, i64)>,
    /// Environments a pin holds (`gitplane rollback` or `pin`, until `unpin`).
    pub pinned: Vec<String>,
    /// `(env, findings)` of each environment's newest detect-only drift run.
    pub drift_findings: Vec<(String, i64)>,
    /// `(env, commit)`: the commit each environment's recorded state comes from (its newest
    /// succeeded deployment's, else that of the newest one that reached the drivers, as
    /// `status` says), preview environments left out (their commits are branch heads).
    pub commits: Vec<(String, String)>,
}

impl Store {
    /// Reads the [`Figures`]: a few grouped queries, each one pass over an index.
    pub fn figures(&self) -> Result<Figures> {
        let envs = self.environments()?;
        let resources = self.resource_counts()?;
        let held = self.query(
            "SELECT env, COUNT(*) FROM deployment WHERE status = 'held' GROUP BY env ORDER BY env",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let last_success = self.query(
            "SELECT env, (julianday(MAX(finished_at)) - 2440587.5) * 86400.0
             FROM deployment WHERE status = 'succeeded' AND finished_at IS NOT NULL
             GROUP BY env ORDER BY env",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let last_finished = self.query(
            "SELECT d.env, d.status FROM deployment d
             JOIN (SELECT env, MAX(id) AS id FROM deployment
                   WHERE status IN ('succeeded', 'failed', 'held') AND drift_mode IS NULL
                   GROUP BY env) m ON m.id = d.id
             ORDER BY d.env",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let running = self.query(
            "SELECT DISTINCT env FROM deployment WHERE status = 'running' ORDER BY env",
            params![],
            |r| r.get(0),
        )?;
        let attempts = self.query(
            "SELECT d.env, d.attempt FROM deployment d
             JOIN (SELECT env, MAX(id) AS id FROM deployment WHERE kind = 'commit' GROUP BY env) m
               ON m.id = d.id
             ORDER BY d.env",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let pinned = self.query(
            "SELECT env FROM env_pin WHERE unpinned_at IS NULL ORDER BY env",
            params![],
            |r| r.get(0),
        )?;
        // Detect runs are written whole when they end (never `running`).
        let drift_findings = self.query(
            "SELECT m.env, (SELECT COUNT(*) FROM drift_finding f WHERE f.deployment_id = m.id)
             FROM (SELECT env, MAX(id) AS id FROM deployment
                   WHERE kind = 'drift' AND drift_mode = 'detect' GROUP BY env) m
             ORDER BY m.env",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let commits: Vec<(String, Option<String>)> = self.query(
            "SELECT e.env, COALESCE(
                 (SELECT d.commit_id FROM deployment d
                  WHERE d.env = e.env AND d.status = 'succeeded' AND d.drift_mode IS NULL
                  ORDER BY d.id DESC LIMIT 1),
                 (SELECT d.commit_id FROM deployment d
                  WHERE d.env = e.env AND d.drift_mode IS NULL
                    AND d.created + d.updated + d.deleted + d.unchanged + d.failed > 0
                  ORDER BY d.id DESC LIMIT 1))
             FROM (SELECT DISTINCT env FROM deployment
                   WHERE env NOT IN (SELECT env FROM preview)) e
             ORDER BY e.env",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Figures {
            envs,
            resources,
            held,
            last_success,
            last_finished,
            running,
            attempts,
            pinned,
            drift_findings,
            commits: commits
                .into_iter()
                .filter_map(|(env, commit)| Some((env, commit?)))
                .collect(),
        })
    }

    /// `(env, status, count)` of every environment's resources: status is `ready`, `failed` or
    /// `orphaned` (no longer in the graph, kept by its deletion policy or the guard).
    pub fn resource_counts(&self) -> Result<Vec<(String, String, i64)>> {
        self.query(
            "SELECT env, CASE WHEN orphan_since IS NOT NULL THEN 'orphaned' ELSE status END AS s,
                    COUNT(*)
             FROM resource GROUP BY env, s ORDER BY env, s",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
    }

    /// The resources whose outputs `deployment` changed: for a drift run, what had drifted.
    pub fn outputs_changed(&self, deployment: i64) -> Result<Vec<String>> {
        self.query(
            "SELECT guresid FROM operation
             WHERE deployment_id = ?1 AND status = 'succeeded' AND outputs_changed = 1
             ORDER BY guresid",
            [deployment],
            |r| r.get(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::Store;
    use crate::tests::each_backend;

    /// A deployment row: `(id, env, commit, kind, drift_mode, status, resources reached, attempt)`.
    type Row = (
        i64,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        i64,
        i64,
    );

    fn insert(store: &Store, rows: &[Row]) {
        for (id, env, commit, kind, mode, status, reached, attempt) in rows {
            let finished = if *status == "running" {
                "NULL".to_owned()
            } else {
                format!("'2026-11-24T10:00:{id:02}.000Z'")
            };
            let mode = if mode.is_empty() {
                "NULL".to_owned()
            } else {
                format!("'{mode}'")
            };
            store
                .conn
                .execute_batch(&format!(
                    "INSERT INTO deployment (id, env, commit_id, kind, drift_mode, status,
                        started_at, finished_at, unchanged, attempt)
                     VALUES ({id}, '{env}', '{commit}', '{kind}', {mode}, '{status}',
                        '2026-11-24T10:00:00.000Z', {finished}, {reached}, {attempt})"
                ))
                .unwrap();
        }
    }

    #[test]
    fn an_environments_condition_is_read_from_its_newest_deployments_pin_and_detect_run() {
        each_backend(|store| {
            insert(
                &store,
                &[
                    // dev: succeeded, then failed twice (a retry), then a detect run found two
                    // differences: still failing, the detect run passed by.
                    (1, "dev", "c1", "commit", "", "succeeded", 3, 1),
                    (2, "dev", "c2", "commit", "", "failed", 3, 1),
                    (3, "dev", "c2", "commit", "", "failed", 3, 2),
                    (4, "dev", "c1", "drift", "detect", "succeeded", 3, 1),
                    // prod: succeeded; a held deployment superseded by one now running.
                    (5, "prod", "c1", "commit", "", "succeeded", 3, 1),
                    (6, "prod", "c2", "commit", "", "superseded", 0, 1),
                    (7, "prod", "c3", "commit", "", "running", 0, 1),
                    // qa: a commit that never built, nothing ever reached a driver.
                    (8, "qa", "c4", "commit", "", "failed", 0, 1),
                    // a preview: its commit is its branch's.
                    (9, "pr-1", "c9", "commit", "", "succeeded", 1, 1),
                ],
            );
            store
                .conn
                .execute_batch(
                    "INSERT INTO drift_finding (deployment_id, env, guresid, type, class, res_id,
                        source, what, detail)
                     VALUES (4, 'dev', 'g1', 'postgres', 'default', 'db', 'driver', 'outputs', 'host'),
                            (4, 'dev', 'g1', 'postgres', 'default', 'db', 'driver', 'missing', '');
                     INSERT INTO env_pin (env, pinned_at, commit_id, pinned_by, reason)
                     VALUES ('prod', '2026-11-24T10:00:00.000Z', 'c1', 'alice', 'freeze');
                     INSERT INTO env_pin (env, pinned_at, commit_id, pinned_by, reason, unpinned_by,
                        unpinned_at)
                     VALUES ('qa', '2026-11-23T10:00:00.000Z', 'c0', 'bob', 'old', 'bob',
                        '2026-11-23T11:00:00.000Z');
                     INSERT INTO preview (env, branch, env_type, created_at, pushed_at)
                     VALUES ('pr-1', 'refs/heads/pr-1', 'preview', '2026-11-24T10:00:00.000Z',
                        '2026-11-24T10:00:00.000Z');",
                )
                .unwrap();
            let f = store.figures().unwrap();
            let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
                v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
            };
            assert_eq!(
                f.last_finished,
                pairs(&[
                    ("dev", "failed"),
                    ("pr-1", "succeeded"),
                    ("prod", "succeeded"),
                    ("qa", "failed")
                ])
            );
            assert_eq!(f.running, ["prod"]);
            assert_eq!(
                f.attempts,
                [
                    ("dev".to_owned(), 2),
                    ("pr-1".to_owned(), 1),
                    ("prod".to_owned(), 1),
                    ("qa".to_owned(), 1)
                ]
            );
            assert_eq!(f.pinned, ["prod"]);
            assert_eq!(f.drift_findings, [("dev".to_owned(), 2)]);
            assert_eq!(f.commits, pairs(&[("dev", "c1"), ("prod", "c1")]));
        });
    }

    /// The scrape's reads at the scale the status page is held to: 50 000 resources in 20
    /// environments with 2 000 deployments.
    #[test]
    fn figures_of_50_000_resources_read_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        store
            .conn
            .execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
                 INSERT INTO deployment (id, env, commit_id, kind, status, started_at, finished_at,
                    unchanged)
                 SELECT i, 'env-' || (i % 20), 'c' || i, 'commit',
                        CASE WHEN i % 7 = 0 THEN 'failed' ELSE 'succeeded' END,
                        '2026-11-24T10:00:00.000Z', '2026-11-24T10:01:00.000Z', 2500 FROM n;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000)
                 INSERT INTO resource (guresid, env, app, type, class, res_id, definition, driver,
                    status, inputs_hash, commit_id, deployment_id, created_at, updated_at)
                 SELECT 'g' || i, 'env-' || (i % 20), 'app-' || (i % 300), 'postgres', 'default',
                        'db-' || i, 'pg', 'echo',
                        CASE WHEN i % 97 = 0 THEN 'failed' ELSE 'ready' END, 'h', 'c1', 1,
                        '2026-11-24T10:00:00.000Z', '2026-11-24T10:00:00.000Z' FROM n;",
            )
            .unwrap();
        store.figures().unwrap();
        let started = Instant::now();
        let f = store.figures().unwrap();
        let took = started.elapsed();
        eprintln!("figures of 50 000 resources: {took:?}");
        assert_eq!(f.envs.len(), 20);
        assert_eq!(f.last_finished.len(), 20);
        assert_eq!(f.resources.iter().map(|(_, _, n)| n).sum::<i64>(), 50_000);
        // Generous for a shared CI machine; it takes a few milliseconds.
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}
