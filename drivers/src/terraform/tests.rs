//! The driver against the real `terraform` (or `tofu`), with `terraform_data` resources only:
//! nothing to download, so `init` needs no network.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use super::super::ErrorKind;
use super::super::test_request::{Inputs as Request, request};
use super::*;

/// Whether a program to test with is installed; says why not otherwise.
fn installed() -> bool {
    let found = TerraformDriver::new(TerraformConfig::default(), Flavour::Terraform)
        .program()
        .is_ok();
    if !found {
        eprintln!("skipped: neither terraform nor tofu is installed");
    }
    found
}

fn driver() -> TerraformDriver {
    TerraformDriver::new(TerraformConfig::default(), Flavour::Terraform)
}

fn inputs(values: Value, secrets: Value) -> Request {
    Request {
        resource: json!({}),
        values,
        secrets,
        account: None,
    }
}

/// A `terraform_data` whose input is `var.x`, an output of its id, and a sensitive output of
/// the secret variable `token`; destroying it writes `destroyed` into `marker`.
fn script(marker: &Path) -> String {
    format!(
        r#"
variable "x" {{}}
variable "token" {{}}
resource "terraform_data" "thing" {{
  input = {{ x = var.x, marker = "{}" }}
  provisioner "local-exec" {{
    when    = destroy
    command = "echo destroyed > ${{self.input.marker}}"
  }}
}}
output "id" {{ value = terraform_data.thing.id }}
output "x" {{ value = terraform_data.thing.output.x }}
output "token" {{
  value     = var.token
  sensitive = true
}}
"#,
        marker.display()
    )
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

fn state_of(cookie: &Cookie) -> &str {
    match cookie {
        Cookie::Set(state) => state,
        other => panic!("no state kept: {other:?}"),
    }
}

#[test]
fn put_update_and_delete_keep_the_state_in_the_cookie() {
    if !installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("destroyed");
    let secrets = json!({"variables": {"token": "tok-s3cr3t-1"}});
    let first = inputs(
        json!({"script": script(&marker), "variables": {"x": "one"}}),
        secrets.clone(),
    );
    let (outputs, secret_outputs, cookie) = done(driver().put(&request(&first, None)).unwrap());
    let id = outputs["id"].as_str().unwrap().to_owned();
    assert_eq!(outputs["x"], "one");
    assert_eq!(secret_outputs, json!({"token": "tok-s3cr3t-1"}));
    assert!(outputs.get("token").is_none(), "{outputs}");
    let state = state_of(&cookie).to_owned();

    // Updated in place: the same terraform_data, so the state was used.
    let second = inputs(
        json!({"script": script(&marker), "variables": {"x": "two"}}),
        secrets.clone(),
    );
    let (outputs, _, cookie) = done(driver().put(&request(&second, Some(&state))).unwrap());
    assert_eq!(outputs["id"], id.as_str());
    assert_eq!(outputs["x"], "two");
    let state = state_of(&cookie).to_owned();

    // Applying the same again changes nothing, the kept state included.
    let (_, _, cookie) = done(driver().put(&request(&second, Some(&state))).unwrap());
    assert_eq!(cookie, Cookie::Unchanged);

    assert!(!marker.exists());
    assert_eq!(
        driver().delete(&request(&second, Some(&state))).unwrap(),
        DeleteOutcome::Done
    );
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        "destroyed"
    );
}

#[test]
fn nothing_kept_means_nothing_to_destroy_and_no_program_runs() {
    let missing = TerraformDriver::new(
        TerraformConfig {
            program: Some("/nonexistent/terraform".into()),
            ..TerraformConfig::default()
        },
        Flavour::Terraform,
    );
    let req = inputs(
        json!({"script": "resource \"terraform_data\" \"x\" {}"}),
        Value::Null,
    );
    assert_eq!(
        missing.delete(&request(&req, None)).unwrap(),
        DeleteOutcome::Done
    );
    let empty = r#"{"version": 4, "lineage": "l", "resources": []}"#;
    assert_eq!(
        missing.delete(&request(&req, Some(empty))).unwrap(),
        DeleteOutcome::Done
    );
    let err = missing.put(&request(&req, None)).unwrap_err();
    assert!(
        err.message.starts_with("cannot start terraform init"),
        "{}",
        err.message
    );
}

#[test]
fn a_failed_apply_returns_the_state_it_left_so_nothing_is_made_twice() {
    if !installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("created.log");
    let code = format!(
        r#"
variable "fail" {{}}
resource "terraform_data" "first" {{
  provisioner "local-exec" {{
    command = "echo created >> {}"
  }}
}}
resource "terraform_data" "second" {{
  depends_on = [terraform_data.first]
  provisioner "local-exec" {{
    command = var.fail ? "echo second fails >&2; exit 3" : "true"
  }}
}}
output "first" {{ value = terraform_data.first.id }}
"#,
        log.display()
    );
    let failing = inputs(
        json!({"script": code, "variables": {"fail": true}}),
        Value::Null,
    );
    let err = driver().put(&request(&failing, None)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Final);
    assert!(
        err.message.contains("apply exited with code 1"),
        "{}",
        err.message
    );
    assert!(err.message.contains("second fails"), "{}", err.message);
    let state = state_of(&err.cookie).to_owned();
    assert!(state.contains("\"first\""), "{state}");

    let fixed = inputs(
        json!({"script": code, "variables": {"fail": false}}),
        Value::Null,
    );
    done(driver().put(&request(&fixed, Some(&state))).unwrap());
    let created = std::fs::read_to_string(&log).unwrap();
    assert_eq!(created.lines().count(), 1, "created twice: {created}");
}

#[test]
fn terraform_messages_never_show_secret_values() {
    if !installed() {
        return;
    }
    let code = r#"
variable "token" {}
resource "terraform_data" "x" {
  lifecycle {
    precondition {
      condition     = length(var.token) < 3
      error_message = "The token is too long for this test."
    }
  }
}
"#;
    let mut req = inputs(
        json!({"script": code, "append_logs_to_error": true}),
        json!({"variables": {"token": "tok-s3cr3t-precondition"}}),
    );
    req.account = Some(json!({"key": "acct-s3cr3t-9"}));
    let err = driver().put(&request(&req, None)).unwrap_err();
    assert!(
        err.message.contains("The token is too long for this test."),
        "{}",
        err.message
    );
    // Terraform prints the value of a variable a condition reads.
    assert!(
        err.message.contains("var.token is \"[redacted]\""),
        "{}",
        err.message
    );
    assert!(!err.message.contains("tok-s3cr3t"), "{}", err.message);
    assert!(err.message.contains("; output: "), "{}", err.message);
}

#[test]
fn the_time_limit_interrupts_then_kills_everything_terraform_started() {
    if !installed() {
        return;
    }
    let slow = TerraformDriver::new(
        TerraformConfig {
            timeout: Duration::from_secs(3),
            ..TerraformConfig::default()
        },
        Flavour::Terraform,
    );
    let code = r#"
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "sleep 600"
  }
}
"#;
    let req = inputs(json!({"script": code}), Value::Null);
    let started = Instant::now();
    let err = slow.put(&request(&req, None)).unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        err.message.contains("apply did not finish within 3s"),
        "{}",
        err.message
    );
    // Interrupted, Terraform wrote its state: the half-made resource is not forgotten.
    let state = state_of(&err.cookie);
    assert!(state.contains("\"slow\""), "{state}");
    eprintln!("{}", err.message);
}

#[test]
fn a_declared_backend_keeps_the_state_and_a_kept_state_moves_there() {
    if !installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let resource = r#"
resource "terraform_data" "x" { input = "a" }
output "id" { value = terraform_data.x.id }
"#;
    let plain = inputs(json!({"script": resource}), Value::Null);
    let (outputs, _, cookie) = done(driver().put(&request(&plain, None)).unwrap());
    let id = outputs["id"].clone();
    let state = state_of(&cookie).to_owned();

    let backend_file = dir.path().join("backend.tfstate");
    let backend = format!(
        "terraform {{\n  backend \"local\" {{\n    path = \"{}\"\n  }}\n}}\n",
        backend_file.display()
    );
    let with_backend = inputs(
        json!({"script": resource, "files": {"backend.tf": backend}}),
        Value::Null,
    );
    let (outputs, _, cookie) = done(driver().put(&request(&with_backend, Some(&state))).unwrap());
    assert_eq!(outputs["id"], id, "the kept state moved into the backend");
    assert_eq!(cookie, Cookie::Cleared);
    let kept = std::fs::read_to_string(&backend_file).unwrap();
    assert!(kept.contains(id.as_str().unwrap()), "{kept}");

    let (outputs, _, cookie) = done(driver().put(&request(&with_backend, None)).unwrap());
    assert_eq!(outputs["id"], id);
    assert_eq!(cookie, Cookie::Unchanged);
    assert_eq!(
        driver().delete(&request(&with_backend, None)).unwrap(),
        DeleteOutcome::Done
    );
    let after = std::fs::read_to_string(&backend_file).unwrap();
    assert!(!after.contains(id.as_str().unwrap()), "destroyed: {after}");
}

fn git(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

#[test]
fn a_git_source_is_fetched_at_its_rev_and_a_folder_is_copied() {
    if !installed() {
        return;
    }
    let repo = tempfile::tempdir().unwrap();
    git(repo.path(), &["init", "--quiet", "--initial-branch=main"]);
    let module = |version: &str| {
        std::fs::create_dir_all(repo.path().join("modules/m")).unwrap();
        std::fs::write(
            repo.path().join("modules/m/main.tf"),
            format!("variable \"x\" {{}}\noutput \"v\" {{ value = \"{version}-${{var.x}}\" }}\n"),
        )
        .unwrap();
        git(repo.path(), &["add", "-A"]);
        git(repo.path(), &["commit", "--quiet", "-m", version]);
    };
    module("v1");
    git(repo.path(), &["tag", "v1"]);
    module("v2");
    let url = repo.path().display().to_string();
    let at = |rev: Option<&str>| {
        let mut source = json!({"url": url, "path": "modules/m"});
        if let Some(rev) = rev {
            source["rev"] = json!(rev);
        }
        inputs(
            json!({"source": source, "variables": {"x": "y"}}),
            Value::Null,
        )
    };
    let v = |req: &Request| done(driver().put(&request(req, None)).unwrap()).0["v"].clone();
    assert_eq!(v(&at(Some("v1"))), "v1-y");
    assert_eq!(v(&at(Some("refs/heads/main"))), "v2-y");
    // A folder without rev is copied as it is, uncommitted changes included.
    std::fs::write(
        repo.path().join("modules/m/main.tf"),
        "variable \"x\" {}\noutput \"v\" { value = \"work-${var.x}\" }\n",
    )
    .unwrap();
    assert_eq!(v(&at(None)), "work-y");

    let err = driver()
        .put(&request(&at(Some("no-such-tag")), None))
        .unwrap_err();
    assert!(
        err.message
            .contains("fetching the source: git fetch exited with code"),
        "{}",
        err.message
    );
    let mut bad_path = at(Some("v1"));
    bad_path.values["source"]["path"] = json!("modules/none");
    let err = driver().put(&request(&bad_path, None)).unwrap_err();
    assert!(
        err.message
            .contains("source.path 'modules/none' is not a folder"),
        "{}",
        err.message
    );
}

#[test]
fn a_manifests_output_becomes_manifests() {
    if !installed() {
        return;
    }
    let code = r#"
output "name" { value = "sa" }
output "manifests" {
  value = [{ location = "namespace", data = { kind = "ServiceAccount", metadata = { name = "sa" } } }]
}
"#;
    let req = inputs(
        json!({"script": code, "manifests_output": "manifests"}),
        Value::Null,
    );
    match driver().put(&request(&req, None)).unwrap() {
        PutOutcome::Done {
            outputs, manifests, ..
        } => {
            assert_eq!(outputs, json!({"name": "sa"}));
            assert_eq!(
                manifests,
                vec![Manifest {
                    name: "manifest-1".into(),
                    location: ManifestLocation::Namespace,
                    data: json!({"kind": "ServiceAccount", "metadata": {"name": "sa"}}),
                }]
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn outputs_split_by_sensitivity_and_manifests_are_checked() {
    let shown = br#"{
        "a": {"sensitive": false, "type": "string", "value": "x"},
        "b": {"sensitive": true, "type": "string", "value": "s3cr3t"},
        "m": {"sensitive": false, "type": "map", "value": {"sa.yaml": {"location": "cluster", "data": {"kind": "X"}}}}
    }"#;
    let (outputs, secrets, manifests) = split_outputs(shown, Some("m")).unwrap();
    assert_eq!(outputs, json!({"a": "x"}));
    assert_eq!(secrets, json!({"b": "s3cr3t"}));
    assert_eq!(manifests[0].name, "sa.yaml");
    assert_eq!(manifests[0].location, ManifestLocation::Cluster);
    let err = split_outputs(shown, Some("nope")).unwrap_err();
    assert!(err.contains("names the output nope"), "{err}");
    let bad = [
        (json!("s3cr3t"), "must be a list or a map"),
        (
            json!([{"location": "moon", "data": {}}]),
            "manifest-1: location must be",
        ),
        (
            json!([{"location": "namespace", "data": "s3cr3t"}]),
            "data must be an object",
        ),
    ];
    for (value, expected) in bad {
        let err = parse_manifests(&value, "m").unwrap_err();
        assert!(err.contains(expected), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
    }
}

#[test]
fn the_program_is_found_on_path_or_named_clearly() {
    let named = TerraformDriver::new(
        TerraformConfig {
            program: Some("/opt/tf/terraform".into()),
            ..TerraformConfig::default()
        },
        Flavour::OpenTofu,
    );
    assert_eq!(named.program().unwrap(), PathBuf::from("/opt/tf/terraform"));
    assert_eq!(
        url_userinfo("https://bot:tok3n@git.example.com/a.git"),
        Some("bot:tok3n")
    );
    assert_eq!(url_userinfo("git@github.com:org/repo.git"), None);
    assert_eq!(url_userinfo("https://git.example.com/a.git"), None);
}
