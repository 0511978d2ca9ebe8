//! `run --kernels`: what the collectors in the command's processes send, aggregated as it
//! arrives into the summary the run report carries (per GPU: the time split, the top kernels,
//! the copies; per process: its synchronisations, its NCCL share, what its collector said).
//!
//! Memory stays bounded whatever arrives: a 10-minute run of 10⁷ kernels is folded into
//! per-name tables capped in names and bytes, and into interval unions that keep only their
//! recent part (`intervals`). Every record is kept only for `--trace`, up to a cap, and what
//! was left out is counted and said.

pub mod arrivals;
pub mod intervals;
pub mod jobs;
pub mod names;
pub mod synthetic;
pub mod verdict;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use gpudiag_model::kernels::{
    ClockPair, CollectorLosses, CollectorMessage, CopyDirection, CopyRecord, CopyStat, CudaDevice,
    HostMemory, KernelRecord, KernelStat, KernelsGpu, KernelsProcess, KernelsSummary, NcclLaggard,
    OtherKernels, ProcessOrdinal, ProcessSampling, SampleSchedule, SetRecord, SetStat,
    SteppedAsideSpan, SyncCall, SyncRecord, SyncStat, TOP_KERNELS, TimeSplit,
};
use gpudiag_model::sample::DeviceInfo;

use intervals::IntervalUnion;

/// The caps that keep the aggregation's memory bounded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// GPUs told apart (a host has at most 8 or 16; GPUs without a UUID are one per process
    /// and ordinal).
    pub gpus: usize,
    pub processes: usize,
    /// Distinct kernel names per GPU; runs of names past it count as "other".
    pub names_per_gpu: usize,
    /// Spans each GPU's interval unions hold before committing their older half.
    pub gpu_spans: usize,
    /// The same for each process's NCCL union.
    pub process_spans: usize,
    /// Stepped-aside intervals and devices kept per process.
    pub per_process_list: usize,
    /// Sampling windows kept per process to clip to each GPU's span; older ones are counted
    /// whole.
    pub windows_per_process: usize,
    /// Records kept for the trace (only when it is asked for).
    pub kept_records: usize,
    /// NCCL kernel runs kept per process to match collectives across ranks, the latest; and
    /// the processes that keep them (the first to run NCCL kernels).
    pub nccl_runs_per_process: usize,
    pub nccl_processes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            gpus: 32,
            processes: 512,
            names_per_gpu: 2_048,
            // Records reach gpudiag a CUPTI buffer at a time and kind by kind (a second of
            // kernels, then that second's copies), so the recent part must hold seconds of a
            // launch-bound loop: 46,000 tiny kernels a second on an H100 left 1,118 copies
            // late at 32,768 (benches/RESULTS.md). About 20 bytes a span: 5 MB a busy GPU.
            gpu_spans: 262_144,
            process_spans: 4_096,
            per_process_list: 64,
            // Hours of the default schedule (one window every 30 s).
            windows_per_process: 1_024,
            // A trace holds every event in memory until it is written (about 1 kB each with
            // its args): 250,000 rows is minutes of a training step, seconds of a loop of tiny
            // kernels, and a quarter of a gigabyte at most.
            kept_records: 250_000,
            // 24 bytes a run: at most 12 MB for 64 ranks, minutes of a DDP job's buckets.
            nccl_runs_per_process: 8_192,
            nccl_processes: 64,
        }
    }
}

/// A process shares less time in NCCL than its peers' median by at least this much of its span
/// before it is named: below it, the shares differ by noise (step boundaries, start-up).
pub const NCCL_LAGGARD_MIN_GAP: f64 = 0.05;

/// How a GPU is told apart: its UUID, else the process and the CUDA ordinal it used.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuKey {
    Uuid(Arc<str>),
    Ordinal { pid: u32, ordinal: u32 },
}

impl GpuKey {
    pub fn uuid(&self) -> Option<&str> {
        match self {
            GpuKey::Uuid(u) => Some(u),
            GpuKey::Ordinal { .. } => None,
        }
    }
}

/// A record kept for the trace, on the Unix clock.
#[derive(Debug, Clone)]
pub struct KeptRecord {
    pub pid: u32,
    /// `None` for a synchronisation CUPTI gave no device for.
    pub gpu: Option<GpuKey>,
    /// The CUDA ordinal inside the process (what Kineto calls the device).
    pub cuda_ordinal: Option<u32>,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub what: Kept,
}

#[derive(Debug, Clone)]
pub enum Kept {
    Kernel {
        name: Arc<str>,
        context: u32,
        stream: u32,
        grid: [u32; 3],
        block: [u32; 3],
        registers_per_thread: u16,
        shared_memory_bytes: u32,
        graph_id: Option<u32>,
        correlation_id: u32,
    },
    Copy {
        context: u32,
        stream: u32,
        bytes: u64,
        direction: CopyDirection,
        host_memory: HostMemory,
        correlation_id: u32,
    },
    Set {
        context: u32,
        stream: u32,
        bytes: u64,
        correlation_id: u32,
    },
    Sync {
        context: u32,
        stream: Option<u32>,
        call: SyncCall,
        correlation_id: u32,
    },
}

/// The records kept for `--trace`, and how many were not.
#[derive(Debug, Clone, Default)]
pub struct KeptRecords {
    pub records: Vec<KeptRecord>,
    pub left_out: u64,
    pub cap: usize,
    /// Under `--kernels=sample`, the windows each process recorded in (see
    /// [`KernelsAggregator::recorded_windows`]); empty otherwise.
    pub windows: Vec<RecordedWindows>,
}

#[derive(Debug, Clone)]
struct NameAcc {
    count: u64,
    total_ns: u64,
    grid: [u32; 3],
    block: [u32; 3],
    configs_vary: bool,
    registers_per_thread: u16,
    shared_memory_bytes: u32,
    in_graphs: u64,
    nccl: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    count: u64,
    bytes: u64,
    ns: u64,
}

impl Acc {
    fn add(&mut self, bytes: u64, ns: u64) {
        self.count = self.count.saturating_add(1);
        self.bytes = self.bytes.saturating_add(bytes);
        self.ns = self.ns.saturating_add(ns);
    }
}

/// One GPU while records arrive.
#[derive(Debug)]
struct GpuAcc {
    pids: Vec<u32>,
    start: u64,
    end: u64,
    /// Compute kernels; all kernels; everything (kernels, copies, sets).
    compute: IntervalUnion,
    kernels_union: IntervalUnion,
    all: IntervalUnion,
    kernels: u64,
    kernel_ns: u64,
    names: HashMap<Arc<str>, NameAcc>,
    past_name_cap: Acc,
    copies: HashMap<(CopyDirection, HostMemory), Acc>,
    sets: Acc,
}

impl GpuAcc {
    fn new(limits: &Limits) -> Self {
        GpuAcc {
            pids: Vec::new(),
            start: u64::MAX,
            end: 0,
            compute: IntervalUnion::new(limits.gpu_spans),
            kernels_union: IntervalUnion::new(limits.gpu_spans),
            all: IntervalUnion::new(limits.gpu_spans),
            kernels: 0,
            kernel_ns: 0,
            names: HashMap::new(),
            past_name_cap: Acc::default(),
            copies: HashMap::new(),
            sets: Acc::default(),
        }
    }

    fn span(&mut self, pid: u32, start: u64, end: u64, limits: &Limits) {
        self.start = self.start.min(start);
        self.end = self.end.max(end);
        if !self.pids.contains(&pid) && self.pids.len() < limits.per_process_list {
            self.pids.push(pid);
        }
    }

    fn late(&self) -> u64 {
        self.compute.late + self.kernels_union.late + self.all.late
    }
}

/// The windows a sampling collector recorded in, as they arrive.
#[derive(Debug, Default)]
struct WindowsAcc {
    /// The most recent closed windows (Unix ns), at most `Limits::windows_per_process`.
    closed: VecDeque<(u64, u64)>,
    /// Older windows, counted whole.
    folded: u64,
    folded_ns: u64,
    open_from: Option<u64>,
    full_from: Option<u64>,
}

impl WindowsAcc {
    fn push(&mut self, from: u64, to: Option<u64>, gave_way: bool, cap: usize) {
        if gave_way {
            self.full_from = Some(self.full_from.map_or(from, |f| f.min(from)));
        }
        let Some(to) = to else {
            // A window opened while another was open (sampling gave way mid-window) ends it.
            if let Some(open) = self.open_from.filter(|&open| open < from) {
                self.push(open, Some(from), false, cap);
            }
            self.open_from = Some(from);
            return;
        };
        if self.open_from == Some(from) {
            self.open_from = None;
        }
        self.closed.push_back((from, to));
        while self.closed.len() > cap {
            let Some((f, t)) = self.closed.pop_front() else {
                break;
            };
            self.folded = self.folded.saturating_add(1);
            self.folded_ns = self.folded_ns.saturating_add(t - f);
        }
    }

    fn count(&self) -> u64 {
        self.folded
            .saturating_add(self.closed.len() as u64)
            .saturating_add(u64::from(self.open_from.is_some()))
    }

    /// Time recorded within `from..to`; a window still open runs to `open_until`.
    fn recorded_within(&self, from: u64, to: u64, open_until: u64) -> u64 {
        let clip = |a: u64, b: u64| b.min(to).saturating_sub(a.max(from));
        let open = self.open_from.map_or(0, |f| clip(f, open_until));
        self.closed
            .iter()
            .fold(self.folded_ns.saturating_add(open), |sum, &(a, b)| {
                sum.saturating_add(clip(a, b))
            })
    }
}

/// One process's sampling windows, for the trace's track of what was recorded: the gaps
/// between them are time nobody looked at, not idle GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedWindows {
    pub pid: u32,
    /// The windows kept (the latest [`Limits::windows_per_process`]), in Unix ns, oldest
    /// first; one still open runs to the process's last record.
    pub windows: Vec<(u64, u64)>,
    /// Older windows not kept, only counted.
    pub folded: u64,
    /// Sampling gave way to another CUPTI client here: recorded in full from then on, to
    /// `end_unix_ns`.
    pub full_from_unix_ns: Option<u64>,
    /// The process's last record.
    pub end_unix_ns: Option<u64>,
}

/// Host waits of one call.
#[derive(Debug, Clone, Copy, Default)]
struct SyncAcc {
    count: u64,
    ns: u64,
}

const SYNC_CALLS: [SyncCall; 5] = [
    SyncCall::StreamSynchronize,
    SyncCall::EventSynchronize,
    SyncCall::ContextSynchronize,
    SyncCall::StreamWaitEvent,
    SyncCall::Unknown,
];

fn sync_slot(call: SyncCall) -> usize {
    match call {
        SyncCall::StreamSynchronize => 0,
        SyncCall::EventSynchronize => 1,
        SyncCall::ContextSynchronize => 2,
        SyncCall::StreamWaitEvent => 3,
        SyncCall::Unknown => 4,
    }
}

/// One process while records arrive.
#[derive(Debug)]
struct ProcessAcc {
    parent_pid: Option<u32>,
    said_hello: bool,
    said_goodbye: bool,
    cupti_source: Option<String>,
    cupti_api_version: Option<u32>,
    cannot_record: Option<String>,
    losses: CollectorLosses,
    /// CUDA ordinal → UUID, shared by every record's key.
    devices: Vec<(u32, Option<Arc<str>>)>,
    /// Stepped-aside intervals: (CUPTI ns the collector gave as their start, the span).
    stepped_aside: Vec<(u64, SteppedAsideSpan)>,
    /// `Some` once its collector said it samples.
    windows: Option<WindowsAcc>,
    clock: Option<ClockPair>,
    start: Option<u64>,
    end: Option<u64>,
    kernels: u64,
    nccl: IntervalUnion,
    /// Its latest NCCL runs, once it is among the first `Limits::nccl_processes` to run any.
    nccl_runs: Option<arrivals::NcclTimeline>,
    syncs: [SyncAcc; 5],
}

impl ProcessAcc {
    fn new(limits: &Limits) -> Self {
        ProcessAcc {
            parent_pid: None,
            said_hello: false,
            said_goodbye: false,
            cupti_source: None,
            cupti_api_version: None,
            cannot_record: None,
            losses: CollectorLosses::default(),
            devices: Vec::new(),
            stepped_aside: Vec::new(),
            windows: None,
            clock: None,
            start: None,
            end: None,
            kernels: 0,
            nccl: IntervalUnion::new(limits.process_spans),
            nccl_runs: None,
            syncs: [SyncAcc::default(); 5],
        }
    }

    fn span(&mut self, start: u64, end: u64) {
        self.start = Some(self.start.map_or(start, |s| s.min(start)));
        self.end = Some(self.end.map_or(end, |e| e.max(end)));
    }

    fn gpu_key(&self, pid: u32, ordinal: u32) -> GpuKey {
        match self.devices.iter().find(|d| d.0 == ordinal) {
            Some((_, Some(uuid))) => GpuKey::Uuid(uuid.clone()),
            _ => GpuKey::Ordinal { pid, ordinal },
        }
    }

    /// The time its rates and shares are of: its span, or under sampling the windows within
    /// it.
    fn span_s(&self) -> Option<f64> {
        let (s, e) = (self.start?, self.end?);
        let ns = self.recorded_within(s, e);
        (ns > 0).then(|| ns as f64 / 1e9)
    }

    /// Time recorded within `from..to`: all of it, or under sampling the windows' part.
    fn recorded_within(&self, from: u64, to: u64) -> u64 {
        let whole = to.saturating_sub(from);
        match (&self.windows, self.end) {
            (Some(w), Some(end)) => w.recorded_within(from, to, end).min(whole),
            (Some(_), None) => 0,
            (None, _) => whole,
        }
    }
}

/// How far after its batch's clock pair a record may end. The collector reads the pair as the
/// batch is sent, after every record in it ended, so a few ms would do; a wider bound keeps
/// streams that carry one pair for a whole run (fixtures, older collectors) placeable and still
/// catches a clock another client put in place, which is off by far more.
const CLOCK_SLACK_AHEAD_NS: u64 = 600_000_000_000;
/// How long before its batch was sent a record may have ended: buffers are flushed every
/// second, but a full socket, a process stopped or a collector stood aside delays them.
const CLOCK_SLACK_BEHIND_NS: u64 = 600_000_000_000;

/// CUPTI ns to Unix ns through the batch's clock pair, saturating (a pair that jumps, or a
/// record far from it, gives a time far off, never an overflow).
fn to_unix(ns: u64, clock: ClockPair) -> u64 {
    let t = i128::from(ns) - i128::from(clock.cupti_ns) + i128::from(clock.unix_ns);
    t.clamp(0, i128::from(u64::MAX)) as u64
}

/// Folds collector messages into a [`KernelsSummary`] as they arrive.
#[derive(Debug)]
pub struct KernelsAggregator {
    limits: Limits,
    gpus: BTreeMap<GpuKey, GpuAcc>,
    processes: BTreeMap<u32, ProcessAcc>,
    kept: Option<KeptRecords>,
    sampling: Option<SampleSchedule>,
    /// Processes that keep their NCCL runs (at most `Limits::nccl_processes`).
    nccl_timelines: usize,
    records: u64,
    gpus_past_cap: u64,
    processes_past_cap: u64,
    reversed: u64,
    /// Records whose times were on another clock than their batch's pair.
    off_clock: u64,
    /// Records CUPTI handed over without times (zero timestamps).
    untimed: u64,
}

impl Default for KernelsAggregator {
    fn default() -> Self {
        Self::new(Limits::default(), false)
    }
}

impl KernelsAggregator {
    /// `keep_records`: keep every record (up to `limits.kept_records`) for the trace.
    pub fn new(limits: Limits, keep_records: bool) -> Self {
        KernelsAggregator {
            limits,
            gpus: BTreeMap::new(),
            processes: BTreeMap::new(),
            kept: keep_records.then(|| KeptRecords {
                records: Vec::new(),
                left_out: 0,
                cap: limits.kept_records,
                windows: Vec::new(),
            }),
            sampling: None,
            nccl_timelines: 0,
            records: 0,
            gpus_past_cap: 0,
            processes_past_cap: 0,
            reversed: 0,
            off_clock: 0,
            untimed: 0,
        }
    }

    /// The collectors were told to record only in these windows.
    pub fn sampled(&mut self, schedule: SampleSchedule) {
        self.sampling = Some(schedule);
    }

    /// The process's state, created on its first message while under the cap.
    fn process(&mut self, pid: u32) -> Option<&mut ProcessAcc> {
        if !self.processes.contains_key(&pid) {
            if self.processes.len() >= self.limits.processes {
                self.processes_past_cap = self.processes_past_cap.saturating_add(1);
                return None;
            }
            self.processes.insert(pid, ProcessAcc::new(&self.limits));
        }
        self.processes.get_mut(&pid)
    }

    /// The GPU's state, created on its first record while under the cap.
    fn gpu(&mut self, key: &GpuKey) -> Option<&mut GpuAcc> {
        if !self.gpus.contains_key(key) {
            if self.gpus.len() >= self.limits.gpus {
                self.gpus_past_cap = self.gpus_past_cap.saturating_add(1);
                return None;
            }
            self.gpus.insert(key.clone(), GpuAcc::new(&self.limits));
        }
        self.gpus.get_mut(key)
    }

    fn keep(&mut self, record: impl FnOnce() -> KeptRecord) {
        if let Some(kept) = &mut self.kept {
            if kept.records.len() < kept.cap {
                kept.records.push(record());
            } else {
                kept.left_out = kept.left_out.saturating_add(1);
            }
        }
    }

    /// Takes one message.
    pub fn push(&mut self, message: &CollectorMessage) {
        let pid = message.pid();
        let limits = self.limits;
        match message {
            CollectorMessage::Hello(hello) => {
                let Some(p) = self.process(pid) else { return };
                p.said_hello = true;
                p.parent_pid = Some(hello.parent_pid);
                p.cupti_source = Some(names::capped(&hello.cupti_source).to_owned());
                p.cupti_api_version = Some(hello.cupti_api_version);
                p.clock = Some(hello.clock);
                p.start = Some(
                    p.start
                        .map_or(hello.clock.unix_ns, |s| s.min(hello.clock.unix_ns)),
                );
                for d in &hello.devices {
                    add_device(p, d, &limits);
                }
            }
            CollectorMessage::Device { device, .. } => {
                if let Some(p) = self.process(pid) {
                    add_device(p, device, &limits);
                }
            }
            CollectorMessage::Kernels { clock, records, .. } => {
                for r in records {
                    self.kernel(pid, *clock, r);
                }
            }
            CollectorMessage::Copies { clock, records, .. } => {
                for r in records {
                    self.copy(pid, *clock, r);
                }
            }
            CollectorMessage::Sets { clock, records, .. } => {
                for r in records {
                    self.set(pid, *clock, r);
                }
            }
            CollectorMessage::Syncs { clock, records, .. } => {
                for r in records {
                    self.sync(pid, *clock, r);
                }
            }
            CollectorMessage::Losses { losses, .. } => {
                if let Some(p) = self.process(pid) {
                    // Cumulative: the latest is the largest, whatever order they came in.
                    p.losses.cupti_dropped = p.losses.cupti_dropped.max(losses.cupti_dropped);
                    p.losses.send_dropped = p.losses.send_dropped.max(losses.send_dropped);
                    p.losses.names_cut = p.losses.names_cut.max(losses.names_cut);
                }
            }
            CollectorMessage::SteppedAside { from_ns, to_ns, .. } => {
                let Some(p) = self.process(pid) else { return };
                let Some(clock) = p.clock else { return };
                let span = SteppedAsideSpan {
                    from_unix_ns: to_unix(*from_ns, clock),
                    to_unix_ns: to_ns.map(|t| to_unix(t, clock)),
                };
                // The end of an interval said open before.
                if let Some(open) = p
                    .stepped_aside
                    .iter_mut()
                    .find(|(from, s)| *from == *from_ns && s.to_unix_ns.is_none())
                {
                    open.1 = span;
                } else if p.stepped_aside.len() < limits.per_process_list {
                    p.stepped_aside.push((*from_ns, span));
                }
            }
            CollectorMessage::Window {
                from_unix_ns,
                to_unix_ns,
                gave_way,
                ..
            } => {
                let Some(p) = self.process(pid) else { return };
                p.windows.get_or_insert_with(WindowsAcc::default).push(
                    *from_unix_ns,
                    *to_unix_ns,
                    *gave_way,
                    limits.windows_per_process,
                );
            }
            CollectorMessage::CannotRecord { why, .. } => {
                if let Some(p) = self.process(pid) {
                    p.cannot_record = Some(names::capped(why).to_owned());
                }
            }
            CollectorMessage::Goodbye { .. } => {
                if let Some(p) = self.process(pid) {
                    p.said_goodbye = true;
                }
            }
        }
    }

    /// Unix times of a record, or `None` (counted) when CUPTI could not time it, when it ends
    /// before it starts, or when its times are on another clock than its batch's pair.
    fn times(&mut self, start: u64, end: u64, clock: ClockPair) -> Option<(u64, u64)> {
        // CUPTI's way of saying it has no time for a record (its documentation: "may contain
        // invalid (0) timestamps"); on a clock pair it would read as the Unix epoch or as the
        // host's boot.
        if start == 0 || end == 0 {
            self.untimed = self.untimed.saturating_add(1);
            return None;
        }
        if end < start {
            self.reversed = self.reversed.saturating_add(1);
            return None;
        }
        let (start, end) = (to_unix(start, clock), to_unix(end, clock));
        // A record ends before the batch holding it was sent, and CUPTI hands buffers over at
        // least once a second. One minutes outside that was timed on a clock another CUPTI client
        // put in place that the collector did not see (it carries CUPTI's clock across the
        // ones it sees: before it did, on an H200 with torch 2.11, the records after
        // torch.profiler's first trace landed 21 minutes off): its times cannot be placed, nor
        // its length trusted.
        if end > clock.unix_ns.saturating_add(CLOCK_SLACK_AHEAD_NS)
            || end.saturating_add(CLOCK_SLACK_BEHIND_NS) < clock.unix_ns
        {
            self.off_clock = self.off_clock.saturating_add(1);
            return None;
        }
        self.records = self.records.saturating_add(1);
        Some((start, end))
    }

    fn kernel(&mut self, pid: u32, clock: ClockPair, r: &KernelRecord) {
        let Some((start, end)) = self.times(r.start_ns, r.end_ns, clock) else {
            return;
        };
        let limits = self.limits;
        let nccl = names::is_nccl(&r.name);
        let room_for_runs = self.nccl_timelines < limits.nccl_processes;
        let mut new_timeline = false;
        let Some(p) = self.process(pid) else { return };
        p.span(start, end);
        p.clock = Some(clock);
        p.kernels = p.kernels.saturating_add(1);
        if nccl {
            p.nccl.insert(start, end);
            if p.nccl_runs.is_none() && room_for_runs {
                p.nccl_runs = Some(arrivals::NcclTimeline::default());
                new_timeline = true;
            }
            if let Some(runs) = &mut p.nccl_runs {
                runs.push(start, end, &r.name, limits.nccl_runs_per_process);
            }
        }
        let key = p.gpu_key(pid, r.device);
        self.nccl_timelines += usize::from(new_timeline);
        if let Some(g) = self.gpu(&key) {
            g.span(pid, start, end, &limits);
            g.kernels = g.kernels.saturating_add(1);
            let ns = end - start;
            g.kernel_ns = g.kernel_ns.saturating_add(ns);
            if !nccl {
                g.compute.insert(start, end);
            }
            g.kernels_union.insert(start, end);
            g.all.insert(start, end);
            let name = names::capped(&r.name);
            let room = g.names.len() < limits.names_per_gpu;
            match g.names.get_mut(name) {
                Some(n) => {
                    n.count = n.count.saturating_add(1);
                    n.total_ns = n.total_ns.saturating_add(ns);
                    n.configs_vary |= n.grid != r.grid || n.block != r.block;
                    n.in_graphs += u64::from(r.graph_id.is_some());
                }
                None if room => {
                    let shared = if name.len() == r.name.len() {
                        r.name.clone()
                    } else {
                        Arc::from(name)
                    };
                    g.names.insert(
                        shared,
                        NameAcc {
                            count: 1,
                            total_ns: ns,
                            grid: r.grid,
                            block: r.block,
                            configs_vary: false,
                            registers_per_thread: r.registers_per_thread,
                            shared_memory_bytes: r.shared_memory_bytes,
                            in_graphs: u64::from(r.graph_id.is_some()),
                            nccl,
                        },
                    );
                }
                None => g.past_name_cap.add(0, ns),
            }
        }
        self.keep(|| KeptRecord {
            pid,
            gpu: Some(key),
            cuda_ordinal: Some(r.device),
            start_unix_ns: start,
            end_unix_ns: end,
            what: Kept::Kernel {
                name: r.name.clone(),
                context: r.context,
                stream: r.stream,
                grid: r.grid,
                block: r.block,
                registers_per_thread: r.registers_per_thread,
                shared_memory_bytes: r.shared_memory_bytes,
                graph_id: r.graph_id,
                correlation_id: r.correlation_id,
            },
        });
    }

    /// A copy or a set: GPU time that is not a kernel's. Returns its GPU's key.
    fn transfer(
        &mut self,
        pid: u32,
        device: u32,
        clock: ClockPair,
        start: u64,
        end: u64,
    ) -> Option<GpuKey> {
        let limits = self.limits;
        let p = self.process(pid)?;
        p.span(start, end);
        p.clock = Some(clock);
        let key = p.gpu_key(pid, device);
        let g = self.gpu(&key)?;
        g.span(pid, start, end, &limits);
        g.all.insert(start, end);
        Some(key)
    }

    fn copy(&mut self, pid: u32, clock: ClockPair, r: &CopyRecord) {
        let Some((start, end)) = self.times(r.start_ns, r.end_ns, clock) else {
            return;
        };
        let Some(key) = self.transfer(pid, r.device, clock, start, end) else {
            return;
        };
        let Some(g) = self.gpus.get_mut(&key) else {
            return;
        };
        if g.copies.len() < 64 || g.copies.contains_key(&(r.direction, r.host_memory)) {
            g.copies
                .entry((r.direction, r.host_memory))
                .or_default()
                .add(r.bytes, end - start);
        }
        self.keep(|| KeptRecord {
            pid,
            gpu: Some(key),
            cuda_ordinal: Some(r.device),
            start_unix_ns: start,
            end_unix_ns: end,
            what: Kept::Copy {
                context: r.context,
                stream: r.stream,
                bytes: r.bytes,
                direction: r.direction,
                host_memory: r.host_memory,
                correlation_id: r.correlation_id,
            },
        });
    }

    fn set(&mut self, pid: u32, clock: ClockPair, r: &SetRecord) {
        let Some((start, end)) = self.times(r.start_ns, r.end_ns, clock) else {
            return;
        };
        let Some(key) = self.transfer(pid, r.device, clock, start, end) else {
            return;
        };
        if let Some(g) = self.gpus.get_mut(&key) {
            g.sets.add(r.bytes, end - start);
        }
        self.keep(|| KeptRecord {
            pid,
            gpu: Some(key),
            cuda_ordinal: Some(r.device),
            start_unix_ns: start,
            end_unix_ns: end,
            what: Kept::Set {
                context: r.context,
                stream: r.stream,
                bytes: r.bytes,
                correlation_id: r.correlation_id,
            },
        });
    }

    fn sync(&mut self, pid: u32, clock: ClockPair, r: &SyncRecord) {
        let Some((start, end)) = self.times(r.start_ns, r.end_ns, clock) else {
            return;
        };
        let Some(p) = self.process(pid) else { return };
        p.span(start, end);
        p.clock = Some(clock);
        let s = &mut p.syncs[sync_slot(r.call)];
        s.count = s.count.saturating_add(1);
        s.ns = s.ns.saturating_add(end - start);
        let key = r.device.map(|d| (p.gpu_key(pid, d), d));
        self.keep(|| KeptRecord {
            pid,
            cuda_ordinal: key.as_ref().map(|(_, d)| *d),
            gpu: key.map(|(k, _)| k),
            start_unix_ns: start,
            end_unix_ns: end,
            what: Kept::Sync {
                context: r.context,
                stream: r.stream,
                call: r.call,
                correlation_id: r.correlation_id,
            },
        });
    }

    /// The windows each sampling process recorded in, by pid; empty when none sampled.
    pub fn recorded_windows(&self) -> Vec<RecordedWindows> {
        self.processes
            .iter()
            .filter_map(|(&pid, p)| {
                let w = p.windows.as_ref()?;
                let mut windows: Vec<(u64, u64)> = w.closed.iter().copied().collect();
                if let (Some(from), Some(end)) = (w.open_from, p.end)
                    && end > from
                {
                    windows.push((from, end));
                }
                Some(RecordedWindows {
                    pid,
                    windows,
                    folded: w.folded,
                    full_from_unix_ns: w.full_from,
                    end_unix_ns: p.end,
                })
            })
            .collect()
    }

    /// The records kept for the trace (`None` when keeping was not asked for).
    pub fn take_kept(&mut self) -> Option<KeptRecords> {
        let windows = self.recorded_windows();
        self.kept.take().map(|kept| KeptRecords { windows, ..kept })
    }

    /// The summary of everything pushed so far.
    pub fn summary(&self) -> KernelsSummary {
        let mut gpus: Vec<(u64, KernelsGpu)> = self
            .gpus
            .iter()
            .map(|(key, g)| (g.all.total_ns(), gpu_summary(key, g, self.recorded_on(g))))
            .collect();
        gpus.sort_by_key(|g| std::cmp::Reverse(g.0));
        let processes: Vec<KernelsProcess> = self
            .processes
            .iter()
            .map(|(&pid, p)| process_summary(pid, p))
            .collect();
        let mut left_out = Vec::new();
        if self.gpus_past_cap > 0 {
            left_out.push(format!(
                "{} record(s) of GPUs past the first {}",
                self.gpus_past_cap, self.limits.gpus
            ));
        }
        if self.processes_past_cap > 0 {
            left_out.push(format!(
                "{} message(s) of processes past the first {}",
                self.processes_past_cap, self.limits.processes
            ));
        }
        if self.reversed > 0 {
            left_out.push(format!(
                "{} record(s) that ended before they started",
                self.reversed
            ));
        }
        if self.untimed > 0 {
            left_out.push(format!(
                "{} record(s) CUPTI handed over without times (it could not time them)",
                self.untimed
            ));
        }
        if self.off_clock > 0 {
            left_out.push(format!(
                "{} record(s) timed on another clock than CUPTI's (another profiler in the \
                 process set its own): left out of the tables and the time split",
                self.off_clock
            ));
        }
        let late: u64 = self.gpus.values().map(GpuAcc::late).sum();
        if late > 0 {
            left_out.push(format!(
                "{late} record(s) arrived too late to place in the time split"
            ));
        }
        let not_recorded = (self.records == 0).then(|| self.why_nothing());
        let timelines: Vec<(u32, &arrivals::NcclTimeline)> = self
            .processes
            .iter()
            .filter_map(|(&pid, p)| Some((pid, p.nccl_runs.as_ref()?)))
            .collect();
        let nccl_arrivals = arrivals::arrivals(&timelines, |pid| {
            self.processes.get(&pid).and_then(ProcessAcc::span_s)
        });
        KernelsSummary {
            not_recorded,
            gpus: gpus.into_iter().map(|(_, g)| g).collect(),
            nccl_laggard: nccl_laggard(&processes, NCCL_LAGGARD_MIN_GAP),
            processes,
            left_out,
            sampling: self.sampling,
            nccl_arrivals,
        }
    }

    /// The time recorded within a GPU's span: all of it unless every process on it sampled;
    /// then the most any of them recorded there (they sample the same wall-clock windows, so
    /// that is about their union).
    fn recorded_on(&self, g: &GpuAcc) -> u64 {
        if g.start > g.end {
            return 0;
        }
        g.pids
            .iter()
            .map(|pid| {
                self.processes
                    .get(pid)
                    .map_or(g.end - g.start, |p| p.recorded_within(g.start, g.end))
            })
            .max()
            .unwrap_or(g.end - g.start)
    }

    /// Why no record arrived, from what the collectors said.
    fn why_nothing(&self) -> String {
        if self.processes.is_empty() {
            return "the collector loaded in no process: the command ran no CUDA, or its \
                    launcher did not pass the environment on (docker run, sudo, env -i, a Ray \
                    or Dask daemon)"
                .into();
        }
        let refused: Vec<String> = self
            .processes
            .iter()
            .filter_map(|(pid, p)| Some(format!("pid {pid}: {}", p.cannot_record.as_deref()?)))
            .collect();
        if !refused.is_empty() {
            return format!("the collector could not record ({})", refused.join("; "));
        }
        let aside = self.processes.values().any(|p| !p.stepped_aside.is_empty());
        if aside {
            return "another profiler (torch.profiler, Nsight) held CUPTI while the GPUs ran: \
                    its trace has the kernels"
                .into();
        }
        format!(
            "the collector loaded in {} process(es) but they ran no kernel, copy or \
             synchronisation",
            self.processes.len()
        )
    }
}

fn add_device(p: &mut ProcessAcc, d: &CudaDevice, limits: &Limits) {
    let uuid = d.uuid.as_deref().map(|u| Arc::from(names::capped(u)));
    if let Some(known) = p.devices.iter_mut().find(|k| k.0 == d.ordinal) {
        if known.1.is_none() {
            known.1 = uuid;
        }
    } else if p.devices.len() < limits.per_process_list {
        p.devices.push((d.ordinal, uuid));
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// `span`: the time judged, the GPU's span or under sampling the windows within it.
fn gpu_summary(key: &GpuKey, g: &GpuAcc, span: u64) -> KernelsGpu {
    let (start, end) = if g.start <= g.end {
        (g.start, g.end)
    } else {
        (0, 0)
    };
    let compute = g.compute.total_ns();
    let kernels = g.kernels_union.total_ns().max(compute);
    let all = g.all.total_ns().max(kernels);
    // A kernel launched in a window may end just after it closed.
    let span = span.max(all);
    let time = TimeSplit {
        span_s: secs(span),
        compute_s: secs(compute),
        nccl_s: secs(kernels - compute),
        copy_s: secs(all - kernels),
        idle_s: secs(span.saturating_sub(all)),
    };
    let busy_s = secs(all);
    let mut ranked: Vec<(&Arc<str>, &NameAcc)> = g.names.iter().collect();
    ranked.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(b.0)));
    let top_kernels: Vec<KernelStat> = ranked
        .iter()
        .take(TOP_KERNELS)
        .map(|(name, n)| {
            let full = names::demangle(name);
            KernelStat {
                short_name: names::shorten(&full),
                name: full,
                count: n.count,
                total_s: secs(n.total_ns),
                mean_us: n.total_ns as f64 / n.count.max(1) as f64 / 1e3,
                share_of_busy: if busy_s > 0.0 {
                    secs(n.total_ns) / busy_s
                } else {
                    0.0
                },
                grid: n.grid,
                block: n.block,
                configs_vary: n.configs_vary,
                registers_per_thread: n.registers_per_thread,
                shared_memory_bytes: n.shared_memory_bytes,
                in_graphs: n.in_graphs,
                nccl: n.nccl,
            }
        })
        .collect();
    let rest = ranked.iter().skip(TOP_KERNELS);
    let mut other = OtherKernels {
        count: g.past_name_cap.count,
        total_s: 0.0,
        names: 0,
        past_name_cap: g.past_name_cap.count,
    };
    let mut other_ns = g.past_name_cap.ns;
    for (_, n) in rest {
        other.count = other.count.saturating_add(n.count);
        other.names += 1;
        other_ns = other_ns.saturating_add(n.total_ns);
    }
    other.total_s = secs(other_ns);
    let mut copies: Vec<CopyStat> = g
        .copies
        .iter()
        .map(|(&(direction, host_memory), a)| CopyStat {
            direction,
            host_memory,
            count: a.count,
            bytes: a.bytes,
            total_s: secs(a.ns),
            gb_per_s: (a.ns > 0).then(|| a.bytes as f64 / a.ns as f64),
        })
        .collect();
    copies.sort_by(|a, b| {
        b.total_s
            .total_cmp(&a.total_s)
            .then(b.bytes.cmp(&a.bytes))
            .then(
                format!("{:?}{:?}", a.direction, a.host_memory)
                    .cmp(&format!("{:?}{:?}", b.direction, b.host_memory)),
            )
    });
    let (uuid, only_as) = match key {
        GpuKey::Uuid(u) => (Some(u.to_string()), None),
        GpuKey::Ordinal { pid, ordinal } => (
            None,
            Some(ProcessOrdinal {
                pid: *pid,
                cuda_ordinal: *ordinal,
            }),
        ),
    };
    let mut pids = g.pids.clone();
    pids.sort_unstable();
    KernelsGpu {
        uuid,
        index: None,
        only_as,
        pids,
        start_unix_ns: start,
        end_unix_ns: end,
        time,
        kernels: g.kernels,
        kernels_per_s: (span > 0).then(|| g.kernels as f64 / secs(span)),
        mean_kernel_us: (g.kernels > 0).then(|| g.kernel_ns as f64 / g.kernels as f64 / 1e3),
        top_kernels,
        other_kernels: other,
        copies,
        sets: SetStat {
            count: g.sets.count,
            bytes: g.sets.bytes,
            total_s: secs(g.sets.ns),
        },
    }
}

fn process_summary(pid: u32, p: &ProcessAcc) -> KernelsProcess {
    let span_s = p.span_s();
    let nccl_s = secs(p.nccl.total_ns());
    let mut syncs: Vec<SyncStat> = SYNC_CALLS
        .iter()
        .zip(p.syncs.iter())
        .filter(|(_, s)| s.count > 0)
        .map(|(&call, s)| SyncStat {
            call,
            call_name: call.call_name().to_owned(),
            count: s.count,
            total_s: secs(s.ns),
            per_s: span_s.map(|span| s.count as f64 / span),
            // A stream waiting on an event costs the host nothing.
            share_of_host: span_s
                .filter(|_| call.blocks_host())
                .map(|span| secs(s.ns) / span),
        })
        .collect();
    syncs.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then(b.count.cmp(&a.count)));
    KernelsProcess {
        pid,
        parent_pid: p.parent_pid,
        said_hello: p.said_hello,
        said_goodbye: p.said_goodbye,
        cupti_source: p.cupti_source.clone(),
        cupti_api_version: p.cupti_api_version,
        cannot_record: p.cannot_record.clone(),
        losses: p.losses,
        stepped_aside: p.stepped_aside.iter().map(|(_, s)| *s).collect(),
        sampling: p.windows.as_ref().map(|w| ProcessSampling {
            windows: w.count(),
            recorded_s: span_s.unwrap_or(0.0),
            full_from_unix_ns: w.full_from,
        }),
        start_unix_ns: p.start,
        end_unix_ns: p.end,
        kernels: p.kernels,
        nccl_s,
        nccl_share: span_s.map(|span| (nccl_s / span).min(1.0)),
        syncs,
    }
}

/// The process that spends clearly less of its span in NCCL kernels than the median of its
/// peers: in a data-parallel job every rank waits in its collectives for the slowest, which
/// arrives last and waits least. Among processes that ran NCCL kernels, two at least; named
/// when its share is below the others' median by `min_gap` (a fraction of the span) or more.
pub fn nccl_laggard(processes: &[KernelsProcess], min_gap: f64) -> Option<NcclLaggard> {
    let mut shares: Vec<(u32, f64)> = processes
        .iter()
        .filter(|p| p.nccl_s > 0.0)
        .filter_map(|p| Some((p.pid, p.nccl_share?)))
        .collect();
    if shares.len() < 2 {
        return None;
    }
    shares.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let (pid, lowest) = shares[0];
    let mut peers: Vec<f64> = shares[1..].iter().map(|s| s.1).collect();
    peers.sort_by(f64::total_cmp);
    let mid = peers.len() / 2;
    let median = if peers.len().is_multiple_of(2) {
        (peers[mid - 1] + peers[mid]) / 2.0
    } else {
        peers[mid]
    };
    if median - lowest < min_gap {
        return None;
    }
    shares.sort_by_key(|s| s.0);
    Some(NcclLaggard {
        pid,
        nccl_share: lowest,
        peers_median_share: median,
        shares,
    })
}

/// Gives each GPU of the summary gpudiag's index, by UUID. A GPU whose UUID the collector
/// could not read (the driver refused the call where the collector made it: seen in every rank
/// of a torchrun job on two H200s) and that is known only as one process's CUDA ordinal gets
/// the GPU the run saw that process on, where it saw it on exactly one: `seen` is (pid,
/// gpudiag's index) for each process the driver listed on a GPU.
pub fn match_devices(summary: &mut KernelsSummary, devices: &[DeviceInfo], seen: &[(u32, u32)]) {
    for g in &mut summary.gpus {
        g.index = g.uuid.as_deref().and_then(|u| {
            devices
                .iter()
                .find(|d| d.uuid.as_deref().is_some_and(|d| d.eq_ignore_ascii_case(u)))
                .map(|d| d.index)
        });
        if g.index.is_some() || g.uuid.is_some() {
            continue;
        }
        let Some(only) = g.only_as else { continue };
        let mut on = seen
            .iter()
            .filter(|(pid, _)| *pid == only.pid)
            .map(|&(_, index)| index);
        if let (Some(index), None) = (on.next(), on.next()) {
            g.index = Some(index);
            g.uuid = devices
                .iter()
                .find(|d| d.index == index)
                .and_then(|d| d.uuid.clone());
        }
    }
}

#[cfg(test)]
mod tests;
