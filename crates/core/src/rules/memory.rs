//! Memory: a GPU nearly out of memory, and a process whose memory grows steadily (a leak).
//!
//! A leak is judged on a per-process series kept by `ProcessMemory` (the history is per device):
//! it must grow at a rate worth worrying about, add up to a real amount, fit a straight line well
//! (a single large allocation is a step, which a line fits badly) and grow in several separate
//! increases. Small growth needs minutes of history; growth of a GiB or more in many increases
//! that is still going in the second half is judged from seconds, so a short check still sees a
//! fast leak while a model warming up (a few large steps, then flat) is not one. A process with
//! too little history is reported as not judged.

use std::collections::BTreeMap;

use serde_json::json;

use super::{RuleInput, mean_over, round2, secs, shown};
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::{Metric, TimeMs};

const MIB: f64 = 1024.0 * 1024.0;

/// Least-squares fit of a series: slope per second and R².
pub fn fit(points: &[(TimeMs, f64)]) -> Option<(f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let t0 = points[0].0;
    let n = points.len() as f64;
    // Signed: a recording's clock may step backwards.
    let xs = points.iter().map(|&(t, _)| (t as f64 - t0 as f64) / 1000.0);
    let (sx, sy) = points
        .iter()
        .zip(xs.clone())
        .fold((0.0, 0.0), |(sx, sy), (&(_, y), x)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for (&(_, y), x) in points.iter().zip(xs) {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (y - my);
        syy += (y - my) * (y - my);
    }
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy <= 0.0 {
        1.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    Some((slope, r2))
}

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = nearly_full(input);
    out.extend(leaks(input));
    out
}

fn nearly_full(input: &RuleInput<'_>) -> Vec<Finding> {
    const ID: &str = "memory.nearly_full";
    let cfg = &input.config.memory;
    let mut out = Vec::new();
    for d in input.devices {
        let used = input.history.mean(
            d.index,
            Metric::MemUsedBytes,
            secs(cfg.nearly_full_window_s),
        );
        let total = input
            .latest
            .get(&d.index)
            .and_then(|s| s.mem_total_bytes)
            .or(d.memory_total_bytes);
        let (Some(mean), Some(total)) = (used, total) else {
            let (field, what) = if used.is_none() {
                ("mem_used_bytes", "used memory")
            } else {
                ("mem_total_bytes", "total memory")
            };
            input.not_judged(
                ID,
                Some(d.index),
                format!("no {what} reading ({})", input.why_absent(d.index, field)),
            );
            continue;
        };
        let pct = mean / total as f64 * 100.0;
        if pct <= cfg.nearly_full_pct {
            continue;
        }
        out.push(Finding::new(
            ID.into(),
            Severity::Warn,
            Some(d.index),
            input.now_ms,
            format!(
                "GPU {} memory {}% full ({})",
                d.index,
                shown(pct, 1, f64::gt, cfg.nearly_full_pct),
                mean_over(
                    input.history,
                    d.index,
                    Metric::MemUsedBytes,
                    secs(cfg.nearly_full_window_s)
                )
            ),
            Evidence {
                values: values([
                    ("used_mean_mib", json!(round2(mean / MIB))),
                    ("total_mib", json!(round2(total as f64 / MIB))),
                    ("used_pct", json!(round2(pct))),
                ]),
                window_s: cfg.nearly_full_window_s,
                threshold: format!("> {}% of total", cfg.nearly_full_pct),
            },
            "Out-of-memory errors are close: reduce the batch size or activation memory \
                     (mixed precision, gradient checkpointing), release cached blocks, or find the \
                     process holding the most memory in the process list."
                .into(),
        ));
    }
    out
}

/// The leak finding's id.
const LEAK: &str = "memory.possible_leak";

/// The share of its growth a short series must add in its second half: a leak keeps growing,
/// while a model warming up (the caching allocator reserving its pool in a few large steps in
/// the first seconds) levels off.
const STILL_GROWING_SHARE: f64 = 0.25;

/// A process that could not be judged for want of time: the one holding the most memory names
/// the device's entry.
struct TooShort<'a> {
    pid: u32,
    name: Option<&'a str>,
    span_s: f64,
    bytes: f64,
    more: usize,
}

fn leaks(input: &RuleInput<'_>) -> Vec<Finding> {
    let cfg = &input.config.memory;
    let Some(store) = input.process_memory else {
        return Vec::new();
    };
    for d in input.devices {
        let Some(latest) = input.latest.get(&d.index) else {
            continue;
        };
        match &latest.processes {
            None => input.not_judged(
                LEAK,
                Some(d.index),
                format!(
                    "no process list ({})",
                    input.why_absent(d.index, "processes")
                ),
            ),
            Some(list)
                if !list.is_empty() && list.iter().all(|p| p.used_memory_bytes.is_none()) =>
            {
                input.not_judged(
                    LEAK,
                    Some(d.index),
                    "processes are listed without their memory use",
                );
            }
            Some(_) => {}
        }
    }
    let mut short: BTreeMap<u32, TooShort<'_>> = BTreeMap::new();
    let mut out = Vec::new();
    for (&(device, pid), series) in &store.series {
        // A process the latest list no longer shows has let go of its memory: how it grew is
        // history (a report of the span keeps the finding, cleared), not a leak that runs out
        // of memory from here on.
        if is_gone(input, device, pid) {
            continue;
        }
        let points: Vec<(TimeMs, f64)> = series.points.iter().copied().collect();
        let (Some(&(t0, first)), Some(&(t1, last))) = (points.first(), points.last()) else {
            continue;
        };
        let span_s = t1.saturating_sub(t0) as f64 / 1000.0;
        let growth_mib = (last - first) / MIB;
        let steps = points.windows(2).filter(|w| w[1].1 > w[0].1).count() as u32;
        // Small growth needs minutes to tell a leak from a model settling; a large, steady one
        // that is still going is a leak in seconds.
        let fast = span_s >= cfg.leak_fast_min_span_s
            && growth_mib >= cfg.leak_fast_min_growth_mib
            && steps >= cfg.leak_fast_min_steps
            && still_growing(&points);
        if span_s < cfg.leak_min_span_s && !fast {
            if is_listed(input, device, pid) {
                let entry = short.entry(device).or_insert(TooShort {
                    pid,
                    name: series.name.as_deref(),
                    span_s,
                    bytes: last,
                    more: 0,
                });
                if entry.pid != pid {
                    entry.more += 1;
                    if last > entry.bytes {
                        (entry.pid, entry.name, entry.span_s, entry.bytes) =
                            (pid, series.name.as_deref(), span_s, last);
                    }
                }
            }
            continue;
        }
        let Some((slope, r2)) = fit(&points) else {
            continue;
        };
        let rate_mib_min = slope * 60.0 / MIB;
        if rate_mib_min < cfg.leak_min_rate_mib_per_min
            || growth_mib < cfg.leak_min_growth_mib
            || r2 < cfg.leak_min_r2
            || steps < cfg.leak_min_steps
        {
            continue;
        }
        let name = series.name.as_deref().unwrap_or("unknown");
        out.push(Finding::new(
            LEAK.into(),
            Severity::Warn,
            Some(device),
            input.now_ms,
            format!(
                "{name} (pid {pid}) on GPU {device} grows steadily: +{rate_mib_min:.0} MiB/min, \
                 {growth_mib:.0} MiB in {}",
                if span_s < 120.0 {
                    format!("{span_s:.0} s")
                } else {
                    format!("{:.0} min", span_s / 60.0)
                }
            ),
            Evidence {
                values: values([
                    ("pid", json!(pid)),
                    ("name", json!(series.name)),
                    ("rate_mib_per_min", json!(round2(rate_mib_min))),
                    ("growth_mib", json!(round2(growth_mib))),
                    ("r2", json!(round2(r2))),
                    ("increases", json!(steps)),
                    ("used_mib", json!(round2(last / MIB))),
                ]),
                window_s: round2(span_s),
                threshold: format!(
                    ">= {} MiB/min and >= {} MiB with R² >= {} over >= {} increases, in >= {} s \
                     (>= {} s for >= {} MiB in >= {} increases still growing)",
                    cfg.leak_min_rate_mib_per_min,
                    cfg.leak_min_growth_mib,
                    cfg.leak_min_r2,
                    cfg.leak_min_steps,
                    cfg.leak_min_span_s,
                    cfg.leak_fast_min_span_s,
                    cfg.leak_fast_min_growth_mib,
                    cfg.leak_fast_min_steps
                ),
            },
            "A possible leak: tensors kept alive across iterations (a running loss kept \
                     with its graph instead of .item(), growing lists or caches of GPU tensors), \
                     or an allocator that never reuses blocks. Compare \
                     torch.cuda.memory_summary() or a memory snapshot between iterations; at this \
                     rate the process runs out of memory eventually."
                .into(),
        ));
    }
    for (device, s) in short {
        input.not_judged(
            LEAK,
            Some(device),
            format!(
                "{} (pid {}) has {:.0} s of data{}; a leak needs {} s, or {} s of steady growth \
                 adding up to {} MiB or more",
                s.name.unwrap_or("unknown"),
                s.pid,
                s.span_s,
                if s.more > 0 {
                    format!(" ({} more process(es) too)", s.more)
                } else {
                    String::new()
                },
                cfg.leak_min_span_s,
                cfg.leak_fast_min_span_s,
                cfg.leak_fast_min_growth_mib
            ),
        );
    }
    out
}

/// Whether the series still adds `STILL_GROWING_SHARE` of its growth in its second half.
fn still_growing(points: &[(TimeMs, f64)]) -> bool {
    let (Some(&(t0, first)), Some(&(t1, last))) = (points.first(), points.last()) else {
        return false;
    };
    let mid = t0 + t1.saturating_sub(t0) / 2;
    let at_mid = points
        .iter()
        .take_while(|&&(t, _)| t <= mid)
        .last()
        .map_or(first, |&(_, v)| v);
    last > first && last - at_mid >= STILL_GROWING_SHARE * (last - first)
}

/// Not in the newest process list of `device` (an unknown list says nothing).
fn is_gone(input: &RuleInput<'_>, device: u32, pid: u32) -> bool {
    let known = input
        .latest
        .get(&device)
        .is_some_and(|s| s.processes.is_some());
    known && !is_listed(input, device, pid)
}

/// Whether `pid` is in the newest process list of `device`: a process that has gone is not
/// waiting to be judged.
fn is_listed(input: &RuleInput<'_>, device: u32, pid: u32) -> bool {
    input
        .latest
        .get(&device)
        .and_then(|s| s.processes.as_ref())
        .is_some_and(|list| list.iter().any(|p| p.pid == pid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::process_state::ProcessMemory;
    use gpudiag_model::sample::Sample;

    #[test]
    fn fit_recovers_a_line_and_rejects_a_step() {
        let line: Vec<(TimeMs, f64)> = (0..60)
            .map(|i| (i * 1000, 100.0 + 2.0 * i as f64))
            .collect();
        let (slope, r2) = fit(&line).unwrap();
        assert!((slope - 2.0).abs() < 1e-9);
        assert!((r2 - 1.0).abs() < 1e-9);
        let step: Vec<(TimeMs, f64)> = (0..60)
            .map(|i| (i * 1000, if i < 30 { 0.0 } else { 1000.0 }))
            .collect();
        let (_, r2) = fit(&step).unwrap();
        assert!(r2 < 0.8, "a step fits a line badly: {r2}");
    }

    #[test]
    fn still_growing_tells_a_leak_from_a_warm_up() {
        let line: Vec<(TimeMs, f64)> = (0..40).map(|i| (i * 1000, i as f64)).collect();
        assert!(still_growing(&line));
        let warm_up: Vec<(TimeMs, f64)> = (0..40).map(|i| (i * 1000, (i.min(12)) as f64)).collect();
        assert!(!still_growing(&warm_up));
        assert!(!still_growing(&[(0, 5.0), (1000, 5.0)]));
    }

    #[test]
    fn observe_keeps_changes_and_one_point_a_second() {
        let mut pm = ProcessMemory::default();
        for i in 0..50u64 {
            let mut s = Sample::new(0, i * 100);
            s.processes = Some(vec![gpudiag_model::sample::ProcessSample {
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
            }]);
            pm.observe(&s, 600_000);
        }
        // 5 s of 10 Hz samples with an unchanged value: one point per second.
        assert_eq!(pm.series[&(0, 7)].points.len(), 5);
    }
}
