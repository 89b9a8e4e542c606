//! What scripts rely on from the command line: `--version` names the commit, shell completions,
//! `-o` for `--format`, a closed pipe ends quietly, and `plan`/`apply` with nothing to work on
//! fail without creating a state.

use std::process::{Command, Stdio};

use crate::util::Sandbox;

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let sb = Sandbox::new();
    let run = sb.gitplane_raw(&["--version"], &[]).ok();
    let line = run.stdout.trim();
    let expected_prefix = format!("gitplane {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(line.starts_with(&expected_prefix), "{line}");
    // Built from this checkout: its HEAD's commit and date.
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]);
    if !head.is_empty() {
        let date = git(&["log", "-1", "--format=%cs"]);
        assert_eq!(line, format!("{expected_prefix}{head}, {date})"));
    }
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    let sb = Sandbox::new();
    for (shell, marker) in [
        ("bash", "complete -F _gitplane"),
        ("zsh", "#compdef gitplane"),
        ("fish", "complete -c gitplane"),
    ] {
        let run = sb.gitplane_raw(&["completion", shell], &[]).ok();
        assert!(
            run.stdout.contains(marker),
            "{shell}: {}",
            &run.stdout[..200]
        );
        for command in ["apply", "plan", "status", "explain", "daemon"] {
            assert!(run.stdout.contains(command), "{shell} lacks {command}");
        }
    }
    sb.gitplane_raw(&["completion", "tcsh"], &[])
        .fails()
        .stderr_has("invalid value 'tcsh'");
}

#[test]
fn dash_o_is_format() {
    let sb = Sandbox::applied();
    let long = sb.gitplane(&["status", "--format", "json"]).ok();
    let short = sb.gitplane(&["status", "-o", "json"]).ok();
    assert_eq!(short.json(), long.json());
    let long = sb.gitplane(&["plan", "--format", "markdown"]).ok();
    let short = sb.gitplane(&["plan", "-o", "markdown"]).ok();
    assert_eq!(short.stdout, long.stdout);
}

/// `gitplane completion bash | head -1`, `gitplane history | head`: the reader closes the pipe
/// before gitplane has written everything; gitplane stops quietly and exits 0.
#[test]
fn a_closed_pipe_ends_quietly() {
    let sb = Sandbox::applied();
    let state = sb.state.to_str().unwrap().to_owned();
    let repo = sb.origin.to_str().unwrap().to_owned();
    for args in [
        vec!["completion", "bash"],
        vec!["history", "--state", &state, "--repo", &repo],
        vec!["status", "--state", &state, "--repo", &repo],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gitplane"))
            .args(&args)
            .current_dir(&sb.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The read end closes before gitplane writes: its first write meets a closed pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}

/// A repository whose commit declares no environment, and a folder that is no repository:
/// `plan` and `apply` say so, fail, and leave no state file behind.
#[test]
fn plan_and_apply_with_nothing_to_work_on_fail_and_create_nothing() {
    let sb = Sandbox::new();
    sb.write(
        "definitions/echo.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: e\nentity:\n  \
         type: config\n  driver_type: echo\n  criteria:\n    - {}\n",
    );
    let commit = sb.commit("Definitions, no environment yet");
    for command in ["plan", "apply"] {
        sb.gitplane(&[command]).fails().stderr_has(&format!(
            "error: commit {} declares no environment (no environments/<id>.yaml) and the state \
             records none",
            &commit[..12]
        ));
        assert!(
            !sb.state.exists(),
            "{command} created {}",
            sb.state.display()
        );
    }

    let empty = sb.root.join("not-a-repository");
    std::fs::create_dir(&empty).unwrap();
    let state = empty.join("gitplane.db");
    for command in ["plan", "apply"] {
        let run = sb.gitplane_raw(
            &[
                command,
                "--repo",
                empty.to_str().unwrap(),
                "--state",
                state.to_str().unwrap(),
            ],
            &[],
        );
        run.fails().stderr_has("not a git repository");
        assert!(!state.exists(), "{command} created {}", state.display());
    }
}

/// A list command's JSON is an array whether one environment or several are shown: a script
/// written against one environment keeps working the day a second appears.
#[test]
fn list_commands_give_an_array_for_one_environment_as_for_two() {
    let sb = Sandbox::applied();
    for command in [
        vec!["status", "-o", "json"],
        vec!["history", "-o", "json"],
        vec!["graph", "-o", "json"],
        vec!["plan", "-o", "steps-json"],
        vec!["report", "resources", "-o", "json"],
    ] {
        let all = sb.gitplane(&command).ok().json();
        let mut one_env = command.clone();
        one_env.extend(["--env", "production"]);
        let one = sb.gitplane(&one_env).ok().json();
        for (what, value) in [("every environment", &all), ("--env production", &one)] {
            assert!(value.is_array(), "{command:?} ({what}): {value}");
        }
        assert!(
            one.as_array().unwrap().len() < all.as_array().unwrap().len(),
            "{command:?}: --env production shows less than every environment"
        );
    }
    // A command about one thing gives that thing.
    assert!(sb.gitplane(&["plan", "-o", "json"]).ok().json().is_object());
}

/// "What is broken in app X" without SQL: `status` says per app how many resources failed, the
/// worst app first, and filters by app, type and status.
#[test]
fn status_summarises_each_app_worst_first_and_filters() {
    use gitplane_testkit::{Behavior, DriverServer};

    use crate::util::{Definition, definitions, http_driver_config};

    let server = DriverServer::start();
    server.behave(
        "postgres",
        Behavior {
            fail: Some((400, 1000)),
            ..Behavior::default()
        },
    );
    let sb = Sandbox::new();
    sb.write(
        "environments/test.yaml",
        "type: test\nimplicit_resources: []\n",
    );
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::new("workload", "humanitec/echo").value("namespace: app"),
            Definition::http("postgres").value("size: small"),
            Definition::new("redis", "humanitec/echo").value("host: cache"),
        ]),
    );
    for (app, resource) in [("billing", "postgres"), ("shop", "redis")] {
        sb.write(
            &format!("workloads/{app}/api.yaml"),
            &format!(
                "apiVersion: score.dev/v1b1\nmetadata:\n  name: api\ncontainers:\n  main:\n    \
                 image: x\nresources:\n  store:\n    type: {resource}\n"
            ),
        );
    }
    sb.commit("Two apps, one with a database the driver refuses");
    let config = sb.root.join("host.yaml");
    std::fs::write(&config, http_driver_config(&server.url, "timeout: 10s")).unwrap();
    let config = config.to_str().unwrap();
    sb.gitplane(&["apply", "--config", config]).fails();

    let table = sb.gitplane(&["status"]).ok().stdout;
    let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
    let summary: Vec<String> = table
        .lines()
        .map(words)
        .skip_while(|l| l != "APP RESOURCES STATUS")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    // The billing workload waits for its database: not created, so not counted.
    assert_eq!(
        summary,
        ["billing 1 failed, 0 ready FAILED", "shop 2 ready READY"],
        "{table}"
    );

    let failed = sb
        .gitplane(&["status", "--status", "failed", "-o", "json"])
        .ok()
        .json();
    let resources = failed[0]["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 1, "{failed}");
    assert_eq!(resources[0]["type"], "postgres");
    assert_eq!(failed[0]["apps"][0]["app"], "billing");
    assert_eq!(failed[0]["apps"][0]["status"], "failed");

    let shop = sb
        .gitplane(&["status", "--app", "shop", "-o", "json"])
        .ok()
        .json();
    let apps: Vec<&str> = shop[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["app"].as_str().unwrap())
        .collect();
    assert_eq!(apps, ["shop", "shop"]);
    let workloads = sb
        .gitplane(&["status", "--type", "workload", "-o", "json"])
        .ok()
        .json();
    let types: Vec<&str> = workloads[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["workload"]);
}
