//! The job verdict on real recordings of jobs whose truth is known: the fixtures of the
//! sensitivity measurement (docs/jobs.md, "Sensitivity"; `tests/fixtures/jobs/sensitivity/`,
//! each cut to its steady part by benches/cut_recording.py, its truth in `NAME.truth.json`).
//! With today's thresholds the balanced stay balanced and a rank slowed 1.2× or more is named,
//! in `check` over the whole fixture and in every window of 10 s and 30 s that slides along it
//! (judged as `check --window` judges the end of a recording), so a threshold moved either way
//! fails here.

use std::path::PathBuf;

use gpudiag_core::check::CheckReport;
use gpudiag_core::config::Config;
use gpudiag_core::session::{Origin, Session, SourceSpec};
use gpudiag_model::job::{JobPattern, JobVerdict};
use gpudiag_telemetry::BackendError;

use crate::support::at;

fn fixture(name: &str) -> PathBuf {
    at("tests/fixtures/jobs/sensitivity").join(format!("{name}.ndjson.gz"))
}

/// What a fixture's job must read.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Balanced,
    /// A straggler verdict naming this GPU alone.
    Named(u32),
    /// Below what today's thresholds name (1.05× and 1.1×; ResNet's 1.2× and 1.3×, whose
    /// lead is smaller than the factor): balanced, or this GPU named alone; never another GPU,
    /// never another verdict.
    NamedOrBalanced(u32),
}

/// (fixture, the job's GPUs, what the job reads). Two jobs of two GPUs share the host in the
/// `mm2-*` and `rn2-*` recordings; the truth of each is in its `.truth.json` (factor, slowed
/// GPU, model: `slow` names the matmul job with one rank slowed).
const CASES: &[(&str, &[u32], Expect)] = &[
    ("mm2-a", &[0, 1], Expect::Balanced),
    ("mm2-a", &[2, 3], Expect::NamedOrBalanced(3)), // 1.05×
    ("mm2-b", &[0, 1], Expect::NamedOrBalanced(1)), // 1.1×
    ("mm2-b", &[2, 3], Expect::Named(3)),           // 1.2×
    ("mm2-c", &[0, 1], Expect::Named(1)),           // 1.3×
    ("mm2-c", &[2, 3], Expect::Balanced),
    ("mm4-10", &[0, 1, 2, 3], Expect::Balanced),
    ("mm4-11", &[0, 1, 2, 3], Expect::NamedOrBalanced(3)), // 1.1×
    ("mm4-12", &[0, 1, 2, 3], Expect::Named(3)),           // 1.2×
    ("rn2-a", &[0, 1], Expect::Balanced),
    ("rn2-a", &[2, 3], Expect::NamedOrBalanced(3)), // ResNet, 1.1×
    ("rn2-b", &[0, 1], Expect::NamedOrBalanced(1)), // ResNet, 1.2×
    ("rn2-b", &[2, 3], Expect::NamedOrBalanced(3)), // ResNet, 1.3×
];

/// The job on exactly these GPUs.
fn job_on<'a>(jobs: &'a [JobVerdict], gpus: &[u32]) -> Result<&'a JobVerdict, String> {
    jobs.iter()
        .find(|j| {
            let mut d: Vec<u32> = j.devices().collect();
            d.sort_unstable();
            d == gpus
        })
        .ok_or_else(|| {
            let all: Vec<Vec<u32>> = jobs.iter().map(|j| j.devices().collect()).collect();
            format!("no job on GPUs {gpus:?} (jobs on {all:?})")
        })
}

fn check(name: &str) -> CheckReport {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--json", "--replay"])
        .arg(fixture(name))
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether `job` reads as `expect`; the job in words otherwise.
fn agrees(job: &JobVerdict, expect: Expect) -> Result<(), String> {
    let named: Vec<u32> = job.stragglers.iter().map(|s| s.device).collect();
    let straggler = |d: u32| job.verdict == JobPattern::Straggler && named == [d];
    let ok = match expect {
        Expect::Balanced => job.verdict == JobPattern::Balanced,
        Expect::Named(d) => straggler(d),
        Expect::NamedOrBalanced(d) => job.verdict == JobPattern::Balanced || straggler(d),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?}: {} (stragglers {named:?})",
            job.verdict, job.title
        ))
    }
}

/// The job's verdict at the end of every `window_s` window ending each 5 s of the fixture's
/// time: the ticks pushed through a session's pipeline, each window judged by the engine's
/// `finish_within`, the judgement `check --window` makes of a recording's end. Returns (the
/// window's end in seconds from the first tick, the job verdicts).
fn sliding(name: &str, window_s: u64) -> Vec<(f64, Vec<JobVerdict>)> {
    let config = Config::default();
    let spec = SourceSpec::new(Origin::File(fixture(name)));
    let mut session = Session::setup(&config).open(&spec).unwrap();
    let mut source = session.take_source().unwrap();
    let window = window_s * 1000;
    let mut first = None;
    let mut next = None;
    let mut out = Vec::new();
    loop {
        let tick = match source.backend.poll() {
            Ok(t) => source.selected.apply(t),
            Err(BackendError::EndOfRecording) => break,
            Err(e) => panic!("{name}: {e}"),
        };
        let now = tick.samples.iter().map(|s| s.time_ms).max();
        session.pipeline.push(tick);
        let Some(now) = now else { continue };
        let t0 = *first.get_or_insert(now);
        let due = next.get_or_insert(t0 + window);
        if now < *due {
            continue;
        }
        while *due <= now {
            *due += 5_000;
        }
        let p = &mut session.pipeline;
        p.engine.finish_within(&p.history, now + 1 - window, now);
        out.push(((now - t0) as f64 / 1000.0, p.engine.jobs().to_vec()));
    }
    out
}

#[test]
fn each_fixtures_job_reads_its_truth_over_the_whole_fixture() {
    let mut wrong = Vec::new();
    for &(name, gpus, expect) in CASES {
        let r = check(name);
        if let Err(e) = job_on(&r.jobs, gpus).and_then(|j| agrees(j, expect)) {
            wrong.push(format!("{name} {gpus:?}: expected {expect:?}, got {e}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn each_window_sliding_along_a_fixture_reads_its_truth() {
    let mut wrong = Vec::new();
    let mut judged = 0;
    for &(name, gpus, expect) in CASES {
        for window_s in [10, 30] {
            let windows = sliding(name, window_s);
            assert!(
                windows.len() >= 2,
                "{name}: {} windows of {window_s} s",
                windows.len()
            );
            for (end_s, jobs) in windows {
                judged += 1;
                if let Err(e) = job_on(&jobs, gpus).and_then(|j| agrees(j, expect)) {
                    wrong.push(format!(
                        "{name} {gpus:?}, {window_s} s ending at {end_s:.1} s: expected \
                         {expect:?}, got {e}"
                    ));
                }
            }
        }
    }
    // 13 jobs, each judged over at least two windows of each length.
    assert!(judged >= CASES.len() * 4, "{judged} windows judged");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
