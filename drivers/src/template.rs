//! The `template` driver: renders outputs, secret outputs and a cookie from templates.
//!
//! The templates live in the driver inputs (`values.templates.{init,cookie,outputs}` and
//! `secrets.templates.outputs`) and use minijinja syntax. Each rendered text is YAML; the
//! rendered init is in scope of the later templates, and the cookie template's result comes
//! back, parsed, as `cookie` on the next call for the same resource.

use std::collections::BTreeSet;

use minijinja::value::{Serde, Value as TemplateValue};
use minijinja::{AutoEscape, Environment, Error as TemplateError, UndefinedBehavior};
use serde_json::{Map, Value, json};

use super::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, MAX_COOKIE_BYTES, PutOutcome,
    ReadOutcome,
};

/// The templates `values.templates` may hold, in the order they are rendered.
const VALUE_TEMPLATES: [&str; 3] = ["init", "cookie", "outputs"];
/// The templates `secrets.templates` may hold.
const SECRET_TEMPLATES: [&str; 1] = ["outputs"];

/// Renders `values.templates` and `secrets.templates` with minijinja.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateDriver;

impl Driver for TemplateDriver {
    fn check_inputs(&self, values: &Value, secrets: &Value) -> Vec<super::InputProblem> {
        check_template_inputs(values, secrets, &VALUE_TEMPLATES, &SECRET_TEMPLATES)
    }

    fn known_outputs(
        &self,
        values: &Value,
        secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        template_outputs(values, secrets, &[("secrets", "outputs")])
    }

    /// Its outputs are a pure function of the request: reading is computing them again.
    fn read(&self, request: &DriverRequest<'_>) -> Result<ReadOutcome, DriverError> {
        super::read_by_recomputing(self, request)
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let (values, value_templates) =
            split_templates(request.values, "values", &VALUE_TEMPLATES)?;
        let (secrets, secret_templates) =
            split_templates(request.secrets, "secrets", &SECRET_TEMPLATES)?;
        let template = |templates: &Map<String, Value>, key: &str| {
            templates
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };

        let previous_cookie = previous_cookie(request.cookie);
        let mut scope = json!({
            "values": values,
            "secrets": secrets,
            "driver": { "values": values, "secrets": secrets },
            "resource": request.resource,
            "guresid": request.guresid,
            "res": { "id": request.res_id, "type": request.res_type, "class": request.class },
            "app": request.app,
            "env": request.env,
            "cookie": previous_cookie,
        });

        let env = environment();
        let init = match template(&value_templates, "init") {
            Some(source) => render_mapping(&env, "values.templates.init", &source, &scope)?,
            None => Value::Object(Map::new()),
        };
        scope["init"] = init;

        let cookie = match template(&value_templates, "cookie") {
            None => Cookie::Unchanged,
            Some(source) => {
                let name = "values.templates.cookie";
                cookie_of(name, &render_yaml(&env, name, &source, &scope)?)?
            }
        };

        let outputs = match template(&value_templates, "outputs") {
            Some(source) => render_mapping(&env, "values.templates.outputs", &source, &scope)?,
            None => Value::Object(Map::new()),
        };
        let secret_outputs = match template(&secret_templates, "outputs") {
            Some(source) => render_mapping(&env, "secrets.templates.outputs", &source, &scope)?,
            None => Value::Object(Map::new()),
        };
        Ok(PutOutcome::Done {
            outputs,
            secret_outputs,
            cookie,
            manifests: Vec::new(),
        })
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }
}

/// The cookie of the last call as templates see it: parsed back from JSON. A cookie the
/// template drivers did not write (another driver's, before a definition changed) is handed
/// over as the string it is.
pub(super) fn previous_cookie(cookie: Option<&str>) -> Value {
    match cookie {
        None => Value::Null,
        Some(text) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into())),
    }
}

/// What the `cookie` template `name` rendered, as the cookie to keep: compact JSON within the
/// Driver Interface's limit.
pub(super) fn cookie_of(name: &str, value: &Value) -> Result<Cookie, DriverError> {
    let text = serde_json::to_string(value)
        .map_err(|e| DriverError::final_error(format!("{name}: cannot encode the cookie: {e}")))?;
    if text.len() > MAX_COOKIE_BYTES {
        return Err(DriverError::final_error(format!(
            "{name}: the cookie is {} bytes of JSON, more than the {MAX_COOKIE_BYTES} allowed",
            text.len()
        )));
    }
    Ok(Cookie::Set(text))
}

/// Splits driver inputs into the inputs without `templates` and the templates, checking that
/// each template is a string and known.
pub(super) fn split_templates(
    inputs: &Value,
    section: &str,
    known: &[&str],
) -> Result<(Value, Map<String, Value>), DriverError> {
    let mut inputs = match inputs {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let templates = match inputs.remove("templates") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(DriverError::final_error(format!(
                "{section}.templates must be a mapping of templates, got {}",
                kind(&other)
            )));
        }
    };
    for (key, source) in &templates {
        if !known.contains(&key.as_str()) {
            let known = known
                .iter()
                .map(|k| format!("{section}.templates.{k}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(DriverError::final_error(format!(
                "{section}.templates.{key} is not a template the template driver knows \
                 (it knows {known})"
            )));
        }
        if !source.is_string() {
            return Err(DriverError::final_error(format!(
                "{section}.templates.{key} must be a string, got {}",
                kind(source)
            )));
        }
    }
    Ok((Value::Object(inputs), templates))
}

/// The shape checks and output names of a template driver, whose templates are
/// `values.templates.{value_known...}` and `secrets.templates.{secret_known...}`; the outputs
/// are what `values.templates.outputs` and the secret templates render.
pub(super) fn check_template_inputs(
    values: &Value,
    secrets: &Value,
    value_known: &[&str],
    secret_known: &[&str],
) -> Vec<super::InputProblem> {
    let mut problems = Vec::new();
    for (inputs, section, known) in [
        (values, "values", value_known),
        (secrets, "secrets", secret_known),
    ] {
        if let Err(e) = split_templates(inputs, section, known) {
            let path = e
                .message
                .split_once(' ')
                .map_or(section, |(path, _)| path)
                .to_owned();
            let mut reason = e.message;
            if reason.contains("must be a string") {
                reason
                    .push_str(": write the template as text (`outputs: |` and the YAML below it)");
            }
            problems.push(super::InputProblem { path, reason });
        }
    }
    problems
}

/// The keys the output templates render (`values.templates.outputs`, and `secret_keys` of
/// `values.templates` and of `secrets.templates`), when the texts say.
pub(super) fn template_outputs(
    values: &Value,
    secrets: &Value,
    secret_keys: &[(&str, &str)],
) -> Option<std::collections::BTreeSet<String>> {
    let mut known = std::collections::BTreeSet::new();
    let mut sources = vec![(values, "outputs")];
    for (section, key) in secret_keys {
        sources.push((
            if *section == "values" {
                values
            } else {
                secrets
            },
            *key,
        ));
    }
    for (inputs, key) in sources {
        match inputs.get("templates").and_then(|t| t.get(key)) {
            None => {}
            // A template in the wrong shape is reported as such; its keys are not known.
            Some(template) => known.extend(template_keys(template.as_str()?)?),
        }
    }
    Some(known)
}

/// The keys a YAML template renders at its top level, when the text says: every line at
/// column 0 is a `key:` (a plain name), a comment, a blank, or a control action that emits no
/// text of its own (`{{- if ...}}`, `{% for ... %}`, `{{ end }}`). `None` when a line at column
/// 0 could render a key no one can read off the text (`{{ $k }}: v`, `{{ include ... }}`), so
/// the outputs are known only after a call. Keys inside an `if` count: they may be given.
pub(crate) fn template_keys(text: &str) -> Option<BTreeSet<String>> {
    let mut keys = BTreeSet::new();
    // Inside a block scalar (`key: |`), more-indented lines are its text.
    for line in text.lines() {
        if line.is_empty() || line.starts_with([' ', '\t']) {
            continue;
        }
        let trimmed = line.trim_end();
        if trimmed.starts_with('#') || trimmed.starts_with("---") {
            continue;
        }
        if trimmed.starts_with("{{") || trimmed.starts_with("{%") {
            if emits_nothing(trimmed) {
                continue;
            }
            return None;
        }
        let key = trimmed.split_once(':').map(|(k, _)| k.trim())?;
        let key = key.trim_matches(|c| c == '"' || c == '\'');
        let plain = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !plain {
            return None;
        }
        keys.insert(key.to_owned());
    }
    Some(keys)
}

/// Whether a line is only control actions (Go's `{{- if }}`/`{{ end }}`/`{{ range }}`... or
/// minijinja's `{% ... %}`, or a comment), which render no text of their own.
fn emits_nothing(line: &str) -> bool {
    const CONTROL: [&str; 9] = [
        "if ", "else", "end", "range ", "with ", "define ", "block ", "break", "continue",
    ];
    let mut rest = line;
    while !rest.is_empty() {
        let (open, close) = if rest.starts_with("{{") {
            ("{{", "}}")
        } else if rest.starts_with("{%") {
            ("{%", "%}")
        } else if rest.starts_with("{#") {
            ("{#", "#}")
        } else {
            return false;
        };
        let Some(end) = rest.find(close) else {
            return false;
        };
        let inner = rest[open.len()..end].trim_matches(['-', ' ']);
        let control = match open {
            "{%" => !["include", "call", "filter"]
                .iter()
                .any(|emits| inner.starts_with(emits)),
            "{#" => true,
            _ => {
                inner.starts_with("/*")
                    // `$x := ...` sets a variable, printing nothing.
                    || (inner.starts_with('$') && (inner.contains(":=") || inner.contains(" = ")))
                    || CONTROL
                        .iter()
                        .any(|c| inner.starts_with(c) || inner == c.trim_end())
            }
        };
        if !control {
            return false;
        }
        rest = rest[end + close.len()..].trim_start();
    }
    true
}

/// The environment every template renders in: strict undefined values (a typo is an error),
/// no escaping, and block tags that leave no blank lines in the YAML they produce.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("the default delimiters are valid");
    env.set_syntax(syntax);
    env.add_filter("tojson", tojson);
    env
}

/// `value | tojson`: the value as compact JSON, which is also a valid YAML scalar or flow
/// collection (the safe way to put an arbitrary string into YAML).
fn tojson(value: TemplateValue) -> Result<TemplateValue, TemplateError> {
    serde_json::to_string(&value)
        .map(TemplateValue::from_safe_string)
        .map_err(|e| {
            TemplateError::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("cannot serialize to JSON: {e}"),
            )
        })
}

/// Renders template `name` and parses the text as YAML; an empty text is `{}`.
fn render_yaml(
    env: &Environment<'_>,
    name: &str,
    source: &str,
    scope: &Value,
) -> Result<Value, DriverError> {
    let text = env
        .render_named_str(name, source, TemplateValue::from(Serde(scope)))
        .map_err(|e| DriverError::final_error(template_message(name, &e)))?;
    parse_rendered(name, &text)
}

/// Parses the rendered text of template `name` as YAML; an empty text is `{}`.
pub(super) fn parse_rendered(name: &str, text: &str) -> Result<Value, DriverError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options::<Value>(text, options)
        .map_err(|e| DriverError::final_error(yaml_message(name, &e)))
}

/// Renders template `name` into a YAML mapping (a document holding only comments is `{}`).
fn render_mapping(
    env: &Environment<'_>,
    name: &str,
    source: &str,
    scope: &Value,
) -> Result<Value, DriverError> {
    match render_yaml(env, name, source, scope)? {
        Value::Null => Ok(Value::Object(Map::new())),
        v @ Value::Object(_) => Ok(v),
        other => Err(DriverError::final_error(format!(
            "{name} must render a YAML mapping, got {}",
            kind(&other)
        ))),
    }
}

/// A template error: its kind, detail and line, never the values in scope (minijinja's
/// alternate form would print them).
fn template_message(name: &str, e: &TemplateError) -> String {
    let what = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    match e.line() {
        Some(line) if line > 0 => format!("{name}, line {line}: {what}"),
        _ => format!("{name}: {what}"),
    }
}

/// A YAML error in a rendered template: the message and where, without the snippet of the
/// rendered text (it may hold secrets).
pub(crate) fn yaml_message(name: &str, e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or("invalid YAML").trim();
    let mut message = match first.rfind(" at line ") {
        Some(pos) => &first[..pos],
        None => first,
    };
    // Advice meant for the program that parses, not for the person who wrote the template.
    if let Some(pos) = message.find(", set DuplicateKeyPolicy") {
        message = &message[..pos];
    }
    match e.location() {
        Some(at) => format!(
            "{name}: the rendered text is not valid YAML: {message} (rendered line {}, column {})",
            at.line(),
            at.column()
        ),
        None => format!("{name}: the rendered text is not valid YAML: {message}"),
    }
}

/// A JSON value's kind, for messages that must not quote it.
pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::super::ErrorKind;
    use super::super::test_request::{Inputs, request};
    use super::*;

    fn with_values(values: Value) -> Inputs {
        Inputs {
            resource: json!({"size": 3}),
            values,
            secrets: json!({}),
            account: None,
        }
    }

    fn done(outcome: PutOutcome) -> (Value, Value, Cookie) {
        match outcome {
            PutOutcome::Done {
                outputs,
                secret_outputs,
                cookie,
                ..
            } => (outputs, secret_outputs, cookie),
            other => panic!("not done: {other:?}"),
        }
    }

    fn put_err(inputs: &Inputs) -> DriverError {
        let err = TemplateDriver.put(&request(inputs, None)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        err
    }

    #[test]
    fn outputs_from_values_and_the_request() {
        let inputs = with_values(json!({
            "host": "db.example.com",
            "port": 5432,
            "templates": {
                "outputs": "host: {{ values.host }}\nport: {{ values.port }}\n\
                            url: postgres://{{ values.host }}:{{ values.port }}/{{ res.id }}\n\
                            ids: [{{ guresid }}, {{ res.type }}, {{ res.class }}, {{ app }}, {{ env }}]\n\
                            size: {{ resource.size * 2 }}\n\
                            yes: yes\n\
                            first: {{ cookie is none }}\n",
            },
        }));
        let (outputs, secret_outputs, cookie) =
            done(TemplateDriver.put(&request(&inputs, None)).unwrap());
        assert_eq!(
            outputs,
            json!({
                "host": "db.example.com",
                "port": 5432,
                "url": "postgres://db.example.com:5432/modules.web.externals.db",
                "ids": ["0123456789abcdef0123456789abcdef01234567", "postgres", "default", "shop", "dev"],
                "size": 6,
                "yes": "yes",
                "first": true,
            })
        );
        assert_eq!(secret_outputs, json!({}));
        assert_eq!(cookie, Cookie::Unchanged);
    }

    #[test]
    fn no_templates_means_empty_outputs() {
        let inputs = with_values(json!({"a": 1}));
        assert_eq!(
            TemplateDriver.put(&request(&inputs, None)).unwrap(),
            PutOutcome::Done {
                outputs: json!({}),
                secret_outputs: json!({}),
                cookie: Cookie::Unchanged,
                manifests: Vec::new(),
            }
        );
        let blank = with_values(
            json!({"templates": {"outputs": "{% if false %}a: 1{% endif %}\n# only a comment\n"}}),
        );
        let (outputs, _, _) = done(TemplateDriver.put(&request(&blank, None)).unwrap());
        assert_eq!(outputs, json!({}));
    }

    #[test]
    fn init_is_in_scope_of_outputs() {
        let inputs = with_values(json!({
            "name": "orders",
            "templates": {
                "init": "bucket: {{ values.name }}-{{ guresid[:8] }}\nregion: eu-west-1\n",
                "outputs": "bucket: {{ init.bucket }}\narn: arn:aws:s3:::{{ init.bucket }}\n",
            },
        }));
        let (outputs, _, _) = done(TemplateDriver.put(&request(&inputs, None)).unwrap());
        assert_eq!(
            outputs,
            json!({"bucket": "orders-01234567", "arn": "arn:aws:s3:::orders-01234567"})
        );
    }

    #[test]
    fn the_cookie_round_trips() {
        let inputs = with_values(json!({
            "templates": {
                // `tojson` keeps "012345" a string: bare, YAML would read a number.
                "init": "{% if cookie %}\nsuffix: {{ cookie.suffix | tojson }}\n{% else %}\nsuffix: {{ guresid[:6] | tojson }}\n{% endif %}\n",
                "cookie": "suffix: {{ init.suffix | tojson }}\ncalls: {{ (cookie.calls if cookie else 0) + 1 }}\n",
                "outputs": "name: db-{{ init.suffix }}\nseen: {{ cookie.calls if cookie else 0 }}\n",
            },
        }));
        let (outputs, _, cookie) = done(TemplateDriver.put(&request(&inputs, None)).unwrap());
        assert_eq!(outputs, json!({"name": "db-012345", "seen": 0}));
        assert_eq!(
            cookie,
            Cookie::Set(r#"{"calls":1,"suffix":"012345"}"#.into())
        );

        // The next call gets the cookie back, and it wins over what init would compute.
        let previous = r#"{"calls":1,"suffix":"kept"}"#;
        let (outputs, _, cookie) = done(
            TemplateDriver
                .put(&request(&inputs, Some(previous)))
                .unwrap(),
        );
        assert_eq!(outputs, json!({"name": "db-kept", "seen": 1}));
        assert_eq!(cookie, Cookie::Set(r#"{"calls":2,"suffix":"kept"}"#.into()));
    }

    #[test]
    fn a_cookie_that_is_not_json_is_a_string() {
        let inputs = with_values(json!({"templates": {"outputs": "old: {{ cookie }}"}}));
        let (outputs, _, _) = done(
            TemplateDriver
                .put(&request(&inputs, Some("plain text")))
                .unwrap(),
        );
        assert_eq!(outputs, json!({"old": "plain text"}));
    }

    #[test]
    fn secret_outputs_from_secrets() {
        let inputs = Inputs {
            resource: json!({}),
            values: json!({"user": "app", "templates": {"outputs": "user: {{ values.user }}"}}),
            secrets: json!({
                "password": "s3cr3t: with # yaml",
                "templates": {
                    "outputs": "password: {{ secrets.password | tojson }}\n\
                                dsn: {{ ('postgres://' ~ values.user ~ ':' ~ secrets.password ~ '@db') | tojson }}\n",
                },
            }),
            account: None,
        };
        let (outputs, secret_outputs, _) =
            done(TemplateDriver.put(&request(&inputs, None)).unwrap());
        assert_eq!(outputs, json!({"user": "app"}));
        assert_eq!(
            secret_outputs,
            json!({
                "password": "s3cr3t: with # yaml",
                "dsn": "postgres://app:s3cr3t: with # yaml@db",
            })
        );
    }

    #[test]
    fn the_templates_key_is_not_in_scope() {
        let inputs = with_values(json!({"templates": {"outputs": "t: {{ values.templates }}"}}));
        let err = put_err(&inputs);
        assert_eq!(
            err.message,
            "values.templates.outputs, line 1: undefined value: `values.templates` is undefined"
        );
    }

    #[test]
    fn an_undefined_variable_is_an_error() {
        let inputs = with_values(json!({
            "host": "h",
            "templates": {"outputs": "host: {{ values.host }}\nport: {{ values.prot }}\n"},
        }));
        assert_eq!(
            put_err(&inputs).message,
            "values.templates.outputs, line 2: undefined value: `values.prot` is undefined"
        );
        // Optional inputs are tested, not guessed.
        let inputs = with_values(json!({
            "templates": {"outputs": "a: {{ values.port | default(5432) }}\n{% if values.tls is defined %}tls: true\n{% endif %}"},
        }));
        let (outputs, _, _) = done(TemplateDriver.put(&request(&inputs, None)).unwrap());
        assert_eq!(outputs, json!({"a": 5432}));
        // `cookie` is none on the first call: reading into it is an error, testing it is not.
        let inputs = with_values(json!({"templates": {"init": "x: {{ cookie.x }}"}}));
        assert_eq!(
            put_err(&inputs).message,
            "values.templates.init, line 1: undefined value: `cookie.x` is undefined"
        );
        // `init` is not in scope of the init template itself.
        let inputs = with_values(json!({"templates": {"init": "x: {{ init }}"}}));
        assert!(put_err(&inputs).message.contains("`init` is undefined"));
    }

    #[test]
    fn syntax_errors_name_the_template_and_line() {
        let inputs = with_values(json!({"templates": {"cookie": "a: 1\nb: {% if x %}"}}));
        assert_eq!(
            put_err(&inputs).message,
            "values.templates.cookie, line 2: syntax error: unexpected end of input, expected end of block"
        );
    }

    #[test]
    fn outputs_must_be_a_yaml_mapping() {
        let list = with_values(json!({"templates": {"outputs": "- a\n- b\n"}}));
        assert_eq!(
            put_err(&list).message,
            "values.templates.outputs must render a YAML mapping, got a sequence"
        );
        let scalar = with_values(json!({"templates": {"init": "just text"}}));
        assert_eq!(
            put_err(&scalar).message,
            "values.templates.init must render a YAML mapping, got a string"
        );
        let broken = with_values(json!({"templates": {"outputs": "a: 1\nb: [1,\n"}}));
        let message = put_err(&broken).message;
        assert!(
            message.starts_with("values.templates.outputs: the rendered text is not valid YAML: "),
            "{message}"
        );
        assert!(message.contains("rendered line 2"), "{message}");
        // Any YAML value makes a cookie.
        let cookie = with_values(json!({"templates": {"cookie": "- 1\n- two\n"}}));
        let (_, _, cookie) = done(TemplateDriver.put(&request(&cookie, None)).unwrap());
        assert_eq!(cookie, Cookie::Set(r#"[1,"two"]"#.into()));
    }

    #[test]
    fn an_oversized_cookie_is_final() {
        let inputs = with_values(json!({
            "blob": "x".repeat(MAX_COOKIE_BYTES),
            "templates": {"cookie": "blob: {{ values.blob }}"},
        }));
        let message = put_err(&inputs).message;
        assert!(
            message.starts_with("values.templates.cookie: the cookie is"),
            "{message}"
        );
        assert!(message.contains("10240"), "{message}");
        assert!(!message.contains("xxxx"), "{message}");
    }

    #[test]
    fn bad_template_inputs_are_final() {
        let cases = [
            (
                json!({"templates": {"manifests": "x"}}),
                "values.templates.manifests is not a template the template driver knows \
                 (it knows values.templates.init, values.templates.cookie, values.templates.outputs)",
            ),
            (
                json!({"templates": {"outputs": {"a": 1}}}),
                "values.templates.outputs must be a string, got a mapping",
            ),
            (
                json!({"templates": "a: 1"}),
                "values.templates must be a mapping of templates, got a string",
            ),
        ];
        for (values, message) in cases {
            assert_eq!(put_err(&with_values(values)).message, message);
        }
        let inputs = Inputs {
            resource: json!({}),
            values: json!({}),
            secrets: json!({"templates": {"init": "a: 1"}}),
            account: None,
        };
        assert!(
            put_err(&inputs)
                .message
                .starts_with("secrets.templates.init is not a template")
        );
    }

    #[test]
    fn errors_do_not_show_secrets() {
        let secret = "hunter2-very-secret";
        let templates = [
            // Rendered secret text that is not YAML, and that is not a mapping.
            "password: {{ secrets.password }}\n  bad: [",
            "- {{ secrets.password }}",
            "password: {{ secrets.password }}\nother: {{ secrets.nope }}",
            "a: {{ secrets.password + 1 }}",
        ];
        for template in templates {
            let inputs = Inputs {
                resource: json!({}),
                values: json!({}),
                secrets: json!({"password": secret, "templates": {"outputs": template}}),
                account: None,
            };
            let message = put_err(&inputs).message;
            assert!(
                message.starts_with("secrets.templates.outputs"),
                "{message}"
            );
            assert!(!message.contains(secret), "{message}");
        }
    }

    #[test]
    fn delete_is_done() {
        let inputs = with_values(json!({"templates": {"outputs": "{{ broken"}}));
        assert_eq!(
            TemplateDriver
                .delete(&request(&inputs, Some("{}")))
                .unwrap(),
            DeleteOutcome::Done
        );
    }
}
