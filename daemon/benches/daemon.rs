//! Latency of the daemon: from `git push` returning to the deployment starting, and to it
//! finishing, for a one-workload change in a repository of 1 000 apps.
//!
//! The real binary runs as `gitplane daemon` on a bare repository; a clone pushes a change to
//! one workload, and the deployment's `started_at` and `finished_at` are read from the state
//! file. `cargo bench --bench daemon` reports the medians of 15 pushes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const APPS: usize = 1_000;
const PUSHES: usize = 15;

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn workload(i: usize, version: usize) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: \
         registry.example.com/app-{i}:{version}\n    variables:\n      DB: ${{resources.db.host}}\n\
         resources:\n  db:\n    type: postgres\n"
    )
}

fn millis_since_epoch(iso: &str) -> f64 {
    let t: chrono::DateTime<chrono::Utc> = iso.parse().expect("an ISO time");
    t.timestamp_millis() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path();
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
    write(&work, "environments/bench.yaml", "type: bench\n");
    let def = |id: &str, values: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
             type: {id}\n  driver_type: echo\n  driver_inputs:\n    values:\n      {values}\n  \
             criteria:\n    - {{}}\n"
        )
    };
    write(
        &work,
        "definitions/platform.yaml",
        &[
            def("base-env", "pghost: db.internal"),
            def(
                "postgres",
                "host: ${resources.base-env#base-env.outputs.pghost}",
            ),
            def("workload", "namespace: ${context.app.id}"),
        ]
        .join("---\n"),
    );
    for i in 0..APPS {
        write(
            &work,
            &format!("workloads/app-{i:04}/web.yaml"),
            &workload(i, 0),
        );
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "--quiet", "-m", "1000 apps"]);
    git(&work, &["push", "--quiet", "origin", "main"]);

    let state = root.join("state.db");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_gitplane"))
        .args(["daemon", "--repo"])
        .arg(root.join("origin.git"))
        .arg("--state")
        .arg(&state)
        .env("GITPLANE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the daemon");

    let deployment_of = |commit: &str, wait: Duration| -> Option<(String, String)> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Ok(conn) = rusqlite::Connection::open(&state) {
                let row = conn.query_row(
                    "SELECT started_at, finished_at FROM deployment WHERE commit_id = ?1",
                    [commit],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
                );
                if let Ok((started, Some(finished))) = row {
                    return Some((started, finished));
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    };
    let head = |dir: &Path| {
        let out = Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(dir)
            .output()
            .expect("git");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let first = head(&work);
    let initial = Instant::now();
    deployment_of(&first, Duration::from_secs(300)).expect("the first commit is deployed");
    println!(
        "initial deployment of {} resources: {:.1} s",
        APPS * 3,
        initial.elapsed().as_secs_f64()
    );

    let mut to_start = Vec::new();
    let mut to_finish = Vec::new();
    for n in 1..=PUSHES {
        let app = (n * 37) % APPS;
        write(
            &work,
            &format!("workloads/app-{app:04}/web.yaml"),
            &workload(app, n),
        );
        git(&work, &["commit", "--quiet", "-am", "one workload"]);
        git(&work, &["push", "--quiet", "origin", "main"]);
        let pushed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64()
            * 1000.0;
        let commit = head(&work);
        let (started, finished) =
            deployment_of(&commit, Duration::from_secs(30)).expect("the change is deployed");
        to_start.push(millis_since_epoch(&started) - pushed);
        to_finish.push(millis_since_epoch(&finished) - pushed);
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    println!(
        "{PUSHES} one-workload pushes, {APPS} apps: push -> deployment started: median {:.0} ms \
         (min {:.0}, max {:.0}); push -> finished: median {:.0} ms (min {:.0}, max {:.0})",
        median(to_start.clone()),
        to_start.iter().copied().fold(f64::INFINITY, f64::min),
        to_start.iter().copied().fold(0.0, f64::max),
        median(to_finish.clone()),
        to_finish.iter().copied().fold(f64::INFINITY, f64::min),
        to_finish.iter().copied().fold(0.0, f64::max),
    );
}
