//! The gRPC client of the kubelet's pod-resources socket: one HTTP/2 connection on the Unix
//! socket, driven by a current-thread runtime only while a call runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::proto::{self, ListPodResourcesRequest, ListPodResourcesResponse, PodResources};

/// The kubelet's answer is bounded: a node runs at most a few hundred pods.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// One HTTP/2 connection to the socket, as the tower service tonic's client sends through.
#[derive(Clone)]
struct Connection(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

type Answered = http::Response<hyper::body::Incoming>;

impl tower_service::Service<http::Request<tonic::body::Body>> for Connection {
    type Response = Answered;
    type Error = hyper::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Answered, hyper::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

/// A gRPC client of the pod-resources socket with its own current-thread runtime. The HTTP/2
/// connection is driven by a task on that runtime, which runs only inside `list`: between
/// calls nothing of it is scheduled.
pub struct PodResourcesClient {
    runtime: tokio::runtime::Runtime,
    socket: PathBuf,
    /// Kept between calls; dropped after a failure so the next call reconnects.
    connection: Option<Connection>,
    deadline: Duration,
}

impl PodResourcesClient {
    pub fn new(socket: &Path, deadline: Duration) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("cannot start the kubelet client: {e}"))?;
        Ok(PodResourcesClient {
            runtime,
            socket: socket.to_path_buf(),
            connection: None,
            deadline,
        })
    }

    /// `List`, within the deadline.
    pub fn list(&mut self) -> Result<Vec<PodResources>, String> {
        let (socket, cached) = (self.socket.clone(), self.connection.clone());
        let call = async move {
            let connection = match cached {
                Some(c) => c,
                None => connect(&socket).await?,
            };
            // The authority is a placeholder: HTTP/2 wants one, the socket names the peer.
            let origin = http::Uri::from_static("http://localhost");
            let mut grpc = tonic::client::Grpc::with_origin(connection.clone(), origin)
                .max_decoding_message_size(MAX_ANSWER_BYTES);
            grpc.ready()
                .await
                .map_err(|e| format!("kubelet pod-resources not ready: {e}"))?;
            let codec =
                tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::new();
            let answer = grpc
                .unary(
                    tonic::Request::new(ListPodResourcesRequest {}),
                    http::uri::PathAndQuery::from_static(proto::LIST_PATH),
                    codec,
                )
                .await
                .map_err(|s| format!("kubelet pod-resources List failed: {}", s.message()))?;
            Ok::<_, String>((connection, answer.into_inner().pod_resources))
        };
        let outcome = self
            .runtime
            .block_on(async { tokio::time::timeout(self.deadline, call).await });
        match outcome {
            Ok(Ok((connection, pods))) => {
                self.connection = Some(connection);
                Ok(pods)
            }
            Ok(Err(why)) => {
                self.connection = None;
                Err(why)
            }
            Err(_) => {
                self.connection = None;
                Err(format!(
                    "kubelet pod-resources did not answer within {} ms",
                    self.deadline.as_millis()
                ))
            }
        }
    }
}

/// Connects to the socket and starts the HTTP/2 connection's task on the current runtime.
async fn connect(socket: &Path) -> Result<Connection, String> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "cannot connect to the kubelet pod-resources socket {}: {e}",
            socket.display()
        )
    })?;
    let (send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| format!("kubelet pod-resources HTTP/2 handshake failed: {e}"))?;
    // Ends with the connection (the peer closes, or the client is dropped with its runtime).
    tokio::spawn(connection);
    Ok(Connection(send))
}
