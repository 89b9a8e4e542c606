//! `gitplane plan --ref BRANCH` as a pull request's review: what a branch pushed to the bare
//! repository would change against the applied state, as Markdown, text and JSON, secrets
//! hidden, state untouched; and the daemon's pull-request webhook that posts it.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::util::Sandbox;

/// A secret the branch rotates: in the repository, never in any output.
const NEW_SECRET: &str = "rotated-9f3c1e-password";
/// Secrets the template holds.
const OLD_SECRETS: [&str; 2] = ["dev-password-change-me", "prod-password-change-me"];

/// The template applied on main, then branch `feature` pushed: a queue added to the backend, the
/// development database password rotated, the frontend removed, and the backend's DB_PORT
/// reading the database's host instead of its port.
fn applied_with_feature_branch() -> Sandbox {
    let sb = Sandbox::applied();
    sb.git(&["checkout", "--quiet", "-b", "feature"]);
    sb.edit(
        "definitions/base-env.yaml",
        "pgpassword: dev-password-change-me",
        &format!("pgpassword: {NEW_SECRET}"),
    );
    sb.edit(
        "workloads/shop/backend.yaml",
        "DB_PORT: ${resources.db.port}",
        "DB_PORT: ${resources.db.host}",
    );
    let backend = sb.read("workloads/shop/backend.yaml");
    sb.write(
        "workloads/shop/backend.yaml",
        &format!("{backend}  queue:\n    type: redis\n"),
    );
    sb.remove("workloads/shop/frontend.yaml");
    sb.git(&["add", "-A"]);
    sb.git(&[
        "commit",
        "--quiet",
        "-m",
        "Queue, rotated password, no frontend",
    ]);
    sb.git(&["push", "--quiet", "origin", "feature"]);
    sb
}

/// The values of `key` in each object of `items`.
fn field(items: &Value, key: &str) -> BTreeSet<String> {
    items
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {items}"))
        .iter()
        .map(|i| i[key].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_branch_plan_lists_exactly_what_it_changes_hides_secrets_and_changes_no_state() {
    let sb = applied_with_feature_branch();
    let deployments = sb.count("SELECT COUNT(*) FROM deployment");
    let state_before = std::fs::read(&sb.state).unwrap();

    let run = sb
        .gitplane(&[
            "plan",
            "--ref",
            "feature",
            "--env",
            "development",
            "--format",
            "review-json",
        ])
        .ok();
    run.hides(&[NEW_SECRET])
        .hides(&OLD_SECRETS)
        .hides(&["shop_dev"]);
    let j = run.json();
    assert_eq!(j["commit"], sb.rev_parse("feature"));
    assert_eq!(j["ref"], "feature");
    assert_eq!(j["rejected"], Value::Null);
    let env = &j["environments"][0];
    assert_eq!(env["env"], "development");
    assert_eq!(env["held"], Value::Null);
    let apps = env["apps"].as_array().unwrap();
    assert_eq!(apps.len(), 1, "{env}");
    let shop = &apps[0];
    assert_eq!(shop["app"], "shop");
    assert_eq!(
        field(&shop["created"], "resource"),
        set(&["shop/redis.default#modules.backend.externals.queue"])
    );
    assert_eq!(
        field(&shop["deleted"], "resource"),
        set(&[
            "shop/dns.default#modules.frontend.externals.dns",
            "shop/workload.default#modules.frontend"
        ])
    );
    // The base's password changes for sure; what reads the base may change once it has.
    let updated = shop["updated"].as_array().unwrap();
    let certain: BTreeSet<String> = updated
        .iter()
        .filter(|u| u["maybe"] == false)
        .map(|u| u["resource"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(certain, set(&["shop/base-env.default#base-env"]));
    let base = updated.iter().find(|u| u["maybe"] == false).unwrap();
    assert_eq!(
        base["changes"],
        serde_json::json!(["secrets.pgpassword: changed (secret)"])
    );
    assert_eq!(
        field(&shop["links"]["added"], "consumer"),
        set(&[
            "shop/redis.default#modules.backend.externals.queue",
            "shop/workload.default#modules.backend"
        ])
    );
    assert_eq!(
        field(&shop["links"]["removed"], "consumer"),
        set(&[
            "shop/dns.default#modules.frontend.externals.dns",
            "shop/workload.default#modules.frontend"
        ])
    );
    let changed = shop["bindings"]["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{shop}");
    assert_eq!(
        changed[0]["resource"],
        "shop/workload.default#modules.backend"
    );
    assert_eq!(
        changed[0]["input"],
        "resource.containers.api.variables.DB_PORT"
    );
    assert_eq!(changed[0]["from"]["output"], "outputs.port");
    assert_eq!(changed[0]["to"]["output"], "outputs.host");
    assert_eq!(
        field(&shop["bindings"]["added"], "resource"),
        set(&["shop/redis.default#modules.backend.externals.queue"])
    );
    assert_eq!(shop["bindings"]["removed"], serde_json::json!([]));
    assert_eq!(j["summary"]["create"], 1);
    assert_eq!(j["summary"]["update"], 1);
    assert_eq!(j["summary"]["delete"], 2);

    let md = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "markdown"])
        .ok();
    md.hides(&[NEW_SECRET]).hides(&OLD_SECRETS);
    let first = md.stdout.lines().next().unwrap();
    let short = &sb.rev_parse("feature")[..12];
    assert!(
        first.starts_with(&format!(
            "**gitplane plan** for `{short}` (ref `feature`): 2 to create, 2 to update, 4 to \
             delete"
        )) && first.ends_with("in 2 environments"),
        "{first}"
    );
    assert!(
        md.stdout
            .contains("<details><summary>development: changes by resource</summary>")
    );
    assert!(
        md.stdout
            .contains("<details><summary>production: changes by resource</summary>")
    );
    assert!(md.stdout.contains("</details>"));
    md.stdout_has("create `shop/redis.default#modules.backend.externals.queue`")
        .stdout_has("delete `shop/workload.default#modules.frontend`")
        .stdout_has("`secrets.pgpassword: changed (secret)`");

    // Byte for byte the same the second time, and the short id names the same commit.
    let again = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "markdown"])
        .ok();
    assert_eq!(md.stdout, again.stdout);
    let full = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "review-json"])
        .ok()
        .json();
    let by_id = sb
        .gitplane(&["plan", "--ref", short, "--format", "review-json"])
        .ok()
        .json();
    assert_eq!(by_id["commit"], full["commit"]);
    assert_eq!(by_id["environments"], full["environments"]);
    let text = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "text"])
        .ok();
    text.hides(&[NEW_SECRET]).hides(&OLD_SECRETS);
    text.stdout_has("development: 1 to create, 1 to update, 2 to delete");

    // Nothing was recorded: no deployment, not a byte of the state file.
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), deployments);
    assert_eq!(std::fs::read(&sb.state).unwrap(), state_before);
}

#[test]
fn a_branch_that_would_delete_most_resources_shows_as_held() {
    let sb = Sandbox::applied();
    sb.git(&["checkout", "--quiet", "-b", "cleanup"]);
    sb.remove("workloads/shop");
    sb.write("workloads/other/api.yaml", "apiVersion: score.dev/v1b1\nmetadata:\n  name: api\ncontainers:\n  main:\n    image: nginx\n");
    sb.git(&["add", "-A"]);
    sb.git(&["commit", "--quiet", "-m", "Remove the shop"]);
    sb.git(&["push", "--quiet", "origin", "cleanup"]);
    let run = sb
        .gitplane(&[
            "plan",
            "--ref",
            "cleanup",
            "--env",
            "development",
            "--format",
            "review-json",
        ])
        .ok();
    let j = run.json();
    let held = &j["environments"][0]["held"];
    assert!(
        held["reason"].as_str().unwrap().contains("it would delete"),
        "{held}"
    );
    assert_eq!(held["resources"].as_array().unwrap().len(), 6, "{held}");
    assert_eq!(j["summary"]["environments_held"], 1);
    sb.gitplane(&["plan", "--ref", "cleanup", "--format", "markdown"])
        .ok()
        .stdout_has("**Held by the deletion guard**");
}

#[test]
fn a_ref_that_names_nothing_is_a_clear_error() {
    let sb = Sandbox::applied();
    for format in ["markdown", "review-json", "text"] {
        let run = sb
            .gitplane(&["plan", "--ref", "no-such-branch", "--format", format])
            .fails();
        run.stderr_has("no-such-branch");
        assert!(run.stdout.is_empty(), "{run}");
    }
}
