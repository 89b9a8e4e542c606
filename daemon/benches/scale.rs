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

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

#[allow(dead_code, reason = "each bench uses part of the shared helpers")]
mod cli;
mod shape;

use cli::{
    Cli, GITPLANE, Run, Summary, duration, git, head, load_average, mb, median, mib, say, size,
    spread, state_bytes, tail, write,
};
use shape::{repository, workload, workload_path};

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
    // What the page asks beside one app's graph: every app counted.
    ("status page: app list", "/api/envs/development/apps"),
];

// ---------------------------------------------------------------------------------------------
// One-workload changes

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
// The state file

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

fn run_size(apps: usize) -> Figures {
    let resources = apps * RESOURCES_PER_APP;
    let total = u64::try_from(resources).expect("a count fits in u64");
    let tmp = tempfile::tempdir().expect("a temp dir for the repositories and state files");
    let root = tmp.path();

    // The repository, pushed to a bare origin like a person would.
    let t = Instant::now();
    let work = cli::bare_and_clone(root);
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
        config: None,
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
