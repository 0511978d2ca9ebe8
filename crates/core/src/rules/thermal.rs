//! Thermal: a GPU (or its memory) running within a few degrees of the temperature at which it
//! slows itself down.

use serde_json::json;

use super::{RuleInput, mean_over, round2, secs, shown};
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::Metric;

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let cfg = &input.config.thermal;
    let window = secs(cfg.window_s);
    let mut out = Vec::new();
    for d in input.devices {
        let latest = input.latest.get(&d.index);
        let checks = [
            (
                "thermal.near_slowdown",
                "GPU",
                Metric::TempGpuC,
                latest.and_then(|s| s.temp_slowdown_c).or(d.temp_slowdown_c),
                ("temp_gpu_c", "its slowdown temperature"),
            ),
            (
                "thermal.memory_near_limit",
                "memory",
                Metric::TempMemC,
                d.temp_mem_max_c,
                ("temp_mem_c", "its memory's maximum temperature"),
            ),
        ];
        for (id, what, metric, limit, (field, limit_name)) in checks {
            let Some(limit) = limit else {
                input.not_judged(
                    id,
                    Some(d.index),
                    format!("the GPU does not report {limit_name}"),
                );
                continue;
            };
            let Some(mean) = input.history.mean(d.index, metric, window) else {
                input.not_judged(
                    id,
                    Some(d.index),
                    format!(
                        "no {what} temperature reading ({})",
                        input.why_absent(d.index, field)
                    ),
                );
                continue;
            };
            let near = limit - cfg.slowdown_margin_c;
            if mean < near {
                continue;
            }
            // The distance is taken from the printed mean so the two numbers add up to the limit.
            let mean_text = shown(mean, 0, f64::ge, near);
            let decimals = mean_text.split_once('.').map_or(0, |(_, f)| f.len());
            let distance = (limit - mean_text.parse().unwrap_or(mean)).max(0.0);
            out.push(Finding::new(
                id.into(),
                Severity::Warn,
                Some(d.index),
                input.now_ms,
                format!(
                    "GPU {} {what} temperature {mean_text} °C ({}), within \
                     {distance:.decimals$} °C of its {limit:.0} °C limit",
                    d.index,
                    mean_over(input.history, d.index, metric, window)
                ),
                Evidence {
                    values: values([
                        ("temp_mean_c", json!(round2(mean))),
                        ("limit_c", json!(limit)),
                    ]),
                    window_s: cfg.window_s,
                    threshold: format!(">= limit - {} °C", cfg.slowdown_margin_c),
                },
                "The GPU is about to lower its clocks to cool down. Improve airflow \
                         (inlet temperature, fan curves, blocked or dusty intakes); if one GPU \
                         runs hotter than its peers, check its heatsink mounting and placement."
                    .into(),
            ));
        }
    }
    out
}
