//! The gpudiag binary: parse the command line, run, map errors to the documented exit codes.

use std::process::ExitCode;

use clap::Parser;

use gpudiag::cli::{Cli, Command};
use gpudiag::commands;
use gpudiag::stop::Stop;
use gpudiag::tick_stats;
use gpudiag_core::config::Config;
use gpudiag_model::error::Error;
use gpudiag_model::printable;

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
    let var = gpudiag_probes::nccl::NVLS_ENV;
    if std::env::var_os(var).is_none() {
        // SAFETY: called first thing in main, before any thread exists that could read the
        // environment concurrently.
        unsafe { std::env::set_var(var, "0") };
    }
}

fn run(cli: Cli) -> Result<i32, Error> {
    let config = || Config::load(cli.config.as_deref()).map_err(|e| Error::Usage(e.to_string()));
    let stop = Stop::new();
    match cli.command {
        Some(Command::Check(ref args)) => commands::check::check(args, &stop, &config()?),
        Some(Command::Config(ref args)) => commands::config::config(args, config),
        Some(Command::Probe(ref args)) => commands::probe::probe(args, &stop, &config()?),
        Some(Command::Record(ref args)) => commands::record::record(args, &stop, &config()?),
        Some(Command::Trace(ref args)) => commands::trace::trace(args, &stop, &config()?),
        Some(Command::Report(ref args)) => commands::report::report(args, &stop, &config()?),
        Some(Command::Serve(ref args)) => commands::serve::serve(args, &stop, &config()?),
        Some(Command::Replay(ref args)) => {
            commands::replay::replay(args, cli.interval, &stop, &config()?)
        }
        // `run` handles its signals itself: it forwards them to its command.
        Some(Command::Run(ref args)) => commands::run::run(args, &config()?),
        Some(Command::Fleet(ref args)) => commands::fleet::fleet(args, &stop),
        // Reads files the Slurm scripts hand it, never the config: it judges nothing itself.
        Some(Command::Slurm(ref args)) => commands::slurm::slurm(args),
        // Neither reads the config: a broken one must not stop a shell from installing these.
        Some(Command::Completions(ref args)) => commands::completions::completions(args.shell),
        Some(Command::Man(ref args)) => commands::man::man(args),
        None => commands::default_view::default_view(cli.demo, cli.interval, &stop, &config()?),
    }
}
