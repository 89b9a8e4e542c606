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

fn main() {
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
