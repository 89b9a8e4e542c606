//! Trust boundaries of the state: a rollback goes only to reviewed commits unless forced, a
//! state serves one repository, a daemon whose state key does not open the state refuses to
//! start and takes no lease, and deliberate actions are listed, asked for and attributed.
//!
//! Each test is one finding of the trust-boundaries review, run as a user would: real pushes,
//! the real binary and daemons, a real SQLite file or a real PostgreSQL server (the tests that
//! are about a shared database skip, saying why, on a machine without PostgreSQL).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gitplane_testkit::Postgres;

use crate::daemon::Daemon;
use crate::util::{Run, Sandbox, wait_until};

/// The template's secret values.
const SECRETS: [&str; 2] = ["dev-password-change-me", "prod-password-change-me"];

/// The login name of the user running the tests, and the host name, as gitplane should record
/// them: from the user database and uname, not from `$USER`.
fn login_and_host() -> (String, String) {
    let out = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).output().unwrap();
        assert!(out.status.success(), "{program} {args:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    (out("id", &["-un"]), out("uname", &["-n"]))
}

/// The environment of a systemd unit or a root shell: no `$USER` or `$LOGNAME` to go by.
const NO_USER: [(&str, &str); 2] = [("USER", ""), ("LOGNAME", "")];

/// A second repository with the same environments and apps as the template (another team's
/// platform, say): a history of its own.
fn another_repository() -> Sandbox {
    let other = Sandbox::new();
    other.seed_template();
    other.write("README.md", "Another team's platform\n");
    other.commit("Another platform, the same environment names");
    other
}

/// `path` as the state records a local repository: its canonical path.
fn shown(path: &Path) -> String {
    path.canonicalize().unwrap().display().to_string()
}

// --- Finding 3: `rollback --to` accepted any commit, an unmerged branch included. ---

#[test]
fn rollback_to_an_unmerged_commit_is_refused_unless_forced() {
    let sb = Sandbox::applied();
    // A branch nobody merged drops the backend's database and the frontend's DNS name.
    sb.git(&["checkout", "--quiet", "-b", "feature"]);
    let backend = sb.read("workloads/shop/backend.yaml");
    let backend: String = backend
        .lines()
        .filter(|l| !l.contains("resources.db.") && !l.contains("db:") && !l.contains("Private"))
        .filter(|l| !l.contains("type: postgres"))
        .map(|l| format!("{l}\n"))
        .collect();
    sb.write("workloads/shop/backend.yaml", &backend);
    sb.edit(
        "workloads/shop/frontend.yaml",
        "      PUBLIC_URL: https://${resources.dns.host}\n",
        "",
    );
    sb.edit(
        "workloads/shop/frontend.yaml",
        "  dns:\n    type: dns\n",
        "",
    );
    sb.git(&[
        "commit",
        "--quiet",
        "-am",
        "Unreviewed: no database, no DNS",
    ]);
    sb.git(&["push", "--quiet", "origin", "feature"]);
    let feature = sb.head();
    sb.git(&["checkout", "--quiet", "main"]);

    let resources = sb.resource_rows();
    let deployments = sb.max_id("deployment");
    let run = sb
        .gitplane(&[
            "rollback",
            "--env",
            "production",
            "--to",
            &feature,
            "-m",
            "hotfix",
        ])
        .fails();
    run.stderr_has(&format!(
        "rollback: commit {} is not in the history of refs/heads/main and was never deployed to \
         production",
        &feature[..12]
    ))
    .stderr_has("Pass --force to pin production there anyway")
    .stderr_has("nothing was changed");
    assert_eq!(sb.resource_rows(), resources, "nothing deleted");
    assert_eq!(sb.max_id("deployment"), deployments, "no deployment");
    assert_eq!(sb.count("SELECT COUNT(*) FROM env_pin"), 0, "no pin");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM action WHERE command = 'rollback'"),
        0
    );

    // A commit deployed to the environment before is one people chose to run there.
    sb.gitplane(&["apply", "--env", "development", "--rev", "feature"])
        .ok();
    sb.gitplane(&[
        "rollback",
        "--env",
        "development",
        "--to",
        &feature,
        "-m",
        "keep the branch",
        "--by",
        "bob",
    ])
    .ok();
    assert_eq!(
        sb.column("SELECT forced FROM env_pin WHERE env = 'development'"),
        ["0"]
    );

    // Forced: done, and recorded with the pin, in status, history and the action log.
    let run = sb
        .gitplane(&[
            "rollback",
            "--env",
            "production",
            "--to",
            &feature,
            "-m",
            "hotfix",
            "--force",
            "--by",
            "alice",
        ])
        .ok();
    run.stdout_has("by alice (forced: not in the history of refs/heads/main and never deployed to production): hotfix");
    let rolled = sb.last_deployment("production");
    assert_eq!(
        (rolled.commit.as_str(), rolled.status.as_str()),
        (feature.as_str(), "succeeded")
    );
    assert_eq!(
        rolled.counts[2], 2,
        "the database and the DNS name: {rolled:?}"
    );
    assert_eq!(
        sb.rows("SELECT pinned_by, forced FROM env_pin WHERE env = 'production'"),
        [["alice", "1"]]
    );
    sb.gitplane(&["status", "--env", "production"])
        .ok()
        .stdout_has("(forced: outside the watched ref's history): hotfix");
    let status = sb
        .gitplane(&["status", "--env", "production", "--format", "json"])
        .ok()
        .json()[0]
        .clone();
    assert_eq!(status["pin"]["forced"], true);
    sb.gitplane(&["history"])
        .ok()
        .stdout_has("(forced: outside the watched ref's history): hotfix");
    let action = sb.rows(
        "SELECT actor, deployment_id, detail FROM action WHERE command = 'rollback' \
         AND env = 'production'",
    );
    assert_eq!(action.len(), 1, "{action:?}");
    assert_eq!(action[0][0], "alice");
    assert_eq!(action[0][1], rolled.id.to_string());
    assert!(
        action[0][2].contains("forced: not in the history of refs/heads/main"),
        "{action:?}"
    );
}

// --- Finding 6: two daemons of different repositories on one database shared environments. ---

/// A host config naming the PostgreSQL state at `url`, the key in `key`, and short leases.
fn pg_config(sb: &Sandbox, name: &str, url: &str, key: &Path) -> PathBuf {
    let config = sb.root.join(name);
    std::fs::write(
        &config,
        format!(
            "state: \"{url}\"\nstate_key: {{file: \"{}\"}}\nleases: {{ttl: 6s}}\n",
            key.display()
        ),
    )
    .unwrap();
    config
}

/// Rows of `sql` on the database at `url`, columns split at `|`.
#[track_caller]
fn pg_rows(server: &Postgres, url: &str, sql: &str) -> Vec<Vec<String>> {
    server
        .psql(url, sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

/// Starts a daemon of `sb` with `config` and waits until it deployed `sb`'s head to both
/// environments of the template.
fn deployed_daemon(server: &Postgres, url: &str, sb: &Sandbox, config: &Path) -> Daemon {
    let daemon = Daemon::start(
        sb,
        &[
            "--config",
            config.to_str().unwrap(),
            "--repo",
            sb.origin.to_str().unwrap(),
        ],
    );
    let head = sb.head();
    wait_until(
        "the first daemon deploys the repository",
        Duration::from_secs(60),
        || {
            pg_rows(
                server,
                url,
                &format!(
                    "SELECT COUNT(*) FROM deployment WHERE commit_id = '{head}' \
                     AND status = 'succeeded'"
                ),
            ) == [["2"]]
        },
        || daemon.log(),
    );
    daemon
}

/// The leases that name the daemon with process id `pid`.
fn leases_of(server: &Postgres, url: &str, pid: u32) -> Vec<Vec<String>> {
    pg_rows(
        server,
        url,
        &format!("SELECT env, daemon FROM env_lease WHERE daemon LIKE '%:{pid}'"),
    )
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_daemon_of_another_repository_is_refused_on_a_shared_database() {
    let Some(server) = gitplane_testkit::shared_or_skip("trust_state::another_repository") else {
        return;
    };
    let url = server.database();
    let sb = Sandbox::template();
    let key = sb.root.join("state.key");
    let config = pg_config(&sb, "host.yaml", &url, &key);
    let _first = deployed_daemon(server, &url, &sb, &config);
    let resources = pg_rows(
        server,
        &url,
        "SELECT guresid, commit_id, inputs_hash FROM resource ORDER BY guresid",
    );
    let deployments = pg_rows(server, &url, "SELECT COUNT(*) FROM deployment");

    // Another team's repository, the same environment names, the same database and key.
    let other = another_repository();
    let other_config = pg_config(&other, "host.yaml", &url, &key);
    let mut second = Daemon::spawn(
        &other,
        &[
            "--config",
            other_config.to_str().unwrap(),
            "--repo",
            other.origin.to_str().unwrap(),
        ],
        &[],
    );
    let log = second.refused("the second daemon");
    for needle in [
        "refusing to start, no lease taken".to_owned(),
        format!(
            "belongs to repository {} (root commit {}",
            shown(&sb.origin),
            sb.head()
        ),
        format!(
            "but {} is another repository (root commit {})",
            shown(&other.origin),
            other.head()
        ),
    ] {
        assert!(log.contains(&needle), "{needle:?} not in the log:\n{log}");
    }
    assert_eq!(
        leases_of(server, &url, second.pid()),
        Vec::<Vec<String>>::new()
    );
    assert_eq!(
        pg_rows(
            server,
            &url,
            "SELECT guresid, commit_id, inputs_hash FROM resource ORDER BY guresid"
        ),
        resources,
        "no resource of the first repository changed"
    );
    assert_eq!(
        pg_rows(server, &url, "SELECT COUNT(*) FROM deployment"),
        deployments
    );

    // Commands with the other repository are refused the same way and write nothing.
    let with = |sb: &Sandbox, repo: &Path, args: &[&str]| -> Run {
        let mut all = args.to_vec();
        all.extend([
            "--repo",
            repo.to_str().unwrap(),
            "--state",
            &url,
            "--config",
            config.to_str().unwrap(),
        ]);
        sb.gitplane_raw(&all, &[])
    };
    for command in [&["apply"][..], &["plan"][..]] {
        with(&other, &other.origin, command)
            .fails()
            .stderr_has("is another repository")
            .stderr_has(&shown(&sb.origin));
    }
    assert_eq!(
        pg_rows(server, &url, "SELECT COUNT(*) FROM deployment"),
        deployments
    );
    // A clone of the state's repository is that repository.
    with(&sb, &sb.work, &["plan"]).ok();
}

#[test]
fn a_command_with_another_repository_is_refused_and_a_state_from_before_records_its_own() {
    let sb = Sandbox::applied();
    let first = sb.head();
    assert_eq!(
        sb.rows("SELECT root_commit, url FROM repository"),
        [[first.clone(), shown(&sb.origin)]],
        "the first apply recorded the repository"
    );
    let resources = sb.resource_rows();
    let deployments = sb.max_id("deployment");
    let other = another_repository();
    let with = |repo: &Path, args: &[&str]| -> Run {
        let mut all = args.to_vec();
        all.extend([
            "--repo",
            repo.to_str().unwrap(),
            "--state",
            sb.state.to_str().unwrap(),
        ]);
        sb.gitplane_raw(&all, &[])
    };
    for command in [
        &["apply"][..],
        &["plan"][..],
        &["drift", "--detect"][..],
        &[
            "explain",
            "shop/postgres.default#modules.backend.externals.db",
        ][..],
    ] {
        let run = with(&other.origin, command).fails();
        run.stderr_has(&format!(
            "belongs to repository {} (root commit {first}",
            shown(&sb.origin)
        ))
        .stderr_has(&format!(
            "but {} is another repository (root commit {})",
            shown(&other.origin),
            other.head()
        ));
    }
    // The state opens while the commit is read: what the other repository does not have is
    // still told after it is found to be another repository.
    with(&other.origin, &["apply", "--rev", "no-such-branch"])
        .fails()
        .stderr_has("is another repository");
    assert_eq!(sb.resource_rows(), resources);
    assert_eq!(sb.max_id("deployment"), deployments);
    // The working clone is the same repository: no refusal.
    with(&sb.work, &["plan"]).ok();

    // A state from before the repository was recorded records it on its next use.
    sb.db().execute_batch("DELETE FROM repository").unwrap();
    with(&sb.work, &["plan"]).ok();
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM repository"),
        0,
        "plan writes nothing"
    );
    sb.gitplane(&["apply"]).ok();
    assert_eq!(sb.column("SELECT root_commit FROM repository"), [first]);
}

// --- Finding 7: a daemon with the wrong state_key took leases and failed their deployments. ---

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_daemon_with_the_wrong_state_key_refuses_to_start_and_takes_no_lease() {
    let Some(server) = gitplane_testkit::shared_or_skip("trust_state::wrong_key") else {
        return;
    };
    let url = server.database();
    let sb = Sandbox::template();
    let key = sb.root.join("state.key");
    let config = pg_config(&sb, "host.yaml", &url, &key);
    let first = deployed_daemon(server, &url, &sb, &config);
    let right = gitplane_state::StateKey::parse(&std::fs::read_to_string(&key).unwrap())
        .unwrap()
        .id;
    let held = pg_rows(
        server,
        &url,
        "SELECT env, daemon, generation FROM env_lease ORDER BY env",
    );
    assert_eq!(held.len(), 2, "the first daemon holds both: {held:?}");

    let wrong_file = sb.root.join("wrong.key");
    let wrong = gitplane_state::StateKey::generate();
    wrong.write_new(&wrong_file).unwrap();
    let wrong_config = pg_config(&sb, "wrong.yaml", &url, &wrong_file);
    let mut second = Daemon::spawn(
        &sb,
        &[
            "--config",
            wrong_config.to_str().unwrap(),
            "--repo",
            sb.origin.to_str().unwrap(),
        ],
        &[],
    );
    let log = second.refused("a daemon with the wrong key");
    for needle in [
        "refusing to start, no lease taken".to_owned(),
        format!(
            "state key {} (key {}) is not the key this state file's secrets were sealed with \
             (key {right})",
            wrong_file.display(),
            wrong.id
        ),
    ] {
        assert!(log.contains(&needle), "{needle:?} not in the log:\n{log}");
    }
    for secret in SECRETS {
        assert!(!log.contains(secret), "a secret in the log:\n{log}");
    }
    assert_eq!(
        leases_of(server, &url, second.pid()),
        Vec::<Vec<String>>::new()
    );
    // The first daemon keeps what it held, and nothing failed. Not a wait for an event: time
    // passes to show that the refused daemon took nothing away.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        pg_rows(
            server,
            &url,
            "SELECT env, daemon, generation FROM env_lease ORDER BY env"
        ),
        held
    );
    assert_eq!(
        pg_rows(
            server,
            &url,
            "SELECT COUNT(*) FROM deployment WHERE status = 'failed'"
        ),
        [["0"]]
    );
    drop(first);
}

// --- Finding 8: `approve` deleted hundreds of resources with no list, no question, no name. ---

/// Runs gitplane with `args` in a pseudo-terminal (util-linux `script`), typing `answer`; `None`
/// when `script` is not installed.
fn in_terminal(sb: &Sandbox, args: &[&str], answer: &str) -> Option<Run> {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped the terminal half: no `script` (util-linux) here");
        return None;
    }
    let line = std::iter::once(env!("CARGO_BIN_EXE_gitplane"))
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .current_dir(&sb.root)
        .env("SHELL", "/bin/sh")
        .env_remove("GITPLANE_REPO")
        .env_remove("GITPLANE_STATE")
        .env_remove("GITPLANE_CONFIG")
        .envs(NO_USER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start script");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(answer.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Some(Run {
        command: format!("script -qec {line} /dev/null <<< {answer:?}"),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[test]
fn approve_lists_the_held_deletions_by_app_and_asks_before_it_deletes() {
    let sb = Sandbox::applied();
    // Renaming the only app deletes every resource it has: held.
    sb.git(&["mv", "workloads/shop", "workloads/store"]);
    sb.commit("Rename the app");
    sb.gitplane(&["apply", "--env", "production"])
        .fails()
        .stdout_has("held by the deletion guard");
    let held = sb.last_deployment("production");
    assert_eq!(held.status, "held");
    let id = held.id.to_string();
    let resources = sb.resource_rows();
    let unchanged = |sb: &Sandbox| {
        assert_eq!(sb.resource_rows(), resources, "nothing deleted");
        assert_eq!(sb.last_deployment("production"), held, "still held");
        assert_eq!(
            sb.count("SELECT COUNT(*) FROM action WHERE command = 'approve'"),
            0
        );
    };

    // No terminal to ask on and no --yes: the list, a refusal, nothing changed.
    let run = sb.gitplane(&["approve", &id]).fails();
    run.stdout_has(&format!("Deployment {id} of production (commit"))
        .stdout_has("It deletes 6 resource(s):\n  app shop (6):\n")
        .stdout_has("    postgres.default#modules.backend.externals.db\n")
        .stdout_has("    workload.default#modules.frontend\n")
        .stderr_has(&format!(
            "approve: deployment {id} deletes 6 resource(s) of production, and there is no \
             terminal to ask on: pass --yes to approve it; nothing was changed"
        ));
    unchanged(&sb);

    let state = sb.state.to_str().unwrap();
    let origin = sb.origin.to_str().unwrap();
    let approve = ["approve", &id, "--repo", origin, "--state", state];
    // On a terminal: asked, and "no" changes nothing.
    if let Some(no) = in_terminal(&sb, &approve, "n\n") {
        assert_eq!(no.code, Some(1), "{no}");
        no.stdout_has("app shop (6):")
            .stdout_has("Delete these 6 resource(s) of production? [y/N]")
            .stdout_has(&format!("Not approved: deployment {id} stays held"));
        unchanged(&sb);
    }
    // "y" (on a terminal), else --yes, with no $USER: approved, and attributed to the user.
    let yes = match in_terminal(&sb, &approve, "y\n") {
        Some(yes) => yes,
        None => sb.gitplane_env(&["approve", &id, "--yes"], &NO_USER),
    };
    assert_eq!(yes.code, Some(0), "{yes}");
    let done = sb.last_deployment("production");
    assert_eq!((done.id, done.status.as_str()), (held.id, "succeeded"));
    assert_eq!(done.counts[2], 6, "{done:?}");

    let (login, host) = login_and_host();
    assert_eq!(
        sb.rows(
            "SELECT env, actor, host, deployment_id, detail FROM action WHERE command = 'approve'"
        ),
        [[
            "production".to_owned(),
            login.clone(),
            host.clone(),
            id.clone(),
            "approved 6 deletion(s); commit ".to_owned()
                + &done.commit[..12]
                + ": succeeded: 6 created, 0 updated, 6 deleted, 0 failed",
        ]]
    );
    sb.gitplane(&["history"]).ok().stdout_has(&format!(
        "approve by {login} on {host} production (deployment {id}): approved 6 deletion(s)"
    ));
    let history = sb
        .gitplane(&["history", "--env", "production", "--format", "json"])
        .ok()
        .json();
    let approved = history
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == held.id)
        .unwrap();
    let commands: Vec<&str> = approved["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["command"].as_str().unwrap())
        .collect();
    assert_eq!(commands, ["approve", "apply"], "newest first: {approved}");
    assert_eq!(approved["actions"][0]["by"], login.as_str());
    assert_eq!(approved["actions"][0]["host"], host.as_str());
}

#[test]
fn every_command_that_changes_state_records_who_and_from_where() {
    let sb = Sandbox::template();
    let first = sb.head();
    sb.gitplane_env(&["apply"], &NO_USER).ok();
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    sb.commit("A new cache port");
    sb.gitplane_env(
        &["apply", "--env", "development", "--by", "ci-bot"],
        &NO_USER,
    )
    .ok();
    sb.gitplane(&[
        "rollback",
        "--env",
        "development",
        "--to",
        &first,
        "-m",
        "the port",
        "--by",
        "alice",
    ])
    .ok();
    sb.gitplane(&["unpin", "--env", "development", "--no-apply", "--by", "bob"])
        .ok();
    sb.gitplane_env(&["drift", "--env", "production", "--detect"], &NO_USER)
        .ok();
    sb.gitplane_env(&["state", "vacuum", "--keep", "1000"], &NO_USER)
        .ok();
    sb.gitplane_env(&["state", "rekey", "--by", "carol"], &NO_USER)
        .ok();

    let (login, host) = login_and_host();
    let rows = sb.rows(
        "SELECT command, COALESCE(env, '-'), actor, host, deployment_id IS NOT NULL FROM action \
         ORDER BY at, command, env",
    );
    let expected: Vec<[&str; 5]> = vec![
        ["apply", "development", &login, &host, "1"],
        ["apply", "production", &login, &host, "1"],
        ["apply", "development", "ci-bot", &host, "1"],
        ["rollback", "development", "alice", &host, "1"],
        ["unpin", "development", "bob", &host, "0"],
        ["drift", "production", &login, &host, "1"],
        ["state vacuum", "-", &login, &host, "0"],
        ["state rekey", "-", "carol", &host, "0"],
    ];
    let expected: Vec<Vec<String>> = expected
        .iter()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect();
    assert_eq!(rows, expected);
    assert!(
        !sb.column("SELECT actor FROM action")
            .iter()
            .any(|a| a == "unknown" || a.is_empty()),
        "every action names someone"
    );
    let history = sb.gitplane(&["history"]).ok();
    history
        .stdout_has("\nactions:\n")
        .stdout_has(&format!("state rekey by carol on {host}: "))
        .stdout_has(&format!(
            "drift by {login} on {host} production (deployment"
        ))
        .stdout_has("unpin by bob on ");
    // The rollback's pin names who made it from the same source.
    assert_eq!(sb.column("SELECT pinned_by FROM env_pin"), ["alice"]);
    assert_eq!(sb.column("SELECT unpinned_by FROM env_pin"), ["bob"]);
}
