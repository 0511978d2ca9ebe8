//! `gpudiag check`: one pass of the pipeline over the window, probes if asked, and the report.

use std::time::Duration;

use super::host_facts::HostFacts;
use crate::cli::CheckArgs;
use gpudiag_core::check::{
    self, CHECK_SCHEMA_VERSION, CheckReport, DeviceReport, SourceInfo, ToolInfo, WindowInfo,
};
use gpudiag_core::config::Config;
use gpudiag_core::rules::{self, Finding, RuleEngine};
use gpudiag_core::session::{self, Limit, Pipeline, RunOptions, Sink, open_source, with_recorded};
use gpudiag_model::error::Error;
use gpudiag_telemetry::recording::excerpt;
use gpudiag_telemetry::replay::Pace;
use gpudiag_telemetry::{BackendError, EventKind, Tick, now_ms};

use super::probe::run_probes;
use crate::tick_stats;

/// `gpudiag check`.
pub fn check(args: &CheckArgs, config: &Config) -> Result<CheckReport, Error> {
    let spec = args.source.spec()?;
    let is_replay = spec.is_recording();
    let single_read = !is_replay && args.window == Some(Duration::ZERO);
    // NVML reports only XIDs that happen while it listens; earlier ones are in the kernel log.
    // A replay's GPUs are not this host's. The log and the library search touch no GPU, so
    // they run while the source opens (NVML's initialisation is most of a single read).
    let host_facts = (!is_replay).then(HostFacts::start);
    let source = open_source(&spec, Pace::AsFastAsPossible, single_read)?;
    tick_stats::mark("source_opened");
    let (kernel_xids, libraries) = match host_facts.map(HostFacts::join) {
        Some((log, libraries)) => (Some(log), Some(libraries)),
        None => (None, None),
    };
    tick_stats::mark("host_facts_read");
    let all_devices = source.backend.devices().to_vec();
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
    let recorded = source.recorded.clone();

    let mut source = source;
    let engine = RuleEngine::new(
        config.rules.clone(),
        devices.clone(),
        Some(host.clone()),
        libraries.clone(),
    );
    let mut pipeline = Pipeline::new(engine);
    // A replay with a window judges the recording's end: only that much is kept as it streams.
    if let (true, Some(w)) = (is_replay, args.window) {
        pipeline = pipeline.retaining(w);
    }
    let mut notices = Notices::default();
    // A check is one report: let the slow fields (PCIe throughput, processes) arrive first, so
    // even a single read has them. One slow round takes about 45 ms per GPU, in parallel.
    source
        .backend
        .wait_for_slow_fields(Duration::from_millis(500));
    let (failure, topology, notes) = if limit == Some(Duration::ZERO) {
        let failure = session::read_once(&mut source, &mut pipeline, &mut notices)?;
        tick_stats::mark("polled");
        // Asked after the poll: the backend reads it on its own thread meanwhile.
        let topology = source.topology();
        tick_stats::mark("topology_read");
        // The driver's teardown (nvmlShutdown, a few ms) is nothing the report needs: it runs on
        // its own thread, which the process's exit ends. Should the thread not start, the
        // closure and the source are dropped here instead.
        let _ = std::thread::Builder::new()
            .name("gpudiag-teardown".into())
            .spawn(move || drop(source));
        (failure, topology, None)
    } else {
        let topology = source.topology();
        let opts = RunOptions {
            interval: args.interval,
            limit: limit.map_or(Limit::None, Limit::Live),
            stop: None,
        };
        let end = session::run_to_end(source, &mut pipeline, &opts, &mut notices)?;
        (end.failure, topology, end.notes)
    };
    // A recording read as it streams knows what it skipped, and the findings it carries, only
    // once it has been read.
    let (mut warnings, recorded) = match notes {
        Some(n) => (n.warnings, n.recorded),
        None => (source_warnings, recorded),
    };
    match failure {
        // The input itself is at fault (a bundle past its size limit): no report from part of it.
        Some(BackendError::Recording(e)) => return Err(e.into()),
        Some(e) if pipeline.tick_count() == 0 => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if pipeline.tick_count() == 0 {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    for message in notices.0 {
        if !warnings.contains(&message) {
            warnings.push(message);
        }
    }
    // Replays with a window judge only its end; live runs sampled exactly the window.
    let summary_window = if is_replay { args.window } else { None };
    let judged_from = match (summary_window, pipeline.first_ms(), pipeline.last_ms()) {
        (Some(w), Some(first), Some(last)) => first.max(last.saturating_sub(w.as_millis() as u64)),
        (_, first, _) => first.unwrap_or_default(),
    };
    pipeline.engine.finish_over(&pipeline.history, judged_from);
    if let Some(w) = summary_window {
        pipeline.keep_last(w);
    }
    // What the recording carried, where today's rules did not raise it again; with a window,
    // only what it carried in that window.
    let window_start = summary_window.and(pipeline.first_ms());
    // Workload findings the recorder raised describe a moment of the recording; the verdict
    // over the window replaces them, as it does today's rules' own.
    let recorded: Vec<Finding> = recorded
        .into_iter()
        .filter(|f| window_start.is_none_or(|start| f.time_ms >= start))
        .filter(|f| !rules::is_workload(f))
        .collect();
    let mut findings = with_recorded(pipeline.findings(summary_window), &recorded);

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
    let mut not_judged = pipeline.engine.not_judged().to_vec();
    if let Some(log) = &kernel_xids {
        let selected: Vec<u32> = devices.iter().map(|d| d.index).collect();
        let now = pipeline.last_ms().unwrap_or_else(now_ms);
        let (past, unread) = rules::errors::past_xids(
            log,
            &all_devices,
            &selected,
            &pipeline.latest,
            now,
            "before this check",
        );
        findings.extend(past);
        rules::sort(&mut findings);
        not_judged.extend(unread);
    }
    tick_stats::mark("judged");
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
            verdict: pipeline.engine.verdicts().get(&info.index).cloned(),
            phases: pipeline.last_ms().map_or_else(Vec::new, |end| {
                pipeline
                    .engine
                    .phases(&pipeline.history, info.index, judged_from, end)
            }),
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
            requested_s: if is_replay {
                args.window.map(|w| w.as_secs_f64())
            } else {
                Some(limit.unwrap_or_default().as_secs_f64())
            },
            covered_s: covered_ms as f64 / 1000.0,
            ticks: pipeline.tick_count(),
            start_ms: pipeline.first_ms(),
            end_ms: pipeline.last_ms(),
        },
        devices: device_reports,
        topology,
        host_probes: probed.as_ref().map(|p| p.host.clone()),
        host_findings,
        not_judged,
        status,
        could_not_run: None,
        fail_on,
        exit_code,
    };
    report.mark_blind_devices();
    Ok(report)
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
