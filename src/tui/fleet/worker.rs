//! The thread that talks to Prometheus. It owns the client, reads the fleet at start and then
//! every interval, and a node's charts and processes when the UI asks; each result goes back
//! through `report`. HTTP waits (up to the client's timeout) happen here only, so a slow or
//! dead Prometheus never stalls a keypress or a redraw.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use gpudiag_fleet::client::Client;
use gpudiag_fleet::model::{Fleet, Node, NodeDetail};
use gpudiag_fleet::read::{ReadRequest, read_fleet, read_node};

/// How far back a node's charts reach.
pub const CHART_SPAN: Duration = Duration::from_secs(30 * 60);

/// What the UI asks of the worker.
#[derive(Debug)]
pub enum Request {
    /// Read the fleet now rather than at the next interval.
    RefreshNow,
    /// Read this node's charts and processes as of `at_ms`.
    Node { node: Box<Node>, at_ms: i64 },
}

/// What the worker sends back.
#[derive(Debug)]
pub enum Report {
    /// A fleet read began (the header says so while it runs).
    ReadStarted,
    Fleet(Box<Fleet>),
    Node(Box<NodeDetail>),
}

/// The running worker; dropping it tells the thread to stop after what it is reading now.
/// Nobody waits for that: a read stuck on a dead Prometheus must not hold up quitting.
pub struct Worker {
    requests: Sender<Request>,
}

impl Worker {
    pub fn ask(&self, request: Request) {
        // A worker gone means the UI is closing anyway.
        let _ = self.requests.send(request);
    }
}

/// Starts the worker; `report` returns false once the UI no longer listens, which ends it.
pub fn spawn(
    mut client: Client,
    request: ReadRequest,
    interval: Duration,
    mut report: impl FnMut(Report) -> bool + Send + 'static,
) -> std::io::Result<Worker> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("gpudiag-fleet-reader".into())
        .spawn(move || serve(&mut client, &request, interval, &rx, &mut report))?;
    Ok(Worker { requests: tx })
}

fn serve(
    client: &mut Client,
    request: &ReadRequest,
    interval: Duration,
    requests: &Receiver<Request>,
    report: &mut impl FnMut(Report) -> bool,
) {
    let mut next_read = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_read {
            if !report(Report::ReadStarted) {
                return;
            }
            let fleet = read_fleet(client, request);
            if !report(Report::Fleet(Box::new(fleet))) {
                return;
            }
            // Counted from the end of the read, so a Prometheus slower than the interval gets
            // a pause between reads rather than one read after another.
            next_read = Instant::now() + interval;
            continue;
        }
        match requests.recv_timeout(next_read - now) {
            Ok(Request::RefreshNow) => next_read = Instant::now(),
            Ok(Request::Node { node, at_ms }) => {
                // Only the last node asked for matters: the user has moved on from the others.
                let (mut node, mut at_ms) = (node, at_ms);
                let mut refresh = false;
                while let Ok(later) = requests.try_recv() {
                    match later {
                        Request::Node { node: n, at_ms: a } => (node, at_ms) = (n, a),
                        Request::RefreshNow => refresh = true,
                    }
                }
                let detail = read_node(client, &request.node_label, &node, at_ms, CHART_SPAN);
                if !report(Report::Node(Box::new(detail))) {
                    return;
                }
                if refresh {
                    next_read = Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
