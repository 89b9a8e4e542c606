//! The daemon's per-environment request queue: what an environment's worker runs next, how the
//! requests that arrive meanwhile merge, and when a deployment that did not finish is retried.
//!
//! Pure: no I/O, no clock (the caller passes `now`), so every merge is a unit test. The model is
//! kube-rs's scheduler and `error_policy`: requests for one object merge while it is busy, and
//! a reconcile that failed is requeued with a backoff.
//!
//! The merge rules:
//! - a deployment request (a commit of the watched ref, a preview's head or its removal) replaces
//!   a waiting one: the newest commit wins;
//! - a drift request never replaces a deployment: it waits behind it, and two drift requests
//!   are one;
//! - a retry is a deployment of the commit that did not finish, due after a backoff; a newer
//!   deployment request drops it, and so does any request for the same commit (which runs now);
//! - what runs next: a waiting deployment, else a retry that is due, else a drift run.

use std::time::{Duration, Instant};

pub use crate::config::DeploymentRetry;

/// What a worker runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work<J> {
    /// Deploy `commit`: the first attempt (`attempt` 1) or a retry.
    Deploy {
        commit: String,
        job: J,
        attempt: u32,
    },
    /// A drift run of the environment's last good commit.
    Drift,
}

/// How a worker's run ended, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Nothing to retry: it succeeded, was held or pinned, the commit does not build (it never
    /// will), or the environment is no longer this daemon's.
    Done,
    /// It did not finish: a driver error, a state error, or it was cut short.
    Unfinished,
}

/// A deployment to run again once `due`.
#[derive(Debug, Clone)]
struct Retry<J> {
    commit: String,
    job: J,
    /// The attempt this retry is (2 for the first retry).
    attempt: u32,
    due: Instant,
}

/// One environment's requests.
#[derive(Debug)]
pub struct RequestQueue<J> {
    /// The newest deployment request handed to the queue: the commit the environment is to be at.
    newest: Option<String>,
    /// A deployment waiting for the worker.
    waiting: Option<(String, J)>,
    /// A drift run waiting for the worker.
    drift: bool,
    retry: Option<Retry<J>>,
    /// No more work: the environment is no longer this daemon's, or the daemon stops.
    closed: bool,
}

impl<J> Default for RequestQueue<J> {
    fn default() -> Self {
        RequestQueue {
            newest: None,
            waiting: None,
            drift: false,
            retry: None,
            closed: false,
        }
    }
}

impl<J: Clone> RequestQueue<J> {
    /// A deployment of `commit`: replaces the one waiting, and ends the retries of an older one.
    pub fn deploy(&mut self, commit: String, job: J) {
        self.retry = None;
        self.newest = Some(commit.clone());
        self.waiting = Some((commit, job));
    }

    /// A drift run: waits behind a deployment, and merges with one already waiting.
    pub fn drift(&mut self) {
        self.drift = true;
    }

    /// No more work is taken: the worker ends once its run ends.
    pub fn close(&mut self) {
        self.closed = true;
        self.waiting = None;
        self.drift = false;
        self.retry = None;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// How many requests wait for the worker: a deployment, a retry (due or not), a drift run.
    pub fn pending(&self) -> usize {
        if self.closed {
            return 0;
        }
        usize::from(self.waiting.is_some())
            + usize::from(self.retry.is_some())
            + usize::from(self.drift)
    }

    /// The next work to run at `now`: a waiting deployment, else a retry that is due, else a
    /// drift run.
    pub fn next(&mut self, now: Instant) -> Option<Work<J>> {
        if self.closed {
            return None;
        }
        if let Some((commit, job)) = self.waiting.take() {
            return Some(Work::Deploy {
                commit,
                job,
                attempt: 1,
            });
        }
        if self.retry.as_ref().is_some_and(|r| r.due <= now)
            && let Some(r) = self.retry.take()
        {
            return Some(Work::Deploy {
                commit: r.commit,
                job: r.job,
                attempt: r.attempt,
            });
        }
        if std::mem::take(&mut self.drift) {
            return Some(Work::Drift);
        }
        None
    }

    /// Whether [`RequestQueue::next`] would give work at `now`, without taking it: a worker
    /// waits for a deployment slot first, and takes the work once it holds one, so that
    /// requests arriving meanwhile merge into it.
    pub fn has_work(&self, now: Instant) -> bool {
        !self.closed
            && (self.waiting.is_some()
                || self.retry.as_ref().is_some_and(|r| r.due <= now)
                || self.drift)
    }

    /// When the retry waiting is due, if one is.
    pub fn due(&self) -> Option<Instant> {
        self.retry.as_ref().filter(|_| !self.closed).map(|r| r.due)
    }

    /// Makes a waiting retry due now (the database came back, say).
    pub fn retry_now(&mut self, now: Instant) {
        if let Some(r) = &mut self.retry {
            r.due = r.due.min(now);
        }
    }

    /// Whether `commit` is still the newest deployment requested: a worker about to run an
    /// older one (or a retry of it) leaves it.
    pub fn is_newest(&self, commit: &str) -> bool {
        self.newest.as_deref().is_none_or(|newest| newest == commit)
    }

    /// Records how `work` ended at `now`. An unfinished deployment of the newest commit, with
    /// nothing newer waiting, is retried after the policy's delay (`salt` draws the jitter);
    /// returns that delay. Drift runs are not retried: the next scheduled run is their retry.
    pub fn ended(
        &mut self,
        work: &Work<J>,
        ended: Ended,
        policy: &DeploymentRetry,
        (now, salt): (Instant, u64),
    ) -> Option<Duration> {
        let Work::Deploy {
            commit,
            job,
            attempt,
        } = work
        else {
            return None;
        };
        if ended == Ended::Done || self.closed || self.waiting.is_some() || !self.is_newest(commit)
        {
            return None;
        }
        // `max_attempts` counts retries: attempt 1 is the deployment itself.
        if policy.max_attempts != 0 && *attempt > policy.max_attempts {
            return None;
        }
        let delay = policy.delay(*attempt, salt);
        self.retry = Some(Retry {
            commit: commit.clone(),
            job: job.clone(),
            attempt: attempt + 1,
            due: now + delay,
        });
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: DeploymentRetry = DeploymentRetry {
        interval: Duration::from_secs(10),
        max_interval: Duration::from_secs(60),
        max_attempts: 0,
    };

    fn deploy(commit: &str, attempt: u32) -> Work<&'static str> {
        Work::Deploy {
            commit: commit.to_owned(),
            job: "job",
            attempt,
        }
    }

    #[test]
    fn the_newest_commit_wins() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("a".into(), "job");
        q.deploy("b".into(), "job");
        assert_eq!(q.next(now), Some(deploy("b", 1)));
        assert_eq!(q.next(now), None);
    }

    #[test]
    fn has_work_says_what_next_would_give_without_taking_it() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        assert!(!q.has_work(now));
        q.deploy("a".into(), "job");
        assert!(q.has_work(now));
        // A commit that arrives while the worker waits for a slot is the one it then takes.
        q.deploy("b".into(), "job");
        assert!(q.has_work(now));
        let work = q.next(now).unwrap();
        assert_eq!(work, deploy("b", 1));
        assert!(!q.has_work(now));
        q.ended(&work, Ended::Unfinished, &POLICY, (now, 1));
        assert!(!q.has_work(now), "a retry is work once it is due");
        assert!(q.has_work(now + Duration::from_secs(3600)));
        q.drift();
        assert!(q.has_work(now));
        q.close();
        assert!(!q.has_work(now));
    }

    #[test]
    fn pending_counts_what_waits_for_the_worker() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        assert_eq!(q.pending(), 0);
        q.deploy("a".into(), "job");
        q.deploy("b".into(), "job");
        q.drift();
        assert_eq!(
            q.pending(),
            2,
            "one deployment (the newest) and a drift run"
        );
        let work = q.next(now).unwrap();
        assert_eq!(q.pending(), 1, "the running deployment no longer waits");
        q.ended(&work, Ended::Unfinished, &POLICY, (now, 1));
        assert_eq!(q.pending(), 2, "its retry waits, not yet due");
        q.close();
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn a_drift_request_never_replaces_a_commit_and_waits_behind_it() {
        // The defect this queue replaces: a channel that kept only the newest job let a drift
        // tick overwrite a pushed commit, which was then never deployed.
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("b".into(), "job");
        q.drift();
        q.drift();
        assert_eq!(q.next(now), Some(deploy("b", 1)));
        assert_eq!(q.next(now), Some(Work::Drift));
        assert_eq!(q.next(now), None, "two drift requests are one run");
        // A commit that arrives after a drift request still goes first.
        q.drift();
        q.deploy("c".into(), "job");
        assert_eq!(q.next(now), Some(deploy("c", 1)));
        assert_eq!(q.next(now), Some(Work::Drift));
    }

    #[test]
    fn an_unfinished_deployment_is_retried_with_a_growing_backoff() {
        let mut q = RequestQueue::default();
        let t0 = Instant::now();
        q.deploy("a".into(), "job");
        let mut work = q.next(t0).unwrap();
        let mut waits = Vec::new();
        let mut now = t0;
        for expected_attempt in 2..=6 {
            let delay = q
                .ended(&work, Ended::Unfinished, &POLICY, (now, 1000))
                .unwrap();
            waits.push(delay);
            assert_eq!(q.next(now), None, "not before it is due");
            assert_eq!(q.due(), Some(now + delay));
            now += delay;
            work = q.next(now).unwrap();
            assert_eq!(work, deploy("a", expected_attempt));
        }
        // salt 1000 draws the factor 0.5 + 499/1000.
        let f = |s: u64| Duration::from_secs(s).mul_f64(0.999);
        assert_eq!(waits, vec![f(10), f(20), f(40), f(60), f(60)]);
        // Done ends the retries.
        assert_eq!(q.ended(&work, Ended::Done, &POLICY, (now, 1)), None);
        assert_eq!(q.due(), None);
    }

    #[test]
    fn a_newer_commit_ends_the_retries_of_an_older_one() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("a".into(), "job");
        let a = q.next(now).unwrap();
        q.ended(&a, Ended::Unfinished, &POLICY, (now, 0)).unwrap();
        q.deploy("b".into(), "job");
        let later = now + Duration::from_secs(3600);
        assert_eq!(q.next(later), Some(deploy("b", 1)));
        assert_eq!(q.next(later), None, "the retry of a is gone");
    }

    #[test]
    fn a_run_overtaken_while_it_ran_is_not_retried() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("a".into(), "job");
        let a = q.next(now).unwrap();
        // b arrives while a runs; a then fails.
        q.deploy("b".into(), "job");
        assert_eq!(q.ended(&a, Ended::Unfinished, &POLICY, (now, 0)), None);
        assert_eq!(q.next(now), Some(deploy("b", 1)));
        // A retry of an older commit (queued before b came) is left by the worker.
        assert!(!q.is_newest("a"));
        assert!(q.is_newest("b"));
    }

    #[test]
    fn retries_stop_after_max_attempts() {
        let policy = DeploymentRetry {
            max_attempts: 2,
            ..POLICY
        };
        let mut q = RequestQueue::default();
        let mut now = Instant::now();
        q.deploy("a".into(), "job");
        let mut runs = 0;
        while let Some(work) = q.next(now) {
            runs += 1;
            if let Some(delay) = q.ended(&work, Ended::Unfinished, &policy, (now, 0)) {
                now += delay;
            }
        }
        assert_eq!(runs, 3, "the deployment and two retries");
    }

    #[test]
    fn drift_runs_are_not_retried_and_do_not_end_a_commits_retries() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("a".into(), "job");
        let a = q.next(now).unwrap();
        let delay = q.ended(&a, Ended::Unfinished, &POLICY, (now, 0)).unwrap();
        q.drift();
        let drift = q.next(now).unwrap();
        assert_eq!(drift, Work::Drift);
        assert_eq!(q.ended(&drift, Ended::Unfinished, &POLICY, (now, 0)), None);
        assert_eq!(q.next(now + delay), Some(deploy("a", 2)));
    }

    #[test]
    fn retry_now_makes_a_waiting_retry_due() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("a".into(), "job");
        let a = q.next(now).unwrap();
        q.ended(&a, Ended::Unfinished, &POLICY, (now, 0)).unwrap();
        assert_eq!(q.next(now), None);
        q.retry_now(now);
        assert_eq!(q.next(now), Some(deploy("a", 2)));
    }

    #[test]
    fn a_closed_queue_gives_nothing_and_retries_nothing() {
        let mut q = RequestQueue::default();
        let now = Instant::now();
        q.deploy("a".into(), "job");
        let a = q.next(now).unwrap();
        q.drift();
        q.close();
        assert_eq!(q.ended(&a, Ended::Unfinished, &POLICY, (now, 0)), None);
        assert_eq!(q.next(now), None);
        assert_eq!(q.due(), None);
        assert!(q.is_closed());
    }

    #[test]
    fn the_delay_is_capped_and_never_zero_for_a_nonzero_interval() {
        let d = POLICY.delay(30, 0);
        assert_eq!(d, Duration::from_secs(30));
        assert!(POLICY.delay(1, 0) >= Duration::from_secs(5));
    }
}
