//! Throttling by reason. NVML reports clock-event reasons as bits, several at once; each reason
//! is tested on its own bit with AND, so a sample with power cap and thermal slowdown together
//! counts for both. Idle, application-clock, sync-boost and display reasons never fire: they
//! are the driver doing its job.

use serde_json::json;

use super::{RuleInput, aligned, round2, secs, shown};
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::Metric;

pub const SW_POWER_CAP: u64 = 0x4;
pub const HW_SLOWDOWN: u64 = 0x8;
pub const SW_THERMAL: u64 = 0x20;
pub const HW_THERMAL: u64 = 0x40;
pub const HW_POWER_BRAKE: u64 = 0x80;

/// The share of its limit a GPU's mean sampled power must reach for the power-cap finding to
/// say it runs at its limit (below, the draw peaks at the limit between samples).
const POWER_CAP_NEAR_LIMIT: f64 = 0.9;

/// Watts as a finding's title shows them.
fn fmt_w(w: Option<f64>) -> String {
    w.map_or("n/a".into(), |w| format!("{w:.0}"))
}

/// The reasons that mean a failure when they hold under load: id, bit, title, advice.
const FAILURES: [(&str, u64, &str, &str); 4] = [
    (
        "throttle.hw_slowdown",
        HW_SLOWDOWN,
        "hardware slowdown under load",
        "The board asserted a slowdown (power delivery, temperature or an external signal). \
         Check the power cables and supply, the cooling, and `nvidia-smi -q -d PERFORMANCE`; if it \
         persists at normal temperature and power, have the board inspected (RMA).",
    ),
    (
        "throttle.sw_thermal",
        SW_THERMAL,
        "thermal slowdown by the driver under load",
        "The GPU is too hot and the driver lowered its clocks: check airflow, inlet temperature, \
         fans and dust; if one GPU runs hotter than its peers, reseat its heatsink or move it.",
    ),
    (
        "throttle.hw_thermal",
        HW_THERMAL,
        "hardware thermal slowdown under load",
        "The GPU hit its hardware thermal limit: cooling has failed or is blocked. Stop heavy \
         work and inspect the cooling now.",
    ),
    (
        "throttle.hw_power_brake",
        HW_POWER_BRAKE,
        "hardware power brake under load",
        "An external power-brake signal is active (power supply or chassis power capping): check \
         the power supplies and the chassis/BMC power policy.",
    ),
];

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let cfg = &input.config.throttle;
    let window = secs(cfg.window_s);
    let mut out = Vec::new();
    for d in input.devices {
        let rows = aligned(
            input.history,
            d.index,
            [
                Metric::ThrottleReasons,
                Metric::GpuUtilPct,
                Metric::SmClockMhz,
                Metric::PowerW,
                Metric::TempGpuC,
            ],
            window,
        );
        let judged: Vec<(u64, f64, [Option<f64>; 5])> = rows
            .iter()
            .filter_map(|(_, r)| Some((r[0]? as u64, r[1]?, *r)))
            .collect();
        if judged.len() < 3 {
            let reason = if rows.iter().all(|(_, r)| r[0].is_none()) {
                format!(
                    "no throttle reasons ({})",
                    input.why_absent(d.index, "throttle_reasons")
                )
            } else {
                format!(
                    "{} sample(s) with throttle reasons and utilisation; needs 3",
                    judged.len()
                )
            };
            input.not_judged("throttle", Some(d.index), reason);
            continue;
        }
        let n = judged.len() as f64;
        let span_s = rows
            .first()
            .zip(rows.last())
            .map_or(0.0, |(a, b)| (b.0 - a.0) as f64 / 1000.0);
        for (id, bit, what, advice) in FAILURES {
            let hit: Vec<_> = judged
                .iter()
                .filter(|(bits, util, _)| bits & bit != 0 && *util >= cfg.load_util_pct)
                .collect();
            let fraction = hit.len() as f64 / n;
            if hit.len() < 2 || fraction < cfg.min_fraction {
                continue;
            }
            let mean = |i: usize| {
                let v: Vec<f64> = hit.iter().filter_map(|h| h.2[i]).collect();
                (!v.is_empty()).then(|| round2(v.iter().sum::<f64>() / v.len() as f64))
            };
            out.push(Finding::new(id.into(), Severity::Fail, Some(d.index), input.now_ms, format!(
                    "GPU {}: {what} for {}% of {:.0} s",
                    d.index,
                    shown(fraction * 100.0, 0, f64::ge, cfg.min_fraction * 100.0),
                    span_s
                ), Evidence {
                    values: values([
                        ("fraction_under_load", json!(round2(fraction))),
                        ("samples", json!(judged.len())),
                        ("sm_clock_mean_mhz", json!(mean(2))),
                        ("sm_clock_max_mhz", json!(d.sm_clock_max_mhz)),
                        ("power_mean_w", json!(mean(3))),
                        ("temp_mean_c", json!(mean(4))),
                        ("temp_slowdown_c", json!(d.temp_slowdown_c)),
                    ]),
                    window_s: round2(span_s),
                    threshold: format!(
                        "reason bit 0x{bit:x} set with utilisation >= {}% for >= {:.0}% of the window",
                        cfg.load_util_pct,
                        cfg.min_fraction * 100.0
                    ),
                }, advice.into()));
        }
        let capped: Vec<_> = judged
            .iter()
            .filter(|(bits, _, _)| bits & SW_POWER_CAP != 0)
            .collect();
        let fraction = capped.len() as f64 / n;
        if fraction >= cfg.power_cap_min_fraction && !capped.is_empty() {
            let mean = |i: usize| {
                let v: Vec<f64> = capped.iter().filter_map(|h| h.2[i]).collect();
                (!v.is_empty()).then(|| round2(v.iter().sum::<f64>() / v.len() as f64))
            };
            let limit = input
                .latest
                .get(&d.index)
                .and_then(|s| s.power_limit_w)
                .or(d.power_limit_default_w);
            let power = mean(3);
            let share = power
                .zip(limit)
                .filter(|&(_, l)| l > 0.0)
                .map(|(p, l)| p / l);
            // The driver caps on its own short-term reading of the power; a mean of the samples
            // well below the limit means the draw peaks at it between them (bursty kernels),
            // which "runs at its power limit" would leave a reader doubting.
            let at = match share {
                Some(s) if s < POWER_CAP_NEAR_LIMIT => format!(
                    "has its clocks held back by the power cap ({} W mean of its {} W limit: \
                     the draw peaks at the limit between samples)",
                    fmt_w(power),
                    fmt_w(limit)
                ),
                _ => format!(
                    "runs at its power limit ({} W of {} W)",
                    fmt_w(power),
                    fmt_w(limit)
                ),
            };
            out.push(Finding::new(
                "throttle.sw_power_cap".into(),
                Severity::Info,
                Some(d.index),
                input.now_ms,
                format!(
                    "GPU {} {at} for {}% of {:.0} s",
                    d.index,
                    shown(
                        fraction * 100.0,
                        0,
                        f64::ge,
                        cfg.power_cap_min_fraction * 100.0
                    ),
                    span_s
                ),
                Evidence {
                    values: values([
                        ("fraction", json!(round2(fraction))),
                        ("power_mean_w", json!(mean(3))),
                        ("power_limit_w", json!(limit)),
                        ("power_share_of_limit", json!(share.map(round2))),
                        ("sm_clock_mean_mhz", json!(mean(2))),
                        ("sm_clock_max_mhz", json!(d.sm_clock_max_mhz)),
                        ("gpu_util_mean_pct", json!(mean(1))),
                    ]),
                    window_s: round2(span_s),
                    threshold: format!(
                        "SW power cap (0x4) for >= {:.0}% of the window",
                        cfg.power_cap_min_fraction * 100.0
                    ),
                },
                "Expected at full load: the GPU trades clock speed for staying within \
                         its power limit. Nothing to fix unless the limit is below the default \
                         (`nvidia-smi -q -d POWER`) or the GPU should be faster than its peers."
                    .into(),
            ));
        }
    }
    out
}
