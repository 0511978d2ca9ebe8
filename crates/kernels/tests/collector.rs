//! The collector itself, without a GPU: the embedded shared object is loaded by a small C
//! driver (tests/c/driver.c) as the CUDA driver would load it, against a stand-in libcupti
//! (tests/c/fake_cupti.c) that hands it records laid out as CUPTI's. What it sends goes through
//! the real socket and decoder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc::sync_channel;

use gpudiag_kernels::install::PrivateDir;
use gpudiag_kernels::listen::{Admission, Listener, ListenerReport, Socket};
use gpudiag_kernels::wire::NAME_TABLE_FULL;
use gpudiag_model::kernels::{
    CollectorMessage, CopyDirection, HostMemory, MAX_KERNEL_NAME_BYTES, SyncCall,
};

const HERE: &str = env!("CARGO_MANIFEST_DIR");

struct Harness {
    _build: tempfile::TempDir,
    dir: PrivateDir,
    fake: PathBuf,
    driver: PathBuf,
    collector: PathBuf,
}

fn compile(args: &[&str]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cc} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn harness() -> Harness {
    let build = tempfile::tempdir().unwrap();
    let include = format!("-I{HERE}/collector");
    let fake = build.path().join("libfakecupti.so");
    let driver = build.path().join("driver");
    compile(&[
        "-shared",
        "-fPIC",
        &include,
        "-o",
        fake.to_str().unwrap(),
        &format!("{HERE}/tests/c/fake_cupti.c"),
    ]);
    compile(&[
        &include,
        "-o",
        driver.to_str().unwrap(),
        &format!("{HERE}/tests/c/driver.c"),
        "-ldl",
    ]);
    let dir = PrivateDir::create_in(build.path()).unwrap();
    let collector = dir.install_collector().unwrap();
    Harness {
        _build: build,
        dir,
        fake,
        driver,
        collector,
    }
}

struct Run {
    output: Output,
    messages: Vec<CollectorMessage>,
    report: ListenerReport,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
}

impl Harness {
    /// Runs the driver with the socket listening; `env` adds to (or with an empty value,
    /// removes from) what it gets.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let socket_path = self.dir.path().join("collector.sock");
        let _ = std::fs::remove_file(&socket_path);
        let socket = Socket::bind(&socket_path).unwrap();
        let (tx, rx) = sync_channel(10_000);
        let me = std::process::id();
        let admission = Admission {
            roots: vec![me],
            excluded: Some(me),
        };
        let listener = Listener::start(socket, admission, tx, 64).unwrap();
        let mut command = Command::new(&self.driver);
        command
            .arg(&self.collector)
            .args(args)
            .env("GPUDIAG_KERNELS_SOCKET", &socket_path)
            .env("GPUDIAG_CUPTI", &self.fake)
            .env_remove("FAKE_CUPTI_VERSION");
        for (k, v) in env {
            if v.is_empty() {
                command.env_remove(k);
            } else {
                command.env(k, v);
            }
        }
        let output = command.output().unwrap();
        let report = listener.stop();
        Run {
            output,
            messages: rx.try_iter().collect(),
            report,
        }
    }
}

fn kernels(messages: &[CollectorMessage]) -> Vec<&gpudiag_model::kernels::KernelRecord> {
    messages
        .iter()
        .flat_map(|m| match m {
            CollectorMessage::Kernels { records, .. } => records.iter().collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn records_reach_gpudiag_with_every_field_the_collector_reads() {
    let h = harness();
    let run = h.run(&["records", "1000"], &[]);
    assert!(run.output.status.success(), "{run:?}", run = run.output);
    assert!(run.stdout().contains("emitted 1003"), "{}", run.stdout());
    let m = &run.messages;
    let pid = m[0].pid();
    assert!(run.report.connected.contains(&pid));
    let CollectorMessage::Hello(hello) = &m[0] else {
        panic!("first: {:?}", m[0])
    };
    assert_eq!(hello.cupti_api_version, 130001);
    assert_eq!(hello.cupti_source, "GPUDIAG_CUPTI");
    assert_eq!(hello.collector_version, 1);
    assert_eq!(hello.clock.cupti_ns, 5000);
    // No libcuda here: the device is named by its ordinal alone.
    assert!(
        m.iter()
            .any(|x| matches!(x, CollectorMessage::Device { device, .. }
        if device.ordinal == 1 && device.uuid.is_none()))
    );
    let ks = kernels(m);
    assert_eq!(ks.len(), 1000);
    // 1,000 kernels do not fit one 64 KiB message.
    let batches = m
        .iter()
        .filter(|x| matches!(x, CollectorMessage::Kernels { .. }))
        .count();
    assert!(batches >= 2, "{batches}");
    let first = ks[0];
    assert_eq!((first.start_ns, first.end_ns), (1000, 1007));
    assert_eq!((first.device, first.context, first.stream), (1, 3, 7));
    assert_eq!(first.grid, [128, 2, 1]);
    assert_eq!(first.block, [256, 1, 1]);
    assert_eq!(first.registers_per_thread, 40);
    assert_eq!(first.shared_memory_bytes, 3072);
    assert_eq!(first.correlation_id, 1);
    assert_eq!(first.graph_id, None);
    assert_eq!(ks[1].graph_id, Some(9));
    // The 2,999-byte name is cut to the limit and says so.
    assert_eq!(first.name.len(), MAX_KERNEL_NAME_BYTES);
    assert!(first.name.ends_with('…'));
    assert_eq!(&*ks[1].name, "kernel_b");
    assert_eq!(&*ks[2].name, "kernel_a");
    assert_eq!(&*ks[999].name, "kernel_b");
    assert!(ks.iter().all(|k| &*k.name != NAME_TABLE_FULL));
    // Interned: one string per name, shared by its records.
    assert!(std::sync::Arc::ptr_eq(&ks[2].name, &ks[4].name));
    let copies: Vec<_> = m
        .iter()
        .filter_map(|x| match x {
            CollectorMessage::Copies { records, .. } => Some(records),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].direction, CopyDirection::HostToDevice);
    assert_eq!(copies[0].host_memory, HostMemory::Pageable);
    assert_eq!(copies[0].bytes, 4096);
    assert_eq!(copies[0].correlation_id, 77);
    let sets: Vec<_> = m
        .iter()
        .filter_map(|x| match x {
            CollectorMessage::Sets { records, .. } => Some(records),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!((sets[0].bytes, sets[0].correlation_id), (512, 78));
    let syncs: Vec<_> = m
        .iter()
        .filter_map(|x| match x {
            CollectorMessage::Syncs { records, .. } => Some(records),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(syncs[0].call, SyncCall::StreamSynchronize);
    assert_eq!(syncs[0].stream, Some(7));
    assert_eq!(syncs[0].device, Some(1));
    assert_eq!((syncs[0].start_ns, syncs[0].end_ns), (80, 95));
    let losses = m
        .iter()
        .rev()
        .find_map(|x| match x {
            CollectorMessage::Losses { losses, .. } => Some(*losses),
            _ => None,
        })
        .unwrap();
    assert_eq!(losses.cupti_dropped, 2);
    assert_eq!(losses.send_dropped, 0);
    assert_eq!(losses.names_cut, 1);
    assert_eq!(m.last(), Some(&CollectorMessage::Goodbye { pid }));
    assert_eq!(run.report.malformed, 0);
}

#[test]
fn a_cupti_whose_layout_was_not_checked_is_refused() {
    let h = harness();
    let run = h.run(&["init"], &[("FAKE_CUPTI_VERSION", "99")]);
    assert!(run.output.status.success());
    assert!(run.messages.iter().any(|m| matches!(m,
        CollectorMessage::CannotRecord { why, .. } if why.contains("CUPTI API version 99"))));
    assert_eq!(kernels(&run.messages).len(), 0);
    // A first release and an update of the same CUDA version say different numbers; both
    // were checked.
    for version in ["27", "28", "130000", "130001"] {
        let run = h.run(&["records", "3"], &[("FAKE_CUPTI_VERSION", version)]);
        assert_eq!(kernels(&run.messages).len(), 3, "{version}");
    }
}

#[test]
fn without_libcupti_the_collector_says_so_and_the_program_runs() {
    let h = harness();
    let run = h.run(&["init"], &[("GPUDIAG_CUPTI", ""), ("LD_LIBRARY_PATH", "")]);
    assert!(run.output.status.success());
    assert!(run.stdout().contains("init 1"));
    assert!(run.output.stderr.is_empty());
    let CollectorMessage::Hello(hello) = &run.messages[0] else {
        panic!("{:?}", run.messages)
    };
    // A machine with a CUDA toolkit in the loader's cache (a GPU host) has a libcupti to find.
    let cache = Command::new("ldconfig").arg("-p").output();
    let loader_has_one =
        cache.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcupti"));
    if loader_has_one {
        assert_eq!(hello.cupti_source, "loader search");
    } else {
        assert_eq!(hello.cupti_api_version, 0);
        assert!(run.messages.iter().any(|m| matches!(m,
            CollectorMessage::CannotRecord { why, .. } if why.contains("no libcupti"))));
    }
}

#[test]
fn when_gpudiag_goes_away_recording_stops() {
    use std::io::{BufRead, Write};
    let h = harness();
    let socket_path = h.dir.path().join("gone.sock");
    let socket = Socket::bind(&socket_path).unwrap();
    let (tx, rx) = sync_channel(1000);
    let me = std::process::id();
    let admission = Admission {
        roots: vec![me],
        excluded: Some(me),
    };
    let listener = Listener::start(socket, admission, tx, 64).unwrap();
    let mut child = Command::new(&h.driver)
        .arg(&h.collector)
        .arg("gone")
        .env("GPUDIAG_KERNELS_SOCKET", &socket_path)
        .env("GPUDIAG_CUPTI", &h.fake)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "init 1\n");
    // gpudiag ends: its socket and every connection close.
    let report = listener.stop();
    assert_eq!(report.connected.len(), 1);
    assert!(matches!(
        rx.try_iter().next(),
        Some(CollectorMessage::Hello(_))
    ));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(rest, "kernel kind 0\n");
}

#[test]
fn without_gpudiag_the_collector_does_nothing_and_says_nothing() {
    let h = harness();
    for socket in ["", "/nonexistent/gpudiag.sock"] {
        let run = h.run(&["init"], &[("GPUDIAG_KERNELS_SOCKET", socket)]);
        assert!(run.output.status.success());
        assert_eq!(run.stdout(), "init 1\n");
        assert!(run.output.stderr.is_empty());
        assert!(run.messages.is_empty());
        assert!(run.report.connected.is_empty());
    }
}

#[test]
fn it_steps_aside_for_another_cupti_client_and_takes_cupti_back() {
    let h = harness();
    let run = h.run(&["guest"], &[]);
    let out = run.stdout();
    assert!(run.output.status.success(), "{out}");
    // The other client's kinds only while it traces, ours again after.
    assert!(
        out.contains("while aside: kernel kind 1, memcpy kind 0"),
        "{out}"
    );
    assert!(out.contains("after: kernel kind 1, memcpy kind 1"), "{out}");
    // Its buffer came back to it whole: 5 kernels, a copy, a set and a sync.
    assert!(out.contains("guest got 8"), "{out}");
    // Ours: 3 before, 2 after; none of the guest's.
    assert_eq!(kernels(&run.messages).len(), 5);
    let asides: Vec<_> = run
        .messages
        .iter()
        .filter(|m| matches!(m, CollectorMessage::SteppedAside { .. }))
        .collect();
    assert_eq!(asides.len(), 1);
    assert!(matches!(
        asides[0],
        CollectorMessage::SteppedAside {
            from_ns: 5000,
            to_ns: Some(5000),
            ..
        }
    ));
}

/// CUPTI still holds a buffer of ours when another client starts tracing: it is handed over to
/// us, timed, before the client's callbacks replace ours (a forced flush there handed such
/// records over without times: 300 of 400 queued matmuls on an H200).
#[test]
fn records_cupti_still_holds_when_another_client_starts_come_to_us_timed() {
    let h = harness();
    let run = h.run(&["guest-held"], &[]);
    let out = run.stdout();
    assert!(run.output.status.success(), "{out}");
    assert!(out.contains("held 3"), "{out}");
    // The other client's buffer held its own records only: 5 kernels, a copy, a set, a sync.
    assert!(out.contains("guest got 8"), "{out}");
    // Ours: the 3 held and the 2 after, each with its times.
    let ours = kernels(&run.messages);
    assert_eq!(ours.len(), 5, "{ours:?}");
    assert!(ours.iter().all(|k| k.end_ns > k.start_ns), "{ours:?}");
}

/// Kineto has CUPTI time records with its own clock (the CPU's TSC, in ticks) from its first
/// trace on: our records after it still reach gpudiag on CUPTI's clock, in ns, where the wall
/// clock places them.
#[test]
fn records_timed_on_another_clients_clock_come_back_on_cuptis() {
    let h = harness();
    let run = h.run(&["guest-clock"], &[]);
    let out = run.stdout();
    assert!(run.output.status.success(), "{out}");
    assert!(out.contains("guest got 8"), "{out}");
    let batches: Vec<_> = run
        .messages
        .iter()
        .filter_map(|m| match m {
            CollectorMessage::Kernels { clock, records, .. } => Some((clock, records)),
            _ => None,
        })
        .collect();
    let now_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    let mut after = 0;
    for (clock, records) in batches {
        for k in records {
            // Before the switch as CUPTI timed them; after it, back in ns at CUPTI's clock (the
            // stand-in's reads 5,000 and the carried clock runs on from there).
            let ns = k.end_ns - k.start_ns;
            assert!((6..=8).contains(&ns), "{k:?}");
            let unix = clock.unix_ns as i128 + k.start_ns as i128 - clock.cupti_ns as i128;
            assert!(
                (unix - now_unix_ns).abs() < 60_000_000_000,
                "{k:?} {clock:?}"
            );
            if clock.cupti_ns > 5000 {
                after += 1;
                assert!(
                    k.start_ns > 5000 && k.start_ns < 5000 + 60_000_000_000,
                    "{k:?}"
                );
            }
        }
    }
    assert_eq!(after, 2);
    let aside = run
        .messages
        .iter()
        .find_map(|m| match m {
            CollectorMessage::SteppedAside { from_ns, to_ns, .. } => Some((*from_ns, *to_ns)),
            _ => None,
        })
        .unwrap();
    assert!(aside.0 >= 5000 && aside.1.unwrap() >= aside.0, "{aside:?}");
}

#[test]
fn a_client_tracing_before_cuinit_keeps_cupti_until_it_is_done() {
    let h = harness();
    // Preloaded, as run --kernels loads it, so the client's calls reach the collector first.
    let collector = h.collector.to_str().unwrap().to_owned();
    let run = h.run(&["guest-first"], &[("LD_PRELOAD", &collector)]);
    let out = run.stdout();
    assert!(run.output.status.success(), "{out}");
    assert!(out.contains("guest got 8"), "{out}");
    assert_eq!(kernels(&run.messages).len(), 2);
    assert!(
        run.messages
            .iter()
            .any(|m| matches!(m, CollectorMessage::SteppedAside { to_ns: Some(_), .. }))
    );
}

#[test]
fn without_ld_preload_it_records_nothing_rather_than_risk_another_profilers_trace() {
    let h = harness();
    let run = h.run(&["init"], &[("DRIVER_LOCAL", "1")]);
    assert!(run.output.status.success());
    assert!(run.messages.iter().any(|m| matches!(m,
        CollectorMessage::CannotRecord { why, .. } if why.contains("without LD_PRELOAD"))));
    assert_eq!(kernels(&run.messages).len(), 0);
    // Preloaded as well, as run --kernels does, the same local load records.
    let collector = h.collector.to_str().unwrap().to_owned();
    let run = h.run(
        &["records", "10"],
        &[("DRIVER_LOCAL", "1"), ("LD_PRELOAD", &collector)],
    );
    assert!(run.output.status.success());
    assert_eq!(kernels(&run.messages).len(), 10);
}

#[test]
fn a_forked_child_stays_out_of_its_parents_stream() {
    let h = harness();
    let run = h.run(&["fork"], &[]);
    assert!(run.output.status.success());
    let pids: std::collections::BTreeSet<u32> = run.messages.iter().map(|m| m.pid()).collect();
    assert_eq!(pids.len(), 1, "{:?}", run.messages);
    // The parent's one kernel; the child's four went nowhere.
    assert_eq!(kernels(&run.messages).len(), 1);
    let goodbyes = run
        .messages
        .iter()
        .filter(|m| matches!(m, CollectorMessage::Goodbye { .. }))
        .count();
    assert_eq!(goodbyes, 1);
    assert_eq!(run.report.malformed, 0);
}

#[test]
fn a_program_with_the_variables_set_runs_as_before() {
    let h = harness();
    let env =
        gpudiag_kernels::child_env(&h.collector, Path::new("/nonexistent.sock"), |_| None).unwrap();
    for program in ["/bin/true", "/bin/sh"] {
        let out = Command::new(program)
            .args(if program == "/bin/sh" {
                vec!["-c", "echo ok"]
            } else {
                vec![]
            })
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_collector_compiles_without_a_warning() {
    let out = tempfile::tempdir().unwrap();
    compile(&[
        "-std=gnu11",
        "-shared",
        "-fPIC",
        "-O2",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-o",
        out.path().join("c.so").to_str().unwrap(),
        &format!("{HERE}/collector/collector.c"),
        "-ldl",
        "-lpthread",
    ]);
}

/// The numbers of the driver's line "on A of B, late C of D, finalised F, guest subscribed G".
fn sample_counts(out: &str) -> Vec<i64> {
    let line = out.lines().find(|l| l.starts_with("on ")).unwrap_or("");
    let numbers: Vec<i64> = line
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 6, "{out}");
    numbers
}

fn windows(messages: &[CollectorMessage]) -> Vec<(u64, Option<u64>, bool)> {
    messages
        .iter()
        .filter_map(|m| match m {
            CollectorMessage::Window {
                from_unix_ns,
                to_unix_ns,
                gave_way,
                ..
            } => Some((*from_unix_ns, *to_unix_ns, *gave_way)),
            _ => None,
        })
        .collect()
}

/// Sampling: CUPTI is attached only in the windows (100 ms of every 300 here) and finalised
/// between them at a CUDA runtime call's exit, never at the exit of the driver call inside it;
/// each window is said when it opens and when it closes.
#[test]
fn sampling_records_in_windows_and_detaches_cupti_between_them() {
    let h = harness();
    let run = h.run(
        &["sample", "1500"],
        &[("GPUDIAG_KERNELS_SAMPLE", "100/300")],
    );
    let out = run.stdout();
    assert!(run.output.status.success(), "{out}");
    let numbers = sample_counts(&out);
    // "on A of B, late C of D, finalised F, guest subscribed G"
    let (on, steps, finalised) = (numbers[0], numbers[1], numbers[4]);
    // About a third of the steps (the first window also holds the start, until the sampler's
    // first tick); a loaded machine stretches the steps, not the share.
    assert!(
        on * 10 >= steps && on * 10 <= steps * 7,
        "on in {on} of {steps} steps: {out}"
    );
    assert!(finalised >= 3, "{out}");
    // Never at a driver call's exit inside a runtime call (what crashed a launch loop).
    assert!(out.contains("finalised inside a runtime call 0\n"), "{out}");
    // The first detach's subscription is made inside cuInit, on the program's thread: made
    // from the sampler's thread while the program was inside a CUDA call, it killed a launch
    // loop in 10 runs of 24 on an H200.
    assert!(
        out.contains("subscribed from another thread before the first finalise 0\n"),
        "{out}"
    );
    let w = windows(&run.messages);
    let closed: Vec<_> = w.iter().filter_map(|&(f, t, _)| Some(t? - f)).collect();
    assert!(closed.len() >= 3, "{w:?}");
    // Every window between the first (which holds the start) and the last (which the exit
    // closes) is the schedule's 100 ms, give or take the sampler's wake.
    for len in &closed[1..closed.len() - 1] {
        assert!(
            (50_000_000..=250_000_000).contains(len),
            "a window of {len} ns: {w:?}"
        );
    }
    assert!(w.iter().all(|&(_, _, gave_way)| !gave_way), "{w:?}");
    // Each kernel emitted while on arrived.
    assert_eq!(kernels(&run.messages).len() as i64, on, "{out}");
}

/// A second client subscribing (Kineto, as torch.profiler starts) gets the callback API's slot,
/// and sampling ends: CUPTI stays attached and the collector records in full, and says so.
#[test]
fn sampling_gives_way_to_another_client_and_records_in_full_after() {
    let h = harness();
    let run = h.run(
        &["sample-guest", "1200"],
        &[("GPUDIAG_KERNELS_SAMPLE", "100/300")],
    );
    let out = run.stdout();
    assert!(run.output.status.success(), "{out}");
    let numbers = sample_counts(&out);
    let (on_late, late, guest) = (numbers[2], numbers[3], numbers[5]);
    assert_eq!(guest, 0, "the client's cuptiSubscribe failed: {out}");
    assert_eq!(on_late, late, "{out}");
    let w = windows(&run.messages);
    assert_eq!(
        w.iter()
            .filter(|&&(_, to, gave_way)| gave_way && to.is_none())
            .count(),
        1,
        "{w:?}"
    );
}

/// The object exports what the driver and the loader look for, and nothing newer than the
/// glibc gpudiag's release binary needs (2.28).
#[test]
fn the_collector_exports_eight_functions_and_needs_no_newer_glibc() {
    let h = harness();
    let out = Command::new("objdump")
        .arg("-T")
        .arg(&h.collector)
        .output()
        .expect("objdump (binutils) runs");
    let table = String::from_utf8_lossy(&out.stdout);
    let mut exported: Vec<&str> = table
        .lines()
        .filter(|l| l.contains(" g ") && l.contains(".text"))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    exported.sort_unstable();
    assert_eq!(
        exported,
        [
            "InitializeInjection",
            "cuptiActivityDisable",
            "cuptiActivityEnable",
            "cuptiActivityFlushAll",
            "cuptiActivityRegisterCallbacks",
            "cuptiActivityRegisterTimestampCallback",
            "cuptiFinalize",
            "cuptiSubscribe"
        ]
    );
    for line in table.lines() {
        let Some(version) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("(GLIBC_").and_then(|v| v.strip_suffix(')')))
        else {
            continue;
        };
        let parts: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
        assert!(parts.as_slice() <= [2, 28].as_slice(), "{line}");
    }
}
