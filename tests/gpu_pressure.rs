//! GPU tests of probes on a GPU that is not ours alone (`.gpu-bundle/run-gpu-tests`), ignored
//! elsewhere: another process holding nearly all the memory and running kernels meanwhile, and
//! Ctrl-C in the middle of a suite. The probe must refuse or scale down with a clear message
//! and must leave no memory behind; an out-of-memory crash or a hang is a failure.
//!
//! Exclusive-process compute mode is not tried: switching a shared host's GPU into it is not
//! ours to do, and these tests never change the card's settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
use gpu::gpudiag;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpudiag_probes::Verdict;
use gpudiag_probes::runner::ProbeReport;

/// Killed on every path, so a failing test cannot leave the GPU busy for the next one.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A PyTorch process on GPU 0 that takes all free memory but `leave_mib` and multiplies a
/// vector in a loop until killed; `None` without PyTorch.
fn hog(leave_mib: u64) -> Option<Holder> {
    let script = format!(
        "import torch,time\n\
         free,_=torch.cuda.mem_get_info(0)\n\
         hold=torch.empty(max(free-({leave_mib}<<20),0),dtype=torch.uint8,device='cuda:0')\n\
         y=torch.ones(1<<24,device='cuda:0')\n\
         print('ready',torch.cuda.mem_get_info(0)[0]>>20,flush=True)\n\
         t=time.time()\n\
         while time.time()-t<300:\n    y.mul_(1.0000001)\n    torch.cuda.synchronize()\n"
    );
    let child = Command::new("python3")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut holder = Holder(child);
    let mut line = String::new();
    BufReader::new(holder.0.stdout.take()?)
        .read_line(&mut line)
        .ok()?;
    eprintln!("hog: {line}");
    line.starts_with("ready").then_some(holder)
}

fn used_by(pid: u32) -> bool {
    let q = Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid", "--format=csv,noheader"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&q.stdout)
        .lines()
        .any(|l| l.trim() == pid.to_string())
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn probes_on_a_nearly_full_busy_gpu_scale_down_or_refuse_clearly() {
    let Some(holder) = hog(1024) else {
        eprintln!("no PyTorch here: skipped");
        return;
    };
    // Without --force: refused, naming the other process.
    let out = gpudiag()
        .args(["probe", "--suite", "quick", "--device", "0", "--json"])
        .output()
        .unwrap();
    let rep: ProbeReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let why = rep.devices[0].refused.clone().expect("refused");
    assert!(why.contains(&holder.0.id().to_string()), "{why}");
    // With --force, on the 1 GiB left while the other process keeps the GPU busy.
    let start = Instant::now();
    let out = gpudiag()
        .args([
            "probe", "--suite", "quick", "--device", "0", "--json", "--force",
        ])
        .output()
        .unwrap();
    let wall = start.elapsed();
    drop(holder);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "forced quick suite under pressure: {:.1} s; {stderr}",
        wall.as_secs_f64()
    );
    assert!(
        matches!(out.status.code(), Some(0) | Some(1)),
        "exit {:?}: {stderr}",
        out.status
    );
    let rep: ProbeReport = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{}", serde_json::to_string(&rep).unwrap());
    let d = &rep.devices[0];
    assert!(d.refused.is_none());
    for r in &d.results {
        // Scaled down: no probe asked for more than the memory that was free.
        if let Some(b) = r
            .parameters
            .get("memory_budget_bytes")
            .and_then(|v| v.as_u64())
        {
            assert!(b <= 1 << 30, "{}: budget {b}", r.probe);
        }
        match r.verdict {
            Verdict::Pass | Verdict::Warn => {}
            // A probe that could not fit says why, in words.
            Verdict::Skipped | Verdict::Error => {
                let note = r.note.as_deref().unwrap_or("");
                assert!(note.len() > 10, "{}: {note:?}", r.probe);
            }
            Verdict::Fail => panic!("{} failed under pressure: {:?}", r.probe, r.note),
        }
    }
    let mismatches = d
        .results
        .iter()
        .find(|r| r.probe == "memory")
        .and_then(|r| r.metric("mismatches"))
        .map(|m| m.value);
    assert_ne!(mismatches, Some(1.0), "a busy neighbour is not a bit flip");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn ctrl_c_during_a_suite_stops_cleanly_and_frees_the_gpu() {
    let child = gpudiag()
        .args(["probe", "--suite", "standard", "--device", "0", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait until the probes hold the GPU, then interrupt.
    let start = Instant::now();
    while !used_by(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never reached the GPU"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = stopped.elapsed();
    eprintln!("stopped {:.2} s after Ctrl-C", took.as_secs_f64());
    assert!(took < Duration::from_secs(60), "{took:?}");
    // Interrupted probes are errors (exit 1) with the reason, and the report is complete JSON.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: ProbeReport = serde_json::from_slice(&out.stdout).unwrap();
    let notes: Vec<String> = rep.devices[0]
        .results
        .iter()
        .filter_map(|r| r.note.clone())
        .collect();
    assert!(notes.iter().any(|n| n.contains("interrupted")), "{notes:?}");
    assert!(!used_by(pid), "the GPU still lists the stopped probe");
}
