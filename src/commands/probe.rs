//! `gpudiag probe`: runs a suite (through `probe_run`, which `check --probes` and the terminal
//! UI use too) and prints its results.

use crate::cli::ProbeArgs;
use crate::probe_run::{hang_watchdog, run_probes_with};
use crate::stop::Stop;
use gpudiag_core::config::Config;
use gpudiag_core::rules;
use gpudiag_model::error::Error;
use gpudiag_model::printable;
use gpudiag_model::sample::now_ms;

use super::{print, print_text};

/// `gpudiag probe`: prints the results; returns the exit code.
/// Ctrl-C stops the probes between steps; buffers and contexts are freed on the way out.
pub fn probe(args: &ProbeArgs, stop: &Stop, config: &Config) -> Result<i32, Error> {
    let stop = stop.flag();
    gpudiag_probes::runner::check_names(&args.names)?;
    let _watchdog = hang_watchdog(args.suite, args.devices.len(), args.init_timeout);
    let mut report = run_probes_with(
        args.suite,
        &args.devices,
        args.force,
        Some(&args.names),
        stop,
        args.init_timeout,
    )?;
    report.findings = rules::peers::compare(&report.devices, config.rules.peers.margin, now_ms());
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map(gpudiag_model::printable::json_c1)
            .map_err(|e| Error::CannotRun(format!("could not serialise the results: {e}")))?;
        print(&format!("{json}\n"))?;
    } else {
        let mut text = gpudiag_probes::text::render(&report);
        for f in &report.findings {
            text.push_str(&format!(
                "[{}] {} — {}\n",
                f.severity,
                printable::line(&f.title),
                printable::line(&f.advice)
            ));
        }
        print_text(&text)?;
    }
    Ok(report.exit_code())
}
