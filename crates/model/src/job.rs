//! A job: the GPUs whose processes work together (the ranks of one training run), and the
//! verdict on it, judged by comparing the job's GPUs with each other. Judged by
//! `gpudiag_core::rules::job`.
//!
//! A data-parallel job runs as fast as its slowest rank: the others wait for it inside a
//! collective, where NCCL keeps a few SMs spinning, so each GPU alone reads busy. Only side by
//! side does the GPU the others wait for stand out.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::attribution::Attribution;
pub use crate::attribution::Launch;
use crate::sample::TimeMs;
use crate::verdict::Confidence;

/// What ties a job's processes together, strongest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum JoinedBy {
    /// One Slurm job id (cgroup or `SLURM_JOB_ID`).
    SlurmJob,
    /// One `TORCHELASTIC_RUN_ID` (torchrun).
    RunId,
    /// One `MASTER_ADDR:MASTER_PORT`.
    MasterAddress,
    /// One Kubernetes pod.
    Pod,
    /// The command `gpudiag run` started, and its children.
    Command,
    /// One parent, not an init or a shell, running the same executable as its children.
    Parent,
    /// One process using several GPUs.
    Process,
    /// Nothing could be read but the processes run one executable on one host: a presumed job.
    SameExecutable,
}

impl JoinedBy {
    /// The JSON name, also a Prometheus label value.
    pub fn name(self) -> &'static str {
        match self {
            JoinedBy::SlurmJob => "slurm_job",
            JoinedBy::RunId => "run_id",
            JoinedBy::MasterAddress => "master_address",
            JoinedBy::Pod => "pod",
            JoinedBy::Command => "command",
            JoinedBy::Parent => "parent",
            JoinedBy::Process => "process",
            JoinedBy::SameExecutable => "same_executable",
        }
    }

    /// Whether the grouping is a guess: no key tied the processes, only their executable.
    pub fn presumed(self) -> bool {
        self == JoinedBy::SameExecutable
    }
}

/// A job's identity on a host: what joined it and the key's value.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[schemars(deny_unknown_fields)]
pub struct JobId {
    pub joined_by: JoinedBy,
    /// The Slurm job id, the run id, `addr:port`, `namespace/pod`, the parent's pid, or the
    /// executable's path (redactable).
    pub key: String,
}

impl JobId {
    /// In words: "Slurm job 42", "torchrun run 7f3c", "presumed: processes of /usr/bin/python3".
    pub fn label(&self) -> String {
        match self.joined_by {
            JoinedBy::SlurmJob => format!("Slurm job {}", self.key),
            // torchrun's ids are UUIDs: eight characters tell runs of one host apart.
            JoinedBy::RunId if self.key.chars().count() > 16 => {
                let short: String = self.key.chars().take(8).collect();
                format!("torchrun run {short}…")
            }
            JoinedBy::RunId => format!("torchrun run {}", self.key),
            JoinedBy::MasterAddress => format!("job at {}", self.key),
            JoinedBy::Pod => format!("pod {}", self.key),
            JoinedBy::Command => "the command's job".to_owned(),
            JoinedBy::Parent => format!("children of pid {}", self.key),
            JoinedBy::Process => format!("pid {}", self.key),
            JoinedBy::SameExecutable => format!("presumed job: processes of {}", self.key),
        }
    }
}

/// One GPU of a job and the job's process on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct JobMember {
    pub device: u32,
    pub uuid: Option<String>,
    pub pid: u32,
    /// Command name (redactable).
    pub name: Option<String>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
}

/// What the comparison of a job's GPUs found. Stable names: JSON values and Prometheus labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobPattern {
    /// One GPU sets the pace and the others wait for it.
    Straggler,
    /// Every GPU moves many bytes between GPUs while computing little.
    CommunicationBound,
    /// Work or memory spread unevenly across the GPUs, with no single GPU behind (pipeline
    /// stages of unequal size).
    Imbalanced,
    /// The GPUs keep pace with each other: each GPU's own verdict stands.
    Balanced,
}

impl JobPattern {
    pub const ALL: [JobPattern; 4] = [
        JobPattern::Straggler,
        JobPattern::CommunicationBound,
        JobPattern::Imbalanced,
        JobPattern::Balanced,
    ];

    /// The JSON name, also a Prometheus label value.
    pub fn name(self) -> &'static str {
        match self {
            JobPattern::Straggler => "straggler",
            JobPattern::CommunicationBound => "communication_bound",
            JobPattern::Imbalanced => "imbalanced",
            JobPattern::Balanced => "balanced",
        }
    }
}

impl std::fmt::Display for JobPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the straggler does more than its peers or less.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Pace {
    /// Busier than its peers (more work, or the same work on a slower or shared GPU): the
    /// others finish first and wait.
    Leads,
    /// Idler than its peers, who sit in collectives waiting for it (a rank short of CPU, a
    /// stalled input pipeline).
    Lags,
}

/// The GPU the others wait for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Straggler {
    pub device: u32,
    pub rank: Option<u32>,
    pub pace: Pace,
    /// The figure that set it apart (`sm_active_pct`, `gpu_util_pct`, ...), its value and the
    /// median of its peers'.
    pub metric: String,
    pub value: f64,
    pub peers_median: f64,
    /// The estimated share of the time its peers wait for it, 0 to 1, and how it was estimated.
    #[schemars(range(min = 0, max = 1))]
    pub peers_wait_share: Option<f64>,
    pub wait_estimate: String,
    /// What else differs on it from its peers, in words ("another process, pid 812, holds
    /// 4.1 GiB on it").
    pub differs: Vec<String>,
}

/// One GPU's window figures beside its peers'. `None` where not read.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct PeerFigures {
    pub device: u32,
    pub rank: Option<u32>,
    pub gpu_util_pct: Option<f64>,
    pub sm_active_pct: Option<f64>,
    pub tensor_active_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    /// NVLink receive plus transmit.
    pub nvlink_bytes_per_s: Option<f64>,
    /// PCIe receive plus transmit.
    pub pcie_bytes_per_s: Option<f64>,
    /// The most GPU memory the job's process held in the window.
    pub job_memory_bytes: Option<u64>,
    /// The job's process's CPU use, % of one core.
    pub process_cpu_pct: Option<f64>,
    /// Processes on the GPU that are not the job's.
    pub other_processes: u32,
}

/// The verdict on one job over one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct JobVerdict {
    pub job: JobId,
    /// Whether the job itself is a guess (see [`JoinedBy::SameExecutable`]).
    pub presumed: bool,
    pub members: Vec<JobMember>,
    pub verdict: JobPattern,
    pub confidence: Confidence,
    /// The window judged, ms since the Unix epoch, both ends inclusive.
    pub start_ms: TimeMs,
    pub end_ms: TimeMs,
    /// One line, naming the GPUs and the numbers that decided.
    pub title: String,
    /// What to do, in order of likely payoff.
    pub advice: String,
    pub straggler: Option<Straggler>,
    /// Each GPU's figures, by device.
    pub peers: Vec<PeerFigures>,
    /// The figures compared and the thresholds they were compared with.
    pub evidence: serde_json::Map<String, serde_json::Value>,
}

impl JobVerdict {
    /// The devices of the job.
    pub fn devices(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.iter().map(|m| m.device)
    }
}

/// The key that ties a process to the other ranks of its job on any node, or `None` when the
/// process names none: the Slurm job id, else torchrun's run id, else `MASTER_ADDR:MASTER_PORT`,
/// else the pod (`namespace/name`, else its uid). Only keys every node of a job reads alike
/// count here; a parent's pid or an executable tie processes on one host only.
pub fn cluster_key(attribution: Option<&Attribution>, launch: Option<&Launch>) -> Option<JobId> {
    let id = |joined_by, key: String| Some(JobId { joined_by, key });
    if let Some(job) = attribution.and_then(|a| a.job.as_ref()) {
        return id(JoinedBy::SlurmJob, job.id.clone());
    }
    // torchrun's run id defaults to "none" outside a rendezvous: shared by unrelated jobs.
    if let Some(run) = launch
        .and_then(|l| l.run_id.as_ref())
        .filter(|r| !r.is_empty() && r.as_str() != "none")
    {
        return id(JoinedBy::RunId, run.clone());
    }
    if let Some((addr, port)) =
        launch.and_then(|l| l.master_addr.as_ref().zip(l.master_port.as_ref()))
    {
        return id(JoinedBy::MasterAddress, format!("{addr}:{port}"));
    }
    let pod = attribution.and_then(|a| a.pod.as_ref())?;
    let key = match (&pod.namespace, &pod.name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => pod.uid.clone()?,
    };
    id(JoinedBy::Pod, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus labels and JSON use the same names.
    #[test]
    fn names_are_the_json_values() {
        for p in JobPattern::ALL {
            assert_eq!(serde_json::json!(p).as_str(), Some(p.name()));
        }
        for j in [
            JoinedBy::SlurmJob,
            JoinedBy::RunId,
            JoinedBy::MasterAddress,
            JoinedBy::Pod,
            JoinedBy::Command,
            JoinedBy::Parent,
            JoinedBy::Process,
            JoinedBy::SameExecutable,
        ] {
            assert_eq!(serde_json::json!(j).as_str(), Some(j.name()));
            assert_eq!(j.presumed(), j == JoinedBy::SameExecutable);
        }
    }

    #[test]
    fn cluster_key_takes_the_strongest_key_every_node_reads_alike() {
        use crate::attribution::{FoundIn, PodIdentity, SlurmJob};
        let launch = Launch {
            run_id: Some("none".into()),
            master_addr: Some("node-a".into()),
            master_port: Some("29500".into()),
            parent_pid: Some(7),
            exe: Some("/usr/bin/python3".into()),
            parent_exe: Some("/usr/bin/python3".into()),
            ..Launch::default()
        };
        let pod = Attribution {
            pod: Some(PodIdentity {
                uid: Some("u-1".into()),
                name: Some("train-0".into()),
                namespace: Some("ml".into()),
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        };
        let slurm = Attribution {
            job: Some(SlurmJob {
                id: "42".into(),
                step: None,
                user: None,
                found_in: FoundIn::Cgroup,
            }),
            ..pod.clone()
        };
        let key = |a: Option<&Attribution>, l: Option<&Launch>| {
            cluster_key(a, l).map(|j| (j.joined_by, j.key))
        };
        assert_eq!(
            key(Some(&slurm), Some(&launch)),
            Some((JoinedBy::SlurmJob, "42".into()))
        );
        // "none" is torchrun's default, not a rendezvous: the master address decides.
        assert_eq!(
            key(Some(&pod), Some(&launch)),
            Some((JoinedBy::MasterAddress, "node-a:29500".into()))
        );
        let run = Launch {
            run_id: Some("rdzv-7".into()),
            ..launch.clone()
        };
        assert_eq!(
            key(None, Some(&run)),
            Some((JoinedBy::RunId, "rdzv-7".into()))
        );
        assert_eq!(
            key(Some(&pod), None),
            Some((JoinedBy::Pod, "ml/train-0".into()))
        );
        let unnamed = Attribution {
            pod: Some(PodIdentity {
                uid: Some("u-1".into()),
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        };
        assert_eq!(
            key(Some(&unnamed), None),
            Some((JoinedBy::Pod, "u-1".into()))
        );
        // A parent running the same executable ties ranks on one host only.
        let local = Launch {
            master_addr: None,
            ..launch
        };
        assert_eq!(key(None, Some(&local)), None);
        assert_eq!(key(Some(&Attribution::default()), None), None);
    }
}
