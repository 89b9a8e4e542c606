//! Waiting for an event instead of sleeping for a guess: poll a check until it gives a value or
//! a deadline passes, then fail saying what never happened.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// The first pause between two checks; it doubles up to [`LONGEST_PAUSE`], so a fast event is
/// seen within milliseconds and a slow one costs few checks.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// Runs `check` until it gives `Some`, and returns that value; panics with
/// "timed out after {within:?} waiting for {what}" when it has not within `within`.
///
/// `check` runs at least once, and once more after the deadline, so an event that happened
/// while the test thread was descheduled is not reported as missing.
#[track_caller]
pub fn eventually<T>(what: impl Display, within: Duration, check: impl FnMut() -> Option<T>) -> T {
    match poll(within, check) {
        Some(found) => found,
        None => panic!("timed out after {within:?} waiting for {what}"),
    }
}

/// Like [`eventually`], and on a timeout the message ends with `context()`: what the test saw
/// instead (a daemon's log, the rows in state, the calls a driver received).
#[track_caller]
pub fn eventually_or<T>(
    what: impl Display,
    within: Duration,
    check: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    match poll(within, check) {
        Some(found) => found,
        None => panic!(
            "timed out after {within:?} waiting for {what}\n{}",
            context()
        ),
    }
}

/// Like [`eventually`], for a caller that handles the timeout itself: `None` when `check` gave
/// no value within `within`.
pub fn poll<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn gives_the_first_value_the_check_finds() {
        let calls = Cell::new(0);
        let found = eventually("the third call", Duration::from_secs(5), || {
            calls.set(calls.get() + 1);
            (calls.get() == 3).then_some("third")
        });
        assert_eq!((found, calls.get()), ("third", 3));
    }

    #[test]
    fn checks_once_more_at_the_deadline_and_then_gives_up() {
        let calls = Cell::new(0);
        let started = Instant::now();
        let found: Option<()> = poll(Duration::from_millis(50), || {
            calls.set(calls.get() + 1);
            None
        });
        assert_eq!(found, None);
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(calls.get() >= 2, "{} checks", calls.get());
    }

    #[test]
    #[should_panic(expected = "waiting for the tide\nthe sea is calm")]
    fn a_timeout_ends_with_what_the_test_saw() {
        eventually_or(
            "the tide",
            Duration::from_millis(10),
            || None::<()>,
            || "the sea is calm".to_owned(),
        );
    }

    #[test]
    #[should_panic(expected = "waiting for the moon")]
    fn a_timeout_names_what_it_waited_for() {
        eventually("the moon", Duration::from_millis(10), || None::<()>);
    }
}
