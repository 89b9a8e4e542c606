//! Plan a ref for review: what a commit would change, against the state, without changing it
//! (`gitplane plan --format text|markdown|json`, the listener's pull-request plan hook).

use std::collections::HashMap;

use super::{AppError, Commit, Context, targets};
use crate::deploy::Reach;
use crate::plan;
use crate::reconcile;
use crate::review::{self, EnvState, Review};

/// What `rev` would change in each of the context's environments, against the state: the plan
/// of each, the deletion guard's verdict, and the links and bindings that would come and go.
/// Reads the state, writes nothing (not even a state file). A commit that does not build is a
/// review with its errors in `rejected`.
pub fn plan_ref(ctx: &Context, rev: Option<&str>) -> Result<Review, AppError> {
    let store = if ctx.state_exists() {
        Some(ctx.open_store()?)
    } else {
        None
    };
    let commit = Commit::resolve(ctx, rev, store.as_ref())?;
    let mut review = Review {
        commit: commit.id().to_owned(),
        reference: rev.map(str::to_owned),
        environments: Vec::new(),
        rejected: Vec::new(),
    };
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
