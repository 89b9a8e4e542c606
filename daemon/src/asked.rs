//! The daemon's answers to `gitplane reconcile`: for each request it takes, what it does with
//! the environment named (deploy the current commit, or say why not), recorded in the state
//! for the command to read.
//!
//! [`decide`] is pure; [`answer`] reads what it needs from the state and the repository on
//! the caller's blocking thread and writes the answers.

use std::collections::BTreeSet;
use std::path::Path;

use gitplane_state::{DeploymentStatus, ReconcileAction, ReconcileRequest, StateError, Store};
use tracing::{info, warn};

use crate::deploy;
use crate::repo::ConfigRepo;

/// What the daemon knows when it answers: its own view of the repository and its environments.
pub struct Looked<'a> {
    /// `host:pid`, as the `daemon` table names it.
    pub daemon: &'a str,
    /// The watched ref's commit last dispatched (`None`: the ref could not be read yet).
    pub commit: Option<&'a str>,
    /// A newer commit held back until the secret stores answer.
    pub waiting: Option<&'a str>,
    /// `gitplane daemon --env`: only these; empty: every environment of the commit.
    pub only: &'a [String],
    /// The environments this daemon holds when daemons share the state; `None`: all.
    pub held: Option<&'a BTreeSet<String>>,
}

/// What the state says of one environment, for [`decide`].
#[derive(Debug, Default)]
pub struct EnvFacts {
    /// The commit declares it (or `--env` names it, or it has resources to delete).
    pub known: bool,
    pub preview: bool,
    /// The open pin, in words.
    pub pinned: Option<String>,
    /// The newest deployment (not a detect run): id, status, commit.
    pub latest: Option<(i64, DeploymentStatus, Option<String>)>,
}

/// What to do with a request for an environment.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Another daemon holds it: it answers.
    NotMine,
    /// Answer with this, and do nothing more.
    Answer(ReconcileAction, Option<String>),
    /// Queue a deployment of the commit (unless one of it is running now) and answer
    /// `deploying`.
    Deploy { running: bool },
}

/// What to do for `env`, from what the daemon looked at and what the state says of it.
pub fn decide(env: &str, looked: &Looked<'_>, facts: &EnvFacts) -> Decision {
    let mine = looked.held.is_none_or(|held| held.contains(env));
    if !facts.known && !facts.preview {
        let detail = match looked.commit {
            Some(commit) => format!(
                "no environment '{env}' in commit {} of the watched ref",
                short(commit)
            ),
            None => format!("no environment '{env}' is deployed by this daemon"),
        };
        return Decision::Answer(ReconcileAction::Unknown, Some(detail));
    }
    if !mine {
        return Decision::NotMine;
    }
    if facts.preview {
        return Decision::Answer(
            ReconcileAction::Preview,
            Some("a preview environment: deployed from its branch's head on every push".into()),
        );
    }
    if let Some(commit) = looked.waiting {
        return Decision::Answer(
            ReconcileAction::Waiting,
            Some(format!(
                "the secrets of commit {} cannot be read yet: it deploys when the secret stores \
                 answer",
                short(commit)
            )),
        );
    }
    let Some(commit) = looked.commit else {
        return Decision::Answer(
            ReconcileAction::Waiting,
            Some("the daemon cannot read the watched ref yet (see its log)".into()),
        );
    };
    if let Some(pin) = &facts.pinned {
        return Decision::Answer(ReconcileAction::Pinned, Some(pin.clone()));
    }
    match &facts.latest {
        Some((id, DeploymentStatus::Held, _)) => Decision::Answer(
            ReconcileAction::Held,
            Some(format!(
                "deployment {id} waits for `gitplane approve {id}` (deletion guard)"
            )),
        ),
        Some((_, DeploymentStatus::Succeeded, Some(at))) if at == commit => {
            Decision::Answer(ReconcileAction::UpToDate, None)
        }
        Some((_, DeploymentStatus::Running, Some(at))) if at == commit => {
            Decision::Deploy { running: true }
        }
        _ => Decision::Deploy { running: false },
    }
}

/// What [`answer`] leaves to the main loop.
#[derive(Debug, Default)]
pub struct Answered {
    /// The environments to queue a deployment of `looked.commit` for.
    pub deploy: Vec<String>,
    /// Requests for environments another daemon holds: it answers them, and this daemon does
    /// not take them again (nor fetch for them) at every look.
    pub left: Vec<String>,
}

/// Answers `requests` (on a blocking thread).
pub fn answer(
    store: &Store,
    repo: &Path,
    looked: &Looked<'_>,
    requests: &[ReconcileRequest],
) -> Result<Answered, StateError> {
    let declared = declared(store, repo, looked);
    let mut deploy = Vec::new();
    let mut left = Vec::new();
    for request in requests {
        let Some(env) = &request.env else {
            let detail = looked
                .waiting
                .map(|c| format!("commit {} waits for the secret stores", short(c)));
            store.answer_reconcile(
                &request.id,
                looked.daemon,
                looked.commit,
                ReconcileAction::Looked,
                None,
                detail.as_deref(),
            )?;
            continue;
        };
        let facts = EnvFacts {
            known: declared.contains(env),
            preview: store.preview(env)?.is_some_and(|p| p.removed_at.is_none()),
            pinned: store
                .pins(Some(env))?
                .into_iter()
                .find(|p| p.unpinned_at.is_none())
                .map(|p| {
                    format!(
                        "pinned at {} by {}: {}; `gitplane unpin --env {env}` releases it",
                        short(&p.commit_id),
                        p.pinned_by,
                        p.reason
                    )
                }),
            latest: store
                .latest_deployment(env)?
                .map(|d| (d.id, d.status, d.commit_id)),
        };
        let (action, after, detail) = match decide(env, looked, &facts) {
            Decision::NotMine => {
                left.push(request.id.clone());
                continue;
            }
            Decision::Answer(action, detail) => (action, None, detail),
            Decision::Deploy { running } => {
                if !running {
                    deploy.push(env.clone());
                }
                (
                    ReconcileAction::Deploying,
                    store.newest_finished_deployment(env)?,
                    None,
                )
            }
        };
        let answered = store.answer_reconcile(
            &request.id,
            looked.daemon,
            looked.commit,
            action,
            after,
            detail.as_deref(),
        )?;
        if !answered {
            // Another daemon took it first: it deploys, not this one.
            deploy.retain(|e| e != env);
            continue;
        }
        info!(
            env,
            by = %request.requested_by,
            action = action.as_str(),
            "gitplane reconcile: {}",
            detail.as_deref().unwrap_or(action.as_str())
        );
    }
    Ok(Answered { deploy, left })
}

/// The environments this daemon deploys at `looked.commit`: `--env`'s, else those the commit
/// declares and those with resources left to delete.
fn declared(store: &Store, repo: &Path, looked: &Looked<'_>) -> BTreeSet<String> {
    if !looked.only.is_empty() {
        return looked.only.iter().cloned().collect();
    }
    let Some(commit) = looked.waiting.or(looked.commit) else {
        return BTreeSet::new();
    };
    let layout = ConfigRepo::open(repo).and_then(|repo| repo.layout(commit));
    match layout {
        Ok(layout) => deploy::environments_to_deploy(&layout, Some(store)).unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the environments with resources");
            deploy::environments_in(&layout)
        }),
        Err(e) => {
            warn!(error = %e, commit, "cannot read the commit's environments");
            BTreeSet::new()
        }
    }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looked<'a>(held: Option<&'a BTreeSet<String>>) -> Looked<'a> {
        Looked {
            daemon: "h:1",
            commit: Some("c2"),
            waiting: None,
            only: &[],
            held,
        }
    }

    fn known() -> EnvFacts {
        EnvFacts {
            known: true,
            ..EnvFacts::default()
        }
    }

    #[test]
    fn an_environment_at_the_commit_is_up_to_date_and_one_behind_or_failed_deploys() {
        let mut facts = known();
        facts.latest = Some((3, DeploymentStatus::Succeeded, Some("c2".into())));
        assert_eq!(
            decide("prod", &looked(None), &facts),
            Decision::Answer(ReconcileAction::UpToDate, None)
        );
        facts.latest = Some((3, DeploymentStatus::Succeeded, Some("c1".into())));
        assert_eq!(
            decide("prod", &looked(None), &facts),
            Decision::Deploy { running: false }
        );
        facts.latest = Some((3, DeploymentStatus::Failed, Some("c2".into())));
        assert_eq!(
            decide("prod", &looked(None), &facts),
            Decision::Deploy { running: false }
        );
        // A deployment of the commit in flight is the one to wait for: no second one.
        facts.latest = Some((3, DeploymentStatus::Running, Some("c2".into())));
        assert_eq!(
            decide("prod", &looked(None), &facts),
            Decision::Deploy { running: true }
        );
        assert_eq!(
            decide("prod", &looked(None), &known()),
            Decision::Deploy { running: false }
        );
    }

    #[test]
    fn pins_holds_waiting_secrets_and_unknown_names_are_answered_without_a_deployment() {
        let mut facts = known();
        facts.pinned = Some("pinned at c1".into());
        assert!(matches!(
            decide("prod", &looked(None), &facts),
            Decision::Answer(ReconcileAction::Pinned, _)
        ));
        let mut facts = known();
        facts.latest = Some((9, DeploymentStatus::Held, Some("c2".into())));
        let Decision::Answer(ReconcileAction::Held, Some(detail)) =
            decide("prod", &looked(None), &facts)
        else {
            panic!("a held deployment is answered as held");
        };
        assert!(detail.contains("gitplane approve 9"), "{detail}");
        let mut waiting = looked(None);
        waiting.waiting = Some("c3");
        assert!(matches!(
            decide("prod", &waiting, &known()),
            Decision::Answer(ReconcileAction::Waiting, _)
        ));
        let Decision::Answer(ReconcileAction::Unknown, Some(detail)) =
            decide("prdo", &looked(None), &EnvFacts::default())
        else {
            panic!("an unknown name is answered as unknown");
        };
        assert!(detail.contains("'prdo'"), "{detail}");
    }

    #[test]
    fn a_request_for_an_environment_held_elsewhere_is_left_unanswered_and_reported_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let ids = store
            .request_reconcile(&[Some("prod".into()), Some("staging".into())], "ana")
            .unwrap();
        let held: BTreeSet<String> = ["staging".to_owned()].into();
        let looked = Looked {
            only: &["prod".to_owned(), "staging".to_owned()],
            ..looked(Some(&held))
        };
        let answered = answer(
            &store,
            dir.path(),
            &looked,
            &store.open_reconcile_requests().unwrap(),
        )
        .unwrap();
        assert_eq!(answered.deploy, ["staging"]);
        assert_eq!(answered.left, [ids[0].clone()]);
        let open = store.open_reconcile_requests().unwrap();
        assert_eq!(open.len(), 1, "prod's waits for its holder: {open:?}");
        assert_eq!(open[0].env.as_deref(), Some("prod"));
    }

    #[test]
    fn an_environment_another_daemon_holds_is_left_to_it_but_an_unknown_one_is_answered() {
        let held: BTreeSet<String> = ["staging".to_owned()].into();
        assert_eq!(
            decide("prod", &looked(Some(&held)), &known()),
            Decision::NotMine
        );
        assert_eq!(
            decide("staging", &looked(Some(&held)), &known()),
            Decision::Deploy { running: false }
        );
        assert!(matches!(
            decide("nope", &looked(Some(&held)), &EnvFacts::default()),
            Decision::Answer(ReconcileAction::Unknown, _)
        ));
    }
}
