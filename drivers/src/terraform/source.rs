//! Puts a definition's `source` into the working directory: a folder on the host is copied, a
//! git repository is fetched at its `rev` with the `git` program.
//!
//! Credentials never reach a command line (`/proc` shows arguments to every user): a password
//! goes through `GIT_ASKPASS` and an SSH key through a file, both readable by their owner
//! alone, and the URL through the clone's own config file.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::inputs::Source;
use super::workspace::copy_folder;

/// Runs `git` with these arguments in this folder, with these variables added to its
/// environment; the error is what to say (already free of secrets).
pub(super) type Git<'a> = dyn Fn(&[&str], &Path, &[(&str, String)]) -> Result<(), String> + 'a;

/// Fills `dest` (which must not exist) with the source's files; `private` is a folder only
/// this user can read, for the credentials git needs.
pub(super) fn place(
    source: &Source,
    dest: &Path,
    private: &Path,
    git: &Git<'_>,
) -> Result<(), String> {
    let local = Path::new(&source.url);
    if local.is_absolute() && source.rev.is_none() && !is_bare_repository(local) {
        if !local.is_dir() {
            return Err(format!(
                "source.url {} is not a folder on this host",
                source.url
            ));
        }
        return copy_folder(local, dest);
    }
    fetch(source, dest, private, git)
}

/// A bare repository is fetched even without a `rev` (its HEAD): copying it would give git's
/// objects, not the module.
fn is_bare_repository(path: &Path) -> bool {
    path.join("HEAD").is_file() && path.join("objects").is_dir()
}

fn fetch(source: &Source, dest: &Path, private: &Path, git: &Git<'_>) -> Result<(), String> {
    fs::create_dir(dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    git(&["init", "--quiet"], dest, &[])?;
    // The URL may hold a token: it goes into the clone's config, not on a command line.
    let config = dest.join(".git").join("config");
    let mut file = OpenOptions::new()
        .append(true)
        .open(&config)
        .map_err(|e| format!("cannot open {}: {e}", config.display()))?;
    writeln!(
        file,
        "[remote \"origin\"]\n\turl = {}",
        config_quoted(&source.url)
    )
    .map_err(|e| format!("cannot write {}: {e}", config.display()))?;

    let mut env: Vec<(&str, String)> = vec![("GIT_TERMINAL_PROMPT", "0".to_owned())];
    if let Some(password) = &source.password {
        let username = source.username.as_deref().unwrap_or("git");
        private_file(&private.join("git-username"), username, 0o600)?;
        private_file(&private.join("git-password"), password, 0o600)?;
        let askpass = private.join("git-askpass");
        private_file(
            &askpass,
            &format!(
                "#!/bin/sh\ncase \"$1\" in\n[Uu]sername*) cat {} ;;\n*) cat {} ;;\nesac\n",
                shell_quoted(&private.join("git-username").to_string_lossy()),
                shell_quoted(&private.join("git-password").to_string_lossy()),
            ),
            0o700,
        )?;
        env.push(("GIT_ASKPASS", askpass.to_string_lossy().into_owned()));
    }
    if let Some(key) = &source.ssh_key {
        let path = private.join("ssh-key");
        // ssh refuses a key file whose last line has no end.
        let key = if key.ends_with('\n') {
            key.clone()
        } else {
            format!("{key}\n")
        };
        private_file(&path, &key, 0o600)?;
        env.push((
            "GIT_SSH_COMMAND",
            format!(
                "ssh -i {} -o IdentitiesOnly=yes -o BatchMode=yes",
                shell_quoted(&path.to_string_lossy())
            ),
        ));
    }
    let rev = source.rev.as_deref().unwrap_or("HEAD");
    git(
        &["fetch", "--quiet", "--depth", "1", "origin", rev],
        dest,
        &env,
    )?;
    git(
        &[
            "-c",
            "advice.detachedHead=false",
            "checkout",
            "--quiet",
            "FETCH_HEAD",
        ],
        dest,
        &[],
    )
}

fn private_file(path: &Path, contents: &str, mode: u32) -> Result<(), String> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A value for a git config file: in double quotes, `\` and `"` escaped.
fn config_quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A word for `sh`: in single quotes.
fn shell_quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(
            config_quoted(r#"https://h/a"b\c"#),
            r#""https://h/a\"b\\c""#
        );
        assert_eq!(shell_quoted("/tmp/it's"), r"'/tmp/it'\''s'");
    }
}
