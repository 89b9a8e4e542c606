//! Work follows the change: a commit is compared with what each app was when it was last
//! deployed, and only the apps it changed are read, built, planned and applied; the others
//! count as unchanged. Where apps meet through global resources in ways a part cannot see, the
//! whole environment is read. Each case is checked against what a whole read would do.

use std::time::Duration;

use crate::daemon::{Daemon, repo_args, wait_deployed};
use crate::util::{Run, Sandbox};
use gitplane_testkit::{Behavior, DriverServer};

const ENV: &str = "type: development\n";

fn def(id: &str, res_type: &str, driver: &str, values: &str) -> String {
    format!(
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
         type: {res_type}\n  driver_type: {driver}\n  driver_inputs:\n    values:\n{values}  \
         criteria:\n    - {{}}\n"
    )
}

/// A workload with a private postgres (reading the base-env) and a dns.
fn workload(image: &str) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: {image}\n    \
         variables:\n      DB: ${{resources.db.host}}\n      HOST: ${{resources.dns.host}}\nresources:\n  \
         db:\n    type: postgres\n  dns:\n    type: dns\n"
    )
}

/// Apps `a`, `b` and `c`, each with a base-env, a postgres, a dns and a workload, applied.
fn three_apps() -> Sandbox {
    let sb = three_apps_committed();
    sb.gitplane(&["apply"]).ok().stdout_has("12 created");
    sb
}

/// Apps `a`, `b` and `c`, committed and pushed.
fn three_apps_committed() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("environments/development.yaml", ENV);
    sb.write(
        "definitions/platform.yaml",
        &[
            def("base-env", "base-env", "echo", "      pghost: db.internal\n"),
            def(
                "postgres",
                "postgres",
                "echo",
                "      host: ${resources.base-env#base-env.outputs.pghost}\n      name: ${context.app.id}\n",
            ),
            def("dns", "dns", "echo", "      host: ${context.app.id}.example.com\n"),
            def("workload", "workload", "echo", "      namespace: ${context.app.id}\n"),
        ]
        .join("---\n"),
    );
    for app in ["a", "b", "c"] {
        sb.write(&format!("workloads/{app}/web.yaml"), &workload("web:1"));
    }
    sb.commit("Three apps");
    sb
}

/// A host config that registers `driver` as `test/http` with `timeout`, then `extra`; its path.
fn http_driver_config(sb: &Sandbox, driver: &DriverServer, timeout: &str, extra: &str) -> String {
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: {timeout}}}\n{extra}",
            driver.url
        ),
    )
    .unwrap();
    config.to_str().unwrap().to_owned()
}

/// `gitplane apply` with the reading logged.
fn apply(sb: &Sandbox, args: &[&str]) -> Run {
    let mut all = vec!["apply"];
    all.extend(args);
    sb.gitplane_env(&all, &[("GITPLANE_LOG", "info")])
}

/// `app type -> updated_at` of every resource, to see which rows an apply touched.
/// `gitplane apply` of the clone's origin with host config `config`, started and left running
/// while `driver` takes 20 s to answer for each queue (to be killed half-way).
fn apply_with_a_slow_queue(
    sb: &Sandbox,
    driver: &DriverServer,
    config: &str,
) -> std::process::Child {
    driver.behave(
        "queue",
        Behavior {
            delay: Duration::from_secs(20),
            ..Behavior::default()
        },
    );
    std::process::Command::new(env!("CARGO_BIN_EXE_gitplane"))
        .args(["apply", "--config", config, "--repo"])
        .arg(&sb.origin)
        .arg("--state")
        .arg(&sb.state)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// A Score file of a worker that asks for a queue.
const WORKER_WITH_QUEUE: &str = "apiVersion: score.dev/v1b1\nmetadata:\n  name: worker\n\
    containers:\n  main:\n    image: w\nresources:\n  jobs:\n    type: queue\n";

fn touched(sb: &Sandbox) -> Vec<Vec<String>> {
    sb.rows(
        "SELECT COALESCE(app, '-'), type, res_id, updated_at, inputs_hash FROM resource
         ORDER BY 1, 2, 3",
    )
}

/// `deployment_id, unprinted` of the census of `development`.
fn census(sb: &Sandbox) -> Vec<Vec<String>> {
    sb.rows("SELECT deployment_id, unprinted FROM app_census WHERE env = 'development'")
}

#[test]
fn a_commit_reads_plans_and_applies_only_the_apps_it_changed() {
    let sb = three_apps();
    let before = touched(&sb);
    sb.edit("workloads/b/web.yaml", "web:1", "web:2");
    sb.commit("A new image for b");

    let plan = sb.gitplane(&["plan", "--format", "steps-json"]).ok().json()[0].clone();
    let steps: Vec<(String, String)> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                format!(
                    "{}/{}",
                    s["app"].as_str().unwrap(),
                    s["type"].as_str().unwrap()
                ),
                s["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(steps.len(), 4, "only b's resources are planned: {plan}");
    assert!(steps.iter().all(|(r, _)| r.starts_with("b/")), "{steps:?}");
    assert!(steps.contains(&("b/workload".into(), "update".into())));
    assert_eq!(plan["unchanged_apps"], 2);
    assert_eq!(plan["unchanged_resources"], 8);

    let run = apply(&sb, &[]).ok();
    run.stdout_has("0 created, 1 updated, 0 deleted, 11 unchanged, 0 failed")
        .stderr_has("1 changed, 2 as last deployed");
    let d = sb.last_deployment("development").id;
    assert_eq!(
        sb.operations(d),
        [("update".into(), "modules.web".into(), "succeeded".into())]
    );
    let after = touched(&sb);
    for (old, new) in before.iter().zip(&after) {
        if old[0] == "b" && old[1] == "workload" {
            assert_ne!(old, new);
        } else {
            assert_eq!(old, new, "only b's workload changes");
        }
    }

    // The same commit again: nothing is read at all, twice; each time the census of the apps
    // without fingerprint is carried on to the newest deployment, so the next one need not
    // read every resource row to find them.
    for _ in 0..2 {
        apply(&sb, &[])
            .ok()
            .stdout_has("0 created, 0 updated, 0 deleted, 12 unchanged, 0 failed")
            .stderr_has("0 changed, 3 as last deployed");
        assert_eq!(
            census(&sb),
            [vec![
                sb.last_deployment("development").id.to_string(),
                "[]".into()
            ]]
        );
        // With the digest of the fingerprints it left: the next same commit reads none.
        assert_eq!(
            sb.count("SELECT COUNT(*) FROM app_census WHERE digest IS NOT NULL AND resources = 12"),
            1
        );
    }
    // And what it recorded is what a whole read gives: the whole read finds nothing to do.
    sb.gitplane(&["resolve", "b/workload.default#modules.web"])
        .ok()
        .stdout_has("0 created, 0 updated, 0 deleted, 12 unchanged");
}

#[test]
fn an_app_added_or_removed_is_the_only_one_touched() {
    let sb = three_apps();
    sb.write("workloads/d/web.yaml", &workload("web:1"));
    sb.remove("workloads/a");
    sb.commit("d replaces a");
    let run = apply(&sb, &[]).ok();
    run.stdout_has("4 created, 0 updated, 4 deleted, 8 unchanged, 0 failed")
        .stderr_has("2 changed, 2 as last deployed");
    let apps = sb.column("SELECT DISTINCT app FROM resource ORDER BY 1");
    assert_eq!(apps, ["b", "c", "d"]);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM app_fingerprint WHERE env = 'development'"),
        3
    );
}

#[test]
fn a_changed_definition_reaches_every_app() {
    let sb = three_apps();
    sb.edit(
        "definitions/platform.yaml",
        "      pghost: db.internal",
        "      pghost: db2.internal",
    );
    sb.commit("Move the databases");
    apply(&sb, &[])
        .ok()
        .stdout_has("0 created, 9 updated, 0 deleted, 3 unchanged, 0 failed")
        .stderr_has("reading the whole environment");
}

#[test]
fn an_app_left_unfinished_is_read_again_though_its_files_did_not_change() {
    let sb = three_apps();
    let driver = DriverServer::start();
    let config = &http_driver_config(
        &sb,
        &driver,
        "2s",
        "retry: {attempts: 1, initial_delay: 10ms, max_delay: 20ms, poll_interval: 10ms}\n",
    );
    sb.write(
        "definitions/queue.yaml",
        &def("queue", "queue", "test/http", "      size: 1\n"),
    );
    sb.write("workloads/b/worker.yaml", WORKER_WITH_QUEUE);
    sb.commit("b gets a worker and its queue");
    driver.behave(
        "queue",
        Behavior {
            fail: Some((400, 1)),
            ..Behavior::default()
        },
    );
    sb.gitplane(&["apply", "--config", config])
        .fails()
        .stdout_has("2 failed");
    // The same commit: b is read again (its queue failed), a and c are not.
    let run = sb
        .gitplane_env(&["apply", "--config", config], &[("GITPLANE_LOG", "info")])
        .ok();
    run.stdout_has("1 created, 1 updated, 0 deleted, 12 unchanged, 0 failed")
        .stderr_has("1 changed, 2 as last deployed");
    assert_eq!(
        driver
            .received()
            .iter()
            .filter(|r| r.method == "PUT" && r.status == 200)
            .count(),
        1
    );
    sb.gitplane_env(&["apply", "--config", config], &[("GITPLANE_LOG", "info")])
        .ok()
        .stderr_has("0 changed, 3 as last deployed");
}

#[test]
fn an_app_that_reads_a_secret_store_is_read_every_time() {
    let sb = three_apps();
    let dir = sb.root.join("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pw"), "first\n").unwrap();
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!("secret_stores:\n  files: {{dir: {}}}\n", dir.display()),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    sb.write(
        "definitions/vault-db.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: secured\n\
         entity:\n  type: secured\n  driver_type: echo\n  driver_inputs:\n    secret_refs:\n      \
         password: {store: files, ref: pw}\n  criteria:\n    - {}\n",
    );
    sb.write(
        "workloads/c/web.yaml",
        &workload("web:1").replace("resources:\n", "resources:\n  pw:\n    type: secured\n"),
    );
    sb.commit("c reads a stored secret");
    sb.gitplane(&["apply", "--config", config]).ok();
    // The secret rotates in the store, with no commit: c is read and its resource updated.
    std::fs::write(dir.join("pw"), "second\n").unwrap();
    let run = sb
        .gitplane_env(&["apply", "--config", config], &[("GITPLANE_LOG", "info")])
        .ok();
    run.stdout_has("0 created, 1 updated")
        .stderr_has("1 changed, 2 as last deployed");
    run.hides(&["first", "second"]);

    // c keeps no fingerprint, so the census names it; once c leaves the tree it is found
    // there, and its resources go.
    assert_eq!(
        census(&sb),
        [vec![
            sb.last_deployment("development").id.to_string(),
            "[\"c\"]".into()
        ]]
    );
    sb.remove("workloads/c");
    sb.commit("c goes");
    apply(&sb, &["--config", config])
        .ok()
        .stdout_has("0 created, 0 updated, 5 deleted, 8 unchanged, 0 failed")
        .stderr_has("1 changed, 2 as last deployed");
    assert_eq!(
        sb.column("SELECT DISTINCT app FROM resource WHERE app IS NOT NULL ORDER BY 1"),
        ["a", "b"]
    );
    assert_eq!(census(&sb)[0][1], "[]");
}

#[test]
fn an_app_moved_by_hand_to_one_the_tree_does_not_have_is_found_by_the_next_apply() {
    let sb = three_apps();
    apply(&sb, &[])
        .ok()
        .stderr_has("0 changed, 3 as last deployed");
    sb.gitplane(&["state", "mv", "c", "ghost"]).ok();
    // ghost has resources and no fingerprint, and no deployment ran since the census: the
    // surgery dropped it, so ghost is counted, and deleted; c is made again.
    apply(&sb, &[])
        .ok()
        .stdout_has("4 created, 0 updated, 4 deleted, 8 unchanged, 0 failed")
        .stderr_has("2 changed, 2 as last deployed");
    assert_eq!(
        sb.column("SELECT DISTINCT app FROM resource WHERE app IS NOT NULL ORDER BY 1"),
        ["a", "b", "c"]
    );
}

/// Two apps on a global zone, shared through `gitplane.dev/resource-ref`.
fn two_apps_on_a_global_zone() -> Sandbox {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\nshared_resources:\n  zone:\n    type: dns\n",
    );
    sb.write(
        "definitions/platform.yaml",
        &[
            def("dns", "dns", "echo", "      zone: example.com\n"),
            def(
                "workload",
                "workload",
                "echo",
                "      namespace: ${context.app.id}\n",
            ),
        ]
        .join("---\n"),
    );
    let zoned = |image: &str| {
        format!(
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: {image}\n    \
             variables:\n      ZONE: ${{resources.dns.zone}}\nresources:\n  dns:\n    type: dns\n    \
             metadata:\n      annotations:\n        gitplane.dev/resource-ref: zone\n"
        )
    };
    sb.write("workloads/a/web.yaml", &zoned("web:1"));
    sb.write("workloads/b/web.yaml", &zoned("web:1"));
    sb.commit("Two apps in one zone");
    sb.gitplane(&["apply"]).ok().stdout_has("3 created");
    sb
}

#[test]
fn a_global_resource_stays_shared_while_one_app_changes() {
    let sb = two_apps_on_a_global_zone();
    sb.edit("workloads/a/web.yaml", "web:1", "web:2");
    sb.commit("a's new image");
    apply(&sb, &[])
        .ok()
        .stdout_has("0 created, 1 updated, 0 deleted, 2 unchanged")
        .stderr_has("1 changed, 1 as last deployed");
    assert_eq!(
        sb.count(
            "SELECT COUNT(*) FROM link WHERE valid_to IS NULL AND provider =
               (SELECT guresid FROM resource WHERE res_id = 'globals.zone')"
        ),
        2,
        "both apps still link to the zone"
    );

    // a stops using the zone: another app may still use it, so the whole environment is read,
    // and the zone stays for b.
    sb.write(
        "workloads/a/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: web:3\n",
    );
    sb.commit("a leaves the zone");
    apply(&sb, &[])
        .ok()
        .stdout_has("0 deleted")
        .stderr_has("no longer uses global resource -/dns.default#globals.zone");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE app IS NULL"),
        1
    );

    // b leaves too: the last user gone, the zone goes.
    sb.write(
        "workloads/b/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: web:3\n",
    );
    sb.commit("b leaves the zone");
    apply(&sb, &[]).ok().stdout_has("1 deleted");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE app IS NULL"),
        0
    );
}

#[test]
fn a_global_resource_that_selects_its_dependents_makes_every_app_read() {
    let sb = two_apps_on_a_global_zone();
    // The zone co-provisions a list of the namespaces of the workloads that use it.
    sb.edit(
        "definitions/platform.yaml",
        "      zone: example.com\n",
        "      zone: example.com\n  provision:\n    zone-users:\n      is_dependent: true\n",
    );
    sb.write(
        "definitions/zone-users.yaml",
        &def(
            "zone-users",
            "zone-users",
            "echo",
            "      users: ${resources.dns<workload.outputs.namespace}\n",
        ),
    );
    sb.commit("The zone knows its users");
    sb.gitplane(&["apply"]).ok();
    let users = || {
        let outputs = sb.column("SELECT outputs FROM resource WHERE type = 'zone-users'");
        let outputs: serde_json::Value = serde_json::from_str(&outputs[0]).unwrap();
        let mut users: Vec<String> = serde_json::from_value(outputs["users"].clone()).unwrap();
        users.sort();
        users
    };
    assert_eq!(users(), ["a", "b"]);
    // A third app joins the zone: the list must see it, so every app is read, not just c.
    sb.write("workloads/c/web.yaml", &sb.read("workloads/a/web.yaml"));
    sb.commit("c joins the zone");
    apply(&sb, &[])
        .ok()
        .stderr_has("global resource -/zone-users.default#globals.zone selects its dependents");
    assert_eq!(users(), ["a", "b", "c"]);
}

#[test]
fn the_daemon_reads_only_the_apps_a_push_changed_and_back_again() {
    let sb = three_apps_committed();
    let first = sb.head();
    let args = repo_args(&sb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(&sb, &args);
    wait_deployed(&sb, &first, &["development"], Duration::from_secs(20));
    let counts = |commit: &str| {
        sb.rows(&format!(
            "SELECT created, updated, deleted, unchanged, failed FROM deployment
             WHERE commit_id = '{commit}'"
        ))
    };
    assert_eq!(counts(&first), [["12", "0", "0", "0", "0"]]);

    sb.edit("workloads/b/web.yaml", "web:1", "web:2");
    let second = sb.commit("b's new image");
    wait_deployed(&sb, &second, &["development"], Duration::from_secs(20));
    assert_eq!(counts(&second), [["0", "1", "0", "11", "0"]]);
    assert!(
        daemon.log().contains("1 changed, 2 as last deployed"),
        "{}",
        daemon.log()
    );
    // Back to the first image: b's folder is as in the first commit, but b was deployed since
    // with another one, so b is read and set back.
    sb.edit("workloads/b/web.yaml", "web:2", "web:1");
    let third = sb.commit("b's old image again");
    wait_deployed(&sb, &third, &["development"], Duration::from_secs(20));
    assert_eq!(counts(&third), [["0", "1", "0", "11", "0"]]);
    let image = sb.column(
        "SELECT json_extract(inputs, '$.resource.containers.main.image') FROM resource
         WHERE app = 'b' AND type = 'workload'",
    );
    assert_eq!(image, ["web:1"]);
}

#[test]
fn an_app_a_killed_deployment_was_changing_is_read_again_even_for_its_old_files() {
    let sb = three_apps();
    let driver = DriverServer::start();
    let config = http_driver_config(&sb, &driver, "30s", "");
    sb.write(
        "definitions/queue.yaml",
        &def(
            "queue",
            "queue",
            "test/http",
            "      size: ${context.app.id}\n",
        ),
    );
    sb.write("workloads/b/worker.yaml", WORKER_WITH_QUEUE);
    sb.commit("b gets a worker");
    sb.gitplane(&["apply", "--config", &config]).ok();
    let before = touched(&sb);

    // b's web workload and its queue change, and the queue's answer is slow: gitplane is
    // killed after b's web workload is updated, while the queue is being called.
    sb.edit("workloads/b/web.yaml", "web:1", "web:2");
    sb.edit(
        "workloads/b/worker.yaml",
        "type: queue\n",
        "type: queue\n    params: {v: 2}\n",
    );
    sb.commit("b's new image and queue");
    let mut child = apply_with_a_slow_queue(&sb, &driver, &config);
    gitplane_testkit::eventually("b's web updated", Duration::from_secs(20), || {
        (sb.count(
            "SELECT COUNT(*) FROM resource WHERE app = 'b' AND type = 'workload'
             AND res_id = 'modules.web' AND inputs LIKE '%web:2%'",
        ) > 0)
            .then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();

    // Back to the files b was last fully deployed with: its folder's fingerprint is the one
    // recorded before, but the killed deployment changed b, so b is read and set back.
    driver.behave("queue", Behavior::default());
    sb.edit("workloads/b/web.yaml", "web:2", "web:1");
    sb.edit(
        "workloads/b/worker.yaml",
        "type: queue\n    params: {v: 2}\n",
        "type: queue\n",
    );
    sb.commit("b's old image and queue again");
    sb.gitplane_env(&["apply", "--config", &config], &[("GITPLANE_LOG", "info")])
        .ok()
        .stderr_has("1 changed, 2 as last deployed");
    assert_eq!(touched(&sb).len(), before.len());
    let image = sb.column(
        "SELECT json_extract(inputs, '$.resource.containers.main.image') FROM resource
         WHERE app = 'b' AND type = 'workload' ORDER BY res_id",
    );
    assert_eq!(image, ["web:1", "w"]);
    assert_eq!(
        sb.column("SELECT inputs FROM resource WHERE type = 'queue'"),
        ["{\"resource\":null,\"values\":{\"size\":\"b\"}}"]
    );
}

#[test]
fn an_app_a_killed_deployment_created_is_deleted_once_gone_from_the_tree() {
    let sb = three_apps();
    let driver = DriverServer::start();
    let config = http_driver_config(&sb, &driver, "30s", "");
    sb.write(
        "definitions/queue.yaml",
        &def("queue", "queue", "test/http", "      size: 1\n"),
    );
    sb.commit("A queue");
    // With the host's driver and the queue, then again: a no-op carries the census on.
    apply(&sb, &["--config", &config]).ok();
    apply(&sb, &["--config", &config])
        .ok()
        .stderr_has("0 changed, 3 as last deployed");
    sb.write("workloads/d/web.yaml", &workload("web:1"));
    sb.write("workloads/d/worker.yaml", WORKER_WITH_QUEUE);
    sb.commit("d, with a worker and its queue");
    // The queue's answer is slow: gitplane is killed once d's web workload is recorded, so d
    // has resources and never got a fingerprint.
    let mut child = apply_with_a_slow_queue(&sb, &driver, &config);
    gitplane_testkit::eventually("d's web workload recorded", Duration::from_secs(20), || {
        (sb.count(
            "SELECT COUNT(*) FROM resource WHERE app = 'd' AND type = 'workload'
             AND res_id = 'modules.web'",
        ) > 0)
            .then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM app_fingerprint WHERE app = 'd'"),
        0
    );

    // d leaves the tree before any deployment finished: it is found all the same, and its
    // resources go.
    driver.behave("queue", Behavior::default());
    sb.remove("workloads/d");
    sb.commit("d goes");
    apply(&sb, &["--config", &config])
        .ok()
        .stderr_has("1 changed, 3 as last deployed");
    assert_eq!(
        sb.column("SELECT DISTINCT app FROM resource WHERE app IS NOT NULL ORDER BY 1"),
        ["a", "b", "c"]
    );
}
