//! `/metrics`: the daemon's Prometheus metrics, in the text format Prometheus scrapes and
//! `promtool check metrics` reads.
//!
//! Counters and histograms are counted as things happen (they start from zero with the process,
//! as Prometheus expects); the gauges of what state holds are read from it at each scrape.

use std::sync::Mutex;
use std::time::Duration;

use gitplane_state::{DeploymentStatus, Figures};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::calls::{CallObserver, CallResult};

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
        let last_success = GaugeVec::new(
            Opts::new(
                "gitplane_last_success_timestamp_seconds",
                "When the environment's newest successful deployment finished, in seconds since \
                 the epoch.",
            ),
            &["env"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(last_success.clone()))
            .expect("registered once");
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
            scrape: Mutex::new(()),
        }
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

    /// The metrics in the Prometheus text format, the gauges set from `figures`.
    pub fn render(&self, figures: &Figures) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        // Environments that went away leave no stale series behind.
        self.resources.reset();
        self.held.reset();
        self.last_success.reset();
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
        };
        let text = m.render(&figures);
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
        // A later scrape without the environment drops its series.
        let text = m.render(&Figures::default());
        assert!(!text.contains("gitplane_resources{"));
    }
}
