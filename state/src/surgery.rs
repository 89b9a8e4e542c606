//! State surgery by hand: forget a resource, adopt one that exists, move one to a new GUResID,
//! and take an online backup of a SQLite state. No driver is ever called from here.
//!
//! Callers hold the environment's apply lock while they write (the CLI takes it), so no
//! deployment interleaves with the surgery. Each write is one transaction. A resource's history
//! (`resource_version`, `operation`, closed links and bindings) stays under the GUResID it was
//! made with: it records what was. What the next apply reads (the `resource` row, its secrets,
//! cookie, manifests, current links and bindings) moves or goes.

use std::path::Path;

use serde_json::Value;

use crate::db::{DbResult, OptionalExtension, Tx, params};
use crate::{NOW, ResourceRecord, Result, StateError, Store, open_with, seal_with, state_error};

/// Where `move_resource` puts a resource: its new GUResID, app and res_id (type and class stay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveTo<'a> {
    pub guresid: &'a str,
    pub app: Option<&'a str>,
    pub res_id: &'a str,
}

/// What an imported resource is recorded with besides its graph node's identity.
#[derive(Debug, Clone)]
pub struct Adopted<'a> {
    /// The resource as the graph makes it, with the outputs read from the outputs file.
    pub record: &'a ResourceRecord,
    /// The driver cookie to send with the first update.
    pub cookie: Option<&'a str>,
}

/// How `backup_to` went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    /// Pages copied (SQLite's page size each).
    pub pages: u64,
    /// `PRAGMA integrity_check` of the backup: `ok` when sound.
    pub integrity: String,
    /// Resources the backup, opened as a state, lists per environment (those with any).
    pub resources: Vec<(String, i64)>,
}

impl Store {
    /// The environment and app of the resource recorded under `guresid`, if there is one.
    pub fn resource_place(&self, guresid: &str) -> Result<Option<(String, Option<String>)>> {
        self.conn
            .query_row(
                "SELECT env, app FROM resource WHERE guresid = ?1",
                [guresid],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.err())
    }

    /// Forgets the resource recorded under `guresid` (no driver is told): its row, secrets,
    /// cookie, manifests, its current links and bindings both ways, and the fingerprint of its
    /// app (of every app of its environment for a shared resource), so that the next apply
    /// plans it as new if the repository still has it. Returns whether it was recorded.
    pub fn forget_resource(&mut self, guresid: &str) -> Result<bool> {
        let Some((env, app)) = self.resource_place(guresid)? else {
            return Ok(false);
        };
        self.in_transaction(|tx| {
            let ended = next_deployment(tx)?;
            end_current_version(tx, guresid, ended)?;
            for sql in [
                "DELETE FROM resource_manifest WHERE guresid = ?1",
                "DELETE FROM resource_secret WHERE guresid = ?1",
                "DELETE FROM driver_cookie WHERE guresid = ?1",
                "DELETE FROM resource WHERE guresid = ?1",
            ] {
                tx.prepare_cached(sql)?.run([guresid])?;
            }
            close_links(tx, guresid, ended)?;
            forget_fingerprints(tx, &env, app.as_deref())?;
            Ok(true)
        })
    }

    /// Moves the resource recorded under `from` to `to`: the same row, secrets (sealed again
    /// for their new place), cookie and manifests, and its current links and bindings, under
    /// the new GUResID, app and res_id. The next apply of a repository that names it `to` finds
    /// it recorded, with the inputs it was last given: unchanged, or an update. The fingerprints
    /// of both apps are dropped so that the next apply looks at them. Fails if `to` is taken.
    pub fn move_resource(&mut self, from: &str, to: &MoveTo<'_>) -> Result<bool> {
        let Some((env, app)) = self.resource_place(from)? else {
            return Ok(false);
        };
        if self.resource_place(to.guresid)?.is_some() {
            return Err(StateError::Taken {
                path: self.path.clone(),
                guresid: to.guresid.to_owned(),
            });
        }
        let ring = self.keyring.clone();
        // (table, sealed column, associated-data prefix): sealed values are bound to their
        // GUResID, so each is opened for the old place and sealed for the new one.
        const SEALED: [(&str, &str, &str); 4] = [
            ("resource_secret", "outputs", "resource_secret.outputs"),
            ("resource_secret", "inputs", "resource_secret.inputs"),
            ("driver_cookie", "cookie", "driver_cookie"),
            ("resource_manifest", "sealed", "resource_manifest.sealed"),
        ];
        self.in_transaction(|tx| {
            let mut resealed = Vec::new();
            for (table, column, aad) in SEALED {
                let value: Option<Option<String>> = tx
                    .prepare_cached(&format!("SELECT {column} FROM {table} WHERE guresid = ?1"))?
                    .query_row([from], |r| r.get(0))
                    .optional()?;
                if let Some(Some(value)) = value {
                    let plain = open_with(&ring, Some(value), &format!("{aad}:{from}"))?
                        .unwrap_or_default();
                    let sealed = seal_with(&ring, &plain, &format!("{aad}:{}", to.guresid))?;
                    resealed.push((table, column, sealed));
                }
            }
            // The dependent rows first: they reference the resource's GUResID.
            tx.prepare_cached(
                "INSERT INTO resource (guresid, env, app, type, class, res_id, definition,
                     driver, account, deletion_policy, template_hash, orphan_since, orphan_reason,
                     status, inputs_hash, outputs, inputs, error, commit_id, deployment_id,
                     created_at, updated_at, version_from)
                 SELECT ?2, env, ?3, type, class, ?4, definition, driver, account,
                     deletion_policy, template_hash, orphan_since, orphan_reason, status,
                     inputs_hash, outputs, inputs, error, commit_id, deployment_id, created_at,
                     updated_at, version_from
                 FROM resource WHERE guresid = ?1",
            )?
            .run(params![from, to.guresid, to.app, to.res_id])?;
            for table in ["resource_secret", "driver_cookie", "resource_manifest"] {
                tx.prepare_cached(&format!(
                    "UPDATE {table} SET guresid = ?2 WHERE guresid = ?1"
                ))?
                .run(params![from, to.guresid])?;
            }
            for (table, column, sealed) in resealed {
                tx.prepare_cached(&format!(
                    "UPDATE {table} SET {column} = ?2 WHERE guresid = ?1"
                ))?
                .run(params![to.guresid, sealed])?;
            }
            tx.prepare_cached("DELETE FROM resource WHERE guresid = ?1")?
                .run([from])?;
            for sql in [
                "UPDATE link SET consumer = ?2 WHERE consumer = ?1 AND valid_to IS NULL",
                "UPDATE link SET provider = ?2 WHERE provider = ?1 AND valid_to IS NULL",
                "UPDATE binding SET needed_guresid = ?2
                 WHERE needed_guresid = ?1 AND valid_to IS NULL",
                "UPDATE binding SET provided_guresid = ?2
                 WHERE provided_guresid = ?1 AND valid_to IS NULL",
            ] {
                tx.prepare_cached(sql)?.run(params![from, to.guresid])?;
            }
            forget_fingerprints(tx, &env, app.as_deref())?;
            forget_fingerprints(tx, &env, to.app)?;
            Ok(true)
        })
    }

    /// Records `adopted` as provisioned (an existing resource gitplane did not create), with
    /// its cookie: the next apply sends it an update, never a create, since its inputs were
    /// never recorded. Fails if its GUResID is recorded already, or its environment has no
    /// deployment yet (every resource row names the deployment it was last written by).
    pub fn import_resource(&mut self, adopted: &Adopted<'_>) -> Result<()> {
        let record = adopted.record;
        if self.resource_place(&record.guresid)?.is_some() {
            return Err(StateError::Taken {
                path: self.path.clone(),
                guresid: record.guresid.clone(),
            });
        }
        let ring = self.keyring.clone();
        let path = self.path.clone();
        let deployment: Option<i64> = self
            .conn
            .query_row(
                "SELECT MAX(id) FROM deployment WHERE env = ?1",
                [&record.env],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        let Some(deployment) = deployment else {
            return Err(StateError::NoDeploymentYet {
                path,
                env: record.env.clone(),
            });
        };
        self.in_transaction(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO resource (guresid, env, app, type, class, res_id, definition,
                     driver, account, deletion_policy, template_hash, status, inputs_hash,
                     outputs, inputs, commit_id, deployment_id, version_from, created_at,
                     updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'ready', ?12, ?13, '{{}}',
                         ?14, ?15, ?15, {NOW}, {NOW})"
            ))?
            .run(params![
                record.guresid,
                record.env,
                record.app,
                record.res_type,
                record.class,
                record.res_id,
                record.definition,
                record.driver,
                record.account,
                record.deletion_policy.as_str(),
                record.template_hash,
                record.inputs_hash,
                record.outputs.to_string(),
                record.commit_id,
                deployment
            ])?;
            let g = &record.guresid;
            let secrets = match &record.secret_outputs {
                Value::Object(map) if !map.is_empty() => Some(record.secret_outputs.to_string()),
                _ => None,
            };
            if let Some(secrets) = secrets {
                let outputs = seal_with(&ring, &secrets, &format!("resource_secret.outputs:{g}"))?;
                let inputs = seal_with(
                    &ring,
                    crate::journal::NO_SECRET_INPUTS,
                    &format!("resource_secret.inputs:{g}"),
                )?;
                tx.prepare_cached(
                    "INSERT INTO resource_secret (guresid, outputs, inputs) VALUES (?1, ?2, ?3)",
                )?
                .run(params![g, outputs, inputs])?;
            }
            if let Some(cookie) = adopted.cookie {
                let sealed = seal_with(&ring, cookie, &format!("driver_cookie:{g}"))?;
                tx.prepare_cached(&format!(
                    "INSERT INTO driver_cookie (guresid, cookie, updated_at)
                     VALUES (?1, ?2, {NOW})
                     ON CONFLICT (guresid) DO UPDATE SET cookie = excluded.cookie,
                         updated_at = excluded.updated_at"
                ))?
                .run(params![g, sealed])?;
            }
            forget_fingerprints(tx, &record.env, record.app.as_deref())?;
            Ok(())
        })
    }

    /// Copies a SQLite state into `dest` with SQLite's online backup API: a consistent
    /// snapshot even while a daemon writes, then checks the copy with `PRAGMA integrity_check`
    /// and opens it as a state to count its resources. `dest` must
    /// not exist. A PostgreSQL state is refused: `pg_dump` is the way (docs/postgres.md).
    pub fn backup_to(&self, dest: &Path) -> Result<BackupReport> {
        let crate::db::Conn::Lite(conn) = &self.conn else {
            return Err(StateError::BackupPostgres {
                path: self.path.clone(),
            });
        };
        crate::create_private(dest).map_err(|source| StateError::Create {
            path: dest.to_owned(),
            source,
        })?;
        let e = |source: rusqlite::Error| state_error(dest, source);
        let mut out = rusqlite::Connection::open(dest).map_err(e)?;
        let pages = {
            let backup = rusqlite::backup::Backup::new(conn, &mut out).map_err(e)?;
            // All pages in one step (-1): a step holds the source's read lock only while it
            // copies, so a daemon's writes wait at most that long, and the copy is one snapshot.
            loop {
                match backup.step(-1).map_err(e)? {
                    rusqlite::backup::StepResult::Done => break,
                    rusqlite::backup::StepResult::More => {}
                    // A writer holds the file for now: look again shortly.
                    _ => std::thread::sleep(std::time::Duration::from_millis(50)),
                }
            }
            let progress = backup.progress();
            u64::try_from(progress.pagecount).unwrap_or_default()
        };
        let integrity: String = out
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(e)?;
        drop(out);
        if integrity != "ok" {
            return Ok(BackupReport {
                pages,
                integrity,
                resources: Vec::new(),
            });
        }
        // The restore check: the copy opens as a state, with this state's key, and lists the
        // resources it holds.
        let mut resources = Vec::new();
        {
            let restored = Store::open_keyed(dest, Some(&self.key_source()))?;
            for env in restored.environments()? {
                let n = restored.resources_without_secrets(&env)?.len();
                if n > 0 {
                    resources.push((env, i64::try_from(n).unwrap_or(i64::MAX)));
                }
            }
        }
        // A copy of a WAL-mode file is a WAL-mode file: fold it into one file that stands
        // alone, to be copied or moved anywhere (gitplane turns WAL on again when it opens it).
        let out = rusqlite::Connection::open(dest).map_err(e)?;
        out.pragma_update(None, "journal_mode", "DELETE")
            .map_err(e)?;
        Ok(BackupReport {
            pages,
            integrity,
            resources,
        })
    }
}

/// The deployment id the next deployment gets at the earliest: what a resource forgotten now
/// is gone from. A range that ends there is seen by every deployment made before the surgery,
/// and by none after it.
fn next_deployment(tx: &Tx<'_>) -> DbResult<i64> {
    let max: Option<i64> = tx
        .prepare_cached("SELECT MAX(id) FROM deployment")?
        .query_row(params![], |r| r.get(0))?;
    Ok(max.unwrap_or(0) + 1)
}

/// The current version of `guresid` joins the ended ones, ending at `ended`.
fn end_current_version(tx: &Tx<'_>, guresid: &str, ended: i64) -> DbResult<()> {
    tx.prepare_cached(
        "INSERT INTO resource_version (guresid, env, app, type, class, res_id, definition,
                                       driver, status, inputs_hash, outputs, error, commit_id,
                                       valid_from, valid_to)
         SELECT guresid, env, app, type, class, res_id, definition, driver, status, inputs_hash,
                outputs, error, commit_id, COALESCE(version_from, deployment_id), ?2
         FROM resource WHERE guresid = ?1",
    )?
    .run(params![guresid, ended])?;
    Ok(())
}

/// The current links and bindings of `guresid`, both ways, end at `ended`.
fn close_links(tx: &Tx<'_>, guresid: &str, ended: i64) -> DbResult<()> {
    for sql in [
        "UPDATE link SET valid_to = ?2 WHERE (consumer = ?1 OR provider = ?1)
         AND valid_to IS NULL",
        "UPDATE binding SET valid_to = ?2 WHERE (needed_guresid = ?1 OR provided_guresid = ?1)
         AND valid_to IS NULL",
    ] {
        tx.prepare_cached(sql)?.run(params![guresid, ended])?;
    }
    Ok(())
}

/// Drops the recorded fingerprint of `app` of `env` (of every app for a shared resource): the
/// next apply must look at what the surgery changed, not skip it as unchanged. The census of
/// `env` goes too: the surgery may leave an app with resources and no fingerprint (moved or
/// imported into an app the repository no longer has), which the next apply must count.
fn forget_fingerprints(tx: &Tx<'_>, env: &str, app: Option<&str>) -> DbResult<()> {
    tx.prepare_cached("DELETE FROM app_census WHERE env = ?1")?
        .run([env])?;
    match app {
        Some(app) => tx
            .prepare_cached("DELETE FROM app_fingerprint WHERE env = ?1 AND app = ?2")?
            .run(params![env, app])?,
        None => tx
            .prepare_cached("DELETE FROM app_fingerprint WHERE env = ?1")?
            .run([env])?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::tests::{each_backend, record, start};

    use super::*;

    #[test]
    fn a_moved_resource_keeps_its_secrets_and_cookie_and_a_forgotten_one_leaves_nothing() {
        each_backend(|mut store| {
            let d = store.begin_deployment("development", "c1").unwrap();
            let op = store.begin_operation(&start(d)).unwrap();
            store
                .record_call(op, 1, "g1", Some(Some("cookie-1")))
                .unwrap();
            store.finish_put(op, 1, d, &record("g1"), None).unwrap();

            let taken = store.move_resource(
                "g1",
                &MoveTo {
                    guresid: "g1",
                    app: Some("shop"),
                    res_id: "x",
                },
            );
            assert!(matches!(taken, Err(StateError::Taken { .. })), "{taken:?}");
            let to = MoveTo {
                guresid: "g2",
                app: Some("store"),
                res_id: "renamed.db",
            };
            assert!(store.move_resource("g1", &to).unwrap());
            assert!(
                !store.move_resource("g1", &to).unwrap(),
                "nothing left at g1"
            );
            let moved = store.resources("development").unwrap();
            assert_eq!(moved.len(), 1);
            assert_eq!(
                (
                    moved[0].guresid.as_str(),
                    moved[0].app.as_deref(),
                    moved[0].res_id.as_str()
                ),
                ("g2", Some("store"), "renamed.db")
            );
            // Sealed for the new place, and opened there.
            assert_eq!(moved[0].secret_outputs["password"], "s3cret");
            assert_eq!(moved[0].inputs_hash, "h1");
            assert_eq!(store.cookie("g2").unwrap().as_deref(), Some("cookie-1"));
            assert_eq!(store.cookie("g1").unwrap(), None);

            assert!(store.forget_resource("g2").unwrap());
            assert!(store.resources("development").unwrap().is_empty());
            assert_eq!(store.cookie("g2").unwrap(), None);
            assert!(!store.forget_resource("g2").unwrap());
        });
    }
}
