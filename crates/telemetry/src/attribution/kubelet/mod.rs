//! The kubelet's pod-resources API (`v1.PodResourcesLister/List` on a Unix socket), as
//! dcgm-exporter's Kubernetes mode reads it: which pods and containers each device was
//! allocated to. It names pods by namespace and name, never by UID, and devices by the device
//! plugin's ids (GPU UUIDs, `UUID::N` replicas when time-sliced, or indices), so the join to a
//! process goes through its GPU.
//!
//! The few messages are declared with prost's derive from the kubelet's `api.proto`
//! (k8s.io/kubelet/pkg/apis/podresources/v1), so building needs no `protoc`; fields gpudiag
//! does not read (CPU ids, memory, topology, dynamic resources) are left out and skipped on
//! decode. The client and its current-thread runtime exist only once the socket does, and
//! every call runs under a deadline: a hung kubelet costs one deadline per cache period.
//!
//! The gRPC client (`grpc.rs`: tonic, hyper, tokio) is built only with the `kubernetes`
//! feature; without it the socket is still looked for, and a node that has one is told that
//! this build cannot ask it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use gpudiag_model::attribution::PodAllocation;

/// The messages of `api.proto` gpudiag reads.
pub mod proto {
    #[derive(Clone, PartialEq)]
    #[cfg_attr(feature = "kubernetes", derive(::prost::Message))]
    #[cfg_attr(not(feature = "kubernetes"), derive(Debug, Default))]
    pub struct ListPodResourcesRequest {}

    #[derive(Clone, PartialEq)]
    #[cfg_attr(feature = "kubernetes", derive(::prost::Message))]
    #[cfg_attr(not(feature = "kubernetes"), derive(Debug, Default))]
    pub struct ListPodResourcesResponse {
        #[cfg_attr(feature = "kubernetes", prost(message, repeated, tag = "1"))]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq)]
    #[cfg_attr(feature = "kubernetes", derive(::prost::Message))]
    #[cfg_attr(not(feature = "kubernetes"), derive(Debug, Default))]
    pub struct PodResources {
        #[cfg_attr(feature = "kubernetes", prost(string, tag = "1"))]
        pub name: String,
        #[cfg_attr(feature = "kubernetes", prost(string, tag = "2"))]
        pub namespace: String,
        #[cfg_attr(feature = "kubernetes", prost(message, repeated, tag = "3"))]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq)]
    #[cfg_attr(feature = "kubernetes", derive(::prost::Message))]
    #[cfg_attr(not(feature = "kubernetes"), derive(Debug, Default))]
    pub struct ContainerResources {
        #[cfg_attr(feature = "kubernetes", prost(string, tag = "1"))]
        pub name: String,
        #[cfg_attr(feature = "kubernetes", prost(message, repeated, tag = "2"))]
        pub devices: Vec<ContainerDevices>,
    }

    #[derive(Clone, PartialEq)]
    #[cfg_attr(feature = "kubernetes", derive(::prost::Message))]
    #[cfg_attr(not(feature = "kubernetes"), derive(Debug, Default))]
    pub struct ContainerDevices {
        #[cfg_attr(feature = "kubernetes", prost(string, tag = "1"))]
        pub resource_name: String,
        #[cfg_attr(feature = "kubernetes", prost(string, repeated, tag = "2"))]
        pub device_ids: Vec<String>,
    }

    /// The gRPC path of `List`.
    pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
}

use proto::PodResources;

#[cfg(feature = "kubernetes")]
mod grpc;
#[cfg(feature = "kubernetes")]
use grpc::PodResourcesClient;

/// Without the gRPC client (built without the `kubernetes` feature) there is nothing to ask;
/// processes go without pod names, and this says why.
#[cfg(not(feature = "kubernetes"))]
struct PodResourcesClient;

#[cfg(not(feature = "kubernetes"))]
impl PodResourcesClient {
    fn new(_socket: &std::path::Path, _deadline: Duration) -> Result<Self, String> {
        Err(
            "this gpudiag was built without Kubernetes support (the `kubernetes` feature), \
             so it cannot ask the kubelet which pods hold each GPU"
                .into(),
        )
    }

    fn list(&mut self) -> Result<Vec<PodResources>, String> {
        Err("built without Kubernetes support".into())
    }
}

/// The identities a device plugin may give a GPU as a device id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuKeys {
    pub index: u32,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
}

impl GpuKeys {
    pub fn of(info: &gpudiag_model::sample::DeviceInfo) -> Self {
        GpuKeys {
            index: info.index,
            uuid: info.uuid.clone(),
            pci_bus_id: info.pci_bus_id.clone(),
        }
    }

    /// Whether the device id `id` of resource `resource` is this GPU: its UUID (NVIDIA's
    /// default; time-slicing replicas are `UUID::N`), its PCI address (AMD's plugin), or its
    /// index for a GPU resource (`deviceIDStrategy=index`).
    pub fn is_named_by(&self, resource: &str, id: &str) -> bool {
        let id = id.split("::").next().unwrap_or(id);
        let by_uuid = self
            .uuid
            .as_deref()
            .is_some_and(|u| u.eq_ignore_ascii_case(id));
        let by_bus = self
            .pci_bus_id
            .as_deref()
            .and_then(pci_address)
            .is_some_and(|b| pci_address(id) == Some(b));
        let by_index = resource.contains("gpu") && id == self.index.to_string();
        by_uuid || by_bus || by_index
    }
}

/// A PCI address as (domain, rest): NVML writes an 8-digit domain, sysfs and plugins four.
fn pci_address(s: &str) -> Option<(u32, String)> {
    let (domain, rest) = s.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    (rest.len() == 7 && rest.as_bytes()[2] == b':').then(|| (domain, rest.to_ascii_lowercase()))
}

/// The pods of `pods` that hold `gpu`, each with the containers that hold it, sorted by
/// namespace and name.
pub fn pods_holding(pods: &[PodResources], gpu: &GpuKeys) -> Vec<PodAllocation> {
    let mut out: Vec<PodAllocation> = pods
        .iter()
        .filter_map(|p| {
            let containers: Vec<String> = p
                .containers
                .iter()
                .filter(|c| {
                    c.devices.iter().any(|d| {
                        d.device_ids
                            .iter()
                            .any(|id| gpu.is_named_by(&d.resource_name, id))
                    })
                })
                .map(|c| c.name.clone())
                .collect();
            (!containers.is_empty()).then(|| PodAllocation {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                containers,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// Where to find the kubelet and how long to trust and wait for its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletOptions {
    pub socket: PathBuf,
    /// How long an answer (or a failure) is reused before asking again.
    pub cache_for: Duration,
    /// How long one `List` may take.
    pub deadline: Duration,
}

/// The socket the kubelet serves pod-resources on.
pub const DEFAULT_KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            socket: PathBuf::from(DEFAULT_KUBELET_SOCKET),
            cache_for: Duration::from_secs(10),
            deadline: Duration::from_secs(1),
        }
    }
}

/// The kubelet's answer, shared by the readers of every GPU and asked at most once per cache
/// period. The client is made the first time the socket exists.
pub struct Kubelet {
    options: KubeletOptions,
    /// Held while asking; a reader that finds it held uses the previous answer instead of
    /// waiting.
    client: Mutex<Option<PodResourcesClient>>,
    answer: Mutex<Option<Answer>>,
}

#[derive(Clone)]
struct Answer {
    at: Instant,
    pods: Result<Arc<Vec<PodResources>>, String>,
}

impl Kubelet {
    pub fn new(options: KubeletOptions) -> Self {
        Kubelet {
            options,
            client: Mutex::new(None),
            answer: Mutex::new(None),
        }
    }

    /// Whether a client was made (the socket existed when asked).
    pub fn client_started(&self) -> bool {
        self.client
            .lock()
            .map(|c| c.is_some())
            .unwrap_or_else(|p| p.into_inner().is_some())
    }

    fn cached(&self, now: Instant) -> Option<Answer> {
        let answer = self.answer.lock().unwrap_or_else(|p| p.into_inner());
        answer
            .clone()
            .filter(|a| now.duration_since(a.at) < self.options.cache_for)
    }

    /// The pods listed, from the cache or a fresh `List`; `Err` says why there is no list.
    pub fn pods(&self) -> Result<Arc<Vec<PodResources>>, String> {
        if let Some(a) = self.cached(Instant::now()) {
            return a.pods;
        }
        let mut client = match self.client.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another GPU's reader is asking: use what it last got rather than queue behind it.
            Err(TryLockError::WouldBlock) => {
                let answer = self.answer.lock().unwrap_or_else(|p| p.into_inner());
                return match answer.as_ref() {
                    Some(a) => a.pods.clone(),
                    None => Err("the kubelet's first answer is still awaited".into()),
                };
            }
        };
        // Asked by another reader while this one waited for the lock.
        if let Some(a) = self.cached(Instant::now()) {
            return a.pods;
        }
        let pods = self.ask(&mut client);
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Answer {
            at: Instant::now(),
            pods: pods.clone(),
        });
        pods
    }

    fn ask(
        &self,
        client: &mut Option<PodResourcesClient>,
    ) -> Result<Arc<Vec<PodResources>>, String> {
        let socket = &self.options.socket;
        if !socket.exists() {
            // The kubelet went away (or never ran): let its resources go.
            *client = None;
            return Err(format!(
                "no kubelet pod-resources socket at {}",
                socket.display()
            ));
        }
        let c = match client {
            Some(c) => c,
            None => client.insert(PodResourcesClient::new(socket, self.options.deadline)?),
        };
        c.list().map(Arc::new)
    }
}

#[cfg(test)]
mod tests {
    use super::proto::{ContainerDevices, ContainerResources};
    use super::*;

    fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .map(|(c, resource, ids)| ContainerResources {
                    name: (*c).into(),
                    devices: vec![ContainerDevices {
                        resource_name: (*resource).into(),
                        device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                    }],
                })
                .collect(),
        }
    }

    fn gpu(index: u32, uuid: &str, bus: &str) -> GpuKeys {
        GpuKeys {
            index,
            uuid: Some(uuid.into()),
            pci_bus_id: Some(bus.into()),
        }
    }

    #[test]
    fn device_ids_name_a_gpu_by_uuid_replica_bus_or_index() {
        let g = gpu(3, "GPU-aaaa", "00000000:19:00.0");
        assert!(g.is_named_by("nvidia.com/gpu", "GPU-aaaa"));
        assert!(g.is_named_by("nvidia.com/gpu", "gpu-AAAA"));
        assert!(g.is_named_by("nvidia.com/gpu.shared", "GPU-aaaa::2"));
        assert!(g.is_named_by("amd.com/gpu", "0000:19:00.0"));
        assert!(g.is_named_by("nvidia.com/gpu", "3"));
        assert!(!g.is_named_by("nvidia.com/gpu", "GPU-bbbb"));
        assert!(!g.is_named_by("nvidia.com/gpu", "0000:1a:00.0"));
        // An index means a GPU only for a GPU resource.
        assert!(!g.is_named_by("rdma/hca", "3"));
        assert!(!g.is_named_by("nvidia.com/gpu", ""));
    }

    #[test]
    fn pods_holding_a_gpu_with_their_containers() {
        let pods = vec![
            pod(
                "ml",
                "train-0",
                &[("trainer", "nvidia.com/gpu", &["GPU-aaaa"])],
            ),
            pod(
                "ml",
                "notebook",
                &[
                    ("lab", "nvidia.com/gpu", &["GPU-bbbb::0"]),
                    ("sidecar", "cpu", &[]),
                ],
            ),
            pod("batch", "a", &[("x", "nvidia.com/gpu", &["GPU-bbbb::1"])]),
        ];
        let a = pods_holding(&pods, &gpu(0, "GPU-aaaa", "00000000:19:00.0"));
        assert_eq!(
            a,
            [PodAllocation {
                namespace: "ml".into(),
                name: "train-0".into(),
                containers: vec!["trainer".into()],
            }]
        );
        // A time-sliced GPU: both pods, sorted by namespace then name.
        let b = pods_holding(&pods, &gpu(1, "GPU-bbbb", "00000000:1a:00.0"));
        let names: Vec<(&str, &str)> = b
            .iter()
            .map(|p| (p.namespace.as_str(), p.name.as_str()))
            .collect();
        assert_eq!(names, [("batch", "a"), ("ml", "notebook")]);
        assert_eq!(b[1].containers, ["lab"]);
        assert!(pods_holding(&pods, &gpu(2, "GPU-cccc", "00000000:1b:00.0")).is_empty());
    }

    #[test]
    fn no_socket_means_no_client_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = Kubelet::new(KubeletOptions {
            socket: dir.path().join("kubelet.sock"),
            ..KubeletOptions::default()
        });
        let why = kubelet.pods().unwrap_err();
        assert!(why.contains("no kubelet pod-resources socket"), "{why}");
        assert!(!kubelet.client_started());
    }
}
