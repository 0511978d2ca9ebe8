//! Processes on the GPUs: PID, user, command, GPU memory and its growth over the last minute,
//! SM utilisation; sortable (s), and a confirmed kill (k) on live GPUs.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Paragraph, Row, Table, TableState};

use crate::tui::app::{App, ProcessView};
use crate::tui::format::{self, NA};

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let title = format!(" Processes · sorted by {} (s) · k kill ", app.sort.label());
    let block = Block::bordered().title(Span::styled(title, t.title()));
    let rows = match app.process_view() {
        ProcessView::NotRead(why) => {
            let msg = format!(
                "process list {NA}: {}",
                format::text(&why.unwrap_or_else(|| "no sample yet".into()))
            );
            f.render_widget(Paragraph::new(msg).style(t.dim()).block(block), area);
            return;
        }
        ProcessView::Rows(rows) => rows,
    };
    if rows.is_empty() {
        f.render_widget(
            Paragraph::new("no processes are using the GPUs").block(block),
            area,
        );
        return;
    }
    let wide = area.width >= 110;
    let mut header = vec!["GPU", "PID", "USER", "COMMAND", "GPU MEM", "GROWTH", "SM"];
    let mut widths = vec![
        Constraint::Length(3),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Min(10),
        Constraint::Length(9),
        Constraint::Length(13),
        Constraint::Length(5),
    ];
    if wide {
        header.push("CONTAINER");
        widths.push(Constraint::Length(14));
    }
    let body: Vec<Row> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.device.to_string(),
                r.pid.to_string(),
                format::text(r.user.as_deref().unwrap_or(NA)),
                format::text(r.name.as_deref().unwrap_or(NA)),
                format::bytes(r.used_memory_bytes),
                format::growth(r.growth_bytes_per_s),
                format::num(r.sm_util_pct, 0, "%"),
            ];
            if wide {
                cells.push(
                    r.container_id
                        .as_deref()
                        .map_or_else(|| "-".to_owned(), |c| format::fit(c, 12)),
                );
            }
            Row::new(cells)
        })
        .collect();
    let table = Table::new(body, widths)
        .header(Row::new(header).style(t.title()))
        .block(block)
        .row_highlight_style(t.selected())
        .highlight_symbol("▶ ");
    let mut state =
        TableState::default().with_selected(Some(app.selected_process.min(rows.len() - 1)));
    f.render_stateful_widget(table, area, &mut state);
}
