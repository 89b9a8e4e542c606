//! Load + build + plan of a generated repository, at 1 000 and 10 000 apps.
//!
//! `cargo bench --bench graph` runs each size in its own process, so the peak memory it reports
//! (VmHWM, Linux) belongs to that size alone. `cargo bench --bench graph -- 2500` runs one size.
//! Each app has one workload with a private postgres that reads the base-env, a private redis and
//! an app-shared dns: five resources per app with the implicit base-env.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

const RUNS: usize = 3;

mod shape;

fn repository(apps: usize) -> BTreeMap<String, Vec<u8>> {
    shape::repository(apps)
        .into_iter()
        .map(|(path, text)| (path, text.into_bytes()))
        .collect()
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn run(apps: usize) {
    let files = repository(apps);
    let mut load = Vec::new();
    let mut build = Vec::new();
    let mut plan = Vec::new();
    let mut resources = 0;
    let mut edges = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let repo = gitplane::model::load(&files).expect("the generated repository loads");
        load.push(t.elapsed());
        let t = Instant::now();
        let graph = gitplane::graph::build(&repo, &repo.environments[0]).expect("and builds");
        build.push(t.elapsed());
        let t = Instant::now();
        let p = gitplane::plan::plan(&graph, &[], &[]);
        plan.push(t.elapsed());
        resources = graph.len();
        edges = graph.edges().len();
        assert_eq!(p.steps.len(), resources);
    }
    let best = |d: &[Duration]| d.iter().min().copied().unwrap_or_default();
    let total = best(&load) + best(&build) + best(&plan);
    println!(
        "{apps:>6} apps  {resources:>6} resources  {edges:>6} edges  load {:>7.1} ms  build {:>7.1} ms  \
         plan {:>7.1} ms  total {:>7.1} ms  peak RSS {:>6} MiB  (best of {RUNS})",
        best(&load).as_secs_f64() * 1e3,
        best(&build).as_secs_f64() * 1e3,
        best(&plan).as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
        peak_rss_kib().map(|k| k / 1024).unwrap_or(0),
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if let [size] = sizes.as_slice() {
        run(*size);
        return;
    }
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000]
    } else {
        sizes
    };
    let exe = std::env::current_exe().expect("the bench binary knows its path");
    for size in sizes {
        let status = Command::new(&exe)
            .arg(size.to_string())
            .status()
            .expect("the bench re-runs itself for one size");
        assert!(status.success(), "size {size} failed");
    }
}
