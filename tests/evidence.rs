//! Verdicts whose confidence and words match their evidence (issue: what the hostile checks
//! found): profiling counters for part of a window, phases merged from slices, a recording in
//! which nothing can be read, and per-process evidence after the processes left.

use std::path::Path;

use gpudiag_core::check::CheckReport;
use gpudiag_model::finding::Status;
use gpudiag_model::verdict::{Basis, Bottleneck, Confidence};
use serde_json::{Value, json};

use crate::support::{fixture, run as gpudiag};

const T0: u64 = 1_767_225_600_000;
const GIB: u64 = 1 << 30;

const COUNTERS: [&str; 8] = [
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_active_pct",
    "fp64_active_pct",
    "fp32_active_pct",
    "fp16_active_pct",
    "int_active_pct",
];

/// The healthy recording's GPU for `secs` seconds, one sample a second, each edited by `edit`.
fn recording_of(path: &Path, secs: u64, edit: impl Fn(u64, &mut Value)) {
    let healthy = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let mut lines = healthy.lines();
    let mut text = format!("{}\n", lines.next().unwrap());
    let template: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    for t in 0..secs {
        let mut sample = template.clone();
        sample["time_ms"] = (T0 + t * 1000).into();
        edit(t, &mut sample);
        text.push_str(&format!("{sample}\n"));
    }
    std::fs::write(path, text).unwrap();
}

/// A tensor-core matmul as the profiling counters see it.
fn compute_bound(s: &mut Value) {
    s["gpu_util_pct"] = 100.0.into();
    s["power_w"] = 600.0.into();
    for (k, v) in [
        ("sm_active_pct", 90.0),
        ("sm_occupancy_pct", 40.0),
        ("tensor_active_pct", 80.0),
        ("dram_active_pct", 20.0),
        ("fp64_active_pct", 0.0),
        ("fp32_active_pct", 5.0),
        ("fp16_active_pct", 0.0),
        ("int_active_pct", 2.0),
    ] {
        s[k] = v.into();
    }
    no_absent(s, &COUNTERS);
}

/// A one-warp spin with the counters gone: NVML utilisation still reads 100%.
fn spin_without_counters(s: &mut Value) {
    s["gpu_util_pct"] = 100.0.into();
    s["power_w"] = 120.0.into();
    for k in COUNTERS {
        s[k] = Value::Null;
        s["absent"][k] = "not_supported".into();
    }
}

fn no_absent(s: &mut Value, keys: &[&str]) {
    if let Some(absent) = s["absent"].as_object_mut() {
        for k in keys {
            absent.remove(*k);
        }
    }
}

fn check(path: &Path) -> (CheckReport, i32) {
    let run = gpudiag(&["check", "--json", "--replay", path.to_str().unwrap()]);
    let report = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", run.stdout, run.stderr));
    (report, run.code)
}

#[test]
fn counters_for_half_the_window_say_so_and_lower_the_confidence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("half.ndjson");
    recording_of(&path, 60, |t, s| {
        if t < 30 {
            compute_bound(s)
        } else {
            spin_without_counters(s)
        }
    });
    let (report, _) = check(&path);
    let v = report.devices[0].verdict.as_ref().unwrap();
    assert_ne!(v.confidence, Confidence::High, "{v:?}");
    let coverage = v.evidence["profiling_counter_coverage"].as_f64().unwrap();
    assert!((coverage - 0.5).abs() < 0.05, "{coverage}");
    assert!(
        v.title.contains("profiling counters in 50% of it"),
        "{}",
        v.title
    );
    // The stretch without counters is judged on its own, and said.
    assert!(
        v.title.contains("without profiling counters read"),
        "{}",
        v.title
    );
    // Phases split where the counters stop, each judged from what it had.
    let phases = &report.devices[0].phases;
    assert_eq!(phases.len(), 2, "{phases:#?}");
    assert_eq!(phases[0].basis, Basis::ProfilingCounters);
    assert_eq!(phases[0].confidence, Confidence::High);
    assert_eq!(phases[1].basis, Basis::Utilisation);
    assert_eq!(phases[1].confidence, Confidence::Low);
}

#[test]
fn counters_in_every_other_sample_lower_the_confidence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alternate.ndjson");
    recording_of(&path, 60, |t, s| {
        if t % 2 == 0 {
            compute_bound(s)
        } else {
            spin_without_counters(s)
        }
    });
    let (report, _) = check(&path);
    let v = report.devices[0].verdict.as_ref().unwrap();
    assert_eq!(v.bottleneck, Bottleneck::ComputeBound);
    assert_eq!(v.confidence, Confidence::Medium, "{v:?}");
    assert!(
        v.title.contains("profiling counters in 50% of it"),
        "{}",
        v.title
    );

    // Counters on every sample keep the verdict's full confidence and its words.
    recording_of(&path, 60, |_, s| compute_bound(s));
    let (report, _) = check(&path);
    let v = report.devices[0].verdict.as_ref().unwrap();
    assert_eq!(v.confidence, Confidence::High);
    assert!(!v.title.contains("profiling counters in"), "{}", v.title);
    assert!(v.evidence.get("profiling_counter_coverage").is_none());
}

#[test]
fn a_merged_phase_describes_its_whole_span() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("merged.ndjson");
    // Idle 21 s, then 39 s of matmul: two phases, the second merged from four 10 s slices
    // (a slice runs from its start to 10 s later inclusive, so the change falls between two).
    recording_of(&path, 60, |t, s| {
        if t < 21 {
            s["gpu_util_pct"] = 0.0.into();
            for k in COUNTERS {
                s[k] = 0.0.into();
            }
            no_absent(s, &COUNTERS);
        } else {
            compute_bound(s)
        }
    });
    let (report, _) = check(&path);
    let phases = &report.devices[0].phases;
    assert_eq!(phases.len(), 2, "{phases:#?}");
    for p in phases {
        let span_s = (p.end_ms - p.start_ms) as f64 / 1000.0;
        let said = format!("over {span_s:.0} s");
        assert!(p.title.contains(&said), "{said} in {}", p.title);
        assert_eq!(
            p.evidence["window_s"].as_f64().unwrap().round(),
            span_s.round()
        );
    }
    assert!(phases[1].end_ms - phases[1].start_ms >= 38_000);
}

#[test]
fn a_recording_with_nothing_readable_is_not_judged_not_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blind.ndjson");
    recording_of(&path, 30, |_, s| {
        let keys: Vec<String> = s
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !["kind", "time_ms", "device", "absent"].contains(&k.as_str()))
            .cloned()
            .collect();
        for k in keys {
            s[&k] = Value::Null;
            s["absent"][&k] = "not_supported".into();
        }
    });
    let (report, code) = check(&path);
    assert_eq!(report.status, Status::NotJudged);
    assert_eq!(report.exit_code, 3);
    assert_eq!(code, 3);
    assert!(
        report
            .not_judged
            .iter()
            .any(|n| n.rule == "all" && n.device == Some(0)),
        "{:?}",
        report.not_judged
    );
    let text = gpudiag(&["check", "--replay", path.to_str().unwrap()]);
    assert_eq!(text.code, 3);
    assert!(
        text.stdout.contains("status: not_judged"),
        "{}",
        text.stdout
    );

    // One readable value is something judged: the same recording with temperatures is healthy.
    recording_of(&path, 30, |_, s| {
        s["temp_gpu_c"] = 40.0.into();
    });
    let (report, code) = check(&path);
    assert_eq!(report.status, Status::Healthy);
    assert_eq!(code, 0);
}

#[test]
fn without_a_driver_check_json_prints_a_document_and_scripts_are_not_fooled() {
    // This machine (and CI) has no NVIDIA driver.
    let run = gpudiag(&["check", "--json", "--backend", "nvml"]);
    if run.code != 3 {
        eprintln!("an NVIDIA driver answered here: nothing to test");
        return;
    }
    let report: CheckReport = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {:?} {}", run.stdout, run.stderr));
    assert_eq!(report.status, Status::CouldNotRun);
    assert_eq!(report.exit_code, 3);
    assert!(
        report
            .could_not_run
            .as_deref()
            .is_some_and(|w| !w.is_empty())
    );
    assert!(report.devices.is_empty());

    // `gpudiag | cat`: no demo report in place of the host's, and exit 3.
    let piped = gpudiag(&[]);
    assert_eq!(piped.code, 3, "{}", piped.stderr);
    assert!(piped.stdout.is_empty(), "{}", piped.stdout);
    assert!(piped.stderr.contains("gpudiag --demo"), "{}", piped.stderr);
    let demo = gpudiag(&["--demo"]);
    assert_eq!(demo.code, 0, "{}", demo.stderr);
    assert!(demo.stdout.contains("status:"), "{}", demo.stdout);
}

#[test]
fn per_process_evidence_outlives_the_processes_and_an_idle_holder_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trainer.ndjson");
    // A trainer (busy SMs, a core of CPU) beside an idle process holding 20 GiB, then both
    // exit and the last 3 s have no processes: `run` judges after its command exited.
    recording_of(&path, 33, |t, s| {
        compute_bound(s);
        s["processes"] = if t < 30 {
            json!([
                {"pid": 100, "name": "python3", "used_memory_bytes": 30 * GIB,
                 "sm_util_pct": 95.0, "cpu_time_s": 10.0 + t as f64},
                {"pid": 200, "name": "jupyter", "used_memory_bytes": 20 * GIB,
                 "sm_util_pct": 0.0, "cpu_time_s": 5.0}
            ])
        } else {
            json!([])
        };
        no_absent(s, &["processes"]);
    });
    let (report, _) = check(&path);
    let v = report.devices[0].verdict.as_ref().unwrap();
    let trainer = v.processes.iter().find(|p| p.pid == 100).unwrap();
    assert!(trainer.sm_util_pct.is_some_and(|u| u > 90.0), "{trainer:?}");
    assert!(
        trainer.cpu_pct.is_some_and(|c| (c - 100.0).abs() < 5.0),
        "{trainer:?}"
    );
    let idle = v.processes.iter().find(|p| p.pid == 200).unwrap();
    assert_eq!(idle.sm_util_pct, Some(0.0));
    assert!(
        v.title
            .contains("jupyter (pid 200) holds 20.0 GiB and runs nothing"),
        "{}",
        v.title
    );
    assert!(v.advice.contains("200"), "{}", v.advice);
}
