//! The Prometheus text exposition of gpudiag's state: the latest telemetry, findings and
//! bottleneck verdicts of a [`Snapshot`], as `gpudiag serve` answers on `/metrics`.
//!
//! Names follow dcgm-exporter's default counters where one exists (same name, unit and type), so
//! dashboards built for it work; labels are dcgm-exporter's `gpu`, `UUID`, `pci_bus_id`,
//! `modelName` and `Hostname`. gpudiag's own series start with `gpudiag_`; the job series
//! (`job_series.rs`) let Prometheus compare the GPUs of a job across nodes. A value the GPU did
//! not report is left out, never written as 0.
//!
//! A scrape only renders a snapshot that sampling published (`exposition.rs` writes the
//! format); sampling and serving are the binary's.

mod exposition;
mod job_series;
pub mod process_series;

pub use exposition::{
    CONTENT_TYPE, Exposition, Labels, escape_help, escape_label_value, format_value,
};

use std::collections::BTreeMap;
use std::time::Instant;

use gpudiag_model::decode::THROTTLE_REASONS;
use gpudiag_model::finding::{Finding, Severity};
use gpudiag_model::job::JobVerdict;
use gpudiag_model::metric_table::{Kind, Prometheus};
use gpudiag_model::prometheus_names::{label, series};
use gpudiag_model::sample::MetricDef;
use gpudiag_model::sample::{DeviceInfo, HostInfo, METRIC_TABLE, Sample};
use gpudiag_model::verdict::Verdict;

/// What a scrape shows: the newest state of every device.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub host: HostInfo,
    pub devices: Vec<DeviceInfo>,
    pub latest: BTreeMap<u32, Sample>,
    /// When each device's latest sample arrived here, for `gpudiag_sample_age_seconds`.
    pub received: BTreeMap<u32, Instant>,
    /// The last XID seen per device (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
    pub last_xid: BTreeMap<u32, u64>,
    pub findings: Vec<Finding>,
    /// The latest bottleneck verdict per device over the rolling window; a device without one
    /// could not be judged yet.
    pub verdicts: BTreeMap<u32, Verdict>,
    /// The verdicts on the jobs of two or more GPUs judged on this host, over the same window.
    pub jobs: Vec<JobVerdict>,
    /// The source ended (a replay played out, or live sampling failed); values are the last ones.
    pub source_ended: bool,
    /// The most processes that get per-process series in one scrape.
    pub process_cap: process_series::ProcessCap,
}

/// dcgm-exporter's label set for a device; unknown values are left out.
fn device_labels(d: &DeviceInfo, host: &HostInfo) -> Labels {
    let mut l: Labels = vec![(label::GPU, d.index.to_string())];
    if let Some(u) = &d.uuid {
        l.push((label::UUID, u.clone()));
    }
    if let Some(b) = &d.pci_bus_id {
        l.push((label::PCI_BUS_ID, b.clone()));
    }
    if let Some(n) = &d.name {
        l.push((label::MODEL_NAME, n.clone()));
    }
    if let Some(h) = &host.hostname {
        l.push((label::HOSTNAME, h.clone()));
    }
    l
}

/// The order the families had before the metric table, so /metrics reads the same from one
/// version to the next; families added since follow in table order.
const FAMILY_ORDER: [&str; 32] = [
    series::DCGM_FI_DEV_GPU_UTIL,
    series::DCGM_FI_DEV_MEM_COPY_UTIL,
    series::DCGM_FI_DEV_ENC_UTIL,
    series::DCGM_FI_DEV_DEC_UTIL,
    series::DCGM_FI_DEV_FB_USED,
    series::DCGM_FI_DEV_FB_FREE,
    series::DCGM_FI_DEV_POWER_USAGE,
    series::DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    series::DCGM_FI_DEV_GPU_TEMP,
    series::DCGM_FI_DEV_MEMORY_TEMP,
    series::DCGM_FI_DEV_SM_CLOCK,
    series::DCGM_FI_DEV_MEM_CLOCK,
    series::DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
    series::DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
    series::DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
    series::DCGM_FI_DEV_ECC_SBE_AGG_TOTAL,
    series::DCGM_FI_DEV_ECC_DBE_AGG_TOTAL,
    series::DCGM_FI_DEV_RETIRED_SBE,
    series::DCGM_FI_DEV_RETIRED_DBE,
    series::DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    series::DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
    series::DCGM_FI_DEV_ROW_REMAP_FAILURE,
    series::GPUDIAG_PCIE_RX_BYTES_PER_SECOND,
    series::GPUDIAG_PCIE_TX_BYTES_PER_SECOND,
    series::GPUDIAG_PCIE_LINK_GENERATION,
    series::GPUDIAG_PCIE_LINK_GENERATION_MAX,
    series::GPUDIAG_PCIE_LINK_WIDTH,
    series::GPUDIAG_PCIE_LINK_WIDTH_MAX,
    series::GPUDIAG_POWER_LIMIT_WATTS,
    series::GPUDIAG_PERFORMANCE_STATE,
    series::GPUDIAG_FAN_SPEED_PERCENT,
    series::GPUDIAG_TEMPERATURE_SLOWDOWN_CELSIUS,
];

/// The per-sample families: the table's fields with a Prometheus series, grouped by series
/// name (several fields may share one, told apart by a label).
fn table_families() -> Vec<(&'static Prometheus, Kind, Vec<&'static MetricDef>)> {
    let mut families: Vec<(&'static Prometheus, Kind, Vec<&'static MetricDef>)> = Vec::new();
    for m in METRIC_TABLE {
        let Some(p) = &m.prometheus else { continue };
        match families.iter_mut().find(|(f, _, _)| f.name == p.name) {
            Some((_, _, fields)) => fields.push(m),
            None => families.push((p, m.kind, vec![m])),
        }
    }
    let position = |name: &str| FAMILY_ORDER.iter().position(|n| *n == name);
    families.sort_by_key(|(p, _, _)| position(p.name).unwrap_or(FAMILY_ORDER.len()));
    families
}

/// A device with a latest sample, and its labels.
type DeviceRow<'a> = (&'a DeviceInfo, &'a Sample, Labels);

/// Renders a snapshot; `now` dates the sample ages.
pub fn render(snap: &Snapshot, now: Instant) -> String {
    let mut x = Exposition::default();
    let devices = device_rows(snap);
    table_series(&mut x, &devices);
    xid_series(&mut x, snap, &devices);
    throttle_reason_series(&mut x, &devices);
    sample_age_series(&mut x, snap, &devices, now);
    verdict_series(&mut x, snap, &devices);
    process_series::render(&mut x, snap, &devices);
    job_series::render(&mut x, snap, &devices);
    finding_series(&mut x, snap);
    finding_count_series(&mut x, snap);
    info_series(&mut x, snap);
    x.family(
        series::GPUDIAG_SOURCE_ENDED,
        Kind::Gauge,
        "1 when the telemetry source ended (a replay played out or sampling failed).",
        &[(Vec::new(), f64::from(u8::from(snap.source_ended)))],
    );
    x.finish()
}

/// The devices with a latest sample, each with dcgm-exporter's labels and its pod's.
fn device_rows(snap: &Snapshot) -> Vec<DeviceRow<'_>> {
    snap.devices
        .iter()
        .filter_map(|d| {
            let s = snap.latest.get(&d.index)?;
            let mut labels = device_labels(d, &snap.host);
            labels.extend(process_series::device_pod_labels(s));
            Some((d, s, labels))
        })
        .collect()
}

/// The metric table's families, one series per device (and per label value, for fields that
/// share a family).
fn table_series(x: &mut Exposition, devices: &[DeviceRow<'_>]) {
    for (family, kind, fields) in table_families() {
        let mut samples: Vec<(Labels, f64)> = Vec::new();
        for m in fields {
            let Some(p) = &m.prometheus else { continue };
            for (_, s, l) in devices {
                let Some(v) = m.get(s) else { continue };
                let mut labels = l.clone();
                labels.extend(p.label.map(|(k, v)| (k, v.to_owned())));
                samples.push((labels, p.round.apply(p.scale.apply(v))));
            }
        }
        x.family(family.name, kind, family.help, &samples);
    }
}

fn xid_series(x: &mut Exposition, snap: &Snapshot, devices: &[DeviceRow<'_>]) {
    let xids: Vec<(Labels, f64)> = devices
        .iter()
        .filter_map(|(d, _, l)| Some((l.clone(), *snap.last_xid.get(&d.index)? as f64)))
        .collect();
    x.family(
        series::DCGM_FI_DEV_XID_ERRORS,
        Kind::Gauge,
        "Value of the last XID error encountered.",
        &xids,
    );
}

/// The table holds throttle reasons as one bit mask, which no dashboard can use as a number:
/// each reason is its own 0/1 series here.
fn throttle_reason_series(x: &mut Exposition, devices: &[DeviceRow<'_>]) {
    let mut throttle = Vec::new();
    for (_, s, l) in devices {
        let Some(bits) = s.throttle_reasons else {
            continue;
        };
        for (bit, name) in throttle_reason_names(bits) {
            let mut labels = l.clone();
            labels.push((label::REASON, name));
            throttle.push((labels, f64::from(u8::from(bits & bit != 0))));
        }
    }
    x.family(
        series::GPUDIAG_THROTTLE_REASON,
        Kind::Gauge,
        "1 while this clock-event (throttle) reason is active, else 0.",
        &throttle,
    );
}

/// Every named reason, then the bits NVML defines but this build does not name, which still
/// get a series while set.
fn throttle_reason_names(bits: u64) -> Vec<(u64, String)> {
    let mut names: Vec<(u64, String)> = THROTTLE_REASONS
        .iter()
        .map(|(b, n)| (*b, (*n).to_string()))
        .collect();
    for bit in (0..64).map(|i| 1u64 << i) {
        if bits & bit != 0 && !names.iter().any(|(b, _)| *b == bit) {
            names.push((bit, format!("unknown_{bit:#x}")));
        }
    }
    names
}

fn sample_age_series(x: &mut Exposition, snap: &Snapshot, devices: &[DeviceRow<'_>], now: Instant) {
    let ages: Vec<(Labels, f64)> = devices
        .iter()
        .filter_map(|(d, _, l)| {
            let at = snap.received.get(&d.index)?;
            Some((l.clone(), now.saturating_duration_since(*at).as_secs_f64()))
        })
        .collect();
    x.family(
        series::GPUDIAG_SAMPLE_AGE_SECONDS,
        Kind::Gauge,
        "Seconds since gpudiag last read this GPU.",
        &ages,
    );
}

/// One series per judged GPU, its state in the labels (a fixed set: ten bottlenecks, three
/// confidences, two bases); when the verdict changes the old series goes stale at once.
/// Whether a GPU has a verdict at all is its own 0/1 series, so "not judged yet" is not
/// confused with a missing scrape.
fn verdict_series(x: &mut Exposition, snap: &Snapshot, devices: &[DeviceRow<'_>]) {
    let mut verdicts: Vec<(Labels, f64)> = Vec::new();
    let mut judged: Vec<(Labels, f64)> = Vec::new();
    for (d, _, l) in devices {
        let v = snap.verdicts.get(&d.index);
        judged.push((l.clone(), f64::from(u8::from(v.is_some()))));
        if let Some(v) = v {
            let mut labels = l.clone();
            labels.push((label::VERDICT, v.bottleneck.name().to_owned()));
            labels.push((label::CONFIDENCE, v.confidence.to_string()));
            labels.push((label::BASIS, v.basis.name().to_owned()));
            verdicts.push((labels, 1.0));
        }
    }
    x.family(
        series::GPUDIAG_VERDICT,
        Kind::Gauge,
        "1 for the bottleneck verdict on this GPU over the rules' utilisation window, labelled by \
         the bottleneck (verdict), its confidence and what it was judged from (basis).",
        &verdicts,
    );
    x.family(
        series::GPUDIAG_VERDICT_JUDGED,
        Kind::Gauge,
        "1 when this GPU has a bottleneck verdict, 0 while it cannot be judged (too little data so \
         far, or no utilisation reading).",
        &judged,
    );
}

/// One series per active finding (the first of each id and device).
fn finding_series(x: &mut Exposition, snap: &Snapshot) {
    let mut active: Vec<(Labels, f64)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for f in &snap.findings {
        if !seen.insert((f.id.clone(), f.device)) {
            continue;
        }
        let mut labels = finding_labels(f, snap);
        labels.push((label::ID, f.id.clone()));
        labels.push((label::SEVERITY, f.severity.to_string()));
        active.push((labels, 1.0));
    }
    x.family(
        series::GPUDIAG_FINDING,
        Kind::Gauge,
        "1 for each active finding, labelled by its id and severity.",
        &active,
    );
}

/// A finding's device labels; those of a device no longer listed, or of the host, as far as
/// they are known.
fn finding_labels(f: &Finding, snap: &Snapshot) -> Labels {
    if let Some(d) = f
        .device
        .and_then(|i| snap.devices.iter().find(|d| d.index == i))
    {
        return device_labels(d, &snap.host);
    }
    let mut l: Labels = Vec::new();
    if let Some(i) = f.device {
        l.push((label::GPU, i.to_string()));
    }
    if let Some(h) = &snap.host.hostname {
        l.push((label::HOSTNAME, h.clone()));
    }
    l
}

fn finding_count_series(x: &mut Exposition, snap: &Snapshot) {
    let counts: Vec<(Labels, f64)> = [Severity::Info, Severity::Warn, Severity::Fail]
        .into_iter()
        .map(|sev| {
            let mut l: Labels = Vec::new();
            if let Some(h) = &snap.host.hostname {
                l.push((label::HOSTNAME, h.clone()));
            }
            l.push((label::SEVERITY, sev.to_string()));
            let n = snap.findings.iter().filter(|f| f.severity == sev).count();
            (l, n as f64)
        })
        .collect();
    x.family(
        series::GPUDIAG_FINDINGS,
        Kind::Gauge,
        "Number of active findings of each severity.",
        &counts,
    );
}

/// `revision` as Prometheus's own `*_build_info` names the commit, so a fleet dashboard can
/// tell two builds of one version apart.
fn info_series(x: &mut Exposition, snap: &Snapshot) {
    let revision = gpudiag_model::build_info::COMMIT.unwrap_or("unknown");
    let mut info: Labels = vec![
        (
            label::VERSION,
            gpudiag_model::build_info::VERSION.to_string(),
        ),
        (label::REVISION, revision.to_string()),
    ];
    if let Some(h) = &snap.host.hostname {
        info.push((label::HOSTNAME, h.clone()));
    }
    if let Some(v) = &snap.host.driver_version {
        info.push((label::DRIVER_VERSION, v.clone()));
    }
    x.family(
        series::GPUDIAG_INFO,
        Kind::Gauge,
        "Always 1; the labels say which gpudiag and driver serve these metrics.",
        &[(info, 1.0)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::finding::Evidence;
    use gpudiag_model::verdict::{Basis, Bottleneck, Confidence};

    fn snapshot() -> Snapshot {
        let host = HostInfo {
            hostname: Some("node \"7\"\\a\nb".into()),
            driver_version: Some("580.65.06".into()),
            ..HostInfo::default()
        };
        let devices = vec![
            DeviceInfo {
                index: 0,
                uuid: Some("GPU-0".into()),
                name: Some("NVIDIA H200".into()),
                pci_bus_id: Some("00000000:19:00.0".into()),
                ..DeviceInfo::default()
            },
            DeviceInfo {
                index: 1,
                ..DeviceInfo::default()
            },
        ];
        let s0 = Sample {
            gpu_util_pct: Some(99.0),
            mem_used_bytes: Some(3 * 1024 * 1024 * 1024),
            power_w: Some(689.125),
            energy_j: Some(1.5),
            throttle_reasons: Some(0x4),
            pcie_replay_count: Some(0),
            ..Sample::new(0, 1000)
        };
        // GPU 1 reports almost nothing: its series must be absent, not 0.
        let s1 = Sample {
            temp_gpu_c: Some(33.0),
            ..Sample::new(1, 1000)
        };
        let now = Instant::now();
        Snapshot {
            host,
            devices,
            latest: [(0, s0), (1, s1)].into_iter().collect(),
            received: [(0, now), (1, now)].into_iter().collect(),
            last_xid: [(0, 48)].into_iter().collect(),
            findings: vec![Finding {
                id: "errors.xid_48".into(),
                severity: Severity::Fail,
                device: Some(0),
                time_ms: 1000,
                title: "t".into(),
                evidence: Evidence {
                    values: serde_json::Map::new(),
                    window_s: 0.0,
                    threshold: "event".into(),
                },
                advice: "a".into(),
                last_seen_ms: None,
                state: Default::default(),
                recorded: false,
            }],
            verdicts: [(0, verdict(0, Bottleneck::LaunchBound))]
                .into_iter()
                .collect(),
            jobs: Vec::new(),
            source_ended: false,
            process_cap: Default::default(),
        }
    }

    fn verdict(device: u32, bottleneck: Bottleneck) -> Verdict {
        Verdict {
            device,
            bottleneck,
            confidence: Confidence::Low,
            basis: Basis::Utilisation,
            start_ms: 0,
            end_ms: 1000,
            // Free text never becomes a label: it would make a new series each time it changed.
            title: "GPU 0 launch-bound over 30 s (utilisation 37%)".into(),
            evidence: serde_json::Map::new(),
            advice: "a".into(),
            pid: Some(7),
            processes: Vec::new(),
        }
    }

    fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .collect()
    }

    #[test]
    fn help_and_type_precede_samples_once_per_family() {
        let text = render(&snapshot(), Instant::now());
        let mut seen = std::collections::BTreeSet::new();
        let mut current = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(name.clone()), "{name} twice");
                current = Some(name);
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next().map(str::to_string), current);
                assert!(matches!(it.next(), Some("gauge" | "counter")));
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(Some(name.to_string()), current, "{line}");
            }
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn label_sets_units_and_absent_values() {
        let text = render(&snapshot(), Instant::now());
        let util = lines_of(&text, series::DCGM_FI_DEV_GPU_UTIL);
        assert_eq!(
            util,
            [
                "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:19:00.0\",\
                 modelName=\"NVIDIA H200\",Hostname=\"node \\\"7\\\"\\\\a\\nb\"} 99"
            ]
        );
        // MiB and mJ as dcgm-exporter has them.
        assert!(lines_of(&text, series::DCGM_FI_DEV_FB_USED)[0].ends_with(" 3072"));
        assert!(
            lines_of(&text, series::DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)[0].ends_with(" 1500")
        );
        assert!(lines_of(&text, series::DCGM_FI_DEV_POWER_USAGE)[0].ends_with(" 689.125"));
        // A real 0 is exported; an absent value is not.
        assert!(lines_of(&text, series::DCGM_FI_DEV_PCIE_REPLAY_COUNTER)[0].ends_with(" 0"));
        assert!(
            lines_of(&text, series::DCGM_FI_DEV_GPU_UTIL)
                .iter()
                .all(|l| !l.contains("gpu=\"1\""))
        );
        assert!(!text.contains(series::DCGM_FI_DEV_MEMORY_TEMP));
        let temp = lines_of(&text, series::DCGM_FI_DEV_GPU_TEMP);
        assert_eq!(temp.len(), 1);
        assert!(
            temp[0].starts_with("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",Hostname="),
            "{}",
            temp[0]
        );
        assert!(lines_of(&text, series::DCGM_FI_DEV_XID_ERRORS)[0].ends_with(" 48"));
        // Throttle: one series per reason for GPU 0 only (GPU 1 did not say).
        let throttle = lines_of(&text, series::GPUDIAG_THROTTLE_REASON);
        assert_eq!(throttle.len(), THROTTLE_REASONS.len());
        assert!(
            throttle
                .iter()
                .any(|l| l.contains("reason=\"sw_power_cap\"") && l.ends_with(" 1"))
        );
        assert!(
            throttle
                .iter()
                .any(|l| l.contains("reason=\"gpu_idle\"") && l.ends_with(" 0"))
        );
        let finding = lines_of(&text, series::GPUDIAG_FINDING);
        assert_eq!(finding.len(), 1);
        assert!(
            finding[0].contains("id=\"errors.xid_48\",severity=\"fail\"} 1"),
            "{}",
            finding[0]
        );
        let counts = lines_of(&text, series::GPUDIAG_FINDINGS);
        assert_eq!(counts.len(), 3);
        assert!(
            counts
                .iter()
                .any(|l| l.contains("severity=\"fail\"") && l.ends_with(" 1"))
        );
        assert!(
            counts
                .iter()
                .any(|l| l.contains("severity=\"warn\"") && l.ends_with(" 0"))
        );
        // The verdict: one series for the judged GPU, its state in bounded labels only; the
        // other GPU is reported as not judged rather than left out.
        assert_eq!(
            lines_of(&text, series::GPUDIAG_VERDICT),
            [
                "gpudiag_verdict{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:19:00.0\",\
                 modelName=\"NVIDIA H200\",Hostname=\"node \\\"7\\\"\\\\a\\nb\",\
                 verdict=\"launch_bound\",confidence=\"low\",basis=\"utilisation\"} 1"
            ]
        );
        let judged = lines_of(&text, series::GPUDIAG_VERDICT_JUDGED);
        assert_eq!(judged.len(), 2);
        assert!(judged[0].starts_with("gpudiag_verdict_judged{gpu=\"0\""));
        assert!(judged[0].ends_with("} 1"), "{}", judged[0]);
        assert!(judged[1].starts_with("gpudiag_verdict_judged{gpu=\"1\""));
        assert!(judged[1].ends_with("} 0"), "{}", judged[1]);
        let age = lines_of(&text, series::GPUDIAG_SAMPLE_AGE_SECONDS);
        assert_eq!(age.len(), 2);
        assert_eq!(
            lines_of(&text, series::GPUDIAG_SOURCE_ENDED),
            ["gpudiag_source_ended 0"]
        );
    }

    #[test]
    fn fields_sharing_a_family_are_told_apart_by_a_label() {
        let mut snap = snapshot();
        if let Some(s) = snap.latest.get_mut(&0) {
            s.throttle_sw_power_cap_s = Some(1.5);
            s.throttle_hw_thermal_slowdown_s = Some(0.0);
        }
        let text = render(&snap, Instant::now());
        let name = series::GPUDIAG_THROTTLE_SECONDS_TOTAL;
        assert_eq!(text.matches(&format!("# TYPE {name} counter")).count(), 1);
        let lines = lines_of(&text, name);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].ends_with(",reason=\"sw_power_cap\"} 1.5"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].ends_with(",reason=\"hw_thermal_slowdown\"} 0"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn every_family_of_the_old_order_comes_from_the_table() {
        let families: Vec<&str> = table_families().iter().map(|(p, _, _)| p.name).collect();
        assert_eq!(families[..FAMILY_ORDER.len()], FAMILY_ORDER);
    }

    #[test]
    fn empty_snapshot_still_says_who_serves() {
        let text = render(&Snapshot::default(), Instant::now());
        assert!(text.contains("gpudiag_info{version="));
        let revision = gpudiag_model::build_info::COMMIT.unwrap_or("unknown");
        assert!(
            text.contains(&format!(",revision=\"{revision}\"")),
            "{text}"
        );
        assert!(!text.contains("DCGM_"));
    }
}
