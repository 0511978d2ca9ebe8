//! PCIe: a link trained below its maximum while the GPU works, and replay counters rising faster
//! than a healthy link's bit error rate allows.
//!
//! Links downshift when idle to save power; that is normal, so the link is judged only on
//! samples where the GPU is in P0 and busy (busy alone where there are no P-states, as on AMD),
//! or moving data. Probe bandwidth against the link's
//! expected rate joins this family once probes exist.

use serde_json::json;

use super::{Evidence, Finding, RuleInput, Severity, aligned, round2, secs, values};
use crate::telemetry::Metric;
use crate::telemetry::nvml::pcie_link_rate;

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in input.devices {
        out.extend(downtrained(input, d));
        out.extend(replays(input, d));
    }
    out
}

fn downtrained(input: &RuleInput<'_>, d: &crate::telemetry::DeviceInfo) -> Option<Finding> {
    let cfg = &input.config.pcie;
    let (gen_max, width_max) = (d.pcie_gen_max?, d.pcie_width_max?);
    let rows = aligned(
        input.history,
        d.index,
        [
            Metric::PcieGen,
            Metric::PcieWidth,
            Metric::Pstate,
            Metric::GpuUtilPct,
            Metric::PcieRxBytesPerS,
            Metric::PcieTxBytesPerS,
        ],
        secs(cfg.window_s),
    );
    let moving = cfg.moving_mb_per_s * 1e6;
    let active: Vec<(u32, u32)> = rows
        .iter()
        .filter_map(|(_, r)| {
            let (link_gen, width) = (r[0]? as u32, r[1]? as u32);
            // Without P-states (AMD), a working GPU is one with any utilisation.
            let busy_p0 = r[2].is_none_or(|p| p == 0.0) && r[3].is_some_and(|u| u >= 1.0);
            let traffic = r[4].unwrap_or(0.0) + r[5].unwrap_or(0.0);
            (busy_p0 || traffic >= moving).then_some((link_gen, width))
        })
        .collect();
    let low: Vec<&(u32, u32)> = active
        .iter()
        .filter(|(g, w)| *g < gen_max || *w < width_max)
        .collect();
    let fraction = low.len() as f64 / active.len().max(1) as f64;
    if active.len() < 3 || fraction < cfg.min_fraction {
        return None;
    }
    let (link_gen, width) = *low[low.len() - 1];
    let now = pcie_link_rate(link_gen, width).map(|r| round2(r.bytes_per_s / 1e9));
    let full = pcie_link_rate(gen_max, width_max).map(|r| round2(r.bytes_per_s / 1e9));
    Some(Finding {
        id: "pcie.link_downtrained".into(),
        severity: Severity::Warn,
        device: Some(d.index),
        time_ms: input.now_ms,
        title: format!(
            "GPU {} PCIe link runs at Gen{link_gen} x{width} while busy; it can do Gen{gen_max} x{width_max}",
            d.index
        ),
        evidence: Evidence {
            values: values([
                ("pcie_gen", json!(link_gen)),
                ("pcie_width", json!(width)),
                ("pcie_gen_max", json!(gen_max)),
                ("pcie_width_max", json!(width_max)),
                ("fraction_of_active_samples", json!(round2(fraction))),
                ("active_samples", json!(active.len())),
                ("link_gb_per_s", json!(now)),
                ("link_max_gb_per_s", json!(full)),
            ]),
            window_s: cfg.window_s,
            threshold: format!(
                "below max gen or width in >= {:.0}% of samples in P0 with work or moving >= {} MB/s",
                cfg.min_fraction * 100.0,
                cfg.moving_mb_per_s
            ),
        },
        advice: format!(
            "The link trained below what the GPU and slot support, so host transfers top out near \
             {} GB/s instead of {} GB/s. Reseat the card, check the riser or cable and that the \
             slot is x{width_max} electrically, look for forced-lower PCIe settings in the BIOS, \
             and check the kernel log for AER errors.",
            now.map_or("n/a".into(), |v| v.to_string()),
            full.map_or("n/a".into(), |v| v.to_string()),
        ),
    })
}

/// Replays allowed per minute: a link at bit error rate `ber` sees `ber × lane rate × lanes`
/// bit errors per second, each forcing a replay (about 31/min at Gen5 x16 and 1e-12).
pub fn replay_budget_per_min(ber: f64, link_gen: u32, width: u32) -> Option<f64> {
    let rate = pcie_link_rate(link_gen, width)?;
    Some(ber * rate.gt_per_s_per_lane * 1e9 * f64::from(width) * 60.0)
}

fn replays(input: &RuleInput<'_>, d: &crate::telemetry::DeviceInfo) -> Option<Finding> {
    let cfg = &input.config.pcie;
    let window = secs(cfg.window_s.max(cfg.replay_min_span_s));
    let series: Vec<(u64, f64)> = input
        .history
        .series_in(d.index, Metric::PcieReplayCount, window)
        .collect();
    let (&(t0, first), &(t1, last)) = (series.first()?, series.last()?);
    let span_min = (t1.saturating_sub(t0)) as f64 / 60_000.0;
    // A counter that went backwards was reset (driver reload): nothing to judge across it.
    if span_min * 60.0 < cfg.replay_min_span_s || last < first {
        return None;
    }
    let latest = input.latest.get(&d.index)?;
    let (link_gen, width) = (latest.pcie_gen?, latest.pcie_width?);
    let budget = replay_budget_per_min(cfg.replay_ber, link_gen, width)?;
    let rate = (last - first) / span_min;
    if rate <= budget {
        return None;
    }
    Some(Finding {
        id: "pcie.replay_rate".into(),
        severity: Severity::Warn,
        device: Some(d.index),
        time_ms: input.now_ms,
        title: format!(
            "GPU {} PCIe replays rising at {rate:.0}/min, above the {budget:.0}/min a healthy Gen{link_gen} x{width} link allows",
            d.index
        ),
        evidence: Evidence {
            values: values([
                ("replays_per_min", json!(round2(rate))),
                ("budget_per_min", json!(round2(budget))),
                ("replay_count_first", json!(first)),
                ("replay_count_last", json!(last)),
                ("pcie_gen", json!(link_gen)),
                ("pcie_width", json!(width)),
            ]),
            window_s: round2(span_min * 60.0),
            threshold: format!("> BER {} x lane rate x lanes per minute", cfg.replay_ber),
        },
        advice: "The link corrects many transmission errors: signal integrity is poor. Reseat \
                 the card and any riser or cable, check for damaged pins, try another slot, and \
                 check the kernel log for AER corrected errors; replays cost bandwidth and can \
                 precede a link failure (XID 79)."
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_budget_matches_the_design_figure() {
        let gen5 = replay_budget_per_min(1e-12, 5, 16).unwrap();
        assert!((gen5 - 30.72).abs() < 0.01, "{gen5}");
        let gen4_x8 = replay_budget_per_min(1e-12, 4, 8).unwrap();
        assert!((gen4_x8 - 7.68).abs() < 0.01, "{gen4_x8}");
        assert_eq!(replay_budget_per_min(1e-12, 0, 16), None);
    }
}
