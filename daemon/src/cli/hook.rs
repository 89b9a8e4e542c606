//! `gitplane validate --pre-receive`: rejects a push whose new commit does not load or build.

use std::io::{BufRead, Write};

use super::{CliError, CommandResult, Context};

/// Reads `<old> <new> <ref>` lines from `stdin` (git's pre-receive protocol) and validates the
/// new commit of the watched ref. Not implemented yet.
pub fn pre_receive(
    _ctx: &Context,
    _stdin: &mut impl BufRead,
    _stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    Ok(CommandResult::Failure)
}
