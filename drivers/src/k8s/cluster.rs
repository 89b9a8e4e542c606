//! The `k8s-cluster` drivers (`humanitec/k8s-cluster`, `-eks`, `-gke`, `-aks`, `-git`): a
//! cluster's connection details passed through, the plain ones as outputs and the credentials
//! as secret outputs. They connect to nothing and make no manifest.
//!
//! The credentials come from the definition's `driver_account` (read on the host) or, inline,
//! from `secrets.credentials`; exactly one of the two. Inline credentials are checked for the
//! keys Humanitec's documentation shows for each kind of cluster; an account's are passed on as
//! they are (they may be temporary credentials of another shape).

use serde_json::{Map, Value};

use super::super::{DeleteOutcome, Driver, DriverError, DriverRequest, PutOutcome};
use super::{Section, done};

/// Which kind of cluster a driver connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterFlavor {
    /// `humanitec/k8s-cluster`: any cluster, by its kubeconfig's cluster and user entries.
    Generic,
    /// `humanitec/k8s-cluster-eks`: Amazon EKS.
    Eks,
    /// `humanitec/k8s-cluster-gke`: Google GKE.
    Gke,
    /// `humanitec/k8s-cluster-aks`: Azure AKS.
    Aks,
    /// `humanitec/k8s-cluster-git`: a Git repository manifests are pushed to (GitOps).
    Git,
}

/// What a flavour requires.
struct Spec {
    driver: &'static str,
    /// Values that must be non-empty strings, and what each is.
    required: &'static [(&'static str, &'static str)],
    /// Keys inline credentials must hold: every key of one of these sets.
    credentials: &'static [&'static [&'static str]],
}

impl ClusterFlavor {
    /// Every flavour, with the `driver_type` it is registered as.
    pub const ALL: [(&'static str, ClusterFlavor); 5] = [
        ("humanitec/k8s-cluster", ClusterFlavor::Generic),
        ("humanitec/k8s-cluster-eks", ClusterFlavor::Eks),
        ("humanitec/k8s-cluster-gke", ClusterFlavor::Gke),
        ("humanitec/k8s-cluster-aks", ClusterFlavor::Aks),
        ("humanitec/k8s-cluster-git", ClusterFlavor::Git),
    ];

    fn spec(self) -> Spec {
        match self {
            ClusterFlavor::Generic => Spec {
                driver: "humanitec/k8s-cluster",
                required: &[],
                credentials: &[
                    &["client-certificate-data", "client-key-data"],
                    &["token"],
                    &["username", "password"],
                ],
            },
            ClusterFlavor::Eks => Spec {
                driver: "humanitec/k8s-cluster-eks",
                required: &[
                    ("name", "the cluster's name in EKS"),
                    ("region", "the AWS region it runs in, such as eu-central-1"),
                ],
                credentials: &[&["aws_access_key_id", "aws_secret_access_key"]],
            },
            ClusterFlavor::Gke => Spec {
                driver: "humanitec/k8s-cluster-gke",
                required: &[
                    ("name", "the cluster's name in GKE"),
                    ("project_id", "the Google Cloud project it belongs to"),
                    ("zone", "its zone or region, such as europe-west2-a"),
                ],
                // A service account key, as Google Cloud writes it to credentials.json.
                credentials: &[&["client_email", "private_key"]],
            },
            ClusterFlavor::Aks => Spec {
                driver: "humanitec/k8s-cluster-aks",
                required: &[
                    ("name", "the cluster's name in AKS"),
                    ("resource_group", "the Azure resource group it belongs to"),
                    ("subscription_id", "the Azure subscription it belongs to"),
                ],
                // A service principal, as `az ad sp create-for-rbac` prints it.
                credentials: &[&["appId", "password", "tenant"]],
            },
            ClusterFlavor::Git => Spec {
                driver: "humanitec/k8s-cluster-git",
                required: &[("url", "the Git repository manifests are pushed to")],
                credentials: &[&["ssh_key"], &["password"]],
            },
        }
    }
}

/// Passes one kind of cluster's connection details through.
#[derive(Debug, Clone, Copy)]
pub struct ClusterDriver(pub ClusterFlavor);

impl Driver for ClusterDriver {
    /// Its values and secrets passed on, and `credentials`.
    fn known_outputs(
        &self,
        values: &Value,
        secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        let mut known = crate::EchoDriver.known_outputs(values, secrets)?;
        known.insert("credentials".to_owned());
        Some(known)
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let spec = self.0.spec();
        let driver = spec.driver;
        let values = Section::new(driver, "values", request.values)?;
        let secrets = Section::new(driver, "secrets", request.secrets)?;

        // Values become plain outputs, readable by anyone: credentials must not be there.
        if values.get("credentials").is_some() {
            return Err(values.error(
                "credentials",
                "would be a plain output: put the credentials in secrets.credentials, or name \
                 a driver_account",
            ));
        }
        for (key, what) in spec.required {
            values.required_string(key, &format!("write {what}"))?;
        }
        if self.0 == ClusterFlavor::Generic {
            check_cluster_data(&values)?;
        }

        let inline = secrets.get("credentials");
        let credentials = match (request.account, inline) {
            (Some(_), Some(_)) => {
                return Err(secrets.error(
                    "credentials",
                    "is set and the definition names a driver_account too: keep one of them",
                ));
            }
            (Some(Value::Null), None) | (None, None) => {
                return Err(DriverError::final_error(format!(
                    "{driver}: no credentials: name a driver_account (configured in the host \
                     config's accounts), or set secrets.credentials"
                )));
            }
            (Some(account), None) => account.clone(),
            (None, Some(inline)) => {
                check_credentials(&secrets, inline, spec.credentials)?;
                inline.clone()
            }
        };

        let outputs = match request.values {
            Value::Object(map) => Value::Object(map.clone()),
            _ => Value::Object(Map::new()),
        };
        let mut secret_outputs = match request.secrets {
            Value::Object(map) => map.clone(),
            _ => Map::new(),
        };
        secret_outputs.insert("credentials".into(), credentials);
        Ok(done(outputs, Value::Object(secret_outputs), Vec::new()))
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// `cluster_data`: the cluster entry of a kubeconfig, with at least the API server.
fn check_cluster_data(values: &Section<'_>) -> Result<(), DriverError> {
    let hint = "write the cluster entry of a kubeconfig: server (https://…) and \
                certificate-authority-data";
    let Some(data) = values.mapping("cluster_data")? else {
        return Err(values.error("cluster_data", format_args!("is missing: {hint}")));
    };
    match data.get("server") {
        Some(Value::String(server)) if !server.is_empty() => Ok(()),
        _ => Err(values.error("cluster_data", format_args!("has no server: {hint}"))),
    }
}

/// Inline credentials must be a mapping holding every key of one of `sets`. Only key names
/// appear in messages.
fn check_credentials(
    secrets: &Section<'_>,
    credentials: &Value,
    sets: &[&[&str]],
) -> Result<(), DriverError> {
    let Value::Object(map) = credentials else {
        return Err(secrets.error(
            "credentials",
            format_args!("must be a mapping, got {}", super::kind(credentials)),
        ));
    };
    let present = |key: &&str| {
        map.get(*key)
            .is_some_and(|v| !v.is_null() && v.as_str() != Some(""))
    };
    if sets.iter().any(|set| set.iter().all(present)) {
        return Ok(());
    }
    let wanted = sets
        .iter()
        .map(|set| set.join(" and "))
        .collect::<Vec<_>>()
        .join(", or ");
    Err(secrets.error(
        "credentials",
        format_args!("must hold {wanted} (or name a driver_account instead)"),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::super::ErrorKind;
    use super::super::super::test_request::{Inputs, request};
    use super::*;

    fn put(flavor: ClusterFlavor, inputs: &Inputs) -> Result<PutOutcome, DriverError> {
        let mut req = request(inputs, None);
        req.res_type = "k8s-cluster";
        req.res_id = "k8s-cluster";
        req.app = None;
        ClusterDriver(flavor).put(&req)
    }

    fn answer(outcome: PutOutcome) -> (Value, Value) {
        match outcome {
            PutOutcome::Done {
                outputs,
                secret_outputs,
                manifests,
                ..
            } => {
                assert!(manifests.is_empty());
                (outputs, secret_outputs)
            }
            other => panic!("not done: {other:?}"),
        }
    }

    /// Every secret string of `secrets` appears in `secret_outputs` and nowhere in `outputs`.
    fn assert_secret_only(outputs: &Value, secret_outputs: &Value, secrets: &[&str]) {
        let plain = outputs.to_string();
        let sealed = secret_outputs.to_string();
        for secret in secrets {
            assert!(!plain.contains(secret), "{secret} leaked into {plain}");
            assert!(
                sealed.contains(secret),
                "{secret} missing from the secret outputs"
            );
        }
    }

    #[test]
    fn eks_with_inline_credentials() {
        // The example library's `eks-static-credentials`.
        let inputs = Inputs {
            resource: Value::Null,
            values: json!({
                "region": "eu-central-1",
                "name": "demo-123",
                "loadbalancer": "x111.elb.eu-central-1.amazonaws.com",
                "loadbalancer_hosted_zone": "ABC0DEF5WYYZ00",
            }),
            secrets: json!({"credentials": {
                "aws_access_key_id": "my-access-key-id",
                "aws_secret_access_key": "my-secret-access-key",
            }}),
            account: None,
        };
        let (outputs, secret_outputs) = answer(put(ClusterFlavor::Eks, &inputs).unwrap());
        assert_eq!(outputs, inputs.values);
        assert_eq!(secret_outputs, inputs.secrets);
        assert_secret_only(
            &outputs,
            &secret_outputs,
            &["my-access-key-id", "my-secret-access-key"],
        );
    }

    #[test]
    fn credentials_from_the_account_with_an_agent() {
        // The example library's `gke-agent`: temporary credentials through the account, the
        // agent's URL a secret of its own.
        let inputs = Inputs {
            resource: Value::Null,
            values: json!({
                "loadbalancer": "35.10.10.10",
                "name": "demo-123",
                "zone": "europe-west2-a",
                "project_id": "my-gcp-project",
            }),
            secrets: json!({"agent_url": "https://agent.example/signed-abc"}),
            account: Some(json!({"access_token": "ya29.short-lived-token"})),
        };
        let (outputs, secret_outputs) = answer(put(ClusterFlavor::Gke, &inputs).unwrap());
        assert_eq!(outputs, inputs.values);
        assert_eq!(
            secret_outputs,
            json!({
                "agent_url": "https://agent.example/signed-abc",
                "credentials": {"access_token": "ya29.short-lived-token"},
            })
        );
        assert_secret_only(
            &outputs,
            &secret_outputs,
            &["ya29.short-lived-token", "signed-abc"],
        );

        // An account may hold a plain token.
        let mut token = inputs;
        token.secrets = json!({});
        token.account = Some(json!("plain-token"));
        let (_, secret_outputs) = answer(put(ClusterFlavor::Gke, &token).unwrap());
        assert_eq!(secret_outputs, json!({"credentials": "plain-token"}));
    }

    #[test]
    fn every_flavor_passes_its_example_through() {
        let examples = [
            (
                ClusterFlavor::Generic,
                json!({"name": "my-generic-k8s-cluster", "loadbalancer": "35.10.10.10",
                       "cluster_data": {"server": "https://35.11.11.11:6443",
                                        "certificate-authority-data": "LS0t...ca-data....=="}}),
                json!({"client-certificate-data": "LS0t...cert-data...==",
                       "client-key-data": "LS0t...key-data...=="}),
            ),
            (
                ClusterFlavor::Aks,
                json!({"loadbalancer": "20.10.10.10", "name": "demo-123",
                       "resource_group": "my-resources",
                       "subscription_id": "12345678-aaaa-bbbb-cccc-0987654321ba",
                       "server_app_id": "6dae42f8-4368-4678-94ff-3960e28e3630"}),
                json!({"appId": "b520e4a8", "displayName": "my-cluster-sp",
                       "password": "my-cluster-sp-pw", "tenant": "9b8c7b62"}),
            ),
            (
                ClusterFlavor::Gke,
                json!({"loadbalancer": "35.10.10.10", "name": "demo-123",
                       "zone": "europe-west2-a", "project_id": "my-gcp-project"}),
                json!({"type": "service_account", "private_key": "my-private-key",
                       "client_email": "sa@my-gcp-project.iam.gserviceaccount.com"}),
            ),
            (
                ClusterFlavor::Git,
                json!({"url": "git@github.com:example-org/gitops-repo.git",
                       "branch": "development", "path": "shop/dev",
                       "loadbalancer": "35.10.10.10"}),
                json!({"ssh_key": "my-git-ssh-key"}),
            ),
        ];
        for (flavor, values, credentials) in examples {
            let inputs = Inputs {
                resource: Value::Null,
                values: values.clone(),
                secrets: json!({"credentials": credentials}),
                account: None,
            };
            let (outputs, secret_outputs) = answer(put(flavor, &inputs).unwrap());
            assert_eq!(outputs, values, "{flavor:?}");
            assert_eq!(secret_outputs, inputs.secrets, "{flavor:?}");
        }
    }

    #[test]
    fn bad_inputs_say_what_to_write_and_never_quote_secrets() {
        let eks = json!({"name": "demo", "region": "eu-central-1"});
        let key =
            json!({"aws_access_key_id": "AKIA-SECRET-ID", "aws_secret_access_key": "SECRET-KEY"});
        let cases = [
            (
                ClusterFlavor::Eks,
                json!({"name": "demo"}),
                json!({"credentials": key}),
                None,
                "values.region is missing or empty: write the AWS region",
            ),
            (
                ClusterFlavor::Eks,
                json!({"name": "demo", "region": 1}),
                json!({"credentials": key}),
                None,
                "values.region must be a string, got a number",
            ),
            (
                ClusterFlavor::Eks,
                eks.clone(),
                json!({}),
                None,
                "no credentials: name a driver_account",
            ),
            (
                ClusterFlavor::Eks,
                eks.clone(),
                json!({"credentials": key}),
                Some(json!({"k": "v"})),
                "and the definition names a driver_account too",
            ),
            (
                ClusterFlavor::Eks,
                eks.clone(),
                json!({"credentials": {"aws_access_key_id": "AKIA-SECRET-ID"}}),
                None,
                "must hold aws_access_key_id and aws_secret_access_key",
            ),
            (
                ClusterFlavor::Eks,
                eks.clone(),
                json!({"credentials": "AKIA-SECRET-ID"}),
                None,
                "secrets.credentials must be a mapping, got a string",
            ),
            (
                ClusterFlavor::Eks,
                json!({"name": "demo", "region": "r", "credentials": key}),
                json!({}),
                None,
                "values.credentials would be a plain output",
            ),
            (
                ClusterFlavor::Generic,
                json!({"name": "x"}),
                json!({"credentials": {"token": "SECRET-KEY"}}),
                None,
                "values.cluster_data is missing",
            ),
            (
                ClusterFlavor::Generic,
                json!({"cluster_data": {"certificate-authority-data": "x"}}),
                json!({"credentials": {"token": "SECRET-KEY"}}),
                None,
                "values.cluster_data has no server",
            ),
            (
                ClusterFlavor::Generic,
                json!({"cluster_data": {"server": "https://k"}}),
                json!({"credentials": {"client-key-data": "SECRET-KEY"}}),
                None,
                "must hold client-certificate-data and client-key-data, or token, or username and password",
            ),
            (
                ClusterFlavor::Git,
                json!({"branch": "main"}),
                json!({"credentials": {"ssh_key": "SECRET-KEY"}}),
                None,
                "values.url is missing",
            ),
            (
                ClusterFlavor::Aks,
                json!({"name": "n", "resource_group": "g", "subscription_id": "s"}),
                json!({"credentials": {"appId": "a", "password": "SECRET-KEY"}}),
                None,
                "must hold appId and password and tenant",
            ),
            (
                ClusterFlavor::Gke,
                json!({"name": "n", "project_id": "p", "zone": "z"}),
                json!({"credentials": {"private_key": "SECRET-KEY"}}),
                None,
                "must hold client_email and private_key",
            ),
            (
                ClusterFlavor::Gke,
                json!(["n"]),
                json!({}),
                None,
                "values must be a mapping, got a sequence",
            ),
        ];
        for (flavor, values, secrets, account, expected) in cases {
            let inputs = Inputs {
                resource: Value::Null,
                values,
                secrets,
                account,
            };
            let err = put(flavor, &inputs).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Final);
            let driver = ClusterFlavor::ALL
                .iter()
                .find(|(_, f)| *f == flavor)
                .map(|(name, _)| *name)
                .unwrap();
            assert!(
                err.message.starts_with(&format!("{driver}: ")) && err.message.contains(expected),
                "{flavor:?}: {}",
                err.message
            );
            assert!(!err.message.contains("SECRET"), "{}", err.message);
        }
    }
}
