//! The chaos test (ignored by default; `cargo test -p gitplane --test e2e chaos -- --ignored
//! --nocapture`): three daemons on one PostgreSQL state and six environments, while a seeded
//! random schedule pushes commits, terminates, kills and freezes daemons and restarts the
//! database. Once the chaos ends every environment is at the last commit, nothing pushed was
//! skipped, every resource was created once at the driver, and no daemon called the driver
//! after its stop, while another daemon held the same resource's call, or after its lease moved
//! away while it was frozen.
//!
//! The seed comes from `GITPLANE_CHAOS_SEED`, else from the clock; it is printed first, and a
//! failure prints it again with the schedule, so that a run can be replayed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::failover::{Call, ENVS, Fleet, Lease, alive, assert_created_once, logged};

/// How long the schedule runs; the settling afterwards is bounded by `SETTLE`.
const CHAOS: Duration = Duration::from_secs(75);
const SETTLE: Duration = Duration::from_secs(90);
/// How late a call of a daemon may reach the driver after its SIGTERM or SIGKILL: a call it
/// had sent before the signal still has to be read by the driver's threads on busy cores.
const LATE: Duration = Duration::from_millis(100);
/// The HTTP driver's time limit in the fleet's host config.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Every environment's drift run, every five seconds (the 6-field cron form has seconds).
const DRIFT_SCHEDULE: &str = "*/5 * * * * *";

/// SplitMix64: a few lines, and enough randomness to pick steps.
struct Rng(u64);

impl Rng {
    /// Step `step`'s own stream of the run of `seed`: what a step draws does not depend on
    /// what the steps before it drew (a step that finds a daemon frozen draws less), so that a
    /// seed replays the same steps.
    fn step(seed: u64, step: u64) -> Rng {
        let mut outer = Rng(seed ^ step.wrapping_mul(0xd1b5_4a32_d192_ed03));
        Rng(outer.next())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A duration between `from` and `to` milliseconds.
    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

/// A daemon that was sent SIGTERM or SIGKILL.
struct Stopped {
    daemon: usize,
    signal: &'static str,
    at: Instant,
}

/// A daemon frozen with SIGSTOP and resumed with SIGCONT.
struct Freeze {
    daemon: usize,
    resume_at: Instant,
    /// The leases it held when it was frozen.
    held: BTreeMap<String, Lease>,
    /// Filled in at SIGCONT: the environments whose lease another daemon took meanwhile...
    moved: BTreeSet<String>,
    /// ...when it was resumed...
    resumed: Option<Instant>,
    /// ...and how much of its log was written by then.
    log_offset: usize,
}

/// What a run did, for the schedule it prints and its summary line.
struct Chaos {
    seed: u64,
    started: Instant,
    schedule: Vec<String>,
    pushes: Vec<Push>,
    stops: Vec<Stopped>,
    freezes: Vec<Freeze>,
    restarts: usize,
}

/// A pushed commit, and whether it changed every resource (a definition value all three
/// definitions read) or only the workloads (their Score file).
struct Push {
    commit: String,
    everything: bool,
}

impl Chaos {
    fn note(&mut self, what: String) {
        let line = format!("{:>7.2}s {what}", self.started.elapsed().as_secs_f64());
        eprintln!("chaos {line}");
        self.schedule.push(line);
    }

    fn count(&self, signal: &str) -> usize {
        self.stops.iter().filter(|s| s.signal == signal).count()
    }

    /// The seed and the schedule, to put in front of a failure.
    fn replay(&self) -> String {
        format!(
            "chaos seed: {} (replay with GITPLANE_CHAOS_SEED={})\nschedule:\n{}\n",
            self.seed,
            self.seed,
            self.schedule.join("\n")
        )
    }
}

fn platform(round: usize) -> String {
    let definition = |id: &str, values: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n\
             entity:\n  type: {id}\n  driver_type: test/http\n  driver_inputs:\n    \
             values:\n      env: ${{context.env.id}}\n      round: {round}\n      {values}\n  \
             criteria:\n    - {{}}\n"
        )
    };
    [
        definition("base-env", "zone: test"),
        definition("postgres", "build: 1"),
        definition("workload", "namespace: ${context.app.id}"),
    ]
    .join("---\n")
}

fn workload(version: usize) -> String {
    format!(
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
         image: registry.example.com/web:{version}\n    variables:\n      DB: \
         ${{resources.db.name}}\nresources:\n  db:\n    type: postgres\n"
    )
}

/// The wall-clock time a log line starts with (`2026-11-25T17:06:00.123456Z`).
fn log_time(line: &str) -> Option<SystemTime> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut ymd = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let mut hms = time.split(':');
    let (h, min) = (
        hms.next()?.parse::<u64>().ok()?,
        hms.next()?.parse::<u64>().ok()?,
    );
    let seconds: f64 = hms.next()?.parse().ok()?;
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let whole = days * 86_400 + h * 3600 + min * 60;
    Some(UNIX_EPOCH + Duration::from_secs(whole) + Duration::from_secs_f64(seconds))
}

#[test]
#[ignore = "a chaos test (about 2 minutes): run it with --ignored"]
fn three_daemons_through_a_random_schedule_of_pushes_kills_freezes_and_database_restarts() {
    let seed = std::env::var("GITPLANE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("chaos seed: {seed}");
    // Its own server: the schedule restarts it.
    let Some(server) = gitplane_testkit::postgres_or_skip("chaos") else {
        return;
    };
    let mut fleet = Fleet::numbered(&server, "");
    for env in ENVS {
        fleet.sb.write(
            &format!("environments/{env}.yaml"),
            &format!("type: test\nschedule: \"{DRIFT_SCHEDULE}\"\n"),
        );
    }
    let mut round = 0;
    let mut version = 0;
    fleet
        .sb
        .write("definitions/platform.yaml", &platform(round));
    fleet.sb.write("workloads/app/web.yaml", &workload(version));
    let first = fleet
        .sb
        .commit("Every definition reads a round; drift runs every five seconds");
    let mut chaos = Chaos {
        seed,
        started: Instant::now(),
        schedule: Vec::new(),
        pushes: vec![Push {
            commit: first.clone(),
            everything: true,
        }],
        stops: Vec::new(),
        freezes: Vec::new(),
        restarts: 0,
    };
    fleet.start(3);
    let mut live: Vec<usize> = vec![0, 1, 2];
    chaos.note(format!("three daemons up, first commit {first}"));

    let resume = |fleet: &Fleet<'_>, chaos: &mut Chaos, at: usize| {
        let daemon = chaos.freezes[at].daemon;
        let now = fleet.leases();
        let moved: BTreeSet<String> = chaos.freezes[at]
            .held
            .iter()
            .filter(|(env, before)| {
                now.get(*env)
                    .is_none_or(|l| l.daemon != before.daemon || l.generation != before.generation)
            })
            .map(|(env, _)| env.clone())
            .collect();
        let freeze = &mut chaos.freezes[at];
        freeze.log_offset = fleet.daemons[daemon].log().len();
        freeze.moved = moved.clone();
        freeze.resumed = Some(Instant::now());
        fleet.signal(daemon, "CONT");
        chaos.note(format!(
            "SIGCONT daemon {daemon}; its leases taken meanwhile: {moved:?}"
        ));
    };
    let mut frozen: Option<usize> = None;
    let mut step = 0;
    while chaos.started.elapsed() < CHAOS {
        step += 1;
        let mut rng = Rng::step(seed, step);
        if let Some(at) = frozen
            && Instant::now() >= chaos.freezes[at].resume_at
        {
            resume(&fleet, &mut chaos, at);
            frozen = None;
        }
        // Three live daemons, at most one of them frozen: the drawn one, or the next if frozen.
        let frozen_daemon = frozen.map(|at| chaos.freezes[at].daemon);
        let pick = rng.below(live.len() as u64) as usize;
        let victim = (0..live.len())
            .map(|k| live[(pick + k) % live.len()])
            .find(|d| Some(*d) != frozen_daemon)
            .expect("a daemon not frozen");
        match rng.below(100) {
            0..35 => {
                let everything = rng.below(2) == 0;
                let commit = if everything {
                    round += 1;
                    fleet
                        .sb
                        .write("definitions/platform.yaml", &platform(round));
                    fleet
                        .sb
                        .commit(&format!("Round {round} of every definition"))
                } else {
                    version += 1;
                    fleet.sb.write("workloads/app/web.yaml", &workload(version));
                    fleet
                        .sb
                        .commit(&format!("Version {version} of the workload"))
                };
                chaos.note(format!(
                    "push {commit} ({})",
                    if everything {
                        format!("round {round}")
                    } else {
                        format!("workload version {version}")
                    }
                ));
                chaos.pushes.push(Push { commit, everything });
            }
            35..45 => {
                chaos.stops.push(Stopped {
                    daemon: victim,
                    signal: "TERM",
                    at: Instant::now(),
                });
                let (code, took) = fleet.daemons[victim].terminate();
                live.retain(|d| *d != victim);
                chaos.note(format!(
                    "SIGTERM daemon {victim}: exit {code:?} after {took:?}"
                ));
                assert_eq!(
                    code,
                    Some(0),
                    "daemon {victim} exits 0 on SIGTERM\n{}{}",
                    chaos.replay(),
                    fleet.daemons[victim].log()
                );
                fleet.start(1);
                live.push(fleet.daemons.len() - 1);
                chaos.note(format!("daemon {} started", fleet.daemons.len() - 1));
            }
            45..55 => {
                chaos.stops.push(Stopped {
                    daemon: victim,
                    signal: "KILL",
                    at: Instant::now(),
                });
                fleet.signal(victim, "KILL");
                live.retain(|d| *d != victim);
                chaos.note(format!("SIGKILL daemon {victim}"));
                fleet.start(1);
                live.push(fleet.daemons.len() - 1);
                chaos.note(format!("daemon {} started", fleet.daemons.len() - 1));
            }
            55..67 if frozen.is_none() => {
                let held = fleet
                    .leases()
                    .into_iter()
                    .filter(|(_, l)| l.current && fleet.owns(victim, &l.daemon))
                    .collect::<BTreeMap<_, _>>();
                let length = rng.millis(2_000, 12_000);
                fleet.signal(victim, "STOP");
                chaos.note(format!(
                    "SIGSTOP daemon {victim} for {length:?}, holding {:?}",
                    held.keys().collect::<Vec<_>>()
                ));
                chaos.freezes.push(Freeze {
                    daemon: victim,
                    resume_at: Instant::now() + length,
                    held,
                    moved: BTreeSet::new(),
                    resumed: None,
                    log_offset: 0,
                });
                frozen = Some(chaos.freezes.len() - 1);
            }
            67..75 => {
                let began = Instant::now();
                server.restart();
                chaos.restarts += 1;
                chaos.note(format!("database restarted in {:?}", began.elapsed()));
            }
            _ => {
                let mut length = rng.millis(300, 3_000);
                if let Some(at) = frozen {
                    length = length.min(
                        chaos.freezes[at]
                            .resume_at
                            .saturating_duration_since(Instant::now()),
                    );
                }
                chaos.note(format!("pause {length:?}"));
                // Not a wait for an event: a pause is a step of the random schedule.
                thread::sleep(length);
            }
        }
        // Not a wait for an event: the random gap between two steps of the schedule.
        thread::sleep(rng.millis(100, 1_000));
    }
    if let Some(at) = frozen {
        resume(&fleet, &mut chaos, at);
    }
    let last = chaos
        .pushes
        .last()
        .map(|p| p.commit.clone())
        .unwrap_or_default();
    chaos.note(format!("chaos over; settling on {last}"));

    // Settled: every environment's newest deployment a succeeded one of the last commit, and
    // nothing running, seen in one reading of the table (drift runs go on meanwhile).
    let settling = Instant::now();
    let deployments = gitplane_testkit::eventually_or(
        format_args!("every environment at the last commit {last}"),
        SETTLE,
        || {
            let deployments = fleet.deployments();
            let settled = ENVS.iter().all(|env| {
                deployments
                    .iter()
                    .rfind(|d| d.env == *env)
                    .is_some_and(|d| d.commit == last && d.status == "succeeded")
            }) && deployments.iter().all(|d| d.status != "running");
            settled.then_some(deployments)
        },
        || format!("{}{}", chaos.replay(), fleet.diagnostics()),
    );
    chaos.note(format!("settled after {:?}", settling.elapsed()));
    for (i, daemon) in fleet.daemons.iter().enumerate() {
        if live.contains(&i) {
            assert!(
                alive(daemon.pid()),
                "daemon {i} is alive\n{}{}",
                chaos.replay(),
                fleet.diagnostics()
            );
        }
    }

    let mut problems: Vec<String> = Vec::new();
    // 1. Every environment at the last commit: its deployments (above) and its resources, each
    // at the last commit that changed it, or a later one (a drift run provisions every resource
    // again from the last commit, and records that commit).
    let last_everything = chaos.pushes.iter().rposition(|p| p.everything).unwrap_or(0);
    let since_last_everything: BTreeSet<&str> = chaos.pushes[last_everything..]
        .iter()
        .map(|p| p.commit.as_str())
        .collect();
    let resources = fleet.rows("SELECT env, type, guresid, commit_id, status FROM resource");
    if resources.len() != ENVS.len() * 3 {
        problems.push(format!(
            "{} resource rows, not {}: {resources:?}",
            resources.len(),
            ENVS.len() * 3
        ));
    }
    for r in &resources {
        let at_its_last_change = if r[1] == "workload" {
            r[3] == last
        } else {
            since_last_everything.contains(r[3].as_str())
        };
        if !at_its_last_change || r[4] != "ready" {
            problems.push(format!(
                "resource {r:?} is not ready at the last commit that changed it or a later one"
            ));
        }
    }
    // 2. No commit skipped without a newer one deployed, no deployment left running, no
    // operation left started.
    let commits: Vec<Vec<String>> = fleet.rows(
        "SELECT env, commit_id FROM deployment WHERE kind = 'commit' AND status = 'succeeded'",
    );
    for (k, push) in chaos.pushes.iter().enumerate() {
        let newer: BTreeSet<&str> = chaos.pushes[k..]
            .iter()
            .map(|p| p.commit.as_str())
            .collect();
        for env in ENVS {
            if !commits
                .iter()
                .any(|r| r[0] == env && newer.contains(r[1].as_str()))
            {
                problems.push(format!(
                    "{env}: neither {} nor a later commit was deployed",
                    push.commit
                ));
            }
        }
    }
    let started_ops = fleet.rows("SELECT id, guresid FROM operation WHERE status = 'started'");
    if !started_ops.is_empty() {
        problems.push(format!("operations left started: {started_ops:?}"));
    }
    // 4. No call after a daemon's stop, no two daemons' calls at once for one resource, no call
    // by a resumed daemon for an environment whose lease moved while it was frozen.
    let calls = fleet.driver.calls();
    let env_of: BTreeMap<&str, &str> = calls
        .iter()
        .filter(|c| !c.env.is_empty())
        .map(|c| (c.guresid.as_str(), c.env.as_str()))
        .collect();
    let env_of = |c: &Call| -> String {
        if c.env.is_empty() {
            env_of
                .get(c.guresid.as_str())
                .copied()
                .unwrap_or_default()
                .to_owned()
        } else {
            c.env.clone()
        }
    };
    let unnamed = calls.iter().filter(|c| c.daemon.is_none()).count();
    if unnamed > 0 {
        problems.push(format!("{unnamed} driver calls without a daemon number"));
    }
    let mut before_stop = 0;
    // Calls the driver read after the signal that the daemon had sent before it.
    let mut read_late = 0;
    for stop in &chaos.stops {
        before_stop += calls
            .iter()
            .filter(|c| c.daemon == Some(stop.daemon))
            .count();
        // When the signal came, by the wall clock the daemons' logs use.
        let signalled = SystemTime::now() - stop.at.elapsed();
        let log = fleet.daemons[stop.daemon].log();
        for c in calls.iter().filter(|c| c.daemon == Some(stop.daemon)) {
            // tiny_http now and then reads a request only once its sender gave up on it: the
            // daemon logged that the call had no answer within the driver's time limit, so
            // it was sent that long before, and maybe before the signal.
            let sent_before = log
                .lines()
                .filter(|l| l.contains(&format!("driver/{}: no answer within", c.guresid)))
                .filter_map(log_time)
                .any(|t| t < signalled + HTTP_TIMEOUT + LATE);
            if c.arrived > stop.at + LATE && sent_before {
                read_late += 1;
                continue;
            }
            if c.arrived > stop.at + LATE {
                problems.push(format!(
                    "daemon {} called {} {} {} {:?} after its SIG{}",
                    stop.daemon,
                    c.method,
                    env_of(c),
                    c.guresid,
                    c.arrived - stop.at,
                    stop.signal
                ));
            }
        }
    }
    let mut by_resource: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in &calls {
        by_resource.entry(c.guresid.as_str()).or_default().push(c);
    }
    for (guresid, of) in &by_resource {
        for (i, a) in of.iter().enumerate() {
            for b in &of[i + 1..] {
                if a.daemon != b.daemon && a.arrived <= b.answered && b.arrived <= a.answered {
                    problems.push(format!(
                        "{guresid}: {} by daemon {:?} and {} by daemon {:?} at once at the driver",
                        a.method, a.daemon, b.method, b.daemon
                    ));
                }
            }
        }
    }
    // How many calls the checks below looked at, so that a run shows they were not vacuous.
    let mut after_resume = 0;
    for freeze in &chaos.freezes {
        let Some(resumed) = freeze.resumed else {
            continue;
        };
        after_resume += calls
            .iter()
            .filter(|c| c.daemon == Some(freeze.daemon) && c.arrived >= resumed)
            .count();
        let log = fleet.daemons[freeze.daemon].log();
        let since = log.get(freeze.log_offset..).unwrap_or_default();
        for env in &freeze.moved {
            // It may take the lease back later (a rebalance): from then on it may call.
            let retaken = since
                .lines()
                .find(|l| logged(l, "lease taken", env, ""))
                .and_then(log_time);
            for c in calls.iter().filter(|c| {
                c.daemon == Some(freeze.daemon)
                    && c.arrived >= resumed
                    && env_of(c) == *env
                    && retaken.is_none_or(|t| c.arrived_at < t)
            }) {
                problems.push(format!(
                    "daemon {} resumed and called {} {env} {} {:?} after SIGCONT, though the \
                     lease had moved while it was frozen (taken back: {retaken:?})",
                    freeze.daemon,
                    c.method,
                    c.guresid,
                    c.arrived - resumed
                ));
            }
        }
    }

    let of_kind = |kind: &str| {
        fleet.rows(&format!(
            "SELECT COUNT(*) FROM deployment WHERE kind = '{kind}'"
        ))[0][0]
            .clone()
    };
    let mut summary = String::new();
    let _ = write!(
        summary,
        "chaos summary: seed={seed} pushes={} sigterm={} sigkill={} sigstop={} (leases moved in \
         {}) db_restarts={} daemons_started={} deployments={} (commit {}, drift {}) \
         driver_calls={} ({} PUT; {before_stop} by daemons later stopped, {after_resume} by \
         resumed daemons after SIGCONT; {read_late} read late, sent before the signal) run={:?}",
        chaos.pushes.len() - 1,
        chaos.count("TERM"),
        chaos.count("KILL"),
        chaos.freezes.len(),
        chaos.freezes.iter().filter(|f| !f.moved.is_empty()).count(),
        chaos.restarts,
        fleet.daemons.len(),
        deployments.len(),
        of_kind("commit"),
        of_kind("drift"),
        calls.len(),
        calls.iter().filter(|c| c.method == "PUT").count(),
        chaos.started.elapsed()
    );
    eprintln!("{summary}");
    assert!(
        problems.is_empty(),
        "{}\n{}problems:\n{}\n{}",
        summary,
        chaos.replay(),
        problems.join("\n"),
        fleet.diagnostics()
    );
    // 3. Every resource created once at the driver, nothing deleted.
    assert_created_once(&fleet);
}
