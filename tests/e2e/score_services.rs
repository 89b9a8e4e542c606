//! Score resources of type `service`: a link to the workload of the app they name (as
//! score-humanitec translated them), its Service's name and ports as outputs, an edge to it;
//! one naming no workload is refused with its line.

use crate::util::Sandbox;

/// A frontend that calls its backend, in the shape of score-humanitec's dependencies example.
const FRONTEND: &str = r#"apiVersion: score.dev/v1b1
metadata:
  name: frontend
containers:
  frontend:
    image: busybox
    command: ["/bin/sh"]
    args: ["-c", "while true; do wget -qO- $${BACKEND_URL}; sleep 10; done"]
    variables:
      BACKEND_HOST: ${resources.backend.name}
      BACKEND_URL: http://${resources.backend.name}:${resources.backend.port}/
      ADMIN_PORT: ${resources.admin.ports.admin}
resources:
  backend:
    type: service
  admin:
    type: service
"#;

const BACKEND: &str = r#"apiVersion: score.dev/v1b1
metadata:
  name: backend
containers:
  api:
    image: registry.example.com/shop/api:2.0
service:
  ports:
    http:
      port: 8080
      targetPort: 3000
"#;

const ADMIN: &str = r#"apiVersion: score.dev/v1b1
metadata:
  name: admin
containers:
  admin:
    image: registry.example.com/shop/admin:1.0
service:
  ports:
    admin:
      port: 9000
    metrics:
      port: 9090
"#;

fn services_repo() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.write("workloads/calls/frontend.yaml", FRONTEND);
    sb.write("workloads/calls/backend.yaml", BACKEND);
    sb.write("workloads/calls/admin.yaml", ADMIN);
    sb.commit("a frontend calling its backend");
    sb
}

#[test]
fn a_service_resource_reads_the_named_workloads_service_and_depends_on_it() {
    let sb = services_repo();
    sb.gitplane(&["apply", "--env", "development"]).ok();

    let json = sb
        .gitplane(&[
            "manifests",
            "--env",
            "development",
            "--app",
            "calls",
            "--format",
            "json",
        ])
        .ok()
        .json();
    let items = json["items"].as_array().unwrap();
    let frontend = items
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "frontend")
        .expect("the frontend's Deployment");
    let env: Vec<(String, String)> = frontend["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["value"].as_str().unwrap().into(),
            )
        })
        .collect();
    let value = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(value("BACKEND_HOST"), Some("backend"));
    assert_eq!(value("BACKEND_URL"), Some("http://backend:8080/"));
    assert_eq!(value("ADMIN_PORT"), Some("9000"));
    // The Service those names reach is the backend's own.
    let service = items
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "backend")
        .expect("the backend's Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);

    // An edge from the frontend's workload to each workload it names, and no resource of
    // type service.
    let edges = sb.rows(
        "SELECT f.res_id, t.res_id, e.kind FROM edge e \
         JOIN resource f ON f.guresid = e.from_guresid \
         JOIN resource t ON t.guresid = e.to_guresid \
         WHERE f.app = 'calls' AND f.res_id = 'modules.frontend' ORDER BY t.res_id",
    );
    let expected: Vec<Vec<String>> = [
        ["modules.frontend", "base-env", "implicit"],
        ["modules.frontend", "modules.admin", "dependency"],
        ["modules.frontend", "modules.backend", "dependency"],
    ]
    .iter()
    .map(|r| r.iter().map(|s| s.to_string()).collect())
    .collect();
    let services: Vec<Vec<String>> = edges.into_iter().filter(|r| r[1] != "base-env").collect();
    assert_eq!(services, expected[1..]);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE type = 'service'"),
        0
    );
    // The backend is provisioned before the frontend that reads it.
    let order: Vec<String> = sb.column(
        "SELECT r.res_id FROM operation o JOIN resource r ON r.guresid = o.guresid \
         WHERE r.app = 'calls' AND r.res_id IN ('modules.frontend', 'modules.backend') \
         ORDER BY o.id",
    );
    assert_eq!(order, ["modules.backend", "modules.frontend"]);
}

#[test]
fn a_service_resource_naming_no_workload_is_refused_with_its_line() {
    let sb = services_repo();
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let before = sb.resource_rows();
    sb.edit(
        "workloads/calls/frontend.yaml",
        "  admin:\n    type: service\n",
        "  admin:\n    type: service\n  billing:\n    type: service\n",
    );
    sb.edit(
        "workloads/calls/frontend.yaml",
        "      ADMIN_PORT: ${resources.admin.ports.admin}\n",
        "      ADMIN_PORT: ${resources.admin.ports.admin}\n      \
         BACKEND_TLS: ${resources.backend.ports.https}\n",
    );
    sb.commit("billing is not an app's workload");
    for command in ["validate", "apply"] {
        let run = sb.gitplane(&[command]).fails();
        run.stderr_has(
            "workloads/calls/frontend.yaml:19: resource 'billing' of type 'service' names \
             workload 'billing' of app 'calls', which has no such workload (it has: admin, \
             backend, frontend)",
        );
        run.stderr_has(
            "workloads/calls/frontend.yaml:13: workload 'frontend' reads \
             '${resources.backend.ports.https}', but service 'backend' gives only name",
        );
    }
    assert_eq!(sb.resource_rows(), before, "state unchanged");
}
