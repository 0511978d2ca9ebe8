//! Rules that cannot run on a GPU because their signals are NVIDIA-only say so, once per device,
//! instead of staying silent: a clean report on an AMD GPU must not read as "no XIDs, no
//! throttling" when those were never observable.

use serde_json::json;

use super::RuleInput;
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::{Absent, DeviceInfo, Sample};

/// Stable id of the finding.
pub const ID: &str = "vendor.nvidia_only_signals";

/// The NVIDIA-only signals and the checks that need them. XIDs are events, not sample fields,
/// so they are listed for any non-NVIDIA device; the others when the device's sample says the
/// backend cannot read them.
const SIGNALS: &[(&str, &str)] = &[
    ("throttle_reasons", "throttle reasons (throttle.*)"),
    ("pstate", "performance state (the P0 test of pcie.*)"),
    (
        "remapped_rows_pending",
        "row remapping (errors.row_remap_failure, errors.reset_pending)",
    ),
    ("encoder_util_pct", "encoder/decoder utilisation"),
];

/// One info finding per non-NVIDIA device naming the checks that do not run on it.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    input
        .devices
        .iter()
        .filter_map(|d| nvidia_only_signals_missing(d, input.latest.get(&d.index), input.now_ms))
        .collect()
}

/// The finding for one device: `None` for NVIDIA GPUs and devices of unknown vendor (old
/// recordings), where nothing is known to be missing.
pub fn nvidia_only_signals_missing(
    info: &DeviceInfo,
    latest: Option<&Sample>,
    now_ms: u64,
) -> Option<Finding> {
    let vendor = info.vendor.as_deref()?;
    if vendor == "NVIDIA" {
        return None;
    }
    let mut missing = vec!["XID error events (errors.xid_*)"];
    missing.extend(
        SIGNALS
            .iter()
            .filter(|(field, _)| {
                latest.is_none_or(|s| s.why_absent(field) == Some(&Absent::Unavailable))
            })
            .map(|(_, what)| *what),
    );
    Some(Finding::new(
        ID.into(),
        Severity::Info,
        Some(info.index),
        now_ms,
        format!(
            "{vendor} GPU: checks that need NVIDIA-only signals do not run here: {}",
            missing.join(", ")
        ),
        Evidence {
            values: values([("vendor", json!(vendor)), ("not_checked", json!(missing))]),
            window_s: 0.0,
            threshold: "vendor is not NVIDIA".into(),
        },
        "Nothing to fix: the other checks ran. For driver errors on AMD GPUs, look at \
                 `dmesg | grep amdgpu` (GPU resets, RAS events)."
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(vendor: Option<&str>) -> DeviceInfo {
        DeviceInfo {
            index: 3,
            vendor: vendor.map(str::to_owned),
            ..DeviceInfo::default()
        }
    }

    #[test]
    fn amd_devices_say_what_is_not_checked() {
        let mut s = Sample::new(3, 1);
        s.absent
            .insert("throttle_reasons".into(), Absent::Unavailable);
        s.absent.insert("pstate".into(), Absent::Unavailable);
        let f = nvidia_only_signals_missing(&device(Some("AMD")), Some(&s), 9).unwrap();
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Info);
        assert_eq!(f.device, Some(3));
        assert!(f.title.starts_with("AMD GPU: "), "{}", f.title);
        assert!(f.title.contains("XID"), "{}", f.title);
        assert!(f.title.contains("throttle reasons"), "{}", f.title);
        // Row remapping was not marked unavailable in this sample: not claimed missing.
        assert!(!f.title.contains("row remapping"), "{}", f.title);
        assert_eq!(f.evidence.values["vendor"], json!("AMD"));
    }

    #[test]
    fn nvidia_and_unknown_vendors_get_nothing() {
        assert_eq!(
            nvidia_only_signals_missing(&device(Some("NVIDIA")), None, 0),
            None
        );
        assert_eq!(nvidia_only_signals_missing(&device(None), None, 0), None);
    }
}
