//! `gitplane init`: a new config repository from the embedded `repo-template/`, committed.

use std::path::Path;
use std::process::Command;

use crate::repo_template::TEMPLATE;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{dir}: already exists and is not empty: choose a new folder")]
    NotEmpty { dir: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("git {args}: {message} (is git installed?)")]
    Git { args: String, message: String },
}

/// Writes the template into `dir` (new or empty) and commits it with `git`.
pub fn init(dir: &Path) -> Result<(), InitError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| InitError::Io { path, source }
    };
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(InitError::NotEmpty {
            dir: dir.display().to_string(),
        });
    }
    for (rel, contents) in TEMPLATE {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, contents).map_err(io(&path))?;
    }
    git(dir, &["init", "--quiet", "--initial-branch=main"])?;
    git(dir, &["add", "--all"])?;
    let has_identity = Command::new("git")
        .args(["config", "user.email"])
        .current_dir(dir)
        .output()
        .map(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
        .unwrap_or(false);
    let mut commit: Vec<&str> = Vec::new();
    if !has_identity {
        // A fresh machine has no git identity; the first commit must not fail for that.
        commit.extend([
            "-c",
            "user.name=gitplane",
            "-c",
            "user.email=gitplane@localhost",
        ]);
    }
    commit.extend([
        "commit",
        "--quiet",
        "-m",
        "Initial platform configuration from gitplane init",
    ]);
    git(dir, &commit)
}

fn git(dir: &Path, args: &[&str]) -> Result<(), InitError> {
    crate::watch::run_git(Some(dir), args)
        .map_err(|crate::watch::GitFailed { args, message }| InitError::Git { args, message })
}
