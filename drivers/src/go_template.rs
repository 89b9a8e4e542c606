//! `humanitec/template`: Humanitec's template driver, rendering Go templates (with the Sprig
//! functions) into a resource's outputs, secret outputs, manifests and cookie.
//!
//! As Humanitec documents it: the templates are `driver_inputs.values.templates.{init,
//! manifests, outputs, secrets, cookie}` and `driver_inputs.secrets.templates.outputs`; each
//! renders YAML, in that order, and sees what the ones before it rendered. gitplane's own
//! minijinja form is the `template` driver (`template.rs`).

use serde_json::{Map, Value, json};

use super::template::{
    check_template_inputs, cookie_of, kind, parse_rendered, previous_cookie, split_templates,
    template_outputs,
};
use super::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, Manifest, PutOutcome, ReadOutcome,
};
use gitplane_gotemplate::GoTemplate;

/// The templates `values.templates` may hold, in the order they are rendered.
const VALUE_TEMPLATES: [&str; 5] = ["init", "manifests", "outputs", "secrets", "cookie"];
/// The templates `secrets.templates` may hold.
const SECRET_TEMPLATES: [&str; 1] = ["outputs"];

/// A workload's `.resource` as Humanitec's templates read it: HPO hands a workload definition
/// its deployment set's module, whose `spec` holds the containers and the service, so templates
/// `range` over `.resource.spec.containers`. gitplane's workload input is the Score file, which
/// holds the same sections at its top: they are offered under `spec` too (unless the Score file
/// has a `spec` of its own).
fn workload_with_spec<'r>(res_type: &str, resource: &'r Value) -> std::borrow::Cow<'r, Value> {
    match resource {
        Value::Object(score) if res_type == "workload" && !score.contains_key("spec") => {
            let mut spec = Map::new();
            for section in ["containers", "service"] {
                if let Some(v) = score.get(section) {
                    spec.insert(section.to_owned(), v.clone());
                }
            }
            let mut with_spec = score.clone();
            with_spec.insert("spec".to_owned(), Value::Object(spec));
            std::borrow::Cow::Owned(Value::Object(with_spec))
        }
        _ => std::borrow::Cow::Borrowed(resource),
    }
}

/// Renders Humanitec's `templates` with Go's text/template and the Sprig functions.
#[derive(Debug, Clone, Copy, Default)]
pub struct GoTemplateDriver;

impl Driver for GoTemplateDriver {
    fn check_inputs(&self, values: &Value, secrets: &Value) -> Vec<super::InputProblem> {
        check_template_inputs(values, secrets, &VALUE_TEMPLATES, &SECRET_TEMPLATES)
    }

    /// `values.templates.outputs`, `values.templates.secrets` and `secrets.templates.outputs`.
    fn known_outputs(
        &self,
        values: &Value,
        secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        template_outputs(
            values,
            secrets,
            &[("values", "secrets"), ("secrets", "outputs")],
        )
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
        let cookie = previous_cookie(request.cookie);
        let resource = workload_with_spec(request.res_type, request.resource);
        let mut data = json!({
            "id": request.guresid,
            "driver": { "values": values, "secrets": secrets },
            "resource": resource,
            "cookie": cookie,
            "context": {
                "app": { "id": request.app },
                "env": { "id": request.env },
                "org": { "id": request.org },
                "res": {
                    "id": request.res_id,
                    "type": request.res_type,
                    "class": request.class,
                    "guresid": request.guresid,
                },
            },
            "init": {},
        });
        let source = |templates: &Map<String, Value>, key: &str| {
            templates
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };

        if let Some(text) = source(&value_templates, "init") {
            data["init"] = render_mapping("values.templates.init", &text, &data)?;
        }
        let manifests = match source(&value_templates, "manifests") {
            None => Vec::new(),
            Some(text) => {
                let name = "values.templates.manifests";
                let rendered = render(name, &text, &data)?;
                Manifest::list_from(rendered, name).map_err(DriverError::final_error)?
            }
        };
        let outputs = match source(&value_templates, "outputs") {
            Some(text) => render_mapping("values.templates.outputs", &text, &data)?,
            None => Value::Object(Map::new()),
        };
        data["outputs"] = outputs.clone();
        let mut secret_outputs = Map::new();
        for (key, templates) in [
            ("secrets", &value_templates),
            ("outputs", &secret_templates),
        ] {
            let section = if key == "secrets" {
                "values"
            } else {
                "secrets"
            };
            if let Some(text) = source(templates, key) {
                let name = format!("{section}.templates.{key}");
                if let Value::Object(map) = render_mapping(&name, &text, &data)? {
                    secret_outputs.extend(map);
                }
            }
        }
        let cookie = match source(&value_templates, "cookie") {
            None => Cookie::Unchanged,
            Some(text) => {
                let name = "values.templates.cookie";
                cookie_of(name, &render(name, &text, &data)?)?
            }
        };
        Ok(PutOutcome::Done {
            outputs,
            secret_outputs: Value::Object(secret_outputs),
            cookie,
            manifests,
        })
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// Renders template `name` over `data` and parses the text as YAML.
fn render(name: &str, source: &str, data: &Value) -> Result<Value, DriverError> {
    let template = GoTemplate::parse(name, source)
        .map_err(|e| DriverError::final_error(with_hint(e.to_string(), source)))?;
    let text = template
        .render(data)
        .map_err(|e| DriverError::final_error(with_hint(e.to_string(), source)))?;
    parse_rendered(name, &text)
}

/// Renders template `name` into a YAML mapping (a text of only comments is `{}`).
fn render_mapping(name: &str, source: &str, data: &Value) -> Result<Value, DriverError> {
    match render(name, source, data)? {
        Value::Null => Ok(Value::Object(Map::new())),
        v @ Value::Object(_) => Ok(v),
        other => Err(DriverError::final_error(format!(
            "{name} must render a YAML mapping, got {}",
            kind(&other)
        ))),
    }
}

/// An error in what looks like gitplane's minijinja form (`{{ values.x }}`, `{% if %}`)
/// says which driver renders that.
fn with_hint(message: String, source: &str) -> String {
    let jinja = source.contains("{%")
        || [
            "{{ values.",
            "{{ secrets.",
            "{{ init.",
            "{{ res.",
            "{{values.",
        ]
        .iter()
        .any(|start| source.contains(start));
    if jinja {
        format!(
            "{message} (humanitec/template renders Go templates, `{{{{ .driver.values.x }}}}`; \
             this looks like gitplane's minijinja form: use `driver_type: template` for it)"
        )
    } else {
        message
    }
}

#[cfg(test)]
mod tests {
    use super::super::ErrorKind;
    use super::super::test_request::{Inputs, request};
    use super::*;
    use crate::ManifestLocation;

    fn inputs(values: Value, secrets: Value) -> Inputs {
        Inputs {
            resource: json!({"labels": {"team": "checkout", "tier": "gold"}}),
            values,
            secrets,
            account: None,
        }
    }

    fn put(inputs: &Inputs, cookie: Option<&str>) -> (Value, Value, Cookie, Vec<Manifest>) {
        match GoTemplateDriver.put(&request(inputs, cookie)).unwrap() {
            PutOutcome::Done {
                outputs,
                secret_outputs,
                cookie,
                manifests,
            } => (outputs, secret_outputs, cookie, manifests),
            other => panic!("not done: {other:?}"),
        }
    }

    fn error(inputs: &Inputs) -> String {
        let err = GoTemplateDriver.put(&request(inputs, None)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Final);
        err.message
    }

    /// A definition in the style of Humanitec's in-cluster resource packs: init names things
    /// from the resource id (and keeps the names in the cookie), manifests, outputs, secrets.
    fn redis_like() -> Inputs {
        inputs(
            json!({
                "resId": "modules.web.externals.cache",
                "templates": {
                    "init": "{{- if .cookie }}\nname: {{ .cookie.name }}\n{{- else }}\n\
                             name: redis-{{ index (splitList \".\" .driver.values.resId) 1 | substr 0 20 }}-{{ index (splitList \".\" .driver.values.resId) 3 }}\n\
                             {{- end }}\nport: 6379\n",
                    "manifests": "deployment.yaml:\n  location: namespace\n  data:\n    \
                                  apiVersion: apps/v1\n    kind: Deployment\n    metadata:\n      \
                                  name: {{ .init.name }}\n      labels: {{ .resource.labels | toRawJson }}\n\
                                  sidecar.yaml:\n  location: containers\n  data:\n    name: proxy\n    \
                                  image: envoy:{{ .driver.values.version | default \"v1\" }}\n",
                    "outputs": "host: {{ .init.name }}\nport: {{ .init.port }}\nid: {{ .id | quote }}\n\
                                app: {{ .context.app.id }}\norg: {{ .context.org.id }}\n",
                    "secrets": "password: {{ .driver.secrets.password | quote }}\n",
                    "cookie": "name: {{ .init.name }}\nhost: {{ .outputs.host }}\n",
                }
            }),
            json!({"password": "hunter2"}),
        )
    }

    #[test]
    fn renders_init_manifests_outputs_secrets_and_cookie_in_order() {
        let (outputs, secrets, cookie, manifests) = put(&redis_like(), None);
        assert_eq!(
            outputs,
            json!({"host": "redis-web-cache", "port": 6379,
                   "id": "0123456789abcdef0123456789abcdef01234567", "app": "shop",
                   "org": "gitplane"})
        );
        assert_eq!(secrets, json!({"password": "hunter2"}));
        assert_eq!(
            cookie,
            Cookie::Set(r#"{"host":"redis-web-cache","name":"redis-web-cache"}"#.into())
        );
        assert_eq!(manifests.len(), 2);
        assert_eq!(manifests[0].name, "deployment.yaml");
        assert_eq!(manifests[0].location, ManifestLocation::Namespace);
        assert_eq!(
            manifests[0].data,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "redis-web-cache",
                                "labels": {"team": "checkout", "tier": "gold"}}})
        );
        assert_eq!(manifests[1].location, ManifestLocation::Containers);
        assert_eq!(
            manifests[1].data,
            json!({"name": "proxy", "image": "envoy:v1"})
        );
    }

    /// HPO's workload templates read `.resource.spec.containers`: a workload's Score file is
    /// offered there too, so their `update` loops find the containers.
    #[test]
    fn a_workloads_score_file_is_also_its_spec() {
        let score = json!({"containers": {"main": {"image": "x", "variables": {"A": "1"}}},
                           "service": {"ports": {"www": {"port": 80}}}});
        let inputs = Inputs {
            resource: score,
            values: json!({"templates": {"outputs": "update:\n\
                {{- range $name, $c := .resource.spec.containers }}\n\
                - op: add\n  path: /spec/containers/{{ $name }}/variables/B\n  value: two\n\
                {{- end }}\nport: {{ .resource.spec.service.ports.www.port }}\n"}}),
            secrets: json!({}),
            account: None,
        };
        let mut req = request(&inputs, None);
        req.res_type = "workload";
        let PutOutcome::Done { outputs, .. } = GoTemplateDriver.put(&req).unwrap() else {
            panic!("not done")
        };
        assert_eq!(
            outputs,
            json!({"update": [{"op": "add", "path": "/spec/containers/main/variables/B",
                               "value": "two"}], "port": 80})
        );
        // Other resource types get their inputs as they are: no `spec` to range over.
        let postgres = request(&inputs, None);
        let PutOutcome::Done { outputs, .. } = GoTemplateDriver.put(&postgres).unwrap() else {
            panic!("not done")
        };
        assert_eq!(outputs["update"], Value::Null, "{outputs}");
    }

    /// `data: |`, the object as YAML text, as Humanitec's example library writes manifests:
    /// parsed into the object; anything but one mapping is refused naming the manifest.
    #[test]
    fn manifest_data_written_as_yaml_text_is_the_object() {
        let manifests_of = |data: &str| {
            let template = format!(
                "config.yaml:\n  location: namespace\n  data: |\n{}",
                data.lines()
                    .map(|l| format!("    {l}\n"))
                    .collect::<String>()
            );
            inputs(
                json!({"templates": {"manifests": template, "outputs": "a: 1\n"}}),
                json!({}),
            )
        };
        let (.., manifests) = put(
            &manifests_of(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{{ .id | trunc 8 }}\n\
                 data:\n  app: {{ .context.app.id }}",
            ),
            None,
        );
        assert_eq!(
            manifests[0].data,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-01234567"},
                   "data": {"app": "shop"}})
        );
        for (data, expected) in [
            (
                "- a\n- b",
                "manifests.config.yaml.data is a string that must hold one Kubernetes object \
                 (a YAML mapping), not a sequence",
            ),
            (
                "kind: A\n---\nkind: B",
                "manifests.config.yaml.data: the rendered text is not valid YAML",
            ),
            (
                "kind: [unclosed",
                "manifests.config.yaml.data: the rendered text is not valid YAML",
            ),
        ] {
            let message = error(&manifests_of(data));
            assert!(message.contains(expected), "{data:?}: {message}");
        }
    }

    #[test]
    fn the_cookie_of_the_last_call_is_in_scope() {
        let cookie = r#"{"name":"redis-kept"}"#;
        let (outputs, ..) = put(&redis_like(), Some(cookie));
        assert_eq!(outputs["host"], "redis-kept");
    }

    #[test]
    fn secret_templates_from_both_places_become_secret_outputs() {
        let inputs = inputs(
            json!({"templates": {"secrets": "a: '1'"}}),
            json!({"token": "t0k", "templates": {"outputs": "b: {{ .driver.secrets.token }}"}}),
        );
        let (outputs, secrets, ..) = put(&inputs, None);
        assert_eq!(outputs, json!({}));
        assert_eq!(secrets, json!({"a": "1", "b": "t0k"}));
    }

    #[test]
    fn a_missing_key_prints_as_go_does_and_default_fills_it() {
        let inputs = inputs(
            json!({"templates": {"outputs": "a: {{ .driver.values.nope }}\nb: {{ .driver.values.nope | default \"x\" }}"}}),
            json!({}),
        );
        let (outputs, ..) = put(&inputs, None);
        assert_eq!(outputs, json!({"a": "<no value>", "b": "x"}));
    }

    #[test]
    fn bad_templates_name_the_template_and_never_show_secrets() {
        let parse = inputs(
            json!({"templates": {"outputs": "a: {{ .driver.values.x"}}),
            json!({}),
        );
        assert!(
            error(&parse).starts_with("values.templates.outputs"),
            "{}",
            error(&parse)
        );
        let jinja = inputs(
            json!({"templates": {"outputs": "a: {{ values.x }}"}}),
            json!({}),
        );
        assert!(
            error(&jinja).contains("use `driver_type: template`"),
            "{}",
            error(&jinja)
        );
        let yaml = inputs(
            json!({"templates": {"outputs": "a: [{{ .driver.secrets.pw }}"}}),
            json!({"pw": "hunter2"}),
        );
        let message = error(&yaml);
        assert!(message.contains("not valid YAML"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let not_a_map = inputs(json!({"templates": {"outputs": "- a"}}), json!({}));
        assert_eq!(
            error(&not_a_map),
            "values.templates.outputs must render a YAML mapping, got a sequence"
        );
        let unknown = inputs(json!({"templates": {"output": "a: 1"}}), json!({}));
        assert!(error(&unknown).contains("values.templates.output is not a template"));
    }

    #[test]
    fn manifests_must_have_a_known_location_and_an_object() {
        let location = inputs(
            json!({"templates": {"manifests": "x.yaml:\n  location: pod\n  data: {kind: A}"}}),
            json!({}),
        );
        assert!(
            error(&location).contains("values.templates.manifests.x.yaml.location is not one of"),
            "{}",
            error(&location)
        );
        // Text is parsed (`data: |`), and must hold an object.
        let string = inputs(
            json!({"templates": {"manifests": "x.yaml:\n  location: namespace\n  data: \"just text\""}}),
            json!({}),
        );
        assert!(
            error(&string).contains(
                "values.templates.manifests.x.yaml.data is a string that must hold one \
                 Kubernetes object (a YAML mapping), not a string"
            ),
            "{}",
            error(&string)
        );
    }
}
