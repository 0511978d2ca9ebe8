//! Exports of telemetry for other tools: Chrome traces (`gpudiag trace`) and Prometheus metrics
//! (`gpudiag serve`), plus what they share with the bug-report bundle: opening a source with the
//! findings a recording carries, evaluating rules through one function, and writing a file so
//! that it appears whole or not at all.

pub mod chrome_trace;
pub mod profiler_merge;
pub mod prometheus;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cli::TraceArgs;
use chrome_trace::{Trace, TraceBuilder};
use gpudiag_core::config::Config;
use gpudiag_core::judgement::{self, KernelLog, Moment, Seen, Span};
use gpudiag_core::rules::Finding;
use gpudiag_core::session::{
    self, Limit, Pipeline, RunOptions, Sink, Source, engine_for, open_source,
};
use gpudiag_model::error::Error;
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::replay::Pace;

/// Everything one pass over a source produced.
pub struct Capture {
    pub trace: Trace,
    pub findings: Vec<Finding>,
    pub ticks: u64,
    pub warnings: Vec<String>,
    /// With `--merge`: what was merged.
    pub merged: Option<profiler_merge::MergeSummary>,
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
    let devices = source.devices();
    let host_devices = source.backend.devices().to_vec();
    let recorded = source.recorded.clone();
    // XIDs from before the capture (a job that died earlier) are in the kernel log only.
    let kernel_xids = source
        .is_this_host()
        .then(gpudiag_core::host_facts::read_kernel_xids);
    let mut builder = TraceBuilder::new(
        source.backend.name(),
        source.recording.clone(),
        source.backend.host(),
        devices.clone(),
    );
    let mut warnings = source.backend.source_warnings();
    let mut pipeline = Pipeline::new(engine_for(&source, config));
    let mut sink = TraceSink(&mut builder);
    let opts = RunOptions {
        interval,
        limit: limit.map_or(Limit::None, Limit::Live),
        stop,
    };
    let end = session::run_to_end(source, &mut pipeline, &opts, &mut sink)?;
    // A recording read as it streams knows what it skipped, and what it carries, at its end.
    let recorded = match end.notes {
        Some(notes) => {
            warnings = notes.warnings;
            notes.recorded
        }
        None => recorded,
    };
    match end.failure {
        Some(gpudiag_telemetry::BackendError::Recording(e)) => return Err(e.into()),
        Some(e) if pipeline.tick_count() == 0 => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if pipeline.tick_count() == 0 {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    let seen = Seen {
        recorded: &recorded,
        kernel_log: kernel_xids.as_ref().map(|xids| KernelLog {
            xids,
            host_devices: &host_devices,
            before: "before this trace",
        }),
        probes: None,
    };
    let judged = judgement::judge(&mut pipeline, Moment::End(Span::whole()), &seen);
    builder.push_overall_verdicts(judged.verdicts.values());
    let findings = judged.findings;
    for f in &findings {
        builder.push_finding(f);
    }
    Ok(Capture {
        trace: builder.finish(),
        findings,
        ticks: pipeline.tick_count(),
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

/// `gpudiag trace`: returns the capture (the file is written).
/// `stop` (Ctrl-C) ends a live capture early; what was sampled is still written.
pub fn trace(args: &TraceArgs, stop: &AtomicBool, config: &Config) -> Result<Capture, Error> {
    refuse_existing(&args.output, args.force)?;
    let source = open_source(&args.source.spec()?, Pace::AsFastAsPossible, false)?;
    let mut capture = capture_trace(
        source,
        args.interval,
        Some(args.duration),
        Some(stop),
        config,
    )?;
    match &args.merge {
        Some(profiler) => {
            capture.merged = Some(profiler_merge::merge(
                profiler,
                &capture.trace,
                &args.output,
            )?);
        }
        None => write_json_atomic(&args.output, &capture.trace)?,
    }
    Ok(capture)
}

/// A usage error when `path` exists and `force` is off.
pub fn refuse_existing(path: &Path, force: bool) -> Result<(), Error> {
    if !force && path.exists() {
        return Err(Error::Usage(format!(
            "{} exists; pass --force to replace it",
            path.display()
        )));
    }
    Ok(())
}

/// Serialises `value` as JSON into `path` atomically.
pub fn write_json_atomic(path: &Path, value: &impl serde::Serialize) -> Result<(), Error> {
    write_atomic(path, |w| {
        serde_json::to_writer(&mut *w, value).map_err(std::io::Error::other)?;
        w.write_all(b"\n")
    })
}

/// Writes through `fill` into a temporary file beside `path`, syncs it and renames it over
/// `path`: a reader (or a crash) never sees a half-written file. The temporary file is removed
/// on failure.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<&File>) -> std::io::Result<()>,
) -> Result<(), Error> {
    let tmp = temp_path_for(path);
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let mut w = std::io::BufWriter::new(&file);
        fill(&mut w)?;
        w.flush()?;
        drop(w);
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("cannot write {}", path.display()), e)
    })
}

/// `dir/.name.tmp-PID-N`: hidden, in the same directory (a rename across file systems would
/// copy), and unique per process and call.
fn temp_path_for(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    let tmp = format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(tmp),
        _ => PathBuf::from(tmp),
    }
}
