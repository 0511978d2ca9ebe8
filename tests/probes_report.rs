//! A check report carrying probe results (as `check --probes` writes it) validates against the
//! check-report schema, and survives a round trip through the typed report. No GPU needed: the
//! probe results are built in Rust and attached to the demo recording's report.

use gpudiag_core::check::CheckReport;
use gpudiag_probes::gpu::GpuInfo;
use gpudiag_probes::runner::DeviceProbes;
use gpudiag_probes::{Measurement, ProbeResult, Span, Verdict};
use serde_json::{Value, json};

use crate::support;

fn probes() -> DeviceProbes {
    let mut r = ProbeResult::new("bandwidth", 0);
    r.param("bytes", 1u64 << 30);
    r.metrics.push(
        Measurement::new(
            "h2d_pinned",
            55.4,
            "GB/s",
            "cuMemcpyAsync (libcuda, CUDA 13.0)",
            vec![55.3, 55.4, 55.5],
        )
        .with_expected(Some(63.0)),
    );
    r.spans.push(Span {
        name: "h2d_pinned".into(),
        start_ms: 1,
        duration_ms: 310.0,
    });
    r.details
        .insert("ecc_before".into(), json!({"corrected_volatile": null}));
    let mut m = ProbeResult::new("matmul", 0);
    m.verdict = Verdict::Skipped;
    m.note = Some("needs cuBLASLt".into());
    DeviceProbes {
        index: 0,
        gpu: Some(GpuInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            multiprocessors: 132,
            total_memory_bytes: 150_754_820_096,
            pci_bus_id: "0000:19:00.0".into(),
            driver_cuda_version: "13.0".into(),
            context_ms: 310.0,
        }),
        model: Some("H200".into()),
        refused: None,
        name: None,
        forcible: false,
        busy_pids: Vec::new(),
        results: vec![r, m],
    }
}

#[test]
fn a_report_with_probe_results_validates_and_round_trips() {
    let out = support::gpudiag()
        .args(["check", "--demo", "--json"])
        .output()
        .unwrap();
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let attached = probes();
    v["devices"][0]["probes"] = serde_json::to_value(&attached).unwrap();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/schema/check-report.schema.json"
    );
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&v)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let typed: CheckReport = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(typed.devices[0].probes.as_ref(), Some(&attached));
    // A wrong verdict or a missing figure field is caught.
    let mut bad = v.clone();
    bad["devices"][0]["probes"]["results"][0]["verdict"] = json!("great");
    assert!(!validator.is_valid(&bad));
    let mut bad = v;
    bad["devices"][0]["probes"]["results"][0]["metrics"][0]
        .as_object_mut()
        .unwrap()
        .remove("served_by");
    assert!(!validator.is_valid(&bad));
}

fn gpudiag(args: &[&str]) -> std::process::Output {
    support::gpudiag().args(args).output().unwrap()
}

#[test]
fn probe_usage_errors_exit_2() {
    let out = gpudiag(&["probe", "p2q"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no probe 'p2q'"));
    assert_eq!(
        gpudiag(&["probe", "--suite", "huge"]).status.code(),
        Some(2)
    );
    // Probes need live GPUs: a recording cannot be probed.
    assert_eq!(
        gpudiag(&["check", "--demo", "--probes", "quick"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(gpudiag(&["check", "--force"]).status.code(), Some(2));
}

#[test]
fn probe_without_a_driver_says_so_and_exits_3() {
    // CI machines have no libcuda; on a GPU host this test has nothing to prove.
    if gpudiag_probes::gpu::driver_present() {
        return;
    }
    let out = gpudiag(&["probe", "latency"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("libcuda"));
}
