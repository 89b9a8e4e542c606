//! Stops a server and removes its directory once its owner lets go or dies, whichever comes first.
//!
//! The watchdog is an `sh` process blocked reading a pipe whose only write end is held by the
//! owning process (Rust opens pipes close-on-exec, so no other child inherits it). The pipe
//! closes when the owner drops the [`Watchdog`] or when the kernel closes the files of a process
//! that ends in any way, SIGKILL included; the watchdog then stops the server and removes the
//! directory. It runs in a process group of its own so that Ctrl-C on `cargo test`, which ends
//! the test binary, does not end the watchdog before it has done its job. The server itself is
//! out of reach of both: `pg_ctl` starts it in a session of its own.

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::tools::without_pg_environment;

/// `$1` is the directory to remove, the rest the command that stops the server. `cat` returns at
/// the end of its input, which is the close of the pipe. HUP and INT are the terminal's, meant
/// for the test run, not for the cleanup after it.
const SCRIPT: &str = r#"trap '' HUP INT
cat >/dev/null
dir=$1
shift
"$@" >/dev/null 2>&1
rm -rf -- "$dir""#;

/// Longest wait for a watchdog once its pipe is closed: its `pg_ctl stop` (itself bounded by
/// `-t 30`) and the removal of the directory.
const FINISH_TIMEOUT: Duration = Duration::from_secs(40);

/// A running watchdog; dropping it stops the server, removes the directory and waits for both.
pub(crate) struct Watchdog {
    child: Child,
    /// The write end of the watchdog's stdin, never written: closing it is the signal.
    pipe: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts a watchdog that will run `stop` and then remove `dir`.
    pub(crate) fn spawn(dir: &Path, stop: &[OsString]) -> io::Result<Watchdog> {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(SCRIPT)
            .arg("gitplane-testkit-watchdog")
            .arg(dir)
            .args(stop)
            // Not the server's directory: the script removes it.
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        without_pg_environment(&mut command);
        let mut child = command.spawn()?;
        let pipe = child.stdin.take();
        Ok(Watchdog { child, pipe })
    }
}

impl Drop for Watchdog {
    // Runs from `atexit` for the shared server: nothing here may panic.
    fn drop(&mut self) {
        drop(self.pipe.take());
        let deadline = Instant::now() + FINISH_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                // Left to finish on its own: killing it would leave the server running.
                _ => {
                    let _ = writeln!(
                        io::stderr(),
                        "gitplane-testkit: a PostgreSQL test server was still being stopped \
                         after {} s; pid {} is finishing the job",
                        FINISH_TIMEOUT.as_secs(),
                        self.child.id()
                    );
                    return;
                }
            }
        }
    }
}
