//! `gitplane validate --pre-receive`: rejects a push whose new commit does not load or build.
//!
//! Installed as the `pre-receive` hook of the bare config repository:
//!
//! ```sh
//! #!/bin/sh
//! exec /usr/bin/gitplane validate --pre-receive --config /etc/gitplane/gitplane.yaml
//! ```
//!
//! git runs the hook in the bare repository, so `--repo .` (the default when the host config
//! names no repo) is the repository pushed to. The pushed objects are still in git's quarantine
//! then; [`ConfigRepo::open_in_hook`] reads them.
//!
//! A push that moves the watched ref from a commit it had is validated in proportion to what
//! it changed, as the daemon deploys it: only the apps whose folders changed are read and built
//! (with the global resources they reach), and everything when a shared file (the definitions,
//! an environment's file, `gitplane.yaml`) changed. The rest was validated when it was pushed.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};

use crate::deploy;
use crate::repo::ConfigRepo;

use super::{CliError, CommandResult, Context, output, report_rejected, target_envs};
use crate::app::select_envs;

/// The ref gitplane applies when the host config names none.
const DEFAULT_WATCHED: &str = "refs/heads/main";

/// One line of git's pre-receive input: `<old-sha> <new-sha> <refname>`.
#[derive(Debug, PartialEq, Eq)]
struct Update<'a> {
    old: &'a str,
    new: &'a str,
    refname: &'a str,
}

impl<'a> Update<'a> {
    fn parse(line: &'a str) -> Option<Update<'a>> {
        let mut parts = line.splitn(3, ' ');
        let old = parts.next().filter(|old| is_object_id(old))?;
        let new = parts.next().filter(|s| is_object_id(s))?;
        let refname = parts.next().filter(|s| !s.is_empty())?;
        Some(Update { old, new, refname })
    }

    /// The push deletes the ref.
    fn deletes(&self) -> bool {
        is_zero(self.new)
    }

    /// The push makes the ref.
    fn creates(&self) -> bool {
        is_zero(self.old)
    }
}

fn is_zero(id: &str) -> bool {
    id.bytes().all(|b| b == b'0')
}

fn is_object_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `refname` (a full name, as git passes it) is the watched ref, given in the host
/// config in full (`refs/heads/main`) or short (`main`, matched as git would: `refs/<name>`,
/// `refs/tags/<name>`, `refs/heads/<name>`).
fn is_watched(refname: &str, watched: &str) -> bool {
    if watched.starts_with("refs/") {
        return refname == watched;
    }
    ["refs/", "refs/tags/", "refs/heads/"]
        .iter()
        .any(|prefix| refname.strip_prefix(prefix) == Some(watched))
}

/// Reads `<old> <new> <ref>` lines from `stdin` (git's pre-receive protocol) and validates the
/// new commit of the watched ref (the host config's `ref`, else the branch HEAD points to, as
/// `apply` and the daemon read it; `refs/heads/main` if HEAD is detached) exactly as
/// `gitplane validate` does: every error goes to stderr and the result is a failure, which makes
/// git reject the whole push. Deleting the watched ref is refused. Other refs pass untouched.
pub fn pre_receive(
    ctx: &Context,
    stdin: &mut impl BufRead,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    // Read everything git sends before answering.
    let lines: Vec<String> = match stdin.lines().collect() {
        Ok(lines) => lines,
        Err(e) => {
            eprintln!("error: pre-receive: cannot read the updated refs from stdin: {e}");
            return Ok(CommandResult::Failure);
        }
    };
    // What `apply` and the daemon read: the host config's ref, else the branch HEAD names.
    let head = crate::repo::ConfigRepo::open(&ctx.repo)
        .ok()
        .and_then(|r| r.head_ref());
    let watched = ctx
        .default_rev
        .as_deref()
        .or(head.as_deref())
        .unwrap_or(DEFAULT_WATCHED);
    let mut outcome = CommandResult::Success;
    for line in lines.iter().filter(|l| !l.trim().is_empty()) {
        let Some(update) = Update::parse(line) else {
            eprintln!(
                "error: pre-receive: cannot read {line:?}: expected '<old-sha> <new-sha> \
                 <refname>' (run this command as a git pre-receive hook)"
            );
            outcome = CommandResult::Failure;
            continue;
        };
        if !is_watched(update.refname, watched) {
            continue;
        }
        if update.deletes() {
            eprintln!(
                "error: {} is the ref gitplane applies: deleting it would delete every resource \
                 gitplane provisioned from it; to remove resources, push a commit without them",
                update.refname
            );
            outcome = CommandResult::Failure;
            continue;
        }
        if check(ctx, &update, stdout)? == CommandResult::Failure {
            outcome = CommandResult::Failure;
        }
    }
    Ok(outcome)
}

/// The apps a push from `old` to `new` changed (added, changed or removed folders under
/// `workloads/`); `None` when everything is to be read: a new ref, an old commit that cannot be
/// read, or a shared file changed.
fn changed_apps(repo: &ConfigRepo, update: &Update<'_>) -> Option<BTreeSet<String>> {
    if update.creates() {
        return None;
    }
    let before = repo.layout(update.old).ok()?;
    let after = repo.layout(update.new).ok()?;
    if before.shared != after.shared {
        return None;
    }
    let changed = after
        .apps
        .iter()
        .filter(|(app, tree)| before.apps.get(*app) != Some(tree))
        .map(|(app, _)| app.clone())
        .chain(
            before
                .apps
                .keys()
                .filter(|app| !after.apps.contains_key(*app))
                .cloned(),
        )
        .collect();
    Some(changed)
}

/// Loads and builds the new commit of the watched ref, as `load_and_build` does for
/// `validate`, but with the repository opened to see the quarantined objects of the push, and
/// only what the push changed (see [`changed_apps`]).
fn check(
    ctx: &Context,
    update: &Update<'_>,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let repo = ConfigRepo::open_in_hook(&ctx.repo)?;
    if let Some(apps) = changed_apps(&repo, update) {
        return check_apps(ctx, &repo, update, &apps, stdout);
    }
    let snapshot = repo.load(Some(update.new))?;
    let envs = target_envs(&snapshot, &ctx.envs)?;
    match deploy::build(&snapshot, &envs, ctx.host()) {
        Ok(built) => {
            writeln!(
                stdout,
                "ok: commit {} for {} is valid: {}",
                output::short(&snapshot.commit),
                update.refname,
                super::output::built_summary(&built)
            )?;
            Ok(CommandResult::Success)
        }
        Err(rejected) => {
            report_rejected(&snapshot.commit, &rejected);
            Ok(CommandResult::Failure)
        }
    }
}

/// Builds the apps `apps` of the new commit (with the global resources they reach) in each
/// environment: a push that changed only them.
fn check_apps(
    ctx: &Context,
    repo: &ConfigRepo,
    update: &Update<'_>,
    apps: &BTreeSet<String>,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let layout = repo.layout(update.new)?;
    let envs = select_envs(&deploy::environments_in(&layout), update.new, &ctx.envs)?;
    let mut graphs = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    // Removed apps have nothing to build.
    let present: BTreeSet<String> = apps
        .iter()
        .filter(|a| layout.apps.contains_key(*a))
        .cloned()
        .collect();
    if !present.is_empty() {
        for env in &envs {
            let built = deploy::build_apps(repo, update.new, env, &present, ctx.host());
            match built.map_err(crate::app::AppError::from)?.1 {
                Ok(graph) => graphs.push(graph),
                Err(rejected) => {
                    for e in rejected.errors {
                        if !errors.contains(&e) {
                            errors.push(e);
                        }
                    }
                }
            }
        }
    }
    if !errors.is_empty() {
        report_rejected(update.new, &deploy::Rejected { envs, errors });
        return Ok(CommandResult::Failure);
    }
    let read = match apps.len() {
        0 => "no app or shared file changed".to_owned(),
        n => format!(
            "{n} changed app(s) read ({}), the rest as at {}",
            apps.iter().cloned().collect::<Vec<_>>().join(", "),
            output::short(update.old)
        ),
    };
    let summary = super::output::built_summary(&deploy::Built { graphs });
    writeln!(
        stdout,
        "ok: commit {} for {} is valid: {read}{}",
        output::short(update.new),
        update.refname,
        if summary.is_empty() {
            String::new()
        } else {
            format!("; {summary}")
        }
    )?;
    Ok(CommandResult::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const ZERO: &str = "0000000000000000000000000000000000000000";

    #[test]
    fn parses_git_lines() {
        let line = format!("{ZERO} {A} refs/heads/main");
        let u = Update::parse(&line).unwrap();
        assert_eq!(u.new, A);
        assert_eq!(u.refname, "refs/heads/main");
        assert!(!u.deletes());
        let line = format!("{A} {ZERO} refs/heads/main");
        assert!(Update::parse(&line).unwrap().deletes());
        assert!(Update::parse("main").is_none());
        assert!(Update::parse(&format!("{A} xyz refs/heads/main")).is_none());
        assert!(Update::parse(&format!("{A} {A}")).is_none());
    }

    #[test]
    fn matches_the_watched_ref_full_or_short() {
        assert!(is_watched("refs/heads/main", "refs/heads/main"));
        assert!(!is_watched("refs/heads/main2", "refs/heads/main"));
        assert!(is_watched("refs/heads/main", "main"));
        assert!(is_watched("refs/tags/prod", "prod"));
        assert!(is_watched("refs/heads/release", "heads/release"));
        assert!(!is_watched("refs/heads/feature/main", "main"));
        assert!(!is_watched("refs/heads/dev", "main"));
    }
}
