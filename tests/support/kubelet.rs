//! A fake kubelet: a real gRPC server (tonic, on its own thread and runtime) speaking the
//! pod-resources API's `List` on a Unix socket, with the same prost messages gpudiag's client
//! uses. It answers a fixed list, or hangs to test the client's deadline. The service is what
//! tonic's code generator would write for `service PodResourcesLister { rpc List(...) }`, by
//! hand, as the generator needs protoc.
// Each test binary that includes this uses a different part of it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use gpudiag_telemetry::attribution::kubelet::proto::{
    self, ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use tonic::codegen::{BoxFuture, Service, http};

/// What the fake kubelet does when asked.
#[derive(Debug, Clone)]
pub enum Behaviour {
    Answer(Vec<PodResources>),
    /// Accepts the call and never answers.
    Hang,
}

/// A pod with containers, each holding `resource` device ids.
pub fn pod(namespace: &str, name: &str, containers: &[(&str, &[&str])]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: containers
            .iter()
            .map(|(c, ids)| ContainerResources {
                name: (*c).into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                }],
            })
            .collect(),
    }
}

#[derive(Clone)]
struct Lister(Arc<Behaviour>);

impl tonic::server::NamedService for Lister {
    const NAME: &'static str = "v1.PodResourcesLister";
}

struct ListCall(Arc<Behaviour>);

impl tonic::server::UnaryService<ListPodResourcesRequest> for ListCall {
    type Response = ListPodResourcesResponse;
    type Future = BoxFuture<tonic::Response<ListPodResourcesResponse>, tonic::Status>;

    fn call(&mut self, _: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        let behaviour = self.0.clone();
        Box::pin(async move {
            match &*behaviour {
                Behaviour::Answer(pods) => Ok(tonic::Response::new(ListPodResourcesResponse {
                    pod_resources: pods.clone(),
                })),
                Behaviour::Hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Err(tonic::Status::deadline_exceeded("never"))
                }
            }
        })
    }
}

impl Service<http::Request<tonic::body::Body>> for Lister {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let behaviour = self.0.clone();
        match req.uri().path() {
            proto::LIST_PATH => Box::pin(async move {
                let codec = tonic_prost::ProstCodec::default();
                let mut grpc = tonic::server::Grpc::new(codec);
                Ok(grpc.unary(ListCall(behaviour), req).await)
            }),
            _ => Box::pin(async move {
                Ok(tonic::Status::unimplemented("not the pod-resources API").into_http())
            }),
        }
    }
}

/// A fake kubelet listening on a socket in its own temporary directory until dropped.
pub struct FakeKubelet {
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKubelet {
    pub fn start(behaviour: Behaviour) -> FakeKubelet {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("kubelet.sock");
        Self::start_at(dir, socket, behaviour)
    }

    /// Listens on `socket` (which `dir`, removed on drop, need not hold).
    pub fn start_at(dir: tempfile::TempDir, socket: PathBuf, behaviour: Behaviour) -> FakeKubelet {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, is_ready) = std::sync::mpsc::channel();
        let path = socket.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).expect("bind the socket");
                let _ = ready.send(());
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(Lister(Arc::new(behaviour)))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        is_ready
            .recv_timeout(Duration::from_secs(10))
            .expect("the fake kubelet listens");
        FakeKubelet {
            socket,
            _dir: dir,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // A hanging call keeps the server's graceful shutdown waiting: do not join then.
        if let Some(t) = self.thread.take()
            && t.is_finished()
        {
            let _ = t.join();
        }
    }
}
