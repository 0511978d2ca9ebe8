//! Plain-text rendering of probe results: one line per figure with its share of the model's
//! peak, the GPU-to-GPU matrices when the p2p probe ran, and the all-reduce figures.

use std::fmt::Write;

// GPU names, library versions and notes come from the driver: printed escaped.
use gpudiag_model::printable::line as esc;

use super::ProbeResult;
use super::p2p::{self, PeerLink};
use super::runner::ProbeReport;

/// The remedy `gpudiag probe` and `check --probes` print for a refusal `--force` overrides.
pub const FORCE_FLAG_HINT: &str = "pass --force to run anyway";

pub fn render(report: &ProbeReport) -> String {
    render_with_hint(report, FORCE_FLAG_HINT)
}

/// `render`, with `force_hint` after each refusal that forcing would override: each interface
/// says how to force in its own terms.
pub fn render_with_hint(report: &ProbeReport, force_hint: &str) -> String {
    let mut out = String::new();
    for d in &report.devices {
        let name = d
            .gpu
            .as_ref()
            .map(|g| g.name.as_str())
            .or(d.name.as_deref())
            .map_or_else(String::new, |n| format!(" {}", esc(n)));
        let _ = writeln!(
            out,
            "GPU {}{} ({} suite{})",
            d.index,
            name,
            report.suite,
            d.model
                .as_deref()
                .map(|m| format!(", reference: {}", esc(m)))
                .unwrap_or_else(|| ", no reference model".into())
        );
        if let Some(why) = &d.refused {
            let hint = if d.forcible {
                format!("; {force_hint}")
            } else {
                String::new()
            };
            let _ = writeln!(out, "  not probed: {}{hint}", esc(why));
            continue;
        }
        for r in &d.results {
            out.push_str(&render_result(r));
        }
    }
    let links: Vec<PeerLink> = report
        .devices
        .iter()
        .flat_map(|d| &d.results)
        .filter(|r| r.probe == "p2p")
        .flat_map(p2p::links_of)
        .collect();
    out.push_str(&render_matrices(&links));
    if !report.host.is_empty() {
        out.push_str("All GPUs together\n");
        for r in &report.host {
            out.push_str(&render_result(r));
        }
    }
    out
}

fn verdict_name(r: &ProbeResult) -> String {
    serde_json::to_value(r.verdict)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// One probe: its verdict and time, then one line per figure.
pub fn render_result(r: &ProbeResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<10} {:<8} {:>8.0} ms{}",
        esc(&r.probe),
        verdict_name(r),
        r.duration_ms,
        r.note
            .as_deref()
            .map(|n| format!("  {}", esc(n)))
            .unwrap_or_default()
    );
    for m in &r.metrics {
        let share = m
            .ratio
            .map(|x| format!(" ({:.0}% of {:.1})", x * 100.0, m.expected.unwrap_or(0.0)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    {:<22} {:>12.3} {:<8}{}  [{}]",
            esc(&m.name),
            m.value,
            esc(&m.unit),
            share,
            esc(&m.served_by)
        );
    }
    out
}

/// Source-by-destination matrices of unidirectional and bidirectional GB/s and latency, like
/// `p2pBandwidthLatencyTest` prints them; empty without links.
pub fn render_matrices(links: &[PeerLink]) -> String {
    let mut out = String::new();
    let mut gpus: Vec<u32> = links.iter().flat_map(|l| [l.src, l.dst]).collect();
    gpus.sort_unstable();
    gpus.dedup();
    if gpus.len() < 2 {
        return out;
    }
    type Pick = fn(&PeerLink) -> Option<f64>;
    let tables: [(&str, Pick, usize); 3] = [
        (
            "Peer copies, one direction (GB/s)",
            |l| l.unidirectional_gbps,
            1,
        ),
        (
            "Peer copies, both directions (GB/s)",
            |l| l.bidirectional_gbps,
            1,
        ),
        ("Peer copy latency, 4 bytes (us)", |l| l.latency_us, 2),
    ];
    for (title, pick, decimals) in tables {
        let _ = write!(out, "{title}\n  src\\dst");
        for g in &gpus {
            let _ = write!(out, " {:>8}", format!("GPU{g}"));
        }
        out.push('\n');
        for s in &gpus {
            let _ = write!(out, "  {:<7}", format!("GPU{s}"));
            for d in &gpus {
                let cell = if s == d {
                    "-".to_owned()
                } else {
                    links
                        .iter()
                        .find(|l| l.src == *s && l.dst == *d)
                        .and_then(pick)
                        .map_or("n/a".to_owned(), |v| format!("{v:.decimals$}"))
                };
                let _ = write!(out, " {cell:>8}");
            }
            out.push('\n');
        }
    }
    for l in links
        .iter()
        .filter(|l| !l.peer_access || l.verified == Some(false))
    {
        let _ = writeln!(
            out,
            "  GPU{} -> GPU{}: {}{}",
            l.src,
            l.dst,
            if l.verified == Some(false) {
                "BROKEN: wrong bytes arrived"
            } else {
                "peer access off (staged through host memory)"
            },
            l.note
                .as_deref()
                .map(|n| format!("; {}", esc(n)))
                .unwrap_or_default()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(src: u32, dst: u32, uni: f64) -> PeerLink {
        PeerLink {
            src,
            dst,
            connection: Some("NV18".into()),
            peer_access: true,
            unidirectional_gbps: Some(uni),
            bidirectional_gbps: Some(2.0 * uni),
            latency_us: Some(2.25),
            verified: Some(true),
            note: None,
        }
    }

    #[test]
    fn a_refused_gpu_is_named_and_told_how_to_force() {
        let report = ProbeReport {
            suite: "quick".into(),
            devices: vec![super::super::runner::DeviceProbes {
                index: 0,
                gpu: None,
                model: None,
                refused: Some("GPU 0 is in use by pid 42 (3072 MiB)".into()),
                name: Some("NVIDIA H200".into()),
                forcible: true,
                busy_pids: vec![42],
                results: vec![],
            }],
            host: vec![],
            findings: vec![],
        };
        let text = render(&report);
        assert!(text.starts_with("GPU 0 NVIDIA H200 (quick suite"), "{text}");
        assert!(!text.contains('?'), "{text}");
        assert!(
            text.contains("pid 42 (3072 MiB); pass --force to run anyway"),
            "{text}"
        );
        let tui = render_with_hint(&report, "press f to run anyway");
        assert!(
            tui.contains("; press f to run anyway") && !tui.contains("--force"),
            "{tui}"
        );
    }

    #[test]
    fn matrices_put_sources_in_rows() {
        let mut broken = link(1, 0, 120.0);
        broken.verified = Some(false);
        let text = render_matrices(&[link(0, 1, 390.0), broken]);
        assert!(text.contains("  GPU0           -    390.0"), "{text}");
        assert!(text.contains("  GPU1       120.0        -"), "{text}");
        assert!(text.contains("GPU1 -> GPU0: BROKEN"), "{text}");
        assert!(text.contains("2.25"), "{text}");
        assert!(render_matrices(&[]).is_empty());
    }

    /// Notes and library versions come from the driver: a control character in them is
    /// printed as a visible escape, never sent to the terminal.
    #[test]
    fn driver_strings_are_printed_escaped() {
        let mut r = ProbeResult::new("matmul", 0);
        r.note = Some("cuBLAS said \x1b]0;pwned\x07".into());
        let mut broken = link(0, 1, 1.0);
        broken.peer_access = false;
        broken.note = Some("driver\r\nFAKE line".into());
        let text = render_result(&r) + &render_matrices(&[broken, link(1, 0, 1.0)]);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains(r"cuBLAS said \x1b]0;pwned\x07"), "{text}");
        assert!(text.contains(r"; driver\x0d\x0aFAKE line"), "{text}");
    }
}
