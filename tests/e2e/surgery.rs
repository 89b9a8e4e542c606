//! State surgery through the binary against a real HTTP driver: `state rm` forgets, `state
//! import` adopts, `state mv` keeps a renamed app's driver instances, `state unlock` frees only
//! a lock whose holder is gone, `state backup` copies a state a daemon is writing; each refused
//! while a deployment runs and recorded with its actor.

use std::collections::BTreeSet;
use std::time::Duration;

use gitplane_testkit::{Behavior, DriverServer, eventually};
use serde_json::json;

use crate::daemon::Daemon;
use crate::util::{Definition, Run, Sandbox, definitions, http_driver_config, open_db, rows};

/// A workload `w` in app `app` with a private postgres and the app's base-env, environment
/// `test`, all on the HTTP driver; neither definition reads the app's id, so a rename changes no input.
fn platform(sb: &Sandbox, server: &DriverServer, app: &str) {
    std::fs::write(
        sb.root.join("host.yaml"),
        format!(
            "{}retry: {{attempts: 3, initial_delay: 10ms, max_delay: 50ms, poll_interval: 10ms}}\n",
            http_driver_config(&server.url, "timeout: 10s")
        ),
    )
    .unwrap();
    sb.write("environments/test.yaml", "type: test\n");
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::http("base-env").value("zone: example.test"),
            Definition::http("workload").value("tier: web"),
            Definition::http("postgres").value("size: small"),
        ]),
    );
    sb.write(
        &format!("workloads/{app}/w.yaml"),
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: w\ncontainers:\n  main:\n    image: x\n    \
         variables:\n      DB: ${resources.db.name}\nresources:\n  db:\n    type: postgres\n",
    );
    sb.commit("An HTTP-driven platform");
}

/// `gitplane ARGS --config host.yaml --repo --state`.
fn gp(sb: &Sandbox, args: &[&str]) -> Run {
    let config = sb.root.join("host.yaml");
    let mut all = args.to_vec();
    all.extend(["--config", config.to_str().unwrap()]);
    sb.gitplane(&all)
}

/// `(app, type, res_id, guresid)` of every recorded resource.
fn recorded(sb: &Sandbox) -> BTreeSet<Vec<String>> {
    sb.rows("SELECT COALESCE(app, '-'), type, res_id, guresid FROM resource")
        .into_iter()
        .collect()
}

fn label_of(sb: &Sandbox, res_type: &str) -> String {
    sb.column(&format!(
        "SELECT COALESCE(app, '-') || '/' || type || '.' || class || '#' || res_id
         FROM resource WHERE type = '{res_type}'"
    ))
    .remove(0)
}

fn actions(sb: &Sandbox, command: &str) -> Vec<Vec<String>> {
    sb.rows(&format!(
        "SELECT actor, COALESCE(env, ''), detail FROM action WHERE command = '{command}'"
    ))
}

#[test]
fn state_mv_of_an_app_folder_rename_keeps_the_driver_instances() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    platform(&sb, &server, "a");
    gp(&sb, &["apply"]).ok();
    let before = recorded(&sb);
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(before.iter().all(|r| r[0] == "a"));
    let instances = server.instances();
    let creations = server.creations();
    let calls = server.received().len();

    sb.git(&["mv", "workloads/a", "workloads/b"]);
    sb.commit("Rename app a to b");
    let mv = gp(&sb, &["state", "mv", "a", "b", "--by", "alice"]).ok();
    mv.stdout_has("moved a/postgres.default#");

    // The resources are recorded under app b, at the GUResIDs a repository naming them b gives.
    let after = recorded(&sb);
    assert!(after.iter().all(|r| r[0] == "b"), "{after:?}");
    let kinds = |set: &BTreeSet<Vec<String>>| -> BTreeSet<(String, String)> {
        set.iter().map(|r| (r[1].clone(), r[2].clone())).collect()
    };
    assert_eq!(kinds(&before), kinds(&after));
    assert!(before.iter().all(|b| after.iter().all(|a| a[3] != b[3])));
    // Secrets, sealed for their place, moved with the resources and open there.
    let tokens =
        sb.unsealed("SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret");
    assert_eq!(tokens.len(), 3, "{tokens:?}");
    assert!(tokens.iter().all(|t| t.contains("tok-")), "{tokens:?}");
    let logged = actions(&sb, "state mv");
    assert_eq!(logged.len(), 3);
    assert!(logged.iter().all(|a| a[0] == "alice" && a[1] == "test"));

    let applied = gp(&sb, &["apply"]).ok();
    let d = sb.last_deployment("test");
    assert_eq!(d.status, "succeeded", "{applied}");
    let [created, updated, deleted, unchanged, _] = d.counts;
    assert_eq!(
        (created, updated, deleted, unchanged),
        (0, 0, 0, 3),
        "the renamed app is unchanged: {applied}"
    );
    let since: Vec<_> = server.received().into_iter().skip(calls).collect();
    assert!(
        since.iter().all(|r| r.method != "DELETE"),
        "no DELETE: {}",
        server.describe_calls()
    );
    assert!(
        since.is_empty(),
        "no PUT either (one to a new GUResID creates there): {}",
        server.describe_calls()
    );
    assert_eq!(server.instances(), instances);
    assert_eq!(server.creations(), creations);
    assert_eq!(recorded(&sb), after);
    let status = gp(&sb, &["status"]).ok();
    let rows: Vec<&str> = status
        .stdout
        .lines()
        .filter(|l| l.contains("modules.w"))
        .collect();
    assert_eq!(rows.len(), 2, "{status}");
    assert!(
        rows.iter().all(|l| l.trim_start().starts_with("b ")),
        "{status}"
    );
}

#[test]
fn state_mv_of_one_resource_renames_its_res_id_and_refuses_bad_targets() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    platform(&sb, &server, "a");
    gp(&sb, &["apply"]).ok();
    let db = label_of(&sb, "postgres");
    let before = recorded(&sb);

    // Bad targets change nothing.
    gp(&sb, &["state", "mv", &db, "a/redis.default#x"])
        .fails()
        .stderr_has("a move keeps the type and class (postgres.default)");
    gp(&sb, &["state", "mv", &db, "not-a-label/"])
        .fails()
        .stderr_has("not-a-label/: not a resource label");
    gp(
        &sb,
        &[
            "state",
            "mv",
            "a/postgres.default#nothing",
            "a/postgres.default#x",
        ],
    )
    .fails()
    .stderr_has("no recorded resource is a/postgres.default#nothing");
    gp(&sb, &["state", "mv", "nosuchapp", "b"])
        .fails()
        .stderr_has("no resource of app 'nosuchapp' is recorded");
    gp(&sb, &["state", "mv", &db, &db])
        .fails()
        .stderr_has("FROM and TO are the same");
    assert_eq!(recorded(&sb), before);

    gp(&sb, &["state", "mv", &db, "a/postgres.default#renamed"])
        .ok()
        .stdout_has("to a/postgres.default#renamed");
    let moved = sb.column("SELECT res_id FROM resource WHERE type = 'postgres'");
    assert_eq!(moved, vec!["renamed".to_owned()]);
    let new_id = gitplane::graph::GuresId::new("test", Some("a"), "postgres", "default", "renamed");
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM driver_cookie WHERE guresid = '{new_id}'"
        )),
        1,
        "the cookie moved with it"
    );
    assert_eq!(sb.count("SELECT COUNT(*) FROM driver_cookie"), 3);
}

#[test]
fn state_rm_forgets_without_a_driver_call_and_import_adopts_for_an_update() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    platform(&sb, &server, "a");
    gp(&sb, &["apply"]).ok();
    let db = label_of(&sb, "postgres");
    let guresid = sb.column("SELECT guresid FROM resource WHERE type = 'postgres'")[0].clone();
    let calls = server.received().len();

    let rm = gp(&sb, &["state", "rm", &db, "--by", "bob"]).ok();
    rm.stdout_has(&format!("forgot {db} ({guresid})"));
    assert_eq!(server.received().len(), calls, "rm calls no driver");
    assert_eq!(
        sb.count(&format!(
            "SELECT (SELECT COUNT(*) FROM resource WHERE guresid = '{guresid}')
                  + (SELECT COUNT(*) FROM resource_secret WHERE guresid = '{guresid}')
                  + (SELECT COUNT(*) FROM driver_cookie WHERE guresid = '{guresid}')"
        )),
        0
    );
    assert_eq!(actions(&sb, "state rm")[0][0], "bob");
    gp(&sb, &["state", "rm", &db])
        .fails()
        .stderr_has(&format!("no recorded resource is {db}"));

    // Bad input to import: each named, nothing recorded.
    let outputs = sb.root.join("outputs.json");
    let cookie = sb.root.join("cookie.txt");
    let (o, c) = (outputs.to_str().unwrap(), cookie.to_str().unwrap());
    std::fs::write(&outputs, "{not json").unwrap();
    gp(
        &sb,
        &["state", "import", &db, "--outputs", o, "--env", "test"],
    )
    .fails()
    .stderr_has(&format!("{o}: not JSON"));
    std::fs::write(&outputs, r#"{"values": {}, "extra": 1}"#).unwrap();
    gp(
        &sb,
        &["state", "import", &db, "--outputs", o, "--env", "test"],
    )
    .fails()
    .stderr_has("unknown key 'extra'");
    std::fs::write(
        &outputs,
        r#"{"values": {"name": "adopted-db"}, "secrets": {"token": "tok-adopted"}}"#,
    )
    .unwrap();
    std::fs::write(&cookie, "instance=adopted\n").unwrap();
    gp(&sb, &["state", "import", &db, "--outputs", o])
        .fails()
        .stderr_has("pass exactly one --env");
    gp(
        &sb,
        &[
            "state",
            "import",
            "a/postgres.default#nope",
            "--outputs",
            o,
            "--env",
            "test",
        ],
    )
    .fails()
    .stderr_has("a/postgres.default#nope is not in the graph of test");
    gp(
        &sb,
        &[
            "state",
            "import",
            &db,
            "--outputs",
            "/nonexistent.json",
            "--env",
            "test",
        ],
    )
    .fails()
    .stderr_has("/nonexistent.json: cannot read");
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 2);

    gp(
        &sb,
        &[
            "state",
            "import",
            &db,
            "--outputs",
            o,
            "--cookie",
            c,
            "--env",
            "test",
        ],
    )
    .ok()
    .stdout_has("the next apply updates it");
    assert_eq!(
        sb.outputs("test", db.rsplit('#').next().unwrap())["name"],
        "adopted-db"
    );
    gp(
        &sb,
        &["state", "import", &db, "--outputs", o, "--env", "test"],
    )
    .fails()
    .stderr_has(&format!("a resource is recorded under {guresid} already"));

    let plan = gp(&sb, &["plan", "--format", "json"]).ok();
    let summary = &plan.json()["summary"];
    assert_eq!(
        (&summary["create"], &summary["update"], &summary["delete"]),
        (&json!(0), &json!(1), &json!(0)),
        "an imported resource is updated, not created: {plan}"
    );
    gp(&sb, &["apply"]).ok();
    let d = sb.last_deployment("test");
    let [created, updated, deleted, ..] = d.counts;
    assert_eq!((created, updated, deleted), (0, 1, 0), "{d:?}");
    let puts: Vec<_> = server
        .received()
        .into_iter()
        .skip(calls)
        .filter(|r| r.guresid == guresid)
        .collect();
    assert_eq!(puts.len(), 1, "{}", server.describe_calls());
    assert_eq!(puts[0].method, "PUT");
    assert_eq!(puts[0].cookie.as_deref(), Some("instance=adopted"));
    assert_eq!(
        server.creations().get(&guresid),
        Some(&1),
        "never created again"
    );
}

/// A daemon deploying with a slow driver: the commit's deployment runs while the test acts.
fn slow_daemon(sb: &Sandbox, server: &DriverServer) -> Daemon {
    server.behave(
        "postgres",
        Behavior {
            delay: Duration::from_secs(4),
            ..Behavior::default()
        },
    );
    let config = sb.root.join("host.yaml");
    let args = [
        "--repo",
        sb.origin.to_str().unwrap(),
        "--state",
        sb.state.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ];
    let daemon = Daemon::start(sb, &args);
    assert!(
        server.wait_for_arrivals(1, Duration::from_secs(20)),
        "the deployment's first call"
    );
    daemon
}

#[test]
fn state_backup_while_a_daemon_deploys_is_sound_and_restores_its_resources() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    platform(&sb, &server, "a");
    for i in 0..6 {
        sb.write(
            &format!("workloads/app{i}/w.yaml"),
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: w\ncontainers:\n  main:\n    \
             image: x\nresources:\n  db:\n    type: postgres\n",
        );
    }
    sb.commit("More apps");
    let daemon = slow_daemon(&sb, &server);
    // Some resources recorded, the deployment still running: a backup now races its writes.
    eventually(
        "a resource recorded mid-deployment",
        Duration::from_secs(30),
        || (sb.state.exists() && sb.count("SELECT COUNT(*) FROM resource") > 0).then_some(()),
    );
    assert_eq!(sb.last_deployment("test").status, "running");

    // Refused while the deployment runs, naming its holder; the state is left as it was.
    let first = sb.column(
        "SELECT COALESCE(app, '-') || '/' || type || '.' || class || '#' || res_id FROM resource",
    );
    gp(&sb, &["state", "rm", &first[0]])
        .fails()
        .stderr_has("is applying to environment test");
    let app = sb.column("SELECT app FROM resource WHERE app IS NOT NULL")[0].clone();
    gp(&sb, &["state", "mv", &app, "b"])
        .fails()
        .stderr_has("is applying to environment test");
    gp(&sb, &["state", "unlock", "test"])
        .fails()
        .stderr_has("renewed");
    assert!(
        sb.column("SELECT DISTINCT app FROM resource")
            .iter()
            .all(|a| a != "b"),
        "nothing moved"
    );

    let mid = sb.root.join("mid.db");
    let taken = gp(&sb, &["state", "backup", mid.to_str().unwrap()]).ok();
    taken.stdout_has("integrity_check ok");
    let backup = open_db(&mid);
    let check = rows(&backup, "PRAGMA integrity_check");
    assert_eq!(check, vec![vec!["ok".to_owned()]]);
    let mode = rows(&backup, "PRAGMA journal_mode");
    assert_eq!(
        mode,
        vec![vec!["delete".to_owned()]],
        "a file that stands alone"
    );
    let running = rows(
        &backup,
        "SELECT status FROM deployment ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(running[0][0], "running", "taken mid-deployment");
    let in_backup: BTreeSet<Vec<String>> =
        rows(&backup, "SELECT guresid, status, outputs FROM resource")
            .into_iter()
            .collect();
    assert!(!in_backup.is_empty());
    drop(backup);
    // A backup never overwrites.
    gp(&sb, &["state", "backup", mid.to_str().unwrap()])
        .fails()
        .stderr_has("exists already");

    eventually("the deployment to finish", Duration::from_secs(60), || {
        (sb.last_deployment("test").status == "succeeded").then_some(())
    });
    let live: BTreeSet<Vec<String>> = sb
        .rows("SELECT guresid, status, outputs FROM resource")
        .into_iter()
        .collect();
    // What the backup recorded is what the live state recorded at its moment: a subset of the
    // finished deployment's resources, each as it was written.
    assert!(in_backup.is_subset(&live), "{in_backup:?} vs {live:?}");
    assert!(in_backup.len() < live.len(), "taken before the end");

    // Once the daemon is idle, a backup restores to exactly the live resources: `status`
    // reads it as a state, and it lists every one.
    let done = sb.root.join("done.db");
    gp(&sb, &["state", "backup", done.to_str().unwrap()]).ok();
    let restored: BTreeSet<Vec<String>> = rows(
        &open_db(&done),
        "SELECT guresid, status, outputs FROM resource",
    )
    .into_iter()
    .collect();
    assert_eq!(restored, live);
    let status = sb.gitplane_raw(
        &[
            "status",
            "--state",
            done.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[],
    );
    let status = status.ok();
    for r in sb.column("SELECT guresid FROM resource") {
        assert!(status.stdout.contains(&r), "{r} in {status}");
    }
    assert_eq!(actions(&sb, "state backup").len(), 2);
    drop(daemon);
}

#[test]
fn state_unlock_frees_only_a_lock_whose_holder_is_gone() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    platform(&sb, &server, "a");
    gp(&sb, &["apply"]).ok();
    gp(&sb, &["state", "unlock", "test"])
        .fails()
        .stderr_has("environment test is not locked");

    // A holder on this host whose process ended: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let host = rustix_hostname();
    sb.db()
        .execute(
            "INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at)
             VALUES ('test', 'stuck', ?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                     strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
            rusqlite::params![dead, host],
        )
        .unwrap();
    gp(&sb, &["state", "unlock", "test", "--by", "carol"])
        .ok()
        .stdout_has(&format!("released the lock of process {dead} on {host}"));
    assert_eq!(sb.count("SELECT COUNT(*) FROM env_lock"), 0);
    assert_eq!(actions(&sb, "state unlock")[0][0], "carol");

    // A live holder on this host (this test's own process) keeps its lock.
    sb.db()
        .execute(
            "INSERT INTO env_lock (env, holder, pid, host, acquired_at, renewed_at)
             VALUES ('test', 'alive', ?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                     strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
            rusqlite::params![std::process::id(), host],
        )
        .unwrap();
    gp(&sb, &["state", "unlock", "test"])
        .fails()
        .stderr_has(&format!(
            "another gitplane (process {} on {host}",
            std::process::id()
        ));
    assert_eq!(sb.count("SELECT COUNT(*) FROM env_lock"), 1);
}

fn rustix_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// On PostgreSQL `state backup` refuses and names the way there, `pg_dump`; `state mv` works
/// as on SQLite (the same SQL, the secrets sealed again by gitplane).
#[test]
fn on_postgresql_backup_names_pg_dump_and_mv_moves() {
    let Some(server) = gitplane_testkit::shared_or_skip("state surgery on PostgreSQL") else {
        return;
    };
    let url = server.database();
    let sb = Sandbox::template();
    let config = sb.root.join("pg.yaml");
    std::fs::write(
        &config,
        format!(
            "state_key: {{file: {}}}\n",
            sb.root.join("pg.key").display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([
            "--repo",
            sb.origin.to_str().unwrap(),
            "--state",
            &url,
            "--config",
            config.to_str().unwrap(),
        ]);
        sb.gitplane_raw(&all, &[])
    };
    run(&["apply"]).ok();
    let out = sb.root.join("pg-backup.db");
    run(&["state", "backup", out.to_str().unwrap()])
        .fails()
        .stderr_has("backed up with pg_dump");
    assert!(!out.exists(), "nothing written");
    sb.git(&["mv", "workloads/shop", "workloads/store"]);
    sb.commit("Rename app shop to store");
    run(&["state", "mv", "shop", "store", "--env", "development"])
        .ok()
        .stdout_has("development: moved shop/");
    let status = run(&["status", "--env", "development"]).ok();
    assert!(
        status
            .stdout
            .lines()
            .filter(|l| l.contains("modules."))
            .all(|l| l.trim_start().starts_with("store ")),
        "{status}"
    );
    let plan = run(&["plan", "--env", "development", "--format", "json"]).ok();
    let summary = &plan.json()["summary"];
    assert_eq!(
        (&summary["create"], &summary["delete"]),
        (&json!(0), &json!(0)),
        "the renamed app is neither created nor deleted: {plan}"
    );
}
