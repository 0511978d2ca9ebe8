//! `gpudiag replay FILE`: the terminal UI in a terminal, the check summary otherwise.

use std::time::Duration;

use gpudiag_core::check::CheckRequest;
use gpudiag_core::config::Config;
use gpudiag_core::session::{Origin, SourceSpec};
use gpudiag_model::error::Error;
use gpudiag_telemetry::replay::ReplayOptions;

use crate::cli::{BackendChoice, ReplayArgs};
use crate::stop::Stop;
use crate::tui;

/// `gpudiag replay FILE`, at the UI's refresh `interval`.
pub fn replay(
    args: &ReplayArgs,
    interval: Duration,
    stop: &Stop,
    config: &Config,
) -> Result<i32, Error> {
    if super::interactive() {
        return tui::run_replay(
            &args.file,
            args.speed,
            interval,
            args.max_inflated_size,
            stop,
            config,
        );
    }
    let source = SourceSpec {
        replay: ReplayOptions {
            max_inflated_bytes: args.max_inflated_size,
        },
        ..SourceSpec::new(Origin::File(args.file.clone()))
    };
    super::check::print_check(
        &CheckRequest::new(source),
        false,
        BackendChoice::Replay.name(),
        stop,
        config,
    )
}
