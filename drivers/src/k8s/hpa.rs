//! `humanitec/hpa`: a `HorizontalPodAutoscaler` (autoscaling/v2) scaling a workload's
//! Deployment on CPU utilisation.
//!
//! The resource is requested by a workload (`horizontal-pod-autoscaler` in its Score file), so
//! its ID names the workload (`modules.<workload>.externals.<name>`). The definition's values
//! are the platform's defaults and the Score params, when given, override them, as in
//! Humanitec's template equivalent.

use serde_json::json;

use super::super::{DeleteOutcome, Driver, DriverError, DriverRequest, Manifest};
use super::super::{ManifestLocation, PutOutcome};
use super::{NameRule, Section, done, is_dns_subdomain, object_name};

const DRIVER: &str = "humanitec/hpa";

/// The inputs, read from both the values and the Score params.
const INPUTS: [&str; 3] = [
    "minReplicas",
    "maxReplicas",
    "targetCPUUtilizationPercentage",
];

/// Kubernetes' own defaults where the inputs say nothing: one replica at least, 80 % CPU.
const DEFAULT_MIN_REPLICAS: i64 = 1;
const DEFAULT_TARGET_CPU: i64 = 80;

/// Renders a `HorizontalPodAutoscaler` for the workload that requested the resource.
#[derive(Debug, Clone, Copy, Default)]
pub struct HpaDriver;

impl Driver for HpaDriver {
    /// Always the same outputs: none (its answer is a manifest).
    fn known_outputs(
        &self,
        _values: &serde_json::Value,
        _secrets: &serde_json::Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        Some(std::collections::BTreeSet::new())
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let values = Section::new(DRIVER, "values", request.values)?.only(&INPUTS)?;
        let params = Section::new(DRIVER, "params", request.resource)?.only(&INPUTS)?;
        Section::new(DRIVER, "secrets", request.secrets)?.only(&[])?;
        let workload = workload_of(request.res_id)?;

        // The Score params first, then the definition's values; says where a number came from.
        let read = |key: &str| -> Result<Option<(i64, String)>, DriverError> {
            if let Some(n) = params.integer(key)? {
                return Ok(Some((n, format!("params.{key}"))));
            }
            Ok(values.integer(key)?.map(|n| (n, format!("values.{key}"))))
        };
        let bad =
            |from: &str, what: &str| DriverError::final_error(format!("{DRIVER}: {from} {what}"));
        let (min, min_from) =
            read("minReplicas")?.unwrap_or((DEFAULT_MIN_REPLICAS, "the default".into()));
        let Some((max, max_from)) = read("maxReplicas")? else {
            return Err(bad(
                "values.maxReplicas",
                "is missing: set it in the definition's values, or in the Score resource's \
                 params (maxReplicas: 5)",
            ));
        };
        let (target, target_from) = read("targetCPUUtilizationPercentage")?
            .unwrap_or((DEFAULT_TARGET_CPU, "the default".into()));
        let int32 = 1..=i64::from(i32::MAX);
        if !int32.contains(&min) {
            return Err(bad(&min_from, "must be at least 1"));
        }
        if !int32.contains(&max) {
            return Err(bad(&max_from, "must be at least 1"));
        }
        if max < min {
            return Err(bad(
                &max_from,
                &format!("must not be less than minReplicas (from {min_from})"),
            ));
        }
        if !int32.contains(&target) {
            return Err(bad(
                &target_from,
                "must be a percentage of the requested CPU greater than 0",
            ));
        }

        let name = object_name(workload, "hpa", NameRule::Subdomain);
        let hpa = json!({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": name },
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": workload,
                },
                "minReplicas": min,
                "maxReplicas": max,
                "metrics": [{
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": { "type": "Utilization", "averageUtilization": target },
                    },
                }],
            },
        });
        let manifest = Manifest {
            name: "hpa.yaml".into(),
            location: ManifestLocation::Namespace,
            data: hpa,
        };
        Ok(done(json!({}), json!({}), vec![manifest]))
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// The workload a resource ID `modules.<workload>.externals.<name>` belongs to.
fn workload_of(res_id: &str) -> Result<&str, DriverError> {
    let workload = res_id
        .strip_prefix("modules.")
        .and_then(|rest| rest.split_once(".externals."))
        .map(|(workload, _)| workload);
    match workload {
        Some(w) if is_dns_subdomain(w) => Ok(w),
        Some(_) => Err(DriverError::final_error(format!(
            "{DRIVER}: the workload of this resource is not a name a Kubernetes Deployment \
             can have (lower-case letters, digits, '-' and '.')"
        ))),
        None => Err(DriverError::final_error(format!(
            "{DRIVER}: a horizontal-pod-autoscaler scales the workload that requests it, so it \
             must be a resource of one workload's Score file (ID modules.<workload>.externals.\
             <name>), not a shared resource (this one's ID is {res_id})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::test_request::{Inputs, request};
    use super::super::golden;
    use super::*;
    use serde_json::Value;

    fn inputs(values: Value, params: Value) -> Inputs {
        Inputs {
            resource: params,
            values,
            secrets: json!({}),
            account: None,
        }
    }

    fn put(inputs: &Inputs) -> Result<PutOutcome, DriverError> {
        let mut req = request(inputs, None);
        req.res_type = "horizontal-pod-autoscaler";
        req.res_id = "modules.web.externals.hpa";
        HpaDriver.put(&req)
    }

    fn manifests(outcome: PutOutcome) -> Vec<Manifest> {
        match outcome {
            PutOutcome::Done {
                outputs, manifests, ..
            } => {
                assert_eq!(outputs, json!({}));
                manifests
            }
            other => panic!("not done: {other:?}"),
        }
    }

    #[test]
    fn the_example_definition() {
        // The example library's `hpa` definition.
        let example = inputs(
            json!({"minReplicas": 2, "maxReplicas": 5, "targetCPUUtilizationPercentage": 80}),
            Value::Null,
        );
        golden::check("hpa", &manifests(put(&example).unwrap()));
    }

    #[test]
    fn score_params_override_the_definition() {
        // Humanitec's Score example asks for 1 to 2 replicas; strings of digits (a
        // placeholder inside a string) count as numbers.
        let both = inputs(
            json!({"minReplicas": 2, "maxReplicas": 5, "targetCPUUtilizationPercentage": 80}),
            json!({"maxReplicas": 2, "minReplicas": "1", "targetCPUUtilizationPercentage": 60}),
        );
        let spec = manifests(put(&both).unwrap())[0].data["spec"].clone();
        assert_eq!(spec["minReplicas"], 1);
        assert_eq!(spec["maxReplicas"], 2);
        assert_eq!(
            spec["metrics"][0]["resource"]["target"]["averageUtilization"],
            60
        );

        // Only maxReplicas given: one replica at least, 80 % CPU.
        let least = inputs(Value::Null, json!({"maxReplicas": 3}));
        let spec = manifests(put(&least).unwrap())[0].data["spec"].clone();
        assert_eq!(spec["minReplicas"], 1);
        assert_eq!(
            spec["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
    }

    #[test]
    fn bad_inputs_say_what_to_write() {
        let cases = [
            (json!({}), json!({}), "values.maxReplicas is missing"),
            (
                json!({"maxReplicas": 5, "minReplicas": 6}),
                json!({}),
                "values.maxReplicas must not be less than minReplicas (from values.minReplicas)",
            ),
            (
                json!({"maxReplicas": 5}),
                json!({"minReplicas": 6}),
                "values.maxReplicas must not be less than minReplicas (from params.minReplicas)",
            ),
            (
                json!({"maxReplicas": 5, "minReplicas": 0}),
                json!({}),
                "values.minReplicas must be at least 1",
            ),
            (
                json!({"maxReplicas": 2.5}),
                json!({}),
                "values.maxReplicas must be a whole number",
            ),
            (
                json!({"maxReplicas": "five"}),
                json!({}),
                "values.maxReplicas must be a whole number",
            ),
            (
                json!({"maxReplicas": 5, "targetCPUUtilizationPercentage": -5}),
                json!({}),
                "values.targetCPUUtilizationPercentage must be a percentage",
            ),
            (
                json!({"maxReplicas": 5, "maxreplicas": 6}),
                json!({}),
                "values.maxreplicas is not an input of this driver",
            ),
            (
                json!({"maxReplicas": 5}),
                json!({"replicas": 6}),
                "params.replicas is not an input of this driver",
            ),
        ];
        for (values, params, expected) in cases {
            let err = put(&inputs(values.clone(), params.clone())).unwrap_err();
            assert!(
                err.message.starts_with("humanitec/hpa: ") && err.message.contains(expected),
                "{values} {params}: {}",
                err.message
            );
        }
    }

    #[test]
    fn only_a_workload_can_be_scaled() {
        let ok = inputs(json!({"maxReplicas": 3}), Value::Null);
        for res_id in ["shared.hpa", "modules.web", "hpa"] {
            let mut req = request(&ok, None);
            req.res_id = res_id;
            let err = HpaDriver.put(&req).unwrap_err();
            assert!(
                err.message.contains("not a shared resource"),
                "{res_id}: {}",
                err.message
            );
        }
        let mut req = request(&ok, None);
        req.res_id = "modules.Web_1.externals.hpa";
        let err = HpaDriver.put(&req).unwrap_err();
        assert!(
            err.message.contains("not a name a Kubernetes Deployment"),
            "{}",
            err.message
        );

        // The Deployment is the workload's name, the autoscaler `<workload>-hpa`.
        let mut req = request(&ok, None);
        req.res_id = "modules.checkout.externals.scaling";
        let data = &manifests(HpaDriver.put(&req).unwrap())[0].data;
        assert_eq!(data["metadata"]["name"], "checkout-hpa");
        assert_eq!(data["spec"]["scaleTargetRef"]["name"], "checkout");
    }
}
