//! The systemd unit (`systemd/gitplane.service`): the settings the daemon's contract with systemd
//! relies on, its hardening, and what `systemd-analyze` says of it when it is installed here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Where the unit says the binary is installed: where the Debian package puts it
/// (`[package.metadata.deb]` in daemon/Cargo.toml; `.ci/run` checks the built package).
const INSTALLED_BINARY: &str = "/usr/bin/gitplane";

/// The highest `systemd-analyze security` exposure the unit may have (measured: 1.2 with
/// systemd 252). Raising it needs a reason in systemd/README.md.
const MAX_EXPOSURE: f64 = 1.5;

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/gitplane.service")
}

fn unit_text() -> String {
    std::fs::read_to_string(unit_path()).expect("systemd/gitplane.service")
}

/// One `Key=value` line of a unit file, with its section.
#[derive(Debug)]
struct Setting {
    section: String,
    key: String,
    value: String,
}

/// The settings of a unit file in order: comments and blank lines dropped, continued lines
/// (ending in `\`) joined.
fn parse(text: &str) -> Vec<Setting> {
    let mut settings = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(rest) = line.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let line = std::mem::take(&mut pending);
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a Key=value line in the unit: {line:?}"));
        settings.push(Setting {
            section: section.clone(),
            key: key.trim().to_string(),
            value: value.trim().to_string(),
        });
    }
    assert!(pending.is_empty(), "the unit ends in a continued line");
    settings
}

/// A parsed unit, queried the way systemd reads it.
struct Unit(Vec<Setting>);

impl Unit {
    fn load() -> Unit {
        Unit(parse(&unit_text()))
    }

    /// Every value of `key` in `section`, in order.
    fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|s| s.section == section && s.key == key)
            .map(|s| s.value.as_str())
            .collect()
    }

    /// The value of a single-valued `[Service]` setting: the last assignment wins.
    fn service(&self, key: &str) -> &str {
        self.all("Service", key)
            .last()
            .copied()
            .unwrap_or_else(|| panic!("the unit has no {key}= in [Service]"))
    }

    fn service_opt(&self, key: &str) -> Option<&str> {
        self.all("Service", key).last().copied()
    }

    /// The items of a list setting, following systemd's rules: an empty assignment resets the
    /// list. `~` (deny lists) is kept on the first item of its line.
    fn service_list(&self, key: &str) -> Vec<String> {
        let mut items = Vec::new();
        for value in self.all("Service", key) {
            if value.is_empty() {
                items.clear();
            }
            items.extend(value.split_whitespace().map(str::to_string));
        }
        items
    }
}

/// A systemd time span: `90`, `90s`, `1min 30s`, `1m30s`, `500ms`, `2h`.
fn timespan(text: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    assert!(!rest.is_empty(), "an empty time span");
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("not a time span: {text:?}"));
        rest = rest[digits..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "us" | "usec" => 1e-6,
            "ms" | "msec" => 1e-3,
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            other => panic!("unknown time unit {other:?} in {text:?}"),
        };
        total += Duration::from_secs_f64(number * seconds);
        rest = rest[unit_len..].trim_start();
    }
    total
}

#[test]
fn timespans_parse_like_systemd() {
    assert_eq!(timespan("90"), Duration::from_secs(90));
    assert_eq!(timespan("90s"), Duration::from_secs(90));
    assert_eq!(timespan("1min 30s"), Duration::from_secs(90));
    assert_eq!(timespan("1m30s"), Duration::from_secs(90));
    assert_eq!(timespan("500ms"), Duration::from_millis(500));
    assert_eq!(timespan("2h"), Duration::from_secs(7200));
}

#[test]
fn unit_keeps_the_daemon_contract() {
    let unit = Unit::load();

    // sd_notify: READY, STATUS and WATCHDOG from the daemon itself.
    assert_eq!(unit.service("Type"), "notify");
    assert_eq!(unit.service("NotifyAccess"), "main");
    let watchdog = timespan(unit.service("WatchdogSec"));
    assert_eq!(watchdog, Duration::from_secs(60));

    assert_eq!(
        unit.service("ExecStart"),
        format!("{INSTALLED_BINARY} daemon --config /etc/gitplane/gitplane.yaml")
    );
    let reload = unit.service("ExecReload");
    assert!(
        reload.contains("-HUP") && reload.contains("$MAINPID"),
        "reload must send SIGHUP to the daemon: {reload}"
    );
    assert_eq!(unit.service("Restart"), "on-failure");
    assert_eq!(timespan(unit.service("RestartSec")), Duration::from_secs(5));

    // SIGTERM drains in-flight driver calls for up to 60 s: systemd must wait longer than that
    // before SIGKILL, and must not signal the exec drivers the daemon is still waiting for.
    assert_eq!(unit.service("KillSignal"), "SIGTERM");
    assert_eq!(unit.service("KillMode"), "mixed");
    let stop = timespan(unit.service("TimeoutStopSec"));
    assert!(
        stop > Duration::from_secs(60),
        "TimeoutStopSec={stop:?} must exceed the 60 s drain deadline"
    );

    // A static user, and the directories the daemon relies on.
    assert_eq!(unit.service("User"), "gitplane");
    assert_eq!(unit.service("Group"), "gitplane");
    assert!(
        unit.service_opt("DynamicUser")
            .is_none_or(|v| matches!(v, "no" | "false" | "0" | "off")),
        "the state needs a stable owner: no DynamicUser"
    );
    assert_eq!(unit.service("StateDirectory"), "gitplane");
    assert_eq!(unit.service("ConfigurationDirectory"), "gitplane");
    assert_eq!(unit.service("RuntimeDirectory"), "gitplane");
    assert_eq!(unit.service("UMask"), "0077");

    // systemd's default of 1024 open files is what the HTTP listener's clients once used up:
    // the unit raises it well above the default connection cap and the daemon's own files.
    let files: u64 = unit
        .service("LimitNOFILE")
        .parse()
        .expect("LimitNOFILE= is a number");
    assert!(files >= 4096, "LimitNOFILE={files}");

    assert_eq!(unit.all("Install", "WantedBy"), ["multi-user.target"]);
}

#[test]
fn unit_is_hardened() {
    let unit = Unit::load();
    for (key, value) in [
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("ProtectProc", "invisible"),
        ("ProcSubset", "pid"),
        ("RestrictNamespaces", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("RemoveIPC", "yes"),
        ("SystemCallArchitectures", "native"),
    ] {
        assert_eq!(unit.service(key), value, "{key}=");
    }

    // No capabilities at all: every assignment is empty.
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let values = unit.all("Service", key);
        assert!(
            !values.is_empty() && values.iter().all(|v| v.is_empty()),
            "{key}= must be present and empty, got {values:?}"
        );
    }

    let filters = unit.all("Service", "SystemCallFilter");
    assert!(filters.contains(&"@system-service"), "{filters:?}");
    let denied: BTreeSet<&str> = filters
        .iter()
        .filter_map(|f| f.strip_prefix('~'))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(
        denied.contains("@privileged") && denied.contains("@resources"),
        "{filters:?}"
    );

    let families: BTreeSet<String> = unit
        .service_list("RestrictAddressFamilies")
        .into_iter()
        .collect();
    assert_eq!(
        families,
        ["AF_INET", "AF_INET6", "AF_UNIX"]
            .map(String::from)
            .into_iter()
            .collect::<BTreeSet<_>>()
    );

    // gitplane only reads the repository: nothing under /srv/git is writable to it, and the exec
    // drivers it runs must stay executable.
    for path in unit.service_list("ReadWritePaths") {
        let path = path.trim_start_matches(['-', '+']);
        assert!(
            !"/srv/git".starts_with(path) && !path.starts_with("/srv/git"),
            "ReadWritePaths={path} opens the repository for writing"
        );
    }
    assert!(
        unit.service_list("ReadOnlyPaths")
            .iter()
            .any(|p| p.trim_start_matches('-') == "/srv/git"),
        "the repository should be declared read-only"
    );
    assert!(
        unit.all("Service", "NoExecPaths").is_empty(),
        "exec drivers must be executable"
    );
}

/// Runs `systemd-analyze` with `args`. The tests that call it are ignored (reported as such)
/// where it is not installed: see `daemon/build.rs`.
fn systemd_analyze(args: &[&str]) -> Output {
    let result = Command::new("systemd-analyze")
        .args(args)
        .env("SYSTEMD_PAGER", "cat")
        .env("SYSTEMD_COLORS", "0")
        // Warnings and errors only: enough for everything wrong with a unit file.
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output();
    result.unwrap_or_else(|e| panic!("cannot run systemd-analyze: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "exit: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The unit in a fresh folder with its `ExecStart` binary replaced by one that exists here, so that
/// `verify` checks everything else.
fn unit_copy() -> (tempfile::TempDir, PathBuf) {
    let original = unit_text();
    let here = env!("CARGO_BIN_EXE_gitplane");
    assert!(
        !here.contains(char::is_whitespace),
        "the test binary's path has a space: {here}"
    );
    let copy = original.replace(
        &format!("ExecStart={INSTALLED_BINARY} "),
        &format!("ExecStart={here} "),
    );
    assert_ne!(
        copy, original,
        "ExecStart={INSTALLED_BINARY} not found in the unit"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gitplane.service");
    std::fs::write(&path, copy).unwrap();
    (dir, path)
}

#[test]
#[cfg_attr(not(systemd_analyze), ignore = "systemd-analyze is not installed")]
fn unit_passes_verify() {
    let (_dir, path) = unit_copy();
    let path = path.to_str().unwrap();
    // --recursive-errors=no (systemd 250 and later): fail on our unit's errors alone.
    let mut out = systemd_analyze(&["verify", "--man=no", "--recursive-errors=no", path]);
    if String::from_utf8_lossy(&out.stderr).contains("recursive-errors") {
        out = systemd_analyze(&["verify", "--man=no", path]);
    }
    // Lines about other units installed on this host are theirs; any about ours is a failure.
    let about_ours: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .filter(|l| l.contains("gitplane"))
        .map(str::to_string)
        .collect();
    assert!(
        out.status.success() && about_ours.is_empty(),
        "systemd-analyze verify complains about the unit: {about_ours:#?}\n{}",
        text(&out)
    );
}

#[test]
#[cfg_attr(not(systemd_analyze), ignore = "systemd-analyze is not installed")]
fn verify_catches_a_broken_unit() {
    // The check above must be able to fail: a misspelt key and a bad value are reported.
    let (_dir, path) = unit_copy();
    let broken = std::fs::read_to_string(&path).unwrap().replace(
        "ProtectProc=invisible",
        "ProtectProc=invisibel\nProtectSytem=strict",
    );
    std::fs::write(&path, broken).unwrap();
    let out = systemd_analyze(&["verify", "--man=no", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ProtectSytem") && stderr.contains("invisibel"),
        "{}",
        text(&out)
    );
}

#[test]
#[cfg_attr(not(systemd_analyze), ignore = "systemd-analyze is not installed")]
fn unit_exposure_is_low() {
    let unit = unit_path();
    let out = systemd_analyze(&[
        "security",
        "--offline=true",
        "--no-pager",
        unit.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !(stderr.contains("unrecognized option") || stderr.contains("Unknown option")),
        "this systemd-analyze has no --offline (systemd 250 or later has): {}",
        text(&out)
    );
    let level = stdout
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for gitplane.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no overall exposure level in the output:\n{}", text(&out)));
    assert!(
        level <= MAX_EXPOSURE,
        "exposure {level} is above {MAX_EXPOSURE}:\n{}",
        text(&out)
    );
}
