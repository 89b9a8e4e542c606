//! Finds the secret values a driver call received in the public outputs it answered, so that no
//! secret is recorded or shown as a public output, whatever the driver did with it.
//!
//! A call receives secrets (`driver_inputs.secrets`, stored secrets, other resources' secret
//! outputs, the secrets that flowed into a workload's Score file) and the credentials of its
//! resource account. A template, a program or a remote driver can copy any of them into a
//! public output, as they are or encoded. [`Needles`] holds every such value in the forms a
//! driver may have written it in; [`separate`] moves each public output that holds one into the
//! secret outputs, under the same name, so readers still find it, now as a secret.
//!
//! Pure: no I/O, no logging; the reconciler and drift runs call it and log what it reports.

use serde_json::{Map, Value};

/// The shortest secret value looked for, in bytes. A shorter one (a 1-byte "secret", a port
/// like `80`) would match nearly every output; secrets that short protect nothing anyway.
pub const MIN_SECRET_BYTES: usize = 4;

/// The secret values of one call, each in every form it is looked for in.
///
/// A value is a string or a number (as JSON writes it) of at least [`MIN_SECRET_BYTES`] bytes,
/// found anywhere inside the secrets given (booleans carry one bit and are left out). Its forms:
/// the value itself; JSON-escaped (as `serde_json` and Go's `encoding/json` write it, so
/// `toJson .` is covered); hexadecimal in either case; base64, standard and URL-safe, with or
/// without padding, at each of the three byte alignments, so that the value is found inside a
/// longer encoded text too. Percent-encoding (of paths or forms, whatever the encoder chose to
/// escape) is undone in the text searched instead: see [`Needles::found_in`].
#[derive(Debug, Clone, Default)]
pub struct Needles {
    forms: Vec<String>,
}

impl Needles {
    /// The needles for every string and number inside `secrets`.
    pub fn of<'v>(secrets: impl IntoIterator<Item = &'v Value>) -> Needles {
        Needles::of_call(secrets, std::iter::empty())
    }

    /// The needles of a call: every string and number inside `secrets`, but those that a
    /// string or number of `shown` (the call's public inputs, which state and commands show)
    /// holds already. Those are public anyway: a definition that puts a public output, or text
    /// its public inputs hold, under `secrets` (a database user name it passes on) does not
    /// make every output that mentions it secret.
    pub fn of_call<'s, 'p>(
        secrets: impl IntoIterator<Item = &'s Value>,
        shown: impl IntoIterator<Item = &'p Value>,
    ) -> Needles {
        let mut values = Vec::new();
        for secret in secrets {
            leaves(secret, &mut values);
        }
        values.retain(|v| v.len() >= MIN_SECRET_BYTES);
        let mut public = Vec::new();
        for value in shown {
            leaves(value, &mut public);
        }
        values.retain(|v| !public.iter().any(|p| p.contains(v.as_str())));
        values.sort_unstable();
        values.dedup();
        let mut forms = Vec::with_capacity(values.len() * 12);
        for value in &values {
            add_forms(value, &mut forms);
        }
        forms.retain(|f| !f.is_empty());
        // Longest first: most texts hold no secret, and a long needle is rejected fast.
        forms.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Needles { forms }
    }

    /// Whether there is nothing to look for (the call received no secret long enough).
    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// Whether `text` holds a secret in one of its forms, as it is or percent-decoded (`%XX`
    /// escapes of any character, either case, with `+` read as a space or as itself).
    pub fn found_in(&self, text: &str) -> bool {
        if self.forms.is_empty() {
            return false;
        }
        if self.raw(text) {
            return true;
        }
        if text.contains('%') {
            return self.raw(&percent_decoded(text, false))
                || self.raw(&percent_decoded(text, true));
        }
        text.contains('+') && self.raw(&percent_decoded(text, true))
    }

    /// Whether any string, number or object key inside `value` holds a secret.
    pub fn found_in_value(&self, value: &Value) -> bool {
        match value {
            Value::String(s) => self.found_in(s),
            Value::Number(n) => self.found_in(&n.to_string()),
            Value::Array(items) => items.iter().any(|v| self.found_in_value(v)),
            Value::Object(map) => map
                .iter()
                .any(|(k, v)| self.found_in(k) || self.found_in_value(v)),
            Value::Null | Value::Bool(_) => false,
        }
    }

    fn raw(&self, text: &str) -> bool {
        self.forms
            .iter()
            .any(|form| form.len() <= text.len() && text.contains(form.as_str()))
    }
}

/// What [`separate`] did with one public output that held a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leak {
    /// Moved to the secret outputs under its name.
    Moved(String),
    /// Dropped: the secret outputs already have one of this name, which its readers now get.
    Shadowed(String),
    /// Dropped: its name itself holds a secret, so it cannot be shown even by name.
    Unnameable,
}

impl Leak {
    /// The warning to log: names the definition, the resource and the output, never a value.
    pub fn message(&self, definition: &str, resource: &str) -> String {
        match self {
            Leak::Moved(name) => format!(
                "definition {definition}: output '{name}' of {resource} holds a secret value its \
                 driver received; it is recorded and served as a secret output (read it under \
                 driver_inputs.secrets)"
            ),
            Leak::Shadowed(name) => format!(
                "definition {definition}: output '{name}' of {resource} holds a secret value its \
                 driver received; it is dropped, and readers get the secret output of that name"
            ),
            Leak::Unnameable => format!(
                "definition {definition}: an output of {resource} whose name holds a secret value \
                 its driver received is dropped"
            ),
        }
    }
}

/// Moves every public output (a top-level entry of `outputs`) that holds a secret, in its
/// value, a key inside it or its name, into `secret_outputs` under the same name; the whole
/// output moves, so that a read of any part of it stays secret. Returns what it did, in the
/// order of the outputs.
pub fn separate(needles: &Needles, outputs: &mut Value, secret_outputs: &mut Value) -> Vec<Leak> {
    let Value::Object(public) = outputs else {
        return Vec::new();
    };
    if needles.is_empty() {
        return Vec::new();
    }
    let leaking: Vec<String> = public
        .iter()
        .filter(|(name, value)| needles.found_in(name) || needles.found_in_value(value))
        .map(|(name, _)| name.clone())
        .collect();
    if leaking.is_empty() {
        return Vec::new();
    }
    if !secret_outputs.is_object() {
        *secret_outputs = Value::Object(Map::new());
    }
    let Value::Object(secret) = secret_outputs else {
        unreachable!("made an object above")
    };
    let mut leaks = Vec::with_capacity(leaking.len());
    for name in leaking {
        let Some(value) = public.remove(&name) else {
            continue;
        };
        if needles.found_in(&name) {
            leaks.push(Leak::Unnameable);
        } else if secret.contains_key(&name) {
            leaks.push(Leak::Shadowed(name));
        } else {
            secret.insert(name.clone(), value);
            leaks.push(Leak::Moved(name));
        }
    }
    leaks
}

/// Every string and number inside `value`, as text: what a secret value is looked for as,
/// and redacted as.
pub fn leaves(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Number(n) => out.push(n.to_string()),
        Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
        Value::Object(map) => map.values().for_each(|v| leaves(v, out)),
        Value::Null | Value::Bool(_) => {}
    }
}

/// Every form `value` is looked for in.
fn add_forms(value: &str, forms: &mut Vec<String>) {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    forms.push(value.to_owned());
    // JSON-escaped, as serde writes it and, with `<`, `>`, `&` and the line separators
    // escaped too, as Go's encoding/json (Sprig's toJson) does.
    let json = serde_json::to_string(value).unwrap_or_default();
    let json = json
        .strip_prefix('"')
        .and_then(|j| j.strip_suffix('"'))
        .unwrap_or_default()
        .to_owned();
    let go = json
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029");
    forms.push(go);
    forms.push(json);
    let bytes = value.as_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    forms.push(hex.to_ascii_uppercase());
    forms.push(hex);
    // In a longer base64 text the value starts at one of three byte alignments; the characters
    // that encode its bits alone are the same whatever comes before or after it.
    for offset in 0..3usize {
        let mut shifted = vec![0u8; offset];
        shifted.extend_from_slice(bytes);
        let first = (8 * offset).div_ceil(6);
        let end = (8 * (offset + bytes.len())) / 6;
        for engine in [&STANDARD, &URL_SAFE] {
            let encoded = engine.encode(&shifted);
            if let Some(stable) = encoded.get(first..end) {
                forms.push(stable.to_owned());
            }
        }
    }
}

/// `text` with every `%XX` escape decoded (and `+` as a space when `form`); an escape that
/// decodes to invalid UTF-8 becomes U+FFFD, which no secret's form contains.
fn percent_decoded(text: &str, form: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2])) {
                    (Some(hi), Some(lo)) => {
                        out.push(hi << 4 | lo);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' if form => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use serde_json::json;

    use super::*;

    const SECRET: &str = "p@ss/w0rd+?&=<é>";

    fn needles() -> Needles {
        Needles::of([&json!({"password": SECRET, "nested": [{"pin": 271828}]})])
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_secret_is_found_as_it_is_and_inside_longer_text() {
        let n = needles();
        assert!(n.found_in(SECRET));
        assert!(n.found_in(&format!("postgres://app:{SECRET}@db:5432/orders")));
        assert!(n.found_in("pin 271828!"));
        assert!(!n.found_in("postgres://app@db:5432/orders"));
        assert!(!n.found_in(""));
    }

    #[test]
    fn json_escaped_forms_are_found() {
        let n = Needles::of([&json!({"a": "quote\"back\\slash", "b": "<tag>&amp"})]);
        let serde = json!({"x": "quote\"back\\slash"}).to_string();
        assert!(n.found_in(&serde), "{serde}");
        // Go's encoding/json escapes HTML characters.
        assert!(n.found_in(r#"{"x":"\u003ctag\u003e\u0026amp"}"#));
        assert!(!n.found_in("quote back slash"));
    }

    #[test]
    fn hex_in_either_case_is_found() {
        let n = needles();
        let h = hex(SECRET.as_bytes());
        assert!(n.found_in(&h));
        assert!(n.found_in(&h.to_ascii_uppercase()));
        assert!(n.found_in(&format!("0x{h}00")));
    }

    #[test]
    fn base64_is_found_at_every_alignment_padded_or_not() {
        let n = needles();
        for prefix in ["", "a", "ab", "abc", "abcd"] {
            for suffix in ["", "z", "yz"] {
                let text = format!("{prefix}{SECRET}{suffix}");
                for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                    let encoded = engine.encode(text.as_bytes());
                    assert!(n.found_in(&encoded), "{prefix:?} {suffix:?}: {encoded}");
                }
            }
        }
        // The shortest secret, at each alignment.
        let short = Needles::of([&json!("k3y!")]);
        for prefix in ["", "x", "xy"] {
            let encoded = STANDARD.encode(format!("{prefix}k3y!tail"));
            assert!(short.found_in(&encoded), "{prefix:?}: {encoded}");
        }
        assert!(!short.found_in(&STANDARD.encode("k3y")));
    }

    #[test]
    fn percent_encoding_of_any_kind_is_found() {
        let n = needles();
        // Every byte escaped, in either case.
        let all: String = SECRET.bytes().map(|b| format!("%{b:02X}")).collect();
        assert!(n.found_in(&all));
        assert!(n.found_in(&all.to_ascii_lowercase()));
        // Path style: only what must be escaped.
        assert!(n.found_in("https://db/?password=p%40ss%2Fw0rd%2B%3F%26%3D%3C%C3%A9%3E"));
        // Form style: a space as +.
        let spaced = Needles::of([&json!("two words here")]);
        assert!(spaced.found_in("q=two+words+here"));
        assert!(spaced.found_in("q=two%20words%20here"));
        // A literal + stays a + when the text is not a form.
        let plus = Needles::of([&json!("a+b+c+d")]);
        assert!(plus.found_in("x=a%2Bb%2Bc%2Bd"));
        assert!(plus.found_in("a+b+c+d"));
        // A stray % is kept as it is.
        assert!(!n.found_in("100% sure %zz %"));
    }

    #[test]
    fn short_values_and_booleans_are_not_looked_for() {
        let n = Needles::of([&json!({"a": "abc", "b": true, "c": 443, "d": null, "e": ""})]);
        assert!(n.is_empty());
        assert!(!n.found_in("abc true 443"));
        let n = Needles::of([&json!({"port": 5432})]);
        assert!(n.found_in_value(&json!({"url": "db:5432"})));
        assert!(n.found_in_value(&json!([1, 5432])));
    }

    #[test]
    fn keys_inside_values_are_looked_at() {
        let n = needles();
        assert!(n.found_in_value(&json!({"a": {SECRET: 1}})));
        assert!(!n.found_in_value(&json!({"a": {"b": true, "c": null}})));
    }

    #[test]
    fn leaking_outputs_move_to_the_secret_outputs_whole() {
        let n = needles();
        let mut outputs = json!({
            "host": "db.internal",
            "dsn": format!("postgres://app:{SECRET}@db"),
            "conn": {"host": "db.internal", "auth": [STANDARD.encode(SECRET)]},
            "pin": 271828,
            "enabled": true,
        });
        let mut secrets = json!({"token": "t0k3n-secret"});
        let leaks = separate(&n, &mut outputs, &mut secrets);
        assert_eq!(
            leaks,
            [
                Leak::Moved("conn".into()),
                Leak::Moved("dsn".into()),
                Leak::Moved("pin".into())
            ]
        );
        assert_eq!(outputs, json!({"host": "db.internal", "enabled": true}));
        assert_eq!(secrets["conn"]["auth"][0], STANDARD.encode(SECRET));
        assert_eq!(secrets["pin"], 271828);
        assert_eq!(secrets["token"], "t0k3n-secret");
    }

    #[test]
    fn a_name_taken_by_a_secret_output_or_holding_a_secret_drops_the_output() {
        let n = needles();
        let mut outputs = json!({"password": SECRET, SECRET: "x", "ok": "fine"});
        let mut secrets = json!({"password": "the driver's own"});
        let leaks = separate(&n, &mut outputs, &mut secrets);
        assert!(
            leaks.contains(&Leak::Shadowed("password".into())),
            "{leaks:?}"
        );
        assert!(leaks.contains(&Leak::Unnameable), "{leaks:?}");
        assert_eq!(outputs, json!({"ok": "fine"}));
        assert_eq!(secrets, json!({"password": "the driver's own"}));
        for leak in &leaks {
            let message = leak.message("db-def", "shop/postgres.default#db");
            assert!(!message.contains(SECRET), "{message}");
            assert!(message.contains("db-def"), "{message}");
        }
        // Null secret outputs become an object to hold what moved.
        let mut outputs = json!({"dsn": SECRET});
        let mut secrets = Value::Null;
        separate(&n, &mut outputs, &mut secrets);
        assert_eq!(secrets, json!({"dsn": SECRET}));
    }

    #[test]
    fn values_the_public_inputs_show_are_not_looked_for() {
        let n = Needles::of_call(
            [&json!({"user": "shop_dev", "password": "hunter2-pw"})],
            [&json!({"name": "shop_development", "port": 5432})],
        );
        assert!(!n.found_in("shop_development"));
        assert!(n.found_in("hunter2-pw"));
    }

    #[test]
    fn without_secrets_nothing_moves() {
        let n = Needles::of([&json!({}), &Value::Null]);
        let mut outputs = json!({"a": "anything at all"});
        let mut secrets = json!({});
        assert!(separate(&n, &mut outputs, &mut secrets).is_empty());
        assert_eq!(outputs, json!({"a": "anything at all"}));
    }
}
