//! The session: one place that opens any source (live GPUs, the demo, a recording or a bundle),
//! sets up the pipeline it runs into with what judges it (the kernel log, the CUDA libraries,
//! the configuration), runs it into a sink, and judges a span of it ([`Session`]: `check`,
//! `trace`, `serve`, `run` and the terminal UI start there).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::error::Error;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{DeviceInfo, HostInfo};
use gpudiag_model::stats;
use gpudiag_model::topology::Topology;
use gpudiag_probes::runner::ProbeReport;
use gpudiag_telemetry::attribution::AttributionOptions;
use gpudiag_telemetry::live::{self, LiveBackend, LiveOptions};
use gpudiag_telemetry::nvml::SlowFields;
use gpudiag_telemetry::poll_deadline::PollDeadline;
use gpudiag_telemetry::replay::{Pace, ReplayBackend, ReplayOptions};
use gpudiag_telemetry::sampler::{self, Sampler, SamplerControl, SamplerMsg, SamplerOptions};
use gpudiag_telemetry::{Backend, BackendError, Pacing, Tick, fault};

use crate::config::{Config, RulesConfig};
use crate::host_facts::{HostFacts, XidRead, read_kernel_xids};
use crate::judgement::{self, Judgement, KernelLog, Moment, Seen, Span};
use crate::pipeline::{Pipeline, Sink};
use crate::rules::engine::RuleEngine;

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
    /// Keeps only the selected devices' samples, events (host-wide events stay) and RAS answers
    /// (those asked for a job on them).
    pub fn apply(&self, mut tick: Tick) -> Tick {
        tick.samples.retain(|s| self.0.contains(&s.device));
        tick.events
            .retain(|e| e.device.is_none_or(|d| self.0.contains(&d)));
        tick.ras.retain(|a| {
            a.for_devices.is_empty() || a.for_devices.iter().any(|d| self.0.contains(d))
        });
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
/// Selectors that match no device are all named in one [`Error::NoSuchDevice`].
pub fn select_devices(devices: &[DeviceInfo], selectors: &[String]) -> Result<DeviceFilter, Error> {
    if selectors.is_empty() {
        return Ok(DeviceFilter(devices.iter().map(|d| d.index).collect()));
    }
    let mut selected = Vec::new();
    let mut unmatched = Vec::new();
    for sel in selectors {
        let sel = sel.trim();
        let found = devices.iter().find(|d| {
            sel.parse::<u32>().is_ok_and(|i| i == d.index)
                || d.uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(sel))
        });
        match found {
            Some(d) => selected.push(d.index),
            None => unmatched.push(sel.to_owned()),
        }
    }
    if unmatched.is_empty() {
        return Ok(DeviceFilter(selected.into_iter().collect()));
    }
    let have: Vec<String> = devices
        .iter()
        .map(|d| format!("{} ({})", d.index, d.uuid.as_deref().unwrap_or("no uuid")))
        .collect();
    let quoted: Vec<String> = unmatched.iter().map(|s| format!("'{s}'")).collect();
    Err(Error::NoSuchDevice {
        message: format!(
            "no GPU matches --device {}; this source has: {}",
            quoted.join(", "),
            if have.is_empty() {
                "none".into()
            } else {
                have.join(", ")
            }
        ),
        selectors: unmatched,
    })
}

/// The one way a command opens a source and sets up what judges it: the source, a pipeline
/// whose rules use the configuration's thresholds, and what the session saw besides telemetry.
/// What differs between commands is said here, by the builder's options, not by copies:
///
/// - [`Setup::with_kernel_log`]: this host's kernel-log XIDs from before the session
///   (`check`, `trace`, `serve`); `run` reads none, judging only the command's own time.
/// - [`Setup::with_libraries`]: this host's CUDA libraries for the rules.
/// - [`Setup::retaining`]: a long-running session keeps tick times and events for a window.
///
/// Both host facts describe this host's GPUs only, so a recording's session reads neither. When
/// both are asked and the source is still to be opened, they are read while it opens (NVML's
/// initialisation is most of a single read's time).
pub struct Session {
    /// The source until it is run (a run hands it to the sampler thread).
    source: Option<Source>,
    pub pipeline: Pipeline,
    /// The selected devices.
    pub devices: Vec<DeviceInfo>,
    /// The source's warnings; a recording read as it streams knows them only at its end, which
    /// [`Session::run`] takes in.
    pub warnings: Vec<String>,
    witness: Witness,
    judged_with: JudgedWith,
}

/// What a session saw besides telemetry, kept apart from its pipeline so a sink can judge while
/// the pipeline feeds it.
struct Witness {
    /// The findings the source carried for the selected devices (likewise complete only once
    /// the source has been run).
    recorded: Vec<Finding>,
    /// This host's kernel-log XIDs, and before what they were logged ("before this check").
    kernel_log: Option<(XidRead, &'static str)>,
    /// Every device the source has, to place a kernel-log XID by its PCI address.
    host_devices: Vec<DeviceInfo>,
}

impl Witness {
    fn seen(&self) -> Seen<'_> {
        Seen {
            recorded: &self.recorded,
            kernel_log: self.kernel_log.as_ref().map(|(xids, before)| KernelLog {
                xids,
                host_devices: &self.host_devices,
                before,
            }),
            probes: None,
        }
    }
}

/// What a session's pipeline is built from, again when the session starts over.
struct JudgedWith {
    host: HostInfo,
    rules: RulesConfig,
    /// This host's CUDA libraries, when asked for and the source is this host's.
    libraries: Option<Vec<LibraryInfo>>,
    current_phase: bool,
    retain: Option<Duration>,
    /// The GPUs are this host's live ones: gpudiag's own process is no job's holder.
    this_host: bool,
}

impl JudgedWith {
    fn pipeline(&self, devices: &[DeviceInfo]) -> Pipeline {
        let mut engine = RuleEngine::new(
            self.rules.clone(),
            devices.to_vec(),
            Some(self.host.clone()),
            self.libraries.clone(),
        );
        if self.current_phase {
            engine = engine.with_current_phase();
        }
        if self.this_host {
            engine = engine.excluding_own_process();
        }
        let pipeline = Pipeline::new(engine);
        match self.retain {
            Some(window) => pipeline.retaining(window),
            None => pipeline,
        }
    }
}

/// How a session is set up: see [`Session`].
pub struct Setup<'a> {
    config: &'a Config,
    pace: Pace,
    one_shot: bool,
    kernel_log: Option<&'static str>,
    libraries: bool,
    retain: Option<Duration>,
    current_phase: bool,
    node_name: Option<String>,
    /// A fed session's ticks are this host's live GPUs (an opened source says for itself).
    fed_this_host: bool,
}

impl Session {
    /// A session judged with `config`'s thresholds; its source is read as fast as it allows,
    /// sampled on a thread of its own, unless the setup says otherwise.
    pub fn setup(config: &Config) -> Setup<'_> {
        Setup {
            config,
            pace: Pace::AsFastAsPossible,
            one_shot: false,
            kernel_log: None,
            libraries: false,
            retain: None,
            current_phase: false,
            node_name: None,
            fed_this_host: false,
        }
    }

    /// The host judged: the source's, named as the setup said.
    pub fn host(&self) -> &HostInfo {
        &self.judged_with.host
    }

    /// Forgets every tick and finding and judges from scratch (a replay seeking backwards).
    pub fn start_over(&mut self) {
        self.pipeline = self.judged_with.pipeline(&self.devices);
    }

    /// This host's CUDA libraries the rules judge with, when asked for and the source is this
    /// host's.
    pub fn libraries(&self) -> Option<&[LibraryInfo]> {
        self.judged_with.libraries.as_deref()
    }

    /// Judges with these thresholds and this host's libraries from now on, starting over.
    pub fn set_rules(&mut self, rules: RulesConfig, libraries: Option<Vec<LibraryInfo>>) {
        self.judged_with.rules = rules;
        self.judged_with.libraries = libraries;
        self.start_over();
    }

    /// The findings the source carried, when they are learnt apart from it.
    pub fn set_recorded(&mut self, findings: Vec<Finding>) {
        self.witness.recorded = findings;
    }

    /// This host's kernel-log XIDs, when read apart from the session (`before`: see
    /// [`Setup::with_kernel_log`]).
    pub fn set_kernel_log(&mut self, xids: XidRead, before: &'static str) {
        self.witness.kernel_log = Some((xids, before));
    }

    /// The source, until the session is run.
    pub fn source(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    pub fn source_mut(&mut self) -> Option<&mut Source> {
        self.source.as_mut()
    }

    /// Runs the source into `sink` through the pipeline (see [`run_to_end`]), and takes in what
    /// the source learned on the way (its warnings, the findings it carried). Returns why
    /// sampling ended early, if it did.
    pub fn run(
        &mut self,
        opts: &RunOptions<'_>,
        sink: &mut dyn Sink,
    ) -> Result<Option<BackendError>, Error> {
        let Some(source) = self.source.take() else {
            return Ok(None);
        };
        let end = run_to_end(source, &mut self.pipeline, opts, sink)?;
        Ok(self.take_in(end))
    }

    /// [`Session::run`], judging what the session holds now after every tick and handing that
    /// to `sink` (`serve` publishes what is wrong now as it happens).
    pub fn run_judging(
        &mut self,
        opts: &RunOptions<'_>,
        sink: &mut dyn JudgingSink,
    ) -> Result<Option<BackendError>, Error> {
        let Some(source) = self.source.take() else {
            return Ok(None);
        };
        let mut judging = JudgeEachTick {
            witness: &self.witness,
            sink,
        };
        let end = run_to_end(source, &mut self.pipeline, opts, &mut judging)?;
        Ok(self.take_in(end))
    }

    /// What the source learned while it was read.
    fn take_in(&mut self, end: RunEnd) -> Option<BackendError> {
        if let Some(notes) = end.notes {
            self.warnings = notes.warnings;
            self.witness.recorded = notes.recorded;
        }
        end.failure
    }

    /// One read of every device (see [`read_once`]); the source stays open.
    pub fn read_once(&mut self, sink: &mut dyn Sink) -> Result<Option<BackendError>, Error> {
        match self.source.as_mut() {
            Some(source) => read_once(source, &mut self.pipeline, sink),
            None => Ok(None),
        }
    }

    /// Hands the source back, once it is no longer needed here (to close it elsewhere).
    pub fn take_source(&mut self) -> Option<Source> {
        self.source.take()
    }

    /// What the session saw besides its telemetry, with `probes` when a probe run measured.
    pub fn seen<'s>(&'s self, probes: Option<&'s ProbeReport>) -> Seen<'s> {
        Seen {
            probes,
            ..self.witness.seen()
        }
    }

    /// The judgement at the end of `span` (see [`judgement::judge`]).
    pub fn judge(&mut self, span: Span, probes: Option<&ProbeReport>) -> Judgement {
        let seen = Seen {
            probes,
            ..self.witness.seen()
        };
        judgement::judge(&mut self.pipeline, Moment::End(span), &seen)
    }

    /// The judgement as things stand, which changes nothing.
    pub fn judge_now(&self, probes: Option<&ProbeReport>) -> Judgement {
        judgement::judge_now(&self.pipeline, &self.seen(probes))
    }
}

impl Setup<'_> {
    /// Reads the source at `pace` (one still to be opened).
    pub fn pace(mut self, pace: Pace) -> Self {
        self.pace = pace;
        self
    }

    /// Opens the source for a single read, its slow fields read inside the poll (one still to
    /// be opened).
    pub fn one_shot(mut self, one_shot: bool) -> Self {
        self.one_shot = one_shot;
        self
    }

    /// Judges the XIDs this host's kernel logged before the session (`before`, in words:
    /// "before this check"): NVML reports only those that happen while it listens.
    pub fn with_kernel_log(mut self, before: &'static str) -> Self {
        self.kernel_log = Some(before);
        self
    }

    /// Judges with this host's CUDA libraries.
    pub fn with_libraries(mut self) -> Self {
        self.libraries = true;
        self
    }

    /// Keeps tick times and events for `window` only (see [`Pipeline::retaining`]).
    pub fn retaining(mut self, window: Duration) -> Self {
        self.retain = Some(window);
        self
    }

    /// The engine also finds the phase each device's window ends in (the terminal UI's header
    /// leads with it).
    pub fn with_current_phase(mut self) -> Self {
        self.current_phase = true;
        self
    }

    /// The ticks a fed session is given come from this host's live GPUs (`live`), not from a
    /// recording: only then is gpudiag's own pid known to hold no job's memory.
    pub fn fed_from_this_host(mut self, live: bool) -> Self {
        self.fed_this_host = live;
        self
    }

    /// Names this host `node` (a pod's host name is the pod's; the node's comes from the
    /// downward API): everything judged here, job keys included, carries it, so a job key
    /// qualified by the host reads alike in every series. A recording keeps its own host.
    pub fn named_node(mut self, node: Option<String>) -> Self {
        self.node_name = node.filter(|n| !n.is_empty());
        self
    }

    /// A session fed its ticks from elsewhere (the terminal UI samples, seeks and pauses its
    /// source itself): `devices` are the session's GPUs, and place the kernel log's XIDs. The
    /// kernel log and libraries, read while the UI's source opened, are given later
    /// ([`Session::set_kernel_log`], [`Session::set_rules`]).
    pub fn fed(self, host: HostInfo, devices: Vec<DeviceInfo>) -> Session {
        let judged_with = self.judged_with(host, None, self.fed_this_host);
        Session {
            source: None,
            pipeline: judged_with.pipeline(&devices),
            witness: Witness {
                recorded: Vec::new(),
                kernel_log: None,
                host_devices: devices.clone(),
            },
            devices,
            warnings: Vec::new(),
            judged_with,
        }
    }

    /// Opens the source `spec` names and sets the session up over it.
    pub fn open(self, spec: &SourceSpec) -> Result<Session, Error> {
        // The log and the library search touch no GPU: when both are asked, they are read while
        // the source opens.
        let facts = (self.kernel_log.is_some() && self.libraries && !spec.is_recording())
            .then(HostFacts::start);
        let source = open_source(spec, self.pace, self.one_shot)?;
        stats::mark("source_opened");
        let facts = facts.map(HostFacts::join);
        stats::mark("host_facts_read");
        Ok(self.set_up(source, facts))
    }

    /// Sets the session up over a source already open (a recording held in memory).
    pub fn over(self, source: Source) -> Session {
        self.set_up(source, None)
    }

    /// `facts`: this host's kernel-log XIDs and libraries, when already read.
    fn set_up(self, source: Source, facts: Option<(XidRead, Vec<LibraryInfo>)>) -> Session {
        let this_host = source.is_this_host();
        let (mut xids, mut libraries) = match facts {
            Some((x, l)) if this_host => (Some(x), Some(l)),
            _ => (None, None),
        };
        if this_host && self.kernel_log.is_some() && xids.is_none() {
            xids = Some(read_kernel_xids());
        }
        if this_host && self.libraries && libraries.is_none() {
            libraries = Some(gpudiag_model::cuda_libraries::detect_libraries());
        }
        let kernel_log = self.kernel_log.zip(xids).map(|(before, x)| (x, before));
        let libraries = libraries.filter(|_| self.libraries);
        let mut host = source.backend.host().clone();
        if this_host && let Some(node) = &self.node_name {
            host.hostname = Some(node.clone());
        }
        let judged_with = self.judged_with(host, libraries, this_host);
        let devices = source.devices();
        Session {
            pipeline: judged_with.pipeline(&devices),
            devices,
            witness: Witness {
                recorded: source.recorded.clone(),
                kernel_log,
                host_devices: source.backend.devices().to_vec(),
            },
            warnings: source.backend.source_warnings(),
            source: Some(source),
            judged_with,
        }
    }

    fn judged_with(
        &self,
        host: HostInfo,
        libraries: Option<Vec<LibraryInfo>>,
        this_host: bool,
    ) -> JudgedWith {
        JudgedWith {
            this_host,
            host,
            rules: self.config.rules.clone(),
            libraries,
            current_phase: self.current_phase,
            retain: self.retain,
        }
    }
}

/// What consumes a session's ticks together with the judgement as it stands after each.
pub trait JudgingSink {
    /// Called once per tick, after the tick was judged into `judged` (see [`Sink::on_tick`]).
    fn on_judged(
        &mut self,
        tick: &Tick,
        judged: Judgement,
        pipeline: &Pipeline,
    ) -> Result<(), Error>;
}

struct JudgeEachTick<'s, 'k> {
    witness: &'s Witness,
    sink: &'k mut dyn JudgingSink,
}

impl Sink for JudgeEachTick<'_, '_> {
    fn on_tick(&mut self, tick: &Tick, _: &[Finding], pipeline: &Pipeline) -> Result<(), Error> {
        let judged = judgement::judge_now(pipeline, &self.witness.seen());
        self.sink.on_judged(tick, judged, pipeline)
    }
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
                let mut latest = None;
                for t in ticks {
                    latest = latest.max(t.time_ms());
                    if let Err(e) = pipeline.push_into(filter.apply(t), sink) {
                        sampler.stop();
                        return Err(e);
                    }
                }
                // NCCL RAS for the jobs that want it; a replay ignores the request.
                if let Some(now) = latest {
                    for q in pipeline.engine.ras_queries(now) {
                        sampler.send(SamplerControl::Ras(q));
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
