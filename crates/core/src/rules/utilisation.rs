//! Utilisation: a process holds GPU memory but the GPU mostly idles.
//!
//! The evidence carries the other signals (PCIe receive rate, memory-copy utilisation, power)
//! because they tell the usual causes apart: heavy host-to-device traffic points at copies, a
//! GPU near idle power at a starved input pipeline, middling utilisation at small kernels and
//! synchronisation.

use serde_json::json;

use super::{Evidence, Finding, RuleInput, Severity, round2, secs};
use crate::history::Window;
use gpudiag_telemetry::Metric;

const MIB: f64 = 1024.0 * 1024.0;

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let cfg = &input.config.utilisation;
    let window = secs(cfg.window_s);
    let mut out = Vec::new();
    for d in input.devices {
        let Some(latest) = input.latest.get(&d.index) else {
            continue;
        };
        let holders: Vec<_> = latest
            .processes
            .iter()
            .flatten()
            .filter(|p| {
                p.used_memory_bytes
                    .is_some_and(|b| b as f64 >= cfg.min_process_memory_mib * MIB)
            })
            .collect();
        if holders.is_empty() {
            continue;
        }
        // Judge only the time the holders have been there: idle minutes before a job started
        // are not the job's idleness.
        let now = input
            .latest
            .get(&d.index)
            .map_or(input.now_ms, |s| s.time_ms);
        let mut start = now.saturating_sub(window.as_millis() as u64);
        if let Some(pm) = input.process_memory {
            let since = holders
                .iter()
                .filter_map(|p| pm.first_seen(d.index, p.pid))
                .min();
            start = start.max(since.unwrap_or(start));
        }
        let util = input.history.stats(
            d.index,
            Metric::GpuUtilPct,
            Window::Range {
                start_ms: start,
                end_ms: now,
            },
        );
        let span_s = util.span_ms().unwrap_or(0) as f64 / 1000.0;
        let Some(mean) = util.mean else { continue };
        if util.count < 2 || span_s < cfg.min_span_s || mean >= cfg.min_mean_util_pct {
            continue;
        }
        let range = Window::Range {
            start_ms: start,
            end_ms: now,
        };
        let mean_of = |m| input.history.mean(d.index, m, range);
        let rx = mean_of(Metric::PcieRxBytesPerS);
        // A burst of copies inflates the mean; what matters is how much of the time they ran.
        let copying_share =
            input
                .history
                .fraction_where(d.index, Metric::PcieRxBytesPerS, range, |b| b >= 1e9);
        let mem_util = mean_of(Metric::MemUtilPct);
        let power = mean_of(Metric::PowerW);
        let limit = latest.power_limit_w.or(d.power_limit_default_w);
        let power_share = power.zip(limit).map(|(p, l)| p / l);
        let names: Vec<String> = holders
            .iter()
            .map(|p| {
                format!(
                    "{} (pid {}, {:.1} GiB)",
                    p.name.as_deref().unwrap_or("unknown"),
                    p.pid,
                    p.used_memory_bytes.unwrap_or_default() as f64 / (1024.0 * MIB)
                )
            })
            .collect();
        let processes: Vec<_> = holders
            .iter()
            .map(|p| {
                json!({
                    "pid": p.pid,
                    "name": p.name,
                    "used_memory_mib": p.used_memory_bytes.map(|b| round2(b as f64 / MIB)),
                    "sm_util_pct": p.sm_util_pct,
                })
            })
            .collect();
        let mut values = serde_json::Map::new();
        values.insert("gpu_util_mean_pct".into(), json!(round2(mean)));
        values.insert("gpu_util_p95_pct".into(), json!(util.p95.map(round2)));
        values.insert("mem_util_mean_pct".into(), json!(mem_util.map(round2)));
        values.insert(
            "pcie_rx_mean_mb_per_s".into(),
            json!(rx.map(|b| round2(b / 1e6))),
        );
        values.insert(
            "pcie_rx_over_1gb_share".into(),
            json!(copying_share.map(round2)),
        );
        values.insert("power_mean_w".into(), json!(power.map(round2)));
        values.insert("power_limit_w".into(), json!(limit));
        values.insert(
            "pids".into(),
            json!(holders.iter().map(|p| p.pid).collect::<Vec<_>>()),
        );
        values.insert("processes".into(), json!(processes));
        out.push(Finding {
            id: "utilisation.low".into(),
            severity: Severity::Warn,
            device: Some(d.index),
            time_ms: input.now_ms,
            title: format!(
                "GPU {} mostly idle (mean utilisation {:.0}% over {:.0} s) while {} holds memory",
                d.index,
                mean,
                span_s,
                names.join(", ")
            ),
            evidence: Evidence {
                values,
                window_s: round2(span_s),
                threshold: format!("mean utilisation < {}%", cfg.min_mean_util_pct),
            },
            advice: advice(mean, copying_share, power_share),
            recorded: false,
        });
    }
    out
}

/// Leads with the cause the signals point at, then lists the others. `copying_share` is the
/// share of the time the host sent at least 1 GB/s.
fn advice(mean_util: f64, copying_share: Option<f64>, power_share: Option<f64>) -> String {
    const COPIES: &str = "Host-device copies dominate: pin host memory (pin_memory=True), copy \
                          with non_blocking=True on a side stream so copies overlap compute, and \
                          keep data resident on the GPU instead of copying it every step.";
    const HOST: &str = "The GPU waits on the host: the input pipeline or CPU-side code is the \
                        bottleneck. Profile the CPU side; add DataLoader workers and \
                        prefetching; move preprocessing onto the GPU.";
    const SMALL: &str = "Kernels are too small or separated by syncs: raise the batch size, \
                         remove per-step .item()/.cpu()/synchronize calls, fuse small operations \
                         (torch.compile) or capture steps in CUDA graphs.";
    let copies = copying_share.is_some_and(|share| share >= 0.3);
    let starved = mean_util < 10.0 && power_share.is_none_or(|p| p < 0.3);
    let lead = if copies {
        COPIES
    } else if starved {
        HOST
    } else {
        SMALL
    };
    let others: Vec<&str> = [COPIES, HOST, SMALL]
        .into_iter()
        .filter(|a| *a != lead)
        .collect();
    format!(
        "{lead} Other usual causes: {} {} If the process is merely parked (a notebook, a \
         server between requests), release the GPU for others.",
        others[0], others[1]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_leads_with_what_the_signals_show() {
        assert!(advice(20.0, Some(0.8), Some(0.5)).starts_with("Host-device copies"));
        assert!(advice(2.0, Some(0.1), Some(0.15)).starts_with("The GPU waits on the host"));
        assert!(advice(30.0, None, Some(0.6)).starts_with("Kernels are too small"));
    }
}
