//! Deployment notifications (`notify:`) from the real daemon to a receiver on 127.0.0.1: the
//! events a target asked for, with the commit, env and status; a driver's message without its
//! secrets; held and drift events; retries on 5xx and none on other 4xx; the Slack form; a URL
//! read from a file when sent. No log line names a URL.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use gitplane_testkit::{HttpServer, Logged, Reply, eventually_or};
use serde_json::Value;

use crate::daemon::{Daemon, wait_deployed, write_http_platform};
use crate::util::{Definition, Sandbox, definitions, http_driver_config};
use gitplane_testkit::{Behavior, DriverServer};

/// Part of every receiver's path: a Slack webhook's path is its secret, so no log may show it.
const URL_SECRET: &str = "s3cr3t-hook";

/// One POST a receiver got.
#[derive(Debug, Clone)]
struct Got {
    body: Value,
    content_type: Option<String>,
    user_agent: Option<String>,
    /// The status it answered.
    status: u16,
    arrived: Instant,
}

impl Got {
    fn of(logged: &Logged) -> Got {
        let request = &logged.request;
        Got {
            body: request.json(),
            content_type: request.header("Content-Type").map(str::to_owned),
            user_agent: request.header("User-Agent").map(str::to_owned),
            status: logged.status,
            arrived: request.arrived,
        }
    }
}

/// A notification target on 127.0.0.1 that records each request.
struct Receiver {
    url: String,
    server: HttpServer,
}

impl Receiver {
    /// Answers 200 to everything.
    fn start() -> Receiver {
        Receiver::answering(&[], None)
    }

    /// Answers `script` first, then `otherwise` (200 when `None`) to every later request.
    fn answering(script: &[u16], otherwise: Option<u16>) -> Receiver {
        let script = Mutex::new(script.iter().copied().collect::<VecDeque<u16>>());
        let server = HttpServer::start(move |_| {
            let mut script = script.lock().unwrap_or_else(|e| e.into_inner());
            Reply::text(script.pop_front().or(otherwise).unwrap_or(200), "{}")
        });
        Receiver {
            url: format!("{}/services/T0/{URL_SECRET}-{}", server.url, server.port()),
            server,
        }
    }

    fn got(&self) -> Vec<Got> {
        self.server.requests().iter().map(Got::of).collect()
    }

    /// Waits (up to 20 s) until what was received satisfies `done`; returns it.
    #[track_caller]
    fn wait_until(&self, daemon: &Daemon, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        eventually_or(
            "the receiver to get what was expected",
            Duration::from_secs(20),
            || Some(self.got()).filter(|got| done(got)),
            || {
                format!(
                    "it got {:#?}\ndaemon log:\n{}",
                    self.got()
                        .iter()
                        .map(|g| g.body.clone())
                        .collect::<Vec<_>>(),
                    daemon.log()
                )
            },
        )
    }
}

fn start(sb: &Sandbox, args: &[String], env: &[(&str, &str)]) -> Daemon {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with_env(sb, &args, env)
}

fn events_of(got: &[Got], event: &str) -> Vec<Value> {
    got.iter()
        .filter(|g| g.body["event"] == event)
        .map(|g| g.body.clone())
        .collect()
}

#[track_caller]
fn assert_log_hides_urls(daemon: &Daemon) {
    let log = daemon.log();
    assert!(!log.contains(URL_SECRET), "a URL reached the log:\n{log}");
    assert!(!log.contains("127.0.0.1:"), "a URL reached the log:\n{log}");
}

/// Deliveries to the other targets are under way when the awaited one is done: give them the
/// time a wrong one would need to arrive. Not a wait for an event: it lets time pass to show
/// that a notification a target did not ask for never comes (nothing is logged for it).
fn settle() {
    thread::sleep(Duration::from_millis(500));
}

#[test]
fn a_pushed_commit_is_announced_to_the_targets_that_want_it() {
    let sb = Sandbox::template();
    let json = Receiver::start();
    let failed_only = Receiver::start();
    let slack = Receiver::start();
    let rotated = Receiver::start();
    let url_file = sb.root.join("slack-url");
    std::fs::write(&url_file, format!("{}\n", slack.url)).unwrap();
    let args = sb.host_config(&format!(
            "notify:\n  - url: \"{}\"\n  - url: \"{}\"\n    events: [failed]\n  - url_file: {}\n    format: slack\n",
            json.url,
            failed_only.url,
            url_file.display()
        ),
    );
    let daemon = start(&sb, &args, &[]);
    let first = sb.head();
    let got = json.wait_until(&daemon, |g| g.len() >= 2);
    assert_eq!(got.len(), 2, "one per environment");
    let mut envs: Vec<String> = Vec::new();
    for g in &got {
        let b = &g.body;
        assert_eq!(b["event"], "deployment.succeeded", "{b}");
        assert_eq!(b["commit"], first.as_str(), "{b}");
        assert_eq!(b["status"], "succeeded", "{b}");
        assert_eq!(b["kind"], "commit", "{b}");
        assert_eq!(b["author"], "t", "{b}");
        assert_eq!(b["message"], "Initial platform configuration", "{b}");
        assert!(b["deployment"].as_i64().is_some_and(|d| d > 0), "{b}");
        assert!(
            b["counts"]["created"].as_i64().is_some_and(|n| n > 0),
            "{b}"
        );
        assert_eq!(b["counts"]["failed"], 0, "{b}");
        assert!(b["duration_seconds"].as_f64().is_some(), "{b}");
        assert_eq!(b["failures"], serde_json::json!([]), "{b}");
        assert_eq!(b["gitplane_version"], env!("CARGO_PKG_VERSION"), "{b}");
        assert_eq!(g.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            g.user_agent.as_deref(),
            Some(concat!("gitplane/", env!("CARGO_PKG_VERSION")))
        );
        envs.push(b["env"].as_str().unwrap_or_default().to_owned());
    }
    envs.sort();
    assert_eq!(envs, ["development", "production"]);

    // The Slack target, through its url_file: text for people, with the env and short commit.
    let got = slack.wait_until(&daemon, |g| g.len() >= 2);
    for g in &got {
        let keys: Vec<&String> = g.body.as_object().map(|o| o.keys().collect()).unwrap();
        assert_eq!(keys, ["text"], "{}", g.body);
        let text = g.body["text"].as_str().unwrap();
        assert!(text.contains(&format!("`{}`", &first[..12])), "{text}");
        assert!(text.contains("succeeded"), "{text}");
        assert!(
            text.contains("*development*") || text.contains("*production*"),
            "{text}"
        );
    }

    // The URL in the file changes: the next notification goes to the new one, no restart.
    std::fs::write(&url_file, &rotated.url).unwrap();
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    let second = sb.commit("Move redis");
    let got = rotated.wait_until(&daemon, |g| g.len() >= 2);
    assert!(
        got.iter()
            .all(|g| g.body["text"].as_str().unwrap().contains(&second[..12])),
        "{got:#?}"
    );
    json.wait_until(&daemon, |g| g.len() >= 4);
    settle();
    assert_eq!(slack.got().len(), 2, "the old URL got nothing more");
    assert!(
        failed_only.got().is_empty(),
        "events: [failed] hears no success: {:#?}",
        failed_only.got()
    );
    assert_log_hides_urls(&daemon);
}

/// A driver script that fails, saying the password it was given; gitplane hides it.
const FAILING_DRIVER: &str = r#"#!/bin/sh
request=$(cat)
password=$(printf '%s' "$request" | sed -n 's/.*"password":"\([^"]*\)".*/\1/p')
echo "quota exceeded for the account with password $password" >&2
exit 1
"#;
const DRIVER_SECRET: &str = "s3cr3t-DB-PASSWORD-41";

#[test]
fn a_driver_failure_is_announced_with_its_message_and_no_secret() {
    let sb = Sandbox::new();
    let script = sb.root.join("failing-driver");
    std::fs::write(&script, FAILING_DRIVER).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    sb.write("environments/test.yaml", "type: test\n");
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::new("base-env", "humanitec/echo").value("zone: test"),
            Definition::new("workload", "humanitec/echo").value("namespace: app"),
            Definition::new("postgres", "test/failing")
                .value("size: small")
                .secret(&format!("password: {DRIVER_SECRET}")),
        ]),
    );
    sb.write(
        "workloads/app/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  db:\n    type: postgres\n",
    );
    let commit = sb.commit("A database the driver refuses");
    let failed = Receiver::start();
    let succeeded_only = Receiver::start();
    let args = sb.host_config(&format!(
            "drivers:\n  test/failing:\n    exec: {{command: [\"{}\"], timeout: 10s}}\n\
             notify:\n  - url: \"{}\"\n    events: [failed]\n  - url: \"{}\"\n    events: [succeeded]\n",
            script.display(),
            failed.url,
            succeeded_only.url
        ),
    );
    let daemon = start(&sb, &args, &[]);
    let got = failed.wait_until(&daemon, |g| !g.is_empty());
    let b = &got[0].body;
    assert_eq!(b["event"], "deployment.failed", "{b}");
    assert_eq!(b["env"], "test", "{b}");
    assert_eq!(b["commit"], commit.as_str(), "{b}");
    assert_eq!(b["status"], "failed", "{b}");
    assert_eq!(
        b["counts"]["failed"], 2,
        "the database and the workload it blocks: {b}"
    );
    let failures = b["failures"].as_array().unwrap();
    assert!(
        failures.iter().any(|f| f
            .as_str()
            .is_some_and(|f| f.contains("quota exceeded for the account with password"))),
        "the driver's message is there: {b}"
    );
    let text = b.to_string();
    assert!(!text.contains(DRIVER_SECRET), "a secret was sent: {text}");
    settle();
    assert!(
        succeeded_only.got().is_empty(),
        "events: [succeeded] hears no failure: {:#?}",
        succeeded_only.got()
    );
    assert!(!daemon.log().contains(DRIVER_SECRET));
    assert_log_hides_urls(&daemon);
}

#[test]
fn a_mass_deletion_is_announced_as_held() {
    let sb = Sandbox::template();
    let held = Receiver::start();
    let args = sb.host_config(&format!(
        "notify:\n  - url: \"{}\"\n    events: [held]\n",
        held.url
    ));
    let daemon = start(&sb, &args, &[]);
    wait_deployed(
        &sb,
        &sb.head(),
        &["development", "production"],
        Duration::from_secs(20),
    );
    sb.remove("workloads/shop");
    let empty = sb.commit("Retire the shop");
    let got = held.wait_until(&daemon, |g| g.len() >= 2);
    assert_eq!(got.len(), 2, "only the held deployments: {got:#?}");
    for g in &got {
        let b = &g.body;
        assert_eq!(b["event"], "deployment.held", "{b}");
        assert_eq!(b["status"], "held", "{b}");
        assert_eq!(b["commit"], empty.as_str(), "{b}");
        let id = b["deployment"].as_i64().unwrap();
        assert_eq!(
            sb.column(&format!("SELECT status FROM deployment WHERE id = {id}")),
            ["held"],
            "the event names the deployment to approve"
        );
        assert!(
            !b["failures"].as_array().unwrap().is_empty(),
            "it says what would be deleted: {b}"
        );
    }
}

#[test]
fn a_target_answering_500_twice_gets_the_event_on_the_third_post() {
    let sb = Sandbox::template();
    let flaky = Receiver::answering(&[500, 500], None);
    let refusing = Receiver::answering(&[], Some(404));
    let args = sb.host_config(&format!(
            "notify:\n  - url: \"{}\"\n    events: [succeeded]\n  - url: \"{}\"\n    events: [succeeded]\n",
            flaky.url, refusing.url
        ),
    );
    // A short base wait (50 ms, then 100 ms) instead of 1 s and 2 s.
    let daemon = start(&sb, &args, &[("GITPLANE_NOTIFY_TEST_BACKOFF_MS", "50")]);
    let got = flaky.wait_until(&daemon, |g| {
        g.iter().filter(|g| g.status == 200).count() >= 2
    });
    let statuses: Vec<u16> = got.iter().map(|g| g.status).collect();
    assert_eq!(statuses, [500, 500, 200, 200]);
    assert_eq!(got[0].body, got[1].body, "the same event is sent again");
    assert_eq!(got[1].body, got[2].body);
    assert_ne!(got[2].body["env"], got[3].body["env"]);
    assert!(got[1].arrived - got[0].arrived >= Duration::from_millis(50));
    assert!(got[2].arrived - got[1].arrived >= Duration::from_millis(100));
    // Each event's 404 is logged as final once: after both, no POST can follow.
    eventually_or(
        "both 404s logged as not retried",
        Duration::from_secs(20),
        || (daemon.log().matches("answered 404; not retried").count() >= 2).then_some(()),
        || daemon.log(),
    );
    assert_eq!(
        refusing.got().len(),
        2,
        "a 404 is final: one POST per event"
    );
    assert_log_hides_urls(&daemon);
    let log = daemon.log();
    assert!(
        log.contains("notify[0]") && log.contains("the target answered 500; trying again"),
        "{log}"
    );
    assert!(
        log.contains("notify[1]") && log.contains("the target answered 404; not retried"),
        "{log}"
    );
}

/// A target that takes the connection and never answers: deployments go on, and SIGTERM does
/// not wait for it.
#[test]
fn a_hung_target_holds_up_neither_deployments_nor_shutdown() {
    let sb = Sandbox::template();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
            let _ = accepted_tx.send(());
        }
    });
    let args = sb.host_config(&format!(
        "notify:\n  - url: \"http://127.0.0.1:{port}/{URL_SECRET}\"\n    timeout: 60s\n"
    ));
    let mut daemon = start(&sb, &args, &[]);
    let envs = ["development", "production"];
    wait_deployed(&sb, &sb.head(), &envs, Duration::from_secs(20));
    accepted
        .recv_timeout(Duration::from_secs(10))
        .expect("a notification reached the hung target");
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    let next = sb.commit("Move redis");
    wait_deployed(&sb, &next, &envs, Duration::from_secs(20));
    let (code, took) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM did not wait for the notification: {took:?}"
    );
    assert_log_hides_urls(&daemon);
}

#[test]
fn a_drift_run_that_changes_outputs_is_announced() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    // Something outside gitplane keeps changing the database: its outputs differ each time.
    server.behave(
        "postgres",
        Behavior {
            drifting: true,
            ..Behavior::default()
        },
    );
    write_http_platform(&sb);
    sb.write(
        "environments/test.yaml",
        "type: test\nschedule: \"* * * * * *\"\n",
    );
    let commit = sb.commit("A platform with drift runs");
    let drift = Receiver::start();
    let args = sb.host_config(&format!(
        "{}notify:\n  - url: \"{}\"\n    events: [drift]\n",
        http_driver_config(&server.url, "timeout: 10s"),
        drift.url
    ));
    let daemon = start(&sb, &args, &[]);
    let got = drift.wait_until(&daemon, |g| !g.is_empty());
    let b = &got[0].body;
    assert_eq!(b["event"], "drift.found", "{b}");
    assert_eq!(b["kind"], "drift", "{b}");
    assert_eq!(b["commit"], commit.as_str(), "the last good commit: {b}");
    let drifted = b["drifted"].as_array().unwrap();
    assert_eq!(drifted.len(), 1, "the database alone changed: {b}");
    let guresid = drifted[0].as_str().unwrap();
    assert_eq!(
        sb.column(&format!(
            "SELECT type FROM resource WHERE guresid = '{guresid}'"
        )),
        ["postgres"]
    );
    assert!(events_of(&got, "deployment.succeeded").is_empty());
}

#[test]
fn drift_runs_failing_the_same_way_say_failed_once_and_recovered_when_the_driver_answers() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    write_http_platform(&sb);
    sb.write(
        "environments/test.yaml",
        "type: test\nschedule: \"* * * * * *\"\n",
    );
    sb.commit("A platform with a drift run every second");
    let json = Receiver::start();
    let args = sb.host_config(&format!(
        "{}notify:\n  - url: \"{}\"\n",
        http_driver_config(&server.url, "timeout: 10s"),
        json.url
    ));
    let daemon = start(&sb, &args, &[]);
    json.wait_until(&daemon, |g| {
        !events_of(g, "deployment.succeeded").is_empty()
    });
    // The database's driver refuses every call from now on: each drift run fails alike.
    server.behave(
        "postgres",
        Behavior {
            fail: Some((400, 100_000)),
            ..Behavior::default()
        },
    );
    let failed_drift_runs =
        || sb.count("SELECT COUNT(*) FROM deployment WHERE kind = 'drift' AND status = 'failed'");
    eventually_or(
        "three failed drift runs",
        Duration::from_secs(30),
        || (failed_drift_runs() >= 3).then_some(()),
        || daemon.log(),
    );
    let failed = events_of(&json.got(), "deployment.failed");
    assert_eq!(
        failed.len(),
        1,
        "one `failed` for {} drift runs failing the same way: {failed:#?}",
        failed_drift_runs()
    );
    assert_eq!(failed[0]["kind"], "drift", "{}", failed[0]);
    // The driver answers again: the next drift run says the environment recovered, once.
    server.behave("postgres", Behavior::default());
    let got = json.wait_until(&daemon, |g| {
        !events_of(g, "deployment.recovered").is_empty()
    });
    let recovered = events_of(&got, "deployment.recovered");
    assert_eq!(recovered[0]["kind"], "drift", "{}", recovered[0]);
    let succeeded_after = sb.max_id("deployment");
    eventually_or(
        "two more drift runs",
        Duration::from_secs(20),
        || {
            (sb.count(&format!("SELECT COUNT(*) FROM deployment WHERE kind = 'drift' AND status = 'succeeded' AND id > {succeeded_after}")) >= 2).then_some(())
        },
        || daemon.log(),
    );
    let got = json.got();
    assert_eq!(events_of(&got, "deployment.recovered").len(), 1);
    assert_eq!(events_of(&got, "deployment.failed").len(), 1);
}

/// How many finished deployments of a commit the state has (every environment's).
fn finished_deployments(sb: &Sandbox) -> usize {
    sb.column("SELECT id FROM deployment WHERE kind = 'commit' AND status != 'running'")
        .len()
}

/// Waits until the state has at least `n` finished deployments of a commit.
#[track_caller]
fn wait_finished(sb: &Sandbox, daemon: &Daemon, n: usize) {
    eventually_or(
        format_args!("{n} finished deployments"),
        Duration::from_secs(20),
        || (finished_deployments(sb) >= n).then_some(()),
        || daemon.log(),
    );
}

#[test]
fn a_restart_that_changes_nothing_sends_nothing() {
    let sb = Sandbox::template();
    let json = Receiver::start();
    let args = sb.host_config(&format!("notify:\n  - url: \"{}\"\n", json.url));
    let mut daemon = start(&sb, &args, &[]);
    let got = json.wait_until(&daemon, |g| g.len() >= 2);
    assert_eq!(events_of(&got, "deployment.succeeded").len(), 2);
    wait_finished(&sb, &daemon, 2);
    let (code, _) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());

    // The restart looks at the same commit again and records what it found: nothing to do.
    let daemon = start(&sb, &args, &[]);
    wait_finished(&sb, &daemon, 4);
    assert_eq!(
        sb.column(
            "SELECT created + updated + deleted FROM deployment WHERE kind = 'commit' \
             ORDER BY id DESC LIMIT 2"
        ),
        ["0", "0"],
        "the restart's deployments changed nothing"
    );
    settle();
    let got = json.got();
    assert_eq!(got.len(), 2, "nothing sent for the restart: {got:#?}");
}

#[test]
fn a_broken_environment_says_failed_once_and_recovered_when_fixed() {
    let sb = Sandbox::new();
    let script = sb.root.join("failing-driver");
    std::fs::write(&script, FAILING_DRIVER).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    sb.write("environments/test.yaml", "type: test\n");
    let platform = |db_driver: &str| {
        definitions(&[
            Definition::new("base-env", "humanitec/echo").value("zone: test"),
            Definition::new("workload", "humanitec/echo").value("namespace: app"),
            Definition::new("postgres", db_driver)
                .value("size: small")
                .secret(&format!("password: {DRIVER_SECRET}")),
        ])
    };
    sb.write("definitions/platform.yaml", &platform("test/failing"));
    sb.write(
        "workloads/app/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  db:\n    type: postgres\n",
    );
    let broken = sb.commit("A database the driver refuses");
    let json = Receiver::start();
    let args = sb.host_config(&format!(
        "drivers:\n  test/failing:\n    exec: {{command: [\"{}\"], timeout: 10s}}\n\
         retry:\n  deployments: {{interval: 200ms, max_interval: 1s}}\n\
         notify:\n  - url: \"{}\"\n",
        script.display(),
        json.url
    ));
    let daemon = start(&sb, &args, &[]);
    let got = json.wait_until(&daemon, |g| !g.is_empty());
    assert_eq!(got[0].body["event"], "deployment.failed", "{}", got[0].body);
    assert_eq!(got[0].body["commit"], broken.as_str());

    // Another commit that fails the same way: the environment is still broken, nothing new.
    sb.edit("workloads/app/web.yaml", "image: x", "image: y");
    let still = sb.commit("Another image, the same broken database");
    wait_deployed(&sb, &still, &["test"], Duration::from_secs(20));
    let failures = sb.column("SELECT id FROM deployment WHERE status = 'failed'");
    assert!(failures.len() >= 2, "{failures:?}\n{}", daemon.log());
    settle();
    let got = json.got();
    assert_eq!(
        got.len(),
        1,
        "one `failed` for the broken environment, not one per failing deployment: {:#?}",
        got.iter().map(|g| g.body.clone()).collect::<Vec<_>>()
    );

    // The fix: the next deployment that succeeds says the environment recovered.
    sb.write("definitions/platform.yaml", &platform("humanitec/echo"));
    let fixed = sb.commit("A driver that works");
    let got = json.wait_until(&daemon, |g| g.len() >= 2);
    let b = &got[1].body;
    assert_eq!(b["event"], "deployment.recovered", "{b}");
    assert_eq!(b["status"], "succeeded", "{b}");
    assert_eq!(b["commit"], fixed.as_str(), "{b}");
    settle();
    assert_eq!(
        json.got().len(),
        2,
        "{:#?}",
        json.got()
            .iter()
            .map(|g| g.body.clone())
            .collect::<Vec<_>>()
    );
}

/// `gitplane ARGS` with the host config's repository, state and `--config`.
#[track_caller]
fn cli(sb: &Sandbox, host: &[String], args: &[&str]) -> crate::util::Run {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(host.iter().map(String::as_str));
    sb.gitplane_raw(&all, &[])
}

#[test]
fn rollback_approve_and_unpin_from_the_cli_are_announced_with_their_actor() {
    let sb = Sandbox::template();
    let json = Receiver::start();
    let slack = Receiver::start();
    let host = sb.host_config(&format!(
        "notify:\n  - url: \"{}\"\n  - url: \"{}\"\n    format: slack\n    events: [rollback]\n",
        json.url, slack.url
    ));
    let v1 = sb.head();
    cli(&sb, &host, &["apply"]).ok();
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    sb.commit("Move redis");
    cli(&sb, &host, &["apply"]).ok();
    assert!(
        json.got().is_empty(),
        "a CLI apply is no rollback: {:#?}",
        json.got().len()
    );

    cli(
        &sb,
        &host,
        &[
            "rollback",
            "--env",
            "development",
            "--to",
            &v1,
            "--reason",
            "redis moved too early",
            "--by",
            "alice",
        ],
    )
    .ok();
    let got = json.got();
    assert_eq!(got.len(), 1, "sent before the command returned: {got:#?}");
    let b = &got[0].body;
    assert_eq!(b["event"], "env.rollback", "{b}");
    assert_eq!(b["env"], "development", "{b}");
    assert_eq!(b["actor"], "alice", "{b}");
    assert_eq!(b["commit"], v1.as_str(), "{b}");
    assert_eq!(b["reason"], "redis moved too early", "{b}");
    assert_eq!(
        b["deployment"].as_i64().map(|d| d.to_string()),
        Some(sb.last_deployment("development").id.to_string()),
        "the rollback's deployment: {b}"
    );
    let text = slack.got()[0].body["text"].as_str().unwrap().to_owned();
    assert!(
        text.contains("*development* rolled back to") && text.contains("alice"),
        "{text}"
    );

    cli(
        &sb,
        &host,
        &["unpin", "--env", "development", "--no-apply", "--by", "bob"],
    )
    .ok();
    let got = json.got();
    assert_eq!(got.len(), 2, "{got:#?}");
    let b = &got[1].body;
    assert_eq!(b["event"], "env.unpinned", "{b}");
    assert_eq!(b["actor"], "bob", "{b}");
    assert_eq!(b["commit"], v1.as_str(), "the commit it was pinned at: {b}");

    sb.remove("workloads/shop");
    sb.commit("Retire the shop");
    cli(&sb, &host, &["apply", "--env", "production"]).fails();
    let held = sb.last_deployment("production");
    assert_eq!(held.status, "held");
    cli(
        &sb,
        &host,
        &["approve", "--yes", &held.id.to_string(), "--by", "carol"],
    )
    .ok();
    let got = json.got();
    assert_eq!(got.len(), 3, "{got:#?}");
    let b = &got[2].body;
    assert_eq!(b["event"], "deployment.approved", "{b}");
    assert_eq!(b["env"], "production", "{b}");
    assert_eq!(b["actor"], "carol", "{b}");
    assert_eq!(b["deployment"], held.id, "{b}");
    cli(
        &sb,
        &host,
        &[
            "pin",
            "--env",
            "development",
            "--reason",
            "audit freeze",
            "--by",
            "dave",
        ],
    )
    .ok();
    let got = json.got();
    assert_eq!(got.len(), 4, "{got:#?}");
    let b = &got[3].body;
    assert_eq!(b["event"], "env.pinned", "{b}");
    assert_eq!(b["env"], "development", "{b}");
    assert_eq!(b["actor"], "dave", "{b}");
    assert_eq!(b["reason"], "audit freeze", "{b}");
    assert_eq!(
        slack.got().len(),
        1,
        "events: [rollback] hears only rollbacks"
    );
}

/// A target that refuses, and one that never answers: the command still does what it was
/// asked, in bounded time, says so on stderr, and exits 0.
#[test]
fn a_target_that_fails_or_hangs_does_not_fail_the_command() {
    let sb = Sandbox::template();
    let refusing = Receiver::answering(&[], Some(404));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let host = sb.host_config(&format!(
        "notify:\n  - url: \"{}\"\n  - url: \"http://127.0.0.1:{port}/{URL_SECRET}\"\n    timeout: 60s\n",
        refusing.url
    ));
    let v1 = sb.head();
    cli(&sb, &host, &["apply"]).ok();
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    sb.commit("Move redis");
    cli(&sb, &host, &["apply"]).ok();
    let started = Instant::now();
    let run = cli(
        &sb,
        &host,
        &[
            "rollback",
            "--env",
            "development",
            "--to",
            &v1,
            "--reason",
            "r",
            "--by",
            "alice",
        ],
    )
    .ok();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the hung target held the command up: {took:?}"
    );
    run.stderr_has(
        "warning: notification notify[0]: env.rollback not sent: the target answered 404",
    );
    run.stderr_has("warning: notification notify[1]: env.rollback not sent: no answer within 5s");
    assert!(!run.stderr.contains(URL_SECRET), "{run}");
    assert_eq!(
        sb.column(
            "SELECT commit_id FROM env_pin WHERE env = 'development' AND unpinned_at IS NULL"
        ),
        [v1.as_str()],
        "the rollback is done whatever the targets said"
    );
    assert_eq!(
        refusing.got().len(),
        1,
        "one POST, no retries from a command"
    );
}

/// SIGHUP applies the new settings; it deploys again only when what a deployment does changed.
#[test]
fn sighup_deploys_again_only_when_a_driver_changed() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    write_http_platform(&sb);
    let commit = sb.commit("A platform on the HTTP driver");
    let json = Receiver::start();
    let host = |concurrency: u32, timeout: &str| {
        format!(
            "concurrency: {concurrency}\n{}notify:\n  - url: \"{}\"\n",
            http_driver_config(&server.url, &format!("timeout: {timeout}")),
            json.url
        )
    };
    let args = sb.host_config(&host(4, "10s"));
    let daemon = start(&sb, &args, &[]);
    wait_deployed(&sb, &commit, &["test"], Duration::from_secs(20));
    json.wait_until(&daemon, |g| !g.is_empty());
    let rows = || {
        sb.column("SELECT id FROM deployment WHERE env = 'test'")
            .len()
    };
    assert_eq!(rows(), 1);
    let hup = || {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &daemon.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };

    // A limit changed: applied, nothing deployed.
    sb.host_config(&host(2, "10s"));
    hup();
    daemon.wait_for_log("host config reloaded", Duration::from_secs(10));
    // Not a wait for an event: time passes to show that no deployment starts.
    settle();
    assert_eq!(
        rows(),
        1,
        "no deployment for a reload that changed no driver:\n{}",
        daemon.log()
    );

    // The driver changed: the current commit is deployed again with it.
    sb.host_config(&host(2, "20s"));
    hup();
    daemon.wait_for_log(
        "the current commit is deployed again",
        Duration::from_secs(10),
    );
    eventually_or(
        "a deployment after the driver changed",
        Duration::from_secs(20),
        || {
            (sb.column("SELECT id FROM deployment WHERE env = 'test' AND status = 'succeeded'")
                .len()
                == 2)
                .then_some(())
        },
        || daemon.log(),
    );
    assert_eq!(
        sb.column("SELECT commit_id FROM deployment WHERE env = 'test' ORDER BY id DESC LIMIT 1"),
        [commit.as_str()]
    );
    settle();
    let got = json.got();
    assert_eq!(
        got.len(),
        1,
        "only the first deployment changed something: {:#?}",
        got.iter().map(|g| g.body.clone()).collect::<Vec<_>>()
    );
}
