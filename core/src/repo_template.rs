//! The starter config repository (`repo-template/`), embedded in the binary: what `init` and
//! `quickstart` write, and what the graph tests build.

/// The files of `repo-template/`, embedded so the binary can make a repository anywhere.
/// A unit test keeps this list equal to the folder.
pub const TEMPLATE: &[(&str, &str)] = &[
    (".gitignore", include_str!("../../repo-template/.gitignore")),
    (
        "environments/development.yaml",
        include_str!("../../repo-template/environments/development.yaml"),
    ),
    (
        "environments/production.yaml",
        include_str!("../../repo-template/environments/production.yaml"),
    ),
    (
        "workloads/shop/backend.yaml",
        include_str!("../../repo-template/workloads/shop/backend.yaml"),
    ),
    (
        "workloads/shop/frontend.yaml",
        include_str!("../../repo-template/workloads/shop/frontend.yaml"),
    ),
    (
        "definitions/base-env.yaml",
        include_str!("../../repo-template/definitions/base-env.yaml"),
    ),
    (
        "definitions/postgres.yaml",
        include_str!("../../repo-template/definitions/postgres.yaml"),
    ),
    (
        "definitions/redis.yaml",
        include_str!("../../repo-template/definitions/redis.yaml"),
    ),
    (
        "definitions/dns.yaml",
        include_str!("../../repo-template/definitions/dns.yaml"),
    ),
    (
        "definitions/workload.yaml",
        include_str!("../../repo-template/definitions/workload.yaml"),
    ),
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn template_list_matches_the_folder() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../repo-template");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let rel = path
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    on_disk.push(rel);
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = TEMPLATE.iter().map(|(p, _)| p.to_string()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "add new repo-template files to TEMPLATE");
    }
}
