#![allow(clippy::unwrap_used, clippy::expect_used)]
//! When the engine asks NCCL's RAS, on a real job: a 2-GPU torchrun job replayed from its
//! recording (`tests/fixtures/jobs/`), and its answers fed back as ticks.

use std::path::PathBuf;

use gpudiag_core::config::RulesConfig;
use gpudiag_core::history::History;
use gpudiag_core::rules::engine::RuleEngine;
use gpudiag_core::rules::ras_log::{SLOW_INTERVAL_MS, STUCK_INTERVAL_MS, ras_evidence};
use gpudiag_model::ras::{RasFailure, RasNotJudged};
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::{Backend, Tick};

fn replayed(name: &str) -> (RuleEngine, u64) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/jobs")
        .join(format!("{name}.ndjson.gz"));
    let mut replay = ReplayBackend::open(&path, Pace::AsFastAsPossible).expect("replay");
    let mut engine = RuleEngine::new(
        RulesConfig::default(),
        replay.devices().to_vec(),
        Some(replay.host().clone()),
        None,
    );
    let mut history = History::default();
    let mut last = 0;
    while let Ok(t) = replay.poll() {
        for s in &t.samples {
            history.push_sample(s);
            last = last.max(s.time_ms);
        }
        engine.on_tick(&history, &t);
    }
    engine.finish(&history);
    (engine, last)
}

#[test]
fn a_job_of_two_gpus_is_asked_at_the_slow_cadence_and_its_answers_are_kept() {
    let (mut engine, end) = replayed("2gpu-balanced");
    let job = engine.jobs().first().cloned().expect("a job");
    let queries = engine.ras_queries(end);
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].address, "localhost:28028");
    let mut devices = queries[0].for_devices.clone();
    devices.sort_unstable();
    assert_eq!(devices, [0, 1]);
    // Asked: not again before the slow cadence, even at the stuck one (the job is balanced).
    assert!(engine.ras_queries(end + STUCK_INTERVAL_MS).is_empty());
    assert_eq!(engine.ras_queries(end + SLOW_INTERVAL_MS).len(), 1);

    // An answer that came back with a tick is kept for the verdict.
    let answer = gpudiag_model::ras::RasAnswer::failed(
        end + 1,
        "localhost:28028",
        devices,
        RasFailure::Refused,
        "nothing listens at localhost:28028",
    );
    let history = History::default();
    engine.on_tick(
        &history,
        &Tick {
            samples: Vec::new(),
            events: Vec::new(),
            ras: vec![answer],
        },
    );
    assert_eq!(engine.ras_log().answers().count(), 1);
    let e = ras_evidence(engine.ras_log(), &job.members, end + 2);
    assert_eq!(e.not_judged, Some(RasNotJudged::NotEnabled));
}
