//! The harness: every test gets a fresh folder with a bare repository `origin.git` that the
//! tests push to, a working clone `work/` to edit and commit in, and a state file path. The real
//! `gitplane` binary runs against them, as a user would run it.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::types::ValueRef;
use serde_json::Value;
use tempfile::TempDir;

/// The template repository shipped with gitplane.
pub fn template_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../repo-template")
}

/// Environment variables no child process may inherit: gitplane's own, and git's, so neither the
/// machine's nor the calling process's configuration matters.
const CLEARED_ENV: &[&str] = &[
    "GITPLANE_REPO",
    "GITPLANE_STATE",
    "GITPLANE_LOG",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_CEILING_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_DATE",
];

fn isolated(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for var in CLEARED_ENV {
        cmd.env_remove(var);
    }
    cmd.env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("NO_COLOR", "1");
    cmd
}

/// How one command ended: what ran, its exit code and its output.
pub struct Run {
    pub command: String,
    /// `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\n--- command: {}", self.command)?;
        writeln!(f, "--- exit code: {:?}", self.code)?;
        writeln!(f, "--- stdout:\n{}", self.stdout)?;
        writeln!(f, "--- stderr:\n{}", self.stderr)?;
        write!(f, "--- end")
    }
}

impl Run {
    /// Runs `cmd` to its end, keeping what it printed.
    pub fn from_command(mut cmd: Command) -> Run {
        let command = describe(&cmd);
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {command}: {e}"));
        Run {
            command,
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asserts exit code 0.
    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "expected success:{self}");
        self
    }

    /// Asserts a non-zero exit code (and no crash by signal).
    #[track_caller]
    pub fn fails(self) -> Run {
        assert!(
            matches!(self.code, Some(c) if c != 0),
            "expected a non-zero exit code:{self}"
        );
        assert!(
            !self.stderr.contains("panicked at"),
            "gitplane panicked:{self}"
        );
        self
    }

    /// Stdout parsed as JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):{self}"))
    }

    /// Asserts that no value of `secrets` is in stdout or stderr.
    #[track_caller]
    pub fn hides(&self, secrets: &[&str]) -> &Run {
        for secret in secrets {
            assert!(
                !self.stdout.contains(secret) && !self.stderr.contains(secret),
                "secret {secret:?} in the output:{self}"
            );
        }
        self
    }

    #[track_caller]
    pub fn stderr_has(&self, needle: &str) -> &Run {
        assert!(
            self.stderr.contains(needle),
            "stderr does not contain {needle:?}:{self}"
        );
        self
    }

    #[track_caller]
    pub fn stdout_has(&self, needle: &str) -> &Run {
        assert!(
            self.stdout.contains(needle),
            "stdout does not contain {needle:?}:{self}"
        );
        self
    }

    /// The `error: ...` lines of stderr.
    pub fn error_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("error:"))
            .collect()
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = String::new();
    if let Some(dir) = cmd.get_current_dir() {
        s.push_str(&format!("(in {}) ", dir.display()));
    }
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v
            && k.to_string_lossy().starts_with("GITPLANE")
        {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// A fresh folder with `origin.git` (bare, branch main), its clone `work/`, and `state.db`.
pub struct Sandbox {
    _tmp: TempDir,
    pub root: PathBuf,
    pub origin: PathBuf,
    pub work: PathBuf,
    pub state: PathBuf,
}

impl Sandbox {
    /// An empty bare repository and an empty clone of it.
    pub fn new() -> Sandbox {
        let tmp = tempfile::Builder::new()
            .prefix("gitplane-e2e-")
            .tempdir()
            .expect("tempdir");
        let root = tmp.path().to_path_buf();
        let origin = root.join("origin.git");
        let work = root.join("work");
        let sb = Sandbox {
            _tmp: tmp,
            state: root.join("state.db"),
            root,
            origin,
            work,
        };
        sb.git_in(
            &sb.root,
            &[
                "init",
                "--quiet",
                "--bare",
                "--initial-branch=main",
                "origin.git",
            ],
        );
        sb.git_in(&sb.root, &["clone", "--quiet", "origin.git", "work"]);
        // Cloning an empty repository leaves HEAD unborn; make sure it is main.
        sb.git(&["symbolic-ref", "HEAD", "refs/heads/main"]);
        sb
    }

    /// The template committed and pushed.
    pub fn template() -> Sandbox {
        let sb = Sandbox::new();
        sb.seed_template();
        sb.commit("Initial platform configuration");
        sb
    }

    /// The template committed, pushed and applied once.
    pub fn applied() -> Sandbox {
        let sb = Sandbox::template();
        sb.gitplane(&["apply"]).ok();
        sb
    }

    /// Copies `repo-template/` into the clone.
    pub fn seed_template(&self) {
        copy_dir(&template_dir(), &self.work);
    }

    /// Runs git in `dir`, asserting success; returns stdout.
    #[track_caller]
    pub fn git_in(&self, dir: &Path, args: &[&str]) -> String {
        let mut cmd = isolated("git");
        cmd.current_dir(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args);
        let run = Run::from_command(cmd).ok();
        run.stdout
    }

    /// Runs git in the working clone.
    #[track_caller]
    pub fn git(&self, args: &[&str]) -> String {
        self.git_in(&self.work, args)
    }

    /// Writes a file of the clone (creating folders).
    pub fn write(&self, rel: &str, contents: &str) {
        let path = self.work.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.work.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Replaces `from` (which must occur exactly once) with `to` in a file of the clone.
    #[track_caller]
    pub fn edit(&self, rel: &str, from: &str, to: &str) {
        let text = self.read(rel);
        assert_eq!(
            text.matches(from).count(),
            1,
            "{rel} must contain {from:?} exactly once:\n{text}"
        );
        self.write(rel, &text.replacen(from, to, 1));
    }

    /// Deletes a file or a folder of the clone.
    pub fn remove(&self, rel: &str) {
        let path = self.work.join(rel);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        }
    }

    /// `git add -A`, `git commit`, `git push origin main`; returns the new commit id.
    #[track_caller]
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "--quiet", "-m", message]);
        self.git(&["push", "--quiet", "origin", "main"]);
        self.head()
    }

    /// The clone's HEAD commit id.
    pub fn head(&self) -> String {
        self.rev_parse("HEAD")
    }

    pub fn rev_parse(&self, rev: &str) -> String {
        self.git(&["rev-parse", rev]).trim().to_owned()
    }

    /// `gitplane ARGS --repo origin.git --state state.db`.
    #[track_caller]
    pub fn gitplane(&self, args: &[&str]) -> Run {
        self.gitplane_env(args, &[])
    }

    /// Like [`Sandbox::gitplane`], with extra environment variables.
    #[track_caller]
    pub fn gitplane_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let repo = self.origin.to_str().unwrap();
        let state = self.state.to_str().unwrap();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--repo", repo, "--state", state]);
        self.gitplane_raw(&all, env)
    }

    /// `gitplane ARGS` with nothing added, run in the sandbox's root folder.
    pub fn gitplane_raw(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = isolated(env!("CARGO_BIN_EXE_gitplane"));
        cmd.current_dir(&self.root).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Run::from_command(cmd)
    }

    /// Secret values opened with the state key beside the state file: `sql` selects each
    /// sealed value with the place it was sealed for (`'resource_secret.outputs:' || guresid`).
    #[track_caller]
    pub fn unsealed(&self, sql: &str) -> Vec<String> {
        let real = self.state.canonicalize().unwrap();
        let gitplane_state::KeySource::File(path) = gitplane_state::KeySource::beside(&real) else {
            unreachable!("the default key is a file")
        };
        let key =
            gitplane_state::StateKey::load_or_create(&gitplane_state::KeySource::Provided(path))
                .expect("the state key beside the state file");
        self.rows(sql)
            .into_iter()
            .map(|r| {
                assert!(r[0].starts_with("gp1:"), "not sealed: {r:?}");
                key.open(&r[0], &r[1])
                    .unwrap_or_else(|e| panic!("{r:?}: {e}"))
            })
            .collect()
    }

    /// Asserts that no value of `secrets` is anywhere in the bytes of the state file, its
    /// write-ahead log or its shared memory: not in a live row, not in a free page.
    #[track_caller]
    pub fn assert_state_bytes_hide(&self, secrets: &[&str]) {
        for suffix in ["", "-wal", "-shm"] {
            let mut name = self.state.as_os_str().to_owned();
            name.push(suffix);
            let Ok(bytes) = std::fs::read(&name) else {
                continue;
            };
            for secret in secrets {
                assert!(
                    !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "{secret:?} in the bytes of {}",
                    std::path::Path::new(&name).display()
                );
            }
        }
    }

    /// A new connection to the state file.
    pub fn db(&self) -> Connection {
        open_db(&self.state)
    }

    /// Every row of `sql` with every value as text (`NULL` for null).
    pub fn rows(&self, sql: &str) -> Vec<Vec<String>> {
        rows(&self.db(), sql)
    }

    /// The first column of every row of `sql`.
    pub fn column(&self, sql: &str) -> Vec<String> {
        self.rows(sql)
            .into_iter()
            .map(|mut r| r.remove(0))
            .collect()
    }

    /// A single integer.
    pub fn count(&self, sql: &str) -> i64 {
        self.db()
            .query_row(sql, [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Everything recorded about resources, edges and operations, for before/after comparisons.
    pub fn resource_rows(&self) -> Vec<Vec<String>> {
        self.rows("SELECT * FROM resource ORDER BY guresid")
    }

    pub fn edge_rows(&self) -> Vec<Vec<String>> {
        self.rows("SELECT * FROM edge ORDER BY env, from_guresid, to_guresid")
    }

    pub fn max_id(&self, table: &str) -> i64 {
        self.count(&format!("SELECT COALESCE(MAX(id), 0) FROM {table}"))
    }

    /// `(env, res_id) -> outputs` JSON of the recorded resources.
    pub fn outputs(&self, env: &str, res_id: &str) -> Value {
        let text: String = self
            .db()
            .query_row(
                "SELECT outputs FROM resource WHERE env = ?1 AND res_id = ?2",
                [env, res_id],
                |r| r.get(0),
            )
            .unwrap_or_else(|e| panic!("no resource {env}/{res_id}: {e}"));
        serde_json::from_str(&text).unwrap()
    }

    /// The res_ids recorded in `env`.
    pub fn res_ids(&self, env: &str) -> BTreeSet<String> {
        self.column(&format!(
            "SELECT res_id FROM resource WHERE env = '{env}' ORDER BY res_id"
        ))
        .into_iter()
        .collect()
    }

    /// The newest deployment of `env`.
    pub fn last_deployment(&self, env: &str) -> Deployment {
        let row = self.rows(&format!(
            "SELECT id, env, commit_id, status, created, updated, deleted, unchanged, failed, \
             error FROM deployment WHERE env = '{env}' ORDER BY id DESC LIMIT 1"
        ));
        let r = row
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no deployment of {env}"));
        Deployment::from_row(r)
    }

    /// Deployments with an id above `after`, oldest first.
    pub fn deployments_after(&self, after: i64) -> Vec<Deployment> {
        self.rows(&format!(
            "SELECT id, env, commit_id, status, created, updated, deleted, unchanged, failed, \
             error FROM deployment WHERE id > {after} ORDER BY id"
        ))
        .into_iter()
        .map(Deployment::from_row)
        .collect()
    }

    /// `(action, res_id, status)` of a deployment's operations, in journal order.
    pub fn operations(&self, deployment: i64) -> Vec<(String, String, String)> {
        self.rows(&format!(
            "SELECT action, res_id, status FROM operation WHERE deployment_id = {deployment} \
             ORDER BY id"
        ))
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
        .collect()
    }
}

/// A `deployment` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    pub id: i64,
    pub env: String,
    pub commit: String,
    pub status: String,
    /// created, updated, deleted, unchanged, failed
    pub counts: [i64; 5],
    pub error: Option<String>,
}

impl Deployment {
    fn from_row(r: Vec<String>) -> Deployment {
        let n = |i: usize| r[i].parse::<i64>().unwrap();
        Deployment {
            id: n(0),
            env: r[1].clone(),
            commit: r[2].clone(),
            status: r[3].clone(),
            counts: [n(4), n(5), n(6), n(7), n(8)],
            error: (r[9] != "NULL").then(|| r[9].clone()),
        }
    }
}

pub fn open_db(path: &Path) -> Connection {
    assert!(path.exists(), "no state file at {}", path.display());
    Connection::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every row of `sql` with every value as text (`NULL` for null).
pub fn rows(conn: &Connection, sql: &str) -> Vec<Vec<String>> {
    let mut stmt = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let n = stmt.column_count();
    let mut out = Vec::new();
    let mut q = stmt.query([]).unwrap();
    while let Some(row) = q.next().unwrap() {
        let mut cells = Vec::with_capacity(n);
        for i in 0..n {
            cells.push(match row.get_ref(i).unwrap() {
                ValueRef::Null => "NULL".to_owned(),
                ValueRef::Integer(v) => v.to_string(),
                ValueRef::Real(v) => v.to_string(),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                ValueRef::Blob(b) => format!("blob:{}", String::from_utf8_lossy(b)),
            });
        }
        out.push(cells);
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The object keys of a JSON value, sorted.
pub fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// A set of strings from string literals.
pub fn set<const N: usize>(items: [&str; N]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Compares `actual` with the golden file `tests/e2e/golden/<name>`; with `GITPLANE_BLESS=1`
/// writes it instead (review the diff before committing it).
#[track_caller]
pub fn assert_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/e2e/golden")
        .join(name);
    if std::env::var_os("GITPLANE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (GITPLANE_BLESS=1 writes it)", path.display()));
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output at line {} (GITPLANE_BLESS=1 rewrites it):\n\
             --- expected\n{}\n--- actual\n{}",
            path.display(),
            first + 1,
            expected
                .lines()
                .skip(first)
                .take(5)
                .collect::<Vec<_>>()
                .join("\n"),
            actual
                .lines()
                .skip(first)
                .take(5)
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
}

/// Expected rows written as string arrays, as `rows()` returns them.
pub fn rows_of<const N: usize, C: FromIterator<Vec<String>>>(rows: &[[&str; N]]) -> C {
    rows.iter()
        .map(|r| r.iter().map(|s| s.to_string()).collect())
        .collect()
}

/// Waits until `done` (up to `limit`), failing with `what` and `context()`.
#[track_caller]
pub fn wait_until(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    gitplane_testkit::eventually_or(what, limit, || done().then_some(()), context);
}

/// A Resource Definition as a test writes it: one way to build the common shape (an id, a
/// resource type, a driver, values and secrets, one criteria entry) instead of a `format!` per
/// file.
#[derive(Debug, Clone)]
pub struct Definition {
    id: String,
    res_type: String,
    driver: String,
    /// `key: value` lines under `driver_inputs.values` / `.secrets`.
    values: Vec<String>,
    secrets: Vec<String>,
    criteria: String,
}

impl Definition {
    /// Definition `id` of resource type `id`, on `driver`, for every context (`criteria: [{}]`).
    pub fn new(id: &str, driver: &str) -> Definition {
        Definition {
            id: id.to_owned(),
            res_type: id.to_owned(),
            driver: driver.to_owned(),
            values: Vec::new(),
            secrets: Vec::new(),
            criteria: "{}".to_owned(),
        }
    }

    /// On the HTTP driver the tests register as `test/http`.
    pub fn http(id: &str) -> Definition {
        Definition::new(id, "test/http")
    }

    /// For resource type `res_type` (the id stays).
    pub fn of_type(mut self, res_type: &str) -> Definition {
        self.res_type = res_type.to_owned();
        self
    }

    /// A `key: value` line of `driver_inputs.values`.
    pub fn value(mut self, line: &str) -> Definition {
        self.values.push(line.to_owned());
        self
    }

    /// A `key: value` line of `driver_inputs.secrets`.
    pub fn secret(mut self, line: &str) -> Definition {
        self.secrets.push(line.to_owned());
        self
    }

    /// The one criteria entry, as flow YAML (`{env_type: preview}`).
    pub fn criteria(mut self, criteria: &str) -> Definition {
        self.criteria = criteria.to_owned();
        self
    }

    /// The definition's YAML document.
    pub fn yaml(&self) -> String {
        let block = |name: &str, lines: &[String]| {
            if lines.is_empty() {
                return String::new();
            }
            let body: String = lines.iter().map(|l| format!("      {l}\n")).collect();
            format!("    {name}:\n{body}")
        };
        let inputs = [
            block("values", &self.values),
            block("secrets", &self.secrets),
        ]
        .concat();
        // A definition without inputs has no `driver_inputs` key: an empty one is an error.
        let inputs = if inputs.is_empty() {
            inputs
        } else {
            format!("  driver_inputs:\n{inputs}")
        };
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {}\n\
             entity:\n  type: {}\n  driver_type: {}\n{inputs}  criteria:\n    - {}\n",
            self.id, self.res_type, self.driver, self.criteria
        )
    }
}

/// Several definitions as one multi-document YAML file.
pub fn definitions(all: &[Definition]) -> String {
    all.iter()
        .map(Definition::yaml)
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The `drivers:` block of a host config registering `test/http` at `url`, with `options`
/// (`timeout: 10s`, `concurrency: 1`) inside its `http:` map.
pub fn http_driver_config(url: &str, options: &str) -> String {
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(", {options}")
    };
    format!("drivers:\n  test/http:\n    http: {{url: \"{url}\"{options}}}\n")
}

impl Sandbox {
    /// Writes `yaml` as the host config `host.yaml` beside the repositories (not in the
    /// clone) and returns the daemon's arguments: the repository, the state and `--config`.
    pub fn host_config(&self, yaml: &str) -> Vec<String> {
        let config = self.root.join("host.yaml");
        std::fs::write(&config, yaml).unwrap();
        vec![
            "--repo".into(),
            self.origin.display().to_string(),
            "--state".into(),
            self.state.display().to_string(),
            "--config".into(),
            config.display().to_string(),
        ]
    }
}
