//! Bounded time series per (device, metric), with the window statistics rules and views share.
//!
//! Memory must stay flat for hours of 8 GPUs × all metrics at 10 Hz, so each series has two tiers:
//! raw points for the recent past (`fine_retention`, default 10 min) and fixed-width buckets
//! (default 10 s) for older data up to `retention` (default 6 h), after which data is dropped. A
//! point lives in exactly one tier; it moves to the coarse tier when it ages out, so a push costs
//! amortised O(1) and never rescans the series. Ring capacity grows by a quarter at a time and
//! stops at the size the configuration implies, because doubling would waste up to half of it.
//!
//! Buckets keep count, sum, min, max, last and the centred second moments of (time, value), so
//! count, mean, min, max, slope and r² over a window that reaches into the coarse tier equal, to
//! rounding, those of the raw points the buckets absorbed. Two things are approximate there and only there: the
//! window edge is resolved per bucket (a bucket belongs to a window when its time centroid does),
//! and p95 treats a bucket as `count` copies of its mean. `WindowStats::coarse` says when either
//! applies.
//!
//! Conventions: p95 is nearest-rank (the smallest value with at least 95% of the samples at or
//! below it; always an observed value for raw data). `mean` weights samples equally, which equals
//! the time average for a regularly sampled series. `slope_per_s` and `r2` come from ordinary
//! least squares of value against time in seconds. `fraction_where` weights each raw point by the
//! time until the next one, capped at `GAP_FACTOR` median steps so an outage does not count as
//! time the condition held, the last point by the median step, and a bucket by `count` median
//! steps.
//!
//! Values that are absent, NaN or infinite are never stored, and a point older than the newest
//! one of its series is refused (counted in `rejected_points`): windows are found by binary search
//! over time-sorted tiers, and inserting in the middle would cost O(n). Timestamps are wall-clock,
//! so a caller whose clock may step back should keep them monotonic or `clear` on a large step.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use gpudiag_model::sample::{Metric, Sample, TimeMs};

/// A gap longer than this many median steps counts only as this many in `fraction_where`: what
/// the GPU did while nobody was sampling it is unknown.
pub const GAP_FACTOR: u64 = 10;

const METRIC_COUNT: usize = Metric::ALL.len();

/// Retention of each tier and resolution of the coarse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Raw points are kept this long, measured back from the newest point of their series.
    pub fine_retention: Duration,
    /// Data older than this is dropped; it is raised to `fine_retention` if set below it.
    pub retention: Duration,
    /// Width of a coarse bucket, clamped to 1 ms ..= 49 days.
    pub bucket_width: Duration,
    /// Cap on raw points per series, so an unexpectedly fast sampler cannot grow memory: past it
    /// the oldest raw points move to the coarse tier early.
    pub max_fine_points: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            fine_retention: Duration::from_secs(10 * 60),
            retention: Duration::from_secs(6 * 3600),
            bucket_width: Duration::from_secs(10),
            max_fine_points: 16_384,
        }
    }
}

/// Which part of a series a statistic covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// `(latest − d, latest]`, where `latest` is the newest point of that series, so a quiet
    /// series is judged on its own last data; a zero duration still covers the newest instant.
    Last(Duration),
    /// `[start_ms, end_ms]`, both inclusive; empty when `start_ms > end_ms`.
    Range { start_ms: TimeMs, end_ms: TimeMs },
    /// Everything retained.
    All,
}

impl From<Duration> for Window {
    fn from(d: Duration) -> Self {
        Window::Last(d)
    }
}

/// Statistics of one series over one window. Everything but `count` is `None` for an empty window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct WindowStats {
    /// Time of the oldest data in the window (a bucket's first point when it is coarse).
    pub first_ms: Option<TimeMs>,
    /// Time of the newest data in the window.
    pub last_ms: Option<TimeMs>,
    /// Raw samples covered, including those folded into buckets.
    pub count: u64,
    pub mean: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub last: Option<f64>,
    /// Nearest-rank 95th percentile.
    pub p95: Option<f64>,
    /// Least-squares slope in value units per second; `None` below 3 samples or when all samples
    /// share one timestamp.
    pub slope_per_s: Option<f64>,
    /// Coefficient of determination of that fit, in [0, 1]; 1 for a constant series (a flat
    /// line fits it exactly, as scikit-learn also reports).
    #[schemars(range(min = 0, max = 1))]
    pub r2: Option<f64>,
    /// Part of the window came from coarse buckets, so its edge and p95 are approximate.
    pub coarse: bool,
}

impl WindowStats {
    /// Milliseconds between the first and the last data in the window.
    pub fn span_ms(&self) -> Option<u64> {
        Some(self.last_ms?.saturating_sub(self.first_ms?))
    }
}

/// One coarse bucket, for charts that want a min/max envelope of old data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CoarseBucket {
    pub first_ms: TimeMs,
    pub last_ms: TimeMs,
    /// Mean time of the bucket's samples: where a chart should plot `mean`.
    pub time_ms: TimeMs,
    pub count: u64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
}

/// Time series of every device and metric seen, bounded by `HistoryConfig`.
#[derive(Debug, Clone)]
pub struct History {
    config: HistoryConfig,
    limits: Limits,
    /// One slot per `Metric`, indexed by its position in `Metric::ALL`, so `push_sample` does a
    /// single map lookup per device rather than one per metric.
    devices: BTreeMap<u32, Vec<Option<Series>>>,
    rejected: u64,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// A history with the default retention (10 min raw, 6 h in 10 s buckets).
    pub fn new() -> Self {
        History::with_config(HistoryConfig::default())
    }

    pub fn with_config(config: HistoryConfig) -> Self {
        History {
            config,
            limits: Limits::new(&config),
            devices: BTreeMap::new(),
            rejected: 0,
        }
    }

    pub fn config(&self) -> &HistoryConfig {
        &self.config
    }

    /// Stores every metric the sample carries; absent ones are skipped, not stored as 0.
    pub fn push_sample(&mut self, s: &Sample) {
        for metric in Metric::ALL {
            if let Some(v) = s.value(metric) {
                self.push(s.device, metric, s.time_ms, v);
            }
        }
    }

    /// Stores one point; returns false when it was refused (NaN, infinite, or older than the
    /// newest point of its series).
    pub fn push(&mut self, device: u32, metric: Metric, time_ms: TimeMs, value: f64) -> bool {
        if !value.is_finite() {
            self.rejected += 1;
            return false;
        }
        let limits = self.limits;
        let slots = self.devices.entry(device).or_insert_with(empty_slots);
        let stored = slots
            .get_mut(metric_index(metric))
            .map(|slot| {
                slot.get_or_insert_with(Series::default)
                    .push(time_ms, value, &limits)
            })
            .unwrap_or(false);
        if !stored {
            self.rejected += 1;
        }
        stored
    }

    /// Points refused so far (non-finite or out of order).
    pub fn rejected_points(&self) -> u64 {
        self.rejected
    }

    /// Statistics over `window`, which may be a `Duration` (the last stretch of this series).
    pub fn stats(&self, device: u32, metric: Metric, window: impl Into<Window>) -> WindowStats {
        self.get(device, metric)
            .map(|s| s.stats(window.into()))
            .unwrap_or_default()
    }

    /// The mean alone, for rules that need nothing else: no percentile sort, no fit, so it
    /// costs one pass over the window. Same value as `stats(..).mean`.
    pub fn mean(&self, device: u32, metric: Metric, window: impl Into<Window>) -> Option<f64> {
        let s = self.get(device, metric)?;
        let (cr, fr) = s.select(window.into());
        let (mut sum, mut n) = (0.0, 0u64);
        for b in s.coarse.range(cr) {
            sum += b.sum_y;
            n += u64::from(b.count);
        }
        for &(_, v) in s.fine.range(fr) {
            sum += v;
            n += 1;
        }
        (n > 0).then(|| sum / n as f64)
    }

    /// Fraction of the window's time, in [0, 1], during which `pred` held; `None` when the window
    /// is empty. A bucket counts as holding when `pred` agrees on its min and max (exact for a
    /// threshold), otherwise as `pred` of its mean.
    pub fn fraction_where(
        &self,
        device: u32,
        metric: Metric,
        window: impl Into<Window>,
        pred: impl Fn(f64) -> bool,
    ) -> Option<f64> {
        self.get(device, metric)?
            .fraction_where(window.into(), &pred)
    }

    /// The whole retained series, oldest first; coarse buckets appear as (time centroid, mean).
    pub fn series(&self, device: u32, metric: Metric) -> impl Iterator<Item = (TimeMs, f64)> + '_ {
        self.series_in(device, metric, Window::All)
    }

    /// The part of the series inside `window`, oldest first, as `series` represents it.
    pub fn series_in(
        &self,
        device: u32,
        metric: Metric,
        window: impl Into<Window>,
    ) -> impl Iterator<Item = (TimeMs, f64)> + '_ {
        let window = window.into();
        self.get(device, metric).into_iter().flat_map(move |s| {
            let (coarse, fine) = s.select(window);
            s.coarse
                .range(coarse)
                .map(|b| (b.centroid_ms(), b.mean()))
                .chain(s.fine.range(fine).copied())
        })
    }

    /// The coarse tier of a series, oldest first.
    pub fn buckets(&self, device: u32, metric: Metric) -> impl Iterator<Item = CoarseBucket> + '_ {
        self.get(device, metric)
            .into_iter()
            .flat_map(|s| s.coarse.iter().map(Bucket::public))
    }

    /// The newest point of a series.
    pub fn latest(&self, device: u32, metric: Metric) -> Option<(TimeMs, f64)> {
        self.get(device, metric)?.fine.back().copied()
    }

    /// Devices with at least one stored point, in ascending order.
    pub fn devices(&self) -> impl Iterator<Item = u32> + '_ {
        self.devices.keys().copied()
    }

    /// Metrics of `device` with at least one stored point, in `Metric::ALL` order.
    pub fn metrics(&self, device: u32) -> impl Iterator<Item = Metric> + '_ {
        Metric::ALL
            .into_iter()
            .filter(move |&m| self.get(device, m).is_some())
    }

    /// Time of the newest point of any metric of `device`.
    pub fn latest_ms(&self, device: u32) -> Option<TimeMs> {
        self.device_series(device)
            .filter_map(|s| s.fine.back().map(|p| p.0))
            .max()
    }

    /// Milliseconds from the oldest to the newest retained point of any metric of `device`.
    pub fn span_ms(&self, device: u32) -> Option<u64> {
        let first = self
            .device_series(device)
            .filter_map(Series::first_ms)
            .min()?;
        Some(self.latest_ms(device)?.saturating_sub(first))
    }

    /// Forgets everything, e.g. when a replay jumps back in time.
    pub fn clear(&mut self) {
        self.devices.clear();
    }

    /// Heap and inline bytes held, counting allocated capacity rather than length.
    pub fn approx_memory_bytes(&self) -> usize {
        // B-tree nodes hold up to 11 entries in about 300 bytes; the rings dwarf that, so a
        // generous per-entry estimate is enough.
        const MAP_ENTRY_OVERHEAD: usize = 64;
        let per_device = |slots: &Vec<Option<Series>>| {
            std::mem::size_of::<u32>()
                + std::mem::size_of::<Vec<Option<Series>>>()
                + MAP_ENTRY_OVERHEAD
                + slots.capacity() * std::mem::size_of::<Option<Series>>()
                + slots
                    .iter()
                    .flatten()
                    .map(Series::heap_bytes)
                    .sum::<usize>()
        };
        std::mem::size_of::<Self>() + self.devices.values().map(per_device).sum::<usize>()
    }

    fn get(&self, device: u32, metric: Metric) -> Option<&Series> {
        self.devices
            .get(&device)?
            .get(metric_index(metric))?
            .as_ref()
    }

    fn device_series(&self, device: u32) -> impl Iterator<Item = &Series> + '_ {
        self.devices
            .get(&device)
            .into_iter()
            .flat_map(|slots| slots.iter().flatten())
    }
}

fn empty_slots() -> Vec<Option<Series>> {
    (0..METRIC_COUNT).map(|_| None).collect()
}

/// `Metric` has no explicit discriminants, so its discriminant is its position in `Metric::ALL`
/// (a test checks this stays true).
fn metric_index(metric: Metric) -> usize {
    metric as usize
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Seconds from `origin` to `t`, signed, as regression abscissae: small numbers near the window
/// keep the f64 moments precise, where epoch milliseconds would not.
fn secs_since(origin: TimeMs, t: TimeMs) -> f64 {
    if t >= origin {
        (t - origin) as f64 / 1000.0
    } else {
        -((origin - t) as f64 / 1000.0)
    }
}

/// The configuration in the units the hot path uses.
#[derive(Debug, Clone, Copy)]
struct Limits {
    fine_ms: u64,
    retention_ms: u64,
    bucket_ms: u64,
    max_fine: usize,
    /// How many buckets the coarse tier holds at steady state, where its capacity stops growing.
    steady_buckets: usize,
}

impl Limits {
    fn new(c: &HistoryConfig) -> Self {
        let fine_ms = duration_ms(c.fine_retention);
        let retention_ms = duration_ms(c.retention).max(fine_ms);
        let bucket_ms = duration_ms(c.bucket_width).clamp(1, u64::from(u32::MAX));
        // Ages in (fine, retention] span this many bucket widths, plus a partial one at each end.
        let steady = (retention_ms - fine_ms) / bucket_ms + 2;
        Limits {
            fine_ms,
            retention_ms,
            bucket_ms,
            max_fine: c.max_fine_points.max(1),
            steady_buckets: usize::try_from(steady).unwrap_or(usize::MAX),
        }
    }
}

/// Pushes with growth by a quarter, never past `steady` while below it, so a ring that reaches
/// its steady length carries little slack; past `steady` it still grows geometrically, which
/// keeps pushes amortised O(1).
fn push_growing<T>(dq: &mut VecDeque<T>, item: T, steady: usize) {
    let len = dq.len();
    if len == dq.capacity() {
        let step = (len / 4).max(16);
        let additional = if len < steady {
            step.min(steady - len)
        } else {
            step
        };
        dq.reserve_exact(additional);
    }
    dq.push_back(item);
}

/// Running count, means and centred second moments of (x = seconds, y = value). Centring (Welford
/// updates in buckets, two passes over raw points, Chan's merge between them) keeps them precise
/// for large values such as memory in bytes, where raw sums of squares would cancel.
#[derive(Debug, Clone, Copy, Default)]
struct Moments {
    n: u64,
    /// Kept beside `mean_y` because a plain sum gives the familiar exact mean of small integers.
    sum_y: f64,
    mean_x: f64,
    mean_y: f64,
    m2x: f64,
    m2y: f64,
    cxy: f64,
}

impl Moments {
    fn push(&mut self, x: f64, y: f64) {
        self.n += 1;
        self.sum_y += y;
        let n = self.n as f64;
        let dx = x - self.mean_x;
        let dy = y - self.mean_y;
        self.mean_x += dx / n;
        self.mean_y += dy / n;
        self.m2x += dx * (x - self.mean_x);
        self.m2y += dy * (y - self.mean_y);
        self.cxy += dx * (y - self.mean_y);
    }

    /// Two passes (means, then centred sums) instead of Welford: as accurate, and without a
    /// division per point, which matters when the TUI asks for 10-minute windows every tick.
    fn of_points<'a>(
        points: impl Iterator<Item = &'a (TimeMs, f64)> + Clone,
        origin: TimeMs,
    ) -> Self {
        let x = |t: TimeMs| secs_since(origin, t);
        let (mut n, mut sum_x, mut sum_y) = (0u64, 0.0, 0.0);
        for &(t, v) in points.clone() {
            n += 1;
            sum_x += x(t);
            sum_y += v;
        }
        if n == 0 {
            return Moments::default();
        }
        let (mean_x, mean_y) = (sum_x / n as f64, sum_y / n as f64);
        let (mut m2x, mut m2y, mut cxy) = (0.0, 0.0, 0.0);
        for &(t, v) in points {
            let (dx, dy) = (x(t) - mean_x, v - mean_y);
            m2x += dx * dx;
            m2y += dy * dy;
            cxy += dx * dy;
        }
        Moments {
            n,
            sum_y,
            mean_x,
            mean_y,
            m2x,
            m2y,
            cxy,
        }
    }

    fn merge(&mut self, o: &Moments) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.n as f64, o.n as f64);
        let n = na + nb;
        let dx = o.mean_x - self.mean_x;
        let dy = o.mean_y - self.mean_y;
        let f = na * nb / n;
        self.mean_x += dx * nb / n;
        self.mean_y += dy * nb / n;
        self.m2x += o.m2x + dx * dx * f;
        self.m2y += o.m2y + dy * dy * f;
        self.cxy += o.cxy + dx * dy * f;
        self.n += o.n;
        self.sum_y += o.sum_y;
    }

    fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum_y / self.n as f64)
    }

    fn fits(&self) -> bool {
        self.n >= 3 && self.m2x > 0.0
    }

    fn slope(&self) -> Option<f64> {
        self.fits().then(|| self.cxy / self.m2x)
    }

    fn r2(&self) -> Option<f64> {
        if !self.fits() {
            return None;
        }
        if self.m2y <= 0.0 {
            return Some(1.0);
        }
        Some((self.cxy * self.cxy / (self.m2x * self.m2y)).clamp(0.0, 1.0))
    }
}

/// Raw points that aged out of the fine tier, folded together. Moments use x in seconds since
/// `first_ms`; kept to 80 bytes because the coarse tier dominates memory.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    first_ms: TimeMs,
    last_off_ms: u32,
    count: u32,
    mean_x: f64,
    sum_y: f64,
    m2x: f64,
    m2y: f64,
    cxy: f64,
    min: f64,
    max: f64,
    last: f64,
}

impl Bucket {
    fn new(t: TimeMs, v: f64) -> Self {
        Bucket {
            first_ms: t,
            last_off_ms: 0,
            count: 1,
            mean_x: 0.0,
            sum_y: v,
            m2x: 0.0,
            m2y: 0.0,
            cxy: 0.0,
            min: v,
            max: v,
            last: v,
        }
    }

    fn add(&mut self, t: TimeMs, v: f64) {
        let off = t.saturating_sub(self.first_ms);
        let mut m = self.moments(0.0);
        m.push(off as f64 / 1000.0, v);
        self.count = u32::try_from(m.n).unwrap_or(u32::MAX);
        self.mean_x = m.mean_x;
        self.sum_y = m.sum_y;
        self.m2x = m.m2x;
        self.m2y = m.m2y;
        self.cxy = m.cxy;
        self.last_off_ms = u32::try_from(off).unwrap_or(u32::MAX);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.last = v;
    }

    /// The moments with x shifted by `shift_s`, to merge into a window's frame.
    fn moments(&self, shift_s: f64) -> Moments {
        Moments {
            n: u64::from(self.count),
            sum_y: self.sum_y,
            mean_x: self.mean_x + shift_s,
            mean_y: self.mean(),
            m2x: self.m2x,
            m2y: self.m2y,
            cxy: self.cxy,
        }
    }

    fn mean(&self) -> f64 {
        // `count` is at least 1 from construction.
        self.sum_y / f64::from(self.count.max(1))
    }

    fn last_ms(&self) -> TimeMs {
        self.first_ms.saturating_add(u64::from(self.last_off_ms))
    }

    fn centroid_ms(&self) -> TimeMs {
        // `mean_x` lies within [0, last_off] seconds; the float-to-int cast saturates.
        self.first_ms
            .saturating_add((self.mean_x * 1000.0).round() as u64)
    }

    /// A threshold predicate is monotone, so agreement at min and max means every sample agreed.
    fn holds(&self, pred: &dyn Fn(f64) -> bool) -> bool {
        let at_min = pred(self.min);
        if at_min == pred(self.max) {
            at_min
        } else {
            pred(self.mean())
        }
    }

    fn public(&self) -> CoarseBucket {
        CoarseBucket {
            first_ms: self.first_ms,
            last_ms: self.last_ms(),
            time_ms: self.centroid_ms(),
            count: u64::from(self.count),
            mean: self.mean(),
            min: self.min,
            max: self.max,
            last: self.last,
        }
    }
}

/// One metric of one device. Both tiers are sorted by time and the fine tier is never empty.
#[derive(Debug, Clone, Default)]
struct Series {
    fine: VecDeque<(TimeMs, f64)>,
    coarse: VecDeque<Bucket>,
}

impl Series {
    fn push(&mut self, t: TimeMs, v: f64, lim: &Limits) -> bool {
        if self.fine.back().is_some_and(|&(last, _)| t < last) {
            return false;
        }
        let fine_from = t.saturating_sub(lim.fine_ms);
        while let Some(&(ft, fv)) = self.fine.front() {
            if ft >= fine_from && self.fine.len() < lim.max_fine {
                break;
            }
            self.fine.pop_front();
            self.fold(ft, fv, lim);
        }
        push_growing(&mut self.fine, (t, v), lim.max_fine);
        let keep_from = t.saturating_sub(lim.retention_ms);
        while self.coarse.front().is_some_and(|b| b.last_ms() < keep_from) {
            self.coarse.pop_front();
        }
        true
    }

    fn fold(&mut self, t: TimeMs, v: f64, lim: &Limits) {
        match self.coarse.back_mut() {
            Some(b) if b.first_ms / lim.bucket_ms == t / lim.bucket_ms => b.add(t, v),
            _ => push_growing(&mut self.coarse, Bucket::new(t, v), lim.steady_buckets),
        }
    }

    fn first_ms(&self) -> Option<TimeMs> {
        self.coarse
            .front()
            .map(|b| b.first_ms)
            .or_else(|| self.fine.front().map(|p| p.0))
    }

    fn heap_bytes(&self) -> usize {
        self.fine.capacity() * std::mem::size_of::<(TimeMs, f64)>()
            + self.coarse.capacity() * std::mem::size_of::<Bucket>()
    }

    /// Inclusive time bounds of `window` on this series.
    fn bounds(&self, window: Window) -> Option<(TimeMs, TimeMs)> {
        let latest = self.fine.back()?.0;
        match window {
            Window::Last(d) => {
                let back = duration_ms(d).saturating_sub(1);
                Some((latest.saturating_sub(back), latest))
            }
            Window::Range { start_ms, end_ms } => {
                (start_ms <= end_ms).then_some((start_ms, end_ms))
            }
            Window::All => Some((0, TimeMs::MAX)),
        }
    }

    /// Index ranges of the coarse and fine tiers inside `window`.
    fn select(&self, window: Window) -> (Range<usize>, Range<usize>) {
        let Some((lo, hi)) = self.bounds(window) else {
            return (0..0, 0..0);
        };
        let ca = self.coarse.partition_point(|b| b.centroid_ms() < lo);
        let cb = self.coarse.partition_point(|b| b.centroid_ms() <= hi);
        let fa = self.fine.partition_point(|p| p.0 < lo);
        let fb = self.fine.partition_point(|p| p.0 <= hi);
        (ca..cb.max(ca), fa..fb.max(fa))
    }

    fn stats(&self, window: Window) -> WindowStats {
        let (cr, fr) = self.select(window);
        let buckets = self.coarse.range(cr.clone());
        let points = self.fine.range(fr);
        let first_ms = buckets
            .clone()
            .next()
            .map(|b| b.first_ms)
            .or_else(|| points.clone().next().map(|p| p.0));
        let Some(origin) = first_ms else {
            return WindowStats::default();
        };

        let mut m = Moments::default();
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for b in buckets.clone() {
            m.merge(&b.moments(secs_since(origin, b.first_ms)));
            min = min.min(b.min);
            max = max.max(b.max);
        }
        let raw = Moments::of_points(points.clone(), origin);
        m.merge(&raw);
        for &(_, v) in points.clone() {
            min = min.min(v);
            max = max.max(v);
        }
        let (last_ms, last) = match points.clone().next_back() {
            Some(&(t, v)) => (Some(t), Some(v)),
            None => match buckets.clone().next_back() {
                Some(b) => (Some(b.last_ms()), Some(b.last)),
                None => (None, None),
            },
        };
        WindowStats {
            first_ms,
            last_ms,
            count: m.n,
            mean: m.mean(),
            min: Some(min),
            max: Some(max),
            last,
            p95: nearest_rank(95, m.n, buckets, points),
            slope_per_s: m.slope(),
            r2: m.r2(),
            coarse: !cr.is_empty(),
        }
    }

    fn fraction_where(&self, window: Window, pred: &dyn Fn(f64) -> bool) -> Option<f64> {
        let (cr, fr) = self.select(window);
        if cr.is_empty() && fr.is_empty() {
            return None;
        }
        let buckets = self.coarse.range(cr);
        let points = self.fine.range(fr);
        // The window's own cadence, or the series' when the window holds fewer than two raw points.
        let step = lower_median(steps(points.clone()))
            .or_else(|| lower_median(steps(self.fine.iter())))
            .filter(|&s| s > 0);

        let (mut held, mut total) = (0.0, 0.0);
        let mut add = |weight: f64, holds: bool| {
            total += weight;
            if holds {
                held += weight;
            }
        };
        match step {
            Some(step) => {
                let cap = step.saturating_mul(GAP_FACTOR);
                for b in buckets {
                    add(f64::from(b.count) * step as f64, b.holds(pred));
                }
                let mut it = points.peekable();
                while let Some(&(t, v)) = it.next() {
                    let dt = it
                        .peek()
                        .map_or(step, |next| next.0.saturating_sub(t).min(cap));
                    add(dt as f64, pred(v));
                }
            }
            // No usable cadence (one point, or duplicated timestamps): count samples instead.
            None => {
                for b in buckets {
                    add(f64::from(b.count), b.holds(pred));
                }
                for &(_, v) in points {
                    add(1.0, pred(v));
                }
            }
        }
        (total > 0.0).then(|| held / total)
    }
}

fn steps<'a>(points: impl Iterator<Item = &'a (TimeMs, f64)> + Clone) -> Vec<u64> {
    points
        .clone()
        .zip(points.skip(1))
        .map(|(a, b)| b.0.saturating_sub(a.0))
        .collect()
}

fn lower_median(mut v: Vec<u64>) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mid = (v.len() - 1) / 2;
    let (_, m, _) = v.select_nth_unstable(mid);
    Some(*m)
}

/// Stored values are finite, so `partial_cmp` is total on them and is cheaper than `total_cmp`.
fn cmp_finite(a: &f64, b: &f64) -> std::cmp::Ordering {
    a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal)
}

/// Nearest-rank percentile over `n` samples: raw points weigh 1, a bucket `count` copies of its
/// mean. Raw-only windows use selection (O(n)) since the TUI asks every tick.
fn nearest_rank<'a>(
    pct: u64,
    n: u64,
    buckets: impl Iterator<Item = &'a Bucket>,
    points: impl Iterator<Item = &'a (TimeMs, f64)>,
) -> Option<f64> {
    if n == 0 {
        return None;
    }
    let rank = pct.saturating_mul(n).div_ceil(100).clamp(1, n);
    let mut weighted: Vec<(f64, u64)> = buckets.map(|b| (b.mean(), u64::from(b.count))).collect();
    if weighted.is_empty() {
        let mut values: Vec<f64> = points.map(|p| p.1).collect();
        let idx = usize::try_from(rank - 1).ok()?;
        if idx >= values.len() {
            return None;
        }
        let (_, v, _) = values.select_nth_unstable_by(idx, cmp_finite);
        return Some(*v);
    }
    weighted.extend(points.map(|p| (p.1, 1)));
    weighted.sort_unstable_by(|a, b| cmp_finite(&a.0, &b.0));
    let mut seen = 0u64;
    for &(v, w) in &weighted {
        seen += w;
        if seen >= rank {
            return Some(v);
        }
    }
    weighted.last().map(|p| p.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: u32 = 0;
    const M: Metric = Metric::PowerW;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    /// Deterministic uniform noise in [-1, 1) (xorshift), so tests need no RNG crate.
    struct Noise(u64);
    impl Noise {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    fn tiered(fine_s: u64, retention_s: u64, bucket_s: u64) -> History {
        History::with_config(HistoryConfig {
            fine_retention: secs(fine_s),
            retention: secs(retention_s),
            bucket_width: secs(bucket_s),
            ..HistoryConfig::default()
        })
    }

    #[test]
    fn metric_index_matches_all() {
        for (i, m) in Metric::ALL.into_iter().enumerate() {
            assert_eq!(metric_index(m), i, "{m:?}");
        }
    }

    #[test]
    fn mean_min_max_p95_on_known_data() {
        let mut h = History::new();
        // 1..=100 in shuffled order of value, increasing time.
        for i in 0..100u64 {
            let v = ((i * 37) % 100 + 1) as f64;
            assert!(h.push(D, M, 1000 * i, v));
        }
        let s = h.stats(D, M, Window::All);
        assert_eq!(s.count, 100);
        assert_eq!(s.mean, Some(50.5));
        assert_eq!(s.min, Some(1.0));
        assert_eq!(s.max, Some(100.0));
        assert_eq!(s.p95, Some(95.0));
        assert_eq!(s.last, Some(((99 * 37) % 100 + 1) as f64));
        assert_eq!(s.first_ms, Some(0));
        assert_eq!(s.last_ms, Some(99_000));
        assert_eq!(s.span_ms(), Some(99_000));
        assert!(!s.coarse);

        // Nearest rank on 20 values: ceil(0.95 × 20) = 19th smallest.
        let mut h = History::new();
        for i in 0..20u64 {
            h.push(D, M, i, (20 - i) as f64 * 10.0);
        }
        assert_eq!(h.stats(D, M, Window::All).p95, Some(190.0));
        // And on 3 values: ceil(2.85) = 3rd.
        let mut h = History::new();
        for (i, v) in [7.0, 3.0, 5.0].into_iter().enumerate() {
            h.push(D, M, i as u64, v);
        }
        let s = h.stats(D, M, Window::All);
        assert_eq!(s.p95, Some(7.0));
        assert_eq!(s.mean, Some(5.0));
    }

    #[test]
    fn empty_and_missing_series() {
        let h = History::new();
        let s = h.stats(3, Metric::FanPct, secs(60));
        assert_eq!(s, WindowStats::default());
        assert_eq!(s.count, 0);
        assert_eq!(s.mean, None);
        assert_eq!(
            h.fraction_where(3, Metric::FanPct, Window::All, |_| true),
            None
        );
        assert_eq!(h.latest(3, Metric::FanPct), None);
        assert_eq!(h.span_ms(3), None);
        assert_eq!(h.series(3, Metric::FanPct).count(), 0);
    }

    #[test]
    fn slope_and_r2_on_a_perfect_line() {
        let mut h = History::new();
        // Epoch-sized timestamps: 5 W per second upwards from 100 W, every 100 ms.
        let t0 = 1_760_000_000_000u64;
        for i in 0..600u64 {
            h.push(D, M, t0 + 100 * i, 100.0 + 0.5 * i as f64);
        }
        let s = h.stats(D, M, Window::All);
        assert!(
            close(s.slope_per_s.unwrap_or(f64::NAN), 5.0, 1e-12),
            "{s:?}"
        );
        assert!(close(s.r2.unwrap_or(f64::NAN), 1.0, 1e-12), "{s:?}");

        // A falling line of memory in bytes: large values must not lose precision.
        let mut h = History::new();
        for i in 0..100u64 {
            h.push(
                D,
                Metric::MemUsedBytes,
                t0 + 1000 * i,
                8e10 - 1e6 * i as f64,
            );
        }
        let s = h.stats(D, Metric::MemUsedBytes, Window::All);
        assert!(
            close(s.slope_per_s.unwrap_or(f64::NAN), -1e6, 1e-9),
            "{s:?}"
        );
        assert!(close(s.r2.unwrap_or(f64::NAN), 1.0, 1e-9), "{s:?}");
    }

    #[test]
    fn slope_and_r2_on_noise() {
        let mut noise = Noise(0x9E37_79B9_7F4A_7C15);
        let mut flat = History::new();
        let mut trend = History::new();
        for i in 0..2000u64 {
            let t = 500 * i;
            flat.push(D, M, t, 50.0 + 10.0 * noise.next());
            // 0.1 per second over 1000 s is a rise of 100 against noise of ±10.
            trend.push(
                D,
                M,
                t,
                50.0 + 0.1 * (t as f64 / 1000.0) + 10.0 * noise.next(),
            );
        }
        let f = flat.stats(D, M, Window::All);
        assert!(f.slope_per_s.unwrap_or(f64::NAN).abs() < 0.005, "{f:?}");
        assert!(f.r2.unwrap_or(f64::NAN) < 0.01, "{f:?}");
        let t = trend.stats(D, M, Window::All);
        assert!(close(t.slope_per_s.unwrap_or(f64::NAN), 0.1, 0.05), "{t:?}");
        // Uniform noise of half-width 10 has variance 33.3; the ramp's is 100²/12 = 833.
        let r2 = t.r2.unwrap_or(f64::NAN);
        assert!(r2 > 0.9 && r2 < 0.99, "{t:?}");
    }

    #[test]
    fn slope_needs_three_points_and_time_variance() {
        let mut h = History::new();
        h.push(D, M, 0, 1.0);
        h.push(D, M, 1000, 2.0);
        let s = h.stats(D, M, Window::All);
        assert_eq!((s.slope_per_s, s.r2), (None, None));
        h.push(D, M, 2000, 3.0);
        let s = h.stats(D, M, Window::All);
        assert!(close(s.slope_per_s.unwrap_or(f64::NAN), 1.0, 1e-12));

        let mut same_time = History::new();
        for v in [1.0, 5.0, 9.0] {
            assert!(same_time.push(D, M, 42, v));
        }
        let s = same_time.stats(D, M, Window::All);
        assert_eq!(s.count, 3);
        assert_eq!((s.slope_per_s, s.r2), (None, None));

        let mut constant = History::new();
        for i in 0..10 {
            constant.push(D, M, i * 100, 7.0);
        }
        let s = constant.stats(D, M, Window::All);
        assert_eq!(s.slope_per_s, Some(0.0));
        assert_eq!(s.r2, Some(1.0));
    }

    #[test]
    fn fraction_where_regular_irregular_and_gaps() {
        let mut h = History::new();
        for i in 0..10u64 {
            h.push(D, M, 1000 * i, i as f64);
        }
        assert_eq!(h.fraction_where(D, M, Window::All, |v| v >= 5.0), Some(0.5));
        assert_eq!(
            h.fraction_where(D, M, Window::All, |v| v > 100.0),
            Some(0.0)
        );
        assert_eq!(h.fraction_where(D, M, secs(3), |v| v >= 5.0), Some(1.0));

        // True for 3 s, then false sampled every second: time says 3/7, samples would say 1/5.
        let mut h = History::new();
        for (t, v) in [(0, 1.0), (3000, 0.0), (4000, 0.0), (5000, 0.0), (6000, 0.0)] {
            h.push(D, M, t, v);
        }
        let f = h.fraction_where(D, M, Window::All, |v| v > 0.5);
        assert!(close(f.unwrap_or(f64::NAN), 3.0 / 7.0, 1e-12), "{f:?}");

        // A 60 s outage after a true point counts as GAP_FACTOR steps (10 s), not 60 s.
        let mut h = History::new();
        for (t, v) in [
            (0, 1.0),
            (60_000, 0.0),
            (61_000, 0.0),
            (62_000, 0.0),
            (63_000, 0.0),
            (64_000, 0.0),
        ] {
            h.push(D, M, t, v);
        }
        let f = h.fraction_where(D, M, Window::All, |v| v > 0.5);
        assert!(close(f.unwrap_or(f64::NAN), 10.0 / 15.0, 1e-12), "{f:?}");

        // One point: no cadence, so the answer is that point's verdict.
        let mut h = History::new();
        h.push(D, M, 5, 3.0);
        assert_eq!(h.fraction_where(D, M, Window::All, |v| v == 3.0), Some(1.0));
    }

    #[test]
    fn window_boundaries() {
        let mut h = History::new();
        for i in 1..=10u64 {
            h.push(D, M, 1000 * i, i as f64);
        }
        // Last(3 s) from 10 000 is (7000, 10 000]: three points.
        let s = h.stats(D, M, secs(3));
        assert_eq!(s.count, 3);
        assert_eq!(s.min, Some(8.0));
        assert_eq!(s.first_ms, Some(8000));
        assert_eq!(s.last_ms, Some(10_000));
        assert_eq!(s.mean, Some(9.0));
        // Range is inclusive at both ends.
        let s = h.stats(
            D,
            M,
            Window::Range {
                start_ms: 7000,
                end_ms: 9000,
            },
        );
        assert_eq!(
            (s.count, s.min, s.max, s.last),
            (3, Some(7.0), Some(9.0), Some(9.0))
        );
        let s = h.stats(
            D,
            M,
            Window::Range {
                start_ms: 7001,
                end_ms: 8999,
            },
        );
        assert_eq!(s.count, 1);
        assert_eq!(s.mean, Some(8.0));
        // Reversed and out-of-data ranges are empty, not errors.
        assert_eq!(
            h.stats(
                D,
                M,
                Window::Range {
                    start_ms: 9000,
                    end_ms: 7000
                }
            )
            .count,
            0
        );
        let s = h.stats(
            D,
            M,
            Window::Range {
                start_ms: 20_000,
                end_ms: 30_000,
            },
        );
        assert_eq!((s.count, s.mean, s.p95), (0, None, None));
        // A zero window still sees the newest point; a huge one sees everything.
        let s = h.stats(D, M, Duration::ZERO);
        assert_eq!((s.count, s.last), (1, Some(10.0)));
        assert_eq!(h.stats(D, M, Duration::MAX).count, 10);
        let in_window: Vec<_> = h.series_in(D, M, secs(2)).collect();
        assert_eq!(in_window, vec![(9000, 9.0), (10_000, 10.0)]);
    }

    #[test]
    fn eviction_to_coarse_keeps_stats_across_tiers() {
        // `a` keeps 10 s raw and 5 s buckets; `b` keeps everything raw, as the reference.
        let mut a = tiered(10, 3600, 5);
        let mut b = tiered(3600, 3600, 5);
        let mut noise = Noise(12345);
        for i in 0..200u64 {
            let t = 1_760_000_000_000 + 1000 * i;
            let v = 2.0 * i as f64 + 3.0 * noise.next();
            assert!(a.push(D, M, t, v));
            assert!(b.push(D, M, t, v));
        }
        let sa = &a.devices[&D][metric_index(M)];
        let series = sa.as_ref().map(|s| (s.fine.len(), s.coarse.len()));
        // Raw: ages 0..=10 s. Coarse: the other 189 points in 5 s buckets (aligned to epoch ms).
        assert_eq!(series.map(|s| s.0), Some(11));
        assert!(matches!(series, Some((_, 38..=39))), "{series:?}");
        assert_eq!(a.buckets(D, M).map(|b| b.count).sum::<u64>(), 189);

        for window in [Window::All, Window::Last(secs(60)), Window::Last(secs(15))] {
            let (x, y) = (a.stats(D, M, window), b.stats(D, M, window));
            assert!(x.coarse && !y.coarse, "{window:?}");
            assert_eq!(x.count, y.count, "{window:?}");
            assert_eq!((x.min, x.max, x.last), (y.min, y.max, y.last), "{window:?}");
            assert_eq!(
                (x.first_ms, x.last_ms),
                (y.first_ms, y.last_ms),
                "{window:?}"
            );
            let pairs = [
                (x.mean, y.mean),
                (x.slope_per_s, y.slope_per_s),
                (x.r2, y.r2),
            ];
            for (p, q) in pairs {
                let (p, q) = (p.unwrap_or(f64::NAN), q.unwrap_or(f64::NAN));
                assert!(close(p, q, 1e-9), "{window:?}: {p} vs {q}");
            }
            // p95 over bucket means stays within the data and near the raw answer.
            let (p, q) = (x.p95.unwrap_or(f64::NAN), y.p95.unwrap_or(f64::NAN));
            assert!((p - q).abs() < 10.0, "{window:?}: {p} vs {q}");
        }
        // Within the raw tier, nothing is approximate.
        let (x, y) = (a.stats(D, M, secs(10)), b.stats(D, M, secs(10)));
        assert!(!x.coarse);
        assert_eq!(x, y);
        // A window edge inside a bucket resolves at the bucket's centroid: within one bucket.
        let (x, y) = (a.stats(D, M, secs(62)), b.stats(D, M, secs(62)));
        assert!(x.count.abs_diff(y.count) <= 5, "{} vs {}", x.count, y.count);
        // Fraction of time agrees for a threshold whose buckets are all on one side.
        let fa = a.fraction_where(D, M, Window::All, |v| v > 1000.0);
        assert_eq!(fa, Some(0.0));
        let fa = a.fraction_where(D, M, Window::All, |v| v > -1000.0);
        assert_eq!(fa, Some(1.0));
        let (fa, fb) = (
            a.fraction_where(D, M, Window::All, |v| v > 200.0),
            b.fraction_where(D, M, Window::All, |v| v > 200.0),
        );
        assert!(
            (fa.unwrap_or(f64::NAN) - fb.unwrap_or(f64::NAN)).abs() < 0.03,
            "{fa:?} {fb:?}"
        );

        // Charts get every point in time order: buckets as means, then the raw tail.
        let chart: Vec<_> = a.series(D, M).collect();
        assert_eq!(chart.len(), 11 + a.buckets(D, M).count());
        assert!(chart.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(chart.last().copied(), a.latest(D, M));
    }

    #[test]
    fn p95_across_tiers_is_exact_for_values_constant_per_bucket() {
        let mut a = tiered(10, 3600, 5);
        let mut b = tiered(3600, 3600, 5);
        for i in 0..300u64 {
            let v = ((i / 5) * 7 % 23) as f64;
            a.push(D, M, 1000 * i, v);
            b.push(D, M, 1000 * i, v);
        }
        let (x, y) = (a.stats(D, M, Window::All), b.stats(D, M, Window::All));
        assert!(x.coarse);
        assert_eq!(x.p95, y.p95);
        let mut values: Vec<f64> = (0..300u64).map(|i| ((i / 5) * 7 % 23) as f64).collect();
        values.sort_by(f64::total_cmp);
        assert_eq!(x.p95, Some(values[284]));
    }

    #[test]
    fn retention_drops_old_buckets() {
        let mut h = tiered(10, 60, 5);
        for i in 0..300u64 {
            h.push(D, M, 1000 * i, i as f64);
        }
        // Kept: buckets with a point at most 60 s old, so 61..=65 points back from the newest.
        let s = h.stats(D, M, Window::All);
        assert!((61..=65).contains(&s.count), "{s:?}");
        assert_eq!(s.last, Some(299.0));
        let span = h.span_ms(D).unwrap_or(0);
        assert!((60_000..=64_000).contains(&span), "{span}");
        // The oldest kept point is at least 235 s (299 − 64) into the run.
        assert!(s.min.unwrap_or(0.0) >= 235.0, "{s:?}");
        assert!(h.series(D, M).all(|(t, _)| t >= 235_000));
    }

    #[test]
    fn max_fine_points_caps_the_raw_tier() {
        let mut h = History::with_config(HistoryConfig {
            max_fine_points: 5,
            ..HistoryConfig::default()
        });
        for i in 0..1000u64 {
            h.push(D, M, 10 * i, i as f64);
        }
        let fine = h.devices[&D][metric_index(M)]
            .as_ref()
            .map(|s| s.fine.len());
        assert_eq!(fine, Some(5));
        let s = h.stats(D, M, Window::All);
        assert_eq!(s.count, 1000);
        assert_eq!(s.mean, Some(499.5));
    }

    #[test]
    fn non_finite_and_out_of_order_are_refused() {
        let mut h = History::new();
        assert!(h.push(D, M, 1000, 10.0));
        assert!(!h.push(D, M, 2000, f64::NAN));
        assert!(!h.push(D, M, 2000, f64::INFINITY));
        assert!(!h.push(D, M, 2000, f64::NEG_INFINITY));
        assert!(!h.push(D, M, 500, 99.0));
        assert!(h.push(D, M, 1000, 12.0), "an equal timestamp is in order");
        assert_eq!(h.rejected_points(), 4);
        let s = h.stats(D, M, Window::All);
        assert_eq!((s.count, s.mean, s.max), (2, Some(11.0), Some(12.0)));
        assert_eq!(h.latest(D, M), Some((1000, 12.0)));
        // A NaN on a device never seen creates nothing.
        assert!(!h.push(7, M, 0, f64::NAN));
        assert_eq!(h.devices().collect::<Vec<_>>(), vec![D]);
    }

    #[test]
    fn push_sample_stores_only_present_finite_values() {
        let mut h = History::new();
        let mut s = Sample::new(2, 5000);
        s.gpu_util_pct = Some(80.0);
        s.mem_used_bytes = Some(1 << 40);
        s.sm_clock_mhz = Some(1980);
        s.power_w = Some(f64::NAN);
        h.push_sample(&s);
        assert_eq!(
            h.metrics(2).collect::<Vec<_>>(),
            vec![Metric::GpuUtilPct, Metric::MemUsedBytes, Metric::SmClockMhz]
        );
        assert_eq!(
            h.latest(2, Metric::MemUsedBytes),
            Some((5000, (1u64 << 40) as f64))
        );
        assert_eq!(h.latest(2, Metric::SmClockMhz), Some((5000, 1980.0)));
        assert_eq!(h.latest(2, Metric::PowerW), None);
        assert_eq!(h.latest(2, Metric::FanPct), None);
        assert_eq!(h.rejected_points(), 1);

        let mut later = Sample::new(2, 8000);
        later.gpu_util_pct = Some(40.0);
        h.push_sample(&later);
        let mut other = Sample::new(0, 6000);
        other.temp_gpu_c = Some(55.0);
        h.push_sample(&other);
        assert_eq!(h.devices().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(h.span_ms(2), Some(3000));
        assert_eq!(h.latest_ms(2), Some(8000));
        assert_eq!(h.stats(2, Metric::GpuUtilPct, Window::All).mean, Some(60.0));
        h.clear();
        assert_eq!(h.devices().count(), 0);
    }

    #[test]
    fn window_stats_round_trip_through_json() {
        let mut h = History::new();
        for i in 0..5u64 {
            h.push(D, M, 100 * i, i as f64);
        }
        let s = h.stats(D, M, Window::All);
        let json = serde_json::to_string(&s).unwrap_or_default();
        let back: Option<WindowStats> = serde_json::from_str(&json).ok();
        assert_eq!(back, Some(s));
        let empty = serde_json::to_value(WindowStats::default()).unwrap_or_default();
        assert_eq!(empty["mean"], serde_json::Value::Null);
        assert_eq!(empty["count"], 0);
    }

    const MIB: usize = 1 << 20;
    const HOUR_MS: u64 = 3600 * 1000;

    /// 8 GPUs × every metric at 10 Hz for 3 h. Retention is shortened to 1 h here so the
    /// history reaches steady state inside the run and "does not grow" is observable; the
    /// default 6 h retention is covered analytically by the next test.
    #[test]
    fn memory_is_bounded_and_flat_for_a_fleet() {
        let mut h = tiered(600, 3600, 10);
        let mut at_hour = [0usize; 4];
        let mut t = 1_760_000_000_000u64;
        let start = t;
        let mut i = 0u64;
        while t - start <= 3 * HOUR_MS {
            for device in 0..8u32 {
                for (k, metric) in Metric::ALL.into_iter().enumerate() {
                    h.push(device, metric, t, (i % 100) as f64 + k as f64);
                }
            }
            if (t - start).is_multiple_of(HOUR_MS) {
                at_hour[usize::try_from((t - start) / HOUR_MS).unwrap_or(0)] =
                    h.approx_memory_bytes();
            }
            i += 1;
            t += 100;
        }
        assert_eq!(h.rejected_points(), 0);
        assert_eq!(h.stats(7, Metric::DecoderUtilPct, secs(10)).count, 100);
        assert!(at_hour[3] < 64 * MIB, "{at_hour:?}");
        assert_eq!(at_hour[2], at_hour[3], "memory grew between hour 2 and 3");
        assert!(at_hour[1] <= at_hour[2]);
    }

    /// One series at 10 Hz with the default configuration (10 min raw, 6 h coarse) for 7 h:
    /// per-series memory is flat after 6 h, and every series of 8 GPUs fits in 96 MiB.
    #[test]
    fn default_retention_memory_bound() {
        let mut h = History::new();
        let mut t = 1_760_000_000_000u64;
        let start = t;
        let mut at_6h = 0;
        while t - start <= 7 * HOUR_MS {
            h.push(D, M, t, (t % 977) as f64);
            if t - start == 6 * HOUR_MS {
                at_6h = h.approx_memory_bytes();
            }
            t += 100;
        }
        let at_7h = h.approx_memory_bytes();
        assert_eq!(at_6h, at_7h);
        let fleet = 8 * Metric::ALL.len() * at_7h;
        assert!(fleet < 96 * MIB, "{} MiB", fleet / MIB);
        assert_eq!(std::mem::size_of::<Bucket>(), 80);
        // Data older than 6 h is gone; newer is all there.
        let span = h.span_ms(D).unwrap_or(0);
        assert!(
            (6 * HOUR_MS..6 * HOUR_MS + 10_000).contains(&span),
            "{span}"
        );
    }

    #[test]
    fn mean_alone_matches_the_full_statistics() {
        let mut h = History::with_config(HistoryConfig {
            fine_retention: Duration::from_secs(60),
            ..HistoryConfig::default()
        });
        for i in 0..3000u64 {
            h.push(0, Metric::PowerW, i * 100, (i % 37) as f64 * 3.5);
        }
        for w in [
            Window::Last(Duration::from_secs(10)),
            Window::Last(Duration::from_secs(200)),
            Window::All,
        ] {
            let full = h.stats(0, Metric::PowerW, w).mean.unwrap();
            let alone = h.mean(0, Metric::PowerW, w).unwrap();
            assert!((full - alone).abs() < 1e-9, "{w:?}: {full} vs {alone}");
        }
        assert_eq!(h.mean(1, Metric::PowerW, Window::All), None);
    }
}
