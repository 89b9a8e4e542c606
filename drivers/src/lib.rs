//! Drivers provision one resource per call, idempotently per GUResID; this module holds the
//! interface and the registry that maps a definition's `driver_type` to a driver.
//!
//! A driver is synchronous and may block (an HTTP call, a child process): the reconciler runs it
//! on a blocking thread and owns every retry, poll and time between calls. A driver never
//! touches state; what it must remember between calls goes in its cookie.

mod echo;
mod exec;
mod go_template;
mod http;
mod k8s;
pub mod leaks;
mod template;
mod terraform;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

pub use echo::EchoDriver;
pub use exec::{ExecDriver, kill_running};
pub use go_template::GoTemplateDriver;
pub use http::HttpDriver;
pub use http::{encode_path_segment, one_line};
pub use template::TemplateDriver;
pub use terraform::{
    DRIVER_TYPES as TERRAFORM_DRIVER_TYPES, Flavour as TerraformFlavour, TerraformConfig,
    TerraformDriver,
};

/// The driver of user-provided resources: outputs as registered, no call, never a deletion.
pub use gitplane_core::PROVIDED_DRIVER;

/// The most a driver cookie may hold, in bytes (the Humanitec Driver Interface's limit).
pub const MAX_COOKIE_BYTES: usize = 10_240;

/// A [`DriverRequest`] that owns its parts, so a call can move to a blocking thread.
#[derive(Debug, Clone)]
pub struct OwnedRequest {
    pub guresid: String,
    pub org: String,
    pub env: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub resource: Value,
    pub values: Value,
    pub secrets: Value,
    pub account: Option<Value>,
    pub cookie: Option<String>,
}

impl OwnedRequest {
    pub fn request(&self) -> DriverRequest<'_> {
        DriverRequest {
            guresid: &self.guresid,
            org: &self.org,
            env: &self.env,
            app: self.app.as_deref(),
            res_type: &self.res_type,
            class: &self.class,
            res_id: &self.res_id,
            resource: &self.resource,
            values: &self.values,
            secrets: &self.secrets,
            account: self.account.as_ref(),
            cookie: self.cookie.as_deref(),
        }
    }
}

/// One call for one resource: everything a driver needs to provision or delete it.
#[derive(Debug, Clone, Copy)]
pub struct DriverRequest<'a> {
    pub guresid: &'a str,
    /// The organisation (`org` in `gitplane.yaml`).
    pub org: &'a str,
    pub env: &'a str,
    pub app: Option<&'a str>,
    pub res_type: &'a str,
    pub class: &'a str,
    pub res_id: &'a str,
    /// The resource's own inputs: Score params, or a workload's resolved Score file.
    pub resource: &'a Value,
    /// `driver_inputs.values`, resolved.
    pub values: &'a Value,
    /// `driver_inputs.secrets`, resolved.
    pub secrets: &'a Value,
    /// The credentials of the resource account the definition names (`driver_account`), read
    /// on the host. Drivers that call out send them as `secrets.account`.
    pub account: Option<&'a Value>,
    /// What the driver asked to be given back on every later call for this GUResID.
    pub cookie: Option<&'a str>,
}

/// What a driver wants done with its cookie after a call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Cookie {
    #[default]
    Unchanged,
    Set(String),
    Cleared,
}

/// Where a Kubernetes manifest goes in the deployment of the workloads that use a resource
/// (the Humanitec manifest locations).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ManifestLocation {
    /// An object in the workload's namespace.
    Namespace,
    /// A cluster-wide object.
    Cluster,
    /// A container added to the workload's pods.
    Containers,
    /// A volume added to the workload's pods.
    Volumes,
}

/// A Kubernetes manifest a driver produced with a resource: applied with the deployment of
/// every workload that uses the resource.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// Its key in the driver's `manifests` map (`deployment.yaml`), or `manifest-N` for the
    /// N-th of a list.
    pub name: String,
    pub location: ManifestLocation,
    /// The Kubernetes object (or container, or volume) itself.
    pub data: Value,
}

impl Manifest {
    /// Reads a driver's manifests: a map of name to `{location, data}` (as `templates.manifests`
    /// renders them) or a list of `{location, data}` (as drivers answer). `at` names the place
    /// in messages, which never quote a value.
    pub fn list_from(value: Value, at: &str) -> Result<Vec<Manifest>, String> {
        let entries: Vec<(String, Value)> = match value {
            Value::Null => return Ok(Vec::new()),
            Value::Object(map) => map.into_iter().collect(),
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| (format!("manifest-{}", i + 1), item))
                .collect(),
            _ => {
                return Err(format!(
                    "{at} must be a map of manifest names to {{location, data}}, or a list of \
                     {{location, data}}"
                ));
            }
        };
        entries
            .into_iter()
            .map(|(name, entry)| {
                let Value::Object(mut entry) = entry else {
                    return Err(format!("{at}.{name} must be {{location, data}}"));
                };
                let location = match entry.remove("location") {
                    Some(Value::String(l)) => match l.as_str() {
                        "namespace" => ManifestLocation::Namespace,
                        "cluster" => ManifestLocation::Cluster,
                        "containers" => ManifestLocation::Containers,
                        "volumes" => ManifestLocation::Volumes,
                        _ => {
                            return Err(format!(
                                "{at}.{name}.location is not one of namespace, cluster, \
                                 containers, volumes"
                            ));
                        }
                    },
                    _ => {
                        return Err(format!(
                            "{at}.{name}.location is missing: write one of namespace, cluster, \
                             containers, volumes"
                        ));
                    }
                };
                let data = match entry.remove("data") {
                    Some(data @ Value::Object(_)) => data,
                    // HPO's example library writes `data: |` with the object as YAML text.
                    Some(Value::String(text)) => {
                        object_from_text(&format!("{at}.{name}.data"), &text)?
                    }
                    _ => return Err(format!("{at}.{name}.data must be a Kubernetes object")),
                };
                let name = match entry.remove("name") {
                    Some(Value::String(n)) if !n.is_empty() => n,
                    _ => name,
                };
                Ok(Manifest {
                    name,
                    location,
                    data,
                })
            })
            .collect()
    }
}

/// A manifest's `data` written as YAML text: one document holding a mapping. Errors name where
/// (`what`) and the line in the text, never quote it (it may hold secrets).
fn object_from_text(what: &str, text: &str) -> Result<Value, String> {
    let options = serde_saphyr::options! { strict_booleans: true };
    match serde_saphyr::from_str_with_options::<Value>(text, options) {
        Ok(object @ Value::Object(_)) => Ok(object),
        Ok(other) => Err(format!(
            "{what} is a string that must hold one Kubernetes object (a YAML mapping), not {}",
            template::kind(&other)
        )),
        Err(e) => Err(template::yaml_message(what, &e)),
    }
}

/// The answer to a put (create or update).
#[derive(Debug, Clone, PartialEq)]
pub enum PutOutcome {
    /// Provisioned. `outputs` and `secret_outputs` are JSON objects.
    Done {
        outputs: Value,
        secret_outputs: Value,
        cookie: Cookie,
        /// Kubernetes manifests for the deployments of the workloads that use the resource.
        manifests: Vec<Manifest>,
    },
    /// Still working: call again with the same request (and the cookie) later.
    InProgress { cookie: Cookie },
}

/// The answer to a delete.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// Gone (or never existed). The cookie is cleared.
    Done,
    /// Still working: call again later.
    InProgress { cookie: Cookie },
}

/// The answer to a read: what the driver says the resource is now, without changing it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadOutcome {
    /// It exists, with these outputs (JSON objects).
    Found {
        outputs: Value,
        secret_outputs: Value,
    },
    /// The driver says it does not exist.
    Missing,
    /// The driver cannot tell without changing something: compare what was recorded instead.
    NoReadPath,
}

/// Whether calling again may help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong (a 400, a bad script): retrying cannot succeed.
    Final,
    /// The driver or the way to it is unwell (a 5xx, a 429, a time-out): retry with backoff.
    Transient,
}

/// A driver call that did not succeed. The message must not contain secret values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DriverError {
    pub kind: ErrorKind,
    pub message: String,
    /// What to do with the cookie even so: a call that failed half way may have made things
    /// the next call must know of (a failed `terraform apply` leaves state).
    pub cookie: Cookie,
}

impl DriverError {
    pub fn final_error(message: impl Into<String>) -> Self {
        DriverError {
            kind: ErrorKind::Final,
            message: message.into(),
            cookie: Cookie::Unchanged,
        }
    }

    pub fn transient(message: impl Into<String>) -> Self {
        DriverError {
            kind: ErrorKind::Transient,
            message: message.into(),
            cookie: Cookie::Unchanged,
        }
    }

    /// The same error, with the cookie to keep for the next call.
    pub fn with_cookie(self, cookie: Cookie) -> Self {
        DriverError { cookie, ..self }
    }
}

/// One way of provisioning resources.
pub trait Driver: Send + Sync {
    /// Creates or updates the resource; must not create a second instance for a GUResID.
    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError>;
    /// Deletes the resource; deleting one that does not exist succeeds.
    fn delete(&self, request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError>;

    /// Reads what the resource is now, changing nothing anywhere: a detect-only drift run
    /// compares it with what was recorded. Drivers that cannot read without a side effect
    /// keep this default.
    fn read(&self, _request: &DriverRequest<'_>) -> Result<ReadOutcome, DriverError> {
        Ok(ReadOutcome::NoReadPath)
    }

    /// Whether a call only computes its answer from the request, at once (no I/O, no wait, no
    /// unbounded work): the reconciler then makes it in place rather than on a blocking thread,
    /// which for 50 000 resources saves a second of handing calls around.
    fn in_process(&self) -> bool {
        false
    }

    /// What is wrong with the shape of a definition's inputs, known before any call (a template
    /// written as a mapping, a template the driver does not know). `values` and `secrets` are
    /// the definition's `driver_inputs` with each placeholder left as its text.
    fn check_inputs(&self, _values: &Value, _secrets: &Value) -> Vec<InputProblem> {
        Vec::new()
    }

    /// The name of every output, secret or not, the driver can give for these inputs, when
    /// the inputs alone say (an echo's values, a template's keys, a Terraform script's
    /// `output` blocks); `None` when only a call can tell. `validate` checks the name of
    /// every output read against it.
    fn known_outputs(&self, _values: &Value, _secrets: &Value) -> Option<BTreeSet<String>> {
        None
    }
}

/// One problem with a definition's inputs: where (`values.templates.outputs`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputProblem {
    pub path: String,
    pub reason: String,
}

/// User-provided resources (an on-premise database registered in an environment file): their
/// outputs are what was registered; gitplane never provisions nor deletes them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProvidedDriver;

impl Driver for ProvidedDriver {
    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        EchoDriver.put(request)
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn read(&self, request: &DriverRequest<'_>) -> Result<ReadOutcome, DriverError> {
        EchoDriver.read(request)
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// A read by recomputing: for drivers whose outputs are a pure function of the request, with
/// no side effect, what a put would answer is what the resource is.
pub fn read_by_recomputing(
    driver: &dyn Driver,
    request: &DriverRequest<'_>,
) -> Result<ReadOutcome, DriverError> {
    Ok(match driver.put(request)? {
        PutOutcome::Done {
            outputs,
            secret_outputs,
            ..
        } => ReadOutcome::Found {
            outputs,
            secret_outputs,
        },
        PutOutcome::InProgress { .. } => ReadOutcome::NoReadPath,
    })
}

/// A driver and how many calls it may have running at once.
#[derive(Clone)]
pub struct Registered {
    pub driver: Arc<dyn Driver>,
    /// `None`: only the global limit applies.
    pub concurrency: Option<usize>,
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// Drivers by `driver_type`.
#[derive(Clone, Debug)]
pub struct Registry {
    drivers: BTreeMap<String, Registered>,
}

impl Registry {
    /// The built-in drivers: `echo` (also `humanitec/echo`), `template` (minijinja),
    /// `humanitec/template` (Go templates), `humanitec/static` (an echo), Humanitec's Kubernetes drivers
    /// (`humanitec/ingress`, `volume-pvc`, `volume-nfs`, `hpa`, `dns-wildcard` and the
    /// `k8s-cluster` ones), and `terraform` under Humanitec's names with the default settings.
    pub fn builtin() -> Self {
        let mut registry = Registry {
            drivers: BTreeMap::new(),
        };
        let echo: Arc<dyn Driver> = Arc::new(EchoDriver);
        registry.register("echo", echo.clone(), None);
        registry.register("humanitec/echo", echo.clone(), None);
        registry.register("humanitec/static", echo, None);
        // gitplane's minijinja form keeps its own name; Humanitec's name renders Go templates,
        // as the Platform Orchestrator does.
        registry.register("template", Arc::new(TemplateDriver), None);
        registry.register("humanitec/template", Arc::new(GoTemplateDriver), None);
        registry.register(PROVIDED_DRIVER, Arc::new(ProvidedDriver), None);
        registry.register("humanitec/ingress", Arc::new(k8s::IngressDriver), None);
        registry.register("humanitec/volume-pvc", Arc::new(k8s::VolumePvcDriver), None);
        registry.register("humanitec/volume-nfs", Arc::new(k8s::VolumeNfsDriver), None);
        registry.register("humanitec/hpa", Arc::new(k8s::HpaDriver), None);
        registry.register(
            "humanitec/dns-wildcard",
            Arc::new(k8s::DnsWildcardDriver),
            None,
        );
        for (driver_type, flavor) in k8s::ClusterFlavor::ALL {
            registry.register(driver_type, Arc::new(k8s::ClusterDriver(flavor)), None);
        }
        registry.register_terraform(&TerraformConfig::default());
        registry
    }

    /// Registers the Terraform driver with `config` under each of its `driver_type`s.
    pub fn register_terraform(&mut self, config: &TerraformConfig) {
        for (name, flavour) in TERRAFORM_DRIVER_TYPES {
            let driver = TerraformDriver::new(config.clone(), flavour);
            self.register(name, Arc::new(driver), config.concurrency);
        }
    }

    /// Adds or replaces the driver for `driver_type`.
    pub fn register(
        &mut self,
        driver_type: &str,
        driver: Arc<dyn Driver>,
        concurrency: Option<usize>,
    ) {
        self.drivers.insert(
            driver_type.to_owned(),
            Registered {
                driver,
                concurrency,
            },
        );
    }

    pub fn get(&self, driver_type: &str) -> Option<&Registered> {
        self.drivers.get(driver_type)
    }

    /// Every registered `driver_type`, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.drivers.keys().map(String::as_str)
    }
}

/// What driver unit tests send: one resource's inputs, and a request for it.
#[cfg(test)]
pub mod test_request {
    use serde_json::Value;

    use super::DriverRequest;

    pub struct Inputs {
        pub resource: Value,
        pub values: Value,
        pub secrets: Value,
        pub account: Option<Value>,
    }

    /// A request for `modules.web.externals.db`, a postgres of app `shop` in `dev`.
    pub fn request<'a>(inputs: &'a Inputs, cookie: Option<&'a str>) -> DriverRequest<'a> {
        DriverRequest {
            guresid: "0123456789abcdef0123456789abcdef01234567",
            org: "gitplane",
            env: "dev",
            app: Some("shop"),
            res_type: "postgres",
            class: "default",
            res_id: "modules.web.externals.db",
            resource: &inputs.resource,
            values: &inputs.values,
            secrets: &inputs.secrets,
            account: inputs.account.as_ref(),
            cookie,
        }
    }
}

/// What each built-in driver can tell before a call.
#[cfg(test)]
mod known_before_a_call {
    use std::collections::BTreeSet;

    use serde_json::{Value, json};

    use super::template::template_keys;
    use super::*;

    fn set(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn a_templates_keys_are_read_off_its_text_when_it_says_them() {
        let go = "{{- if .driver.values.tls }}\ncert: {{ .init.cert }}\n{{- end }}\n\
                  host: {{ .init.name }}\n# port: commented out\nurl: |\n  not: a key\n\
                  {{- /* a comment */}}\n{{- $x := 1 }}\n\"quoted\": 1\n";
        assert_eq!(template_keys(go), set(&["cert", "host", "quoted", "url"]));
        let jinja = "{% if values.tls %}\ncert: x\n{% endif %}\nhost: {{ values.h }}\n";
        assert_eq!(template_keys(jinja), set(&["cert", "host"]));
        // A line at column 0 that may print a key: only a call can tell.
        for unknown in [
            "{{ range $k, $v := .x }}\n{{ $k }}: {{ $v }}\n{{ end }}\n",
            "{{ template \"outputs\" . }}\n",
            "{{ .driver.values.outputs | toYaml }}\n",
            "{% include 'x' %}\n",
            "a b: 1\n",
        ] {
            assert_eq!(template_keys(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn echo_gives_its_values_and_secrets_names() {
        let echo = EchoDriver;
        assert_eq!(
            echo.known_outputs(&json!({"host": "h", "port": 1}), &json!({"password": "p"})),
            set(&["host", "password", "port"])
        );
        assert_eq!(echo.known_outputs(&Value::Null, &Value::Null), set(&[]));
        // One placeholder for all its values: known after it resolves.
        assert_eq!(echo.known_outputs(&json!("${...}"), &Value::Null), None);
    }

    #[test]
    fn template_drivers_give_their_output_templates_keys_and_check_their_shape() {
        let values = json!({"templates": {
            "outputs": "host: {{ .init.name }}\nport: 5432\n",
            "secrets": "password: {{ .driver.secrets.p }}\n",
        }});
        let secrets = json!({"templates": {"outputs": "token: x\n"}});
        assert_eq!(
            GoTemplateDriver.known_outputs(&values, &secrets),
            set(&["host", "password", "port", "token"])
        );
        assert_eq!(
            TemplateDriver.known_outputs(
                &json!({"templates": {"outputs": "url: {{ values.u }}\n"}}),
                &Value::Null
            ),
            set(&["url"])
        );
        // An output template written as a mapping, as HPO's `outputs: |` forgot its `|`.
        let mapping = json!({"templates": {"outputs": {"host": "x"}}});
        assert_eq!(
            GoTemplateDriver.check_inputs(&mapping, &Value::Null),
            [InputProblem {
                path: "values.templates.outputs".into(),
                reason: "values.templates.outputs must be a string, got a mapping: write the \
                         template as text (`outputs: |` and the YAML below it)"
                    .into()
            }]
        );
        let unknown = json!({"templates": {"output": "a: 1"}});
        assert!(
            TemplateDriver.check_inputs(&unknown, &Value::Null)[0]
                .reason
                .contains("values.templates.output is not a template the template driver knows")
        );
        assert!(GoTemplateDriver.check_inputs(&values, &secrets).is_empty());
    }

    #[test]
    fn the_kubernetes_drivers_give_fixed_outputs() {
        let registry = Registry::builtin();
        let known = |driver: &str, values: Value| {
            registry
                .get(driver)
                .unwrap_or_else(|| panic!("{driver} is built in"))
                .driver
                .known_outputs(&values, &Value::Null)
        };
        assert_eq!(
            known("humanitec/volume-pvc", json!({})),
            set(&["pvcName", "volumeName"])
        );
        assert_eq!(
            known("humanitec/volume-nfs", json!({})),
            set(&["pvName", "pvcName", "volumeName"])
        );
        assert_eq!(known("humanitec/dns-wildcard", json!({})), set(&["host"]));
        assert_eq!(known("humanitec/ingress", json!({})), set(&["id"]));
        assert_eq!(known("humanitec/hpa", json!({})), set(&[]));
        assert_eq!(
            known(
                "humanitec/k8s-cluster-eks",
                json!({"name": "c", "region": "r"})
            ),
            set(&["credentials", "name", "region"])
        );
    }

    #[test]
    fn terraform_gives_the_outputs_its_inline_code_declares() {
        let driver = TerraformDriver::new(TerraformConfig::default(), TerraformFlavour::Terraform);
        let script = "resource \"x\" \"y\" {}\noutput \"bucket\" {\n  value = 1\n}\n  \
                      output \"arn\"{ value = 2 }\n# output \"old\" {}\n";
        assert_eq!(
            driver.known_outputs(&json!({"script": script}), &Value::Null),
            set(&["arn", "bucket"])
        );
        assert_eq!(
            driver.known_outputs(
                &json!({"files": {"main.tf": "output \"a\" {\n}\n", "README.md": "x"}}),
                &Value::Null
            ),
            set(&["a"])
        );
        // Code from a module source is read only when the driver fetches it.
        assert_eq!(
            driver.known_outputs(&json!({"source": {"url": "https://x"}}), &Value::Null),
            None
        );
    }
}
