//! What each subcommand does: open a telemetry source, run the pipeline, produce the output.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{BackendChoice, CheckArgs, ProbeArgs, RecordArgs, SourceArgs, SuiteName};
use crate::config::Config;
use crate::error::Error;
use crate::history::History;
use crate::report::check::{
    self, CHECK_SCHEMA_VERSION, CheckReport, DeviceReport, SourceInfo, ToolInfo, WindowInfo,
};
use crate::report::environment;
use crate::rules::{self, RuleEngine};
use crate::telemetry::guard::Guarded;
use crate::telemetry::live::{self, LiveBackend, LiveOptions};
use crate::telemetry::nvml::SlowFields;
use crate::telemetry::recording::{Header, Record, RecordingError, RecordingWriter};
use crate::telemetry::replay::{Pace, ReplayBackend};
use crate::telemetry::sampler::{Sampler, SamplerMsg};
use crate::telemetry::sanity::Sanitiser;
use crate::telemetry::{
    Backend, DeviceInfo, Event, EventKind, Pacing, Sample, Tick, TimeMs, fault, now_ms,
};

/// The demo recording shipped inside the binary: a real GPU going from idle to load and back.
pub const DEMO_RECORDING: &[u8] = include_bytes!("../assets/demo/demo.ndjson.gz");
pub const DEMO_NAME: &str = "demo.ndjson.gz (bundled)";

/// An opened telemetry source with the devices the user selected.
pub struct Source {
    pub backend: Box<dyn Backend>,
    pub selected: DeviceFilter,
    pub recording: Option<String>,
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
    pub fn topology(&self) -> Option<crate::topology::Topology> {
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

/// Opens live GPUs (NVML, ROCm SMI, amdgpu sysfs), a recording, or the demo, as the flags say.
pub fn open_source(args: &SourceArgs, pace: Pace, one_shot: bool) -> Result<Source, Error> {
    let is_replay = args.demo || args.replay.is_some();
    let live_choice = match (args.backend, is_replay) {
        (BackendChoice::Replay, false) => {
            return Err(Error::Usage(
                "--backend replay needs --replay FILE (or --demo)".into(),
            ));
        }
        (BackendChoice::Auto | BackendChoice::Replay, _) => LiveBackend::Auto,
        (other, true) => {
            return Err(Error::Usage(format!(
                "--backend {} reads live GPUs; it cannot go with --replay or --demo",
                format!("{other:?}").to_lowercase()
            )));
        }
        (BackendChoice::Nvml, false) => LiveBackend::Nvml,
        (BackendChoice::Rocm, false) => LiveBackend::Rocm,
        (BackendChoice::Sysfs, false) => LiveBackend::Sysfs,
    };
    let (backend, recording): (Box<dyn Backend>, Option<String>) = if args.demo {
        let b = ReplayBackend::from_reader(DEMO_RECORDING, pace)?;
        (Box::new(b), Some(DEMO_NAME.into()))
    } else if let Some(path) = &args.replay {
        let b = crate::report::bundle::open_bundle_recording(path, pace)?;
        (Box::new(b), Some(path.display().to_string()))
    } else {
        let slow = if one_shot {
            SlowFields::InPoll
        } else {
            SlowFields::Background
        };
        let b = live::open_live(&LiveOptions {
            backend: live_choice,
            sysfs_root: args.sysfs_root.clone(),
            init_timeout: args.init_timeout,
            slow_fields: slow,
        })?;
        (b, None)
    };
    let backend = harden(backend, args.poll_timeout)?;
    let selected = select_devices(backend.devices(), &args.devices)?;
    Ok(Source {
        backend,
        selected,
        recording,
    })
}

/// Puts a source under the per-poll deadline when its polls can hang (live GPUs), after applying
/// the test fault schedule of `GPUDIAG_TEST_FAULTS` when one is set (a faulty source is always
/// guarded: its faults include hangs).
pub fn harden(
    backend: Box<dyn Backend>,
    poll_timeout: Duration,
) -> Result<Box<dyn Backend>, Error> {
    let faulty = fault::env_active();
    let backend = fault::from_env(backend).map_err(Error::Usage)?;
    if faulty || backend.pacing() == Pacing::Live {
        Ok(Box::new(Guarded::new(backend, poll_timeout)?))
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
pub struct Collected {
    pub history: History,
    pub latest: BTreeMap<u32, Sample>,
    /// The time of every tick that carried samples, in order.
    pub tick_times: Vec<TimeMs>,
    pub events: Vec<Event>,
    pub engine: RuleEngine,
}

impl Collected {
    pub fn new(engine: RuleEngine) -> Self {
        Collected {
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
    pub fn findings(&self, window: Option<Duration>) -> Vec<rules::Finding> {
        let raised = self.engine.raised();
        let (Some(window), Some(end)) = (window, self.last_ms()) else {
            return raised;
        };
        // The same half-open window as `keep_last`: (end − window, end].
        let start = end.saturating_sub(window.as_millis() as u64) + 1;
        // Events are judged by when they happened; windowed and environment findings by the
        // state at the end.
        let mut out: Vec<rules::Finding> = self
            .engine
            .active()
            .into_iter()
            .filter(|f| {
                let event_like = f.id.starts_with("errors.xid_") || rules::health::is_health(&f.id);
                f.time_ms >= start || !event_like
            })
            .collect();
        for f in raised {
            let seen = out.iter().any(|a| a.id == f.id && a.device == f.device);
            if f.time_ms >= start && !seen {
                out.push(f);
            }
        }
        rules::sort(&mut out);
        out
    }
}

/// `gpudiag check`.
pub fn check(args: &CheckArgs, config: &Config) -> Result<CheckReport, Error> {
    let is_replay = args.source.demo || args.source.replay.is_some();
    let single_read = !is_replay && args.window == Some(Duration::ZERO);
    let source = open_source(&args.source, Pace::AsFastAsPossible, single_read)?;
    let libraries = (!is_replay).then(environment::detect_libraries);
    // A replay reads the whole recording and keeps the window's end; a live check samples for
    // exactly the window.
    let limit = if is_replay {
        None
    } else {
        Some(args.window.unwrap_or(Duration::from_secs(1)))
    };
    let devices = source.devices();
    let host = source.backend.host().clone();
    let backend_name = source.backend.name().to_owned();
    let source_warnings = source.backend.source_warnings();
    let recording = source.recording.clone();

    let mut source = source;
    let engine = RuleEngine::new(
        config.rules.clone(),
        devices.clone(),
        Some(host.clone()),
        libraries.clone(),
    );
    let mut collected = Collected::new(engine);
    let selected = source.selected.clone();
    // A check is one report: let the slow fields (PCIe throughput, processes) arrive first, so
    // even a single read has them. One slow round takes about 45 ms per GPU, in parallel.
    source
        .backend
        .wait_for_slow_fields(Duration::from_millis(500));
    let mut failure = None;
    let topology;
    if limit == Some(Duration::ZERO) {
        // A single read needs no sampler thread; every thread that calls NVML costs resident
        // memory, and `check --window 0` is held to nvidia-smi's footprint.
        match source.backend.poll() {
            Ok(mut t) => {
                Sanitiser::new().apply(&mut t);
                collected.push(selected.apply(t));
            }
            Err(e) => failure = Some(e),
        }
        // Asked after the poll: the backend reads it on its own thread meanwhile.
        topology = source.topology();
    } else {
        topology = source.topology();
        let mut sampler = Sampler::spawn(source.backend, args.interval, limit);
        for msg in sampler.rx.iter() {
            match msg {
                SamplerMsg::Tick(t) => collected.push(selected.apply(t)),
                SamplerMsg::Ended(e) => {
                    failure = e;
                    break;
                }
            }
        }
        sampler.stop();
    }
    let mut warnings = source_warnings;
    match failure {
        Some(e) if collected.tick_times.is_empty() => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if collected.tick_times.is_empty() {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    for e in &collected.events {
        if let EventKind::Notice { message } = &e.kind
            && !warnings.contains(message)
        {
            warnings.push(message.clone());
        }
    }
    collected.engine.finish(&collected.history);
    // Replays with a window judge only its end; live runs sampled exactly the window.
    let summary_window = if is_replay { args.window } else { None };
    if let Some(w) = summary_window {
        collected.keep_last(w);
    }
    let mut findings = collected.findings(summary_window);

    let probed = match args.probes {
        Some(suite) => Some(run_probes(
            suite,
            &devices
                .iter()
                .map(|d| d.index.to_string())
                .collect::<Vec<_>>(),
            args.force,
            None,
        )?),
        None => None,
    };
    if let Some(p) = &probed {
        let now = collected.last_ms().unwrap_or_else(now_ms);
        findings.extend(crate::probes::runner::findings(&p.devices, now));
        findings.extend(crate::probes::runner::host_findings(&p.host, now));
        for dp in &p.devices {
            let Some(info) = devices.iter().find(|d| d.index == dp.index) else {
                continue;
            };
            let measured: Vec<crate::probes::Measurement> = dp
                .results
                .iter()
                .filter(|r| r.probe == "bandwidth")
                .flat_map(|r| r.metrics.iter().cloned())
                .collect();
            findings.extend(rules::pcie::probe_bandwidth(
                info,
                collected.latest.get(&dp.index),
                &measured,
                now,
            ));
        }
        findings.extend(rules::peers::compare(
            &p.devices,
            config.rules.peers.margin,
            now,
        ));
        rules::sort(&mut findings);
    }
    let fail_on = args.fail_on.into();
    let exit_code = check::exit_code_for(&findings, fail_on);
    let status = check::status_of(&findings);
    let (mut per_device, host_findings) = check::split_findings(findings);
    let device_reports = devices
        .into_iter()
        .map(|info| DeviceReport {
            summary: check::summarise(&collected.history, info.index, summary_window),
            latest: collected.latest.get(&info.index).cloned(),
            findings: per_device.remove(&info.index).unwrap_or_default(),
            probes: probed
                .as_ref()
                .and_then(|p| p.devices.iter().find(|d| d.index == info.index).cloned()),
            info,
        })
        .collect();
    let covered_ms = match (collected.first_ms(), collected.last_ms()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    Ok(CheckReport {
        schema_version: CHECK_SCHEMA_VERSION,
        tool: ToolInfo::this(),
        generated_ms: now_ms(),
        host,
        source: SourceInfo {
            backend: backend_name,
            recording,
            warnings,
        },
        libraries,
        window: WindowInfo {
            requested_s: if is_replay {
                args.window.map(|w| w.as_secs_f64())
            } else {
                Some(limit.unwrap_or_default().as_secs_f64())
            },
            covered_s: covered_ms as f64 / 1000.0,
            ticks: collected.tick_times.len() as u64,
            start_ms: collected.first_ms(),
            end_ms: collected.last_ms(),
        },
        devices: device_reports,
        topology,
        host_probes: probed.as_ref().map(|p| p.host.clone()),
        host_findings,
        status,
        fail_on,
        exit_code,
    })
}

/// Runs a probe suite on the selected GPUs (NVML indices or UUIDs); Ctrl-C stops it cleanly.
fn run_probes(
    suite: SuiteName,
    devices: &[String],
    force: bool,
    only: Option<&[String]>,
) -> Result<crate::probes::runner::ProbeReport, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // A handler may already be installed (the `probe` command installs its own); then that
    // one's flag is not ours, and Ctrl-C ends the process, whose exit frees the GPU memory.
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
    let init_timeout = Duration::from_secs(20);
    let _watchdog = hang_watchdog(suite, devices.len(), init_timeout);
    run_probes_with(suite, devices, force, only, stop, init_timeout)
}

/// GPUs assumed when `--device` names none, for the hang bound: more than most hosts have.
const HANG_BOUND_GPUS: u32 = 8;
/// Time past a suite's deadline after which a probe still running is taken as hung.
const HANG_GRACE: Duration = Duration::from_secs(30);

/// A probe checks its deadline between steps, but a CUDA synchronisation on a hung GPU never
/// returns to check it, and Ctrl-C only sets a flag. Past (deadline + context timeout + grace)
/// per GPU, the command says so and exits 3 at once: `_exit`, because the normal exit runs
/// CUDA's exit handlers, which would wait on the hung context too. The terminal UI runs probes
/// on a worker thread and stays responsive, so it arms none.
fn hang_watchdog(
    suite: SuiteName,
    devices: usize,
    init_timeout: Duration,
) -> Option<crate::deadline::Watchdog> {
    let deadline_s = crate::probes::suite::builtin(suite.as_str())
        .ok()?
        .deadline_s;
    let gpus = if devices == 0 {
        HANG_BOUND_GPUS
    } else {
        u32::try_from(devices).unwrap_or(HANG_BOUND_GPUS)
    };
    let per_gpu = Duration::from_secs_f64(deadline_s.max(0.0)) + init_timeout + HANG_GRACE;
    // One more deadline for the probes over all GPUs together (p2p, nccl).
    let bound = per_gpu * gpus.saturating_add(1);
    crate::deadline::Watchdog::arm("gpudiag-probe-watchdog", bound, move || {
        eprintln!(
            "gpudiag: a probe is still inside a CUDA call {} s after its suite's deadline; the \
             GPU looks hung (check the kernel log for XIDs). Giving up (exit code 3).",
            HANG_GRACE.as_secs()
        );
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(crate::error::exit::CANNOT_RUN) }
    })
}

/// The probes panel of the terminal UI: a suite on every GPU, refusing busy ones. The UI's own
/// signal handling ends the session; a run in flight stops at its deadline.
pub fn run_probes_in_ui(suite: SuiteName) -> Result<crate::probes::runner::ProbeReport, Error> {
    run_probes_with(
        suite,
        &[],
        false,
        None,
        Arc::new(AtomicBool::new(false)),
        Duration::from_secs(20),
    )
}

fn run_probes_with(
    suite: SuiteName,
    devices: &[String],
    force: bool,
    only: Option<&[String]>,
    stop: Arc<AtomicBool>,
    init_timeout: Duration,
) -> Result<crate::probes::runner::ProbeReport, Error> {
    let name = suite.as_str();
    let s = crate::probes::suite::builtin(name).map_err(Error::Usage)?;
    let result = crate::probes::runner::run(&crate::probes::runner::Options {
        suite_name: name.into(),
        suite: s,
        only: only.map(<[String]>::to_vec).unwrap_or_default(),
        devices: devices.to_vec(),
        force,
        init_timeout,
        stop,
    });
    match result {
        // No CUDA GPU: if the GPUs here are AMD ones, say that plainly rather than "no driver".
        Err(Error::CannotRun(why)) => Err(Error::CannotRun(match amd_gpus_here() {
            Some(names) => format!(
                "{}: this host's GPUs are AMD ({names}); probes run on NVIDIA GPUs for now",
                crate::telemetry::amd::PROBES_UNAVAILABLE
            ),
            None => why,
        })),
        other => other,
    }
}

/// The AMD GPUs the amdgpu driver shows, by name, when there are any.
fn amd_gpus_here() -> Option<String> {
    let root = std::env::var_os(crate::telemetry::sysfs::SYSFS_ROOT_ENV)
        .map_or_else(|| std::path::PathBuf::from("/"), Into::into);
    let backend = crate::telemetry::sysfs::SysfsBackend::open(&root).ok()?;
    let names: Vec<String> = backend
        .devices()
        .iter()
        .filter_map(|d| crate::telemetry::amd::probes_unavailable(d).map(|_| d.label()))
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// `gpudiag probe`: prints the results; returns the exit code.
pub fn probe(args: &ProbeArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<i32, Error> {
    crate::probes::runner::check_names(&args.names)?;
    let _watchdog = hang_watchdog(args.suite, args.devices.len(), args.init_timeout);
    let mut report = run_probes_with(
        args.suite,
        &args.devices,
        args.force,
        Some(&args.names),
        stop,
        args.init_timeout,
    )?;
    report.findings = rules::peers::compare(&report.devices, config.rules.peers.margin, now_ms());
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::CannotRun(format!("could not serialise the results: {e}")))?;
        print(&format!("{json}\n"))?;
    } else {
        let mut text = crate::probes::text::render(&report);
        for f in &report.findings {
            text.push_str(&format!("[{}] {} — {}\n", f.severity, f.title, f.advice));
        }
        print(&text)?;
    }
    Ok(report.exit_code())
}

/// `gpudiag record`. Returns the number of ticks written.
pub fn record(args: &RecordArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<u64, Error> {
    let source = open_source(&args.source, Pace::AsFastAsPossible, false)?;
    let libraries = source
        .recording
        .is_none()
        .then(environment::detect_libraries);
    // A replay plays at its own recorded spacing, so --interval says nothing about it.
    let interval_ms = source
        .recording
        .is_none()
        .then_some(args.interval.as_millis() as u64);
    let mut header = Header::new(
        source.backend.name(),
        source.backend.host().clone(),
        source.devices(),
        interval_ms,
    );
    header.topology = source.topology();
    let mut writer = match RecordingWriter::create_with(&args.output, &header, args.force) {
        Err(RecordingError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            return Err(Error::Usage(format!(
                "{} exists; pass --force to replace it",
                args.output.display()
            )));
        }
        other => other?,
    };
    let filter = source.selected.clone();
    // Findings go into the recording as they are raised, so a replay shows them where they
    // happened; the history they need is bounded, so hours of recording stay small in memory.
    let mut collected = Collected::new(RuleEngine::new(
        config.rules.clone(),
        header.devices.clone(),
        Some(header.host.clone()),
        libraries,
    ));
    let mut sampler = Sampler::spawn(source.backend, args.interval, args.duration);
    let mut ticks = 0u64;
    let mut failure = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            sampler.stop();
        }
        match sampler.rx.recv_timeout(Duration::from_millis(100)) {
            Ok(SamplerMsg::Tick(t)) => {
                let t = filter.apply(t);
                writer.write_tick(&t)?;
                if !t.samples.is_empty() {
                    ticks += 1;
                }
                for s in &t.samples {
                    collected.history.push_sample(s);
                }
                for f in collected.engine.on_tick(&collected.history, &t) {
                    writer.write(&Record::Finding(f))?;
                }
            }
            Ok(SamplerMsg::Ended(e)) => {
                failure = e;
                break;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    writer.finish()?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(ticks),
    }
}

/// Writes `text` to stdout; a closed pipe (`gpudiag check | head`) is not an error.
pub fn print(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(|e| Error::io("writing to stdout", e)),
    }
}
