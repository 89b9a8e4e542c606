//! End to end at scale: the real release binary, a real git repository and a real state file, at
//! 1 000 and 10 000 apps (5 000 and 50 000 resources).
//!
//! `cargo bench --bench scale` measures, per size, the CLI (first apply, no-op plan, no-op apply,
//! a one-workload change, what 20 no-op deployments add to the state file, and the peak memory of
//! each command) and the daemon (from `git push` returning to the deployment finishing, and its
//! peak memory), then prints a Markdown table. `cargo bench --bench scale -- 200` or
//! `-- 1000 10000` picks the sizes. Each size runs in its own process (the bench runs itself
//! again with `--one-size N`), so sizes do not interfere.
//!
//! The repository has the shape of `benches/graph.rs`: one environment `development` (with the
//! implicit base-env), definitions for base-env, postgres (reading the base-env), redis, dns and
//! workload with the `humanitec/echo` driver, and per app `workloads/app-NNNNN/web.yaml` with a
//! private postgres, a private redis and an app-shared dns: five resources per app. It is written
//! with the `git` program into a bare `origin.git` and a working clone, committed and pushed as a
//! person would.
//!
//! Only the CLI's summary lines and the `deployment` table's `commit_id`, `status`, `started_at`
//! and `finished_at` columns are relied on, so the state file's format may change underneath.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

mod shape;

use shape::{repository, workload, workload_path};

const GITPLANE: &str = env!("CARGO_BIN_EXE_gitplane");
const RESOURCES_PER_APP: usize = 5;
/// Runs of the no-op plan, no-op apply and one-workload change; their median is reported.
const RUNS: usize = 5;
/// Runs of the first apply, each on a new state file; their median is reported.
const FIRST_RUNS: usize = 3;
/// No-op deployments whose addition to the state file is measured.
const NOOP_DEPLOYMENTS: usize = 20;
/// One-workload pushes to the daemon.
const PUSHES: usize = 10;
/// GETs of each listener route timed after the pushes; their median is reported.
const READS: usize = 20;
/// What the daemon's HTTP listener is asked after the pushes, timed: `(what, path)`.
const LISTENER_READS: &[(&str, &str)] = &[
    ("GET /metrics", "/metrics"),
    ("status page: overview", "/api/overview"),
    // More than the page draws at once: the answer lists the apps to pick from.
    ("status page: whole graph", "/api/envs/development/graph"),
    (
        "status page: one app's graph",
        "/api/envs/development/graph?app=app-00001",
    ),
];

// ---------------------------------------------------------------------------------------------
// git

/// Runs `git` isolated from the user's and the system's configuration; panics with its output
/// when it fails. Returns its stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=gitplane-bench",
            "-c",
            "user.email=bench@gitplane.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run git {args:?} in {}: {e}", dir.display()));
    assert!(
        out.status.success(),
        "git {args:?} in {} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn head(work: &Path) -> String {
    git(work, &["rev-parse", "HEAD"]).trim().to_owned()
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    let dir = path.parent().expect("every generated file is in a folder");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The one-workload changes of a run: each bumps the image tag of a different app.
struct Changes {
    apps: usize,
    made: usize,
}

impl Changes {
    /// Changes one workload's image tag in the clone, commits and pushes it; returns the app.
    fn commit_and_push(&mut self, work: &Path) -> usize {
        self.made += 1;
        // 7919 is prime, so successive changes touch different apps for any size.
        let app = (self.made * 7919 + 13) % self.apps;
        write(work, &workload_path(app), &workload(self.made + 1));
        git(
            work,
            &[
                "commit",
                "--quiet",
                "-am",
                &format!("app-{app:05}: web:{}", self.made + 1),
            ],
        );
        git(work, &["push", "--quiet", "origin", "main"]);
        app
    }
}

// ---------------------------------------------------------------------------------------------
// Running the CLI

/// One finished command: its wall time, its own peak memory, and what it printed.
struct Run {
    secs: f64,
    max_rss_kib: u64,
    stdout: String,
    stderr: String,
}

/// How the bench runs `gitplane` against one clone and one state file.
struct Cli {
    repo: PathBuf,
    state: PathBuf,
    /// Where each command's stdout and stderr go (files, so a command never blocks on a pipe
    /// and a failure can be shown).
    out: PathBuf,
    err: PathBuf,
}

/// At most the last `lines` lines of `text`, saying how many were left out.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    if all.len() <= lines {
        return text.to_owned();
    }
    format!(
        "[... {} earlier lines ...]\n{}",
        all.len() - lines,
        all[all.len() - lines..].join("\n")
    )
}

impl Cli {
    fn describe(&self, args: &[&str]) -> String {
        format!(
            "{GITPLANE} {} --repo {} --state {}",
            args.join(" "),
            self.repo.display(),
            self.state.display()
        )
    }

    /// Runs `gitplane ARGS --repo R --state S` as a child process, timed from spawn to exit,
    /// with its peak memory from `wait4`. Panics, showing the command and its output, unless it
    /// exits with 0.
    fn run(&self, args: &[&str]) -> Run {
        let command = self.describe(args);
        let stdout = File::create(&self.out).expect("the bench can write its temp dir");
        let stderr = File::create(&self.err).expect("the bench can write its temp dir");
        let start = Instant::now();
        #[expect(
            clippy::zombie_processes,
            reason = "wait4 below reaps the child, and reads its rusage"
        )]
        let child = Command::new(GITPLANE)
            .args(args)
            .arg("--repo")
            .arg(&self.repo)
            .arg("--state")
            .arg(&self.state)
            .env("GITPLANE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        let (status, max_rss_kib) = wait4(&child, &command);
        let secs = start.elapsed().as_secs_f64();
        let run = Run {
            secs,
            max_rss_kib,
            stdout: std::fs::read_to_string(&self.out).expect("the command's stdout is UTF-8"),
            stderr: std::fs::read_to_string(&self.err).expect("the command's stderr is UTF-8"),
        };
        if status != Some(0) {
            self.fail(
                args,
                &run,
                &format!(
                    "exited with {}",
                    status.map_or("a signal".to_owned(), |c| format!("code {c}"))
                ),
            );
        }
        run
    }

    fn fail(&self, args: &[&str], run: &Run, what: &str) -> ! {
        panic!(
            "{}: {what}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.describe(args),
            tail(&run.stdout, 60),
            tail(&run.stderr, 60)
        )
    }

    /// `gitplane apply`, checked against what the summary line must say.
    fn apply(&self, check: impl Fn(&Summary) -> Result<(), String>) -> (Run, Summary) {
        let args = ["apply"];
        let run = self.run(&args);
        let Some(summary) = Summary::find(&run.stdout) else {
            self.fail(&args, &run, "no summary line `development: deployment ...`")
        };
        if let Err(why) = check(&summary) {
            self.fail(&args, &run, &why);
        }
        (run, summary)
    }

    /// `gitplane plan`, checked to plan no change.
    fn noop_plan(&self) -> Run {
        let args = ["plan"];
        let run = self.run(&args);
        let Some(line) = run.stdout.lines().find(|l| l.contains(" to create, ")) else {
            self.fail(
                &args,
                &run,
                "no summary line `... to create, ... to delete`",
            )
        };
        let counts = counts(line);
        for what in ["to create", "to update", "to delete"] {
            if counts.get(what) != Some(&0) {
                self.fail(&args, &run, &format!("a no-op plan must say `0 {what}`"));
            }
        }
        if counts.get("may update").is_some_and(|n| *n != 0) {
            self.fail(&args, &run, "a no-op plan must say `0 may update`");
        }
        run
    }
}

/// Waits for `child` with `wait4`, which also gives the child's own peak RSS. Returns its exit
/// code (None when a signal ended it) and `ru_maxrss` (KiB on Linux).
fn wait4(child: &Child, command: &str) -> (Option<i32>, u64) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data, for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our own unreaped child; status and usage are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        assert!(
            r == -1 && err.kind() == std::io::ErrorKind::Interrupted,
            "wait4 on {command} (pid {pid}) failed: {err}"
        );
    }
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let max_rss_kib = u64::try_from(usage.ru_maxrss).expect("ru_maxrss is not negative");
    (code, max_rss_kib)
}

/// `N label, N label, ...` as a map from label to N (`0 to create, 12 unchanged` gives
/// `{"to create": 0, "unchanged": 12}`).
fn counts(text: &str) -> BTreeMap<String, u64> {
    text.split(',')
        .filter_map(|part| {
            let (n, label) = part.trim().split_once(' ')?;
            Some((label.trim().to_owned(), n.parse().ok()?))
        })
        .collect()
}

/// The line `development: deployment N STATUS: C created, U updated, D deleted, X unchanged,
/// F failed` of an apply.
#[derive(Debug)]
struct Summary {
    line: String,
    deployment: String,
    status: String,
    counts: BTreeMap<String, u64>,
}

impl Summary {
    fn find(stdout: &str) -> Option<Summary> {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("development: deployment ") && l.contains(" created, "))?;
        let rest = line.strip_prefix("development: deployment ")?;
        let (head, counts) = rest.split_once(": ")?;
        let (deployment, status) = head.split_once(' ')?;
        Some(Summary {
            line: line.to_owned(),
            deployment: deployment.to_owned(),
            status: status.to_owned(),
            counts: self::counts(counts),
        })
    }

    fn get(&self, what: &str) -> Result<u64, String> {
        self.counts
            .get(what)
            .copied()
            .ok_or_else(|| format!("the summary line `{}` has no `{what}` count", self.line))
    }

    fn expect(&self, what: &str, n: u64) -> Result<(), String> {
        let got = self.get(what)?;
        if got == n {
            Ok(())
        } else {
            Err(format!(
                "expected {n} {what}, the summary line says `{}`",
                self.line
            ))
        }
    }

    fn succeeded(&self) -> Result<(), String> {
        if self.status == "succeeded" {
            self.expect("failed", 0)
        } else {
            Err(format!("the deployment did not succeed: `{}`", self.line))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The state file

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// The state file's size (with its WAL) after a full checkpoint, so what it holds is counted
/// once.
fn state_bytes(state: &Path) -> u64 {
    let conn = rusqlite::Connection::open(state)
        .unwrap_or_else(|e| panic!("cannot open the state {}: {e}", state.display()));
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap_or_else(|e| panic!("cannot checkpoint {}: {e}", state.display()));
    assert_eq!(busy, 0, "the checkpoint of {} was blocked", state.display());
    drop(conn);
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    size(state) + size(&with_suffix(state, "-wal"))
}

/// The newest deployment of `commit`: (status, started_at, finished_at).
fn deployment_of(state: &Path, commit: &str) -> Option<(String, String, Option<String>)> {
    let conn = rusqlite::Connection::open_with_flags(
        state,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .ok()?;
    conn.query_row(
        "SELECT status, started_at, finished_at FROM deployment WHERE commit_id = ?1 \
         ORDER BY started_at DESC LIMIT 1",
        [commit],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .ok()
}

fn epoch_millis(iso: &str) -> f64 {
    let t: chrono::DateTime<chrono::Utc> = iso
        .parse()
        .unwrap_or_else(|e| panic!("`{iso}` is not an ISO 8601 time: {e}"));
    t.timestamp_millis() as f64
}

fn now_millis() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs_f64()
        * 1e3
}

// ---------------------------------------------------------------------------------------------
// The daemon

/// The running daemon; dropping it (also while a panic unwinds) kills it.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Peak RSS so far (VmHWM), in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let path = format!("/proc/{}/status", self.child.id());
        let status =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM line in {path}"))
    }

    /// Panics, with the end of the daemon's log, if it has exited.
    fn check_alive(&mut self, waiting_for: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!(
                "the daemon exited ({status}) while the bench waited for {waiting_for}\n\
                 --- its stderr (GITPLANE_LOG=warn) ---\n{}",
                tail(&log, 60)
            );
        }
    }

    /// Waits until the newest deployment of `commit` has `finished_at`, and checks it succeeded.
    /// Returns (started_at, finished_at).
    fn wait_for(&mut self, state: &Path, commit: &str, wait: Duration) -> (String, String) {
        let what = format!("the deployment of commit {commit}");
        let deadline = Instant::now() + wait;
        loop {
            if let Some((status, started, finished)) = deployment_of(state, commit)
                && let Some(finished) = finished
            {
                assert_eq!(
                    status, "succeeded",
                    "{what} finished as {status} (started {started}, finished {finished})"
                );
                return (started, finished);
            }
            self.check_alive(&what);
            assert!(
                Instant::now() < deadline,
                "{what} did not finish within {} s",
                wait.as_secs()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// One size

/// What one size measured; the child process hands it to the parent as JSON.
#[derive(Default, Debug, serde::Serialize, serde::Deserialize)]
struct Figures {
    apps: usize,
    resources: usize,
    first_apply_s: f64,
    noop_plan_s: f64,
    noop_apply_s: f64,
    change_s: f64,
    push_median_ms: f64,
    push_min_ms: f64,
    push_max_ms: f64,
    cli_rss_kib: u64,
    cli_rss_of: String,
    daemon_rss_kib: u64,
    noop_state_bytes: u64,
    /// `(what, median milliseconds)` of each of [`LISTENER_READS`].
    listener_reads_ms: Vec<(String, f64)>,
}

/// `median X of N (min A, max B)` of durations in seconds.
fn spread(v: &[f64]) -> String {
    format!(
        "median {} of {} (min {}, max {})",
        duration(median(v)),
        v.len(),
        duration(v.iter().copied().fold(f64::INFINITY, f64::min)),
        duration(v.iter().copied().fold(0.0, f64::max)),
    )
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds with 2 decimals, or milliseconds below 1 s.
fn duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1e3)
    } else {
        format!("{secs:.2} s")
    }
}

fn mib(kib: u64) -> String {
    format!("{} MiB", kib.div_ceil(1024))
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

/// KB below 1 MB, MB above.
fn size(bytes: f64) -> String {
    if bytes < 1e6 {
        format!("{:.1} KB", bytes / 1e3)
    } else {
        format!("{:.2} MB", bytes / 1e6)
    }
}

/// The largest peak RSS among runs of one kind of command.
#[derive(Default)]
struct Peaks(Vec<(&'static str, u64)>);

impl Peaks {
    fn add(&mut self, what: &'static str, run: &Run) {
        match self.0.iter_mut().find(|(w, _)| *w == what) {
            Some((_, kib)) => *kib = (*kib).max(run.max_rss_kib),
            None => self.0.push((what, run.max_rss_kib)),
        }
    }

    /// The peak of one kind of command so far, in KiB.
    fn of(&self, what: &str) -> u64 {
        self.0
            .iter()
            .find(|(w, _)| *w == what)
            .map_or(0, |(_, kib)| *kib)
    }

    fn largest(&self) -> (&'static str, u64) {
        self.0
            .iter()
            .copied()
            .max_by_key(|(_, kib)| *kib)
            .expect("some command ran")
    }
}

/// The 1, 5 and 15 minute load averages (Linux), to tell whether something else shared the CPUs.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn say(text: &str) {
    println!("{text}");
    let _ = std::io::stdout().flush();
}

fn run_size(apps: usize) -> Figures {
    let resources = apps * RESOURCES_PER_APP;
    let total = u64::try_from(resources).expect("a count fits in u64");
    let tmp = tempfile::tempdir().expect("a temp dir for the repositories and state files");
    let root = tmp.path();

    // The repository, pushed to a bare origin like a person would.
    let t = Instant::now();
    git(
        root,
        &[
            "init",
            "--quiet",
            "--bare",
            "--initial-branch=main",
            "origin.git",
        ],
    );
    git(root, &["clone", "--quiet", "origin.git", "work"]);
    let work = root.join("work");
    git(&work, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    for (path, text) in repository(apps) {
        write(&work, &path, &text);
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "--quiet", "-m", &format!("{apps} apps")]);
    git(&work, &["push", "--quiet", "origin", "main"]);
    say(&format!(
        "{apps} apps, {resources} resources: repository generated, committed and pushed in {:.1} s \
         (load average {})",
        t.elapsed().as_secs_f64(),
        load_average()
    ));

    // The CLI against the clone and fresh state files.
    let mut cli = Cli {
        repo: work.clone(),
        state: root.join("cli-1.db"),
        out: root.join("command.out"),
        err: root.join("command.err"),
    };
    let mut peaks = Peaks::default();
    let mut changes = Changes { apps, made: 0 };

    // The first apply, each time on a new state file; the last one goes on.
    let mut first_s = Vec::new();
    for k in 1..=FIRST_RUNS {
        cli.state = root.join(format!("cli-{k}.db"));
        let (run, _) = cli.apply(|s| {
            if s.deployment != "1" {
                return Err(format!("expected deployment 1, got `{}`", s.line));
            }
            s.succeeded()?;
            s.expect("created", total)?;
            s.expect("updated", 0)?;
            s.expect("deleted", 0)
        });
        peaks.add("first apply", &run);
        first_s.push(run.secs);
    }
    let first_apply_s = median(&first_s);
    say(&format!(
        "  first apply: {}; peak RSS {}",
        spread(&first_s),
        mib(peaks.of("first apply")),
    ));

    let noop = |s: &Summary| {
        s.succeeded()?;
        s.expect("created", 0)?;
        s.expect("updated", 0)?;
        s.expect("deleted", 0)?;
        s.expect("unchanged", total)
    };

    let mut plan_s = Vec::new();
    for _ in 0..RUNS {
        let run = cli.noop_plan();
        peaks.add("no-op plan", &run);
        plan_s.push(run.secs);
    }
    say(&format!("  no-op plan: {}", spread(&plan_s)));

    let mut noop_s = Vec::new();
    for _ in 0..RUNS {
        let (run, _) = cli.apply(noop);
        peaks.add("no-op apply", &run);
        noop_s.push(run.secs);
    }
    say(&format!("  no-op apply: {}", spread(&noop_s)));

    let mut change_s = Vec::new();
    let mut updated = Vec::new();
    for _ in 0..RUNS {
        changes.commit_and_push(&work);
        let (run, summary) = cli.apply(|s| {
            s.succeeded()?;
            s.expect("created", 0)?;
            s.expect("deleted", 0)?;
            if s.get("updated")? == 0 {
                return Err(format!("a changed workload must update, got `{}`", s.line));
            }
            Ok(())
        });
        peaks.add("one-workload change", &run);
        change_s.push(run.secs);
        updated.push(summary.get("updated").expect("checked above"));
    }
    say(&format!(
        "  one-workload change: {}; updated per change: {updated:?}",
        spread(&change_s)
    ));

    let before = state_bytes(&cli.state);
    for _ in 0..NOOP_DEPLOYMENTS {
        let (run, _) = cli.apply(noop);
        peaks.add("no-op apply", &run);
    }
    let after = state_bytes(&cli.state);
    let added = after.saturating_sub(before);
    say(&format!(
        "  state file: {} before, {} after {NOOP_DEPLOYMENTS} no-op deployments: +{} \
         ({} per deployment)",
        mb(before),
        mb(after),
        mb(added),
        size(added as f64 / NOOP_DEPLOYMENTS as f64)
    ));
    let peak_list: Vec<String> = peaks
        .0
        .iter()
        .map(|(w, kib)| format!("{w} {}", mib(*kib)))
        .collect();
    say(&format!("  peak RSS: {}", peak_list.join(", ")));

    // The daemon, on the bare repository, with a fresh state file and its HTTP listener on, as a
    // platform team would run it.
    let state = root.join("daemon.db");
    let log = root.join("daemon.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let host_config = root.join("host.yaml");
    write(
        root,
        "host.yaml",
        &format!("http: {{listen: 127.0.0.1:{port}}}\n"),
    );
    let started = Instant::now();
    let mut daemon = Daemon {
        child: Command::new(GITPLANE)
            .arg("daemon")
            .arg("--config")
            .arg(&host_config)
            .arg("--repo")
            .arg(root.join("origin.git"))
            .arg("--state")
            .arg(&state)
            .env("GITPLANE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("the bench can write its temp dir"))
            .spawn()
            .expect("the daemon starts"),
        log,
    };
    let initial = head(&work);
    let (first_started, first_finished) =
        daemon.wait_for(&state, &initial, Duration::from_secs(3600));
    say(&format!(
        "  daemon: first deployment of {resources} resources finished {} after start \
         (the deployment itself: {})",
        duration(started.elapsed().as_secs_f64()),
        duration((epoch_millis(&first_finished) - epoch_millis(&first_started)) / 1e3),
    ));
    let mut to_finish = Vec::new();
    for _ in 0..PUSHES {
        changes.commit_and_push(&work);
        let pushed = now_millis();
        let commit = head(&work);
        let (_, finished) = daemon.wait_for(&state, &commit, Duration::from_secs(600));
        to_finish.push(epoch_millis(&finished) - pushed);
    }
    let listener_reads_ms = listener_reads(port);
    for (what, ms) in &listener_reads_ms {
        say(&format!(
            "  daemon listener: {what}: median {} of {READS}",
            duration(ms / 1e3)
        ));
    }
    let daemon_rss = daemon.peak_rss_kib();
    drop(daemon);
    let push_median = median(&to_finish);
    let push_min = to_finish.iter().copied().fold(f64::INFINITY, f64::min);
    let push_max = to_finish.iter().copied().fold(0.0, f64::max);
    say(&format!(
        "  daemon: {PUSHES} one-workload pushes, push returned -> deployment finished: median \
         {} (min {}, max {}); peak RSS {}",
        duration(push_median / 1e3),
        duration(push_min / 1e3),
        duration(push_max / 1e3),
        mib(daemon_rss)
    ));

    let (rss_of, cli_rss) = peaks.largest();
    let figures = Figures {
        apps,
        resources,
        first_apply_s,
        noop_plan_s: median(&plan_s),
        noop_apply_s: median(&noop_s),
        change_s: median(&change_s),
        push_median_ms: push_median,
        push_min_ms: push_min,
        push_max_ms: push_max,
        cli_rss_kib: cli_rss,
        cli_rss_of: rss_of.to_owned(),
        daemon_rss_kib: daemon_rss,
        noop_state_bytes: added,
        listener_reads_ms,
    };
    say(&summary_line(&figures));
    figures
}

/// Times [`READS`] GETs of each of [`LISTENER_READS`] on the daemon's listener at `port`.
fn listener_reads(port: u16) -> Vec<(String, f64)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    LISTENER_READS
        .iter()
        .map(|(what, path)| {
            let url = format!("http://127.0.0.1:{port}{path}");
            let times: Vec<f64> = (0..READS)
                .map(|_| {
                    let started = Instant::now();
                    let mut response = agent
                        .get(&url)
                        .call()
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let _ = response.body_mut().read_to_vec();
                    started.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            ((*what).to_owned(), median(&times))
        })
        .collect()
}

fn summary_line(f: &Figures) -> String {
    format!(
        "{} apps  {} resources  first apply {}  no-op plan {}  no-op apply {}  one-workload \
         change {}  push -> finished {}  peak RSS {} ({})  daemon peak RSS {}  state +{} \
         per {NOOP_DEPLOYMENTS} no-op deployments",
        f.apps,
        f.resources,
        duration(f.first_apply_s),
        duration(f.noop_plan_s),
        duration(f.noop_apply_s),
        duration(f.change_s),
        duration(f.push_median_ms / 1e3),
        mib(f.cli_rss_kib),
        f.cli_rss_of,
        mib(f.daemon_rss_kib),
        mb(f.noop_state_bytes),
    )
}

fn table(all: &[Figures]) -> String {
    let mut t = String::new();
    t.push_str(&format!(
        "| apps | resources | first apply (median of {FIRST_RUNS}) | no-op plan (median of {RUNS}) | no-op apply (median of \
         {RUNS}) | one-workload change, CLI (median of {RUNS}) | push → finished, daemon (median \
         of {PUSHES}; min–max) | peak RSS (largest CLI) | daemon peak RSS | state added per \
         {NOOP_DEPLOYMENTS} no-op deployments |\n"
    ));
    t.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for f in all {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} ({}–{}) | {} ({}) | {} | {} ({} per \
             deployment) |",
            f.apps,
            f.resources,
            duration(f.first_apply_s),
            duration(f.noop_plan_s),
            duration(f.noop_apply_s),
            duration(f.change_s),
            duration(f.push_median_ms / 1e3),
            duration(f.push_min_ms / 1e3),
            duration(f.push_max_ms / 1e3),
            mib(f.cli_rss_kib),
            f.cli_rss_of,
            mib(f.daemon_rss_kib),
            mb(f.noop_state_bytes),
            size(f.noop_state_bytes as f64 / NOOP_DEPLOYMENTS as f64),
        );
    }
    t
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The child for one size: `--one-size N --result FILE`.
    if let Some(i) = args.iter().position(|a| a == "--one-size") {
        let apps: usize = args
            .get(i + 1)
            .and_then(|a| a.parse().ok())
            .expect("--one-size takes a number of apps");
        let result = args
            .iter()
            .position(|a| a == "--result")
            .and_then(|j| args.get(j + 1))
            .expect("--one-size needs --result FILE");
        let figures = run_size(apps);
        let json = serde_json::to_string(&figures).expect("figures serialise");
        std::fs::write(result, json)
            .unwrap_or_else(|e| panic!("cannot write the result to {result}: {e}"));
        return;
    }
    // `cargo bench` passes `--bench`; every number is a size.
    let mut sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![1_000, 10_000];
    }
    assert!(
        sizes.iter().all(|s| *s > 0),
        "sizes are numbers of apps, > 0"
    );
    let exe = std::env::current_exe().expect("the bench binary knows its path");
    let results = tempfile::tempdir().expect("a temp dir for the sizes' results");
    let mut all = Vec::new();
    for apps in sizes {
        let result = results.path().join(format!("{apps}.json"));
        let status = Command::new(&exe)
            .arg("--one-size")
            .arg(apps.to_string())
            .arg("--result")
            .arg(&result)
            .status()
            .expect("the bench runs itself again for one size");
        assert!(status.success(), "the run of {apps} apps failed ({status})");
        let text = std::fs::read_to_string(&result)
            .unwrap_or_else(|e| panic!("the run of {apps} apps left no result: {e}"));
        let figures = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the result of {apps} apps: {e}:\n{text}"));
        all.push(figures);
    }
    println!();
    for f in &all {
        println!("{}", summary_line(f));
    }
    println!(
        "\nCLI: each command a child process on a fresh state file per size, timed from spawn to \
         exit; peak RSS is the command's own ru_maxrss. Daemon: from `git push` returning to the \
         deployment's finished_at in the state.\n"
    );
    print!("{}", table(&all));
}
