//! Telemetry sources: the backend trait and everything behind it (one folder per vendor, replays
//! of recordings and bundles, fault injection). Live sources run under a per-poll deadline
//! (`poll_deadline`) because a vendor call can hang. The sample types they yield are the model's
//! (`gpudiag_model::sample`).
//!
//! Data flows one way: a `Backend` yields `DeviceInfo` once and a `Tick` per poll; the sampler
//! is the only code that polls one, and hands its ticks to whoever listens (the session pipeline,
//! the terminal UI); rules and views read the history. No view knows which backend produced the
//! data: a source that plays recorded time offers `Playback` (seek, pace), and the sampler, not
//! the view, asks it.

pub mod amd;
pub mod attribution;
pub mod bundle_reader;
pub mod fault;
pub mod kernel_log;
pub mod live;
pub mod nvml;
pub mod poll_deadline;
pub mod procfs;
pub mod ras;
pub mod recording;
pub mod recording_error;
pub mod replay;
pub mod sampler;
pub mod sanity;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use gpudiag_model::sample::{DeviceInfo, Event, HostInfo, Sample, TimeMs};

/// What one poll of a backend yields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    pub samples: Vec<Sample>,
    pub events: Vec<Event>,
    /// NCCL RAS answers that came since the last tick (see [`Backend::request_ras`]), or that
    /// a recording carries at this time.
    pub ras: Vec<gpudiag_model::ras::RasAnswer>,
    /// What `run --kernels` had recorded by then, where a recording carries it (the latest
    /// since the last tick).
    pub kernels: Option<Box<gpudiag_model::kernels::RecordedKernels>>,
}

impl Tick {
    /// The time the tick stands for: its samples' time, or its latest event's.
    pub fn time_ms(&self) -> Option<TimeMs> {
        self.samples
            .iter()
            .map(|s| s.time_ms)
            .max()
            .or_else(|| self.events.iter().map(|e| e.time_ms).max())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The vendor library is missing or would not initialise; gpudiag cannot run (exit code 3).
    #[error("{0}")]
    Unavailable(String),
    /// The backend works but sees no device (exit code 3).
    #[error("no GPU found: {0}")]
    NoDevice(String),
    /// A recording ended (replay only).
    #[error("end of recording")]
    EndOfRecording,
    #[error(transparent)]
    Recording(#[from] recording_error::RecordingError),
}

/// How a backend is paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// Live hardware: the caller decides when to poll; each poll reads now.
    Live,
    /// A replay: `poll` waits until the next recorded tick is due (or returns at once when
    /// playing as fast as possible), so the caller polls in a loop without sleeping.
    SelfPaced,
}

/// A source of telemetry. Implementations must never substitute 0 (or any sentinel) for a value
/// they cannot read: leave it `None` and record the reason in the sample's `absent` map.
pub trait Backend: Send {
    /// "nvml", "replay", ...
    fn name(&self) -> &'static str;
    fn host(&self) -> &HostInfo;
    /// Static attributes, read once when the backend opened.
    fn devices(&self) -> &[DeviceInfo];
    fn pacing(&self) -> Pacing;
    /// One tick of telemetry for every device.
    fn poll(&mut self) -> Result<Tick, BackendError>;
    /// Notes about the source a user should see (a recording's cut-off last line, skipped
    /// record kinds). Empty for live hardware.
    fn source_warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// Findings the source carries from when it was recorded (raised live by the recorder);
    /// empty for live hardware. Views show them beside today's rules' findings, marked as such.
    fn recorded_findings(&self) -> Vec<gpudiag_model::finding::Finding> {
        Vec::new()
    }
    /// Live backends: waits (at most `timeout`) until the slow fields have been read once, so a
    /// single read reports them instead of "not read yet". Others return at once.
    fn wait_for_slow_fields(&self, _timeout: Duration) {}
    /// Live backends: the cadence of slow fields (PCIe throughput, process lists); hint only.
    fn set_slow_interval(&mut self, _interval: Duration) {}
    /// How the GPUs connect (PCIe paths, NVLinks, NUMA), read from the hardware or the
    /// recording; `None` where the source cannot tell.
    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        None
    }
    /// A source that plays recorded time answers with what it can do besides polling (seek,
    /// change pace); live hardware answers `None`: it cannot seek, and its pace is the caller's.
    fn playback(&mut self) -> Option<&mut dyn Playback> {
        None
    }
    /// Live backends: asks NCCL's RAS service once, off the polling thread; the answer comes
    /// with a later tick (`Tick::ras`). A query already running makes this one a no-op. Others
    /// ignore it: a recording carries its answers.
    fn request_ras(&mut self, _query: ras::RasQuery) {}
}

/// How fast a replay plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// At the recorded spacing divided by `speed` (1.0 = real time, 10.0 = ten times faster).
    Recorded { speed: f64 },
    /// Every tick at once, for checks and tests.
    AsFastAsPossible,
}

/// Where a source playing recorded time stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayPosition {
    /// The tick last delivered (or the seek target); the start before the first poll.
    pub current_ms: TimeMs,
    pub start_ms: TimeMs,
    /// The last tick: of the whole recording, or, read from a stream, of what was read so far.
    pub end_ms: TimeMs,
}

/// What a source playing recorded time (a replay) can be asked besides polling. Wrappers
/// (fault injection, the poll deadline) pass it through to the source they wrap.
pub trait Playback {
    fn position(&self) -> ReplayPosition;
    fn pace(&self) -> Pace;
    /// Changes pace; timing restarts from the next tick, so setting the same pace again
    /// re-anchors the clock (after a pause, the ticks due meanwhile do not all come at once).
    fn set_pace(&mut self, pace: Pace) -> Result<(), BackendError>;
    /// Moves so that the next poll returns the first tick at or after `time_ms` (past the end,
    /// the next poll ends the recording). An error leaves the position as it was: a recording
    /// read from a pipe cannot go back.
    fn seek_to(&mut self, time_ms: TimeMs) -> Result<(), BackendError>;
    /// Whether the next poll ends the recording.
    fn at_end(&mut self) -> bool;
    /// Whether the last poll did not answer in time and is still running (a replay under the
    /// poll deadline, whose worker is stuck): polling on would wait a deadline per tick.
    fn stalled(&self) -> bool {
        false
    }
    /// A poll waiting for its tick returns an empty `Tick` within about 50 ms of `flag` being
    /// set; the tick stays due for the next poll. So a control (or a stop) never waits for the
    /// recording's next tick.
    fn interrupt_waits_on(&mut self, flag: Arc<AtomicBool>);
}

/// A recording that cannot be read is the user's input at fault (exit code 2).
impl From<recording_error::RecordingError> for gpudiag_model::error::Error {
    fn from(e: recording_error::RecordingError) -> Self {
        gpudiag_model::error::Error::Usage(e.to_string())
    }
}

impl From<BackendError> for gpudiag_model::error::Error {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Recording(r) => r.into(),
            other => gpudiag_model::error::Error::CannotRun(other.to_string()),
        }
    }
}
