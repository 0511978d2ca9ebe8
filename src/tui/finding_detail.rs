//! A finding opened in full (Enter on the Findings panel): its whole evidence and advice,
//! wrapped and scrollable. Beside the panels rather than among them: the key handling in
//! `app.rs` bounds the scroll by the same layout the box is drawn with, and the panels stand
//! above the `App` they draw.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};

use super::layout::centered;
use crate::tui::format;
use crate::tui::theme::Theme;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::DeviceInfo;

/// What the box needs of the app: its colours and the GPUs' names.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub theme: Theme,
    pub devices: &'a [DeviceInfo],
}

/// Where a finding's details open (at most 100 columns, as tall as they need within the screen)
/// and their lines wrapped to fit it.
fn detail_layout(view: View<'_>, finding: &Finding, area: Rect) -> (Rect, Vec<Line<'static>>) {
    let width = area.width.saturating_sub(4).min(100);
    let inner_width = usize::from(width.saturating_sub(2));
    let lines = detail_lines(view, finding, inner_width);
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
pub fn detail_lines(view: View<'_>, finding: &Finding, width: usize) -> Vec<Line<'static>> {
    let t = view.theme;
    let device = match finding.device {
        None => "host".to_owned(),
        Some(d) => match view
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
pub fn detail_scroll_max(view: View<'_>, finding: &Finding, viewport: (u16, u16)) -> u16 {
    let (rect, lines) = detail_layout(view, finding, Rect::new(0, 0, viewport.0, viewport.1));
    super::layout::scroll_max(rect, lines.len())
}

/// The details box over the panels, scrolled down by `scroll` lines.
pub fn detail(f: &mut Frame, area: Rect, view: View<'_>, finding: &Finding, scroll: u16) {
    let (rect, lines) = detail_layout(view, finding, area);
    let title = Span::styled(
        " Finding · ↑↓ PgUp PgDn scroll · Esc closes ",
        view.theme.title(),
    );
    super::layout::scroll_box(f, rect, title, lines, scroll);
}
