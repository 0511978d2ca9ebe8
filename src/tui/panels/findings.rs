//! Findings: severity, time, device, title, evidence and advice, worst first (a FAIL never
//! sits below an INFO), newest first within a severity. The list clips each to three lines;
//! Enter opens one in a box with its whole evidence and advice, wrapped and scrollable.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::centered;
use crate::tui::app::{App, FINDINGS_EVERY};
use crate::tui::format;
use gpudiag_core::rules::{Evidence, Finding};

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
        Line::from(head),
        Line::from(Span::styled(
            format::fit(
                &format!("     evidence: {}", evidence_text(&finding.evidence)),
                width,
            ),
            t.dim(),
        )),
        Line::from(format::fit(&format!("     do: {}", finding.advice), width)),
    ]
}

/// Where a finding's details open (at most 100 columns, as tall as they need within the screen)
/// and their lines wrapped to fit it.
fn detail_layout(app: &App, finding: &Finding, area: Rect) -> (Rect, Vec<Line<'static>>) {
    let width = area.width.saturating_sub(4).min(100);
    let inner_width = usize::from(width.saturating_sub(2));
    let lines = detail_lines(app, finding, inner_width);
    let height = u16::try_from(lines.len() + 2)
        .unwrap_or(u16::MAX)
        .min(area.height.saturating_sub(2));
    (centered(area, width, height), lines)
}

/// An evidence value as a person reads it: strings without JSON quotes, null as n/a.
fn value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => format::NA.to_owned(),
        other => other.to_string(),
    }
}

/// A finding's details, wrapped to `width`: headline, title, every evidence value, the window
/// and threshold, and the advice in full.
pub fn detail_lines(app: &App, finding: &Finding, width: usize) -> Vec<Line<'static>> {
    let t = app.theme;
    let device = match finding.device {
        None => "host".to_owned(),
        Some(d) => match app
            .devices
            .iter()
            .find(|x| x.index == d)
            .and_then(|x| x.name.as_deref())
        {
            Some(name) => format!("GPU {d} ({name})"),
            None => format!("GPU {d}"),
        },
    };
    let mut lines = vec![Line::from(vec![
        Span::styled(
            finding.severity.to_string().to_uppercase(),
            t.severity(finding.severity),
        ),
        Span::raw(format!(
            "  {device}  {} UTC  {}{}",
            format::clock(finding.time_ms),
            finding.id,
            finding.recorded_tag()
        )),
    ])];
    let bold = ratatui::style::Style::default().add_modifier(Modifier::BOLD);
    lines.extend(
        format::wrap(&finding.title, width, "")
            .into_iter()
            .map(|l| Line::from(Span::styled(l, bold))),
    );
    lines.push(Line::from(""));
    lines.push(Line::from(Span::styled("Evidence", t.title())));
    let e = &finding.evidence;
    let mut facts: Vec<String> = e
        .values
        .iter()
        .map(|(k, v)| format!("{k}: {}", value_text(v)))
        .collect();
    if e.window_s > 0.0 {
        facts.push(format!("window: {:.0} s", e.window_s));
    }
    facts.push(format!("threshold: {}", e.threshold));
    for fact in facts {
        lines.extend(format::wrap(&fact, width, "  ").into_iter().map(Line::from));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(Span::styled("What to do", t.title())));
    lines.extend(
        format::wrap(&finding.advice, width, "  ")
            .into_iter()
            .map(Line::from),
    );
    lines
}

/// How far the details of `finding` can scroll on a terminal of `viewport` (width, height).
pub fn detail_scroll_max(app: &App, finding: &Finding, viewport: (u16, u16)) -> u16 {
    let (rect, lines) = detail_layout(app, finding, Rect::new(0, 0, viewport.0, viewport.1));
    let inner = Block::bordered().inner(rect);
    u16::try_from(lines.len().saturating_sub(usize::from(inner.height))).unwrap_or(u16::MAX)
}

/// The details box over the panels, scrolled down by `scroll` lines.
pub fn detail(f: &mut Frame, area: Rect, app: &App, finding: &Finding, scroll: u16) {
    let (rect, lines) = detail_layout(app, finding, area);
    let block = Block::bordered().title(Span::styled(
        " Finding · ↑↓ PgUp PgDn scroll · Esc closes ",
        app.theme.title(),
    ));
    let inner = block.inner(rect);
    let max =
        u16::try_from(lines.len().saturating_sub(usize::from(inner.height))).unwrap_or(u16::MAX);
    let block = if max > 0 {
        block.title_bottom(format!(" {}/{} ", scroll.min(max), max))
    } else {
        block
    };
    f.render_widget(Clear, rect);
    f.render_widget(
        Paragraph::new(lines)
            .block(block)
            .scroll((scroll.min(max), 0)),
        rect,
    );
}
