//! Choosing and sharing resources through the real binary: label selectors, weights, the
//! default definition, class-ref, resource-ref to user-provided and global resources, and the
//! sharing cases of Porter's advanced dependencies.

use serde_json::json;

use crate::util::Sandbox;

fn def(id: &str, res_type: &str, extra: &str, values: &str) -> String {
    format!(
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n{extra_meta}entity:\n  \
         type: {res_type}\n  driver_type: echo\n{extra_entity}  driver_inputs:\n    values:\n      tier: {id}\n{values}  criteria:\n    - {{}}\n",
        extra_meta = extra
            .lines()
            .filter(|l| l.starts_with("  labels"))
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
        extra_entity = extra
            .lines()
            .filter(|l| !l.starts_with("  labels"))
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    )
}

fn workload(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: {name}\ncontainers:\n  main:\n    image: x\n    \
         variables:\n      TIER: ${{resources.db.tier}}\nresources:\n{resources}"
    )
}

fn base(sb: &Sandbox) {
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    sb.write(
        "definitions/workload.yaml",
        &def("workload", "workload", "", ""),
    );
}

fn tier(sb: &Sandbox, res_id: &str) -> serde_json::Value {
    sb.outputs("development", res_id)["tier"].clone()
}

#[test]
fn a_label_selector_chooses_by_labels_then_weight_then_id() {
    let sb = Sandbox::new();
    base(&sb);
    // Only one definition may claim `- {}` for a type: the ones chosen by labels have no
    // criteria, as Crossplane classes have none.
    let by_labels = [
        def("pg-slow", "postgres", "  labels: {speed: slow}", ""),
        def(
            "pg-fast-a",
            "postgres",
            "  labels: {speed: fast, region: eu}\n  weight: 5",
            "",
        ),
        def(
            "pg-fast-b",
            "postgres",
            "  labels: {speed: fast, region: eu}\n  weight: 10",
            "",
        ),
        def(
            "pg-fast-c",
            "postgres",
            "  labels: {speed: fast, region: eu}\n  weight: 10",
            "",
        ),
    ]
    .join("---\n")
    .replace("  criteria:\n    - {}\n", "");
    let fallback = def("pg-default", "postgres", "  default: true", "");
    sb.write(
        "definitions/postgres.yaml",
        &format!("{by_labels}---\n{fallback}"),
    );
    sb.write(
        "workloads/app/web.yaml",
        &workload(
            "web",
            "  db:\n    type: postgres\n    metadata:\n      annotations:\n        gitplane.dev/selector: \"speed=fast,region=eu\"\n",
        ),
    );
    sb.write(
        "workloads/app/batch.yaml",
        &workload(
            "batch",
            "  db:\n    type: postgres\n    metadata:\n      annotations:\n        gitplane.dev/selector: speed=slow\n",
        ),
    );
    sb.write(
        "workloads/app/plain.yaml",
        &workload("plain", "  db:\n    type: postgres\n"),
    );
    sb.commit("Databases chosen by labels");
    sb.gitplane(&["apply"]).ok();
    // Three fit speed=fast,region=eu: the heavier two tie at 10, and the smaller id wins.
    assert_eq!(tier(&sb, "modules.web.externals.db"), json!("pg-fast-b"));
    assert_eq!(tier(&sb, "modules.batch.externals.db"), json!("pg-slow"));
    // No class, no selector: the default definition (its criteria `- {}` match too).
    assert_eq!(tier(&sb, "modules.plain.externals.db"), json!("pg-default"));

    // A selector nothing fits is an error naming the candidates.
    sb.edit("workloads/app/batch.yaml", "speed=slow", "speed=warp");
    sb.commit("No such speed");
    sb.gitplane(&["validate"])
        .fails()
        .stderr_has("the selector wants speed=warp");
}

#[test]
fn the_default_definition_serves_when_no_criteria_match() {
    let sb = Sandbox::new();
    base(&sb);
    sb.write(
        "definitions/postgres.yaml",
        &[
            def("pg-prod", "postgres", "", "").replace("- {}", "- env_type: production"),
            def("pg-fallback", "postgres", "  default: true", "")
                .replace("  criteria:\n    - {}\n", ""),
        ]
        .join("---\n"),
    );
    sb.write(
        "workloads/app/web.yaml",
        &workload("web", "  db:\n    type: postgres\n"),
    );
    sb.commit("Only a production rule, and a default");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(tier(&sb, "modules.web.externals.db"), json!("pg-fallback"));
    // Two defaults for one type are refused.
    sb.write(
        "definitions/another.yaml",
        &def("pg-other", "postgres", "  default: true", "").replace("  criteria:\n    - {}\n", ""),
    );
    sb.commit("Two defaults");
    sb.gitplane(&["validate"])
        .fails()
        .stderr_has("are both the default for type 'postgres'");
}

#[test]
fn class_ref_names_a_definition_and_ambiguity_is_refused() {
    let sb = Sandbox::new();
    base(&sb);
    sb.write(
        "definitions/postgres.yaml",
        &[
            def("pg-standard", "postgres", "", ""),
            def("pg-special", "postgres", "", "").replace("- {}", "- app_id: nobody"),
        ]
        .join("---\n"),
    );
    sb.write(
        "workloads/app/web.yaml",
        &workload(
            "web",
            "  db:\n    type: postgres\n    metadata:\n      annotations:\n        gitplane.dev/class-ref: pg-special\n",
        ),
    );
    sb.commit("A class-ref");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(tier(&sb, "modules.web.externals.db"), json!("pg-special"));

    for (annotations, message) in [
        (
            "    class: large\n    metadata:\n      annotations:\n        gitplane.dev/class-ref: pg-special\n",
            "a class and a gitplane.dev/class-ref annotation both choose the definition",
        ),
        (
            "    metadata:\n      annotations:\n        gitplane.dev/class-ref: pg-special\n        gitplane.dev/selector: a=b\n",
            "choose one of gitplane.dev/selector, gitplane.dev/class-ref and gitplane.dev/resource-ref",
        ),
        (
            "    metadata:\n      annotations:\n        gitplane.dev/class-ref: pg-missing\n",
            "pg-missing (class-ref: no definition has this id)",
        ),
    ] {
        sb.write(
            "workloads/app/web.yaml",
            &workload("web", &format!("  db:\n    type: postgres\n{annotations}")),
        );
        sb.commit("Ambiguous");
        sb.gitplane(&["validate"]).fails().stderr_has(message);
    }
}

const SHARED_ENV: &str = "type: development\nimplicit_resources: []\nshared_resources:\n  \
    onprem-db:\n    type: postgres\n    provided: {host: db1.corp.example, port: 5432, tier: on-premise}\n  \
    main-dns:\n    type: dns\n";

#[test]
fn resource_ref_binds_user_provided_and_global_resources() {
    let sb = Sandbox::new();
    sb.write("environments/development.yaml", SHARED_ENV);
    sb.write(
        "definitions/workload.yaml",
        &def("workload", "workload", "", ""),
    );
    sb.write(
        "definitions/dns.yaml",
        &def("dns", "dns", "", "      zone: example.com\n"),
    );
    let with_refs = |name: &str| {
        workload(
            name,
            "  db:\n    type: postgres\n    metadata:\n      annotations:\n        gitplane.dev/resource-ref: onprem-db\n  \
             dns:\n    type: dns\n    metadata:\n      annotations:\n        gitplane.dev/resource-ref: main-dns\n",
        )
    };
    sb.write("workloads/shop/web.yaml", &with_refs("web"));
    sb.write("workloads/blog/web.yaml", &with_refs("web"));
    sb.commit("Two apps on an on-premise database and a global zone");
    sb.gitplane(&["apply"]).ok();
    // One on-premise database and one zone for both apps: they belong to no app.
    assert_eq!(
        sb.rows("SELECT type, res_id, COALESCE(app, '-'), driver, definition FROM resource WHERE app IS NULL ORDER BY type"),
        [
            ["dns", "globals.main-dns", "-", "echo", "dns"],
            ["postgres", "globals.onprem-db", "-", "gitplane/provided", "provided/onprem-db"],
        ]
    );
    assert_eq!(
        sb.outputs("development", "globals.onprem-db"),
        json!({"host": "db1.corp.example", "port": 5432, "tier": "on-premise"})
    );
    // The workloads read it like any resource.
    let wl = sb.column("SELECT inputs FROM resource WHERE type = 'workload' AND app = 'shop'");
    assert!(wl[0].contains("on-premise"), "{wl:?}");
    // Both apps link to the same two resources.
    assert_eq!(
        sb.count("SELECT COUNT(DISTINCT consumer) FROM link WHERE provider = (SELECT guresid FROM resource WHERE res_id = 'globals.main-dns')"),
        2
    );

    // The global zone survives the first app's removal and goes with the last; the
    // user-provided database is never deleted, only forgotten.
    sb.remove("workloads/blog");
    sb.commit("Retire the blog");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE app IS NULL"),
        2
    );
    sb.remove("workloads/shop");
    sb.commit("Retire the shop");
    let held = sb.gitplane(&["apply"]).fails();
    held.stdout_has("held by the deletion guard");
    let id = sb.last_deployment("development").id.to_string();
    sb.gitplane(&["approve", "--yes", &id]).ok();
    let ops = sb.rows(&format!(
        "SELECT action, res_id FROM operation WHERE deployment_id = {id} ORDER BY id"
    ));
    assert_eq!(
        ops,
        [
            ["delete", "modules.web"],
            ["delete", "globals.main-dns"],
            ["forget", "globals.onprem-db"],
        ]
    );
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 0);
}

#[test]
fn a_resource_ref_to_an_unknown_or_mistyped_shared_resource_is_an_error() {
    let sb = Sandbox::new();
    sb.write("environments/development.yaml", SHARED_ENV);
    sb.write(
        "definitions/workload.yaml",
        &def("workload", "workload", "", ""),
    );
    sb.write(
        "workloads/shop/web.yaml",
        &workload(
            "web",
            "  db:\n    type: redis\n    metadata:\n      annotations:\n        gitplane.dev/resource-ref: onprem-db\n",
        ),
    );
    sb.commit("Wrong type");
    sb.gitplane(&["validate"]).fails().stderr_has(
        "shared resource 'onprem-db' is a 'postgres', but the request asks for a 'redis'",
    );
    sb.write(
        "workloads/shop/web.yaml",
        &workload(
            "web",
            "  db:\n    type: postgres\n    metadata:\n      annotations:\n        gitplane.dev/resource-ref: nope\n",
        ),
    );
    sb.commit("Unknown");
    sb.gitplane(&["validate"])
        .fails()
        .stderr_has("has no shared resource 'nope' (it has: main-dns, onprem-db)");
}

/// Porter's exclusive and application cases, and reference counting of an app-shared resource.
#[test]
fn exclusive_and_app_shared_resources_and_their_last_consumer() {
    let sb = Sandbox::new();
    base(&sb);
    // Each step deletes most of what is left: the guard would hold it.
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\ndeletion_guard: {threshold: 100}\n",
    );
    sb.write("definitions/postgres.yaml", &def("pg", "postgres", "", ""));
    sb.write("definitions/redis.yaml", &def("redis", "redis", "", ""));
    let wl = |name: &str| {
        workload(
            name,
            "  db:\n    type: postgres\n  cache:\n    type: redis\n    id: cache\n",
        )
    };
    sb.write("workloads/app/one.yaml", &wl("one"));
    sb.write("workloads/app/two.yaml", &wl("two"));
    sb.write("workloads/app/three.yaml", &wl("three"));
    sb.commit("Three workloads");
    sb.gitplane(&["apply"]).ok();
    // Exclusive: a database each. Application: one cache.
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'postgres'"),
        3
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'redis'"),
        1
    );

    sb.remove("workloads/app/one.yaml");
    sb.commit("One goes");
    // The plan says who still uses the shared cache.
    sb.gitplane(&["plan"]).ok().stdout_has(
        "kept: a consumer goes, still used by app/workload.default#modules.three, app/workload.default#modules.two",
    );
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'redis'"),
        1,
        "still used by two and three"
    );
    sb.remove("workloads/app/two.yaml");
    sb.commit("Two goes");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'redis'"),
        1,
        "still used by three"
    );
    sb.remove("workloads/app/three.yaml");
    sb.write(
        "workloads/app/keep.yaml",
        &workload("keep", "  db:\n    type: postgres\n"),
    );
    sb.commit("Three goes");
    sb.gitplane(&["apply"]).ok();
    let d = sb.last_deployment("development");
    let ops = sb.rows(&format!(
        "SELECT action, res_id FROM operation WHERE deployment_id = {} AND action = 'delete' ORDER BY id",
        d.id
    ));
    // The last consumer goes before what it used.
    let position = |id: &str| ops.iter().position(|r| r[1] == id).unwrap();
    assert!(
        position("modules.three") < position("shared.cache"),
        "{ops:?}"
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'redis'"),
        0
    );
}

/// Porter's interfaces: a request by `$id` reuses whatever provides those outputs, whatever its
/// type or output names, before creating anything; the mapping is recorded in the bindings.
#[test]
fn requests_by_interface_get_or_create() {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\nshared_resources:\n  onprem-sql:\n    \
         type: mssql\n    provided: {conn: \"Server=db1.corp\"}\n    provides: {conn: azure-sql-connection-string}\n",
    );
    sb.write(
        "definitions/workload.yaml",
        &def("workload", "workload", "", ""),
    );
    sb.write(
        "definitions/postgres.yaml",
        &def(
            "pg",
            "postgres",
            "  provides: {dsn: mysql-5.7-connection-string}",
            "      dsn: mysql://db.internal/app\n",
        ),
    );
    let by_interface = |name: &str, id: &str| {
        format!(
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: {name}\ncontainers:\n  main:\n    image: x\n    \
             variables:\n      DB: ${{resources.db.connection}}\nresources:\n  db:\n    type: postgres\n    \
             metadata:\n      annotations:\n        gitplane.dev/interface: \"connection={id}\"\n"
        )
    };
    // Reuse: the on-premise server provides the id, under another type and output name.
    sb.write(
        "workloads/shop/api.yaml",
        &by_interface("api", "azure-sql-connection-string"),
    );
    // Create: nothing provides mysql-5.7, so a postgres is created from its definition...
    sb.write(
        "workloads/shop/web.yaml",
        &by_interface("web", "mysql-5.7-connection-string"),
    );
    // ...and reused by a third workload that asks for the same id.
    sb.write(
        "workloads/shop/worker.yaml",
        &by_interface("worker", "mysql-5.7-connection-string"),
    );
    sb.commit("Databases by interface");
    sb.gitplane(&["apply"]).ok();

    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'postgres'"),
        1,
        "one created, then reused"
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'mssql'"),
        1
    );
    let variable = |workload: &str| {
        let inputs = sb.column(&format!(
            "SELECT inputs FROM resource WHERE res_id = 'modules.{workload}'"
        ));
        let v: serde_json::Value = serde_json::from_str(&inputs[0]).unwrap();
        v["resource"]["containers"]["main"]["variables"]["DB"].clone()
    };
    assert_eq!(variable("api"), json!("Server=db1.corp"));
    assert_eq!(variable("web"), json!("mysql://db.internal/app"));
    assert_eq!(variable("worker"), json!("mysql://db.internal/app"));
    // The mapping: the workload's name, the $id, and the provider's own output name.
    assert_eq!(
        sb.rows(
            "SELECT (SELECT res_id FROM resource WHERE guresid = needed_guresid), provided_path, interface \
             FROM binding WHERE interface IS NOT NULL ORDER BY 1"
        ),
        [
            ["modules.api", "outputs.conn", "connection = azure-sql-connection-string"],
            ["modules.web", "outputs.dsn", "connection = mysql-5.7-connection-string"],
            ["modules.worker", "outputs.dsn", "connection = mysql-5.7-connection-string"],
        ]
    );

    // A definition that does not declare the $id cannot serve a request by it.
    sb.edit(
        "workloads/shop/web.yaml",
        "connection=mysql-5.7-connection-string",
        "connection=redis-url",
    );
    sb.commit("An id nobody provides");
    sb.gitplane(&["validate"]).fails().stderr_has(
        "no resource provides the $ids redis-url that 'db' asks for, and definition 'pg'",
    );
}

#[test]
fn explain_shows_every_candidate_and_why() {
    let sb = Sandbox::new();
    base(&sb);
    let by_labels = [
        def("pg-slow", "postgres", "  labels: {speed: slow}", ""),
        def(
            "pg-fast-a",
            "postgres",
            "  labels: {speed: fast}\n  weight: 5",
            "",
        ),
        def(
            "pg-fast-b",
            "postgres",
            "  labels: {speed: fast}\n  weight: 10",
            "",
        ),
        def(
            "pg-fast-c",
            "postgres",
            "  labels: {speed: fast}\n  weight: 10",
            "",
        ),
    ]
    .join("---\n")
    .replace("  criteria:\n    - {}\n", "");
    sb.write("definitions/postgres.yaml", &by_labels);
    sb.write(
        "workloads/app/web.yaml",
        &workload(
            "web",
            "  db:\n    type: postgres\n    metadata:\n      annotations:\n        gitplane.dev/selector: speed=fast\n",
        ),
    );
    sb.commit("Four candidates");
    sb.gitplane(&["apply"]).ok();
    let run = sb
        .gitplane(&[
            "explain",
            "app/postgres.default#modules.web.externals.db",
            "--format",
            "json",
        ])
        .ok();
    let text = run.stdout.clone();
    for needle in ["pg-fast-a", "pg-fast-b", "pg-fast-c", "pg-slow"] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    let table = sb
        .gitplane(&["explain", "app/postgres.default#modules.web.externals.db"])
        .ok();
    table.stdout_has("labels fit; specificity 0, weight 10: the best");
    table.stdout_has("its labels do not carry the selector's");
}

#[test]
fn a_global_resource_serves_an_interface_before_anything_is_created() {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\nshared_resources:\n  main-dns:\n    type: dns\n",
    );
    sb.write(
        "definitions/workload.yaml",
        &def("workload", "workload", "", ""),
    );
    sb.write(
        "definitions/dns.yaml",
        &def(
            "dns",
            "dns",
            "  provides: {zone: dns-zone}",
            "      zone: example.com\n",
        ),
    );
    sb.write(
        "workloads/shop/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n    \
         variables:\n      ZONE: ${resources.domain.name}\nresources:\n  domain:\n    type: route53-zone\n    \
         metadata:\n      annotations:\n        gitplane.dev/interface: \"name=dns-zone\"\n",
    );
    sb.commit("A zone by interface");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        sb.rows("SELECT type, res_id, COALESCE(app, '-') FROM resource WHERE type != 'workload'"),
        [["dns", "globals.main-dns", "-"]],
        "the global serves it; no route53-zone is created"
    );
    let inputs = sb.column("SELECT inputs FROM resource WHERE type = 'workload'");
    assert!(inputs[0].contains(r#""ZONE":"example.com""#), "{inputs:?}");
}
