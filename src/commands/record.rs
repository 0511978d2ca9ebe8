//! `gpudiag record`: the pipeline's ticks and findings written to a recording as they arrive.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cli::RecordArgs;
use crate::stop::Stop;
use gpudiag_core::config::Config;
use gpudiag_core::pipeline::{Pipeline, Sink};
use gpudiag_core::rules::engine::RuleEngine;
use gpudiag_core::session::{self, Limit, RunOptions, open_source};
use gpudiag_model::cuda_libraries;
use gpudiag_model::error::{Error, exit};
use gpudiag_model::finding::Finding;
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::recording::{Header, Record, RecordingError, RecordingWriter};
use gpudiag_telemetry::replay::Pace;

/// `gpudiag record`: says how many ticks it wrote. Ctrl-C ends the recording cleanly: the
/// sampler stops and the file is finished.
pub fn record(args: &RecordArgs, stop: &Stop, config: &Config) -> Result<i32, Error> {
    let ticks = record_ticks(args, stop.flag(), config)?;
    eprintln!(
        "gpudiag: recorded {ticks} tick(s) to {}",
        args.output.display()
    );
    Ok(exit::OK)
}

/// Records what `args` asks for; returns the number of ticks written.
fn record_ticks(args: &RecordArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<u64, Error> {
    let source = open_source(&args.source.spec()?, Pace::AsFastAsPossible, false)?;
    let libraries = source.is_this_host().then(cuda_libraries::detect_libraries);
    // A replay plays at its own recorded spacing, so --interval says nothing about it.
    let interval_ms = source
        .is_this_host()
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
    let mut engine = RuleEngine::new(
        config.rules.clone(),
        header.devices.clone(),
        Some(header.host.clone()),
        libraries,
    );
    if source.is_this_host() {
        engine = engine.excluding_own_process();
    }
    let mut pipeline = Pipeline::new(engine).retaining(RECORD_RETAIN);
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
