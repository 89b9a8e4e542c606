//! `humanitec/ingress`: one Kubernetes `Ingress` (networking.k8s.io/v1) routing a DNS name's
//! routes to the Services of the workloads behind them.
//!
//! Humanitec gives the driver the routes of the `dns` resource its ingress belongs to. In
//! gitplane the definition passes them itself, with the placeholders Humanitec's own template
//! equivalent uses (`routePaths: ${resources.dns<route.outputs.path}`, and likewise
//! `routePorts`, `routeServices`, optionally `routeHosts`), plus `host` for the DNS name. The
//! older form, an ingress resource's own `rules.http` map, is read too.

use serde_json::{Map, Value, json};

use super::super::{DeleteOutcome, Driver, DriverError, DriverRequest, Manifest};
use super::super::{ManifestLocation, PutOutcome};
use super::{
    NameRule, Section, done, is_dns_label, is_dns_subdomain, is_host_name, object_name,
    resource_base,
};

const DRIVER: &str = "humanitec/ingress";

/// The driver inputs (`driver_inputs.values`) this driver reads.
const VALUES: [&str; 12] = [
    "annotations",
    "api_version",
    "class",
    "host",
    "labels",
    "no_tls",
    "path_type",
    "routeHosts",
    "routePaths",
    "routePorts",
    "routeServices",
    "tls_secret_name",
];

/// The resource's own inputs (Humanitec's ingress resource inputs) this driver reads.
const PARAMS: [&str; 3] = ["host", "rules", "tls_secret_name"];

/// The most paths one Ingress may route: far more than a DNS name needs, few enough that a
/// runaway selector cannot build an object etcd would refuse.
const MAX_PATHS: usize = 1_000;

/// Renders an `Ingress` for the routes of one DNS name.
#[derive(Debug, Clone, Copy, Default)]
pub struct IngressDriver;

/// Where a path sends its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Port {
    Number(u16),
    Name(String),
}

/// One path of the Ingress, and which input it came from (for messages).
#[derive(Debug)]
struct Route {
    host: String,
    path: String,
    path_type: &'static str,
    service: String,
    port: Port,
    from: String,
}

impl Driver for IngressDriver {
    /// Always the same outputs: `id`.
    fn known_outputs(
        &self,
        _values: &Value,
        _secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        Some(["id"].iter().map(|n| n.to_string()).collect())
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let values = Section::new(DRIVER, "values", request.values)?.only(&VALUES)?;
        let params = Section::new(DRIVER, "params", request.resource)?.only(&PARAMS)?;
        Section::new(DRIVER, "secrets", request.secrets)?.only(&[])?;

        check_api_version(&values)?;
        let default_type = match values.string("path_type")? {
            None => "Prefix",
            Some(text) => path_type(text).ok_or_else(|| {
                values.error(
                    "path_type",
                    "must be Prefix, Exact or ImplementationSpecific",
                )
            })?,
        };
        let host = match values.string("host")? {
            Some(host) => Some((host, "values.host")),
            None => params.string("host")?.map(|h| (h, "params.host")),
        };
        if let Some((host, from)) = host {
            check_host(host, from)?;
        }

        let mut metadata = Map::new();
        let name = object_name(&resource_base(request), "ingress", NameRule::Subdomain);
        metadata.insert("name".into(), Value::String(name.clone()));
        if let Some(annotations) = values.annotations("annotations")? {
            metadata.insert("annotations".into(), Value::Object(annotations));
        }
        if let Some(labels) = values.labels("labels")? {
            metadata.insert("labels".into(), Value::Object(labels));
        }
        let class = values.string("class")?;
        if class.is_some_and(|c| !is_dns_subdomain(c)) {
            return Err(values.error(
                "class",
                "is not an IngressClass name: lower-case letters, digits, '-' and '.'",
            ));
        }
        let with_tls = !values.boolean("no_tls")?.unwrap_or(false);
        let tls_secret = tls_secret_name(&values, &params)?;

        let mut routes = routes_from_values(&values, host.map(|h| h.0), default_type)?;
        routes.extend(routes_from_rules(&params, host.map(|h| h.0))?);
        if routes.len() > MAX_PATHS {
            return Err(DriverError::final_error(format!(
                "{DRIVER}: {} paths for one Ingress, more than the {MAX_PATHS} allowed",
                routes.len()
            )));
        }
        let outputs = json!({ "id": name });
        // Without a route there is nothing to route: Humanitec makes no Ingress either.
        if routes.is_empty() {
            return Ok(done(outputs, json!({}), Vec::new()));
        }

        let hosts = group_by_host(routes)?;
        let mut spec = Map::new();
        if let Some(class) = class {
            spec.insert("ingressClassName".into(), class.into());
        }
        spec.insert("rules".into(), rules(&hosts));
        if with_tls {
            spec.insert("tls".into(), tls(tls_secret, &hosts));
        }

        let ingress = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": metadata,
            "spec": spec,
        });
        let manifest = Manifest {
            name: "ingress.yaml".into(),
            location: ManifestLocation::Namespace,
            data: ingress,
        };
        Ok(done(outputs, json!({}), vec![manifest]))
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// Only `networking.k8s.io/v1` is made: `v1beta1` Ingresses were removed in Kubernetes 1.22.
fn check_api_version(values: &Section<'_>) -> Result<(), DriverError> {
    match values.string("api_version")? {
        None | Some("v1" | "networking.k8s.io/v1") => Ok(()),
        Some("v1beta1" | "networking.k8s.io/v1beta1" | "extensions/v1beta1") => Err(values.error(
            "api_version",
            "asks for a v1beta1 Ingress, which Kubernetes removed in 1.22: write v1, or \
                 leave api_version out",
        )),
        Some(_) => Err(values.error("api_version", "must be v1 (or be left out)")),
    }
}

/// Kubernetes' spelling of a path type, whatever the case it was written in.
fn path_type(text: &str) -> Option<&'static str> {
    match text.to_ascii_lowercase().as_str() {
        "prefix" => Some("Prefix"),
        "exact" => Some("Exact"),
        "implementationspecific" => Some("ImplementationSpecific"),
        _ => None,
    }
}

/// A host an Ingress rule accepts: a lower-case DNS name, optionally `*.` before it.
fn check_host(host: &str, from: &str) -> Result<(), DriverError> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    if is_host_name(name) && name.contains(|c: char| c.is_ascii_lowercase()) {
        Ok(())
    } else {
        Err(DriverError::final_error(format!(
            "{DRIVER}: {from} is not a DNS name an Ingress accepts: lower-case letters, \
             digits, '-' and '.', optionally beginning with '*.'"
        )))
    }
}

fn check_path(path: &str, from: &str) -> Result<(), DriverError> {
    if path.starts_with('/') && !path.contains(char::is_whitespace) {
        Ok(())
    } else {
        Err(DriverError::final_error(format!(
            "{DRIVER}: {from} must be a path beginning with '/', without spaces"
        )))
    }
}

/// A Service name: a DNS label beginning with a letter.
fn check_service(service: &str, from: &str) -> Result<(), DriverError> {
    if is_dns_label(service) && service.starts_with(|c: char| c.is_ascii_lowercase()) {
        Ok(())
    } else {
        Err(DriverError::final_error(format!(
            "{DRIVER}: {from} is not a Service name: at most 63 lower-case letters, digits \
             and '-', beginning with a letter"
        )))
    }
}

/// A Service port: a number from 1 to 65535, or a port's name.
fn port(value: &Value, from: &str) -> Result<Port, DriverError> {
    let bad = || {
        DriverError::final_error(format!(
            "{DRIVER}: {from} must be a port number from 1 to 65535, or the name of a \
             Service port"
        ))
    };
    let number = match value {
        Value::Number(n) => n.as_u64().ok_or_else(bad)?,
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u64>().map_err(|_| bad())?
        }
        Value::String(s) => {
            // IANA service names: at most 15 lower-case letters, digits and '-', one letter.
            let named = s.len() <= 15
                && is_dns_label(s)
                && !s.contains("--")
                && s.contains(|c: char| c.is_ascii_lowercase());
            return if named {
                Ok(Port::Name(s.clone()))
            } else {
                Err(bad())
            };
        }
        _ => return Err(bad()),
    };
    match u16::try_from(number) {
        Ok(n) if n > 0 => Ok(Port::Number(n)),
        _ => Err(bad()),
    }
}

/// A string item of a route sequence.
fn item_str<'v>(value: &'v Value, from: &str) -> Result<&'v str, DriverError> {
    match value {
        Value::String(s) if !s.is_empty() => Ok(s),
        Value::String(_) | Value::Null => Err(DriverError::final_error(format!(
            "{DRIVER}: {from} is empty"
        ))),
        other => Err(DriverError::final_error(format!(
            "{DRIVER}: {from} must be a string, got {}",
            super::kind(other)
        ))),
    }
}

/// The routes `routePaths`, `routePorts`, `routeServices` and `routeHosts` describe: item N of
/// each is one route.
fn routes_from_values(
    values: &Section<'_>,
    host: Option<&str>,
    path_type: &'static str,
) -> Result<Vec<Route>, DriverError> {
    let Some(paths) = values.sequence("routePaths")? else {
        for key in ["routePorts", "routeServices", "routeHosts"] {
            if values.get(key).is_some() {
                return Err(values.error(
                    key,
                    "is set but routePaths is not: give all three of routePaths, routePorts \
                     and routeServices (from ${resources.dns<route.outputs.path}, .port and \
                     .service)",
                ));
            }
        }
        return Ok(Vec::new());
    };
    let ports = alongside(values, "routePorts", paths.len(), true)?;
    let services = alongside(values, "routeServices", paths.len(), true)?;
    let hosts = alongside(values, "routeHosts", paths.len(), false)?;

    let mut routes = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let path_from = format!("values.routePaths[{i}]");
        let path = item_str(path, &path_from)?;
        check_path(path, &path_from)?;
        let route_host = match hosts.map(|h| &h[i]) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(value) => Some(item_str(value, &format!("values.routeHosts[{i}]"))?),
        };
        let host = match route_host.or(host) {
            Some(h) => h,
            None => {
                return Err(DriverError::final_error(format!(
                    "{DRIVER}: route {i} has no host: set values.host (for example \
                     ${{resources.dns.outputs.host}}) or values.routeHosts"
                )));
            }
        };
        if route_host.is_some() {
            check_host(host, &format!("values.routeHosts[{i}]"))?;
        }
        let service_from = format!("values.routeServices[{i}]");
        let service = item_str(services.map_or(&Value::Null, |s| &s[i]), &service_from)?;
        check_service(service, &service_from)?;
        let port_from = format!("values.routePorts[{i}]");
        let port = port(ports.map_or(&Value::Null, |p| &p[i]), &port_from)?;
        routes.push(Route {
            host: host.to_owned(),
            path: path.to_owned(),
            path_type,
            service: service.to_owned(),
            port,
            from: path_from,
        });
    }
    Ok(routes)
}

/// A sequence that goes with `routePaths`: item N of each describes route N.
fn alongside<'a>(
    values: &Section<'a>,
    key: &str,
    routes: usize,
    required: bool,
) -> Result<Option<&'a Vec<Value>>, DriverError> {
    match values.sequence(key)? {
        None if required && routes > 0 => Err(values.error(
            key,
            "is missing: routePaths, routePorts and routeServices go together, item N of each \
             describing route N",
        )),
        Some(items) if items.len() != routes => Err(values.error(
            key,
            format_args!(
                "has {} items and routePaths has {routes}: item N of each describes route N",
                items.len()
            ),
        )),
        other => Ok(other),
    }
}

/// The routes of Humanitec's older ingress inputs: `rules.http` maps each path to
/// `{type, port, name}`, `name` being the Service, all under the resource's `host`.
fn routes_from_rules(params: &Section<'_>, host: Option<&str>) -> Result<Vec<Route>, DriverError> {
    let Some(rules) = params.mapping("rules")? else {
        return Ok(Vec::new());
    };
    if let Some(key) = rules.keys().find(|k| k.as_str() != "http") {
        return Err(params.error(
            "rules",
            format_args!("has the key '{key}': only rules.http is read"),
        ));
    }
    let http = match rules.get("http") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(params.error(
                "rules",
                format_args!(
                    "http must be a mapping of paths, got {}",
                    super::kind(other)
                ),
            ));
        }
    };
    if http.is_empty() {
        return Ok(Vec::new());
    }
    let Some(host) = host else {
        return Err(params.error(
            "rules",
            "route paths but there is no host: set params.host or values.host",
        ));
    };
    let mut routes = Vec::with_capacity(http.len());
    for (path, rule) in http {
        let from = format!("params.rules.http['{path}']");
        check_path(path, &from)?;
        let Value::Object(rule) = rule else {
            return Err(DriverError::final_error(format!(
                "{DRIVER}: {from} must be a mapping with type, port and name, got {}",
                super::kind(rule)
            )));
        };
        let path_type = match rule.get("type") {
            None | Some(Value::Null) => "Prefix",
            Some(Value::String(t)) => path_type(t).ok_or_else(|| {
                DriverError::final_error(format!(
                    "{DRIVER}: {from}.type must be prefix, exact or implementationspecific"
                ))
            })?,
            Some(other) => {
                return Err(DriverError::final_error(format!(
                    "{DRIVER}: {from}.type must be a string, got {}",
                    super::kind(other)
                )));
            }
        };
        let service = item_str(
            rule.get("name").unwrap_or(&Value::Null),
            &format!("{from}.name"),
        )?;
        check_service(service, &format!("{from}.name"))?;
        let port = port(
            rule.get("port").unwrap_or(&Value::Null),
            &format!("{from}.port"),
        )?;
        routes.push(Route {
            host: host.to_owned(),
            path: path.clone(),
            path_type,
            service: service.to_owned(),
            port,
            from,
        });
    }
    Ok(routes)
}

/// The routes grouped by host, hosts and paths in the order they came; a route given twice
/// counts once, and one path of one host sent to two places is an error.
fn group_by_host(routes: Vec<Route>) -> Result<Vec<(String, Vec<Route>)>, DriverError> {
    let mut hosts: Vec<(String, Vec<Route>)> = Vec::new();
    for route in routes {
        let index = match hosts.iter().position(|(h, _)| *h == route.host) {
            Some(index) => index,
            None => {
                hosts.push((route.host.clone(), Vec::new()));
                hosts.len() - 1
            }
        };
        let paths = &mut hosts[index].1;
        match paths
            .iter()
            .find(|p| p.path == route.path && p.path_type == route.path_type)
        {
            Some(seen) if seen.service == route.service && seen.port == route.port => {}
            Some(seen) => {
                return Err(DriverError::final_error(format!(
                    "{DRIVER}: {} and {} route the same host and path to different \
                     backends: give each route its own path",
                    seen.from, route.from
                )));
            }
            None => paths.push(route),
        }
    }
    Ok(hosts)
}

fn rules(hosts: &[(String, Vec<Route>)]) -> Value {
    let rules: Vec<Value> = hosts
        .iter()
        .map(|(host, routes)| {
            let paths: Vec<Value> = routes
                .iter()
                .map(|route| {
                    let port = match &route.port {
                        Port::Number(n) => json!({ "number": n }),
                        Port::Name(name) => json!({ "name": name }),
                    };
                    json!({
                        "path": route.path,
                        "pathType": route.path_type,
                        "backend": { "service": { "name": route.service, "port": port } },
                    })
                })
                .collect();
            json!({ "host": host, "http": { "paths": paths } })
        })
        .collect();
    Value::Array(rules)
}

/// The TLS Secret: `values.tls_secret_name`, else the resource's own `tls_secret_name`.
fn tls_secret_name<'a>(
    values: &Section<'a>,
    params: &Section<'a>,
) -> Result<Option<&'a str>, DriverError> {
    let (name, section) = match values.string("tls_secret_name")? {
        Some(name) => (name, values),
        None => match params.string("tls_secret_name")? {
            Some(name) => (name, params),
            None => return Ok(None),
        },
    };
    if is_dns_subdomain(name) {
        Ok(Some(name))
    } else {
        Err(section.error(
            "tls_secret_name",
            "is not a Secret name: lower-case letters, digits, '-' and '.'",
        ))
    }
}

/// One TLS entry for every host. Without a secret name the ingress controller serves its
/// default certificate for them.
fn tls(secret: Option<&str>, hosts: &[(String, Vec<Route>)]) -> Value {
    let mut entry = Map::new();
    entry.insert(
        "hosts".into(),
        hosts.iter().map(|(h, _)| Value::from(h.as_str())).collect(),
    );
    if let Some(name) = secret {
        entry.insert("secretName".into(), name.into());
    }
    json!([entry])
}

#[cfg(test)]
mod tests {
    use super::super::super::ErrorKind;
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

    /// The ingress of the DNS name `shared.dns`, as a dns definition co-provisions it.
    fn put(inputs: &Inputs) -> Result<PutOutcome, DriverError> {
        let mut req = request(inputs, None);
        req.res_type = "ingress";
        req.res_id = "shared.dns";
        IngressDriver.put(&req)
    }

    fn manifests_of(outcome: PutOutcome) -> (Value, Vec<Manifest>) {
        match outcome {
            PutOutcome::Done {
                outputs, manifests, ..
            } => (outputs, manifests),
            other => panic!("not done: {other:?}"),
        }
    }

    fn error(inputs: &Inputs) -> String {
        let err = put(inputs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        err.message
    }

    /// The routes of Humanitec's example Score file: three paths of one DNS name to one
    /// workload, with the nginx class and cert-manager annotations of the example library's
    /// `external-dns-cert-manager` definition.
    fn cert_manager_inputs() -> Inputs {
        inputs(json!({
            "annotations": {
                "cert-manager.io/cluster-issuer": "my-cluster-certificate-issue",
                "external-dns.alpha.kubernetes.io/hostname": "api.example.com",
            },
            "class": "nginx",
            "tls_secret_name": "tls-cert-0123456789abcdef",
            "host": "api.example.com",
            "routePaths": ["/users", "/products", "/checkout"],
            "routePorts": [80, 80, 80],
            "routeServices": ["routes-example", "routes-example", "routes-example"],
        }))
    }

    #[test]
    fn routes_of_one_dns_name_with_cert_manager() {
        let (outputs, manifests) = manifests_of(put(&cert_manager_inputs()).unwrap());
        assert_eq!(outputs, json!({"id": "shared.dns-ingress"}));
        golden::check("ingress-cert-manager", &manifests);
    }

    #[test]
    fn an_alb_ingress_without_tls() {
        // The example library's `alb-ingress`: annotations that look like JSON and numbers
        // stay strings, and `no_tls` leaves the tls section out.
        let alb = inputs(json!({
            "annotations": {
                "alb.ingress.kubernetes.io/certificate-arn": "arn:aws:acm:us-west-2:xxxxx:certificate/xxxxxxx",
                "alb.ingress.kubernetes.io/group.name": "my-team.my-group",
                "alb.ingress.kubernetes.io/listen-ports": "[{\"HTTP\":80},{\"HTTPS\":443}]",
                "alb.ingress.kubernetes.io/scheme": "internet-facing",
                "alb.ingress.kubernetes.io/ssl-redirect": "443",
                "alb.ingress.kubernetes.io/target-type": "ip",
            },
            "class": "alb",
            "no_tls": true,
            "host": "shop.example.com",
            "routePaths": ["/"],
            "routePorts": [8080],
            "routeServices": ["frontend"],
        }));
        let (_, manifests) = manifests_of(put(&alb).unwrap());
        assert!(manifests[0].data["spec"].get("tls").is_none());
        golden::check("ingress-alb", &manifests);
    }

    #[test]
    fn routes_of_several_hosts_and_the_older_rules() {
        // Kong's example: `api_version: v1`, labels; routes with hosts of their own (as
        // `routeHosts` from `${resources.dns<route.outputs.host}`), exact paths by default, a
        // named port, a duplicate route, and a workload's older `rules.http` inputs.
        let mut kong = inputs(json!({
            "annotations": {"konghq.com/strip-path": "true"},
            "api_version": "v1",
            "class": "kong",
            "labels": {"team": "shop", "app.kubernetes.io/managed-by": "gitplane"},
            "path_type": "exact",
            "routeHosts": ["b.example.com", "a.example.com", "b.example.com", "b.example.com"],
            "routePaths": ["/b", "/a", "/metrics", "/b"],
            "routePorts": [80, "8080", "metrics", 80],
            "routeServices": ["svc-b", "svc-a", "svc-b", "svc-b"],
        }));
        kong.resource = json!({
            "host": "legacy.example.com",
            "rules": {"http": {
                "/": {"type": "prefix", "port": 3000, "name": "legacy"},
                "/static": {"type": "ImplementationSpecific", "port": 3001, "name": "legacy"},
            }},
            "tls_secret_name": "legacy-tls",
        });
        let (_, manifests) = manifests_of(put(&kong).unwrap());
        let spec = &manifests[0].data["spec"];
        let hosts: Vec<&str> = spec["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["host"].as_str().unwrap())
            .collect();
        // routeHosts win over host; hosts in the order their first route came.
        assert_eq!(
            hosts,
            ["b.example.com", "a.example.com", "legacy.example.com"]
        );
        assert_eq!(
            spec["rules"][0]["http"]["paths"].as_array().unwrap().len(),
            2
        );
        assert_eq!(spec["tls"][0]["secretName"], "legacy-tls");
        golden::check("ingress-kong-hosts-and-rules", &manifests);
    }

    #[test]
    fn no_route_means_no_ingress() {
        for values in [
            json!({"class": "nginx"}),
            json!({"host": "a.example.com", "routePaths": [], "routePorts": [], "routeServices": []}),
            Value::Null,
        ] {
            let (outputs, manifests) = manifests_of(put(&inputs(values)).unwrap());
            assert!(manifests.is_empty());
            assert_eq!(outputs, json!({"id": "shared.dns-ingress"}));
        }
    }

    #[test]
    fn the_name_comes_from_the_resource() {
        let mut req_inputs = cert_manager_inputs();
        req_inputs.values["routePaths"] = json!(["/", "/x", "/y"]);
        let mut req = request(&req_inputs, None);
        req.res_id = "modules.web.externals.api_dns";
        req.class = "public";
        let (outputs, manifests) = manifests_of(IngressDriver.put(&req).unwrap());
        let name = manifests[0].data["metadata"]["name"].as_str().unwrap();
        assert_eq!(outputs["id"], name);
        assert!(is_dns_subdomain(name), "{name}");
        assert!(
            name.starts_with("modules.web.externals.api-dns-public-"),
            "{name}"
        );
        assert!(name.ends_with("-ingress"), "{name}");
    }

    #[test]
    fn bad_inputs_say_what_to_write() {
        let cases: Vec<(Value, &str)> = vec![
            (
                json!({"clas": "nginx"}),
                "values.clas is not an input of this driver",
            ),
            (
                json!({"class": 1}),
                "values.class must be a string, got a number",
            ),
            (
                json!({"class": "Nginx_X"}),
                "values.class is not an IngressClass name",
            ),
            (
                json!({"api_version": "v1beta1"}),
                "removed in 1.22: write v1",
            ),
            (
                json!({"path_type": "Regex"}),
                "must be Prefix, Exact or ImplementationSpecific",
            ),
            (
                json!({"no_tls": "yes"}),
                "values.no_tls must be true or false, got a string",
            ),
            (
                json!({"routePorts": [80]}),
                "routePorts is set but routePaths is not",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["/"], "routeServices": ["a"]}),
                "values.routePorts is missing",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["/", "/b"], "routePorts": [80], "routeServices": ["a", "a"]}),
                "values.routePorts has 1 items and routePaths has 2",
            ),
            (
                json!({"routePaths": ["/"], "routePorts": [80], "routeServices": ["a"]}),
                "route 0 has no host: set values.host",
            ),
            (
                json!({"host": "A.Example.com", "routePaths": ["/"], "routePorts": [80], "routeServices": ["a"]}),
                "values.host is not a DNS name an Ingress accepts",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["users"], "routePorts": [80], "routeServices": ["a"]}),
                "values.routePaths[0] must be a path beginning with '/'",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["/"], "routePorts": [0], "routeServices": ["a"]}),
                "values.routePorts[0] must be a port number from 1 to 65535",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["/"], "routePorts": [80], "routeServices": ["9lives"]}),
                "values.routeServices[0] is not a Service name",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["/"], "routePorts": [80], "routeServices": [null]}),
                "values.routeServices[0] is empty",
            ),
            (
                json!({"host": "a.example.com", "routePaths": ["/", "/"], "routePorts": [80, 81], "routeServices": ["a", "a"]}),
                "values.routePaths[0] and values.routePaths[1] route the same host and path to different backends",
            ),
            (
                json!({"host": "a.example.com", "tls_secret_name": "Bad Name", "routePaths": ["/"], "routePorts": [80], "routeServices": ["a"]}),
                "values.tls_secret_name is not a Secret name",
            ),
            (
                json!({"labels": {"team": "a b"}, "host": "a.example.com", "routePaths": ["/"], "routePorts": [80], "routeServices": ["a"]}),
                "values.labels 'team' is not a valid label value",
            ),
            (
                json!({"annotations": {"x": false}, "host": "a.example.com", "routePaths": ["/"], "routePorts": [80], "routeServices": ["a"]}),
                "values.annotations 'x' must be a string, got a boolean (quote it)",
            ),
            (json!(["nginx"]), "values must be a mapping, got a sequence"),
        ];
        for (values, expected) in cases {
            let message = error(&inputs(values.clone()));
            assert!(
                message.starts_with("humanitec/ingress: ") && message.contains(expected),
                "{values}: {message}"
            );
        }
    }

    #[test]
    fn bad_older_rules_and_secrets() {
        let mut rules = inputs(json!({}));
        rules.resource = json!({"rules": {"http": {"/": {"port": 80, "name": "web"}}}});
        assert!(error(&rules).contains("params.rules route paths but there is no host"));
        rules.resource = json!({"host": "a.example.com", "rules": {"http": {"/": {"type": "regex", "port": 80, "name": "web"}}}});
        assert!(error(&rules).contains("params.rules.http['/'].type must be prefix"));
        rules.resource = json!({"host": "a.example.com", "rules": {"https": {}}});
        assert!(error(&rules).contains("only rules.http is read"));

        let mut secret = inputs(json!({}));
        secret.secrets = json!({"token": "hunter2-secret"});
        let message = error(&secret);
        assert!(
            message.contains("secrets.token is not an input"),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn messages_never_quote_values() {
        let secret = "s3cr3t-value-from-a-store";
        for values in [
            json!({"host": secret.to_uppercase(), "routePaths": ["/"], "routePorts": [80], "routeServices": ["a"]}),
            json!({"host": "a.example.com", "routePaths": [secret], "routePorts": [80], "routeServices": ["a"]}),
            json!({"host": "a.example.com", "routePaths": ["/"], "routePorts": [secret], "routeServices": ["a"]}),
            json!({"class": format!("{secret}!")}),
            json!({"labels": {"k": format!("{secret} !")}}),
        ] {
            let message = error(&inputs(values));
            assert!(!message.to_lowercase().contains(secret), "{message}");
        }
    }
}
