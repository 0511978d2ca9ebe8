//! What one look at the fleet holds: its nodes and their GPUs, the jobs spread over them, the
//! firing alerts, and what the looking cost. `gpudiag fleet --json` prints it as it is, and the
//! terminal UI draws it; both get it from [`crate::read::read_fleet`].
//!
//! Every figure is an `Option`: a GPU seen only through dcgm-exporter has no verdict, a GPU
//! without profiling counters no SM activity, and neither is ever written as 0.

use std::collections::BTreeMap;

use gpudiag_model::build_info::ToolInfo;
use gpudiag_model::finding::Severity;
use gpudiag_model::finding::Status;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The version of the fleet report; bumped when a field is removed or changes meaning.
/// 2: a job's judgement lists its `stragglers` (version 1 had one `straggler`), a node's
/// verdict lists the `stragglers` it names (version 1 had `straggler_gpu` and
/// `straggler_UUID`), and each of a job's GPUs has the `role` its node gave it. Since added,
/// keeping 2: a job's `stall`; the fleet's `left_out`.
pub const FLEET_SCHEMA_VERSION: u32 = 2;

/// The fleet at one instant, as Prometheus knows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Fleet {
    pub schema_version: u32,
    pub tool: ToolInfo,
    /// The Prometheus read, without credentials.
    pub prometheus: String,
    /// The selector every device series was read with (`{}` for all).
    pub selector: String,
    /// The label that names a node (falling back to `instance` where a series lacks it).
    pub node_label: String,
    /// The instant the queries were evaluated at, ms since the Unix epoch.
    pub evaluated_at_ms: i64,
    /// The same instant in RFC 3339 (UTC).
    pub evaluated_at: String,
    /// `healthy`, `warn` or `fail` from the worst finding or alert; `not_judged` when no GPU has
    /// gpudiag's own series (dcgm-exporter only); `could_not_run` when Prometheus could not be
    /// read or holds no GPU series under the selector.
    pub status: Status,
    /// Why the fleet could not be read; null when it was.
    pub could_not_run: Option<String>,
    pub counts: Counts,
    /// Nodes, worst first.
    pub nodes: Vec<Node>,
    /// Jobs of two or more GPUs: those that make no progress (`stall`) first, then worst first.
    pub jobs: Vec<Job>,
    /// Whether the shipped rules (assets/prometheus/gpudiag-rules.yml) are loaded: they judge a
    /// job across nodes.
    pub rules: RulesState,
    /// Firing alerts that name no node of the fleet (the others sit under their node or GPU).
    pub unplaced_alerts: Vec<Alert>,
    /// Every finding and alert of the fleet at or above info, worst first: what `status` and
    /// the exit code are computed from.
    pub findings: Vec<FleetFinding>,
    /// Reads that failed without sinking the whole look (the alerts API, the rules API): what
    /// is missing and why; and GPU UUIDs that one exporter reports from two or more nodes
    /// (each node's GPU is listed, and the shipped rules keep them apart by node); and lists
    /// cut at their caps (`left_out`).
    pub degraded: Vec<String>,
    /// What was read but is not listed, past the fleet's caps (also said in `degraded`).
    #[serde(default)]
    pub left_out: LeftOut,
    pub queries: QueryCost,
}

/// How many of each list the fleet leaves out, past its caps: 0 where all is listed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct LeftOut {
    /// Alerts Prometheus held beyond the 1,000 worst the fleet reads (firing before pending,
    /// then by severity); `counts.alerts_firing` counts the firing ones read.
    pub alerts: u64,
    /// Findings and alerts beyond the 10,000 worst listed in `findings` (`status` and the exit
    /// code are computed from them all).
    pub findings: u64,
    /// Nodes past the 8,192 GPUs listed (whole nodes, worst first), and their GPUs; `counts`
    /// counts them all.
    pub nodes: u64,
    pub gpus: u64,
    /// Jobs beyond the 2,000 listed (stalled, then worst first).
    pub jobs: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Counts {
    pub nodes: u32,
    /// Nodes with no scrape target up.
    pub nodes_down: u32,
    pub gpus: u32,
    /// GPUs with a gpudiag verdict.
    pub gpus_judged: u32,
    /// GPUs seen only through dcgm-exporter.
    pub gpus_dcgm_exporter_only: u32,
    pub alerts_firing: u32,
}

/// What reading the fleet cost, so its load on Prometheus can be judged.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct QueryCost {
    /// HTTP requests made.
    pub count: u32,
    /// Their summed wall time.
    pub seconds: f64,
    /// Bytes of the answers as received (compressed when Prometheus compressed them).
    pub bytes: u64,
}

impl QueryCost {
    pub fn add(&mut self, other: &QueryCost) {
        self.count += other.count;
        self.seconds += other.seconds;
        self.bytes += other.bytes;
    }

    /// What was spent since `earlier`, a copy of this counter taken before.
    pub fn since(&self, earlier: &QueryCost) -> QueryCost {
        QueryCost {
            count: self.count - earlier.count,
            seconds: self.seconds - earlier.seconds,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Every scrape target of the node is up.
    Up,
    /// Some targets are up, some down.
    Partial,
    /// No target is up: its figures are gone (Prometheus marks them stale).
    Down,
}

/// Which exporter a figure or a GPU was seen through.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Exporter {
    Gpudiag,
    DcgmExporter,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    pub state: NodeState,
    pub targets: Vec<Target>,
    /// The exporters its GPUs were seen through.
    pub exporters: Vec<Exporter>,
    /// GPUs by index.
    pub gpus: Vec<Gpu>,
    /// Findings without a GPU (the node's own, e.g. a kernel-log XID with no device).
    pub findings: Vec<FindingRef>,
    /// Firing alerts on the node that name no GPU of it.
    pub alerts: Vec<Alert>,
    /// The worst of its GPUs, findings, alerts and targets: what the fleet table sorts by.
    pub worst: Rank,
}

/// One scrape target (`up`) of a node.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Target {
    pub instance: String,
    /// Prometheus's scrape `job` label (not a compute job).
    pub scrape_job: String,
    pub up: bool,
    pub exporter: Option<Exporter>,
    /// Seconds from the last scrape to the evaluated instant; null when unknown.
    pub last_scrape_age_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Gpu {
    /// The `gpu` label (the index on its node).
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub exporters: Vec<Exporter>,
    pub util_pct: Option<f64>,
    pub sm_active_pct: Option<f64>,
    pub tensor_active_pct: Option<f64>,
    pub memory_used_mib: Option<f64>,
    pub memory_total_mib: Option<f64>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<f64>,
    pub verdict: GpuVerdict,
    /// Active findings, worst first.
    pub findings: Vec<FindingRef>,
    /// The job(s) its processes belong to, from gpudiag's job info.
    pub jobs: Vec<JobRef>,
    /// The Kubernetes pod holding it, from the exporters' pod labels.
    pub pod: Option<PodRef>,
    /// Firing alerts naming this GPU.
    pub alerts: Vec<Alert>,
    /// Seconds since its freshest target was scraped.
    pub last_scrape_age_s: Option<f64>,
    pub rank: Rank,
}

/// The bottleneck verdict of a GPU, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GpuVerdict {
    Judged {
        /// `compute_bound`, `memory_bound`, … as gpudiag names it (docs/verdicts.md).
        bottleneck: String,
        confidence: Option<String>,
        basis: Option<String>,
    },
    /// gpudiag serves the GPU but has not judged it yet (too little data, no utilisation).
    NotJudgedYet,
    /// Only dcgm-exporter reports the GPU: gpudiag's verdicts, findings and processes are n/a.
    DcgmExporterOnly,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
#[schemars(deny_unknown_fields)]
pub struct FindingRef {
    pub severity: Severity,
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
#[schemars(deny_unknown_fields)]
pub struct JobRef {
    pub job_key: String,
    /// What the key is: slurm_job, run_id, master_address or pod.
    pub joined_by: String,
    pub slurm_job: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub rank: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
#[schemars(deny_unknown_fields)]
pub struct PodRef {
    pub namespace: Option<String>,
    pub pod: String,
    pub container: Option<String>,
}

/// A firing (or pending) alert from Prometheus's `/api/v1/alerts`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Alert {
    pub name: String,
    /// `firing` or `pending`.
    pub state: String,
    /// The alert's `severity` label read as gpudiag's; null when it has none gpudiag knows.
    pub severity: Option<Severity>,
    pub summary: Option<String>,
    pub node: Option<String>,
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
    pub job_key: Option<String>,
    /// The straggler alert's `pace` label: leads or lags.
    pub pace: Option<String>,
    /// `GpuJobHung`'s `scope` label: `node` (one node's gpudiag judged the job stalled) or
    /// `across_nodes` (the rules saw it on every node's GPUs).
    #[serde(default)]
    pub scope: Option<String>,
    /// RFC 3339, as Prometheus gives it.
    pub active_since: Option<String>,
}

/// Whether the shipped rules are loaded in the Prometheus read.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RulesState {
    Loaded,
    NotLoaded,
    /// The rules API could not be read and no recorded series says either way.
    Unknown {
        reason: String,
    },
}

impl RulesState {
    pub fn loaded(&self) -> bool {
        matches!(self, RulesState::Loaded)
    }
}

/// A job of two or more GPUs, across nodes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Job {
    pub job_key: String,
    pub joined_by: String,
    pub slurm_job: Option<String>,
    pub namespace: Option<String>,
    pub nodes: Vec<String>,
    pub gpus: Vec<JobGpu>,
    /// The judgement across all its GPUs, by the shipped rules; null when they are not loaded.
    pub across_nodes: Option<JobJudgement>,
    /// What each node's gpudiag said of the job's GPUs on that node.
    pub per_node: Vec<NodeJobVerdict>,
    /// Why the grouping itself is doubtful, in words: GPUs under its key that repeat a rank
    /// (the key joins two jobs, which the shipped rules do not judge). Empty when none.
    pub doubts: Vec<String>,
    /// Where the job makes no progress (a node's gpudiag judged it hung, rank_exited or
    /// rank_stopped, or the shipped rules saw every node's GPUs spin): how long and which
    /// ranks it waits for. Null while it makes progress.
    #[serde(default)]
    pub stall: Option<JobStall>,
    pub rank: Rank,
}

/// A job that makes no progress: its GPUs sit in collectives that move nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct JobStall {
    /// `rank_exited`, `rank_stopped` or `hung`: the first of these any node's gpudiag says
    /// (an exited or stopped rank explains the others' hang); `hung` where only the rules saw
    /// it.
    pub verdict: String,
    /// The nodes whose gpudiag judged it stalled, by name.
    pub nodes: Vec<String>,
    /// The longest any of those nodes says it has made no progress (`gpudiag_job_stuck_seconds`);
    /// null when none says.
    pub stuck_s: Option<f64>,
    /// The ranks its GPUs wait for, as the nodes that run them name them; empty where no node
    /// sees one (every rank waits, or the rank runs on a node whose gpudiag does not say).
    pub missing: Vec<MissingRank>,
    /// The shipped rules' `GpuJobHung` across nodes on this job: `firing`, or `pending` while
    /// it waits out its `for:`; null when it is not raised (or the rules are not loaded).
    pub across_nodes: Option<String>,
}

impl JobStall {
    /// In words, for the text table and the job view: the verdict, for how long, who judged
    /// it, and which ranks its GPUs wait for. Label values from Prometheus are in it as read:
    /// escape it to print.
    pub fn words(&self) -> String {
        let how_long = self
            .stuck_s
            .map_or_else(String::new, |s| format!(" for {s:.0} s"));
        let seen = match (self.nodes.is_empty(), &self.across_nodes) {
            (true, Some(state)) => format!("the rules' alert across its nodes ({state})"),
            (true, None) => "no node".to_owned(),
            (false, _) => self.nodes.join(", "),
        };
        let waits = if self.missing.is_empty() {
            "no node names the rank it waits for".to_owned()
        } else {
            let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".to_owned());
            let ranks: Vec<String> = self
                .missing
                .iter()
                .map(|m| {
                    // A rank that must run on its node and was never seen there has no GPU.
                    if m.gpu.is_none() && m.state.as_deref() == Some("absent") {
                        return format!("rank {} (not running on {})", or(&m.rank), m.node);
                    }
                    let state = m
                        .state
                        .as_deref()
                        .map_or_else(String::new, |s| format!(", {s}"));
                    format!(
                        "rank {} (GPU {} of {}, pid {}{state})",
                        or(&m.rank),
                        or(&m.gpu),
                        m.node,
                        or(&m.pid)
                    )
                })
                .collect();
            format!("waits for {}", ranks.join(", "))
        };
        format!("{}{how_long}, seen by {seen}; {waits}", self.verdict)
    }
}

/// A rank a stalled job waits for (`gpudiag_job_missing_rank_info`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
#[schemars(deny_unknown_fields)]
pub struct MissingRank {
    pub node: String,
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
    pub rank: Option<String>,
    /// Its host pid on that node.
    pub pid: Option<String>,
    /// Its process state (`sleeping`, `stopped`, `disk_sleep`, ...) or `exited`; null when the
    /// node could not read it.
    pub state: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct JobGpu {
    pub node: String,
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: String,
    pub rank: Option<String>,
    /// The window averages the rules recorded (`gpudiag_job_gpu:*:avg`), in % .
    pub sm_active_pct: Option<f64>,
    pub util_pct: Option<f64>,
    /// Named by a firing straggler alert, or by its node's own job verdict.
    pub straggler: bool,
    /// Its part in its node's own verdict on the job (`gpudiag_job_gpu_role`): `straggler`
    /// (the others wait for it) or `waiting` (it waits for the stragglers); null when it has
    /// none or its node's gpudiag does not say.
    pub role: Option<String>,
}

/// The shipped rules' judgement of a job.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct JobJudgement {
    /// `straggler`, `communication_bound` or `balanced` (no alert firing on it).
    pub pattern: String,
    /// `firing` when an alert on it fires, or `pending` while they wait out their `for:`.
    pub state: Option<String>,
    /// Every GPU a straggler alert names (several GPUs may lead or lag together), the firing
    /// first; empty unless the pattern is `straggler`.
    pub stragglers: Vec<Straggler>,
    /// The job's median SM activity over the rules' window (%).
    pub sm_active_median_pct: Option<f64>,
    /// Largest over smallest SM activity among its GPUs.
    pub sm_active_spread: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Straggler {
    pub node: Option<String>,
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
    /// leads (busier than its peers) or lags (idle while they are busy).
    pub pace: Option<String>,
    /// `firing`, or `pending` while its alert waits out its `for:`.
    pub state: String,
}

/// One node's own verdict on its GPUs of a job (`gpudiag_job_verdict`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct NodeJobVerdict {
    pub node: String,
    /// straggler, communication_bound, imbalanced or balanced.
    pub verdict: String,
    pub confidence: Option<String>,
    /// The GPUs of the node it names as stragglers (`gpudiag_job_gpu_role`, or an older
    /// gpudiag's `straggler_gpu` label), by index.
    pub stragglers: Vec<NodeGpu>,
}

/// A GPU of a node, as a node's own verdict names it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
#[schemars(deny_unknown_fields)]
pub struct NodeGpu {
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
}

/// One finding or alert of the fleet, placed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct FleetFinding {
    pub severity: Severity,
    /// A gpudiag finding id (docs/findings.md), `alert:NAME` for a firing alert, or
    /// `fleet.target_down` for a scrape target that is down.
    pub id: String,
    pub node: Option<String>,
    pub gpu: Option<String>,
    pub job_key: Option<String>,
}

/// How bad something is, for sorting worst first: larger is worse. The variants in order.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Rank {
    /// Nothing to judge by (no verdict yet, dcgm-exporter only and quiet).
    #[default]
    Unknown,
    /// Idle, nothing held.
    Idle,
    /// Working well (compute- or memory-bound) or balanced.
    Good,
    /// A verdict that says it is held back, or an info finding.
    Held,
    /// A warn finding or alert.
    Warn,
    /// A fail finding or alert.
    Fail,
    /// Its node is down: nothing is known now.
    Down,
}

impl Fleet {
    /// Every node's GPUs with their node, in table order.
    pub fn gpus(&self) -> impl Iterator<Item = (&Node, &Gpu)> {
        self.nodes
            .iter()
            .flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
    }

    /// The node a name belongs to.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The worst severity among the findings, if any.
    pub fn worst_severity(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).max()
    }

    /// Whether a finding at or above `fail_on` is present (exit code 1).
    pub fn fails(&self, fail_on: Severity) -> bool {
        self.worst_severity().is_some_and(|s| s >= fail_on)
    }
}

/// A node's charts and processes, read when its view opens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct NodeDetail {
    pub node: String,
    /// From, to and step of the range queries, in ms and s.
    pub start_ms: i64,
    pub end_ms: i64,
    pub step_s: f64,
    /// Per GPU (by UUID, else `gpu` label), per chart (`util_pct`, `sm_active_pct`, `power_w`,
    /// `memory_used_mib`, `temperature_c`): points (ms, value) in time order.
    pub charts: BTreeMap<String, BTreeMap<String, Vec<(i64, f64)>>>,
    pub processes: Vec<Process>,
    /// Why processes are not shown (dcgm-exporter only, none running); null when they are.
    pub processes_absent: Option<String>,
    pub degraded: Vec<String>,
    pub queries: QueryCost,
}

/// One GPU process, from gpudiag's per-process series.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Process {
    pub gpu: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
    pub pid: String,
    pub name: Option<String>,
    pub user: Option<String>,
    pub slurm_job: Option<String>,
    pub pod: Option<String>,
    pub memory_used_bytes: Option<f64>,
    pub sm_util_pct: Option<f64>,
    pub verdict: Option<String>,
}

#[cfg(test)]
mod stall_words {
    use super::*;

    /// A rank its node says must run there and never did is named by rank and node alone.
    #[test]
    fn an_absent_rank_is_named_without_gpu_or_pid() {
        let stall = JobStall {
            verdict: "rank_exited".into(),
            nodes: vec!["node-a".into()],
            stuck_s: Some(40.0),
            missing: vec![MissingRank {
                node: "node-a".into(),
                gpu: None,
                uuid: None,
                rank: Some("1".into()),
                pid: None,
                state: Some("absent".into()),
            }],
            across_nodes: None,
        };
        assert_eq!(
            stall.words(),
            "rank_exited for 40 s, seen by node-a; waits for rank 1 (not running on node-a)"
        );
    }
}
