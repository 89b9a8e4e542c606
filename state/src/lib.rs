//! The SQLite store of gitplane: the schema, its migrations, and every query gitplane makes.
//!
//! Only this crate knows SQL. The schema itself is `schema.sql` at the repository root, a public
//! interface that people query with `sqlite3`; this crate applies it by migrations keyed on
//! `PRAGMA user_version`, in WAL mode with foreign keys on.

mod bulk;
mod copy;
pub mod db;
mod dialect;
mod drift;
mod figures;
mod fingerprint;
mod history;
mod journal;
mod lease;
mod lock;
mod postgres;
mod requests;
mod seal;
mod surgery;
mod trust;
mod views;
mod workflow;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::db::{Conn, DbError, DbResult, FromCell, OptionalExtension, Params, Row, Tx, params};

pub use copy::{CopyError, CopyReport, copied_tables, copy_state};
pub use drift::{DetectRun, DetectRunRecord, DriftFinding};
pub use figures::Figures;
pub use fingerprint::{AppFingerprint, Census, fingerprints_digest};
pub use history::{LinkChanges, Pruned, Retention};
pub use journal::{
    Batch, BatchCommitting, Ended, JournalEntry, ManifestsRecord, SealedPut, Sealer,
};
pub use lease::{Beat, Fence, LeaseHold, LeaseRecord, Leases};
pub use lock::{ApplyLock, LockHold, Released, release_gone};
pub use postgres::{PgTarget, is_postgres_url};
pub use requests::{DaemonRecord, ReconcileAction, ReconcileAnswer, ReconcileRequest, this_host};
pub use seal::{KeySource, SealError, StateKey, pending_key_path};
pub use surgery::{Adopted, BackupReport, MoveTo};
pub use trust::{Action, ActionRecord, KeyCheck, RepositoryIdentity};
pub use views::{
    AppFilter, DeploymentSummary, FailedResource, NodeCensus, NodeCount, NodeRow, ResourceView,
};
pub use workflow::{EnvPin, PreviewPush, PreviewRecord};
pub use writer::{EndedPut, JournalWriter, OwnedBatch, StartRow};

const SCHEMA: &str = include_str!("../../schema.sql");

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    // The cause is part of the message and deliberately not a `source`: printed as a chain,
    // SQLite's own wording would repeat it ("...: unable to open database file: unable to
    // open database file").
    #[error("state {path}: {cause}")]
    Database { path: PathBuf, cause: DbError },
    #[error("state {url}: {reason}")]
    Url { url: String, reason: String },
    #[error(
        "state {path}: a PostgreSQL state needs state_key in the host config (a file or a \
         systemd credential), the same on every host that shares it: secrets are sealed with it"
    )]
    KeyNeeded { path: PathBuf },
    #[error("state {path}: cannot create the file: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state {path}: schema version {found} is newer than this gitplane knows ({known}): \
         upgrade gitplane"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error(
        "state {path}: the file has {links} names (hard links); SQLite keeps a separate log \
         for each name, so writing through two of them would damage it. Keep one name (a \
         symlink is fine) and remove the others"
    )]
    HardLinked { path: PathBuf, links: u64 },
    #[error(
        "state {path}: another gitplane ({holder}) is applying to environment {env}; wait for \
         it to finish"
    )]
    Busy {
        path: PathBuf,
        env: String,
        holder: String,
    },
    #[error(
        "state {path}: table {table}{}: {reason}; restore the file from a backup or remove \
         the row",
        if row.is_empty() { String::new() } else { format!(", row {row}") }
    )]
    Damaged {
        path: PathBuf,
        table: String,
        row: String,
        reason: String,
    },
    #[error(
        "state {path}: deployment {deployment} was superseded by deployment {newer} (commit \
         {commit}): only the newest deployment of an environment can be approved"
    )]
    Superseded {
        path: PathBuf,
        deployment: i64,
        newer: i64,
        commit: String,
    },
    #[error("state {path}: {source}")]
    Seal {
        path: PathBuf,
        #[source]
        source: SealError,
    },
    #[error("state {path}: a resource is recorded under {guresid} already")]
    Taken { path: PathBuf, guresid: String },
    #[error("state {path}: environment {env} has no deployment yet: apply it once, then import")]
    NoDeploymentYet { path: PathBuf, env: String },
    #[error(
        "state {path}: a PostgreSQL state is backed up with pg_dump (docs/postgres.md), not \
         by gitplane"
    )]
    BackupPostgres { path: PathBuf },
    #[error("state {path}: environment {env} is not locked")]
    NotLocked { path: PathBuf, env: String },
    #[error("state {path}: column {column} of {guresid} holds invalid JSON: {source}")]
    Json {
        path: PathBuf,
        guresid: String,
        column: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T, E = StateError> = std::result::Result<T, E>;

// What state records and the pure core plans with: defined by the core, stored here.
pub use gitplane_core::records::{
    BindingRecord, DeletionPolicy, LinkRecord, ResourceRecord, ResourceStatus, StoredJson,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentStatus {
    Running,
    Succeeded,
    Failed,
    /// Stopped by the deletion guard before anything changed; `gitplane approve` releases it.
    Held,
    /// Held, then overtaken by a newer commit's deployment: it can no longer be approved.
    Superseded,
}

impl DeploymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Running => "running",
            DeploymentStatus::Succeeded => "succeeded",
            DeploymentStatus::Failed => "failed",
            DeploymentStatus::Held => "held",
            DeploymentStatus::Superseded => "superseded",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => DeploymentStatus::Running,
            "succeeded" => DeploymentStatus::Succeeded,
            "failed" => DeploymentStatus::Failed,
            "held" => DeploymentStatus::Held,
            "superseded" => DeploymentStatus::Superseded,
            _ => return None,
        })
    }
}

/// What a deployment changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub created: i64,
    pub updated: i64,
    pub deleted: i64,
    pub unchanged: i64,
    pub failed: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentRecord {
    pub id: i64,
    pub env: String,
    pub commit_id: Option<String>,
    pub status: DeploymentStatus,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub counts: Counts,
    pub error: Option<String>,
    /// For a held deployment: the resources it would delete.
    pub held: Option<Vec<String>>,
    /// Which attempt at its commit it was: 1, or more for a retry by the daemon.
    pub attempt: i64,
}

/// A driver call about to start.
#[derive(Debug, Clone)]
pub struct OperationStart<'a> {
    pub deployment: i64,
    pub guresid: &'a str,
    pub app: Option<&'a str>,
    pub res_type: &'a str,
    pub class: &'a str,
    pub res_id: &'a str,
    /// `create`, `update` or `delete`.
    pub action: &'a str,
    pub reason: &'a str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OperationRecord {
    pub id: i64,
    pub deployment: i64,
    pub guresid: String,
    pub action: String,
    pub reason: String,
    pub status: String,
    pub error: Option<String>,
}

/// An operation on one resource with its deployment's commit, for a resource's history.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceOperation {
    pub operation: OperationRecord,
    pub env: String,
    /// The deployment's commit; `None` when the revision could not be read.
    pub commit_id: Option<String>,
    /// `commit` or `drift`.
    pub kind: String,
    /// Driver calls made: polls and retries included.
    pub attempts: i64,
    pub started_at: String,
    pub finished_at: Option<String>,
}

/// The error a row mapper returns for a value it cannot read; [`state_error`] turns it into
/// [`StateError::Damaged`], naming the table and row, instead of reading a default.
pub(crate) fn damaged(table: &'static str, row: String, reason: String) -> DbError {
    DbError::Damaged { table, row, reason }
}

/// The error of a query on the state at `path`.
pub(crate) fn state_error(path: &Path, source: impl Into<DbError>) -> StateError {
    match source.into() {
        DbError::Damaged { table, row, reason } => StateError::Damaged {
            path: path.to_owned(),
            table: table.to_owned(),
            row,
            reason,
        },
        DbError::Seal(source) => StateError::Seal {
            path: path.to_owned(),
            source,
        },
        cause => StateError::Database {
            path: path.to_owned(),
            cause,
        },
    }
}

/// A [`DeploymentRecord`] from a row whose first 13 columns are `id, env, commit_id, status,
/// started_at, finished_at, created, updated, deleted, unchanged, failed, error, held, attempt`.
pub(crate) fn deployment_row(r: &Row<'_>) -> DbResult<DeploymentRecord> {
    let id: i64 = r.get(0)?;
    let status: String = r.get(3)?;
    let Some(status) = DeploymentStatus::parse(&status) else {
        return Err(damaged(
            "deployment",
            id.to_string(),
            format!("status '{status}' is not one gitplane writes"),
        ));
    };
    let held = match r.get::<_, Option<String>>(12)? {
        None => None,
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
            damaged(
                "deployment",
                id.to_string(),
                format!("column held is not a JSON list of resources: {e}"),
            )
        })?),
    };
    Ok(DeploymentRecord {
        id,
        env: r.get(1)?,
        commit_id: r.get(2)?,
        status,
        started_at: r.get(4)?,
        finished_at: r.get(5)?,
        counts: Counts {
            created: r.get(6)?,
            updated: r.get(7)?,
            deleted: r.get(8)?,
            unchanged: r.get(9)?,
            failed: r.get(10)?,
        },
        error: r.get(11)?,
        held,
        attempt: r.get(13)?,
    })
}

/// Where a store's connection goes, to open another.
#[derive(Clone)]
enum Reopen {
    /// The SQLite file, by its real name.
    Lite(PathBuf),
    Pg(Box<postgres::PgTarget>),
}

pub(crate) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// An open state file.
pub struct Store {
    conn: Conn,
    path: PathBuf,
    /// How to open another connection to the same state ([`Store::connect_again`]).
    reopen: Reopen,
    keyring: seal::SharedKeyring,
    /// The leases this store writes under (a daemon's, on PostgreSQL): every write checks them.
    fences: Vec<Fence>,
}

impl Store {
    /// Opens (creating if needed, readable by its owner alone) and migrates the state file,
    /// with its key beside it (`<state>.key`).
    pub fn open(path: &Path) -> Result<Store> {
        Store::open_keyed(path, None)
    }

    /// Opens the state like [`Store::open`], with secrets sealed by the key from `key`
    /// (`None`: `<state>.key` beside the file, by its real name). A `postgres://` URL opens a
    /// PostgreSQL database instead of a file; it needs `key`, since every daemon sharing the
    /// database must seal with the same key.
    pub fn open_keyed(path: &Path, key: Option<&KeySource>) -> Result<Store> {
        Store::open_keyed_noting(path, key, &|| {})
    }

    /// [`Store::open_keyed`], calling `fresh` when a PostgreSQL database has no schema yet, just
    /// before it is made: nothing is recorded there, so the caller may work out meanwhile what a
    /// first apply needs (the schema takes the server a tenth of a second).
    pub fn open_keyed_noting(
        path: &Path,
        key: Option<&KeySource>,
        fresh: &dyn Fn(),
    ) -> Result<Store> {
        if let Some(url) = path.to_str().filter(|s| postgres::is_postgres_url(s)) {
            return Store::open_postgres(url, key, fresh);
        }
        if !path.exists() {
            create_private(path).map_err(|source| StateError::Create {
                path: path.to_owned(),
                source,
            })?;
        }
        let real = real_file(path)?;
        let e = |source| state_error(path, source);
        let mut conn = rusqlite::Connection::open(&real).map_err(e)?;
        let source = key.cloned().unwrap_or_else(|| KeySource::beside(&real));
        let keyring = seal::Keyring::new(source, None);
        seal::register(&conn, &keyring).map_err(e)?;
        configure(&mut conn).map_err(e)?;
        migrate(&mut conn, path)?;
        Store::with_conn(
            Conn::Lite(conn),
            (path.to_owned(), Reopen::Lite(real)),
            keyring,
        )
    }

    fn open_postgres(url: &str, key: Option<&KeySource>, fresh: &dyn Fn()) -> Result<Store> {
        let target = pg_target(url)?;
        let path = PathBuf::from(target.shown());
        let Some(key) = key else {
            return Err(StateError::KeyNeeded { path });
        };
        let conn = postgres::PgConn::open(&target).map_err(|e| state_error(&path, e))?;
        migrate_postgres(&conn, &path, fresh)?;
        Store::with_conn(
            Conn::Pg(conn),
            (path, Reopen::Pg(Box::new(target))),
            seal::Keyring::new(key.clone(), None),
        )
    }

    fn with_conn(
        conn: Conn,
        (path, reopen): (PathBuf, Reopen),
        keyring: seal::SharedKeyring,
    ) -> Result<Store> {
        let store = Store {
            conn,
            path,
            reopen,
            keyring,
            fences: Vec::new(),
        };
        let sealed_with = store.sealed_with()?;
        store
            .keyring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sealed_with = sealed_with;
        Ok(store)
    }

    /// Another connection to the same state, already migrated: the same key, and the same
    /// fences (see [`Store::set_fences`]), so its writes are refused when this store's would be.
    pub fn connect_again(&self) -> Result<Store> {
        let e = |source: rusqlite::Error| state_error(&self.path, source);
        let conn = match &self.reopen {
            Reopen::Lite(real) => {
                let mut conn = rusqlite::Connection::open(real).map_err(e)?;
                seal::register(&conn, &self.keyring).map_err(e)?;
                configure(&mut conn).map_err(e)?;
                Conn::Lite(conn)
            }
            Reopen::Pg(target) => Conn::Pg(
                postgres::PgConn::open(target).map_err(|source| state_error(&self.path, source))?,
            ),
        };
        Ok(Store {
            conn,
            path: self.path.clone(),
            reopen: self.reopen.clone(),
            keyring: self.keyring.clone(),
            fences: self.fences.clone(),
        })
    }

    /// SQLite: this connection leaves checkpoints to another ([`Store::checkpoint`]), so its
    /// commits never wait for one. PostgreSQL: nothing.
    pub(crate) fn leave_checkpoints(&self) -> Result<()> {
        if let Conn::Lite(conn) = &self.conn {
            conn.pragma_update(None, "wal_autocheckpoint", 0)
                .map_err(|source| state_error(&self.path, source))?;
        }
        Ok(())
    }

    /// SQLite: copies what the log holds into the file as far as no reader still needs it (a
    /// passive checkpoint: it waits for nobody, and writers go on meanwhile). PostgreSQL:
    /// nothing.
    pub(crate) fn checkpoint(&self) -> Result<()> {
        if let Conn::Lite(conn) = &self.conn {
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                .map_err(|source| state_error(&self.path, source))?;
        }
        Ok(())
    }

    /// The state file's path, or the PostgreSQL URL without its password.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which database the state is in.
    pub fn backend(&self) -> db::Backend {
        self.conn.backend()
    }

    /// Runs `f` in one transaction, committed when it returns `Ok`. With fences set (a
    /// daemon's leases), the transaction first checks that each lease is still held at its
    /// generation, and holds them so for its length: a takeover cannot slip in before it
    /// commits.
    fn in_transaction<T>(&mut self, f: impl FnOnce(&Tx<'_>) -> DbResult<T>) -> Result<T> {
        let err = |source| state_error(&self.path, source);
        let tx = self.conn.transaction().map_err(err)?;
        lease::check_fences(&tx, &self.fences).map_err(err)?;
        let out = f(&tx).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(out)
    }

    /// Runs `f` in one transaction like [`Store::in_transaction`], for the writes of methods
    /// that take the store shared.
    fn write<T>(&self, f: impl FnOnce(&Tx<'_>) -> DbResult<T>) -> Result<T> {
        let err = |source| state_error(&self.path, source);
        let tx = self.conn.transaction().map_err(err)?;
        lease::check_fences(&tx, &self.fences).map_err(err)?;
        let out = f(&tx).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(out)
    }

    fn err(&self) -> impl Fn(DbError) -> StateError + '_ {
        |source| state_error(&self.path, source)
    }

    /// Runs a cached query and maps every row.
    fn query<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        map: impl FnMut(&Row<'_>) -> DbResult<T>,
    ) -> Result<Vec<T>> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(self.err())?;
        stmt.query_map(params, map)
            .map_err(self.err())?
            .collect::<DbResult<Vec<T>>>()
            .map_err(self.err())
    }

    /// Seals `plain` with the state key, bound to `aad` (the table, column and GUResID).
    /// Opens a value sealed with the state key (one written before sealing existed opens as
    /// itself).
    fn open_sealed(&self, sealed: Option<String>, aad: &str) -> Result<Option<String>> {
        open_with(&self.keyring, sealed, aad).map_err(self.err())
    }

    /// Every environment that has resources recorded.
    pub fn environments_with_resources(&self) -> Result<Vec<String>> {
        self.query(
            // A preview environment is its branch's alone: a commit of the watched ref that
            // does not declare it must not take it for a removed environment.
            // The distinct environments by skipping through `resource_env`, one seek each,
            // not by reading every resource (PostgreSQL has no skip scan of its own).
            "WITH RECURSIVE e(env) AS (
                 SELECT MIN(env) FROM resource
                 UNION ALL
                 SELECT (SELECT MIN(r.env) FROM resource r WHERE r.env > e.env)
                 FROM e WHERE e.env IS NOT NULL
             )
             SELECT env FROM e
             WHERE env IS NOT NULL
               AND env NOT IN (SELECT env FROM preview WHERE removed_at IS NULL)
             ORDER BY env",
            params![],
            |r| r.get(0),
        )
    }

    /// Every environment that has resources or deployments recorded.
    pub fn environments(&self) -> Result<Vec<String>> {
        self.query(
            "SELECT env FROM resource UNION SELECT env FROM deployment ORDER BY env",
            params![],
            |r| r.get(0),
        )
    }

    /// The resources recorded for `env`, secret outputs included, ordered by GUResID.
    pub fn resources(&self, env: &str) -> Result<Vec<ResourceRecord>> {
        self.resources_where("r.env = ?1", params![env], true)
    }

    /// The resources recorded for `env` with their secret outputs and inputs left out (read
    /// as none), ordered by GUResID: what reports need, without the state key.
    pub fn resources_without_secrets(&self, env: &str) -> Result<Vec<ResourceRecord>> {
        self.resources_where("r.env = ?1", params![env], false)
    }

    /// The recorded resources among `guresids`, ordered by GUResID; secret outputs included
    /// when `secrets`.
    pub fn resources_by_guresid(
        &self,
        guresids: &[String],
        secrets: bool,
    ) -> Result<Vec<ResourceRecord>> {
        let ids = serde_json::to_string(guresids).expect("strings serialise");
        self.resources_where(
            "r.guresid IN (SELECT value FROM json_each(?1))",
            params![ids],
            secrets,
        )
    }

    /// The recorded resources `wanted` names, as (GUResID, environment): its GUResID, or its
    /// label `app/type.class#id` (`-/type.class#id` for a global one), in `envs` (every
    /// environment when empty). Read through the indexes, not by listing environments.
    pub fn find_resources(&self, envs: &[String], wanted: &str) -> Result<Vec<(String, String)>> {
        let envs_json = serde_json::to_string(envs).expect("strings serialise");
        let in_envs = "(?2 = '[]' OR env IN (SELECT value FROM json_each(?2)))";
        let mut found: Vec<(String, String)> = self.query(
            &format!("SELECT guresid, env FROM resource WHERE guresid = ?1 AND {in_envs}"),
            params![wanted, envs_json],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let label = wanted.split_once('/').and_then(|(app, rest)| {
            let (type_class, id) = rest.split_once('#')?;
            let (res_type, class) = type_class.split_once('.')?;
            Some(((app != "-").then_some(app), res_type, class, id))
        });
        if let Some((app, res_type, class, id)) = label {
            // One index seek per environment (`resource_env` is (env, app, type)): a search
            // across environments would scan every row.
            let envs = if envs.is_empty() {
                // The distinct environments by skipping through the index, one seek each,
                // rather than reading every entry of it.
                self.query(
                    "WITH RECURSIVE e(env) AS (
                         SELECT MIN(env) FROM resource
                         UNION ALL
                         SELECT (SELECT MIN(r.env) FROM resource r WHERE r.env > e.env)
                         FROM e WHERE e.env IS NOT NULL
                     )
                     SELECT env FROM e WHERE env IS NOT NULL",
                    params![],
                    |r| r.get::<_, String>(0),
                )?
            } else {
                envs.to_vec()
            };
            // `app IS ?` would not use the index: one statement for an app, one for globals.
            let (sql, app) = match app {
                Some(app) => (
                    "SELECT guresid, env FROM resource
                     WHERE env = ?1 AND app = ?2 AND type = ?3 AND class = ?4 AND res_id = ?5",
                    app,
                ),
                None => (
                    "SELECT guresid, env FROM resource
                     WHERE env = ?1 AND app IS NULL AND ?2 = '' AND type = ?3 AND class = ?4
                       AND res_id = ?5",
                    "",
                ),
            };
            for env in &envs {
                found.extend(
                    self.query(sql, params![env, app, res_type, class, id], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?,
                );
            }
        }
        found.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
        found.dedup();
        Ok(found)
    }

    /// The resources recorded for the apps `apps` of `env`, and its global ones (no app) when
    /// `globals`, ordered by GUResID.
    pub fn resources_of_apps(
        &self,
        env: &str,
        apps: &std::collections::BTreeSet<String>,
        globals: bool,
    ) -> Result<Vec<ResourceRecord>> {
        // No apps (a commit that changes none): only the globals, with no round trip for none.
        let mut records = if apps.is_empty() {
            Vec::new()
        } else {
            let apps = serde_json::to_string(apps).expect("strings serialise");
            self.resources_where(
                "r.env = ?1 AND r.app IN (SELECT value FROM json_each(?2))",
                params![env, apps],
                true,
            )?
        };
        if globals {
            records.extend(self.resources_where(
                "r.env = ?1 AND r.app IS NULL",
                params![env],
                true,
            )?);
            records.sort_by(|a, b| a.guresid.cmp(&b.guresid));
        }
        Ok(records)
    }

    fn resources_where<P: Params>(
        &self,
        condition: &str,
        params: P,
        secrets: bool,
    ) -> Result<Vec<ResourceRecord>> {
        let (secret_outputs, secret_inputs) = if secrets {
            ("s.outputs", "s.inputs")
        } else {
            ("NULL", "NULL")
        };
        let rows = self.query(
            &format!(
                "SELECT r.guresid, r.env, r.app, r.type, r.class, r.res_id, r.definition, r.driver,
                        r.status, r.inputs_hash, r.outputs, {secret_outputs}, r.error,
                        r.commit_id, r.inputs, {secret_inputs}, r.account, r.deletion_policy,
                        r.template_hash
                 FROM resource r LEFT JOIN resource_secret s ON s.guresid = r.guresid
                 WHERE {condition} ORDER BY r.guresid"
            ),
            params,
            |r| {
                Ok((
                    ResourceRecord {
                        guresid: r.get(0)?,
                        env: r.get(1)?,
                        app: r.get(2)?,
                        res_type: r.get(3)?,
                        class: r.get(4)?,
                        res_id: r.get(5)?,
                        definition: r.get(6)?,
                        driver: r.get(7)?,
                        status: match r.get::<_, String>(8)?.as_str() {
                            "ready" => ResourceStatus::Ready,
                            "failed" => ResourceStatus::Failed,
                            other => {
                                return Err(damaged(
                                    "resource",
                                    r.get(0)?,
                                    format!("status '{other}' is neither 'ready' nor 'failed'"),
                                ));
                            }
                        },
                        inputs_hash: r.get(9)?,
                        outputs: Value::Null,
                        secret_outputs: Value::Null,
                        inputs: StoredJson::from_text(r.get(14)?),
                        secret_inputs: StoredJson::from_text(
                            r.get::<_, Option<String>>(15)?
                                .unwrap_or_else(|| journal::NO_SECRET_INPUTS.to_owned()),
                        ),
                        account: r.get(16)?,
                        deletion_policy: match r.get::<_, String>(17)?.as_str() {
                            "delete" => DeletionPolicy::Delete,
                            "orphan" => DeletionPolicy::Orphan,
                            other => {
                                return Err(damaged(
                                    "resource",
                                    r.get(0)?,
                                    format!(
                                        "deletion_policy '{other}' is neither 'delete' nor \
                                         'orphan'"
                                    ),
                                ));
                            }
                        },
                        template_hash: r.get(18)?,
                        error: r.get(12)?,
                        commit_id: r.get(13)?,
                    },
                    (r.get::<_, String>(10)?, r.get::<_, Option<String>>(11)?),
                ))
            },
        )?;
        rows.into_iter()
            .map(|(mut rec, (outputs, sealed_outputs))| {
                // Opened here rather than in SQL: PostgreSQL never sees the key.
                let g = &rec.guresid;
                let secret_outputs =
                    self.open_sealed(sealed_outputs, &format!("resource_secret.outputs:{g}"))?;
                if secrets {
                    let sealed = Some(std::mem::take(&mut rec.secret_inputs).into_text())
                        .filter(|v| v.as_str() != journal::NO_SECRET_INPUTS);
                    rec.secret_inputs = StoredJson::from_text(
                        self.open_sealed(sealed, &format!("resource_secret.inputs:{g}"))?
                            .unwrap_or_else(|| journal::NO_SECRET_INPUTS.to_owned()),
                    );
                }
                rec.outputs = self.json(&rec.guresid, "outputs", &outputs)?;
                rec.secret_outputs = match secret_outputs.as_deref() {
                    None | Some("{}") => Value::Object(Default::default()),
                    Some(text) => self.json(&rec.guresid, "resource_secret.outputs", text)?,
                };
                Ok(rec)
            })
            .collect()
    }

    /// The Kubernetes manifests recorded for the resources of `env`, by GUResID: each a JSON
    /// list of `{"name", "location", "data"}`, secret values replaced unless `with_secrets` (which
    /// needs the state key).
    pub fn manifests(&self, env: &str, with_secrets: bool) -> Result<Vec<(String, Value)>> {
        let sealed = if with_secrets { "m.sealed" } else { "NULL" };
        let rows = self.query(
            &format!(
                "SELECT m.guresid, m.manifests, {sealed}
                 FROM resource_manifest m JOIN resource r ON r.guresid = m.guresid
                 WHERE r.env = ?1 ORDER BY m.guresid"
            ),
            [env],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            },
        )?;
        rows.into_iter()
            .map(|(guresid, shown, full)| {
                let full =
                    self.open_sealed(full, &format!("resource_manifest.sealed:{guresid}"))?;
                let value = match full {
                    Some(text) => self.json(&guresid, "resource_manifest.sealed", &text)?,
                    None => self.json(&guresid, "resource_manifest.manifests", &shown)?,
                };
                Ok((guresid, value))
            })
            .collect()
    }

    fn json(&self, guresid: &str, column: &'static str, text: &str) -> Result<Value> {
        serde_json::from_str(text).map_err(|source| StateError::Json {
            path: self.path.clone(),
            guresid: guresid.to_owned(),
            column,
            source,
        })
    }

    /// Records the start of a deployment of `commit` to `env`.
    pub fn begin_deployment(&self, env: &str, commit: &str) -> Result<i64> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO deployment (env, commit_id, status, started_at)
                 VALUES (?1, ?2, 'running', {NOW}) RETURNING id"
            ))?
            .insert(params![env, commit])
        })
    }

    /// Records a deployment that failed before any driver was called (the commit did not load
    /// or build): nothing else in state changes.
    pub fn failed_deployment(&self, env: &str, commit: Option<&str>, error: &str) -> Result<i64> {
        self.write(|tx| {
            let id = tx
                .prepare_cached(&format!(
                    "INSERT INTO deployment (env, commit_id, status, started_at, finished_at, error)
                     VALUES (?1, ?2, 'failed', {NOW}, {NOW}, ?3) RETURNING id"
                ))?
                .insert(params![env, commit, error])?;
            if let Some(commit) = commit {
                supersede_held(tx, env, id, commit)?;
            }
            Ok(id)
        })
    }

    /// The deletion guard's threshold in force for `env`: the one the commit of its newest
    /// deployment that ran (or is running) set. `None` before any did.
    pub fn threshold_in_force(&self, env: &str) -> Result<Option<f64>> {
        self.conn
            .prepare_cached(
                "SELECT deletion_threshold FROM deployment
                 WHERE env = ?1 AND deletion_threshold IS NOT NULL
                   AND status IN ('running', 'succeeded', 'failed')
                 ORDER BY id DESC LIMIT 1",
            )
            .and_then(|mut s| s.query_row([env], |r| r.get(0)).optional())
            .map_err(self.err())
    }

    /// Ends a deployment with its status and counts.
    pub fn finish_deployment(
        &self,
        id: i64,
        status: DeploymentStatus,
        counts: &Counts,
        error: Option<&str>,
    ) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE deployment SET status = ?2, finished_at = {NOW}, created = ?3,
                        updated = ?4, deleted = ?5, unchanged = ?6, failed = ?7, error = ?8
                 WHERE id = ?1"
            ))?
            .execute(params![
                id,
                status.as_str(),
                counts.created,
                counts.updated,
                counts.deleted,
                counts.unchanged,
                counts.failed,
                error
            ])
        })?;
        Ok(())
    }

    /// Deployments, newest first; of one environment when `env` is set.
    pub fn deployments(&self, env: Option<&str>) -> Result<Vec<DeploymentRecord>> {
        self.query(
            "SELECT id, env, commit_id, status, started_at, finished_at,
                        created, updated, deleted, unchanged, failed, error, held, attempt
                 FROM deployment WHERE CAST(?1 AS TEXT) IS NULL OR env = ?1 ORDER BY id DESC",
            [env],
            deployment_row,
        )
    }

    /// Starts the deployment of `commit` to `env`, picking up after a crash.
    ///
    /// The caller holds the [`ApplyLock`], so a deployment still `running` was cut off: its
    /// unfinished operations become `interrupted`. If the newest one was deploying this same
    /// commit, it is resumed (its id is returned with `true`); any other is closed as failed.
    pub fn begin_or_resume_deployment(
        &mut self,
        env: &str,
        commit: &str,
        drift: bool,
        threshold: f64,
    ) -> Result<(i64, bool)> {
        let path = self.path.clone();
        let e = |source| state_error(&path, source);
        // Its commit need not wait for the disk (on PostgreSQL, one WAL flush less per
        // deployment): lost to a server crash, it is redone by the next deployment, and
        // nothing relies on it before a durable commit that flushes it with its own: each
        // operation is journalled, durably, before its first driver call, and the deployment's
        // end is written durably.
        let tx = self.conn.transaction_unflushed().map_err(e)?;
        lease::check_fences(&tx, &self.fences).map_err(e)?;
        let running: Vec<(i64, Option<String>)> = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT id, commit_id FROM deployment WHERE env = ?1 AND status = 'running'
                     ORDER BY id DESC",
                )
                .map_err(e)?;
            stmt.query_map([env], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(e)?
                .collect::<DbResult<_>>()
                .map_err(e)?
        };
        let mut resumed = None;
        for (i, (id, old_commit)) in running.iter().enumerate() {
            tx.prepare_cached(&format!(
                "UPDATE operation SET status = 'interrupted', finished_at = {NOW},
                        error = 'gitplane stopped during this operation; it is retried'
                 WHERE deployment_id = ?1 AND status = 'started'"
            ))
            .and_then(|mut s| s.execute([id]))
            .map_err(e)?;
            if i == 0 && old_commit.as_deref() == Some(commit) && !drift {
                resumed = Some(*id);
            } else {
                tx.prepare_cached(&format!(
                    "UPDATE deployment SET status = 'failed', finished_at = {NOW},
                            error = 'interrupted: gitplane stopped before it finished, and a \
                                     later deployment took over'
                     WHERE id = ?1"
                ))
                .and_then(|mut s| s.execute([id]))
                .map_err(e)?;
            }
        }
        let result = match resumed {
            Some(id) => (id, true),
            None => {
                let id = tx
                    .prepare_cached(&format!(
                        "INSERT INTO deployment
                           (env, commit_id, kind, status, started_at, deletion_threshold)
                         VALUES (?1, ?2, ?3, 'running', {NOW}, ?4) RETURNING id"
                    ))
                    .and_then(|mut s| {
                        s.insert(params![
                            env,
                            commit,
                            if drift { "drift" } else { "commit" },
                            threshold
                        ])
                    })
                    .map_err(e)?;
                // A drift run re-applies the commit already in force: a held newer one waits on.
                if !drift {
                    supersede_held(&tx, env, id, commit).map_err(e)?;
                }
                (id, false)
            }
        };
        tx.commit().map_err(e)?;
        Ok(result)
    }

    /// Records a deployment the deletion guard held: nothing was changed, and `deletions` are
    /// the resources it would have deleted.
    pub fn held_deployment(
        &self,
        env: &str,
        commit: &str,
        deletions: &[String],
        why: &str,
        threshold: f64,
    ) -> Result<i64> {
        let held = serde_json::to_string(deletions).expect("strings serialise");
        self.write(|tx| {
            let id = tx
                .prepare_cached(&format!(
                    "INSERT INTO deployment
                       (env, commit_id, status, started_at, finished_at, error, held,
                        deletion_threshold)
                     VALUES (?1, ?2, 'held', {NOW}, {NOW}, ?3, ?4, ?5) RETURNING id"
                ))?
                .insert(params![env, commit, why, held, threshold])?;
            supersede_held(tx, env, id, commit)?;
            Ok(id)
        })
    }

    /// Releases a held deployment so it runs: it becomes `running` again. Returns its
    /// environment and commit, or `None` when `id` is not a held deployment.
    ///
    /// Only the newest deployment of its environment can be released: one that a newer commit
    /// overtook is closed as superseded and refused with [`StateError::Superseded`], since
    /// applying it would put an old commit over a newer one.
    pub fn release_held(&self, id: i64) -> Result<Option<(String, String)>> {
        let row: Option<(String, Option<String>, String)> = self
            .conn
            .prepare_cached(
                "SELECT env, commit_id, status FROM deployment
                 WHERE id = ?1 AND status IN ('held', 'superseded')",
            )
            .and_then(|mut s| {
                s.query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(self.err())?;
        let Some((env, Some(commit), _)) = row else {
            return Ok(None);
        };
        let newer: Option<(i64, String)> = self
            .conn
            .prepare_cached(
                "SELECT id, commit_id FROM deployment
                 WHERE env = ?1 AND id > ?2 AND kind = 'commit' AND commit_id IS NOT NULL
                 ORDER BY id DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![env, id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(self.err())?;
        if let Some((newer, newer_commit)) = newer {
            // A state file from before superseding existed may still call it held.
            self.write(|tx| supersede_held(tx, &env, newer, &newer_commit))?;
            return Err(StateError::Superseded {
                path: self.path.clone(),
                deployment: id,
                newer,
                commit: newer_commit,
            });
        }
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE deployment SET status = 'running', finished_at = NULL, error = NULL,
                        started_at = {NOW}
                 WHERE id = ?1"
            ))?
            .execute([id])
        })?;
        Ok(Some((env, commit)))
    }

    /// Marks the recorded resources of `env` in `orphans` as kept though out of the graph, with
    /// why; clears the mark of every other resource of `env`, or of `scope` when given (an apply
    /// of some apps says nothing of the others).
    pub fn mark_orphans(
        &mut self,
        env: &str,
        orphans: &[(String, String)],
        scope: Option<&[&str]>,
    ) -> Result<()> {
        // A scope of no resources, with no orphan to mark, has nothing to change.
        if orphans.is_empty() && scope.is_some_and(<[&str]>::is_empty) {
            return Ok(());
        }
        let kept: Vec<&str> = orphans.iter().map(|(g, _)| g.as_str()).collect();
        let kept = serde_json::to_string(&kept).expect("strings serialise");
        let scope = scope.map(|s| serde_json::to_string(s).expect("strings serialise"));
        self.in_transaction(|tx| {
            tx.execute(
                "UPDATE resource SET orphan_since = NULL, orphan_reason = NULL
                 WHERE env = ?1 AND orphan_since IS NOT NULL
                   AND guresid NOT IN (SELECT value FROM json_each(?2))
                   AND (CAST(?3 AS TEXT) IS NULL OR guresid IN (SELECT value FROM json_each(?3)))",
                params![env, kept, scope],
            )?;
            let mut stmt = tx.prepare_cached(&format!(
                "UPDATE resource SET orphan_reason = ?2,
                        orphan_since = COALESCE(orphan_since, {NOW})
                 WHERE guresid = ?1"
            ))?;
            for (guresid, reason) in orphans {
                stmt.execute(params![guresid, reason])?;
            }
            Ok(())
        })
    }

    /// Records a commit the daemon saw on the watched ref, and what it did with it.
    pub fn commit_seen(&self, commit: &str, outcome: &str, detail: Option<&str>) -> Result<()> {
        // Several daemons share one database and see the same commits: the first records it.
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "INSERT INTO commit_seen (commit_id, seen_at, outcome, detail)
                 SELECT ?1, {NOW}, ?2, ?3
                 WHERE NOT EXISTS (SELECT 1 FROM commit_seen
                                   WHERE commit_id = ?1 AND outcome = ?2
                                     AND id = (SELECT MAX(id) FROM commit_seen))"
            ))?
            .execute(params![commit, outcome, detail])
        })?;
        Ok(())
    }

    /// The commit of the newest succeeded deployment of `env` (what a drift run re-applies).
    pub fn last_good_commit(&self, env: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached(
                "SELECT commit_id FROM deployment WHERE env = ?1 AND status = 'succeeded'
                   AND drift_mode IS NULL
                 ORDER BY id DESC LIMIT 1",
            )
            .and_then(|mut s| s.query_row([env], |r| r.get(0)).optional())
            .map_err(self.err())
    }

    /// Counts of the resources a deployment created, updated and deleted, from its operations
    /// (so a resumed deployment counts what it did before the interruption too).
    pub fn operation_counts(&self, deployment: i64) -> Result<Counts> {
        self.conn
            .prepare_cached(
                // One set of distinct (action, resource) pairs, not one per action: a first
                // apply of tens of thousands of resources counts them at the end.
                "SELECT COUNT(CASE WHEN action = 'create' THEN 1 END),
                        COUNT(CASE WHEN action = 'update' THEN 1 END),
                        COUNT(CASE WHEN action = 'delete' THEN 1 END)
                 FROM (SELECT DISTINCT action, guresid FROM operation
                       WHERE deployment_id = ?1 AND status = 'succeeded') AS pairs",
            )
            .and_then(|mut s| {
                s.query_row([deployment], |r| {
                    Ok(Counts {
                        created: r.get(0)?,
                        updated: r.get(1)?,
                        deleted: r.get(2)?,
                        ..Counts::default()
                    })
                })
            })
            .map_err(self.err())
    }

    /// Records the operations still running in the deployments of process `pid` of this host
    /// (the environments it holds the lock of; daemons elsewhere may share the state) as
    /// interrupted: it is stopping without waiting for them, and the next deployment of each
    /// environment resumes them. Returns how many.
    pub fn interrupt_own_operations(&self, pid: u32) -> Result<usize> {
        self.write(|tx| {
            tx.prepare_cached(&format!(
                "UPDATE operation SET status = 'interrupted', finished_at = {NOW},
                        error = 'gitplane stopped during this operation; it is retried'
                 WHERE status = 'started' AND deployment_id IN (
                   SELECT d.id FROM deployment d JOIN env_lock l ON l.env = d.env
                   WHERE d.status = 'running' AND l.pid = ?1 AND l.host = ?2)"
            ))?
            .execute(params![pid, lock::host_name()])
        })
    }

    /// The key id the state file's sealed secrets (and its key canary) carry, if it has any.
    fn sealed_with(&self) -> Result<Option<String>> {
        let sample: Option<String> = self
            .conn
            .query_row(
                "SELECT v FROM (
                   SELECT sealed AS v FROM key_canary WHERE sealed LIKE 'gp1:%'
                   UNION ALL
                   SELECT outputs FROM resource_secret WHERE outputs LIKE 'gp1:%'
                   UNION ALL
                   SELECT cookie FROM driver_cookie WHERE cookie LIKE 'gp1:%') AS sealed
                 LIMIT 1",
                params![],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())?;
        Ok(sample.and_then(|v| seal::sealed_with(&v).map(str::to_owned)))
    }

    /// Looks again at which key the state file's secrets are sealed with, and forgets the key
    /// in memory if another process rekeyed them since (the new one is read when next needed).
    /// Call it holding an environment's apply lock, before a deployment.
    pub fn refresh_key(&self) -> Result<()> {
        let sealed_with = self.sealed_with()?;
        let mut ring = self.keyring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.sealed_with != sealed_with {
            ring.forget_key(sealed_with);
        }
        Ok(())
    }

    /// The id of the state key, read now (finishing a rekey that stopped before it put its new
    /// key in place).
    pub fn key_id(&self) -> Result<String> {
        Ok(self.key()?.id)
    }

    fn key(&self) -> Result<StateKey> {
        self.keyring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .key()
            .map_err(|source| StateError::Seal {
                path: self.path.clone(),
                source,
            })
    }

    /// Where the state key comes from.
    pub fn key_source(&self) -> KeySource {
        self.keyring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .source()
            .clone()
    }

    /// Seals every secret again with `new`, the key canary too, in one transaction; from then
    /// on `new` is the key. The caller puts `new` where the key source reads it once this
    /// returns. Returns how many secret values were sealed again (the canary not counted).
    pub fn rekey(&mut self, new: &StateKey) -> Result<usize> {
        let old = self.key()?;
        let reseal = |value: String, aad: &str| -> DbResult<String> {
            let plain = if seal::sealed_with(&value).is_some() {
                old.open(&value, aad)?
            } else {
                value
            };
            Ok(new.seal(&plain, aad))
        };
        let resealed = self.in_transaction(|tx| {
            let mut count = 0;
            // (table, key column, sealed column, associated-data prefix)
            for (table, column, aad) in [
                ("resource_secret", "outputs", "resource_secret.outputs"),
                ("resource_secret", "inputs", "resource_secret.inputs"),
                ("driver_cookie", "cookie", "driver_cookie"),
                ("resource_manifest", "sealed", "resource_manifest.sealed"),
            ] {
                let rows: Vec<(String, String)> = tx
                    .prepare_cached(&format!(
                        "SELECT guresid, {column} FROM {table} WHERE {column} IS NOT NULL"
                    ))?
                    .query_map(params![], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<DbResult<_>>()?;
                let mut update = tx.prepare_cached(&format!(
                    "UPDATE {table} SET {column} = ?2 WHERE guresid = ?1"
                ))?;
                for (guresid, value) in rows {
                    let sealed = reseal(value, &format!("{aad}:{guresid}"))?;
                    update.execute(params![guresid, sealed])?;
                    count += 1;
                }
            }
            // The canary moves to the new key with the secrets, or a daemon with the new key
            // would be refused.
            trust::reseal_canary(tx, &old, new)?;
            Ok(count)
        })?;
        let mut ring = self.keyring.lock().unwrap_or_else(|e| e.into_inner());
        ring.set_key(new.clone());
        Ok(resealed)
    }

    /// The resources a deployment's operations created, updated or deleted so far.
    pub fn operated(&self, deployment: i64) -> Result<std::collections::HashSet<String>> {
        Ok(self
            .query(
                "SELECT DISTINCT guresid FROM operation
                 WHERE deployment_id = ?1 AND status = 'succeeded'
                   AND action IN ('create', 'update', 'delete')",
                [deployment],
                |r| r.get(0),
            )?
            .into_iter()
            .collect())
    }

    /// The driver cookie kept for `guresid`.
    pub fn cookie(&self, guresid: &str) -> Result<Option<String>> {
        let sealed: Option<String> = self
            .conn
            .query_row(
                "SELECT cookie FROM driver_cookie WHERE guresid = ?1",
                [guresid],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())?;
        self.open_sealed(sealed, &format!("driver_cookie:{guresid}"))
    }

    /// Whether the state keeps any driver cookie at all.
    pub fn keeps_cookies(&self) -> Result<bool> {
        self.conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM driver_cookie)")
            .and_then(|mut s| s.query_row(params![], |r| r.get(0)))
            .map_err(self.err())
    }

    /// The driver cookies of `guresids` that have one, opened: one query for a batch of
    /// resources about to be called, rather than one each.
    pub fn cookies(&self, guresids: &[&str]) -> Result<std::collections::HashMap<String, String>> {
        if guresids.is_empty() {
            return Ok(std::collections::HashMap::new());
        }
        let list = serde_json::to_string(guresids).expect("strings serialise");
        let sealed: Vec<(String, String)> = self.query(
            "SELECT guresid, cookie FROM driver_cookie
             WHERE guresid IN (SELECT value FROM json_each(?1))",
            [list],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        sealed
            .into_iter()
            .filter_map(|(guresid, cookie)| {
                let aad = format!("driver_cookie:{guresid}");
                self.open_sealed(Some(cookie), &aad)
                    .map(|opened| opened.map(|c| (guresid, c)))
                    .transpose()
            })
            .collect()
    }

    /// The operations of a deployment, in the order they were journalled.
    pub fn operations(&self, deployment: i64) -> Result<Vec<OperationRecord>> {
        self.query(
            "SELECT id, deployment_id, guresid, action, reason, status, error
                 FROM operation WHERE deployment_id = ?1 ORDER BY id",
            [deployment],
            |r| {
                Ok(OperationRecord {
                    id: r.get(0)?,
                    deployment: r.get(1)?,
                    guresid: r.get(2)?,
                    action: r.get(3)?,
                    reason: r.get(4)?,
                    status: r.get(5)?,
                    error: r.get(6)?,
                })
            },
        )
    }

    /// The newest deployment of `env`, if any.
    pub fn latest_deployment(&self, env: &str) -> Result<Option<DeploymentRecord>> {
        let id: Option<i64> = self
            .conn
            // A detect run looked and changed nothing: the environment is as the one before.
            .prepare_cached("SELECT MAX(id) FROM deployment WHERE env = ?1 AND drift_mode IS NULL")
            .and_then(|mut s| s.query_row([env], |r| r.get(0)).optional())
            .map_err(self.err())?
            .flatten();
        match id {
            Some(id) => Ok(self
                .deployments(Some(env))?
                .into_iter()
                .find(|d| d.id == id)),
            None => Ok(None),
        }
    }

    /// The condition `env` was in before deployment `before`: the status of its newest
    /// deployment of a commit before that one that finished applying (`succeeded` or
    /// `failed`; held, superseded and running ones and drift runs say nothing about it), with
    /// its error. `None` before any.
    pub fn condition_before(
        &self,
        env: &str,
        before: i64,
    ) -> Result<Option<(DeploymentStatus, Option<String>)>> {
        self.finished_before(env, before, "commit")
    }

    /// Like [`Store::condition_before`] for drift run `before`: how the drift run before it
    /// that corrected (not a detect-only one) ended, so that a drift run failing the same way
    /// every few minutes is news once.
    pub fn drift_condition_before(
        &self,
        env: &str,
        before: i64,
    ) -> Result<Option<(DeploymentStatus, Option<String>)>> {
        self.finished_before(env, before, "drift")
    }

    fn finished_before(
        &self,
        env: &str,
        before: i64,
        kind: &str,
    ) -> Result<Option<(DeploymentStatus, Option<String>)>> {
        let found: Option<(String, Option<String>)> = self
            .conn
            .prepare_cached(
                "SELECT status, error FROM deployment
                 WHERE env = ?1 AND id < ?2 AND status IN ('succeeded', 'failed')
                   AND kind = ?3 AND drift_mode IS NULL
                 ORDER BY id DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![env, before, kind], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(self.err())?;
        Ok(found.and_then(|(status, error)| Some((DeploymentStatus::parse(&status)?, error))))
    }

    /// Records that deployment `id` was attempt `attempt` at its commit (a retry by the daemon
    /// of one that did not finish).
    pub fn mark_attempt(&self, id: i64, attempt: i64) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached("UPDATE deployment SET attempt = ?2 WHERE id = ?1")?
                .execute(params![id, attempt])?;
            Ok(())
        })
    }

    /// A report: the rows of one of the public views of `schema.sql`, as SQLite gave them, in
    /// the view's order; of the environments in `filter.envs` when any are named.
    ///
    /// [`ReportView::Consumers`] lists the consumers of `filter.provider` (all of them when
    /// `None`) with each consumer's type and id from `current_resources`, by depth then id.
    pub fn report(&self, view: ReportView, filter: &ReportFilter<'_>) -> Result<Report> {
        // A JSON array of the environments, or NULL for all of them.
        let envs =
            (!filter.envs.is_empty()).then(|| serde_json::to_string(filter.envs).expect("strings"));
        const ENVS: &str = "(CAST(?1 AS TEXT) IS NULL OR env IN (SELECT value FROM json_each(?1)))";
        match view {
            ReportView::Consumers => self.report_rows(
                view,
                "SELECT c.env, c.provider, c.consumer, r.type AS consumer_type,
                        r.res_id AS consumer_id, c.depth
                 FROM consumers c LEFT JOIN current_resources r ON r.guresid = c.consumer
                 WHERE (CAST(?1 AS TEXT) IS NULL OR c.env IN (SELECT value FROM json_each(?1)))
                   AND (CAST(?2 AS TEXT) IS NULL OR c.provider = ?2)
                 ORDER BY c.env, c.depth, r.res_id, c.consumer",
                params![envs, filter.provider],
            ),
            // The view's name comes from the fixed list of `ReportView`, never from input.
            _ => self.report_rows(
                view,
                &format!("SELECT * FROM {} WHERE {ENVS}", view.view()),
                params![envs],
            ),
        }
    }

    fn report_rows<P: Params>(&self, view: ReportView, sql: &str, params: P) -> Result<Report> {
        let table = self.conn.table(sql, params).map_err(self.err())?;
        let columns = table.columns;
        let json = columns
            .iter()
            .map(|c| view.json_columns().contains(&c.as_str()))
            .collect();
        let rows = table
            .rows
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|cell| match cell {
                        db::Cell::Null => ReportCell::Null,
                        db::Cell::Int(v) => ReportCell::Integer(v),
                        db::Cell::Real(v) => ReportCell::Real(v),
                        db::Cell::Text(t) => ReportCell::Text(t),
                        db::Cell::Blob(t) => {
                            ReportCell::Text(String::from_utf8_lossy(&t).into_owned())
                        }
                    })
                    .collect()
            })
            .collect();
        Ok(Report {
            columns,
            json,
            rows,
        })
    }

    /// Every operation on `guresid` across deployments, newest first.
    pub fn resource_operations(&self, guresid: &str) -> Result<Vec<ResourceOperation>> {
        self.query(
            "SELECT o.id, o.deployment_id, o.guresid, o.action, o.reason, o.status, o.error,
                    d.env, d.commit_id, d.kind, o.attempts, o.started_at, o.finished_at
             FROM operation o JOIN deployment d ON d.id = o.deployment_id
             WHERE o.guresid = ?1 ORDER BY o.id DESC",
            [guresid],
            |r| {
                Ok(ResourceOperation {
                    operation: OperationRecord {
                        id: r.get(0)?,
                        deployment: r.get(1)?,
                        guresid: r.get(2)?,
                        action: r.get(3)?,
                        reason: r.get(4)?,
                        status: r.get(5)?,
                        error: r.get(6)?,
                    },
                    env: r.get(7)?,
                    commit_id: r.get(8)?,
                    kind: r.get(9)?,
                    attempts: r.get(10)?,
                    started_at: r.get(11)?,
                    finished_at: r.get(12)?,
                })
            },
        )
    }
}

/// The reports of `gitplane report`, each one of the public views of `schema.sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportView {
    Resources,
    Deployments,
    Failures,
    Links,
    Consumers,
    Orphans,
    Drift,
    /// What the newest detect-only drift run of each environment found.
    DriftDetected,
}

impl ReportView {
    /// The view it reads.
    pub fn view(self) -> &'static str {
        match self {
            ReportView::Resources => "current_resources",
            ReportView::Deployments => "deployments",
            ReportView::Failures => "failures",
            ReportView::Links => "links",
            ReportView::Consumers => "consumers",
            ReportView::Orphans => "orphans",
            ReportView::Drift => "drift",
            ReportView::DriftDetected => "drift_detected",
        }
    }

    /// Its TEXT columns that hold JSON.
    fn json_columns(self) -> &'static [&'static str] {
        match self {
            ReportView::Resources => &["outputs"],
            ReportView::Deployments => &["held"],
            ReportView::Links => &["value"],
            _ => &[],
        }
    }
}

/// Which rows of a report.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReportFilter<'a> {
    /// Only these environments; every one when empty.
    pub envs: &'a [String],
    /// For [`ReportView::Consumers`]: only the consumers of this GUResID.
    pub provider: Option<&'a str>,
}

/// One value of a report, with its SQLite type.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportCell {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
}

/// The rows of a report.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The view's column names, in order.
    pub columns: Vec<String>,
    /// For each column, whether its text is JSON (`outputs`, `held`, a binding's `value`).
    pub json: Vec<bool>,
    pub rows: Vec<Vec<ReportCell>>,
}

fn configure(conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // The default page cache (2 MB) spills to the log in the middle of a transaction once
    // an apply writes tens of thousands of rows; pages are allocated only as they are used.
    conn.pragma_update(None, "cache_size", -32_768)?;
    // Each checkpoint syncs the file; an apply that writes 100 MB would make a hundred of
    // them at the default (1 000 pages, 4 MB of log).
    conn.pragma_update_and_check(None, "wal_autocheckpoint", 8_192, |r| r.get::<_, i64>(0))?;
    conn.busy_timeout(Duration::from_secs(10))?;
    // A rotated secret's old (sealed) value leaves no trace in the file's free pages.
    conn.pragma_update(None, "secure_delete", true)?;
    Ok(())
}

fn migrate(conn: &mut rusqlite::Connection, path: &Path) -> Result<()> {
    let e = |source| state_error(path, source);
    let migrations = migrations();
    let known = migrations.len() as i64;
    let current: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(e)?;
    if current > known {
        return Err(StateError::TooNew {
            path: path.to_owned(),
            found: current,
            known,
        });
    }
    if current == 0 {
        // Only a file with no tables yet can choose this without a rebuild: space that
        // pruning frees can then go back to the file system a little at a time.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(e)?;
    }
    if current == known {
        return Ok(());
    }
    // A migration that rebuilds a table others refer to must run with foreign keys off
    // (SQLite's documented procedure); each checks them itself before it commits. The
    // pragma is a no-op inside a transaction, so it is set around them.
    conn.pragma_update(None, "foreign_keys", false).map_err(e)?;
    // Renaming a rebuilt table back to its name must leave the views that read it alone:
    // the modern rename checks every view while the old name is still missing.
    conn.pragma_update(None, "legacy_alter_table", true)
        .map_err(e)?;
    for (i, sql) in migrations.iter().enumerate().skip(current as usize) {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(e)?;
        tx.execute_batch(sql).map_err(e)?;
        let broken: Option<String> = tx
            .query_row("PRAGMA foreign_key_check", [], |r| r.get(0))
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .map_err(e)?;
        if let Some(table) = broken {
            return Err(StateError::Damaged {
                path: path.to_owned(),
                table: table.clone(),
                row: String::new(),
                reason: format!(
                    "migration {} left a row of {table} that refers to a missing one",
                    i + 1
                ),
            });
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(e)?;
        tx.commit().map_err(e)?;
    }
    conn.pragma_update(None, "legacy_alter_table", false)
        .map_err(e)?;
    conn.pragma_update(None, "foreign_keys", true).map_err(e)?;
    Ok(())
}

/// Where the PostgreSQL state at `url` is, with the password from a secret store if one was
/// set.
fn pg_target(url: &str) -> Result<postgres::PgTarget> {
    postgres::PgTarget::parse(url, postgres_password().as_deref()).map_err(|reason| {
        StateError::Url {
            url: postgres::shown_url(url),
            reason,
        }
    })
}

/// A plain connection to the state at `path` (already created and migrated by a [`Store`]),
/// for the apply lock's own use.
pub(crate) fn connect(path: &Path) -> Result<Conn> {
    if let Some(url) = path.to_str().filter(|s| postgres::is_postgres_url(s)) {
        let target = pg_target(url)?;
        let shown = PathBuf::from(target.shown());
        let conn = postgres::PgConn::open(&target).map_err(|e| state_error(&shown, e))?;
        return Ok(Conn::Pg(conn));
    }
    let e = |source| state_error(path, source);
    let conn = rusqlite::Connection::open(real_file(path)?).map_err(e)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(e)?;
    // As the store's own connection: in WAL mode a commit need not wait for the disk.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(e)?;
    Ok(Conn::Lite(conn))
}

/// Creates the schema in an empty PostgreSQL database, or brings an older one up to date.
/// Daemons starting together serialise on an advisory lock, so one creates it and the others
/// find it made.
fn migrate_postgres(conn: &postgres::PgConn, path: &Path, fresh: &dyn Fn()) -> Result<()> {
    let e = |source| state_error(path, source);
    let migrations = migrations();
    let blocks: Vec<&str> = migrations.iter().map(String::as_str).collect();
    let known = blocks.len() as i64;
    let version = || -> DbResult<i64> {
        Ok(conn
            .query("SELECT COALESCE(MAX(version), 0) FROM gitplane_schema", &[])?
            .first()
            .and_then(|row| row.first())
            .map(|c| i64::from_cell(c.as_ref()).unwrap_or(0))
            .unwrap_or(0))
    };
    // A schema already up to date, as at nearly every open, is seen without the advisory
    // lock: one statement, where migrating takes the lock and looks again under it. On an
    // empty database the table is missing and the read fails: migrate.
    if let Ok(current) = version() {
        if current == known {
            return Ok(());
        }
        if current > known {
            return Err(StateError::TooNew {
                path: path.to_owned(),
                found: current,
                known,
            });
        }
    }
    conn.batch(
        "SELECT pg_advisory_lock(7421356);
         CREATE TABLE IF NOT EXISTS gitplane_schema (version BIGINT NOT NULL)",
    )
    .map_err(e)?;
    let result = (|| {
        let current = version().map_err(e)?;
        if current > known {
            return Err(StateError::TooNew {
                path: path.to_owned(),
                found: current,
                known,
            });
        }
        if current == known {
            return Ok(());
        }
        let statements = if current == 0 {
            fresh();
            let schema = dialect::postgres_schema(&blocks, blocks.len()).map_err(|reason| {
                StateError::Damaged {
                    path: path.to_owned(),
                    table: "schema.sql".into(),
                    row: String::new(),
                    reason: reason.to_string(),
                }
            })?;
            // One message for them all: a new schema is about a hundred statements, and a
            // round trip each was a tenth of a first apply of 1 000 resources. Each `;` on a
            // line of its own, so a statement's last line may be a comment.
            vec![schema.join("\n;\n")]
        } else {
            // The functions first: a new migration's views may use one added since.
            std::iter::once(dialect::compat_functions().to_owned())
                .chain(
                    blocks[current as usize..]
                        .iter()
                        .filter(|b| !sqlite_only(b))
                        .map(|b| dialect::postgres_query(b)),
                )
                .collect()
        };
        conn.begin().map_err(e)?;
        for statement in &statements {
            if let Err(err) = conn.batch(statement) {
                conn.rollback();
                return Err(e(err));
            }
        }
        conn.batch(&format!(
            "DELETE FROM gitplane_schema; INSERT INTO gitplane_schema (version) VALUES ({known})"
        ))
        .map_err(e)?;
        conn.commit().map_err(e)
    })();
    let _ = conn.batch("SELECT pg_advisory_unlock(7421356)");
    result
}

/// The password for PostgreSQL states, when it comes from a secret store (set once, before
/// the state is opened); `None`: `PGPASSWORD` or the URL.
static POSTGRES_PASSWORD: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Sets the password PostgreSQL states are opened with (read from a secret store by the
/// caller), ahead of `PGPASSWORD`.
pub fn set_postgres_password(password: Option<String>) {
    *POSTGRES_PASSWORD.write().unwrap_or_else(|e| e.into_inner()) = password;
}

fn postgres_password() -> Option<String> {
    POSTGRES_PASSWORD
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Seals `plain` with the keyring's key, bound to `aad`.
pub(crate) fn seal_with(ring: &seal::SharedKeyring, plain: &str, aad: &str) -> DbResult<String> {
    let key = ring.lock().unwrap_or_else(|e| e.into_inner()).key()?;
    Ok(key.seal(plain, aad))
}

/// Opens a value sealed with the keyring's key (a value never sealed opens as itself).
pub(crate) fn open_with(
    ring: &seal::SharedKeyring,
    sealed: Option<String>,
    aad: &str,
) -> DbResult<Option<String>> {
    match sealed {
        Some(v) if seal::sealed_with(&v).is_some() => {
            let key = ring.lock().unwrap_or_else(|e| e.into_inner()).key()?;
            Ok(Some(key.open(&v, aad)?))
        }
        other => Ok(other),
    }
}

/// The one name the state file is opened by: its canonical path, so that SQLite's log and
/// shared-memory files (named after it) are the same whatever symlink or relative path led to
/// it. A file with several hard links is refused: each name would get its own log, and two
/// processes writing through two names would damage it.
fn real_file(path: &Path) -> Result<PathBuf> {
    let unusable = |source| StateError::Create {
        path: path.to_owned(),
        source,
    };
    let real = std::fs::canonicalize(path).map_err(unusable)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let links = std::fs::metadata(&real).map_err(unusable)?.nlink();
        if links > 1 {
            return Err(StateError::HardLinked {
                path: path.to_owned(),
                links,
            });
        }
    }
    Ok(real)
}

/// Closes the held deployments of `env` older than deployment `newer` (of `commit`) as
/// superseded: what they would have applied is no longer what the environment should run.
fn supersede_held(tx: &Tx<'_>, env: &str, newer: i64, commit: &str) -> DbResult<usize> {
    tx.prepare_cached(
        "UPDATE deployment SET status = 'superseded',
                error = 'superseded by deployment ' || CAST(?2 AS TEXT) || ' (commit ' || substr(?3, 1, 12) || ') before it \
                         was approved'
         WHERE env = ?1 AND status = 'held' AND id < ?2",
    )?
    .execute(params![env, newer, commit])
}

/// The migrations of `schema.sql`: the lines after each `-- migration N` marker.
/// Whether migration `block` changes only how SQLite stores what PostgreSQL stores as it is
/// (its first line says `-- sqlite only`): an existing PostgreSQL state skips it, and a new
/// one is made with its result.
fn sqlite_only(block: &str) -> bool {
    block
        .lines()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| l.trim() == "-- sqlite only")
}

fn migrations() -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in SCHEMA.lines() {
        if line.starts_with("-- migration ") {
            out.extend(current.replace(String::new()));
        } else if let Some(body) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out.extend(current);
    out
}

#[cfg(unix)]
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map(drop)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map(drop)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Shorthands for one journal entry each, in its own transaction: what the reconciler
    /// writes in batches.
    impl Store {
        pub(crate) fn begin_operation(&mut self, op: &OperationStart<'_>) -> Result<i64> {
            Ok(self.begin_operations(std::slice::from_ref(op))?[0])
        }

        pub(crate) fn finish_put(
            &mut self,
            operation: i64,
            attempts: i64,
            deployment: i64,
            record: &ResourceRecord,
            outputs_changed: Option<bool>,
        ) -> Result<()> {
            self.journal(&[JournalEntry::Put {
                operation,
                attempts,
                deployment,
                record,
                outputs_changed,
                new: false,
                manifests: None,
                sealed: None,
            }])
        }

        pub(crate) fn finish_delete(
            &mut self,
            operation: i64,
            attempts: i64,
            deployment: i64,
            (env, guresid): (&str, &str),
            error: Option<&str>,
        ) -> Result<()> {
            self.journal(&[JournalEntry::Delete {
                operation,
                attempts,
                deployment,
                env,
                guresid,
                error,
            }])
        }

        pub(crate) fn record_call(
            &mut self,
            operation: i64,
            attempts: i64,
            guresid: &str,
            cookie: Option<Option<&str>>,
        ) -> Result<()> {
            self.journal(&[JournalEntry::Call {
                operation,
                attempts,
                guresid,
                cookie,
            }])
        }
    }

    /// Runs `test` on a SQLite store, then on a PostgreSQL one (a fresh database on this test
    /// process's own server), or says why PostgreSQL cannot run here.
    pub(crate) fn each_backend(test: impl Fn(Store)) {
        let dir = tempfile::tempdir().unwrap();
        test(Store::open(&dir.path().join("state.db")).unwrap());
        if let Some(pg) = gitplane_testkit::shared_or_skip("the PostgreSQL half") {
            let key = KeySource::File(dir.path().join("pg.key"));
            test(Store::open_keyed(Path::new(&pg.database()), Some(&key)).unwrap());
        }
    }

    /// A create of `shared.db`, a postgres of app `shop` in `development`.
    pub(crate) fn start(deployment: i64) -> OperationStart<'static> {
        OperationStart {
            deployment,
            guresid: "g1",
            app: Some("shop"),
            res_type: "postgres",
            class: "default",
            res_id: "shared.db",
            action: "create",
            reason: "new",
        }
    }

    pub(crate) fn record(guresid: &str) -> ResourceRecord {
        ResourceRecord {
            guresid: guresid.into(),
            env: "development".into(),
            app: Some("shop".into()),
            res_type: "postgres".into(),
            class: "default".into(),
            res_id: "shared.db".into(),
            definition: "pg".into(),
            driver: "echo".into(),
            account: None,
            deletion_policy: DeletionPolicy::Delete,
            template_hash: String::new(),
            status: ResourceStatus::Ready,
            inputs_hash: "h1".into(),
            outputs: serde_json::json!({"host": "db"}),
            secret_outputs: serde_json::json!({"password": "s3cret"}),
            inputs: serde_json::json!({"values": {"host": "db"}}).into(),
            secret_inputs: serde_json::json!({"password": "s3cret"}).into(),
            error: None,
            commit_id: "c1".into(),
        }
    }

    #[test]
    fn migrations_split_schema_sql() {
        let m = migrations();
        assert_eq!(m.len(), 14);
        assert!(m[0].contains("CREATE TABLE deployment"));
        assert!(m[0].contains("CREATE VIEW failures"));
        assert!(m[1].contains("CREATE TABLE resource_version"));
        assert!(m[3].contains("CREATE TABLE env_lock"));
        assert!(m[4].contains("gp_seal"));
        assert!(m[5].contains("CREATE TABLE resource_manifest"));
        assert!(m[10].contains("CREATE TABLE reconcile_request"));
        assert!(m[11].contains("CREATE INDEX resource_failed"));
        assert!(m[12].contains("CREATE TABLE app_census"));
        assert!(m[13].contains("CREATE TABLE operation_v14"));
        assert!(sqlite_only(&m[13]));
        assert!(!m[..13].iter().any(|b| sqlite_only(b)));
    }

    #[test]
    fn open_is_idempotent_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.db");
        drop(Store::open(&path).unwrap());
        let store = Store::open(&path).unwrap();
        let version: i64 = store
            .conn
            .lite()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, migrations().len() as i64);
        let mode: String = store
            .conn
            .lite()
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let perms = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(perms, 0o600);
        }
    }

    #[test]
    fn one_apply_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.db");
        let _store = Store::open(&state).unwrap();
        let held = ApplyLock::acquire(&state, "dev", false).unwrap();
        assert!(matches!(
            ApplyLock::acquire(&state, "dev", false),
            Err(StateError::Busy { .. })
        ));
        // Another environment is independent.
        let _other = ApplyLock::acquire(&state, "prod", false).unwrap();
        drop(held);
        ApplyLock::acquire(&state, "dev", true).unwrap();
    }

    #[test]
    fn a_lock_whose_holder_is_gone_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.db");
        let store = Store::open(&state).unwrap();
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        // A process of this host that has ended (a child that was reaped), and a holder on
        // another host that stopped renewing a minute ago.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        store
            .conn
            .execute_batch(&format!(
                "INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at) VALUES ('dev', 'x', {dead}, '{host}', {NOW}, {NOW});
                 INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at) VALUES ('prod', 'y', 1, 'elsewhere',
                   strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds'),
                   strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds'));
                 INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at) VALUES ('test', 'z', 1, 'elsewhere', {NOW}, {NOW});"
            ))
            .unwrap();
        let _dev = ApplyLock::acquire(&state, "dev", false).unwrap();
        let _prod = ApplyLock::acquire(&state, "prod", false).unwrap();
        // A holder elsewhere that renews its lock keeps it.
        let busy = ApplyLock::acquire(&state, "test", false).unwrap_err();
        assert!(
            busy.to_string().contains(
                "another gitplane (process 1 on elsewhere) is applying to environment test"
            ),
            "{busy}"
        );
        let holders: Vec<i64> = store
            .query(
                "SELECT pid FROM env_lock WHERE env IN ('dev', 'prod')",
                params![],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(holders, [std::process::id() as i64; 2]);
    }

    #[test]
    fn a_damaged_row_is_an_error_naming_its_table_and_row() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.db");
        let store = Store::open(&state).unwrap();
        store
            .conn
            .execute_batch(&format!(
                "INSERT INTO deployment (id, env, commit_id, status, started_at, held)
                 VALUES (7, 'dev', 'c', 'held', {NOW}, '[oops')"
            ))
            .unwrap();
        let e = store.deployments(None).unwrap_err().to_string();
        assert!(
            e.contains("table deployment, row 7: column held is not a JSON list"),
            "{e}"
        );
        // SQLite checks statuses itself; a file edited with the checks off can still hold one.
        store
            .conn
            .execute_batch(
                "PRAGMA ignore_check_constraints = ON;
             UPDATE deployment SET held = NULL, status = 'exploded' WHERE id = 7;",
            )
            .unwrap();
        let e = store.deployments(None).unwrap_err().to_string();
        assert!(
            e.contains("table deployment, row 7: status 'exploded' is not one gitplane writes"),
            "{e}"
        );
    }

    #[test]
    fn an_interrupted_deployment_is_resumed_for_the_same_commit_only() {
        crate::tests::each_backend(|mut store| {
            let (first, resumed) = store
                .begin_or_resume_deployment("dev", "c1", false, 50.0)
                .unwrap();
            assert!(!resumed);
            let op = OperationStart {
                deployment: first,
                guresid: "g1",
                app: None,
                res_type: "t",
                class: "default",
                res_id: "r",
                action: "create",
                reason: "new",
            };
            let op_id = store.begin_operation(&op).unwrap();
            store
                .record_call(op_id, 1, "g1", Some(Some("c=1")))
                .unwrap();
            // gitplane is killed here; the next apply of the same commit picks the deployment up.
            assert_eq!(
                store
                    .begin_or_resume_deployment("dev", "c1", false, 50.0)
                    .unwrap(),
                (first, true)
            );
            assert_eq!(store.operations(first).unwrap()[0].status, "interrupted");
            assert_eq!(store.cookie("g1").unwrap().as_deref(), Some("c=1"));
            // A different commit closes it as failed and starts anew.
            let (second, resumed) = store
                .begin_or_resume_deployment("dev", "c2", false, 50.0)
                .unwrap();
            assert!(!resumed && second != first);
            let old = store
                .deployments(Some("dev"))
                .unwrap()
                .into_iter()
                .find(|d| d.id == first)
                .unwrap();
            assert_eq!(old.status, DeploymentStatus::Failed);
            assert!(old.error.unwrap().starts_with("interrupted"));
            store.record_call(op_id, 2, "g1", Some(None)).unwrap();
            assert_eq!(store.cookie("g1").unwrap(), None);
        });
    }

    #[test]
    fn a_resource_without_secrets_has_no_secret_row_and_reads_back_the_same() {
        crate::tests::each_backend(|mut store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let start = start(dep);
            let secret_rows = |store: &Store| -> i64 {
                store
                    .conn
                    .query_row("SELECT COUNT(*) FROM resource_secret", params![], |r| {
                        r.get(0)
                    })
                    .unwrap()
            };
            let plain = ResourceRecord {
                secret_outputs: serde_json::json!({}),
                secret_inputs: StoredJson::from_text(journal::NO_SECRET_INPUTS.to_owned()),
                ..record("g1")
            };
            // With secrets, a row; then without, none; the record reads back unchanged each time.
            for (rec, rows) in [
                (record("g1"), 1),
                (plain.clone(), 0),
                (record("g1"), 1),
                (plain, 0),
            ] {
                let op = store.begin_operation(&start).unwrap();
                store.finish_put(op, 1, dep, &rec, Some(true)).unwrap();
                assert_eq!(secret_rows(&store), rows);
                assert_eq!(store.resources("development").unwrap(), vec![rec]);
            }
        });
    }

    #[test]
    fn cookies_of_a_batch_are_read_in_one_query_and_opened() {
        crate::tests::each_backend(|mut store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let op = store.begin_operation(&start(dep)).unwrap();
            store.record_call(op, 1, "g1", Some(Some("job-1"))).unwrap();
            store.record_call(op, 2, "g2", Some(Some("job-2"))).unwrap();
            store.record_call(op, 3, "g2", Some(None)).unwrap();
            store.record_call(op, 4, "g3", Some(Some("job-3"))).unwrap();
            let sealed: String = store
                .conn
                .query_row(
                    "SELECT cookie FROM driver_cookie WHERE guresid = 'g1'",
                    params![],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(!sealed.contains("job-1"), "cookies are kept sealed");
            let got = store.cookies(&["g1", "g2", "g3", "g4"]).unwrap();
            let want: std::collections::HashMap<String, String> =
                [("g1", "job-1"), ("g3", "job-3")]
                    .map(|(g, c)| (g.to_owned(), c.to_owned()))
                    .into();
            assert_eq!(got, want);
            for g in ["g1", "g2", "g3", "g4"] {
                assert_eq!(store.cookie(g).unwrap().as_ref(), want.get(g), "{g}");
            }
            assert!(store.cookies(&[]).unwrap().is_empty());
        });
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).unwrap();
        store
            .conn
            .lite()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        drop(store);
        assert!(matches!(
            Store::open(&path),
            Err(StateError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn a_resource_is_found_by_guresid_or_label_in_the_environments_asked() {
        crate::tests::each_backend(|mut store| {
            let put = |store: &mut Store, rec: ResourceRecord| {
                let dep = store.begin_deployment(&rec.env, "c1").unwrap();
                let op = store
                    .begin_operation(&OperationStart {
                        guresid: &rec.guresid,
                        app: rec.app.as_deref(),
                        res_type: &rec.res_type,
                        res_id: &rec.res_id,
                        ..start(dep)
                    })
                    .unwrap();
                store.finish_put(op, 1, dep, &rec, Some(true)).unwrap();
            };
            put(&mut store, record("find-dev"));
            put(
                &mut store,
                ResourceRecord {
                    env: "find-prod".into(),
                    ..record("find-prod")
                },
            );
            put(
                &mut store,
                ResourceRecord {
                    app: None,
                    res_type: "dns".into(),
                    res_id: "base".into(),
                    ..record("find-global")
                },
            );
            let label = "shop/postgres.default#shared.db";
            let pair = |g: &str, e: &str| (g.to_owned(), e.to_owned());
            assert_eq!(
                store.find_resources(&[], "find-prod").unwrap(),
                [pair("find-prod", "find-prod")]
            );
            let mut both = store.find_resources(&[], label).unwrap();
            both.retain(|(g, _)| g.starts_with("find-"));
            assert_eq!(
                both,
                [
                    pair("find-dev", "development"),
                    pair("find-prod", "find-prod")
                ]
            );
            assert_eq!(
                store
                    .find_resources(&["find-prod".to_owned()], label)
                    .unwrap(),
                [pair("find-prod", "find-prod")]
            );
            let global = store
                .find_resources(&["development".to_owned()], "-/dns.default#base")
                .unwrap();
            assert_eq!(global, [pair("find-global", "development")]);
            assert!(
                store
                    .find_resources(&[], "shop/postgres.default")
                    .unwrap()
                    .is_empty()
            );
        });
    }

    #[test]
    fn put_and_delete_round_trip_with_journal() {
        crate::tests::each_backend(|mut store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let start = start(dep);
            let op = store.begin_operation(&start).unwrap();
            assert_eq!(store.operations(dep).unwrap()[0].status, "started");
            store
                .finish_put(op, 1, dep, &record("g1"), Some(true))
                .unwrap();
            let got = store.resources("development").unwrap();
            assert_eq!(got, vec![record("g1")]);
            assert_eq!(store.operations(dep).unwrap()[0].status, "succeeded");

            let del = store
                .begin_operation(&OperationStart {
                    action: "delete",
                    ..start
                })
                .unwrap();
            store
                .finish_delete(del, 1, dep, ("development", "g1"), None)
                .unwrap();
            assert!(store.resources("development").unwrap().is_empty());
            let secrets: i64 = store
                .conn
                .query_row("SELECT COUNT(*) FROM resource_secret", params![], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(secrets, 0, "secrets go with their resource");
            store
                .finish_deployment(
                    dep,
                    DeploymentStatus::Succeeded,
                    &Counts {
                        created: 1,
                        deleted: 1,
                        ..Counts::default()
                    },
                    None,
                )
                .unwrap();
            let d = store.latest_deployment("development").unwrap().unwrap();
            assert_eq!(d.status, DeploymentStatus::Succeeded);
            assert_eq!(d.counts.created, 1);
            assert!(d.finished_at.is_some());
        });
    }

    #[test]
    fn the_condition_before_is_the_previous_finished_deployment_of_a_commit() {
        crate::tests::each_backend(|store| {
            let first = store.begin_deployment("development", "c1").unwrap();
            assert_eq!(store.condition_before("development", first).unwrap(), None);
            store
                .finish_deployment(first, DeploymentStatus::Succeeded, &Counts::default(), None)
                .unwrap();
            let broken = store
                .failed_deployment("development", Some("c2"), "quota exceeded")
                .unwrap();
            assert_eq!(
                store.condition_before("development", broken).unwrap(),
                Some((DeploymentStatus::Succeeded, None))
            );
            // Held, running, drift runs and other environments are not the condition.
            store
                .held_deployment("development", "c3", &["g1".to_owned()], "guard", 0.5)
                .unwrap();
            store.begin_deployment("production", "c3").unwrap();
            let drift = store.begin_deployment("development", "c1").unwrap();
            store
                .conn
                .execute(
                    "UPDATE deployment SET kind = 'drift' WHERE id = ?1",
                    params![drift],
                )
                .unwrap();
            store
                .finish_deployment(drift, DeploymentStatus::Succeeded, &Counts::default(), None)
                .unwrap();
            let next = store.begin_deployment("development", "c4").unwrap();
            assert_eq!(
                store.condition_before("development", next).unwrap(),
                Some((DeploymentStatus::Failed, Some("quota exceeded".to_owned())))
            );
            assert_eq!(
                store.condition_before("development", first).unwrap(),
                None,
                "only deployments before the one asked about"
            );
            // A drift run's condition is the drift run's before it.
            assert_eq!(
                store.drift_condition_before("development", next).unwrap(),
                Some((DeploymentStatus::Succeeded, None))
            );
            assert_eq!(
                store.drift_condition_before("development", drift).unwrap(),
                None
            );
        });
    }
}

#[cfg(test)]
mod history_tests;
