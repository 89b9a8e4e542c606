//! The Deployment and Service of a Score workload, as Humanitec generates them for a workload
//! whose definition gives none: containers with their image, command, arguments, variables,
//! resources, probes, files and volume mounts, and the service's ports.
//!
//! A Score `files` entry becomes a key of the workload's ConfigMap (its Secret when the content
//! holds a secret value), mounted at the entry's target with its mode. A `volumes` entry
//! becomes a volumeMount; when its `source` is a resource (`${resources.NAME}`) the mount is
//! named by the resource's GUResID, which [`super::deployment`] renames to the pod volume that
//! resource gives (its manifest in location `volumes`).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::drivers::{Manifest, ManifestLocation};
use crate::graph::Binding;
use crate::model::template::Template;

/// The label that selects a workload's pods.
const NAME_LABEL: &str = "app.kubernetes.io/name";

/// The resource each Score volume mounts, by container and target: its GUResID.
pub type VolumeSources = BTreeMap<(String, String), String>;

/// The Score volumes of a workload whose `source` is a whole resource (`${resources.NAME}`),
/// from the workload's bound Score file.
pub fn volume_sources(score: &Template<Binding>) -> VolumeSources {
    let mut out = VolumeSources::new();
    let Some(containers) = child(score, "containers") else {
        return out;
    };
    for (container, spec) in entries(containers) {
        let Some(volumes) = child(spec, "volumes") else {
            continue;
        };
        for (key, entry) in entries(volumes) {
            let target = match volumes {
                Template::Array(_) | Template::Value(Value::Array(_)) => {
                    match child(entry, "target").and_then(Template::literal) {
                        Some(Value::String(t)) => t,
                        _ => continue,
                    }
                }
                _ => key,
            };
            if let Some(Template::Whole(binding)) = child(entry, "source")
                && let Binding::Output {
                    target: res, path, ..
                } = &**binding
                && path.is_empty()
            {
                out.insert((container.clone(), target), res.as_str().to_owned());
            }
        }
    }
    out
}

/// The child at `key` of an object template.
fn child<'t>(t: &'t Template<Binding>, key: &str) -> Option<&'t Template<Binding>> {
    match t {
        Template::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
        _ => None,
    }
}

/// The children of an object (by key) or an array (by position) template; plain values hold
/// no binding, so none are listed.
fn entries(t: &Template<Binding>) -> Vec<(String, &Template<Binding>)> {
    match t {
        Template::Object(fields) => fields.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Template::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v))
            .collect(),
        _ => Vec::new(),
    }
}

/// The objects of workload `name` of `app`, from its resolved Score file: `volumes` the
/// resources its Score volumes mount, `secrets` the secret values that reached the file.
pub fn objects(
    app: Option<&str>,
    name: &str,
    score: &Value,
    volumes: &VolumeSources,
    secrets: &[&Value],
) -> Vec<Manifest> {
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
    let mut files = Files::new(name, secrets);
    let containers: Vec<Value> = match score.get("containers") {
        Some(Value::Object(containers)) => containers
            .iter()
            .map(|(c, spec)| {
                let mut out = container(c, spec);
                let mut mounts = files.mount(spec);
                mounts.extend(volume_mounts(c, spec, volumes));
                if !mounts.is_empty() {
                    out["volumeMounts"] = Value::Array(mounts);
                }
                out
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut pod_spec = json!({ "containers": containers });
    if !files.volumes.is_empty() {
        pod_spec["volumes"] = Value::Array(std::mem::take(&mut files.volumes));
    }
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
                    "spec": pod_spec,
                },
            },
        }),
    }];
    objects.extend(files.objects(&labels));
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

/// The entries of a Score `files` or `volumes` section, by target: the mapping form
/// (`TARGET: {...}`) or the older list form (`- target: TARGET`).
fn by_target(section: Option<&Value>) -> Vec<(String, &Value)> {
    match section {
        Some(Value::Object(map)) => map.iter().map(|(t, e)| (t.clone(), e)).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|e| Some((e.get("target")?.as_str()?.to_owned(), e)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The volumeMounts of a container's Score `volumes`: named by the mounted resource's GUResID
/// (renamed when the manifests are put together), or by `source` when it is a name.
fn volume_mounts(container: &str, spec: &Value, volumes: &VolumeSources) -> Vec<Value> {
    by_target(spec.get("volumes"))
        .into_iter()
        .filter_map(|(target, entry)| {
            let name = match volumes.get(&(container.to_owned(), target.clone())) {
                Some(guresid) => guresid.clone(),
                None => entry.get("source")?.as_str()?.to_owned(),
            };
            let mut mount = json!({ "name": name, "mountPath": target });
            if let Some(path) = entry.get("path").and_then(Value::as_str) {
                mount["subPath"] = json!(path.trim_start_matches('/'));
            }
            if entry.get("readOnly") == Some(&Value::Bool(true)) {
                mount["readOnly"] = json!(true);
            }
            Some(mount)
        })
        .collect()
}

/// The ConfigMap and Secret that hold a workload's Score files, and the pod volumes of them.
struct Files<'a> {
    config: String,
    secret: String,
    secrets: &'a [&'a Value],
    config_data: Map<String, Value>,
    binary_data: Map<String, Value>,
    secret_data: Map<String, Value>,
    volumes: Vec<Value>,
}

impl<'a> Files<'a> {
    fn new(workload: &str, secrets: &'a [&'a Value]) -> Self {
        Files {
            config: format!("{workload}-files"),
            secret: format!("{workload}-secret-files"),
            secrets,
            config_data: Map::new(),
            binary_data: Map::new(),
            secret_data: Map::new(),
            volumes: Vec::new(),
        }
    }

    /// Takes a container's Score files; their volumeMounts.
    fn mount(&mut self, spec: &Value) -> Vec<Value> {
        let mut mounts = Vec::new();
        for (target, entry) in by_target(spec.get("files")) {
            let n = self.volumes.len();
            let key = format!("file-{n}");
            let content = entry.get("content").map(|c| match c {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            let binary = entry.get("binaryContent").and_then(Value::as_str);
            let is_secret = content
                .as_deref()
                .is_some_and(|c| self.secrets.iter().any(|s| holds_secret(c, s)));
            let source_key = match (content, binary) {
                (Some(text), _) if is_secret => {
                    self.secret_data.insert(key.clone(), json!(text));
                    "secret"
                }
                (Some(text), _) => {
                    self.config_data.insert(key.clone(), json!(text));
                    "configMap"
                }
                (None, Some(b64)) => {
                    self.binary_data.insert(key.clone(), json!(b64));
                    "configMap"
                }
                (None, None) => continue,
            };
            let mut item = json!({ "key": key, "path": "file" });
            if let Some(mode) = entry
                .get("mode")
                .and_then(Value::as_str)
                .and_then(crate::model::octal_mode)
            {
                item["mode"] = json!(mode);
            }
            let source = if source_key == "secret" {
                json!({ "secretName": self.secret, "items": [item] })
            } else {
                json!({ "name": self.config, "items": [item] })
            };
            let volume_name = format!("files-{n}");
            let mut volume = json!({ "name": volume_name });
            volume[source_key] = source;
            self.volumes.push(volume);
            mounts.push(json!({
                "name": volume_name,
                "mountPath": target,
                "subPath": "file",
                "readOnly": true,
            }));
        }
        mounts
    }

    /// The ConfigMap and the Secret, those that hold something.
    fn objects(&mut self, labels: &Map<String, Value>) -> Vec<Manifest> {
        let mut out = Vec::new();
        if !self.config_data.is_empty() || !self.binary_data.is_empty() {
            let mut data = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": self.config, "labels": labels },
            });
            if !self.config_data.is_empty() {
                data["data"] = Value::Object(std::mem::take(&mut self.config_data));
            }
            if !self.binary_data.is_empty() {
                data["binaryData"] = Value::Object(std::mem::take(&mut self.binary_data));
            }
            out.push(Manifest {
                name: "files-configmap.yaml".into(),
                location: ManifestLocation::Namespace,
                data,
            });
        }
        if !self.secret_data.is_empty() {
            out.push(Manifest {
                name: "files-secret.yaml".into(),
                location: ManifestLocation::Namespace,
                data: json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": { "name": self.secret, "labels": labels },
                    "stringData": Value::Object(std::mem::take(&mut self.secret_data)),
                }),
            });
        }
        out
    }
}

/// Whether `text` holds one of the non-empty strings of `secret`.
fn holds_secret(text: &str, secret: &Value) -> bool {
    match secret {
        Value::String(s) => !s.is_empty() && text.contains(s.as_str()),
        Value::Array(items) => items.iter().any(|v| holds_secret(text, v)),
        Value::Object(map) => map.values().any(|v| holds_secret(text, v)),
        _ => false,
    }
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
        let objects = objects(Some("shop"), "web", &score, &VolumeSources::new(), &[]);
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
        let objects = objects(None, "job", &score, &VolumeSources::new(), &[]);
        assert_eq!(objects.len(), 1);
        assert_eq!(
            objects[0].data["spec"]["selector"]["matchLabels"][NAME_LABEL],
            "job"
        );
    }
}
