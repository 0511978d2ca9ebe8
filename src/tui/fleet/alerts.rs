//! Every firing alert of the fleet, each under the node and GPU it names, the ones that name
//! no node of the fleet last; Enter opens the node.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::cells;
use super::state::State;
use crate::tui::format::{self, NA};
use crate::tui::theme::Theme;

pub fn render(f: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let width = usize::from(area.width);
    let list = state.alert_list();
    let mut lines = vec![Line::styled(
        format!(
            "firing alerts ({}) · Enter opens the node · Esc back",
            list.len()
        ),
        theme.title(),
    )];
    if list.is_empty() {
        let why = if state.fleet.is_some() {
            "none firing"
        } else {
            "reading Prometheus…"
        };
        lines.push(Line::styled(format!("  {why}"), theme.dim()));
    }
    let height = usize::from(area.height).saturating_sub(1).max(1);
    // Two lines an alert: where, then what.
    let first = (state.alert_selected * 2 + 2).saturating_sub(height) / 2;
    for (i, placed) in list.iter().enumerate().skip(first) {
        let where_ = match (placed.node, placed.gpu) {
            (Some(n), Some(g)) => format!(
                "{} · GPU {}",
                format::text(&n.name),
                format::text(g.gpu.as_deref().unwrap_or(NA))
            ),
            (Some(n), None) => format::text(&n.name),
            (None, _) => format!(
                "no node of the fleet{}",
                placed
                    .alert
                    .node
                    .as_deref()
                    .map(|n| format!(" (names {})", format::text(n)))
                    .unwrap_or_default()
            ),
        };
        let a = placed.alert;
        let mut head = Line::from(vec![
            Span::styled(where_, theme.title()),
            Span::raw(format!(
                " · {} for {}",
                format::text(&a.state),
                cells::age(cells::alert_age(a, state.now_ms))
            )),
            Span::styled(
                a.severity.map(|s| format!(" · {s}")).unwrap_or_default(),
                cells::severity_style(a.severity, theme),
            ),
        ]);
        if i == state.alert_selected {
            head = head.patch_style(theme.selected());
        }
        lines.push(format::fit_line(head, width));
        lines.push(format::fit_line(
            Line::from(vec![
                Span::raw("  "),
                Span::styled(
                    cells::alert_text(a),
                    cells::severity_style(a.severity, theme),
                ),
            ]),
            width,
        ));
    }
    f.render_widget(Paragraph::new(lines), area);
}
