//! Preview environments: one per matching branch, deployed from its head, removed when the
//! branch goes or its time runs out.
//!
//! The decisions are pure ([`decide`]): from the branches the repository has, the previews the
//! state recorded and how long ago each was pushed, what to deploy and what to remove. The
//! daemon carries them out through the same workers, deployments and deletion path as any
//! environment.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gitplane_state::PreviewRecord;

use crate::config::{MAX_ENV_ID, PreviewConfig};

/// Why a preview environment is removed.
pub const BRANCH_DELETED: &str = "branch deleted";
pub const TTL_EXPIRED: &str = "ttl expired";
/// Why a preview's record is closed without deleting anything: the watched ref declares an
/// environment of that name, and its deployments own the resources from then on.
pub const DECLARED: &str = "the watched ref declares it";

/// What to do with one preview environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreviewAction {
    /// Deploy `commit`, the head of `branch`, to `env` (making it when new).
    Deploy {
        env: String,
        branch: String,
        commit: String,
    },
    /// Delete every resource of `env`: its branch went, or its time ran out (`why`); also
    /// given again for a removal that has not finished.
    Remove { env: String, why: &'static str },
    /// Close `env`'s preview record, deleting nothing: the watched ref declares `env`, and the
    /// watched ref's declaration always wins.
    Close { env: String },
}

/// What [`decide`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    pub actions: Vec<PreviewAction>,
    /// Branches that match but cannot have a preview, with why (logged once per look).
    pub skipped: Vec<String>,
    /// How long until the next live preview's time runs out.
    pub next_expiry: Option<Duration>,
}

/// The environment id of branch `name` (without `refs/heads/`): lowercased, each run of
/// characters other than letters and digits made one `-`. `None` when nothing is left.
pub fn env_of_branch(name: &str) -> Option<String> {
    let mut id = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            id.push(c.to_ascii_lowercase());
        } else if !id.is_empty() && !id.ends_with('-') {
            id.push('-');
        }
    }
    let id = id.trim_end_matches('-');
    let id = &id[..id.len().min(MAX_ENV_ID)];
    let id = id.trim_end_matches('-');
    (!id.is_empty()).then(|| id.to_owned())
}

/// The environment file a preview of type `env_type` is built with: the repository's
/// environment defaults fill in the rest, as for any environment file.
pub fn environment_file(env_type: &str) -> Vec<u8> {
    format!("# a preview environment (previews: in the host config)\ntype: {env_type}\n")
        .into_bytes()
}

/// The path of `env`'s environment file.
pub fn environment_path(env: &str) -> String {
    format!("environments/{env}.yaml")
}

/// What to do with the preview environments, from:
/// - `branches`: every branch of the repository (full ref, commit),
/// - `recorded`: every preview the state recorded,
/// - `age`: how long ago each recorded preview was last pushed (seconds),
/// - `declared`: the environments the watched ref's newest commit declares: never a preview,
///   whatever the state recorded (a preview record of one is closed),
/// - `taken`: environments with resources recorded outside any live preview: a branch whose
///   name gives one of these gets no preview unless that preview is live, so a preview never
///   touches another environment,
/// - `watched`: the watched ref, which never gets a preview.
pub fn decide(
    config: &PreviewConfig,
    branches: &[(String, String)],
    recorded: &[PreviewRecord],
    age: &BTreeMap<String, f64>,
    (declared, taken): (&BTreeSet<String>, &BTreeSet<String>),
    watched: Option<&str>,
) -> Decisions {
    let mut out = Decisions::default();
    let by_env: BTreeMap<&str, &PreviewRecord> =
        recorded.iter().map(|p| (p.env.as_str(), p)).collect();
    // Branch name to env: the first branch (in name order) that gives an env keeps it.
    let mut wanted: BTreeMap<String, (&str, &str)> = BTreeMap::new();
    for (full, commit) in branches {
        let Some(name) = full.strip_prefix("refs/heads/") else {
            continue;
        };
        if Some(full.as_str()) == watched || Some(name) == watched || !config.branches.matches(name)
        {
            continue;
        }
        let Some(env) = env_of_branch(name) else {
            out.skipped
                .push(format!("branch {name}: its name gives no environment id"));
            continue;
        };
        if declared.contains(&env) {
            out.skipped.push(format!(
                "branch {name}: the watched ref declares environment {env}: no preview made"
            ));
            continue;
        }
        let live = by_env.get(env.as_str()).is_some_and(|r| r.live());
        if taken.contains(&env) && !live {
            out.skipped.push(format!(
                "branch {name}: environment {env} exists and is not a preview: no preview made"
            ));
            continue;
        }
        if let Some((other, _)) = wanted.get(&env) {
            out.skipped.push(format!(
                "branch {name}: its environment {env} is already branch {other}'s preview"
            ));
            continue;
        }
        wanted.insert(env, (name, commit.as_str()));
    }
    for (env, (name, commit)) in &wanted {
        let record = by_env.get(env.as_str());
        let pushed_now = record.is_none_or(|r| r.commit_id.as_deref() != Some(*commit));
        let expired = match (config.ttl, record) {
            (Some(ttl), Some(r)) if !pushed_now => {
                let left = ttl.as_secs_f64() - age.get(env).copied().unwrap_or(0.0);
                if left > 0.0 && r.live() {
                    let left = Duration::from_secs_f64(left);
                    out.next_expiry = Some(out.next_expiry.map_or(left, |n| n.min(left)));
                }
                left <= 0.0
            }
            (Some(ttl), _) => {
                out.next_expiry = Some(out.next_expiry.map_or(ttl, |n| n.min(ttl)));
                false
            }
            (None, _) => false,
        };
        match record {
            // Removed (or being removed) and not pushed since: it stays gone.
            Some(r) if !r.live() && !pushed_now => {
                if r.removed_at.is_none() {
                    out.actions.push(PreviewAction::Remove {
                        env: env.clone(),
                        why: removal_why(r),
                    });
                }
            }
            Some(r) if expired && r.live() => out.actions.push(PreviewAction::Remove {
                env: env.clone(),
                why: TTL_EXPIRED,
            }),
            _ => out.actions.push(PreviewAction::Deploy {
                env: env.clone(),
                branch: format!("refs/heads/{name}"),
                commit: (*commit).to_owned(),
            }),
        }
    }
    for record in recorded {
        if declared.contains(&record.env) {
            if record.removed_why.as_deref() != Some(DECLARED) {
                out.actions.push(PreviewAction::Close {
                    env: record.env.clone(),
                });
            }
            continue;
        }
        if wanted.contains_key(&record.env) || record.removed_at.is_some() {
            continue;
        }
        out.actions.push(PreviewAction::Remove {
            env: record.env.clone(),
            why: if record.live() {
                BRANCH_DELETED
            } else {
                removal_why(record)
            },
        });
    }
    out
}

fn removal_why(record: &PreviewRecord) -> &'static str {
    match record.removed_why.as_deref() {
        Some(TTL_EXPIRED) => TTL_EXPIRED,
        _ => BRANCH_DELETED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PreviewTrust;

    fn config(ttl: Option<u64>) -> PreviewConfig {
        PreviewConfig {
            branches: crate::config::BranchPattern::new("pr-*").unwrap(),
            env_type: "development".into(),
            ttl: ttl.map(Duration::from_secs),
            trust: PreviewTrust::Workloads,
        }
    }

    fn record(env: &str, commit: &str) -> PreviewRecord {
        PreviewRecord {
            env: env.into(),
            branch: format!("refs/heads/{env}"),
            env_type: "development".into(),
            commit_id: Some(commit.into()),
            created_at: "t".into(),
            pushed_at: "t".into(),
            removing_at: None,
            removed_at: None,
            removed_why: None,
            platform_commit: None,
            refused_commit: None,
            refused_why: None,
        }
    }

    fn branch(name: &str, commit: &str) -> (String, String) {
        (format!("refs/heads/{name}"), commit.into())
    }

    fn deploy(env: &str, commit: &str) -> PreviewAction {
        PreviewAction::Deploy {
            env: env.into(),
            branch: format!("refs/heads/{env}"),
            commit: commit.into(),
        }
    }

    #[test]
    fn patterns_match_as_globs() {
        let matches = |pattern: &str, name: &str| {
            crate::config::BranchPattern::new(pattern)
                .unwrap()
                .matches(name)
        };
        assert!(matches("pr-*", "pr-7"));
        assert!(matches("pr-*", "pr-"));
        assert!(!matches("pr-*", "main"));
        assert!(matches("*", "feature/x"));
        assert!(matches("feat?re/*-x", "feature/a-b-x"));
        assert!(!matches("pr-?", "pr-12"));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        // Alternatives and classes, which the patterns of the host config's docs use.
        assert!(matches("{pr,feature}-*", "feature-login"));
        assert!(matches("{pr,feature}-*", "pr-12"));
        assert!(!matches("{pr,feature}-*", "fix-12"));
        assert!(matches("pr-[0-9]*", "pr-7"));
        assert!(!matches("pr-[0-9]*", "pr-x"));
        // Many stars against a long name: no exponential backtracking.
        let long = "a".repeat(5000);
        assert!(!matches("*a*a*a*a*a*a*a*a*b", &long));
        assert!(crate::config::BranchPattern::new("pr-{a,b").is_err());
    }

    #[test]
    fn branch_names_become_environment_ids() {
        assert_eq!(env_of_branch("pr-7").as_deref(), Some("pr-7"));
        assert_eq!(
            env_of_branch("Feature/Login_Page").as_deref(),
            Some("feature-login-page")
        );
        assert_eq!(env_of_branch("--x--").as_deref(), Some("x"));
        assert_eq!(env_of_branch("///"), None);
        assert_eq!(env_of_branch(&"x".repeat(100)).map(|e| e.len()), Some(63));
    }

    #[test]
    fn a_new_or_moved_branch_deploys_and_a_known_head_deploys_again_harmlessly() {
        let d = decide(
            &config(None),
            &[
                branch("main", "m"),
                branch("pr-1", "a"),
                branch("pr-2", "b"),
            ],
            &[record("pr-2", "old")],
            &BTreeMap::new(),
            (
                &BTreeSet::new(),
                &BTreeSet::from(["development".to_owned()]),
            ),
            Some("refs/heads/main"),
        );
        assert_eq!(d.actions, vec![deploy("pr-1", "a"), deploy("pr-2", "b")]);
        assert!(d.skipped.is_empty());
    }

    #[test]
    fn a_deleted_branch_or_an_expired_one_is_removed_and_stays_removed() {
        let mut gone = record("pr-3", "c");
        gone.removing_at = Some("t".into());
        gone.removed_at = Some("t".into());
        gone.removed_why = Some(TTL_EXPIRED.into());
        let d = decide(
            &config(Some(60)),
            &[
                branch("pr-1", "a"),
                branch("pr-2", "b"),
                branch("pr-3", "c"),
            ],
            &[
                record("pr-1", "a"),
                record("pr-2", "b"),
                gone,
                record("pr-9", "z"),
            ],
            &BTreeMap::from([("pr-1".to_owned(), 61.0), ("pr-2".to_owned(), 10.0)]),
            (&BTreeSet::new(), &BTreeSet::new()),
            None,
        );
        assert_eq!(
            d.actions,
            vec![
                PreviewAction::Remove {
                    env: "pr-1".into(),
                    why: TTL_EXPIRED
                },
                deploy("pr-2", "b"),
                PreviewAction::Remove {
                    env: "pr-9".into(),
                    why: BRANCH_DELETED
                },
            ]
        );
        assert_eq!(d.next_expiry, Some(Duration::from_secs(50)));
    }

    #[test]
    fn a_removal_that_did_not_finish_is_given_again_and_a_new_push_brings_it_back() {
        let mut removing = record("pr-1", "a");
        removing.removing_at = Some("t".into());
        removing.removed_why = Some(BRANCH_DELETED.into());
        let d = decide(
            &config(None),
            &[],
            std::slice::from_ref(&removing),
            &BTreeMap::new(),
            (&BTreeSet::new(), &BTreeSet::new()),
            None,
        );
        assert_eq!(
            d.actions,
            vec![PreviewAction::Remove {
                env: "pr-1".into(),
                why: BRANCH_DELETED
            }]
        );
        let d = decide(
            &config(None),
            &[branch("pr-1", "new")],
            &[removing],
            &BTreeMap::new(),
            (&BTreeSet::new(), &BTreeSet::new()),
            None,
        );
        assert_eq!(d.actions, vec![deploy("pr-1", "new")]);
    }

    #[test]
    fn a_branch_never_takes_another_environment() {
        let d = decide(
            &PreviewConfig {
                branches: crate::config::BranchPattern::new("*").unwrap(),
                ..config(None)
            },
            &[
                branch("main", "m"),
                branch("production", "p"),
                branch("PR-1", "a"),
                branch("pr-1", "b"),
            ],
            &[],
            &BTreeMap::new(),
            (&BTreeSet::new(), &BTreeSet::from(["production".to_owned()])),
            Some("refs/heads/main"),
        );
        assert_eq!(
            d.actions,
            vec![PreviewAction::Deploy {
                env: "pr-1".into(),
                branch: "refs/heads/PR-1".into(),
                commit: "a".into()
            }]
        );
        assert_eq!(d.skipped.len(), 2, "{:?}", d.skipped);
    }

    /// Finding: a preview `pr-x` expired, the watched ref then declared `pr-x`, and a new push
    /// of branch `pr-x` deployed over the watched ref's environment because a stale preview
    /// record let it past the check. The declaration wins whatever is recorded.
    #[test]
    fn an_environment_the_watched_ref_declares_never_gets_a_preview_and_its_record_closes() {
        let mut expired = record("pr-x", "old");
        expired.removing_at = Some("t".into());
        expired.removed_at = Some("t".into());
        expired.removed_why = Some(TTL_EXPIRED.into());
        let live = record("pr-y", "y1");
        let declared = BTreeSet::from(["pr-x".to_owned(), "pr-y".to_owned()]);
        let d = decide(
            &config(Some(60)),
            &[branch("pr-x", "new"), branch("pr-y", "y2")],
            &[expired.clone(), live.clone()],
            &BTreeMap::new(),
            (&declared, &BTreeSet::new()),
            None,
        );
        assert_eq!(
            d.actions,
            vec![
                PreviewAction::Close { env: "pr-x".into() },
                PreviewAction::Close { env: "pr-y".into() },
            ],
            "nothing deployed, nothing removed"
        );
        assert_eq!(d.skipped.len(), 2, "{:?}", d.skipped);

        // Closed once: a record closed for this reason needs nothing more, and a deleted
        // branch of a declared environment never removes it.
        let mut closed = live;
        closed.removed_why = Some(DECLARED.into());
        closed.removed_at = Some("t".into());
        let d = decide(
            &config(None),
            &[],
            &[closed],
            &BTreeMap::new(),
            (&declared, &BTreeSet::new()),
            None,
        );
        assert_eq!(d.actions, vec![]);

        // Resources recorded outside a live preview keep a stale record's branch out too.
        let d = decide(
            &config(None),
            &[branch("pr-x", "new")],
            &[expired],
            &BTreeMap::new(),
            (&BTreeSet::new(), &BTreeSet::from(["pr-x".to_owned()])),
            None,
        );
        assert_eq!(d.actions, vec![]);
    }
}
