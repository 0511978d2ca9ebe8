//! Boxes over the panels: the key help (?) and the kill confirmation.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Wrap};

use crate::tui::app::{App, KillSignal};
use crate::tui::layout::centered;
use crate::tui::theme::Theme;

/// Key, what it does. Each line fits the box on an 80x24 terminal (`tests/tui.rs` renders it
/// there and checks every line whole).
pub const KEYS: [(&str, &str); 19] = [
    ("q  Ctrl-C", "quit"),
    ("?  F1", "this help (any key closes it)"),
    ("Tab  Shift-Tab", "next / previous panel"),
    (
        "1-7",
        "Devices Detail Processes Findings Probes Topology Job",
    ),
    ("mouse", "click a tab; wheel moves the selection"),
    (
        "↑ ↓  PgUp PgDn",
        "select device, process, finding, suite, job",
    ),
    ("Enter", "device detail; a finding's evidence and advice"),
    ("Enter", "in Probes: run the picked suite"),
    ("f", "in Probes: probe a busy GPU anyway (asks first)"),
    ("Esc", "close a box, cancel"),
    ("space  p", "pause / resume"),
    ("z  Z", "zoom charts: 1m 5m 15m 1h"),
    ("s", "sort processes: memory, growth, SM, PID"),
    ("j", "job: its GPUs side by side, the straggler marked"),
    ("k", "kill the selected process (asks first)"),
    ("w", "save this session as a recording (.ndjson.gz)"),
    ("K", "kernels, copies, syncs of a run --kernels recording"),
    (
        "← →  + -",
        "replay: seek 10 s (Shift: 60 s); faster, slower",
    ),
    ("", "absent values show n/a, never 0"),
];

/// Width of the key column: the longest key.
const KEY_WIDTH: usize = 14;

pub fn help(f: &mut Frame, area: Rect, app: &App) {
    key_help(f, area, &KEYS, app.theme);
}

/// A box of keys and what each does, centred over `area`; the fleet's UI shows its own list.
pub fn key_help(f: &mut Frame, area: Rect, keys: &[(&str, &str)], t: Theme) {
    let lines: Vec<Line> = keys
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:>KEY_WIDTH$}  "), t.title()),
                Span::raw(*what),
            ])
        })
        .collect();
    // As wide as the longest line, its margins and borders, so nothing is cut at 80 columns.
    let widest = keys
        .iter()
        .map(|(_, what)| KEY_WIDTH + 2 + what.chars().count())
        .max()
        .unwrap_or(0);
    let width = u16::try_from(widest + 4).unwrap_or(u16::MAX);
    let rect = centered(area, width, keys.len() as u16 + 2);
    f.render_widget(Clear, rect);
    f.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .title(" Keys ")
                .padding(Padding::horizontal(1)),
        ),
        rect,
    );
}

pub fn confirm_kill(
    f: &mut Frame,
    area: Rect,
    app: &App,
    pid: u32,
    name: &str,
    signal: KillSignal,
) {
    let t = app.theme;
    let text = vec![
        Line::from(Span::styled(
            format!(
                "Send {} to PID {pid} ({})?",
                signal.name(),
                crate::tui::format::text(name)
            ),
            t.warn(),
        )),
        Line::from(""),
        Line::from("y: send it    any other key: cancel"),
    ];
    let rect = centered(area, 56, 5);
    f.render_widget(Clear, rect);
    f.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(" Kill ")),
        rect,
    );
}
