//! The NVML backend: live telemetry from NVIDIA GPUs through `libnvidia-ml.so.1`.
//!
//! The library is loaded at run time (`nvml-wrapper` dlopens it), so the binary runs on hosts
//! without a driver and says why it cannot read anything. Opening happens in a helper thread
//! bounded by a deadline, because a wedged driver can hang `nvmlInit` forever.
//!
//! Three cadences:
//! - static attributes (`DeviceInfo`, `HostInfo`) are read once at open (here);
//! - fast fields (utilisation, memory, power, clocks, throttle reasons, ECC, ...) are read on
//!   every `poll()` (`fields`). Measured on an H200 (driver 580) at a 10 Hz cadence, each call
//!   costs about 10-15 µs (memory info ~70 µs; back-to-back loops show 0.2 µs because NVML
//!   caches answers for a few ms), and the ECC / retired-page / remapped-row /
//!   memory-temperature counters come from one batched `nvmlDeviceGetFieldValues` (~25 µs for
//!   all twelve), which also carries the clock-event (throttle) reason durations;
//! - slow fields are read by one background thread per device and `poll()` copies the latest
//!   reading, so a slow or hung device never stalls the sampler (`slow`, with the process list
//!   in `processes`). They are the calls measured too slow for every tick on that H200: PCIe
//!   throughput (~20 ms each, rx and tx), the energy counter (~4 ms), the process list with
//!   per-process utilisation (~2 ms), the PCIe replay counter (~150-400 µs) and the current link
//!   width (~120 µs; generation travels with it).
//!
//! XIDs come from an event thread (`xid`) that queues them for the next poll; the topology
//! (`topology`) is read once, on its own thread from the moment the backend opens. The state the
//! probes ask for (who else holds a GPU, ECC counters, clocks during a run) is read through
//! `gpu_state`.
//!
//! Every NVML failure becomes `None` plus an `Absent` reason under the field's name. A GPU that
//! falls off the bus yields one `DeviceLost` event and, from then on, samples of `GpuLost`
//! reasons without touching NVML for it again (calls on a lost GPU can block in the driver).
//!
//! The mapping from NVML's units and codes to the model lives in small pure functions, tested
//! beside them without a GPU.

mod fields;
mod gpm;
mod gpu_state;
mod process_list;
mod slow;
mod topology_reader;
mod xid;

pub use fields::{kb_per_s_to_bytes, mj_to_j, mw_to_w, pstate_index};
pub use gpu_state::NvmlGpuState;
pub use slow::{DEFAULT_SLOW_INTERVAL, MIN_SLOW_INTERVAL, SlowFields};
use topology_reader::read_topology;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureThreshold};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{Backend, BackendError, Pacing};
use crate::attribution::{AttributionOptions, Attributor, GpuKeys};
use fields::{FAST_FIELDS, read_fast};
use gpudiag_model::deadline::{DeadlineError, run_with_deadline};
use gpudiag_model::sample::{
    Absent, AbsentMap, ComputeCapability, DeviceInfo, Event, EventKind, HostInfo, PROFILING_FIELDS,
    Sample, now_ms,
};
use gpudiag_model::stats::{self, CallGroup, Counter};
use slow::{
    DeviceSlot, SLOW_FIELDS, SlowControl, SlowShared, read_slow, start_slow_reader, stuck_limit,
};
use xid::{EVENT_STUCK_AFTER, Heartbeat, start_event_thread, stuck_notice};

/// `NVML_DEVICE_MIG_ENABLE` from nvml.h (the sys crate that defines it is not re-exported).
const NVML_DEVICE_MIG_ENABLE: u32 = 1;

/// Live telemetry from every GPU NVML sees.
pub struct NvmlBackend {
    /// NCCL RAS queries, off the polling thread.
    ras: crate::ras::Asker,
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
    /// When the event thread last came back from NVML, to report it once when it stops.
    event_beat: Arc<Heartbeat>,
    events_stuck_reported: bool,
    topology: Mutex<TopologyRead>,
    /// Profiling counters, one per device, same order as `devices`.
    gpm: Vec<gpm::GpmDevice>,
    /// Each device's NVML handle once looked up, same order as `devices`.
    handles: Vec<Option<RawDevice>>,
    /// Whose each process is (Slurm job, pod), shared by the slow readers.
    attributor: Arc<Attributor>,
}

/// A device handle kept between polls: looking one up by index costs more driver time than
/// the whole fast poll it serves. NVML handles stay valid until `nvmlShutdown`; a GPU that
/// falls off the bus answers through its old handle with "GPU lost".
#[derive(Clone, Copy)]
pub(super) struct RawDevice(nvml_wrapper_sys::bindings::nvmlDevice_t);

// SAFETY: an NVML device handle is an opaque token with no thread affinity (nvml-wrapper marks
// `Device` Send and Sync); the backend hands it only to calls on the `Nvml` it came from.
unsafe impl Send for RawDevice {}

impl RawDevice {
    /// The handle of device `index`, looked up once into `cache`.
    pub(super) fn get<'n>(
        nvml: &'n Nvml,
        index: u32,
        cache: &mut Option<RawDevice>,
    ) -> Result<Device<'n>, NvmlError> {
        if let Some(raw) = *cache {
            // SAFETY: `raw` came from `device_by_index` on this same `nvml`, which is alive.
            return Ok(unsafe { Device::new(raw.0, nvml) });
        }
        let dev = nvml.device_by_index(index)?;
        // SAFETY: reading the raw handle of a live device.
        *cache = Some(RawDevice(unsafe { dev.handle() }));
        Ok(dev)
    }
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
        Self::open_with(
            init_deadline,
            SlowFields::Background,
            AttributionOptions::default(),
        )
    }

    /// `open`, choosing where the slow fields are read and where processes' owners are.
    pub fn open_with(
        init_deadline: Duration,
        slow_fields: SlowFields,
        attribution: AttributionOptions,
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
        let attributor = Arc::new(Attributor::new(attribution));
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
                    start_slow_reader(&nvml, GpuKeys::of(info), &attributor, &slot, &slow);
                }
                slot
            })
            .collect();
        let util_since = vec![None; opened.devices.len()];
        let events = Arc::new(Mutex::new(Vec::new()));
        let event_beat = Arc::new(Heartbeat::default());
        if slow_fields == SlowFields::Background {
            start_event_thread(&nvml, &opened.devices, &events, &slow, &event_beat);
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
        let gpm = opened
            .devices
            .iter()
            .map(|_| gpm::GpmDevice::new())
            .collect();
        let handles = vec![None; opened.devices.len()];
        Ok(NvmlBackend {
            ras: crate::ras::Asker::default(),
            gpm,
            handles,
            nvml,
            host: opened.host,
            devices: opened.devices,
            slots,
            slow,
            slow_fields,
            util_since,
            events,
            event_beat,
            events_stuck_reported: false,
            topology: Mutex::new(topology),
            attributor,
        })
    }

    /// The current slow-field cadence.
    pub fn slow_interval(&self) -> Duration {
        lock(&self.slow.control).interval
    }
}

/// One device's fast fields plus the latest slow reading, or the slow fields marked stuck when
/// their reader has not finished a round within `stuck_after`.
fn sample_device(
    nvml: &Nvml,
    info: &DeviceInfo,
    slot: &DeviceSlot,
    gpm: &mut gpm::GpmDevice,
    handle: &mut Option<RawDevice>,
    time_ms: u64,
    stuck_after: Duration,
) -> Sample {
    let mut sample = Sample::new(info.index, time_ms);
    if slot.lost.load(Ordering::Relaxed) {
        mark_absent(&mut sample.absent, FAST_FIELDS, &Absent::GpuLost);
        mark_absent(&mut sample.absent, SLOW_FIELDS, &Absent::GpuLost);
        mark_absent(&mut sample.absent, PROFILING_FIELDS, &Absent::GpuLost);
    } else {
        // One handle for the fast fields and the profiling counters: this runs every tick.
        let fast_timer = stats::GroupTimer::start(CallGroup::FastFields);
        match stats::call(
            Counter::NvmlFastCalls,
            RawDevice::get(nvml, info.index, handle),
        ) {
            Ok(dev) => {
                read_fast(&dev, &mut sample);
                drop(fast_timer);
                gpm.read(nvml, &dev, info.mig_enabled == Some(true), &mut sample);
            }
            Err(e) => {
                let why = absent_from(&e);
                mark_absent(&mut sample.absent, FAST_FIELDS, &why);
                mark_absent(&mut sample.absent, PROFILING_FIELDS, &why);
            }
        }
        slot.gpm_pcie
            .store(sample.prof_pcie_rx_bytes_per_s.is_some(), Ordering::Relaxed);
        slot.apply(&mut sample, Instant::now(), stuck_after);
    }
    sample.copy_static_from(info);
    sample
}

impl Drop for NvmlBackend {
    /// Tells the background threads to stop and waits a bounded while for them. Not joining
    /// at all let the process exit while a thread was inside an NVML call, and after a CUDA
    /// context had existed (the probes) the libraries' exit handlers then crashed under it;
    /// waiting without a bound would hang on a sick driver that holds a call for seconds. Each
    /// thread holds its own `Arc<Nvml>`, so the count tells when they are all gone.
    fn drop(&mut self) {
        for g in &mut self.gpm {
            g.release(&self.nvml);
        }
        lock(&self.slow.control).stop = true;
        self.slow.wake.notify_all();
        gpudiag_model::deadline::wait_until(Duration::from_secs(1), || {
            Arc::strong_count(&self.nvml) <= 1
        });
    }
}

impl Backend for NvmlBackend {
    fn request_ras(&mut self, query: crate::ras::RasQuery) {
        self.ras.request(query);
    }

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
            for (((info, slot), since), handle) in self
                .devices
                .iter()
                .zip(&self.slots)
                .zip(&mut self.util_since)
                .zip(&mut self.handles)
            {
                if !slot.lost.load(Ordering::Relaxed) {
                    let gpu = GpuKeys::of(info);
                    read_slow(&self.nvml, &gpu, &self.attributor, since, handle, slot);
                    slot.finish_round();
                }
            }
        }
        if self.slow_fields == SlowFields::Background {
            let stuck = self.event_beat.stuck_for(Instant::now(), EVENT_STUCK_AFTER);
            if let Some(message) = stuck_notice(stuck, &mut self.events_stuck_reported) {
                tick.events.push(Event {
                    time_ms,
                    device: None,
                    kind: EventKind::Notice { message },
                });
            }
        }
        let stuck_after = stuck_limit(self.slow_interval());
        for (((info, slot), gpm), handle) in self
            .devices
            .iter()
            .zip(&self.slots)
            .zip(&mut self.gpm)
            .zip(&mut self.handles)
        {
            let was_lost = slot.lost.load(Ordering::Relaxed);
            let sample = sample_device(&self.nvml, info, slot, gpm, handle, time_ms, stuck_after);
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
        tick.ras = self.ras.ready();
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

// ---------------------------------------------------------------------------------------------
// From an NVML answer to a value or the reason it is absent

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

// ---------------------------------------------------------------------------------------------
// Small helpers the submodules share

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
    use crate::nvml::fields::{BatchField, fan_absent};
    use crate::nvml::process_list::{basename, used_memory};
    use nvml_wrapper::enum_wrappers::device::{
        PcieUtilCounter, PerformanceState, TemperatureSensor,
    };
    use nvml_wrapper::enums::device::UsedGpuMemory;
    use nvml_wrapper::structs::device::FieldId;

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
}
