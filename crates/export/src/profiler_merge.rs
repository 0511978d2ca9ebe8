//! Merging gpudiag's tracks into a PyTorch profiler (Kineto) trace: `gpudiag trace --merge` and
//! `gpudiag run --profiler-trace`.
//!
//! Profiler traces run to hundreds of MB, so the profiler's file is streamed, never held: its
//! top-level keys and each of its events are copied through as the raw JSON text they were
//! (serde_json's `RawValue`), one at a time, while a small peek at each event keeps the trace's
//! time span and its largest numeric pid. gpudiag's own events (a finished [`Trace`]) are
//! appended at the end of `traceEvents`, when both are known; viewers and HolisticTraceAnalysis
//! do not depend on event order. Memory is the read and write buffers, one event, and
//! gpudiag's trace, whatever the profiler trace's size; one event or top-level value larger than
//! [`MAX_VALUE_BYTES`] is refused rather than buffered.
//!
//! Clock: Kineto (torch 2.4 and later) writes `baseTimeNanoseconds`, and every `ts` is
//! microseconds after it, so wall-clock µs = baseTimeNanoseconds / 1000 + ts. Kineto writes
//! that key after `traceEvents` in the torch versions of 2024 and before it in torch 2.11, so
//! when `traceEvents` comes first a first pass skims the file for the key (skipping the events
//! without buffering them). Traces from before the key existed carry epoch microseconds in
//! `ts` itself, which is recognised by their size.
//!
//! Times that cannot be real: an event whose `ts` or end (`ts + dur`) is not a finite number, is
//! not a wall-clock time between 1970 and 2262 once on the profiler's clock, or lies far outside
//! the bulk of the trace's events is skipped when the trace's time span is taken (so one stray
//! event cannot widen the overlap gpudiag's tracks are added over), counted, and said (a warning,
//! and `skipped_events` in the merged trace's `gpudiag` object). It is still copied through
//! unchanged, like every profiler event: the merged file is the profiler's own, and a viewer or
//! analysis reading it should see what the profiler wrote. The bulk runs from the 1st
//! percentile of the timed events' starts to the 99th percentile of their ends (so a long
//! event such as a profiler step counts by its end); an event is far outside it when it starts
//! or ends more than the bulk's own length (at least [`MIN_MARGIN_US`]) before or after it.
//! Percentiles are taken from histograms of at most [`MAX_BUCKETS`] buckets, in a first pass
//! over the file (the one that also finds `baseTimeNanoseconds`), so memory stays flat. A trace of fewer than 100 timed events has percentiles that are its extremes: nothing
//! in it is far from the bulk.
//!
//! Ids: Kineto's GPU events use the device index as pid, its CPU events the OS pid, and a few
//! pseudo-processes use strings ("Spans", "Traces", ""). gpudiag's processes are numbered from
//! [`PID_BASE`] (above Linux's largest possible pid, 2^22), or from one past the profiler's
//! largest numeric pid if that is higher: the host process at the base and GPU `i` at base + 1 +
//! i, each named "gpudiag: ...". Only the time both cover is added; gpudiag's counters that
//! changed before it start at its beginning with the value they had.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::atomic::write_atomic;
use crate::chrome_trace::{HOST_PID, Phase, Trace, TraceEvent, TraceInfo};
use gpudiag_model::error::Error;
use gpudiag_model::printable;

/// gpudiag's first pid in a merged trace.
pub const PID_BASE: u32 = 0x4000_0000;
/// The most one event, or one top-level value other than `traceEvents`, may take. Kineto's
/// largest events (a kernel with its launch arguments, an op with its input shapes and a Python
/// stack) are a few KB.
pub const MAX_VALUE_BYTES: u64 = 16 << 20;
/// The top-level key gpudiag adds: what was merged and how it was aligned.
pub const MERGE_KEY: &str = "gpudiag";
/// Kineto sorts GPU `i` at 0x1000000 + i; gpudiag's processes come right after.
const SORT_BASE: i64 = 0x0100_0000 + 0x100;
/// Epoch microseconds of 2001-09-09: a `ts` at least this large is a wall-clock time itself.
const EPOCH_US_FLOOR: f64 = 1e15;
const READ_BUFFER: usize = 256 << 10;
/// The least an event may lie beyond the bulk of a trace's events and still count: 1 s.
pub const MIN_MARGIN_US: f64 = 1e6;
/// Buckets a histogram of event times keeps at most; past it, they double in width.
pub const MAX_BUCKETS: usize = 4096;
/// The finest bucket: 1 ms.
const FIRST_BUCKET_US: f64 = 1e3;
/// Wall-clock microseconds that nanoseconds in an i64 reach (the year 2262).
const MAX_WALL_US: f64 = 9.2e15;
/// `ts` values further from zero than this are not histogrammed (as µs, 3000 years).
const MAX_TS_US: f64 = 1e17;

/// What the merged file's [`MERGE_KEY`] holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct MergeInfo {
    /// gpudiag's trace metadata (its `otherData` when written alone).
    pub trace: TraceInfo,
    /// The profiler trace's file name.
    pub profiler_trace: String,
    /// The profiler's `baseTimeNanoseconds`; `None` for a trace whose `ts` are epoch µs.
    pub base_time_ns: Option<u64>,
    /// gpudiag's host process; GPU `i` is `pid_base + 1 + i`.
    pub pid_base: u32,
    /// The time both cover, epoch milliseconds: what was added.
    pub window_start_ms: f64,
    pub window_end_ms: f64,
    /// Profiler events whose times cannot be real (not finite, not a wall-clock time, or far
    /// outside the bulk of the trace's events), left out of its time span; they are still
    /// copied through unchanged.
    #[serde(default)]
    pub skipped_events: u64,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeSummary {
    pub info: MergeInfo,
    /// Events copied from the profiler trace.
    pub profiler_events: u64,
    /// gpudiag's events added.
    pub added_events: usize,
}

impl MergeSummary {
    /// What a user should hear about the merge besides its result.
    pub fn warning(&self) -> Option<String> {
        let n = self.info.skipped_events;
        (n > 0).then(|| {
            format!(
                "{n} profiler event{} with times that cannot be real (not finite, or far outside \
                 the trace's other events) left out of its time span; copied through unchanged",
                if n == 1 { "" } else { "s" }
            )
        })
    }
}

/// Merges `ours` into the profiler trace at `profiler`, writing `output` (gzip when its name
/// ends in `.gz`) whole or not at all.
pub fn merge(profiler: &Path, ours: &Trace, output: &Path) -> Result<MergeSummary, Error> {
    if same_file(profiler, output) {
        return Err(Error::Usage(format!(
            "the merged trace {} would replace the profiler trace it reads",
            output.display()
        )));
    }
    let gzip_out = output.extension().is_some_and(|e| e == "gz");
    let mut failure: Option<Error> = None;
    let mut summary = None;
    let written = write_atomic(output, |w| {
        let result = if gzip_out {
            let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
            let r = merge_into(profiler, ours, &mut gz);
            r.and_then(|s| {
                gz.finish()
                    .map_err(|e| Error::io("writing the merged trace", e))?;
                Ok(s)
            })
        } else {
            merge_into(profiler, ours, w)
        };
        match result {
            Ok(s) => {
                summary = Some(s);
                Ok(())
            }
            Err(e) => {
                failure = Some(e);
                Err(io::Error::other("merge failed"))
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    written?;
    summary.ok_or_else(|| Error::CannotRun("the merge ended without a result".into()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Streams the merge into `out`.
pub fn merge_into(
    profiler: &Path,
    ours: &Trace,
    out: &mut dyn Write,
) -> Result<MergeSummary, Error> {
    let scanned = scan(profiler)?;
    let budget = Budget::new(MAX_VALUE_BYTES);
    let reader = open(profiler, &budget)?;
    let mut state = MergeState {
        path: profiler,
        ours,
        out,
        budget: budget.clone(),
        base_time_ns: scanned.base_time_ns,
        bulk_us: allowed(&scanned.starts, &scanned.ends),
        skipped: 0,
        profiler_events: 0,
        span_us: None,
        max_pid: None,
        added: 0,
        info: None,
        write_error: None,
    };
    let mut de = serde_json::Deserializer::from_reader(reader);
    let parsed = TopLevel(&mut state)
        .deserialize(&mut de)
        .and_then(|()| de.end());
    if let Some(e) = state.write_error.take() {
        return Err(Error::io("writing the merged trace", e));
    }
    parsed.map_err(|e| read_error(profiler, &budget, &e))?;
    let info = state
        .info
        .take()
        .ok_or_else(|| Error::CannotRun("the merge ended without a result".into()))?;
    Ok(MergeSummary {
        info,
        profiler_events: state.profiler_events,
        added_events: state.added,
    })
}

/// A reading or parsing failure in words a user can act on.
fn read_error(path: &Path, budget: &Budget, e: &serde_json::Error) -> Error {
    let name = path.display();
    if budget.tripped.get() {
        return Error::Usage(format!(
            "{name}: one event or value is larger than {} MiB; not a profiler trace gpudiag can \
             merge",
            MAX_VALUE_BYTES >> 20
        ));
    }
    let text = e.to_string();
    let what = printable::line(&text);
    Error::Usage(match e.classify() {
        serde_json::error::Category::Io => format!("cannot read {name}: {what}"),
        serde_json::error::Category::Eof => {
            format!("{name} ends early (a truncated or partly written trace): {what}")
        }
        serde_json::error::Category::Syntax => {
            format!("{name} is not a JSON profiler trace: {what}")
        }
        serde_json::error::Category::Data => format!("{name}: {what}"),
    })
}

/// How many bytes the reader has handed out since the last reset, and the most it may.
#[derive(Clone)]
struct Budget(Rc<BudgetState>);

struct BudgetState {
    used: Cell<u64>,
    limit: Cell<u64>,
    tripped: Cell<bool>,
}

impl Budget {
    fn new(limit: u64) -> Self {
        Budget(Rc::new(BudgetState {
            used: Cell::new(0),
            limit: Cell::new(limit),
            tripped: Cell::new(false),
        }))
    }
    fn reset(&self) {
        self.0.used.set(0);
    }
    fn set_limit(&self, limit: u64) {
        self.0.limit.set(limit);
        self.reset();
    }
}

impl std::ops::Deref for Budget {
    type Target = BudgetState;
    fn deref(&self) -> &BudgetState {
        &self.0
    }
}

/// Counts what passes, below the read buffer, and fails once one value has taken more than
/// the budget: serde_json buffers a `RawValue` whole, so this is what bounds memory on an
/// endless string or array. The count includes the buffer's read-ahead, so the bound is the
/// budget plus one buffer.
struct Budgeted<R> {
    inner: R,
    budget: Budget,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let used = self.budget.used.get().saturating_add(n as u64);
        self.budget.used.set(used);
        if used > self.budget.limit.get() {
            self.budget.tripped.set(true);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "value too large",
            ));
        }
        Ok(n)
    }
}

/// The file, gunzipped when it starts with gzip's magic bytes (whatever its name), behind the
/// budget and a read buffer.
fn open(path: &Path, budget: &Budget) -> Result<BufReader<Budgeted<Box<dyn Read>>>, Error> {
    let file = File::open(path).map_err(|e| {
        Error::io(
            format!("cannot open the profiler trace {}", path.display()),
            e,
        )
    })?;
    let mut head = BufReader::with_capacity(READ_BUFFER, file);
    let magic = head
        .fill_buf()
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    let inner: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(head))
    } else {
        Box::new(head)
    };
    Ok(BufReader::with_capacity(
        READ_BUFFER,
        Budgeted {
            inner,
            budget: budget.clone(),
        },
    ))
}

/// Everything the streaming pass keeps.
struct MergeState<'a> {
    path: &'a Path,
    ours: &'a Trace,
    out: &'a mut dyn Write,
    budget: Budget,
    /// From the first pass.
    base_time_ns: Option<u64>,
    /// Where an event's times may lie, the profiler's µs: the bulk with its margins.
    bulk_us: Option<(f64, f64)>,
    /// Timed events left out of the span.
    skipped: u64,
    profiler_events: u64,
    /// Earliest start and latest end of the profiler's timed events, its µs.
    span_us: Option<(f64, f64)>,
    max_pid: Option<u64>,
    added: usize,
    info: Option<MergeInfo>,
    /// A failure writing the output, kept apart from the input's errors.
    write_error: Option<io::Error>,
}

impl MergeState<'_> {
    fn write<E: de::Error>(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.out.write_all(bytes).map_err(|e| {
            let msg = e.to_string();
            self.write_error = Some(e);
            E::custom(msg)
        })
    }

    /// Notes an event's pid and time; times that cannot be real are counted, not noted.
    fn observe(&mut self, event: &Peek<'_>) {
        if let Some(pid) = event.pid.and_then(|p| p.get().parse::<u64>().ok()) {
            self.max_pid = Some(self.max_pid.map_or(pid, |m| m.max(pid)));
        }
        let Some((ts, end)) = event.times() else {
            return;
        };
        let base_us = self.base_time_ns.map_or(0.0, |b| b as f64 / 1000.0);
        let wall = |us: f64| (0.0..=MAX_WALL_US).contains(&(base_us + us));
        let in_bulk = |us: f64| self.bulk_us.is_none_or(|(lo, hi)| (lo..=hi).contains(&us));
        let real = ts.is_finite() && end.is_finite() && wall(ts) && wall(end);
        if !(real && in_bulk(ts) && in_bulk(end)) {
            self.skipped += 1;
            return;
        }
        self.span_us = Some(match self.span_us {
            Some((lo, hi)) => (lo.min(ts), hi.max(end)),
            None => (ts, end),
        });
    }
}

/// The fields of a profiler event the merge looks at; the rest is skipped unparsed.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    ph: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pid: Option<&'a RawValue>,
    #[serde(borrow, default)]
    ts: Option<&'a RawValue>,
    #[serde(borrow, default)]
    dur: Option<&'a RawValue>,
}

impl Peek<'_> {
    /// A timed event's start and end, the profiler's µs, as written (maybe not finite); `None`
    /// for metadata and events without a numeric `ts`. A `dur` that is not a positive number
    /// is no duration.
    fn times(&self) -> Option<(f64, f64)> {
        if self.ph.as_deref() == Some("M") {
            return None;
        }
        let number = |v: Option<&RawValue>| v.and_then(|v| v.get().parse::<f64>().ok());
        let ts = number(self.ts).filter(|t| !t.is_nan())?;
        let dur = number(self.dur).filter(|d| *d > 0.0).unwrap_or(0.0);
        Some((ts, ts + dur))
    }
}

/// A histogram of event times in bounded memory, for percentiles: buckets `width` µs wide,
/// doubling in width (and merging in pairs) whenever there would be more than [`MAX_BUCKETS`].
#[derive(Debug, Default)]
struct Times {
    width: f64,
    buckets: BTreeMap<i64, u64>,
    count: u64,
}

impl Times {
    fn add(&mut self, ts: f64) {
        if !ts.is_finite() || ts.abs() > MAX_TS_US {
            return;
        }
        if self.width == 0.0 {
            self.width = FIRST_BUCKET_US;
        }
        *self
            .buckets
            .entry((ts / self.width).floor() as i64)
            .or_default() += 1;
        self.count += 1;
        while self.buckets.len() > MAX_BUCKETS {
            self.width *= 2.0;
            let old = std::mem::take(&mut self.buckets);
            for (k, n) in old {
                *self.buckets.entry(k.div_euclid(2)).or_default() += n;
            }
        }
    }

    /// The start of the bucket holding the `rank`-th start (0-based), and its end.
    fn bucket_of(&self, rank: u64) -> Option<(f64, f64)> {
        let mut seen = 0;
        for (&k, &n) in &self.buckets {
            seen += n;
            if seen > rank {
                let lo = k as f64 * self.width;
                return Some((lo, lo + self.width));
            }
        }
        None
    }

    /// The bucket of the 1st percentile (`high`: the 99th) of the times.
    fn percentile_bucket(&self, high: bool) -> Option<(f64, f64)> {
        let last = self.count.checked_sub(1)?;
        self.bucket_of(if high { last - last / 100 } else { last / 100 })
    }
}

/// Where an event's times may lie: from the 1st percentile of the starts to the 99th of the
/// ends, widened on each side by that span (at least [`MIN_MARGIN_US`]). `None` without times.
fn allowed(starts: &Times, ends: &Times) -> Option<(f64, f64)> {
    let (lo, _) = starts.percentile_bucket(false)?;
    let (_, hi) = ends.percentile_bucket(true)?;
    let margin = (hi - lo).max(MIN_MARGIN_US);
    Some((lo - margin, hi + margin))
}

/// The top-level object: copied key by key, `traceEvents` element by element.
struct TopLevel<'s, 'a>(&'s mut MergeState<'a>);

impl<'de> DeserializeSeed<'de> for TopLevel<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopLevel<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a profiler trace: a JSON object with traceEvents")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
        let state = self.0;
        state.write(b"{")?;
        let mut first = true;
        let mut events_seen = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            state.budget.reset();
            if !first {
                state.write(b",\n")?;
            }
            first = false;
            let quoted = serde_json::to_string(&key).map_err(M::Error::custom)?;
            state.write(quoted.as_bytes())?;
            state.write(b":")?;
            match key.as_ref() {
                "traceEvents" => {
                    if events_seen {
                        return Err(M::Error::custom("traceEvents appears twice"));
                    }
                    events_seen = true;
                    map.next_value_seed(Events(&mut *state))?;
                }
                MERGE_KEY => {
                    return Err(M::Error::custom(
                        "it already holds gpudiag's tracks (a merged trace); merge into the \
                         profiler's original",
                    ));
                }
                // The first pass read baseTimeNanoseconds already, wherever it is.
                _ => {
                    let raw: Box<RawValue> = map.next_value()?;
                    state.write(raw.get().as_bytes())?;
                }
            }
        }
        if !events_seen {
            return Err(M::Error::custom(
                "it has no traceEvents: not a PyTorch profiler trace",
            ));
        }
        let info = state
            .info
            .clone()
            .ok_or_else(|| M::Error::custom("nothing was merged"))?;
        let info = serde_json::to_string(&info).map_err(M::Error::custom)?;
        state.write(format!(",\n\"{MERGE_KEY}\":{info}}}\n").as_bytes())
    }
}

/// `baseTimeNanoseconds`: a non-negative integer.
fn base_time(raw: &RawValue) -> Result<u64, String> {
    raw.get().trim().parse::<u64>().map_err(|_| {
        format!(
            "baseTimeNanoseconds is {}, not a whole number of nanoseconds",
            printable::line(&raw.get().chars().take(40).collect::<String>())
        )
    })
}

/// What the first pass learns.
struct Scanned {
    base_time_ns: Option<u64>,
    starts: Times,
    ends: Times,
}

/// The first pass: `baseTimeNanoseconds` (Kineto writes it before or after its events,
/// depending on the version) and a histogram of the events' starts, each event read whole
/// (under the same bound as the copying pass) but only its times kept.
fn scan(path: &Path) -> Result<Scanned, Error> {
    let budget = Budget::new(u64::MAX);
    let reader = open(path, &budget)?;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let (mut starts, mut ends) = (Times::default(), Times::default());
    let found = ScanBase {
        budget: budget.clone(),
        times: (&mut starts, &mut ends),
    }
    .deserialize(&mut de)
    .map_err(|e| read_error(path, &budget, &e))?;
    let base_time_ns = found
        .transpose()
        .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
    Ok(Scanned {
        base_time_ns,
        starts,
        ends,
    })
}

struct ScanBase<'s> {
    budget: Budget,
    times: (&'s mut Times, &'s mut Times),
}

impl<'de> DeserializeSeed<'de> for ScanBase<'_> {
    type Value = Option<Result<u64, String>>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ScanBase<'_> {
    type Value = Option<Result<u64, String>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a profiler trace: a JSON object with traceEvents")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "baseTimeNanoseconds" {
                self.budget.set_limit(MAX_VALUE_BYTES);
                let raw: Box<RawValue> = map.next_value()?;
                found = Some(base_time(&raw));
                self.budget.set_limit(u64::MAX);
            } else if key == "traceEvents" {
                map.next_value_seed(ScanEvents {
                    budget: self.budget.clone(),
                    times: (&mut *self.times.0, &mut *self.times.1),
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

struct ScanEvents<'s> {
    budget: Budget,
    /// Starts and ends.
    times: (&'s mut Times, &'s mut Times),
}

impl<'de> DeserializeSeed<'de> for ScanEvents<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ScanEvents<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("traceEvents: an array of events")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        loop {
            self.budget.set_limit(MAX_VALUE_BYTES);
            let Some(raw) = seq.next_element::<Box<RawValue>>()? else {
                break;
            };
            if let Some((ts, end)) = serde_json::from_str::<Peek<'_>>(raw.get())
                .ok()
                .and_then(|e| e.times())
            {
                self.times.0.add(ts);
                self.times.1.add(end);
            }
        }
        self.budget.set_limit(u64::MAX);
        Ok(())
    }
}

/// `traceEvents`: each event copied as it was, then gpudiag's.
struct Events<'s, 'a>(&'s mut MergeState<'a>);

impl<'de> DeserializeSeed<'de> for Events<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("traceEvents: an array of events")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        let state = self.0;
        state.write(b"[\n")?;
        while let Some(raw) = seq.next_element::<Box<RawValue>>()? {
            state.budget.reset();
            let event: Peek<'_> = serde_json::from_str(raw.get()).map_err(|e| {
                S::Error::custom(format!(
                    "event {} of traceEvents is not an event object: {e}",
                    state.profiler_events
                ))
            })?;
            state.observe(&event);
            if state.profiler_events > 0 {
                state.write(b",\n")?;
            }
            state.write(raw.get().as_bytes())?;
            state.profiler_events += 1;
        }
        let (events, info) = clip(state).map_err(S::Error::custom)?;
        for e in &events {
            if state.profiler_events > 0 || state.added > 0 {
                state.write(b",\n")?;
            }
            let text = serde_json::to_string(e).map_err(S::Error::custom)?;
            state.write(text.as_bytes())?;
            state.added += 1;
        }
        state.info = Some(info);
        state.write(b"\n]")
    }
}

/// gpudiag's events over the time both traces cover, on the profiler's clock and pids.
fn clip(state: &MergeState<'_>) -> Result<(Vec<TraceEvent>, MergeInfo), String> {
    let Some((lo_us, hi_us)) = state.span_us else {
        return Err("the profiler trace has no timed events".into());
    };
    let base_ns: i128 = match state.base_time_ns {
        Some(b) => i128::from(b),
        None if lo_us >= EPOCH_US_FLOOR => 0,
        None => {
            return Err(
                "the profiler trace has no baseTimeNanoseconds and its timestamps are not \
                 epoch microseconds, so it cannot be put on the wall clock"
                    .into(),
            );
        }
    };
    let to_ns = |us: f64| base_ns + (us * 1000.0).round() as i128;
    let (prof_lo, prof_hi) = (to_ns(lo_us), to_ns(hi_us));

    let ours = state.ours;
    let origin_ns = i128::from(ours.other_data.start_ms.unwrap_or_default()) * 1_000_000;
    let abs_ns = |ts: u64| origin_ns + i128::from(ts) * 1000;
    let timed = ours.trace_events.iter().filter(|e| e.ph != Phase::Metadata);
    let rec_lo = timed.clone().map(|e| abs_ns(e.ts)).min();
    let rec_hi = timed
        .map(|e| abs_ns(e.ts.saturating_add(e.dur.unwrap_or(0))))
        .max();
    let (Some(rec_lo), Some(rec_hi)) = (rec_lo, rec_hi) else {
        return Err("the recording has no telemetry to add".into());
    };
    let lo = prof_lo.max(rec_lo);
    let hi = prof_hi.min(rec_hi);
    if lo >= hi {
        return Err(format!(
            "the profiler trace ({} to {}) and the recording ({} to {}) do not overlap in \
             time: was the recording made while the profiler ran, on this host?",
            utc(prof_lo),
            utc(prof_hi),
            utc(rec_lo),
            utc(rec_hi)
        ));
    }

    let pid_base = match state.max_pid {
        Some(m) if m >= u64::from(PID_BASE) => m.saturating_add(1),
        _ => u64::from(PID_BASE),
    };
    let highest = ours
        .trace_events
        .iter()
        .filter(|e| e.pid != HOST_PID)
        .map(|e| u64::from(e.pid))
        .max()
        .unwrap_or(0);
    let pid_base = u32::try_from(pid_base)
        .ok()
        .filter(|b| {
            b.checked_add(u32::try_from(highest).unwrap_or(u32::MAX))
                .is_some()
        })
        .ok_or_else(|| {
            format!(
                "the profiler trace uses pids up to {}, which leaves no room for gpudiag's",
                state.max_pid.unwrap_or_default()
            )
        })?;
    let pid = |p: u32| {
        if p == HOST_PID {
            pid_base
        } else {
            pid_base + p
        }
    };
    // Profiler µs, whole (gpudiag's times are whole milliseconds).
    let ts = |ns: i128| u64::try_from((ns - base_ns + 500).div_euclid(1000)).unwrap_or(0);

    let mut out = Vec::new();
    let mut used_pids = std::collections::BTreeSet::new();
    // The last value of each counter track before the window, by (pid, name).
    let mut before: BTreeMap<(u32, Cow<'static, str>), &TraceEvent> = BTreeMap::new();
    for e in ours.trace_events.iter().filter(|e| e.ph != Phase::Metadata) {
        let start = abs_ns(e.ts);
        let mut clipped = e.clone();
        clipped.pid = pid(e.pid);
        match e.ph {
            Phase::Counter => {
                let key = (e.pid, e.name.clone());
                if start < lo {
                    before.insert(key, e);
                    continue;
                }
                if start > hi {
                    continue;
                }
                if let Some(prev) = before.remove(&key).filter(|_| start > lo) {
                    let mut carried = prev.clone();
                    carried.pid = pid(prev.pid);
                    carried.ts = ts(lo);
                    out.push(carried);
                }
                clipped.ts = ts(start);
            }
            Phase::Complete => {
                let end = abs_ns(e.ts.saturating_add(e.dur.unwrap_or(0)));
                if end < lo || start > hi {
                    continue;
                }
                let (s, t) = (start.max(lo), end.min(hi));
                clipped.ts = ts(s);
                clipped.dur = Some(ts(t).saturating_sub(ts(s)));
            }
            Phase::Instant => {
                if start < lo || start > hi {
                    continue;
                }
                clipped.ts = ts(start);
            }
            Phase::Metadata => continue,
        }
        used_pids.insert(e.pid);
        out.push(clipped);
    }
    // Tracks that did not change inside the window hold their earlier value through it.
    for ((p, _), prev) in before {
        let mut carried = prev.clone();
        carried.pid = pid(p);
        carried.ts = ts(lo);
        used_pids.insert(p);
        out.push(carried);
    }
    out.sort_by_key(|e| e.ts);

    let mut meta: Vec<TraceEvent> = ours
        .trace_events
        .iter()
        .filter(|e| e.ph == Phase::Metadata && used_pids.contains(&e.pid))
        .map(|e| {
            let mut m = e.clone();
            m.pid = pid(e.pid);
            m.ts = ts(lo);
            match e.name.as_ref() {
                "process_name" => {
                    if let Some(serde_json::Value::String(name)) = m.args.get_mut("name") {
                        *name = format!("gpudiag: {name}");
                    }
                }
                "process_sort_index" => {
                    if let Some(v) = m.args.get_mut("sort_index") {
                        let i = v.as_i64().unwrap_or(0);
                        *v = serde_json::Value::from(SORT_BASE + i);
                    }
                }
                _ => {}
            }
            m
        })
        .collect();
    meta.extend(out);

    let info = MergeInfo {
        trace: ours.other_data.clone(),
        profiler_trace: state
            .path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        base_time_ns: state.base_time_ns,
        pid_base,
        window_start_ms: lo as f64 / 1e6,
        window_end_ms: hi as f64 / 1e6,
        skipped_events: state.skipped,
    };
    Ok((meta, info))
}

/// An epoch-nanosecond time as UTC text.
fn utc(ns: i128) -> String {
    let Ok(ns) = u64::try_from(ns) else {
        return format!("{ns} ns before the epoch");
    };
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    humantime::format_rfc3339_millis(t).to_string()
}

/// The profiler traces under `path` written at or after `since`: `path` itself when it is a
/// file, else the files in the directory named as `tensorboard_trace_handler` names them
/// (`<worker>.<time>.pt.trace.json`, optionally `.gz`), by name.
pub fn written_since(path: &Path, since: std::time::SystemTime) -> Result<Vec<PathBuf>, Error> {
    let fresh = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= since)
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
    };
    if !meta.is_dir() {
        return Ok(if fresh(path) {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        });
    }
    let entries = std::fs::read_dir(path)
        .map_err(|e| Error::io(format!("cannot list {}", path.display()), e))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".pt.trace.json") || n.ends_with(".pt.trace.json.gz"))
                && p.is_file()
                && fresh(p)
        })
        .collect();
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chrome_trace::{Args, Scope};

    fn event(name: &'static str, ph: Phase, ts: u64, pid: u32, tid: u32) -> TraceEvent {
        let mut args = Args::new();
        if ph == Phase::Counter {
            args.insert("gpu".into(), serde_json::Value::from(ts / 1000));
        }
        TraceEvent {
            name: name.into(),
            cat: None,
            ph,
            ts,
            dur: (ph == Phase::Complete).then_some(2_000_000),
            pid,
            tid,
            s: (ph == Phase::Instant).then_some(Scope::Thread),
            args,
        }
    }

    /// gpudiag's trace: counters every second for 10 s from epoch ms 1_000_000.
    fn ours() -> Trace {
        let mut events = vec![event("process_name", Phase::Metadata, 0, 1, 0)];
        events[0]
            .args
            .insert("name".into(), serde_json::Value::from("GPU 0"));
        for s in 0..10u64 {
            events.push(event("util", Phase::Counter, s * 1_000_000, 1, 1));
        }
        events.push(event("hw_slowdown", Phase::Complete, 1_000_000, 1, 103));
        events.push(event("finding", Phase::Instant, 9_500_000, 1, 2));
        Trace {
            trace_events: events,
            display_time_unit: "ms".into(),
            other_data: TraceInfo {
                format: "gpudiag-trace".into(),
                version: 1,
                tool_version: "0".into(),
                start_ms: Some(1_000_000),
                backend: "replay".into(),
                recording: None,
                host: None,
                driver_version: None,
                kernel_records: None,
            },
        }
    }

    fn merged(profiler: &str) -> Result<(serde_json::Value, MergeSummary), Error> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let input = dir.path().join("p.json");
        std::fs::write(&input, profiler).map_err(|e| Error::io("write", e))?;
        let mut out = Vec::new();
        let summary = merge_into(&input, &ours(), &mut out)?;
        let value = serde_json::from_slice(&out).map_err(|e| Error::Usage(e.to_string()))?;
        Ok((value, summary))
    }

    fn ours_in(v: &serde_json::Value, base: u64) -> Vec<serde_json::Value> {
        v["traceEvents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["pid"].as_u64().is_some_and(|p| p >= base))
            .cloned()
            .collect()
    }

    #[test]
    fn base_time_before_or_after_events_aligns_the_same() -> Result<(), Error> {
        // Profiler window: epoch ms 1_003_000 .. 1_006_000 (base 1_002_000 ms).
        let events = r#"[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1000000.5,"dur":3000000},
            {"ph":"M","name":"process_name","pid":0,"tid":0,"ts":0,"args":{"name":"GPU 0"}}]"#;
        let before = format!(
            r#"{{"schemaVersion":1,"baseTimeNanoseconds":1002000000000,"traceEvents":{events},"traceName":"t"}}"#
        );
        let after = format!(
            r#"{{"schemaVersion":1,"traceEvents":{events},"traceName":"t","baseTimeNanoseconds":1002000000000}}"#
        );
        let (a, sa) = merged(&before)?;
        let (b, sb) = merged(&after)?;
        assert_eq!(sa.profiler_events, 2);
        assert_eq!(sa.info.window_start_ms, 1_003_000.000_5);
        assert_eq!(sa.info.window_end_ms, 1_006_000.000_5);
        assert_eq!(sa.info, sb.info);
        assert_eq!(ours_in(&a, PID_BASE.into()), ours_in(&b, PID_BASE.into()));
        // The counter at 1_003_000 ms is in the window: profiler ts = (1_003_000 - 1_002_000) ms.
        let counters: Vec<u64> = ours_in(&a, PID_BASE.into())
            .iter()
            .filter(|e| e["ph"] == "C")
            .filter_map(|e| e["ts"].as_u64())
            .collect();
        assert_eq!(counters, vec![1_000_001, 2_000_000, 3_000_000, 4_000_000]);
        assert_eq!(a["traceName"], "t");
        assert_eq!(a[MERGE_KEY]["pid_base"], PID_BASE);
        Ok(())
    }

    #[test]
    fn epoch_timestamps_without_base_are_wall_clock() -> Result<(), Error> {
        let p = r#"{"traceEvents":[{"ph":"X","name":"k","pid":1,"tid":1,"ts":1002000000,"dur":3000000}]}"#;
        // 1_002_000_000 µs is not an epoch time after 2001: refused.
        let e = merged(p).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("wall clock"), "{e}");
        // Scaled into the 2000s it is read as epoch µs; the window then misses the recording.
        let p = r#"{"traceEvents":[{"ph":"X","name":"k","pid":1,"tid":1,"ts":1700000000000000,"dur":3}]}"#;
        let e = merged(p).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("do not overlap"), "{e}");
        Ok(())
    }

    #[test]
    fn counters_before_the_window_carry_into_it_and_intervals_are_clipped() -> Result<(), Error> {
        // Window 1_002_500 .. 1_004_000 ms.
        let p = r#"{"baseTimeNanoseconds":1000000000000,"traceEvents":[{"ph":"X","name":"k","pid":3,"tid":1,"ts":2500000,"dur":1500000}]}"#;
        let (v, _) = merged(p)?;
        let added = ours_in(&v, PID_BASE.into());
        let c: Vec<(u64, u64)> = added
            .iter()
            .filter(|e| e["ph"] == "C")
            .filter_map(|e| Some((e["ts"].as_u64()?, e["args"]["gpu"].as_u64()?)))
            .collect();
        assert_eq!(
            c,
            vec![(2_500_000, 2000), (3_000_000, 3000), (4_000_000, 4000)]
        );
        let x: Vec<(u64, u64)> = added
            .iter()
            .filter(|e| e["ph"] == "X")
            .filter_map(|e| Some((e["ts"].as_u64()?, e["dur"].as_u64()?)))
            .collect();
        assert_eq!(x, vec![(2_500_000, 500_000)]);
        assert!(added.iter().all(|e| e["ph"] != "i"), "finding outside");
        let name = added
            .iter()
            .find(|e| e["name"] == "process_name")
            .and_then(|e| e["args"]["name"].as_str());
        assert_eq!(name, Some("gpudiag: GPU 0"));
        assert!(added.iter().all(|e| e["pid"] == PID_BASE + 1));
        Ok(())
    }

    #[test]
    fn pids_start_past_the_profilers_largest() -> Result<(), Error> {
        let p = format!(
            r#"{{"baseTimeNanoseconds":1000000000000,"traceEvents":[{{"ph":"X","name":"k","pid":{},"tid":1,"ts":2500000,"dur":1500000}},{{"ph":"i","s":"g","name":"w","pid":"","tid":"","ts":1}}]}}"#,
            PID_BASE + 5
        );
        let (v, s) = merged(&p)?;
        assert_eq!(s.info.pid_base, PID_BASE + 6);
        assert!(!ours_in(&v, u64::from(PID_BASE) + 7).is_empty());
        Ok(())
    }

    #[test]
    fn bad_input_is_a_usage_error_that_says_why() {
        let cases = [
            ("", "ends early"),
            ("not json", "not a JSON"),
            ("[1,2]", "traceEvents"),
            (r#"{"traceEvents":[{"ph":"X"#, "ends early"),
            (r#"{"displayTimeUnit":"ms"}"#, "no traceEvents"),
            (r#"{"traceEvents":[1]}"#, "event 0"),
            (
                r#"{"baseTimeNanoseconds":1000000000000,"traceEvents":[{"ph":"X","ts":2500000,"dur":9,"pid":1}],"traceEvents":[]}"#,
                "twice",
            ),
            (r#"{"traceEvents":[]}"#, "no timed events"),
            (
                r#"{"baseTimeNanoseconds":-5,"traceEvents":[]}"#,
                "whole number",
            ),
            (
                r#"{"traceEvents":[],"baseTimeNanoseconds":"x"}"#,
                "whole number",
            ),
            (r#"{"gpudiag":{},"traceEvents":[]}"#, "already"),
            (
                r#"{"baseTimeNanoseconds":1000000000000,"traceEvents":[{"ph":"X","ts":2500000,"dur":9,"pid":1}]} trailing"#,
                "not a JSON",
            ),
        ];
        for (input, needle) in cases {
            match merged(input) {
                Ok(_) => panic!("{input:?} merged"),
                Err(e) => {
                    assert_eq!(e.exit_code(), 2, "{input:?}: {e}");
                    assert!(e.to_string().contains(needle), "{input:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn an_endless_string_stops_at_the_budget() {
        let mut p = String::from(r#"{"traceEvents":[{"name":""#);
        p.push_str(&"x".repeat((MAX_VALUE_BYTES + (1 << 20)) as usize));
        p.push_str(r#""}]}"#);
        let e = merged(&p).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("larger than 16 MiB"), "{e}");
    }
}
