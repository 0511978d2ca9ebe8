//! AMD GPUs: the ROCm SMI backend (`rocm`), the amdgpu sysfs backend (`sysfs`) for hosts without
//! ROCm, and the facts both need, kept here so the two cannot disagree: the vendor name, the
//! architecture and marketing name of known PCI device ids, and what gpudiag cannot do on AMD yet.

pub mod rocm;
pub mod sysfs;

/// `DeviceInfo::vendor` of every AMD GPU.
pub const VENDOR: &str = "AMD";

/// The PCI vendor id of AMD/ATI graphics (0x1022 is AMD's CPU and chipset side).
pub const PCI_VENDOR_ID: u16 = 0x1002;

/// What `probe` says for an AMD device: the probe kernels ship as PTX and run through the CUDA
/// driver, so there is nothing to run on an AMD GPU yet. The probes subcommand prints this
/// (with the device) instead of trying.
pub const PROBES_UNAVAILABLE: &str = "AMD probes are not available yet";

/// `PROBES_UNAVAILABLE` when `info` is an AMD device, so the probe runner can refuse it with a
/// plain message instead of failing inside a CUDA call.
/// The two profiling counters AMD has: amdgpu's busy percentages are the GFX engine's and the
/// memory controller's activity averaged over the firmware's interval (what `gpu_metrics` calls
/// `average_gfx_activity` and `average_umc_activity`), the same meaning as DCGM's graphics
/// engine active and DRAM active. The other profiling counters have no AMD source.
pub(crate) fn engine_activity(
    s: &mut gpudiag_model::sample::Sample,
    absent: &mut gpudiag_model::sample::AbsentMap,
) {
    s.gr_engine_active_pct = s.gpu_util_pct;
    s.dram_active_pct = s.mem_util_pct;
    for (to, from) in [
        ("gr_engine_active_pct", "gpu_util_pct"),
        ("dram_active_pct", "mem_util_pct"),
    ] {
        if let Some(why) = absent.get(from).cloned() {
            absent.insert(to.into(), why);
        }
    }
}

pub fn probes_unavailable(info: &gpudiag_model::sample::DeviceInfo) -> Option<&'static str> {
    is_amd(info).then_some(PROBES_UNAVAILABLE)
}

/// True when `info` describes an AMD GPU.
pub fn is_amd(info: &gpudiag_model::sample::DeviceInfo) -> bool {
    info.vendor.as_deref() == Some(VENDOR)
}

/// Known device ids: (PCI device id, architecture, marketing name). Names only where one id is one
/// product; ids shared by several boards (e.g. 0x744c: RX 7900 XTX and XT) carry the family.
/// Sources: the amdgpu driver's PCI id list and AMD's product pages.
const KNOWN: &[(u16, &str, &str)] = &[
    (0x74a0, "CDNA3", "AMD Instinct MI300A"),
    (0x74a1, "CDNA3", "AMD Instinct MI300X"),
    (0x74a5, "CDNA3", "AMD Instinct MI325X"),
    (0x74a9, "CDNA3", "AMD Instinct MI308X"),
    (0x74b5, "CDNA3", "AMD Instinct MI300X VF"),
    (0x7408, "CDNA2", "AMD Instinct MI250X"),
    (0x740c, "CDNA2", "AMD Instinct MI250X / MI250"),
    (0x740f, "CDNA2", "AMD Instinct MI210"),
    (0x738c, "CDNA", "AMD Instinct MI100"),
    (0x66a1, "GCN5", "AMD Instinct MI50 / MI60"),
    (0x66af, "GCN5", "AMD Radeon VII"),
    (0x7550, "RDNA4", "AMD Radeon RX 9070 series"),
    (0x744c, "RDNA3", "AMD Radeon RX 7900 XT / XTX"),
    (0x7448, "RDNA3", "AMD Radeon Pro W7900"),
    (0x747e, "RDNA3", "AMD Radeon RX 7700 XT / 7800 XT"),
    (0x7480, "RDNA3", "AMD Radeon RX 7600 series"),
    (0x73bf, "RDNA2", "AMD Radeon RX 6800 / 6900 series"),
    (0x73df, "RDNA2", "AMD Radeon RX 6700 series"),
    (0x73ff, "RDNA2", "AMD Radeon RX 6600 series"),
    (0x731f, "RDNA", "AMD Radeon RX 5700 series"),
];

/// The architecture of a PCI device id, when it is in the table.
pub fn architecture(device_id: u16) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(id, _, _)| *id == device_id)
        .map(|(_, arch, _)| *arch)
}

/// The marketing name of a PCI device id, when it is in the table. Used only when the board does
/// not name itself (Radeon cards have no FRU `product_name`).
pub fn product_name(device_id: u16) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(id, _, _)| *id == device_id)
        .map(|(_, _, name)| *name)
}

/// Parses a PCI id as sysfs writes it ("0x74a1").
pub fn parse_pci_id(text: &str) -> Option<u16> {
    let t = text.trim();
    let hex = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
    u16::from_str_radix(hex, 16).ok()
}

/// A PCI address in sysfs form ("0000:03:00.0") from ROCm SMI's packed BDF id:
/// domain << 32 | bus << 8 | device << 3 | function.
pub fn bus_id_from_bdf(bdf: u64) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        (bdf >> 32) & 0xffff_ffff,
        (bdf >> 8) & 0xff,
        (bdf >> 3) & 0x1f,
        bdf & 0x7
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::sample::DeviceInfo;

    #[test]
    fn known_ids_have_an_architecture_and_unknown_ones_none() {
        assert_eq!(architecture(0x74a1), Some("CDNA3"));
        assert_eq!(architecture(0x744c), Some("RDNA3"));
        assert_eq!(architecture(0x1234), None);
        assert_eq!(product_name(0x74a1), Some("AMD Instinct MI300X"));
        assert_eq!(product_name(0x1234), None);
    }

    #[test]
    fn pci_ids_parse_as_sysfs_writes_them() {
        assert_eq!(parse_pci_id("0x74a1\n"), Some(0x74a1));
        assert_eq!(parse_pci_id("0x1002"), Some(PCI_VENDOR_ID));
        assert_eq!(parse_pci_id("74a1"), None);
        assert_eq!(parse_pci_id("0xzz"), None);
    }

    #[test]
    fn bdf_ids_become_sysfs_bus_ids() {
        // 0000:c1:00.0 as ROCm SMI packs it.
        assert_eq!(bus_id_from_bdf(0xc1 << 8), "0000:c1:00.0");
        assert_eq!(
            bus_id_from_bdf((1 << 32) | (0x03 << 8) | (0x1f << 3) | 7),
            "0001:03:1f.7"
        );
    }

    #[test]
    fn probes_refuse_amd_devices_only() {
        let amd = DeviceInfo {
            vendor: Some(VENDOR.into()),
            ..DeviceInfo::default()
        };
        let nvidia = DeviceInfo {
            vendor: Some("NVIDIA".into()),
            ..DeviceInfo::default()
        };
        assert_eq!(probes_unavailable(&amd), Some(PROBES_UNAVAILABLE));
        assert_eq!(probes_unavailable(&nvidia), None);
    }
}
