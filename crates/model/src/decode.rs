//! Decoders shared by every layer: NVML's throttle-reason bits and what a PCIe link can carry.

/// NVML's clock-event (throttle) reason bits (`nvmlClocksEventReason*` in nvml.h).
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// Decodes throttle bits into names, lowest bit first; each unknown bit becomes
/// `unknown_0x<bit>`. No bits set (NVML's `None`) gives an empty list.
pub fn throttle_reason_names(bits: u64) -> Vec<String> {
    (0..64)
        .map(|i| 1u64 << i)
        .filter(|bit| bits & bit != 0)
        .map(|bit| {
            THROTTLE_REASONS
                .iter()
                .find(|(b, _)| *b == bit)
                .map(|(_, name)| (*name).to_string())
                .unwrap_or_else(|| format!("unknown_{bit:#x}"))
        })
        .collect()
}

/// What one PCIe link can carry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PcieLinkRate {
    /// Signalling rate per lane, GT/s.
    pub gt_per_s_per_lane: f64,
    /// Share of the raw bits that carry data after line encoding.
    pub encoding_efficiency: f64,
    /// Usable bytes per second in each direction over all lanes, after line encoding only
    /// (TLP/DLLP protocol overhead is not subtracted; real copies reach ~85-90 % of this).
    pub bytes_per_s: f64,
}

/// The link rate of PCIe generation `generation` (1..=6) at `width` lanes.
///
/// Gen 1 and 2 use 8b/10b encoding (80 %), Gen 3 to 5 use 128b/130b (98.46 %). Gen 6 runs PAM4
/// at 64 GT/s in FLIT mode: of each 256-byte flit, 6 bytes are CRC and 8 bytes FEC, leaving
/// 242/256 (94.5 %) for TLPs and DLLPs. Unknown generations or a zero width give `None`.
pub fn pcie_link_rate(generation: u32, width: u32) -> Option<PcieLinkRate> {
    let (gt, efficiency) = match generation {
        1 => (2.5, 8.0 / 10.0),
        2 => (5.0, 8.0 / 10.0),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    if width == 0 {
        return None;
    }
    Some(PcieLinkRate {
        gt_per_s_per_lane: gt,
        encoding_efficiency: efficiency,
        bytes_per_s: gt * 1e9 * efficiency / 8.0 * f64::from(width),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_bits_decode_to_names() {
        assert!(throttle_reason_names(0).is_empty());
        assert_eq!(throttle_reason_names(0x1), ["gpu_idle"]);
        assert_eq!(throttle_reason_names(0x4), ["sw_power_cap"]);
        assert_eq!(throttle_reason_names(0x100), ["display_clock_setting"]);
        // Power cap plus HW thermal, as under a sustained load in a hot chassis.
        assert_eq!(
            throttle_reason_names(0x44),
            ["sw_power_cap", "hw_thermal_slowdown"]
        );
        assert_eq!(
            throttle_reason_names(0x1ff),
            THROTTLE_REASONS.map(|(_, n)| n)
        );
        assert_eq!(
            throttle_reason_names(0x208),
            ["hw_slowdown", "unknown_0x200"]
        );
        assert_eq!(
            throttle_reason_names(1 << 63),
            ["unknown_0x8000000000000000"]
        );
    }

    #[test]
    fn pcie_link_rates() {
        let close = |a: f64, b: f64| (a - b).abs() / b < 1e-9;
        let g1 = pcie_link_rate(1, 1).unwrap();
        assert_eq!(g1.gt_per_s_per_lane, 2.5);
        assert!(close(g1.bytes_per_s, 250e6));
        assert!(close(pcie_link_rate(2, 8).unwrap().bytes_per_s, 4e9));
        // Gen3 x16 ≈ 15.75 GB/s, Gen4 x16 ≈ 31.5 GB/s, Gen5 x16 ≈ 63.0 GB/s per direction.
        assert!(close(
            pcie_link_rate(3, 16).unwrap().bytes_per_s,
            8e9 * 128.0 / 130.0 * 2.0
        ));
        let g4 = pcie_link_rate(4, 16).unwrap().bytes_per_s;
        assert!((g4 / 1e9 - 31.51).abs() < 0.01);
        let g5 = pcie_link_rate(5, 16).unwrap();
        assert_eq!(g5.gt_per_s_per_lane, 32.0);
        assert!((g5.bytes_per_s / 1e9 - 63.02).abs() < 0.01);
        let g6 = pcie_link_rate(6, 16).unwrap();
        assert!(close(g6.encoding_efficiency, 242.0 / 256.0));
        assert!((g6.bytes_per_s / 1e9 - 121.0).abs() < 0.01);
        assert!(close(
            pcie_link_rate(5, 8).unwrap().bytes_per_s * 2.0,
            g5.bytes_per_s
        ));
        assert_eq!(pcie_link_rate(0, 16), None);
        assert_eq!(pcie_link_rate(7, 16), None);
        assert_eq!(pcie_link_rate(4, 0), None);
    }
}
