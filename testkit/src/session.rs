//! A `psql` session kept open between steps, so that a test can hold a transaction (and the
//! row locks it took) while the code under test runs, and end it when the test says.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// One connection to a database through `psql` reading its standard input; ended (and its
/// open transaction rolled back by the server) when dropped.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Numbers the end marks of [`Session::run`].
    marks: u64,
}

impl Session {
    /// Starts `psql` (the `command` the tool kit built) on the database at `url`.
    pub(crate) fn open(mut command: Command, url: &str) -> Result<Session, String> {
        let mut child = command
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not run psql: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("psql has no pipes".into());
        };
        Ok(Session {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            marks: 0,
        })
    }

    /// Runs `sql` in the session and returns what it printed (one row a line, columns
    /// separated by `|`); a transaction it begins stays open for the next call. Err carries
    /// psql's message: after an error the session has ended.
    pub fn run(&mut self, sql: &str) -> Result<String, String> {
        self.marks += 1;
        let mark = format!("-- gitplane-testkit end {} --", self.marks);
        // The `;` ends the last statement: psql would otherwise keep it for the next call.
        let sent =
            writeln!(self.stdin, "{sql};\n\\echo '{mark}'").and_then(|()| self.stdin.flush());
        let mut printed = String::new();
        loop {
            let mut line = String::new();
            let read = match sent {
                Ok(()) => self.stdout.read_line(&mut line),
                Err(ref e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            };
            match read {
                Ok(0) | Err(_) => return Err(self.ended(sql)),
                Ok(_) if line.trim_end() == mark => return Ok(printed),
                Ok(_) => printed.push_str(&line),
            }
        }
    }

    /// Why the session ended: psql's message.
    fn ended(&mut self, sql: &str) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        format!("psql ended running {sql:?}: {}", stderr.trim())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
