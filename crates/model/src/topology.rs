//! How the GPUs of a host connect: for every pair, the PCIe path between them (the levels of
//! `nvidia-smi topo -m`) and the NVLinks they share; for every GPU, its NUMA node, the CPUs near
//! it and the state and error counters of each NVLink (what `nvidia-smi nvlink -s -e` shows).
//!
//! Read once when a backend opens (it changes only with hardware), recorded in a recording's
//! header so replays and bug-report bundles show the host it came from. The mapping from NVML's
//! answers to this model is pure and tested on its own; the NVML reader only gathers answers.

use std::fmt::Write;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The closest point where the PCIe paths of two GPUs meet, from nearest to farthest.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PciePath {
    /// Two GPUs of one board (a dual-GPU card).
    Board,
    /// At most one PCIe switch between them (`PIX`).
    Switch,
    /// Several PCIe switches, no host bridge (`PXB`).
    Switches,
    /// Through a CPU's PCIe host bridge (`PHB`).
    HostBridge,
    /// Across host bridges within one NUMA node (`NODE`).
    NumaNode,
    /// Across NUMA nodes, over the CPU interconnect (`SYS`).
    System,
}

impl PciePath {
    /// The `nvidia-smi topo -m` legend.
    pub fn label(self) -> &'static str {
        match self {
            PciePath::Board => "BRD",
            PciePath::Switch => "PIX",
            PciePath::Switches => "PXB",
            PciePath::HostBridge => "PHB",
            PciePath::NumaNode => "NODE",
            PciePath::System => "SYS",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            PciePath::Board => "on the same board",
            PciePath::Switch => "through one PCIe switch",
            PciePath::Switches => "through several PCIe switches",
            PciePath::HostBridge => "through a CPU host bridge",
            PciePath::NumaNode => "across host bridges of one NUMA node",
            PciePath::System => "across NUMA nodes (CPU interconnect)",
        }
    }
}

/// The peer-to-peer capabilities NVML reports for a pair; each `None` when NVML could not say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct P2pCaps {
    /// "ok", or why not: "chipset_not_supported", "gpu_not_supported",
    /// "topology_not_supported", "disabled_by_regkey", "not_supported", "unknown".
    pub read: Option<String>,
    pub write: Option<String>,
    pub nvlink: Option<String>,
    pub atomics: Option<String>,
}

impl P2pCaps {
    /// True when NVML says reads and writes between the pair work.
    pub fn read_write_ok(&self) -> Option<bool> {
        match (self.read.as_deref(), self.write.as_deref()) {
            (Some(r), Some(w)) => Some(r == "ok" && w == "ok"),
            _ => None,
        }
    }
}

/// How two GPUs connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct GpuPair {
    /// NVML indices, `a < b`.
    pub a: u32,
    pub b: u32,
    /// `None` when NVML could not tell (the reason is in `note`).
    pub pcie_path: Option<PciePath>,
    /// Active NVLinks between them (directly, or through NVSwitches both reach); 0 for none.
    pub nvlinks: u32,
    /// What `nvidia-smi topo -m` prints for the pair: "NV18", "PIX", "SYS", ...; "?" unknown.
    #[schemars(length(min = 1))]
    pub label: String,
    pub p2p: P2pCaps,
    pub note: Option<String>,
}

/// Error counters of one NVLink, as NVML counts them since the driver loaded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NvLinkErrors {
    pub replay: Option<u64>,
    pub recovery: Option<u64>,
    pub crc_flit: Option<u64>,
    pub crc_data: Option<u64>,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NvLink {
    pub link: u32,
    pub active: bool,
    /// The PCI bus id at the far end: another GPU, or an NVSwitch.
    pub remote_pci_bus_id: Option<String>,
    /// The NVML index of the GPU at the far end; `None` for an NVSwitch or an unseen GPU.
    pub remote_gpu: Option<u32>,
}

/// Where one GPU sits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct GpuPlacement {
    pub index: u32,
    pub pci_bus_id: Option<String>,
    pub numa_node: Option<u32>,
    /// The CPUs nearest the GPU, as a Linux CPU list ("0-47,96-143").
    pub cpu_affinity: Option<String>,
    /// Per-link speed NVML reports, in GB/s (1e9 bytes), for links that are up.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub nvlink_speed_gbps: Option<f64>,
    /// NVLink error counters summed over the GPU's links since the driver loaded; each `None`
    /// where NVML does not count it (and all `None` on a GPU without NVLink).
    pub nvlink_errors: NvLinkErrors,
    /// Every link NVML reports, active or not; empty where the GPU has none.
    pub nvlinks: Vec<NvLink>,
}

impl GpuPlacement {
    pub fn active_links(&self) -> usize {
        self.nvlinks.iter().filter(|l| l.active).count()
    }
}

/// The host's GPU topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Topology {
    pub gpus: Vec<GpuPlacement>,
    /// Every unordered pair once, `a < b`, in index order; empty on a one-GPU host.
    pub pairs: Vec<GpuPair>,
    /// What could not be read, once per cause.
    pub notes: Vec<String>,
}

impl Topology {
    pub fn pair(&self, x: u32, y: u32) -> Option<&GpuPair> {
        let (a, b) = (x.min(y), x.max(y));
        self.pairs.iter().find(|p| p.a == a && p.b == b)
    }

    /// Keeps only the GPUs in `indices` (a `--device` selection) and the pairs among them.
    pub fn restricted_to(&self, indices: &[u32]) -> Topology {
        Topology {
            gpus: self
                .gpus
                .iter()
                .filter(|g| indices.contains(&g.index))
                .cloned()
                .collect(),
            pairs: self
                .pairs
                .iter()
                .filter(|p| indices.contains(&p.a) && indices.contains(&p.b))
                .cloned()
                .collect(),
            notes: self.notes.clone(),
        }
    }
}

/// The NVLinks two GPUs share. Links straight to the other GPU count as they are; links into
/// a switch fabric (the far end is no GPU of this host) connect every pair of GPUs that both
/// reach it, and the pair gets the smaller of the two counts, as `nvidia-smi topo -m` shows it.
pub fn shared_nvlinks(a: &GpuPlacement, b: &GpuPlacement) -> u32 {
    let direct = a
        .nvlinks
        .iter()
        .filter(|l| l.active && l.remote_gpu == Some(b.index))
        .count();
    if direct > 0 {
        return direct as u32;
    }
    let fabric = |g: &GpuPlacement| {
        g.nvlinks
            .iter()
            .filter(|l| l.active && l.remote_gpu.is_none() && l.remote_pci_bus_id.is_some())
            .count()
    };
    fabric(a).min(fabric(b)) as u32
}

/// The `nvidia-smi topo -m` cell for a pair.
pub fn pair_label(pcie_path: Option<PciePath>, nvlinks: u32) -> String {
    match (nvlinks, pcie_path) {
        (n, _) if n > 0 => format!("NV{n}"),
        (_, Some(p)) => p.label().to_owned(),
        (_, None) => "?".to_owned(),
    }
}

/// A CPU bit mask (64-bit words, lowest CPUs first, as NVML returns it) as a Linux CPU list.
pub fn cpu_list(mask: &[u64]) -> Option<String> {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (w, word) in mask.iter().enumerate() {
        for bit in 0..64 {
            if word & (1u64 << bit) == 0 {
                continue;
            }
            let cpu = w * 64 + bit;
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == cpu => *end = cpu,
                _ => ranges.push((cpu, cpu)),
            }
        }
    }
    if ranges.is_empty() {
        return None;
    }
    Some(
        ranges
            .iter()
            .map(|(s, e)| {
                if s == e {
                    s.to_string()
                } else {
                    format!("{s}-{e}")
                }
            })
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// Fills in each pair's NVLink count and label from the placements.
pub fn finish_pairs(gpus: &[GpuPlacement], pairs: &mut [GpuPair]) {
    for p in pairs.iter_mut() {
        let (Some(a), Some(b)) = (
            gpus.iter().find(|g| g.index == p.a),
            gpus.iter().find(|g| g.index == p.b),
        ) else {
            continue;
        };
        p.nvlinks = shared_nvlinks(a, b);
        p.label = pair_label(p.pcie_path, p.nvlinks);
    }
}

/// The topology as text: the `nvidia-smi topo -m` matrix with NUMA and CPU affinity columns,
/// then one line per GPU with NVLinks (how many are up, their speed, errors).
pub fn render(t: &Topology) -> String {
    // A topology may come from a recording: its strings are data, not trusted text.
    use crate::printable::line as esc;
    let mut out = String::new();
    if t.gpus.is_empty() {
        out.push_str("Topology: not available\n");
    } else if t.gpus.len() == 1 {
        let g = &t.gpus[0];
        let _ = writeln!(
            out,
            "Topology: one GPU (GPU {}), no GPU pairs to compare; NUMA node {}, CPUs {}",
            g.index,
            g.numa_node.map_or("n/a".into(), |n| n.to_string()),
            esc(g.cpu_affinity.as_deref().unwrap_or("n/a")),
        );
    } else {
        out.push_str("Topology:\n       ");
        for g in &t.gpus {
            let _ = write!(out, " {:>6}", format!("GPU{}", g.index));
        }
        out.push_str("  NUMA  CPUs\n");
        for g in &t.gpus {
            let _ = write!(out, "  {:<5}", format!("GPU{}", g.index));
            for h in &t.gpus {
                let cell = if g.index == h.index {
                    "X".to_owned()
                } else {
                    t.pair(g.index, h.index)
                        .map_or("?".to_owned(), |p| esc(&p.label).into_owned())
                };
                let _ = write!(out, " {cell:>6}");
            }
            let _ = writeln!(
                out,
                "  {:>4}  {}",
                g.numa_node.map_or("n/a".into(), |n| n.to_string()),
                esc(g.cpu_affinity.as_deref().unwrap_or("n/a"))
            );
        }
        for p in &t.pairs {
            if p.p2p.read_write_ok() == Some(false) {
                let _ = writeln!(
                    out,
                    "  GPU{} <-> GPU{}: peer access not available (read {}, write {})",
                    p.a,
                    p.b,
                    esc(p.p2p.read.as_deref().unwrap_or("?")),
                    esc(p.p2p.write.as_deref().unwrap_or("?"))
                );
            }
        }
    }
    for g in t.gpus.iter().filter(|g| !g.nvlinks.is_empty()) {
        let e = &g.nvlink_errors;
        let count = |v: Option<u64>| v.map_or("n/a".to_owned(), |n| n.to_string());
        let _ = writeln!(
            out,
            "  GPU{} NVLink: {}/{} links up{}; errors since driver load: replay {}, recovery {}, \
             CRC flit {}, CRC data {}",
            g.index,
            g.active_links(),
            g.nvlinks.len(),
            g.nvlink_speed_gbps
                .map(|s| format!(" at {s:.1} GB/s each"))
                .unwrap_or_default(),
            count(e.replay),
            count(e.recovery),
            count(e.crc_flit),
            count(e.crc_data),
        );
    }
    for n in &t.notes {
        let _ = writeln!(out, "  note: {}", esc(n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(link: u32, active: bool, remote: Option<u32>, bus: &str) -> NvLink {
        NvLink {
            link,
            active,
            remote_pci_bus_id: Some(bus.into()),
            remote_gpu: remote,
        }
    }

    fn gpu(index: u32, nvlinks: Vec<NvLink>) -> GpuPlacement {
        GpuPlacement {
            index,
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x19 + index)),
            numa_node: Some(index / 4),
            cpu_affinity: Some("0-47".into()),
            nvlink_speed_gbps: Some(26.562),
            nvlink_errors: NvLinkErrors::default(),
            nvlinks,
        }
    }

    #[test]
    fn switch_fabric_links_count_the_smaller_side() {
        // HGX H200: 18 links from each GPU into NVSwitches; one GPU has two links down.
        let a = gpu(0, (0..18).map(|l| link(l, true, None, "switch")).collect());
        let b = gpu(
            1,
            (0..18).map(|l| link(l, l >= 2, None, "switch")).collect(),
        );
        assert_eq!(shared_nvlinks(&a, &b), 16);
        assert_eq!(pair_label(Some(PciePath::System), 16), "NV16");
    }

    #[test]
    fn direct_links_count_only_those_to_the_other_gpu() {
        let a = gpu(
            0,
            vec![
                link(0, true, Some(1), "b"),
                link(1, true, Some(1), "b"),
                link(2, true, Some(2), "c"),
                link(3, false, Some(1), "b"),
            ],
        );
        let b = gpu(
            1,
            vec![link(0, true, Some(0), "a"), link(1, true, Some(0), "a")],
        );
        let c = gpu(2, vec![link(0, true, Some(0), "a")]);
        assert_eq!(shared_nvlinks(&a, &b), 2);
        assert_eq!(shared_nvlinks(&a, &c), 1);
        // b and c share no link and reach no switch.
        assert_eq!(shared_nvlinks(&b, &c), 0);
    }

    #[test]
    fn pcie_only_pairs_get_the_nvidia_smi_legend() {
        assert_eq!(pair_label(Some(PciePath::Switch), 0), "PIX");
        assert_eq!(pair_label(Some(PciePath::Switches), 0), "PXB");
        assert_eq!(pair_label(Some(PciePath::HostBridge), 0), "PHB");
        assert_eq!(pair_label(Some(PciePath::NumaNode), 0), "NODE");
        assert_eq!(pair_label(Some(PciePath::System), 0), "SYS");
        assert_eq!(pair_label(None, 0), "?");
        assert!(PciePath::Switch < PciePath::System);
    }

    #[test]
    fn cpu_masks_become_cpu_lists() {
        assert_eq!(cpu_list(&[0]), None);
        assert_eq!(cpu_list(&[0b1]), Some("0".into()));
        assert_eq!(cpu_list(&[0xffff_ffff_ffff]), Some("0-47".into()));
        // CPUs 0-47 and 96-143 (two words and a bit): a two-socket host's first node with SMT.
        let mask = [0x0000_ffff_ffff_ffff, 0xffff_ffff_0000_0000, 0xffff];
        assert_eq!(cpu_list(&mask), Some("0-47,96-143".into()));
        assert_eq!(cpu_list(&[0b1010]), Some("1,3".into()));
    }

    #[test]
    fn pairs_take_labels_and_render_as_a_matrix() {
        let gpus = vec![
            gpu(0, (0..18).map(|l| link(l, true, None, "sw")).collect()),
            gpu(1, (0..18).map(|l| link(l, true, None, "sw")).collect()),
        ];
        let mut pairs = vec![GpuPair {
            a: 0,
            b: 1,
            pcie_path: Some(PciePath::System),
            nvlinks: 0,
            label: String::new(),
            p2p: P2pCaps {
                read: Some("ok".into()),
                write: Some("ok".into()),
                nvlink: Some("ok".into()),
                atomics: Some("ok".into()),
            },
            note: None,
        }];
        finish_pairs(&gpus, &mut pairs);
        assert_eq!(pairs[0].label, "NV18");
        let t = Topology {
            gpus,
            pairs,
            notes: vec![],
        };
        let text = render(&t);
        assert!(text.contains("  GPU0       X   NV18"), "{text}");
        assert!(
            text.contains("GPU1 NVLink: 18/18 links up at 26.6 GB/s each"),
            "{text}"
        );
        let one = t.restricted_to(&[1]);
        assert!(one.pairs.is_empty());
        assert!(render(&one).contains("one GPU (GPU 1), no GPU pairs to compare"));
    }

    #[test]
    fn refused_peer_access_is_called_out() {
        let t = Topology {
            gpus: vec![gpu(0, vec![]), gpu(1, vec![])],
            pairs: vec![GpuPair {
                a: 0,
                b: 1,
                pcie_path: Some(PciePath::System),
                nvlinks: 0,
                label: "SYS".into(),
                p2p: P2pCaps {
                    read: Some("chipset_not_supported".into()),
                    write: Some("chipset_not_supported".into()),
                    nvlink: None,
                    atomics: None,
                },
                note: None,
            }],
            notes: vec![],
        };
        let text = render(&t);
        assert!(
            text.contains("GPU0 <-> GPU1: peer access not available (read chipset_not_supported"),
            "{text}"
        );
    }
}
