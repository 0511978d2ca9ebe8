//! GPU tests of the exports: `gpudiag trace` and `gpudiag report` on live GPUs (run with
//! `.gpu-bundle/run-gpu-tests` on a GPU host, from the repository root; ignored elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
use gpu::gpudiag;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use flate2::read::GzDecoder;
use gpudiag_core::check::CheckReport;
use gpudiag_export::bundle_writer::host::Environment;
use gpudiag_export::chrome_trace::{self, Phase, Trace};

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("gpudiag runs");
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn gpu_count() -> usize {
    let out = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .expect("nvidia-smi runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .count()
}

/// The same checks as the CPU tests, on the typed trace.
fn check_trace(trace: &Trace, gpus: usize) {
    assert_eq!(chrome_trace::validate(trace), Vec::<String>::new());
    let text = std::fs::read_to_string("assets/schema/chrome-trace.schema.json")
        .expect("run from the repository root");
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    let value = serde_json::to_value(trace).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "trace schema errors: {errors:#?}");
    let processes: BTreeSet<u32> = trace
        .trace_events
        .iter()
        .filter(|e| {
            e.ph == Phase::Metadata && e.name == "process_name" && e.pid != chrome_trace::HOST_PID
        })
        .map(|e| e.pid)
        .collect();
    assert_eq!(processes.len(), gpus);
    for pid in &processes {
        let util = trace
            .trace_events
            .iter()
            .filter(|e| e.ph == Phase::Counter && e.pid == *pid && e.name == "util %")
            .count();
        assert!(util >= 1, "GPU pid {pid} has no utilisation counter");
        assert!(
            trace
                .trace_events
                .iter()
                .any(|e| e.ph == Phase::Counter && e.pid == *pid && e.name == "power W"),
            "GPU pid {pid} has no power counter"
        );
    }
}

fn validate_check_report(value: &serde_json::Value) {
    let text = std::fs::read_to_string("assets/schema/check-report.schema.json")
        .expect("run from the repository root");
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn trace_of_live_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("live.json");
    let msg = run_ok(
        gpudiag()
            .args(["trace", "--duration", "3s", "--interval", "100ms", "-o"])
            .arg(&out),
    );
    eprintln!("{msg}");
    let trace: Trace = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    check_trace(&trace, gpu_count());
    assert_eq!(trace.other_data.backend, "nvml");
    // About 3 s of samples at 100 ms.
    let last = trace.trace_events.iter().map(|e| e.ts).max().unwrap();
    assert!((2_500_000..=4_500_000).contains(&last), "last ts {last} µs");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn report_of_live_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("live.tar.gz");
    let msg = run_ok(
        gpudiag()
            .args(["report", "--duration", "3s", "-o"])
            .arg(&out),
    );
    eprintln!("{msg}");
    let gpus = gpu_count();
    let mut members = Vec::new();
    let mut archive = tar::Archive::new(GzDecoder::new(std::fs::File::open(&out).unwrap()));
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).unwrap();
        members.push((name, bytes));
    }
    let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "README.txt",
            "check-report.json",
            "recording.ndjson.gz",
            "trace.json",
            "environment.json"
        ]
    );
    let get = |n: &str| &members.iter().find(|(m, _)| m == n).unwrap().1;

    let value: serde_json::Value = serde_json::from_slice(get("check-report.json")).unwrap();
    validate_check_report(&value);
    let check: CheckReport = serde_json::from_value(value).unwrap();
    assert_eq!(check.devices.len(), gpus);
    assert_eq!(check.source.backend, "nvml");
    assert!(
        check.window.ticks >= 8,
        "{} ticks in 3 s at 250 ms",
        check.window.ticks
    );
    assert!(
        check
            .libraries
            .as_ref()
            .is_some_and(|l| l.iter().any(|l| l.name == "libcuda" && l.found))
    );

    let trace: Trace = serde_json::from_slice(get("trace.json")).unwrap();
    check_trace(&trace, gpus);

    let env: Environment = serde_json::from_slice(get("environment.json")).unwrap();
    assert_eq!(env.pci.len(), gpus);
    for p in &env.pci {
        let dir = p.sysfs_path.as_deref().expect("a sysfs path per GPU");
        assert!(Path::new(dir).is_dir(), "{dir}");
        assert!(p.max_link_width.is_some(), "{p:?}");
        assert!(p.current_link_speed.is_some(), "{p:?}");
        eprintln!(
            "GPU {} {:?}: numa {:?}, link {:?} x{:?} (max {:?} x{:?}) {}",
            p.gpu,
            p.bus_id,
            p.numa_node,
            p.current_link_speed,
            p.current_link_width,
            p.max_link_speed,
            p.max_link_width,
            p.note.as_deref().unwrap_or("")
        );
    }
    eprintln!(
        "kernel log: readable {} via {:?}, {} line(s), note {:?}",
        env.kernel_log.readable,
        env.kernel_log.source,
        env.kernel_log.lines.len(),
        env.kernel_log.note
    );

    // Redacted by default: this host's name appears nowhere.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    if host.len() >= 4 {
        for (name, bytes) in &members {
            let text = if name.ends_with(".gz") {
                let mut plain = Vec::new();
                GzDecoder::new(&bytes[..]).read_to_end(&mut plain).unwrap();
                plain
            } else {
                bytes.clone()
            };
            assert!(
                !String::from_utf8_lossy(&text).contains(host),
                "{host} appears in {name}"
            );
        }
    }

    // The bundle replays on this (or any) machine.
    let replay = gpudiag()
        .args(["check", "--json", "--replay"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        matches!(replay.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let again: CheckReport = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(again.devices.len(), gpus);
}
