//! What gitplane's tests start and wait on, real and never left behind.
//!
//! - [`Postgres`]: a real PostgreSQL server per test (or one per test process, [`shared`]);
//! - [`webdriver`]: chromedriver and a headless Chromium session for the status page's tests;
//! - [`eventually`]: waiting for an event with a deadline and a message, instead of a sleep;
//! - [`HttpServer`]: an HTTP server on 127.0.0.1 answering with a closure, logging every request;
//! - [`DriverServer`]: an HTTP driver (the Humanitec Driver Interface) on it, with scripted
//!   behaviours per resource type (polls, delays, failures, drift) and a log of calls.
//!
//! [`Postgres::start`] runs `initdb` into a temporary directory and `pg_ctl start` on a free port
//! of 127.0.0.1, with trust authentication so that tests connect as `postgres` without a
//! password, and with durability traded for speed (`fsync`, `full_page_writes` off). As root,
//! which initdb and the server refuse, every PostgreSQL program runs as the `postgres` user
//! through `runuser`.
//!
//! Nothing is left behind: each server has a watchdog process that stops it and removes its
//! directory as soon as the [`Postgres`] is dropped or the test process dies, however it dies
//! (see `watchdog.rs`). The server of [`shared`] lives in a static, which is never dropped: an
//! `atexit` handler lets go of its watchdog and waits for it, so a test binary has stopped its
//! server before it exits.
//!
//! ```no_run
//! let Some(server) = gitplane_testkit::shared_or_skip("a_test") else {
//!     return;
//! };
//! let url = server.database(); // postgres://postgres@127.0.0.1:PORT/gitplane_N, empty
//! ```

mod driver_server;
mod eventually;
mod http_server;
mod session;
mod tools;
mod watchdog;
pub mod webdriver;

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError, TryLockError};
use std::thread;
use std::time::{Duration, Instant};

pub use driver_server::{Behavior, DriverServer, Received, url_encoded};
pub use eventually::{eventually, eventually_or, poll};
pub use http_server::{HttpServer, Logged, Reply, Request};
pub use session::Session;
use tools::{Tools, Unavailable, run};
use watchdog::Watchdog;

/// How long a server may take to accept connections, and to stop.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many free ports to try when another process binds ours between our look and the server's.
const PORT_ATTEMPTS: usize = 5;
/// How much of the server's log an error quotes.
const LOG_TAIL_LINES: usize = 20;
/// The start of every server's directory name, so that a leftover is easy to find:
/// `pgrep -f gitplane-testkit`.
const DIR_PREFIX: &str = "gitplane-testkit-";

/// A PostgreSQL server of its own, in a temporary directory, on a free port of 127.0.0.1;
/// stopped (`pg_ctl stop -m immediate`) and removed when dropped.
pub struct Postgres {
    tools: Tools,
    /// Holds `data/` (the cluster), the server's Unix socket and `server.log`; the watchdog
    /// removes it.
    dir: PathBuf,
    port: u16,
    /// Numbers the databases of [`Postgres::database`], so that each name is new on this server.
    databases: AtomicU32,
    /// Letting go of the watchdog stops the server. Behind a mutex so that the `atexit` handler
    /// can take it out of the shared server, which lives in a static.
    watchdog: Mutex<Option<Watchdog>>,
}

/// Why [`Postgres::start`] failed: skipping is right only when PostgreSQL is not there at all.
enum StartError {
    Unavailable(String),
    Failed(String),
}

impl From<Unavailable> for StartError {
    fn from(Unavailable(why): Unavailable) -> StartError {
        StartError::Unavailable(why)
    }
}

impl From<String> for StartError {
    fn from(why: String) -> StartError {
        StartError::Failed(why)
    }
}

impl StartError {
    fn into_message(self) -> String {
        match self {
            StartError::Unavailable(why) | StartError::Failed(why) => why,
        }
    }
}

impl Postgres {
    /// Starts one, or Err(why) when this machine cannot (no initdb/pg_ctl found in PATH or in
    /// /usr/lib/postgresql/*/bin, no `postgres` user when root...) or the server did not start
    /// (then why ends with the server's log). Callers print "skipped: <why>" and return, or use
    /// [`postgres_or_skip`], which skips only when PostgreSQL is not there at all.
    pub fn start() -> Result<Postgres, String> {
        Postgres::try_start().map_err(StartError::into_message)
    }

    fn try_start() -> Result<Postgres, StartError> {
        let tools = Tools::find()?;
        // Root's own temporary directory may be out of the postgres user's reach.
        let parent = match tools.run_as {
            Some(_) => PathBuf::from("/tmp"),
            None => std::env::temp_dir(),
        };
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in(&parent)
            .map_err(|e| format!("cannot create a directory in {}: {e}", parent.display()))?
            .keep();
        // From here on the watchdog removes the directory, whether we fail, return or die.
        let stop = [
            tools.argv("pg_ctl"),
            stop_args(&dir.join("data"), "immediate"),
        ]
        .concat();
        let watchdog = Watchdog::spawn(&dir, &stop).map_err(|e| {
            let _ = fs::remove_dir_all(&dir);
            format!("cannot start the watchdog of a test server (sh): {e}")
        })?;
        let mut server = Postgres {
            tools,
            dir,
            port: 0,
            databases: AtomicU32::new(0),
            watchdog: Mutex::new(Some(watchdog)),
        };
        server.init()?;
        server.port = server.start_on_a_free_port()?;
        Ok(server)
    }

    /// A fresh, empty database on it (CREATE DATABASE with a unique name), as a URL:
    /// postgres://postgres@127.0.0.1:PORT/NAME (trust auth for local TCP, no password).
    /// Panics only on a broken server.
    pub fn database(&self) -> String {
        let name = format!(
            "gitplane_{}",
            self.databases.fetch_add(1, Ordering::Relaxed) + 1
        );
        if let Err(why) = self.psql(&self.url("postgres"), &format!("CREATE DATABASE {name}")) {
            panic!(
                "cannot create database {name} on the test server on port {}: {why}",
                self.port
            );
        }
        self.url(&name)
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `sql` with `psql` on the database at `url` and returns what it printed: one row a
    /// line, columns separated by `|`, no headers (`psql -At`). Err carries psql's message.
    pub fn psql(&self, url: &str, sql: &str) -> Result<String, String> {
        let output = run(
            self.tools.command("psql", &self.dir).args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url,
                "-c",
                sql,
            ]),
            "psql",
        )?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A `psql` session on the database at `url` that stays open until dropped, for a test
    /// that holds a transaction while something else runs.
    pub fn session(&self, url: &str) -> Result<Session, String> {
        Session::open(self.tools.command("psql", &self.dir), url)
    }

    /// Stops the server (fast) and starts it again on the same port and data dir; returns
    /// when it accepts connections again. For "survives a database restart" tests; not for the
    /// [`shared`] server, whose other tests would see their connections fail.
    pub fn restart(&self) {
        self.stop();
        self.start_again();
    }

    /// Stops the server (`pg_ctl stop -m fast`: connections are ended, nothing is lost).
    /// Panics if it does not stop within 30 s.
    pub fn stop(&self) {
        let data = self.data_dir();
        let mut pg_ctl = self.tools.command("pg_ctl", &self.dir);
        if let Err(why) = run(pg_ctl.args(stop_args(&data, "fast")), "pg_ctl stop") {
            panic!("cannot stop the test server on port {}: {why}", self.port);
        }
    }

    /// Starts the server [`Postgres::stop`] stopped, on the same port; returns when it accepts
    /// connections. Panics if it does not within 30 s (with the server's log).
    pub fn start_again(&self) {
        if let Err(why) = self.run_server() {
            panic!(
                "cannot start the test server again on port {}: {why}",
                self.port
            );
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Freezes the server (SIGSTOP to the postmaster and every backend) until the returned
    /// guard is dropped: connections stay open and every query hangs, as on a database host
    /// that stopped answering. For "a database that hangs" tests; not for the [`shared`] server.
    pub fn freeze(&self) -> Frozen {
        let pid_file = self.data_dir().join("postmaster.pid");
        let postmaster: u32 = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next().and_then(|l| l.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no postmaster pid in {}", pid_file.display()));
        let mut pids = vec![postmaster];
        pids.extend(children_of(postmaster));
        signal(&pids, "STOP");
        Frozen { pids }
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates the cluster and configures the server: TCP on 127.0.0.1 only, and the socket in
    /// its own directory rather than /var/run/postgresql, where an installed server has its own.
    fn init(&self) -> Result<(), String> {
        if let Some(user) = &self.tools.run_as {
            std::os::unix::fs::chown(&self.dir, Some(user.uid), Some(user.gid)).map_err(|e| {
                format!(
                    "cannot give {} to the postgres user: {e}",
                    self.dir.display()
                )
            })?;
        }
        run(
            self.tools
                .command("initdb", &self.dir)
                .arg("-D")
                .arg(self.data_dir())
                .args(["-A", "trust", "-U", "postgres", "--locale=C", "-E", "UTF8"])
                .arg("--no-sync"),
            "initdb",
        )?;
        let socket_dir = self
            .dir
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", self.dir.display()))?;
        self.configure(&format!(
            "\n# gitplane-testkit\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = {}\n\
             fsync = off\n\
             full_page_writes = off\n\
             max_connections = 200\n",
            quoted(socket_dir)
        ))
    }

    /// Appends to postgresql.conf, where a later line wins over an earlier one.
    fn configure(&self, settings: &str) -> Result<(), String> {
        let path = self.data_dir().join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(settings.as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Starts the server on a port that was free a moment ago; another process may take it
    /// first, and then the next one is tried.
    fn start_on_a_free_port(&mut self) -> Result<u16, String> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.port = free_port()?;
            self.configure(&format!("port = {}\n", self.port))?;
            let log_before = fs::metadata(self.log_file()).map_or(0, |m| m.len());
            match self.run_server() {
                Ok(()) => return Ok(self.port),
                Err(_) if attempt < PORT_ATTEMPTS && self.port_was_taken(log_before) => {}
                Err(why) => return Err(why),
            }
        }
    }

    fn port_was_taken(&self, log_before: u64) -> bool {
        fs::read(self.log_file()).is_ok_and(|log| {
            let since =
                usize::try_from(log_before).map_or(&[][..], |at| log.get(at..).unwrap_or(&[]));
            String::from_utf8_lossy(since).contains("Address already in use")
        })
    }

    /// Starts the configured server and waits until it accepts connections over TCP.
    fn run_server(&self) -> Result<(), String> {
        let started = Instant::now();
        let mut pg_ctl = self.tools.command("pg_ctl", &self.dir);
        pg_ctl
            .args(["start", "-s", "-w", "-t"])
            .arg(READY_TIMEOUT.as_secs().to_string())
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_file());
        if let Err(why) = run(&mut pg_ctl, "pg_ctl start") {
            return Err(format!("{why}\n{}", self.log_tail()));
        }
        // pg_ctl waits for the server's own word in postmaster.pid; tests come by TCP, so ask
        // there too.
        let port = self.port.to_string();
        loop {
            let ready = self
                .tools
                .command("pg_isready", &self.dir)
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
                .args(["-d", "postgres", "-t", "1"])
                .status()
                .map_err(|e| format!("could not run pg_isready: {e}"))?;
            if ready.success() {
                return Ok(());
            }
            if started.elapsed() >= READY_TIMEOUT {
                return Err(format!(
                    "the server on port {port} did not accept connections within {} s\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.log_tail()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read(self.log_file()).unwrap_or_default();
        let log = String::from_utf8_lossy(&log);
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("{} ends with:\n{tail}", self.log_file().display())
    }

    /// Stops the server and removes its directory now, for the shared server at exit. Never
    /// panics: it runs from `atexit`.
    fn let_go(&self) {
        let watchdog = match self.watchdog.try_lock() {
            Ok(mut slot) => slot.take(),
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().take(),
            Err(TryLockError::WouldBlock) => None,
        };
        drop(watchdog);
    }
}

/// `pg_ctl stop` of the cluster in `data`, bounded like a start.
fn stop_args(data: &Path, mode: &str) -> Vec<std::ffi::OsString> {
    let timeout = READY_TIMEOUT.as_secs().to_string();
    ["stop", "-s", "-w", "-t", &timeout, "-m", mode, "-D"]
        .into_iter()
        .map(Into::into)
        .chain([data.as_os_str().to_owned()])
        .collect()
}

/// A string literal of postgresql.conf.
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Ports this process has handed to a server: once our probe's listener is closed the kernel
/// may offer the same port again, before the first server has bound it.
static PORTS_GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port of 127.0.0.1 that was free a moment ago and no other server of ours has been given.
fn free_port() -> Result<u16, String> {
    let mut given = PORTS_GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    for _ in 0..100 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?
            .port();
        if given.insert(port) {
            return Ok(port);
        }
    }
    Err("no free port on 127.0.0.1 that this process has not used already".into())
}

/// Starts a server, or prints "skipped {test}: {why}" to stderr and returns None when this
/// machine has no PostgreSQL to start. Panics when PostgreSQL is there but its server fails to
/// start: that is a broken test set-up, not a reason to skip.
pub fn postgres_or_skip(test: &str) -> Option<Postgres> {
    match Postgres::try_start() {
        Ok(server) => Some(server),
        Err(StartError::Unavailable(why)) => {
            eprintln!("skipped {test}: {why}");
            None
        }
        Err(StartError::Failed(why)) => panic!("{test}: cannot start a PostgreSQL server: {why}"),
    }
}

/// One server for the whole test process, started on first use; give each test its own
/// [`Postgres::database`]. Stopped and removed when the process exits.
pub fn shared() -> Result<&'static Postgres, String> {
    shared_server().as_ref().map_err(|error| match error {
        StartError::Unavailable(why) | StartError::Failed(why) => why.clone(),
    })
}

/// [`shared`], or None after printing "skipped {test}: {why}" when this machine has no
/// PostgreSQL; panics, like [`postgres_or_skip`], when it has one that fails to start.
pub fn shared_or_skip(test: &str) -> Option<&'static Postgres> {
    match shared_server() {
        Ok(server) => Some(server),
        Err(StartError::Unavailable(why)) => {
            eprintln!("skipped {test}: {why}");
            None
        }
        Err(StartError::Failed(why)) => panic!("{test}: cannot start a PostgreSQL server: {why}"),
    }
}

static SHARED: OnceLock<Result<Postgres, StartError>> = OnceLock::new();

fn shared_server() -> &'static Result<Postgres, StartError> {
    SHARED.get_or_init(|| {
        let started = Postgres::try_start();
        if started.is_ok() {
            // Were it not registered, the watchdog would still stop the server, but only
            // after the process is gone, racing whatever looks next.
            atexit(let_go_of_the_shared_server);
        }
        started
    })
}

// The C library's, which std links: runs a handler when the process exits normally, which is
// how a test binary ends, whether its tests pass or fail.
unsafe extern "C" {
    safe fn atexit(handler: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn let_go_of_the_shared_server() {
    if let Some(Ok(server)) = SHARED.get() {
        server.let_go();
    }
}

#[cfg(test)]
mod tests;

/// A frozen server ([`Postgres::freeze`]); it goes on when this is dropped.
pub struct Frozen {
    pids: Vec<u32>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.pids, "CONT");
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`: the fields after the last `)`.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn signal(pids: &[u32], name: &str) {
    // One at a time: a backend that ended meanwhile must not keep the others from their signal.
    for pid in pids {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
