//! The fleet's jobs: the GPUs each job holds (from gpudiag's job info, else a dcgm-exporter
//! pod), each node's verdict on it, and the shipped rules' judgement across nodes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpudiag_model::job::{GpuRole, JobPattern};
use gpudiag_model::prometheus_names::{label, rules, series};

use super::labels::gpu_index_key;
use crate::client::Series;
use crate::model::*;

/// A job's identity: its key and what joined its GPUs.
type JobId = (String, String);

/// The rules' per-GPU averages by (series, UUID, job key), each with the node (`Hostname`) it
/// was recorded on: a UUID a cloned image gave two nodes has one figure per node.
type PerGpu<'a> = HashMap<(&'a str, &'a str, &'a str), Vec<(Option<&'a str>, f64)>>;

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
    add_hung_alerts(&mut jobs, job_alerts);
    for (id, job) in jobs.iter_mut() {
        sort_job(job);
        let repeated = repeated_ranks(job);
        if !repeated.is_empty() {
            // The rules leave such a key out of every job alert (gpudiag_job:ranks_repeated).
            job.doubts.push(format!(
                "rank {} held by two GPUs or more: the key joins two jobs (an older gpudiag's \
                 unqualified master address, or a run id shared by two jobs), so the shipped \
                 rules do not judge it",
                repeated.join(", ")
            ));
        } else if loaded && job.gpus.len() >= 2 && judged_by_rules.contains(id) {
            judge_across_nodes(job, id, job_alerts, rule_series);
        }
        mark_stragglers(job);
        rank_by_node_verdicts(job);
    }
    let mut jobs: Vec<Job> = jobs.into_values().collect();
    // A job that makes no progress wastes all its GPUs until someone acts: first, whatever
    // else ranks high.
    jobs.sort_by(|a, b| {
        b.stall
            .is_some()
            .cmp(&a.stall.is_some())
            .then_with(|| b.rank.cmp(&a.rank))
            .then_with(|| b.gpus.len().cmp(&a.gpus.len()))
            .then_with(|| a.job_key.cmp(&b.job_key))
    });
    jobs
}

/// The rules' per-GPU averages, looked up once per GPU of a job.
fn per_gpu_figures(rule_series: &[Series]) -> PerGpu<'_> {
    let mut out: PerGpu<'_> = HashMap::new();
    for s in rule_series {
        let (Some(name), Some(uuid), Some(key)) = (
            s.label(label::NAME),
            s.label(label::UUID),
            s.label(label::JOB_KEY),
        ) else {
            continue;
        };
        out.entry((name, uuid, key))
            .or_default()
            .push((s.label(label::HOSTNAME), s.value));
    }
    out
}

/// A GPU's figure: the one recorded on its node, else the only one there is (the fleet's nodes
/// may be named by another label than the rules' `Hostname`).
fn figure_of(
    per_gpu: &PerGpu<'_>,
    (name, uuid, key): (&str, &str, &str),
    node: &str,
) -> Option<f64> {
    let figures = per_gpu.get(&(name, uuid, key))?;
    figures
        .iter()
        .find(|(host, _)| *host == Some(node))
        .or_else(|| figures.first().filter(|_| figures.len() == 1))
        .map(|(_, v)| *v)
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
                doubts: Vec::new(),
                stall: None,
                rank: Rank::Unknown,
            });
        if !job.nodes.contains(&node.name) {
            job.nodes.push(node.name.clone());
        }
        let rule = |name: &str| {
            figure_of(
                per_gpu,
                (name, uuid.as_str(), r.job_key.as_str()),
                &node.name,
            )
        };
        job.gpus.push(JobGpu {
            node: node.name.clone(),
            gpu: gpu.gpu.clone(),
            uuid: uuid.clone(),
            rank: r.rank.clone(),
            sm_active_pct: rule(rules::JOB_GPU_SM_ACTIVE_AVG).map(|v| v * 100.0),
            util_pct: rule(rules::JOB_GPU_GPU_UTIL_PERCENT_AVG),
            straggler: false,
            role: None,
        });
        job.rank = job.rank.max(gpu.rank);
    }
}

/// Each node's verdict (`gpudiag_job_verdict`) on a job the fleet holds, and the part it gives
/// each of its GPUs (`gpudiag_job_gpu_role`): the stragglers it names, and who waits. A node
/// running a gpudiag from before the role series names its one straggler in the verdict's
/// labels (`straggler_gpu`, `straggler_UUID`): read as well, as it costs nothing. A stalled
/// verdict adds the node's stuck time and the ranks it waits for to the job's stall.
fn add_node_verdicts(jobs: &mut BTreeMap<JobId, Job>, node_jobs: Vec<(String, Series)>) {
    let of = |name: &'static str| {
        node_jobs
            .iter()
            .filter(move |(_, s)| s.label(label::NAME) == Some(name))
    };
    let verdicts = of(series::GPUDIAG_JOB_VERDICT);
    let roles = of(series::GPUDIAG_JOB_GPU_ROLE);
    for (node, s) in verdicts {
        let node = node.clone();
        let Some(job) = job_of(jobs, s) else {
            continue;
        };
        let legacy = NodeGpu {
            gpu: s.label(label::LEGACY_STRAGGLER_GPU).map(str::to_owned),
            uuid: s.label(label::LEGACY_STRAGGLER_UUID).map(str::to_owned),
        };
        let named = legacy.gpu.is_some() || legacy.uuid.is_some();
        let verdict = s.label(label::VERDICT).unwrap_or("unknown").to_owned();
        if stalled(&verdict) {
            let stall = job.stall.get_or_insert_with(JobStall::default);
            if !stall.nodes.contains(&node) {
                stall.nodes.push(node.clone());
            }
            stall.verdict = worse_stall(&stall.verdict, &verdict).to_owned();
        }
        job.per_node.push(NodeJobVerdict {
            node,
            verdict,
            confidence: s.label(label::CONFIDENCE).map(str::to_owned),
            stragglers: if named { vec![legacy] } else { Vec::new() },
        });
    }
    // A node's stuck time and missing ranks count only where it judges the job stalled now.
    for (node, s) in of(series::GPUDIAG_JOB_STUCK_SECONDS) {
        let Some(stall) = job_of(jobs, s).and_then(|j| j.stall.as_mut()) else {
            continue;
        };
        if stall.nodes.contains(node) && s.value.is_finite() && s.value >= 0.0 {
            stall.stuck_s = Some(stall.stuck_s.map_or(s.value, |t| t.max(s.value)));
        }
    }
    for (node, s) in of(series::GPUDIAG_JOB_MISSING_RANK_INFO) {
        let Some(stall) = job_of(jobs, s).and_then(|j| j.stall.as_mut()) else {
            continue;
        };
        let rank = MissingRank {
            node: node.clone(),
            gpu: s.label(label::GPU).map(str::to_owned),
            uuid: s.label(label::UUID).map(str::to_owned),
            rank: s.label(label::RANK).map(str::to_owned),
            pid: s.label(label::PID).map(str::to_owned),
            state: s.label(label::STATE).map(str::to_owned),
        };
        if stall.nodes.contains(node) && !stall.missing.contains(&rank) {
            stall.missing.push(rank);
        }
    }
    for (node, s) in roles {
        let (Some(job), Some(role)) = (job_of(jobs, s), s.label(label::ROLE)) else {
            continue;
        };
        let gpu = NodeGpu {
            gpu: s.label(label::GPU).map(str::to_owned),
            uuid: s.label(label::UUID).map(str::to_owned),
        };
        if let Some(uuid) = &gpu.uuid {
            for g in job
                .gpus
                .iter_mut()
                .filter(|g| &g.uuid == uuid && g.node == *node)
            {
                g.role = Some(role.to_owned());
            }
        }
        if role != GpuRole::Straggler.name() {
            continue;
        }
        if let Some(v) = job.per_node.iter_mut().find(|v| v.node == *node)
            && !v.stragglers.contains(&gpu)
        {
            v.stragglers.push(gpu);
            v.stragglers.sort_by_key(|g| gpu_index_key(&g.gpu));
        }
    }
    for job in jobs.values_mut() {
        if let Some(stall) = &mut job.stall {
            stall.nodes.sort();
            stall.missing.sort_by(|a, b| {
                let rank = |m: &MissingRank| m.rank.as_deref().and_then(|r| r.parse::<u64>().ok());
                rank(a).cmp(&rank(b)).then_with(|| a.cmp(b))
            });
        }
    }
}

/// The stalled verdicts, the one that explains the others first: an exited or stopped rank
/// is why its peers hang.
const STALLED: [JobPattern; 3] = [
    JobPattern::RankExited,
    JobPattern::RankStopped,
    JobPattern::Hung,
];

fn stalled(verdict: &str) -> bool {
    STALLED.iter().any(|p| p.name() == verdict)
}

/// Of two stalled verdicts (or none yet, `""`), the one that explains more.
fn worse_stall<'a>(a: &'a str, b: &'a str) -> &'a str {
    let order = |v: &str| {
        STALLED
            .iter()
            .position(|p| p.name() == v)
            .unwrap_or(usize::MAX)
    };
    if order(b) < order(a) { b } else { a }
}

/// The rules' `GpuJobHung` across nodes: the job is stalled even where no node's gpudiag says
/// so (every rank waits, or the missing rank runs where gpudiag does not). A node's own
/// `GpuJobHung` adds nothing its verdict series did not say.
fn add_hung_alerts(jobs: &mut BTreeMap<JobId, Job>, job_alerts: &[Alert]) {
    for a in job_alerts.iter().filter(|a| {
        a.name == rules::ALERT_JOB_HUNG && a.scope.as_deref() == Some(rules::SCOPE_ACROSS_NODES)
    }) {
        let Some(key) = &a.job_key else { continue };
        for job in jobs.values_mut().filter(|j| &j.job_key == key) {
            let stall = job.stall.get_or_insert_with(JobStall::default);
            if stall.verdict.is_empty() {
                stall.verdict = JobPattern::Hung.name().to_owned();
            }
            if stall.across_nodes.as_deref() != Some("firing") {
                stall.across_nodes = Some(a.state.clone());
            }
        }
    }
}

/// The job a series of gpudiag's names by its key, if the fleet holds it.
fn job_of<'a>(jobs: &'a mut BTreeMap<JobId, Job>, s: &Series) -> Option<&'a mut Job> {
    let (key, by) = (s.label(label::JOB_KEY)?, s.label(label::JOINED_BY)?);
    jobs.get_mut(&(key.to_owned(), by.to_owned()))
}

/// The ranks two GPUs of a job or more hold, in order.
fn repeated_ranks(job: &Job) -> Vec<String> {
    let mut held: BTreeMap<&str, u32> = BTreeMap::new();
    for r in job.gpus.iter().filter_map(|g| g.rank.as_deref()) {
        *held.entry(r).or_default() += 1;
    }
    let mut repeated: Vec<&str> = held
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(r, _)| r)
        .collect();
    repeated.sort_by_key(|r| (r.parse::<u64>().unwrap_or(u64::MAX), r.to_string()));
    repeated.into_iter().map(str::to_owned).collect()
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

/// The shipped rules' judgement of a job across nodes: their alerts on it (each GPU a
/// straggler alert names, a firing one before a pending one) and their figures.
fn judge_across_nodes(
    job: &mut Job,
    (key, by): &JobId,
    job_alerts: &[Alert],
    rule_series: &[Series],
) {
    let on_job = |name: &'static str| {
        job_alerts
            .iter()
            .filter(move |a| a.job_key.as_deref() == Some(key.as_str()) && a.name == name)
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
    let firing = |a: &Alert| a.state == "firing";
    let mut alerts: Vec<&Alert> = on_job(rules::ALERT_JOB_STRAGGLER).collect();
    alerts.sort_by(|a, b| {
        firing(b)
            .cmp(&firing(a))
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| gpu_index_key(&a.gpu).cmp(&gpu_index_key(&b.gpu)))
    });
    // A GPU is named once, by its firing alert where it has one.
    let mut seen = BTreeSet::new();
    let stragglers: Vec<Straggler> = alerts
        .into_iter()
        .filter(|a| seen.insert((a.node.clone(), a.gpu.clone(), a.uuid.clone())))
        .map(|a| Straggler {
            node: a.node.clone(),
            gpu: a.gpu.clone(),
            uuid: a.uuid.clone(),
            pace: a.pace.clone(),
            state: a.state.clone(),
        })
        .collect();
    let comm = on_job(rules::ALERT_JOB_COMMUNICATION_BOUND).max_by_key(|a| firing(a));
    let (pattern, state) = match (stragglers.first(), comm) {
        (Some(s), _) => ("straggler", Some(s.state.clone())),
        (None, Some(a)) => ("communication_bound", Some(a.state.clone())),
        (None, None) => ("balanced", None),
    };
    let any_firing = state.as_deref() == Some("firing") || comm.is_some_and(firing);
    let any = !stragglers.is_empty() || comm.is_some();
    job.across_nodes = Some(JobJudgement {
        pattern: pattern.to_owned(),
        state,
        stragglers,
        sm_active_median_pct: job_rule(rules::JOB_SM_ACTIVE_MEDIAN).map(|v| v * 100.0),
        sm_active_spread: job_rule(rules::JOB_SM_ACTIVE_SPREAD),
    });
    if any_firing {
        job.rank = job.rank.max(Rank::Warn);
    } else if any {
        job.rank = job.rank.max(Rank::Held);
    }
}

/// A GPU is a straggler when a firing alert or its node's own verdict names it.
fn mark_stragglers(job: &mut Job) {
    let by_rules = job
        .across_nodes
        .iter()
        .flat_map(|j| &j.stragglers)
        .filter(|s| s.state == "firing")
        .map(|s| (s.node.clone(), s.gpu.clone(), s.uuid.clone()));
    let by_nodes = job.per_node.iter().flat_map(|v| {
        v.stragglers
            .iter()
            .map(|g| (Some(v.node.clone()), g.gpu.clone(), g.uuid.clone()))
    });
    let named: Vec<_> = by_rules.chain(by_nodes).collect();
    for g in &mut job.gpus {
        g.straggler = named.iter().any(|(node, gpu, uuid)| match uuid {
            // A UUID a cloned image gave two nodes is the named node's GPU alone.
            Some(u) => *u == g.uuid && node.as_ref().is_none_or(|n| *n == g.node),
            // An older node's verdict may name the GPU by index alone.
            None => node.as_deref() == Some(g.node.as_str()) && gpu.is_some() && *gpu == g.gpu,
        });
    }
}

/// A stalled job fails; a node's verdict other than balanced holds the job up; all balanced,
/// it is good.
fn rank_by_node_verdicts(job: &mut Job) {
    if job.stall.is_some() {
        job.rank = job.rank.max(Rank::Fail);
    } else if job
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
            scope: None,
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
        // The pending and the firing alert on one GPU name it once.
        assert_eq!(across.stragglers.len(), 1, "{across:?}");
        assert_eq!(across.stragglers[0].pace.as_deref(), Some("slow"));
        assert_eq!(across.stragglers[0].state, "firing");
        let stragglers: Vec<&str> = k
            .gpus
            .iter()
            .filter(|g| g.straggler)
            .map(|g| g.uuid.as_str())
            .collect();
        assert_eq!(stragglers, ["GPU-1"]);
        assert_eq!(k.rank, Rank::Warn);
    }

    /// Two GPUs of one job on two nodes lead together: each alert names its GPU, the firing
    /// one first, and only a firing alert marks a GPU.
    #[test]
    fn several_straggler_alerts_name_each_gpu() {
        let mut pending = straggler_alert("pending");
        pending.node = Some("a".to_owned());
        pending.uuid = Some("GPU-0".to_owned());
        let alerts = [pending, straggler_alert("firing")];
        let jobs = jobs(&two_nodes(), Vec::new(), &alerts, &[]);
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        let across = k.across_nodes.as_ref().unwrap();
        assert_eq!(across.state.as_deref(), Some("firing"));
        let named: Vec<(&str, &str)> = across
            .stragglers
            .iter()
            .map(|s| (s.uuid.as_deref().unwrap(), s.state.as_str()))
            .collect();
        assert_eq!(named, [("GPU-1", "firing"), ("GPU-0", "pending")]);
        let marked: Vec<&str> = k
            .gpus
            .iter()
            .filter(|g| g.straggler)
            .map(|g| g.uuid.as_str())
            .collect();
        assert_eq!(marked, ["GPU-1"]);
    }

    /// A cloned image gave nodes a and b the same UUID, both in job `k`: the rules record a
    /// figure for each node's GPU, the straggler alert and a node's role name one of them, and
    /// each stays on its own node.
    #[test]
    fn a_uuid_on_two_nodes_is_two_gpus_of_the_job() {
        let mut f = fleet();
        f.nodes = vec![
            node("a", vec![gpu("GPU-clone", "0", &[("k", "0")])]),
            node("b", vec![gpu("GPU-clone", "0", &[("k", "1")])]),
        ];
        f.rules = RulesState::Loaded;
        let figures = [
            s(
                rules::JOB_GPU_SM_ACTIVE_AVG,
                &[("Hostname", "a"), ("UUID", "GPU-clone"), ("job_key", "k")],
                0.45,
            ),
            s(
                rules::JOB_GPU_SM_ACTIVE_AVG,
                &[("Hostname", "b"), ("UUID", "GPU-clone"), ("job_key", "k")],
                0.9,
            ),
        ];
        let mut alert = straggler_alert("firing");
        alert.uuid = Some("GPU-clone".to_owned());
        let jobs = jobs(
            &f,
            vec![role("b", "GPU-clone", "0", "straggler")],
            &[alert],
            &figures,
        );
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        let gpus: Vec<(&str, Option<f64>, bool, Option<&str>)> = k
            .gpus
            .iter()
            .map(|g| {
                (
                    g.node.as_str(),
                    g.sm_active_pct,
                    g.straggler,
                    g.role.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            gpus,
            [
                ("a", Some(45.0), false, None),
                ("b", Some(90.0), true, Some("straggler"))
            ]
        );
    }

    fn verdict(node: &str, v: &str, labels: &[(&'static str, &'static str)]) -> (String, Series) {
        let mut all = vec![("job_key", "k"), ("joined_by", "slurm"), ("verdict", v)];
        all.extend_from_slice(labels);
        (node.to_owned(), s("gpudiag_job_verdict", &all, 1.0))
    }

    fn role(
        node: &str,
        uuid: &'static str,
        gpu: &'static str,
        role: &'static str,
    ) -> (String, Series) {
        (
            node.to_owned(),
            s(
                series::GPUDIAG_JOB_GPU_ROLE,
                &[
                    ("job_key", "k"),
                    ("joined_by", "slurm"),
                    ("UUID", uuid),
                    ("gpu", gpu),
                    ("role", role),
                ],
                1.0,
            ),
        )
    }

    /// Without the rules, each node's own verdict judges: its role series name the stragglers
    /// (here one on each node) and the GPUs waiting for them.
    #[test]
    fn without_the_rules_each_nodes_roles_name_its_stragglers() {
        let mut f = two_nodes();
        f.rules = RulesState::NotLoaded;
        f.nodes[1].gpus.push(gpu("GPU-3", "2", &[("k", "2")]));
        let jobs = jobs(
            &f,
            vec![
                role("b", "GPU-1", "0", "straggler"),
                verdict("b", "straggler", &[]),
                verdict("a", "straggler", &[]),
                role("a", "GPU-3", "2", "straggler"),
                role("a", "GPU-0", "0", "waiting"),
            ],
            &[],
            &[],
        );
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        assert!(k.across_nodes.is_none());
        let nodes: Vec<(&str, Vec<Option<&str>>)> = k
            .per_node
            .iter()
            .map(|v| {
                let gpus = v.stragglers.iter().map(|g| g.uuid.as_deref()).collect();
                (v.node.as_str(), gpus)
            })
            .collect();
        assert_eq!(
            nodes,
            [("a", vec![Some("GPU-3")]), ("b", vec![Some("GPU-1")])]
        );
        let gpus: Vec<(&str, bool, Option<&str>)> = k
            .gpus
            .iter()
            .map(|g| (g.uuid.as_str(), g.straggler, g.role.as_deref()))
            .collect();
        assert_eq!(
            gpus,
            [
                ("GPU-0", false, Some("waiting")),
                ("GPU-1", true, Some("straggler")),
                ("GPU-3", true, Some("straggler")),
            ]
        );
        assert_eq!(k.rank, Rank::Held);
    }

    /// A node running a gpudiag from before the role series names its straggler in the
    /// verdict's labels: still read.
    #[test]
    fn an_older_nodes_straggler_labels_are_read() {
        let mut f = two_nodes();
        f.rules = RulesState::NotLoaded;
        let jobs = jobs(
            &f,
            vec![
                verdict(
                    "a",
                    "straggler",
                    &[("straggler_gpu", "0"), ("straggler_UUID", "GPU-0")],
                ),
                verdict("b", "balanced", &[]),
            ],
            &[],
            &[],
        );
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        let nodes: Vec<&str> = k.per_node.iter().map(|v| v.node.as_str()).collect();
        assert_eq!(nodes, ["a", "b"]);
        assert_eq!(
            k.per_node[0].stragglers,
            [NodeGpu {
                gpu: Some("0".to_owned()),
                uuid: Some("GPU-0".to_owned()),
            }]
        );
        assert!(k.per_node[1].stragglers.is_empty());
        assert!(k.gpus[0].straggler);
        assert_eq!(k.gpus[0].role, None);
        assert_eq!(k.rank, Rank::Held);
    }

    fn node_series(
        node: &str,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
        value: f64,
    ) -> (String, Series) {
        let mut all = vec![("job_key", "k"), ("joined_by", "slurm")];
        all.extend_from_slice(labels);
        (node.to_owned(), s(name, &all, value))
    }

    /// Node b's gpudiag says job `k` hung 42 s, waiting for rank 1 (asleep on its GPU 0); node
    /// a's sees only waiting GPUs. The pod's job ranks worse (its node is down), yet the stalled
    /// job comes first.
    #[test]
    fn a_stalled_job_comes_first_with_its_missing_rank_and_how_long() {
        let mut f = two_nodes();
        f.nodes[1].gpus[1].rank = Rank::Down;
        let jobs = jobs(
            &f,
            vec![
                verdict("a", "balanced", &[]),
                verdict("b", "hung", &[]),
                role("b", "GPU-1", "0", "missing"),
                node_series("b", series::GPUDIAG_JOB_STUCK_SECONDS, &[], 42.0),
                // Another job's stall is not this one's.
                (
                    "b".to_owned(),
                    s(
                        series::GPUDIAG_JOB_STUCK_SECONDS,
                        &[("job_key", "other"), ("joined_by", "slurm")],
                        900.0,
                    ),
                ),
                node_series(
                    "b",
                    series::GPUDIAG_JOB_MISSING_RANK_INFO,
                    &[
                        ("UUID", "GPU-1"),
                        ("gpu", "0"),
                        ("rank", "1"),
                        ("pid", "4553"),
                        ("state", "sleeping"),
                    ],
                    1.0,
                ),
            ],
            &[],
            &[],
        );
        let keys: Vec<&str> = jobs.iter().map(|j| j.job_key.as_str()).collect();
        assert_eq!(keys, ["k", "ml/p"]);
        assert_eq!(jobs[1].rank, Rank::Down);
        let k = &jobs[0];
        assert_eq!(k.rank, Rank::Fail);
        assert_eq!(
            k.stall,
            Some(JobStall {
                verdict: "hung".to_owned(),
                nodes: vec!["b".to_owned()],
                stuck_s: Some(42.0),
                missing: vec![MissingRank {
                    node: "b".to_owned(),
                    gpu: Some("0".to_owned()),
                    uuid: Some("GPU-1".to_owned()),
                    rank: Some("1".to_owned()),
                    pid: Some("4553".to_owned()),
                    state: Some("sleeping".to_owned()),
                }],
                across_nodes: None,
            })
        );
        assert_eq!(k.gpus[1].role.as_deref(), Some("missing"));
        assert!(!k.gpus[1].straggler, "a missing rank is no straggler");
    }

    /// An exited rank explains its peers' hang: the job reads rank_exited, from both nodes.
    /// A stuck time or missing rank from a node that no longer says stalled is left out.
    #[test]
    fn an_exited_rank_names_the_stall_and_stale_stall_series_are_left_out() {
        let jobs = jobs(
            &two_nodes(),
            vec![
                verdict("a", "hung", &[]),
                verdict("b", "rank_exited", &[]),
                node_series("a", series::GPUDIAG_JOB_STUCK_SECONDS, &[], 30.0),
                node_series("b", series::GPUDIAG_JOB_STUCK_SECONDS, &[], 75.0),
                node_series(
                    "b",
                    series::GPUDIAG_JOB_MISSING_RANK_INFO,
                    &[("gpu", "0"), ("pid", "77"), ("state", "exited")],
                    1.0,
                ),
            ],
            &[],
            &[],
        );
        let stall = jobs[0].stall.as_ref().unwrap();
        assert_eq!(stall.verdict, "rank_exited");
        assert_eq!(stall.nodes, ["a", "b"]);
        assert_eq!(stall.stuck_s, Some(75.0));
        assert_eq!(stall.missing.len(), 1);
        assert_eq!(stall.missing[0].rank, None, "a rank not read stays unknown");

        let stale = jobs_of(vec![
            verdict("b", "balanced", &[]),
            node_series("b", series::GPUDIAG_JOB_STUCK_SECONDS, &[], 75.0),
            node_series(
                "b",
                series::GPUDIAG_JOB_MISSING_RANK_INFO,
                &[("gpu", "0"), ("pid", "77")],
                1.0,
            ),
        ]);
        assert_eq!(stale[0].stall, None);
        assert_eq!(stale[0].rank, Rank::Good);
    }

    fn jobs_of(node_jobs: Vec<(String, Series)>) -> Vec<Job> {
        jobs(&two_nodes(), node_jobs, &[], &[])
    }

    /// The rules' GpuJobHung across nodes stalls the job though no node's gpudiag says so;
    /// a node's own GpuJobHung adds nothing its verdict did not.
    #[test]
    fn the_rules_hung_alert_across_nodes_stalls_the_job() {
        let hung = |state: &str, scope: &str| Alert {
            name: rules::ALERT_JOB_HUNG.to_owned(),
            node: None,
            gpu: None,
            uuid: None,
            pace: None,
            scope: Some(scope.to_owned()),
            ..straggler_alert(state)
        };
        let jobs = jobs(
            &two_nodes(),
            vec![verdict("a", "balanced", &[]), verdict("b", "balanced", &[])],
            &[
                hung("firing", "across_nodes"),
                hung("pending", "across_nodes"),
            ],
            &[],
        );
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        let stall = k.stall.as_ref().unwrap();
        assert_eq!(
            (stall.verdict.as_str(), stall.across_nodes.as_deref()),
            ("hung", Some("firing"))
        );
        assert!(stall.nodes.is_empty() && stall.missing.is_empty() && stall.stuck_s.is_none());
        assert_eq!(k.rank, Rank::Fail);

        let jobs = jobs_of_alerts(&[hung("firing", "node")]);
        assert!(jobs.iter().all(|j| j.stall.is_none()), "{jobs:?}");
    }

    fn jobs_of_alerts(alerts: &[Alert]) -> Vec<Job> {
        jobs(&two_nodes(), Vec::new(), alerts, &[])
    }

    /// Two jobs under one key (an older gpudiag's unqualified 127.0.0.1:29500 on two nodes):
    /// the ranks repeat, the fleet says so and does not judge the key across nodes.
    #[test]
    fn a_key_whose_gpus_repeat_a_rank_is_doubted_not_judged() {
        let mut f = two_nodes();
        f.nodes[0].gpus[0].jobs[0].rank = Some("0".to_owned());
        let jobs = jobs(&f, Vec::new(), &[straggler_alert("firing")], &[]);
        let k = jobs.iter().find(|j| j.job_key == "k").unwrap();
        assert!(k.across_nodes.is_none(), "{k:?}");
        assert_eq!(k.doubts.len(), 1, "{k:?}");
        assert!(
            k.doubts[0].starts_with("rank 0 held by two GPUs"),
            "{:?}",
            k.doubts
        );
        let fine = jobs.iter().find(|j| j.job_key == "ml/p").unwrap();
        assert!(fine.doubts.is_empty());
    }
}
