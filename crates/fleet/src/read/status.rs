//! The fleet's findings, counts and status: every down target, finding and firing alert, worst
//! first, and the status the exit code is computed from.

use gpudiag_model::finding::Severity;
use gpudiag_model::finding::Status;

use crate::model::*;

pub(super) fn findings_and_status(fleet: &mut Fleet) {
    let mut all: Vec<FleetFinding> = Vec::new();
    let mut counts = Counts::default();
    for node in &fleet.nodes {
        count_node(node, &mut all, &mut counts);
    }
    for a in &fleet.unplaced_alerts {
        counts.alerts_firing += 1;
        all.extend(alert_finding(a, None));
    }
    all.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.gpu.cmp(&b.gpu))
            .then_with(|| a.id.cmp(&b.id))
    });
    all.dedup();
    fleet.status = status_of(fleet, &all, &counts);
    fleet.counts = counts;
    if all.len() > MAX_FINDINGS_LISTED {
        let left = (all.len() - MAX_FINDINGS_LISTED) as u64;
        all.truncate(MAX_FINDINGS_LISTED);
        fleet.left_out.findings = left;
        fleet.degraded.push(format!(
            "findings: the worst {MAX_FINDINGS_LISTED} are listed, {left} more left out (the \
             status counts them all)"
        ));
    }
    fleet.findings = all;
}

/// The most findings (and alerts) `findings` lists, worst first.
pub const MAX_FINDINGS_LISTED: usize = 10_000;

/// A node's down targets, findings and alerts, and its GPUs'.
fn count_node(node: &Node, all: &mut Vec<FleetFinding>, counts: &mut Counts) {
    let finding = |severity: Severity, id: &str, gpu: Option<String>| FleetFinding {
        severity,
        id: id.to_owned(),
        node: Some(node.name.clone()),
        gpu,
        job_key: None,
    };
    counts.nodes += 1;
    if node.state == NodeState::Down {
        counts.nodes_down += 1;
    }
    for _down in node.targets.iter().filter(|t| !t.up) {
        all.push(finding(Severity::Warn, "fleet.target_down", None));
    }
    for f in &node.findings {
        all.push(finding(f.severity, &f.id, None));
    }
    for a in &node.alerts {
        counts.alerts_firing += 1;
        all.extend(alert_finding(a, Some(&node.name)));
    }
    for g in &node.gpus {
        counts.gpus += 1;
        match g.verdict {
            GpuVerdict::Judged { .. } => counts.gpus_judged += 1,
            GpuVerdict::DcgmExporterOnly => counts.gpus_dcgm_exporter_only += 1,
            GpuVerdict::NotJudgedYet => {}
        }
        for f in &g.findings {
            all.push(finding(f.severity, &f.id, g.gpu.clone()));
        }
        for a in &g.alerts {
            counts.alerts_firing += 1;
            all.extend(alert_finding(a, Some(&node.name)));
        }
    }
}

/// Could not run without any GPU or node; else the worst finding; not judged while no GPU has
/// a gpudiag verdict.
fn status_of(fleet: &mut Fleet, all: &[FleetFinding], counts: &Counts) -> Status {
    if counts.gpus == 0 && counts.nodes == 0 {
        fleet.could_not_run = Some(format!(
            "Prometheus at {} holds no GPU series under the selector {} (is `gpudiag serve` or dcgm-exporter scraped?)",
            fleet.prometheus, fleet.selector
        ));
        return Status::CouldNotRun;
    }
    let gpudiag_gpus = counts.gpus - counts.gpus_dcgm_exporter_only;
    match all.iter().map(|f| f.severity).max() {
        Some(Severity::Fail) => Status::Fail,
        Some(Severity::Warn) => Status::Warn,
        _ if gpudiag_gpus == 0 || counts.gpus_judged == 0 => Status::NotJudged,
        _ => Status::Healthy,
    }
}

/// An alert with a severity, as a finding of the node it sits on.
fn alert_finding(a: &Alert, node: Option<&str>) -> Option<FleetFinding> {
    Some(FleetFinding {
        severity: a.severity?,
        id: format!("alert:{}", a.name),
        node: node.map(str::to_owned).or_else(|| a.node.clone()),
        gpu: a.gpu.clone(),
        job_key: a.job_key.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::fleet;

    fn node(name: &str, up: &[bool]) -> Node {
        Node {
            name: name.to_owned(),
            state: if up.contains(&true) {
                NodeState::Up
            } else {
                NodeState::Down
            },
            targets: up
                .iter()
                .map(|up| Target {
                    instance: format!("{name}:1"),
                    scrape_job: "j".to_owned(),
                    up: *up,
                    exporter: None,
                    last_scrape_age_s: None,
                })
                .collect(),
            exporters: Vec::new(),
            gpus: Vec::new(),
            findings: Vec::new(),
            alerts: Vec::new(),
            worst: Rank::Unknown,
        }
    }

    fn alert(name: &str, severity: Option<Severity>) -> Alert {
        Alert {
            name: name.to_owned(),
            state: "firing".to_owned(),
            severity,
            summary: None,
            node: Some("far".to_owned()),
            gpu: None,
            uuid: None,
            job_key: None,
            pace: None,
            scope: None,
            active_since: None,
        }
    }

    /// Past the cap the worst findings are listed and the rest counted; the status still
    /// comes from them all.
    #[test]
    fn findings_past_the_cap_are_counted_not_listed() {
        let mut f = fleet();
        let mut a = node("a", &[true]);
        a.findings = (0..MAX_FINDINGS_LISTED + 5)
            .map(|i| FindingRef {
                severity: Severity::Info,
                id: format!("x.{i:05}"),
            })
            .collect();
        a.findings.push(FindingRef {
            severity: Severity::Fail,
            id: "z.last".to_owned(),
        });
        f.nodes.push(a);
        findings_and_status(&mut f);
        assert_eq!(f.findings.len(), MAX_FINDINGS_LISTED);
        assert_eq!(f.findings[0].id, "z.last", "the worst first");
        assert_eq!(f.left_out.findings, 6);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.degraded[0].contains("6 more left out"),
            "{:?}",
            f.degraded
        );
    }

    #[test]
    fn nothing_read_could_not_run() {
        let mut f = fleet();
        findings_and_status(&mut f);
        assert_eq!(f.status, Status::CouldNotRun);
        assert!(f.could_not_run.unwrap().contains("holds no GPU series"));
    }

    #[test]
    fn a_down_target_warns_and_findings_sort_worst_first() {
        let mut f = fleet();
        let mut a = node("a", &[true, false]);
        a.findings.push(FindingRef {
            severity: Severity::Fail,
            id: "kernel.x".to_owned(),
        });
        f.nodes = vec![a, node("b", &[false])];
        f.unplaced_alerts = vec![
            alert("GpuLost", Some(Severity::Fail)),
            alert("NoSeverity", None),
        ];
        findings_and_status(&mut f);
        assert_eq!(f.status, Status::Fail);
        let ids: Vec<(&str, Option<&str>)> = f
            .findings
            .iter()
            .map(|x| (x.id.as_str(), x.node.as_deref()))
            .collect();
        assert_eq!(
            ids,
            [
                ("kernel.x", Some("a")),
                ("alert:GpuLost", Some("far")),
                ("fleet.target_down", Some("a")),
                ("fleet.target_down", Some("b")),
            ]
        );
        assert_eq!(
            (f.counts.nodes, f.counts.nodes_down, f.counts.alerts_firing),
            (2, 1, 2)
        );
    }

    #[test]
    fn gpus_of_dcgm_exporter_alone_are_not_judged() {
        let mut f = fleet();
        let mut n = node("a", &[true]);
        let gpu: Gpu = serde_json::from_value(serde_json::json!({
            "gpu": "0", "UUID": null, "model": null, "exporters": ["dcgm_exporter"],
            "util_pct": null, "sm_active_pct": null, "tensor_active_pct": null,
            "memory_used_mib": null, "memory_total_mib": null, "power_w": null,
            "temperature_c": null, "verdict": {"state": "dcgm_exporter_only"}, "findings": [],
            "jobs": [], "pod": null, "alerts": [], "last_scrape_age_s": null, "rank": "unknown"
        }))
        .unwrap();
        n.gpus.push(gpu);
        f.nodes = vec![n];
        findings_and_status(&mut f);
        assert_eq!(f.status, Status::NotJudged);
        assert_eq!((f.counts.gpus, f.counts.gpus_dcgm_exporter_only), (1, 1));
    }
}
