//! Files written for other Score and Humanitec tools load unchanged and mean what those tools
//! document: older Score's `${externals.NAME.OUTPUT}` and `properties`, a volume `source` that
//! names the whole resource, HPO's reads without `.outputs` (`.guresid`, `.values`,
//! `.secrets`), `${context.org.id}`, `criteria: {}`, and `secret_refs` that name no store.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::util::{Sandbox, rows_of};

const SETTINGS: &str = "\
# Humanitec's placeholders read the organisation; gitplane has one per repository.
org: acme
";

const ENVIRONMENT: &str = "type: development\nimplicit_resources: [base-env]\n";

/// A workload as score-humanitec users wrote them before Score had `params`.
const API: &str = "\
# Written for score-humanitec.
apiVersion: score.dev/v1b1
metadata:
  name: api
containers:
  api:
    image: registry.example.com/legacy/api:2.3.1
    variables:
      DB_HOST: ${externals.db.host}
      DB_PORT: ${resources.db.port}
      DB_NAME: ${resources.db.name}
      PUBLIC_URL: https://${resources.dns.host}/
    volumes:
      - source: ${resources.data}
        target: /var/lib/api
resources:
  db:
    type: postgres
    properties:
      host:
      port:
        type: integer
        default: 5432
      name:
        default: api
        required: false
  data:
    type: volume
  dns:
    type: dns
";

const PLATFORM: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: base-env
entity:
  name: base-env
  type: base-env
  driver_type: humanitec/echo
  driver_inputs:
    values:
      namespace: ${context.org.id}-${context.app.id}-${context.env.id}
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: workload
entity:
  name: workload
  type: workload
  driver_type: humanitec/echo
  driver_inputs:
    values:
      namespace: ${resources.base-env#base-env.outputs.namespace}
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: k8s-cluster
entity:
  name: k8s-cluster
  type: k8s-cluster
  driver_type: humanitec/echo
  driver_inputs:
    values: {name: dev-cluster, region: eu-west-1}
  criteria:
    - {}
";

/// The database's password comes from the host's default store; an export-style definition
/// with `criteria: {}` matches nothing and is simply there.
const DATA: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: postgres
entity:
  name: postgres
  type: postgres
  driver_type: humanitec/echo
  driver_inputs:
    values:
      host: db.${context.env.id}.internal
      port: 5433
    secret_refs:
      password:
        ref: postgres/password
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: volume
entity:
  name: volume
  type: volume
  driver_type: humanitec/echo
  driver_inputs:
    values:
      type: volume
      source: ${context.org.id}-${context.app.id}-data
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
metadata:
  id: unused-bucket
entity:
  criteria: {}
  driver_inputs:
    values:
      bucket: example
  driver_type: humanitec/echo
  name: unused-bucket
  type: s3
kind: Definition
";

/// The ingress reads its DNS the ways Humanitec's example library does.
const DNS: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: dns
entity:
  name: dns
  type: dns
  driver_type: humanitec/echo
  driver_inputs:
    values:
      host: ${context.app.id}.${context.env.id}.example.com
    secrets:
      token: dns-api-token-7f3a
  provision:
    ingress: {}
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: ingress
entity:
  name: ingress
  type: ingress
  driver_type: humanitec/echo
  driver_inputs:
    values:
      host: ${resources.dns.values.host}
      # Unique per DNS, so cert-manager's secret is too.
      tls_secret_name: tls-cert-${resources.dns.guresid}
      cluster: ${resources[\"k8s-cluster.default#k8s-cluster\"].values}
    secrets:
      dns_token: ${resources['dns.default#modules.api.externals.dns'].secrets.token}
  criteria:
    - {}
";

const DB_PASSWORD: &str = "pg-s3cret-41c9";
const DNS_TOKEN: &str = "dns-api-token-7f3a";

/// The repository above committed, and a host config whose stores are `stores` (one line per
/// store, `{dir}` replaced by the secrets folder), with the password in that folder.
fn platform(stores: &[&str]) -> (Sandbox, PathBuf) {
    let sb = Sandbox::new();
    for (path, text) in [
        ("gitplane.yaml", SETTINGS),
        ("environments/development.yaml", ENVIRONMENT),
        ("workloads/legacy/api.yaml", API),
        ("definitions/platform.yaml", PLATFORM),
        ("definitions/data.yaml", DATA),
        ("definitions/dns.yaml", DNS),
    ] {
        sb.write(path, text);
    }
    sb.commit("Files from the public examples' era");
    let secrets = sb.root.join("secrets");
    std::fs::create_dir_all(secrets.join("postgres")).unwrap();
    std::fs::write(
        secrets.join("postgres/password"),
        format!("{DB_PASSWORD}\n"),
    )
    .unwrap();
    let config = sb.root.join("host.yaml");
    let mut text = "secret_stores:\n".to_owned();
    for store in stores {
        text.push_str(&format!(
            "  {}\n",
            store.replace("{dir}", &secrets.display().to_string())
        ));
    }
    std::fs::write(&config, text).unwrap();
    (sb, config)
}

/// `type#res_id` of the resource `column` names.
fn name_sql(column: &str) -> String {
    format!("(SELECT type || '#' || res_id FROM resource WHERE guresid = {column})")
}

fn guresid(sb: &Sandbox, res_type: &str) -> String {
    sb.column(&format!(
        "SELECT guresid FROM resource WHERE type = '{res_type}'"
    ))
    .pop()
    .unwrap_or_else(|| panic!("no {res_type} recorded"))
}

fn inputs(sb: &Sandbox, res_type: &str) -> Value {
    let text = sb
        .column(&format!(
            "SELECT inputs FROM resource WHERE type = '{res_type}'"
        ))
        .pop()
        .unwrap_or_else(|| panic!("no {res_type} recorded"));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn older_score_and_hpo_forms_validate_plan_and_apply() {
    let (sb, config) = platform(&["files: {dir: {dir}}"]);
    let config = config.to_str().unwrap();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--config", config]);
        sb.gitplane(&all)
    };
    run(&["validate"])
        .ok()
        .stdout_has("development (7 resources, 6 edges)");
    let plan = run(&["plan"]).ok();
    plan.stdout_has("create");
    plan.hides(&[DB_PASSWORD, DNS_TOKEN]);
    run(&["apply"]).ok().hides(&[DB_PASSWORD, DNS_TOKEN]);

    // Every resource, the export-style definition with `criteria: {}` matching none.
    assert_eq!(
        sb.res_ids("development"),
        crate::util::set([
            "base-env",
            "k8s-cluster",
            "modules.api",
            "modules.api.externals.data",
            "modules.api.externals.db",
            "modules.api.externals.dns",
        ])
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 's3'"),
        0
    );

    // `${context.org.id}` is the repository's org.
    assert_eq!(
        sb.outputs("development", "base-env")["namespace"],
        "acme-legacy-development"
    );

    // The workload's Score file as its driver received it.
    let score = &inputs(&sb, "workload")["resource"];
    assert_eq!(
        score["containers"]["api"]["variables"],
        json!({
            "DB_HOST": "db.development.internal",
            "DB_PORT": 5433,
            // The database gives no `name`: the property's default fills it.
            "DB_NAME": "api",
            "PUBLIC_URL": "https://legacy.development.example.com/",
        })
    );
    // The whole volume resource: its outputs, what score-compose mounts from.
    assert_eq!(
        score["containers"]["api"]["volumes"][0]["source"],
        json!({"type": "volume", "source": "acme-legacy-data"})
    );

    // The ingress: the DNS's GUResID, its plain output and the cluster's plain outputs.
    let dns = guresid(&sb, "dns");
    let ingress_outputs: Value =
        serde_json::from_str(&sb.column("SELECT outputs FROM resource WHERE type = 'ingress'")[0])
            .unwrap();
    assert_eq!(
        ingress_outputs,
        json!({
            "host": "legacy.development.example.com",
            "tls_secret_name": format!("tls-cert-{dns}"),
            "cluster": {"name": "dev-cluster", "region": "eu-west-1"},
        })
    );
    // `.secrets.token` reached the ingress's secrets, and only there.
    let ingress_id = guresid(&sb, "ingress");
    assert_eq!(
        sb.unsealed(&format!(
            "SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret \
             WHERE guresid = '{ingress_id}'"
        )),
        [format!("{{\"dns_token\":\"{DNS_TOKEN}\"}}")]
    );
    // The password came from the only store, the default.
    let db = guresid(&sb, "postgres");
    assert_eq!(
        sb.unsealed(&format!(
            "SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret \
             WHERE guresid = '{db}'"
        )),
        [format!("{{\"password\":\"{DB_PASSWORD}\"}}")]
    );
    sb.assert_state_bytes_hide(&[DB_PASSWORD, DNS_TOKEN]);

    // The edges: each new form adds the reference `.outputs` would.
    let edges: BTreeSet<Vec<String>> = sb
        .rows(&format!(
            "SELECT {}, {}, kind FROM edge",
            name_sql("from_guresid"),
            name_sql("to_guresid")
        ))
        .into_iter()
        .collect();
    let expected: BTreeSet<Vec<String>> = rows_of(&[
        ["workload#modules.api", "base-env#base-env", "reference"],
        [
            "workload#modules.api",
            "postgres#modules.api.externals.db",
            "reference",
        ],
        [
            "workload#modules.api",
            "volume#modules.api.externals.data",
            "reference",
        ],
        [
            "workload#modules.api",
            "dns#modules.api.externals.dns",
            "reference",
        ],
        [
            "ingress#modules.api.externals.dns",
            "dns#modules.api.externals.dns",
            "reference",
        ],
        [
            "ingress#modules.api.externals.dns",
            "k8s-cluster#k8s-cluster",
            "reference",
        ],
    ]);
    assert_eq!(edges, expected);

    // The bindings: one per placeholder, named after what it reads.
    let bindings: BTreeSet<Vec<String>> = sb
        .rows(&format!(
            "SELECT {}, needed_path, {}, provided_path, data_type, value, secret FROM binding",
            name_sql("needed_guresid"),
            name_sql("provided_guresid")
        ))
        .into_iter()
        .collect();
    let w = "workload#modules.api";
    let i = "ingress#modules.api.externals.dns";
    let pg = "postgres#modules.api.externals.db";
    let dns_name = "dns#modules.api.externals.dns";
    let quoted_dns = format!("\"{dns}\"");
    let expected: BTreeSet<Vec<String>> = rows_of(&[
        [
            w,
            "values.namespace",
            "base-env#base-env",
            "outputs.namespace",
            "string",
            "\"acme-legacy-development\"",
            "0",
        ],
        [
            w,
            "resource.containers.api.variables.DB_HOST",
            pg,
            "outputs.host",
            "string",
            "\"db.development.internal\"",
            "0",
        ],
        [
            w,
            "resource.containers.api.variables.DB_PORT",
            pg,
            "outputs.port",
            "int",
            "5433",
            "0",
        ],
        [
            w,
            "resource.containers.api.variables.DB_NAME",
            pg,
            "outputs.name",
            "string",
            "\"api\"",
            "0",
        ],
        [
            w,
            "resource.containers.api.variables.PUBLIC_URL",
            dns_name,
            "outputs.host",
            "string",
            "\"legacy.development.example.com\"",
            "0",
        ],
        [
            w,
            "resource.containers.api.volumes[0].source",
            "volume#modules.api.externals.data",
            "values",
            "json",
            r#"{"source":"acme-legacy-data","type":"volume"}"#,
            "0",
        ],
        [
            i,
            "values.host",
            dns_name,
            "values.host",
            "string",
            "\"legacy.development.example.com\"",
            "0",
        ],
        [
            i,
            "values.tls_secret_name",
            dns_name,
            "guresid",
            "string",
            quoted_dns.as_str(),
            "0",
        ],
        [
            i,
            "values.cluster",
            "k8s-cluster#k8s-cluster",
            "values",
            "json",
            r#"{"name":"dev-cluster","region":"eu-west-1"}"#,
            "0",
        ],
        [
            i,
            "secrets.dns_token",
            dns_name,
            "secrets.token",
            "string",
            "NULL",
            "1",
        ],
    ]);
    assert_eq!(bindings, expected);

    // `explain` says where each comes from: the GUResID itself, and the default store.
    let explain = |resource: &str| {
        run(&["explain", resource, "--format", "json"]).ok().json()["inputs"]
            .as_array()
            .unwrap()
            .clone()
    };
    let input = |inputs: &[Value], path: &str| -> Value {
        inputs
            .iter()
            .find(|i| i["path"] == path)
            .unwrap_or_else(|| panic!("no input {path} in {inputs:#?}"))["from"][0]
            .clone()
    };
    let tls = input(
        &explain("legacy/ingress.default#modules.api.externals.dns"),
        "values.tls_secret_name",
    );
    assert_eq!(
        (&tls["output"], &tls["provider"], &tls["value"]),
        (&json!("guresid"), &json!(dns), &json!(dns))
    );
    let password = input(
        &explain("legacy/postgres.default#modules.api.externals.db"),
        "secrets.password",
    );
    assert_eq!(
        (&password["store"], &password["ref"], &password["value"]),
        (&Value::Null, &json!("postgres/password"), &Value::Null)
    );

    // Nothing moves on a second apply: the new forms resolve to the same values.
    run(&["apply"])
        .ok()
        .stdout_has("0 created, 0 updated, 0 deleted, 7 unchanged, 0 failed");
}

#[test]
fn refs_without_a_store_read_the_primary_store() {
    let (sb, config) = platform(&[
        "elsewhere: {dir: /nonexistent/gitplane-test}",
        "files: {dir: {dir}, primary: true}",
    ]);
    let config = config.to_str().unwrap();
    sb.gitplane(&["apply", "--config", config])
        .ok()
        .hides(&[DB_PASSWORD]);
    let db = guresid(&sb, "postgres");
    assert_eq!(
        sb.unsealed(&format!(
            "SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret \
             WHERE guresid = '{db}'"
        )),
        [format!("{{\"password\":\"{DB_PASSWORD}\"}}")]
    );
}

#[test]
fn refs_without_a_store_need_a_default_store() {
    let (sb, config) = platform(&[
        "elsewhere: {dir: /nonexistent/gitplane-test}",
        "files: {dir: {dir}}",
    ]);
    let config = config.to_str().unwrap();
    // `ref: postgres/password` is line 15 of definitions/data.yaml.
    let expected = "definitions/data.yaml:15: secret_refs: this ref names no store, so it is \
                    read from the host's default secret store, but the host config marks none \
                    of its stores (elsewhere, files) as the default: add `primary: true` to one \
                    of them under secret_stores in the host config";
    sb.gitplane(&["validate", "--config", config])
        .fails()
        .stderr_has(expected);
    sb.gitplane(&["apply", "--config", config])
        .fails()
        .stderr_has(expected)
        .hides(&[DB_PASSWORD]);
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 0);
    assert_eq!(sb.count("SELECT COUNT(*) FROM operation"), 0);
}

/// Older Score's `secret: true` on a property: what reads it is kept as a secret, though the
/// database gives the output as a plain value.
#[test]
fn a_property_declared_secret_is_kept_secret() {
    let (sb, config) = platform(&["files: {dir: {dir}}"]);
    sb.write(
        "workloads/legacy/worker.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: worker\ncontainers:\n  worker:\n    \
         image: registry.example.com/legacy/worker:2.3.1\n    variables:\n      \
         DB_HOST: ${externals.db.host}\nresources:\n  db:\n    type: postgres\n    \
         properties:\n      host:\n        secret: true\n",
    );
    sb.commit("A worker that keeps its database's host to itself");
    sb.gitplane(&["apply", "--config", config.to_str().unwrap()])
        .ok();
    let worker = sb
        .column("SELECT guresid FROM resource WHERE res_id = 'modules.worker'")
        .pop()
        .unwrap();
    let public: Value = serde_json::from_str(
        &sb.column(&format!(
            "SELECT inputs FROM resource WHERE guresid = '{worker}'"
        ))[0],
    )
    .unwrap();
    assert!(public.get("resource").is_none(), "{public}");
    assert_eq!(
        sb.rows(&format!(
            "SELECT provided_path, value, secret FROM binding \
             WHERE needed_guresid = '{worker}' AND needed_path LIKE 'resource.%'"
        )),
        [["outputs.host", "NULL", "1"]]
    );
    let sealed = sb.unsealed(&format!(
        "SELECT inputs, 'resource_secret.inputs:' || guresid FROM resource_secret \
         WHERE guresid = '{worker}'"
    ));
    let sealed: Value = serde_json::from_str(&sealed[0]).unwrap();
    assert_eq!(
        sealed["resource"]["containers"]["worker"]["variables"]["DB_HOST"],
        "db.development.internal"
    );
}
