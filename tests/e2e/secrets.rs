//! Secret values never leave `resource_secret`: not in any command's output, not in logs, not
//! in any other table or view; there they are sealed with the state key, and the state file is
//! readable by its owner alone.

use crate::util::{Run, Sandbox, rows};

/// Distinctive secret values: two added by [`with_secrets`], two from the template.
const SECRETS: [&str; 4] = [
    "s3cr3t-XYZZY",
    "s3cr3t-REFS-42",
    "dev-password-change-me",
    "prod-password-change-me",
];

/// The template plus secrets that travel: a secret output of base-env read by postgres's
/// secrets (whole and inside a longer string), and a `secret_refs` value on redis.
fn with_secrets() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.edit(
        "definitions/base-env.yaml",
        "      pgpassword: dev-password-change-me\n",
        "      pgpassword: dev-password-change-me\n      api_token: s3cr3t-XYZZY\n",
    );
    sb.edit(
        "definitions/postgres.yaml",
        "      password: ${resources.base-env#base-env.outputs.pgpassword}\n  criteria:\n    - env_type: development\n",
        "      password: ${resources.base-env#base-env.outputs.pgpassword}\n      \
         token: ${resources.base-env#base-env.outputs.api_token}\n      \
         dsn: postgres://u:${resources.base-env#base-env.outputs.pgpassword}@db/x\n  \
         criteria:\n    - env_type: development\n",
    );
    sb.edit(
        "definitions/redis.yaml",
        "      prefix: ${context.app.id}:${context.res.id}\n",
        "      prefix: ${context.app.id}:${context.res.id}\n    secret_refs:\n      auth:\n        value: s3cr3t-REFS-42\n",
    );
    sb.commit("Secrets");
    sb
}

#[track_caller]
fn assert_no_secret(run: &Run) {
    run.hides(&SECRETS);
}

/// Runs `args` with each log level and checks the output has no secret.
fn check_commands(sb: &Sandbox, commands: &[&[&str]]) {
    for log in [None, Some("debug"), Some("trace")] {
        for args in commands {
            let env: Vec<(&str, &str)> = log.map(|l| ("GITPLANE_LOG", l)).into_iter().collect();
            let run = sb.gitplane_env(args, &env);
            assert_no_secret(&run);
        }
    }
}

const READ_COMMANDS: &[&[&str]] = &[
    &["validate"],
    &["plan"],
    &["plan", "--format", "steps-json"],
    &["plan", "--env", "development", "--format", "steps-json"],
    &["status"],
    &["status", "--format", "json"],
    &["graph"],
    &["graph", "--format", "json"],
    &["graph", "--env", "development", "--format", "json"],
];

/// No secret in any table or view but `resource_secret`, which does hold them.
#[track_caller]
fn assert_state_clean(sb: &Sandbox) {
    let conn = sb.db();
    let names = rows(
        &conn,
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') \
         AND name NOT LIKE 'sqlite_%' AND name != 'resource_secret' ORDER BY name",
    );
    let names: Vec<String> = names.into_iter().map(|mut r| r.remove(0)).collect();
    for required in [
        "resource",
        "deployment",
        "operation",
        "edge",
        "current_resources",
        "deployments",
        "failures",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "no {required} in {names:?}"
        );
    }
    for name in &names {
        for row in rows(&conn, &format!("SELECT * FROM \"{name}\"")) {
            for cell in &row {
                for secret in SECRETS {
                    assert!(
                        !cell.contains(secret),
                        "secret {secret:?} in {name}: {row:?}"
                    );
                }
            }
        }
    }
    // Sealed in the file: only the state key opens them.
    let sealed = rows(&conn, "SELECT outputs, inputs FROM resource_secret")
        .concat()
        .join("\n");
    for secret in SECRETS {
        assert!(
            !sealed.contains(secret),
            "{secret:?} in resource_secret: {sealed}"
        );
    }
    let secrets = sb
        .unsealed("SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret")
        .join("\n");
    assert!(
        secrets.contains("s3cr3t-XYZZY"),
        "resource_secret: {secrets}"
    );
    assert!(
        secrets.contains("s3cr3t-REFS-42"),
        "resource_secret: {secrets}"
    );
}

#[cfg(unix)]
#[track_caller]
fn assert_private(sb: &Sandbox) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sb.state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} has mode {mode:o}", sb.state.display());
    for suffix in ["-wal", "-shm", "-journal"] {
        let path = sb.state.with_file_name(format!("state.db{suffix}"));
        if let Ok(meta) = std::fs::metadata(&path) {
            let mode = meta.permissions().mode() & 0o777;
            assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
        }
    }
}

#[test]
fn secrets_stay_out_of_every_command_output() {
    let sb = with_secrets();
    // Before the first apply, and with every log level.
    check_commands(
        &sb,
        &[
            &["validate"],
            &["plan"],
            &["plan", "--format", "steps-json"],
            &["graph", "--format", "json"],
        ],
    );
    let apply = sb
        .gitplane_env(&["apply"], &[("GITPLANE_LOG", "debug")])
        .ok();
    assert_no_secret(&apply);
    assert_state_clean(&sb);
    #[cfg(unix)]
    assert_private(&sb);
    check_commands(&sb, READ_COMMANDS);

    // A rotated secret reaches the driver (the resources that read it are updated), and still
    // shows nowhere.
    sb.edit(
        "definitions/base-env.yaml",
        "api_token: s3cr3t-XYZZY",
        "api_token: s3cr3t-XYZZY-rotated",
    );
    sb.commit("Rotate the token");
    check_commands(&sb, READ_COMMANDS);
    let apply = sb
        .gitplane_env(&["apply"], &[("GITPLANE_LOG", "trace")])
        .ok();
    assert_no_secret(&apply);
    let d = sb.last_deployment("development");
    let updated: Vec<String> = sb
        .operations(d.id)
        .into_iter()
        .map(|(_, res_id, _)| res_id)
        .collect();
    assert!(
        updated.contains(&"base-env".to_owned())
            && updated.contains(&"modules.backend.externals.db".to_owned()),
        "a rotated secret must update what reads it: {updated:?}{apply}"
    );
    assert_eq!(sb.last_deployment("production").counts, [0, 0, 0, 6, 0]);
    assert_state_clean(&sb);
    let stored = sb
        .unsealed("SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret")
        .join("\n");
    assert!(stored.contains("s3cr3t-XYZZY-rotated"), "{stored}");
    check_commands(&sb, READ_COMMANDS);
    #[cfg(unix)]
    assert_private(&sb);
}

/// Applies a commit that fails (after `mutate`), with and without debug logs, and checks that no
/// output and no table holds a secret.
fn failing_commit(mutate: impl FnOnce(&Sandbox)) {
    let sb = with_secrets();
    sb.gitplane(&["apply"]).ok();
    mutate(&sb);
    sb.commit("A failing commit");
    let apply = sb.gitplane(&["apply"]).fails();
    assert_no_secret(&apply);
    let apply = sb
        .gitplane_env(&["apply"], &[("GITPLANE_LOG", "debug")])
        .fails();
    assert_no_secret(&apply);
    check_commands(&sb, READ_COMMANDS);
    assert_state_clean(&sb);
    let d = sb.last_deployment("development");
    assert_eq!(d.status, "failed", "{d:?}");
    assert!(d.error.is_some(), "{d:?}");
}

#[test]
fn secrets_stay_out_of_a_failing_apply_when_values_read_a_secret() {
    // Resolves only at apply time: values may not read a secret output.
    failing_commit(|sb| {
        sb.edit(
            "definitions/postgres.yaml",
            "      name: ${context.app.id}_${context.env.id}\n",
            "      name: ${context.app.id}_${context.env.id}\n      \
             leak: x-${resources.base-env#base-env.outputs.api_token}\n",
        )
    });
}

#[test]
fn secrets_stay_out_of_a_failing_apply_on_a_yaml_error_at_a_secret() {
    failing_commit(|sb| {
        sb.edit(
            "definitions/base-env.yaml",
            "api_token: s3cr3t-XYZZY\n",
            "api_token: s3cr3t-XYZZY: [x\n",
        )
    });
}

#[test]
fn secrets_stay_out_of_a_failing_apply_on_a_bad_secret_ref() {
    failing_commit(|sb| {
        sb.edit(
            "definitions/redis.yaml",
            "      auth:\n        value: s3cr3t-REFS-42\n",
            "      auth: s3cr3t-REFS-42\n",
        )
    });
}

#[test]
fn secrets_stay_out_of_a_failing_apply_on_a_build_error_in_a_secret_definition() {
    failing_commit(|sb| {
        sb.edit(
            "definitions/base-env.yaml",
            "      api_token: s3cr3t-XYZZY\n",
            "      api_token: s3cr3t-XYZZY\n      vault: ${resources.vault#v.outputs.token}\n",
        )
    });
}

#[test]

fn secrets_stay_out_of_a_failing_apply_on_a_bad_placeholder_in_a_secret() {
    failing_commit(|sb| {
        sb.edit(
            "definitions/base-env.yaml",
            "pgpassword: dev-password-change-me\n",
            "pgpassword: dev-password-change-me-${oops\n",
        )
    });
}

#[test]
fn state_file_is_private_even_when_the_first_apply_fails() {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.edit(
        "definitions/dns.yaml",
        "  driver_type: humanitec/echo\n",
        "",
    );
    sb.commit("Broken from the start");
    sb.gitplane(&["apply"]).fails();
    #[cfg(unix)]
    assert_private(&sb);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE status = 'failed'"),
        2
    );
}

#[test]
fn a_state_file_copied_without_its_key_shows_no_secret() {
    let sb = with_secrets();
    sb.gitplane(&["apply"]).ok();
    sb.assert_state_bytes_hide(&SECRETS);
    let key = std::fs::read_to_string(sb.root.join("state.db.key")).unwrap();
    assert_eq!(key.trim().len(), 64, "{key}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(sb.root.join("state.db.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }

    // The copy (a backup, say) without the key: reports work, nothing reads a secret.
    let copy = sb.root.join("copy/state.db");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    sb.db()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    std::fs::copy(&sb.state, &copy).unwrap();
    let args = |cmd: &'static str| {
        vec![
            cmd,
            "--repo",
            sb.origin.to_str().unwrap(),
            "--state",
            copy.to_str().unwrap(),
        ]
    };
    sb.gitplane_raw(&args("status"), &[]).ok();
    sb.gitplane_raw(&args("history"), &[]).ok();
    // A change that needs the secrets (what the redis reads changes).
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    sb.commit("A new port");
    let deployments = crate::util::rows(
        &crate::util::open_db(&copy),
        "SELECT COUNT(*) FROM deployment",
    );
    let run = sb.gitplane_raw(&args("apply"), &[]).fails();
    run.stderr_has("state.db.key: no such file, and the state file's secrets are sealed with key")
        .stderr_has("restore that key file");
    assert_no_secret(&run);
    assert!(
        !copy.with_extension("db.key").exists(),
        "no stray key was made"
    );
    assert_eq!(
        crate::util::rows(
            &crate::util::open_db(&copy),
            "SELECT COUNT(*) FROM deployment"
        ),
        deployments,
        "no deployment was recorded"
    );

    // With another key: refused, and said so.
    std::fs::write(
        copy.with_extension("db.key"),
        format!("{}\n", "ab".repeat(32)),
    )
    .unwrap();
    sb.gitplane_raw(&args("apply"), &[])
        .fails()
        .stderr_has("is not the key this state file's secrets were sealed with");
}

#[test]
fn rekey_seals_every_secret_with_a_new_key() {
    let sb = with_secrets();
    sb.gitplane(&["apply"]).ok();
    let key_file = sb.root.join("state.db.key");
    let old_key = std::fs::read_to_string(&key_file).unwrap();
    let sealed = |sb: &Sandbox| {
        sb.unsealed("SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret")
    };
    let before = sealed(&sb);
    let raw_before = sb.column("SELECT outputs FROM resource_secret");
    let show = ["manifests", "--env", "development", "--show-secrets"];
    let manifests_before = sb.gitplane(&show).ok().stdout;
    assert!(manifests_before.contains("dev-password-change-me"));
    let raw_manifests = sb.column("SELECT sealed FROM resource_manifest WHERE sealed IS NOT NULL");
    assert!(!raw_manifests.is_empty());

    let run = sb.gitplane(&["state", "rekey"]).ok();
    run.stdout_has("sealed with the new key");
    let new_key = std::fs::read_to_string(&key_file).unwrap();
    assert_ne!(old_key, new_key);
    assert!(!sb.root.join("state.db.key.new").exists());
    // The same secrets, sealed anew: every stored value changed, and opens with the new key.
    assert_eq!(sealed(&sb), before);
    let raw_after = sb.column("SELECT outputs FROM resource_secret");
    assert!(raw_before.iter().all(|v| !raw_after.contains(v)));
    // Manifests that hold secrets are sealed anew too.
    assert_eq!(sb.gitplane(&show).ok().stdout, manifests_before);
    let raw_after = sb.column("SELECT sealed FROM resource_manifest WHERE sealed IS NOT NULL");
    assert!(raw_manifests.iter().all(|v| !raw_after.contains(v)));
    sb.assert_state_bytes_hide(&SECRETS);

    // A rekey cut off after it sealed with its new key but before it put the key in place
    // (the new key still `.new`, the old one in place): the next rekey finishes it first.
    let pending = sb.root.join("state.db.key.new");
    std::fs::rename(&key_file, &pending).unwrap();
    std::fs::write(&key_file, &old_key).unwrap();
    sb.gitplane(&["state", "rekey"]).ok();
    assert!(!pending.exists());
    assert_eq!(sealed(&sb), before);

    // Deployments go on with the new key.
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    sb.commit("A new port");
    sb.gitplane(&["apply"]).ok().stdout_has("updated");
    // The old key opens nothing any more.
    std::fs::write(&key_file, &old_key).unwrap();
    sb.edit("definitions/redis.yaml", "port: 6380", "port: 6381");
    sb.commit("Another port");
    sb.gitplane(&["apply"])
        .fails()
        .stderr_has("is not the key this state file's secrets were sealed with");
}
