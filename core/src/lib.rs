//! The pure core of gitplane: the file formats (`model`: Score workloads, Resource
//! Definitions, environments, the placeholder grammar), the resource graph (`graph`), the plan
//! that compares it with what state recorded (`plan`, `records`), and the review of a commit
//! (`review`).
//!
//! Invariants: everything here is a pure function of a commit's files and the recorded state;
//! nothing reads a file, the network, a database or the clock's effects on state (no rusqlite,
//! tokio, ureq, gix or axum among its dependencies: `.ci/run` checks it with `cargo tree`);
//! errors carry their location; a GUResID never changes meaning.

pub mod graph;
pub mod model;
pub mod plan;
pub mod records;
pub mod repo_template;
pub mod review;

/// The driver type of user-provided resources: outputs as registered, no call, never a
/// deletion. Built in, and never replaceable by a host's driver.
pub const PROVIDED_DRIVER: &str = "gitplane/provided";
