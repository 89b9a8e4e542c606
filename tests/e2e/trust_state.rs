//! Trust boundaries of the state: a state serves one repository, and a daemon whose state key
//! does not open the state refuses to start and takes no lease.
//!
//! Each test is one finding of the trust-boundaries review, run as a user would: real pushes,
//! the real binary and daemons, a real SQLite file or a real PostgreSQL server (the tests that
//! are about a shared database skip, saying why, on a machine without PostgreSQL).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gitplane_testkit::Postgres;

use crate::daemon::Daemon;
use crate::util::{Run, Sandbox};

/// The template's secret values.
const SECRETS: [&str; 2] = ["dev-password-change-me", "prod-password-change-me"];

/// Polls `done` every 100 ms for up to `limit`, failing with `what` and `context()`.
#[track_caller]
fn wait_until(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < limit,
            "{what}: not within {limit:?}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

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
    let code = second.wait_for_exit(Duration::from_secs(30));
    let log = second.log();
    assert!(
        matches!(code, Some(c) if c != 0),
        "the second daemon must refuse to start (exit {code:?}):\n{log}"
    );
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
    let code = second.wait_for_exit(Duration::from_secs(30));
    let log = second.log();
    assert!(
        matches!(code, Some(c) if c != 0),
        "a daemon with the wrong key must refuse to start (exit {code:?}):\n{log}"
    );
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
    // The first daemon keeps what it held, and nothing failed.
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
