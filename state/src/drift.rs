//! Detect-only drift in the state: the findings of a `drift: detect` run, recorded and read back.
//!
//! A detect run changed nothing, so it is written once, when it is over: its `deployment` row
//! (kind `drift`, `drift_mode = 'detect'`, never `running`, no deletion threshold) and its
//! findings go in one transaction. No cut-off detect run is ever left for an apply to resume,
//! and `last_good_commit`, `latest_deployment` and the `drift` view pass such rows by.

use crate::db::{DbResult, OptionalExtension, Row, params};
use crate::{Result, Store};

/// The longest `detail` kept, in characters: findings are for people, not a copy of outputs.
pub const MAX_DETAIL_CHARS: usize = 2_000;

/// One difference a detect run found for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftFinding {
    pub guresid: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    /// `driver` (its read path answered) or `recorded` (what was recorded, compared).
    pub source: String,
    /// `outputs`, `secret outputs`, `missing` or `inputs`.
    pub what: String,
    /// Which paths differ, with public values only.
    pub detail: String,
}

/// A detect run to record.
#[derive(Debug, Clone)]
pub struct DetectRunRecord<'a> {
    pub env: &'a str,
    pub commit: &'a str,
    /// When it started, as the state writes times (`2026-11-24T10:00:00.000Z`).
    pub started_at: &'a str,
    /// Resources looked at that were as recorded.
    pub unchanged: i64,
    /// Resources that could not be read (their errors are in `error`).
    pub failed: i64,
    pub error: Option<&'a str>,
    pub findings: &'a [DriftFinding],
}

/// A recorded detect run, as `status` and `history` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectRun {
    pub deployment: i64,
    pub env: String,
    pub commit_id: Option<String>,
    pub status: String,
    pub finished_at: Option<String>,
    /// Findings in all, and how many resources they name.
    pub findings: i64,
    pub resources: i64,
}

fn finding_row(r: &Row<'_>) -> DbResult<DriftFinding> {
    Ok(DriftFinding {
        guresid: r.get(0)?,
        app: r.get(1)?,
        res_type: r.get(2)?,
        class: r.get(3)?,
        res_id: r.get(4)?,
        source: r.get(5)?,
        what: r.get(6)?,
        detail: r.get(7)?,
    })
}

const RUN_COLUMNS: &str = "d.id, d.env, d.commit_id, d.status, d.finished_at,
    (SELECT COUNT(*) FROM drift_finding f WHERE f.deployment_id = d.id),
    (SELECT COUNT(DISTINCT f.guresid) FROM drift_finding f WHERE f.deployment_id = d.id)";

fn run_row(r: &Row<'_>) -> DbResult<DetectRun> {
    Ok(DetectRun {
        deployment: r.get(0)?,
        env: r.get(1)?,
        commit_id: r.get(2)?,
        status: r.get(3)?,
        finished_at: r.get(4)?,
        findings: r.get(5)?,
        resources: r.get(6)?,
    })
}

/// `text` cut to [`MAX_DETAIL_CHARS`] characters, saying so.
fn bounded(text: &str) -> String {
    if text.chars().count() <= MAX_DETAIL_CHARS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(MAX_DETAIL_CHARS - 1).collect();
    cut.push('…');
    cut
}

impl Store {
    /// Records a finished detect run and its findings in one transaction; returns its id.
    /// Nothing else of the state changes.
    pub fn record_detect_run(&self, run: &DetectRunRecord<'_>) -> Result<i64> {
        let status = if run.failed == 0 {
            "succeeded"
        } else {
            "failed"
        };
        self.write(|tx| {
            let id = tx
                .prepare_cached(&format!(
                    "INSERT INTO deployment
                       (env, commit_id, kind, drift_mode, status, started_at, finished_at,
                        unchanged, failed, error)
                     VALUES (?1, ?2, 'drift', 'detect', ?3, ?4, {}, ?5, ?6, ?7) RETURNING id",
                    crate::NOW
                ))?
                .insert(params![
                    run.env,
                    run.commit,
                    status,
                    run.started_at,
                    run.unchanged,
                    run.failed,
                    run.error
                ])?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO drift_finding
                   (deployment_id, env, guresid, app, type, class, res_id, source, what, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            for f in run.findings {
                insert.execute(params![
                    id,
                    run.env,
                    f.guresid,
                    f.app,
                    f.res_type,
                    f.class,
                    f.res_id,
                    f.source,
                    f.what,
                    bounded(&f.detail)
                ])?;
            }
            Ok(id)
        })
    }

    /// The findings of detect run `deployment`, by app, type, id and what.
    pub fn drift_findings(&self, deployment: i64) -> Result<Vec<DriftFinding>> {
        self.query(
            "SELECT guresid, app, type, class, res_id, source, what, detail FROM drift_finding
             WHERE deployment_id = ?1 ORDER BY app, type, res_id, what",
            [deployment],
            finding_row,
        )
    }

    /// The newest finished detect run of `env`.
    pub fn last_detect_run(&self, env: &str) -> Result<Option<DetectRun>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM deployment d
                 WHERE d.env = ?1 AND d.kind = 'drift' AND d.drift_mode = 'detect'
                   AND d.status != 'running'
                 ORDER BY d.id DESC LIMIT 1"
            ))
            .and_then(|mut s| s.query_row([env], run_row).optional())
            .map_err(self.err())
    }

    /// Every detect run, of `env` when given, newest first.
    pub fn detect_runs(&self, env: Option<&str>) -> Result<Vec<DetectRun>> {
        self.query(
            &format!(
                "SELECT {RUN_COLUMNS} FROM deployment d
                 WHERE (CAST(?1 AS TEXT) IS NULL OR d.env = ?1) AND d.kind = 'drift'
                   AND d.drift_mode = 'detect'
                 ORDER BY d.id DESC"
            ),
            [env],
            run_row,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::each_backend;

    fn finding(guresid: &str, what: &str, detail: &str) -> DriftFinding {
        DriftFinding {
            guresid: guresid.into(),
            app: Some("shop".into()),
            res_type: "postgres".into(),
            class: "default".into(),
            res_id: "shared.db".into(),
            source: "driver".into(),
            what: what.into(),
            detail: detail.into(),
        }
    }

    #[test]
    fn a_detect_run_is_recorded_whole_and_passed_by_where_the_commit_in_force_is_asked() {
        each_backend(|mut store| {
            let (d1, _) = store
                .begin_or_resume_deployment("development", "c1", false, 50.0)
                .unwrap();
            store
                .finish_deployment(
                    d1,
                    crate::DeploymentStatus::Succeeded,
                    &Default::default(),
                    None,
                )
                .unwrap();
            let findings = [
                finding("g1", "outputs", "host: \"a\" → \"b\""),
                finding("g1", "secret outputs", "password"),
                finding("g2", "missing", "the driver says it does not exist"),
                finding("g3", "inputs", &"x".repeat(5_000)),
            ];
            let id = store
                .record_detect_run(&DetectRunRecord {
                    env: "development",
                    commit: "c1",
                    started_at: "2026-11-24T10:00:00.000Z",
                    unchanged: 2,
                    failed: 0,
                    error: None,
                    findings: &findings,
                })
                .unwrap();
            assert!(id > d1);
            let read = store.drift_findings(id).unwrap();
            assert_eq!(read.len(), 4);
            assert_eq!(read[0].what, "inputs");
            let long = read.iter().find(|f| f.what == "inputs").unwrap();
            assert_eq!(long.detail.chars().count(), MAX_DETAIL_CHARS);
            let run = store.last_detect_run("development").unwrap().unwrap();
            assert_eq!((run.deployment, run.findings, run.resources), (id, 4, 3));
            assert_eq!(run.status, "succeeded");
            assert!(store.last_detect_run("production").unwrap().is_none());
            assert_eq!(store.detect_runs(None).unwrap(), [run]);
            // The environment is as deployment d1 left it.
            assert_eq!(
                store.latest_deployment("development").unwrap().unwrap().id,
                d1
            );
            // A later commit's deployment is a new one, never a resumed detect run.
            let (d2, resumed) = store
                .begin_or_resume_deployment("development", "c1", false, 50.0)
                .unwrap();
            assert!(!resumed && d2 > id);
        });
    }

    #[test]
    fn the_detected_view_shows_the_newest_detect_run_and_the_drift_view_ignores_it() {
        each_backend(|mut store| {
            let (d1, _) = store
                .begin_or_resume_deployment("development", "c1", true, 50.0)
                .unwrap();
            // The correcting run repaired g9.
            store
                .conn
                .execute(
                    &format!(
                        "INSERT INTO operation (deployment_id, guresid, app, type, class, res_id,
                                                action, reason, status, outputs_changed,
                                                started_at, finished_at)
                         VALUES (?1, 'g9', 'shop', 'postgres', 'default', 'shared.db', 'update',
                                 'drift run', 'succeeded', 1, {NOW}, {NOW})",
                        NOW = crate::NOW
                    ),
                    [d1],
                )
                .unwrap();
            store
                .finish_deployment(
                    d1,
                    crate::DeploymentStatus::Succeeded,
                    &Default::default(),
                    None,
                )
                .unwrap();
            let first = [finding("g1", "outputs", "host")];
            fn record(findings: &[DriftFinding]) -> DetectRunRecord<'_> {
                DetectRunRecord {
                    env: "development",
                    commit: "c1",
                    started_at: "2026-11-24T10:00:00.000Z",
                    unchanged: 0,
                    failed: 0,
                    error: None,
                    findings,
                }
            }
            store.record_detect_run(&record(&first)).unwrap();
            let second = [finding("g2", "missing", "gone")];
            let id = store.record_detect_run(&record(&second)).unwrap();
            let report = store
                .report(crate::ReportView::DriftDetected, &Default::default())
                .unwrap();
            assert_eq!(report.rows.len(), 1, "{report:?}");
            let guresid = report.columns.iter().position(|c| c == "guresid").unwrap();
            assert_eq!(
                report.rows[0][guresid],
                crate::ReportCell::Text("g2".into())
            );
            let deployment = report
                .columns
                .iter()
                .position(|c| c == "deployment_id")
                .unwrap();
            assert_eq!(report.rows[0][deployment], crate::ReportCell::Integer(id));
            // The correcting run's view still reads the correcting run.
            let drift = store
                .report(crate::ReportView::Drift, &Default::default())
                .unwrap();
            assert_eq!(drift.rows.len(), 1, "{drift:?}");
            let guresid = drift.columns.iter().position(|c| c == "guresid").unwrap();
            assert_eq!(drift.rows[0][guresid], crate::ReportCell::Text("g9".into()));
        });
    }
}
