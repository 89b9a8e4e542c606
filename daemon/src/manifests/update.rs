//! Applies a workload's `update` output (see [`crate::model::workload_update`]) to its
//! Kubernetes objects: the Deployment (or other object with a pod template) and the Service.

use serde_json::{Map, Value};

use crate::drivers::Manifest;
use crate::model::workload_update::{self, Op, Patch, Target};

use super::pod_spec_path;

/// Applies every operation of `update` (a list) to `objects`, in order; the first that cannot
/// be applied says why, with its position (`update[1]: ...`).
pub fn apply(objects: &mut [Manifest], update: &Value) -> Result<(), String> {
    let Some(ops) = update.as_array() else {
        return Err("update: is not a list of operations ({op, path, value})".into());
    };
    for (i, op) in ops.iter().enumerate() {
        workload_update::parse(op)
            .and_then(|patch| apply_one(objects, &patch))
            .map_err(|reason| format!("update[{i}]: {reason}"))?;
    }
    Ok(())
}

fn apply_one(objects: &mut [Manifest], patch: &Patch) -> Result<(), String> {
    let workload = || {
        format!(
            "{}: the workload has no object with a pod template to apply it to",
            patch.path
        )
    };
    match &patch.target {
        Target::Pod(path) => {
            let pod = pod_of(objects).ok_or_else(workload)?;
            at_path(pod, path, patch)
        }
        Target::PodMetadata(path) => {
            let meta = pod_metadata(objects).ok_or_else(workload)?;
            at_path(meta, path, patch)
        }
        Target::DeploymentMetadata(path) => {
            let meta = object_with_pods(objects)
                .ok_or_else(workload)?
                .pointer_mut("/metadata")
                .ok_or_else(workload)?;
            at_path(meta, path, patch)
        }
        Target::Labels(below) => {
            let mut path = vec!["labels".to_owned()];
            path.extend(below.iter().cloned());
            let meta = object_with_pods(objects)
                .ok_or_else(workload)?
                .pointer_mut("/metadata")
                .ok_or_else(workload)?;
            at_path(meta, &path, patch)?;
            let meta = pod_metadata(objects).ok_or_else(workload)?;
            at_path(meta, &path, patch)
        }
        Target::ServiceMetadata(path) => {
            let service = objects
                .iter_mut()
                .find(|m| m.data.get("kind").and_then(Value::as_str) == Some("Service"))
                .ok_or_else(|| {
                    format!(
                        "{}: the workload has no Service (its Score file has no service.ports)",
                        patch.path
                    )
                })?;
            let meta = service
                .data
                .as_object_mut()
                .ok_or_else(workload)?
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            at_path(meta, path, patch)
        }
        Target::Variables { container, key } => {
            let c = container_of(objects, container, &patch.path)?;
            let env = env_of(c);
            match (key, patch.op, &patch.value) {
                (Some(key), Op::Remove, _) => env.retain(|e| e["name"] != key.as_str()),
                (Some(key), _, Some(value)) => set_env(env, key, value),
                (None, Op::Remove, _) => env.clear(),
                (None, _, Some(Value::Object(vars))) => {
                    for (key, value) in vars {
                        set_env(env, key, value);
                    }
                }
                (None, _, _) => {
                    return Err(format!(
                        "{}: the value is a mapping of variables (KEY: value)",
                        patch.path
                    ));
                }
                (Some(_), _, None) => {}
            }
            Ok(())
        }
        Target::Env { container } => {
            let c = container_of(objects, container, &patch.path)?;
            let env = env_of(c);
            for entry in patch
                .value
                .as_ref()
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = entry.get("name").cloned().unwrap_or(Value::Null);
                env.retain(|e| e["name"] != name);
                env.push(entry.clone());
            }
            Ok(())
        }
        Target::Container { container, path } => {
            let c = container_of(objects, container, &patch.path)?;
            at_path(c, path, patch)
        }
    }
}

/// The first object with a pod template.
fn object_with_pods(objects: &mut [Manifest]) -> Option<&mut Value> {
    objects
        .iter_mut()
        .map(|m| &mut m.data)
        .find(|d| pod_spec_path(d).is_some())
}

fn pod_of(objects: &mut [Manifest]) -> Option<&mut Value> {
    let object = object_with_pods(objects)?;
    let path = pod_spec_path(object)?;
    let pointer: String = path.iter().map(|k| format!("/{k}")).collect();
    object.pointer_mut(&pointer)
}

fn pod_metadata(objects: &mut [Manifest]) -> Option<&mut Value> {
    let object = object_with_pods(objects)?;
    let path = pod_spec_path(object)?;
    // The pod template's metadata sits beside its spec.
    let pointer: String = path[..path.len() - 1]
        .iter()
        .map(|k| format!("/{k}"))
        .collect();
    let template = object.pointer_mut(&pointer)?.as_object_mut()?;
    Some(
        template
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new())),
    )
}

fn container_of<'a>(
    objects: &'a mut [Manifest],
    name: &str,
    path: &str,
) -> Result<&'a mut Value, String> {
    let pod = pod_of(objects)
        .ok_or_else(|| format!("{path}: the workload has no object with a pod template"))?;
    let containers = pod.get_mut("containers").and_then(Value::as_array_mut);
    let mut known = Vec::new();
    for c in containers.into_iter().flatten() {
        if c["name"] == name {
            return Ok(c);
        }
        known.push(c["name"].as_str().unwrap_or("?").to_owned());
    }
    Err(format!(
        "{path}: the workload has no container '{name}' (it has: {})",
        known.join(", ")
    ))
}

fn env_of(container: &mut Value) -> &mut Vec<Value> {
    let fields = container
        .as_object_mut()
        .expect("containers are objects: the caller found one by name");
    let env = fields
        .entry("env")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !env.is_array() {
        *env = Value::Array(Vec::new());
    }
    env.as_array_mut().expect("made an array just above")
}

fn set_env(env: &mut Vec<Value>, key: &str, value: &Value) {
    let value = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let entry = serde_json::json!({ "name": key, "value": value });
    match env.iter_mut().find(|e| e["name"] == key) {
        Some(e) => *e = entry,
        None => env.push(entry),
    }
}

/// Applies `patch` at `path` below `at`: objects on the way are made for add and replace;
/// a list takes a position or `-` (the end).
fn at_path(at: &mut Value, path: &[String], patch: &Patch) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err(format!("{}: names no field", patch.path));
    };
    let mut here = at;
    for step in parents {
        here = match here {
            Value::Array(items) => {
                let i = index(step, items.len(), &patch.path)?;
                items
                    .get_mut(i)
                    .ok_or_else(|| format!("{}: no item {i}", patch.path))?
            }
            _ => {
                if patch.op == Op::Remove && here.get(step).is_none() {
                    return Ok(());
                }
                if !here.is_object() {
                    *here = Value::Object(Map::new());
                }
                here.as_object_mut()
                    .expect("made an object just above")
                    .entry(step.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
            }
        };
    }
    match (here, patch.op, &patch.value) {
        (Value::Array(items), Op::Remove, _) => {
            let i = index(last, items.len(), &patch.path)?;
            if i < items.len() {
                items.remove(i);
            }
        }
        (Value::Array(items), Op::Add, Some(v)) if last == "-" => items.push(v.clone()),
        (Value::Array(items), Op::Add, Some(v)) => {
            let i = index(last, items.len() + 1, &patch.path)?;
            items.insert(i.min(items.len()), v.clone());
        }
        (Value::Array(items), Op::Replace, Some(v)) => {
            let i = index(last, items.len(), &patch.path)?;
            match items.get_mut(i) {
                Some(item) => *item = v.clone(),
                None => return Err(format!("{}: no item {i} to replace", patch.path)),
            }
        }
        (Value::Object(fields), Op::Remove, _) => {
            fields.remove(last);
        }
        (here, _, Some(v)) => {
            if !here.is_object() {
                *here = Value::Object(Map::new());
            }
            here.as_object_mut()
                .expect("made an object just above")
                .insert(last.clone(), v.clone());
        }
        (_, _, None) => {}
    }
    Ok(())
}

fn index(step: &str, len: usize, path: &str) -> Result<usize, String> {
    if step == "-" {
        return Ok(len);
    }
    step.parse()
        .map_err(|_| format!("{path}: '{step}' is not a position in a list"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::drivers::ManifestLocation;

    fn objects() -> Vec<Manifest> {
        let score = json!({
            "containers": {"main": {"image": "nginx", "variables": {"A": "1"}}},
            "service": {"ports": {"http": {"port": 80}}},
        });
        super::super::workload_objects(Some("shop"), "web", &score, &Default::default(), &[])
    }

    #[test]
    fn hpo_updates_reach_the_pod_the_container_and_the_service() {
        let mut objs = objects();
        apply(
            &mut objs,
            &json!([
                {"op": "add", "path": "/spec/serviceAccountName", "value": "web-sa"},
                {"op": "add", "path": "/spec/pod/annotations", "value": {"a": "b"}},
                {"op": "add", "path": "/spec/containers/main/variables/B", "value": 2},
                {"op": "remove", "path": "/spec/containers/main/variables/A"},
                {"op": "add", "path": "/spec/service/annotations/cloud.google.com~1neg",
                 "value": "{}"},
                {"op": "add", "path": "/spec/tolerations", "value": []},
                {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "gpu"}},
            ]),
        )
        .unwrap();
        let pod = &objs[0].data["spec"]["template"];
        assert_eq!(pod["spec"]["serviceAccountName"], "web-sa");
        assert_eq!(pod["metadata"]["annotations"]["a"], "b");
        assert_eq!(
            pod["spec"]["containers"][0]["env"],
            json!([{"name": "B", "value": "2"}])
        );
        assert_eq!(pod["spec"]["tolerations"], json!([{"key": "gpu"}]));
        assert_eq!(
            objs[1].data["metadata"]["annotations"]["cloud.google.com/neg"],
            "{}"
        );
        assert_eq!(objs[1].location, ManifestLocation::Namespace);
    }

    #[test]
    fn an_unknown_container_or_path_is_refused_with_its_position() {
        let mut objs = objects();
        let err = apply(
            &mut objs,
            &json!([{"op": "add", "path": "/spec/containers/side/variables/X", "value": 1}]),
        )
        .unwrap_err();
        assert!(err.starts_with("update[0]: "), "{err}");
        assert!(err.contains("no container 'side' (it has: main)"), "{err}");
        let err = apply(
            &mut objs,
            &json!([{}, {"op": "add", "path": "/spec/replicas", "value": 3}]),
        )
        .unwrap_err();
        assert!(err.starts_with("update[0]: "), "{err}");
    }
}
