//! The amdgpu sysfs backend: live telemetry from AMD GPUs through the files the amdgpu kernel
//! driver exposes, for hosts without ROCm.
//!
//! Every path is read under an injectable root directory (default `/`), so tests run on fake
//! trees in `tests/fixtures/sysfs/`. What is read, per GPU (`<root>/sys/class/drm/cardN/device/`
//! whose vendor is 0x1002 and whose driver is amdgpu):
//! - `gpu_busy_percent`, `mem_busy_percent`, `mem_info_vram_used` / `_total`;
//! - `pp_dpm_sclk` / `pp_dpm_mclk`: the clock table with the current level marked `*`, and an
//!   `S:` line for the deep-sleep clock on newer parts;
//! - `pcie_replay_count` and the PCIe link. Radeon boards put a PCIe switch of AMD's own between
//!   the slot and the GPU, whose internal link always reads full speed, so the link is read on
//!   the topmost AMD bridge above the GPU (the one facing the slot) and its maximum capped by the
//!   port above that (the slot);
//! - `hwmon/hwmonN/`: temperatures by label (edge, junction, mem) with `_crit` / `_emergency`
//!   limits, `power1_average` or `power1_input`, `power1_cap`, `energy1_input`, `pwm1`;
//! - `ras/umc_err_count` and `ras/gpu_vram_bad_pages` (memory RAS), when RAS is on;
//! - `unique_id`, `product_name`, `serial_number`, `vbios_version`, `device`.
//!
//! Per-process VRAM comes from `<root>/proc/<pid>/fdinfo/<fd>` of DRM file descriptors
//! (`drm-pdev`, `drm-client-id`, `drm-memory-vram`), as nvtop reads it; one client shared by
//! several descriptors counts once. That scan visits every process, so it runs on the slow
//! cadence, not every tick.
//!
//! A file that is missing is `None` with a reason (`not_supported`: the driver or the part does
//! not offer it; `no_permission`), never 0. The parsing of each file is a small pure function
//! tested below.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::amd;
use crate::attribution::{AttributionOptions, Attributor, GpuKeys, GpuPods, gpu_pods_field};
use crate::{Backend, BackendError, Pacing, Tick};
use gpudiag_model::attribution::PodAllocation;
use gpudiag_model::metric_table::Vendor;
use gpudiag_model::sample::unavailable_on;
use gpudiag_model::sample::{
    Absent, AbsentMap, DeviceInfo, Event, EventKind, HostInfo, ProcessSample, Sample, now_ms,
};

/// The root the backend reads under unless told otherwise.
pub const DEFAULT_ROOT: &str = "/";

/// Environment variable naming another root (tests, or a host's /sys mounted elsewhere).
pub const SYSFS_ROOT_ENV: &str = "GPUDIAG_SYSFS_ROOT";

/// How often the process scan runs unless `set_slow_interval` says otherwise.
pub const DEFAULT_SLOW_INTERVAL: Duration = Duration::from_secs(1);

/// Full scale of hwmon's `pwm1` (the hwmon ABI fixes it at 255).
const PWM_MAX: f64 = 255.0;

/// Live telemetry from every amdgpu GPU under a root directory.
#[derive(Debug)]
pub struct SysfsBackend {
    host: HostInfo,
    devices: Vec<DeviceInfo>,
    /// One per device, same order as `devices`.
    cards: Vec<Card>,
    /// Per device: lost at the last poll (the event is sent once per loss).
    lost: Vec<bool>,
    processes: ProcessCache,
}

/// Where one GPU's files are.
#[derive(Debug, Clone)]
struct Card {
    /// The GPU's PCI device directory (canonical, so parents are the PCI hierarchy).
    dev: PathBuf,
    bus_id: String,
    hwmon: Option<PathBuf>,
    sensors: Sensors,
    /// The directory whose `current_link_*` describe the link to the slot.
    link: PathBuf,
    /// The port above `link` (the slot side), whose `max_link_*` cap the link's maximum.
    slot: Option<PathBuf>,
}

/// hwmon temperature channel numbers (the N of `tempN_input`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sensors {
    pub edge: Option<u32>,
    pub junction: Option<u32>,
    pub mem: Option<u32>,
}

impl Sensors {
    /// The sensor reported as the GPU temperature: the junction (hotspot), which is what the
    /// firmware throttles on and the only die sensor MI300 parts have; else the edge.
    pub fn gpu(&self) -> Option<u32> {
        self.junction.or(self.edge)
    }
}

impl SysfsBackend {
    /// Finds every amdgpu GPU under `root`; `NoDevice` when there is none.
    pub fn open(root: &Path) -> Result<SysfsBackend, BackendError> {
        Self::open_with(
            root,
            AttributionOptions {
                root: root.to_path_buf(),
                ..AttributionOptions::default()
            },
        )
    }

    /// `open`, saying where processes' owners are read (`attribution.root` is normally `root`).
    pub fn open_with(
        root: &Path,
        attribution: AttributionOptions,
    ) -> Result<SysfsBackend, BackendError> {
        let cards = find_cards(root).map_err(BackendError::NoDevice)?;
        if cards.is_empty() {
            return Err(BackendError::NoDevice(format!(
                "no amdgpu device under {}",
                root.join("sys/class/drm").display()
            )));
        }
        let devices = cards
            .iter()
            .enumerate()
            .map(|(i, c)| read_device_info(c, i as u32))
            .collect();
        Ok(SysfsBackend {
            host: read_host_info(root),
            devices,
            lost: vec![false; cards.len()],
            cards,
            processes: ProcessCache::new(attribution),
        })
    }
}

/// The latest `/proc` scan for amdgpu clients, redone when older than the slow interval. The
/// ROCm SMI backend uses it too: ROCm SMI's process list has no per-device VRAM.
#[derive(Debug)]
pub(crate) struct ProcessCache {
    attributor: Attributor,
    interval: Duration,
    last: Option<(Instant, Result<ProcessMap, Absent>)>,
    /// The pods holding each GPU (by bus id), asked with the same scan.
    pods: BTreeMap<String, GpuPods>,
}

impl ProcessCache {
    pub(crate) fn new(attribution: AttributionOptions) -> Self {
        ProcessCache {
            attributor: Attributor::new(attribution),
            interval: DEFAULT_SLOW_INTERVAL,
            last: None,
            pods: BTreeMap::new(),
        }
    }

    pub(crate) fn set_interval(&mut self, interval: Duration) {
        self.interval = interval;
    }

    /// The processes on each of `gpus`, keyed by bus id (GPUs without one are left out).
    pub(crate) fn get(&mut self, gpus: &[GpuKeys]) -> Result<ProcessMap, Absent> {
        let stale = self
            .last
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= self.interval);
        if stale {
            self.pods = gpus
                .iter()
                .filter_map(|g| Some((g.pci_bus_id.clone()?, self.attributor.gpu_pods(g))))
                .collect();
            let scanned = scan_processes(&self.attributor, &self.pods);
            self.last = Some((Instant::now(), scanned));
        }
        self.last
            .as_ref()
            .map(|(_, p)| p.clone())
            .unwrap_or(Err(Absent::NotYetRead))
    }

    /// The pods holding the GPU at `bus`, as of the last `get`.
    pub(crate) fn pods_of(&self, bus: &str) -> Result<Vec<PodAllocation>, Absent> {
        match self.pods.get(bus) {
            Some(pods) => gpu_pods_field(pods),
            None => Err(Absent::NotYetRead),
        }
    }

    /// The processes of one GPU from a `get` answer: none listed means none running.
    pub(crate) fn of(
        map: &Result<ProcessMap, Absent>,
        bus: &str,
    ) -> Result<Vec<ProcessSample>, Absent> {
        map.as_ref()
            .map(|m| m.get(bus).cloned().unwrap_or_default())
            .map_err(Clone::clone)
    }
}

/// Processes by the PCI bus id of the GPU they use.
pub(crate) type ProcessMap = BTreeMap<String, Vec<ProcessSample>>;

impl Backend for SysfsBackend {
    fn name(&self) -> &'static str {
        "sysfs"
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

    fn poll(&mut self) -> Result<Tick, BackendError> {
        let time_ms = now_ms();
        let gpus: Vec<GpuKeys> = self.devices.iter().map(GpuKeys::of).collect();
        let procs = self.processes.get(&gpus);
        let mut tick = Tick::default();
        for ((card, info), lost) in self.cards.iter().zip(&self.devices).zip(&mut self.lost) {
            let mut s = read_sample(card, info, time_ms);
            s.processes = take(
                ProcessCache::of(&procs, &card.bus_id),
                "processes",
                &mut s.absent,
            );
            s.gpu_pods = take(
                self.processes.pods_of(&card.bus_id),
                "gpu_pods",
                &mut s.absent,
            );
            // The PCI directory vanished (hot removal, fell off the bus) or the driver answers
            // ENODEV: every value is lost, said once as an event.
            let gone = !card.dev.join("vendor").exists()
                || s.absent.values().any(|a| *a == Absent::GpuLost);
            if gone {
                for why in s.absent.values_mut() {
                    *why = Absent::GpuLost;
                }
                if !*lost {
                    tick.events.push(Event {
                        time_ms,
                        device: Some(info.index),
                        kind: EventKind::DeviceLost {
                            reason: format!(
                                "GPU {} ({}) disappeared from sysfs or stopped answering; it \
                                 needs a reset or a reboot",
                                info.index, card.bus_id
                            ),
                        },
                    });
                }
            }
            *lost = gone;
            tick.samples.push(s);
        }
        Ok(tick)
    }

    fn set_slow_interval(&mut self, interval: Duration) {
        self.processes.set_interval(interval);
    }
}

// ---------------------------------------------------------------------------------------------
// Finding the GPUs

/// The amdgpu cards under `root`, ordered by card number. `Err` only when the DRM class
/// directory cannot be listed (no DRM at all: no GPU driver loaded).
fn find_cards(root: &Path) -> Result<Vec<Card>, String> {
    let drm = root.join("sys/class/drm");
    let entries = std::fs::read_dir(&drm).map_err(|e| match e.kind() {
        ErrorKind::NotFound => format!("no {}: no GPU driver is loaded", drm.display()),
        _ => format!("cannot list {}: {e}", drm.display()),
    })?;
    let mut numbered: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            // cardN only: cardN-DP-1 are connectors, renderDN the same GPUs again.
            let n = name.strip_prefix("card")?.parse::<u32>().ok()?;
            Some((n, e.path().join("device")))
        })
        .collect();
    numbered.sort();
    Ok(numbered
        .into_iter()
        .filter_map(|(_, dev)| {
            let dev = std::fs::canonicalize(&dev).ok()?;
            is_amdgpu(&dev).then(|| card_at(dev))
        })
        .collect())
}

/// True when `root` has at least one amdgpu GPU (a few small file reads per DRM card).
pub fn has_amdgpu(root: &Path) -> bool {
    find_cards(root).is_ok_and(|cards| !cards.is_empty())
}

/// True when `dev` is an AMD GPU bound to the amdgpu driver.
fn is_amdgpu(dev: &Path) -> bool {
    let vendor = read_text(dev, "vendor")
        .ok()
        .and_then(|v| amd::parse_pci_id(&v));
    let driver = std::fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|l| l.file_name().map(|f| f == "amdgpu"));
    vendor == Some(amd::PCI_VENDOR_ID) && driver == Some(true)
}

fn card_at(dev: PathBuf) -> Card {
    let bus_id = dev
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let hwmon = first_hwmon(&dev);
    let sensors = hwmon.as_deref().map(find_sensors).unwrap_or_default();
    let link = slot_link_dir(&dev);
    let slot = link
        .parent()
        .filter(|p| p.join("max_link_speed").is_file())
        .map(Path::to_path_buf);
    Card {
        dev,
        bus_id,
        hwmon,
        sensors,
        link,
        slot,
    }
}

/// The GPU's hwmon directory (`device/hwmon/hwmonN`); amdgpu registers one per GPU.
fn first_hwmon(dev: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dev.join("hwmon"))
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("hwmon"))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().next()
}

/// Temperature channels by their labels. Without labels (old kernels) channel 1 is the edge,
/// the only one those kernels had.
fn find_sensors(hwmon: &Path) -> Sensors {
    let mut found = Sensors::default();
    let mut any_label = false;
    for n in 1..=8 {
        let Ok(label) = read_text(hwmon, &format!("temp{n}_label")) else {
            continue;
        };
        any_label = true;
        match label.as_str() {
            "edge" => found.edge = Some(n),
            "junction" => found.junction = Some(n),
            "mem" => found.mem = Some(n),
            _ => {}
        }
    }
    if !any_label && hwmon.join("temp1_input").is_file() {
        found.edge = Some(1);
    }
    found
}

/// The directory whose link faces the slot: walks up from the GPU through the bridges of AMD's
/// own on-board switch (vendor 0x1002, class 0x0604), stopping below the first port that is
/// not AMD graphics (the slot's root or switch port).
fn slot_link_dir(dev: &Path) -> PathBuf {
    let mut link = dev.to_path_buf();
    while let Some(parent) = link.parent().filter(|p| is_amd_bridge(p)) {
        link = parent.to_path_buf();
    }
    link
}

fn is_amd_bridge(dir: &Path) -> bool {
    let vendor = read_text(dir, "vendor")
        .ok()
        .and_then(|v| amd::parse_pci_id(&v));
    let class = read_text(dir, "class").unwrap_or_default();
    vendor == Some(amd::PCI_VENDOR_ID) && class.starts_with("0x0604")
}

// ---------------------------------------------------------------------------------------------
// Static attributes

/// `DeviceInfo` fields no sysfs file gives: NVIDIA concepts or values amdgpu does not expose.
const UNAVAILABLE_INFO: &[&str] = &[
    "compute_capability",
    "temp_gpu_max_c",
    "persistence_mode",
    "mig_enabled",
];

fn read_device_info(card: &Card, index: u32) -> DeviceInfo {
    let dev = &card.dev;
    let mut info = DeviceInfo {
        index,
        vendor: Some(amd::VENDOR.into()),
        pci_bus_id: Some(card.bus_id.clone()),
        ..DeviceInfo::default()
    };
    let ab = &mut info.absent;
    let device_id = read_text(dev, "device")
        .ok()
        .and_then(|d| amd::parse_pci_id(&d));
    info.uuid = take(
        non_empty_text(dev, "unique_id").map(|t| unique_id(&t)),
        "uuid",
        ab,
    );
    info.name = take(
        non_empty_text(dev, "product_name").or_else(|why| {
            device_id
                .and_then(amd::product_name)
                .map(str::to_owned)
                .ok_or(why)
        }),
        "name",
        ab,
    );
    info.architecture = take(
        device_id
            .and_then(amd::architecture)
            .map(str::to_owned)
            .ok_or(Absent::NotSupported),
        "architecture",
        ab,
    );
    info.serial = take(non_empty_text(dev, "serial_number"), "serial", ab);
    info.vbios_version = take(non_empty_text(dev, "vbios_version"), "vbios_version", ab);
    info.memory_total_bytes = take(
        read_u64(dev, "mem_info_vram_total"),
        "memory_total_bytes",
        ab,
    );

    let hw = card.hwmon.as_deref();
    let watts = |name: &str| need(hw).and_then(|h| read_u64(h, name)).map(micro_to_unit);
    info.power_limit_default_w = take(watts("power1_cap_default"), "power_limit_default_w", ab);
    info.power_limit_min_w = take(watts("power1_cap_min"), "power_limit_min_w", ab);
    info.power_limit_max_w = take(watts("power1_cap_max"), "power_limit_max_w", ab);

    let max_clock = |file: &str| {
        read_text(dev, file)
            .and_then(|t| parse_dpm(&t).map_err(Absent::Error))
            .and_then(|t| t.max_mhz().ok_or(Absent::NotSupported))
    };
    info.sm_clock_max_mhz = take(max_clock("pp_dpm_sclk"), "sm_clock_max_mhz", ab);
    info.mem_clock_max_mhz = take(max_clock("pp_dpm_mclk"), "mem_clock_max_mhz", ab);

    let (gen_max, width_max) = max_link(card);
    info.pcie_gen_max = take(gen_max, "pcie_gen_max", ab);
    info.pcie_width_max = take(width_max, "pcie_width_max", ab);

    let limit = |channel: Option<u32>, suffix: &str| {
        let n = channel.ok_or(Absent::NotSupported)?;
        need(hw)
            .and_then(|h| read_i64(h, &format!("temp{n}_{suffix}")))
            .map(milli_to_unit)
    };
    let gpu = card.sensors.gpu();
    info.temp_slowdown_c = take(limit(gpu, "crit"), "temp_slowdown_c", ab);
    info.temp_shutdown_c = take(limit(gpu, "emergency"), "temp_shutdown_c", ab);
    info.temp_mem_max_c = take(limit(card.sensors.mem, "crit"), "temp_mem_max_c", ab);

    // amdgpu creates ras/<block>_err_count only for blocks with RAS (ECC) enabled; consumer
    // cards have no ras directory at all.
    info.ecc_enabled = take(
        if dev.join("ras").is_dir() {
            Ok(dev.join("ras/umc_err_count").is_file())
        } else {
            Err(Absent::NotSupported)
        },
        "ecc_enabled",
        ab,
    );
    for f in UNAVAILABLE_INFO {
        ab.insert((*f).into(), Absent::Unavailable);
    }
    info
}

/// The slot link of the GPU at PCI address `bus_id` under `root`, for the ROCm SMI backend: ROCm
/// SMI reports the GPU's DPM link table, which behind AMD's on-board switch is the internal link.
#[derive(Debug, Clone)]
pub(crate) struct SlotLink(Card);

impl SlotLink {
    pub(crate) fn find(root: &Path, bus_id: &str) -> Option<SlotLink> {
        let dev = std::fs::canonicalize(root.join("sys/bus/pci/devices").join(bus_id)).ok()?;
        Some(SlotLink(card_at(dev)))
    }

    /// (generation, width) now.
    pub(crate) fn current(&self) -> (Result<u32, Absent>, Result<u32, Absent>) {
        current_link(&self.0)
    }

    /// (generation, width) at best.
    pub(crate) fn max(&self) -> (Result<u32, Absent>, Result<u32, Absent>) {
        max_link(&self.0)
    }
}

/// The link's current generation and width, read where it faces the slot.
fn current_link(card: &Card) -> (Result<u32, Absent>, Result<u32, Absent>) {
    (
        read_text(&card.link, "current_link_speed").and_then(|t| parse_link_speed(&t)),
        read_text(&card.link, "current_link_width").and_then(|t| parse_link_width(&t)),
    )
}

/// The link's maximum: the lower of what the GPU side and the slot side can do.
fn max_link(card: &Card) -> (Result<u32, Absent>, Result<u32, Absent>) {
    let cap = |dir: &Path| {
        (
            read_text(dir, "max_link_speed").and_then(|t| parse_link_speed(&t)),
            read_text(dir, "max_link_width").and_then(|t| parse_link_width(&t)),
        )
    };
    let (gen_max, width_max) = cap(&card.link);
    match card.slot.as_deref().map(cap) {
        Some((slot_gen, slot_width)) => (
            min_known(gen_max, slot_gen),
            min_known(width_max, slot_width),
        ),
        None => (gen_max, width_max),
    }
}

/// The smaller of two values; one unreadable side leaves the other.
fn min_known(a: Result<u32, Absent>, b: Result<u32, Absent>) -> Result<u32, Absent> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a.min(b)),
        (Ok(v), Err(_)) | (Err(_), Ok(v)) => Ok(v),
        (Err(e), Err(_)) => Err(e),
    }
}

fn read_host_info(root: &Path) -> HostInfo {
    // An in-tree amdgpu has no module version: its version is the kernel's.
    let driver_version = non_empty_text(&root.join("sys/module/amdgpu"), "version")
        .or_else(|_| non_empty_text(&root.join("proc/sys/kernel"), "osrelease"))
        .ok();
    HostInfo {
        hostname: gethostname::gethostname().into_string().ok(),
        driver_version,
        cuda_driver_version: None,
        nvml_version: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Samples

fn read_sample(card: &Card, info: &DeviceInfo, time_ms: u64) -> Sample {
    let dev = &card.dev;
    let mut s = Sample::new(info.index, time_ms);
    let mut ab = AbsentMap::new();
    let a = &mut ab;

    let pct = |name: &str| read_u64(dev, name).map(|v| v as f64);
    s.gpu_util_pct = take(pct("gpu_busy_percent"), "gpu_util_pct", a);
    s.mem_util_pct = take(pct("mem_busy_percent"), "mem_util_pct", a);
    let used = read_u64(dev, "mem_info_vram_used");
    let total = read_u64(dev, "mem_info_vram_total");
    s.mem_free_bytes = take(
        match (&used, &total) {
            (Ok(u), Ok(t)) => Ok(t.saturating_sub(*u)),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        },
        "mem_free_bytes",
        a,
    );
    s.mem_used_bytes = take(used, "mem_used_bytes", a);
    s.mem_total_bytes = take(total, "mem_total_bytes", a);

    let hw = card.hwmon.as_deref();
    // power1_average on most parts; newer kernels give MI300 and RDNA3 power1_input instead.
    s.power_w = take(
        need(hw)
            .and_then(|h| read_u64(h, "power1_average").or_else(|_| read_u64(h, "power1_input")))
            .map(micro_to_unit),
        "power_w",
        a,
    );
    s.power_limit_w = take(
        need(hw)
            .and_then(|h| read_u64(h, "power1_cap"))
            .map(micro_to_unit),
        "power_limit_w",
        a,
    );
    s.energy_j = take(
        need(hw)
            .and_then(|h| read_u64(h, "energy1_input"))
            .map(micro_to_unit),
        "energy_j",
        a,
    );
    let temp = |channel: Option<u32>| {
        let n = channel.ok_or(Absent::NotSupported)?;
        need(hw)
            .and_then(|h| read_i64(h, &format!("temp{n}_input")))
            .map(milli_to_unit)
    };
    s.temp_gpu_c = take(temp(card.sensors.gpu()), "temp_gpu_c", a);
    s.temp_mem_c = take(temp(card.sensors.mem), "temp_mem_c", a);
    s.fan_pct = take(
        need(hw).and_then(|h| read_u64(h, "pwm1")).map(pwm_to_pct),
        "fan_pct",
        a,
    );

    let clock = |file: &str| {
        read_text(dev, file)
            .and_then(|t| parse_dpm(&t).map_err(Absent::Error))
            .and_then(|t| {
                t.current()
                    .map(|l| l.mhz)
                    .ok_or_else(|| Absent::Error(format!("{file} marks no current level")))
            })
    };
    s.sm_clock_mhz = take(clock("pp_dpm_sclk"), "sm_clock_mhz", a);
    s.mem_clock_mhz = take(clock("pp_dpm_mclk"), "mem_clock_mhz", a);

    let (generation, width) = current_link(card);
    s.pcie_gen = take(generation, "pcie_gen", a);
    s.pcie_width = take(width, "pcie_width", a);
    s.pcie_replay_count = take(read_u64(dev, "pcie_replay_count"), "pcie_replay_count", a);

    let ras = read_text(dev, "ras/umc_err_count").and_then(|t| {
        parse_ras_count(&t).ok_or_else(|| Absent::Error(format!("unexpected umc_err_count {t:?}")))
    });
    s.ecc_corrected_volatile = take(
        ras.clone().map(|c| c.corrected),
        "ecc_corrected_volatile",
        a,
    );
    s.ecc_uncorrected_volatile = take(ras.map(|c| c.uncorrected), "ecc_uncorrected_volatile", a);
    s.retired_pages_pending = take(
        read_text(dev, "ras/gpu_vram_bad_pages").map(|t| bad_pages_pending(&t)),
        "retired_pages_pending",
        a,
    );
    super::engine_activity(&mut s, a);
    for f in unavailable_on(Vendor::Amd) {
        a.insert(f.into(), Absent::Unavailable);
    }

    s.absent = ab;
    // Static values travel in every sample, as on NVML, so each sample stands alone.
    s.copy_static_from(info);
    s
}

/// The hwmon directory, or why hwmon values are absent (no hwmon: the driver registered none).
fn need(hwmon: Option<&Path>) -> Result<&Path, Absent> {
    hwmon.ok_or(Absent::NotSupported)
}

// ---------------------------------------------------------------------------------------------
// Processes

/// One DRM client's fdinfo, as far as gpudiag uses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FdInfo {
    pub driver: Option<String>,
    /// PCI address of the GPU ("0000:03:00.0").
    pub pdev: Option<String>,
    /// Unique per open of the device; dup'ed descriptors share it.
    pub client_id: Option<u64>,
    pub vram_bytes: Option<u64>,
    /// The client has a compute engine counter (`drm-engine-compute`).
    pub compute: bool,
    /// The client has a graphics engine counter (`drm-engine-gfx`).
    pub graphics: bool,
}

/// Parses `/proc/<pid>/fdinfo/<fd>` of a DRM descriptor. `None` when it is not one (no
/// `drm-driver` key, and not the older amdgpu-only format).
pub fn parse_fdinfo(text: &str) -> Option<FdInfo> {
    let mut info = FdInfo::default();
    let mut drm = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "drm-driver" => {
                drm = true;
                info.driver = Some(value.to_owned());
            }
            "drm-pdev" | "pdev" => info.pdev = Some(value.to_owned()),
            "drm-client-id" => info.client_id = value.parse().ok(),
            "drm-memory-vram" => info.vram_bytes = parse_size(value),
            // Kernels before 5.19 wrote amdgpu's own keys: "vram mem: 1024 kB".
            "vram mem" => {
                drm = true;
                info.driver.get_or_insert_with(|| "amdgpu".into());
                info.vram_bytes = parse_size(value);
            }
            "drm-engine-compute" => info.compute = true,
            "drm-engine-gfx" => info.graphics = true,
            _ => {}
        }
    }
    drm.then_some(info)
}

/// "1024 KiB", "3 MiB", "512" (bytes), "1024 kB" as bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let mut parts = text.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next() {
        None => 1,
        Some("KiB" | "kB" | "KB") => 1 << 10,
        Some("MiB" | "MB") => 1 << 20,
        Some("GiB" | "GB") => 1 << 30,
        Some(_) => return None,
    };
    n.checked_mul(unit)
}

/// Scans `/proc` (under the attributor's root) for amdgpu clients of the GPUs `pods` is keyed
/// by (their bus ids); per bus id, one entry per process with its VRAM summed over its distinct
/// clients and its owners.
fn scan_processes(
    attributor: &Attributor,
    pods: &BTreeMap<String, GpuPods>,
) -> Result<ProcessMap, Absent> {
    let proc_dir = attributor.root().join("proc");
    let passwd = attributor.passwd();
    let buses: Vec<&str> = pods.keys().map(String::as_str).collect();
    let mut out = ProcessMap::new();
    let entries = std::fs::read_dir(&proc_dir)
        .map_err(|e| Absent::Error(format!("cannot list {}: {e}", proc_dir.display())))?;
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let unasked: GpuPods = Err("the kubelet was not asked about this GPU".into());
    for pid in pids {
        let pdir = proc_dir.join(pid.to_string());
        for (bus, usage) in process_usage(&pdir, &buses) {
            let mut sample = attributor.process(pid, &passwd, pods.get(&bus).unwrap_or(&unasked));
            sample.kind = usage.kind.map(str::to_owned);
            sample.used_memory_bytes = usage.vram_bytes;
            out.entry(bus).or_default().push(sample);
        }
    }
    Ok(out)
}

/// What one process holds on one GPU.
#[derive(Debug, Default)]
struct Usage {
    vram_bytes: Option<u64>,
    kind: Option<&'static str>,
}

/// One process's amdgpu clients by GPU. Only descriptors that point at /dev/dri are read, so
/// sockets and files cost a readlink each, not a read. Processes of other users are unreadable
/// without privileges and are skipped.
///
/// A process with /dev/kfd open is a ROCm (HIP, OpenCL) compute process: its queues run in user
/// mode, so its fdinfo may show no compute engine time even while it computes.
fn process_usage(pdir: &Path, buses: &[&str]) -> BTreeMap<String, Usage> {
    let mut clients: BTreeMap<(String, Option<u64>), FdInfo> = BTreeMap::new();
    let Ok(fds) = std::fs::read_dir(pdir.join("fd")) else {
        return BTreeMap::new();
    };
    let mut kfd = false;
    for fd in fds.filter_map(Result::ok) {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        if target == Path::new("/dev/kfd") {
            kfd = true;
        }
        if !target.starts_with("/dev/dri") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(pdir.join("fdinfo").join(fd.file_name())) else {
            continue;
        };
        let Some(info) = parse_fdinfo(&text) else {
            continue;
        };
        let Some(pdev) = info.pdev.clone() else {
            continue;
        };
        if info.driver.as_deref() != Some("amdgpu") || !buses.contains(&pdev.as_str()) {
            continue;
        }
        // Without a client id (old kernels) each descriptor is its own client.
        let key = (pdev, info.client_id);
        clients.entry(key).or_insert(info);
    }
    let mut out: BTreeMap<String, Usage> = BTreeMap::new();
    for ((bus, _), info) in clients {
        let u = out.entry(bus).or_default();
        if let Some(v) = info.vram_bytes {
            u.vram_bytes = Some(u.vram_bytes.unwrap_or(0) + v);
        }
        if info.compute || kfd {
            u.kind = Some("compute");
        } else if info.graphics && u.kind.is_none() {
            u.kind = Some("graphics");
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Pure parsing functions

/// One line of a `pp_dpm_*` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpmLevel {
    /// The level number; `None` for the deep-sleep line (`S:`).
    pub level: Option<u32>,
    pub mhz: u32,
    /// Marked `*`: the level the GPU runs at now.
    pub current: bool,
}

/// A parsed `pp_dpm_sclk` / `pp_dpm_mclk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpmTable {
    pub levels: Vec<DpmLevel>,
}

impl DpmTable {
    /// The level marked current (the deep-sleep line when the GPU sleeps).
    pub fn current(&self) -> Option<&DpmLevel> {
        self.levels.iter().find(|l| l.current)
    }

    /// The highest numbered level (deep sleep is never the maximum).
    pub fn max_mhz(&self) -> Option<u32> {
        self.levels
            .iter()
            .filter(|l| l.level.is_some())
            .map(|l| l.mhz)
            .max()
    }
}

/// Parses a `pp_dpm_*` clock table: lines like `1: 1700Mhz *` or `S: 19Mhz *`.
pub fn parse_dpm(text: &str) -> Result<DpmTable, String> {
    let levels = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let bad = || format!("unexpected clock table line {line:?}");
            let (label, rest) = line.split_once(':').ok_or_else(bad)?;
            let level = match label.trim() {
                "S" => None,
                n => Some(n.parse::<u32>().map_err(|_| bad())?),
            };
            let rest = rest.trim();
            let current = rest.ends_with('*');
            let value = rest.trim_end_matches('*').trim();
            let digits = value
                .strip_suffix("Mhz")
                .or_else(|| value.strip_suffix("MHz"))
                .ok_or_else(bad)?;
            let mhz = digits.trim().parse::<u32>().map_err(|_| bad())?;
            Ok(DpmLevel {
                level,
                mhz,
                current,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if levels.is_empty() {
        return Err("empty clock table".into());
    }
    Ok(DpmTable { levels })
}

/// The PCIe generation of a link speed as sysfs writes it ("16.0 GT/s PCIe", older kernels
/// "8 GT/s"). "Unknown" (link down, or a speed this kernel does not name) is an error.
pub fn parse_link_speed(text: &str) -> Result<u32, Absent> {
    let bad = || Absent::Error(format!("unexpected link speed {text:?}"));
    let rate = text
        .split_whitespace()
        .next()
        .and_then(|r| r.parse::<f64>().ok())
        .filter(|r| r.is_finite())
        .ok_or_else(bad)?;
    match (rate * 10.0).round() as u32 {
        25 => Ok(1),
        50 => Ok(2),
        80 => Ok(3),
        160 => Ok(4),
        320 => Ok(5),
        640 => Ok(6),
        _ => Err(bad()),
    }
}

/// A link width ("16"). Width 0 means the link is down, which is not a width.
pub fn parse_link_width(text: &str) -> Result<u32, Absent> {
    match text.trim().parse::<u32>() {
        Ok(w) if w > 0 => Ok(w),
        _ => Err(Absent::Error(format!("unexpected link width {text:?}"))),
    }
}

/// RAS error counts of one block (`ras/umc_err_count`: "ue: 0\nce: 3").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RasCount {
    pub uncorrected: u64,
    pub corrected: u64,
}

pub fn parse_ras_count(text: &str) -> Option<RasCount> {
    let mut ue = None;
    let mut ce = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim().parse::<u64>().ok();
        match k.trim() {
            "ue" => ue = v,
            "ce" => ce = v,
            _ => {}
        }
    }
    Some(RasCount {
        uncorrected: ue?,
        corrected: ce?,
    })
}

/// Whether `ras/gpu_vram_bad_pages` lists a page pending retirement ("0x... : 0x... : P"):
/// the driver retires it at the next reset.
pub fn bad_pages_pending(text: &str) -> bool {
    text.lines()
        .filter_map(|l| l.rsplit(':').next())
        .any(|flag| flag.trim() == "P")
}

/// The GPU's unique id as both AMD backends write it: "0x" and 16 hex digits, the form
/// `rocm-smi --showuniqueid` prints (sysfs has the digits without the prefix). Text that is
/// not hex is kept as it is.
pub fn unique_id(text: &str) -> String {
    let t = text.trim();
    let digits = t.strip_prefix("0x").unwrap_or(t);
    match u64::from_str_radix(digits, 16) {
        Ok(v) => format!("0x{v:016x}"),
        Err(_) => t.to_owned(),
    }
}

/// hwmon `pwm1` (0-255) as percent.
pub fn pwm_to_pct(pwm: u64) -> f64 {
    (pwm as f64 / PWM_MAX * 100.0).min(100.0)
}

fn micro_to_unit(v: u64) -> f64 {
    v as f64 / 1e6
}

fn milli_to_unit(v: i64) -> f64 {
    v as f64 / 1e3
}

// ---------------------------------------------------------------------------------------------
// File access

/// Reads one file, trimmed; the reason when it cannot be read.
fn read_text(dir: &Path, name: &str) -> Result<String, Absent> {
    std::fs::read_to_string(dir.join(name))
        .map(|t| t.trim().to_owned())
        .map_err(|e| absent_from_io(&e, name))
}

/// Why a sysfs file could not be read, from the error of reading `name`.
pub fn absent_from_io(e: &std::io::Error, name: &str) -> Absent {
    match e.raw_os_error() {
        // amdgpu's own answer while the GPU resets or sleeps (amdgpu_pm.c); an unprivileged
        // open fails with EACCES instead.
        Some(1) => Absent::Error(format!("{name}: the GPU is resetting or suspended")),
        Some(13) => Absent::NoPermission,
        Some(19) => Absent::GpuLost,
        // EINVAL / EOPNOTSUPP: an attribute the driver registers but this part lacks.
        Some(22 | 95) => Absent::NotSupported,
        _ => match e.kind() {
            // A file the driver does not create for this part.
            ErrorKind::NotFound => Absent::NotSupported,
            ErrorKind::PermissionDenied => Absent::NoPermission,
            _ => Absent::Error(format!("{name}: {e}")),
        },
    }
}

/// Like `read_text`, with an empty file counted as absent (FRU fields of boards without one).
fn non_empty_text(dir: &Path, name: &str) -> Result<String, Absent> {
    read_text(dir, name).and_then(|t| {
        if t.is_empty() {
            Err(Absent::NotSupported)
        } else {
            Ok(t)
        }
    })
}

fn read_u64(dir: &Path, name: &str) -> Result<u64, Absent> {
    let t = read_text(dir, name)?;
    t.parse()
        .map_err(|_| Absent::Error(format!("{name}: unexpected {t:?}")))
}

fn read_i64(dir: &Path, name: &str) -> Result<i64, Absent> {
    let t = read_text(dir, name)?;
    t.parse()
        .map_err(|_| Absent::Error(format!("{name}: unexpected {t:?}")))
}

/// Keeps a value, or records why it is absent under `field`.
fn take<T>(r: Result<T, Absent>, field: &str, absent: &mut AbsentMap) -> Option<T> {
    r.map_err(|why| absent.insert(field.into(), why)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpm_tables_parse_with_the_current_level() {
        let t = parse_dpm("0: 500Mhz \n1: 1300Mhz *\n2: 2100Mhz \n").unwrap();
        assert_eq!(t.levels.len(), 3);
        assert_eq!(t.current().map(|l| (l.level, l.mhz)), Some((Some(1), 1300)));
        assert_eq!(t.max_mhz(), Some(2100));
    }

    #[test]
    fn deep_sleep_line_is_current_but_never_the_maximum() {
        let t = parse_dpm("S: 19Mhz *\n0: 500Mhz \n1: 2482Mhz \n").unwrap();
        let cur = t.current().unwrap();
        assert_eq!((cur.level, cur.mhz), (None, 19));
        assert_eq!(t.max_mhz(), Some(2482));
        // Nothing marked: no current level, still a maximum.
        let t = parse_dpm("0: 96Mhz\n1: 1000MHz\n").unwrap();
        assert_eq!(t.current(), None);
        assert_eq!(t.max_mhz(), Some(1000));
    }

    #[test]
    fn malformed_dpm_tables_are_errors() {
        assert!(parse_dpm("").is_err());
        assert!(parse_dpm("0: fast *").unwrap_err().contains("0: fast *"));
        assert!(parse_dpm("x: 500Mhz").is_err());
        assert!(parse_dpm("0: 2.5GT/s, x16 *").is_err());
    }

    #[test]
    fn link_speeds_map_to_generations() {
        for (text, generation) in [
            ("2.5 GT/s PCIe", 1),
            ("5.0 GT/s PCIe", 2),
            ("8.0 GT/s PCIe", 3),
            ("8 GT/s", 3),
            ("16.0 GT/s PCIe", 4),
            ("32.0 GT/s PCIe", 5),
            ("64.0 GT/s PCIe", 6),
        ] {
            assert_eq!(parse_link_speed(text), Ok(generation), "{text}");
        }
        assert!(matches!(parse_link_speed("Unknown"), Err(Absent::Error(_))));
        assert!(matches!(
            parse_link_speed("3.0 GT/s"),
            Err(Absent::Error(_))
        ));
        assert_eq!(parse_link_width("16"), Ok(16));
        assert!(parse_link_width("0").is_err());
        assert!(parse_link_width("x16").is_err());
    }

    #[test]
    fn fdinfo_of_an_amdgpu_client() {
        let text = "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1057\n\
                    drm-driver:\tamdgpu\ndrm-client-id:\t42\ndrm-pdev:\t0000:03:00.0\n\
                    pasid:\t32771\ndrm-memory-vram:\t2097152 KiB\ndrm-memory-gtt: \t2048 KiB\n\
                    drm-engine-gfx:\t0 ns\ndrm-engine-compute:\t123456 ns\n";
        let info = parse_fdinfo(text).unwrap();
        assert_eq!(info.driver.as_deref(), Some("amdgpu"));
        assert_eq!(info.pdev.as_deref(), Some("0000:03:00.0"));
        assert_eq!(info.client_id, Some(42));
        assert_eq!(info.vram_bytes, Some(2 << 30));
        assert!(info.compute && info.graphics);
        // The pre-5.19 amdgpu format.
        let old = parse_fdinfo("pdev:\t0000:03:00.0\nvram mem:\t1024 kB\n").unwrap();
        assert_eq!(old.driver.as_deref(), Some("amdgpu"));
        assert_eq!(old.vram_bytes, Some(1 << 20));
        assert_eq!(old.client_id, None);
        // A regular file's fdinfo is not a DRM client.
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t0100000\n"), None);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("4 KiB"), Some(4096));
        assert_eq!(parse_size("3 MiB"), Some(3 << 20));
        assert_eq!(parse_size("3 furlongs"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn ras_counts_and_bad_pages() {
        assert_eq!(
            parse_ras_count("ue: 1\nce: 7\n"),
            Some(RasCount {
                uncorrected: 1,
                corrected: 7
            })
        );
        assert_eq!(parse_ras_count("ue: 1\n"), None);
        assert!(bad_pages_pending(
            "0x00000001 : 0x00001000 : R\n0x00000002 : 0x00001000 : P\n"
        ));
        assert!(!bad_pages_pending("0x00000001 : 0x00001000 : R\n"));
        assert!(!bad_pages_pending(""));
    }

    #[test]
    fn unique_ids_take_rocm_smis_form() {
        assert_eq!(unique_id("9a3f6c2d81b4e057"), "0x9a3f6c2d81b4e057");
        assert_eq!(unique_id("3f6c2d81b4e057\n"), "0x003f6c2d81b4e057");
        assert_eq!(unique_id("0x9a3f6c2d81b4e057"), "0x9a3f6c2d81b4e057");
        assert_eq!(unique_id("N/A"), "N/A");
    }

    #[test]
    fn pwm_is_a_share_of_255() {
        assert_eq!(pwm_to_pct(0), 0.0);
        assert_eq!(pwm_to_pct(255), 100.0);
        assert!((pwm_to_pct(102) - 40.0).abs() < 1e-9);
    }

    #[test]
    fn sensors_prefer_the_junction() {
        let s = Sensors {
            edge: Some(1),
            junction: Some(2),
            mem: Some(3),
        };
        assert_eq!(s.gpu(), Some(2));
        let edge_only = Sensors {
            edge: Some(1),
            ..Sensors::default()
        };
        assert_eq!(edge_only.gpu(), Some(1));
        assert_eq!(Sensors::default().gpu(), None);
    }

    #[test]
    fn io_errors_map_to_reasons() {
        let e = |n| absent_from_io(&std::io::Error::from_raw_os_error(n), "gpu_busy_percent");
        assert_eq!(e(2), Absent::NotSupported);
        assert_eq!(e(13), Absent::NoPermission);
        assert_eq!(e(19), Absent::GpuLost);
        assert_eq!(e(95), Absent::NotSupported);
        assert!(matches!(e(1), Absent::Error(m) if m.contains("resetting")));
        assert!(matches!(e(5), Absent::Error(m) if m.starts_with("gpu_busy_percent: ")));
    }

    #[test]
    fn a_root_without_drm_is_no_device() {
        let dir = tempfile::tempdir().unwrap();
        let err = SysfsBackend::open(dir.path()).unwrap_err();
        assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
        std::fs::create_dir_all(dir.path().join("sys/class/drm")).unwrap();
        let err = SysfsBackend::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("no amdgpu device"), "{err}");
    }
}
