//! What the probe runner needs to know of the GPUs' state while it measures them: which GPUs the
//! driver lists (and their PCI bus ids, to match CUDA's numbering), who else holds a GPU and how
//! much memory, its ECC counters before and after a memory test, its clocks, power, temperature
//! and throttle reasons while a probe runs, and how the GPUs connect.
//!
//! Declared here, below both layers, so the probes read the driver only through it and the
//! telemetry layer implements it (NVML) without either crate depending on the other. A reader
//! that cannot answer says why: an absent value is `None`, or an error with its reason, never 0.

use crate::topology::Topology;

/// A GPU as the driver numbers it (what `check` and `nvidia-smi` show).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedGpu {
    pub index: u32,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub name: Option<String>,
}

/// Another process holding a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuUser {
    pub pid: u32,
    /// The GPU memory it holds, where the driver says.
    pub used_bytes: Option<u64>,
}

/// Volatile ECC error counts (since the driver loaded); `None` where the GPU has no ECC, it is
/// off, or the count could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccCounts {
    pub corrected_volatile: Option<u64>,
    pub uncorrected_volatile: Option<u64>,
}

/// One reading taken while a probe runs, each value `None` where it could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunReading {
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<f64>,
    /// The throttle (clock event) reasons as the driver's bitmask.
    pub throttle_reasons: Option<u64>,
}

/// Why a part of the GPU state could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The reader has no driver to ask (its library is missing or would not initialise), so
    /// nothing can be read; the message says why.
    #[error("{0}")]
    NoDriver(String),
    /// This read failed; the message says why.
    #[error("{0}")]
    Failed(String),
}

/// The GPUs' state as the probe runner reads it. Calls may come from several threads (a probe's
/// readings are taken on one of their own).
pub trait GpuState: Send + Sync {
    /// Every GPU the driver lists, in its order.
    fn gpus(&self) -> Result<Vec<ListedGpu>, StateError>;
    /// The processes other than this one that hold GPU `index`.
    fn other_processes(&self, index: u32) -> Result<Vec<GpuUser>, StateError>;
    /// GPU `index`'s volatile ECC counters.
    fn ecc_counts(&self, index: u32) -> Result<EccCounts, StateError>;
    /// One reading of GPU `index`'s SM clock, power, temperature and throttle reasons.
    fn reading(&self, index: u32) -> Result<RunReading, StateError>;
    /// How the given GPUs connect; `None` where the reader cannot tell.
    fn topology(&self, gpus: &[ListedGpu]) -> Option<Topology>;
}
