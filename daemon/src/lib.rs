//! gitplane: a git-native platform orchestrator.
//!
//! The pipeline, one module each: [`repo`] reads a commit, [`model`] loads its files, [`graph`]
//! builds each environment's resource graph, [`plan`] compares it with the recorded state,
//! [`reconcile`] runs the plan through [`drivers`] and records it with `gitplane-state`; [`app`]
//! is what the command line ([`cli`]), the [`daemon`] and its HTTP listener ([`serve`]) ask of
//! them. See ARCHITECTURE.md.

// The pure core, re-exported where the rest of gitplane has always found it.
pub use gitplane_core::{graph, model, plan, repo_template, review};
/// The drivers, a crate of their own.
pub use gitplane_drivers as drivers;

pub mod app;
pub mod asked;
pub mod calls;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod deploy;
pub mod drift;
pub mod events;
pub mod manifests;
pub mod metrics;
pub mod notifications;
pub mod preflight;
pub mod previews;
pub mod reconcile;
pub mod repo;
pub mod requests;
pub mod serve;
pub mod shard;
pub mod stores;
pub mod trust;
pub mod watch;
