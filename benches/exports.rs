//! Export costs at fleet scale: a one-hour, 8-GPU, 10 Hz recording turned into a Chrome trace
//! (time and size, realistic and worst case), and `gpudiag serve` answering scrapes for 8 GPUs
//! (render time in process, and whole HTTP round trips against the real binary). Plain `main`
//! (`harness = false`); run `cargo bench --bench exports`.
#![cfg_attr(test, allow(dead_code))]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpudiag_export::chrome_trace::TraceBuilder;
use gpudiag_export::prometheus::{Snapshot, render};
use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample};
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::recording::{Header, RecordingWriter};

const DEVICES: u32 = 8;
const STEP_MS: u64 = 100;
const TICKS: u64 = 3600 * 1000 / STEP_MS;
const T0: u64 = 1_767_225_600_000;

/// A small deterministic generator, so runs are comparable.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn device(index: u32) -> DeviceInfo {
    DeviceInfo {
        index,
        uuid: Some(format!("GPU-{index:08x}-0000-0000-0000-000000000000")),
        name: Some("NVIDIA H200".into()),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x19 + index * 0x20)),
        ..DeviceInfo::default()
    }
}

/// A training-like load: utilisation and power move every tick, temperature and clocks now
/// and then, memory in steps, PCIe at the slow cadence (1 s); `worst` makes everything move.
fn sample(d: u32, i: u64, rng: &mut Lcg, worst: bool) -> Sample {
    let t = T0 + i * STEP_MS;
    let busy = !(i / 3000 + u64::from(d)).is_multiple_of(4);
    let util = if busy { 85.0 + 15.0 * rng.next() } else { 0.0 };
    let power = if busy {
        600.0 + 100.0 * rng.next()
    } else {
        110.0 + rng.next()
    };
    let capped = busy && power > 690.0;
    let slow = worst || i.is_multiple_of(10);
    let mut s = Sample::new(d, t);
    s.gpu_util_pct = Some(util.round());
    s.mem_util_pct = Some((util * 0.4).round());
    s.mem_used_bytes =
        Some(if busy { 110 << 30 } else { 1 << 29 } + if worst { i * 4096 } else { 0 });
    s.mem_free_bytes = Some((141u64 << 30) - s.mem_used_bytes.unwrap_or(0));
    s.mem_total_bytes = Some(141 << 30);
    s.power_w = Some((power * 100.0).round() / 100.0);
    s.power_limit_w = Some(700.0);
    s.energy_j = Some(i as f64 * 60.0);
    // Temperature follows the load slowly (thermal mass: about a minute to settle), in whole
    // degrees as NVML reports it.
    let phase = (i % 3000) as f64 / 600.0;
    let settle = 1.0 - (-phase).exp();
    let (from, to) = if busy { (40.0, 70.0) } else { (70.0, 40.0) };
    let temp = from + (to - from) * settle;
    s.temp_gpu_c = Some(if worst {
        40.0 + 30.0 * rng.next()
    } else {
        temp.round()
    });
    s.temp_mem_c = Some(if worst {
        45.0 + 30.0 * rng.next()
    } else {
        (temp + 5.0).round()
    });
    s.sm_clock_mhz = Some(if worst || capped {
        1700 + (rng.next() * 280.0) as u32
    } else {
        1980
    });
    s.mem_clock_mhz = Some(3201);
    s.pstate = Some(0);
    s.throttle_reasons = Some(if capped {
        0x4
    } else if busy {
        0
    } else {
        0x1
    });
    s.pcie_gen = Some(5);
    s.pcie_width = Some(16);
    if slow {
        s.pcie_rx_bytes_per_s = Some(if busy { 2e9 * rng.next() } else { 1e6 });
        s.pcie_tx_bytes_per_s = Some(if busy { 1e9 * rng.next() } else { 1e6 });
    }
    s.pcie_replay_count = Some(0);
    s.ecc_uncorrected_volatile = Some(0);
    s
}

fn trace_export(label: &str, worst: bool) {
    let devices: Vec<DeviceInfo> = (0..DEVICES).map(device).collect();
    let mut rng = Lcg(7);
    // Generating samples is the recording's cost, not the export's: build ticks first.
    let ticks: Vec<Tick> = (0..TICKS)
        .map(|i| Tick {
            samples: (0..DEVICES)
                .map(|d| sample(d, i, &mut rng, worst))
                .collect(),
            events: Vec::new(),
            ras: Vec::new(),
            kernels: None,
        })
        .collect();
    let start = Instant::now();
    let mut b = TraceBuilder::new("replay", None, &HostInfo::default(), devices);
    for t in &ticks {
        b.push_tick(t);
    }
    let trace = b.finish();
    let built = start.elapsed();
    let mut bytes = Vec::new();
    if let Err(e) = serde_json::to_writer(&mut bytes, &trace) {
        eprintln!("serialise: {e}");
        return;
    }
    let total = start.elapsed();
    println!(
        "trace {label:<10} {:>9} samples  {:>9} events  build {:>6.2} s  total {:>6.2} s  {:>7.1} MB",
        TICKS * u64::from(DEVICES),
        trace.trace_events.len(),
        built.as_secs_f64(),
        total.as_secs_f64(),
        bytes.len() as f64 / 1e6
    );
}

fn snapshot() -> Snapshot {
    let mut rng = Lcg(3);
    let devices: Vec<DeviceInfo> = (0..DEVICES).map(device).collect();
    let now = Instant::now();
    Snapshot {
        host: HostInfo {
            hostname: Some("gpu-node-01".into()),
            ..HostInfo::default()
        },
        latest: (0..DEVICES)
            .map(|d| (d, sample(d, 10, &mut rng, true)))
            .collect(),
        received: (0..DEVICES).map(|d| (d, now)).collect(),
        devices,
        ..Snapshot::default()
    }
}

/// `per_gpu` processes on each of the 8 GPUs, every one attributed: on even GPUs pods (one pod
/// holds the GPU), on odd ones Slurm jobs, so every per-process series carries its owner labels.
fn snapshot_with_processes(per_gpu: u32) -> Snapshot {
    use gpudiag_model::attribution::SlurmJob;
    use gpudiag_model::attribution::{Attribution, FoundIn, PodAllocation, PodIdentity};
    use gpudiag_model::sample::ProcessSample;
    let mut snap = snapshot();
    for (d, s) in snap.latest.iter_mut() {
        let pod = format!("train-{d}");
        if d % 2 == 0 {
            s.gpu_pods = Some(vec![PodAllocation {
                namespace: "ml-team".into(),
                name: pod.clone(),
                containers: vec!["trainer".into()],
            }]);
        }
        s.processes = Some(
            (0..per_gpu)
                .map(|i| {
                    let attribution = if d % 2 == 0 {
                        Attribution {
                            pod: Some(PodIdentity {
                                uid: Some(format!("7c9e6679-7425-40de-944b-{d:04}{i:08}")),
                                runtime: Some("containerd".into()),
                                name: Some(pod.clone()),
                                namespace: Some("ml-team".into()),
                                container: Some("trainer".into()),
                                matched_by: Some(FoundIn::GpuAllocation),
                                sharing: Vec::new(),
                            }),
                            ..Attribution::default()
                        }
                    } else {
                        Attribution {
                            job: Some(SlurmJob {
                                id: format!("{}", 100_000 + d * 1000 + i),
                                step: Some("0".into()),
                                user: Some(format!("user{i}")),
                                found_in: FoundIn::Cgroup,
                            }),
                            ..Attribution::default()
                        }
                    };
                    ProcessSample {
                        pid: 10_000 + d * 1000 + i,
                        name: Some("python3".into()),
                        user: Some(format!("user{i}")),
                        kind: Some("compute".into()),
                        used_memory_bytes: Some(u64::from(i + 1) << 28),
                        sm_util_pct: Some(f64::from(i % 100)),
                        container_id: None,
                        container_pid: None,
                        cpu_time_s: Some(12.5),
                        attribution: Some(attribution),
                        launch: None,
                        state: None,
                        started_ms: None,
                    }
                })
                .collect(),
        );
    }
    snap
}

/// Render time and series count of `per_gpu` processes on each of 8 GPUs.
fn render_with_processes(per_gpu: u32) {
    let snap = snapshot_with_processes(per_gpu);
    let n = 500;
    let start = Instant::now();
    let mut text = String::new();
    for _ in 0..n {
        text = std::hint::black_box(render(&snap, Instant::now()));
    }
    let per = start.elapsed() / n;
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    let per_process = text
        .lines()
        .filter(|l| l.starts_with("gpudiag_process_") && !l.starts_with("gpudiag_process_series"))
        .count();
    let dropped = text
        .lines()
        .find(|l| l.starts_with("gpudiag_process_series_dropped"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or("?");
    println!(
        "serve render 8 GPUs x {per_gpu:>3} processes {:>8.1} µs/scrape  {series} series \
         ({per_process} per-process, {dropped} processes cut)  {} bytes",
        per.as_secs_f64() * 1e6,
        text.len()
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn render_in_process() {
    let snap = snapshot();
    let n = 2000;
    let start = Instant::now();
    let mut len = 0;
    for _ in 0..n {
        len = std::hint::black_box(render(&snap, Instant::now())).len();
    }
    let per = start.elapsed() / n;
    println!(
        "serve render 8 GPUs         {:>8.1} µs/scrape  ({len} bytes)",
        per.as_secs_f64() * 1e6
    );
}

fn scrape_over_http() {
    let dir = std::env::temp_dir().join(format!("gpudiag-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let rec = dir.join("8gpu.ndjson");
    let header = Header::new(
        "nvml",
        HostInfo::default(),
        (0..DEVICES).map(device).collect(),
        Some(100),
    );
    let mut rng = Lcg(5);
    let written = RecordingWriter::create(&rec, &header).and_then(|mut w| {
        for i in 0..20 {
            let tick = Tick {
                samples: (0..DEVICES).map(|d| sample(d, i, &mut rng, true)).collect(),
                events: Vec::new(),
                ras: Vec::new(),
                kernels: None,
            };
            w.write_tick(&tick)?;
        }
        w.finish()
    });
    if let Err(e) = written {
        eprintln!("cannot write the recording: {e}");
        return;
    }
    let child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["serve", "--listen", "127.0.0.1:0", "--replay"])
        .arg(&rec)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("cannot start gpudiag serve");
        return;
    };
    let mut line = String::new();
    if let Some(err) = child.stderr.take() {
        let _ = BufReader::new(err).read_line(&mut line);
    }
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_default()
        .to_string();
    // Let the short replay play out so every GPU has a sample.
    std::thread::sleep(Duration::from_secs(3));
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..500 {
        let start = Instant::now();
        let Ok(mut c) = TcpStream::connect(&addr) else {
            break;
        };
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n");
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        times.push(start.elapsed());
        bytes = out.len();
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    if times.is_empty() {
        eprintln!("no scrape succeeded against {addr:?}");
        return;
    }
    times.sort();
    println!(
        "serve HTTP scrape 8 GPUs     median {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  ({} scrapes, {bytes} bytes)",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        times.len()
    );
}

fn main() {
    // `cargo bench --bench exports -- serve` runs only the scrape measurements.
    let only_serve = std::env::args().any(|a| a == "serve");
    if !only_serve {
        trace_export("realistic", false);
        trace_export("worst", true);
    }
    render_in_process();
    for per_gpu in [0, 8, 64, 128] {
        render_with_processes(per_gpu);
    }
    scrape_over_http();
}
