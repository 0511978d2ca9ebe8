//! `gpudiag check`: the request built from the flags, the check core runs, the report.

use crate::cli::CheckArgs;
use gpudiag_core::check::{self, CheckReport, CheckRequest, ProbeAsk, ProbeRunner};
use gpudiag_core::config::Config;
use gpudiag_model::error::Error;
use gpudiag_probes::runner::ProbeReport;

use super::probe::run_probes;
use crate::cli::SuiteName;

/// `gpudiag check`.
pub fn check(args: &CheckArgs, config: &Config) -> Result<CheckReport, Error> {
    check_request(&args.request()?, config)
}

/// The check `request` asks for, probes run in this process.
pub fn check_request(request: &CheckRequest, config: &Config) -> Result<CheckReport, Error> {
    check::run(request, config, &CliProbes)
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

/// Probes run in this process, under Ctrl-C and the hang watchdog.
struct CliProbes;

impl ProbeRunner for CliProbes {
    fn run(&self, ask: &ProbeAsk, devices: &[String]) -> Result<ProbeReport, Error> {
        let suite = <SuiteName as clap::ValueEnum>::from_str(&ask.suite, false)
            .map_err(|_| Error::Usage(format!("no probe suite named {}", ask.suite)))?;
        run_probes(suite, devices, ask.force, None)
    }
}
