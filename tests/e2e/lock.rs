//! The apply lock on a PostgreSQL state: two `gitplane apply` runs that read the same stale
//! lock row at once never both apply; the driver never sees the environment's calls from both,
//! and creates each resource once.
//!
//! The interleaving is forced: the test holds the lock row (`SELECT ... FOR UPDATE` in a
//! session of its own) so that both runs have read the stale holder and wait to write it when
//! the test lets them go together.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::reconcile::http_platform;
use crate::util::{Run, Sandbox, wait_until};
use gitplane_testkit::{Behavior, DriverServer, Received};

/// `gitplane ARGS --state STATE --config CONFIG` against the sandbox's repository.
fn gitplane(sb: &Sandbox, state: &str, config: &Path, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend([
        "--repo",
        sb.origin.to_str().unwrap(),
        "--state",
        state,
        "--config",
        config.to_str().unwrap(),
    ]);
    sb.gitplane_raw(&all, &[])
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn two_applies_taking_over_one_stale_lock_never_both_run() {
    let test = "two_applies_taking_over_one_stale_lock_never_both_run";
    let Some(server) = gitplane_testkit::shared_or_skip(test) else {
        return;
    };
    let url = server.database();
    let sb = Sandbox::new();
    let driver = DriverServer::start();
    // Slow answers: two runs let through together would be calling the driver at once.
    for res_type in ["base-env", "postgres", "workload"] {
        driver.behave(
            res_type,
            Behavior {
                delay: Duration::from_millis(300),
                ..Behavior::default()
            },
        );
    }
    // One workload: base-env, its database and the workload, each after the one before, so
    // one run's calls never overlap each other.
    http_platform(&sb, &driver, 1);
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "state_key: {{file: {}}}\n{}",
            sb.root.join("state.key").display(),
            sb.read("host.yaml")
        ),
    )
    .unwrap();
    // The schema, the repository and the key, before the race.
    gitplane(&sb, &url, &config, &["status"]).ok();

    // A holder on another host that stopped renewing a minute ago.
    let mut session = server.session(&url).unwrap();
    session
        .run(
            "INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at)
             VALUES ('test', 'ghost', 1, 'elsewhere',
                     strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds'),
                     strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds'))",
        )
        .unwrap();
    session
        .run("BEGIN; SELECT holder FROM env_lock WHERE env = 'test' FOR UPDATE")
        .unwrap();
    let waiting = || {
        server
            .psql(
                &url,
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .unwrap()
            .trim()
            .to_owned()
    };
    let (raced, runs): (bool, Vec<Run>) = std::thread::scope(|s| {
        let applies: Vec<_> = (0..2)
            .map(|_| s.spawn(|| gitplane(&sb, &url, &config, &["apply"])))
            .collect();
        // Both have read the stale holder and wait to write the row (or one ended already,
        // which the checks below show).
        wait_until(
            "both applies waiting on the lock row",
            Duration::from_secs(60),
            || waiting() == "2" || applies.iter().any(|a| a.is_finished()),
            || {
                server
                    .psql(
                        &url,
                        "SELECT pid, state, wait_event_type, wait_event, left(query, 100)
                         FROM pg_stat_activity WHERE datname = current_database()",
                    )
                    .unwrap_or_else(|e| e)
            },
        );
        let raced = waiting() == "2";
        session.run("ROLLBACK").unwrap();
        let runs = applies.into_iter().map(|a| a.join().unwrap()).collect();
        (raced, runs)
    });

    let shown: String = runs.iter().map(ToString::to_string).collect();
    assert!(
        raced,
        "both applies read the stale holder before either wrote:{shown}"
    );
    let succeeded = runs.iter().filter(|r| r.code == Some(0)).count();
    assert_eq!(succeeded, 1, "exactly one apply runs:{shown}");
    let refused = runs
        .iter()
        .find(|r| r.code != Some(0))
        .expect("the other apply");
    assert!(
        refused.stderr.contains("another gitplane (process ")
            && refused.stderr.contains("is applying to environment test")
            && !refused.stderr.contains("panicked at"),
        "the other apply is refused as busy:{shown}"
    );

    let received = driver.received();
    // No two calls at the driver at once: one run's calls follow each other.
    let mut calls: Vec<&Received> = received.iter().collect();
    calls.sort_by_key(|r| r.arrived);
    for pair in calls.windows(2) {
        assert!(
            pair[1].arrived >= pair[0].answered,
            "{} {} arrived while {} {} was running:{shown}",
            pair[1].method,
            pair[1].guresid,
            pair[0].method,
            pair[0].guresid
        );
    }
    // Each resource created by one PUT, once.
    let mut puts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in received.iter().filter(|r| r.method == "PUT") {
        *puts.entry(r.guresid.as_str()).or_default() += 1;
    }
    assert_eq!(puts.len(), 3, "{puts:?}");
    assert!(puts.values().all(|&n| n == 1), "{puts:?}");
    assert!(driver.creations().values().all(|&n| n == 1));
    // One deployment, succeeded, and the lock released.
    let rows = server
        .psql(&url, "SELECT env, status FROM deployment ORDER BY id")
        .unwrap();
    assert_eq!(rows.trim(), "test|succeeded", "{shown}");
    let locks = server.psql(&url, "SELECT COUNT(*) FROM env_lock").unwrap();
    assert_eq!(locks.trim(), "0");
}

#[test]
fn an_apply_whose_lock_another_took_starts_no_new_driver_call() {
    let sb = Sandbox::new();
    let driver = DriverServer::start();
    // The first call outlasts a renewal of the lock (every 5 s): by its end the apply knows.
    driver.behave(
        "base-env",
        Behavior {
            delay: Duration::from_secs(7),
            ..Behavior::default()
        },
    );
    http_platform(&sb, &driver, 1);
    // Time enough for the slow answer.
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        sb.read("host.yaml").replace("timeout: 2s", "timeout: 30s"),
    )
    .unwrap();
    let run = std::thread::scope(|s| {
        let apply = s.spawn(|| sb.gitplane(&["apply", "--config", config.to_str().unwrap()]));
        // Read only once the file and its schema are there.
        let held = || {
            sb.state.exists()
                && sb
                    .db()
                    .query_row("SELECT COUNT(*) FROM env_lock", [], |r| r.get::<_, i64>(0))
                    .is_ok_and(|n| n == 1)
        };
        wait_until(
            "the apply holding its lock",
            Duration::from_secs(30),
            || held() || apply.is_finished(),
            String::new,
        );
        // Another process takes the row over, as one would a stale lock.
        sb.db()
            .execute(
                "UPDATE env_lock SET holder = 'thief', pid = 1, host = 'elsewhere'",
                [],
            )
            .unwrap();
        apply.join().unwrap()
    });
    let run = run.fails();
    run.stderr_has("stopped: this process no longer holds the environment's lock");
    // The call in flight finished; nothing after it started.
    assert!(driver.wait_for_requests(1, Duration::from_secs(10)));
    let received = driver.received();
    assert_eq!(received.len(), 1, "{received:#?}{run}");
    assert_eq!(received[0].body["type"], "base-env");
    assert_eq!(sb.last_deployment("test").status, "failed");
    // Its release left the new holder's row alone.
    assert_eq!(sb.column("SELECT holder FROM env_lock"), ["thief"]);
}
