//! The soak test (ignored by default; `cargo test --test e2e soak -- --ignored`): 200 commits
//! pushed to a running daemon while the HTTP driver fails one call in ten and the daemon is
//! killed (SIGKILL) and started again five times. At the end the state is the last commit's
//! graph, every GUResID was created once at the driver, and nothing the last commit wants was
//! ever deleted.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::daemon::Daemon;
use crate::util::{Definition, Sandbox, definitions, http_driver_config};
use gitplane_testkit::{Behavior, DriverServer};

const COMMITS: usize = 200;
const KILLS: [usize; 5] = [40, 80, 120, 160, 190];

fn workload(i: usize, version: usize) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: w{i}\ncontainers:\n  main:\n    \
         image: registry.example.com/w{i}:{version}\n    variables:\n      DB: \
         ${{resources.db.name}}\nresources:\n  db:\n    type: postgres\n"
    )
}

#[test]
#[ignore = "a soak test (about 20 s): run it with --ignored"]
fn two_hundred_commits_through_a_flaky_driver_and_five_kills() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    for t in ["base-env", "postgres", "workload"] {
        server.behave(
            t,
            Behavior {
                flaky_percent: 10,
                ..Behavior::default()
            },
        );
    }
    let config_args = sb.host_config(&format!(
        "{}retry: {{attempts: 6, initial_delay: 10ms, max_delay: 50ms, poll_interval: 10ms}}\n",
        http_driver_config(&server.url, "timeout: 5s")
    ));
    sb.write("environments/test.yaml", "type: test\n");
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::http("base-env").value("zone: example.test"),
            Definition::http("postgres").value("host: ${resources.base-env#base-env.outputs.name}"),
            Definition::http("workload").value("namespace: ${context.app.id}"),
        ]),
    );
    for i in 0..10 {
        sb.write(&format!("workloads/app/w{i}.yaml"), &workload(i, 0));
    }
    sb.commit("Ten workloads");

    let args: Vec<&str> = config_args.iter().map(String::as_str).collect();
    let mut daemon = Some(Daemon::start(&sb, &args));
    let mut retired = BTreeSet::new();
    let mut next = 10;
    let mut last = String::new();
    for c in 1..=COMMITS {
        // Most commits change a workload; every fifth adds one; every tenth retires one for
        // good (never brought back, so every GUResID is created once).
        if c % 10 == 0 {
            let gone = (c / 10) % next;
            if !retired.contains(&gone) && next - retired.len() > 5 {
                retired.insert(gone);
                sb.remove(&format!("workloads/app/w{gone}.yaml"));
            }
        } else if c % 5 == 0 {
            sb.write(&format!("workloads/app/w{next}.yaml"), &workload(next, c));
            next += 1;
        } else {
            let i = (0..next)
                .cycle()
                .skip(c)
                .find(|i| !retired.contains(i))
                .unwrap();
            sb.write(&format!("workloads/app/w{i}.yaml"), &workload(i, c));
        }
        last = sb.commit(&format!("Commit {c}"));
        if KILLS.contains(&c) {
            drop(daemon.take()); // SIGKILL, wherever it was
            daemon = Some(Daemon::start(&sb, &args));
        }
        // Not a wait for an event: the pace of the pushes, faster than a deployment.
        std::thread::sleep(Duration::from_millis(20));
    }
    // The last commit is deployed (pushing it again, empty, if a driver failure outlasted
    // the retries).
    let mut deployed = false;
    for _ in 0..5 {
        let status = wait_finished(&sb, &last);
        if status == "succeeded" {
            deployed = true;
            break;
        }
        sb.git(&["commit", "--quiet", "--allow-empty", "-m", "Again"]);
        sb.git(&["push", "--quiet", "origin", "main"]);
        last = sb.head();
    }
    let log = daemon.as_ref().map(|d| d.log()).unwrap_or_default();
    assert!(deployed, "the last commit was not deployed:\n{log}");

    // The state is the last commit's graph.
    let graph = sb
        .gitplane(&[
            "graph",
            "--rev",
            &last,
            "--format",
            "json",
            "--config",
            args[args.len() - 1],
        ])
        .ok()
        .json();
    let graph = if graph.is_array() {
        graph[0].clone()
    } else {
        graph
    };
    let wanted: BTreeSet<String> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["guresid"].as_str().unwrap().to_owned())
        .collect();
    let recorded: BTreeSet<String> = sb
        .column("SELECT guresid FROM resource WHERE status = 'ready'")
        .into_iter()
        .collect();
    assert_eq!(recorded, wanted, "state is the last commit's graph");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource"),
        wanted.len() as i64
    );
    // The driver holds exactly those, each created once, none of them ever deleted.
    let live: BTreeSet<String> = server.instances().into_keys().collect();
    assert_eq!(live, wanted, "the driver holds the last commit's graph");
    for (guresid, n) in server.creations() {
        assert_eq!(n, 1, "{guresid} was created {n} times");
    }
    let deleted: BTreeSet<String> = server
        .received()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.status == 204)
        .map(|r| r.guresid)
        .collect();
    assert!(
        deleted.is_disjoint(&wanted),
        "deleted what the last commit wants: {:?}",
        deleted.intersection(&wanted).collect::<Vec<_>>()
    );
    assert_eq!(sb.column("PRAGMA integrity_check"), ["ok"]);
    let received = server.received();
    let failed_calls = received.iter().filter(|r| r.status == 503).count();
    let share = failed_calls as f64 / received.len() as f64;
    assert!(
        (0.05..0.2).contains(&share),
        "the driver failed {failed_calls} of {} calls",
        received.len()
    );
    eprintln!(
        "soak: {} driver calls, {failed_calls} failed on purpose; {} deployments; {} resources",
        received.len(),
        sb.count("SELECT COUNT(*) FROM deployment"),
        wanted.len()
    );
}

/// The status of the newest finished commit deployment of `commit` in environment `test`.
#[track_caller]
fn wait_finished(sb: &Sandbox, commit: &str) -> String {
    gitplane_testkit::eventually(
        format_args!("{commit} deployed"),
        Duration::from_secs(300),
        || {
            let rows = sb.state.exists().then(|| {
                sb.rows(&format!(
                    "SELECT status FROM deployment WHERE commit_id = '{commit}' \
                     AND kind = 'commit' AND status NOT IN ('running') ORDER BY id DESC LIMIT 1"
                ))
            })?;
            rows.into_iter().next().map(|mut r| r.remove(0))
        },
    )
}
