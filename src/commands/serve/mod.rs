//! `gpudiag serve`: the latest telemetry, findings and bottleneck verdicts in Prometheus' text
//! exposition format on `/metrics`.
//!
//! Sampling runs in its own thread and publishes a [`Snapshot`]; a scrape only renders it
//! (`gpudiag_export::prometheus` writes the exposition, `http` serves it, `web_config` reads
//! its TLS and basic-auth settings).

pub mod http;
pub mod web_config;

use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use http::{Guard, serve_connections};

use crate::cli::ServeArgs;
use crate::stop::Stop;
use gpudiag_core::config::Config;
use gpudiag_core::judgement::{Judgement, Span};
use gpudiag_core::pipeline::Pipeline;
use gpudiag_core::session::{JudgingSink, Limit, RunOptions, Session, Setup, Source};
use gpudiag_export::prometheus::Snapshot;
use gpudiag_export::prometheus::process_series::ProcessCap;
use gpudiag_model::error::{Error, exit};
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::EventKind;
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::replay::Pace;

/// Names the node for the `Hostname` label where the host name is a pod's (Kubernetes' downward
/// API: `fieldRef: spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// How long findings remember events (XIDs) in a long-running serve.
const FINDINGS_WINDOW: Duration = Duration::from_secs(600);

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
                s.latest.insert(sample.device, sample.clone());
            }
            s.last_xid.extend(xids);
        }
        self.publish(judged);
        Ok(())
    }
}

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
            let web = web_config::WebConfig::load(path)?;
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
    let session = serving(config)
        .pace(Pace::Recorded { speed: 1.0 })
        .open(&spec)?;
    let Some(source) = session.source() else {
        return Err(Error::Usage("the source holds no telemetry samples".into()));
    };
    let devices = session.devices.clone();
    let mut host = source.backend.host().clone();
    // In a pod the host name is the pod's; the node's comes from the downward API, as
    // dcgm-exporter's DaemonSet passes it.
    if source.is_this_host()
        && let Some(node) = std::env::var(NODE_NAME_ENV).ok().filter(|n| !n.is_empty())
    {
        host.hostname = Some(node);
    }
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
    if let Some(warning) =
        web_config::exposure_warning(addr, guard.tls.is_some(), guard.auth.is_some())
    {
        eprintln!("{warning}");
    }
    serve_connections(&listener, &shared, &stop, &guard);
    let _ = sampling.join();
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::http::{answer_bytes, respond_to, response_bytes};
    use super::*;
    use gpudiag_export::prometheus::CONTENT_TYPE;
    use gpudiag_model::sample::{DeviceInfo, Sample};

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
    fn routes_and_methods() {
        let snap = RwLock::new(snapshot());
        let (code, ctype, body) = respond_to("GET", "/metrics?x=1", &snap);
        assert_eq!((code, ctype), (200, CONTENT_TYPE));
        assert!(body.contains("DCGM_FI_DEV_GPU_UTIL"));
        assert_eq!(respond_to("GET", "/", &snap).0, 404);
        assert_eq!(respond_to("GET", "/metricsx", &snap).0, 404);
        assert_eq!(respond_to("POST", "/metrics", &snap).0, 405);
        assert_eq!(respond_to("PUT", "/metrics", &snap).0, 405);
        // HEAD is GET without the body, which is left out only when the answer is written.
        assert_eq!(
            respond_to("HEAD", "/metrics?x=1", &snap).0,
            respond_to("GET", "/metrics?x=1", &snap).0
        );
        // The absolute form a client sends through a proxy routes by its path.
        for target in [
            "http://localhost:9400/metrics",
            "HTTP://[::1]:9400/metrics?x=1",
            "https://gpu-7.example/metrics",
        ] {
            assert_eq!(respond_to("GET", target, &snap).0, 200, "{target}");
        }
        for target in [
            "http://localhost:9400",
            "http://localhost:9400?x=/metrics",
            "http://host/metricsx",
            "ftp://host/metrics",
            "http:/metrics",
            "*",
        ] {
            assert_eq!(respond_to("GET", target, &snap).0, 404, "{target}");
        }
    }

    #[test]
    fn a_head_answer_is_the_get_answer_without_its_body() {
        let snap = RwLock::new(snapshot());
        let answer = respond_to("HEAD", "/metrics", &snap);
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
