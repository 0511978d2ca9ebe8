//! The socket collectors connect to: a `SOCK_SEQPACKET` listener (message boundaries hold, and
//! `SO_PEERCRED` names each sender), read by one thread polling every connection. A sender must
//! be this user's (or root's) and a descendant of the command; every message becomes a
//! [`CollectorMessage`] sent into a bounded channel, and what does not fit is counted, never
//! queued without bound.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gpudiag_model::kernels::CollectorMessage;

use crate::ancestry::{lineage, parent_of};
use crate::wire::{Decoder, MAX_MESSAGE, NameBudget};

/// Connections open at once; more are refused (each costs a file descriptor and its names).
pub const MAX_CONNECTIONS: usize = 1024;
/// Kernel names held across every connection.
pub const NAME_BUDGET_BYTES: usize = 64 << 20;
/// Rejected senders kept by pid; past it only counted.
const MAX_REJECTED_KEPT: usize = 64;

/// Who may send: processes of this user (or root) that descend from one of `roots`, other
/// than `excluded` (gpudiag itself).
///
/// A process that exited before its connection was looked at cannot be placed in the tree any
/// more; it is taken when its uid is ours, and counted apart. Only this user can reach the
/// socket at all (its directory is 0700), so the check keeps other processes' records out of
/// the command's, rather than keeping anyone out.
#[derive(Debug, Clone)]
pub struct Admission {
    pub roots: Vec<u32>,
    pub excluded: Option<u32>,
}

/// What [`Admission::judge`] decided about a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Gone before its ancestry could be read.
    AdmitUnverified,
    Refuse(String),
}

impl Admission {
    pub fn judge(&self, pid: u32, uid: u32) -> Verdict {
        // SAFETY: geteuid takes nothing and cannot fail.
        let ours = unsafe { libc::geteuid() };
        if uid != ours && uid != 0 {
            return Verdict::Refuse(format!("uid {uid}, not gpudiag's {ours}"));
        }
        if Some(pid) == self.excluded {
            return Verdict::Refuse("gpudiag itself".into());
        }
        let mut gone = false;
        for &root in &self.roots {
            match lineage(pid, root) {
                Some(true) => return Verdict::Admit,
                Some(false) => {}
                None => gone = true,
            }
        }
        if gone {
            Verdict::AdmitUnverified
        } else {
            Verdict::Refuse("not a process of the command".into())
        }
    }
}

/// What the listener saw, beside the messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerReport {
    /// Processes whose collector connected and was admitted.
    pub connected: BTreeSet<u32>,
    /// Of those, the ones already gone when their connection was looked at (admitted on their
    /// uid alone).
    pub unverified: BTreeSet<u32>,
    /// Refused senders by pid (the first [`MAX_REJECTED_KEPT`]) and why.
    pub rejected: BTreeMap<u32, String>,
    pub rejected_count: u64,
    /// Connections still waiting when the listener stopped because [`MAX_CONNECTIONS`] were
    /// open all along.
    pub over_limit: u64,
    /// Messages refused as malformed, and the first reason.
    pub malformed: u64,
    pub first_malformed: Option<String>,
    /// Messages gpudiag decoded but could not queue (its consumer was behind).
    pub queue_dropped: u64,
}

/// A bound, listening socket not yet read.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl Socket {
    pub fn bind(path: &Path) -> std::io::Result<Socket> {
        let bytes = path.as_os_str().as_encoded_bytes();
        // SAFETY: a zeroed sockaddr_un is valid; the path is copied within its bounds.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            return Err(std::io::Error::other("socket path too long"));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
            *dst = *src as libc::c_char;
        }
        // SAFETY: plain socket calls on a descriptor we own; addr outlives the call.
        unsafe {
            let raw = libc::socket(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            );
            if raw < 0 {
                return Err(last_error());
            }
            let fd = OwnedFd::from_raw_fd(raw);
            if libc::bind(
                raw,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) != 0
                || libc::listen(raw, 128) != 0
            {
                return Err(last_error());
            }
            Ok(Socket { fd })
        }
    }
}

/// The pid and uid of a connected peer, as the kernel recorded them at connect().
fn peer_credentials(fd: RawFd) -> Option<(u32, u32)> {
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let ok = libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        ) == 0;
        (ok && cred.pid > 0).then_some((cred.pid as u32, cred.uid))
    }
}

struct Connection {
    fd: OwnedFd,
    decoder: Decoder,
}

/// What a read of one connection found.
enum Read {
    Message(usize),
    Truncated,
    Nothing,
    Closed,
}

fn read_one(fd: RawFd, buffer: &mut [u8]) -> Read {
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr() as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    // SAFETY: recvmsg writes at most iov_len bytes into `buffer`; msg lives across the call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let n = libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT);
        if n < 0 {
            return match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Read::Nothing,
                _ => Read::Closed,
            };
        }
        if n == 0 {
            return Read::Closed;
        }
        if msg.msg_flags & libc::MSG_TRUNC != 0 {
            return Read::Truncated;
        }
        Read::Message(n as usize)
    }
}

/// The reading thread and what it shares.
pub struct Listener {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<ListenerReport>>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Starts reading `socket` on a thread of its own; messages go into `sink`.
    pub fn start(
        socket: Socket,
        admission: Admission,
        sink: SyncSender<CollectorMessage>,
        max_connections: usize,
    ) -> std::io::Result<Listener> {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(ListenerReport::default()));
        let thread = {
            let stop = stop.clone();
            let report = report.clone();
            std::thread::Builder::new()
                .name("gpudiag-kernels".into())
                .spawn(move || serve(socket, &admission, &sink, &stop, &report, max_connections))?
        };
        Ok(Listener {
            stop,
            report,
            thread: Some(thread),
        })
    }

    /// Reads what is still queued on every connection, then stops; what it saw.
    pub fn stop(mut self) -> ListenerReport {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.report.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(
    socket: Socket,
    admission: &Admission,
    sink: &SyncSender<CollectorMessage>,
    stop: &AtomicBool,
    report: &Mutex<ListenerReport>,
    max_connections: usize,
) {
    let budget = NameBudget::new(NAME_BUDGET_BYTES);
    let mut connections: Vec<Connection> = Vec::new();
    let mut buffer = vec![0u8; MAX_MESSAGE + 1];
    let mut local = ListenerReport::default();
    let mut consumer_gone = false;
    loop {
        // Once stopping, one last pass reads whatever is queued, without waiting.
        let last_pass = stop.load(Ordering::Relaxed);
        // At the limit, new connections wait in the listen backlog until one closes (a
        // negative descriptor is one poll skips).
        let accepting = connections.len() < max_connections;
        let listening = if accepting { socket.fd.as_raw_fd() } else { -1 };
        let mut fds: Vec<libc::pollfd> = std::iter::once(listening)
            .chain(connections.iter().map(|c| c.fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout = if last_pass { 0 } else { 100 };
        // SAFETY: `fds` is a live array of `fds.len()` pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready < 0 {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if fds[0].revents != 0 || last_pass {
            accept_all(
                &socket,
                admission,
                &budget,
                &mut connections,
                &mut local,
                max_connections,
                last_pass,
            );
        }
        let mut closed = Vec::new();
        for (i, c) in connections.iter_mut().enumerate() {
            // New connections were not polled yet: read them too (reads never block).
            let polled = fds.get(i + 1).map(|p| p.revents);
            if polled == Some(0) && !last_pass {
                continue;
            }
            // A bounded number per turn, so one busy sender cannot starve the others.
            for _ in 0..256 {
                match read_one(c.fd.as_raw_fd(), &mut buffer) {
                    Read::Message(n) => match c.decoder.decode(&buffer[..n]) {
                        Ok(Some(mut message)) if !consumer_gone => {
                            if let CollectorMessage::Hello(hello) = &mut message
                                && let Some(parent) = parent_of(hello.pid)
                            {
                                hello.parent_pid = parent;
                            }
                            match sink.try_send(message) {
                                Ok(()) => {}
                                Err(TrySendError::Full(_)) => local.queue_dropped += 1,
                                Err(TrySendError::Disconnected(_)) => consumer_gone = true,
                            }
                        }
                        Ok(_) => {}
                        Err(why) => {
                            local.malformed += 1;
                            local.first_malformed.get_or_insert(why.0);
                        }
                    },
                    Read::Truncated => {
                        local.malformed += 1;
                        local
                            .first_malformed
                            .get_or_insert_with(|| format!("a message over {MAX_MESSAGE} bytes"));
                    }
                    Read::Nothing => break,
                    Read::Closed => {
                        closed.push(i);
                        break;
                    }
                }
            }
        }
        for i in closed.into_iter().rev() {
            connections.swap_remove(i);
        }
        if let Ok(mut shared) = report.lock() {
            *shared = local.clone();
        }
        if last_pass {
            return;
        }
    }
}

fn accept_all(
    socket: &Socket,
    admission: &Admission,
    budget: &Arc<NameBudget>,
    connections: &mut Vec<Connection>,
    report: &mut ListenerReport,
    max_connections: usize,
    last_pass: bool,
) {
    loop {
        // Left in the backlog, unless this is the end: then they are refused, counted.
        if connections.len() >= max_connections && !last_pass {
            return;
        }
        // SAFETY: accept4 on our listening socket; the returned descriptor is owned at once.
        let raw = unsafe {
            libc::accept4(
                socket.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if raw < 0 {
            return;
        }
        // SAFETY: accept4 returned a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if connections.len() >= max_connections {
            report.over_limit += 1;
            continue;
        }
        let (pid, verdict) = match peer_credentials(raw) {
            Some((pid, uid)) => (pid, admission.judge(pid, uid)),
            None => (
                0,
                Verdict::Refuse("its credentials could not be read".into()),
            ),
        };
        match verdict {
            Verdict::Refuse(why) => {
                report.rejected_count += 1;
                if report.rejected.len() < MAX_REJECTED_KEPT {
                    report.rejected.insert(pid, why);
                }
                continue;
            }
            Verdict::AdmitUnverified => {
                report.unverified.insert(pid);
            }
            Verdict::Admit => {}
        }
        report.connected.insert(pid);
        connections.push(Connection {
            fd,
            decoder: Decoder::new(pid, budget.clone()),
        });
    }
}
