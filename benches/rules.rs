//! Rule evaluation over a generated one-hour recording of 8 GPUs at 10 Hz: the total time, and
//! the live cost per sampler tick (history push + rule engine) against the 100 ms interval.
//! Plain `main` (registered with `harness = false`); run `cargo bench --bench rules`.
#![cfg_attr(test, allow(dead_code))]

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpudiag_core::config::RulesConfig;
use gpudiag_core::history::History;
use gpudiag_core::rules::engine::RuleEngine;
use gpudiag_core::rules::{
    self, RuleInput,
    process_state::{ProcessLaunch, ProcessMemory},
};
use gpudiag_model::job::Launch;
use gpudiag_model::sample::{DeviceInfo, ProcessSample, Sample};
use gpudiag_telemetry::Tick;

const DEVICES: u32 = 8;
const STEP_MS: u64 = 100;
const HOUR_TICKS: u64 = 36_000;

fn device(index: u32) -> DeviceInfo {
    DeviceInfo {
        index,
        name: Some("NVIDIA H200".into()),
        memory_total_bytes: Some(141 << 30),
        power_limit_default_w: Some(700.0),
        sm_clock_max_mhz: Some(1980),
        pcie_gen_max: Some(5),
        pcie_width_max: Some(16),
        temp_slowdown_c: Some(89.0),
        temp_mem_max_c: Some(95.0),
        persistence_mode: Some(true),
        mig_enabled: Some(false),
        ..DeviceInfo::default()
    }
}

/// A busy, realistic sample: load waves, power cap at the peaks, two processes per GPU (one
/// growing slowly), counters ticking.
fn sample(device: u32, time_ms: u64, i: u64) -> Sample {
    let wave = (i % 600) as f64 / 6.0;
    let mut s = Sample::new(device, time_ms);
    s.gpu_util_pct = Some(wave);
    s.mem_util_pct = Some(wave / 2.0);
    s.mem_used_bytes = Some(40_000_000_000 + i * 1000);
    s.mem_total_bytes = Some(141 << 30);
    s.power_w = Some(300.0 + wave * 4.0);
    s.power_limit_w = Some(700.0);
    s.temp_gpu_c = Some(40.0 + wave / 5.0);
    s.temp_mem_c = Some(45.0 + wave / 5.0);
    s.temp_slowdown_c = Some(89.0);
    s.sm_clock_mhz = Some(1980);
    s.pstate = Some(0);
    s.throttle_reasons = Some(if wave > 90.0 { 4 } else { 0 });
    s.pcie_gen = Some(5);
    s.pcie_width = Some(16);
    s.pcie_rx_bytes_per_s = Some(1e9 + wave);
    s.pcie_tx_bytes_per_s = Some(2e9 + wave);
    s.pcie_replay_count = Some(i / 1000);
    // Profiling counters as GPM gives them on a Hopper GPU, so the verdict judges from them.
    s.sm_active_pct = Some(wave * 0.9);
    s.sm_occupancy_pct = Some(wave * 0.2);
    s.tensor_active_pct = Some(wave * 0.7);
    s.dram_active_pct = Some(wave * 0.3);
    s.fp32_active_pct = Some(wave * 0.05);
    s.fp16_active_pct = Some(0.0);
    s.fp64_active_pct = Some(0.0);
    s.prof_pcie_rx_bytes_per_s = Some(1e9 + wave);
    s.prof_pcie_tx_bytes_per_s = Some(2e9 + wave);
    s.ecc_uncorrected_volatile = Some(0);
    s.remapped_rows_pending = Some(false);
    s.processes = Some(
        (0..2)
            .map(|p| ProcessSample {
                pid: 1000 + device * 10 + p,
                name: Some("python3".into()),
                user: None,
                kind: Some("compute".into()),
                used_memory_bytes: Some((8 << 30) + ((i / 10) * u64::from(p) * 65536)),
                sm_util_pct: None,
                container_id: None,
                container_pid: None,
                cpu_time_s: None,
                attribution: None,
                // The first process of every GPU is a rank of one torchrun job of 8 GPUs,
                // so the job verdict judges every evaluation.
                launch: (p == 0).then(|| Launch {
                    parent_pid: Some(999),
                    exe: Some("/usr/bin/python3".into()),
                    parent_exe: Some("/usr/bin/python3".into()),
                    run_id: Some("bench-run".into()),
                    rank: Some(device),
                    ..Launch::default()
                }),
                state: None,
                started_ms: None,
            })
            .collect(),
    );
    s
}

fn main() {
    let devices: Vec<DeviceInfo> = (0..DEVICES).map(device).collect();
    let mut engine = RuleEngine::new(RulesConfig::default(), devices, None, None);
    let mut history = History::default();
    let mut per_tick: Vec<Duration> = Vec::with_capacity(HOUR_TICKS as usize);
    let mut engine_only: Vec<Duration> = Vec::with_capacity(HOUR_TICKS as usize);
    let start = Instant::now();
    for i in 0..HOUR_TICKS {
        let t = 1_767_225_600_000 + i * STEP_MS;
        let tick = Tick {
            samples: (0..DEVICES).map(|d| sample(d, t, i)).collect(),
            events: Vec::new(),
            ras: Vec::new(),
            kernels: None,
        };
        let t0 = Instant::now();
        for s in &tick.samples {
            history.push_sample(s);
        }
        let t1 = Instant::now();
        black_box(engine.on_tick(&history, &tick));
        let t2 = Instant::now();
        per_tick.push(t2 - t0);
        engine_only.push(t2 - t1);
    }
    let total = start.elapsed();
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        let mean = v.iter().sum::<Duration>() / v.len() as u32;
        (mean, v[v.len() * 99 / 100], v[v.len() - 1])
    };
    let (tick_mean, tick_p99, tick_max) = stats(&mut per_tick);
    let (eng_mean, eng_p99, eng_max) = stats(&mut engine_only);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "one hour, {DEVICES} GPUs, {} ms ticks ({HOUR_TICKS} ticks), {} findings raised",
        STEP_MS,
        engine.raised().len()
    );
    println!();
    println!("| measure | mean (µs) | p99 (µs) | max (µs) | share of the 100 ms interval (mean) |");
    println!("|---|---|---|---|---|");
    println!(
        "| per tick: history push + rule engine | {:.1} | {:.1} | {:.1} | {:.3}% |",
        us(tick_mean),
        us(tick_p99),
        us(tick_max),
        us(tick_mean) / 1e3
    );
    println!(
        "| rule engine alone (windowed rules once a second) | {:.1} | {:.1} | {:.1} | {:.3}% |",
        us(eng_mean),
        us(eng_p99),
        us(eng_max),
        us(eng_mean) / 1e3
    );
    println!();
    println!(
        "whole hour replayed through history and rules: {:.2} s ({:.0}x real time)",
        total.as_secs_f64(),
        3600.0 / total.as_secs_f64()
    );
    per_family(&history, &devices_for_families());
}

fn devices_for_families() -> Vec<DeviceInfo> {
    (0..DEVICES).map(device).collect()
}

/// Where one windowed evaluation of all devices spends its time, at the end of the hour.
fn per_family(history: &History, devices: &[DeviceInfo]) {
    let config = RulesConfig::default();
    let end = 1_767_225_600_000 + (HOUR_TICKS - 1) * STEP_MS;
    let latest: std::collections::BTreeMap<u32, Sample> = (0..DEVICES)
        .map(|d| (d, sample(d, end, HOUR_TICKS - 1)))
        .collect();
    let mut pm = ProcessMemory::default();
    let mut launches = ProcessLaunch::default();
    for i in (HOUR_TICKS - 6000..HOUR_TICKS).step_by(10) {
        for d in 0..DEVICES {
            let s = sample(d, 1_767_225_600_000 + i * STEP_MS, i);
            pm.observe(&s, 600_000);
            launches.observe(&s, Some("bench"));
        }
    }
    let input = RuleInput {
        devices,
        history,
        latest: &latest,
        events: &[],
        now_ms: end,
        config: &config,
        host: None,
        libraries: None,
        process_memory: Some(&pm),
        process_cpu: None,
        ras: None,
        own_pid: None,
        not_judged: Default::default(),
    };
    type Family = fn(&RuleInput<'_>) -> Vec<gpudiag_model::finding::Finding>;
    let families: [(&str, Family); 9] = [
        ("verdict, 30 s window", |i| {
            black_box(rules::bottleneck::judge_all(
                i,
                None,
                i.now_ms - 30_000,
                i.now_ms,
            ));
            Vec::new()
        }),
        ("verdict, the whole hour (check over a recording)", |i| {
            black_box(rules::bottleneck::judge_all(
                i,
                None,
                i.now_ms - 3_600_000,
                i.now_ms,
            ));
            Vec::new()
        }),
        ("errors", rules::errors::evaluate),
        ("utilisation", rules::utilisation::evaluate),
        ("throttle", rules::throttle::evaluate),
        ("pcie", rules::pcie::evaluate),
        ("memory (nearly full + leaks)", rules::memory::evaluate),
        ("thermal", rules::thermal::evaluate),
        ("all windowed families", rules::families::windowed),
    ];
    let command = std::collections::BTreeSet::new();
    let mut job_times: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            black_box(rules::job::judge_all(
                &input,
                &launches,
                &command,
                input.now_ms - 30_000,
                input.now_ms,
            ));
            t.elapsed()
        })
        .collect();
    job_times.sort();
    println!();
    println!(
        "job verdict, one job of {DEVICES} GPUs over a 30 s window (judged once a second, so \
         this is its CPU per second): {:.1} µs (median of 200)",
        job_times[100].as_secs_f64() * 1e6
    );
    println!();
    println!("| one evaluation of {DEVICES} GPUs, by family | µs (median of 200) |");
    println!("|---|---|");
    for (name, f) in families {
        let mut times: Vec<Duration> = (0..200)
            .map(|_| {
                let t = Instant::now();
                black_box(f(&input));
                t.elapsed()
            })
            .collect();
        times.sort();
        println!("| {name} | {:.1} |", times[100].as_secs_f64() * 1e6);
    }
}
