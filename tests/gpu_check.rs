//! GPU tests: run on a host with an NVIDIA GPU (`.gpu-bundle/run-gpu-tests`), ignored elsewhere.
//! They compare `gpudiag check --json` with `nvidia-smi --query-gpu` read around the same moment.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
use gpu::gpudiag;
use std::process::Command;

use gpudiag_core::check::CheckReport;

const QUERY: &str = "index,utilization.gpu,memory.used,power.draw,temperature.gpu,clocks.sm,\
                     pcie.link.gen.current,pcie.link.width.current,memory.total";

/// One row per GPU of `nvidia-smi --query-gpu`, as numbers (None for "[N/A]").
fn nvidia_smi() -> Vec<Vec<Option<f64>>> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={QUERY}"),
            "--format=csv,noheader,nounits",
        ])
        .output()
        .expect("nvidia-smi runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(|f| f.trim().parse().ok()).collect())
        .collect()
}

/// Schemas are read relative to the working directory: on the GPU host the tests run from the
/// repository root, where the build machine's paths do not exist.
fn validate_against_schema(report: &serde_json::Value) {
    let text = std::fs::read_to_string("assets/schema/check-report.schema.json")
        .expect("run from the repository root");
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
}

fn check_json(extra: &[&str]) -> CheckReport {
    let out = gpudiag()
        .args(["check", "--json"])
        .args(extra)
        .output()
        .expect("gpudiag runs");
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    validate_against_schema(&value);
    serde_json::from_value(value).expect("check --json is a check report")
}

/// `ours` must lie within `tol` of the range nvidia-smi showed before and after.
fn agrees(what: &str, ours: Option<f64>, before: Option<f64>, after: Option<f64>, tol: f64) {
    let ours = ours.unwrap_or_else(|| panic!("{what}: gpudiag reported nothing"));
    let (a, b) = (before.expect(what), after.expect(what));
    let (lo, hi) = (a.min(b) - tol, a.max(b) + tol);
    assert!(
        (lo..=hi).contains(&ours),
        "{what}: gpudiag {ours} outside nvidia-smi [{a}, {b}] ± {tol}"
    );
    eprintln!("{what}: gpudiag {ours:.1}, nvidia-smi {a:.1} / {b:.1}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn check_json_matches_nvidia_smi() {
    let before = nvidia_smi();
    let report = check_json(&["--window", "0"]);
    let after = nvidia_smi();
    assert_eq!(report.schema_version, 3);
    assert_eq!(report.source.backend, "nvml");
    assert_eq!(report.devices.len(), before.len());
    let libcuda = report
        .libraries
        .as_ref()
        .and_then(|l| l.iter().find(|l| l.name == "libcuda"))
        .expect("libcuda listed");
    assert!(libcuda.found && libcuda.version.is_some(), "{libcuda:?}");
    for (d, (b, a)) in report.devices.iter().zip(before.iter().zip(&after)) {
        let s = d.latest.as_ref().expect("a sample");
        let mib = |v: Option<u64>| v.map(|x| x as f64 / (1024.0 * 1024.0));
        agrees("utilisation %", s.gpu_util_pct, b[1], a[1], 10.0);
        agrees("memory used MiB", mib(s.mem_used_bytes), b[2], a[2], 256.0);
        agrees("memory total MiB", mib(s.mem_total_bytes), b[8], a[8], 1.0);
        agrees("power W", s.power_w, b[3], a[3], 25.0);
        agrees("temperature C", s.temp_gpu_c, b[4], a[4], 3.0);
        agrees(
            "SM clock MHz",
            s.sm_clock_mhz.map(f64::from),
            b[5],
            a[5],
            150.0,
        );
        agrees("PCIe gen", s.pcie_gen.map(f64::from), b[6], a[6], 0.0);
        agrees("PCIe width", s.pcie_width.map(f64::from), b[7], a[7], 0.0);
        assert!(
            d.info
                .uuid
                .as_deref()
                .is_some_and(|u| u.starts_with("GPU-"))
        );
        assert!(d.info.compute_capability.is_some());
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn windowed_check_collects_several_ticks_and_slow_fields() {
    let report = check_json(&["--window", "2s", "--interval", "100ms"]);
    assert!(report.window.ticks >= 15, "ticks {}", report.window.ticks);
    for d in &report.devices {
        let util = &d.summary[&gpudiag_model::sample::Metric::GpuUtilPct];
        assert!(util.count >= 15);
        // PCIe throughput is a slow field (own cadence): after 2 s it must have been read.
        let s = d.latest.as_ref().unwrap();
        assert!(s.pcie_rx_bytes_per_s.is_some(), "absent: {:?}", s.absent);
        assert!(s.processes.is_some(), "absent: {:?}", s.absent);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn record_then_replay_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rec.ndjson.gz");
    let status = gpudiag()
        .args(["record", "--duration", "2s", "--interval", "100ms", "-o"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(status.success());
    let out = gpudiag()
        .args(["check", "--json", "--replay"])
        .arg(&file)
        .output()
        .unwrap();
    let report: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.source.backend, "replay");
    assert!(report.window.ticks >= 15, "ticks {}", report.window.ticks);
    assert!(
        report.source.warnings.is_empty(),
        "{:?}",
        report.source.warnings
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn interrupted_recording_keeps_everything_sampled() {
    let dir = tempfile::tempdir().unwrap();
    for (signal, name) in [("-INT", "int.ndjson.gz"), ("-TERM", "term.ndjson")] {
        let file = dir.path().join(name);
        let mut child = gpudiag()
            .args(["record", "--interval", "100ms", "-o"])
            .arg(&file)
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let killed = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "{signal}: a signal ends a recording cleanly"
        );
        let out = gpudiag()
            .args(["check", "--json", "--replay"])
            .arg(&file)
            .output()
            .unwrap();
        let report: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            report.window.ticks >= 10,
            "{signal}: ticks {}",
            report.window.ticks
        );
        assert!(
            report.source.warnings.is_empty(),
            "{signal}: the file was finished, not cut off: {:?}",
            report.source.warnings
        );
    }
}
