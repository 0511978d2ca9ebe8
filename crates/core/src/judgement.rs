//! The judgement: the one place where the findings, the GPU verdicts and what could not be
//! judged are gathered from what a session saw. `check`, `run`, the terminal UI, `serve`, the
//! trace and the bug-report bundle all ask [`judge`], so two views of the same data never
//! disagree; a view chooses only how to show the answer (the UI newest first, `serve` what is
//! active now).
//!
//! What goes in: the pipeline (its history and rule engine), the findings a recording carried,
//! this host's kernel-log XIDs, and probe results. The rules raise their findings tick by tick;
//! here the workload is judged again over the span asked for, the recorded findings the rules
//! did not raise again are added, then the XIDs the kernel logged before the session and what
//! the probes measured (slow transfers, a GPU or link behind its peers).

use std::collections::BTreeMap;

use crate::pipeline::Pipeline;
use crate::rules;
use crate::rules::families::is_workload;
use gpudiag_model::finding::Finding;
use gpudiag_model::job::{JobId, JobVerdict};
use gpudiag_model::sample::{DeviceInfo, TimeMs};
use gpudiag_model::verdict::{NotJudged, Verdict};
use gpudiag_probes::runner::ProbeReport;
use gpudiag_telemetry::kernel_log::XidLog;

/// When the judgement is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// While the session goes on (the terminal UI, `serve`): the rules' rolling verdicts as they
    /// stand, every finding raised so far; nothing is judged again.
    Now,
    /// The session's end, or a report over part of it: the workload is judged again over the
    /// span, so a moment's finding (five idle seconds before a job started) gives way to the
    /// verdict on the whole.
    End(Span),
}

/// The part of the source's time a final judgement covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// From here; `None`: from the first sample the pipeline holds.
    pub start_ms: Option<TimeMs>,
    /// To here; `None`: to the last sample.
    pub end_ms: Option<TimeMs>,
}

impl Span {
    /// All the pipeline holds.
    pub fn whole() -> Span {
        Span::default()
    }

    /// The last `window` of the source's time: `(last − window, last]`, the half-open window
    /// [`Pipeline::keep_last`] keeps, so the report's counts and its findings describe the same
    /// samples.
    pub fn last(pipeline: &Pipeline, window: std::time::Duration) -> Span {
        Span {
            start_ms: pipeline.last_ms().map(|last| {
                last.saturating_sub(window.as_millis() as u64)
                    .saturating_add(1)
                    .min(last)
            }),
            end_ms: None,
        }
    }
}

/// What a session saw besides its telemetry.
#[derive(Default)]
pub struct Seen<'a> {
    /// The findings a recording carried.
    pub recorded: &'a [Finding],
    /// This host's kernel log: XIDs from before the session (a job that died earlier).
    pub kernel_log: Option<KernelLog<'a>>,
    /// A probe run's results.
    pub probes: Option<&'a ProbeReport>,
}

/// The kernel log's XIDs and what places them.
pub struct KernelLog<'a> {
    /// The XIDs read, or why the log could not be read.
    pub xids: &'a Result<XidLog, String>,
    /// Every GPU the host has, to place an XID by its PCI address (only the session's devices
    /// are reported).
    pub host_devices: &'a [DeviceInfo],
    /// Before what, in words: "before this check".
    pub before: &'a str,
}

/// What was concluded.
#[derive(Debug, Clone, Default)]
pub struct Judgement {
    /// Every finding, worst first, then by device and id; each says whether it is still active.
    pub findings: Vec<Finding>,
    /// The verdict per device over the span (at [`Moment::Now`], over the rolling window).
    pub verdicts: BTreeMap<u32, Verdict>,
    /// How each device's verdict changed over the span: only at [`Moment::End`].
    pub phases: BTreeMap<u32, Vec<Verdict>>,
    /// The verdict on each job of two or more GPUs, judged by comparing its GPUs (at
    /// [`Moment::Now`], over the rolling window). A job of one GPU has none: its GPU's verdict
    /// says it all.
    pub jobs: Vec<JobVerdict>,
    /// How each job's verdict changed over the span: only at [`Moment::End`].
    pub job_phases: BTreeMap<JobId, Vec<JobVerdict>>,
    /// What could not be judged, and why.
    pub not_judged: Vec<NotJudged>,
    /// The span judged, `[start, end]` in source time, when the pipeline holds samples.
    pub span: Option<(TimeMs, TimeMs)>,
}

impl Judgement {
    /// What is wrong now: the findings still active at the end of what was seen.
    pub fn active(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.state == gpudiag_model::finding::FindingState::Active)
    }
}

/// Judges what the session saw: see the module's documentation.
pub fn judge(pipeline: &mut Pipeline, moment: Moment, seen: &Seen<'_>) -> Judgement {
    let Moment::End(asked) = moment else {
        return judge_now(pipeline, seen);
    };
    let end = asked.end_ms.or(pipeline.last_ms());
    let start = asked.start_ms.or(pipeline.first_ms());
    let span = start.zip(end);
    if let Some((start, end)) = span {
        let history = &pipeline.history;
        pipeline.engine.finish_within(history, start, end);
    }
    let findings = match asked.start_ms {
        None => pipeline.engine.raised(),
        Some(start) => pipeline.findings_since(start),
    };
    let phases = span.map_or_else(BTreeMap::new, |(start, end)| {
        pipeline
            .engine
            .devices()
            .iter()
            .map(|d| {
                let phases = pipeline
                    .engine
                    .phases(&pipeline.history, d.index, start, end);
                (d.index, phases)
            })
            .collect()
    });
    let job_phases = span.map_or_else(BTreeMap::new, |(start, end)| {
        pipeline.engine.job_phases(&pipeline.history, start, end)
    });
    Judgement {
        job_phases,
        ..gather(pipeline, span, findings, phases, seen)
    }
}

/// [`judge`] at [`Moment::Now`], which changes nothing in the pipeline: a sink can ask it on
/// every tick.
pub fn judge_now(pipeline: &Pipeline, seen: &Seen<'_>) -> Judgement {
    let span = pipeline.first_ms().zip(pipeline.last_ms());
    gather(
        pipeline,
        span,
        pipeline.engine.raised(),
        BTreeMap::new(),
        seen,
    )
}

/// Adds to the rules' findings what the session saw besides its telemetry.
fn gather(
    pipeline: &Pipeline,
    span: Option<(TimeMs, TimeMs)>,
    mut findings: Vec<Finding>,
    phases: BTreeMap<u32, Vec<Verdict>>,
    seen: &Seen<'_>,
) -> Judgement {
    let now = span.map(|(_, end)| end);
    // A recording's own workload findings describe a moment of it: today's rules judged the
    // same telemetry again. Only what falls in the span counts; a replay under way has not
    // reached what the recording holds further on.
    let recorded: Vec<Finding> = seen
        .recorded
        .iter()
        .filter(|f| !is_workload(f))
        .filter(|f| span.is_none_or(|(start, end)| f.time_ms >= start && f.time_ms <= end))
        .cloned()
        .collect();
    add_recorded(&mut findings, &recorded);
    let mut not_judged = pipeline.engine.not_judged().to_vec();
    let at = now.unwrap_or_else(gpudiag_model::sample::now_ms);
    if let Some(log) = &seen.kernel_log {
        let selected: Vec<u32> = pipeline.engine.devices().iter().map(|d| d.index).collect();
        let (past, unread) = rules::errors::past_xids(
            log.xids,
            log.host_devices,
            &selected,
            &pipeline.latest,
            at,
            log.before,
        );
        findings.extend(past);
        not_judged.extend(unread);
    }
    if let Some(probed) = seen.probes {
        findings.extend(probe_findings(pipeline, probed, at));
    }
    rules::sort(&mut findings);
    Judgement {
        findings,
        verdicts: pipeline.engine.verdicts().clone(),
        phases,
        jobs: pipeline.engine.jobs().to_vec(),
        job_phases: BTreeMap::new(),
        not_judged,
        span,
    }
}

/// Adds the findings a recording carried that the rules did not raise again themselves,
/// marked as recorded.
fn add_recorded(findings: &mut Vec<Finding>, recorded: &[Finding]) {
    for f in recorded {
        if !findings
            .iter()
            .any(|g| g.id == f.id && g.device == f.device)
        {
            findings.push(Finding {
                recorded: true,
                ..f.clone()
            });
        }
    }
}

/// What a probe run found: probes refused or failed, host-device transfers slower than the
/// link allows, and GPUs or links behind their peers.
fn probe_findings(pipeline: &Pipeline, probed: &ProbeReport, now: TimeMs) -> Vec<Finding> {
    let mut out = gpudiag_probes::runner::findings(&probed.devices, now);
    out.extend(gpudiag_probes::runner::host_findings(&probed.host, now));
    for dp in &probed.devices {
        let Some(info) = pipeline
            .engine
            .devices()
            .iter()
            .find(|d| d.index == dp.index)
        else {
            continue;
        };
        let measured: Vec<gpudiag_probes::Measurement> = dp
            .results
            .iter()
            .filter(|r| r.probe == "bandwidth")
            .flat_map(|r| r.metrics.iter().cloned())
            .collect();
        out.extend(rules::pcie::probe_bandwidth(
            info,
            pipeline.latest.get(&dp.index),
            &measured,
            now,
        ));
    }
    let margin = pipeline.engine.config().peers.margin;
    out.extend(rules::peers::compare(&probed.devices, margin, now));
    out
}
