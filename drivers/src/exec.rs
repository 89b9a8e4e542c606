//! The `exec` driver: runs a program registered in the host config, JSON in and out.
//!
//! One call is one run of the program, without a shell: the request goes to its stdin as one
//! line of JSON, and its stdout must hold one JSON response. A non-zero exit is a failure that
//! records the end of stderr (exit code 75, `EX_TEMPFAIL`, asks for a retry); a run that takes
//! longer than the time limit is killed, with every process it started, and retried.
//!
//! How a program is run ([`run_program`]: a clean environment, its own process group, bounded
//! output, a deadline, [`kill_running`]) serves the `terraform` driver too.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use gitplane_core::model::template::kind_of;

use super::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, MAX_COOKIE_BYTES, Manifest,
    PutOutcome,
};

/// The exit code that asks for a retry (`EX_TEMPFAIL` from `sysexits.h`).
pub const EXIT_TEMPFAIL: i32 = 75;
/// How much of the end of stderr an error message quotes.
const STDERR_TAIL_BYTES: usize = 2_000;
/// How much of the end of stderr is kept while the program runs (redaction works on this).
const STDERR_KEEP_BYTES: usize = 64 * 1024;
/// The largest response read from stdout; more is an error.
const MAX_STDOUT_BYTES: usize = 16 * 1024 * 1024;
/// Secret strings shorter than this are not redacted from stderr (they would garble it).
const MIN_REDACTED_LEN: usize = 4;
/// How often a running program is checked on.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long to wait for the rest of stderr once the program was killed.
const KILL_GRACE: Duration = Duration::from_millis(200);

/// Runs `command` (no shell) once per call.
#[derive(Debug, Clone)]
pub struct ExecDriver {
    command: Vec<String>,
    timeout: Duration,
    /// What the program may see of gitplane's environment: these names and [`BASE_ENV`].
    env: Vec<String>,
}

/// What every program gets of gitplane's environment. Nothing else passes unless the driver's
/// `env` names it: a credential gitplane reads from its environment for one definition's
/// account must not reach the programs of every other definition.
const BASE_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

impl ExecDriver {
    pub fn new(command: Vec<String>, timeout: Duration, env: Vec<String>) -> Self {
        ExecDriver {
            command,
            timeout,
            env,
        }
    }

    /// The environment the program runs with.
    fn environment(&self) -> Vec<(String, std::ffi::OsString)> {
        BASE_ENV
            .iter()
            .copied()
            .chain(self.env.iter().map(String::as_str))
            .filter_map(|name| Some((name.to_owned(), std::env::var_os(name)?)))
            .collect()
    }

    /// Runs the program once for `operation` and returns its checked response.
    fn call(&self, operation: &str, request: &DriverRequest<'_>) -> Result<Response, DriverError> {
        let mut body = serde_json::to_vec(&request_json(operation, request))
            .map_err(|e| DriverError::final_error(format!("cannot encode the request: {e}")))?;
        body.push(b'\n');
        let redact = secret_strings(request);
        let stdout = self.run(body, &redact)?;
        parse_response(&stdout)
    }

    /// Runs the program with `stdin` and returns its stdout after a zero exit.
    fn run(&self, stdin: Vec<u8>, redact: &[String]) -> Result<Vec<u8>, DriverError> {
        let Some((program, args)) = self.command.split_first() else {
            return Err(DriverError::final_error("the exec driver has no command"));
        };
        let run = run_program(Program {
            program: program.as_ref(),
            args,
            env: self.environment(),
            dir: None,
            stdin: Some(stdin),
            deadline: Instant::now() + self.timeout,
            stdout: Keep::Whole,
            interrupt: None,
        });
        let exited = match run {
            Ok(exited) => exited,
            Err(RunFailure::Start(e)) => {
                return Err(DriverError::final_error(format!(
                    "cannot start {program}: {e}"
                )));
            }
            Err(RunFailure::Wait(e)) => {
                return Err(DriverError::transient(format!(
                    "cannot wait for {program}: {e}"
                )));
            }
            Err(RunFailure::TimedOut { stderr, .. }) => {
                return Err(DriverError::transient(with_tail(
                    format!(
                        "{program} timed out after {:?} and was killed",
                        self.timeout
                    ),
                    &render_tail(&stderr, redact),
                )));
            }
            Err(RunFailure::HeldOpen { stderr }) => {
                return Err(DriverError::transient(with_tail(
                    format!(
                        "{program} timed out after {:?}: it exited, but a process it started kept \
                         its stdout or stderr open and was killed",
                        self.timeout
                    ),
                    &render_tail(&stderr, redact),
                )));
            }
        };
        if !exited.status.success() {
            let message = with_tail(
                describe_exit(program, exited.status),
                &render_tail(&exited.stderr, redact),
            );
            return Err(if exited.status.code() == Some(EXIT_TEMPFAIL) {
                DriverError::transient(message)
            } else {
                DriverError::final_error(message)
            });
        }
        exited.stdout.map_err(|e| {
            DriverError::final_error(format!("cannot read the stdout of {program}: {e}"))
        })
    }
}

/// One run of a program as drivers run them: started directly (no shell) with exactly `env`, in
/// a process group of its own, killed with that whole group at `deadline`.
pub struct Program<'a> {
    pub program: &'a std::ffi::OsStr,
    pub args: &'a [String],
    pub env: Vec<(String, std::ffi::OsString)>,
    /// The working directory; `None`: gitplane's.
    pub dir: Option<&'a std::path::Path>,
    /// Written to stdin, which is then closed; `None`: stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    pub deadline: Instant,
    /// What is kept of stdout.
    pub stdout: Keep,
    /// At the deadline, first SIGINT to the group and this long to exit on its own: a program
    /// that saves its work when interrupted (Terraform writes its state) gets to.
    pub interrupt: Option<Duration>,
}

/// What is kept of a program's stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// All of it, up to `MAX_STDOUT_BYTES`; more is an error.
    Whole,
    /// Its last `STDERR_KEEP_BYTES`, like stderr.
    Tail,
}

/// A program that ran to its end.
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: std::io::Result<Vec<u8>>,
    /// The last `STDERR_KEEP_BYTES` of stderr.
    pub stderr: Vec<u8>,
}

/// A program that did not run to its end.
pub enum RunFailure {
    Start(std::io::Error),
    Wait(std::io::Error),
    /// Killed with its group at the deadline; what it wrote so far.
    TimedOut {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    /// It exited, but something it started kept stdout or stderr open past the deadline.
    HeldOpen {
        stderr: Vec<u8>,
    },
}

/// Runs `p` to its end or its deadline; its group is in [`kill_running`]'s reach meanwhile.
pub fn run_program(p: Program<'_>) -> Result<Exited, RunFailure> {
    let mut command = Command::new(p.program);
    command
        .args(p.args)
        .env_clear()
        .envs(p.env)
        .stdin(if p.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a time-out kills whatever it started too.
        .process_group(0);
    if let Some(dir) = p.dir {
        command.current_dir(dir);
    }
    let mut child = command.spawn().map_err(RunFailure::Start)?;
    let _running = Running::register(child.id());
    let deadline = p.deadline;

    // Every pipe on its own thread: a child that writes a lot before reading its stdin, or
    // fills stderr, must not block on us.
    if let (Some(mut pipe), Some(stdin)) = (child.stdin.take(), p.stdin) {
        thread::spawn(move || {
            // A program that does not read its input closes the pipe: not our failure.
            let _ = pipe.write_all(&stdin);
        });
    }
    let out_tail = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().map(|pipe| match p.stdout {
        Keep::Whole => Stdout::Whole(read_stdout(pipe)),
        Keep::Tail => Stdout::Tail(read_tail(pipe, out_tail.clone())),
    });
    let tail = Arc::new(Mutex::new(Vec::new()));
    let stderr = child
        .stderr
        .take()
        .map(|pipe| read_tail(pipe, tail.clone()));
    let kept = |t: &Arc<Mutex<Vec<u8>>>| t.lock().unwrap_or_else(|e| e.into_inner()).clone();

    let status = match wait_until(&mut child, deadline) {
        Ok(Some(status)) => status,
        Ok(None) => {
            if let Some(grace) = p.interrupt {
                interrupt_group(child.id());
                let _ = wait_until(&mut child, Instant::now() + grace);
            }
            kill(&mut child);
            if let Some(done) = &stderr {
                let _ = done.recv_timeout(KILL_GRACE);
            }
            if let Some(Stdout::Tail(done)) = &stdout {
                let _ = done.recv_timeout(KILL_GRACE);
            }
            return Err(RunFailure::TimedOut {
                stdout: kept(&out_tail),
                stderr: kept(&tail),
            });
        }
        Err(e) => {
            kill(&mut child);
            return Err(RunFailure::Wait(e));
        }
    };

    // The program is gone; its pipes close once every process it started is gone too.
    let stdout = match stdout {
        None => Ok(Ok(Vec::new())),
        Some(Stdout::Whole(rx)) => rx.recv_timeout(remaining(deadline)),
        Some(Stdout::Tail(rx)) => rx
            .recv_timeout(remaining(deadline))
            .map(|()| Ok(kept(&out_tail))),
    };
    let stderr_done = match &stderr {
        None => Ok(()),
        Some(rx) => rx.recv_timeout(remaining(deadline)),
    };
    if matches!(stdout, Err(RecvTimeoutError::Timeout))
        || matches!(stderr_done, Err(RecvTimeoutError::Timeout))
    {
        kill_group(child.id());
        return Err(RunFailure::HeldOpen {
            stderr: kept(&tail),
        });
    }
    Ok(Exited {
        status,
        stdout: stdout.unwrap_or_else(|_| Err(std::io::Error::other("its reader stopped"))),
        stderr: kept(&tail),
    })
}

/// The reader of a program's stdout.
enum Stdout {
    Whole(Receiver<std::io::Result<Vec<u8>>>),
    Tail(Receiver<()>),
}

impl Driver for ExecDriver {
    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let response = self.call("put", request)?;
        Ok(match response.status {
            Status::Pending => PutOutcome::InProgress {
                cookie: response.cookie,
            },
            Status::Done => PutOutcome::Done {
                outputs: response.values,
                secret_outputs: response.secrets,
                cookie: response.cookie,
                manifests: response.manifests,
            },
        })
    }

    fn delete(&self, request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        let response = self.call("delete", request)?;
        Ok(match response.status {
            Status::Pending => DeleteOutcome::InProgress {
                cookie: response.cookie,
            },
            Status::Done => DeleteOutcome::Done,
        })
    }
}

/// The JSON the program reads on stdin.
fn request_json(operation: &str, request: &DriverRequest<'_>) -> Value {
    let mut secrets = request.secrets.clone();
    if let Some(account) = request.account {
        match &mut secrets {
            Value::Object(map) => {
                map.insert("account".to_owned(), account.clone());
            }
            _ => secrets = json!({ "account": account }),
        }
    }
    json!({
        "operation": operation,
        "guresid": request.guresid,
        "type": request.res_type,
        "class": request.class,
        "id": request.res_id,
        "app": request.app,
        "env": request.env,
        "resource": request.resource,
        "driver": { "values": request.values, "secrets": secrets },
        "cookie": request.cookie,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Done,
    Pending,
}

/// A checked response: `values` and `secrets` are JSON objects.
#[derive(Debug)]
struct Response {
    status: Status,
    values: Value,
    secrets: Value,
    cookie: Cookie,
    manifests: Vec<Manifest>,
}

/// Checks the program's stdout. Messages say what is wrong and never quote it: it may hold
/// secrets.
fn parse_response(stdout: &[u8]) -> Result<Response, DriverError> {
    let bad =
        |what: String| DriverError::final_error(format!("stdout is not a JSON response: {what}"));
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("it is empty".to_owned()));
    }
    let value: Value = serde_json::from_slice(stdout).map_err(|e| bad(e.to_string()))?;
    let Value::Object(mut response) = value else {
        return Err(bad(format!("expected an object, got {}", kind_of(&value))));
    };
    let status = match response.get("status") {
        Some(Value::String(s)) if s == "done" => Status::Done,
        Some(Value::String(s)) if s == "pending" => Status::Pending,
        Some(Value::String(_)) => {
            return Err(bad(r#""status" must be "done" or "pending""#.to_owned()));
        }
        Some(other) => {
            return Err(bad(format!(
                r#""status" must be "done" or "pending", got {}"#,
                kind_of(other)
            )));
        }
        None => return Err(bad(r#"it has no "status""#.to_owned())),
    };
    let cookie = match response.remove("cookie") {
        None => Cookie::Unchanged,
        Some(Value::Null) => Cookie::Cleared,
        Some(Value::String(s)) if s.len() > MAX_COOKIE_BYTES => {
            return Err(DriverError::final_error(format!(
                "the response's cookie is {} bytes, more than the {MAX_COOKIE_BYTES} allowed",
                s.len()
            )));
        }
        Some(Value::String(s)) => Cookie::Set(s),
        Some(other) => {
            return Err(bad(format!(
                r#""cookie" must be a string or null, got {}"#,
                kind_of(&other)
            )));
        }
    };
    let mut resource = match response.remove("resource") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(bad(format!(
                r#""resource" must be an object, got {}"#,
                kind_of(&other)
            )));
        }
    };
    let mut object = |key: &str| match resource.remove(key) {
        None | Some(Value::Null) => Ok(Value::Object(Map::new())),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(other) => Err(bad(format!(
            r#""resource.{key}" must be an object, got {}"#,
            kind_of(&other)
        ))),
    };
    let values = object("values")?;
    let secrets = object("secrets")?;
    let manifests = Manifest::list_from(
        response.remove("manifests").unwrap_or(Value::Null),
        "manifests",
    )
    .map_err(bad)?;
    Ok(Response {
        status,
        values,
        secrets,
        cookie,
        manifests,
    })
}

/// Waits for the child until `deadline`: `None` when it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let left = remaining(deadline);
        if left.is_zero() {
            return Ok(None);
        }
        thread::sleep(left.min(POLL_INTERVAL));
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The process groups of the programs running now, for [`kill_running`].
static RUNNING: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// A program's entry in [`RUNNING`], removed when its run ends (after it was reaped, so its
/// group id cannot have been reused yet).
struct Running(u32);

impl Running {
    fn register(group: u32) -> Running {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(group);
        Running(group)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// Kills every program running now with its process group (gitplane is stopping and will not
/// wait for them); returns how many there were.
pub fn kill_running() -> usize {
    let running = std::mem::take(&mut *RUNNING.lock().unwrap_or_else(|e| e.into_inner()));
    for group in &running {
        kill_group(*group);
    }
    running.len()
}

/// Kills the child and everything in its process group, and reaps it.
fn kill(child: &mut Child) {
    // The group first: until the child is reaped its pid (the group's id) cannot be reused.
    kill_group(child.id());
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends SIGINT to process group `pgid`, as Ctrl-C at a terminal would, best effort.
fn interrupt_group(pgid: u32) {
    if let Some(pgid) = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::INT);
    }
}

/// Sends SIGKILL to process group `pgid`, best effort (the group may be gone already).
fn kill_group(pgid: u32) {
    if let Some(pgid) = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

/// Reads stdout to its end on a thread; the receiver gets it (at most `MAX_STDOUT_BYTES`).
fn read_stdout(mut pipe: impl Read + Send + 'static) -> Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut out = Vec::new();
        let mut chunk = [0u8; 8192];
        let mut too_big = false;
        let result = loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) if out.len() + n > MAX_STDOUT_BYTES => too_big = true, // drain, keep nothing
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let _ = tx.send(result.and_then(|()| {
            if too_big {
                Err(std::io::Error::other(format!(
                    "it is larger than {MAX_STDOUT_BYTES} bytes"
                )))
            } else {
                Ok(out)
            }
        }));
    });
    rx
}

/// Keeps the end of a pipe (stderr) in `tail` on a thread; the receiver hears when it is closed.
fn read_tail(mut pipe: impl Read + Send + 'static, tail: Arc<Mutex<Vec<u8>>>) -> Receiver<()> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    tail.extend_from_slice(&chunk[..n]);
                    if tail.len() > STDERR_KEEP_BYTES {
                        let cut = tail.len() - STDERR_KEEP_BYTES;
                        tail.drain(..cut);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    rx
}

/// The last `STDERR_TAIL_BYTES` of stderr as text, with the request's secrets redacted.
pub fn render_tail(kept: &[u8], redact: &[String]) -> String {
    redacted_tail(kept, redact, STDERR_TAIL_BYTES)
}

/// The last `max` bytes of `kept` as text, every string of `redact` in it replaced first.
pub fn redacted_tail(kept: &[u8], redact: &[String], max: usize) -> String {
    let mut text = String::from_utf8_lossy(kept).into_owned();
    for secret in redact {
        text = text.replace(secret.as_str(), "[redacted]");
    }
    let text = text.trim();
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

pub fn with_tail(message: String, tail: &str) -> String {
    if tail.is_empty() {
        format!("{message} (stderr is empty)")
    } else {
        format!("{message}; stderr: {tail}")
    }
}

pub fn describe_exit(program: &str, status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("{program} exited with code {code}"),
        (None, Some(signal)) => format!("{program} was killed by signal {signal}"),
        (None, None) => format!("{program} failed ({status})"),
    }
}

/// The strings a message must never show: every secret leaf, the account and the cookie,
/// longest first so that a secret holding another is redacted whole.
fn secret_strings(request: &DriverRequest<'_>) -> Vec<String> {
    let cookie = request.cookie.map(|c| Value::String(c.to_owned()));
    let parsed = request
        .cookie
        .and_then(|c| serde_json::from_str::<Value>(c).ok());
    redaction_list(
        [
            Some(request.secrets),
            request.account,
            cookie.as_ref(),
            parsed.as_ref(),
        ]
        .into_iter()
        .flatten(),
    )
}

/// Every string and number in `values`, at least `MIN_REDACTED_LEN` long, longest first so that
/// a secret holding another is redacted whole.
pub fn redaction_list<'v>(values: impl IntoIterator<Item = &'v Value>) -> Vec<String> {
    let mut out = Vec::new();
    for value in values {
        super::leaks::leaves(value, &mut out);
    }
    out.retain(|s| s.len() >= MIN_REDACTED_LEN);
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    use super::super::ErrorKind;
    use super::super::test_request::{Inputs, request};
    use super::*;

    /// Writes an executable `#!/bin/sh` script into `dir`.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn driver(command: &Path, timeout: Duration) -> ExecDriver {
        ExecDriver::new(vec![command.display().to_string()], timeout, Vec::new())
    }

    fn inputs() -> Inputs {
        Inputs {
            resource: json!({"size": 3}),
            values: json!({"region": "eu-west-1"}),
            secrets: json!({"password": "hunter2-secret"}),
            account: None,
        }
    }

    /// Runs a call again when another test thread's fork held the fresh script open for
    /// writing ("Text file busy"): a hazard of writing and running scripts in one process.
    fn retry_busy<T>(mut call: impl FnMut() -> Result<T, DriverError>) -> Result<T, DriverError> {
        for _ in 0..20 {
            match call() {
                Err(e) if e.message.contains("os error 26") => {
                    thread::sleep(Duration::from_millis(20))
                }
                other => return other,
            }
        }
        call()
    }

    fn put(d: &ExecDriver, r: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        retry_busy(|| d.put(r))
    }

    fn delete(d: &ExecDriver, r: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        retry_busy(|| d.delete(r))
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn put_done_sends_the_request_and_returns_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("request.json");
        let prog = script(
            dir.path(),
            "driver",
            &format!(
                r#"cat > '{}'
printf '%s\n' '{{"status":"done","resource":{{"values":{{"host":"db.local","port":5432}},"secrets":{{"password":"p4ss"}}}},"cookie":"c1"}}'"#,
                seen.display()
            ),
        );
        let mut inputs = inputs();
        inputs.account = Some(json!({"token": "acct-token"}));
        let outcome = put(&driver(&prog, LONG), &request(&inputs, Some("old-cookie"))).unwrap();
        assert_eq!(
            outcome,
            PutOutcome::Done {
                outputs: json!({"host": "db.local", "port": 5432}),
                secret_outputs: json!({"password": "p4ss"}),
                cookie: Cookie::Set("c1".into()),
                manifests: Vec::new(),
            }
        );
        let text = std::fs::read_to_string(&seen).unwrap();
        assert_eq!(text.lines().count(), 1, "one line of JSON: {text}");
        let sent: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            sent,
            json!({
                "operation": "put",
                "guresid": "0123456789abcdef0123456789abcdef01234567",
                "type": "postgres",
                "class": "default",
                "id": "modules.web.externals.db",
                "app": "shop",
                "env": "dev",
                "resource": {"size": 3},
                "driver": {
                    "values": {"region": "eu-west-1"},
                    "secrets": {"password": "hunter2-secret", "account": {"token": "acct-token"}},
                },
                "cookie": "old-cookie",
            })
        );
    }

    #[test]
    fn arguments_are_passed_and_absent_fields_mean_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            r#"cat > /dev/null
printf '{"status":"done","resource":{"values":{"args":"%s %s"}}}' "$1" "$2""#,
        );
        let d = ExecDriver::new(
            vec![prog.display().to_string(), "--zone".into(), "a b".into()],
            LONG,
            Vec::new(),
        );
        let mut inputs = inputs();
        inputs.secrets = Value::Null;
        inputs.account = Some(json!("k"));
        let outcome = put(&d, &request(&inputs, None)).unwrap();
        assert_eq!(
            outcome,
            PutOutcome::Done {
                outputs: json!({"args": "--zone a b"}),
                secret_outputs: json!({}),
                cookie: Cookie::Unchanged,
                manifests: Vec::new(),
            }
        );
    }

    #[test]
    fn pending_then_done_through_the_cookie() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            r#"req=$(cat)
case "$req" in
  *'"cookie":null'*) printf '{"status":"pending","cookie":"step-1"}' ;;
  *'"cookie":"step-1"'*) printf '{"status":"done","resource":{"values":{"ready":true}},"cookie":null}' ;;
  *) echo "unexpected request" >&2; exit 1 ;;
esac"#,
        );
        let d = driver(&prog, LONG);
        let inputs = inputs();
        let first = put(&d, &request(&inputs, None)).unwrap();
        assert_eq!(
            first,
            PutOutcome::InProgress {
                cookie: Cookie::Set("step-1".into())
            }
        );
        let second = put(&d, &request(&inputs, Some("step-1"))).unwrap();
        assert_eq!(
            second,
            PutOutcome::Done {
                outputs: json!({"ready": true}),
                secret_outputs: json!({}),
                cookie: Cookie::Cleared,
                manifests: Vec::new(),
            }
        );
    }

    #[test]
    fn non_zero_exit_is_final_with_the_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        // 3 000 bytes of noise, then the line that matters: only the tail is kept.
        let prog = script(
            dir.path(),
            "driver",
            r#"cat > /dev/null
i=0
while [ $i -lt 100 ]; do printf 'noise-noise-noise-noise-noise\n' >&2; i=$((i+1)); done
echo "the zone does not exist" >&2
exit 3"#,
        );
        let err = put(&driver(&prog, LONG), &request(&inputs(), None)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        assert!(
            err.message.contains("exited with code 3"),
            "{}",
            err.message
        );
        assert!(
            err.message.ends_with("the zone does not exist"),
            "{}",
            err.message
        );
        let tail = err.message.split("stderr: ").nth(1).unwrap();
        assert!(
            tail.len() <= STDERR_TAIL_BYTES + "…".len(),
            "{}",
            tail.len()
        );
        assert!(tail.len() > 1_900, "{}", tail.len());
    }

    #[test]
    fn exit_75_is_transient() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            "cat > /dev/null\necho 'API rate limited' >&2\nexit 75",
        );
        let err = put(&driver(&prog, LONG), &request(&inputs(), None)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Transient);
        assert!(
            err.message.contains("exited with code 75"),
            "{}",
            err.message
        );
        assert!(err.message.contains("API rate limited"), "{}", err.message);
    }

    #[test]
    fn garbage_on_stdout_is_final_and_not_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            "cat > /dev/null\necho 'password=opensesame'",
        );
        let err = put(&driver(&prog, LONG), &request(&inputs(), None)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        assert_eq!(
            err.message,
            "stdout is not a JSON response: expected value at line 1 column 1"
        );
    }

    #[test]
    fn malformed_responses_are_final() {
        let cases = [
            ("", "stdout is not a JSON response: it is empty"),
            (
                "[1]",
                "stdout is not a JSON response: expected an object, got an array",
            ),
            (
                r#"{"resource":{}}"#,
                r#"stdout is not a JSON response: it has no "status""#,
            ),
            (
                r#"{"status":"ok"}"#,
                r#"stdout is not a JSON response: "status" must be "done" or "pending""#,
            ),
            (
                r#"{"status":"done","cookie":5}"#,
                r#"stdout is not a JSON response: "cookie" must be a string or null, got a number"#,
            ),
            (
                r#"{"status":"done","resource":{"values":"s3cr3t"}}"#,
                r#"stdout is not a JSON response: "resource.values" must be an object, got a string"#,
            ),
            (
                r#"{"status":"done"} {"status":"done"}"#,
                "stdout is not a JSON response: trailing characters at line 1 column 19",
            ),
        ];
        for (stdout, message) in cases {
            let err = parse_response(stdout.as_bytes()).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Final);
            assert_eq!(err.message, message);
        }
        let big = format!(
            r#"{{"status":"done","cookie":"{}"}}"#,
            "x".repeat(MAX_COOKIE_BYTES + 1)
        );
        let err = parse_response(big.as_bytes()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        assert!(err.message.contains("10241 bytes"), "{}", err.message);
        let fits = format!(
            r#"{{"status":"pending","cookie":"{}"}}"#,
            "x".repeat(MAX_COOKIE_BYTES)
        );
        assert!(parse_response(fits.as_bytes()).is_ok());
    }

    #[test]
    fn a_program_past_its_time_limit_is_killed_and_transient() {
        let dir = tempfile::tempdir().unwrap();
        // `sleep` is a child of the shell: it must be killed too, or it would hold the pipes.
        let prog = script(
            dir.path(),
            "driver",
            "cat > /dev/null\necho 'working' >&2\nsleep 5\necho '{\"status\":\"done\"}'",
        );
        let started = Instant::now();
        let err = put(
            &driver(&prog, Duration::from_millis(300)),
            &request(&inputs(), None),
        )
        .unwrap_err();
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1_500), "took {took:?}");
        assert_eq!(err.kind, ErrorKind::Transient);
        assert!(
            err.message.contains("timed out after 300ms"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_background_process_holding_stdout_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            "cat > /dev/null\nsleep 5 &\necho '{\"status\":\"done\"}'",
        );
        let started = Instant::now();
        let err = put(
            &driver(&prog, Duration::from_millis(300)),
            &request(&inputs(), None),
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(1_500));
        assert_eq!(err.kind, ErrorKind::Transient);
        assert!(err.message.contains("kept its stdout"), "{}", err.message);
    }

    #[test]
    fn a_missing_program_is_final() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-driver");
        let err = put(&driver(&missing, LONG), &request(&inputs(), None)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        assert!(err.message.starts_with("cannot start "), "{}", err.message);
        assert!(
            err.message.contains("No such file or directory"),
            "{}",
            err.message
        );
        let empty = ExecDriver::new(vec![], LONG, Vec::new());
        assert_eq!(
            empty.put(&request(&inputs(), None)).unwrap_err().kind,
            ErrorKind::Final
        );
    }

    #[test]
    fn delete_done_and_pending() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            r#"req=$(cat)
case "$req" in *'"operation":"delete"'*) ;; *) exit 1 ;; esac
case "$req" in
  *'"cookie":"gone-soon"'*) printf '{"status":"done"}' ;;
  *) printf '{"status":"pending","cookie":"gone-soon"}' ;;
esac"#,
        );
        let d = driver(&prog, LONG);
        let inputs = inputs();
        assert_eq!(
            delete(&d, &request(&inputs, None)).unwrap(),
            DeleteOutcome::InProgress {
                cookie: Cookie::Set("gone-soon".into())
            }
        );
        assert_eq!(
            delete(&d, &request(&inputs, Some("gone-soon"))).unwrap(),
            DeleteOutcome::Done
        );
    }

    #[test]
    fn a_program_that_ignores_its_stdin_and_floods_stderr_does_not_deadlock() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(
            dir.path(),
            "driver",
            r#"i=0
while [ $i -lt 5000 ]; do echo "line $i of chatter on stderr" >&2; i=$((i+1)); done
printf '{"status":"done"}'"#,
        );
        let mut inputs = inputs();
        inputs.resource = json!({"blob": "y".repeat(1 << 20)});
        let outcome = put(&driver(&prog, LONG), &request(&inputs, None)).unwrap();
        assert!(matches!(outcome, PutOutcome::Done { .. }));
    }

    #[test]
    fn secrets_never_appear_in_error_messages() {
        let dir = tempfile::tempdir().unwrap();
        // A careless program: echoes its whole request to stderr and stdout, then fails.
        let echo_all = script(
            dir.path(),
            "echo-all",
            "req=$(cat)\necho \"$req\" >&2\necho \"$req\"\nexit 1",
        );
        let echo_stdout = script(dir.path(), "echo-stdout", "cat");
        let mut inputs = inputs();
        inputs.account = Some(json!({"key": "acct-key-9999"}));
        let cookie = r#"{"token":"cookie-token-123"}"#;
        let secrets = [
            "hunter2-secret",
            "acct-key-9999",
            "cookie-token-123",
            cookie,
        ];
        for prog in [&echo_all, &echo_stdout] {
            let err = put(&driver(prog, LONG), &request(&inputs, Some(cookie))).unwrap_err();
            for secret in secrets {
                assert!(!err.message.contains(secret), "{secret} in {}", err.message);
            }
        }
        let err = put(&driver(&echo_all, LONG), &request(&inputs, Some(cookie))).unwrap_err();
        assert!(err.message.contains("[redacted]"), "{}", err.message);
        assert!(err.message.contains("eu-west-1"), "{}", err.message);
    }
}
