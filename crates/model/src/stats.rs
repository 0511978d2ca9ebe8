//! Opt-in cost accounting: how many driver calls, process-list reads, allocations, rule
//! evaluations and redraws a run made, and how long the timed ones took. Off unless the binary
//! turns it on (`GPUDIAG_TICK_STATS=FILE`); then every layer counts into the same process-wide
//! counters and the binary writes them out at exit. While off, a count is one relaxed atomic
//! load, so the counting stays in the release build that runs on GPU hosts, where the
//! driver's share can only be seen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// What is counted. Names ending in `_ns` are nanoseconds; the others are counts or bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Telemetry ticks the consumer took in (the TUI's, or a check's single read).
    Ticks,
    /// Backend polls, and the time spent in them (the fast fields of every device).
    Polls,
    PollNs,
    /// Driver calls made by the fast poll (every tick).
    NvmlFastCalls,
    /// Profiling-counter (GPM) samples taken.
    GpmSamples,
    /// Slow-field rounds (PCIe throughput, processes, counters), their driver calls and time.
    SlowRounds,
    NvmlSlowCalls,
    SlowRoundNs,
    /// Process-list reads (the driver's list plus /proc for each process).
    ProcessListReads,
    /// Returns from the XID event thread's wait (each one a driver call).
    EventWaits,
    /// Heap allocations and bytes asked for (all threads).
    Allocs,
    AllocBytes,
    /// Pipeline work per tick (sanitise, history, rules) and its time.
    PipelinePushes,
    PipelineNs,
    /// Findings lists rebuilt for display, and their time.
    FindingsRefreshes,
    FindingsNs,
    /// Wake-ups of the UI loop (one per batch of events).
    LoopWakes,
    /// Frames drawn, frames skipped as unchanged, drawing time, bytes written to the terminal.
    Draws,
    DrawsSkipped,
    DrawNs,
    TerminalBytes,
}

impl Counter {
    pub const ALL: [Counter; 21] = [
        Counter::Ticks,
        Counter::Polls,
        Counter::PollNs,
        Counter::NvmlFastCalls,
        Counter::GpmSamples,
        Counter::SlowRounds,
        Counter::NvmlSlowCalls,
        Counter::SlowRoundNs,
        Counter::ProcessListReads,
        Counter::EventWaits,
        Counter::Allocs,
        Counter::AllocBytes,
        Counter::PipelinePushes,
        Counter::PipelineNs,
        Counter::FindingsRefreshes,
        Counter::FindingsNs,
        Counter::LoopWakes,
        Counter::Draws,
        Counter::DrawsSkipped,
        Counter::DrawNs,
        Counter::TerminalBytes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Ticks => "ticks",
            Counter::Polls => "polls",
            Counter::PollNs => "poll_ns",
            Counter::NvmlFastCalls => "nvml_fast_calls",
            Counter::GpmSamples => "gpm_samples",
            Counter::SlowRounds => "slow_rounds",
            Counter::NvmlSlowCalls => "nvml_slow_calls",
            Counter::SlowRoundNs => "slow_round_ns",
            Counter::ProcessListReads => "process_list_reads",
            Counter::EventWaits => "event_waits",
            Counter::Allocs => "allocs",
            Counter::AllocBytes => "alloc_bytes",
            Counter::PipelinePushes => "pipeline_pushes",
            Counter::PipelineNs => "pipeline_ns",
            Counter::FindingsRefreshes => "findings_refreshes",
            Counter::FindingsNs => "findings_ns",
            Counter::LoopWakes => "loop_wakes",
            Counter::Draws => "draws",
            Counter::DrawsSkipped => "draws_skipped",
            Counter::DrawNs => "draw_ns",
            Counter::TerminalBytes => "terminal_bytes",
        }
    }

    fn slot(self) -> &'static AtomicU64 {
        &COUNTS[self as usize]
    }
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static COUNTS: [AtomicU64; Counter::ALL.len()] = [ZERO; Counter::ALL.len()];

/// Turns counting on for the rest of the process.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Where [`mark`] sends a named moment: the binary's figures file, when it keeps one. A hook
/// rather than a dependency, so a library step (the check's source opened, its judgement made)
/// can mark itself without knowing who writes the figures.
static MARK_HOOK: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Sends every later [`mark`] to `hook`; only the first call takes effect.
pub fn set_mark_hook(hook: fn(&str)) {
    let _ = MARK_HOOK.set(hook);
}

/// Notes a named moment (the end of start-up, the first frame) where the figures are kept.
pub fn mark(name: &str) {
    if let Some(hook) = MARK_HOOK.get() {
        hook(name);
    }
}

/// Whether counting is on.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Adds `n` to `c` when counting is on.
#[inline]
pub fn add(c: Counter, n: u64) {
    if enabled() {
        c.slot().fetch_add(n, Ordering::Relaxed);
    }
}

/// Passes a driver call's result through, counting the call under `c`.
#[inline]
pub fn call<T>(c: Counter, result: T) -> T {
    add(c, 1);
    result
}

/// Counts one event under `count` and, on drop, the time since under `ns` (when counting is on).
pub struct Timed {
    ns: Counter,
    started: Option<Instant>,
}

impl Timed {
    pub fn start(count: Counter, ns: Counter) -> Timed {
        add(count, 1);
        Timed {
            ns,
            started: enabled().then(Instant::now),
        }
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        if let Some(t) = self.started {
            add(
                self.ns,
                u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX),
            );
        }
    }
}

/// Groups of driver calls whose wall time and CPU time (of the calling thread) are measured
/// apart: whether a call that takes milliseconds sleeps in the driver or burns the CPU decides
/// how often it may be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallGroup {
    /// One device's fast fields (the handle and every call of the fast poll).
    FastFields,
    /// One profiling-counter sample and, from the second on, its metrics.
    Gpm,
    /// Energy, PCIe link generation and width, replay counter.
    SlowCounters,
    /// The clock-event (throttle) durations, one batched field-value call.
    SlowClockEvents,
    /// The process lists (and /proc for each process).
    SlowProcesses,
    /// PCIe throughput, rx and tx.
    SlowPcieThroughput,
    /// One wait of the XID event thread.
    XidWait,
}

impl CallGroup {
    pub const ALL: [CallGroup; 7] = [
        CallGroup::FastFields,
        CallGroup::Gpm,
        CallGroup::SlowCounters,
        CallGroup::SlowClockEvents,
        CallGroup::SlowProcesses,
        CallGroup::SlowPcieThroughput,
        CallGroup::XidWait,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CallGroup::FastFields => "fast_fields",
            CallGroup::Gpm => "gpm",
            CallGroup::SlowCounters => "slow_counters",
            CallGroup::SlowClockEvents => "slow_clock_events",
            CallGroup::SlowProcesses => "slow_processes",
            CallGroup::SlowPcieThroughput => "slow_pcie_throughput",
            CallGroup::XidWait => "xid_wait",
        }
    }
}

/// Per group: calls, wall ns, thread CPU ns.
#[allow(clippy::declare_interior_mutable_const)]
const GROUP_ZERO: [AtomicU64; 3] = [ZERO, ZERO, ZERO];
static GROUPS: [[AtomicU64; 3]; CallGroup::ALL.len()] = [GROUP_ZERO; CallGroup::ALL.len()];

/// The calling thread's CPU time so far, in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec we hand it.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Measures one call of a group from now until dropped (when counting is on).
pub struct GroupTimer {
    group: CallGroup,
    started: Option<(Instant, u64)>,
}

impl GroupTimer {
    pub fn start(group: CallGroup) -> GroupTimer {
        GroupTimer {
            group,
            started: enabled().then(|| (Instant::now(), thread_cpu_ns())),
        }
    }
}

impl Drop for GroupTimer {
    fn drop(&mut self) {
        if let Some((wall, cpu)) = self.started {
            let slots = &GROUPS[self.group as usize];
            slots[0].fetch_add(1, Ordering::Relaxed);
            let wall_ns = u64::try_from(wall.elapsed().as_nanos()).unwrap_or(u64::MAX);
            slots[1].fetch_add(wall_ns, Ordering::Relaxed);
            slots[2].fetch_add(thread_cpu_ns().saturating_sub(cpu), Ordering::Relaxed);
        }
    }
}

/// Every group's (name, calls, wall ns, thread CPU ns) now.
pub fn groups() -> Vec<(&'static str, u64, u64, u64)> {
    CallGroup::ALL
        .iter()
        .map(|g| {
            let s = &GROUPS[*g as usize];
            let get = |i: usize| s[i].load(Ordering::Relaxed);
            (g.name(), get(0), get(1), get(2))
        })
        .collect()
}

/// Every counter's name and value now.
pub fn snapshot() -> Vec<(&'static str, u64)> {
    Counter::ALL
        .iter()
        .map(|c| (c.name(), c.slot().load(Ordering::Relaxed)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_once_enabled_and_names_are_distinct() {
        // Other tests in this process may count too: compare deltas of one counter only.
        let before = Counter::DrawsSkipped.slot().load(Ordering::Relaxed);
        enable();
        add(Counter::DrawsSkipped, 3);
        assert_eq!(call(Counter::DrawsSkipped, 7), 7);
        let after = Counter::DrawsSkipped.slot().load(Ordering::Relaxed);
        assert!(after >= before + 4);
        {
            let _t = Timed::start(Counter::Draws, Counter::DrawNs);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let snap = snapshot();
        let ns = snap.iter().find(|(n, _)| *n == "draw_ns").map(|x| x.1);
        assert!(ns.is_some_and(|ns| ns >= 2_000_000), "{ns:?}");
        let mut names: Vec<&str> = snap.iter().map(|x| x.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Counter::ALL.len());
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{}", c.name());
        }
        for (i, g) in CallGroup::ALL.iter().enumerate() {
            assert_eq!(*g as usize, i, "{}", g.name());
        }
    }

    #[test]
    fn a_group_timer_tells_sleeping_from_spinning() {
        enable();
        let get = |name: &str| groups().into_iter().find(|g| g.0 == name);
        let before = get("xid_wait").unwrap_or_default();
        {
            let _t = GroupTimer::start(CallGroup::XidWait);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let slept = get("xid_wait").unwrap_or_default();
        assert_eq!(slept.1, before.1 + 1);
        let (wall, cpu) = (slept.2 - before.2, slept.3 - before.3);
        assert!(wall >= 20_000_000, "{wall}");
        assert!(cpu < wall / 2, "a sleep is not CPU time: {cpu} of {wall}");
        let before = get("gpm").unwrap_or_default();
        {
            let _t = GroupTimer::start(CallGroup::Gpm);
            // Spin until this thread has used 5 ms of CPU (however busy the machine is).
            let start = thread_cpu_ns();
            let mut x = 0u64;
            while thread_cpu_ns() < start + 5_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        let spun = get("gpm").unwrap_or_default();
        assert!(spun.3 - before.3 >= 5_000_000, "a busy loop is CPU time");
    }
}
