//! The PostgreSQL connection: a thread of its own drives tokio-postgres, so the store's
//! blocking interface works the same from plain threads and from inside the daemon's runtime.
//!
//! Every call waits a bounded time (a server that stops answering fails the call, it never hangs
//! gitplane), and a connection that broke is made again by the next call outside a transaction:
//! a database restart costs the calls made while it was down, nothing more.

use std::collections::{HashMap, HashSet, VecDeque};
use std::error::Error as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, NoTls, Statement};

use crate::db::{Arg, Array, ArrayKind, Cell, DbError, DbResult, Table};
use crate::dialect;

/// How long one call may take before it fails.
const CALL_LIMIT: Duration = Duration::from_secs(60);
/// How long connecting may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// Where a PostgreSQL state lives: the connection settings, and the URL without its password
/// for messages.
#[derive(Clone)]
pub struct PgTarget {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) shown: String,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// Whether `state` names a PostgreSQL database rather than a SQLite file.
pub fn is_postgres_url(state: &str) -> bool {
    state.starts_with("postgres://") || state.starts_with("postgresql://")
}

impl PgTarget {
    /// Reads `url` (`postgres://user@host:port/db?...`); what it leaves out comes from the
    /// standard `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE` and `PGPASSWORD` variables, and the
    /// password from `password` (a secret store) before `PGPASSWORD`.
    pub fn parse(url: &str, password: Option<&str>) -> Result<PgTarget, String> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            format!("not a PostgreSQL URL (postgres://user@host:port/database): {e}")
        })?;
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if config.get_hosts().is_empty() {
            config.host(env("PGHOST").as_deref().unwrap_or("localhost"));
        }
        if config.get_ports().is_empty()
            && let Some(port) = env("PGPORT")
        {
            config.port(
                port.parse()
                    .map_err(|_| format!("PGPORT={port} is not a port number"))?,
            );
        }
        if config.get_user().is_none() {
            let user = env("PGUSER")
                .or_else(|| env("USER"))
                .unwrap_or_else(|| "postgres".into());
            config.user(&user);
        }
        if config.get_dbname().is_none()
            && let Some(db) = env("PGDATABASE")
        {
            config.dbname(&db);
        }
        if config.get_password().is_some() {
            // Kept only in the config: messages show the URL without it.
        } else if let Some(p) = password {
            config.password(p);
        } else if let Some(p) = env("PGPASSWORD") {
            config.password(&p);
        }
        config.application_name("gitplane");
        config.connect_timeout(CONNECT_LIMIT);
        config.keepalives_idle(Duration::from_secs(30));
        Ok(PgTarget {
            shown: shown_url(url),
            config,
        })
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }
}

/// `url` without a password, for messages and logs.
pub(crate) fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{user}@{host}")
        }
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|kv| !kv.to_ascii_lowercase().starts_with("password="))
                .collect();
            if kept.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", kept.join("&"))
            }
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// An owned query parameter, sent to the connection's thread.
#[derive(Debug, Clone)]
enum PgArg {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    Array(Array),
}

impl From<&Arg<'_>> for PgArg {
    fn from(a: &Arg<'_>) -> PgArg {
        match *a {
            Arg::Null => PgArg::Null,
            Arg::Int(v) => PgArg::Int(v),
            Arg::Real(v) => PgArg::Real(v),
            Arg::Text(v) => PgArg::Text(v.to_owned()),
            Arg::Blob(v) => PgArg::Blob(v.to_vec()),
            Arg::Array(v) => PgArg::Array(v.clone()),
        }
    }
}

impl ToSql for PgArg {
    // The queries are written once for both backends, so a parameter takes whatever type
    // PostgreSQL inferred for its place: an integer where it wants text, a 0/1 where it wants
    // a boolean.
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let mismatch = || -> Box<dyn std::error::Error + Sync + Send> {
            format!("cannot send {self:?} as {ty}").into()
        };
        match self {
            PgArg::Null => Ok(IsNull::Yes),
            PgArg::Int(v) => match *ty {
                Type::INT8 => v.to_sql(ty, out),
                Type::INT4 => i32::try_from(*v).map_err(|_| mismatch())?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*v).map_err(|_| mismatch())?.to_sql(ty, out),
                Type::FLOAT8 => (*v as f64).to_sql(ty, out),
                Type::FLOAT4 => (*v as f32).to_sql(ty, out),
                Type::BOOL => (*v != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    v.to_string().as_str().to_sql(&Type::TEXT, out)
                }
                _ => Err(mismatch()),
            },
            PgArg::Real(v) => match *ty {
                Type::FLOAT8 => v.to_sql(ty, out),
                Type::FLOAT4 => (*v as f32).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => {
                    v.to_string().as_str().to_sql(&Type::TEXT, out)
                }
                _ => Err(mismatch()),
            },
            PgArg::Text(v) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    v.as_str().to_sql(&Type::TEXT, out)
                }
                Type::JSON => {
                    out.extend_from_slice(v.as_bytes());
                    Ok(IsNull::No)
                }
                Type::JSONB => {
                    out.extend_from_slice(&[1]);
                    out.extend_from_slice(v.as_bytes());
                    Ok(IsNull::No)
                }
                Type::INT8 => v.parse::<i64>().map_err(|_| mismatch())?.to_sql(ty, out),
                Type::BYTEA => v.as_bytes().to_sql(ty, out),
                _ => Err(mismatch()),
            },
            PgArg::Blob(v) => match *ty {
                Type::BYTEA => v.as_slice().to_sql(ty, out),
                _ => Err(mismatch()),
            },
            PgArg::Array(v) => {
                let fits = matches!(
                    (v.kind, ty),
                    (ArrayKind::Text, &Type::TEXT_ARRAY) | (ArrayKind::Int, &Type::INT8_ARRAY)
                );
                if !fits {
                    return Err(mismatch());
                }
                write_array(v, out)?;
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    /// A value sent as `unknown` ([`typed`]) goes as text: the server reads it with the input
    /// of the type it infers (a number, a boolean's 0 or 1, JSON), as a literal would be.
    fn encode_format(&self, ty: &Type) -> tokio_postgres::types::Format {
        if *ty == Type::UNKNOWN {
            tokio_postgres::types::Format::Text
        } else {
            tokio_postgres::types::Format::Binary
        }
    }

    to_sql_checked!();
}

/// `args` as a prepared statement takes them.
fn refs(args: &[PgArg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

/// `args` as a statement that is not prepared sends them: an array as what it is, anything
/// else of a type left to the server (`unknown`, the same inference as a prepare makes) and
/// in its text form, which the type the server infers reads ([`PgArg::encode_format`]).
fn typed(args: &[PgArg]) -> Vec<(&(dyn ToSql + Sync), Type)> {
    args.iter()
        .map(|a| {
            let ty = match a {
                PgArg::Array(array) => match array.kind {
                    ArrayKind::Text => Type::TEXT_ARRAY,
                    ArrayKind::Int => Type::INT8_ARRAY,
                },
                _ => Type::UNKNOWN,
            };
            (a as &(dyn ToSql + Sync), ty)
        })
        .collect()
}

/// `array` in PostgreSQL's binary array format: dimensions, a NULL flag, the element type,
/// the length and lower bound of its one dimension, then the elements as gathered.
fn write_array(
    array: &Array,
    out: &mut BytesMut,
) -> Result<(), Box<dyn std::error::Error + Sync + Send>> {
    let len = i32::try_from(array.len).map_err(|_| "too many rows for one array")?;
    let dimensions: i32 = if len == 0 { 0 } else { 1 };
    out.reserve(20 + array.data.len());
    out.extend_from_slice(&dimensions.to_be_bytes());
    out.extend_from_slice(&i32::from(array.has_null).to_be_bytes());
    out.extend_from_slice(&array.kind.element_oid().to_be_bytes());
    if len > 0 {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
        out.extend_from_slice(&array.data);
    }
    Ok(())
}

/// Reads any column gitplane's schema has into a [`Cell`].
struct AnyCell(Cell);

impl<'a> FromSql<'a> for AnyCell {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<AnyCell, Box<dyn std::error::Error + Sync + Send>> {
        Ok(AnyCell(match *ty {
            Type::BOOL => Cell::Int(i64::from(bool::from_sql(ty, raw)?)),
            Type::INT2 => Cell::Int(i64::from(i16::from_sql(ty, raw)?)),
            Type::INT4 => Cell::Int(i64::from(i32::from_sql(ty, raw)?)),
            Type::INT8 => Cell::Int(i64::from_sql(ty, raw)?),
            Type::OID => Cell::Int(i64::from(u32::from_sql(ty, raw)?)),
            Type::FLOAT4 => Cell::Real(f64::from(f32::from_sql(ty, raw)?)),
            Type::FLOAT8 => Cell::Real(f64::from_sql(ty, raw)?),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Cell::Blob(raw.to_vec()),
            Type::JSONB => Cell::Text(String::from_utf8(
                raw.get(1..).unwrap_or_default().to_vec(),
            )?),
            _ => Cell::Text(String::from_utf8(raw.to_vec())?),
        }))
    }

    fn from_sql_null(_: &Type) -> Result<AnyCell, Box<dyn std::error::Error + Sync + Send>> {
        Ok(AnyCell(Cell::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A NUMERIC in PostgreSQL's binary form (what `SUM` of integers gives): an integer when it has
/// no fraction, else a real.
fn numeric(raw: &[u8]) -> Result<Cell, Box<dyn std::error::Error + Sync + Send>> {
    let word = |i: usize| -> Result<u16, Box<dyn std::error::Error + Sync + Send>> {
        raw.get(i * 2..i * 2 + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "a NUMERIC value is cut short".into())
    };
    let ndigits = usize::from(word(0)?);
    let weight = i32::from(word(1)? as i16);
    let sign = word(2)?;
    let scale = word(3)?;
    if sign == 0xC000 {
        return Ok(Cell::Real(f64::NAN));
    }
    let mut value = 0f64;
    for i in 0..ndigits {
        let digit = f64::from(word(4 + i)?);
        value += digit * 10000f64.powi(weight - i as i32);
    }
    if sign == 0x4000 {
        value = -value;
    }
    Ok(if scale == 0 && value.abs() < 9.0e15 {
        Cell::Int(value as i64)
    } else {
        Cell::Real(value)
    })
}

enum Op {
    Query(String, Vec<PgArg>),
    /// An execute whose result nobody waits for, inside a transaction: sent at once, its
    /// outcome collected at the transaction's next call that waits (so a failure still
    /// fails the transaction). With an error, a statement that finds no row fails with it.
    Deferred(String, Vec<PgArg>, Option<DbError>),
    /// A `COPY … FROM STDIN` of these rows, deferred the same way.
    Copy(String, bytes::Bytes),
    Table(String, Vec<PgArg>),
    Execute(String, Vec<PgArg>),
    Batch(String),
    /// `unflushed`: the transaction's commit does not wait for its WAL to reach the disk.
    Begin {
        unflushed: bool,
    },
    Commit,
    Rollback,
}

enum Reply {
    Rows(Vec<Vec<Cell>>),
    Table(Table),
    Count(u64),
    Done,
}

struct Request {
    op: Op,
    /// `None`: nobody waits for the answer (a deferred execute).
    reply: Option<std_mpsc::SyncSender<DbResult<Reply>>>,
}

/// A connection to PostgreSQL, served by a thread of its own.
pub struct PgConn {
    requests: mpsc::UnboundedSender<Request>,
    /// Where it connects, for [`PgConn::open_again`].
    config: tokio_postgres::Config,
}

impl PgConn {
    /// Starts the connection's thread and connects.
    pub fn open(target: &PgTarget) -> DbResult<PgConn> {
        PgConn::open_config(target.config.clone())
    }

    /// Another connection (a session of its own) to the same database.
    pub(crate) fn open_again(&self) -> DbResult<PgConn> {
        PgConn::open_config(self.config.clone())
    }

    fn open_config(config: tokio_postgres::Config) -> DbResult<PgConn> {
        let (tx, rx) = mpsc::unbounded_channel();
        let served = config.clone();
        std::thread::Builder::new()
            .name("postgres".into())
            .spawn(move || serve(served, rx))
            .map_err(|e| DbError::Lost(format!("cannot start the connection's thread: {e}")))?;
        let conn = PgConn {
            requests: tx,
            config,
        };
        // Connect now, so a wrong address or password shows when the state is opened.
        conn.call(Op::Batch(String::new()))?;
        Ok(conn)
    }

    fn call(&self, op: Op) -> DbResult<Reply> {
        let (reply, answer) = std_mpsc::sync_channel(1);
        self.requests
            .send(Request {
                op,
                reply: Some(reply),
            })
            .map_err(|_| DbError::Lost("the connection's thread stopped".into()))?;
        // The thread bounds every call itself; this only covers a thread that died.
        match answer.recv_timeout(CALL_LIMIT + CONNECT_LIMIT + Duration::from_secs(5)) {
            Ok(result) => result,
            Err(_) => Err(DbError::Timeout(CALL_LIMIT)),
        }
    }

    fn owned(args: &[Arg<'_>]) -> Vec<PgArg> {
        args.iter().map(PgArg::from).collect()
    }

    pub(crate) fn query(&self, sql: &str, args: &[Arg<'_>]) -> DbResult<Vec<Vec<Cell>>> {
        match self.call(Op::Query(sql.to_owned(), Self::owned(args)))? {
            Reply::Rows(rows) => Ok(rows),
            _ => Ok(Vec::new()),
        }
    }

    pub(crate) fn table(&self, sql: &str, args: &[Arg<'_>]) -> DbResult<Table> {
        match self.call(Op::Table(sql.to_owned(), Self::owned(args)))? {
            Reply::Table(t) => Ok(t),
            _ => Ok(Table {
                columns: Vec::new(),
                rows: Vec::new(),
            }),
        }
    }

    pub(crate) fn execute(&self, sql: &str, args: &[Arg<'_>]) -> DbResult<usize> {
        match self.call(Op::Execute(sql.to_owned(), Self::owned(args)))? {
            Reply::Count(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => Ok(0),
        }
    }

    /// Sends an execute inside a transaction without waiting for it: statements pipeline
    /// instead of costing a round trip each. Its error, if any, comes back from the next call
    /// that waits (at the latest the commit, which then fails).
    pub(crate) fn execute_deferred(&self, sql: &str, args: &[Arg<'_>]) -> DbResult<()> {
        self.requests
            .send(Request {
                op: Op::Deferred(sql.to_owned(), Self::owned(args), None),
                reply: None,
            })
            .map_err(|_| DbError::Lost("the connection's thread stopped".into()))
    }

    /// [`PgConn::execute_deferred`] of a statement that must find a row (a `SELECT … FOR SHARE`
    /// of what the transaction rests on): when it finds none, `none` fails the transaction.
    pub(crate) fn expect_deferred(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        none: DbError,
    ) -> DbResult<()> {
        self.requests
            .send(Request {
                op: Op::Deferred(sql.to_owned(), Self::owned(args), Some(none)),
                reply: None,
            })
            .map_err(|_| DbError::Lost("the connection's thread stopped".into()))
    }

    /// Sends a `COPY … FROM STDIN` of `rows` inside a transaction without waiting for it, as
    /// [`PgConn::execute_deferred`] sends a statement.
    pub(crate) fn copy_deferred(&self, copy: &str, rows: bytes::Bytes) -> DbResult<()> {
        self.requests
            .send(Request {
                op: Op::Copy(copy.to_owned(), rows),
                reply: None,
            })
            .map_err(|_| DbError::Lost("the connection's thread stopped".into()))
    }

    pub(crate) fn batch(&self, sql: &str) -> DbResult<()> {
        self.call(Op::Batch(sql.to_owned())).map(|_| ())
    }

    pub(crate) fn begin(&self) -> DbResult<()> {
        self.call(Op::Begin { unflushed: false }).map(|_| ())
    }

    /// Begins a transaction without waiting for the server: the statements sent after it
    /// follow it on the connection, and should it fail, they are not sent and the
    /// transaction's next call that waits (at the latest its commit) fails.
    pub(crate) fn begin_pipelined(&self) -> DbResult<()> {
        self.requests
            .send(Request {
                op: Op::Begin { unflushed: false },
                reply: None,
            })
            .map_err(|_| DbError::Lost("the connection's thread stopped".into()))
    }

    /// Begins a transaction whose commit returns before its WAL is flushed to disk
    /// (`synchronous_commit` off for it alone): what it writes is seen by every session at
    /// once, and lost only if the server itself crashes within a few hundred milliseconds,
    /// before the WAL writer or any later durable commit flushes it. In the same round trip as
    /// the `BEGIN`.
    pub(crate) fn begin_unflushed(&self) -> DbResult<()> {
        self.call(Op::Begin { unflushed: true }).map(|_| ())
    }

    /// Another handle on this connection: calls from either go to the same session, in the
    /// order they arrive, and it stays open while either lives. Whoever shares it must not
    /// send anything while the other has a transaction open.
    pub(crate) fn share(&self) -> PgConn {
        PgConn {
            requests: self.requests.clone(),
            config: self.config.clone(),
        }
    }

    pub(crate) fn commit(&self) -> DbResult<()> {
        self.call(Op::Commit).map(|_| ())
    }

    /// Sends the commit without waiting for it: the caller goes on (it may begin the next
    /// transaction on this connection, which the server takes after this one) and learns how
    /// the commit went from [`Committing::wait`].
    pub(crate) fn commit_later(&self) -> DbResult<Committing> {
        let (reply, answer) = std_mpsc::sync_channel(1);
        self.requests
            .send(Request {
                op: Op::Commit,
                reply: Some(reply),
            })
            .map_err(|_| DbError::Lost("the connection's thread stopped".into()))?;
        Ok(Committing { answer })
    }

    pub(crate) fn rollback(&self) {
        let _ = self.call(Op::Rollback);
    }
}

/// A commit sent and not yet answered ([`PgConn::commit_later`]).
pub(crate) struct Committing {
    answer: std_mpsc::Receiver<DbResult<Reply>>,
}

impl Committing {
    /// How the commit went.
    pub(crate) fn wait(self) -> DbResult<()> {
        // The thread bounds the commit itself (and what ran before it on the connection); this
        // only covers a thread that died.
        let limit = 2 * CALL_LIMIT + CONNECT_LIMIT + Duration::from_secs(5);
        match self.answer.recv_timeout(limit) {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(DbError::Lost("the connection's thread stopped".into())),
        }
    }
}

/// A deferred execute on its way.
type Pending = Pin<Box<dyn Future<Output = DbResult<u64>> + Send>>;

/// The connection's state on its thread.
struct Session {
    config: tokio_postgres::Config,
    client: Option<Arc<Client>>,
    statements: HashMap<String, Statement>,
    /// Statements run once without being prepared ([`Session::prepared`]): the next run of
    /// one prepares it.
    run_once: HashSet<String>,
    /// Deferred executes sent and not yet answered, in order.
    pending: VecDeque<Pending>,
    /// The first of them that failed: every call of the transaction fails with it.
    deferred_error: Option<DbError>,
    /// A transaction is open (on the current client, if it still lives).
    in_transaction: bool,
    /// The open transaction's commit does not wait for the disk.
    unflushed: bool,
    /// A commit that did not wait for the disk has had no durable commit after it (whose
    /// flush would cover it): should the connection break now, the server may have crashed
    /// and lost it.
    unflushed_committed: bool,
}

fn serve(config: tokio_postgres::Config, mut requests: mpsc::UnboundedReceiver<Request>) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async move {
        let mut session = Session {
            config,
            client: None,
            statements: HashMap::new(),
            run_once: HashSet::new(),
            pending: VecDeque::new(),
            deferred_error: None,
            in_transaction: false,
            unflushed: false,
            unflushed_committed: false,
        };
        while let Some(request) = requests.recv().await {
            let result = session.run(request.op).await;
            match (request.reply, result) {
                (Some(reply), result) => {
                    let _ = reply.send(result);
                }
                // Nobody waits for it (a deferred statement whose preparing failed, a begin
                // sent ahead): the transaction's next call that waits fails with it, so a
                // transaction the server aborted is never reported committed.
                (None, Err(e)) => {
                    session.deferred_error.get_or_insert(e);
                }
                (None, Ok(_)) => {}
            }
        }
    });
}

impl Session {
    async fn run(&mut self, op: Op) -> DbResult<Reply> {
        let alive = self.client.as_ref().is_some_and(|c| !c.is_closed());
        if !alive {
            self.client = None;
            self.statements.clear();
            self.run_once.clear();
            self.pending.clear();
            if matches!(op, Op::Rollback | Op::Commit) || !self.in_transaction {
                self.deferred_error = None;
            }
            if self.in_transaction {
                // The transaction died with its connection: every call of it fails until the
                // caller ends it.
                if matches!(op, Op::Rollback | Op::Commit) {
                    self.in_transaction = false;
                    self.unflushed = false;
                }
                return Err(DbError::Lost(
                    "the connection broke during a transaction, which is rolled back".into(),
                ));
            }
            if matches!(op, Op::Rollback) {
                return Ok(Reply::Done);
            }
            if std::mem::take(&mut self.unflushed_committed) {
                // What the caller goes on to write may rest on it (a deployment's row, and the
                // id a crashed server could hand out again): it learns of the break rather
                // than writing on over a new connection. The next call connects.
                return Err(DbError::Lost(
                    "the connection broke before the last transaction was flushed to disk: \
                     the server may have lost it"
                        .into(),
                ));
            }
            self.connect().await?;
        }
        let result = tokio::time::timeout(CALL_LIMIT, self.run_connected(op)).await;
        let result = match result {
            Ok(r) => r,
            Err(_) => {
                // The server may still be working on it: this connection is no longer usable.
                self.client = None;
                Err(DbError::Timeout(CALL_LIMIT))
            }
        };
        if let Err(DbError::Lost(_)) = &result {
            self.client = None;
        }
        result
    }

    async fn connect(&mut self) -> DbResult<()> {
        let connected = tokio::time::timeout(CONNECT_LIMIT, self.config.connect(NoTls)).await;
        let (client, connection) = match connected {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(DbError::Lost(describe(&e))),
            Err(_) => return Err(DbError::Timeout(CONNECT_LIMIT)),
        };
        tokio::spawn(async move {
            let _ = connection.await;
        });
        // A holder that froze (SIGSTOP, a stalled VM) inside a transaction would keep its
        // lease rows locked, and every takeover waiting, for as long as it stays frozen: the
        // server ends such a transaction after a few idle seconds. gitplane never idles inside
        // one (no driver call runs in a transaction).
        if let Err(e) = client
            .batch_execute("SET idle_in_transaction_session_timeout = '5s'")
            .await
        {
            return Err(error(&e));
        }
        self.client = Some(Arc::new(client));
        Ok(())
    }

    async fn statement(&mut self, sql: &str) -> DbResult<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let client = self.client.as_ref().ok_or_else(lost)?;
        let prepared = client
            .prepare(&dialect::postgres_query(sql))
            .await
            .map_err(|e| error(&e))?;
        // Bounded: a query built with a varying text (a list of ids) must not grow it forever.
        if self.statements.len() >= 512 {
            self.statements.clear();
        }
        if self.run_once.len() >= 512 {
            self.run_once.clear();
        }
        self.statements.insert(sql.to_owned(), prepared.clone());
        Ok(prepared)
    }

    /// The statement prepared for `sql`, or `None` the first time it runs with `args`: then
    /// it goes with its arguments in one round trip ([`typed`]) rather than two (prepare, then
    /// run). Most statements of a command run once; one that runs again is prepared then,
    /// and its plan kept. Arguments whose text form could mean something else where the
    /// server wants text (bytes) take the prepared way at once.
    async fn prepared(&mut self, sql: &str, args: &[PgArg]) -> DbResult<Option<Statement>> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(Some(s.clone()));
        }
        let once = !args.iter().any(|a| matches!(a, PgArg::Blob(_)));
        if once && self.run_once.insert(sql.to_owned()) {
            return Ok(None);
        }
        self.statement(sql).await.map(Some)
    }

    /// Waits for the deferred executes, in order; the first failure is kept.
    async fn settle(&mut self) {
        while let Some(pending) = self.pending.pop_front() {
            if let Err(e) = pending.await
                && self.deferred_error.is_none()
            {
                self.deferred_error = Some(e);
            }
        }
    }

    /// Queues `call`, made and not yet polled, after what was deferred before it: its first poll
    /// puts its request on the connection's queue, in call order, and its outcome is collected
    /// at the transaction's next call that waits. `own_task`: what is left of it after that
    /// poll runs as a task of its own.
    async fn defer(&mut self, mut call: Pending, own_task: bool) -> DbResult<Reply> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(e)) => {
                self.deferred_error.get_or_insert(e);
            }
            std::task::Poll::Ready(Ok(_)) => {}
            std::task::Poll::Pending if own_task => {
                let task = tokio::spawn(call);
                self.pending.push_back(Box::pin(async move {
                    task.await.unwrap_or_else(|e| {
                        Err(DbError::Lost(format!("a deferred task ended: {e}")))
                    })
                }));
            }
            std::task::Poll::Pending => self.pending.push_back(call),
        }
        if self.pending.len() >= 1024 {
            self.settle().await;
        }
        Ok(Reply::Done)
    }

    async fn run_connected(&mut self, op: Op) -> DbResult<Reply> {
        if let Op::Deferred(sql, args, none) = op {
            if self.deferred_error.is_some() {
                return Ok(Reply::Done);
            }
            let stmt = self.statement(&sql).await?;
            let client = self.client.clone().ok_or_else(lost)?;
            let call: Pending = Box::pin(async move {
                let n = client
                    .execute(&stmt, &refs(&args))
                    .await
                    .map_err(|e| error(&e))?;
                match none {
                    Some(e) if n == 0 => Err(e),
                    _ => Ok(n),
                }
            });
            return self.defer(call, false).await;
        }
        if let Op::Copy(copy, rows) = op {
            if self.deferred_error.is_some() {
                return Ok(Reply::Done);
            }
            let stmt = self.statement(&copy).await?;
            let client = self.client.clone().ok_or_else(lost)?;
            let call: Pending = Box::pin(async move {
                let sink = client
                    .copy_in::<_, bytes::Bytes>(&stmt)
                    .await
                    .map_err(|e| error(&e))?;
                let mut sink = std::pin::pin!(sink);
                sink.send(rows).await.map_err(|e| error(&e))?;
                sink.finish().await.map_err(|e| error(&e))
            });
            // Its rows go once the server is ready for them, so the rest of it runs as a task
            // of its own rather than waiting for the next call that waits (statements sent
            // after it wait for it on the connection).
            return self.defer(call, true).await;
        }
        self.settle().await;
        if let Some(e) = self.deferred_error.take() {
            if matches!(op, Op::Rollback | Op::Commit) {
                // The transaction failed: end it.
                self.in_transaction = false;
                self.unflushed = false;
                if let Some(client) = &self.client {
                    let _ = client.batch_execute("ROLLBACK").await;
                }
                if matches!(op, Op::Rollback) {
                    return Ok(Reply::Done);
                }
            } else {
                // Still failing for the rest of the transaction, until its end.
                self.deferred_error = Some(DbError::Postgres(e.to_string()));
            }
            return Err(e);
        }
        match op {
            Op::Query(sql, args) => {
                let stmt = self.prepared(&sql, &args).await?;
                let client = self.client.as_ref().ok_or_else(lost)?;
                let rows = match stmt {
                    Some(stmt) => client.query(&stmt, &refs(&args)).await,
                    None => {
                        client
                            .query_typed(&dialect::postgres_query(&sql), &typed(&args))
                            .await
                    }
                };
                Ok(Reply::Rows(cells(&rows.map_err(|e| error(&e))?)?))
            }
            Op::Table(sql, args) => {
                let stmt = self.statement(&sql).await?;
                let client = self.client.as_ref().ok_or_else(lost)?;
                let rows = client
                    .query(&stmt, &refs(&args))
                    .await
                    .map_err(|e| error(&e))?;
                Ok(Reply::Table(Table {
                    columns: stmt.columns().iter().map(|c| c.name().to_owned()).collect(),
                    rows: cells(&rows)?,
                }))
            }
            Op::Execute(sql, args) => {
                let stmt = self.prepared(&sql, &args).await?;
                let client = self.client.as_ref().ok_or_else(lost)?;
                let n = match stmt {
                    Some(stmt) => client.execute(&stmt, &refs(&args)).await,
                    None => {
                        client
                            .execute_typed(&dialect::postgres_query(&sql), &typed(&args))
                            .await
                    }
                };
                Ok(Reply::Count(n.map_err(|e| error(&e))?))
            }
            Op::Batch(sql) => {
                if !sql.is_empty() {
                    let client = self.client.as_ref().ok_or_else(lost)?;
                    client.batch_execute(&sql).await.map_err(|e| error(&e))?;
                }
                Ok(Reply::Done)
            }
            Op::Deferred(..) | Op::Copy(..) => Ok(Reply::Done),
            Op::Begin { unflushed } => {
                let client = self.client.as_ref().ok_or_else(lost)?;
                let begin = if unflushed {
                    "BEGIN; SET LOCAL synchronous_commit = off"
                } else {
                    "BEGIN"
                };
                client.batch_execute(begin).await.map_err(|e| error(&e))?;
                self.in_transaction = true;
                self.unflushed = unflushed;
                Ok(Reply::Done)
            }
            Op::Commit => {
                self.in_transaction = false;
                let client = self.client.as_ref().ok_or_else(lost)?;
                client
                    .batch_execute("COMMIT")
                    .await
                    .map_err(|e| error(&e))?;
                // A durable commit flushes the WAL up to its own record, so every commit of
                // this session before it too.
                self.unflushed_committed = std::mem::take(&mut self.unflushed);
                Ok(Reply::Done)
            }
            Op::Rollback => {
                self.in_transaction = false;
                self.unflushed = false;
                let client = self.client.as_ref().ok_or_else(lost)?;
                client
                    .batch_execute("ROLLBACK")
                    .await
                    .map_err(|e| error(&e))?;
                Ok(Reply::Done)
            }
        }
    }
}

fn cells(rows: &[tokio_postgres::Row]) -> DbResult<Vec<Vec<Cell>>> {
    rows.iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    row.try_get::<_, AnyCell>(i)
                        .map(|c| c.0)
                        .map_err(|e| DbError::Decode {
                            column: i,
                            message: describe(&e),
                        })
                })
                .collect()
        })
        .collect()
}

fn lost() -> DbError {
    DbError::Lost("not connected".into())
}

/// A tokio-postgres error as one line: the server's message (with its SQLSTATE) or what broke.
/// The server's detail (which may quote a row's values) is left out.
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    match e.source() {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

fn error(e: &tokio_postgres::Error) -> DbError {
    if e.is_closed()
        || (e.as_db_error().is_none() && e.source().is_some_and(|s| s.is::<std::io::Error>()))
    {
        DbError::Lost(describe(e))
    } else if let Some(db) = e.as_db_error()
        && matches!(
            db.code().code(),
            // admin_shutdown, crash_shutdown, cannot_connect_now
            "57P01" | "57P02" | "57P03"
        )
    {
        DbError::Lost(describe(e))
    } else {
        DbError::Postgres(describe(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_never_carry_the_password() {
        assert_eq!(
            shown_url("postgres://gp:s3cret@db.example:5432/state"),
            "postgres://gp@db.example:5432/state"
        );
        assert_eq!(
            shown_url("postgresql://db/state?password=s3cret&sslmode=disable"),
            "postgresql://db/state?sslmode=disable"
        );
        assert_eq!(
            shown_url("postgres://gp@db/state"),
            "postgres://gp@db/state"
        );
    }

    /// `(guresid)` of the driver cookies kept, in order.
    fn cookies(conn: &crate::db::Conn) -> Vec<String> {
        conn.prepare_cached("SELECT guresid FROM driver_cookie ORDER BY guresid")
            .unwrap()
            .query_map(crate::db::params![], |r| r.get(0))
            .unwrap()
            .collect::<DbResult<Vec<String>>>()
            .unwrap()
    }

    fn keep_cookie(tx: &crate::db::Tx<'_>, guresid: &str) {
        tx.prepare_cached(
            "INSERT INTO driver_cookie (guresid, cookie, updated_at) VALUES (?1, 'c', 'now')",
        )
        .unwrap()
        .run(crate::db::params![guresid])
        .unwrap();
    }

    #[test]
    fn a_statement_run_once_unprepared_reads_its_arguments_as_a_prepared_one_does() {
        crate::tests::each_backend(|store| {
            if store.backend() != crate::db::Backend::Postgres {
                return;
            }
            let sql = "SELECT ?1 + 1, CASE WHEN ?2 THEN 'y' ELSE 'n' END, ?3::float8 * 2,
                              (?4::jsonb) ->> 'a', ?5 || '!', coalesce(?6, 'none')";
            let run = || -> Vec<Cell> {
                store
                    .conn
                    .query_row(
                        sql,
                        crate::db::params![41, 1, 1.25, r#"{"a": "b"}"#, "x", None::<i64>],
                        |r| (0..6).map(|i| r.get::<_, Cell>(i)).collect(),
                    )
                    .unwrap()
            };
            // The first run goes unprepared, the second prepares it, the third reuses it.
            let first = run();
            assert_eq!(
                first,
                [
                    Cell::Int(42),
                    Cell::Text("y".into()),
                    Cell::Real(2.5),
                    Cell::Text("b".into()),
                    Cell::Text("x!".into()),
                    Cell::Text("none".into())
                ]
            );
            assert_eq!(run(), first);
            assert_eq!(run(), first);
        });
    }

    #[test]
    fn a_pipelined_statement_the_server_cannot_prepare_fails_the_commit() {
        crate::tests::each_backend(|store| {
            if store.backend() != crate::db::Backend::Postgres {
                return;
            }
            let tx = store.conn.transaction().unwrap();
            keep_cookie(&tx, "g1");
            // Sent without waiting: the server aborts the transaction, and its commit would
            // only roll it back, silently, were the failure not kept for the commit.
            let sent = tx
                .prepare_cached("INSERT INTO no_such_table (x) VALUES (?1)")
                .and_then(|mut s| s.run(crate::db::params![1]));
            let failed = match sent {
                Err(e) => e,
                Ok(()) => tx
                    .commit()
                    .expect_err("the commit of an aborted transaction"),
            };
            assert!(failed.to_string().contains("no_such_table"), "{failed}");
            assert!(cookies(&store.conn).is_empty());
        });
    }

    #[test]
    fn a_pipelined_commit_tells_how_it_went_and_a_failed_one_keeps_nothing() {
        crate::tests::each_backend(|store| {
            let other = crate::connect(store.path()).unwrap();
            // The first is committed without waiting; the second is sent behind it.
            let first = other.transaction_pipelined().unwrap();
            keep_cookie(&first, "g1");
            let first = first.commit_later();
            let second = other.transaction_pipelined().unwrap();
            keep_cookie(&second, "g2");
            first.wait().unwrap();
            second.commit_later().wait().unwrap();
            assert_eq!(cookies(&store.conn), ["g1", "g2"]);
            if store.backend() != crate::db::Backend::Postgres {
                // SQLite writes at once and commits in process: nothing goes ahead of a failure.
                return;
            }
            // A transaction that fails at its commit, with another already sent behind it:
            // waiting tells the failure, so its caller (the journal's writer) rolls the other
            // back rather than commit it.
            let failing = other.transaction_pipelined().unwrap();
            keep_cookie(&failing, "g3");
            keep_cookie(&failing, "g1");
            let failing = failing.commit_later();
            let behind = other.transaction_pipelined().unwrap();
            keep_cookie(&behind, "g4");
            let e = failing.wait().expect_err("g1 is kept already");
            assert!(e.to_string().contains("driver_cookie"), "{e}");
            drop(behind);
            assert_eq!(cookies(&store.conn), ["g1", "g2"]);
            // The connection goes on.
            let next = other.transaction_pipelined().unwrap();
            keep_cookie(&next, "g5");
            next.commit_later().wait().unwrap();
            assert_eq!(cookies(&store.conn), ["g1", "g2", "g5"]);
        });
    }

    #[test]
    fn a_deployment_begins_without_waiting_for_the_disk_and_later_commits_still_wait() {
        crate::tests::each_backend(|mut store| {
            let (id, resumed) = store
                .begin_or_resume_deployment("dev", "c1", false, 50.0)
                .unwrap();
            assert!(!resumed);
            // Committed: another connection sees it at once.
            let other = crate::connect(store.path()).unwrap();
            let status: String = other
                .query_row("SELECT status FROM deployment WHERE id = ?1", [id], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(status, "running");
            if store.backend() == crate::db::Backend::Postgres {
                // Relaxed for that transaction alone: the session's later commits wait for the
                // disk (the deployment's end, the action log).
                let setting: String = store
                    .conn
                    .query_row(
                        "SELECT current_setting('synchronous_commit')",
                        crate::db::params![],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert_eq!(setting, "on");
            }
        });
    }

    #[test]
    fn a_connection_broken_before_an_unflushed_commit_was_flushed_fails_the_next_call_once() {
        const TEST: &str =
            "a_connection_broken_before_an_unflushed_commit_was_flushed_fails_the_next_call_once";
        let Some(server) = gitplane_testkit::postgres_or_skip(TEST) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let key = crate::KeySource::File(dir.path().join("pg.key"));
        let url = server.database();
        let mut store = crate::Store::open_keyed(std::path::Path::new(&url), Some(&key)).unwrap();
        let (id, _) = store
            .begin_or_resume_deployment("dev", "c1", false, 50.0)
            .unwrap();
        // A crash could have lost the deployment's row (and handed its id out again): the
        // apply must not write on over a new connection as if nothing happened.
        server.restart();
        let broken = store.deployments(None).unwrap_err().to_string();
        assert!(
            broken.contains("before the last transaction was flushed to disk"),
            "{broken}"
        );
        // Once told, the next call connects; a clean stop lost nothing.
        assert_eq!(store.deployments(None).unwrap()[0].id, id);
        // After a durable commit, a break is a reconnection again, as it always was.
        store
            .finish_deployment(
                id,
                crate::DeploymentStatus::Succeeded,
                &crate::Counts::default(),
                None,
            )
            .unwrap();
        server.restart();
        assert_eq!(
            store.deployments(None).unwrap()[0].status,
            crate::DeploymentStatus::Succeeded
        );
    }

    #[test]
    fn numerics_read_as_integers_or_reals() {
        // 12345 = digits [1, 2345], weight 1, scale 0.
        let raw = [2u16, 1, 0, 0, 1, 2345]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect::<Vec<u8>>();
        assert_eq!(numeric(&raw).unwrap(), Cell::Int(12345));
    }
}
