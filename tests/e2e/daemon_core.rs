//! The daemon's core on one host: its per-environment request queue (a drift tick never throws
//! a pushed commit away) and its retry policy (a deployment that did not finish is retried
//! until it succeeds, without a new commit, also when the database went away mid-deployment),
//! and its heartbeat (which beats while the database hangs), through the real daemon on a
//! repository pushed to, on SQLite and on PostgreSQL.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::daemon::Daemon;
use crate::failover::{ENVS, Fleet, assert_created_once};
use crate::util::Sandbox;
use crate::workflow::{host_config, strs, wait_until, write_platform, write_workload};
use gitplane_testkit::{Behavior, DriverServer};

/// The statuses and attempts of `env`'s deployments of `commit`, oldest first.
fn attempts(sb: &Sandbox, env: &str, commit: &str) -> Vec<(String, String)> {
    sb.rows(&format!(
        "SELECT status, attempt FROM deployment WHERE env = '{env}' AND commit_id = '{commit}' \
         AND kind = 'commit' ORDER BY id"
    ))
    .into_iter()
    .map(|r| (r[0].clone(), r[1].clone()))
    .collect()
}

#[test]
fn a_push_while_the_worker_is_busy_is_deployed_though_drift_ticks_come_meanwhile() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    // Every call to the database's driver takes a while: each drift run (every second, calling
    // every driver) keeps the environment's worker busy, so the push waits behind one.
    server.behave(
        "postgres",
        Behavior {
            delay: Duration::from_millis(1500),
            ..Behavior::default()
        },
    );
    write_platform(&sb, "1");
    sb.write(
        "environments/test.yaml",
        "type: test\nschedule: \"* * * * * *\"\n",
    );
    let first = sb.commit("v1, drift-corrected every second");
    let args = host_config(&sb, &server, "");
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_until("v1 deployed", &daemon, Duration::from_secs(30), || {
        attempts(&sb, "test", &first)
            .iter()
            .any(|(s, _)| s == "succeeded")
    });
    // A drift run is calling the slow driver now.
    wait_until(
        "a drift run started",
        &daemon,
        Duration::from_secs(10),
        || sb.count("SELECT COUNT(*) FROM deployment WHERE kind = 'drift'") > 0,
    );
    write_workload(&sb, "2");
    let second = sb.commit("v2 while a drift run is busy");
    wait_until(
        "the commit pushed during a drift run deployed",
        &daemon,
        Duration::from_secs(30),
        || {
            attempts(&sb, "test", &second)
                .iter()
                .any(|(s, _)| s == "succeeded")
        },
    );
    assert_eq!(
        sb.rows("SELECT commit_id FROM deployment WHERE kind = 'commit' AND status = 'succeeded' ORDER BY id DESC LIMIT 1"),
        [[second.clone()]],
        "{}",
        daemon.log()
    );
}

#[test]
fn a_driver_failing_its_first_three_calls_ends_with_a_succeeded_deployment_by_retry_alone() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    // A final error (400) for the database's first three calls: each deployment fails.
    server.behave(
        "postgres",
        Behavior {
            fail: Some((400, 3)),
            ..Behavior::default()
        },
    );
    write_platform(&sb, "1");
    let commit = sb.commit("v1 on a driver that fails three times first");
    let args = host_config(
        &sb,
        &server,
        "retry:\n  deployments: {interval: 200ms, max_interval: 1s}\n",
    );
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_until(
        "the commit deployed by retries alone",
        &daemon,
        Duration::from_secs(30),
        || {
            attempts(&sb, "test", &commit)
                .last()
                .is_some_and(|(s, _)| s == "succeeded")
        },
    );
    assert_eq!(
        attempts(&sb, "test", &commit),
        [
            ("failed".to_owned(), "1".to_owned()),
            ("failed".to_owned(), "2".to_owned()),
            ("failed".to_owned(), "3".to_owned()),
            ("succeeded".to_owned(), "4".to_owned()),
        ],
        "three failed attempts, then the fourth succeeded\n{}",
        daemon.log()
    );
    assert_eq!(sb.head(), commit, "no new commit was pushed");
    let log = daemon.log();
    assert!(
        log.contains("the deployment did not finish: retried in"),
        "the log says when it retries:\n{log}"
    );
    // `history` says which deployments were retries.
    let history = sb.gitplane(&["history", "--env", "test"]).ok();
    assert!(
        history.stdout.contains("succeeded (retry 3)"),
        "{}",
        history.stdout
    );
    let json = sb
        .gitplane(&["history", "--env", "test", "--format", "json"])
        .ok()
        .json();
    let newest = json
        .as_array()
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or(json);
    assert_eq!(newest["attempt"], 4, "{newest}");
    // Once succeeded, nothing more is retried.
    let deployments = sb.count("SELECT COUNT(*) FROM deployment");
    // Not a wait for an event: several retry intervals pass, to show that no retry comes.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), deployments);
}

#[test]
fn a_newer_commit_ends_the_retries_of_a_failing_one() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            fail: Some((400, 1000)),
            ..Behavior::default()
        },
    );
    write_platform(&sb, "1");
    let failing = sb.commit("v1 on a driver that always fails");
    let args = host_config(
        &sb,
        &server,
        "retry:\n  deployments: {interval: 300ms, max_interval: 300ms}\n",
    );
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_until("two retries", &daemon, Duration::from_secs(30), || {
        attempts(&sb, "test", &failing).len() >= 3
    });
    // The fix: a definition that no longer fails (its own resource type, so the driver
    // behaves).
    server.behave("postgres", Behavior::default());
    write_workload(&sb, "2");
    let fixed = sb.commit("v2");
    wait_until("v2 deployed", &daemon, Duration::from_secs(30), || {
        attempts(&sb, "test", &fixed)
            .iter()
            .any(|(s, _)| s == "succeeded")
    });
    let before = attempts(&sb, "test", &failing).len();
    // Not a wait for an event: several retry intervals pass, to show that v1 is not retried.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        attempts(&sb, "test", &failing).len(),
        before,
        "v1 is not retried once v2 came\n{}",
        daemon.log()
    );
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_database_outage_mid_deployment_ends_with_the_commit_deployed_without_a_new_commit() {
    let Some(server) = gitplane_testkit::postgres_or_skip("daemon_core::database_outage") else {
        return;
    };
    let mut fleet = Fleet::with_host(
        &server,
        "retry:\n  deployments: {interval: 1s, max_interval: 2s}\n",
    );
    let first = fleet.sb.head();
    fleet.start(1);
    fleet.wait_until(
        "every environment deployed",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &first),
    );
    // The deployments of the next commit are inside driver calls when the database goes.
    fleet.driver.close();
    fleet
        .sb
        .edit("definitions/platform.yaml", "build: 1", "build: 2");
    let second = fleet.sb.commit("A new build of every database");
    fleet.wait_until("driver calls under way", Duration::from_secs(30), || {
        !fleet.driver.waiting_envs().is_empty()
    });
    server.stop();
    fleet.driver.open();
    // Not a wait for an event: the outage's length is what the test is about.
    thread::sleep(Duration::from_secs(10));
    server.start_again();
    let recovered = fleet.wait_until(
        "the commit deployed everywhere after the outage, with no new commit",
        Duration::from_secs(90),
        || fleet.all_succeeded(&ENVS, &second),
    );
    eprintln!("daemon_core: deployed everywhere {recovered:?} after a 10 s outage ended");
    assert_eq!(
        fleet.sb.head(),
        second,
        "no commit was pushed after the outage"
    );
    assert_created_once(&fleet);
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn the_watchdog_heartbeat_goes_on_while_the_database_hangs_for_70_seconds() {
    let Some(server) = gitplane_testkit::postgres_or_skip("daemon_core::database_hang") else {
        return;
    };
    let mut fleet = Fleet::new(&server);
    let first = fleet.sb.head();
    let socket_path = fleet.sb.root.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("a read timeout");
    let beats: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let listening = Arc::new(AtomicBool::new(true));
    let listener = {
        let (beats, listening) = (beats.clone(), listening.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while listening.load(Ordering::SeqCst) {
                if let Ok(n) = socket.recv(&mut buf)
                    && String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1")
                {
                    beats.lock().unwrap().push(Instant::now());
                }
            }
        })
    };
    // WatchdogSec=2: a beat at least every second, as systemd asks (half the period).
    let watchdog = Duration::from_secs(2);
    fleet.start_one_with_env(&[
        ("NOTIFY_SOCKET", socket_path.to_str().expect("a UTF-8 path")),
        ("WATCHDOG_USEC", &watchdog.as_micros().to_string()),
    ]);
    fleet.wait_until(
        "every environment deployed",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &first),
    );
    let frozen = server.freeze();
    let hang = Instant::now();
    // A push while the database hangs: the daemon reads the commit and tries to record it.
    fleet
        .sb
        .edit("definitions/platform.yaml", "build: 1", "build: 2");
    let second = fleet.sb.commit("A commit pushed while the database hangs");
    // Not a wait for an event: the hang's length (past every timeout) is what the test is about.
    thread::sleep(Duration::from_secs(70));
    drop(frozen);
    let hung = hang.elapsed();
    let during: Vec<Instant> = beats
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|at| *at >= hang && *at <= hang + hung)
        .collect();
    let mut longest = during.first().map_or(hung, |first| *first - hang);
    for pair in during.windows(2) {
        longest = longest.max(pair[1] - pair[0]);
    }
    eprintln!(
        "daemon_core: {} heartbeats during a {hung:?} database hang, the longest gap {longest:?}",
        during.len()
    );
    assert!(
        longest < watchdog,
        "the heartbeat stopped for {longest:?} (WatchdogSec {watchdog:?}) while the database hung\n{}",
        fleet.diagnostics()
    );
    fleet.wait_until(
        "the commit pushed during the hang deployed once the database answers",
        Duration::from_secs(90),
        || fleet.all_succeeded(&ENVS, &second),
    );
    listening.store(false, Ordering::SeqCst);
    let _ = listener.join();
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn past_stop_timeout_the_lease_goes_only_after_the_running_call_is_killed_and_journalled() {
    let Some(server) = gitplane_testkit::shared_or_skip("daemon_core::stop_order") else {
        return;
    };
    let url = server.database();
    let sb = Sandbox::new();
    // A call that runs until it is killed, and says when it started.
    let started = sb.root.join("started");
    let program = sb.root.join("slow-driver");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\ncat >/dev/null\necho $$ > '{}'\nsleep 120\necho '{{\"status\":\"done\"}}'\n",
            started.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    sb.write(
        "environments/prod.yaml",
        "type: test\nimplicit_resources: []\n",
    );
    sb.write(
        "definitions/platform.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: workload\n\
         entity:\n  type: workload\n  driver_type: humanitec/echo\n  criteria:\n    - {}\n---\n\
         apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: slow\n\
         entity:\n  type: slow\n  driver_type: test/slow\n  criteria:\n    - {}\n",
    );
    sb.write(
        "workloads/app/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  thing:\n    type: slow\n",
    );
    sb.commit("One resource whose driver call runs until killed");
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "state: \"{url}\"\nstate_key: {{file: \"{}\"}}\nleases: {{ttl: 6s}}\nstop_timeout: 1s\n\
             drivers:\n  test/slow:\n    exec: {{command: [\"{}\"], timeout: 300s}}\n",
            sb.root.join("state.key").display(),
            program.display()
        ),
    )
    .unwrap();
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--repo",
        sb.origin.to_str().unwrap(),
    ];
    let mut daemon = Daemon::start(&sb, &args);
    let psql = |sql: &str| {
        server
            .psql(&url, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    };
    // When the daemon gives its lease up, note how many of the environment's operations were
    // still `started` (running, not journalled as interrupted) at that very moment.
    psql(
        "CREATE TABLE released (env TEXT, running BIGINT);
         CREATE FUNCTION note_release() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.daemon = '' AND OLD.daemon <> '' THEN
             INSERT INTO released SELECT NEW.env, COUNT(*) FROM operation o
               JOIN deployment d ON d.id = o.deployment_id
               WHERE d.env = NEW.env AND o.status = 'started';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER note_release BEFORE UPDATE ON env_lease
           FOR EACH ROW EXECUTE FUNCTION note_release();",
    );
    gitplane_testkit::eventually_or(
        "the call to start",
        Duration::from_secs(30),
        || started.exists().then_some(()),
        || daemon.log(),
    );
    let pid: i32 = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (code, _) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    assert!(
        !crate::failover::alive(pid as u32),
        "the driver's program was killed\n{}",
        daemon.log()
    );
    assert_eq!(
        psql("SELECT env, running FROM released").trim(),
        "prod|0",
        "the lease was given up after the running call was journalled as interrupted\n{}",
        daemon.log()
    );
    // Journalled as ended: interrupted by the stop, or failed by the kill if the run recorded
    // its call's end first. Either way the next holder calls the driver again.
    let status = psql("SELECT status FROM operation WHERE type = 'slow'");
    assert!(
        matches!(status.trim(), "interrupted" | "failed"),
        "{status}\n{}",
        daemon.log()
    );
}

/// Each environment's deployments as (started, finished) times, in the state's clock.
fn deployment_spans(sb: &Sandbox) -> Vec<(String, String)> {
    sb.rows(
        "SELECT started_at, finished_at FROM deployment WHERE kind = 'commit' ORDER BY started_at",
    )
    .into_iter()
    .map(|r| (r[0].clone(), r[1].clone()))
    .collect()
}

/// Three environments on a driver that takes 600 ms a call, deployed by a daemon with
/// `parallel_environments: slots`; the deployments' spans.
fn three_environments_with_slots(slots: usize) -> Vec<(String, String)> {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            delay: Duration::from_millis(600),
            ..Behavior::default()
        },
    );
    write_platform(&sb, "1");
    for env in ["blue", "green", "red"] {
        sb.write(&format!("environments/{env}.yaml"), "type: test\n");
    }
    sb.remove("environments/test.yaml");
    sb.commit("three environments");
    let args = host_config(&sb, &server, &format!("parallel_environments: {slots}\n"));
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_until(
        "the three deployed",
        &daemon,
        Duration::from_secs(30),
        || sb.count("SELECT COUNT(*) FROM deployment WHERE status = 'succeeded'") == 3,
    );
    deployment_spans(&sb)
}

#[test]
fn parallel_environments_bounds_the_deployments_running_at_once() {
    // One slot: each deployment starts after the one before finished.
    let one = three_environments_with_slots(1);
    for pair in one.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "a deployment started before the one before it finished: {one:?}"
        );
    }
    // Three slots: they overlap.
    let three = three_environments_with_slots(3);
    assert!(
        three.windows(2).any(|pair| pair[1].0 < pair[0].1),
        "the deployments ran one after the other: {three:?}"
    );
}
