#![allow(clippy::unwrap_used, clippy::expect_used)]

//! `gpudiag run -- CMD` without a GPU: the command runs, its exit code comes back, signals are
//! forwarded, and gpudiag says it could not watch. (The verdicts themselves are checked on
//! recordings in tests/rules.rs and on the GPU host in tests/gpu_run.rs.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn gpudiag() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpudiag"));
    // No GPU here; keep the AMD probe off real sysfs so the outcome does not depend on the host.
    c.env("GPUDIAG_SYSFS_ROOT", "/nonexistent-sysfs-root");
    c
}

#[test]
fn the_commands_exit_code_comes_back_and_not_watching_is_said() {
    let out = gpudiag()
        .args(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("err\n"), "{err}");
    assert!(err.contains("exited with code 7"), "{err}");
    assert!(err.contains("could not watch the GPUs"), "{err}");
}

#[test]
fn a_command_that_cannot_start_is_exit_2_with_the_reason() {
    let out = gpudiag()
        .args(["run", "--", "/no/such/program", "--flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot start /no/such/program"), "{err}");
    assert!(err.contains("No such file"), "{err}");
    let out = gpudiag().args(["run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no command is a usage error");
}

#[test]
fn a_signal_that_kills_the_command_is_128_plus_n() {
    let out = gpudiag()
        .args(["run", "--", "sh", "-c", "kill -KILL $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
    assert!(String::from_utf8_lossy(&out.stderr).contains("killed by signal 9"));
}

#[test]
fn sigterm_to_gpudiag_reaches_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("got-term");
    let script = format!(
        "trap 'touch {}; exit 42' TERM; sleep 30 & wait",
        marker.display()
    );
    let mut child = gpudiag()
        .args(["run", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let the shell install its trap.
    std::thread::sleep(Duration::from_millis(700));
    let started = Instant::now();
    unsafe_kill(child.id(), 15);
    let status = child.wait().unwrap();
    assert!(marker.exists(), "the command never saw SIGTERM");
    assert_eq!(status.code(), Some(42));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn json_says_what_ran_and_why_nothing_was_watched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let out = gpudiag()
        .args(["run", "--json"])
        .arg(&path)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(report["command"], serde_json::json!(["true"]));
    assert_eq!(report["exit_code"], 0);
    assert!(
        report["not_watched"].as_str().unwrap().contains("NVML")
            || report["not_watched"].as_str().unwrap().contains("NVIDIA")
    );
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/schema/run-report.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&report)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

fn unsafe_kill(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
