//! Screen layout: header, tab bar, the current panel, a footer line, and overlays on top.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::app::{App, Overlay, Panel, SourceKind};
use super::panels;

/// Rows above the tab bar (the header) without a job; a job adds one (`header_rows`).
pub const HEADER_ROWS: u16 = 3;
/// Below this the layout cannot hold a device row and a chart; the UI says so instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

/// Rows above the tab bar now, so a mouse click can be matched to a tab: one more where the
/// header has a line for jobs.
pub fn header_rows(app: &App) -> u16 {
    HEADER_ROWS + u16::from(panels::job::has_header_line(app))
}

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
    // The opening notice gets rows of its own, wrapped whole (up to a quarter of the screen),
    // so the key hints stay.
    let notice = app.current_notice().map(|text| {
        let lines = wrapped_lines(&super::format::text(text), area.width);
        (text, lines.min((area.height / 4).max(3)))
    });
    let [header, tabs, body, notice_area, footer] = Layout::vertical([
        Constraint::Length(header_rows(app)),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(notice.map_or(0, |(_, rows)| rows)),
        Constraint::Length(1),
    ])
    .areas(area);
    panels::header::render(f, header, app);
    f.render_widget(
        super::format::fit_line(tab_line(app, tabs.width), tabs.width as usize),
        tabs,
    );
    match app.panel {
        Panel::Devices => panels::devices::render_screen(f, body, app),
        Panel::Detail => panels::detail::render(f, body, app),
        Panel::Processes => panels::processes::render(f, body, app),
        Panel::Findings => panels::findings::render(f, body, app),
        Panel::Probes => panels::probes::render(f, body, app),
        Panel::Topology => panels::topology::render(f, body, app),
        Panel::Job => panels::job::render(f, body, app),
    }
    if let Some((text, _)) = notice {
        f.render_widget(
            Paragraph::new(super::format::text(text))
                .style(app.theme.warn())
                .wrap(ratatui::widgets::Wrap { trim: true }),
            notice_area,
        );
    }
    f.render_widget(footer_line(app, footer.width), footer);
    match &app.overlay {
        Some(Overlay::Help) => panels::overlay::help(f, area, app),
        Some(Overlay::ConfirmKill { pid, name, signal }) => {
            panels::overlay::confirm_kill(f, area, app, *pid, name, *signal)
        }
        Some(Overlay::Finding { finding, scroll }) => {
            let view = super::finding_detail::View {
                theme: app.theme,
                devices: &app.devices,
            };
            super::finding_detail::detail(f, area, view, finding, *scroll)
        }
        Some(Overlay::Kernels { scroll }) => {
            super::kernels_box::draw(f, area, app.theme, app.kernels(), *scroll)
        }
        None => {}
    }
}

/// A tab's text; the current one is bracketed so it shows without colour or reverse video
/// (NO_COLOR, text captures). Both forms have the same width, which `tab_at` relies on.
fn tab_label(i: usize, p: Panel, current: bool, short: bool) -> String {
    let title = if short { p.short_title() } else { p.title() };
    if current {
        format!("[{} {title}]", i + 1)
    } else {
        format!(" {} {title} ", i + 1)
    }
}

/// Whether the tabs take their short titles: every full one does not fit `width`.
fn short_tabs(width: u16) -> bool {
    let full: usize = Panel::ALL
        .iter()
        .enumerate()
        .map(|(i, p)| tab_label(i, *p, false, false).chars().count() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    full > usize::from(width)
}

fn tab_line(app: &App, width: u16) -> Line<'static> {
    let t = app.theme;
    let short = short_tabs(width);
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
        spans.push(Span::styled(
            tab_label(i, *p, *p == app.panel, short),
            style,
        ));
    }
    Line::from(spans)
}

/// The panel whose tab is at (`col`, `row`) under a header of `header_rows`, for mouse clicks.
pub fn tab_at(width: u16, header_rows: u16, col: u16, row: u16) -> Option<Panel> {
    if row != header_rows || width < MIN_WIDTH {
        return None;
    }
    let short = short_tabs(width);
    let mut x = 0u16;
    for (i, p) in Panel::ALL.iter().enumerate() {
        let len = tab_label(i, *p, false, short).chars().count() as u16;
        if col >= x && col < x + len {
            return Some(*p);
        }
        x += len + 1;
    }
    None
}

/// How many rows `text` takes wrapped at word boundaries in `width` columns.
fn wrapped_lines(text: &str, width: u16) -> u16 {
    let width = usize::from(width.max(1));
    let mut lines = 1u16;
    let mut used = 0usize;
    for word in text.split_whitespace() {
        let w = super::format::width_of(word);
        if used > 0 && used + 1 + w > width {
            lines = lines.saturating_add(1);
            used = w.min(width);
        } else {
            used += if used > 0 { 1 } else { 0 } + w;
        }
        // A word longer than the line spills over whole lines.
        while used > width {
            lines = lines.saturating_add(1);
            used -= width;
        }
    }
    lines
}

fn footer_line(app: &App, width: u16) -> Line<'static> {
    let t = app.theme;
    if let Some(s) = &app.status {
        return Line::from(Span::styled(
            super::format::fit(s, width as usize),
            t.warn(),
        ));
    }
    let replay = matches!(app.source, SourceKind::Replay { .. });
    let job = !app.jobs.is_empty() || !app.jobs_not_judged.is_empty();
    // (hint, shown, priority: the first to go where they do not all fit).
    let hints = [
        ("?:help", true, 9),
        ("q:quit", true, 9),
        ("Tab:panel", true, 8),
        ("↑↓:select", true, 3),
        ("space:pause", true, 5),
        ("z:zoom", true, 1),
        ("j:job", job, 6),
        ("K:kernels", app.kernels().is_some(), 6),
        ("←→:seek", replay, 4),
        ("+-:speed", replay, 2),
        ("w:save", true, 2),
    ];
    let mut shown: Vec<(&str, u8)> = hints
        .iter()
        .filter(|(_, on, _)| *on)
        .map(|(h, _, p)| (*h, *p))
        .collect();
    let text = |shown: &[(&str, u8)]| shown.iter().map(|(h, _)| *h).collect::<Vec<_>>().join(" ");
    // Whole hints go, the least needed first, rather than the last one cut in half.
    while shown.len() > 2 && super::format::width_of(&text(&shown)) > usize::from(width) {
        let Some(least) = shown
            .iter()
            .enumerate()
            .rev()
            .min_by_key(|(_, (_, p))| *p)
            .map(|(i, _)| i)
        else {
            break;
        };
        shown.remove(least);
    }
    Line::from(Span::styled(
        super::format::fit(&text(&shown), width as usize),
        t.dim(),
    ))
}
