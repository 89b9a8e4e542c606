//! Finds the PostgreSQL programs of this machine and runs them as a user they accept.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The PostgreSQL programs of one installation, and whom they run as.
pub(crate) struct Tools {
    /// The directory of `initdb`, `pg_ctl`, `pg_isready` and `psql`, all of one version.
    bin: PathBuf,
    /// Set when we are root: initdb and the server refuse to run as root, so every program runs
    /// as `postgres` through `runuser` and the server's directory is given to that user.
    pub(crate) run_as: Option<PostgresUser>,
}

/// The `postgres` account, to give it the server's directory and run programs as it.
pub(crate) struct PostgresUser {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    runuser: PathBuf,
}

/// Why no server can be started here at all (as opposed to one that failed to start).
pub(crate) struct Unavailable(pub(crate) String);

impl Tools {
    pub(crate) fn find() -> Result<Tools, Unavailable> {
        let candidates = candidate_bin_dirs();
        let Some(bin) = candidates.iter().find(|dir| has_programs(dir, &PROGRAMS)) else {
            return Err(Unavailable(match candidates.first() {
                Some(dir) => format!(
                    "{} has initdb and pg_ctl but not all of {}",
                    dir.display(),
                    PROGRAMS.join(", ")
                ),
                None => "no initdb and pg_ctl in PATH or in /usr/lib/postgresql/*/bin \
                         (install PostgreSQL, e.g. apt-get install postgresql)"
                    .to_string(),
            }));
        };
        let bin = bin.clone();
        let run_as = if current_uid()? == 0 {
            Some(PostgresUser::find()?)
        } else {
            None
        };
        Ok(Tools { bin, run_as })
    }

    /// The command line that runs `program` of this installation as the server's user.
    pub(crate) fn argv(&self, program: &str) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(user) = &self.run_as {
            argv.push(user.runuser.clone().into_os_string());
            argv.extend(["-u", "postgres", "--"].map(OsString::from));
        }
        argv.push(self.bin.join(program).into_os_string());
        argv
    }

    /// `program` ready to run in `dir`, with stdin closed.
    pub(crate) fn command(&self, program: &str, dir: &Path) -> Command {
        let argv = self.argv(program);
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .current_dir(dir)
            .stdin(Stdio::null());
        without_pg_environment(&mut command);
        command
    }
}

/// Removes the `PG*` variables of our environment from `command`'s: PGOPTIONS, PGHOST, PGDATA and
/// the like would change which server the tools talk to or how it runs.
pub(crate) fn without_pg_environment(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.as_encoded_bytes().starts_with(b"PG") {
            command.env_remove(name);
        }
    }
}

/// Runs `command` to its end; Err says which program failed and what it printed.
pub(crate) fn run(command: &mut Command, what: &str) -> Result<Output, String> {
    let output = command
        .output()
        .map_err(|e| format!("could not run {what}: {e}"))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The programs a server and its tests need, all from one installation.
const PROGRAMS: [&str; 4] = ["initdb", "pg_ctl", "pg_isready", "psql"];

fn has_programs(dir: &Path, programs: &[&str]) -> bool {
    programs.iter().all(|program| dir.join(program).is_file())
}

/// Directories with `initdb` and `pg_ctl`, in order of preference: those of PATH, where a link
/// counts for the directory it points into (an installation may link only the server's programs
/// into PATH), then Debian's and Ubuntu's `/usr/lib/postgresql/<version>/bin`, which they keep
/// out of PATH, newest first.
fn candidate_bin_dirs() -> Vec<PathBuf> {
    let server = ["initdb", "pg_ctl"];
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path).filter(|dir| has_programs(dir, &server)) {
            let real = fs::canonicalize(dir.join("initdb"))
                .ok()
                .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
                .filter(|real| has_programs(real, &server));
            candidates.extend(real);
            candidates.push(dir);
        }
    }
    let mut installed: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(|part| part.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = entry.path().join("bin");
            has_programs(&bin, &server).then_some((version, bin))
        })
        .collect();
    installed.sort();
    candidates.extend(installed.into_iter().rev().map(|(_, bin)| bin));
    candidates
}

/// Our effective user id: the owner of `/proc/self`, else what `id -u` says.
fn current_uid() -> Result<u32, Unavailable> {
    if let Ok(metadata) = fs::metadata("/proc/self") {
        return Ok(metadata.uid());
    }
    id(&["-u"])
        .ok_or_else(|| Unavailable("cannot tell which user this is (no /proc, no id)".into()))
}

impl PostgresUser {
    fn find() -> Result<PostgresUser, Unavailable> {
        let (Some(uid), Some(gid)) = (id(&["-u", "postgres"]), id(&["-g", "postgres"])) else {
            return Err(Unavailable(
                "running as root, which initdb refuses, and there is no `postgres` user to run \
                 it as"
                    .into(),
            ));
        };
        // Root's PATH has the sbin directories; a PATH that has lost them should not matter.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let runuser = std::env::split_paths(&path)
            .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
            .map(|dir| dir.join("runuser"))
            .find(|runuser| runuser.is_file())
            .ok_or_else(|| {
                Unavailable(
                    "running as root, which initdb refuses, and there is no runuser to run it \
                     as the postgres user"
                        .into(),
                )
            })?;
        Ok(PostgresUser { uid, gid, runuser })
    }
}

/// A number printed by `id` with these arguments, through the system's user database (NSS).
fn id(args: &[&str]) -> Option<u32> {
    let output = Command::new("id")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8(output.stdout).ok()?.trim().parse().ok()
}
