//! Which rank its peers wait for, read from the collectives themselves. A collective that every
//! rank takes part in (an all-reduce, all-gather, reduce-scatter) ends at about the same moment
//! on every rank, since none can finish before the last has arrived: the rank whose kernel
//! starts last is the one the others waited for, and they waited the difference. A rank that is
//! only 5% slower causes nearly all the waiting, where comparing NCCL shares needs the gap to
//! stand out of step-to-step noise.
//!
//! The same collective is found on every rank as the kernel of the same name whose run overlaps
//! (ends within `END_TOLERANCE_NS` of) the reference rank's: a rank's runs of one collective
//! follow each other on its stream, so at most one of them overlaps. Collectives of a subgroup
//! (tensor-parallel pairs inside a larger job) are not matched: only those every rank that ran
//! NCCL kernels took part in are.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use gpudiag_model::kernels::{NcclArrival, NcclArrivals};

/// One run of an NCCL kernel: Unix ns, and its name's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Run {
    start: u64,
    end: u64,
    name: u64,
}

/// The latest NCCL kernels of one process, oldest first.
#[derive(Debug, Default, Clone)]
pub(crate) struct NcclTimeline {
    runs: VecDeque<Run>,
    /// Runs dropped from the front for the cap.
    pub(crate) dropped: u64,
}

impl NcclTimeline {
    pub(crate) fn push(&mut self, start: u64, end: u64, name: &str, cap: usize) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        self.runs.push_back(Run {
            start,
            end,
            name: h.finish(),
        });
        while self.runs.len() > cap {
            self.runs.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
    }
}

/// Two runs of one collective end this close on every rank, whatever their clocks' pairing
/// adds (a few µs); runs of the next collective start after this one ended.
const END_TOLERANCE_NS: u64 = 1_000_000;
/// Collectives matched before the order of arrivals says anything.
pub const MIN_MATCHED: u64 = 20;
/// The share of all the waiting at matched collectives a rank must cause to be the one its
/// peers wait for. Counting collectives alone misses a rank that is late by a millisecond at
/// most of them and early by microseconds at the rest: on two H200s, a rank doing 1.04x the
/// work arrived last at 72% of 685 all-reduces, and caused 96% of the waiting.
pub const MIN_WAITING_SHARE: f64 = 0.75;
/// And the wait it costs each peer, as a share of the time recorded: below it a rank that is
/// always last by a few µs (rank 0 logging) is no straggler.
pub const MIN_WAIT_SHARE: f64 = 0.01;

/// The order in which `timelines` (pid, its NCCL runs) arrived at the collectives they all took
/// part in; `span_s` is the time each process's figures are of (its recorded time). `None`
/// with fewer than two processes that ran NCCL kernels.
pub(crate) fn arrivals(
    timelines: &[(u32, &NcclTimeline)],
    span_s: impl Fn(u32) -> Option<f64>,
) -> Option<NcclArrivals> {
    let ranks: Vec<(u32, Vec<Run>)> = timelines
        .iter()
        .filter(|(_, t)| !t.runs.is_empty())
        .map(|(pid, t)| {
            let mut runs: Vec<Run> = t.runs.iter().copied().collect();
            runs.sort_unstable();
            (*pid, runs)
        })
        .collect();
    if ranks.len() < 2 {
        return None;
    }
    let n = ranks.len();
    let mut last = vec![0u64; n];
    let mut caused_ns = vec![0u128; n];
    let mut matched = 0u64;
    // Each run of the others is matched once.
    let mut used: Vec<Vec<bool>> = ranks.iter().map(|(_, r)| vec![false; r.len()]).collect();
    let (reference, others) = ranks.split_first()?;
    for &run in &reference.1 {
        let mut starts = Vec::with_capacity(n);
        starts.push(run.start);
        let mut picks = Vec::with_capacity(n - 1);
        for (i, (_, runs)) in others.iter().enumerate() {
            let Some(j) = matching_run(runs, &used[i + 1], run) else {
                break;
            };
            picks.push(j);
            starts.push(runs[j].start);
        }
        if picks.len() != n - 1 {
            continue;
        }
        for (i, &j) in picks.iter().enumerate() {
            used[i + 1][j] = true;
        }
        matched += 1;
        let (latest_at, latest) = starts
            .iter()
            .enumerate()
            .max_by_key(|&(i, s)| (*s, std::cmp::Reverse(i)))
            .map(|(i, s)| (i, *s))?;
        last[latest_at] += 1;
        let waited: u128 = starts.iter().map(|&s| u128::from(latest - s)).sum();
        caused_ns[latest_at] += waited / (n as u128 - 1);
    }
    let by_pid: Vec<NcclArrival> = ranks
        .iter()
        .enumerate()
        .map(|(i, (pid, _))| NcclArrival {
            pid: *pid,
            last: last[i],
            last_share: if matched > 0 {
                last[i] as f64 / matched as f64
            } else {
                0.0
            },
            peers_waited_s: caused_ns[i] as f64 / 1e9,
        })
        .collect();
    let mut found = NcclArrivals {
        matched,
        unmatched: reference.1.len() as u64 - matched,
        by_pid,
        waited_for: None,
    };
    let chance = 1.0 / n as f64;
    found.waited_for = (matched >= MIN_MATCHED)
        .then(|| {
            found
                .by_pid
                .iter()
                .filter(|a| {
                    found
                        .share_of_waiting(a.pid)
                        .is_some_and(|share| share >= MIN_WAITING_SHARE)
                        && a.last_share > chance
                })
                .find(|a| {
                    let spans: Vec<f64> = found
                        .by_pid
                        .iter()
                        .filter(|p| p.pid != a.pid)
                        .filter_map(|p| span_s(p.pid))
                        .collect();
                    let shortest = spans.iter().copied().fold(f64::INFINITY, f64::min);
                    shortest.is_finite()
                        && shortest > 0.0
                        && a.peers_waited_s / shortest >= MIN_WAIT_SHARE
                })
                .map(|a| a.pid)
        })
        .flatten();
    Some(found)
}

/// The run in `runs` (sorted by start) of the same collective as `of`: the same kernel, overlapping
/// it and ending closest to its end, within the tolerance, not matched before.
fn matching_run(runs: &[Run], used: &[bool], of: Run) -> Option<usize> {
    let before_end = runs.partition_point(|r| r.start <= of.end.saturating_add(END_TOLERANCE_NS));
    runs[..before_end]
        .iter()
        .enumerate()
        .rev()
        // Runs of one stream do not overlap: a few steps back reach past every candidate.
        .take(64)
        .filter(|&(j, r)| !used[j] && r.name == of.name)
        .filter(|(_, r)| r.end.abs_diff(of.end) <= END_TOLERANCE_NS)
        .min_by_key(|(_, r)| r.end.abs_diff(of.end))
        .map(|(j, _)| j)
}
