//! Choosing the live backend: NVML for NVIDIA, ROCm SMI or amdgpu sysfs for AMD, or every vendor
//! found at once through a composite backend that gives each device its own index.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::amd::rocm::RocmBackend;
use super::amd::sysfs::{self, SysfsBackend};
use super::attribution::AttributionOptions;
use super::nvml::{NvmlBackend, SlowFields};
use super::{Backend, BackendError, Pacing, Tick};
use gpudiag_model::sample::{DeviceInfo, HostInfo};

/// Which live source to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveBackend {
    /// Every vendor found: NVML, and for AMD ROCm SMI when it loads, else amdgpu sysfs.
    Auto,
    Nvml,
    Rocm,
    Sysfs,
}

/// How to open a live source.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    pub backend: LiveBackend,
    /// Root for the sysfs backend; `None` reads the real `/`. With a root set, `auto` reads AMD
    /// GPUs from it (ROCm SMI always reads the real /sys).
    pub sysfs_root: Option<PathBuf>,
    pub init_timeout: Duration,
    pub slow_fields: SlowFields,
    /// Where processes' owners are read (its root is replaced by `sysfs_root` when that is set).
    pub attribution: AttributionOptions,
}

impl LiveOptions {
    /// The attribution options, reading /proc under the sysfs root when one is set.
    fn attribution(&self) -> AttributionOptions {
        AttributionOptions {
            root: self
                .sysfs_root
                .clone()
                .unwrap_or_else(|| self.attribution.root.clone()),
            kubelet: self.attribution.kubelet.clone(),
        }
    }
}

/// Opens the live backend `opts` asks for.
pub fn open_live(opts: &LiveOptions) -> Result<Box<dyn Backend>, BackendError> {
    let root = opts
        .sysfs_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(sysfs::DEFAULT_ROOT));
    match opts.backend {
        LiveBackend::Nvml => Ok(Box::new(NvmlBackend::open_with(
            opts.init_timeout,
            opts.slow_fields,
            opts.attribution(),
        )?)),
        LiveBackend::Rocm => Ok(Box::new(RocmBackend::open_with(
            opts.init_timeout,
            opts.attribution(),
        )?)),
        LiveBackend::Sysfs => open_sysfs(&root, opts),
        LiveBackend::Auto => open_auto(opts, &root),
    }
}

/// Every vendor found. With none, the error keeps NVML's explanation first (most hosts that run
/// gpudiag are NVIDIA hosts whose driver is missing), then says why there is no AMD GPU either.
fn open_auto(opts: &LiveOptions, root: &Path) -> Result<Box<dyn Backend>, BackendError> {
    let nvidia = NvmlBackend::open_with(opts.init_timeout, opts.slow_fields, opts.attribution());
    let amd = open_amd(opts, root);
    let mut parts: Vec<Box<dyn Backend>> = Vec::new();
    let nvidia_err = match nvidia {
        Ok(b) => {
            parts.push(Box::new(b));
            None
        }
        Err(e) => Some(e),
    };
    let amd_err = match amd {
        Ok(b) => {
            parts.push(b);
            None
        }
        Err(e) => Some(e),
    };
    match (parts.len(), nvidia_err, amd_err) {
        (0, Some(nv), Some(amd)) => Err(none_found(nv, &amd)),
        (1, _, _) => Ok(parts.remove(0)),
        _ => Ok(Box::new(CompositeBackend::new(parts))),
    }
}

/// AMD GPUs for `auto`: ROCm SMI when the real root is read and it initialises, else sysfs.
fn open_amd(opts: &LiveOptions, root: &Path) -> Result<Box<dyn Backend>, BackendError> {
    if opts.sysfs_root.is_none()
        && let Ok(b) = RocmBackend::open_with(opts.init_timeout, opts.attribution())
    {
        return Ok(Box::new(b));
    }
    open_sysfs(root, opts)
}

/// amdgpu sysfs under `init_deadline`, like NVML and ROCm SMI: reading a wedged GPU's files
/// can block in the kernel driver.
fn open_sysfs(root: &Path, opts: &LiveOptions) -> Result<Box<dyn Backend>, BackendError> {
    let root = root.to_path_buf();
    let attribution = opts.attribution();
    match gpudiag_model::deadline::run_with_deadline("sysfs-open", opts.init_timeout, move || {
        SysfsBackend::open_with(&root, attribution)
    }) {
        Ok(opened) => Ok(Box::new(opened?)),
        Err(e) => Err(BackendError::Unavailable(format!(
            "reading amdgpu sysfs failed: {e}"
        ))),
    }
}

fn none_found(nvidia: BackendError, amd: &BackendError) -> BackendError {
    let amd = match amd {
        BackendError::NoDevice(why) => why.clone(),
        other => other.to_string(),
    };
    match nvidia {
        BackendError::NoDevice(why) => {
            BackendError::NoDevice(format!("{why}; no AMD GPU either ({amd})"))
        }
        other => BackendError::Unavailable(format!("{other}; no AMD GPU either ({amd})")),
    }
}

/// Several live backends as one: devices are numbered in order, the first backend's from 0, the
/// next's after them, so indices stay distinct and `--device` selects across vendors.
pub struct CompositeBackend {
    /// NCCL RAS queries: a host's, whichever vendors' GPUs the job uses.
    ras: crate::ras::Asker,
    parts: Vec<Part>,
    name: &'static str,
    host: HostInfo,
    devices: Vec<DeviceInfo>,
}

struct Part {
    backend: Box<dyn Backend>,
    /// (the part's own index, the composite index) for each of its devices.
    indices: Vec<(u32, u32)>,
}

impl Part {
    fn global(&self, local: u32) -> Option<u32> {
        self.indices
            .iter()
            .find(|(l, _)| *l == local)
            .map(|(_, g)| *g)
    }
}

impl std::fmt::Debug for CompositeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompositeBackend")
            .field("name", &self.name)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl CompositeBackend {
    pub fn new(backends: Vec<Box<dyn Backend>>) -> Self {
        let mut next = 0u32;
        let mut devices = Vec::new();
        let mut host = HostInfo::default();
        let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
        let name = composite_name(&names);
        let parts = backends
            .into_iter()
            .map(|backend| {
                merge_host(&mut host, backend.host());
                let indices = backend
                    .devices()
                    .iter()
                    .map(|d| {
                        let global = next;
                        next += 1;
                        devices.push(DeviceInfo {
                            index: global,
                            ..d.clone()
                        });
                        (d.index, global)
                    })
                    .collect();
                Part { backend, indices }
            })
            .collect();
        CompositeBackend {
            ras: crate::ras::Asker::default(),
            parts,
            name,
            host,
            devices,
        }
    }
}

/// The backend name a report shows, e.g. "nvml+rocm".
fn composite_name(names: &[&str]) -> &'static str {
    match names {
        ["nvml", "rocm"] => "nvml+rocm",
        ["nvml", "sysfs"] => "nvml+sysfs",
        _ => "composite",
    }
}

/// Fills what `host` lacks from `other`: the first backend (NVML) names the driver.
fn merge_host(host: &mut HostInfo, other: &HostInfo) {
    fn fill(a: &mut Option<String>, b: &Option<String>) {
        if a.is_none() {
            a.clone_from(b);
        }
    }
    fill(&mut host.hostname, &other.hostname);
    fill(&mut host.driver_version, &other.driver_version);
    fill(&mut host.cuda_driver_version, &other.cuda_driver_version);
    fill(&mut host.nvml_version, &other.nvml_version);
}

impl Backend for CompositeBackend {
    fn request_ras(&mut self, query: crate::ras::RasQuery) {
        self.ras.request(query);
    }

    fn name(&self) -> &'static str {
        self.name
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
        let mut tick = Tick::default();
        for part in &mut self.parts {
            let t = part.backend.poll()?;
            for mut s in t.samples {
                if let Some(g) = part.global(s.device) {
                    s.device = g;
                    tick.samples.push(s);
                }
            }
            for mut e in t.events {
                e.device = e.device.and_then(|d| part.global(d));
                tick.events.push(e);
            }
        }
        tick.ras = self.ras.ready();
        Ok(tick)
    }

    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        // Each vendor's part knows only its own GPUs; renumber them to the host-wide indices.
        let mut merged = gpudiag_model::topology::Topology::default();
        let mut any = false;
        for part in &self.parts {
            let Some(t) = part.backend.topology() else {
                continue;
            };
            any = true;
            for mut g in t.gpus {
                let Some(index) = part.global(g.index) else {
                    continue;
                };
                g.index = index;
                for l in &mut g.nvlinks {
                    l.remote_gpu = l.remote_gpu.and_then(|r| part.global(r));
                }
                merged.gpus.push(g);
            }
            for mut p in t.pairs {
                let (Some(a), Some(b)) = (part.global(p.a), part.global(p.b)) else {
                    continue;
                };
                (p.a, p.b) = (a.min(b), a.max(b));
                merged.pairs.push(p);
            }
            merged.notes.extend(t.notes);
        }
        any.then_some(merged)
    }

    fn source_warnings(&self) -> Vec<String> {
        self.parts
            .iter()
            .flat_map(|p| p.backend.source_warnings())
            .collect()
    }

    fn wait_for_slow_fields(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        for p in &self.parts {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            p.backend.wait_for_slow_fields(left);
        }
    }

    fn set_slow_interval(&mut self, interval: Duration) {
        for p in &mut self.parts {
            p.backend.set_slow_interval(interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::sample::{Event, EventKind, Sample};

    /// A backend with fixed devices whose poll echoes one sample per device and an event.
    struct Fake {
        name: &'static str,
        host: HostInfo,
        devices: Vec<DeviceInfo>,
    }

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            self.name
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
            Ok(Tick {
                samples: self
                    .devices
                    .iter()
                    .map(|d| Sample::new(d.index, 7))
                    .collect(),
                events: vec![Event {
                    time_ms: 7,
                    device: Some(0),
                    kind: EventKind::Notice {
                        message: self.name.into(),
                    },
                }],
                ras: Vec::new(),
                kernels: None,
            })
        }
    }

    fn fake(name: &'static str, vendor: &str, n: u32, driver: Option<&str>) -> Box<dyn Backend> {
        Box::new(Fake {
            name,
            host: HostInfo {
                driver_version: driver.map(str::to_owned),
                ..HostInfo::default()
            },
            devices: (0..n)
                .map(|i| DeviceInfo {
                    index: i,
                    vendor: Some(vendor.into()),
                    ..DeviceInfo::default()
                })
                .collect(),
        })
    }

    #[test]
    fn devices_of_both_vendors_get_distinct_indices() {
        let mut c = CompositeBackend::new(vec![
            fake("nvml", "NVIDIA", 2, Some("580.65.06")),
            fake("rocm", "AMD", 2, Some("6.8.0")),
        ]);
        assert_eq!(c.name(), "nvml+rocm");
        let seen: Vec<(u32, &str)> = c
            .devices()
            .iter()
            .map(|d| (d.index, d.vendor.as_deref().unwrap()))
            .collect();
        assert_eq!(seen, [(0, "NVIDIA"), (1, "NVIDIA"), (2, "AMD"), (3, "AMD")]);
        assert_eq!(c.host().driver_version.as_deref(), Some("580.65.06"));

        let tick = c.poll().unwrap();
        let devices: Vec<u32> = tick.samples.iter().map(|s| s.device).collect();
        assert_eq!(devices, [0, 1, 2, 3]);
        // Each part's device 0 event lands on that part's first device.
        let events: Vec<Option<u32>> = tick.events.iter().map(|e| e.device).collect();
        assert_eq!(events, [Some(0), Some(2)]);
    }

    #[test]
    fn no_vendor_keeps_nvmls_explanation_first() {
        let e = none_found(
            BackendError::Unavailable("libnvidia-ml.so.1 not found".into()),
            &BackendError::NoDevice("no amdgpu device under /sys/class/drm".into()),
        );
        assert!(matches!(e, BackendError::Unavailable(_)));
        assert_eq!(
            e.to_string(),
            "libnvidia-ml.so.1 not found; no AMD GPU either (no amdgpu device under \
             /sys/class/drm)"
        );
        let e = none_found(
            BackendError::NoDevice("NVML lists no GPU".into()),
            &BackendError::Unavailable("x".into()),
        );
        assert!(matches!(e, BackendError::NoDevice(_)));
    }
}
