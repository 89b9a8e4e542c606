//! Graph building tested on plain files, no git and no state.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::model;

/// Files by path, as a commit would hold them.
pub(crate) fn files(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    entries
        .iter()
        .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
        .collect()
}

pub(crate) use crate::plan::test_support::template_files;

fn build_env(
    files: &BTreeMap<String, Vec<u8>>,
    env: &str,
) -> Result<ResourceGraph, Vec<BuildError>> {
    let repo = model::load(files).unwrap_or_else(|e| panic!("load failed: {e:#?}"));
    let env = repo
        .environments
        .iter()
        .find(|e| e.id == env)
        .unwrap_or_else(|| panic!("no environment {env}"));
    build(&repo, env)
}

/// Nodes as `type#res_id` and edges as `type#res_id -> type#res_id (kind)`.
fn shape(g: &ResourceGraph) -> (BTreeSet<String>, BTreeSet<String>) {
    let name = |id: &GuresId| {
        let n = g.get(id).expect("edge ends are nodes");
        format!("{}#{}", n.res_type, n.res_id)
    };
    let nodes = g
        .nodes()
        .map(|n| format!("{}#{}", n.res_type, n.res_id))
        .collect();
    let edges = g
        .edges()
        .iter()
        .map(|e| format!("{} -> {} ({})", name(&e.from), name(&e.to), e.kind))
        .collect();
    (nodes, edges)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const ENV: &str = "type: development\n";

fn definition(id: &str, res_type: &str, inputs: &str, extra: &str) -> String {
    format!(
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
         type: {res_type}\n  driver_type: echo\n  driver_inputs:\n    values:\n{inputs}{extra}  criteria:\n    - {{}}\n"
    )
}

fn workload(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: {name}\ncontainers:\n  main:\n    image: x\nresources:\n{resources}"
    )
}

#[test]
fn repo_template_graph_has_the_expected_nodes_and_edges() {
    let g = build_env(&template_files(), "development").unwrap();
    let (nodes, edges) = shape(&g);
    assert_eq!(
        nodes,
        set(&[
            "base-env#base-env",
            "dns#modules.frontend.externals.dns",
            "postgres#modules.backend.externals.db",
            "redis#shared.cache",
            "workload#modules.backend",
            "workload#modules.frontend",
        ])
    );
    assert_eq!(
        edges,
        set(&[
            "dns#modules.frontend.externals.dns -> base-env#base-env (reference)",
            "postgres#modules.backend.externals.db -> base-env#base-env (reference)",
            "redis#shared.cache -> base-env#base-env (reference)",
            "workload#modules.backend -> postgres#modules.backend.externals.db (reference)",
            "workload#modules.backend -> redis#shared.cache (reference)",
            "workload#modules.frontend -> dns#modules.frontend.externals.dns (reference)",
            "workload#modules.frontend -> redis#shared.cache (reference)",
        ])
    );
    let pg = |env: &str| {
        let g = build_env(&template_files(), env).unwrap();
        g.nodes()
            .find(|n| n.res_type == "postgres")
            .unwrap()
            .definition
            .clone()
    };
    assert_eq!(pg("development"), "postgres-dev");
    assert_eq!(pg("production"), "postgres-prod");
}

#[test]
fn provisioning_order_respects_every_edge() {
    let g = build_env(&template_files(), "production").unwrap();
    let order: Vec<&GuresId> = g.provisioning_order().map(|n| &n.guresid).collect();
    assert_eq!(order.len(), g.len());
    for e in g.edges() {
        let from = order.iter().position(|id| **id == e.from).unwrap();
        let to = order.iter().position(|id| **id == e.to).unwrap();
        assert!(to < from, "{} must come before {}", e.to, e.from);
    }
}

#[test]
fn class_and_id_propagate_from_the_referencing_resource() {
    let files = files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/app/web.yaml",
            &workload("web", "  db:\n    type: postgres\n    class: large\n"),
        ),
        ("definitions/wl.yaml", &definition("wl", "workload", "      a: 1\n", "")),
        (
            "definitions/pg.yaml",
            &format!(
                "{}---\n{}",
                // Matches class large only.
                definition(
                    "pg",
                    "postgres",
                    "      sa: ${resources.service-account.outputs.name}\n      env: ${resources.base-env#base-env.outputs.x}\n",
                    ""
                )
                .replace("- {}", "- {class: large}"),
                definition("sa", "service-account", "      name: x\n", "").replace("- {}", "- {class: large}"),
            ),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      x: 1\n", "").replace("- {}", "- {class: large}\n    - {}"),
        ),
    ]);
    let g = build_env(&files, "development").unwrap();
    let labels: BTreeSet<String> = g.nodes().map(ResourceNode::label).collect();
    assert!(
        labels.contains("app/service-account.large#modules.web.externals.db"),
        "class and id propagate: {labels:?}"
    );
    assert!(
        labels.contains("app/base-env.large#base-env"),
        "class propagates, id given: {labels:?}"
    );
    assert!(
        labels.contains("app/base-env.default#base-env"),
        "the implicit base-env: {labels:?}"
    );
}

#[test]
fn shared_resources_are_one_node_per_app() {
    let files = files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/a/one.yaml",
            &workload("one", "  q:\n    type: queue\n    id: jobs\n"),
        ),
        (
            "workloads/a/two.yaml",
            &workload("two", "  q:\n    type: queue\n    id: jobs\n"),
        ),
        (
            "workloads/b/three.yaml",
            &workload("three", "  q:\n    type: queue\n    id: jobs\n"),
        ),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/q.yaml",
            &definition("q", "queue", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
    ]);
    let g = build_env(&files, "development").unwrap();
    let queues: Vec<String> = g
        .nodes()
        .filter(|n| n.res_type == "queue")
        .map(ResourceNode::label)
        .collect();
    assert_eq!(queues.len(), 2, "{queues:?}");
    assert!(queues.contains(&"a/queue.default#shared.jobs".to_owned()));
    assert!(queues.contains(&"b/queue.default#shared.jobs".to_owned()));
}

/// The three co-provisioning figures of seed document 000: P depends on R, R co-provisions N.
#[test]
fn co_provisioning_figures() {
    let case = |n_inputs: &str, flags: &str| {
        let files = files(&[
            (
                "environments/development.yaml",
                "type: development\nimplicit_resources: []\n",
            ),
            (
                "workloads/app/p.yaml",
                &workload("p", "  r:\n    type: r\n"),
            ),
            (
                "definitions/wl.yaml",
                &definition("wl", "workload", "      a: 1\n", ""),
            ),
            (
                "definitions/r.yaml",
                &definition(
                    "r",
                    "r",
                    "      a: 1\n",
                    &format!("  provision:\n    n:\n{flags}"),
                ),
            ),
            ("definitions/n.yaml", &definition("n", "n", n_inputs, "")),
        ]);
        shape(&build_env(&files, "development").unwrap()).1
    };
    // Figure 1: no additional links.
    assert_eq!(
        case("      a: 1\n", "      is_dependent: false\n"),
        set(&["workload#modules.p -> r#modules.p.externals.r (dependency)"])
    );
    // Figure 2: N references R.
    assert_eq!(
        case(
            "      a: ${resources.r.outputs.a}\n",
            "      match_dependents: false\n"
        ),
        set(&[
            "n#modules.p.externals.r -> r#modules.p.externals.r (reference)",
            "workload#modules.p -> r#modules.p.externals.r (dependency)",
        ])
    );
    // Figure 3: N references R and matches R's dependents.
    assert_eq!(
        case(
            "      a: ${resources.r.outputs.a}\n",
            "      match_dependents: true\n"
        ),
        set(&[
            "n#modules.p.externals.r -> r#modules.p.externals.r (reference)",
            "workload#modules.p -> n#modules.p.externals.r (coprovision)",
            "workload#modules.p -> r#modules.p.externals.r (dependency)",
        ])
    );
    // is_dependent adds the edge even without a reference.
    assert_eq!(
        case("      a: 1\n", "      is_dependent: true\n"),
        set(&[
            "n#modules.p.externals.r -> r#modules.p.externals.r (coprovision)",
            "workload#modules.p -> r#modules.p.externals.r (dependency)",
        ])
    );
}

#[test]
fn co_provisioned_resources_get_class_id_and_params() {
    let files = files(&[
        ("environments/development.yaml", "type: development\nimplicit_resources: []\n"),
        ("workloads/app/p.yaml", &workload("p", "  r:\n    type: r\n    class: big\n")),
        ("definitions/wl.yaml", &definition("wl", "workload", "      a: 1\n", "")),
        (
            "definitions/r.yaml",
            &definition(
                "r",
                "r",
                "      a: 1\n",
                "  provision:\n    n:\n      params: {size: 3}\n    m.small#common:\n      is_dependent: true\n",
            )
            .replace("- {}", "- {class: big}"),
        ),
        ("definitions/n.yaml", &definition("n", "n", "      a: 1\n", "").replace("- {}", "- {class: big}")),
        ("definitions/m.yaml", &definition("m", "m", "      a: 1\n", "").replace("- {}", "- {class: small}")),
    ]);
    let g = build_env(&files, "development").unwrap();
    let n = g.nodes().find(|n| n.res_type == "n").unwrap();
    assert_eq!(
        n.label(),
        "app/n.big#modules.p.externals.r",
        "class and id of the co-provisioning resource"
    );
    assert_eq!(
        n.params,
        crate::model::template::Template::Value(serde_json::json!({"size": 3}))
    );
    let m = g.nodes().find(|n| n.res_type == "m").unwrap();
    assert_eq!(
        m.label(),
        "app/m.small#common",
        "class and id from the provision key"
    );
    assert!(matches!(*m.origin, Origin::Coprovisioned { ref definition, .. } if definition == "r"));
}

#[test]
fn a_loop_names_every_resource_on_it() {
    let files = files(&[
        (
            "environments/development.yaml",
            "type: development\nimplicit_resources: []\n",
        ),
        (
            "workloads/app/web.yaml",
            &workload("web", "  x:\n    type: a\n"),
        ),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/a.yaml",
            &definition("def-a", "a", "      v: ${resources.b.outputs.v}\n", ""),
        ),
        (
            "definitions/b.yaml",
            &definition("def-b", "b", "      v: ${resources.c.outputs.v}\n", ""),
        ),
        (
            "definitions/c.yaml",
            &definition("def-c", "c", "      v: ${resources.a.outputs.v}\n", ""),
        ),
    ]);
    let errors = build_env(&files, "development").unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let msg = errors[0].to_string();
    assert!(msg.starts_with("dependency loop: "), "{msg}");
    for needle in [
        "app/a.default#modules.web.externals.x (definition 'def-a' in definitions/a.yaml:4)",
        "app/b.default#modules.web.externals.x (definition 'def-b'",
        "app/c.default#modules.web.externals.x (definition 'def-c'",
    ] {
        assert!(msg.contains(needle), "{needle} missing in {msg}");
    }
}

#[test]
fn no_match_names_the_requesting_line_and_candidates() {
    let files = files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/app/web.yaml",
            &workload("web", "  db:\n    type: postgres\n"),
        ),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
        (
            "definitions/pg.yaml",
            &definition("pg-prod", "postgres", "      a: 1\n", "")
                .replace("- {}", "- env_type: production"),
        ),
    ]);
    let errors = build_env(&files, "development").unwrap_err();
    let msg = errors[0].to_string();
    assert!(msg.starts_with("workloads/app/web.yaml:8: no definition of type 'postgres' matches app/postgres.default#modules.web.externals.db"), "{msg}");
    assert!(
        msg.contains(
            "closest candidates: pg-prod (env_type is development, the rule wants production)"
        ),
        "{msg}"
    );
}

#[test]
fn score_placeholders_must_name_declared_resources_and_metadata() {
    let files = files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/app/web.yaml",
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n    \
             variables:\n      A: ${resources.nope.host}\n      B: ${metadata.team}\n",
        ),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
    ]);
    let errors: Vec<String> = build_env(&files, "development")
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errors,
        vec![
            "workloads/app/web.yaml:8: workload 'web' reads '${resources.nope...}', but its resources section declares no 'nope'".to_owned(),
            "workloads/app/web.yaml:9: workload 'web' reads '${metadata.team}', which is not set".to_owned(),
        ]
    );
}

#[test]
fn shared_resource_with_different_params_is_ambiguous() {
    let files = files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/app/one.yaml",
            &workload(
                "one",
                "  q:\n    type: queue\n    id: jobs\n    params: {size: 1}\n",
            ),
        ),
        (
            "workloads/app/two.yaml",
            &workload(
                "two",
                "  q:\n    type: queue\n    id: jobs\n    params: {size: 2}\n",
            ),
        ),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/q.yaml",
            &definition("q", "queue", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
    ]);
    let msg = build_env(&files, "development").unwrap_err()[0].to_string();
    assert!(
        msg.contains("requested with different params by workloads 'one' and 'two'"),
        "{msg}"
    );
}

#[test]
fn graph_json_has_the_documented_shape() {
    let g = build_env(&template_files(), "development").unwrap();
    let json = to_json(&g, "abc");
    assert_eq!(json["env"], "development");
    assert_eq!(json["commit"], "abc");
    let node = &json["nodes"][0];
    let mut keys: Vec<&str> = node
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "app",
            "class",
            "definition",
            "driver",
            "guresid",
            "id",
            "type"
        ]
    );
    let edge = &json["edges"][0];
    let mut keys: Vec<&str> = edge
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(keys, ["from", "kind", "to"]);
}

/// Outputs by label (`type#res_id`), for resolving a graph's placeholders without state.
fn upstream(
    g: &ResourceGraph,
    outputs: &[(&str, serde_json::Value, serde_json::Value)],
) -> std::collections::HashMap<GuresId, (serde_json::Value, serde_json::Value, String)> {
    outputs
        .iter()
        .map(|(name, values, secrets)| {
            let node = g
                .nodes()
                .find(|n| format!("{}#{}", n.res_type, n.res_id) == *name)
                .unwrap_or_else(|| panic!("no node {name}"));
            (
                node.guresid.clone(),
                (values.clone(), secrets.clone(), node.label()),
            )
        })
        .collect()
}

fn node<'g>(g: &'g ResourceGraph, name: &str) -> &'g ResourceNode {
    g.nodes()
        .find(|n| format!("{}#{}", n.res_type, n.res_id) == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

/// `${resources.X.guresid}`, `.values[.NAME]` and `.secrets.NAME`, as Humanitec's example
/// library writes them: the same resources and reference edges as `.outputs`, bindings named
/// after what they read, and the meaning HPO gives each.
#[test]
fn hpo_reads_without_outputs_reference_their_resources() {
    let ingress = "      tls_secret_name: tls-cert-${resources.dns.guresid}\n      \
                   host: ${resources['dns.default#modules.web.externals.dns'].values.host}\n      \
                   cluster: ${resources[\"k8s-cluster.default#k8s-cluster\"].values}\n    \
                   secrets:\n      token: ${resources.dns.secrets.token}\n";
    let files = files_with_ingress_values(ingress);
    let g = build_env(&files, "development").unwrap();
    let (_, edges) = shape(&g);
    for edge in [
        "ingress#modules.web.externals.dns -> dns#modules.web.externals.dns (reference)",
        "ingress#modules.web.externals.dns -> k8s-cluster#k8s-cluster (reference)",
    ] {
        assert!(edges.contains(edge), "{edge} not in {edges:#?}");
    }
    let dns = node(&g, "dns#modules.web.externals.dns").guresid.clone();
    let ingress = node(&g, "ingress#modules.web.externals.dns");
    let outputs = upstream(
        &g,
        &[
            (
                "dns#modules.web.externals.dns",
                serde_json::json!({"host": "web.example.com", "token": "not-the-secret"}),
                serde_json::json!({"token": "t0k3n", "host": "not-the-value"}),
            ),
            (
                "k8s-cluster#k8s-cluster",
                serde_json::json!({"name": "c1", "region": "eu"}),
                serde_json::json!({"credentials": "hidden"}),
            ),
        ],
    );
    let inputs = crate::plan::resolve_inputs(ingress, &outputs).unwrap();
    assert_eq!(
        inputs.values,
        serde_json::json!({
            "tls_secret_name": format!("tls-cert-{dns}"),
            "host": "web.example.com",
            "cluster": {"name": "c1", "region": "eu"},
        })
    );
    assert_eq!(inputs.secrets, serde_json::json!({"token": "t0k3n"}));
    let bindings: BTreeSet<(String, String, Option<String>, bool)> =
        crate::plan::bindings_of(ingress, &outputs)
            .into_iter()
            .map(|b| {
                (
                    b.needed_path,
                    b.provided_path,
                    b.value.map(|v| v.to_string()),
                    b.secret,
                )
            })
            .collect();
    let expected: BTreeSet<(String, String, Option<String>, bool)> = [
        (
            "values.tls_secret_name",
            "guresid",
            Some(format!("\"{dns}\"")),
            false,
        ),
        (
            "values.host",
            "values.host",
            Some("\"web.example.com\"".into()),
            false,
        ),
        (
            "values.cluster",
            "values",
            Some(r#"{"name":"c1","region":"eu"}"#.into()),
            false,
        ),
        ("secrets.token", "secrets.token", None, true),
    ]
    .into_iter()
    .map(|(a, b, c, d)| (a.to_owned(), b.to_owned(), c, d))
    .collect();
    assert_eq!(bindings, expected);

    // The GUResID is known before anything is provisioned: nothing to wait for.
    let nothing = std::collections::HashMap::new();
    assert!(matches!(
        crate::plan::resolve_inputs(ingress, &nothing),
        Err(crate::plan::ResolveError::KnownAfterApply { .. })
    ));
    let only_guresid = files_with_ingress_values("      name: ${resources.dns.guresid}\n");
    let g = build_env(&only_guresid, "development").unwrap();
    let ingress = node(&g, "ingress#modules.web.externals.dns");
    let dns = node(&g, "dns#modules.web.externals.dns")
        .guresid
        .to_string();
    assert_eq!(
        crate::plan::resolve_inputs(ingress, &nothing)
            .unwrap()
            .values,
        serde_json::json!({"name": dns})
    );

    // `.values.NAME` reads no secret output, `.secrets.NAME` no plain one.
    let missing = files_with_ingress_values("      x: ${resources.dns.values.token}\n");
    let g = build_env(&missing, "development").unwrap();
    let only_secret = upstream(
        &g,
        &[(
            "dns#modules.web.externals.dns",
            serde_json::json!({"host": "h"}),
            serde_json::json!({"token": "t0k3n"}),
        )],
    );
    let err =
        crate::plan::resolve_inputs(node(&g, "ingress#modules.web.externals.dns"), &only_secret)
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("'values.token'") && err.contains("(its outputs: host)"),
        "{err}"
    );
    assert!(!err.contains("t0k3n"), "{err}");
}

/// A web workload with a dns that co-provisions an ingress whose values are `values`, and a
/// k8s-cluster definition for them to read.
fn files_with_ingress_values(values: &str) -> BTreeMap<String, Vec<u8>> {
    files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/app/web.yaml",
            &workload("web", "  dns:\n    type: dns\n"),
        ),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
        (
            "definitions/dns.yaml",
            &definition(
                "dns",
                "dns",
                "      host: x\n",
                "  provision:\n    ingress: {}\n",
            ),
        ),
        (
            "definitions/ingress.yaml",
            &definition("ingress", "ingress", values, ""),
        ),
        (
            "definitions/k8s.yaml",
            &definition("k8s", "k8s-cluster", "      name: c1\n", ""),
        ),
    ])
}

/// A Score file of score-humanitec's day: `${externals.NAME.OUTPUT}`, `properties` with
/// defaults and secrets, and a volume `source` that names the whole resource.
#[test]
fn older_score_forms_read_their_resources() {
    let web = "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
               image: x\n    variables:\n      HOST: ${externals.db.host}\n      \
               NAME: ${resources.db.name}\n      USER: ${resources.db.user}\n    volumes:\n    \
               - source: ${resources.data}\n      target: /data\nresources:\n  db:\n    \
               type: postgres\n    properties:\n      host:\n      name:\n        default: web\n      \
               user:\n        secret: true\n  data:\n    type: volume\n";
    let files = files(&[
        ("environments/development.yaml", ENV),
        ("workloads/app/web.yaml", web),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
        (
            "definitions/pg.yaml",
            &definition("pg", "postgres", "      a: 1\n", ""),
        ),
        (
            "definitions/vol.yaml",
            &definition("vol", "volume", "      a: 1\n", ""),
        ),
    ]);
    let g = build_env(&files, "development").unwrap();
    let (_, edges) = shape(&g);
    for edge in [
        "workload#modules.web -> postgres#modules.web.externals.db (reference)",
        "workload#modules.web -> volume#modules.web.externals.data (reference)",
    ] {
        assert!(edges.contains(edge), "{edge} not in {edges:#?}");
    }
    let outputs = upstream(
        &g,
        &[
            (
                "postgres#modules.web.externals.db",
                serde_json::json!({"host": "db1", "user": "app"}),
                serde_json::json!({"password": "pw"}),
            ),
            (
                "volume#modules.web.externals.data",
                serde_json::json!({"type": "volume", "source": "web-data"}),
                serde_json::json!({"key": "hidden"}),
            ),
        ],
    );
    let w = node(&g, "workload#modules.web");
    let inputs = crate::plan::resolve_inputs(w, &outputs).unwrap();
    let main = &inputs.resource["containers"]["main"];
    assert_eq!(main["variables"]["HOST"], "db1");
    // The default fills the output the resource does not provide.
    assert_eq!(main["variables"]["NAME"], "web");
    assert_eq!(main["variables"]["USER"], "app");
    // The whole resource: its non-secret outputs, the secret ones left out.
    assert_eq!(
        main["volumes"][0]["source"],
        serde_json::json!({"type": "volume", "source": "web-data"})
    );
    // `secret: true` makes what reads it secret, though the resource gave a plain value.
    assert!(inputs.resource_is_secret);
    let bindings = crate::plan::bindings_of(w, &outputs);
    let user = bindings
        .iter()
        .find(|b| b.needed_path == "resource.containers.main.variables.USER")
        .unwrap();
    assert!(user.secret && user.value.is_none(), "{user:?}");
    let source = bindings
        .iter()
        .find(|b| b.needed_path == "resource.containers.main.volumes[0].source")
        .unwrap();
    assert_eq!(
        (source.provided_path.as_str(), source.data_type.as_str()),
        ("values", "json")
    );
    // Without a default, a missing output is an error, `required` or not.
    let no_host = upstream(
        &g,
        &[
            (
                "postgres#modules.web.externals.db",
                serde_json::json!({}),
                serde_json::json!({}),
            ),
            (
                "volume#modules.web.externals.data",
                serde_json::json!({}),
                serde_json::json!({}),
            ),
        ],
    );
    let err = crate::plan::resolve_inputs(w, &no_host)
        .unwrap_err()
        .to_string();
    assert!(err.contains("reads output 'host'"), "{err}");
}

#[test]
fn context_org_id_is_the_repository_org() {
    let base = definition(
        "base",
        "base-env",
        "      ns: ${context.org.id}-${context.app.id}\n",
        "",
    );
    let mut files = files(&[
        ("environments/development.yaml", ENV),
        ("workloads/app/web.yaml", &workload("web", "  {}\n")),
        (
            "definitions/wl.yaml",
            &definition("wl", "workload", "      a: 1\n", ""),
        ),
        ("definitions/base.yaml", &base),
    ]);
    let ns = |files: &BTreeMap<String, Vec<u8>>| {
        let g = build_env(files, "development").unwrap();
        let base = node(&g, "base-env#base-env");
        crate::plan::resolve_inputs(base, &std::collections::HashMap::new())
            .unwrap()
            .values["ns"]
            .clone()
    };
    assert_eq!(ns(&files), "gitplane-app");
    files.insert("gitplane.yaml".into(), b"org: acme\n".to_vec());
    assert_eq!(ns(&files), "acme-app");
}

/// A chained selector, as HPO writes it for a role that grants its workloads' policies:
/// `aws-role<workload>aws-policy` is the workloads that depend on the role, then the policies
/// those workloads depend on; each step starts from the set the step before selected.
#[test]
fn chained_selectors_select_step_by_step() {
    let files = files(&[
        ("environments/development.yaml", ENV),
        (
            "workloads/a/one.yaml",
            &workload("one", "  p:\n    type: aws-policy\n"),
        ),
        (
            "workloads/a/two.yaml",
            &workload(
                "two",
                "  p:\n    type: aws-policy\n  q:\n    type: aws-policy\n  db:\n    type: queue\n",
            ),
        ),
        (
            "workloads/b/three.yaml",
            &workload("three", "  p:\n    type: aws-policy\n"),
        ),
        (
            "definitions/wl.yaml",
            &definition(
                "wl",
                "workload",
                "      role: ${resources.aws-role#app-role.outputs.arn}\n",
                "",
            ),
        ),
        (
            "definitions/role.yaml",
            &definition(
                "role",
                "aws-role",
                "      policies: ${resources[\"aws-role<workload>aws-policy\"].outputs.arn}\n",
                "",
            ),
        ),
        (
            "definitions/policy.yaml",
            &definition("policy", "aws-policy", "      arn: x\n", ""),
        ),
        (
            "definitions/q.yaml",
            &definition("q", "queue", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            &definition("base", "base-env", "      a: 1\n", ""),
        ),
    ]);
    let g = build_env(&files, "development").unwrap();
    let selected = |app: &str| {
        let role = g
            .nodes()
            .find(|n| n.res_type == "aws-role" && n.app.as_deref() == Some(app))
            .unwrap_or_else(|| panic!("no role in app {app}"));
        let mut found = Vec::new();
        role.values
            .clone()
            .for_each_expr_mut(&mut |b: &mut Binding| {
                if let Binding::Selector { targets, .. } = b {
                    found.extend(targets.iter().map(|t| g.get(t).unwrap().res_id.clone()));
                }
            });
        found
    };
    // The queue of `two` is not a policy; app b's role sees only app b's workload.
    assert_eq!(
        selected("a"),
        [
            "modules.one.externals.p",
            "modules.two.externals.p",
            "modules.two.externals.q"
        ]
    );
    assert_eq!(selected("b"), ["modules.three.externals.p"]);
    let (_, edges) = shape(&g);
    for policy in [
        "modules.one.externals.p",
        "modules.two.externals.p",
        "modules.two.externals.q",
    ] {
        assert!(
            edges.contains(&format!(
                "aws-role#app-role -> aws-policy#{policy} (selector)"
            )),
            "{edges:#?}"
        );
    }
}

/// `driver_account: ${resources['config.default#aws'].account}`, HPO's way to choose the cloud
/// account per environment: the resource runs with the account of the `config` resource's
/// definition (chosen by the environment's criteria), and depends on that resource.
#[test]
fn a_driver_account_placeholder_takes_the_referenced_resources_account() {
    let config = |id: &str, account: &str, env: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n\
             entity:\n  type: config\n  driver_type: echo\n  driver_account: {account}\n  \
             driver_inputs:\n    values: {{}}\n  criteria:\n    - env_id: {env}\n      res_id: aws\n"
        )
    };
    let bucket = "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: s3\n\
                  entity:\n  type: s3\n  driver_type: echo\n  \
                  driver_account: ${resources['config.default#aws'].account}\n  \
                  driver_inputs:\n    values:\n      region: eu-west-1\n  criteria:\n    - {}\n";
    let mut entries = vec![
        ("environments/development.yaml", ENV.to_owned()),
        (
            "environments/production.yaml",
            "type: production\n".to_owned(),
        ),
        (
            "workloads/a/one.yaml",
            workload("one", "  files:\n    type: s3\n"),
        ),
        (
            "definitions/wl.yaml",
            definition("wl", "workload", "      a: 1\n", ""),
        ),
        (
            "definitions/base.yaml",
            definition("base", "base-env", "      a: 1\n", ""),
        ),
        ("definitions/s3.yaml", bucket.to_owned()),
        (
            "definitions/config-dev.yaml",
            config("config-dev", "aws-dev", "development"),
        ),
        (
            "definitions/config-prod.yaml",
            config("config-prod", "aws-prod", "production"),
        ),
    ];
    let as_files = |entries: &[(&str, String)]| {
        files(
            &entries
                .iter()
                .map(|(p, t)| (*p, t.as_str()))
                .collect::<Vec<_>>(),
        )
    };
    for (env, account) in [("development", "aws-dev"), ("production", "aws-prod")] {
        let g = build_env(&as_files(&entries), env).unwrap();
        let s3 = node(&g, "s3#modules.one.externals.files");
        assert_eq!(s3.driver_account.as_deref(), Some(account), "{env}");
        let (_, edges) = shape(&g);
        assert!(
            edges.contains("s3#modules.one.externals.files -> config#aws (reference)"),
            "{edges:#?}"
        );
    }

    // The referenced definition names no account: an error at the reference's line.
    entries[6].1 =
        config("config-dev", "\"\"", "development").replace("  driver_account: \"\"\n", "");
    let errors = build_env(&as_files(&entries), "development").unwrap_err();
    let message = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        message.contains(
            "definitions/s3.yaml:8: the driver_account of a/s3.default#modules.one.externals.files \
             is the account of a/config.default#aws ('config.default#aws'), whose definition \
             'config-dev' names no driver_account: give it one"
        ),
        "{message}"
    );
}

/// HPO's `${values.KEY}` and `${shared.ID.OUTPUT}` in Score files (score-humanitec passed them
/// through): the app's values.yaml with an environment's override, and a resource shared under
/// an id by another workload of the app, or the environment's shared resource of that name.
#[test]
fn score_files_read_app_values_and_shared_resources_by_id() {
    let api = "apiVersion: score.dev/v1b1\nmetadata:\n  name: api\ncontainers:\n  main:\n    \
               image: x\n    variables:\n      LOG_LEVEL: ${values.LOG_LEVEL}\n      \
               REPLICAS: ${values.replicas}\n      DB: ${shared.main-db.host}\n      \
               DNS: ${shared.dns.host}\n";
    let entries = |values: &str| {
        files(&[
            ("environments/development.yaml", ENV),
            (
                "environments/production.yaml",
                "type: production\nshared_resources:\n  dns: {type: dns}\n",
            ),
            (
                "environments/staging.yaml",
                "type: staging\nshared_resources:\n  dns: {type: dns}\n",
            ),
            ("workloads/shop/api.yaml", api),
            (
                "workloads/shop/db-owner.yaml",
                &workload("db-owner", "  db:\n    type: postgres\n    id: main-db\n"),
            ),
            ("workloads/shop/values.yaml", values),
            (
                "definitions/wl.yaml",
                &definition("wl", "workload", "      a: 1\n", ""),
            ),
            (
                "definitions/pg.yaml",
                &definition("pg", "postgres", "      host: db.internal\n", ""),
            ),
            (
                "definitions/dns.yaml",
                &definition("dns", "dns", "      host: example.com\n", ""),
            ),
            (
                "definitions/base.yaml",
                &definition("base", "base-env", "      a: 1\n", ""),
            ),
        ])
    };
    let values = "values:\n  LOG_LEVEL: info\n  replicas: 2\nenvironments:\n  production:\n    \
                  LOG_LEVEL: warn\n";
    let env_of = |env: &str| {
        let g = build_env(&entries(values), env).unwrap();
        let api = node(&g, "workload#modules.api");
        let (_, edges) = shape(&g);
        (format!("{:?}", api.params), edges)
    };
    let (production, edges) = env_of("production");
    assert!(
        production.contains("Value(String(\"warn\"))"),
        "{production}"
    );
    assert!(production.contains("Value(Number(2))"), "{production}");
    assert!(
        edges.contains("workload#modules.api -> postgres#shared.main-db (reference)"),
        "{edges:#?}"
    );
    assert!(
        edges.contains("workload#modules.api -> dns#globals.dns (reference)"),
        "{edges:#?}"
    );
    let (staging, _) = env_of("staging");
    assert!(staging.contains("Value(String(\"info\"))"), "{staging}");

    // Development has no dns: the error names both places it looked.
    let errors = build_env(&entries(values), "development").unwrap_err();
    let message: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        message,
        [
            "workloads/shop/api.yaml:11: workload 'api' reads '${shared.dns...}', but no workload \
          of app 'shop' declares a resource with 'id: dns' and environment 'development' has no \
          shared_resources entry 'dns'"
        ],
    );
    // A value the app does not set.
    let errors = build_env(&entries("values:\n  LOG_LEVEL: info\n"), "production").unwrap_err();
    let message: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        message,
        [
            "workloads/shop/api.yaml:9: workload 'api' reads '${values.replicas}', which app 'shop' \
          does not set for environment 'production': add it under values (or \
          environments.production) in workloads/shop/values.yaml"
        ],
    );
}

/// A repository of many apps that share global resources in every way one can be reached:
/// requested by name, read through `${shared.ID}`, referenced by another global, co-provisioned
/// with `match_dependents`; with selectors and `driver_account` references in each app.
fn many_apps(apps: usize, broken_app: Option<usize>) -> BTreeMap<String, Vec<u8>> {
    let mut entries: Vec<(String, String)> = vec![
        (
            "environments/development.yaml".into(),
            "type: development\nshared_resources:\n  dns: {type: dns}\n  net: {type: net}\n".into(),
        ),
        (
            "definitions/wl.yaml".into(),
            definition(
                "wl",
                "workload",
                "      role: ${resources.aws-role#app-role.outputs.arn}\n",
                "",
            ),
        ),
        (
            "definitions/role.yaml".into(),
            definition(
                "role",
                "aws-role",
                "      policies: ${resources[\"aws-role<workload>aws-policy\"].outputs.arn}\n",
                "",
            ),
        ),
        (
            "definitions/policy.yaml".into(),
            definition("policy", "aws-policy", "      arn: x\n", ""),
        ),
        (
            "definitions/dns.yaml".into(),
            definition(
                "dns",
                "dns",
                "      host: example.com\n      net: ${resources.net#globals.net.outputs.id}\n",
                "  provision:\n    cert:\n      match_dependents: true\n",
            ),
        ),
        (
            "definitions/cert.yaml".into(),
            definition(
                "cert",
                "cert",
                "      of: ${resources.dns.outputs.host}\n",
                "",
            ),
        ),
        (
            "definitions/net.yaml".into(),
            definition("net", "net", "      vpc: ${resources.vpc.outputs.id}\n", ""),
        ),
        (
            "definitions/vpc.yaml".into(),
            definition("vpc", "vpc", "      id: v\n", ""),
        ),
        (
            "definitions/pg.yaml".into(),
            definition("pg", "postgres", "      host: db.internal\n", ""),
        ),
        (
            "definitions/base.yaml".into(),
            definition("base", "base-env", "      a: 1\n", ""),
        ),
        (
            "definitions/config.yaml".into(),
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: config\n\
             entity:\n  type: config\n  driver_type: echo\n  driver_account: aws-dev\n  \
             driver_inputs:\n    values: {}\n  criteria:\n    - res_id: aws\n"
                .into(),
        ),
        (
            "definitions/s3.yaml".into(),
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: s3\n\
             entity:\n  type: s3\n  driver_type: echo\n  \
             driver_account: ${resources['config.default#aws'].account}\n  \
             driver_inputs:\n    values:\n      region: eu-west-1\n  criteria:\n    - {}\n"
                .into(),
        ),
    ];
    for i in 0..apps {
        for w in 0..=(i % 3) {
            let mut resources = String::from("  p:\n    type: aws-policy\n");
            match (i + w) % 4 {
                0 => resources.push_str("  d:\n    type: dns\n    metadata:\n      annotations:\n        gitplane.dev/resource-ref: dns\n"),
                1 => resources.push_str("  db:\n    type: postgres\n    id: main-db\n"),
                2 => resources.push_str("  files:\n    type: s3\n"),
                _ => {}
            }
            let mut text = workload(&format!("w{w}"), &resources);
            if (i + w) % 2 == 1 {
                text = text.replace(
                    "    image: x\n",
                    "    image: x\n    variables:\n      HOST: ${shared.dns.host}\n",
                );
            }
            if broken_app == Some(i) {
                text = text.replace("    image: x\n", "    image: ${resources.nope.host}\n");
            }
            entries.push((format!("workloads/app-{i:03}/w{w}.yaml"), text));
        }
    }
    entries
        .into_iter()
        .map(|(p, t)| (p, t.into_bytes()))
        .collect()
}

/// Apps are built on every core and then joined: the graph must be the one building them in
/// turn makes, node for node (indices, GUResIDs, templates, origins) and edge for edge, on any
/// number of threads; and a repository with an error reports what building in turn does.
#[test]
fn a_graph_built_in_parts_is_the_graph_built_in_turn() {
    let files = many_apps(80, None);
    let repo = model::load(&files).unwrap_or_else(|e| panic!("load failed: {e:#?}"));
    let env = &repo.environments[0];
    for threads in [2, 3, 7] {
        let (in_turn, in_parts) = super::build::built_both_ways(&repo, env, threads);
        for global in ["dns", "net", "vpc", "cert"] {
            let node = format!("app: None, res_type: \"{global}\"");
            assert!(in_turn.contains(&node), "no global {global}: {in_turn}");
        }
        assert!(in_turn.contains("Coprovision"), "{in_turn}");
        assert!(in_turn.contains("Selector"), "{in_turn}");
        assert!(in_turn.contains("Some(\"aws-dev\")"), "{in_turn}");
        assert_eq!(
            in_parts.as_deref(),
            Some(in_turn.as_str()),
            "{threads} threads"
        );
    }
    // The whole environment the way commands build it: in parts, with this many apps.
    let g = build(&repo, env).expect("builds");
    let (in_turn, _) = super::build::built_both_ways(&repo, env, 2);
    assert_eq!(super::build::shape(&Ok(g)), in_turn);

    let files = many_apps(80, Some(41));
    let repo = model::load(&files).unwrap_or_else(|e| panic!("load failed: {e:#?}"));
    let env = &repo.environments[0];
    let (in_turn, in_parts) = super::build::built_both_ways(&repo, env, 3);
    assert!(in_turn.contains("app-041/w"), "{in_turn}");
    assert_eq!(
        in_parts, None,
        "a part with an error is built again in turn"
    );
    let errors = build(&repo, env).expect_err("reports the app's error");
    assert_eq!(format!("{errors:?}"), in_turn);
}
