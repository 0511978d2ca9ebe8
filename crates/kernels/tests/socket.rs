//! The collectors' socket, driven from this test process as a collector would: who is let in,
//! and hostile input on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::Duration;

use gpudiag_kernels::listen::{Admission, Listener, ListenerReport, Socket};
use gpudiag_kernels::wire::encode;
use gpudiag_model::kernels::{ClockPair, CollectorMessage};

const CLOCK: ClockPair = ClockPair {
    cupti_ns: 1,
    unix_ns: 2,
};

fn connect(path: &Path) -> OwnedFd {
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: plain socket calls; addr outlives connect.
    unsafe {
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let r = libc::connect(
            fd,
            &addr as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(fd)
    }
}

fn send(fd: &OwnedFd, bytes: &[u8]) {
    // SAFETY: send reads `bytes` only.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            bytes.as_ptr() as *const libc::c_void,
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    assert_eq!(
        n,
        bytes.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

struct Setup {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    listener: Listener,
    messages: Receiver<CollectorMessage>,
}

fn listen(admission: Admission, queue: usize, max_connections: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let socket = Socket::bind(&path).unwrap();
    let (tx, messages) = sync_channel(queue);
    let listener = Listener::start(socket, admission, tx, max_connections).unwrap();
    Setup {
        _dir: dir,
        path,
        listener,
        messages,
    }
}

fn us() -> Admission {
    Admission {
        roots: vec![std::process::id()],
        excluded: None,
    }
}

fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn hostile_messages_are_counted_and_the_connection_still_serves() {
    let s = listen(us(), 64, 16);
    let c = connect(&s.path);
    send(&c, b"nonsense");
    send(&c, &[0u8; 70_000]); // over the largest message: truncated on receipt
    let mut bad_magic = encode::goodbye(1);
    bad_magic[0] = 0;
    send(&c, &bad_magic);
    send(&c, &encode::header(3, 1, u32::MAX)); // absurd count, no body
    send(&c, &encode::goodbye(1));
    drop(c);
    settle();
    let report: ListenerReport = s.listener.stop();
    let got: Vec<CollectorMessage> = s.messages.try_iter().collect();
    assert_eq!(
        got,
        vec![CollectorMessage::Goodbye {
            pid: std::process::id()
        }]
    );
    assert_eq!(report.malformed, 4);
    assert!(report.first_malformed.is_some());
    assert!(report.connected.contains(&std::process::id()));
}

#[test]
fn a_process_outside_the_command_is_refused() {
    // The command is a `sleep`: this test process is its parent, not its descendant.
    let mut command = std::process::Command::new("sleep")
        .arg("10")
        .spawn()
        .unwrap();
    let s = listen(
        Admission {
            roots: vec![command.id()],
            excluded: None,
        },
        64,
        16,
    );
    let c = connect(&s.path);
    send(&c, &encode::goodbye(1));
    settle();
    let report = s.listener.stop();
    let _ = command.kill();
    let _ = command.wait();
    assert!(report.connected.is_empty());
    assert_eq!(report.rejected_count, 1);
    assert_eq!(
        report.rejected.get(&std::process::id()).map(String::as_str),
        Some("not a process of the command")
    );
    assert_eq!(s.messages.try_iter().count(), 0);
}

#[test]
fn gpudiag_itself_is_refused() {
    let me = std::process::id();
    let s = listen(
        Admission {
            roots: vec![me],
            excluded: Some(me),
        },
        64,
        16,
    );
    let _c = connect(&s.path);
    settle();
    let report = s.listener.stop();
    assert_eq!(
        report.rejected.get(&me).map(String::as_str),
        Some("gpudiag itself")
    );
}

#[test]
fn many_connections_cost_no_more_than_the_open_ones() {
    let s = listen(us(), 100_000, 16);
    // 20,000 connections one after another, each saying goodbye: all served, none kept.
    for _ in 0..20_000 {
        let c = connect(&s.path);
        send(&c, &encode::goodbye(1));
    }
    // Then 40 held open at once, against a limit of 16.
    let held: Vec<OwnedFd> = (0..40).map(|_| connect(&s.path)).collect();
    settle();
    let report = s.listener.stop();
    drop(held);
    assert_eq!(s.messages.try_iter().count(), 20_000);
    assert_eq!(report.over_limit, 24);
}

#[test]
fn a_consumer_that_falls_behind_costs_counted_messages_not_memory() {
    let s = listen(us(), 2, 16);
    let c = connect(&s.path);
    for _ in 0..10 {
        send(&c, &encode::syncs(1, CLOCK, &[(1, 2, 3, 4, 5, 3, 6)]));
    }
    settle();
    let report = s.listener.stop();
    assert_eq!(s.messages.try_iter().count(), 2);
    assert_eq!(report.queue_dropped, 8);
}

#[test]
fn what_is_queued_when_stopping_is_still_read() {
    let s = listen(us(), 1000, 16);
    let c = connect(&s.path);
    for _ in 0..100 {
        send(&c, &encode::goodbye(1));
    }
    // No pause: stop() itself reads what is waiting.
    let report = s.listener.stop();
    assert_eq!(s.messages.try_iter().count(), 100);
    assert_eq!(report.malformed, 0);
}
