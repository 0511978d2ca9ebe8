//! GPU tests of process attribution (run with `.gpu-bundle/run-gpu-tests` on a GPU host, from the
//! repository root; ignored elsewhere): a Python process holding GPU memory, a fake kubelet (a
//! real gRPC server on a Unix socket) allocating the real GPUs by their NVML UUIDs, and
//! `check --json` and `serve` joining the two. As root, where the cgroup hierarchy is writable,
//! the process also runs in a cgroup named like a kubelet's pod and is named by its pod; else
//! it is a host process on a GPU a pod holds, and says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

#[path = "support/gpu.rs"]
mod gpu;
#[path = "support/kubelet.rs"]
mod kubelet;
use kubelet::{Behaviour, FakeKubelet, pod};

const POD_UID: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
const CONTAINER_ID: &str = "9f2c1a7e5b3d4c6f8a0b2d4e6f8a0c2e4f6a8b0d2f4a6c8e0b2d4f6a8c0e2b4d";

/// Killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check_json(args: &[&str]) -> Value {
    let out = gpu::gpudiag()
        .args(["check", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A kubepods-like cgroup (cgroupfs driver layout) when this host lets us make one.
fn pod_cgroup() -> Option<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let base = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(m)
            if m.lines()
                .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains("cgroup2")) =>
        {
            root.to_path_buf()
        }
        _ => root.join("memory"),
    };
    let leaf = base
        .join("kubepods/besteffort")
        .join(format!("pod{POD_UID}"))
        .join(CONTAINER_ID);
    match std::fs::create_dir_all(&leaf) {
        Ok(()) => Some(leaf),
        Err(e) => {
            eprintln!(
                "cannot make {} ({e}): the pod's cgroup part is skipped",
                leaf.display()
            );
            None
        }
    }
}

fn remove_cgroup(leaf: &Path) {
    for dir in leaf.ancestors().take(4) {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Python holding 1 GiB on the GPU `uuid`, started inside `cgroup` when given; the second
/// value says whether it got in (a host may let a cgroup be made but no process be moved).
fn hold_memory(uuid: &str, cgroup: Option<&Path>) -> (Killed, bool) {
    let hold = "import torch, time\n\
                x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n\
                torch.cuda.synchronize()\n\
                print('ready', flush=True)\n\
                time.sleep(120)";
    let mut cmd = match cgroup {
        Some(leaf) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!(
                "echo $$ > '{}/cgroup.procs' || echo 'not moved'; exec python3 -c \"{hold}\"",
                leaf.display()
            ));
            c
        }
        None => {
            let mut c = Command::new("python3");
            c.arg("-c").arg(hold);
            c
        }
    };
    let mut child = cmd
        .env("CUDA_VISIBLE_DEVICES", uuid)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let moved = cgroup.is_some() && line.trim() != "not moved";
    if line.trim() == "not moved" {
        eprintln!("could not move a process into the pod's cgroup: that part is skipped");
        line.clear();
        out.read_line(&mut line).unwrap();
    }
    assert_eq!(line.trim(), "ready", "python3 with torch holds GPU memory");
    (Killed(child), moved)
}

fn scrape(addr: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU and python3 with torch"]
fn a_fake_kubelet_names_the_pods_of_real_gpus() {
    let before = check_json(&["--window", "0"]);
    let uuids: Vec<String> = before["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["info"]["uuid"].as_str().unwrap().to_owned())
        .collect();
    // GPU 0 is held by one pod; GPU 1, where there is one, time-sliced by two.
    let mut pods = vec![pod("ml", "train-0", &[("trainer", &[uuids[0].as_str()])])];
    if let Some(second) = uuids.get(1) {
        pods.push(pod("ml", "a", &[("c", &[&format!("{second}::0")])]));
        pods.push(pod("ml", "b", &[("c", &[&format!("{second}::1")])]));
    }
    let kubelet = FakeKubelet::start(Behaviour::Answer(pods));
    let socket = kubelet.socket().to_str().unwrap().to_owned();
    let cgroup = pod_cgroup();
    let (holder, in_pod_cgroup) = hold_memory(&uuids[0], cgroup.as_deref());
    let pid = holder.0.id();

    let report = check_json(&["--window", "2s", "--kubelet-socket", &socket]);
    let gpu0 = &report["devices"][0]["latest"];
    assert_eq!(gpu0["gpu_pods"][0]["name"], "train-0", "{gpu0}");
    assert_eq!(gpu0["gpu_pods"][0]["containers"][0], "trainer");
    if uuids.len() > 1 {
        let gpu1 = &report["devices"][1]["latest"]["gpu_pods"];
        assert_eq!(gpu1.as_array().unwrap().len(), 2, "{gpu1}");
    }
    let process = gpu0["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} on GPU 0: {gpu0}"));
    let attribution = &process["attribution"];
    eprintln!("pid {pid}: {attribution}");
    if in_pod_cgroup {
        let pod = &attribution["pod"];
        assert_eq!(pod["uid"], POD_UID);
        assert_eq!(pod["name"], "train-0");
        assert_eq!(pod["namespace"], "ml");
        assert_eq!(pod["container"], "trainer");
        assert_eq!(process["container_id"], CONTAINER_ID);
    } else {
        // A host process on a GPU a pod holds is not that pod's.
        assert_eq!(attribution["pod"], Value::Null);
        assert_eq!(
            attribution["absent"]["pod"],
            "not in a Kubernetes pod cgroup"
        );
    }

    // serve: the device series of GPU 0 carry its pod, the process its owners.
    let mut serve = gpu::gpudiag()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--kubelet-socket",
            &socket,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(serve.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let served = Killed(serve);
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_owned();
    std::thread::sleep(Duration::from_secs(4));
    let metrics = scrape(&addr);
    drop(served);
    let util0 = metrics
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\""))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        util0.contains("pod=\"train-0\",namespace=\"ml\",container=\"trainer\""),
        "{util0}"
    );
    let mine = metrics
        .lines()
        .find(|l| {
            l.starts_with("gpudiag_process_memory_used_bytes{gpu=\"0\"")
                && l.contains(&format!("pid=\"{pid}\""))
        })
        .unwrap_or_else(|| panic!("no series for pid {pid}:\n{metrics}"));
    assert_eq!(in_pod_cgroup, mine.contains("pod=\"train-0\""), "{mine}");
    drop(holder);
    if let Some(leaf) = cgroup {
        // The process is gone: its cgroup can go.
        std::thread::sleep(Duration::from_millis(500));
        remove_cgroup(&leaf);
    }
}
