//! gitplane: a git-native platform orchestrator.
//!
//! The pipeline, one module each: [`repo`] reads a commit, [`model`] loads its files, [`graph`]
//! builds each environment's resource graph, [`plan`] compares it with the recorded state,
//! [`reconcile`] runs the plan through [`drivers`] and records it with `gitplane-state`; [`app`]
//! is what the command line ([`cli`]), the [`daemon`] and its HTTP listener ([`serve`]) ask of
//! them. See ARCHITECTURE.md.

pub mod app;
pub mod calls;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod deploy;
pub mod drift;
pub mod drivers;
pub mod events;
pub mod graph;
pub mod manifests;
pub mod model;
pub mod notifications;
pub mod plan;
pub mod previews;
pub mod reconcile;
pub mod repo;
pub mod repo_template;
pub mod requests;
pub mod review;
pub mod serve;
pub mod shard;
pub mod stores;
pub mod trust;
pub mod watch;
