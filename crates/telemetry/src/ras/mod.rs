//! Asks NCCL's RAS service how a job's collectives progress (`docs/nccl-ras.md`): connect to the
//! address every NCCL process of the job listens on, send a fixed handful of read-only commands,
//! read the report to the server's close, and keep it as a bounded [`RasAnswer`].
//!
//! The server is any process of the user that bound the port, and its report is data: a deadline
//! covers the whole exchange (a trickling server cannot hold the caller), a cap bounds what is
//! read, and anything that is not a RAS report becomes a `not_answered` reason. Never a panic,
//! never a hang, never an error for the caller: an absent RAS is evidence of nothing.

mod parse;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use gpudiag_model::ras::{RasAnswer, RasFailure, RasFormat, RasMatch};
use gpudiag_model::sample::now_ms;

pub use parse::{parse_json, parse_text};

/// Where NCCL listens unless `NCCL_RAS_ADDR` says otherwise.
pub const DEFAULT_ADDRESS: &str = "localhost:28028";
/// The protocol version gpudiag speaks (NCCL 2.24 to 2.28 all answer 2).
pub const CLIENT_PROTOCOL: u32 = 2;
/// Seconds RAS may wait for each leg of its own collective over the job (NCCL's default).
pub const DEFAULT_TIMEOUT_S: u32 = 5;
/// NCCL adds as long again before it gives up a whole collective (`RAS_COLLECTIVE_EXTRA_TIMEOUT`).
const NCCL_EXTRA_S: u64 = 5;
/// Time to connect; a local listener accepts at once.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a process may take to answer the handshake before another connection is tried.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections tried for a handshake.
const HANDSHAKE_TRIES: usize = 3;
/// Slack over NCCL's own limits before gpudiag gives up.
const SLACK: Duration = Duration::from_secs(2);
/// The most bytes read of one report: a verbose report of a thousand-rank job is some tens of
/// KiB, a JSON one a few hundred bytes per rank.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The longest one-line reply (`SERVER PROTOCOL 2`, `OK`, `ERROR: ...`).
const MAX_REPLY_LINE: usize = 512;

/// The only commands gpudiag sends: reads. `CONTROL` (which acts job-wide) has no variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    ClientProtocol,
    Timeout(u32),
    SetFormatJson,
    Status,
    VerboseStatus,
}

impl Command {
    fn line(self) -> String {
        match self {
            Command::ClientProtocol => format!("CLIENT PROTOCOL {CLIENT_PROTOCOL}\n"),
            Command::Timeout(s) => format!("TIMEOUT {s}\n"),
            Command::SetFormatJson => "SET FORMAT json\n".to_owned(),
            Command::Status => "STATUS\n".to_owned(),
            Command::VerboseStatus => "VERBOSE STATUS\n".to_owned(),
        }
    }
}

/// One status query.
#[derive(Debug, Clone, PartialEq)]
pub struct RasQuery {
    /// `host:port`, `[v6]:port` or `localhost:port`; names that need DNS are not looked up.
    pub address: String,
    /// What RAS may wait per leg (`TIMEOUT`); at least 1 (0 would disable NCCL's own).
    pub timeout_s: u32,
    /// Ask for JSON first (NCCL 2.28.7+), falling back to text.
    pub prefer_json: bool,
    /// The devices of the job asked about, recorded on the answer.
    pub for_devices: Vec<u32>,
    /// The most bytes read of the report.
    pub max_bytes: usize,
    /// The whole exchange's limit: connecting, the handshake's tries, RAS's own collective (a
    /// leg and its extra), and slack; set from `timeout_s` by [`RasQuery::new`].
    pub deadline: Duration,
}

impl RasQuery {
    pub fn new(address: impl Into<String>, for_devices: Vec<u32>) -> Self {
        RasQuery {
            address: address.into(),
            timeout_s: DEFAULT_TIMEOUT_S,
            prefer_json: true,
            for_devices,
            max_bytes: MAX_ANSWER_BYTES,
            deadline: deadline_for(DEFAULT_TIMEOUT_S),
        }
    }
}

/// The whole exchange's limit for a `TIMEOUT` of `timeout_s`.
pub fn deadline_for(timeout_s: u32) -> Duration {
    CONNECT_TIMEOUT
        + HANDSHAKE_TIMEOUT * HANDSHAKE_TRIES as u32
        + Duration::from_secs(u64::from(timeout_s.max(1)) + NCCL_EXTRA_S)
        + SLACK
}

/// The address NCCL listens on for a process with `NCCL_RAS_ADDR` set to `env` (or unset).
pub fn address_for(env: Option<&str>) -> String {
    env.map(str::trim)
        .filter(|a| !a.is_empty())
        .unwrap_or(DEFAULT_ADDRESS)
        .to_owned()
}

/// Whether `answer` describes the job whose processes are `members` (host pid, device).
pub fn matches_job(answer: &RasAnswer, members: &[(u32, u32)]) -> RasMatch {
    answer.matches_job(members)
}

/// Asks once; always returns an answer, with `not_answered` set where none came.
pub fn query(q: &RasQuery) -> RasAnswer {
    let started = Instant::now();
    let fail = |failure, reason: String| {
        let mut a = RasAnswer::failed(now_ms(), &q.address, q.for_devices.clone(), failure, reason);
        a.took_ms = elapsed_ms(started);
        a
    };
    let addrs = match resolve(&q.address) {
        Ok(a) => a,
        Err(why) => return fail(RasFailure::Io, why),
    };
    let deadline = started + q.deadline;
    // As `ncclras` does: a process that does not answer the handshake within a second (one
    // stopped by SIGSTOP still holds its listening socket, and the kernel may hand it the
    // connection) is left for another connection, which may reach another process.
    let mut tries = 0;
    let (mut conn, protocol) = loop {
        tries += 1;
        let stream = match connect(&addrs, &q.address) {
            Ok(s) => s,
            Err((failure, reason)) => return fail(failure, reason),
        };
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            deadline: deadline.min(Instant::now() + HANDSHAKE_TIMEOUT),
            max_bytes: q.max_bytes,
        };
        match handshake(&mut conn) {
            Ok(protocol) => {
                conn.deadline = deadline;
                break (conn, protocol);
            }
            Err((RasFailure::TimedOut, _)) if tries < HANDSHAKE_TRIES => {}
            Err((RasFailure::TimedOut, _)) => {
                return fail(
                    RasFailure::TimedOut,
                    format!(
                        "no process at {} answered the handshake within {:?} in {tries} \
                         connections (a stopped process may hold the port)",
                        q.address, HANDSHAKE_TIMEOUT
                    ),
                );
            }
            Err((failure, reason)) => return fail(failure, reason),
        }
    };
    match exchange(&mut conn, q) {
        Ok((format, body)) => {
            let mut answer = match format {
                RasFormat::Json => parse_json(&body),
                RasFormat::Text => parse_text(&body),
            };
            answer.time_ms = now_ms();
            answer.took_ms = elapsed_ms(started);
            answer.address = gpudiag_model::ras::clip(&q.address);
            answer.for_devices = q.for_devices.clone();
            answer.protocol = Some(protocol);
            answer
        }
        Err((failure, reason)) => fail(failure, reason),
    }
}

/// A connection to the first of `addrs` that takes one.
fn connect(addrs: &[SocketAddr], address: &str) -> Result<TcpStream, Failed> {
    let mut last_error = None;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last_error = Some(e),
        }
    }
    Err(match last_error {
        Some(e) if e.kind() == ErrorKind::ConnectionRefused => (
            RasFailure::Refused,
            format!(
                "nothing listens at {address} (NCCL's RAS is off, the job is gone, or \
                 NCCL_RAS_ADDR names another address)"
            ),
        ),
        Some(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => (
            RasFailure::TimedOut,
            format!("no connection to {address} within {CONNECT_TIMEOUT:?}"),
        ),
        Some(e) => (RasFailure::Io, format!("connecting to {address}: {e}")),
        None => (
            RasFailure::Io,
            format!("no address to connect to in {address}"),
        ),
    })
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A numeric address, or `localhost`: a name needing DNS could block past any deadline.
fn resolve(address: &str) -> Result<Vec<SocketAddr>, String> {
    if let Ok(a) = address.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let quoted = gpudiag_model::ras::clip(address);
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("RAS address {quoted} names no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("RAS address {quoted} has no valid port"))?;
    if host.eq_ignore_ascii_case("localhost") || host.is_empty() {
        return Ok(vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), port),
        ]);
    }
    Err(format!(
        "RAS address {quoted} is a host name; gpudiag asks numeric addresses only"
    ))
}

type Failed = (RasFailure, String);

/// `CLIENT PROTOCOL` and its answer: the server's protocol version.
fn handshake(conn: &mut Conn) -> Result<u32, Failed> {
    conn.send(Command::ClientProtocol)?;
    let reply = conn.line()?;
    reply
        .get(..16)
        .filter(|p| p.eq_ignore_ascii_case("SERVER PROTOCOL "))
        .and_then(|_| reply[16..].trim().parse::<u32>().ok())
        .ok_or_else(|| unexpected("the handshake", &reply))
}

/// The timeout, the format and the status; the report's bytes to the close.
fn exchange(conn: &mut Conn, q: &RasQuery) -> Result<(RasFormat, Vec<u8>), Failed> {
    // Always first: with a dead peer a status waits out RAS's timeouts, and 0 would disable them.
    conn.send(Command::Timeout(q.timeout_s.max(1)))?;
    let reply = conn.line()?;
    if !reply.trim().eq_ignore_ascii_case("OK") {
        return Err(unexpected("TIMEOUT", &reply));
    }
    let mut format = RasFormat::Text;
    if q.prefer_json {
        conn.send(Command::SetFormatJson)?;
        let reply = conn.line()?;
        if reply.trim().eq_ignore_ascii_case("OK") {
            format = RasFormat::Json;
        } else if !reply.starts_with("ERROR") {
            return Err(unexpected("SET FORMAT", &reply));
        }
        // An NCCL before 2.28.7 answers `ERROR: Unknown command` and goes on in text.
    }
    conn.send(match format {
        RasFormat::Json => Command::Status,
        RasFormat::Text => Command::VerboseStatus,
    })?;
    let body = conn.rest()?;
    Ok((format, body))
}

fn unexpected(stage: &str, reply: &str) -> Failed {
    (
        RasFailure::Malformed,
        format!(
            "unexpected reply to {stage}: {:?}",
            gpudiag_model::ras::clip(reply.trim_end())
        ),
    )
}

/// A connection under one deadline and one byte cap.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    deadline: Instant,
    max_bytes: usize,
}

impl Conn {
    fn remaining(&self) -> Result<Duration, Failed> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        Ok(left)
    }

    fn send(&mut self, c: Command) -> Result<(), Failed> {
        let left = self.remaining()?;
        self.stream
            .set_write_timeout(Some(left))
            .map_err(|e| (RasFailure::Io, format!("socket: {e}")))?;
        self.stream
            .write_all(c.line().as_bytes())
            .map_err(io_failed)
    }

    /// Reads more into the buffer; `false` at the server's close.
    fn fill(&mut self) -> Result<bool, Failed> {
        let left = self.remaining()?;
        self.stream
            .set_read_timeout(Some(left))
            .map_err(|e| (RasFailure::Io, format!("socket: {e}")))?;
        let mut chunk = [0u8; 8192];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    if self.buf.len() + n > self.max_bytes {
                        return Err((
                            RasFailure::TooLarge,
                            format!("the report is longer than {} KiB", self.max_bytes / 1024),
                        ));
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_failed(e)),
            }
        }
    }

    /// One reply line, without its newline.
    fn line(&mut self) -> Result<String, Failed> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return Ok(String::from_utf8_lossy(&line[..end])
                    .trim_end_matches('\r')
                    .to_owned());
            }
            if self.buf.len() > MAX_REPLY_LINE {
                return Err(unexpected(
                    "a command",
                    &String::from_utf8_lossy(&self.buf[..MAX_REPLY_LINE]),
                ));
            }
            if !self.fill()? {
                return Err((
                    RasFailure::Malformed,
                    "the server closed the connection before replying".to_owned(),
                ));
            }
        }
    }

    /// Everything up to the server's close.
    fn rest(&mut self) -> Result<Vec<u8>, Failed> {
        while self.fill()? {}
        Ok(std::mem::take(&mut self.buf))
    }
}

fn timed_out() -> Failed {
    (
        RasFailure::TimedOut,
        "RAS did not finish its report within the deadline".to_owned(),
    )
}

fn io_failed(e: std::io::Error) -> Failed {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => timed_out(),
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => (
            RasFailure::Malformed,
            "the server closed the connection early".to_owned(),
        ),
        _ => (RasFailure::Io, format!("socket: {e}")),
    }
}

/// Runs one query at a time on a thread of its own, for a live backend: `request` starts one
/// unless one runs, `ready` hands over the answer once it came. The polling thread never
/// waits on RAS.
#[derive(Debug, Default)]
pub struct Asker {
    running: Option<std::thread::JoinHandle<RasAnswer>>,
}

impl Asker {
    pub fn request(&mut self, q: RasQuery) {
        if self.running.is_some() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("gpudiag-ras".into())
            .spawn(move || query(&q));
        // Without a thread there is no answer; the next request tries again.
        self.running = spawned.ok();
    }

    /// The answer of the query that finished since the last call, if any.
    pub fn ready(&mut self) -> Vec<RasAnswer> {
        if !self.running.as_ref().is_some_and(|h| h.is_finished()) {
            return Vec::new();
        }
        self.running
            .take()
            .and_then(|h| h.join().ok())
            .into_iter()
            .collect()
    }
}
