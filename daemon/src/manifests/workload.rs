//! The Deployment and Service of a Score workload, as Humanitec generates them for a workload
//! whose definition gives none: containers with their image, command, arguments, variables,
//! resources and probes, and the service's ports.

use serde_json::{Map, Value, json};

use crate::drivers::{Manifest, ManifestLocation};

/// The label that selects a workload's pods.
const NAME_LABEL: &str = "app.kubernetes.io/name";

/// The objects of workload `name` of `app`, from its resolved Score file.
pub fn objects(app: Option<&str>, name: &str, score: &Value) -> Vec<Manifest> {
    let mut labels = Map::new();
    labels.insert(NAME_LABEL.into(), json!(name));
    if let Some(app) = app {
        labels.insert("app.kubernetes.io/part-of".into(), json!(app));
    }
    labels.insert("app.kubernetes.io/managed-by".into(), json!("gitplane"));
    let annotations = score
        .pointer("/metadata/annotations")
        .filter(|a| a.is_object())
        .cloned();
    let containers: Vec<Value> = match score.get("containers") {
        Some(Value::Object(containers)) => containers
            .iter()
            .map(|(name, spec)| container(name, spec))
            .collect(),
        _ => Vec::new(),
    };
    let mut pod_metadata = json!({ "labels": labels });
    let mut metadata = json!({ "name": name, "labels": labels });
    if let Some(annotations) = annotations {
        pod_metadata["annotations"] = annotations.clone();
        metadata["annotations"] = annotations;
    }
    let mut objects = vec![Manifest {
        name: "deployment.yaml".into(),
        location: ManifestLocation::Namespace,
        data: json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "selector": { "matchLabels": { NAME_LABEL: name } },
                "template": {
                    "metadata": pod_metadata,
                    "spec": { "containers": containers },
                },
            },
        }),
    }];
    if let Some(Value::Object(ports)) = score.pointer("/service/ports") {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(port_name, port)| {
                let number = port.get("port").cloned().unwrap_or(Value::Null);
                let mut entry = json!({
                    "name": port_name,
                    "port": number,
                    "targetPort": port.get("targetPort").cloned().unwrap_or(number),
                });
                if let Some(protocol) = port.get("protocol") {
                    entry["protocol"] = protocol.clone();
                }
                entry
            })
            .collect();
        objects.push(Manifest {
            name: "service.yaml".into(),
            location: ManifestLocation::Namespace,
            data: json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": { "name": name, "labels": labels },
                "spec": { "selector": { NAME_LABEL: name }, "ports": ports },
            }),
        });
    }
    objects
}

/// One Kubernetes container from a Score container.
fn container(name: &str, spec: &Value) -> Value {
    let mut out = json!({ "name": name });
    for key in ["image", "command", "args"] {
        if let Some(v) = spec.get(key) {
            out[key] = v.clone();
        }
    }
    if let Some(Value::Object(vars)) = spec.get("variables") {
        let env: Vec<Value> = vars
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                json!({ "name": k, "value": value })
            })
            .collect();
        out["env"] = Value::Array(env);
    }
    if let Some(resources) = spec.get("resources").filter(|r| r.is_object()) {
        out["resources"] = resources.clone();
    }
    for key in ["livenessProbe", "readinessProbe"] {
        if let Some(probe) = spec.get(key).and_then(probe) {
            out[key] = probe;
        }
    }
    out
}

/// A Kubernetes probe from a Score probe (`httpGet` or `exec`).
fn probe(score: &Value) -> Option<Value> {
    if let Some(http) = score.get("httpGet") {
        let mut get = Map::new();
        for key in ["path", "port", "host", "scheme", "httpHeaders"] {
            if let Some(v) = http.get(key) {
                get.insert(key.into(), v.clone());
            }
        }
        return Some(json!({ "httpGet": get }));
    }
    let exec = score.get("exec")?;
    let command = exec.get("command").cloned().unwrap_or(Value::Null);
    Some(json!({ "exec": { "command": command } }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_score_file_becomes_a_deployment_and_a_service() {
        let score = json!({
            "apiVersion": "score.dev/v1b1",
            "metadata": {"name": "web", "annotations": {"team": "checkout"}},
            "containers": {"main": {
                "image": "nginx:1.27", "args": ["-g", "daemon off;"],
                "variables": {"PORT": "8080", "DEBUG": false},
                "resources": {"limits": {"memory": "128Mi"}},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
            }},
            "service": {"ports": {"www": {"port": 80, "targetPort": 8080}}},
        });
        let objects = objects(Some("shop"), "web", &score);
        assert_eq!(objects.len(), 2);
        let deployment = &objects[0].data;
        assert_eq!(deployment["kind"], "Deployment");
        assert_eq!(deployment["metadata"]["annotations"]["team"], "checkout");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["name"], "main");
        assert_eq!(
            container["env"],
            json!([{"name": "DEBUG", "value": "false"}, {"name": "PORT", "value": "8080"}])
        );
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(
            objects[1].data["spec"]["ports"],
            json!([{"name": "www", "port": 80, "targetPort": 8080}])
        );
    }

    #[test]
    fn without_a_service_there_is_only_a_deployment() {
        let score = json!({"metadata": {"name": "job"}, "containers": {"c": {"image": "busybox"}}});
        let objects = objects(None, "job", &score);
        assert_eq!(objects.len(), 1);
        assert_eq!(
            objects[0].data["spec"]["selector"]["matchLabels"][NAME_LABEL],
            "job"
        );
    }
}
