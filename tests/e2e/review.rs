//! `gitplane plan --ref BRANCH` as a pull request's review: what a branch pushed to the bare
//! repository would change against the applied state, as Markdown, text and JSON, secrets
//! hidden, state untouched; and the daemon's pull-request webhook that posts it.

use std::collections::BTreeSet;

use gitplane_testkit::{HttpServer, Reply, eventually_or};
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
            "json",
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
    // The backend's Score file asks for a queue: a change known now, beside what it reads.
    assert_eq!(
        certain,
        set(&[
            "shop/base-env.default#base-env",
            "shop/workload.default#modules.backend"
        ])
    );
    let base = updated
        .iter()
        .find(|u| u["resource"] == "shop/base-env.default#base-env")
        .unwrap();
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
    assert_eq!(j["summary"]["update"], 2);
    assert_eq!(j["summary"]["delete"], 2);

    let md = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "markdown"])
        .ok();
    md.hides(&[NEW_SECRET]).hides(&OLD_SECRETS);
    let first = md.stdout.lines().next().unwrap();
    let short = &sb.rev_parse("feature")[..12];
    assert!(
        first.starts_with(&format!(
            "**gitplane plan** for `{short}` (ref `feature`): 2 to create, 3 to update, 4 to \
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
        .gitplane(&["plan", "--ref", "feature", "--format", "json"])
        .ok()
        .json();
    let by_id = sb
        .gitplane(&["plan", "--ref", short, "--format", "json"])
        .ok()
        .json();
    assert_eq!(by_id["commit"], full["commit"]);
    assert_eq!(by_id["environments"], full["environments"]);
    let text = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "text"])
        .ok();
    text.hides(&[NEW_SECRET]).hides(&OLD_SECRETS);
    text.stdout_has("development: 1 to create, 2 to update, 2 to delete");

    // Nothing was recorded: no deployment, not a byte of the state file.
    assert_eq!(sb.count("SELECT COUNT(*) FROM deployment"), deployments);
    assert_eq!(std::fs::read(&sb.state).unwrap(), state_before);
}

/// `git count-objects -v` of the bare repository: what planning must not change.
fn objects_of(sb: &Sandbox) -> String {
    sb.git_in(&sb.origin, &["count-objects", "-v"])
}

/// Finding: a branch two commits behind main planned as reverting main's changes (an image
/// downgrade). It plans as its merge into main, says how far behind it is, and writes no git
/// object; a file both changed is refused by name rather than guessed.
#[test]
fn a_branch_behind_main_plans_its_merge_and_never_reverts_main() {
    let sb = Sandbox::applied();
    let base = sb.head();
    sb.git(&["checkout", "--quiet", "-b", "feature"]);
    sb.edit(
        "workloads/shop/frontend.yaml",
        "frontend:2.0.0",
        "frontend:2.1.0",
    );
    sb.git(&["commit", "--quiet", "-am", "Frontend 2.1.0"]);
    sb.git(&["push", "--quiet", "origin", "feature"]);
    sb.git(&["checkout", "--quiet", "main"]);
    sb.edit(
        "workloads/shop/backend.yaml",
        "backend:1.4.2",
        "backend:1.5.0",
    );
    sb.commit("Backend 1.5.0");
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    let main = sb.commit("Redis on 6380");
    sb.gitplane(&["apply"]).ok();
    let objects = objects_of(&sb);
    let state_before = std::fs::read(&sb.state).unwrap();

    let run = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "json"])
        .ok();
    let j = run.json();
    assert_eq!(j["commit"], sb.rev_parse("feature"));
    assert_eq!(j["merge"]["into"], "main");
    assert_eq!(j["merge"]["into_commit"], main.as_str());
    assert_eq!(j["merge"]["base"], base.as_str());
    assert_eq!(j["merge"]["behind"], 2);
    assert_eq!(j["merge"]["conflicts"], serde_json::json!([]));
    // Only the branch's own change: the frontend's image, in each environment. Main's backend
    // image and redis port are not undone.
    // (Needles that a commit id, in the output too, cannot hold by chance.)
    assert!(
        !run.stdout.contains("backend:1.4.2") && !run.stdout.contains("-> 6379"),
        "{run}"
    );
    assert_eq!(j["summary"]["update"], 2, "{j}");
    for key in ["create", "delete", "maybe_update", "forget"] {
        assert_eq!(j["summary"][key], 0, "{key}: {j}");
    }
    for env in j["environments"].as_array().unwrap() {
        let updated = &env["apps"][0]["updated"];
        assert_eq!(
            field(updated, "resource"),
            set(&["shop/workload.default#modules.frontend"]),
            "{env}"
        );
        assert_eq!(
            updated[0]["changes"],
            serde_json::json!([
                "resource.containers.web.image: \"registry.example.com/shop/frontend:2.0.0\" -> \
                 \"registry.example.com/shop/frontend:2.1.0\""
            ])
        );
    }
    let md = sb
        .gitplane(&["plan", "--ref", "feature", "--format", "markdown"])
        .ok();
    md.stdout_has(&format!(
        "> The branch is 2 commits behind `main` (`{}`): this plan shows the result of merging \
         it into `main`.",
        &main[..12]
    ));
    sb.gitplane(&["plan", "--ref", "feature", "--format", "text"])
        .ok()
        .stdout_has("the branch is 2 commits behind main");

    assert_eq!(objects_of(&sb), objects, "planning wrote a git object");

    // The watched ref itself plans with no merge and, as deployed, no change.
    let watched = sb
        .gitplane(&["plan", "--ref", "main", "--format", "json"])
        .ok()
        .json();
    assert_eq!(watched["merge"], Value::Null);
    assert_eq!(watched["summary"]["environments_changed"], 0, "{watched}");

    // Both sides changed the backend's file: refused, by name, nothing guessed.
    sb.git(&["checkout", "--quiet", "-b", "clash", &base]);
    sb.edit(
        "workloads/shop/backend.yaml",
        "backend:1.4.2",
        "backend:1.3.9",
    );
    sb.git(&["commit", "--quiet", "-am", "Backend 1.3.9"]);
    sb.git(&["push", "--quiet", "origin", "clash"]);
    let objects = objects_of(&sb);
    let clash = sb
        .gitplane(&["plan", "--ref", "clash", "--format", "json"])
        .fails();
    clash.stderr_has("workloads/shop/backend.yaml: changed both by the branch and by main");
    let j = clash.json();
    assert_eq!(
        j["merge"]["conflicts"],
        serde_json::json!(["workloads/shop/backend.yaml"])
    );
    assert_eq!(j["environments"], serde_json::json!([]));
    assert!(!clash.stdout.contains("1.3.9"), "{clash}");

    // Nothing written: no git object, not a byte of the state.
    assert_eq!(objects_of(&sb), objects);
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
            "json",
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
fn a_branch_that_does_not_load_reviews_as_rejected_and_exits_non_zero() {
    let sb = Sandbox::applied();
    sb.git(&["checkout", "--quiet", "-b", "broken"]);
    sb.write(
        "workloads/shop/backend.yaml",
        "apiVersion: score.dev/v1b1\ncontainers: [\n",
    );
    sb.git(&["add", "-A"]);
    sb.git(&["commit", "--quiet", "-m", "Broken"]);
    sb.git(&["push", "--quiet", "origin", "broken"]);
    let md = sb
        .gitplane(&["plan", "--ref", "broken", "--format", "markdown"])
        .fails();
    let first = md.stdout.lines().next().unwrap_or_default();
    assert!(first.contains(": rejected: 1 error(s)"), "{md}");
    md.stdout_has("workloads/shop/backend.yaml");
    let j = sb
        .gitplane(&["plan", "--ref", "broken", "--format", "json"])
        .fails()
        .json();
    assert_eq!(j["rejected"]["errors"].as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j["environments"], serde_json::json!([]));
}

#[test]
fn a_ref_that_names_nothing_is_a_clear_error() {
    let sb = Sandbox::applied();
    for format in ["markdown", "json", "text"] {
        let run = sb
            .gitplane(&["plan", "--ref", "no-such-branch", "--format", format])
            .fails();
        run.stderr_has("no-such-branch");
        assert!(run.stdout.is_empty(), "{run}");
    }
}

// ---------------------------------------------------------------------------------------------
// The pull-request webhook

/// `POST url` with `headers` and `body`: the status.
fn post(url: &str, headers: &[(&str, &str)], body: &[u8]) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build()
        .into();
    let mut request = agent.post(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request
        .send(body)
        .expect("the listener answers")
        .status()
        .as_u16()
}

fn hmac_hex(secret: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `n`th POST the plan hook received (waiting up to 30 s for it): its Authorization header
/// and its body as JSON.
#[track_caller]
fn received(server: &HttpServer, n: usize, daemon: &crate::daemon::Daemon) -> (String, Value) {
    let logged = eventually_or(
        format_args!("plan number {n} posted"),
        std::time::Duration::from_secs(30),
        || server.requests().into_iter().nth(n - 1),
        || format!("{}\n{}", server.describe_log(), daemon.log()),
    );
    let request = logged.request;
    (
        request
            .header("Authorization")
            .unwrap_or_default()
            .to_owned(),
        serde_json::from_str(&request.body).expect("the plan hook's body is JSON"),
    )
}

#[test]
fn a_signed_pull_request_webhook_posts_the_plan_of_its_head_and_an_unsigned_one_nothing() {
    let sb = Sandbox::template();
    let plan_server = HttpServer::start(|_| Reply::text(200, "ok"));
    let plan_port = plan_server.port();
    let port = crate::service::free_port();
    let secret = "whsec-pr-4b8e11";
    let token = "plan-bot-token-77a2";
    let secret_file = sb.root.join("webhook-secret");
    let token_file = sb.root.join("plan-token");
    std::fs::write(&secret_file, secret).unwrap();
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {}\nstate: {}\nhttp:\n  listen: 127.0.0.1:{port}\n  webhook_secret_file: {}\n  \
             plan_hook:\n    url: http://127.0.0.1:{plan_port}/plan\n    token_file: {}\n    \
             timeout: 10s\n",
            sb.origin.display(),
            sb.state.display(),
            secret_file.display(),
            token_file.display()
        ),
    )
    .unwrap();
    let daemon = crate::daemon::Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    crate::daemon::wait_deployed(
        &sb,
        &sb.head(),
        &["development", "production"],
        std::time::Duration::from_secs(30),
    );

    sb.git(&["checkout", "--quiet", "-b", "feature"]);
    let backend = sb.read("workloads/shop/backend.yaml");
    sb.write(
        "workloads/shop/backend.yaml",
        &format!("{backend}  queue:\n    type: redis\n"),
    );
    sb.git(&["add", "-A"]);
    sb.git(&["commit", "--quiet", "-m", "A queue"]);
    sb.git(&["push", "--quiet", "origin", "feature"]);
    let head = sb.head();
    let hook = format!("http://127.0.0.1:{port}/hooks/git");
    let github = format!(
        r#"{{"action":"opened","number":7,"pull_request":{{"number":7,"title":"A queue",
        "head":{{"sha":"{head}","ref":"feature"}},"base":{{"sha":"{head}","ref":"main"}}}}}}"#
    );
    let body = github.as_bytes();

    // Unsigned, or signed with another secret: 401, and nothing is posted.
    assert_eq!(
        post(&hook, &[("X-GitHub-Event", "pull_request")], body),
        401
    );
    let wrong = format!("sha256={}", hmac_hex("guess", body));
    assert_eq!(
        post(
            &hook,
            &[
                ("X-GitHub-Event", "pull_request"),
                ("X-Hub-Signature-256", &wrong)
            ],
            body
        ),
        401
    );
    // Signed but malformed: 400.
    let malformed = br#"{"action":"opened","pull_request":{"number":"seven"}}"#;
    let signature = format!("sha256={}", hmac_hex(secret, malformed));
    assert_eq!(
        post(
            &hook,
            &[
                ("X-GitHub-Event", "pull_request"),
                ("X-Hub-Signature-256", &signature)
            ],
            malformed
        ),
        400
    );

    let signature = format!("sha256={}", hmac_hex(secret, body));
    assert_eq!(
        post(
            &hook,
            &[
                ("X-GitHub-Event", "pull_request"),
                ("X-Hub-Signature-256", &signature)
            ],
            body
        ),
        202
    );
    let (auth, posted) = received(&plan_server, 1, &daemon);
    // The refused and the malformed webhooks came first and posted nothing: this is the first.
    assert_eq!(
        plan_server.requests().len(),
        1,
        "a refused webhook posted a plan: {}",
        plan_server.describe_log()
    );
    assert_eq!(auth, format!("Bearer {token}"));
    assert_eq!(posted["pull_request"], 7);
    assert_eq!(posted["head"], head.as_str());
    assert_eq!(posted["head_ref"], "feature");
    assert_eq!(posted["base_ref"], "main");
    assert_eq!(posted["provider"], "github");
    let markdown = posted["markdown"].as_str().unwrap();
    assert!(
        markdown.starts_with(&format!(
            "**gitplane plan** for `{}` (ref `feature`)",
            &head[..12]
        )),
        "{markdown}"
    );
    assert!(
        markdown.contains("create `shop/redis.default#modules.backend.externals.queue`"),
        "{markdown}"
    );
    assert_eq!(posted["plan"]["summary"]["create"], 2);
    assert!(!markdown.contains("dev-password-change-me"));

    // A GitLab merge request, with GitLab's token.
    let gitlab = format!(
        r#"{{"object_kind":"merge_request","object_attributes":{{"iid":3,"action":"update",
        "source_branch":"feature","target_branch":"main","last_commit":{{"id":"{head}"}}}}}}"#
    );
    assert_eq!(
        post(
            &hook,
            &[
                ("X-Gitlab-Event", "Merge Request Hook"),
                ("X-Gitlab-Token", secret)
            ],
            gitlab.as_bytes()
        ),
        202
    );
    let (_, posted) = received(&plan_server, 2, &daemon);
    assert_eq!(posted["pull_request"], 3);
    assert_eq!(posted["provider"], "gitlab");
    assert!(posted["markdown"].as_str().unwrap().contains("queue"));

    // No deployment came of the branch, and no secret reached the log.
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE commit_id = '{head}'"
        )),
        0
    );
    let log = daemon.log();
    assert!(!log.contains(token) && !log.contains(secret), "{log}");
    assert!(log.contains("plan posted"), "{log}");
}

/// Finding: a one-field definition change across 200 apps gave 307 KB of Markdown, which
/// GitHub refuses (over 65 536 characters). The comment stays under 60 000 characters, names
/// every changed app in its counts, and says how many resources it left out and how to see
/// them; `--detailed-exitcode` tells no change (0) from changes (2) and errors (1).
#[test]
fn a_200_app_plan_comment_fits_and_names_every_app_and_detailed_exitcode_tells_changes() {
    let sb = Sandbox::template();
    let shop: Vec<(String, String)> = ["backend.yaml", "frontend.yaml"]
        .iter()
        .map(|f| (f.to_string(), sb.read(&format!("workloads/shop/{f}"))))
        .collect();
    sb.remove("workloads/shop");
    for n in 0..200 {
        for (file, text) in &shop {
            sb.write(&format!("workloads/app-{n:03}/{file}"), text);
        }
    }
    sb.commit("200 apps");
    sb.gitplane(&["apply"]).ok();

    // Nothing to change: 0, with or without the flag, in every format.
    for format in ["table", "markdown", "json", "text"] {
        let run = sb.gitplane(&["plan", "--detailed-exitcode", "--format", format]);
        assert_eq!(run.code, Some(0), "{run}");
    }

    sb.git(&["checkout", "--quiet", "-b", "ha-db"]);
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal",
        "pghost: pg-ha.dev.internal",
    );
    sb.git(&["commit", "--quiet", "-am", "HA database host"]);
    sb.git(&["push", "--quiet", "origin", "ha-db"]);

    let md = sb
        .gitplane(&["plan", "--ref", "ha-db", "--format", "markdown"])
        .ok()
        .stdout;
    let chars = md.chars().count();
    assert!(chars < 60_000, "{chars} characters");
    md.lines()
        .next()
        .filter(|l| l.ends_with("200 to update, 0 to delete, 1000 may update in 1 environment"))
        .unwrap_or_else(|| panic!("{}", &md[..500]));
    assert!(
        md.contains("| development | 200 | 0 | 200 (+1000 may) | 0 |"),
        "{}",
        &md[..1500]
    );
    for n in 0..200 {
        assert!(
            md.contains(&format!("\n| app-{n:03} | 0 | 1 (+5 may) | 0 |")),
            "app-{n:03} is not named"
        );
    }
    let shown = md.matches("\n**app `").count();
    assert!(shown > 0 && shown < 200, "{shown}");
    let left = 200 - shown;
    let line = format!(
        "**{} more resources in {left} apps not shown here**: run `gitplane plan --ref ha-db \
         --env development --format text` to see every change.",
        left * 6
    );
    assert!(md.contains(&line), "{}", &md[md.len() - 1000..]);
    // That command shows them all.
    let text = sb
        .gitplane(&[
            "plan",
            "--ref",
            "ha-db",
            "--env",
            "development",
            "--format",
            "text",
        ])
        .ok()
        .stdout;
    for n in 0..200 {
        assert!(
            text.contains(&format!("  app app-{n:03}\n")),
            "app-{n:03} not in the text"
        );
    }

    // Changes: 2 with the flag (0 without), in every format.
    for format in ["table", "markdown", "json", "text"] {
        let run = sb.gitplane(&[
            "plan",
            "--ref",
            "ha-db",
            "--detailed-exitcode",
            "-o",
            format,
        ]);
        assert_eq!(run.code, Some(2), "{format}: {}", run.stderr);
        assert!(!run.stdout.is_empty(), "{format}");
    }
    assert_eq!(
        sb.gitplane(&["plan", "--ref", "ha-db", "-o", "text"]).code,
        Some(0)
    );
    // An error: 1, whatever changes.
    sb.write("workloads/app-000/backend.yaml", "containers: [\n");
    sb.git(&["commit", "--quiet", "-am", "Broken"]);
    sb.git(&["push", "--quiet", "origin", "ha-db"]);
    for format in ["table", "markdown"] {
        let run = sb.gitplane(&[
            "plan",
            "--ref",
            "ha-db",
            "--detailed-exitcode",
            "-o",
            format,
        ]);
        assert_eq!(run.code, Some(1), "{run}");
    }
    let run = sb.gitplane(&["plan", "--ref", "nothing-here", "--detailed-exitcode"]);
    assert_eq!(run.code, Some(1), "{run}");
}
