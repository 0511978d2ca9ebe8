//! A job that makes no progress: its GPUs sit inside collectives that move nothing.
//!
//! NCCL waits for a missing peer by spinning a kernel, so a waiting GPU reads utilisation 100%
//! while it computes nothing: measured on 4 × H100 with rank 3 asleep, GPUs 0–2 read SM active
//! 18%, tensor 0%, NVLink 0 MB/s and 123–125 W, against 480–700 W at work. Alone each looks
//! busy; side by side with its own past and its peers it is stuck. Which rank it waits for, and
//! why, is the host's to tell: the GPU of that rank idles, and its process is asleep with no CPU
//! progress (hung), stopped, gone (exited) — or running or in I/O with CPU progress, which is
//! a rank busy on the host (a checkpoint, an evaluation, a download) that the others wait for:
//! slow, not hung.
//!
//! The stuck stretch is read backwards from the window's end in slices, and may reach before
//! the window's start: a hang is judged by how long it lasts, not by the window asked for.

use serde_json::json;

use super::figures::gpu_name;
use super::identity::AbsentRanks;
use crate::config::JobConfig;
use crate::history::Window;
use crate::rules::{RuleInput, round2};
use gpudiag_model::job::{JobMember, JobPattern, MissingRank, Pace, Stall, Straggler};
use gpudiag_model::sample::{Metric, ProcessState, TimeMs};
use gpudiag_model::verdict::Confidence;

/// The slice the stuck stretch is read in: long enough to hold a few samples at the slowest
/// cadence, short enough to say since when within seconds.
const SLICE_MS: u64 = 5_000;
/// How far back a stuck stretch is followed: as far as the process table keeps a rank that
/// left.
pub(super) const LOOK_BACK_MS: u64 = 10 * 60 * 1000;
/// A process not listed on its GPU for this long before the GPU's latest sample has left it:
/// process lists are read every second or so and repeated on every sample between.
pub(super) const GONE_AFTER_MS: u64 = 5_000;
/// A GPU below this utilisation launches nothing: its rank is not in the collective.
const IDLE_UTIL_PCT: f64 = 20.0;
/// How long a job must look stuck before `stuck_s` goes into its evidence (RAS is asked then).
pub(super) const LOOKS_STUCK_S: f64 = 10.0;

/// A member of the job as the stall sees it: present in the window, or gone before it ended.
#[derive(Debug, Clone)]
pub(super) struct Rank {
    pub(super) member: JobMember,
    /// When its process was last listed on its GPU, where that is before the window's end:
    /// it left.
    pub(super) left_ms: Option<TimeMs>,
    /// The most its GPU drew in the look-back: its working draw, where it worked.
    pub(super) peak_power_w: Option<f64>,
}

/// One GPU over one slice.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slice {
    /// A kernel runs all the time and nothing moves: waiting inside a collective.
    Spinning { power_w: Option<f64> },
    /// Nothing launched (or its process gone): the rank is not in the collective.
    Idle,
    /// Working, or not read.
    Other,
}

fn slice_of(
    input: &RuleInput<'_>,
    config: &JobConfig,
    rank: &Rank,
    start: TimeMs,
    end: TimeMs,
) -> Slice {
    if rank.left_ms.is_some_and(|t| t < end) {
        return Slice::Idle;
    }
    let window = Window::Range {
        start_ms: start,
        end_ms: end,
    };
    let mean = |m: Metric| input.history.mean(rank.member.device, m, window);
    let Some(util) = mean(Metric::GpuUtilPct) else {
        return Slice::Other;
    };
    if util < IDLE_UTIL_PCT {
        return Slice::Idle;
    }
    if util < config.hang_spin_util_pct {
        return Slice::Other;
    }
    let sum = |a: Metric, b: Metric| match (mean(a), mean(b)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    };
    let pcie = if mean(Metric::ProfPcieRxBytesPerS).is_some() {
        sum(Metric::ProfPcieRxBytesPerS, Metric::ProfPcieTxBytesPerS)
    } else {
        sum(Metric::PcieRxBytesPerS, Metric::PcieTxBytesPerS)
    };
    let links = sum(Metric::NvlinkRxBytesPerS, Metric::NvlinkTxBytesPerS).unwrap_or(0.0)
        + pcie.unwrap_or(0.0);
    if links > config.hang_max_link_mb_per_s * 1e6 {
        return Slice::Other;
    }
    let busy = |m: Metric| mean(m).is_some_and(|v| v > config.hang_max_busy_pct);
    if busy(Metric::TensorActivePct) || busy(Metric::DramActivePct) {
        return Slice::Other;
    }
    let power_w = mean(Metric::PowerW);
    // Without profiling counters a kernel that runs with no PCIe traffic may be work (NVLink
    // traffic is read only with them): a draw fallen well below the GPU's own peak tells
    // waiting apart, and without a peak seen nothing does.
    if mean(Metric::TensorActivePct).is_none() {
        let fallen = match (power_w, rank.peak_power_w) {
            (Some(now), Some(peak)) => peak > 0.0 && now <= config.hang_power_ratio * peak,
            _ => false,
        };
        if !fallen {
            return Slice::Other;
        }
    }
    Slice::Spinning { power_w }
}

/// The GPUs' slices over `[start, end]`, or `None` where the job is not stuck in it: every GPU
/// spinning or idle, and at least one spinning (an idle job is idle, not stuck).
fn stuck_slice(
    input: &RuleInput<'_>,
    config: &JobConfig,
    ranks: &[Rank],
    start: TimeMs,
    end: TimeMs,
) -> Option<Vec<Slice>> {
    let slices: Vec<Slice> = ranks
        .iter()
        .map(|r| slice_of(input, config, r, start, end))
        .collect();
    let stuck = slices.iter().all(|s| *s != Slice::Other)
        && slices.iter().any(|s| matches!(s, Slice::Spinning { .. }));
    stuck.then_some(slices)
}

/// What the stall detector saw: how long the job has been stuck, and if that is long enough,
/// the verdict.
pub(super) enum Seen {
    /// Not stuck at the window's end.
    Moving,
    /// Stuck for `stuck_s`, too short to call (the evidence says so, and RAS may be asked).
    Stuck { since_ms: TimeMs, stuck_s: f64 },
    /// Stuck for the whole window, which is shorter than a hang takes to call.
    TooShort { stuck_s: f64 },
    /// A verdict.
    Found(Box<StallFound>),
}

/// A stalled job's verdict, but for its name and members.
pub(super) struct StallFound {
    pub(super) pattern: JobPattern,
    pub(super) confidence: Confidence,
    pub(super) title: String,
    pub(super) advice: String,
    pub(super) stall: Stall,
    /// A rank busy on the host that the others wait for: the straggler (pattern `straggler`).
    pub(super) stragglers: Vec<Straggler>,
    pub(super) evidence: serde_json::Map<String, serde_json::Value>,
}

/// Why a missing rank does not come, from its host side over the stuck stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Exited,
    Stopped,
    /// Running or in I/O, or using CPU: busy on the host.
    Busy,
    /// Asleep with no CPU progress.
    Asleep,
    /// Its host side could not be read.
    Unknown,
}

/// Judges whether `ranks` (the job's members, those gone included) are stuck at `end`.
pub(super) fn detect(
    input: &RuleInput<'_>,
    ranks: &[Rank],
    absent: &AbsentRanks,
    window_start: TimeMs,
    end: TimeMs,
) -> Seen {
    let config = &input.config.job;
    // One GPU is a job's only where ranks it needs are absent: alone it may be anything.
    if ranks.len() < 2 && absent.ranks.is_empty() {
        return Seen::Moving;
    }
    let oldest = end.saturating_sub(LOOK_BACK_MS);
    let mut since = end;
    let mut first: Option<Vec<Slice>> = None;
    let mut spin_power: Vec<(f64, u32)> = vec![(0.0, 0); ranks.len()];
    while since > oldest {
        let from = since.saturating_sub(SLICE_MS);
        // A rank that left after this slice was still there in it.
        let in_slice: Vec<Rank> = ranks
            .iter()
            .map(|r| Rank {
                left_ms: r.left_ms.filter(|&t| t < since),
                ..r.clone()
            })
            .collect();
        let Some(slices) = stuck_slice(input, config, &in_slice, from, since) else {
            break;
        };
        for (i, s) in slices.iter().enumerate() {
            if let Slice::Spinning { power_w: Some(w) } = s {
                spin_power[i].0 += w;
                spin_power[i].1 += 1;
            }
        }
        first.get_or_insert(slices);
        since = from;
    }
    let Some(latest) = first else {
        return Seen::Moving;
    };
    // The history holds nothing before the stuck stretch: it may have begun before it, and a
    // window shorter than a hang takes cannot call one.
    let history_start = ranks
        .iter()
        .filter_map(|r| {
            input
                .history
                .series(r.member.device, Metric::GpuUtilPct)
                .next()
                .map(|(t, _)| t)
        })
        .min()
        .unwrap_or(window_start);
    let since = since.max(history_start);
    let stuck_s = end.saturating_sub(since) as f64 / 1000.0;
    // A live window of 30 s holds a little less than 30 s of samples.
    if stuck_s + 1.0 < config.hang_after_s {
        if since <= history_start.saturating_add(SLICE_MS) {
            return Seen::TooShort { stuck_s };
        }
        if stuck_s >= LOOKS_STUCK_S {
            return Seen::Stuck {
                since_ms: since,
                stuck_s,
            };
        }
        return Seen::Moving;
    }

    // The job's own working draw: its spinning GPUs in the minute before the stall, strictly
    // before it (a history that begins with the stall has no working draw to compare with).
    let before = Window::Range {
        start_ms: since.saturating_sub(60_000),
        end_ms: since.saturating_sub(1),
    };
    let spinning: Vec<usize> = latest
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Slice::Spinning { .. }))
        .map(|(i, _)| i)
        .collect();
    let stuck_power: Option<f64> = spinning
        .iter()
        .map(|&i| (spin_power[i].1 > 0).then(|| spin_power[i].0 / spin_power[i].1 as f64))
        .sum();
    let working_power: Option<f64> = spinning
        .iter()
        .map(|&i| {
            input
                .history
                .mean(ranks[i].member.device, Metric::PowerW, before)
        })
        .sum();
    let power_ratio = match (stuck_power, working_power) {
        (Some(s), Some(w)) if w > 0.0 => Some(s / w),
        _ => None,
    };
    let profiled = spinning.iter().all(|&i| {
        input
            .history
            .mean(
                ranks[i].member.device,
                Metric::TensorActivePct,
                Window::Range {
                    start_ms: since,
                    end_ms: end,
                },
            )
            .is_some()
    });
    let mut evidence = serde_json::Map::new();
    evidence.insert("detector".into(), json!("stall"));
    evidence.insert("stuck_s".into(), json!(round2(stuck_s)));
    evidence.insert("hang_after_s".into(), json!(config.hang_after_s));
    evidence.insert("power_ratio".into(), json!(power_ratio.map(round2)));
    evidence.insert(
        "hang_power_ratio_threshold".into(),
        json!(config.hang_power_ratio),
    );
    evidence.insert("profiling_counters".into(), json!(profiled));
    // A job drawing as much as it did at work is not waiting: whatever it runs, it runs.
    if power_ratio.is_some_and(|r| r > config.hang_power_ratio) {
        return Seen::Moving;
    }
    // Without profiling counters, a kernel that runs with no traffic may be work: only a fall
    // from the job's own working draw tells waiting apart.
    if !profiled && power_ratio.is_none() {
        return Seen::Stuck {
            since_ms: since,
            stuck_s,
        };
    }

    let waiting: Vec<u32> = spinning.iter().map(|&i| ranks[i].member.device).collect();
    let span = (since, end);
    let missing: Vec<(MissingRank, Why)> = latest
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == Slice::Idle)
        .map(|(i, _)| missing_rank(input, config, &ranks[i], span))
        .collect();

    let mut confidence = if profiled {
        Confidence::High
    } else {
        Confidence::Medium
    };
    let whys: Vec<Why> = missing.iter().map(|(_, w)| *w).collect();
    if whys.contains(&Why::Unknown) {
        confidence = Confidence::Medium.min(confidence);
    }
    let waiting_names = names(
        spinning
            .iter()
            .map(|&i| gpu_name(ranks[i].member.device, ranks[i].member.rank)),
    );
    let draw = match (stuck_power, working_power) {
        (Some(s), Some(w)) => format!(", drawing {s:.0} W against {w:.0} W at work"),
        _ => String::new(),
    };
    let inside = format!(
        "{waiting_names} {} sat {} s inside collectives that move nothing{draw}",
        if spinning.len() == 1 { "has" } else { "have" },
        stuck_s.round()
    );
    let inside = if profiled {
        inside
    } else {
        format!(
            "{inside} (judged without profiling counters, on utilisation, power and PCIe: \
             NVLink traffic is not read)"
        )
    };
    let stall = |missing: Vec<MissingRank>| Stall {
        since_ms: since,
        stuck_s: round2(stuck_s),
        waiting: waiting.clone(),
        missing,
        absent_ranks: absent.ranks.clone(),
        stuck_power_w: stuck_power.map(round2),
        working_power_w: working_power.map(round2),
    };

    // A rank busy on the host holds the others, but it makes progress: a slow rank.
    if !whys.is_empty() && whys.iter().all(|w| *w == Why::Busy) {
        let list: Vec<MissingRank> = missing.into_iter().map(|(m, _)| m).collect();
        let who = names(list.iter().map(|m| describe(m, Why::Busy)));
        let stragglers = list
            .iter()
            .map(|m| Straggler {
                device: m.device,
                rank: m.rank,
                pace: Pace::Lags,
                metric: "gpu_util_pct".to_owned(),
                value: 0.0,
                peers_median: 100.0,
                peers_wait_share: Some(1.0),
                wait_estimate: format!(
                    "the peers sat in a collective the whole {} s while it worked on the host",
                    stuck_s.round()
                ),
                differs: vec![format!(
                    "its process is {} and used {} of a core",
                    m.state.map_or("unread", ProcessState::name),
                    m.cpu_pct
                        .map_or_else(|| "unknown".to_owned(), |c| format!("{c:.0}%"))
                )],
            })
            .collect();
        return Seen::Found(Box::new(StallFound {
            pattern: JobPattern::Straggler,
            confidence: Confidence::Medium,
            title: format!(
                "{who} works on the host while {inside}: one rank's checkpoint, evaluation or \
                 download holds the job (slow, not hung: its process makes progress)"
            ),
            advice: "Take the host work off the job's critical path: save checkpoints \
                     asynchronously (torch.distributed.checkpoint.async_save) or shard them \
                     across ranks, evaluate on every rank or less often, prefetch downloads \
                     before training. If it must run this long, raise the collective timeout \
                     (init_process_group(timeout=...)) so PyTorch's watchdog does not end the \
                     job."
                .to_owned(),
            stall: stall(list),
            stragglers,
            evidence,
        }));
    }

    // No rank here keeps the others waiting, but ranks that must run here do not: they left
    // before gpudiag looked (a fresh `check` after a rank died under a launcher that does not
    // tear the job down).
    let gone_before = whys.is_empty() && !absent.ranks.is_empty();
    if gone_before {
        confidence = Confidence::Medium.min(confidence);
    }
    let pattern = if whys.contains(&Why::Exited) || gone_before {
        JobPattern::RankExited
    } else if whys.contains(&Why::Stopped) {
        JobPattern::RankStopped
    } else {
        JobPattern::Hung
    };
    let list: Vec<MissingRank> = missing.iter().map(|(m, _)| m.clone()).collect();
    let described = names(missing.iter().map(|(m, w)| describe(m, *w)));
    let inspect: Vec<String> = list.iter().filter_map(|m| m.inspect.clone()).collect();
    let described = if gone_before {
        let which = names(absent.ranks.iter().map(u32::to_string));
        let (rank, does, it) = if absent.ranks.len() == 1 {
            ("rank", "does", "it")
        } else {
            ("ranks", "do", "they")
        };
        format!(
            "{rank} {which} of its {}, which {does} not run: its ranks meet at {}, so all run \
             on this host; {it} exited before gpudiag began watching, or never started",
            absent.world, absent.master
        )
    } else {
        described
    };
    let (title, advice) = match pattern {
        JobPattern::RankExited => (
            format!("{inside}, waiting for {described}"),
            format!(
                "The job cannot go on without that rank. Read its log for why it ended (an \
                 exception, the OOM killer: `dmesg | grep -i oom`, a signal), end the job — a \
                 launcher that did not start its ranks does not tear them down, and PyTorch's \
                 watchdog waits out its timeout (10 minutes by default) — and restart from the \
                 last checkpoint; torchrun --max-restarts restarts it on its own.{}",
                also(&inspect)
            ),
        ),
        JobPattern::RankStopped => (
            format!("{inside}, waiting for {described}"),
            format!(
                "`kill -CONT {}` resumes it (SIGSTOP, Ctrl-Z or a debugger stopped it); a \
                 debugger holding it must detach.{}",
                list.iter()
                    .filter(|m| m.state == Some(ProcessState::Stopped))
                    .map(|m| m.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                also(&inspect)
            ),
        ),
        _ if list.is_empty() => (
            format!(
                "hung: {inside}, and every rank on this host waits: collectives called in a \
                 different order or with different sizes on different ranks, or a rank on \
                 another node missing"
            ),
            "See each rank's last collective: PyTorch's flight recorder \
             (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, dumped when the watchdog fires), `py-spy dump \
             --pid PID` of each rank, and NCCL's RAS (`ncclras`, port 28028) for the ranks that \
             lag. A job spanning nodes: look at the other nodes' verdicts for the missing rank. \
             PyTorch's watchdog ends the job only at its timeout (10 minutes by default): end it \
             to free the GPUs."
                .to_owned(),
        ),
        _ => (
            format!("hung: {inside}, waiting for {described}"),
            format!(
                "See where it waits:{} PyTorch's flight recorder \
                 (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, dumped when the watchdog fires) shows each \
                 rank's last collective, and NCCL's RAS (`ncclras`, port 28028) the ranks that \
                 lag. PyTorch's watchdog ends the job only at its timeout (10 minutes by \
                 default): end it to free the GPUs once you have looked.",
                if inspect.is_empty() {
                    String::new()
                } else {
                    format!(" `{}`.", inspect.join("`, `"))
                }
            ),
        ),
    };
    Seen::Found(Box::new(StallFound {
        pattern,
        confidence,
        title,
        advice,
        stall: stall(list),
        stragglers: Vec::new(),
        evidence,
    }))
}

fn also(inspect: &[String]) -> String {
    if inspect.is_empty() {
        String::new()
    } else {
        format!(" Where it still runs: `{}`.", inspect.join("`, `"))
    }
}

/// "GPU 3 (rank 3), asleep with no CPU progress since 12:00:01".
fn describe(m: &MissingRank, why: Why) -> String {
    let name = gpu_name(m.device, m.rank);
    let pid = m.pid;
    match why {
        Why::Exited => match m.left_ms {
            Some(_) => format!("{name}, whose process (pid {pid}) exited"),
            None => format!("{name}, whose process (pid {pid}) is a zombie: it exited"),
        },
        Why::Stopped => format!("{name}, whose process (pid {pid}) is stopped"),
        Why::Busy => format!(
            "{name}, whose process (pid {pid}) is {}{},",
            m.state.map_or("of unread state", |s| match s {
                ProcessState::DiskSleep => "in I/O",
                other => other.name(),
            }),
            m.cpu_pct
                .map(|c| format!(" at {c:.0}% CPU"))
                .unwrap_or_default()
        ),
        Why::Asleep => format!(
            "{name}, whose process (pid {pid}) is asleep with no CPU progress ({})",
            m.cpu_pct
                .map_or_else(|| "CPU unread".to_owned(), |c| format!("{c:.0}% CPU"))
        ),
        Why::Unknown => {
            format!("{name} (pid {pid}), whose GPU idles; its process's state could not be read")
        }
    }
}

/// What a missing rank's process does over `span`.
fn missing_rank(
    input: &RuleInput<'_>,
    config: &JobConfig,
    rank: &Rank,
    (since, end): (TimeMs, TimeMs),
) -> (MissingRank, Why) {
    let device = rank.member.device;
    let pid = rank.member.pid;
    let cpu = input.process_cpu;
    let state = cpu.and_then(|c| c.state_at(device, pid, end));
    let cpu_pct = cpu
        .and_then(|c| c.cpu_pct(device, pid, since, end))
        .map(round2);
    let left = rank.left_ms.filter(|&t| t < end);
    let why = if left.is_some() || state.is_some_and(|(s, _)| s.exited()) {
        Why::Exited
    } else if state.is_some_and(|(s, _)| s == ProcessState::Stopped) {
        Why::Stopped
    } else if cpu_pct.is_some_and(|c| c >= config.host_progress_cpu_pct)
        || state.is_some_and(|(s, _)| matches!(s, ProcessState::Running | ProcessState::DiskSleep))
    {
        Why::Busy
    } else if state.is_some() || cpu_pct.is_some() {
        Why::Asleep
    } else {
        Why::Unknown
    };
    let running = !matches!(why, Why::Exited);
    let missing = MissingRank {
        device,
        rank: rank.member.rank,
        pid,
        state: if left.is_some() {
            None
        } else {
            state.map(|(s, _)| s)
        },
        left_ms: left,
        since_ms: state.map(|(_, t)| t).filter(|_| left.is_none()),
        cpu_pct,
        inspect: (running && why != Why::Stopped).then(|| format!("py-spy dump --pid {pid}")),
    };
    (missing, why)
}

/// "A, B and C".
pub(super) fn names(items: impl IntoIterator<Item = String>) -> String {
    let v: Vec<String> = items.into_iter().collect();
    match v.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}
