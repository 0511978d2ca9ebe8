//! Probe suites (`probes/quick.toml`, `standard.toml`, `full.toml`) and the reference table of GPU
//! models (`probes/reference.toml`), embedded in the binary and parsed with serde.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::PROBE_NAMES;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    pub description: String,
    /// Wall-clock budget for the whole suite on one device.
    pub deadline_s: f64,
    /// No single probe allocation may take more than this share of free device memory.
    pub memory_share: f64,
    pub probes: Vec<String>,
    pub bandwidth: BandwidthParams,
    pub matmul: MatmulParams,
    pub memory: MemoryParams,
    pub latency: LatencyParams,
    #[serde(default)]
    pub p2p: P2pParams,
    #[serde(default)]
    pub nccl: NcclParams,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P2pParams {
    /// Bytes per copy (also capped by `memory_share`: two buffers per GPU).
    pub bytes: u64,
    /// Timed samples per pair and direction (16 copies each, after 4 warm-ups).
    pub samples: u32,
}

impl Default for P2pParams {
    fn default() -> Self {
        P2pParams {
            bytes: 64 << 20,
            samples: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclParams {
    /// Message sizes in bytes (float32 elements, so multiples of 4).
    pub sizes: Vec<u64>,
    pub warmups: u32,
    /// Timed all-reduces per size.
    pub iterations: u32,
}

impl Default for NcclParams {
    fn default() -> Self {
        NcclParams {
            sizes: vec![8 << 20, 64 << 20, 256 << 20],
            warmups: 5,
            iterations: 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandwidthParams {
    /// Bytes per copy.
    pub bytes: u64,
    /// Bytes per host↔device copy when fewer than `bytes` (and `bandwidth::HOST_BYTES_MAX`):
    /// the page-locked buffer is resident host memory for the probe's length, which a prolog
    /// on every job start keeps small; device-side copies keep `bytes`.
    #[serde(default)]
    pub host_bytes: Option<u64>,
    /// Timed samples (each: 16 copies between two events, after 4 warm-up copies).
    pub samples: u32,
    pub tests: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatmulParams {
    /// M = N = K.
    pub size: u64,
    pub iterations: u32,
    /// "bf16" (cuBLASLt, or the built-in kernel without it), "bf16/builtin" (always built-in).
    pub types: Vec<String>,
    /// Entries of the result checked against the host reference.
    pub verify_samples: u32,
    /// Leave cuBLASLt unloaded on GPUs whose built-in kernel is known to reach at least this
    /// share of it (`matmul::builtin_share_of_cublaslt`): the library maps hundreds of MB, which
    /// a prolog on every job start should not pay for a figure the built-in kernel gives as well.
    /// `None` always loads it.
    #[serde(default)]
    pub skip_cublaslt_at: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryParams {
    /// Share of free memory the pattern test covers (also capped by `memory_share`).
    pub share: f64,
    pub max_bytes: u64,
    pub churn_cycles: u32,
    pub churn_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyParams {
    pub launches: u32,
    pub round_trips: u32,
    pub graph_kernels: u32,
}

pub const SUITE_NAMES: [&str; 3] = ["quick", "standard", "full"];

fn suite_text(name: &str) -> Option<&'static str> {
    match name {
        "quick" => Some(include_str!("../../../probes/quick.toml")),
        "standard" => Some(include_str!("../../../probes/standard.toml")),
        "full" => Some(include_str!("../../../probes/full.toml")),
        _ => None,
    }
}

/// Parses and checks a suite.
pub fn parse_suite(text: &str) -> Result<Suite, String> {
    let s: Suite = toml::from_str(text).map_err(|e| e.to_string())?;
    if !(s.memory_share > 0.0 && s.memory_share <= 0.9) {
        return Err(format!(
            "memory_share {} is not in (0, 0.9]",
            s.memory_share
        ));
    }
    if !(s.memory.share > 0.0 && s.memory.share <= s.memory_share) {
        return Err(format!(
            "memory.share {} is not in (0, memory_share]",
            s.memory.share
        ));
    }
    if let Some(p) = s.probes.iter().find(|p| !PROBE_NAMES.contains(&p.as_str())) {
        return Err(format!("unknown probe '{p}'"));
    }
    if s.nccl.sizes.iter().any(|b| *b < 4 || b % 4 != 0) {
        return Err("nccl.sizes must be positive multiples of 4 bytes (float32)".into());
    }
    if s.deadline_s <= 0.0
        || s.bandwidth.samples == 0
        || s.matmul.iterations == 0
        || s.p2p.samples == 0
        || s.nccl.iterations == 0
    {
        return Err("deadline, samples and iterations must be positive".into());
    }
    Ok(s)
}

/// One of the built-in suites by name.
pub fn builtin(name: &str) -> Result<Suite, String> {
    let text = suite_text(name)
        .ok_or_else(|| format!("no suite '{name}'; there are {}", SUITE_NAMES.join(", ")))?;
    parse_suite(text).map_err(|e| format!("suite '{name}': {e}"))
}

/// Peak figures of one GPU model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    pub model: String,
    pub names: Vec<String>,
    pub memory_bandwidth_gbps: f64,
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// Dense TFLOP/s by type ("fp32", "tf32", "fp16", "bf16", "fp8"); a type the part lacks is
    /// absent.
    pub tflops: BTreeMap<String, f64>,
}

impl ModelRef {
    /// What the PCIe link carries per direction in GB/s: lanes × rate × encoding efficiency.
    pub fn pcie_gbps(&self) -> Option<f64> {
        pcie_link_gbps(self.pcie_gen, self.pcie_width)
    }
}

/// Raw per-direction rate of a PCIe link in GB/s (1e9 bytes), after line encoding.
pub fn pcie_link_gbps(gen_: u32, width: u32) -> Option<f64> {
    let (gt, eff) = match gen_ {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    Some(gt * eff * f64::from(width) / 8.0)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    model: Vec<ModelRef>,
}

/// Parses a reference table.
pub fn parse_reference(text: &str) -> Result<Vec<ModelRef>, String> {
    let t: Table = toml::from_str(text).map_err(|e| e.to_string())?;
    Ok(t.model)
}

/// The embedded reference table.
pub fn reference() -> Vec<ModelRef> {
    // The embedded table is tested to parse, so an error here cannot happen in a release;
    // an empty table still leaves every probe running, without ratios.
    parse_reference(include_str!("../../../probes/reference.toml")).unwrap_or_default()
}

fn tokens(s: &str) -> Vec<String> {
    s.split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|t| !t.is_empty())
        .map(|t| t.to_ascii_lowercase())
        .collect()
}

/// The first model whose name tokens all occur in `device_name`.
pub fn lookup<'a>(table: &'a [ModelRef], device_name: &str) -> Option<&'a ModelRef> {
    let have = tokens(device_name);
    table.iter().find(|m| {
        m.names
            .iter()
            .any(|n| tokens(n).iter().all(|t| have.contains(t)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_suites_parse_and_grow() {
        let q = builtin("quick").unwrap();
        let s = builtin("standard").unwrap();
        let f = builtin("full").unwrap();
        assert!(q.memory_share < s.memory_share && s.memory_share < f.memory_share);
        assert!(q.deadline_s <= 15.0, "quick must fit a prolog");
        assert!(q.bandwidth.bytes < s.bandwidth.bytes);
        assert!(
            builtin("huge")
                .unwrap_err()
                .contains("quick, standard, full")
        );
    }

    #[test]
    fn bad_suites_are_rejected_with_the_reason() {
        let good = include_str!("../../../probes/quick.toml");
        let bad = good.replace("memory_share = 0.03", "memory_share = 1.5");
        assert!(parse_suite(&bad).unwrap_err().contains("memory_share"));
        let bad = good.replace("\"p2p\"]", "\"p2q\"]");
        assert!(
            parse_suite(&bad)
                .unwrap_err()
                .contains("unknown probe 'p2q'")
        );
        let bad = format!("{good}\nsurprise = 1\n");
        assert!(parse_suite(&bad).is_err());
    }

    #[test]
    fn reference_table_parses_and_matches_real_device_names() {
        let t = reference();
        assert!(t.len() >= 9);
        let model = |n: &str| lookup(&t, n).map(|m| m.model.as_str());
        assert_eq!(model("NVIDIA H200"), Some("H200"));
        assert_eq!(model("NVIDIA H100 80GB HBM3"), Some("H100 SXM"));
        assert_eq!(model("NVIDIA H100 PCIe"), Some("H100 PCIe"));
        assert_eq!(model("NVIDIA A100-SXM4-80GB"), Some("A100 80GB"));
        assert_eq!(model("NVIDIA A100-SXM4-40GB"), Some("A100 40GB"));
        assert_eq!(model("NVIDIA L4"), Some("L4"));
        assert_eq!(model("NVIDIA L40S"), Some("L40S"));
        assert_eq!(model("NVIDIA GeForce RTX 4090"), Some("RTX 4090"));
        assert_eq!(model("AMD Instinct MI300X"), Some("MI300X"));
        assert_eq!(model("NVIDIA L40"), None);
        assert_eq!(model("Tesla T4"), None);
        let h200 = lookup(&t, "NVIDIA H200").unwrap();
        assert_eq!(h200.tflops.get("bf16"), Some(&989.4));
        assert!(!lookup(&t, "A100").unwrap().tflops.contains_key("fp8"));
    }

    #[test]
    fn pcie_rates() {
        let g5 = pcie_link_gbps(5, 16).unwrap();
        assert!((g5 - 63.02).abs() < 0.01, "{g5}");
        let g4 = pcie_link_gbps(4, 16).unwrap();
        assert!((g4 - 31.51).abs() < 0.01, "{g4}");
        assert_eq!(pcie_link_gbps(9, 16), None);
    }
}
