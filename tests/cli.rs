//! The `gpudiag` binary end to end on recordings: exit codes, messages, selection, `record`.

use std::path::Path;

use gpudiag_core::check::CheckReport;
use gpudiag_model::finding::Severity;
use gpudiag_model::finding::Status;
use gpudiag_model::sample::Metric;
use gpudiag_telemetry::recording::MAX_LINE_BYTES;

use crate::support::{Run, fixture, hostile, run as gpudiag, s};

const T0: u64 = 1_767_225_600_000;
const UUID0: &str = "GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11";
const UUID1: &str = "GPU-8c41d0e5-2f7a-4b93-86de-15ab3c9e7f42";

/// `check --json --replay <path>` plus `extra`.
fn check_replay(path: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["check", "--json", "--replay", s(path)];
    args.extend_from_slice(extra);
    gpudiag(&args)
}

fn ids(findings: &[gpudiag_model::finding::Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.id.as_str()).collect()
}

/// True on a host where the NVIDIA driver is installed: the "no NVML" tests do not apply there.
fn has_nvidia_driver() -> bool {
    Path::new("/dev/nvidiactl").exists() || Path::new("/proc/driver/nvidia/version").exists()
}

// ---------------------------------------------------------------------------------------------
// Exit code 0 and 1

#[test]
fn healthy_recording_exits_0() {
    let run = gpudiag(&["check", "--replay", s(&fixture("healthy.ndjson"))]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    assert!(
        run.stdout
            .contains("GPU 0  NVIDIA H200  00000000:19:00.0  Hopper (cc 9.0)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("util 89% (mean 89%, max 91%)"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("findings: none"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("status: healthy (0 fail, 0 warn, 0 info) · exit code 0"),
        "{}",
        run.stdout
    );

    let report = check_replay(&fixture("healthy.ndjson"), &[]).report();
    assert_eq!(report.status, Status::Healthy);
    assert_eq!(report.exit_code, 0);
    assert_eq!(report.window.ticks, 10);
    assert_eq!(report.devices.len(), 1);
    assert!(report.devices[0].findings.is_empty());
}

#[test]
fn ecc_errors_exit_1_and_name_their_findings() {
    let run = check_replay(&fixture("ecc_error.ndjson"), &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.status, Status::Fail);
    assert_eq!(report.exit_code, 1);
    let findings = &report.devices[0].findings;
    let found = ids(findings);
    assert!(found.contains(&"errors.ecc_uncorrectable"), "{found:?}");
    assert!(found.contains(&"errors.xid_48"), "{found:?}");
    assert!(found.contains(&"errors.reset_pending"), "{found:?}");
    // Worst first.
    assert_eq!(findings[0].severity, Severity::Fail);
    assert_eq!(findings.last().unwrap().id, "errors.reset_pending");
    let ecc = findings
        .iter()
        .find(|f| f.id == "errors.ecc_uncorrectable")
        .unwrap();
    assert_eq!(ecc.severity, Severity::Fail);
    assert_eq!(ecc.device, Some(0));
    assert_eq!(ecc.evidence.values["ecc_uncorrected_volatile"], 2);
    let xid = findings.iter().find(|f| f.id == "errors.xid_48").unwrap();
    assert_eq!(xid.severity, Severity::Fail);
    assert_eq!(xid.time_ms, T0 + 2690);
    assert_eq!(xid.evidence.values["xid"], 48);
    assert!(!xid.advice.is_empty());

    // The text form carries the same verdict and exit code.
    let text = gpudiag(&["check", "--replay", s(&fixture("ecc_error.ndjson"))]);
    assert_eq!(text.code, 1);
    assert!(
        text.stdout
            .contains("[fail] XID 48: double-bit ECC error in GPU memory"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("status: fail (2 fail, 1 warn, 0 info) · exit code 1"),
        "{}",
        text.stdout
    );
}

#[test]
fn fail_on_sets_the_severity_that_exits_1() {
    // two_gpus has one warning (XID 31), the power cap as information, and nothing worse.
    let path = fixture("two_gpus.ndjson");
    let default = check_replay(&path, &[]);
    assert_eq!(default.code, 0);
    let report = default.report();
    assert_eq!(report.status, Status::Warn);
    assert_eq!(report.fail_on, Severity::Fail);
    assert_eq!(
        ids(&report.devices[0].findings),
        ["errors.xid_31", "throttle.sw_power_cap"]
    );
    assert_eq!(report.devices[0].findings[0].severity, Severity::Warn);
    assert_eq!(report.devices[0].findings[1].severity, Severity::Info);

    let warn = check_replay(&path, &["--fail-on", "warn"]);
    assert_eq!(warn.code, 1, "{}", warn.stderr);
    let report = warn.report();
    assert_eq!(report.fail_on, Severity::Warn);
    assert_eq!(report.exit_code, 1);
    assert_eq!(report.status, Status::Warn);

    let fail = check_replay(&path, &["--fail-on", "fail"]);
    assert_eq!(fail.code, 0);
    assert_eq!(fail.report().exit_code, 0);

    // An info finding (an unknown XID, host-wide) stays info; this recording's GPU is lost at
    // its end (a device_lost event), which fails the check whatever the info findings.
    let path = fixture("all_kinds.ndjson");
    let run = check_replay(&path, &["--fail-on", "warn"]);
    assert_eq!(run.code, 1);
    let run = check_replay(&path, &[]);
    assert_eq!(run.code, 1);
    let report = run.report();
    assert_eq!(report.devices[0].findings[0].id, "device.lost");
    assert_eq!(ids(&report.host_findings), ["errors.xid_157"]);
    assert_eq!(report.host_findings[0].severity, Severity::Info);
    assert_eq!(report.host_findings[0].device, None);
    let healthy = check_replay(&fixture("healthy.ndjson"), &["--fail-on", "info"]);
    assert_eq!(healthy.code, 0);

    let bad = gpudiag(&["check", "--fail-on", "error"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("'error'"), "{}", bad.stderr);
}

// ---------------------------------------------------------------------------------------------
// Exit code 2: usage errors and input files that cannot be read or understood

#[test]
fn unknown_flag_exits_2() {
    let run = gpudiag(&["check", "--bogus"]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty());
    assert!(run.stderr.contains("'--bogus'"), "{}", run.stderr);
    assert!(
        run.stderr.contains("Usage: gpudiag check"),
        "{}",
        run.stderr
    );

    let run = gpudiag(&["frobnicate"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("'frobnicate'"), "{}", run.stderr);
}

#[test]
fn bad_duration_exits_2_quoting_the_value() {
    let run = gpudiag(&[
        "check",
        "--window",
        "soon",
        "--replay",
        s(&fixture("healthy.ndjson")),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty());
    assert!(
        run.stderr.contains("'soon' is not a duration"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--window"), "{}", run.stderr);
    assert!(run.stderr.contains("250ms, 10s or 2m"), "{}", run.stderr);

    let run = gpudiag(&["check", "--interval", "10ms"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr
            .contains("interval '10ms' is below the 50ms minimum"),
        "{}",
        run.stderr
    );
}

#[test]
fn missing_recording_exits_2_with_a_clear_message() {
    let run = gpudiag(&["check", "--replay", "/nonexistent/run.ndjson"]);
    let line = run.one_line_error(2);
    assert!(
        line.contains("cannot open /nonexistent/run.ndjson"),
        "{line}"
    );
    assert!(line.contains("No such file or directory"), "{line}");
}

#[test]
fn a_file_that_is_not_a_recording_exits_2() {
    let run = check_replay(&hostile("not_a_recording.csv"), &[]);
    let line = run.one_line_error(2);
    assert!(
        line.contains("not_a_recording.csv is not a gpudiag recording"),
        "{line}"
    );
    assert!(line.contains("not JSON"), "{line}");

    let run = check_replay(&hostile("no_header.ndjson"), &[]);
    let line = run.one_line_error(2);
    assert!(line.contains("is not a gpudiag recording"), "{line}");
    assert!(line.contains("header"), "{line}");

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.ndjson");
    std::fs::write(&empty, b"").unwrap();
    let line = check_replay(&empty, &[]).one_line_error(2).to_owned();
    assert!(line.contains("empty"), "{line}");

    // A directory is not a recording either.
    let line = check_replay(dir.path(), &[]).one_line_error(2).to_owned();
    assert!(line.contains(s(dir.path())), "{line}");

    let line = check_replay(&hostile("header_only.ndjson"), &[])
        .one_line_error(2)
        .to_owned();
    assert!(line.contains("no telemetry samples"), "{line}");
}

#[test]
fn future_format_version_says_to_upgrade() {
    let run = check_replay(&hostile("future_version.ndjson"), &[]);
    let line = run.one_line_error(2);
    assert!(line.contains("format version 2"), "{line}");
    assert!(line.contains("versions up to 1"), "{line}");
    assert!(line.contains("upgrade gpudiag"), "{line}");
}

/// A recording damaged part way is still read: exit 0 for these healthy ones, with the damage
/// named in one warning.
fn damaged_but_read(path: &Path) -> (CheckReport, String) {
    let run = check_replay(path, &[]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.exit_code, 0);
    let skipped: Vec<&String> = report
        .source
        .warnings
        .iter()
        .filter(|w| w.starts_with("skipped "))
        .collect();
    assert_eq!(skipped.len(), 1, "{:?}", report.source.warnings);
    let warning = skipped[0].clone();
    (report, warning)
}

#[test]
fn a_line_that_is_not_utf8_is_skipped_and_named() {
    let (report, warning) = damaged_but_read(&hostile("invalid_utf8.ndjson"));
    assert!(
        warning.starts_with("skipped 1 malformed line (first at line 3: not valid UTF-8"),
        "{warning}"
    );
    assert_eq!(report.window.ticks, 2);
}

#[test]
fn malformed_and_mistyped_lines_are_skipped_and_named() {
    let (report, warning) = damaged_but_read(&hostile("malformed_middle.ndjson"));
    assert!(
        warning.starts_with("skipped 1 malformed line (first at line 4: malformed JSON"),
        "{warning}"
    );
    assert_eq!(report.window.ticks, 4);
    let (report, warning) = damaged_but_read(&hostile("wrong_type.ndjson"));
    assert!(
        warning.starts_with("skipped 1 malformed line (first at line 3: invalid sample record"),
        "{warning}"
    );
    assert!(warning.contains("\"zero\""), "{warning}");
    assert_eq!(report.window.ticks, 3);
}

#[test]
fn huge_line_is_skipped_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.ndjson");
    let healthy = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let lines: Vec<&str> = healthy.lines().collect();
    let mut bytes = format!("{}\n{}\n", lines[0], lines[1]).into_bytes();
    // A line just past the limit, that is valid JSON apart from its length.
    bytes.extend_from_slice(br#"{"kind":"notice","pad":""#);
    bytes.extend(std::iter::repeat_n(b'a', MAX_LINE_BYTES));
    bytes.extend_from_slice(b"\"}\n");
    bytes.extend_from_slice(format!("{}\n", lines[2]).as_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let (report, warning) = damaged_but_read(&path);
    assert_eq!(
        warning,
        format!(
            "skipped 1 malformed line (first at line 3: longer than the limit of \
             {MAX_LINE_BYTES} bytes)"
        )
    );
    assert_eq!(report.window.ticks, 2);
}

#[test]
fn damage_anywhere_is_counted_and_only_a_short_excerpt_is_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.ndjson");
    let healthy = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let lines: Vec<&str> = healthy.lines().collect();
    // A megabyte-long invalid value with terminal escapes, a line of disk garbage and a cut
    // line, in the middle of a recording.
    let hostile = format!(
        "{{\"kind\":\"sample\",\"time_ms\":{T0},\"device\":0,\"power_w\":\"\\u001b[2J{}\"}}",
        "W".repeat(1 << 20)
    );
    let mut text = format!("{}\n{}\n{hostile}\n", lines[0], lines[1]);
    text.push_str("\u{0}\u{0}\u{0}garbage\n");
    text.push_str(&lines[2][..40]);
    text.push('\n');
    for line in &lines[3..] {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(&path, &text).unwrap();

    for args in [&["--json"][..], &[][..]] {
        let mut all = vec!["check", "--replay", s(&path)];
        all.extend_from_slice(args);
        let run = gpudiag(&all);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let out = format!("{}{}", run.stdout, run.stderr);
        assert!(out.len() < 64 * 1024, "{} bytes of output", out.len());
        assert!(
            !out.contains(&"W".repeat(200)),
            "the value was quoted whole"
        );
        assert!(!out.contains('\u{1b}'), "a raw escape reached the output");
        assert!(
            out.contains("skipped 3 malformed lines (first at line 3: invalid sample record"),
            "{out}"
        );
    }
    let report = check_replay(&path, &[]).report();
    assert_eq!(report.window.ticks as usize, lines.len() - 2);
}

/// A `--device` that matches no GPU: could not run what was asked (exit 3), the devices there
/// are listed; `--json` still prints the document, naming the selectors not found, so that a
/// script can tell a GPU it was given and cannot see.
#[test]
fn unknown_device_exits_3_listing_the_devices() {
    let run = gpudiag(&[
        "check",
        "--replay",
        s(&fixture("two_gpus.ndjson")),
        "--device",
        "7",
    ]);
    let line = run.one_line_error(3);
    assert!(line.contains("no GPU matches --device '7'"), "{line}");
    assert!(line.contains(&format!("0 ({UUID0})")), "{line}");
    assert!(line.contains(&format!("1 ({UUID1})")), "{line}");

    let run = check_replay(
        &fixture("two_gpus.ndjson"),
        &["--device", "GPU-nope", "--device", "0", "--device", "9"],
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("'GPU-nope', '9'"), "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.status, gpudiag_model::finding::Status::CouldNotRun);
    assert_eq!(report.devices_not_found, ["GPU-nope", "9"]);
    assert!(report.devices.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Exit code 3, and the demo fallback, on this machine without NVML

#[test]
fn live_check_without_nvml_exits_3() {
    if has_nvidia_driver() {
        eprintln!("skipped: this host has an NVIDIA driver");
        return;
    }
    let run = gpudiag(&["check"]);
    let line = run.one_line_error(3);
    assert!(line.contains("libnvidia-ml"), "{line}");
    assert!(line.contains("is the NVIDIA driver installed?"), "{line}");
    // `--json` still prints a document (status `could_not_run`), with the same line on stderr.
    let run = gpudiag(&["check", "--json"]);
    assert_eq!(run.code, 3);
    let report = run.report();
    assert_eq!(report.status, Status::CouldNotRun);
    let why = report.could_not_run.as_deref().unwrap();
    assert!(why.contains("is the NVIDIA driver installed?"), "{why}");
    assert!(run.stderr.contains("libnvidia-ml"), "{}", run.stderr);
    // `record` fails the same way and leaves no file behind.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("live.ndjson");
    let run = gpudiag(&["record", "-o", s(&out)]);
    let line = run.one_line_error(3);
    assert!(line.contains("libnvidia-ml"), "{line}");
    assert!(!out.exists());
}

#[test]
fn no_subcommand_without_a_gpu_says_why_and_exits_3_when_piped() {
    if has_nvidia_driver() {
        eprintln!("skipped: this host has an NVIDIA driver");
        return;
    }
    // Piped (`gpudiag | cat`), the demo's healthy report would fool a script: say why, exit 3.
    let run = gpudiag(&[]);
    let explanation = run.one_line_error(3);
    assert!(
        explanation.starts_with("gpudiag: no live GPU here"),
        "{explanation}"
    );
    assert!(explanation.contains("libnvidia-ml"), "{explanation}");
    assert!(explanation.contains("gpudiag --demo"), "{explanation}");

    // Asked for by name, the demo needs no explanation.
    let demo = gpudiag(&["--demo"]);
    assert_eq!(demo.code, 0);
    assert!(demo.stderr.is_empty(), "{}", demo.stderr);
    assert!(
        demo.stdout
            .contains("source replay demo.ndjson.gz (bundled)"),
        "{}",
        demo.stdout
    );
    assert!(
        demo.stdout.contains("GPU 0  NVIDIA H200"),
        "{}",
        demo.stdout
    );
}

// ---------------------------------------------------------------------------------------------
// Selecting devices and windows

#[test]
fn device_index_selects_one_gpu() {
    let run = check_replay(
        &fixture("two_gpus.ndjson"),
        &["--device", "1", "--fail-on", "warn"],
    );
    // The only warning belongs to device 0, so it is gone with it.
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.devices.len(), 1);
    let d = &report.devices[0];
    assert_eq!(d.info.index, 1);
    assert_eq!(d.info.uuid.as_deref(), Some(UUID1));
    assert_eq!(d.latest.as_ref().unwrap().device, 1);
    assert!(d.findings.is_empty());
    assert_eq!(report.status, Status::Healthy);
    assert_eq!(d.summary[&Metric::GpuUtilPct].max, Some(0.0));
    assert_eq!(d.summary[&Metric::GpuUtilPct].count, 10);
}

#[test]
fn device_uuid_selects_that_gpu_in_any_case() {
    for sel in [UUID0.to_owned(), UUID0.to_uppercase()] {
        let run = check_replay(&fixture("two_gpus.ndjson"), &["--device", &sel]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let report = run.report();
        assert_eq!(report.devices.len(), 1, "{sel}");
        assert_eq!(report.devices[0].info.index, 0);
        assert_eq!(
            ids(&report.devices[0].findings),
            ["errors.xid_31", "throttle.sw_power_cap"]
        );
    }
    let run = check_replay(
        &fixture("two_gpus.ndjson"),
        &["--device", UUID1, "--device", "0"],
    );
    let indices: Vec<u32> = run.report().devices.iter().map(|d| d.info.index).collect();
    assert_eq!(indices, [0, 1]);
}

#[test]
fn window_on_a_replay_keeps_only_the_end() {
    let path = fixture("two_gpus.ndjson");
    let full = check_replay(&path, &[]).report();
    assert_eq!(full.window.covered_s, 9.0);
    assert_eq!(full.window.requested_s, None);
    let full_util = &full.devices[0].summary[&Metric::GpuUtilPct];
    assert_eq!(full_util.count, 10);

    let run = check_replay(&path, &["--window", "2s"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.window.requested_s, Some(2.0));
    // Samples at +7, +8 and +9 s lie within 2 s of the end; whether the one exactly 2 s before
    // the end counts is the open question of `window_info_describes_the_same_samples_as_the_summary`.
    assert!(
        [1.0, 2.0].contains(&report.window.covered_s),
        "{:?}",
        report.window
    );
    assert_eq!(report.window.end_ms, Some(T0 + 9000));
    assert!(
        [Some(T0 + 7000), Some(T0 + 8000)].contains(&report.window.start_ms),
        "{:?}",
        report.window
    );
    let util = &report.devices[0].summary[&Metric::GpuUtilPct];
    // `Window::Last` is `(end − 2 s, end]`: the samples at +8 s and +9 s.
    assert_eq!(util.count, 2, "{util:?}");
    assert!(util.count < full_util.count);
    assert_eq!(util.last_ms, Some(T0 + 9000));
    assert_eq!(util.first_ms, Some(T0 + 8000));
    // The end of the run is idle, unlike the whole of it.
    assert_eq!(util.max, Some(0.0));
    assert_eq!(util.mean, Some(0.0));
    assert!(full_util.mean.unwrap() > 70.0);
    for stats in report.devices.iter().flat_map(|d| d.summary.values()) {
        assert_eq!(stats.count, 2, "{stats:?}");
    }
    // The XID at +7.42 s is inside the last 2 s, and outside the last 1 s. The power cap is
    // judged over its own (60 s) window ending at the end, so it is still active there.
    assert_eq!(
        ids(&report.devices[0].findings),
        ["errors.xid_31", "throttle.sw_power_cap"]
    );
    let one = check_replay(&path, &["--window", "1s"]).report();
    assert_eq!(ids(&one.devices[0].findings), ["throttle.sw_power_cap"]);
    assert_eq!(one.status, Status::Healthy);
    assert!(one.window.covered_s <= 1.0, "{:?}", one.window);
    assert_eq!(one.window.end_ms, Some(T0 + 9000));
}

/// The healthy recording's GPU for `secs` seconds, one sample a second, each edited by `edit`
/// given the second.
fn recording_of(path: &Path, secs: u64, edit: impl Fn(u64, &mut serde_json::Value)) {
    let healthy = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let mut lines = healthy.lines();
    let mut text = format!("{}\n", lines.next().unwrap());
    let template: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    for t in 0..secs {
        let mut sample = template.clone();
        sample["time_ms"] = (T0 + t * 1000).into();
        edit(t, &mut sample);
        text.push_str(&format!("{sample}\n"));
    }
    std::fs::write(path, text).unwrap();
}

/// `recording_of` at the temperature `temp` gives for each second.
fn recording_with_temperatures(path: &Path, secs: u64, temp: impl Fn(u64) -> f64) {
    recording_of(path, secs, |t, s| s["temp_gpu_c"] = temp(t).into());
}

#[test]
fn a_fast_leak_is_found_in_forty_seconds_and_twelve_are_reported_as_too_few() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leak.ndjson");
    // A training process growing 3.8 GiB/min, read once a second.
    let leaking = |t: u64, s: &mut serde_json::Value| {
        let used = (2u64 << 30) + t * (3891 << 20) / 60;
        s["processes"] =
            serde_json::json!([{"pid": 4242, "name": "python3", "used_memory_bytes": used}]);
        s["absent"].as_object_mut().unwrap().remove("processes");
    };
    recording_of(&path, 40, leaking);
    let report = check_replay(&path, &[]).report();
    assert!(
        ids(&report.devices[0].findings).contains(&"memory.possible_leak"),
        "{:?}",
        report.devices[0].findings
    );
    assert!(
        report
            .not_judged
            .iter()
            .all(|n| n.rule != "memory.possible_leak"),
        "{:?}",
        report.not_judged
    );

    recording_of(&path, 12, leaking);
    let report = check_replay(&path, &[]).report();
    assert!(!ids(&report.devices[0].findings).contains(&"memory.possible_leak"));
    let leak = report
        .not_judged
        .iter()
        .find(|n| n.rule == "memory.possible_leak" && n.device == Some(0))
        .unwrap_or_else(|| panic!("{:?}", report.not_judged));
    assert!(leak.reason.contains("11 s of data"), "{}", leak.reason);
    let text = gpudiag(&["check", "--replay", s(&path)]).stdout;
    assert!(
        text.contains(
            "not judged: memory.possible_leak on GPU 0 — python3 (pid 4242) has 11 s of data; \
             a leak needs 120 s, or 20 s"
        ),
        "{text}"
    );
}

#[test]
fn a_finding_that_cleared_says_when_it_held_and_a_fault_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spike.ndjson");
    // 88 °C against an 89 °C slowdown for the first 5 s of 60: the 10 s mean leaves the margin
    // at +5 s.
    recording_with_temperatures(&path, 60, |t| if t < 5 { 88.0 } else { 55.0 });
    let report = check_replay(&path, &[]).report();
    let hot: Vec<_> = report.devices[0]
        .findings
        .iter()
        .filter(|f| f.id == "thermal.near_slowdown")
        .collect();
    assert_eq!(hot.len(), 1, "{:?}", report.devices[0].findings);
    assert_eq!(hot[0].state, gpudiag_model::finding::FindingState::Cleared);
    assert_eq!(hot[0].time_ms, T0);
    assert_eq!(hot[0].last_seen_ms, Some(T0 + 4000));
    assert_eq!(report.status, Status::Warn);
    assert_eq!(check_replay(&path, &["--fail-on", "warn"]).code, 1);

    let text = gpudiag(&["check", "--replay", s(&path)]).stdout;
    assert!(
        text.contains("°C limit (cleared: 00:00:00–00:00:04 UTC)"),
        "{text}"
    );

    recording_with_temperatures(&path, 60, |_| 88.0);
    let text = gpudiag(&["check", "--replay", s(&path)]).stdout;
    assert!(text.contains("°C limit (since 00:00:00 UTC)"), "{text}");
}

#[test]
fn window_info_describes_the_same_samples_as_the_summary() {
    let report = check_replay(&fixture("two_gpus.ndjson"), &["--window", "2s"]).report();
    let util = &report.devices[0].summary[&Metric::GpuUtilPct];
    // One sample per device per tick in this recording, so the ticks in the window are the
    // samples the summary counted.
    assert_eq!(report.window.ticks, util.count, "{:?}", report.window);
    assert_eq!(report.window.start_ms, util.first_ms, "{:?}", report.window);
    let span_s = (util.last_ms.unwrap() - util.first_ms.unwrap()) as f64 / 1000.0;
    assert_eq!(report.window.covered_s, span_s, "{:?}", report.window);
}

// ---------------------------------------------------------------------------------------------
// Damaged and newer recordings

#[test]
fn truncated_recording_is_read_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crashed.ndjson");
    let text = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let last_start = text.trim_end().rfind('\n').unwrap() + 1;
    let last_len = text.len() - last_start;
    std::fs::write(&path, &text[..last_start + last_len / 2]).unwrap();

    let run = check_replay(&path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let report = run.report();
    assert_eq!(
        report.source.warnings.len(),
        1,
        "{:?}",
        report.source.warnings
    );
    assert!(report.source.warnings[0].contains("last line was cut off"));
    // Everything before the cut is there; the cut sample is not.
    assert_eq!(report.window.ticks, 9);
    assert_eq!(report.window.end_ms, Some(T0 + 8000));
    assert_eq!(report.devices[0].summary[&Metric::GpuUtilPct].count, 9);

    let text = gpudiag(&["check", "--replay", s(&path)]);
    assert_eq!(text.code, 0);
    assert!(
        text.stdout.contains("note: the last line was cut off"),
        "{}",
        text.stdout
    );
}

#[test]
fn unfinished_gzip_recording_is_read_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let gz = dir.path().join("r.ndjson.gz");
    let rec = gpudiag(&[
        "record",
        "--replay",
        s(&fixture("healthy.ndjson")),
        "-o",
        s(&gz),
    ]);
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let bytes = std::fs::read(&gz).unwrap();
    // Without its 8-byte trailer, as a recorder killed before `finish` leaves it.
    let cut = dir.path().join("cut.ndjson.gz");
    std::fs::write(&cut, &bytes[..bytes.len() - 8]).unwrap();
    let run = check_replay(&cut, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.window.ticks, 10);
    assert!(
        report
            .source
            .warnings
            .iter()
            .any(|w| w.contains("gzip stream ends abruptly")),
        "{:?}",
        report.source.warnings
    );
}

#[test]
fn newer_record_kinds_are_skipped_with_a_note() {
    let run = check_replay(&fixture("newer_kinds.ndjson"), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.report();
    assert_eq!(report.window.ticks, 4);
    assert_eq!(
        report.source.warnings.len(),
        1,
        "{:?}",
        report.source.warnings
    );
    let w = &report.source.warnings[0];
    assert!(w.contains("skipped 2 record(s)"), "{w}");
    assert!(w.contains("event:clock_jump"), "{w}");
    assert!(w.contains("probe_result"), "{w}");
}

// ---------------------------------------------------------------------------------------------
// record

#[test]
fn record_from_a_replay_round_trips_through_check() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("two_gpus.ndjson");
    let out = dir.path().join("r.ndjson.gz");
    let run = gpudiag(&["record", "--replay", s(&src), "-o", s(&out)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert_eq!(
        run.stderr,
        format!("gpudiag: recorded 10 tick(s) to {}\n", out.display())
    );
    assert_eq!(std::fs::read(&out).unwrap()[..2], [0x1f, 0x8b]);

    let original = check_replay(&src, &[]).report();
    let copy = check_replay(&out, &[]);
    assert_eq!(copy.code, 0, "{}", copy.stderr);
    let copy = copy.report();
    assert!(
        copy.source.warnings.is_empty(),
        "{:?}",
        copy.source.warnings
    );
    assert_eq!(copy.source.recording.as_deref(), Some(s(&out)));
    assert_eq!(copy.host, original.host);
    assert_eq!(copy.window, original.window);
    assert_eq!(copy.status, original.status);
    // Same identity, samples, statistics and findings, device by device.
    assert_eq!(copy.devices, original.devices);
}

#[test]
fn record_duration_on_a_replay_counts_recorded_time() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.ndjson");
    let src = fixture("two_gpus.ndjson");
    let run = gpudiag(&[
        "record",
        "--replay",
        s(&src),
        "--duration",
        "2s",
        "-o",
        s(&out),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("recorded 3 tick(s)"), "{}", run.stderr);
    let report = check_replay(&out, &[]).report();
    assert_eq!(report.window.ticks, 3);
    assert_eq!(report.window.start_ms, Some(T0));
    assert_eq!(report.window.end_ms, Some(T0 + 2000));
    assert_eq!(report.devices.len(), 2);
}

/// The records of a recording, without the header, as (kind, time, device) in file order.
fn record_order(path: &Path) -> Vec<(String, u64, Option<u64>)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["kind"].as_str().unwrap().to_owned(),
                v["time_ms"].as_u64().unwrap(),
                v["device"].as_u64(),
            )
        })
        .collect()
}

#[test]
fn record_from_a_replay_keeps_the_record_order() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.ndjson");
    let src = fixture("two_gpus.ndjson");
    let run = gpudiag(&["record", "--replay", s(&src), "-o", s(&out)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // two_gpus was written tick by tick with write_tick: the XID precedes the samples of the
    // tick it arrived with. A recording of its replay must come out the same, plus the findings
    // the rules raised along the way, each right after the tick that raised it.
    let written = record_order(&out);
    let (findings, telemetry): (Vec<_>, Vec<_>) = written
        .into_iter()
        .partition(|(kind, _, _)| kind == "finding");
    assert_eq!(telemetry, record_order(&src));
    let xid_at = record_order(&src)
        .into_iter()
        .find(|(kind, _, _)| kind == "event")
        .unwrap()
        .1;
    assert!(
        findings
            .iter()
            .any(|(_, t, d)| *t == xid_at && *d == Some(0)),
        "the XID finding is stamped with the event's time: {findings:?}"
    );
}

#[test]
fn record_writes_plain_ndjson_of_the_selected_device() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("one.ndjson");
    let run = gpudiag(&[
        "record",
        "--replay",
        s(&fixture("two_gpus.ndjson")),
        "--device",
        "1",
        "-o",
        s(&out),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.starts_with(r#"{"format":"gpudiag-recording","version":1,"kind":"header","#),
        "{}",
        &text[..80]
    );
    let report = check_replay(&out, &[]).report();
    let indices: Vec<u32> = report.devices.iter().map(|d| d.info.index).collect();
    assert_eq!(indices, [1]);
    assert_eq!(report.devices[0].summary[&Metric::PowerW].count, 10);
}

#[test]
fn record_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("precious.ndjson");
    std::fs::write(&out, "do not lose me\n").unwrap();
    let src = fixture("healthy.ndjson");

    let run = gpudiag(&["record", "--replay", s(&src), "-o", s(&out)]);
    let line = run.one_line_error(2);
    assert!(line.contains("precious.ndjson exists"), "{line}");
    assert!(line.contains("--force"), "{line}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "do not lose me\n");

    let run = gpudiag(&["record", "--replay", s(&src), "-o", s(&out), "--force"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = check_replay(&out, &[]).report();
    assert_eq!(report.window.ticks, 10);
}

#[test]
fn record_from_a_missing_recording_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.ndjson");
    let run = gpudiag(&["record", "--replay", "/nonexistent.ndjson", "-o", s(&out)]);
    let line = run.one_line_error(2);
    assert!(line.contains("cannot open /nonexistent.ndjson"), "{line}");
    assert!(!out.exists());
}

// ---------------------------------------------------------------------------------------------
// Help and text output

/// Each help ends with the exit codes of its own command: `check`'s four, where --fail-on
/// decides 1; plain `gpudiag`'s, which has no --fail-on; and those of the commands that write a
/// file, which never judge the GPUs into their exit code.
#[test]
fn help_lists_the_exit_codes() {
    for args in [&["check", "--help"][..], &["help", "check"][..]] {
        let run = gpudiag(args);
        assert_eq!(run.code, 0, "{args:?}");
        let help = &run.stdout;
        assert!(help.contains("Exit codes:"), "{args:?}: {help}");
        for line in [
            "0  healthy, or only findings below --fail-on",
            "1  a finding at or above --fail-on (default: fail)",
            "2  usage error",
            "3  could not run: no NVIDIA driver or NVML",
        ] {
            assert!(help.contains(line), "{args:?} lacks {line:?}");
        }
    }
    let expected: [(&[&str], &[&str]); 5] = [
        (
            &["--help"],
            &[
                "0  the terminal UI closed; piped: healthy, or only warn and info findings",
                "1  piped: a fail finding",
                "3  piped: could not run",
            ],
        ),
        (&["record", "--help"], &["0  written", "3  could not run"]),
        (&["trace", "--help"], &["0  written", "3  could not run"]),
        (&["report", "--help"], &["0  written", "3  could not run"]),
        (
            &["replay", "--help"],
            &[
                "1  without a terminal: a fail finding",
                "3  without a terminal",
            ],
        ),
    ];
    for (args, lines) in expected {
        let run = gpudiag(args);
        assert_eq!(run.code, 0, "{args:?}");
        let help = &run.stdout;
        assert!(help.contains("Exit codes:"), "{args:?}: {help}");
        for line in lines {
            assert!(help.contains(line), "{args:?} lacks {line:?}:\n{help}");
        }
    }
    for sub in ["record", "trace", "report", "serve"] {
        let help = gpudiag(&[sub, "--help"]).stdout;
        assert!(
            !help.lines().any(|l| l.starts_with("  1  ")),
            "{sub} never exits 1, yet its help says when:\n{help}"
        );
    }
    let run = gpudiag(&["--version"]);
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stdout,
        format!("gpudiag {}\n", gpudiag_model::build_info::LONG_VERSION)
    );
}

/// A help text names --fail-on only where the command has that flag: the other commands'
/// exit codes do not depend on it.
#[test]
fn help_mentions_fail_on_only_where_the_command_has_it() {
    use clap::CommandFactory;
    let cli = gpudiag::cli::Cli::command();
    let has_fail_on =
        |c: &clap::Command| c.get_arguments().any(|a| a.get_long() == Some("fail-on"));
    let mut commands: Vec<(Vec<&str>, bool)> = vec![(vec!["--help"], has_fail_on(&cli))];
    for sub in cli.get_subcommands() {
        commands.push((vec![sub.get_name(), "--help"], has_fail_on(sub)));
    }
    assert!(
        commands.iter().any(|(_, has)| *has),
        "no command has --fail-on"
    );
    for (args, has) in commands {
        let run = gpudiag(&args);
        assert_eq!(run.code, 0, "{args:?}");
        if !has {
            assert!(
                !run.stdout.contains("--fail-on"),
                "{args:?} has no --fail-on, yet its help names it:\n{}",
                run.stdout
            );
        }
    }
}

/// `check --help` lists the flags people use first, then where the telemetry comes from, then
/// the kubelet, each group under its heading, with the defaults shown.
#[test]
fn check_help_puts_the_flags_people_use_first() {
    let help = gpudiag(&["check", "--help"]).stdout;
    let order = [
        "--json",
        "--window <DURATION>",
        "--fail-on <FAIL_ON>",
        "--probes <SUITE>",
        "Telemetry source:",
        "--interval <DURATION>",
        "--replay <FILE>",
        "--device <INDEX|UUID>",
        "--init-timeout <DURATION>",
        "Kubernetes pod attribution:",
        "--kubelet-socket <PATH>",
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|s| help.find(s).unwrap_or_else(|| panic!("no {s} in:\n{help}")))
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "not in the order {order:?}:\n{help}"
    );
    for default in [
        "[default: 1s; with --replay, the whole recording]",
        "[default: fail]",
        "[default: 100ms]",
        "[default: every GPU]",
        "[default: 10s]",
    ] {
        assert!(help.contains(default), "no {default} in:\n{help}");
    }
}

/// Every option that takes a value shows its default, in clap's `[default: ...]` or in its
/// text where the default is not a value (`--window`: the whole recording with --replay).
/// The exceptions are the files a command reads or writes only when asked to, and options that
/// must be given.
#[test]
fn every_option_shows_its_default() {
    use clap::CommandFactory;
    const ONLY_WHEN_ASKED: [&str; 8] = [
        "replay",
        "merge",
        "profiler-trace",
        "record",
        "trace",
        "report-file",
        "config",
        "output",
    ];
    let mut cli = gpudiag::cli::Cli::command();
    cli.build();
    let mut missing = Vec::new();
    let mut check = |command: &clap::Command| {
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
            if !takes_value
                || arg.is_hide_set()
                || arg.is_required_set()
                || ONLY_WHEN_ASKED.contains(&long)
            {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            if arg.get_default_values().is_empty() && !help.contains("[default: ") {
                missing.push(format!("{} --{long}", command.get_name()));
            }
        }
    };
    check(&cli);
    for sub in cli.get_subcommands() {
        check(sub);
    }
    assert!(
        missing.is_empty(),
        "options with no default shown: {missing:?}"
    );
}

/// `--version` names the commit this checkout is at (CI builds from a fresh clone), and says
/// so when it cannot (a build from a tarball, without `.git`).
#[test]
fn version_names_the_commit_it_was_built_from() {
    let run = gpudiag(&["--version"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let version = env!("CARGO_PKG_VERSION");
    let head = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match (head, option_env!("GPUDIAG_BUILD_COMMIT")) {
        // A commit named at build time wins over git.
        (_, Some(named)) if !named.is_empty() => {
            assert!(run.stdout.contains(&named[..named.len().min(9)]))
        }
        (Some(head), _) => {
            let want = format!("gpudiag {version} ({}", &head[..9]);
            assert!(run.stdout.starts_with(&want), "{} lacks {want}", run.stdout);
            assert!(
                run.stdout.ends_with(")\n") || run.stdout.ends_with(", dirty)\n"),
                "{}",
                run.stdout
            );
        }
        (None, _) => assert_eq!(run.stdout, format!("gpudiag {version} (commit unknown)\n")),
    }
}

/// The probe list in help comes from the probe registry: every probe is named, per-GPU ones
/// apart from those that run over all GPUs together.
#[test]
fn probe_help_names_every_probe_of_the_registry() {
    let run = gpudiag(&["probe", "--help"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let help = &run.stdout;
    let about = help.lines().next().unwrap();
    let names_help = help
        .lines()
        .find(|l| l.trim_start().starts_with("[NAME]..."))
        .unwrap_or_default();
    for line in [about, names_help] {
        for name in gpudiag_probes::PROBE_NAMES {
            assert!(
                line.split(|c: char| !c.is_alphanumeric())
                    .any(|w| w == name),
                "{name} missing from {line:?} in:\n{help}"
            );
        }
        let together = gpudiag_probes::MULTI_GPU_PROBES.join(", ");
        assert!(
            line.contains(&format!("{together} over all selected GPUs together")),
            "{line}"
        );
    }
    let top = gpudiag(&["--help"]).stdout;
    let probe_line = top
        .lines()
        .find(|l| l.trim_start().starts_with("probe "))
        .unwrap();
    assert!(probe_line.contains("nccl"), "{top}");
}

#[test]
fn text_output_shows_na_for_absent_values_never_0() {
    // healthy: an SXM part without a fan.
    let run = gpudiag(&["check", "--replay", s(&fixture("healthy.ndjson"))]);
    assert!(run.stdout.contains("  fan n/a\n"), "{}", run.stdout);
    assert!(!run.stdout.contains("fan 0"), "{}", run.stdout);

    // sparse: a GPU read without privileges, most values absent.
    let run = gpudiag(&["check", "--replay", s(&fixture("sparse.ndjson"))]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    for expected in [
        "host n/a · driver 580.65.06 (CUDA n/a)",
        "power n/a (mean n/a)",
        "fan n/a",
        "rx n/a  tx n/a  replays n/a",
        "ECC volatile n/a  remap pending n/a  throttle: n/a",
        "util 3% (mean 4%, max 7%)",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    for zero in ["power 0", "fan 0", "rx 0", "replays 0", "ECC volatile 0"] {
        assert!(!out.contains(zero), "{zero:?} in:\n{out}");
    }
    // No process list was read, so none is shown (rather than "processes: 0").
    assert!(!out.contains("processes:"), "{out}");

    // The JSON says the same: null with a reason, and no summary for a series never seen.
    let run = check_replay(&fixture("sparse.ndjson"), &[]);
    let json = run.json();
    let latest = &json["devices"][0]["latest"];
    assert_eq!(latest["power_w"], serde_json::Value::Null);
    assert_eq!(latest["absent"]["power_w"], "no_permission");
    assert_eq!(latest["fan_pct"], serde_json::Value::Null);
    assert_eq!(latest["absent"]["fan_pct"], "not_supported");
    assert_eq!(
        latest["absent"]["throttle_reasons"]["error"],
        "Unknown Error"
    );
    let summary = json["devices"][0]["summary"].as_object().unwrap();
    for absent in [
        "power_w",
        "fan_pct",
        "ecc_uncorrected_volatile",
        "pcie_rx_bytes_per_s",
    ] {
        assert!(!summary.contains_key(absent), "{absent} in {summary:?}");
    }
    assert_eq!(summary["gpu_util_pct"]["count"], 4);
}

/// Control characters a terminal would obey: anything `char::is_control` but the newline.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect()
}

/// A recording whose device, host, process, throttle reason, finding and record kind carry
/// terminal escapes (clear screen, window title, bell, C1 CSI) and CR LF: the text output shows
/// them as visible escapes, forges no line, and the JSON keeps the strings as they were.
#[test]
fn text_output_escapes_control_characters_from_a_recording() {
    let path = hostile("control_chars.ndjson");
    let run = gpudiag(&["check", "--replay", s(&path)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Not a terminal, so `replay` prints the same summary.
    let replayed = gpudiag(&["replay", s(&path)]);
    for out in [&run.stdout, &replayed.stdout] {
        assert!(raw_controls(out).is_empty(), "{:?}", raw_controls(out));
        for line in out.lines() {
            assert!(
                !line.trim_start().starts_with("FAKE"),
                "forged line in:\n{out}"
            );
        }
        for visible in [
            r"host gpu-node-07\x1b]0;owned host\x07 ·",
            r"GPU 0  EVIL\x1b]0;pwned\x07\x1b[2J  00000000:19:00.0  Hopper\u{9b}2J (cc 9.0)",
            r"pid 4242  proc\x1b[2J…\x0d\x0aFAKE [fail] line  1.0 GiB",
            r"throttle: sw_power_cap\x1b[31m",
            r"[warn] recorded\x1b[2J\x0d\x0aFAKE [fail] forged finding (recorded)",
            r"what to do: ring\x07 the bell",
            r"kinds this gpudiag does not know (x\x1b]0;kind\x07)",
        ] {
            assert!(out.contains(visible), "missing {visible:?} in:\n{out}");
        }
    }
    // JSON escapes by itself and keeps the recorded strings exact.
    let report = check_replay(&path, &[]).report();
    assert_eq!(
        report.devices[0].info.name.as_deref(),
        Some("EVIL\x1b]0;pwned\x07\x1b[2J")
    );
}

/// An error that quotes a recording's bad value (here a severity that is a terminal escape
/// followed by CR LF) stays one line on stderr, its control characters visible.
#[test]
fn a_verdict_naming_a_hostile_process_cannot_forge_a_line() {
    let dir = tempfile::tempdir().unwrap();
    // The recording's 2 s are enough for a verdict once the minimum span allows it.
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "[rules.utilisation]\nmin_span_s = 1.0\n").unwrap();
    let path = hostile("control_chars.ndjson");
    let run = gpudiag(&["check", "--config", s(&config), "--replay", s(&path)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("verdict GPU 0: "), "{}", run.stdout);
    assert!(raw_controls(&run.stdout).is_empty(), "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .all(|l| !l.trim_start().starts_with("FAKE")),
        "forged line in:\n{}",
        run.stdout
    );
}

/// JSON escapes C0 but serde_json writes C1 as it is, and a terminal that `cat`s the report
/// reads U+009B as CSI: the report escapes it, and a JSON reader reads the same name back.
#[test]
fn json_output_carries_no_raw_c1_control() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(hostile("control_chars.ndjson")).unwrap();
    let evil = text.replacen("gpu-node-07", "gpu-node-07\\u009b2J\\u0085", 1);
    assert_ne!(evil, text);
    let path = dir.path().join("c1.ndjson");
    std::fs::write(&path, evil).unwrap();
    let run = gpudiag(&["check", "--replay", s(&path), "--json"]);
    assert!(run.code <= 1, "{}", run.stderr);
    let c1: Vec<char> = run
        .stdout
        .chars()
        .filter(|c| ('\u{80}'..='\u{9f}').contains(c))
        .collect();
    assert!(c1.is_empty(), "{c1:?}");
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let host = report["host"]["hostname"].as_str().unwrap();
    assert!(host.contains("\u{9b}2J\u{85}"), "{host:?}");
}

/// A recording whose every sample line is malformed holds no sample, and the error says why
/// rather than only that.
#[test]
fn a_recording_of_malformed_samples_says_they_were_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = std::fs::read_to_string(hostile("header_only.ndjson")).unwrap();
    for t in 0..20 {
        text.push_str(&format!(
            "{{\"kind\":\"sample\",\"time_ms\":{t},\"device\":0,\"gpu_util_pct\":NaN}}\n"
        ));
    }
    let path = dir.path().join("nan.ndjson");
    std::fs::write(&path, text).unwrap();
    let run = gpudiag(&["check", "--replay", s(&path)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("holds no telemetry samples"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("malformed"), "{}", run.stderr);
}

#[test]
fn errors_quoting_a_recording_escape_control_characters() {
    let path = hostile("control_chars_in_error.ndjson");
    // A damaged line is skipped and named; the note quoting it is escaped like everything else.
    let run = gpudiag(&["check", "--replay", s(&path)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(raw_controls(&run.stdout).is_empty(), "{:?}", run.stdout);
    assert!(raw_controls(&run.stderr).is_empty(), "{:?}", run.stderr);
    assert!(
        run.stdout.contains(r"line 3: invalid finding record: unknown variant `\x1b]0;pwned\x07\x1b[2J\x0d\x0aFAKE [fail] line`"),
        "{}",
        run.stdout
    );
}

/// A sample that lacks a value the device's header knows (the slowdown temperature, the
/// maximum link) shows the header's; a value absent everywhere is one "n/a", without the unit
/// or prefix its template puts around a present value.
#[test]
fn text_output_falls_back_to_the_device_and_writes_absent_values_bare() {
    let text = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let device = &mut lines[0]["devices"][0];
    device["temp_slowdown_c"] = 90.0.into();
    device["pcie_gen_max"] = 5.into();
    device["pcie_width_max"] = 16.into();
    for l in lines.iter_mut().filter(|l| l["kind"] == "sample") {
        for field in [
            "gpu_util_pct",
            "pstate",
            "pcie_gen",
            "pcie_width",
            "pcie_gen_max",
            "pcie_width_max",
            "temp_slowdown_c",
            "power_w",
            "power_limit_w",
            "sm_clock_max_mhz",
        ] {
            l[field] = serde_json::Value::Null;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gaps.ndjson");
    let body: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&path, body.join("\n") + "\n").unwrap();

    let run = gpudiag(&["check", "--replay", s(&path)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    for expected in [
        "util n/a (mean n/a, max n/a)",
        "(slowdown 90 °C)",
        "P-state n/a",
        "PCIe n/a (max Gen5 x16)",
        "power n/a (mean n/a)",
        // The header knows the SM clock's maximum too.
        "SM clock 1980 / 1980 MHz",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    for glued in [
        "n/a%",
        "Pn/a",
        "Genn/a",
        "xn/a",
        "n/a °C",
        "n/a W",
        "n/a MHz",
        "n/a GiB",
        "n/a n/a",
        "n/a / n/a",
    ] {
        assert!(!out.contains(glued), "{glued:?} in:\n{out}");
    }
}

#[test]
fn text_output_of_a_card_with_a_fan_and_processes() {
    let run = gpudiag(&["check", "--replay", s(&fixture("all_kinds.ndjson"))]);
    // The recording ends with its GPU lost: a fail.
    assert_eq!(run.code, 1, "{}", run.stderr);
    let out = &run.stdout;
    for expected in [
        "GPU 0  NVIDIA L40S  00000000:81:00.0  Ada Lovelace (cc 8.9)",
        "fan 44%",
        "throttle: sw_power_cap",
        "processes: 2",
        "pid 4242  blender  1.0 GiB",
        "pid 5151  python3  n/a GiB",
        "[warn] XID 94: contained ECC error",
        "host findings:\n  [info] XID 157",
        "[fail] GPU 0 is lost: it stopped answering the driver",
        "status: fail (1 fail, 1 warn, 2 info) · exit code 1",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}

/// A finding a recording carries that today's rules do not raise again over its samples (an
/// older version's rule, a state the samples do not show): every view shows it, marked as
/// recorded, and none loses it.
#[test]
fn recorded_findings_reach_every_view_marked_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("carried.ndjson");
    let mut text = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    text.push_str(
        r#"{"kind":"finding","id":"thermal.near_slowdown","severity":"warn","device":0,"time_ms":1767225605000,"title":"GPU 0 runs within 5 °C of its slowdown temperature","evidence":{"values":{"temp_gpu_c":86.0},"window_s":10.0,"threshold":">= 85 °C"},"advice":"Check the airflow."}"#,
    );
    text.push('\n');
    std::fs::write(&path, text).unwrap();

    let report = check_replay(&path, &[]).report();
    let carried: Vec<_> = report.devices[0]
        .findings
        .iter()
        .filter(|f| f.id == "thermal.near_slowdown")
        .collect();
    assert_eq!(carried.len(), 1, "{:?}", report.devices[0].findings);
    assert!(carried[0].recorded);
    assert!(
        report.devices[0]
            .findings
            .iter()
            .filter(|f| f.id != "thermal.near_slowdown")
            .all(|f| !f.recorded)
    );

    let text = gpudiag(&["check", "--replay", s(&path)]);
    assert!(
        text.stdout
            .contains("within 5 °C of its slowdown temperature (recorded)"),
        "{}",
        text.stdout
    );

    let trace_path = dir.path().join("t.json");
    let run = gpudiag(&["trace", "--replay", s(&path), "-o", s(&trace_path)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    let marked = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["args"]["id"] == "thermal.near_slowdown")
        .map(|e| e["args"]["recorded"].clone())
        .collect::<Vec<_>>();
    assert_eq!(marked, [serde_json::Value::Bool(true)]);

    // Outside a --window at the recording's end, the carried finding is not the window's.
    let late = check_replay(&path, &["--window", "2s"]).report();
    assert!(
        late.devices[0]
            .findings
            .iter()
            .all(|f| f.id != "thermal.near_slowdown")
    );
}

/// Each shell's completion script is generated from the CLI, names every subcommand, and
/// needs no config: a broken config file must not stop a shell from installing it.
#[test]
fn completions_name_every_subcommand_for_each_shell() {
    let bad = Path::new(env!("CARGO_TARGET_TMPDIR")).join("completions-bad-config.toml");
    std::fs::write(&bad, "[rules\n").unwrap();
    let subcommands = [
        "check",
        "record",
        "config",
        "trace",
        "report",
        "serve",
        "replay",
        "run",
        "probe",
        "completions",
        "man",
    ];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let run = gpudiag(&["--config", s(&bad), "completions", shell]);
        assert_eq!(run.code, 0, "{shell}: {}", run.stderr);
        assert!(run.stderr.is_empty(), "{shell}: {}", run.stderr);
        for sub in subcommands {
            assert!(run.stdout.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    // bash completes the subcommands and a subcommand's own flags.
    let bash = gpudiag(&["completions", "bash"]).stdout;
    assert!(bash.starts_with("_gpudiag()"), "{bash}");
    assert!(bash.contains("complete -F _gpudiag"), "{bash}");
    assert!(bash.contains("gpudiag,check)"), "{bash}");
    assert!(bash.contains("--fail-on"), "{bash}");

    let unknown = gpudiag(&["completions", "tcsh"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
}

/// gpudiag(1) is roff from the CLI: a title line, every subcommand with its page, the exit
/// codes, the pages in SEE ALSO, and the version with its commit.
#[test]
fn man_page_is_roff_naming_the_subcommands() {
    let run = gpudiag(&["man"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let page = &run.stdout;
    assert!(
        page.starts_with(".ie ") || page.starts_with(".TH "),
        "{page}"
    );
    // The preamble once: each section is rendered alone and the repeats are dropped.
    assert_eq!(page.matches(".ie \\n(.g").count(), 1, "{page}");
    let title = page.lines().find(|l| l.starts_with(".TH ")).unwrap();
    assert!(title.starts_with(".TH gpudiag 1 "), "{title}");
    for heading in [
        "NAME",
        "SYNOPSIS",
        "OPTIONS",
        "SUBCOMMANDS",
        "EXIT STATUS",
        "EXAMPLES",
        "SEE ALSO",
        "VERSION",
    ] {
        assert!(
            !section_of(page, heading).trim().is_empty(),
            "empty {heading}"
        );
    }
    let see_also = section_of(page, "SEE ALSO");
    for sub in gpudiag::commands::man::subcommand_names() {
        assert!(
            page.contains(&format!("gpudiag\\-{sub}(1)")),
            "lacks subcommand {sub}"
        );
        assert!(
            see_also.contains(&format!("gpudiag\\-{sub}(1)")),
            "SEE ALSO lacks {sub}: {see_also}"
        );
    }
    // clap's `help` subcommand has no page, so none may be named.
    assert!(!page.contains("gpudiag\\-help(1)"), "{page}");
    assert!(page.contains(&format!("v{}", gpudiag_model::build_info::LONG_VERSION)));
}

/// The text of a man page's section, from its .SH line to the next.
fn section_of<'a>(page: &'a str, heading: &str) -> &'a str {
    // roff quotes a heading of several words.
    let line = if heading.contains(' ') {
        format!(".SH \"{heading}\"\n")
    } else {
        format!(".SH {heading}\n")
    };
    let start = page
        .find(&line)
        .unwrap_or_else(|| panic!("no section {heading}: {page}"));
    let rest = &page[start + line.len()..];
    &rest[..rest.find("\n.SH ").unwrap_or(rest.len())]
}

/// Every subcommand has its page, gpudiag-SUBCOMMAND(1): its usage, each of its flags, its exit
/// codes and examples, and gpudiag(1) in SEE ALSO.
#[test]
fn every_subcommand_has_a_man_page_with_its_flags_exit_codes_and_examples() {
    use clap::CommandFactory;
    let cli = gpudiag::cli::Cli::command();
    let names = gpudiag::commands::man::subcommand_names();
    let listed: Vec<&str> = cli
        .get_subcommands()
        .map(|sub| sub.get_name())
        .filter(|name| *name != "help")
        .collect();
    assert_eq!(names, listed);
    for sub in cli.get_subcommands().filter(|sub| sub.get_name() != "help") {
        let name = sub.get_name();
        let run = gpudiag(&["man", name]);
        assert_eq!(run.code, 0, "man {name}: {}", run.stderr);
        let page = &run.stdout;
        let title = page.lines().find(|l| l.starts_with(".TH ")).unwrap();
        assert!(
            title.starts_with(&format!(".TH gpudiag-{name} 1 ")),
            "{title}"
        );
        let synopsis = section_of(page, "SYNOPSIS");
        assert!(synopsis.contains(&format!("gpudiag {name}")), "{synopsis}");
        for heading in ["NAME", "OPTIONS", "EXIT STATUS", "EXAMPLES"] {
            assert!(
                !section_of(page, heading).trim().is_empty(),
                "man {name}: empty {heading}"
            );
        }
        let exit_status = section_of(page, "EXIT STATUS");
        // Every command can be misused, so each page says what exit code 2 means there.
        assert!(
            exit_status
                .lines()
                .any(|line| line.trim_start().starts_with("2  ")),
            "man {name}: {exit_status}"
        );
        // From OPTIONS on: flags under a help heading (TELEMETRY SOURCE, ...) get a section
        // of that name after it.
        let options = &page[page.find(".SH OPTIONS\n").expect("an OPTIONS section")..];
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                let flag = format!("\\-\\-{}", long.replace('-', "\\-"));
                assert!(
                    options.contains(&format!("\\fB{flag}\\fR")),
                    "man {name} lacks --{long}"
                );
            }
        }
        assert!(
            section_of(page, "SEE ALSO").contains("gpudiag(1)"),
            "man {name}"
        );
    }
}

/// Each example in the help footers (which the man pages show under EXAMPLES) parses with the
/// CLI as it is: an example cannot keep a flag that was renamed or removed.
#[test]
fn every_help_example_parses() {
    use clap::CommandFactory;
    let cli = gpudiag::cli::Cli::command();
    let mut footers = vec![
        cli.get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default(),
    ];
    for sub in cli.get_subcommands() {
        footers.push(
            sub.get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default(),
        );
    }
    let mut parsed = 0;
    for footer in &footers {
        for paragraph in footer.split("\n\n") {
            if !paragraph.starts_with("Example") {
                continue;
            }
            // A command continued on the next line with a backslash is one example.
            let mut examples: Vec<String> = Vec::new();
            let mut continued = false;
            for line in paragraph.lines().skip(1) {
                // Indented under the heading, as the other footers' lines are.
                assert!(line.starts_with("  "), "{line:?} in {paragraph}");
                match examples.last_mut() {
                    Some(last) if continued => last.push_str(line.trim_start()),
                    _ => examples.push(line.to_owned()),
                }
                continued = line.ends_with('\\');
                if continued {
                    let last = examples.last_mut().unwrap();
                    last.pop();
                }
            }
            for line in &examples {
                let Some(command) = line.trim_start().strip_prefix("gpudiag") else {
                    continue;
                };
                let words = shell_words(&format!("gpudiag{command}"));
                let result = <gpudiag::cli::Cli as clap::Parser>::try_parse_from(&words);
                assert!(result.is_ok(), "{line:?}: {:?}", result.err());
                parsed += 1;
            }
        }
    }
    assert!(parsed >= 20, "only {parsed} examples found");
}

/// The words of an example: quotes as a shell reads them, and the example ends at its
/// description (two spaces), a pipe or a redirection.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let mut quote = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, ' ') => {
                words.extend(word.take());
                if chars.peek() == Some(&' ') {
                    break;
                }
            }
            (None, '|' | '>') => break,
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// `gpudiag man --all DIR` writes gpudiag.1 and a page per subcommand, lists them on stdout,
/// and each is the page `gpudiag man [SUBCOMMAND]` prints.
#[test]
fn man_all_writes_every_page_into_a_directory() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("man-all/share/man/man1");
    let _ = std::fs::remove_dir_all(&dir);
    let run = gpudiag(&["man", "--all", s(&dir)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let mut expected = vec!["gpudiag.1".to_owned()];
    for name in gpudiag::commands::man::subcommand_names() {
        expected.push(format!("gpudiag-{name}.1"));
    }
    let listed: Vec<String> = run
        .stdout
        .lines()
        .map(|line| {
            Path::new(line)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(listed, expected);
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(on_disk, sorted);
    assert_eq!(
        std::fs::read_to_string(dir.join("gpudiag.1")).unwrap(),
        gpudiag(&["man"]).stdout
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("gpudiag-check.1")).unwrap(),
        gpudiag(&["man", "check"]).stdout
    );
    // A rerun (a packaging script run twice) replaces the pages.
    assert_eq!(gpudiag(&["man", "--all", s(&dir)]).code, 0);
}

/// A page that does not exist, a subcommand with --all, or a DIR that cannot be made are usage
/// errors (exit 2), with nothing on stdout.
#[test]
fn man_of_an_unknown_subcommand_is_a_usage_error() {
    let run = gpudiag(&["man", "nope"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(run.stderr.contains("\"nope\""), "{}", run.stderr);
    assert!(run.stderr.contains("check"), "{}", run.stderr);

    let both = gpudiag(&["man", "check", "--all", "/tmp"]);
    assert_eq!(both.code, 2, "{}", both.stderr);

    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("man-a-file");
    std::fs::write(&file, "").unwrap();
    let blocked = gpudiag(&["man", "--all", s(&file.join("man1"))]);
    assert_eq!(blocked.code, 2, "{}", blocked.stderr);
    assert!(blocked.stdout.is_empty(), "{}", blocked.stdout);
}

/// A bad config's TOML error keeps its source line and the caret under the fault, each line
/// prefixed and escaped: a control character in the file cannot reach the terminal.
#[test]
fn a_bad_config_error_keeps_its_caret_each_line_prefixed_and_escaped() {
    let bad = Path::new(env!("CARGO_TARGET_TMPDIR")).join("caret-bad-config.toml");
    std::fs::write(&bad, "[rules.memory]\nnearly_full_pct = \x1b[2J 90\n").unwrap();
    let healthy = fixture("healthy.ndjson");
    let run = gpudiag(&["--config", s(&bad), "check", "--replay", s(&healthy)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(lines.len() > 2, "{}", run.stderr);
    assert!(
        lines.iter().all(|l| l.starts_with("gpudiag: ")),
        "{}",
        run.stderr
    );
    assert!(lines[0].contains("caret-bad-config.toml"), "{}", run.stderr);
    assert!(lines[0].contains("line 2"), "{}", run.stderr);
    assert!(!run.stderr.contains('\x1b'), "{}", run.stderr);
    // The quoted source line, escaped, and the caret on the line after it.
    let quoted = lines
        .iter()
        .position(|l| l.contains("nearly_full_pct = \\x1b[2J 90"))
        .unwrap_or_else(|| panic!("no quoted line in {}", run.stderr));
    assert!(lines[quoted + 1].contains('^'), "{}", run.stderr);
}
