//! The gpudiag binary: parse the command line, run, map errors to the documented exit codes.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

use gpudiag::cli::{CheckArgs, Cli, Command, FailOn, SourceArgs};
use gpudiag::commands;
use gpudiag::error::{Error, exit};
use gpudiag::report::text;

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
        Some(Command::Probe(args)) => {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            // Ctrl-C stops the probes between steps; buffers and contexts are freed on the way out.
            let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
            commands::probe(&args, stop)
        }
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
        None => default_view(cli.demo),
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
        if let Some(suite) = args.probes {
            let devices = report.devices.iter().filter_map(|d| d.probes.clone());
            let probed = gpudiag::probes::runner::ProbeReport {
                suite: suite.as_str().into(),
                devices: devices.collect(),
            };
            commands::print(&gpudiag::probes::text::render(&probed))?;
        }
    }
    Ok(report.exit_code)
}

/// Until the terminal UI lands, `gpudiag` shows the check summary; with no GPU it says so in one
/// line and shows the bundled demo recording instead.
fn default_view(demo: bool) -> Result<i32, Error> {
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
        probes: None,
        force: false,
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
