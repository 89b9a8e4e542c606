//! Links and bindings recorded in state, for the examples of seed document 000, and AutoUpdate:
//! what moves when a provider's outputs change, and what a pinned resource keeps.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::util::{Sandbox, rows_of};

const ENVIRONMENT: &str =
    "type: development\nimplicit_resources: [base-env, k8s-cluster, k8s-namespace]\n";

const WORKLOAD: &str = "\
apiVersion: score.dev/v1b1
metadata:
  name: my-workload
containers:
  main:
    image: registry.example.com/my-workload:1
resources:
  db:
    type: postgres
";

/// The definitions of seed 000's fourth step, on the echo driver (so they provision here), with
/// the outputs the next definitions read.
const DEFINITIONS: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: base-env
entity:
  type: base-env
  driver_type: humanitec/echo
  driver_inputs:
    values: {pghost: db.internal, pgname: app, pgport: 5432}
    secrets: {pguser: app-user, pgpassword: s3cret-pw}
  criteria:
    - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: k8s-cluster
entity:
  type: k8s-cluster
  driver_type: humanitec/echo
  criteria:
    - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: k8s-namespace
entity:
  type: k8s-namespace
  driver_type: humanitec/echo
  criteria:
    - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: workload-with-sa
entity:
  type: workload
  driver_type: humanitec/echo
  driver_inputs:
    values:
      update:
      - op: add
        path: /spec/serviceAccountName
        value: ${resources.k8s-service-account.outputs.name}
  criteria:
  - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: k8s-service-account
entity:
  type: k8s-service-account
  driver_type: humanitec/echo
  driver_inputs:
    values:
      name: ${context.res.id}
      role: ${resources.aws-role.outputs.arn}
  criteria:
  - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: postgres-def
entity:
  type: postgres
  driver_type: humanitec/echo
  driver_inputs:
    values:
      host: ${resources.base-env#base-env.outputs.pghost}
      name: ${resources.base-env#base-env.outputs.pgname}
      port: ${resources.base-env#base-env.outputs.pgport}
      append_host_to_user: false
    secrets:
      dbcredentials:
        username: ${resources.base-env#base-env.outputs.pguser}
        password: ${resources.base-env#base-env.outputs.pgpassword}
  provision:
    aws-policy:
      is_dependent: false
      match_dependents: true
  criteria:
  - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: iam-policy
entity:
  type: aws-policy
  driver_type: humanitec/echo
  driver_inputs:
    values:
      db_name: ${resources.postgres.outputs.name}
      name: policy-${context.res.id}
  criteria:
  - app_id: example-app
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: iam-role
entity:
  type: aws-role
  driver_type: humanitec/echo
  driver_inputs:
    values:
      arns: ${resources.workload>aws-policy.outputs.name}
      arn: role-${context.res.id}
  criteria:
  - app_id: example-app
";

fn seed_000() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("environments/development.yaml", ENVIRONMENT);
    sb.write("workloads/example-app/my-workload.yaml", WORKLOAD);
    sb.write("definitions/seed-000.yaml", DEFINITIONS);
    sb.commit("Seed document 000, step 4");
    sb.gitplane(&["apply"]).ok();
    sb
}

/// `type#res_id` of each GUResID in state.
fn name_sql(column: &str) -> String {
    format!("(SELECT type || '#' || res_id FROM resource WHERE guresid = {column})")
}

#[test]
fn seed_000_links_have_their_update_types() {
    let sb = seed_000();
    let rows: BTreeSet<(String, String, String, String)> = sb
        .rows(&format!(
            "SELECT {}, {}, kind, update_type FROM link",
            name_sql("consumer"),
            name_sql("provider")
        ))
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone()))
        .collect();
    let wl = "workload#modules.my-workload";
    let db = "postgres#modules.my-workload.externals.db";
    let policy = "aws-policy#modules.my-workload.externals.db";
    let sa = "k8s-service-account#modules.my-workload";
    let role = "aws-role#modules.my-workload";
    let expected: BTreeSet<(String, String, String, String)> = [
        (wl, db, "dependency", "None"),
        (wl, sa, "reference", "NeedsProvides"),
        (wl, policy, "coprovision", "None"),
        (db, "base-env#base-env", "reference", "NeedsProvides"),
        (policy, db, "reference", "NeedsProvides"),
        (sa, role, "reference", "NeedsProvides"),
        (role, policy, "selector", "NeedsProvides"),
    ]
    .iter()
    .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
    .collect();
    assert_eq!(rows, expected);
}

#[test]
fn seed_000_bindings_record_every_resolved_placeholder() {
    let sb = seed_000();
    let rows: BTreeSet<Vec<String>> = sb
        .rows(&format!(
            "SELECT {}, needed_path, {}, provided_path, data_type, value, secret FROM binding",
            name_sql("needed_guresid"),
            name_sql("provided_guresid")
        ))
        .into_iter()
        .collect();
    let db = "postgres#modules.my-workload.externals.db";
    let base = "base-env#base-env";
    let expected: BTreeSet<Vec<String>> = rows_of(&[
        [
            db,
            "values.host",
            base,
            "outputs.pghost",
            "string",
            "\"db.internal\"",
            "0",
        ],
        [
            db,
            "values.name",
            base,
            "outputs.pgname",
            "string",
            "\"app\"",
            "0",
        ],
        [
            db,
            "values.port",
            base,
            "outputs.pgport",
            "int",
            "5432",
            "0",
        ],
        // A secret is bound, but its value is never kept.
        [
            db,
            "secrets.dbcredentials.password",
            base,
            "outputs.pgpassword",
            "string",
            "NULL",
            "1",
        ],
        [
            db,
            "secrets.dbcredentials.username",
            base,
            "outputs.pguser",
            "string",
            "NULL",
            "1",
        ],
        [
            "workload#modules.my-workload",
            "values.update[0].value",
            "k8s-service-account#modules.my-workload",
            "outputs.name",
            "string",
            "\"modules.my-workload\"",
            "0",
        ],
        [
            "aws-policy#modules.my-workload.externals.db",
            "values.db_name",
            db,
            "outputs.name",
            "string",
            "\"app\"",
            "0",
        ],
        [
            "k8s-service-account#modules.my-workload",
            "values.role",
            "aws-role#modules.my-workload",
            "outputs.arn",
            "string",
            "\"role-modules.my-workload\"",
            "0",
        ],
        // The selector: an array, bound to the resource its descriptor names.
        [
            "aws-role#modules.my-workload",
            "values.arns",
            "workload#modules.my-workload",
            "workload>aws-policy.outputs.name",
            "json",
            "[\"policy-modules.my-workload.externals.db\"]",
            "0",
        ],
    ]);
    assert_eq!(rows, expected);
    // The view joins links and bindings; the secret never appears in state outside
    // resource_secret.
    let view = sb.rows("SELECT * FROM links").concat().join(" ");
    assert!(!view.contains("s3cret-pw"));
    assert!(view.contains("workload>aws-policy.outputs.name"));
}

#[test]
fn a_whole_object_inserted_into_a_string_is_an_insert_link() {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    sb.write(
        "workloads/app/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  cfg:\n    type: config\n",
    );
    let def = |id: &str, values: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
             type: {id}\n  driver_type: echo\n  driver_inputs:\n    values:\n{values}  criteria:\n    - {{}}\n"
        )
    };
    sb.write(
        "definitions/all.yaml",
        &[
            def("workload", "      a: 1\n"),
            def(
                "settings",
                "      obj: {level: debug, sinks: [stdout]}\n      name: s\n",
            ),
            def(
                "config",
                "      text: \"settings=${resources.settings.outputs.obj}\"\n",
            ),
        ]
        .join("---\n"),
    );
    sb.commit("An inserted object");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        sb.rows(&format!(
            "SELECT {}, update_type FROM link WHERE kind = 'reference'",
            name_sql("provider")
        )),
        [["settings#modules.web.externals.cfg", "Insert"]]
    );
    assert_eq!(
        sb.column("SELECT data_type || ' ' || inserted FROM binding"),
        ["json 1"]
    );
    assert_eq!(
        sb.outputs("development", "modules.web.externals.cfg")["text"],
        json!(r#"settings={"level":"debug","sinks":["stdout"]}"#)
    );
}

/// Updated res_ids of the newest development deployment.
fn updated(sb: &Sandbox) -> BTreeSet<String> {
    let d = sb.last_deployment("development");
    sb.operations(d.id)
        .into_iter()
        .filter(|(a, _, s)| a == "update" && s == "succeeded")
        .map(|(_, r, _)| r)
        .collect()
}

fn bound(sb: &Sandbox, res_id: &str, path: &str) -> Value {
    let v = sb.column(&format!(
        "SELECT value FROM binding WHERE needed_guresid = (SELECT guresid FROM resource \
         WHERE env = 'development' AND res_id = '{res_id}') AND needed_path = '{path}' \
         ORDER BY id DESC LIMIT 1"
    ));
    serde_json::from_str(&v[0]).unwrap()
}

#[test]
fn auto_update_moves_what_is_bound_and_a_pinned_resource_waits_for_resolve() {
    let sb = Sandbox::applied();
    // AutoUpdate (the default): a new base-env output reaches every resource bound to it, and
    // only those (dns and redis read other outputs).
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal",
        "pghost: pg2.dev.internal",
    );
    sb.commit("Move the development database");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    assert_eq!(
        updated(&sb),
        [
            "base-env",
            "modules.backend.externals.db",
            "modules.backend"
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    );
    assert_eq!(
        bound(&sb, "modules.backend.externals.db", "values.host"),
        json!("pg2.dev.internal")
    );

    // Pinned: with auto_update: false the database keeps the host it was bound to.
    sb.edit(
        "definitions/postgres.yaml",
        "  id: postgres-dev\nentity:\n  name: postgres-dev\n  type: postgres\n  driver_type: humanitec/echo\n",
        "  id: postgres-dev\nentity:\n  name: postgres-dev\n  type: postgres\n  driver_type: humanitec/echo\n  auto_update: false\n",
    );
    sb.commit("Pin the development databases");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg2.dev.internal",
        "pghost: pg3.dev.internal",
    );
    sb.commit("Move the development database again");
    // The plan says what is pinned and stale.
    let plan = sb
        .gitplane(&["plan", "--env", "development", "--format", "steps-json"])
        .ok()
        .json()[0]
        .clone();
    let db = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "modules.backend.externals.db")
        .unwrap()
        .clone();
    assert_eq!(db["action"], "pinned", "{db}");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    assert_eq!(
        updated(&sb),
        ["base-env"].iter().map(|s| s.to_string()).collect()
    );
    assert_eq!(
        sb.outputs("development", "modules.backend.externals.db")["host"],
        json!("pg2.dev.internal"),
        "the pinned database keeps its host"
    );
    let plan = sb.gitplane(&["plan", "--env", "development"]).ok();
    plan.stdout_has("pinned");
    plan.stdout_has("values.host: \"pg2.dev.internal\" -> \"pg3.dev.internal\"");

    // resolve takes the new values; the backend that reads the database follows.
    sb.gitplane(&[
        "resolve",
        "shop/postgres.default#modules.backend.externals.db",
        "--env",
        "development",
    ])
    .ok();
    assert_eq!(
        updated(&sb),
        ["modules.backend.externals.db", "modules.backend"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert_eq!(
        sb.outputs("development", "modules.backend.externals.db")["host"],
        json!("pg3.dev.internal")
    );
    assert_eq!(
        bound(&sb, "modules.backend.externals.db", "values.host"),
        json!("pg3.dev.internal")
    );
}
