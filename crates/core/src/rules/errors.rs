//! Hardware error rules: uncorrectable ECC, row remapping, page retirement and XID events.
//!
//! XIDs are graded as the design's table says: the ones that mean the GPU or its memory is
//! failing are `fail`, the ones usually caused by the application or a recoverable fault are
//! `warn`, the rest are `info` with their one-line meaning.

use serde_json::json;

use super::{Evidence, Finding, RuleInput, Severity, values};
use gpudiag_telemetry::EventKind;

/// Severity and a one-line meaning of an XID code.
pub fn xid_grade(xid: u64) -> (Severity, &'static str) {
    match xid {
        48 => (Severity::Fail, "double-bit ECC error in GPU memory"),
        64 => (
            Severity::Fail,
            "ECC page retirement or row remapping recording failure",
        ),
        74 => (
            Severity::Fail,
            "NVLink error: a link dropped or saw uncorrectable errors",
        ),
        79 => (Severity::Fail, "GPU has fallen off the bus"),
        92 => (Severity::Fail, "high single-bit ECC error rate"),
        95 => (
            Severity::Fail,
            "uncontained ECC error: applications on this GPU were stopped",
        ),
        119 => (Severity::Fail, "GSP firmware RPC timeout"),
        120 => (Severity::Fail, "GSP firmware error"),
        13 => (
            Severity::Warn,
            "graphics engine exception, usually an illegal access in a kernel",
        ),
        31 => (
            Severity::Warn,
            "GPU memory page fault, usually an application's invalid address",
        ),
        43 => (
            Severity::Warn,
            "GPU stopped processing: a kernel was killed or hit a fault",
        ),
        63 => (
            Severity::Warn,
            "ECC page retirement or row remapping recorded (a reset applies it)",
        ),
        94 => (
            Severity::Warn,
            "contained ECC error: the affected application was stopped",
        ),
        _ => (
            Severity::Info,
            "driver-reported error; see NVIDIA's XID catalogue",
        ),
    }
}

fn xid_advice(severity: Severity) -> &'static str {
    match severity {
        Severity::Fail => {
            "Drain the node: stop jobs on this GPU, collect `gpudiag report`, reset the GPU or \
             reboot; if it recurs, have the GPU or its baseboard inspected (RMA)."
        }
        Severity::Warn => {
            "Usually caused by the application (an invalid address or a killed kernel); rerun it \
             under compute-sanitizer. If it repeats across applications, treat it as hardware."
        }
        Severity::Info => "Look the code up in NVIDIA's XID catalogue; keep it in the bug report.",
    }
}

/// Counters and flags of the newest sample of each device.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (&device, s) in input.latest {
        let unread = |rule: &str, field: &str, what: &str| {
            input.not_judged(
                rule,
                Some(device),
                format!("no {what} ({})", input.why_absent(device, field)),
            );
        };
        if s.ecc_uncorrected_volatile.is_none() {
            unread(
                "errors.ecc_uncorrectable",
                "ecc_uncorrected_volatile",
                "ECC error counters",
            );
        }
        if s.remapped_rows_failure.is_none() {
            unread(
                "errors.row_remap_failure",
                "remapped_rows_failure",
                "row-remapping state",
            );
        }
        if s.remapped_rows_pending.is_none() && s.retired_pages_pending.is_none() {
            unread(
                "errors.reset_pending",
                "remapped_rows_pending",
                "pending row remap or page retirement state",
            );
        }
        if let Some(n) = s.ecc_uncorrected_volatile.filter(|&n| n > 0) {
            out.push(Finding {
                id: "errors.ecc_uncorrectable".into(),
                severity: Severity::Fail,
                device: Some(device),
                time_ms: input.now_ms,
                title: format!("{n} uncorrectable ECC error(s) since the driver loaded"),
                evidence: Evidence {
                    values: values([("ecc_uncorrected_volatile", json!(n))]),
                    window_s: 0.0,
                    threshold: "> 0".into(),
                },
                advice: "Data on this GPU may be corrupt: stop jobs, reset the GPU so the bad \
                         rows are remapped, and run the memory probe; repeated errors mean RMA."
                    .into(),
                last_seen_ms: None,
                state: Default::default(),
                recorded: false,
            });
        }
        if s.remapped_rows_failure == Some(true) {
            out.push(Finding {
                id: "errors.row_remap_failure".into(),
                severity: Severity::Fail,
                device: Some(device),
                time_ms: input.now_ms,
                title: "row remapping failed: the memory has no spare rows left".into(),
                evidence: Evidence {
                    values: values([("remapped_rows_failure", json!(true))]),
                    window_s: 0.0,
                    threshold: "true".into(),
                },
                advice: "The GPU cannot repair its memory any more; take it out of service \
                         and request an RMA."
                    .into(),
                last_seen_ms: None,
                state: Default::default(),
                recorded: false,
            });
        }
        let remap_pending = s.remapped_rows_pending == Some(true);
        let retire_pending = s.retired_pages_pending == Some(true);
        if remap_pending || retire_pending {
            out.push(Finding {
                id: "errors.reset_pending".into(),
                severity: Severity::Warn,
                device: Some(device),
                time_ms: input.now_ms,
                title: "memory repair pending: the GPU needs a reset to apply it".into(),
                evidence: Evidence {
                    values: values([
                        ("remapped_rows_pending", json!(s.remapped_rows_pending)),
                        ("retired_pages_pending", json!(s.retired_pages_pending)),
                    ]),
                    window_s: 0.0,
                    threshold: "true".into(),
                },
                advice: "Reset the GPU (or reboot) when it is idle so the pending row remap or \
                         page retirement takes effect."
                    .into(),
                last_seen_ms: None,
                state: Default::default(),
                recorded: false,
            });
        }
    }
    out
}

/// XIDs: each event becomes one finding, stamped with the event's time.
pub fn evaluate_events(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for e in input.events {
        let EventKind::Xid { xid } = e.kind else {
            continue;
        };
        let (severity, meaning) = xid_grade(xid);
        out.push(Finding {
            id: format!("errors.xid_{xid}"),
            severity,
            device: e.device,
            time_ms: e.time_ms,
            title: format!("XID {xid}: {meaning}"),
            evidence: Evidence {
                values: values([("xid", json!(xid))]),
                window_s: 0.0,
                threshold: "event".into(),
            },
            advice: xid_advice(severity).into(),
            last_seen_ms: None,
            state: Default::default(),
            recorded: false,
        });
    }
    out
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
        let input = RuleInput {
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
        };
        let mut f = evaluate(&input);
        f.extend(evaluate_events(&input));
        f
    }

    #[test]
    fn xid_grades_follow_the_design_table() {
        for x in [48, 64, 74, 79, 92, 95, 119, 120] {
            assert_eq!(xid_grade(x).0, Severity::Fail, "xid {x}");
        }
        for x in [13, 31, 43, 63, 94] {
            assert_eq!(xid_grade(x).0, Severity::Warn, "xid {x}");
        }
        assert_eq!(xid_grade(999).0, Severity::Info);
    }

    #[test]
    fn uncorrectable_ecc_fires_and_clean_counters_do_not() {
        let mut bad = Sample::new(0, 1);
        bad.ecc_uncorrected_volatile = Some(2);
        let mut clean = Sample::new(1, 1);
        clean.ecc_uncorrected_volatile = Some(0);
        let unknown = Sample::new(2, 1);
        let f = run(BTreeMap::from([(0, bad), (1, clean), (2, unknown)]), vec![]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "errors.ecc_uncorrectable");
        assert_eq!(f[0].device, Some(0));
        assert_eq!(f[0].evidence.values["ecc_uncorrected_volatile"], json!(2));
    }

    #[test]
    fn pending_remap_warns_and_failure_fails() {
        let mut s = Sample::new(0, 1);
        s.remapped_rows_pending = Some(true);
        s.remapped_rows_failure = Some(true);
        let f = run(BTreeMap::from([(0, s)]), vec![]);
        let ids: Vec<_> = f.iter().map(|f| (f.id.as_str(), f.severity)).collect();
        assert!(ids.contains(&("errors.row_remap_failure", Severity::Fail)));
        assert!(ids.contains(&("errors.reset_pending", Severity::Warn)));
    }

    #[test]
    fn xid_events_become_findings() {
        let ev = Event {
            time_ms: 5,
            device: Some(1),
            kind: EventKind::Xid { xid: 79 },
        };
        let f = run(BTreeMap::new(), vec![ev]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "errors.xid_79");
        assert_eq!(f[0].severity, Severity::Fail);
        assert_eq!(f[0].device, Some(1));
        assert!(f[0].title.contains("fallen off the bus"));
    }
}
