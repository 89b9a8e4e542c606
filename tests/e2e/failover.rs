//! Several daemons sharing one PostgreSQL state: the environments are spread over them by
//! leases, a daemon that dies, freezes (even inside a write transaction) or leaves has its
//! environments finished by the others, each resource is created once at the driver, a frozen
//! daemon that wakes up writes nothing, and a database restart stops none of them.
//!
//! Each test runs real `gitplane daemon` processes on one repository of six environments, all
//! with the same host config, against a database of its own, and an HTTP driver of its own
//! (`GatedDriver`) that records every call and can hold PUTs until the test lets them go, so
//! that a daemon is inside a driver call when the test kills or freezes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use gitplane_testkit::{HttpServer, Postgres, Reply, Request, eventually_or, poll};
use serde_json::json;

use crate::daemon::Daemon;
use crate::util::Sandbox;

/// The lease time every daemon here runs with: short, so that a takeover takes seconds.
pub(crate) const TTL: Duration = Duration::from_secs(6);
pub(crate) const ENVS: [&str; 6] = ["env-1", "env-2", "env-3", "env-4", "env-5", "env-6"];
/// Resources per environment: the implicit base-env, the workload and its database.
const RESOURCES_PER_ENV: usize = 3;
/// The longest a PUT waits at a closed gate, so that a test that forgets to open it fails
/// instead of hanging.
const GATE_LIMIT: Duration = Duration::from_secs(60);

/// One call the driver answered.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) method: String,
    pub(crate) guresid: String,
    /// The environment the resource is in (the definition sends `${context.env.id}`).
    pub(crate) env: String,
    /// For a PUT, whether the GUResID existed at the driver already: an update, not a create.
    /// For a DELETE, whether there was something to delete.
    pub(crate) existed: bool,
    /// The daemon that called, by its index in `Fleet::daemons`, when the fleet gives each
    /// daemon a driver URL of its own (`Fleet::numbered`).
    pub(crate) daemon: Option<usize>,
    /// When the request reached the driver, and the same moment by the wall clock (to compare
    /// with the daemons' logs).
    pub(crate) arrived: Instant,
    pub(crate) arrived_at: SystemTime,
    /// When the driver had its answer ready (after the gate, if it waited there).
    pub(crate) answered: Instant,
}

/// An environment and a resource type, to let some PUTs through a closed gate.
type Passage = (String, String);

#[derive(Debug, Default)]
struct DriverState {
    /// While set, every PUT waits until the test opens the gate (at most `GATE_LIMIT`)...
    closed: bool,
    /// ...except the PUTs of these resource types in these environments.
    let_through: BTreeSet<Passage>,
    /// The GUResIDs that exist at the driver.
    instances: BTreeSet<String>,
    /// PUTs waiting at the gate: (env, GUResID).
    waiting: Vec<(String, String)>,
    calls: Vec<Call>,
}

/// An HTTP driver (the Humanitec Driver Interface: PUT and DELETE on `<url>/<guresid>`) that
/// answers at once with outputs, holds PUTs while its gate is closed, and records whether each
/// PUT created its resource or updated one that existed.
pub(crate) struct GatedDriver {
    url: String,
    shared: Arc<(Mutex<DriverState>, Condvar)>,
    _server: HttpServer,
}

impl GatedDriver {
    fn start() -> GatedDriver {
        let shared: Arc<(Mutex<DriverState>, Condvar)> = Arc::default();
        let handler_state = shared.clone();
        // The server answers each request on a thread of its own: the calls of several daemons
        // wait at the gate together.
        let server = HttpServer::start(move |request| answer(request, &handler_state));
        GatedDriver {
            url: format!("{}/driver", server.url),
            shared,
            _server: server,
        }
    }

    fn state(&self) -> MutexGuard<'_, DriverState> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn close(&self) {
        self.state().closed = true;
    }

    pub(crate) fn open(&self) {
        self.state().closed = false;
        self.shared.1.notify_all();
    }

    /// Lets the PUTs of `res_type` in `envs` through the closed gate.
    fn let_through<'e>(&self, envs: impl IntoIterator<Item = &'e String>, res_type: &str) {
        let mut state = self.state();
        for env in envs {
            state.let_through.insert((env.clone(), res_type.to_owned()));
        }
        drop(state);
        self.shared.1.notify_all();
    }

    /// The environments with a PUT waiting at the gate.
    pub(crate) fn waiting_envs(&self) -> BTreeSet<String> {
        self.state()
            .waiting
            .iter()
            .map(|(env, _)| env.clone())
            .collect()
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// How many times each GUResID was created (a PUT that found no instance).
    pub(crate) fn creations(&self) -> BTreeMap<String, usize> {
        let mut creations = BTreeMap::new();
        for call in self.calls() {
            if call.method == "PUT" && !call.existed {
                *creations.entry(call.guresid).or_insert(0) += 1;
            }
        }
        creations
    }
}

impl Drop for GatedDriver {
    fn drop(&mut self) {
        self.open();
    }
}

fn answer(request: &Request, shared: &(Mutex<DriverState>, Condvar)) -> Reply {
    let method = request.method.clone();
    // `/d<N>/driver/<guresid>`: daemon N's own driver URL.
    let daemon = request
        .url
        .split('/')
        .find_map(|segment| segment.strip_prefix('d')?.parse::<usize>().ok());
    let guresid = request.last_segment().to_owned();
    let body = request.json();
    let env = body["driver"]["values"]["env"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let passage = (
        env.clone(),
        body["type"].as_str().unwrap_or_default().to_owned(),
    );
    let (lock, changed) = shared;
    let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
    if method == "PUT" {
        state.waiting.push((env.clone(), guresid.clone()));
        changed.notify_all();
        state = changed
            .wait_timeout_while(state, GATE_LIMIT, |s| {
                s.closed && !s.let_through.contains(&passage)
            })
            .unwrap_or_else(|e| e.into_inner())
            .0;
        if let Some(at) = state
            .waiting
            .iter()
            .position(|(e, g)| *e == env && *g == guresid)
        {
            state.waiting.remove(at);
        }
    }
    let existed = match method.as_str() {
        "PUT" => !state.instances.insert(guresid.clone()),
        "DELETE" => state.instances.remove(&guresid),
        _ => false,
    };
    state.calls.push(Call {
        method: method.clone(),
        guresid: guresid.clone(),
        env: env.clone(),
        existed,
        daemon,
        arrived: request.arrived,
        arrived_at: request.arrived_at,
        answered: Instant::now(),
    });
    changed.notify_all();
    drop(state);
    let reply = match method.as_str() {
        "PUT" => {
            let values = json!({"name": format!("{env}-{}", &guresid[..guresid.len().min(8)])});
            let answer = json!({"id": guresid, "type": body["type"],
                "resource": {"values": values, "secrets": {}}});
            Reply::json(200, &answer)
        }
        "DELETE" => Reply::status(204).header("Content-Type", "application/json"),
        _ => Reply::json(405, &json!({"message": "method not allowed"})),
    };
    // tiny_http now and then leaves a request on a reused keep-alive connection unanswered;
    // the daemon's call then times out and is made again, and the driver reads the repeat late.
    // One connection per call keeps the record of calls a record of what the daemons did. (The
    // daemon that asked may be dead or frozen by now: nobody to tell.)
    reply.close()
}

/// A lease as `env_lease` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) daemon: String,
    pub(crate) generation: i64,
    /// Whether it has not expired.
    pub(crate) current: bool,
}

/// A `deployment` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deployment {
    pub(crate) id: i64,
    pub(crate) env: String,
    pub(crate) commit: String,
    pub(crate) status: String,
}

/// Rows a daemon writes for environments, to compare before and after a frozen one wakes up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    /// Every deployment row by id (its columns as text).
    deployments: BTreeMap<i64, Vec<String>>,
    /// Every operation row by id: `[env, deployment_id, ...]`.
    operations: BTreeMap<i64, Vec<String>>,
    /// Every resource row by GUResID: `[env, ...]`.
    resources: BTreeMap<String, Vec<String>>,
}

/// One repository of six environments and a host config naming a PostgreSQL state, for the
/// daemons of one test.
pub(crate) struct Fleet<'s> {
    pub(crate) server: &'s Postgres,
    pub(crate) url: String,
    pub(crate) sb: Sandbox,
    pub(crate) driver: GatedDriver,
    config: PathBuf,
    /// Whether each daemon gets a host config of its own whose driver URL names it (`/d<N>/`).
    numbered: bool,
    pub(crate) daemons: Vec<Daemon>,
}

impl<'s> Fleet<'s> {
    /// A database of its own on `server`, the repository committed and pushed, no daemon yet.
    pub(crate) fn new(server: &'s Postgres) -> Fleet<'s> {
        Fleet::with_host(server, "")
    }

    /// [`Fleet::new`], with `extra` added to the host config.
    pub(crate) fn with_host(server: &'s Postgres, extra: &str) -> Fleet<'s> {
        Fleet::build(server, extra, false)
    }

    /// [`Fleet::with_host`], each daemon calling the driver at a URL of its own,
    /// `<driver>/d<N>/driver/<guresid>` for `daemons[N]`, so that the driver can tell who called.
    pub(crate) fn numbered(server: &'s Postgres, extra: &str) -> Fleet<'s> {
        Fleet::build(server, extra, true)
    }

    fn build(server: &'s Postgres, extra: &str, numbered: bool) -> Fleet<'s> {
        let url = server.database();
        let sb = Sandbox::new();
        let driver = GatedDriver::start();
        for env in ENVS {
            sb.write(&format!("environments/{env}.yaml"), "type: test\n");
        }
        let definition = |id: &str, values: &str| {
            format!(
                "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n\
                 entity:\n  type: {id}\n  driver_type: test/http\n  driver_inputs:\n    \
                 values:\n      env: ${{context.env.id}}\n      {values}\n  criteria:\n    - {{}}\n"
            )
        };
        sb.write(
            "definitions/platform.yaml",
            &[
                definition("base-env", "zone: test"),
                definition("postgres", "build: 1"),
                definition("workload", "namespace: ${context.app.id}"),
            ]
            .join("---\n"),
        );
        sb.write(
            "workloads/app/web.yaml",
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
             image: x\n    variables:\n      DB: ${resources.db.name}\nresources:\n  db:\n    \
             type: postgres\n",
        );
        sb.commit("Six environments on one HTTP driver");
        let config = sb.root.join("host.yaml");
        std::fs::write(
            &config,
            format!(
                "state: \"{url}\"\nstate_key: {{file: \"{}\"}}\nleases: {{ttl: {}s}}\n\
                 drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 5s}}\n{extra}",
                sb.root.join("state.key").display(),
                TTL.as_secs(),
                driver.url
            ),
        )
        .expect("write the host config");
        Fleet {
            server,
            url,
            sb,
            driver,
            config,
            numbered,
            daemons: Vec::new(),
        }
    }

    pub(crate) fn args(&self) -> Vec<String> {
        self.args_of(&self.config)
    }

    fn args_of(&self, config: &std::path::Path) -> Vec<String> {
        vec![
            "--config".into(),
            config.display().to_string(),
            "--repo".into(),
            self.sb.origin.display().to_string(),
        ]
    }

    /// The arguments of daemon `i` (the next one started is `daemons.len()`): the fleet's host
    /// config, or with [`Fleet::numbered`] a copy of it whose driver URL names the daemon.
    fn args_for(&self, i: usize) -> Vec<String> {
        if !self.numbered {
            return self.args();
        }
        let config = self.sb.root.join(format!("host.{i}.yaml"));
        let shared = std::fs::read_to_string(&self.config).expect("read the host config");
        let own = self
            .driver
            .url
            .replacen("/driver", &format!("/d{i}/driver"), 1);
        std::fs::write(&config, shared.replace(&self.driver.url, &own))
            .expect("write a daemon's host config");
        self.args_of(&config)
    }

    /// Starts `n` more daemons at about the same moment, so that they count each other before
    /// they take leases, and waits until each says it is ready.
    pub(crate) fn start(&mut self, n: usize) {
        let first_log = self.daemons.len();
        let all_args: Vec<Vec<String>> = (first_log..first_log + n)
            .map(|i| self.args_for(i))
            .collect();
        let sb = &self.sb;
        let started = thread::scope(|scope| {
            let mut handles = Vec::new();
            for (i, args) in all_args.iter().enumerate() {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                handles.push(scope.spawn(move || Daemon::start(sb, &args)));
                // Each start names its log after the ones that exist: wait until this one's
                // is there before the next start looks.
                let log = match first_log + i {
                    0 => sb.root.join("daemon.log"),
                    k => sb.root.join(format!("daemon.{k}.log")),
                };
                // A start whose log never comes fails on its own (`Daemon::start`).
                let _ = poll(Duration::from_secs(10), || log.exists().then_some(()));
            }
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect::<Vec<_>>()
        });
        self.daemons.extend(started);
    }

    /// Starts one more daemon with `env` added to its environment; waits until it is ready.
    pub(crate) fn start_one_with_env(&mut self, env: &[(&str, &str)]) {
        let args = self.args_for(self.daemons.len());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let daemon = Daemon::start_with_env(&self.sb, &args, env);
        self.daemons.push(daemon);
    }

    /// Whether `daemon_id` (`host:pid`, as the leases name a daemon) is daemon `i`.
    pub(crate) fn owns(&self, i: usize, daemon_id: &str) -> bool {
        daemon_id.ends_with(&format!(":{}", self.daemons[i].pid()))
    }

    /// Every row of `sql` on the test's database, columns split at `|`.
    #[track_caller]
    pub(crate) fn rows(&self, sql: &str) -> Vec<Vec<String>> {
        let out = self
            .server
            .psql(&self.url, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        out.lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.split('|').map(str::to_owned).collect())
            .collect()
    }

    pub(crate) fn leases(&self) -> BTreeMap<String, Lease> {
        self.rows(
            "SELECT env, daemon, generation, expires_at::timestamptz > now() FROM env_lease \
             ORDER BY env",
        )
        .into_iter()
        .map(|r| {
            (
                r[0].clone(),
                Lease {
                    daemon: r[1].clone(),
                    generation: r[2].parse().expect("a generation"),
                    current: r[3] == "t",
                },
            )
        })
        .collect()
    }

    /// How many current leases each daemon holds, by daemon index.
    fn held_counts(&self) -> Vec<usize> {
        let leases = self.leases();
        (0..self.daemons.len())
            .map(|i| {
                leases
                    .values()
                    .filter(|l| l.current && self.owns(i, &l.daemon))
                    .count()
            })
            .collect()
    }

    /// The environments daemon `i` holds a current lease of.
    pub(crate) fn held_by(&self, i: usize) -> BTreeSet<String> {
        self.leases()
            .into_iter()
            .filter(|(_, l)| l.current && self.owns(i, &l.daemon))
            .map(|(env, _)| env)
            .collect()
    }

    pub(crate) fn deployments(&self) -> Vec<Deployment> {
        self.rows("SELECT id, env, commit_id, status FROM deployment ORDER BY id")
            .into_iter()
            .map(|r| Deployment {
                id: r[0].parse().expect("an id"),
                env: r[1].clone(),
                commit: r[2].clone(),
                status: r[3].clone(),
            })
            .collect()
    }

    /// Whether the newest deployment of every environment of `envs` is a succeeded one of
    /// `commit`, and none of theirs is still running.
    pub(crate) fn all_succeeded(&self, envs: &[&str], commit: &str) -> bool {
        let deployments = self.deployments();
        envs.iter().all(|env| {
            let of_env: Vec<&Deployment> = deployments.iter().filter(|d| d.env == *env).collect();
            of_env
                .last()
                .is_some_and(|d| d.commit == commit && d.status == "succeeded")
                && of_env.iter().all(|d| d.status != "running")
        })
    }

    fn written(&self) -> Written {
        let keyed = |rows: Vec<Vec<String>>| -> BTreeMap<i64, Vec<String>> {
            rows.into_iter()
                .map(|mut r| (r.remove(0).parse().expect("an id"), r))
                .collect()
        };
        Written {
            deployments: keyed(self.rows(
                "SELECT id, env, commit_id, status, finished_at, created, updated, deleted, \
                 unchanged, failed, md5(coalesce(error, '')) FROM deployment ORDER BY id",
            )),
            operations: keyed(self.rows(
                "SELECT o.id, d.env, o.deployment_id, o.guresid, o.action, o.status, o.attempts, \
                 o.finished_at, md5(coalesce(o.error, '')) FROM operation o \
                 JOIN deployment d ON d.id = o.deployment_id ORDER BY o.id",
            )),
            resources: self
                .rows(
                    "SELECT guresid, env, status, inputs_hash, md5(outputs), commit_id, \
                     deployment_id, updated_at FROM resource ORDER BY guresid",
                )
                .into_iter()
                .map(|mut r| (r.remove(0), r))
                .collect(),
        }
    }

    /// Waits until `done` (up to `limit`); returns how long it took, or fails the test with the
    /// leases, the deployments and the end of every daemon's log.
    #[track_caller]
    pub(crate) fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut() -> bool,
    ) -> Duration {
        let started = Instant::now();
        eventually_or(what, limit, || done().then_some(()), || self.diagnostics());
        started.elapsed()
    }

    /// What a person needs to see when a test fails here.
    pub(crate) fn diagnostics(&self) -> String {
        let mut out = String::new();
        let pids: Vec<u32> = self.daemons.iter().map(Daemon::pid).collect();
        out.push_str(&format!("daemon pids: {pids:?}\n"));
        match self.server.psql(
            &self.url,
            "SELECT env, daemon, generation, expires_at, acquired_at FROM env_lease ORDER BY env",
        ) {
            Ok(rows) => out.push_str(&format!("env_lease:\n{rows}")),
            Err(e) => out.push_str(&format!("env_lease unreadable: {e}\n")),
        }
        match self.server.psql(
            &self.url,
            "SELECT id, env, commit_id, status, started_at, finished_at, error FROM deployment \
             ORDER BY id",
        ) {
            Ok(rows) => out.push_str(&format!("deployment:\n{rows}")),
            Err(e) => out.push_str(&format!("deployment unreadable: {e}\n")),
        }
        // Who waits for what: a session idle in a transaction holds its row locks.
        match self.server.psql(
            &self.url,
            "SELECT pid, state, wait_event_type, wait_event, xact_start, \
             regexp_replace(left(query, 120), '\\s+', ' ', 'g') FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid",
        ) {
            Ok(rows) => out.push_str(&format!("sessions:\n{rows}")),
            Err(e) => out.push_str(&format!("pg_stat_activity unreadable: {e}\n")),
        }
        let calls: Vec<String> = self
            .driver
            .calls()
            .iter()
            .map(|c| {
                let by = c
                    .daemon
                    .map(|d| format!(" by daemon {d}"))
                    .unwrap_or_default();
                format!(
                    "{} {} {} existed={}{by}",
                    c.method, c.env, c.guresid, c.existed
                )
            })
            .collect();
        out.push_str(&format!("driver calls:\n{}\n", calls.join("\n")));
        for (i, daemon) in self.daemons.iter().enumerate() {
            let log = daemon.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            out.push_str(&format!(
                "--- daemon {i} (pid {}) log, last 40 lines:\n{tail}\n",
                daemon.pid()
            ));
        }
        out
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`) to daemon `i`.
    pub(crate) fn signal(&self, i: usize, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.daemons[i].pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} of daemon {i} failed");
    }

    /// Waits until the six leases are held two by each of three daemons, each environment with
    /// a PUT waiting at the driver's (closed) gate; returns how long it took.
    fn wait_for_calls_in_flight(&self) -> Duration {
        self.wait_until(
            "three daemons holding two leases each, every environment inside a driver call",
            Duration::from_secs(30),
            || self.held_counts() == [2, 2, 2] && self.driver.waiting_envs().len() == ENVS.len(),
        )
    }
}

/// How many of the database's sessions (other than the one asking) are in `state`
/// (`idle in transaction`) or, with `Lock`, wait for a lock.
fn sessions(fleet: &Fleet<'_>, state: &str) -> usize {
    let condition = match state {
        "Lock" => "wait_event_type = 'Lock'".to_owned(),
        other => format!("state = '{other}'"),
    };
    fleet.rows(&format!(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND {condition}"
    ))[0][0]
        .parse()
        .expect("a count")
}

/// Whether the process `pid` runs (neither gone nor a zombie waiting to be reaped).
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state letter follows the command name, which is in parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// Whether `log` has a line with `message` naming `env` (`env=x` or `env="x"`), and `extra`.
pub(crate) fn logged(log: &str, message: &str, env: &str, extra: &str) -> bool {
    log.lines().any(|line| {
        line.contains(message)
            && (line.contains(&format!("env={env}")) || line.contains(&format!("env=\"{env}\"")))
            && line.contains(extra)
    })
}

/// Every GUResID the driver saw was created there exactly once.
#[track_caller]
pub(crate) fn assert_created_once(fleet: &Fleet<'_>) {
    let creations = fleet.driver.creations();
    assert_eq!(
        creations.len(),
        ENVS.len() * RESOURCES_PER_ENV,
        "every resource of every environment was created: {creations:?}\n{}",
        fleet.diagnostics()
    );
    let twice: Vec<_> = creations.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "created more than once at the driver: {twice:?}\n{}",
        fleet.diagnostics()
    );
    let deletes = fleet
        .driver
        .calls()
        .into_iter()
        .filter(|c| c.method == "DELETE")
        .count();
    assert_eq!(deletes, 0, "nothing is deleted:\n{}", fleet.diagnostics());
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn three_daemons_share_six_environments_two_each_and_deploy_each_once() {
    let Some(server) = gitplane_testkit::shared_or_skip("failover::three_daemons_share") else {
        return;
    };
    let mut fleet = Fleet::new(server);
    let commit = fleet.sb.head();
    let started = Instant::now();
    fleet.start(3);
    let spread = fleet.wait_until("two leases each", Duration::from_secs(30), || {
        fleet.held_counts() == [2, 2, 2]
    });
    let deployed = fleet.wait_until(
        "every environment deployed",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &commit),
    );
    eprintln!(
        "failover timing: three daemons up in {:?}, leases spread after {spread:?}, \
         all deployed {deployed:?} later",
        started.elapsed().saturating_sub(spread + deployed)
    );
    // A few heartbeats more: no lease moves and nothing is deployed again. Two renewals of
    // every lease are the heartbeats, seen instead of guessed.
    let leases = fleet.leases();
    for _ in 0..2 {
        let expiries = fleet.rows("SELECT env, expires_at FROM env_lease ORDER BY env");
        fleet.wait_until("every lease renewed by a heartbeat", TTL, || {
            let now = fleet.rows("SELECT env, expires_at FROM env_lease ORDER BY env");
            now.len() == expiries.len() && now.iter().zip(&expiries).all(|(n, e)| n != e)
        });
    }
    assert_eq!(fleet.leases().len(), ENVS.len());
    for (env, lease) in fleet.leases() {
        assert_eq!(
            (lease.daemon.as_str(), lease.generation),
            (leases[&env].daemon.as_str(), 1),
            "{env}: the first holder keeps its lease\n{}",
            fleet.diagnostics()
        );
    }
    let per_env: BTreeMap<String, usize> =
        fleet
            .deployments()
            .into_iter()
            .fold(BTreeMap::new(), |mut m, d| {
                *m.entry(d.env).or_insert(0) += 1;
                m
            });
    let expected: BTreeMap<String, usize> = ENVS.iter().map(|e| (e.to_string(), 1)).collect();
    assert_eq!(
        per_env,
        expected,
        "one deployment per environment\n{}",
        fleet.diagnostics()
    );
    assert_created_once(&fleet);
    let puts = fleet
        .driver
        .calls()
        .iter()
        .filter(|c| c.method == "PUT")
        .count();
    // tiny_http now and then leaves a request on a reused keep-alive connection unanswered
    // (about one run in ten here): the driver's 5 s timeout makes the daemon call again, which
    // the driver takes as the same resource. Creations stay exactly one each (checked above).
    assert!(
        puts >= ENVS.len() * RESOURCES_PER_ENV,
        "a PUT per resource at least\n{}",
        fleet.diagnostics()
    );
    // Each daemon says which leases it took, and `status` shows who holds what.
    for (i, daemon) in fleet.daemons.iter().enumerate() {
        for env in fleet.held_by(i) {
            assert!(
                logged(&daemon.log(), "lease taken", &env, "generation=1"),
                "daemon {i} took the lease of {env}:\n{}",
                daemon.log()
            );
        }
    }
    let args = fleet.args();
    let mut status_args = vec!["status"];
    status_args.extend(args.iter().map(String::as_str));
    let status = fleet.sb.gitplane_raw(&status_args, &[]).ok();
    for (env, lease) in &leases {
        let line = format!("lease: held by {} (generation 1) until", lease.daemon);
        let section = status
            .stdout
            .split_once(env.as_str())
            .map(|(_, rest)| rest)
            .unwrap_or_default();
        assert!(
            section.contains(&line),
            "status shows {line:?} for {env}:{status}"
        );
    }
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_killed_daemon_s_environments_finish_on_the_others_each_resource_created_once() {
    let Some(server) = gitplane_testkit::shared_or_skip("failover::sigkill") else {
        return;
    };
    let mut fleet = Fleet::new(server);
    let commit = fleet.sb.head();
    fleet.driver.close();
    fleet.start(3);
    fleet.wait_for_calls_in_flight();
    let victim = 0;
    let before = fleet.leases();
    let orphaned = fleet.held_by(victim);
    let victim_id = before[orphaned.first().expect("two leases")].daemon.clone();
    let killed = Instant::now();
    fleet.signal(victim, "KILL");
    // The calls in flight end at the driver all the same, as a real driver's would.
    fleet.driver.open();
    let orphaned_envs: Vec<&str> = orphaned.iter().map(String::as_str).collect();
    let taken_over = fleet.wait_until(
        "the killed daemon's leases taken over",
        Duration::from_secs(30),
        || {
            let now = fleet.leases();
            orphaned.iter().all(|env| {
                now[env].current
                    && now[env].daemon != victim_id
                    && now[env].generation > before[env].generation
            })
        },
    );
    let finished = fleet.wait_until(
        "the killed daemon's environments deployed by the others",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &commit),
    );
    eprintln!(
        "failover timing: SIGKILL to takeover {taken_over:?}, its environments all succeeded \
         {finished:?} later ({:?} after the kill; ttl {TTL:?})",
        killed.elapsed()
    );
    assert!(
        killed.elapsed() <= Duration::from_secs(30),
        "finished within 30 s of the kill: {:?}",
        killed.elapsed()
    );
    let after = fleet.leases();
    for env in &orphaned {
        assert_eq!(
            after[env].generation,
            before[env].generation + 1,
            "{env}: one takeover, one generation more\n{}",
            fleet.diagnostics()
        );
        let holder = (1..3)
            .find(|&i| fleet.owns(i, &after[env].daemon))
            .unwrap_or_else(|| panic!("{env} is held by a live daemon\n{}", fleet.diagnostics()));
        let log = fleet.daemons[holder].log();
        assert!(
            logged(
                &log,
                "lease taken",
                env,
                &format!("generation={}", after[env].generation)
            ),
            "daemon {holder} logged taking {env}:\n{log}"
        );
    }
    assert!(fleet.all_succeeded(&orphaned_envs, &commit));
    // The calls in flight at the kill are recorded as interrupted, none as still started.
    let open_calls = fleet.rows("SELECT id, guresid FROM operation WHERE status = 'started'");
    assert!(
        open_calls.is_empty(),
        "operations left started: {open_calls:?}\n{}",
        fleet.diagnostics()
    );
    for env in &orphaned {
        let interrupted = fleet.rows(&format!(
            "SELECT o.id FROM operation o JOIN deployment d ON d.id = o.deployment_id \
             WHERE d.env = '{env}' AND o.status = 'interrupted'"
        ));
        assert!(
            !interrupted.is_empty(),
            "{env}: the call in flight at the kill is recorded as interrupted\n{}",
            fleet.diagnostics()
        );
    }
    assert_created_once(&fleet);
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_frozen_daemon_resumed_after_its_leases_were_taken_over_writes_nothing() {
    let Some(server) = gitplane_testkit::shared_or_skip("failover::sigstop") else {
        return;
    };
    let mut fleet = Fleet::new(server);
    let commit = fleet.sb.head();
    fleet.driver.close();
    fleet.start(3);
    fleet.wait_for_calls_in_flight();
    let frozen = 0;
    let before = fleet.leases();
    let orphaned = fleet.held_by(frozen);
    let frozen_id = before[orphaned.first().expect("two leases")].daemon.clone();
    let stopped = Instant::now();
    fleet.signal(frozen, "STOP");
    // Its calls are answered while it is frozen: it reads the answers when it wakes up.
    fleet.driver.open();
    let taken_over = fleet.wait_until(
        "the frozen daemon's leases taken over",
        Duration::from_secs(30),
        || {
            let now = fleet.leases();
            orphaned.iter().all(|env| {
                now[env].current
                    && now[env].daemon != frozen_id
                    && now[env].generation == before[env].generation + 1
            })
        },
    );
    let finished = fleet.wait_until(
        "the frozen daemon's environments deployed by the others",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &commit),
    );
    eprintln!(
        "failover timing: SIGSTOP to takeover {taken_over:?}, its environments all succeeded \
         {finished:?} later ({:?} after the freeze)",
        stopped.elapsed()
    );
    let written = fleet.written();
    let leases_before = fleet.leases();
    let calls_before = fleet.driver.calls().len();
    let resumed = Instant::now();
    fleet.signal(frozen, "CONT");
    let noticed = fleet.wait_until(
        "the resumed daemon notices it lost its leases",
        Duration::from_secs(15),
        || {
            let log = fleet.daemons[frozen].log();
            orphaned
                .iter()
                .all(|env| logged(&log, "lease lost", env, "") || log.contains("moved on"))
        },
    );
    eprintln!("failover timing: the resumed daemon noticed the loss {noticed:?} after SIGCONT");
    // Whatever it still had in hand would be written by now. Not a wait for an event: time
    // passes to show that a write which must never come does not.
    thread::sleep(TTL / 2);
    let log = fleet.daemons[frozen].log();
    let resumed_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("lease") || l.contains("moved on") || l.contains("deployment"))
        .collect();
    eprintln!(
        "the resumed daemon's log about leases and deployments:\n{}",
        resumed_lines.join("\n")
    );
    let after = fleet.written();
    let leases_after = fleet.leases();
    // An environment whose lease moved after SIGCONT (rebalancing, now that it is back) may be
    // deployed again by its new holder; in the others nobody has anything to do.
    let moved_since: BTreeSet<&String> = leases_after
        .iter()
        .filter(|(env, l)| {
            leases_before
                .get(*env)
                .is_none_or(|b| b.generation != l.generation)
        })
        .map(|(env, _)| env)
        .collect();
    let diagnostics = || {
        format!(
            "resumed {:?} ago; leases moved since: {moved_since:?}\n{}",
            resumed.elapsed(),
            fleet.diagnostics()
        )
    };
    for (id, row) in &written.deployments {
        assert_eq!(
            after.deployments.get(id),
            Some(row),
            "deployment {id} changed after SIGCONT\n{}",
            diagnostics()
        );
    }
    for (id, row) in &written.operations {
        assert_eq!(
            after.operations.get(id),
            Some(row),
            "operation {id} changed after SIGCONT\n{}",
            diagnostics()
        );
    }
    for (id, row) in &after.deployments {
        if written.deployments.contains_key(id) {
            continue;
        }
        assert!(
            moved_since.contains(&row[0]),
            "deployment {id} ({row:?}) written after SIGCONT in an environment whose lease \
             did not move\n{}",
            diagnostics()
        );
    }
    let newest_before = written.deployments.keys().max().copied().unwrap_or(0);
    for (id, row) in &after.operations {
        if written.operations.contains_key(id) {
            continue;
        }
        let deployment: i64 = row[1].parse().expect("a deployment id");
        assert!(
            deployment > newest_before && moved_since.contains(&row[0]),
            "operation {id} ({row:?}) written after SIGCONT\n{}",
            diagnostics()
        );
    }
    for (guresid, row) in &after.resources {
        if moved_since.contains(&row[0]) {
            continue;
        }
        assert_eq!(
            written.resources.get(guresid),
            Some(row),
            "resource {guresid} written after SIGCONT\n{}",
            diagnostics()
        );
    }
    let late_calls: Vec<Call> = fleet.driver.calls()[calls_before..]
        .iter()
        .filter(|c| !moved_since.contains(&c.env))
        .cloned()
        .collect();
    assert!(
        late_calls.is_empty(),
        "driver calls after SIGCONT in environments whose lease did not move: {late_calls:?}\n{}",
        diagnostics()
    );
    let orphaned_envs: Vec<&str> = orphaned.iter().map(String::as_str).collect();
    assert!(
        fleet.all_succeeded(&orphaned_envs, &commit),
        "{}",
        diagnostics()
    );
    assert!(alive(fleet.daemons[frozen].pid()), "{}", diagnostics());
    assert_created_once(&fleet);
}

/// The worst moment to freeze: inside a write transaction, after its fence check took the
/// lease rows (`FOR SHARE`) and before its commit. The frozen daemon's connection stays open,
/// and with it the transaction; the others must take its environments over all the same.
///
/// To freeze it there for certain, the test holds a lock on the journal's tables while the
/// daemon's next batch starts (so the batch waits inside PostgreSQL, its fence check done),
/// stops the daemon, and lets the lock go: the batch's statement ends and its transaction
/// stays open, idle, for as long as the daemon is stopped.
#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_daemon_frozen_inside_a_write_transaction_does_not_hold_up_the_takeover() {
    let Some(server) = gitplane_testkit::shared_or_skip("failover::frozen_in_a_transaction") else {
        return;
    };
    let mut fleet = Fleet::new(server);
    let commit = fleet.sb.head();
    fleet.driver.close();
    fleet.start(3);
    fleet.wait_for_calls_in_flight();
    let frozen = 0;
    let before = fleet.leases();
    let orphaned = fleet.held_by(frozen);
    let frozen_id = before[orphaned.first().expect("two leases")].daemon.clone();
    // Its base-envs first, so that the next batch is the one after its databases: it starts
    // the workloads' operations, and waits for their ids.
    fleet.driver.let_through(&orphaned, "base-env");
    fleet.wait_until(
        "the frozen daemon's base-envs recorded",
        Duration::from_secs(20),
        || {
            fleet.rows(&format!(
                "SELECT COUNT(*) FROM operation o JOIN deployment d ON d.id = o.deployment_id \
             WHERE o.type = 'base-env' AND o.status = 'succeeded' AND d.env IN ({})",
                orphaned
                    .iter()
                    .map(|e| format!("'{e}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))[0][0]
                == orphaned.len().to_string()
        },
    );
    let url = fleet.url.clone();
    let stopped = thread::scope(|scope| {
        let lock = scope.spawn(|| {
            server.psql(
                &url,
                "BEGIN; LOCK TABLE operation, resource IN EXCLUSIVE MODE; \
                 SELECT pg_sleep(4); COMMIT;",
            )
        });
        fleet.wait_until("the test's lock taken", Duration::from_secs(10), || {
            fleet.rows(
                "SELECT COUNT(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 WHERE c.relname = 'operation' AND l.mode = 'ExclusiveLock' AND l.granted",
            )[0][0]
                == "1"
        });
        fleet.driver.let_through(&orphaned, "postgres");
        fleet.wait_until(
            "the frozen daemon's batch waiting for the lock",
            Duration::from_secs(3),
            || sessions(&fleet, "Lock") > 0,
        );
        let stopped = Instant::now();
        fleet.signal(frozen, "STOP");
        lock.join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
            .unwrap_or_else(|e| panic!("the test's lock: {e}"));
        stopped
    });
    fleet.wait_until(
        "the frozen daemon's transaction open and idle",
        Duration::from_secs(5),
        || sessions(&fleet, "idle in transaction") > 0 && sessions(&fleet, "Lock") == 0,
    );
    fleet.driver.open();
    let taken_over = fleet.wait_until(
        "the leases of a daemon frozen inside a transaction taken over",
        Duration::from_secs(30),
        || {
            let now = fleet.leases();
            orphaned.iter().all(|env| {
                now[env].current
                    && now[env].daemon != frozen_id
                    && now[env].generation == before[env].generation + 1
            })
        },
    );
    let finished = fleet.wait_until(
        "every environment deployed",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &commit),
    );
    eprintln!(
        "failover timing: frozen inside a transaction, taken over after {taken_over:?}, its \
         environments all succeeded {finished:?} later ({:?} after the freeze)",
        stopped.elapsed()
    );
    assert_created_once(&fleet);
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn every_daemon_survives_a_database_restart() {
    let Some(server) = gitplane_testkit::postgres_or_skip("failover::database_restart") else {
        return;
    };
    let mut fleet = Fleet::new(&server);
    let first = fleet.sb.head();
    fleet.start(3);
    fleet.wait_until(
        "every environment deployed",
        Duration::from_secs(30),
        || fleet.held_counts() == [2, 2, 2] && fleet.all_succeeded(&ENVS, &first),
    );
    let restart = Instant::now();
    server.restart();
    let restarted = restart.elapsed();
    fleet
        .sb
        .edit("definitions/platform.yaml", "build: 1", "build: 2");
    let second = fleet.sb.commit("A new build of every database");
    let recovered = fleet.wait_until(
        "every environment deployed the commit pushed after the restart",
        Duration::from_secs(40),
        || fleet.all_succeeded(&ENVS, &second),
    );
    eprintln!(
        "failover timing: database restart took {restarted:?}; the next commit was deployed \
         everywhere {recovered:?} after it"
    );
    // Down for half a lease time, longer than a heartbeat, with a commit pushed meanwhile.
    server.stop();
    let outage = Instant::now();
    fleet
        .sb
        .edit("definitions/platform.yaml", "build: 2", "build: 3");
    let third = fleet
        .sb
        .commit("A commit pushed while the database is down");
    // Not a wait for an event: the outage's length is what the test is about.
    thread::sleep(TTL / 2);
    server.start_again();
    let down = outage.elapsed();
    for (i, daemon) in fleet.daemons.iter().enumerate() {
        assert!(
            alive(daemon.pid()),
            "daemon {i} survived {down:?} without the database\n{}",
            fleet.diagnostics()
        );
    }
    let caught_up = fleet.wait_until(
        "every environment deployed the commit pushed while the database was down",
        Duration::from_secs(40),
        || fleet.all_succeeded(&ENVS, &third),
    );
    eprintln!(
        "failover timing: after {down:?} without the database, the commit pushed meanwhile \
         was deployed everywhere {caught_up:?} after it came back"
    );
    for (i, daemon) in fleet.daemons.iter().enumerate() {
        assert!(
            alive(daemon.pid()),
            "daemon {i} survived the restart and the outage\n{}",
            fleet.diagnostics()
        );
    }
    let updates = fleet
        .driver
        .calls()
        .into_iter()
        .filter(|c| c.method == "PUT" && c.existed)
        .count();
    assert!(
        updates >= 2 * ENVS.len(),
        "every database was updated twice: {updates} updates\n{}",
        fleet.diagnostics()
    );
    assert_created_once(&fleet);
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn leases_rebalance_when_a_daemon_joins_and_when_one_leaves() {
    let Some(server) = gitplane_testkit::shared_or_skip("failover::rebalancing") else {
        return;
    };
    let mut fleet = Fleet::new(server);
    let commit = fleet.sb.head();
    fleet.start(2);
    fleet.wait_until("three leases each", Duration::from_secs(30), || {
        fleet.held_counts() == [3, 3]
    });
    fleet.start(1);
    let joined = fleet.wait_until(
        "two leases each once a third daemon joined",
        Duration::from_secs(30),
        || fleet.held_counts() == [2, 2, 2],
    );
    fleet.wait_until(
        "every environment deployed",
        Duration::from_secs(30),
        || fleet.all_succeeded(&ENVS, &commit),
    );
    let leaving = 0;
    let leaving_envs = fleet.held_by(leaving);
    let (code, took) = fleet.daemons[leaving].terminate();
    assert_eq!(code, Some(0), "{}", fleet.daemons[leaving].log());
    let gone = Instant::now();
    let still_held: Vec<String> = fleet
        .leases()
        .into_iter()
        .filter(|(_, l)| l.current && fleet.owns(leaving, &l.daemon))
        .map(|(env, _)| env)
        .collect();
    assert!(
        still_held.is_empty(),
        "a daemon stopped with SIGTERM releases its leases as it stops: {still_held:?}\n{}",
        fleet.diagnostics()
    );
    let rebalanced = fleet.wait_until(
        "three leases each once a daemon left",
        Duration::from_secs(30),
        || fleet.held_counts()[1..] == [3, 3],
    );
    eprintln!(
        "failover timing: join rebalanced in {joined:?}; SIGTERM took {took:?}, its leases \
         taken {rebalanced:?} after it exited ({:?})",
        gone.elapsed()
    );
    assert!(
        rebalanced <= Duration::from_secs(5),
        "released leases are taken within a few seconds, not after the lease time: \
         {rebalanced:?}\n{}",
        fleet.diagnostics()
    );
    for env in &leaving_envs {
        assert!(
            !fleet.owns(leaving, &fleet.leases()[env].daemon),
            "{env} moved to a live daemon"
        );
    }
    assert!(
        fleet.all_succeeded(&ENVS, &commit),
        "{}",
        fleet.diagnostics()
    );
    assert_created_once(&fleet);
}
