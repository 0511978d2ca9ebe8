//! Strings from recordings, bundles and drivers made safe to print on a terminal. A device name,
//! a process's command line or a finding carried by a recording is data anyone can write, and a
//! control character in it would reach the terminal as a command: ESC starts sequences that
//! clear the screen or set the window title, CR and LF forge lines of output. Every view that
//! writes such a string to a terminal passes it through here; JSON output needs nothing, since
//! JSON escapes control characters itself.
//!
//! Control characters (C0 with CR, LF and ESC, DEL, and C1) become visible escapes: `\x1b` for
//! C0 and DEL, `\u{9b}` for C1 (whose code points are not bytes in UTF-8). Everything else,
//! ordinary Unicode included, is kept.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` as part of one line: every control character escaped, newlines too.
pub fn line(s: &str) -> Cow<'_, str> {
    escape(s, |_| true)
}

/// `message` as gpudiag writes an error to stderr: each line prefixed `gpudiag: ` and escaped
/// on its own, ending in a newline. A message of several lines (a TOML error's source line and
/// caret) keeps them, aligned as written, and a quoted value still cannot forge a line: only
/// the message's own newlines start one, each with the prefix.
pub fn error_lines(message: &str) -> String {
    let mut out = String::with_capacity(message.len() + 16);
    for l in message.trim_end_matches(['\n', '\r']).split('\n') {
        let _ = writeln!(out, "gpudiag: {}", line(l.strip_suffix('\r').unwrap_or(l)));
    }
    out
}

/// `s` as lines of text: every control character escaped but the newlines between lines. For
/// whole outputs whose values were each made safe with [`line`].
pub fn text(s: &str) -> Cow<'_, str> {
    escape(s, |c| c != '\n')
}

fn escape(s: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && escaped(c);
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !unsafe_char(c) {
            out.push(c);
        } else if u32::from(c) < 0x80 {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_visible_escapes() {
        assert_eq!(
            line("EVIL\x1b]0;pwned\x07\x1b[2J"),
            "EVIL\\x1b]0;pwned\\x07\\x1b[2J"
        );
        assert_eq!(
            line("proc\r\nFAKE [fail]\t\x7f\u{9b}2J"),
            "proc\\x0d\\x0aFAKE [fail]\\x09\\x7f\\u{9b}2J"
        );
        assert_eq!(text("a\x1b[2J\nb\r\n"), "a\\x1b[2J\nb\\x0d\n");
    }

    #[test]
    fn error_lines_prefix_and_escape_each_line() {
        assert_eq!(error_lines("no GPU"), "gpudiag: no GPU\n");
        assert_eq!(
            error_lines("bad at line 1\n  |\n1 | [x\x1b[2J\n  |   ^\n"),
            "gpudiag: bad at line 1\ngpudiag:   |\ngpudiag: 1 | [x\\x1b[2J\ngpudiag:   |   ^\n"
        );
        assert_eq!(
            error_lines("crlf\r\nnext"),
            "gpudiag: crlf\ngpudiag: next\n"
        );
    }

    #[test]
    fn ordinary_text_and_unicode_are_kept_as_they_are() {
        for s in [
            "NVIDIA H200",
            "temp 42 °C · Gen5 — ok",
            "日本語 ü é",
            "a\\x1b",
        ] {
            assert!(matches!(line(s), Cow::Borrowed(b) if b == s), "{s}");
        }
        assert!(matches!(text("two\nlines\n"), Cow::Borrowed(_)));
    }
}
