//! Plain-text rendering of probe results: one line per figure with its share of the model's peak.

use std::fmt::Write;

use super::runner::ProbeReport;

pub fn render(report: &ProbeReport) -> String {
    let mut out = String::new();
    for d in &report.devices {
        let name = d.gpu.as_ref().map_or("?", |g| g.name.as_str());
        let _ = writeln!(
            out,
            "GPU {} {} ({} suite{})",
            d.index,
            name,
            report.suite,
            d.model
                .as_deref()
                .map(|m| format!(", reference: {m}"))
                .unwrap_or_else(|| ", no reference model".into())
        );
        if let Some(why) = &d.refused {
            let _ = writeln!(out, "  not probed: {why}");
            continue;
        }
        for r in &d.results {
            let verdict = serde_json::to_value(r.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<10} {:<8} {:>8.0} ms{}",
                r.probe,
                verdict,
                r.duration_ms,
                r.note
                    .as_deref()
                    .map(|n| format!("  {n}"))
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
                    m.name, m.value, m.unit, share, m.served_by
                );
            }
        }
    }
    out
}
