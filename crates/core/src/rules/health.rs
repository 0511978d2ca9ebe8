//! Telemetry health: a GPU that is lost, missing from the driver's list, stalled in a driver
//! call, or reporting values no working GPU produces.
//!
//! These judge the newest sample of each device (the engine runs them on every tick, so nothing
//! transient slips between evaluations) by the absent reasons the backend, the poll deadline and
//! the plausibility check left there (`telemetry::sanity`), plus `device_lost` events. XID 79
//! itself is graded by `errors.rs`; `device.lost` says what it means for the telemetry.

use serde_json::{Value, json};

use super::{Evidence, Finding, RuleInput, Severity};
use gpudiag_telemetry::sanity::{self, Health};
use gpudiag_telemetry::{Absent, EventKind};

pub const LOST: &str = "device.lost";
pub const MISSING: &str = "device.missing";
pub const STALLED: &str = "telemetry.stalled";
pub const IMPLAUSIBLE: &str = "telemetry.implausible";

/// Whether `id` belongs to this family (its findings describe events: they stay once raised).
pub fn is_health(id: &str) -> bool {
    [LOST, MISSING, STALLED, IMPLAUSIBLE].contains(&id)
}

/// Findings from the newest samples and from this tick's `device_lost` events.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for e in input.events {
        if let (EventKind::DeviceLost { reason }, Some(device)) = (&e.kind, e.device) {
            out.push(lost(device, e.time_ms, reason));
        }
    }
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

fn lost(device: u32, time_ms: u64, reason: &str) -> Finding {
    Finding {
        id: LOST.into(),
        severity: Severity::Fail,
        device: Some(device),
        time_ms,
        title: format!("GPU {device} is lost: it stopped answering the driver"),
        evidence: Evidence {
            values: super::values([("reason", json!(reason))]),
            window_s: 0.0,
            threshold: "the driver reports the GPU lost".into(),
        },
        advice: "Its telemetry stops here; nothing on this GPU can be trusted until it is reset. \
                 Look for an XID 79 finding and NVRM lines in the kernel log, drain the node, \
                 collect `gpudiag report`, then reset the GPU or reboot. If it recurs, reseat the \
                 card and check power and cooling before an RMA."
            .into(),
        last_seen_ms: None,
        state: Default::default(),
        recorded: false,
    }
}

fn missing(device: u32, time_ms: u64) -> Finding {
    Finding {
        id: MISSING.into(),
        severity: Severity::Warn,
        device: Some(device),
        time_ms,
        title: format!("GPU {device} dropped out of the driver's device list"),
        evidence: Evidence {
            values: super::values([("reason", json!(sanity::MISSING))]),
            window_s: 0.0,
            threshold: "a GPU listed at start is absent from a poll".into(),
        },
        advice: "A GPU that disappears and comes back is usually a PCIe link that retrained or \
                 a device that was reset or unbound under a running workload. Check the kernel \
                 log for PCIe AER and NVRM messages, and whether anyone reset or re-bound the \
                 device; if nobody did, reseat the card or its riser."
            .into(),
        last_seen_ms: None,
        state: Default::default(),
        recorded: false,
    }
}

fn stalled(device: u32, time_ms: u64, why: &str) -> Finding {
    Finding {
        id: STALLED.into(),
        severity: Severity::Warn,
        device: Some(device),
        time_ms,
        title: format!("GPU {device} telemetry stalled: a {why}"),
        evidence: Evidence {
            values: super::values([("reason", json!(why))]),
            window_s: 0.0,
            threshold: "a poll longer than --poll-timeout".into(),
        },
        advice: "The driver is slow or wedged; gpudiag kept sampling and marks the GPU until \
                 the call returns. Check whether `nvidia-smi` answers, look for XIDs and NVRM \
                 errors in the kernel log, and if calls keep hanging, drain the node and reset \
                 the GPU."
            .into(),
        last_seen_ms: None,
        state: Default::default(),
        recorded: false,
    }
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
    Finding {
        id: IMPLAUSIBLE.into(),
        severity: Severity::Warn,
        device: Some(device),
        time_ms,
        title: format!("GPU {device} reported values no working GPU produces ({first}{more})"),
        evidence: Evidence {
            values: bad,
            window_s: 0.0,
            threshold: "outside the physical range, not a number, or a counter going backwards"
                .into(),
        },
        advice: "Those values were dropped, not stored or exported. Once is a driver glitch; \
                 if it repeats, a sensor, the firmware or the driver is failing: update the \
                 driver, check the kernel log, and attach `gpudiag report` to a bug report."
            .into(),
        last_seen_ms: None,
        state: Default::default(),
        recorded: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::History;
    use gpudiag_telemetry::{Event, Sample};

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
}
