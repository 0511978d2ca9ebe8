//! How the GPUs connect: PCIe paths, NVLinks and their errors, NUMA and CPU affinity, and
//! peer-to-peer support. Read once, on its own thread from the moment the backend opens, so its
//! many NVML calls (per GPU, per link, per pair) overlap the first poll instead of delaying it;
//! every failure becomes a `None` and a note, never a guess.

use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;

use gpudiag_model::topology::NvLinkErrors;

use super::absent_from;

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
