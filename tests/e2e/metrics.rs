//! The daemon's metrics of the current state, through the real daemon and its listener: an
//! environment's condition read from the state (a failure stays `failing` with no new commit,
//! across a restart, until a fix), the fetch metrics of a remote repository, the alert rules
//! in deploy/prometheus (`promtool check rules` and `promtool test rules`), and the Grafana
//! dashboard in deploy/grafana, whose queries must name only metrics the daemon serves.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gitplane_testkit::{Behavior, DriverServer, eventually_or};
use serde_json::Value;

use crate::daemon::Daemon;
use crate::service::{client, free_port, promtool_check, samples, value};
use crate::util::{Sandbox, http_driver_config};
use crate::workflow::{host_config, strs, wait_until, write_platform, write_workload};

/// The listener's `/metrics` on `port`, or `None` while it does not answer.
pub(crate) fn scrape(port: u16) -> Option<String> {
    let mut response = client()
        .get(&format!("http://127.0.0.1:{port}/metrics"))
        .call()
        .ok()?;
    (response.status() == 200).then(|| response.body_mut().read_to_string().ok())?
}

/// `/metrics` once the listener answers.
#[track_caller]
pub(crate) fn scrape_when_up(port: u16, daemon: &Daemon) -> String {
    eventually_or(
        "the listener to answer /metrics",
        Duration::from_secs(30),
        || scrape(port),
        || daemon.log(),
    )
}

/// `env`'s `gitplane_environment_condition` for `condition` in `text` (`None`: no series).
pub(crate) fn condition(text: &str, env: &str, condition: &str) -> Option<f64> {
    samples(text)
        .get(&format!(
            "gitplane_environment_condition{{condition=\"{condition}\",env=\"{env}\"}}"
        ))
        .copied()
}

/// Which of the six conditions are 1 for `env`, in the order the metric documents them.
pub(crate) fn conditions_on(text: &str, env: &str) -> Vec<&'static str> {
    ["ready", "failing", "drifted", "pinned", "held", "running"]
        .into_iter()
        .filter(|c| condition(text, env, c) == Some(1.0))
        .collect()
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The defect: the documented alert (`increase(gitplane_deployments_total{status="failed"}[15m])`)
/// stopped firing 15 minutes after the last attempt while the environment stayed broken. The
/// condition is read from the state, so it stays 1 for as long as the failure is the last
/// word, also right after a restart, before any new deployment ends.
#[test]
fn a_failed_environment_stays_failing_across_a_restart_until_a_fix_is_pushed() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    // A final error for every call of the database's driver: each deployment fails.
    let failing = Behavior {
        fail: Some((400, 1_000_000)),
        ..Behavior::default()
    };
    server.behave("postgres", failing.clone());
    write_platform(&sb, "1");
    let first = sb.commit("v1 on a driver that fails");
    let port = free_port();
    // Retries far apart: the test is about the state between attempts.
    let args = host_config(
        &sb,
        &server,
        &format!("http: {{listen: 127.0.0.1:{port}}}\nretry:\n  deployments: {{interval: 1h}}\n"),
    );
    let mut daemon = Daemon::start(&sb, &strs(&args));
    wait_until("v1 failed", &daemon, Duration::from_secs(30), || {
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE env = 'test' AND commit_id = '{first}' \
             AND status = 'failed'"
        )) > 0
    });
    let text = scrape_when_up(port, &daemon);
    assert_eq!(conditions_on(&text, "test"), ["failing"], "{text}");
    let all = samples(&text);
    assert_eq!(
        value(&all, "gitplane_deployment_attempt{env=\"test\"}"),
        1.0
    );
    // The failed deployment reached the drivers: the state's commit is the ref's.
    assert_eq!(
        all.get("gitplane_environment_commit_behind_seconds{env=\"test\"}"),
        Some(&0.0),
        "{text}"
    );
    assert_eq!(daemon.terminate().0, Some(0), "{}", daemon.log());

    // Restarted, the daemon deploys v1 again; each call now takes seconds, so the scrape
    // below comes before that deployment ends, and the condition can only come from the state.
    server.behave(
        "postgres",
        Behavior {
            delay: Duration::from_secs(4),
            ..failing
        },
    );
    let finished = "SELECT COUNT(*) FROM deployment WHERE status != 'running'";
    let finished_before = sb.count(finished);
    let daemon = Daemon::start(&sb, &strs(&args));
    let text = scrape_when_up(port, &daemon);
    assert_eq!(
        sb.count(finished),
        finished_before,
        "no deployment ended before the scrape"
    );
    assert!(
        !text.contains("gitplane_deployments_total{"),
        "nothing counted by this process yet:\n{text}"
    );
    assert_eq!(condition(&text, "test", "failing"), Some(1.0), "{text}");
    assert_eq!(condition(&text, "test", "ready"), Some(0.0), "{text}");

    // The fix: the driver recovers and a new commit is pushed.
    server.behave("postgres", Behavior::default());
    write_workload(&sb, "2");
    let fixed = sb.commit("v2 with the driver fixed");
    wait_until("v2 succeeded", &daemon, Duration::from_secs(60), || {
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE env = 'test' AND commit_id = '{fixed}' \
             AND status = 'succeeded'"
        )) > 0
    });
    let text = eventually_or(
        "the running v1 retry to end",
        Duration::from_secs(30),
        || scrape(port).filter(|t| condition(t, "test", "running") == Some(0.0)),
        || daemon.log(),
    );
    assert_eq!(conditions_on(&text, "test"), ["ready"], "{text}");
    assert_eq!(condition(&text, "test", "failing"), Some(0.0));
}

/// A remote repository: the fetch metrics say when the last fetch succeeded and count the
/// failed ones; and every metric the Grafana dashboard queries is one the daemon serves.
#[test]
fn a_remote_repositorys_fetches_are_measured_and_the_dashboard_queries_only_served_metrics() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    write_platform(&sb, "1");
    let head = sb.commit("v1");
    let port = free_port();
    let config = sb.root.join("remote-host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {{url: \"file://{}\", interval: 300ms}}\nstate: {}\n\
             http: {{listen: 127.0.0.1:{port}}}\n{}",
            sb.origin.display(),
            sb.state.display(),
            http_driver_config(&server.url, "timeout: 10s")
        ),
    )
    .unwrap();
    let started = now_seconds();
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    wait_until("v1 succeeded", &daemon, Duration::from_secs(30), || {
        sb.state.exists()
            && sb.count(&format!(
                "SELECT COUNT(*) FROM deployment WHERE env = 'test' AND commit_id = '{head}' \
                 AND status = 'succeeded'"
            )) > 0
    });
    let text = scrape_when_up(port, &daemon);
    let all = samples(&text);
    let fetched = value(&all, "gitplane_fetch_last_success_timestamp_seconds");
    assert!(
        fetched >= started - 1.0 && fetched <= now_seconds() + 1.0,
        "{fetched} not since {started}:\n{text}"
    );
    assert_eq!(all.get("gitplane_fetch_errors_total"), Some(&0.0), "{text}");
    assert_eq!(
        all.get("gitplane_queue_jobs{env=\"test\"}"),
        Some(&0.0),
        "{text}"
    );
    assert_eq!(conditions_on(&text, "test"), ["ready"], "{text}");
    if let Some((ok, said)) = promtool_check(&text) {
        assert!(ok, "promtool check metrics: {said}\n{text}");
    }

    // Every metric the dashboard's queries name is served: the names of this scrape's
    // samples (a histogram's as `_bucket`, `_sum` and `_count`).
    let served: BTreeSet<String> = all
        .keys()
        .map(|k| k.split('{').next().unwrap_or(k).to_owned())
        .collect();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana/gitplane.json"
        ))
        .expect("deploy/grafana/gitplane.json"),
    )
    .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    queries_in(&dashboard, &mut queries);
    let named: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    assert!(named.len() >= 15, "the dashboard queries {named:?}");
    let missing: Vec<&String> = named.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the daemon does not serve: {missing:?}\nserved: {served:?}"
    );

    // The remote goes away: the fetches fail and are counted; the last success stays.
    let moved = sb.root.join("origin-moved");
    std::fs::rename(&sb.origin, &moved).unwrap();
    let text = eventually_or(
        "a failed fetch counted",
        Duration::from_secs(30),
        || scrape(port).filter(|t| value(&samples(t), "gitplane_fetch_errors_total") >= 1.0),
        || daemon.log(),
    );
    let last = value(
        &samples(&text),
        "gitplane_fetch_last_success_timestamp_seconds",
    );
    assert!(last >= fetched, "{last} < {fetched}");
    std::fs::rename(&moved, &sb.origin).unwrap();
    eventually_or(
        "a fetch succeeds again",
        Duration::from_secs(30),
        || {
            scrape(port).filter(|t| {
                value(&samples(t), "gitplane_fetch_last_success_timestamp_seconds") > last
            })
        },
        || daemon.log(),
    );
}

/// The PromQL of every `expr` in a Grafana dashboard, and its template variables' queries.
fn queries_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    _ => queries_in(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| queries_in(v, out)),
        _ => {}
    }
}

/// The `gitplane_` metric names in a PromQL query: identifiers outside label matchers, strings
/// and range selectors.
fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut word = String::new();
    let (mut braces, mut brackets, mut quoted) = (0, 0, false);
    for c in query.chars().chain([' ']) {
        if quoted {
            quoted = c != '"';
            continue;
        }
        if braces == 0 && brackets == 0 && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            word.push(c);
            continue;
        }
        if word.starts_with("gitplane_") {
            names.push(std::mem::take(&mut word));
        }
        word.clear();
        match c {
            '"' => quoted = true,
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            _ => {}
        }
    }
    names
}

#[test]
fn metric_names_come_from_outside_matchers_and_strings() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.5, sum by (le) (rate(gitplane_a_bucket{env=~\"gitplane_x\"}\
             [$__rate_interval]))) / gitplane_b"
        ),
        ["gitplane_a_bucket", "gitplane_b"]
    );
}

/// Runs promtool with `args` in deploy/prometheus: whether it succeeded, and what it said.
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus"))
        .output()
        .expect("promtool runs");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// The shipped alert rules are valid, and their unit tests pass: among them, the failing alert
/// still fires hours after the last attempt while the environment stays failed.
#[test]
#[cfg_attr(
    not(promtool),
    ignore = "promtool is not installed (Debian's prometheus package)"
)]
fn the_shipped_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let (ok, said) = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(ok, "{said}");
    assert!(said.contains("6 rules found"), "{said}");
    let (ok, said) = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert!(ok, "{said}");
    assert!(said.contains("SUCCESS"), "{said}");
    // Every metric the rules name is one the daemon documents (docs/service.md's table).
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/alerts.yaml"
    ))
    .unwrap();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/service.md"))
        .unwrap();
    for line in rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")) {
        for name in metric_names(line) {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "{name} is not in docs/service.md's metrics table"
            );
        }
    }
}
