//! The job verdict on real multi-GPU jobs: recordings `benches/job_verdicts.sh` made of each
//! workload in benches/workloads/job.py under torchrun on two and four H200s of one host
//! (NVLink), replayed through `check` and `trace`. Each must get its verdict, the slow GPU named,
//! and the balanced ones none.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use gpudiag_core::check::CheckReport;
use gpudiag_model::job::{JobPattern, JoinedBy, Pace};
use gpudiag_model::verdict::{Bottleneck, Confidence};

use crate::support::at;

fn fixture(name: &str) -> PathBuf {
    at("tests/fixtures/jobs").join(format!("{name}.ndjson.gz"))
}

fn check(path: &Path, extra: &[&str]) -> CheckReport {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--json", "--replay"])
        .arg(path)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The straggler's device and pace.
type Named = Option<(u32, Pace)>;

/// (fixture, verdict, the straggler).
const EXPECTED: &[(&str, JobPattern, Named)] = &[
    ("2gpu-balanced", JobPattern::Balanced, None),
    ("2gpu-slow13", JobPattern::Straggler, Some((1, Pace::Leads))),
    ("2gpu-slow2", JobPattern::Straggler, Some((1, Pace::Leads))),
    (
        "2gpu-cpu_starved",
        JobPattern::Straggler,
        Some((1, Pace::Lags)),
    ),
    ("2gpu-shared", JobPattern::Straggler, Some((1, Pace::Leads))),
    ("2gpu-comm", JobPattern::CommunicationBound, None),
    ("2gpu-pipeline", JobPattern::Imbalanced, None),
    ("4gpu-balanced", JobPattern::Balanced, None),
    ("4gpu-slow13", JobPattern::Straggler, Some((2, Pace::Leads))),
    ("4gpu-slow2", JobPattern::Straggler, Some((2, Pace::Leads))),
    (
        "4gpu-cpu_starved",
        JobPattern::Straggler,
        Some((2, Pace::Lags)),
    ),
    ("4gpu-shared", JobPattern::Straggler, Some((2, Pace::Leads))),
    ("4gpu-comm", JobPattern::CommunicationBound, None),
    ("4gpu-pipeline", JobPattern::Imbalanced, None),
];

#[test]
fn every_measured_job_gets_its_verdict_and_the_slow_gpu_is_named() {
    for &(name, verdict, straggler) in EXPECTED {
        let r = check(&fixture(name), &[]);
        assert_eq!(r.jobs.len(), 1, "{name}: {:?}", r.jobs);
        let job = &r.jobs[0];
        let gpus: u32 = name[..1].parse().unwrap();
        assert_eq!(job.members.len() as u32, gpus, "{name}");
        assert_eq!(job.job.joined_by, JoinedBy::RunId, "{name}: torchrun's id");
        assert!(!job.presumed, "{name}");
        assert_eq!(job.verdict, verdict, "{name}: {}", job.title);
        assert_eq!(
            job.stragglers.first().map(|s| (s.device, s.pace)),
            straggler,
            "{name}: {}",
            job.title
        );
        for d in &r.devices {
            let v = d.verdict.as_ref().unwrap();
            let waits = v.bottleneck == Bottleneck::WaitingForPeer;
            // The straggler's peers wait for it; nobody waits in a job without one.
            let should_wait = straggler.is_some_and(|(s, _)| s != d.info.index);
            assert_eq!(
                waits, should_wait,
                "{name} GPU {}: {}",
                d.info.index, v.title
            );
            if waits {
                let (s, _) = straggler.unwrap();
                assert!(
                    v.title.contains(&format!("waits for GPU {s}")),
                    "{}",
                    v.title
                );
                assert!(v.evidence.contains_key("own_bottleneck"), "{name}");
            }
        }
    }
}

#[test]
fn the_straggler_says_what_differs_on_it_and_how_long_its_peers_wait() {
    let shared = check(&fixture("4gpu-shared"), &[]);
    let s = shared.jobs[0].stragglers.first().unwrap();
    assert!(
        s.differs.iter().any(|d| d.starts_with("another process")),
        "{s:?}"
    );
    assert!(
        shared.jobs[0]
            .advice
            .contains("Another process shares its GPU")
    );
    let starved = check(&fixture("4gpu-cpu_starved"), &[]);
    let s = starved.jobs[0].stragglers.first().unwrap();
    assert!(s.differs.iter().any(|d| d.contains("CPU core")), "{s:?}");
    assert!(starved.jobs[0].advice.contains("more CPU"));
    // Twice the work: the others wait about half the time (measured 48%).
    let slow2 = check(&fixture("4gpu-slow2"), &[]);
    let s = slow2.jobs[0].stragglers.first().unwrap();
    let share = s.peers_wait_share.unwrap();
    assert!((0.35..=0.6).contains(&share), "{share}");
    // Its lower clocks come with more power: a consequence of its work, not a cause.
    assert!(
        !s.differs.iter().any(|d| d.contains("clock")),
        "{:?}",
        s.differs
    );
    // 1.3 times the work: about a quarter.
    let slow13 = check(&fixture("4gpu-slow13"), &[]);
    let share = slow13.jobs[0]
        .stragglers
        .first()
        .as_ref()
        .unwrap()
        .peers_wait_share
        .unwrap();
    assert!((0.15..=0.35).contains(&share), "{share}");
}

#[test]
fn a_communication_bound_jobs_gpus_point_at_the_job_not_at_their_grids() {
    let r = check(&fixture("4gpu-comm"), &[]);
    for d in &r.devices {
        let v = d.verdict.as_ref().unwrap();
        assert!(
            v.title.contains("which is communication-bound"),
            "GPU {}: {}",
            d.info.index,
            v.title
        );
        assert!(v.advice.contains("Overlap communication"), "{}", v.advice);
    }
}

#[test]
fn check_text_puts_the_job_first_with_its_gpus_side_by_side() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--replay"])
        .arg(fixture("4gpu-slow2"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let job = text.find("job verdict: straggler").expect(&text);
    let first_gpu = text.find("verdict GPU 0").expect(&text);
    assert!(job < first_gpu, "{text}");
    let marked: Vec<&str> = text.lines().filter(|l| l.contains("◀ straggler")).collect();
    assert_eq!(marked.len(), 1, "{text}");
    assert!(marked[0].trim_start().starts_with("GPU 2 rank 2"), "{text}");
}

/// Writes `from` with every process's `launch` emptied: what a recording made before gpudiag
/// read launchers, or of another user's processes, carries.
fn without_launch(from: &Path, to: &Path) {
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(
        std::fs::File::open(from).unwrap(),
    ));
    let mut out = std::fs::File::create(to).unwrap();
    for line in reader.lines() {
        let mut v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(procs) = v.get_mut("processes").and_then(|p| p.as_array_mut()) {
            for p in procs {
                p["launch"] = serde_json::Value::Null;
            }
        }
        writeln!(out, "{v}").unwrap();
    }
}

/// Writes `from` with every process's launcher keys and name set to what a hostile recording
/// might carry: terminal escapes and a long id.
fn with_hostile_launch(from: &Path, to: &Path) {
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(
        std::fs::File::open(from).unwrap(),
    ));
    let mut out = std::fs::File::create(to).unwrap();
    let run_id = format!("\u{1b}]0;owned\u{7}\u{1b}[2J{}", "r".repeat(4000));
    for line in reader.lines() {
        let mut v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(procs) = v.get_mut("processes").and_then(|p| p.as_array_mut()) {
            for p in procs {
                p["name"] = serde_json::json!("py\u{1b}[31mthon");
                if p["launch"].is_object() {
                    p["launch"]["run_id"] = serde_json::json!(run_id);
                    p["launch"]["master_addr"] = serde_json::json!("\u{1b}[1mnode");
                }
            }
        }
        writeln!(out, "{v}").unwrap();
    }
}

#[test]
fn launcher_keys_from_a_recording_never_reach_the_terminal_raw() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = dir.path().join("hostile.ndjson");
    with_hostile_launch(&fixture("2gpu-slow2"), &hostile);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--replay"])
        .arg(&hostile)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("job verdict: straggler"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    // The id is still told apart, shortened in the title.
    assert!(text.contains("torchrun run \\x1b]0;owne…"), "{text}");
}

#[test]
fn without_launcher_keys_the_job_is_presumed_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare.ndjson");
    without_launch(&fixture("4gpu-slow2"), &bare);
    let r = check(&bare, &[]);
    assert_eq!(r.jobs.len(), 1, "{:?}", r.jobs);
    let job = &r.jobs[0];
    assert!(job.presumed);
    assert_eq!(job.job.joined_by, JoinedBy::SameExecutable);
    assert_eq!(job.confidence, Confidence::Low);
    assert!(job.title.starts_with("Presumed job"), "{}", job.title);
    assert_eq!(job.stragglers.first().map(|s| s.device), Some(2));
}

#[test]
fn a_window_too_short_for_a_step_is_not_judged_and_says_why() {
    let r = check(&fixture("4gpu-slow2"), &["--window", "3s"]);
    assert!(r.jobs.is_empty(), "{:?}", r.jobs);
    let why = r
        .not_judged
        .iter()
        .find(|n| n.rule == "job")
        .expect("a job entry in not_judged");
    assert!(why.reason.contains("too short"), "{}", why.reason);
}

#[test]
fn the_trace_carries_the_job_verdict_on_its_own_track() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace.json");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "trace", "--replay"])
        .arg(fixture("2gpu-cpu_starved"))
        .arg("--output")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let job: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["cat"] == "job,overall")
        .collect();
    assert_eq!(job.len(), 1, "{job:?}");
    assert_eq!(job[0]["args"]["verdict"], "straggler");
    assert_eq!(job[0]["args"]["stragglers"][0]["device"], 1);
    let track = events
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == job[0]["tid"])
        .expect("the job track is named");
    assert_eq!(track["args"]["name"], "job verdict");
}

#[test]
fn a_single_gpu_workload_has_no_job_verdict() {
    let r = check(&at("tests/fixtures/workloads/bf16_matmul.ndjson.gz"), &[]);
    assert!(r.jobs.is_empty(), "{:?}", r.jobs);
    assert!(!r.not_judged.iter().any(|n| n.rule == "job"));
}
