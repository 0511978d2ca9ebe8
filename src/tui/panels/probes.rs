//! Probes: where a probe runner shows suites, progress and verdicts. This build has no probe
//! runner, so the panel says so rather than showing anything made up.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};

use crate::tui::app::{App, ProbesState};

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let block = Block::bordered().title(Span::styled(" Probes ", t.title()));
    let lines = match app.probes {
        ProbesState::NotInThisBuild => vec![
            Line::from(Span::styled(
                "Probes are not available in this build yet.",
                t.warn(),
            )),
            Line::from(""),
            Line::from(
                "When they land, this panel picks a suite (quick, standard, full) or one probe \
                 (bandwidth, matmul, memory, latency, p2p), runs it while telemetry keeps \
                 updating, and shows results against the reference with verdicts.",
            ),
        ],
    };
    f.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(block),
        area,
    );
}
