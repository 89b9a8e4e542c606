//! `gitplane state rm|import|mv|unlock|backup`: state surgery by hand, each under the apply
//! lock of the environments it writes (refused while a deployment runs there), recorded in the
//! action log with its actor. None of them calls a driver.

use std::io::Write;
use std::path::{Path, PathBuf};

use gitplane_state::{Adopted, ApplyLock, MoveTo, Store};
use serde_json::Value;

use super::actor::Actor;
use super::{CliError, CommandResult};
use crate::app::{self, Context, Need, existing_store, find_resource, load_and_build};
use crate::graph::GuresId;

/// What state surgery refuses before it changes anything.
#[derive(Debug, thiserror::Error)]
pub enum SurgeryError {
    #[error(
        "{text}: not a resource label: write app/type.class#res_id (`-` as the app of a shared \
         resource), as `gitplane status` shows them"
    )]
    Label { text: String },
    #[error(
        "state mv {from} {to}: a move keeps the type and class ({from_kind}); only the app and \
         res_id may change"
    )]
    KindChanges {
        from: String,
        to: String,
        from_kind: String,
    },
    #[error("state mv: no resource of app '{app}' is recorded{}", envs_note(.envs))]
    NoApp { app: String, envs: Vec<String> },
    #[error("state mv {from} {to}: FROM and TO are the same")]
    SamePlace { from: String, to: String },
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Outputs { path: PathBuf, message: String },
    #[error(
        "state import: {resource} is not in the graph of {env} at commit {commit}: `gitplane \
         graph --env {env}` lists what it has"
    )]
    NotInGraph {
        resource: String,
        env: String,
        commit: String,
    },
    #[error("{path}: exists already: a backup never overwrites a file")]
    BackupExists { path: PathBuf },
    #[error("state backup {path}: the copy fails PRAGMA integrity_check: {integrity}")]
    BackupDamaged { path: PathBuf, integrity: String },
}

fn envs_note(envs: &[String]) -> String {
    if envs.is_empty() {
        String::new()
    } else {
        format!(" in {}", envs.join(", "))
    }
}

/// A resource label split into its parts: `app/type.class#res_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Label {
    app: Option<String>,
    res_type: String,
    class: String,
    res_id: String,
}

impl Label {
    fn parse(text: &str) -> Result<Label, SurgeryError> {
        let bad = || SurgeryError::Label {
            text: text.to_owned(),
        };
        let (app, rest) = text.split_once('/').ok_or_else(bad)?;
        let (kind, res_id) = rest.split_once('#').ok_or_else(bad)?;
        let (res_type, class) = kind.split_once('.').ok_or_else(bad)?;
        if [app, res_type, class, res_id].iter().any(|p| p.is_empty()) {
            return Err(bad());
        }
        Ok(Label {
            app: (app != "-").then(|| app.to_owned()),
            res_type: res_type.to_owned(),
            class: class.to_owned(),
            res_id: res_id.to_owned(),
        })
    }

    fn text(&self) -> String {
        crate::graph::label(
            self.app.as_deref(),
            &self.res_type,
            &self.class,
            &self.res_id,
        )
    }
}

/// Takes the apply lock of each of `envs`, refusing (naming the holder) when a deployment or
/// another command holds one.
fn lock_all<'a>(
    ctx: &Context,
    envs: impl IntoIterator<Item = &'a String>,
) -> Result<Vec<ApplyLock>, CliError> {
    envs.into_iter()
        .map(|env| ApplyLock::acquire(&ctx.state, env, false).map_err(CliError::from))
        .collect()
}

/// `gitplane state rm RESOURCE`: forgets one resource; its driver is not called.
pub(super) fn rm(
    ctx: &Context,
    resource: &str,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let mut store = existing_store(ctx)?;
    let (guresid, env) = find_resource(&store, ctx, resource)?;
    let _lock = lock_all(ctx, [&env])?;
    let label = label_of(&store, &env, &guresid)?;
    if !store.forget_resource(&guresid)? {
        return Err(app::AppError::NoResource {
            resource: resource.to_owned(),
        }
        .into());
    }
    let detail = format!("forgot {label} ({guresid}); no driver was called");
    actor.record(&store, "state rm", Some(&env), None, &detail)?;
    writeln!(stdout, "{env}: {detail}")?;
    Ok(CommandResult::Success)
}

/// The label of the resource recorded under `guresid` in `env`.
fn label_of(store: &Store, env: &str, guresid: &str) -> Result<String, CliError> {
    Ok(store
        .resources_without_secrets(env)?
        .iter()
        .find(|r| r.guresid == guresid)
        .map(crate::plan::record_label)
        .unwrap_or_else(|| guresid.to_owned()))
}

/// `gitplane state mv FROM TO`: a resource to a new label (app and res_id), or every resource
/// of app FROM to app TO, keeping each one's driver instance.
pub(super) fn mv(
    ctx: &Context,
    (from, to): (&str, &str),
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let mut store = existing_store(ctx)?;
    if from == to {
        return Err(SurgeryError::SamePlace {
            from: from.to_owned(),
            to: to.to_owned(),
        }
        .into());
    }
    let moves = if !from.contains('/') && !to.contains('/') {
        let envs = if ctx.envs.is_empty() {
            store.environments()?
        } else {
            ctx.envs.clone()
        };
        let app_moves = |envs: &[String]| -> Result<Vec<_>, CliError> {
            let mut moves = Vec::new();
            for env in envs {
                for r in store.resources_without_secrets(env)? {
                    if r.app.as_deref() == Some(from) {
                        let old = crate::plan::record_label(&r);
                        let new = Label {
                            app: Some(to.to_owned()),
                            res_type: r.res_type.clone(),
                            class: r.class.clone(),
                            res_id: r.res_id.clone(),
                        };
                        moves.push((env.clone(), r.guresid, old, new));
                    }
                }
            }
            Ok(moves)
        };
        // The environments that have the app, locked, then read again: a deployment that
        // ended in between may have changed what they record.
        let having: std::collections::BTreeSet<String> =
            app_moves(&envs)?.into_iter().map(|m| m.0).collect();
        if having.is_empty() {
            return Err(SurgeryError::NoApp {
                app: from.to_owned(),
                envs: ctx.envs.clone(),
            }
            .into());
        }
        let locks = lock_all(ctx, &having)?;
        let having: Vec<String> = having.into_iter().collect();
        let moves = app_moves(&having)?;
        return apply_moves(&mut store, moves, locks, actor, stdout);
    } else {
        let (guresid, env) = find_resource(&store, ctx, from)?;
        let new = Label::parse(to)?;
        let old = label_of(&store, &env, &guresid)?;
        let old_label = Label::parse(&old)?;
        if (&old_label.res_type, &old_label.class) != (&new.res_type, &new.class) {
            return Err(SurgeryError::KindChanges {
                from: old,
                to: to.to_owned(),
                from_kind: format!("{}.{}", old_label.res_type, old_label.class),
            }
            .into());
        }
        if old_label == new {
            return Err(SurgeryError::SamePlace {
                from: from.to_owned(),
                to: to.to_owned(),
            }
            .into());
        }
        vec![(env, guresid, old, new)]
    };
    let locks = lock_all(ctx, [&moves[0].0])?;
    apply_moves(&mut store, moves, locks, actor, stdout)
}

/// Moves each `(env, old GUResID, old label, new label)`, holding `_locks`.
fn apply_moves(
    store: &mut Store,
    moves: Vec<(String, String, String, Label)>,
    _locks: Vec<ApplyLock>,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    for (env, old_id, old, new) in &moves {
        let new_id = GuresId::new(
            env,
            new.app.as_deref(),
            &new.res_type,
            &new.class,
            &new.res_id,
        );
        let moved = store.move_resource(
            old_id,
            &MoveTo {
                guresid: new_id.as_str(),
                app: new.app.as_deref(),
                res_id: &new.res_id,
            },
        )?;
        if !moved {
            return Err(app::AppError::NoResource {
                resource: old.clone(),
            }
            .into());
        }
        let detail = format!(
            "moved {old} ({old_id}) to {} ({new_id}); no driver was called",
            new.text()
        );
        actor.record(store, "state mv", Some(env), None, &detail)?;
        writeln!(stdout, "{env}: {detail}")?;
    }
    Ok(CommandResult::Success)
}

/// `gitplane state import RESOURCE --outputs FILE [--cookie FILE]`: records a resource that
/// exists outside gitplane as provisioned, so that the next apply updates it.
pub(super) fn import(
    ctx: &Context,
    (resource, rev): (&str, Option<&str>),
    (outputs, cookie): (&Path, Option<&Path>),
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let [env] = ctx.envs.as_slice() else {
        return Err(CliError::OneEnv(format!("state import {resource}")));
    };
    let (values, secrets) = read_outputs(outputs)?;
    let cookie = cookie
        .map(|path| {
            std::fs::read_to_string(path)
                .map(|text| text.strip_suffix('\n').unwrap_or(&text).to_owned())
                .map_err(|source| SurgeryError::Read {
                    path: path.to_owned(),
                    source,
                })
        })
        .transpose()?;
    let mut store = existing_store(ctx)?;
    let (snapshot, built) = load_and_build(ctx, rev, Need::Graphs)?;
    let built = match built {
        Ok(built) => built,
        Err(rejected) => {
            super::report_rejected(&snapshot.commit, &rejected);
            return Ok(CommandResult::Failure);
        }
    };
    let node = built
        .graphs
        .iter()
        .filter(|g| &g.env == env)
        .flat_map(|g| g.nodes())
        .find(|n| n.guresid.as_str() == resource || n.label() == resource)
        .ok_or_else(|| SurgeryError::NotInGraph {
            resource: resource.to_owned(),
            env: env.clone(),
            commit: snapshot.commit.clone(),
        })?;
    let _lock = lock_all(ctx, [env])?;
    let mut record = crate::plan::record_of(node, env, &snapshot.commit);
    record.outputs = values;
    record.secret_outputs = secrets;
    store.import_resource(&Adopted {
        record: &record,
        cookie: cookie.as_deref(),
    })?;
    let detail = format!(
        "imported {} ({}) with the outputs of {}{}; the next apply updates it",
        node.label(),
        node.guresid,
        outputs.display(),
        if cookie.is_some() {
            " and a cookie"
        } else {
            ""
        }
    );
    actor.record(&store, "state import", Some(env), None, &detail)?;
    writeln!(stdout, "{env}: {detail}")?;
    Ok(CommandResult::Success)
}

/// An outputs file: `{"values": {...}, "secrets": {...}}`, as a driver answers them; either
/// may be left out.
fn read_outputs(path: &Path) -> Result<(Value, Value), SurgeryError> {
    let text = std::fs::read_to_string(path).map_err(|source| SurgeryError::Read {
        path: path.to_owned(),
        source,
    })?;
    let bad = |message: String| SurgeryError::Outputs {
        path: path.to_owned(),
        message,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(bad(
            "not a JSON object: write {\"values\": {...}, \"secrets\": {...}}".to_owned(),
        ));
    };
    if let Some(key) = map.keys().find(|k| *k != "values" && *k != "secrets") {
        return Err(bad(format!(
            "unknown key '{key}': only \"values\" and \"secrets\" are read"
        )));
    }
    let mut part = |name: &str| match map.remove(name) {
        None => Ok(Value::Object(Default::default())),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(_) => Err(bad(format!("\"{name}\" is not a JSON object"))),
    };
    Ok((part("values")?, part("secrets")?))
}

/// `gitplane state unlock ENV`: releases a lock whose holder is gone.
pub(super) fn unlock(
    ctx: &Context,
    env: &str,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let store = existing_store(ctx)?;
    let released = gitplane_state::release_gone(&ctx.state, env)?;
    let detail = format!(
        "released the lock of {} (not renewed for {:.0}s, its holder is gone)",
        released.holder, released.silent_for
    );
    actor.record(&store, "state unlock", Some(env), None, &detail)?;
    writeln!(stdout, "{env}: {detail}")?;
    Ok(CommandResult::Success)
}

/// `gitplane state backup FILE`: an online copy of a SQLite state, checked and opened again.
pub(super) fn backup(
    ctx: &Context,
    file: &Path,
    actor: &Actor,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let store = existing_store(ctx)?;
    if file.exists() {
        return Err(SurgeryError::BackupExists {
            path: file.to_owned(),
        }
        .into());
    }
    let report = store.backup_to(file)?;
    if report.integrity != "ok" {
        return Err(SurgeryError::BackupDamaged {
            path: file.to_owned(),
            integrity: report.integrity,
        }
        .into());
    }
    let total: i64 = report.resources.iter().map(|(_, n)| n).sum();
    let detail = format!(
        "backed up to {} ({} pages, integrity_check ok, opens as a state with {total} \
         resource(s) in {} environment(s))",
        file.display(),
        report.pages,
        report.resources.len()
    );
    actor.record(&store, "state backup", None, None, &detail)?;
    writeln!(stdout, "{detail}")?;
    writeln!(
        stdout,
        "Restore: stop gitplane, then put {} in place of the state file (its key stays the \
         same); check it first with gitplane status --state {}",
        file.display(),
        file.display()
    )?;
    Ok(CommandResult::Success)
}
