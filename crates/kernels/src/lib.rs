//! `gpudiag run --kernels`: the CUPTI collector gpudiag loads into the command's CUDA processes,
//! the socket it reports on, and the decoding of what it sends into
//! [`gpudiag_model::kernels::CollectorMessage`]s.
//!
//! The collector (collector/collector.c) is C, compiled by build.rs into a shared object that
//! is embedded here and written at run time into a private directory ([`install`]). The
//! command gets three variables ([`child_env`]): `CUDA_INJECTION64_PATH` (the driver loads the
//! collector during `cuInit`), `LD_PRELOAD` (so another CUPTI client's calls, torch.profiler's,
//! reach the collector first and it can step aside for it) and `GPUDIAG_KERNELS_SOCKET`. Each
//! process's collector connects on its own ([`listen`]); its messages ([`wire`]) come out of
//! the channel [`KernelsSession::start`] returns, in the order each process sent them.
//!
//! The record layouts the collector reads are checked (collector/layout_check.c,
//! `scripts/check-cupti-layout`) against the headers of the NVIDIA pip wheels of CUPTI 11.8,
//! 12.0–12.6, 12.8, 12.9 and 13.0–13.5, first releases and updates: API versions 18, 20–24,
//! 26–28, 130000, 130001, 130100, 130101, 130200–130202, 130300, 130301, 130400, 130401 and
//! 130500 (`GD_CHECKED_CUPTI_VERSIONS` in collector/cupti_types.h). For any other version the
//! collector sends `CannotRecord` and records nothing.

pub mod ancestry;
pub mod install;
pub mod listen;
pub mod tally;
pub mod wire;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, sync_channel};

use gpudiag_model::kernels::{CollectorMessage, SampleSchedule};

use crate::install::{PrivateDir, SOCKET_FILE};
use crate::listen::{Admission, Listener, ListenerReport, MAX_CONNECTIONS, Socket};

pub const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";
pub const PRELOAD_VAR: &str = "LD_PRELOAD";
pub const SOCKET_VAR: &str = "GPUDIAG_KERNELS_SOCKET";
/// `ON_MS/PERIOD_MS` under `--kernels=sample`; empty (recording all the time) otherwise, so a
/// value left in gpudiag's own environment does not reach the command's collectors.
pub const SAMPLE_VAR: &str = "GPUDIAG_KERNELS_SAMPLE";

/// Messages queued between the socket and gpudiag's consumer; past it they are counted and
/// dropped (a kernels message holds up to ~680 records, about 54 kB decoded). 1,024 hold about
/// 700,000 records, seconds of the fastest launch loop CUPTI lets run, and 55 MB: at 4,096 a
/// flood faster than the consumer held gpudiag at 262 MB (benches/RESULTS.md, "gpudiag's own
/// memory under a flood of kernels").
pub const QUEUE_MESSAGES: usize = 1024;

/// Why `--kernels` records nothing in this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRecorded {
    /// `CUDA_INJECTION64_PATH` was already set: another tool injects into CUDA, and there is one
    /// such slot.
    AnotherInjector(String),
    /// The collector or its socket could not be set up.
    Setup(String),
}

impl std::fmt::Display for NotRecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRecorded::AnotherInjector(path) => write!(
                f,
                "another tool (e.g. Nsight Systems) already injects into CUDA \
                 ({INJECTION_VAR}={path}): --kernels steps aside"
            ),
            NotRecorded::Setup(why) => write!(f, "--kernels could not set up its collector: {why}"),
        }
    }
}

/// The variables the command gets, given gpudiag's own environment (`current`). Refuses when
/// `CUDA_INJECTION64_PATH` is already set: that tool keeps its slot.
pub fn child_env(
    collector: &Path,
    socket: &Path,
    current: impl Fn(&str) -> Option<OsString>,
) -> Result<Vec<(OsString, OsString)>, NotRecorded> {
    if let Some(other) = current(INJECTION_VAR).filter(|v| !v.is_empty()) {
        return Err(NotRecorded::AnotherInjector(
            other.to_string_lossy().into_owned(),
        ));
    }
    let ours = collector.as_os_str();
    // ld.so takes LD_PRELOAD as a list split at spaces and colons; ours goes first so its
    // CUPTI functions come before libcupti's own.
    let preload = match current(PRELOAD_VAR).filter(|v| !v.is_empty()) {
        Some(existing) => {
            let mut joined = OsString::from(ours);
            joined.push(":");
            joined.push(existing);
            joined
        }
        None => ours.to_owned(),
    };
    Ok(vec![
        (INJECTION_VAR.into(), ours.to_owned()),
        (PRELOAD_VAR.into(), preload),
        (SOCKET_VAR.into(), socket.as_os_str().to_owned()),
        (SAMPLE_VAR.into(), OsString::new()),
    ])
}

/// What the session saw when it stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionReport {
    pub listener: ListenerReport,
}

impl SessionReport {
    /// "the collector loaded in no process" when nothing connected.
    pub fn nothing_connected(&self) -> bool {
        self.listener.connected.is_empty()
    }
}

/// The collector installed, its socket listening, and the variables the command needs.
pub struct KernelsSession {
    dir: PrivateDir,
    env: Vec<(OsString, OsString)>,
    socket: Option<Socket>,
    listener: Option<Listener>,
    sender: Option<std::sync::mpsc::SyncSender<CollectorMessage>>,
}

impl KernelsSession {
    /// Installs the collector and binds its socket, before the command starts. `current`
    /// reads gpudiag's environment.
    pub fn prepare(
        current: impl Fn(&str) -> Option<OsString>,
    ) -> Result<(KernelsSession, Receiver<CollectorMessage>), NotRecorded> {
        if let Some(other) = current(INJECTION_VAR).filter(|v| !v.is_empty()) {
            return Err(NotRecorded::AnotherInjector(
                other.to_string_lossy().into_owned(),
            ));
        }
        let setup = |e: std::io::Error| NotRecorded::Setup(e.to_string());
        let dir = PrivateDir::create().map_err(setup)?;
        let collector = dir.install_collector().map_err(setup)?;
        let socket_path = dir.path().join(SOCKET_FILE);
        let socket = Socket::bind(&socket_path).map_err(setup)?;
        let env = child_env(&collector, &socket_path, current)?;
        let (sender, receiver) = sync_channel(QUEUE_MESSAGES);
        Ok((
            KernelsSession {
                dir,
                env,
                socket: Some(socket),
                listener: None,
                sender: Some(sender),
            },
            receiver,
        ))
    }

    /// The collectors record only in the schedule's windows.
    pub fn sample(&mut self, schedule: SampleSchedule) {
        for (key, value) in &mut self.env {
            if key == SAMPLE_VAR {
                *value = schedule.env_value().into();
            }
        }
    }

    /// The variables to give the command.
    pub fn env(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    pub fn collector_path(&self) -> PathBuf {
        self.dir.path().join(install::COLLECTOR_FILE)
    }

    /// Starts taking collectors once the command runs as `command_pid`: its descendants, and
    /// gpudiag's own (a subreaper adopts what the command leaves behind), but not gpudiag.
    pub fn watch(&mut self, command_pid: u32) -> Result<(), NotRecorded> {
        let (Some(socket), Some(sender)) = (self.socket.take(), self.sender.take()) else {
            return Ok(());
        };
        let me = std::process::id();
        let admission = Admission {
            roots: vec![command_pid, me],
            excluded: Some(me),
        };
        let listener = Listener::start(socket, admission, sender, MAX_CONNECTIONS)
            .map_err(|e| NotRecorded::Setup(e.to_string()))?;
        self.listener = Some(listener);
        Ok(())
    }

    /// Reads what the collectors still had queued, stops, and removes the directory. The
    /// channel ends once this returns.
    pub fn stop(mut self) -> SessionReport {
        let listener = self.listener.take().map(Listener::stop).unwrap_or_default();
        SessionReport { listener }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| OsString::from(v))
        }
    }

    fn value(env: &[(OsString, OsString)], key: &str) -> String {
        env.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    #[test]
    fn the_command_gets_the_collector_the_preload_and_the_socket() {
        let so = Path::new("/run/user/1000/gpudiag-kernels-1/libgpudiag_collector.so");
        let sock = Path::new("/run/user/1000/gpudiag-kernels-1/collector.sock");
        let env = child_env(so, sock, env_of(&[])).unwrap();
        assert_eq!(value(&env, INJECTION_VAR), so.to_str().unwrap());
        assert_eq!(value(&env, PRELOAD_VAR), so.to_str().unwrap());
        assert_eq!(value(&env, SOCKET_VAR), sock.to_str().unwrap());
        // Recording in full unless sampling is asked for, whatever gpudiag's environment says.
        let env = child_env(so, sock, env_of(&[(SAMPLE_VAR, "1/2")])).unwrap();
        assert_eq!(value(&env, SAMPLE_VAR), "");
        // An existing preload list (ld.so splits at spaces and colons) keeps all it had, after
        // ours.
        let env = child_env(
            so,
            sock,
            env_of(&[(PRELOAD_VAR, "liba.so libb.so:libc.so")]),
        )
        .unwrap();
        assert_eq!(
            value(&env, PRELOAD_VAR),
            format!("{}:liba.so libb.so:libc.so", so.display())
        );
        // An empty one is no list.
        let env = child_env(so, sock, env_of(&[(PRELOAD_VAR, ""), (INJECTION_VAR, "")])).unwrap();
        assert_eq!(value(&env, PRELOAD_VAR), so.to_str().unwrap());
        assert_eq!(value(&env, INJECTION_VAR), so.to_str().unwrap());
    }

    #[test]
    fn another_injector_keeps_its_slot() {
        let so = Path::new("/tmp/x/libgpudiag_collector.so");
        let nsys = "/opt/nvidia/nsight-systems/target-linux-x64/libToolsInjection64.so";
        let refused =
            child_env(so, Path::new("/tmp/x/s"), env_of(&[(INJECTION_VAR, nsys)])).unwrap_err();
        assert_eq!(refused, NotRecorded::AnotherInjector(nsys.into()));
        assert!(refused.to_string().contains("--kernels steps aside"));
        assert!(matches!(
            KernelsSession::prepare(env_of(&[(INJECTION_VAR, nsys)])),
            Err(NotRecorded::AnotherInjector(_))
        ));
    }

    #[test]
    fn a_session_removes_its_directory_when_it_stops() {
        let (mut session, messages) = KernelsSession::prepare(env_of(&[])).unwrap();
        session.sample(SampleSchedule::DEFAULT);
        assert_eq!(value(session.env(), SAMPLE_VAR), "1000/30000");
        let so = session.collector_path();
        assert!(so.exists());
        session.watch(std::process::id()).unwrap();
        let report = session.stop();
        assert!(report.nothing_connected());
        assert!(!so.exists());
        assert!(so.parent().is_some_and(|d| !d.exists()));
        // The channel ends with the session.
        assert!(messages.recv().is_err());
    }
}
