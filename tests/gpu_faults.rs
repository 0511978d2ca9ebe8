//! GPU tests of the fault paths on live NVML (`.gpu-bundle/run-gpu-tests`), ignored elsewhere:
//! the fault schedule of `GPUDIAG_TEST_FAULTS` wraps the real NVML backend, so the per-poll
//! deadline and the plausibility check are exercised where a vendor library is really called.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
use gpu::gpudiag;

use serde_json::Value;

fn findings(report: &Value) -> Vec<(String, u64)> {
    report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["findings"].as_array().unwrap().iter())
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_owned(),
                f["device"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn live_check_survives_a_hung_poll_and_absurd_values() {
    let out = gpudiag()
        .args([
            "check",
            "--json",
            "--window",
            "3s",
            "--interval",
            "100ms",
            "--poll-timeout",
            "300ms",
        ])
        .env(
            "GPUDIAG_TEST_FAULTS",
            "value:temp_gpu_c=1e9@3#0;value:power_w=-50@4#0;hang:1500ms@6",
        )
        .output()
        .expect("gpudiag runs");
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ids = findings(&report);
    for id in ["telemetry.implausible", "telemetry.stalled"] {
        assert!(ids.contains(&(id.to_owned(), 0)), "{id} missing: {ids:?}");
    }
    let d0 = &report["devices"][0];
    assert!(d0["summary"]["temp_gpu_c"]["max"].as_f64().unwrap() < 200.0);
    assert!(d0["summary"]["power_w"]["min"].as_f64().unwrap() >= 0.0);
    // Sampling went on after the stall: the window holds more ticks than the hang left.
    assert!(
        report["window"]["ticks"].as_u64().unwrap() >= 10,
        "{}",
        report["window"]
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn live_check_marks_a_lost_and_a_missing_gpu() {
    let out = gpudiag()
        .args(["check", "--json", "--window", "2s", "--interval", "100ms"])
        .env("GPUDIAG_TEST_FAULTS", "gone@3..6#0;lost@10#0")
        .output()
        .expect("gpudiag runs");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ids = findings(&report);
    for id in ["device.missing", "device.lost", "errors.xid_79"] {
        assert!(ids.contains(&(id.to_owned(), 0)), "{id} missing: {ids:?}");
    }
    assert_eq!(
        report["devices"][0]["latest"]["absent"]["gpu_util_pct"],
        "gpu_lost"
    );
}
