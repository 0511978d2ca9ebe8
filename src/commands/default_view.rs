//! `gpudiag` with no subcommand: the terminal UI; without a terminal, the check summary.

use std::time::Duration;

use gpudiag_core::check::CheckRequest;
use gpudiag_core::config::Config;
use gpudiag_core::session::{Origin, SourceSpec};
use gpudiag_model::error::Error;
use gpudiag_telemetry::amd::sysfs::SYSFS_ROOT_ENV;
use gpudiag_telemetry::live::LiveBackend;

use crate::cli::BackendChoice;
use crate::stop::Stop;
use crate::tui;

/// `gpudiag`. With no GPU the UI says so in one line and shows the bundled demo recording
/// instead; the summary for scripts says why and exits 3, since a demo's healthy report would
/// fool them (`--demo` asks for it).
pub fn default_view(
    demo: bool,
    interval: Duration,
    stop: &Stop,
    config: &Config,
) -> Result<i32, Error> {
    if super::interactive() {
        return tui::run_default(demo, interval, stop, config);
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
    super::check::print_check(&request, false, BackendChoice::Auto.name(), stop, config).map_err(
        |e| match e {
            Error::CannotRun(why) => Error::CannotRun(format!(
                "no live GPU here ({why}); `gpudiag --demo` shows the bundled demo recording"
            )),
            other => other,
        },
    )
}
