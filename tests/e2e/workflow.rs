//! Environments as a workflow, through the real daemon and CLI on a bare repository people push
//! to: a preview environment per branch (made on push, updated on the next, removed when the
//! branch goes or its time runs out, never touching another environment), and rollback with a
//! pin that holds later pushes until `gitplane unpin`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, wait_deployed};
use crate::util::{Definition, Sandbox, definitions, http_driver_config};
use gitplane_testkit::DriverServer;

/// An HTTP-driver platform: environment `test`, app `shop` with a workload `web` that reads a
/// postgres. The postgres of a `preview` environment has its own definition (its type chooses).
pub(crate) fn write_platform(sb: &Sandbox, version: &str) {
    sb.write("environments/test.yaml", "type: test\n");
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::http("base-env").value("zone: test"),
            Definition::http("postgres").value("size: shared"),
            Definition::http("postgres-preview")
                .of_type("postgres")
                .value("size: tiny-preview")
                .criteria("{env_type: preview}"),
            Definition::http("workload").value("namespace: ${context.env.id}"),
        ]),
    );
    write_workload(sb, version);
}

pub(crate) fn write_workload(sb: &Sandbox, version: &str) {
    sb.write(
        "workloads/shop/web.yaml",
        &format!(
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
             image: shop:{version}\n    variables:\n      DB: ${{resources.db.name}}\n\
             resources:\n  db:\n    type: postgres\n"
        ),
    );
}

/// The daemon's arguments with a host config registering `server` and watching every second,
/// and `extra`.
pub(crate) fn host_config(sb: &Sandbox, server: &DriverServer, extra: &str) -> Vec<String> {
    sb.host_config(&format!(
        "{}watch_interval: 1s\n{extra}",
        http_driver_config(&server.url, "timeout: 10s")
    ))
}

pub(crate) fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Commits the clone's changes on `branch` and pushes it.
pub(crate) fn push_branch(sb: &Sandbox, branch: &str, message: &str) -> String {
    sb.git(&["add", "-A"]);
    sb.git(&["commit", "--quiet", "-m", message]);
    sb.git(&["push", "--quiet", "origin", branch]);
    sb.head()
}

pub(crate) fn guresids(sb: &Sandbox, env: &str) -> BTreeSet<String> {
    sb.column(&format!("SELECT guresid FROM resource WHERE env = '{env}'"))
        .into_iter()
        .collect()
}

/// The requests `method` the driver received for `ids`, in arrival order (type of each).
pub(crate) fn calls(server: &DriverServer, method: &str, ids: &BTreeSet<String>) -> Vec<String> {
    let mut received = server.received();
    received.sort_by_key(|r| r.arrived);
    received
        .iter()
        .filter(|r| r.method == method && ids.contains(&r.guresid))
        .map(|r| r.guresid.clone())
        .collect()
}

/// Waits until `done` (up to `timeout`), failing with `what` and the daemon's log.
#[track_caller]
pub(crate) fn wait_until(
    what: &str,
    daemon: &Daemon,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) {
    gitplane_testkit::eventually_or(
        what,
        timeout,
        || done().then_some(()),
        || format!("daemon log:\n{}", daemon.log()),
    );
}

/// A pushed `pr-1` branch gets its own environment at the driver, built with the preview type's
/// definitions; a second push updates it; deleting the branch deletes every resource of it, in
/// reverse dependency order, and nothing of any other environment.
#[test]
fn a_branch_gets_a_preview_environment_that_goes_with_the_branch() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    write_platform(&sb, "v1");
    let main = sb.commit("A platform");
    let args = host_config(
        &sb,
        &server,
        "previews: {branches: \"pr-*\", type: preview}\n",
    );
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_deployed(&sb, &main, &["test"], Duration::from_secs(30));
    let test_ids = guresids(&sb, "test");
    assert_eq!(test_ids.len(), 3, "base-env, postgres, workload");

    sb.git(&["checkout", "--quiet", "-b", "pr-1"]);
    write_workload(&sb, "v2");
    let first = push_branch(&sb, "pr-1", "Try v2");
    wait_deployed(&sb, &first, &["pr-1"], Duration::from_secs(30));
    let preview_ids = guresids(&sb, "pr-1");
    assert_eq!(
        preview_ids.len(),
        3,
        "the preview has its own three resources"
    );
    assert!(preview_ids.is_disjoint(&test_ids));
    assert_eq!(
        server
            .instances()
            .keys()
            .filter(|g| preview_ids.contains(*g))
            .count(),
        3,
        "each exists at the driver"
    );
    // Its type chose the postgres definition; its workload is the branch's.
    let put_of = |res_type: &str| {
        server
            .received()
            .into_iter()
            .rev()
            .find(|r| {
                r.method == "PUT" && preview_ids.contains(&r.guresid) && r.body["type"] == res_type
            })
            .map(|r| r.body)
            .unwrap()
    };
    assert_eq!(
        put_of("postgres")["driver"]["values"]["size"],
        "tiny-preview"
    );
    assert!(put_of("workload").to_string().contains("shop:v2"));
    assert_eq!(
        sb.column("SELECT env || ' ' || deletion_threshold FROM deployment WHERE env = 'pr-1'")
            .len(),
        1
    );

    // The second push updates the preview, and only it.
    let test_calls_before = calls(&server, "PUT", &test_ids).len();
    write_workload(&sb, "v3");
    let second = push_branch(&sb, "pr-1", "Try v3");
    wait_deployed(&sb, &second, &["pr-1"], Duration::from_secs(30));
    assert!(put_of("workload").to_string().contains("shop:v3"));
    assert_eq!(guresids(&sb, "pr-1"), preview_ids, "updated in place");
    let second_deployment = sb.rows(&format!(
        "SELECT status, updated FROM deployment WHERE env = 'pr-1' AND commit_id = '{second}'"
    ));
    assert_eq!(second_deployment, [["succeeded", "1"]]);

    // A push to main deploys test alone, while the preview lives on.
    sb.git(&["checkout", "--quiet", "main"]);
    write_workload(&sb, "v1.1");
    let on_main = sb.commit("v1.1 on main");
    wait_deployed(&sb, &on_main, &["test"], Duration::from_secs(30));
    // Not a wait for an event: time passes to show that a deployment that must not come does
    // not.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE env = 'pr-1' AND commit_id = '{on_main}'"
        )),
        0,
        "main's commit never deploys the preview"
    );
    // Nor does an apply of main by hand, which covers the environments with resources.
    let config = &args[args.len() - 1];
    sb.gitplane(&["apply", "--config", config]).ok();
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE env = 'pr-1'"),
        2,
        "the apply left the preview alone"
    );
    assert_eq!(guresids(&sb, "pr-1"), preview_ids);

    // Deleting the branch removes the preview.
    sb.git(&["push", "--quiet", "origin", "--delete", "pr-1"]);
    wait_until(
        "the preview removed",
        &daemon,
        Duration::from_secs(30),
        || {
            sb.count("SELECT COUNT(*) FROM preview WHERE env = 'pr-1' AND removed_at IS NOT NULL")
                == 1
        },
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE env = 'pr-1'"),
        0
    );
    let deletes = calls(&server, "DELETE", &preview_ids);
    assert_eq!(deletes.len(), 3, "every preview resource deleted once");
    // Reverse dependency order: the workload before the postgres it uses (the base-env, which
    // nothing here reads, may go at any time).
    let type_of = |g: &str| {
        sb.column(&format!(
            "SELECT type FROM resource_version WHERE guresid = '{g}' LIMIT 1"
        ))[0]
            .clone()
    };
    let order: Vec<String> = deletes.iter().map(|g| type_of(g)).collect();
    let at = |t: &str| order.iter().position(|o| o == t).unwrap();
    assert!(at("workload") < at("postgres"), "{order:?}");
    // The other environment is untouched.
    assert!(calls(&server, "DELETE", &test_ids).is_empty());
    assert_eq!(
        calls(&server, "PUT", &test_ids).len(),
        test_calls_before + 1,
        "test's workload took main's v1.1, nothing else"
    );
    assert_eq!(guresids(&sb, "test"), test_ids);
    assert_eq!(
        sb.rows("SELECT removed_why FROM preview WHERE env = 'pr-1'"),
        [["branch deleted"]]
    );
    // Its history stays, as any environment's; status says what it was.
    let status = sb.gitplane(&["status", "--env", "pr-1"]).ok();
    status.stdout_has("preview of branch pr-1: removed");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE env = 'pr-1'"),
        3
    );
    // A push to main deploys test alone: the preview stays gone.
    write_workload(&sb, "v4");
    let next = sb.commit("v4 everywhere");
    wait_deployed(&sb, &next, &["test"], Duration::from_secs(30));
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE env = 'pr-1' AND commit_id = '{next}'"
        )),
        0
    );
}

/// A preview not pushed within its ttl is removed, while its branch stays; only a new push brings
/// it back.
#[test]
fn a_preview_whose_time_runs_out_is_removed() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    write_platform(&sb, "v1");
    let main = sb.commit("A platform");
    let args = host_config(
        &sb,
        &server,
        "previews: {branches: \"pr-*\", type: preview, ttl: 3s}\n",
    );
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_deployed(&sb, &main, &["test"], Duration::from_secs(30));
    sb.git(&["checkout", "--quiet", "-b", "pr-2"]);
    write_workload(&sb, "v2");
    let pushed = push_branch(&sb, "pr-2", "Try v2");
    let started = Instant::now();
    wait_deployed(&sb, &pushed, &["pr-2"], Duration::from_secs(30));
    let preview_ids = guresids(&sb, "pr-2");
    assert_eq!(preview_ids.len(), 3);
    wait_until(
        "the ttl to expire",
        &daemon,
        Duration::from_secs(20),
        || {
            sb.count("SELECT COUNT(*) FROM preview WHERE env = 'pr-2' AND removed_at IS NOT NULL")
                == 1
        },
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "removed before its ttl: {took:?}"
    );
    eprintln!("ttl 3s: removed {took:?} after the push");
    assert_eq!(
        sb.rows("SELECT removed_why FROM preview WHERE env = 'pr-2'"),
        [["ttl expired"]]
    );
    assert_eq!(calls(&server, "DELETE", &preview_ids).len(), 3);
    assert_eq!(guresids(&sb, "test").len(), 3, "test keeps its resources");
    // The branch is still there: the next looks leave the preview removed. Not a wait for an
    // event: two watch intervals pass, to show that nothing makes the preview again.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE env = 'pr-2'"),
        0
    );
    // A new push makes it again.
    write_workload(&sb, "v3");
    let again = push_branch(&sb, "pr-2", "Try v3");
    wait_deployed(&sb, &again, &["pr-2"], Duration::from_secs(30));
    assert_eq!(
        guresids(&sb, "pr-2"),
        preview_ids,
        "the same GUResIDs again"
    );
    drop(daemon);
}

/// A rollback applies an earlier commit at the driver and pins the environment: pushes after it
/// are planned and shown, not applied, until `gitplane unpin`, which applies the newest.
#[test]
fn a_rollback_pins_the_environment_until_unpinned() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    write_platform(&sb, "v1");
    let good = sb.commit("v1");
    let args = host_config(&sb, &server, "");
    let daemon = Daemon::start(&sb, &strs(&args));
    wait_deployed(&sb, &good, &["test"], Duration::from_secs(30));
    let v1_ids = guresids(&sb, "test");
    // v2 adds a cache and changes the image.
    write_workload(&sb, "v2");
    let text = sb.read("workloads/shop/web.yaml");
    sb.write(
        "workloads/shop/web.yaml",
        &format!("{text}  cache:\n    type: postgres\n    id: cache\n"),
    );
    let bad = sb.commit("v2 with a cache");
    wait_deployed(&sb, &bad, &["test"], Duration::from_secs(30));
    let v2_ids = guresids(&sb, "test");
    let cache: BTreeSet<String> = v2_ids.difference(&v1_ids).cloned().collect();
    assert_eq!(cache.len(), 1);

    let config = &args[args.len() - 1];
    let rollback = sb
        .gitplane(&[
            "rollback",
            "--env",
            "test",
            "--to",
            &good,
            "--reason",
            "v2 breaks checkout",
            "--by",
            "alice",
            "--config",
            config,
        ])
        .ok();
    rollback.stdout_has("test: pinned at");
    rollback.stdout_has("by alice: v2 breaks checkout");
    // The earlier commit's resources, at the driver too.
    assert_eq!(guresids(&sb, "test"), v1_ids);
    assert_eq!(
        calls(&server, "DELETE", &cache).len(),
        1,
        "the cache is gone"
    );
    let last_workload_put = server
        .received()
        .into_iter()
        .rev()
        .find(|r| r.method == "PUT" && r.body["type"] == "workload")
        .unwrap();
    assert!(last_workload_put.body.to_string().contains("shop:v1"));
    let rolled = sb.last_deployment("test");
    assert_eq!(rolled.commit, good);

    // A later push is planned, not applied.
    let puts_before = server.received().len();
    write_workload(&sb, "v3");
    let newer = sb.commit("v3");
    daemon.wait_for_log("pinned by a rollback", Duration::from_secs(30));
    wait_until(
        "the held-back commit recorded",
        &daemon,
        Duration::from_secs(10),
        || {
            sb.count(&format!(
                "SELECT COUNT(*) FROM env_pin WHERE waiting_commit = '{newer}'"
            )) == 1
        },
    );
    // Not a wait for an event: time passes to show that no call is made for the pinned env.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        server.received().len(),
        puts_before,
        "no driver call for the pinned env"
    );
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE commit_id = '{newer}'"
        )),
        0
    );
    let status = sb.gitplane(&["status", "--env", "test"]).ok();
    status.stdout_has("pinned at");
    status.stdout_has("by alice");
    status.stdout_has(&format!("held back: {}", &newer[..7]));
    status.stdout_has("0 to create, 1 to update, 0 to delete");
    let json = sb.gitplane(&["status", "--format", "json"]).ok().json();
    assert_eq!(
        json[0]["pin"]["pinned_by"], "alice",
        "one environment: an array of one object"
    );
    assert_eq!(json[0]["pin"]["held_back"]["commit"], newer.as_str());
    let history = sb.gitplane(&["history"]).ok();
    history.stdout_has("v2 breaks checkout; still pinned");
    let history = sb.gitplane(&["history", "--format", "json"]).ok().json();
    let pinned = history
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d.get("pin").is_some())
        .expect("the rollback's deployment carries its pin");
    assert_eq!(pinned["id"], rolled.id);

    // A CLI apply respects the pin as well.
    let apply = sb
        .gitplane(&["apply", "--env", "test", "--config", config])
        .fails();
    apply.stdout_has("is planned, not applied");

    let unpin = sb
        .gitplane(&["unpin", "--env", "test", "--by", "bob", "--config", config])
        .ok();
    unpin.stdout_has("unpinned by bob");
    let v3 = server
        .received()
        .into_iter()
        .rev()
        .find(|r| r.method == "PUT" && r.body["type"] == "workload")
        .unwrap();
    assert!(
        v3.body.to_string().contains("shop:v3"),
        "unpin applies the newest commit"
    );
    assert_eq!(sb.last_deployment("test").commit, newer);
    sb.gitplane(&["history"]).ok().stdout_has("unpinned by bob");
    let status = sb.gitplane(&["status", "--env", "test"]).ok();
    assert!(!status.stdout.contains("pinned at"), "{status}");
    drop(daemon);
}

/// Wrong uses change nothing: no env, an unknown commit, an empty reason, unpinning what is not
/// pinned.
#[test]
fn rollback_and_unpin_refuse_what_they_cannot_do() {
    let sb = Sandbox::applied();
    let before = sb.count("SELECT COUNT(*) FROM deployment");
    sb.gitplane(&["rollback", "--to", "HEAD", "-m", "x"])
        .fails()
        .stderr_has("pass exactly one --env");
    sb.gitplane(&[
        "rollback",
        "--env",
        "development",
        "--to",
        "nope",
        "-m",
        "x",
    ])
    .fails()
    .stderr_has("no branch, tag or commit is named 'nope'");
    sb.gitplane(&[
        "rollback",
        "--env",
        "development",
        "--to",
        "HEAD",
        "-m",
        " ",
    ])
    .fails()
    .stderr_has("--reason is empty");
    sb.gitplane(&["rollback", "--env", "staging", "--to", "HEAD", "-m", "x"])
        .fails()
        .stderr_has("no environment 'staging' is recorded");
    sb.gitplane(&["unpin", "--env", "development"])
        .fails()
        .stderr_has("environment 'development' is not pinned");
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), before);
    assert_eq!(sb.count("SELECT COUNT(*) FROM env_pin"), 0);
}
