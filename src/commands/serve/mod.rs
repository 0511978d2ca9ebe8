//! `gpudiag serve`: the latest telemetry, findings and bottleneck verdicts in Prometheus' text
//! exposition format on `/metrics`.
//!
//! Sampling runs in its own thread and publishes a [`Snapshot`]; a scrape only renders it
//! (`gpudiag_export::prometheus` writes the exposition, `gpudiag_http` serves it and reads
//! `--web.config.file`'s TLS and basic-auth settings).

use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpudiag_http::server::{Guard, Metrics, serve_connections};
use gpudiag_http::web_config::{LoadError, WebConfig};

use crate::cli::ServeArgs;
use crate::stop::Stop;
use gpudiag_core::config::Config;
use gpudiag_core::judgement::{Judgement, Span};
use gpudiag_core::pipeline::Pipeline;
use gpudiag_core::session::{JudgingSink, Limit, RunOptions, Session, Setup, Source};
use gpudiag_export::prometheus::process_series::ProcessCap;
use gpudiag_export::prometheus::{CONTENT_TYPE, Snapshot, render};
use gpudiag_model::error::{Error, exit};
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{Absent, EventKind, Sample};
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::replay::Pace;

/// Names the node for the `Hostname` label where the host name is a pod's (Kubernetes' downward
/// API: `fieldRef: spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// How long findings remember events (XIDs) in a long-running serve.
const FINDINGS_WINDOW: Duration = Duration::from_secs(600);

/// `/metrics`: the snapshot in Prometheus' text exposition format, rendered at each scrape.
pub struct Exposition(pub Arc<RwLock<Snapshot>>);

impl Metrics for Exposition {
    fn content_type(&self) -> &'static str {
        CONTENT_TYPE
    }

    fn render(&self) -> String {
        match self.0.read() {
            Ok(s) => render(&s, Instant::now()),
            // A panic while holding the lock left the snapshot as it was; it is still a snapshot.
            Err(poisoned) => render(&poisoned.into_inner(), Instant::now()),
        }
    }
}

/// Publishes every tick into the snapshot scrapes read: the latest samples, XIDs, and what is
/// wrong now (the judgement's active findings, not everything ever raised).
struct SnapshotSink {
    shared: Arc<RwLock<Snapshot>>,
}

impl SnapshotSink {
    /// Puts a judgement's active findings and its verdicts into the snapshot.
    fn publish(&self, judged: Judgement) {
        let findings: Vec<Finding> = judged.active().cloned().collect();
        let mut s = self.shared.write().unwrap_or_else(|p| p.into_inner());
        s.findings = findings;
        s.verdicts = judged.verdicts;
        s.jobs = judged.jobs;
    }
}

impl JudgingSink for SnapshotSink {
    // Judged by the session before this is called, outside the lock: a scrape waits only for
    // the copy.
    fn on_judged(&mut self, tick: &Tick, judged: Judgement, _: &Pipeline) -> Result<(), Error> {
        let now = Instant::now();
        let xids: Vec<(u32, u64)> = tick
            .events
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Xid { xid } => Some((e.device?, xid)),
                _ => None,
            })
            .collect();
        {
            let mut s = self.shared.write().unwrap_or_else(|p| p.into_inner());
            for sample in &tick.samples {
                s.received.insert(sample.device, now);
                let mut sample = sample.clone();
                if let Some(before) = s.latest.get(&sample.device) {
                    keep_known_processes(&mut sample, before);
                }
                s.latest.insert(sample.device, sample);
            }
            s.last_xid.extend(xids);
        }
        self.publish(judged);
        Ok(())
    }
}

/// A sample whose process list was not read this tick (a slow field with its own cadence: a
/// recording may hold one every few seconds) keeps the last one read, as the live sampler
/// does between its reads; without it the job info and process series would come and go
/// between scrapes while the job verdict stays. Any other reason (no permission, the GPU lost,
/// a read gone stale) says the list is not known now, and stands.
fn keep_known_processes(sample: &mut Sample, before: &Sample) {
    if sample.processes.is_none()
        && sample.why_absent(PROCESSES) == Some(&Absent::NotYetRead)
        && before.processes.is_some()
    {
        sample.processes.clone_from(&before.processes);
        sample.absent.remove(PROCESSES);
    }
}

/// The sample field `keep_known_processes` carries over.
const PROCESSES: &str = "processes";

/// How `serve` sets its session up: this host's kernel-log XIDs from before serve started (a
/// job that died earlier) and its libraries; findings remember events for a window only.
fn serving(config: &Config) -> Setup<'_> {
    Session::setup(config)
        .with_kernel_log("before serve started")
        .with_libraries()
        .retaining(FINDINGS_WINDOW)
}

/// Feeds the session's source through its pipeline into the snapshot until it ends or `stop`
/// is set.
fn sample_into(
    mut session: Session,
    interval: Duration,
    shared: Arc<RwLock<Snapshot>>,
    stop: Arc<AtomicBool>,
) {
    let mut sink = SnapshotSink {
        shared: shared.clone(),
    };
    let opts = RunOptions {
        interval,
        limit: Limit::None,
        stop: Some(&stop),
    };
    match session.run_judging(&opts, &mut sink) {
        Ok(None) => {}
        Ok(Some(e)) => stopped(&e.to_string()),
        Err(e) => stopped(&e.to_string()),
    }
    // The source ended: what it held is judged as a whole, as `check` judges it, and stays
    // served.
    if session.pipeline.tick_count() > 0 {
        sink.publish(session.judge(Span::whole(), None));
    }
    let mut s = shared.write().unwrap_or_else(|p| p.into_inner());
    s.source_ended = true;
}

/// What `serve` publishes for a source that ends by itself (a recording), once it has played
/// out: the snapshot scrapes read, with no server. It lets `serve`'s findings and verdicts be
/// compared with the other views of the same data.
pub fn snapshot_at_end(source: Source, config: &Config) -> Snapshot {
    let host = source.backend.host().clone();
    let devices = source.devices();
    let session = serving(config).over(source);
    let shared = Arc::new(RwLock::new(Snapshot {
        host,
        devices,
        ..Snapshot::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    sample_into(session, Duration::from_millis(100), shared.clone(), stop);
    let snapshot = shared.read().unwrap_or_else(|p| p.into_inner());
    snapshot.clone()
}

/// Says on stderr why sampling ended; the reason may quote a recording, so it is escaped.
fn stopped(why: &str) {
    eprintln!(
        "gpudiag: sampling stopped: {}; serving the last values",
        gpudiag_model::printable::line(why)
    );
}

/// `gpudiag serve`: runs until `stop` (Ctrl-C or SIGTERM).
pub fn serve(args: &ServeArgs, stop: &Stop, config: &Config) -> Result<i32, Error> {
    let stop = stop.flag();
    // Before anything else: a bad web config must fail at once, not after the GPUs are opened.
    let guard = match &args.web_config_file {
        None => Guard::default(),
        Some(path) => {
            let web = WebConfig::load(path).map_err(|e| match e {
                LoadError::Read { path, source } => {
                    Error::io(format!("cannot read {}", path.display()), source)
                }
                invalid @ LoadError::Invalid { .. } => Error::Usage(invalid.to_string()),
            })?;
            let tls = web
                .server_config()
                .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
            Guard {
                tls,
                auth: web.basic_auth().map(Arc::new),
            }
        }
    };
    let spec = args.source.spec()?;
    // In a pod the host name is the pod's; the node's comes from the downward API, as
    // dcgm-exporter's DaemonSet passes it.
    let session = serving(config)
        .pace(Pace::Recorded { speed: 1.0 })
        .named_node(std::env::var(NODE_NAME_ENV).ok())
        .open(&spec)?;
    if session.source().is_none() {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    }
    let devices = session.devices.clone();
    let host = session.host().clone();
    let shared = Arc::new(RwLock::new(Snapshot {
        host,
        devices: devices.clone(),
        process_cap: ProcessCap(args.max_process_series),
        ..Snapshot::default()
    }));
    let listener = TcpListener::bind(args.listen)
        .map_err(|e| Error::CannotRun(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::CannotRun(format!("cannot listen on {}: {e}", args.listen)))?;
    // Non-blocking accept, so the loop notices `stop` (Ctrl-C) within one poll.
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::CannotRun(format!("cannot listen on {addr}: {e}")))?;
    let interval = args.interval;
    let sampling = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("gpudiag-snapshot".into())
            .spawn(move || sample_into(session, interval, shared, stop))
            .map_err(|e| Error::CannotRun(format!("cannot start the sampling thread: {e}")))?
    };
    let scheme = if guard.tls.is_some() { "https" } else { "http" };
    let auth = if guard.auth.is_some() {
        ", basic auth"
    } else {
        ""
    };
    eprintln!("gpudiag: serving metrics on {scheme}://{addr}/metrics{auth} (Ctrl-C to stop)");
    if let Some(warning) = exposure_warning(addr, guard.tls.is_some(), guard.auth.is_some()) {
        eprintln!("{warning}");
    }
    serve_connections(&listener, Arc::new(Exposition(shared)), &stop, &guard);
    let _ = sampling.join();
    Ok(exit::OK)
}

/// What `serve` prints when it listens beyond loopback without both TLS and a password: what
/// anyone who reaches the port can read, and how to close it.
fn exposure_warning(addr: std::net::SocketAddr, tls: bool, auth: bool) -> Option<String> {
    let ip = addr.ip();
    let loopback = match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    };
    if loopback || (tls && auth) {
        return None;
    }
    let reach = if ip.is_unspecified() {
        "every network interface of this host".to_owned()
    } else {
        format!("{ip}, beyond loopback")
    };
    let gap = match (tls, auth) {
        (false, false) => "with no TLS and no password: anyone who can reach the port can read",
        (true, false) => "over TLS but with no password: anyone who can reach the port can read",
        _ => {
            "with a password but no TLS: the password and the metrics cross the network in \
              clear text, and anyone on the path can read"
        }
    };
    Some(format!(
        "gpudiag: warning: serving on {reach} {gap} /metrics, which carries this host's name, \
         the driver version, each GPU's model, UUID and PCI bus id, its telemetry, and the ids \
         of active findings. Protect it with --web.config.file (TLS and basic auth, as in \
         Prometheus exporters; see the README), a firewall, or --listen 127.0.0.1:PORT."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_http::server::respond_to;
    use gpudiag_model::sample::DeviceInfo;

    fn snapshot() -> Snapshot {
        let sample = Sample {
            gpu_util_pct: Some(99.0),
            ..Sample::new(0, 1000)
        };
        Snapshot {
            devices: vec![DeviceInfo::default()],
            latest: [(0, sample)].into_iter().collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn metrics_is_the_snapshots_exposition() {
        let exposition = Exposition(Arc::new(RwLock::new(snapshot())));
        let (code, ctype, body) = respond_to("GET", "/metrics?x=1", &exposition);
        assert_eq!((code, ctype), (200, CONTENT_TYPE));
        assert!(body.contains("DCGM_FI_DEV_GPU_UTIL"));
    }

    /// A recording reads processes every few ticks: between reads the last list stands, so
    /// every scrape names the GPU's job; a list that could not be read is not carried over.
    #[test]
    fn a_tick_without_a_process_read_keeps_the_last_list() {
        use gpudiag_model::sample::ProcessSample;
        let read = Sample {
            processes: Some(vec![ProcessSample {
                pid: 7,
                name: Some("python3".into()),
                user: None,
                kind: None,
                used_memory_bytes: Some(1 << 30),
                sm_util_pct: None,
                container_id: None,
                container_pid: None,
                cpu_time_s: None,
                attribution: None,
                launch: None,
                state: None,
                started_ms: None,
            }]),
            ..Sample::new(0, 1000)
        };
        let mut between = Sample::new(0, 2000);
        between.absent.insert(PROCESSES.into(), Absent::NotYetRead);
        keep_known_processes(&mut between, &read);
        assert_eq!(between.processes, read.processes);
        assert_eq!(between.why_absent(PROCESSES), None);

        let mut denied = Sample::new(0, 3000);
        denied.absent.insert(PROCESSES.into(), Absent::NoPermission);
        keep_known_processes(&mut denied, &read);
        assert_eq!(denied.processes, None);
        assert_eq!(denied.why_absent(PROCESSES), Some(&Absent::NoPermission));
    }

    #[test]
    fn exposure_is_warned_beyond_loopback_unless_tls_and_auth() {
        let at = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        for quiet in ["127.0.0.1:9835", "[::1]:9835", "[::ffff:127.0.0.1]:9835"] {
            assert_eq!(exposure_warning(at(quiet), false, false), None, "{quiet}");
        }
        assert_eq!(exposure_warning(at("0.0.0.0:9835"), true, true), None);
        let w = exposure_warning(at("0.0.0.0:9835"), false, false).unwrap();
        assert!(w.contains("every network interface"), "{w}");
        assert!(w.contains("UUID") && w.contains("--web.config.file"), "{w}");
        let w = exposure_warning(at("10.1.2.3:9835"), false, true).unwrap();
        assert!(w.contains("10.1.2.3") && w.contains("clear text"), "{w}");
        let w = exposure_warning(at("[::]:9835"), true, false).unwrap();
        assert!(w.contains("no password"), "{w}");
    }
}
