//! What the terminal UI's threads tell each other: the feed's ticks and the UI's controls, and
//! every event that wakes the UI loop. Kept apart from the threads themselves so the state
//! (`app`), the feed and the loop (`event`) all depend on these types and not on each other.

use std::time::Duration;

use crossterm::event::Event as InputEvent;
use gpudiag_telemetry::{Tick, TimeMs};

/// How much history a backward seek replays before its target: the widest chart window.
pub const LOOKBACK: Duration = Duration::from_secs(3600);

/// Where a replay stands, in recorded time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayPosition {
    pub current_ms: TimeMs,
    pub start_ms: TimeMs,
    pub end_ms: TimeMs,
    pub speed: f64,
}

/// What the feed tells the UI.
#[derive(Debug)]
pub enum FeedMsg {
    /// New ticks, oldest first. `reset`: forget everything before them (a backward seek).
    Ticks {
        ticks: Vec<Tick>,
        reset: bool,
        position: Option<ReplayPosition>,
    },
    /// No more ticks for now: the recording ended (`None`) or the backend failed. A replay can
    /// still seek back after this.
    Ended(Option<String>),
}

/// What the UI asks of the feed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FeedControl {
    Pause(bool),
    /// Replay speed, 1.0 = as recorded.
    Speed(f64),
    /// Move the replay by this many milliseconds of recorded time.
    Seek(i64),
    Stop,
}

/// Everything that can wake the UI.
#[derive(Debug)]
pub enum AppEvent {
    Input(InputEvent),
    /// Reading the terminal failed: nobody can steer the UI any more.
    InputClosed(String),
    Feed(FeedMsg),
    /// SIGTERM, SIGINT or SIGHUP from outside.
    Terminate,
    /// A probe run started from the probes panel finished.
    Probes(Result<gpudiag_probes::runner::ProbeReport, String>),
}

/// The time a tick stands for: its samples' time, or its latest event's.
pub fn tick_time(t: &Tick) -> Option<TimeMs> {
    t.samples
        .iter()
        .map(|s| s.time_ms)
        .max()
        .or_else(|| t.events.iter().map(|e| e.time_ms).max())
}
