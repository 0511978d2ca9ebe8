//! What each subcommand does: open a telemetry source, run the pipeline, produce the output.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{CheckArgs, ProbeArgs, RecordArgs, SuiteName};
use gpudiag_core::check::{
    self, CHECK_SCHEMA_VERSION, CheckReport, DeviceReport, SourceInfo, ToolInfo, WindowInfo,
};
use gpudiag_core::config::Config;
use gpudiag_core::rules::Finding;
use gpudiag_core::rules::{self, RuleEngine};
use gpudiag_core::session::{self, Limit, NoSink, Pipeline, RunOptions, Sink, open_source};
use gpudiag_model::cuda_libraries;
use gpudiag_model::error::Error;
use gpudiag_telemetry::recording::{Header, Record, RecordingError, RecordingWriter};
use gpudiag_telemetry::replay::Pace;
use gpudiag_telemetry::{Backend, EventKind, Tick, now_ms};

/// `gpudiag check`.
pub fn check(args: &CheckArgs, config: &Config) -> Result<CheckReport, Error> {
    let spec = args.source.spec()?;
    let is_replay = spec.is_recording();
    let single_read = !is_replay && args.window == Some(Duration::ZERO);
    let source = open_source(&spec, Pace::AsFastAsPossible, single_read)?;
    let libraries = (!is_replay).then(cuda_libraries::detect_libraries);
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
    let mut pipeline = Pipeline::new(engine);
    // A check is one report: let the slow fields (PCIe throughput, processes) arrive first, so
    // even a single read has them. One slow round takes about 45 ms per GPU, in parallel.
    source
        .backend
        .wait_for_slow_fields(Duration::from_millis(500));
    let (failure, topology) = if limit == Some(Duration::ZERO) {
        let failure = session::read_once(&mut source, &mut pipeline, &mut NoSink)?;
        // Asked after the poll: the backend reads it on its own thread meanwhile.
        (failure, source.topology())
    } else {
        let topology = source.topology();
        let opts = RunOptions {
            interval: args.interval,
            limit: limit.map_or(Limit::None, Limit::Live),
            stop: None,
        };
        (
            session::run(source, &mut pipeline, &opts, &mut NoSink)?,
            topology,
        )
    };
    let mut warnings = source_warnings;
    match failure {
        Some(e) if pipeline.tick_times.is_empty() => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if pipeline.tick_times.is_empty() {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    for e in &pipeline.events {
        if let EventKind::Notice { message } = &e.kind
            && !warnings.contains(message)
        {
            warnings.push(message.clone());
        }
    }
    pipeline.engine.finish(&pipeline.history);
    // Replays with a window judge only its end; live runs sampled exactly the window.
    let summary_window = if is_replay { args.window } else { None };
    if let Some(w) = summary_window {
        pipeline.keep_last(w);
    }
    let mut findings = pipeline.findings(summary_window);

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
        let now = pipeline.last_ms().unwrap_or_else(now_ms);
        findings.extend(gpudiag_probes::runner::findings(&p.devices, now));
        findings.extend(gpudiag_probes::runner::host_findings(&p.host, now));
        for dp in &p.devices {
            let Some(info) = devices.iter().find(|d| d.index == dp.index) else {
                continue;
            };
            let measured: Vec<gpudiag_probes::Measurement> = dp
                .results
                .iter()
                .filter(|r| r.probe == "bandwidth")
                .flat_map(|r| r.metrics.iter().cloned())
                .collect();
            findings.extend(rules::pcie::probe_bandwidth(
                info,
                pipeline.latest.get(&dp.index),
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
            summary: check::summarise(&pipeline.history, info.index, summary_window),
            latest: pipeline.latest.get(&info.index).cloned(),
            findings: per_device.remove(&info.index).unwrap_or_default(),
            probes: probed
                .as_ref()
                .and_then(|p| p.devices.iter().find(|d| d.index == info.index).cloned()),
            info,
        })
        .collect();
    let covered_ms = match (pipeline.first_ms(), pipeline.last_ms()) {
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
            ticks: pipeline.tick_times.len() as u64,
            start_ms: pipeline.first_ms(),
            end_ms: pipeline.last_ms(),
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
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
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
) -> Option<gpudiag_model::deadline::Watchdog> {
    let deadline_s = gpudiag_probes::suite::builtin(suite.as_str())
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
    gpudiag_model::deadline::Watchdog::arm("gpudiag-probe-watchdog", bound, move || {
        eprintln!(
            "gpudiag: a probe is still inside a CUDA call {} s after its suite's deadline; the \
             GPU looks hung (check the kernel log for XIDs). Giving up (exit code 3).",
            HANG_GRACE.as_secs()
        );
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(gpudiag_model::error::exit::CANNOT_RUN) }
    })
}

/// The probes panel of the terminal UI: a suite on every GPU, refusing busy ones. The UI's own
/// signal handling ends the session; a run in flight stops at its deadline.
pub fn run_probes_in_ui(suite: SuiteName) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
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
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    let name = suite.as_str();
    let s = gpudiag_probes::suite::builtin(name).map_err(Error::Usage)?;
    let result = gpudiag_probes::runner::run(&gpudiag_probes::runner::Options {
        suite_name: name.into(),
        suite: s,
        only: only.map(<[String]>::to_vec).unwrap_or_default(),
        devices: devices.to_vec(),
        force,
        init_timeout,
        stop,
        read_topology: Some(gpudiag_telemetry::nvml::read_topology),
    });
    match result {
        // No CUDA GPU: if the GPUs here are AMD ones, say that plainly rather than "no driver".
        Err(Error::CannotRun(why)) => Err(Error::CannotRun(match amd_gpus_here() {
            Some(names) => format!(
                "{}: this host's GPUs are AMD ({names}); probes run on NVIDIA GPUs for now",
                gpudiag_telemetry::amd::PROBES_UNAVAILABLE
            ),
            None => why,
        })),
        other => other,
    }
}

/// The AMD GPUs the amdgpu driver shows, by name, when there are any.
fn amd_gpus_here() -> Option<String> {
    let root = std::env::var_os(gpudiag_telemetry::sysfs::SYSFS_ROOT_ENV)
        .map_or_else(|| std::path::PathBuf::from("/"), Into::into);
    let backend = gpudiag_telemetry::sysfs::SysfsBackend::open(&root).ok()?;
    let names: Vec<String> = backend
        .devices()
        .iter()
        .filter_map(|d| gpudiag_telemetry::amd::probes_unavailable(d).map(|_| d.label()))
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// `gpudiag probe`: prints the results; returns the exit code.
pub fn probe(args: &ProbeArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<i32, Error> {
    gpudiag_probes::runner::check_names(&args.names)?;
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
        let mut text = gpudiag_probes::text::render(&report);
        for f in &report.findings {
            text.push_str(&format!("[{}] {} — {}\n", f.severity, f.title, f.advice));
        }
        print(&text)?;
    }
    Ok(report.exit_code())
}

/// `gpudiag record`. Returns the number of ticks written.
pub fn record(args: &RecordArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<u64, Error> {
    let source = open_source(&args.source.spec()?, Pace::AsFastAsPossible, false)?;
    let libraries = source
        .recording
        .is_none()
        .then(cuda_libraries::detect_libraries);
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
    // Findings go into the recording as they are raised, so a replay shows them where they
    // happened; the history they need is bounded, so hours of recording stay small in memory.
    let mut pipeline = Pipeline::new(RuleEngine::new(
        config.rules.clone(),
        header.devices.clone(),
        Some(header.host.clone()),
        libraries,
    ))
    .retaining(RECORD_RETAIN);
    let mut sink = RecordSink {
        writer: &mut writer,
        ticks: 0,
    };
    let opts = RunOptions {
        interval: args.interval,
        limit: args.duration.map_or(Limit::None, Limit::SourceTime),
        stop: Some(&stop),
    };
    let failure = session::run(source, &mut pipeline, &opts, &mut sink)?;
    let ticks = sink.ticks;
    writer.finish()?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(ticks),
    }
}

/// How long `record` keeps tick times and events in memory (the recording has them all).
const RECORD_RETAIN: Duration = Duration::from_secs(600);

/// Writes every tick, and the findings it raised, to the recording as it arrives.
struct RecordSink<'a> {
    writer: &'a mut RecordingWriter,
    ticks: u64,
}

impl Sink for RecordSink<'_> {
    fn on_tick(&mut self, tick: &Tick, raised: &[Finding], _: &Pipeline) -> Result<(), Error> {
        self.writer.write_tick(tick)?;
        if !tick.samples.is_empty() {
            self.ticks += 1;
        }
        for f in raised {
            self.writer.write(&Record::Finding(f.clone()))?;
        }
        Ok(())
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
