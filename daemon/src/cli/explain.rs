//! `gitplane explain RESOURCE`: why a resource is what it is.

use std::io::Write;

use super::{CliError, CommandResult, Context, Format};

/// Not implemented yet.
pub fn explain(
    _ctx: &Context,
    _rev: Option<&str>,
    _resource: &str,
    _format: Format,
    _stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    Ok(CommandResult::Failure)
}
