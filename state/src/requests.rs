//! Requests that the running daemons look now (`gitplane reconcile`), their answers, and the
//! daemons a command can reach.
//!
//! A request is a row: the command writes it, the daemon deploying its environment answers it
//! once (an `UPDATE … WHERE answered_at IS NULL`, so two daemons never both answer), and the
//! command reads the answer and the deployments after it. Rows live a day.

use crate::DeploymentRecord;
use crate::db::{Row, params};
use crate::{NOW, Result, Store, deployment_row};

/// A `gitplane reconcile` request, with its answer once a daemon gave one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileRequest {
    pub id: String,
    /// `None`: look at the repository only.
    pub env: Option<String>,
    pub requested_by: String,
    pub requested_at: String,
    pub answer: Option<ReconcileAnswer>,
}

/// What the daemon that took a request did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileAnswer {
    pub answered_by: String,
    pub answered_at: String,
    /// The watched ref's commit it looked at (`None`: it could not read the repository).
    pub commit_id: Option<String>,
    pub action: ReconcileAction,
    /// [`ReconcileAction::Deploying`]: the environment's newest finished deployment then; the
    /// one to wait for comes after it.
    pub after_deployment: Option<i64>,
    pub detail: Option<String>,
}

/// What a daemon did with a request, as recorded in `reconcile_request.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReconcileAction {
    /// It queued a deployment of the commit.
    Deploying,
    /// The environment's newest deployment succeeded at the commit: nothing to do.
    UpToDate,
    /// A pin holds the environment: nothing is deployed until `gitplane unpin`.
    Pinned,
    /// A deployment waits for `gitplane approve`.
    Held,
    /// The commit's secrets cannot be read yet: it deploys when the stores answer.
    Waiting,
    /// A preview environment: deployed from its branch on every push.
    Preview,
    /// No environment of that name is deployed by the daemons.
    Unknown,
    /// A request without an environment: the repository was looked at.
    Looked,
}

impl ReconcileAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileAction::Deploying => "deploying",
            ReconcileAction::UpToDate => "up to date",
            ReconcileAction::Pinned => "pinned",
            ReconcileAction::Held => "held",
            ReconcileAction::Waiting => "waiting",
            ReconcileAction::Preview => "preview",
            ReconcileAction::Unknown => "unknown",
            ReconcileAction::Looked => "looked",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            ReconcileAction::Deploying,
            ReconcileAction::UpToDate,
            ReconcileAction::Pinned,
            ReconcileAction::Held,
            ReconcileAction::Waiting,
            ReconcileAction::Preview,
            ReconcileAction::Unknown,
            ReconcileAction::Looked,
        ]
        .into_iter()
        .find(|a| a.as_str() == text)
    }
}

/// A daemon as it last reported itself in the `daemon` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonRecord {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub started_at: String,
    pub seen_at: String,
}

const REQUEST_COLUMNS: &str = "id, env, requested_by, requested_at, answered_by, answered_at, \
                               commit_id, action, after_deployment, detail";

fn request_of(r: &Row<'_>) -> crate::db::DbResult<ReconcileRequest> {
    let id: String = r.get(0)?;
    let answered_by: Option<String> = r.get(4)?;
    let answer = match answered_by {
        None => None,
        Some(answered_by) => {
            let action: String = r.get(7)?;
            let Some(action) = ReconcileAction::parse(&action) else {
                return Err(crate::damaged(
                    "reconcile_request",
                    id,
                    format!("action '{action}' is not one gitplane writes"),
                ));
            };
            Some(ReconcileAnswer {
                answered_by,
                answered_at: r.get(5)?,
                commit_id: r.get(6)?,
                action,
                after_deployment: r.get(8)?,
                detail: r.get(9)?,
            })
        }
    };
    Ok(ReconcileRequest {
        id,
        env: r.get(1)?,
        requested_by: r.get(2)?,
        requested_at: r.get(3)?,
        answer,
    })
}

impl Store {
    /// Records a request per entry of `envs` (`None`: look at the repository only), by `by`;
    /// their ids, in the order of `envs`.
    pub fn request_reconcile(&self, envs: &[Option<String>], by: &str) -> Result<Vec<String>> {
        let ids: Vec<String> = envs
            .iter()
            .map(|_| format!("{}-{}", crate::lock::host_name(), crate::lock::token()))
            .collect();
        self.write(|tx| {
            let mut insert = tx.prepare_cached(&format!(
                "INSERT INTO reconcile_request (id, env, requested_by, requested_at)
                 VALUES (?1, ?2, ?3, {NOW})"
            ))?;
            for (id, env) in ids.iter().zip(envs) {
                insert.execute(params![id, env, by])?;
            }
            Ok(())
        })?;
        Ok(ids)
    }

    /// Deletes the requests `ids` (a command that found no daemon to take them).
    pub fn withdraw_reconcile(&self, ids: &[String]) -> Result<()> {
        self.write(|tx| {
            let mut delete = tx.prepare_cached("DELETE FROM reconcile_request WHERE id = ?1")?;
            for id in ids {
                delete.execute(params![id])?;
            }
            Ok(())
        })
    }

    /// The requests `ids`, as recorded now (a withdrawn or expired one is missing).
    pub fn reconcile_requests(&self, ids: &[String]) -> Result<Vec<ReconcileRequest>> {
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            found.extend(self.query(
                &format!("SELECT {REQUEST_COLUMNS} FROM reconcile_request WHERE id = ?1"),
                params![id],
                request_of,
            )?);
        }
        Ok(found)
    }

    /// The requests no daemon has answered, oldest first. Rows older than a day, answered or
    /// not, are deleted first: nobody waits that long, and the table must not grow.
    pub fn open_reconcile_requests(&self) -> Result<Vec<ReconcileRequest>> {
        // Read first, written only when there is something old: the daemon asks at every look,
        // and a read takes no write lock.
        let old: i64 = self.query(
            "SELECT COUNT(*) FROM reconcile_request
             WHERE requested_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 day')",
            params![],
            |r| r.get(0),
        )?[0];
        if old > 0 {
            self.write(|tx| {
                tx.prepare_cached(
                    "DELETE FROM reconcile_request
                     WHERE requested_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 day')",
                )?
                .execute(params![])
            })?;
        }
        self.query(
            &format!(
                "SELECT {REQUEST_COLUMNS} FROM reconcile_request WHERE answered_at IS NULL
                 ORDER BY requested_at, id"
            ),
            params![],
            request_of,
        )
    }

    /// Answers request `id` as daemon `daemon`; `false` when another daemon answered it first
    /// (or it was withdrawn).
    pub fn answer_reconcile(
        &self,
        id: &str,
        daemon: &str,
        commit: Option<&str>,
        action: ReconcileAction,
        after_deployment: Option<i64>,
        detail: Option<&str>,
    ) -> Result<bool> {
        let changed = self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE reconcile_request
                 SET answered_by = ?2, answered_at = {NOW}, commit_id = ?3, action = ?4,
                     after_deployment = ?5, detail = ?6
                 WHERE id = ?1 AND answered_at IS NULL"
            ))?
            .execute(params![
                id,
                daemon,
                commit,
                action.as_str(),
                after_deployment,
                detail
            ])
        })?;
        Ok(changed == 1)
    }

    /// The newest finished deployment of `env` (a detect-only drift run aside): the one a
    /// deployment queued now comes after.
    pub fn newest_finished_deployment(&self, env: &str) -> Result<Option<i64>> {
        Ok(self
            .query(
                "SELECT MAX(id) FROM deployment
                 WHERE env = ?1 AND drift_mode IS NULL AND status <> 'running'",
                params![env],
                |r| r.get::<_, Option<i64>>(0),
            )?
            .into_iter()
            .next()
            .flatten())
    }

    /// The deployments of `env` after deployment `after` (all of them when `None`), a
    /// detect-only drift run aside, oldest first.
    pub fn deployments_after(
        &self,
        env: &str,
        after: Option<i64>,
    ) -> Result<Vec<DeploymentRecord>> {
        self.query(
            "SELECT id, env, commit_id, status, started_at, finished_at,
                    created, updated, deleted, unchanged, failed, error, held, attempt
             FROM deployment WHERE env = ?1 AND id > ?2 AND drift_mode IS NULL ORDER BY id",
            params![env, after.unwrap_or(0)],
            deployment_row,
        )
    }

    /// Records this process as a running daemon (`id`: `host:pid`), for commands on its host
    /// to find, and forgets the daemons of this host whose process is gone (killed: no clean
    /// stop removed them). Daemons sharing a PostgreSQL state report themselves with every
    /// heartbeat; this is for one that does not.
    pub fn register_daemon(&self, id: &str) -> Result<()> {
        let host = crate::lock::host_name();
        let pid = i64::from(std::process::id());
        let gone: Vec<String> = self
            .daemons()?
            .into_iter()
            .filter(|d| d.host == host && d.id != id && !crate::lock::process_alive(d.pid))
            .map(|d| d.id)
            .collect();
        self.write(|tx| {
            let mut forget = tx.prepare_cached("DELETE FROM daemon WHERE id = ?1")?;
            for id in &gone {
                forget.execute(params![id])?;
            }
            tx.prepare_cached(&format!(
                "INSERT INTO daemon (id, host, pid, started_at, seen_at)
                 VALUES (?1, ?2, ?3, {NOW}, {NOW})
                 ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,
                                                seen_at = excluded.seen_at"
            ))?
            .execute(params![id, host, pid])
        })?;
        Ok(())
    }

    /// Removes daemon `id` (it stops).
    pub fn forget_daemon(&self, id: &str) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached("DELETE FROM daemon WHERE id = ?1")?
                .execute(params![id])
        })?;
        Ok(())
    }

    /// The daemons recorded, newest report first.
    pub fn daemons(&self) -> Result<Vec<DaemonRecord>> {
        self.query(
            "SELECT id, host, pid, started_at, seen_at FROM daemon ORDER BY seen_at DESC, id",
            params![],
            |r| {
                Ok(DaemonRecord {
                    id: r.get(0)?,
                    host: r.get(1)?,
                    pid: r.get(2)?,
                    started_at: r.get(3)?,
                    seen_at: r.get(4)?,
                })
            },
        )
    }
}

/// This machine's host name, as the `daemon` table and the locks record it.
pub fn this_host() -> String {
    crate::lock::host_name()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::each_backend;

    #[test]
    fn a_request_is_answered_once_and_read_back_with_its_answer() {
        each_backend(|store| {
            let ids = store
                .request_reconcile(&[Some("prod".into()), None], "ana")
                .unwrap();
            assert_eq!(ids.len(), 2);
            // A PostgreSQL database is shared by the tests running at once: only ours count.
            let ours = |store: &Store| {
                store
                    .open_reconcile_requests()
                    .unwrap()
                    .into_iter()
                    .filter(|r| ids.contains(&r.id))
                    .collect::<Vec<_>>()
            };
            let open = ours(&store);
            assert_eq!(open.len(), 2);
            assert!(open.iter().all(|r| r.answer.is_none()));
            assert!(
                store
                    .answer_reconcile(
                        &ids[0],
                        "h:1",
                        Some("abc"),
                        ReconcileAction::Deploying,
                        Some(7),
                        None
                    )
                    .unwrap()
            );
            // The second daemon to answer finds it answered.
            assert!(
                !store
                    .answer_reconcile(&ids[0], "h:2", None, ReconcileAction::Unknown, None, None)
                    .unwrap()
            );
            let read = store.reconcile_requests(&ids).unwrap();
            let answer = read[0].answer.as_ref().unwrap();
            assert_eq!(answer.answered_by, "h:1");
            assert_eq!(answer.action, ReconcileAction::Deploying);
            assert_eq!(answer.after_deployment, Some(7));
            assert_eq!(read[0].env.as_deref(), Some("prod"));
            assert_eq!(read[1].env, None);
            assert_eq!(ours(&store).len(), 1);
            store.withdraw_reconcile(&ids).unwrap();
            assert!(store.reconcile_requests(&ids).unwrap().is_empty());
        });
    }

    #[test]
    fn a_daemon_registers_and_is_forgotten() {
        each_backend(|store| {
            let id = format!("test-register:{}", crate::lock::token());
            let ours = |store: &Store| {
                store
                    .daemons()
                    .unwrap()
                    .into_iter()
                    .filter(|d| d.id == id)
                    .collect::<Vec<_>>()
            };
            store.register_daemon(&id).unwrap();
            store.register_daemon(&id).unwrap();
            let daemons = ours(&store);
            assert_eq!(daemons.len(), 1);
            assert_eq!(daemons[0].pid, i64::from(std::process::id()));
            assert_eq!(daemons[0].host, this_host());
            store.forget_daemon(&id).unwrap();
            assert!(ours(&store).is_empty());
        });
    }
}
