//! The bottleneck verdict from kernel records, where `run --kernels` has them: the counters say
//! what kind of time a GPU lost; the records say which call, kernel or copy lost it, measured.
//! A verdict from records replaces the counters' one (basis `kernels`, high confidence) only
//! when the records show a waste clearly; otherwise the counters' verdict stands unchanged.

use serde_json::{Map, json};

use gpudiag_model::job::JobVerdict;
use gpudiag_model::kernels::{HostMemory, KernelsGpu, KernelsProcess, KernelsSummary};
use gpudiag_model::sample::TimeMs;
use gpudiag_model::verdict::{Basis, Bottleneck, Confidence, Verdict};

/// A process's host blocked in one synchronisation call this share of its time or more …
pub const SYNC_BOUND_HOST_SHARE: f64 = 0.25;
/// … while its GPU sat idle this share of the span or more: the GPU waits on the host's wait.
pub const SYNC_BOUND_GPU_IDLE: f64 = 0.2;
/// Copies (where no kernel ran) took this share of the GPU's span or more.
pub const COPY_BOUND_SHARE: f64 = 0.4;
/// Kernels this short on average, this many a second, with the GPU idle between them this
/// share of the span: launching costs more than running.
pub const LAUNCH_BOUND_MEAN_US: f64 = 20.0;
pub const LAUNCH_BOUND_RATE: f64 = 5_000.0;
pub const LAUNCH_BOUND_GPU_IDLE: f64 = 0.3;
/// A kernel with fewer blocks than this leaves most SMs of any datacenter GPU empty (the
/// smallest have 40 or more) …
pub const UNDERFILLED_BLOCKS: u64 = 16;
/// … when it holds this share of the busy time.
pub const UNDERFILLED_SHARE: f64 = 0.5;

/// What a run's records conclude, for `run --kernels` at its end and for `check` of its
/// recording: each GPU's verdict (`verdicts`: its index and the counters' verdict) rests on its
/// records where they show a waste clearly, the counters' bottleneck kept in the evidence
/// (`counters_bottleneck`); each job's verdict notes its ranks' NCCL shares. `summary` has its
/// GPUs matched to indices ([`super::match_devices`]); `[start_ms, end_ms]` is the run.
pub fn conclude<'a>(
    summary: &KernelsSummary,
    verdicts: impl IntoIterator<Item = (u32, &'a mut Option<Verdict>)>,
    jobs: &mut [JobVerdict],
    start_ms: TimeMs,
    end_ms: TimeMs,
) {
    for (index, verdict) in verdicts {
        let Some(gpu) = summary.gpus.iter().find(|g| g.index == Some(index)) else {
            continue;
        };
        let judged = judge(
            index,
            gpu,
            &summary.processes,
            verdict.as_ref(),
            start_ms,
            end_ms,
        );
        if let Some(mut v) = judged {
            if let Some(counters) = verdict.as_ref() {
                v.evidence.insert(
                    "counters_bottleneck".into(),
                    counters.bottleneck.name().into(),
                );
            }
            *verdict = Some(v);
        }
    }
    super::jobs::note_nccl_shares(jobs, summary);
}

/// The verdict on `device` from its kernel records, or `None` when they show no clear waste
/// (the counters' verdict, `counters`, then stands). The window is the counters' verdict's when
/// there is one, else `[start_ms, end_ms]`.
pub fn judge(
    device: u32,
    gpu: &KernelsGpu,
    processes: &[KernelsProcess],
    counters: Option<&Verdict>,
    start_ms: TimeMs,
    end_ms: TimeMs,
) -> Option<Verdict> {
    let span = gpu.time.span_s;
    if span <= 0.0 {
        return None;
    }
    let idle = gpu.time.idle_s / span;
    let mine: Vec<&KernelsProcess> = processes
        .iter()
        .filter(|p| gpu.pids.contains(&p.pid))
        .collect();
    let mut evidence = Map::new();
    evidence.insert("gpu_span_s".into(), json!(round(span, 3)));
    evidence.insert("gpu_idle_share".into(), json!(round(idle, 3)));
    evidence.insert("kernels".into(), json!(gpu.kernels));
    if let Some(rate) = gpu.kernels_per_s {
        evidence.insert("kernels_per_s".into(), json!(round(rate, 0)));
    }
    if let Some(mean) = gpu.mean_kernel_us {
        evidence.insert("mean_kernel_us".into(), json!(round(mean, 2)));
    }

    let (bottleneck, title, advice) = if let Some((pid, sync)) = worst_sync(&mine)
        && idle >= SYNC_BOUND_GPU_IDLE
    {
        let share = sync.share_of_host.unwrap_or_default();
        evidence.insert("sync_call".into(), json!(sync.call_name));
        evidence.insert("sync_pid".into(), json!(pid));
        evidence.insert(
            "sync_per_s".into(),
            json!(round(sync.per_s.unwrap_or_default(), 1)),
        );
        evidence.insert("sync_host_share".into(), json!(round(share, 3)));
        (
            Bottleneck::SyncBound,
            format!(
                "{} {} a second, {:.0}% of the host's time (pid {pid}); the GPU idles {:.0}% of \
                 the {:.1} s it ran",
                sync.call_name,
                grouped(sync.per_s.unwrap_or_default()),
                share * 100.0,
                idle * 100.0,
                span
            ),
            format!(
                "Each {} makes the host wait for the GPU and the GPU then wait for the host. \
                 Find what calls it (`.item()`, `.cpu()`, `.tolist()`, `print` of a tensor, \
                 `torch.cuda.synchronize()`): keep values on the GPU, read them every N steps, \
                 or copy with `non_blocking=True` into pinned memory and read them a step later.",
                sync.call_name
            ),
        )
    } else if gpu.time.copy_s / span >= COPY_BOUND_SHARE {
        let copy_share = gpu.time.copy_s / span;
        evidence.insert("copy_share".into(), json!(round(copy_share, 3)));
        let pageable: Vec<_> = gpu
            .copies
            .iter()
            .filter(|c| c.host_memory == HostMemory::Pageable)
            .collect();
        let top = pageable.first().copied().or(gpu.copies.first());
        let what = match top {
            Some(c) => {
                evidence.insert("copy_direction".into(), json!(c.direction));
                evidence.insert("copy_host_memory".into(), json!(c.host_memory));
                evidence.insert("copy_count".into(), json!(c.count));
                evidence.insert("copy_bytes".into(), json!(c.bytes));
                format!(
                    "{} {} {} cop{} of {} on average{}",
                    grouped(c.count as f64),
                    memory_name(c.host_memory),
                    direction_name(c),
                    if c.count == 1 { "y" } else { "ies" },
                    bytes(c.bytes / c.count.max(1)),
                    c.gb_per_s
                        .map(|g| format!(" at {g:.1} GB/s"))
                        .unwrap_or_default()
                )
            }
            None => "copies".into(),
        };
        let pageable_advice = if pageable.is_empty() {
            ""
        } else {
            " Pageable copies are staged by the driver and block the host: use pinned memory \
             (`pin_memory=True` in the DataLoader, `tensor.pin_memory()`) and \
             `non_blocking=True`."
        };
        (
            Bottleneck::CopyBound,
            format!(
                "copies take {:.0}% of the GPU's {:.1} s: {what}",
                copy_share * 100.0,
                span
            ),
            format!(
                "Copy less and overlap the rest: keep data on the GPU between steps, prefetch the \
                 next batch on a side stream.{pageable_advice}"
            ),
        )
    } else if let (Some(rate), Some(mean)) = (gpu.kernels_per_s, gpu.mean_kernel_us)
        && mean <= LAUNCH_BOUND_MEAN_US
        && rate >= LAUNCH_BOUND_RATE
        && idle >= LAUNCH_BOUND_GPU_IDLE
    {
        (
            Bottleneck::LaunchBound,
            format!(
                "{} kernels a second averaging {mean:.1} µs; the GPU idles {:.0}% between them",
                grouped(rate),
                idle * 100.0
            ),
            "Launching each kernel costs the host a few µs, more than these kernels run: fuse \
             them (`torch.compile`), capture the step in a CUDA graph (`torch.compile(mode=\"reduce-overhead\")`, \
             `torch.cuda.graphs`), or give each kernel more work (larger batches)."
                .into(),
        )
    } else if let Some(k) = gpu.top_kernels.first()
        && k.share_of_busy >= UNDERFILLED_SHARE
        && !k.nccl
        && (blocks(k.grid) < UNDERFILLED_BLOCKS
            || counters.is_some_and(|v| v.bottleneck == Bottleneck::Underfilled))
    {
        evidence.insert("kernel".into(), json!(k.name));
        evidence.insert(
            "kernel_share_of_busy".into(),
            json!(round(k.share_of_busy, 3)),
        );
        evidence.insert("grid".into(), json!(k.grid));
        evidence.insert("block".into(), json!(k.block));
        (
            Bottleneck::Underfilled,
            format!(
                "{} takes {:.0}% of the GPU's busy time with a grid of {} block{} of {} threads",
                k.short_name,
                k.share_of_busy * 100.0,
                grouped(blocks(k.grid) as f64),
                if blocks(k.grid) == 1 { "" } else { "s" },
                grouped(blocks(k.block) as f64)
            ),
            "Its grid leaves most SMs empty: give it more work per launch (a larger batch, \
             several problems batched into one call), or run independent work beside it on \
             other streams."
                .into(),
        )
    } else {
        return None;
    };
    let (start_ms, end_ms, processes_held) = match counters {
        Some(v) => (v.start_ms, v.end_ms, v.processes.clone()),
        None => (start_ms, end_ms, Vec::new()),
    };
    Some(Verdict {
        device,
        bottleneck,
        confidence: Confidence::High,
        basis: Basis::Kernels,
        start_ms,
        end_ms,
        title,
        evidence,
        advice,
        pid: (mine.len() == 1).then(|| mine[0].pid),
        processes: processes_held,
    })
}

/// The blocking call that took the largest share of some process's host time, at or above
/// the threshold.
fn worst_sync<'a>(
    processes: &[&'a KernelsProcess],
) -> Option<(u32, &'a gpudiag_model::kernels::SyncStat)> {
    processes
        .iter()
        .flat_map(|p| p.syncs.iter().map(move |s| (p.pid, s)))
        .filter(|(_, s)| s.call.blocks_host())
        .filter(|(_, s)| s.share_of_host.is_some_and(|x| x >= SYNC_BOUND_HOST_SHARE))
        .max_by(|a, b| {
            a.1.share_of_host
                .unwrap_or_default()
                .total_cmp(&b.1.share_of_host.unwrap_or_default())
        })
}

fn blocks(dims: [u32; 3]) -> u64 {
    dims.iter().map(|&d| u64::from(d)).product()
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// 4100 → "4,100"; fractions are dropped.
pub fn grouped(v: f64) -> String {
    let n = v.round().max(0.0) as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in the unit a reader expects: "512 B", "64 KiB", "1.5 MiB", "2.0 GiB".
pub fn bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let v = b as f64;
    if v < KIB {
        format!("{b} B")
    } else if v < KIB * KIB {
        format!("{:.0} KiB", v / KIB)
    } else if v < KIB * KIB * KIB {
        format!("{:.1} MiB", v / KIB / KIB)
    } else {
        format!("{:.1} GiB", v / KIB / KIB / KIB)
    }
}

pub fn memory_name(m: HostMemory) -> &'static str {
    match m {
        HostMemory::Pageable => "pageable",
        HostMemory::Pinned => "pinned",
        HostMemory::Managed => "managed",
        HostMemory::NoHostSide => "device",
        HostMemory::Unknown => "unknown-memory",
    }
}

fn direction_name(c: &gpudiag_model::kernels::CopyStat) -> &'static str {
    direction_label(c.direction)
}

/// "host→device", as text shows a copy's direction.
pub fn direction_label(d: gpudiag_model::kernels::CopyDirection) -> &'static str {
    use gpudiag_model::kernels::CopyDirection::*;
    match d {
        HostToDevice => "host→device",
        DeviceToHost => "device→host",
        DeviceToDevice => "device→device",
        HostToHost => "host→host",
        PeerToPeer => "peer→peer",
        Other => "other",
    }
}

/// Values the verdict evidence holds, for the tests.
#[cfg(test)]
pub(crate) fn evidence_of(v: &Verdict, key: &str) -> Option<serde_json::Value> {
    v.evidence.get(key).cloned()
}
