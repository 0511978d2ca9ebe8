//! Text formatting shared by the panels. Every helper takes an `Option` and prints "n/a" for
//! `None`, so no panel can show 0 for a value that was never read.

use ratatui::style::Style;
use ratatui::text::{Line, Span};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

pub use crate::format::{clock, elapsed};

pub const NA: &str = "n/a";
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// A number with `decimals` places followed by `unit` ("97%", "655 W"), or "n/a".
pub fn num(v: Option<f64>, decimals: usize, unit: &str) -> String {
    v.map_or_else(|| NA.to_owned(), |v| format!("{v:.decimals$}{unit}"))
}

/// An integer such as a clock, or "n/a".
pub fn int<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| NA.to_owned(), |v| v.to_string())
}

/// Bytes in GiB with one decimal below 100 GiB and none above, or "n/a".
pub fn gib(bytes: Option<u64>) -> String {
    match bytes {
        None => NA.to_owned(),
        Some(b) => {
            let g = b as f64 / GIB;
            if g >= 100.0 {
                format!("{g:.0}")
            } else {
                format!("{g:.1}")
            }
        }
    }
}

/// Bytes in the largest unit that keeps the number readable: "1.2 GiB", "340 MiB".
pub fn bytes(b: Option<u64>) -> String {
    match b {
        None => NA.to_owned(),
        Some(b) if b as f64 >= GIB => format!("{:.1} GiB", b as f64 / GIB),
        Some(b) => format!("{:.0} MiB", b as f64 / MIB),
    }
}

/// A throughput in bytes per second, compact ("1.3G", "240M", "12K"), decimal units as PCIe
/// and the probes count them.
pub fn rate(v: Option<f64>) -> String {
    match v {
        None => NA.to_owned(),
        Some(b) if b >= 1e9 => format!("{:.1}G", b / 1e9),
        Some(b) if b >= 1e6 => format!("{:.0}M", b / 1e6),
        Some(b) if b >= 1e3 => format!("{:.0}K", b / 1e3),
        Some(b) => format!("{b:.0}B"),
    }
}

/// A signed growth rate in MiB/s ("+1.5 MiB/s"), or "n/a" while too few points exist.
pub fn growth(bytes_per_s: Option<f64>) -> String {
    match bytes_per_s {
        None => NA.to_owned(),
        Some(r) => format!("{:+.1} MiB/s", r / MIB),
    }
}

/// A text bar of `width` cells filled to `frac` (0..=1); an absent value gives a bar of dots,
/// which cannot be mistaken for an empty (0%) bar.
pub fn bar(frac: Option<f64>, width: usize) -> String {
    match frac {
        None => "·".repeat(width),
        Some(f) => {
            let filled = ((f.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
            format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
        }
    }
}

/// A string from a driver or a recording as the UI shows it: control characters as visible
/// escapes. The terminal library would drop them silently, turning `EVIL\x1b[2J` into
/// `EVIL[2J`, which hides that the name is not what it looks like.
pub fn text(s: &str) -> String {
    gpudiag_model::printable::line(s).into_owned()
}

/// `s` made printable (see [`text`]) and fitted to `width` terminal cells (see [`cut`]).
pub fn fit(s: &str, width: usize) -> String {
    let s = gpudiag_model::printable::line(s);
    if width == 0 {
        return String::new();
    }
    match cut(&s, width) {
        None => s.into_owned(),
        Some(keep) => format!("{}…", &s[..keep]),
    }
}

/// Cells `s` takes on a terminal: wide (CJK, emoji) characters take two, combining marks none.
pub fn width_of(s: &str) -> usize {
    UnicodeWidthStr::width(s)
}

/// Where to cut `s` so that what is kept and a closing "…" take at most `width` cells: the
/// byte length to keep, or `None` when `s` fits whole. Ratatui clips a line wider than its
/// area without a mark, so every text the TUI fits to a width goes through here, and a reader
/// can tell a cut value from a whole one. The cut falls on a word boundary when that gives up
/// little of the line (a word cut in half reads as a different word: "utilisation 3…" for 36%),
/// else on a character boundary; separators left dangling before the mark go too.
pub fn cut(s: &str, width: usize) -> Option<usize> {
    if width_of(s) <= width {
        return None;
    }
    let room = width.saturating_sub(1);
    let mut keep = 0;
    let mut used = 0;
    for (i, c) in s.char_indices() {
        let w = UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > room {
            break;
        }
        used += w;
        keep = i + c.len_utf8();
    }
    let at_word_end = s[keep..].starts_with(char::is_whitespace);
    if !at_word_end {
        // Back to the last space, if that gives up at most a fifth of the room (and no more
        // than a long word): a short fit is better cut mid-word than left nearly empty.
        if let Some(space) = s[..keep].rfind(char::is_whitespace) {
            let lost = width_of(&s[space..keep]);
            if lost <= (room / 5).min(16) {
                keep = space;
            }
        }
    }
    let kept = s[..keep].trim_end_matches(|c: char| c.is_whitespace() || ",;:(—·".contains(c));
    // Cutting to nothing but the mark would hide that there was text; keep the raw cut then.
    Some(if kept.is_empty() { keep } else { kept.len() })
}

/// `line` fitted to `width` cells like [`fit`], each span keeping its style; the "…" takes the
/// style of the text it follows. The spans' text must already be printable.
pub fn fit_line(line: Line<'static>, width: usize) -> Line<'static> {
    let whole: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
    let Some(mut keep) = cut(&whole, width) else {
        return line;
    };
    if width == 0 {
        return Line::default();
    }
    let Line {
        spans,
        style,
        alignment,
    } = line;
    let mut out = Vec::new();
    let mut last_style = Style::default();
    for span in spans {
        if keep == 0 {
            break;
        }
        let len = span.content.len();
        last_style = span.style;
        if len <= keep {
            keep -= len;
            out.push(span);
        } else {
            out.push(Span::styled(span.content[..keep].to_owned(), span.style));
            keep = 0;
        }
    }
    out.push(Span::styled("…", last_style));
    Line {
        spans: out,
        style,
        alignment,
    }
}

/// Word-wraps `s` into lines of at most `width` cells, each starting with `indent`; a word
/// longer than a line is split. Never loses text, unlike `fit`.
pub fn wrap(s: &str, width: usize, indent: &str) -> Vec<String> {
    let room = width.saturating_sub(width_of(indent)).max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut len = 0;
    for word in s.split_whitespace() {
        let mut word = word;
        loop {
            let gap = usize::from(len > 0);
            let w = width_of(word);
            if len + gap + w <= room {
                if gap == 1 {
                    line.push(' ');
                }
                line.push_str(word);
                len += gap + w;
                break;
            }
            if len > 0 {
                lines.push(format!("{indent}{line}"));
                line.clear();
                len = 0;
                continue;
            }
            // The longest head of the word that fits, at least one character.
            let mut used = 0;
            let mut at = 0;
            for (i, c) in word.char_indices() {
                let cw = UnicodeWidthChar::width(c).unwrap_or(0);
                if at > 0 && used + cw > room {
                    break;
                }
                used += cw;
                at = i + c.len_utf8();
            }
            lines.push(format!("{indent}{}", &word[..at]));
            word = &word[at..];
            if word.is_empty() {
                break;
            }
        }
    }
    if len > 0 || lines.is_empty() {
        lines.push(format!("{indent}{line}"));
    }
    lines
}

/// Pads or cuts `s` to exactly `width` cells.
pub fn pad(s: &str, width: usize) -> String {
    let s = fit(s, width);
    let gap = width.saturating_sub(width_of(&s));
    format!("{s}{}", " ".repeat(gap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_values_print_na_never_zero() {
        assert_eq!(num(None, 0, "%"), "n/a");
        assert_eq!(int::<u32>(None), "n/a");
        assert_eq!(gib(None), "n/a");
        assert_eq!(rate(None), "n/a");
        assert_eq!(growth(None), "n/a");
        assert_eq!(bar(None, 3), "···");
        assert_eq!(bar(Some(0.0), 3), "░░░");
        assert_eq!(num(Some(0.0), 0, "%"), "0%");
    }

    #[test]
    fn units() {
        assert_eq!(rate(Some(1.32e9)), "1.3G");
        assert_eq!(rate(Some(2.4e8)), "240M");
        assert_eq!(gib(Some(150_754_820_096)), "140");
        assert_eq!(bar(Some(0.5), 4), "██░░");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(pad("ab", 4), "ab  ");
    }

    #[test]
    fn cut_text_ends_in_a_mark_within_the_width() {
        // A word boundary when it gives up little, else mid-word; never a dangling separator.
        let title = "GPU 0 idle while holding memory over 30 s (utilisation 0.0%, no counters)";
        // At 60 the cut would split "0.0%": the number goes whole.
        assert_eq!(
            fit(title, 60),
            "GPU 0 idle while holding memory over 30 s (utilisation…"
        );
        assert_eq!(fit(title, 52), "GPU 0 idle while holding memory over 30 s…");
        assert_eq!(fit("abcdefghij klm", 8), "abcdefg…");
        // Display width, not characters: each CJK character takes two cells.
        let wide = "名前名前名前";
        assert_eq!(width_of(wide), 12);
        assert_eq!(fit(wide, 6), "名前…");
        assert_eq!(width_of(&fit(wide, 7)), 7);
        assert_eq!(pad("名前", 6), "名前  ");
        // Whole text is left alone; nothing but the mark fits in one cell.
        assert_eq!(fit(title, 200), title);
        assert_eq!(fit(title, 1), "…");
        assert_eq!(fit(title, 0), "");
    }

    #[test]
    fn a_fitted_line_keeps_its_styles_and_marks_the_cut() {
        use ratatui::style::Color;
        let red = Style::default().fg(Color::Red);
        let line = Line::from(vec![
            Span::styled("verdict GPU 0: underfilled", red),
            Span::raw(" (high) — utilisation 100%"),
        ]);
        let fitted = fit_line(line.clone(), 20);
        let text: String = fitted.spans.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "verdict GPU 0: unde…");
        assert!(fitted.spans.iter().all(|s| s.style == red), "{fitted:?}");
        let fitted = fit_line(line.clone(), 40);
        assert_eq!(fitted.spans.len(), 3);
        assert_eq!(fitted.spans[1].content, " (high)");
        assert_eq!(fitted.spans[2].content, "…");
        assert_eq!(fit_line(line.clone(), 80), line);
    }

    #[test]
    fn wrap_keeps_every_word_within_the_width() {
        let text = "Drain the node: stop jobs on this GPU, collect `gpudiag report`.";
        let lines = wrap(text, 20, "  ");
        assert!(lines.iter().all(|l| l.chars().count() <= 20), "{lines:?}");
        assert!(lines.iter().all(|l| l.starts_with("  ")), "{lines:?}");
        let joined: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        assert_eq!(joined.join(" "), text);
        // A word longer than the line is split rather than cut.
        assert_eq!(wrap("abcdefgh", 3, ""), ["abc", "def", "gh"]);
        assert_eq!(wrap("", 10, "  "), ["  "]);
        // Display width: three two-cell characters to a line of six.
        assert_eq!(
            wrap("名前名前名前名前", 6, ""),
            ["名前名", "前名前", "名前"]
        );
    }
}
