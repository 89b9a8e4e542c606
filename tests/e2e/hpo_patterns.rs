//! Patterns from real Humanitec definitions, in files written in their shape: a chained selector
//! (a role granting its workloads' policies), an account chosen per environment through a
//! `config` resource (`driver_account: ${resources['config.default#aws'].account}`), and
//! manifests whose `data` is the Kubernetes object as YAML text (Humanitec's example library).

use serde_json::{Value, json};

use crate::util::{Definition, Sandbox, definitions};

/// A driver script that records each request's JSON and answers with its values as outputs.
const RECORDING_DRIVER: &str = r#"#!/bin/sh
cat > "$0.request.$$.json"
printf '{"status": "done", "resource": {"values": {"bucket": "made"}, "secrets": {}}}'
"#;

fn definition(id: &str, res_type: &str, body: &str) -> String {
    format!(
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n\
         entity:\n  type: {res_type}\n{body}"
    )
}

fn workload(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: {name}\ncontainers:\n  main:\n    \
         image: registry.example.com/{name}:1\nresources:\n{resources}"
    )
}

const WORKLOAD_DEFINITION: &str = "  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n      \
     role: ${resources['aws-role.default#app-role'].outputs.name}\n  criteria:\n    - {}\n";

/// `${resources["aws-role<workload>aws-policy"].outputs.arn}`: the role lists the policies of
/// the workloads that use it, each step from the set the step before selected, and is
/// provisioned after them.
#[test]
fn a_chained_selector_gives_the_role_its_workloads_policies() {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    sb.write(
        "workloads/shop/api.yaml",
        &workload("api", "  orders:\n    type: aws-policy\n"),
    );
    sb.write(
        "workloads/shop/worker.yaml",
        &workload(
            "worker",
            "  queue:\n    type: aws-policy\n  cache:\n    type: redis\n",
        ),
    );
    sb.write(
        "definitions/workload.yaml",
        &definition("workload", "workload", WORKLOAD_DEFINITION),
    );
    sb.write(
        "definitions/aws-role.yaml",
        &definition(
            "aws-role",
            "aws-role",
            "  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n      \
             name: role-${context.app.id}\n      \
             policies: ${resources[\"aws-role<workload>aws-policy\"].outputs.arn}\n  \
             criteria:\n    - {}\n",
        ),
    );
    sb.write(
        "definitions/aws-policy.yaml",
        &definition(
            "aws-policy",
            "aws-policy",
            "  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n      \
             arn: arn:aws:iam::1:policy/${context.res.id}\n  criteria:\n    - {}\n",
        ),
    );
    sb.write(
        "definitions/redis.yaml",
        &definition(
            "redis",
            "redis",
            "  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n      \
             arn: not-a-policy\n  criteria:\n    - {}\n",
        ),
    );
    sb.commit("A role that grants its workloads' policies");
    sb.gitplane(&["validate"]).ok();
    sb.gitplane(&["apply"]).ok();
    assert_eq!(
        sb.outputs("development", "app-role")["policies"],
        json!([
            "arn:aws:iam::1:policy/modules.api.externals.orders",
            "arn:aws:iam::1:policy/modules.worker.externals.queue"
        ])
    );
    // The role is provisioned after the policies it lists: selector edges in the record.
    let selected = sb.column(
        "SELECT p.res_id FROM edge e JOIN resource r ON r.guresid = e.from_guresid \
         JOIN resource p ON p.guresid = e.to_guresid \
         WHERE r.res_id = 'app-role' AND e.kind = 'selector' ORDER BY p.res_id",
    );
    assert_eq!(
        selected,
        [
            "modules.api.externals.orders",
            "modules.worker.externals.queue"
        ]
    );
}

/// Every Terraform definition of a repository names its account through one `config`
/// resource, whose definition per environment names the account: each environment's resources
/// run with that environment's credentials.
#[test]
fn an_account_placeholder_runs_each_environment_with_its_config_resources_account() {
    let sb = Sandbox::new();
    let script = sb.root.join("s3-driver");
    std::fs::write(&script, RECORDING_DRIVER).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for (account, key) in [("aws-dev", "dev-key-1"), ("aws-prod", "prod-key-2")] {
        std::fs::write(
            sb.root.join(format!("{account}.json")),
            format!(r#"{{"access_key_id": "{key}"}}"#),
        )
        .unwrap();
    }
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "drivers:\n  acme/s3:\n    exec: {{command: [\"{}\"], timeout: 10s}}\n\
             accounts:\n  aws-dev: {{file: {root}/aws-dev.json}}\n  \
             aws-prod: {{file: {root}/aws-prod.json}}\n",
            script.display(),
            root = sb.root.display()
        ),
    )
    .unwrap();
    for env in ["development", "production"] {
        sb.write(
            &format!("environments/{env}.yaml"),
            &format!("type: {env}\nimplicit_resources: []\n"),
        );
        sb.write(
            &format!("definitions/config-{env}.yaml"),
            &definition(
                &format!("aws-config-{env}"),
                "config",
                &format!(
                    "  driver_type: humanitec/echo\n  driver_account: aws-{}\n  \
                     driver_inputs:\n    values: {{}}\n  criteria:\n    - env_id: {env}\n      \
                     res_id: aws\n",
                    &env[..if env == "development" { 3 } else { 4 }]
                ),
            ),
        );
    }
    sb.write(
        "workloads/shop/api.yaml",
        &workload("api", "  files:\n    type: s3\n"),
    );
    sb.write(
        "definitions/workload.yaml",
        &definitions(&[Definition::new("workload", "humanitec/echo")]),
    );
    sb.write(
        "definitions/s3.yaml",
        &definition(
            "s3",
            "s3",
            "  driver_type: acme/s3\n  \
             driver_account: ${resources['config.default#aws'].account}\n  \
             driver_inputs:\n    values:\n      region: eu-west-1\n  criteria:\n    - {}\n",
        ),
    );
    sb.commit("s3 buckets with the environment's account");
    let config = config.to_str().unwrap();
    sb.gitplane(&["validate", "--config", config]).ok();
    sb.gitplane(&["apply", "--config", config]).ok();

    let mut keys: Vec<(String, String)> = std::fs::read_dir(&sb.root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("s3-driver.request."))
        .map(|p| {
            let r: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            (
                r["env"].as_str().unwrap().to_owned(),
                r["driver"]["secrets"]["account"]["access_key_id"]
                    .as_str()
                    .unwrap_or("none")
                    .to_owned(),
            )
        })
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            ("development".to_owned(), "dev-key-1".to_owned()),
            ("production".to_owned(), "prod-key-2".to_owned())
        ]
    );
    assert_eq!(
        sb.rows("SELECT env, account FROM resource WHERE type = 's3' ORDER BY env"),
        [["development", "aws-dev"], ["production", "aws-prod"]]
    );
    // The bucket depends on the config resource that names its account.
    assert_eq!(
        sb.count(
            "SELECT COUNT(*) FROM edge e JOIN resource r ON r.guresid = e.from_guresid \
             JOIN resource c ON c.guresid = e.to_guresid \
             WHERE r.type = 's3' AND c.type = 'config' AND e.kind = 'reference'"
        ),
        2
    );

    // A config definition without an account: validate names the reference's file and line.
    sb.edit(
        "definitions/config-production.yaml",
        "  driver_account: aws-prod\n",
        "",
    );
    sb.commit("The production config forgets its account");
    let before = sb.resource_rows();
    let run = sb.gitplane(&["validate", "--config", config]).fails();
    run.stderr_has(
        "definitions/s3.yaml:8: the driver_account of shop/s3.default#modules.api.externals.files \
         is the account of shop/config.default#aws ('config.default#aws'), whose definition \
         'aws-config-production' names no driver_account: give it one",
    );
    sb.gitplane(&["apply", "--config", config]).fails();
    assert_eq!(
        sb.resource_rows(),
        before,
        "a refused commit changes nothing"
    );
}

/// `templates.manifests` entries written `data: |`, the object as YAML text, as Humanitec's
/// example library writes them (its propagate-id pattern): the object itself reaches the
/// manifests; text that is not one mapping is refused naming the manifest.
#[test]
fn manifest_data_written_as_yaml_text_is_the_kubernetes_object() {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    sb.write(
        "workloads/shop/api.yaml",
        &workload("api", "  id-config:\n    type: config\n"),
    );
    sb.write(
        "definitions/workload.yaml",
        &definitions(&[Definition::new("workload", "humanitec/echo")]),
    );
    let config = |data: &str| {
        definition(
            "propagate-id",
            "config",
            &format!(
                "  driver_type: humanitec/template\n  driver_inputs:\n    values:\n      \
                 templates:\n        manifests: |\n          config-map.yaml:\n            \
                 location: namespace\n            data: |\n{}\n        \
                 outputs: |\n          id: {{{{ .id }}}}\n  criteria:\n    - {{}}\n",
                data.lines()
                    .map(|l| format!("              {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        )
    };
    sb.write(
        "definitions/config.yaml",
        &config(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .id | trunc 20 }}\n\
             data:\n  res_id: {{ .context.res.id }}",
        ),
    );
    sb.commit("A ConfigMap named after the resource");
    sb.gitplane(&["apply"]).ok();
    let run = sb
        .gitplane(&["manifests", "--env", "development", "--format", "json"])
        .ok();
    let objects = run.json();
    let config_map = objects["items"]
        .as_array()
        .and_then(|all| all.iter().find(|o| o["kind"] == "ConfigMap"))
        .unwrap_or_else(|| panic!("no ConfigMap in {objects:#}"));
    assert_eq!(config_map["apiVersion"], "v1");
    assert_eq!(
        config_map["data"]["res_id"],
        "modules.api.externals.id-config"
    );

    // Two documents in the text: the apply fails, naming the manifest.
    sb.write(
        "definitions/config.yaml",
        &config("kind: ConfigMap\n---\nkind: Secret"),
    );
    sb.commit("Two objects in one manifest");
    let run = sb.gitplane(&["apply"]).fails();
    run.stderr_has("manifests.config-map.yaml.data: the rendered text is not valid YAML");
}

/// A workload written for score-humanitec, which passed `${values.KEY}` and `${shared.ID...}`
/// to HPO: the app's `values.yaml` (with a production override) and the environment's shared
/// dns, read by the generated Deployment; a value the app does not set, or an override of an
/// environment that does not exist, is refused with its file and line and changes nothing.
#[test]
fn app_values_and_shared_resources_reach_a_score_humanitec_workload() {
    let sb = Sandbox::new();
    for env in ["development", "production"] {
        sb.write(
            &format!("environments/{env}.yaml"),
            &format!(
                "type: {env}\nimplicit_resources: []\nshared_resources:\n  dns: {{type: dns}}\n"
            ),
        );
    }
    sb.write(
        "workloads/shop/api.yaml",
        "# Written for score-humanitec.\napiVersion: score.dev/v1b1\nmetadata:\n  name: api\n\
         containers:\n  api:\n    image: registry.example.com/api:${values.IMAGE_TAG}\n    \
         variables:\n      LOG_LEVEL: ${values.LOG_LEVEL}\n      \
         PUBLIC_URL: https://${shared.dns.host}/api\n",
    );
    sb.write(
        "workloads/shop/values.yaml",
        "values:\n  LOG_LEVEL: info\n  IMAGE_TAG: \"1.4\"\nenvironments:\n  production:\n    \
         LOG_LEVEL: warn\n",
    );
    sb.write(
        "definitions/workload.yaml",
        &definitions(&[Definition::new("workload", "humanitec/echo")]),
    );
    sb.write(
        "definitions/dns.yaml",
        &definition(
            "dns",
            "dns",
            "  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n      \
             host: ${context.env.id}.shop.example.com\n  criteria:\n    - {}\n",
        ),
    );
    sb.commit("score-humanitec's placeholders");
    sb.gitplane(&["validate"]).ok();
    sb.gitplane(&["apply"]).ok();
    for (env, level) in [("development", "info"), ("production", "warn")] {
        let run = sb
            .gitplane(&["manifests", "--env", env, "--format", "json"])
            .ok();
        let objects = run.json();
        let deployment = objects["items"]
            .as_array()
            .and_then(|all| all.iter().find(|o| o["kind"] == "Deployment"))
            .unwrap_or_else(|| panic!("no Deployment in {objects:#}"));
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "registry.example.com/api:1.4", "{env}");
        let env_vars: Vec<(String, String)> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().to_owned(),
                    v["value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert!(
            env_vars.contains(&("LOG_LEVEL".to_owned(), level.to_owned())),
            "{env}: {env_vars:?}"
        );
        assert!(
            env_vars.contains(&(
                "PUBLIC_URL".to_owned(),
                format!("https://{env}.shop.example.com/api")
            )),
            "{env}: {env_vars:?}"
        );
    }

    // A value the app does not set, and an override of an environment that does not exist.
    let before = sb.resource_rows();
    sb.edit(
        "workloads/shop/api.yaml",
        "${values.LOG_LEVEL}",
        "${values.LOG_LEVLE}",
    );
    sb.commit("A typo in a value's name");
    sb.gitplane(&["validate"]).fails().stderr_has(
        "workloads/shop/api.yaml:9: workload 'api' reads '${values.LOG_LEVLE}', which app 'shop' \
         does not set for environment 'development'",
    );
    sb.gitplane(&["apply"]).fails();
    assert_eq!(sb.resource_rows(), before);
    sb.edit(
        "workloads/shop/api.yaml",
        "${values.LOG_LEVLE}",
        "${values.LOG_LEVEL}",
    );
    sb.edit(
        "workloads/shop/values.yaml",
        "  production:",
        "  prodution:",
    );
    sb.commit("A typo in an environment's name");
    sb.gitplane(&["validate"]).fails().stderr_has(
        "workloads/shop/values.yaml:5:3: environment 'prodution' is not one of this \
         repository's (development, production)",
    );
    sb.gitplane(&["apply"]).fails();
    assert_eq!(sb.resource_rows(), before);
}

/// Errors that used to surface half-way through an apply are found by `validate`, with the
/// file and line: an output template written as a mapping, and a read of an output the
/// provider's driver does not give (a typo), from a Score file and from a definition.
#[test]
fn template_shapes_and_output_names_are_checked_before_any_call() {
    let sb = Sandbox::new();
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    sb.write(
        "workloads/shop/api.yaml",
        &workload(
            "api",
            "  db:\n    type: postgres\n  cfg:\n    type: config\n",
        )
        .replace(
            "resources:\n",
            "    variables:\n      DB_PORT: ${resources.db.port}\nresources:\n",
        ),
    );
    sb.write(
        "definitions/workload.yaml",
        &definitions(&[Definition::new("workload", "humanitec/echo")]),
    );
    sb.write(
        "definitions/postgres.yaml",
        &definition(
            "postgres",
            "postgres",
            "  driver_type: humanitec/template\n  driver_inputs:\n    values:\n      \
             templates:\n        outputs: |\n          host: db.internal\n          port: 5432\n        \
             secrets: |\n          password: s3cret\n  criteria:\n    - {}\n",
        ),
    );
    sb.write(
        "definitions/config.yaml",
        &definition(
            "config",
            "config",
            "  driver_type: humanitec/echo\n  driver_inputs:\n    values:\n      \
             url: postgres://${resources.postgres#modules.api.externals.db.outputs.host}\n  \
             criteria:\n    - {}\n",
        ),
    );
    sb.commit("A workload, its database and a config reading it");
    sb.gitplane(&["validate"]).ok();
    sb.gitplane(&["apply"]).ok();
    let before = sb.resource_rows();

    // A typo in the Score file.
    sb.edit(
        "workloads/shop/api.yaml",
        "${resources.db.port}",
        "${resources.db.prot}",
    );
    sb.commit("A typo in an output's name");
    sb.gitplane(&["validate"]).fails().stderr_has(
        "workloads/shop/api.yaml:8: shop/workload.default#modules.api reads output 'prot' of \
         shop/postgres.default#modules.api.externals.db, which its definition 'postgres' \
         (driver_type humanitec/template) does not give; it gives: host, password, port",
    );
    sb.gitplane(&["apply"]).fails();
    assert_eq!(sb.resource_rows(), before);
    sb.edit(
        "workloads/shop/api.yaml",
        "${resources.db.prot}",
        "${resources.db.port}",
    );

    // A typo in a definition's reference.
    sb.edit("definitions/config.yaml", "outputs.host}", "outputs.hots}");
    sb.commit("A typo in a definition");
    sb.gitplane(&["validate"]).fails().stderr_has(
        "definitions/config.yaml:10: shop/config.default#modules.api.externals.cfg reads output \
         'hots' of shop/postgres.default#modules.api.externals.db",
    );
    sb.edit("definitions/config.yaml", "outputs.hots}", "outputs.host}");

    // An output template written as a mapping (the `|` forgotten).
    sb.edit(
        "definitions/postgres.yaml",
        "        outputs: |\n          host: db.internal\n          port: 5432\n",
        "        outputs:\n          host: db.internal\n          port: 5432\n",
    );
    sb.commit("outputs without its |");
    let run = sb.gitplane(&["validate"]).fails();
    // Its keys are unknown, so no read of them is second-guessed.
    assert!(!run.stderr.contains("reads output"), "{}", run.stderr);
    run.stderr_has(
        "definitions/postgres.yaml:11: definition 'postgres' (driver_type humanitec/template): \
         values.templates.outputs must be a string, got a mapping: write the template as text \
         (`outputs: |` and the YAML below it)",
    );
    sb.gitplane(&["apply"]).fails();
    assert_eq!(sb.resource_rows(), before);
}
