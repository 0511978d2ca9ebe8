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
pub use crate::attribution::{Launch, NetNamespace, WorkerOf};
use crate::sample::{ProcessState, TimeMs};
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
    /// What the verdict found this GPU doing for the job: setting the pace, or waiting for the
    /// GPUs that do; `None` where neither (a balanced job, or a wait too short to matter).
    pub role: Option<GpuRole>,
}

/// A GPU's part in its job's verdict. Stable names: JSON values and Prometheus labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuRole {
    /// A straggler: the others wait for it.
    Straggler,
    /// It waits for the job's stragglers much of the time (`waiting_for_peer`), or, in a job
    /// that makes no progress, inside a collective for a rank that never comes.
    Waiting,
    /// In a job that makes no progress: the GPU of a rank its peers wait for, which is asleep,
    /// stopped or gone.
    Missing,
}

impl GpuRole {
    pub const ALL: [GpuRole; 3] = [GpuRole::Straggler, GpuRole::Waiting, GpuRole::Missing];

    /// The JSON name, also a Prometheus label value.
    pub fn name(self) -> &'static str {
        match self {
            GpuRole::Straggler => "straggler",
            GpuRole::Waiting => "waiting",
            GpuRole::Missing => "missing",
        }
    }
}

/// What the comparison of a job's GPUs found. Stable names: JSON values and Prometheus labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobPattern {
    /// One GPU, or a few together, set the pace and the others wait for them.
    Straggler,
    /// Every GPU moves many bytes between GPUs while computing little.
    CommunicationBound,
    /// Work or memory spread unevenly across the GPUs, with no single GPU behind (pipeline
    /// stages of unequal size).
    Imbalanced,
    /// The GPUs keep pace with each other: each GPU's own verdict stands.
    Balanced,
    /// No progress: its GPUs sit in collectives that move nothing, waiting for a rank that is
    /// asleep with no CPU progress, or every rank waits (collectives called in different orders).
    Hung,
    /// No progress because a rank's process exited while its peers wait for it.
    RankExited,
    /// No progress because a rank's process is stopped (SIGSTOP, SIGTSTP, a debugger).
    RankStopped,
}

impl JobPattern {
    pub const ALL: [JobPattern; 7] = [
        JobPattern::Hung,
        JobPattern::RankExited,
        JobPattern::RankStopped,
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
            JobPattern::Hung => "hung",
            JobPattern::RankExited => "rank_exited",
            JobPattern::RankStopped => "rank_stopped",
        }
    }

    /// Whether the job makes no progress: `hung`, `rank_exited`, `rank_stopped`.
    pub fn stalled(self) -> bool {
        matches!(
            self,
            JobPattern::Hung | JobPattern::RankExited | JobPattern::RankStopped
        )
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
    /// The GPUs the others wait for, the one that sets the pace most first; empty unless the
    /// verdict is `straggler`.
    pub stragglers: Vec<Straggler>,
    /// What makes the grouping itself doubtful, in words: ranks that disagree (a rank twice,
    /// different world sizes, more GPUs than the world size). Each lowers the confidence.
    pub doubts: Vec<String>,
    /// Each GPU's figures, by device.
    pub peers: Vec<PeerFigures>,
    /// Where the job makes no progress: since when, who waits and who is missing. Left out
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall: Option<Stall>,
    /// What NCCL's RAS service said about the job (counts per rank, progress between two
    /// answers, the ranks behind), or why it could not tell. Left out where not asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ras: Option<crate::ras::RasEvidence>,
    /// The figures compared and the thresholds they were compared with.
    pub evidence: serde_json::Map<String, serde_json::Value>,
}

/// A job that makes no progress: its GPUs inside collectives that move nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Stall {
    /// Since when no GPU of the job made progress, ms since the Unix epoch, and for how long
    /// until the window's end.
    pub since_ms: TimeMs,
    pub stuck_s: f64,
    /// The GPUs spinning in a collective, waiting.
    pub waiting: Vec<u32>,
    /// The ranks they wait for, and why each does not come; empty where every rank waits.
    pub missing: Vec<MissingRank>,
    /// Ranks of the job that no process on this host carries, where every rank must run here
    /// (they meet at a loopback address): they exited before gpudiag looked, or never started.
    /// Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent_ranks: Vec<u32>,
    /// The job's mean draw while stuck against its own working draw before, per GPU summed.
    pub stuck_power_w: Option<f64>,
    pub working_power_w: Option<f64>,
}

/// A rank its peers wait for, and what its process does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct MissingRank {
    pub device: u32,
    pub rank: Option<u32>,
    /// Its host pid (as gpudiag sees it).
    pub pid: u32,
    /// Its process's state while its peers wait: `None` once it left the GPU (see `left_ms`).
    pub state: Option<ProcessState>,
    /// When its process left the GPU's process list (exited), ms since the Unix epoch.
    pub left_ms: Option<TimeMs>,
    /// Since when it is in the state that keeps it away (stopped, asleep), where read.
    pub since_ms: Option<TimeMs>,
    /// Its CPU use while its peers wait, % of one core.
    pub cpu_pct: Option<f64>,
    /// What to run to see where it is, where it still runs (`py-spy dump --pid N`).
    pub inspect: Option<String>,
}

impl JobVerdict {
    /// The devices of the job.
    pub fn devices(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.iter().map(|m| m.device)
    }

    /// The part `device` plays in the verdict, if any.
    pub fn role_of(&self, device: u32) -> Option<GpuRole> {
        self.members
            .iter()
            .find(|m| m.device == device)
            .and_then(|m| m.role)
    }

    /// The straggler on `device`, if it is one.
    pub fn straggler_on(&self, device: u32) -> Option<&Straggler> {
        self.stragglers.iter().find(|s| s.device == device)
    }
}

/// The key that ties a process to the other ranks of its job on any node, or `None` when the
/// process names none: the Slurm job id, else torchrun's run id, else `MASTER_ADDR:MASTER_PORT`,
/// else the pod (`namespace/name`, else its uid). Only keys every node of a job reads alike
/// count here; a parent's pid or an executable tie processes on one host only.
///
/// A master address that every node reads alike without naming one place (loopback,
/// unspecified, Docker's default bridge: torchrun's default `127.0.0.1:29500` on every node)
/// names a job only within one host and one network namespace, so its key carries them:
/// `127.0.0.1:29500@node-a`, `…@node-a/pod:ml/train-0`, `…@node-a/net:4026532101`. `host` is
/// the host the process runs on (a recording's own host on replay, never the replaying one's).
pub fn cluster_key(
    attribution: Option<&Attribution>,
    launch: Option<&Launch>,
    host: Option<&str>,
) -> Option<JobId> {
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
    let pod_name = || {
        let pod = attribution.and_then(|a| a.pod.as_ref())?;
        match (&pod.namespace, &pod.name) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            _ => pod.uid.clone(),
        }
    };
    if let Some(l) = launch
        && let Some((addr, port)) = l.master_addr.as_ref().zip(l.master_port.as_ref())
    {
        if !is_local_only(addr) {
            return id(JoinedBy::MasterAddress, format!("{addr}:{port}"));
        }
        let mut key = format!("{addr}:{port}@{}", host.unwrap_or("unknown-host"));
        match (pod_name(), l.net_namespace) {
            (Some(pod), _) => key.push_str(&format!("/pod:{pod}")),
            (None, Some(NetNamespace::Own(inode))) => key.push_str(&format!("/net:{inode}")),
            (None, _) => {}
        }
        return id(JoinedBy::MasterAddress, key);
    }
    id(JoinedBy::Pod, pod_name()?)
}

/// Whether a master address is the same string on every node without meaning the same
/// machine: loopback, unspecified, `localhost`, or an address of Docker's default bridge
/// (172.17.0.0/16, where every node's first container is 172.17.0.2).
pub fn is_local_only(addr: &str) -> bool {
    let bare = addr.trim().trim_start_matches('[').trim_end_matches(']');
    if bare.eq_ignore_ascii_case("localhost")
        || bare.to_ascii_lowercase().starts_with("localhost.")
        || bare.eq_ignore_ascii_case("ip6-localhost")
    {
        return true;
    }
    match bare.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => {
            v4.is_loopback()
                || v4.is_unspecified()
                || (v4.octets()[0] == 172 && v4.octets()[1] == 17)
        }
        Ok(std::net::IpAddr::V6(v6)) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
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
            cluster_key(a, l, Some("node-a")).map(|j| (j.joined_by, j.key))
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

    /// torchrun's defaults on two nodes, or two pods of one node, are two jobs.
    #[test]
    fn a_loopback_master_address_names_a_job_of_one_host_and_namespace() {
        let launch = |addr: &str, net| Launch {
            run_id: Some("none".into()),
            master_addr: Some(addr.into()),
            master_port: Some("29500".into()),
            net_namespace: net,
            ..Launch::default()
        };
        let key = |l: &Launch, host| cluster_key(None, Some(l), host).map(|j| j.key);
        let host = launch("127.0.0.1", Some(NetNamespace::Host));
        assert_eq!(
            key(&host, Some("node-a")).unwrap(),
            "127.0.0.1:29500@node-a"
        );
        assert_ne!(key(&host, Some("node-a")), key(&host, Some("node-b")));
        let own = launch("127.0.0.1", Some(NetNamespace::Own(4026532101)));
        assert_eq!(
            key(&own, Some("node-a")).unwrap(),
            "127.0.0.1:29500@node-a/net:4026532101"
        );
        let pod = Attribution {
            pod: Some(crate::attribution::PodIdentity {
                name: Some("train-0".into()),
                namespace: Some("ml".into()),
                ..Default::default()
            }),
            ..Attribution::default()
        };
        assert_eq!(
            cluster_key(Some(&pod), Some(&own), Some("node-a"))
                .unwrap()
                .key,
            "127.0.0.1:29500@node-a/pod:ml/train-0"
        );
        for addr in [
            "localhost",
            "::1",
            "[::1]",
            "0.0.0.0",
            "127.0.1.1",
            "172.17.0.2",
            "LOCALHOST",
        ] {
            assert!(is_local_only(addr), "{addr}");
        }
        for addr in ["10.0.0.5", "node-a", "172.18.0.2", "fe80::1", "192.168.1.1"] {
            assert!(!is_local_only(addr), "{addr}");
        }
        let real = launch("10.0.0.5", Some(NetNamespace::Own(7)));
        assert_eq!(key(&real, Some("node-a")).unwrap(), "10.0.0.5:29500");
    }
}
