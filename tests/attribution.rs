//! `check --json` carrying who owns each GPU process, on a live (amdgpu sysfs) fake tree with
//! the fake kubelet beside it, and the kubelet flags' usage errors. Reading the owners from fake
//! /proc trees and the kubelet is tested in `crates/telemetry/tests/attribution.rs`.

use std::process::Command;

// What the kubelet test needs: the fake kubelet speaks the client's gRPC messages, so it runs
// with the `kubernetes` feature (the default) only.
#[cfg(feature = "kubernetes")]
use {
    crate::support::at,
    crate::support::kubelet::{Behaviour, FakeKubelet, pod},
    serde_json::Value,
    std::path::PathBuf,
};

#[cfg(feature = "kubernetes")]
const UID_A: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

#[cfg(feature = "kubernetes")]
fn fixture() -> PathBuf {
    at("tests/fixtures/attribution")
}

/// `check --json` on a live (amdgpu sysfs) fake tree whose GPU process runs in a pod, with
/// the fake kubelet on the side: the report carries the process's pod and the GPU's.
#[cfg(feature = "kubernetes")]
#[test]
fn check_json_reports_the_attribution() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mi300x");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(at("tests/fixtures/sysfs/mi300x"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(copied.success());
    // The GPU user (pid 4242) moves into a pod; the plugin names the GPU by its PCI address.
    let pid = root.join("proc/4242");
    std::fs::write(
        pid.join("cgroup"),
        std::fs::read(fixture().join("proc/2001/cgroup")).unwrap(),
    )
    .unwrap();
    let kubelet = FakeKubelet::start(Behaviour::Answer(vec![pod(
        "ml",
        "train-0",
        &[("trainer", &["0000:03:00.0"])],
    )]));
    let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["check", "--json", "--backend", "sysfs", "--window", "0"])
        .arg("--sysfs-root")
        .arg(&root)
        .arg("--kubelet-socket")
        .arg(kubelet.socket())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let latest = &report["devices"][0]["latest"];
    assert_eq!(latest["gpu_pods"][0]["name"], "train-0");
    assert_eq!(latest["gpu_pods"][0]["containers"][0], "trainer");
    let process = latest["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == 4242)
        .unwrap();
    let pod = &process["attribution"]["pod"];
    assert_eq!(pod["uid"], UID_A);
    assert_eq!(pod["runtime"], "containerd");
    assert_eq!(pod["namespace"], "ml");
    assert_eq!(pod["name"], "train-0");
    assert_eq!(pod["container"], "trainer");
    assert_eq!(pod["matched_by"], "gpu_allocation");
    assert_eq!(process["attribution"]["job"], Value::Null);
}

#[test]
fn bad_kubelet_flags_are_usage_errors() {
    for timeout in ["0s", "5ms", "2m", "soon"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
            .args(["check", "--demo", "--kubelet-timeout", timeout])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{timeout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--kubelet-timeout"), "{stderr}");
    }
}
