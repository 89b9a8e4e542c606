//! The `gitplane` binary: parses arguments, sets up logging, runs the command, sets the exit code.

use std::process::ExitCode;

use clap::Parser;
use gitplane::cli::{Cli, CommandResult, run};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("GITPLANE_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(CommandResult::Success) => ExitCode::SUCCESS,
        Ok(CommandResult::Failure) => ExitCode::FAILURE,
        Err(e) => {
            let e = anyhow::Error::from(e);
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
