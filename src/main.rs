//! The gpudiag binary: parse the command line, run, map errors to the documented exit codes.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

use gpudiag::check::{CheckReport, CheckRequest};
use gpudiag::cli::{BackendChoice, CheckArgs, Cli, Command, ReplayArgs};
use gpudiag::commands;
use gpudiag::config::{Config, DEFAULT_CONFIG_TOML};
use gpudiag::error::{Error, exit};
use gpudiag::printable;
use gpudiag::report::text;
use gpudiag::session::{Origin, SourceSpec};
use gpudiag::telemetry::amd::sysfs::SYSFS_ROOT_ENV;
use gpudiag::telemetry::live::LiveBackend;
use gpudiag::telemetry::replay::ReplayOptions;
use gpudiag::tick_stats;
use gpudiag::tui;

/// Counts allocations only under `GPUDIAG_TICK_STATS`; otherwise the system allocator as is.
#[global_allocator]
static ALLOC: tick_stats::CountingAlloc = tick_stats::CountingAlloc;

fn main() -> ExitCode {
    one_malloc_arena();
    keep_nvlink_multicast_off();
    tick_stats::start_from_env();
    let cli = Cli::parse();
    let result = run(cli);
    tick_stats::finish();
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            // Errors quote their input (a path, a recording's bad value): each line escaped,
            // each prefixed, so a TOML error keeps its caret under the fault.
            eprint!("{}", printable::error_lines(&e.to_string()));
            e.exit_code()
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// glibc gives each thread that allocates an arena of its own, and each keeps pages it freed;
/// gpudiag's threads (feed, slow-field reader, XID events, topology, the poll's deadline
/// worker) allocate little and seldom, so one shared arena holds the same data in fewer
/// resident pages, at the price of a lock no thread contends for.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets a tunable; called first thing in main, before any other thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// NCCL's NVLink multicast (NVLS) creates fabric objects that can outlive a crashed process and
/// take a shared host's GPUs out of service; the all-reduce probe measures without it unless
/// the user asked for it explicitly.
fn keep_nvlink_multicast_off() {
    let var = gpudiag::probes::nccl::NVLS_ENV;
    if std::env::var_os(var).is_none() {
        // SAFETY: called first thing in main, before any thread exists that could read the
        // environment concurrently.
        unsafe { std::env::set_var(var, "0") };
    }
}

fn run(cli: Cli) -> Result<i32, Error> {
    let config = || Config::load(cli.config.as_deref()).map_err(|e| Error::Usage(e.to_string()));
    match cli.command {
        Some(Command::Check(ref args)) => check(args, &config()?),
        Some(Command::Config(ref args)) => {
            let text = if args.default {
                DEFAULT_CONFIG_TOML.to_owned()
            } else {
                let c = config()?;
                toml::to_string_pretty(&c)
                    .map_err(|e| Error::CannotRun(format!("could not print the config: {e}")))?
            };
            commands::print(&text)?;
            Ok(exit::OK)
        }
        Some(Command::Probe(ref args)) => {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            // Ctrl-C stops the probes between steps; buffers and contexts are freed on the way out.
            let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
            commands::probe(args, stop, &config()?)
        }
        Some(Command::Record(ref args)) => {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            // Ctrl-C ends the recording cleanly: the sampler stops and the file is finished.
            let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
            let ticks = commands::record(args, stop, &config()?)?;
            eprintln!(
                "gpudiag: recorded {ticks} tick(s) to {}",
                args.output.display()
            );
            Ok(exit::OK)
        }
        Some(Command::Trace(ref args)) => {
            let stop = stop_on_ctrl_c();
            let capture = gpudiag::export::trace(args, &stop, &config()?)?;
            if let Some(m) = &capture.merged {
                if let Some(w) = m.warning() {
                    eprintln!("gpudiag: warning: {w}");
                }
                eprintln!(
                    "gpudiag: merged {} event(s) into the {} of {}, {:.3} s of overlap, to {}",
                    m.added_events,
                    m.profiler_events,
                    printable::line(&m.info.profiler_trace),
                    (m.info.window_end_ms - m.info.window_start_ms) / 1000.0,
                    args.output.display()
                );
                return Ok(exit::OK);
            }
            eprintln!(
                "gpudiag: traced {} tick(s), {} finding(s) to {}",
                capture.ticks,
                capture.findings.len(),
                args.output.display()
            );
            Ok(exit::OK)
        }
        Some(Command::Report(ref args)) => {
            let stop = stop_on_ctrl_c();
            let path = gpudiag::report::bundle::report(args, &stop, &config()?)?;
            eprintln!("gpudiag: wrote the bug-report bundle {}", path.display());
            Ok(exit::OK)
        }
        Some(Command::Serve(ref args)) => {
            gpudiag::export::prometheus::serve(args, stop_on_ctrl_c(), &config()?)?;
            Ok(exit::OK)
        }
        Some(Command::Replay(ref args)) => replay(args, cli.interval, &config()?),
        Some(Command::Run(ref args)) => commands::run(args, &config()?),
        Some(Command::Fleet(ref args)) => fleet(args),
        // Neither reads the config: a broken one must not stop a shell from installing these.
        Some(Command::Completions(ref args)) => {
            commands::print(&commands::completions(args.shell))?;
            Ok(exit::OK)
        }
        Some(Command::Man) => {
            commands::print(&commands::man_page()?)?;
            Ok(exit::OK)
        }
        None => default_view(cli.demo, cli.interval, &config()?),
    }
}

/// `gpudiag fleet`: the terminal UI on a terminal; otherwise (or with --json) one read, printed.
fn fleet(args: &gpudiag::cli::FleetArgs) -> Result<i32, Error> {
    if args.json || !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return commands::fleet::fleet_once(args);
    }
    let request = args.request()?;
    let client = args.client()?;
    tui::fleet::run(client, request, args.interval)
}

/// A flag Ctrl-C (or SIGTERM) sets, so long captures and servers end cleanly.
fn stop_on_ctrl_c() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
    stop
}

fn check(args: &CheckArgs, config: &Config) -> Result<i32, Error> {
    check_and_print(
        &args.request()?,
        args.json,
        args.source.backend.name(),
        config,
    )
}

/// Runs the check `request` asks for and prints its report: JSON or text.
fn check_and_print(
    request: &CheckRequest,
    json: bool,
    backend_name: &str,
    config: &Config,
) -> Result<i32, Error> {
    let report = match commands::check_request(request, config) {
        // A script reading `--json` always gets a document; the reason goes to stderr as well,
        // for the person watching.
        Err(Error::CannotRun(why)) if json => {
            eprint!("{}", printable::error_lines(&why));
            let mut report = CheckReport::could_not_run(why, backend_name, request.fail_on);
            report.host.hostname = gethostname::gethostname().into_string().ok();
            report
        }
        other => other?,
    };
    if json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::CannotRun(format!("could not serialise the report: {e}")))?;
        commands::print(&format!("{json}\n"))?;
        tick_stats::mark("printed");
    } else {
        commands::print_text(&text::render(&report))?;
        if let Some(ask) = &request.probes {
            let devices = report.devices.iter().filter_map(|d| d.probes.clone());
            let probed = gpudiag::probes::runner::ProbeReport {
                suite: ask.suite.clone(),
                devices: devices.collect(),
                host: report.host_probes.clone().unwrap_or_default(),
                findings: Vec::new(),
            };
            commands::print_text(&gpudiag::probes::text::render(&probed))?;
        }
    }
    Ok(report.exit_code)
}

/// The terminal UI needs a terminal on both ends; piped or redirected, gpudiag prints text so
/// scripts keep working.
fn interactive() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// `gpudiag replay FILE`: the UI in a terminal, the check summary otherwise.
fn replay(args: &ReplayArgs, interval: std::time::Duration, config: &Config) -> Result<i32, Error> {
    if interactive() {
        return tui::run_replay(
            &args.file,
            args.speed,
            interval,
            args.max_inflated_size,
            config,
        );
    }
    let source = SourceSpec {
        replay: ReplayOptions {
            max_inflated_bytes: args.max_inflated_size,
        },
        ..SourceSpec::new(Origin::File(args.file.clone()))
    };
    check_and_print(
        &CheckRequest::new(source),
        false,
        BackendChoice::Replay.name(),
        config,
    )
}

/// `gpudiag`: the terminal UI; without a terminal, the check summary. With no GPU the UI says
/// so in one line and shows the bundled demo recording instead; the summary for scripts says why
/// and exits 3, since a demo's healthy report would fool them (`--demo` asks for it).
fn default_view(demo: bool, interval: std::time::Duration, config: &Config) -> Result<i32, Error> {
    if interactive() {
        return tui::run_default(demo, interval, config);
    }
    let origin = if demo {
        Origin::Demo
    } else {
        Origin::Live(LiveBackend::Auto)
    };
    let source = SourceSpec {
        sysfs_root: std::env::var_os(SYSFS_ROOT_ENV).map(Into::into),
        ..SourceSpec::new(origin)
    };
    let request = CheckRequest::new(source);
    check_and_print(&request, false, BackendChoice::Auto.name(), config).map_err(|e| match e {
        Error::CannotRun(why) => Error::CannotRun(format!(
            "no live GPU here ({why}); `gpudiag --demo` shows the bundled demo recording"
        )),
        other => other,
    })
}
