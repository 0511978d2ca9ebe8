//! SIGINT and SIGTERM during `record`, `trace` and `report` leave a valid file: a recording
//! readable to its last full line (SIGKILL too), a trace or bundle whole or absent, never half
//! written, and no temporary files behind. The source is the fake amdgpu sysfs tree in
//! tests/fixtures: a live, paced backend with no GPU, so a signal lands mid-capture (a replay
//! runs as fast as it can and would finish first). Waits are bounds against hangs, not timings.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpudiag_telemetry::recording::{self, Record};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::support::at;

const HANG: Duration = Duration::from_secs(60);

fn sysfs_root() -> PathBuf {
    at("tests/fixtures/sysfs/mi300x")
}

/// `gpudiag ARGS` on the fake sysfs GPU, sampling every 50 ms.
fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(args)
        .args(["--backend", "sysfs", "--sysfs-root"])
        .arg(sysfs_root())
        .args(["--interval", "50ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), sig).unwrap();
}

/// Waits for the exit (bounded); returns (code, stderr). `None` as code when killed by a signal.
fn finish(mut child: Child) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("gpudiag did not exit after the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Samples in the recording at `path` so far (0 while it cannot be read yet).
fn samples_in(path: &Path) -> usize {
    recording::read_all(path).map_or(0, |(_, records, _)| {
        records
            .iter()
            .filter(|r| matches!(r, Record::Sample(_)))
            .count()
    })
}

fn wait_for_samples(path: &Path, n: usize) {
    let start = Instant::now();
    while samples_in(path) < n {
        assert!(
            start.elapsed() < HANG,
            "no samples recorded in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Names in `dir` other than `keep`: temporary files left behind.
fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

#[test]
fn record_ends_cleanly_on_sigint_and_sigterm() {
    for (sig, name) in [
        (Signal::SIGINT, "int.ndjson"),
        (Signal::SIGTERM, "term.ndjson.gz"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        let child = spawn(&["record", "-o", path.to_str().unwrap()]);
        wait_for_samples(&path, 3);
        signal(&child, sig);
        let (code, err) = finish(child);
        assert_eq!(code, Some(0), "{sig}: {err}");
        assert!(err.contains("recorded"), "{sig}: {err}");
        // Finished, not cut: every line whole, the gzip trailer written.
        let (header, records, stats) = recording::read_all(&path).unwrap();
        assert!(!stats.is_truncated(), "{sig}: {stats:?}");
        assert_eq!(header.backend, "sysfs");
        let samples = records
            .iter()
            .filter(|r| matches!(r, Record::Sample(_)))
            .count();
        assert!(samples >= 3, "{sig}: {samples} samples");
        assert_eq!(leftovers(dir.path(), &[name]), Vec::<String>::new());
    }
}

#[test]
fn record_killed_outright_is_readable_to_its_last_full_line() {
    for name in ["killed.ndjson", "killed.ndjson.gz"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        let child = spawn(&["record", "-o", path.to_str().unwrap()]);
        wait_for_samples(&path, 3);
        signal(&child, Signal::SIGKILL);
        let (code, _) = finish(child);
        assert_eq!(code, None, "killed by the signal");
        let (_, records, stats) = recording::read_all(&path).unwrap();
        assert!(
            records
                .iter()
                .filter(|r| matches!(r, Record::Sample(_)))
                .count()
                >= 3,
            "{name}: {stats:?}"
        );
        // The gzip stream has no trailer after a kill; the reader says so.
        if name.ends_with(".gz") {
            assert!(stats.is_truncated(), "{name}: {stats:?}");
        }
        // `check` reads it too, and reports the cut.
        let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
            .args(["check", "--json", "--replay"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["devices"].as_array().unwrap().len(), 1);
    }
}

/// A trace written after a signal mid-capture is whole and holds what was sampled.
#[test]
fn trace_is_written_whole_on_sigint_and_sigterm() {
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.json");
        let child = spawn(&["trace", "--duration", "10m", "-o", path.to_str().unwrap()]);
        // Long enough for a few 50 ms samples on a loaded machine.
        std::thread::sleep(Duration::from_millis(1500));
        signal(&child, sig);
        let (code, err) = finish(child);
        assert_eq!(code, Some(0), "{sig}: {err}");
        let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let counters = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "C")
            .count();
        assert!(counters > 0, "{sig}: no counters in the trace");
        assert_eq!(leftovers(dir.path(), &["trace.json"]), Vec::<String>::new());
    }
}

/// A bundle written after a signal mid-capture is whole and replays.
#[test]
fn report_is_written_whole_on_sigint_and_sigterm() {
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bundle.tar.gz");
        let child = spawn(&["report", "--duration", "10m", "-o", path.to_str().unwrap()]);
        std::thread::sleep(Duration::from_millis(1500));
        signal(&child, sig);
        let (code, err) = finish(child);
        assert_eq!(code, Some(0), "{sig}: {err}");
        let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
            .args(["check", "--json", "--replay"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{sig}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["source"]["backend"], "replay");
        assert!(report["devices"][0]["latest"].is_object(), "{report}");
        assert_eq!(
            leftovers(dir.path(), &["bundle.tar.gz"]),
            Vec::<String>::new()
        );
    }
}

/// Whenever the signal comes (before the handler is in place, during the capture, during the
/// write), the output is whole or absent, and nothing temporary stays behind.
#[test]
fn outputs_are_whole_or_absent_whenever_the_signal_comes() {
    let mut outcomes = Vec::new();
    for delay_ms in [0u64, 5, 20, 60, 150, 400, 1000] {
        for (cmd, name) in [("trace", "out.json"), ("report", "out.tar.gz")] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(name);
            let child = spawn(&[cmd, "--duration", "10m", "-o", path.to_str().unwrap()]);
            std::thread::sleep(Duration::from_millis(delay_ms));
            signal(&child, Signal::SIGTERM);
            let (code, err) = finish(child);
            let what = format!("{cmd} SIGTERM after {delay_ms} ms: exit {code:?}: {err}");
            if path.exists() {
                assert_eq!(code, Some(0), "{what}");
                let bytes = std::fs::read(&path).unwrap();
                if cmd == "trace" {
                    serde_json::from_slice::<Value>(&bytes).expect(&what);
                } else {
                    // Every member there, each readable to its end.
                    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
                    let mut members = Vec::new();
                    for entry in archive.entries().unwrap() {
                        let mut entry = entry.unwrap();
                        std::io::copy(&mut entry, &mut std::io::sink()).unwrap();
                        members.push(entry.path().unwrap().display().to_string());
                    }
                    assert_eq!(
                        members,
                        [
                            "README.txt",
                            "check-report.json",
                            "recording.ndjson.gz",
                            "trace.json",
                            "environment.json"
                        ],
                        "{what}"
                    );
                }
                assert_eq!(
                    leftovers(dir.path(), &[name]),
                    Vec::<String>::new(),
                    "{what}"
                );
                outcomes.push((cmd, delay_ms, "written"));
            } else {
                // Killed before the handler was installed (no status code), or stopped before
                // the first sample: a usage error that says so.
                assert!(
                    code.is_none() || (code == Some(2) && err.contains("no telemetry samples")),
                    "{what}"
                );
                assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new(), "{what}");
                outcomes.push((cmd, delay_ms, "absent"));
            }
        }
    }
    eprintln!("{outcomes:?}");
    // The later signals come mid-capture, so each command wrote its file at least once.
    for cmd in ["trace", "report"] {
        assert!(
            outcomes.iter().any(|o| o.0 == cmd && o.2 == "written"),
            "{outcomes:?}"
        );
    }
}
