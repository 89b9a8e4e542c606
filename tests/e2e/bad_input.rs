//! Bad commits: each is rejected as a whole, recorded as a failed deployment, and changes
//! nothing, and `validate` says the same as `apply`.

use std::collections::BTreeSet;

use crate::util::{Run, Sandbox};

/// Starts from the template applied once, lets `mutate` edit the clone, commits and pushes, then
/// checks that `validate` and `apply` both reject the commit with every `expected` substring,
/// and that the state only gained one failed deployment per environment.
fn assert_rejected(mutate: impl FnOnce(&Sandbox), expected: &[&str]) -> (Sandbox, Run) {
    let sb = Sandbox::applied();
    let good = sb.head();
    let resources = sb.resource_rows();
    let secrets = sb.rows("SELECT * FROM resource_secret ORDER BY guresid");
    let edges = sb.edge_rows();
    let operations = sb.max_id("operation");
    let deployments = sb.max_id("deployment");

    mutate(&sb);
    let bad = sb.commit("A bad commit");

    let validate = sb.gitplane(&["validate"]).fails();
    for needle in expected {
        validate.stderr_has(needle);
    }
    assert!(!validate.error_lines().is_empty(), "{validate}");

    let apply = sb.gitplane(&["apply"]).fails();
    for needle in expected {
        apply.stderr_has(needle);
    }
    assert_eq!(
        apply.error_lines(),
        validate.error_lines(),
        "validate and apply report the same errors:{validate}{apply}"
    );
    assert!(
        apply.stderr.contains("rejected") && apply.stderr.contains("nothing was changed"),
        "{apply}"
    );

    // One failed deployment per environment, with the errors.
    let new = sb.deployments_after(deployments);
    let envs: BTreeSet<&str> = new.iter().map(|d| d.env.as_str()).collect();
    assert_eq!(
        envs,
        BTreeSet::from(["development", "production"]),
        "{new:?}"
    );
    assert_eq!(new.len(), 2, "{new:?}");
    for d in &new {
        assert_eq!(d.status, "failed", "{d:?}");
        assert_eq!(d.commit, bad, "{d:?}");
        assert_eq!(d.counts, [0, 0, 0, 0, 0], "{d:?}");
        let error = d
            .error
            .as_deref()
            .unwrap_or_else(|| panic!("no error: {d:?}"));
        for needle in expected {
            assert!(
                error.contains(needle),
                "deployment error lacks {needle:?}: {error}"
            );
        }
    }

    // Nothing else changed.
    assert_eq!(
        sb.resource_rows(),
        resources,
        "resource table changed:{apply}"
    );
    assert_eq!(
        sb.rows("SELECT * FROM resource_secret ORDER BY guresid"),
        secrets
    );
    assert_eq!(sb.edge_rows(), edges, "edge table changed:{apply}");
    assert_eq!(sb.max_id("operation"), operations, "new operations:{apply}");

    // The last good commit is still valid; status still shows it.
    sb.gitplane(&["validate", "--rev", &good]).ok();
    let status = sb
        .gitplane(&["status", "--env", "development", "--format", "json"])
        .ok()
        .json();
    assert_eq!(
        status[0]["commit"],
        good.as_str(),
        "status after a rejected commit"
    );
    (sb, apply)
}

#[test]
fn yaml_syntax_error() {
    assert_rejected(
        |sb| {
            sb.edit(
                "definitions/redis.yaml",
                "      port: 6379\n",
                "      port: 6379: x\n",
            )
        },
        &[
            "definitions/redis.yaml:12:17:",
            "mapping values are not allowed",
        ],
    );
}

#[test]
fn unknown_repository_setting() {
    assert_rejected(
        |sb| {
            sb.write(
                "gitplane.yaml",
                "environment_defaults:\n  deletion_guard: {threshold: 10}\n  implicit: [dns]\n",
            )
        },
        &["gitplane.yaml:3:", "unknown field `implicit`"],
    );
}

#[test]
fn repository_setting_out_of_range() {
    assert_rejected(
        |sb| {
            sb.write(
                "gitplane.yaml",
                "environment_defaults:\n  deletion_guard:\n    threshold: -5\n",
            )
        },
        &[
            "gitplane.yaml:3:",
            "deletion_guard.threshold -5 is not a percentage between 0 and 100",
        ],
    );
}

#[test]
fn yaml_bad_indentation() {
    assert_rejected(
        |sb| {
            sb.edit(
                "definitions/redis.yaml",
                "      port: 6379\n",
                "     port: 6379\n",
            )
        },
        &["definitions/redis.yaml:12:", "did not find expected key"],
    );
}

#[test]
fn unknown_field_in_a_score_resource() {
    assert_rejected(
        |sb| {
            sb.edit(
                "workloads/shop/backend.yaml",
                "    type: postgres\n",
                "    type: postgres\n    size: large\n",
            )
        },
        &["workloads/shop/backend.yaml:23:5:", "unknown field `size`"],
    );
}

#[test]
fn unknown_field_in_a_definition() {
    assert_rejected(
        |sb| {
            sb.edit(
                "definitions/dns.yaml",
                "  driver_type: humanitec/echo\n",
                "  driver_type: humanitec/echo\n  driver_typo: x\n",
            )
        },
        &["definitions/dns.yaml:9:", "unknown field `driver_typo`"],
    );
}

#[test]
fn definition_without_driver_type() {
    assert_rejected(
        |sb| {
            sb.edit(
                "definitions/dns.yaml",
                "  driver_type: humanitec/echo\n",
                "",
            )
        },
        &["definitions/dns.yaml:", "missing field `driver_type`"],
    );
}

#[test]
fn environment_without_type() {
    assert_rejected(
        |sb| {
            sb.write(
                "environments/production.yaml",
                "implicit_resources: [base-env]\n",
            )
        },
        &["environments/production.yaml:", "missing field `type`"],
    );
}

#[test]
fn placeholder_that_is_not_closed() {
    assert_rejected(
        |sb| {
            sb.edit(
                "definitions/redis.yaml",
                "outputs.redis_host}",
                "outputs.redis_host",
            )
        },
        &[
            "definitions/redis.yaml:11:13:",
            "driver_inputs.values.host",
            "placeholder is not closed",
        ],
    );
}

#[test]
fn placeholder_second_in_a_string_points_at_its_column() {
    // `      prefix: ${context.app.id}:${context.res.idd}`: the bad one opens at column 33.
    assert_rejected(
        |sb| {
            sb.edit(
                "definitions/redis.yaml",
                "${context.res.id}",
                "${context.res.idd}",
            )
        },
        &[
            "definitions/redis.yaml:13:33:",
            "driver_inputs.values.prefix",
            "unknown context 'context.res.idd'",
        ],
    );
}

#[test]
fn reference_to_a_type_no_definition_matches() {
    let (_, apply) = assert_rejected(
        |sb| {
            sb.edit(
                "definitions/redis.yaml",
                "      port: 6379\n",
                "      port: 6379\n      vault: ${resources.vault#x.outputs.addr}\n",
            )
        },
        &[
            "definitions/redis.yaml:13",
            "no definition of type 'vault' matches shop/vault.default#x",
        ],
    );
    // Both environments are named.
    apply.stderr_has("environment development:");
    apply.stderr_has("environment production:");
}

#[test]
fn score_resource_type_without_definition() {
    assert_rejected(
        |sb| {
            sb.edit(
                "workloads/shop/backend.yaml",
                "    type: postgres\n",
                "    type: mongodb\n",
            )
        },
        &[
            "workloads/shop/backend.yaml:21",
            "no definition of type 'mongodb' matches shop/mongodb.default#modules.backend.externals.db",
        ],
    );
}

#[test]
fn no_definition_for_the_class() {
    assert_rejected(
        |sb| {
            sb.edit(
                "workloads/shop/backend.yaml",
                "    type: postgres\n",
                "    type: postgres\n    class: huge\n",
            )
        },
        &[
            "no definition of type 'postgres' matches shop/postgres.huge#modules.backend.externals.db",
            "postgres-dev",
        ],
    );
}

const LOOP: &str = "\
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: def-a
entity:
  type: a
  driver_type: humanitec/echo
  driver_inputs:
    values:
      x: ${resources.b.outputs.y}
  criteria:
    - {}
---
apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: def-b
entity:
  type: b
  driver_type: humanitec/echo
  driver_inputs:
    values:
      y: ${resources.a.outputs.x}
  criteria:
    - {}
";

#[test]
fn dependency_loop_names_every_resource_on_it() {
    assert_rejected(
        |sb| {
            sb.write("definitions/loop.yaml", LOOP);
            let backend = sb.read("workloads/shop/backend.yaml");
            sb.write(
                "workloads/shop/backend.yaml",
                &format!("{backend}  thing:\n    type: a\n"),
            );
        },
        &[
            "dependency loop",
            "shop/a.default#modules.backend.externals.thing",
            "shop/b.default#modules.backend.externals.thing",
            "def-a",
            "def-b",
        ],
    );
}

#[test]
fn equal_criteria_for_one_type() {
    assert_rejected(
        |sb| {
            let redis = sb.read("definitions/redis.yaml");
            sb.write(
                "definitions/redis2.yaml",
                &redis
                    .replace("id: redis", "id: redis-two")
                    .replace("name: redis", "name: redis-two"),
            );
        },
        &[
            "definitions/redis2.yaml:14",
            "'redis' (definitions/redis.yaml:14) and 'redis-two' have equal criteria",
            "type 'redis'",
        ],
    );
}

#[test]
fn duplicate_definition_id() {
    assert_rejected(
        |sb| {
            let redis = sb.read("definitions/redis.yaml");
            sb.write(
                "definitions/shared/redis.yaml",
                &redis.replace("type: redis", "type: memcached"),
            );
        },
        &[
            "definitions/shared/redis.yaml:4",
            "definition id 'redis' is already used in definitions/redis.yaml:4",
        ],
    );
}

#[test]
fn deleting_every_definition_deletes_nothing() {
    assert_rejected(
        |sb| sb.remove("definitions"),
        &[
            "no definition of type 'base-env' matches shop/base-env.default#base-env",
            "no definition of type 'workload' matches shop/workload.default#modules.backend",
        ],
    );
}

#[test]
fn several_errors_are_all_reported() {
    let (_, apply) = assert_rejected(
        |sb| {
            sb.edit(
                "definitions/dns.yaml",
                "  driver_type: humanitec/echo\n",
                "",
            );
            sb.write(
                "environments/production.yaml",
                "implicit_resources: [base-env]\n",
            );
        },
        &["missing field `driver_type`", "missing field `type`"],
    );
    apply.stderr_has("2 error(s)");
}

#[test]
fn validate_accepts_a_good_commit() {
    let sb = Sandbox::template();
    let run = sb.gitplane(&["validate"]).ok();
    run.stdout_has(&format!("ok: commit {} is valid", &sb.head()[..12]));
    assert!(run.stderr.is_empty(), "{run}");
}

#[test]
fn unknown_environment_is_an_error() {
    let sb = Sandbox::template();
    let run = sb.gitplane(&["plan", "--env", "staging"]).fails();
    run.stderr_has("no environment 'staging'");
    run.stderr_has("development, production");
}

#[test]
fn repository_without_commits_is_an_error() {
    let sb = Sandbox::new();
    let run = sb.gitplane(&["apply"]).fails();
    run.stderr_has("no commits");
    let nowhere = sb.root.join("nowhere");
    let run = sb
        .gitplane_raw(&["validate", "--repo", nowhere.to_str().unwrap()], &[])
        .fails();
    run.stderr_has("nowhere");
}
