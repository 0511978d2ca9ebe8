//! A job GPU's figures over the window, and what differs on one GPU from its peers.

use std::collections::BTreeSet;

use crate::history::Window;
use crate::rules::{RuleInput, round2};
use gpudiag_model::job::{JobMember, PeerFigures};
use gpudiag_model::sample::{Metric, TimeMs};

pub(super) const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
pub(super) const GB: f64 = 1e9;

/// Throttle bits that slow a GPU against its will (as the GPU verdict counts them).
const HARMFUL_THROTTLE: u64 = 0x8 | 0x20 | 0x40 | 0x80;
/// The software power cap: the GPU holds its clocks down to stay within its power limit.
const POWER_CAP: u64 = 0x4;

/// The median of what is there.
pub(super) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// A GPU's window figures, and what the comparison needs beside them.
pub(super) struct Gpu {
    pub(super) figures: PeerFigures,
    harmful_throttle_share: Option<f64>,
    /// The share of the window it held its clocks down at its power limit, and its mean
    /// enforced limit.
    power_cap_share: Option<f64>,
    power_limit_w: Option<f64>,
    pcie_link: Option<(f64, f64)>,
    /// Other processes on the GPU: pid, name, most memory held.
    others: Vec<(u32, Option<String>, f64)>,
}

pub(super) fn figures_of(
    input: &RuleInput<'_>,
    member: &JobMember,
    all_members: &BTreeSet<u32>,
    start: TimeMs,
    end: TimeMs,
) -> Gpu {
    let device = member.device;
    let window = Window::Range {
        start_ms: start,
        end_ms: end,
    };
    let mean = |m: Metric| input.history.mean(device, m, window);
    let sum = |a: Metric, b: Metric| match (mean(a), mean(b)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    };
    let pcie = if mean(Metric::ProfPcieRxBytesPerS).is_some() {
        sum(Metric::ProfPcieRxBytesPerS, Metric::ProfPcieTxBytesPerS)
    } else {
        sum(Metric::PcieRxBytesPerS, Metric::PcieTxBytesPerS)
    };
    let holders = input
        .process_memory
        .map(|m| m.holders_in(device, start, end, 0.0))
        .unwrap_or_default();
    let job_memory = holders
        .iter()
        .find(|(pid, _, _)| *pid == member.pid)
        .map(|&(_, _, b)| b as u64);
    let others: Vec<(u32, Option<String>, f64)> = holders
        .into_iter()
        .filter(|(pid, _, _)| *pid != member.pid && !all_members.contains(pid))
        .collect();
    let harmful_throttle_share =
        input
            .history
            .fraction_where(device, Metric::ThrottleReasons, window, |bits| {
                (bits as u64) & HARMFUL_THROTTLE != 0
            });
    let power_cap_share =
        input
            .history
            .fraction_where(device, Metric::ThrottleReasons, window, |bits| {
                (bits as u64) & POWER_CAP != 0
            });
    let latest = input.latest.get(&device);
    let pcie_link = latest
        .and_then(|s| s.pcie_gen.zip(s.pcie_width))
        .map(|(g, w)| (g as f64, w as f64));
    Gpu {
        figures: PeerFigures {
            device,
            rank: member.rank,
            gpu_util_pct: mean(Metric::GpuUtilPct),
            sm_active_pct: mean(Metric::SmActivePct),
            tensor_active_pct: mean(Metric::TensorActivePct),
            power_w: mean(Metric::PowerW),
            sm_clock_mhz: mean(Metric::SmClockMhz),
            nvlink_bytes_per_s: sum(Metric::NvlinkRxBytesPerS, Metric::NvlinkTxBytesPerS),
            pcie_bytes_per_s: pcie,
            job_memory_bytes: job_memory,
            process_cpu_pct: input
                .process_cpu
                .and_then(|c| c.cpu_pct(device, member.pid, start, end))
                .map(round2),
            other_processes: others.len() as u32,
        },
        harmful_throttle_share,
        power_cap_share,
        power_limit_w: mean(Metric::PowerLimitW),
        pcie_link,
        others,
    }
}

pub(super) fn pct(v: f64) -> String {
    format!("{v:.0}%")
}

pub(super) fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / GIB)
}

pub(super) fn gbps(bytes_per_s: f64) -> String {
    format!("{:.0} GB/s", bytes_per_s / GB)
}

/// "GPU 2 (rank 2)".
pub(crate) fn gpu_name(device: u32, rank: Option<u32>) -> String {
    match rank {
        Some(r) => format!("GPU {device} (rank {r})"),
        None => format!("GPU {device}"),
    }
}

/// The work figure compared: SM active where every GPU has it, else power.
/// Reads one figure of a GPU.
pub(super) type FigureOf = fn(&PeerFigures) -> Option<f64>;

pub(super) fn work_metric(gpus: &[Gpu]) -> Option<(&'static str, FigureOf)> {
    let all = |f: FigureOf| gpus.iter().all(|g| f(&g.figures).is_some());
    if all(|f| f.sm_active_pct) {
        Some(("sm_active_pct", |f| f.sm_active_pct))
    } else if all(|f| f.power_w) {
        Some(("power_w", |f| f.power_w))
    } else {
        None
    }
}

/// What differs on a straggler from its peers: in words, and what the advice rests on.
pub(super) struct Differences {
    pub(super) lines: Vec<String>,
    /// Another process shares its GPU.
    pub(super) shared: bool,
    /// Its clocks run lower than its peers' for a reason of its own (heat, power supply, a
    /// weaker part), not because its extra work meets the power limit.
    pub(super) slower_part: bool,
}

/// Whether a GPU spent most of the window at its power limit: held down by the software power
/// cap, or drawing within 5% of its enforced limit.
fn at_power_cap(g: &Gpu) -> bool {
    let capped = g.power_cap_share.is_some_and(|s| s >= 0.5);
    let near_limit = matches!(
        (g.figures.power_w, g.power_limit_w),
        (Some(p), Some(l)) if l > 0.0 && p >= 0.95 * l
    );
    capped || near_limit
}

/// What differs on the straggler from its peers.
pub(super) fn differences(s: &Gpu, peers: &[&Gpu]) -> Differences {
    let mut out = Vec::new();
    for (pid, name, bytes) in &s.others {
        out.push(format!(
            "another process (pid {pid}{}) also holds {} on it",
            name.as_deref()
                .map(|n| format!(", {n}"))
                .unwrap_or_default(),
            gib(*bytes)
        ));
    }
    let shared = !s.others.is_empty();
    let peer_median =
        |f: fn(&PeerFigures) -> Option<f64>| median(peers.iter().filter_map(|g| f(&g.figures)));
    // A GPU doing more work draws more power and, at its power limit, clocks lower: that is a
    // consequence (measured: a rank with twice the work ran at 1465 MHz against its peers'
    // 1775 MHz, at 691 W against 486 W; at 1.2× the work, 1396 against 1645 MHz with every GPU
    // near the cap). Lower clocks point at the GPU only below its power limit at no more power.
    let more_power = match (s.figures.power_w, peer_median(|f| f.power_w)) {
        (Some(own), Some(peer)) => own > peer * 1.05,
        _ => false,
    };
    let mut slower_part = false;
    if let (Some(clock), Some(peer)) = (s.figures.sm_clock_mhz, peer_median(|f| f.sm_clock_mhz))
        && clock < peer * 0.95
    {
        if at_power_cap(s) {
            out.push(format!(
                "at its power limit it runs slower ({clock:.0} MHz against its peers' \
                 {peer:.0} MHz) because it does more work"
            ));
        } else if !more_power {
            slower_part = true;
            out.push(format!(
                "its SM clock averages {clock:.0} MHz against its peers' {peer:.0} MHz"
            ));
        }
    }
    if let Some(share) = s.harmful_throttle_share.filter(|&t| t >= 0.05) {
        out.push(format!(
            "heat or the power supply held its clocks down {} of the window",
            pct(share * 100.0)
        ));
    }
    if let (Some(cpu), Some(peer)) = (
        s.figures.process_cpu_pct,
        peer_median(|f| f.process_cpu_pct),
    ) && (cpu - peer).abs() >= 30.0
    {
        out.push(format!(
            "its process uses {} of a CPU core against its peers' {}",
            pct(cpu),
            pct(peer)
        ));
    }
    if let Some((generation, width)) = s.pcie_link {
        let best = peers
            .iter()
            .filter_map(|g| g.pcie_link)
            .fold(None::<(f64, f64)>, |acc, l| {
                Some(acc.map_or(l, |a| (a.0.max(l.0), a.1.max(l.1))))
            });
        if let Some((pg, pw)) = best
            && (generation < pg || width < pw)
        {
            out.push(format!(
                "its PCIe link runs at Gen{generation:.0} x{width:.0} where its peers' reach Gen{pg:.0} x{pw:.0}"
            ));
        }
    }
    if let (Some(link), Some(peer)) = (
        s.figures.nvlink_bytes_per_s,
        peer_median(|f| f.nvlink_bytes_per_s),
    ) && peer > 1e9
        && link < peer * 0.5
    {
        out.push(format!(
            "it moves {} over NVLink against its peers' {}",
            gbps(link),
            gbps(peer)
        ));
    }
    Differences {
        lines: out,
        shared,
        slower_part,
    }
}

/// The part of `[start, end]` from the first sample where any of the job's GPUs ran a kernel
/// (utilisation above `idle_util_pct`) to the last; `None` where none did.
pub(super) fn working_span(
    input: &RuleInput<'_>,
    members: &[JobMember],
    start: TimeMs,
    end: TimeMs,
) -> Option<(TimeMs, TimeMs)> {
    let idle = input.config.utilisation.idle_util_pct;
    let window = Window::Range {
        start_ms: start,
        end_ms: end,
    };
    members
        .iter()
        .flat_map(|m| {
            input
                .history
                .series_in(m.device, Metric::GpuUtilPct, window)
                .filter(|&(_, u)| u > idle)
                .map(|(t, _)| t)
        })
        .fold(None, |span: Option<(TimeMs, TimeMs)>, t| {
            Some(span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))))
        })
}

#[cfg(test)]
impl Gpu {
    /// A GPU of the given figures, nothing else read about it.
    pub(super) fn with(figures: PeerFigures) -> Gpu {
        Gpu {
            figures,
            harmful_throttle_share: None,
            power_cap_share: None,
            power_limit_w: None,
            pcie_link: None,
            others: Vec::new(),
        }
    }

    /// The same GPU held at its power limit of `limit_w` most of the window.
    pub(super) fn at_power_limit(mut self, limit_w: f64) -> Gpu {
        self.power_cap_share = Some(0.9);
        self.power_limit_w = Some(limit_w);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(device: u32, power: f64, clock: f64) -> Gpu {
        Gpu::with(PeerFigures {
            device,
            power_w: Some(power),
            sm_clock_mhz: Some(clock),
            ..PeerFigures::default()
        })
    }

    /// A GPU doing more work at its power limit clocks lower: a consequence, said as one.
    #[test]
    fn a_lower_clock_at_the_power_limit_is_a_consequence_not_a_cause() {
        let peers = [
            gpu(0, 690.0, 1645.0).at_power_limit(700.0),
            gpu(2, 688.0, 1650.0).at_power_limit(700.0),
        ];
        let peers: Vec<&Gpu> = peers.iter().collect();
        let capped = gpu(1, 699.0, 1396.0).at_power_limit(700.0);
        let d = differences(&capped, &peers);
        assert!(!d.slower_part);
        assert_eq!(
            d.lines,
            vec![
                "at its power limit it runs slower (1396 MHz against its peers' 1648 MHz) \
                 because it does more work"
                    .to_owned()
            ]
        );
        // Below its limit at no more power, a lower clock is the GPU's own.
        let slow = gpu(1, 500.0, 1396.0);
        let d = differences(&slow, &peers);
        assert!(d.slower_part);
        assert_eq!(
            d.lines,
            vec!["its SM clock averages 1396 MHz against its peers' 1648 MHz".to_owned()]
        );
    }
}
