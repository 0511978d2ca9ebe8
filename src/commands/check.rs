//! `gpudiag check`: the request built from the flags, the check core runs, the report printed
//! as text or JSON. `replay` and the default view print theirs through [`print_check`] too.

use crate::check_text;
use crate::cli::{CheckArgs, SuiteName};
use crate::stop::Stop;
use crate::tick_stats;
use gpudiag_core::check::{self, CheckReport, CheckRequest, ProbeAsk, ProbeRunner};
use gpudiag_core::config::Config;
use gpudiag_model::error::Error;
use gpudiag_model::printable;
use gpudiag_probes::runner::ProbeReport;

use super::{print, print_text};
use crate::probe_run::run_probes;

/// `gpudiag check`: prints the report; returns the exit code it gives.
pub fn check(args: &CheckArgs, stop: &Stop, config: &Config) -> Result<i32, Error> {
    print_check(
        &args.request()?,
        args.json,
        args.source.backend.name(),
        stop,
        config,
    )
}

/// The check `request` asks for, probes run in this process (`stop` ends them).
pub fn check_request(
    request: &CheckRequest,
    stop: &Stop,
    config: &Config,
) -> Result<CheckReport, Error> {
    check::run(request, config, &CliProbes { stop })
}

/// Runs the check `request` asks for and prints its report: JSON or text.
pub fn print_check(
    request: &CheckRequest,
    json: bool,
    backend_name: &str,
    stop: &Stop,
    config: &Config,
) -> Result<i32, Error> {
    let report = match check_request(request, stop, config) {
        // A script reading `--json` always gets a document; the reason goes to stderr as well,
        // for the person watching. A `--device` that matches no GPU is one of these: a GPU the
        // caller was given and cannot be seen is for the caller to judge, from the selectors
        // listed apart.
        Err(e @ (Error::CannotRun(_) | Error::NoSuchDevice { .. })) if json => {
            let why = e.to_string();
            eprint!("{}", printable::error_lines(&why));
            let mut report = CheckReport::could_not_run(why, backend_name, request.fail_on);
            if let Error::NoSuchDevice { selectors, .. } = e {
                report.devices_not_found = selectors;
            }
            report.host.hostname = gethostname::gethostname().into_string().ok();
            report
        }
        other => other?,
    };
    if json {
        let json = serde_json::to_string_pretty(&report)
            .map(gpudiag_model::printable::json_c1)
            .map_err(|e| Error::CannotRun(format!("could not serialise the report: {e}")))?;
        print(&format!("{json}\n"))?;
        tick_stats::mark("printed");
    } else {
        print_text(&check_text::render(&report))?;
        if let Some(ask) = &request.probes {
            let devices = report.devices.iter().filter_map(|d| d.probes.clone());
            let probed = ProbeReport {
                suite: ask.suite.clone(),
                devices: devices.collect(),
                host: report.host_probes.clone().unwrap_or_default(),
                findings: Vec::new(),
            };
            print_text(&gpudiag_probes::text::render(&probed))?;
        }
    }
    Ok(report.exit_code)
}

impl CheckArgs {
    /// What the flags ask for.
    pub fn request(&self) -> Result<CheckRequest, Error> {
        Ok(CheckRequest {
            source: self.source.spec()?,
            window: self.window,
            interval: self.interval,
            fail_on: self.fail_on.into(),
            probes: self.probes.map(|suite| ProbeAsk {
                suite: suite.as_str().to_owned(),
                force: self.force,
            }),
        })
    }
}

/// Probes run in this process, under Ctrl-C and the hang watchdog. Ctrl-C is listened for only
/// once the probes start: the sampling before them has nothing to finish.
struct CliProbes<'a> {
    stop: &'a Stop,
}

impl ProbeRunner for CliProbes<'_> {
    fn run(&self, ask: &ProbeAsk, devices: &[String]) -> Result<ProbeReport, Error> {
        let suite = <SuiteName as clap::ValueEnum>::from_str(&ask.suite, false)
            .map_err(|_| Error::Usage(format!("no probe suite named {}", ask.suite)))?;
        run_probes(suite, devices, ask.force, None, self.stop)
    }
}
