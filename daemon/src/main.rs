//! The `gitplane` binary: parses arguments, sets up logging, runs the command, sets the exit code.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gitplane::cli::{Cli, CliError, Command, CommandResult, run};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon reports what it does at info; commands speak for themselves and log warnings.
    let default_level = match cli.command {
        Command::Daemon { .. } => "info",
        _ => "warn",
    };
    let filter =
        EnvFilter::try_from_env("GITPLANE_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let json = std::env::var("GITPLANE_LOG_FORMAT").is_ok_and(|f| f == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // `GITPLANE_LOG=gitplane=debug` times the phases of a command (`trace`: each batch).
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(std::io::stderr);
    if json {
        // One JSON object a line, for journald or a log shipper.
        builder.json().with_current_span(false).init();
    } else if std::env::var_os("JOURNAL_STREAM").is_some() {
        // Under systemd the journal stamps each line itself.
        builder.with_ansi(false).without_time().init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
    match run(cli) {
        Ok(CommandResult::Success) => ExitCode::SUCCESS,
        Ok(CommandResult::Failure) => ExitCode::FAILURE,
        // `gitplane drift` found drift: apart from failures, for cron jobs and CI.
        Ok(CommandResult::Drifted) => ExitCode::from(2),
        // `gitplane plan --detailed-exitcode` found something to change.
        Ok(CommandResult::Changes) => ExitCode::from(2),
        // The reader went away (`gitplane history | head`): it has what it wanted.
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&anyhow::Error::from(e)));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each cause said once: most errors already quote
/// their cause, and a library's error often repeats its own ("unable to open database file:
/// unable to open database file").
fn message(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}
