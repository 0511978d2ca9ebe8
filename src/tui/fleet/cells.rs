//! How the fleet views write a figure: the same words and units in the table, the node view
//! and the job view. An absent figure is "n/a", never 0.

use gpudiag_fleet::model::{Alert, Gpu, GpuVerdict, Rank};
use gpudiag_model::finding::Severity;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;

use crate::tui::format::{self, NA};
use crate::tui::theme::Theme;

pub fn pct(v: Option<f64>) -> String {
    format::num(v, 0, "%")
}

/// A time since something, short enough for a narrow column: "0.4s", "12s", "5m", "3h", "2d".
pub fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => NA.to_owned(),
        Some(s) if s < 0.0 => "0s".to_owned(),
        Some(s) if s < 10.0 => format!("{s:.1}s"),
        Some(s) if s < 60.0 => format!("{s:.0}s"),
        Some(s) if s < 3600.0 => format!("{:.0}m", (s / 60.0).floor()),
        Some(s) if s < 86400.0 => format!("{:.0}h", (s / 3600.0).floor()),
        Some(s) => format!("{:.0}d", (s / 86400.0).floor()),
    }
}

/// Bytes received, in the unit that keeps the number short: "50 KiB", "3.2 MiB".
pub fn size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.0} KiB", b / KIB)
    } else {
        format!("{:.1} MiB", b / KIB / KIB)
    }
}

/// Used over total memory in GiB ("62.6/79.6"); either part may be n/a.
pub fn memory(used_mib: Option<f64>, total_mib: Option<f64>) -> String {
    let gib = |mib: f64| {
        let g = mib / 1024.0;
        if g >= 100.0 {
            format!("{g:.0}")
        } else {
            format!("{g:.1}")
        }
    };
    match (used_mib, total_mib) {
        (None, None) => NA.to_owned(),
        (u, t) => format!(
            "{}/{}",
            u.map_or_else(|| NA.to_owned(), gib),
            t.map_or_else(|| NA.to_owned(), gib)
        ),
    }
}

pub fn watts(w: Option<f64>) -> String {
    match w {
        None => NA.to_owned(),
        Some(w) if w >= 10_000.0 => format!("{:.0}kW", w / 1000.0),
        Some(w) if w >= 1000.0 => format!("{:.1}kW", w / 1000.0),
        Some(w) => format!("{w:.0}W"),
    }
}

pub fn celsius(c: Option<f64>) -> String {
    format::num(c, 0, "°C")
}

/// A GPU model without the vendor's name, which every row would repeat.
pub fn model(name: Option<&str>) -> String {
    let Some(name) = name else {
        return NA.to_owned();
    };
    let short = name
        .strip_prefix("NVIDIA ")
        .or_else(|| name.strip_prefix("Tesla "))
        .unwrap_or(name);
    // The memory type and form factor rarely tell two GPUs of a fleet apart, and the table's
    // column is narrow: "H100 80GB HBM3" reads as "H100 80GB".
    let kept: Vec<&str> = short
        .split_whitespace()
        .filter(|w| {
            let w = w.to_ascii_uppercase();
            !(w.starts_with("HBM") || w.starts_with("SXM") || w == "PCIE" || w == "NVL")
        })
        .collect();
    let short = if kept.is_empty() {
        short.to_owned()
    } else {
        kept.join(" ")
    };
    format::text(&short)
}

/// The verdict's words and how they are drawn: waste stands out, the n/a cases are dim.
pub fn verdict(v: &GpuVerdict, theme: &Theme) -> (String, Style) {
    match v {
        GpuVerdict::Judged { bottleneck, .. } => {
            let good = matches!(bottleneck.as_str(), "compute_bound" | "memory_bound");
            let idle = bottleneck == "idle";
            let style = if idle {
                theme.dim()
            } else {
                theme.verdict(!good)
            };
            (format::text(bottleneck), style)
        }
        GpuVerdict::NotJudgedYet => ("not judged yet".to_owned(), theme.dim()),
        GpuVerdict::DcgmExporterOnly => ("n/a: dcgm-exporter only".to_owned(), theme.dim()),
    }
}

pub fn severity_style(s: Option<Severity>, theme: &Theme) -> Style {
    // An alert without a severity gpudiag knows still asks for attention.
    theme.severity(s.unwrap_or(Severity::Warn))
}

/// The worst finding of a GPU, or what stands in for none.
pub fn worst_finding(gpu: &Gpu, theme: &Theme) -> (String, Style) {
    if let Some(f) = gpu.findings.first() {
        return (format::text(&f.id), theme.severity(f.severity));
    }
    if let Some(a) = gpu.alerts.first() {
        return (
            format!("⚠ {}", format::text(&a.name)),
            severity_style(a.severity, theme),
        );
    }
    if gpu.verdict == GpuVerdict::DcgmExporterOnly {
        return (NA.to_owned(), theme.dim());
    }
    ("-".to_owned(), theme.dim())
}

/// The job or pod the GPU works for.
pub fn job_or_pod(gpu: &Gpu) -> String {
    if let Some(j) = gpu.jobs.first() {
        let more = if gpu.jobs.len() > 1 {
            format!(" +{}", gpu.jobs.len() - 1)
        } else {
            String::new()
        };
        return format!("{}{more}", format::text(&j.job_key));
    }
    match &gpu.pod {
        Some(p) => match &p.namespace {
            Some(ns) => format::text(&format!("{ns}/{}", p.pod)),
            None => format::text(&p.pod),
        },
        None => "-".to_owned(),
    }
}

/// How long an alert has been active at `now_ms`, from Prometheus's RFC 3339 `activeAt`.
pub fn alert_age(alert: &Alert, now_ms: i64) -> Option<f64> {
    let since = alert.active_since.as_deref()?;
    let t = humantime::parse_rfc3339_weak(since).ok()?;
    let ms = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64;
    Some((now_ms - ms) as f64 / 1000.0)
}

/// "⚠ NAME: summary (pending)", the alert as a line under what it names.
pub fn alert_text(alert: &Alert) -> String {
    let mut s = format!("⚠ {}", alert.name);
    if let Some(summary) = &alert.summary {
        s.push_str(": ");
        s.push_str(summary);
    }
    if alert.state != "firing" {
        s.push_str(&format!(" ({})", alert.state));
    }
    format::text(&s)
}

pub fn rank_style(rank: Rank, theme: &Theme) -> Style {
    match rank {
        Rank::Down | Rank::Fail => theme.severity(Severity::Fail),
        Rank::Warn => theme.severity(Severity::Warn),
        Rank::Held => theme.verdict(true),
        Rank::Good => theme.verdict(false),
        Rank::Idle | Rank::Unknown => Style::default(),
    }
}

/// Draws a view's lines from `scroll` on, each fitted to the width (the node and job views).
pub fn draw_scrolled(f: &mut Frame, area: Rect, lines: Vec<Line<'static>>, scroll: usize) {
    let width = usize::from(area.width);
    let lines: Vec<Line> = lines
        .into_iter()
        .skip(scroll)
        .map(|l| format::fit_line(l, width))
        .collect();
    f.render_widget(Paragraph::new(lines), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_n_a_when_absent() {
        assert_eq!(pct(None), "n/a");
        assert_eq!(memory(None, None), "n/a");
        assert_eq!(memory(Some(64088.0), None), "62.6/n/a");
        assert_eq!(memory(Some(64088.0), Some(143771.0)), "62.6/140");
        assert_eq!(watts(Some(3805.0)), "3.8kW");
        assert_eq!(watts(Some(476.2)), "476W");
        assert_eq!(age(Some(0.898)), "0.9s");
        assert_eq!(age(Some(125.0)), "2m");
        assert_eq!(age(None), "n/a");
        assert_eq!(model(Some("NVIDIA H100 80GB HBM3")), "H100 80GB");
        assert_eq!(model(Some("NVIDIA A100-SXM4-80GB")), "A100-SXM4-80GB");
        assert_eq!(model(Some("Tesla T4")), "T4");
        assert_eq!(size(50945), "50 KiB");
    }
}
