//! Where a replay's input comes from and how it is read: pipes, FIFOs and stdin (read once, never
//! opened twice), bundles packed by hand (re-tarred, with hostile paths, with two recordings,
//! inflating past their limit), and streaming, so that nothing holds a whole recording and seeks
//! still land on the right tick in plain, gzip and bundled recordings.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gpudiag_core::check::CheckReport;
use gpudiag_model::sample::{DeviceInfo, Event, EventKind, HostInfo, Sample};
use gpudiag_telemetry::recording::{Header, Record, RecordingWriter};
use gpudiag_telemetry::replay::{Pace, ReplayBackend, ReplayOptions};
use gpudiag_telemetry::{Backend, BackendError, Tick};

use crate::support::{self, Run, fixture, s};

const T0: u64 = 1_767_225_600_000;

/// Where a replay stands, as (current, start, end).
fn span(r: &ReplayBackend) -> (u64, u64, u64) {
    let p = r.position();
    (p.current_ms, p.start_ms, p.end_ms)
}

/// `gpudiag ARGS`, given two minutes, with `stdin` fed through a pipe (the case a shell's
/// `cat rec |` makes).
fn gpudiag(args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut cmd = support::gpudiag();
    cmd.args(args).timeout(std::time::Duration::from_secs(120));
    if let Some(bytes) = stdin {
        cmd.write_stdin(bytes.to_vec());
    }
    Run::of(&mut cmd)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// A tar member: path, type flag (`b'0'` a file, `b'2'` a symlink, `b'5'` a directory), data.
type Member<'a> = (&'a str, u8, &'a [u8]);

/// A tick as two replays are compared on: its samples' devices and times, its XIDs.
type TickSummary = (Vec<(u32, u64)>, Vec<u64>);

/// A tar.gz of `members` with the paths written exactly as given, as
/// `tar czf` or a hostile tool would (the tar crate's builder refuses `..` and strips `./`).
fn tar_gz(members: &[Member]) -> Vec<u8> {
    let mut tar = Vec::new();
    for &(path, kind, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::new(kind));
        assert!(path.len() <= 100, "{path}");
        h.as_mut_bytes()[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(data);
        tar.resize(tar.len().div_ceil(512) * 512, 0);
    }
    tar.resize(tar.len() + 1024, 0);
    gzip(&tar)
}

/// The parts of a report a replay must reproduce whatever its input.
fn gist(r: &CheckReport) -> (u64, Option<u64>, Option<u64>, Vec<String>, i32) {
    let mut ids: Vec<String> = r
        .devices
        .iter()
        .flat_map(|d| d.findings.iter())
        .chain(&r.host_findings)
        .map(|f| format!("{}@{:?} recorded={}", f.id, f.device, f.recorded))
        .collect();
    ids.sort();
    (
        r.window.ticks,
        r.window.start_ms,
        r.window.end_ms,
        ids,
        r.exit_code,
    )
}

fn check_file(path: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["check", "--json", "--replay", s(path)];
    args.extend_from_slice(extra);
    gpudiag(&args, None)
}

// ---- pipes, stdin and FIFOs ----

#[test]
fn check_reads_a_recording_piped_to_stdin_plain_and_gzip() {
    for name in ["ecc_error.ndjson", "all_kinds.ndjson", "two_gpus.ndjson"] {
        let path = fixture(name);
        let expected = check_file(&path, &[]);
        let plain = std::fs::read(&path).unwrap();
        for bytes in [plain.clone(), gzip(&plain)] {
            for arg in ["-", "/dev/stdin"] {
                let run = gpudiag(&["check", "--json", "--replay", arg], Some(&bytes));
                assert_eq!(run.code, expected.code, "{name} {arg}: {}", run.stderr);
                let (got, want) = (run.report(), expected.report());
                assert_eq!(gist(&got), gist(&want), "{name} {arg}");
                assert_eq!(got.source.warnings, want.source.warnings, "{name} {arg}");
            }
        }
        let run = gpudiag(&["check", "--json", "--replay", "-"], Some(&plain));
        assert_eq!(run.report().source.recording.as_deref(), Some("stdin"));
    }
}

#[test]
fn findings_a_piped_recording_carries_are_reported() {
    let text = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let finding = serde_json::json!({"kind": "finding", "id": "probes.p2p", "severity": "warn",
        "device": 0, "time_ms": T0 + 4000, "title": "peer copies go through host memory",
        "evidence": {"values": {}, "window_s": 0.0, "threshold": "peer access"},
        "advice": "check the topology"});
    lines.insert(5, finding.to_string());
    let bytes = (lines.join("\n") + "\n").into_bytes();
    for extra in [&[][..], &["--window", "3s"][..]] {
        let mut args = vec!["check", "--json", "--replay", "-"];
        args.extend_from_slice(extra);
        let run = gpudiag(&args, Some(&bytes));
        assert_eq!(run.code, 0, "{}", run.stderr);
        let report = run.report();
        let carried: Vec<&str> = report.devices[0]
            .findings
            .iter()
            .filter(|f| f.recorded)
            .map(|f| f.id.as_str())
            .collect();
        // The window (the last 3 s) starts after the finding's time.
        let want: &[&str] = if extra.is_empty() {
            &["probes.p2p"]
        } else {
            &[]
        };
        assert_eq!(carried, want, "{extra:?}");
    }
}

#[test]
fn check_with_a_window_reads_the_same_from_a_pipe_as_from_the_file() {
    let path = fixture("two_gpus.ndjson");
    let bytes = std::fs::read(&path).unwrap();
    for window in ["0", "3s", "1h"] {
        let file = check_file(&path, &["--window", window]);
        let pipe = gpudiag(
            &["check", "--json", "--replay", "-", "--window", window],
            Some(&bytes),
        );
        assert_eq!(pipe.code, file.code, "{window}: {}", pipe.stderr);
        let (a, b) = (pipe.report(), file.report());
        assert_eq!(gist(&a), gist(&b), "{window}");
        for (x, y) in a.devices.iter().zip(&b.devices) {
            assert_eq!(x.summary, y.summary, "{window}");
        }
    }
}

#[test]
fn check_reads_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("rec.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let path = fixture("ecc_error.ndjson");
    let expected = check_file(&path, &[]);
    for bytes in [
        std::fs::read(&path).unwrap(),
        gzip(&std::fs::read(&path).unwrap()),
    ] {
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                // Opening for writing waits for gpudiag to open it for reading.
                let mut f = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
                f.write_all(&bytes).unwrap();
            })
        };
        let run = check_file(&fifo, &[]);
        writer.join().unwrap();
        assert_eq!(run.code, expected.code, "{}", run.stderr);
        assert_eq!(gist(&run.report()), gist(&expected.report()));
    }
}

#[test]
fn a_piped_file_that_is_not_a_recording_is_still_exit_2() {
    let run = gpudiag(
        &["check", "--replay", "-"],
        Some(b"time,util\n1,99\n".as_slice()),
    );
    let line = run.one_line_error(2);
    assert!(line.contains("stdin is not a gpudiag recording"), "{line}");
    let run = gpudiag(&["check", "--replay", "-"], Some(b"".as_slice()));
    assert!(run.one_line_error(2).contains("empty"));
}

// ---- bundles ----

fn recording_gz(name: &str) -> Vec<u8> {
    gzip(&std::fs::read(fixture(name)).unwrap())
}

#[test]
fn retarred_bundles_are_read_from_a_file_and_a_pipe() {
    let rec = recording_gz("ecc_error.ndjson");
    let expected = check_file(&fixture("ecc_error.ndjson"), &[]);
    let dir = tempfile::tempdir().unwrap();
    let layouts: [Vec<Member>; 4] = [
        vec![("recording.ndjson.gz", b'0', &rec)],
        // `tar czf x.tar.gz -C extracted .`
        vec![
            ("./", b'5', b""),
            ("./README.md", b'0', b"hello"),
            ("./recording.ndjson.gz", b'0', &rec),
        ],
        // `tar czf x.tar.gz extracted`
        vec![
            ("report-1/", b'5', b""),
            ("report-1/README.md", b'0', b"hello"),
            ("report-1/recording.ndjson.gz", b'0', &rec),
        ],
        // `tar czf x.tar.gz ./extracted`
        vec![
            ("./report-1/", b'5', b""),
            ("./report-1/recording.ndjson.gz", b'0', &rec),
        ],
    ];
    for members in &layouts {
        let bundle = tar_gz(members);
        let path = dir.path().join("bundle.tar.gz");
        std::fs::write(&path, &bundle).unwrap();
        for run in [
            check_file(&path, &[]),
            gpudiag(&["check", "--json", "--replay", "-"], Some(&bundle)),
        ] {
            assert_eq!(
                run.code, expected.code,
                "{:?}: {}",
                members[0].0, run.stderr
            );
            assert_eq!(gist(&run.report()), gist(&expected.report()));
        }
    }
}

#[test]
fn hostile_or_ambiguous_bundles_are_refused_clearly() {
    let rec = recording_gz("healthy.ndjson");
    let dir = tempfile::tempdir().unwrap();
    let cases: [(Vec<Member>, &str); 7] = [
        (
            vec![("../recording.ndjson.gz", b'0', &rec)],
            "\"../recording.ndjson.gz\", an absolute path or one that climbs out",
        ),
        (
            vec![("/tmp/recording.ndjson.gz", b'0', &rec)],
            "an absolute path or one that climbs out",
        ),
        (
            vec![
                ("../../etc/cron.d/x", b'0', b"* * * * * root sh"),
                ("recording.ndjson.gz", b'0', &rec),
            ],
            "\"../../etc/cron.d/x\"",
        ),
        (
            vec![
                ("recording.ndjson.gz", b'0', &rec),
                ("./other/recording.ndjson.gz", b'0', &rec),
            ],
            "more than one recording (\"recording.ndjson.gz\" and \
             \"./other/recording.ndjson.gz\")",
        ),
        (
            vec![
                ("a/recording.ndjson.gz", b'0', &rec),
                ("b/recording.ndjson.gz", b'0', &rec),
            ],
            "which one to read is ambiguous",
        ),
        (
            vec![("recording.ndjson.gz", b'2', b"")],
            "is a link or a directory, not a recording",
        ),
        (
            vec![("a/b/recording.ndjson.gz", b'0', &rec)],
            "lies deeper than gpudiag looks",
        ),
    ];
    for (members, expected) in &cases {
        let path = dir.path().join("bundle.tar.gz");
        std::fs::write(&path, tar_gz(members)).unwrap();
        let run = check_file(&path, &[]);
        let line = run.one_line_error(2);
        assert!(line.contains(expected), "{members:?}: {line}");
        assert!(line.contains(s(&path)), "{line}");
    }
    // From a pipe the archive is read once, so what comes after the recording is not seen; what
    // comes before it is refused the same way.
    let run = gpudiag(&["check", "--replay", "-"], Some(&tar_gz(&cases[2].0)));
    assert!(run.one_line_error(2).contains("\"../../etc/cron.d/x\""));
}

#[test]
fn a_bundle_inflating_past_its_limit_is_exit_2_unless_the_limit_is_raised() {
    // About 1 MB of samples, a few kilobytes packed.
    let text = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut plain = format!("{}\n", lines[0]);
    let sample: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    for i in 0..1000u64 {
        let mut s = sample.clone();
        s["time_ms"] = (T0 + i * 250).into();
        plain.push_str(&s.to_string());
        plain.push('\n');
    }
    assert!(plain.len() > 1 << 20);
    let bundle = tar_gz(&[("recording.ndjson.gz", b'0', &gzip(plain.as_bytes()))]);
    assert!(bundle.len() < 64 * 1024, "{}", bundle.len());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.tar.gz");
    std::fs::write(&path, &bundle).unwrap();

    let limit = ["--max-inflated-size", "512KiB"];
    let line = check_file(&path, &limit).one_line_error(2).to_owned();
    assert!(
        line.contains("inflates to more than 524288 bytes (512 KiB)"),
        "{line}"
    );
    assert!(line.contains("--max-inflated-size"), "{line}");
    let piped = gpudiag(
        &["check", "--replay", "-", limit[0], limit[1]],
        Some(&bundle),
    );
    assert!(piped.one_line_error(2).contains("inflates to more than"));

    let run = check_file(&path, &["--max-inflated-size", "2MiB"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.report().window.ticks, 1000);
    // The default (4 GiB) reads it too.
    assert_eq!(check_file(&path, &[]).code, 0);

    let help = gpudiag(&["check", "--help"], None);
    assert!(
        help.stdout.contains("--max-inflated-size <SIZE>"),
        "{}",
        help.stdout
    );
    assert!(help.stdout.contains("[default: 4GiB]"), "{}", help.stdout);
    let bad = gpudiag(
        &["check", "--replay", s(&path), "--max-inflated-size", "lots"],
        None,
    );
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("'lots'"), "{}", bad.stderr);
}

/// A header and then millions of blank lines: a few kilobytes gzipped or bundled, which a
/// replay once read to the end (a minute and more at a gigabyte) before it said "no telemetry
/// samples". Every form stops at the same line, about a million in, and says why (exit 2).
#[test]
fn a_recording_of_blank_lines_stops_early_in_every_form() {
    const BLANK: usize = 3 << 20;
    let header = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let header = header.lines().next().unwrap();
    let mut plain = format!("{header}\n").into_bytes();
    plain.resize(plain.len() + BLANK, b'\n');
    let gz = gzip(&plain);
    let bundle = tar_gz(&[("recording.ndjson.gz", b'0', &gz)]);
    assert!(bundle.len() < 64 * 1024, "{}", bundle.len());
    let dir = tempfile::tempdir().unwrap();
    // The line after the budget of 2^20 lines owed, the header being line 1.
    let stop = format!("line {}: stopped reading: ", (1u64 << 20) + 2);
    for (name, bytes) in [
        ("blank.ndjson", &plain),
        ("blank.ndjson.gz", &gz),
        ("blank.tar.gz", &bundle),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let run = check_file(&path, &[]);
        let line = run.one_line_error(2);
        assert!(line.contains(&stop), "{name}: {line}");
        assert!(
            line.contains("blank, malformed or of unknown kinds"),
            "{line}"
        );
        assert!(line.contains(s(&path)), "{line}");
        let piped = gpudiag(&["check", "--replay", "-"], Some(bytes));
        assert!(piped.one_line_error(2).contains(&stop), "{name} piped");
    }
}

// ---- streaming ----

/// A recording made up as it is read, far longer than any test reads of it: a header, then one
/// sample per 100 ms for a million ticks (about 70 MB). Counts the bytes handed out.
struct Endless {
    pending: Vec<u8>,
    next: u64,
    served: Arc<AtomicU64>,
}

const ENDLESS_TICKS: u64 = 1_000_000;

impl Endless {
    fn new(served: Arc<AtomicU64>) -> Self {
        let header = r#"{"format":"gpudiag-recording","version":1,"kind":"header","created_ms":1767225600000,"tool_version":"0.1.0","backend":"nvml","interval_ms":100,"host":{},"devices":[{"index":0}]}"#;
        Endless {
            pending: format!("{header}\n").into_bytes(),
            next: 0,
            served,
        }
    }
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.len() < buf.len() && self.next < ENDLESS_TICKS {
            let line = format!(
                "{{\"kind\":\"sample\",\"time_ms\":{},\"device\":0,\"gpu_util_pct\":50.0}}\n",
                T0 + self.next * 100
            );
            self.next += 1;
            self.pending.extend_from_slice(line.as_bytes());
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        self.served.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

#[test]
fn a_replay_reads_its_input_only_as_far_as_it_plays() {
    let served = Arc::new(AtomicU64::new(0));
    let mut r =
        ReplayBackend::from_reader(Endless::new(served.clone()), Pace::AsFastAsPossible).unwrap();
    for i in 0..1000u64 {
        let t = r.poll().unwrap();
        assert_eq!(t.samples[0].time_ms, T0 + i * 100);
    }
    // A thousand ticks are about 70 kB; what was read beyond them is the read-ahead buffers.
    let read = served.load(Ordering::Relaxed);
    assert!(read < 1 << 20, "{read} bytes read for 1000 ticks");
    let (current, start, end) = span(&r);
    assert_eq!((current, start), (T0 + 999 * 100, T0));
    assert!(end >= current);
    // A stream goes forwards only.
    r.seek_to(T0 + 5000 * 100).unwrap();
    assert_eq!(r.poll().unwrap().samples[0].time_ms, T0 + 5000 * 100);
    assert!(!r.can_seek_back());
    assert!(matches!(
        r.seek_to(T0),
        Err(BackendError::Unavailable(m)) if m.contains("cannot seek backwards")
    ));
    assert_eq!(r.poll().unwrap().samples[0].time_ms, T0 + 5001 * 100);
}

#[test]
fn a_recording_written_live_into_a_pipe_replays_as_it_arrives() {
    for gzip in [false, true] {
        let (rx, tx) = std::io::pipe().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            let mut w = RecordingWriter::from_writer(tx, gzip, &header()).unwrap();
            for i in 0..3 {
                w.write(&Record::Sample(Sample::new(0, T0 + i * 100)))
                    .unwrap();
            }
            // The recorder is still running: the pipe stays open until the test is done.
            let _ = done_rx.recv();
            w.finish().unwrap();
        });
        // Guards against a hang (reading to the end first would never return).
        let (got_tx, got_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut r = ReplayBackend::from_reader(rx, Pace::AsFastAsPossible).unwrap();
            let ticks: Vec<u64> = (0..2)
                .map(|_| r.poll().unwrap().samples[0].time_ms)
                .collect();
            let _ = got_tx.send(ticks);
            // The last tick once the recorder stops.
            r.poll().map(|t| t.samples[0].time_ms).ok()
        });
        let ticks = got_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("gzip {gzip}: no tick while the pipe was open"));
        assert_eq!(ticks, [T0, T0 + 100], "gzip {gzip}");
        done_tx.send(()).unwrap();
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), Some(T0 + 200), "gzip {gzip}");
    }
}

fn header() -> Header {
    let mut h = Header::new(
        "nvml",
        HostInfo::default(),
        vec![
            DeviceInfo {
                index: 0,
                ..DeviceInfo::default()
            },
            DeviceInfo {
                index: 1,
                ..DeviceInfo::default()
            },
        ],
        Some(100),
    );
    h.created_ms = T0 - 10;
    h
}

/// `n` ticks of two GPUs 100 ms apart, with an XID before every 7th tick's samples.
fn long_recording(n: u64) -> Vec<Record> {
    let mut out = Vec::new();
    for i in 0..n {
        let t = T0 + i * 100;
        if i.is_multiple_of(7) {
            out.push(Record::Event(Event {
                time_ms: t - 5,
                device: Some(0),
                kind: EventKind::Xid { xid: i },
            }));
        }
        for d in 0..2 {
            let mut s = Sample::new(d, t);
            s.gpu_util_pct = Some((i % 100) as f64);
            out.push(Record::Sample(s));
        }
    }
    out
}

fn write(path: &Path, records: &[Record]) {
    let mut w = RecordingWriter::create(path, &header()).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
}

fn summary(t: &Tick) -> TickSummary {
    (
        t.samples.iter().map(|s| (s.device, s.time_ms)).collect(),
        t.events
            .iter()
            .map(|e| match e.kind {
                EventKind::Xid { xid } => xid,
                _ => u64::MAX,
            })
            .collect(),
    )
}

#[test]
fn seeks_land_on_the_same_tick_in_plain_gzip_and_bundled_recordings() {
    // More ticks than the seek index keeps points, so seeks start between them.
    let n = 5_000;
    let records = long_recording(n);
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("long.ndjson");
    let gz = dir.path().join("long.ndjson.gz");
    write(&plain, &records);
    write(&gz, &records);
    let bundle = dir.path().join("long.tar.gz");
    std::fs::write(
        &bundle,
        tar_gz(&[("r/recording.ndjson.gz", b'0', &std::fs::read(&gz).unwrap())]),
    )
    .unwrap();
    let expected = |target: u64| -> Option<TickSummary> {
        let i = target.saturating_sub(T0).div_ceil(100);
        (i < n).then(|| {
            let t = T0 + i * 100;
            let events = if i.is_multiple_of(7) {
                vec![i]
            } else {
                Vec::new()
            };
            (vec![(0, t), (1, t)], events)
        })
    };
    let targets = [
        T0 + 250_000,
        T0 + 3,
        T0 + 499_950,
        T0 + 123_456,
        T0 + 123_400,
        0,
        T0 + 350_007,
        T0 + 5_000_000,
        T0 + 42_000,
    ];
    for path in [&plain, &gz, &bundle] {
        let mut r = ReplayBackend::open(path, Pace::AsFastAsPossible).unwrap();
        assert_eq!(r.tick_count(), n);
        assert_eq!(span(&r), (T0, T0, T0 + (n - 1) * 100));
        for &target in &targets {
            r.seek_to(target).unwrap();
            let got = r.poll().ok().map(|t| summary(&t));
            assert_eq!(got, expected(target), "{} to {target}", path.display());
            // And the tick after it follows on.
            let next = r.poll().ok().map(|t| summary(&t));
            assert_eq!(next, expected(target.max(T0) + 100), "{}", path.display());
        }
        assert!(r.source_warnings().is_empty(), "{:?}", r.source_warnings());
    }
}

#[test]
fn the_demo_seeks_both_ways() {
    let mut r = ReplayBackend::from_seekable(
        std::io::Cursor::new(gpudiag_core::session::DEMO_RECORDING),
        "demo",
        Pace::AsFastAsPossible,
        &ReplayOptions::default(),
    )
    .unwrap();
    let (_, start, end) = span(&r);
    assert!(end > start);
    let middle = start + (end - start) / 2;
    r.seek_to(middle).unwrap();
    let t = r.poll().unwrap();
    assert!(t.samples[0].time_ms >= middle);
    r.seek_to(start).unwrap();
    assert_eq!(r.poll().unwrap().samples[0].time_ms, start);
}
