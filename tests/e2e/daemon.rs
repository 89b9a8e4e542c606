//! The real daemon on a bare repository, fed by `git push` as people would: every commit is
//! reconciled, bursts coalesce, broken commits change nothing, mass deletions wait for approval,
//! remotes are mirrored, and SIGTERM lets a slow driver call finish.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gitplane_testkit::{eventually, eventually_or, poll};
use serde_json::{Value, json};

use crate::util::{Definition, Sandbox, definitions, http_driver_config};
use gitplane_testkit::{Behavior, DriverServer};

/// A running `gitplane daemon`; killed on drop if still running.
pub(crate) struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon with `args` (after `daemon`) and waits until it says it is ready.
    pub(crate) fn start(sb: &Sandbox, args: &[&str]) -> Daemon {
        Daemon::start_with_env(sb, args, &[])
    }

    /// [`Daemon::start`] with more variables in the daemon's environment.
    pub(crate) fn start_with_env(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let daemon = Daemon::spawn(sb, args, env);
        daemon.wait_for_log("gitplane daemon ready", Duration::from_secs(20));
        daemon
    }

    /// [`Daemon::start`] under an open-file limit of `files` (`ulimit -n`, soft and hard), as
    /// systemd's default of 1024 would have it.
    pub(crate) fn start_with_open_files(sb: &Sandbox, args: &[&str], files: u64) -> Daemon {
        let daemon = Daemon::spawn_program(sb, open_files_limited(files), args, &[]);
        daemon.wait_for_log("gitplane daemon ready", Duration::from_secs(20));
        daemon
    }

    /// Starts the daemon without waiting for it to be ready: for one that should refuse to
    /// start (see [`Daemon::wait_for_exit`]).
    pub(crate) fn spawn(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_program(sb, Command::new(env!("CARGO_BIN_EXE_gitplane")), args, env)
    }

    /// Runs `program daemon ARGS` (a `sh` that execs the binary keeps its process id).
    fn spawn_program(
        sb: &Sandbox,
        mut program: Command,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let log = unique(sb.root.join("daemon.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = program
            .arg("daemon")
            .args(args)
            .envs(env.iter().copied())
            .env_remove("GITPLANE_REPO")
            .env_remove("GITPLANE_STATE")
            .env_remove("GITPLANE_CONFIG")
            .env("GITPLANE_LOG", "info")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .current_dir(&sb.root)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start the daemon");
        Daemon { child, log }
    }

    /// Waits up to `timeout` for the daemon to exit by itself: its exit code, or `None` (killed
    /// by a signal, or still running, which the caller's assertion reports with the log).
    /// Waits for a daemon that must refuse to start: asserts it exits non-zero within 30 s
    /// (`what` says which daemon) and returns its log.
    #[track_caller]
    pub(crate) fn refused(&mut self, what: &str) -> String {
        let code = self.wait_for_exit(Duration::from_secs(30));
        let log = self.log();
        assert!(
            matches!(code, Some(c) if c != 0),
            "{what} must refuse to start (exit {code:?}):\n{log}"
        );
        log
    }

    pub(crate) fn wait_for_exit(&mut self, timeout: Duration) -> Option<i32> {
        poll(timeout, || {
            self.child.try_wait().expect("wait for the daemon")
        })
        .and_then(|s| s.code())
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's process id, for signals.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the daemon's log contains `needle`; fails with the log.
    #[track_caller]
    pub(crate) fn wait_for_log(&self, needle: &str, timeout: Duration) {
        eventually_or(
            format_args!("the daemon to log {needle:?}"),
            timeout,
            || self.log().contains(needle).then_some(()),
            || format!("daemon log:\n{}", self.log()),
        );
    }

    /// SIGTERM, then waits for the exit; returns the exit code and how long it took.
    pub(crate) fn terminate(&mut self) -> (Option<i32>, Duration) {
        let started = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        // Bounded: a daemon that does not stop fails the test instead of hanging it.
        if let Some(status) = poll(Duration::from_secs(60), || {
            self.child.try_wait().expect("wait for the daemon")
        }) {
            return (status.code(), started.elapsed());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        (None, started.elapsed())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A command that runs `gitplane` (the arguments to add) with its open-file limit set to
/// `files`: `sh` sets it and execs the binary.
pub(crate) fn open_files_limited(files: u64) -> Command {
    let mut command = Command::new("sh");
    command.args([
        "-c",
        "ulimit -n \"$0\" && exec \"$@\"",
        &files.to_string(),
        env!("CARGO_BIN_EXE_gitplane"),
    ]);
    command
}

fn unique(path: PathBuf) -> PathBuf {
    let mut n = 0;
    let mut candidate = path.clone();
    while candidate.exists() {
        n += 1;
        candidate = path.with_extension(format!("{n}.log"));
    }
    candidate
}

pub(crate) fn repo_args(sb: &Sandbox) -> Vec<String> {
    vec![
        "--repo".into(),
        sb.origin.display().to_string(),
        "--state".into(),
        sb.state.display().to_string(),
    ]
}

/// Waits until every environment in `envs` has a finished deployment of `commit`.
#[track_caller]
pub(crate) fn wait_deployed(
    sb: &Sandbox,
    commit: &str,
    envs: &[&str],
    timeout: Duration,
) -> Vec<Value> {
    eventually(
        format_args!("commit {commit} deployed to {envs:?}"),
        timeout,
        || {
            let rows = sb.state.exists().then(|| {
                sb.rows(&format!(
                    "SELECT env, status FROM deployment WHERE commit_id = '{commit}' \
                     AND kind = 'commit' AND status != 'running'"
                ))
            })?;
            envs.iter()
                .all(|e| rows.iter().any(|r| r[0] == *e))
                .then_some(())
        },
    );
    history(sb)
}

fn history(sb: &Sandbox) -> Vec<Value> {
    let run = sb.gitplane(&["history", "--format", "json"]).ok();
    run.json().as_array().cloned().unwrap_or_default()
}

const ENVS: [&str; 2] = ["development", "production"];

#[test]
fn every_pushed_commit_is_reconciled_and_recorded() {
    let sb = Sandbox::template();
    let first = sb.head();
    let args = repo_args(&sb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&sb, &args);
    wait_deployed(&sb, &first, &ENVS, Duration::from_secs(20));
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 12);

    sb.edit(
        "definitions/base-env.yaml",
        "pgport: 5432\n      redis_host: redis.dev.internal",
        "pgport: 6432\n      redis_host: redis.dev.internal",
    );
    let second = sb.commit("Move the development database port");
    let h = wait_deployed(&sb, &second, &ENVS, Duration::from_secs(20));
    // history: newest first, with the documented fields.
    let newest = &h[0];
    for key in [
        "env",
        "commit",
        "status",
        "started_at",
        "finished_at",
        "created",
        "updated",
        "deleted",
        "failed",
    ] {
        assert!(newest.get(key).is_some(), "{key} missing in {newest}");
    }
    let dev = h
        .iter()
        .find(|d| d["commit"] == second.as_str() && d["env"] == "development")
        .unwrap();
    assert_eq!(dev["status"], "succeeded");
    assert_eq!(dev["updated"], 3, "base-env, postgres and the backend");
    let prod = h
        .iter()
        .find(|d| d["commit"] == second.as_str() && d["env"] == "production")
        .unwrap();
    assert_eq!(prod["updated"], 0);
    assert_eq!(
        sb.outputs("development", "modules.backend.externals.db")["port"],
        json!(6432)
    );
    assert_eq!(
        sb.column("SELECT outcome FROM commit_seen ORDER BY id"),
        ["dispatched", "dispatched"]
    );
    let (code, took) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_burst_of_fifty_pushes_ends_in_the_last_commit() {
    let sb = Sandbox::template();
    let args = repo_args(&sb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _daemon = Daemon::start(&sb, &args);
    let mut last = String::new();
    sb.edit(
        "definitions/redis.yaml",
        "port: 6379",
        "port: 6379\n      build: 0",
    );
    for i in 1..=50 {
        sb.edit(
            "definitions/redis.yaml",
            &format!("build: {}\n", i - 1),
            &format!("build: {i}\n"),
        );
        last = sb.commit(&format!("Build {i}"));
    }
    wait_deployed(&sb, &last, &ENVS, Duration::from_secs(60));
    for env in ENVS {
        assert_eq!(sb.outputs(env, "shared.cache")["build"], json!(50), "{env}");
        let d = sb.last_deployment(env);
        assert_eq!(d.commit, last);
        assert_eq!(d.status, "succeeded");
    }
    // Coalesced: far fewer deployments than pushes, none failed.
    let deployments = sb.count("SELECT COUNT(*) FROM deployment");
    assert!(deployments <= 2 * 51, "{deployments}");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE status != 'succeeded'"),
        0
    );
}

#[test]
fn a_broken_commit_is_recorded_as_failed_and_deletes_nothing() {
    let sb = Sandbox::template();
    let args = repo_args(&sb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _daemon = Daemon::start(&sb, &args);
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));
    let before = sb.resource_rows();
    // Broken YAML, and the frontend removed in the same commit: nothing may be deleted.
    sb.write("definitions/dns.yaml", "apiVersion: [broken\n");
    sb.remove("workloads/shop/frontend.yaml");
    let broken = sb.commit("A broken commit");
    wait_deployed(&sb, &broken, &ENVS, Duration::from_secs(20));
    for env in ENVS {
        let d = sb.last_deployment(env);
        assert_eq!(d.commit, broken);
        assert_eq!(d.status, "failed");
        assert!(d.error.unwrap().contains("definitions/dns.yaml:1"));
    }
    assert_eq!(sb.resource_rows(), before);
    assert_eq!(
        sb.column("SELECT outcome FROM commit_seen ORDER BY id DESC LIMIT 1"),
        ["rejected"]
    );
}

#[test]
fn a_mass_deletion_is_held_until_approved() {
    let sb = Sandbox::template();
    let args = repo_args(&sb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _daemon = Daemon::start(&sb, &args);
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));
    let before = sb.resource_rows();
    sb.remove("workloads/shop");
    let empty = sb.commit("Retire the shop");
    wait_deployed(&sb, &empty, &ENVS, Duration::from_secs(20));
    assert_eq!(sb.resource_rows(), before, "nothing changes while held");
    let held: Vec<i64> = sb
        .column(&format!(
            "SELECT id FROM deployment WHERE commit_id = '{empty}' AND status = 'held' ORDER BY id"
        ))
        .iter()
        .map(|i| i.parse().unwrap())
        .collect();
    assert_eq!(held.len(), 2);
    let h = history(&sb);
    assert!(h.iter().any(|d| d["status"] == "held"));
    // Approve while the daemon runs.
    for id in &held {
        sb.gitplane(&["approve", "--yes", &id.to_string()]).ok();
    }
    assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 0);
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE commit_id = '{empty}' AND status = 'succeeded'"
        )),
        2
    );
}

/// A host config that mirrors the sandbox's origin as a remote (`file://`), fetched every
/// `interval`, with its state in a folder of its own: the config file and the state path.
fn remote_config(sb: &Sandbox, interval: &str) -> (PathBuf, PathBuf) {
    let state = sb.root.join("remote-state/state.db");
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {{url: \"file://{}\", interval: {interval}}}\nstate: {}\n",
            sb.origin.display(),
            state.display()
        ),
    )
    .unwrap();
    (config, state)
}

#[test]
fn a_remote_is_mirrored_and_fetched_on_an_interval() {
    let sb = Sandbox::template();
    let (config, state) = remote_config(&sb, "300ms");
    let _daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    let mirrored = |commit: &str| {
        eventually(
            format_args!("{commit} fetched and deployed"),
            Duration::from_secs(20),
            || {
                let n: i64 = crate::util::rows(
                    &crate::util::open_db(state.exists().then_some(&state)?),
                    &format!(
                        "SELECT COUNT(*) FROM deployment WHERE commit_id = '{commit}' AND status = 'succeeded'"
                    ),
                )[0][0]
                    .parse()
                    .unwrap();
                (n == 2).then_some(())
            },
        );
    };
    mirrored(&sb.head());
    assert!(state.parent().unwrap().join("mirror.git/HEAD").exists());
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    let next = sb.commit("A new port");
    mirrored(&next);
}

/// A remote that accepts connections and never answers: the fetch hangs, the daemon does not.
#[test]
fn a_hung_remote_does_not_hold_up_the_daemon() {
    let sb = Sandbox::template();
    let (config, state) = remote_config(&sb, "200ms");
    let mut daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    eventually_or(
        "both environments deployed",
        Duration::from_secs(20),
        || {
            (state.exists()
                && crate::util::rows(
                    &crate::util::open_db(&state),
                    "SELECT COUNT(*) FROM deployment WHERE status = 'succeeded'",
                )[0][0]
                    == "2")
                .then_some(())
        },
        || daemon.log(),
    );
    // The remote now hangs: every connection is accepted and left unanswered.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
            let _ = accepted_tx.send(());
        }
    });
    let mirror = state.parent().unwrap().join("mirror.git");
    sb.git_in(
        &mirror,
        &[
            "remote",
            "set-url",
            "origin",
            &format!("http://127.0.0.1:{port}/platform.git"),
        ],
    );
    accepted
        .recv_timeout(Duration::from_secs(10))
        .expect("a fetch reached the hung remote");
    // Not a wait for an event: the fetch is left hanging a while, past the interval, before
    // SIGTERM, so that the daemon is shown not to be stuck behind it.
    std::thread::sleep(Duration::from_millis(500));
    let (code, took) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM was handled while the fetch hung: {took:?}"
    );
}

#[test]
fn a_token_in_the_remote_url_stays_out_of_messages() {
    let sb = Sandbox::new();
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {{url: \"http://gituser:s3cr3t-token@127.0.0.1:1/platform.git\"}}\nstate: {}\n",
            sb.root.join("state.db").display()
        ),
    )
    .unwrap();
    let run = sb
        .gitplane_raw(&["daemon", "--config", config.to_str().unwrap()], &[])
        .fails();
    run.stderr_has("http://***@127.0.0.1:1/platform.git")
        .hides(&["s3cr3t-token"]);
}

/// SIGTERM while a driver call takes two seconds: the call finishes, the rest is recorded as
/// stopped, and the next start completes the deployment.
#[test]
fn sigterm_lets_a_slow_driver_call_finish() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    let (args, commit) = slow_database(&sb, &server, Duration::from_secs(2), "timeout: 10s", "");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&sb, &args);
    eventually_or(
        "the slow call in flight: base-env answered, postgres asked",
        Duration::from_secs(20),
        || {
            (server
                .received()
                .iter()
                .any(|r| r.body["type"] == "base-env")
                && started_calls(&sb, "postgres") > 0)
                .then_some(())
        },
        || daemon.log(),
    );
    let (code, took) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(30),
        "the daemon waited for the call in flight, and no longer: {took:?}"
    );
    // The slow call finished and was recorded; what had not started was stopped.
    assert_eq!(
        sb.rows("SELECT type, status FROM operation ORDER BY id"),
        [
            ["base-env", "succeeded"],
            ["postgres", "succeeded"],
            ["workload", "skipped"]
        ]
    );
    let d = sb.last_deployment("test");
    assert_eq!(d.status, "failed");
    assert!(
        d.error
            .unwrap()
            .contains("stopped: gitplane is shutting down")
    );
    // The next start picks the commit up again and finishes it.
    let _daemon = Daemon::start(&sb, &args);
    wait_succeeded(&sb, &commit);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM resource WHERE status = 'ready'"),
        3
    );
}

/// SIGTERM while a driver call takes far longer than `stop_timeout`: the daemon does not wait
/// for it; the call is recorded as interrupted and the next start resumes it.
#[test]
fn sigterm_does_not_wait_past_the_stop_timeout() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    let (args, commit) = slow_database(
        &sb,
        &server,
        Duration::from_secs(30),
        "timeout: 60s",
        "stop_timeout: 1s\n",
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&sb, &args);
    eventually_or(
        "the postgres call started",
        Duration::from_secs(20),
        || (started_calls(&sb, "postgres") > 0).then_some(()),
        || daemon.log(),
    );
    let (code, took) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    assert!(
        took < Duration::from_secs(5),
        "stopped after the stop timeout, not after the call: {took:?}"
    );
    assert!(
        daemon.log().contains("recorded as interrupted"),
        "{}",
        daemon.log()
    );
    assert_eq!(
        sb.rows("SELECT type, status FROM operation ORDER BY id"),
        [["base-env", "succeeded"], ["postgres", "interrupted"]]
    );
    // The next start resumes the deployment; the driver is asked again, with the same GUResID.
    server.behave("postgres", Behavior::default());
    let _daemon = Daemon::start(&sb, &args);
    wait_succeeded(&sb, &commit);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment"),
        1,
        "the interrupted deployment was resumed"
    );
    for (guresid, n) in server.creations() {
        assert_eq!(n, 1, "{guresid} created {n} times");
    }
}

/// The HTTP platform with a postgres that takes `delay` at `server`, committed: the daemon's
/// arguments (a host config with the driver's `http_timeout` and the `host` lines) and the
/// commit.
fn slow_database(
    sb: &Sandbox,
    server: &DriverServer,
    delay: Duration,
    http_timeout: &str,
    host: &str,
) -> (Vec<String>, String) {
    server.behave(
        "postgres",
        Behavior {
            delay,
            ..Behavior::default()
        },
    );
    let args = sb.host_config(&format!(
        "{host}{}",
        http_driver_config(&server.url, http_timeout)
    ));
    write_http_platform(sb);
    let commit = sb.commit("A slow database");
    (args, commit)
}

/// Waits (up to 20 s) for a succeeded deployment of `commit`.
#[track_caller]
pub(crate) fn wait_succeeded(sb: &Sandbox, commit: &str) {
    eventually(
        format_args!("a succeeded deployment of {commit} after the restart"),
        Duration::from_secs(20),
        || {
            (sb.count(&format!(
                "SELECT COUNT(*) FROM deployment WHERE commit_id = '{commit}' AND status = 'succeeded'"
            )) > 0)
                .then_some(())
        },
    );
}

fn started_calls(sb: &Sandbox, res_type: &str) -> i64 {
    if !sb.state.exists() {
        return 0;
    }
    sb.count(&format!(
        "SELECT COUNT(*) FROM operation WHERE type = '{res_type}'"
    ))
}

/// One app, one workload with a postgres that reads the base-env, all on the HTTP driver.
pub(crate) fn write_http_platform(sb: &Sandbox) {
    sb.write("environments/test.yaml", "type: test\n");
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::http("base-env").value("zone: test"),
            Definition::http("postgres").value("host: ${resources.base-env#base-env.outputs.name}"),
            Definition::http("workload").value("namespace: ${context.app.id}"),
        ]),
    );
    sb.write(
        "workloads/app/web.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n    \
         variables:\n      DB: ${resources.db.name}\nresources:\n  db:\n    type: postgres\n",
    );
}

/// A drift schedule re-applies the last good commit, calling the driver for every resource.
#[test]
fn a_drift_schedule_calls_every_driver_again() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    // Something outside gitplane keeps changing the database: its outputs differ each time.
    server.behave(
        "postgres",
        Behavior {
            drifting: true,
            ..Behavior::default()
        },
    );
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!(
            "drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 10s}}\n",
            server.url
        ),
    )
    .unwrap();
    write_http_platform(&sb);
    // Every second (the 6-field form, with seconds).
    sb.write(
        "environments/test.yaml",
        "type: test\nschedule: \"* * * * * *\"\n",
    );
    let commit = sb.commit("A platform with drift runs");
    let mut args = repo_args(&sb);
    args.extend(["--config".to_owned(), config.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(&sb, &args);
    eventually_or(
        "a succeeded drift run",
        Duration::from_secs(20),
        || {
            (sb.count(
                "SELECT COUNT(*) FROM deployment WHERE kind = 'drift' AND status = 'succeeded'",
            ) >= 1)
                .then_some(())
        },
        || daemon.log(),
    );
    let drift = sb.rows(
        "SELECT id, commit_id, updated, unchanged FROM deployment WHERE kind = 'drift' ORDER BY id LIMIT 1",
    );
    assert_eq!(drift[0][1], commit, "the last good commit is re-applied");
    assert_eq!(drift[0][2], "3", "every resource is put again: {drift:?}");
    let reasons = sb.column(&format!(
        "SELECT DISTINCT reason FROM operation WHERE deployment_id = {}",
        drift[0][0]
    ));
    assert_eq!(
        reasons,
        ["drift run: re-applied so the driver can repair drift"]
    );
    let puts = server
        .received()
        .iter()
        .filter(|r| r.method == "PUT")
        .count();
    assert!(puts >= 6, "each resource was called twice at least: {puts}");
}

/// SIGHUP re-reads the host config: a driver registered afterwards serves the next commit.
#[test]
fn sighup_reloads_the_host_config() {
    let sb = Sandbox::new();
    let server = DriverServer::start();
    let config = sb.root.join("host.yaml");
    std::fs::write(&config, "concurrency: 4\n").unwrap();
    write_http_platform(&sb);
    let first = sb.commit("Needs a driver the host does not have yet");
    let mut args = repo_args(&sb);
    args.extend(["--config".to_owned(), config.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(&sb, &args);
    wait_deployed(&sb, &first, &["test"], Duration::from_secs(20));
    let d = sb.last_deployment("test");
    assert_eq!(d.status, "failed");
    assert!(
        d.error
            .unwrap()
            .contains("driver_type 'test/http', which is not registered")
    );

    std::fs::write(
        &config,
        format!(
            "concurrency: 4\ndrivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 10s}}\n",
            server.url
        ),
    )
    .unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &daemon.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    daemon.wait_for_log("host config reloaded", Duration::from_secs(10));
    // The same commit goes through now, without a new push.
    eventually_or(
        "the same commit deployed after the reload",
        Duration::from_secs(20),
        || (sb.last_deployment("test").status == "succeeded").then_some(()),
        || daemon.log(),
    );
    assert_eq!(sb.last_deployment("test").commit, first);
    assert_eq!(server.instances().len(), 3);
}
