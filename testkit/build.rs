//! Tells the tests whether this machine has PostgreSQL (`cfg(postgres)`: initdb, pg_ctl,
//! pg_isready and psql on PATH or in /usr/lib/postgresql/*/bin; as root, a `postgres` user), so
//! a test that needs it is reported as ignored, with the reason, where it is missing.

#[path = "src/tools.rs"]
#[allow(dead_code)]
mod tools;

fn main() {
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(postgres)");
    if tools::Tools::find().is_ok() {
        println!("cargo::rustc-cfg=postgres");
    }
}
