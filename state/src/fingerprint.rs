//! App fingerprints, and what an apply that looks at some apps only reads: what each app's part
//! of the graph was made of when a deployment last left it all ready, which apps have resources
//! but no fingerprint (counted at a deployment's end, the census), and how many resources an
//! environment has.

use std::collections::{BTreeSet, HashMap};

use crate::db::{Backend, Column, DbResult, OptionalExtension, Tx, params};
use crate::{Result, Store};

/// An app's fingerprint as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppFingerprint {
    pub fingerprint: String,
    /// How many resources the app has.
    pub resources: i64,
}

/// What the end of an environment's newest deployment recorded about its apps
/// ([`Store::census`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census {
    /// The apps with resources and no fingerprint.
    pub unprinted: BTreeSet<String>,
    /// The [`fingerprints_digest`] of the recorded fingerprints and the sum of their resources,
    /// when known.
    pub prints: Option<(String, i64)>,
}

/// A digest of a set of fingerprints, `(app, fingerprint)` in any order: two sets give the same
/// digest only when they are the same set.
pub fn fingerprints_digest<'a>(prints: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    use sha2::{Digest, Sha256};
    let mut prints: Vec<(&str, &str)> = prints.into_iter().collect();
    prints.sort_unstable();
    let mut hasher = Sha256::new();
    for (app, fingerprint) in prints {
        // App names and fingerprints never hold a NUL: each pair reads back one way only.
        hasher.update(app.as_bytes());
        hasher.update([0]);
        hasher.update(fingerprint.as_bytes());
        hasher.update([0]);
    }
    format!("{:x}", hasher.finalize())
}

impl Store {
    /// The recorded fingerprints of the apps of `env`.
    pub fn fingerprints(&self, env: &str) -> Result<HashMap<String, AppFingerprint>> {
        if self.conn.backend() == Backend::Postgres {
            // Each row costs about a microsecond through the driver, 13 ms for the 10 000 apps
            // of a 50 000-resource environment; one text of them all, split here, a third.
            let packed: Option<String> = self
                .conn
                .prepare_cached(
                    "SELECT string_agg(app || chr(9) || fingerprint || chr(9) || resources, chr(10))
                     FROM app_fingerprint WHERE env = ?1",
                )
                .and_then(|mut s| s.query_row([env], |r| r.get(0)))
                .map_err(self.err())?;
            // An app or fingerprint with a tab or a line break (neither ever has one) is read
            // row by row.
            if let Some(fingerprints) = unpack(packed.as_deref().unwrap_or("")) {
                return Ok(fingerprints);
            }
        }
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
        self.in_transaction(|tx| write_fingerprints(tx, env, deployment, clean, cleared))
    }

    /// What a deployment records as it ends: [`Store::record_fingerprints`], and in the same
    /// transaction the census of `env` ([`Store::census`]): the apps with resources and no
    /// fingerprint once `deployment` is over, and `prints`, the digest of the fingerprints it
    /// leaves recorded with the sum of their resources. A deployment that changes nothing
    /// writes the census alone, one row.
    ///
    /// `deployment` must have looked at every app it wrote to and every app that had resources
    /// and no fingerprint when it began (as a deployment's scope does), and have held the
    /// environment's apply lock throughout. Then, if the census stood for the deployment before
    /// it, the apps without fingerprint afterwards are those of `cleared` that still have
    /// resources: a probe of each. Otherwise (a first census, a deployment cut short before,
    /// a surgery since) they are counted from the tables, once, and `prints` is not kept.
    pub fn record_fingerprints_and_census(
        &mut self,
        env: &str,
        deployment: i64,
        (clean, cleared): (&[(&str, &AppFingerprint)], &[&str]),
        prints: Option<(&str, i64)>,
    ) -> Result<()> {
        let path = self.path.clone();
        let e = |source| crate::state_error(&path, source);
        // Its commit need not wait for the disk (on PostgreSQL, one WAL flush less per
        // deployment, 1-4 ms after a large apply): the deployment's end is written durably
        // after it, flushing it too; lost to a server crash before that, the deployment was
        // not finished, so the next one counts (the census is older than it) and looks again
        // at every app whose fingerprint it lost.
        let tx = self.conn.transaction_unflushed().map_err(e)?;
        crate::lease::check_fences(&tx, &self.fences).map_err(e)?;
        let write = |tx: &Tx<'_>| -> DbResult<()> {
            if !(clean.is_empty() && cleared.is_empty()) {
                write_fingerprints(tx, env, deployment, clean, cleared)?;
            }
            let (before, census): (Option<i64>, Option<i64>) = tx
                .prepare_cached(
                    "SELECT (SELECT MAX(id) FROM deployment WHERE env = ?1 AND id < ?2),
                            (SELECT deployment_id FROM app_census WHERE env = ?1)",
                )?
                .query_row(params![env, deployment], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let carried = before.is_none() || before == census;
            let unprinted: Vec<String> = if carried {
                if cleared.is_empty() {
                    Vec::new()
                } else {
                    tx.prepare_cached(
                        "SELECT DISTINCT app FROM resource
                         WHERE env = ?1 AND app IN (SELECT value FROM json_each(?2))
                         ORDER BY app",
                    )?
                    .query_map(
                        params![
                            env,
                            serde_json::to_string(cleared).expect("strings serialise")
                        ],
                        |r| r.get(0),
                    )?
                    .collect::<DbResult<_>>()?
                }
            } else {
                counted_without_fingerprint(tx, env)?
            };
            let (digest, resources) = match prints.filter(|_| carried) {
                Some((digest, resources)) => (Some(digest), Some(resources)),
                None => (None, None),
            };
            tx.prepare_cached(
                "INSERT INTO app_census (env, deployment_id, unprinted, digest, resources)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (env) DO UPDATE SET deployment_id = excluded.deployment_id,
                     unprinted = excluded.unprinted, digest = excluded.digest,
                     resources = excluded.resources",
            )?
            .run(params![
                env,
                deployment,
                serde_json::to_string(&unprinted).expect("strings serialise"),
                digest,
                resources
            ])?;
            Ok(())
        };
        write(&tx).map_err(e)?;
        tx.commit().map_err(e)
    }

    /// The census of `env` recorded at the end of its newest deployment (two index seeks), if
    /// that deployment recorded one and no surgery came since.
    pub fn census(&self, env: &str) -> Result<Option<Census>> {
        let row: Option<(String, Option<String>, Option<i64>)> = self
            .conn
            .prepare_cached(
                "SELECT unprinted, digest, resources FROM app_census
                 WHERE env = ?1
                   AND deployment_id = (SELECT MAX(id) FROM deployment WHERE env = ?1)",
            )
            .and_then(|mut s| {
                s.query_row([env], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(self.err())?;
        // Written by this crate alone; unreadable, it is not trusted.
        Ok(row.and_then(|(unprinted, digest, resources)| {
            Some(Census {
                unprinted: serde_json::from_str(&unprinted).ok()?,
                prints: digest.zip(resources),
            })
        }))
    }

    /// The apps of `env` that have recorded resources but no fingerprint: from the census when
    /// there is one ([`Store::census`]), else counted from every resource row of the
    /// environment (tens of milliseconds at 50 000 resources on PostgreSQL).
    pub fn apps_without_fingerprint(&self, env: &str) -> Result<BTreeSet<String>> {
        if let Some(census) = self.census(env)? {
            return Ok(census.unprinted);
        }
        Ok(self
            .query(WITHOUT_FINGERPRINT, [env], |r| r.get(0))?
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

/// The lines `app TAB fingerprint TAB resources` of PostgreSQL's packed fingerprints; `None`
/// when one line does not have that shape.
fn unpack(packed: &str) -> Option<HashMap<String, AppFingerprint>> {
    if packed.is_empty() {
        return Some(HashMap::new());
    }
    packed
        .split('\n')
        .map(|line| {
            let mut fields = line.split('\t');
            let (app, fingerprint, resources) = (fields.next()?, fields.next()?, fields.next()?);
            if fields.next().is_some() {
                return None;
            }
            Some((
                app.to_owned(),
                AppFingerprint {
                    fingerprint: fingerprint.to_owned(),
                    resources: resources.parse().ok()?,
                },
            ))
        })
        .collect()
}

/// The writes of [`Store::record_fingerprints`], in `tx`.
fn write_fingerprints(
    tx: &Tx<'_>,
    env: &str,
    deployment: i64,
    clean: &[(&str, &AppFingerprint)],
    cleared: &[&str],
) -> DbResult<()> {
    if tx.backend() == Backend::Postgres {
        // A statement for all the apps, not one each: a round of the whole environment
        // records thousands. An app listed twice keeps its last, as one upsert after
        // the other would.
        let latest: HashMap<&str, &AppFingerprint> =
            clean.iter().map(|(app, f)| (*app, *f)).collect();
        let mut columns = [
            Column::text(),
            Column::text(),
            Column::text(),
            Column::int(),
            Column::int(),
        ];
        let [envs, apps, fingerprints, deployments, resources] = &mut columns;
        for (app, f) in latest {
            envs.push_text(Some(env));
            apps.push_text(Some(app));
            fingerprints.push_text(Some(&f.fingerprint));
            deployments.push_int(Some(deployment));
            resources.push_int(Some(f.resources));
        }
        if !apps.is_empty() {
            tx.prepare_cached(
                "INSERT INTO app_fingerprint (env, app, fingerprint, deployment_id,
                                              resources)
                 SELECT * FROM unnest(?1::text[], ?2::text[], ?3::text[], ?4::int8[],
                                      ?5::int8[])
                 ON CONFLICT (env, app) DO UPDATE SET fingerprint = excluded.fingerprint,
                     deployment_id = excluded.deployment_id,
                     resources = excluded.resources",
            )?
            .run(columns.each_mut().map(Column::finish))?;
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
}

/// The apps of `env` (`?1`) with resources and no fingerprint, from the tables: reads the index
/// entry of every resource of the environment.
const WITHOUT_FINGERPRINT: &str = "SELECT DISTINCT app FROM resource r
    WHERE env = ?1 AND app IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM app_fingerprint f WHERE f.env = ?1 AND f.app = r.app)
    ORDER BY app";

fn counted_without_fingerprint(tx: &Tx<'_>, env: &str) -> DbResult<Vec<String>> {
    tx.prepare_cached(WITHOUT_FINGERPRINT)?
        .query_map([env], |r| r.get(0))?
        .collect()
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

    /// Records a resource `guresid` of `app` in `development`, written by `deployment`.
    fn put(store: &mut Store, deployment: i64, guresid: &str, app: &str) {
        let op = store
            .begin_operation(&crate::OperationStart {
                guresid,
                app: Some(app),
                ..crate::tests::start(deployment)
            })
            .unwrap();
        let record = crate::ResourceRecord {
            app: Some(app.into()),
            ..crate::tests::record(guresid)
        };
        store.finish_put(op, 1, deployment, &record, None).unwrap();
    }

    fn set(apps: &[&str]) -> BTreeSet<String> {
        apps.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn the_census_answers_while_its_deployment_is_the_newest_and_is_counted_again_after() {
        crate::tests::each_backend(|mut store| {
            let env = "development";
            let fp = AppFingerprint {
                fingerprint: "f".into(),
                resources: 1,
            };
            let d1 = store.begin_deployment(env, "c1").unwrap();
            put(&mut store, d1, "g-a", "a");
            put(&mut store, d1, "g-b", "b");
            store
                .record_fingerprints_and_census(
                    env,
                    d1,
                    (&[("a", &fp), ("b", &fp)], &[]),
                    Some(("ab", 2)),
                )
                .unwrap();
            assert_eq!(store.apps_without_fingerprint(env).unwrap(), set(&[]));
            assert_eq!(
                store.census(env).unwrap(),
                Some(Census {
                    unprinted: set(&[]),
                    prints: Some(("ab".into(), 2))
                })
            );

            // A deployment that changes nothing carries the census on.
            let d2 = store.begin_deployment(env, "c1").unwrap();
            store
                .record_fingerprints_and_census(env, d2, (&[], &[]), Some(("ab", 2)))
                .unwrap();
            // A resource row written behind the census's back (no deployment, no surgery) is
            // not seen: the census answered, the resource rows were not read.
            put(&mut store, d2, "g-z", "z");
            assert_eq!(store.apps_without_fingerprint(env).unwrap(), set(&[]));

            // A newer deployment than the census's (running, or cut short): counted.
            let d3 = store.begin_deployment(env, "c2").unwrap();
            assert_eq!(store.census(env).unwrap(), None);
            assert_eq!(store.apps_without_fingerprint(env).unwrap(), set(&["z"]));
            // d3 leaves z unfinished (its resource stays) and removes b's: the census, carried
            // on from d2, names z alone.
            store
                .conn
                .execute("DELETE FROM resource WHERE guresid = ?1", ["g-b"])
                .unwrap();
            store
                .record_fingerprints_and_census(env, d3, (&[], &["z", "b"]), None)
                .unwrap();
            assert_eq!(store.apps_without_fingerprint(env).unwrap(), set(&["z"]));

            // A surgery drops the census: an imported resource of an app the repository does
            // not have is found.
            let imported = crate::ResourceRecord {
                app: Some("y".into()),
                ..crate::tests::record("g-y")
            };
            store
                .import_resource(&crate::Adopted {
                    record: &imported,
                    cookie: None,
                })
                .unwrap();
            assert_eq!(
                store.apps_without_fingerprint(env).unwrap(),
                set(&["y", "z"])
            );
            // The next deployment's end counts them again, the census being gone, and keeps
            // what it records: y left ready, z still unfinished.
            let d4 = store.begin_deployment(env, "c2").unwrap();
            store
                .record_fingerprints_and_census(env, d4, (&[("y", &fp)], &["z"]), Some(("aby", 3)))
                .unwrap();
            assert_eq!(store.apps_without_fingerprint(env).unwrap(), set(&["z"]));
            assert_eq!(
                store.census(env).unwrap().unwrap().prints,
                None,
                "after a surgery the deployment's own account of the fingerprints is not kept"
            );
            put(&mut store, d4, "g-x", "x");
            assert_eq!(
                store.apps_without_fingerprint(env).unwrap(),
                set(&["z"]),
                "answered by the census of d4"
            );
        });
    }

    #[test]
    fn the_digest_of_fingerprints_is_that_of_the_set() {
        let d = |p: &[(&'static str, &'static str)]| fingerprints_digest(p.iter().copied());
        assert_eq!(d(&[("a", "1"), ("b", "2")]), d(&[("b", "2"), ("a", "1")]));
        assert_ne!(d(&[("a", "1"), ("b", "2")]), d(&[("a", "2"), ("b", "1")]));
        assert_ne!(d(&[("a", "1")]), d(&[("a", "1"), ("b", "2")]));
        assert_ne!(d(&[("ab", "1")]), d(&[("a", "b1")]));
        assert_ne!(d(&[]), d(&[("a", "")]));
    }
}
