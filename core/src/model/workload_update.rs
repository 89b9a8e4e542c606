//! A workload's `update` output: the JSON-patch-like operations (`op`, `path`, `value`) that a
//! workload definition gives to change the workload's spec, and where each path lands in the
//! workload's Kubernetes objects, as Humanitec's default workload profile maps them.
//!
//! Paths start at `/spec`, with JSON Pointer escapes (`~1` for `/`, `~0` for `~`):
//!
//! | path | lands in |
//! |---|---|
//! | `/spec/serviceAccountName`, `/spec/FIELD...` (FIELD a pod spec field, see [`POD_FIELDS`]) | the pod spec |
//! | `/spec/pod/annotations`, `/spec/pod/labels` (`/KEY`) | the pod template's metadata |
//! | `/spec/pod/FIELD...` | the pod spec |
//! | `/spec/annotations` (`/KEY`) | the pod template's annotations (HPO's older `annotations` feature) |
//! | `/spec/labels` (`/KEY`) | the Deployment's and the pod template's labels |
//! | `/spec/deployment/annotations`, `/spec/deployment/labels` (`/KEY`) | the Deployment's metadata |
//! | `/spec/service/annotations`, `/spec/service/labels` (`/KEY`) | the Service's metadata |
//! | `/spec/containers/NAME/variables` (`/KEY`) | the container's `env`, one entry per variable |
//! | `/spec/containers/NAME/env` | entries added to the container's `env` |
//! | `/spec/containers/NAME/FIELD...` (FIELD a container field, see [`CONTAINER_FIELDS`]) | the container |
//!
//! Anything else is refused, never ignored.

use serde_json::Value;

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Replace,
    Remove,
}

/// Where an operation's path lands; each `Vec<String>` is the rest of the path below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A field of the pod spec (`serviceAccountName`, `affinity`, ...).
    Pod(Vec<String>),
    /// The pod template's `annotations` or `labels` (the first step), and below.
    PodMetadata(Vec<String>),
    /// The Deployment's `annotations` or `labels`, and below.
    DeploymentMetadata(Vec<String>),
    /// `labels` of both the Deployment and the pod template: the steps below `labels`.
    Labels(Vec<String>),
    /// The Service's `annotations` or `labels`, and below.
    ServiceMetadata(Vec<String>),
    /// Container NAME's variables: all of them (no key) or one.
    Variables {
        container: String,
        key: Option<String>,
    },
    /// Entries added to container NAME's `env`.
    Env { container: String },
    /// A field of container NAME, and below.
    Container {
        container: String,
        path: Vec<String>,
    },
}

/// One operation of an `update` output.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch {
    pub op: Op,
    /// As written, for messages.
    pub path: String,
    pub target: Target,
    /// `None` for `remove`.
    pub value: Option<Value>,
}

/// The pod spec fields a path may set (`/spec/FIELD` or `/spec/pod/FIELD`). `containers` and
/// `volumes` are not among them: a workload's containers are its Score file's, and pod volumes
/// come from the resources it mounts.
pub const POD_FIELDS: &[&str] = &[
    "affinity",
    "automountServiceAccountToken",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "hostAliases",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "hostname",
    "imagePullSecrets",
    "initContainers",
    "nodeName",
    "nodeSelector",
    "os",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "readinessGates",
    "runtimeClassName",
    "schedulerName",
    "securityContext",
    "serviceAccountName",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "terminationGracePeriodSeconds",
    "tolerations",
    "topologySpreadConstraints",
];

/// The container fields a path may set (`/spec/containers/NAME/FIELD`).
pub const CONTAINER_FIELDS: &[&str] = &[
    "args",
    "command",
    "image",
    "imagePullPolicy",
    "lifecycle",
    "livenessProbe",
    "ports",
    "readinessProbe",
    "resources",
    "securityContext",
    "startupProbe",
    "stdin",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
    "workingDir",
];

/// Parses one operation of an `update` list.
pub fn parse(op: &Value) -> Result<Patch, String> {
    let Some(fields) = op.as_object() else {
        return Err("is not a mapping: write `{op: add, path: /spec/..., value: ...}`".into());
    };
    let kind = match fields.get("op").and_then(Value::as_str) {
        Some("add") => Op::Add,
        Some("replace") => Op::Replace,
        Some("remove") => Op::Remove,
        Some(other) => {
            return Err(format!(
                "op '{}' is not supported: gitplane applies add, replace and remove",
                short(other)
            ));
        }
        None => return Err("has no `op` (add, replace or remove)".into()),
    };
    let Some(path) = fields.get("path").and_then(Value::as_str) else {
        return Err("has no `path` (such as /spec/serviceAccountName)".into());
    };
    let target = classify(path)?;
    let value = match (kind, fields.get("value")) {
        (Op::Remove, _) => None,
        (_, Some(v)) => Some(v.clone()),
        (_, None) => return Err(format!("{} has no `value`", short(path))),
    };
    if let (Target::Env { .. }, Some(v)) = (&target, &value)
        && !v.is_array()
    {
        return Err(format!(
            "{}: the value is a list of env entries ({{name, value}})",
            short(path)
        ));
    }
    if let (Target::Env { .. }, Op::Remove) = (&target, kind) {
        return Err(format!(
            "{}: remove is not supported on env; remove a variable instead \
             (/spec/containers/NAME/variables/KEY)",
            short(path)
        ));
    }
    Ok(Patch {
        op: kind,
        path: path.to_owned(),
        target,
        value,
    })
}

/// Where `path` lands; why not when gitplane does not map it.
pub fn classify(path: &str) -> Result<Target, String> {
    let unsupported = || {
        format!(
            "path '{}' is not one gitplane maps to the workload's objects: it maps \
             /spec/serviceAccountName and the other pod spec fields (/spec/FIELD or \
             /spec/pod/FIELD), /spec/pod/annotations, /spec/pod/labels, /spec/annotations, \
             /spec/labels, /spec/deployment/annotations, /spec/deployment/labels, \
             /spec/service/annotations, /spec/service/labels, \
             /spec/containers/NAME/variables/KEY, /spec/containers/NAME/env and \
             /spec/containers/NAME/FIELD (docs/manifests.md)",
            short(path)
        )
    };
    let Some(rest) = path.strip_prefix("/spec/") else {
        return Err(unsupported());
    };
    let steps: Vec<String> = rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    if steps.iter().any(String::is_empty) {
        return Err(unsupported());
    }
    let parts: Vec<&str> = steps.iter().map(String::as_str).collect();
    let tail = |from: usize| steps[from..].to_vec();
    let is_meta = |s: &str| s == "annotations" || s == "labels";
    Ok(match parts.as_slice() {
        [field, ..] if POD_FIELDS.contains(field) => Target::Pod(tail(0)),
        ["annotations", ..] => Target::PodMetadata(tail(0)),
        ["labels", ..] => Target::Labels(tail(1)),
        ["pod", meta, ..] if is_meta(meta) => Target::PodMetadata(tail(1)),
        ["pod", field, ..] if POD_FIELDS.contains(field) => Target::Pod(tail(1)),
        ["deployment", meta, ..] if is_meta(meta) => Target::DeploymentMetadata(tail(1)),
        ["service", meta, ..] if is_meta(meta) => Target::ServiceMetadata(tail(1)),
        ["containers", name, "variables"] => Target::Variables {
            container: (*name).to_owned(),
            key: None,
        },
        ["containers", name, "variables", key] => Target::Variables {
            container: (*name).to_owned(),
            key: Some((*key).to_owned()),
        },
        ["containers", name, "env"] => Target::Env {
            container: (*name).to_owned(),
        },
        ["containers", name, field, ..] if CONTAINER_FIELDS.contains(field) => Target::Container {
            container: (*name).to_owned(),
            path: tail(2),
        },
        _ => return Err(unsupported()),
    })
}

/// The `path:` values of an `update` list written in a definition's template text that
/// gitplane does not map, each with the text to find its line by and why. A template action in
/// a path (`/spec/containers/{{ $id }}/env`) stands for one step.
pub fn unsupported_paths_in(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_update = false;
    let mut update_indent = 0;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("{{") {
            continue;
        }
        if trimmed.starts_with("update:") {
            in_update = true;
            update_indent = indent;
            continue;
        }
        if in_update && indent <= update_indent && !trimmed.starts_with('-') {
            in_update = false;
        }
        if !in_update {
            continue;
        }
        let item = trimmed.trim_start_matches("- ");
        let Some(path) = item.strip_prefix("path:") else {
            continue;
        };
        let path = path.trim().trim_matches(|c| c == '"' || c == '\'');
        if !path.starts_with('/') {
            continue;
        }
        // An action stands for any step: the path is refused only when no step would do.
        let probe = without_actions(path, "x");
        let Err(reason) = classify(&probe) else {
            continue;
        };
        let keywords = [
            "annotations",
            "labels",
            "pod",
            "deployment",
            "service",
            "containers",
        ];
        let keywords = ["variables", "env"].into_iter().chain(keywords);
        let mut steps = keywords
            .chain(POD_FIELDS.iter().copied())
            .chain(CONTAINER_FIELDS.iter().copied());
        if probe != path && steps.any(|step| classify(&without_actions(path, step)).is_ok()) {
            continue;
        }
        out.push((
            format!("path: {}", path.trim()),
            reason.replace(&probe, path),
        ));
    }
    out
}

/// `path` with each `{{ ... }}` replaced by `step`.
fn without_actions(path: &str, step: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        match rest[start..].find("}}") {
            Some(end) => {
                out.push_str(step);
                rest = &rest[start + end + 2..];
            }
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

fn short(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn hpo_paths_land_where_the_default_profile_puts_them() {
        assert_eq!(
            classify("/spec/serviceAccountName"),
            Ok(Target::Pod(vec!["serviceAccountName".into()]))
        );
        assert_eq!(
            classify("/spec/service/annotations/cloud.google.com~1neg"),
            Ok(Target::ServiceMetadata(vec![
                "annotations".into(),
                "cloud.google.com/neg".into()
            ]))
        );
        assert_eq!(
            classify("/spec/containers/main/variables/OTEL_ENDPOINT"),
            Ok(Target::Variables {
                container: "main".into(),
                key: Some("OTEL_ENDPOINT".into())
            })
        );
        assert_eq!(
            classify("/spec/pod/initContainers"),
            Ok(Target::Pod(vec!["initContainers".into()]))
        );
        assert!(classify("/spec/replicas").is_err());
        assert!(classify("/metadata/name").is_err());
        assert!(classify("/spec/containers/main/volumeMounts").is_err());
    }

    #[test]
    fn ops_other_than_add_replace_remove_are_refused() {
        let err = parse(&json!({"op": "move", "from": "/spec/a", "path": "/spec/b"})).unwrap_err();
        assert!(err.contains("op 'move' is not supported"), "{err}");
        let err = parse(&json!({"op": "add", "path": "/spec/serviceAccountName"})).unwrap_err();
        assert!(err.contains("has no `value`"), "{err}");
    }

    #[test]
    fn unsupported_paths_are_found_in_template_text_with_actions_as_steps() {
        let text = "update:\n  {{- range $id, $c := .resource.spec.containers }}\n  - op: add\n    \
                    path: /spec/containers/{{ $id }}/env\n    value: []\n  {{- end }}\n  - op: add\n    \
                    path: /spec/replicas\n    value: 3\n  - op: add\n    \
                    path: /spec/{{ .driver.values.field }}\n    value: 1\n  - op: add\n    \
                    path: /metadata/{{ .driver.values.field }}\n    value: 1\nother: 1\n";
        let found = unsupported_paths_in(text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, "path: /spec/replicas");
        assert_eq!(found[1].0, "path: /metadata/{{ .driver.values.field }}");
    }
}
