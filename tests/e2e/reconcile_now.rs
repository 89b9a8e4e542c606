//! `gitplane reconcile`: the running daemon is asked to look now, through the real daemon and
//! CLI. A failed deployment whose retry is an hour away runs at once; a push to a remote the
//! daemon fetches hourly is fetched and deployed; each answer without a deployment says why;
//! with no daemon running nothing is asked.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::daemon::Daemon;
use crate::remote_host::{daemon_of_remote, gitplane_in};
use crate::util::{Sandbox, http_driver_config, wait_until};
use crate::workflow::{strs, write_platform};
use gitplane_testkit::{Behavior, DriverServer};

fn short(commit: &str) -> &str {
    &commit[..12]
}

/// The daemon's arguments: the HTTP driver of `server`, and neither a look of its own nor a
/// retry within the hour, so only a request makes it deploy now.
fn idle_daemon_args(sb: &Sandbox, server: &DriverServer) -> Vec<String> {
    sb.host_config(&format!(
        "{}watch_interval: 1h\nretry:\n  deployments: {{interval: 1h, max_interval: 2h}}\n",
        http_driver_config(&server.url, "timeout: 10s")
    ))
}

#[test]
fn a_failed_deployment_runs_at_once_when_asked_and_each_other_answer_says_why() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            fail: Some((400, 1)),
            ..Behavior::default()
        },
    );
    write_platform(&sb, "1");
    let commit = sb.commit("v1 on a driver that fails once");
    let daemon = Daemon::start(&sb, &strs(&idle_daemon_args(&sb, &server)));
    // The worker says when it retries once the failed deployment is recorded.
    daemon.wait_for_log(
        "the deployment did not finish: retried in",
        Duration::from_secs(30),
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE status = 'failed'"),
        1
    );
    let log = daemon.log();
    let retry_in: u64 = log
        .split("retried in ")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(0);
    assert!(
        retry_in > 1000,
        "the retry is most of an hour away (with jitter):\n{log}"
    );

    let asked = Instant::now();
    let run = sb
        .gitplane(&["reconcile", "--env", "test", "--wait", "--timeout", "60s"])
        .ok();
    let took = asked.elapsed();
    let deployment = sb.last_deployment("test");
    assert_eq!(deployment.status, "succeeded", "{}", daemon.log());
    run.stdout_has(&format!(
        "test: deployment {} of {} succeeded",
        deployment.id,
        short(&commit)
    ));
    assert!(
        took < Duration::from_secs(30),
        "asked and deployed in {took:?}"
    );
    // The daemon on this host answered it, and the request is in the action log.
    assert_eq!(
        sb.rows("SELECT env, action, commit_id, answered_by FROM reconcile_request"),
        [[
            "test".to_owned(),
            "deploying".to_owned(),
            commit.clone(),
            format!("{}:{}", hostname(), daemon.pid())
        ]]
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM action WHERE command = 'reconcile' AND env = 'test'"),
        1
    );

    // At its commit: nothing to deploy, and no deployment recorded.
    let deployments = sb.count("SELECT COUNT(*) FROM deployment");
    sb.gitplane(&["reconcile", "--env", "test", "--wait"])
        .ok()
        .stdout_has(&format!("test: up to date at {}", short(&commit)));
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), deployments);

    // A name no environment has: the daemon says so, and the command fails.
    sb.gitplane(&["reconcile", "--env", "tset", "--wait"])
        .fails()
        .stdout_has(&format!(
            "tset: unknown: no environment 'tset' in commit {} of the watched ref",
            short(&commit)
        ));

    // Pinned: nothing deployed, as the pin says.
    sb.gitplane(&["pin", "--env", "test", "--reason", "freeze for the audit"])
        .ok();
    sb.gitplane(&["reconcile", "--env", "test", "--wait"])
        .ok()
        .stdout_has("test: pinned: pinned at")
        .stdout_has("freeze for the audit");
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), deployments);

    // Without --wait the command says who was told, and JSON is an array of requests.
    sb.gitplane(&["reconcile", "--env", "test"])
        .ok()
        .stdout_has(&format!(
            "the daemon on this host (pid {}) was told at once",
            daemon.pid()
        ));
    let json = sb
        .gitplane(&["reconcile", "--env", "test", "--wait", "-o", "json"])
        .ok()
        .json();
    assert_eq!(json[0]["env"], "test", "{json}");
    assert_eq!(json[0]["outcome"], "pinned", "{json}");
}

#[test]
fn a_request_written_by_a_command_on_another_host_is_answered_at_the_daemons_next_look() {
    let sb = Sandbox::template();
    sb.gitplane(&["apply"]).ok();
    let commit = sb.head();
    // Watching every second: a request no signal announces is taken at the next look.
    let args = sb.host_config("watch_interval: 1s\n");
    let daemon = Daemon::start(&sb, &strs(&args));
    request_in_the_state(&sb, "production");
    assert_answered_up_to_date(&sb, &daemon, &commit);
}

/// A request for `env` written into the state as `gitplane reconcile` on some host would.
fn request_in_the_state(sb: &Sandbox, env: &str) {
    sb.db()
        .execute(
            "INSERT INTO reconcile_request (id, env, requested_by, requested_at)
             VALUES ('written-by-hand', ?1, 'ops@elsewhere',
                     strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
            [env],
        )
        .unwrap();
}

/// Waits until the one request is answered, and checks the answer: up to date at `commit`.
#[track_caller]
fn assert_answered_up_to_date(sb: &Sandbox, daemon: &Daemon, commit: &str) {
    wait_until(
        "the request answered",
        Duration::from_secs(20),
        || sb.count("SELECT COUNT(*) FROM reconcile_request WHERE answered_at IS NOT NULL") == 1,
        || daemon.log(),
    );
    assert_eq!(
        sb.rows("SELECT action, commit_id FROM reconcile_request"),
        [["up to date".to_owned(), commit.to_owned()]]
    );
}

#[test]
fn a_request_waiting_in_the_state_is_answered_when_a_daemon_starts() {
    let sb = Sandbox::template();
    sb.gitplane(&["apply"]).ok();
    let commit = sb.head();
    request_in_the_state(&sb, "development");
    // No look of its own within the test: the request is taken as the daemon starts.
    let args = sb.host_config("watch_interval: 1h\n");
    let daemon = Daemon::start(&sb, &strs(&args));
    assert_answered_up_to_date(&sb, &daemon, &commit);
}

#[test]
fn with_no_daemon_running_nothing_is_asked() {
    let sb = Sandbox::applied();
    let no_daemon = |sb: &Sandbox| {
        sb.gitplane(&["reconcile", "--env", "production", "--wait"])
            .fails()
            .stderr_has("no gitplane daemon runs on")
            .stderr_has("nothing was asked");
        assert_eq!(sb.count("SELECT COUNT(*) FROM reconcile_request"), 0);
    };
    no_daemon(&sb);
    // A daemon killed outright leaves its row behind; its process is gone, so it counts for
    // nothing (and its pid is never signalled).
    let daemon = Daemon::start(
        &sb,
        &[
            "--repo",
            sb.origin.to_str().unwrap(),
            "--state",
            sb.state.to_str().unwrap(),
        ],
    );
    assert_eq!(sb.count("SELECT COUNT(*) FROM daemon"), 1);
    // SIGKILL: no clean stop to remove the row.
    drop(daemon);
    no_daemon(&sb);
    // The next daemon on this host forgets it; a clean stop removes its own row.
    let mut daemon = Daemon::start(
        &sb,
        &[
            "--repo",
            sb.origin.to_str().unwrap(),
            "--state",
            sb.state.to_str().unwrap(),
        ],
    );
    assert_eq!(
        sb.column("SELECT pid FROM daemon"),
        [daemon.pid().to_string()]
    );
    daemon.terminate();
    assert_eq!(sb.count("SELECT COUNT(*) FROM daemon"), 0);
}

#[test]
fn a_push_to_a_remote_fetched_hourly_is_fetched_and_deployed_when_asked() {
    let sb = Sandbox::template();
    let (daemon, config, _) = daemon_of_remote(&sb, "1h", "watch_interval: 1h\n");
    sb.edit(
        "workloads/shop/frontend.yaml",
        "frontend:2.0.0",
        "frontend:2.1.0",
    );
    let second = sb.commit("frontend 2.1.0");
    let elsewhere = sb.root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let run = gitplane_in(
        &elsewhere,
        &config,
        &["reconcile", "--wait", "--timeout", "60s"],
        &[],
    )
    .ok();
    // The fetch found the commit and deployed it; the answer came while the deployment was
    // queued (deploying, then its outcome) or once it had ended (up to date): either way, at
    // the pushed commit.
    for env in ["development", "production"] {
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with(&format!("{env}: "))
                    && (l.contains(&format!("of {} succeeded", short(&second)))
                        || l.contains(&format!("up to date at {}", short(&second))))),
            "{env} deployed at the pushed commit:\n{}\n{}",
            run.stdout,
            daemon.log()
        );
    }
}

fn hostname() -> String {
    let out = Command::new("hostname").output().expect("run hostname");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
