//! `gpudiag trace`, `gpudiag report` and `gpudiag serve` end to end on recordings: every trace
//! event checked, bundles listed and parsed back, redaction of planted secrets, bundles replayed,
//! and the HTTP server's answers to good, slow and malformed clients.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use flate2::read::GzDecoder;
use gpudiag_core::check::CheckReport;
use gpudiag_export::bundle_writer::host::Environment;
use gpudiag_export::chrome_trace::{self, Trace};
use gpudiag_telemetry::recording::{self, Record};
use serde_json::Value;

use crate::support::serve::serve;
use crate::support::{Run, at, fixture, run as gpudiag, s};

fn ok(run: &Run) {
    assert_eq!(
        run.code, 0,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Trace

/// Checks every event of a trace as a viewer needs it, on the raw JSON (independently of the
/// typed structs), and returns the events by phase.
fn check_trace_json(v: &Value) -> BTreeMap<String, Vec<Value>> {
    assert_eq!(v["otherData"]["format"], "gpudiag-trace");
    assert_eq!(v["otherData"]["version"], 1);
    assert_eq!(v["displayTimeUnit"], "ms");
    let events = v["traceEvents"].as_array().expect("traceEvents array");
    let mut by_phase: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut last: BTreeMap<(u64, u64, bool), u64> = BTreeMap::new();
    let mut named_pids = BTreeSet::new();
    let mut named_threads = BTreeSet::new();
    for (i, e) in events.iter().enumerate() {
        let ctx = format!("event {i}: {e}");
        let name = e["name"].as_str().expect(&ctx);
        assert!(!name.is_empty(), "{ctx}");
        let ph = e["ph"].as_str().expect(&ctx);
        let ts = e["ts"].as_u64().expect(&ctx);
        let pid = e["pid"].as_u64().expect(&ctx);
        let tid = e["tid"].as_u64().expect(&ctx);
        match ph {
            "M" => {
                assert!(
                    [
                        "process_name",
                        "thread_name",
                        "process_sort_index",
                        "thread_sort_index"
                    ]
                    .contains(&name),
                    "{ctx}"
                );
                if name.ends_with("_name") {
                    assert!(!e["args"]["name"].as_str().expect(&ctx).is_empty(), "{ctx}");
                } else {
                    assert!(e["args"]["sort_index"].is_number(), "{ctx}");
                }
                if name == "process_name" {
                    named_pids.insert(pid);
                }
                if name == "thread_name" {
                    named_threads.insert((pid, tid));
                }
            }
            "C" => {
                let args = e["args"].as_object().expect(&ctx);
                assert!(!args.is_empty(), "{ctx}");
                assert!(
                    args.values()
                        .all(|a| a.as_f64().is_some_and(f64::is_finite)),
                    "{ctx}"
                );
            }
            "i" => assert!(
                ["t", "p", "g"].contains(&e["s"].as_str().expect(&ctx)),
                "{ctx}"
            ),
            "X" => {
                e["dur"].as_u64().expect(&ctx);
            }
            other => panic!("unexpected phase {other}: {ctx}"),
        }
        if ph != "M" {
            let key = (pid, tid, ph == "C");
            if let Some(prev) = last.insert(key, ts) {
                assert!(prev <= ts, "ts goes back from {prev}: {ctx}");
            }
        }
        by_phase.entry(ph.to_string()).or_default().push(e.clone());
    }
    for (pid, tid, _) in last.keys() {
        assert!(named_pids.contains(pid), "pid {pid} unnamed");
        assert!(
            named_threads.contains(&(*pid, *tid)),
            "thread {pid}/{tid} unnamed"
        );
    }
    // And the typed view agrees.
    let typed: Trace = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(chrome_trace::validate(&typed), Vec::<String>::new());
    assert_eq!(serde_json::to_value(&typed).unwrap(), *v);
    by_phase
}

fn trace_of(args: &[&str]) -> (Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace.json");
    let mut all = vec!["trace", "-o", s(&out)];
    all.extend_from_slice(args);
    let run = gpudiag(&all);
    ok(&run);
    assert!(run.stderr.contains("traced"), "{}", run.stderr);
    // Only the trace is left: the temporary file was renamed.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["trace.json"]);
    (
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap(),
        dir,
    )
}

#[test]
fn trace_of_the_demo_is_valid_and_has_every_group() {
    let (v, _dir) = trace_of(&["--demo"]);
    let by = check_trace_json(&v);
    let counters: BTreeSet<&str> = by["C"]
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for group in [
        "util %",
        "memory MiB",
        "power W",
        "temp C",
        "clocks MHz",
        "PCIe MB/s",
    ] {
        assert!(counters.contains(group), "{group} missing: {counters:?}");
    }
    // The demo ramps to full load, where the H200 hits its power cap.
    let throttles: Vec<&str> = by["X"]
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(throttles.contains(&"sw_power_cap"), "{throttles:?}");
    assert!(!throttles.contains(&"gpu_idle"));
    let max_util = by["C"]
        .iter()
        .filter(|e| e["name"] == "util %")
        .filter_map(|e| e["args"]["gpu"].as_f64())
        .fold(0.0, f64::max);
    assert_eq!(max_util, 100.0);
    assert_eq!(v["otherData"]["recording"], "demo.ndjson.gz (bundled)");
}

#[test]
fn trace_of_every_fixture_is_valid() {
    for f in [
        "all_kinds.ndjson",
        "ecc_error.ndjson",
        "healthy.ndjson",
        "newer_kinds.ndjson",
        "profiled.ndjson",
        "sparse.ndjson",
        "two_gpus.ndjson",
        "gpu_lost.ndjson",
    ] {
        let (v, _dir) = trace_of(&["--replay", s(&fixture(f))]);
        check_trace_json(&v);
        assert_eq!(v["otherData"]["start_ms"], 1_767_225_600_000u64, "{f}");
    }
}

#[test]
fn trace_carries_findings_xids_and_throttle_intervals() {
    let (v, _dir) = trace_of(&["--replay", s(&fixture("ecc_error.ndjson"))]);
    let by = check_trace_json(&v);
    let instants: Vec<(&str, &str)> = by["i"]
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["cat"].as_str().unwrap()))
        .collect();
    assert!(instants.contains(&("XID 48", "xid")), "{instants:?}");
    let ecc = by["i"]
        .iter()
        .find(|e| e["args"]["id"] == "errors.ecc_uncorrectable")
        .expect("the ECC finding");
    assert_eq!(ecc["args"]["severity"], "fail");
    assert_eq!(ecc["cat"], "finding,fail");
    assert_eq!(ecc["pid"], 1);

    // all_kinds: the finding the recording carries, a host-wide XID, a lost device.
    let (v, _dir) = trace_of(&["--replay", s(&fixture("all_kinds.ndjson"))]);
    let by = check_trace_json(&v);
    let names: Vec<(&str, u64)> = by["i"]
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["pid"].as_u64().unwrap()))
        .collect();
    assert!(
        names.contains(&("XID 157", u64::from(chrome_trace::HOST_PID))),
        "{names:?}"
    );
    assert!(names.contains(&("device lost", 1)), "{names:?}");
    assert!(by["i"].iter().any(|e| e["args"]["id"] == "errors.xid_94"));

    // two_gpus: GPU 0 alternates between power cap and not; each run is an interval.
    let (v, _dir) = trace_of(&["--replay", s(&fixture("two_gpus.ndjson"))]);
    let by = check_trace_json(&v);
    let caps: Vec<(u64, u64)> = by["X"]
        .iter()
        .filter(|e| e["name"] == "sw_power_cap")
        .map(|e| (e["ts"].as_u64().unwrap(), e["dur"].as_u64().unwrap()))
        .collect();
    assert!(!caps.is_empty());
    assert!(caps.iter().all(|&(_, d)| d > 0), "{caps:?}");
}

/// The profiling counters reach the trace through the metric table's groups, from the second
/// sample on (GPM needs two), and each GPU's verdict is an instant on its own thread.
#[test]
fn trace_carries_profiling_counters_and_verdict_changes() {
    let (v, _dir) = trace_of(&["--replay", s(&fixture("profiled.ndjson"))]);
    let by = check_trace_json(&v);
    let profiling = |pid: u64| -> Vec<&Value> {
        by["C"]
            .iter()
            .filter(|e| e["name"] == "profiling %" && e["pid"] == pid)
            .collect()
    };
    let gpu0 = profiling(1);
    assert!(!gpu0.is_empty(), "{:?}", by["C"]);
    assert_eq!(gpu0[0]["ts"], 1_000_000, "none before the second sample");
    let last = &gpu0.last().unwrap()["args"];
    assert_eq!(last["sm_active"], 94);
    assert_eq!(last["sm_occupancy"], 38.5);
    assert_eq!(last["tensor"], 73.4);
    assert_eq!(last["dram"], 42.3);
    assert_eq!(last["fp32"], 8.1);
    assert_eq!(profiling(2).last().unwrap()["args"]["sm_active"], 11.4);
    assert!(by["C"].iter().any(|e| e["name"] == "profiling PCIe MB/s"));

    // One verdict per GPU: the window re-judged on every tick gives the same bottleneck, which
    // is written once.
    let verdicts: Vec<(u64, &str)> = by["i"]
        .iter()
        .filter(|e| e["cat"] == "verdict")
        .map(|e| (e["pid"].as_u64().unwrap(), e["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        verdicts,
        [(1, "verdict: compute_bound"), (2, "verdict: underfilled")]
    );
    let underfilled = by["i"]
        .iter()
        .find(|e| e["name"] == "verdict: underfilled")
        .unwrap();
    assert_eq!(underfilled["tid"], chrome_trace::TID_VERDICT);
    assert_eq!(underfilled["args"]["basis"], "profiling_counters");
    assert_eq!(underfilled["args"]["pid"], 48377);
    assert!(
        underfilled["args"]["advice"]
            .as_str()
            .unwrap()
            .contains("more blocks than SMs")
    );
    assert!(by["M"].iter().any(|e| e["name"] == "thread_name"
        && e["pid"] == 2
        && e["tid"] == chrome_trace::TID_VERDICT
        && e["args"]["name"] == "verdict"));
}

/// The demo's workload changes: each change of its verdict is one instant, and no two in a row
/// repeat a bottleneck.
#[test]
fn trace_of_the_demo_marks_each_verdict_change() {
    let (v, _dir) = trace_of(&["--demo"]);
    let by = check_trace_json(&v);
    let names: Vec<&str> = by["i"]
        .iter()
        .filter(|e| e["cat"] == "verdict")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"verdict: compute_bound"), "{names:?}");
    assert_eq!(
        names.last(),
        Some(&"verdict: idle_holding_memory"),
        "{names:?}"
    );
    assert!(names.windows(2).all(|w| w[0] != w[1]), "{names:?}");
}

/// gpu_lost: GPU 1 (pid 2) falls off the bus 4.87 s in (the XID 79 from the event thread, the
/// poll at 5 s answers GPU lost) and the recording goes on to 9 s with GPU 0 alone.
#[test]
fn trace_of_a_gpu_lost_mid_way_ends_its_counters_at_the_loss() {
    const LOSS_US: u64 = 4_870_000;
    const END_US: u64 = 9_000_000;
    let (v, _dir) = trace_of(&["--replay", s(&fixture("gpu_lost.ndjson"))]);
    let by = check_trace_json(&v);
    let counters =
        |pid: u64| -> Vec<&Value> { by["C"].iter().filter(|e| e["pid"] == pid).collect() };
    let lost = counters(2);
    assert!(!lost.is_empty());
    let last = lost.iter().map(|e| e["ts"].as_u64().unwrap()).max();
    assert_eq!(last, Some(LOSS_US), "GPU 1 drawn past its loss: {lost:?}");
    // Closed at the loss with what it read before, not with zeros.
    let power = lost
        .iter()
        .rfind(|e| e["name"] == "power W")
        .expect("power");
    assert_eq!(power["ts"], LOSS_US);
    assert_eq!(power["args"]["draw"], 114.9);
    let span = by["X"]
        .iter()
        .find(|e| e["pid"] == 2 && e["name"] == chrome_trace::LOST_SPAN)
        .expect("the lost span");
    assert_eq!(span["ts"], LOSS_US);
    assert_eq!(span["dur"], END_US - LOSS_US);
    assert_eq!(span["tid"], chrome_trace::TID_TELEMETRY);
    // GPU 0 is drawn to the end, and has no lost span.
    assert!(counters(1).iter().any(|e| e["ts"] == END_US));
    assert!(
        !by["X"]
            .iter()
            .any(|e| e["pid"] == 1 && e["name"] == chrome_trace::LOST_SPAN)
    );
    // The loss is one device.lost finding, raised by the XID (before the poll that said lost).
    let lost_findings: Vec<&Value> = by["i"]
        .iter()
        .filter(|e| e["args"]["id"] == "device.lost")
        .collect();
    assert_eq!(lost_findings.len(), 1, "{lost_findings:?}");
    assert_eq!(lost_findings[0]["ts"], LOSS_US);
}

#[test]
fn trace_refuses_to_overwrite_and_reports_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.json");
    std::fs::write(&out, "keep").unwrap();
    let run = gpudiag(&["trace", "--demo", "-o", s(&out)]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep");
    ok(&gpudiag(&["trace", "--demo", "-o", s(&out), "--force"]));

    let hostile = at("tests/fixtures/hostile/not_a_recording.csv");
    let run = gpudiag(&[
        "trace",
        "--replay",
        s(&hostile),
        "-o",
        s(&dir.path().join("x.json")),
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.starts_with("gpudiag: "), "{}", run.stderr);
    assert!(!dir.path().join("x.json").exists());
    let run = gpudiag(&[
        "trace",
        "--demo",
        "-o",
        s(&dir.path().join("no/such/dir/t.json")),
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = gpudiag(&[
        "trace",
        "--demo",
        "-o",
        s(&out),
        "--force",
        "--interval",
        "1ms",
    ]);
    assert_eq!(run.code, 2);
}

// ---------------------------------------------------------------------------------------------
// Bundle

/// Every member of a bundle, gzip members decompressed.
fn bundle_members(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(GzDecoder::new(std::fs::File::open(path).unwrap()));
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            if name.ends_with(".gz") {
                let mut plain = Vec::new();
                GzDecoder::new(&bytes[..]).read_to_end(&mut plain).unwrap();
                bytes = plain;
            }
            (name, bytes)
        })
        .collect()
}

fn member<'a>(members: &'a [(String, Vec<u8>)], name: &str) -> &'a [u8] {
    &members.iter().find(|(n, _)| n == name).unwrap().1
}

fn report(args: &[&str]) -> (PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle.tar.gz");
    let mut all = vec!["report", "-o", s(&out)];
    all.extend_from_slice(args);
    let run = gpudiag(&all);
    ok(&run);
    assert!(run.stderr.contains("bundle.tar.gz"), "{}", run.stderr);
    (out, dir)
}

#[test]
fn bundle_holds_every_part_and_each_parses() {
    let (path, dir) = report(&["--replay", s(&fixture("ecc_error.ndjson"))]);
    let members = bundle_members(&path);
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
    // Nothing else was left beside it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let readme = String::from_utf8(member(&members, "README.txt").to_vec()).unwrap();
    for n in &names {
        assert!(readme.contains(n), "README does not mention {n}");
    }
    assert!(readme.contains("gpudiag replay"));
    assert!(readme.contains("Redacted"));

    let check: CheckReport = serde_json::from_slice(member(&members, "check-report.json")).unwrap();
    assert_eq!(check.devices.len(), 1);
    assert_eq!(check.window.ticks, 6);
    let ids: Vec<&str> = check.devices[0]
        .findings
        .iter()
        .map(|f| f.id.as_str())
        .collect();
    assert!(ids.contains(&"errors.ecc_uncorrectable"), "{ids:?}");
    assert!(ids.contains(&"errors.xid_48"), "{ids:?}");

    let (header, records, _) = recording::read_all_from(std::io::Cursor::new(
        member(&members, "recording.ndjson.gz").to_vec(),
    ))
    .unwrap();
    assert_eq!(header.devices.len(), 1);
    let samples = records
        .iter()
        .filter(|r| matches!(r, Record::Sample(_)))
        .count();
    assert_eq!(samples, 6);

    let trace: Value = serde_json::from_slice(member(&members, "trace.json")).unwrap();
    let by = check_trace_json(&trace);
    assert!(by["i"].iter().any(|e| e["name"] == "XID 48"));

    let env: Environment = serde_json::from_slice(member(&members, "environment.json")).unwrap();
    assert_eq!(env.os.arch, std::env::consts::ARCH);
    assert_eq!(env.libraries.len(), 5);
    assert!(
        env.pci.is_empty(),
        "a replay says nothing about this host's PCI tree"
    );
    assert!(env.kernel_log.readable || env.kernel_log.note.is_some());
}

#[test]
fn bundle_replays_like_its_recording() {
    let (path, _dir) = report(&["--replay", s(&fixture("two_gpus.ndjson"))]);
    let from_bundle = gpudiag(&["check", "--json", "--replay", s(&path)]);
    let original = gpudiag(&[
        "check",
        "--json",
        "--replay",
        s(&fixture("two_gpus.ndjson")),
    ]);
    assert_eq!(from_bundle.code, original.code, "{}", from_bundle.stderr);
    let a: CheckReport = serde_json::from_str(&from_bundle.stdout).unwrap();
    let b: CheckReport = serde_json::from_str(&original.stdout).unwrap();
    assert_eq!(a.status, b.status);
    assert_eq!(a.window.ticks, b.window.ticks);
    assert_eq!(a.devices.len(), 2);
    for (x, y) in a.devices.iter().zip(&b.devices) {
        assert_eq!(x.info.uuid, y.info.uuid);
        assert_eq!(x.summary, y.summary);
        let ix: Vec<&str> = x.findings.iter().map(|f| f.id.as_str()).collect();
        let iy: Vec<&str> = y.findings.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ix, iy);
    }
    // The host name in the bundle is a placeholder.
    assert_eq!(a.host.hostname.as_deref(), Some("host-1"));
    assert_eq!(b.host.hostname.as_deref(), Some("gpu-node-07"));
    // A trace of the bundle works too.
    let (v, _d) = trace_of(&["--replay", s(&path)]);
    check_trace_json(&v);
}

#[test]
fn bundle_of_the_demo_and_a_broken_bundle() {
    let (path, dir) = report(&["--demo"]);
    ok(&gpudiag(&["check", "--replay", s(&path)]));
    // A tar.gz without a recording is a clear usage error.
    let empty = dir.path().join("empty.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&empty).unwrap(),
            flate2::Compression::default(),
        );
        let mut tar = tar::Builder::new(gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        tar.append_data(&mut h, "README.txt", &b"hi"[..]).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }
    let run = gpudiag(&["check", "--replay", s(&empty)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("recording.ndjson.gz"), "{}", run.stderr);
    // A truncated bundle is an error, never a panic.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.tar.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let run = gpudiag(&["check", "--replay", s(&cut)]);
    assert!(
        run.code == 2 || run.code == 0,
        "{}: {}",
        run.code,
        run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

const SECRET_HOST: &str = "lab-gpu-box-4711";
const SECRET_USER: &str = "mallory";
const SECRET_TOKEN: &str = "tok_9f8e7d6c5b4a";

/// A recording with secrets planted where real ones show up: the host name, a process's user and
/// command line (with a token argument and a home path), and a notice mentioning the home.
fn planted_recording(dir: &Path) -> PathBuf {
    let path = dir.join("planted.ndjson");
    let header = serde_json::json!({
        "format": "gpudiag-recording", "version": 1, "kind": "header",
        "created_ms": 1_767_225_600_000u64, "tool_version": "0.1.0", "backend": "nvml",
        "interval_ms": 1000,
        "host": {"hostname": format!("{SECRET_HOST}.example.org"), "driver_version": "580.65.06"},
        "devices": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200", "pci_bus_id": "00000000:19:00.0"}]
    });
    let mut lines = vec![header.to_string()];
    for i in 0..3u64 {
        lines.push(
            serde_json::json!({
                "kind": "sample", "time_ms": 1_767_225_600_000u64 + i * 1000, "device": 0,
                "gpu_util_pct": 20.0, "mem_used_bytes": 1u64 << 30, "mem_total_bytes": 1u64 << 34,
                "processes": [{
                    "pid": 4242,
                    "name": format!("/home/{SECRET_USER}/venv/bin/python train.py --api-token={SECRET_TOKEN}"),
                    "user": SECRET_USER, "kind": "compute", "used_memory_bytes": 1u64 << 30,
                    "sm_util_pct": null, "container_id": null
                }]
            })
            .to_string(),
        );
    }
    lines.push(
        serde_json::json!({
            "kind": "event", "time_ms": 1_767_225_601_500u64, "device": null, "event": "notice",
            "message": format!("checkpoint written to /home/{SECRET_USER}/ckpt on {SECRET_HOST}")
        })
        .to_string(),
    );
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn all_text(members: &[(String, Vec<u8>)]) -> String {
    members
        .iter()
        .map(|(n, b)| format!("== {n}\n{}\n", String::from_utf8_lossy(b)))
        .collect()
}

#[test]
fn planted_secrets_never_reach_a_redacted_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let rec = planted_recording(dir.path());
    let (path, _d) = report(&["--replay", s(&rec)]);
    let members = bundle_members(&path);
    let text = all_text(&members);
    let this_host = gethostname();
    let mut secrets = vec![SECRET_HOST, SECRET_USER, SECRET_TOKEN, "train.py"];
    if this_host.len() >= 4 {
        secrets.push(&this_host);
    }
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{secret} leaked into the bundle:\n{text}"
        );
    }
    // The same secret has the same placeholder in every file.
    let check: Value = serde_json::from_slice(member(&members, "check-report.json")).unwrap();
    let process = &check["devices"][0]["latest"]["processes"][0];
    assert_eq!(process["name"], "/home/user-1/venv/bin/python [args-1]");
    assert_eq!(process["user"], "user-1");
    let recording = String::from_utf8(member(&members, "recording.ndjson.gz").to_vec()).unwrap();
    assert!(recording.contains("/home/user-1/venv/bin/python [args-1]"));
    assert!(
        recording.contains("checkpoint written to /home/user-1/ckpt on host-1"),
        "{recording}"
    );
    let trace: Value = serde_json::from_slice(member(&members, "trace.json")).unwrap();
    assert_eq!(
        trace["otherData"]["host"],
        "host-1.example.org".replace(".example.org", "")
    );
    // The recording header's host is redacted and the bundle still replays.
    let run = gpudiag(&["check", "--json", "--replay", s(&path)]);
    ok(&run);
    assert!(!run.stdout.contains(SECRET_HOST));
}

/// Kernel names can reveal model code: the summaries a `run --kernels --record` recording
/// carries never reach a bundle made from it.
#[test]
fn kernel_names_in_a_run_recording_never_reach_a_bundle() {
    use gpudiag_core::kernels::KernelsAggregator;
    use gpudiag_core::kernels::synthetic::training_stream;
    use gpudiag_model::kernels::RecordedKernels;
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.ndjson");
    let mut text = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let mut aggregator = KernelsAggregator::default();
    for m in training_stream(4242, "GPU-1111") {
        aggregator.push(&m);
    }
    let mut summary = aggregator.summary();
    summary.gpus[0].top_kernels[0].name = "secret_model_attention_kernel".into();
    let line = Record::Kernels(RecordedKernels {
        time_ms: 1_767_225_601_000,
        ended: true,
        summary,
    });
    text.push_str(&serde_json::to_string(&line).unwrap());
    text.push('\n');
    std::fs::write(&rec, text).unwrap();
    let replayed = gpudiag(&["check", "--json", "--replay", s(&rec)]);
    ok(&replayed);
    let (path, _d) = report(&["--replay", s(&rec)]);
    let all = all_text(&bundle_members(&path));
    for name in [
        "secret_model_attention_kernel",
        "sm90_xmma_gemm",
        "\"kind\":\"kernels\"",
    ] {
        assert!(!all.contains(name), "{name} reached the bundle");
    }
}

/// Slurm job ids, users, pod and namespace names are personal data: none reaches a redacted
/// bundle, in the recording, the check report or the trace.
#[test]
fn job_and_pod_names_never_reach_a_redacted_bundle() {
    let (path, _d) = report(&["--replay", s(&fixture("attributed.ndjson"))]);
    let members = bundle_members(&path);
    let text = all_text(&members);
    for secret in [
        "\"4242\"",
        "train-llm-0",
        "ml-team",
        "notebook-a",
        "notebook-b",
        "research",
        "alice",
        "carol",
        "dave",
    ] {
        assert!(!text.contains(secret), "{secret} leaked into the bundle");
    }
    let check: Value = serde_json::from_slice(member(&members, "check-report.json")).unwrap();
    let latest = &check["devices"][1]["latest"];
    let slurm = latest["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == 60001)
        .unwrap();
    assert_eq!(slurm["attribution"]["job"]["id"], "job-1");
    assert_eq!(slurm["attribution"]["job"]["user"], slurm["user"]);
    assert!(
        latest["gpu_pods"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("pod-")
    );
    assert!(
        latest["gpu_pods"][0]["namespace"]
            .as_str()
            .unwrap()
            .starts_with("namespace-")
    );
    // Container names and pod UIDs are the workload's, not a person's.
    assert_eq!(latest["gpu_pods"][0]["containers"][0], "lab");
}

/// A recording where the user's name is inside other strings: the host `node-alice7`, the run
/// id `alice-run-7`, the pod `alice-train-0`, the job key built from a loopback master address
/// and the host. Nothing of `alice` may reach any member of a redacted bundle.
#[test]
fn a_name_inside_other_strings_never_reaches_a_redacted_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("names.ndjson");
    let header = serde_json::json!({
        "format": "gpudiag-recording", "version": 1, "kind": "header",
        "created_ms": 1_767_225_600_000u64, "tool_version": "0.1.0", "backend": "nvml",
        "interval_ms": 1000,
        "host": {"hostname": "node-alice7", "driver_version": "580.65.06"},
        "devices": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200", "pci_bus_id": "00000000:19:00.0"}]
    });
    let mut lines = vec![header.to_string()];
    for i in 0..12u64 {
        lines.push(
            serde_json::json!({
                "kind": "sample", "time_ms": 1_767_225_600_000u64 + i * 1000, "device": 0,
                "gpu_util_pct": 90.0, "mem_used_bytes": 1u64 << 33, "mem_total_bytes": 1u64 << 34,
                "processes": [{
                    "pid": 4242, "name": "python3", "user": "alice", "kind": "compute",
                    "used_memory_bytes": 1u64 << 33, "sm_util_pct": null, "container_id": null,
                    "attribution": {"job": null, "pod": {
                        "uid": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "runtime": "containerd",
                        "name": "alice-train-0", "namespace": "research", "container": "trainer",
                        "matched_by": "gpu_allocation"}},
                    "launch": {"parent_pid": 4200, "exe": "/usr/bin/python3.11",
                        "parent_exe": "/usr/bin/python3.11", "run_id": "alice-run-7",
                        "master_addr": "127.0.0.1", "master_port": "29500", "rank": 0,
                        "local_rank": 0, "world_size": 1}
                }],
                "gpu_pods": [{"namespace": "research", "name": "alice-train-0", "containers": ["trainer"]}]
            })
            .to_string(),
        );
    }
    lines.push(
        serde_json::json!({
            "kind": "event", "time_ms": 1_767_225_601_500u64, "device": null, "event": "notice",
            "message": "rendezvous alice-run-7 at 127.0.0.1:29500@node-alice7 for alice-train-0"
        })
        .to_string(),
    );
    std::fs::write(&rec, lines.join("\n") + "\n").unwrap();
    let unredacted = report(&["--replay", s(&rec), "--no-redact"]);
    let text = all_text(&bundle_members(&unredacted.0));
    for planted in ["alice-run-7", "alice-train-0", "node-alice7"] {
        assert!(text.contains(planted), "{planted} was never in the bundle");
    }

    let (path, _d) = report(&["--replay", s(&rec)]);
    let members = bundle_members(&path);
    assert_eq!(members.len(), 5);
    for (name, bytes) in &members {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains("alice"), "alice in {name}:\n{text}");
    }
    let recording = String::from_utf8(member(&members, "recording.ndjson.gz").to_vec()).unwrap();
    assert!(
        recording.contains(r#""run_id":"user-1-run-7""#),
        "{recording}"
    );
    // The bundle still replays, and its job is the run id's placeholder.
    let run = gpudiag(&["check", "--json", "--replay", s(&path)]);
    ok(&run);
    assert!(!run.stdout.contains("alice"), "{}", run.stdout);
}

#[test]
fn no_redact_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let rec = planted_recording(dir.path());
    let (path, _d) = report(&["--replay", s(&rec), "--no-redact"]);
    let members = bundle_members(&path);
    let text = all_text(&members);
    for secret in [SECRET_HOST, SECRET_USER, SECRET_TOKEN] {
        assert!(text.contains(secret), "{secret} missing with --no-redact");
    }
    let readme = String::from_utf8(member(&members, "README.txt").to_vec()).unwrap();
    assert!(readme.contains("Not redacted"));
}

#[test]
fn report_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b.tar.gz");
    std::fs::write(&out, "keep").unwrap();
    let run = gpudiag(&["report", "--demo", "-o", s(&out)]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--force"));
    let run = gpudiag(&[
        "report",
        "--replay",
        s(&dir.path().join("missing.ndjson")),
        "-o",
        s(&dir.path().join("c.tar.gz")),
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("missing.ndjson"), "{}", run.stderr);
    assert!(!dir.path().join("c.tar.gz").exists());
}

const GPU_UUID: &str = "GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11";
const MIG_UUID: &str = "MIG-5c6f1a2b-3d4e-5f60-7182-93a4b5c6d7e8";
const PCI_BUS_ID: &str = "00000000:19:00.0";
const NGC_KEY: &str = "nvapi-Zq3xK9mW2pL7vB4nR8tY1cH6jF0dS5gA-uE2iO9wQ7zX3";
const JWT: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.Gf7kQ2mZ9xW4pL8vB3nR6tY1cH5j";
const SHA256: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const GITHUB_TOKEN: &str = "ghp_R8tY1cH6jF0dS5gAuE2iO9wQ7zX3Zq3xK9mW";

/// Every credential planted by `credential_recording`, `credential_env` and the kernel log of
/// `kernel_log_credentials_are_redacted`: none may survive redaction.
const CREDENTIALS: [&str; 12] = [
    "hunter2-env",
    "hunter3-visible",
    NGC_KEY,
    "hunter4-cmd",
    JWT,
    "pa55w0rd",
    SHA256,
    GITHUB_TOKEN,
    "hunter5-advice",
    "hunter6-file",
    "hunter7-kmsg",
    "kmsg-token-8",
];

/// A recording with credentials where they turn up in practice: its own file name, a process
/// command line, a notice (a pip index URL with a password, a bearer token, a hash), and a
/// recorded finding's title, evidence and advice. GPU and MIG UUIDs and the PCI bus id must
/// survive.
fn credential_recording(dir: &Path) -> PathBuf {
    let path = dir.join("run-password=hunter6-file.ndjson");
    let t0 = 1_767_225_600_000u64;
    let header = serde_json::json!({
        "format": "gpudiag-recording", "version": 1, "kind": "header",
        "created_ms": t0, "tool_version": "0.1.0", "backend": "nvml", "interval_ms": 1000,
        "host": {"hostname": "node-7", "driver_version": "580.65.06"},
        "devices": [{"index": 0, "uuid": GPU_UUID, "name": "NVIDIA H200", "pci_bus_id": PCI_BUS_ID}]
    });
    let mut lines = vec![header.to_string()];
    for i in 0..3u64 {
        lines.push(
            serde_json::json!({
                "kind": "sample", "time_ms": t0 + i * 1000, "device": 0, "gpu_util_pct": 20.0,
                "processes": [{
                    "pid": 4242,
                    "name": "python --password=hunter4-cmd",
                    "user": "svc", "kind": "compute", "used_memory_bytes": 1u64 << 30,
                    "sm_util_pct": null, "container_id": null
                }]
            })
            .to_string(),
        );
    }
    lines.push(
        serde_json::json!({
            "kind": "event", "time_ms": t0 + 1500, "device": null, "event": "notice",
            "message": format!(
                "pip install --index-url https://bob:pa55w0rd@pypi.example.org/simple on \
                 {MIG_UUID} at {PCI_BUS_ID}; Authorization: Bearer {JWT}; image {SHA256}"
            )
        })
        .to_string(),
    );
    lines.push(
        serde_json::json!({
            "kind": "finding", "id": "thermal.near_slowdown", "severity": "warn", "device": 0,
            "time_ms": t0 + 2000,
            "title": format!("GPU 0 ({GPU_UUID}) hot while {GITHUB_TOKEN} was in use"),
            "evidence": {"values": {"temp_gpu_c": 86.0}, "window_s": 10.0,
                         "threshold": format!("NGC_API_KEY={NGC_KEY}")},
            "advice": "Log in with passwd: hunter5-advice and check the airflow."
        })
        .to_string(),
    );
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Variables a shell on a GPU host may hold: credentials under GPU-like names, and inside a
/// variable the bundle keeps.
fn credential_env() -> Vec<(&'static str, String)> {
    vec![
        ("CUDA_PASSWORD", "hunter2-env".into()),
        (
            "CUDA_VISIBLE_DEVICES",
            format!("{GPU_UUID},1 password=hunter3-visible"),
        ),
        ("NVIDIA_API_KEY", NGC_KEY.into()),
        ("HF_TOKEN", GITHUB_TOKEN.into()),
        ("NCCL_DEBUG", "INFO".into()),
    ]
}

/// The planted credentials are gone from every member of a redacted bundle, each member shows
/// a placeholder where one was, and GPU UUIDs and PCI bus ids are still there.
#[test]
fn planted_credentials_never_reach_a_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let rec = credential_recording(dir.path());
    let out = dir.path().join("bundle.tar.gz");
    let mut cmd = Command::cargo_bin("gpudiag").unwrap();
    cmd.args(["report", "--replay", s(&rec), "-o", s(&out)])
        .timeout(Duration::from_secs(60));
    for (k, v) in credential_env() {
        cmd.env(k, v);
    }
    let run = cmd.output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let members = bundle_members(&out);
    for (name, bytes) in &members {
        let text = String::from_utf8_lossy(bytes);
        for secret in CREDENTIALS {
            assert!(!text.contains(secret), "{secret} in {name}:\n{text}");
        }
        assert!(
            text.contains("[secret-"),
            "{name} shows no placeholder:\n{text}"
        );
    }
    let text = all_text(&members);
    for kept in [GPU_UUID, MIG_UUID, PCI_BUS_ID] {
        assert!(text.contains(kept), "{kept} was redacted:\n{text}");
    }
    let env: Environment = serde_json::from_slice(member(&members, "environment.json")).unwrap();
    assert!(!env.env.contains_key("CUDA_PASSWORD"), "{:?}", env.env);
    assert!(!env.env.contains_key("NVIDIA_API_KEY"), "{:?}", env.env);
    assert!(!env.env.contains_key("HF_TOKEN"), "{:?}", env.env);
    assert_eq!(env.env["NCCL_DEBUG"], "INFO");
    let visible = &env.env["CUDA_VISIBLE_DEVICES"];
    assert!(
        visible.starts_with(&format!("{GPU_UUID},1 password=[secret-")),
        "{visible}"
    );
    // Redacted, the bundle still replays.
    let run = gpudiag(&["check", "--json", "--replay", s(&out)]);
    ok(&run);
}

/// Kernel log lines (here from a saved log) go through the same redaction as the rest.
#[test]
fn kernel_log_credentials_are_redacted() {
    use gpudiag::commands::report::{self as bundle, ReportOptions};
    use gpudiag_export::bundle_writer::host;
    use gpudiag_telemetry::kernel_log::KernelLogSource;
    let dir = tempfile::tempdir().unwrap();
    let rec = credential_recording(dir.path());
    let klog = dir.path().join("kern.log");
    std::fs::write(
        &klog,
        format!(
            "NVRM: Xid (PCI:0000:19:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n\
             NVRM: {GPU_UUID}: login password: hunter7-kmsg\n\
             nvidia-persistenced: token=kmsg-token-8 accepted\n\
             usb 1-1: new device, not ours\n"
        ),
    )
    .unwrap();
    let args = gpudiag::cli::ReportArgs {
        source: gpudiag::cli::SourceArgs {
            devices: Vec::new(),
            replay: Some(rec),
            demo: false,
            init_timeout: Duration::from_secs(10),
            poll_timeout: Duration::from_secs(2),
            backend: gpudiag::cli::BackendChoice::Replay,
            sysfs_root: None,
            max_inflated_size: gpudiag_telemetry::bundle_reader::DEFAULT_MAX_INFLATED,
            kubelet: gpudiag::cli::KubeletArgs::default(),
        },
        output: None,
        duration: Duration::from_secs(30),
        interval: Duration::from_millis(250),
        no_redact: false,
        force: false,
    };
    let cap = bundle::capture(&args, &std::sync::atomic::AtomicBool::new(false)).unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = dir.path().join("bundle.tar.gz");
    let opts = ReportOptions {
        redact: true,
        config: gpudiag_core::config::Config::default(),
        interval: Duration::from_millis(250),
        init_timeout: Duration::from_secs(10),
        roots: host::Roots {
            sys: empty.clone(),
            etc: empty.clone(),
            proc_: empty.clone(),
            root: empty,
            kernel_log: KernelLogSource::File(klog),
        },
    };
    bundle::write_bundle(&out, &cap, &opts).unwrap();
    let members = bundle_members(&out);
    let env: Environment = serde_json::from_slice(member(&members, "environment.json")).unwrap();
    let log = env.kernel_log.lines.join("\n");
    assert_eq!(env.kernel_log.lines.len(), 3, "{log}");
    assert!(
        log.contains(&format!("NVRM: {GPU_UUID}: login password: [secret-")),
        "{log}"
    );
    assert!(log.contains("token=[secret-"), "{log}");
    assert!(log.contains("Xid (PCI:0000:19:00): 79"), "{log}");
    let text = all_text(&members);
    for secret in CREDENTIALS {
        assert!(!text.contains(secret), "{secret} in the bundle:\n{text}");
    }
}

/// The bundle documentation names every variable a bundle keeps, so users can see what leaves
/// their host.
#[test]
fn docs_list_the_variables_a_bundle_keeps() {
    let docs = std::fs::read_to_string(at("docs/bundles.md")).unwrap();
    let section = docs
        .split("## What a bundle keeps, and what it redacts")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    for name in gpudiag_export::bundle_writer::host::KEPT_VARIABLES {
        assert!(
            section.contains(&format!("`{name}`")),
            "docs/bundles.md lacks {name}"
        );
    }
}

fn gethostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// serve over HTTP

/// One raw HTTP/1.0 exchange; returns (status, body).
fn http(addr: &str, request: &str) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn ended(body: &str) -> bool {
    body.lines().any(|l| l == "gpudiag_source_ended 1")
}

fn get(addr: &str, path: &str) -> (u16, String) {
    http(addr, &format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n"))
}

#[test]
fn serve_answers_scrapes_and_rejects_the_rest() {
    let served = serve(&["--replay", s(&fixture("two_gpus.ndjson"))]);
    // The replay plays at recorded speed; wait for its last tick.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, body) = get(&served.addr, "/metrics");
        assert_eq!(code, 200);
        if ended(&body) || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ended(&body), "{body}");
    let util: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .collect();
    assert_eq!(util.len(), 2, "{body}");
    assert!(util[0].contains("gpu=\"0\"") && util[0].contains("Hostname=\"gpu-node-07\""));
    assert!(
        body.contains("gpudiag_finding{"),
        "the XID 31 finding: {body}"
    );
    assert_eq!(get(&served.addr, "/").0, 404);
    assert_eq!(get(&served.addr, "/metrics/x").0, 404);
    assert_eq!(
        http(
            &served.addr,
            "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n"
        )
        .0,
        405
    );
    assert_eq!(
        http(&served.addr, "DELETE /metrics HTTP/1.0\r\n\r\n").0,
        405
    );
    // Garbage gets 400 (or a closed connection), never a crash.
    let (code, _) = http(&served.addr, "\x00\x01garbage\r\n\r\n");
    assert!(code == 400 || code == 0, "{code}");
    assert_eq!(get(&served.addr, "/metrics").0, 200);
}

/// One raw exchange over TCP; the whole answer as the server wrote it, until it closed.
fn raw_http(addr: &str, request: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn header_of<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let (head, _) = answer.split_once("\r\n\r\n")?;
    head.lines()
        .find_map(|l| {
            l.split_once(": ")
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        })
        .map(|(_, v)| v)
}

/// HTTP/1.1 (RFC 9110 section 9.3.2, RFC 9112 section 3.2.2) asks every server for HEAD and for
/// request targets in absolute form; `serve` answered them 405 and 404.
#[test]
fn serve_answers_head_and_absolute_form_targets() {
    let served = serve(&["--replay", s(&fixture("two_gpus.ndjson"))]);
    let addr = &served.addr;
    // A scrape before the replay's first tick answers only the info series; compare HEAD with
    // a GET of the same state, once the GPUs' series are there.
    let deadline = Instant::now() + Duration::from_secs(10);
    let get = loop {
        let get = raw_http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        if get.contains("DCGM_FI_DEV_GPU_UTIL{") || Instant::now() > deadline {
            break get;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(get.starts_with("HTTP/1.1 200 "), "{get}");
    let head = raw_http(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    // The headers a GET gets, and nothing after them.
    assert!(head.ends_with("\r\n\r\n"), "{head:?}");
    assert_eq!(head.matches("\r\n\r\n").count(), 1, "{head:?}");
    assert_eq!(
        header_of(&head, "Content-Type"),
        header_of(&get, "Content-Type")
    );
    // The length of the body a GET now would get: sample ages may have gained a digit.
    let length: usize = header_of(&head, "Content-Length").unwrap().parse().unwrap();
    let get_length = get.split_once("\r\n\r\n").unwrap().1.len();
    assert!(length.abs_diff(get_length) < 64, "{length} vs {get_length}");
    let missing = raw_http(addr, "HEAD /nothing HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    assert!(missing.ends_with("\r\n\r\n"), "{missing:?}");
    assert_ne!(header_of(&missing, "Content-Length"), Some("0"));

    let port = addr.rsplit(':').next().unwrap();
    for target in [
        format!("http://{addr}/metrics"),
        format!("http://localhost:{port}/metrics?x=1"),
        "HTTP://gpu-node-07/metrics".to_string(),
    ] {
        let answer = raw_http(addr, &format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(answer.starts_with("HTTP/1.1 200 "), "{target}: {answer}");
        assert!(answer.contains("gpudiag_info{"), "{target}");
    }
    let elsewhere = raw_http(addr, &format!("GET http://{addr}/ HTTP/1.1\r\n\r\n"));
    assert!(elsewhere.starts_with("HTTP/1.1 404 "), "{elsewhere}");

    let post = raw_http(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    assert_eq!(header_of(&post, "Allow"), Some("GET, HEAD"));
}

#[test]
fn slow_clients_do_not_stall_other_scrapes() {
    let served = serve(&["--demo"]);
    // A scrape before the first sample has no GPU series yet; wait for data first.
    let ready = Instant::now();
    while !get(&served.addr, "/metrics")
        .1
        .contains("DCGM_FI_DEV_GPU_UTIL")
    {
        assert!(
            ready.elapsed() < Duration::from_secs(10),
            "no samples served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Several clients that send half a request and then nothing.
    let stalled: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut c = TcpStream::connect(&served.addr).unwrap();
            c.write_all(b"GET /metr").unwrap();
            c
        })
        .collect();
    for _ in 0..5 {
        let start = Instant::now();
        let (code, body) = get(&served.addr, "/metrics");
        assert_eq!(code, 200);
        assert!(body.contains("DCGM_FI_DEV_GPU_UTIL"));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }
    // The stalled ones are answered 408 at the request deadline (5 s) and closed.
    let mut first = stalled.into_iter().next().unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let start = Instant::now();
    let mut answer = String::new();
    first.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// Profiling counters leave as dcgm-exporter's ratios (0-1) where gpudiag keeps percentages,
/// and each GPU's verdict is one series whose labels name it.
#[test]
fn serve_exports_profiling_ratios_and_the_verdict() {
    let served = serve(&["--replay", s(&fixture("profiled.ndjson"))]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, body) = get(&served.addr, "/metrics");
        assert_eq!(code, 200);
        if ended(&body) || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ended(&body), "{body}");
    let lines = |name: &str| -> Vec<&str> {
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    };
    // The last sample: GPU 0 SM active 94.0%, GPU 1 11.4%.
    let sm = lines("DCGM_FI_PROF_SM_ACTIVE");
    assert_eq!(sm.len(), 2, "{body}");
    assert!(
        sm[0].contains("gpu=\"0\"") && sm[0].ends_with(" 0.94"),
        "{}",
        sm[0]
    );
    assert!(
        sm[1].contains("gpu=\"1\"") && sm[1].ends_with(" 0.114"),
        "{}",
        sm[1]
    );
    for name in [
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    ] {
        let values = lines(name);
        assert_eq!(values.len(), 2, "{name}: {body}");
        for l in values {
            let v: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
            assert!((0.0..=1.0).contains(&v), "a ratio: {l}");
        }
    }
    assert!(body.contains("# TYPE gpudiag_verdict gauge\n"), "{body}");
    let verdicts = lines("gpudiag_verdict");
    assert_eq!(verdicts.len(), 2, "one series per GPU: {body}");
    assert!(
        verdicts[0].contains("gpu=\"0\"")
            && verdicts[0].ends_with(
                ",verdict=\"compute_bound\",confidence=\"high\",basis=\"profiling_counters\"} 1"
            ),
        "{}",
        verdicts[0]
    );
    assert!(
        verdicts[1].contains("gpu=\"1\"") && verdicts[1].contains("verdict=\"underfilled\""),
        "{}",
        verdicts[1]
    );
    let judged = lines("gpudiag_verdict_judged");
    assert_eq!(judged.len(), 2, "{body}");
    assert!(judged.iter().all(|l| l.ends_with("} 1")), "{judged:?}");
}

/// Before a GPU has enough data for a verdict it has no `gpudiag_verdict` series, and
/// `gpudiag_verdict_judged` says so with a 0.
#[test]
fn serve_says_when_a_gpu_is_not_judged() {
    // all_kinds covers one second of GPU 0, less than a verdict needs.
    let served = serve(&["--replay", s(&fixture("all_kinds.ndjson"))]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (_, body) = get(&served.addr, "/metrics");
        if ended(&body) || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ended(&body), "{body}");
    assert!(!body.contains("gpudiag_verdict{"), "{body}");
    let judged: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("gpudiag_verdict_judged{"))
        .collect();
    assert!(!judged.is_empty(), "{body}");
    assert!(judged.iter().all(|l| l.ends_with("} 0")), "{judged:?}");
}

#[test]
fn serve_reports_a_busy_port_and_bad_flags() {
    let served = serve(&["--demo"]);
    let run = gpudiag(&["serve", "--demo", "--listen", &served.addr]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("cannot listen"), "{}", run.stderr);
    let run = gpudiag(&["serve", "--demo", "--listen", "not-an-address"]);
    assert_eq!(run.code, 2);
}

// ---------------------------------------------------------------------------------------------
// Grafana dashboard

/// Every metric name a fully populated snapshot exports.
fn exported_metric_names() -> BTreeSet<String> {
    use gpudiag_export::prometheus::{Snapshot, render};
    use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample};
    let mut s = Sample::new(0, 1);
    let json = serde_json::to_value(&s).unwrap();
    // Every numeric field set, so every series appears.
    let mut full = json.as_object().unwrap().clone();
    for (k, v) in full.iter_mut() {
        if v.is_null() {
            *v = match k.as_str() {
                "throttle_reason_names" | "gpu_pods" => serde_json::json!([]),
                // One process, the one the verdict is about, so the per-process series appear.
                "processes" => serde_json::json!([{
                    "pid": 7, "name": "python3", "user": "u", "kind": "compute",
                    "used_memory_bytes": 1, "sm_util_pct": 1.0, "container_id": null,
                    "attribution": {
                        "job": {"id": "42", "step": "0", "user": "u", "found_in": "cgroup"},
                        "pod": null
                    }
                }]),
                "retired_pages_pending" | "remapped_rows_pending" | "remapped_rows_failure" => {
                    serde_json::json!(false)
                }
                _ => serde_json::json!(1),
            };
        }
    }
    s = serde_json::from_value(Value::Object(full)).unwrap();
    let snap = Snapshot {
        host: HostInfo {
            hostname: Some("h".into()),
            ..HostInfo::default()
        },
        devices: vec![DeviceInfo::default()],
        latest: [(0, s)].into_iter().collect(),
        received: [(0, Instant::now())].into_iter().collect(),
        last_xid: [(0, 13)].into_iter().collect(),
        findings: Vec::new(),
        verdicts: [(0, verdict(0))].into_iter().collect(),
        jobs: Vec::new(),
        source_ended: false,
        process_cap: Default::default(),
    };
    render(&snap, Instant::now())
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .chain(
            [
                "gpudiag_finding",
                "gpudiag_job_verdict",
                "gpudiag_job_gpu_role",
                "gpudiag_job_peers_wait_ratio",
                "gpudiag_job_stuck_seconds",
                "gpudiag_job_missing_rank_info",
            ]
            .map(String::from),
        )
        .collect()
}

fn verdict(device: u32) -> gpudiag_model::verdict::Verdict {
    use gpudiag_model::verdict::{Basis, Bottleneck, Confidence, Verdict};
    Verdict {
        device,
        bottleneck: Bottleneck::Underfilled,
        confidence: Confidence::High,
        basis: Basis::ProfilingCounters,
        start_ms: 0,
        end_ms: 1,
        title: "t".into(),
        evidence: serde_json::Map::new(),
        advice: "a".into(),
        pid: Some(7),
        processes: Vec::new(),
    }
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

#[test]
fn grafana_dashboard_uses_only_exported_metrics() {
    let path = at("assets/grafana/gpudiag.json");
    let dash: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(dash["uid"], "gpudiag");
    let panels = dash["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let mut all = Vec::new();
    exprs(&dash, &mut all);
    assert!(all.len() >= 15, "{all:?}");
    let exported = exported_metric_names();
    assert!(exported.contains("DCGM_FI_DEV_GPU_UTIL"));
    let mut used = BTreeSet::new();
    for e in &all {
        for word in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("DCGM_") || word.starts_with("gpudiag_") {
                assert!(exported.contains(word), "{word} (in {e}) is not exported");
                used.insert(word.to_string());
            }
        }
    }
    for must in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "gpudiag_throttle_reason",
        "gpudiag_finding",
        "gpudiag_verdict",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gpudiag_process_memory_used_bytes",
        "gpudiag_process_sm_util_percent",
        "gpudiag_process_series_dropped",
        "gpudiag_process_verdict",
    ] {
        assert!(used.contains(must), "the dashboard does not show {must}");
    }
}

/// The dashboard's verdict timeline turns each bottleneck into a number PromQL can chart and
/// maps it back to its name: every bottleneck has its own number, and the query and the
/// mapping agree on it.
#[test]
fn grafana_verdict_timeline_names_every_bottleneck() {
    use gpudiag_model::verdict::Bottleneck;
    let (expr, names) = verdict_timeline();
    assert_eq!(names.len(), Bottleneck::ALL.len(), "{names:?}");
    for b in Bottleneck::ALL {
        let (n, _) = names
            .iter()
            .find(|(_, name)| name == b.name())
            .unwrap_or_else(|| panic!("{b} has no value mapping: {names:?}"));
        assert!(
            expr.contains(&format!("verdict=\"{b}\"}}) * {n}")),
            "{b} is not {n} in {expr}"
        );
    }
}

/// The state timeline's query and its value mappings (number, bottleneck name).
fn verdict_timeline() -> (String, Vec<(String, String)>) {
    let path = at("assets/grafana/gpudiag.json");
    let dash: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let panel = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "state-timeline")
        .expect("a verdict timeline");
    let expr = panel["targets"][0]["expr"].as_str().unwrap().to_owned();
    let options = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
        .as_object()
        .unwrap();
    let names = options
        .iter()
        .map(|(n, m)| (n.clone(), m["text"].as_str().unwrap().to_owned()))
        .collect();
    (expr, names)
}

// ---------------------------------------------------------------------------------------------
// Trace schema

fn trace_validator() -> jsonschema::Validator {
    let path = at("assets/schema/chrome-trace.schema.json");
    let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::meta::validate(&schema).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn schema_errors(v: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    v.iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

#[test]
fn traces_validate_against_their_schema_and_drift_is_caught() {
    let v = trace_validator();
    let (demo, _d) = trace_of(&["--demo"]);
    assert_eq!(schema_errors(&v, &demo), Vec::<String>::new());
    for f in [
        "all_kinds.ndjson",
        "ecc_error.ndjson",
        "profiled.ndjson",
        "two_gpus.ndjson",
    ] {
        let (t, _d) = trace_of(&["--replay", s(&fixture(f))]);
        assert_eq!(schema_errors(&v, &t), Vec::<String>::new(), "{f}");
    }
    let mutate = |f: &dyn Fn(&mut Value)| {
        let mut t = demo.clone();
        f(&mut t);
        !schema_errors(&v, &t).is_empty()
    };
    let first_counter = demo["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .position(|e| e["ph"] == "C")
        .unwrap();
    assert!(mutate(
        &|t| t["traceEvents"][first_counter]["ph"] = "B".into()
    ));
    assert!(mutate(
        &|t| t["traceEvents"][first_counter]["ts"] = (-1).into()
    ));
    assert!(mutate(
        &|t| t["traceEvents"][first_counter]["args"]["gpu"] = "high".into()
    ));
    assert!(mutate(&|t| t["otherData"]["format"] = "other".into()));
    assert!(mutate(&|t| t["traceEvents"][0]["surprise"] = 1.into()));
}

/// A bundle cut at any point or with a flipped byte is an error or a (shorter) replay, never a
/// panic or a hang.
#[test]
fn damaged_bundles_never_panic() {
    // A bundle opens as a replay: the content decides, not the name.
    let open_bundle_recording = gpudiag_telemetry::replay::ReplayBackend::open;
    use gpudiag_telemetry::replay::Pace;
    let (path, dir) = report(&["--replay", s(&fixture("healthy.ndjson"))]);
    let bytes = std::fs::read(&path).unwrap();
    let damaged = dir.path().join("damaged.tar.gz");
    let step = (bytes.len() / 150).max(1);
    let mut outcomes = BTreeMap::new();
    for cut in (0..bytes.len()).step_by(step) {
        std::fs::write(&damaged, &bytes[..cut]).unwrap();
        let ok = open_bundle_recording(&damaged, Pace::AsFastAsPossible).is_ok();
        *outcomes.entry(ok).or_insert(0) += 1;
        let mut flipped = bytes.clone();
        flipped[cut] ^= 0xA5;
        std::fs::write(&damaged, &flipped).unwrap();
        let _ = open_bundle_recording(&damaged, Pace::AsFastAsPossible);
    }
    // Early cuts fail; the whole file opens.
    assert!(outcomes.get(&false).is_some_and(|&n| n > 0), "{outcomes:?}");
    assert!(open_bundle_recording(&path, Pace::AsFastAsPossible).is_ok());
}

#[test]
fn oversized_request_heads_are_refused() {
    let served = serve(&["--demo"]);
    let mut c = TcpStream::connect(&served.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = String::from("GET /metrics HTTP/1.1\r\n");
    for i in 0..1000 {
        req.push_str(&format!("X-Filler-{i}: {}\r\n", "y".repeat(20)));
    }
    // The server may close before reading all of it; that is fine.
    let _ = c.write_all(req.as_bytes());
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 ") || answer.starts_with("HTTP/1.1 400 "),
        "{answer:?}"
    );
    assert_eq!(get(&served.addr, "/metrics").0, 200);
}
