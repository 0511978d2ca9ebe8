#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The recording format and the replay backend, end to end through real files: the fixtures in
//! `tests/fixtures/recordings/`, round trips, crash leftovers and hostile input.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpudiag_model::finding::{Evidence, Finding, Severity};
use gpudiag_model::sample::{
    Absent, DeviceInfo, Event, EventKind, HostInfo, ProcessSample, Sample,
};
use gpudiag_telemetry::recording::{
    self, Header, MAX_LINE_BYTES, RECORDING_VERSION, Record, RecordingError, RecordingReader,
    RecordingWriter,
};
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::{Backend, BackendError, Pacing};

const T0: u64 = 1_767_225_600_000;

/// Where a replay stands, as (current, start, end).
fn span(r: &ReplayBackend) -> (u64, u64, u64) {
    let p = r.position();
    (p.current_ms, p.start_ms, p.end_ms)
}

/// A recording among the workspace's fixtures, which the end-to-end tests share.
fn fixture(name: &str) -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/recordings"
    ))
    .join(name)
}

fn header() -> Header {
    let mut h = Header::new(
        "nvml",
        HostInfo {
            hostname: Some("gpu-node-07".into()),
            driver_version: Some("580.65.06".into()),
            cuda_driver_version: Some("13.0".into()),
            nvml_version: None,
        },
        vec![DeviceInfo {
            index: 0,
            name: Some("NVIDIA H200".into()),
            pcie_gen_max: Some(5),
            ..DeviceInfo::default()
        }],
        Some(500),
    );
    h.created_ms = T0 - 5;
    h
}

/// One of every record type, with values that exercise every JSON shape the model uses.
fn every_record() -> Vec<Record> {
    let mut s = Sample::new(0, T0);
    s.gpu_util_pct = Some(99.0);
    s.power_w = Some(688.75);
    s.energy_j = Some(48_211_503.2);
    s.mem_used_bytes = Some(121_634_963_456);
    s.throttle_reasons = Some(0x4);
    s.throttle_reason_names = Some(vec!["sw_power_cap".into()]);
    s.remapped_rows_pending = Some(false);
    s.processes = Some(vec![ProcessSample {
        pid: 48213,
        name: Some("python3".into()),
        user: None,
        kind: Some("compute".into()),
        used_memory_bytes: Some(121_030_000_640),
        sm_util_pct: Some(97.0),
        container_id: Some("3f1c9a".into()),
        container_pid: Some(57),
        cpu_time_s: Some(1234.5),
        attribution: None,
        launch: None,
        state: None,
        started_ms: None,
    }]);
    s.absent.insert("fan_pct".into(), Absent::NotSupported);
    s.absent.insert(
        "pcie_rx_bytes_per_s".into(),
        Absent::Error("timed out".into()),
    );
    let mut values = serde_json::Map::new();
    values.insert("xid".into(), 79.into());
    vec![
        Record::Event(Event {
            time_ms: T0 - 1,
            device: None,
            kind: EventKind::Notice {
                message: "PCIe read slow".into(),
            },
        }),
        Record::Sample(s),
        Record::Event(Event {
            time_ms: T0 + 300,
            device: Some(0),
            kind: EventKind::Xid { xid: 79 },
        }),
        Record::Event(Event {
            time_ms: T0 + 301,
            device: Some(0),
            kind: EventKind::DeviceLost {
                reason: "GPU is lost".into(),
            },
        }),
        Record::Finding(Finding {
            id: "errors.xid".into(),
            severity: Severity::Fail,
            device: Some(0),
            time_ms: T0 + 400,
            title: "GPU fell off the bus (XID 79)".into(),
            evidence: Evidence {
                values,
                window_s: 0.0,
                threshold: "any XID 79".into(),
            },
            advice: "reseat the card".into(),
            last_seen_ms: None,
            state: Default::default(),
            recorded: false,
        }),
        Record::Sample(Sample::new(0, T0 + 500)),
    ]
}

fn write_file(path: &Path, records: &[Record]) {
    let mut w = RecordingWriter::create(path, &header()).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
}

const HEADER_LINE: &str = r#"{"format":"gpudiag-recording","version":1,"kind":"header","created_ms":1767225600000,"tool_version":"0.1.0","backend":"nvml","interval_ms":1000,"host":{},"devices":[{"index":0}]}"#;

fn samples(records: &[Record]) -> Vec<&Sample> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s),
            _ => None,
        })
        .collect()
}

fn events(records: &[Record]) -> Vec<&Event> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

// ---- fixtures ----

#[test]
fn fixture_two_gpus() {
    let (h, records, stats) = recording::read_all(fixture("two_gpus.ndjson")).unwrap();
    assert_eq!(h.version, RECORDING_VERSION);
    assert_eq!(h.backend, "nvml");
    assert_eq!(h.interval_ms, Some(1000));
    assert_eq!(h.host.driver_version.as_deref(), Some("580.65.06"));
    assert_eq!(h.devices.len(), 2);
    assert_eq!(h.devices[1].name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(h.devices[0].memory_total_bytes, Some(150_754_820_096));
    assert_eq!(h.devices[0].serial, None);
    assert_eq!(
        h.devices[0].absent.get("serial"),
        Some(&Absent::NoPermission)
    );
    assert_eq!(stats.records, 21);
    assert_eq!(stats.skipped_unknown, 0);
    assert!(!stats.is_truncated());

    let s = samples(&records);
    assert_eq!(s.len(), 20);
    let first = s[0];
    assert_eq!((first.device, first.time_ms), (0, T0));
    assert_eq!(first.power_w, Some(655.4));
    assert_eq!(first.sm_clock_mhz, Some(1980));
    assert_eq!(first.fan_pct, None);
    assert_eq!(first.why_absent("fan_pct"), Some(&Absent::NotSupported));
    assert_eq!(first.pcie_rx_bytes_per_s, None);
    assert_eq!(
        first.why_absent("pcie_rx_bytes_per_s"),
        Some(&Absent::NotYetRead)
    );
    assert_eq!(first.processes, None);
    let busy = s[2];
    assert_eq!(
        busy.throttle_reason_names,
        Some(vec!["sw_power_cap".into()])
    );
    assert_eq!(busy.processes.as_ref().map(Vec::len), Some(1));

    let e = events(&records);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].device, Some(0));
    assert_eq!(e[0].kind, EventKind::Xid { xid: 31 });
}

#[test]
fn fixture_ecc_error() {
    let (h, records, _) = recording::read_all(fixture("ecc_error.ndjson")).unwrap();
    assert_eq!(h.devices.len(), 1);
    let s = samples(&records);
    assert_eq!(s.len(), 6);
    assert_eq!(s[0].ecc_uncorrected_volatile, Some(0));
    let last = s[s.len() - 1];
    assert_eq!(last.device, 0);
    assert_eq!(last.ecc_uncorrected_volatile, Some(2));
    assert_eq!(last.remapped_rows_pending, Some(true));
    let e = events(&records);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].kind, EventKind::Xid { xid: 48 });
    assert_eq!(e[0].device, Some(0));
}

#[test]
fn fixture_healthy() {
    let (h, records, stats) = recording::read_all(fixture("healthy.ndjson")).unwrap();
    assert_eq!(h.devices.len(), 1);
    assert_eq!(h.devices[0].persistence_mode, Some(true));
    assert_eq!(h.devices[0].mig_enabled, Some(false));
    assert_eq!(stats.records, 10);
    assert!(events(&records).is_empty());
    for s in samples(&records) {
        assert_eq!(s.throttle_reasons, Some(0));
        assert_eq!(s.ecc_uncorrected_volatile, Some(0));
        assert!(s.gpu_util_pct.unwrap() >= 85.0);
        assert!(s.temp_gpu_c.unwrap() < 60.0);
        assert_eq!((s.pcie_gen, s.pcie_width), (Some(5), Some(16)));
    }
}

// ---- round trips ----

#[test]
fn round_trip_plain_and_gzip_files() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["rec.ndjson", "rec.ndjson.gz"] {
        let path = dir.path().join(name);
        write_file(&path, &every_record());
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), name.ends_with(".gz"));
        let (h, records, stats) = recording::read_all(&path).unwrap();
        assert_eq!(h, header());
        assert_eq!(h.tool_version, gpudiag_model::build_info::LONG_VERSION);
        assert_eq!(records, every_record());
        assert_eq!(stats.records, 6);
        assert!(!stats.is_truncated());
    }
}

#[test]
fn reader_is_an_iterator() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.ndjson");
    write_file(&path, &every_record());
    let reader = RecordingReader::open(&path).unwrap();
    assert_eq!(reader.header().devices.len(), 1);
    let kinds: Vec<&str> = reader.map(|r| r.unwrap().kind()).collect();
    assert_eq!(
        kinds,
        ["event", "sample", "event", "event", "finding", "sample"]
    );
}

#[test]
fn unknown_kinds_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.ndjson");
    let text = format!(
        "{HEADER_LINE}\n\
         {{\"kind\":\"probe_result\",\"probe\":\"bandwidth\",\"h2d_gb_s\":55.5}}\n\
         {{\"kind\":\"sample\",\"time_ms\":{T0},\"device\":0,\"power_w\":120.5}}\n\
         {{\"kind\":\"span\",\"name\":\"matmul\"}}\n\
         {{\"kind\":\"probe_result\",\"probe\":\"matmul\"}}\n"
    );
    std::fs::write(&path, text).unwrap();
    let (_, records, stats) = recording::read_all(&path).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(samples(&records)[0].power_w, Some(120.5));
    assert_eq!(stats.skipped_unknown, 3);
    assert_eq!(
        stats.unknown_kinds.iter().collect::<Vec<_>>(),
        ["probe_result", "span"]
    );
}

// ---- crash leftovers ----

#[test]
fn truncated_last_line_plain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.ndjson");
    write_file(&path, &every_record());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 25);
    std::fs::write(&path, &bytes).unwrap();
    let (_, records, stats) = recording::read_all(&path).unwrap();
    assert_eq!(records, every_record()[..5].to_vec());
    assert!(stats.truncated_last_line);
    assert!(!stats.gzip_unfinished);
    assert!(stats.warnings()[0].contains("cut off"));

    // A replay streams the recording, so it knows of the cut once it reaches it.
    let mut replay = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    while replay.poll().is_ok() {}
    assert!(replay.read_stats().truncated_last_line);
}

#[test]
fn gzip_killed_mid_recording() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.ndjson.gz");
    let mut w = RecordingWriter::create(&path, &header()).unwrap();
    let records = every_record();
    for r in &records[..4] {
        w.write(r).unwrap();
    }
    // What a kill at this moment leaves on disk: every line so far, sync-flushed, no trailer.
    let flushed = std::fs::read(&path).unwrap();
    w.write(&records[4]).unwrap();
    let more = std::fs::read(&path).unwrap();
    drop(w);

    let killed = dir.path().join("killed.ndjson.gz");
    std::fs::write(&killed, &flushed).unwrap();
    let (_, got, stats) = recording::read_all(&killed).unwrap();
    assert_eq!(got, records[..4].to_vec());
    assert!(stats.gzip_unfinished);
    assert!(!stats.truncated_last_line);
    assert!(stats.is_truncated());

    // Killed while the next flush was only partly on disk.
    let cut = flushed.len() + (more.len() - flushed.len()) / 2;
    std::fs::write(&killed, &more[..cut]).unwrap();
    let (_, got, stats) = recording::read_all(&killed).unwrap();
    assert_eq!(got, records[..4].to_vec());
    assert!(stats.is_truncated());
}

// ---- versions and things that are not recordings ----

#[test]
fn future_version_is_refused_with_advice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v9.ndjson");
    let text = HEADER_LINE.replace("\"version\":1", "\"version\":9")
        + "\n{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}\n";
    std::fs::write(&path, text).unwrap();
    let err = recording::read_all(&path).unwrap_err();
    match &err {
        RecordingError::UnsupportedVersion { found, supported } => {
            assert_eq!(*found, 9);
            assert_eq!(*supported, RECORDING_VERSION);
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
    assert!(err.to_string().contains("upgrade gpudiag"), "{err}");
    let err = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Recording(RecordingError::UnsupportedVersion { .. })
        ),
        "{err:?}"
    );
}

#[test]
fn not_a_recording() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8]); 4] = [
        ("empty.ndjson", b""),
        ("notes.txt", b"Lorem ipsum dolor sit amet\nconsectetur\n"),
        (
            "other.json",
            b"{\"format\":\"chrome-trace\",\"version\":1}\n",
        ),
        (
            "binary.bin",
            &[0x7f, b'E', b'L', b'F', 0, 1, 2, 0xff, 0xfe, b'\n'],
        ),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = recording::read_all(&path).unwrap_err();
        assert!(
            matches!(err, RecordingError::NotARecording { .. }),
            "{name}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(name) && msg.contains("not a gpudiag recording"),
            "{msg}"
        );
    }
}

// ---- hostile input ----

#[test]
fn twenty_mib_line_is_skipped_not_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.ndjson");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "{HEADER_LINE}").unwrap();
    let chunk = vec![b'7'; 1024 * 1024];
    f.write_all(b"{\"kind\":\"sample\",\"time_ms\":").unwrap();
    for _ in 0..20 {
        f.write_all(&chunk).unwrap();
    }
    f.write_all(b",\"device\":0}\n").unwrap();
    writeln!(f, "{{\"kind\":\"sample\",\"time_ms\":{T0},\"device\":0}}").unwrap();
    drop(f);
    let (_, records, stats) = recording::read_all(&path).unwrap();
    assert_eq!(records, vec![Record::Sample(Sample::new(0, T0))]);
    assert_eq!(stats.malformed_lines, 1);
    let first = stats.first_malformed.unwrap();
    assert_eq!(first.line, 2);
    assert_eq!(
        first.reason,
        format!("longer than the limit of {MAX_LINE_BYTES} bytes")
    );

    // As the first line, the file simply is not a recording.
    let path = dir.path().join("huge_first.ndjson");
    let mut f = std::fs::File::create(&path).unwrap();
    for _ in 0..20 {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    let err = recording::read_all(&path).unwrap_err();
    assert!(
        matches!(err, RecordingError::NotARecording { .. }),
        "{err:?}"
    );
}

#[test]
fn invalid_utf8_line_is_skipped_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.ndjson");
    let mut bytes =
        format!("{HEADER_LINE}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n").into_bytes();
    bytes.extend_from_slice(
        b"{\"kind\":\"event\",\"time_ms\":2,\"event\":\"notice\",\"message\":\"caf\xe9\"}\n",
    );
    std::fs::write(&path, bytes).unwrap();
    let (_, records, stats) = recording::read_all(&path).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(stats.malformed_lines, 1);
    assert_eq!(stats.first_malformed.map(|b| b.line), Some(3));
}

#[test]
fn malformed_line_is_skipped_and_the_replay_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.ndjson");
    let text = format!(
        "{HEADER_LINE}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n{{\"kind\":\"sample\",,}}\n\
         {{\"kind\":\"sample\",\"time_ms\":2,\"device\":0}}\n"
    );
    std::fs::write(&path, text).unwrap();
    let (_, records, stats) = recording::read_all(&path).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(stats.first_malformed.clone().map(|b| b.line), Some(3));
    let mut replay = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    while replay.poll().is_ok() {}
    let warnings = replay.source_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("skipped 1 malformed line (first at line 3: malformed JSON"),
        "{warnings:?}"
    );
}

// ---- replay ----

#[test]
fn replay_groups_ticks_by_time() {
    let mut r = ReplayBackend::open(fixture("two_gpus.ndjson"), Pace::AsFastAsPossible).unwrap();
    assert_eq!(r.name(), "replay");
    assert_eq!(r.pacing(), Pacing::SelfPaced);
    assert_eq!(r.devices().len(), 2);
    assert_eq!(r.host().hostname.as_deref(), Some("gpu-node-07"));
    assert_eq!(span(&r), (T0, T0, T0 + 9000));
    let mut ticks = Vec::new();
    loop {
        match r.poll() {
            Ok(t) => ticks.push(t),
            Err(BackendError::EndOfRecording) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ticks.len(), 10);
    for (i, t) in ticks.iter().enumerate() {
        let ids: Vec<(u32, u64)> = t.samples.iter().map(|s| (s.device, s.time_ms)).collect();
        let time = T0 + 1000 * i as u64;
        assert_eq!(ids, [(0, time), (1, time)], "tick {i}");
        // The XID was recorded just before the ninth tick's samples.
        let xids: Vec<&EventKind> = t.events.iter().map(|e| &e.kind).collect();
        if i == 8 {
            assert_eq!(xids, [&EventKind::Xid { xid: 31 }]);
        } else {
            assert!(xids.is_empty(), "tick {i}: {xids:?}");
        }
    }
    assert_eq!(ticks[8].samples[0].gpu_util_pct, Some(0.0));
    assert!(matches!(r.poll(), Err(BackendError::EndOfRecording)));
    assert_eq!(span(&r), (T0 + 9000, T0, T0 + 9000));
    assert!(r.recorded_findings().is_empty());
}

#[test]
fn replay_exposes_recorded_findings_and_reads_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.ndjson.gz");
    write_file(&path, &every_record());
    let mut r = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    assert!(r.read_stats().gzip);
    assert_eq!(r.recorded_findings().len(), 1);
    assert_eq!(r.recorded_findings()[0].id, "errors.xid");
    // Notice before the first sample; XID and device-lost between the samples at T0 and T0+500.
    let t = r.poll().unwrap();
    assert_eq!(t.samples.len(), 1);
    assert_eq!(t.events.len(), 1);
    let t = r.poll().unwrap();
    assert_eq!(t.samples[0].time_ms, T0 + 500);
    assert_eq!(t.events.len(), 2);
    assert!(matches!(r.poll(), Err(BackendError::EndOfRecording)));
}

#[test]
fn replay_at_recorded_speed_takes_the_recorded_time() {
    // 9 s recorded at speed 100 is at least 90 ms.
    let mut r =
        ReplayBackend::open(fixture("two_gpus.ndjson"), Pace::Recorded { speed: 100.0 }).unwrap();
    let start = Instant::now();
    let mut n = 0;
    while r.poll().is_ok() {
        n += 1;
    }
    let elapsed = start.elapsed();
    assert_eq!(n, 10);
    assert!(elapsed >= Duration::from_millis(90), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(9), "{elapsed:?}");
}

#[test]
fn replay_seek() {
    let mut r = ReplayBackend::open(fixture("ecc_error.ndjson"), Pace::AsFastAsPossible).unwrap();
    r.seek_to(T0 + 2500).unwrap();
    let t = r.poll().unwrap();
    assert_eq!(t.samples[0].time_ms, T0 + 3000);
    assert_eq!(t.samples[0].ecc_uncorrected_volatile, Some(2));
    assert_eq!(t.events[0].kind, EventKind::Xid { xid: 48 });
    assert_eq!(span(&r), (T0 + 3000, T0, T0 + 5000));
}

#[test]
fn replay_of_a_missing_file_names_it() {
    let err = ReplayBackend::open("/nonexistent/rec.ndjson", Pace::AsFastAsPossible).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Recording(RecordingError::Io { op: "open", .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("/nonexistent/rec.ndjson"), "{err}");
}

/// What `run --kernels --record` writes: each summary comes back on replay with a tick, and one
/// from a crafted file is held to the aggregate's bounds.
#[test]
fn kernels_summaries_come_back_on_replay_bounded() {
    use gpudiag_model::kernels::{KernelsSummary, RecordedKernels};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.ndjson");
    let mut w = RecordingWriter::create(&path, &header()).unwrap();
    let written = RecordedKernels {
        time_ms: T0 + 1_500,
        ended: false,
        summary: KernelsSummary::not_recorded("the collector loaded in no process"),
    };
    for i in 0..3u64 {
        w.write(&Record::Sample(Sample::new(0, T0 + i * 1000)))
            .unwrap();
        if i == 1 {
            w.write(&Record::Kernels(written.clone())).unwrap();
        }
    }
    w.finish().unwrap();
    // A crafted summary: 40 GPUs, each with a kernel name of 20,000 characters.
    let kernel = serde_json::json!({
        "name": "k".repeat(20_000), "short_name": "k", "count": 1, "total_s": 0.1,
        "mean_us": 1.0, "share_of_busy": 0.5, "grid": [1, 1, 1], "block": [1, 1, 1],
        "configs_vary": false, "registers_per_thread": 8, "shared_memory_bytes": 0,
        "in_graphs": 0, "nccl": false
    });
    let gpu = serde_json::json!({
        "uuid": "GPU-1", "index": null, "only_as": null, "pids": [1], "start_unix_ns": 0,
        "end_unix_ns": 1, "time": {"span_s": 1.0, "compute_s": 0.5, "nccl_s": 0.0,
        "copy_s": 0.0, "idle_s": 0.5}, "kernels": 1, "kernels_per_s": 1.0,
        "mean_kernel_us": 1.0, "top_kernels": [kernel], "other_kernels": {"count": 0,
        "total_s": 0.0, "names": 0, "past_name_cap": 0}, "copies": [],
        "sets": {"count": 0, "bytes": 0, "total_s": 0.0}
    });
    let crafted = serde_json::json!({
        "kind": "kernels", "time_ms": T0 + 2_500, "ended": true,
        "summary": {"not_recorded": null, "gpus": vec![gpu; 40], "processes": [],
            "nccl_laggard": null, "left_out": []}
    });
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(f, "{crafted}").unwrap();
    writeln!(
        f,
        "{}",
        serde_json::to_string(&Record::Sample(Sample::new(0, T0 + 3_000))).unwrap()
    )
    .unwrap();
    drop(f);

    let mut replay = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    let mut got = Vec::new();
    while let Ok(t) = replay.poll() {
        got.push((t.time_ms(), t.kernels.map(|k| *k)));
    }
    // The replay reads a record past a tick to know the tick is whole: a summary comes with
    // the tick being read when it was.
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].1, None);
    assert_eq!(got[1], (Some(T0 + 1_000), Some(written)));
    assert_eq!(got[3].1, None);
    let last = got[2].1.as_ref().expect("the crafted summary");
    assert!(last.ended);
    assert_eq!(last.summary.gpus.len(), 32);
    let name = &last.summary.gpus[0].top_kernels[0].name;
    assert_eq!(name.chars().count(), 8_193, "cut, with an ellipsis");
}

/// A crafted summary whose figures gpudiag's aggregate could never write (a part of the GPU's
/// time 100 times its span, a negative time, a share of 5) is a malformed line, skipped and
/// counted: it printed "copies take 10000% of the GPU's 1.0 s" and set the GPU's verdict.
#[test]
fn kernels_summaries_with_impossible_figures_are_skipped() {
    use gpudiag_telemetry::recording::RecordingReader;
    let gpu = |time: serde_json::Value, share: f64| {
        serde_json::json!({
            "uuid": "GPU-1", "index": null, "only_as": null, "pids": [1], "start_unix_ns": 0,
            "end_unix_ns": 1, "time": time, "kernels": 1, "kernels_per_s": 1.0,
            "mean_kernel_us": 1.0, "top_kernels": [{
                "name": "k", "short_name": "k", "count": 1, "total_s": 0.1, "mean_us": 1.0,
                "share_of_busy": share, "grid": [1, 1, 1], "block": [1, 1, 1],
                "configs_vary": false, "registers_per_thread": 8, "shared_memory_bytes": 0,
                "in_graphs": 0, "nccl": false
            }], "other_kernels": {"count": 0, "total_s": 0.0, "names": 0, "past_name_cap": 0},
            "copies": [], "sets": {"count": 0, "bytes": 0, "total_s": 0.0}
        })
    };
    let sane = serde_json::json!({"span_s": 1.0, "compute_s": 0.5, "nccl_s": 0.0,
        "copy_s": 0.0, "idle_s": 0.5});
    let cases = [
        (gpu(sane.clone(), 0.5), None),
        (
            gpu(
                serde_json::json!({"span_s": 1.0, "compute_s": 100.0, "nccl_s": 0.0,
                    "copy_s": 100.0, "idle_s": 0.0}),
                0.5,
            ),
            Some("longer than its span"),
        ),
        (
            gpu(
                serde_json::json!({"span_s": 1.0, "compute_s": -5.0, "nccl_s": 0.0,
                    "copy_s": 0.0, "idle_s": 0.5}),
                0.5,
            ),
            Some("negative"),
        ),
        (gpu(sane, 5.0), Some("share_of_busy is 5")),
    ];
    for (gpu, why) in cases {
        let line = serde_json::json!({
            "kind": "kernels", "time_ms": T0, "ended": true,
            "summary": {"not_recorded": null, "gpus": [gpu], "processes": [],
                "nccl_laggard": null, "left_out": []}
        });
        let header = serde_json::to_string(&header()).unwrap();
        let text = format!("{header}\n{line}\n");
        let mut reader = RecordingReader::from_reader(std::io::Cursor::new(text)).unwrap();
        let got = reader.next_record().unwrap();
        let stats = reader.stats();
        match why {
            None => {
                assert!(matches!(got, Some(Record::Kernels(_))), "{got:?}");
                assert_eq!(stats.malformed_lines, 0);
            }
            Some(why) => {
                assert!(got.is_none(), "{got:?}");
                assert_eq!(stats.malformed_lines, 1);
                let reason = &stats.first_malformed.as_ref().unwrap().reason;
                assert!(reason.contains(why), "{reason}");
            }
        }
    }
}
