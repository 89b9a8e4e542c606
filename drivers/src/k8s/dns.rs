//! `humanitec/dns-wildcard`: a host name under a domain whose wildcard record already points
//! at the cluster's load balancer, so that nothing needs creating: the host is the subdomain
//! `template` followed by `domain`.
//!
//! Humanitec renders `template` as a Go template; here the placeholders (`${context.app.id}`)
//! are already resolved when the driver is called and the result is used as it is. A template
//! with Go template actions (`{{ … }}`) is refused rather than used literally.

use serde_json::json;

use super::super::{DeleteOutcome, Driver, DriverError, DriverRequest, PutOutcome};
use super::{Section, done, is_host_name};

const DRIVER: &str = "humanitec/dns-wildcard";

/// Gives each resource a host under a wildcard domain.
#[derive(Debug, Clone, Copy, Default)]
pub struct DnsWildcardDriver;

impl Driver for DnsWildcardDriver {
    /// Always the same outputs: `host`.
    fn known_outputs(
        &self,
        _values: &serde_json::Value,
        _secrets: &serde_json::Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        Some(["host"].iter().map(|n| n.to_string()).collect())
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let values =
            Section::new(DRIVER, "values", request.values)?.only(&["domain", "template"])?;
        Section::new(DRIVER, "secrets", request.secrets)?.only(&[])?;
        let domain = values.required_string(
            "domain",
            "write the domain whose wildcard record points at the cluster (example.com for \
             *.example.com)",
        )?;
        let domain = domain.strip_prefix("*.").unwrap_or(domain);
        if !is_host_name(domain) {
            return Err(values.error(
                "domain",
                "is not a DNS name: lower-case letters, digits, '-' and '.'",
            ));
        }
        let template = values.required_string(
            "template",
            "write the subdomain, for example ${context.env.id}-${context.app.id}",
        )?;
        if template.contains("{{") {
            return Err(values.error(
                "template",
                "uses Go template actions ({{ … }}), which this driver does not render: build \
                 the subdomain from ${context…} placeholders, or use humanitec/template",
            ));
        }
        let host = format!("{template}.{domain}");
        if !is_host_name(&host) {
            return Err(values.error(
                "template",
                "does not make a DNS name with the domain: the subdomain may hold lower-case \
                 letters, digits, '-' and '.', at most 63 between dots",
            ));
        }
        Ok(done(json!({ "host": host }), json!({}), Vec::new()))
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
    use serde_json::Value;

    use super::super::super::test_request::{Inputs, request};
    use super::*;

    fn put(values: Value) -> Result<PutOutcome, DriverError> {
        let inputs = Inputs {
            resource: Value::Null,
            values,
            secrets: json!({}),
            account: None,
        };
        DnsWildcardDriver.put(&request(&inputs, None))
    }

    #[test]
    fn the_host_is_the_template_under_the_domain() {
        // The example library's definition, its placeholders resolved for app shop in dev.
        let outcome = put(json!({"domain": "staging.hosted-domain.com", "template": "dev-shop"}));
        assert_eq!(
            outcome.unwrap(),
            done(
                json!({"host": "dev-shop.staging.hosted-domain.com"}),
                json!({}),
                Vec::new()
            )
        );
        let wildcard = put(json!({"domain": "*.example.com", "template": "api.dev"})).unwrap();
        assert_eq!(
            wildcard,
            done(
                json!({"host": "api.dev.example.com"}),
                json!({}),
                Vec::new()
            )
        );
    }

    #[test]
    fn bad_inputs_say_what_to_write() {
        let cases = [
            (
                json!({"template": "x"}),
                "values.domain is missing or empty",
            ),
            (
                json!({"domain": "example.com"}),
                "values.template is missing or empty: write the subdomain",
            ),
            (
                json!({"domain": "Example.com", "template": "x"}),
                "values.domain is not a DNS name",
            ),
            (
                json!({"domain": "example.com", "template": "{{ index (splitList \".\" \"a.b\") 1 }}-dev"}),
                "uses Go template actions",
            ),
            (
                json!({"domain": "example.com", "template": "Dev_Shop"}),
                "does not make a DNS name",
            ),
            (
                json!({"domain": "example.com", "template": "x", "ttl": 60}),
                "values.ttl is not an input",
            ),
        ];
        for (values, expected) in cases {
            let err = put(values.clone()).unwrap_err();
            assert!(
                err.message.starts_with("humanitec/dns-wildcard: ")
                    && err.message.contains(expected),
                "{values}: {}",
                err.message
            );
        }
    }
}
