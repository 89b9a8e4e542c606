//! `gitplane rollback` and `gitplane unpin`, the notifications of commands that change what an
//! environment runs, and the pin, preview and action lines of `status` and `history`.

use std::io::Write;

use gitplane_state::{ActionRecord, ApplyLock, EnvPin, PreviewRecord, Store};
use serde_json::{Value, json};

use super::actor::Actor;
use super::output::short;
use super::{
    Attribution, CliError, CommandResult, Commit, Context, apply_targets, existing_store,
    report_rejected, targets,
};
use crate::config::NotifyEvent;
use crate::deploy::Reach;
use crate::notifications::{CliEvent, notify_cli};
use crate::reconcile::ApplyOptions;

/// What a command did, for [`announce`].
pub(super) struct Announce<'a> {
    /// `Rollback`, `Approved`, `Pinned` or `Unpinned`.
    pub event: NotifyEvent,
    pub env: &'a str,
    pub commit: Option<&'a str>,
    pub deployment: Option<i64>,
    pub reason: Option<&'a str>,
}

/// Tells the host config's `notify:` targets what `actor` did. Bounded in time
/// ([`crate::notifications::CLI_WAIT`]); a target it does not reach is a warning on stderr,
/// never the command's failure: what the command did is done and recorded either way.
pub(super) fn announce(ctx: &Context, actor: &Actor, what: Announce<'_>) {
    if ctx.host.notify.is_empty() {
        return;
    }
    let event = CliEvent {
        event: what.event,
        env: what.env.to_owned(),
        actor: actor.name.clone(),
        host: actor.host.clone(),
        commit: what.commit.map(str::to_owned),
        deployment: what.deployment,
        reason: what.reason.map(str::to_owned),
    };
    for problem in notify_cli(&ctx.host.notify, &event) {
        eprintln!("warning: notification {problem}");
    }
}

/// The one environment a command works on (`--env`).
fn one_env(ctx: &Context, command: &str) -> Result<String, CliError> {
    match ctx.envs.as_slice() {
        [env] => Ok(env.clone()),
        _ => Err(CliError::OneEnv(command.to_owned())),
    }
}

/// What `gitplane rollback` was asked.
pub(super) struct Rollback<'a> {
    /// The commit (branch, tag) to go back to.
    pub to: &'a str,
    pub reason: &'a str,
    /// Pin a commit outside the watched ref's history that was never deployed there.
    pub force: bool,
}

/// `gitplane rollback --env E --to COMMIT --reason WHY`: applies an earlier commit to one
/// environment and pins it there; commits after it are planned, not applied, until `unpin`.
///
/// Only a commit of the watched ref's history, or one deployed to the environment before, is
/// taken: anything else (an unmerged branch) could be code nobody reviewed, and needs
/// `--force`, which the pin records. A refused rollback writes nothing.
pub(super) fn rollback(
    ctx: &Context,
    asked: Rollback<'_>,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let Rollback { to, reason, force } = asked;
    let env = one_env(ctx, "rollback")?;
    if reason.trim().is_empty() {
        return Err(CliError::NoReason);
    }
    let mut store = existing_store(ctx)?;
    if store.latest_deployment(&env)?.is_none() {
        return Err(crate::app::AppError::UnknownStateEnv {
            env,
            state: store.path().to_owned(),
            known: store.environments()?.join(", "),
        }
        .into());
    }
    let outside = outside_history(ctx, &store, &env, to)?;
    if let (Some(outside), false) = (&outside, force) {
        return Err(CliError::OutsideHistory {
            commit: short(&outside.commit).to_owned(),
            env,
            watched: outside.watched.clone(),
        });
    }
    let lock = ApplyLock::acquire(&ctx.state, &env, false)?;
    let commit = Commit::resolve(ctx, Some(to), Some(&store))?;
    commit.claim(ctx, &store)?;
    // Built before the pin is recorded: a commit that cannot be applied pins nothing.
    let targets = match targets(ctx, &commit, Some(&store), Reach::Changes)? {
        Ok(targets) => targets,
        Err(rejected) => {
            report_rejected(commit.id(), &rejected);
            return Ok(CommandResult::Failure);
        }
    };
    let who = &actor.name;
    let forced = outside.as_ref().map(|o| {
        format!(
            "forced: not in the history of {} and never deployed to {env}",
            o.watched
        )
    });
    store.pin(&env, commit.id(), who, reason, forced.is_some())?;
    let before = store.latest_deployment(&env)?.map(|d| d.id);
    let attribution = Attribution {
        actor,
        command: "rollback",
        detail: Some(match &forced {
            Some(forced) => format!("pinned at {} ({forced}): {reason}", short(commit.id())),
            None => format!("pinned at {}: {reason}", short(commit.id())),
        }),
    };
    let outcome = apply_targets(
        ctx,
        &mut store,
        commit.id(),
        &targets,
        (&ApplyOptions::default(), std::slice::from_ref(&lock)),
        &attribution,
        stdout,
    )?;
    let deployment = store
        .latest_deployment(&env)?
        .filter(|d| Some(d.id) != before)
        .map(|d| d.id);
    if let Some(d) = deployment {
        store.set_pin_deployment(&env, d)?;
    }
    let forced = forced.map(|f| format!(" ({f})")).unwrap_or_default();
    writeln!(
        stdout,
        "{env}: pinned at {} by {who}{forced}: {reason}\n  Later commits are planned, not \
         applied, until `gitplane unpin --env {env}`.",
        short(commit.id())
    )?;
    stdout.flush()?;
    announce(
        ctx,
        actor,
        Announce {
            event: NotifyEvent::Rollback,
            env: &env,
            commit: Some(commit.id()),
            deployment,
            reason: Some(reason),
        },
    );
    Ok(outcome)
}

/// `gitplane pin --env E --reason WHY`: freezes an environment at the commit it runs (its last
/// good deployment), with no deployment: later commits are planned, not applied, until
/// `unpin`. Refused while a deployment runs there, when nothing ran there yet, and when it is
/// pinned already; a refused pin writes nothing.
pub(super) fn pin(
    ctx: &Context,
    reason: &str,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let env = one_env(ctx, "pin")?;
    if reason.trim().is_empty() {
        return Err(CliError::NoPinReason);
    }
    let store = existing_store(ctx)?;
    // Held while the pin is written: a deployment running now would otherwise land after it.
    let _lock = ApplyLock::acquire(&ctx.state, &env, false)?;
    if let Some(pin) = store
        .pins(Some(&env))?
        .into_iter()
        .find(|p| p.unpinned_at.is_none())
    {
        return Err(CliError::AlreadyPinned {
            env,
            commit: short(&pin.commit_id).to_owned(),
            by: pin.pinned_by,
        });
    }
    let Some(commit) = store.last_good_commit(&env)? else {
        return Err(CliError::NothingToPin { env });
    };
    let who = &actor.name;
    store.pin(&env, &commit, who, reason, false)?;
    let detail = format!("pinned at {}: {reason}", short(&commit));
    actor.record(&store, "pin", Some(&env), None, &detail)?;
    announce(
        ctx,
        actor,
        Announce {
            event: NotifyEvent::Pinned,
            env: &env,
            commit: Some(&commit),
            deployment: None,
            reason: Some(reason),
        },
    );
    writeln!(
        stdout,
        "{env}: pinned at {} by {who}: {reason}\n  Later commits are planned, not applied, until \
         `gitplane unpin --env {env}`.",
        short(&commit)
    )?;
    Ok(CommandResult::Success)
}

/// A rollback's commit that is outside the watched ref's history.
struct Outside {
    commit: String,
    /// The watched ref, as people name it (`refs/heads/main`).
    watched: String,
}

/// `Some` when `to` is neither the watched ref's head nor in its history, and was never
/// deployed to `env`: a rollback there needs `--force`.
fn outside_history(
    ctx: &Context,
    store: &Store,
    env: &str,
    to: &str,
) -> Result<Option<Outside>, CliError> {
    let repo = ctx.open_repo()?;
    ctx.check_repository(&repo, store, false)?;
    let commit = repo.resolve(Some(to))?;
    let watched = ctx.default_rev.clone();
    let head = repo.resolve(watched.as_deref())?;
    if repo.is_ancestor(&commit, &head)? || store.deployed_before(env, &commit)? {
        return Ok(None);
    }
    let watched = watched
        .or_else(|| repo.head_ref())
        .unwrap_or_else(|| "HEAD".to_owned());
    Ok(Some(Outside { commit, watched }))
}

/// `gitplane unpin --env E`: releases the pin and, unless `no_apply`, applies the newest commit
/// of the watched ref, as the daemon would have.
pub(super) fn unpin(
    ctx: &Context,
    actor: &Actor,
    no_apply: bool,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let env = one_env(ctx, "unpin")?;
    let mut store = existing_store(ctx)?;
    // Read first: the pin is released only once the repository is known to be the state's.
    let commit = if no_apply {
        None
    } else {
        let commit = Commit::resolve(ctx, ctx.default_rev.as_deref(), Some(&store))?;
        commit.claim(ctx, &store)?;
        Some(commit)
    };
    let lock = ApplyLock::acquire(&ctx.state, &env, false)?;
    let who = &actor.name;
    let Some(pin) = store.unpin(&env, who)? else {
        return Err(CliError::NotPinned { env });
    };
    writeln!(
        stdout,
        "{env}: unpinned by {who} (it was pinned at {} by {}: {})",
        short(&pin.commit_id),
        pin.pinned_by,
        pin.reason
    )?;
    let released = format!(
        "released the pin at {} ({} by {})",
        short(&pin.commit_id),
        pin.reason,
        pin.pinned_by
    );
    stdout.flush()?;
    announce(
        ctx,
        actor,
        Announce {
            event: NotifyEvent::Unpinned,
            env: &env,
            commit: Some(&pin.commit_id),
            deployment: None,
            reason: Some(&released),
        },
    );
    let Some(commit) = commit else {
        actor.record(&store, "unpin", Some(&env), None, &released)?;
        return Ok(CommandResult::Success);
    };
    let targets = match targets(ctx, &commit, Some(&store), Reach::Changes)? {
        Ok(targets) => targets,
        Err(rejected) => {
            report_rejected(commit.id(), &rejected);
            let error = rejected.errors.join("\n");
            let id = store.failed_deployment(&env, Some(commit.id()), &error)?;
            let detail = format!("{released}; commit {} rejected", short(commit.id()));
            actor.record(&store, "unpin", Some(&env), Some(id), &detail)?;
            return Ok(CommandResult::Failure);
        }
    };
    let attribution = Attribution {
        actor,
        command: "unpin",
        detail: Some(released),
    };
    apply_targets(
        ctx,
        &mut store,
        commit.id(),
        &targets,
        (&ApplyOptions::default(), std::slice::from_ref(&lock)),
        &attribution,
        stdout,
    )
}

/// The lines `status` shows under an environment's heading: its pin, and what it is a preview
/// of.
pub(super) fn status_lines(pin: Option<&EnvPin>, preview: Option<&PreviewRecord>) -> String {
    let mut lines = String::new();
    if let Some(pin) = pin {
        lines.push_str(&format!(
            "  pinned at {} by {} since {}{}: {}\n",
            short(&pin.commit_id),
            pin.pinned_by,
            pin.pinned_at,
            forced_words(pin),
            pin.reason
        ));
        if let Some(waiting) = &pin.waiting_commit {
            lines.push_str(&format!(
                "  held back: {} ({}); `gitplane unpin --env {}` applies it\n",
                short(waiting),
                plan_words(pin.waiting_plan.as_deref()),
                pin.env
            ));
        }
    }
    if let Some(p) = preview {
        let branch = p.branch.trim_start_matches("refs/heads/");
        if p.removed_why.as_deref() == Some(crate::previews::DECLARED) {
            lines.push_str(&format!(
                "  no longer a preview (it was branch {branch}'s): the watched ref declares it \
                 since {}\n",
                p.removed_at.as_deref().unwrap_or("")
            ));
            return lines;
        }
        let state = match (&p.removing_at, &p.removed_at, &p.commit_id) {
            (_, Some(at), _) => format!(
                "removed at {at} ({})",
                p.removed_why.as_deref().unwrap_or("")
            ),
            (Some(at), None, _) => format!(
                "being removed since {at} ({})",
                p.removed_why.as_deref().unwrap_or("")
            ),
            (None, None, Some(_)) => format!("last pushed at {}", p.pushed_at),
            (None, None, None) => "never deployed".to_owned(),
        };
        let platform = p
            .platform_commit
            .as_deref()
            .map(|c| format!(", with the platform of {}", short(c)))
            .unwrap_or_default();
        lines.push_str(&format!(
            "  preview of branch {branch}: {state}{platform}\n"
        ));
        if let (Some(commit), Some(why)) = (&p.refused_commit, &p.refused_why) {
            lines.push_str(&format!(
                "  not deployed: {branch} at {}: {why}\n",
                short(commit)
            ));
        }
    }
    lines
}

/// `{"create":1,...}` as words: "1 to create, 0 to update, 2 to delete".
fn plan_words(plan: Option<&str>) -> String {
    let counts: Value = plan
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or(Value::Null);
    let n = |k: &str| counts.get(k).and_then(Value::as_u64).unwrap_or(0);
    format!(
        "{} to create, {} to update, {} to delete",
        n("create"),
        n("update"),
        n("delete")
    )
}

/// `status --format json`'s `pin` and `preview` fields.
pub(super) fn status_fields(
    status: &mut Value,
    pin: Option<&EnvPin>,
    preview: Option<&PreviewRecord>,
) {
    let Some(fields) = status.as_object_mut() else {
        return;
    };
    if let Some(pin) = pin {
        fields.insert("pin".to_owned(), pin_json(pin));
    }
    if let Some(p) = preview {
        fields.insert(
            "preview".to_owned(),
            json!({
                "branch": p.branch,
                "type": p.env_type,
                "commit": p.commit_id,
                "created_at": p.created_at,
                "pushed_at": p.pushed_at,
                "removing_at": p.removing_at,
                "removed_at": p.removed_at,
                "removed_why": p.removed_why,
                "platform_commit": p.platform_commit,
                "refused": p.refused_commit.as_ref().map(|c| json!({
                    "commit": c,
                    "why": p.refused_why,
                })),
            }),
        );
    }
}

/// ` (forced: outside the watched ref's history)` for a pin made with `--force`.
fn forced_words(pin: &EnvPin) -> &'static str {
    if pin.forced {
        " (forced: outside the watched ref's history)"
    } else {
        ""
    }
}

fn pin_json(pin: &EnvPin) -> Value {
    json!({
        "commit": pin.commit_id,
        "pinned_by": pin.pinned_by,
        "reason": pin.reason,
        "forced": pin.forced,
        "pinned_at": pin.pinned_at,
        "deployment": pin.deployment_id,
        "unpinned_by": pin.unpinned_by,
        "unpinned_at": pin.unpinned_at,
        "held_back": pin.waiting_commit.as_ref().map(|c| json!({
            "commit": c,
            "plan": pin.waiting_plan.as_deref().and_then(|p| serde_json::from_str::<Value>(p).ok()),
        })),
    })
}

/// `history`'s pins: a line per pin, newest first (after the deployments' table).
pub(super) fn history_lines(pins: &[EnvPin]) -> String {
    let mut out = String::new();
    for pin in pins {
        let deployment = pin
            .deployment_id
            .map(|d| format!(" (deployment {d})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{} pinned at {} by {} at {}{deployment}{}: {}",
            pin.env,
            short(&pin.commit_id),
            pin.pinned_by,
            pin.pinned_at,
            forced_words(pin),
            pin.reason
        ));
        match (&pin.unpinned_by, &pin.unpinned_at) {
            (Some(by), Some(at)) => out.push_str(&format!("; unpinned by {by} at {at}")),
            _ => out.push_str("; still pinned"),
        }
        if let Some(waiting) = &pin.waiting_commit {
            out.push_str(&format!("; held back {}", short(waiting)));
        }
        out.push('\n');
    }
    out
}

/// `history --format json`: each deployment a pin made carries it.
pub(super) fn history_json_pins(items: &mut [Value], pins: &[EnvPin]) {
    for item in items {
        let id = item.get("id").and_then(Value::as_i64);
        if let Some(pin) = pins
            .iter()
            .find(|p| p.deployment_id.is_some() && p.deployment_id == id)
            && let Some(fields) = item.as_object_mut()
        {
            fields.insert("pin".to_owned(), pin_json(pin));
        }
    }
}

/// `history`'s actions: who did what by hand, from which host, newest first.
pub(super) fn action_lines(actions: &[ActionRecord]) -> String {
    let mut out = String::new();
    for a in actions {
        let env = a
            .env
            .as_deref()
            .map(|e| format!(" {e}"))
            .unwrap_or_default();
        let deployment = a
            .deployment_id
            .map(|d| format!(" (deployment {d})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{} {} by {} on {}{env}{deployment}: {}\n",
            a.at,
            a.command,
            a.actor,
            a.host,
            a.detail.as_deref().unwrap_or("-")
        ));
    }
    out
}

/// `history --format json`: each deployment carries the actions that started or released it
/// (`[]` for one the daemon made).
pub(super) fn history_json_actions(items: &mut [Value], actions: &[ActionRecord]) {
    for item in items {
        let id = item.get("id").and_then(Value::as_i64);
        let of_it: Vec<Value> = actions
            .iter()
            .filter(|a| a.deployment_id.is_some() && a.deployment_id == id)
            .map(|a| {
                json!({
                    "command": a.command,
                    "by": a.actor,
                    "host": a.host,
                    "at": a.at,
                    "detail": a.detail,
                })
            })
            .collect();
        if let Some(fields) = item.as_object_mut() {
            fields.insert("actions".to_owned(), Value::Array(of_it));
        }
    }
}
