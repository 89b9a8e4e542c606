//! Tells the tests what this machine can run, one `cfg` per tool found, so that a test whose
//! tool is missing is reported as ignored (with the reason), never as passed:
//!
//! - `systemd_analyze`: `systemd-analyze` on PATH (the unit-file tests);
//! - `postgres`: a PostgreSQL installation the test kit can start servers of (initdb, pg_ctl,
//!   pg_isready and psql on PATH or in /usr/lib/postgresql/*/bin; as root, a `postgres` user);
//! - `chromium`: Debian's Chromium and `chromedriver` (the status page's browser tests);
//! - `promtool`: Prometheus's `promtool` (the metrics and alert-rule checks);
//! - `terraform`: `terraform` or `tofu` on PATH (the terraform driver's tests).
//!
//! Looked at when the package is built, and again when PATH changes: after installing a tool
//! on the same PATH, `touch daemon/build.rs` (CI installs its tools before building).
//!
//! It also names the commit the binary is built from, for `gitplane --version`:
//! `GITPLANE_COMMIT` and `GITPLANE_COMMIT_DATE` (`unknown` outside a git checkout, as from a
//! source tarball), looked at again when the checkout's HEAD moves.

#[path = "../testkit/src/tools.rs"]
#[allow(dead_code)]
mod tools;

use std::path::Path;
use std::process::{Command, Stdio};

/// Whether `program --version` runs and succeeds.
fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What `git` prints for `args` in the package's folder, trimmed; `None` when it fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// `GITPLANE_COMMIT` (12 hex digits) and `GITPLANE_COMMIT_DATE` (the commit's date: a build
/// of one commit says the same whenever it is built). Edits not committed are not told.
fn commit() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let date = git(&["log", "-1", "--format=%cs"]);
    println!(
        "cargo::rustc-env=GITPLANE_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!(
        "cargo::rustc-env=GITPLANE_COMMIT_DATE={}",
        date.as_deref().unwrap_or("unknown")
    );
    // A new commit moves HEAD, or the branch HEAD names.
    if let Some(head) = git(&["rev-parse", "--path-format=absolute", "--git-path", "HEAD"]) {
        println!("cargo::rerun-if-changed={head}");
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &branch])
    {
        println!("cargo::rerun-if-changed={path}");
    }
}

fn main() {
    commit();
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../testkit/src/tools.rs");
    let on_path = |program: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
    };
    let found = [
        ("systemd_analyze", on_path("systemd-analyze")),
        ("postgres", tools::Tools::find().is_ok()),
        (
            "chromium",
            Path::new("/usr/bin/chromium").exists() && runs("chromedriver"),
        ),
        ("promtool", on_path("promtool")),
        ("terraform", on_path("terraform") || on_path("tofu")),
    ];
    for (cfg, present) in found {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if present {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
