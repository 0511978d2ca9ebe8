//! Who a GPU process belongs to on a shared node: its Slurm job and its Kubernetes pod, and which
//! pods the kubelet allocated a GPU to. Job ids, user, pod and namespace names are personal data
//! (a bug-report bundle redacts them).
//!
//! Each part is `None` when unknown, with the reason in `absent` under the part's name ("job",
//! "job.user", "pod", "pod.name", "pod.container"); nothing here uses an empty string or 0 for
//! "unknown".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A process's owners, as its cgroup, its environment and the kubelet tell them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Attribution {
    pub job: Option<SlurmJob>,
    pub pod: Option<PodIdentity>,
    /// Why a part is absent or only partly known, keyed by its name (`job`, `job.user`, `pod`,
    /// `pod.name`, `pod.container`); left out when nothing is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub absent: BTreeMap<String, String>,
}

impl Attribution {
    /// Records why `part` is unknown.
    pub fn absent_because(&mut self, part: &str, why: impl Into<String>) {
        self.absent.insert(part.to_owned(), why.into());
    }

    /// Why `part` is unknown, if it is.
    pub fn why_absent(&self, part: &str) -> Option<&str> {
        self.absent.get(part).map(String::as_str)
    }
}

/// Where a fact about a process was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FoundIn {
    /// `/proc/<pid>/cgroup`: the path slurmd or the container runtime made.
    Cgroup,
    /// `/proc/<pid>/environ` (`SLURM_JOB_ID`, `HOSTNAME`), readable by the process's owner and
    /// root only.
    Environ,
    /// The kubelet's pod-resources API: the only pod holding the process's GPU.
    GpuAllocation,
}

/// A Slurm job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SlurmJob {
    /// The job id as slurmd numbers it (`1234`; an array task has its own job id).
    #[schemars(length(min = 1))]
    pub id: String,
    /// The step (`0`, `batch`, `extern`, `interactive`), when the cgroup or `SLURM_STEP_ID` names
    /// one.
    pub step: Option<String>,
    /// The job's user: the cgroup's `uid_N` (cgroup v1), else `SLURM_JOB_USER`, else the user
    /// the process runs as (slurmstepd starts tasks as the job's user).
    pub user: Option<String>,
    pub found_in: FoundIn,
}

/// A Kubernetes pod and container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct PodIdentity {
    /// The pod's UID from the cgroup path (`kubepods-…-pod<uid>.slice`, `/kubepods/…/pod<uid>`).
    pub uid: Option<String>,
    /// The container runtime that made the cgroup, when the path says.
    #[schemars(extend("enum" = ["containerd", "cri-o", "docker", null]))]
    pub runtime: Option<String>,
    /// The pod's name and namespace, from the kubelet.
    pub name: Option<String>,
    pub namespace: Option<String>,
    /// The container's name, from the kubelet: the one container of the pod holding the GPU.
    pub container: Option<String>,
    /// How `name` was matched to this process.
    pub matched_by: Option<FoundIn>,
    /// Every pod the kubelet allocated the process's GPU to, when more than one (time-slicing
    /// or MPS share one GPU): then `name` is known only if the process's `HOSTNAME` picks one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sharing: Vec<PodName>,
}

/// A pod's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

/// A pod the kubelet allocated a GPU to, with the containers of it that hold the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct PodAllocation {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<String>,
}

impl PodAllocation {
    pub fn pod_name(&self) -> PodName {
        PodName {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// How a process was started: its parent, its executable and the launcher's variables. Read
/// from `/proc/<pid>/stat`, `/proc/<pid>/exe`, `/proc/<pid>/environ`, `/proc/<pid>/ns/net`
/// and `/proc/<pid>/cmdline`; each part is `None` when unreadable, with the reason in `absent`
/// under the part's name (`parent`, `exe`, `environ`, `net_namespace`, `cmdline`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Launch {
    /// The parent's pid (`/proc/<pid>/stat`, field 4).
    pub parent_pid: Option<u32>,
    /// The executable's path (redactable).
    pub exe: Option<String>,
    /// The parent's executable's path (redactable): a parent running the same executable as
    /// its children (torchrun, `torch.multiprocessing.spawn`) ties them into one job; a shell
    /// or an init does not.
    pub parent_exe: Option<String>,
    /// `TORCHELASTIC_RUN_ID`: torchrun's rendezvous id, the same on every node of a job.
    pub run_id: Option<String>,
    /// `MASTER_ADDR` and `MASTER_PORT`: where the ranks of a `torch.distributed` job meet.
    pub master_addr: Option<String>,
    pub master_port: Option<String>,
    /// The process's global rank: `RANK`, else `SLURM_PROCID`, else `OMPI_COMM_WORLD_RANK`.
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, else `SLURM_LOCALID`.
    pub local_rank: Option<u32>,
    /// `WORLD_SIZE`, else `SLURM_NTASKS`.
    pub world_size: Option<u32>,
    /// The network namespace it runs in (`/proc/<pid>/ns/net`): a loopback master address
    /// names a job only inside one namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_namespace: Option<NetNamespace>,
    /// `NCCL_RAS_ADDR`: where its NCCL's RAS service listens, when not the default
    /// `localhost:28028` (redactable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_ras_addr: Option<String>,
    /// Whose worker its command line says it is (`/proc/<pid>/cmdline`, readable by anyone;
    /// `nobody` when read and naming no launcher): what ties children of one parent into a job
    /// when no launcher variable does. Only this verdict is recorded, never the command line (it may carry paths and
    /// secrets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_of: Option<WorkerOf>,
    /// The run id, master address and world size come from its torchrun parent's command line
    /// (readable by anyone), its own environment being unreadable: no rank is known then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_cmdline: bool,
    /// Why a part is unknown, keyed by its name; left out when nothing is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub absent: BTreeMap<String, String>,
}

/// A process's network namespace, against the host's (that of pid 1 as gpudiag sees it).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum NetNamespace {
    /// The host's own: its loopback is the host's.
    Host,
    /// Another one (a pod, a container, `unshare -n`), by its inode number.
    Own(u64),
}

/// The launcher a process's command line says started it as one of its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerOf {
    /// Python's `multiprocessing` (spawn or forkserver start: `torch.multiprocessing.spawn`,
    /// `mp.spawn` in the DDP tutorial), whose children set `MASTER_ADDR` only after they start.
    Multiprocessing,
    /// torchrun or `torch.distributed.launch` (the parent's command line).
    Torchrun,
    /// A fork of its parent: the same command line.
    Fork,
    /// Its command line and its parent's were read and name no launcher: a run of its own (a
    /// sweep agent's or a notebook kernel's child, two runs started from one shell).
    Nobody,
}

impl WorkerOf {
    /// Whether it names a launcher whose workers are one job.
    pub fn is_worker(self) -> bool {
        self != WorkerOf::Nobody
    }
}
