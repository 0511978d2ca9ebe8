//! Utilisation: a process holds GPU memory while the GPU wastes its time, as the bottleneck
//! verdict (`verdict.rs`) judges it over the window the holders have been there: idle, waiting
//! on the host, launch- or sync-bound, copy-bound, or busy with its SMs mostly empty. The id
//! stays `utilisation.low` from before the verdict existed, so alerts on it keep working; it now
//! also fires for a GPU that reads 100% utilised while its SMs are nearly empty.

use serde_json::json;

use super::bottleneck;
use super::process_state::ProcessCpu;
use super::{RuleInput, secs};
use gpudiag_model::finding::{Evidence, Finding, Severity};
use gpudiag_model::verdict::{Basis, Bottleneck};

const MIB: f64 = 1024.0 * 1024.0;

/// The finding's id, kept from before the verdict existed.
pub(crate) const ID: &str = "utilisation.low";

/// Judges each device over the rule's own rolling window.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let window = secs(input.config.utilisation.window_s);
    let mut out = Vec::new();
    for d in input.devices {
        let Some(latest) = input.latest.get(&d.index) else {
            continue;
        };
        let now = latest.time_ms;
        let start = now.saturating_sub(window.as_millis() as u64);
        out.extend(over(input, input.process_cpu, d.index, start, now));
    }
    out
}

/// The finding for `device` over `[start, end]`, if the work on it wastes the GPU. Only the time
/// the holders have been there is judged: idle minutes before a job started are not its own.
pub fn over(
    input: &RuleInput<'_>,
    cpu: Option<&ProcessCpu>,
    device: u32,
    start: u64,
    end: u64,
) -> Option<Finding> {
    let cfg = &input.config.utilisation;
    let d = input.devices.iter().find(|d| d.index == device)?;
    let mut start = start;
    let holders: Vec<u32> = bottleneck::holders(input, cpu, device, start, end)
        .into_iter()
        .map(|p| p.pid)
        .collect();
    if holders.is_empty() {
        if input
            .latest
            .get(&device)
            .is_some_and(|s| s.processes.is_none())
        {
            input.not_judged(
                ID,
                Some(device),
                format!(
                    "no process list ({}): who holds the GPU is not known",
                    input.why_absent(device, "processes")
                ),
            );
        }
        return None;
    }
    if let Some(pm) = input.process_memory {
        let since = holders
            .iter()
            .filter_map(|&p| pm.first_seen(device, p))
            .min();
        start = start.max(since.unwrap_or(start));
    }
    // Why a verdict could not be given is the verdict's own entry. The headline, as the GPU's
    // verdict has it: the holders' window judged whole blends its phases (compute-bound, then
    // idle while holding memory, read as host-bound, which neither was).
    let v = bottleneck::headline(input, cpu, d, start, end).ok()?;
    if v.basis == Basis::Utilisation && v.bottleneck == Bottleneck::ComputeBound {
        input.not_judged(
            ID,
            Some(device),
            "no profiling counters (GPM): a GPU that reads busy cannot be told from one running \
             kernels that leave most SMs empty",
        );
    }
    // Throttling has its own findings, with the reason; the others are the job's own doing.
    if !v.bottleneck.is_waste() || v.bottleneck == Bottleneck::Throttled {
        return None;
    }
    let names: Vec<String> = v
        .processes
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
    let mut values = v.evidence.clone();
    // What the GPU could not measure says nothing here; the verdict keeps the full list.
    values.retain(|_, value| !value.is_null());
    values.insert("verdict".into(), json!(v.bottleneck));
    values.insert("confidence".into(), json!(v.confidence));
    values.insert(
        "pids".into(),
        json!(v.processes.iter().map(|p| p.pid).collect::<Vec<_>>()),
    );
    values.insert("processes".into(), json!(v.processes));
    Some(Finding::new(
        ID.into(),
        Severity::Warn,
        Some(device),
        input.now_ms,
        format!(
            "{} while {} holds memory",
            v.title.split(" · ").next().unwrap_or(&v.title),
            names.join(", ")
        ),
        Evidence {
            values,
            window_s: super::round2(v.window_s()),
            threshold: format!(
                "verdict one of underfilled, launch_bound, sync_bound, host_bound, copy_bound, \
                 idle_holding_memory (mean utilisation < {}% without profiling counters)",
                cfg.min_mean_util_pct
            ),
        },
        format!(
            "{} If the process is merely parked (a notebook, a server between requests), release \
             the GPU for others.",
            v.advice
        ),
    ))
}
