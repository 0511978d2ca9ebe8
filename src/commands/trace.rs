//! `gpudiag trace`: a pass over a source into a Chrome trace (written by `gpudiag-export`),
//! with the findings a recording carries. The bug-report bundle's traces come from
//! [`capture_trace`] too.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cli::TraceArgs;
use crate::stop::Stop;
use gpudiag_core::config::Config;
use gpudiag_core::judgement::Span;
use gpudiag_core::pipeline::{Pipeline, Sink};
use gpudiag_core::session::{Limit, RunOptions, Session, Source, open_source};
use gpudiag_export::chrome_trace::{Trace, TraceBuilder};
use gpudiag_export::profiler_merge::MergeSummary;
use gpudiag_export::{TraceOptions, write_trace};
use gpudiag_model::error::{Error, exit};
use gpudiag_model::finding::Finding;
use gpudiag_model::printable;
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::replay::Pace;

/// Everything one pass over a source produced.
pub struct Capture {
    pub trace: Trace,
    pub findings: Vec<Finding>,
    pub ticks: u64,
    pub warnings: Vec<String>,
    /// With `--merge`: what was merged.
    pub merged: Option<MergeSummary>,
}

/// Samples `source` (for `limit` when live; a replay to its end) into a trace, with the findings
/// the rules give at the end and those the recording carried.
pub fn capture_trace(
    source: Source,
    interval: Duration,
    limit: Option<Duration>,
    stop: Option<&AtomicBool>,
    config: &Config,
) -> Result<Capture, Error> {
    // XIDs from before the capture (a job that died earlier) are in the kernel log only.
    let mut session = Session::setup(config)
        .with_kernel_log("before this trace")
        .with_libraries()
        .over(source);
    let Some(source) = session.source() else {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    };
    let mut builder = TraceBuilder::new(
        source.backend.name(),
        source.recording.clone(),
        source.backend.host(),
        session.devices.clone(),
    );
    let mut sink = TraceSink(&mut builder);
    let opts = RunOptions {
        interval,
        limit: limit.map_or(Limit::None, Limit::Live),
        stop,
    };
    let failure = session.run(&opts, &mut sink)?;
    // A recording read as it streams knows what it skipped, and what it carries, at its end.
    let mut warnings = std::mem::take(&mut session.warnings);
    match failure {
        Some(gpudiag_telemetry::BackendError::Recording(e)) => return Err(e.into()),
        Some(e) if session.pipeline.tick_count() == 0 => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if session.pipeline.tick_count() == 0 {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    let judged = session.judge(Span::whole(), None);
    builder.push_overall_verdicts(judged.verdicts.values());
    // A job's phases are worth a track only where its verdict changed.
    let job_phases = judged.job_phases.values().filter(|p| p.len() > 1).flatten();
    builder.push_job_verdicts(&judged.jobs, job_phases);
    let findings = judged.findings;
    for f in &findings {
        builder.push_finding(f);
    }
    Ok(Capture {
        trace: builder.finish(),
        findings,
        ticks: session.pipeline.tick_count(),
        warnings,
        merged: None,
    })
}

/// Draws every tick into the trace as it arrives, with the verdicts the rules hold after it.
struct TraceSink<'a>(&'a mut TraceBuilder);

impl Sink for TraceSink<'_> {
    fn on_tick(&mut self, tick: &Tick, _: &[Finding], pipeline: &Pipeline) -> Result<(), Error> {
        self.0.push_tick(tick);
        self.0.push_verdicts(pipeline.engine.verdicts().values());
        Ok(())
    }
}

/// `gpudiag trace`: writes the file and says what it holds.
/// `stop` (Ctrl-C) ends a live capture early; what was sampled is still written.
pub fn trace(args: &TraceArgs, stop: &Stop, config: &Config) -> Result<i32, Error> {
    let capture = capture_to_file(args, &stop.flag(), config)?;
    if let Some(m) = &capture.merged {
        if let Some(w) = m.warning() {
            eprintln!("gpudiag: warning: {w}");
        }
        eprintln!(
            "gpudiag: merged {} event(s) into the {} of {}, {:.3} s of overlap, to {}",
            m.added_events,
            m.profiler_events,
            printable::line(&m.info.profiler_trace),
            (m.info.window_end_ms - m.info.window_start_ms) / 1000.0,
            args.output.display()
        );
        return Ok(exit::OK);
    }
    eprintln!(
        "gpudiag: traced {} tick(s), {} finding(s) to {}",
        capture.ticks,
        capture.findings.len(),
        args.output.display()
    );
    Ok(exit::OK)
}

/// The capture `args` asks for, written to its file.
fn capture_to_file(args: &TraceArgs, stop: &AtomicBool, config: &Config) -> Result<Capture, Error> {
    let opts = TraceOptions {
        output: args.output.clone(),
        force: args.force,
        merge: args.merge.clone(),
    };
    opts.refuse_existing()?;
    let source = open_source(&args.source.spec()?, Pace::AsFastAsPossible, false)?;
    let mut capture = capture_trace(
        source,
        args.interval,
        Some(args.duration),
        Some(stop),
        config,
    )?;
    capture.merged = write_trace(&capture.trace, &opts)?;
    Ok(capture)
}
