//! The fleet's jobs: the GPUs each job holds (from gpudiag's job info, else a dcgm-exporter
//! pod), each node's verdict on it, and the shipped rules' judgement across nodes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpudiag_model::prometheus_names::{label, rules};

use super::labels::gpu_index_key;
use crate::client::Series;
use crate::model::*;

/// A job's identity: its key and what joined its GPUs.
type JobId = (String, String);

/// The rules' per-GPU averages by (series, UUID, job key).
type PerGpu<'a> = HashMap<(&'a str, &'a str, &'a str), f64>;

pub(super) fn jobs(
    fleet: &Fleet,
    node_jobs: Vec<(String, Series)>,
    job_alerts: &[Alert],
    rule_series: &[Series],
) -> Vec<Job> {
    let per_gpu = per_gpu_figures(rule_series);
    // Jobs known from gpudiag's job info; the others are dcgm-exporter pods, which the rules
    // (joined on that info) cannot judge.
    let mut judged_by_rules: BTreeSet<JobId> = BTreeSet::new();
    let mut jobs: BTreeMap<JobId, Job> = BTreeMap::new();
    for (node, gpu) in fleet.gpus() {
        for r in &gpu.jobs {
            judged_by_rules.insert((r.job_key.clone(), r.joined_by.clone()));
        }
        add_gpu(&mut jobs, node, gpu, &per_gpu);
    }
    add_node_verdicts(&mut jobs, node_jobs);
    let loaded = fleet.rules.loaded();
    for (id, job) in jobs.iter_mut() {
        sort_job(job);
        if loaded && job.gpus.len() >= 2 && judged_by_rules.contains(id) {
            judge_across_nodes(job, id, job_alerts, rule_series);
        }
        mark_stragglers(job);
        rank_by_node_verdicts(job);
    }
    let mut jobs: Vec<Job> = jobs.into_values().collect();
    jobs.sort_by(|a, b| {
        b.rank
            .cmp(&a.rank)
            .then_with(|| b.gpus.len().cmp(&a.gpus.len()))
            .then_with(|| a.job_key.cmp(&b.job_key))
    });
    jobs
}

/// The rules' per-GPU averages, looked up once per GPU of a job.
fn per_gpu_figures(rule_series: &[Series]) -> PerGpu<'_> {
    rule_series
        .iter()
        .filter_map(|s| {
            Some((
                (
                    s.label(label::NAME)?,
                    s.label(label::UUID)?,
                    s.label(label::JOB_KEY)?,
                ),
                s.value,
            ))
        })
        .collect()
}

/// The jobs a GPU belongs to; a GPU seen only through dcgm-exporter's pod labels belongs to
/// its pod.
fn job_refs(gpu: &Gpu) -> Vec<JobRef> {
    if !gpu.jobs.is_empty() {
        return gpu.jobs.clone();
    }
    gpu.pod
        .iter()
        .map(|p| JobRef {
            job_key: match &p.namespace {
                Some(ns) => format!("{ns}/{}", p.pod),
                None => p.pod.clone(),
            },
            joined_by: "pod".to_owned(),
            slurm_job: None,
            pod: Some(p.pod.clone()),
            namespace: p.namespace.clone(),
            rank: None,
        })
        .collect()
}

/// Adds a GPU (one with a UUID) to each of its jobs.
fn add_gpu(jobs: &mut BTreeMap<JobId, Job>, node: &Node, gpu: &Gpu, per_gpu: &PerGpu<'_>) {
    let Some(uuid) = &gpu.uuid else { return };
    for r in job_refs(gpu) {
        let job = jobs
            .entry((r.job_key.clone(), r.joined_by.clone()))
            .or_insert_with(|| Job {
                job_key: r.job_key.clone(),
                joined_by: r.joined_by.clone(),
                slurm_job: r.slurm_job.clone(),
                namespace: r.namespace.clone(),
                nodes: Vec::new(),
                gpus: Vec::new(),
                across_nodes: None,
                per_node: Vec::new(),
                rank: Rank::Unknown,
            });
        if !job.nodes.contains(&node.name) {
            job.nodes.push(node.name.clone());
        }
        let rule = |name: &str| {
            per_gpu
                .get(&(name, uuid.as_str(), r.job_key.as_str()))
                .copied()
        };
        job.gpus.push(JobGpu {
            node: node.name.clone(),
            gpu: gpu.gpu.clone(),
            uuid: uuid.clone(),
            rank: r.rank.clone(),
            sm_active_pct: rule(rules::JOB_GPU_SM_ACTIVE_AVG).map(|v| v * 100.0),
            util_pct: rule(rules::JOB_GPU_GPU_UTIL_PERCENT_AVG),
            straggler: false,
        });
        job.rank = job.rank.max(gpu.rank);
    }
}

/// Each node's verdict (`gpudiag_job_verdict`) on a job the fleet holds.
fn add_node_verdicts(jobs: &mut BTreeMap<JobId, Job>, node_jobs: Vec<(String, Series)>) {
    for (node, s) in node_jobs {
        let (Some(key), Some(by)) = (s.label(label::JOB_KEY), s.label(label::JOINED_BY)) else {
            continue;
        };
        if let Some(job) = jobs.get_mut(&(key.to_owned(), by.to_owned())) {
            job.per_node.push(NodeJobVerdict {
                node,
                verdict: s.label(label::VERDICT).unwrap_or("unknown").to_owned(),
                confidence: s.label(label::CONFIDENCE).map(str::to_owned),
                straggler_gpu: s.label(label::STRAGGLER_GPU).map(str::to_owned),
                straggler_uuid: s.label(label::STRAGGLER_UUID).map(str::to_owned),
            });
        }
    }
}

/// GPUs by their rank in the job, then node and index; nodes and their verdicts by name.
fn sort_job(job: &mut Job) {
    job.gpus.sort_by(|a, b| {
        let rank = |g: &JobGpu| g.rank.as_deref().and_then(|r| r.parse::<u64>().ok());
        rank(a)
            .cmp(&rank(b))
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| gpu_index_key(&a.gpu).cmp(&gpu_index_key(&b.gpu)))
    });
    job.nodes.sort();
    job.per_node.sort_by(|a, b| a.node.cmp(&b.node));
}

/// The shipped rules' judgement of a job across nodes: their alerts on it (a firing one
/// before a pending one) and their figures.
fn judge_across_nodes(
    job: &mut Job,
    (key, by): &JobId,
    job_alerts: &[Alert],
    rule_series: &[Series],
) {
    let pick = |name: &str| {
        job_alerts
            .iter()
            .filter(|a| a.job_key.as_deref() == Some(key.as_str()) && a.name == name)
            .max_by_key(|a| a.state == "firing")
    };
    let job_rule = |name: &str| {
        rule_series
            .iter()
            .find(|s| {
                s.label(label::NAME) == Some(name)
                    && s.label(label::JOB_KEY) == Some(key.as_str())
                    && s.label(label::JOINED_BY) == Some(by.as_str())
            })
            .map(|s| s.value)
    };
    let straggler = pick(rules::ALERT_JOB_STRAGGLER);
    let comm = pick(rules::ALERT_JOB_COMMUNICATION_BOUND);
    let (pattern, state) = match (straggler, comm) {
        (Some(a), _) => ("straggler", Some(a.state.clone())),
        (None, Some(a)) => ("communication_bound", Some(a.state.clone())),
        (None, None) => ("balanced", None),
    };
    job.across_nodes = Some(JobJudgement {
        pattern: pattern.to_owned(),
        state,
        straggler: straggler.map(|a| Straggler {
            node: a.node.clone(),
            gpu: a.gpu.clone(),
            uuid: a.uuid.clone(),
            pace: a.pace.clone(),
        }),
        sm_active_median_pct: job_rule(rules::JOB_SM_ACTIVE_MEDIAN).map(|v| v * 100.0),
        sm_active_spread: job_rule(rules::JOB_SM_ACTIVE_SPREAD),
    });
    let firing = |a: Option<&Alert>| a.is_some_and(|a| a.state == "firing");
    if firing(straggler) || firing(comm) {
        job.rank = job.rank.max(Rank::Warn);
    } else if straggler.is_some() || comm.is_some() {
        job.rank = job.rank.max(Rank::Held);
    }
}

/// A GPU is the straggler when a firing alert or a node's verdict names it.
fn mark_stragglers(job: &mut Job) {
    let named: BTreeSet<String> = job
        .across_nodes
        .iter()
        .filter(|j| j.state.as_deref() == Some("firing"))
        .filter_map(|j| j.straggler.as_ref()?.uuid.clone())
        .chain(job.per_node.iter().filter_map(|v| v.straggler_uuid.clone()))
        .collect();
    for g in &mut job.gpus {
        g.straggler = named.contains(&g.uuid);
    }
}

/// A node's verdict other than balanced holds the job up; all balanced, it is good.
fn rank_by_node_verdicts(job: &mut Job) {
    if job
        .per_node
        .iter()
        .any(|v| v.verdict != "balanced" && v.verdict != "unknown")
    {
        job.rank = job.rank.max(Rank::Held);
    } else if job.rank < Rank::Good && !job.per_node.is_empty() {
        job.rank = Rank::Good;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::{fleet, series as s};

    fn gpu(uuid: &str, index: &str, jobs: &[(&str, &str)]) -> Gpu {
        Gpu {
            gpu: Some(index.to_owned()),
            uuid: Some(uuid.to_owned()),
            model: None,
            exporters: vec![Exporter::Gpudiag],
            util_pct: None,
            sm_active_pct: None,
            tensor_active_pct: None,
            memory_used_mib: None,
            memory_total_mib: None,
            power_w: None,
            temperature_c: None,
            verdict: GpuVerdict::NotJudgedYet,
            findings: Vec::new(),
            jobs: jobs
                .iter()
                .map(|(key, rank)| JobRef {
                    job_key: (*key).to_owned(),
                    joined_by: "slurm".to_owned(),
                    slurm_job: None,
                    pod: None,
                    namespace: None,
                    rank: Some((*rank).to_owned()),
                })
                .collect(),
            pod: None,
            alerts: Vec::new(),
            last_scrape_age_s: None,
            rank: Rank::Good,
        }
    }

    fn node(name: &str, gpus: Vec<Gpu>) -> Node {
        Node {
            name: name.to_owned(),
            state: NodeState::Up,
            targets: Vec::new(),
            exporters: Vec::new(),
            gpus,
            findings: Vec::new(),
            alerts: Vec::new(),
            worst: Rank::Unknown,
        }
    }

    /// Job `k` on GPU-1 (rank 1, node b) and GPU-0 (rank 0, node a); GPU-2 of a pod.
    fn two_nodes() -> Fleet {
        let mut f = fleet();
        let mut pod_gpu = gpu("GPU-2", "1", &[]);
        pod_gpu.pod = Some(PodRef {
            namespace: Some("ml".to_owned()),
            pod: "p".to_owned(),
            container: None,
        });
        f.nodes = vec![
            node("b", vec![gpu("GPU-1", "0", &[("k", "1")])]),
            node("a", vec![gpu("GPU-0", "0", &[("k", "0")]), pod_gpu]),
        ];
        f.rules = RulesState::Loaded;
        f
    }

    fn straggler_alert(state: &str) -> Alert {
        Alert {
            name: rules::ALERT_JOB_STRAGGLER.to_owned(),
            state: state.to_owned(),
            severity: None,
            summary: None,
            node: Some("b".to_owned()),
            gpu: Some("0".to_owned()),
            uuid: Some("GPU-1".to_owned()),
            job_key: Some("k".to_owned()),
            pace: Some("slow".to_owned()),
            active_since: None,
        }
    }

    #[test]
    fn a_job_gathers_its_gpus_across_nodes_in_rank_order() {
        let figures = [s(
            rules::JOB_GPU_SM_ACTIVE_AVG,
            &[("UUID", "GPU-0"), ("job_key", "k")],
            0.25,
        )];
        let jobs = jobs(&two_nodes(), Vec::new(), &[], &figures);
        assert_eq!(jobs.len(), 2);
        let k = &jobs[0];
        assert_eq!(
            (k.job_key.as_str(), k.nodes.clone()),
            ("k", vec!["a".to_owned(), "b".to_owned()])
        );
        let uuids: Vec<&str> = k.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-0", "GPU-1"]);
        assert_eq!(k.gpus[0].sm_active_pct, Some(25.0));
        let across = k.across_nodes.as_ref().unwrap();
        assert_eq!(
            (across.pattern.as_str(), across.state.as_deref()),
            ("balanced", None)
        );
        let pod = &jobs[1];
        assert_eq!(
            (pod.job_key.as_str(), pod.joined_by.as_str()),
            ("ml/p", "pod")
        );
        assert!(
            pod.across_nodes.is_none(),
            "the rules cannot judge a pod of dcgm-exporter"
        );
    }

    #[test]
    fn a_firing_straggler_alert_names_its_gpu_and_warns() {
        let alerts = [straggler_alert("pending"), straggler_alert("firing")];
        let jobs = jobs(&two_nodes(), Vec::new(), &alerts, &[]);
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        let across = k.across_nodes.as_ref().unwrap();
        assert_eq!(
            (across.pattern.as_str(), across.state.as_deref()),
            ("straggler", Some("firing"))
        );
        assert_eq!(
            across.straggler.as_ref().unwrap().pace.as_deref(),
            Some("slow")
        );
        let stragglers: Vec<&str> = k
            .gpus
            .iter()
            .filter(|g| g.straggler)
            .map(|g| g.uuid.as_str())
            .collect();
        assert_eq!(stragglers, ["GPU-1"]);
        assert_eq!(k.rank, Rank::Warn);
    }

    #[test]
    fn without_the_rules_only_node_verdicts_judge() {
        let mut f = two_nodes();
        f.rules = RulesState::NotLoaded;
        let verdict = |node: &str, v: &str| {
            (
                node.to_owned(),
                s(
                    "gpudiag_job_verdict",
                    &[
                        ("job_key", "k"),
                        ("joined_by", "slurm"),
                        ("verdict", v),
                        ("straggler_UUID", "GPU-0"),
                    ],
                    1.0,
                ),
            )
        };
        let jobs = jobs(
            &f,
            vec![verdict("b", "straggler"), verdict("a", "balanced")],
            &[],
            &[],
        );
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        assert!(k.across_nodes.is_none());
        let nodes: Vec<&str> = k.per_node.iter().map(|v| v.node.as_str()).collect();
        assert_eq!(nodes, ["a", "b"]);
        assert!(k.gpus[0].straggler);
        assert_eq!(k.rank, Rank::Held);
    }
}
