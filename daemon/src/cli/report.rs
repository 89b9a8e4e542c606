//! `gitplane report NAME`: the state's report views, as a table, JSON or CSV.

use std::io::Write;

use clap::ValueEnum;

use super::{CliError, CommandResult, Context};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportName {
    Resources,
    Deployments,
    Failures,
    Links,
    Consumers,
    Orphans,
    Drift,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Table,
    Json,
    Csv,
}

/// Not implemented yet.
pub fn report(
    _ctx: &Context,
    _name: ReportName,
    _resource: Option<&str>,
    _format: ReportFormat,
    _stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    Ok(CommandResult::Failure)
}
