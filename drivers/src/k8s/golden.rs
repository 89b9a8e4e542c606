//! Golden files of the Kubernetes drivers: the manifests a put returns, kept as YAML streams in
//! `golden/` beside the code, compared on every test run and rewritten with `GITPLANE_BLESS=1`.
//!
//! Each document is headed by a comment naming the manifest and its location, so the files
//! read as what a deployment would apply. The Kubernetes objects in them (locations
//! `namespace` and `cluster`) are also decoded by `kubectl` when it is installed. Only
//! decoded: `kubectl apply --dry-run=client` needs an API server for discovery even with
//! `--validate=false`, and tests have none, so the schema itself is checked by the drivers'
//! own unit tests.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::super::{Manifest, ManifestLocation};

/// Where the golden files live.
fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/k8s/golden")
}

fn location_name(location: ManifestLocation) -> &'static str {
    match location {
        ManifestLocation::Namespace => "namespace",
        ManifestLocation::Cluster => "cluster",
        ManifestLocation::Containers => "containers",
        ManifestLocation::Volumes => "volumes",
    }
}

/// The manifests as a golden file holds them: one YAML document each.
fn render(manifests: &[Manifest]) -> String {
    let mut out = String::new();
    for (i, manifest) in manifests.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let _ = writeln!(
            out,
            "# {} ({})",
            manifest.name,
            location_name(manifest.location)
        );
        let yaml = serde_saphyr::to_string(&manifest.data)
            .unwrap_or_else(|e| panic!("{}: cannot render as YAML: {e}", manifest.name));
        out.push_str(&yaml);
        if !yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Compares `manifests` with `golden/<name>.yaml`; with `GITPLANE_BLESS=1` set, writes them
/// there instead.
pub(super) fn check(name: &str, manifests: &[Manifest]) {
    let path = dir().join(format!("{name}.yaml"));
    let actual = render(manifests);
    if std::env::var_os("GITPLANE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &actual)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\n(run the test with GITPLANE_BLESS=1 to write it)",
            path.display()
        )
    });
    if expected != actual {
        panic!(
            "the manifests differ from {} (- golden, + now); if the change is meant, run the \
             test again with GITPLANE_BLESS=1\n{}",
            path.display(),
            line_diff(&expected, &actual)
        );
    }
}

/// A line diff of two small texts: the longest common subsequence kept as context, lines only
/// in `old` marked '-', lines only in `new` marked '+'.
fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // lcs[i][j]: the length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = String::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        } else {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        }
    }
    out
}

/// The Kubernetes objects of a golden file (the documents in `namespace` or `cluster`).
fn objects_of(text: &str) -> Vec<String> {
    text.split("\n---\n")
        .filter(|doc| {
            let header = doc.lines().next().unwrap_or("");
            header.ends_with("(namespace)") || header.ends_with("(cluster)")
        })
        .map(str::to_owned)
        .collect()
}

/// Runs `command`, killing it after `limit`; its stdout, or why it failed.
fn run_with_limit(mut command: Command, limit: Duration) -> Result<String, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    match gitplane_testkit::poll(limit, || child.try_wait().transpose()) {
        Some(Ok(_)) => {}
        Some(Err(e)) => return Err(format!("cannot wait: {e}")),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {limit:?}; killed"));
        }
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("cannot read its output: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{}: {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn kubectl_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

#[test]
fn golden_objects_decode_with_kubectl() {
    let Some(kubectl) = kubectl_path() else {
        println!("skipped: kubectl is not on PATH");
        return;
    };
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("the golden directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no golden files in {}", dir().display());
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a golden file");
        let objects = objects_of(&text);
        if objects.is_empty() {
            continue;
        }
        let stream = scratch.path().join(file.file_name().expect("a file name"));
        std::fs::write(&stream, objects.join("\n---\n")).expect("a scratch file");
        let listed = kubectl_list(&kubectl, scratch.path(), &stream)
            .unwrap_or_else(|e| panic!("kubectl refused {}: {e}", file.display()));
        assert_eq!(
            listed.lines().count(),
            objects.len(),
            "{}: kubectl read {listed:?}",
            file.display()
        );
        checked += objects.len();
    }
    assert!(checked > 0, "no Kubernetes object in the golden files");
}

/// Decodes the objects of `file` with kubectl, offline, and lists them as `kind/name`.
fn kubectl_list(kubectl: &Path, scratch: &Path, file: &Path) -> Result<String, String> {
    let mut command = Command::new(kubectl);
    command
        // No cluster is reached: `--local` only reads the file; the empty config makes sure.
        .env("KUBECONFIG", scratch.join("no-kubeconfig"))
        .args(["label", "--local", "-f"])
        .arg(file)
        .args(["gitplane.dev/checked=true", "-o", "name"]);
    run_with_limit(command, Duration::from_secs(60))
}

#[test]
fn the_diff_marks_what_changed() {
    let diff = line_diff("a\nb\nc\n", "a\nx\nc\nd\n");
    assert_eq!(diff, "  a\n+ x\n- b\n  c\n+ d\n");
}
