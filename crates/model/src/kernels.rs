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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
            | CollectorMessage::CannotRecord { pid, .. }
            | CollectorMessage::Goodbye { pid } => *pid,
        }
    }
}
