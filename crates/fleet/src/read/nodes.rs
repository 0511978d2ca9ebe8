//! The merge: the gathered drafts, targets and alerts become the fleet's nodes and GPUs, each
//! ranked by the worst it shows, then its jobs and findings.

use std::collections::{BTreeMap, BTreeSet};

use gpudiag_model::finding::Severity;
use gpudiag_model::prometheus_names::{label, series};

use super::devices::{Gathered, GpuDraft};
use super::labels::{gpu_index_key, instance_host};
use super::optional::{GPUDIAG_ALERTS, alert_of};
use super::targets::Target as ScrapeTarget;
use super::{jobs, status};
use crate::client::{ApiAlert, Series};
use crate::model::*;

/// What the reads returned beside the gathered drafts.
pub(super) struct Reads<'a> {
    pub targets: Vec<ScrapeTarget>,
    pub alerts: Vec<ApiAlert>,
    pub rule_series: Vec<Series>,
    pub gpudiag_instances: &'a BTreeSet<String>,
    /// The instant read (ms), which scrape ages are counted to.
    pub at: i64,
    /// No selector narrows the fleet: gpudiag's alerts that name no node of it are kept.
    pub everything: bool,
}

/// Firing alerts by where they belong, and every alert of the shipped rules on a job.
#[derive(Default)]
struct PlacedAlerts {
    gpu: BTreeMap<String, Vec<Alert>>,
    node: BTreeMap<String, Vec<Alert>>,
    unplaced: Vec<Alert>,
    job: Vec<Alert>,
}

pub(super) fn assemble(fleet: &mut Fleet, gathered: Gathered, reads: Reads<'_>) {
    let Gathered {
        drafts,
        instance_node,
        node_findings,
        node_jobs,
        duplicated,
    } = gathered;
    let mut nodes = nodes_of_targets(
        &reads.targets,
        &instance_node,
        reads.gpudiag_instances,
        reads.at,
    );
    let target_age: BTreeMap<String, f64> = nodes
        .values()
        .flat_map(|n| n.targets.iter())
        .filter_map(|t| Some((t.instance.clone(), t.last_scrape_age_s?)))
        .collect();
    let mut placed = place_alerts(
        &reads.alerts,
        &fleet.node_label,
        &drafts,
        &nodes,
        reads.everything,
    );
    fleet.unplaced_alerts.append(&mut placed.unplaced);

    for (_, d) in drafts {
        let node = nodes
            .entry(d.node.clone())
            .or_insert_with(|| empty_node(&d.node));
        for e in &d.exporters {
            if !node.exporters.contains(e) {
                node.exporters.push(*e);
            }
        }
        let gpu_alerts = match &d.uuid {
            Some(u) if duplicated.contains_key(u) => alerts_on_node(&mut placed.gpu, u, &d.node),
            Some(u) => placed.gpu.remove(u).unwrap_or_default(),
            None => Vec::new(),
        };
        node.gpus.push(gpu_of(d, gpu_alerts, &target_age));
    }
    // An alert on a duplicated UUID that names none of its nodes has no GPU to sit under, and
    // still counts.
    for uuid in duplicated.keys() {
        fleet
            .unplaced_alerts
            .extend(placed.gpu.remove(uuid).unwrap_or_default());
    }
    fleet.degraded.extend(duplicated_notes(&duplicated));
    for (name, f) in node_findings {
        let node = nodes
            .entry(name.clone())
            .or_insert_with(|| empty_node(&name));
        let mut f: Vec<FindingRef> = f.into_iter().collect();
        f.sort_by(|a, b| b.cmp(a));
        node.findings = f;
    }
    for (name, a) in placed.node {
        if let Some(node) = nodes.get_mut(&name) {
            node.alerts = a;
        }
    }
    nodes.values_mut().for_each(finish_node);
    let mut nodes: Vec<Node> = nodes.into_values().collect();
    nodes.sort_by(|a, b| b.worst.cmp(&a.worst).then_with(|| a.name.cmp(&b.name)));
    fleet.nodes = nodes;

    fleet.jobs = jobs::jobs(fleet, node_jobs, &placed.job, &reads.rule_series);
    status::findings_and_status(fleet);
    list_within_caps(fleet);
}

/// The most GPUs the fleet lists: whole nodes, worst first, up to this many GPUs.
pub const MAX_GPUS_LISTED: usize = 8192;

/// The most jobs the fleet lists, stalled and worst first.
pub const MAX_JOBS_LISTED: usize = 2000;

/// Cuts the nodes (whole, worst first) and jobs past their caps, counting what is left out;
/// the counts, findings and status were taken from them all.
fn list_within_caps(fleet: &mut Fleet) {
    let mut room = MAX_GPUS_LISTED;
    let mut listed = 0;
    for node in &mut fleet.nodes {
        if node.gpus.len() > room {
            // A first node larger than the cap is listed in part.
            if listed == 0 {
                fleet.left_out.gpus += (node.gpus.len() - room) as u64;
                node.gpus.truncate(room);
                listed += 1;
            }
            break;
        }
        room -= node.gpus.len();
        listed += 1;
    }
    let gone = fleet.nodes.split_off(listed.min(fleet.nodes.len()));
    if !gone.is_empty() {
        fleet.left_out.nodes = gone.len() as u64;
        fleet.left_out.gpus += gone.iter().map(|n| n.gpus.len() as u64).sum::<u64>();
    }
    if fleet.left_out.gpus > 0 {
        fleet.degraded.push(format!(
            "GPUs: {MAX_GPUS_LISTED} at most are listed, worst nodes first; {} GPU(s) on {} more \
             node(s) left out (counted in the header and the status; narrow --selector to see them)",
            fleet.left_out.gpus, fleet.left_out.nodes
        ));
    }
    if fleet.jobs.len() > MAX_JOBS_LISTED {
        let left = fleet.jobs.len() - MAX_JOBS_LISTED;
        fleet.jobs.truncate(MAX_JOBS_LISTED);
        fleet.left_out.jobs = left as u64;
        fleet.degraded.push(format!(
            "jobs: the first {MAX_JOBS_LISTED} are listed (stalled, then worst first), {left} \
             more left out"
        ));
    }
}

/// The firing alerts on a duplicated UUID that name this node.
fn alerts_on_node(
    gpu_alerts: &mut BTreeMap<String, Vec<Alert>>,
    uuid: &str,
    node: &str,
) -> Vec<Alert> {
    let Some(all) = gpu_alerts.get_mut(uuid) else {
        return Vec::new();
    };
    let (here, elsewhere) = std::mem::take(all)
        .into_iter()
        .partition(|a| a.node.as_deref() == Some(node));
    *all = elsewhere;
    here
}

/// How many duplicated UUIDs a note lists by name; the rest are counted.
const DUPLICATES_NAMED: usize = 8;

/// One note per set of nodes that share UUIDs (a cloned image gives all its GPUs' UUIDs to
/// the same nodes).
fn duplicated_notes(duplicated: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut by_nodes: BTreeMap<&BTreeSet<String>, Vec<&str>> = BTreeMap::new();
    for (uuid, nodes) in duplicated {
        by_nodes.entry(nodes).or_default().push(uuid);
    }
    by_nodes
        .into_iter()
        .map(|(nodes, uuids)| {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let mut named = uuids[..uuids.len().min(DUPLICATES_NAMED)].join(", ");
            if uuids.len() > DUPLICATES_NAMED {
                named += &format!(" and {} more", uuids.len() - DUPLICATES_NAMED);
            }
            format!(
                "{} GPU UUID(s) reported by each of the nodes {}: {named}; their GPUs are listed \
                 on each node, and the shipped rules keep them apart by node, but anything \
                 keyed on the UUID alone mixes them up (a cloned VM image or a relabelling \
                 slip?)",
                uuids.len(),
                nodes.join(", ")
            )
        })
        .collect()
}

fn empty_node(name: &str) -> Node {
    Node {
        name: name.to_owned(),
        state: NodeState::Up,
        targets: Vec::new(),
        exporters: Vec::new(),
        gpus: Vec::new(),
        findings: Vec::new(),
        alerts: Vec::new(),
        worst: Rank::Unknown,
    }
}

/// The nodes the scrape targets belong to, each with its targets.
fn nodes_of_targets(
    targets: &[ScrapeTarget],
    instance_node: &BTreeMap<String, String>,
    gpudiag_instances: &BTreeSet<String>,
    at: i64,
) -> BTreeMap<String, Node> {
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    for t in targets {
        let s = &t.series;
        let Some(instance) = s.label(label::INSTANCE) else {
            continue;
        };
        let name = instance_node
            .get(instance)
            .cloned()
            .unwrap_or_else(|| instance_host(instance).to_owned());
        let node = nodes
            .entry(name.clone())
            .or_insert_with(|| empty_node(&name));
        node.targets.push(Target {
            instance: instance.to_owned(),
            scrape_job: s.label(label::SCRAPE_JOB).unwrap_or_default().to_owned(),
            up: s.value >= 1.0,
            exporter: if gpudiag_instances.contains(instance) {
                Some(Exporter::Gpudiag)
            } else if s.value >= 1.0 {
                Some(Exporter::DcgmExporter)
            } else {
                None
            },
            last_scrape_age_s: t.stamp.map(|stamp| ((at as f64 / 1000.0) - stamp).max(0.0)),
        });
    }
    nodes
}

/// Alerts: placed on a GPU by UUID, else on a node, else kept aside when they are gpudiag's
/// and no selector narrows the fleet (they may be about what it leaves out).
fn place_alerts(
    alerts: &[ApiAlert],
    node_label: &str,
    drafts: &BTreeMap<String, GpuDraft>,
    target_nodes: &BTreeMap<String, Node>,
    everything: bool,
) -> PlacedAlerts {
    let uuids: BTreeSet<String> = drafts.values().filter_map(|d| d.uuid.clone()).collect();
    let node_names: BTreeSet<String> = drafts
        .values()
        .map(|d| d.node.clone())
        .chain(target_nodes.keys().cloned())
        .collect();
    let mut placed = PlacedAlerts::default();
    for a in alerts {
        let alert = alert_of(a, node_label);
        let ours = GPUDIAG_ALERTS.contains(&alert.name.as_str());
        if alert.job_key.is_some() && ours {
            placed.job.push(alert.clone());
        }
        if a.state != "firing" {
            continue;
        }
        if let Some(u) = alert.uuid.as_ref().filter(|u| uuids.contains(*u)) {
            placed.gpu.entry(u.clone()).or_default().push(alert);
        } else if let Some(n) = alert.node.as_ref().filter(|n| node_names.contains(*n)) {
            placed.node.entry(n.clone()).or_default().push(alert);
        } else if ours && everything {
            placed.unplaced.push(alert);
        }
    }
    placed
}

/// A GPU as the fleet shows it, from its draft and its firing alerts.
fn gpu_of(d: GpuDraft, mut alerts: Vec<Alert>, target_age: &BTreeMap<String, f64>) -> Gpu {
    let value = |n: &str| d.values.get(n).map(|(_, v)| *v);
    let used = value(series::DCGM_FI_DEV_FB_USED);
    let total = match (used, value(series::DCGM_FI_DEV_FB_FREE)) {
        (Some(u), Some(f)) => Some(u + f + value(series::DCGM_FI_DEV_FB_RESERVED).unwrap_or(0.0)),
        _ => None,
    };
    let verdict = match (d.verdict, d.exporters.contains(&Exporter::Gpudiag)) {
        (Some(v), _) => v,
        (None, true) => GpuVerdict::NotJudgedYet,
        (None, false) => GpuVerdict::DcgmExporterOnly,
    };
    let mut findings: Vec<FindingRef> = d.findings.into_iter().collect();
    findings.sort_by(|a, b| b.cmp(a));
    alerts.extend(d.alerts);
    let rank = findings
        .iter()
        .map(|f| severity_rank(f.severity))
        .chain(alerts.iter().filter_map(|a| a.severity.map(severity_rank)))
        .chain([verdict_rank(&verdict)])
        .max()
        .unwrap_or_default();
    let age = d
        .instances
        .iter()
        .filter_map(|i| target_age.get(i).copied())
        .reduce(f64::min);
    Gpu {
        gpu: d.gpu,
        uuid: d.uuid,
        model: d.model,
        exporters: d.exporters.into_iter().collect(),
        util_pct: value(series::DCGM_FI_DEV_GPU_UTIL),
        sm_active_pct: value(series::DCGM_FI_PROF_SM_ACTIVE).map(|r| r * 100.0),
        tensor_active_pct: value(series::DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).map(|r| r * 100.0),
        memory_used_mib: used,
        memory_total_mib: total,
        power_w: value(series::DCGM_FI_DEV_POWER_USAGE),
        temperature_c: value(series::DCGM_FI_DEV_GPU_TEMP),
        verdict,
        findings,
        jobs: d.jobs.into_iter().collect(),
        pod: d.pod,
        alerts,
        last_scrape_age_s: age,
        rank,
    }
}

/// Sorts a node's GPUs and exporters; its state from its targets, its rank the worst shown.
fn finish_node(node: &mut Node) {
    node.gpus.sort_by_key(|g| gpu_index_key(&g.gpu));
    node.exporters.sort();
    let up = node.targets.iter().filter(|t| t.up).count();
    node.state = match (up, node.targets.len()) {
        (_, 0) => NodeState::Up,
        (0, _) => NodeState::Down,
        (u, n) if u < n => NodeState::Partial,
        _ => NodeState::Up,
    };
    let down_rank = match node.state {
        NodeState::Down => Rank::Down,
        NodeState::Partial => Rank::Warn,
        NodeState::Up => Rank::Unknown,
    };
    node.worst = node
        .gpus
        .iter()
        .map(|g| g.rank)
        .chain(node.findings.iter().map(|f| severity_rank(f.severity)))
        .chain(
            node.alerts
                .iter()
                .filter_map(|a| a.severity.map(severity_rank)),
        )
        .chain([down_rank])
        .max()
        .unwrap_or_default();
}

/// The rank a verdict name gives.
fn verdict_rank(v: &GpuVerdict) -> Rank {
    match v {
        GpuVerdict::Judged { bottleneck, .. } => match bottleneck.as_str() {
            "compute_bound" | "memory_bound" => Rank::Good,
            "idle" => Rank::Idle,
            _ => Rank::Held,
        },
        GpuVerdict::NotJudgedYet | GpuVerdict::DcgmExporterOnly => Rank::Unknown,
    }
}

pub(super) fn severity_rank(s: Severity) -> Rank {
    match s {
        Severity::Info => Rank::Held,
        Severity::Warn => Rank::Warn,
        Severity::Fail => Rank::Fail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::{alert, series as s};
    use crate::read::devices::{self, draft, duplicated_uuids};
    use crate::read::gpudiag_series;
    use crate::read::labels::Chosen;

    fn target(instance: &str, up: f64, stamp: Option<f64>) -> ScrapeTarget {
        ScrapeTarget {
            series: s("up", &[("instance", instance), ("job", "gpu")], up),
            stamp,
        }
    }

    #[test]
    fn targets_make_nodes_with_exporter_and_scrape_age() {
        let targets = [
            target("a:9835", 1.0, Some(95.0)),
            target("a:9400", 0.0, None),
            target("b:9400", 1.0, None),
        ];
        let named: BTreeMap<String, String> = [("a:9835".to_owned(), "node-a".to_owned())].into();
        let gpudiag: BTreeSet<String> = ["a:9835".to_owned()].into();
        let nodes = nodes_of_targets(&targets, &named, &gpudiag, 100_000);
        let a = &nodes["node-a"];
        assert_eq!(a.targets.len(), 1);
        assert_eq!(a.targets[0].exporter, Some(Exporter::Gpudiag));
        assert_eq!(a.targets[0].last_scrape_age_s, Some(5.0));
        let host_a = &nodes["a"].targets[0];
        assert_eq!(
            (host_a.up, host_a.exporter),
            (false, None),
            "a down target's exporter is unknown"
        );
        assert_eq!(nodes["b"].targets[0].exporter, Some(Exporter::DcgmExporter));
    }

    #[test]
    fn alerts_go_to_their_gpu_else_node_else_aside() {
        let mut drafts = BTreeMap::new();
        draft(
            &mut drafts,
            &BTreeMap::new(),
            "n1",
            &s("", &[("UUID", "GPU-1"), ("gpu", "0")], 0.0),
        );
        let alerts = [
            alert("firing", &[("alertname", "GpuXidError"), ("UUID", "GPU-1")]),
            alert("firing", &[("alertname", "Other"), ("Hostname", "n1")]),
            alert(
                "firing",
                &[("alertname", "GpuLost"), ("Hostname", "elsewhere")],
            ),
            alert(
                "firing",
                &[("alertname", "Other"), ("Hostname", "elsewhere")],
            ),
            alert(
                "pending",
                &[
                    ("alertname", "GpuJobStraggler"),
                    ("job_key", "k"),
                    ("UUID", "GPU-1"),
                ],
            ),
        ];
        let placed = place_alerts(&alerts, "Hostname", &drafts, &BTreeMap::new(), true);
        assert_eq!(placed.gpu["GPU-1"].len(), 1);
        assert_eq!(placed.node["n1"][0].name, "Other");
        let aside: Vec<&str> = placed.unplaced.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            aside,
            ["GpuLost"],
            "only gpudiag's own alerts are kept aside"
        );
        assert_eq!(
            placed.job.len(),
            1,
            "a job's alert counts even while pending"
        );
        let narrowed = place_alerts(&alerts, "Hostname", &drafts, &BTreeMap::new(), false);
        assert!(narrowed.unplaced.is_empty());
    }

    #[test]
    fn a_gpu_reads_its_figures_and_ranks_by_its_worst() {
        let mut drafts = BTreeMap::new();
        let d = draft(
            &mut drafts,
            &BTreeMap::new(),
            "n1",
            &s("", &[("UUID", "GPU-1"), ("gpu", "0")], 0.0),
        );
        d.values.insert(series::DCGM_FI_DEV_FB_USED, (false, 10.0));
        d.values.insert(series::DCGM_FI_DEV_FB_FREE, (false, 20.0));
        d.values
            .insert(series::DCGM_FI_DEV_FB_RESERVED, (false, 1.0));
        d.values.insert(series::DCGM_FI_PROF_SM_ACTIVE, (true, 0.5));
        d.instances.insert("n1:9400".to_owned());
        d.instances.insert("n1:9835".to_owned());
        d.findings.insert(FindingRef {
            severity: Severity::Warn,
            id: "w".to_owned(),
        });
        let d = drafts.pop_first().unwrap().1;
        let ages: BTreeMap<String, f64> =
            [("n1:9400".to_owned(), 7.0), ("n1:9835".to_owned(), 3.0)].into();
        let g = gpu_of(d, Vec::new(), &ages);
        assert_eq!(g.memory_total_mib, Some(31.0));
        assert_eq!(g.sm_active_pct, Some(50.0));
        assert_eq!(g.util_pct, None, "an absent figure stays absent");
        assert_eq!(g.verdict, GpuVerdict::DcgmExporterOnly);
        assert_eq!(g.rank, Rank::Warn);
        assert_eq!(g.last_scrape_age_s, Some(3.0), "the freshest target counts");
    }

    fn node_of_gpus(name: &str, gpus: usize) -> Node {
        let gpu = Gpu {
            gpu: None,
            uuid: None,
            model: None,
            exporters: Vec::new(),
            util_pct: None,
            sm_active_pct: None,
            tensor_active_pct: None,
            memory_used_mib: None,
            memory_total_mib: None,
            power_w: None,
            temperature_c: None,
            verdict: GpuVerdict::NotJudgedYet,
            findings: Vec::new(),
            jobs: Vec::new(),
            pod: None,
            alerts: Vec::new(),
            last_scrape_age_s: None,
            rank: Rank::Unknown,
        };
        let mut node = empty_node(name);
        node.gpus = vec![gpu; gpus];
        node
    }

    /// Whole nodes, worst first, up to the cap; a first node past it alone is cut; what is
    /// left out is counted and said.
    #[test]
    fn nodes_past_the_gpu_cap_are_left_out_and_counted() {
        let mut f = crate::read::answer::fleet();
        f.nodes = vec![
            node_of_gpus("a", 5000),
            node_of_gpus("b", 3000),
            node_of_gpus("c", 1000),
            node_of_gpus("d", 8),
        ];
        list_within_caps(&mut f);
        let listed: Vec<&str> = f.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(listed, ["a", "b"]);
        assert_eq!((f.left_out.nodes, f.left_out.gpus), (2, 1008));
        assert!(f.degraded[0].contains("1008 GPU(s) on 2 more node(s) left out"));

        let mut f = crate::read::answer::fleet();
        f.nodes = vec![
            node_of_gpus("huge", MAX_GPUS_LISTED + 3),
            node_of_gpus("b", 1),
        ];
        list_within_caps(&mut f);
        assert_eq!(f.nodes.len(), 1);
        assert_eq!(f.nodes[0].gpus.len(), MAX_GPUS_LISTED);
        assert_eq!((f.left_out.nodes, f.left_out.gpus), (1, 4));
    }

    #[test]
    fn gpus_that_share_uuids_across_nodes_stay_apart_and_are_named() {
        // Two nodes from one cloned image: the same eight UUIDs, gpudiag serving both.
        let mut device = Vec::new();
        let mut verdicts = Vec::new();
        for node in ["node-a", "node-b"] {
            let instance = format!("{node}:9835");
            for i in 0..8 {
                let (uuid, index) = (format!("GPU-clone-{i}"), i.to_string());
                let labels = [
                    ("instance", instance.as_str()),
                    ("Hostname", node),
                    ("UUID", uuid.as_str()),
                    ("gpu", index.as_str()),
                ];
                device.push(s(series::DCGM_FI_DEV_GPU_UTIL, &labels, 50.0));
                if node == "node-b" {
                    let mut labels = labels.to_vec();
                    labels.push(("verdict", "idle"));
                    verdicts.push(s(series::GPUDIAG_VERDICT, &labels, 1.0));
                }
            }
        }
        let instances: BTreeSet<String> =
            ["node-a:9835".to_owned(), "node-b:9835".to_owned()].into();
        let mut g = Gathered {
            duplicated: duplicated_uuids(&device, &verdicts, "Hostname", &instances),
            ..Gathered::default()
        };
        devices::gather(&mut g, &device, "Hostname", &Chosen(None), &instances);
        gpudiag_series::gather(&mut g, &verdicts, "Hostname", &Chosen(None));
        let alerts = vec![alert(
            "firing",
            &[
                ("alertname", "GpuXidError"),
                ("UUID", "GPU-clone-3"),
                ("Hostname", "node-b"),
            ],
        )];
        let mut fleet = crate::read::answer::fleet();
        assemble(
            &mut fleet,
            g,
            Reads {
                targets: Vec::new(),
                alerts,
                rule_series: Vec::new(),
                gpudiag_instances: &instances,
                at: 0,
                everything: true,
            },
        );

        assert_eq!(fleet.counts.gpus, 16, "each node keeps its eight GPUs");
        let a = fleet.node("node-a").unwrap();
        let b = fleet.node("node-b").unwrap();
        assert_eq!((a.gpus.len(), b.gpus.len()), (8, 8));
        assert!(a.gpus.iter().all(|g| g.verdict == GpuVerdict::NotJudgedYet));
        assert!(b.gpus.iter().all(|g| matches!(&g.verdict,
            GpuVerdict::Judged { bottleneck, .. } if bottleneck == "idle")));
        let alerted: Vec<(&str, &str)> = fleet
            .gpus()
            .filter(|(_, g)| !g.alerts.is_empty())
            .map(|(n, g)| (n.name.as_str(), g.gpu.as_deref().unwrap()))
            .collect();
        assert_eq!(
            alerted,
            [("node-b", "3")],
            "the alert sits on the node it names"
        );
        assert_eq!(fleet.degraded.len(), 1, "{:?}", fleet.degraded);
        let note = &fleet.degraded[0];
        assert!(note.starts_with("8 GPU UUID(s) reported by each of the nodes node-a, node-b"));
        for i in 0..8 {
            assert!(note.contains(&format!("GPU-clone-{i}")), "{note}");
        }
    }

    #[test]
    fn a_node_is_down_when_no_target_is_up() {
        let mut node = empty_node("n");
        for up in [false, true] {
            node.targets.push(Target {
                instance: String::new(),
                scrape_job: String::new(),
                up,
                exporter: None,
                last_scrape_age_s: None,
            });
        }
        finish_node(&mut node);
        assert_eq!((node.state, node.worst), (NodeState::Partial, Rank::Warn));
        node.targets[1].up = false;
        finish_node(&mut node);
        assert_eq!((node.state, node.worst), (NodeState::Down, Rank::Down));
    }

    #[test]
    fn verdicts_rank_by_what_they_mean() {
        let judged = |b: &str| GpuVerdict::Judged {
            bottleneck: b.to_owned(),
            confidence: None,
            basis: None,
        };
        assert_eq!(verdict_rank(&judged("memory_bound")), Rank::Good);
        assert_eq!(verdict_rank(&judged("idle")), Rank::Idle);
        assert_eq!(verdict_rank(&judged("launch_bound")), Rank::Held);
        assert_eq!(verdict_rank(&GpuVerdict::NotJudgedYet), Rank::Unknown);
    }
}
