//! The bottleneck verdict: what held each GPU back over a window.
//!
//! NVML's utilisation says only that *a* kernel ran in each sampling period: one warp on one SM
//! reads 100%. The profiling counters (NVML GPM, what DCGM's profiling fields read) say how much
//! of the GPU the kernels used, so with them the verdict follows the usual performance triage:
//!
//! 1. Nothing runs: `idle`, or `idle_holding_memory` when a process holds memory.
//! 2. Clocks held down by heat or the power supply while busy: `throttled`.
//! 3. Host-device copies most of the time while the SMs idle: `copy_bound`.
//! 4. Kernels run most of the time (utilisation at or above `min_mean_util_pct`):
//!    SM active far below utilisation (`min_sm_fill`) means they leave most SMs empty
//!    (`underfilled`); otherwise DRAM or the pipes decide `memory_bound` against `compute_bound`.
//! 5. Kernels run a minority of the time: the GPU waits. Kernels that fill the SMs while they run
//!    mean the host is slow to feed them (`host_bound`); kernels that barely touch the SMs mean
//!    per-kernel overhead sets the pace: `launch_bound` while launches keep the GPU busy a fifth
//!    of the time or more, `sync_bound` below (a round trip per step leaves it idler still).
//!
//! CPU time alone cannot separate host-, launch- and sync-bound (a thread waiting in `.item()`
//! spins at 100% by default), so the process's CPU use is evidence, not a deciding rule.
//! Without profiling counters, steps 4 and 5 fall back to utilisation, PCIe and power, and the
//! verdict says it is weaker.

use std::collections::BTreeMap;

use serde_json::json;

use super::{RuleInput, process_state::ProcessCpu, round2};
use crate::history::Window;
use gpudiag_model::decode::pcie_link_rate;
use gpudiag_model::sample::{DeviceInfo, Metric, TimeMs};
use gpudiag_model::verdict::{Basis, Bottleneck, Confidence, NotJudged, Verdict, VerdictProcess};

const MIB: f64 = 1024.0 * 1024.0;
const GB: f64 = 1e9;

/// Throttle bits that slow a busy GPU against its will: HW slowdown, SW thermal, HW thermal, HW
/// power brake (the SW power cap is expected at full load and not a verdict of its own).
const HARMFUL_THROTTLE: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// The share of a window's samples with profiling counters below which the verdict says how much
/// they cover and lowers its confidence: GPM needs two samples before its first value, so one
/// sample in twenty may lack them on a healthy run.
const FULL_COVERAGE: f64 = 0.9;

/// The window's figures a verdict is judged from.
struct Figures {
    span_s: f64,
    util: f64,
    util_p95: Option<f64>,
    sm_active: Option<f64>,
    occupancy: Option<f64>,
    tensor: Option<f64>,
    dram: Option<f64>,
    fp64: Option<f64>,
    fp32: Option<f64>,
    fp16: Option<f64>,
    /// Share of the window the host moved at least 1 GB/s either way.
    copying_share: Option<f64>,
    rx_mean: Option<f64>,
    tx_mean: Option<f64>,
    power_share: Option<f64>,
    harmful_throttle_share: Option<f64>,
}

impl Figures {
    fn busiest_pipe(&self) -> Option<f64> {
        [self.tensor, self.fp64, self.fp32, self.fp16]
            .into_iter()
            .flatten()
            .reduce(f64::max)
    }

    fn evidence(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut v = serde_json::Map::new();
        let r = |x: Option<f64>| json!(x.map(round2));
        v.insert("gpu_util_mean_pct".into(), json!(round2(self.util)));
        v.insert("gpu_util_p95_pct".into(), r(self.util_p95));
        v.insert("sm_active_mean_pct".into(), r(self.sm_active));
        v.insert("sm_occupancy_mean_pct".into(), r(self.occupancy));
        v.insert("tensor_active_mean_pct".into(), r(self.tensor));
        v.insert("dram_active_mean_pct".into(), r(self.dram));
        v.insert("fp64_active_mean_pct".into(), r(self.fp64));
        v.insert("fp32_active_mean_pct".into(), r(self.fp32));
        v.insert("fp16_active_mean_pct".into(), r(self.fp16));
        v.insert(
            "pcie_rx_mean_mb_per_s".into(),
            r(self.rx_mean.map(|b| b / 1e6)),
        );
        v.insert(
            "pcie_tx_mean_mb_per_s".into(),
            r(self.tx_mean.map(|b| b / 1e6)),
        );
        v.insert("pcie_over_1gb_share".into(), r(self.copying_share));
        v.insert("power_share_of_limit".into(), r(self.power_share));
        v.insert(
            "harmful_throttle_share".into(),
            r(self.harmful_throttle_share),
        );
        v
    }
}

/// The rule name a verdict that could not be reached is listed under among the not-judged.
pub const VERDICT_RULE: &str = "verdict";

/// The verdict on `device` over `[start_ms, end_ms]`.
pub fn judge(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Result<Verdict, NotJudged> {
    judge_holders_from(input, cpu, device, start_ms, end_ms, start_ms)
}

/// The verdict on `device` over `[start_ms, end_ms]`, with the processes that hold memory
/// looked for from `holders_from` on: after a process let go of its memory, the figures of a
/// short span may reach back before that, but whether anyone holds memory is a question of now.
fn judge_holders_from(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
    holders_from: TimeMs,
) -> Result<Verdict, NotJudged> {
    let cfg = &input.config.utilisation;
    let d = device.index;
    let not_judged = |reason: String| NotJudged {
        rule: VERDICT_RULE.into(),
        device: Some(d),
        reason,
    };
    let range = Window::Range { start_ms, end_ms };
    let util = input.history.stats(d, Metric::GpuUtilPct, range);
    let span_s = util.span_ms().unwrap_or(0) as f64 / 1000.0;
    let Some(util_mean) = util.mean else {
        return Err(not_judged(
            "no utilisation reading in the window (the GPU does not report it)".into(),
        ));
    };
    if util.count < 2 || span_s < cfg.min_span_s {
        return Err(not_judged(format!(
            "{span_s:.1} s of data; a verdict needs at least {} s (a single read has no window: \
             use --window)",
            cfg.min_span_s
        )));
    }
    // The profiling counters may cover only part of the window (GPM lost mid-run, a recording
    // that kept them for some samples): their means describe the part they cover, so the
    // utilisation they are compared with is taken over that part too, the confidence follows
    // the share covered, and a long stretch without them is judged on its own.
    let sm_stats = input.history.stats(d, Metric::SmActivePct, range);
    let coverage = (sm_stats.count > 0)
        .then(|| (sm_stats.count as f64 / util.count as f64).min(1.0))
        .filter(|&c| c < FULL_COVERAGE);
    let util_mean = match (coverage, sm_stats.first_ms, sm_stats.last_ms) {
        (Some(_), Some(a), Some(b)) => input
            .history
            .mean(
                d,
                Metric::GpuUtilPct,
                Window::Range {
                    start_ms: a,
                    end_ms: b,
                },
            )
            .unwrap_or(util_mean),
        _ => util_mean,
    };
    let uncovered = match coverage.zip(sm_stats.first_ms.zip(sm_stats.last_ms)) {
        Some((_, (first, last))) => {
            let before = (start_ms, first.saturating_sub(1));
            let after = (last.saturating_add(1), end_ms);
            let longer = if before.1.saturating_sub(before.0) >= after.1.saturating_sub(after.0) {
                before
            } else {
                after
            };
            judge(input, cpu, device, longer.0, longer.1).ok()
        }
        None => None,
    };
    let mean = |m| input.history.mean(d, m, range);
    let share = |m, f: fn(f64) -> bool| input.history.fraction_where(d, m, range, f);
    let latest = input.latest.get(&d);
    // GPM's PCIe counters cover the whole interval; NVML's throughput call only ~20 ms of it.
    let (rx_metric, tx_metric) = if mean(Metric::ProfPcieRxBytesPerS).is_some() {
        (Metric::ProfPcieRxBytesPerS, Metric::ProfPcieTxBytesPerS)
    } else {
        (Metric::PcieRxBytesPerS, Metric::PcieTxBytesPerS)
    };
    let copying_share = match (share(rx_metric, |b| b >= GB), share(tx_metric, |b| b >= GB)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let limit = latest
        .and_then(|s| s.power_limit_w)
        .or(device.power_limit_default_w);
    let figures = Figures {
        span_s,
        util: util_mean,
        util_p95: util.p95,
        sm_active: sm_stats.mean,
        occupancy: mean(Metric::SmOccupancyPct),
        tensor: mean(Metric::TensorActivePct),
        dram: mean(Metric::DramActivePct),
        fp64: mean(Metric::Fp64ActivePct),
        fp32: mean(Metric::Fp32ActivePct),
        fp16: mean(Metric::Fp16ActivePct),
        copying_share,
        rx_mean: mean(rx_metric),
        tx_mean: mean(tx_metric),
        power_share: mean(Metric::PowerW).zip(limit).map(|(p, l)| p / l),
        harmful_throttle_share: share(Metric::ThrottleReasons, |bits| {
            (bits as u64) & HARMFUL_THROTTLE != 0
        }),
    };

    let holders = holders(input, cpu, d, holders_from.max(start_ms), end_ms);

    let (bottleneck, mut confidence, basis) = decide(&figures, !holders.is_empty(), cfg);
    let mut evidence = figures.evidence();
    evidence.insert("window_s".into(), json!(round2(span_s)));
    if let Some(share) = coverage {
        confidence = confidence.min(if share >= 0.5 {
            Confidence::Medium
        } else {
            Confidence::Low
        });
        evidence.insert("profiling_counter_coverage".into(), json!(round2(share)));
    }
    if let Some(u) = &uncovered {
        if u.bottleneck != bottleneck {
            confidence = Confidence::Low;
        }
        evidence.insert(
            "without_counters".into(),
            json!({
                "start_ms": u.start_ms,
                "end_ms": u.end_ms,
                "bottleneck": u.bottleneck,
            }),
        );
    }
    if let Some(p) = holders.first().filter(|_| holders.len() == 1) {
        evidence.insert("process_cpu_pct".into(), json!(p.cpu_pct));
    }
    let link = latest.and_then(|s| {
        pcie_link_rate(
            s.pcie_gen_max.or(device.pcie_gen_max)?,
            s.pcie_width_max.or(device.pcie_width_max)?,
        )
    });
    let mut title = title(d, bottleneck, &figures, &holders, coverage);
    if let Some(u) = &uncovered {
        title.push_str(&format!(
            "; the {:.0} s without profiling counters read {} on utilisation alone",
            u.end_ms.saturating_sub(u.start_ms) as f64 / 1000.0,
            u.bottleneck
        ));
    }
    let mut advice = advice(bottleneck, &figures, link.map(|l| l.bytes_per_s), basis);
    let idle = idle_holders(&holders);
    if !idle.is_empty() {
        let pids: Vec<String> = idle.iter().map(|p| p.pid.to_string()).collect();
        advice.push_str(&format!(
            " Process{} {} hold{} GPU memory and run{} no kernels beside the busy one: end \
             {} or free {} memory (torch.cuda.empty_cache() returns only cached blocks) so the \
             busy process can use it.",
            if idle.len() == 1 { "" } else { "es" },
            pids.join(", "),
            if idle.len() == 1 { "s" } else { "" },
            if idle.len() == 1 { "s" } else { "" },
            if idle.len() == 1 { "it" } else { "them" },
            if idle.len() == 1 { "its" } else { "their" },
        ));
    }
    Ok(Verdict {
        device: d,
        bottleneck,
        confidence,
        basis,
        start_ms: util.first_ms.unwrap_or(start_ms),
        end_ms: util.last_ms.unwrap_or(end_ms),
        title,
        evidence,
        advice,
        pid: (holders.len() == 1).then(|| holders[0].pid),
        processes: holders,
    })
}

/// The processes that held memory on the device in the window (from the per-process series
/// when kept, else the latest list), never gpudiag itself: its probes hold a context for a
/// moment and are not the job being judged.
pub(crate) fn holders(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: u32,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Vec<VerdictProcess> {
    let min_bytes = input.config.utilisation.min_process_memory_mib * MIB;
    let latest: Vec<_> = input
        .latest
        .get(&device)
        .and_then(|s| s.processes.as_ref())
        .into_iter()
        .flatten()
        .collect();
    let cpu_pct = |pid| {
        cpu.and_then(|c| c.cpu_pct(device, pid, start_ms, end_ms))
            .map(round2)
    };
    let found: Vec<(u32, Option<String>, Option<u64>)> = match input.process_memory {
        Some(pm) => pm
            .holders_in(device, start_ms, end_ms, min_bytes)
            .into_iter()
            .map(|(pid, name, most)| (pid, name, Some(most as u64)))
            .collect(),
        None => latest
            .iter()
            .filter(|p| p.used_memory_bytes.is_some_and(|b| b as f64 >= min_bytes))
            .map(|p| (p.pid, p.name.clone(), p.used_memory_bytes))
            .collect(),
    };
    found
        .into_iter()
        .filter(|(pid, _, _)| Some(*pid) != input.own_pid)
        .map(|(pid, name, used)| VerdictProcess {
            pid,
            name,
            used_memory_bytes: used,
            sm_util_pct: cpu
                .and_then(|c| c.sm_util_pct(device, pid, start_ms, end_ms))
                .map(round2)
                .or_else(|| {
                    latest
                        .iter()
                        .find(|p| p.pid == pid)
                        .and_then(|p| p.sm_util_pct)
                }),
            cpu_pct: cpu_pct(pid),
        })
        .collect()
}

fn decide(
    f: &Figures,
    held: bool,
    cfg: &crate::config::UtilisationConfig,
) -> (Bottleneck, Confidence, Basis) {
    use Bottleneck::*;
    use Confidence::*;
    let basis = if f.sm_active.is_some() {
        Basis::ProfilingCounters
    } else {
        Basis::Utilisation
    };
    let busy = cfg.min_mean_util_pct;
    let copying = f.copying_share.unwrap_or(0.0);
    let sm = f.sm_active;
    if f.util < cfg.idle_util_pct && sm.is_none_or(|s| s < 1.0) && copying < 0.1 {
        return (if held { IdleHoldingMemory } else { Idle }, High, basis);
    }
    if f.util >= busy && f.harmful_throttle_share.unwrap_or(0.0) >= 0.2 {
        return (Throttled, High, basis);
    }
    // Copies that overlap busy kernels are not the bottleneck.
    if copying >= 0.3 && sm.map_or(f.util < busy, |s| s < busy) {
        return (CopyBound, if sm.is_some() { High } else { Medium }, basis);
    }
    let Some(sm) = sm else {
        // Utilisation alone: busy or waiting, and for waiting, power tells a starved GPU from
        // one running many small kernels.
        return if f.util >= busy {
            (ComputeBound, Low, basis)
        } else if f.util < 10.0 && f.power_share.is_none_or(|p| p < 0.3) {
            (HostBound, Low, basis)
        } else {
            (LaunchBound, Low, basis)
        };
    };
    let fill = sm / f.util.max(1.0);
    let saturated = cfg.saturated_pct;
    if f.util >= busy {
        if fill < cfg.min_sm_fill {
            return (Underfilled, High, basis);
        }
        let dram = f.dram.unwrap_or(0.0);
        let pipe = f.busiest_pipe().unwrap_or(0.0);
        if dram >= saturated && dram >= pipe {
            return (MemoryBound, High, basis);
        }
        let confidence = if pipe >= saturated { High } else { Medium };
        return (ComputeBound, confidence, basis);
    }
    if fill >= cfg.min_sm_fill {
        return (HostBound, Medium, basis);
    }
    if f.util >= 20.0 {
        (LaunchBound, Medium, basis)
    } else {
        (SyncBound, Medium, basis)
    }
}

/// A share as text: small ones keep a decimal so 0.8% does not read as 1% or 0%. Rounded down:
/// the verdict's tests are `< threshold` or `>= threshold` (utilisation < 50%, SM active < 1%),
/// and a floor never shows a value on the other side of a round threshold ("50%" for 49.6).
fn pct(v: f64) -> String {
    if v < 10.0 {
        format!("{:.1}%", (v * 10.0).floor() / 10.0)
    } else {
        format!("{:.0}%", v.floor())
    }
}

fn opt_pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), pct)
}

fn title(
    device: u32,
    b: Bottleneck,
    f: &Figures,
    holders: &[VerdictProcess],
    coverage: Option<f64>,
) -> String {
    let over = match coverage {
        Some(c) => format!(
            "over {:.0} s, profiling counters in {} of it",
            f.span_s,
            pct(c * 100.0)
        ),
        None => format!("over {:.0} s", f.span_s),
    };
    let counters = if f.sm_active.is_some() {
        format!(
            "utilisation {}, SM active {}, occupancy {}",
            pct(f.util),
            opt_pct(f.sm_active),
            opt_pct(f.occupancy)
        )
    } else {
        format!("utilisation {}; no profiling counters", pct(f.util))
    };
    let who = match holders {
        [] => String::new(),
        [p] => format!(
            " · {} (pid {}{})",
            p.name.as_deref().unwrap_or("unknown"),
            p.pid,
            p.cpu_pct
                .map(|c| format!(", CPU {c:.0}%"))
                .unwrap_or_default()
        ),
        many => {
            let idle = idle_holders(many);
            let named: Vec<String> = idle
                .iter()
                .take(2)
                .map(|p| {
                    format!(
                        "{} (pid {}) holds {} and runs nothing",
                        p.name.as_deref().unwrap_or("unknown"),
                        p.pid,
                        gib(p.used_memory_bytes)
                    )
                })
                .collect();
            if named.is_empty() {
                format!(" · {} processes", many.len())
            } else {
                format!(" · {} processes; {}", many.len(), named.join("; "))
            }
        }
    };
    let what = match b {
        Bottleneck::ComputeBound => match (f.tensor, f.fp32) {
            (Some(t), _) if t >= 20.0 => format!(
                "compute-bound on tensor cores {over} (tensor {}, {counters})",
                pct(t)
            ),
            (Some(_), Some(fp32)) if fp32 >= 20.0 => format!(
                "compute-bound on FP32 pipes, tensor cores idle, {over} (FP32 {}, {counters})",
                pct(fp32)
            ),
            _ => format!("compute-bound {over} ({counters})"),
        },
        Bottleneck::MemoryBound => {
            format!("memory-bound {over} (DRAM {}, {counters})", opt_pct(f.dram))
        }
        Bottleneck::Underfilled => {
            format!("busy but its SMs mostly empty {over} ({counters})")
        }
        Bottleneck::LaunchBound => format!(
            "launch-bound {over}: kernels too small to fill the GPU and gaps between them \
             ({counters})"
        ),
        Bottleneck::HostBound => format!("waiting on the host {over} ({counters})"),
        Bottleneck::CopyBound => format!(
            "copy-bound {over}: host-device copies {} of the time ({counters})",
            opt_pct(f.copying_share.map(|s| s * 100.0))
        ),
        Bottleneck::SyncBound => {
            format!("sync-bound {over}: tiny kernels and long waits between steps ({counters})")
        }
        Bottleneck::IdleHoldingMemory => {
            format!("idle while holding memory {over} ({counters})")
        }
        Bottleneck::Throttled => format!(
            "throttled {over}: clocks held down by heat or power {} of the time ({counters})",
            opt_pct(f.harmful_throttle_share.map(|s| s * 100.0))
        ),
        Bottleneck::Idle => format!("idle {over}"),
        // Decided by the job's rule, which writes its own title; this one stands only where a
        // GPU verdict is built from figures alone.
        Bottleneck::WaitingForPeer => format!("waiting for a peer GPU {over} ({counters})"),
    };
    format!("GPU {device} {what}{who}")
}

/// Processes that hold memory on a GPU where another process runs kernels, while they run none
/// themselves over the window (driver-reported SM use under 1%): a parked notebook or a stuck
/// rank keeping memory others could use. Only named where the driver reports per-process SM use
/// for every holder, since an unknown share is not an idle one.
fn idle_holders(holders: &[VerdictProcess]) -> Vec<&VerdictProcess> {
    let all_known = holders.iter().all(|p| p.sm_util_pct.is_some());
    let someone_busy = holders
        .iter()
        .any(|p| p.sm_util_pct.is_some_and(|u| u >= 5.0));
    if !all_known || !someone_busy {
        return Vec::new();
    }
    holders
        .iter()
        .filter(|p| p.sm_util_pct.is_some_and(|u| u < 1.0))
        .collect()
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "memory".to_owned(),
        |b| format!("{:.1} GiB", b as f64 / (1024.0 * MIB)),
    )
}

fn advice(b: Bottleneck, f: &Figures, link_bytes_per_s: Option<f64>, basis: Basis) -> String {
    let mut text = match b {
        Bottleneck::ComputeBound if basis == Basis::Utilisation => "Kernels run most of the \
            time, but without profiling counters gpudiag cannot tell full SMs from a single warp: \
            profile the top kernels (Nsight Systems, torch.profiler) to see whether they fill \
            the GPU, and use bf16 or TF32 so matmuls run on tensor cores."
            .to_owned(),
        Bottleneck::ComputeBound => {
            if f.tensor.is_some_and(|t| t >= 20.0) {
                "The GPU does useful work on its tensor cores: this is the good case. Gains now \
                 come from less work (fused kernels, torch.compile, FlashAttention) or lower \
                 precision (FP8 where the model tolerates it)."
                    .to_owned()
            } else if f.fp32.is_some_and(|v| v >= 20.0) && f.tensor.is_some_and(|t| t < 5.0) {
                "FP32 pipes are busy and tensor cores idle: enable TF32 \
                 (torch.backends.cuda.matmul.allow_tf32 = True, torch.set_float32_matmul_precision(\
                 'high')) or train in bf16 with torch.autocast; matmuls then run on tensor cores, \
                 several times faster."
                    .to_owned()
            } else {
                "The SMs are busy but no pipe is saturated: kernels are latency- or \
                 occupancy-limited. Profile the top kernels (Nsight Compute); larger tiles or \
                 batches, fused element-wise work, and bf16 help most."
                    .to_owned()
            }
        }
        Bottleneck::MemoryBound => "Kernels wait on DRAM: fuse element-wise operations so data \
                                    is read once (torch.compile), use bf16/fp16 to halve the \
                                    bytes, and keep tensors contiguous."
            .to_owned(),
        Bottleneck::Underfilled => "Kernels run but leave most SMs empty: launch more work per \
                                    kernel (larger batch, more blocks than SMs), run independent \
                                    work on several streams, and avoid single-block or \
                                    single-thread kernels."
            .to_owned(),
        Bottleneck::LaunchBound | Bottleneck::SyncBound => "Many tiny kernels with the CPU \
                                                            in the loop: raise the batch size, \
                                                            remove per-step .item()/.cpu()/\
                                                            torch.cuda.synchronize() calls \
                                                            (log every N steps), fuse small \
                                                            operations with torch.compile, or \
                                                            capture the step in CUDA graphs \
                                                            (torch.compile mode=\
                                                            'reduce-overhead')."
            .to_owned(),
        Bottleneck::HostBound => "The GPU finishes its work quickly, then waits for the host: \
                                  profile the CPU side (py-spy, torch.profiler); add DataLoader \
                                  workers (num_workers), prefetching and persistent_workers, \
                                  and move preprocessing onto the GPU."
            .to_owned(),
        Bottleneck::CopyBound => {
            let mut t = "Host-device copies dominate: pin host memory (DataLoader \
                         pin_memory=True), copy with non_blocking=True so copies overlap \
                         compute, and keep data resident on the GPU instead of copying it every \
                         step."
                .to_owned();
            let moved = f.rx_mean.unwrap_or(0.0).max(f.tx_mean.unwrap_or(0.0));
            if let (Some(link), Some(share)) = (link_bytes_per_s, f.copying_share)
                && share > 0.0
                && moved / share < 0.4 * link
            {
                t.push_str(&format!(
                    " While copying, the link carried about {:.1} GB/s of its {:.0} GB/s: \
                     pageable (unpinned) memory is the usual cause.",
                    moved / share / 1e9,
                    link / 1e9
                ));
            }
            t
        }
        Bottleneck::IdleHoldingMemory => "A process holds GPU memory and runs nothing: if it \
                                          is a parked notebook or a server between requests, \
                                          release the GPU for others; if it should be training, \
                                          it is stuck before its first kernel (data loading, a \
                                          deadlock, a collective waiting for a peer)."
            .to_owned(),
        Bottleneck::Throttled => "Clocks are held down by temperature or the power supply: \
                                  check cooling (fans, airflow, inlet temperature) and the \
                                  board's power; see the throttle findings for the reason."
            .to_owned(),
        Bottleneck::Idle => "Nothing runs on this GPU.".to_owned(),
        Bottleneck::WaitingForPeer => "This GPU waits for another GPU of its job: speed up \
                                       that GPU (see the job's verdict), not this one."
            .to_owned(),
    };
    if basis == Basis::Utilisation && !matches!(b, Bottleneck::Idle) {
        text.push_str(
            " (Judged from NVML utilisation only, which counts any running kernel as busy: \
             without profiling counters the verdict is weaker.)",
        );
    }
    text
}

/// The length of a phase slice over a window of `span_ms`: at least 10 s, at most 20 slices.
pub(crate) fn slice_ms(span_ms: u64) -> u64 {
    (span_ms / 20).max(10_000)
}

/// Verdicts over consecutive slices of `[start_ms, end_ms]`, neighbours with the same
/// bottleneck and basis merged (a stretch without profiling counters is a phase of its own),
/// each with the number of slices merged into it. The merged verdicts keep their first slice's
/// figures: `phases` judges them again where it needs their words.
fn merged_slices(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Vec<(Verdict, usize)> {
    let step = slice_ms(end_ms.saturating_sub(start_ms));
    let mut spans: Vec<(Verdict, usize)> = Vec::new();
    let mut at = start_ms;
    while at < end_ms {
        let to = at.saturating_add(step).min(end_ms);
        if let Ok(v) = judge(input, cpu, device, at, to) {
            match spans.last_mut() {
                Some((prev, slices)) if same_phase(prev, &v) => {
                    prev.end_ms = v.end_ms;
                    *slices += 1;
                }
                _ => spans.push((v, 1)),
            }
        }
        at = to.saturating_add(1);
    }
    spans
}

/// Verdicts over consecutive slices of `[start_ms, end_ms]`, neighbours with the same
/// bottleneck merged: how a run changed (loading, training, evaluation).
pub fn phases(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Vec<Verdict> {
    // A merged phase is judged again over its whole span, so its title, figures and evidence
    // describe all of it rather than its first slice.
    merged_slices(input, cpu, device, start_ms, end_ms)
        .into_iter()
        .map(|(v, slices)| {
            if slices == 1 {
                return v;
            }
            judge(input, cpu, device, v.start_ms, v.end_ms).unwrap_or(v)
        })
        .collect()
}

/// Launch- and sync-bound are one pattern on either side of a utilisation threshold (tiny
/// kernels with the CPU in the loop); a run that wavers across it is one phase, not many.
fn same_phase(a: &Verdict, b: &Verdict) -> bool {
    use Bottleneck::{LaunchBound, SyncBound};
    a.basis == b.basis
        && (a.bottleneck == b.bottleneck
            || matches!(
                (a.bottleneck, b.bottleneck),
                (LaunchBound, SyncBound) | (SyncBound, LaunchBound)
            ))
}

/// The phase a window ends in: what runs now, and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct CurrentPhase {
    /// When the phase began, to the slice (10 s or more) that [`phases`] judges by.
    pub since_ms: TimeMs,
    /// The verdict on the phase's most recent slice: its first slice may straddle the change
    /// (half idle, half spin) and would blend the figures again.
    pub verdict: Verdict,
}

impl CurrentPhase {
    /// How long the phase has lasted, in seconds.
    pub fn duration_s(&self) -> f64 {
        self.verdict.end_ms.saturating_sub(self.since_ms) as f64 / 1000.0
    }
}

/// The phase `[start_ms, end_ms]` ends in, when the window holds more than one: a window's
/// verdict blends what came before with what runs now (idle seconds then a one-warp spin read
/// as launch-bound, utilisation 36%, while the spin itself reads 100%), so a live view leads
/// with this one. A process that let go of the GPU's memory ends a phase where it left, not at
/// a slice's edge ([`since_release`]). `None` when the window is one phase (its verdict
/// already says what runs now) or no slice of it could be judged.
pub fn current_phase(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Option<CurrentPhase> {
    if let Some(idle) = since_release(input, cpu, device, start_ms, end_ms) {
        return Some(idle);
    }
    // The merged phases unjudged again: only the last one's start is used, and its figures
    // come from its latest slice below (this runs each second in the TUI).
    let all = merged_slices(input, cpu, device, start_ms, end_ms);
    let last = match all.as_slice() {
        [_, .., (last, _)] => last,
        _ => return None,
    };
    let step = slice_ms(end_ms.saturating_sub(start_ms));
    let recent_from = end_ms.saturating_sub(step).max(last.start_ms);
    let verdict = judge(input, cpu, device, recent_from, end_ms)
        .ok()
        .filter(|v| same_phase(v, last))
        .or_else(|| judge(input, cpu, device, last.start_ms, last.end_ms).ok())
        .unwrap_or_else(|| last.clone());
    Some(CurrentPhase {
        since_ms: last.start_ms,
        verdict,
    })
}

/// The GPU idle since the last process holding its memory let go of it within the window,
/// while nothing holds memory now: the window, and the slice it ends in, still count that
/// process among the holders for up to a window, and would call the GPU
/// `idle_holding_memory` beside a process list that is empty. The span judged starts where the
/// process left, or reaches back the shortest span a verdict needs while that is not yet
/// over; only an `idle` verdict is taken, so a GPU busy until the process left is not called
/// idle on figures from before it. `None` where no process left, one still holds memory, or
/// the process lists are not kept.
fn since_release(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Option<CurrentPhase> {
    let cfg = &input.config.utilisation;
    let min_bytes = cfg.min_process_memory_mib * MIB;
    let own_pid = input.own_pid;
    let listed = input.latest.get(&device.index)?.processes.as_ref()?;
    let held_now = listed.iter().any(|p| {
        Some(p.pid) != own_pid && p.used_memory_bytes.is_some_and(|b| b as f64 >= min_bytes)
    });
    if held_now {
        return None;
    }
    let released =
        input
            .process_memory?
            .last_held(device.index, start_ms, end_ms, min_bytes, own_pid)?;
    let since = released.saturating_add(1);
    let min_span_ms = (cfg.min_span_s * 1000.0) as u64;
    let from = if end_ms.saturating_sub(since) >= min_span_ms {
        since
    } else {
        end_ms.saturating_sub(min_span_ms).max(start_ms)
    };
    let verdict = judge_holders_from(input, cpu, device, from, end_ms, since).ok()?;
    (verdict.bottleneck == Bottleneck::Idle).then_some(CurrentPhase {
        since_ms: since,
        verdict,
    })
}

/// The figures that decide most verdicts, in a few words for a one-line view: "utilisation
/// 100%, SM active 0.9%", without SM active where the GPU has no profiling counters.
/// A headline of a window of phases ([`headline`]) gives first the share of the window its
/// bottleneck held, since its figures are its longest phase's: "48% of it; utilisation 99%, …".
pub fn brief(v: &Verdict) -> String {
    let figure = |key: &str| v.evidence.get(key).and_then(serde_json::Value::as_f64);
    let util = figure("gpu_util_mean_pct").map_or_else(|| "n/a".to_owned(), pct);
    let share = v
        .evidence
        .get("phase_shares")
        .and_then(|s| s.get(v.bottleneck.name()))
        .and_then(serde_json::Value::as_f64)
        .map(|s| format!("{} of it; ", pct(s * 100.0)))
        .unwrap_or_default();
    match figure("sm_active_mean_pct") {
        Some(sm) => format!("{share}utilisation {util}, SM active {}", pct(sm)),
        None => format!("{share}utilisation {util}"),
    }
}

/// The verdict that speaks for the whole of `[start_ms, end_ms]`. A window of several phases
/// blends them, and its means may read as a bottleneck that held a minority of it (the demo's
/// 30 s copy-bound, 30 s compute-bound and 30 s idle read compute-bound, "the good case"; on
/// an H100, ResNet-50 training's 10 s compute-bound then 36 s memory-bound read compute-bound).
/// Where what the whole window reads held less than half of it, the headline is the bottleneck
/// that held the most time (a wasteful one before idle or good use when they are within five
/// points), judged over its longest phase, with every bottleneck's share in its title.
pub fn headline(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: &DeviceInfo,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Result<Verdict, NotJudged> {
    let whole = judge(input, cpu, device, start_ms, end_ms)?;
    let phases = merged_slices(input, cpu, device, start_ms, end_ms);
    let span = |v: &Verdict| v.end_ms.saturating_sub(v.start_ms);
    let total: u64 = phases.iter().map(|(v, _)| span(v)).sum();
    if phases.len() < 2 || total == 0 {
        return Ok(whole);
    }
    let mut shares: Vec<(Bottleneck, f64)> = Vec::new();
    for (v, _) in &phases {
        let share = span(v) as f64 / total as f64;
        match shares.iter_mut().find(|(b, _)| *b == v.bottleneck) {
            Some((_, s)) => *s += share,
            None => shares.push((v.bottleneck, share)),
        }
    }
    let share_of = |b: Bottleneck| {
        shares
            .iter()
            .find(|(x, _)| *x == b)
            .map_or(0.0, |&(_, s)| s)
    };
    if share_of(whole.bottleneck) >= 0.5 {
        return Ok(whole);
    }
    // Largest share first; within five points, what wastes the GPU before an idle GPU, and
    // both before good use.
    let cost = |b: Bottleneck| match b {
        _ if b.is_waste() => 0,
        Bottleneck::Idle => 1,
        _ => 2,
    };
    shares.sort_by(|a, b| b.1.total_cmp(&a.1));
    let most = shares[0].1;
    let Some(&(lead, lead_share)) = shares
        .iter()
        .filter(|(_, s)| most - s <= 0.05)
        .min_by_key(|(b, _)| cost(*b))
    else {
        return Ok(whole);
    };
    let Some(longest) = phases
        .iter()
        .map(|(v, _)| v)
        .filter(|v| v.bottleneck == lead)
        .max_by_key(|v| span(v))
    else {
        return Ok(whole);
    };
    let mut v = judge(input, cpu, device, longest.start_ms, longest.end_ms)
        .unwrap_or_else(|_| longest.clone());
    let named = |b: Bottleneck| b.name().replace('_', "-");
    let mix: Vec<String> = shares
        .iter()
        .map(|&(b, s)| format!("{} {}", named(b), pct(s * 100.0)))
        .collect();
    v.title = format!(
        "a window of phases, mostly {} ({}): {}; its longest {} phase ({:.0} s): {}",
        named(lead),
        pct(lead_share * 100.0),
        mix.join(", "),
        named(lead),
        v.window_s(),
        v.title
    );
    if lead == Bottleneck::ComputeBound {
        v.advice = v.advice.replace(
            "this is the good case",
            "the good case, for part of the window only: see the phases for the rest",
        );
    }
    v.evidence.insert(
        "phase_shares".into(),
        serde_json::Value::Object(
            shares
                .iter()
                .map(|&(b, s)| (b.name().to_owned(), json!(round2(s))))
                .collect(),
        ),
    );
    v.evidence.insert(
        "whole_window_bottleneck".into(),
        json!(whole.bottleneck.name()),
    );
    v.evidence
        .insert("phase_start_ms".into(), json!(v.start_ms));
    v.evidence.insert("phase_end_ms".into(), json!(v.end_ms));
    v.start_ms = whole.start_ms;
    v.end_ms = whole.end_ms;
    v.confidence = v.confidence.min(Confidence::Medium);
    Ok(v)
}

/// Verdicts for every device over one window, or why not.
pub fn judge_all(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> (BTreeMap<u32, Verdict>, Vec<NotJudged>) {
    let mut verdicts = BTreeMap::new();
    let mut not_judged = Vec::new();
    for d in input.devices {
        match headline(input, cpu, d, start_ms, end_ms) {
            Ok(v) => {
                verdicts.insert(d.index, v);
            }
            Err(n) => not_judged.push(n),
        }
    }
    (verdicts, not_judged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UtilisationConfig;
    use gpudiag_model::sample::Sample;

    #[test]
    fn shares_never_round_up_onto_a_threshold() {
        // 49.6% fails "utilisation < 50%"; printed as 50% the title contradicts its threshold.
        assert_eq!(pct(49.6), "49%");
        assert_eq!(pct(50.0), "50%");
        assert_eq!(pct(0.96), "0.9%");
        assert_eq!(pct(9.97), "9.9%");
    }

    fn figures(util: f64, sm: Option<f64>) -> Figures {
        Figures {
            span_s: 40.0,
            util,
            util_p95: Some(util),
            sm_active: sm,
            occupancy: sm.map(|s| s / 4.0),
            tensor: sm.map(|_| 0.0),
            dram: sm.map(|_| 0.0),
            fp64: sm.map(|_| 0.0),
            fp32: sm.map(|_| 0.0),
            fp16: sm.map(|_| 0.0),
            copying_share: Some(0.0),
            rx_mean: Some(0.0),
            tx_mean: Some(0.0),
            power_share: Some(0.2),
            harmful_throttle_share: Some(0.0),
        }
    }

    fn verdict(f: &Figures, held: bool) -> Bottleneck {
        decide(f, held, &UtilisationConfig::default()).0
    }

    /// The workloads measured on an H200 (the profiling-counter issue's table), by their means.
    #[test]
    fn the_measured_workloads_get_their_bottleneck() {
        // A single-thread spin kernel back to back: 100% "utilised", SMs empty.
        assert_eq!(
            verdict(&figures(100.0, Some(0.8)), true),
            Bottleneck::Underfilled
        );
        // Tiny kernels and an .item() each step.
        assert_eq!(
            verdict(&figures(33.0, Some(0.0)), true),
            Bottleneck::LaunchBound
        );
        // bf16 matmuls.
        let mut bf16 = figures(100.0, Some(96.5));
        bf16.tensor = Some(94.0);
        bf16.dram = Some(16.0);
        assert_eq!(
            decide(&bf16, true, &UtilisationConfig::default()),
            (
                Bottleneck::ComputeBound,
                Confidence::High,
                Basis::ProfilingCounters
            )
        );
        assert!(title(0, Bottleneck::ComputeBound, &bf16, &[], None).contains("tensor cores"));
        // Pageable 256 MiB host-to-device copies each step.
        let mut copies = figures(20.0, Some(1.0));
        copies.copying_share = Some(0.6);
        assert_eq!(verdict(&copies, true), Bottleneck::CopyBound);
        // Sleep 80 ms, then 40 matmuls.
        assert_eq!(
            verdict(&figures(10.0, Some(6.6)), true),
            Bottleneck::HostBound
        );
        // A process that allocated and waits.
        assert_eq!(
            verdict(&figures(0.0, Some(0.0)), true),
            Bottleneck::IdleHoldingMemory
        );
        assert_eq!(verdict(&figures(0.0, Some(0.0)), false), Bottleneck::Idle);
    }

    #[test]
    fn dram_against_pipes_and_fp32_without_tensor_cores() {
        let mut stream = figures(100.0, Some(99.0));
        stream.dram = Some(88.0);
        stream.fp32 = Some(12.0);
        assert_eq!(verdict(&stream, true), Bottleneck::MemoryBound);
        let mut fp32 = figures(100.0, Some(98.0));
        fp32.fp32 = Some(70.0);
        assert_eq!(verdict(&fp32, true), Bottleneck::ComputeBound);
        let advice = advice(
            Bottleneck::ComputeBound,
            &fp32,
            None,
            Basis::ProfilingCounters,
        );
        assert!(advice.contains("TF32"), "{advice}");
    }

    #[test]
    fn without_profiling_counters_the_verdict_says_it_is_weaker() {
        let f = figures(100.0, None);
        let (b, c, basis) = decide(&f, true, &UtilisationConfig::default());
        assert_eq!(
            (b, c, basis),
            (
                Bottleneck::ComputeBound,
                Confidence::Low,
                Basis::Utilisation
            )
        );
        assert!(advice(b, &f, None, basis).contains("verdict is weaker"));
        // Busy kernels overlapping copies are not copy-bound.
        let mut overlapped = figures(90.0, None);
        overlapped.copying_share = Some(0.8);
        assert_eq!(verdict(&overlapped, true), Bottleneck::ComputeBound);
    }

    #[test]
    fn heat_or_the_power_supply_holding_clocks_down_is_throttled() {
        let mut hot = figures(100.0, Some(90.0));
        hot.harmful_throttle_share = Some(0.5);
        assert_eq!(verdict(&hot, true), Bottleneck::Throttled);
    }

    #[test]
    fn cpu_share_comes_from_proc_time_over_the_window() {
        let mut cpu = ProcessCpu::default();
        for i in 0..=10u64 {
            let mut s = Sample::new(0, 1_000_000 + i * 1000);
            s.processes = Some(vec![gpudiag_model::sample::ProcessSample {
                pid: 9,
                name: None,
                user: None,
                kind: None,
                used_memory_bytes: None,
                sm_util_pct: None,
                container_id: None,
                container_pid: None,
                cpu_time_s: Some(i as f64 * 0.5),
                attribution: None,
                launch: None,
                state: None,
                started_ms: None,
            }]);
            cpu.observe(&s);
        }
        let pct = cpu.cpu_pct(0, 9, 1_000_000, 1_010_000).unwrap();
        assert!((pct - 50.0).abs() < 1e-9, "{pct}");
        assert_eq!(cpu.cpu_pct(0, 10, 1_000_000, 1_010_000), None);
    }
}
