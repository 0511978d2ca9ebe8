//! What attributing GPU processes costs: reading one process's owners from /proc, and asking
//! the kubelet's pod-resources API (a fake one on a Unix socket, listing 110 pods on 8 GPUs):
//! the first call (connect and List), a refresh, a cached answer, no socket at all, and the
//! resident memory the client and its runtime add. Plain `main` (`harness = false`); run
//! `cargo bench --bench attribution`.
//!
//! `cargo bench --bench attribution -- serve-kubelet SOCKET ID[,ID...] SECONDS` serves that fake
//! kubelet instead, for trying `gpudiag --kubelet-socket SOCKET` by hand: each device id (a GPU
//! UUID or PCI address) is held by pod `demo/gpu-<n>` (container `main`), the first also by
//! `demo/shared`, so with two ids or more the first GPU reads as time-sliced.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use gpudiag_telemetry::attribution::{AttributionOptions, Attributor, GpuKeys, KubeletOptions};

#[path = "../tests/support/kubelet.rs"]
mod kubelet;
use kubelet::{Behaviour, FakeKubelet, pod};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn gpu(index: u32) -> GpuKeys {
    GpuKeys {
        index,
        uuid: Some(format!("GPU-{index:08x}-0000-0000-0000-000000000000")),
        pci_bus_id: None,
    }
}

fn attributor(socket: &Path, cache_for: Duration) -> Attributor {
    Attributor::new(AttributionOptions {
        kubelet: KubeletOptions {
            socket: socket.to_path_buf(),
            cache_for,
            deadline: Duration::from_secs(1),
        },
        ..AttributionOptions::default()
    })
}

fn per_call(n: u32, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed() / n
}

/// `serve-kubelet SOCKET IDS SECONDS`.
fn serve_kubelet(args: &[String]) {
    let [socket, ids, seconds] = args else {
        eprintln!("usage: serve-kubelet SOCKET ID[,ID...] SECONDS");
        std::process::exit(2);
    };
    let ids: Vec<&str> = ids.split(',').filter(|g| !g.is_empty()).collect();
    let mut pods: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| pod("demo", &format!("gpu-{n}"), &[("main", &[*id])]))
        .collect();
    if ids.len() >= 2 {
        pods.push(pod("demo", "shared", &[("main", &[ids[0]])]));
    }
    let socket = std::path::PathBuf::from(socket);
    let _ = std::fs::remove_file(&socket);
    let kubelet = FakeKubelet::start_at(
        tempfile::tempdir().expect("a temporary directory"),
        socket.clone(),
        Behaviour::Answer(pods),
    );
    let seconds: u64 = seconds.parse().unwrap_or(60);
    eprintln!(
        "fake kubelet on {} for {seconds} s",
        kubelet.socket().display()
    );
    std::thread::sleep(Duration::from_secs(seconds));
    let _ = std::fs::remove_file(&socket);
}

fn main() {
    // cargo adds `--bench` to the arguments it was given.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    if let Some(at) = args.iter().position(|a| a == "serve-kubelet") {
        return serve_kubelet(&args[at + 1..]);
    }
    // /proc: this machine's own processes, up to 64 of them.
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .take(64)
                .collect()
        })
        .unwrap_or_default();
    let none = attributor(
        Path::new("/nonexistent/kubelet.sock"),
        Duration::from_secs(10),
    );
    let pods = none.gpu_pods(&gpu(0));
    let passwd = none.passwd();
    let rounds = 50;
    let t = per_call(rounds, || {
        for &pid in &pids {
            std::hint::black_box(none.process(pid, &passwd, &pods));
        }
    });
    println!(
        "/proc: owners of {} processes        {:>8.1} µs per round ({:.1} µs per process)",
        pids.len(),
        t.as_secs_f64() * 1e6,
        t.as_secs_f64() * 1e6 / pids.len().max(1) as f64
    );

    // No kubelet: one stat per cache period, the cached reason otherwise.
    let uncached = attributor(Path::new("/nonexistent/kubelet.sock"), Duration::ZERO);
    let t = per_call(10_000, || {
        std::hint::black_box(uncached.gpu_pods(&gpu(0))).ok();
    });
    println!(
        "no socket, asked every call            {:>8.2} µs per GPU read",
        t.as_secs_f64() * 1e6
    );
    let t = per_call(10_000, || {
        std::hint::black_box(none.gpu_pods(&gpu(0))).ok();
    });
    println!(
        "no socket, cached reason               {:>8.2} µs per GPU read",
        t.as_secs_f64() * 1e6
    );

    // A kubelet with 110 pods (the kubelet's default maximum), 8 of them holding a GPU each.
    let listed: Vec<_> = (0..110)
        .map(|i| {
            let id = format!("GPU-{i:08x}-0000-0000-0000-000000000000");
            let ids: Vec<&str> = if i < 8 { vec![id.as_str()] } else { vec![] };
            pod("ml-team", &format!("pod-{i}"), &[("main", &ids)])
        })
        .collect();
    let fake = FakeKubelet::start(Behaviour::Answer(listed));
    let before = rss_kib();
    let fresh = attributor(fake.socket(), Duration::ZERO);
    let start = Instant::now();
    let first = fresh.gpu_pods(&gpu(3));
    let connect = start.elapsed();
    let after = rss_kib();
    assert_eq!(first.map(|p| p.len()), Ok(1));
    println!(
        "kubelet first List (client, connect)   {:>8.2} ms; RSS +{} KiB (client and runtime)",
        connect.as_secs_f64() * 1e3,
        after.saturating_sub(before)
    );
    let t = per_call(200, || {
        std::hint::black_box(fresh.gpu_pods(&gpu(3))).ok();
    });
    println!(
        "kubelet List, connection kept          {:>8.1} µs per call",
        t.as_secs_f64() * 1e6
    );
    let cached = attributor(fake.socket(), Duration::from_secs(10));
    cached.gpu_pods(&gpu(0)).ok();
    let t = per_call(10_000, || {
        std::hint::black_box(cached.gpu_pods(&gpu(5))).ok();
    });
    println!(
        "kubelet answer cached (join 110 pods)  {:>8.2} µs per GPU read",
        t.as_secs_f64() * 1e6
    );
    println!("RSS at the end: {} KiB", rss_kib());
}
