//! Strings from recordings, bundles and drivers made safe to print on a terminal. A device name,
//! a process's command line or a finding carried by a recording is data anyone can write, and a
//! control character in it would reach the terminal as a command: ESC starts sequences that
//! clear the screen or set the window title, CR and LF forge lines of output. Every view that
//! writes such a string to a terminal passes it through here; JSON output needs nothing, since
//! JSON escapes control characters itself.
//!
//! Control characters (C0 with CR, LF and ESC, DEL, and C1) become visible escapes: `\x1b` for
//! C0 and DEL, `\u{9b}` for C1 (whose code points are not bytes in UTF-8); so do the
//! bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069), which reorder what a
//! terminal shows after them (a label that reads backwards). Everything else, ordinary Unicode
//! included, is kept.
//!
//! JSON escapes C0 itself but not C1: serde_json writes U+0080-U+009F as they are, and a
//! terminal that `cat`s the JSON reads U+009B as CSI. [`json_c1`] and [`JsonC1`] escape them.

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

/// A bidirectional override or isolate: shown as nothing, it reorders the text after it.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(s: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| (c.is_control() || is_bidi_control(c)) && escaped(c);
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

fn is_c1(c: char) -> bool {
    matches!(c, '\u{80}'..='\u{9f}')
}

/// JSON text with every C1 control written as a `\u00XX` escape (the same string to a JSON
/// reader). C1 occurs only inside JSON strings, so no other text is touched.
pub fn json_c1(json: String) -> String {
    if !json.chars().any(is_c1) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_c1(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// [`json_c1`] for JSON written as a stream (a trace of many MB is not held twice). In UTF-8 a
/// C1 control is 0xC2 followed by 0x80-0x9F, and 0xC2 is only ever a lead byte, so the bytes
/// can be rewritten as they pass; a 0xC2 at the end of one write waits for the next.
pub struct JsonC1<W: std::io::Write> {
    inner: W,
    lead_pending: bool,
}

impl<W: std::io::Write> JsonC1<W> {
    pub fn new(inner: W) -> Self {
        JsonC1 {
            inner,
            lead_pending: false,
        }
    }
}

impl<W: std::io::Write> std::io::Write for JsonC1<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        if self.lead_pending {
            let Some(&next) = rest.first() else {
                return Ok(0);
            };
            if (0x80..=0x9f).contains(&next) {
                self.inner.write_all(format!("\\u{next:04x}").as_bytes())?;
                rest = &rest[1..];
            } else {
                self.inner.write_all(&[0xc2])?;
            }
            self.lead_pending = false;
        }
        while !rest.is_empty() {
            let Some(at) = rest.iter().position(|&b| b == 0xc2) else {
                self.inner.write_all(rest)?;
                break;
            };
            self.inner.write_all(&rest[..at])?;
            match rest.get(at + 1) {
                Some(&next) if (0x80..=0x9f).contains(&next) => {
                    self.inner.write_all(format!("\\u{next:04x}").as_bytes())?;
                    rest = &rest[at + 2..];
                }
                Some(_) => {
                    self.inner.write_all(&[0xc2])?;
                    rest = &rest[at + 1..];
                }
                None => {
                    self.lead_pending = true;
                    rest = &[];
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.lead_pending {
            self.lead_pending = false;
            self.inner.write_all(&[0xc2])?;
        }
        self.inner.flush()
    }
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
    fn bidirectional_overrides_are_escaped() {
        assert_eq!(line("gpu\u{202e}0-UPG"), "gpu\\u{202e}0-UPG");
        assert_eq!(line("\u{2066}x\u{2069} é 中"), "\\u{2066}x\\u{2069} é 中");
    }

    #[test]
    fn c1_controls_in_json_become_escapes_a_json_reader_reads_back() {
        let value = serde_json::json!({"name": "a\u{9b}2J\u{85}b é"});
        let raw = serde_json::to_string(&value).unwrap();
        assert!(raw.contains('\u{9b}'), "serde_json leaves C1 as it is");
        let safe = json_c1(raw.clone());
        assert!(!safe.chars().any(is_c1), "{safe}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&safe).unwrap(),
            value
        );
        // Streamed a byte at a time, the lead byte split from its follower every time.
        let mut out = JsonC1::new(Vec::new());
        for b in raw.as_bytes() {
            std::io::Write::write_all(&mut out, std::slice::from_ref(b)).unwrap();
        }
        std::io::Write::flush(&mut out).unwrap();
        assert_eq!(String::from_utf8(out.inner).unwrap(), safe);
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
