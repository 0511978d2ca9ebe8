//! What wakes the terminal UI's loop: input, the sampler's messages, signals and probe results,
//! all on one channel. Kept apart from the threads themselves so the state (`app`) and the loop
//! (`event`) depend on these types and not on each other.

use std::time::Duration;

use crossterm::event::Event as InputEvent;
use gpudiag_telemetry::sampler::SamplerMsg;

/// How much history a backward seek replays before its target: the widest chart window.
pub const LOOKBACK: Duration = Duration::from_secs(3600);

/// Everything that can wake the UI.
#[derive(Debug)]
pub enum AppEvent {
    Input(InputEvent),
    /// Reading the terminal failed: nobody can steer the UI any more.
    InputClosed(String),
    /// Ticks, replay positions and the end of the source, from the sampler.
    Feed(SamplerMsg),
    /// SIGTERM, SIGINT or SIGHUP from outside.
    Terminate,
    /// A probe run started from the probes panel finished.
    Probes(Result<gpudiag_probes::runner::ProbeReport, String>),
}
