//! Humanitec's Kubernetes drivers, built in: they turn a resource's inputs into Kubernetes
//! manifests (an Ingress, a PersistentVolumeClaim, a HorizontalPodAutoscaler) or pass a
//! cluster's connection details through, computing everything from the request alone.
//!
//! Every driver here is pure: no I/O, no clock, no randomness, so a put is answered in process
//! and the same request always gives the same manifests. Object names are derived from the
//! resource (its `res_id`, and its class when not `default`), never chosen at random, so that
//! an update replaces the object it made before. Input errors name the driver, the input and
//! what to write, and never quote an input's value (any of them may have come from a secret).

mod cluster;
mod dns;
mod hpa;
mod ingress;
mod volume;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{Cookie, DriverError, DriverRequest, Manifest, PutOutcome};

pub use cluster::{ClusterDriver, ClusterFlavor};
pub use dns::DnsWildcardDriver;
pub use hpa::HpaDriver;
pub use ingress::IngressDriver;
pub use volume::{VolumeNfsDriver, VolumePvcDriver};

/// The longest DNS subdomain (most object names) Kubernetes accepts.
const MAX_SUBDOMAIN: usize = 253;
/// The longest DNS label (pod volume names, Service names, label values) Kubernetes accepts.
const MAX_LABEL: usize = 63;
/// The most bytes all annotations of one object may hold (Kubernetes' own limit).
const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// A JSON value's kind, for messages that must not quote it.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

/// One section of a request's inputs (`values`, `secrets`, or the resource's own `params`),
/// read with messages that name the driver and the key and never quote a value.
struct Section<'a> {
    driver: &'static str,
    name: &'static str,
    map: Option<&'a Map<String, Value>>,
}

impl<'a> Section<'a> {
    /// `value` must be a mapping; null (nothing given) reads as empty.
    fn new(
        driver: &'static str,
        name: &'static str,
        value: &'a Value,
    ) -> Result<Self, DriverError> {
        let map = match value {
            Value::Null => None,
            Value::Object(map) => Some(map),
            other => {
                return Err(DriverError::final_error(format!(
                    "{driver}: {name} must be a mapping, got {}",
                    kind(other)
                )));
            }
        };
        Ok(Section { driver, name, map })
    }

    /// Refuses keys this driver does not know, so that a typo is an error rather than an input
    /// silently left out of the manifests.
    fn only(self, known: &[&str]) -> Result<Self, DriverError> {
        if let Some(map) = self.map
            && let Some(key) = map.keys().find(|k| !known.contains(&k.as_str()))
        {
            let known = if known.is_empty() {
                "it takes none".to_owned()
            } else {
                format!("it knows {}", known.join(", "))
            };
            return Err(DriverError::final_error(format!(
                "{}: {}.{key} is not an input of this driver ({known})",
                self.driver, self.name
            )));
        }
        Ok(self)
    }

    /// An error about `key`: `<driver>: <section>.<key> <message>`.
    fn error(&self, key: &str, message: impl std::fmt::Display) -> DriverError {
        DriverError::final_error(format!("{}: {}.{key} {message}", self.driver, self.name))
    }

    /// The value of `key`; null counts as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map?.get(key).filter(|v| !v.is_null())
    }

    /// An optional string; an empty one counts as absent (a placeholder that resolved to
    /// nothing).
    fn string(&self, key: &str) -> Result<Option<&'a str>, DriverError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.error(
                key,
                format_args!("must be a string, got {} (quote it)", kind(other)),
            )),
        }
    }

    /// A string that must be there; `hint` says what to write.
    fn required_string(&self, key: &str, hint: &str) -> Result<&'a str, DriverError> {
        self.string(key)?
            .ok_or_else(|| self.error(key, format_args!("is missing or empty: {hint}")))
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, DriverError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.error(
                key,
                format_args!("must be true or false, got {}", kind(other)),
            )),
        }
    }

    /// A whole number, written as one or as a string of digits (what a placeholder inside a
    /// string resolves to).
    fn integer(&self, key: &str) -> Result<Option<i64>, DriverError> {
        let bad = || self.error(key, "must be a whole number");
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(bad),
            Some(Value::String(s)) => s.trim().parse::<i64>().map(Some).map_err(|_| bad()),
            Some(other) => Err(self.error(
                key,
                format_args!("must be a whole number, got {}", kind(other)),
            )),
        }
    }

    fn mapping(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, DriverError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map)),
            Some(other) => {
                Err(self.error(key, format_args!("must be a mapping, got {}", kind(other))))
            }
        }
    }

    fn sequence(&self, key: &str) -> Result<Option<&'a Vec<Value>>, DriverError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => {
                Err(self.error(key, format_args!("must be a sequence, got {}", kind(other))))
            }
        }
    }

    /// `labels`: a mapping of Kubernetes label keys to label values.
    fn labels(&self, key: &str) -> Result<Option<Map<String, Value>>, DriverError> {
        let Some(map) = self.mapping(key)? else {
            return Ok(None);
        };
        let mut labels = Map::new();
        for (name, value) in map {
            check_qualified_name(name).map_err(|why| {
                self.error(key, format_args!("has the key '{name}', which {why}"))
            })?;
            let Value::String(text) = value else {
                return Err(self.error(
                    key,
                    format_args!("'{name}' must be a string, got {} (quote it)", kind(value)),
                ));
            };
            if !is_label_value(text) {
                return Err(self.error(
                    key,
                    format_args!(
                        "'{name}' is not a valid label value: at most 63 letters, digits, \
                         '-', '_' or '.', beginning and ending with a letter or digit"
                    ),
                ));
            }
            labels.insert(name.clone(), value.clone());
        }
        Ok(Some(labels))
    }

    /// `annotations`: a mapping of Kubernetes annotation keys to strings.
    fn annotations(&self, key: &str) -> Result<Option<Map<String, Value>>, DriverError> {
        let Some(map) = self.mapping(key)? else {
            return Ok(None);
        };
        let mut size = 0;
        for (name, value) in map {
            check_qualified_name(name).map_err(|why| {
                self.error(key, format_args!("has the key '{name}', which {why}"))
            })?;
            let Value::String(text) = value else {
                return Err(self.error(
                    key,
                    format_args!("'{name}' must be a string, got {} (quote it)", kind(value)),
                ));
            };
            size += name.len() + text.len();
        }
        if size > MAX_ANNOTATION_BYTES {
            return Err(self.error(
                key,
                format_args!(
                    "hold {size} bytes, more than the {MAX_ANNOTATION_BYTES} Kubernetes allows"
                ),
            ));
        }
        Ok(Some(map.clone()))
    }
}

/// Whether `s` is a DNS label as Kubernetes means it (RFC 1123): at most 63 lower-case letters,
/// digits and '-', beginning and ending with a letter or digit.
fn is_dns_label(s: &str) -> bool {
    s.len() <= MAX_LABEL && is_label_shaped(s)
}

/// Lower-case letters, digits and '-', beginning and ending with a letter or digit.
fn is_label_shaped(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS subdomain as Kubernetes checks object names: at most 253 characters,
/// label-shaped parts joined by dots (Kubernetes does not limit the parts to 63).
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN && s.split('.').all(is_label_shaped)
}

/// Whether `s` is a host name DNS can resolve: a subdomain whose parts are at most 63 long.
fn is_host_name(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN && s.split('.').all(is_dns_label)
}

/// Whether `s` is a label value: empty, or at most 63 letters, digits, '-', '_' and '.',
/// beginning and ending with a letter or digit.
fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name(s)
}

fn is_label_name(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= MAX_LABEL
        && alnum(s.chars().next())
        && alnum(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks a label or annotation key: `[prefix/]name`, the prefix a DNS subdomain.
fn check_qualified_name(key: &str) -> Result<(), &'static str> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if !is_dns_subdomain(prefix) {
                return Err("has a prefix (before '/') that is not a DNS subdomain");
            }
            name
        }
        None => key,
    };
    if is_label_name(name) {
        Ok(())
    } else {
        Err(
            "is not a valid key: at most 63 letters, digits, '-', '_' or '.' (after an \
             optional 'prefix/'), beginning and ending with a letter or digit",
        )
    }
}

/// The kinds of name Kubernetes objects take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameRule {
    /// Most objects (Ingress, PersistentVolumeClaim, HorizontalPodAutoscaler): a DNS subdomain.
    Subdomain,
    /// Pod volumes: a DNS label.
    Label,
}

/// What names of a resource's objects are made from: its ID, and its class when that is not
/// `default` (two shared resources may have one ID and different classes).
fn resource_base(request: &DriverRequest<'_>) -> String {
    if request.class == "default" {
        request.res_id.to_owned()
    } else {
        format!("{}-{}", request.res_id, request.class)
    }
}

/// The name of an object made for `base`: `<base>-<suffix>` when Kubernetes accepts that as
/// it is (Humanitec's naming, e.g. `shared.dns-ingress`), otherwise `base` cleaned up
/// (lower case, other characters as '-', cut short) followed by 8 hex digits of its SHA-256,
/// so that two bases never clean up to one name.
fn object_name(base: &str, suffix: &str, rule: NameRule) -> String {
    let plain = format!("{base}-{suffix}");
    let (valid, max) = match rule {
        NameRule::Subdomain => (is_dns_subdomain(&plain), MAX_SUBDOMAIN),
        NameRule::Label => (is_dns_label(&plain), MAX_LABEL),
    };
    if valid {
        return plain;
    }
    let digest = Sha256::digest(base.as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let room = max - suffix.len() - hash.len() - 2;
    let mut clean = String::with_capacity(room + 1);
    for c in base.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else if c == '.' && rule == NameRule::Subdomain {
            '.'
        } else {
            '-'
        };
        // Each dot-separated part must begin and end with a letter or digit: no separator
        // first, none after a '.', and a '.' replaces a '-' before it.
        if c == '-' || c == '.' {
            match clean.chars().last() {
                None | Some('.') => continue,
                Some('-') => {
                    if c == '.' {
                        clean.pop();
                        clean.push('.');
                    }
                    continue;
                }
                Some(_) => {}
            }
        }
        clean.push(c);
        if clean.len() > room {
            break;
        }
    }
    clean.truncate(room);
    while clean.ends_with(['-', '.']) {
        clean.pop();
    }
    if clean.is_empty() {
        format!("r-{hash}-{suffix}")
    } else {
        format!("{clean}-{hash}-{suffix}")
    }
}

/// The answer of every driver here: done, no cookie.
fn done(outputs: Value, secret_outputs: Value, manifests: Vec<Manifest>) -> PutOutcome {
    PutOutcome::Done {
        outputs,
        secret_outputs,
        cookie: Cookie::Unchanged,
        manifests,
    }
}

/// Checks that `text` is a Kubernetes quantity (`10Gi`, `500M`, `1.5Ti`, `1e9`) greater than
/// zero.
fn is_positive_quantity(text: &str) -> bool {
    let text = text.strip_prefix('+').unwrap_or(text);
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let mut parts = number.split('.');
    let whole = parts.next().unwrap_or("");
    let fraction = parts.next();
    if parts.next().is_some()
        || (whole.is_empty() && fraction.is_none_or(str::is_empty))
        || !number.bytes().any(|b| b.is_ascii_digit() && b != b'0')
    {
        return false;
    }
    const SUFFIXES: [&str; 16] = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    // A decimal exponent: e or E, an optional sign, digits.
    let Some(exponent) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_humanitec_when_kubernetes_accepts_them() {
        assert_eq!(
            object_name("shared.dns", "ingress", NameRule::Subdomain),
            "shared.dns-ingress"
        );
        assert_eq!(
            object_name(
                "modules.web.externals.api-dns",
                "ingress",
                NameRule::Subdomain
            ),
            "modules.web.externals.api-dns-ingress"
        );
        assert_eq!(object_name("web", "hpa", NameRule::Label), "web-hpa");
    }

    #[test]
    fn other_names_are_cleaned_up_and_keep_apart() {
        let a = object_name("modules.web.externals.data", "volume", NameRule::Label);
        let b = object_name("modules.web.externals-data", "volume", NameRule::Label);
        assert!(a.starts_with("modules-web-externals-data-"), "{a}");
        assert!(a.ends_with("-volume"), "{a}");
        assert_ne!(a, b, "two resource IDs must not share a volume name");
        for name in [&a, &b] {
            assert!(is_dns_label(name), "{name}");
        }

        let upper = object_name("shared.My_Data..x", "pvc", NameRule::Subdomain);
        assert!(is_dns_subdomain(&upper), "{upper}");
        assert!(upper.starts_with("shared.my-data.x-"), "{upper}");

        let long = "a".repeat(400);
        for rule in [NameRule::Label, NameRule::Subdomain] {
            let name = object_name(&long, "pvc", rule);
            let ok = match rule {
                NameRule::Label => is_dns_label(&name),
                NameRule::Subdomain => is_dns_subdomain(&name),
            };
            assert!(ok, "{rule:?}: {name}");
        }
        let symbols = object_name("-_.", "pvc", NameRule::Label);
        assert!(is_dns_label(&symbols), "{symbols}");
    }

    #[test]
    fn quantities() {
        for good in [
            "10Gi", "500Mi", "1.5Ti", "1e9", "1E3", "100", "+2G", "0.5Gi", ".5Gi",
        ] {
            assert!(is_positive_quantity(good), "{good}");
        }
        for bad in [
            "", "0", "0Gi", "10 Gi", "10GB", "-1Gi", "Gi", "1.2.3Gi", "1e", "ten", "10gi", ".",
        ] {
            assert!(!is_positive_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn label_and_annotation_keys() {
        for good in ["app", "app.kubernetes.io/name", "a_b.c-d", "x/Y"] {
            assert!(check_qualified_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a/", "/a", "Bad_Prefix/a", "a b", &"k".repeat(64)] {
            assert!(check_qualified_name(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod registry_tests {
    use super::super::Registry;

    #[test]
    fn the_kubernetes_drivers_are_built_in_and_answer_in_process() {
        let registry = Registry::builtin();
        for driver_type in [
            "humanitec/ingress",
            "humanitec/volume-pvc",
            "humanitec/volume-nfs",
            "humanitec/hpa",
            "humanitec/dns-wildcard",
            "humanitec/k8s-cluster",
            "humanitec/k8s-cluster-eks",
            "humanitec/k8s-cluster-gke",
            "humanitec/k8s-cluster-aks",
            "humanitec/k8s-cluster-git",
            "humanitec/static",
        ] {
            let registered = registry
                .get(driver_type)
                .unwrap_or_else(|| panic!("{driver_type} is not built in"));
            assert!(registered.driver.in_process(), "{driver_type}");
        }
    }
}
