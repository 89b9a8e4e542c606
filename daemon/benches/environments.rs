//! Many environments through the daemon: one definition change that touches every one of them.
//!
//! `cargo bench --bench environments` measures 100 environments of 500 resources each (100
//! apps, five resources per app, the echo driver); `-- ENVS RESOURCES SLOTS...` picks the
//! environments, the resources per environment and the `parallel_environments` settings to
//! compare (default 1 and 8). Per setting it starts the real release daemon on a bare
//! repository pushed to as a person would, with a real SQLite state, waits until every
//! environment is deployed, then pushes one definition change (every redis's host) and times
//! push → every environment's deployment of the new commit finished. It prints, as a Markdown
//! table, that time, the first deployment of everything, and the daemon's peak RSS (`VmHWM`
//! from /proc, the whole run's).

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code, reason = "each bench uses part of the shared helpers")]
mod cli;
#[allow(dead_code, reason = "each bench uses part of the shared shape")]
mod shape;

use cli::{GITPLANE, duration, git, head, load_average, say, write};
use shape::{definitions, workload, workload_path};

const RESOURCES_PER_APP: usize = 5;
const DEFAULT_ENVS: usize = 100;
const DEFAULT_RESOURCES_PER_ENV: usize = 500;
const DEFAULT_SLOTS: [usize; 2] = [1, 8];
const LIMIT: Duration = Duration::from_secs(3600);

struct Figures {
    slots: usize,
    first: f64,
    change: f64,
    peak_kib: u64,
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let envs = args.first().copied().unwrap_or(DEFAULT_ENVS);
    let per_env = args.get(1).copied().unwrap_or(DEFAULT_RESOURCES_PER_ENV);
    let slots: Vec<usize> = if args.len() > 2 {
        args[2..].to_vec()
    } else {
        DEFAULT_SLOTS.to_vec()
    };
    let apps = per_env.div_ceil(RESOURCES_PER_APP);
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| environments × resources | parallel_environments | first deployment of all | push → all deployed | daemon peak RSS |\n|---|---:|---:|---:|---:|"
    );
    for &n in &slots {
        say(&format!(
            "{envs} environments × {} resources, parallel_environments: {n}",
            apps * RESOURCES_PER_APP
        ));
        let f = one_setting(envs, apps, n);
        let _ = writeln!(
            table,
            "| {envs} × {} | {} | {} | {} | {} MiB |",
            apps * RESOURCES_PER_APP,
            f.slots,
            duration(f.first),
            duration(f.change),
            f.peak_kib / 1024
        );
    }
    println!("\nload average: {}\n\n{table}", load_average());
}

fn one_setting(envs: usize, apps: usize, slots: usize) -> Figures {
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path();
    let work = cli::bare_and_clone(root);
    for e in 0..envs {
        write(
            &work,
            &format!("environments/env-{e:03}.yaml"),
            "type: development\n",
        );
    }
    write(&work, "definitions/platform.yaml", &definitions());
    for a in 0..apps {
        write(&work, &workload_path(a), &workload(1));
    }
    commit_push(&work, "the platform");
    write(
        root,
        "host.yaml",
        &format!("watch_interval: 1s\nparallel_environments: {slots}\n"),
    );
    let state = root.join("state.db");
    let started = Instant::now();
    let mut daemon = start_daemon(root, &state);
    wait_for(
        &state,
        &format!(
            "SELECT COUNT(*) >= {envs} FROM deployment WHERE status = 'succeeded' AND kind = 'commit'"
        ),
    );
    let first = started.elapsed().as_secs_f64();

    // One definition every environment uses: each one's redis changes.
    let platform = definitions().replace("host: redis.internal", "host: redis2.internal");
    assert_ne!(platform, definitions(), "the change changes something");
    write(&work, "definitions/platform.yaml", &platform);
    let pushed = Instant::now();
    let commit = commit_push(&work, "every redis moves");
    wait_for(
        &state,
        &format!(
            "SELECT COUNT(*) >= {envs} FROM deployment
             WHERE status = 'succeeded' AND commit_id = '{commit}' AND updated > 0"
        ),
    );
    let change = pushed.elapsed().as_secs_f64();
    let peak_kib = peak_rss_kib(&daemon);
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status();
    let _ = daemon.wait();
    Figures {
        slots,
        first,
        change,
        peak_kib,
    }
}

fn commit_push(work: &Path, message: &str) -> String {
    git(work, &["add", "-A"]);
    git(work, &["commit", "--quiet", "-m", message]);
    git(work, &["push", "--quiet", "origin", "main"]);
    head(work)
}

fn start_daemon(root: &Path, state: &Path) -> Child {
    let log = std::fs::File::create(root.join("daemon.log")).expect("a log file");
    Command::new(GITPLANE)
        .arg("daemon")
        .arg("--repo")
        .arg(root.join("origin.git"))
        .arg("--state")
        .arg(state)
        .arg("--config")
        .arg(root.join("host.yaml"))
        .env("GITPLANE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the daemon")
}

/// Waits until `query` (one integer) on the state is non-zero.
fn wait_for(state: &Path, query: &str) {
    let start = Instant::now();
    loop {
        if let Ok(conn) = rusqlite::Connection::open(state) {
            let n: i64 = conn.query_row(query, [], |r| r.get(0)).unwrap_or(0);
            if n > 0 {
                return;
            }
        }
        assert!(start.elapsed() < LIMIT, "not in {LIMIT:?}: {query}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon's peak resident memory so far (`VmHWM`), in KiB.
fn peak_rss_kib(daemon: &Child) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", daemon.id()))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
