//! What the rules keep per process across ticks, since the history is per device: each
//! process's memory (for the leak rule) and its CPU time and SM use (for the verdict's host-side
//! evidence). Below every rule: the engine feeds it, the rules read it.

use std::collections::{BTreeMap, VecDeque};

use gpudiag_model::sample::{ProcessState, Sample, TimeMs};

/// Per-(device, pid) memory series, bounded by the leak window.
#[derive(Debug, Default, Clone)]
pub struct ProcessMemory {
    pub(crate) series: BTreeMap<(u32, u32), ProcessSeries>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct ProcessSeries {
    pub(crate) name: Option<String>,
    pub(crate) points: VecDeque<(TimeMs, f64)>,
    /// The last sample that listed the process: an unchanged value is kept once a second, so
    /// the points alone would place its exit up to a second early.
    pub(crate) last_seen_ms: TimeMs,
}

impl ProcessMemory {
    /// Takes the process list of a sample. Process lists refresh on the slow cadence while
    /// samples repeat them every tick, so a point is kept only when the value changed or a
    /// second has passed: the series stays small and its fit is not weighted by the tick rate.
    pub fn observe(&mut self, s: &Sample, window_ms: u64) {
        let Some(processes) = &s.processes else {
            return;
        };
        for p in processes {
            let Some(bytes) = p.used_memory_bytes else {
                continue;
            };
            let series = self.series.entry((s.device, p.pid)).or_default();
            series.name.clone_from(&p.name);
            let v = bytes as f64;
            let keep = series
                .points
                .back()
                .is_none_or(|&(t, last)| last != v || s.time_ms >= t.saturating_add(1000));
            if keep {
                series.points.push_back((s.time_ms, v));
            }
            series.last_seen_ms = series.last_seen_ms.max(s.time_ms);
        }
        // Forget processes not seen for a whole window, and points older than the window.
        let cutoff = s.time_ms.saturating_sub(window_ms);
        self.series.retain(|&(device, _), series| {
            if device == s.device {
                while series.points.front().is_some_and(|&(t, _)| t < cutoff) {
                    series.points.pop_front();
                }
            }
            !series.points.is_empty()
        });
    }

    /// Processes that held at least `min_bytes` on `device` at some point of `[start, end]`:
    /// pid, name and the most they held.
    pub fn holders_in(
        &self,
        device: u32,
        start: TimeMs,
        end: TimeMs,
        min_bytes: f64,
    ) -> Vec<(u32, Option<String>, f64)> {
        self.series
            .range((device, 0)..=(device, u32::MAX))
            .filter_map(|(&(_, pid), series)| {
                let most = series
                    .points
                    .iter()
                    .filter(|(t, _)| (start..=end).contains(t))
                    .map(|&(_, b)| b)
                    .reduce(f64::max)?;
                (most >= min_bytes).then(|| (pid, series.name.clone(), most))
            })
            .collect()
    }

    /// The last time within `[start, end]` that a process other than `except` was seen
    /// holding at least `min_bytes` on `device`; `None` when none did. A process whose last
    /// value held that much held it until the last sample that listed it.
    pub fn last_held(
        &self,
        device: u32,
        start: TimeMs,
        end: TimeMs,
        min_bytes: f64,
        except: Option<u32>,
    ) -> Option<TimeMs> {
        self.series
            .range((device, 0)..=(device, u32::MAX))
            .filter(|&(&(_, pid), _)| Some(pid) != except)
            .filter_map(|(_, series)| {
                let last_point = series.points.back()?;
                let held_to_the_end = last_point.1 >= min_bytes;
                let until = if held_to_the_end {
                    series.last_seen_ms
                } else {
                    series
                        .points
                        .iter()
                        .filter(|&&(_, b)| b >= min_bytes)
                        .map(|&(t, _)| t)
                        .max()?
                };
                (start..=end).contains(&until).then_some(until)
            })
            .max()
    }

    /// When `pid` was first seen on `device` within the retained window.
    pub fn first_seen(&self, device: u32, pid: u32) -> Option<TimeMs> {
        self.series
            .get(&(device, pid))
            .and_then(|s| s.points.front())
            .map(|&(t, _)| t)
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// Per-process CPU time as /proc reported it and SM use as the driver reported it, at most one
/// point a second each, for the shares over any window the history still covers. A process that
/// left the GPU keeps its series for a while: `run` judges after its command exited, and the
/// processes it judges have left every list by then.
#[derive(Debug, Default, Clone)]
pub struct ProcessCpu {
    series: BTreeMap<(u32, u32), ProcessActivity>,
}

#[derive(Debug, Default, Clone)]
struct ProcessActivity {
    cpu_time: VecDeque<(TimeMs, f64)>,
    sm_util: VecDeque<(TimeMs, f64)>,
    /// GPU memory it held when last listed, to keep each device's biggest holder.
    memory_bytes: Option<u64>,
    /// When the process was last in its device's list.
    last_seen_ms: TimeMs,
    /// Its scheduling state where it changed (a point at each change, and the first read).
    states: VecDeque<(TimeMs, ProcessState)>,
    /// When it started, as /proc said: a pid that comes back with another start is a new
    /// process, and its series start over.
    started_ms: Option<TimeMs>,
}

/// An hour of 1 Hz points per process.
const MAX_CPU_POINTS: usize = 3600;
/// How long a process that left its GPU's list keeps its series.
const KEEP_GONE_MS: u64 = 10 * 60 * 1000;
/// Processes kept at most: a host that starts many short processes must not grow these tables
/// without bound.
pub(crate) const MAX_PROCESSES: usize = 1024;

/// Forgets the processes of `s`'s device not listed for [`KEEP_GONE_MS`]; then, beyond
/// [`MAX_PROCESSES`], the longest unseen first and, among those seen as recently, the smallest
/// holders first, but never a device's biggest holder: that is the process a job's member is
/// taken from, and evicting it would shrink the job without a word. Returns how many it
/// dropped for the cap.
fn forget_gone<V>(
    processes: &mut BTreeMap<(u32, u32), V>,
    s: &Sample,
    last_seen: impl Fn(&V) -> TimeMs,
    memory: impl Fn(&V) -> Option<u64>,
) -> usize {
    let cutoff = s.time_ms.saturating_sub(KEEP_GONE_MS);
    processes.retain(|&(device, _), v| device != s.device || last_seen(v) >= cutoff);
    if processes.len() <= MAX_PROCESSES {
        return 0;
    }
    let mut biggest: BTreeMap<u32, ((u32, u32), u64)> = BTreeMap::new();
    for (&key, v) in processes.iter() {
        let Some(bytes) = memory(v) else { continue };
        let held = biggest.entry(key.0).or_insert((key, bytes));
        if bytes > held.1 {
            *held = (key, bytes);
        }
    }
    let kept: std::collections::BTreeSet<(u32, u32)> =
        biggest.values().map(|&(key, _)| key).collect();
    let mut by_age: Vec<((u32, u32), TimeMs, u64)> = processes
        .iter()
        .filter(|(key, _)| !kept.contains(key))
        .map(|(&k, v)| (k, last_seen(v), memory(v).unwrap_or(0)))
        .collect();
    by_age.sort_by_key(|&(_, t, bytes)| (t, bytes));
    let excess = processes.len() - MAX_PROCESSES;
    for (key, _, _) in by_age.iter().take(excess) {
        processes.remove(key);
    }
    excess.min(by_age.len())
}

fn push_point(series: &mut VecDeque<(TimeMs, f64)>, t: TimeMs, v: f64) {
    if series
        .back()
        .is_some_and(|&(last, _)| t < last.saturating_add(1000))
    {
        return;
    }
    if series.len() == MAX_CPU_POINTS {
        series.pop_front();
    }
    series.push_back((t, v));
}

impl ProcessCpu {
    pub fn observe(&mut self, s: &Sample) {
        let Some(procs) = &s.processes else { return };
        for p in procs {
            let entry = self.series.entry((s.device, p.pid)).or_default();
            if let (Some(was), Some(now)) = (entry.started_ms, p.started_ms)
                && was != now
            {
                *entry = ProcessActivity::default();
            }
            if p.started_ms.is_some() {
                entry.started_ms = p.started_ms;
            }
            entry.last_seen_ms = entry.last_seen_ms.max(s.time_ms);
            if let Some(state) = p.state
                && entry.states.back().is_none_or(|&(_, last)| last != state)
            {
                if entry.states.len() == MAX_CPU_POINTS {
                    entry.states.pop_front();
                }
                entry.states.push_back((s.time_ms, state));
            }
            if p.used_memory_bytes.is_some() {
                entry.memory_bytes = p.used_memory_bytes;
            }
            if let Some(cpu) = p.cpu_time_s {
                push_point(&mut entry.cpu_time, s.time_ms, cpu);
            }
            if let Some(sm) = p.sm_util_pct {
                push_point(&mut entry.sm_util, s.time_ms, sm);
            }
        }
        forget_gone(&mut self.series, s, |a| a.last_seen_ms, |a| a.memory_bytes);
    }

    /// CPU use of `pid` in `[start, end]`, in % of one core.
    pub fn cpu_pct(&self, device: u32, pid: u32, start: TimeMs, end: TimeMs) -> Option<f64> {
        let series = &self.series.get(&(device, pid))?.cpu_time;
        let mut inside = series.iter().filter(|(t, _)| (start..=end).contains(t));
        let (t0, c0) = inside.next()?;
        let (t1, c1) = inside.next_back()?;
        let dt = t1.saturating_sub(*t0) as f64 / 1000.0;
        (dt >= 1.0).then(|| ((c1 - c0) / dt * 100.0).max(0.0))
    }

    /// The state `pid` was last read in at or before `at`, and since when it has been in it
    /// (the first read of that state after another, or the first read at all); `None` where no
    /// state was read.
    pub fn state_at(&self, device: u32, pid: u32, at: TimeMs) -> Option<(ProcessState, TimeMs)> {
        let states = &self.series.get(&(device, pid))?.states;
        let i = states.iter().rposition(|&(t, _)| t <= at)?;
        Some((states[i].1, states[i].0))
    }

    /// When `pid` was last listed on `device`, while its series is kept.
    pub fn last_seen(&self, device: u32, pid: u32) -> Option<TimeMs> {
        self.series.get(&(device, pid)).map(|a| a.last_seen_ms)
    }

    /// Mean SM use of `pid` on `device` in `[start, end]` as the driver reported it, in %.
    pub fn sm_util_pct(&self, device: u32, pid: u32, start: TimeMs, end: TimeMs) -> Option<f64> {
        let series = &self.series.get(&(device, pid))?.sm_util;
        let (n, sum) = series
            .iter()
            .filter(|(t, _)| (start..=end).contains(t))
            .fold((0usize, 0.0), |(n, sum), &(_, v)| (n + 1, sum + v));
        (n > 0).then(|| sum / n as f64)
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// Who each GPU process is and who started it, as last read, for grouping GPUs into jobs. A
/// process that left its GPU's list is kept as long as [`ProcessCpu`] keeps its series, so a
/// job is still whole when `run` judges it after its command exited.
#[derive(Debug, Default, Clone)]
pub struct ProcessLaunch {
    pub(crate) seen: BTreeMap<(u32, u32), SeenProcess>,
    /// When the cap last dropped processes still listed or recently gone, and how many it has
    /// dropped in all: a job judged after that may miss ranks, and says so.
    pub(crate) last_eviction_ms: Option<TimeMs>,
    pub(crate) evicted: u64,
}

/// A process as last read on one GPU.
#[derive(Debug, Clone)]
pub(crate) struct SeenProcess {
    pub(crate) name: Option<String>,
    /// The user it runs as: processes of different users are never one job.
    pub(crate) user: Option<String>,
    /// GPU memory it held when last listed.
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) launch: Option<gpudiag_model::job::Launch>,
    /// The key that ties it to its job's other ranks on any node, as last read.
    pub(crate) cluster: Option<gpudiag_model::job::JobId>,
    /// Its owners as last read, to tell when the key needs reading again.
    pub(crate) attribution: Option<gpudiag_model::attribution::Attribution>,
    pub(crate) first_seen_ms: TimeMs,
    pub(crate) last_seen_ms: TimeMs,
}

impl ProcessLaunch {
    pub fn observe(&mut self, s: &Sample, host: Option<&str>) {
        let Some(procs) = &s.processes else { return };
        for p in procs {
            let entry = self
                .seen
                .entry((s.device, p.pid))
                .or_insert_with(|| SeenProcess {
                    name: None,
                    user: None,
                    memory_bytes: None,
                    launch: None,
                    cluster: None,
                    attribution: None,
                    first_seen_ms: s.time_ms,
                    last_seen_ms: s.time_ms,
                });
            // Samples repeat the slow-cadence process list on every tick: only a list that
            // says something new is copied and keyed again.
            if entry.name != p.name {
                entry.name.clone_from(&p.name);
            }
            if p.user.is_some() && entry.user != p.user {
                entry.user.clone_from(&p.user);
            }
            if p.used_memory_bytes.is_some() {
                entry.memory_bytes = p.used_memory_bytes;
            }
            // A later read that could not look keeps what an earlier one saw.
            let new_launch = p.launch.is_some() && entry.launch != p.launch;
            if new_launch {
                entry.launch.clone_from(&p.launch);
            }
            if new_launch || entry.attribution != p.attribution {
                entry.attribution.clone_from(&p.attribution);
                let cluster = gpudiag_model::job::cluster_key(
                    p.attribution.as_ref(),
                    entry.launch.as_ref(),
                    host,
                );
                if cluster.is_some() {
                    entry.cluster = cluster;
                }
            }
            entry.first_seen_ms = entry.first_seen_ms.min(s.time_ms);
            entry.last_seen_ms = entry.last_seen_ms.max(s.time_ms);
        }
        let dropped = forget_gone(&mut self.seen, s, |p| p.last_seen_ms, |p| p.memory_bytes);
        if dropped > 0 {
            self.evicted += dropped as u64;
            self.last_eviction_ms = Some(s.time_ms);
        }
    }

    /// The processes seen on any GPU within `[start, end]`, by (device, pid).
    pub(crate) fn within(
        &self,
        start: TimeMs,
        end: TimeMs,
    ) -> impl Iterator<Item = (&(u32, u32), &SeenProcess)> + '_ {
        self.seen
            .iter()
            .filter(move |(_, p)| p.last_seen_ms >= start && p.first_seen_ms <= end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::sample::ProcessSample;

    fn process(pid: u32, bytes: u64) -> ProcessSample {
        ProcessSample {
            pid,
            name: Some("python3".into()),
            user: None,
            kind: Some("compute".into()),
            used_memory_bytes: Some(bytes),
            sm_util_pct: None,
            container_id: None,
            container_pid: None,
            cpu_time_s: Some(1.0),
            attribution: None,
            launch: None,
            state: None,
            started_ms: None,
        }
    }

    /// 2,048 live processes on eight GPUs, each GPU's biggest a rank of one job: past the cap
    /// every rank stays (the job stays whole), and the eviction is counted.
    #[test]
    fn the_cap_keeps_each_gpus_biggest_process_and_counts_what_it_drops() {
        let mut launches = ProcessLaunch::default();
        let mut cpu = ProcessCpu::default();
        for tick in 0..3u64 {
            for device in 0..8u32 {
                let mut list = vec![process(1000 + device, 60 << 30)];
                list.extend((0..255).map(|i| process(10_000 + device * 1000 + i, 100 << 20)));
                let s = Sample {
                    processes: Some(list),
                    ..Sample::new(device, 1_000 + tick * 1000)
                };
                launches.observe(&s, None);
                cpu.observe(&s);
            }
        }
        assert_eq!(launches.seen.len(), MAX_PROCESSES);
        assert_eq!(cpu.len(), MAX_PROCESSES);
        for device in 0..8 {
            assert!(
                launches.seen.contains_key(&(device, 1000 + device)),
                "{device}"
            );
            assert!(
                cpu.series.contains_key(&(device, 1000 + device)),
                "{device}"
            );
        }
        assert!(launches.evicted >= 1024, "{}", launches.evicted);
        assert!(launches.last_eviction_ms.is_some());
    }
}
