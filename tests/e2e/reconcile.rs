//! The reconciler against a real HTTP driver on 127.0.0.1: the protocol as the driver sees it,
//! retries and final errors, ordering and parallelism, failure isolation, and crash safety.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Definition, Sandbox, definitions};
use gitplane_testkit::{Behavior, DriverServer, Received};

/// A repository of `width` workloads in app `app`, environment `test`: each workload has a
/// private postgres that reads the base-env; all three types use the HTTP driver. Depth 3.
pub(crate) fn http_platform(sb: &Sandbox, server: &DriverServer, width: usize) {
    sb.write(
        "host.yaml",
        &format!(
            "drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 2s, concurrency: 8}}\n\
             retry: {{attempts: 3, initial_delay: 10ms, max_delay: 50ms, poll_interval: 10ms}}\n",
            server.url
        ),
    );
    sb.write("environments/test.yaml", "type: test\n");
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::http("base-env").value("zone: example.test"),
            Definition::http("postgres")
                .value("host: ${resources.base-env#base-env.outputs.name}")
                .secret("token: ${resources.base-env#base-env.outputs.token}"),
            Definition::http("workload").value("namespace: ${context.app.id}"),
        ]),
    );
    for i in 0..width {
        sb.write(
            &format!("workloads/app/w{i}.yaml"),
            &format!(
                "apiVersion: score.dev/v1b1\nmetadata:\n  name: w{i}\ncontainers:\n  main:\n    \
                 image: x\n    variables:\n      DB: ${{resources.db.name}}\nresources:\n  db:\n    \
                 type: postgres\n"
            ),
        );
    }
    sb.commit("An HTTP-driven platform");
}

fn apply(sb: &Sandbox) -> crate::util::Run {
    let config = sb.work.join("host.yaml");
    sb.gitplane(&["apply", "--config", config.to_str().unwrap()])
}

/// `type -> guresid` from state.
fn guresids(sb: &Sandbox) -> BTreeMap<String, String> {
    sb.rows("SELECT type || '#' || res_id, guresid FROM resource")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect()
}

fn requests_for<'a>(received: &'a [Received], guresid: &str) -> Vec<&'a Received> {
    received.iter().filter(|r| r.guresid == guresid).collect()
}

#[test]
fn the_driver_sees_the_interface_and_state_records_the_outcome() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            polls: 2,
            ..Behavior::default()
        },
    );
    http_platform(&sb, &server, 1);
    apply(&sb).ok();

    let ids = guresids(&sb);
    let base = &ids["base-env#base-env"];
    let db = &ids["postgres#modules.w0.externals.db"];
    let received = server.received();
    // The database: 202, 202, 200, each call carrying the cookie the last one set.
    let calls = requests_for(&received, db);
    let summary: Vec<(String, Option<String>, u16)> = calls
        .iter()
        .map(|r| (r.method.clone(), r.cookie.clone(), r.status))
        .collect();
    assert_eq!(
        summary,
        [
            ("PUT".to_owned(), None, 202),
            ("PUT".to_owned(), Some("polls=1".to_owned()), 202),
            ("PUT".to_owned(), Some("polls=2".to_owned()), 200),
        ]
    );
    let base_instance = server.instances()[base];
    assert_eq!(
        calls[0].body,
        json!({
            "type": "postgres",
            "resource": null,
            "driver": {
                "values": {"host": format!("base-env-{base_instance}")},
                "secrets": {"token": format!("tok-{base_instance}")},
            },
        })
    );
    // Every PUT of the database came after the base-env's 200.
    let base_done = requests_for(&received, base)
        .iter()
        .find(|r| r.status == 200)
        .map(|r| r.answered)
        .expect("the base-env was provisioned");
    assert!(calls.iter().all(|r| r.arrived >= base_done));

    // State matches the server: outputs, secret outputs, cookie, attempts.
    let db_instance = server.instances()[db];
    assert_eq!(
        sb.outputs("test", "modules.w0.externals.db"),
        json!({
            "instance": db_instance,
            "guresid": db,
            "name": format!("postgres-{db_instance}"),
            "echo": {"host": format!("base-env-{base_instance}")},
        })
    );
    assert_eq!(
        sb.unsealed(&format!(
            "SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret \
             WHERE guresid = '{db}'"
        )),
        [format!("{{\"token\":\"tok-{db_instance}\"}}")]
    );
    assert_eq!(
        sb.unsealed(&format!(
            "SELECT cookie, 'driver_cookie:' || guresid FROM driver_cookie WHERE guresid = '{db}'"
        )),
        [format!("instance={db_instance}")]
    );
    assert_eq!(
        sb.column(&format!(
            "SELECT attempts FROM operation WHERE guresid = '{db}'"
        )),
        ["3"]
    );

    // Removing the app's only workload deletes everything of the app, each resource with its
    // cookie, dependents first: the workload, its database, then the base-env.
    let instances = server.instances();
    let wl = &ids["workload#modules.w0"];
    sb.remove("workloads/app/w0.yaml");
    sb.commit("Remove w0");
    let before = server.received().len();
    // Emptying the environment trips the deletion guard: approve the held deployment.
    apply(&sb).fails();
    assert_eq!(
        server.received().len(),
        before,
        "a held deployment calls no driver"
    );
    let held = sb.last_deployment("test");
    assert_eq!(held.status, "held");
    let config = sb.work.join("host.yaml");
    sb.gitplane(&[
        "approve",
        "--yes",
        &held.id.to_string(),
        "--config",
        config.to_str().unwrap(),
    ])
    .ok();
    let deletes: Vec<(String, Option<String>, u16)> = server.received()[before..]
        .iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| (r.guresid.clone(), r.cookie.clone(), r.status))
        .collect();
    let expected: Vec<(String, Option<String>, u16)> = [wl, db, base]
        .iter()
        .map(|g| {
            (
                (*g).clone(),
                Some(format!("instance={}", instances[*g])),
                204,
            )
        })
        .collect();
    assert_eq!(deletes, expected);
    assert!(server.instances().is_empty());
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 0);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM driver_cookie"),
        0,
        "cookies are cleared after a delete"
    );
}

#[test]
fn transient_errors_are_retried_and_final_ones_are_not() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    // Two 500s, then the database is provisioned on the third call.
    server.behave(
        "postgres",
        Behavior {
            fail: Some((500, 2)),
            ..Behavior::default()
        },
    );
    // A 400 for the workload: final at once.
    server.behave(
        "workload",
        Behavior {
            fail: Some((400, 99)),
            ..Behavior::default()
        },
    );
    http_platform(&sb, &server, 1);
    let run = apply(&sb).fails();
    run.stderr_has("400");
    run.stderr_has("injected 400");
    let received = server.received();
    let statuses = |res_type: &str| -> Vec<u16> {
        received
            .iter()
            .filter(|r| r.body["type"] == res_type)
            .map(|r| r.status)
            .collect()
    };
    assert_eq!(statuses("postgres"), [500, 500, 200]);
    assert_eq!(statuses("workload"), [400], "a 400 is not retried");
    assert_eq!(
        sb.rows("SELECT type, status, attempts FROM operation ORDER BY id"),
        [
            ["base-env", "succeeded", "1"],
            ["postgres", "succeeded", "3"],
            ["workload", "failed", "1"],
        ]
    );
    assert_eq!(
        sb.rows("SELECT type, status FROM resource ORDER BY type"),
        [
            ["base-env", "ready"],
            ["postgres", "ready"],
            ["workload", "failed"]
        ]
    );
    let d = sb.last_deployment("test");
    assert_eq!(d.status, "failed");
    assert_eq!(d.counts, [2, 0, 0, 0, 1]);
}

#[test]
fn a_slow_driver_times_out_and_gives_up_after_the_retry_limit() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            delay: Duration::from_millis(1500),
            ..Behavior::default()
        },
    );
    http_platform(&sb, &server, 1);
    sb.edit("host.yaml", "timeout: 2s", "timeout: 300ms");
    sb.commit("A short time limit");
    let started = Instant::now();
    let run = apply(&sb).fails();
    let elapsed = started.elapsed();
    run.stderr_has("gave up after 3 attempts");
    assert!(
        elapsed < Duration::from_secs(4),
        "three 300 ms calls and short backoffs, not three slow answers: {elapsed:?}"
    );
    assert_eq!(
        sb.column("SELECT attempts FROM operation WHERE type = 'postgres'"),
        ["3"]
    );
    // The workload that needs the database was not attempted.
    assert_eq!(
        sb.column("SELECT status FROM operation WHERE type = 'workload'"),
        ["skipped"]
    );
}

#[test]
fn an_oversized_cookie_is_refused_and_the_limit_itself_is_fine() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            cookie_bytes: Some(10_241),
            ..Behavior::default()
        },
    );
    server.behave(
        "base-env",
        Behavior {
            cookie_bytes: Some(10_240),
            ..Behavior::default()
        },
    );
    http_platform(&sb, &server, 1);
    apply(&sb).fails().stderr_has("10240");
    assert_eq!(
        sb.rows("SELECT type, status FROM resource ORDER BY type"),
        [["base-env", "ready"], ["postgres", "failed"]]
    );
    let cookies = sb.unsealed("SELECT cookie, 'driver_cookie:' || guresid FROM driver_cookie");
    assert_eq!(cookies.len(), 1);
    assert_eq!(cookies[0].len(), 10240);
}

#[test]
fn a_failing_resource_blocks_only_its_dependents() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    http_platform(&sb, &server, 3);
    // The driver refuses w1's database (its params ask it to).
    sb.edit(
        "workloads/app/w1.yaml",
        "    type: postgres\n",
        "    type: postgres\n    params: {fail: true}\n",
    );
    sb.commit("w1 asks for a database the driver refuses");
    apply(&sb)
        .fails()
        .stderr_has("app/postgres.default#modules.w1.externals.db");
    let statuses: BTreeMap<String, String> = sb
        .rows("SELECT res_id, status FROM operation")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    assert_eq!(statuses["modules.w1.externals.db"], "failed");
    assert_eq!(statuses["modules.w1"], "skipped");
    for ok in [
        "base-env",
        "modules.w0.externals.db",
        "modules.w0",
        "modules.w2.externals.db",
        "modules.w2",
    ] {
        assert_eq!(statuses[ok], "succeeded", "{ok}: {statuses:?}");
    }
    assert_eq!(
        sb.column("SELECT error FROM operation WHERE res_id = 'modules.w1'"),
        ["blocked: app/postgres.default#modules.w1.externals.db failed"]
    );
    let d = sb.last_deployment("test");
    assert_eq!(d.counts, [5, 0, 0, 0, 2]);
}

#[test]
fn resources_start_after_their_dependencies_and_independent_ones_overlap() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    for t in ["base-env", "postgres", "workload"] {
        server.behave(
            t,
            Behavior {
                polls: 1,
                delay: Duration::from_millis(80),
                ..Behavior::default()
            },
        );
    }
    http_platform(&sb, &server, 6);
    apply(&sb).ok();
    let received = server.received();
    let ids = guresids(&sb);
    let done_at: HashMap<&str, Instant> = received
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| (r.guresid.as_str(), r.answered))
        .collect();
    let first_call: HashMap<&str, Instant> = received.iter().fold(HashMap::new(), |mut m, r| {
        m.entry(r.guresid.as_str()).or_insert(r.arrived);
        m
    });
    // Edges from state: every PUT of a resource starts after each dependency's 200.
    for edge in sb.rows("SELECT from_guresid, to_guresid FROM edge") {
        let (from, to) = (edge[0].as_str(), edge[1].as_str());
        assert!(
            first_call[from] >= done_at[to],
            "{from} was called before its dependency {to} was done"
        );
    }
    assert_eq!(ids.len(), 13);
    // Independent databases overlap: at some moment several calls were in flight.
    let mut moments: Vec<(Instant, i32)> = received
        .iter()
        .flat_map(|r| [(r.arrived, 1), (r.answered, -1)])
        .collect();
    moments.sort();
    let mut in_flight = 0;
    let mut most = 0;
    for (_, d) in moments {
        in_flight += d;
        most = most.max(in_flight);
    }
    assert!(most >= 4, "at most {most} calls overlapped");
    assert!(
        most <= 8,
        "the driver's concurrency limit is 8, yet {most} overlapped"
    );
}

/// Every PUT the driver received for each GUResID, in order, carried the cookie it was last
/// given: that of the PUT before it, or the one the answer to it set (gitplane may have died
/// before recording that answer). Returns how many PUTs after `killed_at` (the requests
/// received when gitplane was killed) carried a cookie over the kill.
#[track_caller]
fn assert_cookies_carried(received: &[Received], killed_at: usize, k: usize) -> usize {
    let mut last: HashMap<&str, (usize, &Received)> = HashMap::new();
    let mut carried = 0;
    for (i, r) in received.iter().enumerate() {
        if r.method != "PUT" {
            last.remove(r.guresid.as_str());
            continue;
        }
        if let Some((j, before)) = last.get(r.guresid.as_str()) {
            assert!(
                r.cookie == before.cookie || r.cookie == before.set_cookie,
                "k={k}: PUT {i} of {} carried {:?}; the PUT before it carried {:?} and was \
                 answered with {:?}",
                r.guresid,
                r.cookie,
                before.cookie,
                before.set_cookie
            );
            if *j < killed_at && i >= killed_at && r.cookie.is_some() {
                carried += 1;
            }
        }
        last.insert(&r.guresid, (i, r));
    }
    carried
}

/// Kills `gitplane apply` with SIGKILL once the driver has received `k` requests, for many
/// values of `k`, then applies again: every GUResID is created once, every resumed call carries
/// the cookie of the interrupted one, state matches the driver, and the file is intact.
#[test]
fn a_crash_at_any_moment_resumes_without_duplicates() {
    let mut kill_points = 0;
    let mut carried_over_a_kill = 0;
    for k in 1..=24 {
        let sb = Sandbox::new();
        let server = DriverServer::start();
        for t in ["base-env", "postgres", "workload"] {
            server.behave(
                t,
                Behavior {
                    polls: 1,
                    delay: Duration::from_millis(5),
                    ..Behavior::default()
                },
            );
        }
        // 13 resources, two calls each (a 202, then a 200): 26 moments to die at.
        http_platform(&sb, &server, 6);
        let config = sb.work.join("host.yaml");
        let mut child = Command::new(env!("CARGO_BIN_EXE_gitplane"))
            .args(["apply", "--config", config.to_str().unwrap()])
            .arg("--repo")
            .arg(&sb.origin)
            .arg("--state")
            .arg(&sb.state)
            .env_remove("GITPLANE_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start gitplane");
        let reached = server.wait_for_requests(k, Duration::from_secs(10));
        // SIGKILL: no chance to clean up.
        let _ = child.kill();
        let _ = child.wait();
        if reached {
            kill_points += 1;
        }
        let killed_at = server.received().len();
        let run = apply(&sb);
        assert_eq!(
            run.code,
            Some(0),
            "k={k}: the apply after the crash must succeed:{run}"
        );
        let instances = server.instances();
        let recorded = guresids(&sb);
        let recorded_ids: BTreeSet<&String> = recorded.values().collect();
        let live: BTreeSet<&String> = instances.keys().collect();
        assert_eq!(recorded_ids, live, "k={k}: state and driver disagree");
        assert_eq!(recorded.len(), 13, "k={k}");
        for (guresid, n) in server.creations() {
            assert_eq!(n, 1, "k={k}: {guresid} was created {n} times");
        }
        carried_over_a_kill += assert_cookies_carried(&server.received(), killed_at, k);
        // Outputs recorded are the server's instance for each resource.
        for (name, guresid) in &recorded {
            let outputs: Value = serde_json::from_str(
                &sb.column(&format!(
                    "SELECT outputs FROM resource WHERE guresid = '{guresid}'"
                ))[0],
            )
            .unwrap();
            assert_eq!(
                outputs["instance"],
                json!(instances[guresid]),
                "k={k}: {name}"
            );
        }
        assert_eq!(sb.column("PRAGMA integrity_check"), ["ok"], "k={k}");
        let d = sb.last_deployment("test");
        assert_eq!(d.status, "succeeded", "k={k}: {d:?}");
        assert_eq!(
            sb.count("SELECT COUNT(*) FROM deployment WHERE status = 'running'"),
            0,
            "k={k}"
        );
        assert_eq!(
            sb.count("SELECT COUNT(*) FROM operation WHERE status = 'started'"),
            0,
            "k={k}: no operation is left open"
        );
    }
    assert!(
        kill_points >= 20,
        "only {kill_points} kill points were reached"
    );
    // Killed between a 202 and its poll, a resource's next call must carry the 202's cookie:
    // some kill points land there, so the check above did look at resumed calls.
    assert!(
        carried_over_a_kill >= 5,
        "only {carried_over_a_kill} calls carried a cookie over a kill"
    );
}

/// Starts `gitplane apply` against `state` (any name of the state file) in the background.
fn spawn_apply(sb: &Sandbox, state: &std::path::Path) -> std::process::Child {
    let config = sb.work.join("host.yaml");
    Command::new(env!("CARGO_BIN_EXE_gitplane"))
        .args(["apply", "--config", config.to_str().unwrap()])
        .arg("--repo")
        .arg(&sb.origin)
        .arg("--state")
        .arg(state)
        .env_remove("GITPLANE_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gitplane")
}

#[test]
fn an_apply_through_a_symlink_is_refused_while_one_through_the_real_name_runs() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "workload",
        Behavior {
            delay: Duration::from_millis(300),
            ..Behavior::default()
        },
    );
    http_platform(&sb, &server, 2);
    let link = sb.root.join("link.db");
    std::os::unix::fs::symlink(&sb.state, &link).unwrap();
    let first = spawn_apply(&sb, &sb.state);
    assert!(
        server.wait_for_requests(1, Duration::from_secs(10)),
        "the first apply reached the driver"
    );
    let second = spawn_apply(&sb, &link).wait_with_output().unwrap();
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success(), "{first:?}");
    assert!(!second.status.success(), "{second:?}");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("is applying to environment test; wait for it to finish"),
        "{stderr}"
    );
    assert_eq!(
        server
            .received()
            .iter()
            .filter(|r| r.method == "PUT")
            .count(),
        5,
        "each resource was put once"
    );
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), 1);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM env_lock"),
        0,
        "the lock went with its holder"
    );
}

#[test]
fn a_state_file_with_two_hard_links_is_refused() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    http_platform(&sb, &server, 1);
    apply(&sb).ok();
    let before = std::fs::read(&sb.state).unwrap();
    let other = sb.root.join("other.db");
    std::fs::hard_link(&sb.state, &other).unwrap();
    let run = sb.gitplane_raw(
        &[
            "apply",
            "--config",
            sb.work.join("host.yaml").to_str().unwrap(),
            "--repo",
            sb.origin.to_str().unwrap(),
            "--state",
            other.to_str().unwrap(),
        ],
        &[],
    );
    let run = run.fails();
    run.stderr_has("the file has 2 names (hard links)")
        .stderr_has("remove the others");
    apply(&sb).fails().stderr_has("has 2 names");
    assert_eq!(std::fs::read(&sb.state).unwrap(), before, "state unchanged");
    assert_eq!(
        server.received().len(),
        3,
        "no driver call after the first apply"
    );
}

#[test]
fn a_resumed_deployment_counts_each_resource_once() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    for t in ["base-env", "postgres", "workload"] {
        server.behave(
            t,
            Behavior {
                delay: Duration::from_millis(5),
                ..Behavior::default()
            },
        );
    }
    http_platform(&sb, &server, 6);
    let mut child = spawn_apply(&sb, &sb.state);
    assert!(server.wait_for_requests(8, Duration::from_secs(10)));
    let _ = child.kill();
    let _ = child.wait();
    let run = apply(&sb).ok();
    run.stderr_has("resumed deployment 1");
    let d = sb.last_deployment("test");
    assert_eq!(d.id, 1, "{d:?}");
    assert_eq!(d.status, "succeeded", "{d:?}");
    assert_eq!(
        d.counts,
        [13, 0, 0, 0, 0],
        "13 created, none unchanged: {d:?}"
    );
    run.stdout_has("13 created, 0 updated, 0 deleted, 0 unchanged, 0 failed");
}

#[test]
fn deletion_policy_orphan_forgets_without_deleting() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    http_platform(&sb, &server, 3);
    sb.edit(
        "definitions/platform.yaml",
        "  type: postgres\n  driver_type: test/http\n",
        "  type: postgres\n  driver_type: test/http\n  deletion_policy: orphan\n",
    );
    sb.commit("Databases outlive their workloads");
    apply(&sb).ok();
    let ids = guresids(&sb);
    let db = ids["postgres#modules.w2.externals.db"].clone();
    let wl = ids["workload#modules.w2"].clone();
    sb.remove("workloads/app/w2.yaml");
    sb.commit("Retire w2");
    apply(&sb).ok();
    let deleted: Vec<String> = server
        .received()
        .iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.guresid.clone())
        .collect();
    assert_eq!(deleted, [wl], "only the workload is deleted by its driver");
    assert!(
        server.instances().contains_key(&db),
        "the database lives on"
    );
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM resource WHERE guresid = '{db}'"
        )),
        0,
        "and gitplane no longer manages it"
    );
    assert_eq!(
        sb.rows("SELECT action, res_id, status FROM operation WHERE action IN ('delete', 'forget') ORDER BY id"),
        [
            ["delete", "modules.w2", "succeeded"],
            ["forget", "modules.w2.externals.db", "succeeded"]
        ]
    );
}

#[test]
fn progress_shows_what_finished_while_a_slow_driver_is_still_working() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    let slow = Duration::from_secs(3);
    server.behave(
        "postgres",
        Behavior {
            delay: slow,
            ..Behavior::default()
        },
    );
    http_platform(&sb, &server, 1);
    sb.edit("host.yaml", "timeout: 2s", "timeout: 10s");
    sb.commit("A slow database");
    let config = sb.work.join("host.yaml");
    // stderr is a pipe, as under systemd or CI: progress is plain lines.
    let mut child = Command::new(env!("CARGO_BIN_EXE_gitplane"))
        .args(["apply", "--config", config.to_str().unwrap(), "--repo"])
        .arg(&sb.origin)
        .arg("--state")
        .arg(&sb.state)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GITPLANE_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let stderr = child.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map(|l| (started.elapsed(), l.unwrap()))
            .collect::<Vec<_>>()
    });
    assert!(child.wait().unwrap().success());
    let exited = started.elapsed();
    let lines = lines.join().unwrap();
    let (at, _) = lines
        .iter()
        .find(|(_, l)| l.contains("create") && l.contains("base-env"))
        .unwrap_or_else(|| panic!("no line for the base-env: {lines:?}"));
    // The base-env is done at once; its line must not wait for the database's answer.
    assert!(
        exited.saturating_sub(*at) >= slow / 2,
        "the base-env's line came {at:?} after the start, the apply ended after {exited:?}"
    );
}
