//! The job verdict: a job's GPUs compared with each other over a window.
//!
//! A data-parallel job runs at the pace of its slowest rank. The others finish their step first
//! and wait inside a collective, where NCCL keeps a few SMs spinning, so each waiting GPU reads
//! "a kernel ran" all the time and, alone, looks busy. Side by side the GPU they wait for stands
//! out, in one of two ways:
//!
//! - it **leads**: more SM activity (tensor, power) than its peers, because it does more work
//!   each step, or the same work on a GPU that is slower or shared with another process;
//! - it **lags**: its GPU idles while its peers read busy, because its process is late to
//!   launch (short of CPU, a stalled input pipeline).
//!
//! Data-parallel ranks hold the same memory; pipeline stages do not. Where the job's processes
//! hold memory spread widely, a gap in work is the shape of the job (`imbalanced`), not one GPU
//! holding the others back. Where every GPU moves many bytes between GPUs and its tensor pipes
//! idle, the job is `communication_bound`. Otherwise it is `balanced` and each GPU's own verdict
//! stands.
//!
//! A job is the GPUs whose processes share a key, strongest first: a Slurm job, a torchrun run
//! id, a master address, a pod, the command `gpudiag run` started, one parent running the same
//! executable (torchrun, `torch.multiprocessing`), or one process on several GPUs. A shell, tmux
//! or an init runs another executable than its children, so it never joins them. Where nothing
//! could be read (another user's environment, a recording made before gpudiag looked), the
//! processes of one executable form a presumed job, and its verdict says so. The thresholds are
//! `[rules.job]`; how they were measured is in `docs/jobs.md`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::process_state::SeenProcess;
use super::{RuleInput, process_state::ProcessLaunch, round2};
use crate::config::JobConfig;
use crate::history::Window;
use gpudiag_model::job::{
    GpuRole, JobId, JobMember, JobPattern, JobVerdict, JoinedBy, Pace, PeerFigures, Straggler,
};
use gpudiag_model::sample::{Metric, TimeMs};
use gpudiag_model::verdict::{Bottleneck, Confidence, NotJudged, Verdict};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const GB: f64 = 1e9;

/// A leader must also be this many points of SM active above its peers: at the low activity of
/// a job that mostly communicates, a few points are a large ratio and mean nothing.
const LEAD_MIN_SM_POINTS: f64 = 10.0;

/// Throttle bits that slow a GPU against its will (as the GPU verdict counts them).
const HARMFUL_THROTTLE: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// The job a process belongs to, by the strongest key it has; `None` where nothing could be
/// read, so only its executable can place it.
fn key_of(pid: u32, p: &SeenProcess, command: &BTreeSet<u32>) -> Option<JobId> {
    if let Some(key) = &p.cluster {
        return Some(key.clone());
    }
    let launch = p.launch.as_ref();
    let id = |joined_by, key: String| Some(JobId { joined_by, key });
    if command.contains(&pid) {
        return id(JoinedBy::Command, "run".to_owned());
    }
    if let Some(l) = launch
        && let Some(parent) = l.parent_pid.filter(|&p| p > 1)
        && l.exe.is_some()
        && l.parent_exe == l.exe
    {
        return id(JoinedBy::Parent, parent.to_string());
    }
    // Its environment was read and named no job: it is a job of its own.
    let looked = launch.is_some_and(|l| !l.absent.contains_key("environ"));
    looked.then(|| JobId {
        joined_by: JoinedBy::Process,
        key: pid.to_string(),
    })
}

/// A presumed job's key where no launcher key could be read. The parent's pid is readable in
/// another user's `/proc/PID/stat` where the environment is not: processes of one parent are
/// likely one job's ranks, and processes of different parents likely not (two users' runs of
/// one python). Without a parent (a recording made before gpudiag looked), the executable.
fn presumed_key(p: &SeenProcess) -> JobId {
    let launch = p.launch.as_ref();
    let key = match launch.and_then(|l| l.parent_pid).filter(|&pid| pid > 1) {
        Some(parent) => format!("children of pid {parent}"),
        None => launch
            .and_then(|l| l.exe.clone())
            .or_else(|| p.name.clone())
            .unwrap_or_else(|| "an unknown executable".to_owned()),
    };
    JobId {
        joined_by: JoinedBy::SameExecutable,
        key,
    }
}

/// The jobs of two or more GPUs among the processes seen in `[start, end]`: each job's GPUs,
/// with the job's process on each (the one holding the most memory, where several do).
pub(crate) fn group(
    launches: &ProcessLaunch,
    memory: Option<&super::process_state::ProcessMemory>,
    start: TimeMs,
    end: TimeMs,
    command: &BTreeSet<u32>,
) -> BTreeMap<JobId, Vec<JobMember>> {
    let held = |device: u32, pid: u32| {
        memory
            .map(|m| m.holders_in(device, start, end, 0.0))
            .and_then(|h| h.into_iter().find(|(p, _, _)| *p == pid).map(|(_, _, b)| b))
            .unwrap_or(0.0)
    };
    let mut jobs: BTreeMap<JobId, BTreeMap<u32, (f64, JobMember)>> = BTreeMap::new();
    for (&(device, pid), p) in launches.within(start, end) {
        let key = key_of(pid, p, command).unwrap_or_else(|| presumed_key(p));
        let member = JobMember {
            device,
            uuid: None,
            pid,
            name: p.name.clone(),
            rank: p.launch.as_ref().and_then(|l| l.rank),
            local_rank: p.launch.as_ref().and_then(|l| l.local_rank),
            role: None,
        };
        let bytes = held(device, pid);
        let on_device = jobs.entry(key).or_default();
        match on_device.get(&device) {
            Some((most, _)) if *most >= bytes => {}
            _ => {
                on_device.insert(device, (bytes, member));
            }
        }
    }
    jobs.into_iter()
        .filter(|(_, gpus)| gpus.len() >= 2)
        .map(|(key, gpus)| (key, gpus.into_values().map(|(_, m)| m).collect()))
        .collect()
}

/// The median of what is there.
fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// A GPU's window figures, and what the comparison needs beside them.
struct Gpu {
    figures: PeerFigures,
    harmful_throttle_share: Option<f64>,
    pcie_link: Option<(f64, f64)>,
    /// Other processes on the GPU: pid, name, most memory held.
    others: Vec<(u32, Option<String>, f64)>,
}

fn figures_of(
    input: &RuleInput<'_>,
    member: &JobMember,
    all_members: &BTreeSet<u32>,
    start: TimeMs,
    end: TimeMs,
) -> Gpu {
    let device = member.device;
    let window = Window::Range {
        start_ms: start,
        end_ms: end,
    };
    let mean = |m: Metric| input.history.mean(device, m, window);
    let sum = |a: Metric, b: Metric| match (mean(a), mean(b)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    };
    let pcie = if mean(Metric::ProfPcieRxBytesPerS).is_some() {
        sum(Metric::ProfPcieRxBytesPerS, Metric::ProfPcieTxBytesPerS)
    } else {
        sum(Metric::PcieRxBytesPerS, Metric::PcieTxBytesPerS)
    };
    let holders = input
        .process_memory
        .map(|m| m.holders_in(device, start, end, 0.0))
        .unwrap_or_default();
    let job_memory = holders
        .iter()
        .find(|(pid, _, _)| *pid == member.pid)
        .map(|&(_, _, b)| b as u64);
    let others: Vec<(u32, Option<String>, f64)> = holders
        .into_iter()
        .filter(|(pid, _, _)| *pid != member.pid && !all_members.contains(pid))
        .collect();
    let harmful_throttle_share =
        input
            .history
            .fraction_where(device, Metric::ThrottleReasons, window, |bits| {
                (bits as u64) & HARMFUL_THROTTLE != 0
            });
    let latest = input.latest.get(&device);
    let pcie_link = latest
        .and_then(|s| s.pcie_gen.zip(s.pcie_width))
        .map(|(g, w)| (g as f64, w as f64));
    Gpu {
        figures: PeerFigures {
            device,
            rank: member.rank,
            gpu_util_pct: mean(Metric::GpuUtilPct),
            sm_active_pct: mean(Metric::SmActivePct),
            tensor_active_pct: mean(Metric::TensorActivePct),
            power_w: mean(Metric::PowerW),
            sm_clock_mhz: mean(Metric::SmClockMhz),
            nvlink_bytes_per_s: sum(Metric::NvlinkRxBytesPerS, Metric::NvlinkTxBytesPerS),
            pcie_bytes_per_s: pcie,
            job_memory_bytes: job_memory,
            process_cpu_pct: input
                .process_cpu
                .and_then(|c| c.cpu_pct(device, member.pid, start, end))
                .map(round2),
            other_processes: others.len() as u32,
        },
        harmful_throttle_share,
        pcie_link,
        others,
    }
}

fn pct(v: f64) -> String {
    format!("{v:.0}%")
}

fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / GIB)
}

fn gbps(bytes_per_s: f64) -> String {
    format!("{:.0} GB/s", bytes_per_s / GB)
}

/// "GPU 2 (rank 2)".
fn gpu_name(device: u32, rank: Option<u32>) -> String {
    match rank {
        Some(r) => format!("GPU {device} (rank {r})"),
        None => format!("GPU {device}"),
    }
}

/// The work figure compared: SM active where every GPU has it, else power.
/// Reads one figure of a GPU.
type FigureOf = fn(&PeerFigures) -> Option<f64>;

fn work_metric(gpus: &[Gpu]) -> Option<(&'static str, FigureOf)> {
    let all = |f: FigureOf| gpus.iter().all(|g| f(&g.figures).is_some());
    if all(|f| f.sm_active_pct) {
        Some(("sm_active_pct", |f| f.sm_active_pct))
    } else if all(|f| f.power_w) {
        Some(("power_w", |f| f.power_w))
    } else {
        None
    }
}

/// What differs on the straggler from its peers, in words.
fn differences(s: &Gpu, peers: &[&Gpu]) -> Vec<String> {
    let mut out = Vec::new();
    for (pid, name, bytes) in &s.others {
        out.push(format!(
            "another process (pid {pid}{}) also holds {} on it",
            name.as_deref()
                .map(|n| format!(", {n}"))
                .unwrap_or_default(),
            gib(*bytes)
        ));
    }
    let peer_median =
        |f: fn(&PeerFigures) -> Option<f64>| median(peers.iter().filter_map(|g| f(&g.figures)));
    // A GPU doing more work draws more power and, at its power limit, clocks lower: that is a
    // consequence (measured: a rank with twice the work ran at 1465 MHz against its peers'
    // 1775 MHz, at 691 W against 486 W). Lower clocks point at the GPU only at no more power.
    let more_power = match (s.figures.power_w, peer_median(|f| f.power_w)) {
        (Some(own), Some(peer)) => own > peer * 1.05,
        _ => false,
    };
    if let (Some(clock), Some(peer)) = (s.figures.sm_clock_mhz, peer_median(|f| f.sm_clock_mhz))
        && clock < peer * 0.95
        && !more_power
    {
        out.push(format!(
            "its SM clock averages {clock:.0} MHz against its peers' {peer:.0} MHz"
        ));
    }
    if let Some(share) = s.harmful_throttle_share.filter(|&t| t >= 0.05) {
        out.push(format!(
            "heat or the power supply held its clocks down {} of the window",
            pct(share * 100.0)
        ));
    }
    if let (Some(cpu), Some(peer)) = (
        s.figures.process_cpu_pct,
        peer_median(|f| f.process_cpu_pct),
    ) && (cpu - peer).abs() >= 30.0
    {
        out.push(format!(
            "its process uses {} of a CPU core against its peers' {}",
            pct(cpu),
            pct(peer)
        ));
    }
    if let Some((generation, width)) = s.pcie_link {
        let best = peers
            .iter()
            .filter_map(|g| g.pcie_link)
            .fold(None::<(f64, f64)>, |acc, l| {
                Some(acc.map_or(l, |a| (a.0.max(l.0), a.1.max(l.1))))
            });
        if let Some((pg, pw)) = best
            && (generation < pg || width < pw)
        {
            out.push(format!(
                "its PCIe link runs at Gen{generation:.0} x{width:.0} where its peers' reach Gen{pg:.0} x{pw:.0}"
            ));
        }
    }
    if let (Some(link), Some(peer)) = (
        s.figures.nvlink_bytes_per_s,
        peer_median(|f| f.nvlink_bytes_per_s),
    ) && peer > 1e9
        && link < peer * 0.5
    {
        out.push(format!(
            "it moves {} over NVLink against its peers' {}",
            gbps(link),
            gbps(peer)
        ));
    }
    out
}

/// The part of `[start, end]` from the first sample where any of the job's GPUs ran a kernel
/// (utilisation above `idle_util_pct`) to the last; `None` where none did.
fn working_span(
    input: &RuleInput<'_>,
    members: &[JobMember],
    start: TimeMs,
    end: TimeMs,
) -> Option<(TimeMs, TimeMs)> {
    let idle = input.config.utilisation.idle_util_pct;
    let window = Window::Range {
        start_ms: start,
        end_ms: end,
    };
    members
        .iter()
        .flat_map(|m| {
            input
                .history
                .series_in(m.device, Metric::GpuUtilPct, window)
                .filter(|&(_, u)| u > idle)
                .map(|(t, _)| t)
        })
        .fold(None, |span: Option<(TimeMs, TimeMs)>, t| {
            Some(span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))))
        })
}

/// Judges one job over `[start, end]`.
fn judge_job(
    input: &RuleInput<'_>,
    job: &JobId,
    members: &[JobMember],
    start: TimeMs,
    end: TimeMs,
) -> Result<JobVerdict, String> {
    let config: &JobConfig = &input.config.job;
    // The job is judged over the time its GPUs worked: NCCL's set-up before the first step and
    // the teardown after the last leave every GPU idle, and averaged in they hide the gap
    // (measured under `run`: a rank short of CPU read 29% against its peers' 58% over the run,
    // 38% against 77% once its first 10 idle seconds were left out).
    let Some((start, end)) = working_span(input, members, start, end) else {
        return Err("its GPUs ran no kernel in the window".to_owned());
    };
    let span_s = end.saturating_sub(start) as f64 / 1000.0;
    if span_s + 0.5 < config.min_window_s {
        return Err(format!(
            "a window of {span_s:.0} s is too short to compare a job's GPUs: a step can last \
             seconds, so each GPU may be caught in a different part of it; judge {:.0} s or more",
            config.min_window_s
        ));
    }
    let pids: BTreeSet<u32> = members.iter().map(|m| m.pid).collect();
    let gpus: Vec<Gpu> = members
        .iter()
        .map(|m| figures_of(input, m, &pids, start, end))
        .collect();
    let Some((work_key, work)) = work_metric(&gpus) else {
        return Err("neither SM active nor power was read on every GPU of the job".to_owned());
    };
    let util = |g: &Gpu| g.figures.gpu_util_pct;
    let mut evidence = serde_json::Map::new();
    evidence.insert("compared".into(), json!(work_key));
    evidence.insert("window_s".into(), json!(round2(span_s)));
    let others = |i: usize| {
        gpus.iter()
            .enumerate()
            .filter(move |(j, _)| *j != i)
            .map(|(_, g)| g)
    };
    let make = |verdict: JobPattern,
                confidence: Confidence,
                title: String,
                advice: String,
                straggler: Option<Straggler>,
                evidence: serde_json::Map<String, serde_json::Value>| JobVerdict {
        job: job.clone(),
        presumed: job.joined_by.presumed(),
        members: members
            .iter()
            .map(|m| JobMember {
                role: straggler.as_ref().and_then(|s| {
                    if s.device == m.device {
                        Some(GpuRole::Straggler)
                    } else {
                        let waits = s
                            .peers_wait_share
                            .is_some_and(|w| w >= config.waiting_min_share);
                        (waits && !job.joined_by.presumed()).then_some(GpuRole::Waiting)
                    }
                }),
                ..m.clone()
            })
            .collect(),
        verdict,
        confidence: if job.joined_by.presumed() {
            Confidence::Low
        } else {
            confidence
        },
        start_ms: start,
        end_ms: end,
        title: format!(
            "{} on {} GPUs: {title}",
            capitalised(&job.label()),
            members.len()
        ),
        advice,
        stragglers: straggler.into_iter().collect(),
        doubts: Vec::new(),
        peers: gpus.iter().map(|g| g.figures.clone()).collect(),
        evidence,
    };

    // Replicas hold the same memory; stages of a pipeline do not.
    let memory: Vec<f64> = gpus
        .iter()
        .filter_map(|g| g.figures.job_memory_bytes.map(|b| b as f64))
        .collect();
    let (mem_lo, mem_hi) = memory.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &b| {
        (lo.min(b), hi.max(b))
    });
    let memory_spread = (memory.len() == gpus.len() && mem_lo > 0.0)
        .then(|| mem_hi / mem_lo)
        .filter(|&r| {
            r >= config.memory_spread_ratio && mem_hi - mem_lo >= config.memory_spread_min_gib * GIB
        });
    evidence.insert(
        "memory_spread_ratio".into(),
        json!((memory.len() == gpus.len() && mem_lo > 0.0).then(|| round2(mem_hi / mem_lo))),
    );

    let works: Vec<f64> = gpus.iter().filter_map(|g| work(&g.figures)).collect();
    let (work_lo, work_hi) = works.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &w| {
        (lo.min(w), hi.max(w))
    });
    evidence.insert(
        "work_spread_ratio".into(),
        json!((work_lo > 0.0).then(|| round2(work_hi / work_lo))),
    );

    // Lags: an idle GPU among busy peers.
    let lag = gpus
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let u = util(g)?;
            let peers = median(others(i).filter_map(util))?;
            (peers >= config.peers_busy_util_pct && peers - u >= config.lag_util_points)
                .then_some((i, u, peers))
        })
        .max_by(|a, b| (a.2 - a.1).total_cmp(&(b.2 - b.1)));
    // Leads: the busiest GPU well above the others' median.
    let lead = gpus
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let w = work(&g.figures)?;
            let peers = median(others(i).filter_map(|o| work(&o.figures)))?;
            let points_ok = work_key != "sm_active_pct" || w - peers >= LEAD_MIN_SM_POINTS;
            (peers > 0.0 && w / peers >= config.lead_ratio && points_ok).then_some((i, w, peers))
        })
        .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)));
    evidence.insert("lead_ratio_threshold".into(), json!(config.lead_ratio));
    evidence.insert(
        "lag_util_points_threshold".into(),
        json!(config.lag_util_points),
    );

    if let Some(ratio) = memory_spread {
        let heaviest = gpus
            .iter()
            .max_by(|a, b| a.figures.job_memory_bytes.cmp(&b.figures.job_memory_bytes))
            .map(|g| gpu_name(g.figures.device, g.figures.rank))
            .unwrap_or_default();
        let title = format!(
            "imbalanced: its processes hold {} to {} ({ratio:.1}×, most on {heaviest}) and {} \
             ranges {} to {}: the GPUs do unequal shares, as pipeline stages do",
            gib(mem_lo),
            gib(mem_hi),
            work_label(work_key),
            figure(work_key, work_lo),
            figure(work_key, work_hi),
        );
        let advice = "Balance the stages: move layers from the heaviest stage to the lightest, \
                      partitioning by measured time and memory rather than layer count, and use \
                      more micro-batches to shrink the pipeline bubble. If the GPUs should be \
                      replicas (data parallel), find why one holds more (a rank that also \
                      evaluates or logs, uneven sequence lengths)."
            .to_owned();
        return Ok(make(
            JobPattern::Imbalanced,
            Confidence::Medium,
            title,
            advice,
            None,
            evidence,
        ));
    }

    let straggler_of = |i: usize, pace: Pace, metric: &str, value: f64, peers_median: f64| {
        let g = &gpus[i];
        let peer_gpus: Vec<&Gpu> = others(i).collect();
        let (share, how) = match pace {
            Pace::Leads => (
                (1.0 - peers_median / value).clamp(0.0, 1.0),
                format!(
                    "1 − peers' {m} / its {m}: every rank runs the same steps, so the peers' \
                     lower activity is time they wait (a lower bound: their spinning in the \
                     collective counts as activity)",
                    m = work_label(metric)
                ),
            ),
            Pace::Lags => (
                ((peers_median - value) / 100.0).clamp(0.0, 1.0),
                "its peers' utilisation − its own: while its GPU idles, theirs run only the \
                 collective that waits for it"
                    .to_owned(),
            ),
        };
        Straggler {
            device: g.figures.device,
            rank: g.figures.rank,
            pace,
            metric: metric.to_owned(),
            value: round2(value),
            peers_median: round2(peers_median),
            peers_wait_share: Some(round2(share)),
            wait_estimate: how,
            differs: differences(g, &peer_gpus),
        }
    };

    if let Some((i, u, peers)) = lag {
        let s = straggler_of(i, Pace::Lags, "gpu_util_pct", u, peers);
        let who = gpu_name(s.device, s.rank);
        let title = format!(
            "{who} is the straggler: it lags, utilisation {} against its peers' {} while they \
             wait in collectives, about {} of the time{}",
            pct(u),
            pct(peers),
            pct(s.peers_wait_share.unwrap_or(0.0) * 100.0),
            because(&s.differs)
        );
        let advice = format!(
            "The process on {who} launches its GPU's work late, so every rank waits for it. \
             Give that rank more CPU: check its CPU affinity and cgroup limit, what else runs \
             on its cores (`top -H`), its DataLoader (num_workers, pin_memory, prefetch), and \
             keep per-rank work outside the step (logging, evaluation, checkpointing) off the \
             critical path or equal on every rank."
        );
        let confidence = if peers - u >= 2.0 * config.lag_util_points {
            Confidence::High
        } else {
            Confidence::Medium
        };
        return Ok(make(
            JobPattern::Straggler,
            confidence,
            title,
            advice,
            Some(s),
            evidence,
        ));
    }

    if let Some((i, w, peers)) = lead {
        // With three or more GPUs, the rest spread as widely as the leader stands out: the
        // work is graded across the GPUs, not one GPU ahead.
        let rest: Vec<f64> = others(i).filter_map(|g| work(&g.figures)).collect();
        let (rest_lo, rest_hi) = rest.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &w| {
            (lo.min(w), hi.max(w))
        });
        if rest.len() >= 2 && rest_lo > 0.0 && rest_hi / rest_lo >= config.lead_ratio {
            let title = format!(
                "imbalanced: {} ranges from {} to {} across the GPUs, with no one GPU apart",
                work_label(work_key),
                figure(work_key, work_lo),
                figure(work_key, work_hi)
            );
            let advice = "Spread the work evenly: uneven shards or sequence lengths per rank, \
                          or pipeline stages of unequal size, leave the lighter GPUs waiting."
                .to_owned();
            return Ok(make(
                JobPattern::Imbalanced,
                Confidence::Medium,
                title,
                advice,
                None,
                evidence,
            ));
        }
        let s = straggler_of(i, Pace::Leads, work_key, w, peers);
        let who = gpu_name(s.device, s.rank);
        let title = format!(
            "{who} is the straggler: {} {} against its peers' {} ({:.1}×); they wait for it \
             about {} of the time{}",
            work_label(work_key),
            figure(work_key, w),
            figure(work_key, peers),
            w / peers,
            pct(s.peers_wait_share.unwrap_or(0.0) * 100.0),
            because(&s.differs)
        );
        let mut advice = format!("Every rank waits for {who}, the busiest GPU of the job.");
        let shared = s.differs.iter().any(|d| d.starts_with("another process"));
        let slower = s.differs.iter().any(|d| d.contains("clock"));
        if shared {
            advice.push_str(
                " Another process shares its GPU: move it to a GPU of its own (or keep the \
                 job on GPUs nobody else uses: CUDA_VISIBLE_DEVICES, Slurm's --exclusive).",
            );
        }
        if slower {
            advice.push_str(
                " Its clocks run lower than its peers' at no more power: check its cooling and \
                 power (see its throttle findings) and compare it with `gpudiag probe matmul`.",
            );
        }
        advice.push_str(if shared || slower {
            " If neither explains the gap, its rank has more work each step: uneven batches or \
             sequence lengths (bucket by length), or extra duties on one rank (logging, \
             evaluation, checkpointing) inside the step."
        } else {
            " Its rank has more work each step: uneven batches or sequence lengths (bucket by \
             length), or extra duties on one rank (logging, evaluation, checkpointing) inside \
             the step; move them off the step or spread them over every rank."
        });
        let confidence =
            if w / peers >= 1.0 + 2.0 * (config.lead_ratio - 1.0) && work_key == "sm_active_pct" {
                Confidence::High
            } else {
                Confidence::Medium
            };
        return Ok(make(
            JobPattern::Straggler,
            confidence,
            title,
            advice,
            Some(s),
            evidence,
        ));
    }

    // Every GPU moves many bytes between GPUs while its tensor pipes idle.
    let links: Vec<Option<f64>> = gpus
        .iter()
        .map(
            |g| match (g.figures.nvlink_bytes_per_s, g.figures.pcie_bytes_per_s) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
            },
        )
        .collect();
    let tensors: Vec<Option<f64>> = gpus.iter().map(|g| g.figures.tensor_active_pct).collect();
    let link_lo = links
        .iter()
        .copied()
        .collect::<Option<Vec<f64>>>()
        .map(|v| v.into_iter().fold(f64::INFINITY, f64::min));
    let tensor_hi = tensors
        .iter()
        .copied()
        .collect::<Option<Vec<f64>>>()
        .map(|v| v.into_iter().fold(0.0, f64::max));
    evidence.insert("link_min_bytes_per_s".into(), json!(link_lo.map(round2)));
    evidence.insert("tensor_max_pct".into(), json!(tensor_hi.map(round2)));
    if let (Some(link), Some(tensor)) = (link_lo, tensor_hi)
        && link >= config.communication_min_gb_per_s * GB
        && tensor < config.communication_max_tensor_pct
    {
        let link_hi = links.iter().flatten().copied().fold(0.0, f64::max);
        let sm = median(gpus.iter().filter_map(|g| g.figures.sm_active_pct));
        let title = format!(
            "communication-bound: every GPU moves {} to {} between GPUs while its tensor pipes \
             are active under {}{}",
            gbps(link),
            gbps(link_hi),
            pct(tensor.max(1.0)),
            sm.map(|s| format!(" (SM active {})", pct(s)))
                .unwrap_or_default()
        );
        let advice = "The GPUs spend the step exchanging data. Overlap communication with \
                      compute (DDP's bucket_cap_mb, gradient accumulation under no_sync, FSDP's \
                      forward and backward prefetch), make collectives fewer and larger, \
                      communicate in bf16, and check the links reach their peak: `gpudiag probe \
                      p2p nccl`."
            .to_owned();
        return Ok(make(
            JobPattern::CommunicationBound,
            Confidence::Medium,
            title,
            advice,
            None,
            evidence,
        ));
    }

    let title = format!(
        "balanced: {} {} to {} across the GPUs; each GPU's own verdict says what bounds it",
        work_label(work_key),
        figure(work_key, work_lo),
        figure(work_key, work_hi)
    );
    let advice = "The GPUs keep pace with each other: see each GPU's verdict.".to_owned();
    Ok(make(
        JobPattern::Balanced,
        Confidence::Medium,
        title,
        advice,
        None,
        evidence,
    ))
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn work_label(key: &str) -> &'static str {
    match key {
        "sm_active_pct" => "SM active",
        "gpu_util_pct" => "utilisation",
        _ => "power",
    }
}

fn figure(key: &str, v: f64) -> String {
    match key {
        "power_w" => format!("{v:.0} W"),
        _ => pct(v),
    }
}

fn because(differs: &[String]) -> String {
    match differs.first() {
        Some(d) => format!("; {d}"),
        None => String::new(),
    }
}

/// Every job of two or more GPUs judged over `[start, end]`, and the jobs that could not be.
pub fn judge_all(
    input: &RuleInput<'_>,
    launches: &ProcessLaunch,
    command: &BTreeSet<u32>,
    start: TimeMs,
    end: TimeMs,
) -> (Vec<JobVerdict>, Vec<NotJudged>) {
    let mut verdicts = Vec::new();
    let mut not_judged = Vec::new();
    for (job, mut members) in group(launches, input.process_memory, start, end, command) {
        for m in &mut members {
            m.uuid = input
                .devices
                .iter()
                .find(|d| d.index == m.device)
                .and_then(|d| d.uuid.clone());
        }
        match judge_job(input, &job, &members, start, end) {
            Ok(v) => verdicts.push(v),
            Err(reason) => not_judged.push(NotJudged {
                rule: "job".to_owned(),
                device: None,
                reason: format!("{}: {reason}", capitalised(&job.label())),
            }),
        }
    }
    (verdicts, not_judged)
}

/// The findings the job verdicts raise, so `check --fail-on`, the findings views and `serve`'s
/// finding series carry them: a straggler is a warning on its GPU (its peers' time is lost),
/// a communication-bound or imbalanced job information on the host. A presumed job's straggler
/// is information: the job may join strangers.
pub fn findings(jobs: &[JobVerdict], config: &JobConfig) -> Vec<gpudiag_model::finding::Finding> {
    use gpudiag_model::finding::{Evidence, Finding, Severity};
    jobs.iter()
        .filter_map(|j| {
            let (id, severity, device, threshold) = match (&j.verdict, j.stragglers.first()) {
                (JobPattern::Straggler, Some(s)) => (
                    "job.straggler",
                    if j.presumed {
                        Severity::Info
                    } else {
                        Severity::Warn
                    },
                    Some(s.device),
                    format!(
                        "SM active ≥ {}× its peers' median (leads), or utilisation ≥ {} points \
                         below it while they read ≥ {}% (lags)",
                        config.lead_ratio, config.lag_util_points, config.peers_busy_util_pct
                    ),
                ),
                (JobPattern::CommunicationBound, _) => (
                    "job.communication_bound",
                    Severity::Info,
                    None,
                    format!(
                        "every GPU ≥ {} GB/s between GPUs with tensor active < {}%",
                        config.communication_min_gb_per_s, config.communication_max_tensor_pct
                    ),
                ),
                (JobPattern::Imbalanced, _) => (
                    "job.imbalanced",
                    Severity::Info,
                    None,
                    format!(
                        "memory held spread ≥ {}× and ≥ {} GiB, or work graded across the GPUs",
                        config.memory_spread_ratio, config.memory_spread_min_gib
                    ),
                ),
                _ => return None,
            };
            let mut values = serde_json::Map::new();
            values.insert("job".into(), json!(j.job.label()));
            values.insert("joined_by".into(), json!(j.job.joined_by.name()));
            values.insert("gpus".into(), json!(j.members.len()));
            if let Some(s) = j.stragglers.first() {
                values.insert("pace".into(), json!(s.pace));
                values.insert(s.metric.clone(), json!(s.value));
                values.insert("peers_median".into(), json!(s.peers_median));
                values.insert("peers_wait_share".into(), json!(s.peers_wait_share));
            }
            Some(Finding::new(
                id.to_owned(),
                severity,
                device,
                j.end_ms,
                j.title.clone(),
                Evidence {
                    values,
                    window_s: round2(j.end_ms.saturating_sub(j.start_ms) as f64 / 1000.0),
                    threshold,
                },
                j.advice.clone(),
            ))
        })
        .collect()
}

/// Rewrites the verdicts of GPUs that their job explains. A GPU that waits for its job's
/// straggler much of the time is not "the good case" however busy its counters read: it gets
/// `waiting_for_peer`, its own verdict kept in the evidence. A communication-bound job's GPUs
/// keep their verdict with the job's reason and advice.
pub fn explain_by_job(
    verdicts: &mut BTreeMap<u32, Verdict>,
    jobs: &[JobVerdict],
    config: &JobConfig,
) {
    // A communication-bound job's GPUs run mostly NCCL's kernels, which keep few SMs busy: alone
    // each reads underfilled (or launch- or sync-bound), and that verdict's advice (bigger
    // grids, fewer launches) is not what helps. The verdict stays; its advice becomes the job's.
    for job in jobs
        .iter()
        .filter(|j| j.verdict == JobPattern::CommunicationBound && !j.presumed)
    {
        for m in &job.members {
            let Some(v) = verdicts.get_mut(&m.device) else {
                continue;
            };
            if !matches!(
                v.bottleneck,
                Bottleneck::Underfilled | Bottleneck::LaunchBound | Bottleneck::SyncBound
            ) {
                continue;
            }
            v.evidence
                .insert("job_verdict".into(), json!(job.verdict.name()));
            v.title = format!(
                "{}; its kernels are mostly the collectives of {}, which is communication-bound",
                v.title,
                job.job.label()
            );
            v.advice = format!("See the job's verdict: {}", job.advice);
        }
    }
    // A presumed job may join strangers: its GPUs keep their own verdicts.
    for job in jobs.iter().filter(|j| !j.presumed) {
        let Some(s) = job.stragglers.first() else {
            continue;
        };
        let Some(share) = s
            .peers_wait_share
            .filter(|&w| w >= config.waiting_min_share)
        else {
            continue;
        };
        let straggler = gpu_name(s.device, s.rank);
        for m in job.members.iter().filter(|m| m.device != s.device) {
            let Some(v) = verdicts.get_mut(&m.device) else {
                continue;
            };
            if matches!(v.bottleneck, Bottleneck::Idle | Bottleneck::WaitingForPeer) {
                continue;
            }
            let own = v.bottleneck;
            v.evidence
                .insert("own_bottleneck".into(), json!(own.name()));
            v.evidence
                .insert("waits_for_device".into(), json!(s.device));
            v.evidence.insert("peers_wait_share".into(), json!(share));
            v.title = format!(
                "GPU {} waits for {straggler}, the straggler of {}, about {} of the time; on \
                 its own it reads {} ({})",
                m.device,
                job.job.label(),
                pct(share * 100.0),
                own.name().replace('_', "-"),
                super::bottleneck::brief(v)
            );
            v.advice = format!(
                "Speed up {straggler}, the job's straggler, not this GPU: see the job's verdict."
            );
            v.bottleneck = Bottleneck::WaitingForPeer;
            v.confidence = v.confidence.min(job.confidence);
        }
    }
}

/// Job verdicts over consecutive slices of `[start, end]`, neighbours with the same verdict and
/// straggler merged and judged again over their whole span.
pub fn phases(
    input: &RuleInput<'_>,
    launches: &ProcessLaunch,
    command: &BTreeSet<u32>,
    start: TimeMs,
    end: TimeMs,
) -> BTreeMap<JobId, Vec<JobVerdict>> {
    let step = super::bottleneck::slice_ms(end.saturating_sub(start));
    let mut spans: BTreeMap<JobId, Vec<(JobVerdict, usize)>> = BTreeMap::new();
    // The slice each job was last judged in: a slice it was not judged in (idle, gone) ends
    // its phase.
    let mut last_judged: BTreeMap<JobId, usize> = BTreeMap::new();
    let mut at = start;
    let mut slice = 0usize;
    while at < end {
        let to = at.saturating_add(step).min(end);
        let (verdicts, _) = judge_all(input, launches, command, at, to);
        for v in verdicts {
            let follows = last_judged.insert(v.job.clone(), slice) == slice.checked_sub(1);
            let list = spans.entry(v.job.clone()).or_default();
            match list.last_mut() {
                Some((prev, slices)) if follows && same_phase(prev, &v) => {
                    prev.end_ms = v.end_ms;
                    *slices += 1;
                }
                _ => list.push((v, 1)),
            }
        }
        at = to.saturating_add(1);
        slice += 1;
    }
    spans
        .into_iter()
        .map(|(job, list)| {
            let merged = list
                .into_iter()
                .map(|(v, slices)| {
                    if slices == 1 {
                        return v;
                    }
                    judge_job(input, &v.job, &v.members, v.start_ms, v.end_ms).unwrap_or(v)
                })
                .collect();
            (job, merged)
        })
        .collect()
}

fn same_phase(a: &JobVerdict, b: &JobVerdict) -> bool {
    a.verdict == b.verdict
        && a.stragglers
            .iter()
            .map(|s| s.device)
            .eq(b.stragglers.iter().map(|s| s.device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::attribution::{Attribution, FoundIn, SlurmJob};
    use gpudiag_model::job::Launch;
    use gpudiag_model::sample::{ProcessSample, Sample};

    const PYTHON: &str = "/usr/bin/python3.12";

    fn launch(parent: u32, parent_exe: &str, exe: &str) -> Launch {
        Launch {
            parent_pid: Some(parent),
            exe: Some(exe.into()),
            parent_exe: Some(parent_exe.into()),
            ..Launch::default()
        }
    }

    fn process(pid: u32, launch: Option<Launch>) -> ProcessSample {
        ProcessSample {
            pid,
            name: Some("python3".into()),
            user: None,
            kind: Some("compute".into()),
            used_memory_bytes: Some(1 << 30),
            sm_util_pct: None,
            container_id: None,
            container_pid: None,
            cpu_time_s: None,
            attribution: None,
            launch,
        }
    }

    /// Groups processes, one a GPU in order, as seen in one sample each.
    fn jobs_of(processes: Vec<ProcessSample>) -> BTreeMap<JobId, Vec<JobMember>> {
        let mut launches = ProcessLaunch::default();
        for (device, p) in processes.into_iter().enumerate() {
            launches.observe(
                &Sample {
                    processes: Some(vec![p]),
                    ..Sample::new(device as u32, 1_000)
                },
                None,
            );
        }
        group(&launches, None, 0, 2_000, &BTreeSet::new())
    }

    fn joined(jobs: &BTreeMap<JobId, Vec<JobMember>>) -> Vec<(JoinedBy, Vec<u32>)> {
        jobs.iter()
            .map(|(id, m)| (id.joined_by, m.iter().map(|m| m.device).collect()))
            .collect()
    }

    #[test]
    fn torchrun_ranks_are_one_job_by_run_id_and_a_default_id_falls_to_the_master() {
        let rank = |pid, run: &str| {
            let mut l = launch(100, PYTHON, PYTHON);
            l.run_id = Some(run.into());
            l.master_addr = Some("node-0".into());
            l.master_port = Some("29500".into());
            process(pid, Some(l))
        };
        let jobs = jobs_of(vec![rank(101, "7f3c"), rank(102, "7f3c")]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::RunId, vec![0, 1])]);
        let jobs = jobs_of(vec![rank(101, "none"), rank(102, "none")]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::MasterAddress, vec![0, 1])]);
        assert_eq!(jobs.keys().next().unwrap().key, "node-0:29500");
    }

    #[test]
    fn a_shared_shell_or_init_never_joins_jobs() {
        // Two trainings started from one shell, and two under init: four jobs of one GPU.
        let jobs = jobs_of(vec![
            process(11, Some(launch(10, "/usr/bin/bash", PYTHON))),
            process(12, Some(launch(10, "/usr/bin/bash", PYTHON))),
            process(21, Some(launch(1, "/sbin/init", PYTHON))),
            process(22, Some(launch(1, "/sbin/init", PYTHON))),
        ]);
        assert!(jobs.is_empty(), "{jobs:?}");
        // tmux runs a shell too; its server is not python either.
        let jobs = jobs_of(vec![
            process(31, Some(launch(30, "/usr/bin/tmux", PYTHON))),
            process(32, Some(launch(30, "/usr/bin/tmux", PYTHON))),
        ]);
        assert!(jobs.is_empty(), "{jobs:?}");
    }

    #[test]
    fn children_of_one_launcher_running_its_executable_are_one_job() {
        // torch.multiprocessing.spawn: the parent is python, like its children.
        let jobs = jobs_of(vec![
            process(41, Some(launch(40, PYTHON, PYTHON))),
            process(42, Some(launch(40, PYTHON, PYTHON))),
        ]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::Parent, vec![0, 1])]);
    }

    #[test]
    fn a_slurm_job_joins_its_processes_whatever_else_they_carry() {
        let in_job = |pid, parent| {
            let mut p = process(pid, Some(launch(parent, "/usr/bin/bash", PYTHON)));
            p.attribution = Some(Attribution {
                job: Some(SlurmJob {
                    id: "42".into(),
                    step: Some("0".into()),
                    user: None,
                    found_in: FoundIn::Cgroup,
                }),
                ..Attribution::default()
            });
            p
        };
        let jobs = jobs_of(vec![in_job(51, 50), in_job(61, 60)]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::SlurmJob, vec![0, 1])]);
    }

    #[test]
    fn where_nothing_was_readable_one_executable_is_a_presumed_job() {
        let mut unreadable = Launch {
            exe: Some(PYTHON.into()),
            ..Launch::default()
        };
        unreadable
            .absent
            .insert("environ".into(), "another user's process".into());
        // A recording made before gpudiag looked carries no launch at all.
        let jobs = jobs_of(vec![process(71, Some(unreadable)), process(72, None)]);
        // The second is known by its name only, so it is not the same executable.
        assert!(jobs.is_empty(), "{jobs:?}");
        let jobs = jobs_of(vec![process(71, None), process(72, None)]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::SameExecutable, vec![0, 1])]);
        assert!(jobs.keys().next().unwrap().joined_by.presumed());
        // Another user's processes: the environment hidden, the parent readable. One parent
        // presumes one job; two parents, two jobs.
        let hidden = |parent| {
            let mut l = Launch {
                parent_pid: Some(parent),
                ..Launch::default()
            };
            l.absent
                .insert("environ".into(), "another user's process".into());
            l.absent
                .insert("exe".into(), "another user's process".into());
            Some(l)
        };
        let jobs = jobs_of(vec![process(81, hidden(80)), process(82, hidden(80))]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::SameExecutable, vec![0, 1])]);
        let jobs = jobs_of(vec![process(91, hidden(90)), process(93, hidden(92))]);
        assert!(jobs.is_empty(), "{jobs:?}");
    }

    #[test]
    fn the_command_gpudiag_runs_is_one_job() {
        let mut launches = ProcessLaunch::default();
        for (device, pid) in [(0u32, 81u32), (1, 82)] {
            launches.observe(
                &Sample {
                    processes: Some(vec![process(
                        pid,
                        Some(launch(80, "/usr/bin/bash", PYTHON)),
                    )]),
                    ..Sample::new(device, 1_000)
                },
                None,
            );
        }
        let jobs = group(&launches, None, 0, 2_000, &BTreeSet::from([81, 82]));
        assert_eq!(joined(&jobs), vec![(JoinedBy::Command, vec![0, 1])]);
    }
}
