//! Inputs the fuzzers (fuzz/, cargo-fuzz) found or that sit on a parser's edge, kept as files a
//! user could hand gpudiag: tests/fixtures/fuzz/TARGET/*. Each goes through the real binary and
//! must end in a result or a clear error with the documented exit code, never a panic or a hang.
//! `fuzz/keep.sh TARGET ARTIFACT` adds a crash here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::at;

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = at("tests/fixtures/fuzz").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    files
}

/// Runs gpudiag with a bound, so a hang fails the test instead of stalling it.
fn gpudiag(args: &[&std::ffi::OsStr]) -> Output {
    gpudiag_with(args, &[])
}

fn gpudiag_with(args: &[&std::ffi::OsStr], env: &[(&str, &Path)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("GPUDIAG_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("gpudiag {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A report (0 or 1) or a usage error (2) that says what is wrong; never a panic (101) or a
/// signal.
fn assert_clean(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    match out.status.code() {
        Some(0 | 1) => {}
        Some(2) => assert!(
            stderr.starts_with("gpudiag: ") || stderr.starts_with("error: "),
            "{what}: an error must say what is wrong: {stderr:?}"
        ),
        other => panic!("{what}: exit {other:?}: {stderr}"),
    }
}

/// Recordings and bundles: `check`, `check --window` and `trace` over each.
fn replay_inputs(target: &str) {
    for file in inputs(target) {
        let what = file.display().to_string();
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.json");
        let runs: [Vec<&std::ffi::OsStr>; 3] = [
            vec![
                "check".as_ref(),
                "--json".as_ref(),
                "--replay".as_ref(),
                file.as_ref(),
            ],
            vec![
                "check".as_ref(),
                "--window".as_ref(),
                "2s".as_ref(),
                "--replay".as_ref(),
                file.as_ref(),
            ],
            vec![
                "trace".as_ref(),
                "-o".as_ref(),
                trace.as_ref(),
                "--replay".as_ref(),
                file.as_ref(),
            ],
        ];
        for args in runs {
            let out = gpudiag(&args);
            assert_clean(&out, &format!("{what} {args:?}"));
            if args[0] == "check" && args[1] == "--json" && out.status.code() != Some(2) {
                let _: serde_json::Value = serde_json::from_slice(&out.stdout)
                    .unwrap_or_else(|e| panic!("{what}: the report is not JSON: {e}"));
            }
        }
    }
}

#[test]
fn recordings_end_in_a_report_or_a_usage_error() {
    replay_inputs("recording");
}

#[test]
fn bundles_end_in_a_report_or_a_usage_error() {
    replay_inputs("bundle");
}

#[test]
fn configs_end_in_a_report_or_an_error_that_names_the_file() {
    // The recording the config target fuzzes with, and the demo.
    let all_kinds = at("tests/fixtures/recordings/all_kinds.ndjson");
    for file in inputs("config") {
        let what = file.display().to_string();
        for source in [
            ["--replay".as_ref(), all_kinds.as_os_str()],
            ["--demo".as_ref(), "--json".as_ref()],
        ] {
            let mut args: Vec<&std::ffi::OsStr> =
                vec!["--config".as_ref(), file.as_ref(), "check".as_ref()];
            args.extend(source);
            let out = gpudiag(&args);
            assert_clean(&out, &what);
            if out.status.code() == Some(2) {
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(stderr.contains(&what), "{what}: {stderr}");
            }
        }
    }
}

/// Kernel logs: a live check of the fake amdgpu tree (the live source CI has) reads each as
/// the log of XIDs from before it.
#[test]
fn kernel_logs_end_in_a_report() {
    let sysfs = at("tests/fixtures/sysfs/mi300x");
    for file in inputs("kernel_log") {
        let what = file.display().to_string();
        let out = gpudiag_with(
            &[
                "check".as_ref(),
                "--json".as_ref(),
                "--backend".as_ref(),
                "sysfs".as_ref(),
                "--sysfs-root".as_ref(),
                sysfs.as_ref(),
                "--window".as_ref(),
                "0".as_ref(),
            ],
            &[("GPUDIAG_KMSG_PATH", &file)],
        );
        assert_clean(&out, &what);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{what}: the report is not JSON: {e}"));
        let past = report["devices"][0]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .chain(report["host_findings"].as_array().unwrap())
            .filter(|f| f["id"].as_str().unwrap().starts_with("errors.past_xid_"))
            .count();
        assert!(past > 0, "{what}: no XID read from it");
    }
}

struct Served(Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn http_requests_get_a_bounded_answer() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["serve", "--listen", "127.0.0.1:0", "--demo"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let served = Served(child, addr);
    let exchange = |request: &[u8]| -> Vec<u8> {
        let mut c = TcpStream::connect(&served.1).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // The server may answer and close before taking all of a huge request.
        let _ = c.write_all(request);
        let mut answer = Vec::new();
        if let Err(e) = c.read_to_end(&mut answer) {
            assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "no answer: {e}"
            );
        }
        answer
    };
    for file in inputs("http_request") {
        let request = std::fs::read(&file).unwrap();
        let answer = exchange(&request);
        let head = String::from_utf8_lossy(&answer[..answer.len().min(40)]).into_owned();
        let status: Option<u16> = head.split(' ').nth(1).and_then(|s| s.parse().ok());
        // A request that never completes its head is answered 408 at the deadline.
        assert!(
            matches!(status, Some(200 | 400 | 404 | 405 | 408 | 431)),
            "{}: {head:?}",
            file.display()
        );
    }
    let answer = exchange(b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "still serving");
}

/// A bundle of a few hundred kilobytes whose recording member inflates to 512 MiB of zeros (a
/// gzip bomb, made here rather than kept: the file is 500 kB) is refused without holding the
/// member in memory. Found by reading the bundle reader, not by the fuzzer (its inputs are far
/// smaller).
#[test]
fn a_bundle_that_inflates_to_512_mib_is_refused_in_bounded_memory() {
    const SIZE: u64 = 512 << 20;
    let dir = tempfile::tempdir().unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_path("recording.ndjson.gz").unwrap();
    header.set_size(SIZE);
    header.set_mode(0o644);
    header.set_cksum();
    let head = dir.path().join("head");
    std::fs::write(&head, header.as_bytes()).unwrap();
    let bomb = dir.path().join("bomb.tar.gz");
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "(cat '{}'; head -c {} /dev/zero) | gzip -1 > '{}'",
            head.display(),
            SIZE + 1024,
            bomb.display()
        ))
        .status()
        .unwrap();
    assert!(made.success());
    assert!(std::fs::metadata(&bomb).unwrap().len() < 4 << 20);

    let out = gpudiag(&["check".as_ref(), "--replay".as_ref(), bomb.as_ref()]);
    assert_clean(&out, "bomb");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2));
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
    let max_rss_kib = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage.ru_maxrss
    };
    eprintln!("peak RSS of a child: {max_rss_kib} KiB");
    assert!(
        max_rss_kib < 256 * 1024,
        "peak RSS of a child: {max_rss_kib} KiB"
    );
}
