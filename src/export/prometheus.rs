//! Prometheus export (`gpudiag serve`): the latest telemetry and findings in the text
//! exposition format on `/metrics`.
//!
//! Names follow dcgm-exporter's default counters where one exists (same name, unit and type), so
//! dashboards built for it work; labels are dcgm-exporter's `gpu`, `UUID`, `pci_bus_id`,
//! `modelName` and `Hostname`. gpudiag's own series start with `gpudiag_`. A value the GPU did
//! not report is left out, never written as 0.
//!
//! Sampling runs in its own thread and publishes a [`Snapshot`]; a scrape only renders it. One
//! thread accepts connections and reads request heads from all of them with `poll` (at most
//! `MAX_PENDING` at once, the oldest answered 503 when more come); a head parsed by `httparse`
//! (with a size limit) goes to a thread of its own that writes the answer (at most
//! `MAX_CONNECTIONS`). Every exchange has a deadline. So silent, trickling or malformed clients
//! cost a descriptor for at most `REQUEST_TIMEOUT`, never a thread, and cannot keep a scraper
//! waiting: a thread per connection (the first design) let 64 silent connections, opened again
//! as they timed out, lock every scrape out. tiny_http was tried first: it has no request
//! timeouts, and its thread pool can queue a new connection behind stalled ones, which is the
//! stall this design must not have.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::cli::ServeArgs;
use gpudiag_core::config::Config;
use gpudiag_core::rules::{Finding, Severity};
use gpudiag_core::session::{
    self, Limit, Pipeline, RunOptions, Sink, Source, engine_for, open_source, with_recorded,
};
use gpudiag_model::decode::THROTTLE_REASONS;
use gpudiag_model::error::Error;
use gpudiag_telemetry::replay::Pace;
use gpudiag_telemetry::{DeviceInfo, EventKind, HostInfo, Sample, Tick};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
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
/// How long findings remember events (XIDs) in a long-running serve.
const FINDINGS_WINDOW: Duration = Duration::from_secs(600);

/// What a scrape shows: the newest state of every device.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub host: HostInfo,
    pub devices: Vec<DeviceInfo>,
    pub latest: BTreeMap<u32, Sample>,
    /// When each device's latest sample arrived here, for `gpudiag_sample_age_seconds`.
    pub received: BTreeMap<u32, Instant>,
    /// The last XID seen per device (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
    pub last_xid: BTreeMap<u32, u64>,
    pub findings: Vec<Finding>,
    /// The source ended (a replay played out, or live sampling failed); values are the last ones.
    pub source_ended: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// Writes metric families in the text exposition format.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// One family: HELP and TYPE lines, then its samples. A family without samples is left
    /// out entirely.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str, samples: &[(Labels, f64)]) {
        let samples: Vec<&(Labels, f64)> = samples.iter().filter(|(_, v)| v.is_finite()).collect();
        if samples.is_empty() {
            return;
        }
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        for (labels, value) in samples {
            self.out.push_str(name);
            if !labels.is_empty() {
                self.out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
                }
                self.out.push('}');
            }
            let _ = writeln!(self.out, " {}", format_value(*value));
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Label values escape backslash, double quote and line feed.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes backslash and line feed.
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Integers without a fraction; everything else in Rust's shortest round-trip form.
pub fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// dcgm-exporter's label set for a device; unknown values are left out.
fn device_labels(d: &DeviceInfo, host: &HostInfo) -> Labels {
    let mut l: Labels = vec![("gpu", d.index.to_string())];
    if let Some(u) = &d.uuid {
        l.push(("UUID", u.clone()));
    }
    if let Some(b) = &d.pci_bus_id {
        l.push(("pci_bus_id", b.clone()));
    }
    if let Some(n) = &d.name {
        l.push(("modelName", n.clone()));
    }
    if let Some(h) = &host.hostname {
        l.push(("Hostname", h.clone()));
    }
    l
}

type Getter = fn(&Sample) -> Option<f64>;

const MIB: f64 = 1024.0 * 1024.0;

/// (name, type, help, value) of every per-sample series.
const SERIES: &[(&str, Kind, &str, Getter)] = &[
    (
        "DCGM_FI_DEV_GPU_UTIL",
        Kind::Gauge,
        "GPU utilization (in %).",
        |s| s.gpu_util_pct,
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        Kind::Gauge,
        "Memory utilization (in %).",
        |s| s.mem_util_pct,
    ),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        Kind::Gauge,
        "Encoder utilization (in %).",
        |s| s.encoder_util_pct,
    ),
    (
        "DCGM_FI_DEV_DEC_UTIL",
        Kind::Gauge,
        "Decoder utilization (in %).",
        |s| s.decoder_util_pct,
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        Kind::Gauge,
        "Framebuffer memory used (in MiB).",
        |s| s.mem_used_bytes.map(|b| (b as f64 / MIB).round()),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        Kind::Gauge,
        "Framebuffer memory free (in MiB).",
        |s| s.mem_free_bytes.map(|b| (b as f64 / MIB).round()),
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        Kind::Gauge,
        "Power draw (in W).",
        |s| s.power_w,
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        Kind::Counter,
        "Total energy consumption since boot (in mJ).",
        |s| s.energy_j.map(|j| (j * 1000.0).round()),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        Kind::Gauge,
        "GPU temperature (in C).",
        |s| s.temp_gpu_c,
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        Kind::Gauge,
        "Memory temperature (in C).",
        |s| s.temp_mem_c,
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        Kind::Gauge,
        "SM clock frequency (in MHz).",
        |s| s.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        Kind::Gauge,
        "Memory clock frequency (in MHz).",
        |s| s.mem_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        Kind::Counter,
        "Total number of PCIe retries.",
        |s| s.pcie_replay_count.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        Kind::Counter,
        "Total number of single-bit volatile ECC errors.",
        |s| s.ecc_corrected_volatile.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        Kind::Counter,
        "Total number of double-bit volatile ECC errors.",
        |s| s.ecc_uncorrected_volatile.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        Kind::Counter,
        "Total number of single-bit persistent ECC errors.",
        |s| s.ecc_corrected_aggregate.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        Kind::Counter,
        "Total number of double-bit persistent ECC errors.",
        |s| s.ecc_uncorrected_aggregate.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        Kind::Counter,
        "Total number of retired pages due to single-bit errors.",
        |s| s.retired_pages_sbe.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        Kind::Counter,
        "Total number of retired pages due to double-bit errors.",
        |s| s.retired_pages_dbe.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Kind::Counter,
        "Number of remapped rows for uncorrectable errors",
        |s| s.remapped_rows_uncorrectable.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        Kind::Counter,
        "Number of remapped rows for correctable errors",
        |s| s.remapped_rows_correctable.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Kind::Gauge,
        "Whether remapping of rows has failed",
        |s| s.remapped_rows_failure.map(|b| f64::from(u8::from(b))),
    ),
    (
        "gpudiag_pcie_rx_bytes_per_second",
        Kind::Gauge,
        "PCIe receive throughput (bytes/s), as NVML measures it over about 20 ms.",
        |s| s.pcie_rx_bytes_per_s,
    ),
    (
        "gpudiag_pcie_tx_bytes_per_second",
        Kind::Gauge,
        "PCIe transmit throughput (bytes/s), as NVML measures it over about 20 ms.",
        |s| s.pcie_tx_bytes_per_s,
    ),
    (
        "gpudiag_pcie_link_generation",
        Kind::Gauge,
        "Current PCIe link generation.",
        |s| s.pcie_gen.map(f64::from),
    ),
    (
        "gpudiag_pcie_link_generation_max",
        Kind::Gauge,
        "Maximum PCIe link generation.",
        |s| s.pcie_gen_max.map(f64::from),
    ),
    (
        "gpudiag_pcie_link_width",
        Kind::Gauge,
        "Current PCIe link width (lanes).",
        |s| s.pcie_width.map(f64::from),
    ),
    (
        "gpudiag_pcie_link_width_max",
        Kind::Gauge,
        "Maximum PCIe link width (lanes).",
        |s| s.pcie_width_max.map(f64::from),
    ),
    (
        "gpudiag_power_limit_watts",
        Kind::Gauge,
        "Enforced power limit (W).",
        |s| s.power_limit_w,
    ),
    (
        "gpudiag_performance_state",
        Kind::Gauge,
        "Performance state (0 is P0, fastest).",
        |s| s.pstate.map(f64::from),
    ),
    (
        "gpudiag_fan_speed_percent",
        Kind::Gauge,
        "Fan speed (in %).",
        |s| s.fan_pct,
    ),
    (
        "gpudiag_temperature_slowdown_celsius",
        Kind::Gauge,
        "Temperature at which the GPU slows down (in C).",
        |s| s.temp_slowdown_c,
    ),
];

/// Renders a snapshot; `now` dates the sample ages.
pub fn render(snap: &Snapshot, now: Instant) -> String {
    let mut x = Exposition::default();
    let devices: Vec<(&DeviceInfo, &Sample, Labels)> = snap
        .devices
        .iter()
        .filter_map(|d| {
            let s = snap.latest.get(&d.index)?;
            Some((d, s, device_labels(d, &snap.host)))
        })
        .collect();
    for (name, kind, help, get) in SERIES {
        let samples: Vec<(Labels, f64)> = devices
            .iter()
            .filter_map(|(_, s, l)| Some((l.clone(), get(s)?)))
            .collect();
        x.family(name, *kind, help, &samples);
    }
    let xids: Vec<(Labels, f64)> = devices
        .iter()
        .filter_map(|(d, _, l)| Some((l.clone(), *snap.last_xid.get(&d.index)? as f64)))
        .collect();
    x.family(
        "DCGM_FI_DEV_XID_ERRORS",
        Kind::Gauge,
        "Value of the last XID error encountered.",
        &xids,
    );

    let mut throttle = Vec::new();
    for (_, s, l) in &devices {
        let Some(bits) = s.throttle_reasons else {
            continue;
        };
        let mut names: Vec<(u64, String)> = THROTTLE_REASONS
            .iter()
            .map(|(b, n)| (*b, (*n).to_string()))
            .collect();
        // Bits NVML defines but this build does not name still get a series while set.
        for bit in (0..64).map(|i| 1u64 << i) {
            if bits & bit != 0 && !names.iter().any(|(b, _)| *b == bit) {
                names.push((bit, format!("unknown_{bit:#x}")));
            }
        }
        for (bit, name) in names {
            let mut labels = l.clone();
            labels.push(("reason", name));
            throttle.push((labels, f64::from(u8::from(bits & bit != 0))));
        }
    }
    x.family(
        "gpudiag_throttle_reason",
        Kind::Gauge,
        "1 while this clock-event (throttle) reason is active, else 0.",
        &throttle,
    );

    let ages: Vec<(Labels, f64)> = devices
        .iter()
        .filter_map(|(d, _, l)| {
            let at = snap.received.get(&d.index)?;
            Some((l.clone(), now.saturating_duration_since(*at).as_secs_f64()))
        })
        .collect();
    x.family(
        "gpudiag_sample_age_seconds",
        Kind::Gauge,
        "Seconds since gpudiag last read this GPU.",
        &ages,
    );

    let mut active: Vec<(Labels, f64)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for f in &snap.findings {
        if !seen.insert((f.id.clone(), f.device)) {
            continue;
        }
        let mut labels = match f
            .device
            .and_then(|i| snap.devices.iter().find(|d| d.index == i))
        {
            Some(d) => device_labels(d, &snap.host),
            None => {
                let mut l: Labels = Vec::new();
                if let Some(i) = f.device {
                    l.push(("gpu", i.to_string()));
                }
                if let Some(h) = &snap.host.hostname {
                    l.push(("Hostname", h.clone()));
                }
                l
            }
        };
        labels.push(("id", f.id.clone()));
        labels.push(("severity", f.severity.to_string()));
        active.push((labels, 1.0));
    }
    x.family(
        "gpudiag_finding",
        Kind::Gauge,
        "1 for each active finding, labelled by its id and severity.",
        &active,
    );
    let counts: Vec<(Labels, f64)> = [Severity::Info, Severity::Warn, Severity::Fail]
        .into_iter()
        .map(|sev| {
            let mut l: Labels = Vec::new();
            if let Some(h) = &snap.host.hostname {
                l.push(("Hostname", h.clone()));
            }
            l.push(("severity", sev.to_string()));
            let n = snap.findings.iter().filter(|f| f.severity == sev).count();
            (l, n as f64)
        })
        .collect();
    x.family(
        "gpudiag_findings",
        Kind::Gauge,
        "Number of active findings of each severity.",
        &counts,
    );
    let mut info: Labels = vec![("version", env!("CARGO_PKG_VERSION").to_string())];
    if let Some(h) = &snap.host.hostname {
        info.push(("Hostname", h.clone()));
    }
    if let Some(v) = &snap.host.driver_version {
        info.push(("driver_version", v.clone()));
    }
    x.family(
        "gpudiag_info",
        Kind::Gauge,
        "Always 1; the labels say which gpudiag and driver serve these metrics.",
        &[(info, 1.0)],
    );
    x.family(
        "gpudiag_source_ended",
        Kind::Gauge,
        "1 when the telemetry source ended (a replay played out or sampling failed).",
        &[(Vec::new(), f64::from(u8::from(snap.source_ended)))],
    );
    x.finish()
}

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

/// Publishes every tick into the snapshot scrapes read: the latest samples, XIDs, and what is
/// wrong now (the engine's active findings, not everything ever raised).
struct SnapshotSink {
    shared: Arc<RwLock<Snapshot>>,
    recorded: Vec<Finding>,
}

impl Sink for SnapshotSink {
    fn on_tick(&mut self, tick: &Tick, _: &[Finding], pipeline: &Pipeline) -> Result<(), Error> {
        let now = Instant::now();
        let xids: Vec<(u32, u64)> = tick
            .events
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Xid { xid } => Some((e.device?, xid)),
                _ => None,
            })
            .collect();
        let findings = with_recorded(pipeline.engine.active(), &self.recorded);
        // Rules ran outside the lock: a scrape waits only for this copy.
        let mut s = self.shared.write().unwrap_or_else(|p| p.into_inner());
        for sample in &tick.samples {
            s.received.insert(sample.device, now);
            s.latest.insert(sample.device, sample.clone());
        }
        s.last_xid.extend(xids);
        s.findings = findings;
        Ok(())
    }
}

/// Feeds the source through the pipeline into the snapshot until it ends or `stop` is set.
fn sample_into(
    source: Source,
    mut pipeline: Pipeline,
    interval: Duration,
    shared: Arc<RwLock<Snapshot>>,
    stop: Arc<AtomicBool>,
) {
    let mut sink = SnapshotSink {
        shared: shared.clone(),
        recorded: source.recorded.clone(),
    };
    let opts = RunOptions {
        interval,
        limit: Limit::None,
        stop: Some(&stop),
    };
    match session::run(source, &mut pipeline, &opts, &mut sink) {
        Ok(None) => {}
        Ok(Some(e)) => eprintln!("gpudiag: sampling stopped: {e}; serving the last values"),
        Err(e) => eprintln!("gpudiag: sampling stopped: {e}; serving the last values"),
    }
    let mut s = shared.write().unwrap_or_else(|p| p.into_inner());
    s.source_ended = true;
}

/// `gpudiag serve`: runs until `stop` is set.
pub fn serve(args: &ServeArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<(), Error> {
    let source = open_source(&args.source.spec()?, Pace::Recorded { speed: 1.0 }, false)?;
    let pipeline = Pipeline::new(engine_for(&source, config)).retaining(FINDINGS_WINDOW);
    let devices = source.devices();
    let shared = Arc::new(RwLock::new(Snapshot {
        host: source.backend.host().clone(),
        devices: devices.clone(),
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
            .spawn(move || sample_into(source, pipeline, interval, shared, stop))
            .map_err(|e| Error::CannotRun(format!("cannot start the sampling thread: {e}")))?
    };
    eprintln!("gpudiag: serving metrics on http://{addr}/metrics (Ctrl-C to stop)");
    serve_connections(&listener, &shared, &stop);
    let _ = sampling.join();
    Ok(())
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
fn serve_connections(listener: &TcpListener, shared: &Arc<RwLock<Snapshot>>, stop: &AtomicBool) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_core::rules::Evidence;

    fn snapshot() -> Snapshot {
        let host = HostInfo {
            hostname: Some("node \"7\"\\a\nb".into()),
            driver_version: Some("580.65.06".into()),
            ..HostInfo::default()
        };
        let devices = vec![
            DeviceInfo {
                index: 0,
                uuid: Some("GPU-0".into()),
                name: Some("NVIDIA H200".into()),
                pci_bus_id: Some("00000000:19:00.0".into()),
                ..DeviceInfo::default()
            },
            DeviceInfo {
                index: 1,
                ..DeviceInfo::default()
            },
        ];
        let s0 = Sample {
            gpu_util_pct: Some(99.0),
            mem_used_bytes: Some(3 * 1024 * 1024 * 1024),
            power_w: Some(689.125),
            energy_j: Some(1.5),
            throttle_reasons: Some(0x4),
            pcie_replay_count: Some(0),
            ..Sample::new(0, 1000)
        };
        // GPU 1 reports almost nothing: its series must be absent, not 0.
        let s1 = Sample {
            temp_gpu_c: Some(33.0),
            ..Sample::new(1, 1000)
        };
        let now = Instant::now();
        Snapshot {
            host,
            devices,
            latest: [(0, s0), (1, s1)].into_iter().collect(),
            received: [(0, now), (1, now)].into_iter().collect(),
            last_xid: [(0, 48)].into_iter().collect(),
            findings: vec![Finding {
                id: "errors.xid_48".into(),
                severity: Severity::Fail,
                device: Some(0),
                time_ms: 1000,
                title: "t".into(),
                evidence: Evidence {
                    values: serde_json::Map::new(),
                    window_s: 0.0,
                    threshold: "event".into(),
                },
                advice: "a".into(),
                recorded: false,
            }],
            source_ended: false,
        }
    }

    fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .collect()
    }

    #[test]
    fn escaping() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape_help("x\\y\nz \"q\""), "x\\\\y\\nz \"q\"");
        assert_eq!(format_value(99.0), "99");
        assert_eq!(format_value(689.125), "689.125");
        assert_eq!(format_value(-1.5), "-1.5");
        assert_eq!(format_value(1e20), "100000000000000000000");
    }

    #[test]
    fn help_and_type_precede_samples_once_per_family() {
        let text = render(&snapshot(), Instant::now());
        let mut seen = std::collections::BTreeSet::new();
        let mut current = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(name.clone()), "{name} twice");
                current = Some(name);
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next().map(str::to_string), current);
                assert!(matches!(it.next(), Some("gauge" | "counter")));
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(Some(name.to_string()), current, "{line}");
            }
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn label_sets_units_and_absent_values() {
        let text = render(&snapshot(), Instant::now());
        let util = lines_of(&text, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(
            util,
            [
                "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:19:00.0\",\
                 modelName=\"NVIDIA H200\",Hostname=\"node \\\"7\\\"\\\\a\\nb\"} 99"
            ]
        );
        // MiB and mJ as dcgm-exporter has them.
        assert!(lines_of(&text, "DCGM_FI_DEV_FB_USED")[0].ends_with(" 3072"));
        assert!(lines_of(&text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[0].ends_with(" 1500"));
        assert!(lines_of(&text, "DCGM_FI_DEV_POWER_USAGE")[0].ends_with(" 689.125"));
        // A real 0 is exported; an absent value is not.
        assert!(lines_of(&text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")[0].ends_with(" 0"));
        assert!(
            lines_of(&text, "DCGM_FI_DEV_GPU_UTIL")
                .iter()
                .all(|l| !l.contains("gpu=\"1\""))
        );
        assert!(!text.contains("DCGM_FI_DEV_MEMORY_TEMP"));
        let temp = lines_of(&text, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 1);
        assert!(
            temp[0].starts_with("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",Hostname="),
            "{}",
            temp[0]
        );
        assert!(lines_of(&text, "DCGM_FI_DEV_XID_ERRORS")[0].ends_with(" 48"));
        // Throttle: one series per reason for GPU 0 only (GPU 1 did not say).
        let throttle = lines_of(&text, "gpudiag_throttle_reason");
        assert_eq!(throttle.len(), THROTTLE_REASONS.len());
        assert!(
            throttle
                .iter()
                .any(|l| l.contains("reason=\"sw_power_cap\"") && l.ends_with(" 1"))
        );
        assert!(
            throttle
                .iter()
                .any(|l| l.contains("reason=\"gpu_idle\"") && l.ends_with(" 0"))
        );
        let finding = lines_of(&text, "gpudiag_finding");
        assert_eq!(finding.len(), 1);
        assert!(
            finding[0].contains("id=\"errors.xid_48\",severity=\"fail\"} 1"),
            "{}",
            finding[0]
        );
        let counts = lines_of(&text, "gpudiag_findings");
        assert_eq!(counts.len(), 3);
        assert!(
            counts
                .iter()
                .any(|l| l.contains("severity=\"fail\"") && l.ends_with(" 1"))
        );
        assert!(
            counts
                .iter()
                .any(|l| l.contains("severity=\"warn\"") && l.ends_with(" 0"))
        );
        let age = lines_of(&text, "gpudiag_sample_age_seconds");
        assert_eq!(age.len(), 2);
        assert_eq!(
            lines_of(&text, "gpudiag_source_ended"),
            ["gpudiag_source_ended 0"]
        );
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
        assert_eq!(respond_to("HEAD", "/metrics", &snap).0, 405);
    }

    #[test]
    fn empty_snapshot_still_says_who_serves() {
        let text = render(&Snapshot::default(), Instant::now());
        assert!(text.contains("gpudiag_info{version="));
        assert!(!text.contains("DCGM_"));
    }
}
