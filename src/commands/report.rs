//! `gpudiag report`: records the source the flags name and judges the redacted recording (the
//! check report, the trace) for the bundle writer in `gpudiag_export::bundle_writer`, which redacts,
//! gathers the host's facts and writes the archive.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cli::ReportArgs;
use crate::stop::Stop;
use gpudiag_core::check::{CheckRequest, NoProbes};
use gpudiag_core::config::RulesConfig;
use gpudiag_core::pipeline::{Pipeline, Sink};
use gpudiag_core::rules::engine::RuleEngine;
use gpudiag_core::session::{self, Limit, Origin, RunOptions, Source, SourceSpec, open_source};
use gpudiag_export::bundle_writer::{self, BundleOptions, Captured, host};
use gpudiag_model::error::{Error, exit};
use gpudiag_model::finding::Finding;
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::recording::{Header, Record};
use gpudiag_telemetry::replay::{Pace, ReplayBackend};

/// How `gpudiag report` writes a bundle: the writer's options, and what the bundle's check
/// report and trace are judged with.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// Replace host names, user names, command-line arguments and home paths.
    pub redact: bool,
    /// Rule thresholds for the check report and the trace's findings.
    pub config: gpudiag_core::config::Config,
    /// Sampling interval, for the check report's window.
    pub interval: Duration,
    pub init_timeout: Duration,
    /// Where this host's facts are read from: the real system but in tests.
    pub roots: host::Roots,
}

/// Records the source the flags name: `--duration` of live sampling, or the whole replay.
pub fn capture(args: &ReportArgs, stop: &AtomicBool) -> Result<Captured, Error> {
    let source = open_source(&args.source.spec()?, Pace::AsFastAsPossible, false)?;
    let recorded = source.recorded.clone();
    let live = source.is_this_host();
    let devices = source.devices();
    let header = Header::new(
        source.backend.name(),
        source.backend.host().clone(),
        devices.clone(),
        live.then_some(args.interval.as_millis() as u64),
    );
    let backend = source.backend.name().to_string();
    let recording = source.recording.clone();
    // The bundle's check report and trace are judged later, from the redacted recording.
    let mut pipeline = Pipeline::new(RuleEngine::new(
        RulesConfig::default(),
        devices.clone(),
        None,
        None,
    ));
    let mut sink = CaptureSink(Vec::new());
    let opts = RunOptions {
        interval: args.interval,
        limit: Limit::Live(args.duration),
        stop: Some(stop),
    };
    let end = session::run_to_end(source, &mut pipeline, &opts, &mut sink)?;
    // A recording read as it streams (from a pipe) knows the findings it carries at its end.
    let recorded = end.notes.map_or(recorded, |n| n.recorded);
    let mut records = sink.0;
    let sampled = records.iter().any(|r| matches!(r, Record::Sample(_)));
    match end.failure {
        Some(gpudiag_telemetry::BackendError::Recording(e)) => return Err(e.into()),
        Some(e) if !sampled => return Err(e.into()),
        Some(e) => eprintln!(
            "gpudiag: sampling stopped early: {}",
            gpudiag_model::printable::line(&e.to_string())
        ),
        None => {}
    }
    if !sampled {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    records.extend(recorded.into_iter().map(Record::Finding));
    Ok(Captured {
        header,
        records,
        backend,
        recording,
        live,
        devices,
    })
}

/// Keeps every tick as recording lines, events before samples and NCCL RAS answers after, as
/// the recorder writes them.
struct CaptureSink(Vec<Record>);

impl Sink for CaptureSink {
    fn on_tick(&mut self, tick: &Tick, _: &[Finding], _: &Pipeline) -> Result<(), Error> {
        self.0
            .extend(tick.events.iter().cloned().map(Record::Event));
        self.0
            .extend(tick.samples.iter().cloned().map(Record::Sample));
        self.0.extend(tick.ras.iter().cloned().map(Record::Ras));
        Ok(())
    }
}

/// `gpudiag report`: writes the bundle and says where. Ctrl-C ends a live capture early; the
/// bundle is still written, whole.
pub fn report(
    args: &ReportArgs,
    stop: &Stop,
    config: &gpudiag_core::config::Config,
) -> Result<i32, Error> {
    let path = write_report(args, &stop.flag(), config)?;
    eprintln!("gpudiag: wrote the bug-report bundle {}", path.display());
    Ok(exit::OK)
}

/// Writes the bundle `args` asks for; returns its path.
fn write_report(
    args: &ReportArgs,
    stop: &AtomicBool,
    config: &gpudiag_core::config::Config,
) -> Result<PathBuf, Error> {
    let out = args
        .output
        .clone()
        .unwrap_or_else(bundle_writer::default_name);
    gpudiag_export::refuse_existing(&out, args.force)?;
    let cap = capture(args, stop)?;
    write_bundle(
        &out,
        &cap,
        &ReportOptions {
            redact: !args.no_redact,
            config: config.clone(),
            interval: args.interval,
            init_timeout: args.source.init_timeout,
            roots: host::Roots::default(),
        },
    )?;
    Ok(out)
}

/// Writes the bundle of `cap` to `out` (atomically; an existing file is replaced, so callers
/// that must not overwrite check first).
pub fn write_bundle(out: &Path, cap: &Captured, opts: &ReportOptions) -> Result<(), Error> {
    let prepared = bundle_writer::prepare(
        cap,
        &BundleOptions {
            redact: opts.redact,
            roots: opts.roots.clone(),
        },
    )?;
    let recording_gz = prepared.recording_gz().to_vec();
    let recording_name = prepared.recording_name().map(str::to_string);

    // The check report and the trace come from the redacted recording.
    // `check` reads a recording from a path: a private temporary file, removed right after.
    let tmp = std::env::temp_dir().join(format!(
        "gpudiag-report-{}-{}.ndjson.gz",
        std::process::id(),
        gpudiag_model::sample::now_ms()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&recording_gz))
        .map_err(|e| Error::io(format!("cannot write {}", tmp.display()), e))?;
    let request = CheckRequest {
        interval: opts.interval,
        ..CheckRequest::new(SourceSpec {
            init_timeout: opts.init_timeout,
            ..SourceSpec::new(Origin::File(tmp.clone()))
        })
    };
    // A bundle never runs probes: it judges what was recorded.
    let check = gpudiag_core::check::run(&request, &opts.config, &NoProbes);
    let _ = std::fs::remove_file(&tmp);
    let check = check?;

    let replay = ReplayBackend::from_reader(Cursor::new(recording_gz), Pace::AsFastAsPossible)?;
    let source = Source::from_backend(Box::new(replay), recording_name.clone())?;
    let trace = super::trace::capture_trace(source, opts.interval, None, None, &opts.config)?.trace;
    prepared.write(out, check, trace)
}
