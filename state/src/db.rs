//! The connection under the store: SQLite or PostgreSQL behind one small interface, so no query
//! knows which of them it talks to.
//!
//! Queries are written once, in the dialect both understand (SQLite's `?N` parameters, which
//! [`crate::dialect`] rewrites for PostgreSQL; `RETURNING`, `ON CONFLICT`, `IS NOT DISTINCT
//! FROM`, explicit casts). The interface mirrors the parts of rusqlite the store uses
//! (`prepare_cached`, `query_row`, `execute`, transactions), so a query reads the same whichever
//! backend runs it.

use std::borrow::Cow;

use crate::postgres::{Committing as PgCommitting, PgConn};

/// An error of the database under the store.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Postgres(String),
    /// The connection to PostgreSQL is gone (the server restarted or the network failed); the
    /// next call connects again.
    #[error("lost the connection to PostgreSQL: {0}")]
    Lost(String),
    #[error("PostgreSQL did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// A query for one row found none (see [`OptionalExtension`]).
    #[error("the query returned no row")]
    NoRows,
    #[error("column {column}: {message}")]
    Decode { column: usize, message: String },
    /// A write of an environment whose lease moved to another daemon: refused, so a holder that
    /// froze and woke up after a takeover changes nothing.
    #[error(
        "the lease of environment {env} moved on (this daemon held generation {generation}): \
         another daemon took it over, so this one writes nothing more there"
    )]
    Fenced { env: String, generation: i64 },
    /// A secret that cannot be sealed or opened (no key, the wrong key).
    #[error(transparent)]
    Seal(#[from] crate::seal::SealError),
    /// A value gitplane cannot have written: the file was damaged or edited.
    #[error("{reason}")]
    Damaged {
        table: &'static str,
        row: String,
        reason: String,
    },
}

impl DbError {
    /// Whether the error is about reaching the database rather than about the query.
    pub fn is_connection(&self) -> bool {
        matches!(self, DbError::Lost(_) | DbError::Timeout(_))
    }
}

pub type DbResult<T> = Result<T, DbError>;

/// A query parameter, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
    /// A whole column of rows as one PostgreSQL array (`?1::text[]`, `?2::int8[]`), for
    /// `unnest`: PostgreSQL only.
    Array(&'a Array),
}

/// The element type of an [`Array`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayKind {
    /// `text[]`.
    Text,
    /// `int8[]`.
    Int,
}

impl ArrayKind {
    /// The element type's OID, as PostgreSQL's binary array format names it.
    pub(crate) fn element_oid(self) -> u32 {
        match self {
            ArrayKind::Text => 25,
            ArrayKind::Int => 20,
        }
    }
}

/// A column of values gathered row by row into PostgreSQL's binary array format, so a batch's
/// rows go to the server as typed arrays (`unnest(?1::text[], ?2::int8[], ...)`): no text to
/// format on this side, none to parse on the server's, no allocation per value.
#[derive(Debug)]
pub struct Column {
    kind: ArrayKind,
    len: usize,
    has_null: bool,
    /// Each element: its length (4 bytes, big-endian; -1 for NULL), then its bytes.
    data: bytes::BytesMut,
}

impl Column {
    pub fn text() -> Column {
        Column::of(ArrayKind::Text)
    }

    pub fn int() -> Column {
        Column::of(ArrayKind::Int)
    }

    fn of(kind: ArrayKind) -> Column {
        Column {
            kind,
            len: 0,
            has_null: false,
            data: bytes::BytesMut::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a text value (`None`: NULL).
    pub fn push_text(&mut self, value: Option<&str>) {
        debug_assert_eq!(self.kind, ArrayKind::Text);
        self.has_null |= put_text(&mut self.data, value);
        self.len += 1;
    }

    /// Appends an integer value (`None`: NULL).
    pub fn push_int(&mut self, value: Option<i64>) {
        debug_assert_eq!(self.kind, ArrayKind::Int);
        self.has_null |= put_int(&mut self.data, value);
        self.len += 1;
    }

    /// The column as a parameter; the builder starts empty again.
    pub fn finish(&mut self) -> Array {
        let array = Array {
            kind: self.kind,
            len: self.len,
            has_null: self.has_null,
            data: self.data.split().freeze(),
        };
        self.len = 0;
        self.has_null = false;
        array
    }
}

/// Rows gathered for a binary `COPY … FROM STDIN (FORMAT binary)`, PostgreSQL's fastest way in
/// for a plain insert: the server writes a page of rows at a time rather than a row at a time.
/// Each row gives its fields in the statement's order ([`CopyRows::text`], [`CopyRows::int`]).
pub struct CopyRows {
    width: usize,
    rows: usize,
    /// Fields given since the last row began.
    fields: usize,
    data: bytes::BytesMut,
}

impl CopyRows {
    /// Rows of `width` fields.
    pub fn new(width: u16) -> CopyRows {
        let mut data = bytes::BytesMut::new();
        // The signature, no flags, no header extension.
        data.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
        data.extend_from_slice(&0i32.to_be_bytes());
        data.extend_from_slice(&0i32.to_be_bytes());
        CopyRows {
            width: usize::from(width),
            rows: 0,
            fields: usize::from(width),
            data,
        }
    }

    /// Begins a row.
    pub fn row(&mut self) {
        debug_assert_eq!(self.fields, self.width, "a row was left short");
        let width = i16::try_from(self.width).unwrap_or(i16::MAX);
        self.data.extend_from_slice(&width.to_be_bytes());
        self.fields = 0;
        self.rows += 1;
    }

    pub fn text(&mut self, value: Option<&str>) {
        self.fields += 1;
        put_text(&mut self.data, value);
    }

    pub fn int(&mut self, value: Option<i64>) {
        self.fields += 1;
        put_int(&mut self.data, value);
    }

    /// The rows as the copy's data, `None` when there is none.
    pub fn finish(mut self) -> Option<bytes::Bytes> {
        debug_assert_eq!(self.fields, self.width, "a row was left short");
        if self.rows == 0 {
            return None;
        }
        self.data.extend_from_slice(&(-1i16).to_be_bytes());
        Some(self.data.freeze())
    }
}

/// Writes one value as PostgreSQL's binary formats frame it, in an array as in a `COPY` row: its
/// length (4 bytes, big-endian; -1 for NULL), then its bytes. Whether it was NULL.
fn put_text(data: &mut bytes::BytesMut, value: Option<&str>) -> bool {
    match value {
        // A value of 2 GiB or more cannot be a PostgreSQL text anyway; the server refuses it
        // as malformed rather than taking a wrong value.
        Some(v) => {
            let len = i32::try_from(v.len()).unwrap_or(i32::MAX);
            data.extend_from_slice(&len.to_be_bytes());
            data.extend_from_slice(v.as_bytes());
            false
        }
        None => put_null(data),
    }
}

/// As [`put_text`], an `int8`.
fn put_int(data: &mut bytes::BytesMut, value: Option<i64>) -> bool {
    match value {
        Some(v) => {
            data.extend_from_slice(&8i32.to_be_bytes());
            data.extend_from_slice(&v.to_be_bytes());
            false
        }
        None => put_null(data),
    }
}

fn put_null(data: &mut bytes::BytesMut) -> bool {
    data.extend_from_slice(&(-1i32).to_be_bytes());
    true
}

/// A finished [`Column`]: cheap to clone (its bytes are shared), sent as an array parameter.
#[derive(Clone)]
pub struct Array {
    pub(crate) kind: ArrayKind,
    pub(crate) len: usize,
    pub(crate) has_null: bool,
    pub(crate) data: bytes::Bytes,
}

impl std::fmt::Debug for Array {
    // Its rows may be megabytes, and secrets (sealed): a message names its shape alone.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an array of {} {:?} values", self.len, self.kind)
    }
}

impl ToArg for Array {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Array(self)
    }
}

/// What can be a query parameter.
pub trait ToArg {
    fn to_arg(&self) -> Arg<'_>;
}

impl ToArg for Arg<'_> {
    fn to_arg(&self) -> Arg<'_> {
        *self
    }
}
impl ToArg for str {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}
impl ToArg for String {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}
impl ToArg for [u8] {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Blob(self)
    }
}
impl ToArg for Vec<u8> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Blob(self)
    }
}
impl ToArg for f64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Real(*self)
    }
}
impl ToArg for bool {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(i64::from(*self))
    }
}
macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl ToArg for $t {
            fn to_arg(&self) -> Arg<'_> {
                Arg::Int(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_arg!(i64, i32, u32, u64, usize, u16);
impl<T: ToArg + ?Sized> ToArg for &T {
    fn to_arg(&self) -> Arg<'_> {
        (**self).to_arg()
    }
}
impl<T: ToArg> ToArg for Option<T> {
    fn to_arg(&self) -> Arg<'_> {
        match self {
            Some(v) => v.to_arg(),
            None => Arg::Null,
        }
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(v) => ValueRef::Integer(v),
            Arg::Real(v) => ValueRef::Real(v),
            Arg::Text(v) => ValueRef::Text(v.as_bytes()),
            Arg::Blob(v) => ValueRef::Blob(v),
            Arg::Array(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "SQLite takes no array parameters".into(),
                ));
            }
        }))
    }
}

/// The parameters of one query: an array of [`ToArg`] values or [`params!`](crate::params).
pub trait Params {
    fn with_args<R>(&self, f: impl FnOnce(&[Arg<'_>]) -> R) -> R;
}

impl<T: ToArg, const N: usize> Params for [T; N] {
    fn with_args<R>(&self, f: impl FnOnce(&[Arg<'_>]) -> R) -> R {
        f(&self.each_ref().map(|v| v.to_arg()))
    }
}
impl Params for &[Arg<'_>] {
    fn with_args<R>(&self, f: impl FnOnce(&[Arg<'_>]) -> R) -> R {
        f(self)
    }
}
impl Params for Vec<Arg<'_>> {
    fn with_args<R>(&self, f: impl FnOnce(&[Arg<'_>]) -> R) -> R {
        f(self)
    }
}

/// Parameters of mixed types, in order: `params![env, id, None::<&str>]`.
macro_rules! params {
    () => { [] as [$crate::db::Arg<'static>; 0] };
    ($($e:expr),+ $(,)?) => { [$($crate::db::ToArg::to_arg(&$e)),+] };
}
pub(crate) use params;

/// One value of a row, owned (read back from PostgreSQL, or copied for reports).
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// One value of a row, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum CellRef<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl Cell {
    pub fn as_ref(&self) -> CellRef<'_> {
        match self {
            Cell::Null => CellRef::Null,
            Cell::Int(v) => CellRef::Int(*v),
            Cell::Real(v) => CellRef::Real(*v),
            Cell::Text(v) => CellRef::Text(v),
            Cell::Blob(v) => CellRef::Blob(v),
        }
    }
}

impl CellRef<'_> {
    pub fn to_owned_cell(self) -> Cell {
        match self {
            CellRef::Null => Cell::Null,
            CellRef::Int(v) => Cell::Int(v),
            CellRef::Real(v) => Cell::Real(v),
            CellRef::Text(v) => Cell::Text(v.to_owned()),
            CellRef::Blob(v) => Cell::Blob(v.to_vec()),
        }
    }
}

/// What a column can be read as.
pub trait FromCell: Sized {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String>;
}

impl FromCell for i64 {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        match cell {
            CellRef::Int(v) => Ok(v),
            CellRef::Real(v) if v.fract() == 0.0 => Ok(v as i64),
            other => Err(format!("expected an integer, found {}", kind(other))),
        }
    }
}
macro_rules! int_from_cell {
    ($($t:ty),*) => {$(
        impl FromCell for $t {
            fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
                let v = i64::from_cell(cell)?;
                <$t>::try_from(v).map_err(|_| format!("{v} is out of range"))
            }
        }
    )*};
}
int_from_cell!(i32, u32, u64, usize);
impl FromCell for bool {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        Ok(i64::from_cell(cell)? != 0)
    }
}
impl FromCell for f64 {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        match cell {
            CellRef::Int(v) => Ok(v as f64),
            CellRef::Real(v) => Ok(v),
            other => Err(format!("expected a number, found {}", kind(other))),
        }
    }
}
impl FromCell for String {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        match cell {
            CellRef::Text(v) => Ok(v.to_owned()),
            other => Err(format!("expected text, found {}", kind(other))),
        }
    }
}
impl FromCell for Vec<u8> {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        match cell {
            CellRef::Blob(v) => Ok(v.to_vec()),
            CellRef::Text(v) => Ok(v.as_bytes().to_vec()),
            other => Err(format!("expected bytes, found {}", kind(other))),
        }
    }
}
impl FromCell for Cell {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        Ok(cell.to_owned_cell())
    }
}
impl<T: FromCell> FromCell for Option<T> {
    fn from_cell(cell: CellRef<'_>) -> Result<Self, String> {
        match cell {
            CellRef::Null => Ok(None),
            other => T::from_cell(other).map(Some),
        }
    }
}

fn kind(cell: CellRef<'_>) -> &'static str {
    match cell {
        CellRef::Null => "NULL",
        CellRef::Int(_) => "an integer",
        CellRef::Real(_) => "a real",
        CellRef::Text(_) => "text",
        CellRef::Blob(_) => "a blob",
    }
}

/// A column index (rusqlite's `RowIndex`, for the call sites written against it).
pub trait RowIndex {
    fn index(self) -> usize;
}
impl RowIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a result.
pub enum Row<'r> {
    Lite(&'r rusqlite::Row<'r>),
    Pg(&'r [Cell]),
}

impl Row<'_> {
    pub fn get<I: RowIndex, T: FromCell>(&self, index: I) -> DbResult<T> {
        let i = index.index();
        let decode = |message| DbError::Decode { column: i, message };
        match self {
            Row::Lite(r) => {
                let cell = match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => CellRef::Null,
                    rusqlite::types::ValueRef::Integer(v) => CellRef::Int(v),
                    rusqlite::types::ValueRef::Real(v) => CellRef::Real(v),
                    rusqlite::types::ValueRef::Text(v) => {
                        CellRef::Text(std::str::from_utf8(v).map_err(|e| decode(e.to_string()))?)
                    }
                    rusqlite::types::ValueRef::Blob(v) => CellRef::Blob(v),
                };
                T::from_cell(cell).map_err(decode)
            }
            Row::Pg(cells) => {
                let cell = cells
                    .get(i)
                    .ok_or_else(|| decode("no such column".to_owned()))?;
                T::from_cell(cell.as_ref()).map_err(decode)
            }
        }
    }
}

/// `Ok(None)` for a query that found no row (rusqlite's `OptionalExtension`).
pub trait OptionalExtension<T> {
    fn optional(self) -> DbResult<Option<T>>;
}

impl<T> OptionalExtension<T> for DbResult<T> {
    fn optional(self) -> DbResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A query's columns and rows, for reports that print whatever a view holds.
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

/// A connection: a SQLite file or a PostgreSQL database.
pub enum Conn {
    Lite(rusqlite::Connection),
    Pg(PgConn),
}

/// Which backend a connection is, for the few steps that differ (schema versions, vacuum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Conn {
    pub fn backend(&self) -> Backend {
        match self {
            Conn::Lite(_) => Backend::Sqlite,
            Conn::Pg(_) => Backend::Postgres,
        }
    }

    /// The SQLite connection, for tests of what only SQLite has (pragmas).
    #[cfg(test)]
    pub fn lite(&self) -> &rusqlite::Connection {
        match self {
            Conn::Lite(c) => c,
            Conn::Pg(_) => panic!("a SQLite-only test ran on PostgreSQL"),
        }
    }

    pub fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>> {
        self.statement(sql, false)
    }

    pub fn execute(&self, sql: &str, params: impl Params) -> DbResult<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    pub fn query_row<T>(
        &self,
        sql: &str,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> DbResult<T>,
    ) -> DbResult<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    pub fn execute_batch(&self, sql: &str) -> DbResult<()> {
        match self {
            Conn::Lite(c) => Ok(c.execute_batch(sql)?),
            Conn::Pg(c) => c.batch(sql),
        }
    }

    /// Every column and row of `sql`, whatever they are.
    pub fn table(&self, sql: &str, params: impl Params) -> DbResult<Table> {
        match self {
            Conn::Lite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let columns: Vec<String> = stmt.column_names().map(str::to_owned).collect();
                let width = columns.len();
                let rows = params.with_args(|args| -> DbResult<Vec<Vec<Cell>>> {
                    let mut rows = stmt.query(rusqlite::params_from_iter(args.iter()))?;
                    let mut out = Vec::new();
                    while let Some(r) = rows.next()? {
                        let row = Row::Lite(r);
                        out.push(
                            (0..width)
                                .map(|i| row.get::<_, Cell>(i))
                                .collect::<DbResult<Vec<Cell>>>()?,
                        );
                    }
                    Ok(out)
                })?;
                Ok(Table { columns, rows })
            }
            Conn::Pg(c) => params.with_args(|args| c.table(sql, args)),
        }
    }

    /// Starts a transaction (SQLite: `BEGIN IMMEDIATE`, so it holds the write lock from the
    /// start and never fails half-way for a busy file). The caller makes sure none is open.
    pub fn transaction(&self) -> DbResult<Tx<'_>> {
        self.begin_with(PgConn::begin)
    }

    /// A transaction begun on SQLite as [`Conn::transaction`] says, on PostgreSQL by `begin`.
    fn begin_with(&self, begin: impl FnOnce(&PgConn) -> DbResult<()>) -> DbResult<Tx<'_>> {
        match self {
            Conn::Lite(c) => c.execute_batch("BEGIN IMMEDIATE")?,
            Conn::Pg(c) => begin(c)?,
        }
        Ok(Tx {
            conn: self,
            open: true,
        })
    }

    /// Starts a transaction like [`Conn::transaction`] whose commit does not wait for the
    /// disk: on PostgreSQL `synchronous_commit` is off for it alone (see
    /// [`PgConn::begin_unflushed`]); SQLite in WAL mode with `synchronous=NORMAL` never waits
    /// at a commit anyway. Only for writes that are either redone when lost or made durable by
    /// a later durable commit before anything relies on them: a server crash right after the
    /// commit may undo it.
    pub fn transaction_unflushed(&self) -> DbResult<Tx<'_>> {
        self.begin_with(PgConn::begin_unflushed)
    }

    /// Starts a transaction like [`Conn::transaction`] without waiting for PostgreSQL: the
    /// statements that follow go after the `BEGIN` on the connection, while it may still be
    /// busy with an earlier transaction committed by [`Tx::commit_later`]. A failed begin
    /// fails the transaction's next call that waits, at the latest its commit.
    pub fn transaction_pipelined(&self) -> DbResult<Tx<'_>> {
        self.begin_with(PgConn::begin_pipelined)
    }

    /// Another handle on the same PostgreSQL session (see [`PgConn::share`]); `None` for
    /// SQLite, whose connection stays with its thread.
    pub(crate) fn share(&self) -> Option<Conn> {
        match self {
            Conn::Lite(_) => None,
            Conn::Pg(c) => Some(Conn::Pg(c.share())),
        }
    }

    /// Starts a read-only transaction that sees the database as it is now for its whole
    /// length, while writers go on (SQLite in WAL mode: the first read fixes the snapshot).
    pub fn read_snapshot(&self) -> DbResult<Tx<'_>> {
        match self {
            Conn::Lite(c) => c.execute_batch("BEGIN DEFERRED")?,
            Conn::Pg(c) => {
                c.begin()?;
                c.batch("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")?;
            }
        }
        Ok(Tx {
            conn: self,
            open: true,
        })
    }

    fn statement(&self, sql: &str, in_transaction: bool) -> DbResult<Stmt<'_>> {
        match self {
            Conn::Lite(c) => Ok(Stmt::Lite(c.prepare_cached(sql)?)),
            Conn::Pg(c) => Ok(Stmt::Pg {
                conn: c,
                sql: Cow::Owned(sql.to_owned()),
                in_transaction,
            }),
        }
    }
}

/// A transaction, rolled back when dropped without [`Tx::commit`].
pub struct Tx<'c> {
    conn: &'c Conn,
    open: bool,
}

impl Tx<'_> {
    pub fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>> {
        self.conn.statement(sql, true)
    }

    pub fn backend(&self) -> Backend {
        self.conn.backend()
    }

    pub fn execute(&self, sql: &str, params: impl Params) -> DbResult<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    pub fn query_row<T>(
        &self,
        sql: &str,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> DbResult<T>,
    ) -> DbResult<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    pub fn execute_batch(&self, sql: &str) -> DbResult<()> {
        self.conn.execute_batch(sql)
    }

    /// Runs `copy` (`COPY … FROM STDIN (FORMAT binary)`) with `rows` ([`CopyRows::finish`]),
    /// pipelined like [`Stmt::run`]: a failure fails the transaction at its next waiting call
    /// or its commit. PostgreSQL only: SQLite has no `COPY`.
    pub fn copy_in(&self, copy: &str, rows: bytes::Bytes) -> DbResult<()> {
        match self.conn {
            Conn::Pg(c) => c.copy_deferred(copy, rows),
            Conn::Lite(_) => Err(DbError::Sqlite(rusqlite::Error::InvalidQuery)),
        }
    }

    pub fn commit(mut self) -> DbResult<()> {
        self.open = false;
        match self.conn {
            Conn::Lite(c) => Ok(c.execute_batch("COMMIT")?),
            Conn::Pg(c) => c.commit(),
        }
    }

    /// Commits without waiting for PostgreSQL (SQLite commits at once, in process): the caller
    /// may prepare and send the next transaction while the server finishes this one, and
    /// learns how it went from [`Committing::wait`]. Whoever commits a transaction that rests
    /// on this one waits for it first.
    pub fn commit_later(mut self) -> Committing {
        self.open = false;
        match self.conn {
            Conn::Lite(c) => {
                Committing(Sent::Done(c.execute_batch("COMMIT").map_err(DbError::from)))
            }
            Conn::Pg(c) => Committing(match c.commit_later() {
                Ok(pending) => Sent::Pg(pending),
                Err(e) => Sent::Done(Err(e)),
            }),
        }
    }
}

/// A commit on its way ([`Tx::commit_later`]).
#[must_use = "a commit's outcome is known only once waited for"]
pub struct Committing(Sent);

enum Sent {
    Done(DbResult<()>),
    Pg(PgCommitting),
}

impl Committing {
    /// How the commit went: `Ok` once it is durable.
    pub fn wait(self) -> DbResult<()> {
        match self.0 {
            Sent::Done(result) => result,
            Sent::Pg(pending) => pending.wait(),
        }
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            match self.conn {
                Conn::Lite(c) => {
                    let _ = c.execute_batch("ROLLBACK");
                }
                Conn::Pg(c) => c.rollback(),
            }
        }
    }
}

/// A prepared statement (PostgreSQL's are prepared and cached by the connection itself).
pub enum Stmt<'c> {
    Lite(rusqlite::CachedStatement<'c>),
    Pg {
        conn: &'c PgConn,
        sql: Cow<'c, str>,
        /// Made in a transaction: [`Stmt::run`] may pipeline it.
        in_transaction: bool,
    },
}

impl Stmt<'_> {
    /// Executes, when nobody needs the number of rows: inside a PostgreSQL transaction it is
    /// sent without waiting for its answer (statements pipeline; a failure fails the
    /// transaction at its next waiting call or its commit).
    pub fn run(&mut self, params: impl Params) -> DbResult<()> {
        match self {
            Stmt::Pg {
                conn,
                sql,
                in_transaction: true,
            } => params.with_args(|args| conn.execute_deferred(sql, args)),
            _ => self.execute(params).map(|_| ()),
        }
    }

    /// [`Stmt::run`] of a query that must find a row, else the transaction fails with `none`:
    /// on PostgreSQL inside a transaction it is sent without waiting, like `run`, and `none`
    /// comes back from its next waiting call or its commit; elsewhere it is checked at once.
    pub fn run_expecting_row(&mut self, params: impl Params, none: DbError) -> DbResult<()> {
        match self {
            Stmt::Pg {
                conn,
                sql,
                in_transaction: true,
            } => params.with_args(|args| conn.expect_deferred(sql, args, none)),
            _ => match self.exists(params)? {
                true => Ok(()),
                false => Err(none),
            },
        }
    }

    pub fn execute(&mut self, params: impl Params) -> DbResult<usize> {
        match self {
            Stmt::Lite(s) => {
                params.with_args(|args| Ok(s.execute(rusqlite::params_from_iter(args.iter()))?))
            }
            Stmt::Pg { conn, sql, .. } => params.with_args(|args| conn.execute(sql, args)),
        }
    }

    /// Every row, mapped; eagerly read.
    pub fn query_map<T>(
        &mut self,
        params: impl Params,
        mut f: impl FnMut(&Row<'_>) -> DbResult<T>,
    ) -> DbResult<std::vec::IntoIter<DbResult<T>>> {
        let mut out = Vec::new();
        self.for_each(params, |row| {
            out.push(Ok(f(row)?));
            Ok(true)
        })?;
        Ok(out.into_iter())
    }

    pub fn query_row<T>(
        &mut self,
        params: impl Params,
        f: impl FnOnce(&Row<'_>) -> DbResult<T>,
    ) -> DbResult<T> {
        let mut f = Some(f);
        let mut out = None;
        self.for_each(params, |row| {
            if let Some(f) = f.take() {
                out = Some(f(row)?);
            }
            Ok(false)
        })?;
        out.ok_or(DbError::NoRows)
    }

    /// Runs an `INSERT ... RETURNING id` and gives the id.
    pub fn insert(&mut self, params: impl Params) -> DbResult<i64> {
        self.query_row(params, |r| r.get(0))
    }

    pub fn exists(&mut self, params: impl Params) -> DbResult<bool> {
        let mut found = false;
        self.for_each(params, |_| {
            found = true;
            Ok(false)
        })?;
        Ok(found)
    }

    /// Calls `f` on each row until it returns `false`.
    pub fn for_each(
        &mut self,
        params: impl Params,
        mut f: impl FnMut(&Row<'_>) -> DbResult<bool>,
    ) -> DbResult<()> {
        match self {
            Stmt::Lite(s) => params.with_args(|args| {
                let mut rows = s.query(rusqlite::params_from_iter(args.iter()))?;
                while let Some(r) = rows.next()? {
                    if !f(&Row::Lite(r))? {
                        break;
                    }
                }
                Ok(())
            }),
            Stmt::Pg { conn, sql, .. } => {
                let rows = params.with_args(|args| conn.query(sql, args))?;
                for r in &rows {
                    if !f(&Row::Pg(r))? {
                        break;
                    }
                }
                Ok(())
            }
        }
    }
}
