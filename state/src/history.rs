//! Links, bindings and their history: rows valid from one deployment to another, changed only
//! where the graph changed, and pruned by retention.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::db::{Backend, DbResult, OptionalExtension, Row, Tx, params};
use crate::{BindingRecord, LinkRecord, Result, Store};

/// How the links of an environment change in one deployment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkChanges {
    /// `(consumer, provider)` of links that end.
    pub removed: Vec<(String, String)>,
    /// Links that start (a link whose kind or update type changed is removed and added).
    pub added: Vec<LinkRecord>,
}

impl LinkChanges {
    /// What turns the links `current` into `wanted`.
    pub fn between(current: &[LinkRecord], wanted: Vec<LinkRecord>) -> LinkChanges {
        let mut changes = LinkChanges::default();
        {
            let next: HashMap<(&str, &str), &LinkRecord> = wanted
                .iter()
                .map(|l| ((l.consumer.as_str(), l.provider.as_str()), l))
                .collect();
            for l in current {
                if next.get(&(l.consumer.as_str(), l.provider.as_str())) != Some(&l) {
                    changes
                        .removed
                        .push((l.consumer.clone(), l.provider.clone()));
                }
            }
        }
        let now: HashMap<(&str, &str), &LinkRecord> = current
            .iter()
            .map(|l| ((l.consumer.as_str(), l.provider.as_str()), l))
            .collect();
        changes.added = wanted
            .into_iter()
            .filter(|l| now.get(&(l.consumer.as_str(), l.provider.as_str())) != Some(&l))
            .collect();
        changes.added.sort();
        changes
            .added
            .dedup_by(|a, b| a.consumer == b.consumer && a.provider == b.provider);
        changes
    }

    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }
}

/// How long history is kept (`history.keep` in the host config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// The newest N deployments of each environment.
    Deployments(u64),
    /// Deployments started within this long.
    Age(Duration),
}

/// What pruning removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub deployments: usize,
    pub operations: usize,
    /// Link, binding and resource-version rows no kept deployment could see.
    pub history_rows: usize,
    pub commits_seen: usize,
}

impl Store {
    /// The current links of `env`, ordered by consumer and provider.
    pub fn links(&self, env: &str) -> Result<Vec<LinkRecord>> {
        self.query(
            "SELECT consumer, provider, kind, update_type FROM link
             WHERE env = ?1 AND valid_to IS NULL ORDER BY consumer, provider",
            [env],
            link_row,
        )
    }

    /// The current links of `env` whose consumer is one of `consumers`.
    pub fn links_from(&self, env: &str, consumers: &[&str]) -> Result<Vec<LinkRecord>> {
        if consumers.is_empty() {
            return Ok(Vec::new());
        }
        let consumers = serde_json::to_string(consumers).expect("strings serialise");
        self.query(
            "SELECT consumer, provider, kind, update_type FROM link
             WHERE env = ?1 AND valid_to IS NULL
               AND consumer IN (SELECT value FROM json_each(?2))
             ORDER BY consumer, provider",
            params![env, consumers],
            link_row,
        )
    }

    /// Ends and starts links with `deployment`, in one transaction. A link that `deployment`
    /// itself started (a resumed deployment) and now ends leaves no trace.
    pub fn record_link_changes(
        &mut self,
        deployment: i64,
        env: &str,
        changes: &LinkChanges,
    ) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        self.in_transaction(|tx| {
            {
                let mut drop = tx.prepare_cached(
                    "DELETE FROM link WHERE env = ?1 AND consumer = ?2 AND provider = ?3
                        AND valid_to IS NULL AND valid_from = ?4",
                )?;
                let mut close = tx.prepare_cached(
                    "UPDATE link SET valid_to = ?4 WHERE env = ?1 AND consumer = ?2
                        AND provider = ?3 AND valid_to IS NULL",
                )?;
                for (consumer, provider) in &changes.removed {
                    let args = params![env, consumer, provider, deployment];
                    drop.run(args)?;
                    close.run(args)?;
                }
            }
            // One current row per pair, whatever the caller saw: a current row it did not know
            // of takes the new link's place (the insert looks the pair up anyway).
            if tx.backend() == Backend::Postgres {
                // One statement, in which a pair may appear once: the last of a pair wins, as
                // it does one insert after the other.
                let mut at: HashMap<(&str, &str), usize> = HashMap::new();
                let mut links: Vec<&LinkRecord> = Vec::new();
                for l in &changes.added {
                    match at.entry((&l.consumer, &l.provider)) {
                        std::collections::hash_map::Entry::Occupied(i) => links[*i.get()] = l,
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(links.len());
                            links.push(l);
                        }
                    }
                }
                return crate::bulk::insert_links(tx, env, deployment, &links);
            }
            let mut insert = tx.prepare_cached(
                "INSERT INTO link (env, consumer, provider, kind, update_type, valid_from)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (env, consumer, provider) WHERE valid_to IS NULL DO UPDATE SET
                     kind = excluded.kind, update_type = excluded.update_type,
                     valid_from = excluded.valid_from",
            )?;
            // In the order of the pairs (stably: the last of a pair still wins), so the index
            // of current pairs grows at its end rather than at a random page each: a first
            // apply records tens of thousands.
            let mut added: Vec<&LinkRecord> = changes.added.iter().collect();
            added.sort_by(|a, b| (&a.consumer, &a.provider).cmp(&(&b.consumer, &b.provider)));
            for l in added {
                insert.run(params![
                    env,
                    l.consumer,
                    l.provider,
                    l.kind,
                    l.update_type,
                    deployment
                ])?;
            }
            Ok(())
        })
    }

    /// The current bindings of `guresid`, in the order they were recorded.
    pub fn current_bindings(&self, guresid: &str) -> Result<Vec<BindingRecord>> {
        self.query(
            "SELECT needed_guresid, needed_path, provided_guresid, provided_path, data_type,
                    value, secret, inserted, interface
             FROM binding WHERE needed_guresid = ?1 AND valid_to IS NULL ORDER BY id",
            [guresid],
            binding_row,
        )
    }

    /// The resources of `env` that have current bindings.
    pub fn bound(&self, env: &str) -> Result<std::collections::HashSet<String>> {
        Ok(self
            .query(
                "SELECT DISTINCT needed_guresid FROM binding WHERE env = ?1 AND valid_to IS NULL",
                [env],
                |r| r.get(0),
            )?
            .into_iter()
            .collect())
    }

    /// Whether any resource of `env` has current bindings.
    pub fn has_bindings(&self, env: &str) -> Result<bool> {
        self.conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM binding WHERE env = ?1 AND valid_to IS NULL)",
            )
            .and_then(|mut s| s.query_row([env], |r| r.get(0)))
            .map_err(self.err())
    }

    /// Makes the current bindings of each resource in `resolved` exactly its list, with
    /// `deployment`, in one transaction: bindings that stay keep their rows, the others end or
    /// start. A resource that is not listed keeps its bindings. Each entry says whether the
    /// resource may have current bindings (see [`Store::bound`]); one that has none is not
    /// looked up.
    pub fn record_bindings(
        &mut self,
        deployment: i64,
        env: &str,
        resolved: &[(&str, bool, Vec<BindingRecord>)],
    ) -> Result<()> {
        if resolved.is_empty() {
            return Ok(());
        }
        self.in_transaction(|tx| record_bindings(tx, deployment, env, resolved))
    }

    /// The current links of `guresid` both ways (as consumer and as provider) in `env`, with
    /// the newest deployment of `env` that ran; `None` when `env` has no links.
    pub fn resource_links(
        &self,
        env: &str,
        guresid: &str,
    ) -> Result<Option<(i64, Vec<LinkRecord>)>> {
        let deployment: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT MAX(d.id) FROM deployment d
                 WHERE d.env = ?1 AND d.status != 'held'
                   AND EXISTS (SELECT 1 FROM link l WHERE l.env = ?1 AND l.valid_to IS NULL)",
            )
            .and_then(|mut s| s.query_row([env], |r| r.get(0)))
            .map_err(self.err())?;
        let Some(deployment) = deployment else {
            return Ok(None);
        };
        let mut links = self.query(
            "SELECT consumer, provider, kind, update_type FROM link
             WHERE env = ?1 AND consumer = ?2 AND valid_to IS NULL",
            params![env, guresid],
            link_row,
        )?;
        links.extend(self.query(
            "SELECT consumer, provider, kind, update_type FROM link
             WHERE provider = ?2 AND env = ?1 AND valid_to IS NULL",
            params![env, guresid],
            link_row,
        )?);
        links.sort();
        links.dedup();
        Ok(Some((deployment, links)))
    }

    /// Removes the history no deployment kept by `keep` can see: older deployments (but those
    /// that made a current resource row, which stay with it) and their operations, link,
    /// binding and resource-version rows that ended before the oldest kept deployment, and
    /// commits seen before it. Current rows are never removed. One transaction.
    pub fn prune(&mut self, keep: Retention) -> Result<Pruned> {
        let envs = self.environments()?;
        // The time `age` ago, computed by SQLite so it has the format of `started_at`.
        let cutoff_time: Option<String> = match keep {
            Retention::Age(age) => Some(
                self.conn
                    .query_row(
                        "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)",
                        [format!("-{} seconds", age.as_secs())],
                        |r| r.get(0),
                    )
                    .map_err(self.err())?,
            ),
            Retention::Deployments(_) => None,
        };
        self.in_transaction(|tx| {
            let mut pruned = Pruned::default();
            let mut oldest_kept: Option<String> = None;
            for env in &envs {
                let cut: Option<i64> = match (keep, &cutoff_time) {
                    (Retention::Deployments(n), _) => tx
                        .prepare_cached(
                            "SELECT id FROM deployment WHERE env = ?1
                             ORDER BY id DESC LIMIT 1 OFFSET ?2",
                        )?
                        .query_row(params![env, n.max(1) as i64 - 1], |r| r.get(0))
                        .optional()?,
                    (Retention::Age(_), Some(time)) => tx
                        .prepare_cached(
                            "SELECT COALESCE(
                                 (SELECT MIN(id) FROM deployment WHERE env = ?1 AND started_at >= ?2),
                                 (SELECT MAX(id) FROM deployment WHERE env = ?1))",
                        )?
                        .query_row(params![env, time], |r| r.get(0))?,
                    (Retention::Age(_), None) => None,
                };
                let Some(cut) = cut else {
                    continue;
                };
                let started: Option<String> = tx
                    .prepare_cached("SELECT started_at FROM deployment WHERE id = ?1")?
                    .query_row([cut], |r| r.get(0))
                    .optional()?;
                if let Some(started) = started
                    && oldest_kept.as_ref().is_none_or(|o| started < *o)
                {
                    oldest_kept = Some(started);
                }
                const GONE: &str = "SELECT id FROM deployment WHERE env = ?1 AND id < ?2
                      AND status != 'running'
                      AND id NOT IN (SELECT deployment_id FROM resource WHERE env = ?1)";
                pruned.operations += tx
                    .prepare_cached(&format!(
                        "DELETE FROM operation WHERE deployment_id IN ({GONE})"
                    ))?
                    .execute(params![env, cut])?;
                tx.prepare_cached(&format!(
                    "DELETE FROM drift_finding WHERE deployment_id IN ({GONE})"
                ))?
                .execute(params![env, cut])?;
                pruned.deployments += tx
                    .prepare_cached(&format!("DELETE FROM deployment WHERE id IN ({GONE})"))?
                    .execute(params![env, cut])?;
                for table in ["link", "binding", "resource_version"] {
                    pruned.history_rows += tx
                        .prepare_cached(&format!(
                            "DELETE FROM {table} WHERE env = ?1 AND valid_to IS NOT NULL
                               AND valid_to <= ?2"
                        ))?
                        .execute(params![env, cut])?;
                }
            }
            if let Some(oldest) = oldest_kept {
                pruned.commits_seen += tx
                    .prepare_cached("DELETE FROM commit_seen WHERE seen_at < ?1")?
                    .execute([oldest])?;
            }
            Ok(pruned)
        })
    }

    /// Rebuilds the file so the space pruned rows held returns to the file system, and makes
    /// later space reclaimable without a rebuild (`auto_vacuum = INCREMENTAL`). Returns the
    /// file's size before and after, in bytes.
    pub fn vacuum(&mut self) -> Result<(u64, u64)> {
        let postgres = self.conn.backend() == Backend::Postgres;
        let size = |s: &Store| -> Result<u64> {
            let sql = if postgres {
                "SELECT pg_database_size(current_database())"
            } else {
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
            };
            let bytes: i64 = s
                .conn
                .query_row(sql, params![], |r| r.get(0))
                .map_err(s.err())?;
            Ok(bytes as u64)
        };
        let before = size(self)?;
        // PostgreSQL's own VACUUM returns dead rows' space for reuse; autovacuum does it too.
        let sql = if postgres {
            "VACUUM"
        } else {
            "PRAGMA auto_vacuum = INCREMENTAL; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);"
        };
        self.conn.execute_batch(sql).map_err(self.err())?;
        Ok((before, size(self)?))
    }

    /// Returns free pages to the file system, a little at a time, when the file allows it
    /// (`auto_vacuum = INCREMENTAL`, set on new files and by [`Store::vacuum`]). PostgreSQL's
    /// autovacuum does this itself.
    pub fn reclaim(&mut self, pages: u32) -> Result<()> {
        if self.conn.backend() == Backend::Postgres {
            return Ok(());
        }
        self.conn
            .query_row(
                &format!("PRAGMA incremental_vacuum({pages})"),
                params![],
                |_| Ok(()),
            )
            .optional()
            .map_err(self.err())?;
        Ok(())
    }
}

/// A binding as stored, to compare a resource's bindings with its rows.
#[derive(Debug, PartialEq)]
struct BindingKey {
    needed_path: String,
    provided: String,
    provided_path: String,
    data_type: String,
    value: Option<String>,
    secret: bool,
    inserted: bool,
    interface: Option<String>,
}

impl BindingKey {
    fn of(b: &BindingRecord) -> BindingKey {
        BindingKey {
            needed_path: b.needed_path.clone(),
            provided: b.provided.clone(),
            provided_path: b.provided_path.clone(),
            data_type: b.data_type.clone(),
            value: b.value.as_ref().map(Value::to_string),
            secret: b.secret,
            inserted: b.inserted,
            interface: b.interface.clone(),
        }
    }
}

fn link_row(r: &Row<'_>) -> DbResult<LinkRecord> {
    Ok(LinkRecord {
        consumer: r.get(0)?,
        provider: r.get(1)?,
        kind: r.get(2)?,
        update_type: r.get(3)?,
    })
}

pub(crate) fn binding_row(r: &Row<'_>) -> DbResult<BindingRecord> {
    Ok(BindingRecord {
        needed: r.get(0)?,
        needed_path: r.get(1)?,
        provided: r.get(2)?,
        provided_path: r.get(3)?,
        data_type: r.get(4)?,
        value: match r.get::<_, Option<String>>(5)? {
            None => None,
            Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
                let row = format!(
                    "{} <- {}",
                    r.get::<_, String>(0).unwrap_or_default(),
                    r.get::<_, String>(2).unwrap_or_default()
                );
                crate::damaged("binding", row, format!("column value is not JSON: {e}"))
            })?),
        },
        secret: r.get(6)?,
        inserted: r.get(7)?,
        interface: r.get(8)?,
    })
}

/// See [`Store::record_bindings`].
pub(crate) fn record_bindings(
    tx: &Tx<'_>,
    deployment: i64,
    env: &str,
    resolved: &[(&str, bool, Vec<BindingRecord>)],
) -> DbResult<()> {
    let mut current = tx.prepare_cached(
        "SELECT id, valid_from, needed_path, provided_guresid, provided_path, data_type,
                value, secret, inserted, interface
         FROM binding WHERE needed_guresid = ?1 AND valid_to IS NULL",
    )?;
    let mut drop = tx.prepare_cached("DELETE FROM binding WHERE id = ?1")?;
    let mut close = tx.prepare_cached("UPDATE binding SET valid_to = ?2 WHERE id = ?1")?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO binding (env, needed_guresid, needed_path, provided_guresid,
                              provided_path, data_type, value, secret, inserted,
                              interface, valid_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?;
    // PostgreSQL: the new rows in one statement after the loop (none of them is a row the
    // loop ends or drops).
    let mut gathered: Option<crate::bulk::BindingRows> =
        (tx.backend() == Backend::Postgres).then(crate::bulk::BindingRows::new);
    for (guresid, bound, bindings) in resolved {
        let mut wanted: Vec<BindingKey> = bindings.iter().map(BindingKey::of).collect();
        let rows = if *bound {
            current
                .query_map([guresid], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        BindingKey {
                            needed_path: r.get(2)?,
                            provided: r.get(3)?,
                            provided_path: r.get(4)?,
                            data_type: r.get(5)?,
                            value: r.get(6)?,
                            secret: r.get(7)?,
                            inserted: r.get(8)?,
                            interface: r.get(9)?,
                        },
                    ))
                })?
                .collect::<DbResult<Vec<_>>>()?
        } else {
            Vec::new()
        };
        for (id, valid_from, key) in rows {
            match wanted.iter().position(|w| *w == key) {
                // Unchanged: the row stays as it is.
                Some(i) => {
                    wanted.swap_remove(i);
                }
                None if valid_from == deployment => {
                    drop.run([id])?;
                }
                None => {
                    close.run(params![id, deployment])?;
                }
            }
        }
        // Insert in the order the resource lists them.
        for b in bindings {
            let key = BindingKey::of(b);
            let Some(i) = wanted.iter().position(|w| *w == key) else {
                continue;
            };
            wanted.swap_remove(i);
            if let Some(rows) = gathered.as_mut() {
                rows.push(&crate::bulk::BindingRow {
                    env,
                    needed_guresid: guresid,
                    needed_path: &key.needed_path,
                    provided_guresid: &key.provided,
                    provided_path: &key.provided_path,
                    data_type: &key.data_type,
                    value: key.value.as_deref(),
                    secret: key.secret,
                    inserted: key.inserted,
                    interface: key.interface.as_deref(),
                    valid_from: deployment,
                });
                continue;
            }
            insert.run(params![
                env,
                guresid,
                key.needed_path,
                key.provided,
                key.provided_path,
                key.data_type,
                key.value,
                key.secret,
                key.inserted,
                key.interface,
                deployment
            ])?;
        }
    }
    match gathered {
        Some(rows) => crate::bulk::insert_bindings(tx, rows),
        None => Ok(()),
    }
}
