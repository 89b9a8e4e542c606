//! Environment pins (`gitplane rollback`) and preview environments in the state.

use crate::db::{OptionalExtension, Row, params};
use crate::{NOW, Result, Store};

/// An environment held at a commit by `gitplane rollback`, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EnvPin {
    pub env: String,
    pub pinned_at: String,
    pub commit_id: String,
    pub pinned_by: String,
    pub reason: String,
    /// The rollback's deployment, once it started.
    pub deployment_id: Option<i64>,
    pub unpinned_by: Option<String>,
    pub unpinned_at: Option<String>,
    /// The newest commit held back while pinned, and its plan's counts (JSON).
    pub waiting_commit: Option<String>,
    pub waiting_plan: Option<String>,
    /// Pinned with `--force` at a commit outside the watched ref's history that was never
    /// deployed to the environment.
    pub forced: bool,
}

const PIN_COLUMNS: &str = "env, pinned_at, commit_id, pinned_by, reason, deployment_id, \
                           unpinned_by, unpinned_at, waiting_commit, waiting_plan, forced";

fn pin_of(r: &Row<'_>) -> crate::db::DbResult<EnvPin> {
    Ok(EnvPin {
        env: r.get(0)?,
        pinned_at: r.get(1)?,
        commit_id: r.get(2)?,
        pinned_by: r.get(3)?,
        reason: r.get(4)?,
        deployment_id: r.get(5)?,
        unpinned_by: r.get(6)?,
        unpinned_at: r.get(7)?,
        waiting_commit: r.get(8)?,
        waiting_plan: r.get(9)?,
        forced: r.get::<_, i64>(10)? != 0,
    })
}

/// A preview environment, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PreviewRecord {
    pub env: String,
    pub branch: String,
    pub env_type: String,
    /// The branch head last dispatched.
    pub commit_id: Option<String>,
    pub created_at: String,
    /// When its head last changed: its time to live runs from here.
    pub pushed_at: String,
    pub removing_at: Option<String>,
    pub removed_at: Option<String>,
    pub removed_why: Option<String>,
    /// The watched ref's commit its platform (everything but `workloads/`) was last read from;
    /// `None` when the whole branch is deployed (`previews.trust: branch`).
    pub platform_commit: Option<String>,
    /// The newest branch head that was not deployed, and why (it changes files outside
    /// `workloads/`); `None` once a head is deployed again.
    pub refused_commit: Option<String>,
    pub refused_why: Option<String>,
}

impl PreviewRecord {
    /// Whether the environment exists: made, and not (being) removed.
    pub fn live(&self) -> bool {
        self.removing_at.is_none() && self.removed_at.is_none()
    }
}

/// What a branch's new head does to its preview environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewPush {
    /// The environment is new, or made again after it was removed.
    Created,
    /// The branch moved to another commit.
    Updated,
    /// Nothing: the head is the one recorded.
    Same,
}

impl Store {
    /// Pins `env` at `commit`, recorded with who and why (and whether it was forced past the
    /// watched ref's history); a pin it held before ends here.
    pub fn pin(
        &self,
        env: &str,
        commit: &str,
        by: &str,
        reason: &str,
        forced: bool,
    ) -> Result<EnvPin> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE env_pin SET unpinned_by = ?2, unpinned_at = {NOW}
                 WHERE env = ?1 AND unpinned_at IS NULL"
            ))?
            .execute(params![env, by])?;
            tx.prepare_cached(&format!(
                "INSERT INTO env_pin (env, pinned_at, commit_id, pinned_by, reason, forced)
                 VALUES (?1, {NOW}, ?2, ?3, ?4, ?5)"
            ))?
            .execute(params![env, commit, by, reason, i64::from(forced)])?;
            tx.prepare_cached(&format!(
                "SELECT {PIN_COLUMNS} FROM env_pin WHERE env = ?1 AND unpinned_at IS NULL"
            ))?
            .query_row(params![env], pin_of)
        })
    }

    /// Whether `commit` was deployed to `env` before: a deployment of it there succeeded.
    pub fn deployed_before(&self, env: &str, commit: &str) -> Result<bool> {
        self.conn
            .prepare_cached(
                "SELECT 1 FROM deployment
                 WHERE env = ?1 AND commit_id = ?2 AND status = 'succeeded' LIMIT 1",
            )
            .and_then(|mut s| s.exists(params![env, commit]))
            .map_err(self.err())
    }

    /// Records the deployment that rolled `env` back to its pin.
    pub fn set_pin_deployment(&self, env: &str, deployment: i64) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(
                "UPDATE env_pin SET deployment_id = ?2 WHERE env = ?1 AND unpinned_at IS NULL",
            )?
            .execute(params![env, deployment])?;
            Ok(())
        })
    }

    /// The pin `env` is held at, if any.
    pub fn pin_of(&self, env: &str) -> Result<Option<EnvPin>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {PIN_COLUMNS} FROM env_pin WHERE env = ?1 AND unpinned_at IS NULL"
            ))
            .and_then(|mut s| s.query_row(params![env], pin_of).optional())
            .map_err(self.err())
    }

    /// Every pin ever recorded (of `env` when given), newest first.
    pub fn pins(&self, env: Option<&str>) -> Result<Vec<EnvPin>> {
        self.query(
            &format!(
                "SELECT {PIN_COLUMNS} FROM env_pin
                 WHERE CAST(?1 AS TEXT) IS NULL OR env = ?1
                 ORDER BY pinned_at DESC, env"
            ),
            params![env],
            pin_of,
        )
    }

    /// Releases `env`'s pin; returns it, or `None` when it was not pinned.
    pub fn unpin(&self, env: &str, by: &str) -> Result<Option<EnvPin>> {
        let Some(held) = self.pin_of(env)? else {
            return Ok(None);
        };
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE env_pin SET unpinned_by = ?3, unpinned_at = {NOW}
                 WHERE env = ?1 AND pinned_at = ?2 AND unpinned_at IS NULL"
            ))?
            .execute(params![env, held.pinned_at, by])?;
            Ok(())
        })?;
        Ok(Some(held))
    }

    /// Records `commit` as the newest commit a pin held back from `env`, with its plan.
    pub fn pin_waiting(&self, env: &str, commit: &str, plan: &str) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(
                "UPDATE env_pin SET waiting_commit = ?2, waiting_plan = ?3
                 WHERE env = ?1 AND unpinned_at IS NULL",
            )?
            .execute(params![env, commit, plan])?;
            Ok(())
        })
    }

    /// Every preview environment recorded, removed ones included, by name.
    pub fn previews(&self) -> Result<Vec<PreviewRecord>> {
        self.query(
            "SELECT env, branch, env_type, commit_id, created_at, pushed_at, removing_at,
                    removed_at, removed_why, platform_commit, refused_commit, refused_why
             FROM preview ORDER BY env",
            params![],
            |r| {
                Ok(PreviewRecord {
                    env: r.get(0)?,
                    branch: r.get(1)?,
                    env_type: r.get(2)?,
                    commit_id: r.get(3)?,
                    created_at: r.get(4)?,
                    pushed_at: r.get(5)?,
                    removing_at: r.get(6)?,
                    removed_at: r.get(7)?,
                    removed_why: r.get(8)?,
                    platform_commit: r.get(9)?,
                    refused_commit: r.get(10)?,
                    refused_why: r.get(11)?,
                })
            },
        )
    }

    /// The preview environment `env`, if one was ever recorded.
    pub fn preview(&self, env: &str) -> Result<Option<PreviewRecord>> {
        Ok(self.previews()?.into_iter().find(|p| p.env == env))
    }

    /// Records that `branch` (preview environment `env`) has head `commit`, deployed with the
    /// platform of the watched ref's commit `platform` (`None`: the branch's own): a new
    /// environment, one made again after its removal (or during it: the branch came back), or a
    /// push that restarts its time to live. A new platform alone does not restart it.
    pub fn preview_pushed(
        &self,
        env: &str,
        branch: &str,
        env_type: &str,
        (commit, platform): (&str, Option<&str>),
    ) -> Result<PreviewPush> {
        let known = self.preview(env)?;
        let push = match &known {
            None => PreviewPush::Created,
            Some(p) if p.commit_id.as_deref() == Some(commit) => {
                if p.live()
                    && (p.platform_commit.as_deref() != platform || p.refused_commit.is_some())
                {
                    self.write(|tx| {
                        tx.prepare_cached(
                            "UPDATE preview SET platform_commit = ?2, refused_commit = NULL,
                                 refused_why = NULL
                             WHERE env = ?1",
                        )?
                        .execute(params![env, platform])?;
                        Ok(())
                    })?;
                }
                return Ok(PreviewPush::Same);
            }
            Some(p) if p.live() => PreviewPush::Updated,
            Some(_) => PreviewPush::Created,
        };
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO preview (env, branch, env_type, commit_id, created_at, pushed_at,
                                      platform_commit)
                 VALUES (?1, ?2, ?3, ?4, {NOW}, {NOW}, ?5)
                 ON CONFLICT (env) DO UPDATE SET branch = excluded.branch,
                     env_type = excluded.env_type, commit_id = excluded.commit_id,
                     pushed_at = excluded.pushed_at, platform_commit = excluded.platform_commit,
                     created_at = CASE WHEN preview.removing_at IS NULL
                                        AND preview.removed_at IS NULL
                                       THEN preview.created_at ELSE excluded.created_at END,
                     removing_at = NULL, removed_at = NULL, removed_why = NULL,
                     refused_commit = NULL, refused_why = NULL"
            ))?
            .execute(params![env, branch, env_type, commit, platform])?;
            Ok(())
        })?;
        Ok(push)
    }

    /// Records that `branch`'s head `commit` is not deployed to preview environment `env`, and
    /// why; what the environment holds stays as it is. A branch without a record gets one (no
    /// commit deployed), so `gitplane status` can say why it has no preview. False when this
    /// head's refusal was recorded already.
    pub fn preview_refused(
        &self,
        env: &str,
        branch: &str,
        env_type: &str,
        (commit, why): (&str, &str),
    ) -> Result<bool> {
        if self
            .preview(env)?
            .is_some_and(|p| p.refused_commit.as_deref() == Some(commit))
        {
            return Ok(false);
        }
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO preview (env, branch, env_type, created_at, pushed_at,
                                      refused_commit, refused_why)
                 VALUES (?1, ?2, ?3, {NOW}, {NOW}, ?4, ?5)
                 ON CONFLICT (env) DO UPDATE SET refused_commit = excluded.refused_commit,
                     refused_why = excluded.refused_why"
            ))?
            .execute(params![env, branch, env_type, commit, why])?;
            Ok(())
        })?;
        Ok(true)
    }

    /// Closes preview environment `env`'s record without deleting anything (`why`: the watched
    /// ref declares the environment, whose deployments own its resources from then on); false
    /// when it was closed for that reason already.
    pub fn preview_closed(&self, env: &str, why: &str) -> Result<bool> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE preview SET removing_at = COALESCE(removing_at, {NOW}),
                     removed_at = COALESCE(removed_at, {NOW}), removed_why = ?2
                 WHERE env = ?1 AND (removed_why IS NULL OR removed_why != ?2)"
            ))?
            .execute(params![env, why])
        })
        .map(|n| n > 0)
    }

    /// Starts the removal of preview environment `env` (`why`: its branch was deleted, or its
    /// time ran out); false when it was not live.
    pub fn preview_removing(&self, env: &str, why: &str) -> Result<bool> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE preview SET removing_at = {NOW}, removed_why = ?2
                 WHERE env = ?1 AND removing_at IS NULL AND removed_at IS NULL"
            ))?
            .execute(params![env, why])
        })
        .map(|n| n > 0)
    }

    /// Records that preview environment `env` has no resource left.
    pub fn preview_removed(&self, env: &str) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE preview SET removed_at = {NOW}
                 WHERE env = ?1 AND removing_at IS NOT NULL AND removed_at IS NULL"
            ))?
            .execute(params![env])?;
            Ok(())
        })
    }

    /// How long ago `at` (a time the state wrote) was, in seconds, by the database's clock.
    pub fn seconds_since(&self, at: &str) -> Result<f64> {
        self.conn
            .prepare_cached("SELECT (julianday('now') - julianday(?1)) * 86400.0")
            .and_then(|mut s| s.query_row(params![at], |r| r.get(0)))
            .map_err(self.err())
    }
}

#[cfg(test)]
mod tests {
    use crate::DeploymentStatus;
    use crate::tests::each_backend;

    use super::*;

    #[test]
    fn a_pin_holds_until_unpinned_and_stays_as_history() {
        each_backend(|store| {
            assert_eq!(store.pin_of("production").unwrap(), None);
            let pin = store
                .pin("production", "c1", "alice", "bad release", false)
                .unwrap();
            assert_eq!(
                (pin.commit_id.as_str(), pin.pinned_by.as_str()),
                ("c1", "alice")
            );
            store.set_pin_deployment("production", 7).unwrap();
            store
                .pin_waiting("production", "c3", "{\"created\":1}")
                .unwrap();
            let held = store.pin_of("production").unwrap().unwrap();
            assert_eq!(held.deployment_id, Some(7));
            assert_eq!(held.waiting_commit.as_deref(), Some("c3"));
            assert_eq!(store.pin_of("development").unwrap(), None);
            // Pinning again ends the first pin. Not a wait for an event: the clock ticks, so
            // that the two pins' times differ.
            std::thread::sleep(std::time::Duration::from_millis(5));
            store
                .pin("production", "c0", "bob", "older still", true)
                .unwrap();
            let all = store.pins(Some("production")).unwrap();
            assert_eq!(all.len(), 2);
            assert_eq!((all[0].forced, all[1].forced), (true, false));
            assert_eq!(all[1].unpinned_by.as_deref(), Some("bob"));
            let released = store.unpin("production", "carol").unwrap().unwrap();
            assert_eq!(released.commit_id, "c0");
            assert_eq!(store.pin_of("production").unwrap(), None);
            assert_eq!(store.unpin("production", "carol").unwrap(), None);
            assert_eq!(
                store.pins(None).unwrap()[0].unpinned_by.as_deref(),
                Some("carol")
            );
        });
    }

    #[test]
    fn only_a_succeeded_deployment_of_the_environment_counts_as_deployed_before() {
        each_backend(|store| {
            let d = store.begin_deployment("production", "c1").unwrap();
            assert!(
                !store.deployed_before("production", "c1").unwrap(),
                "still running"
            );
            store
                .finish_deployment(d, DeploymentStatus::Succeeded, &Default::default(), None)
                .unwrap();
            assert!(store.deployed_before("production", "c1").unwrap());
            assert!(!store.deployed_before("development", "c1").unwrap());
            store
                .failed_deployment("production", Some("c2"), "bad")
                .unwrap();
            assert!(!store.deployed_before("production", "c2").unwrap());
        });
    }

    #[test]
    fn a_preview_lives_from_its_first_push_to_its_removal_and_comes_back_with_a_new_one() {
        each_backend(|store| {
            let pushed = |c: &str| {
                store
                    .preview_pushed("pr-1", "refs/heads/pr-1", "development", (c, Some("m1")))
                    .unwrap()
            };
            assert_eq!(pushed("c1"), PreviewPush::Created);
            assert_eq!(pushed("c1"), PreviewPush::Same);
            assert_eq!(pushed("c2"), PreviewPush::Updated);
            assert!(store.preview("pr-1").unwrap().unwrap().live());
            assert!(store.preview_removing("pr-1", "ttl expired").unwrap());
            assert!(!store.preview_removing("pr-1", "branch deleted").unwrap());
            store.preview_removed("pr-1").unwrap();
            let gone = store.preview("pr-1").unwrap().unwrap();
            assert_eq!(gone.removed_why.as_deref(), Some("ttl expired"));
            assert!(gone.removed_at.is_some());
            // The same head does not bring it back; a new push does.
            assert_eq!(pushed("c2"), PreviewPush::Same);
            assert_eq!(pushed("c3"), PreviewPush::Created);
            let again = store.preview("pr-1").unwrap().unwrap();
            assert!(again.live() && again.removed_why.is_none());
            assert!(store.seconds_since(&again.pushed_at).unwrap() < 60.0);
            assert_eq!(again.platform_commit.as_deref(), Some("m1"));

            // A head that is refused leaves what is deployed and says why, once.
            assert!(
                store
                    .preview_refused("pr-1", "refs/heads/pr-1", "development", ("c4", "why"))
                    .unwrap()
            );
            assert!(
                !store
                    .preview_refused("pr-1", "refs/heads/pr-1", "development", ("c4", "why"))
                    .unwrap()
            );
            let refused = store.preview("pr-1").unwrap().unwrap();
            assert_eq!(refused.commit_id.as_deref(), Some("c3"));
            assert_eq!(refused.refused_commit.as_deref(), Some("c4"));
            // A new platform for the deployed head is recorded, and clears the refusal.
            assert_eq!(
                store
                    .preview_pushed("pr-1", "refs/heads/pr-1", "development", ("c3", Some("m2")))
                    .unwrap(),
                PreviewPush::Same
            );
            let moved = store.preview("pr-1").unwrap().unwrap();
            assert_eq!(moved.platform_commit.as_deref(), Some("m2"));
            assert_eq!(moved.refused_commit, None);
            assert_eq!(moved.pushed_at, again.pushed_at, "its ttl runs on");

            // A branch refused from its first push has a record without a deployed head.
            assert!(
                store
                    .preview_refused("pr-2", "refs/heads/pr-2", "development", ("x1", "why"))
                    .unwrap()
            );
            let never = store.preview("pr-2").unwrap().unwrap();
            assert_eq!(
                (never.commit_id, never.refused_commit.as_deref()),
                (None, Some("x1"))
            );

            // Closed once when the watched ref declares it, deleting nothing.
            assert!(store.preview_closed("pr-1", "declared").unwrap());
            assert!(!store.preview_closed("pr-1", "declared").unwrap());
            let closed = store.preview("pr-1").unwrap().unwrap();
            assert!(!closed.live());
            assert_eq!(closed.removed_why.as_deref(), Some("declared"));
        });
    }
}
