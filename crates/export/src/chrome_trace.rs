//! Chrome trace export: telemetry, findings, events, throttle intervals and probe spans in the
//! Trace Event Format (JSON object form), which Perfetto UI and chrome://tracing open.
//!
//! Mapping: one process per GPU (pid = index + 1) named by metadata events, and one `host`
//! process for host-wide findings and events. Counters are grouped per metric family (one `C`
//! event carries every series of the family), and a group is written only when one of its
//! rounded values changed: a counter track is a step function, so a repeated value adds bytes
//! and no information. That keeps a one-hour, 8-GPU, 10 Hz recording well under 100 MB.
//! Findings, XIDs and other events are instant events (`i`) on their own thread, and so is each
//! change of a GPU's bottleneck verdict, on a `verdict` thread; each throttle
//! reason (except `gpu_idle`, which only says the GPU has nothing to do) gets a thread whose
//! complete events (`X`) are the intervals the reason was active; probe phases are complete
//! events on the `probes` thread with their results in `args`. Timestamps are microseconds on
//! the telemetry clock (ms since the epoch), relative to the first thing in the trace, whose
//! epoch time is kept in `otherData.start_ms`.
//!
//! A lost GPU (a `device_lost` event, an XID 79, or samples whose values are all absent because
//! the GPU is lost) has no values after the loss, so its counters end there: each is written
//! once more at the loss with its last values, so the step reaches the loss and no further, and
//! nothing after it until values come back (an amdgpu card that reappears). The format has no
//! "end of counter" event (a counter needs a number, and 0 would be a value the GPU never
//! reported): chrome://tracing stops a counter track at its last event, while Perfetto draws
//! the last value on to the end of the trace (google/perfetto#3341). So the loss also opens a
//! `GPU lost` complete event on the telemetry thread, spanning the loss to the end of the trace
//! or the GPU's return, which marks in every viewer where the drawn values stop being real.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::Schema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use gpudiag_model::decode::THROTTLE_REASONS;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::MetricDef;
use gpudiag_model::sample::{DeviceInfo, Event, EventKind, HostInfo, Sample, TimeMs};
use gpudiag_model::verdict::{Bottleneck, Verdict};
use gpudiag_telemetry::Tick;

/// The value of `otherData.format`.
pub const TRACE_FORMAT: &str = "gpudiag-trace";
/// Bumped when a change would break a reader of `otherData` or of the event mapping.
pub const TRACE_VERSION: u32 = 1;
/// The process that holds host-wide findings and events; far above any GPU index + 1.
pub const HOST_PID: u32 = 1_000_000;
/// Threads inside a GPU process.
pub const TID_TELEMETRY: u32 = 1;
pub const TID_EVENTS: u32 = 2;
pub const TID_PROBES: u32 = 3;
pub const TID_VERDICT: u32 = 4;
/// The job verdicts' track, in the host process: a job spans GPUs.
pub const TID_JOB: u32 = 5;
/// Throttle reason with bit `b` (0..64) is on thread `TID_THROTTLE_BASE + b`.
pub const TID_THROTTLE_BASE: u32 = 100;
/// NVML's idle reason: not a slowdown, so it gets no track.
const GPU_IDLE_BIT: u64 = 0x1;
/// The XID of a GPU that fell off the bus.
const XID_LOST: u64 = 79;
/// Name of the complete event that spans a lost GPU's silence.
pub const LOST_SPAN: &str = "GPU lost";

/// A whole trace, as written to `trace.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Trace {
    #[serde(rename = "traceEvents")]
    pub trace_events: Vec<TraceEvent>,
    /// How the viewer shows times; the events themselves are always in µs.
    #[serde(rename = "displayTimeUnit")]
    #[schemars(extend("enum" = ["ms", "ns"]))]
    pub display_time_unit: String,
    #[serde(rename = "otherData")]
    pub other_data: TraceInfo,
}

/// What produced the trace; viewers show it as metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TraceInfo {
    /// Always [`TRACE_FORMAT`].
    #[schemars(extend("const" = TRACE_FORMAT))]
    pub format: String,
    #[schemars(extend("const" = TRACE_VERSION))]
    pub version: u32,
    /// The gpudiag build that wrote the trace, as a recording's header names it.
    pub tool_version: String,
    /// Epoch milliseconds of `ts == 0`; `None` for a trace with no timed event.
    pub start_ms: Option<TimeMs>,
    /// "nvml", "replay", ...
    pub backend: String,
    /// The recording traced, for replays.
    pub recording: Option<String>,
    /// Host name (redactable).
    pub host: Option<String>,
    pub driver_version: Option<String>,
    /// `run --kernels --trace`: the kernel, copy, set and synchronisation records written as
    /// complete events, and those left out (past the cap on records kept, or with times that
    /// cannot be real). Absent without `--kernels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_records: Option<KernelRecordsInfo>,
}

/// How many of the kernels mode's records the trace holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct KernelRecordsInfo {
    pub written: u64,
    pub left_out: u64,
    /// Under `run --kernels=sample`: the windows drawn on each process's `kernels recorded`
    /// track (cat `kernels_window`). Outside them nothing was recorded: a gap in the rows is
    /// not an idle GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_windows: Option<u64>,
}

/// An event phase (`ph`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum Phase {
    #[serde(rename = "M")]
    Metadata,
    #[serde(rename = "C")]
    Counter,
    #[serde(rename = "i")]
    Instant,
    #[serde(rename = "X")]
    Complete,
}

/// Scope of an instant event (`s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Scope {
    #[serde(rename = "t")]
    Thread,
    #[serde(rename = "p")]
    Process,
    #[serde(rename = "g")]
    Global,
}

/// Microseconds since the trace start.
pub type Micros = u64;

/// Named values of an event.
pub type Args = BTreeMap<Cow<'static, str>, Value>;

/// One event of the Trace Event Format, with the fields gpudiag uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields, transform = trace_event_phases)]
pub struct TraceEvent {
    #[schemars(length(min = 1))]
    pub name: Cow<'static, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub cat: Option<Cow<'static, str>>,
    pub ph: Phase,
    pub ts: Micros,
    /// Complete events only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Micros")]
    pub dur: Option<Micros>,
    pub pid: u32,
    pub tid: u32,
    /// Instant events only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Scope")]
    pub s: Option<Scope>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: Args,
}

/// A probe phase for the trace: the probes branch turns its results into these.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSpan {
    /// "bandwidth h2d pinned", "matmul bf16", ...
    pub name: String,
    /// `None` for a host-wide probe.
    pub device: Option<u32>,
    pub start_ms: TimeMs,
    pub end_ms: TimeMs,
    /// The results (value, unit, expected, ratio, ...).
    pub results: serde_json::Map<String, Value>,
}

/// One counter group of the metric table: one `C` event name, its fields' series the args.
struct Group {
    name: &'static str,
    fields: Vec<&'static MetricDef>,
}

impl Group {
    /// The group's series in a sample, rounded to what a chart can show (the rounding is what
    /// makes unchanged values compare equal, and keeps numbers short).
    fn values(&self, s: &Sample) -> Vec<Option<f64>> {
        self.fields
            .iter()
            .map(|m| {
                let t = m.trace?;
                Some(t.round.apply(t.scale.apply(m.get(s)?)))
            })
            .collect()
    }

    /// The args of one event: the present values under their series names.
    fn args(&self, values: &[Option<f64>]) -> Args {
        self.fields
            .iter()
            .zip(values)
            .filter_map(|(m, v)| Some((Cow::Borrowed(m.trace?.key), compact_number((*v)?))))
            .collect()
    }
}

/// A whole number without its `.0` (most telemetry values are whole: %, MiB, MHz, °C), which
/// saves bytes on every counter event.
fn compact_number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9e15 {
        Value::from(v as i64)
    } else {
        Value::from(v)
    }
}

/// Per-device state while building.
#[derive(Default)]
struct DeviceState {
    /// The last values written per group (in `TraceBuilder::groups` order), to skip unchanged
    /// ones.
    last: BTreeMap<usize, Vec<Option<f64>>>,
    /// When each group was last written, so `finish` can close its track at the last sample.
    written_ms: BTreeMap<usize, TimeMs>,
    /// Start time of each active throttle run, by bit index.
    throttle_start: BTreeMap<u32, TimeMs>,
    /// Time of the last sample seen, where an open run ends if the recording stops.
    last_ms: Option<TimeMs>,
    /// The bottleneck of the last verdict written, so only changes are.
    verdict: Option<Bottleneck>,
    /// When the GPU was lost, while it stays lost: its counters are closed and silent.
    lost_since: Option<(TimeMs, String)>,
}

/// Events with absolute times, before the start is known.
struct Pending {
    name: Cow<'static, str>,
    cat: Option<Cow<'static, str>>,
    ph: Phase,
    time_ms: TimeMs,
    dur_ms: Option<u64>,
    pid: u32,
    tid: u32,
    args: Args,
}

/// Builds a trace tick by tick, so a long recording never has to be held as samples.
pub struct TraceBuilder {
    devices: Vec<DeviceInfo>,
    groups: Vec<Group>,
    info: TraceInfo,
    state: BTreeMap<u32, DeviceState>,
    events: Vec<Pending>,
    /// Threads used per process, for their name metadata.
    threads: BTreeMap<(u32, u32), Cow<'static, str>>,
    /// The kernels mode's rows, on the Unix clock in ns: kernels last microseconds, so they
    /// cannot wait in `events` with millisecond times.
    kernel_rows: Vec<KernelRow>,
    /// Each GPU process's threads for those rows, by what they carry.
    kernel_threads: BTreeMap<(u32, KernelThread), u32>,
}

/// A kernel, copy, set or synchronisation row.
struct KernelRow {
    name: Cow<'static, str>,
    cat: &'static str,
    start_ns: u64,
    end_ns: u64,
    pid: u32,
    tid: u32,
    args: Args,
}

/// What a kernels-mode thread carries: one CUDA stream of one process (Kineto's layout: a
/// thread per stream), or one process's host waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum KernelThread {
    Stream { pid: u32, stream: u32 },
    HostWaits { pid: u32 },
}

/// The kernels mode's threads are numbered from here, past the throttle reasons' 100–163.
pub const TID_KERNELS_BASE: u32 = 1_000;
/// Under `--kernels=sample`, each process's track of the windows it recorded in, in the host
/// process: from here, one per process up to the aggregator's 512, below the kernels' threads.
pub const TID_SAMPLING_BASE: u32 = 200;
const SAMPLING_TRACKS: u32 = TID_KERNELS_BASE - TID_SAMPLING_BASE;
/// Rows stamped before this (2001) come from a clock pair that cannot be real.
const EARLIEST_REAL_NS: u64 = 1_000_000_000_000_000_000;

/// The pid of a device (`None`: the host process).
pub fn pid_of(device: Option<u32>) -> u32 {
    device.map_or(HOST_PID, |d| d.saturating_add(1))
}

/// Kineto's name of a copy: "Memcpy HtoD (Pageable -> Device)".
fn copy_name(
    direction: gpudiag_model::kernels::CopyDirection,
    host: gpudiag_model::kernels::HostMemory,
) -> String {
    use gpudiag_model::kernels::{CopyDirection as D, HostMemory as H};
    let host = match host {
        H::Pageable => "Pageable",
        H::Pinned => "Pinned",
        H::Managed => "Managed",
        H::NoHostSide | H::Unknown => "Device",
    };
    let (short, from, to) = match direction {
        D::HostToDevice => ("HtoD", host, "Device"),
        D::DeviceToHost => ("DtoH", "Device", host),
        D::DeviceToDevice => ("DtoD", "Device", "Device"),
        D::HostToHost => ("HtoH", host, host),
        D::PeerToPeer => ("PtoP", "Device", "Device"),
        D::Other => ("Unknown", "Unknown", "Unknown"),
    };
    format!("Memcpy {short} ({from} -> {to})")
}

/// Kineto's name of a synchronisation.
fn sync_name(call: gpudiag_model::kernels::SyncCall) -> &'static str {
    use gpudiag_model::kernels::SyncCall as S;
    match call {
        S::EventSynchronize => "Event Sync",
        S::StreamWaitEvent => "Stream Wait Event",
        S::StreamSynchronize => "Stream Sync",
        S::ContextSynchronize => "Context Sync",
        S::Unknown => "Unknown Sync",
    }
}

fn throttle_name(bit: u32) -> Cow<'static, str> {
    let mask = 1u64 << bit;
    THROTTLE_REASONS
        .iter()
        .find(|(b, _)| *b == mask)
        .map_or_else(
            || Cow::Owned(format!("unknown_{mask:#x}")),
            |(_, n)| Cow::Borrowed(*n),
        )
}

impl TraceBuilder {
    pub fn new(
        backend: &str,
        recording: Option<String>,
        host: &HostInfo,
        devices: Vec<DeviceInfo>,
    ) -> Self {
        TraceBuilder {
            devices,
            groups: gpudiag_model::sample::trace_groups()
                .into_iter()
                .map(|(name, fields)| Group { name, fields })
                .collect(),
            info: TraceInfo {
                format: TRACE_FORMAT.into(),
                version: TRACE_VERSION,
                tool_version: gpudiag_model::build_info::LONG_VERSION.into(),
                start_ms: None,
                backend: backend.into(),
                recording,
                host: host.hostname.clone(),
                driver_version: host.driver_version.clone(),
                kernel_records: None,
            },
            state: BTreeMap::new(),
            events: Vec::new(),
            threads: BTreeMap::new(),
            kernel_rows: Vec::new(),
            kernel_threads: BTreeMap::new(),
        }
    }

    fn thread(&mut self, pid: u32, tid: u32, name: Cow<'static, str>) {
        self.threads.entry((pid, tid)).or_insert(name);
    }

    /// Adds one tick: its samples as counters and throttle runs, its events as instants.
    pub fn push_tick(&mut self, tick: &Tick) {
        for e in &tick.events {
            self.push_event(e);
        }
        for s in &tick.samples {
            self.push_sample(s);
        }
    }

    pub fn push_sample(&mut self, s: &Sample) {
        let pid = pid_of(Some(s.device));
        let all_values: Vec<Vec<Option<f64>>> = self.groups.iter().map(|g| g.values(s)).collect();
        let no_values = all_values.iter().flatten().all(Option::is_none);
        if no_values
            && s.absent
                .values()
                .any(|a| *a == gpudiag_model::sample::Absent::GpuLost)
        {
            self.lose(s.device, s.time_ms, "every value answers GPU lost");
            self.state.entry(s.device).or_default().last_ms = Some(s.time_ms);
            return;
        }
        // Values after a loss: the GPU came back (a card re-enumerated after a reset).
        let back = self
            .state
            .get(&s.device)
            .and_then(|st| st.lost_since.clone())
            .filter(|(since, _)| !no_values && s.time_ms > *since);
        if let Some((since, reason)) = back {
            self.push_lost_span(s.device, since, s.time_ms, reason);
            if let Some(st) = self.state.get_mut(&s.device) {
                st.lost_since = None;
            }
        }
        let state = self.state.entry(s.device).or_default();
        if state.lost_since.is_some() {
            // Values stamped at the loss itself, or none at all: nothing to draw yet.
            state.last_ms = Some(s.time_ms);
            return;
        }
        let mut out = Vec::new();
        for (i, (group, values)) in self.groups.iter().zip(all_values).enumerate() {
            if values.iter().all(Option::is_none) || state.last.get(&i) == Some(&values) {
                continue;
            }
            let args = group.args(&values);
            state.last.insert(i, values);
            state.written_ms.insert(i, s.time_ms);
            out.push(Pending {
                name: Cow::Borrowed(group.name),
                cat: None,
                ph: Phase::Counter,
                time_ms: s.time_ms,
                dur_ms: None,
                pid,
                tid: TID_TELEMETRY,
                args,
            });
        }
        // Throttle runs: a bit that clears (or a sample that cannot say) ends its run here.
        let bits = s.throttle_reasons.map(|b| b & !GPU_IDLE_BIT);
        let mut ended = Vec::new();
        state.throttle_start.retain(|&bit, &mut start| {
            let still = bits.is_some_and(|b| b & (1u64 << bit) != 0);
            if !still {
                ended.push((bit, start, s.time_ms));
            }
            still
        });
        if let Some(b) = bits {
            for bit in 0..64u32 {
                if b & (1u64 << bit) != 0 {
                    state.throttle_start.entry(bit).or_insert(s.time_ms);
                }
            }
        }
        state.last_ms = Some(s.time_ms);
        self.events.extend(out);
        for (bit, start, end) in ended {
            self.push_throttle(pid, bit, start, end);
        }
    }

    /// Ends `device`'s counters and throttle runs at `at` (once per loss): each counter is
    /// written once more at the loss with its last values, then stays silent.
    fn lose(&mut self, device: u32, at: TimeMs, reason: &str) {
        let pid = pid_of(Some(device));
        let state = self.state.entry(device).or_default();
        if state.lost_since.is_some() {
            return;
        }
        state.lost_since = Some((at, reason.to_owned()));
        let mut closing = Vec::new();
        for (i, values) in std::mem::take(&mut state.last) {
            let written = state.written_ms.remove(&i);
            let Some(group) = self.groups.get(i) else {
                continue;
            };
            if written.is_some_and(|w| w >= at) {
                continue;
            }
            closing.push(Pending {
                name: Cow::Borrowed(group.name),
                cat: None,
                ph: Phase::Counter,
                time_ms: at,
                dur_ms: None,
                pid,
                tid: TID_TELEMETRY,
                args: group.args(&values),
            });
        }
        state.written_ms.clear();
        let runs: Vec<(u32, TimeMs)> = std::mem::take(&mut state.throttle_start)
            .into_iter()
            .collect();
        self.events.extend(closing);
        for (bit, start) in runs {
            self.push_throttle(pid, bit, start, at.max(start));
        }
    }

    /// The span a lost GPU had no telemetry, on its telemetry thread.
    fn push_lost_span(&mut self, device: u32, since: TimeMs, until: TimeMs, reason: String) {
        let mut args = Args::new();
        args.insert("reason".into(), Value::from(reason));
        self.events.push(Pending {
            name: Cow::Borrowed(LOST_SPAN),
            cat: Some("event".into()),
            ph: Phase::Complete,
            time_ms: since,
            dur_ms: Some(until.saturating_sub(since)),
            pid: pid_of(Some(device)),
            tid: TID_TELEMETRY,
            args,
        });
    }

    fn push_throttle(&mut self, pid: u32, bit: u32, start: TimeMs, end: TimeMs) {
        let name = throttle_name(bit);
        let tid = TID_THROTTLE_BASE + bit;
        self.thread(pid, tid, Cow::Owned(format!("throttle: {name}")));
        let mut args = Args::new();
        args.insert(
            "reason_bit".into(),
            Value::from(format!("{:#x}", 1u64 << bit)),
        );
        self.events.push(Pending {
            name,
            cat: Some("throttle".into()),
            ph: Phase::Complete,
            time_ms: start,
            dur_ms: Some(end.saturating_sub(start)),
            pid,
            tid,
            args,
        });
    }

    /// An XID, a lost GPU or a notice, as an instant on the device's (or host's) events thread.
    pub fn push_event(&mut self, e: &Event) {
        let pid = pid_of(e.device);
        let (name, cat, mut args): (String, &'static str, Args) = match &e.kind {
            EventKind::Xid { xid } => (format!("XID {xid}"), "xid", Args::new()),
            EventKind::DeviceLost { reason } => ("device lost".into(), "event", {
                let mut a = Args::new();
                a.insert("reason".into(), Value::from(reason.clone()));
                a
            }),
            EventKind::Notice { message } => ("notice".into(), "event", {
                let mut a = Args::new();
                a.insert("message".into(), Value::from(message.clone()));
                a
            }),
        };
        if let EventKind::Xid { xid } = e.kind {
            args.insert("xid".into(), Value::from(xid));
        }
        match (&e.kind, e.device) {
            (EventKind::DeviceLost { reason }, Some(d)) => self.lose(d, e.time_ms, reason),
            (EventKind::Xid { xid: XID_LOST }, Some(d)) => {
                self.lose(d, e.time_ms, "XID 79: the GPU fell off the bus");
            }
            _ => {}
        }
        self.thread(pid, TID_EVENTS, "findings and events".into());
        self.events.push(Pending {
            name: name.into(),
            cat: Some(cat.into()),
            ph: Phase::Instant,
            time_ms: e.time_ms,
            dur_ms: None,
            pid,
            tid: TID_EVENTS,
            args,
        });
    }

    /// A finding as an instant event; its args carry the whole finding.
    pub fn push_finding(&mut self, f: &Finding) {
        let pid = pid_of(f.device);
        let args = match serde_json::to_value(f) {
            Ok(Value::Object(map)) => map.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect(),
            _ => Args::new(),
        };
        self.thread(pid, TID_EVENTS, "findings and events".into());
        self.events.push(Pending {
            name: Cow::Owned(format!("{}: {}", f.severity, f.title)),
            cat: Some(Cow::Owned(format!("finding,{}", f.severity))),
            ph: Phase::Instant,
            time_ms: f.time_ms,
            dur_ms: None,
            pid,
            tid: TID_EVENTS,
            args,
        });
    }

    /// The verdicts the rules hold now, one per judged GPU: each whose bottleneck differs from
    /// the last one written for its GPU becomes an instant at the end of its window, its args
    /// the whole verdict. The engine re-judges a rolling window every tick, so writing each
    /// would repeat the same verdict on every tick; a GPU that could not be judged for a while
    /// keeps its last one.
    pub fn push_verdicts<'a>(&mut self, verdicts: impl IntoIterator<Item = &'a Verdict>) {
        for v in verdicts {
            let state = self.state.entry(v.device).or_default();
            if state.verdict == Some(v.bottleneck) {
                continue;
            }
            state.verdict = Some(v.bottleneck);
            let name = format!("verdict: {}", v.bottleneck);
            self.push_verdict(v, name, "verdict", v.end_ms, None);
        }
    }

    /// The verdict on the whole capture per GPU, as `check` gives it: one complete event over
    /// the span it judged, beside the instants that mark each change of the rolling verdict.
    pub fn push_overall_verdicts<'a>(&mut self, verdicts: impl IntoIterator<Item = &'a Verdict>) {
        for v in verdicts {
            let name = format!("verdict over the capture: {}", v.bottleneck);
            let span = v.end_ms.saturating_sub(v.start_ms);
            self.push_verdict(v, name, "verdict,overall", v.start_ms, Some(span));
        }
    }

    /// Each job's verdict over the capture and its phases, on the host's job track, their args
    /// the whole verdict (the straggler, every GPU's figures).
    pub fn push_job_verdicts<'a>(
        &mut self,
        jobs: impl IntoIterator<Item = &'a gpudiag_model::job::JobVerdict>,
        phases: impl IntoIterator<Item = &'a gpudiag_model::job::JobVerdict>,
    ) {
        let overall = jobs
            .into_iter()
            .map(|j| (j, "job,overall", "over the capture"));
        let phased = phases.into_iter().map(|j| (j, "job,phase", "phase"));
        for (j, cat, what) in overall.chain(phased) {
            // The stragglers stand for the verdict's name: "straggler GPU 5", "stragglers GPU
            // 2, 6"; other verdicts by their name.
            let verdict = match j.stragglers.as_slice() {
                [] => j.verdict.to_string(),
                [one] => format!("straggler GPU {}", one.device),
                several => format!(
                    "stragglers GPU {}",
                    several
                        .iter()
                        .map(|s| s.device.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let args = match serde_json::to_value(j) {
                Ok(Value::Object(map)) => {
                    map.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect()
                }
                _ => Args::new(),
            };
            self.thread(HOST_PID, TID_JOB, "job verdict".into());
            self.events.push(Pending {
                name: Cow::Owned(format!("job {what}: {verdict} ({})", j.job.label())),
                cat: Some(cat.into()),
                ph: Phase::Complete,
                time_ms: j.start_ms,
                dur_ms: Some(j.end_ms.saturating_sub(j.start_ms)),
                pid: HOST_PID,
                tid: TID_JOB,
                args,
            });
        }
    }

    /// One verdict on its GPU's verdict track, its args the whole verdict: an instant without
    /// `dur_ms`, a complete event with it.
    fn push_verdict(
        &mut self,
        v: &Verdict,
        name: String,
        cat: &'static str,
        time_ms: TimeMs,
        dur_ms: Option<TimeMs>,
    ) {
        let pid = pid_of(Some(v.device));
        let args = match serde_json::to_value(v) {
            Ok(Value::Object(map)) => map.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect(),
            _ => Args::new(),
        };
        self.thread(pid, TID_VERDICT, "verdict".into());
        self.events.push(Pending {
            name: Cow::Owned(name),
            cat: Some(cat.into()),
            ph: if dur_ms.is_some() {
                Phase::Complete
            } else {
                Phase::Instant
            },
            time_ms,
            dur_ms,
            pid,
            tid: TID_VERDICT,
            args,
        });
    }

    /// `run --kernels --trace`: the kernel, copy, set and synchronisation records as complete
    /// events in Kineto's layout, so HolisticTraceAnalysis reads them as it reads a PyTorch
    /// profiler trace: `cat` `kernel`, `gpu_memcpy`, `gpu_memset` or `cuda_sync`, and the args
    /// Kineto writes (`device` is the CUDA ordinal inside the process, `stream`, `correlation`,
    /// `grid`, `block`, `registers per thread`, `shared memory`, `bytes`). One thing differs:
    /// the rows go in their GPU's process (pid = gpudiag's index + 1, beside its counters)
    /// rather than Kineto's pid = CUDA ordinal, which names a different GPU in every process
    /// once `CUDA_VISIBLE_DEVICES` differs, and would fall in another GPU's process here; each
    /// stream of each process is a thread of its own. A synchronisation is the host's wait,
    /// not GPU work: its `stream` is -1 (the stream waited for is `wait_on_stream`, as Kineto
    /// names it), or HTA would count the wait as GPU time. Rows of a GPU gpudiag does not
    /// watch (no UUID matched) go in the host process.
    pub fn push_kernel_records(&mut self, kept: &gpudiag_core::kernels::KeptRecords) {
        use gpudiag_core::kernels::{Kept, names};
        let mut left_out = kept.left_out;
        let mut demangled: BTreeMap<std::sync::Arc<str>, std::sync::Arc<str>> = BTreeMap::new();
        let mut name_of = |raw: &std::sync::Arc<str>| -> String {
            if let Some(d) = demangled.get(raw) {
                return d.to_string();
            }
            let d = names::demangle(raw);
            // Bounded: past it each name is demangled again, no more kept.
            if demangled.len() < 65_536 {
                demangled.insert(raw.clone(), std::sync::Arc::from(d.as_str()));
            }
            d
        };
        for r in &kept.records {
            if r.start_unix_ns < EARLIEST_REAL_NS || r.end_unix_ns < r.start_unix_ns {
                left_out = left_out.saturating_add(1);
                continue;
            }
            let index = r.gpu.as_ref().and_then(|g| g.uuid()).and_then(|u| {
                self.devices
                    .iter()
                    .find(|d| d.uuid.as_deref().is_some_and(|d| d.eq_ignore_ascii_case(u)))
                    .map(|d| d.index)
            });
            let pid = pid_of(index);
            let mut args = Args::new();
            if let Some(ordinal) = r.cuda_ordinal {
                args.insert("device".into(), Value::from(ordinal));
            }
            args.insert("pid".into(), Value::from(r.pid));
            let (name, cat, thread): (String, &'static str, KernelThread) = match &r.what {
                Kept::Kernel {
                    name,
                    context,
                    stream,
                    grid,
                    block,
                    registers_per_thread,
                    shared_memory_bytes,
                    graph_id,
                    correlation_id,
                } => {
                    args.insert("context".into(), Value::from(*context));
                    args.insert("stream".into(), Value::from(*stream));
                    args.insert("correlation".into(), Value::from(*correlation_id));
                    args.insert("grid".into(), json!(grid));
                    args.insert("block".into(), json!(block));
                    args.insert(
                        "registers per thread".into(),
                        Value::from(*registers_per_thread),
                    );
                    args.insert("shared memory".into(), Value::from(*shared_memory_bytes));
                    if let Some(g) = graph_id {
                        args.insert("graph id".into(), Value::from(*g));
                    }
                    (
                        name_of(name),
                        "kernel",
                        KernelThread::Stream {
                            pid: r.pid,
                            stream: *stream,
                        },
                    )
                }
                Kept::Copy {
                    context,
                    stream,
                    bytes,
                    direction,
                    host_memory,
                    correlation_id,
                } => {
                    args.insert("context".into(), Value::from(*context));
                    args.insert("stream".into(), Value::from(*stream));
                    args.insert("correlation".into(), Value::from(*correlation_id));
                    args.insert("bytes".into(), Value::from(*bytes));
                    let ns = r.end_unix_ns - r.start_unix_ns;
                    if ns > 0 {
                        args.insert(
                            "memory bandwidth (GB/s)".into(),
                            Value::from(*bytes as f64 / ns as f64),
                        );
                    }
                    (
                        copy_name(*direction, *host_memory),
                        "gpu_memcpy",
                        KernelThread::Stream {
                            pid: r.pid,
                            stream: *stream,
                        },
                    )
                }
                Kept::Set {
                    context,
                    stream,
                    bytes,
                    correlation_id,
                } => {
                    args.insert("context".into(), Value::from(*context));
                    args.insert("stream".into(), Value::from(*stream));
                    args.insert("correlation".into(), Value::from(*correlation_id));
                    args.insert("bytes".into(), Value::from(*bytes));
                    (
                        "Memset (Device)".into(),
                        "gpu_memset",
                        KernelThread::Stream {
                            pid: r.pid,
                            stream: *stream,
                        },
                    )
                }
                Kept::Sync {
                    context,
                    stream,
                    call,
                    correlation_id,
                } => {
                    args.insert("context".into(), Value::from(*context));
                    args.insert("stream".into(), Value::from(-1));
                    args.insert(
                        "wait_on_stream".into(),
                        stream.map_or(Value::from(-1), Value::from),
                    );
                    args.insert("correlation".into(), Value::from(*correlation_id));
                    args.insert("call".into(), Value::from(call.call_name()));
                    (
                        sync_name(*call).into(),
                        "cuda_sync",
                        KernelThread::HostWaits { pid: r.pid },
                    )
                }
            };
            let next = TID_KERNELS_BASE
                + self
                    .kernel_threads
                    .keys()
                    .filter(|(p, _)| *p == pid)
                    .count() as u32;
            let tid = *self.kernel_threads.entry((pid, thread)).or_insert(next);
            if tid == next {
                let label = match thread {
                    KernelThread::Stream { pid, stream } => format!("stream {stream} (pid {pid})"),
                    KernelThread::HostWaits { pid } => format!("host waits (pid {pid})"),
                };
                self.thread(pid, tid, Cow::Owned(label));
            }
            self.kernel_rows.push(KernelRow {
                name: Cow::Owned(name),
                cat,
                start_ns: r.start_unix_ns,
                end_ns: r.end_unix_ns,
                pid,
                tid,
                args,
            });
        }
        let drawn = self.push_sampling_windows(&kept.windows);
        let info = self.info.kernel_records.get_or_insert(KernelRecordsInfo {
            written: 0,
            left_out: 0,
            sampled_windows: None,
        });
        info.written = self.kernel_rows.len() as u64;
        info.left_out = info.left_out.saturating_add(left_out);
        if !kept.windows.is_empty() {
            info.sampled_windows = Some(info.sampled_windows.unwrap_or(0).saturating_add(drawn));
        }
    }

    /// Under `--kernels=sample`: each process's windows as `kernels recorded` slices, the gaps
    /// between them as `not recorded`, and the time after sampling gave way to another CUPTI
    /// client as `recorded in full`, on a track per process in the host process: in Perfetto a
    /// gap in the kernel rows then reads as time nobody looked at, not as an idle GPU. Returns
    /// how many windows were drawn.
    fn push_sampling_windows(&mut self, all: &[gpudiag_core::kernels::RecordedWindows]) -> u64 {
        const CAT: &str = "kernels_window";
        let ms = |ns: u64| ns / 1_000_000;
        let mut drawn = 0u64;
        for (n, w) in (0u32..SAMPLING_TRACKS).zip(all) {
            let tid = TID_SAMPLING_BASE + n;
            self.thread(
                HOST_PID,
                tid,
                Cow::Owned(format!("kernels recorded (pid {})", w.pid)),
            );
            let slice = |name: &'static str, from: u64, to: u64, args: Args| Pending {
                name: Cow::Borrowed(name),
                cat: Some(Cow::Borrowed(CAT)),
                ph: Phase::Complete,
                time_ms: ms(from),
                dur_ms: Some(ms(to).saturating_sub(ms(from))),
                pid: HOST_PID,
                tid,
                args,
            };
            let pid_args = || -> Args { [(Cow::Borrowed("pid"), Value::from(w.pid))].into() };
            let real = |&&(from, to): &&(u64, u64)| from >= EARLIEST_REAL_NS && to > from;
            let mut previous_end: Option<u64> = None;
            for &(from, to) in w.windows.iter().filter(real) {
                if let Some(end) = previous_end.filter(|&end| end < from) {
                    let mut args = pid_args();
                    args.insert(
                        "why".into(),
                        Value::from(
                            "--kernels=sample recorded nothing here: not an idle GPU, time \
                             nobody looked at",
                        ),
                    );
                    self.events.push(slice("not recorded", end, from, args));
                }
                self.events
                    .push(slice("kernels recorded", from, to, pid_args()));
                drawn += 1;
                previous_end = Some(previous_end.map_or(to, |e| e.max(to)));
            }
            if let (Some(from), Some(end)) = (w.full_from_unix_ns, w.end_unix_ns)
                && from >= EARLIEST_REAL_NS
                && end > from
            {
                let mut args = pid_args();
                args.insert(
                    "why".into(),
                    Value::from(
                        "another CUPTI client (torch.profiler, Nsight) appeared: sampling gave \
                         way and the process was recorded in full",
                    ),
                );
                self.events.push(slice("recorded in full", from, end, args));
            }
        }
        drawn
    }

    /// A probe phase as a complete event with its results in `args`.
    pub fn push_probe(&mut self, p: &ProbeSpan) {
        let pid = pid_of(p.device);
        self.thread(pid, TID_PROBES, "probes".into());
        self.events.push(Pending {
            name: Cow::Owned(p.name.clone()),
            cat: Some("probe".into()),
            ph: Phase::Complete,
            time_ms: p.start_ms,
            dur_ms: Some(p.end_ms.saturating_sub(p.start_ms)),
            pid,
            tid: TID_PROBES,
            args: p
                .results
                .iter()
                .map(|(k, v)| (Cow::Owned(k.clone()), v.clone()))
                .collect(),
        });
    }

    /// Closes open throttle runs at each device's last sample, names processes and threads,
    /// converts times to µs since the earliest event and sorts events by time.
    pub fn finish(mut self) -> Trace {
        let open: Vec<(u32, u32, TimeMs, TimeMs)> = self
            .state
            .iter()
            .flat_map(|(&dev, st)| {
                let end = st.last_ms.unwrap_or_default();
                st.throttle_start
                    .iter()
                    .map(move |(&bit, &start)| (dev, bit, start, end))
            })
            .collect();
        for (dev, bit, start, end) in open {
            self.push_throttle(pid_of(Some(dev)), bit, start, end);
        }
        // A GPU still lost when the capture ends: its silence runs to the end of the trace.
        let end = self
            .events
            .iter()
            .map(|e| e.time_ms.saturating_add(e.dur_ms.unwrap_or(0)))
            .chain(self.state.values().filter_map(|st| st.last_ms))
            .max();
        let still_lost: Vec<(u32, TimeMs, String)> = self
            .state
            .iter_mut()
            .filter_map(|(&dev, st)| st.lost_since.take().map(|(t, r)| (dev, t, r)))
            .collect();
        for (dev, since, reason) in still_lost {
            self.push_lost_span(dev, since, end.unwrap_or(since).max(since), reason);
        }
        // A group that stopped changing was last written long before the capture ended: repeat
        // its value at the last sample so each track spans the whole capture.
        let mut closing = Vec::new();
        for (&dev, st) in &self.state {
            let Some(end) = st.last_ms else { continue };
            for (i, group) in self.groups.iter().enumerate() {
                let (Some(values), Some(&written)) = (st.last.get(&i), st.written_ms.get(&i))
                else {
                    continue;
                };
                if written >= end {
                    continue;
                }
                let args = group.args(values);
                closing.push(Pending {
                    name: Cow::Borrowed(group.name),
                    cat: None,
                    ph: Phase::Counter,
                    time_ms: end,
                    dur_ms: None,
                    pid: pid_of(Some(dev)),
                    tid: TID_TELEMETRY,
                    args,
                });
            }
        }
        self.events.extend(closing);
        let start = self
            .events
            .iter()
            .map(|e| e.time_ms)
            .chain(self.kernel_rows.iter().map(|r| r.start_ns / 1_000_000))
            .min();
        self.info.start_ms = start;
        let origin = start.unwrap_or_default();

        let mut meta = Vec::new();
        let mut meta_event =
            |name: &'static str, pid: u32, tid: u32, key: &'static str, v: Value| {
                let mut args = Args::new();
                args.insert(Cow::Borrowed(key), v);
                meta.push(TraceEvent {
                    name: Cow::Borrowed(name),
                    cat: None,
                    ph: Phase::Metadata,
                    ts: 0,
                    dur: None,
                    pid,
                    tid,
                    s: None,
                    args,
                });
            };
        for d in &self.devices {
            let pid = pid_of(Some(d.index));
            let mut label = format!("GPU {}", d.label());
            if let Some(bus) = &d.pci_bus_id {
                label.push_str(&format!(" ({bus})"));
            }
            meta_event("process_name", pid, 0, "name", Value::from(label));
            meta_event(
                "process_sort_index",
                pid,
                0,
                "sort_index",
                Value::from(d.index),
            );
            meta_event(
                "thread_name",
                pid,
                TID_TELEMETRY,
                "name",
                "telemetry".into(),
            );
        }
        let host_used = self
            .events
            .iter()
            .map(|e| e.pid)
            .chain(self.kernel_rows.iter().map(|r| r.pid))
            .any(|p| p == HOST_PID);
        if host_used {
            let name = match &self.info.host {
                Some(h) => format!("host {h}"),
                None => "host".into(),
            };
            meta_event("process_name", HOST_PID, 0, "name", Value::from(name));
            meta_event(
                "process_sort_index",
                HOST_PID,
                0,
                "sort_index",
                Value::from(-1),
            );
        }
        // A device that appears in samples but not in the device list still gets a name.
        let named: Vec<u32> = self.devices.iter().map(|d| pid_of(Some(d.index))).collect();
        let mut unnamed: Vec<u32> = self
            .events
            .iter()
            .map(|e| e.pid)
            .chain(self.kernel_rows.iter().map(|r| r.pid))
            .filter(|p| *p != HOST_PID && !named.contains(p))
            .collect();
        unnamed.sort_unstable();
        unnamed.dedup();
        for pid in unnamed {
            let label = format!("GPU {}", pid.saturating_sub(1));
            meta_event("process_name", pid, 0, "name", Value::from(label));
            meta_event(
                "thread_name",
                pid,
                TID_TELEMETRY,
                "name",
                "telemetry".into(),
            );
        }
        for ((pid, tid), name) in std::mem::take(&mut self.threads) {
            meta_event(
                "thread_name",
                pid,
                tid,
                "name",
                Value::from(name.into_owned()),
            );
            meta_event(
                "thread_sort_index",
                pid,
                tid,
                "sort_index",
                Value::from(tid),
            );
        }

        let mut events: Vec<TraceEvent> = self
            .events
            .into_iter()
            .map(|e| TraceEvent {
                s: (e.ph == Phase::Instant).then_some(Scope::Thread),
                name: e.name,
                cat: e.cat,
                ph: e.ph,
                ts: e.time_ms.saturating_sub(origin).saturating_mul(1000),
                dur: e.dur_ms.map(|d| d.saturating_mul(1000)),
                pid: e.pid,
                tid: e.tid,
                args: e.args,
            })
            .collect();
        let origin_us = origin.saturating_mul(1000);
        events.extend(self.kernel_rows.into_iter().map(|r| {
            let start_us = r.start_ns / 1000;
            TraceEvent {
                name: r.name,
                cat: Some(Cow::Borrowed(r.cat)),
                ph: Phase::Complete,
                ts: start_us.saturating_sub(origin_us),
                dur: Some((r.end_ns / 1000).saturating_sub(start_us)),
                pid: r.pid,
                tid: r.tid,
                s: None,
                args: r.args,
            }
        }));
        // Stable: events of one time keep the order they were added in.
        events.sort_by_key(|e| e.ts);
        meta.extend(events);
        Trace {
            trace_events: meta,
            display_time_unit: "ms".into(),
            other_data: self.info,
        }
    }
}

/// Checks what a viewer relies on; returns one line per problem (empty: valid). Used by the
/// tests and by `gpudiag trace` itself before it renames the file into place.
pub fn validate(trace: &Trace) -> Vec<String> {
    let mut problems = Vec::new();
    if trace.other_data.format != TRACE_FORMAT {
        problems.push(format!("otherData.format is {:?}", trace.other_data.format));
    }
    let mut named_processes = std::collections::BTreeSet::new();
    let mut named_threads = std::collections::BTreeSet::new();
    let mut last_ts: BTreeMap<(u32, u32, bool), Micros> = BTreeMap::new();
    for (i, e) in trace.trace_events.iter().enumerate() {
        if e.name.is_empty() {
            problems.push(format!("event {i}: empty name"));
        }
        match e.ph {
            Phase::Metadata => {
                if !e.args.contains_key("name") && !e.args.contains_key("sort_index") {
                    problems.push(format!("event {i}: metadata {} without args", e.name));
                }
                match e.name.as_ref() {
                    "process_name" => {
                        named_processes.insert(e.pid);
                    }
                    "thread_name" => {
                        named_threads.insert((e.pid, e.tid));
                    }
                    _ => {}
                }
            }
            Phase::Counter => {
                if e.args.is_empty()
                    || !e
                        .args
                        .values()
                        .all(|v| v.as_f64().is_some_and(f64::is_finite))
                {
                    problems.push(format!(
                        "event {i}: counter {} needs finite numeric args",
                        e.name
                    ));
                }
            }
            Phase::Instant => {
                if e.s.is_none() {
                    problems.push(format!("event {i}: instant {} without scope", e.name));
                }
            }
            Phase::Complete => {
                if e.dur.is_none() {
                    problems.push(format!("event {i}: complete {} without dur", e.name));
                }
            }
        }
        if e.ph != Phase::Metadata {
            // Counters are per process in viewers; other events per thread.
            let key = (e.pid, e.tid, e.ph == Phase::Counter);
            if let Some(prev) = last_ts.insert(key, e.ts).filter(|&p| p > e.ts) {
                problems.push(format!(
                    "event {i}: ts {} goes back from {prev} on pid {} tid {}",
                    e.ts, e.pid, e.tid
                ));
            }
        }
    }
    for &(pid, tid, _) in last_ts.keys() {
        if !named_processes.contains(&pid) {
            problems.push(format!("pid {pid} has events but no process_name"));
        }
        if !named_threads.contains(&(pid, tid)) {
            problems.push(format!("pid {pid} tid {tid} has events but no thread_name"));
        }
    }
    problems.dedup();
    problems
}

/// `TraceEvent`'s schema lists every field an event may have; what each phase requires and
/// allows follows the Trace Event Format and what gpudiag writes: metadata events name or order
/// a process or thread with exactly one arg, counters carry numbers only, instant events a scope,
/// complete events a duration. A field of another phase (`dur` on an instant event) is refused.
pub(crate) fn trace_event_phases(schema: &mut Schema) {
    let ph = |p: Phase| serde_json::to_value(p).unwrap_or_default();
    let phases = json!([
        {
            "description": "Metadata: names and orders processes (GPUs, host) and threads \
                (telemetry, findings and events, probes, verdict, one per throttle reason).",
            "properties": {
                "ph": { "const": ph(Phase::Metadata) },
                "name": {
                    "enum": [
                        "process_name",
                        "thread_name",
                        "process_sort_index",
                        "thread_sort_index"
                    ]
                },
                "args": {
                    "type": "object",
                    "properties": {
                        "name": { "type": "string", "minLength": 1 },
                        "sort_index": { "type": "integer" }
                    },
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": false
                },
                "dur": false,
                "s": false
            },
            "required": ["args"]
        },
        {
            "description": "Counter: one metric group of one GPU (util %, memory MiB, power W, \
                temp C, clocks MHz, PCIe MB/s), written only when a value changed; absent values \
                are left out of args.",
            "properties": {
                "ph": { "const": ph(Phase::Counter) },
                "args": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": { "type": "number" }
                },
                "dur": false,
                "s": false
            },
            "required": ["args"]
        },
        {
            "description": "Instant: a finding (args: the whole finding), an XID (args.xid), a \
                lost GPU, a notice, or a change of a GPU's bottleneck verdict (cat verdict, args: \
                the whole verdict).",
            "properties": { "ph": { "const": ph(Phase::Instant) }, "dur": false },
            "required": ["s"]
        },
        {
            "description": "Complete: a throttle interval (cat throttle, args.reason_bit), a \
                probe phase (cat probe, args: its results), the time a lost GPU had no \
                telemetry (name GPU lost, cat event, args.reason) on its telemetry thread, or \
                with run --kernels a kernel, copy, memset or host wait in synchronisation (cat \
                kernel, gpu_memcpy, gpu_memset, cuda_sync; args as Kineto writes them) on a \
                thread per CUDA stream (or per process's host waits) numbered from 1000.",
            "properties": { "ph": { "const": ph(Phase::Complete) }, "s": false },
            "required": ["dur"]
        }
    ]);
    let object = schema.ensure_object();
    object.insert("oneOf".into(), phases);
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        let describe = |p: Option<&mut Value>, text: String| {
            if let Some(Value::Object(p)) = p {
                p.insert("description".into(), text.into());
            }
        };
        describe(
            properties.get_mut("ts"),
            "Microseconds since otherData.start_ms.".into(),
        );
        describe(
            properties.get_mut("dur"),
            "Microseconds; complete events only.".into(),
        );
        describe(
            properties.get_mut("pid"),
            format!("GPU index + 1, or {HOST_PID} for the host."),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::finding::{Evidence, Severity};

    const T0: TimeMs = 1_767_225_600_000;

    fn device(index: u32) -> DeviceInfo {
        DeviceInfo {
            index,
            name: Some("NVIDIA H200".into()),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x19 + index)),
            ..DeviceInfo::default()
        }
    }

    fn sample(device: u32, at: TimeMs, util: f64, throttle: Option<u64>) -> Sample {
        Sample {
            gpu_util_pct: Some(util),
            mem_util_pct: Some(10.0),
            power_w: Some(300.04),
            temp_gpu_c: Some(60.0),
            sm_clock_mhz: Some(1980),
            mem_used_bytes: Some(1024 * 1024 * 1024),
            throttle_reasons: throttle,
            ..Sample::new(device, T0 + at)
        }
    }

    fn finding() -> Finding {
        Finding {
            id: "errors.xid_48".into(),
            severity: Severity::Fail,
            device: Some(0),
            time_ms: T0 + 250,
            title: "XID 48: double-bit ECC error in GPU memory".into(),
            evidence: Evidence {
                values: gpudiag_model::finding::values([("xid", serde_json::json!(48))]),
                window_s: 0.0,
                threshold: "event".into(),
            },
            advice: "drain".into(),
            last_seen_ms: None,
            state: Default::default(),
            recorded: false,
        }
    }

    fn build() -> Trace {
        let host = HostInfo {
            hostname: Some("node-1".into()),
            ..HostInfo::default()
        };
        let mut b = TraceBuilder::new(
            "replay",
            Some("r.ndjson".into()),
            &host,
            vec![device(0), device(1)],
        );
        // 0x4 (power cap) for 100..300 ms, 0x1 (idle) never gets a track, 0x40 to the end.
        let ticks = [
            (0, 50.0, Some(0x1)),
            (100, 50.0, Some(0x4)),
            (200, 80.0, Some(0x44)),
            (300, 80.0, Some(0x40)),
        ];
        for (at, util, tr) in ticks {
            b.push_tick(&Tick {
                samples: vec![sample(0, at, util, tr), sample(1, at, 5.0, None)],
                events: if at == 200 {
                    vec![Event {
                        time_ms: T0 + 190,
                        device: Some(0),
                        kind: EventKind::Xid { xid: 48 },
                    }]
                } else {
                    Vec::new()
                },
                ras: Vec::new(),
                kernels: None,
            });
        }
        b.push_finding(&finding());
        let mut results = serde_json::Map::new();
        results.insert("gb_per_s".into(), serde_json::json!(55.5));
        b.push_probe(&ProbeSpan {
            name: "bandwidth h2d pinned".into(),
            device: Some(1),
            start_ms: T0 + 20,
            end_ms: T0 + 270,
            results,
        });
        b.finish()
    }

    fn of(trace: &Trace, ph: Phase, pid: u32) -> Vec<&TraceEvent> {
        trace
            .trace_events
            .iter()
            .filter(|e| e.ph == ph && e.pid == pid)
            .collect()
    }

    /// A job verdict's event names its stragglers, one or several, in the name a trace viewer
    /// lists; other verdicts by their name. The args carry the whole verdict.
    #[test]
    fn job_verdicts_name_every_straggler() {
        use gpudiag_model::job::{JobId, JobPattern, JobVerdict, JoinedBy, Pace, Straggler};
        let straggler = |device| Straggler {
            device,
            rank: Some(device),
            pace: Pace::Leads,
            metric: "sm_active_pct".into(),
            value: 90.0,
            peers_median: 45.0,
            peers_wait_share: Some(0.5),
            wait_estimate: "e".into(),
            differs: Vec::new(),
        };
        let job = |verdict, stragglers: Vec<Straggler>| JobVerdict {
            job: JobId {
                joined_by: JoinedBy::SlurmJob,
                key: "9001".into(),
            },
            presumed: false,
            members: Vec::new(),
            verdict,
            confidence: gpudiag_model::verdict::Confidence::High,
            start_ms: T0,
            end_ms: T0 + 1000,
            title: "t".into(),
            advice: "a".into(),
            stragglers,
            doubts: vec!["RANK 1 is read on 2 GPUs".into()],
            stall: None,
            peers: Vec::new(),
            ras: None,
            evidence: serde_json::Map::new(),
        };
        let several = job(JobPattern::Straggler, vec![straggler(2), straggler(6)]);
        let one = job(JobPattern::Straggler, vec![straggler(5)]);
        let comm = job(JobPattern::CommunicationBound, Vec::new());
        let mut b = TraceBuilder::new("replay", None, &HostInfo::default(), vec![device(0)]);
        b.push_job_verdicts([&several, &comm], [&one]);
        let trace = b.finish();
        let names: Vec<&str> = trace
            .trace_events
            .iter()
            .filter(|e| e.ph == Phase::Complete)
            .map(|e| e.name.as_ref())
            .collect();
        assert_eq!(
            names,
            [
                "job over the capture: stragglers GPU 2, 6 (Slurm job 9001)",
                "job over the capture: communication_bound (Slurm job 9001)",
                "job phase: straggler GPU 5 (Slurm job 9001)",
            ]
        );
        let first = trace
            .trace_events
            .iter()
            .find(|e| e.ph == Phase::Complete)
            .unwrap();
        assert_eq!(first.args["stragglers"][1]["device"], 6);
        assert_eq!(first.args["doubts"][0], "RANK 1 is read on 2 GPUs");
    }

    #[test]
    fn typed_round_trip() {
        let trace = build();
        let text = serde_json::to_string(&trace).unwrap();
        let back: Trace = serde_json::from_str(&text).unwrap();
        assert_eq!(back, trace);
        let raw: Value = serde_json::from_str(&text).unwrap();
        assert!(raw["traceEvents"].is_array());
        assert_eq!(raw["displayTimeUnit"], "ms");
        assert_eq!(raw["otherData"]["format"], TRACE_FORMAT);
        assert_eq!(raw["otherData"]["start_ms"], T0);
        assert!(validate(&trace).is_empty(), "{:?}", validate(&trace));
    }

    #[test]
    fn counters_are_grouped_and_unchanged_groups_skipped() {
        let trace = build();
        let util: Vec<&TraceEvent> = of(&trace, Phase::Counter, 1)
            .into_iter()
            .filter(|e| e.name == "util %")
            .collect();
        // 50, 50 (skipped), 80, 80 (skipped), then 80 again closing the track at the last sample.
        assert_eq!(util.len(), 3);
        assert_eq!(util[0].ts, 0);
        assert_eq!(util[1].ts, 200_000);
        assert_eq!(util[1].args["gpu"], 80.0);
        assert_eq!(util[1].args["memory"], 10.0);
        assert_eq!(util[2].ts, 300_000);
        assert_eq!(util[2].args, util[1].args);
        let power: Vec<&TraceEvent> = of(&trace, Phase::Counter, 1)
            .into_iter()
            .filter(|e| e.name == "power W")
            .collect();
        // Written once, closed at the last sample with the same value.
        assert_eq!(power.len(), 2);
        assert_eq!(power[1].args, power[0].args);
        // Rounded to 0.1 W; the absent limit is left out, not 0.
        assert_eq!(power[0].args["draw"], 300.0);
        assert!(!power[0].args.contains_key("limit"));
        let mem = of(&trace, Phase::Counter, 2)
            .into_iter()
            .find(|e| e.name == "memory MiB")
            .unwrap();
        assert_eq!(mem.args["used"], 1024.0);
        assert!(!mem.args.contains_key("free"));
        // No PCIe data at all: no PCIe counter.
        assert!(!trace.trace_events.iter().any(|e| e.name == "PCIe MB/s"));
    }

    #[test]
    fn throttle_runs_become_complete_events_without_idle() {
        let trace = build();
        let x: Vec<&TraceEvent> = of(&trace, Phase::Complete, 1);
        let names: Vec<&str> = x.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(names, ["sw_power_cap", "hw_thermal_slowdown"]);
        assert_eq!((x[0].ts, x[0].dur), (100_000, Some(200_000)));
        assert_eq!(x[0].tid, TID_THROTTLE_BASE + 2);
        // Still active at the end: closed at the last sample.
        assert_eq!((x[1].ts, x[1].dur), (200_000, Some(100_000)));
        assert!(!trace.trace_events.iter().any(|e| e.name == "gpu_idle"));
        let thread = trace
            .trace_events
            .iter()
            .find(|e| {
                e.ph == Phase::Metadata && e.tid == TID_THROTTLE_BASE + 2 && e.name == "thread_name"
            })
            .unwrap();
        assert_eq!(thread.args["name"], "throttle: sw_power_cap");
    }

    #[test]
    fn findings_xids_and_probes() {
        let trace = build();
        let i = of(&trace, Phase::Instant, 1);
        assert_eq!(i.len(), 2);
        assert_eq!(i[0].name, "XID 48");
        assert_eq!(i[0].ts, 190_000);
        assert_eq!(i[0].args["xid"], 48);
        assert_eq!(
            i[1].name,
            "fail: XID 48: double-bit ECC error in GPU memory"
        );
        assert_eq!(i[1].args["id"], "errors.xid_48");
        assert_eq!(i[1].args["severity"], "fail");
        assert_eq!(i[1].s, Some(Scope::Thread));
        let probe = of(&trace, Phase::Complete, 2)[0];
        assert_eq!(probe.name, "bandwidth h2d pinned");
        assert_eq!((probe.ts, probe.dur), (20_000, Some(250_000)));
        assert_eq!(probe.args["gb_per_s"], 55.5);
        assert_eq!(probe.tid, TID_PROBES);
        let process = trace
            .trace_events
            .iter()
            .find(|e| e.ph == Phase::Metadata && e.pid == 1 && e.name == "process_name")
            .unwrap();
        assert_eq!(process.args["name"], "GPU 0 NVIDIA H200 (00000000:19:00.0)");
    }

    #[test]
    fn validator_catches_broken_traces() {
        let good = build();
        let mut t = good.clone();
        let last = t
            .trace_events
            .iter()
            .rposition(|e| e.ph == Phase::Instant)
            .unwrap();
        t.trace_events[last].ts = 0;
        t.trace_events[last].ph = Phase::Instant;
        t.trace_events[last].s = None;
        let problems = validate(&t);
        assert!(
            problems.iter().any(|p| p.contains("without scope")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("goes back")),
            "{problems:?}"
        );
        let mut t = good.clone();
        t.trace_events.retain(|e| e.name != "process_name");
        assert!(validate(&t).iter().any(|p| p.contains("no process_name")));
        let mut t = good;
        if let Some(e) = t.trace_events.iter_mut().find(|e| e.ph == Phase::Complete) {
            e.dur = None;
        }
        assert!(validate(&t).iter().any(|p| p.contains("without dur")));
    }

    fn lost_sample(device: u32, at: TimeMs) -> Sample {
        gpudiag_telemetry::sanity::all_absent(
            device,
            T0 + at,
            &gpudiag_model::sample::Absent::GpuLost,
        )
    }

    fn counters_of(trace: &Trace, pid: u32) -> Vec<&TraceEvent> {
        of(trace, Phase::Counter, pid)
    }

    fn lost_spans(trace: &Trace, pid: u32) -> Vec<(Micros, Option<Micros>)> {
        of(trace, Phase::Complete, pid)
            .into_iter()
            .filter(|e| e.name == LOST_SPAN)
            .map(|e| (e.ts, e.dur))
            .collect()
    }

    #[test]
    fn a_lost_gpu_counters_end_at_the_loss_with_their_last_values() {
        let mut b = TraceBuilder::new(
            "nvml",
            None,
            &HostInfo::default(),
            vec![device(0), device(1)],
        );
        b.push_tick(&Tick {
            samples: vec![sample(0, 0, 50.0, Some(0x4)), sample(1, 0, 30.0, Some(0x4))],
            events: Vec::new(),
            ras: Vec::new(),
            kernels: None,
        });
        b.push_tick(&Tick {
            samples: vec![sample(0, 100, 60.0, None), sample(1, 100, 40.0, Some(0x4))],
            events: Vec::new(),
            ras: Vec::new(),
            kernels: None,
        });
        // The loss, as NVML reports it: the device_lost event and samples of `gpu_lost`.
        for at in [200, 300, 400] {
            b.push_tick(&Tick {
                samples: vec![sample(0, at, 70.0, None), lost_sample(1, at)],
                events: if at == 200 {
                    vec![Event {
                        time_ms: T0 + 200,
                        device: Some(1),
                        kind: EventKind::DeviceLost {
                            reason: "GPU is lost".into(),
                        },
                    }]
                } else {
                    Vec::new()
                },
                ras: Vec::new(),
                kernels: None,
            });
        }
        let trace = b.finish();
        assert!(validate(&trace).is_empty(), "{:?}", validate(&trace));
        let lost = counters_of(&trace, 2);
        assert!(lost.iter().all(|e| e.ts <= 200_000), "{lost:?}");
        // Every group it had is written at the loss with the values from before it.
        let at_loss: Vec<&&TraceEvent> = lost.iter().filter(|e| e.ts == 200_000).collect();
        let groups: std::collections::BTreeSet<&str> =
            lost.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(at_loss.len(), groups.len(), "{lost:?}");
        let util = at_loss.iter().find(|e| e.name == "util %").unwrap();
        assert_eq!(util.args["gpu"], 40.0);
        assert_eq!(lost_spans(&trace, 2), [(200_000, Some(200_000))]);
        let span = of(&trace, Phase::Complete, 2)
            .into_iter()
            .find(|e| e.name == LOST_SPAN)
            .unwrap();
        assert_eq!(span.tid, TID_TELEMETRY);
        assert_eq!(span.args["reason"], "GPU is lost");
        // Its throttle run ends at the loss too, not at the end of the capture.
        let runs: Vec<(Micros, Option<Micros>)> = of(&trace, Phase::Complete, 2)
            .into_iter()
            .filter(|e| e.name == "sw_power_cap")
            .map(|e| (e.ts, e.dur))
            .collect();
        assert_eq!(runs, [(0, Some(200_000))]);
        // The other GPU runs to the end.
        assert!(counters_of(&trace, 1).iter().any(|e| e.ts == 400_000));
        assert!(lost_spans(&trace, 1).is_empty());
    }

    #[test]
    fn an_xid_79_alone_ends_the_counters_and_values_after_it_resume_them() {
        let mut b = TraceBuilder::new("sysfs", None, &HostInfo::default(), vec![device(0)]);
        b.push_sample(&sample(0, 0, 50.0, None));
        b.push_event(&Event {
            time_ms: T0 + 150,
            device: Some(0),
            kind: EventKind::Xid { xid: 79 },
        });
        b.push_sample(&lost_sample(0, 200));
        // A card that re-enumerated after a reset reports again.
        b.push_sample(&sample(0, 300, 10.0, None));
        b.push_sample(&sample(0, 400, 10.0, None));
        let trace = b.finish();
        assert!(validate(&trace).is_empty(), "{:?}", validate(&trace));
        let util: Vec<(Micros, f64)> = counters_of(&trace, 1)
            .into_iter()
            .filter(|e| e.name == "util %")
            .map(|e| (e.ts, e.args["gpu"].as_f64().unwrap()))
            .collect();
        assert_eq!(
            util,
            [(0, 50.0), (150_000, 50.0), (300_000, 10.0), (400_000, 10.0)]
        );
        assert_eq!(lost_spans(&trace, 1), [(150_000, Some(150_000))]);
        // Other XIDs end nothing.
        let mut b = TraceBuilder::new("nvml", None, &HostInfo::default(), vec![device(0)]);
        b.push_sample(&sample(0, 0, 50.0, None));
        b.push_event(&Event {
            time_ms: T0 + 150,
            device: Some(0),
            kind: EventKind::Xid { xid: 48 },
        });
        b.push_sample(&sample(0, 300, 50.0, None));
        let trace = b.finish();
        assert!(lost_spans(&trace, 1).is_empty());
        assert_eq!(
            counters_of(&trace, 1).iter().map(|e| e.ts).max(),
            Some(300_000)
        );
    }

    /// The trace of `run --kernels`: every kernel, copy, set and host wait beside the GPU's
    /// counters, on one clock, with microsecond durations and Kineto's fields.
    pub(crate) fn kernels_trace(keep: usize) -> (Trace, gpudiag_model::kernels::KernelsSummary) {
        use gpudiag_core::kernels::synthetic::{UNIX0, training_stream};
        use gpudiag_core::kernels::{KernelsAggregator, Limits};
        let mut a = KernelsAggregator::new(
            Limits {
                kept_records: keep,
                ..Limits::default()
            },
            true,
        );
        for m in training_stream(4242, "GPU-1111") {
            a.push(&m);
        }
        let gpu = DeviceInfo {
            uuid: Some("GPU-1111".into()),
            ..device(2)
        };
        let mut b = TraceBuilder::new("nvml", None, &HostInfo::default(), vec![gpu]);
        let first_ms = UNIX0 / 1_000_000;
        for i in 0..6u32 {
            b.push_sample(&Sample {
                gpu_util_pct: Some(60.0 + f64::from(i)),
                ..Sample::new(2, first_ms + 100 * u64::from(i))
            });
        }
        b.push_kernel_records(&a.take_kept().unwrap_or_default());
        (b.finish(), a.summary())
    }

    #[test]
    fn kernel_rows_sit_beside_the_counters_in_kinetos_layout() {
        let (t, summary) = kernels_trace(1_000_000);
        assert!(validate(&t).is_empty(), "{:?}", validate(&t));
        let rows = |cat: &str| -> Vec<&TraceEvent> {
            t.trace_events
                .iter()
                .filter(|e| e.cat.as_deref() == Some(cat))
                .collect()
        };
        let kernels = rows("kernel");
        assert_eq!(kernels.len() as u64, summary.gpus[0].kernels);
        // On the GPU's own process, beside its counters, one thread per stream.
        assert!(
            kernels
                .iter()
                .all(|e| e.pid == 3 && e.ph == Phase::Complete)
        );
        let add = kernels
            .iter()
            .find(|e| {
                e.name
                    .starts_with("void at::native::vectorized_elementwise_kernel<4,")
            })
            .unwrap();
        assert_eq!(add.dur, Some(2));
        for key in [
            "device",
            "stream",
            "correlation",
            "grid",
            "block",
            "registers per thread",
            "shared memory",
        ] {
            assert!(add.args.contains_key(key), "{key}: {:?}", add.args);
        }
        assert_eq!(add.args["stream"], 7);
        let streams: std::collections::BTreeSet<u32> = kernels.iter().map(|e| e.tid).collect();
        assert_eq!(streams.len(), 2);
        // The matmul starts 600 µs after the first copy, on the counters' clock.
        let first_counter = of(&t, Phase::Counter, 3)[0].ts;
        let matmul = kernels
            .iter()
            .find(|e| e.name.starts_with("sm90_xmma"))
            .unwrap();
        assert_eq!(matmul.ts - first_counter, 600);
        assert_eq!(matmul.dur, Some(5_000));
        let copies = rows("gpu_memcpy");
        assert_eq!(copies[0].name, "Memcpy HtoD (Pageable -> Device)");
        assert_eq!(copies[0].args["bytes"], 4 << 20);
        assert_eq!(rows("gpu_memset")[0].name, "Memset (Device)");
        let syncs = rows("cuda_sync");
        assert_eq!(syncs[0].name, "Stream Sync");
        assert_eq!(syncs[0].args["stream"], -1);
        assert_eq!(syncs[0].args["wait_on_stream"], 7);
        let named: Vec<&str> = t
            .trace_events
            .iter()
            .filter(|e| e.name == "thread_name" && e.pid == 3)
            .filter_map(|e| e.args["name"].as_str())
            .collect();
        assert!(named.contains(&"stream 20 (pid 4242)"), "{named:?}");
        assert!(named.contains(&"host waits (pid 4242)"), "{named:?}");
        let info = t.other_data.kernel_records.unwrap();
        assert_eq!(info.left_out, 0);
        assert_eq!(
            info.written as usize,
            kernels.len() + copies.len() + 47 + syncs.len()
        );
    }

    /// Under `--kernels=sample` the windows are drawn, and the gaps between them say they are
    /// time nobody looked at: Perfetto would otherwise show them as an idle GPU.
    #[test]
    fn sampled_windows_and_the_gaps_between_them_are_drawn_on_their_own_track() {
        use gpudiag_core::kernels::synthetic::sampled_stream;
        use gpudiag_core::kernels::{KernelsAggregator, Limits};
        let mut a = KernelsAggregator::new(Limits::default(), true);
        for m in sampled_stream(77) {
            a.push(&m);
        }
        let kept = a.take_kept().unwrap();
        assert_eq!(kept.windows.len(), 1);
        let mut b = TraceBuilder::new("nvml", None, &HostInfo::default(), Vec::new());
        b.push_kernel_records(&kept);
        let t = b.finish();
        assert!(validate(&t).is_empty(), "{:?}", validate(&t));
        let first_us = t
            .trace_events
            .iter()
            .filter(|e| e.ph != Phase::Metadata)
            .map(|e| e.ts)
            .min()
            .unwrap();
        let track: Vec<(&str, u64, u64)> = t
            .trace_events
            .iter()
            .filter(|e| e.cat.as_deref() == Some("kernels_window"))
            .map(|e| {
                assert_eq!((e.pid, e.tid), (HOST_PID, TID_SAMPLING_BASE));
                (
                    e.name.as_ref(),
                    (e.ts - first_us) / 1_000,
                    e.dur.unwrap() / 1_000,
                )
            })
            .collect();
        // Two closed windows and the open one, which runs to the process's last record (the
        // 25th kernel of the third window ends 49 ms in).
        assert_eq!(
            track,
            [
                ("kernels recorded", 0, 100),
                ("not recorded", 100, 900),
                ("kernels recorded", 1_000, 100),
                ("not recorded", 1_100, 900),
                ("kernels recorded", 2_000, 49),
            ]
        );
        assert_eq!(
            t.other_data.kernel_records.unwrap().sampled_windows,
            Some(3)
        );
        assert!(t.trace_events.iter().any(|e| e.name == "thread_name"
            && e.tid == TID_SAMPLING_BASE
            && e.args.get("name") == Some(&Value::from("kernels recorded (pid 77)"))));
    }

    #[test]
    fn kernel_rows_past_the_cap_are_counted_in_the_metadata() {
        let (t, _) = kernels_trace(100);
        let info = t.other_data.kernel_records.unwrap();
        assert_eq!(info.written, 100);
        assert!(info.left_out > 1_000, "{info:?}");
        assert!(validate(&t).is_empty());
        // Without --kernels the metadata says nothing of them.
        let plain = build();
        assert_eq!(plain.other_data.kernel_records, None);
        assert!(
            !serde_json::to_string(&plain)
                .unwrap()
                .contains("kernel_records")
        );
    }

    #[test]
    fn empty_trace_is_valid() {
        let t = TraceBuilder::new("nvml", None, &HostInfo::default(), Vec::new()).finish();
        assert!(t.trace_events.is_empty());
        assert_eq!(t.other_data.start_ms, None);
        assert!(validate(&t).is_empty());
    }
}
