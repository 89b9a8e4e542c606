//! End-to-end tests: the real `gitplane` binary against real git repositories and a real state
//! file. Each test gets its own temporary folder (see `util`).

mod driver_server;
mod util;
mod vault_server;

mod bad_input;
mod bad_input_corpus;
mod changes;
mod chaos;
mod choosing;
mod compat_files;
mod daemon;
mod daemon_core;
mod drift;
mod explain;
mod failover;
mod guard;
mod guard_verdict;
mod history;
mod hook;
mod host_config;
mod hpo_templates;
mod lifecycle;
mod links;
mod listener;
mod lock;
mod manifests;
mod notifications;
mod postgres;
mod previews;
mod reconcile;
mod reports;
mod review;
mod score_mounts;
mod score_services;
mod secret_outputs;
mod secret_stores;
mod secrets;
mod service;
mod soak;
mod status_page;
mod stop;
mod systemd;
mod terraform;
mod trust_state;
mod workflow;
