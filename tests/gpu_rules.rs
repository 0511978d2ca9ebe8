//! GPU tests of the findings: a process that holds memory and idles must be reported with its
//! PID; XID events must be listened for. Run on the GPU host with `.gpu-bundle/run-gpu-tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
use gpu::gpudiag;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpudiag_core::check::CheckReport;

/// Kills the helper process even when an assertion fails.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and PyTorch"]
fn an_idle_process_holding_memory_is_reported_with_its_pid() {
    let holder = Command::new("python3")
        .args([
            "-c",
            "import torch, time, sys\n\
             x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\n\
             torch.cuda.synchronize()\n\
             print('ready', flush=True)\n\
             time.sleep(60)\n",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with torch");
    let pid = holder.id();
    let mut holder = Reaper(holder);
    // Wait until it holds its memory.
    let mut line = String::new();
    let stdout = holder.0.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    let start = Instant::now();
    let out = gpudiag()
        .args(["check", "--json", "--window", "6s", "--interval", "200ms"])
        .output()
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
    let report: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    let findings: Vec<_> = report.devices.iter().flat_map(|d| &d.findings).collect();
    let low = findings
        .iter()
        .find(|f| f.id == "utilisation.low")
        .unwrap_or_else(|| panic!("no utilisation.low in {findings:#?}"));
    let pids = low.evidence.values["pids"].as_array().unwrap();
    assert!(
        pids.iter().any(|p| p.as_u64() == Some(u64::from(pid))),
        "pid {pid} not in {pids:?}"
    );
    eprintln!("finding: {}\nadvice: {}", low.title, low.advice);
    let procs = report.devices[0]
        .latest
        .as_ref()
        .unwrap()
        .processes
        .as_ref()
        .unwrap();
    let me = procs
        .iter()
        .find(|p| p.pid == pid)
        .expect("the holder is listed");
    assert_eq!(me.name.as_deref(), Some("python3"));
    assert!(me.used_memory_bytes.unwrap() >= 2 << 30);
    assert!(me.user.is_some());
    assert_eq!(
        report.exit_code, 0,
        "a warning does not fail the check by default"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn xid_events_are_listened_for_or_their_absence_is_said() {
    // No XID can be provoked safely; the event thread must be running (no notice that events are
    // unavailable on a data-centre GPU) and the check must stay clean.
    let out = gpudiag()
        .args(["check", "--json", "--window", "2s"])
        .output()
        .unwrap();
    let report: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    let notices: Vec<_> = report
        .source
        .warnings
        .iter()
        .filter(|w| w.contains("XID"))
        .collect();
    assert!(notices.is_empty(), "{notices:?}");
    assert!(
        report
            .devices
            .iter()
            .flat_map(|d| &d.findings)
            .all(|f| !f.id.starts_with("errors.xid_")),
        "unexpected XID on a healthy GPU"
    );
}
