//! Tells the tests what this machine can run: `cfg(systemd_analyze)` when `systemd-analyze`
//! is on PATH, so the unit-file tests are reported as ignored (not passed) where it is not.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(systemd_analyze)");
    println!("cargo::rerun-if-env-changed=PATH");
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("systemd-analyze").is_file())
    });
    if found {
        println!("cargo::rustc-cfg=systemd_analyze");
    }
}
