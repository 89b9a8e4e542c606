//! `gitplane explain RESOURCE`: the definition a resource matched and why the others lost, where
//! each input comes from, its outputs, its links both ways and its history; never a secret.

use serde_json::Value;

use crate::util::{Run, Sandbox, template_dir};

const DEV_DB: &str = "shop/postgres.default#modules.backend.externals.db";
const SECRETS: [&str; 2] = ["dev-password-change-me", "prod-password-change-me"];

/// The 1-based line of the template file `rel` that contains `needle`.
fn line_of(rel: &str, needle: &str) -> usize {
    let text = std::fs::read_to_string(template_dir().join(rel)).unwrap();
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{rel} has no {needle:?}"))
        + 1
}

#[track_caller]
fn assert_no_secret(run: &Run) {
    run.hides(&SECRETS);
}

/// The chain of `values.host` ends at base-env's literal, with its file and line.
#[track_caller]
fn has_pghost_literal(inputs: &[&str], run: &Run) {
    has_line(
        inputs,
        &[
            "its values.pghost is the literal \"pg.dev.internal\"",
            &format!(
                "definitions/base-env.yaml:{}",
                line_of("definitions/base-env.yaml", "pghost: pg.dev.internal")
            ),
        ],
        run,
    );
}

/// The lines of a table section, from its title to the next blank line.
fn section<'a>(run: &'a Run, title: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = run.stdout.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(title))
        .unwrap_or_else(|| panic!("no section {title:?}:{run}"));
    lines[start..]
        .iter()
        .take_while(|l| !l.is_empty())
        .copied()
        .collect()
}

#[track_caller]
fn has_line(lines: &[&str], needles: &[&str], run: &Run) {
    assert!(
        lines.iter().any(|l| needles.iter().all(|n| l.contains(n))),
        "no line with all of {needles:?}:{run}"
    );
}

fn dev_guresid(sb: &Sandbox, res_id: &str) -> String {
    sb.column(&format!(
        "SELECT guresid FROM resource WHERE env = 'development' AND res_id = '{res_id}'"
    ))
    .remove(0)
}

#[test]
fn explains_the_match_inputs_outputs_links_and_history_of_a_resource() {
    let sb = Sandbox::applied();
    let run = sb
        .gitplane(&["explain", DEV_DB, "--env", "development"])
        .ok();
    assert_no_secret(&run);
    let guresid = dev_guresid(&sb, "modules.backend.externals.db");
    run.stdout_has(DEV_DB).stdout_has(&guresid);

    // The definition: postgres-dev by its rule, postgres-prod lost on env_type.
    let def = section(&run, "DEFINITION");
    has_line(&def, &["postgres-dev"], &run);
    has_line(
        &def,
        &[
            "postgres-dev",
            "chosen",
            "{env_type: development, class: default}",
            &format!(
                "definitions/postgres.yaml:{}",
                line_of("definitions/postgres.yaml", "- env_type: development")
            ),
        ],
        &run,
    );
    has_line(
        &def,
        &[
            "postgres-prod",
            "no match",
            "{env_type: production, class: default}",
            "env_type is development, the rule wants production",
        ],
        &run,
    );

    // Inputs: values.host comes from base-env's output pghost, a literal in base-env.yaml.
    let inputs = section(&run, "INPUTS");
    has_line(&inputs, &["values.host = \"pg.dev.internal\""], &run);
    has_line(
        &inputs,
        &["<- shop/base-env.default#base-env outputs.pghost = \"pg.dev.internal\""],
        &run,
    );
    has_pghost_literal(&inputs, &run);
    has_line(
        &inputs,
        &["its values.pghost", "base-env-development"],
        &run,
    );
    has_line(&inputs, &["values.port = 5432"], &run);
    has_line(
        &inputs,
        &["values.name = \"shop_development\"", "literal at"],
        &run,
    );
    // The secret input: only that it is secret, and where it is written.
    has_line(&inputs, &["secrets.password = (secret)"], &run);
    has_line(&inputs, &["outputs.pgpassword = (secret)"], &run);
    has_line(
        &inputs,
        &[
            "its secrets.pgpassword is a secret literal",
            &format!(
                "definitions/base-env.yaml:{}",
                line_of("definitions/base-env.yaml", "pgpassword: dev-password")
            ),
        ],
        &run,
    );

    // Outputs: values, and the secret ones by name only.
    let outputs = section(&run, "OUTPUTS");
    has_line(&outputs, &["host = \"pg.dev.internal\""], &run);
    has_line(&outputs, &["secret outputs", "password", "username"], &run);
    assert!(
        !outputs.iter().any(|l| l.contains("password =")),
        "a secret output has a value:{run}"
    );

    // Links both ways.
    let depends_on = section(&run, "DEPENDS ON");
    has_line(
        &depends_on,
        &[
            "shop/base-env.default#base-env",
            "reference",
            "NeedsProvides",
        ],
        &run,
    );
    let dependents = section(&run, "DEPENDED ON BY");
    has_line(
        &dependents,
        &["shop/workload.default#modules.backend"],
        &run,
    );

    // History: the create.
    let ops = section(&run, "OPERATIONS");
    let deployment = sb.last_deployment("development");
    has_line(
        &ops,
        &[
            &deployment.id.to_string(),
            &deployment.commit[..12],
            "create",
            "succeeded",
            "new resource",
        ],
        &run,
    );

    // By GUResID, without --env: the same explanation.
    let by_id = sb.gitplane(&["explain", &guresid]).ok();
    assert_eq!(by_id.stdout, run.stdout);
}

#[test]
fn production_chooses_the_other_definition_and_says_why() {
    let sb = Sandbox::applied();
    let run = sb
        .gitplane(&[
            "explain",
            "shop/postgres.default#modules.backend.externals.db",
            "--env",
            "production",
        ])
        .ok();
    assert_no_secret(&run);
    let def = section(&run, "DEFINITION");
    has_line(&def, &["postgres-prod", "chosen"], &run);
    has_line(
        &def,
        &[
            "postgres-dev",
            "no match",
            "env_type is production, the rule wants development",
        ],
        &run,
    );
    has_line(
        &section(&run, "INPUTS"),
        &["values.host = \"pg-ha.prod.internal\""],
        &run,
    );
}

#[test]
fn the_history_shows_an_update_first_after_a_change() {
    let sb = Sandbox::applied();
    let first = sb.head();
    sb.edit(
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal\n      pgport: 5432",
        "pghost: pg.dev.internal\n      pgport: 6432",
    );
    sb.commit("Move the development database server");
    sb.gitplane(&["apply", "--env", "development"]).ok();

    let run = sb
        .gitplane(&["explain", DEV_DB, "--env", "development"])
        .ok();
    assert_no_secret(&run);
    let inputs = section(&run, "INPUTS");
    has_line(&inputs, &["values.port = 6432"], &run);
    has_line(
        &inputs,
        &[
            "its values.pgport is the literal 6432",
            &format!(
                "definitions/base-env.yaml:{}",
                line_of("definitions/base-env.yaml", "pgport: 5432")
            ),
        ],
        &run,
    );
    let ops = section(&run, "OPERATIONS");
    // Title, header, then the operations newest first.
    assert_eq!(ops.len(), 4, "two operations expected:{run}");
    assert!(
        ops[2].contains("update") && ops[2].contains(&sb.head()[..12]),
        "the update first:{run}"
    );
    assert!(
        ops[3].contains("create") && ops[3].contains(&first[..12]),
        "then the create:{run}"
    );

    let json = sb
        .gitplane(&[
            "explain",
            DEV_DB,
            "--env",
            "development",
            "--format",
            "json",
        ])
        .ok()
        .json();
    let actions: Vec<&str> = json["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["update", "create"]);
    assert_eq!(json["operations"][0]["commit"], sb.head());
    assert_eq!(json["operations"][0]["reason"], "inputs changed");

    // At the first commit (--rev) the chain ends at the literal that was there then; the value
    // as last applied stays the state's.
    let old = sb
        .gitplane(&["explain", DEV_DB, "--env", "development", "--rev", &first])
        .ok();
    old.stdout_has(&format!("at commit {}", &first[..12]));
    has_line(
        &section(&old, "INPUTS"),
        &["its values.pgport is the literal 5432"],
        &old,
    );
    has_line(&section(&old, "INPUTS"), &["values.port = 6432"], &old);
}

#[test]
fn json_has_every_section_and_no_secret() {
    let sb = Sandbox::applied();
    let run = sb
        .gitplane(&[
            "explain",
            DEV_DB,
            "--env",
            "development",
            "--format",
            "json",
        ])
        .ok();
    assert_no_secret(&run);
    let j = run.json();
    for key in [
        "resource",
        "commit",
        "in_graph",
        "match",
        "inputs",
        "outputs",
        "links",
        "operations",
    ] {
        assert!(j.get(key).is_some(), "no {key}:{run}");
    }
    assert_eq!(j["resource"]["label"], DEV_DB);
    assert_eq!(j["resource"]["env"], "development");
    assert_eq!(j["resource"]["definition"], "postgres-dev");
    assert_eq!(j["resource"]["status"], "ready");
    assert_eq!(j["commit"], sb.head());
    assert_eq!(j["in_graph"], true);

    let candidates = j["match"]["candidates"].as_array().unwrap();
    assert_eq!(candidates[0]["definition"], "postgres-dev");
    assert_eq!(candidates[0]["chosen"], true);
    assert_eq!(
        candidates[0]["rule"],
        "{env_type: development, class: default}"
    );
    let prod = &candidates[1];
    assert_eq!(prod["definition"], "postgres-prod");
    assert_eq!(prod["chosen"], false);
    assert_eq!(prod["matched"], false);
    assert_eq!(
        prod["reason"],
        "env_type is development, the rule wants production"
    );

    let input = |path: &str| -> &Value {
        j["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["path"] == path)
            .unwrap_or_else(|| panic!("no input {path}:{run}"))
    };
    let host = input("values.host");
    assert_eq!(host["value"], "pg.dev.internal");
    let hop = &host["from"][0];
    assert_eq!(hop["label"], "shop/base-env.default#base-env");
    assert_eq!(hop["output"], "outputs.pghost");
    assert_eq!(hop["value"], "pg.dev.internal");
    assert_eq!(hop["then"]["input"], "values.pghost");
    assert_eq!(hop["then"]["literal"]["value"], "pg.dev.internal");
    assert_eq!(
        hop["then"]["literal"]["location"],
        format!(
            "definitions/base-env.yaml:{}",
            line_of("definitions/base-env.yaml", "pghost: pg.dev.internal")
        )
    );
    let password = input("secrets.password");
    assert_eq!(password["secret"], true);
    assert_eq!(password["value"], Value::Null);
    assert_eq!(password["from"][0]["secret"], true);
    assert_eq!(password["from"][0]["then"]["literal"]["value"], Value::Null);

    assert_eq!(j["outputs"]["values"]["host"], "pg.dev.internal");
    assert!(j["outputs"]["values"].get("password").is_none());
    let names: Vec<&str> = j["outputs"]["secret_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(names, ["password", "username"]);

    let labels = |key: &str| -> Vec<String> {
        j["links"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["label"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(labels("depends_on"), ["shop/base-env.default#base-env"]);
    assert_eq!(
        labels("dependents"),
        ["shop/workload.default#modules.backend"]
    );
    assert_eq!(j["links"]["depends_on"][0]["update_type"], "NeedsProvides");

    let ops = j["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["action"], "create");
    assert_eq!(ops[0]["status"], "succeeded");
    assert_eq!(ops[0]["commit"], sb.head());
}

#[test]
fn a_workload_shows_where_each_score_variable_comes_from() {
    let sb = Sandbox::applied();
    let run = sb
        .gitplane(&[
            "explain",
            "shop/workload.default#modules.backend",
            "--env",
            "development",
        ])
        .ok();
    assert_no_secret(&run);
    let inputs = section(&run, "INPUTS");
    // Two hops: the workload reads postgres, whose host is base-env's pghost.
    has_line(
        &inputs,
        &[
            "resource.containers.api.variables.DB_HOST = \"pg.dev.internal\"",
            &format!(
                "workloads/shop/backend.yaml:{}",
                line_of("workloads/shop/backend.yaml", "DB_HOST")
            ),
        ],
        &run,
    );
    has_line(
        &inputs,
        &["<- ", DEV_DB, "outputs.host = \"pg.dev.internal\""],
        &run,
    );
    has_line(
        &inputs,
        &["its values.pghost is the literal \"pg.dev.internal\""],
        &run,
    );
    // A string of text and two placeholders.
    has_line(
        &inputs,
        &["CACHE_URL = \"redis://redis.dev.internal:6379\""],
        &run,
    );
    has_line(&inputs, &["DB_PASSWORD = (secret)"], &run);
}

#[test]
fn an_orphan_is_explained_from_state() {
    let sb = Sandbox::applied();
    sb.remove("workloads/shop/frontend.yaml");
    sb.commit("Retire the frontend");
    let dns = "shop/dns.default#modules.frontend.externals.dns";
    let run = sb.gitplane(&["explain", dns, "--env", "development"]).ok();
    assert_no_secret(&run);
    run.stdout_has("orphan");
    // From the recorded bindings: the input as last sent, and the output it read.
    let inputs = section(&run, "INPUTS");
    has_line(
        &inputs,
        &["values.host = \"shop.dev.shop.example.com\""],
        &run,
    );
    has_line(
        &inputs,
        &["<- shop/base-env.default#base-env outputs.dns_zone = \"dev.shop.example.com\""],
        &run,
    );
    has_line(
        &section(&run, "OUTPUTS"),
        &["host = \"shop.dev.shop.example.com\""],
        &run,
    );
    has_line(&section(&run, "OPERATIONS"), &["create"], &run);
    let j = sb
        .gitplane(&["explain", dns, "--env", "development", "--format", "json"])
        .ok()
        .json();
    assert_eq!(j["in_graph"], false);
    assert_eq!(j["match"], Value::Null);
    assert!(j["note"].as_str().unwrap().contains("orphan"));
}

#[test]
fn a_commit_that_does_not_build_still_shows_the_state() {
    let sb = Sandbox::applied();
    sb.write("definitions/broken.yaml", "kind: [\n");
    sb.commit("Break the repository");
    let run = sb
        .gitplane(&["explain", DEV_DB, "--env", "development"])
        .ok();
    assert_no_secret(&run);
    run.stdout_has("does not build")
        .stderr_has("definitions/broken.yaml");
    has_line(
        &section(&run, "OUTPUTS"),
        &["host = \"pg.dev.internal\""],
        &run,
    );
    let inputs = section(&run, "INPUTS");
    has_line(&inputs, &["values.host = \"pg.dev.internal\""], &run);
    has_line(&inputs, &["outputs.pghost = \"pg.dev.internal\""], &run);
    has_line(
        &inputs,
        &["values.name = \"shop_development\"", "literal"],
        &run,
    );
    has_line(&inputs, &["secrets.password = (secret)"], &run);
}

#[test]
fn an_unknown_or_ambiguous_resource_is_an_error() {
    let sb = Sandbox::applied();
    let run = sb
        .gitplane(&[
            "explain",
            "shop/postgres.default#modules.nope",
            "--env",
            "development",
        ])
        .fails();
    run.stderr_has(&format!(
        "no resource is shop/postgres.default#modules.nope, neither recorded nor in the graph \
         of commit {}",
        &sb.head()[..12]
    ));
    assert!(run.stdout.is_empty(), "{run}");

    let run = sb
        .gitplane(&["explain", "shop/base-env.default#base-env"])
        .fails();
    run.stderr_has("is recorded in several environments (development, production)")
        .stderr_has("pass --env");

    // Not applied yet, the graph still knows which environments have it.
    let run = Sandbox::template().gitplane(&["explain", DEV_DB]).fails();
    run.stderr_has("is in the graphs of several environments (development, production)");
}

#[test]
fn a_resource_not_applied_yet_is_explained_from_the_graph() {
    // No state file at all: explain reads the commit, changes nothing, creates nothing.
    let sb = Sandbox::template();
    let run = sb
        .gitplane(&["explain", DEV_DB, "--env", "development"])
        .ok();
    assert_no_secret(&run);
    assert!(!sb.state.exists(), "explain created a state file");
    run.stdout_has(DEV_DB);
    has_line(
        &run.stdout.lines().collect::<Vec<_>>(),
        &["status", "not provisioned yet"],
        &run,
    );

    let def = section(&run, "DEFINITION");
    has_line(&def, &["postgres-dev", "chosen"], &run);
    has_line(&def, &["postgres-prod", "no match"], &run);
    has_line(
        &def,
        &[&format!(
            "not recorded yet: the next apply of commit {}",
            &sb.head()[..12]
        )],
        &run,
    );
    // Where each input comes from is known; values from unprovisioned resources are not.
    let inputs = section(&run, "INPUTS");
    has_line(&inputs, &["values.host = (not known)"], &run);
    has_line(
        &inputs,
        &["<- shop/base-env.default#base-env outputs.pghost"],
        &run,
    );
    has_pghost_literal(&inputs, &run);
    has_line(&inputs, &["values.port = (not known)"], &run);
    has_line(
        &section(&run, "OUTPUTS"),
        &["not known until it is provisioned"],
        &run,
    );
    has_line(
        &section(&run, "DEPENDS ON"),
        &["shop/base-env.default#base-env", "reference"],
        &run,
    );
    has_line(&section(&run, "OPERATIONS"), &["none"], &run);

    let json = sb
        .gitplane(&[
            "explain",
            DEV_DB,
            "--env",
            "development",
            "--format",
            "json",
        ])
        .ok()
        .json();
    assert_eq!(json["recorded"], false);
    assert_eq!(json["resource"]["status"], "planned");
    assert_eq!(json["resource"]["commit"], Value::Null);
    assert_eq!(json["match"]["definition"], "postgres-dev");

    // Once applied, a resource added by a later commit is explained the same way.
    sb.gitplane(&["apply"]).ok();
    sb.write(
        "workloads/shop/cache.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: cache\ncontainers:\n  main:\n    \
         image: redis\nresources:\n  db:\n    type: postgres\n",
    );
    sb.commit("a cache workload with its own database");
    let run = sb
        .gitplane(&[
            "explain",
            "shop/postgres.default#modules.cache.externals.db",
            "--env",
            "development",
        ])
        .ok();
    // Its base-env is provisioned: that value is known now.
    has_line(
        &section(&run, "INPUTS"),
        &["values.host = \"pg.dev.internal\""],
        &run,
    );
}
