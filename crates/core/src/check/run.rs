//! A check: one pass of the pipeline over the window, probes if asked, the judgement, and the
//! report. The CLI, the terminal-less `gpudiag` and `gpudiag replay`, and the bug-report
//! bundle build a [`CheckRequest`] and call [`run`].

use std::time::Duration;

use super::{CHECK_SCHEMA_VERSION, CheckReport, DeviceReport, SourceInfo, ToolInfo, WindowInfo};
use crate::config::Config;
use crate::judgement::Span;
use crate::pipeline::{Pipeline, Sink};
use crate::session::{Limit, RunOptions, Session, Source, SourceSpec};
use gpudiag_model::error::Error;
use gpudiag_model::finding::{Finding, Severity};
use gpudiag_model::sample::{EventKind, now_ms};
use gpudiag_model::stats;
use gpudiag_probes::runner::ProbeReport;
use gpudiag_telemetry::recording::excerpt;
use gpudiag_telemetry::{BackendError, Tick};

/// What to check, built once from the command line (or from `report`'s options).
#[derive(Debug, Clone)]
pub struct CheckRequest {
    pub source: SourceSpec,
    /// `--window`: how long live GPUs are sampled (zero: a single read), or how much of a
    /// recording's end is judged; see [`SourceSpec::check_window`].
    pub window: Option<Duration>,
    /// Time between samples of live GPUs.
    pub interval: Duration,
    /// The exit code is 1 when a finding of this severity or worse is present.
    pub fail_on: Severity,
    /// A probe suite to run on each checked GPU.
    pub probes: Option<ProbeAsk>,
}

/// A probe suite asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAsk {
    /// `quick`, `standard` or `full`.
    pub suite: String,
    /// Probe GPUs even when other processes are using them.
    pub force: bool,
}

impl CheckRequest {
    /// `source` checked as `gpudiag check` checks it without flags: a recording whole, live
    /// GPUs for a second; exit 1 on a failure.
    pub fn new(source: SourceSpec) -> CheckRequest {
        CheckRequest {
            source,
            window: None,
            interval: Duration::from_millis(100),
            fail_on: Severity::Fail,
            probes: None,
        }
    }
}

/// Runs probes for a check: the binary's runner (it owns Ctrl-C and the hang watchdog).
pub trait ProbeRunner {
    /// Runs `ask` on `devices` (indices); an error stops the check.
    fn run(&self, ask: &ProbeAsk, devices: &[String]) -> Result<ProbeReport, Error>;
}

/// A check that runs no probes: asking for them is an error.
pub struct NoProbes;

impl ProbeRunner for NoProbes {
    fn run(&self, _: &ProbeAsk, _: &[String]) -> Result<ProbeReport, Error> {
        Err(Error::Usage("probes cannot run here".into()))
    }
}

/// Runs the check `request` asks for.
pub fn run(
    request: &CheckRequest,
    config: &Config,
    probes: &dyn ProbeRunner,
) -> Result<CheckReport, Error> {
    let window = request.source.check_window(request.window);
    let mut setup = Session::setup(config)
        .one_shot(window.single_read)
        .with_kernel_log("before this check")
        .with_libraries();
    if let Some(w) = window.judge_last {
        setup = setup.retaining(w);
    }
    let mut session = setup.open(&request.source)?;
    let Some(source) = session.source_mut() else {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    };
    let host = source.backend.host().clone();
    let backend_name = source.backend.name().to_owned();
    let recording = source.recording.clone();
    let mut notices = Notices::default();
    // A check is one report: let the slow fields (PCIe throughput, processes) arrive first, so
    // even a single read has them. One slow round takes about 45 ms per GPU, in parallel.
    source
        .backend
        .wait_for_slow_fields(Duration::from_millis(500));
    let (failure, topology) = if window.single_read {
        let failure = session.read_once(&mut notices)?;
        stats::mark("polled");
        // Asked after the poll: the backend reads it on its own thread meanwhile.
        let topology = session.source().and_then(Source::topology);
        stats::mark("topology_read");
        // The driver's teardown (nvmlShutdown, a few ms) is nothing the report needs: it runs on
        // its own thread, which the process's exit ends. Should the thread not start, the
        // closure and the source are dropped here instead.
        let source = session.take_source();
        let _ = std::thread::Builder::new()
            .name("gpudiag-teardown".into())
            .spawn(move || drop(source));
        (failure, topology)
    } else {
        let topology = session.source().and_then(Source::topology);
        let opts = RunOptions {
            interval: request.interval,
            limit: window.limit,
            stop: None,
        };
        (session.run(&opts, &mut notices)?, topology)
    };
    // A recording read as it streams knows what it skipped, and the findings it carries, only
    // once it has been read.
    let mut warnings = std::mem::take(&mut session.warnings);
    match failure {
        // The input itself is at fault (a bundle past its size limit): no report from part of it.
        Some(BackendError::Recording(e)) => return Err(e.into()),
        Some(e) if session.pipeline.tick_count() == 0 => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if session.pipeline.tick_count() == 0 {
        // Every sample line skipped as malformed reads the same as none written: the reader's
        // warning says which it was.
        let why = warnings
            .first()
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        return Err(Error::Usage(format!(
            "the source holds no telemetry samples{why}"
        )));
    }
    for message in notices.0 {
        if !warnings.contains(&message) {
            warnings.push(message);
        }
    }
    let devices = session.devices.clone();
    let probed = match &request.probes {
        Some(ask) => {
            let selected: Vec<String> = devices.iter().map(|d| d.index.to_string()).collect();
            Some(probes.run(ask, &selected)?)
        }
        None => None,
    };
    let span = match window.judge_last {
        Some(w) => Span::last(&session.pipeline, w),
        None => Span::whole(),
    };
    let judged = session.judge(span, probed.as_ref());
    let libraries = session.libraries().map(<[_]>::to_vec);
    let mut pipeline = session.pipeline;
    if let Some(w) = window.judge_last {
        pipeline.keep_last(w);
    }
    stats::mark("judged");
    let exit_code = super::exit_code_for(&judged.findings, request.fail_on);
    let status = super::status_of(&judged.findings);
    let (mut per_device, host_findings) = super::split_findings(judged.findings);
    let mut phases = judged.phases;
    let mut device_reports: Vec<DeviceReport> = devices
        .into_iter()
        .map(|info| DeviceReport {
            summary: super::summarise(&pipeline.history, info.index, window.judge_last),
            latest: pipeline.latest.get(&info.index).cloned(),
            findings: per_device.remove(&info.index).unwrap_or_default(),
            verdict: judged.verdicts.get(&info.index).cloned(),
            phases: phases.remove(&info.index).unwrap_or_default(),
            probes: probed
                .as_ref()
                .and_then(|p| p.devices.iter().find(|d| d.index == info.index).cloned()),
            info,
        })
        .collect();
    let mut jobs = judged.jobs;
    let kernels = pipeline.kernels.take().map(|k| *k);
    // The run's own summary says what its records concluded; judging only the end of the run,
    // the counters' verdict is of that window and the records of the whole run.
    if let Some(k) = kernels.as_ref().filter(|k| k.ended)
        && window.judge_last.is_none()
        && let (Some(start), Some(end)) = (pipeline.first_ms(), pipeline.last_ms())
    {
        crate::kernels::verdict::conclude(
            &k.summary,
            device_reports
                .iter_mut()
                .map(|d| (d.info.index, &mut d.verdict)),
            &mut jobs,
            start,
            end,
        );
    }
    let covered_ms = match (pipeline.first_ms(), pipeline.last_ms()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let mut report = CheckReport {
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
            requested_s: window.requested.map(|w| w.as_secs_f64()),
            covered_s: covered_ms as f64 / 1000.0,
            ticks: pipeline.tick_count(),
            start_ms: pipeline.first_ms(),
            end_ms: pipeline.last_ms(),
        },
        devices: device_reports,
        topology,
        host_probes: probed.as_ref().map(|p| p.host.clone()),
        host_findings,
        jobs,
        job_phases: judged
            .job_phases
            .into_iter()
            .map(|(job, phases)| super::JobPhases { job, phases })
            .collect(),
        kernels,
        not_judged: judged.not_judged,
        status,
        could_not_run: None,
        devices_not_found: Vec::new(),
        fail_on: request.fail_on,
        exit_code,
    };
    report.mark_blind_devices();
    Ok(report)
}

/// What a check's window means for a source: decided here once, for live GPUs and for
/// recordings alike, so no view branches on which it has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckWindow {
    /// How long the source is sampled: live GPUs for the window (one second by default); a
    /// recording is read whole.
    pub limit: Limit,
    /// Only this much of the source's end is judged and reported (a recording's end); `None`:
    /// all that was sampled.
    pub judge_last: Option<Duration>,
    /// The window the report says was asked for.
    pub requested: Option<Duration>,
    /// One read of live GPUs, with the slow fields read inside it.
    pub single_read: bool,
    /// The source's GPUs are this host's, so its kernel log and libraries describe them.
    pub this_host: bool,
}

impl SourceSpec {
    /// What `window` means for this source: see [`CheckWindow`].
    pub fn check_window(&self, window: Option<Duration>) -> CheckWindow {
        if self.is_recording() {
            CheckWindow {
                limit: Limit::None,
                judge_last: window,
                requested: window,
                single_read: false,
                this_host: false,
            }
        } else {
            let sampled = window.unwrap_or(Duration::from_secs(1));
            CheckWindow {
                limit: Limit::Live(sampled),
                judge_last: None,
                requested: Some(sampled),
                single_read: sampled.is_zero(),
                this_host: true,
            }
        }
    }
}

/// Notices carried by the source's events, distinct and at most this many; a recording may hold
/// any number of them, of any length.
const MAX_NOTICES: usize = 32;
/// Longest notice quoted in the report.
const NOTICE_CHARS: usize = 240;

/// Collects the notices of the events as they pass, since the pipeline keeps only recent events.
#[derive(Default)]
struct Notices(Vec<String>);

impl Sink for Notices {
    fn on_tick(&mut self, tick: &Tick, _: &[Finding], _: &Pipeline) -> Result<(), Error> {
        for e in &tick.events {
            if let EventKind::Notice { message } = &e.kind
                && self.0.len() < MAX_NOTICES
            {
                let message = excerpt(message, NOTICE_CHARS);
                if !self.0.contains(&message) {
                    self.0.push(message);
                }
            }
        }
        Ok(())
    }
}
