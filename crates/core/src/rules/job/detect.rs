//! The patterns a job's GPUs side by side can show, one detector each, tried in order: the first
//! that sees its pattern gives the verdict, and a job none sees is balanced.
//!
//! - memory spread: replicas hold the same memory, pipeline stages do not; a gap in work
//!   between GPUs holding unequal memory is the job's shape (`imbalanced`);
//! - lag: GPUs idle while their peers read busy, their processes late to launch;
//! - lead: one GPU, or a few together, do more work while the rest, alike, wait;
//! - graded: work spread across the GPUs with no group apart (`imbalanced`);
//! - communication: every GPU moves many bytes between GPUs while its tensor pipes idle.
//!
//! Lag is judged before lead: a rank short of CPU leaves its GPU idle, and its peers, spinning
//! in the collective, then read more SM activity than it. A new pattern is one more detector.

use serde_json::json;

use super::figures::{
    Differences, FigureOf, GB, GIB, Gpu, differences, gbps, gib, gpu_name, median, pct,
};
use super::identity::list;
use crate::config::JobConfig;
use crate::rules::round2;
use gpudiag_model::job::{JobPattern, Pace, Straggler};
use gpudiag_model::verdict::Confidence;

/// A job's GPUs side by side, what the detectors read.
pub(super) struct Comparison<'a> {
    pub(super) config: &'a JobConfig,
    pub(super) gpus: Vec<Gpu>,
    /// The work figure compared (`sm_active_pct`, else `power_w`) and how to read it.
    pub(super) work_key: &'static str,
    pub(super) work: FigureOf,
    /// The figures compared and the thresholds, for the verdict's evidence.
    pub(super) evidence: serde_json::Map<String, serde_json::Value>,
}

/// What a detector saw: the verdict but for the job's name and members.
pub(super) struct Found {
    pub(super) pattern: JobPattern,
    pub(super) confidence: Confidence,
    /// The verdict in words, after "Job … on N GPUs: ".
    pub(super) title: String,
    pub(super) advice: String,
    /// The GPUs the others wait for, the one setting the pace most first.
    pub(super) stragglers: Vec<Straggler>,
}

type Detector = fn(&mut Comparison<'_>) -> Option<Found>;

/// The detectors in the order they are tried.
pub(super) const DETECTORS: [(&str, Detector); 5] = [
    ("memory_spread", memory_spread),
    ("lag", lag),
    ("lead", lead),
    ("graded", graded),
    ("communication", communication),
];

impl Comparison<'_> {
    fn works(&self) -> Vec<f64> {
        self.gpus
            .iter()
            .filter_map(|g| (self.work)(&g.figures))
            .collect()
    }

    fn others(&self, i: usize) -> impl Iterator<Item = &Gpu> + '_ {
        self.gpus
            .iter()
            .enumerate()
            .filter(move |(j, _)| *j != i)
            .map(|(_, g)| g)
    }

    /// The lowest and highest work figure.
    fn work_range(&self) -> (f64, f64) {
        self.works()
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &w| {
                (lo.min(w), hi.max(w))
            })
    }

    fn straggler(&self, i: usize, pace: Pace, metric: &str, value: f64, peers: f64) -> Straggler {
        let g = &self.gpus[i];
        let peer_gpus: Vec<&Gpu> = self.others(i).collect();
        let (share, how) = match pace {
            Pace::Leads => (
                (1.0 - peers / value).clamp(0.0, 1.0),
                format!(
                    "1 − peers' {m} / its {m}: every rank runs the same steps, so the peers' \
                     lower activity is time they wait (a lower bound: their spinning in the \
                     collective counts as activity)",
                    m = work_label(metric)
                ),
            ),
            Pace::Lags => (
                ((peers - value) / 100.0).clamp(0.0, 1.0),
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
            peers_median: round2(peers),
            peers_wait_share: Some(round2(share)),
            wait_estimate: how,
            differs: differences(g, &peer_gpus).lines,
        }
    }

    fn differences_of(&self, device: u32) -> Option<Differences> {
        let i = self.gpus.iter().position(|g| g.figures.device == device)?;
        let peers: Vec<&Gpu> = self.others(i).collect();
        Some(differences(&self.gpus[i], &peers))
    }
}

/// Replicas hold the same memory; stages of a pipeline do not.
fn memory_spread(c: &mut Comparison<'_>) -> Option<Found> {
    let config = c.config;
    let memory: Vec<f64> = c
        .gpus
        .iter()
        .filter_map(|g| g.figures.job_memory_bytes.map(|b| b as f64))
        .collect();
    let (lo, hi) = memory.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &b| {
        (lo.min(b), hi.max(b))
    });
    let whole = memory.len() == c.gpus.len() && lo > 0.0;
    c.evidence.insert(
        "memory_spread_ratio".into(),
        json!(whole.then(|| round2(hi / lo))),
    );
    let ratio = whole.then(|| hi / lo).filter(|&r| {
        r >= config.memory_spread_ratio && hi - lo >= config.memory_spread_min_gib * GIB
    })?;
    let heaviest = c
        .gpus
        .iter()
        .max_by(|a, b| a.figures.job_memory_bytes.cmp(&b.figures.job_memory_bytes))
        .map(|g| gpu_name(g.figures.device, g.figures.rank))
        .unwrap_or_default();
    let (work_lo, work_hi) = c.work_range();
    Some(Found {
        pattern: JobPattern::Imbalanced,
        confidence: Confidence::Medium,
        title: format!(
            "imbalanced: its processes hold {} to {} ({ratio:.1}×, most on {heaviest}) and {} \
             ranges {} to {}: the GPUs do unequal shares, as pipeline stages do",
            gib(lo),
            gib(hi),
            work_label(c.work_key),
            figure(c.work_key, work_lo),
            figure(c.work_key, work_hi),
        ),
        advice: "Balance the stages: move layers from the heaviest stage to the lightest, \
                 partitioning by measured time and memory rather than layer count, and use \
                 more micro-batches to shrink the pipeline bubble. If the GPUs should be \
                 replicas (data parallel), find why one holds more (a rank that also \
                 evaluates or logs, uneven sequence lengths)."
            .to_owned(),
        stragglers: Vec::new(),
    })
}

/// GPUs idle while their peers read busy: each GPU whose utilisation is well below the median
/// of the others', while that median reads busy. Half the job or fewer: when most lag, the
/// busy few are not waiting for them.
fn lag(c: &mut Comparison<'_>) -> Option<Found> {
    let config = c.config;
    let util = |g: &Gpu| g.figures.gpu_util_pct;
    let mut lagging: Vec<(usize, f64, f64)> = c
        .gpus
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let u = util(g)?;
            let peers = median(c.others(i).filter_map(util))?;
            (peers >= config.peers_busy_util_pct && peers - u >= config.lag_util_points)
                .then_some((i, u, peers))
        })
        .collect();
    if lagging.is_empty() || lagging.len() > c.gpus.len() / 2 {
        return None;
    }
    lagging.sort_by(|a, b| (b.2 - b.1).total_cmp(&(a.2 - a.1)));
    let stragglers: Vec<Straggler> = lagging
        .iter()
        .map(|&(i, u, peers)| c.straggler(i, Pace::Lags, "gpu_util_pct", u, peers))
        .collect();
    let (_, u, peers) = lagging[0];
    let confidence = if peers - u >= 2.0 * config.lag_util_points {
        Confidence::High
    } else {
        Confidence::Medium
    };
    let who = names(&stragglers);
    let first = &stragglers[0];
    let title = if stragglers.len() == 1 {
        format!(
            "{who} is the straggler: it lags, utilisation {} against its peers' {} while they \
             wait in collectives, about {} of the time{}",
            pct(u),
            pct(peers),
            pct(first.peers_wait_share.unwrap_or(0.0) * 100.0),
            because(&first.differs)
        )
    } else {
        format!(
            "{who} are the stragglers: they lag, utilisation {} against their peers' {} while \
             the others wait in collectives, about {} of the time{}",
            values(&stragglers, "gpu_util_pct"),
            pct(peers),
            pct(first.peers_wait_share.unwrap_or(0.0) * 100.0),
            because_on(first)
        )
    };
    let (process, rank, launches) = if stragglers.len() == 1 {
        ("The process on", "that rank", "launches its GPU's work")
    } else {
        ("The processes on", "those ranks", "launch their GPUs' work")
    };
    let advice = format!(
        "{process} {who} {launches} late, so every rank waits. Give {rank} more CPU: check \
         its CPU affinity and cgroup limit, what else runs on its cores (`top -H`), its \
         DataLoader (num_workers, pin_memory, prefetch), and keep per-rank work outside the \
         step (logging, evaluation, checkpointing) off the critical path or equal on every \
         rank."
    );
    Some(Found {
        pattern: JobPattern::Straggler,
        confidence,
        title,
        advice,
        stragglers,
    })
}

/// The leaders of a job: the fewest GPUs at the top (at most half the job) that do at least
/// `lead_ratio` × the rest's median work (and 10 points more SM active), alike among
/// themselves, while the rest are alike too (they all wait). `None` where no such split
/// exists. Returns the leaders' indices, busiest first, and the rest's median.
fn leaders(c: &Comparison<'_>) -> Option<(Vec<usize>, f64)> {
    let ratio = c.config.lead_ratio;
    let mut order: Vec<(usize, f64)> = c
        .gpus
        .iter()
        .enumerate()
        .filter_map(|(i, g)| Some((i, (c.work)(&g.figures)?)))
        .collect();
    if order.len() != c.gpus.len() {
        return None;
    }
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    let alike = |v: &[(usize, f64)]| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &(_, w)| {
            (lo.min(w), hi.max(w))
        });
        v.len() < 2 || (lo > 0.0 && hi / lo < ratio)
    };
    (1..=(order.len() / 2).max(1)).find_map(|k| {
        let (top, rest) = order.split_at(k);
        let peers = median(rest.iter().map(|&(_, w)| w))?;
        let lowest_leader = top.last()?.1;
        let points_ok =
            c.work_key != "sm_active_pct" || lowest_leader - peers >= c.config.lead_min_sm_points;
        (peers > 0.0 && lowest_leader / peers >= ratio && points_ok && alike(top) && alike(rest))
            .then(|| (top.iter().map(|&(i, _)| i).collect(), peers))
    })
}

/// One GPU, or a few together, do more work than the rest, who wait for them.
fn lead(c: &mut Comparison<'_>) -> Option<Found> {
    let (top, peers) = leaders(c)?;
    let stragglers: Vec<Straggler> = top
        .iter()
        .map(|&i| {
            let w = (c.work)(&c.gpus[i].figures).unwrap_or(0.0);
            c.straggler(i, Pace::Leads, c.work_key, w, peers)
        })
        .collect();
    let first = &stragglers[0];
    let w = first.value;
    let who = names(&stragglers);
    let wait = pct(first.peers_wait_share.unwrap_or(0.0) * 100.0);
    let title = if stragglers.len() == 1 {
        format!(
            "{who} is the straggler: {} {} against its peers' {} ({:.1}×); they wait for it \
             about {wait} of the time{}",
            work_label(c.work_key),
            figure(c.work_key, w),
            figure(c.work_key, peers),
            w / peers,
            because(&first.differs)
        )
    } else {
        let lowest = stragglers
            .iter()
            .map(|s| s.value)
            .fold(f64::INFINITY, f64::min);
        format!(
            "{who} are the stragglers: {} {} against their peers' {} ({:.1}× or more); the \
             others wait for them about {wait} of the time{}",
            work_label(c.work_key),
            values(&stragglers, c.work_key),
            figure(c.work_key, peers),
            lowest / peers,
            because_on(first)
        )
    };
    let found: Vec<Differences> = stragglers
        .iter()
        .filter_map(|s| c.differences_of(s.device))
        .collect();
    let shared = found.iter().any(|d| d.shared);
    let slower = found.iter().any(|d| d.slower_part);
    let mut advice = if stragglers.len() == 1 {
        format!("Every rank waits for {who}, the busiest GPU of the job.")
    } else {
        format!("Every other rank waits for {who}, the busiest GPUs of the job.")
    };
    if shared {
        advice.push_str(if stragglers.len() == 1 {
            " Another process shares its GPU: move it to a GPU of its own (or keep the job on \
             GPUs nobody else uses: CUDA_VISIBLE_DEVICES, Slurm's --exclusive)."
        } else {
            " Another process shares a straggler's GPU: move it to a GPU of its own (or keep \
             the job on GPUs nobody else uses: CUDA_VISIBLE_DEVICES, Slurm's --exclusive)."
        });
    }
    if slower {
        advice.push_str(
            " Its clocks run lower than its peers' below its power limit: check its cooling \
             and power (see its throttle findings) and compare it with `gpudiag probe matmul`.",
        );
    }
    advice.push_str(if shared || slower {
        " If that does not explain the gap, its rank has more work each step: uneven batches \
         or sequence lengths (bucket by length), or extra duties on one rank (logging, \
         evaluation, checkpointing) inside the step."
    } else if stragglers.len() == 1 {
        " Its rank has more work each step: uneven batches or sequence lengths (bucket by \
         length), or extra duties on one rank (logging, evaluation, checkpointing) inside \
         the step; move them off the step or spread them over every rank."
    } else {
        " Their ranks have more work each step: uneven shards, batches or sequence lengths \
         (bucket by length), or extra duties on some ranks inside the step; spread the work \
         over every rank."
    });
    let strong = w / peers >= 1.0 + 2.0 * (c.config.lead_ratio - 1.0);
    let confidence = if strong && c.work_key == "sm_active_pct" {
        Confidence::High
    } else {
        Confidence::Medium
    };
    Some(Found {
        pattern: JobPattern::Straggler,
        confidence,
        title,
        advice,
        stragglers,
    })
}

/// Work graded across three GPUs or more: the busiest stands out from the median of the
/// others, but the others spread as widely, so no group is apart (pipeline stages of unequal
/// size, uneven shards).
fn graded(c: &mut Comparison<'_>) -> Option<Found> {
    if c.gpus.len() < 3 {
        return None;
    }
    let ratio = c.config.lead_ratio;
    let (lo, hi) = c.work_range();
    let stands_out = (0..c.gpus.len()).any(|i| {
        let own = (c.work)(&c.gpus[i].figures);
        let peers = median(c.others(i).filter_map(|g| (c.work)(&g.figures)));
        matches!((own, peers), (Some(w), Some(p)) if p > 0.0 && w / p >= ratio
            && (c.work_key != "sm_active_pct" || w - p >= c.config.lead_min_sm_points))
    });
    if !stands_out || lo <= 0.0 || hi / lo < ratio {
        return None;
    }
    Some(Found {
        pattern: JobPattern::Imbalanced,
        confidence: Confidence::Medium,
        title: format!(
            "imbalanced: {} ranges from {} to {} across the GPUs, with no one GPU apart",
            work_label(c.work_key),
            figure(c.work_key, lo),
            figure(c.work_key, hi)
        ),
        advice: "Spread the work evenly: uneven shards or sequence lengths per rank, or \
                 pipeline stages of unequal size, leave the lighter GPUs waiting."
            .to_owned(),
        stragglers: Vec::new(),
    })
}

/// Every GPU moves many bytes between GPUs while its tensor pipes idle.
fn communication(c: &mut Comparison<'_>) -> Option<Found> {
    let config = c.config;
    let links: Vec<Option<f64>> = c
        .gpus
        .iter()
        .map(
            |g| match (g.figures.nvlink_bytes_per_s, g.figures.pcie_bytes_per_s) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
            },
        )
        .collect();
    let link_lo = links
        .iter()
        .copied()
        .collect::<Option<Vec<f64>>>()
        .map(|v| v.into_iter().fold(f64::INFINITY, f64::min));
    let tensor_hi = c
        .gpus
        .iter()
        .map(|g| g.figures.tensor_active_pct)
        .collect::<Option<Vec<f64>>>()
        .map(|v| v.into_iter().fold(0.0, f64::max));
    c.evidence
        .insert("link_min_bytes_per_s".into(), json!(link_lo.map(round2)));
    c.evidence
        .insert("tensor_max_pct".into(), json!(tensor_hi.map(round2)));
    let (link, tensor) = link_lo.zip(tensor_hi)?;
    if link < config.communication_min_gb_per_s * GB
        || tensor >= config.communication_max_tensor_pct
    {
        return None;
    }
    let link_hi = links.iter().flatten().copied().fold(0.0, f64::max);
    let sm = median(c.gpus.iter().filter_map(|g| g.figures.sm_active_pct));
    Some(Found {
        pattern: JobPattern::CommunicationBound,
        confidence: Confidence::Medium,
        title: format!(
            "communication-bound: every GPU moves {} to {} between GPUs while its tensor pipes \
             are active under {}{}",
            gbps(link),
            gbps(link_hi),
            pct(tensor.max(1.0)),
            sm.map(|s| format!(" (SM active {})", pct(s)))
                .unwrap_or_default()
        ),
        advice: "The GPUs spend the step exchanging data. Overlap communication with compute \
                 (DDP's bucket_cap_mb, gradient accumulation under no_sync, FSDP's forward and \
                 backward prefetch), make collectives fewer and larger, communicate in bf16, \
                 and check the links reach their peak: `gpudiag probe p2p nccl`."
            .to_owned(),
        stragglers: Vec::new(),
    })
}

/// No detector saw a pattern: the GPUs keep pace.
pub(super) fn balanced(c: &Comparison<'_>) -> Found {
    let (lo, hi) = c.work_range();
    Found {
        pattern: JobPattern::Balanced,
        confidence: Confidence::Medium,
        title: format!(
            "balanced: {} {} to {} across the GPUs; each GPU's own verdict says what bounds it",
            work_label(c.work_key),
            figure(c.work_key, lo),
            figure(c.work_key, hi)
        ),
        advice: "The GPUs keep pace with each other: see each GPU's verdict.".to_owned(),
        stragglers: Vec::new(),
    }
}

pub(super) fn work_label(key: &str) -> &'static str {
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

/// The first difference on the first of several stragglers, saying whose it is.
fn because_on(s: &Straggler) -> String {
    match s.differs.first() {
        Some(d) => format!("; on {}, {d}", gpu_name(s.device, s.rank)),
        None => String::new(),
    }
}

/// "GPU 2 (rank 2)", "GPUs 2 and 6", "GPUs 1, 2 and 3".
pub(super) fn names(stragglers: &[Straggler]) -> String {
    match stragglers {
        [one] => gpu_name(one.device, one.rank),
        several => {
            let mut devices: Vec<u32> = several.iter().map(|s| s.device).collect();
            devices.sort_unstable();
            format!("GPUs {}", list(&devices))
        }
    }
}

/// Each straggler's figure, in the order of their devices as [`names`] gives them: "90% and
/// 91%".
fn values(stragglers: &[Straggler], key: &str) -> String {
    let mut by_device: Vec<&Straggler> = stragglers.iter().collect();
    by_device.sort_by_key(|s| s.device);
    let figures: Vec<String> = by_device.iter().map(|s| figure(key, s.value)).collect();
    match figures.as_slice() {
        [init @ .., last] if !init.is_empty() => format!("{} and {last}", init.join(", ")),
        _ => figures.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::job::PeerFigures;

    const GIB_U: u64 = 1 << 30;

    fn gpu(device: u32, util: f64, sm: f64) -> Gpu {
        Gpu::with(PeerFigures {
            device,
            rank: Some(device),
            gpu_util_pct: Some(util),
            sm_active_pct: Some(sm),
            tensor_active_pct: Some(sm * 0.8),
            power_w: Some(300.0 + 4.0 * sm),
            job_memory_bytes: Some(40 * GIB_U),
            ..PeerFigures::default()
        })
    }

    fn compare(config: &JobConfig, gpus: Vec<Gpu>) -> Comparison<'_> {
        Comparison {
            config,
            gpus,
            work_key: "sm_active_pct",
            work: |f| f.sm_active_pct,
            evidence: serde_json::Map::new(),
        }
    }

    /// The first detector that sees its pattern, by name, and what it found.
    fn detect(config: &JobConfig, gpus: Vec<Gpu>) -> (&'static str, Found) {
        let mut c = compare(config, gpus);
        for (name, detector) in DETECTORS {
            if let Some(found) = detector(&mut c) {
                return (name, found);
            }
        }
        ("balanced", balanced(&c))
    }

    fn devices(found: &Found) -> Vec<u32> {
        found.stragglers.iter().map(|s| s.device).collect()
    }

    #[test]
    fn one_gpu_leading_is_the_straggler() {
        let config = JobConfig::default();
        let gpus = vec![
            gpu(0, 100.0, 45.0),
            gpu(1, 100.0, 46.0),
            gpu(2, 100.0, 90.0),
        ];
        let (name, found) = detect(&config, gpus);
        assert_eq!(name, "lead");
        assert_eq!(devices(&found), vec![2]);
        assert_eq!(found.stragglers[0].pace, Pace::Leads);
        assert!(
            found.title.starts_with("GPU 2 (rank 2) is the straggler"),
            "{}",
            found.title
        );
    }

    #[test]
    fn two_of_eight_leading_together_are_both_named() {
        let config = JobConfig::default();
        let gpus = (0..8)
            .map(|d| {
                let sm = if d == 2 || d == 6 {
                    90.0 + d as f64 / 10.0
                } else {
                    45.0
                };
                gpu(d, 100.0, sm)
            })
            .collect();
        let (name, found) = detect(&config, gpus);
        assert_eq!(name, "lead");
        assert_eq!(devices(&found), vec![6, 2]);
        assert!(
            found
                .title
                .starts_with("GPUs 2 and 6 are the stragglers: SM active 90% and 91%"),
            "{}",
            found.title
        );
        assert_eq!(found.pattern, JobPattern::Straggler);
    }

    #[test]
    fn graded_work_is_imbalanced_with_no_straggler() {
        let config = JobConfig::default();
        let gpus = vec![
            gpu(0, 100.0, 30.0),
            gpu(1, 100.0, 45.0),
            gpu(2, 100.0, 60.0),
            gpu(3, 100.0, 80.0),
        ];
        let (name, found) = detect(&config, gpus);
        assert_eq!(name, "graded");
        assert_eq!(found.pattern, JobPattern::Imbalanced);
        assert!(found.stragglers.is_empty());
    }

    #[test]
    fn idle_gpus_among_busy_peers_lag() {
        let config = JobConfig::default();
        let one = vec![gpu(0, 95.0, 50.0), gpu(1, 30.0, 20.0), gpu(2, 96.0, 52.0)];
        let (name, found) = detect(&config, one);
        assert_eq!(name, "lag");
        assert_eq!(devices(&found), vec![1]);
        assert_eq!(found.stragglers[0].pace, Pace::Lags);
        let two = (0..8)
            .map(|d| match d {
                3 => gpu(d, 20.0, 10.0),
                5 => gpu(d, 35.0, 20.0),
                _ => gpu(d, 96.0, 50.0),
            })
            .collect();
        let (name, found) = detect(&config, two);
        assert_eq!(name, "lag");
        assert_eq!(devices(&found), vec![3, 5]);
        // Most GPUs idle: the busy few do not wait for them; not a lag.
        let most = (0..4)
            .map(|d| {
                if d == 0 {
                    gpu(d, 96.0, 50.0)
                } else {
                    gpu(d, 20.0, 50.0)
                }
            })
            .collect();
        assert_ne!(detect(&config, most).0, "lag");
    }

    #[test]
    fn unequal_memory_is_a_pipeline_not_a_straggler() {
        let config = JobConfig::default();
        let mut gpus = vec![gpu(0, 100.0, 90.0), gpu(1, 100.0, 40.0)];
        gpus[1].figures.job_memory_bytes = Some(10 * GIB_U);
        let (name, found) = detect(&config, gpus);
        assert_eq!(name, "memory_spread");
        assert_eq!(found.pattern, JobPattern::Imbalanced);
    }

    #[test]
    fn every_gpu_exchanging_and_computing_little_is_communication_bound() {
        let config = JobConfig::default();
        let gpus = (0..4)
            .map(|d| {
                let mut g = gpu(d, 100.0, 30.0);
                g.figures.tensor_active_pct = Some(2.0);
                g.figures.nvlink_bytes_per_s = Some(150e9);
                g
            })
            .collect();
        let (name, found) = detect(&config, gpus);
        assert_eq!(name, "communication");
        assert_eq!(found.pattern, JobPattern::CommunicationBound);
    }

    #[test]
    fn gpus_keeping_pace_are_balanced() {
        let config = JobConfig::default();
        let gpus = (0..4).map(|d| gpu(d, 99.0, 80.0 + d as f64)).collect();
        let (name, found) = detect(&config, gpus);
        assert_eq!(name, "balanced");
        assert_eq!(found.pattern, JobPattern::Balanced);
    }
}
