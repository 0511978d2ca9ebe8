//! The header, always on top: which Prometheus, the fleet's size and state, when it was read and
//! what reading it cost, and, when the last read failed, one line saying why over the last good
//! read. The footer says which keys work where the user is.

use gpudiag_model::finding::Status;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::cells;
use super::state::{State, View};
use crate::tui::format;
use crate::tui::theme::Theme;
use gpudiag_fleet::model::RulesState;
use gpudiag_model::finding::Severity;

pub const HEADER_ROWS: u16 = 3;

pub fn render(f: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let width = usize::from(area.width);
    let mut lines = vec![first_line(state, theme), second_line(state, theme)];
    lines.push(third_line(state, theme));
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|l| format::fit_line(l, width))
        .collect();
    f.render_widget(Paragraph::new(lines), area);
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn first_line(state: &State, theme: &Theme) -> Line<'static> {
    let mut spans = vec![
        Span::styled("gpudiag fleet", theme.title()),
        Span::raw(format!(" · {}", format::text(&state.prometheus))),
    ];
    let Some(fleet) = &state.fleet else {
        spans.push(Span::styled(" · reading Prometheus…", theme.dim()));
        return Line::from(spans);
    };
    if fleet.could_not_run.is_some() {
        spans.push(Span::styled(" · no good read yet", theme.warn()));
        return Line::from(spans);
    }
    let c = &fleet.counts;
    let down = if c.nodes_down > 0 {
        format!(" ({} down)", c.nodes_down)
    } else {
        String::new()
    };
    spans.push(Span::raw(format!(
        " · {} node{}{down} · {} GPU{} · {} job{} · ",
        c.nodes,
        plural(c.nodes),
        c.gpus,
        plural(c.gpus),
        fleet.jobs.len(),
        plural(fleet.jobs.len() as u32),
    )));
    let alerts = format!(
        "{} alert{} firing",
        c.alerts_firing,
        plural(c.alerts_firing)
    );
    spans.push(if c.alerts_firing > 0 {
        Span::styled(alerts, theme.warn())
    } else {
        Span::raw(alerts)
    });
    let (word, style) = match fleet.status {
        Status::Healthy => ("healthy", theme.verdict(false)),
        Status::Warn => ("WARN", theme.severity(Severity::Warn)),
        Status::Fail => ("FAIL", theme.severity(Severity::Fail)),
        Status::NotJudged => ("not judged (dcgm-exporter only)", theme.dim()),
        Status::CouldNotRun => ("could not run", theme.severity(Severity::Fail)),
    };
    spans.push(Span::raw(" · "));
    spans.push(Span::styled(word, style));
    Line::from(spans)
}

fn second_line(state: &State, theme: &Theme) -> Line<'static> {
    let Some(fleet) = &state.fleet else {
        let took = state
            .reading_since_ms
            .map(|since| {
                format!(
                    " for {}",
                    cells::age(Some((state.now_ms - since) as f64 / 1000.0))
                )
            })
            .unwrap_or_default();
        return Line::styled(
            format!(
                "every {} · first read under way{took}",
                humantime::format_duration(state.interval)
            ),
            theme.dim(),
        );
    };
    let age = state
        .fleet_received_ms
        .map(|at| (state.now_ms - at) as f64 / 1000.0);
    let q = &fleet.queries;
    let rules = match &fleet.rules {
        RulesState::Loaded => "rules loaded".to_owned(),
        RulesState::NotLoaded => "rules not loaded".to_owned(),
        RulesState::Unknown { .. } => "rules unknown".to_owned(),
    };
    // While reads fail the table is the last good one: its age says how stale.
    let what = if fleet.could_not_run.is_some() {
        "tried"
    } else if state.error.is_some() {
        "last good read"
    } else {
        "evaluated"
    };
    let rules = if fleet.could_not_run.is_some() {
        "rules unknown"
    } else {
        &rules
    };
    let mut text = format!(
        "{what} {} UTC, {} ago · {} quer{} in {:.2} s, {} · {rules} · every {}",
        crate::format::clock(fleet.evaluated_at_ms.max(0) as u64),
        cells::age(age),
        q.count,
        if q.count == 1 { "y" } else { "ies" },
        q.seconds,
        cells::size(q.bytes),
        humantime::format_duration(state.interval),
    );
    if let Some(since) = state.reading_since_ms {
        let took = (state.now_ms - since) as f64 / 1000.0;
        // A read in its first second is the normal case; say so only when it drags.
        if took >= 1.0 {
            text.push_str(&format!(" · reading for {}", cells::age(Some(took))));
        }
    }
    Line::styled(text, theme.dim())
}

fn third_line(state: &State, theme: &Theme) -> Line<'static> {
    if let Some(why) = &state.error {
        return Line::styled(
            format!("⚠ {}", format::text(why)),
            theme.severity(Severity::Warn),
        );
    }
    let Some(fleet) = &state.fleet else {
        return Line::styled("reading Prometheus…", theme.dim());
    };
    if !fleet.degraded.is_empty() {
        return Line::styled(
            format!("partial: {}", format::text(&fleet.degraded.join("; "))),
            theme.warn(),
        );
    }
    if let RulesState::Unknown { reason } = &fleet.rules {
        return Line::styled(format!("rules: {}", format::text(reason)), theme.dim());
    }
    Line::styled(
        format!(
            "selector {} · node label {} · {} judged, {} dcgm-exporter only",
            format::text(&fleet.selector),
            format::text(&fleet.node_label),
            fleet.counts.gpus_judged,
            fleet.counts.gpus_dcgm_exporter_only,
        ),
        theme.dim(),
    )
}

/// The bottom line: the filter being typed, else the keys of the view.
pub fn footer(f: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let line = if state.typing_filter {
        Line::from(vec![
            Span::styled("filter: ", theme.title()),
            Span::raw(format::text(&state.filter)),
            Span::styled("▏", theme.title()),
            Span::styled("  Enter keeps it, Esc clears it", theme.dim()),
        ])
    } else if let Some(note) = &state.notice {
        Line::styled(format::text(note), theme.warn())
    } else {
        let keys = match state.view {
            View::Fleet => {
                "↑↓ move · → space open · ← fold · Enter node/job · J job · g group · / filter · \
                 a alerts · ? help · q quit"
            }
            View::Node(_) | View::Job(_) => "↑↓ scroll · Esc back · a alerts · ? help · q quit",
            View::Alerts => "↑↓ move · Enter its node · Esc back · ? help · q quit",
        };
        let mut spans = Vec::new();
        if !state.filter.is_empty() && state.view == View::Fleet {
            spans.push(Span::styled(
                format!("filter \"{}\" (Esc clears) · ", format::text(&state.filter)),
                theme.title(),
            ));
        }
        spans.push(Span::styled(keys, theme.dim()));
        Line::from(spans)
    };
    f.render_widget(
        Paragraph::new(format::fit_line(line, usize::from(area.width))).style(Style::default()),
        area,
    );
}
