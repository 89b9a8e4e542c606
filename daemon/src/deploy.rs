//! One commit, from its files to its graphs: load, build every selected environment, and check
//! that every driver it uses is registered. The commit is accepted or rejected as a whole.

use std::collections::BTreeSet;

use crate::drivers::Registry;
use crate::graph::{self, ResourceGraph};
use crate::model::{self, LoadCache, Repository};
use crate::repo::Snapshot;

/// A commit that did not load or build: every error, and the environments it was meant for.
#[derive(Debug, Clone)]
pub struct Rejected {
    pub envs: Vec<String>,
    pub errors: Vec<String>,
}

/// A commit's graphs, one per selected environment.
#[derive(Debug, Clone)]
pub struct Built {
    pub graphs: Vec<ResourceGraph>,
}

/// The environments a commit declares: the names of its `environments/*.yaml` files, which
/// are known even when the files do not parse.
pub fn environments_of(snapshot: &Snapshot) -> BTreeSet<String> {
    snapshot
        .files
        .keys()
        .filter_map(|p| p.strip_prefix("environments/"))
        .filter(|name| !name.contains('/'))
        .filter_map(|name| {
            name.strip_suffix(".yaml")
                .or_else(|| name.strip_suffix(".yml"))
        })
        .map(str::to_owned)
        .collect()
}

/// Loads the model and builds every environment of `envs`.
pub fn build(snapshot: &Snapshot, envs: &[String], drivers: &Registry) -> Result<Built, Rejected> {
    build_cached(snapshot, envs, drivers, &mut LoadCache::default())
}

/// [`build`], parsing only the files that changed since the last commit `cache` saw.
pub fn build_cached(
    snapshot: &Snapshot,
    envs: &[String],
    drivers: &Registry,
    cache: &mut LoadCache,
) -> Result<Built, Rejected> {
    let reject = |errors: Vec<String>| Rejected {
        envs: envs.to_vec(),
        errors,
    };
    let repo: Repository = model::load_cached(&snapshot.files, cache)
        .map_err(|errors| reject(errors.iter().map(ToString::to_string).collect()))?;
    let mut graphs = Vec::new();
    let mut errors = Vec::new();
    for env in &repo.environments {
        if !envs.contains(&env.id) {
            continue;
        }
        match graph::build(&repo, env) {
            Ok(g) => {
                errors.extend(unknown_drivers(&repo, &g, drivers));
                graphs.push(g);
            }
            Err(errs) => errors.extend(errs.iter().map(|e| format!("environment {}: {e}", env.id))),
        }
    }
    if errors.is_empty() {
        Ok(Built { graphs })
    } else {
        errors.dedup();
        Err(reject(errors))
    }
}

/// A definition whose `driver_type` has no driver cannot be applied.
fn unknown_drivers(repo: &Repository, graph: &ResourceGraph, drivers: &Registry) -> Vec<String> {
    let used: BTreeSet<(&str, &str)> = graph
        .nodes()
        .filter(|n| drivers.get(&n.driver_type).is_none())
        .map(|n| (n.definition.as_str(), n.driver_type.as_str()))
        .collect();
    used.into_iter()
        .map(|(def, driver)| {
            let location = repo
                .definitions
                .iter()
                .find(|d| d.id == def)
                .map(|d| d.locate("driver_type").to_string())
                .unwrap_or_default();
            format!(
                "{location}: definition '{def}' uses driver_type '{driver}', which is not \
                 registered (registered: {})",
                drivers.names().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}
