//! The Debian package's example host config (`packaging/gitplane.yaml`, installed as
//! `/etc/gitplane/gitplane.yaml`): it loads, and it names the places the systemd unit gives the
//! service. `.ci/run` checks the built package itself (`scripts/check-deb.sh`).

use std::path::{Path, PathBuf};

use crate::util::Sandbox;

fn example_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/gitplane.yaml")
}

/// `key: value` of a top-level key of the example config (its YAML is flat at that level).
fn top_level(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no top-level `{key}:` in packaging/gitplane.yaml"))
        .trim()
        .to_string()
}

#[test]
fn the_example_host_config_loads_and_validates_a_repository() {
    let sb = Sandbox::template();
    let config = example_config();
    let config = config.to_str().unwrap();

    // Read as shipped, it names the repository it watches, which this machine does not have:
    // the error is about that repository, not about the config.
    let run = sb
        .gitplane_raw(&["validate", "--config", config], &[])
        .fails();
    run.stderr_has("/srv/git/platform.git");
    assert!(!run.stderr.contains("host config"), "{run}");

    // With the repository given, every other setting of the config is in force and the commit
    // validates.
    let repo = sb.origin.to_str().unwrap();
    sb.gitplane_raw(&["validate", "--config", config, "--repo", repo], &[])
        .ok()
        .stdout_has("ok: commit");
}

#[test]
fn the_example_host_config_keeps_to_the_units_directories() {
    let text = std::fs::read_to_string(example_config()).unwrap();
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/gitplane.service"),
    )
    .unwrap();
    let unit_value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in the unit"))
            .to_string()
    };

    // The state in the service's StateDirectory= (/var/lib/gitplane), the one place the
    // sandbox lets it write, owned by the gitplane user the package makes.
    let state = top_level(&text, "state");
    let state_dir = format!("/var/lib/{}/", unit_value("StateDirectory"));
    assert!(
        state.starts_with(&state_dir),
        "state: {state} is not under {state_dir}"
    );

    // The repository under the path the unit opens read-only; the config where ExecStart
    // reads it.
    let repo = top_level(&text, "repo");
    let read_only = unit_value("ReadOnlyPaths");
    let read_only = read_only.trim_start_matches('-');
    assert!(
        repo.starts_with(&format!("{read_only}/")),
        "repo: {repo} is not under {read_only}"
    );
    assert!(
        unit_value("ExecStart").ends_with(" --config /etc/gitplane/gitplane.yaml"),
        "the unit reads another config"
    );
}
