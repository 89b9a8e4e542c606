//! `humanitec/volume-pvc` and `humanitec/volume-nfs`: a `PersistentVolumeClaim` for a
//! workload's `volume` resource and the pod volume that mounts it; for NFS also the
//! `PersistentVolume` the claim binds to.
//!
//! `volume-pvc` leaves the disk to the cluster's dynamic provisioning (the storage class), so
//! it makes no PersistentVolume. The pod volume goes to the `volumes` location, to be added to
//! the pods of every workload that mounts the resource (`source: ${resources.<name>}`).

use serde_json::{Map, Value, json};

use super::super::{DeleteOutcome, Driver, DriverError, DriverRequest, Manifest};
use super::super::{ManifestLocation, PutOutcome};
use super::{
    NameRule, Section, done, is_dns_subdomain, is_positive_quantity, object_name, resource_base,
};

const PVC_DRIVER: &str = "humanitec/volume-pvc";
const NFS_DRIVER: &str = "humanitec/volume-nfs";

const PVC_VALUES: [&str; 4] = ["access_modes", "capacity", "labels", "storage_class_name"];
const NFS_VALUES: [&str; 5] = ["access_modes", "capacity", "labels", "path", "server"];

/// The claim's size when the definition gives none.
const DEFAULT_CAPACITY: &str = "10Gi";

const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// Renders a PersistentVolumeClaim, dynamically provisioned, and its pod volume.
#[derive(Debug, Clone, Copy, Default)]
pub struct VolumePvcDriver;

/// Renders a PersistentVolume on an NFS export, the claim bound to it, and its pod volume.
#[derive(Debug, Clone, Copy, Default)]
pub struct VolumeNfsDriver;

/// What both drivers read the same way.
struct Claim {
    access_modes: Vec<&'static str>,
    capacity: String,
    labels: Option<Map<String, Value>>,
    /// The PersistentVolumeClaim's name.
    name: String,
    /// The pod volume's name.
    volume: String,
}

impl Claim {
    fn read(
        values: &Section<'_>,
        request: &DriverRequest<'_>,
        default_mode: &'static str,
    ) -> Result<Self, DriverError> {
        let base = resource_base(request);
        Ok(Claim {
            access_modes: access_modes(values, default_mode)?,
            capacity: capacity(values)?,
            labels: values.labels("labels")?,
            name: object_name(&base, "pvc", NameRule::Subdomain),
            volume: object_name(&base, "volume", NameRule::Label),
        })
    }

    fn metadata(&self, name: &str) -> Value {
        let mut metadata = Map::new();
        metadata.insert("name".into(), name.into());
        if let Some(labels) = &self.labels {
            metadata.insert("labels".into(), Value::Object(labels.clone()));
        }
        Value::Object(metadata)
    }

    /// The claim; `spec` holds what the driver adds (a storage class, a volume to bind).
    fn manifest(&self, mut spec: Map<String, Value>) -> Manifest {
        spec.insert("accessModes".into(), json!(self.access_modes));
        spec.insert(
            "resources".into(),
            json!({ "requests": { "storage": self.capacity } }),
        );
        Manifest {
            name: "pvc.yaml".into(),
            location: ManifestLocation::Namespace,
            data: json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": self.metadata(&self.name),
                "spec": spec,
            }),
        }
    }

    /// The pod volume that mounts the claim.
    fn volume(&self) -> Manifest {
        Manifest {
            name: "volume.yaml".into(),
            location: ManifestLocation::Volumes,
            data: json!({
                "name": self.volume,
                "persistentVolumeClaim": { "claimName": self.name },
            }),
        }
    }

    fn outputs(&self) -> Map<String, Value> {
        let mut outputs = Map::new();
        outputs.insert("pvcName".into(), self.name.clone().into());
        outputs.insert("volumeName".into(), self.volume.clone().into());
        outputs
    }
}

/// `access_modes`: one mode, several separated by commas, or a sequence of modes.
fn access_modes(
    values: &Section<'_>,
    default: &'static str,
) -> Result<Vec<&'static str>, DriverError> {
    let written: Vec<&str> = match values.get("access_modes") {
        None => return Ok(vec![default]),
        Some(Value::String(text)) => text.split(',').map(str::trim).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::trim))
            .collect::<Option<_>>()
            .ok_or_else(|| values.error("access_modes", "must hold only strings"))?,
        Some(other) => {
            return Err(values.error(
                "access_modes",
                format_args!(
                    "must be a string or a sequence of strings, got {}",
                    super::kind(other)
                ),
            ));
        }
    };
    let mut modes = Vec::new();
    for mode in written {
        let known = ACCESS_MODES
            .iter()
            .find(|known| known.eq_ignore_ascii_case(mode))
            .ok_or_else(|| {
                values.error(
                    "access_modes",
                    format_args!(
                        "holds a mode that is not one of {}",
                        ACCESS_MODES.join(", ")
                    ),
                )
            })?;
        if !modes.contains(known) {
            modes.push(*known);
        }
    }
    if modes.is_empty() {
        return Err(values.error("access_modes", "is empty: write ReadWriteOnce, for example"));
    }
    Ok(modes)
}

/// `capacity`: a Kubernetes quantity (`10Gi`), or a number of bytes.
fn capacity(values: &Section<'_>) -> Result<String, DriverError> {
    let hint = "must be a size such as 10Gi or 500Mi (a number with an optional unit: Ki, Mi, \
                Gi, Ti, k, M, G, T…)";
    let text = match values.get("capacity") {
        None => return Ok(DEFAULT_CAPACITY.to_owned()),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(values.error(
                "capacity",
                format_args!("{hint}, got {}", super::kind(other)),
            ));
        }
    };
    if is_positive_quantity(&text) {
        Ok(text)
    } else {
        Err(values.error("capacity", hint))
    }
}

impl Driver for VolumePvcDriver {
    /// Always the same outputs: `pvcName` and `volumeName`.
    fn known_outputs(
        &self,
        _values: &Value,
        _secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        Some(
            ["pvcName", "volumeName"]
                .iter()
                .map(|n| n.to_string())
                .collect(),
        )
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let values = Section::new(PVC_DRIVER, "values", request.values)?.only(&PVC_VALUES)?;
        Section::new(PVC_DRIVER, "secrets", request.secrets)?.only(&[])?;
        let claim = Claim::read(&values, request, "ReadWriteOnce")?;
        let mut spec = Map::new();
        if let Some(class) = values.string("storage_class_name")? {
            if !is_dns_subdomain(class) {
                return Err(values.error(
                    "storage_class_name",
                    "is not a StorageClass name: lower-case letters, digits, '-' and '.'",
                ));
            }
            spec.insert("storageClassName".into(), class.into());
        }
        let manifests = vec![claim.manifest(spec), claim.volume()];
        Ok(done(Value::Object(claim.outputs()), json!({}), manifests))
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }
}

impl Driver for VolumeNfsDriver {
    /// Always the same outputs: `pvcName`, `volumeName` and `pvName`.
    fn known_outputs(
        &self,
        _values: &Value,
        _secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        Some(
            ["pvcName", "volumeName", "pvName"]
                .iter()
                .map(|n| n.to_string())
                .collect(),
        )
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let values = Section::new(NFS_DRIVER, "values", request.values)?.only(&NFS_VALUES)?;
        Section::new(NFS_DRIVER, "secrets", request.secrets)?.only(&[])?;
        let server = values.required_string(
            "server",
            "write the NFS server's host name or address (nfs-server.default.svc.cluster.local)",
        )?;
        if server.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(values.error(
                "server",
                "must be a host name or address, without spaces or '/'",
            ));
        }
        let path = values.required_string("path", "write the exported directory, such as /")?;
        if !path.starts_with('/') {
            return Err(values.error("path", "must be an absolute path, beginning with '/'"));
        }
        // An NFS export is shared by nature: many pods may write to it at once.
        let claim = Claim::read(&values, request, "ReadWriteMany")?;

        // PersistentVolumes are cluster-wide: the GUResID keeps apart the volumes of the
        // same resource ID in other apps and environments.
        let unique = request.guresid.get(..12).unwrap_or(request.guresid);
        let pv_name = object_name(
            &format!("{}-{unique}", resource_base(request)),
            "pv",
            NameRule::Subdomain,
        );
        let pv = Manifest {
            name: "pv.yaml".into(),
            location: ManifestLocation::Cluster,
            data: json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": claim.metadata(&pv_name),
                "spec": {
                    "accessModes": claim.access_modes,
                    "capacity": { "storage": claim.capacity },
                    "nfs": { "server": server, "path": path },
                    // Deleting the claim must never delete what is on the export.
                    "persistentVolumeReclaimPolicy": "Retain",
                    // No storage class: the claim binds to this volume, not a provisioned one.
                    "storageClassName": "",
                },
            }),
        };
        let mut spec = Map::new();
        spec.insert("storageClassName".into(), "".into());
        spec.insert("volumeName".into(), pv_name.clone().into());
        let manifests = vec![pv, claim.manifest(spec), claim.volume()];
        let mut outputs = claim.outputs();
        outputs.insert("pvName".into(), pv_name.into());
        Ok(done(Value::Object(outputs), json!({}), manifests))
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::test_request::{Inputs, request};
    use super::super::golden;
    use super::*;

    fn inputs(values: Value) -> Inputs {
        Inputs {
            resource: Value::Null,
            values,
            secrets: json!({}),
            account: None,
        }
    }

    /// The volume `data` of workload `web`.
    fn put(driver: &dyn Driver, inputs: &Inputs) -> Result<PutOutcome, DriverError> {
        let mut req = request(inputs, None);
        req.res_type = "volume";
        req.res_id = "modules.web.externals.data";
        driver.put(&req)
    }

    fn done_parts(outcome: PutOutcome) -> (Value, Vec<Manifest>) {
        match outcome {
            PutOutcome::Done {
                outputs,
                secret_outputs,
                manifests,
                ..
            } => {
                assert_eq!(secret_outputs, json!({}));
                (outputs, manifests)
            }
            other => panic!("not done: {other:?}"),
        }
    }

    #[test]
    fn the_example_ebs_volume() {
        // The example library's `volume-ebs` definition.
        let ebs = inputs(json!({
            "access_modes": "ReadWriteOnce",
            "capacity": "5Gi",
            "storage_class_name": "ebs-sc",
        }));
        let (outputs, manifests) = done_parts(put(&VolumePvcDriver, &ebs).unwrap());
        let locations: Vec<_> = manifests.iter().map(|m| m.location).collect();
        assert_eq!(
            locations,
            [ManifestLocation::Namespace, ManifestLocation::Volumes]
        );
        // The pod volume names the claim, and the outputs name both.
        let claim = &manifests[0].data["metadata"]["name"];
        assert_eq!(
            manifests[1].data["persistentVolumeClaim"]["claimName"],
            *claim
        );
        assert_eq!(outputs["pvcName"], *claim);
        assert_eq!(outputs["volumeName"], manifests[1].data["name"]);
        assert_eq!(claim, "modules.web.externals.data-pvc");
        golden::check("volume-pvc-ebs", &manifests);
    }

    #[test]
    fn defaults_and_several_access_modes() {
        // The example library's `volume-pvc`: no storage class, the cluster's default one.
        let (_, manifests) = done_parts(
            put(
                &VolumePvcDriver,
                &inputs(json!({"access_modes": "ReadWriteOnce", "capacity": "10Gi"})),
            )
            .unwrap(),
        );
        assert!(manifests[0].data["spec"].get("storageClassName").is_none());
        golden::check("volume-pvc", &manifests);

        let (_, manifests) = done_parts(put(&VolumePvcDriver, &inputs(Value::Null)).unwrap());
        assert_eq!(
            manifests[0].data["spec"]["accessModes"],
            json!(["ReadWriteOnce"])
        );
        assert_eq!(
            manifests[0].data["spec"]["resources"]["requests"]["storage"],
            "10Gi"
        );

        for written in [
            json!("readwritemany, ReadOnlyMany,ReadWriteMany"),
            json!(["ReadWriteMany", "ReadOnlyMany"]),
        ] {
            let (_, manifests) = done_parts(
                put(
                    &VolumePvcDriver,
                    &inputs(json!({"access_modes": written, "capacity": 1073741824})),
                )
                .unwrap(),
            );
            let spec = &manifests[0].data["spec"];
            assert_eq!(
                spec["accessModes"],
                json!(["ReadWriteMany", "ReadOnlyMany"])
            );
            assert_eq!(spec["resources"]["requests"]["storage"], "1073741824");
        }
    }

    #[test]
    fn an_nfs_export() {
        // The example library's `volume-nfs` definition, with labels.
        let nfs = inputs(json!({
            "path": "/",
            "server": "nfs-server.default.svc.cluster.local",
            "labels": {"team": "shop"},
        }));
        let (outputs, manifests) = done_parts(put(&VolumeNfsDriver, &nfs).unwrap());
        let pv = &manifests[0];
        assert_eq!(pv.location, ManifestLocation::Cluster);
        assert_eq!(outputs["pvName"], pv.data["metadata"]["name"]);
        assert_eq!(
            manifests[1].data["spec"]["volumeName"],
            pv.data["metadata"]["name"]
        );
        golden::check("volume-nfs", &manifests);

        // Another environment's resource of the same ID gets its own PersistentVolume, and
        // the same claim and pod volume names.
        let mut other = request(&nfs, None);
        other.res_id = "modules.web.externals.data";
        other.guresid = "fedcba9876543210fedcba9876543210fedcba98";
        let (other_outputs, _) = done_parts(VolumeNfsDriver.put(&other).unwrap());
        assert_ne!(other_outputs["pvName"], outputs["pvName"]);
        assert_eq!(other_outputs["pvcName"], outputs["pvcName"]);
    }

    #[test]
    fn bad_inputs_say_what_to_write() {
        let pvc: [(Value, &str); 8] = [
            (
                json!({"capacity": "10GB"}),
                "values.capacity must be a size such as 10Gi",
            ),
            (json!({"capacity": 0}), "values.capacity must be a size"),
            (json!({"capacity": true}), "got a boolean"),
            (
                json!({"access_modes": "ReadWriteSometimes"}),
                "values.access_modes holds a mode that is not one of ReadWriteOnce",
            ),
            (
                json!({"access_modes": [1]}),
                "values.access_modes must hold only strings",
            ),
            (json!({"access_modes": ""}), "is not one of"),
            (
                json!({"storage_class_name": "EBS SC"}),
                "values.storage_class_name is not a StorageClass name",
            ),
            (
                json!({"size": "1Gi"}),
                "values.size is not an input of this driver",
            ),
        ];
        for (values, expected) in pvc {
            let err = put(&VolumePvcDriver, &inputs(values.clone())).unwrap_err();
            assert!(
                err.message.starts_with("humanitec/volume-pvc: ") && err.message.contains(expected),
                "{values}: {}",
                err.message
            );
        }
        let nfs: [(Value, &str); 4] = [
            (json!({"path": "/"}), "values.server is missing or empty"),
            (
                json!({"server": "nfs", "path": "data"}),
                "values.path must be an absolute path",
            ),
            (
                json!({"server": "nfs:/x", "path": "/"}),
                "values.server must be a host name",
            ),
            (
                json!({"server": "nfs", "path": "/", "storage_class_name": "x"}),
                "is not an input",
            ),
        ];
        for (values, expected) in nfs {
            let err = put(&VolumeNfsDriver, &inputs(values.clone())).unwrap_err();
            assert!(
                err.message.starts_with("humanitec/volume-nfs: ") && err.message.contains(expected),
                "{values}: {}",
                err.message
            );
        }
    }
}
