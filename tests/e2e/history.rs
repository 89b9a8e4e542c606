//! History as what changed: a deployment that changes nothing writes only its record, the
//! history views answer what each deployment looked like and what each commit changed,
//! `history.keep` and `gitplane state vacuum` prune and reclaim, and a state file written before
//! history became ranges migrates with its history.

use crate::util::Sandbox;

/// Rows of every table but `deployment`, which a deployment that changes nothing adds to.
fn history_rows(sb: &Sandbox) -> Vec<i64> {
    [
        "resource",
        "resource_secret",
        "resource_version",
        "link",
        "binding",
        "operation",
        "driver_cookie",
    ]
    .iter()
    .map(|t| sb.count(&format!("SELECT COUNT(*) FROM {t}")))
    .collect()
}

/// The state file's size once its write-ahead log is folded in.
fn state_bytes(sb: &Sandbox) -> u64 {
    sb.db()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    std::fs::metadata(&sb.state).unwrap().len()
}

/// `(needed path, value)` of the development postgres's bindings as deployment `d` saw them.
fn postgres_bindings_at(sb: &Sandbox, d: i64) -> Vec<String> {
    sb.column(&format!(
        "SELECT b.needed_path || '=' || b.value FROM deployment_bindings b
         JOIN resource r ON r.guresid = b.needed_guresid
         WHERE b.deployment_id = {d} AND r.type = 'postgres' AND b.secret = 0
         ORDER BY 1"
    ))
}

/// `consumer type > provider type` of the development links deployment `d` saw.
fn links_at(sb: &Sandbox, d: i64) -> Vec<String> {
    sb.column(&format!(
        "SELECT COALESCE(c.type, '?') || '>' || COALESCE(p.type, '?') || ' ' || l.kind
         FROM deployment_links l
         LEFT JOIN resource_versions c ON c.guresid = l.consumer
              AND c.valid_from <= {d} AND (c.valid_to IS NULL OR c.valid_to > {d})
         LEFT JOIN resource_versions p ON p.guresid = l.provider
              AND p.valid_from <= {d} AND (p.valid_to IS NULL OR p.valid_to > {d})
         WHERE l.deployment_id = {d}
         ORDER BY 1"
    ))
}

#[test]
fn a_deployment_that_changes_nothing_writes_only_its_record() {
    let sb = Sandbox::applied();
    let rows = history_rows(&sb);
    let bytes = state_bytes(&sb);
    let deployments = sb.count("SELECT COUNT(*) FROM deployment");
    for _ in 0..20 {
        sb.gitplane(&["apply"])
            .ok()
            .stdout_has("0 created, 0 updated, 0 deleted, 6 unchanged, 0 failed");
    }
    assert_eq!(history_rows(&sb), rows, "only deployment rows may be added");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment"),
        deployments + 40
    );
    // 40 deployment rows of about a hundred bytes each.
    let added = state_bytes(&sb) - bytes;
    assert!(added <= 16 * 1024, "20 no-op applies added {added} bytes");
}

#[test]
fn history_views_answer_what_each_deployment_looked_like_and_what_each_commit_changed() {
    let sb = Sandbox::applied();
    let first = sb.last_deployment("development").id;
    // The development database moves to another port: base-env, and everything reading the
    // port, change.
    sb.edit(
        "definitions/base-env.yaml",
        "      pgport: 5432\n      redis_host: redis.dev",
        "      pgport: 6432\n      redis_host: redis.dev",
    );
    let moved = sb.commit("Move the development database");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let second = sb.last_deployment("development").id;
    sb.remove("workloads/shop/frontend.yaml");
    let retired = sb.commit("Retire the frontend");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let third = sb.last_deployment("development").id;

    // What each deployment looked like.
    assert!(postgres_bindings_at(&sb, first).contains(&"values.port=5432".to_owned()));
    assert!(postgres_bindings_at(&sb, second).contains(&"values.port=6432".to_owned()));
    assert_eq!(
        postgres_bindings_at(&sb, second),
        postgres_bindings_at(&sb, third)
    );
    // The frontend's links (to its dns and the shared cache) and its dns's go.
    let mut expected = links_at(&sb, second);
    for gone in [
        "dns>base-env reference",
        "workload>dns reference",
        "workload>redis reference",
    ] {
        let at = expected.iter().position(|l| l == gone).expect(gone);
        expected.remove(at);
    }
    assert_eq!(links_at(&sb, third), expected);
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment_resources WHERE deployment_id = {second}"
        )),
        6
    );
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment_resources WHERE deployment_id = {third}"
        )),
        4
    );

    // What each commit changed.
    let changes = |commit: &str| {
        sb.column(&format!(
            "SELECT c.what || ' ' || c.change || ' ' || c.detail FROM changes c
             WHERE c.commit_id = '{commit}' AND c.what = 'resource' ORDER BY 1"
        ))
    };
    let moved_resources = changes(&moved);
    assert!(
        moved_resources.contains(&"resource updated base-env.default#base-env".to_owned()),
        "{moved_resources:?}"
    );
    assert!(
        moved_resources
            .iter()
            .any(|c| c.starts_with("resource updated postgres.")),
        "{moved_resources:?}"
    );
    assert!(
        !moved_resources.iter().any(|c| c.contains("dns")),
        "dns reads no port: {moved_resources:?}"
    );
    assert_eq!(
        changes(&retired),
        [
            "resource deleted dns.default#modules.frontend.externals.dns",
            "resource deleted workload.default#modules.frontend",
        ]
    );
    let port_bindings = sb.column(&format!(
        "SELECT change || ' ' || detail FROM changes
         WHERE commit_id = '{moved}' AND what = 'binding' AND detail LIKE 'values.port%'
         ORDER BY 1"
    ));
    assert_eq!(
        port_bindings,
        [
            "added values.port <- outputs.pgport = 6432",
            "removed values.port <- outputs.pgport = 5432",
        ]
    );
    // No secret reaches a history view.
    let everything = sb.rows("SELECT * FROM changes").concat().join(" ");
    assert!(!everything.contains("dev-password-change-me"));
}

#[test]
fn history_keep_prunes_old_history_and_state_vacuum_reclaims_the_space() {
    let sb = Sandbox::applied();
    let config = sb.root.join("host.yaml");
    std::fs::write(&config, "history:\n  keep: 3\n").unwrap();
    let config = config.to_str().unwrap();
    for port in 5433..5443 {
        sb.edit(
            "definitions/base-env.yaml",
            &format!("      pgport: {}\n      redis_host: redis.dev", port - 1),
            &format!("      pgport: {port}\n      redis_host: redis.dev"),
        );
        sb.commit(&format!("port {port}"));
        sb.gitplane(&["apply", "--env", "development", "--config", config])
            .ok();
    }
    // The newest three of development, and those that made a current resource row (the
    // frontend's dns reads no port and was last provisioned by the first deployment); every
    // current resource is still there.
    let kept = sb.column("SELECT id FROM deployment WHERE env = 'development' ORDER BY id");
    assert_eq!(kept.len(), 4, "{kept:?}");
    assert_eq!(sb.res_ids("development").len(), 6);
    assert_eq!(sb.res_ids("production").len(), 6);
    // No history row that no kept deployment can see, and every kept one still answers.
    let oldest_kept: i64 = kept[1].parse().unwrap();
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM binding WHERE env = 'development' AND valid_to <= {oldest_kept}"
        )),
        0
    );
    assert!(
        postgres_bindings_at(&sb, oldest_kept).contains(&"values.port=5440".to_owned()),
        "{:?}",
        postgres_bindings_at(&sb, oldest_kept)
    );
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM operation WHERE deployment_id < {oldest_kept}
             AND deployment_id NOT IN (SELECT deployment_id FROM resource)"
        )),
        0
    );

    let before = state_bytes(&sb);
    let run = sb.gitplane(&["state", "vacuum", "--keep", "1"]).ok();
    run.stdout_has("pruned ").stdout_has(" MB -> ");
    assert!(state_bytes(&sb) <= before);
    assert_eq!(
        sb.count("PRAGMA freelist_count"),
        0,
        "vacuum leaves no free page"
    );
    assert_eq!(sb.res_ids("development").len(), 6);
    sb.gitplane(&["apply"])
        .ok()
        .stdout_has("0 created, 0 updated, 0 deleted");

    // Bad retention settings are refused with where and why, and change nothing.
    let rows = history_rows(&sb);
    sb.gitplane(&["state", "vacuum", "--keep", "0"])
        .fails()
        .stderr_has("--keep 0: keep at least 1 deployment");
    std::fs::write(sb.root.join("bad.yaml"), "history:\n  keep: soon\n").unwrap();
    sb.gitplane(&[
        "apply",
        "--config",
        sb.root.join("bad.yaml").to_str().unwrap(),
    ])
    .fails()
    .stderr_has("bad.yaml:2: history.keep: 'soon' is not a duration");
    assert_eq!(history_rows(&sb), rows);
}

/// The repository the fixture's state was written from (`tests/fixtures/make-state-v1.sh`),
/// its last commit with the same files.
fn fixture_repository() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.edit(
        "definitions/base-env.yaml",
        "      pgport: 5432\n      redis_host: redis.dev",
        "      pgport: 6432\n      redis_host: redis.dev",
    );
    sb.remove("workloads/shop/frontend.yaml");
    sb.commit("The fixture's last commit");
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/state-v1.sqlite3");
    std::fs::copy(&fixture, &sb.state).unwrap();
    sb
}

#[test]
fn a_state_file_from_before_the_change_migrates_and_keeps_its_history() {
    let sb = fixture_repository();
    assert_eq!(sb.count("PRAGMA user_version"), 1);
    // Reading commands migrate it and show every deployment.
    let history = sb.gitplane(&["history", "--format", "json"]).ok().json();
    assert_eq!(history.as_array().unwrap().len(), 5);
    assert_eq!(sb.count("PRAGMA user_version"), 14);
    // Its secrets, plain text before, are sealed now.
    assert!(sb.count("SELECT COUNT(*) FROM resource_secret") > 0);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource_secret WHERE outputs NOT LIKE 'gp1:%'"),
        0
    );

    // Deployment 1 had the frontend and port 5432, 3 port 6432, 5 no frontend.
    assert!(postgres_bindings_at(&sb, 1).contains(&"values.port=5432".to_owned()));
    assert!(postgres_bindings_at(&sb, 3).contains(&"values.port=6432".to_owned()));
    let links = |d: i64| {
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment_links WHERE deployment_id = {d}"
        ))
    };
    assert_eq!(links(1), links(4));
    assert_eq!(links(5) + 3, links(4), "the frontend's links end with 5");
    assert_eq!(
        sb.column(
            "SELECT change || ' ' || kind FROM (
                SELECT c.change, l.kind FROM changes c JOIN link l
                  ON l.consumer = c.subject AND l.provider = c.other
                WHERE c.deployment_id = 5 AND c.what = 'link')
             ORDER BY 1"
        ),
        [
            "removed reference",
            "removed reference",
            "removed reference"
        ]
    );
    // The no-op deployment 4 changed nothing, and its copies left no rows of their own.
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM changes WHERE deployment_id = 4"),
        0
    );
    // The reports read the migrated links.
    let report = sb
        .gitplane(&[
            "report",
            "links",
            "--env",
            "development",
            "--format",
            "json",
        ])
        .ok()
        .json();
    assert!(!report.as_array().unwrap().is_empty());

    // An apply of the same files changes nothing and adds only its deployment.
    let rows = history_rows(&sb);
    sb.gitplane(&["apply", "--env", "development"])
        .ok()
        .stdout_has("0 created, 0 updated, 0 deleted, 4 unchanged, 0 failed");
    assert_eq!(history_rows(&sb), rows);
}
