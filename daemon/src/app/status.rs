//! An environment's status as the state records it: the commit it is at, its resources, its
//! newest deployments, its pin, preview, lease and newest detect-only drift run.

use std::collections::BTreeMap;

use gitplane_state::{
    DeploymentRecord, DetectRun, EnvPin, LeaseRecord, PreviewRecord, ResourceRecord, Store,
};

use super::{AppError, Context, recorded_envs};

/// One environment's status.
#[derive(Debug)]
pub struct EnvStatus {
    pub env: String,
    /// The commit its recorded state comes from (see [`state_commit`]).
    pub commit: Option<String>,
    /// Its deployments, newest first, detect-only drift runs left out (they changed nothing).
    pub deployments: Vec<DeploymentRecord>,
    /// Its resources, without secrets.
    pub resources: Vec<ResourceRecord>,
    /// The pin in force, if a rollback holds it.
    pub pin: Option<EnvPin>,
    /// Its preview record, when it is (or was) a preview environment.
    pub preview: Option<PreviewRecord>,
    /// The daemon holding its lease, when daemons share a PostgreSQL state.
    pub lease: Option<LeaseRecord>,
    /// Its newest detect-only drift run.
    pub detected: Option<DetectRun>,
}

/// The status of each environment the context asks for (each must be recorded), else of every
/// recorded one and of every preview whose branch head was refused (it has no deployment yet:
/// its record says why).
pub fn status(ctx: &Context, store: &Store) -> Result<Vec<EnvStatus>, AppError> {
    let pins = store.pins(None)?;
    let previews = store.previews()?;
    let mut envs = recorded_envs(ctx, store)?;
    if ctx.envs.is_empty() {
        for p in previews.iter().filter(|p| p.refused_commit.is_some()) {
            if let Err(at) = envs.binary_search(&p.env) {
                envs.insert(at, p.env.clone());
            }
        }
    }
    // Only daemons sharing a PostgreSQL state hold leases: a SQLite state has none.
    let leases: BTreeMap<String, LeaseRecord> = store
        .leases()?
        .into_iter()
        .map(|l| (l.env.clone(), l))
        .collect();
    let mut statuses = Vec::with_capacity(envs.len());
    for env in envs {
        let pin = pins
            .iter()
            .find(|p| p.env == env && p.unpinned_at.is_none())
            .cloned();
        let preview = previews.iter().find(|p| p.env == env).cloned();
        let resources = store.resources_without_secrets(&env)?;
        let detected = store.last_detect_run(&env)?;
        let mut deployments = store.deployments(Some(&env))?;
        let detect_ids: Vec<i64> = store
            .detect_runs(Some(&env))?
            .iter()
            .map(|r| r.deployment)
            .collect();
        deployments.retain(|d| !detect_ids.contains(&d.id));
        statuses.push(EnvStatus {
            commit: state_commit(&deployments),
            lease: leases.get(&env).cloned(),
            env,
            deployments,
            resources,
            pin,
            preview,
            detected,
        });
    }
    Ok(statuses)
}

/// The commit an environment's recorded state comes from: that of its newest succeeded
/// deployment, or, when none succeeded, of the newest one that reached the drivers.
pub fn state_commit(deployments: &[DeploymentRecord]) -> Option<String> {
    let reached_drivers = |d: &&DeploymentRecord| d.counts != Default::default();
    deployments
        .iter()
        .find(|d| d.status == gitplane_state::DeploymentStatus::Succeeded)
        .or_else(|| deployments.iter().find(reached_drivers))
        .and_then(|d| d.commit_id.clone())
}
