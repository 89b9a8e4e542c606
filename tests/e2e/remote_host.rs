//! The commands on the daemon's own host, whose host config names a remote repository
//! (`repo: {url}`): those that read only the state need no repository, those that read commits
//! use the mirror the daemon keeps, from any folder; a missing mirror is named in the error.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gitplane_testkit::eventually;

use crate::daemon::Daemon;
use crate::util::{Run, Sandbox, open_db, rows};

/// `gitplane ARGS --config CONFIG`, run in `cwd` with `env`: nothing else tells it where the
/// repository or the state is.
pub(crate) fn gitplane_in(cwd: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gitplane"));
    cmd.current_dir(cwd)
        .args(args)
        .args(["--config", config.to_str().unwrap()])
        .env_remove("GITPLANE_REPO")
        .env_remove("GITPLANE_STATE")
        .env_remove("STATE_DIRECTORY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::from_command(cmd)
}

/// What the state commands show about the deployed template, for a host config with a remote.
fn the_commands_work_from_elsewhere(
    sb: &Sandbox,
    config: &Path,
    env: &[(&str, &str)],
    deployed: &str,
) {
    let elsewhere = sb.root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let status = gitplane_in(&elsewhere, config, &["status", "-o", "json"], env).ok();
    let text = status.stdout.clone();
    assert!(
        text.contains("modules.backend.externals.db") && text.contains("production"),
        "{text}"
    );
    let history = gitplane_in(&elsewhere, config, &["history"], env).ok();
    assert!(
        history.stdout.contains(&deployed[..7]),
        "{}",
        history.stdout
    );
    gitplane_in(&elsewhere, config, &["report", "resources"], env)
        .ok()
        .stdout_has("modules.backend.externals.db");
    // Commands that read commits read the daemon's mirror.
    gitplane_in(
        &elsewhere,
        config,
        &[
            "explain",
            "shop/postgres.default#modules.backend.externals.db",
            "--env",
            "development",
        ],
        env,
    )
    .ok()
    .stdout_has("DEFINITION at commit");
    gitplane_in(&elsewhere, config, &["plan"], env).ok();
}

/// A daemon whose host config names the sandbox's bare repository as a remote (`repo: {url:
/// file://..., interval}`, then `more`) and a state in `remote-state/`, started and waited for
/// until it deployed the template's two environments; the daemon, the config and the state.
pub(crate) fn daemon_of_remote(
    sb: &Sandbox,
    interval: &str,
    more: &str,
) -> (Daemon, PathBuf, PathBuf) {
    let state = sb.root.join("remote-state/state.db");
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {{url: \"file://{}\", interval: {interval}}}\nstate: {}\n{more}",
            sb.origin.display(),
            state.display()
        ),
    )
    .unwrap();
    let head = sb.head();
    let daemon = Daemon::start(sb, &["--config", config.to_str().unwrap()]);
    eventually("the template deployed", Duration::from_secs(30), || {
        let db = open_db(state.exists().then_some(&state)?);
        let done = rows(
            &db,
            &format!(
                "SELECT COUNT(*) FROM deployment WHERE commit_id = '{head}' AND status = 'succeeded'"
            ),
        );
        (done[0][0] == "2").then_some(())
    });
    (daemon, config, state)
}

#[test]
fn with_a_remote_repo_the_commands_read_the_state_and_the_daemons_mirror() {
    let sb = Sandbox::template();
    let head = sb.head();
    let (daemon, config, _) = daemon_of_remote(&sb, "300ms", "");
    drop(daemon);
    the_commands_work_from_elsewhere(&sb, &config, &[], &head);

    // Without the mirror, the state commands still work; the others say where it was looked for.
    let mirror = sb.root.join("remote-state/mirror.git");
    std::fs::rename(&mirror, sb.root.join("moved.git")).unwrap();
    let elsewhere = sb.root.join("elsewhere");
    gitplane_in(&elsewhere, &config, &["status"], &[]).ok();
    gitplane_in(&elsewhere, &config, &["plan"], &[])
        .fails()
        .stderr_has(&format!(
            "error: the host config's repo is the remote file://{}, whose mirror the daemon keeps \
             at {}; it is not there",
            sb.origin.display(),
            mirror.display()
        ));
}

/// The layout docs/postgres.md recommends: a remote repository and a PostgreSQL state; the
/// mirror lives in the service's state directory.
#[test]
#[cfg_attr(not(postgres), ignore = "PostgreSQL (initdb, pg_ctl) is not installed")]
fn with_a_remote_repo_and_postgres_the_commands_work_as_on_the_daemons_host() {
    let Some(server) = gitplane_testkit::shared_or_skip("remote_host_postgres") else {
        return;
    };
    let url = server.database();
    let sb = Sandbox::template();
    let state_directory: PathBuf = sb.root.join("var-lib-gitplane");
    std::fs::create_dir_all(&state_directory).unwrap();
    let key = sb.root.join("state.key");
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {{url: \"file://{}\", interval: 300ms}}\nstate: {url}\nstate_key: {{file: {}}}\n",
            sb.origin.display(),
            key.display()
        ),
    )
    .unwrap();
    let env = [("STATE_DIRECTORY", state_directory.to_str().unwrap())];
    let head = sb.head();
    let daemon = Daemon::start_with_env(&sb, &["--config", config.to_str().unwrap()], &env);
    let elsewhere = sb.root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    eventually("the template deployed", Duration::from_secs(30), || {
        let run = gitplane_in(&elsewhere, &config, &["history", "-o", "json"], &env);
        (run.code == Some(0) && run.stdout.matches("\"succeeded\"").count() >= 2).then_some(())
    });
    assert!(state_directory.join("mirror.git").exists());
    the_commands_work_from_elsewhere(&sb, &config, &env, &head);
    drop(daemon);
}
