//! The driver-call engine: every call gitplane makes to a driver that does not answer in
//! process (a put or delete of `reconcile`, a read of `drift`) runs here, within the same
//! permits, polls, retries, deadline and stop checks.
//!
//! Concurrency is visible in the types, as in mini-redis: a caller takes a call's [`Held`]
//! permits *before* it spawns the call's task, checks [`Halt`] right after, and hands the
//! permits to [`call_until_done`], which makes its first call with them and takes them again
//! for every poll or retry, checking [`Halt`] each time before it calls. So a call waiting for
//! a permit when gitplane stops, or the environment's lease is lost, is never made; and a
//! resource waiting between polls holds no permit, leaving room for others.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gitplane_state::{LeaseHold, LockHold};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::RetryPolicy;
use crate::drivers::{Cookie, Driver, DriverError, DriverRequest, ErrorKind, OwnedRequest};

/// Why no new driver call may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halted {
    /// gitplane is stopping (SIGTERM).
    Stopping,
    /// The environment's lease is no longer this daemon's: another may be calling the same
    /// resources.
    LeaseLost,
    /// The environment's apply lock is no longer this process's (another took it over, or it
    /// went unrenewed long enough that one may have).
    LockLost,
}

impl Halted {
    /// Why, in a person's words.
    pub fn cause(self) -> &'static str {
        match self {
            Halted::Stopping => "gitplane is shutting down",
            Halted::LeaseLost => "this daemon no longer holds the environment's lease",
            Halted::LockLost => "this process no longer holds the environment's lock",
        }
    }

    /// How a resource whose call never started for this reason is recorded: skipped, for the
    /// next run to do.
    pub fn skip_reason(self) -> String {
        format!("stopped: {}", self.cause())
    }
}

/// What stops new driver calls: every flag is read as a call is about to start. One more
/// reason to stop is one more field and one more line in [`Halt::halted`].
#[derive(Clone, Default)]
pub struct Halt {
    /// Set when gitplane is stopping.
    pub stop: Option<Arc<AtomicBool>>,
    /// The environment's lease, when daemons share a PostgreSQL state.
    pub lease: Option<Arc<LeaseHold>>,
    /// The environment's apply lock.
    pub lock: Option<Arc<LockHold>>,
}

impl Halt {
    /// Why no new call may start now, if it may not. A lost lease is named first: it is the
    /// reason that matters to another daemon.
    pub fn halted(&self) -> Option<Halted> {
        if self.lease.as_ref().is_some_and(|l| !l.holds()) {
            return Some(Halted::LeaseLost);
        }
        if self.lock.as_ref().is_some_and(|l| !l.holds()) {
            return Some(Halted::LockLost);
        }
        if self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
            return Some(Halted::Stopping);
        }
        None
    }
}

/// The permits of one apply or detect run: the global `concurrency`, and one limit per driver
/// that sets its own.
pub struct Limits {
    global: Arc<Semaphore>,
    per_driver: HashMap<String, Arc<Semaphore>>,
}

impl Limits {
    pub fn new(concurrency: usize) -> Limits {
        Limits {
            global: Arc::new(Semaphore::new(concurrency.max(1))),
            per_driver: HashMap::new(),
        }
    }

    /// The permits a call of `driver` needs, `limit` being its own concurrency, if any.
    pub fn of(&mut self, driver: &str, limit: Option<usize>) -> Permits {
        let local = limit.map(|n| {
            self.per_driver
                .entry(driver.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(n.max(1))))
                .clone()
        });
        Permits {
            global: self.global.clone(),
            local,
        }
    }
}

/// The permits one driver's calls need: the global one and, if the driver has a limit, its own.
#[derive(Clone)]
pub struct Permits {
    global: Arc<Semaphore>,
    local: Option<Arc<Semaphore>>,
}

impl Permits {
    /// Waits for both. The driver's own comes first: a call that holds it while it waits for
    /// the global one holds back only its own driver's calls, which could not run anyway.
    pub async fn acquire(&self) -> Held {
        let local = match &self.local {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphores of a run are never closed"),
            ),
            None => None,
        };
        let global = self
            .global
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphores of a run are never closed");
        Held {
            _local: local,
            _global: global,
        }
    }

    /// Both, if both are free now.
    pub fn try_acquire(&self) -> Option<Held> {
        let local = match &self.local {
            Some(s) => Some(s.clone().try_acquire_owned().ok()?),
            None => None,
        };
        let global = self.global.clone().try_acquire_owned().ok()?;
        Some(Held {
            _local: local,
            _global: global,
        })
    }
}

/// Permits taken: one driver call may run while they are held. Dropping them frees them.
pub struct Held {
    _local: Option<OwnedSemaphorePermit>,
    _global: OwnedSemaphorePermit,
}

/// How one driver call ended, as metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    Done,
    /// The resource is still being worked on: the driver is asked again later.
    InProgress,
    /// A failure that is retried (timeouts, 409, 429, 5xx).
    TransientError,
    /// A failure that calling again cannot mend.
    FinalError,
}

impl CallResult {
    pub fn as_str(self) -> &'static str {
        match self {
            CallResult::Done => "done",
            CallResult::InProgress => "in_progress",
            CallResult::TransientError => "transient_error",
            CallResult::FinalError => "final_error",
        }
    }

    pub(crate) fn of<T>(answer: &Result<(Option<T>, Cookie), DriverError>) -> CallResult {
        match answer {
            Ok((Some(_), _)) => CallResult::Done,
            Ok((None, _)) => CallResult::InProgress,
            Err(e) if e.kind == ErrorKind::Transient => CallResult::TransientError,
            Err(_) => CallResult::FinalError,
        }
    }
}

/// Told of every driver call as it ends: the daemon's metrics.
pub trait CallObserver: Send + Sync {
    /// `operation` is `put`, `delete` or `read`.
    fn call_ended(&self, driver: &str, operation: &'static str, result: CallResult, took: Duration);
}

/// One kind of driver call: put, delete or read.
pub trait Call: Send + Sync + 'static {
    /// What a call that is done gives.
    type Answer: Send + 'static;

    /// `put`, `delete` or `read`, as metrics name it.
    fn operation(&self) -> &'static str;

    /// Calls `driver` once (on a blocking thread): the answer when done, `None` while the
    /// resource is in progress, and what to do with the cookie.
    fn call(
        &self,
        driver: &dyn Driver,
        request: &DriverRequest<'_>,
    ) -> Result<(Option<Self::Answer>, Cookie), DriverError>;
}

/// Everything a resource's calls need besides the request.
pub struct Caller {
    pub driver: Arc<dyn Driver>,
    /// The driver's type, as metrics name it.
    pub driver_type: String,
    /// Taken for every call after the first.
    pub permits: Permits,
    pub retry: RetryPolicy,
    pub halt: Halt,
    /// Told of every call; `None` outside the daemon.
    pub observer: Option<Arc<dyn CallObserver>>,
}

/// Why a resource's calls did not end with an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No call was made: gitplane stopped, or the lease was lost, before the first one.
    Halted(Halted),
    /// A driver's error, or the calls given up on (in progress too long, retries spent,
    /// stopped between polls or retries).
    Failed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Halted(h) => f.write_str(&h.skip_reason()),
            Failure::Failed(why) => f.write_str(why),
        }
    }
}

/// Calls the driver until the resource is done: polling while it is in progress (until
/// `retry.poll_timeout`), retrying transient failures with exponential backoff and jitter (up
/// to `retry.attempts` calls). `first` are the permits for the first call, taken by the caller
/// before it spawned this; later calls take theirs again, and every call, the first included,
/// starts only if [`Halt`] allows it once its permits are held.
///
/// `ended` is told of every call as it ends (the calls made so far and the cookie the driver
/// set), before the next one starts and before this returns, so a journal is never behind the
/// driver. Returns the number of calls made and the answer or why there is none.
pub async fn call_until_done<C: Call>(
    call: C,
    mut request: OwnedRequest,
    caller: Caller,
    first: Held,
    mut ended: impl FnMut(i64, Cookie) + Send,
) -> (i64, Result<C::Answer, Failure>) {
    let Caller {
        driver,
        driver_type,
        permits,
        retry,
        halt,
        observer,
    } = caller;
    let operation = call.operation();
    let call = Arc::new(call);
    let started = Instant::now();
    let mut attempts: i64 = 0;
    let mut transient_failures: u32 = 0;
    let mut poll_delay = retry.poll_interval;
    let mut first = Some(first);
    loop {
        let held = match first.take() {
            Some(held) => held,
            None => permits.acquire().await,
        };
        if let Some(h) = halt.halted() {
            let failure = if attempts == 0 {
                Failure::Halted(h)
            } else {
                Failure::Failed(format!(
                    "stopped before its next call ({}); the next run calls the driver again \
                     with the same cookie",
                    h.cause()
                ))
            };
            return (attempts, Err(failure));
        }
        attempts += 1;
        let call_started = Instant::now();
        let answer = {
            let (driver, call) = (driver.clone(), call.clone());
            tokio::task::spawn_blocking(move || {
                let answer = call.call(&*driver, &request.request());
                (request, answer)
            })
            .await
        };
        // Freed before `ended` hears of the call: a scheduler woken by it finds the permits free.
        drop(held);
        let (returned, answer) = match answer {
            Ok(pair) => pair,
            Err(panic) => {
                let error = format!("the driver panicked: {panic}");
                return (attempts, Err(Failure::Failed(error)));
            }
        };
        request = returned;
        if let Some(observer) = &observer {
            let result = CallResult::of(&answer);
            observer.call_ended(&driver_type, operation, result, call_started.elapsed());
        }
        let cookie = match &answer {
            Ok((_, cookie)) => cookie.clone(),
            Err(error) => error.cookie.clone(),
        };
        match &cookie {
            Cookie::Unchanged => {}
            Cookie::Set(c) => request.cookie = Some(c.clone()),
            Cookie::Cleared => request.cookie = None,
        }
        ended(attempts, cookie);
        match answer {
            Ok((Some(done), _)) => return (attempts, Ok(done)),
            Ok((None, _)) => {
                if started.elapsed() >= retry.poll_timeout {
                    let error = format!(
                        "still in progress after {}s (retry.poll_timeout)",
                        retry.poll_timeout.as_secs()
                    );
                    return (attempts, Err(Failure::Failed(error)));
                }
                if let Some(h) = halt.halted() {
                    let error = format!(
                        "stopped while in progress ({}); the next run calls the driver again \
                         with the same cookie",
                        h.cause()
                    );
                    return (attempts, Err(Failure::Failed(error)));
                }
                tokio::time::sleep(poll_delay).await;
                poll_delay = (poll_delay * 2).min(retry.max_delay.max(retry.poll_interval));
            }
            Err(DriverError {
                kind: ErrorKind::Transient,
                message,
                ..
            }) => {
                transient_failures += 1;
                if transient_failures >= retry.attempts {
                    let error = format!("{message} (gave up after {transient_failures} attempts)");
                    return (attempts, Err(Failure::Failed(error)));
                }
                if let Some(h) = halt.halted() {
                    let error = format!("{message} (not retried: {})", h.cause());
                    return (attempts, Err(Failure::Failed(error)));
                }
                tokio::time::sleep(backoff(&retry, transient_failures, &request.guresid)).await;
            }
            Err(DriverError {
                kind: ErrorKind::Final,
                message,
                ..
            }) => return (attempts, Err(Failure::Failed(message))),
        }
    }
}

/// `initial_delay * 2^(n-1)`, capped at `max_delay`, times a random factor in [0.5, 1.5) so
/// resources that failed together do not retry together.
pub(crate) fn backoff(retry: &RetryPolicy, failures: u32, salt: &str) -> Duration {
    let exp = retry
        .initial_delay
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    let capped = exp.min(retry.max_delay);
    let random = std::collections::hash_map::RandomState::new().hash_one((salt, failures));
    let factor = 0.5 + (random % 1000) as f64 / 1000.0;
    capped.mul_f64(factor)
}
