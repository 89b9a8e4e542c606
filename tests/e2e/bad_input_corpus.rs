//! The bad-input corpus: one case a few lines long for each way a user can get input wrong,
//! each run against a state file made by a good apply of the template.
//!
//! - A **commit** (`Case::commit`) is pushed; `validate` must fail with every expected
//!   `file:line: reason` and leave the state file byte for byte as it was, and `apply` must say
//!   the same, record one failed deployment per environment and change nothing else.
//! - A **host config** (`Case::host`, the `--config` file) must make `validate`, `plan` and
//!   `apply` fail before they touch state: the state file stays byte for byte the same.
//! - A **command line** (`Case::cli`), such as a `--rev` that names nothing, likewise.
//!
//! Every run must exit with code 1 (not 2, a usage error; not a crash).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::util::{Run, Sandbox, rows};

/// What a case feeds gitplane.
enum Input {
    /// Edits of the clone, committed and pushed; with a host config when given.
    Commit {
        edit: fn(&Sandbox),
        config: Option<&'static str>,
    },
    /// A host config: its text (`{root}` is the sandbox's folder), after `prepare` ran.
    Host {
        prepare: fn(&Sandbox),
        config: &'static str,
    },
    /// Extra arguments to every command.
    Cli { args: &'static [&'static str] },
}

struct Case {
    input: Input,
    /// Substrings of stderr; `{root}` is the sandbox's folder.
    expect: &'static [&'static str],
}

impl Case {
    fn commit(edit: fn(&Sandbox), expect: &'static [&'static str]) -> Case {
        Case {
            input: Input::Commit { edit, config: None },
            expect,
        }
    }

    fn commit_with(
        config: &'static str,
        edit: fn(&Sandbox),
        expect: &'static [&'static str],
    ) -> Case {
        Case {
            input: Input::Commit {
                edit,
                config: Some(config),
            },
            expect,
        }
    }

    fn host(config: &'static str, expect: &'static [&'static str]) -> Case {
        Case::host_with(|_| {}, config, expect)
    }

    fn host_with(
        prepare: fn(&Sandbox),
        config: &'static str,
        expect: &'static [&'static str],
    ) -> Case {
        Case {
            input: Input::Host { prepare, config },
            expect,
        }
    }

    fn cli(args: &'static [&'static str], expect: &'static [&'static str]) -> Case {
        Case {
            input: Input::Cli { args },
            expect,
        }
    }

    fn check(self) {
        let sb = Sandbox::applied();
        let root = sb.root.display().to_string();
        let expect: Vec<String> = self
            .expect
            .iter()
            .map(|e| e.replace("{root}", &root))
            .collect();
        match self.input {
            Input::Commit { edit, config } => {
                let config = config.map(|text| write_config(&sb, text));
                rejected_commit(&sb, edit, config.as_deref(), &expect);
            }
            Input::Host { prepare, config } => {
                prepare(&sb);
                let config = write_config(&sb, config);
                let config = config.to_str().unwrap();
                refused(&sb, &["--config", config], &expect);
            }
            Input::Cli { args } => refused(&sb, args, &expect),
        }
    }
}

fn write_config(sb: &Sandbox, text: &str) -> PathBuf {
    let path = sb.root.join("host.yaml");
    let text = text.replace("{root}", &sb.root.display().to_string());
    std::fs::write(&path, text).unwrap();
    path
}

/// The state file's bytes, and its write-ahead log's when there is one with content.
fn state_bytes(sb: &Sandbox) -> (Vec<u8>, Option<Vec<u8>>) {
    let wal = PathBuf::from(format!("{}-wal", sb.state.display()));
    let wal = std::fs::read(&wal).ok().filter(|w| !w.is_empty());
    (std::fs::read(&sb.state).unwrap(), wal)
}

/// Every row of every table, by table.
fn dump(sb: &Sandbox) -> BTreeMap<String, Vec<Vec<String>>> {
    let db = sb.db();
    let tables = rows(
        &db,
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
    );
    tables
        .into_iter()
        .map(|t| {
            let name = t[0].clone();
            let all = rows(&db, &format!("SELECT * FROM \"{name}\" ORDER BY rowid"));
            (name, all)
        })
        .collect()
}

#[track_caller]
fn assert_failed_with(run: &Run, expect: &[String]) {
    assert_eq!(run.code, Some(1), "exit code 1 expected:{run}");
    assert!(!run.stderr.contains("panicked"), "{run}");
    for needle in expect {
        run.stderr_has(needle);
    }
}

#[track_caller]
fn assert_state_unchanged(sb: &Sandbox, before: &(Vec<u8>, Option<Vec<u8>>), after: &str) {
    let now = state_bytes(sb);
    assert!(now.0 == before.0, "the state file changed after {after}");
    assert!(
        now.1 == before.1,
        "the state's write-ahead log changed after {after}"
    );
}

fn rejected_commit(sb: &Sandbox, edit: fn(&Sandbox), config: Option<&Path>, expect: &[String]) {
    let config = config.map(|c| c.display().to_string());
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        if let Some(config) = &config {
            all.extend(["--config", config]);
        }
        sb.gitplane(&all)
    };
    let good = sb.head();
    let before = state_bytes(sb);
    let tables = dump(sb);
    let deployments = sb.max_id("deployment");

    edit(sb);
    let bad = sb.commit("A bad commit");

    let validate = run(&["validate"]);
    assert_failed_with(&validate, expect);
    validate.stderr_has("rejected");
    assert_state_unchanged(sb, &before, "validate");

    let apply = run(&["apply"]);
    assert_failed_with(&apply, expect);
    assert_eq!(
        apply.error_lines(),
        validate.error_lines(),
        "validate and apply report the same errors:{validate}{apply}"
    );
    // One failed deployment per environment, naming the errors, and nothing else.
    let new = sb.deployments_after(deployments);
    let envs: Vec<&str> = new.iter().map(|d| d.env.as_str()).collect();
    assert_eq!(envs, ["development", "production"], "{new:?}");
    for d in &new {
        assert_eq!(
            (d.status.as_str(), d.commit.as_str(), d.counts),
            ("failed", bad.as_str(), [0; 5])
        );
        let error = d.error.as_deref().unwrap_or_default();
        for needle in expect {
            assert!(error.contains(needle), "{needle:?} not in {error}");
        }
    }
    let mut now = dump(sb);
    if let Some(rows) = now.get_mut("deployment") {
        rows.retain(|r| r[0].parse::<i64>().is_ok_and(|id| id <= deployments));
    }
    // Who ran the apply, recorded with each failed deployment (`action.deployment_id`).
    if let Some(rows) = now.get_mut("action") {
        let is_new = |r: &Vec<String>| r[5].parse::<i64>().is_ok_and(|id| id > deployments);
        assert_eq!(
            rows.iter().filter(|r| is_new(r)).count(),
            new.len(),
            "{rows:?}"
        );
        rows.retain(|r| !is_new(r));
    }
    assert_eq!(
        now, tables,
        "apply changed more than its failed deployments and their actions"
    );

    // The last good commit is still the one that counts.
    run(&["validate", "--rev", &good]).ok();
    assert_eq!(
        sb.gitplane(&["status", "--env", "development", "--format", "json"])
            .ok()
            .json()[0]["commit"],
        good.as_str()
    );
}

/// `validate`, `plan` and `apply` with `args` all fail with `expect`, and touch no state.
fn refused(sb: &Sandbox, args: &[&str], expect: &[String]) {
    let before = state_bytes(sb);
    for command in ["validate", "plan", "apply"] {
        let mut all = vec![command];
        all.extend(args);
        let run = sb.gitplane(&all);
        assert_failed_with(&run, expect);
        assert_state_unchanged(sb, &before, command);
    }
}

/// Appends `text` to a file of the clone.
fn append(sb: &Sandbox, rel: &str, text: &str) {
    let old = sb.read(rel);
    sb.write(rel, &format!("{old}{text}"));
}

/// Replaces `from` with `to` in a file of the clone (exactly one occurrence).
fn edit(sb: &Sandbox, rel: &str, from: &str, to: &str) {
    sb.edit(rel, from, to);
}

fn link(sb: &Sandbox, target: &str, rel: &str) {
    let path = sb.work.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, path).unwrap();
}

fn executable(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, "#!/bin/sh\necho '{\"status\": \"done\"}'\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

const PG: &str = "workloads/shop/backend.yaml";
const REDIS: &str = "definitions/redis.yaml";
const DEV: &str = "environments/development.yaml";

/// A definition of a new type, `file`'s id and criteria given.
fn definition(id: &str, res_type: &str, extra: &str) -> String {
    format!(
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
         type: {res_type}\n  driver_type: humanitec/echo\n{extra}  criteria:\n    - {{}}\n"
    )
}

/// A definition that reads a secret from store `files`.
const STORED: &str = "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  \
                      id: stored\nentity:\n  type: vault-secret\n  driver_type: humanitec/echo\n  \
                      driver_inputs:\n    secret_refs:\n      token: {store: files, ref: api/token}\n  \
                      criteria:\n    - {}\n";

fn uses_stored_secret(sb: &Sandbox) {
    sb.write("definitions/stored.yaml", STORED);
    append(sb, PG, "  token:\n    type: vault-secret\n");
}

macro_rules! corpus {
    ($($name:ident: $case:expr;)+) => {
        $(
            #[test]
            fn $name() {
                $case.check();
            }
        )+
    };
}

corpus! {
    // YAML syntax and structure.
    yaml_mapping_value_in_a_value: Case::commit(
        |sb| edit(sb, REDIS, "      port: 6379\n", "      port: 6379: x\n"),
        &["definitions/redis.yaml:12:17: mapping values are not allowed"]);
    yaml_bad_indentation: Case::commit(
        |sb| edit(sb, REDIS, "      port: 6379\n", "     port: 6379\n"),
        &["definitions/redis.yaml:12:", "did not find expected key"]);
    yaml_unclosed_flow_list: Case::commit(
        |sb| sb.write(DEV, "type: development\nimplicit_resources: [base-env\n"),
        &["environments/development.yaml:2:21: unclosed bracket '['"]);
    yaml_two_documents_in_an_environment: Case::commit(
        |sb| sb.write(DEV, "type: development\n---\ntype: production\n"),
        &["environments/development.yaml:2:1: a second YAML document starts at this `---` \
           line, but an environment file holds one document: remove the `---` line"]);
    yaml_two_documents_in_a_workload: Case::commit(
        |sb| append(sb, PG, "---\napiVersion: score.dev/v1b1\n"),
        &["workloads/shop/backend.yaml:27:1: a second YAML document starts at this `---` line, \
           but gitplane reads one workload per Score file: move what follows to a file of its \
           own in workloads/shop/"]);
    yaml_duplicate_key: Case::commit(
        |sb| sb.write(DEV, "type: development\nimplicit_resources: []\ntype: production\n"),
        &["environments/development.yaml:3:1: `type` is set twice in the same mapping (also on \
           line 1): keep one"]);
    yaml_duplicate_key_nested: Case::commit(
        |sb| edit(sb, REDIS, "      port: 6379\n", "      port: 6379\n      port: 6380\n"),
        &["definitions/redis.yaml:13:7: `port` is set twice in the same mapping (also on line \
           12): keep one"]);
    yaml_not_utf8: Case::commit(
        |sb| std::fs::write(sb.work.join(DEV), b"type: d\xe9veloppement\n").unwrap(),
        &["environments/development.yaml: the file is not UTF-8 text: save it as UTF-8"]);
    yaml_unknown_alias: Case::commit(
        |sb| sb.write(DEV, "type: *kind\n"),
        &["environments/development.yaml:1:7: this alias (`*name`) names no anchor"]);
    yaml_environment_is_a_list: Case::commit(
        |sb| sb.write(DEV, "- type: development\n"),
        &["environments/development.yaml:1:1: the document must be a mapping (`key: value` \
           lines), not a list"]);
    yaml_empty_environment_file: Case::commit(
        |sb| sb.write(DEV, "# nothing yet\n"),
        &["environments/development.yaml:2:1: the document ends before it has a value: an \
           environment file cannot be empty"]);

    // A value of the wrong shape: the key, and what to write.
    shape_empty_mapping: Case::commit(
        |sb| sb.write(DEV, "type: development\nshared_resources:\n"),
        &["environments/development.yaml:2:17: `shared_resources` is empty but must be a \
           mapping: write `key: value` lines indented under it, or `{}` for none, or remove the \
           key"]);
    shape_criteria_as_a_mapping: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n    - {}\n", "  criteria: {app_id: shop}\n"),
        &["definitions/redis.yaml:14:13: `criteria` is a list of rules, and this is one rule \
           written as a mapping: put `- ` before it"]);
    shape_empty_provision: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n", "  provision:\n  criteria:\n"),
        &["definitions/redis.yaml:14:12: `provision` is empty but must be a mapping"]);
    shape_apps_as_text: Case::commit(
        |sb| sb.write(DEV, "type: development\napps: shop\n"),
        &["environments/development.yaml:2:7: `apps` must be a list (`- item` lines indented \
           under it, or `[]` for none), not `shop`"]);
    shape_score_resources_as_a_list: Case::commit(
        |sb| edit(sb, PG, "  db:\n    type: postgres\n", "  - db\n"),
        &["workloads/shop/backend.yaml:21:3: `resources` must be a mapping"]);
    shape_threshold_not_a_number: Case::commit(
        |sb| sb.write(DEV, "type: development\ndeletion_guard: {threshold: lots}\n"),
        &["environments/development.yaml:2:29: `threshold` must be a number, such as 20 or \
           12.5, not `lots`"]);
    shape_boolean_as_yes: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n", "  auto_update: yes\n  criteria:\n"),
        &["definitions/redis.yaml:14:16: `auto_update` must be true or false, not `yes`"]);
    shape_empty_score_variables: Case::commit(
        |sb| edit(sb, PG, "    variables:\n", "    variables:\n    env:\n"),
        &["workloads/shop/backend.yaml:8:5: `variables` is empty, which Score does not allow \
           (score-compose and score-k8s refuse it too): write `NAME: value` lines indented \
           under it, or `{}` for none, or remove the key"]);
    shape_empty_criteria: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n    - {}\n", "  criteria:\n"),
        &["definitions/redis.yaml:14:11: `criteria` is empty: write rules as \
           `- {env_type: production}` lines indented under it"]);
    shape_legacy_property_typo: Case::commit(
        |sb| edit(sb, PG, "    type: postgres\n",
                  "    type: postgres\n    properties:\n      port: {defualt: 5432}\n"),
        &["workloads/shop/backend.yaml:24:14: unknown field `defualt`", "check the spelling"]);
    setting_org_not_an_id: Case::commit(
        |sb| sb.write("gitplane.yaml", "# who we are\norg: Acme Corp\n"),
        &["gitplane.yaml:2: org: 'Acme Corp' is not a valid id: use letters, digits, '-' and \
           '_'"]);
    placeholder_guresid_with_a_path: Case::commit(
        |sb| edit(sb, REDIS, "outputs.redis_host}", "guresid.host}"),
        &["definitions/redis.yaml:11:13: bad placeholder in 'driver_inputs.values.host'",
          "'.guresid' is the resource's GUResID: nothing may follow it"]);
    placeholder_selector_reading_values: Case::commit(
        |sb| edit(sb, REDIS, "${resources.base-env#base-env.outputs.redis_host}",
                  "${resources.redis>base-env.values.redis_host}"),
        &["definitions/redis.yaml:11:13:", "a selector reads outputs: write '.outputs.NAME', \
           not '.values'"]);
    secret_ref_without_store_and_no_stores: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n",
                  "    secret_refs:\n      password:\n        ref: redis/password\n  criteria:\n"),
        &["definitions/redis.yaml:16: secret_refs: this ref names no store, so it is read from \
           the host's default secret store, but the host config has no secret stores: add one \
           under secret_stores in the host config, or name the store with `store: NAME`"]);
    shape_weight_not_a_whole_number: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n", "  weight: heavy\n  criteria:\n"),
        &["definitions/redis.yaml:14:11: `weight` must be a whole number, not `heavy`"]);
    shape_empty_type: Case::commit(
        |sb| sb.write(DEV, "type:\n"),
        &["environments/development.yaml:1:", "`type` is empty: write a value"]);

    // Limits and numbers.
    limit_file_too_large: Case::commit(
        |sb| append(sb, PG, &format!("# {}\n", "x".repeat(2 << 20))),
        &["workloads/shop/backend.yaml:27: the file is 2.0 MiB (", "bytes), more than the \
           limit of 1 MiB: it passes the limit on this line", "raise limits.file_size in \
           gitplane.yaml"]);
    limit_value_too_long: Case::commit(
        |sb| edit(sb, PG, "    image: registry", &format!("    blob: {}\n    image: registry",
            "x".repeat(100 << 10))),
        &["workloads/shop/backend.yaml:7:11: this string is 100 KiB (102400 bytes), longer than \
           the limit of 64 KiB", "raise limits.value_size in gitplane.yaml"]);
    limit_lowered_in_the_settings: Case::commit(
        |sb| sb.write("gitplane.yaml", "limits:\n  value_size: 32\n"),
        &["definitions/dns.yaml:11:13: this string is 65 bytes, longer than the limit of 32 \
           bytes", "workloads/shop/backend.yaml:7:12: this string is 39 bytes"]);
    limit_setting_out_of_range: Case::commit(
        |sb| sb.write("gitplane.yaml", "limits:\n  file_size: 0\n"),
        &["gitplane.yaml:2: limits.file_size must be more than 0: write e.g. file_size: 1MiB"]);
    limit_setting_not_a_size: Case::commit(
        |sb| sb.write("gitplane.yaml", "limits:\n  value_size: 1GB\n"),
        &["gitplane.yaml:2: limits.value_size: '1GB' is not a size: write e.g. 65536, 64KiB or \
           1MiB"]);
    number_integer_too_large_in_a_workload: Case::commit(
        |sb| edit(sb, PG, "      port: 8080", "      port: 123456789012345678901234567890"),
        &["workloads/shop/backend.yaml:18:13: the integer 123456789012345678901234567890 does \
           not fit in 64 bits and would be stored rounded (as 1.2345678901234568e29)", "quote it"]);
    number_negative_integer_too_large_in_a_definition: Case::commit(
        |sb| edit(sb, REDIS, "port: 6379", "port: -99999999999999999999"),
        &["definitions/redis.yaml:12:13: the integer -99999999999999999999 does not fit in 64 \
           bits"]);
    number_too_many_nodes: Case::commit(
        |sb| sb.write(DEV, &format!("type: development\napps: [{}]\n",
            vec!["a"; 250_001].join(","))),
        &["environments/development.yaml:2:", "the document has more than 250000 values, lists \
           and mappings", "split it into several files"]);
    number_nesting_too_deep: Case::commit(
        |sb| edit(sb, PG, "    image: registry", &format!("    deep: {}{}\n    image: registry",
            "[".repeat(300), "]".repeat(300))),
        &["workloads/shop/backend.yaml:7:", "lists and mappings nest too deeply here (more than \
           64 levels): flatten the structure"]);
    number_alias_bomb: Case::commit(
        |sb| {
            let mut bomb = String::from("    l0: &a0 [x, x, x, x, x, x, x, x, x]\n");
            for i in 1..10 {
                bomb.push_str(&format!("    l{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 9].join(", ")));
            }
            edit(sb, PG, "    image: registry", &format!("{bomb}    image: registry"));
        },
        &["workloads/shop/backend.yaml:", "values, lists and mappings (an alias counts once for \
           each use)"]);

    // Symbolic links.
    link_outside_the_repository: Case::commit(
        |sb| link(sb, "/etc/hostname", "definitions/host.yaml"),
        &["definitions/host.yaml: a symbolic link to '/etc/hostname', which is outside the \
           repository: gitplane reads files from the commit and cannot follow it; commit the file \
           itself at this path"]);
    link_climbing_out: Case::commit(
        |sb| link(sb, "../../../outside/dns.yaml", "definitions/shared/dns.yaml"),
        &["definitions/shared/dns.yaml: a symbolic link to '../../../outside/dns.yaml', which is \
           outside the repository"]);
    link_folder_outside: Case::commit(
        |sb| link(sb, "/srv/apps/billing", "workloads/billing"),
        &["workloads/billing: a symbolic link to '/srv/apps/billing', which is outside"]);
    link_inside_the_repository: Case::commit(
        |sb| link(sb, "redis.yaml", "definitions/cache.yaml"),
        &["definitions/cache.yaml: a symbolic link to 'redis.yaml': gitplane does not follow \
           links"]);

    // Unknown and missing fields.
    field_unknown_in_a_score_resource: Case::commit(
        |sb| edit(sb, PG, "    type: postgres\n", "    type: postgres\n    size: large\n"),
        &["workloads/shop/backend.yaml:23:5: unknown field `size`"]);
    field_unknown_in_a_definition: Case::commit(
        |sb| edit(sb, REDIS, "  driver_type: humanitec/echo\n",
            "  driver_type: humanitec/echo\n  driver_typo: x\n"),
        &["definitions/redis.yaml:9:", "unknown field `driver_typo`"]);
    field_unknown_repository_setting: Case::commit(
        |sb| sb.write("gitplane.yaml", "environment_defaults:\n  implicit: [dns]\n"),
        &["gitplane.yaml:2:", "unknown field `implicit`"]);
    field_missing_driver_type: Case::commit(
        |sb| edit(sb, REDIS, "  driver_type: humanitec/echo\n", ""),
        &["definitions/redis.yaml:", "missing field `driver_type`"]);
    field_missing_environment_type: Case::commit(
        |sb| sb.write(DEV, "implicit_resources: [base-env]\n"),
        &["environments/development.yaml:", "missing field `type`"]);
    field_unsupported_score_version: Case::commit(
        |sb| edit(sb, PG, "apiVersion: score.dev/v1b1", "apiVersion: score.dev/v2"),
        &["workloads/shop/backend.yaml:2: apiVersion 'score.dev/v2' is not supported: use \
           'score.dev/v1b1'"]);
    field_definition_of_another_kind: Case::commit(
        |sb| edit(sb, REDIS, "kind: Definition", "kind: Deployment"),
        &["definitions/redis.yaml:1: expected apiVersion 'entity.humanitec.io/v1b1' and kind \
           'Definition', found 'entity.humanitec.io/v1b1' and 'Deployment'"]);

    // Placeholders.
    placeholder_not_closed: Case::commit(
        |sb| edit(sb, REDIS, "outputs.redis_host}", "outputs.redis_host"),
        &["definitions/redis.yaml:11:13:", "driver_inputs.values.host", "placeholder is not \
           closed"]);
    placeholder_unknown_context: Case::commit(
        |sb| edit(sb, REDIS, "${context.res.id}", "${context.res.idd}"),
        &["definitions/redis.yaml:13:33:", "unknown context 'context.res.idd'"]);
    placeholder_unknown_score_resource: Case::commit(
        |sb| edit(sb, PG, "${resources.db.host}", "${resources.dbx.host}"),
        &["workloads/shop/backend.yaml:9:", "dbx"]);
    placeholder_empty: Case::commit(
        |sb| edit(sb, REDIS, "${context.res.id}", "${}"),
        &["definitions/redis.yaml:13:33:", "driver_inputs.values.prefix"]);

    // What the graph cannot be built from.
    graph_type_without_definition: Case::commit(
        |sb| edit(sb, PG, "    type: postgres\n", "    type: mongodb\n"),
        &["workloads/shop/backend.yaml:21", "no definition of type 'mongodb' matches \
           shop/mongodb.default#modules.backend.externals.db"]);
    graph_class_without_definition: Case::commit(
        |sb| edit(sb, PG, "    type: postgres\n", "    type: postgres\n    class: huge\n"),
        &["no definition of type 'postgres' matches \
           shop/postgres.huge#modules.backend.externals.db"]);
    graph_reference_to_an_unknown_type: Case::commit(
        |sb| edit(sb, REDIS, "      port: 6379\n",
            "      port: 6379\n      vault: ${resources.vault#x.outputs.addr}\n"),
        &["definitions/redis.yaml:13", "no definition of type 'vault' matches \
           shop/vault.default#x"]);
    graph_dependency_loop: Case::commit(
        |sb| {
            sb.write("definitions/loop.yaml", &format!("{}---\n{}",
                definition("def-a", "a", "  driver_inputs:\n    values:\n      x: ${resources.b.outputs.y}\n"),
                definition("def-b", "b", "  driver_inputs:\n    values:\n      y: ${resources.a.outputs.x}\n")));
            append(sb, PG, "  thing:\n    type: a\n");
        },
        &["dependency loop: shop/b.default#modules.backend.externals.thing (definition 'def-b' in \
           definitions/loop.yaml:17) -> shop/a.default#modules.backend.externals.thing",
          "a resource cannot depend on itself, directly or through others; remove one of these \
           references"]);
    graph_duplicate_definition_id: Case::commit(
        |sb| sb.write("definitions/more/redis.yaml", &definition("redis", "memcached", "")),
        &["definitions/redis.yaml:4: definition id 'redis' is already used in \
           definitions/more/redis.yaml:4"]);
    graph_equal_criteria: Case::commit(
        |sb| sb.write("definitions/redis2.yaml", &definition("redis-two", "redis", "")),
        &["definitions/redis2.yaml:8: definitions 'redis' (definitions/redis.yaml:14) and \
           'redis-two' have equal criteria {class: default} for type 'redis'"]);
    graph_two_defaults: Case::commit(
        |sb| {
            sb.write("definitions/d1.yaml", &definition("d1", "cache", "  default: true\n"));
            sb.write("definitions/d2.yaml", &definition("d2", "cache", "  default: true\n")
                .replace("- {}", "- {class: fast}"));
        },
        &["definitions/d2.yaml:8: definitions 'd1' (definitions/d1.yaml:8) and 'd2' are both \
           the default for type 'cache': keep one"]);
    graph_duplicate_workload: Case::commit(
        |sb| sb.write("workloads/shop/backend-copy.yaml", &sb.read(PG)),
        &["workloads/shop/backend.yaml: workload 'backend' of app 'shop' is already defined in \
           workloads/shop/backend-copy.yaml"]);
    graph_environment_id_mismatch: Case::commit(
        |sb| sb.write(DEV, "id: dev\ntype: development\n"),
        &["environments/development.yaml:1: environment id 'dev' differs from the file name"]);
    graph_invalid_app_folder: Case::commit(
        |sb| sb.write("workloads/my shop/web.yaml", &sb.read(PG).replace("backend", "web")),
        &["workloads/my shop/web.yaml: app folder: 'my shop' is not a valid id"]);
    graph_misplaced_workload: Case::commit(
        |sb| sb.write("workloads/shop/old/backend.yaml", &sb.read(PG)),
        &["workloads/shop/old/backend.yaml: misplaced file"]);
    graph_bad_deletion_policy: Case::commit(
        |sb| edit(sb, REDIS, "  criteria:\n", "  deletion_policy: keep\n  criteria:\n"),
        &["definitions/redis.yaml:14: deletion_policy 'keep' is not one of delete, orphan"]);
    graph_two_annotations: Case::commit(
        |sb| edit(sb, PG, "    type: postgres\n", "    type: postgres\n    class: fast\n    \
            metadata:\n      annotations:\n        gitplane.dev/class-ref: postgres-dev\n"),
        &["workloads/shop/backend.yaml:21: resource 'db': a class and a gitplane.dev/class-ref \
           annotation both choose the definition: keep one"]);
    graph_unregistered_driver: Case::commit(
        |sb| edit(sb, REDIS, "driver_type: humanitec/echo", "driver_type: acme/redis"),
        &["definitions/redis.yaml:8: definition 'redis' uses driver_type 'acme/redis', which is \
           not registered"]);
    graph_unknown_secret_store: Case::commit(uses_stored_secret,
        &["definitions/stored.yaml:10: secret_refs: secret store 'files' is not configured in \
           the host config (none configured): add it under secret_stores"]);

    // Schedules and thresholds.
    schedule_minute_out_of_range: Case::commit(
        |sb| sb.write(DEV, "type: development\nschedule: \"60 * * * *\"\n"),
        &["environments/development.yaml:2: schedule '60 * * * *': the minute (field 1) is 60, \
           but it runs from 0 to 59; a schedule is minute hour day-of-month month day-of-week"]);
    schedule_day_of_week_past_sunday: Case::commit(
        |sb| sb.write(DEV, "type: development\nschedule: \"0 3 * * 8\"\n"),
        &["environments/development.yaml:2: schedule '0 3 * * 8': the day of the week (field 5) \
           is 8, but it runs from 0 to 7 (0 and 7 are Sunday) or SUN-SAT"]);
    schedule_in_words: Case::commit(
        |sb| sb.write(DEV, "type: development\nschedule: every night\n"),
        &["environments/development.yaml:2: schedule 'every night' has 2 field(s): write 5"]);
    schedule_default_in_the_settings: Case::commit(
        |sb| sb.write("gitplane.yaml", "environment_defaults:\n  schedule: \"0 3 * *\"\n"),
        &["gitplane.yaml:2: schedule '0 3 * *' has 4 field(s)"]);
    threshold_above_100: Case::commit(
        |sb| sb.write(DEV, "type: development\ndeletion_guard: {threshold: 150}\n"),
        &["environments/development.yaml:2: deletion_guard.threshold 150 is not a percentage \
           between 0 and 100"]);
    threshold_default_negative: Case::commit(
        |sb| sb.write("gitplane.yaml", "environment_defaults:\n  deletion_guard:\n    threshold: -5\n"),
        &["gitplane.yaml:3: deletion_guard.threshold -5 is not a percentage between 0 and 100"]);

    // Secret stores the commit reads, checked on the host without reading a secret.
    store_directory_missing: Case::commit_with(
        "secret_stores:\n  files: {dir: {root}/no-such-dir}\n", uses_stored_secret,
        &["definitions/stored.yaml:10: secret_refs: secret store 'files' is misconfigured in the \
           host config: its directory {root}/no-such-dir does not exist: create it, or correct \
           secret_stores.files.dir"]);
    store_symlink_escaping: Case::commit_with(
        "secret_stores:\n  files: {dir: {root}/secrets}\n",
        |sb| {
            let dir = sb.root.join("secrets/api");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(sb.root.join("outside"), "not a secret\n").unwrap();
            std::os::unix::fs::symlink(sb.root.join("outside"), dir.join("token")).unwrap();
            uses_stored_secret(sb);
        },
        &["definitions/stored.yaml:10: secret_refs: secret store 'files' refuses ref \
           'api/token': it resolves to {root}/outside outside the store directory {root}/secrets"]);
    store_ref_with_dots: Case::commit_with(
        "secret_stores:\n  files: {dir: {root}}\n",
        |sb| {
            uses_stored_secret(sb);
            edit(sb, "definitions/stored.yaml", "ref: api/token", "ref: ../api/token");
        },
        &["definitions/stored.yaml:10: secret_refs: secret store 'files' cannot use ref \
           '../api/token': '..' is not allowed in a ref"]);

    // The host config (`--config`): refused before any state is read or written.
    host_unknown_key: Case::host("concurency: 4\n",
        &["host.yaml:1:1: unknown field `concurency`"]);
    host_yaml_syntax: Case::host("drivers:\n  a/b: {http: {url: \"http://h\"}\n",
        &["host.yaml:2:8: unclosed bracket '{'"]);
    host_duplicate_key: Case::host("concurrency: 4\nconcurrency: 8\n",
        &["host.yaml:2:1: `concurrency` is set twice in the same mapping (also on line 1): keep one"]);
    host_two_documents: Case::host("concurrency: 4\n---\nconcurrency: 8\n",
        &["host.yaml:2:1: a second YAML document starts at this `---` line, but the host config \
           holds one document"]);
    host_history_keep_as_a_list: Case::host("history:\n  keep: [1000]\n",
        &["host.yaml:2:9: `keep` must be a number of deployments, such as 1000, or an age, such \
           as 90d, not a list"]);
    host_concurrency_in_words: Case::host("concurrency: many\n",
        &["host.yaml:1:14: `concurrency` must be a whole number, 0 or more, not `many`"]);
    host_concurrency_zero: Case::host("concurrency: 0\n",
        &["host.yaml:1: concurrency must be at least 1"]);
    host_timeout_zero: Case::host("drivers:\n  acme/q:\n    http: {url: \"http://127.0.0.1:1/\", timeout: 0s}\n",
        &["host.yaml:2: '0s' is no time at all: a time limit must be longer than zero, e.g. 30s, \
           2m or 500ms"]);
    host_timeout_in_words: Case::host("drivers:\n  acme/q:\n    http: {url: \"http://127.0.0.1:1/\", timeout: soon}\n",
        &["host.yaml:2: 'soon' is not a duration: write e.g. 30s, 1h30m, 500ms, 90d"]);
    host_vault_timeout_zero: Case::host(
        "secret_stores:\n  v:\n    vault: {url: \"http://127.0.0.1:1\", token_file: /t, timeout: 0ms}\n",
        &["host.yaml:2: secret store 'v': timeout '0ms' is no time at all"]);
    host_watch_interval_zero: Case::host("watch_interval: 0s\n",
        &["host.yaml:1: '0s' is no time at all: an interval must be longer than zero, e.g. 30s"]);
    host_exec_program_missing: Case::host(
        "drivers:\n  acme/dns:\n    exec: {command: [\"{root}/drivers/dns\"]}\n",
        &["host.yaml:2: driver 'acme/dns': the program {root}/drivers/dns does not exist: \
           install it there, or correct the command"]);
    host_exec_program_not_executable: Case::host_with(
        |sb| executable(&sb.root.join("dns"), 0o644),
        "drivers:\n  acme/dns:\n    exec: {command: [\"{root}/dns\"]}\n",
        &["host.yaml:2: driver 'acme/dns': the program {root}/dns is not executable (chmod +x)"]);
    host_exec_program_relative: Case::host(
        "drivers:\n  acme/dns:\n    exec: {command: [bin/dns]}\n",
        &["host.yaml:2: driver 'acme/dns': the program 'bin/dns' must be an absolute path"]);
    host_driver_both_kinds: Case::host_with(
        |sb| executable(&sb.root.join("dns"), 0o755),
        "drivers:\n  acme/dns:\n    http: {url: \"http://h\"}\n    exec: {command: [\"{root}/dns\"]}\n",
        &["host.yaml:2: driver 'acme/dns' needs exactly one of http or exec"]);
    host_builtin_driver_replaced: Case::host("drivers:\n  echo:\n    http: {url: \"http://h\"}\n",
        &["host.yaml:2: driver 'echo' is built in and cannot be replaced"]);
    host_account_file_missing: Case::host(
        "accounts:\n  aws-prod: {file: \"{root}/accounts/aws-prod.json\"}\n",
        &["host.yaml:2: account 'aws-prod': the file {root}/accounts/aws-prod.json does not \
           exist: put the account's credentials there, or correct the path"]);
    host_account_file_and_env: Case::host("accounts:\n  aws: {file: /x, env: X}\n",
        &["host.yaml:2: account 'aws' needs exactly one of file or env"]);
    host_store_dir_relative: Case::host("secret_stores:\n  files: {dir: secrets}\n",
        &["host.yaml:2: secret store 'files': dir 'secrets' must be an absolute path"]);
    host_history_keep_zero: Case::host("history: {keep: 0}\n",
        &["host.yaml:1: history.keep: keep at least 1 deployment, or an age such as 90d"]);
    host_retry_attempts_in_words: Case::host("retry:\n  attempts: lots\n",
        &["host.yaml:2:13: `attempts` must be a whole number, 0 or more, not `lots`"]);
    host_file_missing: Case::cli(&["--config", "/nonexistent/gitplane.yaml"],
        &["/nonexistent/gitplane.yaml: cannot read the host config"]);

    // The command line.
    rev_unknown: Case::cli(&["--rev", "nope"],
        &["cannot resolve revision 'nope': no branch, tag or commit is named 'nope': give a \
           branch (main), a tag, or a commit id"]);
    rev_too_far_back: Case::cli(&["--rev", "HEAD~5"],
        &["cannot resolve revision 'HEAD~5': 'HEAD' exists, but '~5' does not lead to a commit \
           from it"]);
    rev_a_tree: Case::cli(&["--rev", "main^{tree}"],
        &["cannot resolve revision 'main^{tree}': it names a tree, not a commit"]);
    rev_a_range: Case::cli(&["--rev", "main..main"],
        &["'main..main' is a range of commits; gitplane needs one commit"]);
}
