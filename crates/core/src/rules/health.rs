//! Telemetry health: a GPU that is lost, missing from the driver's list, stalled in a driver
//! call, or reporting values no working GPU produces.
//!
//! These judge the newest sample of each device (the engine runs them on every tick, so nothing
//! transient slips between evaluations) by the absent reasons the backend, the poll deadline and
//! the plausibility check left there (`telemetry::sanity`), plus `device_lost` events and XID
//! 79. XID 79 is the driver saying the GPU fell off the bus, so it raises `device.lost` by
//! itself: a source that reports the XID but not (or not yet) lost values must not leave the GPU
//! looking alive. `errors.rs` still grades the XID as an XID.

use serde_json::{Value, json};

use super::RuleInput;
use gpudiag_model::finding::{Evidence, Finding, Severity};
use gpudiag_model::sample::{Absent, EventKind};
use gpudiag_telemetry::sanity::{self, Health};

pub const LOST: &str = "device.lost";
pub const MISSING: &str = "device.missing";
pub const STALLED: &str = "telemetry.stalled";
pub const IMPLAUSIBLE: &str = "telemetry.implausible";

/// The XID the driver logs when a GPU falls off the bus.
pub const XID_FELL_OFF_THE_BUS: u64 = 79;

/// Findings from the newest samples and from this tick's `device_lost` and XID 79 events.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = lost_from_events(input.events);
    for (&device, s) in input.latest {
        let reasons: Vec<(Health, &Absent)> = s
            .absent
            .values()
            .filter_map(|v| sanity::classify(v).map(|h| (h, v)))
            .collect();
        let first = |h: Health| {
            reasons.iter().find(|r| r.0 == h).map(|r| match r.1 {
                Absent::Error(m) => m.clone(),
                other => other.to_string(),
            })
        };
        // Without the event (a backend that only marks fields), the fields say it.
        if reasons.iter().any(|r| r.0 == Health::Lost)
            && !out.iter().any(|f| f.id == LOST && f.device == Some(device))
        {
            out.push(lost(
                device,
                s.time_ms,
                "the driver answers GPU lost for its values",
            ));
        }
        if reasons.iter().any(|r| r.0 == Health::Missing) {
            out.push(missing(device, s.time_ms));
        }
        if let Some(why) = first(Health::Stalled) {
            out.push(stalled(device, s.time_ms, &why));
        }
        let bad: serde_json::Map<String, Value> = sanity::implausible_fields(s)
            .map(|(field, why)| (field.to_owned(), json!(why)))
            .collect();
        if !bad.is_empty() {
            out.push(implausible(device, s.time_ms, bad));
        }
    }
    out
}

/// One `device.lost` per device from a tick's events: a backend that sees the loss reports both
/// the XID and its own `device_lost`, which are one loss, so their evidence is merged (the
/// backend's reason, the XID) at the earlier of their times.
fn lost_from_events(events: &[gpudiag_model::sample::Event]) -> Vec<Finding> {
    let mut by_device: std::collections::BTreeMap<u32, (u64, Option<&str>, Option<u64>)> =
        Default::default();
    for e in events {
        let Some(device) = e.device else { continue };
        let (reason, xid) = match &e.kind {
            EventKind::DeviceLost { reason } => (Some(reason.as_str()), None),
            EventKind::Xid { xid } if *xid == XID_FELL_OFF_THE_BUS => (None, Some(*xid)),
            _ => continue,
        };
        let entry = by_device.entry(device).or_insert((e.time_ms, None, None));
        entry.0 = entry.0.min(e.time_ms);
        entry.1 = entry.1.or(reason);
        entry.2 = entry.2.or(xid);
    }
    by_device
        .into_iter()
        .map(|(device, (time_ms, reason, xid))| {
            let mut f = lost(
                device,
                time_ms,
                reason.unwrap_or("XID 79: the driver reports the GPU has fallen off the bus"),
            );
            if let Some(xid) = xid {
                f.evidence.values.insert("xid".into(), json!(xid));
                f.evidence.threshold =
                    "the driver reports the GPU lost, or an XID 79 (fell off the bus)".into();
            }
            f
        })
        .collect()
}

fn lost(device: u32, time_ms: u64, reason: &str) -> Finding {
    Finding::new(
        LOST.into(),
        Severity::Fail,
        Some(device),
        time_ms,
        format!("GPU {device} is lost: it stopped answering the driver"),
        Evidence {
            values: gpudiag_model::finding::values([("reason", json!(reason))]),
            window_s: 0.0,
            threshold: "the driver reports the GPU lost".into(),
        },
        "Its telemetry stops here; nothing on this GPU can be trusted until it is reset. \
                 Look for an XID 79 finding and NVRM lines in the kernel log, drain the node, \
                 collect `gpudiag report`, then reset the GPU or reboot. If it recurs, reseat the \
                 card and check power and cooling before an RMA."
            .into(),
    )
}

fn missing(device: u32, time_ms: u64) -> Finding {
    Finding::new(
        MISSING.into(),
        Severity::Warn,
        Some(device),
        time_ms,
        format!("GPU {device} dropped out of the driver's device list"),
        Evidence {
            values: gpudiag_model::finding::values([("reason", json!(sanity::MISSING))]),
            window_s: 0.0,
            threshold: "a GPU listed at start is absent from a poll".into(),
        },
        "A GPU that disappears and comes back is usually a PCIe link that retrained or \
                 a device that was reset or unbound under a running workload. Check the kernel \
                 log for PCIe AER and NVRM messages, and whether anyone reset or re-bound the \
                 device; if nobody did, reseat the card or its riser."
            .into(),
    )
}

fn stalled(device: u32, time_ms: u64, why: &str) -> Finding {
    Finding::new(
        STALLED.into(),
        Severity::Warn,
        Some(device),
        time_ms,
        format!("GPU {device} telemetry stalled: a {why}"),
        Evidence {
            values: gpudiag_model::finding::values([("reason", json!(why))]),
            window_s: 0.0,
            threshold: "a poll longer than --poll-timeout".into(),
        },
        "The driver is slow or wedged; gpudiag kept sampling and marks the GPU until \
                 the call returns. Check whether `nvidia-smi` answers, look for XIDs and NVRM \
                 errors in the kernel log, and if calls keep hanging, drain the node and reset \
                 the GPU."
            .into(),
    )
}

fn implausible(device: u32, time_ms: u64, bad: serde_json::Map<String, Value>) -> Finding {
    let first = bad
        .iter()
        .next()
        .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default()))
        .unwrap_or_default();
    let more = if bad.len() > 1 {
        format!(" and {} more", bad.len() - 1)
    } else {
        String::new()
    };
    Finding::new(
        IMPLAUSIBLE.into(),
        Severity::Warn,
        Some(device),
        time_ms,
        format!("GPU {device} reported values no working GPU produces ({first}{more})"),
        Evidence {
            values: bad,
            window_s: 0.0,
            threshold: "outside the physical range, not a number, or a counter going backwards"
                .into(),
        },
        "Those values were dropped, not stored or exported. Once is a driver glitch; \
                 if it repeats, a sensor, the firmware or the driver is failing: update the \
                 driver, check the kernel log, and attach `gpudiag report` to a bug report."
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::History;
    use gpudiag_model::sample::{Event, Sample};

    fn run(latest: BTreeMap<u32, Sample>, events: Vec<Event>) -> Vec<Finding> {
        let history = History::default();
        let config = crate::config::RulesConfig::default();
        evaluate(&RuleInput {
            devices: &[],
            history: &history,
            latest: &latest,
            events: &events,
            now_ms: 1000,
            config: &config,
            host: None,
            libraries: None,
            process_memory: None,
            process_cpu: None,
            ras: None,
            own_pid: None,
            not_judged: Default::default(),
        })
    }

    #[test]
    fn a_healthy_sample_and_not_supported_fields_raise_nothing() {
        let mut s = Sample::new(0, 1);
        s.gpu_util_pct = Some(50.0);
        s.absent.insert("fan_pct".into(), Absent::NotSupported);
        assert!(run(BTreeMap::from([(0, s)]), vec![]).is_empty());
    }

    #[test]
    fn each_reason_has_its_finding() {
        let lost = sanity::all_absent(0, 5, &Absent::GpuLost);
        let gone = sanity::all_absent(1, 5, &Absent::Error(sanity::MISSING.into()));
        let stuck = sanity::all_absent(
            2,
            5,
            &sanity::stalled_reason(std::time::Duration::from_millis(300)),
        );
        let mut odd = Sample::new(3, 5);
        odd.temp_gpu_c = Some(1e9);
        gpudiag_telemetry::sanity::Sanitiser::new().sample(&mut odd);
        let f = run(
            BTreeMap::from([(0, lost), (1, gone), (2, stuck), (3, odd)]),
            vec![],
        );
        let ids: Vec<(&str, Option<u32>, Severity)> = f
            .iter()
            .map(|f| (f.id.as_str(), f.device, f.severity))
            .collect();
        assert_eq!(
            ids,
            [
                (LOST, Some(0), Severity::Fail),
                (MISSING, Some(1), Severity::Warn),
                (STALLED, Some(2), Severity::Warn),
                (IMPLAUSIBLE, Some(3), Severity::Warn),
            ]
        );
        assert!(
            f[2].title.contains("did not return within 300 ms"),
            "{}",
            f[2].title
        );
        assert!(f[3].title.contains("1e9 °C"), "{}", f[3].title);
    }

    #[test]
    fn a_device_lost_event_is_one_finding_even_with_lost_samples() {
        let ev = Event {
            time_ms: 5,
            device: Some(0),
            kind: EventKind::DeviceLost {
                reason: "fell off the bus".into(),
            },
        };
        let f = run(
            BTreeMap::from([(0, sanity::all_absent(0, 5, &Absent::GpuLost))]),
            vec![ev],
        );
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].evidence.values["reason"], json!("fell off the bus"));
    }

    fn xid(device: Option<u32>, time_ms: u64, xid: u64) -> Event {
        Event {
            time_ms,
            device,
            kind: EventKind::Xid { xid },
        }
    }

    #[test]
    fn an_xid_79_alone_is_a_lost_gpu_with_the_xid_as_evidence() {
        let mut alive = Sample::new(1, 7);
        alive.gpu_util_pct = Some(40.0);
        let f = run(BTreeMap::from([(1, alive)]), vec![xid(Some(1), 5, 79)]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].id.as_str(), f[0].device), (LOST, Some(1)));
        assert_eq!(f[0].severity, Severity::Fail);
        assert_eq!(f[0].time_ms, 5);
        assert_eq!(f[0].evidence.values["xid"], json!(79));
        assert!(
            f[0].evidence.values["reason"]
                .as_str()
                .unwrap()
                .contains("fallen off the bus"),
            "{:?}",
            f[0].evidence
        );
    }

    #[test]
    fn xid_79_with_device_lost_and_lost_samples_is_one_finding_carrying_both() {
        let lost_event = Event {
            time_ms: 6,
            device: Some(0),
            kind: EventKind::DeviceLost {
                reason: "GPU is lost (NVML_ERROR_GPU_IS_LOST)".into(),
            },
        };
        let f = run(
            BTreeMap::from([(0, sanity::all_absent(0, 6, &Absent::GpuLost))]),
            vec![xid(Some(0), 5, 79), lost_event, xid(Some(0), 6, 79)],
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].time_ms, 5);
        assert_eq!(f[0].evidence.values["xid"], json!(79));
        assert_eq!(
            f[0].evidence.values["reason"],
            json!("GPU is lost (NVML_ERROR_GPU_IS_LOST)")
        );
    }

    #[test]
    fn other_xids_and_host_wide_xid_79_lose_no_gpu() {
        let f = run(
            BTreeMap::new(),
            vec![xid(Some(0), 5, 13), xid(Some(0), 5, 48), xid(None, 5, 79)],
        );
        assert!(f.is_empty(), "{f:?}");
    }
}
