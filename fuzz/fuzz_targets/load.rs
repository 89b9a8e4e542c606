//! The loaders: `model::load` (every YAML file kind of a config repository: gitplane.yaml, an
//! environment, a Score workload, a multi-document definitions file) and `HostConfig::parse`.
//!
//! The input is split at NUL bytes; the parts become, in order, a definitions file, a workload,
//! an environment, gitplane.yaml and a host config. So one input can reach what spans files
//! (limits set in gitplane.yaml, definitions matched against environments). Besides not
//! panicking, every error must name a file, and a line within it when it gives one.

#![no_main]

use std::collections::BTreeMap;

use gitplane::config::HostConfig;
use libfuzzer_sys::fuzz_target;

const PATHS: [&str; 4] = [
    "definitions/fuzz.yaml",
    "workloads/app/fuzz.yaml",
    "environments/fuzz.yaml",
    "gitplane.yaml",
];

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0);
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for path in PATHS {
        match parts.next() {
            Some(part) if !part.is_empty() => {
                files.insert(path.to_owned(), part.to_vec());
            }
            _ => {}
        }
    }
    if let Err(errors) = gitplane::model::load(&files) {
        for e in errors {
            let lines = files
                .get(&e.location.file)
                .map(|bytes| bytes.split(|b| *b == b'\n').count());
            if let (Some(line), Some(lines)) = (e.location.line, lines) {
                assert!(
                    line >= 1 && line <= lines,
                    "{e}: the file has {lines} lines"
                );
            }
        }
    }
    if let Some(host) = parts.next()
        && let Ok(text) = std::str::from_utf8(host)
    {
        let _ = HostConfig::parse("host.yaml", text);
    }
});
