//! `gitplane manifests`: the Kubernetes manifests of a deployment, as the last apply recorded
//! them, with secret values hidden unless asked for.

use crate::util::{Sandbox, assert_golden};
use gitplane_testkit::DriverServer;

/// The template's database password, which reaches the backend's Score file.
const PASSWORD: &str = "dev-password-change-me";

#[test]
fn workloads_get_a_deployment_and_a_service_from_their_score_files() {
    let sb = Sandbox::applied();
    let run = sb
        .gitplane(&["manifests", "--env", "development", "--app", "shop"])
        .ok();
    run.hides(&[PASSWORD]);
    assert_golden("template-development.yaml", &run.stdout);
    // The password is hidden in what is shown, and kept sealed for --show-secrets.
    assert!(
        run.stdout
            .contains("name: DB_PASSWORD\n          value: (secret)")
    );
    sb.assert_state_bytes_hide(&[PASSWORD]);
    let shown = sb
        .gitplane(&["manifests", "--env", "development", "--show-secrets"])
        .ok();
    assert!(
        shown
            .stdout
            .contains(&format!("name: DB_PASSWORD\n          value: {PASSWORD}")),
        "{}",
        shown.stdout
    );
    // The JSON form is one List of the same objects.
    let json = sb
        .gitplane(&["manifests", "--env", "development", "--format", "json"])
        .ok()
        .json();
    assert_eq!(json["kind"], "List");
    let items = json["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Deployment", "Service", "Deployment", "Service"]);
    assert_eq!(run.stdout.matches("\n---\n").count() + 1, items.len());
    let backend = &items[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(backend["image"], "registry.example.com/shop/backend:1.4.2");
    assert!(items.iter().all(|i| !i.to_string().contains(PASSWORD)));
}

#[test]
fn a_changed_workload_changes_its_manifests_and_a_failed_one_keeps_them() {
    let sb = Sandbox::applied();
    sb.edit(
        "workloads/shop/frontend.yaml",
        "registry.example.com/shop/frontend:2.0.0",
        "registry.example.com/shop/frontend:2.1.0",
    );
    sb.commit("frontend 2.1.0");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let run = sb.gitplane(&["manifests", "--env", "development"]).ok();
    assert!(
        run.stdout
            .contains("image: registry.example.com/shop/frontend:2.1.0")
    );
    assert!(!run.stdout.contains("frontend:2.0.0"));
    // Production was not applied: still the old image there.
    let prod = sb.gitplane(&["manifests", "--env", "production"]).ok();
    assert!(
        prod.stdout
            .contains("image: registry.example.com/shop/frontend:2.0.0")
    );
}

#[test]
fn the_command_wants_one_recorded_environment_and_a_recorded_app() {
    let sb = Sandbox::applied();
    sb.gitplane(&["manifests"])
        .fails()
        .stderr_has("no --env: pass exactly one --env");
    sb.gitplane(&["manifests", "--env", "development", "--env", "production"])
        .fails()
        .stderr_has("--env development --env production: pass exactly one --env");
    sb.gitplane(&["manifests", "--env", "staging"])
        .fails()
        .stderr_has("no environment 'staging' is recorded");
    sb.gitplane(&["manifests", "--env", "development", "--app", "blog"])
        .fails()
        .stderr_has("no app 'blog' is recorded in environment 'development' (recorded: shop)");
    let fresh = Sandbox::template();
    fresh
        .gitplane(&["manifests", "--env", "development"])
        .fails()
        .stderr_has("no state file");
}

/// A sidecar resource whose HTTP driver answers with manifests: a container for the workloads
/// that use it, a volume, and a ConfigMap that holds the secret the driver was given.
#[test]
fn containers_and_volumes_from_a_drivers_answer_join_the_pods_of_the_workloads_using_it() {
    let server = DriverServer::start();
    let sb = Sandbox::applied();
    sb.write(
        "host.yaml",
        &format!(
            "drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 2s}}\n",
            server.url
        ),
    );
    sb.write(
        "definitions/sidecar.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: sidecar\n\
         entity:\n  type: sidecar\n  driver_type: test/http\n  driver_inputs:\n    values:\n      \
         manifests:\n        - location: containers\n          data: {name: proxy, image: \"envoy:1.31\"}\n        \
         - location: volumes\n          data: {name: certs, emptyDir: {}}\n        \
         - location: namespace\n          data:\n            apiVersion: v1\n            kind: ConfigMap\n            \
         metadata: {name: proxy}\n            data: {upstream: \"http://localhost:3000\"}\n        \
         - location: namespace\n          data:\n            apiVersion: v1\n            kind: Secret\n            \
         metadata: {name: proxy-tls}\n            data: {key: \"c2VjcmV0LWtleQ==\"}\n  criteria:\n    - {}\n",
    );
    sb.edit(
        "workloads/shop/frontend.yaml",
        "resources:\n",
        "resources:\n  proxy:\n    type: sidecar\n",
    );
    sb.commit("an envoy sidecar for the frontend");
    let config = sb.root.join("work/host.yaml");
    let config = config.to_str().unwrap();
    sb.gitplane(&["apply", "--config", config, "--env", "development"])
        .ok();
    let json = sb
        .gitplane(&["manifests", "--env", "development", "--format", "json"])
        .ok()
        .hides(&[PASSWORD])
        .json();
    let items = json["items"].as_array().unwrap();
    let named = |kind: &str, name: &str| {
        items
            .iter()
            .find(|i| i["kind"] == kind && i["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {json:#}"))
    };
    let pod = &named("Deployment", "frontend")["spec"]["template"]["spec"];
    let containers: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(containers, ["web", "proxy"]);
    assert_eq!(
        pod["volumes"],
        serde_json::json!([{"name": "certs", "emptyDir": {}}])
    );
    // The backend does not use the sidecar.
    let backend = &named("Deployment", "backend")["spec"]["template"]["spec"];
    assert_eq!(backend["containers"].as_array().unwrap().len(), 1);
    assert!(backend.get("volumes").is_none());
    assert_eq!(
        named("ConfigMap", "proxy")["data"]["upstream"],
        "http://localhost:3000"
    );
    // A Secret's data is hidden unless asked for.
    assert_eq!(named("Secret", "proxy-tls")["data"]["key"], "(secret)");
    let shown = sb
        .gitplane(&["manifests", "--env", "development", "--show-secrets"])
        .ok();
    assert!(
        shown.stdout.contains("key: c2VjcmV0LWtleQ=="),
        "{}",
        shown.stdout
    );
    sb.assert_state_bytes_hide(&[PASSWORD]);
}
