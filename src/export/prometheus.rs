//! Prometheus export (`gpudiag serve`): the latest telemetry and findings in the text
//! exposition format on `/metrics`.
//!
//! Names follow dcgm-exporter's default counters where one exists (same name, unit and type), so
//! dashboards built for it work; labels are dcgm-exporter's `gpu`, `UUID`, `pci_bus_id`,
//! `modelName` and `Hostname`. gpudiag's own series start with `gpudiag_`. A value the GPU did
//! not report is left out, never written as 0.
//!
//! Sampling runs in its own thread and publishes a [`Snapshot`]; HTTP is served by tiny_http,
//! whose connection threads read requests, and a fixed set of worker threads that only render a
//! snapshot and write the answer. A slow or malformed client ties up its own connection thread
//! and nothing else: sampling and other scrapes go on.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::cli::ServeArgs;
use crate::commands::Collected;
use crate::error::Error;
use crate::rules::{Finding, Severity};
use crate::telemetry::nvml::THROTTLE_REASONS;
use crate::telemetry::replay::Pace;
use crate::telemetry::sampler::{Sampler, SamplerMsg};
use crate::telemetry::{DeviceInfo, EventKind, HostInfo, Sample};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Worker threads answering requests: scrapes are cheap, a few suffice for many scrapers.
const WORKERS: usize = 4;
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

/// Feeds ticks from the sampler into the snapshot until the source ends or `stop` is set.
fn sample_into(
    mut sampler: Sampler,
    filter: crate::commands::DeviceFilter,
    devices: Vec<DeviceInfo>,
    recorded: Vec<Finding>,
    shared: Arc<RwLock<Snapshot>>,
    stop: Arc<AtomicBool>,
) {
    let mut collected = Collected::default();
    loop {
        if stop.load(Ordering::Relaxed) {
            sampler.stop();
        }
        let msg = match sampler.rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => SamplerMsg::Ended(None),
        };
        let tick = match msg {
            SamplerMsg::Tick(t) => filter.apply(t),
            SamplerMsg::Ended(e) => {
                if let Some(e) = e {
                    eprintln!("gpudiag: sampling stopped: {e}; serving the last values");
                }
                let mut s = shared.write().unwrap_or_else(|p| p.into_inner());
                s.source_ended = true;
                return;
            }
        };
        let now = Instant::now();
        let xids: Vec<(u32, u64)> = tick
            .events
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Xid { xid } => Some((e.device?, xid)),
                _ => None,
            })
            .collect();
        let samples = tick.samples.clone();
        collected.push(tick);
        collected.keep_last(FINDINGS_WINDOW);
        let mut findings = super::evaluate_findings(&devices, &collected);
        for f in &recorded {
            if !findings.contains(f) {
                findings.push(f.clone());
            }
        }
        // Rules ran outside the lock: a scrape waits only for this copy.
        let mut s = shared.write().unwrap_or_else(|p| p.into_inner());
        for sample in samples {
            s.received.insert(sample.device, now);
            s.latest.insert(sample.device, sample);
        }
        s.last_xid.extend(xids);
        s.findings = findings;
    }
}

/// `gpudiag serve`: runs until `stop` is set.
pub fn serve(args: &ServeArgs, stop: Arc<AtomicBool>) -> Result<(), Error> {
    let (source, recorded) = super::open(&args.source, Pace::Recorded { speed: 1.0 })?;
    let devices = source.devices();
    let shared = Arc::new(RwLock::new(Snapshot {
        host: source.backend.host().clone(),
        devices: devices.clone(),
        ..Snapshot::default()
    }));
    let server = tiny_http::Server::http(args.listen)
        .map_err(|e| Error::CannotRun(format!("cannot listen on {}: {e}", args.listen)))?;
    let server = Arc::new(server);
    let addr = match server.server_addr() {
        tiny_http::ListenAddr::IP(a) => a.to_string(),
        other => other.to_string(),
    };
    let filter = source.selected.clone();
    let sampler = Sampler::spawn(source.backend, args.interval, None);
    let sampling = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("gpudiag-snapshot".into())
            .spawn(move || sample_into(sampler, filter, devices, recorded, shared, stop))
            .map_err(|e| Error::CannotRun(format!("cannot start the sampling thread: {e}")))?
    };
    let mut workers = Vec::new();
    for i in 0..WORKERS {
        let (server, shared, stop) = (server.clone(), shared.clone(), stop.clone());
        let w = std::thread::Builder::new()
            .name(format!("gpudiag-http-{i}"))
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let rq = match server.recv_timeout(Duration::from_millis(200)) {
                        Ok(Some(rq)) => rq,
                        Ok(None) => continue,
                        Err(_) => break,
                    };
                    let (status, ctype, body) = respond_to(rq.method().as_str(), rq.url(), &shared);
                    let mut response =
                        tiny_http::Response::from_string(body).with_status_code(status);
                    if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", ctype) {
                        response.add_header(h);
                    }
                    if let (405, Ok(h)) = (status, tiny_http::Header::from_bytes("Allow", "GET")) {
                        response.add_header(h);
                    }
                    // A client that went away is its own problem.
                    let _ = rq.respond(response);
                }
            })
            .map_err(|e| Error::CannotRun(format!("cannot start an HTTP worker: {e}")))?;
        workers.push(w);
    }
    eprintln!("gpudiag: serving metrics on http://{addr}/metrics (Ctrl-C to stop)");
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    server.unblock();
    for w in workers {
        let _ = w.join();
    }
    let _ = sampling.join();
    Ok(())
}
