//! `gitplane explain RESOURCE`: prints the application layer's explanation of a resource.

use std::io::Write;

use super::{CliError, CommandResult, Context, Format, report_rejected};
use crate::app::explain::{self as app_explain, Explained};

/// `gitplane explain RESOURCE`: a recorded resource, or else one of the commit's graph that
/// the next apply would create; a commit that does not build is reported on stderr.
pub fn explain(
    ctx: &Context,
    rev: Option<&str>,
    resource: &str,
    format: Format,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    let format = match format {
        Format::Table => app_explain::Format::Table,
        Format::Json => app_explain::Format::Json,
    };
    let Explained {
        text,
        rejected,
        load_errors,
    } = app_explain::explain(ctx, rev, resource, format)?;
    if let Some((commit, rejected)) = &rejected {
        report_rejected(commit, rejected);
    }
    for e in &load_errors {
        eprintln!("error: {e}");
    }
    match text {
        Some(text) => {
            stdout.write_all(text.as_bytes())?;
            Ok(CommandResult::Success)
        }
        None => Ok(CommandResult::Failure),
    }
}
