//! Rules: pure functions over the history and device info that produce findings.
//!
//! One file per family. Each family reads a `RuleInput` (history, latest samples, events, static
//! device info, thresholds) and returns findings, and says through `RuleInput::not_judged` what
//! it could not judge (too little history, a field the GPU does not report); none keeps state. `engine::RuleEngine` is the
//! live driver: it feeds ticks, keeps the little state rules need across ticks (per-process
//! memory for leaks), and evaluates the windowed rules on a fixed cadence, so the cost per tick
//! depends on the window lengths, never on how long the history has grown.

pub mod bottleneck;
pub mod engine;
pub mod environment;
pub mod errors;
pub mod families;
pub mod health;
pub mod job;
pub mod memory;
pub mod pcie;
pub mod peers;
pub mod power;
pub mod process_state;
pub mod ras_log;
pub mod thermal;
pub mod throttle;
pub mod utilisation;
pub mod vendor;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::RulesConfig;
use crate::history::History;
use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{DeviceInfo, Event, HostInfo, Metric, Sample, TimeMs};
use gpudiag_model::verdict::NotJudged;
use process_state::{ProcessCpu, ProcessMemory};

/// Everything a rule may look at. Rules are pure: the same input gives the same findings.
pub struct RuleInput<'a> {
    pub devices: &'a [DeviceInfo],
    pub history: &'a History,
    /// The newest sample per device (for flags and counters that are not series).
    pub latest: &'a BTreeMap<u32, Sample>,
    /// Events to judge (XIDs, lost devices); each is judged once by the engine.
    pub events: &'a [Event],
    /// The time findings are stamped with.
    pub now_ms: TimeMs,
    pub config: &'a RulesConfig,
    /// Host facts (driver and the CUDA version it supports), when known.
    pub host: Option<&'a HostInfo>,
    /// CUDA libraries found on this host; `None` for recordings from elsewhere.
    pub libraries: Option<&'a [LibraryInfo]>,
    /// Per-process memory series for the leak rule; `None` when nobody kept them.
    pub process_memory: Option<&'a ProcessMemory>,
    /// Per-process CPU time for the verdict's host-side evidence; `None` when nobody kept it.
    pub process_cpu: Option<&'a ProcessCpu>,
    /// NCCL RAS answers of this host (see `ras_log::ras_evidence`); `None` when nobody kept them.
    pub ras: Option<&'a ras_log::RasLog>,
    /// gpudiag's own pid, which holds no job's memory; `None` where the GPUs are not this
    /// host's (see [`RuleEngine::excluding_own_process`](engine::RuleEngine::excluding_own_process)).
    pub own_pid: Option<u32>,
    /// Where rules say what they could not judge: the engine reads it after an evaluation.
    pub not_judged: NotJudgedLog,
}

/// Rules that could not judge a device, and why: silence is not health. A side channel rather
/// than a second return value, so a family's signature stays `evaluate(&RuleInput) ->
/// Vec<Finding>`; one entry per (rule, device), the first reason given.
#[derive(Debug, Default)]
pub struct NotJudgedLog(RefCell<Vec<NotJudged>>);

impl NotJudgedLog {
    pub fn take(&self) -> Vec<NotJudged> {
        self.0.take()
    }
}

impl RuleInput<'_> {
    /// Records that `rule` (a finding id, or a family such as `throttle` when all its findings
    /// need the same data) could not judge `device`.
    pub fn not_judged(&self, rule: &str, device: Option<u32>, reason: impl Into<String>) {
        let mut log = self.not_judged.0.borrow_mut();
        if !log.iter().any(|n| n.rule == rule && n.device == device) {
            log.push(NotJudged {
                rule: rule.to_owned(),
                device,
                reason: reason.into(),
            });
        }
    }

    /// Why the newest sample of `device` lacks `field`, in words: "not supported", or "not
    /// recorded" where the sample does not say.
    pub(crate) fn why_absent(&self, device: u32, field: &str) -> String {
        self.latest
            .get(&device)
            .and_then(|s| s.why_absent(field))
            .map_or_else(|| "not recorded".to_owned(), ToString::to_string)
    }
}

/// Worst first, then by device, then by id, so output is stable.
pub fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.device.cmp(&b.device))
            .then(a.id.cmp(&b.id))
    });
}

/// A window from config seconds. The config is range-checked; this still never panics on what
/// slips past (a huge or infinite value saturates; NaN and negatives are zero).
pub(crate) fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

/// Rounds for evidence: two decimals are plenty and keep the JSON readable.
pub(crate) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// What a mean of `metric` over `window` covers, as a title says it: "mean over 40 s", or "one
/// reading" where a single read is all there is.
pub(crate) fn mean_over(
    history: &History,
    device: u32,
    metric: Metric,
    window: Duration,
) -> String {
    let first = history.series_in(device, metric, window).next();
    let last = history.latest(device, metric);
    match first.zip(last) {
        Some(((a, _), (b, _))) if b > a => format!("mean over {:.0} s", (b - a) as f64 / 1000.0),
        _ => "one reading".to_owned(),
    }
}

/// `v` for a title: with `decimals` decimals, or more where rounding would put it on the other
/// side of `threshold` than the value itself ("50%" for 49.6 against "< 50%"). `cmp` is the
/// rule's comparison (`f64::lt`, `f64::ge`, ...), `threshold` the number as the evidence shows it.
pub(crate) fn shown(
    v: f64,
    decimals: usize,
    cmp: fn(&f64, &f64) -> bool,
    threshold: f64,
) -> String {
    let truth = cmp(&v, &threshold);
    (decimals..=decimals + 3)
        .map(|d| format!("{v:.d$}"))
        .find(|s| s.parse::<f64>().is_ok_and(|r| cmp(&r, &threshold) == truth))
        .unwrap_or_else(|| v.to_string())
}

/// `shown` for a value and a threshold that are both printed: the fewest decimals (from
/// `decimals`) at which the two printed numbers compare as the exact ones do.
pub(crate) fn shown_pair(
    v: f64,
    threshold: f64,
    decimals: usize,
    cmp: fn(&f64, &f64) -> bool,
) -> (String, String) {
    let truth = cmp(&v, &threshold);
    (decimals..=decimals + 3)
        .map(|d| (format!("{v:.d$}"), format!("{threshold:.d$}")))
        .find(|(a, b)| match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(a), Ok(b)) => cmp(&a, &b) == truth,
            _ => false,
        })
        .unwrap_or_else(|| (v.to_string(), threshold.to_string()))
}

/// Samples of several metrics of one device aligned on their timestamps, oldest first. Metrics
/// come from the same `Sample`, so equal times mean the same instant; a metric a sample lacked
/// is `None` there.
pub(crate) fn aligned<const N: usize>(
    history: &History,
    device: u32,
    metrics: [Metric; N],
    window: Duration,
) -> Vec<(TimeMs, [Option<f64>; N])> {
    // All series of a device end at the same tick, so one end anchors every window.
    let end = metrics
        .iter()
        .filter_map(|&m| history.latest(device, m).map(|(t, _)| t))
        .max();
    let Some(end) = end else {
        return Vec::new();
    };
    let range = crate::history::Window::Range {
        start_ms: end
            .saturating_sub(window.as_millis() as u64)
            .saturating_add(1),
        end_ms: end,
    };
    // Series are sorted by time: one k-way walk builds each row once. This runs on every
    // evaluation of every device, where re-merging wide rows per metric would dominate.
    let series: [Vec<(TimeMs, f64)>; N] =
        metrics.map(|m| history.series_in(device, m, range).collect());
    let mut heads = [0usize; N];
    let mut rows = Vec::with_capacity(series.iter().map(Vec::len).max().unwrap_or(0));
    loop {
        let next = series
            .iter()
            .zip(&heads)
            .filter_map(|(s, &h)| s.get(h).map(|p| p.0))
            .min();
        let Some(t) = next else {
            break;
        };
        let mut row = [None; N];
        for (i, s) in series.iter().enumerate() {
            if let Some(&(ts, v)) = s.get(heads[i])
                && ts == t
            {
                row[i] = Some(v);
                heads[i] += 1;
            }
        }
        rows.push((t, row));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_never_rounds_a_value_across_its_threshold() {
        assert_eq!(shown(49.6, 0, f64::lt, 50.0), "49.6");
        assert_eq!(shown(49.96, 0, f64::lt, 50.0), "49.96");
        assert_eq!(shown(42.4, 0, f64::lt, 50.0), "42");
        assert_eq!(shown(95.04, 1, f64::gt, 95.0), "95.04");
        assert_eq!(shown(85.0, 0, f64::ge, 85.0), "85");
        // Replays at 30.8/min against a budget of 30.72/min must not read "31 above 31".
        assert_eq!(
            shown_pair(30.8, 30.72, 0, f64::gt),
            ("30.8".to_owned(), "30.7".to_owned())
        );
        assert_eq!(
            shown_pair(62.0, 30.72, 0, f64::gt),
            ("62".to_owned(), "31".to_owned())
        );
    }

    #[test]
    fn aligned_joins_series_on_time_and_keeps_gaps() {
        let mut h = History::default();
        for t in 0..10u64 {
            h.push(0, Metric::GpuUtilPct, t * 100, t as f64);
            if t % 2 == 0 {
                h.push(0, Metric::PowerW, t * 100, 100.0 + t as f64);
            }
        }
        h.push(0, Metric::PowerW, 950, 1.0);
        let rows = aligned(
            &h,
            0,
            [Metric::GpuUtilPct, Metric::PowerW],
            Duration::from_millis(500),
        );
        let times: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(times, [500, 600, 700, 800, 900, 950]);
        assert_eq!(rows[1].1, [Some(6.0), Some(106.0)]);
        assert_eq!(rows[2].1, [Some(7.0), None]);
        assert_eq!(rows[5].1, [None, Some(1.0)]);
    }
}
