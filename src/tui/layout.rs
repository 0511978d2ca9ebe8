//! Geometry shared by the boxes drawn over the panels (help, notices, a finding's details).

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
