//! The engine as the template driver uses it: templates in the style of real Humanitec
//! definitions, Go's template features through gitplane's preparation of the tree, line
//! numbers in messages, the limits, and secrets kept out of every message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;

fn render(source: &str, data: serde_json::Value) -> String {
    let template = GoTemplate::parse("t", source).unwrap_or_else(|e| panic!("{e}"));
    template.render(&data).unwrap_or_else(|e| panic!("{e}"))
}

fn render_error(source: &str, data: serde_json::Value) -> GoTemplateError {
    let template = GoTemplate::parse("t", source).unwrap_or_else(|e| panic!("{e}"));
    match template.render(&data) {
        Ok(out) => panic!("rendered {out:?} instead of failing"),
        Err(e) => e,
    }
}

fn parse_error(source: &str) -> GoTemplateError {
    match GoTemplate::parse("values.templates.outputs", source) {
        Ok(_) => panic!("parsed {source:?}"),
        Err(e) => e,
    }
}

/// A database definition's init in the style of the in-cluster resource packs: a name from the
/// resource ID, credentials chosen once and kept in the cookie.
const DATABASE_INIT: &str = r#"
{{- if .cookie }}
name: {{ .cookie.name }}
user: {{ .cookie.user }}
password: {{ .cookie.password | toRawJson }}
{{- else }}
user: {{ randAlpha 8 | lower | quote }}
password: {{ randAlphaNum 16 | toRawJson }}
{{- if regexMatch "modules\\.[a-z0-9-]+\\.externals" .driver.values.resId }}
name: db-{{ index (splitList "." .driver.values.resId) 1 | substr 0 20 }}-{{ index (splitList "." .driver.values.resId) 3 | substr 0 20 }}
{{- else }}
name: db-{{ .driver.values.resId | replace "." "-" | trunc 40 }}
{{- end }}
{{- end }}
port: {{ .driver.values.port | default 5432 }}
"#;

#[test]
fn a_database_init_chooses_once_then_reads_the_cookie() {
    let first = render(
        DATABASE_INIT,
        json!({"driver": {"values": {"resId": "modules.backend-service.externals.orders"}}, "cookie": null}),
    );
    let lines: Vec<&str> = first.trim().lines().collect();
    assert!(
        lines[0].starts_with("user: \"") && lines[0].len() == "user: \"\"".len() + 8,
        "{first}"
    );
    assert!(lines[1].starts_with("password: \"") && lines[1].len() == "password: \"\"".len() + 16);
    assert_eq!(lines[2], "name: db-backend-service-orders");
    assert_eq!(lines[3], "port: 5432");

    let later = render(
        DATABASE_INIT,
        json!({
            "driver": {"values": {"resId": "shared.db", "port": 6543}},
            "cookie": {"name": "db-kept", "user": "abcdefgh", "password": "p\"w"},
        }),
    );
    assert_eq!(
        later,
        "\nname: db-kept\nuser: abcdefgh\npassword: \"p\\\"w\"\nport: 6543\n"
    );
}

#[test]
fn an_endpoint_joins_its_url_from_merged_dicts() {
    let template = r#"url: {{ .outputs.values | merge (dict "userinfo" (.init.userinfo | default "") "host" .init.hostport) | urlJoin | toRawJson }}"#;
    let data = json!({
        "outputs": {"values": {"scheme": "https", "host": "example.com", "port": 8080, "path": "/api", "query": "", "fragment": ""}},
        "init": {"userinfo": "svc:p@ss", "hostport": "example.com:8080"},
    });
    assert_eq!(
        render(template, data),
        r#"url: "https://svc:p%40ss@example.com:8080/api""#
    );
}

#[test]
fn manifests_from_dig_range_and_to_yaml() {
    let template = r#"
{{- if gt (.resource.spec | dig "service" "ports" (list) | len) 0 }}
endpoints:
{{- range $name, $port := .resource.spec.service.ports }}
- port: {{ $name }}
  targetPort: {{ $port.port }}
{{- end }}
{{- end }}
metadata:
  labels:
  {{- range $k, $v := .resource.labels }}
    {{ $k }}: {{ $v | quote }}
  {{- end }}
  annotations: {{ .driver.values.annotations | toYaml | nindent 4 }}
values: {{ .driver.values | toRawJson }}
ingress: {{ dig "rules" "http" (list) .resource | toRawJson }}"#;
    let data = json!({
        "resource": {
            "spec": {"service": {"ports": {"web": {"port": 80}, "admin": {"port": 9000}}}},
            "labels": {"team": "orders", "tier": "1"},
        },
        "driver": {"values": {"annotations": {"a/b": "x: y", "c": "d"}, "port": 80}},
    });
    let expected = r#"
endpoints:
- port: admin
  targetPort: 9000
- port: web
  targetPort: 80
metadata:
  labels:
    team: "orders"
    tier: "1"
  annotations: 
    a/b: 'x: y'
    c: d
values: {"annotations":{"a/b":"x: y","c":"d"},"port":80}
ingress: []"#;
    // toYaml quotes "x: y" with double quotes where Helm's go-yaml would use single ones.
    assert_eq!(
        render(template, data),
        expected.replace("'x: y'", "\"x: y\"")
    );
}

#[test]
fn a_config_pattern_picks_overrides_by_key() {
    let template = r#"
{{- $overrides := .driver.values.overrides }}
{{- range $key, $val := .driver.values.defaults }}
{{- if (list "region" "tags") | has $key }}
{{ $key }}: {{ $overrides | dig $key $val | toRawJson }}
{{- end }}
{{- end }}"#;
    let data = json!({"driver": {"values": {
        "defaults": {"region": "eu-west-1", "tags": {"a": "1"}, "other": "x"},
        "overrides": {"tags": {"b": "2"}},
    }}});
    assert_eq!(
        render(template, data),
        "\nregion: \"eu-west-1\"\ntags: {\"b\":\"2\"}"
    );
}

#[test]
fn missing_keys_print_no_value_as_in_go() {
    let data = json!({"driver": {"values": {"a": null}}});
    assert_eq!(
        render(
            "{{ .driver.values.missing }}|{{ .driver.values.a }}|{{ .nothing.deeper }}",
            data.clone()
        ),
        "<no value>|<no value>|<no value>"
    );
    assert_eq!(
        render(
            r#"{{ .driver.values.missing | default "x" }} {{ if .driver.values.missing }}y{{ else }}n{{ end }}"#,
            data
        ),
        "x n"
    );
}

#[test]
fn go_template_features_survive_the_preparation() {
    let data = json!({"items": [1, 2, 3, 4], "m": {"b": 2, "a": 1}, "name": "x"});
    let cases = [
        (
            r#"{{ define "greet" }}hi {{ . }}{{ end }}{{ template "greet" .name }}"#,
            "hi x",
        ),
        (
            r#"{{ block "b" . }}default {{ .name }}{{ end }}"#,
            "default x",
        ),
        (
            "{{ range .items }}{{ if eq . 3 }}{{ break }}{{ end }}{{ . }}{{ end }}",
            "12",
        ),
        (
            "{{ range .items }}{{ if eq . 2 }}{{ continue }}{{ end }}{{ . }}{{ end }}",
            "134",
        ),
        ("{{ range .nothing }}x{{ else }}empty{{ end }}", "empty"),
        (
            "{{ range $k, $v := .m }}{{ $k }}={{ $v }};{{ end }}",
            "a=1;b=2;",
        ),
        ("{{ range 3 }}{{ . }}{{ end }}", "012"),
        (
            "{{ with .name }}{{ . }}{{ else }}none{{ end }}{{ with .nothing }}x{{ else }}none{{ end }}",
            "xnone",
        ),
        ("a  {{- .name -}}  b", "axb"),
        (
            "{{ $x := 1 }}{{ range .items }}{{ $x = . }}{{ end }}{{ $x }}",
            "4",
        ),
        ("{{ range .items }}{{ $.name }}{{ end }}", "xxxx"),
        ("{{/* a comment */}}{{ len .items }}", "4"),
        (r#"{{ printf "%03d" 7 }}"#, "007"),
    ];
    for (source, expected) in cases {
        assert_eq!(render(source, data.clone()), expected, "{source}");
    }
    assert_eq!(render("", json!({})), "");
    assert_eq!(render("{{/* only a comment */}}", json!({})), "");
    assert_eq!(render("\n  {{/* a comment */}}\n", json!({})), "\n  \n");
    // Go's fmt prints floats, in lists too, in the shortest form; from 1e6 with an exponent.
    assert_eq!(
        render(
            "{{ .f }} {{ 1e6 }} {{ divf 10 4 }} {{ list 1.5 1e21 }}",
            json!({"f": 0.5})
        ),
        "0.5 1e+06 2.5 [1.5 1e+21]"
    );
}

#[test]
fn parse_errors_carry_the_line() {
    let e = parse_error("a: 1\nb: {{ if }}\n");
    assert_eq!(e.name, "values.templates.outputs");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(
        e.to_string()
            .starts_with("values.templates.outputs, line 2: "),
        "{e}"
    );

    // An action left open is reported where the text ends.
    let e = parse_error("a: 1\nb: {{ .x\n");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("unclosed action"), "{e}");

    let e = parse_error("a: 1\n\nb: {{ .x | frobnicate }}");
    assert_eq!(e.line, Some(3));
    assert!(
        e.message.contains("function \"frobnicate\" not defined"),
        "{e}"
    );
}

#[test]
fn functions_gitplane_leaves_out_are_named_with_why() {
    let e = parse_error("a: {{ env \"HOME\" }}");
    assert_eq!(e.line, Some(1));
    assert!(
        e.message
            .starts_with("`env` is not supported by gitplane: "),
        "{e}"
    );
    assert!(
        e.message.contains("environment of the gitplane daemon"),
        "{e}"
    );
    let e = parse_error("x\ny\nz: {{ now | date \"2006\" }}");
    assert_eq!(e.line, Some(3));
    assert!(
        e.message
            .starts_with("`now` is not supported by gitplane: "),
        "{e}"
    );
    assert!(
        parse_error("{{ expandenv \"$HOME\" }}")
            .message
            .contains("expandenv")
    );
    assert!(
        parse_error("{{ genCA \"x\" 3 }}")
            .message
            .contains("certificates")
    );
    assert!(
        parse_error("{{ include \"x\" . }}")
            .message
            .contains("Helm")
    );
}

#[test]
fn runtime_errors_name_the_line_of_a_function_called_once() {
    let e = render_error("a: 1\nb: {{ upper 5 }}\n", json!({}));
    assert_eq!(e.line, Some(2));
    assert_eq!(
        e.to_string(),
        "t, line 2: upper: the 1st argument must be a string, not an integer"
    );
    // Called on two lines: which one failed is not known.
    let e = render_error("{{ upper \"a\" }}\n{{ upper 5 }}", json!({}));
    assert_eq!(e.line, None);
    assert_eq!(
        e.to_string(),
        "t: upper: the 1st argument must be a string, not an integer"
    );
}

#[test]
fn output_over_the_limit_fails_quickly() {
    let start = Instant::now();
    let e = render_error(
        r#"{{ $line := repeat 1000 "x" }}{{ range until 100000 }}{{ $line }}{{ end }}"#,
        json!({}),
    );
    assert_eq!(e.message, "the rendered text would be longer than 16 MiB");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn huge_ranges_are_refused() {
    let e = render_error("{{ range until 100000000 }}x{{ end }}", json!({}));
    assert!(
        e.message
            .contains("until: the list would have more than 1000000 items"),
        "{e}"
    );
    // Loops within the item limit still have a limit together.
    let e = render_error(
        "{{ range until 2000 }}{{ range until 1000 }}{{ end }}{{ end }}",
        json!({}),
    );
    assert!(
        e.message.contains("loops ran more than 1000000 times"),
        "{e}"
    );
    let e = render_error("{{ range 100000000 }}{{ end }}", json!({}));
    assert!(
        e.message.contains("loops ran more than 1000000 times"),
        "{e}"
    );
}

#[test]
fn work_without_output_is_bounded() {
    // A template calling itself three times per level of its data: 3^16 calls, calling no
    // function and printing nothing.
    let start = Instant::now();
    let mut nested = json!({});
    for _ in 0..16 {
        nested = json!({ "a": nested });
    }
    let e = render_error(
        r#"{{ define "x" }}{{ with .a }}{{ template "x" . }}{{ template "x" . }}{{ template "x" . }}{{ end }}{{ end }}{{ template "x" . }}"#,
        nested,
    );
    assert_eq!(
        e.message,
        "the template does too much work (more than 30000000 steps): look for a loop that runs \
         far more often than intended"
    );
    // Comparing values built by doubling (2^40 leaves each), through sharing or not.
    let e = render_error(
        "{{ $l := list }}{{ range until 40 }}{{ $l = list $l $l }}{{ end }}{{ $m := list }}{{ range until 40 }}{{ $m = list $m $m }}{{ end }}{{ deepEqual $l $m }}",
        json!({}),
    );
    assert!(
        e.message
            .contains("deepEqual: the template does too much work"),
        "{e}"
    );
    // A template recursing without end stops at the depth limit.
    let e = render_error(
        r#"{{ define "x" }}{{ template "x" . }}{{ end }}{{ template "x" . }}"#,
        json!({}),
    );
    assert!(e.message.contains("nest too deeply"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn values_may_not_nest_without_limit() {
    let e = render_error(
        "{{ $l := list }}{{ range until 500 }}{{ $l = list $l }}{{ end }}",
        json!({}),
    );
    assert!(
        e.message
            .contains("list: the value would nest lists and dicts more than 128 levels"),
        "{e}"
    );
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    let e = render_error("{{ . }}", json!({ "x": deep }));
    assert!(e.message.contains("more than 128 levels deep"), "{e}");
}

/// Every message of a render that fails on secret data, with the secret nowhere in it.
#[test]
fn secrets_never_appear_in_messages() {
    let password = "hunter2-s3cr3t";
    let data = json!({"secrets": {
        "password": password,
        "pin": 987_654,
        "url": format!("postgres://app:{password}@db:bad/orders"),
        "list": [password],
        "nested": {"a": password},
    }, "items": [1]});
    let failing = [
        "{{ lower .secrets.pin }}",
        "{{ len .secrets.pin }}",
        "{{ range $i, $c := .secrets.pin }}{{ end }}",
        "{{ index .items .secrets.pin }}",
        "{{ index .secrets.password 99 }}",
        r#"{{ required (printf "missing %s" .secrets.password) .nothing }}"#,
        r#"{{ fail (printf "bad %s" .secrets.password) }}"#,
        "{{ fail .secrets.password }}",
        "{{ mustFromJson .secrets.password }}",
        "{{ urlParse .secrets.url }}",
        r#"{{ mustRegexMatch (print .secrets.password "[") "x" }}"#,
        "{{ regexFind (print .secrets.password \"(\") \"x\" }}",
        "{{ printf .secrets.list }}",
        "{{ slice .secrets.list 3 9 }}",
        "{{ substr 30 2 .secrets.password }}",
        "{{ eq .secrets.password 1 }}",
        "{{ .secrets.password.x }}",
        r#"{{ dig "a" "b" "c" .secrets.nested }}"#,
        r#"{{ ternary 1 2 .secrets.password }}"#,
        "{{ div .secrets.pin 0 }}",
        r#"{{ urlJoin (dict "userinfo" (print .secrets.password " x")) }}"#,
        "{{ toRawJson (float64 .secrets.password) }}{{ float64 \"NaN\" | toRawJson }}",
        "{{ template \"missing\" .secrets }}",
        "{{ range .secrets.password }}{{ end }}",
        "{{ repeat (mul .secrets.pin 10) .secrets.password }}",
    ];
    for source in failing {
        let template = GoTemplate::parse("t", source).unwrap_or_else(|e| panic!("{e}"));
        let Err(e) = template.render(&data) else {
            panic!("{source} rendered instead of failing");
        };
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(password), "{source}: {shown}");
        assert!(!shown.contains("987654"), "{source}: {shown}");
    }
    // A message the template wrote as a literal is the author's, and shown.
    let e = render_error(
        r#"{{ if .secrets.password }}{{ fail "no passwords here" }}{{ end }}"#,
        data,
    );
    assert_eq!(e.message, "fail: no passwords here");
}

#[test]
fn renders_on_several_threads_have_budgets_of_their_own() {
    // About two thirds of the budget each: a shared budget would run out.
    let template = Arc::new(
        GoTemplate::parse(
            "t",
            "{{ range $i := until 600000 }}{{ $x := add $i 1 }}{{ end }}{{ .n }}",
        )
        .unwrap_or_else(|e| panic!("{e}")),
    );
    let threads: Vec<_> = (0..3)
        .map(|n| {
            let template = template.clone();
            std::thread::spawn(move || template.render(&json!({ "n": n })))
        })
        .collect();
    for (n, thread) in threads.into_iter().enumerate() {
        let out = thread
            .join()
            .unwrap_or_else(|_| panic!("thread {n} panicked"));
        assert_eq!(out.unwrap_or_else(|e| panic!("{e}")), n.to_string());
    }
    // And one render's spending does not carry over to the next.
    for _ in 0..2 {
        template
            .render(&json!({"n": 0}))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
