//! The workflows of a change through environments, end to end at scale: the real release binary,
//! a real git repository (bare `origin.git` and a working clone, pushed to as a person would) and
//! a real SQLite state file.
//!
//! `cargo bench --bench workflow` measures, per size (default 1 000 and 50 000 resources; `--
//! 1000 50000` picks sizes in resources, five per app):
//! - `plan --ref pr-1 --format markdown` and `--format json` for a branch that changes one
//!   workload, against the applied state (median of runs);
//! - `drift --env development --detect`, a detect-only drift run reading every resource (the echo
//!   driver's read path recomputes its outputs) and recording nothing but its own deployment;
//! - `rollback` of a one-workload commit, `apply` of a newer commit while pinned (planned and
//!   recorded, not applied), `unpin` (which applies it);
//! - the daemon making a preview environment for a pushed branch (from `git push` returning to
//!   its deployment finishing, the whole environment's resources created) and removing it once
//!   the branch is deleted (every resource deleted).

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code, reason = "each bench uses part of the shared helpers")]
mod cli;
mod shape;

use cli::{Cli, GITPLANE, Run, duration, git, head, load_average, mib, say, spread, write};
use shape::{repository, workload, workload_path};

const RESOURCES_PER_APP: usize = 5;
const RUNS: usize = 5;
const DEFAULT_SIZES: [usize; 2] = [1_000, 50_000];

/// The figures of one size.
struct Figures {
    resources: usize,
    first_apply: f64,
    plan_markdown: Vec<f64>,
    plan_markdown_rss: u64,
    plan_json: Vec<f64>,
    detect: Vec<f64>,
    detect_rss: u64,
    rollback: f64,
    pinned_apply: f64,
    unpin: f64,
    preview_made: f64,
    preview_removed: f64,
}

fn commit_push(work: &Path, message: &str, branch: &str) -> String {
    git(work, &["add", "-A"]);
    git(work, &["commit", "--quiet", "-m", message]);
    git(work, &["push", "--quiet", "origin", branch]);
    head(work)
}

/// Runs `args`, which must exit with `code`; timed as `Cli::run` does.
fn run_exit(cli: &Cli, args: &[&str], code: i32) -> Run {
    let command = cli.describe(args);
    let start = Instant::now();
    let mut child = Command::new(GITPLANE);
    child
        .args(args)
        .arg("--repo")
        .arg(&cli.repo)
        .arg("--state")
        .arg(&cli.state);
    if let Some(config) = &cli.config {
        child.arg("--config").arg(config);
    }
    let out = child
        .env("GITPLANE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    let run = Run {
        secs: start.elapsed().as_secs_f64(),
        max_rss_kib: 0,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if out.status.code() != Some(code) {
        cli.fail(
            args,
            &run,
            &format!("exited with {:?}, not {code}", out.status.code()),
        );
    }
    run
}

/// Waits until `query` (one integer) on the state gives a non-zero count.
fn wait_for(state: &Path, query: &str, limit: Duration) -> f64 {
    let start = Instant::now();
    loop {
        if let Ok(conn) = rusqlite::Connection::open(state) {
            let n: i64 = conn.query_row(query, [], |r| r.get(0)).unwrap_or(0);
            if n > 0 {
                return start.elapsed().as_secs_f64();
            }
        }
        assert!(start.elapsed() < limit, "not in {limit:?}: {query}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn one_size(resources: usize) -> Figures {
    let apps = resources / RESOURCES_PER_APP;
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path();
    let work = cli::bare_and_clone(root);
    for (path, text) in repository(apps) {
        write(&work, &path, &text);
    }
    commit_push(&work, "the platform", "main");
    let config = root.join("host.yaml");
    write(root, "host.yaml", "watch_interval: 1s\n");
    let cli = Cli {
        repo: root.join("origin.git"),
        state: root.join("state.db"),
        config: Some(config.clone()),
        out: root.join("out.txt"),
        err: root.join("err.txt"),
    };
    say(&format!("{resources} resources: first apply"));
    let (first, _) = cli.apply(|s| s.succeeded());

    // A branch that changes one workload.
    git(&work, &["checkout", "--quiet", "-b", "pr-1"]);
    write(&work, &workload_path(apps / 2), &workload(2));
    commit_push(&work, "pr-1: one workload", "pr-1");
    git(&work, &["checkout", "--quiet", "main"]);
    say(&format!("{resources} resources: plan --ref"));
    let mut plan_markdown = Vec::new();
    let mut plan_markdown_rss = 0;
    let mut plan_json = Vec::new();
    for _ in 0..RUNS {
        let run = cli.run(&["plan", "--ref", "pr-1", "--format", "markdown"]);
        if !run.stdout.contains("app-") {
            cli.fail(&["plan"], &run, "the Markdown plan names no app");
        }
        plan_markdown.push(run.secs);
        plan_markdown_rss = plan_markdown_rss.max(run.max_rss_kib);
        plan_json.push(cli.run(&["plan", "--ref", "pr-1", "--format", "json"]).secs);
    }

    say(&format!("{resources} resources: drift --detect"));
    let mut detect = Vec::new();
    let mut detect_rss = 0;
    for _ in 0..RUNS {
        let run = cli.run(&["drift", "--env", "development", "--detect"]);
        detect.push(run.secs);
        detect_rss = detect_rss.max(run.max_rss_kib);
    }

    say(&format!(
        "{resources} resources: rollback, pinned apply, unpin"
    ));
    let before = head(&work);
    write(&work, &workload_path(1), &workload(3));
    commit_push(&work, "one workload", "main");
    cli.apply(|s| s.succeeded());
    let rollback = cli
        .run(&[
            "rollback",
            "--env",
            "development",
            "--to",
            &before,
            "--reason",
            "bench",
            "--by",
            "bench",
        ])
        .secs;
    write(&work, &workload_path(2), &workload(3));
    commit_push(&work, "another workload", "main");
    let pinned = run_exit(&cli, &["apply", "--env", "development"], 1);
    if !pinned.stdout.contains("planned, not applied") {
        cli.fail(
            &["apply"],
            &pinned,
            "a pinned apply must say it was not applied",
        );
    }
    let unpin = cli
        .run(&["unpin", "--env", "development", "--by", "bench"])
        .secs;

    say(&format!(
        "{resources} resources: a preview through the daemon"
    ));
    write(
        root,
        "host.yaml",
        "watch_interval: 1s\npreviews: {branches: \"pr-*\", type: development}\n",
    );
    let log = std::fs::File::create(root.join("daemon.log")).expect("a log file");
    let mut daemon = Command::new(GITPLANE)
        .arg("daemon")
        .arg("--repo")
        .arg(&cli.repo)
        .arg("--state")
        .arg(&cli.state)
        .arg("--config")
        .arg(&config)
        .env("GITPLANE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the daemon");
    // pr-1 becomes a preview at start: wait for it, then measure a second branch.
    let limit = Duration::from_secs(1800);
    wait_for(
        &cli.state,
        "SELECT COUNT(*) FROM deployment WHERE env = 'pr-1' AND status = 'succeeded'",
        limit,
    );
    git(&work, &["checkout", "--quiet", "-b", "pr-2"]);
    write(&work, &workload_path(3), &workload(4));
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "--quiet", "-m", "pr-2"]);
    git(&work, &["push", "--quiet", "origin", "pr-2"]);
    let preview_made = wait_for(
        &cli.state,
        "SELECT COUNT(*) FROM deployment WHERE env = 'pr-2' AND status = 'succeeded'",
        limit,
    );
    git(&work, &["push", "--quiet", "origin", "--delete", "pr-2"]);
    let preview_removed = wait_for(
        &cli.state,
        "SELECT COUNT(*) FROM preview WHERE env = 'pr-2' AND removed_at IS NOT NULL",
        limit,
    );
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status();
    let _ = daemon.wait();
    Figures {
        resources,
        first_apply: first.secs,
        plan_markdown,
        plan_markdown_rss,
        plan_json,
        detect,
        detect_rss,
        rollback,
        pinned_apply: pinned.secs,
        unpin,
        preview_made,
        preview_removed,
    }
}

fn main() {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = DEFAULT_SIZES.to_vec();
    }
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| resources | first apply | plan --ref (markdown) | plan --ref (json) | drift --detect | \
         rollback | apply while pinned | unpin | preview made | preview removed |"
    );
    let _ = writeln!(t, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for resources in sizes {
        let f = one_size(resources);
        let _ = writeln!(
            t,
            "| {} | {} | {} ({}) | {} | {} ({}) | {} | {} | {} | {} | {} |",
            f.resources,
            duration(f.first_apply),
            spread(&f.plan_markdown),
            mib(f.plan_markdown_rss),
            spread(&f.plan_json),
            spread(&f.detect),
            mib(f.detect_rss),
            duration(f.rollback),
            duration(f.pinned_apply),
            duration(f.unpin),
            duration(f.preview_made),
            duration(f.preview_removed),
        );
    }
    println!(
        "\nThe release binary as child processes on a git clone and a SQLite file; load average \
         {}. Preview times are from `git push` returning to the daemon's deployment (or removal) \
         finishing.\n",
        load_average()
    );
    print!("{t}");
}
