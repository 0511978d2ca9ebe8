//! The kernels a recording of `gpudiag run --kernels --record` carries (K): per GPU the time
//! split, the top kernels and copies, each process's waits and what the collector said, as
//! `run` prints them at the end, scrollable. The latest summary the replay has reached: every
//! 10 s of the run, then the run's own when the command ended. Live GPUs have none: the
//! collector reports to the `run` that loaded it. Beside the panels, as the finding box is.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};

use super::layout::centered;
use crate::tui::format;
use crate::tui::theme::Theme;
use gpudiag_model::kernels::RecordedKernels;

/// Where the box opens (at most 140 columns: a top kernel's line is long) and its lines,
/// wrapped to fit.
fn layout(kernels: Option<&RecordedKernels>, area: Rect) -> (Rect, Vec<Line<'static>>) {
    let width = area.width.saturating_sub(4).min(140);
    let lines = lines(kernels, usize::from(width.saturating_sub(2)));
    let height = u16::try_from(lines.len() + 2)
        .unwrap_or(u16::MAX)
        .min(area.height.saturating_sub(2));
    (centered(area, width, height), lines)
}

/// The summary as `run` prints it, without its `gpudiag:` prefixes; a line too long for
/// `width` is wrapped under its own indent.
pub fn lines(kernels: Option<&RecordedKernels>, width: usize) -> Vec<Line<'static>> {
    let Some(k) = kernels else {
        return format::wrap(
            "No kernel records here. `gpudiag run --kernels --record FILE -- CMD` records the \
             kernels, copies and synchronisations of CMD's CUDA processes into FILE with the \
             telemetry; replay FILE (`gpudiag replay FILE`) to see them here, as the run went.",
            width,
            "",
        )
        .into_iter()
        .map(Line::from)
        .collect();
    };
    let when = if k.ended {
        "the whole run".to_owned()
    } else {
        format!("the run so far, at {} UTC", format::clock(k.time_ms))
    };
    let mut out = vec![
        Line::from(Span::raw(format!("Recorded over {when}:"))),
        Line::from(""),
    ];
    for line in crate::kernels_text::kernels_section(&k.summary).lines() {
        let line = line.strip_prefix("gpudiag: ").unwrap_or(line);
        if format::width_of(line) <= width {
            out.push(Line::from(line.to_owned()));
            continue;
        }
        let indent = " ".repeat(line.len() - line.trim_start().len() + 2);
        let mut wrapped = format::wrap(line, width, &indent).into_iter();
        if let Some(first) = wrapped.next() {
            // The first line keeps the original's own indent.
            let own = &indent[..indent.len() - 2];
            out.push(Line::from(format!("{own}{}", first.trim_start())));
        }
        out.extend(wrapped.map(Line::from));
    }
    out
}

/// How far the box can scroll on a terminal of `viewport` (width, height).
pub fn scroll_max(kernels: Option<&RecordedKernels>, viewport: (u16, u16)) -> u16 {
    let (rect, lines) = layout(kernels, Rect::new(0, 0, viewport.0, viewport.1));
    super::layout::scroll_max(rect, lines.len())
}

/// The box over the panels, scrolled down by `scroll` lines.
pub fn draw(
    f: &mut Frame,
    area: Rect,
    theme: Theme,
    kernels: Option<&RecordedKernels>,
    scroll: u16,
) {
    let (rect, lines) = layout(kernels, area);
    let title = Span::styled(
        " Kernels (run --kernels) · ↑↓ PgUp PgDn scroll · Esc closes ",
        theme.title(),
    );
    super::layout::scroll_box(f, rect, title, lines, scroll);
}
