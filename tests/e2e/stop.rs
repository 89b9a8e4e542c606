//! Stopping the daemon: once SIGTERM arrives no new driver call starts, however many wait for
//! a permit; what did not start is recorded for the next start, which does it, creating each
//! resource once. Drift reads stop the same way: they go through the same call engine.

use std::time::{Duration, Instant};

use crate::daemon::{Daemon, repo_args, wait_succeeded};
use crate::util::Sandbox;
use gitplane_testkit::{Behavior, DriverServer};

/// How many resources wait behind the driver's one permit.
const QUEUES: usize = 20;
/// How long the driver takes over each call.
const SLOW: Duration = Duration::from_millis(300);
/// How soon after SIGTERM the last driver call may start: the time the daemon takes to notice.
const GRACE: Duration = Duration::from_millis(100);

/// One app whose workload (echo) reads `QUEUES` queues of the HTTP driver at `server`, which
/// takes one call at a time (`concurrency: 1`); with `drift` the environment's line for drift
/// runs. The daemon's arguments and the commit.
fn queues_platform(sb: &Sandbox, server: &DriverServer, drift: &str) -> (Vec<String>, String) {
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 10s, concurrency: 1}}\n",
            server.url
        ),
    )
    .expect("write the host config");
    sb.write(
        "environments/test.yaml",
        &format!("type: test\nimplicit_resources: []\n{drift}"),
    );
    sb.write(
        "definitions/platform.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: queue\nentity:\n  \
         type: queue\n  driver_type: test/http\n  driver_inputs:\n    values:\n      size: small\n  \
         criteria:\n    - {}\n---\n\
         apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: wl\nentity:\n  \
         type: workload\n  driver_type: echo\n  criteria:\n    - {}\n",
    );
    let resources: String = (0..QUEUES)
        .map(|i| format!("  q{i:02}:\n    type: queue\n"))
        .collect();
    sb.write(
        "workloads/shop/api.yaml",
        &format!(
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: api\ncontainers:\n  main:\n    \
             image: x\nresources:\n{resources}"
        ),
    );
    let commit = sb.commit("Twenty queues behind one permit");
    let mut args = repo_args(sb);
    args.extend(["--config".to_owned(), config.display().to_string()]);
    (args, commit)
}

/// The requests with `method` that arrived later than `GRACE` after `sent`, each with how late.
fn started_after(server: &DriverServer, method: &str, sent: Instant) -> Vec<(String, Duration)> {
    server
        .arrivals()
        .into_iter()
        .filter(|(m, _, at)| m == method && *at > sent + GRACE)
        .map(|(_, guresid, at)| (guresid, at - sent))
        .collect()
}

/// Finding 3 of issue 25: each queued call used to start when a permit freed, SIGTERM or not.
#[test]
fn sigterm_starts_no_queued_driver_call() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "queue",
        Behavior {
            delay: SLOW,
            ..Behavior::default()
        },
    );
    let (args, commit) = queues_platform(&sb, &server, "");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&sb, &args);
    assert!(
        server.wait_for_arrivals(1, Duration::from_secs(30)),
        "no driver call:\n{}",
        daemon.log()
    );
    // The first call is at the driver, the other 19 wait for its permit.
    let sent = Instant::now();
    let (code, _) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    let late = started_after(&server, "PUT", sent);
    assert!(
        late.is_empty(),
        "driver calls started more than {GRACE:?} after SIGTERM: {late:?}\n{}",
        daemon.log()
    );

    // What ran is recorded as done; every other resource as skipped for the next start.
    let puts = server.arrivals().len() as i64;
    assert!(puts < QUEUES as i64, "{puts} calls");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM operation WHERE type = 'queue' AND status = 'succeeded'"),
        puts
    );
    assert_eq!(
        sb.count(
            "SELECT COUNT(*) FROM operation WHERE status = 'skipped' \
             AND error = 'stopped: gitplane is shutting down'"
        ),
        QUEUES as i64 + 1 - puts,
        "the queues not called and the workload: {:?}",
        sb.rows("SELECT type, status, error FROM operation ORDER BY id")
    );
    let d = sb.last_deployment("test");
    assert_eq!(d.status, "failed");

    // The next start deploys the rest; the driver created each resource once.
    server.behave("queue", Behavior::default());
    let _daemon = Daemon::start(&sb, &args);
    wait_succeeded(&sb, &commit);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE status = 'ready'"),
        QUEUES as i64 + 1
    );
    assert_eq!(server.instances().len(), QUEUES);
    for (guresid, n) in server.creations() {
        assert_eq!(n, 1, "{guresid} created {n} times");
    }
}

/// Drift reads go through the same engine: SIGTERM during a detect run starts no queued read.
#[test]
fn sigterm_starts_no_queued_drift_read() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave_reads(Behavior {
        delay: SLOW,
        ..Behavior::default()
    });
    // Every second (six fields: with seconds).
    let (args, commit) =
        queues_platform(&sb, &server, "drift: detect\nschedule: \"* * * * * *\"\n");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&sb, &args);
    // The PUTs of the deployment, then the first read of a detect run.
    assert!(
        server.wait_for_arrivals(QUEUES + 1, Duration::from_secs(30)),
        "no drift read:\n{}",
        daemon.log()
    );
    assert_eq!(sb.last_deployment("test").commit, commit);
    let sent = Instant::now();
    let (code, _) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    let late = started_after(&server, "GET", sent);
    assert!(
        late.is_empty(),
        "drift reads started more than {GRACE:?} after SIGTERM: {late:?}\n{}",
        daemon.log()
    );
    let methods: Vec<String> = server.arrivals()[QUEUES..]
        .iter()
        .map(|(m, _, _)| m.clone())
        .collect();
    assert!(
        methods.iter().all(|m| m == "GET"),
        "a detect run only reads: {methods:?}"
    );
}
