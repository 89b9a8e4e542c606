//! The layering of the crate: only the command line names the command line, and modules import
//! one another in one direction only.

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

/// The modules at the top of a crate's `src`, each with the files it is made of, test code
/// left out: files declared under `#[cfg(test)]`, and a file's own `#[cfg(test)] mod` at its
/// end.
fn modules(src: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    // A `#[cfg(test)] mod name;` makes `name.rs` or `name/` beside it test code.
    let mut test_only: Vec<PathBuf> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a readable source");
        let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let dir = match f.file_stem().and_then(|s| s.to_str()) {
            Some("mod" | "lib" | "main") => f.parent().map(Path::to_path_buf),
            _ => f.parent().zip(f.file_stem()).map(|(p, s)| p.join(s)),
        }
        .expect("a source has a parent");
        for (at, _) in flat.match_indices("#[cfg(test)] ") {
            let rest = flat[at + 13..].trim_start_matches("pub(crate) ");
            if let Some(name) = rest.strip_prefix("mod ").and_then(|r| r.split(';').next())
                && !name.contains('{')
            {
                test_only.push(dir.join(format!("{name}.rs")));
                test_only.push(dir.join(name));
            }
        }
    }
    let mut modules: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for f in &files {
        if test_only.iter().any(|t| f.starts_with(t)) {
            continue;
        }
        let rel = f.strip_prefix(src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("a file name")
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("a readable source");
        let code = match text.find("#[cfg(test)]\nmod tests {") {
            Some(at) => text[..at].to_owned(),
            None => text,
        };
        modules.entry(top).or_default().push(code);
    }
    modules
}

/// The modules of `modules` that the code of each imports (`crate::name`, or `name` in a
/// `use crate::{…}` group).
fn imports(
    modules: &std::collections::BTreeMap<String, Vec<String>>,
) -> std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> {
    let mut imports = std::collections::BTreeMap::new();
    for (name, texts) in modules {
        let mut found = std::collections::BTreeSet::new();
        for text in texts {
            let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
            for (at, _) in flat.match_indices("crate::") {
                let rest = &flat[at + 7..];
                let words: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find(';').unwrap_or(group.len())]
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .collect(),
                    None => rest
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .take(1)
                        .collect(),
                };
                for word in words {
                    if let Some((m, _)) = modules.get_key_value(word)
                        && m != name
                    {
                        found.insert(m.as_str());
                    }
                }
            }
        }
        imports.insert(name.as_str(), found);
    }
    imports
}

/// The groups of modules that import each other, round and round.
fn cycles<'m>(
    imports: &std::collections::BTreeMap<&'m str, std::collections::BTreeSet<&'m str>>,
) -> Vec<Vec<&'m str>> {
    use daggy::petgraph::graph::DiGraph;
    let mut graph = DiGraph::<&str, ()>::new();
    let nodes: std::collections::BTreeMap<&str, _> =
        imports.keys().map(|m| (*m, graph.add_node(*m))).collect();
    for (from, tos) in imports {
        for to in tos {
            graph.add_edge(nodes[from], nodes[to], ());
        }
    }
    daggy::petgraph::algo::tarjan_scc(&graph)
        .into_iter()
        .filter(|scc| scc.len() > 1)
        .map(|scc| {
            let mut names: Vec<&str> = scc.iter().map(|n| graph[*n]).collect();
            names.sort_unstable();
            names
        })
        .collect()
}

/// Modules import one another in one direction only, in this crate, the core and the
/// drivers: a
/// cycle means two modules that are one in truth, or a type in the wrong place. (Run:
/// `cargo test -p gitplane --lib app::tests`.)
#[test]
fn modules_import_one_another_in_one_direction() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [
        manifest.join("src"),
        manifest.join("../core/src"),
        manifest.join("../drivers/src"),
    ] {
        let modules = modules(&src);
        assert!(modules.len() > 4, "no modules found in {}", src.display());
        let imports = imports(&modules);
        let found = cycles(&imports);
        assert!(
            found.is_empty(),
            "modules of {} import each other: {found:?}",
            src.display()
        );
    }
}

#[test]
fn an_import_cycle_is_found() {
    let modules: std::collections::BTreeMap<String, Vec<String>> = [
        ("a", "use crate::{b, c::X};\nuse crate::c as see;"),
        ("b", "fn f() { crate::a::g() }"),
        ("c", "use crate::d;"),
        ("d", "use std::fs;"),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_owned(), vec![t.to_owned()]))
    .collect();
    let imports = imports(&modules);
    assert_eq!(cycles(&imports), [vec!["a", "b"]]);
}
