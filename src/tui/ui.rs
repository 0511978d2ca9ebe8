//! Screen layout: header, tab bar, the current panel, a footer line, and overlays on top.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::app::{App, Overlay, Panel, SourceKind};
use super::panels;

/// Rows above the tab bar (the header), so a mouse click can be matched to a tab.
pub const HEADER_ROWS: u16 = 3;
/// Below this the layout cannot hold a device row and a chart; the UI says so instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

pub fn draw(f: &mut Frame, app: &App) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "gpudiag needs at least {MIN_WIDTH}x{MIN_HEIGHT}; this terminal is {}x{}. q quits.",
            area.width, area.height
        );
        f.render_widget(
            Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }),
            area,
        );
        return;
    }
    let [header, tabs, body, footer] = Layout::vertical([
        Constraint::Length(HEADER_ROWS),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    panels::header::render(f, header, app);
    f.render_widget(
        super::format::fit_line(tab_line(app), tabs.width as usize),
        tabs,
    );
    match app.panel {
        Panel::Devices => panels::devices::render_screen(f, body, app),
        Panel::Detail => panels::detail::render(f, body, app),
        Panel::Processes => panels::processes::render(f, body, app),
        Panel::Findings => panels::findings::render(f, body, app),
        Panel::Probes => panels::probes::render(f, body, app),
        Panel::Topology => panels::topology::render(f, body, app),
    }
    f.render_widget(footer_line(app, footer.width), footer);
    match &app.overlay {
        Some(Overlay::Help) => panels::overlay::help(f, area, app),
        Some(Overlay::ConfirmKill { pid, name, signal }) => {
            panels::overlay::confirm_kill(f, area, app, *pid, name, *signal)
        }
        Some(Overlay::Finding { finding, scroll }) => {
            let view = panels::finding_detail::View {
                theme: app.theme,
                devices: &app.devices,
            };
            panels::finding_detail::detail(f, area, view, finding, *scroll)
        }
        None => {}
    }
}

/// A tab's text; the current one is bracketed so it shows without colour or reverse video
/// (NO_COLOR, text captures). Both forms have the same width, which `tab_at` relies on.
fn tab_label(i: usize, p: Panel, current: bool) -> String {
    if current {
        format!("[{} {}]", i + 1, p.title())
    } else {
        format!(" {} {} ", i + 1, p.title())
    }
}

fn tab_line(app: &App) -> Line<'static> {
    let t = app.theme;
    let mut spans = Vec::new();
    for (i, p) in Panel::ALL.iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled("│", t.dim()));
        }
        let style = if *p == app.panel {
            t.selected().patch(t.title())
        } else {
            ratatui::style::Style::default()
        };
        spans.push(Span::styled(tab_label(i, *p, *p == app.panel), style));
    }
    Line::from(spans)
}

/// The panel whose tab is at (`col`, `row`), for mouse clicks.
pub fn tab_at(width: u16, col: u16, row: u16) -> Option<Panel> {
    if row != HEADER_ROWS || width < MIN_WIDTH {
        return None;
    }
    let mut x = 0u16;
    for (i, p) in Panel::ALL.iter().enumerate() {
        let len = tab_label(i, *p, false).chars().count() as u16;
        if col >= x && col < x + len {
            return Some(*p);
        }
        x += len + 1;
    }
    None
}

fn footer_line(app: &App, width: u16) -> Line<'static> {
    let t = app.theme;
    if let Some(s) = &app.status {
        return Line::from(Span::styled(
            super::format::fit(s, width as usize),
            t.warn(),
        ));
    }
    let mut hints = String::from("?:help q:quit Tab:panel ↑↓:select space:pause z:zoom");
    if matches!(app.source, SourceKind::Replay { .. }) {
        hints.push_str(" ←→:seek +-:speed");
    }
    hints.push_str(" w:save");
    Line::from(Span::styled(
        super::format::fit(&hints, width as usize),
        t.dim(),
    ))
}
