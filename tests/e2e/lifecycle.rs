//! Commits flowing through gitplane: create, update, delete, re-apply, revisions, init.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::util::{Sandbox, keys, open_db, rows, set};

const ENVS: [&str; 2] = ["development", "production"];

/// Every res_id the template gives the app `shop` in each environment.
fn template_res_ids() -> BTreeSet<String> {
    set([
        "base-env",
        "modules.backend",
        "modules.backend.externals.db",
        "modules.frontend",
        "modules.frontend.externals.dns",
        "shared.cache",
    ])
}

/// `guresid -> "type#res_id"` of a `graph --format json` object.
fn node_labels(graph: &Value) -> BTreeMap<String, String> {
    graph["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no nodes array: {graph}"))
        .iter()
        .map(|n| {
            (
                n["guresid"].as_str().unwrap().to_owned(),
                format!(
                    "{}#{}",
                    n["type"].as_str().unwrap(),
                    n["id"].as_str().unwrap()
                ),
            )
        })
        .collect()
}

/// `(from, to, kind)` of a `graph --format json` object, with GUResIDs.
fn graph_edges(graph: &Value) -> BTreeSet<(String, String, String)> {
    graph["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("no edges array: {graph}"))
        .iter()
        .map(|e| {
            (
                e["from"].as_str().unwrap().to_owned(),
                e["to"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn is_guresid(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

#[test]
fn first_apply_creates_every_resource() {
    let sb = Sandbox::template();
    let commit = sb.head();
    let run = sb.gitplane(&["apply"]).ok();
    for env in ENVS {
        run.stdout_has(&format!(
            "{env}: deployment {} succeeded: 6 created, 0 updated, 0 deleted, 0 unchanged, 0 failed",
            if env == "development" { 1 } else { 2 }
        ));
    }

    // Six ready resources per environment.
    assert_eq!(
        sb.rows("SELECT env, status, COUNT(*) FROM resource GROUP BY env, status ORDER BY env"),
        vec![
            vec!["development".to_owned(), "ready".into(), "6".into()],
            vec!["production".to_owned(), "ready".into(), "6".into()],
        ]
    );
    for env in ENVS {
        assert_eq!(sb.res_ids(env), template_res_ids(), "{env}");
    }
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM resource WHERE commit_id != '{commit}' OR error IS NOT NULL"
        )),
        0
    );

    // One succeeded deployment per environment.
    let deployments = sb.deployments_after(0);
    assert_eq!(deployments.len(), 2, "{deployments:?}");
    for (d, env) in deployments.iter().zip(ENVS) {
        assert_eq!(d.env, env);
        assert_eq!(d.commit, commit);
        assert_eq!(d.status, "succeeded");
        assert_eq!(d.counts, [6, 0, 0, 0, 0], "{d:?}");
        assert_eq!(d.error, None);
    }

    // Every operation is a succeeded create, one per resource.
    assert_eq!(
        sb.rows("SELECT action, status, COUNT(*) FROM operation GROUP BY action, status"),
        vec![vec!["create".to_owned(), "succeeded".into(), "12".into()]]
    );
    assert_eq!(
        sb.column("SELECT guresid FROM operation ORDER BY guresid"),
        sb.column("SELECT guresid FROM resource ORDER BY guresid"),
    );
    assert_eq!(
        sb.count(
            "SELECT COUNT(*) FROM operation o JOIN deployment d ON d.id = o.deployment_id \
             JOIN resource r ON r.guresid = o.guresid \
             WHERE r.env != d.env OR r.res_id != o.res_id OR r.type != o.type \
             OR o.finished_at IS NULL OR o.error IS NOT NULL"
        ),
        0
    );

    // The edge table holds the graph's edges.
    for env in ENVS {
        let graph = sb
            .gitplane(&["graph", "--env", env, "--format", "json"])
            .ok()
            .json()[0]
            .clone();
        let recorded: BTreeSet<(String, String, String)> = sb
            .rows(&format!(
                "SELECT from_guresid, to_guresid, kind FROM edge WHERE env = '{env}'"
            ))
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
            .collect();
        assert_eq!(recorded, graph_edges(&graph), "{env}");
        assert_eq!(recorded.len(), 7, "{env}");
    }

    // status --format json, one environment: an array of one.
    let status = sb
        .gitplane(&["status", "--env", "development", "--format", "json"])
        .ok()
        .json();
    assert_eq!(status.as_array().map(Vec::len), Some(1), "{status}");
    let status = status[0].clone();
    assert_eq!(
        keys(&status),
        BTreeSet::from(["env", "commit", "apps", "resources"])
    );
    assert_eq!(status["env"], "development");
    assert_eq!(status["commit"], commit.as_str());
    let resources = status["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 6);
    let recorded =
        sb.column("SELECT guresid FROM resource WHERE env = 'development' ORDER BY guresid");
    let mut listed: Vec<String> = Vec::new();
    for r in resources {
        assert_eq!(
            keys(r),
            BTreeSet::from([
                "guresid",
                "app",
                "type",
                "class",
                "id",
                "definition",
                "driver",
                "status",
                "outputs"
            ]),
            "{r}"
        );
        assert!(is_guresid(r["guresid"].as_str().unwrap()), "{r}");
        assert_eq!(r["app"], "shop");
        assert_eq!(r["class"], "default");
        assert_eq!(r["status"], "ready");
        assert_eq!(r["driver"], "humanitec/echo");
        assert!(r["outputs"].is_object(), "{r}");
        listed.push(r["guresid"].as_str().unwrap().to_owned());
    }
    listed.sort();
    assert_eq!(listed, recorded);

    // Outputs are what the echo driver got, placeholders resolved.
    assert_eq!(
        sb.outputs("development", "shared.cache"),
        serde_json::json!({"host": "redis.dev.internal", "port": 6379, "prefix": "shop:shared.cache"})
    );
    assert_eq!(
        sb.outputs("production", "modules.backend.externals.db"),
        serde_json::json!({"host": "pg-ha.prod.internal", "port": 5432, "name": "shop", "sslmode": "require"})
    );
    assert_eq!(
        sb.outputs("development", "modules.frontend.externals.dns"),
        serde_json::json!({"host": "shop.dev.shop.example.com"})
    );

    // Without --env: an array with both environments.
    let all = sb.gitplane(&["status", "--format", "json"]).ok().json();
    let all = all
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {all}"));
    assert_eq!(all.len(), 2);
    let envs: BTreeSet<&str> = all.iter().map(|s| s["env"].as_str().unwrap()).collect();
    assert_eq!(envs, BTreeSet::from(ENVS));
    for s in all {
        assert_eq!(s["commit"], commit.as_str());
        assert_eq!(s["resources"].as_array().unwrap().len(), 6);
    }
}

/// Applies the working clone's HEAD and returns the new deployment of each environment.
fn apply_change(sb: &Sandbox, message: &str) -> BTreeMap<String, crate::util::Deployment> {
    let before = sb.max_id("deployment");
    let commit = sb.commit(message);
    sb.gitplane(&["apply"]).ok();
    let new = sb.deployments_after(before);
    assert_eq!(new.len(), 2, "{new:?}");
    new.into_iter()
        .map(|d| {
            assert_eq!(d.commit, commit);
            assert_eq!(d.status, "succeeded", "{d:?}");
            (d.env.clone(), d)
        })
        .collect()
}

/// The res_ids a deployment updated (all operations must be succeeded updates).
fn updated(sb: &Sandbox, deployment: i64) -> BTreeSet<String> {
    sb.operations(deployment)
        .into_iter()
        .map(|(action, res_id, status)| {
            assert_eq!(
                (action.as_str(), status.as_str()),
                ("update", "succeeded"),
                "{res_id}"
            );
            res_id
        })
        .collect()
}

#[test]
fn a_changed_value_updates_exactly_its_dependents() {
    let sb = Sandbox::applied();
    let production_before =
        sb.rows("SELECT * FROM resource WHERE env = 'production' ORDER BY guresid");

    // redis_host is read by redis, and through the cache's host by both workloads.
    sb.edit(
        "definitions/base-env.yaml",
        "redis_host: redis.dev.internal",
        "redis_host: cache.dev.internal",
    );
    let d = apply_change(&sb, "Move the development cache");
    assert_eq!(
        d["development"].counts,
        [0, 4, 0, 2, 0],
        "{:?}",
        d["development"]
    );
    assert_eq!(
        updated(&sb, d["development"].id),
        set([
            "base-env",
            "shared.cache",
            "modules.backend",
            "modules.frontend"
        ])
    );
    assert_eq!(d["production"].counts, [0, 0, 0, 6, 0]);
    assert!(sb.operations(d["production"].id).is_empty());
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), 4);
    assert_eq!(
        sb.outputs("development", "shared.cache")["host"],
        "cache.dev.internal"
    );
    assert_eq!(
        sb.rows("SELECT * FROM resource WHERE env = 'production' ORDER BY guresid"),
        production_before
    );

    // pgport is read by postgres, and through the database's port by the backend only.
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal\n      pgport: 5432",
        "pghost: pg.dev.internal\n      pgport: 5433",
    );
    let d = apply_change(&sb, "New development database port");
    assert_eq!(
        d["development"].counts,
        [0, 3, 0, 3, 0],
        "{:?}",
        d["development"]
    );
    assert_eq!(
        updated(&sb, d["development"].id),
        set([
            "base-env",
            "modules.backend.externals.db",
            "modules.backend"
        ])
    );
    assert_eq!(d["production"].counts, [0, 0, 0, 6, 0]);
    assert!(sb.operations(d["production"].id).is_empty());
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), 6);
    assert_eq!(
        sb.outputs("development", "modules.backend.externals.db")["port"],
        5433,
        "a whole-string placeholder keeps the number type"
    );
    assert_eq!(
        sb.rows("SELECT * FROM resource WHERE env = 'production' ORDER BY guresid"),
        production_before
    );

    // A value nobody reads changes only the resource that holds it.
    sb.edit(
        "definitions/dns.yaml",
        "    values:\n",
        "    values:\n      ttl: 300\n",
    );
    let d = apply_change(&sb, "DNS ttl");
    for env in ENVS {
        assert_eq!(d[env].counts, [0, 1, 0, 5, 0], "{env}");
        assert_eq!(
            updated(&sb, d[env].id),
            set(["modules.frontend.externals.dns"])
        );
    }
}

#[test]
fn removing_a_workload_deletes_its_private_resources_in_reverse_order() {
    let sb = Sandbox::applied();
    let backend_rows = |sb: &Sandbox| {
        sb.rows(
            "SELECT * FROM resource WHERE res_id IN ('base-env', 'shared.cache', \
             'modules.backend', 'modules.backend.externals.db') ORDER BY guresid",
        )
    };
    let kept = backend_rows(&sb);
    let frontend_ids =
        sb.column("SELECT guresid FROM resource WHERE res_id LIKE 'modules.frontend%'");
    assert_eq!(frontend_ids.len(), 4);

    sb.remove("workloads/shop/frontend.yaml");
    let d = apply_change(&sb, "Retire the frontend");
    for env in ENVS {
        assert_eq!(d[env].counts, [0, 0, 2, 4, 0], "{env}: {:?}", d[env]);
        // The workload goes first: it depends on the dns.
        assert_eq!(
            sb.operations(d[env].id),
            vec![
                (
                    "delete".to_owned(),
                    "modules.frontend".to_owned(),
                    "succeeded".to_owned()
                ),
                (
                    "delete".to_owned(),
                    "modules.frontend.externals.dns".to_owned(),
                    "succeeded".to_owned()
                ),
            ],
            "{env}"
        );
        assert_eq!(
            sb.res_ids(env),
            set([
                "base-env",
                "modules.backend",
                "modules.backend.externals.db",
                "shared.cache"
            ]),
            "{env}: the shared cache is still used by the backend"
        );
    }
    assert_eq!(backend_rows(&sb), kept, "what stays is untouched");
    for id in &frontend_ids {
        assert_eq!(
            sb.count(&format!(
                "SELECT COUNT(*) FROM edge WHERE from_guresid = '{id}' OR to_guresid = '{id}'"
            )),
            0,
            "edges of deleted {id}"
        );
    }
    assert_eq!(sb.count("SELECT COUNT(*) FROM edge"), 8);

    // The last workload goes: that would empty both environments, so the deletion guard holds
    // the commit and nothing changes.
    sb.remove("workloads/shop/backend.yaml");
    let before = sb.max_id("deployment");
    let resources = sb.resource_rows();
    sb.commit("Retire the shop");
    let run = sb.gitplane(&["apply"]).fails();
    run.stdout_has("held by the deletion guard: it would delete all 4 resources");
    let held = sb.deployments_after(before);
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.iter().all(|d| d.status == "held"), "{held:?}");
    assert_eq!(
        sb.resource_rows(),
        resources,
        "a held commit changes nothing"
    );
    let history = sb.gitplane(&["history", "--format", "json"]).ok().json();
    let newest = &history[0];
    assert_eq!(newest["status"], "held");
    assert_eq!(newest["held"].as_array().unwrap().len(), 4);

    // Approving releases each: the whole app goes, base-env last.
    for d in &held {
        let id = d.id.to_string();
        sb.gitplane(&["approve", "--yes", &id]).ok();
        let d = sb
            .deployments_after(before)
            .into_iter()
            .find(|x| x.id == d.id)
            .unwrap();
        let env = d.env.as_str();
        assert_eq!(d.status, "succeeded", "{d:?}");
        assert_eq!(d.counts, [0, 0, 4, 0, 0], "{env}: {d:?}");
        let ops = sb.operations(d.id);
        let order: Vec<&str> = ops.iter().map(|(_, r, _)| r.as_str()).collect();
        assert!(
            ops.iter()
                .all(|(a, _, s)| a == "delete" && s == "succeeded"),
            "{ops:?}"
        );
        assert_eq!(order.len(), 4, "{ops:?}");
        assert_eq!(order[0], "modules.backend", "{env}: {ops:?}");
        assert_eq!(
            order[1..3].iter().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from(["modules.backend.externals.db", "shared.cache"]),
            "{env}: {ops:?}"
        );
        assert_eq!(order[3], "base-env", "{env}: {ops:?}");
    }
    sb.gitplane(&["approve", "--yes", &held[0].id.to_string()])
        .fails()
        .stderr_has("is not held");
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 0);
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource_secret"), 0);
    assert_eq!(sb.count("SELECT COUNT(*) FROM edge"), 0);
}

#[test]
fn reapplying_a_commit_changes_nothing() {
    let sb = Sandbox::applied();
    let resources = sb.resource_rows();
    let secrets = sb.rows("SELECT * FROM resource_secret ORDER BY guresid");
    let edges = sb.edge_rows();
    let ops = sb.max_id("operation");

    let before = sb.max_id("deployment");
    let run = sb.gitplane(&["apply"]).ok();
    run.stdout_has("0 created, 0 updated, 0 deleted, 6 unchanged, 0 failed");
    let new = sb.deployments_after(before);
    assert_eq!(new.len(), 2, "{new:?}");
    for d in &new {
        assert_eq!(d.status, "succeeded");
        assert_eq!(d.counts, [0, 0, 0, 6, 0], "{d:?}");
        assert!(sb.operations(d.id).is_empty());
    }
    assert_eq!(sb.max_id("operation"), ops);
    assert_eq!(
        sb.resource_rows(),
        resources,
        "outputs, hashes and times stay"
    );
    assert_eq!(
        sb.rows("SELECT * FROM resource_secret ORDER BY guresid"),
        secrets
    );
    assert_eq!(sb.edge_rows(), edges);

    // The plan agrees: nothing to do, and planning records nothing. The app is as last
    // deployed (same files, same definitions), so it is not even read: no step is listed.
    let plan = sb.gitplane(&["plan", "--format", "steps-json"]).ok().json();
    let plans = plan
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {plan}"));
    assert_eq!(plans.len(), 2);
    for p in plans {
        assert_eq!(p["commit"], sb.head().as_str());
        assert_eq!(p["steps"], serde_json::json!([]), "{p}");
        assert_eq!(p["unchanged_apps"], 1, "{p}");
        assert_eq!(p["unchanged_resources"], 6, "{p}");
    }
    let one = sb
        .gitplane(&["plan", "--env", "production", "--format", "steps-json"])
        .ok()
        .json()[0]
        .clone();
    assert_eq!(one["env"], "production");
    let table = sb.gitplane(&["plan"]).ok();
    table.stdout_has("0 to create, 0 to update, 0 may update, 0 pinned, 6 unchanged, 0 to delete");
    assert_eq!(sb.max_id("deployment"), before + 2);
    assert_eq!(sb.resource_rows(), resources);
}

#[test]
fn plan_shows_what_a_change_would_do_and_changes_nothing() {
    let sb = Sandbox::template();
    // Planning never creates a state file.
    let plan = sb
        .gitplane(&["plan", "--env", "development", "--format", "steps-json"])
        .ok()
        .json()[0]
        .clone();
    assert!(!sb.state.exists(), "plan created {}", sb.state.display());
    let steps = plan["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6);
    assert!(steps.iter().all(|s| s["action"] == "create"), "{plan}");
    sb.gitplane(&["validate"]).ok();
    assert!(
        !sb.state.exists(),
        "validate created {}",
        sb.state.display()
    );

    sb.gitplane(&["apply"]).ok();
    let resources = sb.resource_rows();
    let deployments = sb.max_id("deployment");
    sb.remove("workloads/shop/frontend.yaml");
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal",
        "pghost: pg2.dev.internal",
    );
    sb.commit("Change and remove");
    let plan = sb
        .gitplane(&["plan", "--env", "development", "--format", "steps-json"])
        .ok()
        .json()[0]
        .clone();
    let actions: BTreeMap<String, String> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(actions["base-env"], "update", "{plan}");
    assert_eq!(actions["modules.frontend"], "delete", "{plan}");
    assert_eq!(
        actions["modules.frontend.externals.dns"], "delete",
        "{plan}"
    );
    // What reads base-env's outputs may change: the plan cannot know before apply.
    for id in [
        "modules.backend.externals.db",
        "shared.cache",
        "modules.backend",
    ] {
        assert_eq!(actions[id], "update?", "{id}: {plan}");
    }
    assert_eq!(actions.len(), 6, "{plan}");
    assert_eq!(sb.resource_rows(), resources);
    assert_eq!(sb.max_id("deployment"), deployments);
}

#[test]
fn rev_selects_commit_by_id_branch_and_tag_in_bare_and_normal_repositories() {
    let sb = Sandbox::template();
    let first = sb.head();
    sb.git(&["tag", "v1"]);
    sb.git(&["push", "--quiet", "--tags", "origin"]);
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal\n      pgport: 5432",
        "pghost: pg.dev.internal\n      pgport: 5433",
    );
    let second = sb.commit("New port");
    assert_ne!(first, second);

    let check = |repo: &std::path::Path,
                 state: &std::path::Path,
                 rev: Option<&str>,
                 commit: &str,
                 port: i64| {
        let (repo, state) = (repo.to_str().unwrap(), state.to_str().unwrap());
        let mut args = vec!["apply", "--repo", repo, "--state", state];
        if let Some(rev) = rev {
            args.extend(["--rev", rev]);
        }
        sb.gitplane_raw(&args, &[]).ok();
        let status = sb
            .gitplane_raw(
                &[
                    "status",
                    "--env",
                    "development",
                    "--format",
                    "json",
                    "--state",
                    state,
                ],
                &[],
            )
            .ok()
            .json();
        assert_eq!(status[0]["commit"], commit, "--rev {rev:?} in {repo}");
        let conn = open_db(std::path::Path::new(state));
        // Each apply here changes the database port, so postgres was provisioned from `commit`.
        assert_eq!(
            rows(
                &conn,
                "SELECT commit_id, json_extract(outputs, '$.port') FROM resource \
                 WHERE env = 'development' AND type = 'postgres'"
            ),
            vec![vec![commit.to_owned(), port.to_string()]],
            "--rev {rev:?} in {repo}"
        );
    };

    // The bare repository users push to.
    check(&sb.origin, &sb.state, Some(&first), &first, 5432);
    check(&sb.origin, &sb.state, Some("main"), &second, 5433);
    check(&sb.origin, &sb.state, Some("v1"), &first, 5432);
    check(&sb.origin, &sb.state, None, &second, 5433);
    check(&sb.origin, &sb.state, Some(&first[..10]), &first, 5432);

    // A normal clone, and a folder inside it.
    let state = sb.root.join("clone-state.db");
    check(&sb.work, &state, Some("v1"), &first, 5432);
    check(&sb.work, &state, Some("main"), &second, 5433);
    check(&sb.work, &state, Some(&first), &first, 5432);
    check(&sb.work, &state, None, &second, 5433);
    check(
        &sb.work.join("definitions"),
        &state,
        Some("v1"),
        &first,
        5432,
    );

    // A revision that does not exist is an error that names it.
    let run = sb.gitplane(&["apply", "--rev", "no-such-branch"]).fails();
    run.stderr_has("no-such-branch");
}

#[test]
fn init_makes_a_committed_valid_repository() {
    let sb = Sandbox::new();
    let dir = sb.root.join("platform");
    let run = sb.gitplane_raw(&["init", dir.to_str().unwrap()], &[]).ok();
    run.stdout_has(&dir.display().to_string());
    let log = sb.git_in(&dir, &["log", "--oneline"]);
    assert_eq!(log.lines().count(), 1, "{log}");
    assert_eq!(
        sb.git_in(&dir, &["status", "--porcelain"]),
        "",
        "everything is committed"
    );
    let files = sb.git_in(&dir, &["ls-files"]);
    for f in [
        "environments/development.yaml",
        "definitions/base-env.yaml",
        "workloads/shop/backend.yaml",
    ] {
        assert!(files.lines().any(|l| l == f), "{f} not committed:\n{files}");
    }
    let state = sb.root.join("init-state.db");
    let run = sb
        .gitplane_raw(
            &[
                "validate",
                "--repo",
                dir.to_str().unwrap(),
                "--state",
                state.to_str().unwrap(),
            ],
            &[],
        )
        .ok();
    run.stdout_has("is valid");
    run.stdout_has("development (6 resources, 7 edges)");
    run.stdout_has("production (6 resources, 7 edges)");

    // A folder that is not empty is refused.
    let run = sb
        .gitplane_raw(&["init", dir.to_str().unwrap()], &[])
        .fails();
    run.stderr_has("not empty");
}

#[test]
fn quickstart_applies_the_template() {
    let sb = Sandbox::new();
    let dir = sb.root.join("qs");
    let run = sb
        .gitplane_raw(&["quickstart", dir.to_str().unwrap()], &[])
        .ok();
    let state = dir.join("gitplane.db");
    run.stdout_has(&format!("State: {}", state.display()));
    let conn = open_db(&state);
    assert_eq!(
        rows(
            &conn,
            "SELECT COUNT(*) FROM resource WHERE status = 'ready'"
        ),
        vec![vec!["12".to_owned()]]
    );
    assert_eq!(
        rows(
            &conn,
            "SELECT COUNT(*) FROM deployment WHERE status = 'succeeded'"
        ),
        vec![vec!["2".to_owned()]]
    );
}

#[test]
fn template_graph() {
    let sb = Sandbox::template();
    let commit = sb.head();
    let expected_nodes = |env: &str| -> BTreeMap<String, String> {
        let (base, pg) = if env == "development" {
            ("base-env-development", "postgres-dev")
        } else {
            ("base-env-production", "postgres-prod")
        };
        [
            ("base-env#base-env", base),
            ("workload#modules.backend", "workload"),
            ("workload#modules.frontend", "workload"),
            ("postgres#modules.backend.externals.db", pg),
            ("redis#shared.cache", "redis"),
            ("dns#modules.frontend.externals.dns", "dns"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    };
    let expected_edges: BTreeSet<(String, String, String)> = [
        ("dns#modules.frontend.externals.dns", "base-env#base-env"),
        ("postgres#modules.backend.externals.db", "base-env#base-env"),
        ("redis#shared.cache", "base-env#base-env"),
        (
            "workload#modules.backend",
            "postgres#modules.backend.externals.db",
        ),
        ("workload#modules.backend", "redis#shared.cache"),
        (
            "workload#modules.frontend",
            "dns#modules.frontend.externals.dns",
        ),
        ("workload#modules.frontend", "redis#shared.cache"),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_owned(), t.to_owned(), "reference".to_owned()))
    .collect();

    let mut all_ids = BTreeSet::new();
    for env in ENVS {
        let graph = sb
            .gitplane(&["graph", "--env", env, "--format", "json"])
            .ok()
            .json()[0]
            .clone();
        assert_eq!(
            keys(&graph),
            BTreeSet::from(["env", "commit", "nodes", "edges"])
        );
        assert_eq!(graph["env"], env);
        assert_eq!(graph["commit"], commit.as_str());
        let nodes = graph["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 6, "{graph}");
        let mut definitions = BTreeMap::new();
        for n in nodes {
            assert_eq!(
                keys(n),
                BTreeSet::from([
                    "guresid",
                    "app",
                    "type",
                    "class",
                    "id",
                    "definition",
                    "driver"
                ]),
                "{n}"
            );
            let id = n["guresid"].as_str().unwrap();
            assert!(is_guresid(id), "{n}");
            assert!(all_ids.insert(id.to_owned()), "GUResID {id} used twice");
            assert_eq!(n["app"], "shop", "{n}");
            assert_eq!(n["class"], "default", "{n}");
            assert_eq!(n["driver"], "humanitec/echo", "{n}");
            definitions.insert(
                format!(
                    "{}#{}",
                    n["type"].as_str().unwrap(),
                    n["id"].as_str().unwrap()
                ),
                n["definition"].as_str().unwrap().to_owned(),
            );
        }
        assert_eq!(definitions, expected_nodes(env), "{env}");

        let labels = node_labels(&graph);
        for e in graph["edges"].as_array().unwrap() {
            assert_eq!(keys(e), BTreeSet::from(["from", "to", "kind"]), "{e}");
        }
        let edges: BTreeSet<(String, String, String)> = graph_edges(&graph)
            .into_iter()
            .map(|(f, t, k)| (labels[&f].clone(), labels[&t].clone(), k))
            .collect();
        assert_eq!(edges, expected_edges, "{env}");
    }

    // Without --env: both graphs in an array.
    let both = sb.gitplane(&["graph", "--format", "json"]).ok().json();
    assert_eq!(both.as_array().map(Vec::len), Some(2), "{both}");

    // The GUResIDs of the graph are the ones recorded, and stay across applies.
    sb.gitplane(&["apply"]).ok();
    let recorded: BTreeSet<String> = sb
        .column("SELECT guresid FROM resource")
        .into_iter()
        .collect();
    assert_eq!(recorded, all_ids);

    // A resource deleted and created again gets its GUResID back.
    sb.remove("workloads/shop/frontend.yaml");
    sb.commit("Without frontend");
    sb.gitplane(&["apply"]).ok();
    sb.git(&["revert", "--no-edit", "HEAD"]);
    sb.git(&["push", "--quiet", "origin", "main"]);
    sb.gitplane(&["apply"]).ok();
    let recorded: BTreeSet<String> = sb
        .column("SELECT guresid FROM resource")
        .into_iter()
        .collect();
    assert_eq!(recorded, all_ids);
}

#[test]
fn graph_table_names_resources_and_edges() {
    let sb = Sandbox::template();
    let run = sb.gitplane(&["graph", "--env", "development"]).ok();
    run.stdout_has("development @ ");
    run.stdout_has("6 resources, 7 edges");
    run.stdout_has("shop/workload.default#modules.frontend");
    run.stdout_has("postgres-dev");
}

#[test]
fn apply_env_applies_one_environment() {
    let sb = Sandbox::template();
    sb.gitplane(&["apply", "--env", "production"]).ok();
    let deployments = sb.deployments_after(0);
    assert_eq!(deployments.len(), 1, "{deployments:?}");
    assert_eq!(deployments[0].env, "production");
    assert_eq!(sb.res_ids("production"), template_res_ids());
    assert!(sb.res_ids("development").is_empty());
    let status = sb.gitplane(&["status", "--format", "json"]).ok().json();
    assert_eq!(status[0]["env"], "production", "{status}");
}

#[test]
fn a_failed_resource_holds_back_deletions() {
    let sb = Sandbox::applied();
    let frontend =
        sb.rows("SELECT guresid, env, app, type, class, res_id, definition, driver, status, inputs_hash, outputs, inputs, commit_id, deployment_id, updated_at FROM resource WHERE res_id LIKE 'modules.frontend%' ORDER BY guresid");
    sb.remove("workloads/shop/frontend.yaml");
    // Values may not read a secret output: this fails when postgres is provisioned.
    sb.edit(
        "definitions/postgres.yaml",
        "      name: ${context.app.id}_${context.env.id}\n",
        "      name: ${context.app.id}_${context.env.id}\n      \
         pw: ${resources.base-env#base-env.outputs.pgpassword}\n",
    );
    let before = sb.max_id("deployment");
    let bad = sb.commit("Remove the frontend, break the database");
    let run = sb.gitplane(&["apply"]).fails();
    run.stderr_has("move it under driver_inputs.secrets");
    let new = sb.deployments_after(before);
    let dev = new.iter().find(|d| d.env == "development").unwrap();
    let prod = new.iter().find(|d| d.env == "production").unwrap();
    assert_eq!(dev.status, "failed", "{dev:?}");
    assert_eq!(dev.commit, bad);
    assert!(
        dev.error.as_deref().unwrap_or("").contains("pgpassword"),
        "{dev:?}"
    );
    assert_eq!(prod.status, "succeeded", "{prod:?}");
    assert_eq!(prod.counts, [0, 0, 2, 4, 0], "{prod:?}");

    // In development nothing was deleted: the deletions wait for a good apply.
    let ops = sb.operations(dev.id);
    assert!(
        ops.contains(&(
            "update".to_owned(),
            "modules.backend.externals.db".to_owned(),
            "failed".to_owned()
        )),
        "{ops:?}"
    );
    for id in ["modules.frontend", "modules.frontend.externals.dns"] {
        assert!(
            ops.contains(&("delete".to_owned(), id.to_owned(), "skipped".to_owned())),
            "{id}: {ops:?}"
        );
    }
    assert_eq!(
        sb.rows("SELECT guresid, env, app, type, class, res_id, definition, driver, status, inputs_hash, outputs, inputs, commit_id, deployment_id, updated_at FROM resource WHERE res_id LIKE 'modules.frontend%' AND env = 'development' ORDER BY guresid"),
        frontend.iter().filter(|r| r[1] == "development").cloned().collect::<Vec<_>>()
    );
    // They are kept as orphans, and say why.
    assert_eq!(
        sb.rows(
            "SELECT res_id, orphan_reason FROM orphans WHERE env = 'development' ORDER BY res_id"
        ),
        [
            [
                "modules.frontend",
                "held back: 2 resource(s) failed in this deployment, and deleting now could remove what they still need"
            ],
            [
                "modules.frontend.externals.dns",
                "held back: 2 resource(s) failed in this deployment, and deleting now could remove what they still need"
            ],
        ]
    );

    // The fix goes in: the held-back deletions run, in order.
    sb.edit(
        "definitions/postgres.yaml",
        "      pw: ${resources.base-env#base-env.outputs.pgpassword}\n",
        "",
    );
    sb.commit("Fix the database");
    sb.gitplane(&["apply"]).ok();
    let dev = sb.last_deployment("development");
    assert_eq!(dev.status, "succeeded", "{dev:?}");
    assert_eq!(
        sb.operations(dev.id),
        vec![
            (
                "delete".to_owned(),
                "modules.frontend".to_owned(),
                "succeeded".to_owned()
            ),
            (
                "delete".to_owned(),
                "modules.frontend.externals.dns".to_owned(),
                "succeeded".to_owned()
            ),
        ]
    );
    assert_eq!(
        sb.res_ids("development"),
        set([
            "base-env",
            "modules.backend",
            "modules.backend.externals.db",
            "shared.cache"
        ])
    );
}

#[test]
fn repository_settings_give_every_environment_its_defaults() {
    let sb = Sandbox::applied();
    // A stricter deletion guard for every environment, except where an environment says.
    sb.write(
        "gitplane.yaml",
        "environment_defaults:\n  deletion_guard: {threshold: 10}\n",
    );
    sb.edit(
        "environments/production.yaml",
        "type: production\n",
        "type: production\ndeletion_guard: {threshold: 60}\n",
    );
    sb.remove("workloads/shop/frontend.yaml");
    sb.commit("Retire the frontend under a strict guard");
    let run = sb.gitplane(&["apply"]).fails();
    run.stdout_has("development: deployment")
        .stdout_has("held by the deletion guard");
    assert_eq!(sb.last_deployment("development").status, "held");
    assert_eq!(sb.last_deployment("production").status, "succeeded");
    assert!(!sb.res_ids("development").is_empty());
    assert!(
        !sb.res_ids("production").contains("modules.frontend"),
        "{:?}",
        sb.res_ids("production")
    );
}
