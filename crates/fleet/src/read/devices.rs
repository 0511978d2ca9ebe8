//! dcgm-exporter's device figures, which gpudiag writes under the same names: each GPU's
//! draft is started here, keyed by UUID (else node and index), and merged from both exporters.
//! A UUID that one exporter reports from two or more nodes (a cloned VM image, a relabelling
//! slip) is keyed by node and UUID instead, so each node keeps its GPUs.

use std::collections::{BTreeMap, BTreeSet};

use gpudiag_model::prometheus_names::{label, series};

use super::labels::Chosen;
use super::labels::node_of;
use crate::client::Series;
use crate::model::{Alert, Exporter, FindingRef, GpuVerdict, JobRef, PodRef};

/// The device series read for the table, and what each becomes.
pub(super) const DEVICE_SERIES: [&str; 8] = [
    series::DCGM_FI_DEV_GPU_UTIL,
    series::DCGM_FI_PROF_SM_ACTIVE,
    series::DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    series::DCGM_FI_DEV_FB_USED,
    series::DCGM_FI_DEV_FB_FREE,
    series::DCGM_FI_DEV_FB_RESERVED,
    series::DCGM_FI_DEV_POWER_USAGE,
    series::DCGM_FI_DEV_GPU_TEMP,
];

/// A GPU while its series are gathered, keyed by UUID (node and UUID for a duplicated one; else
/// node and index).
#[derive(Default)]
pub(super) struct GpuDraft {
    pub node: String,
    pub gpu: Option<String>,
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub instances: BTreeSet<String>,
    pub exporters: BTreeSet<Exporter>,
    /// Per series name: (from gpudiag, value); gpudiag's wins over dcgm-exporter's.
    pub values: BTreeMap<&'static str, (bool, f64)>,
    pub verdict: Option<GpuVerdict>,
    pub judged: Option<bool>,
    pub findings: BTreeSet<FindingRef>,
    pub jobs: BTreeSet<JobRef>,
    pub pod: Option<PodRef>,
    pub alerts: Vec<Alert>,
}

/// What the core answers say, per GPU and per node, before the nodes are built.
#[derive(Default)]
pub(super) struct Gathered {
    pub drafts: BTreeMap<String, GpuDraft>,
    /// The node each scrape target (`instance`) serves.
    pub instance_node: BTreeMap<String, String>,
    /// Findings about a node rather than one of its GPUs.
    pub node_findings: BTreeMap<String, BTreeSet<FindingRef>>,
    /// Each node's verdicts on its jobs (`gpudiag_job_verdict`) and the part each GPU plays
    /// in them (`gpudiag_job_gpu_role`).
    pub node_jobs: Vec<(String, Series)>,
    /// UUIDs that one exporter reports from two or more nodes, with those nodes.
    pub duplicated: BTreeMap<String, BTreeSet<String>>,
}

/// The scrape targets that serve gpudiag (they write `gpudiag_info`).
pub(super) fn gpudiag_instances(gpudiag: &[Series]) -> BTreeSet<String> {
    gpudiag
        .iter()
        .filter(|s| s.label(label::NAME) == Some(series::GPUDIAG_INFO))
        .filter_map(|s| s.label(label::INSTANCE).map(str::to_owned))
        .collect()
}

/// The UUIDs that one exporter reports from two or more nodes, with every node naming them.
/// Only one exporter's view counts: dcgm-exporter's `Hostname` is its pod's name unless its
/// DaemonSet passes the node's, so gpudiag and dcgm-exporter may name one GPU's node apart,
/// and that GPU must still merge into one.
pub(super) fn duplicated_uuids(
    device: &[Series],
    gpudiag: &[Series],
    node_label: &str,
    gpudiag_instances: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut seen: BTreeMap<(&str, Exporter), BTreeSet<String>> = BTreeMap::new();
    let from_device = device.iter().map(|s| {
        let exporter = match s.label(label::INSTANCE) {
            Some(i) if gpudiag_instances.contains(i) => Exporter::Gpudiag,
            _ => Exporter::DcgmExporter,
        };
        (s, exporter)
    });
    let from_gpudiag = gpudiag.iter().map(|s| (s, Exporter::Gpudiag));
    for (s, exporter) in from_device.chain(from_gpudiag) {
        if let (Some(uuid), Some(node)) = (s.label(label::UUID), node_of(s, node_label)) {
            seen.entry((uuid, exporter)).or_default().insert(node);
        }
    }
    let mut duplicated: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((uuid, _), nodes) in seen.iter().filter(|(_, nodes)| nodes.len() > 1) {
        duplicated
            .entry((*uuid).to_owned())
            .or_default()
            .extend(nodes.iter().cloned());
    }
    duplicated
}

/// The GPU's draft a series belongs to, started if new.
pub(super) fn draft<'d>(
    drafts: &'d mut BTreeMap<String, GpuDraft>,
    duplicated: &BTreeMap<String, BTreeSet<String>>,
    node: &str,
    s: &Series,
) -> &'d mut GpuDraft {
    let key = match s.label(label::UUID) {
        Some(u) if duplicated.contains_key(u) => format!("node:{node}:uuid:{u}"),
        Some(u) => format!("uuid:{u}"),
        None => format!("node:{node}:{}", s.label(label::GPU).unwrap_or("?")),
    };
    let d = drafts.entry(key).or_default();
    if d.node.is_empty() {
        d.node = node.to_owned();
    }
    if d.gpu.is_none() {
        d.gpu = s.label(label::GPU).map(str::to_owned);
    }
    if d.uuid.is_none() {
        d.uuid = s.label(label::UUID).map(str::to_owned);
    }
    d
}

/// Adds the device figures of the chosen GPUs to their drafts.
pub(super) fn gather(
    g: &mut Gathered,
    device: &[Series],
    node_label: &str,
    chosen: &Chosen,
    gpudiag_instances: &BTreeSet<String>,
) {
    for s in device.iter().filter(|s| chosen.keeps(s)) {
        // Past the most GPUs a look reads the look fails (`read`): no more drafts are made.
        if g.drafts.len() > super::MAX_GPUS_READ {
            return;
        }
        let Some(node) = node_of(s, node_label) else {
            continue;
        };
        let Some(name) = DEVICE_SERIES
            .iter()
            .find(|n| s.label(label::NAME) == Some(**n))
        else {
            continue;
        };
        let exporter = match s.label(label::INSTANCE) {
            Some(i) if gpudiag_instances.contains(i) => Exporter::Gpudiag,
            _ => Exporter::DcgmExporter,
        };
        let d = draft(&mut g.drafts, &g.duplicated, &node, s);
        if let Some(i) = s.label(label::INSTANCE) {
            d.instances.insert(i.to_owned());
            g.instance_node.entry(i.to_owned()).or_insert(node.clone());
        }
        d.exporters.insert(exporter);
        if d.model.is_none() {
            d.model = s.label(label::MODEL_NAME).map(str::to_owned);
        }
        if d.pod.is_none()
            && let Some(pod) = s.label(label::POD)
        {
            d.pod = Some(PodRef {
                namespace: s.label(label::NAMESPACE).map(str::to_owned),
                pod: pod.to_owned(),
                container: s.label(label::CONTAINER).map(str::to_owned),
            });
        }
        let from_gpudiag = exporter == Exporter::Gpudiag;
        let slot = d.values.entry(name).or_insert((from_gpudiag, s.value));
        if from_gpudiag && !slot.0 {
            *slot = (true, s.value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::series as s;

    const UTIL: &str = series::DCGM_FI_DEV_GPU_UTIL;

    fn gathered(device: &[Series], chosen: Chosen, gpudiag: &[&str]) -> Gathered {
        let mut g = Gathered::default();
        let instances = gpudiag.iter().map(|i| (*i).to_owned()).collect();
        gather(&mut g, device, "Hostname", &chosen, &instances);
        g
    }

    #[test]
    fn both_exporters_of_one_gpu_merge_by_uuid_and_gpudiag_wins() {
        let device = [
            s(
                UTIL,
                &[
                    ("instance", "a:9400"),
                    ("Hostname", "a"),
                    ("UUID", "GPU-1"),
                    ("gpu", "0"),
                ],
                10.0,
            ),
            s(
                UTIL,
                &[
                    ("instance", "a:9835"),
                    ("Hostname", "a"),
                    ("UUID", "GPU-1"),
                    ("gpu", "0"),
                ],
                20.0,
            ),
        ];
        let g = gathered(&device, Chosen(None), &["a:9835"]);
        assert_eq!(g.drafts.len(), 1);
        let d = &g.drafts["uuid:GPU-1"];
        assert_eq!(d.values[UTIL], (true, 20.0));
        assert_eq!(d.exporters.len(), 2);
        assert_eq!(d.instances.len(), 2);
        assert_eq!(g.instance_node["a:9400"], "a");
    }

    #[test]
    fn a_uuid_is_duplicated_only_when_one_exporter_names_two_nodes() {
        let on = |instance: &str, host: &str| {
            s(
                UTIL,
                &[
                    ("instance", instance),
                    ("Hostname", host),
                    ("UUID", "GPU-1"),
                ],
                1.0,
            )
        };
        let gpudiag: BTreeSet<String> = ["a:9835".to_owned(), "b:9835".to_owned()].into();
        // dcgm-exporter's `Hostname` is its pod's name: the same GPU, named apart.
        let beside = [on("a:9835", "a"), on("10.1.2.3:9400", "dcgm-exporter-x7k")];
        assert!(duplicated_uuids(&beside, &[], "Hostname", &gpudiag).is_empty());
        let cloned = [on("a:9835", "a"), on("b:9835", "b")];
        let dup = duplicated_uuids(&cloned, &[], "Hostname", &gpudiag);
        assert_eq!(dup["GPU-1"], ["a".to_owned(), "b".to_owned()].into());
    }

    #[test]
    fn a_gpu_without_uuid_is_keyed_by_node_and_index_and_its_pod_kept() {
        let device = [s(
            series::DCGM_FI_DEV_GPU_TEMP,
            &[
                ("instance", "b:9400"),
                ("gpu", "3"),
                ("pod", "p"),
                ("namespace", "ns"),
                ("modelName", "H100"),
            ],
            40.0,
        )];
        let g = gathered(&device, Chosen(None), &[]);
        let d = &g.drafts["node:b:3"];
        assert_eq!(d.node, "b", "the instance's host names the node");
        assert_eq!(d.model.as_deref(), Some("H100"));
        let pod = d.pod.as_ref().unwrap();
        assert_eq!(
            (pod.pod.as_str(), pod.namespace.as_deref()),
            ("p", Some("ns"))
        );
        assert!(d.exporters.contains(&Exporter::DcgmExporter));
    }

    #[test]
    fn unchosen_gpus_and_unknown_series_are_left_out() {
        let chosen = Chosen(Some(["GPU-1".to_owned()].into()));
        let device = [
            s(UTIL, &[("instance", "a:1"), ("UUID", "GPU-2")], 1.0),
            s(
                "DCGM_FI_DEV_SM_CLOCK",
                &[("instance", "a:1"), ("UUID", "GPU-1")],
                1.0,
            ),
        ];
        assert!(gathered(&device, chosen, &[]).drafts.is_empty());
    }

    #[test]
    fn gpudiag_serves_where_it_writes_its_info() {
        let answer = [
            s(series::GPUDIAG_INFO, &[("instance", "a:9835")], 1.0),
            s(series::GPUDIAG_VERDICT, &[("instance", "b:9835")], 1.0),
        ];
        assert_eq!(gpudiag_instances(&answer), ["a:9835".to_owned()].into());
    }
}
