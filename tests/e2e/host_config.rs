//! The host configuration through the binary: an `exec` driver and a resource account it
//! registers, the template driver, and the errors a bad host config gives.

use serde_json::{Value, json};

use crate::util::Sandbox;

/// A driver script that records each request and answers `done` with outputs from its inputs.
const SCRIPT: &str = r#"#!/bin/sh
cat > "$0.request.$$.json"
env > "$0.env.$$"
printf '{"status": "done", "resource": {"values": {"zone": "example.test", "argv": "%s"}, "secrets": {"key": "from-exec"}}, "cookie": "seen"}' "$1"
"#;

fn platform(sb: &Sandbox) -> std::path::PathBuf {
    let script = sb.root.join("dns-driver");
    std::fs::write(&script, SCRIPT).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let account = sb.root.join("account.json");
    std::fs::write(&account, r#"{"api_key": "acct-s3cret"}"#).unwrap();
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "drivers:\n  acme/dns:\n    exec: {{command: [\"{}\", \"--zone-arg\"], timeout: 10s}}\n\
             accounts:\n  dns-account: {{file: {}}}\n",
            script.display(),
            account.display()
        ),
    )
    .unwrap();
    sb.write(
        "environments/dev.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    sb.write(
        "workloads/app/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  dns:\n    type: dns\n    params: {subdomain: web}\n  cfg:\n    type: config\n",
    );
    sb.write(
        "definitions/dns.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: dns\nentity:\n  \
         type: dns\n  driver_type: acme/dns\n  driver_account: dns-account\n  driver_inputs:\n    \
         values: {ttl: 60}\n    secrets: {token: inline-s3cret}\n  criteria:\n    - {}\n",
    );
    sb.write(
        "definitions/config.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: config\nentity:\n  \
         type: config\n  driver_type: template\n  driver_inputs:\n    values:\n      \
         zone: ${resources.dns#modules.web.externals.dns.outputs.zone}\n      templates:\n        outputs: |\n          \
         url: https://{{ values.zone }}/{{ res.id }}\n  criteria:\n    - {}\n",
    );
    sb.write(
        "definitions/workload.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: workload\nentity:\n  \
         type: workload\n  driver_type: echo\n  criteria:\n    - {}\n",
    );
    sb.commit("exec and template drivers");
    config
}

#[test]
fn an_exec_driver_and_its_account_come_from_the_host_config() {
    let sb = Sandbox::new();
    let config = platform(&sb);
    let run = sb
        .gitplane(&["apply", "--config", config.to_str().unwrap()])
        .ok();
    assert!(!run.stderr.contains("s3cret") && !run.stdout.contains("s3cret"));

    // The script received one request, without a shell, with the account.
    let requests: Vec<Value> = std::fs::read_dir(&sb.root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("dns-driver.request."))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r["operation"], "put");
    assert_eq!(r["type"], "dns");
    assert_eq!(r["id"], "modules.web.externals.dns");
    assert_eq!(r["app"], "app");
    assert_eq!(r["env"], "dev");
    assert_eq!(r["resource"], json!({"subdomain": "web"}));
    assert_eq!(r["driver"]["values"], json!({"ttl": 60}));
    assert_eq!(
        r["driver"]["secrets"],
        json!({"token": "inline-s3cret", "account": {"api_key": "acct-s3cret"}})
    );
    assert_eq!(r["cookie"], Value::Null);

    assert_eq!(
        sb.outputs("dev", "modules.web.externals.dns"),
        json!({"zone": "example.test", "argv": "--zone-arg"})
    );
    // The template driver rendered its outputs from the exec driver's.
    assert_eq!(
        sb.outputs("dev", "modules.web.externals.cfg"),
        json!({"url": "https://example.test/modules.web.externals.cfg"})
    );
    assert_eq!(
        sb.unsealed("SELECT cookie, 'driver_cookie:' || guresid FROM driver_cookie"),
        ["seen"]
    );
    assert_eq!(
        sb.column("SELECT account FROM resource WHERE type = 'dns'"),
        ["dns-account"]
    );
    // The account's credentials are not stored: they are read from the host at each call.
    for table in ["resource", "resource_secret", "operation", "deployment"] {
        for row in sb.rows(&format!("SELECT * FROM {table}")) {
            assert!(
                !row.iter().any(|c| c.contains("acct-s3cret")),
                "{table}: {row:?}"
            );
        }
    }
}

#[test]
fn an_exec_program_sees_only_the_environment_its_driver_names() {
    let sb = Sandbox::new();
    let config = platform(&sb);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("timeout: 10s}", "timeout: 10s, env: [AWS_REGION]}"),
    )
    .unwrap();
    sb.gitplane_env(
        &["apply", "--config", config.to_str().unwrap()],
        &[
            ("AWS_REGION", "eu-west-1"),
            ("OTHER_ACCOUNT_TOKEN", "other-s3cret"),
            ("LANG", "C.UTF-8"),
        ],
    )
    .ok();
    let seen: Vec<String> = std::fs::read_dir(&sb.root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("dns-driver.env."))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(seen.len(), 1);
    let names: std::collections::BTreeSet<&str> = seen[0]
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    // sh itself adds PWD (and may add SHLVL, _): nothing of gitplane's own environment.
    let passed: std::collections::BTreeSet<&str> = names
        .into_iter()
        .filter(|n| !["PWD", "SHLVL", "_", "OLDPWD"].contains(n))
        .collect();
    assert_eq!(
        passed,
        ["AWS_REGION", "HOME", "LANG", "PATH"].into_iter().collect(),
        "{}",
        seen[0]
    );
    assert!(seen[0].contains("AWS_REGION=eu-west-1"));
    assert!(!seen[0].contains("other-s3cret"));
}

#[test]
fn a_missing_account_fails_only_its_resource() {
    let sb = Sandbox::new();
    let config = platform(&sb);
    // A missing account file is found when the host config is read, before any state exists.
    std::fs::remove_file(sb.root.join("account.json")).unwrap();
    sb.gitplane(&["validate", "--config", config.to_str().unwrap()])
        .fails()
        .stderr_has("account 'dns-account': the file");
    assert!(!sb.state.exists());
    // One that is there but cannot be read when the driver needs it fails only its resource.
    std::fs::write(sb.root.join("account.json"), [0xff, 0xfe, 0xfd]).unwrap();
    let run = sb
        .gitplane(&["apply", "--config", config.to_str().unwrap()])
        .fails();
    run.stderr_has("resource account 'dns-account': cannot read");
    assert_eq!(
        sb.rows("SELECT type, status FROM operation ORDER BY type"),
        [
            ["config", "skipped"],
            ["dns", "failed"],
            ["workload", "skipped"]
        ]
    );
}

#[test]
fn a_bad_host_config_is_reported_with_its_line_and_changes_nothing() {
    let sb = Sandbox::applied();
    let before = sb.resource_rows();
    let deployments = sb.max_id("deployment");
    let config = sb.root.join("bad.yaml");
    std::fs::write(
        &config,
        "concurrency: 4\ndrivers:\n  acme/x:\n    exec: {command: [relative]}\n  acme/y:\n    http: {url: \"http://h\", timeout: soon}\n",
    )
    .unwrap();
    for command in ["validate", "plan", "apply", "status"] {
        let run = sb
            .gitplane(&[command, "--config", config.to_str().unwrap()])
            .fails();
        let path = config.display().to_string();
        run.stderr_has(&format!(
            "{path}:3: driver 'acme/x': the program 'relative' must be an absolute path"
        ));
        run.stderr_has(&format!("{path}:5: 'soon' is not a duration"));
    }
    let missing = sb.root.join("missing.yaml");
    sb.gitplane(&["validate", "--config", missing.to_str().unwrap()])
        .fails()
        .stderr_has("cannot read the host config");
    assert_eq!(sb.resource_rows(), before);
    assert_eq!(sb.max_id("deployment"), deployments);
}

#[test]
fn the_host_config_names_the_repository_and_the_state() {
    let sb = Sandbox::template();
    let state = sb.root.join("from-config.db");
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {}\nref: refs/heads/main\nstate: {}\n",
            sb.origin.display(),
            state.display()
        ),
    )
    .unwrap();
    sb.gitplane_raw(&["apply", "--config", config.to_str().unwrap()], &[])
        .ok();
    assert!(state.exists(), "the state named by the host config");
    // --state overrides it.
    let other = sb.root.join("override.db");
    sb.gitplane_raw(
        &[
            "apply",
            "--config",
            config.to_str().unwrap(),
            "--state",
            other.to_str().unwrap(),
        ],
        &[],
    )
    .ok();
    assert!(other.exists());
}

#[test]
fn a_state_file_that_cannot_be_created_is_reported_once() {
    let sb = Sandbox::template();
    let run = sb
        .gitplane_raw(
            &[
                "apply",
                "--repo",
                sb.origin.to_str().unwrap(),
                "--state",
                "/proc/no-such-dir/state.db",
            ],
            &[],
        )
        .fails();
    let errors = run.error_lines();
    assert_eq!(
        errors,
        [
            "error: state /proc/no-such-dir/state.db: cannot create the file: No such file or \
          directory (os error 2)"
        ],
        "{run}"
    );
}
