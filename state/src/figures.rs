//! What the daemon's metrics read from state at each scrape: resources by status, held
//! deployments and the last success, per environment. Read from state rather than counted in
//! memory, so they are right after a restart and after a CLI `approve`.

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
        Ok(Figures {
            envs,
            resources,
            held,
            last_success,
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
