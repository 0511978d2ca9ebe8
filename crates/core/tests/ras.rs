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
    replayed_with(name, |_| {})
}

/// The replay with each process's launch edited as it is read.
fn replayed_with(name: &str, edit: impl Fn(&mut gpudiag_model::job::Launch)) -> (RuleEngine, u64) {
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
    while let Ok(mut t) = replay.poll() {
        for p in t
            .samples
            .iter_mut()
            .flat_map(|s| s.processes.iter_mut().flatten())
        {
            if let Some(l) = p.launch.as_mut() {
                edit(l);
            }
        }
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
            kernels: None,
        },
    );
    assert_eq!(engine.ras_log().answers().count(), 1);
    let e = ras_evidence(engine.ras_log(), &job.members, end + 2);
    assert_eq!(e.not_judged, Some(RasNotJudged::NotEnabled));
}

#[test]
fn the_jobs_own_address_is_asked_and_its_own_network_namespace_is_not() {
    let (mut engine, end) = replayed_with("2gpu-balanced", |l| {
        l.nccl_ras_addr = Some("127.0.0.1:29999".into());
    });
    let queries = engine.ras_queries(end);
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].address, "127.0.0.1:29999");

    let (mut engine, end) = replayed_with("2gpu-balanced", |l| {
        l.net_namespace = Some(gpudiag_model::job::NetNamespace::Own(4026532101));
    });
    let job = engine.jobs().first().cloned().expect("a job");
    assert!(engine.ras_queries(end).is_empty());
    let e = ras_evidence(engine.ras_log(), &job.members, end);
    assert_eq!(e.not_judged, Some(RasNotJudged::OwnNetNamespace), "{e:?}");
    assert!(e.summary.contains("network namespace"), "{}", e.summary);
}
