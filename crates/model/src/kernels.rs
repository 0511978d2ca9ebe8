//! What `run --kernels` receives from the CUPTI collector loaded into the command's processes:
//! the kernels, copies, sets and synchronisations each process ran, one record each, plus what
//! the collector says of itself (which libcupti, what it dropped, when it stood aside for another
//! profiler). The collector's wire format is its own (decoded in `gpudiag-kernels`); these types
//! are what every layer above sees, so fixtures and aggregation never depend on a CUPTI version.
//!
//! Times are nanoseconds on CUPTI's clock of that process; `ClockPair` maps them to wall-clock
//! time (CUPTI's clock may be replaced by another client, e.g. Kineto's timestamp callback, so
//! the collector sends a fresh pair with every batch).

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The GPU a record ran on: the CUDA ordinal inside the process (remapped by
/// `CUDA_VISIBLE_DEVICES`) and the UUID the collector resolved for it, as NVML spells it
/// (`GPU-…`); `None` when the driver would not say.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CudaDevice {
    pub ordinal: u32,
    pub uuid: Option<String>,
}

/// One kernel execution (CUPTI's concurrent-kernel activity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRecord {
    pub start_ns: u64,
    pub end_ns: u64,
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    /// The mangled name as the driver gave it, capped at `MAX_KERNEL_NAME_BYTES`; shared by
    /// every record of the same kernel.
    pub name: Arc<str>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub registers_per_thread: u16,
    /// Static plus dynamic shared memory per block.
    pub shared_memory_bytes: u32,
    /// The CUDA graph it was launched as part of; `None` for a kernel launched on its own.
    pub graph_id: Option<u32>,
    pub correlation_id: u32,
}

/// The longest kernel name the collector sends; longer templated names are cut there and end
/// in `…`.
pub const MAX_KERNEL_NAME_BYTES: usize = 1024;

/// Which way a copy went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CopyDirection {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    HostToHost,
    PeerToPeer,
    /// Arrays, or a kind this gpudiag does not know.
    Other,
}

/// What the host side of a copy was; a pageable buffer makes the driver stage the copy and
/// blocks the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostMemory {
    Pageable,
    Pinned,
    Managed,
    /// A device-to-device copy has no host side.
    NoHostSide,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyRecord {
    pub start_ns: u64,
    pub end_ns: u64,
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    pub bytes: u64,
    pub direction: CopyDirection,
    pub host_memory: HostMemory,
    pub graph_id: Option<u32>,
    pub correlation_id: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetRecord {
    pub start_ns: u64,
    pub end_ns: u64,
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    pub bytes: u64,
    pub correlation_id: u32,
}

/// The synchronisation call the host blocked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncCall {
    /// `cudaEventSynchronize`
    EventSynchronize,
    /// `cudaStreamWaitEvent`: a stream waits, the host does not.
    StreamWaitEvent,
    /// `cudaStreamSynchronize` (`.item()`, `.cpu()` and `.tolist()` end in one).
    StreamSynchronize,
    /// `cudaDeviceSynchronize` / `cuCtxSynchronize`
    ContextSynchronize,
    Unknown,
}

impl SyncCall {
    /// The CUDA runtime call, as the user would search for it.
    pub fn call_name(self) -> &'static str {
        match self {
            SyncCall::EventSynchronize => "cudaEventSynchronize",
            SyncCall::StreamWaitEvent => "cudaStreamWaitEvent",
            SyncCall::StreamSynchronize => "cudaStreamSynchronize",
            SyncCall::ContextSynchronize => "cudaDeviceSynchronize",
            SyncCall::Unknown => "an unknown synchronisation",
        }
    }

    /// Whether the host thread waits in it (a stream waiting on an event does not).
    pub fn blocks_host(self) -> bool {
        !matches!(self, SyncCall::StreamWaitEvent)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// The host's wait, on CUPTI's clock.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The device of the context synchronised; `None` when CUPTI did not say.
    pub device: Option<u32>,
    pub context: u32,
    /// `None` for a context-wide synchronisation.
    pub stream: Option<u32>,
    pub call: SyncCall,
    pub correlation_id: u32,
}

/// CUPTI's clock against the wall clock, read one after the other in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPair {
    pub cupti_ns: u64,
    pub unix_ns: u64,
}

/// What one process's collector says about itself when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectorHello {
    pub pid: u32,
    pub parent_pid: u32,
    /// `cuptiGetVersion`, e.g. 130000 style API numbers as CUPTI reports them.
    pub cupti_api_version: u32,
    /// Where its libcupti came from: "already loaded", "GPUDIAG_CUPTI", "loader search".
    pub cupti_source: String,
    pub collector_version: u32,
    pub devices: Vec<CudaDevice>,
    pub clock: ClockPair,
}

/// What a collector lost, cumulative for its process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CollectorLosses {
    /// Records CUPTI dropped (its buffers were full).
    pub cupti_dropped: u64,
    /// Records the collector could not send (the socket was full: the command never waits).
    pub send_dropped: u64,
    /// Kernel names cut at `MAX_KERNEL_NAME_BYTES`.
    pub names_cut: u64,
}

/// A message from one process's collector, in the order it sent them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CollectorMessage {
    Hello(CollectorHello),
    /// A device the process began to use after it said hello.
    Device {
        pid: u32,
        device: CudaDevice,
    },
    Kernels {
        pid: u32,
        clock: ClockPair,
        records: Vec<KernelRecord>,
    },
    Copies {
        pid: u32,
        clock: ClockPair,
        records: Vec<CopyRecord>,
    },
    Sets {
        pid: u32,
        clock: ClockPair,
        records: Vec<SetRecord>,
    },
    Syncs {
        pid: u32,
        clock: ClockPair,
        records: Vec<SyncRecord>,
    },
    Losses {
        pid: u32,
        losses: CollectorLosses,
    },
    /// Another CUPTI client of the process (torch.profiler, Nsight) traced from `from_ns`
    /// (CUPTI's clock) to `to_ns` (`None`: still tracing): its trace has those records, ours
    /// a hole.
    SteppedAside {
        pid: u32,
        from_ns: u64,
        to_ns: Option<u64>,
    },
    /// Sampling (`--kernels=sample`) recorded from `from_unix_ns` to `to_unix_ns` (`None`: the
    /// window is open; the same window is sent again with its end when it closes).
    /// `gave_way`: another CUPTI client appeared at `from_unix_ns` and the process is recorded
    /// in full from there.
    Window {
        pid: u32,
        from_unix_ns: u64,
        to_unix_ns: Option<u64>,
        gave_way: bool,
    },
    /// The collector could not record: no libcupti, CUPTI refused, a version it cannot read.
    CannotRecord {
        pid: u32,
        why: String,
    },
    /// The process is exiting (absent when it was killed).
    Goodbye {
        pid: u32,
    },
}

impl CollectorMessage {
    pub fn pid(&self) -> u32 {
        match self {
            CollectorMessage::Hello(hello) => hello.pid,
            CollectorMessage::Device { pid, .. }
            | CollectorMessage::Kernels { pid, .. }
            | CollectorMessage::Copies { pid, .. }
            | CollectorMessage::Sets { pid, .. }
            | CollectorMessage::Syncs { pid, .. }
            | CollectorMessage::Losses { pid, .. }
            | CollectorMessage::SteppedAside { pid, .. }
            | CollectorMessage::Window { pid, .. }
            | CollectorMessage::CannotRecord { pid, .. }
            | CollectorMessage::Goodbye { pid } => *pid,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What gpudiag makes of the records: the summary `run --kernels` puts in its report. Built by
// `gpudiag_core::kernels` as the records arrive; every list here is bounded there.

/// What the kernels mode saw over a run, per GPU and per process, and what the collector said
/// of itself. `not_recorded` says why the rest is empty when nothing was recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct KernelsSummary {
    /// Why no kernel, copy or synchronisation was recorded although `--kernels` was asked
    /// ("the collector loaded in no process", every process's `CannotRecord`); `None` when
    /// records arrived.
    pub not_recorded: Option<String>,
    /// Per GPU the records ran on, busiest first.
    pub gpus: Vec<KernelsGpu>,
    /// Per process whose collector said hello (or sent records), by pid.
    pub processes: Vec<KernelsProcess>,
    /// The process that spends clearly less of its time in NCCL kernels than its peers: the
    /// others wait for it in their collectives, so it is the slow rank. `None` when fewer than
    /// two processes ran NCCL kernels or their shares are within the threshold.
    pub nccl_laggard: Option<NcclLaggard>,
    /// What was left out to keep memory bounded (GPUs or processes past the caps, records that
    /// arrived too late to place in the time split); empty when nothing was.
    pub left_out: Vec<String>,
    /// `--kernels=sample`: the collectors recorded only in these windows, and every time,
    /// rate and share is of the time recorded. `None`: recorded all the time.
    #[serde(default)]
    pub sampling: Option<SampleSchedule>,
    /// The order in which the processes that ran NCCL kernels arrived at the collectives they
    /// all took part in. `None` with fewer than two such processes.
    #[serde(default)]
    pub nccl_arrivals: Option<NcclArrivals>,
}

/// Who arrived last at each collective every rank took part in: the rank whose kernel starts
/// last is the one the others wait for (the runs of one collective end together on every rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NcclArrivals {
    /// Collectives found on every rank (the same NCCL kernel, its runs ending together).
    pub matched: u64,
    /// Runs of the first rank found on not every other rank (a subgroup's collectives, or ones
    /// cut by a sampling window or the cap on runs kept).
    pub unmatched: u64,
    /// Per process, by pid.
    pub by_pid: Vec<NcclArrival>,
    /// The process that caused most of the waiting at them (75% or more of it, over 20 or
    /// more), arrived last more often than chance, and cost each peer 1% of its time or more:
    /// the rank the others wait for. `None` otherwise.
    pub waited_for: Option<u32>,
}

impl NcclArrivals {
    /// The share of all the waiting at the matched collectives that `pid` caused (the peers'
    /// waits for it, against everyone's). `None` when nobody waited, or for a pid not here.
    pub fn share_of_waiting(&self, pid: u32) -> Option<f64> {
        let total: f64 = self.by_pid.iter().map(|a| a.peers_waited_s).sum();
        let mine = self.by_pid.iter().find(|a| a.pid == pid)?.peers_waited_s;
        (total > 0.0).then(|| mine / total)
    }
}

/// How often one process arrived last, and what that cost the others.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NcclArrival {
    pub pid: u32,
    /// Collectives it arrived last at.
    pub last: u64,
    #[schemars(range(min = 0, max = 1))]
    pub last_share: f64,
    /// How long each of its peers waited for it at those, on average over the peers.
    #[schemars(range(min = 0))]
    pub peers_waited_s: f64,
}

/// When a sampling collector records: the first `on_ms` of every `period_ms` of the wall
/// clock (the same windows in every process, so a job's ranks are compared over the same
/// time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SampleSchedule {
    #[schemars(range(min = 1))]
    pub on_ms: u32,
    #[schemars(range(min = 2))]
    pub period_ms: u32,
}

impl SampleSchedule {
    /// One second of every thirty. A window costs a DDP ResNet-50 rank at batch 64 up to 0.3 s
    /// (attaching, the launches CUPTI instruments, detaching; measured inside the run:
    /// benches/RESULTS.md), so at one every 20 s it could pay 1.5%; every 30 s it pays 1% at
    /// most, and a minute of training still holds two windows.
    pub const DEFAULT: SampleSchedule = SampleSchedule {
        on_ms: 1_000,
        period_ms: 30_000,
    };

    /// The variable's value the collector reads (`GPUDIAG_KERNELS_SAMPLE`).
    pub fn env_value(&self) -> String {
        format!("{}/{}", self.on_ms, self.period_ms)
    }

    pub fn duty(&self) -> f64 {
        f64::from(self.on_ms) / f64::from(self.period_ms)
    }
}

/// One GPU's time and work, from the records of every process that used it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct KernelsGpu {
    /// The GPU's UUID as NVML spells it, where the collector resolved it.
    pub uuid: Option<String>,
    /// gpudiag's index of the GPU (NVML's), once matched by UUID; `None` when it could not be.
    pub index: Option<u32>,
    /// Without a UUID the GPU is known only as a process's CUDA ordinal: that process and
    /// ordinal. `None` when the UUID names it.
    pub only_as: Option<ProcessOrdinal>,
    /// The processes whose records ran on it.
    pub pids: Vec<u32>,
    /// The span judged: from the first record's start to the last one's end, ns since the Unix
    /// epoch.
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub time: TimeSplit,
    pub kernels: u64,
    /// Kernels started per second of the span.
    #[schemars(range(min = 0))]
    pub kernels_per_s: Option<f64>,
    #[schemars(range(min = 0))]
    pub mean_kernel_us: Option<f64>,
    /// The kernels that took the most GPU time, most first (at most `TOP_KERNELS`).
    pub top_kernels: Vec<KernelStat>,
    /// The kernels not listed in `top_kernels`, together.
    pub other_kernels: OtherKernels,
    /// Copies by direction and host memory, most time first.
    pub copies: Vec<CopyStat>,
    pub sets: SetStat,
}

/// A GPU known only by a process's CUDA ordinal (its UUID was not resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ProcessOrdinal {
    pub pid: u32,
    pub cuda_ordinal: u32,
}

/// A GPU's span split by what ran: every instant counts once, in the first of compute kernels,
/// NCCL kernels, copies and sets, idle that covers it (kernels of several streams overlap; an
/// all-reduce hidden behind a matmul is compute time, not NCCL time). Under sampling, `span_s`
/// is the time recorded within the span (the windows), not the span.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TimeSplit {
    #[schemars(range(min = 0))]
    pub span_s: f64,
    /// Some kernel other than NCCL's ran.
    #[schemars(range(min = 0))]
    pub compute_s: f64,
    /// Only NCCL kernels ran (names starting `ncclDevKernel` or `ncclKernel`).
    #[schemars(range(min = 0))]
    pub nccl_s: f64,
    /// No kernel ran, a copy or a set did.
    #[schemars(range(min = 0))]
    pub copy_s: f64,
    /// Nothing ran.
    #[schemars(range(min = 0))]
    pub idle_s: f64,
}

/// One kernel (by name) on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct KernelStat {
    /// Demangled where the name is a C++ symbol, in full (templates and arguments kept).
    pub name: String,
    /// `name` with template arguments and parameters elided, for text.
    pub short_name: String,
    pub count: u64,
    #[schemars(range(min = 0))]
    pub total_s: f64,
    #[schemars(range(min = 0))]
    pub mean_us: f64,
    /// Of the GPU's busy time (compute + NCCL + copies), 0–1; kernels on several streams may
    /// add up to more than 1.
    #[schemars(range(min = 0))]
    pub share_of_busy: f64,
    /// The launch configuration of its first run.
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Whether its launches used other grids or blocks too.
    pub configs_vary: bool,
    pub registers_per_thread: u16,
    pub shared_memory_bytes: u32,
    /// How many of its runs were launched as part of a CUDA graph.
    pub in_graphs: u64,
    pub nccl: bool,
}

/// Kernels past the top list, and past the cap on distinct names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct OtherKernels {
    pub count: u64,
    #[schemars(range(min = 0))]
    pub total_s: f64,
    /// Distinct names among them that were still told apart.
    pub names: u64,
    /// Runs of kernels whose names came after the cap on distinct names was reached: their
    /// names were not kept.
    pub past_name_cap: u64,
}

/// Copies of one direction and host memory kind on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CopyStat {
    pub direction: CopyDirection,
    pub host_memory: HostMemory,
    pub count: u64,
    pub bytes: u64,
    #[schemars(range(min = 0))]
    pub total_s: f64,
    /// Bytes per second of copy time, in GB/s; `None` when they took no measurable time.
    #[schemars(range(min = 0))]
    pub gb_per_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SetStat {
    pub count: u64,
    pub bytes: u64,
    #[schemars(range(min = 0))]
    pub total_s: f64,
}

/// One process's collector and what its host threads waited for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct KernelsProcess {
    pub pid: u32,
    /// `None` when records came from a process that never said hello.
    pub parent_pid: Option<u32>,
    pub said_hello: bool,
    /// `false`: it never said goodbye (killed, or `os._exit`); its last second may be missing.
    pub said_goodbye: bool,
    pub cupti_source: Option<String>,
    pub cupti_api_version: Option<u32>,
    /// Why its collector could not record, when it said so.
    pub cannot_record: Option<String>,
    /// The latest cumulative losses it reported.
    pub losses: CollectorLosses,
    /// Where another CUPTI client (torch.profiler, Nsight) traced and the collector stood
    /// aside: those records are in that client's trace, not here.
    pub stepped_aside: Vec<SteppedAsideSpan>,
    /// Under `--kernels=sample`, the windows it recorded in; `None` when it recorded all the
    /// time.
    #[serde(default)]
    pub sampling: Option<ProcessSampling>,
    /// Its span: from its hello (or first record) to its last record, ns since the Unix epoch.
    pub start_unix_ns: Option<u64>,
    pub end_unix_ns: Option<u64>,
    pub kernels: u64,
    /// Time in NCCL kernels (union over its streams), and its share of the span (of the time
    /// recorded, under sampling).
    #[schemars(range(min = 0))]
    pub nccl_s: f64,
    #[schemars(range(min = 0, max = 1))]
    pub nccl_share: Option<f64>,
    /// Host time blocked in synchronisation, by call, most first.
    pub syncs: Vec<SyncStat>,
}

/// The windows one process's sampling collector recorded in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ProcessSampling {
    pub windows: u64,
    /// Their total length, up to the process's last record for a window still open.
    #[schemars(range(min = 0))]
    pub recorded_s: f64,
    /// When another CUPTI client (torch.profiler, Nsight) appeared and sampling gave way: from
    /// then on the process was recorded in full (ns since the Unix epoch).
    pub full_from_unix_ns: Option<u64>,
}

/// Where a process's collector stood aside for another profiler, ns since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SteppedAsideSpan {
    pub from_unix_ns: u64,
    /// `None`: the other profiler was still tracing when the process ended.
    pub to_unix_ns: Option<u64>,
}

/// One synchronisation call of one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SyncStat {
    pub call: SyncCall,
    /// The CUDA call as the user would search for it (`cudaStreamSynchronize`).
    pub call_name: String,
    pub count: u64,
    /// Host time blocked in it (summed over the process's threads).
    #[schemars(range(min = 0))]
    pub total_s: f64,
    #[schemars(range(min = 0))]
    pub per_s: Option<f64>,
    /// `total_s` over the process's span; several threads waiting at once may add up past 1.
    #[schemars(range(min = 0))]
    pub share_of_host: Option<f64>,
}

/// The rank the others wait for, from each process's share of time in NCCL kernels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NcclLaggard {
    pub pid: u32,
    #[schemars(range(min = 0, max = 1))]
    pub nccl_share: f64,
    /// The median share of the other processes that ran NCCL kernels.
    #[schemars(range(min = 0, max = 1))]
    pub peers_median_share: f64,
    /// Every process's share, by pid.
    pub shares: Vec<(u32, f64)>,
}

/// The kernels listed by name per GPU in a summary; the rest are `OtherKernels`.
pub const TOP_KERNELS: usize = 10;

/// What `run --kernels --record` writes into its recording (`kind` `kernels`): the summary as it
/// stood at `time_ms`, every few seconds while the command runs, and once more when it ended
/// (`ended`, its GPUs matched to gpudiag's indices and its verdicts given). A replay shows the
/// latest one it has reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RecordedKernels {
    pub time_ms: crate::sample::TimeMs,
    /// The summary of the whole run, written when the command ended.
    #[serde(default)]
    pub ended: bool,
    pub summary: KernelsSummary,
}

/// Longest kernel name or note a recording's summary keeps, in characters: demangled templates
/// run to a few thousand; a crafted file could hold megabytes.
const MAX_RECORDED_TEXT: usize = 8_192;

impl KernelsSummary {
    /// The summary held to the bounds gpudiag's own aggregate keeps (32 GPUs, 512 processes,
    /// the top kernels): a recording is anyone's file.
    pub fn bounded(mut self) -> Self {
        fn clip(s: &mut String) {
            if let Some((at, _)) = s.char_indices().nth(MAX_RECORDED_TEXT) {
                s.truncate(at);
                s.push('…');
            }
        }
        fn clip_opt(s: &mut Option<String>) {
            if let Some(s) = s.as_mut() {
                clip(s);
            }
        }
        clip_opt(&mut self.not_recorded);
        self.gpus.truncate(32);
        for g in &mut self.gpus {
            clip_opt(&mut g.uuid);
            g.pids.truncate(512);
            g.top_kernels.truncate(TOP_KERNELS);
            for k in &mut g.top_kernels {
                clip(&mut k.name);
                clip(&mut k.short_name);
            }
            g.copies.truncate(16);
        }
        self.processes.truncate(512);
        for p in &mut self.processes {
            clip_opt(&mut p.cupti_source);
            clip_opt(&mut p.cannot_record);
            p.stepped_aside.truncate(64);
            p.syncs.truncate(8);
            for s in &mut p.syncs {
                clip(&mut s.call_name);
            }
        }
        if let Some(l) = &mut self.nccl_laggard {
            l.shares.truncate(512);
        }
        if let Some(a) = &mut self.nccl_arrivals {
            a.by_pid.truncate(512);
        }
        self.left_out.truncate(16);
        self.left_out.iter_mut().for_each(clip);
        self
    }

    /// Why the summary cannot be what gpudiag's own aggregate wrote, or `None`: a time, count
    /// or rate below zero, a share above one, a part of a GPU's time longer than the time it
    /// is a part of. A recording is anyone's file, and such figures would print as "10000% of
    /// the GPU's time" and decide the GPU's verdict.
    pub fn implausible(&self) -> Option<String> {
        let value = serde_json::to_value(self).ok()?;
        implausible_in(&value, "kernels")
    }

    /// A summary of nothing, and why.
    pub fn not_recorded(why: impl Into<String>) -> Self {
        KernelsSummary {
            not_recorded: Some(why.into()),
            gpus: Vec::new(),
            processes: Vec::new(),
            nccl_laggard: None,
            left_out: Vec::new(),
            sampling: None,
            nccl_arrivals: None,
        }
    }
}

/// A share of something: one at most.
fn is_share(key: &str) -> bool {
    key.ends_with("_share") || key.starts_with("share_of")
}

/// [`KernelsSummary::implausible`] over the summary as JSON, `at` naming where.
fn implausible_in(value: &serde_json::Value, at: &str) -> Option<String> {
    use serde_json::Value;
    const SLACK: f64 = 1.01;
    match value {
        Value::Number(n) => {
            let v = n.as_f64()?;
            (v < 0.0).then(|| format!("{at} is negative ({v})"))
        }
        Value::Array(items) => {
            if at.ends_with(".shares") {
                for pair in items {
                    if let Some(share) = pair.get(1).and_then(Value::as_f64)
                        && !(0.0..=1.0).contains(&share)
                    {
                        return Some(format!("a share in {at} is {share}, outside 0 to 1"));
                    }
                }
            }
            items.iter().find_map(|item| implausible_in(item, at))
        }
        Value::Object(map) => {
            if let Some(span) = map.get("span_s").and_then(Value::as_f64) {
                for part in ["compute_s", "nccl_s", "copy_s", "idle_s"] {
                    if let Some(v) = map.get(part).and_then(Value::as_f64)
                        && v > span * SLACK + 1e-3
                    {
                        return Some(format!(
                            "{at}.{part} ({v} s) is longer than its span ({span} s)"
                        ));
                    }
                }
            }
            map.iter().find_map(|(key, v)| {
                if is_share(key)
                    && let Some(share) = v.as_f64()
                    && share > 1.0 + 1e-9
                {
                    return Some(format!("{at}.{key} is {share}, above 1"));
                }
                implausible_in(v, &format!("{at}.{key}"))
            })
        }
        _ => None,
    }
}
