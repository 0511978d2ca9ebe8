//! Timing of the history's hot paths: what the sampler pays per tick and what rules and the TUI
//! pay per window statistic, at 8 GPUs × 25 metrics and 10 Hz. Plain `main` (register with
//! `harness = false`) because the crate has no benchmark framework; run `cargo bench --bench history`.
#![cfg_attr(test, allow(dead_code))]

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpudiag_core::history::{History, Window};
use gpudiag_model::sample::{Metric, Sample};

const DEVICES: u32 = 8;
const STEP_MS: u64 = 100;

fn sample(device: u32, time_ms: u64, i: u64) -> Sample {
    let wave = (i % 600) as f64 / 6.0;
    let mut s = Sample::new(device, time_ms);
    s.gpu_util_pct = Some(wave);
    s.mem_util_pct = Some(wave / 2.0);
    s.mem_used_bytes = Some(40_000_000_000 + i * 1000);
    s.mem_free_bytes = Some(100_000_000_000 - i * 1000);
    s.mem_total_bytes = Some(141_000_000_000);
    s.power_w = Some(300.0 + wave);
    s.power_limit_w = Some(700.0);
    s.energy_j = Some(i as f64 * 30.0);
    s.temp_gpu_c = Some(40.0 + wave / 5.0);
    s.temp_mem_c = Some(45.0 + wave / 5.0);
    s.sm_clock_mhz = Some(1980);
    s.mem_clock_mhz = Some(3201);
    s.pstate = Some(0);
    s.throttle_reasons = Some(if wave > 90.0 { 4 } else { 0 });
    s.pcie_gen = Some(5);
    s.pcie_width = Some(16);
    s.pcie_rx_bytes_per_s = Some(1e9 + wave);
    s.pcie_tx_bytes_per_s = Some(2e9 + wave);
    s.pcie_replay_count = Some(i / 1000);
    s.ecc_corrected_volatile = Some(0);
    s.ecc_uncorrected_volatile = Some(0);
    s.remapped_rows_uncorrectable = Some(0);
    s.fan_pct = Some(30.0);
    s.encoder_util_pct = Some(0.0);
    s.decoder_util_pct = Some(0.0);
    s
}

fn per_call(label: &str, calls: u64, elapsed: Duration) {
    let ns = elapsed.as_nanos() as f64 / calls.max(1) as f64;
    println!("{label:<44} {ns:>12.0} ns/call  ({calls} calls)");
}

fn main() {
    let mut h = History::new();
    let t0 = 1_760_000_000_000u64;
    let ticks = 2 * 3600 * 1000 / STEP_MS;
    let samples: Vec<Sample> = (0..DEVICES).map(|d| sample(d, t0, 0)).collect();
    let mut push_time = Duration::ZERO;
    for i in 0..ticks {
        let t = t0 + i * STEP_MS;
        // Building samples is the backend's cost, so it stays outside the timed region.
        let tick: Vec<Sample> = samples.iter().map(|s| sample(s.device, t, i)).collect();
        let start = Instant::now();
        for s in &tick {
            h.push_sample(black_box(s));
        }
        push_time += start.elapsed();
    }
    per_call(
        "push_sample (25 metrics), 2 h at 10 Hz",
        ticks * u64::from(DEVICES),
        push_time,
    );
    println!(
        "approx_memory_bytes after 2 h: {:.1} MiB",
        h.approx_memory_bytes() as f64 / (1 << 20) as f64
    );

    let windows = [
        ("stats 60 s (raw)", Window::Last(Duration::from_secs(60))),
        ("stats 10 min (raw)", Window::Last(Duration::from_secs(600))),
        (
            "stats 1 h (coarse + raw)",
            Window::Last(Duration::from_secs(3600)),
        ),
        ("stats all (2 h)", Window::All),
    ];
    for (label, window) in windows {
        let calls = 2000u64;
        let start = Instant::now();
        for i in 0..calls {
            let device = (i % u64::from(DEVICES)) as u32;
            black_box(h.stats(device, Metric::PowerW, window));
        }
        per_call(label, calls, start.elapsed());
    }
    let calls = 2000u64;
    let start = Instant::now();
    for i in 0..calls {
        let device = (i % u64::from(DEVICES)) as u32;
        black_box(h.fraction_where(
            device,
            Metric::ThrottleReasons,
            Duration::from_secs(600),
            |v| (v as u64) & 0x4 != 0,
        ));
    }
    per_call("fraction_where 10 min", calls, start.elapsed());
    let start = Instant::now();
    let mut points = 0usize;
    for _ in 0..200 {
        let walk = h
            .series(0, Metric::GpuUtilPct)
            .fold((0usize, 0.0), |(n, sum), (_, v)| (n + 1, sum + v));
        points += black_box(walk).0;
    }
    per_call("series() full walk", 200, start.elapsed());
    println!("points per series walk: {}", points / 200);
}
