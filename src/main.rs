//! The gpudiag binary: parse the command line, run, map errors to the documented exit codes.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

use gpudiag::cli::{CheckArgs, Cli, Command, FailOn, ReplayArgs, SourceArgs};
use gpudiag::commands;
use gpudiag::error::{Error, exit};
use gpudiag::report::text;
use gpudiag::tui;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpudiag: {e}");
            e.exit_code()
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn run(cli: Cli) -> Result<i32, Error> {
    match cli.command {
        Some(Command::Check(args)) => check(&args),
        Some(Command::Record(args)) => {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            // Ctrl-C ends the recording cleanly: the sampler stops and the file is finished.
            let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
            let ticks = commands::record(&args, stop)?;
            eprintln!(
                "gpudiag: recorded {ticks} tick(s) to {}",
                args.output.display()
            );
            Ok(exit::OK)
        }
        Some(Command::Replay(args)) => replay(&args, cli.interval),
        None => default_view(cli.demo, cli.interval),
    }
}

fn check(args: &CheckArgs) -> Result<i32, Error> {
    let report = commands::check(args)?;
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::CannotRun(format!("could not serialise the report: {e}")))?;
        commands::print(&format!("{json}\n"))?;
    } else {
        commands::print(&text::render(&report))?;
    }
    Ok(report.exit_code)
}

/// The terminal UI needs a terminal on both ends; piped or redirected, gpudiag prints text so
/// scripts keep working.
fn interactive() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// `gpudiag replay FILE`: the UI in a terminal, the check summary otherwise.
fn replay(args: &ReplayArgs, interval: std::time::Duration) -> Result<i32, Error> {
    if interactive() {
        return tui::run_replay(&args.file, args.speed, interval);
    }
    check(&CheckArgs {
        source: SourceArgs {
            devices: Vec::new(),
            replay: Some(args.file.clone()),
            demo: false,
            init_timeout: std::time::Duration::from_secs(10),
        },
        json: false,
        window: None,
        interval: std::time::Duration::from_millis(100),
        fail_on: FailOn::Fail,
    })
}

/// `gpudiag`: the terminal UI; without a terminal, the check summary. With no GPU either says so
/// in one line and shows the bundled demo recording instead.
fn default_view(demo: bool, interval: std::time::Duration) -> Result<i32, Error> {
    if interactive() {
        return tui::run_default(demo, interval);
    }
    let mut args = CheckArgs {
        source: SourceArgs {
            devices: Vec::new(),
            replay: None,
            demo,
            init_timeout: std::time::Duration::from_secs(10),
        },
        json: false,
        window: None,
        interval: std::time::Duration::from_millis(100),
        fail_on: FailOn::Fail,
    };
    match check(&args) {
        Err(Error::CannotRun(why)) if !demo => {
            eprintln!(
                "gpudiag: no live NVIDIA GPU here ({why}); showing the bundled demo recording \
                 (gpudiag --demo)"
            );
            args.source.demo = true;
            check(&args)
        }
        other => other,
    }
}
