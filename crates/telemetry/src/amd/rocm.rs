//! The ROCm SMI backend: live telemetry from AMD GPUs through `librocm_smi64`, loaded at run
//! time.
//!
//! Why we bind the few functions ourselves instead of using the `rocm_smi_lib` crate: that crate
//! links `librocm_smi64` at build time and generates its bindings into its own source directory
//! during the build, so the binary would need ROCm (and libclang) where it is built and would not
//! start where the library is missing. gpudiag is one binary for every host: it dlopens the
//! library (`librocm_smi64.so`, then the versioned names), resolves the symbols listed in
//! `SYMBOLS`, and without the library reports the backend absent and carries on.
//!
//! Struct layouts differ between library versions: `rsmi_frequencies_t` gained a leading
//! `has_deep_sleep` flag and a 33rd entry in librocm_smi64 6. Those structs are therefore read
//! into a zeroed buffer larger than any version's struct and decoded by the loaded library's
//! major version (`decode_frequencies`), so a newer library can never write past our memory.
//!
//! The PCIe link is read in sysfs where the GPU's directory is found (as the sysfs backend does):
//! ROCm SMI reports the GPU's own link table, which behind AMD's on-board switch is the internal
//! link, always at full speed. Per-process VRAM comes from the same `/proc/<pid>/fdinfo` scan as the sysfs backend:
//! ROCm SMI's process list carries one VRAM total per process, not per GPU. Values ROCm SMI does
//! not offer (NVIDIA's throttle bits, P-states, row remapping) are `Unavailable`.

// Every FFI call below says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, c_char};
use std::path::Path;
use std::time::Duration;

use libloading::Library;

use super::sysfs::{self, ProcessCache, SlotLink};
use crate::amd;
use crate::attribution::{AttributionOptions, GpuKeys};
use crate::{Backend, BackendError, Pacing, Tick};
use gpudiag_model::deadline::run_with_deadline;
use gpudiag_model::metric_table::Vendor;
use gpudiag_model::sample::unavailable_on;
use gpudiag_model::sample::{Absent, AbsentMap, DeviceInfo, HostInfo, Sample, now_ms};

/// The names tried, in order: the development symlink, Debian's soname, then ROCm's sonames
/// newest first. Each is tried as is (the loader's search path) and under /opt/rocm/lib, where
/// ROCm installs without always adding it to the loader's path.
pub const LIBRARY_NAMES: &[&str] = &[
    "librocm_smi64.so",
    "librocm_smi64.so.1",
    "librocm_smi64.so.7",
    "librocm_smi64.so.6",
    "librocm_smi64.so.5",
];

const ROCM_LIB_DIR: &str = "/opt/rocm/lib";

type Status = u32;
type DevU64 = unsafe extern "C" fn(u32, *mut u64) -> Status;
type DevU32 = unsafe extern "C" fn(u32, *mut u32) -> Status;
type DevArgU64 = unsafe extern "C" fn(u32, u32, *mut u64) -> Status;
type DevStr32 = unsafe extern "C" fn(u32, *mut c_char, u32) -> Status;
const RSMI_STATUS_SUCCESS: Status = 0;
const RSMI_STATUS_NOT_SUPPORTED: Status = 2;
const RSMI_STATUS_FILE_ERROR: Status = 3;
const RSMI_STATUS_PERMISSION: Status = 4;
const RSMI_STATUS_NOT_YET_IMPLEMENTED: Status = 9;

const RSMI_MEM_TYPE_VRAM: u32 = 0;
const RSMI_CLK_TYPE_SYS: u32 = 0;
const RSMI_CLK_TYPE_MEM: u32 = 4;
const RSMI_TEMP_TYPE_EDGE: u32 = 0;
const RSMI_TEMP_TYPE_JUNCTION: u32 = 1;
const RSMI_TEMP_TYPE_MEMORY: u32 = 2;
const RSMI_TEMP_CURRENT: u32 = 0;
const RSMI_TEMP_CRITICAL: u32 = 5;
const RSMI_TEMP_EMERGENCY: u32 = 7;
/// `RSMI_GPU_BLOCK_UMC`: the memory controller, whose ECC counts are VRAM errors. The block enum
/// holds a 64-bit value, so it is passed as u64.
const RSMI_GPU_BLOCK_UMC: u64 = 1;
const RSMI_SW_COMP_DRIVER: u32 = 0;
/// ROCm SMI's full-scale fan speed.
const RSMI_MAX_FAN_SPEED: f64 = 255.0;

/// `rsmi_version_t`.
#[repr(C)]
struct RsmiVersion {
    major: u32,
    minor: u32,
    patch: u32,
    build: *const c_char,
}

/// `rsmi_error_count_t`.
#[repr(C)]
#[derive(Default)]
struct RsmiErrorCount {
    correctable: u64,
    uncorrectable: u64,
}

/// `rsmi_retired_page_record_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RsmiRetiredPage {
    address: u64,
    size: u64,
    /// `rsmi_memory_page_status_t`: 0 reserved (retired), 1 pending, 2 unreservable.
    status: u32,
}

const RSMI_MEM_PAGE_STATUS_PENDING: u32 = 1;
const RSMI_STATUS_INSUFFICIENT_SIZE: Status = 11;

/// Room for any version's `rsmi_frequencies_t` (264 or 280 bytes) or `rsmi_pcie_bandwidth_t`
/// (392 or 416 bytes), 8-byte aligned as their u64 members need.
#[repr(C, align(8))]
struct StructBuf([u8; 1024]);

impl StructBuf {
    fn new() -> Self {
        StructBuf([0; 1024])
    }
}

/// Declares the resolved function table and the list of its symbol names from one list, so the
/// two cannot drift apart. Each signature is the one rocm_smi.h declares.
macro_rules! api {
    ($($field:ident : $sym:literal => fn($($arg:ty),*);)*) => {
        /// Every symbol the backend calls, resolved once when the library loads.
        struct Api {
            $($field: unsafe extern "C" fn($($arg),*) -> Status,)*
            /// Keeps the library mapped while the function pointers above are in use.
            _lib: Library,
        }

        /// The symbols gpudiag resolves in `librocm_smi64`.
        pub const SYMBOLS: &[&str] = &[$($sym),*];

        impl Api {
            fn resolve(lib: Library) -> Result<Api, String> {
                $(
                    // SAFETY: the pointer type is the signature rocm_smi.h gives this symbol
                    // (listed in the `api!` invocation), and the copied pointer is only called
                    // while `_lib` keeps the library loaded: both live in the same `Api`.
                    let $field = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) -> Status>(
                            concat!($sym, "\0").as_bytes(),
                        )
                        .map_err(|e| format!("{}: {e}", $sym))?
                    };
                )*
                Ok(Api { $($field,)* _lib: lib })
            }
        }
    };
}

api! {
    init: "rsmi_init" => fn(u64);
    shut_down: "rsmi_shut_down" => fn();
    num_monitor_devices: "rsmi_num_monitor_devices" => fn(*mut u32);
    status_string: "rsmi_status_string" => fn(Status, *mut *const c_char);
    version_get: "rsmi_version_get" => fn(*mut RsmiVersion);
    version_str_get: "rsmi_version_str_get" => fn(u32, *mut c_char, u32);
    dev_id_get: "rsmi_dev_id_get" => fn(u32, *mut u16);
    dev_name_get: "rsmi_dev_name_get" => fn(u32, *mut c_char, usize);
    dev_pci_id_get: "rsmi_dev_pci_id_get" => fn(u32, *mut u64);
    dev_unique_id_get: "rsmi_dev_unique_id_get" => fn(u32, *mut u64);
    dev_serial_number_get: "rsmi_dev_serial_number_get" => fn(u32, *mut c_char, u32);
    dev_vbios_version_get: "rsmi_dev_vbios_version_get" => fn(u32, *mut c_char, u32);
    dev_busy_percent_get: "rsmi_dev_busy_percent_get" => fn(u32, *mut u32);
    dev_memory_busy_percent_get: "rsmi_dev_memory_busy_percent_get" => fn(u32, *mut u32);
    dev_memory_total_get: "rsmi_dev_memory_total_get" => fn(u32, u32, *mut u64);
    dev_memory_usage_get: "rsmi_dev_memory_usage_get" => fn(u32, u32, *mut u64);
    dev_power_ave_get: "rsmi_dev_power_ave_get" => fn(u32, u32, *mut u64);
    dev_power_cap_get: "rsmi_dev_power_cap_get" => fn(u32, u32, *mut u64);
    dev_power_cap_default_get: "rsmi_dev_power_cap_default_get" => fn(u32, *mut u64);
    dev_power_cap_range_get: "rsmi_dev_power_cap_range_get" => fn(u32, u32, *mut u64, *mut u64);
    dev_energy_count_get: "rsmi_dev_energy_count_get" => fn(u32, *mut u64, *mut f32, *mut u64);
    dev_temp_metric_get: "rsmi_dev_temp_metric_get" => fn(u32, u32, u32, *mut i64);
    dev_gpu_clk_freq_get: "rsmi_dev_gpu_clk_freq_get" => fn(u32, u32, *mut StructBuf);
    dev_pci_bandwidth_get: "rsmi_dev_pci_bandwidth_get" => fn(u32, *mut StructBuf);
    dev_pci_replay_counter_get: "rsmi_dev_pci_replay_counter_get" => fn(u32, *mut u64);
    dev_fan_speed_get: "rsmi_dev_fan_speed_get" => fn(u32, u32, *mut i64);
    dev_ecc_enabled_get: "rsmi_dev_ecc_enabled_get" => fn(u32, *mut u64);
    dev_ecc_count_get: "rsmi_dev_ecc_count_get" => fn(u32, u64, *mut RsmiErrorCount);
    dev_memory_reserved_pages_get: "rsmi_dev_memory_reserved_pages_get"
        => fn(u32, *mut u32, *mut RsmiRetiredPage);
}

/// A loaded `librocm_smi64` with every symbol resolved (not yet initialised).
pub struct Library64 {
    api: Api,
    /// `rsmi_dev_current_socket_power_get`, in libraries that have it (ROCm 6 and later).
    socket_power: Option<DevU64>,
    /// The file name that loaded.
    pub name: String,
    /// The library's own version (`rsmi_version_get`), e.g. (5, 0, 0); `None` when it would
    /// not say, and then the versioned structs are not read.
    pub version: Option<(u32, u32, u32)>,
}

impl std::fmt::Debug for Library64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library64")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Why the library could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("ROCm SMI library librocm_smi64 not found ({0})")]
    NotFound(String),
    #[error("{name} lacks a symbol gpudiag needs, so it is too old: {detail}")]
    MissingSymbol { name: String, detail: String },
}

impl Library64 {
    /// Loads the first library name that opens and resolves every symbol in `SYMBOLS`.
    pub fn load() -> Result<Library64, LoadError> {
        let candidates: Vec<String> = LIBRARY_NAMES
            .iter()
            .flat_map(|n| {
                [
                    (*n).to_owned(),
                    Path::new(ROCM_LIB_DIR).join(n).display().to_string(),
                ]
            })
            .collect();
        Self::load_from(&candidates)
    }

    /// `load` over the given names (a bare name goes through the loader's search path).
    pub fn load_from(candidates: &[String]) -> Result<Library64, LoadError> {
        let mut tried = Vec::new();
        for name in candidates.iter().cloned() {
            // SAFETY: loading runs the library's initialisers; librocm_smi64's only set up its
            // own C++ statics and touch no state of ours.
            let lib = match unsafe { Library::new(&name) } {
                Ok(lib) => lib,
                Err(e) => {
                    // libloading 0.9's message leaves out the file name; keep it beside it.
                    tried.push(format!("{name}: {}", one_line(&e.to_string())));
                    continue;
                }
            };
            // Optional: ROCm SMI 6 reads MI300's power here; rsmi_dev_power_ave_get does not.
            // SAFETY: the pointer type is the signature rocm_smi.h gives this symbol, and the
            // copied pointer is only called while the `Api` that takes `lib` keeps it loaded.
            let socket_power: Option<DevU64> = unsafe {
                lib.get::<DevU64>(b"rsmi_dev_current_socket_power_get\0")
                    .ok()
                    .map(|f| *f)
            };
            let api = Api::resolve(lib).map_err(|detail| LoadError::MissingSymbol {
                name: name.clone(),
                detail,
            })?;
            let mut v = RsmiVersion {
                major: 0,
                minor: 0,
                patch: 0,
                build: std::ptr::null(),
            };
            // SAFETY: `v` is a live rsmi_version_t the call fills; it needs no rsmi_init.
            let st = unsafe { (api.version_get)(&mut v) };
            let version = (st == RSMI_STATUS_SUCCESS).then_some((v.major, v.minor, v.patch));
            return Ok(Library64 {
                api,
                socket_power,
                name,
                version,
            });
        }
        Err(LoadError::NotFound(tried.join("; ")))
    }

    /// The struct layout this library version writes.
    fn layout(&self) -> Result<Layout, Absent> {
        match self.version {
            Some((major, _, _)) if major >= 6 => Ok(Layout::V6),
            Some(_) => Ok(Layout::V5),
            None => Err(Absent::Error(
                "ROCm SMI did not give its version, so its clock tables cannot be read safely"
                    .into(),
            )),
        }
    }

    /// ROCm SMI's text for a status code.
    fn status_text(&self, st: Status) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` receives a pointer to a static string owned by the library.
        let ok = unsafe { (self.api.status_string)(st, &mut p) } == RSMI_STATUS_SUCCESS;
        if ok && !p.is_null() {
            // SAFETY: on success the library points `p` at a NUL-terminated static string.
            let text = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            one_line(&text)
        } else {
            format!("ROCm SMI status {st}")
        }
    }

    /// Why a value is absent, from a failed call's status.
    fn absent(&self, st: Status) -> Absent {
        absent_from_status(st).unwrap_or_else(|| Absent::Error(self.status_text(st)))
    }

    /// `Ok(())` on success, else the reason.
    fn check(&self, st: Status) -> Result<(), Absent> {
        if st == RSMI_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(self.absent(st))
        }
    }

    /// Initialises ROCm SMI and counts the GPUs. `NoDevice` when it will not initialise (what
    /// it does on a host without an AMD GPU) or sees none.
    pub fn init(&self) -> Result<u32, BackendError> {
        // SAFETY: plain call; 0 asks for the default flags (AMD GPUs only).
        let st = unsafe { (self.api.init)(0) };
        if st != RSMI_STATUS_SUCCESS {
            return Err(BackendError::NoDevice(format!(
                "no AMD GPU: ROCm SMI would not initialise ({})",
                self.status_text(st)
            )));
        }
        let mut n = 0u32;
        // SAFETY: `n` is a live u32 the call fills.
        let st = unsafe { (self.api.num_monitor_devices)(&mut n) };
        if st != RSMI_STATUS_SUCCESS || n == 0 {
            self.shut_down();
            return Err(BackendError::NoDevice(
                "no AMD GPU: ROCm SMI is working but lists none".into(),
            ));
        }
        Ok(n)
    }

    fn shut_down(&self) {
        // SAFETY: plain call, valid after a successful rsmi_init.
        unsafe { (self.api.shut_down)() };
    }

    /// One u64 from a `rsmi_dev_*_get(dv, uint64_t *)` function.
    fn dev_u64(&self, f: DevU64, dv: u32) -> Result<u64, Absent> {
        let mut v = 0u64;
        // SAFETY: `f` is a resolved function of that signature, which writes one u64 through
        // the pointer; it points at a live local.
        self.check(unsafe { f(dv, &mut v) })?;
        Ok(v)
    }

    /// One u32 from a `rsmi_dev_*_get(dv, uint32_t *)` function.
    fn dev_u32(&self, f: DevU32, dv: u32) -> Result<u32, Absent> {
        let mut v = 0u32;
        // SAFETY: as in `dev_u64`, for one u32.
        self.check(unsafe { f(dv, &mut v) })?;
        Ok(v)
    }

    /// One u64 from a `rsmi_dev_*_get(dv, uint32_t arg, uint64_t *)` function (a memory type
    /// or a sensor index).
    fn dev_arg_u64(&self, f: DevArgU64, dv: u32, arg: u32) -> Result<u64, Absent> {
        let mut v = 0u64;
        // SAFETY: as in `dev_u64`; `arg` is a plain value.
        self.check(unsafe { f(dv, arg, &mut v) })?;
        Ok(v)
    }

    /// A string from a `rsmi_dev_*_get(dv, char *, uint32_t len)` function; empty is absent.
    fn dev_string(&self, f: DevStr32, dv: u32) -> Result<String, Absent> {
        let mut buf = [0u8; 256];
        // SAFETY: the function writes at most `len` bytes, NUL included, into `buf`, whose true
        // length is passed.
        self.check(unsafe { f(dv, buf.as_mut_ptr().cast(), buf.len() as u32) })?;
        non_empty(c_string(&buf))
    }

    /// Whether a VRAM page waits for retirement (applied at the next GPU reset).
    fn retirement_pending(&self, dv: u32) -> Result<bool, Absent> {
        let f = self.api.dev_memory_reserved_pages_get;
        let mut n = 0u32;
        // SAFETY: a null record pointer asks for the count only, written to the live `n`.
        self.check(unsafe { f(dv, &mut n, std::ptr::null_mut()) })?;
        if n == 0 {
            return Ok(false);
        }
        let mut records = vec![RsmiRetiredPage::default(); n as usize];
        let mut written = n;
        // SAFETY: `records` holds `written` records, the limit the call is given.
        let st = unsafe { f(dv, &mut written, records.as_mut_ptr()) };
        // Pages retired between the two calls: the first `n` records are still written.
        if st != RSMI_STATUS_SUCCESS && st != RSMI_STATUS_INSUFFICIENT_SIZE {
            return Err(self.absent(st));
        }
        Ok(records
            .iter()
            .take(written.min(n) as usize)
            .any(|r| r.status == RSMI_MEM_PAGE_STATUS_PENDING))
    }

    fn frequencies(&self, dv: u32, clk: u32) -> Result<Frequencies, Absent> {
        let mut buf = StructBuf::new();
        // SAFETY: `buf` is larger than any version's rsmi_frequencies_t and 8-byte aligned.
        self.check(unsafe { (self.api.dev_gpu_clk_freq_get)(dv, clk, &mut buf) })?;
        decode_frequencies(&buf.0, self.layout()?)
    }

    fn pcie(&self, dv: u32) -> Result<PcieLink, Absent> {
        let mut buf = StructBuf::new();
        // SAFETY: `buf` is larger than any version's rsmi_pcie_bandwidth_t and 8-byte aligned.
        self.check(unsafe { (self.api.dev_pci_bandwidth_get)(dv, &mut buf) })?;
        decode_pcie(&buf.0, self.layout()?)
    }

    fn temp(&self, dv: u32, sensor: u32, metric: u32) -> Result<f64, Absent> {
        let mut mc = 0i64;
        // SAFETY: `mc` is a live i64 the call fills; sensor and metric are plain values.
        self.check(unsafe { (self.api.dev_temp_metric_get)(dv, sensor, metric, &mut mc) })?;
        Ok(mc as f64 / 1e3)
    }
}

/// Live telemetry from every GPU ROCm SMI sees.
#[derive(Debug)]
pub struct RocmBackend {
    lib: Library64,
    host: HostInfo,
    devices: Vec<DeviceInfo>,
    /// The temperature sensor reported as the GPU's, per device.
    gpu_sensor: Vec<u32>,
    /// The slot link in sysfs, per device, when its PCI directory is found there.
    links: Vec<Option<SlotLink>>,
    processes: ProcessCache,
}

impl RocmBackend {
    /// Loads the library, initialises it and reads static attributes, under `init_deadline`
    /// (ROCm SMI reads sysfs files that a wedged GPU can hold).
    pub fn open(init_deadline: Duration) -> Result<RocmBackend, BackendError> {
        Self::open_with(init_deadline, AttributionOptions::default())
    }

    /// `open`, saying where processes' owners are read.
    pub fn open_with(
        init_deadline: Duration,
        attribution: AttributionOptions,
    ) -> Result<RocmBackend, BackendError> {
        match run_with_deadline("rocm-open", init_deadline, move || {
            open_blocking(attribution)
        }) {
            Ok(r) => r,
            Err(e) => Err(BackendError::Unavailable(format!(
                "ROCm SMI initialisation failed: {e}"
            ))),
        }
    }
}

fn open_blocking(attribution: AttributionOptions) -> Result<RocmBackend, BackendError> {
    // ROCm SMI finds GPUs through the same DRM directory; without an amdgpu card there,
    // rsmi_init would only fail after printing its own errors to our stderr.
    if !sysfs::has_amdgpu(Path::new("/")) {
        return Err(BackendError::NoDevice(
            "no AMD GPU: no amdgpu device in /sys/class/drm".into(),
        ));
    }
    let lib = Library64::load().map_err(|e| BackendError::Unavailable(e.to_string()))?;
    let count = lib.init()?;
    let gpu_sensor: Vec<u32> = (0..count)
        .map(|dv| {
            // The junction (hotspot) is what the firmware throttles on and all MI300 has.
            if lib
                .temp(dv, RSMI_TEMP_TYPE_JUNCTION, RSMI_TEMP_CURRENT)
                .is_ok()
            {
                RSMI_TEMP_TYPE_JUNCTION
            } else {
                RSMI_TEMP_TYPE_EDGE
            }
        })
        .collect();
    let links: Vec<Option<SlotLink>> = (0..count)
        .map(|dv| {
            let bus = lib.dev_u64(lib.api.dev_pci_id_get, dv).ok()?;
            SlotLink::find(Path::new("/"), &amd::bus_id_from_bdf(bus))
        })
        .collect();
    let devices = (0..count)
        .map(|dv| {
            let mut info = read_device_info(&lib, dv, gpu_sensor[dv as usize]);
            if let Some(link) = &links[dv as usize] {
                let (generation, width) = link.max();
                info.pcie_gen_max = put(generation, "pcie_gen_max", &mut info.absent);
                info.pcie_width_max = put(width, "pcie_width_max", &mut info.absent);
            }
            info
        })
        .collect();
    let mut buf = [0u8; 256];
    // SAFETY: `buf` outlives the call and its length is passed.
    let st =
        unsafe { (lib.api.version_str_get)(RSMI_SW_COMP_DRIVER, buf.as_mut_ptr().cast(), 256) };
    let driver_version = (st == RSMI_STATUS_SUCCESS)
        .then(|| c_string(&buf))
        .filter(|s| !s.is_empty());
    Ok(RocmBackend {
        host: HostInfo {
            hostname: gethostname::gethostname().into_string().ok(),
            driver_version,
            cuda_driver_version: None,
            nvml_version: None,
        },
        lib,
        devices,
        gpu_sensor,
        links,
        processes: ProcessCache::new(attribution),
    })
}

impl Drop for RocmBackend {
    fn drop(&mut self) {
        self.lib.shut_down();
    }
}

impl Backend for RocmBackend {
    fn name(&self) -> &'static str {
        "rocm"
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
        let samples = self
            .devices
            .iter()
            .zip(&self.gpu_sensor)
            .zip(&self.links)
            .map(|((info, &sensor), link)| {
                let mut s = read_sample(&self.lib, info, sensor, time_ms);
                if let Some(link) = link {
                    let (generation, width) = link.current();
                    s.pcie_gen = put(generation, "pcie_gen", &mut s.absent);
                    s.pcie_width = put(width, "pcie_width", &mut s.absent);
                }
                let (mine, pods) = match info.pci_bus_id.as_deref() {
                    Some(bus) => (ProcessCache::of(&procs, bus), self.processes.pods_of(bus)),
                    None => (Err(Absent::NotSupported), Err(Absent::NotSupported)),
                };
                s.processes = take(mine, "processes", &mut s.absent);
                s.gpu_pods = take(pods, "gpu_pods", &mut s.absent);
                s
            })
            .collect();
        Ok(Tick {
            samples,
            events: Vec::new(),
            ras: Vec::new(),
            kernels: None,
        })
    }

    fn set_slow_interval(&mut self, interval: Duration) {
        self.processes.set_interval(interval);
    }
}

/// `DeviceInfo` fields ROCm SMI does not give.
const UNAVAILABLE_INFO: &[&str] = &[
    "compute_capability",
    "temp_gpu_max_c",
    "persistence_mode",
    "mig_enabled",
];

fn read_device_info(lib: &Library64, dv: u32, sensor: u32) -> DeviceInfo {
    let api = &lib.api;
    let mut info = DeviceInfo {
        index: dv,
        vendor: Some(amd::VENDOR.into()),
        ..DeviceInfo::default()
    };
    let ab = &mut info.absent;
    let mut id = 0u16;
    // SAFETY: `id` is a live u16 the call fills.
    let device_id = lib
        .check(unsafe { (api.dev_id_get)(dv, &mut id) })
        .ok()
        .map(|()| id);
    let mut name = [0u8; 256];
    // SAFETY: the call writes at most `len` bytes, NUL included, into `name`, whose true length
    // is passed.
    let named = lib.check(unsafe { (api.dev_name_get)(dv, name.as_mut_ptr().cast(), name.len()) });
    info.name = take(
        named
            .and_then(|()| non_empty(c_string(&name)))
            .or_else(|why| {
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
    info.pci_bus_id = take(
        lib.dev_u64(api.dev_pci_id_get, dv)
            .map(amd::bus_id_from_bdf),
        "pci_bus_id",
        ab,
    );
    info.uuid = take(
        lib.dev_u64(api.dev_unique_id_get, dv)
            .map(|u| format!("0x{u:016x}")),
        "uuid",
        ab,
    );
    info.serial = take(lib.dev_string(api.dev_serial_number_get, dv), "serial", ab);
    info.vbios_version = take(
        lib.dev_string(api.dev_vbios_version_get, dv),
        "vbios_version",
        ab,
    );
    info.memory_total_bytes = take(
        lib.dev_arg_u64(api.dev_memory_total_get, dv, RSMI_MEM_TYPE_VRAM),
        "memory_total_bytes",
        ab,
    );
    info.power_limit_default_w = take(
        lib.dev_u64(api.dev_power_cap_default_get, dv)
            .map(micro_to_unit),
        "power_limit_default_w",
        ab,
    );
    let mut max = 0u64;
    let mut min = 0u64;
    // SAFETY: `max` and `min` are live u64s the call fills; 0 is the first power sensor.
    let range = lib.check(unsafe { (api.dev_power_cap_range_get)(dv, 0, &mut max, &mut min) });
    info.power_limit_min_w = take(
        range.clone().map(|()| micro_to_unit(min)),
        "power_limit_min_w",
        ab,
    );
    info.power_limit_max_w = take(range.map(|()| micro_to_unit(max)), "power_limit_max_w", ab);
    info.sm_clock_max_mhz = take(
        lib.frequencies(dv, RSMI_CLK_TYPE_SYS)
            .and_then(|f| f.max_mhz()),
        "sm_clock_max_mhz",
        ab,
    );
    info.mem_clock_max_mhz = take(
        lib.frequencies(dv, RSMI_CLK_TYPE_MEM)
            .and_then(|f| f.max_mhz()),
        "mem_clock_max_mhz",
        ab,
    );
    let pcie = lib.pcie(dv);
    info.pcie_gen_max = take(
        pcie.clone()
            .and_then(|p| p.gen_max.ok_or(Absent::NotSupported)),
        "pcie_gen_max",
        ab,
    );
    info.pcie_width_max = take(
        pcie.and_then(|p| p.width_max.ok_or(Absent::NotSupported)),
        "pcie_width_max",
        ab,
    );
    info.temp_slowdown_c = take(
        lib.temp(dv, sensor, RSMI_TEMP_CRITICAL),
        "temp_slowdown_c",
        ab,
    );
    info.temp_shutdown_c = take(
        lib.temp(dv, sensor, RSMI_TEMP_EMERGENCY),
        "temp_shutdown_c",
        ab,
    );
    info.temp_mem_max_c = take(
        lib.temp(dv, RSMI_TEMP_TYPE_MEMORY, RSMI_TEMP_CRITICAL),
        "temp_mem_max_c",
        ab,
    );
    info.ecc_enabled = take(
        lib.dev_u64(api.dev_ecc_enabled_get, dv)
            .map(|blocks| blocks & RSMI_GPU_BLOCK_UMC != 0),
        "ecc_enabled",
        ab,
    );
    for f in UNAVAILABLE_INFO {
        ab.insert((*f).into(), Absent::Unavailable);
    }
    info
}

fn read_sample(lib: &Library64, info: &DeviceInfo, sensor: u32, time_ms: u64) -> Sample {
    let api = &lib.api;
    let dv = info.index;
    let mut s = Sample::new(dv, time_ms);
    let mut ab = AbsentMap::new();
    let a = &mut ab;
    s.gpu_util_pct = take(
        lib.dev_u32(api.dev_busy_percent_get, dv).map(f64::from),
        "gpu_util_pct",
        a,
    );
    s.mem_util_pct = take(
        lib.dev_u32(api.dev_memory_busy_percent_get, dv)
            .map(f64::from),
        "mem_util_pct",
        a,
    );
    let used = lib.dev_arg_u64(api.dev_memory_usage_get, dv, RSMI_MEM_TYPE_VRAM);
    let total = lib.dev_arg_u64(api.dev_memory_total_get, dv, RSMI_MEM_TYPE_VRAM);
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
    s.power_w = take(
        lib.dev_arg_u64(api.dev_power_ave_get, dv, 0)
            .or_else(|why| match lib.socket_power {
                Some(f) if why == Absent::NotSupported => lib.dev_u64(f, dv),
                _ => Err(why),
            })
            .map(micro_to_unit),
        "power_w",
        a,
    );
    s.power_limit_w = take(
        lib.dev_arg_u64(api.dev_power_cap_get, dv, 0)
            .map(micro_to_unit),
        "power_limit_w",
        a,
    );
    let mut counter = 0u64;
    let mut resolution = 0f32;
    let mut stamp = 0u64;
    s.energy_j = take(
        // SAFETY: the three out-pointers are live locals of the types the call writes.
        lib.check(unsafe {
            (api.dev_energy_count_get)(dv, &mut counter, &mut resolution, &mut stamp)
        })
        .and_then(|()| energy_joules(counter, resolution)),
        "energy_j",
        a,
    );
    s.temp_gpu_c = take(lib.temp(dv, sensor, RSMI_TEMP_CURRENT), "temp_gpu_c", a);
    s.temp_mem_c = take(
        lib.temp(dv, RSMI_TEMP_TYPE_MEMORY, RSMI_TEMP_CURRENT),
        "temp_mem_c",
        a,
    );
    s.sm_clock_mhz = take(
        lib.frequencies(dv, RSMI_CLK_TYPE_SYS)
            .and_then(|f| f.current_mhz()),
        "sm_clock_mhz",
        a,
    );
    s.mem_clock_mhz = take(
        lib.frequencies(dv, RSMI_CLK_TYPE_MEM)
            .and_then(|f| f.current_mhz()),
        "mem_clock_mhz",
        a,
    );
    let pcie = lib.pcie(dv);
    s.pcie_gen = take(
        pcie.clone()
            .and_then(|p| p.generation.ok_or(Absent::NotSupported)),
        "pcie_gen",
        a,
    );
    s.pcie_width = take(
        pcie.and_then(|p| p.width.ok_or(Absent::NotSupported)),
        "pcie_width",
        a,
    );
    s.pcie_replay_count = take(
        lib.dev_u64(api.dev_pci_replay_counter_get, dv),
        "pcie_replay_count",
        a,
    );
    let mut counts = RsmiErrorCount::default();
    // SAFETY: `counts` is a live rsmi_error_count_t the call fills.
    let ecc = lib
        .check(unsafe { (api.dev_ecc_count_get)(dv, RSMI_GPU_BLOCK_UMC, &mut counts) })
        .map(|()| counts);
    s.ecc_corrected_volatile = take(
        ecc.as_ref().map(|c| c.correctable).map_err(Clone::clone),
        "ecc_corrected_volatile",
        a,
    );
    s.ecc_uncorrected_volatile = take(ecc.map(|c| c.uncorrectable), "ecc_uncorrected_volatile", a);
    s.retired_pages_pending = take(lib.retirement_pending(dv), "retired_pages_pending", a);
    s.fan_pct = take(
        {
            let mut speed = 0i64;
            // SAFETY: `speed` is a live i64 the call fills; 0 is the first fan.
            lib.check(unsafe { (api.dev_fan_speed_get)(dv, 0, &mut speed) })
                .and_then(|()| fan_pct(speed))
        },
        "fan_pct",
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

// ---------------------------------------------------------------------------------------------
// Pure mapping functions

/// The reason for a status that has a model equivalent; `None` for the rest (their text says).
pub fn absent_from_status(st: Status) -> Option<Absent> {
    match st {
        // FILE_ERROR: the sysfs file behind the value does not exist for this part or kernel.
        RSMI_STATUS_NOT_SUPPORTED | RSMI_STATUS_FILE_ERROR | RSMI_STATUS_NOT_YET_IMPLEMENTED => {
            Some(Absent::NotSupported)
        }
        RSMI_STATUS_PERMISSION => Some(Absent::NoPermission),
        _ => None,
    }
}

/// Which `rsmi_frequencies_t` layout the loaded library writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// librocm_smi64 up to 5: `{u32 num_supported; u32 current; u64 frequency[32]}`.
    V5,
    /// librocm_smi64 6 and later: `{bool has_deep_sleep; u32 num_supported; u32 current;
    /// u64 frequency[33]}`.
    V6,
}

impl Layout {
    /// (offset of num_supported, of current, of frequency[], capacity, struct size).
    fn offsets(self) -> (usize, usize, usize, usize, usize) {
        match self {
            Layout::V5 => (0, 4, 8, 32, 264),
            Layout::V6 => (4, 8, 16, 33, 280),
        }
    }
}

/// A clock or link-rate table.
#[derive(Debug, Clone, PartialEq)]
pub struct Frequencies {
    /// Index of the current level in `values`.
    pub current: usize,
    /// Hz (clocks) or transfers/s (PCIe).
    pub values: Vec<u64>,
}

impl Frequencies {
    pub fn current_mhz(&self) -> Result<u32, Absent> {
        self.values
            .get(self.current)
            .map(|&hz| hz_to_mhz(hz))
            .ok_or_else(|| Absent::Error("clock table has no current level".into()))
    }

    pub fn max_mhz(&self) -> Result<u32, Absent> {
        self.values
            .iter()
            .max()
            .map(|&hz| hz_to_mhz(hz))
            .ok_or(Absent::NotSupported)
    }
}

fn hz_to_mhz(hz: u64) -> u32 {
    u32::try_from(hz / 1_000_000).unwrap_or(u32::MAX)
}

fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at + 4)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

fn read_u64(buf: &[u8], at: usize) -> Option<u64> {
    let bytes = buf.get(at..at + 8)?;
    Some(u64::from_ne_bytes(bytes.try_into().ok()?))
}

/// Decodes an `rsmi_frequencies_t` the library wrote at the start of `buf`. A count beyond the
/// table or a current index beyond the count is an error, never a clamp.
pub fn decode_frequencies(buf: &[u8], layout: Layout) -> Result<Frequencies, Absent> {
    let (n_at, cur_at, f_at, cap, _) = layout.offsets();
    let bad = |what: String| Absent::Error(format!("ROCm SMI returned {what}"));
    let n = read_u32(buf, n_at).ok_or_else(|| bad("a short table".into()))? as usize;
    let current = read_u32(buf, cur_at).ok_or_else(|| bad("a short table".into()))? as usize;
    if n == 0 {
        return Err(Absent::NotSupported);
    }
    if n > cap {
        return Err(bad(format!("{n} levels (at most {cap})")));
    }
    if current >= n {
        return Err(bad(format!("current level {current} of {n}")));
    }
    let values = (0..n)
        .map(|i| read_u64(buf, f_at + 8 * i).ok_or_else(|| bad("a short table".into())))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Frequencies { current, values })
}

/// The PCIe link from `rsmi_pcie_bandwidth_t` (its DPM table of rates and lane counts).
#[derive(Debug, Clone, PartialEq)]
pub struct PcieLink {
    pub generation: Option<u32>,
    pub width: Option<u32>,
    pub gen_max: Option<u32>,
    pub width_max: Option<u32>,
}

/// Decodes `rsmi_pcie_bandwidth_t`: a frequencies table of transfer rates (T/s) followed by the
/// lane count of each level.
pub fn decode_pcie(buf: &[u8], layout: Layout) -> Result<PcieLink, Absent> {
    let rates = decode_frequencies(buf, layout)?;
    let (_, _, _, _, size) = layout.offsets();
    let lanes: Vec<u32> = (0..rates.values.len())
        .map(|i| read_u32(buf, size + 4 * i).unwrap_or(0))
        .collect();
    let gen_of = |t: u64| pcie_gen_from_rate(t);
    Ok(PcieLink {
        generation: rates.values.get(rates.current).and_then(|&t| gen_of(t)),
        width: lanes.get(rates.current).copied().filter(|&w| w > 0),
        gen_max: rates.values.iter().filter_map(|&t| gen_of(t)).max(),
        width_max: lanes.iter().copied().filter(|&w| w > 0).max(),
    })
}

/// The PCIe generation of a per-lane rate in transfers per second (2.5e9 → 1 ... 64e9 → 6).
pub fn pcie_gen_from_rate(transfers_per_s: u64) -> Option<u32> {
    match transfers_per_s / 100_000_000 {
        25 => Some(1),
        50 => Some(2),
        80 => Some(3),
        160 => Some(4),
        320 => Some(5),
        640 => Some(6),
        _ => None,
    }
}

/// ROCm SMI's fan speed (0..=255) as percent; a negative or larger value is an error.
pub fn fan_pct(speed: i64) -> Result<f64, Absent> {
    if (0..=255).contains(&speed) {
        Ok(speed as f64 / RSMI_MAX_FAN_SPEED * 100.0)
    } else {
        Err(Absent::Error(format!("unexpected fan speed {speed}")))
    }
}

/// The energy counter in joules: counts × resolution (µJ per count).
pub fn energy_joules(counter: u64, resolution_uj: f32) -> Result<f64, Absent> {
    if resolution_uj.is_finite() && resolution_uj > 0.0 {
        Ok(counter as f64 * f64::from(resolution_uj) / 1e6)
    } else {
        Err(Absent::Error(format!(
            "unexpected energy counter resolution {resolution_uj}"
        )))
    }
}

fn micro_to_unit(v: u64) -> f64 {
    v as f64 / 1e6
}

/// The text before the first NUL, trimmed.
fn c_string(buf: &[u8]) -> String {
    CStr::from_bytes_until_nul(buf)
        .map(|c| c.to_string_lossy().trim().to_owned())
        .unwrap_or_default()
}

fn non_empty(s: String) -> Result<String, Absent> {
    if s.is_empty() {
        Err(Absent::NotSupported)
    } else {
        Ok(s)
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Like `take`, replacing an earlier reading of the same field (and its reason).
fn put<T>(r: Result<T, Absent>, field: &str, absent: &mut AbsentMap) -> Option<T> {
    absent.remove(field);
    take(r, field, absent)
}

/// Keeps a value, or records why it is absent under `field`.
fn take<T>(r: Result<T, Absent>, field: &str, absent: &mut AbsentMap) -> Option<T> {
    r.map_err(|why| absent.insert(field.into(), why)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes an rsmi_frequencies_t of `layout` into a buffer, as the library would.
    fn table(layout: Layout, current: u32, values: &[u64], lanes: &[u32]) -> Vec<u8> {
        let (n_at, cur_at, f_at, _, size) = layout.offsets();
        let mut buf = vec![0u8; 1024];
        if layout == Layout::V6 {
            buf[0] = 1; // has_deep_sleep
        }
        buf[n_at..n_at + 4].copy_from_slice(&(values.len() as u32).to_ne_bytes());
        buf[cur_at..cur_at + 4].copy_from_slice(&current.to_ne_bytes());
        for (i, v) in values.iter().enumerate() {
            buf[f_at + 8 * i..f_at + 8 * i + 8].copy_from_slice(&v.to_ne_bytes());
        }
        for (i, l) in lanes.iter().enumerate() {
            buf[size + 4 * i..size + 4 * i + 4].copy_from_slice(&l.to_ne_bytes());
        }
        buf
    }

    #[test]
    fn structs_match_rocm_smi_h() {
        assert!(std::mem::size_of::<StructBuf>() >= 416);
        assert_eq!(std::mem::align_of::<StructBuf>(), 8);
        assert_eq!(std::mem::size_of::<RsmiRetiredPage>(), 24);
        assert_eq!(std::mem::size_of::<RsmiErrorCount>(), 16);
    }

    #[test]
    fn frequencies_decode_in_both_layouts() {
        for layout in [Layout::V5, Layout::V6] {
            let buf = table(layout, 1, &[500_000_000, 1_420_000_000, 2_100_000_000], &[]);
            let f = decode_frequencies(&buf, layout).unwrap();
            assert_eq!(f.current, 1, "{layout:?}");
            assert_eq!(f.current_mhz(), Ok(1420));
            assert_eq!(f.max_mhz(), Ok(2100));
        }
        // A V6 table read as V5 is garbage that must not pass as a clock.
        let v6 = table(Layout::V6, 1, &[500_000_000, 1_420_000_000], &[]);
        assert!(decode_frequencies(&v6, Layout::V5).is_err());
    }

    #[test]
    fn impossible_tables_are_errors_not_clamped() {
        let empty = table(Layout::V5, 0, &[], &[]);
        assert_eq!(
            decode_frequencies(&empty, Layout::V5),
            Err(Absent::NotSupported)
        );
        let past = table(Layout::V5, 3, &[1, 2, 3], &[]);
        assert!(matches!(
            decode_frequencies(&past, Layout::V5),
            Err(Absent::Error(m)) if m.contains("current level 3 of 3")
        ));
        let mut huge = table(Layout::V5, 0, &[1], &[]);
        huge[0..4].copy_from_slice(&40u32.to_ne_bytes());
        assert!(decode_frequencies(&huge, Layout::V5).is_err());
        assert!(decode_frequencies(&[0u8; 6], Layout::V5).is_err());
    }

    #[test]
    fn pcie_tables_give_the_current_and_best_link() {
        for layout in [Layout::V5, Layout::V6] {
            let buf = table(
                layout,
                1,
                &[2_500_000_000, 16_000_000_000, 32_000_000_000],
                &[1, 16, 16],
            );
            let link = decode_pcie(&buf, layout).unwrap();
            assert_eq!(
                link,
                PcieLink {
                    generation: Some(4),
                    width: Some(16),
                    gen_max: Some(5),
                    width_max: Some(16),
                },
                "{layout:?}"
            );
        }
    }

    #[test]
    fn rates_map_to_generations() {
        assert_eq!(pcie_gen_from_rate(2_500_000_000), Some(1));
        assert_eq!(pcie_gen_from_rate(8_000_000_000), Some(3));
        assert_eq!(pcie_gen_from_rate(64_000_000_000), Some(6));
        assert_eq!(pcie_gen_from_rate(3_000_000_000), None);
    }

    #[test]
    fn statuses_map_to_reasons() {
        assert_eq!(absent_from_status(2), Some(Absent::NotSupported));
        assert_eq!(absent_from_status(3), Some(Absent::NotSupported));
        assert_eq!(absent_from_status(4), Some(Absent::NoPermission));
        assert_eq!(absent_from_status(9), Some(Absent::NotSupported));
        assert_eq!(absent_from_status(8), None);
    }

    #[test]
    fn fan_and_energy_units() {
        assert_eq!(fan_pct(255), Ok(100.0));
        assert_eq!(fan_pct(0), Ok(0.0));
        assert!(fan_pct(-1).is_err());
        assert!(fan_pct(256).is_err());
        assert_eq!(energy_joules(1_000_000, 15.3).map(|j| j.round()), Ok(15.0));
        assert!(energy_joules(5, 0.0).is_err());
        assert!(energy_joules(5, f32::NAN).is_err());
    }

    #[test]
    fn a_missing_library_is_not_found_naming_what_was_tried() {
        let err = Library64::load_from(&["librocm_smi64_nonexistent.so.9".into()]).unwrap_err();
        match err {
            LoadError::NotFound(tried) => {
                assert!(tried.contains("librocm_smi64_nonexistent.so.9"), "{tried}")
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn c_strings_stop_at_the_nul() {
        assert_eq!(c_string(b"Instinct MI300X \0garbage"), "Instinct MI300X");
        assert_eq!(c_string(b"no nul"), "");
    }
}
