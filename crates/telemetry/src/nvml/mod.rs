//! The NVML backend: live telemetry from NVIDIA GPUs through `libnvidia-ml.so.1`.
//!
//! The library is loaded at run time (`nvml-wrapper` dlopens it), so the binary runs on hosts
//! without a driver and says why it cannot read anything. Opening happens in a helper thread
//! bounded by a deadline, because a wedged driver can hang `nvmlInit` forever.
//!
//! Three cadences:
//! - static attributes (`DeviceInfo`, `HostInfo`) are read once at open;
//! - fast fields (utilisation, memory, power, clocks, throttle reasons, ECC, ...) are read on
//!   every `poll()`. Measured on an H200 (driver 580) at a 10 Hz cadence, each call costs about
//!   10-15 µs (memory info ~70 µs; back-to-back loops show 0.2 µs because NVML caches answers
//!   for a few ms), and the ECC / retired-page / remapped-row / memory-temperature counters
//!   come from one batched `nvmlDeviceGetFieldValues` (~25 µs for all twelve);
//! - slow fields are read by one background thread per device and `poll()` copies the latest
//!   reading, so a slow or hung device never stalls the sampler. They are the calls measured
//!   too slow for every tick on that H200: PCIe throughput (~20 ms each, rx and tx), the energy
//!   counter (~4 ms), the process list with per-process utilisation (~2 ms), the PCIe replay
//!   counter (~150-400 µs) and the current link width (~120 µs; generation travels with it).
//!
//! Every NVML failure becomes `None` plus an `Absent` reason under the field's name. A GPU that
//! falls off the bus yields one `DeviceLost` event and, from then on, samples of `GpuLost`
//! reasons without touching NVML for it again (calls on a lost GPU can block in the driver).
//!
//! The mapping from NVML's units and codes to the model lives in small pure functions, tested
//! below without a GPU.

use gpudiag_model::decode::throttle_reason_names;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::device::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, P2pCapabilitiesIndex, P2pStatus, PcieUtilCounter, PerformanceState, TemperatureSensor,
    TemperatureThreshold, TopologyLevel,
};
use nvml_wrapper::enums::device::{DeviceArchitecture, SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{Bits, NvmlError};
use nvml_wrapper::event::EventSet;
use nvml_wrapper::struct_wrappers::device::{
    FieldValueSample, ProcessInfo, ProcessUtilizationSample,
};
use nvml_wrapper::structs::device::FieldId;

use gpudiag_model::topology::NvLinkErrors;

use super::{
    Absent, AbsentMap, Backend, BackendError, ComputeCapability, DeviceInfo, Event, EventKind,
    HostInfo, Pacing, ProcessSample, Sample, now_ms,
};
use gpudiag_model::deadline::{DeadlineError, run_with_deadline};

/// How often slow fields are read unless `set_slow_interval` says otherwise.
pub const DEFAULT_SLOW_INTERVAL: Duration = Duration::from_secs(1);

/// Floor for the slow cadence: one round already spends ~40 ms per device in
/// `nvmlDeviceGetPcieThroughput`, so anything shorter would keep the driver busy for nothing.
pub const MIN_SLOW_INTERVAL: Duration = Duration::from_millis(100);

/// `NVML_DEVICE_MIG_ENABLE` from nvml.h (the sys crate that defines it is not re-exported).
const NVML_DEVICE_MIG_ENABLE: u32 = 1;

/// Where the slow fields (PCIe throughput, processes, counters) are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowFields {
    /// One reader thread per device on its own cadence; `poll()` never waits for them.
    Background,
    /// Inside `poll()` itself, for a single read (`check --window 0`): no extra threads, each of
    /// which would cost NVML per-thread state and resident memory.
    InPoll,
}

/// Live telemetry from every GPU NVML sees.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    host: HostInfo,
    devices: Vec<DeviceInfo>,
    /// One per device, same order as `devices`.
    slots: Vec<Arc<DeviceSlot>>,
    slow: Arc<SlowShared>,
    slow_fields: SlowFields,
    /// `SlowFields::InPoll`: the per-process utilisation cursor of each device.
    util_since: Vec<Option<u64>>,
    /// Events (XIDs, notices) the event thread queued since the last poll.
    events: Arc<Mutex<Vec<Event>>>,
    topology: Mutex<TopologyRead>,
}

/// The topology is read on its own thread from the moment the backend opens, so its NVML calls
/// (the NVLink error totals alone take about 63 ms per H200) overlap the first poll instead of
/// adding to a single-read `check`.
enum TopologyRead {
    Running(std::thread::JoinHandle<gpudiag_model::topology::Topology>),
    Done(Option<gpudiag_model::topology::Topology>),
}

/// How long `topology()` waits for the reading thread.
const TOPOLOGY_WAIT: Duration = Duration::from_secs(3);

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("host", &self.host)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

/// What the opening thread hands back.
struct Opened {
    nvml: Nvml,
    host: HostInfo,
    devices: Vec<DeviceInfo>,
}

impl NvmlBackend {
    /// Loads and initialises NVML, reads host and device attributes, and starts one slow-field
    /// reader thread per device.
    ///
    /// All of that runs in a helper thread: if it has not finished by `init_deadline` the call
    /// returns `Unavailable` and leaves the thread behind (it cannot be cancelled; the program is
    /// about to exit with "could not run" anyway).
    pub fn open(init_deadline: Duration) -> Result<NvmlBackend, BackendError> {
        Self::open_with(init_deadline, SlowFields::Background)
    }

    /// `open`, choosing where the slow fields are read.
    pub fn open_with(
        init_deadline: Duration,
        slow_fields: SlowFields,
    ) -> Result<NvmlBackend, BackendError> {
        let opened = match run_with_deadline("nvml-open", init_deadline, open_blocking) {
            Ok(result) => result?,
            Err(DeadlineError::TimedOut(_)) => {
                return Err(BackendError::Unavailable(format!(
                    "NVML initialisation did not finish within {} s: the NVIDIA driver may be \
                     hung (does nvidia-smi answer?)",
                    fmt_secs(init_deadline)
                )));
            }
            Err(e) => {
                return Err(BackendError::Unavailable(format!(
                    "NVML initialisation failed: {e}"
                )));
            }
        };

        let nvml = Arc::new(opened.nvml);
        let slow = Arc::new(SlowShared {
            control: Mutex::new(SlowControl {
                stop: false,
                interval: DEFAULT_SLOW_INTERVAL,
            }),
            wake: Condvar::new(),
        });
        let slots = opened
            .devices
            .iter()
            .map(|info| {
                let slot = Arc::new(DeviceSlot::new());
                if slow_fields == SlowFields::Background {
                    start_slow_reader(&nvml, info.index, &slot, &slow);
                }
                slot
            })
            .collect();
        let util_since = vec![None; opened.devices.len()];
        let events = Arc::new(Mutex::new(Vec::new()));
        if slow_fields == SlowFields::Background {
            start_event_thread(&nvml, &opened.devices, &events, &slow);
        }
        let topology = {
            let nvml = nvml.clone();
            let gpus: Vec<(u32, Option<String>)> = opened
                .devices
                .iter()
                .map(|d| (d.index, d.pci_bus_id.clone()))
                .collect();
            match std::thread::Builder::new()
                .name("gpudiag-topology".into())
                .spawn(move || read_topology(&nvml, &gpus))
            {
                Ok(h) => TopologyRead::Running(h),
                Err(_) => TopologyRead::Done(None),
            }
        };
        Ok(NvmlBackend {
            nvml,
            host: opened.host,
            devices: opened.devices,
            slots,
            slow,
            slow_fields,
            util_since,
            events,
            topology: Mutex::new(topology),
        })
    }

    /// The current slow-field cadence.
    pub fn slow_interval(&self) -> Duration {
        lock(&self.slow.control).interval
    }

    /// One device's fast fields plus the latest slow reading.
    fn sample_device(&self, info: &DeviceInfo, slot: &DeviceSlot, time_ms: u64) -> Sample {
        let mut sample = Sample::new(info.index, time_ms);
        if slot.lost.load(Ordering::Relaxed) {
            mark_absent(&mut sample.absent, FAST_FIELDS, &Absent::GpuLost);
            mark_absent(&mut sample.absent, SLOW_FIELDS, &Absent::GpuLost);
        } else {
            match self.nvml.device_by_index(info.index) {
                Ok(dev) => read_fast(&dev, &mut sample),
                Err(e) => mark_absent(&mut sample.absent, FAST_FIELDS, &absent_from(&e)),
            }
            lock(&slot.latest).apply(&mut sample);
        }
        sample.copy_static_from(info);
        sample
    }
}

impl Drop for NvmlBackend {
    /// Tells the background threads to stop and waits a bounded while for them. Not joining
    /// at all let the process exit while a thread was inside an NVML call, and after a CUDA
    /// context had existed (the probes) the libraries' exit handlers then crashed under it;
    /// waiting without a bound would hang on a sick driver that holds a call for seconds. Each
    /// thread holds its own `Arc<Nvml>`, so the count tells when they are all gone.
    fn drop(&mut self) {
        lock(&self.slow.control).stop = true;
        self.slow.wake.notify_all();
        let deadline = Instant::now() + Duration::from_secs(1);
        while Arc::strong_count(&self.nvml) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Backend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn host(&self) -> &HostInfo {
        &self.host
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn pacing(&self) -> Pacing {
        Pacing::Live
    }

    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        let mut state = lock(&self.topology);
        if let TopologyRead::Running(_) = &*state {
            let TopologyRead::Running(h) = std::mem::replace(&mut *state, TopologyRead::Done(None))
            else {
                return None;
            };
            *state = TopologyRead::Done(gpudiag_model::deadline::join_within(h, TOPOLOGY_WAIT));
        }
        match &*state {
            TopologyRead::Done(t) => t.clone(),
            TopologyRead::Running(_) => None,
        }
    }

    fn poll(&mut self) -> Result<super::Tick, BackendError> {
        // One timestamp for the whole tick, so devices line up in history and traces.
        let time_ms = now_ms();
        let mut tick = super::Tick::default();
        tick.events.append(&mut lock(&self.events));
        if self.slow_fields == SlowFields::InPoll {
            for ((info, slot), since) in self
                .devices
                .iter()
                .zip(&self.slots)
                .zip(&mut self.util_since)
            {
                if !slot.lost.load(Ordering::Relaxed) {
                    read_slow(&self.nvml, info.index, since, slot);
                    slot.finish_round();
                }
            }
        }
        for (info, slot) in self.devices.iter().zip(&self.slots) {
            let was_lost = slot.lost.load(Ordering::Relaxed);
            let sample = self.sample_device(info, slot, time_ms);
            if !was_lost && sample.absent.values().any(|a| *a == Absent::GpuLost) {
                slot.lost.store(true, Ordering::Relaxed);
                tick.events.push(Event {
                    time_ms,
                    device: Some(info.index),
                    kind: EventKind::DeviceLost {
                        reason: lost_reason(info),
                    },
                });
            }
            tick.samples.push(sample);
        }
        Ok(tick)
    }

    fn wait_for_slow_fields(&self, timeout: Duration) {
        if self.slow_fields == SlowFields::InPoll {
            // Read inside every poll: nothing to wait for.
            return;
        }
        let deadline = Instant::now() + timeout;
        for slot in &self.slots {
            slot.wait_first_round(deadline);
        }
    }

    fn set_slow_interval(&mut self, interval: Duration) {
        lock(&self.slow.control).interval = interval.max(MIN_SLOW_INTERVAL);
        self.slow.wake.notify_all();
    }
}

fn lost_reason(info: &DeviceInfo) -> String {
    let bus = info
        .pci_bus_id
        .as_deref()
        .map(|b| format!(" ({b})"))
        .unwrap_or_default();
    format!(
        "GPU {}{bus} fell off the bus or stopped answering (NVML: GPU is lost); it needs a reset \
         or a reboot",
        info.index
    )
}

// ---------------------------------------------------------------------------------------------
// Opening and static attributes

/// Everything `open` does that can block in the driver.
fn open_blocking() -> Result<Opened, BackendError> {
    let nvml = Nvml::init().map_err(|e| BackendError::Unavailable(init_error_message(&e)))?;
    let count = nvml.device_count().map_err(|e| {
        BackendError::Unavailable(format!(
            "NVML could not count GPUs: {}",
            one_line(&e.to_string())
        ))
    })?;
    if count == 0 {
        return Err(BackendError::NoDevice(
            "NVML is working but lists no NVIDIA GPU (in a container, are the GPUs passed in?)"
                .into(),
        ));
    }
    let host = read_host_info(&nvml);
    let devices = (0..count).map(|i| read_device_info(&nvml, i)).collect();
    Ok(Opened {
        nvml,
        host,
        devices,
    })
}

/// A one-line explanation of why `nvmlInit` failed, phrased for the person at the terminal.
pub fn init_error_message(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(detail) => format!(
            "NVIDIA driver library libnvidia-ml.so.1 not found: is the NVIDIA driver installed? \
             ({})",
            one_line(&detail.to_string())
        ),
        NvmlError::LibraryNotFound => "NVIDIA driver library libnvidia-ml.so.1 not found: is \
                                       the NVIDIA driver installed?"
            .into(),
        NvmlError::DriverNotLoaded => "libnvidia-ml.so.1 is installed but the NVIDIA kernel \
                                       driver is not loaded (try nvidia-smi, or modprobe nvidia)"
            .into(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver (check access to \
                                    /dev/nvidiactl and /dev/nvidia*)"
            .into(),
        NvmlError::LibRmVersionMismatch => "libnvidia-ml.so.1 does not match the loaded NVIDIA \
                                            kernel driver (driver updated without a reboot?)"
            .into(),
        NvmlError::FailedToLoadSymbol(detail) => format!(
            "libnvidia-ml.so.1 lacks nvmlInit_v2, so the NVIDIA driver is too old: {}",
            one_line(detail)
        ),
        other => format!(
            "NVML initialisation failed: {}",
            one_line(&other.to_string())
        ),
    }
}

fn read_host_info(nvml: &Nvml) -> HostInfo {
    HostInfo {
        hostname: gethostname::gethostname().into_string().ok(),
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .and_then(cuda_version_string),
        nvml_version: nvml.sys_nvml_version().ok(),
    }
}

/// `DeviceInfo` fields filled from NVML (everything but `index`, `vendor` and `absent`).
const DEVICE_INFO_FIELDS: &[&str] = &[
    "uuid",
    "name",
    "pci_bus_id",
    "architecture",
    "compute_capability",
    "serial",
    "vbios_version",
    "memory_total_bytes",
    "power_limit_default_w",
    "power_limit_min_w",
    "power_limit_max_w",
    "sm_clock_max_mhz",
    "mem_clock_max_mhz",
    "pcie_gen_max",
    "pcie_width_max",
    "temp_slowdown_c",
    "temp_shutdown_c",
    "temp_gpu_max_c",
    "temp_mem_max_c",
    "ecc_enabled",
    "persistence_mode",
    "mig_enabled",
];

fn read_device_info(nvml: &Nvml, index: u32) -> DeviceInfo {
    let mut info = DeviceInfo {
        index,
        vendor: Some("NVIDIA".into()),
        ..DeviceInfo::default()
    };
    let dev = match nvml.device_by_index(index) {
        Ok(dev) => dev,
        Err(e) => {
            mark_absent(&mut info.absent, DEVICE_INFO_FIELDS, &absent_from(&e));
            return info;
        }
    };
    let ab = &mut info.absent;
    info.uuid = read(dev.uuid(), "uuid", ab);
    info.name = read(dev.name(), "name", ab);
    info.pci_bus_id = read(dev.pci_info(), "pci_bus_id", ab).map(|p| p.bus_id);
    info.architecture = read_with(dev.architecture(), "architecture", ab, architecture_name);
    info.compute_capability = read_with(
        dev.cuda_compute_capability(),
        "compute_capability",
        ab,
        |cc| compute_capability(cc.major, cc.minor),
    );
    info.serial = read(dev.serial(), "serial", ab);
    info.vbios_version = read(dev.vbios_version(), "vbios_version", ab);
    info.memory_total_bytes = read(dev.memory_info(), "memory_total_bytes", ab).map(|m| m.total);
    info.power_limit_default_w = read(
        dev.power_management_limit_default(),
        "power_limit_default_w",
        ab,
    )
    .map(mw_to_w);
    let constraints = read_many(
        dev.power_management_limit_constraints(),
        &["power_limit_min_w", "power_limit_max_w"],
        ab,
    );
    info.power_limit_min_w = constraints.as_ref().map(|c| mw_to_w(c.min_limit));
    info.power_limit_max_w = constraints.map(|c| mw_to_w(c.max_limit));
    info.sm_clock_max_mhz = read(dev.max_clock_info(Clock::SM), "sm_clock_max_mhz", ab);
    info.mem_clock_max_mhz = read(dev.max_clock_info(Clock::Memory), "mem_clock_max_mhz", ab);
    // nvmlDeviceGetMaxPcieLinkGeneration/Width: the best link this GPU *and this slot* allow,
    // which is what a downtrained link is compared against.
    info.pcie_gen_max = read(dev.max_pcie_link_gen(), "pcie_gen_max", ab);
    info.pcie_width_max = read(dev.max_pcie_link_width(), "pcie_width_max", ab);
    let threshold = |t, field: &str, ab: &mut AbsentMap| {
        read(dev.temperature_threshold(t), field, ab).map(f64::from)
    };
    info.temp_slowdown_c = threshold(TemperatureThreshold::Slowdown, "temp_slowdown_c", ab);
    info.temp_shutdown_c = threshold(TemperatureThreshold::Shutdown, "temp_shutdown_c", ab);
    info.temp_gpu_max_c = threshold(TemperatureThreshold::GpuMax, "temp_gpu_max_c", ab);
    info.temp_mem_max_c = threshold(TemperatureThreshold::MemoryMax, "temp_mem_max_c", ab);
    info.ecc_enabled = read(dev.is_ecc_enabled(), "ecc_enabled", ab).map(|m| m.currently_enabled);
    info.persistence_mode = read(dev.is_in_persistent_mode(), "persistence_mode", ab);
    info.mig_enabled =
        read(dev.mig_mode(), "mig_enabled", ab).map(|m| m.current == NVML_DEVICE_MIG_ENABLE);
    info
}

// ---------------------------------------------------------------------------------------------
// Fast fields

/// `Sample` fields read on every poll.
const FAST_FIELDS: &[&str] = &[
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_free_bytes",
    "mem_total_bytes",
    "power_w",
    "power_limit_w",
    "temp_gpu_c",
    "temp_mem_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pstate",
    "throttle_reasons",
    "throttle_reason_names",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "fan_pct",
    "encoder_util_pct",
    "decoder_util_pct",
];

/// `Sample` fields read by the background thread.
const SLOW_FIELDS: &[&str] = &[
    "energy_j",
    "pcie_gen",
    "pcie_width",
    "pcie_replay_count",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "processes",
];

/// `Sample` fields copied from `DeviceInfo` by `copy_static` (listed for the coverage test).
#[cfg(test)]
const STATIC_FIELDS: &[&str] = &[
    "temp_slowdown_c",
    "temp_shutdown_c",
    "sm_clock_max_mhz",
    "mem_clock_max_mhz",
    "pcie_gen_max",
    "pcie_width_max",
];

fn read_fast(dev: &Device<'_>, s: &mut Sample) {
    let mut ab = std::mem::take(&mut s.absent);
    let a = &mut ab;

    let util = read_many(
        dev.utilization_rates(),
        &["gpu_util_pct", "mem_util_pct"],
        a,
    );
    s.gpu_util_pct = util.as_ref().map(|u| f64::from(u.gpu));
    s.mem_util_pct = util.map(|u| f64::from(u.memory));

    // The wrapper's memory_info() is nvmlDeviceGetMemoryInfo_v2, whose `used` excludes the
    // driver-reserved memory (as nvidia-smi shows it).
    let mem = read_many(
        dev.memory_info(),
        &["mem_used_bytes", "mem_free_bytes", "mem_total_bytes"],
        a,
    );
    s.mem_used_bytes = mem.as_ref().map(|m| m.used);
    s.mem_free_bytes = mem.as_ref().map(|m| m.free);
    s.mem_total_bytes = mem.map(|m| m.total);

    s.power_w = read(dev.power_usage(), "power_w", a).map(mw_to_w);
    s.power_limit_w = read(dev.enforced_power_limit(), "power_limit_w", a).map(mw_to_w);
    s.temp_gpu_c = read(dev.temperature(TemperatureSensor::Gpu), "temp_gpu_c", a).map(f64::from);
    s.sm_clock_mhz = read(dev.clock_info(Clock::SM), "sm_clock_mhz", a);
    s.mem_clock_mhz = read(dev.clock_info(Clock::Memory), "mem_clock_mhz", a);
    s.pstate = read_with(dev.performance_state(), "pstate", a, |p| {
        pstate_index(p).ok_or_else(|| Absent::Error("performance state unknown".into()))
    });

    let bits = read_many(
        throttle_bits(dev.current_throttle_reasons_strict()),
        &["throttle_reasons", "throttle_reason_names"],
        a,
    );
    s.throttle_reasons = bits;
    s.throttle_reason_names = bits.map(throttle_reason_names);

    // Fan 0 only. Fanless (SXM) parts answer InvalidArg for it: see `fan_absent`.
    s.fan_pct = match dev.fan_speed(0) {
        Ok(pct) => Some(f64::from(pct)),
        Err(e) => {
            a.insert("fan_pct".into(), fan_absent(&e));
            None
        }
    };
    s.encoder_util_pct =
        read(dev.encoder_utilization(), "encoder_util_pct", a).map(|u| f64::from(u.utilization));
    s.decoder_util_pct =
        read(dev.decoder_utilization(), "decoder_util_pct", a).map(|u| f64::from(u.utilization));

    let ids = BatchField::ALL.map(|f| FieldId(f.id()));
    apply_field_values(s, a, dev.field_values_for(&ids));

    s.absent = ab;
}

/// Counters read in one `nvmlDeviceGetFieldValues` call: one driver round trip instead of
/// twelve, and the only safe route in `nvml-wrapper` 0.13 to memory temperature and remapped
/// rows (it wraps neither `nvmlDeviceGetRemappedRows` nor a memory temperature sensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchField {
    TempMem,
    EccCorrectedVolatile,
    EccUncorrectedVolatile,
    EccCorrectedAggregate,
    EccUncorrectedAggregate,
    RetiredSbe,
    RetiredDbe,
    RetiredPending,
    RemappedCorrectable,
    RemappedUncorrectable,
    RemappedPending,
    RemappedFailure,
}

impl BatchField {
    const ALL: [BatchField; 12] = [
        BatchField::TempMem,
        BatchField::EccCorrectedVolatile,
        BatchField::EccUncorrectedVolatile,
        BatchField::EccCorrectedAggregate,
        BatchField::EccUncorrectedAggregate,
        BatchField::RetiredSbe,
        BatchField::RetiredDbe,
        BatchField::RetiredPending,
        BatchField::RemappedCorrectable,
        BatchField::RemappedUncorrectable,
        BatchField::RemappedPending,
        BatchField::RemappedFailure,
    ];

    /// The `NVML_FI_DEV_*` id from nvml.h. All are below 251, so the wrapper's translation of
    /// ids renumbered in driver 580.82 leaves them alone.
    fn id(self) -> u32 {
        use nvml_wrapper::sys_exports::field_id::*;
        match self {
            BatchField::TempMem => NVML_FI_DEV_MEMORY_TEMP,
            BatchField::EccCorrectedVolatile => NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            BatchField::EccUncorrectedVolatile => NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            BatchField::EccCorrectedAggregate => NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
            BatchField::EccUncorrectedAggregate => NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
            BatchField::RetiredSbe => NVML_FI_DEV_RETIRED_SBE,
            BatchField::RetiredDbe => NVML_FI_DEV_RETIRED_DBE,
            BatchField::RetiredPending => NVML_FI_DEV_RETIRED_PENDING,
            BatchField::RemappedCorrectable => NVML_FI_DEV_REMAPPED_COR,
            BatchField::RemappedUncorrectable => NVML_FI_DEV_REMAPPED_UNC,
            BatchField::RemappedPending => NVML_FI_DEV_REMAPPED_PENDING,
            BatchField::RemappedFailure => NVML_FI_DEV_REMAPPED_FAILURE,
        }
    }

    /// The `Sample` field it fills.
    fn name(self) -> &'static str {
        match self {
            BatchField::TempMem => "temp_mem_c",
            BatchField::EccCorrectedVolatile => "ecc_corrected_volatile",
            BatchField::EccUncorrectedVolatile => "ecc_uncorrected_volatile",
            BatchField::EccCorrectedAggregate => "ecc_corrected_aggregate",
            BatchField::EccUncorrectedAggregate => "ecc_uncorrected_aggregate",
            BatchField::RetiredSbe => "retired_pages_sbe",
            BatchField::RetiredDbe => "retired_pages_dbe",
            BatchField::RetiredPending => "retired_pages_pending",
            BatchField::RemappedCorrectable => "remapped_rows_correctable",
            BatchField::RemappedUncorrectable => "remapped_rows_uncorrectable",
            BatchField::RemappedPending => "remapped_rows_pending",
            BatchField::RemappedFailure => "remapped_rows_failure",
        }
    }

    /// Stores one field value into the sample; counters are unsigned, flags are 0/1.
    fn store(self, s: &mut Sample, v: &SampleValue) -> Result<(), Absent> {
        let count = || sample_value_u64(v);
        let flag = || sample_value_u64(v).map(|x| x != 0);
        match self {
            BatchField::TempMem => s.temp_mem_c = Some(count()? as f64),
            BatchField::EccCorrectedVolatile => s.ecc_corrected_volatile = Some(count()?),
            BatchField::EccUncorrectedVolatile => s.ecc_uncorrected_volatile = Some(count()?),
            BatchField::EccCorrectedAggregate => s.ecc_corrected_aggregate = Some(count()?),
            BatchField::EccUncorrectedAggregate => s.ecc_uncorrected_aggregate = Some(count()?),
            BatchField::RetiredSbe => s.retired_pages_sbe = Some(count()?),
            BatchField::RetiredDbe => s.retired_pages_dbe = Some(count()?),
            BatchField::RetiredPending => s.retired_pages_pending = Some(flag()?),
            BatchField::RemappedCorrectable => s.remapped_rows_correctable = Some(count()?),
            BatchField::RemappedUncorrectable => s.remapped_rows_uncorrectable = Some(count()?),
            BatchField::RemappedPending => s.remapped_rows_pending = Some(flag()?),
            BatchField::RemappedFailure => s.remapped_rows_failure = Some(flag()?),
        }
        Ok(())
    }
}

/// Fills the batched counters from one `field_values_for(BatchField::ALL)` answer. NVML answers
/// in request order, each entry with its own status; the whole call can fail too.
fn apply_field_values(
    s: &mut Sample,
    ab: &mut AbsentMap,
    batch: Result<Vec<Result<FieldValueSample, NvmlError>>, NvmlError>,
) {
    let values = match batch {
        Ok(values) => values,
        Err(e) => {
            let why = absent_from(&e);
            for f in BatchField::ALL {
                ab.insert(f.name().into(), why.clone());
            }
            return;
        }
    };
    for (i, f) in BatchField::ALL.into_iter().enumerate() {
        let stored = match values.get(i) {
            Some(Ok(sample)) => sample
                .value
                .as_ref()
                .map_err(absent_from)
                .and_then(|v| f.store(s, v)),
            Some(Err(e)) => Err(absent_from(e)),
            None => Err(Absent::Error(
                "NVML returned fewer field values than asked".into(),
            )),
        };
        if let Err(why) = stored {
            ab.insert(f.name().into(), why);
        }
    }
}

/// A field value as an unsigned count. Negative or non-finite values are errors, never 0.
fn sample_value_u64(v: &SampleValue) -> Result<u64, Absent> {
    let bad = || Absent::Error(format!("unexpected field value {v:?}"));
    match *v {
        SampleValue::U32(x) => Ok(u64::from(x)),
        SampleValue::U64(x) => Ok(x),
        SampleValue::I64(x) => u64::try_from(x).map_err(|_| bad()),
        SampleValue::F64(x) if x.is_finite() && x >= 0.0 => Ok(x.round() as u64),
        SampleValue::F64(_) => Err(bad()),
    }
}

// ---------------------------------------------------------------------------------------------
// Slow fields

/// The latest slow reading of one device; `Err` carries why a value is absent. Values are as
/// old as the reading (at most one slow interval): the energy and replay counters are
/// cumulative, so rates over minutes are unaffected, and rules judge the link state over a
/// window, not one tick.
#[derive(Debug, Clone, PartialEq)]
struct SlowReading {
    energy_j: Result<f64, Absent>,
    pcie_gen: Result<u32, Absent>,
    pcie_width: Result<u32, Absent>,
    pcie_replay_count: Result<u64, Absent>,
    pcie_rx_bytes_per_s: Result<f64, Absent>,
    pcie_tx_bytes_per_s: Result<f64, Absent>,
    processes: Result<Vec<ProcessSample>, Absent>,
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
            processes: Err(why),
        }
    }

    fn apply(&self, s: &mut Sample) {
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
    }
}

/// Per-device state shared by `poll()` and that device's slow reader.
struct DeviceSlot {
    /// Written by the reader only after each stage's NVML calls have returned, so `poll()`
    /// only ever waits for a clone-sized critical section.
    latest: Mutex<SlowReading>,
    /// Completed slow rounds, with a condvar so a caller can wait for the first one.
    rounds: Mutex<u64>,
    round_done: Condvar,
    /// Set by `poll()` when the GPU is lost; the reader then stops calling NVML.
    lost: AtomicBool,
}

/// Cadence and stop flag for all slow readers; the condvar makes their sleep interruptible.
struct SlowShared {
    control: Mutex<SlowControl>,
    wake: Condvar,
}

struct SlowControl {
    stop: bool,
    interval: Duration,
}

impl DeviceSlot {
    fn new() -> Self {
        DeviceSlot {
            latest: Mutex::new(SlowReading::all(Absent::NotYetRead)),
            rounds: Mutex::new(0),
            round_done: Condvar::new(),
            lost: AtomicBool::new(false),
        }
    }

    fn finish_round(&self) {
        *lock(&self.rounds) += 1;
        self.round_done.notify_all();
    }

    /// Waits until at least one slow round has completed or `deadline` passes.
    fn wait_first_round(&self, deadline: Instant) {
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

    fn stopped(&self) -> bool {
        lock(&self.control).stop
    }
}

fn start_slow_reader(
    nvml: &Arc<Nvml>,
    index: u32,
    slot: &Arc<DeviceSlot>,
    shared: &Arc<SlowShared>,
) {
    let (nvml, thread_slot, shared) = (Arc::clone(nvml), Arc::clone(slot), Arc::clone(shared));
    let spawned = std::thread::Builder::new()
        .name(format!("nvml-slow-{index}"))
        .spawn(move || slow_loop(&nvml, index, &thread_slot, &shared));
    if let Err(e) = spawned {
        *lock(&slot.latest) = SlowReading::all(Absent::Error(format!(
            "could not start the slow reader: {e}"
        )));
    }
}

fn slow_loop(nvml: &Nvml, index: u32, slot: &DeviceSlot, shared: &SlowShared) {
    let mut util_since = None;
    loop {
        if shared.stopped() || slot.lost.load(Ordering::Relaxed) {
            return;
        }
        let started = Instant::now();
        read_slow(nvml, index, &mut util_since, slot);
        slot.finish_round();
        if !shared.sleep_until_next(started) {
            return;
        }
    }
}

/// One slow round for one device, published in stages from cheapest to dearest so that a
/// reader waiting for the first round gets the counters and link state in a few milliseconds
/// and only the PCIe throughput (two ~20 ms calls) last. `util_since` is the newest
/// per-process utilisation sample seen so far (NVML's CPU timestamp, µs), so each round
/// averages only new samples.
fn read_slow(nvml: &Nvml, index: u32, util_since: &mut Option<u64>, slot: &DeviceSlot) {
    let dev = match nvml.device_by_index(index) {
        Ok(dev) => dev,
        Err(e) => {
            *lock(&slot.latest) = SlowReading::all(absent_from(&e));
            return;
        }
    };
    let energy = dev.total_energy_consumption();
    let link_gen = dev.current_pcie_link_gen();
    let link_width = dev.current_pcie_link_width();
    let replays = dev.pcie_replay_counter();
    {
        let mut latest = lock(&slot.latest);
        latest.energy_j = energy.map(mj_to_j).map_err(|e| absent_from(&e));
        latest.pcie_gen = link_gen.map_err(|e| absent_from(&e));
        latest.pcie_width = link_width.map_err(|e| absent_from(&e));
        latest.pcie_replay_count = replays.map(u64::from).map_err(|e| absent_from(&e));
    }
    let processes = read_processes(nvml, &dev, util_since);
    lock(&slot.latest).processes = processes;
    // Each of these blocks ~20 ms: NVML samples the PCIe counters over that window.
    let rx = dev.pcie_throughput(PcieUtilCounter::Receive);
    let tx = dev.pcie_throughput(PcieUtilCounter::Send);
    let mut latest = lock(&slot.latest);
    latest.pcie_rx_bytes_per_s = rx.map(kb_per_s_to_bytes).map_err(|e| absent_from(&e));
    latest.pcie_tx_bytes_per_s = tx.map(kb_per_s_to_bytes).map_err(|e| absent_from(&e));
}

fn read_processes(
    nvml: &Nvml,
    dev: &Device<'_>,
    util_since: &mut Option<u64>,
) -> Result<Vec<ProcessSample>, Absent> {
    let list = merge_process_lists(
        dev.running_compute_processes(),
        dev.running_graphics_processes(),
    )?;
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let sm_util = match dev.process_utilization_stats(*util_since) {
        Ok(samples) => {
            if let Some(newest) = samples.iter().map(|u| u.timestamp).max() {
                *util_since = Some(newest);
            }
            Some(sm_util_by_pid(&samples))
        }
        // NVML's way of saying no process had any SM activity since `util_since`.
        Err(NvmlError::NotFound) => Some(HashMap::new()),
        // MIG, vGPU and old parts: no per-process utilisation.
        Err(_) => None,
    };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    Ok(list
        .into_iter()
        .map(|(p, kind)| {
            let proc_file = |name: &str| std::fs::read_to_string(format!("/proc/{}/{name}", p.pid));
            let name = proc_file("comm")
                .ok()
                .and_then(|c| non_empty(c.trim()))
                .or_else(|| {
                    // Another PID namespace (gpudiag in a container) hides /proc/<pid>;
                    // the driver still knows the name.
                    nvml.sys_process_name(p.pid, 256)
                        .ok()
                        .and_then(|n| non_empty(basename(&n)))
                });
            let status = proc_file("status").ok();
            let user = status.as_deref().and_then(|st| {
                let uid = status_uid(st)?;
                Some(passwd_name(&passwd, uid).unwrap_or_else(|| uid.to_string()))
            });
            let container_pid = status.as_deref().and_then(status_inner_pid);
            let container_id = proc_file("cgroup")
                .ok()
                .and_then(|c| container_id_from_cgroup(&c));
            ProcessSample {
                pid: p.pid,
                name,
                user,
                kind: Some(kind.into()),
                used_memory_bytes: used_memory(&p.used_gpu_memory),
                // NVML lists only processes with non-zero utilisation in the window, so a
                // process missing from a successful answer genuinely had 0 %.
                sm_util_pct: sm_util
                    .as_ref()
                    .map(|m| m.get(&p.pid).copied().unwrap_or(0.0)),
                container_id,
                container_pid,
            }
        })
        .collect())
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

// ---------------------------------------------------------------------------------------------
// XID events

/// How long one wait on the event set may block; bounds how late the thread notices a stop.
const EVENT_WAIT_MS: u32 = 100;

/// Starts the thread that waits on an NVML event set for XID errors of every device and queues
/// them as `Event`s for the next poll. Devices that cannot deliver XID events are reported once,
/// as a notice, instead of silently missing them.
fn start_event_thread(
    nvml: &Arc<Nvml>,
    devices: &[DeviceInfo],
    queue: &Arc<Mutex<Vec<Event>>>,
    shared: &Arc<SlowShared>,
) {
    let (nvml, thread_queue, shared) = (Arc::clone(nvml), Arc::clone(queue), Arc::clone(shared));
    let indices: Vec<u32> = devices.iter().map(|d| d.index).collect();
    let spawned = std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || event_loop(&nvml, &indices, &thread_queue, &shared));
    if let Err(e) = spawned {
        lock(queue).push(notice(
            None,
            format!("XID events are off: could not start their thread: {e}"),
        ));
    }
}

fn notice(device: Option<u32>, message: String) -> Event {
    Event {
        time_ms: now_ms(),
        device,
        kind: EventKind::Notice { message },
    }
}

/// Registers every device that supports XID events on one set. A failed registration frees the
/// set (NVML's rule), so the set is rebuilt with the devices registered before.
fn register_xid_devices<'n>(
    nvml: &'n Nvml,
    indices: &[u32],
    queue: &Mutex<Vec<Event>>,
) -> Option<EventSet<'n>> {
    let mut registered: Vec<u32> = Vec::new();
    let mut set = nvml.create_event_set().ok()?;
    for &index in indices {
        let unsupported = |why: String| {
            notice(
                Some(index),
                format!(
                    "XID events are not available for GPU {index} ({why}); XIDs will only show in the kernel log"
                ),
            )
        };
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                lock(queue).push(unsupported(e.to_string()));
                continue;
            }
        };
        match dev.supported_event_types() {
            Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
            Ok(_) => {
                lock(queue).push(unsupported("not supported by this GPU or driver".into()));
                continue;
            }
            Err(e) => {
                lock(queue).push(unsupported(e.to_string()));
                continue;
            }
        }
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered.push(index);
            }
            Err(e) => {
                lock(queue).push(unsupported(e.error.to_string()));
                set = nvml.create_event_set().ok()?;
                for &again in &registered {
                    let dev = nvml.device_by_index(again).ok()?;
                    set = dev
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .ok()?;
                }
            }
        }
    }
    (!registered.is_empty()).then_some(set)
}

fn event_loop(nvml: &Nvml, indices: &[u32], queue: &Mutex<Vec<Event>>, shared: &SlowShared) {
    let Some(set) = register_xid_devices(nvml, indices, queue) else {
        return;
    };
    let mut failed_before = false;
    while !shared.stopped() {
        match set.wait(EVENT_WAIT_MS) {
            Ok(data) => {
                let Some(XidError::Value(xid)) = data.event_data else {
                    continue;
                };
                let device = data.device.index().ok();
                lock(queue).push(Event {
                    time_ms: now_ms(),
                    device,
                    kind: EventKind::Xid { xid },
                });
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                // A lost GPU or a driver problem: the fast path reports it per device; back
                // off so a persistent failure does not spin.
                if !failed_before {
                    failed_before = true;
                    lock(queue).push(notice(
                        None,
                        format!("XID event wait failed: {e}; retrying"),
                    ));
                }
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Topology

/// NVML reports at most this many NVLinks per GPU (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

/// `NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`: the speed every active link of the GPU runs at, and
/// `..._L0`, link 0's, which some drivers answer when they leave the common one unanswered.
const FI_NVLINK_SPEED_MBPS_COMMON: u32 = 90;
const FI_NVLINK_SPEED_MBPS_L0: u32 = 84;

/// `NVML_AFFINITY_SCOPE_NODE` from nvml.h: affinity as a mask of NUMA nodes.
const NVML_AFFINITY_SCOPE_NODE: u32 = 0;

/// Reads how the GPUs (NVML index, PCI bus id) connect. Every failure becomes a `None` (and one
/// note per cause); a GPU without NVLink simply has no links.
pub fn read_topology(
    nvml: &Nvml,
    devices: &[(u32, Option<String>)],
) -> gpudiag_model::topology::Topology {
    use gpudiag_model::topology::{GpuPair, GpuPlacement, Topology, finish_pairs};
    let mut notes: Vec<String> = Vec::new();
    let mut note = |n: String| {
        if !notes.contains(&n) {
            notes.push(n);
        }
    };
    let handles: Vec<(u32, Option<Device<'_>>)> = devices
        .iter()
        .map(|(i, _)| (*i, nvml.device_by_index(*i).ok()))
        .collect();
    let bus_of = |i: u32| {
        devices
            .iter()
            .find(|(d, _)| *d == i)
            .and_then(|(_, b)| b.clone())
    };
    let mut gpus = Vec::new();
    for (index, dev) in &handles {
        let Some(dev) = dev else {
            note(format!("GPU {index}: no NVML handle"));
            continue;
        };
        let pci_bus_id = bus_of(*index);
        let nvlinks = read_nvlinks(dev, devices);
        gpus.push(GpuPlacement {
            index: *index,
            numa_node: numa_node(dev, pci_bus_id.as_deref()),
            cpu_affinity: match dev.cpu_affinity(16) {
                Ok(words) => gpudiag_model::topology::cpu_list(&words),
                Err(e) => {
                    note(format!("CPU affinity: {}", absent_from(&e)));
                    None
                }
            },
            nvlink_speed_gbps: nvlink_speed_gbps(dev),
            nvlink_errors: if nvlinks.iter().any(|l| l.active) {
                nvlink_error_totals(dev, &nvlinks)
            } else {
                NvLinkErrors::default()
            },
            nvlinks,
            pci_bus_id,
        });
    }
    let mut pairs = Vec::new();
    for (i, (a, da)) in handles.iter().enumerate() {
        for (b, db) in &handles[i + 1..] {
            let (Some(da), Some(db)) = (da, db) else {
                continue;
            };
            let mut pair = GpuPair {
                a: *a,
                b: *b,
                pcie_path: None,
                nvlinks: 0,
                label: String::new(),
                p2p: Default::default(),
                note: None,
            };
            // The wrapper takes the other device by value; a fresh handle is the same GPU.
            match nvml
                .device_by_index(*b)
                .map(|other| da.topology_common_ancestor(other))
            {
                Ok(Ok(level)) => pair.pcie_path = Some(pcie_path(level)),
                Ok(Err(e)) | Err(e) => pair.note = Some(format!("PCIe path: {}", absent_from(&e))),
            }
            pair.p2p = p2p_caps(da, db);
            pairs.push(pair);
        }
    }
    finish_pairs(&gpus, &mut pairs);
    Topology { gpus, pairs, notes }
}

fn pcie_path(level: TopologyLevel) -> gpudiag_model::topology::PciePath {
    use gpudiag_model::topology::PciePath;
    match level {
        TopologyLevel::Internal => PciePath::Board,
        TopologyLevel::Single => PciePath::Switch,
        TopologyLevel::Multiple => PciePath::Switches,
        TopologyLevel::HostBridge => PciePath::HostBridge,
        TopologyLevel::Node => PciePath::NumaNode,
        TopologyLevel::System => PciePath::System,
    }
}

/// The NUMA node nearest the GPU's memory traffic (what `nvidia-smi topo -m` shows as NUMA
/// affinity), else the GPU's own NUMA node, else the kernel's (`-1` there means none is given,
/// as in many VMs).
fn numa_node(dev: &Device<'_>, bus: Option<&str>) -> Option<u32> {
    if let Ok(mask) = dev.memory_affinity(1, NVML_AFFINITY_SCOPE_NODE) {
        let words: Vec<u64> = mask.into_iter().collect();
        if let Some(first) = words
            .iter()
            .enumerate()
            .find_map(|(w, bits)| (*bits != 0).then(|| w as u32 * 64 + bits.trailing_zeros()))
        {
            return Some(first);
        }
    }
    if let Ok(n) = dev.numa_node_id() {
        return Some(n);
    }
    let bus = bus?.to_ascii_lowercase();
    // The kernel names PCI devices with a 4-digit domain; NVML uses 8.
    let sysfs_name = match bus.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => bus,
    };
    let text =
        std::fs::read_to_string(format!("/sys/bus/pci/devices/{sysfs_name}/numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

fn nvlink_speed_gbps(dev: &Device<'_>) -> Option<f64> {
    let answer = dev
        .field_values_for(&[
            FieldId(FI_NVLINK_SPEED_MBPS_COMMON),
            FieldId(FI_NVLINK_SPEED_MBPS_L0),
        ])
        .ok()?;
    answer.into_iter().find_map(|sample| {
        let mbps = match sample.ok()?.value.ok()? {
            SampleValue::U32(v) => f64::from(v),
            SampleValue::U64(v) => v as f64,
            SampleValue::I64(v) => v as f64,
            _ => return None,
        };
        // NVML's "MBps" are 1e6 bytes per second; 0 means no link is up.
        (mbps > 0.0).then_some(mbps / 1e3)
    })
}

fn read_nvlinks(
    dev: &Device<'_>,
    devices: &[(u32, Option<String>)],
) -> Vec<gpudiag_model::topology::NvLink> {
    use gpudiag_model::topology::NvLink;
    let mut links = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let l = dev.link_wrapper_for(link);
        // InvalidArg / NotSupported: the GPU has fewer links (or none); stop at the first.
        let Ok(active) = l.is_active() else { break };
        let remote = if active {
            l.remote_pci_info().ok().map(|p| p.bus_id)
        } else {
            None
        };
        let remote_gpu = remote.as_deref().and_then(|bus| {
            devices
                .iter()
                .find(|(_, b)| b.as_deref().is_some_and(|b| b.eq_ignore_ascii_case(bus)))
                .map(|(i, _)| *i)
        });
        links.push(NvLink {
            link,
            active,
            remote_pci_bus_id: remote,
            remote_gpu,
        });
    }
    links
}

/// `NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,CRC_DATA}_ERROR_COUNT_TOTAL`.
const FI_NVLINK_ERROR_TOTALS: [u32; 4] = [52, 59, 38, 45];

/// The GPU's NVLink error counters summed over its links. One batched field-value call: asking
/// each link for each counter costs about 0.9 ms a call on an H200 (63 ms for 18 links), which
/// would make `check` slower than `nvidia-smi -q` on every NVLink host. Per-link calls remain
/// the fallback for drivers that do not answer the totals.
fn nvlink_error_totals(
    dev: &Device<'_>,
    links: &[gpudiag_model::topology::NvLink],
) -> NvLinkErrors {
    let value = |r: Result<FieldValueSample, NvmlError>| match r.ok()?.value.ok()? {
        SampleValue::U64(v) => Some(v),
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        _ => None,
    };
    let ids = FI_NVLINK_ERROR_TOTALS.map(FieldId);
    if let Ok(answers) = dev.field_values_for(&ids) {
        let mut v = answers.into_iter().map(value);
        let totals = NvLinkErrors {
            replay: v.next().flatten(),
            recovery: v.next().flatten(),
            crc_flit: v.next().flatten(),
            crc_data: v.next().flatten(),
        };
        if totals != NvLinkErrors::default() {
            return totals;
        }
    }
    use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
    let sum = |c: ErrorCounter| {
        links
            .iter()
            .filter_map(|l| dev.link_wrapper_for(l.link).error_counter(c).ok())
            .reduce(|a, b| a.saturating_add(b))
    };
    NvLinkErrors {
        replay: sum(ErrorCounter::DlReplay),
        recovery: sum(ErrorCounter::DlRecovery),
        crc_flit: sum(ErrorCounter::DlCrcFlit),
        crc_data: sum(ErrorCounter::DlCrcData),
    }
}

fn p2p_caps(a: &Device<'_>, b: &Device<'_>) -> gpudiag_model::topology::P2pCaps {
    let status = |idx: P2pCapabilitiesIndex| a.p2p_status(b, idx).ok().map(p2p_status_name);
    gpudiag_model::topology::P2pCaps {
        read: status(P2pCapabilitiesIndex::Read),
        write: status(P2pCapabilitiesIndex::Write),
        nvlink: status(P2pCapabilitiesIndex::NvLink),
        atomics: status(P2pCapabilitiesIndex::Atomics),
    }
}

fn p2p_status_name(s: P2pStatus) -> String {
    match s {
        P2pStatus::Ok => "ok",
        P2pStatus::ChipsetNotSupported => "chipset_not_supported",
        P2pStatus::GpuNotSupported => "gpu_not_supported",
        P2pStatus::IohTopologyNotSupported => "topology_not_supported",
        P2pStatus::DisabledByRegkey => "disabled_by_regkey",
        P2pStatus::NotSupported => "not_supported",
        P2pStatus::Unknown => "unknown",
    }
    .to_owned()
}

// ---------------------------------------------------------------------------------------------
// Pure mapping functions

/// Why a value is absent, from the NVML error that kept it from us.
pub fn absent_from(e: &NvmlError) -> Absent {
    match e {
        NvmlError::NotSupported => Absent::NotSupported,
        NvmlError::NoPermission => Absent::NoPermission,
        NvmlError::GpuLost => Absent::GpuLost,
        // The loaded libnvidia-ml predates the entry point: the driver does not offer the value.
        NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => Absent::NotSupported,
        other => Absent::Error(one_line(&other.to_string())),
    }
}

/// Why fan 0's speed is absent. A fanless part (SXM boards, cooled by the chassis) has no fan
/// index 0, so NVML rejects the index (InvalidArg, seen on an H200) rather than saying
/// NotSupported.
fn fan_absent(e: &NvmlError) -> Absent {
    match e {
        NvmlError::InvalidArg => Absent::NotSupported,
        other => absent_from(other),
    }
}

/// Reads one NVML value; on failure records why under `field` and yields `None`.
fn read<T>(r: Result<T, NvmlError>, field: &str, absent: &mut AbsentMap) -> Option<T> {
    read_many(r, &[field], absent)
}

/// Like `read`, for a call whose answer fills several fields.
fn read_many<T>(r: Result<T, NvmlError>, fields: &[&str], absent: &mut AbsentMap) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            mark_absent(absent, fields, &absent_from(&e));
            None
        }
    }
}

/// Like `read`, then maps the value, which may itself turn out absent.
fn read_with<T, U>(
    r: Result<T, NvmlError>,
    field: &str,
    absent: &mut AbsentMap,
    f: impl FnOnce(T) -> Result<U, Absent>,
) -> Option<U> {
    match read(r, field, absent).map(f)? {
        Ok(v) => Some(v),
        Err(why) => {
            absent.insert(field.into(), why);
            None
        }
    }
}

fn mark_absent(absent: &mut AbsentMap, fields: &[&str], why: &Absent) {
    for f in fields {
        absent.insert((*f).into(), why.clone());
    }
}

/// The raw clock-event bits. The wrapper's strict call rejects bits it has no flag for, but
/// hands them back in the error, so newer drivers' reasons survive as `unknown_0x...` names.
fn throttle_bits(r: Result<ThrottleReasons, NvmlError>) -> Result<u64, NvmlError> {
    match r {
        Ok(reasons) => Ok(reasons.bits()),
        Err(NvmlError::IncorrectBits(Bits::U64(bits))) => Ok(bits),
        Err(NvmlError::IncorrectBits(Bits::U32(bits))) => Ok(u64::from(bits)),
        Err(e) => Err(e),
    }
}

/// P0..P15 as 0..15; `Unknown` as `None`.
pub fn pstate_index(p: PerformanceState) -> Option<u32> {
    use PerformanceState::*;
    Some(match p {
        Zero => 0,
        One => 1,
        Two => 2,
        Three => 3,
        Four => 4,
        Five => 5,
        Six => 6,
        Seven => 7,
        Eight => 8,
        Nine => 9,
        Ten => 10,
        Eleven => 11,
        Twelve => 12,
        Thirteen => 13,
        Fourteen => 14,
        Fifteen => 15,
        Unknown => return None,
    })
}

/// NVML's CUDA driver version (1000 × major + 10 × minor) as "major.minor": 13000 → "13.0",
/// 12040 → "12.4". Zero or negative (not reported) → `None`.
pub fn cuda_version_string(v: i32) -> Option<String> {
    (v > 0).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// Architecture name as NVML's wrapper prints it ("Hopper"); `Unknown` becomes an absence.
fn architecture_name(a: DeviceArchitecture) -> Result<String, Absent> {
    match a {
        DeviceArchitecture::Unknown => Err(Absent::Error(
            "architecture unknown to this NVML wrapper".into(),
        )),
        known => Ok(known.to_string()),
    }
}

fn compute_capability(major: i32, minor: i32) -> Result<ComputeCapability, Absent> {
    match (u32::try_from(major), u32::try_from(minor)) {
        (Ok(major), Ok(minor)) => Ok(ComputeCapability { major, minor }),
        _ => Err(Absent::Error(format!(
            "invalid compute capability {major}.{minor}"
        ))),
    }
}

/// Milliwatts (NVML power) to watts.
pub fn mw_to_w(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

/// Millijoules (NVML energy counter) to joules.
pub fn mj_to_j(mj: u64) -> f64 {
    mj as f64 / 1000.0
}

/// NVML PCIe throughput (KB/s) to bytes/s. NVML's KB is 1024 bytes, as nvidia-smi and nvitop
/// read it (they print the same counter as KiB/s).
pub fn kb_per_s_to_bytes(kb: u32) -> f64 {
    f64::from(kb) * 1024.0
}

fn used_memory(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(bytes) => Some(*bytes),
        // NVML_VALUE_NOT_AVAILABLE: e.g. MIG without admin rights, or Windows WDDM.
        UsedGpuMemory::Unavailable => None,
    }
}

/// Joins the compute and graphics process lists. A process in both is reported once, as
/// "compute" (the kind rules care about). Only when both calls fail is the list absent.
fn merge_process_lists(
    compute: Result<Vec<ProcessInfo>, NvmlError>,
    graphics: Result<Vec<ProcessInfo>, NvmlError>,
) -> Result<Vec<(ProcessInfo, &'static str)>, Absent> {
    let (compute, graphics) = match (compute, graphics) {
        (Err(e), Err(_)) => return Err(absent_from(&e)),
        (c, g) => (c.unwrap_or_default(), g.unwrap_or_default()),
    };
    let mut out: Vec<(ProcessInfo, &'static str)> = Vec::new();
    for (p, kind) in compute
        .into_iter()
        .map(|p| (p, "compute"))
        .chain(graphics.into_iter().map(|p| (p, "graphics")))
    {
        if !out.iter().any(|(q, _)| q.pid == p.pid) {
            out.push((p, kind));
        }
    }
    Ok(out)
}

/// Mean SM utilisation per pid over the samples NVML returned.
fn sm_util_by_pid(samples: &[ProcessUtilizationSample]) -> HashMap<u32, f64> {
    let mut sums: HashMap<u32, (f64, u32)> = HashMap::new();
    for s in samples {
        let e = sums.entry(s.pid).or_default();
        e.0 += f64::from(s.sm_util);
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(pid, (sum, n))| (pid, sum / f64::from(n)))
        .collect()
}

/// The container id in a `/proc/<pid>/cgroup` file, if the process runs in a container.
///
/// Looks, deepest path component first, for a 64-hex-digit id, bare (cgroupfs drivers:
/// `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`, `/ecs/<task>/<id>`) or wrapped in a
/// systemd scope (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope`). Host processes (`/user.slice/...`, `/`) give `None`.
pub fn container_id_from_cgroup(text: &str) -> Option<String> {
    const PREFIXES: [&str; 6] = [
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
        "cri-o-",
    ];
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .find_map(|path| {
            path.rsplit('/').find_map(|component| {
                let c = component.strip_suffix(".scope").unwrap_or(component);
                let c = PREFIXES.iter().find_map(|p| c.strip_prefix(p)).unwrap_or(c);
                (c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then(|| c.to_ascii_lowercase())
            })
        })
}

/// The real uid from a `/proc/<pid>/status` file (`Uid:\treal\teffective\tsaved\tfs`).
pub fn status_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}

/// The PID a process has in its innermost PID namespace (the last `NSpid:` entry of
/// `/proc/<pid>/status`), when it is nested at all; `None` for a process in the host namespace.
pub fn status_inner_pid(status: &str) -> Option<u32> {
    let ids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    (ids.len() > 1).then(|| ids.last().copied()).flatten()
}

/// The user name for `uid` in `/etc/passwd` text (`name:password:uid:gid:gecos:home:shell`).
/// Comments, blank lines and NIS `+`/`-` entries are skipped.
pub fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .find_map(|l| {
            let mut parts = l.split(':');
            let name = parts.next()?;
            let line_uid: u32 = parts.nth(1)?.parse().ok()?;
            (line_uid == uid && !name.is_empty()).then(|| name.to_string())
        })
}

/// Seconds for messages: "5", "0.5".
fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

/// Messages go into one-line reasons and reports.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A poisoned lock only means another thread panicked mid-update of plain data; the data is
/// still usable, and telemetry must keep flowing.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::decode::THROTTLE_REASONS;
    use std::collections::BTreeSet;

    const ID_A: &str = "4bc1e7f1e0a8a0d0c3c3b8f9d7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8";
    const ID_B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn nvml_errors_map_to_reasons() {
        assert_eq!(absent_from(&NvmlError::NotSupported), Absent::NotSupported);
        assert_eq!(absent_from(&NvmlError::NoPermission), Absent::NoPermission);
        assert_eq!(absent_from(&NvmlError::GpuLost), Absent::GpuLost);
        assert_eq!(
            absent_from(&NvmlError::FunctionNotFound),
            Absent::NotSupported
        );
        assert_eq!(
            absent_from(&NvmlError::FailedToLoadSymbol("nvmlDeviceGetFoo".into())),
            Absent::NotSupported
        );
        assert_eq!(
            absent_from(&NvmlError::Unknown),
            Absent::Error("an internal driver error occurred".into())
        );
        assert!(matches!(
            absent_from(&NvmlError::ResetRequired),
            Absent::Error(m) if m.contains("reset")
        ));
        assert_eq!(fan_absent(&NvmlError::InvalidArg), Absent::NotSupported);
        assert_eq!(fan_absent(&NvmlError::NotSupported), Absent::NotSupported);
        assert_eq!(fan_absent(&NvmlError::GpuLost), Absent::GpuLost);
    }

    #[test]
    fn read_records_reason_and_yields_none() {
        let mut ab = AbsentMap::new();
        assert_eq!(read(Ok(7u32), "x", &mut ab), Some(7));
        assert!(ab.is_empty());
        assert_eq!(
            read::<u32>(Err(NvmlError::NotSupported), "fan_pct", &mut ab),
            None
        );
        assert_eq!(ab.get("fan_pct"), Some(&Absent::NotSupported));
        let r: Option<u32> = read_many(Err(NvmlError::GpuLost), &["a", "b"], &mut ab);
        assert_eq!(r, None);
        assert_eq!(ab.get("a"), Some(&Absent::GpuLost));
        assert_eq!(ab.get("b"), Some(&Absent::GpuLost));
        let p = read_with(Ok(PerformanceState::Unknown), "pstate", &mut ab, |p| {
            pstate_index(p).ok_or(Absent::Unavailable)
        });
        assert_eq!(p, None);
        assert_eq!(ab.get("pstate"), Some(&Absent::Unavailable));
    }

    #[test]
    fn throttle_reason_table_matches_wrapper_flags() {
        let known: u64 = THROTTLE_REASONS.iter().map(|(b, _)| b).sum();
        assert_eq!(known, ThrottleReasons::all().bits());
        assert_eq!(ThrottleReasons::SW_POWER_CAP.bits(), 0x4);
        assert_eq!(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN.bits(), 0x80);
    }

    #[test]
    fn throttle_bits_keep_unknown_bits() {
        let both = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_SLOWDOWN;
        assert_eq!(throttle_bits(Ok(both)).ok(), Some(0xc));
        let unknown = Err(NvmlError::IncorrectBits(Bits::U64(0x404)));
        assert_eq!(throttle_bits(unknown).ok(), Some(0x404));
        assert!(matches!(
            throttle_bits(Err(NvmlError::GpuLost)),
            Err(NvmlError::GpuLost)
        ));
    }

    #[test]
    fn pstates_map_to_numbers() {
        assert_eq!(pstate_index(PerformanceState::Zero), Some(0));
        assert_eq!(pstate_index(PerformanceState::Two), Some(2));
        assert_eq!(pstate_index(PerformanceState::Eight), Some(8));
        assert_eq!(pstate_index(PerformanceState::Fifteen), Some(15));
        assert_eq!(pstate_index(PerformanceState::Unknown), None);
    }

    #[test]
    fn cuda_versions() {
        assert_eq!(cuda_version_string(13000).as_deref(), Some("13.0"));
        assert_eq!(cuda_version_string(12040).as_deref(), Some("12.4"));
        assert_eq!(cuda_version_string(12020).as_deref(), Some("12.2"));
        assert_eq!(cuda_version_string(11080).as_deref(), Some("11.8"));
        assert_eq!(cuda_version_string(12090).as_deref(), Some("12.9"));
        assert_eq!(cuda_version_string(0), None);
        assert_eq!(cuda_version_string(-1), None);
    }

    #[test]
    fn unit_conversions() {
        assert_eq!(mw_to_w(700_000), 700.0);
        assert_eq!(mw_to_w(71_234), 71.234);
        assert_eq!(mj_to_j(123_456_789), 123_456.789);
        assert_eq!(kb_per_s_to_bytes(0), 0.0);
        assert_eq!(kb_per_s_to_bytes(1_000), 1_024_000.0);
        // NVML reports up to ~54 GB/s on a Gen5 x16 link: no overflow in the u32 KB/s input.
        assert_eq!(kb_per_s_to_bytes(52_734_375), 54_000_000_000.0);
    }

    #[test]
    fn static_attribute_helpers() {
        assert_eq!(
            architecture_name(DeviceArchitecture::Hopper).as_deref(),
            Ok("Hopper")
        );
        assert_eq!(
            architecture_name(DeviceArchitecture::Blackwell).as_deref(),
            Ok("Blackwell")
        );
        assert!(architecture_name(DeviceArchitecture::Unknown).is_err());
        assert_eq!(
            compute_capability(9, 0),
            Ok(ComputeCapability { major: 9, minor: 0 })
        );
        assert!(compute_capability(-1, 0).is_err());
        assert_eq!(used_memory(&UsedGpuMemory::Used(1 << 30)), Some(1 << 30));
        assert_eq!(used_memory(&UsedGpuMemory::Unavailable), None);
    }

    fn field(v: Result<SampleValue, NvmlError>) -> Result<FieldValueSample, NvmlError> {
        Ok(FieldValueSample {
            field: FieldId(0),
            timestamp: 0,
            latency: 0,
            value: v,
        })
    }

    #[test]
    fn field_values_fill_counters_and_flags() {
        // An H100 with ECC on: page retirement is replaced by row remapping there.
        let batch = vec![
            field(Ok(SampleValue::U32(41))),     // memory temperature
            field(Ok(SampleValue::U64(3))),      // ECC corrected volatile
            field(Ok(SampleValue::U64(0))),      // ECC uncorrected volatile
            field(Ok(SampleValue::U64(12))),     // ECC corrected aggregate
            field(Ok(SampleValue::I64(1))),      // ECC uncorrected aggregate
            field(Err(NvmlError::NotSupported)), // retired SBE
            field(Err(NvmlError::NotSupported)), // retired DBE
            field(Err(NvmlError::NotSupported)), // retired pending
            field(Ok(SampleValue::U32(2))),      // remapped correctable
            field(Ok(SampleValue::U32(0))),      // remapped uncorrectable
            field(Ok(SampleValue::U32(1))),      // remap pending
            field(Ok(SampleValue::U32(0))),      // remap failure
        ];
        let mut s = Sample::new(0, 1);
        let mut ab = AbsentMap::new();
        apply_field_values(&mut s, &mut ab, Ok(batch));
        assert_eq!(s.temp_mem_c, Some(41.0));
        assert_eq!(s.ecc_corrected_volatile, Some(3));
        assert_eq!(s.ecc_uncorrected_volatile, Some(0));
        assert_eq!(s.ecc_corrected_aggregate, Some(12));
        assert_eq!(s.ecc_uncorrected_aggregate, Some(1));
        assert_eq!(s.retired_pages_sbe, None);
        assert_eq!(s.retired_pages_pending, None);
        assert_eq!(ab.get("retired_pages_sbe"), Some(&Absent::NotSupported));
        assert_eq!(ab.get("retired_pages_dbe"), Some(&Absent::NotSupported));
        assert_eq!(ab.get("retired_pages_pending"), Some(&Absent::NotSupported));
        assert_eq!(s.remapped_rows_correctable, Some(2));
        assert_eq!(s.remapped_rows_uncorrectable, Some(0));
        assert_eq!(s.remapped_rows_pending, Some(true));
        assert_eq!(s.remapped_rows_failure, Some(false));
        assert_eq!(ab.len(), 3);
    }

    #[test]
    fn field_values_failures() {
        // Whole call failed: every batched field absent with the same reason.
        let mut s = Sample::new(0, 1);
        let mut ab = AbsentMap::new();
        apply_field_values(&mut s, &mut ab, Err(NvmlError::GpuLost));
        assert_eq!(ab.len(), BatchField::ALL.len());
        assert!(ab.values().all(|a| *a == Absent::GpuLost));

        // Short answer, a bad value, and a per-field error inside a successful sample.
        let mut ab = AbsentMap::new();
        let batch = vec![
            field(Ok(SampleValue::I64(-5))),
            field(Ok(SampleValue::F64(f64::NAN))),
            field(Ok(SampleValue::U64(0))).map(|mut f| {
                f.value = Err(NvmlError::NoPermission);
                f
            }),
            Err(NvmlError::UnexpectedVariant(9)),
        ];
        apply_field_values(&mut s, &mut ab, Ok(batch));
        assert_eq!(s.temp_mem_c, None);
        assert!(matches!(ab.get("temp_mem_c"), Some(Absent::Error(_))));
        assert!(matches!(
            ab.get("ecc_corrected_volatile"),
            Some(Absent::Error(_))
        ));
        assert_eq!(
            ab.get("ecc_uncorrected_volatile"),
            Some(&Absent::NoPermission)
        );
        assert!(matches!(
            ab.get("ecc_corrected_aggregate"),
            Some(Absent::Error(_))
        ));
        assert!(
            matches!(ab.get("remapped_rows_failure"), Some(Absent::Error(m)) if m.contains("fewer"))
        );
        assert_eq!(ab.len(), BatchField::ALL.len());
    }

    #[test]
    fn batch_field_ids_are_nvml_constants() {
        let ids: Vec<u32> = BatchField::ALL.iter().map(|f| f.id()).collect();
        assert_eq!(ids, [82, 3, 4, 5, 6, 29, 30, 31, 142, 143, 144, 145]);
        let names: BTreeSet<&str> = BatchField::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), BatchField::ALL.len());
        assert!(names.iter().all(|n| FAST_FIELDS.contains(n)));
    }

    fn keys(v: serde_json::Value) -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn field_lists_cover_the_model() {
        // Every optional Sample value is fast, slow or static: nothing can be forgotten when a
        // device is lost or cannot be opened.
        let mut all = keys(serde_json::to_value(Sample::default()).unwrap());
        for k in ["time_ms", "device"] {
            assert!(all.remove(k));
        }
        let ours: Vec<&str> = [FAST_FIELDS, SLOW_FIELDS, STATIC_FIELDS].concat();
        let ours_set: BTreeSet<String> = ours.iter().map(|s| s.to_string()).collect();
        assert_eq!(ours.len(), ours_set.len(), "a field is listed twice");
        assert_eq!(all, ours_set);

        let mut info = keys(serde_json::to_value(DeviceInfo::default()).unwrap());
        for k in ["index", "vendor"] {
            assert!(info.remove(k));
        }
        let listed: BTreeSet<String> = DEVICE_INFO_FIELDS.iter().map(|s| s.to_string()).collect();
        assert_eq!(info, listed);
    }

    #[test]
    fn static_values_and_reasons_are_copied() {
        let mut info = DeviceInfo {
            temp_slowdown_c: Some(87.0),
            temp_shutdown_c: Some(92.0),
            sm_clock_max_mhz: Some(1980),
            mem_clock_max_mhz: Some(2619),
            pcie_gen_max: Some(5),
            ..DeviceInfo::default()
        };
        info.absent
            .insert("pcie_width_max".into(), Absent::NoPermission);
        let mut s = Sample::new(0, 1);
        s.copy_static_from(&info);
        assert_eq!(s.temp_slowdown_c, Some(87.0));
        assert_eq!(s.temp_shutdown_c, Some(92.0));
        assert_eq!(s.sm_clock_max_mhz, Some(1980));
        assert_eq!(s.mem_clock_max_mhz, Some(2619));
        assert_eq!(s.pcie_gen_max, Some(5));
        assert_eq!(s.pcie_width_max, None);
        assert_eq!(s.why_absent("pcie_width_max"), Some(&Absent::NoPermission));
        assert_eq!(s.absent.len(), 1);
    }

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
        assert_eq!(s.absent.len(), 2);
    }

    fn proc_info(pid: u32, mem: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: mem,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn process_lists_merge() {
        let compute = Ok(vec![
            proc_info(10, UsedGpuMemory::Used(1 << 20)),
            proc_info(11, UsedGpuMemory::Unavailable),
        ]);
        let graphics = Ok(vec![
            proc_info(11, UsedGpuMemory::Used(5)),
            proc_info(12, UsedGpuMemory::Used(7)),
        ]);
        let merged = merge_process_lists(compute, graphics).unwrap();
        let got: Vec<(u32, &str)> = merged.iter().map(|(p, k)| (p.pid, *k)).collect();
        assert_eq!(got, [(10, "compute"), (11, "compute"), (12, "graphics")]);

        let only_compute = merge_process_lists(
            Ok(vec![proc_info(1, UsedGpuMemory::Used(1))]),
            Err(NvmlError::NotSupported),
        )
        .unwrap();
        assert_eq!(only_compute.len(), 1);
        assert_eq!(
            merge_process_lists(Err(NvmlError::NoPermission), Err(NvmlError::NotSupported))
                .unwrap_err(),
            Absent::NoPermission
        );
    }

    #[test]
    fn sm_util_is_averaged_per_pid() {
        let u = |pid, ts, sm| ProcessUtilizationSample {
            pid,
            timestamp: ts,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        };
        let m = sm_util_by_pid(&[u(1, 10, 90), u(2, 10, 5), u(1, 20, 70)]);
        assert_eq!(m.get(&1), Some(&80.0));
        assert_eq!(m.get(&2), Some(&5.0));
        assert_eq!(m.get(&3), None);
    }

    #[test]
    fn container_ids_from_real_cgroup_files() {
        // cgroup v1, Docker with the cgroupfs driver.
        let v1 = format!(
            "12:pids:/docker/{ID_A}\n11:memory:/docker/{ID_A}\n1:name=systemd:/docker/{ID_A}\n"
        );
        assert_eq!(container_id_from_cgroup(&v1).as_deref(), Some(ID_A));
        // cgroup v2, Docker with the systemd driver.
        let v2 = format!("0::/system.slice/docker-{ID_A}.scope\n");
        assert_eq!(container_id_from_cgroup(&v2).as_deref(), Some(ID_A));
        // Kubernetes + containerd, systemd driver.
        let k8s = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1d2c3b4a_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/\
             cri-containerd-{ID_B}.scope\n"
        );
        assert_eq!(container_id_from_cgroup(&k8s).as_deref(), Some(ID_B));
        // Kubernetes, cgroupfs driver (v1).
        let k8s_v1 = format!(
            "11:memory:/kubepods/besteffort/pod1d2c3b4a-5e6f-7a8b-9c0d-1e2f3a4b5c6d/{ID_B}\n"
        );
        assert_eq!(container_id_from_cgroup(&k8s_v1).as_deref(), Some(ID_B));
        // CRI-O.
        let crio =
            format!("0::/kubepods.slice/kubepods-pod1d2c3b4a_5e6f.slice/crio-{ID_A}.scope\n");
        assert_eq!(container_id_from_cgroup(&crio).as_deref(), Some(ID_A));
        // Rootless podman: the scope is not the last component.
        let podman = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID_B}.scope/container\n"
        );
        assert_eq!(container_id_from_cgroup(&podman).as_deref(), Some(ID_B));
        // AWS ECS: task id (32 hex) then container id.
        let ecs = format!("0::/ecs/0123456789abcdef0123456789abcdef/{ID_A}\n");
        assert_eq!(container_id_from_cgroup(&ecs).as_deref(), Some(ID_A));
        // Upper case is normalised.
        let upper = format!("0::/docker/{}\n", ID_A.to_uppercase());
        assert_eq!(container_id_from_cgroup(&upper).as_deref(), Some(ID_A));
    }

    #[test]
    fn host_processes_have_no_container_id() {
        for text in [
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "0::/system.slice/containerd.service\n",
            "12:pids:/user.slice\n11:memory:/\n",
            "",
            // 63 hex digits and a non-hex 64-character name are not ids.
            "0::/docker/4bc1e7f1e0a8a0d0c3c3b8f9d7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f\n",
            "0::/docker/zzc1e7f1e0a8a0d0c3c3b8f9d7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8\n",
        ] {
            assert_eq!(container_id_from_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn uid_and_user_lookup() {
        let status = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
                      Pid:\t4242\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\n\
                      Gid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(status_uid(status), Some(1000));
        assert_eq!(status_uid("Name:\tx\n"), None);
        assert_eq!(status_uid("Uid:\tabc\t0\n"), None);

        let passwd = "# comment\nroot:x:0:0:root:/root:/bin/bash\n\n\
                      daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
                      +nisuser::1001:1001:::\nbroken line\n\
                      alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash\n";
        assert_eq!(passwd_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(passwd_name(passwd, 1001), None);
        assert_eq!(passwd_name(passwd, 4242), None);
        assert_eq!(passwd_name("", 0), None);
    }

    #[test]
    fn init_errors_are_one_line_explanations() {
        let missing = init_error_message(&NvmlError::LibraryNotFound);
        assert!(missing.contains("libnvidia-ml.so.1 not found"), "{missing}");
        let not_loaded = init_error_message(&NvmlError::DriverNotLoaded);
        assert!(not_loaded.contains("not loaded"), "{not_loaded}");
        let mismatch = init_error_message(&NvmlError::LibRmVersionMismatch);
        assert!(mismatch.contains("does not match"), "{mismatch}");
        let other = init_error_message(&NvmlError::Unknown);
        assert!(other.starts_with("NVML initialisation failed"), "{other}");
        for m in [missing, not_loaded, mismatch, other] {
            assert!(!m.contains('\n'));
        }
    }

    #[test]
    fn small_helpers() {
        assert_eq!(fmt_secs(Duration::from_secs(5)), "5");
        assert_eq!(fmt_secs(Duration::from_millis(500)), "0.5");
        assert_eq!(one_line("a\n  b\tc "), "a b c");
        assert_eq!(basename("/usr/bin/python3"), "python3");
        assert_eq!(basename("python3"), "python3");
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

    /// On a host without the driver this must fail cleanly; on a GPU host it must open.
    #[test]
    fn open_fails_cleanly_or_works() {
        match NvmlBackend::open(Duration::from_secs(20)) {
            Ok(b) => assert!(!b.devices().is_empty()),
            Err(BackendError::Unavailable(m)) => {
                assert!(!m.contains('\n'));
                assert!(m.contains("NVIDIA") || m.contains("NVML"), "{m}");
            }
            Err(BackendError::NoDevice(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    /// Run on a GPU host: `cargo test --lib nvml -- --ignored --nocapture`.
    #[test]
    #[ignore = "needs an NVIDIA GPU and driver"]
    fn gpu_open_and_poll() {
        let t = Instant::now();
        let mut b = NvmlBackend::open(Duration::from_secs(20)).expect("open");
        println!("open: {:?}", t.elapsed());
        println!("host: {:?}", b.host());
        for d in b.devices() {
            println!("{}", serde_json::to_string_pretty(d).unwrap());
        }
        b.set_slow_interval(Duration::from_millis(200));
        let first = b.poll().unwrap();
        assert_eq!(first.samples.len(), b.devices().len());
        assert!(
            first
                .samples
                .iter()
                .all(|s| s.time_ms == first.samples[0].time_ms)
        );
        let n = 50;
        let t = Instant::now();
        for _ in 0..n {
            b.poll().unwrap();
        }
        println!(
            "poll: {:?} per tick for {} device(s)",
            t.elapsed() / n,
            b.devices().len()
        );
        // Poll at 10 Hz for 3 s beside the slow reader (default cadence): does NVML make the
        // fast calls wait behind a 20 ms PCIe throughput read?
        b.set_slow_interval(DEFAULT_SLOW_INTERVAL);
        let mut times: Vec<Duration> = (0..30)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(100));
                let t = Instant::now();
                b.poll().unwrap();
                t.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "poll at 10 Hz: min {:?} median {:?} p90 {:?} max {:?}",
            times[0], times[15], times[27], times[29]
        );
        b.set_slow_interval(Duration::from_millis(200));
        // Per-call cost on device 0: what decides whether a field is fast or slow.
        let dev = b.nvml.device_by_index(0).unwrap();
        let ids = BatchField::ALL.map(|f| FieldId(f.id()));
        // Cold: NVML caches some answers for a few ms, so back-to-back loops understate what a
        // 10 Hz poll pays. Median of 5 calls, each 50 ms after the last.
        let time = |label: &str, f: &dyn Fn()| {
            let mut t: Vec<Duration> = (0..5)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(50));
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .collect();
            t.sort();
            println!("{label:>28}: {:?} cold", t[2]);
        };
        time("device_by_index", &|| drop(b.nvml.device_by_index(0)));
        time("utilization_rates", &|| drop(dev.utilization_rates()));
        time("memory_info", &|| drop(dev.memory_info()));
        time("power_usage", &|| drop(dev.power_usage()));
        time("enforced_power_limit", &|| drop(dev.enforced_power_limit()));
        time("temperature", &|| {
            drop(dev.temperature(TemperatureSensor::Gpu))
        });
        time("clock_info sm", &|| drop(dev.clock_info(Clock::SM)));
        time("clock_info mem", &|| drop(dev.clock_info(Clock::Memory)));
        time("performance_state", &|| drop(dev.performance_state()));
        time("throttle_reasons", &|| {
            drop(dev.current_throttle_reasons_strict())
        });
        time("pcie_link_gen", &|| drop(dev.current_pcie_link_gen()));
        time("pcie_link_width", &|| drop(dev.current_pcie_link_width()));
        time("fan_speed", &|| drop(dev.fan_speed(0)));
        time("encoder_utilization", &|| drop(dev.encoder_utilization()));
        time("decoder_utilization", &|| drop(dev.decoder_utilization()));
        time("field_values x12", &|| drop(dev.field_values_for(&ids)));
        for f in BatchField::ALL {
            time(f.name(), &|| drop(dev.field_values_for(&[FieldId(f.id())])));
        }
        time("[slow] total_energy", &|| {
            drop(dev.total_energy_consumption())
        });
        time("[slow] pcie_replay", &|| drop(dev.pcie_replay_counter()));
        time("[slow] pcie_throughput", &|| {
            drop(dev.pcie_throughput(PcieUtilCounter::Receive))
        });
        time("[slow] compute_processes", &|| {
            drop(dev.running_compute_processes())
        });
        time("[slow] process_utilization", &|| {
            drop(dev.process_utilization_stats(None))
        });
        std::thread::sleep(Duration::from_millis(500));
        let tick = b.poll().unwrap();
        for s in &tick.samples {
            println!("{}", serde_json::to_string_pretty(s).unwrap());
            assert!(
                s.processes.is_some() || s.why_absent("processes") != Some(&Absent::NotYetRead)
            );
            assert!(s.gpu_util_pct.is_some());
            assert!(s.mem_total_bytes.is_some());
        }
        assert!(tick.events.is_empty());
        drop(b);
    }

    #[test]
    fn container_pid_is_the_innermost_nspid() {
        let nested = "Name:\tpython3\nPid:\t48213\nNSpid:\t48213\t57\nUid:\t1000\t1000\n";
        assert_eq!(status_inner_pid(nested), Some(57));
        let doubly = "NSpid:\t900\t300\t7\n";
        assert_eq!(status_inner_pid(doubly), Some(7));
        let host = "Pid:\t1234\nNSpid:\t1234\n";
        assert_eq!(status_inner_pid(host), None);
        assert_eq!(status_inner_pid("Pid:\t1\n"), None);
    }
}
