//! `gpudiag trace --merge` and `gpudiag run --profiler-trace`: a PyTorch profiler trace with
//! gpudiag's tracks added. The profiler fixtures in tests/fixtures/profiler/ are Kineto-shaped
//! traces (make_synthetic.py) over part of a real H200 recording (workloads/bf16_matmul).
//! HolisticTraceAnalysis runs on the merged trace in its venv (tests/hta/): that test is
//! `#[ignore]`d for it, and CI runs it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;

use assert_cmd::Command;
use serde_json::Value;

use gpudiag_export::chrome_trace::{self, Trace, TraceEvent};
use gpudiag_export::profiler_merge::MERGE_KEY;

use crate::support::{self, Run, at, required_file, root};

const RECORDING: &str = "tests/fixtures/workloads/bf16_matmul.ndjson.gz";
const BASE_FIRST: &str = "tests/fixtures/profiler/synthetic.pt.trace.json.gz";
const BASE_LAST: &str = "tests/fixtures/profiler/synthetic_base_last.pt.trace.json.gz";
/// A real torch 2.11 trace and recording from an H200, with a known 2 s host pause (README there).
const REAL_TRACE: &str =
    "tests/fixtures/profiler/h200_torch2.11/training_with_pause.pt.trace.json.gz";
const REAL_RECORDING: &str = "tests/fixtures/profiler/h200_torch2.11/recording.ndjson.gz";
const REAL_PAUSE: &str = "tests/fixtures/profiler/h200_torch2.11/pause.json";

fn gpudiag() -> Command {
    let mut c = support::gpudiag();
    c.env("GPUDIAG_SYSFS_ROOT", "/nonexistent-sysfs-root");
    c
}

fn merge(profiler: &Path, recording: &Path, output: &Path, extra: &[&str]) -> Run {
    Run::of(
        gpudiag()
            .args(["trace", "--merge"])
            .arg(profiler)
            .arg("--replay")
            .arg(recording)
            .arg("-o")
            .arg(output)
            .args(extra),
    )
}

fn read_bytes(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        raw
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&read_bytes(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The events gpudiag added (pids from the merge's base up).
fn added(merged: &Value) -> Vec<Value> {
    let base = merged[MERGE_KEY]["pid_base"].as_u64().unwrap();
    merged["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pid"].as_u64().is_some_and(|p| p >= base))
        .cloned()
        .collect()
}

fn schema() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(at("assets/schema/chrome-trace.schema.json")).unwrap(),
    )
    .unwrap()
}

/// What every event of the Trace Event Format needs, whoever wrote it.
fn assert_trace_event_format(merged: &Value) {
    let events = merged["traceEvents"].as_array().expect("traceEvents array");
    for (i, e) in events.iter().enumerate() {
        let ph = e["ph"]
            .as_str()
            .unwrap_or_else(|| panic!("event {i}: no ph: {e}"));
        assert!(
            e.get("pid").is_some() && e.get("tid").is_some(),
            "event {i}: {e}"
        );
        if ph != "M" {
            assert!(e["ts"].is_number(), "event {i}: ts {e}");
        }
        if ph == "X" {
            assert!(
                e["dur"].as_f64().is_some_and(|d| d >= 0.0),
                "event {i}: dur {e}"
            );
        }
        if ph == "C" {
            let args = e["args"].as_object().expect("counter args");
            assert!(args.values().all(Value::is_number), "event {i}: {e}");
        }
    }
}

/// gpudiag's part of a merged trace is a valid gpudiag trace: against the committed schema and
/// the exporter's own validator.
fn assert_gpudiag_part_is_valid(merged: &Value) {
    let ours = Value::from(added(merged));
    let alone = serde_json::json!({
        "traceEvents": ours,
        "displayTimeUnit": "ms",
        "otherData": merged[MERGE_KEY]["trace"],
    });
    let validator = jsonschema::draft202012::new(&schema()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&alone)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let trace: Trace = serde_json::from_value(alone).unwrap();
    let problems = chrome_trace::validate(&trace);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn merges_either_key_order_plain_or_gzip_and_keeps_the_profilers_events() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.pt.trace.json");
    std::fs::write(&plain, read_bytes(&at(BASE_LAST))).unwrap();
    let mut results = Vec::new();
    for (input, output) in [
        (at(BASE_FIRST), dir.path().join("a.json")),
        (at(BASE_LAST), dir.path().join("b.json.gz")),
        (plain.clone(), dir.path().join("c.json")),
    ] {
        let run = merge(&input, &at(RECORDING), &output, &[]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(run.stderr.contains("merged"), "{}", run.stderr);
        let original = read_json(&input);
        let merged = read_json(&output);
        assert_trace_event_format(&merged);
        assert_gpudiag_part_is_valid(&merged);
        // Every top-level key and every profiler event comes through unchanged, in order.
        for (k, v) in original.as_object().unwrap() {
            if k != "traceEvents" {
                assert_eq!(&merged[k], v, "{k}");
            }
        }
        let before = original["traceEvents"].as_array().unwrap();
        let after = merged["traceEvents"].as_array().unwrap();
        assert_eq!(&after[..before.len()], &before[..]);
        let ours = added(&merged);
        assert_eq!(after.len(), before.len() + ours.len());
        assert!(ours.iter().any(|e| e["ph"] == "C" && e["name"] == "util %"));
        assert!(ours.iter().any(|e| {
            e["args"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("gpudiag: GPU 0"))
        }));
        // No pid of gpudiag's is one the profiler used.
        let theirs: std::collections::BTreeSet<String> =
            before.iter().map(|e| e["pid"].to_string()).collect();
        assert!(ours.iter().all(|e| !theirs.contains(&e["pid"].to_string())));
        results.push((merged, ours));
    }
    // The same profiler trace, whatever its key order or compression, merges the same.
    assert_eq!(results[0].1, results[1].1);
    assert_eq!(results[1].1, results[2].1);
}

#[test]
fn counters_land_at_the_recordings_wall_clock_times() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.json");
    let run = merge(&at(BASE_LAST), &at(RECORDING), &out, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let merged = read_json(&out);
    let base_ns = merged["baseTimeNanoseconds"].as_u64().unwrap();
    let window_start_us = merged[MERGE_KEY]["window_start_ms"].as_f64().unwrap() * 1000.0;
    // The recording's sample times on device 0, epoch µs.
    let text = String::from_utf8(read_bytes(&at(RECORDING))).unwrap();
    let samples: Vec<f64> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "sample")
        .filter_map(|v| v["time_ms"].as_f64())
        .map(|ms| ms * 1000.0)
        .collect();
    let counters: Vec<f64> = added(&merged)
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| base_ns as f64 / 1000.0 + e["ts"].as_f64().unwrap())
        .collect();
    assert!(counters.len() > 5, "{counters:?}");
    for wall in counters {
        let at_sample = samples.iter().any(|s| (s - wall).abs() <= 1.0);
        let at_window_start = (wall - window_start_us).abs() <= 1.0;
        assert!(at_sample || at_window_start, "{wall} is no sample time");
    }
}

#[test]
fn a_real_torch_trace_and_its_recording_line_up_on_the_pause() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.json");
    let run = merge(&at(REAL_TRACE), &at(REAL_RECORDING), &out, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let merged = read_json(&out);
    assert_trace_event_format(&merged);
    assert_gpudiag_part_is_valid(&merged);
    let pause = read_json(&at(REAL_PAUSE));
    let us = |key: &str| pause[key].as_u64().unwrap() as f64 / 1000.0;
    let (enter, p0, p1, exit) = (
        us("annotation_enter_ns"),
        us("pause_start_ns"),
        us("pause_end_ns"),
        us("annotation_exit_ns"),
    );
    let base_us = merged["baseTimeNanoseconds"].as_u64().unwrap() as f64 / 1000.0;

    // The profiler's annotation of the pause, on the wall clock, lies within 10 µs of the clock
    // readings taken on both sides of each of its edges.
    let mark = merged["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "gpudiag_pause" && e["ph"] == "X")
        .expect("the pause annotation");
    let start = base_us + mark["ts"].as_f64().unwrap();
    let end = start + mark["dur"].as_f64().unwrap();
    assert!(
        enter - 10.0 <= start && start <= p0 + 10.0,
        "{start} vs [{enter}, {p0}]"
    );
    assert!(
        p1 - 10.0 <= end && end <= exit + 10.0,
        "{end} vs [{p1}, {exit}]"
    );

    // gpudiag's utilisation track on the same clock: busy before the pause, idle inside, and its
    // edges within 500 ms of the pause's (NVML averages utilisation over its own sample period,
    // which put them 300 ms late at this recording's 100 ms interval).
    let util: Vec<(f64, f64)> = added(&merged)
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "util %")
        .filter_map(|e| Some((base_us + e["ts"].as_f64()?, e["args"]["gpu"].as_f64()?)))
        .collect();
    assert!(util.iter().any(|&(t, v)| t < p0 && v >= 50.0), "{util:?}");
    let drop = util
        .iter()
        .find(|&&(t, v)| t >= p0 - 100_000.0 && v < 5.0)
        .expect("utilisation drops in the pause")
        .0;
    assert!(
        (0.0..=500_000.0).contains(&(drop - p0)),
        "drop {}",
        drop - p0
    );
    let rise = util
        .iter()
        .find(|&&(t, v)| t >= p1 - 100_000.0 && v >= 50.0)
        .expect("utilisation returns after the pause")
        .0;
    assert!(
        (0.0..=500_000.0).contains(&(rise - p1)),
        "rise {}",
        rise - p1
    );
    assert!(
        util.iter()
            .filter(|&&(t, _)| t > p0 + 500_000.0 && t < p1)
            .all(|&(_, v)| v < 5.0),
        "{util:?}"
    );
}

#[test]
fn a_trace_and_a_recording_that_do_not_overlap_are_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.json");
    let run = merge(
        &at(BASE_FIRST),
        &at("tests/fixtures/recordings/healthy.ndjson"),
        &out,
        &[],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("do not overlap"), "{}", run.stderr);
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "temp left"
    );
}

#[test]
fn merge_needs_a_recording_and_keeps_an_existing_output_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.json");
    let r = gpudiag()
        .args(["trace", "--merge", BASE_FIRST, "-o"])
        .arg(&out)
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("--replay"));
    std::fs::write(&out, "keep").unwrap();
    let run = merge(&at(BASE_FIRST), &at(RECORDING), &out, &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep");
}

#[test]
fn bad_profiler_traces_are_exit_2_and_never_replace_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let good = read_bytes(&at(BASE_FIRST));
    let gz = std::fs::read(at(BASE_FIRST)).unwrap();
    let mut huge = br#"{"traceEvents":[{"ph":"X","name":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 17 << 20));
    huge.extend(br#""}]}"#);
    let mut deep = br#"{"traceEvents":["#.to_vec();
    deep.extend(std::iter::repeat_n(b'[', 100_000));
    let mut garbage_gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
    garbage_gz.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "ends early"),
        ("not json", b"PK\x03\x04 a zip file".to_vec(), "not a JSON"),
        ("a csv", b"a,b,c\n1,2,3\n".to_vec(), "not a JSON"),
        (
            "truncated json",
            good[..good.len() / 2].to_vec(),
            "ends early",
        ),
        ("truncated gzip", gz[..gz.len() / 2].to_vec(), "cannot read"),
        ("gzip garbage", garbage_gz, "cannot read"),
        (
            "no traceEvents",
            br#"{"schemaVersion":1}"#.to_vec(),
            "no traceEvents",
        ),
        (
            "events not a list",
            br#"{"traceEvents":{}}"#.to_vec(),
            "traceEvents",
        ),
        ("huge string", huge, "larger than 16 MiB"),
        ("deep nesting", deep, "ends early"),
        (
            "no clock",
            br#"{"traceEvents":[{"ph":"X","ts":5,"dur":1,"pid":1,"tid":1}]}"#.to_vec(),
            "wall clock",
        ),
    ];
    for (what, bytes, needle) in cases {
        let input = dir.path().join("bad.json");
        std::fs::write(&input, &bytes).unwrap();
        let out = dir.path().join("out.json");
        std::fs::write(&out, "good").unwrap();
        let run = merge(&input, &at(RECORDING), &out, &["--force"]);
        assert_eq!(run.code, 2, "{what}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{what}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{what}: {}", run.stderr);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "good", "{what}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "{what}: temp left: {left:?}");
    }
}

#[test]
fn merging_a_merged_trace_again_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let once = dir.path().join("once.json");
    assert_eq!(merge(&at(BASE_FIRST), &at(RECORDING), &once, &[]).code, 0);
    let twice = merge(&once, &at(RECORDING), &dir.path().join("twice.json"), &[]);
    assert_eq!(twice.code, 2, "{}", twice.stderr);
    assert!(twice.stderr.contains("already holds"), "{}", twice.stderr);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `gpudiag run` on the fake MI300X sysfs tree, with a command that writes a profiler trace
/// the way tensorboard_trace_handler names it, stamped with the run's own times.
fn run_with_profiler(dir: &Path, profiler: &Path, trace: &Path, write: bool) -> Run {
    let script = at("tests/fixtures/profiler/make_synthetic.py");
    let target = dir.join("host_4242.1700000000000.pt.trace.json.gz");
    let make = format!(
        "{} {} {} $(($(date +%s%3N) + 200)) 1.5 --pause 0.5 --gzip; sleep 2",
        if write { "python3" } else { "true" },
        script.display(),
        target.display(),
    );
    Run::of(
        gpudiag()
            .env("GPUDIAG_SYSFS_ROOT", at("tests/fixtures/sysfs/mi300x"))
            .args([
                "run",
                "--backend",
                "sysfs",
                "--interval",
                "100ms",
                "--profiler-trace",
            ])
            .arg(profiler)
            .arg("--trace")
            .arg(trace)
            .args(["--", "sh", "-c", &make]),
    )
}

#[test]
fn run_merges_the_trace_the_command_wrote_and_ignores_older_ones() {
    let dir = tempfile::tempdir().unwrap();
    // A trace from an earlier run: older than this run, so not taken.
    let old = dir.path().join("host_1.1600000000000.pt.trace.json.gz");
    std::fs::copy(at(BASE_FIRST), &old).unwrap();
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(past)
        .unwrap();
    let merged = dir.path().join("merged.json");
    let started = now_ms();
    let run = run_with_profiler(dir.path(), dir.path(), &merged, true);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("merged"), "{}", run.stderr);
    let m = read_json(&merged);
    assert_eq!(
        m[MERGE_KEY]["profiler_trace"],
        "host_4242.1700000000000.pt.trace.json.gz"
    );
    assert!(m[MERGE_KEY]["window_start_ms"].as_f64().unwrap() >= started as f64);
    assert_trace_event_format(&m);
    assert_gpudiag_part_is_valid(&m);
    assert!(added(&m).iter().any(|e| e["ph"] == "C"), "no counters");
}

#[test]
fn run_without_a_new_profiler_trace_writes_gpudiags_own_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let merged = dir.path().join("merged.json");
    let run = run_with_profiler(dir.path(), dir.path(), &merged, false);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("no profiler trace was written"),
        "{}",
        run.stderr
    );
    let trace: Trace = serde_json::from_value(read_json(&merged)).unwrap();
    assert!(chrome_trace::validate(&trace).is_empty());
    let _: &[TraceEvent] = &trace.trace_events;
}

/// The venv `.ci/run` makes for HolisticTraceAnalysis (tests/hta/requirements.txt), or the
/// Python `GPUDIAG_HTA_PYTHON` names.
fn hta_python() -> PathBuf {
    let python = std::env::var_os("GPUDIAG_HTA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| at("target/hta-venv/bin/python"));
    required_file(
        python,
        "`.ci/run` makes target/hta-venv, or set GPUDIAG_HTA_PYTHON",
    )
}

fn breakdowns(python: &Path, trace: &Path) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let name = trace.file_name().unwrap();
    std::fs::copy(trace, dir.path().join(name)).unwrap();
    let out = StdCommand::new(python)
        .arg(at("tests/hta/breakdowns.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "HTA failed on {}:\n{stdout}\n{}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("BREAKDOWNS "))
        .unwrap_or_else(|| panic!("no result from HTA:\n{stdout}"));
    serde_json::from_str(line).unwrap()
}

#[test]
#[ignore = "needs the HolisticTraceAnalysis venv .ci/run makes (target/hta-venv); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn holistic_trace_analysis_breakdowns_run_on_the_merged_trace_and_match_the_original() {
    let python = hta_python();
    let dir = tempfile::tempdir().unwrap();
    for (input, recording) in [
        (BASE_FIRST, RECORDING),
        (BASE_LAST, RECORDING),
        (REAL_TRACE, REAL_RECORDING),
    ] {
        let merged = dir.path().join("merged.json.gz");
        let run = merge(&at(input), &at(recording), &merged, &["--force"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let original = breakdowns(&python, &at(input));
        let with_ours = breakdowns(&python, &merged);
        // gpudiag's tracks change nothing HTA computes from the profiler's events.
        assert_eq!(original, with_ours);
        let temporal = &with_ours["temporal"][0];
        assert!(
            temporal["compute_time(us)"].as_f64().unwrap() > 0.0,
            "{with_ours}"
        );
        let idle = with_ours["idle"].as_array().unwrap();
        assert!(
            idle.iter().any(|r| r["idle_category"] == "host_wait"),
            "{with_ours}"
        );
    }
}

/// `run --kernels --trace` writes kernel, copy, memset and host-wait rows in Kineto's layout:
/// HolisticTraceAnalysis's temporal breakdown and idle-time analysis run on gpudiag's own trace
/// and find the GPU time gpudiag's summary found (a training step of the synthetic collector
/// stream: matmul and small kernels on one stream, an all-reduce on another, pageable copies,
/// memsets, `.item()` waits).
#[test]
#[ignore = "needs the HolisticTraceAnalysis venv .ci/run makes (target/hta-venv); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn holistic_trace_analysis_reads_the_kernel_rows_of_gpudiags_trace() {
    use gpudiag_core::kernels::synthetic::{UNIX0, training_stream};
    use gpudiag_core::kernels::{KernelsAggregator, Limits};
    use gpudiag_export::chrome_trace::TraceBuilder;
    use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample};

    let python = hta_python();
    let mut aggregator = KernelsAggregator::new(Limits::default(), true);
    for m in training_stream(4242, "GPU-1111") {
        aggregator.push(&m);
    }
    let gpu = DeviceInfo {
        index: 0,
        uuid: Some("GPU-1111".into()),
        name: Some("NVIDIA H100".into()),
        ..DeviceInfo::default()
    };
    let mut builder = TraceBuilder::new("nvml", None, &HostInfo::default(), vec![gpu]);
    for i in 0..6u32 {
        builder.push_sample(&Sample {
            gpu_util_pct: Some(60.0 + f64::from(i)),
            ..Sample::new(0, UNIX0 / 1_000_000 + 100 * u64::from(i))
        });
    }
    builder.push_kernel_records(&aggregator.take_kept().unwrap());
    let trace = builder.finish();
    assert!(chrome_trace::validate(&trace).is_empty());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpudiag_kernels.json");
    std::fs::write(&path, serde_json::to_vec(&trace).unwrap()).unwrap();
    let hta = breakdowns(&python, &path);

    let summary = aggregator.summary();
    let ours = &summary.gpus[0].time;
    let temporal = &hta["temporal"][0];
    let us = |key: &str| {
        temporal[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {hta}"))
    };
    let close =
        |theirs: f64, ours_s: f64| (theirs - ours_s * 1e6).abs() <= 0.005 * ours_s * 1e6 + 50.0;
    // HTA's compute is the union of kernels neither NCCL's nor copies; its idle the gaps where
    // no kernel, copy or memset ran; a host wait is not GPU time.
    assert!(
        close(us("compute_time(us)"), ours.compute_s),
        "{hta}\n{ours:?}"
    );
    assert!(close(us("idle_time(us)"), ours.idle_s), "{hta}\n{ours:?}");
    assert!(
        close(us("non_compute_time(us)"), ours.nccl_s + ours.copy_s),
        "{hta}\n{ours:?}"
    );
    assert!(close(us("kernel_time(us)"), ours.span_s), "{hta}\n{ours:?}");
    // The idle-time analysis runs per stream: the compute stream and the NCCL one.
    let idle = hta["idle"].as_array().unwrap();
    let streams: std::collections::BTreeSet<i64> =
        idle.iter().filter_map(|r| r["stream"].as_i64()).collect();
    assert_eq!(streams, [7, 20].into_iter().collect(), "{hta}");
    assert!(
        idle.iter()
            .any(|r| r["idle_time"].as_f64().unwrap_or(0.0) > 0.0),
        "{hta}"
    );
}

/// One profiler event with a time that cannot be real (1e300 µs, or a day after the rest) once
/// made the merge fail with a 39-digit number of nanoseconds, or widened the overlap to all of
/// the recording. Such events are left out of the trace's span, counted and said, and still
/// copied through.
#[test]
fn events_with_times_that_cannot_be_real_are_skipped_counted_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let baseline_out = dir.path().join("baseline.json");
    let run = merge(&at(BASE_LAST), &at(RECORDING), &baseline_out, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    let baseline = read_json(&baseline_out);
    let window = |m: &Value| {
        (
            m[MERGE_KEY]["window_start_ms"].as_f64().unwrap(),
            m[MERGE_KEY]["window_end_ms"].as_f64().unwrap(),
        )
    };
    assert_eq!(baseline[MERGE_KEY]["skipped_events"], 0);
    let original = read_json(&at(BASE_LAST));
    let last_end = original["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some(e["ts"].as_f64()? + e["dur"].as_f64().unwrap_or(0.0)))
        .fold(0.0, f64::max);
    let day_us = 86_400e6;
    let strays = [
        serde_json::json!({"ph": "X", "name": "huge ts", "pid": 0, "tid": 7, "ts": 1e300, "dur": 1}),
        serde_json::json!({"ph": "X", "name": "huge dur", "pid": 0, "tid": 7, "ts": 5000, "dur": 1e300}),
        serde_json::json!({"ph": "X", "name": "before 1970", "pid": 0, "tid": 7, "ts": -1e300, "dur": 1}),
        serde_json::json!({"ph": "i", "name": "a day on", "pid": 0, "tid": 7, "ts": last_end + day_us, "s": "t"}),
        serde_json::json!({"ph": "X", "name": "a day long", "pid": 0, "tid": 7, "ts": 5000, "dur": day_us}),
    ];
    for (i, stray) in strays.iter().enumerate() {
        let mut trace = original.clone();
        trace["traceEvents"]
            .as_array_mut()
            .unwrap()
            .push(stray.clone());
        let input = dir.path().join(format!("stray{i}.pt.trace.json"));
        std::fs::write(&input, serde_json::to_vec(&trace).unwrap()).unwrap();
        let out = dir.path().join(format!("merged{i}.json"));
        let run = merge(&input, &at(RECORDING), &out, &[]);
        let name = &stray["name"];
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("gpudiag: warning: 1 profiler event with times that cannot be real"),
            "{name}: {}",
            run.stderr
        );
        let merged = read_json(&out);
        assert_eq!(merged[MERGE_KEY]["skipped_events"], 1, "{name}");
        assert_eq!(window(&merged), window(&baseline), "{name}");
        assert_eq!(added(&merged), added(&baseline), "{name}");
        // Copied through as the profiler wrote it.
        let events = merged["traceEvents"].as_array().unwrap();
        assert!(events.contains(stray), "{name}");
        assert_gpudiag_part_is_valid(&merged);
    }
}
