//! Journal writes gathered per transaction, so an operation that starts and ends in the same
//! batch is written once, ended, and (on PostgreSQL) a batch's rows go as one statement per table
//! (`json_populate_recordset` of a JSON array), not one statement each.
//!
//! Both backends gather the operations a batch starts, with their calls and ends merged in when
//! they come in the same transaction: a driver that answers in process starts and ends its
//! operation in one batch, and one insert of the ended row costs half of an insert and an update.
//! On PostgreSQL, where each statement costs a message and an executor start on the server,
//! new resources with their secrets and manifests are gathered too; SQLite runs in process,
//! where a statement costs microseconds, and writes those rows at once. Only what nothing else
//! in the transaction reads before the commit is gathered. A write that reads or changes those
//! tables otherwise (an update of a recorded resource, a delete) writes what is gathered first,
//! so the transaction sees its writes in their order.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::NOW;
use crate::db::{Backend, DbResult, Tx, params};
use crate::journal::RESOURCE_UPSERT;

/// Rows gathered for one transaction; [`Bulk::flush`] writes them.
pub(crate) struct Bulk {
    backend: Backend,
    /// Operations started, by id: each row as it will be inserted.
    operations: Vec<OperationRow>,
    operation_at: HashMap<i64, usize>,
    /// SQLite: the highest id given out by [`Bulk::operation_ids`] in this transaction, whose
    /// row may not be written yet.
    reserved_to: i64,
    /// PostgreSQL: new resources, their secrets and manifests, each by GUResID.
    resources: Keyed,
    secrets: Keyed,
    manifests: Keyed,
    /// The transaction's time, read once: the rows of a batch are written in the same
    /// millisecond or so, and formatting the time for each of tens of thousands of rows costs
    /// a twentieth of their writing.
    now: Option<String>,
}

/// An `operation` row as gathered (its times are the flush's).
#[derive(Serialize)]
struct OperationRow {
    id: i64,
    deployment_id: i64,
    guresid: String,
    app: Option<String>,
    #[serde(rename = "type")]
    res_type: String,
    class: String,
    res_id: String,
    action: String,
    reason: String,
    status: String,
    attempts: i64,
    outputs_changed: Option<i64>,
    error: Option<String>,
}

/// Rows of one table, at most one per key.
#[derive(Default)]
struct Keyed {
    rows: Vec<Value>,
    keys: std::collections::HashSet<String>,
}

impl Keyed {
    fn has(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    fn push(&mut self, key: &str, row: Value) {
        self.keys.insert(key.to_owned());
        self.rows.push(row);
    }

    fn take(&mut self) -> Option<String> {
        self.keys.clear();
        if self.rows.is_empty() {
            return None;
        }
        Some(Value::Array(std::mem::take(&mut self.rows)).to_string())
    }
}

/// How an operation ended, merged into its row.
pub(crate) struct OperationEnd<'a> {
    pub status: &'a str,
    pub error: Option<&'a str>,
    pub attempts: i64,
    /// `None` leaves the column as it is (NULL for an operation that only starts here).
    pub outputs_changed: Option<bool>,
}

impl Bulk {
    /// Rows to gather for a transaction of `tx`'s backend.
    pub(crate) fn of(tx: &Tx<'_>) -> Option<Bulk> {
        Some(Bulk {
            backend: tx.backend(),
            operations: Vec::new(),
            operation_at: HashMap::new(),
            reserved_to: 0,
            resources: Keyed::default(),
            secrets: Keyed::default(),
            manifests: Keyed::default(),
            now: None,
        })
    }

    /// On SQLite, the time this transaction's rows are written at, as `NOW` gives it; on
    /// PostgreSQL `None`, where `NOW` is the transaction's time already and a read of it would
    /// cost a round trip.
    pub(crate) fn now(&mut self, tx: &Tx<'_>) -> DbResult<Option<&str>> {
        if self.backend == Backend::Postgres {
            return Ok(None);
        }
        if self.now.is_none() {
            let now: String = tx
                .prepare_cached(&format!("SELECT {NOW}"))?
                .query_row(params![], |r| r.get(0))?;
            self.now = Some(now);
        }
        Ok(self.now.as_deref())
    }

    /// Whether new resources' rows are gathered too (PostgreSQL), not written at once.
    pub(crate) fn gathers_rows(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// Ids for `n` operations, in ascending order, in one round trip: the operations' rows are
    /// then gathered with their ids. On SQLite the transaction holds the write lock from its
    /// start (`BEGIN IMMEDIATE`), so the ids after the highest one are this transaction's to
    /// give.
    pub(crate) fn operation_ids(&mut self, tx: &Tx<'_>, n: usize) -> DbResult<Vec<i64>> {
        if self.backend == Backend::Sqlite {
            let highest: i64 = tx
                .prepare_cached("SELECT coalesce(max(id), 0) FROM operation")?
                .query_row(params![], |r| r.get(0))?;
            let first = highest.max(self.reserved_to) + 1;
            let ids: Vec<i64> = (first..).take(n).collect();
            self.reserved_to = ids.last().copied().unwrap_or(self.reserved_to);
            return Ok(ids);
        }
        let mut ids: Vec<i64> = tx
            .prepare_cached(
                "SELECT nextval(pg_get_serial_sequence('operation', 'id'))
                 FROM generate_series(1, ?1)",
            )?
            .query_map([n], |r| r.get(0))?
            .collect::<DbResult<Vec<i64>>>()?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Gathers the start of operation `id`.
    pub(crate) fn start(&mut self, id: i64, op: &crate::OperationStart<'_>) {
        self.operation_at.insert(id, self.operations.len());
        self.operations.push(OperationRow {
            id,
            deployment_id: op.deployment,
            guresid: op.guresid.to_owned(),
            app: op.app.map(str::to_owned),
            res_type: op.res_type.to_owned(),
            class: op.class.to_owned(),
            res_id: op.res_id.to_owned(),
            action: op.action.to_owned(),
            reason: op.reason.to_owned(),
            status: "started".to_owned(),
            attempts: 0,
            outputs_changed: None,
            error: None,
        });
    }

    /// Gathers the start of operation `id`, taking `row`'s values rather than copying them: the
    /// journal's writer starts tens of thousands of operations a first apply.
    pub(crate) fn start_row(&mut self, id: i64, deployment: i64, row: crate::StartRow) {
        self.operation_at.insert(id, self.operations.len());
        self.operations.push(OperationRow {
            id,
            deployment_id: deployment,
            guresid: row.guresid,
            app: row.app,
            res_type: row.res_type,
            class: row.class,
            res_id: row.res_id,
            action: row.action.to_owned(),
            reason: row.reason,
            status: "started".to_owned(),
            attempts: 0,
            outputs_changed: None,
            error: None,
        });
    }

    /// Merges the calls made so far into operation `id`, if gathered here.
    pub(crate) fn calls(&mut self, id: i64, attempts: i64) -> bool {
        match self.operation_at.get(&id) {
            Some(&i) => {
                self.operations[i].attempts = attempts;
                true
            }
            None => false,
        }
    }

    /// Merges the end of operation `id` into its row, if gathered here.
    pub(crate) fn end(&mut self, id: i64, end: &OperationEnd<'_>) -> bool {
        let Some(&i) = self.operation_at.get(&id) else {
            return false;
        };
        let row = &mut self.operations[i];
        end.status.clone_into(&mut row.status);
        row.error = end.error.map(str::to_owned);
        row.attempts = end.attempts;
        if let Some(changed) = end.outputs_changed {
            row.outputs_changed = Some(i64::from(changed));
        }
        true
    }

    /// Gathers a new resource's row (the columns of `resource` but its times), first writing
    /// what is gathered when it already holds one for the same resource.
    pub(crate) fn resource(&mut self, tx: &Tx<'_>, guresid: &str, row: Value) -> DbResult<()> {
        if self.resources.has(guresid) {
            self.flush(tx)?;
        }
        self.resources.push(guresid, row);
        Ok(())
    }

    /// Gathers a new resource's secrets (sealed), after its resource.
    pub(crate) fn secret(&mut self, guresid: &str, outputs: &str, inputs: &str) {
        debug_assert!(self.resources.has(guresid));
        self.secrets.push(
            guresid,
            json!({"guresid": guresid, "outputs": outputs, "inputs": inputs}),
        );
    }

    /// Gathers a new resource's manifests, after its resource.
    pub(crate) fn manifests(&mut self, guresid: &str, shown: &str, sealed: Option<&str>) {
        debug_assert!(self.resources.has(guresid));
        self.manifests.push(
            guresid,
            json!({"guresid": guresid, "manifests": shown, "sealed": sealed}),
        );
    }

    /// Writes what is gathered, a statement per table, in the order the rows depend on each
    /// other (a resource before its secrets and manifests). The statements are pipelined: their
    /// errors come back at the transaction's next waiting call, at the latest its commit.
    pub(crate) fn flush(&mut self, tx: &Tx<'_>) -> DbResult<()> {
        self.operation_at.clear();
        let operations = std::mem::take(&mut self.operations);
        if !operations.is_empty() {
            let now = self.now(tx)?.map(str::to_owned);
            write_operations(tx, self.backend, &operations, now.as_deref())?;
        }
        if let Some(rows) = self.resources.take() {
            tx.prepare_cached(&format!(
                "INSERT INTO resource (guresid, env, app, type, class, res_id, definition, driver,
                                       status, inputs_hash, outputs, error, commit_id,
                                       deployment_id, inputs, account, deletion_policy,
                                       template_hash, version_from, created_at, updated_at)
                 SELECT guresid, env, app, type, class, res_id, definition, driver, status,
                        inputs_hash, outputs, error, commit_id, deployment_id, inputs, account,
                        deletion_policy, template_hash, version_from, {NOW}, {NOW}
                 FROM json_populate_recordset(NULL::resource, ?1::json)
                 {RESOURCE_UPSERT}"
            ))?
            .run([rows])?;
        }
        if let Some(rows) = self.secrets.take() {
            tx.prepare_cached(
                "INSERT INTO resource_secret (guresid, outputs, inputs)
                 SELECT guresid, outputs, inputs
                 FROM json_populate_recordset(NULL::resource_secret, ?1::json)
                 ON CONFLICT (guresid) DO UPDATE SET outputs = excluded.outputs,
                     inputs = excluded.inputs",
            )?
            .run([rows])?;
        }
        if let Some(rows) = self.manifests.take() {
            tx.prepare_cached(
                "INSERT INTO resource_manifest (guresid, manifests, sealed)
                 SELECT guresid, manifests, sealed
                 FROM json_populate_recordset(NULL::resource_manifest, ?1::json)
                 ON CONFLICT (guresid) DO UPDATE SET manifests = excluded.manifests,
                     sealed = excluded.sealed",
            )?
            .run([rows])?;
        }
        Ok(())
    }
}

/// Inserts gathered operations: on SQLite a prepared insert each (in process, a statement costs
/// microseconds) at the transaction's time `now`, on PostgreSQL one statement for all.
fn write_operations(
    tx: &Tx<'_>,
    backend: Backend,
    operations: &[OperationRow],
    now: Option<&str>,
) -> DbResult<()> {
    if backend == Backend::Sqlite {
        let mut insert = tx.prepare_cached(
            "INSERT INTO operation (id, deployment_id, guresid, app, type, class, res_id,
                                    action, reason, status, attempts, outputs_changed, error,
                                    started_at, finished_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,
                     CASE WHEN ?10 = 'started' THEN NULL ELSE ?14 END)",
        )?;
        for o in operations {
            insert.run(params![
                o.id,
                o.deployment_id,
                o.guresid,
                o.app,
                o.res_type,
                o.class,
                o.res_id,
                o.action,
                o.reason,
                o.status,
                o.attempts,
                o.outputs_changed,
                o.error,
                now
            ])?;
        }
        return Ok(());
    }
    let rows = serde_json::to_string(operations).expect("operation rows serialise");
    tx.prepare_cached(&format!(
        "INSERT INTO operation (id, deployment_id, guresid, app, type, class, res_id,
                                action, reason, status, attempts, outputs_changed, error,
                                started_at, finished_at)
         SELECT id, deployment_id, guresid, app, type, class, res_id, action, reason,
                status, attempts, outputs_changed, error, {NOW},
                CASE WHEN status = 'started' THEN NULL ELSE {NOW} END
         FROM json_populate_recordset(NULL::operation, ?1::json)"
    ))?
    .run([rows])?;
    Ok(())
}

/// Inserts `rows` (objects keyed by `binding`'s columns) into `binding` in one statement, in
/// their order (the ids follow it, as one insert each would give them).
pub(crate) fn insert_bindings(tx: &Tx<'_>, rows: Vec<Value>) -> DbResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO binding (env, needed_guresid, needed_path, provided_guresid, provided_path,
                              data_type, value, secret, inserted, interface, valid_from)
         SELECT env, needed_guresid, needed_path, provided_guresid, provided_path, data_type,
                value, secret, inserted, interface, valid_from
         FROM json_populate_recordset(NULL::binding, ?1::json)",
    )?
    .run([Value::Array(rows).to_string()])
}

/// Inserts `rows` (objects keyed by `link`'s columns, at most one per consumer and provider)
/// into `link` in one statement; a current link of the same pair takes the new one's values.
pub(crate) fn insert_links(tx: &Tx<'_>, rows: Vec<Value>) -> DbResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO link (env, consumer, provider, kind, update_type, valid_from)
         SELECT env, consumer, provider, kind, update_type, valid_from
         FROM json_populate_recordset(NULL::link, ?1::json)
         ON CONFLICT (env, consumer, provider) WHERE valid_to IS NULL DO UPDATE SET
             kind = excluded.kind, update_type = excluded.update_type,
             valid_from = excluded.valid_from",
    )?
    .run([Value::Array(rows).to_string()])
}
