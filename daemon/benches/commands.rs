//! Commands about part of an environment, at scale: what `explain`, `graph --app` and the
//! pre-receive hook cost when the environment is large and the question is small.
//!
//! `cargo bench --bench commands` measures 1 000 and 50 000 resources (`-- 1000 50000` picks
//! the sizes, five resources per app). Per size it generates the repository of `scale.rs`
//! (`shape/`), applies it once through the release binary into a SQLite file, then times [`RUNS`]
//! runs each of: `explain` of one app's database by GUResID and by label, `graph --app` of one
//! app, `graph` of the whole environment (for contrast), and `validate --pre-receive` of a push
//! that changes one workload (git's `<old> <new> <ref>` line on stdin). It prints medians, their
//! spread and each command's peak RSS as a Markdown table.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

#[allow(dead_code, reason = "each bench uses part of the shared helpers")]
mod cli;
mod shape;

use cli::{Cli, GITPLANE, git, head, load_average, median, mib, say, spread, write};
use shape::{repository, workload, workload_path};

const RESOURCES_PER_APP: usize = 5;
const RUNS: usize = 5;
const DEFAULT_SIZES: [usize; 2] = [1_000, 50_000];
/// The app every command asks about.
const APP: usize = 3;

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        DEFAULT_SIZES.to_vec()
    } else {
        sizes
    };
    let mut table =
        String::from("| resources | command | time | peak RSS |\n|---:|---|---|---:|\n");
    for resources in sizes {
        for (command, times, peak) in one_size(resources) {
            let _ = writeln!(
                table,
                "| {resources} | {command} | {} | {} |",
                spread(&times),
                mib(peak)
            );
        }
    }
    println!("\nload average: {}\n\n{table}", load_average());
}

fn one_size(resources: usize) -> Vec<(String, Vec<f64>, u64)> {
    let apps = resources.div_ceil(RESOURCES_PER_APP);
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path();
    let repo = root.join("repo");
    git(root, &["init", "--quiet", "--initial-branch=main", "repo"]);
    for (path, text) in repository(apps) {
        write(&repo, &path, &text);
    }
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "--quiet", "-m", "the platform"]);
    let cli = Cli {
        repo: repo.clone(),
        state: root.join("state.db"),
        config: None,
        out: root.join("out.txt"),
        err: root.join("err.txt"),
    };
    say(&format!("{resources} resources: the first apply"));
    cli.apply(|s| {
        s.succeeded()?;
        s.expect("created", (apps * RESOURCES_PER_APP) as u64)
    });
    let app = format!("app-{APP:05}");
    let label = format!("{app}/postgres.default#modules.web.externals.db");
    let guresid: String = rusqlite::Connection::open(&cli.state)
        .and_then(|c| {
            c.query_row(
                "SELECT guresid FROM resource WHERE app = ?1 AND type = 'postgres'",
                [&app],
                |r| r.get(0),
            )
        })
        .expect("the app's database is recorded");

    let mut rows = Vec::new();
    let mut timed = |name: String, args: &[&str], expect: &str| {
        say(&format!("{resources} resources: {name}"));
        let (mut times, mut peak) = (Vec::new(), 0);
        for _ in 0..RUNS {
            let run = cli.run(args);
            if !run.stdout.contains(expect) {
                cli.fail(
                    args,
                    &run,
                    &format!("the output does not contain {expect:?}"),
                );
            }
            times.push(run.secs);
            peak = peak.max(run.max_rss_kib);
        }
        rows.push((name, times, peak));
    };
    timed("`explain GURESID`".into(), &["explain", &guresid], &label);
    timed(
        "`explain app/type.class#id`".into(),
        &["explain", &label],
        &guresid,
    );
    timed(
        format!("`graph --app {app} -o json`"),
        &["graph", "--app", &app, "-o", "json"],
        &guresid,
    );
    timed(
        "`graph -o json` (whole environment)".into(),
        &["graph", "-o", "json"],
        &guresid,
    );

    // A push that changes one workload, as git hands it to the pre-receive hook.
    let old = head(&repo);
    write(&repo, &workload_path(APP), &workload(2));
    git(&repo, &["commit", "--quiet", "-am", "one workload"]);
    let new = head(&repo);
    let line = format!("{old} {new} refs/heads/main\n");
    say(&format!("{resources} resources: validate --pre-receive"));
    let (mut times, mut peak) = (Vec::new(), 0);
    for _ in 0..RUNS {
        let (secs, kib, stdout) = pre_receive(&repo, &line);
        assert!(
            stdout.contains("1 changed app(s) read"),
            "the hook reads the changed app alone: {stdout}"
        );
        times.push(secs);
        peak = peak.max(kib);
    }
    rows.push((
        "`validate --pre-receive` of a one-workload push".into(),
        times,
        peak,
    ));
    for (name, times, _) in &rows {
        say(&format!(
            "  {name}: median {:.1} ms",
            median(times) * 1000.0
        ));
    }
    rows
}

/// `gitplane validate --pre-receive --repo REPO` with `line` on stdin: its time, peak RSS and
/// stdout.
fn pre_receive(repo: &Path, line: &str) -> (f64, u64, String) {
    let start = Instant::now();
    #[expect(
        clippy::zombie_processes,
        reason = "wait4 below reaps the child, and reads its rusage"
    )]
    let mut child = Command::new(GITPLANE)
        .args(["validate", "--pre-receive", "--repo"])
        .arg(repo)
        .env("GITPLANE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gitplane");
    child
        .stdin
        .take()
        .expect("a piped stdin")
        .write_all(line.as_bytes())
        .expect("write the hook's input");
    let mut stdout = String::new();
    std::io::Read::read_to_string(
        &mut child.stdout.take().expect("a piped stdout"),
        &mut stdout,
    )
    .expect("read the hook's output");
    let (status, kib) = cli::wait4(&child, "gitplane validate --pre-receive");
    assert_eq!(status, Some(0), "the hook accepts the push: {stdout}");
    (start.elapsed().as_secs_f64(), kib, stdout)
}
