//! No secret in a plain column, ever: whatever a driver does with a secret its call received
//! (a definition's secrets, an account's credentials), copied into a public output as it is or
//! encoded, that output is recorded and served as a secret output, shown by name alone, with a
//! warning naming the definition, and what reads it still gets the value. One test per driver
//! greps every byte of the state file, what the commands print and what the daemon's API
//! serves.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::daemon::{Daemon, repo_args};
use crate::service::{free_port, get};
use crate::util::{Sandbox, keys};
use gitplane_testkit::{Behavior, DriverServer, url_encoded};

const ENV: &str = "dev";
/// The resource under test: an implicit resource of app `shop`, so its res_id is its type.
const LEAKY: &str = "leaky";

/// One app `shop` in `dev`: the implicit resource `leaky`, provisioned by definition `id`
/// (`entity` is the YAML under `entity:` after `type`, indented by two spaces), and the
/// workload's `reader`, an echo whose secrets read `leaky`'s output `read` (an echo's secret
/// outputs are what it received).
fn platform(sb: &Sandbox, id: &str, entity: &str, read: &str) {
    sb.write(
        "environments/dev.yaml",
        "type: development\nimplicit_resources: [leaky]\ndeletion_guard: {threshold: 100}\n",
    );
    sb.write(
        "workloads/shop/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  reader:\n    type: reader\n",
    );
    sb.write(
        "definitions/platform.yaml",
        &format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: workload\n\
             entity:\n  type: workload\n  driver_type: echo\n  criteria:\n    - {{}}\n---\n\
             apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: reader\n\
             entity:\n  type: reader\n  driver_type: echo\n  driver_inputs:\n    secrets:\n      \
             got: ${{resources.leaky#leaky.outputs.{read}}}\n  criteria:\n    - {{}}\n"
        ),
    );
    sb.write(
        "definitions/leaky.yaml",
        &format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n\
             entity:\n  type: leaky\n{entity}  criteria:\n    - {{}}\n"
        ),
    );
}

/// The host config: an `http:` listener on a free port (for the daemon), then `extra`.
fn host_config(sb: &Sandbox, extra: &str) -> (PathBuf, u16) {
    let port = free_port();
    let path = sb.root.join("host.yaml");
    std::fs::write(&path, format!("http:\n  listen: 127.0.0.1:{port}\n{extra}")).unwrap();
    (path, port)
}

/// Makes `script` an executable file at `path`.
fn executable(path: &Path, script: &str) {
    std::fs::write(path, script).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn guresid(sb: &Sandbox, res_id: &str) -> String {
    sb.column(&format!(
        "SELECT guresid FROM resource WHERE env = '{ENV}' AND res_id = '{res_id}'"
    ))
    .pop()
    .unwrap_or_else(|| panic!("no resource {res_id}"))
}

/// The secret outputs recorded for `res_id`, opened with the state key.
fn secret_outputs(sb: &Sandbox, res_id: &str) -> Value {
    let g = guresid(sb, res_id);
    let opened = sb.unsealed(&format!(
        "SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret \
         WHERE guresid = '{g}'"
    ));
    serde_json::from_str(&opened[0]).unwrap()
}

/// What a test expects of the resource `leaky` after its apply.
struct Expect<'a> {
    /// The definition's id, which the warning names.
    definition: &'a str,
    /// The outputs that held a secret: warned of, and secret now.
    leaked: &'a [&'a str],
    /// What must be nowhere: each secret, in each form the driver wrote it in.
    hidden: Vec<String>,
    /// What `reader` must have received, through the leaked output it reads.
    got: String,
}

/// Applies, then checks the resource, its reader, the warning, every command's output, every
/// byte of the state file and what the daemon's API serves. Returns the public outputs.
fn apply_and_check(sb: &Sandbox, config: &Path, port: u16, expect: &Expect<'_>) -> Value {
    let hidden: Vec<&str> = expect.hidden.iter().map(String::as_str).collect();
    let config = config.to_str().unwrap();
    let apply = sb.gitplane(&["apply", "--config", config]).ok();
    apply.hides(&hidden);

    // Recorded as secret outputs, under their names; none of them public.
    let public = sb.outputs(ENV, LEAKY);
    let secret = secret_outputs(sb, LEAKY);
    for name in expect.leaked {
        assert!(
            public.get(name).is_none(),
            "output {name} is public: {public}"
        );
        assert!(secret.get(name).is_some(), "no secret output {name}");
    }
    // The reader still gets the value, as a secret.
    assert_eq!(
        secret_outputs(sb, "modules.web.externals.reader")["got"],
        json!(expect.got)
    );
    // A warning per output, naming the definition and the output, never the value.
    for name in expect.leaked {
        apply.stderr_has(&format!(
            "definition {}: output '{name}' of shop/leaky",
            expect.definition
        ));
    }

    let leaky = guresid(sb, LEAKY);
    let reader = guresid(sb, "modules.web.externals.reader");
    let mut commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["status", "--format", "json"],
        vec!["report", "resources"],
        vec!["report", "resources", "--format", "json"],
        vec!["report", "resources", "--format", "csv"],
        vec!["report", "drift-detected", "--format", "json"],
        vec!["history"],
        vec!["history", "--format", "json"],
        vec!["plan"],
        vec!["plan", "--format", "json"],
        vec!["manifests", "--env", ENV],
    ];
    for g in [&leaky, &reader] {
        commands.push(vec!["explain", g]);
        commands.push(vec!["explain", g, "--format", "json"]);
    }
    for mut args in commands {
        args.extend(["--config", config]);
        sb.gitplane(&args).ok().hides(&hidden);
    }
    sb.assert_state_bytes_hide(&hidden);

    // The daemon's API: the names of secret outputs, never their values.
    let mut args = repo_args(sb);
    args.extend(["--config".to_owned(), config.to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(sb, &args);
    let base = format!("http://127.0.0.1:{port}");
    let mut served = String::new();
    for path in [
        "/api/overview".to_owned(),
        format!("/api/envs/{ENV}/graph"),
        format!("/api/envs/{ENV}/apps"),
        format!("/api/envs/{ENV}/resources/{leaky}"),
        format!("/api/envs/{ENV}/resources/{reader}"),
    ] {
        let (status, body) = get(&format!("{base}{path}"), &[]);
        assert_eq!(status, 200, "{path}: {body}");
        served.push_str(&body);
    }
    for secret in &hidden {
        assert!(!served.contains(secret), "{secret:?} served by the API");
    }
    let (_, body) = get(&format!("{base}/api/envs/{ENV}/resources/{leaky}"), &[]);
    let body: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = body["secret_outputs"]
        .as_array()
        .unwrap_or_else(|| panic!("no secret_outputs: {body}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in expect.leaked {
        assert!(names.contains(name), "{name} not among {names:?}");
        assert!(body["outputs"].get(name).is_none(), "{body}");
    }
    let log = daemon.log();
    drop(daemon);
    for secret in &hidden {
        assert!(
            !log.contains(secret),
            "{secret:?} in the daemon's log:\n{log}"
        );
    }
    sb.assert_state_bytes_hide(&hidden);
    public
}

/// `humanitec/template` (Go templates): the secret copied as it is, through `.init`, `printf`,
/// `toJson .` (JSON-escaped), `b64enc` and `urlquery`; a detect-only drift run of a leaking
/// output that changes quotes no secret either, and a manifest holding it base64-encoded inside
/// a longer text is recorded hidden.
#[test]
fn go_template_outputs_holding_a_secret_are_secret_outputs() {
    const CORE: &str = "GoTmplCore42";
    let secret = format!("pa\"ss<w0rd>&{CORE}");
    let sb = Sandbox::new();
    platform(
        &sb,
        "leaky-go",
        &format!(
            r#"  driver_type: humanitec/template
  driver_inputs:
    values:
      templates:
        init: |
          pw: {{{{ .driver.secrets.password | quote }}}}
        manifests: |
          config.yaml:
            location: namespace
            data:
              apiVersion: v1
              kind: ConfigMap
              metadata: {{name: leaky}}
              data:
                auth: {{{{ printf "Bearer %s" .driver.secrets.password | b64enc }}}}
                host: db.internal
        outputs: |
          host: db.internal
          leak: {{{{ .driver.secrets.password | quote }}}}
          via_init: {{{{ .init.pw | quote }}}}
          via_printf: {{{{ printf "u:%s@db" .driver.secrets.password | quote }}}}
          all: {{{{ toJson . | quote }}}}
          encoded: {{{{ .driver.secrets.password | b64enc }}}}
          query: {{{{ .driver.secrets.password | urlquery | quote }}}}
          session: {{{{ printf "%s-%s" .driver.secrets.password (randAlphaNum 8) | quote }}}}
    secrets:
      password: '{secret}'
"#
        ),
        "leak",
    );
    sb.commit("A definition whose outputs copy its secret");
    let (config, port) = host_config(&sb, "");
    // The drift run reads by rendering again: `session` differs, as a secret output.
    let public = apply_and_check(
        &sb,
        &config,
        port,
        &Expect {
            definition: "leaky-go",
            leaked: &[
                "leak",
                "via_init",
                "via_printf",
                "all",
                "encoded",
                "query",
                "session",
            ],
            hidden: vec![
                CORE.to_owned(),
                STANDARD.encode(&secret),
                STANDARD.encode(format!("Bearer {secret}")),
            ],
            got: secret.clone(),
        },
    );
    assert_eq!(public, json!({"host": "db.internal"}));
    let config = config.to_str().unwrap();
    let manifests = sb
        .gitplane(&["manifests", "--env", ENV, "--config", config])
        .ok();
    manifests.stdout_has("auth: (secret)");
    manifests.stdout_has("host: db.internal");

    let drift = sb.gitplane(&["drift", "--detect", "--config", config]);
    assert_eq!(drift.code, Some(2), "drift found:{drift}");
    drift.hides(&[CORE]);
    let findings = sb.column("SELECT what || ': ' || detail FROM drift_finding");
    assert_eq!(
        findings,
        ["secret outputs: secret outputs differ: session"],
        "the changing output, by name alone"
    );
    for format in ["table", "json", "csv"] {
        sb.gitplane(&[
            "report",
            "drift-detected",
            "--format",
            format,
            "--config",
            config,
        ])
        .ok()
        .hides(&[CORE]);
    }
    sb.assert_state_bytes_hide(&[CORE]);
}

/// The minijinja `template` driver: as it is, through `init`, inside a longer string, and
/// JSON-escaped inside a JSON text.
#[test]
fn template_outputs_holding_a_secret_are_secret_outputs() {
    const CORE: &str = "MiniJinjaCore77";
    let secret = format!("mj\"pass\\{CORE}");
    let sb = Sandbox::new();
    platform(
        &sb,
        "leaky-jinja",
        &format!(
            r#"  driver_type: template
  driver_inputs:
    values:
      templates:
        init: |
          pw: {{{{ secrets.password | tojson }}}}
        outputs: |
          host: db.internal
          leak: {{{{ driver.secrets.password | tojson }}}}
          via_init: {{{{ init.pw | tojson }}}}
          dsn: {{{{ ("postgres://app:" ~ secrets.password ~ "@db/orders") | tojson }}}}
          all: {{{{ secrets | tojson | tojson }}}}
    secrets:
      password: '{secret}'
"#
        ),
        "leak",
    );
    sb.commit("A minijinja definition whose outputs copy its secret");
    let (config, port) = host_config(&sb, "");
    let public = apply_and_check(
        &sb,
        &config,
        port,
        &Expect {
            definition: "leaky-jinja",
            leaked: &["leak", "via_init", "dsn", "all"],
            hidden: vec![CORE.to_owned()],
            got: secret.clone(),
        },
    );
    assert_eq!(public, json!({"host": "db.internal"}));
}

/// An `exec` program that echoes the secret it received into its public values, as it is and
/// base64-encoded, and the account's token inside a longer string.
#[test]
fn exec_outputs_holding_a_secret_or_a_credential_are_secret_outputs() {
    const SECRET: &str = "ExecCore-s3cret-77";
    const TOKEN: &str = "ExecAcctCore-4242";
    let sb = Sandbox::new();
    let program = sb.root.join("leaky-driver");
    executable(
        &program,
        r#"#!/bin/sh
request=$(cat)
pw=$(printf '%s' "$request" | sed -n 's/.*"password":"\([^"]*\)".*/\1/p')
token=$(printf '%s' "$request" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
encoded=$(printf '%s' "$pw" | base64)
printf '{"status": "done", "resource": {"values": {"host": "db.internal", "leak": "%s", "encoded": "%s", "auth": "Bearer %s"}, "secrets": {}}}' "$pw" "$encoded" "$token"
"#,
    );
    let account = sb.root.join("account.json");
    std::fs::write(&account, format!(r#"{{"token": "{TOKEN}"}}"#)).unwrap();
    platform(
        &sb,
        "leaky-exec",
        &format!(
            "  driver_type: acme/leaky\n  driver_account: leaky-account\n  driver_inputs:\n    \
             secrets:\n      password: {SECRET}\n"
        ),
        "leak",
    );
    sb.commit("An exec driver that copies its secret into its outputs");
    let (config, port) = host_config(
        &sb,
        &format!(
            "drivers:\n  acme/leaky:\n    exec: {{command: [\"{}\"], timeout: 20s}}\n\
             accounts:\n  leaky-account: {{file: {}}}\n",
            program.display(),
            account.display()
        ),
    );
    let public = apply_and_check(
        &sb,
        &config,
        port,
        &Expect {
            definition: "leaky-exec",
            leaked: &["leak", "encoded", "auth"],
            hidden: vec![SECRET.to_owned(), STANDARD.encode(SECRET), TOKEN.to_owned()],
            got: SECRET.to_owned(),
        },
    );
    assert_eq!(public, json!({"host": "db.internal"}));
    assert_eq!(
        secret_outputs(&sb, LEAKY)["auth"],
        json!(format!("Bearer {TOKEN}"))
    );
}

/// An HTTP driver (the Driver Interface) answering with the secret and the account's key it
/// received, hex-encoded and URL-encoded.
#[test]
fn http_outputs_holding_a_secret_or_a_credential_are_secret_outputs() {
    const SECRET: &str = "Http Pass/Core+55";
    const KEY: &str = "HttpAcctCore-8080";
    let sb = Sandbox::new();
    let server = DriverServer::start();
    server.behave(
        "leaky",
        Behavior {
            leak_secrets: true,
            ..Behavior::default()
        },
    );
    let account = sb.root.join("account.json");
    std::fs::write(&account, format!(r#"{{"key": "{KEY}"}}"#)).unwrap();
    platform(
        &sb,
        "leaky-http",
        &format!(
            "  driver_type: test/http\n  driver_account: http-account\n  driver_inputs:\n    \
             secrets:\n      password: '{SECRET}'\n"
        ),
        "leak_url",
    );
    sb.commit("An HTTP driver that copies its secrets into its outputs");
    let (config, port) = host_config(
        &sb,
        &format!(
            "drivers:\n  test/http:\n    http: {{url: \"{}\"}}\naccounts:\n  \
             http-account: {{file: {}}}\n",
            server.url,
            account.display()
        ),
    );
    // The driver got both, and answered with them.
    let url = |leaves: &[&str]| {
        let query: Vec<String> = leaves
            .iter()
            .enumerate()
            .map(|(i, s)| format!("s{i}={}", url_encoded(s)))
            .collect();
        format!("https://db.example/?{}", query.join("&"))
    };
    let public = apply_and_check(
        &sb,
        &config,
        port,
        &Expect {
            definition: "leaky-http",
            leaked: &["leak_hex", "leak_url"],
            hidden: vec![
                SECRET.to_owned(),
                url_encoded(SECRET),
                hex(SECRET),
                KEY.to_owned(),
                hex(KEY),
            ],
            got: url(&[KEY, SECRET]),
        },
    );
    assert_eq!(
        keys(&public),
        ["echo", "guresid", "instance", "name"]
            .into_iter()
            .collect(),
        "{public}"
    );
    assert_eq!(secret_outputs(&sb, LEAKY)["token"], json!("tok-1"));
    let put = server
        .received()
        .into_iter()
        .find(|r| r.method == "PUT")
        .expect("a put");
    assert_eq!(put.body["driver"]["secrets"]["account"]["key"], json!(KEY));
}

/// Terraform: an output not marked `sensitive` that holds a variable mapped from the account's
/// credentials (`credentials_config`), as it is and base64-encoded, is secret; an output marked
/// `sensitive` is secret too.
#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn terraform_outputs_holding_a_credential_or_marked_sensitive_are_secret_outputs() {
    if !crate::terraform::installed() {
        return;
    }
    const KEY: &str = "TfAcctCore-31337";
    const TOKEN: &str = "TfTokenCore-2718";
    let sb = Sandbox::new();
    let account = sb.root.join("account.json");
    std::fs::write(&account, format!(r#"{{"ApiKey": "{KEY}"}}"#)).unwrap();
    platform(
        &sb,
        "leaky-tf",
        &format!(
            r#"  driver_type: humanitec/terraform
  driver_account: tf-account
  driver_inputs:
    values:
      script: |
        variable "key" {{}}
        variable "token" {{}}
        output "host" {{ value = "db.internal" }}
        output "leak" {{ value = "key=$${{var.key}}" }}
        output "encoded" {{ value = base64encode(var.key) }}
        output "token" {{
          value     = var.token
          sensitive = true
        }}
      credentials_config:
        variables:
          key: ApiKey
    secrets:
      variables:
        token: {TOKEN}
"#
        ),
        "leak",
    );
    sb.commit("Terraform outputs from the account's credentials");
    let (config, port) = host_config(
        &sb,
        &format!("accounts:\n  tf-account: {{file: {}}}\n", account.display()),
    );
    let public = apply_and_check(
        &sb,
        &config,
        port,
        &Expect {
            definition: "leaky-tf",
            leaked: &["leak", "encoded"],
            hidden: vec![KEY.to_owned(), STANDARD.encode(KEY), TOKEN.to_owned()],
            got: format!("key={KEY}"),
        },
    );
    assert_eq!(public, json!({"host": "db.internal"}));
    let secret = secret_outputs(&sb, LEAKY);
    assert_eq!(secret["token"], json!(TOKEN), "sensitive: a secret output");
    assert_eq!(secret["encoded"], json!(STANDARD.encode(KEY)));
}
