//! `gitplane reconcile`: asks the running daemons to look now, and with `--wait` waits for
//! what they did.
//!
//! The request is a row of the state (`reconcile_request`), so it reaches whichever daemon
//! deploys the environment, on any host; a daemon on this host is also sent SIGUSR1, so it
//! looks at once rather than at its next look (`watch_interval`).

use std::io::Write;
use std::time::{Duration, Instant};

use gitplane_state::{
    DaemonRecord, DeploymentRecord, DeploymentStatus, ReconcileAction, ReconcileRequest, Store,
};
use serde_json::{Value, json};

use super::actor::Actor;
use super::output::short;
use super::{CliError, CommandResult, Format};
use crate::app::{Context, existing_store};
use crate::deploy;

/// A daemon on another host counts as running when it reported itself this recently (daemons
/// sharing a PostgreSQL state report with every heartbeat, a fifth of the lease's time).
const REMOTE_SEEN_WITHIN: Duration = Duration::from_secs(120);

/// How often `--wait` reads the state.
const POLL: Duration = Duration::from_millis(200);

/// What `gitplane reconcile` was asked.
pub(super) struct Ask {
    pub wait: bool,
    pub timeout: Duration,
    pub format: Format,
}

/// Runs `gitplane reconcile`.
pub(super) fn reconcile(
    ctx: &Context,
    ask: &Ask,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let store = existing_store(ctx)?;
    let running = Running::find(&store)?;
    if running.local.is_empty() && running.remote == 0 {
        return Err(CliError::NoDaemon {
            state: ctx.state.display().to_string(),
        });
    }
    let envs = asked_envs(ctx);
    let ids = store.request_reconcile(&envs, &actor.name)?;
    let named: Vec<&str> = envs.iter().flatten().map(String::as_str).collect();
    let detail = match named.as_slice() {
        [] => "look at the repository".to_owned(),
        envs => format!("look now: {}", envs.join(", ")),
    };
    actor.record(
        &store,
        "reconcile",
        named.first().copied().filter(|_| named.len() == 1),
        None,
        &detail,
    )?;
    let signalled = running.signal();
    if !ask.wait {
        return asked(stdout, ask.format, &named, &ids, &signalled);
    }
    let outcomes = wait(&store, &ids, ask, stdout)?;
    if ask.format == Format::Json {
        let rows: Vec<Value> = outcomes.iter().map(Outcome::json).collect();
        writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        )?;
    }
    Ok(if outcomes.iter().all(Outcome::is_fine) {
        CommandResult::Success
    } else {
        CommandResult::Failure
    })
}

/// The requests to make: each `--env`, else each environment the watched ref declares, and
/// one without an environment (look at the repository) when there are none to name.
fn asked_envs(ctx: &Context) -> Vec<Option<String>> {
    if !ctx.envs.is_empty() {
        return ctx.envs.iter().cloned().map(Some).collect();
    }
    let declared = ctx.open_repo().ok().and_then(|repo| {
        let commit = repo.resolve(ctx.default_rev.as_deref()).ok()?;
        let layout = repo.layout(&commit).ok()?;
        Some(deploy::environments_in(&layout))
    });
    match declared {
        Some(envs) if !envs.is_empty() => envs.into_iter().map(Some).collect(),
        _ => vec![None],
    }
}

/// Says what was asked, without waiting.
fn asked(
    stdout: &mut impl Write,
    format: Format,
    named: &[&str],
    ids: &[String],
    signalled: &Signalled,
) -> Result<CommandResult, CliError> {
    if format == Format::Json {
        let rows: Vec<Value> = ids
            .iter()
            .zip(
                named
                    .iter()
                    .map(|e| Some(*e))
                    .chain(std::iter::repeat(None)),
            )
            .map(|(id, env)| json!({"request": id, "env": env, "outcome": "asked"}))
            .collect();
        writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        )?;
        return Ok(CommandResult::Success);
    }
    let what = match named {
        [] => "the daemon looks at the repository now".to_owned(),
        envs => format!("asked the daemon to look now: {}", envs.join(", ")),
    };
    writeln!(stdout, "{what}")?;
    writeln!(stdout, "  {}", signalled.said())?;
    writeln!(
        stdout,
        "  `gitplane reconcile --wait` waits for the outcome; `gitplane history` shows it"
    )?;
    Ok(CommandResult::Success)
}

/// The daemons of the state that run now: those on this host whose process is a live
/// gitplane, and how many on other hosts reported themselves lately.
struct Running {
    local: Vec<DaemonRecord>,
    remote: usize,
}

impl Running {
    fn find(store: &Store) -> Result<Running, CliError> {
        let host = gitplane_state::this_host();
        let now = chrono::Utc::now();
        let (mut local, mut remote) = (Vec::new(), 0);
        for daemon in store.daemons()? {
            if daemon.host == host {
                if is_gitplane(daemon.pid) {
                    local.push(daemon);
                }
            } else if chrono::DateTime::parse_from_rfc3339(&daemon.seen_at).is_ok_and(|seen| {
                (now - seen.with_timezone(&chrono::Utc))
                    .to_std()
                    .is_ok_and(|ago| ago < REMOTE_SEEN_WITHIN)
            }) {
                remote += 1;
            }
        }
        Ok(Running { local, remote })
    }

    /// Sends SIGUSR1 to the daemons on this host.
    fn signal(&self) -> Signalled {
        let mut signalled = Signalled {
            remote: self.remote,
            ..Signalled::default()
        };
        for daemon in &self.local {
            let sent = i32::try_from(daemon.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
                .map(|pid| rustix::process::kill_process(pid, rustix::process::Signal::USR1));
            match sent {
                Some(Ok(())) => signalled.sent.push(daemon.pid),
                Some(Err(e)) => signalled.refused.push((daemon.pid, e.to_string())),
                None => {}
            }
        }
        signalled
    }
}

/// Whether process `pid` runs gitplane: a pid the table names may have been given to another
/// program since, which SIGUSR1 would end.
fn is_gitplane(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "gitplane")
}

/// Which daemons were told at once.
#[derive(Default)]
struct Signalled {
    sent: Vec<i64>,
    refused: Vec<(i64, String)>,
    remote: usize,
}

impl Signalled {
    fn said(&self) -> String {
        let mut said = Vec::new();
        if !self.sent.is_empty() {
            said.push(format!(
                "the daemon on this host (pid {}) was told at once",
                join(&self.sent)
            ));
        }
        for (pid, why) in &self.refused {
            said.push(format!(
                "the daemon pid {pid} could not be signalled ({why}): it takes the request at \
                 its next look (watch_interval)"
            ));
        }
        if self.remote > 0 {
            said.push(format!(
                "{} daemon(s) on other hosts take it at their next look (watch_interval)",
                self.remote
            ));
        }
        said.join("; ")
    }
}

fn join(pids: &[i64]) -> String {
    pids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// How one request ended, as far as the command saw.
enum Outcome {
    /// The daemon deployed: the deployment that did it.
    Deployed(ReconcileRequest, Box<DeploymentRecord>),
    /// The daemon answered without deploying.
    Answered(ReconcileRequest),
    /// `--timeout` ran out: no answer, or the deployment had not finished.
    TimedOut(ReconcileRequest),
    /// The request is gone from the state (a day old, or a copied state).
    Gone(String),
}

impl Outcome {
    fn is_fine(&self) -> bool {
        match self {
            Outcome::Deployed(_, d) => d.status == DeploymentStatus::Succeeded,
            Outcome::Answered(r) => r.answer.as_ref().is_some_and(|a| {
                matches!(
                    a.action,
                    ReconcileAction::UpToDate
                        | ReconcileAction::Looked
                        | ReconcileAction::Pinned
                        | ReconcileAction::Preview
                )
            }),
            Outcome::TimedOut(_) | Outcome::Gone(_) => false,
        }
    }

    fn line(&self, timeout: Duration) -> String {
        match self {
            Outcome::Deployed(r, d) => {
                let env = r.env.as_deref().unwrap_or("-");
                let commit = d.commit_id.as_deref().map(short).unwrap_or("-");
                match d.status {
                    DeploymentStatus::Succeeded => format!(
                        "{env}: deployment {} of {commit} succeeded: {} created, {} updated, {} \
                         deleted, {} unchanged",
                        d.id,
                        d.counts.created,
                        d.counts.updated,
                        d.counts.deleted,
                        d.counts.unchanged
                    ),
                    status => format!(
                        "{env}: deployment {} of {commit} {}: {}",
                        d.id,
                        status.as_str(),
                        d.error
                            .as_deref()
                            .and_then(|e| e.lines().next())
                            .unwrap_or("see `gitplane history`")
                    ),
                }
            }
            Outcome::Answered(r) => {
                let a = r.answer.as_ref();
                let commit = a
                    .and_then(|a| a.commit_id.as_deref())
                    .map(short)
                    .unwrap_or("-");
                let action = a.map_or("-", |a| a.action.as_str());
                let detail = a.and_then(|a| a.detail.as_deref());
                match (&r.env, detail) {
                    (None, None) => format!("looked at {commit}"),
                    (None, Some(d)) => format!("looked at {commit}: {d}"),
                    (Some(env), None) => format!("{env}: {action} at {commit}"),
                    (Some(env), Some(d)) => format!("{env}: {action}: {d}"),
                }
            }
            Outcome::TimedOut(r) => {
                let env = r.env.as_deref().unwrap_or("the repository");
                match &r.answer {
                    None => format!(
                        "{env}: no daemon answered within {}: is the daemon that deploys it \
                         running? (`gitplane status` shows which daemon holds it)",
                        humantime::format_duration(timeout)
                    ),
                    Some(_) => format!(
                        "{env}: the deployment had not finished after {}; the daemon goes on \
                         (`gitplane history --env {env}`)",
                        humantime::format_duration(timeout)
                    ),
                }
            }
            Outcome::Gone(id) => format!("request {id} is gone from the state"),
        }
    }

    fn json(&self) -> Value {
        let (request, outcome, deployment) = match self {
            Outcome::Deployed(r, d) => (
                Some(r),
                d.status.as_str().to_owned(),
                Some(super::output::history_json(d)),
            ),
            Outcome::Answered(r) => (
                Some(r),
                r.answer
                    .as_ref()
                    .map_or("asked", |a| a.action.as_str())
                    .to_owned(),
                None,
            ),
            Outcome::TimedOut(r) => (Some(r), "timed out".to_owned(), None),
            Outcome::Gone(id) => return json!({"request": id, "outcome": "gone"}),
        };
        let answer = request.and_then(|r| r.answer.as_ref());
        json!({
            "request": request.map(|r| &r.id),
            "env": request.and_then(|r| r.env.as_ref()),
            "outcome": outcome,
            "action": answer.map(|a| a.action.as_str()),
            "commit": answer.and_then(|a| a.commit_id.as_ref()),
            "detail": answer.and_then(|a| a.detail.as_ref()),
            "answered_by": answer.map(|a| &a.answered_by),
            "deployment": deployment,
        })
    }
}

/// Waits until each request is answered and each deployment it asked for has ended, or
/// `ask.timeout` passes; prints each outcome as it comes (table format).
fn wait(
    store: &Store,
    ids: &[String],
    ask: &Ask,
    stdout: &mut impl Write,
) -> Result<Vec<Outcome>, CliError> {
    let deadline = Instant::now() + ask.timeout;
    let mut outcomes: Vec<Option<Outcome>> = ids.iter().map(|_| None).collect();
    loop {
        let requests = store.reconcile_requests(ids)?;
        let timed_out = Instant::now() >= deadline;
        for (slot, id) in outcomes.iter_mut().zip(ids) {
            if slot.is_some() {
                continue;
            }
            let outcome = match requests.iter().find(|r| &r.id == id) {
                None => Some(Outcome::Gone(id.clone())),
                Some(request) => ended(store, request)?
                    .or_else(|| timed_out.then(|| Outcome::TimedOut(request.clone()))),
            };
            if let Some(outcome) = outcome {
                if ask.format == Format::Table {
                    writeln!(stdout, "{}", outcome.line(ask.timeout))?;
                }
                *slot = Some(outcome);
            }
        }
        if outcomes.iter().all(Option::is_some) {
            return Ok(outcomes.into_iter().flatten().collect());
        }
        std::thread::sleep(POLL);
    }
}

/// How `request` ended, if it has: answered without a deployment, or the deployment it
/// asked for ended (the first after the answer's `after_deployment` that deployed the answer's
/// commit, or that began after the answer: a newer commit's, which took its place).
fn ended(store: &Store, request: &ReconcileRequest) -> Result<Option<Outcome>, CliError> {
    let Some(answer) = &request.answer else {
        return Ok(None);
    };
    let (ReconcileAction::Deploying, Some(env)) = (answer.action, &request.env) else {
        return Ok(Some(Outcome::Answered(request.clone())));
    };
    let done = store
        .deployments_after(env, answer.after_deployment)?
        .into_iter()
        .find(|d| {
            d.status != DeploymentStatus::Running
                && (d.commit_id == answer.commit_id || d.started_at >= answer.answered_at)
        });
    Ok(done.map(|d| Outcome::Deployed(request.clone(), Box::new(d))))
}
