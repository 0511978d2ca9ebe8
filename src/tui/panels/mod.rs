//! One file per part of the screen. Panels read the `App` and draw; none of them asks whether
//! the data is live or recorded.

pub mod detail;
pub mod devices;
pub mod finding_detail;
pub mod findings;
pub mod header;
pub mod job;
pub mod overlay;
pub mod probes;
pub mod processes;
pub mod topology;
pub mod verdict;

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
