//! Journal writes gathered per transaction, so an operation that starts and ends in the same
//! batch is written once, ended, and (on PostgreSQL) a batch's rows go as one statement per table
//! (a binary `COPY` where the rows are only inserted as they are, `unnest` of a typed array per
//! column where they are upserted or take their ids and times in the statement), not one
//! statement each.
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

use std::collections::{HashMap, HashSet};

use gitplane_core::records::{LinkRecord, ResourceRecord};

use crate::NOW;
use crate::db::{Array, Backend, Column, CopyRows, DbResult, Tx, params};
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
    resources: Keyed<RESOURCE_COLUMNS>,
    secrets: Keyed<3>,
    manifests: Keyed<3>,
    /// The transaction's time, read once: the rows of a batch are written in the same
    /// millisecond or so, and formatting the time for each of tens of thousands of rows costs
    /// a twentieth of their writing.
    now: Option<String>,
    /// PostgreSQL: the last key given out by [`Bulk::keys_for_operations`], counting down from
    /// -1: the insert gives those operations their ids.
    keyed_to: i64,
}

/// An `operation` row as gathered (its times are the flush's).
struct OperationRow {
    id: i64,
    deployment_id: i64,
    guresid: String,
    app: Option<String>,
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

/// The columns of `resource` a new resource's row gives (its times are the flush's).
const RESOURCE_COLUMNS: usize = 19;

/// PostgreSQL: the sequence of `operation.id`, looked up once per statement (as an argument of
/// `nextval` itself it is looked up for every row).
const OPERATION_SEQUENCE: &str = "(SELECT pg_get_serial_sequence('operation', 'id')::regclass)";

/// Rows of one table gathered as columns, at most one per key.
struct Keyed<const N: usize> {
    columns: [Column; N],
    keys: HashSet<String>,
}

impl<const N: usize> Keyed<N> {
    fn new(columns: [Column; N]) -> Keyed<N> {
        Keyed {
            columns,
            keys: HashSet::new(),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// Marks `key`'s row as gathered; the caller pushes a value to each column.
    fn key(&mut self, key: &str) -> &mut [Column; N] {
        self.keys.insert(key.to_owned());
        &mut self.columns
    }

    fn take(&mut self) -> Option<[Array; N]> {
        self.keys.clear();
        finish(&mut self.columns)
    }
}

/// The columns' arrays, `None` when they hold no row.
fn finish<const N: usize>(columns: &mut [Column; N]) -> Option<[Array; N]> {
    if columns[0].is_empty() {
        return None;
    }
    debug_assert!(columns.iter().all(|c| c.len() == columns[0].len()));
    Some(columns.each_mut().map(Column::finish))
}

/// Columns for one statement, in its order: integers at `ints`, text elsewhere.
fn columns<const N: usize>(ints: &[usize]) -> [Column; N] {
    std::array::from_fn(|i| {
        if ints.contains(&i) {
            Column::int()
        } else {
            Column::text()
        }
    })
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
            resources: Keyed::new(columns(&[13, 18])),
            secrets: Keyed::new(columns(&[])),
            manifests: Keyed::new(columns(&[])),
            now: None,
            keyed_to: 0,
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
            .prepare_cached(&format!(
                "SELECT nextval({OPERATION_SEQUENCE}) FROM generate_series(1, ?1)"
            ))?
            .query_map([n], |r| r.get(0))?
            .collect::<DbResult<Vec<i64>>>()?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Keys for `n` operations that start and end in this transaction, whose ids nobody needs
    /// before it commits: on SQLite their ids ([`Bulk::operation_ids`], in process), on
    /// PostgreSQL stand-ins (negative) that the insert replaces with ids of the sequence, in
    /// the same order. The writer of a batch then never waits for the server before its commit.
    pub(crate) fn keys_for_operations(&mut self, tx: &Tx<'_>, n: usize) -> DbResult<Vec<i64>> {
        if self.backend == Backend::Sqlite {
            return self.operation_ids(tx, n);
        }
        let first = self.keyed_to - 1;
        let keys: Vec<i64> = (0..).map(|k| first - k).take(n).collect();
        self.keyed_to = keys.last().copied().unwrap_or(self.keyed_to);
        Ok(keys)
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

    /// Gathers a new resource's row, as of `deployment` (which is also its first version), its
    /// outputs as `outputs_text` (their JSON, made by the caller), first writing what is
    /// gathered when it already holds one for the same resource.
    pub(crate) fn resource(
        &mut self,
        tx: &Tx<'_>,
        deployment: i64,
        record: &ResourceRecord,
        outputs_text: &str,
    ) -> DbResult<()> {
        if self.resources.has(&record.guresid) {
            self.flush(tx)?;
        }
        let [
            guresid,
            env,
            app,
            res_type,
            class,
            res_id,
            definition,
            driver,
            status,
            inputs_hash,
            outputs,
            error,
            commit_id,
            deployment_id,
            inputs,
            account,
            deletion_policy,
            template_hash,
            version_from,
        ] = self.resources.key(&record.guresid);
        guresid.push_text(Some(&record.guresid));
        env.push_text(Some(&record.env));
        app.push_text(record.app.as_deref());
        res_type.push_text(Some(&record.res_type));
        class.push_text(Some(&record.class));
        res_id.push_text(Some(&record.res_id));
        definition.push_text(Some(&record.definition));
        driver.push_text(Some(&record.driver));
        status.push_text(Some(record.status.as_str()));
        inputs_hash.push_text(Some(&record.inputs_hash));
        outputs.push_text(Some(outputs_text));
        error.push_text(record.error.as_deref());
        commit_id.push_text(Some(&record.commit_id));
        deployment_id.push_int(Some(deployment));
        inputs.push_text(Some(record.inputs.as_str()));
        account.push_text(record.account.as_deref());
        deletion_policy.push_text(Some(record.deletion_policy.as_str()));
        template_hash.push_text(Some(&record.template_hash));
        version_from.push_int(Some(deployment));
        Ok(())
    }

    /// Gathers a new resource's secrets (sealed), after its resource.
    pub(crate) fn secret(&mut self, guresid: &str, outputs: &str, inputs: &str) {
        debug_assert!(self.resources.has(guresid));
        let [id, sealed_outputs, sealed_inputs] = self.secrets.key(guresid);
        id.push_text(Some(guresid));
        sealed_outputs.push_text(Some(outputs));
        sealed_inputs.push_text(Some(inputs));
    }

    /// Gathers a new resource's manifests, after its resource.
    pub(crate) fn manifests(&mut self, guresid: &str, shown: &str, sealed: Option<&str>) {
        debug_assert!(self.resources.has(guresid));
        let [id, manifests, sealed_full] = self.manifests.key(guresid);
        id.push_text(Some(guresid));
        manifests.push_text(Some(shown));
        sealed_full.push_text(sealed);
    }

    /// Writes what is gathered before the transaction goes on to read or change those tables
    /// otherwise: all of it but the operations started under stand-in keys
    /// ([`Bulk::keys_for_operations`]), which nothing in the transaction reads and whose ends,
    /// still to come, merge into their rows; [`Bulk::finish`] writes those.
    pub(crate) fn flush(&mut self, tx: &Tx<'_>) -> DbResult<()> {
        // A batch of the journal's writer flushes at each update it holds, with only stand-ins
        // gathered: they stay where they are, rather than be sorted out again each time.
        let operations = if self.operations.iter().any(|o| o.id > 0) {
            let (kept, operations) = std::mem::take(&mut self.operations)
                .into_iter()
                .partition(|o| o.id < 0);
            self.operations = kept;
            self.operation_at = (self.operations.iter().enumerate())
                .map(|(i, o)| (o.id, i))
                .collect();
            operations
        } else {
            Vec::new()
        };
        self.write(tx, operations)
    }

    /// Writes everything gathered, at the end of the transaction.
    pub(crate) fn finish(&mut self, tx: &Tx<'_>) -> DbResult<()> {
        self.operation_at.clear();
        let operations = std::mem::take(&mut self.operations);
        self.write(tx, operations)
    }

    /// Writes `operations` and the rows gathered, a statement per table, in the order the rows
    /// depend on each other (a resource before its secrets and manifests). The statements are
    /// pipelined: their errors come back at the transaction's next waiting call, at the latest
    /// its commit.
    fn write(&mut self, tx: &Tx<'_>, operations: Vec<OperationRow>) -> DbResult<()> {
        if !operations.is_empty() {
            let now = self.now(tx)?.map(str::to_owned);
            write_operations(tx, self.backend, &operations, now.as_deref())?;
        }
        if let Some(columns) = self.resources.take() {
            tx.prepare_cached(&format!(
                "INSERT INTO resource (guresid, env, app, type, class, res_id, definition, driver,
                                       status, inputs_hash, outputs, error, commit_id,
                                       deployment_id, inputs, account, deletion_policy,
                                       template_hash, version_from, created_at, updated_at)
                 SELECT *, {NOW}, {NOW}
                 FROM unnest(?1::text[], ?2::text[], ?3::text[], ?4::text[], ?5::text[],
                             ?6::text[], ?7::text[], ?8::text[], ?9::text[], ?10::text[],
                             ?11::text[], ?12::text[], ?13::text[], ?14::int8[], ?15::text[],
                             ?16::text[], ?17::text[], ?18::text[], ?19::int8[])
                 {RESOURCE_UPSERT}"
            ))?
            .run(columns)?;
        }
        if let Some(columns) = self.secrets.take() {
            tx.prepare_cached(
                "INSERT INTO resource_secret (guresid, outputs, inputs)
                 SELECT * FROM unnest(?1::text[], ?2::text[], ?3::text[])
                 ON CONFLICT (guresid) DO UPDATE SET outputs = excluded.outputs,
                     inputs = excluded.inputs",
            )?
            .run(columns)?;
        }
        if let Some(columns) = self.manifests.take() {
            tx.prepare_cached(
                "INSERT INTO resource_manifest (guresid, manifests, sealed)
                 SELECT * FROM unnest(?1::text[], ?2::text[], ?3::text[])
                 ON CONFLICT (guresid) DO UPDATE SET manifests = excluded.manifests,
                     sealed = excluded.sealed",
            )?
            .run(columns)?;
        }
        Ok(())
    }
}

/// Inserts gathered operations: on SQLite a prepared insert each (in process, a statement costs
/// microseconds) at the transaction's time `now`, on PostgreSQL one insert of `unnest`ed
/// columns for all, at the transaction's time, the ids of stand-in keys drawn as they go in.
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
    if operations.is_empty() {
        return Ok(());
    }
    let mut columns: [Column; 13] = columns(&[0, 1, 10, 11]);
    for o in operations {
        let [
            id,
            deployment_id,
            guresid,
            app,
            res_type,
            class,
            res_id,
            action,
            reason,
            status,
            attempts,
            outputs_changed,
            error,
        ] = &mut columns;
        // A stand-in key (negative, see `Bulk::keys_for_operations`): the sequence gives its id.
        id.push_int((o.id > 0).then_some(o.id));
        deployment_id.push_int(Some(o.deployment_id));
        guresid.push_text(Some(&o.guresid));
        app.push_text(o.app.as_deref());
        res_type.push_text(Some(&o.res_type));
        class.push_text(Some(&o.class));
        res_id.push_text(Some(&o.res_id));
        action.push_text(Some(&o.action));
        reason.push_text(Some(&o.reason));
        status.push_text(Some(&o.status));
        attempts.push_int(Some(o.attempts));
        outputs_changed.push_int(o.outputs_changed);
        error.push_text(o.error.as_deref());
    }
    let Some(columns) = finish(&mut columns) else {
        return Ok(());
    };
    // The rows come out of `unnest` in their order, so ids drawn here follow the order the
    // operations started in, as they would one insert each.
    tx.prepare_cached(&format!(
        "INSERT INTO operation (id, deployment_id, guresid, app, type, class, res_id, action,
                                reason, status, attempts, outputs_changed, error, started_at,
                                finished_at)
         SELECT coalesce(o.id, nextval({OPERATION_SEQUENCE})), o.deployment_id, o.guresid,
                o.app, o.type, o.class, o.res_id, o.action, o.reason, o.status, o.attempts,
                o.outputs_changed, o.error, {NOW},
                CASE WHEN o.status = 'started' THEN NULL ELSE {NOW} END
         FROM unnest(?1::int8[], ?2::int8[], ?3::text[], ?4::text[], ?5::text[], ?6::text[],
                     ?7::text[], ?8::text[], ?9::text[], ?10::text[], ?11::int8[],
                     ?12::int8[], ?13::text[])
              AS o(id, deployment_id, guresid, app, type, class, res_id, action, reason,
                   status, attempts, outputs_changed, error)"
    ))?
    .run(columns)
}

/// `binding` rows gathered for one `COPY`, in the order they are to be inserted (the ids
/// follow it, as one insert each would give them).
pub(crate) struct BindingRows {
    rows: CopyRows,
}

/// One row of [`BindingRows`].
pub(crate) struct BindingRow<'a> {
    pub env: &'a str,
    pub needed_guresid: &'a str,
    pub needed_path: &'a str,
    pub provided_guresid: &'a str,
    pub provided_path: &'a str,
    pub data_type: &'a str,
    pub value: Option<&'a str>,
    pub secret: bool,
    pub inserted: bool,
    pub interface: Option<&'a str>,
    pub valid_from: i64,
}

impl BindingRows {
    pub(crate) fn new() -> BindingRows {
        BindingRows {
            rows: CopyRows::new(11),
        }
    }

    pub(crate) fn push(&mut self, row: &BindingRow<'_>) {
        let rows = &mut self.rows;
        rows.row();
        rows.text(Some(row.env));
        rows.text(Some(row.needed_guresid));
        rows.text(Some(row.needed_path));
        rows.text(Some(row.provided_guresid));
        rows.text(Some(row.provided_path));
        rows.text(Some(row.data_type));
        rows.text(row.value);
        rows.int(Some(i64::from(row.secret)));
        rows.int(Some(i64::from(row.inserted)));
        rows.text(row.interface);
        rows.int(Some(row.valid_from));
    }
}

/// Inserts `rows` into `binding` in one `COPY`, in their order.
pub(crate) fn insert_bindings(tx: &Tx<'_>, rows: BindingRows) -> DbResult<()> {
    let Some(rows) = rows.rows.finish() else {
        return Ok(());
    };
    tx.copy_in(
        "COPY binding (env, needed_guresid, needed_path, provided_guresid, provided_path,
                       data_type, value, secret, inserted, interface, valid_from)
         FROM STDIN (FORMAT binary)",
        rows,
    )
}

/// Inserts `links` of `env` as of `deployment` into `link` in one statement, in their order;
/// a pair may appear once (the caller keeps the last of a pair). A current link of the same
/// pair takes the new one's values.
pub(crate) fn insert_links(
    tx: &Tx<'_>,
    env: &str,
    deployment: i64,
    links: &[&LinkRecord],
) -> DbResult<()> {
    if links.is_empty() {
        return Ok(());
    }
    // An environment's first apply has no current link for a new one to take the place of:
    // a `COPY` writes them, about a third cheaper for the server than the upsert. Only the
    // environment's lease holder writes its links, so none can appear in between.
    let none_current = !tx
        .prepare_cached("SELECT 1 FROM link WHERE env = ?1 AND valid_to IS NULL LIMIT 1")?
        .exists([env])?;
    if none_current {
        let mut rows = CopyRows::new(6);
        for l in links {
            rows.row();
            rows.text(Some(env));
            rows.text(Some(&l.consumer));
            rows.text(Some(&l.provider));
            rows.text(Some(&l.kind));
            rows.text(Some(&l.update_type));
            rows.int(Some(deployment));
        }
        let Some(rows) = rows.finish() else {
            return Ok(());
        };
        return tx.copy_in(
            "COPY link (env, consumer, provider, kind, update_type, valid_from)
             FROM STDIN (FORMAT binary)",
            rows,
        );
    }
    let mut columns: [Column; 6] = columns(&[5]);
    let [envs, consumer, provider, kind, update_type, valid_from] = &mut columns;
    for l in links {
        envs.push_text(Some(env));
        consumer.push_text(Some(&l.consumer));
        provider.push_text(Some(&l.provider));
        kind.push_text(Some(&l.kind));
        update_type.push_text(Some(&l.update_type));
        valid_from.push_int(Some(deployment));
    }
    let Some(columns) = finish(&mut columns) else {
        return Ok(());
    };
    tx.prepare_cached(
        "INSERT INTO link (env, consumer, provider, kind, update_type, valid_from)
         SELECT * FROM unnest(?1::text[], ?2::text[], ?3::text[], ?4::text[], ?5::text[],
                              ?6::int8[])
         ON CONFLICT (env, consumer, provider) WHERE valid_to IS NULL DO UPDATE SET
             kind = excluded.kind, update_type = excluded.update_type,
             valid_from = excluded.valid_from",
    )?
    .run(columns)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use serde_json::json;

    use crate::db::{Cell, params};
    use crate::tests::{each_backend, record};
    use crate::{
        AppFingerprint, BindingRecord, Ended, EndedPut, JournalWriter, LinkChanges, LinkRecord,
        ManifestsRecord, OperationStart, OwnedBatch, StartRow, Store,
    };

    /// Quotes of both kinds, backslashes, the separators of array and JSON literals, the word
    /// NULL, control characters and text beyond ASCII: whatever a value may hold.
    const AWKWARD: &str = "it's \"quoted\" \\ back\\slash {a,b} NULL\t\n\r ünïcødé ✓ 🚀";

    fn put(guresid: &str, awkward: bool) -> (StartRow, EndedPut) {
        let mut r = record(guresid);
        let mut manifests = None;
        if awkward {
            r.app = None;
            r.account = Some(AWKWARD.into());
            r.definition = AWKWARD.into();
            r.res_id = AWKWARD.into();
            r.outputs = json!({"host": AWKWARD, "n": null});
            r.secret_outputs = json!({"password": AWKWARD});
            r.inputs = json!({"values": {"host": AWKWARD}}).into();
            r.error = Some(AWKWARD.into());
            manifests = Some(ManifestsRecord {
                shown: json!([{"name": AWKWARD, "data": "***"}]).to_string(),
                full: Some(json!([{"name": AWKWARD, "data": AWKWARD}]).to_string()),
            });
        } else {
            r.account = None;
        }
        let start = StartRow {
            guresid: guresid.into(),
            app: r.app.clone(),
            res_type: r.res_type.clone(),
            class: r.class.clone(),
            res_id: r.res_id.clone(),
            action: "create",
            reason: if awkward {
                AWKWARD.into()
            } else {
                "new".into()
            },
        };
        let put = EndedPut {
            attempts: 1,
            record: Box::new(r),
            outputs_changed: awkward.then_some(true),
            new: true,
            manifests,
            sealed: None,
        };
        (start, put)
    }

    fn binding(provided: &str, value: Option<serde_json::Value>) -> BindingRecord {
        BindingRecord {
            needed: String::new(),
            needed_path: format!("values.{AWKWARD}"),
            provided: provided.into(),
            provided_path: "outputs.host".into(),
            data_type: "json".into(),
            secret: value.is_none(),
            inserted: value.is_some(),
            interface: value.as_ref().map(|_| AWKWARD.to_owned()),
            value,
        }
    }

    /// Every row a first apply writes in bulk, as written, read back the same way from either
    /// backend: ids counted from the table's first, times only compared with each other.
    fn dump(store: &Store) -> Vec<(&'static str, Vec<Vec<Cell>>)> {
        let queries = [
            (
                "resource",
                "SELECT guresid, env, app, type, class, res_id, definition, driver, account,
                        deletion_policy, template_hash, orphan_since, orphan_reason, status,
                        inputs_hash, outputs, inputs, error, commit_id, deployment_id,
                        version_from, created_at <= updated_at, length(created_at)
                 FROM resource ORDER BY guresid",
            ),
            (
                "operation",
                "SELECT id - (SELECT min(id) FROM operation), deployment_id, guresid, app, type,
                        class, res_id, action, reason, status, attempts, outputs_changed, error,
                        length(started_at), started_at = finished_at, finished_at IS NULL
                 FROM operation ORDER BY id",
            ),
            (
                "binding",
                "SELECT id - (SELECT min(id) FROM binding), env, needed_guresid, needed_path,
                        provided_guresid, provided_path, data_type, value, secret, inserted,
                        interface, valid_from, valid_to
                 FROM binding ORDER BY id",
            ),
            (
                "link",
                "SELECT env, consumer, provider, kind, update_type, valid_from, valid_to
                 FROM link ORDER BY consumer, provider",
            ),
            (
                "resource_manifest",
                "SELECT guresid, manifests, sealed IS NULL FROM resource_manifest
                 ORDER BY guresid",
            ),
            (
                "resource_secret",
                "SELECT guresid FROM resource_secret ORDER BY guresid",
            ),
            (
                "app_fingerprint",
                "SELECT env, app, fingerprint, deployment_id, resources FROM app_fingerprint
                 ORDER BY app",
            ),
        ];
        queries
            .into_iter()
            .map(|(table, sql)| (table, store.conn.table(sql, params![]).unwrap().rows))
            .collect()
    }

    #[test]
    fn rows_written_in_bulk_are_the_same_on_both_backends_whatever_their_values_hold() {
        let dumps = RefCell::new(Vec::new());
        each_backend(|mut store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            // Two batches in one transaction; the second holds a resource twice, so what is
            // gathered is written half-way through it.
            let (starts, puts) = [put("g1", true), put("g2", false)].into_iter().unzip();
            writer
                .send(OwnedBatch {
                    deployment: dep,
                    env: "development".into(),
                    starts,
                    puts,
                    bindings: vec![
                        (
                            "g2".into(),
                            false,
                            vec![binding("g1", Some(json!(AWKWARD))), binding("g1", None)],
                        ),
                        ("g1".into(), false, Vec::new()),
                    ],
                    spent: Box::new(()),
                })
                .unwrap();
            let (starts, puts) = [put("g3", false), put("g4", true), put("g3", true)]
                .into_iter()
                .unzip();
            writer
                .send(OwnedBatch {
                    deployment: dep,
                    env: "development".into(),
                    starts,
                    puts,
                    bindings: vec![("g4".into(), false, vec![binding("g3", Some(json!(7)))])],
                    spent: Box::new(()),
                })
                .unwrap();
            writer.drain().unwrap();
            drop(writer);
            // Operations that end before any call, in a transaction of their own.
            let skipped = OperationStart {
                deployment: dep,
                guresid: "g5",
                app: None,
                res_type: "postgres",
                class: "default",
                res_id: AWKWARD,
                action: "create",
                reason: AWKWARD,
            };
            store
                .ended_operations(&[(skipped, Ended::Skipped, AWKWARD)])
                .unwrap();
            let link = |consumer: &str, provider: &str, kind: &str| LinkRecord {
                consumer: consumer.into(),
                provider: provider.into(),
                kind: kind.into(),
                update_type: "NeedsProvides".into(),
            };
            let changes = LinkChanges {
                removed: Vec::new(),
                // Out of pair order, and one pair twice: the last of a pair wins.
                added: vec![
                    link("g4", "g3", "dependency"),
                    link("g2", "g1", "dependency"),
                    link("g4", "g3", "reference"),
                ],
            };
            // The environment's first links (a COPY on PostgreSQL), then links beside them,
            // one of a pair already current (the upsert).
            store
                .record_link_changes(dep, "development", &changes)
                .unwrap();
            let more = LinkChanges {
                removed: Vec::new(),
                added: vec![link("g2", "g1", "selector"), link("g1", "g3", "implicit")],
            };
            store
                .record_link_changes(dep, "development", &more)
                .unwrap();
            let print = |p: &str, n| AppFingerprint {
                fingerprint: p.into(),
                resources: n,
            };
            let (a, b, a_again) = (print(AWKWARD, 2), print("f2", 1), print("f3", 3));
            store
                .record_fingerprints(
                    "development",
                    dep,
                    &[("shop", &a), ("café", &b), ("shop", &a_again)],
                    &[],
                )
                .unwrap();
            // What a user reads back: the secrets open, the awkward values intact.
            let read = store.resources("development").unwrap();
            let g1 = read.iter().find(|r| r.guresid == "g1").expect("g1");
            assert_eq!(g1.definition, AWKWARD);
            assert_eq!(g1.app, None);
            assert_eq!(g1.outputs, json!({"host": AWKWARD, "n": null}));
            assert_eq!(g1.secret_outputs, json!({"password": AWKWARD}));
            let g3 = read.iter().find(|r| r.guresid == "g3").expect("g3");
            assert_eq!(
                g3.error.as_deref(),
                Some(AWKWARD),
                "the last put of g3 wins"
            );
            dumps.borrow_mut().push(dump(&store));
        });
        let dumps = dumps.into_inner();
        let sqlite = &dumps[0];
        let text = Cell::Text(AWKWARD.into());
        let rows = |table: &str| &sqlite.iter().find(|(t, _)| *t == table).unwrap().1;
        assert_eq!(rows("resource").len(), 4);
        assert!(rows("resource")[0].contains(&text));
        assert_eq!(rows("resource")[0][2], Cell::Null, "g1 has no app");
        assert_eq!(rows("operation").len(), 6);
        assert!(rows("operation").last().unwrap().contains(&text));
        assert_eq!(rows("binding").len(), 3);
        assert_eq!(
            rows("binding")[0][7],
            Cell::Text(json!(AWKWARD).to_string())
        );
        assert_eq!(rows("binding")[1][7], Cell::Null);
        let kinds: Vec<&Cell> = rows("link").iter().map(|l| &l[3]).collect();
        let kind = |k: &str| Cell::Text(k.into());
        assert_eq!(
            kinds,
            [&kind("implicit"), &kind("selector"), &kind("reference")]
        );
        assert_eq!(rows("resource_manifest").len(), 3);
        assert_eq!(rows("resource_secret").len(), 4);
        assert_eq!(rows("app_fingerprint").len(), 2);
        if let Some(postgres) = dumps.get(1) {
            for ((table, lite), (_, pg)) in sqlite.iter().zip(postgres) {
                assert_eq!(lite, pg, "{table}: SQLite's rows, then PostgreSQL's");
            }
        }
    }
}
