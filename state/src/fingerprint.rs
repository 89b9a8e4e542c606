//! App fingerprints, and what an apply that looks at some apps only reads: what each app's part
//! of the graph was made of when a deployment last left it all ready, and how many resources an
//! environment has.

use std::collections::{BTreeSet, HashMap};

use crate::db::{Backend, params};
use crate::{Result, Store};

/// An app's fingerprint as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppFingerprint {
    pub fingerprint: String,
    /// How many resources the app has.
    pub resources: i64,
}

impl Store {
    /// The recorded fingerprints of the apps of `env`.
    pub fn fingerprints(&self, env: &str) -> Result<HashMap<String, AppFingerprint>> {
        Ok(self
            .query(
                "SELECT app, fingerprint, resources FROM app_fingerprint WHERE env = ?1",
                [env],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        AppFingerprint {
                            fingerprint: r.get(1)?,
                            resources: r.get(2)?,
                        },
                    ))
                },
            )?
            .into_iter()
            .collect())
    }

    /// Records, with `deployment`, the fingerprints of the apps of `env` that it left all ready,
    /// and forgets those of `cleared` (apps it did not, or that are gone), in one transaction.
    pub fn record_fingerprints(
        &mut self,
        env: &str,
        deployment: i64,
        clean: &[(&str, &AppFingerprint)],
        cleared: &[&str],
    ) -> Result<()> {
        if clean.is_empty() && cleared.is_empty() {
            return Ok(());
        }
        self.in_transaction(|tx| {
            if tx.backend() == Backend::Postgres {
                // A statement for all the apps, not one each: a round of the whole environment
                // records thousands. An app listed twice keeps its last, as one upsert after
                // the other would.
                let rows: Vec<serde_json::Value> = clean
                    .iter()
                    .map(|(app, f)| (*app, f))
                    .collect::<HashMap<&str, _>>()
                    .into_iter()
                    .map(|(app, f)| {
                        serde_json::json!({
                            "env": env,
                            "app": app,
                            "fingerprint": f.fingerprint,
                            "deployment_id": deployment,
                            "resources": f.resources,
                        })
                    })
                    .collect();
                if !rows.is_empty() {
                    tx.prepare_cached(
                        "INSERT INTO app_fingerprint (env, app, fingerprint, deployment_id,
                                                      resources)
                         SELECT env, app, fingerprint, deployment_id, resources
                         FROM json_populate_recordset(NULL::app_fingerprint, ?1::json)
                         ON CONFLICT (env, app) DO UPDATE SET fingerprint = excluded.fingerprint,
                             deployment_id = excluded.deployment_id,
                             resources = excluded.resources",
                    )?
                    .run([serde_json::Value::Array(rows).to_string()])?;
                }
                if !cleared.is_empty() {
                    tx.prepare_cached(
                        "DELETE FROM app_fingerprint
                         WHERE env = ?1 AND app IN (SELECT value FROM json_each(?2))",
                    )?
                    .run(params![
                        env,
                        serde_json::to_string(cleared).expect("strings serialise")
                    ])?;
                }
                return Ok(());
            }
            let mut upsert = tx.prepare_cached(
                "INSERT INTO app_fingerprint (env, app, fingerprint, deployment_id, resources)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (env, app) DO UPDATE SET fingerprint = excluded.fingerprint,
                     deployment_id = excluded.deployment_id, resources = excluded.resources",
            )?;
            for (app, f) in clean {
                upsert.run(params![env, app, f.fingerprint, deployment, f.resources])?;
            }
            let mut delete =
                tx.prepare_cached("DELETE FROM app_fingerprint WHERE env = ?1 AND app = ?2")?;
            for app in cleared {
                delete.run(params![env, app])?;
            }
            Ok(())
        })
    }

    /// The apps of `env` that have recorded resources.
    pub fn recorded_apps(&self, env: &str) -> Result<BTreeSet<String>> {
        Ok(self
            .query(
                "SELECT DISTINCT app FROM resource WHERE env = ?1 AND app IS NOT NULL",
                [env],
                |r| r.get(0),
            )?
            .into_iter()
            .collect())
    }

    /// Whether `env` keeps a global resource (one of no app) as an orphan: only a deployment of
    /// the whole environment deletes it.
    pub fn has_global_orphans(&self, env: &str) -> Result<bool> {
        self.conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM resource
                                WHERE env = ?1 AND orphan_since IS NOT NULL AND app IS NULL)",
            )
            .and_then(|mut s| s.query_row([env], |r| r.get(0)))
            .map_err(self.err())
    }

    /// How many resources `env` has recorded.
    pub fn resource_count(&self, env: &str) -> Result<i64> {
        self.conn
            .prepare_cached("SELECT COUNT(*) FROM resource WHERE env = ?1")
            .and_then(|mut s| s.query_row([env], |r| r.get(0)))
            .map_err(self.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_recorded_replaced_and_forgotten_on_both_backends() {
        crate::tests::each_backend(|mut store| {
            let env = "development";
            let d1 = store.begin_deployment(env, "c1").unwrap();
            let fp = |fingerprint: &str, resources| AppFingerprint {
                fingerprint: fingerprint.into(),
                resources,
            };
            let (a1, b1, a2, c1) = (fp("a1", 5), fp("b1", 3), fp("a2", 6), fp("c1", 1));
            store
                .record_fingerprints(env, d1, &[("a", &a1), ("b", &b1)], &[])
                .unwrap();
            assert_eq!(
                store.fingerprints(env).unwrap(),
                HashMap::from([("a".into(), a1), ("b".into(), b1)])
            );
            // Replaced, forgotten (and one never recorded, forgotten all the same), added.
            store
                .record_fingerprints(env, d1, &[("a", &a2), ("c", &c1)], &["b", "gone"])
                .unwrap();
            assert_eq!(
                store.fingerprints(env).unwrap(),
                HashMap::from([("a".into(), a2), ("c".into(), c1)])
            );
            store
                .record_fingerprints(env, d1, &[], &["a", "c"])
                .unwrap();
            assert!(store.fingerprints(env).unwrap().is_empty());
        });
    }
}
