//! One node: its scrape targets, each GPU's figures with utilisation and SM activity charted
//! over the last 30 minutes (range queries, read when the view opens), and its processes.

use gpudiag_fleet::model::{Gpu, Node, NodeDetail, NodeState};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::cells;
use super::state::State;
use crate::tui::format::{self, NA};
use crate::tui::theme::Theme;

pub fn render(f: &mut Frame, area: Rect, state: &State, name: &str, theme: &Theme) {
    let width = usize::from(area.width);
    let node = state.fleet.as_ref().and_then(|fl| fl.node(name));
    let lines = match node {
        Some(node) => node_lines(node, state.detail.as_ref(), width, theme),
        None => vec![Line::styled(
            format!("node {} is not in the latest read", format::text(name)),
            theme.warn(),
        )],
    };
    cells::draw_scrolled(f, area, lines, state.scroll);
}

fn node_lines(
    node: &Node,
    detail: Option<&NodeDetail>,
    width: usize,
    theme: &Theme,
) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let (state, state_style) = match node.state {
        NodeState::Up => ("up", theme.verdict(false)),
        NodeState::Partial => ("PARTIAL", theme.warn()),
        NodeState::Down => (
            "DOWN",
            theme.severity(gpudiag_model::finding::Severity::Fail),
        ),
    };
    lines.push(Line::from(vec![
        Span::styled(format!("node {}", format::text(&node.name)), theme.title()),
        Span::raw(" · "),
        Span::styled(state, state_style),
        Span::raw(format!(
            " · {} GPU{}",
            node.gpus.len(),
            if node.gpus.len() == 1 { "" } else { "s" }
        )),
    ]));
    for t in &node.targets {
        let (word, style) = if t.up {
            ("up", Style::default())
        } else {
            (
                "DOWN",
                theme.severity(gpudiag_model::finding::Severity::Fail),
            )
        };
        let exporter = match t.exporter {
            Some(gpudiag_fleet::model::Exporter::Gpudiag) => "gpudiag",
            Some(gpudiag_fleet::model::Exporter::DcgmExporter) => "dcgm-exporter",
            None => "exporter unknown",
        };
        lines.push(Line::from(vec![
            Span::raw(format!(
                "  target {} (scrape job {}, {exporter}) ",
                format::text(&t.instance),
                format::text(&t.scrape_job)
            )),
            Span::styled(word, style),
            Span::raw(format!(
                ", last scrape {} ago",
                cells::age(t.last_scrape_age_s)
            )),
        ]));
    }
    for finding in &node.findings {
        lines.push(Line::styled(
            format!("  finding {}", format::text(&finding.id)),
            theme.severity(finding.severity),
        ));
    }
    for alert in &node.alerts {
        lines.push(Line::styled(
            format!("  {}", cells::alert_text(alert)),
            cells::severity_style(alert.severity, theme),
        ));
    }
    match detail {
        None => lines.push(Line::styled("charts and processes: loading…", theme.dim())),
        Some(d) => {
            lines.push(Line::styled(
                format!(
                    "charts: the last {} min, a point every {:.0} s (· where no sample)",
                    (d.end_ms - d.start_ms) / 60_000,
                    d.step_s
                ),
                theme.dim(),
            ));
            for why in &d.degraded {
                lines.push(Line::styled(
                    format!("partial: {}", format::text(why)),
                    theme.warn(),
                ));
            }
        }
    }
    for gpu in &node.gpus {
        gpu_lines(&mut lines, gpu, detail, width, theme);
    }
    lines.push(Line::raw(""));
    process_lines(&mut lines, detail, theme);
    lines
}

fn gpu_lines(
    lines: &mut Vec<Line<'static>>,
    gpu: &Gpu,
    detail: Option<&NodeDetail>,
    width: usize,
    theme: &Theme,
) {
    let (verdict, verdict_style) = cells::verdict(&gpu.verdict, theme);
    let (finding, finding_style) = cells::worst_finding(gpu, theme);
    lines.push(Line::from(vec![
        Span::styled(
            format!(
                "GPU {} {}",
                format::text(gpu.gpu.as_deref().unwrap_or(NA)),
                cells::model(gpu.model.as_deref())
            ),
            theme.title(),
        ),
        Span::raw(format!(
            " · util {} · SM {} · tensor {} · {} GiB · {} · {} · ",
            cells::pct(gpu.util_pct),
            cells::pct(gpu.sm_active_pct),
            cells::pct(gpu.tensor_active_pct),
            cells::memory(gpu.memory_used_mib, gpu.memory_total_mib),
            cells::watts(gpu.power_w),
            cells::celsius(gpu.temperature_c),
        )),
        Span::styled(verdict, verdict_style),
        Span::raw(format!(" · {} · ", cells::job_or_pod(gpu))),
        Span::styled(finding, finding_style),
    ]));
    if let Some(d) = detail {
        let key = gpu
            .uuid
            .as_deref()
            .or(gpu.gpu.as_deref())
            .unwrap_or_default();
        let charts = d.charts.get(key);
        let chart = |name: &str| charts.and_then(|c| c.get(name)).map(Vec::as_slice);
        // Charts in rows of two or three, each with its label and latest value. Utilisation and
        // SM active read against 100 %, memory against the GPU's total, temperature against
        // 100 °C; power against the highest draw in the window (no limit is read here).
        let highest = |points: &[(i64, f64)]| points.iter().map(|p| p.1).fold(1.0_f64, f64::max);
        let total = gpu.memory_total_mib;
        let gib: Figure = |v| format::num(v.map(|mib| mib / 1024.0), 1, "");
        let rows: [&[Chart]; 2] = [
            &[
                ("util", "util_pct", Some(100.0), cells::pct),
                ("SM", "sm_active_pct", Some(100.0), cells::pct),
            ],
            &[
                ("W", "power_w", None, cells::watts),
                ("°C", "temperature_c", Some(100.0), cells::celsius),
                ("GiB", "memory_used_mib", total, gib),
            ],
        ];
        for (row_index, row) in rows.iter().enumerate() {
            let room = width.saturating_sub(4 + row.len() * 12) / row.len();
            let mut spans = vec![Span::raw("  ")];
            for (i, (label, name, top, figure)) in row.iter().enumerate() {
                let points = chart(name).unwrap_or_default();
                let top = top.unwrap_or_else(|| highest(points));
                spans.push(Span::styled(format!("{label:>4} "), theme.dim()));
                spans.push(Span::styled(
                    sparkline(points, d.start_ms, d.end_ms, room, top),
                    theme.series(row_index * 2 + i),
                ));
                spans.push(Span::raw(format!(
                    " {:>6} ",
                    figure(points.last().map(|p| p.1))
                )));
            }
            lines.push(Line::from(spans));
        }
    }
    for alert in &gpu.alerts {
        lines.push(Line::styled(
            format!("  {}", cells::alert_text(alert)),
            cells::severity_style(alert.severity, theme),
        ));
    }
}

/// How a chart's latest value is written.
type Figure = fn(Option<f64>) -> String;

/// A chart of the node view: its label, its series in the NodeDetail, the value its top stands
/// for (the window's highest when `None`), and how its latest value is written.
type Chart = (&'static str, &'static str, Option<f64>, Figure);

const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Points between `start_ms` and `end_ms` as `width` cells, each the mean of its slice of time;
/// a slice without a sample is "·", which cannot be read as a low value.
pub fn sparkline(
    points: &[(i64, f64)],
    start_ms: i64,
    end_ms: i64,
    width: usize,
    top: f64,
) -> String {
    if width == 0 {
        return String::new();
    }
    let span = (end_ms - start_ms).max(1) as f64;
    let mut sums = vec![(0.0, 0usize); width];
    for &(t, v) in points {
        if t < start_ms || t > end_ms || !v.is_finite() {
            continue;
        }
        let cell = (((t - start_ms) as f64 / span) * width as f64) as usize;
        let slot = &mut sums[cell.min(width - 1)];
        slot.0 += v;
        slot.1 += 1;
    }
    sums.iter()
        .map(|&(s, n)| {
            if n == 0 {
                return '·';
            }
            let frac = (s / n as f64 / top).clamp(0.0, 1.0);
            LEVELS[((frac * (LEVELS.len() - 1) as f64).round() as usize).min(LEVELS.len() - 1)]
        })
        .collect()
}

fn process_lines(lines: &mut Vec<Line<'static>>, detail: Option<&NodeDetail>, theme: &Theme) {
    lines.push(Line::styled("processes", theme.title()));
    let Some(d) = detail else {
        lines.push(Line::styled("  loading…", theme.dim()));
        return;
    };
    if let Some(why) = &d.processes_absent {
        lines.push(Line::styled(
            format!("  {}", format::text(why)),
            theme.dim(),
        ));
        return;
    }
    if d.processes.is_empty() {
        lines.push(Line::styled("  none running", theme.dim()));
        return;
    }
    lines.push(Line::styled(
        format!(
            "  {:>8} {:<20} {:<10} {:>3} {:>9} {:>4}  {:<18} JOB / POD",
            "PID", "NAME", "USER", "GPU", "MEMORY", "SM", "VERDICT"
        ),
        theme.dim(),
    ));
    for p in &d.processes {
        let job = p
            .slurm_job
            .as_deref()
            .map(|j| format!("slurm {}", format::text(j)))
            .or_else(|| p.pod.as_deref().map(format::text))
            .unwrap_or_else(|| "-".to_owned());
        lines.push(Line::raw(format!(
            "  {:>8} {:<20} {:<10} {:>3} {:>9} {:>4}  {:<18} {job}",
            format::fit(&p.pid, 8),
            format::fit(p.name.as_deref().unwrap_or(NA), 20),
            format::fit(p.user.as_deref().unwrap_or(NA), 10),
            format::fit(p.gpu.as_deref().unwrap_or(NA), 3),
            format::bytes(p.memory_used_bytes.map(|b| b.max(0.0) as u64)),
            cells::pct(p.sm_util_pct),
            format::fit(p.verdict.as_deref().unwrap_or(NA), 18),
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparkline_marks_gaps_and_scales_to_the_top() {
        let points = [(0, 0.0), (10, 100.0), (30, 50.0)];
        assert_eq!(sparkline(&points, 0, 40, 4, 100.0), "▁█·▅");
        assert_eq!(sparkline(&[], 0, 40, 3, 100.0), "···");
        assert_eq!(sparkline(&points, 0, 40, 0, 100.0), "");
    }
}
