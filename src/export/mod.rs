//! Exports of telemetry for other tools: Chrome traces (`gpudiag trace`) and Prometheus metrics
//! (`gpudiag serve`), plus what they share with the bug-report bundle: opening a source with the
//! findings a recording carries, evaluating rules through one function, and writing a file so
//! that it appears whole or not at all.

pub mod chrome_trace;
pub mod prometheus;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use crate::cli::{SourceArgs, TraceArgs};
use crate::commands::{self, Collected, DEMO_NAME, DEMO_RECORDING, Source};
use crate::config::Config;
use crate::error::Error;
use crate::rules::{self, Finding, RuleEngine};
use crate::telemetry::Backend;
use crate::telemetry::replay::{Pace, ReplayBackend};
use crate::telemetry::sampler::{Sampler, SamplerMsg};
use chrome_trace::{Trace, TraceBuilder};

/// The rule engine every export judges its telemetry with: the same rules and thresholds as
/// `check`, raised tick by tick as the data arrives. Libraries are this host's only for live
/// sources; a recording from elsewhere says nothing about them.
pub fn engine_for(source: &Source, config: &Config) -> RuleEngine {
    let libraries = source
        .recording
        .is_none()
        .then(crate::report::environment::detect_libraries);
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
    rules::sort(&mut findings);
    findings
}

/// Opens a source like `commands::open_source`, but keeps the findings a replayed recording
/// carries (they belong in a trace) and reads a bug-report bundle as its recording.
pub fn open(args: &SourceArgs, pace: Pace) -> Result<(Source, Vec<Finding>), Error> {
    let (replay, name) = if args.demo {
        (
            ReplayBackend::from_reader(DEMO_RECORDING, pace)?,
            DEMO_NAME.to_string(),
        )
    } else if let Some(path) = &args.replay {
        (
            crate::report::bundle::open_bundle_recording(path, pace)?,
            path.display().to_string(),
        )
    } else {
        return Ok((commands::open_source(args, pace, false)?, Vec::new()));
    };
    let findings = replay.recorded_findings().to_vec();
    let selected = commands::select_devices(replay.devices(), &args.devices)?;
    let findings = findings
        .into_iter()
        .filter(|f| f.device.is_none_or(|d| selected.0.contains(&d)))
        .collect();
    Ok((
        Source {
            backend: commands::harden(Box::new(replay), args.poll_timeout)?,
            selected,
            recording: Some(name),
        },
        findings,
    ))
}

/// Everything one pass over a source produced.
pub struct Capture {
    pub trace: Trace,
    pub findings: Vec<Finding>,
    pub ticks: u64,
    pub warnings: Vec<String>,
}

/// Samples `source` (for `limit` when live; a replay to its end) into a trace, with the findings
/// the rules give at the end and those the recording carried.
pub fn capture_trace(
    source: Source,
    recorded: Vec<Finding>,
    interval: Duration,
    limit: Option<Duration>,
    stop: Option<&AtomicBool>,
    config: &Config,
) -> Result<Capture, Error> {
    let devices = source.devices();
    let is_replay = source.recording.is_some();
    let mut builder = TraceBuilder::new(
        source.backend.name(),
        source.recording.clone(),
        source.backend.host(),
        devices.clone(),
    );
    let mut warnings = source.backend.source_warnings();
    let filter = source.selected.clone();
    let mut collected = Collected::new(engine_for(&source, config));
    let mut sampler = Sampler::spawn(
        source.backend,
        interval,
        if is_replay { None } else { limit },
    );
    let mut failure = None;
    loop {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            sampler.stop();
        }
        match sampler.rx.recv_timeout(Duration::from_millis(100)) {
            Ok(SamplerMsg::Tick(t)) => {
                let t = filter.apply(t);
                builder.push_tick(&t);
                collected.push(t);
            }
            Ok(SamplerMsg::Ended(e)) => {
                failure = e;
                break;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    sampler.stop();
    match failure {
        Some(e) if collected.tick_times.is_empty() => return Err(e.into()),
        Some(e) => warnings.push(format!("sampling stopped early: {e}")),
        None => {}
    }
    if collected.tick_times.is_empty() {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    collected.engine.finish(&collected.history);
    let findings = with_recorded(collected.engine.raised(), &recorded);
    for f in &findings {
        builder.push_finding(f);
    }
    Ok(Capture {
        trace: builder.finish(),
        findings,
        ticks: collected.tick_times.len() as u64,
        warnings,
    })
}

/// `gpudiag trace`: returns the capture (the file is written).
/// `stop` (Ctrl-C) ends a live capture early; what was sampled is still written.
pub fn trace(args: &TraceArgs, stop: &AtomicBool, config: &Config) -> Result<Capture, Error> {
    refuse_existing(&args.output, args.force)?;
    let (source, recorded) = open(&args.source, Pace::AsFastAsPossible)?;
    let capture = capture_trace(
        source,
        recorded,
        args.interval,
        Some(args.duration),
        Some(stop),
        config,
    )?;
    write_json_atomic(&args.output, &capture.trace)?;
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
