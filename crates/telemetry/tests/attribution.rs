#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Who owns each GPU process, read from fake /proc trees (`tests/fixtures/attribution`: Slurm
//! on cgroup v1 and v2 and by environment, Kubernetes with containerd, CRI-O and Docker under
//! the systemd and cgroupfs drivers, a host process) and from a real gRPC server on a Unix
//! socket speaking the kubelet's pod-resources API: one pod per GPU, a time-sliced GPU shared
//! by two pods, no kubelet, and a kubelet that never answers. (`check --json` carrying the
//! attribution is tested end to end in the workspace's `tests/attribution.rs`.)

use std::path::{Path, PathBuf};
use std::time::Duration;
#[cfg(feature = "kubernetes")]
use std::time::Instant;

use gpudiag_model::attribution::{Attribution, FoundIn};
use gpudiag_model::sample::ProcessSample;
use gpudiag_telemetry::attribution::{
    AttributionOptions, Attributor, GpuKeys, GpuPods, KubeletOptions,
};

// The fake kubelet the end-to-end tests use too; its gRPC messages are the client's, so these
// tests need the `kubernetes` feature (`cargo nextest run -p gpudiag-telemetry --features
// kubernetes`, as `--workspace` builds it for the binary's default).
#[cfg(feature = "kubernetes")]
#[path = "../../../tests/support/kubelet.rs"]
mod kubelet;
#[cfg(feature = "kubernetes")]
use kubelet::{Behaviour, FakeKubelet, pod};

const UID_A: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
const UID_B: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const UID_C: &str = "3b241101-e2bb-4255-8caf-4136c566a962";
const CONTAINER: &str = "9f2c1a7e5b3d4c6f8a0b2d4e6f8a0c2e4f6a8b0d2f4a6c8e0b2d4f6a8c0e2b4d";

/// The fake /proc trees, among the workspace's fixtures.
fn fixture() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/attribution"
    ))
    .to_path_buf()
}

fn attributor(socket: &Path, deadline: Duration) -> Attributor {
    Attributor::new(AttributionOptions {
        root: fixture(),
        kubelet: KubeletOptions {
            socket: socket.to_path_buf(),
            cache_for: Duration::from_secs(10),
            deadline,
        },
    })
}

fn gpu(index: u32, uuid: &str) -> GpuKeys {
    GpuKeys {
        index,
        uuid: Some(uuid.into()),
        pci_bus_id: Some(format!("00000000:{:02x}:00.0", 0x19 + index)),
    }
}

fn read(a: &Attributor, pid: u32, pods: &GpuPods) -> (ProcessSample, Attribution) {
    let p = a.process(pid, &a.passwd(), pods);
    let attribution = p
        .attribution
        .clone()
        .expect("every live process is attributed");
    (p, attribution)
}

#[test]
fn slurm_jobs_from_cgroup_v1_v2_and_the_environment() {
    let a = attributor(
        Path::new("/nonexistent/kubelet.sock"),
        Duration::from_secs(1),
    );
    let pods = a.gpu_pods(&gpu(0, "GPU-aaaa"));

    let (p, v1) = read(&a, 1001, &pods);
    let job = v1.job.clone().unwrap();
    assert_eq!(
        (job.id.as_str(), job.step.as_deref(), job.user.as_deref()),
        ("1234", Some("0"), Some("alice"))
    );
    assert_eq!(job.found_in, FoundIn::Cgroup);
    assert_eq!(p.name.as_deref(), Some("python3"));
    assert_eq!(p.user.as_deref(), Some("alice"));
    assert_eq!(v1.why_absent("pod"), Some("not in a Kubernetes pod cgroup"));

    let (_, v2) = read(&a, 1002, &pods);
    let job = v2.job.unwrap();
    assert_eq!(
        (job.id.as_str(), job.step.as_deref(), job.user.as_deref()),
        ("5678", Some("batch"), Some("carol"))
    );

    let (_, env) = read(&a, 1003, &pods);
    let job = env.job.unwrap();
    assert_eq!(
        (job.id.as_str(), job.step.as_deref(), job.user.as_deref()),
        ("4242", Some("0"), Some("bob"))
    );
    assert_eq!(job.found_in, FoundIn::Environ);

    let (_, host) = read(&a, 3001, &pods);
    assert_eq!((&host.job, &host.pod), (&None, &None));
    assert_eq!(
        host.why_absent("job"),
        Some("not in a Slurm job (cgroup and environment)")
    );
    assert_eq!(
        host.why_absent("pod"),
        Some("not in a Kubernetes pod cgroup")
    );

    // A process that is gone (or in another PID namespace) says so.
    let (_, gone) = read(&a, 9999, &pods);
    assert!(
        gone.why_absent("job")
            .unwrap()
            .contains("/proc/9999/cgroup")
    );
}

#[test]
fn pods_from_the_cgroup_alone_when_there_is_no_kubelet() {
    let socket = Path::new("/nonexistent/kubelet.sock");
    let a = attributor(socket, Duration::from_secs(1));
    let pods = a.gpu_pods(&gpu(0, "GPU-aaaa"));
    let why = pods.clone().unwrap_err();
    assert!(why.contains("no kubelet pod-resources socket"), "{why}");
    assert!(!a.kubelet_client_started(), "no socket, no client");

    for (pid, uid, runtime) in [
        (2001, UID_A, Some("containerd")),
        (2002, UID_B, Some("cri-o")),
        (2003, UID_C, None),
    ] {
        let (p, attribution) = read(&a, pid, &pods);
        let pod = attribution.pod.clone().unwrap();
        assert_eq!(pod.uid.as_deref(), Some(uid), "{pid}");
        assert_eq!(pod.runtime.as_deref(), runtime, "{pid}");
        assert_eq!(pod.name, None);
        assert_eq!(attribution.why_absent("pod.name"), Some(why.as_str()));
        assert_eq!(p.container_id.as_deref(), Some(CONTAINER), "{pid}");
        assert_eq!(attribution.job, None);
    }
}

#[cfg(feature = "kubernetes")]
#[test]
fn one_pod_per_gpu_names_pod_namespace_and_container() {
    let kubelet = FakeKubelet::start(Behaviour::Answer(vec![
        pod("ml", "train-0", &[("trainer", &["GPU-aaaa"])]),
        pod("ml", "idle", &[("worker", &["GPU-cccc"])]),
    ]));
    let a = attributor(kubelet.socket(), Duration::from_secs(5));
    let pods = a.gpu_pods(&gpu(0, "GPU-aaaa"));
    assert!(a.kubelet_client_started());
    let listed = pods.clone().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].namespace.as_str(), listed[0].name.as_str()),
        ("ml", "train-0")
    );
    let (_, attribution) = read(&a, 2001, &pods);
    let pod = attribution.pod.unwrap();
    assert_eq!(
        (
            pod.namespace.as_deref(),
            pod.name.as_deref(),
            pod.container.as_deref()
        ),
        (Some("ml"), Some("train-0"), Some("trainer"))
    );
    assert_eq!(pod.uid.as_deref(), Some(UID_A));
    assert_eq!(pod.matched_by, Some(FoundIn::GpuAllocation));
    // A GPU no pod holds.
    assert_eq!(a.gpu_pods(&gpu(1, "GPU-bbbb")), Ok(vec![]));
}

#[cfg(feature = "kubernetes")]
#[test]
fn a_time_sliced_gpu_shared_by_two_pods_is_said_so() {
    // The device plugin's time-slicing replicas: one GPU, ids UUID::N.
    let kubelet = FakeKubelet::start(Behaviour::Answer(vec![
        pod("research", "notebook-a", &[("lab", &["GPU-bbbb::0"])]),
        pod("research", "notebook-b", &[("lab", &["GPU-bbbb::1"])]),
    ]));
    let a = attributor(kubelet.socket(), Duration::from_secs(5));
    let pods = a.gpu_pods(&gpu(1, "GPU-bbbb"));
    assert_eq!(pods.as_ref().map(Vec::len), Ok(2));

    // HOSTNAME in the process's environment picks its pod.
    let (_, picked) = read(&a, 2002, &pods);
    let pod = picked.pod.unwrap();
    assert_eq!(pod.name.as_deref(), Some("notebook-b"));
    assert_eq!(pod.matched_by, Some(FoundIn::Environ));
    assert_eq!(pod.sharing.len(), 2);

    // Without an environment to read, no pod is guessed.
    let (_, unknown) = read(&a, 2003, &pods);
    let pod = unknown.pod.clone().unwrap();
    assert_eq!(pod.name, None);
    assert_eq!(pod.uid.as_deref(), Some(UID_C));
    let names: Vec<&str> = pod.sharing.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["notebook-a", "notebook-b"]);
    let why = unknown.why_absent("pod.name").unwrap();
    assert!(why.contains("shared by 2 pods"), "{why}");
}

#[cfg(feature = "kubernetes")]
#[test]
fn a_hanging_kubelet_costs_one_deadline_per_cache_period() {
    let kubelet = FakeKubelet::start(Behaviour::Hang);
    let a = attributor(kubelet.socket(), Duration::from_millis(300));
    let started = Instant::now();
    let pods = a.gpu_pods(&gpu(0, "GPU-aaaa"));
    let first = started.elapsed();
    let why = pods.clone().unwrap_err();
    assert_eq!(why, "kubelet pod-resources did not answer within 300 ms");
    assert!(first >= Duration::from_millis(300), "{first:?}");
    assert!(first < Duration::from_secs(3), "{first:?}");
    // The failure is cached: the next reads do not wait again.
    let again = Instant::now();
    assert_eq!(a.gpu_pods(&gpu(1, "GPU-bbbb")), Err(why.clone()));
    assert!(again.elapsed() < Duration::from_millis(100));
    // The cgroup's facts stay.
    let (_, attribution) = read(&a, 2001, &pods);
    assert_eq!(attribution.pod.clone().unwrap().uid.as_deref(), Some(UID_A));
    assert_eq!(attribution.why_absent("pod.name"), Some(why.as_str()));
}

#[cfg(feature = "kubernetes")]
#[test]
fn a_socket_that_never_speaks_grpc_is_cut_off_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    // Accepts connections and never writes a byte.
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let a = attributor(&socket, Duration::from_millis(300));
    let started = Instant::now();
    let why = a.gpu_pods(&gpu(0, "GPU-aaaa")).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(why.contains("300 ms"), "{why}");
    drop(listener);
}

#[cfg(not(feature = "kubernetes"))]
#[test]
fn a_build_without_kubernetes_says_so_where_a_kubelet_socket_exists() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let a = attributor(&socket, Duration::from_millis(300));
    let why = a.gpu_pods(&gpu(0, "GPU-aaaa")).unwrap_err();
    assert!(why.contains("built without Kubernetes support"), "{why}");
    assert!(!a.kubelet_client_started());
    drop(listener);
}

/// A fake /proc written for one test: each process's `stat`, `cmdline` and `ns/net` link as the
/// kernel shows them.
struct ProcTree(tempfile::TempDir);

impl ProcTree {
    fn new() -> ProcTree {
        let tree = ProcTree(tempfile::tempdir().unwrap());
        tree.namespace(1, 4026531840);
        tree
    }

    fn dir(&self, pid: u32) -> PathBuf {
        let dir = self.0.path().join("proc").join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        dir
    }

    /// A process of `parent` running `args`.
    fn process(&self, pid: u32, parent: u32, args: &[&str]) -> &ProcTree {
        let dir = self.dir(pid);
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (python3) S {parent} {pid} {parent} 0 -1 4194560 0 0 0 0 12 3 0 0"),
        )
        .unwrap();
        let mut cmdline = args.join("\0");
        cmdline.push('\0');
        std::fs::write(dir.join("cmdline"), cmdline).unwrap();
        self
    }

    fn namespace(&self, pid: u32, inode: u64) -> &ProcTree {
        std::os::unix::fs::symlink(format!("net:[{inode}]"), self.dir(pid).join("ns/net")).unwrap();
        self
    }

    fn launch(&self, pid: u32) -> gpudiag_model::job::Launch {
        let a = Attributor::new(AttributionOptions {
            root: self.0.path().to_path_buf(),
            kubelet: KubeletOptions {
                socket: PathBuf::from("/nonexistent/kubelet.sock"),
                cache_for: Duration::from_secs(10),
                deadline: Duration::from_secs(1),
            },
        });
        a.process(pid, "", &Err("no kubelet".into()))
            .launch
            .expect("every live process has its launch read")
    }
}

/// Whose worker each process is, from its command line and its parent's, and its network
/// namespace against pid 1's: torchrun's workers on the host, the DDP tutorial's `mp.spawn`
/// children in a pod's namespace, a sweep agent's independent trials, and a process whose
/// parent and namespace link cannot be read. The command lines themselves are never kept.
#[test]
fn worker_and_network_namespace_from_a_proc_tree() {
    use gpudiag_model::job::{NetNamespace, WorkerOf};
    let tree = ProcTree::new();
    let torchrun = [
        "/usr/bin/python3",
        "/usr/local/bin/torchrun",
        "--nproc-per-node",
        "4",
        "--rdzv-id",
        "job-7",
        "train.py",
    ];
    tree.process(100, 1, &torchrun).namespace(100, 4026531840);
    tree.process(101, 100, &["/usr/bin/python3", "-u", "train.py"])
        .namespace(101, 4026531840);
    tree.process(200, 1, &["python", "ddp_tutorial.py"])
        .namespace(200, 4026532101);
    tree.process(
        201,
        200,
        &[
            "python",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
            "--multiprocessing-fork",
        ],
    )
    .namespace(201, 4026532101);
    tree.process(300, 1, &["python", "sweep.py"]);
    tree.process(301, 300, &["python", "train.py", "--lr", "0.1"])
        .namespace(301, 4026531840);
    // Its parent gone, its namespace link hidden; and a spawn child whose parent is gone.
    tree.process(401, 400, &["python", "train.py"]);
    tree.process(
        402,
        400,
        &[
            "python",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
            "--multiprocessing-fork",
        ],
    );

    let worker = tree.launch(101);
    assert_eq!(worker.worker_of, Some(WorkerOf::Torchrun));
    // Its environment unread (another user's, under a service that may not trace it), the
    // torchrun parent's command line still names its job: the run id and the world size.
    assert!(worker.absent.contains_key("environ"), "{:?}", worker.absent);
    assert_eq!(worker.run_id.as_deref(), Some("job-7"));
    assert_eq!(worker.world_size, Some(4));
    assert_eq!(worker.rank, None);
    assert!(worker.from_cmdline);
    assert_eq!(worker.net_namespace, Some(NetNamespace::Host));
    assert!(
        !worker.absent.contains_key("cmdline") && !worker.absent.contains_key("net_namespace"),
        "{:?}",
        worker.absent
    );
    // torchrun itself is the child of init: nobody's worker, and not for want of reading.
    let launcher = tree.launch(100);
    assert_eq!(launcher.worker_of, Some(WorkerOf::Nobody));
    assert!(!launcher.absent.contains_key("cmdline"));

    let spawned = tree.launch(201);
    assert_eq!(spawned.worker_of, Some(WorkerOf::Multiprocessing));
    assert_eq!(spawned.net_namespace, Some(NetNamespace::Own(4026532101)));

    let trial = tree.launch(301);
    assert_eq!(trial.worker_of, Some(WorkerOf::Nobody));
    assert_eq!(trial.net_namespace, Some(NetNamespace::Host));
    assert!(!trial.absent.contains_key("cmdline"), "{:?}", trial.absent);

    // Its parent's command line unread, it could be torchrun's worker: not known.
    let orphan = tree.launch(401);
    assert_eq!((orphan.worker_of, orphan.net_namespace), (None, None));
    assert!(
        orphan.absent["cmdline"].starts_with("its parent's: /proc/400/cmdline is not readable"),
        "{:?}",
        orphan.absent
    );
    assert!(
        orphan.absent["net_namespace"].starts_with("/proc/401/ns/net is not readable"),
        "{:?}",
        orphan.absent
    );
    assert_eq!(tree.launch(402).worker_of, Some(WorkerOf::Multiprocessing));
    // A process gone before its command line was read says so.
    let gone = tree.launch(999);
    assert!(
        gone.absent["cmdline"].starts_with("/proc/999/cmdline is not readable"),
        "{:?}",
        gone.absent
    );

    // Only the verdicts are recorded: no argument of any command line reaches the JSON.
    let json = serde_json::to_string(&[&worker, &spawned, &trial, &orphan]).unwrap();
    for word in ["nproc", "train.py", "spawn_main", "sweep", "--lr"] {
        assert!(!json.contains(word), "{word} in {json}");
    }
    assert!(json.contains(r#""worker_of":"torchrun""#), "{json}");
    assert!(
        json.contains(r#""net_namespace":{"own":4026532101}"#),
        "{json}"
    );
}
