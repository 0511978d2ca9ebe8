//! The telemetry model every backend produces and every view consumes.
//!
//! Absent values are `None`, and the reason they are absent travels beside them in an `absent` map
//! keyed by the same name, so a view can say "not supported" instead of guessing. Nothing here may
//! use 0 or -1 to mean "missing".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch. One clock for samples, events, probes and traces.
pub type TimeMs = u64;

/// Why a value is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Absent {
    /// The device or driver does not offer this value (fans on SXM parts, ECC on consumer cards).
    NotSupported,
    /// The caller lacks the privilege to read it.
    NoPermission,
    /// The GPU fell off the bus or stopped answering.
    GpuLost,
    /// A slow field that has not been read yet (it has its own cadence).
    NotYetRead,
    /// The backend has no way to read this value at all (e.g. an AMD-only field on NVML).
    Unavailable,
    /// Any other failure, with the library's message.
    Error(String),
}

impl std::fmt::Display for Absent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Absent::NotSupported => f.write_str("not supported"),
            Absent::NoPermission => f.write_str("no permission"),
            Absent::GpuLost => f.write_str("GPU lost"),
            Absent::NotYetRead => f.write_str("not read yet"),
            Absent::Unavailable => f.write_str("unavailable on this backend"),
            Absent::Error(e) => write!(f, "error: {e}"),
        }
    }
}

/// Why-absent map keyed by field name (the serde name of the field).
pub type AbsentMap = BTreeMap<String, Absent>;

/// A compute capability such as 9.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Static attributes of one GPU, read once when the backend opens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, transform = crate::schema::absent_keys)]
pub struct DeviceInfo {
    /// Device index as the backend enumerates it.
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    pub vendor: Option<String>,
    pub architecture: Option<String>,
    pub compute_capability: Option<ComputeCapability>,
    pub serial: Option<String>,
    pub vbios_version: Option<String>,
    pub memory_total_bytes: Option<u64>,
    #[schemars(range(min = 0))]
    pub power_limit_default_w: Option<f64>,
    #[schemars(range(min = 0))]
    pub power_limit_min_w: Option<f64>,
    #[schemars(range(min = 0))]
    pub power_limit_max_w: Option<f64>,
    pub sm_clock_max_mhz: Option<u32>,
    pub mem_clock_max_mhz: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub temp_slowdown_c: Option<f64>,
    pub temp_shutdown_c: Option<f64>,
    pub temp_gpu_max_c: Option<f64>,
    pub temp_mem_max_c: Option<f64>,
    pub ecc_enabled: Option<bool>,
    pub persistence_mode: Option<bool>,
    pub mig_enabled: Option<bool>,
    /// Why each absent value is absent, keyed by the field's name; left out when none is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub absent: AbsentMap,
}

impl DeviceInfo {
    /// A short human label: "0 NVIDIA H200".
    pub fn label(&self) -> String {
        format!(
            "{} {}",
            self.index,
            self.name.as_deref().unwrap_or("unknown GPU")
        )
    }
}

/// One process using a GPU, as seen in one slow-cadence read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, transform = crate::schema::added_later("container_pid"))]
pub struct ProcessSample {
    pub pid: u32,
    /// Command name (redactable).
    pub name: Option<String>,
    pub user: Option<String>,
    /// "compute" or "graphics".
    #[schemars(extend("enum" = ["compute", "graphics", null]))]
    pub kind: Option<String>,
    pub used_memory_bytes: Option<u64>,
    #[schemars(range(min = 0, max = 100))]
    pub sm_util_pct: Option<f64>,
    /// Container id from the process's cgroup, when it runs in one.
    pub container_id: Option<String>,
    /// The PID inside the process's own PID namespace (the last `NSpid` entry), when it differs
    /// from `pid`: what `ps` shows inside the container.
    #[serde(default)]
    pub container_pid: Option<u32>,
}

/// Telemetry of one device at one instant. Every value is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, transform = crate::schema::absent_keys)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub time_ms: TimeMs,
    /// Device index.
    pub device: u32,
    #[schemars(range(min = 0, max = 100))]
    pub gpu_util_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub mem_util_pct: Option<f64>,
    pub mem_used_bytes: Option<u64>,
    pub mem_free_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    #[schemars(range(min = 0))]
    pub power_w: Option<f64>,
    #[schemars(range(min = 0))]
    pub power_limit_w: Option<f64>,
    /// Energy counter since the driver loaded, in joules.
    #[schemars(range(min = 0))]
    pub energy_j: Option<f64>,
    pub temp_gpu_c: Option<f64>,
    pub temp_mem_c: Option<f64>,
    pub temp_slowdown_c: Option<f64>,
    pub temp_shutdown_c: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub mem_clock_max_mhz: Option<u32>,
    /// Performance state, 0 (P0, fastest) to 15.
    #[schemars(range(max = 15))]
    pub pstate: Option<u32>,
    /// NVML clock-event (throttle) reason bits.
    pub throttle_reasons: Option<u64>,
    /// The decoded names of `throttle_reasons`, e.g. `["sw_power_cap"]`.
    pub throttle_reason_names: Option<Vec<String>>,
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_max: Option<u32>,
    #[schemars(range(min = 0))]
    pub pcie_rx_bytes_per_s: Option<f64>,
    #[schemars(range(min = 0))]
    pub pcie_tx_bytes_per_s: Option<f64>,
    pub pcie_replay_count: Option<u64>,
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub ecc_corrected_aggregate: Option<u64>,
    pub ecc_uncorrected_aggregate: Option<u64>,
    pub retired_pages_sbe: Option<u64>,
    pub retired_pages_dbe: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows_correctable: Option<u64>,
    pub remapped_rows_uncorrectable: Option<u64>,
    pub remapped_rows_pending: Option<bool>,
    pub remapped_rows_failure: Option<bool>,
    /// Fan 0 speed; NVML may report more than 100.
    #[schemars(range(min = 0))]
    pub fan_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub encoder_util_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub decoder_util_pct: Option<f64>,
    /// `None` until the slow-cadence process read has happened (see `absent`).
    pub processes: Option<Vec<ProcessSample>>,
    /// Why each absent value is absent, keyed by the field's name; left out when none is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub absent: AbsentMap,
}

/// The numeric series a `Sample` carries, for history, summaries and exports.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    GpuUtilPct,
    MemUtilPct,
    MemUsedBytes,
    MemFreeBytes,
    MemTotalBytes,
    PowerW,
    PowerLimitW,
    EnergyJ,
    TempGpuC,
    TempMemC,
    SmClockMhz,
    MemClockMhz,
    Pstate,
    ThrottleReasons,
    PcieGen,
    PcieWidth,
    PcieRxBytesPerS,
    PcieTxBytesPerS,
    PcieReplayCount,
    EccCorrectedVolatile,
    EccUncorrectedVolatile,
    RemappedRowsUncorrectable,
    FanPct,
    EncoderUtilPct,
    DecoderUtilPct,
}

impl Metric {
    pub const ALL: [Metric; 25] = [
        Metric::GpuUtilPct,
        Metric::MemUtilPct,
        Metric::MemUsedBytes,
        Metric::MemFreeBytes,
        Metric::MemTotalBytes,
        Metric::PowerW,
        Metric::PowerLimitW,
        Metric::EnergyJ,
        Metric::TempGpuC,
        Metric::TempMemC,
        Metric::SmClockMhz,
        Metric::MemClockMhz,
        Metric::Pstate,
        Metric::ThrottleReasons,
        Metric::PcieGen,
        Metric::PcieWidth,
        Metric::PcieRxBytesPerS,
        Metric::PcieTxBytesPerS,
        Metric::PcieReplayCount,
        Metric::EccCorrectedVolatile,
        Metric::EccUncorrectedVolatile,
        Metric::RemappedRowsUncorrectable,
        Metric::FanPct,
        Metric::EncoderUtilPct,
        Metric::DecoderUtilPct,
    ];

    /// The serde name, which is also the `Sample` field name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::GpuUtilPct => "gpu_util_pct",
            Metric::MemUtilPct => "mem_util_pct",
            Metric::MemUsedBytes => "mem_used_bytes",
            Metric::MemFreeBytes => "mem_free_bytes",
            Metric::MemTotalBytes => "mem_total_bytes",
            Metric::PowerW => "power_w",
            Metric::PowerLimitW => "power_limit_w",
            Metric::EnergyJ => "energy_j",
            Metric::TempGpuC => "temp_gpu_c",
            Metric::TempMemC => "temp_mem_c",
            Metric::SmClockMhz => "sm_clock_mhz",
            Metric::MemClockMhz => "mem_clock_mhz",
            Metric::Pstate => "pstate",
            Metric::ThrottleReasons => "throttle_reasons",
            Metric::PcieGen => "pcie_gen",
            Metric::PcieWidth => "pcie_width",
            Metric::PcieRxBytesPerS => "pcie_rx_bytes_per_s",
            Metric::PcieTxBytesPerS => "pcie_tx_bytes_per_s",
            Metric::PcieReplayCount => "pcie_replay_count",
            Metric::EccCorrectedVolatile => "ecc_corrected_volatile",
            Metric::EccUncorrectedVolatile => "ecc_uncorrected_volatile",
            Metric::RemappedRowsUncorrectable => "remapped_rows_uncorrectable",
            Metric::FanPct => "fan_pct",
            Metric::EncoderUtilPct => "encoder_util_pct",
            Metric::DecoderUtilPct => "decoder_util_pct",
        }
    }
}

impl Sample {
    /// An empty sample for `device` at `time_ms`: every value absent.
    pub fn new(device: u32, time_ms: TimeMs) -> Self {
        Sample {
            time_ms,
            device,
            ..Sample::default()
        }
    }

    /// The value of one numeric series, as f64 (counters beyond 2^53 lose precision, which no
    /// GPU counter reaches).
    pub fn value(&self, metric: Metric) -> Option<f64> {
        let u = |v: Option<u64>| v.map(|x| x as f64);
        let u32f = |v: Option<u32>| v.map(f64::from);
        match metric {
            Metric::GpuUtilPct => self.gpu_util_pct,
            Metric::MemUtilPct => self.mem_util_pct,
            Metric::MemUsedBytes => u(self.mem_used_bytes),
            Metric::MemFreeBytes => u(self.mem_free_bytes),
            Metric::MemTotalBytes => u(self.mem_total_bytes),
            Metric::PowerW => self.power_w,
            Metric::PowerLimitW => self.power_limit_w,
            Metric::EnergyJ => self.energy_j,
            Metric::TempGpuC => self.temp_gpu_c,
            Metric::TempMemC => self.temp_mem_c,
            Metric::SmClockMhz => u32f(self.sm_clock_mhz),
            Metric::MemClockMhz => u32f(self.mem_clock_mhz),
            Metric::Pstate => u32f(self.pstate),
            Metric::ThrottleReasons => u(self.throttle_reasons),
            Metric::PcieGen => u32f(self.pcie_gen),
            Metric::PcieWidth => u32f(self.pcie_width),
            Metric::PcieRxBytesPerS => self.pcie_rx_bytes_per_s,
            Metric::PcieTxBytesPerS => self.pcie_tx_bytes_per_s,
            Metric::PcieReplayCount => u(self.pcie_replay_count),
            Metric::EccCorrectedVolatile => u(self.ecc_corrected_volatile),
            Metric::EccUncorrectedVolatile => u(self.ecc_uncorrected_volatile),
            Metric::RemappedRowsUncorrectable => u(self.remapped_rows_uncorrectable),
            Metric::FanPct => self.fan_pct,
            Metric::EncoderUtilPct => self.encoder_util_pct,
            Metric::DecoderUtilPct => self.decoder_util_pct,
        }
    }

    /// Copies the device's static thresholds and maxima into the sample (with their reasons when
    /// absent), so each sample stands alone for rules and exports, whatever backend made it.
    pub fn copy_static_from(&mut self, info: &DeviceInfo) {
        fn copy<T: Copy>(
            v: Option<T>,
            field: &str,
            info: &DeviceInfo,
            ab: &mut AbsentMap,
        ) -> Option<T> {
            if v.is_none() {
                let why = info
                    .absent
                    .get(field)
                    .cloned()
                    .unwrap_or(Absent::Unavailable);
                ab.insert(field.into(), why);
            }
            v
        }
        let ab = &mut self.absent;
        self.temp_slowdown_c = copy(info.temp_slowdown_c, "temp_slowdown_c", info, ab);
        self.temp_shutdown_c = copy(info.temp_shutdown_c, "temp_shutdown_c", info, ab);
        self.sm_clock_max_mhz = copy(info.sm_clock_max_mhz, "sm_clock_max_mhz", info, ab);
        self.mem_clock_max_mhz = copy(info.mem_clock_max_mhz, "mem_clock_max_mhz", info, ab);
        self.pcie_gen_max = copy(info.pcie_gen_max, "pcie_gen_max", info, ab);
        self.pcie_width_max = copy(info.pcie_width_max, "pcie_width_max", info, ab);
    }

    /// Why `field` is absent, if the backend said.
    pub fn why_absent(&self, field: &str) -> Option<&Absent> {
        self.absent.get(field)
    }
}

/// Something that happened at an instant rather than a value polled each tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Event {
    pub time_ms: TimeMs,
    /// Device index, when the event belongs to one device.
    pub device: Option<u32>,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// An NVIDIA XID error reported by the driver.
    Xid {
        /// The XID code.
        xid: u64,
    },
    /// The device stopped answering (GPU lost) or could not be read.
    DeviceLost { reason: String },
    /// A backend-level notice worth keeping in a recording (e.g. a slow call timed out).
    Notice { message: String },
}

/// Host-level facts a backend knows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct HostInfo {
    /// Host name (redactable).
    pub hostname: Option<String>,
    /// NVIDIA driver version, e.g. "580.65.06".
    pub driver_version: Option<String>,
    /// The newest CUDA version the driver supports, e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
}

/// Wall-clock now in milliseconds since the Unix epoch, never going backwards within a process:
/// a clock stepped back (NTP) would otherwise make the history refuse points until it caught up.
pub fn now_ms() -> TimeMs {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as TimeMs)
        .unwrap_or_default();
    LAST.fetch_max(wall, Ordering::Relaxed).max(wall)
}
