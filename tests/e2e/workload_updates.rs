//! A workload definition's `update` output (JSON-patch-like operations on the workload's spec,
//! as Humanitec's example library writes them) applied to the generated Deployment and
//! Service; an operation gitplane cannot apply is refused: at load with file:line when its path
//! is written out, at apply naming the definition and the output when it is rendered.

use serde_json::Value;

use crate::util::Sandbox;

/// A workload definition in the shape of the example library's service-account pattern: the
/// workload runs under the account of a `k8s-service-account` resource it references.
const WORKLOAD: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: serviceaccount-workload
entity:
  name: serviceaccount-workload
  type: workload
  driver_type: humanitec/template
  driver_inputs:
    values:
      templates:
        outputs: |
          update:
          - op: add
            path: /spec/serviceAccountName
            value: ${resources.k8s-service-account.outputs.name}
          - op: add
            path: /spec/pod/annotations
            value:
              team: checkout
          {{- range $id, $c := .resource.containers }}
          - op: add
            path: /spec/containers/{{ $id }}/variables/SERVICE_ACCOUNT
            value: ${resources.k8s-service-account.outputs.name}
          {{- end }}
          {{- if .resource.service }}
          - op: add
            path: /spec/service/annotations/cloud.google.com~1neg
            value: '{"ingress":true}'
          {{- end }}
  criteria:
    - app_id: shop
"#;

/// The service account each workload gets, named after the workload.
const ACCOUNT: &str = r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: k8s-service-account
entity:
  type: k8s-service-account
  driver_type: humanitec/template
  driver_inputs:
    values:
      res_id: ${context.res.id}
      templates:
        init: |
          name: {{ .driver.values.res_id | splitList "." | last }}-sa
        manifests: |
          service-account.yaml:
            location: namespace
            data:
              apiVersion: v1
              kind: ServiceAccount
              metadata:
                name: {{ .init.name }}
        outputs: |
          name: {{ .init.name }}
  criteria:
    - {}
"#;

fn repo() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.write("definitions/serviceaccount-workload.yaml", WORKLOAD);
    sb.write("definitions/k8s-service-account.yaml", ACCOUNT);
    sb.commit("workloads run under their own service account");
    sb
}

fn shop_objects(sb: &Sandbox) -> Vec<Value> {
    let json = sb
        .gitplane(&[
            "manifests",
            "--env",
            "development",
            "--app",
            "shop",
            "--format",
            "json",
        ])
        .ok()
        .json();
    json["items"].as_array().expect("a List").clone()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {objects:#?}"))
}

#[test]
fn a_workload_definitions_update_reaches_the_generated_deployment_and_service() {
    let sb = repo();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let objects = shop_objects(&sb);
    let frontend = find(&objects, "Deployment", "frontend");
    let pod = &frontend["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "frontend-sa");
    assert_eq!(pod["metadata"]["annotations"]["team"], "checkout");
    let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
    assert!(
        env.contains(&serde_json::json!({"name": "SERVICE_ACCOUNT", "value": "frontend-sa"})),
        "{env:?}"
    );
    // The account itself is among the app's objects.
    find(&objects, "ServiceAccount", "frontend-sa");
    assert_eq!(
        find(&objects, "Service", "frontend")["metadata"]["annotations"]["cloud.google.com/neg"],
        "{\"ingress\":true}"
    );
    let backend = find(&objects, "Deployment", "backend");
    assert_eq!(
        backend["spec"]["template"]["spec"]["serviceAccountName"],
        "backend-sa"
    );
}

#[test]
fn an_update_path_gitplane_does_not_map_is_refused() {
    let sb = repo();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let before = sb.resource_rows();
    // Written out: refused at load, at its line.
    sb.edit(
        "definitions/serviceaccount-workload.yaml",
        "          - op: add\n            path: /spec/pod/annotations\n",
        "          - op: add\n            path: /spec/replicas\n            value: 3\n          \
         - op: add\n            path: /spec/pod/annotations\n",
    );
    sb.commit("three replicas");
    for command in ["validate", "apply"] {
        let run = sb.gitplane(&[command]).fails();
        run.stderr_has(
            "definitions/serviceaccount-workload.yaml:18: templates.outputs, update: path \
             '/spec/replicas' is not one gitplane maps to the workload's objects",
        );
    }
    assert_eq!(sb.resource_rows(), before, "state unchanged");

    // Rendered: refused when the template renders, naming the definition and the output.
    sb.edit(
        "definitions/serviceaccount-workload.yaml",
        "path: /spec/replicas\n",
        "path: /spec/{{ .driver.values.field }}\n",
    );
    sb.edit(
        "definitions/serviceaccount-workload.yaml",
        "      templates:\n",
        "      field: replicas\n      templates:\n",
    );
    sb.commit("three replicas, by a value");
    sb.gitplane(&["validate"]).ok();
    let run = sb.gitplane(&["apply", "--env", "development"]).fails();
    run.stderr_has(
        "shop/workload.default#modules.frontend: definition 'serviceaccount-workload' gives \
         output 'update' that gitplane cannot apply to the workload's objects: update[1]: path \
         '/spec/replicas' is not one gitplane maps",
    );
    // The frontend keeps what it last deployed.
    let objects = shop_objects(&sb);
    let pod = &find(&objects, "Deployment", "frontend")["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "frontend-sa");
}
