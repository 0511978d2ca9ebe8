//! Power: a GPU whose enforced power limit is below its default. At full load it then runs at
//! lower clocks than its peers for reasons no utilisation figure shows: someone ran
//! `nvidia-smi -pl`, a DCGM power policy, or a datacentre power-capping agent set it.

use serde_json::json;

use super::{RuleInput, round2, shown};
use gpudiag_model::finding::{Evidence, Finding, Severity, values};

pub const BELOW_DEFAULT: &str = "power.limit_below_default";

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let min_share = input.config.power.min_share_of_default;
    let mut out = Vec::new();
    for d in input.devices {
        let Some(default) = d.power_limit_default_w.filter(|w| *w > 0.0) else {
            input.not_judged(
                BELOW_DEFAULT,
                Some(d.index),
                "the GPU does not report its default power limit",
            );
            continue;
        };
        let Some(limit) = input.latest.get(&d.index).and_then(|s| s.power_limit_w) else {
            input.not_judged(
                BELOW_DEFAULT,
                Some(d.index),
                format!(
                    "no enforced power limit reading ({})",
                    input.why_absent(d.index, "power_limit_w")
                ),
            );
            continue;
        };
        let share = limit / default;
        if share >= min_share {
            continue;
        }
        out.push(Finding::new(
            BELOW_DEFAULT.into(),
            Severity::Warn,
            Some(d.index),
            input.now_ms,
            format!(
                "GPU {} power limit {limit:.0} W is {}% of its default {default:.0} W: under \
                 load it runs at lower clocks than it can",
                d.index,
                shown(share * 100.0, 0, f64::lt, min_share * 100.0)
            ),
            Evidence {
                values: values([
                    ("power_limit_w", json!(round2(limit))),
                    ("power_limit_default_w", json!(round2(default))),
                    ("share_of_default", json!(round2(share))),
                    ("power_limit_min_w", json!(d.power_limit_min_w)),
                    ("power_limit_max_w", json!(d.power_limit_max_w)),
                ]),
                window_s: 0.0,
                threshold: format!("enforced limit < {:.0}% of the default", min_share * 100.0),
            },
            "The limit was lowered: by `nvidia-smi -pl`, a DCGM power policy, or a \
                     power-capping agent. `nvidia-smi -q -d POWER` shows the default and enforced \
                     limits; an administrator restores the default with `nvidia-smi -pl` (it also \
                     resets at reboot unless a service sets it again). If the cap is deliberate \
                     (a power budget), expect less throughput than uncapped peers."
                .into(),
        ));
    }
    out
}
