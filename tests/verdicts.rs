//! The bottleneck verdicts of real workloads: recordings `gpudiag run --record` made on an H200
//! of each workload in benches/workloads/ (benches/verdicts.py), replayed through `check`. Each
//! must get the verdict its bottleneck calls for, with the evidence and advice that go with it.

use gpudiag_core::check::CheckReport;
use gpudiag_model::verdict::{Basis, Bottleneck};

fn check(workload: &str) -> CheckReport {
    let path = format!(
        "{}/tests/fixtures/workloads/{workload}.ndjson.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["check", "--json", "--replay", &path])
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn verdict(r: &CheckReport) -> &gpudiag_model::verdict::Verdict {
    r.devices[0].verdict.as_ref().expect("a verdict")
}

#[test]
fn every_workload_gets_its_bottleneck_from_the_profiling_counters() {
    for (workload, expected) in [
        ("bf16_matmul", Bottleneck::ComputeBound),
        ("fp32_matmul_no_tf32", Bottleneck::ComputeBound),
        ("elementwise", Bottleneck::MemoryBound),
        ("small_grid", Bottleneck::Underfilled),
        ("tiny_sync", Bottleneck::SyncBound),
        ("host_sleep", Bottleneck::HostBound),
        ("pageable_copy", Bottleneck::CopyBound),
        ("idle_holding", Bottleneck::IdleHoldingMemory),
    ] {
        let r = check(workload);
        let v = verdict(&r);
        assert_eq!(v.bottleneck, expected, "{workload}: {}", v.title);
        assert_eq!(v.basis, Basis::ProfilingCounters, "{workload}");
        // The process is named: it was the only one on the GPU.
        assert!(v.pid.is_some(), "{workload}: {v:?}");
        // Waste verdicts warn, good ones do not.
        let warned = r.devices[0]
            .findings
            .iter()
            .any(|f| f.id == "utilisation.low");
        assert_eq!(warned, expected.is_waste(), "{workload}");
    }
}

#[test]
fn the_verdict_says_whether_tensor_cores_do_the_work() {
    let bf16 = check("bf16_matmul");
    assert!(
        verdict(&bf16).title.contains("on tensor cores"),
        "{}",
        verdict(&bf16).title
    );
    let fp32 = check("fp32_matmul_no_tf32");
    let v = verdict(&fp32);
    assert!(v.title.contains("tensor cores idle"), "{}", v.title);
    assert!(v.advice.contains("TF32"), "{}", v.advice);
}

#[test]
fn evidence_carries_the_counters_that_decided() {
    let r = check("small_grid");
    let v = verdict(&r);
    let util = v.evidence["gpu_util_mean_pct"].as_f64().unwrap();
    let sm = v.evidence["sm_active_mean_pct"].as_f64().unwrap();
    // "Utilised" most of the time, SMs nearly empty: the case utilisation alone calls healthy.
    assert!(util > 50.0 && sm < 2.0, "util {util} SM {sm}");
    let copies = check("pageable_copy");
    assert!(
        verdict(&copies).advice.contains("pin_memory"),
        "{}",
        verdict(&copies).advice
    );
}

#[test]
fn a_run_with_a_startup_phase_shows_it() {
    let r = check("bf16_matmul");
    let phases: Vec<Bottleneck> = r.devices[0].phases.iter().map(|p| p.bottleneck).collect();
    assert_eq!(phases.last(), Some(&Bottleneck::ComputeBound), "{phases:?}");
}

/// A GPU without profiling counters (older than Hopper, vGPU, refused): every counter is absent
/// with its reason, the text says so once, and the verdict falls back to utilisation and says it
/// is weaker.
#[test]
fn without_gpm_the_counters_say_why_once_and_the_verdict_is_weaker() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no_gpm.ndjson");
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/recordings/healthy.ndjson"
    ))
    .unwrap();
    let mut out = String::new();
    for line in src.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["kind"] == "sample" {
            for f in gpudiag_model::sample::PROFILING_FIELDS {
                v[*f] = serde_json::Value::Null;
                v["absent"][*f] = serde_json::json!("not_supported");
            }
        }
        out.push_str(&v.to_string());
        out.push('\n');
    }
    std::fs::write(&path, out).unwrap();
    let run = |json: bool| {
        let mut args = vec!["check", "--replay", path.to_str().unwrap()];
        if json {
            args.insert(1, "--json");
        }
        std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
            .args(&args)
            .output()
            .unwrap()
    };
    let text = String::from_utf8(run(false).stdout).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("profiling counters"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("not supported"), "{text}");
    assert!(!text.contains("SM active n/a"), "{text}");
    let report: CheckReport = serde_json::from_slice(&run(true).stdout).unwrap();
    let v = verdict(&report);
    assert_eq!(v.basis, Basis::Utilisation);
    assert!(v.advice.contains("verdict is weaker"), "{}", v.advice);
    assert!(v.advice.contains("cannot tell"), "{}", v.advice);
    let latest = report.devices[0].latest.as_ref().unwrap();
    assert_eq!(latest.sm_active_pct, None);
    assert_eq!(
        latest.why_absent("sm_active_pct"),
        Some(&gpudiag_model::sample::Absent::NotSupported)
    );
}

/// The steady leak (64 MiB kept every ~0.1 s for 20 s on the H200) is found by the leak rule
/// within the short run, whatever verdict its little compute earns.
#[test]
fn a_steady_leak_is_found_within_the_run() {
    let r = check("leak");
    let leak = r.devices[0]
        .findings
        .iter()
        .find(|f| f.id == "memory.possible_leak")
        .unwrap_or_else(|| panic!("{:?}", r.devices[0].findings));
    assert!(leak.title.contains("python3"), "{}", leak.title);
}

/// A window whose bottleneck changed names the bottleneck that held most of it, with each
/// one's share, and lists the phases with the process that held the GPU.
#[test]
fn a_mixed_window_leads_with_what_held_most_of_it_and_lists_the_phases() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["check", "--demo"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("phases GPU 0 (the window changed bottleneck 4 times; the verdict above names the one that held most of it):"),
        "{text}"
    );
    assert!(text.contains("idle_holding_memory"), "{text}");
    assert!(text.contains("compute_bound"), "{text}");
    // The demo computed for 60 s of 125: under half, so never "the good case" for the window.
    let headline = text
        .lines()
        .find(|l| l.starts_with("verdict GPU 0"))
        .unwrap();
    assert!(
        headline.contains(
            "a window of phases, mostly compute-bound (48%): compute-bound 48%, copy-bound 24%"
        ),
        "{headline}"
    );
    assert!(!text.contains("this is the good case"), "{text}");
    let json = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--demo", "--json"])
        .output()
        .unwrap();
    let report: gpudiag_core::check::CheckReport = serde_json::from_slice(&json.stdout).unwrap();
    let v = report.devices[0].verdict.as_ref().unwrap();
    let shares = v.evidence["phase_shares"].as_object().unwrap();
    let total: f64 = shares.values().map(|s| s.as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 0.02, "{shares:?}");
    assert_eq!(v.evidence["whole_window_bottleneck"], "compute_bound");
    assert_eq!(
        v.window_s().round(),
        125.0,
        "the headline speaks for the whole window"
    );
}
