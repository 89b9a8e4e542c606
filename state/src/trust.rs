//! What a state knows of who may use it: the repository it belongs to, a canary sealed with its
//! key, and the actions people took on it by hand.
//!
//! A state serves one config repository: the first daemon or command that writes with a
//! repository records its identity (the root commit of the watched ref's history, and where it
//! was read from), and the daemon crate refuses another repository against it. The key canary
//! is a known text sealed with the state key the first time the key is checked, so a daemon
//! can find out that its key is the wrong one before it takes a lease, without opening a real
//! secret. Actions are the log of deliberate changes (approve, rollback, state rekey, ...):
//! who, from which host, and which deployment they started or released.

use crate::db::{DbResult, OptionalExtension, Row, params};
use crate::seal::{SealError, sealed_with};
use crate::{NOW, Result, StateError, Store};

/// The text the canary seals: known, and no secret.
const CANARY: &str = "gitplane state key canary v1";
/// The canary's associated data: it opens only as the canary.
const CANARY_AAD: &str = "key_canary";

/// The repository a state belongs to, as recorded on first use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RepositoryIdentity {
    /// The root commit of the watched ref's history (first parents followed to the end).
    pub root_commit: String,
    /// Where it was read from: a path, or a URL without credentials.
    pub url: String,
    pub recorded_at: String,
}

/// How [`Store::check_key`] found the state key to be the right one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCheck {
    /// The canary opened with it.
    Opened,
    /// There was no canary: the key opened one of the state's sealed values, and the canary
    /// is now sealed with it.
    Verified,
    /// There was no canary and no sealed value: the canary is now sealed with the key.
    Written,
}

/// A deliberate change of the state, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ActionRecord {
    pub at: String,
    /// `apply`, `approve`, `rollback`, `state rekey`, ...
    pub command: String,
    /// `None` for what concerns the whole state.
    pub env: Option<String>,
    /// `--by`, else the login name of the user who ran it.
    pub actor: String,
    pub host: String,
    /// The deployment it started or released, if any.
    pub deployment_id: Option<i64>,
    /// What it did, in words (never a secret).
    pub detail: Option<String>,
}

/// An action to record: [`ActionRecord`] without its time, which the database gives.
#[derive(Debug, Clone, Copy)]
pub struct Action<'a> {
    pub command: &'a str,
    pub env: Option<&'a str>,
    pub actor: &'a str,
    pub host: &'a str,
    pub deployment_id: Option<i64>,
    pub detail: Option<&'a str>,
}

fn action_of(r: &Row<'_>) -> DbResult<ActionRecord> {
    Ok(ActionRecord {
        at: r.get(0)?,
        command: r.get(1)?,
        env: r.get(2)?,
        actor: r.get(3)?,
        host: r.get(4)?,
        deployment_id: r.get(5)?,
        detail: r.get(6)?,
    })
}

impl Store {
    /// The repository this state belongs to, once one was recorded.
    pub fn repository(&self) -> Result<Option<RepositoryIdentity>> {
        self.conn
            .prepare_cached("SELECT root_commit, url, recorded_at FROM repository WHERE id = 1")
            .and_then(|mut s| {
                s.query_row(params![], |r| {
                    Ok(RepositoryIdentity {
                        root_commit: r.get(0)?,
                        url: r.get(1)?,
                        recorded_at: r.get(2)?,
                    })
                })
                .optional()
            })
            .map_err(self.err())
    }

    /// Records that this state belongs to the repository with `root_commit`, read from `url`,
    /// unless a repository is recorded already; returns the one recorded, which is another
    /// process's when it recorded first.
    pub fn record_repository(&self, root_commit: &str, url: &str) -> Result<RepositoryIdentity> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO repository (id, root_commit, url, recorded_at)
                 VALUES (1, ?1, ?2, {NOW}) ON CONFLICT (id) DO NOTHING"
            ))?
            .execute(params![root_commit, url])?;
            Ok(())
        })?;
        self.repository()?.ok_or_else(|| StateError::Damaged {
            path: self.path.clone(),
            table: "repository".into(),
            row: "1".into(),
            reason: "the row just written is not there".into(),
        })
    }

    /// Checks that the state key is the one this state's secrets are sealed with: the canary
    /// opens with it; or, before there is a canary, one sealed value of the state opens with it
    /// (its text is dropped at once), and the canary is then sealed with it. Loads the key (a
    /// key file that does not exist yet is created when the state holds nothing sealed).
    ///
    /// Fails with [`SealError::WrongKey`] naming the key's source and the key the state is
    /// sealed with, having opened no secret.
    pub fn check_key(&self) -> Result<KeyCheck> {
        let key = self.key()?;
        if let Some(sealed) = self.canary()? {
            self.open_canary(&key, &sealed)?;
            return Ok(KeyCheck::Opened);
        }
        let sample: Option<(String, String)> = self
            .conn
            .query_row(
                "SELECT v, aad FROM (
                   SELECT outputs AS v, 'resource_secret.outputs:' || guresid AS aad
                     FROM resource_secret WHERE outputs LIKE 'gp1:%'
                   UNION ALL
                   SELECT inputs, 'resource_secret.inputs:' || guresid
                     FROM resource_secret WHERE inputs LIKE 'gp1:%'
                   UNION ALL
                   SELECT cookie, 'driver_cookie:' || guresid
                     FROM driver_cookie WHERE cookie LIKE 'gp1:%'
                   UNION ALL
                   SELECT sealed, 'resource_manifest.sealed:' || guresid
                     FROM resource_manifest WHERE sealed LIKE 'gp1:%') AS sealed
                 LIMIT 1",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.err())?;
        let check = match sample {
            Some((value, aad)) => {
                // Only whether it opens matters: the text goes at once, unseen.
                drop(
                    key.open(&value, &aad)
                        .map_err(|_| self.wrong_key(&key, &value))?,
                );
                KeyCheck::Verified
            }
            None => KeyCheck::Written,
        };
        let sealed = key.seal(CANARY, CANARY_AAD);
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO key_canary (id, sealed, sealed_at) VALUES (1, ?1, {NOW})
                 ON CONFLICT (id) DO NOTHING"
            ))?
            .execute(params![sealed])?;
            Ok(())
        })?;
        // Another process may have sealed its own first: that one is the canary.
        match self.canary()? {
            Some(in_place) => self.open_canary(&key, &in_place)?,
            None => {
                return Err(StateError::Damaged {
                    path: self.path.clone(),
                    table: "key_canary".into(),
                    row: "1".into(),
                    reason: "the row just written is not there".into(),
                });
            }
        }
        Ok(check)
    }

    /// The sealed canary, if one was written.
    pub(crate) fn canary(&self) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT sealed FROM key_canary WHERE id = 1")
            .and_then(|mut s| s.query_row(params![], |r| r.get(0)).optional())
            .map_err(self.err())
    }

    fn open_canary(&self, key: &crate::StateKey, sealed: &str) -> Result<()> {
        match key.open(sealed, CANARY_AAD) {
            Ok(text) if text == CANARY => Ok(()),
            _ => Err(self.wrong_key(key, sealed)),
        }
    }

    /// The error for `key` failing to open `sealed`: the wrong key when `sealed` names another,
    /// else a damaged value.
    fn wrong_key(&self, key: &crate::StateKey, sealed: &str) -> StateError {
        let source = match sealed_with(sealed) {
            Some(id) if id != key.id => match self.key_source().path() {
                Ok(path) => SealError::WrongKey {
                    path,
                    found: key.id.clone(),
                    sealed_with: id.to_owned(),
                },
                Err(e) => e,
            },
            _ => SealError::Damaged {
                aad: CANARY_AAD.to_owned(),
                key: key.id.clone(),
            },
        };
        StateError::Seal {
            path: self.path.clone(),
            source,
        }
    }

    /// Records a deliberate change of the state: who made it, from where, and what it did.
    pub fn record_action(&self, action: &Action<'_>) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO action (at, command, env, actor, host, deployment_id, detail)
                 VALUES ({NOW}, ?1, ?2, ?3, ?4, ?5, ?6)"
            ))?
            .execute(params![
                action.command,
                action.env,
                action.actor,
                action.host,
                action.deployment_id,
                action.detail
            ])?;
            Ok(())
        })
    }

    /// The actions recorded (of `env` when given: those of the whole state too), newest first;
    /// actions of one millisecond (one command's environments) by their deployments, newest
    /// first, so both backends list them alike.
    pub fn actions(&self, env: Option<&str>) -> Result<Vec<ActionRecord>> {
        self.query(
            "SELECT at, command, env, actor, host, deployment_id, detail FROM action
             WHERE CAST(?1 AS TEXT) IS NULL OR env = ?1 OR env IS NULL
             ORDER BY at DESC, COALESCE(deployment_id, 0) DESC, command, COALESCE(env, '')",
            params![env],
            action_of,
        )
    }
}

/// Seals the canary again with `new` inside a rekey's transaction (after checking that it
/// opens with `old`); writes one when there was none.
pub(crate) fn reseal_canary(
    tx: &crate::db::Tx<'_>,
    old: &crate::StateKey,
    new: &crate::StateKey,
) -> DbResult<()> {
    let sealed: Option<String> = tx
        .prepare_cached("SELECT sealed FROM key_canary WHERE id = 1")?
        .query_row(params![], |r| r.get(0))
        .optional()?;
    if let Some(sealed) = sealed
        && old.open(&sealed, CANARY_AAD)? != CANARY
    {
        return Err(SealError::Damaged {
            aad: CANARY_AAD.to_owned(),
            key: old.id.clone(),
        }
        .into());
    }
    tx.prepare_cached(&format!(
        "INSERT INTO key_canary (id, sealed, sealed_at) VALUES (1, ?1, {NOW})
         ON CONFLICT (id) DO UPDATE SET sealed = excluded.sealed,
                                        sealed_at = excluded.sealed_at"
    ))?
    .execute(params![new.seal(CANARY, CANARY_AAD)])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::tests::{each_backend, record, start};
    use crate::*;

    use super::*;

    #[test]
    fn the_first_repository_recorded_stays() {
        each_backend(|store| {
            assert_eq!(store.repository().unwrap(), None);
            let first = store.record_repository("r1", "/srv/git/a.git").unwrap();
            assert_eq!(
                (first.root_commit.as_str(), first.url.as_str()),
                ("r1", "/srv/git/a.git")
            );
            // A second one is not recorded over it: the first is returned.
            let second = store.record_repository("r2", "/srv/git/b.git").unwrap();
            assert_eq!(second, first);
            assert_eq!(store.repository().unwrap(), Some(first));
        });
    }

    #[test]
    fn actions_are_listed_newest_first_with_the_state_s_own() {
        each_backend(|store| {
            let action = |command, env, deployment_id, detail| Action {
                command,
                env,
                actor: "alice",
                host: "mgmt-1",
                deployment_id,
                detail,
            };
            store
                .record_action(&action("apply", Some("production"), Some(1), None))
                .unwrap();
            // Not a wait for an event: the clock ticks, so that the actions' times differ.
            std::thread::sleep(std::time::Duration::from_millis(5));
            store
                .record_action(&action("state rekey", None, None, Some("resealed 3")))
                .unwrap();
            // Not a wait for an event: the clock ticks, so that the actions' times differ.
            std::thread::sleep(std::time::Duration::from_millis(5));
            store
                .record_action(&action(
                    "approve",
                    Some("development"),
                    Some(2),
                    Some("approved 750 deletions"),
                ))
                .unwrap();
            let all = store.actions(None).unwrap();
            let commands: Vec<&str> = all.iter().map(|a| a.command.as_str()).collect();
            assert_eq!(commands, ["approve", "state rekey", "apply"]);
            assert_eq!(all[0].deployment_id, Some(2));
            assert_eq!(all[0].detail.as_deref(), Some("approved 750 deletions"));
            assert_eq!(
                (all[0].actor.as_str(), all[0].host.as_str()),
                ("alice", "mgmt-1")
            );
            let production = store.actions(Some("production")).unwrap();
            let production: Vec<&str> = production.iter().map(|a| a.command.as_str()).collect();
            assert_eq!(production, ["state rekey", "apply"]);

            // One command's environments in one millisecond: by deployment, newest first.
            for (env, deployment) in [("development", 3), ("production", 4)] {
                store
                    .conn
                    .execute(
                        "INSERT INTO action (at, command, env, actor, host, deployment_id)
                         VALUES ('2999-01-01T00:00:00.000Z', 'apply', ?1, 'bob', 'h', ?2)",
                        params![env, deployment],
                    )
                    .unwrap();
            }
            let newest: Vec<Option<i64>> = store.actions(None).unwrap()[..2]
                .iter()
                .map(|a| a.deployment_id)
                .collect();
            assert_eq!(newest, [Some(4), Some(3)]);
        });
    }

    /// One resource recorded, with a secret output and a secret input sealed.
    fn with_a_secret(store: &mut Store) {
        let d = store.begin_deployment("development", "c1").unwrap();
        let op = store.begin_operation(&start(d)).unwrap();
        store
            .finish_put(op, 1, d, &record("g1"), Some(true))
            .unwrap();
    }

    #[test]
    fn the_canary_is_written_once_and_opens_only_with_its_key() {
        each_backend(|store| {
            assert_eq!(store.check_key().unwrap(), KeyCheck::Written);
            assert_eq!(store.check_key().unwrap(), KeyCheck::Opened);
            let canary = store.canary().unwrap().unwrap();
            assert!(!canary.contains(CANARY), "the canary is sealed");
            assert_eq!(sealed_with(&canary), Some(store.key_id().unwrap().as_str()));
        });
    }

    #[test]
    fn a_state_with_secrets_and_no_canary_gets_one_only_from_the_right_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let right = KeySource::File(dir.path().join("right.key"));
        let mut store = Store::open_keyed(&path, Some(&right)).unwrap();
        with_a_secret(&mut store);
        assert_eq!(store.canary().unwrap(), None, "an upgraded state has none");
        drop(store);

        // Another key: refused, naming both keys, and no canary is written.
        let wrong = KeySource::File(dir.path().join("wrong.key"));
        StateKey::generate()
            .write_new(&dir.path().join("wrong.key"))
            .unwrap();
        let other = Store::open_keyed(&path, Some(&wrong)).unwrap();
        let e = other.check_key().unwrap_err().to_string();
        assert!(e.contains("wrong.key"), "{e}");
        assert!(e.contains("is not the key"), "{e}");
        assert_eq!(other.canary().unwrap(), None);
        drop(other);

        let store = Store::open_keyed(&path, Some(&right)).unwrap();
        assert_eq!(store.check_key().unwrap(), KeyCheck::Verified);
        assert_eq!(store.check_key().unwrap(), KeyCheck::Opened);
        drop(store);
        // From now on the canary alone tells a wrong key, whatever the secrets.
        let other = Store::open_keyed(&path, Some(&wrong)).unwrap();
        let e = other.check_key().unwrap_err().to_string();
        assert!(
            e.contains("wrong.key") && e.contains("is not the key"),
            "{e}"
        );
    }

    #[test]
    #[cfg_attr(
        not(postgres),
        ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
    )]
    fn a_wrong_key_is_told_by_the_canary_on_postgresql_too() {
        let Some(pg) = gitplane_testkit::shared_or_skip("the canary on PostgreSQL") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let url = pg.database();
        let right = KeySource::File(dir.path().join("right.key"));
        let store = Store::open_keyed(Path::new(&url), Some(&right)).unwrap();
        assert_eq!(store.check_key().unwrap(), KeyCheck::Written);
        let wrong = KeySource::File(dir.path().join("wrong.key"));
        StateKey::generate()
            .write_new(&dir.path().join("wrong.key"))
            .unwrap();
        let other = Store::open_keyed(Path::new(&url), Some(&wrong)).unwrap();
        let e = other.check_key().unwrap_err().to_string();
        assert!(
            e.contains("wrong.key") && e.contains("is not the key"),
            "{e}"
        );
    }

    #[test]
    fn rekey_reseals_the_canary_with_the_secrets() {
        each_backend(|mut store| {
            with_a_secret(&mut store);
            store.check_key().unwrap();
            let before = store.canary().unwrap().unwrap();
            let new = StateKey::generate();
            assert_eq!(
                store.rekey(&new).unwrap(),
                2,
                "outputs and inputs, not the canary"
            );
            let after = store.canary().unwrap().unwrap();
            assert_ne!(before, after);
            assert_eq!(sealed_with(&after), Some(new.id.as_str()));
            assert_eq!(store.check_key().unwrap(), KeyCheck::Opened);
        });
    }
}
