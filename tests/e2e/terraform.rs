//! The built-in Terraform driver (`humanitec/terraform`) through the binary, with the host's
//! real `terraform` (or `tofu`): `terraform_data` resources only, so `init` downloads nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::Sandbox;

const RES_ID: &str = "modules.web.externals.data";
const SECRET_TOKEN: &str = "tok-S3CR3T-terraform-42";

/// Whether `terraform` or `tofu` is on PATH; says why the test is skipped otherwise.
pub(crate) fn installed() -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .any(|dir| dir.join("terraform").is_file() || dir.join("tofu").is_file());
    if !found {
        eprintln!("skipped: neither terraform nor tofu is installed");
    }
    found
}

/// An environment `dev` with one workload `web` asking for a `tfdata` resource, provisioned by
/// `humanitec/terraform` with `driver_inputs` (YAML indented by four spaces).
fn platform(sb: &Sandbox, driver_inputs: &str) {
    sb.write(
        "environments/dev.yaml",
        "type: development\nimplicit_resources: []\ndeletion_guard: {threshold: 100}\n",
    );
    sb.write(
        "workloads/shop/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n\
         resources:\n  data:\n    type: tfdata\n",
    );
    sb.write(
        "definitions/workload.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: workload\n\
         entity:\n  type: workload\n  driver_type: echo\n  criteria:\n    - {}\n",
    );
    sb.write(
        "definitions/tfdata.yaml",
        &format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: tfdata\n\
             entity:\n  type: tfdata\n  driver_type: humanitec/terraform\n  driver_inputs:\n\
             {driver_inputs}  criteria:\n    - {{}}\n"
        ),
    );
}

/// Indents `text` by `n` spaces, for a YAML block scalar.
fn indent(text: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    text.lines()
        .map(|l| format!("{pad}{l}\n"))
        .collect::<String>()
}

/// The code of the lifecycle test: HCL's own `${` written `$${` (gitplane's escape).
fn lifecycle_script(marker: &Path) -> String {
    format!(
        r#"variable "x" {{}}
variable "res" {{}}
variable "token" {{}}
resource "terraform_data" "thing" {{
  input = {{ x = var.x, marker = "{}" }}
  provisioner "local-exec" {{
    when    = destroy
    command = "echo destroyed > $${{self.input.marker}}"
  }}
}}
output "id" {{ value = terraform_data.thing.id }}
output "x" {{ value = "$${{terraform_data.thing.output.x}} for $${{var.res}}" }}
output "token" {{
  value     = var.token
  sensitive = true
}}
"#,
        marker.display()
    )
}

fn lifecycle_inputs(marker: &Path, x: &str) -> String {
    format!(
        "    values:\n      script: |\n{}      variables:\n        x: {x}\n        \
         res: ${{context.res.id}}\n    secrets:\n      variables:\n        token: {SECRET_TOKEN}\n",
        indent(&lifecycle_script(marker), 8)
    )
}

fn last_error(sb: &Sandbox) -> String {
    sb.column(&format!(
        "SELECT error FROM operation WHERE res_id = '{RES_ID}' ORDER BY id DESC LIMIT 1"
    ))
    .remove(0)
}

fn cookies(sb: &Sandbox) -> Vec<String> {
    sb.unsealed("SELECT cookie, 'driver_cookie:' || guresid FROM driver_cookie")
}

#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn terraform_creates_updates_in_place_and_destroys_with_the_state_kept() {
    if !installed() {
        return;
    }
    let sb = Sandbox::new();
    let marker = sb.root.join("destroyed");
    platform(&sb, &lifecycle_inputs(&marker, "one"));
    sb.commit("A terraform resource");
    sb.gitplane(&["apply"]).ok().hides(&[SECRET_TOKEN]);

    let outputs = sb.outputs("dev", RES_ID);
    let id = outputs["id"].as_str().unwrap().to_owned();
    assert_eq!(outputs["x"], format!("one for {RES_ID}"));
    assert!(outputs.get("token").is_none(), "{outputs}");
    let secrets = sb.unsealed(
        "SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret \
         WHERE guresid = (SELECT guresid FROM resource WHERE type = 'tfdata')",
    );
    let secrets: Value = serde_json::from_str(&secrets[0]).unwrap();
    assert_eq!(secrets, json!({"token": SECRET_TOKEN}));
    // The state (which holds the token too) is kept sealed, in the driver cookie.
    let kept = cookies(&sb);
    assert_eq!(kept.len(), 1);
    assert!(kept[0].contains(&id), "{}", kept[0]);
    sb.assert_state_bytes_hide(&[SECRET_TOKEN]);

    // A new value updates the same terraform_data: the state was used.
    platform(&sb, &lifecycle_inputs(&marker, "two"));
    sb.commit("Another value");
    sb.gitplane(&["apply"]).ok();
    let outputs = sb.outputs("dev", RES_ID);
    assert_eq!(outputs["id"], id.as_str());
    assert_eq!(outputs["x"], format!("two for {RES_ID}"));

    // Without the workload's resource, terraform destroy runs with the kept state.
    assert!(!marker.exists());
    sb.write(
        "workloads/shop/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n",
    );
    sb.commit("No more data");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        "destroyed"
    );
    assert!(!sb.res_ids("dev").contains(RES_ID));
    assert!(cookies(&sb).is_empty());
    sb.assert_state_bytes_hide(&[SECRET_TOKEN]);
}

#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn a_failing_apply_keeps_its_state_so_the_fixed_commit_does_not_create_twice() {
    if !installed() {
        return;
    }
    let sb = Sandbox::new();
    let log = sb.root.join("created.log");
    let inputs = |fail: bool| {
        let code = format!(
            r#"variable "fail" {{}}
resource "terraform_data" "first" {{
  provisioner "local-exec" {{
    command = "echo created >> {}"
  }}
}}
resource "terraform_data" "second" {{
  depends_on = [terraform_data.first]
  provisioner "local-exec" {{
    command = var.fail ? "echo the second one fails >&2; exit 3" : "true"
  }}
}}
output "first" {{ value = terraform_data.first.id }}
"#,
            log.display()
        );
        format!(
            "    values:\n      script: |\n{}      variables:\n        fail: {fail}\n",
            indent(&code, 8)
        )
    };
    platform(&sb, &inputs(true));
    sb.commit("A second resource that fails");
    sb.gitplane(&["apply"]).fails();
    assert_eq!(sb.last_deployment("dev").status, "failed");
    let error = last_error(&sb);
    assert!(
        error.contains("terraform apply exited with code 1"),
        "{error}"
    );
    assert!(error.contains("the second one fails"), "{error}");
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);

    platform(&sb, &inputs(false));
    sb.commit("Fixed");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(sb.last_deployment("dev").status, "succeeded");
    let created = std::fs::read_to_string(&log).unwrap();
    assert_eq!(created.lines().count(), 1, "created twice: {created}");
}

#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn a_failed_precondition_fails_the_deployment_with_terraforms_message_and_no_secret() {
    if !installed() {
        return;
    }
    let sb = Sandbox::new();
    let code = r#"variable "token" {}
resource "terraform_data" "x" {
  lifecycle {
    precondition {
      condition     = startswith(var.token, "ok-")
      error_message = "The token must start with ok-."
    }
  }
}
"#;
    platform(
        &sb,
        &format!(
            "    values:\n      script: |\n{}    secrets:\n      variables:\n        token: {SECRET_TOKEN}\n",
            indent(code, 8)
        ),
    );
    sb.commit("A precondition that fails");
    let run = sb.gitplane(&["apply"]).fails();
    run.hides(&[SECRET_TOKEN]);
    assert_eq!(sb.last_deployment("dev").status, "failed");
    let error = last_error(&sb);
    assert!(error.contains("The token must start with ok-."), "{error}");
    // Terraform shows the value a failed condition read: gitplane removes it.
    assert!(error.contains("var.token is \"[redacted]\""), "{error}");
    assert!(!error.contains(SECRET_TOKEN), "{error}");
    sb.assert_state_bytes_hide(&[SECRET_TOKEN]);
}

#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn modules_come_from_a_folder_on_the_host_and_from_a_git_repository_at_a_rev() {
    if !installed() {
        return;
    }
    let sb = Sandbox::new();
    // A folder on the host, and the same module committed in the config repository itself.
    // Files gitplane does not read: HCL's `${` as it is.
    let module = |version: &str| {
        format!(
            "variable \"name\" {{}}\nresource \"terraform_data\" \"m\" {{ input = var.name }}\n\
             output \"greeting\" {{ value = \"{version}: hello ${{terraform_data.m.output}}\" }}\n"
        )
    };
    let folder: PathBuf = sb.root.join("modules-on-host/greeter");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("main.tf"), module("folder")).unwrap();
    let by_folder = format!(
        "    values:\n      source:\n        url: {}\n        path: greeter\n      variables:\n        \
         name: ${{context.app.id}}\n",
        folder.parent().unwrap().display()
    );
    platform(&sb, &by_folder);
    sb.commit("A module from a folder");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(sb.outputs("dev", RES_ID)["greeting"], "folder: hello shop");

    sb.write("tf/greeter/main.tf", &module("v1"));
    sb.commit("The module in git");
    sb.git(&["tag", "greeter-v1"]);
    sb.git(&["push", "--quiet", "origin", "greeter-v1"]);
    sb.write("tf/greeter/main.tf", &module("v2"));
    let by_git = format!(
        "    values:\n      source:\n        url: {}\n        rev: greeter-v1\n        \
         path: tf/greeter\n      variables:\n        name: ${{context.app.id}}\n",
        sb.origin.display()
    );
    platform(&sb, &by_git);
    sb.commit("Use the module from git, at its tag");
    sb.gitplane(&["apply"]).ok();
    assert_eq!(sb.outputs("dev", RES_ID)["greeting"], "v1: hello shop");
}

#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn the_time_limit_kills_a_slow_apply_quickly() {
    if !installed() {
        return;
    }
    let sb = Sandbox::new();
    let config = sb.root.join("host.yaml");
    std::fs::write(&config, "terraform:\n  timeout: 2s\n").unwrap();
    let code = r#"resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "sleep 600"
  }
}
"#;
    platform(
        &sb,
        &format!("    values:\n      script: |\n{}", indent(code, 8)),
    );
    sb.commit("A slow resource");
    let started = Instant::now();
    sb.gitplane(&["apply", "--config", config.to_str().unwrap()])
        .fails();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let error = last_error(&sb);
    assert!(
        error.contains("terraform apply did not finish within 2s"),
        "{error}"
    );
    // No `sleep 600` is left behind.
    let left = std::process::Command::new("pgrep")
        .args(["-f", "^sleep 600$"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    assert!(left.is_empty(), "still running: {left}");
}
