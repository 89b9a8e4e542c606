//! The layering of the crate: only the command line names the command line.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the crate's sources are readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Whether `text` reaches into the CLI module: `crate::cli`, `super::cli`, or `cli` in a
/// `use crate::{…}` group.
fn names_the_cli(text: &str) -> bool {
    let flat: String = text.split_whitespace().collect();
    if flat.contains("crate::cli") || flat.contains("super::cli") {
        return true;
    }
    flat.match_indices("crate::{").any(|(at, _)| {
        let group = &flat[at..];
        let group = &group[..group.find(';').unwrap_or(group.len())];
        group
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == "cli")
    })
}

/// The daemon, its listener and every other module call the application layer, never the
/// command line: only `cli/` (and the binary's `main.rs`) may name it.
#[test]
fn only_the_command_line_names_the_cli() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("daemon.rs")),
        "the sources were not found in {}",
        src.display()
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("cli")) && !f.ends_with("src/main.rs"))
        // This file names it on purpose, to test the check.
        .filter(|f| !f.ends_with("app/tests.rs"))
        .filter(|f| names_the_cli(&std::fs::read_to_string(f).expect("a readable source")))
        .map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "these modules name the CLI; call crate::app instead: {offenders:?}"
    );
}

#[test]
fn a_cli_import_is_found_however_it_is_written() {
    assert!(names_the_cli("let x = crate::cli::RECLAIM_PAGES;"));
    assert!(names_the_cli(
        "use crate::{\n    cli::Context,\n    deploy,\n};"
    ));
    assert!(names_the_cli("use super::cli;"));
    assert!(!names_the_cli(
        "use crate::{client, deploy};\nuse crate::app::Context;"
    ));
}
