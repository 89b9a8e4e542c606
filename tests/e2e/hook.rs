//! `gitplane validate --pre-receive` installed as the `pre-receive` hook of the bare repository:
//! real pushes through real git, which keeps the pushed objects in its quarantine while the hook
//! runs.

use std::path::Path;
use std::process::Command;

use crate::util::{Run, Sandbox};

/// Installs `origin.git/hooks/pre-receive`: a shell script that execs gitplane with `args`.
fn install_hook(sb: &Sandbox, args: &[&str]) {
    let mut script = format!(
        "#!/bin/sh\nexec '{}' validate --pre-receive",
        env!("CARGO_BIN_EXE_gitplane")
    );
    for a in args {
        script.push_str(&format!(" '{a}'"));
    }
    script.push('\n');
    let path = sb.origin.join("hooks").join("pre-receive");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The hook of the tests: `--repo origin.git`.
fn install_default_hook(sb: &Sandbox) {
    install_hook(sb, &["--repo", sb.origin.to_str().unwrap()]);
}

/// `git ARGS` in the clone, isolated like the harness's git, without asserting success.
fn git_run(sb: &Sandbox, args: &[&str]) -> Run {
    let mut cmd = Command::new("git");
    for var in [
        "GITPLANE_CONFIG",
        "GITPLANE_REPO",
        "GITPLANE_STATE",
        "GITPLANE_LOG",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_QUARANTINE_PATH",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .current_dir(&sb.work)
        .args(args);
    let command = format!("(in {}) git {}", sb.work.display(), args.join(" "));
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command}: {e}"));
    Run {
        command,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `git push origin REFSPEC` from the clone.
fn push(sb: &Sandbox, refspec: &str) -> Run {
    git_run(sb, &["push", "origin", refspec])
}

/// `git add -A` and `git commit`, without pushing; returns the new commit id.
fn commit_only(sb: &Sandbox, message: &str) -> String {
    sb.git(&["add", "-A"]);
    sb.git(&["commit", "--quiet", "-m", message]);
    sb.head()
}

/// What the hook printed, as git relays it (`remote: ` stripped, trailing padding trimmed).
fn remote_lines(run: &Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("remote: "))
        .map(str::trim_end)
        .collect()
}

/// The `error: ` lines the hook printed.
fn remote_errors(run: &Run) -> Vec<&str> {
    remote_lines(run)
        .into_iter()
        .filter(|l| l.starts_with("error:"))
        .collect()
}

/// The commit `rev` names in the bare repository.
fn origin_rev(sb: &Sandbox, rev: &str) -> String {
    sb.git_in(&sb.origin, &["rev-parse", rev]).trim().to_owned()
}

/// Whether the bare repository has the object `id` (a rejected push leaves none behind).
fn origin_has(origin: &Path, id: &str) -> bool {
    Command::new("git")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .current_dir(origin)
        .args(["cat-file", "-e", id])
        .status()
        .unwrap()
        .success()
}

/// The template pushed through the hook, which accepts it; returns the commit.
#[track_caller]
fn push_template(sb: &Sandbox) -> String {
    sb.seed_template();
    let good = commit_only(sb, "Initial platform configuration");
    let run = push(sb, "main").ok();
    let ok = format!("ok: commit {} for refs/heads/main is valid: ", &good[..12]);
    assert!(
        remote_lines(&run).iter().any(|l| l.starts_with(&ok)),
        "no {ok:?} line:{run}"
    );
    assert_eq!(origin_rev(sb, "main"), good);
    good
}

/// Pushes a commit that `validate` rejects to `main` and checks the hook rejects it with the
/// same errors, containing every `expected` substring, and leaves `main` at `good`.
#[track_caller]
fn assert_push_rejected(sb: &Sandbox, good: &str, expected: &[&str]) -> Run {
    let bad = commit_only(sb, "A bad commit");
    let run = push(sb, "main").fails();
    run.stderr_has("pre-receive hook declined");
    let errors = remote_errors(&run);
    assert!(!errors.is_empty(), "no error lines:{run}");
    for needle in expected {
        assert!(
            errors.iter().any(|l| l.contains(needle)),
            "no remote error line contains {needle:?}:{run}"
        );
    }
    assert!(
        remote_lines(&run)
            .iter()
            .any(|l| l.contains(&format!("commit {} rejected", &bad[..12]))),
        "{run}"
    );
    // The same errors as `gitplane validate` of that commit (read from the clone: the bare
    // repository never received it).
    let validate = sb.gitplane_raw(
        &[
            "validate",
            "--repo",
            sb.work.to_str().unwrap(),
            "--rev",
            &bad,
        ],
        &[],
    );
    let validate = validate.fails();
    assert_eq!(
        errors,
        validate.error_lines(),
        "the hook and validate disagree:{run}{validate}"
    );
    assert_eq!(origin_rev(sb, "main"), good, "main moved:{run}");
    assert!(
        !origin_has(&sb.origin, &bad),
        "the rejected commit entered the repository"
    );
    run
}

#[test]
fn accepts_a_valid_push_and_rejects_a_yaml_error() {
    let sb = Sandbox::new();
    install_default_hook(&sb);
    let good = push_template(&sb);
    sb.edit(
        "definitions/redis.yaml",
        "      port: 6379\n",
        "      port: 6379: x\n",
    );
    assert_push_rejected(
        &sb,
        &good,
        &[
            "error: definitions/redis.yaml:12:17:",
            "mapping values are not allowed",
        ],
    );
    // Fixed, it goes through, and the commit is the new main.
    sb.edit(
        "definitions/redis.yaml",
        "      port: 6379: x\n",
        "      port: 6380\n",
    );
    let fixed = commit_only(&sb, "Fixed");
    push(&sb, "main").ok();
    assert_eq!(origin_rev(&sb, "main"), fixed);
}

/// More objects than `receive.unpackLimit`: git keeps the push as a pack in the quarantine
/// instead of loose objects.
#[test]
fn reads_a_pushed_pack_from_the_quarantine() {
    let sb = Sandbox::new();
    sb.git_in(&sb.origin, &["config", "receive.unpackLimit", "1"]);
    install_default_hook(&sb);
    let good = push_template(&sb);
    assert!(
        std::fs::read_dir(sb.origin.join("objects/pack"))
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".pack")),
        "the push was not kept as a pack"
    );
    sb.edit(
        "definitions/redis.yaml",
        "      port: 6379\n",
        "     port: 6379\n",
    );
    assert_push_rejected(
        &sb,
        &good,
        &["definitions/redis.yaml:12:", "did not find expected key"],
    );
}

#[test]
fn rejects_an_unknown_driver_type() {
    let sb = Sandbox::new();
    install_default_hook(&sb);
    let good = push_template(&sb);
    sb.edit(
        "definitions/dns.yaml",
        "driver_type: humanitec/echo",
        "driver_type: acme/nope",
    );
    assert_push_rejected(
        &sb,
        &good,
        &[
            "error: definitions/dns.yaml:",
            "uses driver_type 'acme/nope', which is not registered",
        ],
    );
}

#[test]
fn other_branches_pass_untouched() {
    let sb = Sandbox::new();
    install_default_hook(&sb);
    let good = push_template(&sb);
    sb.git(&["checkout", "--quiet", "-b", "feature"]);
    sb.edit(
        "definitions/redis.yaml",
        "      port: 6379\n",
        "      port: 6379: x\n",
    );
    let bad = commit_only(&sb, "Work in progress");
    let run = push(&sb, "feature").ok();
    assert!(remote_errors(&run).is_empty(), "{run}");
    assert_eq!(origin_rev(&sb, "feature"), bad);
    assert_eq!(origin_rev(&sb, "main"), good);
    // Deleting a branch other than main passes too.
    push(&sb, ":feature").ok();
    assert!(
        !sb.git_in(&sb.origin, &["branch", "--list"])
            .contains("feature")
    );
}

#[test]
fn deleting_main_is_rejected() {
    let sb = Sandbox::new();
    install_default_hook(&sb);
    let good = push_template(&sb);
    // Without the hook git would let it happen.
    sb.git_in(
        &sb.origin,
        &["config", "receive.denyDeleteCurrent", "ignore"],
    );
    let run = push(&sb, ":main").fails();
    run.stderr_has("pre-receive hook declined");
    let errors = remote_errors(&run);
    assert_eq!(errors.len(), 1, "{run}");
    assert!(
        errors[0].contains("refs/heads/main")
            && errors[0].contains("deleting it would delete every resource"),
        "{run}"
    );
    assert_eq!(origin_rev(&sb, "main"), good);
}

/// The watched ref comes from the host config, and without `--repo` (nor a repo in the host
/// config) the hook reads the repository git runs it in.
#[test]
fn watches_the_host_configs_ref_in_the_current_repository() {
    let sb = Sandbox::new();
    let config = sb.root.join("host.yaml");
    std::fs::write(&config, "ref: prod\n").unwrap();
    install_hook(&sb, &["--config", config.to_str().unwrap()]);
    sb.seed_template();
    let good = commit_only(&sb, "Initial platform configuration");
    let run = push(&sb, "main:prod").ok();
    assert!(
        remote_lines(&run)
            .iter()
            .any(|l| l.starts_with(&format!("ok: commit {} for refs/heads/prod", &good[..12]))),
        "{run}"
    );
    // main is not watched: a broken main goes through.
    sb.edit(
        "definitions/redis.yaml",
        "      port: 6379\n",
        "      port: 6379: x\n",
    );
    let bad = commit_only(&sb, "A bad commit");
    push(&sb, "main").ok();
    assert_eq!(origin_rev(&sb, "main"), bad);
    // prod is.
    let run = push(&sb, "main:prod").fails();
    assert!(
        remote_errors(&run)
            .iter()
            .any(|l| l.starts_with("error: definitions/redis.yaml:12:17:")),
        "{run}"
    );
    assert_eq!(origin_rev(&sb, "prod"), good);
}

/// A second app beside the template's `shop`: the same workloads under `workloads/blog/`.
fn add_blog(sb: &Sandbox) {
    for file in ["backend.yaml", "frontend.yaml"] {
        sb.write(
            &format!("workloads/blog/{file}"),
            &sb.read(&format!("workloads/shop/{file}")),
        );
    }
}

#[test]
fn a_push_that_changes_one_app_is_validated_by_reading_that_app_alone() {
    let sb = Sandbox::new();
    install_default_hook(&sb);
    let first = push_template(&sb);
    add_blog(&sb);
    let added = commit_only(&sb, "A second app");
    let run = push(&sb, "main").ok();
    let said = format!(
        "ok: commit {} for refs/heads/main is valid: 1 changed app(s) read (blog), the rest as at {}; development (",
        &added[..12],
        &first[..12]
    );
    assert!(
        remote_lines(&run).iter().any(|l| l.starts_with(&said)),
        "no {said:?} line:{run}"
    );
    // A broken workload of that app is rejected with the errors `validate` gives the commit.
    sb.edit(
        "workloads/blog/backend.yaml",
        "      port: 8080\n",
        "      port: 8080: x\n",
    );
    assert_push_rejected(&sb, &added, &["error: workloads/blog/backend.yaml:18:17:"]);
    // A shared file changed: every app is read again.
    sb.git(&["reset", "--quiet", "--hard", &added]);
    sb.edit(
        "definitions/redis.yaml",
        "      port: 6379\n",
        "      port: 6380\n",
    );
    let shared = commit_only(&sb, "A definition changed");
    let run = push(&sb, "main").ok();
    let said = format!(
        "ok: commit {} for refs/heads/main is valid: development (",
        &shared[..12]
    );
    assert!(
        remote_lines(&run).iter().any(|l| l.starts_with(&said)),
        "no {said:?} line:{run}"
    );
}
