//! Hardware error rules: uncorrectable ECC, row remapping, page retirement and XID events.
//!
//! XIDs are graded as the design's table says: the ones that mean the GPU or its memory is
//! failing are `fail`, the ones usually caused by the application or a recoverable fault are
//! `warn`, the rest are `info` with their one-line meaning.
//!
//! XIDs the kernel logged before a check or a session started (`past_xids`) are history, not a
//! live fault: a GPU that recovered (it was reset and answers, its memory repairs applied) must
//! not fail every later prolog. Each is `info` unless the GPU's present state says the fault is
//! still there, and then it gets its live grade: any XID of a GPU that is lost now (it explains
//! the loss), and a memory XID (48 63 64 92 94 95) while a row remap or page retirement waits for
//! a reset or row remapping has failed.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;

use super::RuleInput;
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::{DeviceInfo, EventKind, Sample, TimeMs};
use gpudiag_model::verdict::NotJudged;
use gpudiag_telemetry::kernel_log::{LoggedXid, PciAddress, XidLog};
use gpudiag_telemetry::sanity::{self, Health};

/// The rule `not_judged` names when the kernel log could not be read (or only in part).
pub const KERNEL_LOG_RULE: &str = "errors.kernel_log_xid";

/// XIDs about GPU memory: they stay relevant while the repair they caused is outstanding.
pub const MEMORY_XIDS: [u64; 6] = [48, 63, 64, 92, 94, 95];

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
            out.push(Finding::new(
                "errors.ecc_uncorrectable".into(),
                Severity::Fail,
                Some(device),
                input.now_ms,
                format!("{n} uncorrectable ECC error(s) since the driver loaded"),
                Evidence {
                    values: values([("ecc_uncorrected_volatile", json!(n))]),
                    window_s: 0.0,
                    threshold: "> 0".into(),
                },
                "Data on this GPU may be corrupt: stop jobs, reset the GPU so the bad \
                         rows are remapped, and run the memory probe; repeated errors mean RMA."
                    .into(),
            ));
        }
        if s.remapped_rows_failure == Some(true) {
            out.push(Finding::new(
                "errors.row_remap_failure".into(),
                Severity::Fail,
                Some(device),
                input.now_ms,
                "row remapping failed: the memory has no spare rows left".into(),
                Evidence {
                    values: values([("remapped_rows_failure", json!(true))]),
                    window_s: 0.0,
                    threshold: "true".into(),
                },
                "The GPU cannot repair its memory any more; take it out of service \
                         and request an RMA."
                    .into(),
            ));
        }
        let remap_pending = s.remapped_rows_pending == Some(true);
        let retire_pending = s.retired_pages_pending == Some(true);
        if remap_pending || retire_pending {
            out.push(Finding::new(
                "errors.reset_pending".into(),
                Severity::Warn,
                Some(device),
                input.now_ms,
                "memory repair pending: the GPU needs a reset to apply it".into(),
                Evidence {
                    values: values([
                        ("remapped_rows_pending", json!(s.remapped_rows_pending)),
                        ("retired_pages_pending", json!(s.retired_pages_pending)),
                    ]),
                    window_s: 0.0,
                    threshold: "true".into(),
                },
                "Reset the GPU (or reboot) when it is idle so the pending row remap or \
                         page retirement takes effect."
                    .into(),
            ));
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
        out.push(Finding::new(
            format!("errors.xid_{xid}"),
            severity,
            e.device,
            e.time_ms,
            format!("XID {xid}: {meaning}"),
            Evidence {
                values: values([("xid", json!(xid))]),
                window_s: 0.0,
                threshold: "event".into(),
            },
            xid_advice(severity).into(),
        ));
    }
    out
}

/// What the GPU's present state says about a past XID: why it still matters, if it does.
fn still_matters(xid: u64, now: Option<&Sample>) -> Option<&'static str> {
    let now = now?;
    match sanity::worst(now) {
        Some(Health::Lost) => return Some("the GPU is lost now"),
        Some(Health::Missing) => return Some("the GPU is missing from the driver's list now"),
        _ => {}
    }
    if !MEMORY_XIDS.contains(&xid) {
        return None;
    }
    if now.remapped_rows_failure == Some(true) {
        return Some("row remapping has failed on this GPU");
    }
    if now.remapped_rows_pending == Some(true) || now.retired_pages_pending == Some(true) {
        return Some("a memory repair still waits for a GPU reset");
    }
    None
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z). A saved log can claim
/// any time since boot; past this one it is no time at all (formatting it would panic).
const LAST_WRITABLE_MS: TimeMs = 253_402_300_799_999;

/// When an XID was logged, where that is a time at all.
fn logged_at(x: &LoggedXid) -> Option<TimeMs> {
    x.time_ms.filter(|&t| t <= LAST_WRITABLE_MS)
}

/// `2026-11-23 21:04 UTC`.
fn utc_minute(ms: TimeMs) -> String {
    let t = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string();
    match (t.get(..10), t.get(11..16)) {
        (Some(day), Some(hm)) => format!("{day} {hm} UTC"),
        _ => t,
    }
}

fn rfc3339(ms: Option<TimeMs>) -> serde_json::Value {
    ms.map_or(serde_json::Value::Null, |ms| {
        json!(humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string())
    })
}

/// The `not_judged` entry of a kernel log that could not be read (`why`).
pub fn unreadable_log(why: &str, before: &str) -> NotJudged {
    NotJudged {
        rule: KERNEL_LOG_RULE.into(),
        device: None,
        reason: format!(
            "the kernel log could not be read, so XIDs from {before} (a job that died earlier) \
             are unknown: {why}"
        ),
    }
}

/// Findings for the XIDs the kernel logged before now (`before`: "before this check"), one per
/// GPU and XID, judged against each GPU's newest sample in `latest`. `devices` are every GPU the
/// source lists, to place an XID by its PCI address; only those in `selected` are reported, and
/// an address no GPU has is reported host-wide. A log that could not be read, or only in part,
/// is a `NotJudged` entry: silence is not health.
pub fn past_xids(
    log: &Result<XidLog, String>,
    devices: &[DeviceInfo],
    selected: &[u32],
    latest: &BTreeMap<u32, Sample>,
    now_ms: TimeMs,
    before: &str,
) -> (Vec<Finding>, Vec<NotJudged>) {
    let log = match log {
        Ok(log) => log,
        Err(why) => return (Vec::new(), vec![unreadable_log(why, before)]),
    };
    let not_judged = log
        .truncated
        .as_ref()
        .map(|why| NotJudged {
            rule: KERNEL_LOG_RULE.into(),
            device: None,
            reason: format!("the kernel log ({}) was read in part: {why}", log.source),
        })
        .into_iter()
        .collect();
    let by_address: BTreeMap<PciAddress, u32> = devices
        .iter()
        .filter_map(|d| Some((PciAddress::parse(d.pci_bus_id.as_deref()?)?, d.index)))
        .collect();
    // One finding per GPU (or unknown address) and XID, from all its lines, oldest first.
    let mut groups: BTreeMap<(Option<u32>, PciAddress, u64), Vec<&LoggedXid>> = BTreeMap::new();
    for x in &log.xids {
        let device = by_address.get(&x.pci).copied();
        if device.is_some_and(|d| !selected.contains(&d)) {
            continue;
        }
        groups.entry((device, x.pci, x.xid)).or_default().push(x);
    }
    let mut out = Vec::new();
    for ((device, pci, xid), lines) in groups {
        let Some(last) = lines.last() else { continue };
        let (live, meaning) = xid_grade(xid);
        let matters = device.and_then(|d| still_matters(xid, latest.get(&d)));
        let severity = match (device, matters) {
            (Some(_), Some(_)) => live,
            (Some(_), None) => Severity::Info,
            // An address no listed GPU has: it may have left the bus for good.
            (None, _) if live == Severity::Fail => Severity::Warn,
            (None, _) => Severity::Info,
        };
        let when = match logged_at(last) {
            Some(t) => format!("XID {xid} at {}", utc_minute(t)),
            None => format!("XID {xid} at an unknown time"),
        };
        let times = if lines.len() > 1 {
            format!("; {} times since boot", lines.len())
        } else {
            String::new()
        };
        let state = match (device, matters) {
            (Some(_), Some(why)) => format!(" — {why}"),
            (Some(_), None) => String::new(),
            (None, _) => format!(" on PCI {pci}, a GPU the driver does not list now"),
        };
        let title = format!("{when} ({before}{times}){state}: {meaning}");
        let state_now = match (device, matters) {
            (Some(_), Some(why)) => json!(why),
            (Some(d), None) if latest.contains_key(&d) => {
                json!("nothing outstanding: not lost, no memory repair pending or failed")
            }
            (Some(_), None) => json!("unknown: no sample of this GPU"),
            (None, _) => json!("not listed by the driver"),
        };
        let mut line: String = last.text.chars().take(400).collect();
        if line.len() < last.text.len() {
            line.push('…');
        }
        let advice = match (device, matters) {
            (Some(_), Some(_)) => xid_advice(live).to_owned(),
            (Some(_), None) => format!(
                "History, not a live fault: the GPU's present state shows nothing outstanding, \
                 so it does not fail the check. If it recurs or jobs on this GPU keep failing, \
                 treat it as live: {}",
                xid_advice(live)
            ),
            (None, _) => format!(
                "No GPU the driver lists now has address {pci}: it may have fallen off the bus \
                 for good, or been unbound or passed to a VM. Check `lspci -s {pci}.0` and \
                 `nvidia-smi`; a GPU that does not come back needs a reboot, then a reseat or \
                 an RMA."
            ),
        };
        out.push(Finding::new(
            format!("errors.past_xid_{xid}"),
            severity,
            device,
            logged_at(last).unwrap_or(now_ms),
            title,
            Evidence {
                values: values([
                    ("xid", json!(xid)),
                    ("pci_bus_id", json!(pci.to_string())),
                    ("count", json!(lines.len())),
                    (
                        "first_logged",
                        rfc3339(lines.first().and_then(|x| logged_at(x))),
                    ),
                    ("last_logged", rfc3339(logged_at(last))),
                    (
                        "last_since_boot_s",
                        json!(last.since_boot_us.map(|us| us as f64 / 1e6)),
                    ),
                    ("state_now", state_now),
                    ("line", json!(line)),
                    ("source", json!(log.source)),
                ]),
                window_s: 0.0,
                threshold: "logged by the driver before; fails only while the GPU is lost, or, \
                            for a memory XID, while a repair waits for a reset or remapping \
                            has failed"
                    .into(),
            },
            advice,
        ));
    }
    super::sort(&mut out);
    (out, not_judged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use gpudiag_model::sample::{Event, Sample};

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
            ras: None,
            own_pid: None,
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

    const BOOT: TimeMs = 1_795_461_060_000;

    fn gpu(index: u32, bus: &str) -> DeviceInfo {
        DeviceInfo {
            index,
            pci_bus_id: Some(bus.into()),
            ..DeviceInfo::default()
        }
    }

    /// GPU 0 at 19:00, GPU 1 at 3B:00, as NVML writes them.
    fn gpus() -> Vec<DeviceInfo> {
        vec![gpu(0, "00000000:19:00.0"), gpu(1, "00000000:3B:00.0")]
    }

    fn logged(bus: &str, xid: u64, since_boot_s: u64) -> LoggedXid {
        let pci = PciAddress::parse(bus).unwrap();
        LoggedXid {
            pci,
            xid,
            since_boot_us: Some(since_boot_s * 1_000_000),
            time_ms: Some(BOOT + since_boot_s * 1000),
            text: format!("NVRM: Xid (PCI:{pci}): {xid}, pid=1234, name=python3, ..."),
        }
    }

    fn log(xids: Vec<LoggedXid>) -> Result<XidLog, String> {
        Ok(XidLog {
            source: "/dev/kmsg".into(),
            xids,
            boot_ms: Some(BOOT),
            truncated: None,
        })
    }

    fn healthy(device: u32) -> Sample {
        let mut s = Sample::new(device, BOOT + 7_200_000);
        s.gpu_util_pct = Some(0.0);
        s.remapped_rows_pending = Some(false);
        s.remapped_rows_failure = Some(false);
        s
    }

    fn judge(
        log: &Result<XidLog, String>,
        latest: BTreeMap<u32, Sample>,
    ) -> (Vec<Finding>, Vec<NotJudged>) {
        past_xids(
            log,
            &gpus(),
            &[0, 1],
            &latest,
            BOOT + 7_200_000,
            "before this check",
        )
    }

    #[test]
    fn past_xids_of_a_recovered_gpu_are_history() {
        let log = log(vec![
            logged("0000:3b:00", 79, 3605),
            logged("0000:19:00", 48, 3000),
        ]);
        let (f, not_judged) = judge(&log, BTreeMap::from([(0, healthy(0)), (1, healthy(1))]));
        assert!(not_judged.is_empty());
        let brief: Vec<(&str, Option<u32>, Severity)> = f
            .iter()
            .map(|f| (f.id.as_str(), f.device, f.severity))
            .collect();
        assert_eq!(
            brief,
            [
                ("errors.past_xid_48", Some(0), Severity::Info),
                ("errors.past_xid_79", Some(1), Severity::Info),
            ]
        );
        let xid79 = &f[1];
        assert_eq!(
            xid79.title,
            "XID 79 at 2026-11-23 20:11 UTC (before this check): GPU has fallen off the bus"
        );
        assert_eq!(xid79.time_ms, BOOT + 3_605_000);
        assert_eq!(xid79.evidence.values["pci_bus_id"], json!("0000:3b:00"));
        assert_eq!(
            xid79.evidence.values["last_logged"],
            json!("2026-11-23T20:11:05Z")
        );
        assert_eq!(xid79.evidence.values["source"], json!("/dev/kmsg"));
        assert!(xid79.advice.starts_with("History, not a live fault"));
        assert!(exit_code_is_clean(&f));
    }

    fn exit_code_is_clean(f: &[Finding]) -> bool {
        f.iter().all(|f| f.severity < Severity::Warn)
    }

    #[test]
    fn past_xids_take_their_live_grade_while_the_gpu_state_says_they_matter() {
        let log = log(vec![
            logged("0000:3b:00", 79, 3605),
            logged("0000:3b:00", 13, 3500),
            logged("0000:19:00", 48, 3000),
            logged("0000:19:00", 13, 3100),
        ]);
        let mut pending = healthy(0);
        pending.remapped_rows_pending = Some(true);
        let lost = sanity::all_absent(1, BOOT + 7_200_000, &gpudiag_model::sample::Absent::GpuLost);
        let (f, _) = judge(&log, BTreeMap::from([(0, pending), (1, lost)]));
        let grade = |id: &str, d: u32| {
            f.iter()
                .find(|f| f.id == id && f.device == Some(d))
                .map(|f| f.severity)
        };
        // The lost GPU: every XID it logged explains the loss.
        assert_eq!(grade("errors.past_xid_79", 1), Some(Severity::Fail));
        assert_eq!(grade("errors.past_xid_13", 1), Some(Severity::Warn));
        // A pending repair keeps the DBE live, not an application's exception.
        assert_eq!(grade("errors.past_xid_48", 0), Some(Severity::Fail));
        assert_eq!(grade("errors.past_xid_13", 0), Some(Severity::Info));
        let dbe = f.iter().find(|f| f.id == "errors.past_xid_48").unwrap();
        assert!(
            dbe.title.ends_with(
                "(before this check) — a memory repair still waits for a GPU reset: \
                 double-bit ECC error in GPU memory"
            ),
            "{}",
            dbe.title
        );
        // A failed row remap keeps the remap-failure XID live.
        let mut failed = healthy(0);
        failed.remapped_rows_failure = Some(true);
        let (f, _) = judge(
            &Ok(XidLog {
                xids: vec![logged("0000:19:00", 64, 10)],
                ..log.clone().unwrap()
            }),
            BTreeMap::from([(0, failed)]),
        );
        assert_eq!(f[0].severity, Severity::Fail);
    }

    #[test]
    fn repeated_unplaced_and_unselected_past_xids() {
        let log = log(vec![
            logged("0000:19:00", 13, 100),
            logged("0000:19:00", 13, 200),
            logged("0000:19:00", 13, 300),
            logged("0000:5e:00", 79, 400),
            logged("0000:5e:00", 31, 410),
        ]);
        let (f, _) = judge(&log, BTreeMap::from([(0, healthy(0))]));
        let storm = f.iter().find(|f| f.id == "errors.past_xid_13").unwrap();
        assert_eq!(storm.evidence.values["count"], json!(3));
        assert_eq!(
            storm.evidence.values["first_logged"],
            json!("2026-11-23T19:12:40Z")
        );
        assert_eq!(storm.time_ms, BOOT + 300_000);
        assert!(
            storm
                .title
                .contains("(before this check; 3 times since boot)")
        );
        // An address no listed GPU has: host-wide, a warning for a failure-class XID.
        let gone = f.iter().find(|f| f.id == "errors.past_xid_79").unwrap();
        assert_eq!((gone.device, gone.severity), (None, Severity::Warn));
        assert!(
            gone.title
                .contains("on PCI 0000:5e:00, a GPU the driver does not list now"),
            "{}",
            gone.title
        );
        let app = f.iter().find(|f| f.id == "errors.past_xid_31").unwrap();
        assert_eq!((app.device, app.severity), (None, Severity::Info));
        // A GPU the user did not select is not reported, even as an unknown address.
        let (f, _) = past_xids(
            &log,
            &gpus(),
            &[1],
            &BTreeMap::new(),
            BOOT,
            "before this check",
        );
        assert!(f.iter().all(|f| f.device != Some(0)), "{f:?}");
        assert!(!f.iter().any(|f| f.id == "errors.past_xid_13"), "{f:?}");
    }

    #[test]
    fn an_unreadable_or_partial_log_is_not_judged_not_healthy() {
        let (f, nj) = judge(
            &Err("/dev/kmsg: Operation not permitted (os error 1)".into()),
            BTreeMap::new(),
        );
        assert!(f.is_empty());
        assert_eq!(nj.len(), 1);
        assert_eq!(nj[0].rule, KERNEL_LOG_RULE);
        assert_eq!(nj[0].device, None);
        assert!(
            nj[0].reason.contains("Operation not permitted"),
            "{}",
            nj[0].reason
        );
        assert!(
            nj[0].reason.contains("before this check"),
            "{}",
            nj[0].reason
        );
        let partial = Ok(XidLog {
            truncated: Some("stopped after 500 ms of reading".into()),
            ..log(vec![logged("0000:19:00", 13, 100)]).unwrap()
        });
        let (f, nj) = judge(&partial, BTreeMap::new());
        assert_eq!(f.len(), 1);
        assert!(nj[0].reason.contains("read in part"), "{}", nj[0].reason);
        // Without a time the title says so rather than inventing one.
        let untimed = Ok(XidLog {
            xids: vec![LoggedXid {
                since_boot_us: None,
                time_ms: None,
                ..logged("0000:19:00", 48, 1)
            }],
            ..log(Vec::new()).unwrap()
        });
        let (f, _) = judge(&untimed, BTreeMap::new());
        assert!(
            f[0].title
                .starts_with("XID 48 at an unknown time (before this check)")
        );
        assert_eq!(f[0].evidence.values["last_logged"], serde_json::Value::Null);
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
