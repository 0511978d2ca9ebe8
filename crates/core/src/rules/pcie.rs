//! PCIe: a link trained below its maximum while the GPU works, and replay counters rising faster
//! than a healthy link's bit error rate allows.
//!
//! Links downshift when idle to save power; that is normal, so the link is judged only on
//! samples where the GPU is in P0 and busy (busy alone where there are no P-states, as on AMD),
//! or moving data. Probe bandwidth against the link's
//! expected rate joins this family once probes exist.

use serde_json::json;

use super::{RuleInput, aligned, round2, secs, shown, shown_pair};
use gpudiag_model::decode::pcie_link_rate;
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::Metric;

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in input.devices {
        out.extend(downtrained(input, d));
        out.extend(replays(input, d));
    }
    out
}

fn downtrained(input: &RuleInput<'_>, d: &gpudiag_model::sample::DeviceInfo) -> Option<Finding> {
    const ID: &str = "pcie.link_downtrained";
    let cfg = &input.config.pcie;
    let (Some(gen_max), Some(width_max)) = (d.pcie_gen_max, d.pcie_width_max) else {
        input.not_judged(
            ID,
            Some(d.index),
            "the GPU does not report its maximum PCIe link",
        );
        return None;
    };
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
    let span_s = rows
        .first()
        .zip(rows.last())
        .map_or(0.0, |(a, b)| b.0.saturating_sub(a.0) as f64 / 1000.0);
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
    if active.len() < 3 {
        let reason = if rows.iter().all(|(_, r)| r[0].is_none() || r[1].is_none()) {
            format!(
                "no PCIe link generation and width ({})",
                input.why_absent(d.index, "pcie_gen")
            )
        } else {
            // Idle links downshift to save power, so only a working GPU's link says anything.
            format!(
                "the GPU worked or moved data in {} of {} sample(s); an idle link downshifts, so \
                 the link is judged under load, in at least 3",
                active.len(),
                rows.len()
            )
        };
        input.not_judged(ID, Some(d.index), reason);
        return None;
    }
    if fraction < cfg.min_fraction {
        return None;
    }
    // `min_fraction = 0` lets an all-good window through the test above.
    let &&(link_gen, width) = low.last()?;
    let now = pcie_link_rate(link_gen, width).map(|r| round2(r.bytes_per_s / 1e9));
    let full = pcie_link_rate(gen_max, width_max).map(|r| round2(r.bytes_per_s / 1e9));
    Some(Finding::new(
        ID.into(),
        Severity::Warn,
        Some(d.index),
        input.now_ms,
        format!(
            "GPU {} PCIe link runs at Gen{link_gen} x{width} while busy ({}% of {} busy samples \
             over {:.0} s); it can do Gen{gen_max} x{width_max}",
            d.index,
            shown(fraction * 100.0, 0, f64::ge, cfg.min_fraction * 100.0),
            active.len(),
            span_s
        ),
        Evidence {
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
        format!(
            "The link trained below what the GPU and slot support, so host transfers top out near \
             {} GB/s instead of {} GB/s. Reseat the card, check the riser or cable and that the \
             slot is x{width_max} electrically, look for forced-lower PCIe settings in the BIOS, \
             and check the kernel log for AER errors.",
            now.map_or("n/a".into(), |v| v.to_string()),
            full.map_or("n/a".into(), |v| v.to_string()),
        ),
    ))
}

/// Replays allowed per minute: a link at bit error rate `ber` sees `ber × lane rate × lanes`
/// bit errors per second, each forcing a replay (about 31/min at Gen5 x16 and 1e-12).
pub fn replay_budget_per_min(ber: f64, link_gen: u32, width: u32) -> Option<f64> {
    let rate = pcie_link_rate(link_gen, width)?;
    Some(ber * rate.gt_per_s_per_lane * 1e9 * f64::from(width) * 60.0)
}

fn replays(input: &RuleInput<'_>, d: &gpudiag_model::sample::DeviceInfo) -> Option<Finding> {
    const ID: &str = "pcie.replay_rate";
    let cfg = &input.config.pcie;
    let not_judged = |reason: String| {
        input.not_judged(ID, Some(d.index), reason);
        None
    };
    let window = secs(cfg.window_s.max(cfg.replay_min_span_s));
    let series: Vec<(u64, f64)> = input
        .history
        .series_in(d.index, Metric::PcieReplayCount, window)
        .collect();
    let (Some(&(t0, first)), Some(&(t1, last))) = (series.first(), series.last()) else {
        return not_judged(format!(
            "no PCIe replay counter ({})",
            input.why_absent(d.index, "pcie_replay_count")
        ));
    };
    let span_min = (t1.saturating_sub(t0)) as f64 / 60_000.0;
    if span_min * 60.0 < cfg.replay_min_span_s {
        return not_judged(format!(
            "{:.0} s of replay-counter history; a rate needs {} s",
            span_min * 60.0,
            cfg.replay_min_span_s
        ));
    }
    // A counter that went backwards was reset (driver reload): nothing to judge across it.
    if last < first {
        return not_judged("the replay counter was reset in the window (driver reload)".into());
    }
    let latest = input.latest.get(&d.index)?;
    let (Some(link_gen), Some(width)) = (latest.pcie_gen, latest.pcie_width) else {
        return not_judged(
            "no current PCIe link generation and width to derive the allowed rate from".into(),
        );
    };
    let budget = replay_budget_per_min(cfg.replay_ber, link_gen, width)?;
    let rate = (last - first) / span_min;
    if rate <= budget {
        return None;
    }
    let (rate_text, budget_text) = shown_pair(rate, budget, 0, f64::gt);
    Some(Finding::new(
        ID.into(),
        Severity::Warn,
        Some(d.index),
        input.now_ms,
        format!(
            "GPU {} PCIe replays rising at {rate_text}/min over {:.0} s, above the \
             {budget_text}/min a healthy Gen{link_gen} x{width} link allows",
            d.index,
            span_min * 60.0
        ),
        Evidence {
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
        "The link corrects many transmission errors: signal integrity is poor. Reseat \
                 the card and any riser or cable, check for damaged pins, try another slot, and \
                 check the kernel log for AER corrected errors; replays cost bandwidth and can \
                 precede a link failure (XID 79)."
            .into(),
    ))
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

/// Probe bandwidth against the link: pinned host copies below `warn_share` (fail below
/// `fail_share`) of what the GPU's maximum link carries after line encoding, and pageable copies
/// far below pinned ones (a hint: pinned buffers would be faster).
pub fn probe_bandwidth(
    d: &gpudiag_model::sample::DeviceInfo,
    latest: Option<&gpudiag_model::sample::Sample>,
    measurements: &[gpudiag_probes::Measurement],
    now_ms: gpudiag_model::sample::TimeMs,
) -> Vec<Finding> {
    const WARN_SHARE: f64 = 0.85;
    const FAIL_SHARE: f64 = 0.5;
    const PAGEABLE_HINT_SHARE: f64 = 0.5;
    let get = |name: &str| {
        measurements
            .iter()
            .find(|m| m.name == name && m.unit == "GB/s")
            .map(|m| m.value)
    };
    let mut out = Vec::new();
    let (Some(gen_max), Some(width_max)) = (d.pcie_gen_max, d.pcie_width_max) else {
        return out;
    };
    let Some(link) = pcie_link_rate(gen_max, width_max) else {
        return out;
    };
    let link_gbps = link.bytes_per_s / 1e9;
    let current = latest.and_then(|s| Some((s.pcie_gen?, s.pcie_width?)));
    for (name, what) in [
        ("h2d_pinned", "host-to-device"),
        ("d2h_pinned", "device-to-host"),
    ] {
        let Some(gbps) = get(name) else { continue };
        let share = gbps / link_gbps;
        if share >= WARN_SHARE {
            continue;
        }
        let (severity, below) = if share < FAIL_SHARE {
            (Severity::Fail, FAIL_SHARE)
        } else {
            (Severity::Warn, WARN_SHARE)
        };
        out.push(Finding::new(
            format!("pcie.probe_{name}"),
            severity,
            Some(d.index),
            now_ms,
            format!(
                "GPU {} pinned {what} copies reach {gbps:.1} GB/s, {}% of what its \
                 Gen{gen_max} x{width_max} link carries ({link_gbps:.1} GB/s)",
                d.index,
                shown(share * 100.0, 0, f64::lt, below * 100.0)
            ),
            Evidence {
                values: values([
                    ("measured_gb_per_s", json!(round2(gbps))),
                    ("link_gb_per_s", json!(round2(link_gbps))),
                    ("share", json!(round2(share))),
                    ("pcie_gen_now", json!(current.map(|c| c.0))),
                    ("pcie_width_now", json!(current.map(|c| c.1))),
                ]),
                window_s: 0.0,
                threshold: format!(
                    "warn below {:.0}%, fail below {:.0}% of the link",
                    WARN_SHARE * 100.0,
                    FAIL_SHARE * 100.0
                ),
            },
            "Host transfers are slower than the slot allows: check the link's current \
                     generation and width (a downtrained or shared link), the CPU socket the GPU \
                     hangs off (NUMA: run on the GPU's local socket), and IOMMU or PCIe switch \
                     settings; copies from other processes share the link too."
                .into(),
        ));
    }
    if let (Some(pinned), Some(pageable)) = (get("h2d_pinned"), get("h2d_pageable"))
        && pageable < PAGEABLE_HINT_SHARE * pinned
    {
        out.push(Finding::new(
            "pcie.pageable_copies_slow".into(),
            Severity::Info,
            Some(d.index),
            now_ms,
            format!(
                "GPU {} copies from pageable memory run at {pageable:.1} GB/s, {}% of pinned \
                 ({pinned:.1} GB/s)",
                d.index,
                shown(
                    pageable / pinned * 100.0,
                    0,
                    f64::lt,
                    PAGEABLE_HINT_SHARE * 100.0
                )
            ),
            Evidence {
                values: values([
                    ("h2d_pageable_gb_per_s", json!(round2(pageable))),
                    ("h2d_pinned_gb_per_s", json!(round2(pinned))),
                ]),
                window_s: 0.0,
                threshold: format!("pageable < {:.0}% of pinned", PAGEABLE_HINT_SHARE * 100.0),
            },
            "Expected: the driver stages pageable memory through a pinned buffer. \
                     Applications that copy a lot should use pinned host memory \
                     (pin_memory=True, cudaHostAlloc)."
                .into(),
        ));
    }
    out
}

#[cfg(test)]
mod probe_tests {
    use super::*;
    use gpudiag_model::sample::DeviceInfo;
    use gpudiag_probes::Measurement;

    fn h200() -> DeviceInfo {
        DeviceInfo {
            index: 0,
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            ..DeviceInfo::default()
        }
    }

    fn gbps(name: &str, v: f64) -> Measurement {
        Measurement::new(name, v, "GB/s", "cuMemcpy", vec![v])
    }

    #[test]
    fn the_h200_figures_pass_and_a_slow_link_warns_or_fails() {
        // Measured on the H200 host: 55.5 / 55.3 GB/s pinned over Gen5 x16 (63.0 GB/s).
        let ok = probe_bandwidth(
            &h200(),
            None,
            &[gbps("h2d_pinned", 55.5), gbps("d2h_pinned", 55.3)],
            0,
        );
        assert!(ok.is_empty(), "{ok:?}");
        let slow = probe_bandwidth(
            &h200(),
            None,
            &[gbps("h2d_pinned", 40.0), gbps("d2h_pinned", 20.0)],
            0,
        );
        let ids: Vec<_> = slow.iter().map(|f| (f.id.as_str(), f.severity)).collect();
        assert_eq!(
            ids,
            [
                ("pcie.probe_h2d_pinned", Severity::Warn),
                ("pcie.probe_d2h_pinned", Severity::Fail)
            ]
        );
    }

    #[test]
    fn a_share_just_below_the_floor_does_not_print_as_the_floor() {
        let link = pcie_link_rate(5, 16).unwrap().bytes_per_s / 1e9;
        let f = probe_bandwidth(&h200(), None, &[gbps("h2d_pinned", 0.8497 * link)], 0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].title.contains(", 84.97% of what"), "{}", f[0].title);
    }

    #[test]
    fn pageable_far_below_pinned_is_a_hint() {
        let f = probe_bandwidth(
            &h200(),
            None,
            &[gbps("h2d_pinned", 55.5), gbps("h2d_pageable", 7.8)],
            0,
        );
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "pcie.pageable_copies_slow");
        assert_eq!(f[0].severity, Severity::Info);
        let close = probe_bandwidth(
            &h200(),
            None,
            &[gbps("h2d_pinned", 55.5), gbps("h2d_pageable", 40.0)],
            0,
        );
        assert!(close.is_empty());
    }
}
