//! The HTTP side of `gpudiag serve`: accepting connections, reading request heads, routing and
//! writing answers.
//!
//! One thread accepts connections and reads request heads from all of them with `poll` (at most
//! `MAX_PENDING` at once, the oldest answered 503 when more come); a head parsed by `httparse`
//! (with a size limit) goes to a thread of its own that writes the answer (at most
//! `MAX_CONNECTIONS`). Every exchange has a deadline. So silent, trickling or malformed clients
//! cost a descriptor for at most `REQUEST_TIMEOUT`, never a thread, and cannot keep a scraper
//! waiting: a thread per connection (the first design) let 64 silent connections, opened again
//! as they timed out, lock every scrape out. tiny_http was tried first: it has no request
//! timeouts, and its thread pool can queue a new connection behind stalled ones, which is the
//! stall this design must not have.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::exposition::CONTENT_TYPE;
use super::{Snapshot, render};

/// Answers written at once, each on its own thread; a scrape takes well under a millisecond,
/// so only clients that stop reading ever come near this.
const MAX_CONNECTIONS: usize = 64;
/// Connections whose request head is still coming in; each costs a descriptor and a buffer of
/// at most `MAX_HEAD_BYTES`, not a thread.
const MAX_PENDING: usize = 256;
/// The longest one exchange (request head in, answer out) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// A scrape's request head is a few hundred bytes.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;
/// How often the accept loop looks at the stop flag when no client comes; a client that comes
/// is accepted at once.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// What a request gets: (status, content type, body).
pub fn respond_to(method: &str, url: &str, snap: &RwLock<Snapshot>) -> (u16, &'static str, String) {
    let path = url.split('?').next().unwrap_or(url);
    if path != "/metrics" {
        return (
            404,
            "text/plain; charset=utf-8",
            "not found: gpudiag serves /metrics\n".into(),
        );
    }
    if method != "GET" {
        return (
            405,
            "text/plain; charset=utf-8",
            "method not allowed: use GET\n".into(),
        );
    }
    let body = match snap.read() {
        Ok(s) => render(&s, Instant::now()),
        // A panic while holding the lock left the snapshot as it was; it is still a snapshot.
        Err(poisoned) => render(&poisoned.into_inner(), Instant::now()),
    };
    (200, CONTENT_TYPE, body)
}

/// A connection whose request head is still coming in.
struct Pending {
    stream: TcpStream,
    received: Vec<u8>,
    accepted: Instant,
}

/// Accepts connections and reads their request heads on this one thread, polling every socket;
/// a whole request goes to a thread of its own (at most `MAX_CONNECTIONS`) that renders and
/// writes the answer. Silent or trickling clients thus cost a descriptor, not a thread, and a
/// flood of them cannot keep a scraper's head from being read: at `MAX_PENDING` the oldest
/// is answered 503 and closed.
pub(super) fn serve_connections(
    listener: &TcpListener,
    shared: &Arc<RwLock<Snapshot>>,
    stop: &AtomicBool,
) {
    use std::os::fd::AsRawFd;
    let mut pending: Vec<Pending> = Vec::new();
    let answering = Arc::new(AtomicUsize::new(0));
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Heads past their deadline get a 408, so a trickling client is bounded in time.
        pending.retain_mut(|p| {
            if now.duration_since(p.accepted) < REQUEST_TIMEOUT {
                return true;
            }
            send_now(&mut p.stream, plain(408, "request timeout\n"));
            false
        });
        let wait = pending
            .iter()
            .map(|p| (p.accepted + REQUEST_TIMEOUT).saturating_duration_since(now))
            .min()
            .map_or(ACCEPT_POLL, |d| d.min(ACCEPT_POLL));
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let ms = libc::c_int::try_from(wait.as_millis() + 1).unwrap_or(libc::c_int::MAX);
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `fds` is a valid array of `nfds` pollfds that outlives the call, and each fd
        // belongs to the listener or a stream in `pending`, all open until after the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, ms) };
        if n <= 0 {
            continue;
        }
        // Heads first (their indices match `fds[1..]`), then new connections.
        let mut i = 0;
        let mut slot = 1;
        while i < pending.len() {
            let ready = fds.get(slot).is_some_and(|f| f.revents != 0);
            slot += 1;
            if !ready {
                i += 1;
                continue;
            }
            match read_head(&mut pending[i], &mut chunk, shared) {
                HeadState::Waiting => i += 1,
                HeadState::Gone => {
                    pending.swap_remove(i);
                    // The swapped-in entry's readiness is at the end of `fds`; it waits a round.
                    slot = fds.len();
                }
                HeadState::Answer(answer) => {
                    let p = pending.swap_remove(i);
                    slot = fds.len();
                    dispatch(p.stream, answer, &answering);
                }
            }
        }
        if fds[0].revents != 0 {
            accept_some(listener, &mut pending);
        }
    }
}

enum HeadState {
    Waiting,
    Gone,
    Answer((u16, &'static str, String)),
}

/// Reads what a pending connection has sent (without blocking) and decides.
fn read_head(p: &mut Pending, chunk: &mut [u8], shared: &RwLock<Snapshot>) -> HeadState {
    loop {
        match p.stream.read(chunk) {
            Ok(0) => return HeadState::Gone,
            Ok(n) => {
                p.received.extend_from_slice(&chunk[..n]);
                if let Some(answer) = answer(&p.received, shared) {
                    return HeadState::Answer(answer);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return HeadState::Waiting,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return HeadState::Gone,
        }
    }
}

/// Accepts what is waiting, a bounded number at a time so heads keep being read.
fn accept_some(listener: &TcpListener, pending: &mut Vec<Pending>) {
    for _ in 0..MAX_CONNECTIONS {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            // A connection reset before accept, or out of descriptors: try again next round.
            Err(_) => return,
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if pending.len() >= MAX_PENDING {
            // The oldest is the likeliest to be silent on purpose; a scraper's head is read in
            // the round after its accept.
            let oldest = pending
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.accepted)
                .map(|(i, _)| i);
            if let Some(i) = oldest {
                let mut old = pending.swap_remove(i);
                send_now(&mut old.stream, busy());
            }
        }
        pending.push(Pending {
            stream,
            received: Vec::new(),
            accepted: Instant::now(),
        });
    }
}

/// Answers a whole request on a thread of its own, or at once with a 503 when
/// `MAX_CONNECTIONS` answers are already being written (to clients that read slowly).
fn dispatch(
    mut stream: TcpStream,
    answer: (u16, &'static str, String),
    answering: &Arc<AtomicUsize>,
) {
    if answering.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        answering.fetch_sub(1, Ordering::AcqRel);
        send_now(&mut stream, busy());
        return;
    }
    let counter = answering.clone();
    let spawned = std::thread::Builder::new()
        .name("gpudiag-http".into())
        .spawn(move || {
            let (status, ctype, body) = answer;
            // Blocking, with a deadline: a client that stops reading holds this thread for at
            // most REQUEST_TIMEOUT.
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
            // A client that went away, or stopped reading, is its own problem.
            let _ = stream
                .write_all(&response_bytes(status, ctype, &body))
                .and_then(|()| stream.flush());
            let _ = stream.shutdown(std::net::Shutdown::Both);
            counter.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        answering.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A short answer written without blocking (it fits an empty socket buffer), then the close.
fn send_now(stream: &mut TcpStream, (status, ctype, body): (u16, &'static str, String)) {
    let _ = stream.write_all(&response_bytes(status, ctype, &body));
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// What the bytes a client has sent so far call for: `None` while the request head is incomplete
/// (and under the size limit), else the answer. Pure over its input, so the whole request path
/// short of the socket is fuzzed (`fuzz/fuzz_targets/http_request.rs`).
pub fn answer(received: &[u8], snap: &RwLock<Snapshot>) -> Option<(u16, &'static str, String)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(received) {
        Ok(httparse::Status::Complete(_)) => {
            let method = request.method.unwrap_or("");
            let path = request.path.unwrap_or("");
            Some(respond_to(method, path, snap))
        }
        Ok(httparse::Status::Partial) if received.len() > MAX_HEAD_BYTES => {
            Some(plain(431, "request head too large\n"))
        }
        Ok(httparse::Status::Partial) => None,
        Err(_) => Some(plain(400, "malformed request\n")),
    }
}

/// The whole HTTP/1.1 response for an answer; the connection closes after it.
pub fn response_bytes(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let allow = if status == 405 { "Allow: GET\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         {allow}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn busy() -> (u16, &'static str, String) {
    plain(503, "busy: too many connections; try again\n")
}

fn plain(status: u16, body: &str) -> (u16, &'static str, String) {
    (status, "text/plain; charset=utf-8", body.to_string())
}
