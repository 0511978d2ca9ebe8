//! Who owns each GPU process: its Slurm job and its Kubernetes pod. The facts come from the
//! process's cgroup path (`cgroup`), its environment where readable, and the kubelet's
//! pod-resources API (`kubelet`), joined through the GPU the process uses.
//!
//! /proc is read under an injectable root, so tests run on fake trees. What cannot be told is
//! `None` with the reason in the attribution's `absent` map.

pub mod cgroup;
pub mod cmdline;
pub mod kubelet;

use std::io::Read;
use std::path::{Path, PathBuf};

use gpudiag_model::attribution::{
    Attribution, FoundIn, PodAllocation, PodIdentity, PodName, SlurmJob,
};
use gpudiag_model::job::{Launch, NetNamespace, WorkerOf};

use crate::procfs::{container_id_from_cgroup, passwd_name, status_inner_pid, status_uid};
use gpudiag_model::sample::{Absent, ProcessSample};
pub use kubelet::{DEFAULT_KUBELET_SOCKET, GpuKeys, Kubelet, KubeletOptions};

/// Where the facts are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributionOptions {
    /// `/proc` and `/etc/passwd` are read under it.
    pub root: PathBuf,
    pub kubelet: KubeletOptions,
}

/// Names the kubelet's pod-resources socket where no `--kubelet-socket` flag can (the TUI).
pub const KUBELET_SOCKET_ENV: &str = "GPUDIAG_KUBELET_SOCKET";

impl AttributionOptions {
    /// The defaults, with the socket from `GPUDIAG_KUBELET_SOCKET` when set.
    pub fn from_env() -> Self {
        let mut options = AttributionOptions::default();
        if let Some(socket) = std::env::var_os(KUBELET_SOCKET_ENV) {
            options.kubelet.socket = socket.into();
        }
        options
    }
}

impl Default for AttributionOptions {
    fn default() -> Self {
        AttributionOptions {
            root: PathBuf::from("/"),
            kubelet: KubeletOptions::default(),
        }
    }
}

/// Reads processes' owners; one per backend, shared by the readers of all its GPUs.
pub struct Attributor {
    root: PathBuf,
    kubelet: Kubelet,
    /// When the host booted (`btime`), read once: process start times count from it.
    boot_time_s: std::sync::OnceLock<Option<u64>>,
}

impl std::fmt::Debug for Attributor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attributor")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// What the pod-resources API says about one GPU: the pods holding it, or why that is unknown.
pub type GpuPods = Result<Vec<PodAllocation>, String>;

impl Attributor {
    pub fn new(options: AttributionOptions) -> Self {
        Attributor {
            root: options.root,
            kubelet: Kubelet::new(options.kubelet),
            boot_time_s: std::sync::OnceLock::new(),
        }
    }

    /// The pods the kubelet allocated `gpu` to.
    pub fn gpu_pods(&self, gpu: &GpuKeys) -> GpuPods {
        self.kubelet
            .pods()
            .map(|pods| kubelet::pods_holding(&pods, gpu))
    }

    /// When the host booted, s since the Unix epoch; `None` where `/proc/stat` is unreadable.
    fn boot_time_s(&self) -> Option<u64> {
        *self.boot_time_s.get_or_init(|| {
            std::fs::read_to_string(self.root.join("proc/stat"))
                .ok()
                .as_deref()
                .and_then(gpudiag_model::sample::proc_stat_boot_time_s)
        })
    }

    /// The directory /proc and /etc/passwd are read under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the kubelet client was started (its socket existed).
    pub fn kubelet_client_started(&self) -> bool {
        self.kubelet.client_started()
    }

    /// `/etc/passwd` under the root, for user names; empty when unreadable (names then stay
    /// numeric uids).
    pub fn passwd(&self) -> String {
        std::fs::read_to_string(self.root.join("etc/passwd")).unwrap_or_default()
    }

    /// A process's /proc facts and owners. `used_memory_bytes`, `sm_util_pct` and `kind` are
    /// the caller's (the driver's) to fill.
    pub fn process(&self, pid: u32, passwd: &str, gpu_pods: &GpuPods) -> ProcessSample {
        let dir = self.root.join("proc").join(pid.to_string());
        let read = |name: &str| std::fs::read_to_string(dir.join(name));
        let status = read("status").ok();
        let uid = status.as_deref().and_then(status_uid);
        let user = uid.map(|uid| passwd_name(passwd, uid).unwrap_or_else(|| uid.to_string()));
        let cgroup = read("cgroup").map_err(|e| format!("cannot read /proc/{pid}/cgroup: {e}"));
        let environ = read_environ(&dir.join("environ"));
        let stat = read("stat").ok();
        let launch = launch_of(&self.root, pid, stat.as_deref(), environ.as_ref());
        let attribution = attribute(
            cgroup.as_deref().map_err(String::clone),
            environ.as_ref(),
            user.as_deref(),
            passwd,
            gpu_pods,
        );
        ProcessSample {
            pid,
            name: read("comm")
                .ok()
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty()),
            user,
            kind: None,
            used_memory_bytes: None,
            sm_util_pct: None,
            container_id: cgroup.as_deref().ok().and_then(container_id_from_cgroup),
            container_pid: status.as_deref().and_then(status_inner_pid),
            cpu_time_s: stat
                .as_deref()
                .and_then(gpudiag_model::sample::stat_cpu_time_s),
            attribution: Some(attribution),
            launch: Some(launch),
            state: stat.as_deref().and_then(gpudiag_model::sample::stat_state),
            started_ms: stat
                .as_deref()
                .zip(self.boot_time_s())
                .and_then(|(stat, boot)| gpudiag_model::sample::stat_started_ms(stat, boot)),
        }
    }
}

/// The variables of a process's environment that name its owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environ {
    pub slurm_job_id: Option<String>,
    pub slurm_step_id: Option<String>,
    pub slurm_job_user: Option<String>,
    /// The container runtime sets it to the pod's hostname, its name unless the spec sets one.
    pub hostname: Option<String>,
    pub run_id: Option<String>,
    pub master_addr: Option<String>,
    pub master_port: Option<String>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// `NCCL_RAS_ADDR`: where NCCL's RAS service listens, when set.
    pub nccl_ras_addr: Option<String>,
}

/// A process's parent, executable, launcher variables, network namespace and whose worker its
/// command line says it is. The links and files are read under `root`; a process that exited
/// between the driver's list and this read leaves them unknown with the reason.
pub fn launch_of(
    root: &Path,
    pid: u32,
    stat: Option<&str>,
    environ: Result<&Environ, &String>,
) -> Launch {
    let mut launch = Launch {
        parent_pid: stat.and_then(gpudiag_model::sample::stat_parent_pid),
        ..Launch::default()
    };
    if launch.parent_pid.is_none() {
        launch
            .absent
            .insert("parent".into(), format!("/proc/{pid}/stat is not readable"));
    }
    let exe_of = |pid: u32| {
        std::fs::read_link(root.join("proc").join(pid.to_string()).join("exe"))
            .map(|p| p.to_string_lossy().into_owned())
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    format!("/proc/{pid}/exe is not readable (another user's process)")
                }
                _ => format!("/proc/{pid}/exe is not readable: {e}"),
            })
    };
    match exe_of(pid) {
        Ok(exe) => launch.exe = Some(exe),
        Err(why) => {
            launch.absent.insert("exe".into(), why);
        }
    }
    // The init of the host or of a container is nobody's job.
    let parent = launch.parent_pid.filter(|&p| p > 1);
    if let Some(parent) = parent {
        match exe_of(parent) {
            Ok(exe) => launch.parent_exe = Some(exe),
            Err(why) => {
                launch.absent.insert("parent_exe".into(), why);
            }
        }
    }
    match environ {
        Ok(env) => {
            launch.run_id = env.run_id.clone();
            launch.master_addr = env.master_addr.clone();
            launch.master_port = env.master_port.clone();
            launch.rank = env.rank;
            launch.local_rank = env.local_rank;
            launch.world_size = env.world_size;
            launch.nccl_ras_addr = env.nccl_ras_addr.clone();
        }
        Err(why) => {
            launch.absent.insert("environ".into(), why.clone());
        }
    }
    match net_namespace(root, pid) {
        Ok(ns) => launch.net_namespace = Some(ns),
        Err(why) => {
            launch.absent.insert("net_namespace".into(), why);
        }
    }
    match read_cmdline(root, pid) {
        Ok(own) => {
            let parents = match launch.parent_pid {
                None => Err("its parent is unknown".to_owned()),
                Some(init) if init <= 1 => Ok(None),
                Some(parent) => read_cmdline(root, parent)
                    .map(Some)
                    .map_err(|why| format!("its parent's: {why}")),
            };
            match parents {
                Ok(parents) => {
                    launch.worker_of = Some(cmdline::worker_of(&own, parents.as_deref()));
                    // The environment says more, and per rank; where it could not be read, the
                    // torchrun parent's command line (readable by anyone) still names the job.
                    if launch.absent.contains_key("environ")
                        && let Some(job) = parents.as_deref().and_then(cmdline::torchrun_job)
                    {
                        launch.run_id = job.run_id;
                        launch.master_addr = job.master_addr;
                        launch.master_port = job.master_port;
                        launch.world_size = job.world_size;
                        launch.from_cmdline = true;
                    }
                }
                // Only a `multiprocessing` child names its launcher itself; anything else
                // could be a worker of the parent that could not be read.
                Err(why) => match cmdline::worker_of(&own, None) {
                    WorkerOf::Multiprocessing => launch.worker_of = Some(WorkerOf::Multiprocessing),
                    _ => {
                        launch.absent.insert("cmdline".into(), why);
                    }
                },
            }
        }
        Err(why) => {
            launch.absent.insert("cmdline".into(), why);
        }
    }
    launch
}

/// The inode of a `/proc/<pid>/ns/net` link's target, `net:[4026531840]`.
pub fn net_namespace_inode(link: &str) -> Option<u64> {
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// A process's network namespace against the host's: pid 1's, else (pid 1 is root's, so a
/// user who is not root cannot read its link) gpudiag's own. Either reference names at most one
/// namespace `Host`, so processes of different namespaces never share a key whichever is used.
fn net_namespace(root: &Path, pid: u32) -> Result<NetNamespace, String> {
    let inode_of = |who: &str| -> Result<u64, String> {
        let link = root.join("proc").join(who).join("ns/net");
        let target = std::fs::read_link(&link).map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => format!(
                "/proc/{who}/ns/net is not readable (another user's process: reading it needs \
                 the right to trace it)"
            ),
            _ => format!("/proc/{who}/ns/net is not readable: {e}"),
        })?;
        let target = target.to_string_lossy();
        net_namespace_inode(&target)
            .ok_or_else(|| format!("/proc/{who}/ns/net names no network namespace ({target:?})"))
    };
    let own = inode_of(&pid.to_string())?;
    let host = inode_of("1").or_else(|why| inode_of("self").map_err(|_| why))?;
    Ok(if own == host {
        NetNamespace::Host
    } else {
        NetNamespace::Own(own)
    })
}

/// `/proc/<pid>/cmdline`'s arguments, read at most `CMDLINE_LIMIT` bytes; `Err` says why not.
/// A zombie's and a kernel thread's are empty.
fn read_cmdline(root: &Path, pid: u32) -> Result<Vec<String>, String> {
    let path = root.join("proc").join(pid.to_string()).join("cmdline");
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(cmdline::CMDLINE_LIMIT).read_to_end(&mut bytes))
        .map_err(|e| format!("/proc/{pid}/cmdline is not readable: {e}"))?;
    let args = cmdline::parse_cmdline(&bytes);
    if args.is_empty() {
        return Err(format!(
            "/proc/{pid}/cmdline is empty (a process that is exiting)"
        ));
    }
    Ok(args)
}

/// An environment larger than this is read only this far (Linux allows a few MiB).
const ENVIRON_LIMIT: u64 = 1 << 20;

/// `/proc/<pid>/environ`, readable by the process's owner and root; `Err` says why not.
fn read_environ(path: &Path) -> Result<Environ, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(ENVIRON_LIMIT).read_to_end(&mut bytes))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => {
                "its environment is not readable (another user's process)".to_owned()
            }
            _ => format!("its environment is not readable: {e}"),
        })?;
    Ok(parse_environ(&bytes))
}

/// The NUL-separated `KEY=value` pairs of an environ file.
pub fn parse_environ(bytes: &[u8]) -> Environ {
    let mut env = Environ::default();
    #[derive(Default)]
    struct Fallbacks {
        slurm_procid: Option<u32>,
        ompi_rank: Option<u32>,
        slurm_localid: Option<u32>,
        slurm_ntasks: Option<u32>,
    }
    let mut launcher = Fallbacks::default();
    for entry in bytes.split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((key, value)) = entry.split_once('=') else {
            continue;
        };
        let number = value.trim().parse::<u32>().ok();
        let value = (!value.is_empty()).then(|| value.to_owned());
        match key {
            "SLURM_JOB_ID" => env.slurm_job_id = value,
            "SLURM_STEP_ID" => env.slurm_step_id = value,
            "SLURM_JOB_USER" => env.slurm_job_user = value,
            "HOSTNAME" => env.hostname = value,
            "TORCHELASTIC_RUN_ID" => env.run_id = value,
            "MASTER_ADDR" => env.master_addr = value,
            "MASTER_PORT" => env.master_port = value,
            "NCCL_RAS_ADDR" => env.nccl_ras_addr = value,
            "RANK" => env.rank = number,
            "SLURM_PROCID" => launcher.slurm_procid = number,
            "OMPI_COMM_WORLD_RANK" => launcher.ompi_rank = number,
            "LOCAL_RANK" => env.local_rank = number,
            "SLURM_LOCALID" => launcher.slurm_localid = number,
            "WORLD_SIZE" => env.world_size = number,
            "SLURM_NTASKS" => launcher.slurm_ntasks = number,
            _ => {}
        }
    }
    // torchrun's variables first: under `srun torchrun` Slurm's name the launcher's task.
    env.rank = env.rank.or(launcher.slurm_procid).or(launcher.ompi_rank);
    env.local_rank = env.local_rank.or(launcher.slurm_localid);
    env.world_size = env.world_size.or(launcher.slurm_ntasks);
    env
}

/// A process's job and pod from its cgroup file, its environment, its user and the pods
/// holding its GPU. Pure, so every combination is tested without a /proc.
pub fn attribute(
    cgroup_file: Result<&str, String>,
    environ: Result<&Environ, &String>,
    process_user: Option<&str>,
    passwd: &str,
    gpu_pods: &GpuPods,
) -> Attribution {
    let mut a = Attribution::default();
    let slurm = cgroup_file
        .as_ref()
        .ok()
        .and_then(|c| cgroup::slurm_from_cgroup(c));
    let env = environ.as_ref().ok();
    let env_user = env.and_then(|e| e.slurm_job_user.clone());
    a.job = match (slurm, env.and_then(|e| e.slurm_job_id.clone())) {
        (Some(s), _) => Some(SlurmJob {
            id: s.job_id,
            step: s.step,
            user: s
                .uid
                .map(|uid| passwd_name(passwd, uid).unwrap_or_else(|| uid.to_string()))
                .or(env_user)
                .or_else(|| process_user.map(str::to_owned)),
            found_in: FoundIn::Cgroup,
        }),
        (None, Some(id)) => Some(SlurmJob {
            id,
            step: env.and_then(|e| e.slurm_step_id.clone()),
            user: env_user.or_else(|| process_user.map(str::to_owned)),
            found_in: FoundIn::Environ,
        }),
        (None, None) => {
            let why = match (&cgroup_file, &environ) {
                (Err(e), _) => e.clone(),
                (Ok(_), Ok(_)) => "not in a Slurm job (cgroup and environment)".to_owned(),
                (Ok(_), Err(e)) => format!("not in a Slurm job cgroup, and {e}"),
            };
            a.absent_because("job", why);
            None
        }
    };
    if a.job.as_ref().is_some_and(|j| j.user.is_none()) {
        a.absent_because(
            "job.user",
            "no uid in the cgroup, SLURM_JOB_USER or /proc status",
        );
    }
    a.pod = pod_of(&cgroup_file, &environ, gpu_pods, &mut a);
    a
}

fn pod_of(
    cgroup_file: &Result<&str, String>,
    environ: &Result<&Environ, &String>,
    gpu_pods: &GpuPods,
    a: &mut Attribution,
) -> Option<PodIdentity> {
    let mut pod = match cgroup_file {
        Ok(text) => match cgroup::pod_from_cgroup(text) {
            Some(p) => PodIdentity {
                uid: Some(p.uid),
                runtime: p.runtime.map(str::to_owned),
                ..PodIdentity::default()
            },
            None => {
                a.absent_because("pod", "not in a Kubernetes pod cgroup");
                return None;
            }
        },
        // Another PID namespace hides the process: only the GPU's allocation can tell, and only
        // when one pod holds it.
        Err(why) => match gpu_pods {
            Ok(pods) if pods.len() == 1 => PodIdentity::default(),
            _ => {
                a.absent_because("pod", why.clone());
                return None;
            }
        },
    };
    let pods = match gpu_pods {
        Ok(pods) => pods,
        Err(why) => {
            a.absent_because("pod.name", why.clone());
            return Some(pod);
        }
    };
    let chosen = match pods.as_slice() {
        [] => {
            a.absent_because("pod.name", "the kubelet lists no pod holding this GPU");
            None
        }
        [only] => Some((only, FoundIn::GpuAllocation)),
        several => {
            pod.sharing = several.iter().map(PodAllocation::pod_name).collect();
            let hostname = environ.as_ref().ok().and_then(|e| e.hostname.as_deref());
            let named: Vec<&PodAllocation> = several
                .iter()
                .filter(|p| hostname == Some(p.name.as_str()))
                .collect();
            match (named.as_slice(), environ) {
                ([one], _) => Some((*one, FoundIn::Environ)),
                (_, Err(e)) => {
                    a.absent_because(
                        "pod.name",
                        format!(
                            "the GPU is shared by {} pods (time-slicing or MPS), and {e}",
                            several.len()
                        ),
                    );
                    None
                }
                (_, Ok(_)) => {
                    a.absent_because(
                        "pod.name",
                        format!(
                            "the GPU is shared by {} pods (time-slicing or MPS) and the \
                             process's HOSTNAME names none of them",
                            several.len()
                        ),
                    );
                    None
                }
            }
        }
    };
    if let Some((p, how)) = chosen {
        pod.name = Some(p.name.clone());
        pod.namespace = Some(p.namespace.clone());
        pod.matched_by = Some(how);
        match p.containers.as_slice() {
            [one] => pod.container = Some(one.clone()),
            several => a.absent_because(
                "pod.container",
                format!("{} containers of the pod hold the GPU", several.len()),
            ),
        }
    }
    Some(pod)
}

/// Where `Sample::gpu_pods` stands: the list, or the reason it is absent.
pub fn gpu_pods_field(pods: &GpuPods) -> Result<Vec<PodAllocation>, Absent> {
    pods.clone().map_err(Absent::Error)
}

/// A pod's namespace and name, as the Prometheus labels and views show them.
pub fn pod_label(p: &PodName) -> String {
    format!("{}/{}", p.namespace, p.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1d2c3b4a-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n";

    fn alloc(ns: &str, name: &str, containers: &[&str]) -> PodAllocation {
        PodAllocation {
            namespace: ns.into(),
            name: name.into(),
            containers: containers.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    fn k8s_cgroup() -> String {
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        )
    }

    #[test]
    fn environ_is_nul_separated() {
        let env = parse_environ(
            b"PATH=/usr/bin\0SLURM_JOB_ID=42\0SLURM_STEP_ID=0\0SLURM_JOB_USER=alice\0\
              HOSTNAME=train-0\0EMPTY=\0broken\0\xff\xfe=1\0",
        );
        assert_eq!(
            env,
            Environ {
                slurm_job_id: Some("42".into()),
                slurm_step_id: Some("0".into()),
                slurm_job_user: Some("alice".into()),
                hostname: Some("train-0".into()),
                ..Environ::default()
            }
        );
        assert_eq!(parse_environ(b""), Environ::default());
    }

    #[test]
    fn launcher_variables_name_the_rank_torchrun_first() {
        let env = parse_environ(
            b"TORCHELASTIC_RUN_ID=7f3c\0MASTER_ADDR=node-0\0MASTER_PORT=29500\0RANK=5\0\
              LOCAL_RANK=1\0WORLD_SIZE=8\0SLURM_PROCID=0\0SLURM_LOCALID=0\0SLURM_NTASKS=2\0",
        );
        assert_eq!(env.run_id.as_deref(), Some("7f3c"));
        assert_eq!(env.master_addr.as_deref(), Some("node-0"));
        assert_eq!(env.master_port.as_deref(), Some("29500"));
        assert_eq!(
            (env.rank, env.local_rank, env.world_size),
            (Some(5), Some(1), Some(8))
        );
        let srun = parse_environ(b"SLURM_PROCID=3\0SLURM_LOCALID=1\0SLURM_NTASKS=4\0RANK=x\0");
        assert_eq!(
            (srun.rank, srun.local_rank, srun.world_size),
            (Some(3), Some(1), Some(4))
        );
    }

    #[test]
    fn launch_reads_the_parent_and_both_executables_under_the_root() {
        let root = tempfile::tempdir().unwrap();
        let proc_dir = |pid: &str| root.path().join("proc").join(pid);
        std::fs::create_dir_all(proc_dir("10")).unwrap();
        std::fs::create_dir_all(proc_dir("20")).unwrap();
        std::fs::create_dir_all(proc_dir("1").join("ns")).unwrap();
        std::fs::create_dir_all(proc_dir("20").join("ns")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3.12", proc_dir("10").join("exe")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3.12", proc_dir("20").join("exe")).unwrap();
        std::os::unix::fs::symlink("net:[4026531840]", proc_dir("1").join("ns/net")).unwrap();
        std::os::unix::fs::symlink("net:[4026531840]", proc_dir("20").join("ns/net")).unwrap();
        std::fs::write(proc_dir("10").join("cmdline"), "python3\0train.py\0").unwrap();
        std::fs::write(proc_dir("20").join("cmdline"), "python3\0train.py\0").unwrap();
        let stat = "20 (pt_main thread) S 10 20 10 0 -1 4194560 0 0 0 0 12 3 0 0";
        let env = Environ::default();
        let l = launch_of(root.path(), 20, Some(stat), Ok(&env));
        assert_eq!(l.parent_pid, Some(10));
        assert_eq!(l.exe.as_deref(), Some("/usr/bin/python3.12"));
        assert_eq!(l.parent_exe.as_deref(), Some("/usr/bin/python3.12"));
        assert_eq!(l.net_namespace, Some(NetNamespace::Host));
        assert_eq!(l.worker_of, Some(WorkerOf::Fork));
        assert!(l.absent.is_empty(), "{:?}", l.absent);
        // Its parent gone, another user's environ: each part says why it is unknown.
        let orphan = "21 (python) S 1 21 1 0";
        let l = launch_of(
            root.path(),
            21,
            Some(orphan),
            Err(&"not readable".to_owned()),
        );
        assert_eq!(l.parent_pid, Some(1));
        assert_eq!(l.parent_exe, None);
        assert!(l.absent.contains_key("exe"));
        assert_eq!(
            l.absent.get("environ").map(String::as_str),
            Some("not readable")
        );
        assert_eq!((l.net_namespace, l.worker_of), (None, None));
        assert!(
            l.absent["net_namespace"].starts_with("/proc/21/ns/net is not readable"),
            "{:?}",
            l.absent
        );
        assert!(
            l.absent["cmdline"].starts_with("/proc/21/cmdline is not readable"),
            "{:?}",
            l.absent
        );
    }

    #[test]
    fn a_namespace_link_names_its_inode() {
        assert_eq!(net_namespace_inode("net:[4026531840]"), Some(4026531840));
        for bad in [
            "net:[]",
            "mnt:[4026531840]",
            "net:[x]",
            "net:4026531840",
            "",
        ] {
            assert_eq!(net_namespace_inode(bad), None, "{bad}");
        }
    }

    #[test]
    fn slurm_job_from_the_cgroup_names_its_user_through_passwd() {
        let a = attribute(
            Ok("0::/slurm/uid_1000/job_1234/step_0/task_0\n"),
            Err(&"its environment is not readable".to_owned()),
            Some("bob"),
            PASSWD,
            &Err("no kubelet".into()),
        );
        let job = a.job.clone().unwrap();
        assert_eq!(
            (job.id.as_str(), job.step.as_deref(), job.user.as_deref()),
            ("1234", Some("0"), Some("alice"))
        );
        assert_eq!(job.found_in, FoundIn::Cgroup);
        assert_eq!(a.pod, None);
        assert_eq!(a.why_absent("pod"), Some("not in a Kubernetes pod cgroup"));
    }

    #[test]
    fn slurm_v2_takes_the_user_from_the_environment_else_the_process() {
        let cg = "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n";
        let env = Environ {
            slurm_job_user: Some("carol".into()),
            ..Environ::default()
        };
        let a = attribute(Ok(cg), Ok(&env), Some("bob"), PASSWD, &Ok(vec![]));
        assert_eq!(a.job.unwrap().user.as_deref(), Some("carol"));
        let a = attribute(
            Ok(cg),
            Ok(&Environ::default()),
            Some("bob"),
            PASSWD,
            &Ok(vec![]),
        );
        assert_eq!(a.job.unwrap().user.as_deref(), Some("bob"));
        let a = attribute(Ok(cg), Ok(&Environ::default()), None, PASSWD, &Ok(vec![]));
        assert_eq!(a.job.as_ref().unwrap().user, None);
        assert!(a.why_absent("job.user").is_some());
    }

    #[test]
    fn slurm_job_from_the_environment_when_the_cgroup_does_not_say() {
        let env = Environ {
            slurm_job_id: Some("99".into()),
            slurm_step_id: Some("3".into()),
            ..Environ::default()
        };
        let a = attribute(
            Ok("0::/user.slice\n"),
            Ok(&env),
            Some("bob"),
            PASSWD,
            &Ok(vec![]),
        );
        let job = a.job.unwrap();
        assert_eq!(
            (job.id.as_str(), job.step.as_deref(), job.found_in),
            ("99", Some("3"), FoundIn::Environ)
        );
        assert_eq!(job.user.as_deref(), Some("bob"));
    }

    #[test]
    fn no_job_says_why() {
        let a = attribute(
            Ok("0::/user.slice\n"),
            Ok(&Environ::default()),
            None,
            PASSWD,
            &Ok(vec![]),
        );
        assert_eq!(a.job, None);
        assert_eq!(
            a.why_absent("job"),
            Some("not in a Slurm job (cgroup and environment)")
        );
        let a = attribute(
            Err("cannot read /proc/9/cgroup: gone".into()),
            Err(&"its environment is not readable".to_owned()),
            None,
            PASSWD,
            &Err("no kubelet".into()),
        );
        assert_eq!(
            a.why_absent("job"),
            Some("cannot read /proc/9/cgroup: gone")
        );
        assert_eq!(
            a.why_absent("pod"),
            Some("cannot read /proc/9/cgroup: gone")
        );
    }

    #[test]
    fn one_pod_on_the_gpu_names_the_process_pod() {
        let a = attribute(
            Ok(&k8s_cgroup()),
            Ok(&Environ::default()),
            None,
            PASSWD,
            &Ok(vec![alloc("ml", "train-0", &["trainer"])]),
        );
        let pod = a.pod.unwrap();
        assert_eq!(pod.uid.as_deref(), Some(UID));
        assert_eq!(pod.runtime.as_deref(), Some("containerd"));
        assert_eq!(
            (
                pod.namespace.as_deref(),
                pod.name.as_deref(),
                pod.container.as_deref()
            ),
            (Some("ml"), Some("train-0"), Some("trainer"))
        );
        assert_eq!(pod.matched_by, Some(FoundIn::GpuAllocation));
        assert!(pod.sharing.is_empty());
        assert!(!a.absent.contains_key("pod.name"));
    }

    #[test]
    fn a_shared_gpu_is_said_so_and_only_hostname_picks_a_pod() {
        let pods = Ok(vec![
            alloc("ml", "a", &["c"]),
            alloc("ml", "b", &["c1", "c2"]),
        ]);
        let a = attribute(
            Ok(&k8s_cgroup()),
            Ok(&Environ::default()),
            None,
            PASSWD,
            &pods,
        );
        let pod = a.pod.as_ref().unwrap();
        assert_eq!(pod.name, None);
        assert_eq!(pod.sharing.len(), 2);
        assert!(
            a.why_absent("pod.name")
                .unwrap()
                .contains("shared by 2 pods"),
            "{a:?}"
        );
        let unreadable = "its environment is not readable".to_owned();
        let a = attribute(Ok(&k8s_cgroup()), Err(&unreadable), None, PASSWD, &pods);
        assert!(
            a.why_absent("pod.name")
                .unwrap()
                .ends_with("its environment is not readable")
        );

        let env = Environ {
            hostname: Some("b".into()),
            ..Environ::default()
        };
        let a = attribute(Ok(&k8s_cgroup()), Ok(&env), None, PASSWD, &pods);
        let pod = a.pod.unwrap();
        assert_eq!(pod.name.as_deref(), Some("b"));
        assert_eq!(pod.matched_by, Some(FoundIn::Environ));
        // Two containers of that pod hold the GPU: which one is not known.
        assert_eq!(pod.container, None);
        assert_eq!(
            a.absent.get("pod.container").map(String::as_str),
            Some("2 containers of the pod hold the GPU")
        );
    }

    #[test]
    fn kubelet_failure_keeps_the_cgroup_facts() {
        let a = attribute(
            Ok(&k8s_cgroup()),
            Ok(&Environ::default()),
            None,
            PASSWD,
            &Err("kubelet pod-resources did not answer within 1000 ms".into()),
        );
        let pod = a.pod.clone().unwrap();
        assert_eq!(pod.uid.as_deref(), Some(UID));
        assert_eq!(pod.name, None);
        assert_eq!(
            a.why_absent("pod.name"),
            Some("kubelet pod-resources did not answer within 1000 ms")
        );
    }

    #[test]
    fn a_hidden_process_on_a_gpu_one_pod_holds_is_that_pods() {
        let a = attribute(
            Err("cannot read /proc/9/cgroup: No such file".into()),
            Err(&"its environment is not readable".to_owned()),
            None,
            PASSWD,
            &Ok(vec![alloc("ml", "train-0", &["trainer"])]),
        );
        let pod = a.pod.unwrap();
        assert_eq!(pod.uid, None);
        assert_eq!(pod.name.as_deref(), Some("train-0"));
        assert_eq!(pod.matched_by, Some(FoundIn::GpuAllocation));
    }
}
