//! The environment of the host that writes a bug-report bundle: OS and kernel, CPU, memory,
//! CUDA libraries, the environment variables of [`KEPT_VARIABLES`], container detection, PCI
//! topology and NUMA node of each GPU from sysfs, and kernel log lines about NVRM/Xid where
//! readable. Every part says why it is missing rather than leaving a hole. The sysfs and proc
//! roots and the kernel log are parameters so tests can point them at fake trees and files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use gpudiag_model::cuda_libraries::{self, LibraryInfo};
use gpudiag_model::sample::{DeviceInfo, HostInfo};
use gpudiag_telemetry::kernel_log::KernelLogSource;
use gpudiag_telemetry::kernel_log::{self, LogRead};

/// Kernel log lines kept at most (the newest).
const MAX_KLOG_LINES: usize = 200;

/// The environment variables a bundle keeps: those whose meaning gpudiag knows and which change
/// which GPUs a process sees or how the GPU stack behaves. A list of names rather than of
/// prefixes, because `CUDA_PASSWORD` or `NVIDIA_API_KEY` match any prefix a GPU variable has;
/// the values kept are still searched for credentials like every other string of the bundle.
/// The README lists the same names.
pub const KEPT_VARIABLES: [&str; 43] = [
    // Which GPUs a process sees, and in which order.
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    // The NVIDIA container runtime's view of the driver.
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA",
    "NVIDIA_DISABLE_REQUIRE",
    "CUDA_VERSION",
    // CUDA behaviour: launches, module loading, the JIT cache, MPS, managed memory.
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_CACHE_DISABLE",
    "CUDA_CACHE_MAXSIZE",
    "CUDA_CACHE_PATH",
    "CUDA_FORCE_PTX_JIT",
    "CUDA_DISABLE_PTX_JIT",
    "CUDA_MANAGED_FORCE_DEVICE_ALLOC",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_HOME",
    "CUDA_PATH",
    "PYTORCH_CUDA_ALLOC_CONF",
    // NCCL, behind the all-reduce probe and most multi-GPU jobs.
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_DEBUG",
    // ROCm.
    "ROCM_PATH",
    "HSA_OVERRIDE_GFX_VERSION",
    // Where the vendor libraries gpudiag loads at run time come from.
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    // The scheduler's job and the GPUs it gave the job.
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    // gpudiag's own.
    "GPUDIAG_CONFIG",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// Which host this file describes (the one that wrote the bundle, which for a replay is not
    /// the one that recorded the telemetry).
    pub describes: String,
    pub hostname: Option<String>,
    pub os: OsInfo,
    pub cpu: CpuInfo,
    pub memory_total_bytes: Option<u64>,
    /// Driver and NVML versions of the telemetry source.
    pub driver: HostInfo,
    pub libraries: Vec<LibraryInfo>,
    /// The variables of [`KEPT_VARIABLES`] the gpudiag process has (redactable).
    pub env: BTreeMap<String, String>,
    pub container: ContainerInfo,
    /// One entry per GPU of a live source; empty for a replay (this host's PCI tree says
    /// nothing about the recorded GPUs).
    pub pci: Vec<PciInfo>,
    pub kernel_log: KernelLog,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsInfo {
    /// PRETTY_NAME of /etc/os-release.
    pub name: Option<String>,
    pub id: Option<String>,
    pub version_id: Option<String>,
    pub kernel_release: Option<String>,
    /// /proc/version: build string of the kernel.
    pub kernel_version: Option<String>,
    pub arch: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub model: Option<String>,
    pub logical_cpus: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerInfo {
    pub detected: bool,
    /// "docker", "podman", "kubernetes", "containerd", "lxc" when a marker says which.
    pub runtime: Option<String>,
    /// The markers found.
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciInfo {
    pub gpu: u32,
    pub bus_id: Option<String>,
    /// The sysfs directory read.
    pub sysfs_path: Option<String>,
    /// `None` when the platform has no NUMA (sysfs says -1) or the file is missing; see `note`.
    pub numa_node: Option<u32>,
    pub current_link_speed: Option<String>,
    pub current_link_width: Option<u32>,
    pub max_link_speed: Option<String>,
    pub max_link_width: Option<u32>,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelLog {
    pub readable: bool,
    /// "/dev/kmsg", "dmesg" or the file read.
    pub source: Option<String>,
    /// Why it could not be read, or that nothing matched.
    pub note: Option<String>,
    /// The newest lines mentioning NVRM or Xid.
    pub lines: Vec<String>,
}

/// Where to read host facts from; `/` in production.
#[derive(Debug, Clone)]
pub struct Roots {
    pub sys: PathBuf,
    pub etc: PathBuf,
    pub proc_: PathBuf,
    /// Root of the container markers (/.dockerenv, /run/.containerenv).
    pub root: PathBuf,
    pub kernel_log: KernelLogSource,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            sys: "/sys".into(),
            etc: "/etc".into(),
            proc_: "/proc".into(),
            root: "/".into(),
            kernel_log: KernelLogSource::from_env(),
        }
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Collects the environment; `live` says whether `devices` are on this host.
pub fn collect(roots: &Roots, host: &HostInfo, devices: &[DeviceInfo], live: bool) -> Environment {
    Environment {
        describes: if live {
            "the host that recorded the telemetry and wrote this bundle".into()
        } else {
            "the host that wrote this bundle from a recording made elsewhere (see the \
             recording's header for the recording host)"
                .into()
        },
        hostname: read_trim(&roots.proc_.join("sys/kernel/hostname"))
            .or_else(|| gethostname::gethostname().into_string().ok()),
        os: os_info(roots),
        cpu: cpu_info(roots),
        memory_total_bytes: mem_total(roots),
        driver: host.clone(),
        libraries: cuda_libraries::detect_libraries(),
        // `vars_os`: one variable that is not UTF-8 would make `vars` panic.
        env: std::env::vars_os()
            .filter_map(|(k, v)| {
                let k = k.into_string().ok()?;
                KEPT_VARIABLES
                    .contains(&k.as_str())
                    .then(|| (k, v.to_string_lossy().into_owned()))
            })
            .collect(),
        container: container(roots),
        pci: if live {
            devices.iter().map(|d| pci_info(roots, d)).collect()
        } else {
            Vec::new()
        },
        kernel_log: match &roots.kernel_log {
            KernelLogSource::System => kernel_log(),
            KernelLogSource::Off => KernelLog {
                readable: false,
                source: None,
                note: Some("not read".into()),
                lines: Vec::new(),
            },
            file => match kernel_log::read_matching(file, is_gpu_line) {
                Ok(read) => found(read),
                Err(e) => KernelLog {
                    readable: false,
                    source: None,
                    note: Some(format!("not readable: {e}")),
                    lines: Vec::new(),
                },
            },
        },
    }
}

fn os_info(roots: &Roots) -> OsInfo {
    let release = std::fs::read_to_string(roots.etc.join("os-release")).unwrap_or_default();
    let field = |key: &str| {
        release.lines().find_map(|l| {
            let v = l.strip_prefix(key)?.strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
    };
    OsInfo {
        name: field("PRETTY_NAME"),
        id: field("ID"),
        version_id: field("VERSION_ID"),
        kernel_release: read_trim(&roots.proc_.join("sys/kernel/osrelease")),
        kernel_version: read_trim(&roots.proc_.join("version")),
        arch: std::env::consts::ARCH.into(),
    }
}

fn cpu_info(roots: &Roots) -> CpuInfo {
    let text = std::fs::read_to_string(roots.proc_.join("cpuinfo")).unwrap_or_default();
    let model = text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        matches!(k.trim(), "model name" | "Model" | "cpu model").then(|| v.trim().to_string())
    });
    let n = text.lines().filter(|l| l.starts_with("processor")).count();
    CpuInfo {
        model,
        logical_cpus: (n > 0).then_some(n),
    }
}

fn mem_total(roots: &Roots) -> Option<u64> {
    let text = std::fs::read_to_string(roots.proc_.join("meminfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn container(roots: &Roots) -> ContainerInfo {
    let mut evidence = Vec::new();
    let mut runtime = None;
    if roots.root.join(".dockerenv").exists() {
        evidence.push("/.dockerenv exists".to_string());
        runtime = Some("docker");
    }
    if roots.root.join("run/.containerenv").exists() {
        evidence.push("/run/.containerenv exists".to_string());
        runtime = Some("podman");
    }
    let cgroup = std::fs::read_to_string(roots.proc_.join("1/cgroup")).unwrap_or_default();
    for (marker, name) in [
        ("kubepods", "kubernetes"),
        ("docker", "docker"),
        ("containerd", "containerd"),
        ("libpod", "podman"),
        ("lxc", "lxc"),
    ] {
        if cgroup.contains(marker) {
            evidence.push(format!("/proc/1/cgroup mentions {marker}"));
            runtime = runtime.or(Some(name));
        }
    }
    ContainerInfo {
        detected: !evidence.is_empty(),
        runtime: runtime.map(str::to_string),
        evidence,
    }
}

/// NVML writes bus ids as `00000000:81:00.0`; sysfs as `0000:81:00.0`, lowercase.
pub fn sysfs_bus_id(nvml: &str) -> Option<String> {
    let (domain, rest) = nvml.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

fn pci_info(roots: &Roots, d: &DeviceInfo) -> PciInfo {
    let mut info = PciInfo {
        gpu: d.index,
        bus_id: d.pci_bus_id.clone(),
        sysfs_path: None,
        numa_node: None,
        current_link_speed: None,
        current_link_width: None,
        max_link_speed: None,
        max_link_width: None,
        note: None,
    };
    let Some(id) = d.pci_bus_id.as_deref().and_then(sysfs_bus_id) else {
        info.note = Some("the GPU reported no PCI bus id".into());
        return info;
    };
    let dir = roots.sys.join("bus/pci/devices").join(&id);
    info.sysfs_path = Some(dir.display().to_string());
    if !dir.is_dir() {
        info.note = Some(format!("{} does not exist", dir.display()));
        return info;
    }
    let numa = read_trim(&dir.join("numa_node"));
    info.numa_node = numa.as_deref().and_then(|n| n.parse().ok());
    if numa.as_deref() == Some("-1") {
        info.note = Some("numa_node is -1: the platform reports no NUMA affinity".into());
    }
    info.current_link_speed = read_trim(&dir.join("current_link_speed"));
    info.current_link_width =
        read_trim(&dir.join("current_link_width")).and_then(|w| w.parse().ok());
    info.max_link_speed = read_trim(&dir.join("max_link_speed"));
    info.max_link_width = read_trim(&dir.join("max_link_width")).and_then(|w| w.parse().ok());
    info
}

fn is_gpu_line(l: &str) -> bool {
    l.contains("NVRM") || l.contains("Xid") || l.contains("nvidia")
}

/// The kernel log's NVRM/Xid lines: /dev/kmsg read without blocking, else `dmesg` (which can
/// still answer where /dev/kmsg is missing but syslog(2) is allowed).
fn kernel_log() -> KernelLog {
    let kmsg_err = match kernel_log::read_matching(&KernelLogSource::System, is_gpu_line) {
        Ok(read) => return found(read),
        Err(e) => e,
    };
    match std::process::Command::new("dmesg")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            found(LogRead {
                source: "dmesg".into(),
                lines: text
                    .lines()
                    .map(kernel_log::parse_line)
                    .filter(|l| is_gpu_line(&l.text))
                    .collect(),
                truncated: None,
            })
        }
        Ok(out) => KernelLog {
            readable: false,
            source: None,
            note: Some(format!(
                "not readable: {kmsg_err}; dmesg exited with {}",
                out.status
            )),
            lines: Vec::new(),
        },
        Err(e) => KernelLog {
            readable: false,
            source: None,
            note: Some(format!("not readable: {kmsg_err}; dmesg: {e}")),
            lines: Vec::new(),
        },
    }
}

/// The newest lines, as `dmesg` prints them (with their time since boot where known).
fn found(read: LogRead) -> KernelLog {
    let mut lines: Vec<String> = read.lines.iter().map(|l| l.dmesg_style()).collect();
    if lines.len() > MAX_KLOG_LINES {
        lines.drain(..lines.len() - MAX_KLOG_LINES);
    }
    let note = match (&read.truncated, lines.is_empty()) {
        (Some(why), _) => Some(format!("read in part: {why}")),
        (None, true) => Some("no line mentions NVRM, Xid or nvidia".into()),
        (None, false) => None,
    };
    KernelLog {
        readable: true,
        source: Some(read.source),
        note,
        lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_map_to_sysfs_names() {
        assert_eq!(
            sysfs_bus_id("00000000:81:00.0").as_deref(),
            Some("0000:81:00.0")
        );
        assert_eq!(
            sysfs_bus_id("00000001:C1:00.0").as_deref(),
            Some("0001:c1:00.0")
        );
        assert_eq!(sysfs_bus_id("garbage"), None);
    }

    #[test]
    fn pci_numa_and_container_from_fake_trees() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("sys/bus/pci/devices/0000:81:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        for (f, v) in [
            ("numa_node", "1\n"),
            ("current_link_speed", "16.0 GT/s PCIe\n"),
            ("current_link_width", "8\n"),
            ("max_link_speed", "32.0 GT/s PCIe\n"),
            ("max_link_width", "16\n"),
        ] {
            std::fs::write(dev.join(f), v).unwrap();
        }
        let dev2 = root.path().join("sys/bus/pci/devices/0000:82:00.0");
        std::fs::create_dir_all(&dev2).unwrap();
        std::fs::write(dev2.join("numa_node"), "-1\n").unwrap();
        std::fs::create_dir_all(root.path().join("proc/1")).unwrap();
        std::fs::write(
            root.path().join("proc/1/cgroup"),
            "0::/kubepods/besteffort/pod1\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/os-release"),
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n",
        )
        .unwrap();
        std::fs::write(root.path().join(".dockerenv"), "").unwrap();
        let roots = Roots {
            sys: root.path().join("sys"),
            etc: root.path().join("etc"),
            proc_: root.path().join("proc"),
            root: root.path().to_path_buf(),
            kernel_log: KernelLogSource::Off,
        };
        let devices = [
            DeviceInfo {
                index: 0,
                pci_bus_id: Some("00000000:81:00.0".into()),
                ..DeviceInfo::default()
            },
            DeviceInfo {
                index: 1,
                pci_bus_id: Some("00000000:82:00.0".into()),
                ..DeviceInfo::default()
            },
            DeviceInfo {
                index: 2,
                ..DeviceInfo::default()
            },
        ];
        let env = collect(&roots, &HostInfo::default(), &devices, true);
        assert_eq!(env.pci[0].numa_node, Some(1));
        assert_eq!(env.pci[0].current_link_width, Some(8));
        assert_eq!(env.pci[0].max_link_width, Some(16));
        assert_eq!(
            env.pci[0].current_link_speed.as_deref(),
            Some("16.0 GT/s PCIe")
        );
        assert_eq!(env.pci[1].numa_node, None);
        assert!(env.pci[1].note.as_deref().unwrap().contains("-1"));
        assert!(
            env.pci[2]
                .note
                .as_deref()
                .unwrap()
                .contains("no PCI bus id")
        );
        assert!(env.container.detected);
        assert_eq!(env.container.runtime.as_deref(), Some("docker"));
        assert_eq!(env.container.evidence.len(), 2);
        assert_eq!(
            env.os.name.as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(env.os.version_id.as_deref(), Some("12"));
        assert!(!env.kernel_log.readable);
        // A replay does not describe this host's PCI tree.
        assert!(
            collect(&roots, &HostInfo::default(), &devices, false)
                .pci
                .is_empty()
        );
    }
}
