//! The operation journal: each driver call journalled before it starts and as it ends, in
//! batches of one transaction each, with the resource records it leads to.
//!
//! Crash safety needs only the order (an operation row exists before its first call; a call's end
//! is journalled before its operation's result), not one transaction per row: a batch written as
//! a whole keeps that order and costs one commit instead of hundreds.

use crate::bulk::{Bulk, OperationEnd};
use crate::db::{DbError, DbResult, OptionalExtension, Tx, params};
use crate::seal::SharedKeyring;
use crate::{
    NOW, OperationStart, ResourceRecord, ResourceStatus, Result, StateError, Store, seal_with,
};

/// The secrets of a resource that has none, as recorded: no `resource_secret` row stands for
/// exactly these (most resources have no secret, and a row each would cost a write each).
pub(crate) const NO_SECRET_OUTPUTS: &str = "{}";
pub(crate) const NO_SECRET_INPUTS: &str = "{\"secrets\":null}";

/// How an operation that called no driver ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Not attempted: blocked by a failure upstream, held back, or gitplane was stopping.
    Skipped,
    /// It could not start: its inputs do not resolve, its driver or account is missing.
    Failed,
}

impl Ended {
    fn as_str(self) -> &'static str {
        match self {
            Ended::Skipped => "skipped",
            Ended::Failed => "failed",
        }
    }
}

/// One thing the reconciler learnt, to journal.
#[derive(Debug, Clone)]
pub enum JournalEntry<'a> {
    /// One driver call of `operation` ended: the calls made so far and, when the driver changed
    /// it, the cookie (`Some(None)` clears it).
    Call {
        operation: i64,
        attempts: i64,
        guresid: &'a str,
        cookie: Option<Option<&'a str>>,
    },
    /// A put (create or update) ended: its outcome and the resource's new record.
    Put {
        operation: i64,
        attempts: i64,
        deployment: i64,
        record: &'a ResourceRecord,
        /// For a succeeded put: whether its outputs changed.
        outputs_changed: Option<bool>,
        /// The resource had no row when the apply began (nor can it have one since: one apply
        /// at a time puts each resource once), so there is no current version to look up.
        new: bool,
        /// For a succeeded put: the Kubernetes manifests its driver produced (none is an empty
        /// list); `None` leaves those recorded as they are.
        manifests: Option<&'a ManifestsRecord>,
        /// `record` and `manifests` as text, made by the caller (see [`Sealer`]); `None`:
        /// made here.
        sealed: Option<&'a SealedPut>,
    },
    /// A delete (or forget) ended. On success the resource, its secrets, cookie, links and
    /// bindings end with `deployment`.
    Delete {
        operation: i64,
        attempts: i64,
        deployment: i64,
        env: &'a str,
        guresid: &'a str,
        error: Option<&'a str>,
    },
    /// An operation failed before its driver was called: the resource is untouched.
    Failed {
        operation: i64,
        attempts: i64,
        error: &'a str,
    },
    /// An operation started but its driver was never called (gitplane stopped, or the lease was
    /// lost, once its call could start): the resource is untouched, for the next run to do.
    Skipped { operation: i64, why: &'a str },
}

impl Store {
    /// Journals driver calls about to start, in one transaction; their ids, in order.
    pub fn begin_operations(&mut self, ops: &[OperationStart<'_>]) -> Result<Vec<i64>> {
        self.in_transaction(|tx| {
            let mut bulk = Bulk::of(tx);
            let ids = begin_operations(tx, bulk.as_mut(), ops)?;
            finish(tx, bulk.as_mut())?;
            Ok(ids)
        })
    }

    /// Starts writes that go together in one transaction (see [`Batch`]).
    pub fn batch(&mut self) -> Result<Batch<'_>> {
        self.begin_batch(false)
    }

    /// [`Store::batch`] for a writer that keeps PostgreSQL busy: the transaction begins (and its
    /// fences are checked) without waiting for the server, so it can be sent while the server
    /// still works on the one before, committed by [`Batch::commit_later`].
    pub fn pipelined_batch(&mut self) -> Result<Batch<'_>> {
        self.begin_batch(true)
    }

    fn begin_batch(&mut self, pipelined: bool) -> Result<Batch<'_>> {
        let err = |source| crate::state_error(&self.path, source);
        let tx = if pipelined {
            let tx = self.conn.transaction_pipelined().map_err(err)?;
            crate::lease::check_fences_pipelined(&tx, &self.fences).map_err(err)?;
            tx
        } else {
            let tx = self.conn.transaction().map_err(err)?;
            crate::lease::check_fences(&tx, &self.fences).map_err(err)?;
            tx
        };
        Ok(Batch {
            bulk: Bulk::of(&tx),
            tx,
            path: &self.path,
            ring: self.keyring.clone(),
        })
    }

    /// Records operations that ended before any driver call, in one transaction: each with
    /// its status (`skipped`: not attempted; `failed`: it could not start) and why.
    pub fn ended_operations(&mut self, ops: &[(OperationStart<'_>, Ended, &str)]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.in_transaction(|tx| {
            let mut bulk = Bulk::of(tx).expect("both backends gather operations");
            let ids = bulk.operation_ids(tx, ops.len())?;
            for ((op, ended, why), id) in ops.iter().zip(ids) {
                bulk.start(id, op);
                bulk.end(
                    id,
                    &OperationEnd {
                        status: ended.as_str(),
                        error: Some(why),
                        attempts: 0,
                        outputs_changed: None,
                    },
                );
            }
            bulk.finish(tx)
        })
    }

    /// Writes `entries` in order, in one transaction.
    pub fn journal(&mut self, entries: &[JournalEntry<'_>]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let ring = self.keyring.clone();
        self.in_transaction(|tx| {
            let mut bulk = Bulk::of(tx);
            write_journal(tx, &ring, bulk.as_mut(), entries)?;
            finish(tx, bulk.as_mut())
        })
    }

    /// Forgets the operations of a finished drift run that found nothing to repair: the
    /// deployment keeps its counts, and what drifted or failed keeps its operation, so a drift
    /// run every few minutes does not grow the state by a row per resource.
    pub fn compact_drift_run(&mut self, deployment: i64) -> Result<usize> {
        self.in_transaction(|tx| {
            tx.prepare_cached(
                "DELETE FROM operation WHERE deployment_id = ?1 AND status = 'succeeded'
                   AND action = 'update' AND outputs_changed = 0
                   AND EXISTS (SELECT 1 FROM deployment d WHERE d.id = ?1 AND d.kind = 'drift')",
            )?
            .execute([deployment])
        })
    }

    /// Records what resources' definitions and requests now say, when that changed but their
    /// inputs did not (no driver call was needed): `(guresid, template_hash)`.
    pub fn set_template_hashes(&mut self, hashes: &[(String, String)]) -> Result<()> {
        if hashes.is_empty() {
            return Ok(());
        }
        self.in_transaction(|tx| {
            let mut stmt =
                tx.prepare_cached("UPDATE resource SET template_hash = ?2 WHERE guresid = ?1")?;
            for (guresid, hash) in hashes {
                stmt.run(params![guresid, hash])?;
            }
            Ok(())
        })
    }
}

fn insert_operation(
    tx: &Tx<'_>,
    op: &OperationStart<'_>,
    status: &str,
    error: Option<&str>,
) -> DbResult<i64> {
    let finished = if status == "started" { "NULL" } else { NOW };
    tx.prepare_cached(&format!(
        "INSERT INTO operation (deployment_id, guresid, app, type, class, res_id, action,
                                reason, status, error, started_at, finished_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, {NOW}, {finished}) RETURNING id"
    ))?
    .insert(params![
        op.deployment,
        op.guresid,
        op.app,
        op.res_type,
        op.class,
        op.res_id,
        op.action,
        op.reason,
        status,
        error
    ])
}

fn record_call(
    (tx, ring, bulk): (&Tx<'_>, &SharedKeyring, Option<&mut Bulk>),
    operation: i64,
    attempts: i64,
    guresid: &str,
    cookie: Option<Option<&str>>,
) -> DbResult<()> {
    if !bulk.is_some_and(|b| b.calls(operation, attempts)) {
        tx.prepare_cached("UPDATE operation SET attempts = ?2 WHERE id = ?1")?
            .run(params![recorded(operation)?, attempts])?;
    }
    match cookie {
        None => {}
        Some(Some(c)) => {
            let sealed = seal_with(ring, c, &format!("driver_cookie:{guresid}"))?;
            tx.prepare_cached(&format!(
                "INSERT INTO driver_cookie (guresid, cookie, updated_at)
                 VALUES (?1, ?2, {NOW})
                 ON CONFLICT (guresid) DO UPDATE SET cookie = excluded.cookie,
                     updated_at = excluded.updated_at"
            ))?
            .run(params![guresid, sealed])?;
        }
        Some(None) => {
            tx.prepare_cached("DELETE FROM driver_cookie WHERE guresid = ?1")?
                .run([guresid])?;
        }
    }
    Ok(())
}

fn finish_put(
    (tx, bulk): (&Tx<'_>, Option<&mut Bulk>),
    new: bool,
    operation: i64,
    attempts: i64,
    deployment: i64,
    (record, sealed): (&ResourceRecord, &SealedPut),
    outputs_changed: Option<bool>,
) -> DbResult<()> {
    let (status, error) = match record.status {
        ResourceStatus::Ready => ("succeeded", None),
        ResourceStatus::Failed => ("failed", record.error.as_deref()),
    };
    let end = OperationEnd {
        status,
        error,
        attempts,
        outputs_changed,
    };
    let mut bulk = bulk;
    if let Some(bulk) = bulk.as_deref_mut().filter(|b| b.gathers_rows()) {
        if new {
            return gather_new_put((tx, bulk), operation, &end, deployment, (record, sealed));
        }
        // The version of a recorded resource is read from its row: what is gathered goes
        // first.
        bulk.flush(tx)?;
    }
    if !bulk.as_deref_mut().is_some_and(|b| b.end(operation, &end)) {
        end_operation(tx, operation, &end)?;
    }
    let outputs = sealed.outputs.as_str();
    let version_from = if new {
        deployment
    } else {
        new_version(tx, deployment, record, outputs)?
    };
    // A batch's time, when it has one; else the statement's.
    let now = match bulk {
        Some(bulk) => bulk.now(tx)?.map(str::to_owned),
        None => None,
    };
    tx.prepare_cached(&format!(
        "INSERT INTO resource (guresid, env, app, type, class, res_id, definition, driver,
                               status, inputs_hash, outputs, error, commit_id, deployment_id,
                               inputs, account, deletion_policy, template_hash, version_from,
                               created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18, ?19, COALESCE(?20, {NOW}), COALESCE(?20, {NOW}))
         {RESOURCE_UPSERT}"
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
        record.status.as_str(),
        record.inputs_hash,
        outputs,
        record.error,
        record.commit_id,
        deployment,
        record.inputs.as_str(),
        record.account,
        record.deletion_policy.as_str(),
        record.template_hash,
        version_from,
        now
    ])?;
    match &sealed.secrets {
        // Nothing secret: no row, which reads back as exactly this.
        None if new => {}
        None => {
            tx.prepare_cached("DELETE FROM resource_secret WHERE guresid = ?1")?
                .run([&record.guresid])?;
        }
        Some((outputs, inputs)) => {
            tx.prepare_cached(
                "INSERT INTO resource_secret (guresid, outputs, inputs) VALUES (?1, ?2, ?3)
             ON CONFLICT (guresid) DO UPDATE SET outputs = excluded.outputs,
                 inputs = excluded.inputs",
            )?
            .run(params![record.guresid, outputs, inputs])?;
        }
    }
    Ok(())
}

/// What an upsert of a `resource` row changes when the row is there (both backends' inserts).
pub(crate) const RESOURCE_UPSERT: &str = "ON CONFLICT (guresid) DO UPDATE SET
    definition = excluded.definition, driver = excluded.driver,
    status = excluded.status, inputs_hash = excluded.inputs_hash,
    outputs = excluded.outputs, error = excluded.error,
    commit_id = excluded.commit_id, deployment_id = excluded.deployment_id,
    inputs = excluded.inputs, account = excluded.account,
    deletion_policy = excluded.deletion_policy,
    template_hash = excluded.template_hash, version_from = excluded.version_from,
    orphan_since = NULL, orphan_reason = NULL,
    updated_at = excluded.updated_at";

/// Seals records' secrets for the journal with the state's key, on any thread: a caller that
/// journals tens of thousands of puts (a first apply) makes their [`SealedPut`]s on its cores,
/// so the one thread that writes the journal only writes.
#[derive(Clone)]
pub struct Sealer {
    ring: SharedKeyring,
    path: std::path::PathBuf,
}

/// A put's record and manifests as the journal writes them: public outputs as JSON, secrets
/// and full manifests sealed.
#[derive(Debug)]
pub struct SealedPut {
    outputs: String,
    /// Secret outputs and inputs, sealed for `resource_secret`; `None` when it has none (no
    /// row stands for exactly that).
    secrets: Option<(String, String)>,
    /// The full list of manifests, sealed for `resource_manifest`, when it has one.
    manifests: Option<String>,
}

impl Store {
    /// What seals records for [`JournalEntry::Put`] outside the store.
    pub fn sealer(&self) -> Sealer {
        Sealer {
            ring: self.keyring.clone(),
            path: self.path.clone(),
        }
    }
}

impl Sealer {
    /// `record` (and `manifests`, when the put records them) made ready for the journal.
    pub fn seal(
        &self,
        record: &ResourceRecord,
        manifests: Option<&ManifestsRecord>,
    ) -> Result<SealedPut> {
        SealedPut::of(&self.ring, record, manifests)
            .map_err(|source| crate::state_error(&self.path, source))
    }
}

impl SealedPut {
    fn of(
        ring: &SharedKeyring,
        record: &ResourceRecord,
        manifests: Option<&ManifestsRecord>,
    ) -> DbResult<SealedPut> {
        let guresid = &record.guresid;
        let secret_outputs = record.secret_outputs.to_string();
        let secrets = if secret_outputs == NO_SECRET_OUTPUTS
            && record.secret_inputs.as_str() == NO_SECRET_INPUTS
        {
            None
        } else {
            Some((
                seal_with(
                    ring,
                    &secret_outputs,
                    &format!("resource_secret.outputs:{guresid}"),
                )?,
                seal_with(
                    ring,
                    record.secret_inputs.as_str(),
                    &format!("resource_secret.inputs:{guresid}"),
                )?,
            ))
        };
        let manifests = match manifests {
            Some(m) if !m.is_empty() => match &m.full {
                Some(full) => Some(seal_with(
                    ring,
                    full,
                    &format!("resource_manifest.sealed:{guresid}"),
                )?),
                None => None,
            },
            _ => None,
        };
        Ok(SealedPut {
            outputs: record.outputs.to_string(),
            secrets,
            manifests,
        })
    }
}

/// Gathers a put of a resource that had no row: its operation's end, its row and its secrets,
/// as [`finish_put`] writes them.
fn gather_new_put(
    (tx, bulk): (&Tx<'_>, &mut Bulk),
    operation: i64,
    end: &OperationEnd<'_>,
    deployment: i64,
    (record, sealed): (&ResourceRecord, &SealedPut),
) -> DbResult<()> {
    if !bulk.end(operation, end) {
        end_operation(tx, operation, end)?;
    }
    let guresid = &record.guresid;
    bulk.resource(tx, deployment, record, &sealed.outputs)?;
    if let Some((outputs, inputs)) = &sealed.secrets {
        bulk.secret(guresid, outputs, inputs);
    }
    Ok(())
}

/// `operation` as the id of a row written: a stand-in key ([`Bulk::keys_for_operations`]) is
/// only ever merged into its gathered row, and an update by it would change nothing.
fn recorded(operation: i64) -> DbResult<i64> {
    if operation < 0 {
        return Err(DbError::Postgres(format!(
            "operation {operation} was started under a stand-in key and is no longer gathered"
        )));
    }
    Ok(operation)
}

/// Records how operation `operation` ended, in its row.
fn end_operation(tx: &Tx<'_>, operation: i64, end: &OperationEnd<'_>) -> DbResult<()> {
    tx.prepare_cached(&format!(
        "UPDATE operation SET status = ?2, error = ?3, attempts = ?4,
                outputs_changed = ?5, finished_at = {NOW}
         WHERE id = ?1"
    ))?
    .run(params![
        recorded(operation)?,
        end.status,
        end.error,
        end.attempts,
        end.outputs_changed
    ])
}

/// The Kubernetes manifests a put produced, as `resource_manifest` keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManifestsRecord {
    /// A JSON list of `{"name", "location", "data"}`, every secret value replaced.
    pub shown: String,
    /// The same list with its secret values, when any was replaced; sealed when written.
    pub full: Option<String>,
}

impl ManifestsRecord {
    /// No manifest at all: what most resources produce, and what no row stands for.
    pub fn is_empty(&self) -> bool {
        self.shown == "[]" || self.shown.is_empty()
    }
}

fn record_manifests(
    (tx, bulk): (&Tx<'_>, Option<&mut Bulk>),
    new: bool,
    guresid: &str,
    manifests: &ManifestsRecord,
    sealed: Option<&str>,
) -> DbResult<()> {
    if manifests.is_empty() {
        if !new {
            tx.prepare_cached("DELETE FROM resource_manifest WHERE guresid = ?1")?
                .run([guresid])?;
        }
        return Ok(());
    }
    if new && let Some(bulk) = bulk.filter(|b| b.gathers_rows()) {
        bulk.manifests(guresid, &manifests.shown, sealed);
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO resource_manifest (guresid, manifests, sealed) VALUES (?1, ?2, ?3)
         ON CONFLICT (guresid) DO UPDATE SET manifests = excluded.manifests,
             sealed = excluded.sealed",
    )?
    .run(params![guresid, manifests.shown, sealed])?;
    Ok(())
}

/// Since which deployment the resource's version holds once `record` is written: the current
/// one's when nothing of what the resource is changed (a drift run that found nothing, say),
/// else `deployment`, and the version that ends joins `resource_version`. A version that began
/// in this same deployment (a resumed one) never stood at the end of one, so it is replaced,
/// not kept.
fn new_version(
    tx: &Tx<'_>,
    deployment: i64,
    record: &ResourceRecord,
    outputs: &str,
) -> DbResult<i64> {
    let current: Option<(i64, bool)> = tx
        .prepare_cached(
            "SELECT COALESCE(version_from, deployment_id),
                    definition = ?2 AND driver = ?3 AND status = ?4 AND inputs_hash = ?5
                      AND outputs = ?6 AND error IS NOT DISTINCT FROM ?7
             FROM resource WHERE guresid = ?1",
        )?
        .query_row(
            params![
                record.guresid,
                record.definition,
                record.driver,
                record.status.as_str(),
                record.inputs_hash,
                outputs,
                record.error
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match current {
        None => Ok(deployment),
        Some((since, true)) => Ok(since),
        Some((since, false)) if since == deployment => Ok(deployment),
        Some((_, false)) => {
            end_version(tx, &record.guresid, deployment)?;
            Ok(deployment)
        }
    }
}

/// The current version of `guresid` ends with `deployment`: it joins `resource_version`.
fn end_version(tx: &Tx<'_>, guresid: &str, deployment: i64) -> DbResult<()> {
    tx.prepare_cached(
        "INSERT INTO resource_version (guresid, env, app, type, class, res_id, definition,
                                       driver, status, inputs_hash, outputs, error, commit_id,
                                       valid_from, valid_to)
         SELECT guresid, env, app, type, class, res_id, definition, driver, status, inputs_hash,
                outputs, error, commit_id, COALESCE(version_from, deployment_id), ?2
         FROM resource WHERE guresid = ?1 AND COALESCE(version_from, deployment_id) < ?2",
    )?
    .run(params![guresid, deployment])?;
    Ok(())
}

fn finish_delete(
    tx: &Tx<'_>,
    operation: i64,
    attempts: i64,
    deployment: i64,
    env: &str,
    guresid: &str,
    error: Option<&str>,
) -> DbResult<()> {
    let status = if error.is_some() {
        "failed"
    } else {
        "succeeded"
    };
    tx.prepare_cached(&format!(
        "UPDATE operation SET status = ?2, error = ?3, attempts = ?4, finished_at = {NOW}
         WHERE id = ?1"
    ))?
    .run(params![operation, status, error, attempts])?;
    if error.is_some() {
        return Ok(());
    }
    tx.prepare_cached("DELETE FROM driver_cookie WHERE guresid = ?1")?
        .run([guresid])?;
    // Its history ends here: the current version joins the ended ones; bindings and links
    // this deployment made are dropped, older ones closed.
    end_version(tx, guresid, deployment)?;
    tx.prepare_cached("DELETE FROM resource WHERE guresid = ?1")?
        .run([guresid])?;
    tx.prepare_cached(
        "DELETE FROM binding WHERE needed_guresid = ?1 AND valid_to IS NULL AND valid_from = ?2",
    )?
    .run(params![guresid, deployment])?;
    tx.prepare_cached(
        "UPDATE binding SET valid_to = ?2 WHERE needed_guresid = ?1 AND valid_to IS NULL",
    )?
    .run(params![guresid, deployment])?;
    let consumer = params![guresid, deployment, env];
    tx.prepare_cached(
        "DELETE FROM link WHERE env = ?3 AND consumer = ?1 AND valid_to IS NULL
            AND valid_from = ?2",
    )?
    .run(consumer)?;
    tx.prepare_cached(
        "UPDATE link SET valid_to = ?2 WHERE env = ?3 AND consumer = ?1 AND valid_to IS NULL",
    )?
    .run(consumer)?;
    let provider = params![guresid, deployment];
    tx.prepare_cached(
        "DELETE FROM link WHERE provider = ?1 AND valid_to IS NULL AND valid_from = ?2",
    )?
    .run(provider)?;
    tx.prepare_cached("UPDATE link SET valid_to = ?2 WHERE provider = ?1 AND valid_to IS NULL")?
        .run(provider)?;
    Ok(())
}

/// Journals driver calls about to start; their ids, in order.
/// On PostgreSQL (`bulk`) the ids come in one round trip and the rows are gathered, so an
/// operation that ends in the same transaction is written once, ended.
fn begin_operations(
    tx: &Tx<'_>,
    bulk: Option<&mut Bulk>,
    ops: &[OperationStart<'_>],
) -> DbResult<Vec<i64>> {
    let Some(bulk) = bulk else {
        return ops
            .iter()
            .map(|op| insert_operation(tx, op, "started", None))
            .collect();
    };
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let ids = bulk.operation_ids(tx, ops.len())?;
    for (op, id) in ops.iter().zip(&ids) {
        bulk.start(*id, op);
    }
    Ok(ids)
}

/// Writes what `bulk` gathered, at the end of the transaction.
fn finish(tx: &Tx<'_>, bulk: Option<&mut Bulk>) -> DbResult<()> {
    match bulk {
        Some(bulk) => bulk.finish(tx),
        None => Ok(()),
    }
}

/// Writes `entries` in order.
fn write_journal(
    tx: &Tx<'_>,
    ring: &SharedKeyring,
    mut bulk: Option<&mut Bulk>,
    entries: &[JournalEntry<'_>],
) -> DbResult<()> {
    for entry in entries {
        match entry {
            JournalEntry::Call {
                operation,
                attempts,
                guresid,
                cookie,
            } => record_call(
                (tx, ring, bulk.as_deref_mut()),
                *operation,
                *attempts,
                guresid,
                *cookie,
            )?,
            JournalEntry::Put {
                operation,
                attempts,
                deployment,
                record,
                outputs_changed,
                new,
                manifests,
                sealed,
            } => {
                let made;
                let sealed = match sealed {
                    Some(sealed) => *sealed,
                    None => {
                        made = SealedPut::of(ring, record, *manifests)?;
                        &made
                    }
                };
                finish_put(
                    (tx, bulk.as_deref_mut()),
                    *new,
                    *operation,
                    *attempts,
                    *deployment,
                    (record, sealed),
                    *outputs_changed,
                )?;
                if let Some(manifests) = manifests {
                    record_manifests(
                        (tx, bulk.as_deref_mut()),
                        *new,
                        &record.guresid,
                        manifests,
                        sealed.manifests.as_deref(),
                    )?;
                }
            }
            JournalEntry::Delete {
                operation,
                attempts,
                deployment,
                env,
                guresid,
                error,
            } => {
                // A delete changes rows of every kind gathered: they go first.
                if let Some(bulk) = bulk.as_deref_mut() {
                    bulk.flush(tx)?;
                }
                finish_delete(tx, *operation, *attempts, *deployment, env, guresid, *error)?;
            }
            JournalEntry::Failed {
                operation,
                attempts,
                error,
            } => {
                let end = OperationEnd {
                    status: "failed",
                    error: Some(error),
                    attempts: *attempts,
                    outputs_changed: None,
                };
                if !bulk.as_deref_mut().is_some_and(|b| b.end(*operation, &end)) {
                    tx.prepare_cached(&format!(
                        "UPDATE operation SET status = 'failed', error = ?2, attempts = ?3,
                                finished_at = {NOW}
                         WHERE id = ?1"
                    ))?
                    .run(params![operation, error, attempts])?;
                }
            }
            JournalEntry::Skipped { operation, why } => {
                let end = OperationEnd {
                    status: "skipped",
                    error: Some(why),
                    attempts: 0,
                    outputs_changed: None,
                };
                if !bulk.as_deref_mut().is_some_and(|b| b.end(*operation, &end)) {
                    tx.prepare_cached(&format!(
                        "UPDATE operation SET status = 'skipped', error = ?2, attempts = 0,
                                finished_at = {NOW}
                         WHERE id = ?1"
                    ))?
                    .run(params![operation, why])?;
                }
            }
        }
    }
    Ok(())
}

/// Writes that go together in one transaction: what an apply learnt in one round (operations
/// that start, calls and results, bindings). A driver that answers in process has no effect
/// outside gitplane, so its operation can start and end in the same transaction; committing
/// rounds rather than each kind of write apart halves how often the same index pages are
/// written. Nothing is kept unless [`Batch::commit`] is called.
pub struct Batch<'s> {
    tx: Tx<'s>,
    /// The rows gathered (operations; on PostgreSQL new resources too), written at the latest
    /// by the commit.
    bulk: Option<Bulk>,
    path: &'s std::path::Path,
    ring: SharedKeyring,
}

impl Batch<'_> {
    fn err(&self) -> impl Fn(DbError) -> StateError + '_ {
        |source| crate::state_error(self.path, source)
    }

    /// See [`Store::begin_operations`].
    pub fn begin_operations(&mut self, ops: &[OperationStart<'_>]) -> Result<Vec<i64>> {
        begin_operations(&self.tx, self.bulk.as_mut(), ops)
            .map_err(|source| crate::state_error(self.path, source))
    }

    /// Starts operations owned (their values go into the rows) that end in this batch: their
    /// keys, in order, for the batch's journal entries. On PostgreSQL a key is not yet the
    /// operation's id (the insert draws it), so it means nothing outside the batch and asks
    /// no round trip of the server.
    pub fn begin_started(
        &mut self,
        deployment: i64,
        rows: Vec<crate::StartRow>,
    ) -> Result<Vec<i64>> {
        let err = |source| crate::state_error(self.path, source);
        let bulk = self.bulk.as_mut().expect("both backends gather operations");
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids = bulk
            .keys_for_operations(&self.tx, rows.len())
            .map_err(err)?;
        for (row, id) in rows.into_iter().zip(&ids) {
            bulk.start_row(*id, deployment, row);
        }
        Ok(ids)
    }

    /// See [`Store::journal`].
    pub fn journal(&mut self, entries: &[JournalEntry<'_>]) -> Result<()> {
        write_journal(&self.tx, &self.ring, self.bulk.as_mut(), entries)
            .map_err(|source| crate::state_error(self.path, source))
    }

    /// See [`Store::record_bindings`].
    pub fn record_bindings(
        &mut self,
        deployment: i64,
        env: &str,
        resolved: &[(&str, bool, Vec<crate::BindingRecord>)],
    ) -> Result<()> {
        crate::history::record_bindings(&self.tx, deployment, env, resolved).map_err(self.err())
    }

    /// Writes the rows gathered so far (on PostgreSQL they are sent, pipelined) while the
    /// transaction goes on: for a caller whose operations have all ended.
    pub fn send_gathered(&mut self) -> Result<()> {
        finish(&self.tx, self.bulk.as_mut()).map_err(|source| crate::state_error(self.path, source))
    }

    pub fn commit(mut self) -> Result<()> {
        let path = self.path.to_owned();
        finish(&self.tx, self.bulk.as_mut()).map_err(|source| crate::state_error(&path, source))?;
        self.tx
            .commit()
            .map_err(|source| crate::state_error(&path, source))
    }

    /// Writes what is gathered and commits without waiting for PostgreSQL (see
    /// [`crate::db::Tx::commit_later`]): the caller may send the next batch meanwhile, and
    /// waits for this commit before it commits one that rests on it.
    pub fn commit_later(mut self) -> Result<BatchCommitting> {
        let path = self.path.to_owned();
        finish(&self.tx, self.bulk.as_mut()).map_err(|source| crate::state_error(&path, source))?;
        Ok(BatchCommitting {
            committing: self.tx.commit_later(),
            path,
        })
    }
}

/// A batch's commit on its way ([`Batch::commit_later`]).
#[must_use = "a commit's outcome is known only once waited for"]
pub struct BatchCommitting {
    committing: crate::db::Committing,
    path: std::path::PathBuf,
}

impl BatchCommitting {
    /// How the commit went: `Ok` once the batch is durable.
    pub fn wait(self) -> Result<()> {
        self.committing
            .wait()
            .map_err(|source| crate::state_error(&self.path, source))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::db::{Cell, params};
    use crate::tests::{each_backend, record, start};
    use crate::{BindingRecord, Counts, DeploymentStatus, LinkChanges, LinkRecord, StoredJson};

    /// What a batch leaves in the tables it writes, without ids and times (which only say
    /// whether they are set).
    fn dump(store: &Store, env: &str) -> String {
        let operations = store
            .conn
            .table(
                "SELECT guresid, action, reason, status, attempts, outputs_changed, error,
                        started_at IS NOT NULL, finished_at IS NOT NULL
                 FROM operation ORDER BY id",
                params![],
            )
            .unwrap()
            .rows;
        let versions = store
            .conn
            .table(
                "SELECT guresid, outputs, valid_from, valid_to FROM resource_version
                 ORDER BY guresid, valid_from",
                params![],
            )
            .unwrap()
            .rows;
        let times_set: Vec<Vec<Cell>> = store
            .conn
            .table(
                "SELECT guresid, created_at IS NOT NULL, updated_at IS NOT NULL
                 FROM resource ORDER BY guresid",
                params![],
            )
            .unwrap()
            .rows;
        let bindings: Vec<Vec<BindingRecord>> = ["g2", "g3"]
            .iter()
            .map(|g| store.current_bindings(g).unwrap())
            .collect();
        format!(
            "operations {operations:?}\nresources {:?}\ntimes {times_set:?}\nversions \
             {versions:?}\nbindings {bindings:?}\nlinks {:?}\nmanifests {:?}\ncookie {:?}",
            store.resources(env).unwrap(),
            store.links(env).unwrap(),
            store.manifests(env, true).unwrap(),
            store.cookie("g2").unwrap(),
        )
    }

    fn binding(needed: &str, path: &str, value: Option<serde_json::Value>) -> BindingRecord {
        BindingRecord {
            needed: needed.into(),
            needed_path: path.into(),
            provided: "g1".into(),
            provided_path: "outputs.host".into(),
            data_type: "string".into(),
            secret: value.is_none(),
            value,
            inserted: false,
            interface: None,
        }
    }

    /// One round of an apply in one batch: operations that start and end in it (new resources,
    /// with and without secrets and manifests, an update of a recorded one between them, one
    /// that failed and one skipped), calls, bindings, then links. PostgreSQL gathers these
    /// into a statement per table; what it keeps must be what SQLite keeps, row for row.
    #[test]
    fn a_batch_of_starts_and_ends_keeps_the_same_rows_on_both_backends() {
        let dumps = RefCell::new(Vec::new());
        each_backend(|mut store| {
            let env = "development";
            let first = store.begin_deployment(env, "c1").unwrap();
            let op = store.begin_operation(&start(first)).unwrap();
            store
                .finish_put(op, 1, first, &record("g1"), Some(true))
                .unwrap();
            store
                .finish_deployment(first, DeploymentStatus::Succeeded, &Counts::default(), None)
                .unwrap();

            let dep = store.begin_deployment(env, "c2").unwrap();
            let create = |guresid: &'static str| OperationStart {
                guresid,
                ..start(dep)
            };
            let starts = [
                create("g2"),
                create("g3"),
                OperationStart {
                    action: "update",
                    reason: "inputs changed",
                    ..start(dep)
                },
                create("g4"),
                create("g5"),
                create("g6"),
                create("g10"),
            ];
            let g2 = record("g2");
            let g3 = ResourceRecord {
                secret_outputs: serde_json::json!({}),
                secret_inputs: StoredJson::from_text(NO_SECRET_INPUTS.to_owned()),
                ..record("g3")
            };
            let g1 = ResourceRecord {
                outputs: serde_json::json!({"host": "db2"}),
                ..record("g1")
            };
            let g4 = ResourceRecord {
                status: ResourceStatus::Failed,
                error: Some("quota".into()),
                ..record("g4")
            };
            let manifests = ManifestsRecord {
                shown: r#"[{"name":"cm","data":"(secret)"}]"#.into(),
                full: Some(r#"[{"name":"cm","data":"s3cret"}]"#.into()),
            };
            let none = ManifestsRecord {
                shown: "[]".into(),
                full: None,
            };
            let mut batch = store.batch().unwrap();
            let ids = batch.begin_operations(&starts).unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
            let put = |k: usize, record, new, manifests| JournalEntry::Put {
                operation: ids[k],
                attempts: 2,
                deployment: dep,
                record,
                outputs_changed: Some(true),
                new,
                manifests,
                sealed: None,
            };
            batch
                .journal(&[
                    // Still going after its third call.
                    JournalEntry::Call {
                        operation: ids[6],
                        attempts: 3,
                        guresid: "g10",
                        cookie: None,
                    },
                    JournalEntry::Call {
                        operation: ids[0],
                        attempts: 1,
                        guresid: "g2",
                        cookie: Some(Some("cookie-of-g2")),
                    },
                    put(0, &g2, true, Some(&manifests)),
                    put(1, &g3, true, Some(&none)),
                    put(2, &g1, false, None),
                    put(3, &g4, true, None),
                    JournalEntry::Failed {
                        operation: ids[4],
                        attempts: 0,
                        error: "no driver 'x' is registered",
                    },
                    JournalEntry::Skipped {
                        operation: ids[5],
                        why: "gitplane is stopping",
                    },
                ])
                .unwrap();
            // Operations started later in the same batch follow the first ones, though
            // neither is written yet.
            let later = batch.begin_operations(&[create("g11")]).unwrap();
            assert!(later[0] > ids[6], "{later:?} after {ids:?}");
            batch
                .record_bindings(
                    dep,
                    env,
                    &[
                        (
                            "g2",
                            false,
                            vec![
                                binding("g2", "values.host", Some(serde_json::json!("db2"))),
                                binding("g2", "secrets.password", None),
                            ],
                        ),
                        ("g3", false, vec![binding("g3", "values.host", None)]),
                    ],
                )
                .unwrap();
            batch.commit().unwrap();
            let link = |consumer: &str, kind: &str| LinkRecord {
                consumer: consumer.into(),
                provider: "g1".into(),
                kind: kind.into(),
                update_type: "None".into(),
            };
            store
                .record_link_changes(
                    dep,
                    env,
                    &LinkChanges {
                        removed: Vec::new(),
                        // The same pair twice: the last one is the link.
                        added: vec![
                            link("g2", "reference"),
                            link("g3", "dependency"),
                            link("g2", "dependency"),
                        ],
                    },
                )
                .unwrap();

            // Operations that ended before any call, written at once.
            store
                .ended_operations(&[
                    (create("g8"), Ended::Skipped, "blocked by app/g4"),
                    (create("g9"), Ended::Failed, "its inputs do not resolve"),
                ])
                .unwrap();

            // A batch not committed leaves nothing.
            let before = dump(&store, env);
            let mut dropped = store.batch().unwrap();
            let ids = dropped.begin_operations(&[create("g7")]).unwrap();
            dropped
                .journal(&[JournalEntry::Put {
                    operation: ids[0],
                    attempts: 1,
                    deployment: dep,
                    record: &record("g7"),
                    outputs_changed: Some(true),
                    new: true,
                    manifests: None,
                    sealed: None,
                }])
                .unwrap();
            drop(dropped);
            assert_eq!(dump(&store, env), before);
            dumps.borrow_mut().push(before);
        });
        let dumps = dumps.into_inner();
        let sqlite = &dumps[0];
        for expected in [
            r#"[Text("g2"), Text("create"), Text("new"), Text("succeeded"), Int(2), Int(1), Null, Int(1), Int(1)]"#,
            r#"[Text("g1"), Text("update"), Text("inputs changed"), Text("succeeded"), Int(2), Int(1), Null, Int(1), Int(1)]"#,
            r#"[Text("g4"), Text("create"), Text("new"), Text("failed"), Int(2), Int(1), Text("quota"), Int(1), Int(1)]"#,
            r#"[Text("g5"), Text("create"), Text("new"), Text("failed"), Int(0), Null, Text("no driver 'x' is registered"), Int(1), Int(1)]"#,
            r#"[Text("g6"), Text("create"), Text("new"), Text("skipped"), Int(0), Null, Text("gitplane is stopping"), Int(1), Int(1)]"#,
            r#"[Text("g10"), Text("create"), Text("new"), Text("started"), Int(3), Null, Null, Int(1), Int(0)]"#,
            r#"[Text("g11"), Text("create"), Text("new"), Text("started"), Int(0), Null, Null, Int(1), Int(0)]"#,
            r#"[Text("g8"), Text("create"), Text("new"), Text("skipped"), Int(0), Null, Text("blocked by app/g4"), Int(1), Int(1)]"#,
            r#"[Text("g9"), Text("create"), Text("new"), Text("failed"), Int(0), Null, Text("its inputs do not resolve"), Int(1), Int(1)]"#,
            r#"versions [[Text("g1"), Text("{\"host\":\"db\"}"), Int(1), Int(2)]]"#,
            r#"cookie Some("cookie-of-g2")"#,
            r#"kind: "dependency""#,
            "s3cret",
        ] {
            assert!(sqlite.contains(expected), "{expected}\nnot in\n{sqlite}");
        }
        assert!(!sqlite.contains("g7"), "{sqlite}");
        if let [sqlite, postgres] = &dumps[..] {
            assert_eq!(postgres, sqlite);
        }
    }
}
