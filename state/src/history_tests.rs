//! Tests of history as ranges: the migration from per-deployment copies, the views that answer
//! "what did deployment D look like" and "what changed in commit C", and pruning.

use rusqlite::Connection;

use crate::db::params;
use serde_json::json;

use crate::*;

fn link(consumer: &str, provider: &str) -> LinkRecord {
    LinkRecord {
        consumer: consumer.into(),
        provider: provider.into(),
        kind: "reference".into(),
        update_type: "NeedsProvides".into(),
    }
}

fn binding(needed: &str, provided: &str, value: serde_json::Value) -> BindingRecord {
    BindingRecord {
        needed: needed.into(),
        needed_path: "values.host".into(),
        provided: provided.into(),
        provided_path: "outputs.host".into(),
        data_type: "string".into(),
        value: Some(value),
        secret: false,
        inserted: false,
        interface: None,
    }
}

fn record(guresid: &str, outputs: serde_json::Value) -> ResourceRecord {
    ResourceRecord {
        guresid: guresid.into(),
        env: "dev".into(),
        res_id: format!("modules.{guresid}"),
        inputs_hash: "h".into(),
        outputs,
        secret_outputs: json!({}),
        inputs: StoredJson::default(),
        secret_inputs: StoredJson::default(),
        commit_id: "c".into(),
        ..crate::tests::record(guresid)
    }
}

/// Rows of one query, each as text joined by spaces.
fn rows(store: &Store, sql: &str) -> Vec<String> {
    let table = store.conn.table(sql, crate::db::params![]).unwrap();
    table
        .rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|c| match c {
                    crate::db::Cell::Null => "NULL".to_owned(),
                    crate::db::Cell::Int(v) => v.to_string(),
                    crate::db::Cell::Real(v) => v.to_string(),
                    crate::db::Cell::Text(t) => t.clone(),
                    crate::db::Cell::Blob(_) => "<blob>".to_owned(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// A deployment that puts `records` and makes its links and bindings exactly these.
fn deploy(
    store: &mut Store,
    commit: &str,
    records: &[ResourceRecord],
    links: &[LinkRecord],
    bindings: &[(&str, Vec<BindingRecord>)],
) -> i64 {
    let bound = store.bound("dev").unwrap();
    let bindings: Vec<(&str, bool, Vec<BindingRecord>)> = bindings
        .iter()
        .map(|(g, b)| (*g, bound.contains(*g), b.clone()))
        .collect();
    let (d, _) = store
        .begin_or_resume_deployment("dev", commit, false, 50.0)
        .unwrap();
    for r in records {
        let op = store
            .begin_operation(&OperationStart {
                deployment: d,
                guresid: &r.guresid,
                app: r.app.as_deref(),
                res_type: &r.res_type,
                class: &r.class,
                res_id: &r.res_id,
                action: "update",
                reason: "test",
            })
            .unwrap();
        store.finish_put(op, 1, d, r, Some(true)).unwrap();
    }
    let current = store.links("dev").unwrap();
    store
        .record_link_changes(d, "dev", &LinkChanges::between(&current, links.to_vec()))
        .unwrap();
    store.record_bindings(d, "dev", &bindings).unwrap();
    store
        .finish_deployment(d, DeploymentStatus::Succeeded, &Counts::default(), None)
        .unwrap();
    d
}

#[test]
fn a_deployment_that_changes_nothing_writes_only_its_record() {
    crate::tests::each_backend(|mut store| {
        let a = record("a", json!({"host": "db1"}));
        let links = [link("w", "a")];
        let first = deploy(
            &mut store,
            "c1",
            std::slice::from_ref(&a),
            &links,
            &[("w", vec![binding("w", "a", json!("db1"))])],
        );
        let count = |store: &Store| {
            rows(
                store,
                "SELECT (SELECT COUNT(*) FROM link), (SELECT COUNT(*) FROM binding),
                        (SELECT COUNT(*) FROM resource_versions)",
            )
        };
        let before = count(&store);
        // The same resource put again (a drift run), the same links and bindings.
        let second = deploy(
            &mut store,
            "c1",
            std::slice::from_ref(&a),
            &links,
            &[("w", vec![binding("w", "a", json!("db1"))])],
        );
        assert_eq!(count(&store), before);
        assert_eq!(before, ["1 1 1"]);
        // Both deployments see the same links.
        for d in [first, second] {
            assert_eq!(
                rows(
                    &store,
                    &format!(
                        "SELECT consumer, provider FROM deployment_links WHERE deployment_id = {d}"
                    )
                ),
                ["w a"]
            );
        }
    });
}

#[test]
fn history_views_answer_what_each_deployment_looked_like_and_what_it_changed() {
    crate::tests::each_backend(|mut store| {
        let d1 = deploy(
            &mut store,
            "c1",
            &[record("a", json!({"host": "db1"})), record("b", json!({}))],
            &[link("w", "a"), link("w", "b")],
            &[("w", vec![binding("w", "a", json!("db1"))])],
        );
        // c2: a's output changes (a new version and a new binding value), the link to b goes.
        let d2 = deploy(
            &mut store,
            "c2",
            &[record("a", json!({"host": "db2"}))],
            &[link("w", "a")],
            &[("w", vec![binding("w", "a", json!("db2"))])],
        );
        // c3: b is deleted.
        let (d3, _) = store
            .begin_or_resume_deployment("dev", "c3", false, 50.0)
            .unwrap();
        let op = store
            .begin_operation(&OperationStart {
                deployment: d3,
                guresid: "b",
                app: Some("shop"),
                res_type: "postgres",
                class: "default",
                res_id: "modules.b",
                action: "delete",
                reason: "gone",
            })
            .unwrap();
        store.finish_delete(op, 1, d3, ("dev", "b"), None).unwrap();

        let at = |d: i64, view: &str, cols: &str| {
            rows(
                &store,
                &format!("SELECT {cols} FROM {view} WHERE deployment_id = {d} ORDER BY 1, 2"),
            )
        };
        assert_eq!(
            at(d1, "deployment_links", "consumer, provider"),
            ["w a", "w b"]
        );
        assert_eq!(at(d2, "deployment_links", "consumer, provider"), ["w a"]);
        assert_eq!(
            at(d1, "deployment_bindings", "needed_guresid, value"),
            ["w \"db1\""]
        );
        assert_eq!(
            at(d2, "deployment_bindings", "needed_guresid, value"),
            ["w \"db2\""]
        );
        assert_eq!(
            at(d1, "deployment_resources", "guresid, outputs"),
            ["a {\"host\":\"db1\"}", "b {}"]
        );
        assert_eq!(
            at(d2, "deployment_resources", "guresid, outputs"),
            ["a {\"host\":\"db2\"}", "b {}"]
        );
        assert_eq!(
            at(d3, "deployment_resources", "guresid, outputs"),
            ["a {\"host\":\"db2\"}"]
        );
        let changed = |commit: &str| {
            rows(
                &store,
                &format!(
                    "SELECT what, change, subject, COALESCE(CAST(other AS TEXT), '-') FROM changes
                     WHERE commit_id = '{commit}' ORDER BY 1, 2, 3, 4"
                ),
            )
        };
        assert_eq!(
            changed("c1"),
            [
                "binding added w a",
                "link added w a",
                "link added w b",
                "resource created a -",
                "resource created b -"
            ]
        );
        assert_eq!(
            changed("c2"),
            [
                "binding added w a",
                "binding removed w a",
                "link removed w b",
                "resource updated a -"
            ]
        );
        assert_eq!(changed("c3"), ["resource deleted b -"]);
    });
}

#[test]
fn bindings_that_stay_keep_their_rows() {
    crate::tests::each_backend(|mut store| {
        let port = |v: i64| BindingRecord {
            needed_path: "values.port".into(),
            data_type: "int".into(),
            ..binding("w", "a", json!(v))
        };
        let d1 = deploy(
            &mut store,
            "c1",
            &[],
            &[],
            &[("w", vec![binding("w", "a", json!("db1")), port(5432)])],
        );
        deploy(
            &mut store,
            "c2",
            &[],
            &[],
            &[("w", vec![binding("w", "a", json!("db1")), port(6432)])],
        );
        assert_eq!(
            rows(
                &store,
                "SELECT needed_path, value, valid_from, COALESCE(CAST(valid_to AS TEXT), '-') FROM binding
                 ORDER BY id"
            ),
            [
                format!("values.host \"db1\" {d1} -"),
                format!("values.port 5432 {d1} {}", d1 + 1),
                format!("values.port 6432 {} -", d1 + 1),
            ]
        );
        assert_eq!(
            store.current_bindings("w").unwrap(),
            vec![binding("w", "a", json!("db1")), port(6432)]
        );
    });
}

#[test]
fn pruning_keeps_what_retention_says_and_every_current_row() {
    crate::tests::each_backend(|mut store| {
        // a is provisioned once, in deployment 1, and never changes: its row must survive.
        let d1 = deploy(
            &mut store,
            "c1",
            &[record("a", json!({})), record("b", json!({"v": 1}))],
            &[link("w", "a"), link("w", "b")],
            &[("w", vec![binding("w", "b", json!(1))])],
        );
        let mut last = d1;
        for v in 2..=6 {
            last = deploy(
                &mut store,
                &format!("c{v}"),
                &[record("b", json!({"v": v}))],
                &[link("w", "a"), link("w", "b")],
                &[("w", vec![binding("w", "b", json!(v))])],
            );
        }
        let pruned = store.prune(Retention::Deployments(2)).unwrap();
        // Kept: the newest two (5, 6) and 1, which made a's current row.
        assert_eq!(
            rows(&store, "SELECT id FROM deployment ORDER BY id"),
            [d1.to_string(), (last - 1).to_string(), last.to_string()]
        );
        assert_eq!(pruned.deployments, 3);
        // b's versions and bindings that ended before deployment 5 are gone; those 5 and 6 see
        // are kept, and so is everything current.
        assert_eq!(
            rows(
                &store,
                "SELECT guresid, outputs FROM resource_versions ORDER BY guresid, valid_from"
            ),
            ["a {}", "b {\"v\":5}", "b {\"v\":6}"]
        );
        assert_eq!(
            rows(
                &store,
                &format!(
                    "SELECT guresid, outputs FROM deployment_resources WHERE deployment_id = {}
                     ORDER BY 1",
                    last - 1
                )
            ),
            ["a {}", "b {\"v\":5}"]
        );
        assert_eq!(
            rows(&store, "SELECT value FROM binding ORDER BY id"),
            ["5", "6"]
        );
        assert_eq!(rows(&store, "SELECT COUNT(*) FROM link"), ["2"]);
        assert_eq!(store.resources("dev").unwrap().len(), 2);
        // Vacuum gives the space back (no free page is left in the file) and leaves the data.
        store.vacuum().unwrap();
        if store.backend() == crate::db::Backend::Sqlite {
            assert_eq!(rows(&store, "PRAGMA freelist_count"), ["0"]);
            assert_eq!(rows(&store, "PRAGMA auto_vacuum"), ["2"]);
        }
        assert_eq!(store.resources("dev").unwrap().len(), 2);
    });
}

#[test]
fn pruning_by_age_keeps_recent_deployments() {
    crate::tests::each_backend(|mut store| {
        let old = deploy(&mut store, "c1", &[], &[], &[]);
        let recent = deploy(&mut store, "c2", &[], &[], &[]);
        store
            .conn
            .execute(
                "UPDATE deployment SET started_at = '2020-01-01T00:00:00.000Z' WHERE id = ?1",
                [old],
            )
            .unwrap();
        store
            .prune(Retention::Age(std::time::Duration::from_secs(86_400)))
            .unwrap();
        assert_eq!(
            rows(&store, "SELECT id FROM deployment"),
            [recent.to_string()]
        );
        // With every deployment too old, the newest stays.
        store
            .conn
            .execute(
                "UPDATE deployment SET started_at = '2020-01-01T00:00:00.000Z'",
                params![],
            )
            .unwrap();
        store
            .prune(Retention::Age(std::time::Duration::from_secs(86_400)))
            .unwrap();
        assert_eq!(
            rows(&store, "SELECT id FROM deployment"),
            [recent.to_string()]
        );
    });
}

/// A state file as gitplane wrote it before links and bindings became ranges: schema version 1,
/// a copy of every link and binding per deployment, and the `edge` table.
fn version_one(path: &std::path::Path) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(&migrations()[0]).unwrap();
    conn.pragma_update(None, "user_version", 1).unwrap();
    let deployment = |id: i64, commit: &str, status: &str| {
        conn.execute(
            "INSERT INTO deployment (id, env, commit_id, status, started_at, finished_at)
             VALUES (?1, 'dev', ?2, ?3, '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:01.000Z')",
            params![id, commit, status],
        )
        .unwrap();
    };
    let link = |d: i64, consumer: &str, provider: &str| {
        conn.execute(
            "INSERT INTO link (deployment_id, env, consumer, provider, kind, update_type)
             VALUES (?1, 'dev', ?2, ?3, 'reference', 'NeedsProvides')",
            params![d, consumer, provider],
        )
        .unwrap();
    };
    let binding = |d: i64, value: &str| {
        conn.execute(
            "INSERT INTO binding (deployment_id, env, needed_guresid, needed_path,
                                  provided_guresid, provided_path, data_type, value)
             VALUES (?1, 'dev', 'w', 'values.host', 'a', 'outputs.host', 'string', ?2)",
            params![d, value],
        )
        .unwrap();
    };
    deployment(1, "c1", "succeeded");
    deployment(2, "c1", "succeeded");
    deployment(3, "c2", "succeeded");
    deployment(4, "c3", "held");
    deployment(5, "c4", "failed");
    for (d, links, value) in [
        (1, &[("w", "a"), ("w", "b")][..], "\"db1\""),
        (2, &[("w", "a"), ("w", "b")][..], "\"db1\""),
        (3, &[("w", "a"), ("w", "c")][..], "\"db2\""),
        (5, &[("w", "a"), ("w", "c")][..], "\"db2\""),
    ] {
        for (c, p) in links {
            link(d, c, p);
        }
        binding(d, value);
    }
    // The edges as last applied: those of deployment 5, and an orphan's kept after its delete
    // failed.
    for (from, to) in [("w", "a"), ("w", "c"), ("o", "a")] {
        conn.execute(
            "INSERT INTO edge (env, from_guresid, to_guresid, kind) VALUES ('dev', ?1, ?2, 'dependency')",
            params![from, to],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO resource (guresid, env, app, type, class, res_id, definition, driver, status,
                               inputs_hash, outputs, commit_id, deployment_id, created_at, updated_at)
         VALUES ('a', 'dev', 'shop', 'postgres', 'default', 'modules.a', 'pg', 'echo', 'ready',
                 'h', '{\"host\":\"db2\"}', 'c2', 3, 'x', 'x')",
        [],
    )
    .unwrap();
}

#[test]
fn a_state_file_from_before_ranges_migrates_and_keeps_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    version_one(&path);
    let store = Store::open(&path).unwrap();
    let version: i64 = store
        .conn
        .lite()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, migrations().len() as i64);
    // Four copies of w->a became one row; w->b ended with deployment 3; w->c is current; the
    // orphan's edge, which no deployment recorded as a link, is current too.
    assert_eq!(
        rows(
            &store,
            "SELECT consumer, provider, valid_from, COALESCE(CAST(valid_to AS TEXT), '-') FROM link
             ORDER BY consumer, provider"
        ),
        ["o a 5 -", "w a 1 -", "w b 1 3", "w c 3 -"]
    );
    assert_eq!(
        rows(
            &store,
            "SELECT value, valid_from, COALESCE(CAST(valid_to AS TEXT), '-') FROM binding ORDER BY id"
        ),
        ["\"db1\" 1 3", "\"db2\" 3 -"]
    );
    // Each deployment still answers what it looked like, the held one (which recorded nothing)
    // as its environment stood.
    let links_at = |d: i64| {
        rows(
            &store,
            &format!(
                "SELECT consumer || '>' || provider FROM deployment_links
                 WHERE deployment_id = {d} AND consumer = 'w' ORDER BY 1"
            ),
        )
    };
    assert_eq!(links_at(2), ["w>a", "w>b"]);
    assert_eq!(links_at(3), ["w>a", "w>c"]);
    assert_eq!(links_at(4), ["w>a", "w>c"]);
    assert_eq!(
        rows(
            &store,
            "SELECT value FROM deployment_bindings WHERE deployment_id = 2"
        ),
        ["\"db1\""]
    );
    // The edge view and the links report read the current links.
    assert_eq!(
        rows(
            &store,
            "SELECT from_guresid, to_guresid FROM edge ORDER BY 1, 2"
        ),
        ["o a", "w a", "w c"]
    );
    assert_eq!(
        rows(
            &store,
            "SELECT guresid, valid_from, COALESCE(CAST(valid_to AS TEXT), '-') FROM resource_versions"
        ),
        ["a 3 -"]
    );
    assert_eq!(store.links("dev").unwrap().len(), 3);
}

#[test]
fn many_resources_bound_at_once_change_only_the_bindings_that_changed() {
    crate::tests::each_backend(|mut store| {
        // More resources than are looked up one by one.
        let names: Vec<String> = (0..300).map(|i| format!("w{i:03}")).collect();
        let bindings = |changed: &str| -> Vec<(&str, Vec<BindingRecord>)> {
            names
                .iter()
                .map(|n| {
                    let value = if n == changed { "db2" } else { "db1" };
                    (n.as_str(), vec![binding(n, "a", json!(value))])
                })
                .collect()
        };
        let d1 = deploy(&mut store, "c1", &[], &[], &bindings("-"));
        let d2 = deploy(&mut store, "c2", &[], &[], &bindings("w150"));
        assert_eq!(rows(&store, "SELECT COUNT(*) FROM binding"), ["301"]);
        assert_eq!(
            rows(
                &store,
                "SELECT needed_guresid, value, valid_from, COALESCE(CAST(valid_to AS TEXT), '-') FROM binding
                 WHERE needed_guresid = 'w150' ORDER BY id"
            ),
            [
                format!("w150 \"db1\" {d1} {d2}"),
                format!("w150 \"db2\" {d2} -")
            ]
        );
    });
}

#[test]
fn marking_the_orphans_of_some_apps_leaves_the_others_marked() {
    crate::tests::each_backend(|mut store| {
        deploy(
            &mut store,
            "c1",
            &[record("a", json!({})), record("g", json!({}))],
            &[],
            &[],
        );
        let kept = |store: &Store| rows(store, "SELECT guresid FROM orphans ORDER BY 1");
        store
            .mark_orphans(
                "dev",
                &[("a".into(), "x".into()), ("g".into(), "y".into())],
                None,
            )
            .unwrap();
        assert_eq!(kept(&store), ["a", "g"]);
        assert!(!store.has_global_orphans("dev").unwrap());
        // An apply of a's app finds a in its graph again: g, outside it, stays an orphan.
        store.mark_orphans("dev", &[], Some(&["a"])).unwrap();
        assert_eq!(kept(&store), ["g"]);
        // A whole apply speaks for everything.
        store.mark_orphans("dev", &[], None).unwrap();
        assert!(kept(&store).is_empty());
    });
}

#[test]
fn the_tables_an_apply_writes_keep_their_rows_and_checks_once_their_lists_are_comparisons() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        // A state file of schema version 13, with a row in each rebuilt table.
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "foreign_keys", false).unwrap();
        conn.pragma_update(None, "legacy_alter_table", true)
            .unwrap();
        // Migration 5 seals what is there, with a function gitplane gives its connections:
        // there is nothing to seal here.
        conn.create_scalar_function(
            "gp_seal",
            2,
            rusqlite::functions::FunctionFlags::SQLITE_UTF8,
            |ctx| ctx.get::<String>(0),
        )
        .unwrap();
        for block in &migrations()[..13] {
            conn.execute_batch(block).unwrap();
        }
        conn.pragma_update(None, "user_version", 13).unwrap();
        conn.execute_batch(
            "INSERT INTO deployment (id, env, commit_id, status, started_at)
                 VALUES (1, 'dev', 'c1', 'failed', 'x');
             INSERT INTO operation (id, deployment_id, guresid, app, type, class, res_id, action,
                                    reason, status, attempts, error, started_at)
                 VALUES (7, 1, 'g', 'shop', 'postgres', 'default', 'db', 'create', 'new',
                         'failed', 2, 'boom', 'x');
             INSERT INTO link (id, env, consumer, provider, kind, update_type, valid_from)
                 VALUES (3, 'dev', 'w', 'g', 'reference', 'NeedsProvides', 1);
             INSERT INTO binding (id, env, needed_guresid, needed_path, provided_guresid,
                                  provided_path, data_type, value, valid_from)
                 VALUES (5, 'dev', 'w', 'values.host', 'g', 'outputs.host', 'string', '\"h\"', 1);",
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(
        rows(
            &store,
            "SELECT id, action, status, attempts, error FROM operation"
        ),
        ["7 create failed 2 boom"]
    );
    assert_eq!(
        rows(&store, "SELECT id, kind, update_type, valid_from FROM link"),
        ["3 reference NeedsProvides 1"]
    );
    assert_eq!(
        rows(&store, "SELECT id, data_type, value FROM binding"),
        ["5 string \"h\""]
    );
    // The views that read them still do, and the status page's index still serves its query.
    assert_eq!(
        rows(&store, "SELECT guresid, error FROM failures"),
        ["g boom"]
    );
    let plan = rows(
        &store,
        "EXPLAIN QUERY PLAN SELECT guresid FROM operation o WHERE o.deployment_id = 1
           AND (o.status = 'failed' OR o.status = 'skipped' OR o.status = 'interrupted')
           AND o.action = 'create'",
    );
    assert!(
        plan.iter().any(|p| p.contains("operation_missed")),
        "{plan:?}"
    );
    // A value outside each list is still refused.
    for bad in [
        "INSERT INTO operation (deployment_id, guresid, type, class, res_id, action, reason,
                                status, started_at)
             VALUES (1, 'g', 't', 'c', 'r', 'explode', 'new', 'started', 'x')",
        "INSERT INTO operation (deployment_id, guresid, type, class, res_id, action, reason,
                                status, started_at)
             VALUES (1, 'g', 't', 'c', 'r', 'create', 'new', 'done', 'x')",
        "INSERT INTO link (env, consumer, provider, kind, update_type, valid_from)
             VALUES ('dev', 'a', 'b', 'friendship', 'None', 1)",
        "INSERT INTO link (env, consumer, provider, kind, update_type, valid_from)
             VALUES ('dev', 'a', 'b', 'dependency', 'Sometimes', 1)",
        "INSERT INTO binding (env, needed_guresid, needed_path, provided_guresid, provided_path,
                              data_type, valid_from)
             VALUES ('dev', 'a', 'p', 'b', 'q', 'float', 1)",
    ] {
        let e = store.conn.lite().execute(bad, []).unwrap_err();
        assert!(
            e.to_string().contains("CHECK constraint failed"),
            "{bad}: {e}"
        );
    }
    // No list is left for SQLite to build a table of, row by row.
    let lists = rows(
        &store,
        "SELECT name FROM sqlite_master WHERE tbl_name IN ('operation', 'link', 'binding')
           AND sql LIKE '% IN (%'",
    );
    assert!(lists.is_empty(), "{lists:?}");
}
