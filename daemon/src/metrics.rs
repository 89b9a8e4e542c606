//! `/metrics`: the daemon's Prometheus metrics, in the text format Prometheus scrapes and
//! `promtool check metrics` reads.
//!
//! Counters and histograms are counted as things happen (they start from zero with the process,
//! as Prometheus expects); the gauges of what state holds are read from it at each scrape, so a
//! failed environment is `failing` right after a restart, before any new deployment. The
//! daemon's own moment-to-moment facts (its queues, its fetches) are set as they change.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gitplane_state::{DeploymentStatus, Figures};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::calls::{CallObserver, CallResult};
use crate::repo::ConfigRepo;

/// The conditions `gitplane_environment_condition` reports for every environment, each 0 or 1.
pub const CONDITIONS: [&str; 6] = ["ready", "failing", "drifted", "pinned", "held", "running"];

/// Deployments take from milliseconds (nothing changed) to an hour (a database created).
const DEPLOYMENT_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Driver calls: microseconds in process, seconds over HTTP, minutes for Terraform.
const CALL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0,
];
/// From a push noticed to its deployment starting: a webhook makes it well under a second, a
/// poll up to its interval.
const PUSH_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 30.0, 60.0, 300.0,
];

/// The daemon's metrics.
pub struct Metrics {
    registry: Registry,
    deployments: IntCounterVec,
    deployment_duration: HistogramVec,
    driver_calls: IntCounterVec,
    driver_call_duration: HistogramVec,
    push_to_start: Histogram,
    resources: IntGaugeVec,
    held: IntGaugeVec,
    last_success: GaugeVec,
    condition: IntGaugeVec,
    behind: GaugeVec,
    attempt: IntGaugeVec,
    drift_findings: IntGaugeVec,
    queued: IntGaugeVec,
    /// No labels: present only once a remote was fetched (a local repository has none).
    fetch_success: GaugeVec,
    fetch_errors: IntCounterVec,
    /// Held while the gauges are set and the text encoded: two scrapes at once must not
    /// interleave their resets and sets.
    scrape: Mutex<()>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        // Names and help are constants: a failure here is a bug caught by the first test.
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            let h = HistogramVec::new(opts, labels).expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("registered once");
            h
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("registered once");
            g
        };
        let deployments = counter(
            "gitplane_deployments_total",
            "Deployments finished, by environment, kind (commit or drift) and status.",
            &["env", "kind", "status"],
        );
        let deployment_duration = histogram(
            "gitplane_deployment_duration_seconds",
            "How long deployments took, from start to their final status.",
            &["env", "kind"],
            DEPLOYMENT_BUCKETS,
        );
        let driver_calls = counter(
            "gitplane_driver_calls_total",
            "Driver calls made (polls and retries each count), by driver, operation (put, \
             delete or read) and outcome.",
            &["driver", "operation", "outcome"],
        );
        let driver_call_duration = histogram(
            "gitplane_driver_call_duration_seconds",
            "How long single driver calls took.",
            &["driver", "operation"],
            CALL_BUCKETS,
        );
        let push_to_start = Histogram::with_opts(
            HistogramOpts::new(
                "gitplane_push_to_start_seconds",
                "From the daemon noticing a new commit (a webhook, a ref change, a fetch) to \
                 an environment's deployment of it starting.",
            )
            .buckets(PUSH_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        registry
            .register(Box::new(push_to_start.clone()))
            .expect("registered once");
        let resources = gauge(
            "gitplane_resources",
            "Resources recorded in state, by environment and status (ready, failed, orphaned).",
            &["env", "status"],
        );
        let held = gauge(
            "gitplane_held_deployments",
            "Deployments held by the deletion guard, waiting for `gitplane approve`.",
            &["env"],
        );
        let float_gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("registered once");
            g
        };
        let last_success = float_gauge(
            "gitplane_last_success_timestamp_seconds",
            "When the environment's newest successful deployment finished, in seconds since the \
             epoch.",
            &["env"],
        );
        let condition = gauge(
            "gitplane_environment_condition",
            "1 when the environment is in the condition, else 0: ready (its newest finished \
             deployment succeeded), failing (it failed, until one succeeds), drifted (its newest \
             detect run found differences), pinned, held (a deployment waits for approve), \
             running (a deployment runs).",
            &["env", "condition"],
        );
        let behind = float_gauge(
            "gitplane_environment_commit_behind_seconds",
            "The watched ref's commit time minus that of the commit the environment's state \
             comes from: 0 when it is at the ref.",
            &["env"],
        );
        let attempt = gauge(
            "gitplane_deployment_attempt",
            "Which attempt at its commit the environment's newest deployment is: 1 the first, \
             2 the first retry (retry.deployments).",
            &["env"],
        );
        let drift_findings = gauge(
            "gitplane_drift_findings",
            "Differences the environment's newest detect-only drift run found (0 without one).",
            &["env"],
        );
        let queued = gauge(
            "gitplane_queue_jobs",
            "Requests waiting for the environment's worker: a deployment, a retry, a drift run.",
            &["env"],
        );
        let fetch_success = float_gauge(
            "gitplane_fetch_last_success_timestamp_seconds",
            "When the daemon last fetched its remote repository, in seconds since the epoch \
             (only with a remote).",
            &[],
        );
        let fetch_errors = counter(
            "gitplane_fetch_errors_total",
            "Fetches of the remote repository that failed (only with a remote).",
            &[],
        );
        // Which build answers, for dashboards and for alerts that a fleet runs mixed versions.
        gauge(
            "gitplane_build_info",
            "Always 1: the version of the running gitplane and the commit it was built from.",
            &["version", "commit"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION"), env!("GITPLANE_COMMIT")])
        .set(1);
        Metrics {
            registry,
            deployments,
            deployment_duration,
            driver_calls,
            driver_call_duration,
            push_to_start,
            resources,
            held,
            last_success,
            condition,
            behind,
            attempt,
            drift_findings,
            queued,
            fetch_success,
            fetch_errors,
            scrape: Mutex::new(()),
        }
    }

    /// A fetch of the remote ended: its time kept when it succeeded, counted when it failed.
    pub fn fetched(&self, ok: bool) {
        let errors = self.fetch_errors.with_label_values::<&str>(&[]);
        if ok {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            self.fetch_success
                .with_label_values::<&str>(&[])
                .set(now.as_secs_f64());
        } else {
            errors.inc();
        }
    }

    /// `env`'s queue holds `n` requests now.
    pub fn queued(&self, env: &str, n: usize) {
        self.queued
            .with_label_values(&[env])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `env` has no queue any more (its lease went, or the daemon stops).
    pub fn unqueued(&self, env: &str) {
        let _ = self.queued.remove_label_values(&[env]);
    }

    /// A deployment of `env` ended with `status` after `took`.
    pub fn deployment_finished(
        &self,
        env: &str,
        drift: bool,
        status: DeploymentStatus,
        took: Duration,
    ) {
        let kind = if drift { "drift" } else { "commit" };
        self.deployments
            .with_label_values(&[env, kind, status.as_str()])
            .inc();
        self.deployment_duration
            .with_label_values(&[env, kind])
            .observe(took.as_secs_f64());
    }

    /// An environment's deployment of a commit started `since` after the commit was noticed.
    pub fn push_started(&self, since: Duration) {
        self.push_to_start.observe(since.as_secs_f64());
    }

    /// The metrics in the Prometheus text format, the gauges set from `figures` and `behind`
    /// (`(env, seconds)`, from [`commits_behind`]).
    pub fn render(&self, figures: &Figures, behind: &[(String, f64)]) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        // Environments that went away leave no stale series behind.
        self.resources.reset();
        self.held.reset();
        self.last_success.reset();
        self.condition.reset();
        self.behind.reset();
        self.attempt.reset();
        self.drift_findings.reset();
        for env in &figures.envs {
            let finished = figures
                .last_finished
                .iter()
                .find(|(e, _)| e == env)
                .map(|(_, s)| s.as_str());
            let has = |list: &[String]| list.iter().any(|e| e == env);
            let findings = figures
                .drift_findings
                .iter()
                .find(|(e, _)| e == env)
                .map_or(0, |(_, n)| *n);
            let held = figures.held.iter().any(|(e, n)| e == env && *n > 0);
            for (condition, on) in CONDITIONS.into_iter().zip([
                finished == Some("succeeded"),
                finished == Some("failed"),
                findings > 0,
                has(&figures.pinned),
                held,
                has(&figures.running),
            ]) {
                self.condition
                    .with_label_values(&[env, condition])
                    .set(i64::from(on));
            }
            self.drift_findings.with_label_values(&[env]).set(findings);
        }
        for (env, attempt) in &figures.attempts {
            self.attempt.with_label_values(&[env]).set(*attempt);
        }
        for (env, seconds) in behind {
            self.behind.with_label_values(&[env]).set(*seconds);
        }
        for (env, status, n) in &figures.resources {
            self.resources.with_label_values(&[env, status]).set(*n);
        }
        for env in &figures.envs {
            self.held.with_label_values(&[env]).set(0);
        }
        for (env, n) in &figures.held {
            self.held.with_label_values(&[env]).set(*n);
        }
        for (env, at) in &figures.last_success {
            self.last_success.with_label_values(&[env]).set(*at);
        }
        let mut out = Vec::new();
        // Encoding into a Vec of metrics we built ourselves cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl CallObserver for Metrics {
    fn call_ended(
        &self,
        driver: &str,
        operation: &'static str,
        result: CallResult,
        took: Duration,
    ) {
        self.driver_calls
            .with_label_values(&[driver, operation, result.as_str()])
            .inc();
        self.driver_call_duration
            .with_label_values(&[driver, operation])
            .observe(took.as_secs_f64());
    }
}

/// How far each environment's commit (`figures.commits`) is behind the watched ref's, by
/// commit time: 0 at the ref, never below 0 (a pin on an older commit, a rebase). An
/// environment whose commit the repository does not have is left out, as is everything when
/// the ref cannot be read: a scrape never fails on git.
pub fn commits_behind(
    repo: &Path,
    git_ref: Option<&str>,
    commits: &[(String, String)],
) -> Vec<(String, f64)> {
    let Ok(repo) = ConfigRepo::open(repo) else {
        return Vec::new();
    };
    let Ok(head) = repo.resolve(git_ref) else {
        return Vec::new();
    };
    let Ok(head_time) = repo.commit_time(&head) else {
        return Vec::new();
    };
    commits
        .iter()
        .filter_map(|(env, commit)| {
            if *commit == head {
                return Some((env.clone(), 0.0));
            }
            let time = repo.commit_time(commit).ok()?;
            Some((env.clone(), (head_time - time).max(0) as f64))
        })
        .collect()
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_gauges_reach_the_text() {
        let m = Metrics::new();
        m.deployment_finished(
            "dev",
            false,
            DeploymentStatus::Succeeded,
            Duration::from_millis(300),
        );
        m.call_ended("echo", "put", CallResult::Done, Duration::from_micros(20));
        m.call_ended("echo", "put", CallResult::Done, Duration::from_micros(20));
        let figures = Figures {
            envs: vec!["dev".into(), "prod".into()],
            resources: vec![("dev".into(), "ready".into(), 7)],
            held: vec![("prod".into(), 1)],
            last_success: vec![("dev".into(), 1_700_000_000.5)],
            ..Figures::default()
        };
        let text = m.render(&figures, &[]);
        assert!(text.contains(
            "gitplane_deployments_total{env=\"dev\",kind=\"commit\",status=\"succeeded\"} 1"
        ));
        assert!(text.contains(
            "gitplane_driver_calls_total{driver=\"echo\",operation=\"put\",outcome=\"done\"} 2"
        ));
        assert!(text.contains("gitplane_resources{env=\"dev\",status=\"ready\"} 7"));
        assert!(text.contains("gitplane_held_deployments{env=\"dev\"} 0"));
        assert!(text.contains("gitplane_held_deployments{env=\"prod\"} 1"));
        assert!(text.contains("gitplane_last_success_timestamp_seconds{env=\"dev\"} 1700000000.5"));
        assert!(
            text.contains(
                "gitplane_deployment_duration_seconds_count{env=\"dev\",kind=\"commit\"} 1"
            )
        );
        // No fetch metrics without a remote.
        assert!(!text.contains("gitplane_fetch"));
        // A later scrape without the environment drops its series.
        let text = m.render(&Figures::default(), &[]);
        assert!(!text.contains("gitplane_resources{"));
    }

    #[test]
    fn each_environment_has_every_condition_as_0_or_1() {
        let m = Metrics::new();
        let figures = Figures {
            envs: vec!["dev".into(), "prod".into()],
            held: vec![("prod".into(), 1)],
            last_finished: vec![
                ("dev".into(), "failed".into()),
                ("prod".into(), "succeeded".into()),
            ],
            running: vec!["dev".into()],
            attempts: vec![("dev".into(), 3)],
            pinned: vec!["prod".into()],
            drift_findings: vec![("prod".into(), 4)],
            ..Figures::default()
        };
        let text = m.render(&figures, &[("dev".into(), 90.0)]);
        let on = |env: &str, condition: &str| {
            let line = format!(
                "gitplane_environment_condition{{condition=\"{condition}\",env=\"{env}\"}} "
            );
            let at = text
                .find(&line)
                .unwrap_or_else(|| panic!("{line} in {text}"));
            text[at + line.len()..].starts_with('1')
        };
        let dev: Vec<bool> = CONDITIONS.iter().map(|c| on("dev", c)).collect();
        let prod: Vec<bool> = CONDITIONS.iter().map(|c| on("prod", c)).collect();
        // ready, failing, drifted, pinned, held, running
        assert_eq!(dev, [false, true, false, false, false, true]);
        assert_eq!(prod, [true, false, true, true, true, false]);
        assert!(text.contains("gitplane_drift_findings{env=\"dev\"} 0"));
        assert!(text.contains("gitplane_drift_findings{env=\"prod\"} 4"));
        assert!(text.contains("gitplane_deployment_attempt{env=\"dev\"} 3"));
        assert!(text.contains("gitplane_environment_commit_behind_seconds{env=\"dev\"} 90"));

        m.queued("dev", 2);
        m.fetched(true);
        m.fetched(false);
        let text = m.render(&figures, &[]);
        assert!(text.contains("gitplane_queue_jobs{env=\"dev\"} 2"));
        assert!(text.contains("gitplane_fetch_errors_total 1"));
        assert!(text.contains("gitplane_fetch_last_success_timestamp_seconds 1"));
        m.unqueued("dev");
        assert!(!m.render(&figures, &[]).contains("gitplane_queue_jobs{"));
    }
}
