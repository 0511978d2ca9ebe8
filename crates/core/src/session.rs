//! The session: one place that opens any source (live GPUs, the demo, a recording or a bundle)
//! and the pipeline state every command and view feeds its ticks into (history, latest values,
//! events, and the rule engine judging them as they arrive).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use gpudiag_model::error::Error;
use gpudiag_model::finding::Finding;
use gpudiag_model::topology::Topology;
use gpudiag_telemetry::live::{self, LiveBackend, LiveOptions};
use gpudiag_telemetry::nvml::SlowFields;
use gpudiag_telemetry::poll_deadline::PollDeadline;
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::{Backend, DeviceInfo, Event, Pacing, Sample, Tick, TimeMs, fault};

use crate::config::Config;
use crate::history::History;
use crate::rules::RuleEngine;

/// The demo recording shipped inside the binary: a real GPU going from idle to load and back.
pub const DEMO_RECORDING: &[u8] = include_bytes!("../../../assets/demo/demo.ndjson.gz");
pub const DEMO_NAME: &str = "demo.ndjson.gz (bundled)";

/// An opened telemetry source with the devices the user selected.
pub struct Source {
    pub backend: Box<dyn Backend>,
    pub selected: DeviceFilter,
    /// The recording's name (a path, or the demo's); `None` for live GPUs.
    pub recording: Option<String>,
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
}

impl SourceSpec {
    /// True when the source is a recording (the demo or a file) rather than live GPUs.
    pub fn is_recording(&self) -> bool {
        !matches!(self.origin, Origin::Live(_))
    }
}

/// Opens the source `spec` names. `one_shot`: a single read, whose slow fields are read inside
/// the poll instead of on a thread of their own.
pub fn open_source(spec: &SourceSpec, pace: Pace, one_shot: bool) -> Result<Source, Error> {
    let (backend, recording): (Box<dyn Backend>, Option<String>) = match &spec.origin {
        Origin::Demo => {
            let b = ReplayBackend::from_reader(DEMO_RECORDING, pace)?;
            (Box::new(b), Some(DEMO_NAME.into()))
        }
        Origin::File(path) => {
            let b = gpudiag_telemetry::bundle::open_bundle_recording(path, pace)?;
            (Box::new(b), Some(path.display().to_string()))
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
            })?;
            (b, None)
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
        recorded,
    })
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

/// Everything the pipeline gathered from a source, with the rules judging it as it arrives.
pub struct Pipeline {
    pub history: History,
    pub latest: BTreeMap<u32, Sample>,
    /// The time of every tick that carried samples, in order.
    pub tick_times: Vec<TimeMs>,
    pub events: Vec<Event>,
    pub engine: RuleEngine,
}

impl Pipeline {
    pub fn new(engine: RuleEngine) -> Self {
        Pipeline {
            history: History::default(),
            latest: BTreeMap::new(),
            tick_times: Vec::new(),
            events: Vec::new(),
            engine,
        }
    }

    pub fn push(&mut self, tick: Tick) {
        if let Some(t) = tick.samples.iter().map(|s| s.time_ms).max() {
            self.tick_times.push(t);
        }
        for s in &tick.samples {
            self.history.push_sample(s);
        }
        self.engine.on_tick(&self.history, &tick);
        for s in tick.samples {
            self.latest.insert(s.device, s);
        }
        self.events.extend(tick.events);
    }

    /// Keeps only what falls in `(end − window, end]`, the same half-open window the history's
    /// statistics use, so the report's counts and its summary describe the same samples.
    pub fn keep_last(&mut self, window: Duration) {
        let Some(&end) = self.tick_times.last() else {
            return;
        };
        let start = end.saturating_sub(window.as_millis() as u64);
        self.tick_times.retain(|&t| t > start || t == end);
        self.events.retain(|e| e.time_ms > start);
    }

    pub fn first_ms(&self) -> Option<TimeMs> {
        self.tick_times.first().copied()
    }

    pub fn last_ms(&self) -> Option<TimeMs> {
        self.tick_times.last().copied()
    }

    /// The findings a check reports: every problem raised while sampling, or, when only the end
    /// of a recording is judged, those raised in that end plus what is still active at its end.
    pub fn findings(&self, window: Option<Duration>) -> Vec<Finding> {
        let raised = self.engine.raised();
        let (Some(window), Some(end)) = (window, self.last_ms()) else {
            return raised;
        };
        // The same half-open window as `keep_last`: (end − window, end].
        let start = end.saturating_sub(window.as_millis() as u64) + 1;
        // Events are judged by when they happened; windowed and environment findings by the
        // state at the end.
        let mut out: Vec<Finding> = self
            .engine
            .active()
            .into_iter()
            .filter(|f| {
                let event_like =
                    f.id.starts_with("errors.xid_") || crate::rules::health::is_health(&f.id);
                f.time_ms >= start || !event_like
            })
            .collect();
        for f in raised {
            let seen = out.iter().any(|a| a.id == f.id && a.device == f.device);
            if f.time_ms >= start && !seen {
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

/// Adds the findings a recording carried that the rules did not raise again themselves.
pub fn with_recorded(mut findings: Vec<Finding>, recorded: &[Finding]) -> Vec<Finding> {
    for f in recorded {
        if !findings
            .iter()
            .any(|g| g.id == f.id && g.device == f.device)
        {
            findings.push(f.clone());
        }
    }
    crate::rules::sort(&mut findings);
    findings
}
