//! How the benches run the real `gitplane` binary: git, each command a timed child process with
//! its own peak memory, the summary lines it must print, the SQLite state file's size, and the
//! figures' formatting. Included by `scale.rs` and `backends.rs` (`mod cli;`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// The release binary `cargo bench` built beside the bench.
pub const GITPLANE: &str = env!("CARGO_BIN_EXE_gitplane");

// ---------------------------------------------------------------------------------------------
// git

/// Runs `git` isolated from the user's and the system's configuration; panics with its output
/// when it fails. Returns its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=gitplane-bench",
            "-c",
            "user.email=bench@gitplane.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run git {args:?} in {}: {e}", dir.display()));
    assert!(
        out.status.success(),
        "git {args:?} in {} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bare repository `ROOT/origin.git` and its clone `ROOT/work` on `main`, as a person sets
/// them up to push; the clone's path.
pub fn bare_and_clone(root: &Path) -> PathBuf {
    git(
        root,
        &[
            "init",
            "--quiet",
            "--bare",
            "--initial-branch=main",
            "origin.git",
        ],
    );
    git(root, &["clone", "--quiet", "origin.git", "work"]);
    let work = root.join("work");
    git(&work, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    work
}

pub fn head(work: &Path) -> String {
    git(work, &["rev-parse", "HEAD"]).trim().to_owned()
}

pub fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    let dir = path.parent().expect("every generated file is in a folder");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

// ---------------------------------------------------------------------------------------------
// Running the CLI

/// One finished command: its wall time, its own peak memory, and what it printed.
pub struct Run {
    pub secs: f64,
    pub max_rss_kib: u64,
    pub stdout: String,
    pub stderr: String,
}

/// How the bench runs `gitplane` against one clone and one state.
pub struct Cli {
    pub repo: PathBuf,
    /// A SQLite file, or a `postgres://` URL (which then needs a host config with a state key).
    pub state: PathBuf,
    /// The host config (`--config`), if any.
    pub config: Option<PathBuf>,
    /// Where each command's stdout and stderr go (files, so a command never blocks on a pipe
    /// and a failure can be shown).
    pub out: PathBuf,
    pub err: PathBuf,
}

/// At most the last `lines` lines of `text`, saying how many were left out.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    if all.len() <= lines {
        return text.to_owned();
    }
    format!(
        "[... {} earlier lines ...]\n{}",
        all.len() - lines,
        all[all.len() - lines..].join("\n")
    )
}

impl Cli {
    pub fn describe(&self, args: &[&str]) -> String {
        let config = self
            .config
            .as_ref()
            .map(|c| format!(" --config {}", c.display()))
            .unwrap_or_default();
        format!(
            "{GITPLANE} {} --repo {} --state {}{config}",
            args.join(" "),
            self.repo.display(),
            self.state.display()
        )
    }

    /// Runs `gitplane ARGS --repo R --state S [--config C]` as a child process, timed from spawn
    /// to exit, with its peak memory from `wait4`. Panics, showing the command and its output,
    /// unless it exits with 0.
    pub fn run(&self, args: &[&str]) -> Run {
        let command = self.describe(args);
        let stdout = File::create(&self.out).expect("the bench can write its temp dir");
        let stderr = File::create(&self.err).expect("the bench can write its temp dir");
        let start = Instant::now();
        let mut gitplane = Command::new(GITPLANE);
        gitplane
            .args(args)
            .arg("--repo")
            .arg(&self.repo)
            .arg("--state")
            .arg(&self.state);
        if let Some(config) = &self.config {
            gitplane.arg("--config").arg(config);
        }
        #[expect(
            clippy::zombie_processes,
            reason = "wait4 below reaps the child, and reads its rusage"
        )]
        let child = gitplane
            .env("GITPLANE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        let (status, max_rss_kib) = wait4(&child, &command);
        let secs = start.elapsed().as_secs_f64();
        let run = Run {
            secs,
            max_rss_kib,
            stdout: std::fs::read_to_string(&self.out).expect("the command's stdout is UTF-8"),
            stderr: std::fs::read_to_string(&self.err).expect("the command's stderr is UTF-8"),
        };
        if status != Some(0) {
            self.fail(
                args,
                &run,
                &format!(
                    "exited with {}",
                    status.map_or("a signal".to_owned(), |c| format!("code {c}"))
                ),
            );
        }
        run
    }

    pub fn fail(&self, args: &[&str], run: &Run, what: &str) -> ! {
        panic!(
            "{}: {what}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.describe(args),
            tail(&run.stdout, 60),
            tail(&run.stderr, 60)
        )
    }

    /// `gitplane apply`, checked against what the summary line must say.
    pub fn apply(&self, check: impl Fn(&Summary) -> Result<(), String>) -> (Run, Summary) {
        let args = ["apply"];
        let run = self.run(&args);
        let Some(summary) = Summary::find(&run.stdout) else {
            self.fail(&args, &run, "no summary line `development: deployment ...`")
        };
        if let Err(why) = check(&summary) {
            self.fail(&args, &run, &why);
        }
        (run, summary)
    }

    /// `gitplane plan`, checked to plan no change.
    pub fn noop_plan(&self) -> Run {
        let args = ["plan"];
        let run = self.run(&args);
        let Some(line) = run.stdout.lines().find(|l| l.contains(" to create, ")) else {
            self.fail(
                &args,
                &run,
                "no summary line `... to create, ... to delete`",
            )
        };
        let counts = counts(line);
        for what in ["to create", "to update", "to delete"] {
            if counts.get(what) != Some(&0) {
                self.fail(&args, &run, &format!("a no-op plan must say `0 {what}`"));
            }
        }
        if counts.get("may update").is_some_and(|n| *n != 0) {
            self.fail(&args, &run, "a no-op plan must say `0 may update`");
        }
        run
    }
}

/// Waits for `child` with `wait4`, which also gives the child's own peak RSS. Returns its exit
/// code (None when a signal ended it) and `ru_maxrss` (KiB on Linux).
pub fn wait4(child: &Child, command: &str) -> (Option<i32>, u64) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data, for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our own unreaped child; status and usage are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        assert!(
            r == -1 && err.kind() == std::io::ErrorKind::Interrupted,
            "wait4 on {command} (pid {pid}) failed: {err}"
        );
    }
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let max_rss_kib = u64::try_from(usage.ru_maxrss).expect("ru_maxrss is not negative");
    (code, max_rss_kib)
}

/// `N label, N label, ...` as a map from label to N (`0 to create, 12 unchanged` gives
/// `{"to create": 0, "unchanged": 12}`).
pub fn counts(text: &str) -> BTreeMap<String, u64> {
    text.split(',')
        .filter_map(|part| {
            let (n, label) = part.trim().split_once(' ')?;
            Some((label.trim().to_owned(), n.parse().ok()?))
        })
        .collect()
}

/// The line `development: deployment N STATUS: C created, U updated, D deleted, X unchanged,
/// F failed` of an apply.
#[derive(Debug)]
pub struct Summary {
    pub line: String,
    pub deployment: String,
    pub status: String,
    pub counts: BTreeMap<String, u64>,
}

impl Summary {
    pub fn find(stdout: &str) -> Option<Summary> {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("development: deployment ") && l.contains(" created, "))?;
        let rest = line.strip_prefix("development: deployment ")?;
        let (head, counts) = rest.split_once(": ")?;
        let (deployment, status) = head.split_once(' ')?;
        Some(Summary {
            line: line.to_owned(),
            deployment: deployment.to_owned(),
            status: status.to_owned(),
            counts: self::counts(counts),
        })
    }

    pub fn get(&self, what: &str) -> Result<u64, String> {
        self.counts
            .get(what)
            .copied()
            .ok_or_else(|| format!("the summary line `{}` has no `{what}` count", self.line))
    }

    pub fn expect(&self, what: &str, n: u64) -> Result<(), String> {
        let got = self.get(what)?;
        if got == n {
            Ok(())
        } else {
            Err(format!(
                "expected {n} {what}, the summary line says `{}`",
                self.line
            ))
        }
    }

    pub fn succeeded(&self) -> Result<(), String> {
        if self.status == "succeeded" {
            self.expect("failed", 0)
        } else {
            Err(format!("the deployment did not succeed: `{}`", self.line))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The state file

pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// The state file's size (with its WAL) after a full checkpoint, so what it holds is counted
/// once.
pub fn state_bytes(state: &Path) -> u64 {
    let conn = rusqlite::Connection::open(state)
        .unwrap_or_else(|e| panic!("cannot open the state {}: {e}", state.display()));
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap_or_else(|e| panic!("cannot checkpoint {}: {e}", state.display()));
    assert_eq!(busy, 0, "the checkpoint of {} was blocked", state.display());
    drop(conn);
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    size(state) + size(&with_suffix(state, "-wal"))
}

// ---------------------------------------------------------------------------------------------
// Figures

/// `median X of N (min A, max B)` of durations in seconds.
pub fn spread(v: &[f64]) -> String {
    format!(
        "median {} of {} (min {}, max {})",
        duration(median(v)),
        v.len(),
        duration(v.iter().copied().fold(f64::INFINITY, f64::min)),
        duration(v.iter().copied().fold(0.0, f64::max)),
    )
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds with 2 decimals, or milliseconds below 1 s.
pub fn duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1e3)
    } else {
        format!("{secs:.2} s")
    }
}

pub fn mib(kib: u64) -> String {
    format!("{} MiB", kib.div_ceil(1024))
}

pub fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

/// KB below 1 MB, MB above.
pub fn size(bytes: f64) -> String {
    if bytes < 1e6 {
        format!("{:.1} KB", bytes / 1e3)
    } else {
        format!("{:.2} MB", bytes / 1e6)
    }
}

/// The 1, 5 and 15 minute load averages (Linux), to tell whether something else shared the CPUs.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

pub fn say(text: &str) {
    println!("{text}");
    let _ = std::io::stdout().flush();
}
