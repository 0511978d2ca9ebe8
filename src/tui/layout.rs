//! Geometry and scrolling shared by the boxes drawn over the panels (help, notices, a finding's
//! details, the kernels).

use ratatui::layout::Rect;

/// A rectangle of at most `w`x`h` centred in `area`.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

/// How far `lines` can scroll in a bordered box drawn at `rect`.
pub fn scroll_max(rect: Rect, lines: usize) -> u16 {
    let inner = ratatui::widgets::Block::bordered().inner(rect);
    u16::try_from(lines.saturating_sub(usize::from(inner.height))).unwrap_or(u16::MAX)
}

/// A bordered box of `lines` over whatever is at `rect`, scrolled down `scroll` lines (at most
/// as far as they go), saying where it stands at its foot when they do not all fit.
pub fn scroll_box(
    f: &mut ratatui::Frame,
    rect: Rect,
    title: ratatui::text::Span<'static>,
    lines: Vec<ratatui::text::Line<'static>>,
    scroll: u16,
) {
    use ratatui::widgets::{Block, Clear, Paragraph};
    let max = scroll_max(rect, lines.len());
    let block = Block::bordered().title(title);
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

/// What a key does to a scrolling box: closes it, quits, or moves it to a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxKey {
    Close,
    Quit,
    ScrollTo(u16),
}

/// The keys a scrolling box reads; any other leaves it where it is (it is being read).
pub fn box_key(code: crossterm::event::KeyCode, scroll: u16, max: u16) -> BoxKey {
    use crossterm::event::KeyCode;
    BoxKey::ScrollTo(match code {
        KeyCode::Esc | KeyCode::Enter | KeyCode::Backspace => return BoxKey::Close,
        KeyCode::Char('q') => return BoxKey::Quit,
        KeyCode::Up => scroll.saturating_sub(1),
        KeyCode::Down => scroll.saturating_add(1).min(max),
        KeyCode::PageUp => scroll.saturating_sub(10),
        KeyCode::PageDown => scroll.saturating_add(10).min(max),
        KeyCode::Home => 0,
        KeyCode::End => max,
        _ => scroll,
    })
}
