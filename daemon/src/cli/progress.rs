//! Progress of an apply for people: a bar on a terminal, plain lines otherwise.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::output::short;
use crate::reconcile::{Event, Outcome};

/// Counts resources as the reconciler reports them.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    done: usize,
    /// Resources whose driver calls have started and not finished.
    running: HashSet<String>,
    failed: usize,
    /// Lines not on a terminal, written out at most every [`FLUSH_EVERY`] while resources
    /// keep finishing, and whenever the apply waits for a driver: an apply of 50 000 resources
    /// would otherwise make 50 000 writes.
    lines: std::io::BufWriter<std::io::Stderr>,
    flushed: Instant,
}

/// How long lines may wait before they are written out.
const FLUSH_EVERY: Duration = Duration::from_millis(200);

impl Progress {
    pub fn new(env: &str, commit: &str) -> Self {
        eprintln!("{env}: applying commit {}", short(commit));
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("  [{bar:30}] {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar
        });
        Progress {
            bar,
            total: 0,
            done: 0,
            running: HashSet::new(),
            failed: 0,
            lines: std::io::BufWriter::with_capacity(64 * 1024, std::io::stderr()),
            flushed: Instant::now(),
        }
    }

    fn summary(&self) -> String {
        let running = self.running.len();
        let waiting = self.total.saturating_sub(self.done + running + self.failed);
        format!(
            "{} done, {running} in progress, {} failed, {waiting} waiting",
            self.done, self.failed
        )
    }

    pub fn event(&mut self, event: &Event<'_>) {
        match event {
            Event::Planned { total } => {
                self.total = *total;
                if let Some(bar) = &self.bar {
                    bar.set_length(*total as u64);
                }
            }
            Event::Started { label, .. } => {
                self.running.insert((*label).to_owned());
            }
            Event::Waiting => self.flush(),
            Event::Finished {
                label,
                action,
                outcome,
            } => {
                let line = match outcome {
                    Outcome::Done => {
                        self.done += 1;
                        format!("{:<9} {label}", action.as_str())
                    }
                    Outcome::Unchanged => {
                        self.done += 1;
                        format!("{:<9} {label} (inputs unchanged after all)", "unchanged")
                    }
                    Outcome::Failed(err) => {
                        self.failed += 1;
                        format!("{:<9} {label} FAILED: {err}", action.as_str())
                    }
                    Outcome::Skipped(why) => {
                        self.failed += 1;
                        format!("{:<9} {label} skipped: {why}", action.as_str())
                    }
                };
                self.running.remove(*label);
                match &self.bar {
                    Some(bar) => bar.println(format!("  {line}")),
                    None => {
                        let summary = self.summary();
                        // Progress is best effort: a closed stderr must not stop an apply.
                        let _ = writeln!(self.lines, "  [{summary}] {line}");
                        if self.flushed.elapsed() >= FLUSH_EVERY {
                            self.flush();
                        }
                    }
                }
            }
        }
        if let Some(bar) = &self.bar {
            bar.set_position((self.done + self.failed) as u64);
            bar.set_message(self.summary());
        }
    }

    pub fn finish(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.flush();
    }

    /// Writes out the lines kept back.
    fn flush(&mut self) {
        let _ = self.lines.flush();
        self.flushed = Instant::now();
    }
}

/// An apply's progress, shown from the moment its reconcile starts: an environment a pin holds
/// shows none.
pub struct Shown {
    env: String,
    commit: String,
    progress: Option<Progress>,
}

impl Shown {
    pub fn new(env: &str, commit: &str) -> Self {
        Shown {
            env: env.to_owned(),
            commit: commit.to_owned(),
            progress: None,
        }
    }

    pub fn finish(&mut self) {
        if let Some(progress) = &mut self.progress {
            progress.finish();
        }
    }
}

impl crate::app::Observer for Shown {
    fn starting(&mut self) {
        self.progress = Some(Progress::new(&self.env, &self.commit));
    }

    fn event(&mut self, event: &Event<'_>) {
        if let Some(progress) = &mut self.progress {
            progress.event(event);
        }
    }
}
