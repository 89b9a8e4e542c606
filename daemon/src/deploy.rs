//! One commit, from its files to its graphs: load, build every selected environment, check
//! that every driver and secret store it uses is configured, and (to plan or apply) read its
//! stored secrets. The commit is accepted or rejected as a whole.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::drivers::Registry;
use crate::graph::{self, ResourceGraph};
use crate::model::placeholder::StoreRef;
use crate::model::{self, LoadCache, Repository, SourceLocation};
use crate::repo::Snapshot;
use crate::stores::{SecretStores, StoreError};

/// What the host provides a commit: its drivers and its secret stores.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    pub drivers: &'a Registry,
    pub stores: &'a SecretStores,
}

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
pub fn build(snapshot: &Snapshot, envs: &[String], host: Host<'_>) -> Result<Built, Rejected> {
    build_cached(snapshot, envs, host, &mut LoadCache::default())
}

/// [`build`], parsing only the files that changed since the last commit `cache` saw.
pub fn build_cached(
    snapshot: &Snapshot,
    envs: &[String],
    host: Host<'_>,
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
                errors.extend(unknown_drivers(&repo, &g, host.drivers));
                errors.extend(unusable_stored_secrets(&g, host.stores));
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

impl Built {
    /// Reads every secret the graphs take from a secret store, each once, and puts the values
    /// where they are read. Planning and applying need them; validating does not. A secret that
    /// cannot be read rejects the commit.
    pub fn read_stored_secrets(&mut self, stores: &SecretStores) -> Result<(), Rejected> {
        let mut wanted: BTreeMap<&StoreRef, &SourceLocation> = BTreeMap::new();
        for g in &self.graphs {
            for (secret, location) in g.stored_secrets() {
                wanted.entry(secret).or_insert(location);
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let refs: Vec<(&str, &str, Option<&str>)> = wanted
            .keys()
            .map(|s| (s.store.as_str(), s.reference.as_str(), s.version.as_deref()))
            .collect();
        let read = stores.read_all(&refs);
        let mut values: HashMap<StoreRef, serde_json::Value> = HashMap::new();
        let mut errors = Vec::new();
        for ((secret, location), result) in wanted.into_iter().zip(read) {
            match result {
                Ok(v) => {
                    values.insert(secret.clone(), v);
                }
                Err(e) => errors.push(format!("{location}: secret_refs: {e}")),
            }
        }
        if !errors.is_empty() {
            errors.sort();
            return Err(Rejected {
                envs: self.graphs.iter().map(|g| g.env.clone()).collect(),
                errors,
            });
        }
        for g in &mut self.graphs {
            g.fill_stored_secrets(&values);
        }
        Ok(())
    }
}

/// A definition that names a secret store the host does not configure, or a ref or version
/// its store cannot serve, cannot be applied; this much is known without reading a secret.
fn unusable_stored_secrets(graph: &ResourceGraph, stores: &SecretStores) -> Vec<String> {
    graph
        .stored_secrets()
        .into_iter()
        .filter_map(|(secret, location)| {
            let error = stores
                .check(&secret.store, &secret.reference, secret.version.as_deref())
                .err()?;
            Some(match error {
                StoreError::UnknownStore { .. } => {
                    format!("{location}: secret_refs: {error}: add it under secret_stores")
                }
                _ => format!("{location}: secret_refs: {error}"),
            })
        })
        .collect()
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
