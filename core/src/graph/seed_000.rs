//! Golden tests: every example of seed document 000 (Humanitec's Resource Graph), rebuilt step by
//! step with its definitions as the document writes them, asserting the exact nodes and edges.

use std::collections::{BTreeMap, BTreeSet};

use super::tests::files;
use super::*;
use crate::model;

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

/// Echo definitions for the types the document assumes exist.
const PLATFORM: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: base-env
entity:
  type: base-env
  driver_type: humanitec/echo
  driver_inputs:
    values: {pghost: db.internal, pgname: app, pgport: 5432}
    secrets: {pguser: app, pgpassword: s3cret}
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
";

const PLAIN_WORKLOAD: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: workload
entity:
  type: workload
  driver_type: humanitec/echo
  criteria:
    - app_id: example-app
";

const PLAIN_POSTGRES: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: postgres-plain
entity:
  type: postgres
  driver_type: humanitec/echo
  criteria:
    - app_id: example-app
";

/// Step 1 of the document: the PostgreSQL definition reads the base-env.
const POSTGRES_DEF: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: postgres-def
entity:
  type: postgres
  name: postgres-def
  driver_type: humanitec/postgres
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
  criteria:
  - app_id: example-app
";

/// Step 2: the workload runs under a service account.
const WORKLOAD_WITH_SA: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: workload-with-sa
entity:
  type: workload
  name: workload-with-sa
  driver_type: humanitec/echo
  driver_inputs:
    values:
      update:
      - op: add
        path: /spec/serviceAccountName
        value: ${resources.k8s-service-account.outputs.name}
  criteria:
  - app_id: example-app
";

const SERVICE_ACCOUNT: &str = "\
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
  criteria:
  - app_id: example-app
";

/// Step 3: an IAM policy co-provisioned with every PostgreSQL database.
const POSTGRES_DEF_WITH_POLICY: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: postgres-def
entity:
  type: postgres
  name: postgres-def
  driver_type: humanitec/postgres
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
";

const IAM_POLICY: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: iam-policy
entity:
  type: aws-policy
  name: iam-policy
  driver_type: my-org/aws-policy
  driver_inputs:
    values:
      db_name: ${resources.postgres.outputs.name}
  criteria:
  - app_id: example-app
";

/// Step 4: the service account references a role that selects the workload's policies.
const SERVICE_ACCOUNT_WITH_ROLE: &str = "\
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
";

const IAM_ROLE: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: iam-role
entity:
  type: aws-role
  name: iam-role
  driver_type: my-org/aws-role
  driver_inputs:
    values:
      arns: ${resources.workload>aws-policy.outputs.name}
  criteria:
  - app_id: example-app
";

const WL: &str = "workload#modules.my-workload";
const DB: &str = "postgres#modules.my-workload.externals.db";
const BASE: &str = "base-env#base-env";
const SA: &str = "k8s-service-account#modules.my-workload";
const POLICY: &str = "aws-policy#modules.my-workload.externals.db";
const ROLE: &str = "aws-role#modules.my-workload";

fn graph_of(definitions: &[&str]) -> ResourceGraph {
    let mut entries: Vec<(String, String)> = vec![
        ("environments/development.yaml".into(), ENVIRONMENT.into()),
        (
            "workloads/example-app/my-workload.yaml".into(),
            WORKLOAD.into(),
        ),
        ("definitions/platform.yaml".into(), PLATFORM.into()),
    ];
    for (i, d) in definitions.iter().enumerate() {
        entries.push((format!("definitions/step-{i}.yaml"), (*d).into()));
    }
    let refs: Vec<(&str, &str)> = entries
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let repo = model::load(&files(&refs)).unwrap_or_else(|e| panic!("{e:#?}"));
    build(&repo, &repo.environments[0]).unwrap_or_else(|e| panic!("{e:#?}"))
}

fn name(g: &ResourceGraph, id: &GuresId) -> String {
    let n = g.get(id).expect("a node");
    format!("{}#{}", n.res_type, n.res_id)
}

fn nodes(g: &ResourceGraph) -> BTreeSet<String> {
    g.nodes()
        .map(|n| format!("{}#{}", n.res_type, n.res_id))
        .collect()
}

fn edges(g: &ResourceGraph) -> BTreeSet<(String, String, EdgeKind)> {
    g.edges()
        .iter()
        .map(|e| (name(g, &e.from), name(g, &e.to), e.kind))
        .collect()
}

fn expect_nodes(g: &ResourceGraph, expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    assert_eq!(nodes(g), expected);
}

fn expect_edges(g: &ResourceGraph, expected: &[(&str, &str, EdgeKind)]) {
    let expected: BTreeSet<(String, String, EdgeKind)> = expected
        .iter()
        .map(|(a, b, k)| (a.to_string(), b.to_string(), *k))
        .collect();
    assert_eq!(edges(g), expected);
}

const IMPLICIT: [&str; 3] = [
    BASE,
    "k8s-cluster#k8s-cluster",
    "k8s-namespace#k8s-namespace",
];

#[test]
fn basic_graph_implicit_and_dependent_resources() {
    let g = graph_of(&[PLAIN_WORKLOAD, PLAIN_POSTGRES]);
    expect_nodes(&g, &[WL, DB, IMPLICIT[0], IMPLICIT[1], IMPLICIT[2]]);
    // base-env, k8s-cluster and k8s-namespace are unconnected.
    expect_edges(&g, &[(WL, DB, EdgeKind::Dependency)]);
}

#[test]
fn step_1_postgres_references_the_base_env() {
    let g = graph_of(&[PLAIN_WORKLOAD, POSTGRES_DEF]);
    expect_nodes(&g, &[WL, DB, IMPLICIT[0], IMPLICIT[1], IMPLICIT[2]]);
    expect_edges(
        &g,
        &[
            (WL, DB, EdgeKind::Dependency),
            (DB, BASE, EdgeKind::Reference),
        ],
    );
    let db = g.nodes().find(|n| n.res_type == "postgres").unwrap();
    assert_eq!(db.definition, "postgres-def");
    assert_eq!(db.driver_type, "humanitec/postgres");
}

#[test]
fn step_2_workload_gets_a_service_account_with_its_id() {
    let g = graph_of(&[WORKLOAD_WITH_SA, SERVICE_ACCOUNT, POSTGRES_DEF]);
    expect_nodes(&g, &[WL, DB, SA, IMPLICIT[0], IMPLICIT[1], IMPLICIT[2]]);
    expect_edges(
        &g,
        &[
            (WL, DB, EdgeKind::Dependency),
            (WL, SA, EdgeKind::Reference),
            (DB, BASE, EdgeKind::Reference),
        ],
    );
}

#[test]
fn step_3_policy_co_provisioned_with_match_dependents() {
    let g = graph_of(&[
        WORKLOAD_WITH_SA,
        SERVICE_ACCOUNT,
        POSTGRES_DEF_WITH_POLICY,
        IAM_POLICY,
    ]);
    expect_nodes(
        &g,
        &[WL, DB, SA, POLICY, IMPLICIT[0], IMPLICIT[1], IMPLICIT[2]],
    );
    expect_edges(
        &g,
        &[
            (WL, DB, EdgeKind::Dependency),
            (WL, SA, EdgeKind::Reference),
            // match_dependents: the workload depends on postgres, so on its policy too.
            (WL, POLICY, EdgeKind::Coprovision),
            (DB, BASE, EdgeKind::Reference),
            // The policy reads postgres (same id, no id in the reference).
            (POLICY, DB, EdgeKind::Reference),
        ],
    );
}

#[test]
fn step_4_role_selects_the_workloads_policies() {
    let g = graph_of(&[
        WORKLOAD_WITH_SA,
        SERVICE_ACCOUNT_WITH_ROLE,
        POSTGRES_DEF_WITH_POLICY,
        IAM_POLICY,
        IAM_ROLE,
    ]);
    expect_nodes(
        &g,
        &[
            WL,
            DB,
            SA,
            POLICY,
            ROLE,
            IMPLICIT[0],
            IMPLICIT[1],
            IMPLICIT[2],
        ],
    );
    expect_edges(
        &g,
        &[
            (WL, DB, EdgeKind::Dependency),
            (WL, SA, EdgeKind::Reference),
            (WL, POLICY, EdgeKind::Coprovision),
            (DB, BASE, EdgeKind::Reference),
            (POLICY, DB, EdgeKind::Reference),
            (SA, ROLE, EdgeKind::Reference),
            (ROLE, POLICY, EdgeKind::Selector),
        ],
    );
    let role = g.nodes().find(|n| n.res_type == "aws-role").unwrap();
    assert_eq!(
        selections(&g, role),
        [("workload>aws-policy".to_owned(), vec![POLICY.to_owned()])]
    );
}

/// Every selector of a node: as written, and what it selected.
fn selections(g: &ResourceGraph, node: &ResourceNode) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    node.values
        .clone()
        .for_each_expr_mut(&mut |b: &mut Binding| {
            if let Binding::Selector {
                written, targets, ..
            } = b
            {
                out.push((
                    written.clone(),
                    targets.iter().map(|id| name(g, id)).collect(),
                ));
            }
        });
    out
}

const ROUTES_WORKLOAD: &str = "\
apiVersion: score.dev/v1b1
metadata:
  name: web
containers:
  main:
    image: x
resources:
  gw:
    type: gateway
  dns:
    type: dns
    id: dns
  b-route:
    type: route
  a-route:
    type: route
";

fn echo(id: &str, res_type: &str, values: &str) -> String {
    format!(
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
         type: {res_type}\n  driver_type: echo\n  driver_inputs:\n    values:\n{values}  criteria:\n  - {{}}\n"
    )
}

fn routes_graph(route_values: &str) -> Result<ResourceGraph, Vec<BuildError>> {
    routes_graph_with(route_values, ROUTES_WORKLOAD)
}

fn routes_graph_with(route_values: &str, workload: &str) -> Result<ResourceGraph, Vec<BuildError>> {
    let mut entries: BTreeMap<String, Vec<u8>> = files(&[
        (
            "environments/development.yaml",
            "type: development\nimplicit_resources: []\n",
        ),
        ("workloads/app/web.yaml", workload),
    ]);
    for (path, text) in [
        (
            "definitions/workload.yaml",
            echo("workload", "workload", "      a: 1\n"),
        ),
        (
            "definitions/dns.yaml",
            echo("dns", "dns", "      host: example.com\n"),
        ),
        (
            "definitions/route.yaml",
            echo("route", "route", route_values),
        ),
        (
            "definitions/gateway.yaml",
            echo(
                "gateway",
                "gateway",
                "      paths: ${resources['dns#shared.dns<route'].outputs.path}\n",
            ),
        ),
    ] {
        entries.insert(path.into(), text.into_bytes());
    }
    let repo = model::load(&entries).unwrap_or_else(|e| panic!("{e:#?}"));
    build(&repo, &repo.environments[0])
}

#[test]
fn dependents_selector_selects_routes_in_res_id_order() {
    let g = routes_graph(
        "      host: ${resources.dns#shared.dns.outputs.host}\n      path: /${context.res.id}\n",
    )
    .unwrap();
    let a = "route#modules.web.externals.a-route";
    let b = "route#modules.web.externals.b-route";
    let gw = "gateway#modules.web.externals.gw";
    expect_edges(
        &g,
        &[
            ("workload#modules.web", gw, EdgeKind::Dependency),
            (
                "workload#modules.web",
                "dns#shared.dns",
                EdgeKind::Dependency,
            ),
            ("workload#modules.web", a, EdgeKind::Dependency),
            ("workload#modules.web", b, EdgeKind::Dependency),
            (a, "dns#shared.dns", EdgeKind::Reference),
            (b, "dns#shared.dns", EdgeKind::Reference),
            (gw, a, EdgeKind::Selector),
            (gw, b, EdgeKind::Selector),
        ],
    );
    let gateway = g.nodes().find(|n| n.res_type == "gateway").unwrap();
    assert_eq!(
        selections(&g, gateway),
        [(
            "dns#shared.dns<route".to_owned(),
            vec![a.to_owned(), b.to_owned()]
        )],
        "ordered by res_id"
    );
}

#[test]
fn selector_with_nothing_to_select_is_an_empty_array() {
    // No route reads the dns, so none depends on it.
    let g = routes_graph("      path: /x\n").unwrap();
    let gateway = g.nodes().find(|n| n.res_type == "gateway").unwrap();
    assert_eq!(
        selections(&g, gateway),
        [("dns#shared.dns<route".to_owned(), vec![])]
    );
    assert!(g.edges().iter().all(|e| e.kind != EdgeKind::Selector));
    let inputs = crate::plan::resolve_inputs(gateway, &std::collections::HashMap::new()).unwrap();
    assert_eq!(inputs.values, serde_json::json!({"paths": []}));
}

#[test]
fn selector_never_adds_a_resource() {
    let without_dns = ROUTES_WORKLOAD.replace("  dns:\n    type: dns\n    id: dns\n", "");
    let errors = routes_graph_with("      path: /x\n", &without_dns).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        "definitions/gateway.yaml:10: the selector 'dns#shared.dns<route' of \
         app/gateway.default#modules.web.externals.gw names a resource that is not in the graph: \
         selectors add edges, never resources"
    );
}

#[test]
fn a_loop_through_a_selector_edge_is_reported() {
    let errors = routes_graph(
        "      host: ${resources.dns#shared.dns.outputs.host}\n      gw: ${resources.gateway#modules.web.externals.gw.outputs.paths}\n",
    )
    .unwrap_err();
    let msg = errors[0].to_string();
    assert!(msg.starts_with("dependency loop: "), "{msg}");
    assert!(
        msg.contains("app/gateway.default#modules.web.externals.gw"),
        "{msg}"
    );
    assert!(
        msg.contains("app/route.default#modules.web.externals.a-route"),
        "{msg}"
    );
}
