//! Slow fields: the NVML reads too dear for every tick (PCIe throughput blocks ~20 ms a call)
//! run on one background thread per device, and `poll()` only copies the latest reading, so a
//! slow or hung device never stalls the sampler. A single read (`SlowFields::InPoll`) reads them
//! inside the poll instead: there, threads would only add NVML per-thread state and resident
//! memory.
//!
//! The readers are under a deadline like the fast poll (`poll_deadline.rs`): a slot remembers
//! when its reader last finished a round, and once that is several slow intervals ago `poll()`
//! marks every slow field absent as "slow read stuck for N s" (a stalled health reason) instead
//! of handing out values that stopped changing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;

use super::fields::{kb_per_s_to_bytes, mj_to_j, put_clock_events, read_clock_events};
use super::process_list::read_processes;
use super::{RawDevice, absent_from, lock};
use crate::attribution::{Attributor, GpuKeys, gpu_pods_field};
use crate::sanity;
use gpudiag_model::attribution::PodAllocation;
use gpudiag_model::sample::{Absent, AbsentMap, ProcessSample, Sample};
use gpudiag_model::stats::{self, CallGroup, Counter};

/// The link state and replay counter are read every this many slow rounds: every 5 s at the
/// default cadence.
pub const COUNTER_ROUNDS: u64 = 5;
/// The energy counter, every this many rounds (30 s at the default cadence, dcgm-exporter's
/// default collection interval).
pub const ENERGY_ROUNDS: u64 = 30;
/// The PCIe throughput, every this many rounds (2 s at the default cadence)...
pub const PCIE_ROUNDS: u64 = 2;
/// ...and where the profiling counters give PCIe rates every poll, every this many (10 s).
pub const PCIE_ROUNDS_WITH_GPM: u64 = 10;
/// The clock-event durations (about 1 ms of CPU a read on an H200), every this many rounds.
pub const CLOCK_EVENT_ROUNDS: u64 = 10;

/// How often slow fields are read unless `set_slow_interval` says otherwise.
pub const DEFAULT_SLOW_INTERVAL: Duration = Duration::from_secs(1);

/// Floor for the slow cadence: one round already spends ~40 ms per device in
/// `nvmlDeviceGetPcieThroughput`, so anything shorter would keep the driver busy for nothing.
pub const MIN_SLOW_INTERVAL: Duration = Duration::from_millis(100);

/// Slow intervals a reader may go without finishing a round before its values count as stuck:
/// a healthy round takes ~45 ms per device, far inside one interval, so three missed rounds
/// mean an NVML call that does not return.
const STUCK_ROUNDS: u32 = 3;
/// Never stuck sooner than this: a loaded host can delay a 100 ms cadence by a scheduling
/// slice or two without anything being wrong.
const STUCK_FLOOR: Duration = Duration::from_secs(2);

/// How long a reader may go without finishing a round at this cadence.
pub(super) fn stuck_limit(interval: Duration) -> Duration {
    (interval * STUCK_ROUNDS).max(STUCK_FLOOR)
}

/// How long the reader has been stuck, once the last finished round is more than `limit` old.
pub(super) fn stuck_for(last_round: Instant, now: Instant, limit: Duration) -> Option<Duration> {
    let since = now.saturating_duration_since(last_round);
    (since > limit).then_some(since)
}

/// Where the slow fields (PCIe throughput, processes, counters) are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowFields {
    /// One reader thread per device on its own cadence; `poll()` never waits for them.
    Background,
    /// Inside `poll()` itself, for a single read (`check --window 0`): no extra threads, each of
    /// which would cost NVML per-thread state and resident memory.
    InPoll,
}

/// `Sample` fields read by the background thread.
pub(super) const SLOW_FIELDS: &[&str] = &[
    "energy_j",
    "pcie_gen",
    "pcie_width",
    "pcie_replay_count",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "processes",
    "gpu_pods",
    "throttle_sw_power_cap_s",
    "throttle_sync_boost_s",
    "throttle_sw_thermal_slowdown_s",
    "throttle_hw_thermal_slowdown_s",
    "throttle_hw_power_brake_slowdown_s",
];

/// The latest slow reading of one device; `Err` carries why a value is absent. Values are as
/// old as the reading (at most one slow interval): the energy and replay counters are
/// cumulative, so rates over minutes are unaffected, and rules judge the link state over a
/// window, not one tick.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SlowReading {
    energy_j: Result<f64, Absent>,
    pcie_gen: Result<u32, Absent>,
    pcie_width: Result<u32, Absent>,
    pcie_replay_count: Result<u64, Absent>,
    pcie_rx_bytes_per_s: Result<f64, Absent>,
    pcie_tx_bytes_per_s: Result<f64, Absent>,
    processes: Result<Vec<ProcessSample>, Absent>,
    gpu_pods: Result<Vec<PodAllocation>, Absent>,
    /// The clock-event durations, in `CLOCK_EVENT_FIELDS` order.
    clock_events: [Result<f64, Absent>; 5],
}

impl SlowReading {
    fn all(why: Absent) -> Self {
        SlowReading {
            energy_j: Err(why.clone()),
            pcie_gen: Err(why.clone()),
            pcie_width: Err(why.clone()),
            pcie_replay_count: Err(why.clone()),
            pcie_rx_bytes_per_s: Err(why.clone()),
            pcie_tx_bytes_per_s: Err(why.clone()),
            processes: Err(why.clone()),
            gpu_pods: Err(why.clone()),
            clock_events: std::array::from_fn(|_| Err(why.clone())),
        }
    }

    pub(super) fn apply(&self, s: &mut Sample) {
        fn put<T: Clone>(r: &Result<T, Absent>, field: &str, ab: &mut AbsentMap) -> Option<T> {
            r.as_ref()
                .map_err(|why| ab.insert(field.into(), why.clone()))
                .ok()
                .cloned()
        }
        let ab = &mut s.absent;
        s.energy_j = put(&self.energy_j, "energy_j", ab);
        s.pcie_gen = put(&self.pcie_gen, "pcie_gen", ab);
        s.pcie_width = put(&self.pcie_width, "pcie_width", ab);
        s.pcie_replay_count = put(&self.pcie_replay_count, "pcie_replay_count", ab);
        s.pcie_rx_bytes_per_s = put(&self.pcie_rx_bytes_per_s, "pcie_rx_bytes_per_s", ab);
        s.pcie_tx_bytes_per_s = put(&self.pcie_tx_bytes_per_s, "pcie_tx_bytes_per_s", ab);
        s.processes = put(&self.processes, "processes", ab);
        s.gpu_pods = put(&self.gpu_pods, "gpu_pods", ab);
        put_clock_events(s, &self.clock_events);
    }
}

/// Per-device state shared by `poll()` and that device's slow reader.
pub(super) struct DeviceSlot {
    /// Written by the reader only after each stage's NVML calls have returned, so `poll()`
    /// only ever waits for a clone-sized critical section.
    pub(super) latest: Mutex<SlowReading>,
    /// Completed slow rounds, with a condvar so a caller can wait for the first one.
    rounds: Mutex<u64>,
    round_done: Condvar,
    /// When the reader last finished a round (or the slot was made, before the first).
    last_round: Mutex<Instant>,
    /// Set by `poll()` when the GPU is lost; the reader then stops calling NVML.
    pub(super) lost: AtomicBool,
    /// Set by `poll()` while the profiling counters give PCIe rates, which make NVML's
    /// throughput reads a cross-check rather than the only figure.
    pub(super) gpm_pcie: AtomicBool,
}

/// Cadence and stop flag for all slow readers; the condvar makes their sleep interruptible.
pub(super) struct SlowShared {
    pub(super) control: Mutex<SlowControl>,
    pub(super) wake: Condvar,
}

pub(super) struct SlowControl {
    pub(super) stop: bool,
    pub(super) interval: Duration,
}

impl DeviceSlot {
    pub(super) fn new() -> Self {
        DeviceSlot {
            latest: Mutex::new(SlowReading::all(Absent::NotYetRead)),
            rounds: Mutex::new(0),
            round_done: Condvar::new(),
            last_round: Mutex::new(Instant::now()),
            lost: AtomicBool::new(false),
            gpm_pcie: AtomicBool::new(false),
        }
    }

    pub(super) fn finish_round(&self) {
        *lock(&self.last_round) = Instant::now();
        *lock(&self.rounds) += 1;
        self.round_done.notify_all();
    }

    /// Puts the latest slow reading into `s`, or, when the reader has not finished a round
    /// within `limit` of `now`, marks every slow field stuck: values that stopped changing
    /// must not pass for current ones.
    pub(super) fn apply(&self, s: &mut Sample, now: Instant, limit: Duration) {
        let last = *lock(&self.last_round);
        match stuck_for(last, now, limit) {
            Some(stuck) => SlowReading::all(sanity::slow_stuck_reason(stuck)).apply(s),
            None => lock(&self.latest).apply(s),
        }
    }

    /// Waits until at least one slow round has completed or `deadline` passes.
    pub(super) fn wait_first_round(&self, deadline: Instant) {
        let mut rounds = lock(&self.rounds);
        while *rounds == 0 && !self.lost.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            rounds = self
                .round_done
                .wait_timeout(rounds, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }
}

impl SlowShared {
    /// Sleeps until `started + interval` (re-reading the interval when woken, so a changed
    /// cadence applies at once). Returns false when the backend is gone.
    fn sleep_until_next(&self, started: Instant) -> bool {
        let mut control = lock(&self.control);
        loop {
            if control.stop {
                return false;
            }
            let due = started + control.interval;
            let now = Instant::now();
            if now >= due {
                return true;
            }
            control = self
                .wake
                .wait_timeout(control, due - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }

    pub(super) fn stopped(&self) -> bool {
        lock(&self.control).stop
    }
}

pub(super) fn start_slow_reader(
    nvml: &Arc<Nvml>,
    gpu: GpuKeys,
    attributor: &Arc<Attributor>,
    slot: &Arc<DeviceSlot>,
    shared: &Arc<SlowShared>,
) {
    let (nvml, thread_slot, shared) = (Arc::clone(nvml), Arc::clone(slot), Arc::clone(shared));
    let attributor = Arc::clone(attributor);
    let spawned = std::thread::Builder::new()
        .name(format!("nvml-slow-{}", gpu.index))
        .spawn(move || slow_loop(&nvml, &gpu, &attributor, &thread_slot, &shared));
    if let Err(e) = spawned {
        *lock(&slot.latest) = SlowReading::all(Absent::Error(format!(
            "could not start the slow reader: {e}"
        )));
    }
}

fn slow_loop(
    nvml: &Nvml,
    gpu: &GpuKeys,
    attributor: &Attributor,
    slot: &DeviceSlot,
    shared: &SlowShared,
) {
    let mut util_since = None;
    let mut handle = None;
    run_rounds(slot, shared, |slot| {
        read_slow(nvml, gpu, attributor, &mut util_since, &mut handle, slot)
    });
}

/// Reads a round with `read`, then sleeps to the next, until stopped or the GPU is lost.
fn run_rounds(slot: &DeviceSlot, shared: &SlowShared, mut read: impl FnMut(&DeviceSlot)) {
    loop {
        if shared.stopped() || slot.lost.load(Ordering::Relaxed) {
            return;
        }
        let started = Instant::now();
        read(slot);
        slot.finish_round();
        if !shared.sleep_until_next(started) {
            return;
        }
    }
}

/// Counts one slow-round driver call (`GPUDIAG_TICK_STATS`).
fn slow<T>(result: T) -> T {
    stats::call(Counter::NvmlSlowCalls, result)
}

/// One slow round for one device, published in stages from cheapest to dearest so that a
/// reader waiting for the first round gets the counters and link state in a few milliseconds
/// and the PCIe throughput (two ~20 ms calls, read in parallel) last. `util_since` is the newest
/// per-process utilisation sample seen so far (NVML's CPU timestamp, µs), so each round
/// averages only new samples. The pods holding the GPU come from the kubelet's cached answer
/// (asked at most once per cache period, under its own deadline).
pub(super) fn read_slow(
    nvml: &Nvml,
    gpu: &GpuKeys,
    attributor: &Attributor,
    util_since: &mut Option<u64>,
    handle: &mut Option<RawDevice>,
    slot: &DeviceSlot,
) {
    let _timed = stats::Timed::start(Counter::SlowRounds, Counter::SlowRoundNs);
    let dev = match slow(RawDevice::get(nvml, gpu.index, handle)) {
        Ok(dev) => dev,
        Err(e) => {
            *lock(&slot.latest) = SlowReading::all(absent_from(&e));
            return;
        }
    };
    let round = *lock(&slot.rounds);
    // Each PCIe throughput call blocks ~20 ms while NVML samples the counters (and costs
    // about 1 ms of CPU): both run on their own threads from the start of the round, so a
    // round lasts one such window (about 21 ms on an H200, against 42 ms one after the other)
    // and the cheap reads below happen meanwhile. Read every PCIE_ROUNDS-th round. A single
    // read (`check --window 0`) is round 0 and waits for all of it.
    let pcie_every = if slot.gpm_pcie.load(Ordering::Relaxed) {
        PCIE_ROUNDS_WITH_GPM
    } else {
        PCIE_ROUNDS
    };
    let pcie_due = round.is_multiple_of(pcie_every);
    std::thread::scope(|scope| {
        let pcie = |counter| {
            let dev = &dev;
            move || {
                let _timed = stats::GroupTimer::start(CallGroup::SlowPcieThroughput);
                slow(dev.pcie_throughput(counter))
            }
        };
        let spawn = |name: &str, counter| {
            pcie_due.then(|| {
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(scope, pcie(counter))
            })
        };
        let rx = spawn("gpudiag-pcie-rx", PcieUtilCounter::Receive);
        let tx = spawn("gpudiag-pcie-tx", PcieUtilCounter::Send);

        // The link state and replay counter change slowly, the clock-event durations only add
        // up, and the rules judge them over minutes: read every COUNTER_ROUNDS-th and
        // CLOCK_EVENT_ROUNDS-th round. The energy counter costs about 4 ms of CPU a read on an
        // H200 (the process list 0.1 ms): every ENERGY_ROUNDS-th. In between the slot keeps
        // their last values.
        if round.is_multiple_of(ENERGY_ROUNDS) {
            let energy = {
                let _timed = stats::GroupTimer::start(CallGroup::SlowCounters);
                slow(dev.total_energy_consumption())
            };
            lock(&slot.latest).energy_j = energy.map(mj_to_j).map_err(|e| absent_from(&e));
        }
        if round.is_multiple_of(COUNTER_ROUNDS) {
            let counters = stats::GroupTimer::start(CallGroup::SlowCounters);
            let link_gen = slow(dev.current_pcie_link_gen());
            let link_width = slow(dev.current_pcie_link_width());
            let replays = slow(dev.pcie_replay_counter());
            drop(counters);
            let mut latest = lock(&slot.latest);
            latest.pcie_gen = link_gen.map_err(|e| absent_from(&e));
            latest.pcie_width = link_width.map_err(|e| absent_from(&e));
            latest.pcie_replay_count = replays.map(u64::from).map_err(|e| absent_from(&e));
        }
        if round.is_multiple_of(CLOCK_EVENT_ROUNDS) {
            let clock_events = {
                let _timed = stats::GroupTimer::start(CallGroup::SlowClockEvents);
                slow(read_clock_events(&dev))
            };
            lock(&slot.latest).clock_events = clock_events;
        }
        let gpu_pods = attributor.gpu_pods(gpu);
        // The driver's compute and graphics lists, then /proc for each process listed.
        stats::add(Counter::ProcessListReads, 1);
        stats::add(Counter::NvmlSlowCalls, 2);
        let processes = {
            let _timed = stats::GroupTimer::start(CallGroup::SlowProcesses);
            read_processes(nvml, &dev, util_since, attributor, &gpu_pods)
        };
        {
            let mut latest = lock(&slot.latest);
            latest.processes = processes;
            latest.gpu_pods = gpu_pods_field(&gpu_pods);
        }
        if !pcie_due {
            return;
        }
        // A thread that could not start reads on this one instead.
        let finish = |handle: Option<std::io::Result<std::thread::ScopedJoinHandle<'_, _>>>,
                      counter| {
            match handle {
                Some(Ok(h)) => h.join().ok(),
                _ => Some(pcie(counter)()),
            }
        };
        let rx = finish(rx, PcieUtilCounter::Receive);
        let tx = finish(tx, PcieUtilCounter::Send);
        let unread = || Absent::Error("the PCIe throughput read did not finish".into());
        let mut latest = lock(&slot.latest);
        latest.pcie_rx_bytes_per_s = match rx {
            Some(r) => r.map(kb_per_s_to_bytes).map_err(|e| absent_from(&e)),
            None => Err(unread()),
        };
        latest.pcie_tx_bytes_per_s = match tx {
            Some(r) => r.map(kb_per_s_to_bytes).map_err(|e| absent_from(&e)),
            None => Err(unread()),
        };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_reading_before_first_read_is_not_yet_read() {
        let mut s = Sample::new(0, 1);
        SlowReading::all(Absent::NotYetRead).apply(&mut s);
        assert_eq!(s.processes, None);
        assert_eq!(s.pcie_rx_bytes_per_s, None);
        for f in SLOW_FIELDS {
            assert_eq!(s.why_absent(f), Some(&Absent::NotYetRead));
        }

        let reading = SlowReading {
            energy_j: Ok(11_313.753),
            pcie_gen: Ok(5),
            pcie_width: Err(Absent::NoPermission),
            pcie_replay_count: Ok(0),
            pcie_rx_bytes_per_s: Ok(1024.0),
            pcie_tx_bytes_per_s: Err(Absent::NotSupported),
            processes: Ok(vec![]),
            gpu_pods: Err(Absent::Error("no kubelet".into())),
            clock_events: std::array::from_fn(|_| Ok(0.0)),
        };
        let mut s = Sample::new(0, 1);
        reading.apply(&mut s);
        assert_eq!(s.energy_j, Some(11_313.753));
        assert_eq!(s.pcie_gen, Some(5));
        assert_eq!(s.why_absent("pcie_width"), Some(&Absent::NoPermission));
        assert_eq!(s.pcie_replay_count, Some(0));
        assert_eq!(s.pcie_rx_bytes_per_s, Some(1024.0));
        assert_eq!(s.pcie_tx_bytes_per_s, None);
        assert_eq!(s.processes, Some(vec![]));
        assert_eq!(s.gpu_pods, None);
        assert_eq!(s.absent.len(), 3);
    }

    #[test]
    fn stuck_means_no_round_for_several_intervals() {
        assert_eq!(stuck_limit(Duration::from_secs(1)), Duration::from_secs(3));
        // Short cadences get the floor, not 300 ms.
        assert_eq!(stuck_limit(MIN_SLOW_INTERVAL), STUCK_FLOOR);
        let t = Instant::now();
        let limit = Duration::from_secs(3);
        assert_eq!(stuck_for(t, t + Duration::from_secs(3), limit), None);
        assert_eq!(
            stuck_for(t, t + Duration::from_secs(7), limit),
            Some(Duration::from_secs(7))
        );
        // A clock read before the round finished is not "stuck".
        assert_eq!(stuck_for(t + Duration::from_secs(9), t, limit), None);
    }

    /// A reader blocked inside a round (a hung NVML call): its values read as stuck once the
    /// limit passes, then as current again once the call returns and the round finishes.
    #[test]
    fn a_blocked_reader_marks_the_slow_fields_stuck_until_it_returns() {
        let slot = Arc::new(DeviceSlot::new());
        let shared = Arc::new(SlowShared {
            control: Mutex::new(SlowControl {
                stop: false,
                interval: Duration::from_millis(10),
            }),
            wake: Condvar::new(),
        });
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let reader = {
            let (slot, shared) = (slot.clone(), shared.clone());
            std::thread::spawn(move || {
                let mut round = 0;
                run_rounds(&slot, &shared, |slot| {
                    round += 1;
                    lock(&slot.latest).energy_j = Ok(f64::from(round));
                    if round == 2 {
                        let _ = blocked.recv();
                    }
                })
            })
        };
        let limit = Duration::from_secs(1);
        let read = |now: Instant| {
            let mut s = Sample::new(0, 1);
            slot.apply(&mut s, now, limit);
            s
        };
        // Round 2 publishes its first stage, then blocks.
        let start = Instant::now();
        while lock(&slot.latest).energy_j != Ok(2.0) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the reader never ran"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let fresh = read(Instant::now());
        assert_eq!(fresh.energy_j, Some(2.0));
        let later = read(Instant::now() + Duration::from_secs(5));
        assert_eq!(later.energy_j, None);
        for f in SLOW_FIELDS {
            assert!(
                matches!(later.why_absent(f), Some(Absent::Error(m)) if m.starts_with("slow read stuck for")),
                "{f}: {:?}",
                later.why_absent(f)
            );
        }
        assert_eq!(
            sanity::worst(&later),
            Some(sanity::Health::Stalled),
            "a stuck slow read is a stalled driver call"
        );
        unblock.send(()).unwrap();
        while *lock(&slot.rounds) < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the round never finished"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(read(Instant::now()).energy_j.is_some());
        lock(&shared.control).stop = true;
        shared.wake.notify_all();
        reader.join().unwrap();
    }

    #[test]
    fn slow_sleep_stops_and_follows_interval() {
        let shared = SlowShared {
            control: Mutex::new(SlowControl {
                stop: false,
                interval: Duration::from_millis(10),
            }),
            wake: Condvar::new(),
        };
        let t = Instant::now();
        assert!(shared.sleep_until_next(t));
        assert!(t.elapsed() >= Duration::from_millis(10));
        lock(&shared.control).stop = true;
        assert!(!shared.sleep_until_next(Instant::now()));
    }
}
