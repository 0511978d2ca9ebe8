//! Findings: severity, time, device, title, evidence and advice, worst first (a FAIL never
//! sits below an INFO), newest first within a severity. The list clips each to three lines;
//! Enter opens one in a box with its whole evidence and advice, wrapped and scrollable.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};

use crate::tui::app::{App, FINDINGS_EVERY};
use crate::tui::format;
use gpudiag_model::finding::{Evidence, Finding};

/// Lines each finding takes: headline, evidence, advice.
const LINES_PER_FINDING: usize = 3;

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let block = Block::bordered().title(Span::styled(
        " Findings · worst first · Enter: details ",
        t.title(),
    ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.findings.is_empty() {
        let msg = format!(
            "No findings so far: nothing looks wrong in the telemetry seen. \
             The rules run every {} ms.",
            FINDINGS_EVERY.as_millis()
        );
        f.render_widget(Paragraph::new(msg).wrap(Wrap { trim: true }), inner);
        return;
    }
    let fits = (inner.height as usize / LINES_PER_FINDING).max(1);
    let first = app.selected_finding.saturating_sub(fits - 1);
    let width = inner.width as usize;
    let mut lines = Vec::new();
    for (i, finding) in app.findings.iter().enumerate().skip(first).take(fits) {
        lines.extend(finding_lines(
            app,
            finding,
            i == app.selected_finding,
            width,
        ));
    }
    f.render_widget(Paragraph::new(lines), inner);
}

fn evidence_text(e: &Evidence) -> String {
    let values: Vec<String> = e.values.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut s = values.join(", ");
    if e.window_s > 0.0 {
        s.push_str(&format!(" over {:.0} s", e.window_s));
    }
    s.push_str(&format!(" (threshold {})", e.threshold));
    s
}

fn finding_lines(app: &App, finding: &Finding, selected: bool, width: usize) -> Vec<Line<'static>> {
    let t = app.theme;
    let device = finding
        .device
        .map_or_else(|| "host".to_owned(), |d| format!("GPU{d}"));
    let head_style = if selected {
        t.selected()
    } else {
        ratatui::style::Style::default()
    };
    let mut head = vec![
        Span::styled(
            format!("{:<4}", finding.severity.to_string().to_uppercase()),
            t.severity(finding.severity),
        ),
        Span::raw(format!(" {} {device:<5} ", format::clock(finding.time_ms))),
        Span::styled(
            format!("{}{}", format::text(&finding.title), finding.recorded_tag()),
            head_style,
        ),
    ];
    // A problem that has passed stays listed (it happened), but must not read as current.
    if finding.is_cleared() {
        head.push(Span::styled(
            format!(
                " · cleared, last seen {}",
                format::clock(finding.last_seen())
            ),
            t.dim(),
        ));
    }
    vec![
        format::fit_line(Line::from(head), width),
        Line::from(Span::styled(
            format::fit(
                &format!("     evidence: {}", evidence_text(&finding.evidence)),
                width,
            ),
            t.dim(),
        )),
        Line::from(format::fit(
            &format!("     do: {}", format::text(&finding.advice)),
            width,
        )),
    ]
}
