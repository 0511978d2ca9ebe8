//! The session: one place that opens any source (live GPUs, the demo, a recording or a bundle)
//! and the pipeline state every command and view feeds its ticks into (history, latest values,
//! events, and the rule engine judging them as they arrive).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use gpudiag_model::error::Error;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{DeviceInfo, Event, Sample, TimeMs};
use gpudiag_model::stats::{self, Counter};
use gpudiag_model::topology::Topology;
use gpudiag_telemetry::attribution::AttributionOptions;
use gpudiag_telemetry::live::{self, LiveBackend, LiveOptions};
use gpudiag_telemetry::nvml::SlowFields;
use gpudiag_telemetry::poll_deadline::PollDeadline;
use gpudiag_telemetry::replay::{Pace, ReplayBackend, ReplayOptions};
use gpudiag_telemetry::sampler::{self, Sampler, SamplerMsg, SamplerOptions};
use gpudiag_telemetry::sanity::Sanitiser;
use gpudiag_telemetry::{Backend, BackendError, Pacing, Tick, fault};

use crate::config::Config;
use crate::history::History;
use crate::rules::engine::RuleEngine;
use crate::rules::families::{self, Lifetime};

/// The demo recording shipped inside the binary: a real GPU going from idle to load and back.
pub const DEMO_RECORDING: &[u8] = include_bytes!("../../../assets/demo/demo.ndjson.gz");
pub const DEMO_NAME: &str = "demo.ndjson.gz (bundled)";

/// An opened telemetry source with the devices the user selected.
pub struct Source {
    pub backend: Box<dyn Backend>,
    pub selected: DeviceFilter,
    /// The recording's name (a path, or the demo's); `None` for live GPUs.
    pub recording: Option<String>,
    /// The backend a recording was made with (its header's: "nvml", ...); `None` for live GPUs.
    pub recorded_with: Option<String>,
    /// Findings the recording carries for the selected devices (raised live when it was made).
    pub recorded: Vec<Finding>,
}

impl Source {
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.backend
            .devices()
            .iter()
            .filter(|d| self.selected.0.contains(&d.index))
            .cloned()
            .collect()
    }

    /// Whether the source's GPUs are this host's (live), so this host's kernel log and CUDA
    /// libraries describe them; a recording's GPUs were elsewhere.
    pub fn is_this_host(&self) -> bool {
        self.recording.is_none()
    }

    /// The topology of the selected GPUs, where the source knows it.
    pub fn topology(&self) -> Option<Topology> {
        let selected: Vec<u32> = self.selected.0.iter().copied().collect();
        self.backend.topology().map(|t| t.restricted_to(&selected))
    }
}

/// The device indices `--device` selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFilter(pub BTreeSet<u32>);

impl DeviceFilter {
    /// Keeps only the selected devices' samples and events (host-wide events stay).
    pub fn apply(&self, mut tick: Tick) -> Tick {
        tick.samples.retain(|s| self.0.contains(&s.device));
        tick.events
            .retain(|e| e.device.is_none_or(|d| self.0.contains(&d)));
        tick
    }
}

/// Where telemetry comes from: live GPUs through one backend, the bundled demo, or a file (a
/// recording, plain or gzip, or a bug-report bundle: the content decides).
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    Live(LiveBackend),
    Demo,
    File(PathBuf),
}

/// What to open: the origin and how to treat it.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub origin: Origin,
    /// `--device` selectors (an index or a UUID); empty selects every device.
    pub devices: Vec<String>,
    /// How long NVML initialisation may take.
    pub init_timeout: Duration,
    /// How long one poll may take before the devices are marked stalled.
    pub poll_timeout: Duration,
    /// Root of a fake sysfs and /proc tree (tests); `None` reads the real `/`.
    pub sysfs_root: Option<PathBuf>,
    /// Limits a recording or bundle is read under.
    pub replay: ReplayOptions,
    /// Where live processes' owners (Slurm job, pod) are read: /proc's root and the kubelet.
    pub attribution: AttributionOptions,
}

impl SourceSpec {
    /// `origin` with every other setting at its default: all devices, a 10 s initialisation,
    /// the default poll deadline, the real `/`, the default replay limits and attribution.
    pub fn new(origin: Origin) -> SourceSpec {
        SourceSpec {
            origin,
            devices: Vec::new(),
            init_timeout: Duration::from_secs(10),
            poll_timeout: gpudiag_telemetry::poll_deadline::DEFAULT_POLL_TIMEOUT,
            sysfs_root: None,
            replay: ReplayOptions::default(),
            attribution: AttributionOptions::default(),
        }
    }

    /// True when the source is a recording (the demo or a file) rather than live GPUs.
    pub fn is_recording(&self) -> bool {
        !matches!(self.origin, Origin::Live(_))
    }
}

/// Opens the source `spec` names. `one_shot`: a single read, whose slow fields are read inside
/// the poll instead of on a thread of their own.
pub fn open_source(spec: &SourceSpec, pace: Pace, one_shot: bool) -> Result<Source, Error> {
    let (backend, recording, recorded_with): (Box<dyn Backend>, _, _) = match &spec.origin {
        Origin::Demo => {
            let demo = std::io::Cursor::new(DEMO_RECORDING);
            let b = ReplayBackend::from_seekable(demo, DEMO_NAME, pace, &spec.replay)?;
            let with = b.header().backend.clone();
            (Box::new(b), Some(DEMO_NAME.into()), Some(with))
        }
        Origin::File(path) => {
            let b = ReplayBackend::open_with(path, pace, &spec.replay)?;
            let with = b.header().backend.clone();
            (Box::new(b), Some(recording_name(path)), Some(with))
        }
        Origin::Live(choice) => {
            let slow = if one_shot {
                SlowFields::InPoll
            } else {
                SlowFields::Background
            };
            let b = live::open_live(&LiveOptions {
                backend: *choice,
                sysfs_root: spec.sysfs_root.clone(),
                init_timeout: spec.init_timeout,
                slow_fields: slow,
                attribution: spec.attribution.clone(),
            })?;
            (b, None, None)
        }
    };
    let backend = with_faults_and_deadline(backend, spec.poll_timeout)?;
    let selected = select_devices(backend.devices(), &spec.devices)?;
    let recorded = backend
        .recorded_findings()
        .into_iter()
        .filter(|f| f.device.is_none_or(|d| selected.0.contains(&d)))
        .collect();
    Ok(Source {
        backend,
        selected,
        recording,
        recorded_with,
        recorded,
    })
}

/// What a recording at `path` is called in reports: `-` reads stdin.
pub fn recording_name(path: &std::path::Path) -> String {
    if path.as_os_str() == "-" {
        "stdin".to_string()
    } else {
        path.display().to_string()
    }
}

impl Source {
    /// A source over an already opened backend (a recording held in memory), every device
    /// selected.
    pub fn from_backend(
        backend: Box<dyn Backend>,
        recording: Option<String>,
    ) -> Result<Source, Error> {
        let selected = select_devices(backend.devices(), &[])?;
        let recorded = backend.recorded_findings();
        Ok(Source {
            backend,
            selected,
            recording,
            recorded_with: None,
            recorded,
        })
    }
}

/// Puts a source under the per-poll deadline when its polls can hang (live GPUs), after applying
/// the test fault schedule of `GPUDIAG_TEST_FAULTS` when one is set (a faulty source is always
/// guarded: its faults include hangs).
pub fn with_faults_and_deadline(
    backend: Box<dyn Backend>,
    poll_timeout: Duration,
) -> Result<Box<dyn Backend>, Error> {
    let faulty = fault::env_active();
    let backend = fault::from_env(backend).map_err(Error::Usage)?;
    if faulty || backend.pacing() == Pacing::Live {
        Ok(Box::new(PollDeadline::new(backend, poll_timeout)?))
    } else {
        Ok(backend)
    }
}

/// Resolves `--device` selectors (an index or a UUID) to device indices; none selects all.
pub fn select_devices(devices: &[DeviceInfo], selectors: &[String]) -> Result<DeviceFilter, Error> {
    if selectors.is_empty() {
        return Ok(DeviceFilter(devices.iter().map(|d| d.index).collect()));
    }
    selectors
        .iter()
        .map(|sel| {
            let sel = sel.trim();
            devices
                .iter()
                .find(|d| {
                    sel.parse::<u32>().is_ok_and(|i| i == d.index)
                        || d.uuid
                            .as_deref()
                            .is_some_and(|u| u.eq_ignore_ascii_case(sel))
                })
                .map(|d| d.index)
                .ok_or_else(|| {
                    let have: Vec<String> = devices
                        .iter()
                        .map(|d| {
                            format!("{} ({})", d.index, d.uuid.as_deref().unwrap_or("no uuid"))
                        })
                        .collect();
                    Error::Usage(format!(
                        "no GPU matches --device '{sel}'; this source has: {}",
                        if have.is_empty() {
                            "none".into()
                        } else {
                            have.join(", ")
                        }
                    ))
                })
        })
        .collect::<Result<_, _>>()
        .map(DeviceFilter)
}

/// The one pipeline every command and view feeds: each tick is sanitised (implausible values
/// dropped), pushed into the history, judged by the rules, handed to the sink, and kept as the
/// latest values and events. Nothing else ingests ticks, so every view of a source agrees.
///
/// What it keeps is bounded however long the source runs: the history bounds itself, tick times
/// are kept only within the retained window (without one, only the first, the last and a count),
/// and events within that window, at most [`MAX_EVENTS`] of them.
pub struct Pipeline {
    pub history: History,
    pub latest: BTreeMap<u32, Sample>,
    /// The time of every tick that carried samples, in order, within the retained window; without
    /// one, the latest only.
    tick_times: VecDeque<TimeMs>,
    /// The first such tick, and how many there were, kept or not.
    first_tick: Option<TimeMs>,
    ticks: u64,
    /// The newest events: those in the retained window, at most `MAX_EVENTS`.
    pub events: Vec<Event>,
    pub engine: RuleEngine,
    sanitiser: Sanitiser,
    /// Long-running consumers (serve, record, the terminal UI) and a check of a recording's end
    /// keep tick times and events for this long only.
    retain: Option<Duration>,
}

/// Events a pipeline keeps at most: a flood of XIDs (or a hostile recording of nothing else)
/// must not grow it without bound.
pub const MAX_EVENTS: usize = 16_384;
/// Tick times kept at most within a retained window: 14 h at the fastest sampling interval
/// (50 ms). Past it the oldest are forgotten, and the window's first time and count describe the
/// newest ones.
const MAX_TICK_TIMES: usize = 1 << 20;

/// What consumes the pipeline's ticks: a trace being built, a recording being written, the
/// Prometheus snapshot, the terminal UI.
pub trait Sink {
    /// Called once per tick, after the tick was sanitised, pushed into the history and judged
    /// (`raised`: the findings this tick raised), before it becomes the latest values.
    fn on_tick(
        &mut self,
        tick: &Tick,
        raised: &[Finding],
        pipeline: &Pipeline,
    ) -> Result<(), Error>;
}

/// A sink that keeps nothing beyond what the pipeline itself keeps (`check`).
pub struct NoSink;

impl Sink for NoSink {
    fn on_tick(&mut self, _: &Tick, _: &[Finding], _: &Pipeline) -> Result<(), Error> {
        Ok(())
    }
}

impl Pipeline {
    pub fn new(engine: RuleEngine) -> Self {
        Pipeline {
            history: History::default(),
            latest: BTreeMap::new(),
            tick_times: VecDeque::new(),
            first_tick: None,
            ticks: 0,
            events: Vec::new(),
            engine,
            sanitiser: Sanitiser::new(),
            retain: None,
        }
    }

    /// Keeps tick times and events for `window` only (the history bounds itself).
    pub fn retaining(mut self, window: Duration) -> Self {
        self.retain = Some(window);
        self
    }

    /// sanitise → history → rules → sink → latest values.
    pub fn push_into(&mut self, mut tick: Tick, sink: &mut dyn Sink) -> Result<(), Error> {
        let _timed = stats::Timed::start(Counter::PipelinePushes, Counter::PipelineNs);
        self.sanitiser.apply(&mut tick);
        if let Some(t) = tick.samples.iter().map(|s| s.time_ms).max() {
            self.first_tick.get_or_insert(t);
            self.ticks += 1;
            if self.retain.is_none() {
                self.tick_times.clear();
            }
            self.tick_times.push_back(t);
            if self.tick_times.len() > MAX_TICK_TIMES {
                self.tick_times.pop_front();
            }
        }
        for s in &tick.samples {
            self.history.push_sample(s);
        }
        let raised = self.engine.on_tick(&self.history, &tick);
        let delivered = sink.on_tick(&tick, &raised, self);
        for s in tick.samples {
            self.latest.insert(s.device, s);
        }
        self.events.extend(tick.events);
        if let Some(window) = self.retain {
            self.keep_last(window);
        }
        if self.events.len() > MAX_EVENTS {
            let excess = self.events.len() - MAX_EVENTS;
            self.events.drain(..excess);
        }
        delivered
    }

    /// `push_into` with no sink.
    pub fn push(&mut self, tick: Tick) {
        let _ = self.push_into(tick, &mut NoSink);
    }

    /// Forgets the sanitiser's memory of counters (a replay seeking backwards: counters going
    /// down are then the seek, not the GPU).
    pub fn rewind(&mut self) {
        self.sanitiser.reset();
    }

    /// Keeps only what falls in `(end − window, end]`, the same half-open window the history's
    /// statistics use, so the report's counts and its summary describe the same samples. Tick
    /// times are in order, so this pops from the front and costs nothing once trimmed: long
    /// sessions call it every tick.
    pub fn keep_last(&mut self, window: Duration) {
        let Some(&end) = self.tick_times.back() else {
            return;
        };
        let start = end.saturating_sub(window.as_millis() as u64);
        while self
            .tick_times
            .front()
            .is_some_and(|&t| t <= start && t != end)
        {
            self.tick_times.pop_front();
        }
        self.events.retain(|e| e.time_ms > start);
        // From here on only the window counts.
        self.retain = Some(window);
        self.first_tick = self.tick_times.front().copied();
        self.ticks = self.tick_times.len() as u64;
    }

    /// The first tick with samples: in the retained window, or of the whole run without one.
    pub fn first_ms(&self) -> Option<TimeMs> {
        match self.retain {
            Some(_) => self.tick_times.front().copied(),
            None => self.first_tick,
        }
    }

    pub fn last_ms(&self) -> Option<TimeMs> {
        self.tick_times.back().copied()
    }

    /// How many ticks carried samples: in the retained window, or in the whole run without one.
    pub fn tick_count(&self) -> u64 {
        match self.retain {
            Some(_) => self.tick_times.len() as u64,
            None => self.ticks,
        }
    }

    /// The findings of a report over `[start, the end]`: those raised in it, plus what is still
    /// active at its end.
    pub fn findings_since(&self, start: TimeMs) -> Vec<Finding> {
        // Events are judged by when they happened; windowed and environment findings by the
        // state at the end, plus those that held at some point of the span.
        let mut out: Vec<Finding> = self
            .engine
            .active()
            .into_iter()
            .filter(|f| {
                let event = families::lifetime(&f.id) == Lifetime::Event;
                f.last_seen() >= start || !event
            })
            .collect();
        for f in self.engine.raised() {
            let seen = out.iter().any(|a| a.id == f.id && a.device == f.device);
            if f.last_seen() >= start && !seen {
                out.push(f);
            }
        }
        crate::rules::sort(&mut out);
        out
    }
}

/// The rule engine every export judges its telemetry with: the same rules and thresholds as
/// `check`, raised tick by tick as the data arrives. Libraries are this host's only for live
/// sources; a recording from elsewhere says nothing about them.
pub fn engine_for(source: &Source, config: &Config) -> RuleEngine {
    let libraries = source
        .recording
        .is_none()
        .then(gpudiag_model::cuda_libraries::detect_libraries);
    RuleEngine::new(
        config.rules.clone(),
        source.devices(),
        Some(source.backend.host().clone()),
        libraries,
    )
}

/// How long a run samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// Until the source ends or the run is stopped.
    None,
    /// Live GPUs for this long (`ZERO`: one tick); a recording is read whole.
    Live(Duration),
    /// This long of the source's own time: wall time live, recorded time in a replay.
    SourceTime(Duration),
}

/// How a run samples its source.
pub struct RunOptions<'a> {
    /// Time between polls of live GPUs (a replay paces itself).
    pub interval: Duration,
    /// When to stop (besides `stop` and the source's own end).
    pub limit: Limit,
    /// Set from elsewhere (Ctrl-C) to end the run early; what was sampled is kept.
    pub stop: Option<&'a AtomicBool>,
}

/// Runs the one tick loop: samples `source` on its own thread and pushes every tick through
/// `pipeline` into `sink` until the source ends, the limit passes or `stop` is set. Returns
/// why sampling ended early, if it did (the caller decides whether that fails the command).
pub fn run(
    source: Source,
    pipeline: &mut Pipeline,
    opts: &RunOptions<'_>,
    sink: &mut dyn Sink,
) -> Result<Option<BackendError>, Error> {
    run_to_end(source, pipeline, opts, sink).map(|end| end.failure)
}

/// How a run ended.
pub struct RunEnd {
    /// Why sampling ended early, if it did.
    pub failure: Option<BackendError>,
    /// What the source learned while it was read, when its thread handed it back: a recording
    /// read as it streams knows its warnings and the findings it carries only at its end.
    pub notes: Option<SourceNotes>,
}

/// A source's notes for the user: its warnings and the findings it carried (for the selected
/// devices).
pub struct SourceNotes {
    pub warnings: Vec<String>,
    pub recorded: Vec<Finding>,
}

/// How long a run waits for its sampler thread to hand the backend back.
const HAND_BACK: Duration = Duration::from_secs(2);

/// [`run`], handing back what the source learned on the way.
pub fn run_to_end(
    source: Source,
    pipeline: &mut Pipeline,
    opts: &RunOptions<'_>,
    sink: &mut dyn Sink,
) -> Result<RunEnd, Error> {
    let limit = match opts.limit {
        Limit::None => None,
        Limit::Live(_) if source.recording.is_some() => None,
        Limit::Live(d) | Limit::SourceTime(d) => Some(d),
    };
    let filter = source.selected;
    let mut sampler = Sampler::spawn(source.backend, SamplerOptions::new(opts.interval, limit));
    let mut failure = None;
    loop {
        if opts.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            sampler.stop();
        }
        match sampler.recv_timeout(Duration::from_millis(100)) {
            Ok(SamplerMsg::Ticks { ticks, reset, .. }) => {
                if reset {
                    pipeline.rewind();
                }
                for t in ticks {
                    if let Err(e) = pipeline.push_into(filter.apply(t), sink) {
                        sampler.stop();
                        return Err(e);
                    }
                }
            }
            Ok(SamplerMsg::Ended(e)) => {
                failure = e;
                break;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let notes = sampler.join_within(HAND_BACK).map(|backend| SourceNotes {
        warnings: backend.source_warnings(),
        recorded: backend
            .recorded_findings()
            .into_iter()
            .filter(|f| f.device.is_none_or(|d| filter.0.contains(&d)))
            .collect(),
    });
    Ok(RunEnd { failure, notes })
}

/// One read of every device for `check --window 0`: the sampler's loop for one tick, on this
/// thread (see [`sampler::read_once`]). The source stays open (its topology is read after the
/// poll).
pub fn read_once(
    source: &mut Source,
    pipeline: &mut Pipeline,
    sink: &mut dyn Sink,
) -> Result<Option<BackendError>, Error> {
    match sampler::read_once(&mut *source.backend) {
        Ok(t) => pipeline
            .push_into(source.selected.apply(t), sink)
            .map(|()| None),
        Err(e) => Ok(Some(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;
    use gpudiag_model::sample::EventKind;

    fn pipeline() -> Pipeline {
        let devices = vec![DeviceInfo {
            index: 0,
            ..DeviceInfo::default()
        }];
        Pipeline::new(RuleEngine::new(RulesConfig::default(), devices, None, None))
    }

    /// One sample and one notice every 100 ms.
    fn tick(i: u64) -> Tick {
        let time_ms = 1_000_000 + i * 100;
        Tick {
            samples: vec![Sample::new(0, time_ms)],
            events: vec![Event {
                time_ms,
                device: None,
                kind: EventKind::Notice {
                    message: format!("tick {i}"),
                },
            }],
        }
    }

    #[test]
    fn a_long_run_keeps_counts_not_every_tick_time_and_event() {
        let mut p = pipeline();
        let n = MAX_EVENTS as u64 * 2;
        for i in 0..n {
            p.push(tick(i));
        }
        assert_eq!(p.tick_count(), n);
        assert_eq!(p.first_ms(), Some(1_000_000));
        assert_eq!(p.last_ms(), Some(1_000_000 + (n - 1) * 100));
        assert_eq!(p.tick_times.len(), 1);
        assert_eq!(p.events.len(), MAX_EVENTS);
        // The newest are kept.
        assert_eq!(p.events.last().map(|e| e.time_ms), p.last_ms());
    }

    #[test]
    fn a_retained_window_counts_only_its_ticks() {
        let mut p = pipeline().retaining(Duration::from_secs(10));
        for i in 0..1000 {
            p.push(tick(i));
        }
        // (end − 10 s, end]: 100 ticks.
        assert_eq!(p.tick_count(), 100);
        assert_eq!(p.first_ms(), Some(1_000_000 + 900 * 100));
        assert_eq!(p.events.len(), 100);

        // Trimming a longer window to its end gives the same.
        let mut r = pipeline().retaining(Duration::from_secs(3600));
        for i in 0..1000 {
            r.push(tick(i));
        }
        r.keep_last(Duration::from_secs(10));
        assert_eq!(r.tick_count(), 100);
        assert_eq!(r.first_ms(), Some(1_000_000 + 900 * 100));
    }
}
