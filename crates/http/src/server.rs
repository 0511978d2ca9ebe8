//! Accepting connections, reading request heads, routing and writing answers.
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
//!
//! With `--web.config.file`, TLS runs inside the same design: the head-reading thread drives each
//! connection's rustls handshake without blocking (a handshake is part of "reading the head", so
//! it shares its deadline and bounds), and the answering thread encrypts the answer. Basic-auth
//! passwords are checked on the answering thread too, since bcrypt takes milliseconds on purpose.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::web_config::BasicAuth;

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

/// (status, content type, body).
pub type Answer = (u16, &'static str, String);

/// What `GET /metrics` answers: a body rendered for each request, and its content type. The
/// caller passes one in; rendering runs on the answering threads, never on the thread that
/// reads request heads.
pub trait Metrics: Send + Sync {
    fn content_type(&self) -> &'static str;
    fn render(&self) -> String;
}

/// What guards /metrics, from `--web.config.file`; the default guards nothing.
#[derive(Clone, Default)]
pub struct Guard {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub auth: Option<Arc<BasicAuth>>,
}

/// The parts of a request head an answer depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
}

/// What a request gets: (status, content type, body). `HEAD` is routed as `GET` is; the body
/// is left out when the answer is written ([`answer_bytes`]), so its headers stay the same.
pub fn respond_to(method: &str, url: &str, metrics: &dyn Metrics) -> Answer {
    let target = origin_form(url);
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return (
            404,
            "text/plain; charset=utf-8",
            "not found: gpudiag serves /metrics\n".into(),
        );
    }
    if method != "GET" && method != "HEAD" {
        return (
            405,
            "text/plain; charset=utf-8",
            "method not allowed: use GET or HEAD\n".into(),
        );
    }
    (200, metrics.content_type(), metrics.render())
}

/// A request target in origin form (`/metrics?x`). HTTP/1.1 servers must accept the absolute
/// form too (RFC 9112 section 3.2.2: `http://host:port/metrics?x`), which a client sends
/// through a proxy; its authority is ignored (gpudiag serves one host) and an empty path is
/// `/`. Any other target is returned as it came, and routes nowhere.
fn origin_form(target: &str) -> &str {
    let scheme_len = ["http://", "https://"]
        .iter()
        .find(|s| {
            target
                .get(..s.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(s))
        })
        .map(|s| s.len());
    let Some(scheme_len) = scheme_len else {
        return target;
    };
    let rest = &target[scheme_len..];
    match rest.find(['/', '?']) {
        Some(at) if rest[at..].starts_with('/') => &rest[at..],
        // `http://host?x` and `http://host` have the empty path, which means `/`.
        _ => "/",
    }
}

/// The answer to a request: with basic auth configured, a 401 for any path unless the
/// credentials pass, so an unauthenticated client learns nothing about what is served.
pub fn respond(req: &Request, metrics: &dyn Metrics, auth: Option<&BasicAuth>) -> Answer {
    if auth.is_some_and(|a| !a.allows(req.authorization.as_deref())) {
        return plain(401, "unauthorized: this gpudiag asks for basic auth\n");
    }
    respond_to(&req.method, &req.path, metrics)
}

/// A connection whose request head (and, over TLS, handshake) is still coming in.
struct Pending {
    stream: TcpStream,
    tls: Option<Box<rustls::ServerConnection>>,
    received: Vec<u8>,
    accepted: Instant,
}

/// What the answering threads share.
struct Answering {
    metrics: Arc<dyn Metrics>,
    auth: Option<Arc<BasicAuth>>,
    count: Arc<AtomicUsize>,
}

/// Accepts connections and reads their request heads on this one thread, polling every socket;
/// a whole request goes to a thread of its own (at most `MAX_CONNECTIONS`) that renders and
/// writes the answer. Silent or trickling clients thus cost a descriptor, not a thread, and a
/// flood of them cannot keep a scraper's head from being read: at `MAX_PENDING` the oldest
/// is answered 503 and closed.
pub fn serve_connections(
    listener: &TcpListener,
    metrics: Arc<dyn Metrics>,
    stop: &AtomicBool,
    guard: &Guard,
) {
    use std::os::fd::AsRawFd;
    let mut pending: Vec<Pending> = Vec::new();
    let answering = Answering {
        metrics,
        auth: guard.auth.clone(),
        count: Arc::new(AtomicUsize::new(0)),
    };
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Heads past their deadline get a 408, so a trickling client is bounded in time.
        pending.retain_mut(|p| {
            if now.duration_since(p.accepted) < REQUEST_TIMEOUT {
                return true;
            }
            send_now(p, plain(408, "request timeout\n"), false);
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
            // A handshake answer that did not fit the socket buffer goes out when it drains.
            events: if p.tls.as_ref().is_some_and(|c| c.wants_write()) {
                libc::POLLIN | libc::POLLOUT
            } else {
                libc::POLLIN
            },
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
            match read_head(&mut pending[i], &mut chunk) {
                HeadState::Waiting => i += 1,
                HeadState::Gone => {
                    pending.swap_remove(i);
                    // The swapped-in entry's readiness is at the end of `fds`; it waits a round.
                    slot = fds.len();
                }
                HeadState::Complete(request) => {
                    let p = pending.swap_remove(i);
                    slot = fds.len();
                    dispatch(p, request, &answering);
                }
            }
        }
        if fds[0].revents != 0 {
            accept_some(listener, &mut pending, guard.tls.as_ref());
        }
    }
}

enum HeadState {
    Waiting,
    Gone,
    /// A whole head: the request, or the error answer a malformed or oversized one gets.
    Complete(Result<Request, Answer>),
}

/// Reads what a pending connection has sent (without blocking) and decides.
fn read_head(p: &mut Pending, chunk: &mut [u8]) -> HeadState {
    if p.tls.is_some() {
        return read_tls_head(p, chunk);
    }
    loop {
        match p.stream.read(chunk) {
            Ok(0) => return HeadState::Gone,
            Ok(n) => {
                p.received.extend_from_slice(&chunk[..n]);
                if let Some(request) = parse_head(&p.received) {
                    return HeadState::Complete(request);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return HeadState::Waiting,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return HeadState::Gone,
        }
    }
}

/// `read_head` over TLS: feeds what arrived to rustls, takes out the plaintext it yields, and
/// sends what the handshake asks to send, all without blocking.
fn read_tls_head(p: &mut Pending, chunk: &mut [u8]) -> HeadState {
    let Pending {
        stream,
        tls: Some(conn),
        received,
        ..
    } = p
    else {
        return HeadState::Gone;
    };
    loop {
        match conn.read_tls(stream) {
            Ok(0) => return HeadState::Gone,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return HeadState::Gone,
        }
        if conn.process_new_packets().is_err() {
            // Not TLS, or a failed handshake: the alert rustls queued says why, if it fits.
            let _ = conn.write_tls(stream);
            return HeadState::Gone;
        }
        loop {
            match conn.reader().read(chunk) {
                // The client closed its side before a whole head.
                Ok(0) => return HeadState::Gone,
                Ok(n) => {
                    received.extend_from_slice(&chunk[..n]);
                    if let Some(request) = parse_head(received) {
                        return HeadState::Complete(request);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return HeadState::Gone,
            }
        }
    }
    while conn.wants_write() {
        match conn.write_tls(stream) {
            Ok(0) => return HeadState::Gone,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return HeadState::Gone,
        }
    }
    HeadState::Waiting
}

/// Accepts what is waiting, a bounded number at a time so heads keep being read.
fn accept_some(
    listener: &TcpListener,
    pending: &mut Vec<Pending>,
    tls: Option<&Arc<rustls::ServerConfig>>,
) {
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
        let tls = match tls.map(|c| rustls::ServerConnection::new(c.clone())) {
            None => None,
            Some(Ok(conn)) => Some(Box::new(conn)),
            Some(Err(_)) => continue,
        };
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
                send_now(&mut old, busy(), false);
            }
        }
        pending.push(Pending {
            stream,
            tls,
            received: Vec::new(),
            accepted: Instant::now(),
        });
    }
}

/// Answers a whole request on a thread of its own (which checks credentials, renders and
/// writes), or at once with a 503 when `MAX_CONNECTIONS` answers are already being written (to
/// clients that read slowly).
fn dispatch(mut p: Pending, request: Result<Request, Answer>, answering: &Answering) {
    let head = matches!(&request, Ok(req) if req.method == "HEAD");
    if answering.count.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        answering.count.fetch_sub(1, Ordering::AcqRel);
        send_now(&mut p, busy(), head);
        return;
    }
    let counter = answering.count.clone();
    let (metrics, auth) = (answering.metrics.clone(), answering.auth.clone());
    let spawned = std::thread::Builder::new()
        .name("gpudiag-http".into())
        .spawn(move || {
            let answer = match request {
                Ok(req) => respond(&req, metrics.as_ref(), auth.as_deref()),
                Err(answer) => answer,
            };
            write_answer(p, answer, head);
            counter.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        answering.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long one answer may take to write, all of it: the bound one blocked write had (a client
/// that reads nothing), now for the whole answer (a client that reads a little at a time).
/// Several MB of metrics take milliseconds on any network a scraper sits on.
const ANSWER_TIMEOUT: Duration = REQUEST_TIMEOUT;

/// A socket whose writes share one deadline. A timeout per write alone let a client that reads
/// a kilobyte every few seconds hold a thread, and one of the answer slots, for as long as a
/// large answer lasted: 64 such clients held every slot and each scrape got 503.
struct Deadlined<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the answer's deadline passed",
            ));
        }
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// Writes an answer and closes, blocking, with a deadline for the whole answer: a client that
/// reads slowly or not at all holds the thread for at most ANSWER_TIMEOUT. A client that went
/// away is its own problem.
fn write_answer(p: Pending, answer: Answer, head: bool) {
    let Pending {
        mut stream, tls, ..
    } = p;
    let _ = stream.set_nonblocking(false);
    let bytes = answer_bytes(&answer, head);
    let mut out = Deadlined {
        stream: &mut stream,
        deadline: Instant::now() + ANSWER_TIMEOUT,
    };
    match tls {
        None => {
            let _ = out.write_all(&bytes).and_then(|()| out.flush());
        }
        Some(mut conn) => {
            // The answer is already in memory; rustls's default cap would only split it.
            conn.set_buffer_limit(None);
            if conn.writer().write_all(&bytes).is_ok() {
                conn.send_close_notify();
                flush_tls(&mut conn, &mut out);
            }
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Writes out what rustls holds until done, or until the socket refuses (would block, timed
/// out, closed): either way there is nothing more this connection can be given.
fn flush_tls(conn: &mut rustls::ServerConnection, stream: &mut dyn Write) {
    while conn.wants_write() {
        match conn.write_tls(stream) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// A short answer written without blocking (it fits an empty socket buffer), then the close.
/// Over TLS it can only be sent once the handshake is done; before that the close says it.
fn send_now(p: &mut Pending, answer: Answer, head: bool) {
    let bytes = answer_bytes(&answer, head);
    match &mut p.tls {
        None => {
            let _ = p.stream.write_all(&bytes);
        }
        Some(conn) if !conn.is_handshaking() => {
            if conn.writer().write_all(&bytes).is_ok() {
                conn.send_close_notify();
                flush_tls(conn, &mut p.stream);
            }
        }
        Some(_) => {}
    }
    let _ = p.stream.shutdown(std::net::Shutdown::Both);
}

/// What the bytes a client has sent so far hold: `None` while the request head is incomplete
/// (and under the size limit), else the request or the error answer it gets. Pure over its
/// input, so the whole request path short of the socket is fuzzed
/// (`fuzz/fuzz_targets/http_request.rs`).
pub fn parse_head(received: &[u8]) -> Option<Result<Request, Answer>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(received) {
        Ok(httparse::Status::Complete(_)) => {
            let authorization = request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(str::to_owned);
            Some(Ok(Request {
                method: request.method.unwrap_or("").to_owned(),
                path: request.path.unwrap_or("").to_owned(),
                authorization,
            }))
        }
        Ok(httparse::Status::Partial) if received.len() > MAX_HEAD_BYTES => {
            Some(Err(plain(431, "request head too large\n")))
        }
        Ok(httparse::Status::Partial) => None,
        Err(_) => Some(Err(plain(400, "malformed request\n"))),
    }
}

/// `parse_head` answered as a server without `--web.config.file` answers it.
pub fn answer(received: &[u8], metrics: &dyn Metrics) -> Option<Answer> {
    parse_head(received).map(|r| match r {
        Ok(req) => respond(&req, metrics, None),
        Err(answer) => answer,
    })
}

/// The bytes an answer is written as: to a `HEAD` request (`head`), the headers a `GET` would
/// get, Content-Length included, and no body (RFC 9110 section 9.3.2).
pub fn answer_bytes((status, content_type, body): &Answer, head: bool) -> Vec<u8> {
    if head {
        head_bytes(*status, content_type, body.len())
    } else {
        response_bytes(*status, content_type, body)
    }
}

/// The whole HTTP/1.1 response for an answer; the connection closes after it.
pub fn response_bytes(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    let mut out = head_bytes(status, content_type, body.len());
    out.extend_from_slice(body.as_bytes());
    out
}

/// The status line and headers of a response whose body is `content_length` bytes.
fn head_bytes(status: u16, content_type: &str, content_length: usize) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let extra = match status {
        401 => "WWW-Authenticate: Basic realm=\"gpudiag\", charset=\"UTF-8\"\r\n",
        405 => "Allow: GET, HEAD\r\n",
        _ => "",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: \
         {content_length}\r\n{extra}Connection: close\r\n\r\n"
    )
    .into_bytes()
}

fn busy() -> Answer {
    plain(503, "busy: too many connections; try again\n")
}

fn plain(status: u16, body: &str) -> Answer {
    (status, "text/plain; charset=utf-8", body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that says which route answered, in place of the caller's rendering.
    struct Fixed;

    impl Metrics for Fixed {
        fn content_type(&self) -> &'static str {
            "text/plain; version=0.0.4; charset=utf-8"
        }
        fn render(&self) -> String {
            "gpu_util 99\n".into()
        }
    }

    /// A client that reads a little every 20 ms takes an answer of 64 MiB for hours; it is
    /// cut off at the answer's deadline, where a timeout per write never fired.
    #[test]
    fn a_client_that_reads_slowly_is_cut_off_at_the_answers_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader_stop = stop.clone();
        let reader = std::thread::spawn(move || {
            let mut client = TcpStream::connect(addr).unwrap();
            let mut chunk = [0u8; 1024];
            while !reader_stop.load(Ordering::Relaxed) {
                if matches!(client.read(&mut chunk), Ok(0) | Err(_)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let (mut stream, _) = listener.accept().unwrap();
        let started = Instant::now();
        let mut out = Deadlined {
            stream: &mut stream,
            deadline: started + Duration::from_millis(300),
        };
        let written = out.write_all(&vec![b'x'; 64 << 20]);
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let _ = stream.shutdown(std::net::Shutdown::Both);
        reader.join().unwrap();
        let e = written.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
        assert!(took < Duration::from_secs(30), "{took:?}");
    }

    #[test]
    fn routes_and_methods() {
        let (code, ctype, body) = respond_to("GET", "/metrics?x=1", &Fixed);
        assert_eq!((code, ctype), (200, Fixed.content_type()));
        assert_eq!(body, Fixed.render());
        assert_eq!(respond_to("GET", "/", &Fixed).0, 404);
        assert_eq!(respond_to("GET", "/metricsx", &Fixed).0, 404);
        assert_eq!(respond_to("POST", "/metrics", &Fixed).0, 405);
        assert_eq!(respond_to("PUT", "/metrics", &Fixed).0, 405);
        // HEAD is GET without the body, which is left out only when the answer is written.
        assert_eq!(
            respond_to("HEAD", "/metrics?x=1", &Fixed).0,
            respond_to("GET", "/metrics?x=1", &Fixed).0
        );
        // The absolute form a client sends through a proxy routes by its path.
        for target in [
            "http://localhost:9400/metrics",
            "HTTP://[::1]:9400/metrics?x=1",
            "https://gpu-7.example/metrics",
        ] {
            assert_eq!(respond_to("GET", target, &Fixed).0, 200, "{target}");
        }
        for target in [
            "http://localhost:9400",
            "http://localhost:9400?x=/metrics",
            "http://host/metricsx",
            "ftp://host/metrics",
            "http:/metrics",
            "*",
        ] {
            assert_eq!(respond_to("GET", target, &Fixed).0, 404, "{target}");
        }
    }

    #[test]
    fn a_head_answer_is_the_get_answer_without_its_body() {
        let answer = respond_to("HEAD", "/metrics", &Fixed);
        let whole = response_bytes(answer.0, answer.1, &answer.2);
        let head = answer_bytes(&answer, true);
        assert_eq!(head, whole[..whole.len() - answer.2.len()]);
        let text = String::from_utf8(head).unwrap();
        assert!(
            text.contains(&format!("Content-Length: {}\r\n", answer.2.len())),
            "{text}"
        );
        assert_eq!(answer_bytes(&answer, false), whole);
    }
}
