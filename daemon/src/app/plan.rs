//! Plan a ref for review: what a commit would change, against the state, without changing it
//! (`gitplane plan --format text|markdown|json`, the listener's pull-request plan hook).

use std::collections::HashMap;

use super::{AppError, Commit, Context, targets};
use crate::deploy::Reach;
use crate::plan;
use crate::reconcile;
use crate::repo::ConfigRepo;
use crate::review::{self, EnvState, MergeNote, Review};

/// What `rev` would change in each of the context's environments, against the state: the plan
/// of each, the deletion guard's verdict, and the links and bindings that would come and go.
/// Reads the state, writes nothing (not even a state file or a git object). A commit that does
/// not build is a review with its errors in `rejected`.
///
/// A commit that lacks commits of the watched ref (the host config's `ref`, else HEAD) is
/// planned as its merge into it (see [`ConfigRepo::merge_into`]), so the watched ref's newer
/// commits never show as reverted; files both changed are named in `rejected` rather than
/// guessed.
pub fn plan_ref(ctx: &Context, rev: Option<&str>) -> Result<Review, AppError> {
    let store = if ctx.state_exists() {
        Some(ctx.open_store()?)
    } else {
        None
    };
    let repo = ConfigRepo::open(&ctx.repo)?;
    if let Some(store) = &store {
        ctx.check_repository(&repo, store, false)?;
    }
    let head = repo.resolve(rev)?;
    // A ref that is not the watched one is planned as it would merge into it; a watched ref
    // that does not resolve (an empty repository's HEAD) leaves the commit as it is.
    let watched = match rev {
        Some(_) => repo.resolve(ctx.default_rev.as_deref()).ok(),
        None => None,
    };
    let (repo, merge) = match &watched {
        Some(watched) if *watched != head => repo.merge_into(watched, &head)?,
        _ => (repo, None),
    };
    let into = ctx.default_rev.clone().unwrap_or_else(|| {
        repo.head_ref()
            .map(|r| r.trim_start_matches("refs/heads/").to_owned())
            .unwrap_or_else(|| "HEAD".to_owned())
    });
    let planned = merge.as_ref().map_or(head.clone(), |m| m.commit.clone());
    let commit = Commit::at(ctx, repo, &planned, store.as_ref())?;
    let mut review = Review {
        commit: head,
        reference: rev.map(str::to_owned),
        environments: Vec::new(),
        rejected: Vec::new(),
        merge: None,
    };
    if let (Some(m), Some(watched)) = (merge, watched) {
        review.rejected = m
            .conflicts
            .iter()
            .map(|path| {
                format!(
                    "{path}: changed both by the branch and by {into} since {}: merge {into} \
                     into the branch (or rebase it) to plan it",
                    &m.base[..m.base.len().min(12)]
                )
            })
            .collect();
        review.merge = Some(MergeNote {
            into,
            into_commit: watched,
            base: m.base,
            behind: m.behind,
            conflicts: m.conflicts,
        });
        if !review.rejected.is_empty() {
            return Ok(review);
        }
    }
    let targets = match targets(ctx, &commit, store.as_ref(), Reach::Changes)? {
        Ok(targets) => targets,
        Err(rejected) => {
            review.rejected = rejected.errors;
            return Ok(review);
        }
    };
    let no_bindings = HashMap::new();
    for t in &targets {
        let graph = &t.graph;
        let Some(store) = &store else {
            let p = plan::plan(graph, &[], &[]);
            review.environments.push(review::compare(&EnvState {
                graph,
                plan: &p,
                recorded: &[],
                links: &[],
                bindings: &no_bindings,
                held: None,
            }));
            continue;
        };
        let (recorded, links) = crate::deploy::recorded_in_scope(store, t)?;
        let p = plan::plan(graph, &recorded, &links);
        let held = reconcile::guard_verdict(store, t, &p, recorded.len())?;
        let to_read = review::bindings_to_read(&p, graph, &recorded);
        let mut bindings = HashMap::new();
        if !to_read.is_empty() {
            let bound = store.bound(&graph.env)?;
            for id in to_read {
                if bound.contains(id.as_str()) {
                    bindings.insert(id.to_string(), store.current_bindings(id.as_str())?);
                }
            }
        }
        review.environments.push(review::compare(&EnvState {
            graph,
            plan: &p,
            recorded: &recorded,
            links: &links,
            bindings: &bindings,
            held,
        }));
    }
    Ok(review)
}
