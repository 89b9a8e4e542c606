//! The Kubernetes manifests of a deployment: recorded per resource with every secret value
//! hidden, and put together per app for `gitplane manifests` the way Humanitec applies them.
//!
//! A driver gives manifests with a resource (`templates.manifests`, the Kubernetes drivers, an
//! HTTP driver's `manifests`). Those in location `namespace` or `cluster` are objects of their
//! own; `containers` and `volumes` go into the pod spec of each workload that depends on the
//! resource, directly or not. Pure functions of what state recorded: no I/O here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gitplane_state::{LinkRecord, ManifestsRecord, ResourceRecord};
use serde_json::{Map, Value};

use crate::drivers::leaks::Needles;
use crate::drivers::{Manifest, ManifestLocation};

mod update;
mod workload;

pub use update::apply as apply_update;
pub use workload::{VolumeSources, objects as workload_objects, volume_sources};

/// What a secret value becomes in recorded and printed manifests.
pub const HIDDEN: &str = "(secret)";

/// The resource type of workloads, whose manifests host the pods.
pub const WORKLOAD_TYPE: &str = "workload";

/// Whether `manifests` hold an object with a pod template (a workload of its own).
pub fn has_pod_template(manifests: &[Manifest]) -> bool {
    manifests.iter().any(|m| pod_spec_path(&m.data).is_some())
}

/// The manifests of a put as state records them: every string that holds a secret value (any
/// string leaf of `secrets`, or any of `needles` in one of its encoded forms) hidden as a
/// whole, and every value of a `Secret` object's `data` and `stringData`; the full list is
/// kept besides (sealed) only when something was hidden.
pub fn to_record(
    manifests: Vec<Manifest>,
    secrets: &[&Value],
    needles: Option<&Needles>,
) -> ManifestsRecord {
    if manifests.is_empty() {
        return ManifestsRecord {
            shown: "[]".to_owned(),
            full: None,
        };
    }
    let mut values = BTreeSet::new();
    for secret in secrets {
        secret_strings(secret, &mut values);
    }
    let mut list = Value::Array(
        manifests
            .into_iter()
            .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
            .collect(),
    );
    // The full list's text first, then the secrets hidden in place: most lists hide nothing,
    // and then that text is what is shown, with no copy of the list.
    let full = list.to_string();
    let mut hid = false;
    if let Value::Array(items) = &mut list {
        for item in items {
            if let Some(data) = item.get_mut("data") {
                hid |= hide_secret_object(data);
                hid |= hide_strings(data, &values, needles);
            }
        }
    }
    if hid {
        ManifestsRecord {
            shown: list.to_string(),
            full: Some(full),
        }
    } else {
        ManifestsRecord {
            shown: full,
            full: None,
        }
    }
}

/// Every non-empty string leaf of `value` (an empty secret would hide every string).
fn secret_strings(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::String(s) if !s.is_empty() => {
            out.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|v| secret_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| secret_strings(v, out)),
        _ => {}
    }
}

/// Hides the values of a Kubernetes `Secret`'s `data` and `stringData`; whether it did.
fn hide_secret_object(object: &mut Value) -> bool {
    if object.get("kind").and_then(Value::as_str) != Some("Secret") {
        return false;
    }
    let mut hid = false;
    for key in ["data", "stringData"] {
        if let Some(Value::Object(entries)) = object.get_mut(key) {
            for value in entries.values_mut() {
                *value = Value::String(HIDDEN.to_owned());
                hid = true;
            }
        }
    }
    hid
}

/// Hides, as a whole, every string of `value` that contains one of `secrets`, or one of
/// `needles` in any of its forms; whether it did.
fn hide_strings(value: &mut Value, secrets: &BTreeSet<String>, needles: Option<&Needles>) -> bool {
    match value {
        Value::String(s)
            if s != HIDDEN
                && (secrets.iter().any(|secret| s.contains(secret))
                    || needles.is_some_and(|n| n.found_in(s))) =>
        {
            *s = HIDDEN.to_owned();
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |hid, v| hide_strings(v, secrets, needles) | hid),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |hid, v| hide_strings(v, secrets, needles) | hid),
        _ => false,
    }
}

/// One Kubernetes object of a deployment, and the resource it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub app: Option<String>,
    pub res_type: String,
    pub res_id: String,
    pub guresid: String,
    /// Its name among its resource's manifests.
    pub name: String,
    pub location: ManifestLocation,
    pub data: Value,
}

/// The manifests of the deployments of an environment's apps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Deployment {
    /// Cluster objects first, then namespace objects; by app, resource and name within each.
    pub objects: Vec<Object>,
    /// Containers and volumes that no workload's pod spec could take, and why.
    pub unplaced: Vec<String>,
}

/// Puts the recorded manifests of an environment together: the objects of `apps` (every app
/// when empty), each workload's pod spec given the containers and volumes of the resources it
/// depends on. `manifests` holds each resource's recorded list (see [`to_record`]).
pub fn deployment(
    resources: &[ResourceRecord],
    links: &[LinkRecord],
    manifests: &[(String, Value)],
    apps: &BTreeSet<String>,
) -> Deployment {
    let by_id: HashMap<&str, &ResourceRecord> =
        resources.iter().map(|r| (r.guresid.as_str(), r)).collect();
    let mut providers: HashMap<&str, Vec<&str>> = HashMap::new();
    for link in links {
        providers
            .entry(link.consumer.as_str())
            .or_default()
            .push(link.provider.as_str());
    }
    let listed: HashMap<&str, Vec<Manifest>> = manifests
        .iter()
        .filter_map(|(guresid, list)| {
            let items: Vec<Manifest> = serde_json::from_value(list.clone()).ok()?;
            Some((guresid.as_str(), items))
        })
        .collect();
    let wanted =
        |app: &Option<String>| apps.is_empty() || app.as_ref().is_some_and(|a| apps.contains(a));

    // What each app's deployment holds: its own resources and the shared ones they use.
    let mut in_deployment: BTreeSet<&str> = BTreeSet::new();
    for rec in resources
        .iter()
        .filter(|r| r.app.is_some() && wanted(&r.app))
    {
        in_deployment.extend(closure(rec.guresid.as_str(), &providers));
    }
    let mut objects = Vec::new();
    let mut unplaced = Vec::new();
    // Pod parts each workload takes, by the workload's GUResID.
    let mut pod_parts: BTreeMap<&str, Vec<(&ResourceRecord, &Manifest)>> = BTreeMap::new();
    for rec in resources
        .iter()
        .filter(|r| r.res_type == WORKLOAD_TYPE && wanted(&r.app))
    {
        for id in closure(rec.guresid.as_str(), &providers) {
            let (Some(from), Some(items)) = (by_id.get(id), listed.get(id)) else {
                continue;
            };
            for m in items.iter().filter(|m| is_pod_part(m.location)) {
                pod_parts
                    .entry(rec.guresid.as_str())
                    .or_default()
                    .push((from, m));
            }
        }
    }
    let placed: BTreeSet<&str> = pod_parts
        .values()
        .flatten()
        .map(|(r, _)| r.guresid.as_str())
        .collect();
    for id in &in_deployment {
        let (Some(rec), Some(items)) = (by_id.get(id), listed.get(id)) else {
            continue;
        };
        for m in items.iter().filter(|m| !is_pod_part(m.location)) {
            objects.push(Object {
                app: rec.app.clone(),
                res_type: rec.res_type.clone(),
                res_id: rec.res_id.clone(),
                guresid: rec.guresid.clone(),
                name: m.name.clone(),
                location: m.location,
                data: m.data.clone(),
            });
        }
        if items.iter().any(|m| is_pod_part(m.location)) && !placed.contains(id) {
            unplaced.push(format!(
                "{}: its containers and volumes go to the workloads that depend on it, and \
                 none does",
                label(rec)
            ));
        }
    }
    for (workload, parts) in pod_parts {
        let Some(pod) = objects
            .iter_mut()
            .filter(|o| o.guresid == workload)
            .find_map(|o| pod_spec(&mut o.data))
        else {
            let rec = by_id[workload];
            for (from, m) in parts {
                unplaced.push(format!(
                    "{} gives {} '{}' to workload {}, which has no manifest with a pod template \
                     (a Deployment, StatefulSet, DaemonSet, Job or CronJob from its definition)",
                    label(from),
                    location_name(m.location),
                    m.name,
                    label(rec)
                ));
            }
            continue;
        };
        // The pod volume each resource gives, for the Score volumes that mount it.
        let mut volume_of: HashMap<&str, &str> = HashMap::new();
        for (from, m) in &parts {
            let key = match m.location {
                ManifestLocation::Containers => "containers",
                _ => {
                    if let Some(name) = m.data.get("name").and_then(Value::as_str) {
                        volume_of.entry(from.guresid.as_str()).or_insert(name);
                    }
                    "volumes"
                }
            };
            let list = pod.entry(key).or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(items) = list {
                items.push(m.data.clone());
            }
        }
        name_volume_mounts(pod, &volume_of, &by_id, by_id[workload], &mut unplaced);
    }
    // A workload without pod parts may still mount a resource that gives no pod volume.
    for o in objects
        .iter_mut()
        .filter(|o| o.res_type == WORKLOAD_TYPE && by_id.contains_key(o.guresid.as_str()))
    {
        let rec = by_id[o.guresid.as_str()];
        if let Some(pod) = pod_spec(&mut o.data) {
            name_volume_mounts(pod, &HashMap::new(), &by_id, rec, &mut unplaced);
        }
    }
    objects.sort_by(|a, b| {
        (
            a.location != ManifestLocation::Cluster,
            &a.app,
            &a.res_id,
            &a.res_type,
            &a.name,
        )
            .cmp(&(
                b.location != ManifestLocation::Cluster,
                &b.app,
                &b.res_id,
                &b.res_type,
                &b.name,
            ))
    });
    Deployment { objects, unplaced }
}

/// Renames each volumeMount that names a resource (by GUResID, as the generated Deployment
/// of a Score volume does) to the pod volume that resource gives; a resource that gives none
/// is reported, its mount left out.
fn name_volume_mounts(
    pod: &mut Map<String, Value>,
    volume_of: &HashMap<&str, &str>,
    by_id: &HashMap<&str, &ResourceRecord>,
    workload: &ResourceRecord,
    unplaced: &mut Vec<String>,
) {
    let Some(Value::Array(containers)) = pod.get_mut("containers") else {
        return;
    };
    for container in containers {
        let Some(Value::Array(mounts)) = container.get_mut("volumeMounts") else {
            continue;
        };
        mounts.retain_mut(|mount| {
            let Some(name) = mount.get("name").and_then(Value::as_str) else {
                return true;
            };
            let Some(from) = by_id.get(name) else {
                return true;
            };
            match volume_of.get(name) {
                Some(volume) => {
                    mount["name"] = Value::String((*volume).to_owned());
                    true
                }
                None => {
                    unplaced.push(format!(
                        "workload {} mounts {} at {}, which gives no pod volume (a manifest in \
                         location volumes)",
                        label(workload),
                        label(from),
                        mount
                            .get("mountPath")
                            .and_then(Value::as_str)
                            .unwrap_or("?"),
                    ));
                    false
                }
            }
        });
    }
}

fn is_pod_part(location: ManifestLocation) -> bool {
    matches!(
        location,
        ManifestLocation::Containers | ManifestLocation::Volumes
    )
}

fn location_name(location: ManifestLocation) -> &'static str {
    match location {
        ManifestLocation::Containers => "container",
        ManifestLocation::Volumes => "volume",
        ManifestLocation::Namespace => "namespace object",
        ManifestLocation::Cluster => "cluster object",
    }
}

fn label(rec: &ResourceRecord) -> String {
    match &rec.app {
        Some(app) => format!("{app}/{}.{}#{}", rec.res_type, rec.class, rec.res_id),
        None => format!("{}.{}#{}", rec.res_type, rec.class, rec.res_id),
    }
}

/// `from` and every resource it depends on, directly or not.
fn closure<'a>(from: &'a str, providers: &HashMap<&'a str, Vec<&'a str>>) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::from([from]);
    let mut todo = vec![from];
    while let Some(id) = todo.pop() {
        for &p in providers.get(id).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(p) {
                todo.push(p);
            }
        }
    }
    seen
}

/// Where a workload object keeps its pod spec (`spec.template.spec`, or a CronJob's
/// `spec.jobTemplate.spec.template.spec`); `None` for objects without pods.
fn pod_spec_path(object: &Value) -> Option<&'static [&'static str]> {
    match object.get("kind").and_then(Value::as_str)? {
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
            Some(&["spec", "template", "spec"])
        }
        "CronJob" => Some(&["spec", "jobTemplate", "spec", "template", "spec"]),
        _ => None,
    }
}

/// The pod spec of a workload object, made where it is missing.
fn pod_spec(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let path = pod_spec_path(object)?;
    let mut at = object;
    for key in path {
        at = at
            .as_object_mut()?
            .entry(*key)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    at.as_object_mut()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn manifest(name: &str, location: ManifestLocation, data: Value) -> Manifest {
        Manifest {
            name: name.into(),
            location,
            data,
        }
    }

    #[test]
    fn secret_values_are_hidden_in_what_is_shown_and_kept_in_full() {
        let secret = manifest(
            "secret.yaml",
            ManifestLocation::Namespace,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
                   "data": {"password": "aHVudGVyMg=="}, "stringData": {"user": "app"}}),
        );
        let config = manifest(
            "config.yaml",
            ManifestLocation::Namespace,
            json!({"kind": "ConfigMap", "data": {"url": "postgres://app:hunter2@db:5432/app",
                   "host": "db"}}),
        );
        let record = to_record(
            vec![secret, config],
            &[&json!({"password": "hunter2"}), &json!({"empty": ""})],
            None,
        );
        assert!(!record.shown.contains("hunter2"), "{}", record.shown);
        assert!(!record.shown.contains("aHVudGVyMg=="), "{}", record.shown);
        let shown: Value = serde_json::from_str(&record.shown).unwrap();
        assert_eq!(shown[0]["data"]["data"]["password"], HIDDEN);
        assert_eq!(shown[0]["data"]["stringData"]["user"], HIDDEN);
        assert_eq!(shown[1]["data"]["data"]["url"], HIDDEN);
        // An empty secret hides nothing; other strings stay.
        assert_eq!(shown[1]["data"]["data"]["host"], "db");
        let full = record.full.expect("something was hidden");
        assert!(full.contains("postgres://app:hunter2@db:5432/app"));
    }

    #[test]
    fn manifests_without_secrets_are_kept_once() {
        let record = to_record(
            vec![manifest(
                "a",
                ManifestLocation::Cluster,
                json!({"kind": "Namespace"}),
            )],
            &[&json!({"password": "hunter2"})],
            None,
        );
        assert_eq!(record.full, None);
        assert!(to_record(Vec::new(), &[], None).is_empty());
    }

    #[test]
    fn encoded_secrets_and_credentials_the_call_received_are_hidden() {
        let config = manifest(
            "config.yaml",
            ManifestLocation::Namespace,
            json!({"kind": "ConfigMap", "data": {
                "token": "QmVhcmVyIGFjY3QtdG9rZW4tOTk=",
                "key": "acct-token-99",
                "host": "db",
            }}),
        );
        let needles = Needles::of([&json!({"account": {"key": "acct-token-99"}})]);
        let record = to_record(vec![config], &[&json!({})], Some(&needles));
        let shown: Value = serde_json::from_str(&record.shown).unwrap();
        assert_eq!(shown[0]["data"]["data"]["token"], HIDDEN, "base64 of it");
        assert_eq!(shown[0]["data"]["data"]["key"], HIDDEN);
        assert_eq!(shown[0]["data"]["data"]["host"], "db");
        assert!(record.full.is_some_and(|f| f.contains("acct-token-99")));
    }
}
