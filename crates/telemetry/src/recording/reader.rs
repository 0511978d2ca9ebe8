//! Reading a recording. A recording is a file a user hands us, so it is treated as hostile: lines
//! are read with a hard length limit, and bad input is an error naming the line, never a panic.
//! What a killed writer leaves (a cut-off last line, a gzip stream without its trailer) is
//! tolerated and reported in [`ReadStats`], and kinds from newer writers are skipped and counted.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;
use serde::Deserialize;
use serde_json::Value;

use super::{
    FORMAT_NAME, Header, MAX_LINE_BYTES, RECORDING_VERSION, Record, RecordingError, STREAM_NAME,
};
use crate::HostInfo;

/// How many distinct unknown kinds [`ReadStats`] remembers by name (the count is exact).
const MAX_UNKNOWN_KIND_NAMES: usize = 16;
/// Event sub-kinds this build knows (`EventKind`'s tags). An `event` line with another tag comes
/// from a newer writer and is skipped like an unknown kind rather than failing the whole file.
const KNOWN_EVENT_KINDS: [&str; 3] = ["xid", "device_lost", "notice"];

/// What a reader noticed besides the records themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Lines read, the header included.
    pub lines: u64,
    /// Records returned.
    pub records: u64,
    /// Lines of a kind this build does not know, skipped.
    pub skipped_unknown: u64,
    /// The names of the skipped kinds (at most 16 distinct; event sub-kinds as `event:NAME`).
    pub unknown_kinds: BTreeSet<String>,
    /// The last line had no newline and did not parse: the writer stopped mid-line.
    pub truncated_last_line: bool,
    /// The input was gzip.
    pub gzip: bool,
    /// The gzip stream ended without its trailer: the writer never finished the file.
    pub gzip_unfinished: bool,
}

impl ReadStats {
    /// Whether the recording ended abruptly (a crash or kill while recording).
    pub fn is_truncated(&self) -> bool {
        self.truncated_last_line || self.gzip_unfinished
    }

    /// One-line notes worth showing a user; empty when the file was read cleanly.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.truncated_last_line {
            out.push(
                "the last line was cut off (the recorder stopped mid-write); it was ignored"
                    .to_string(),
            );
        }
        if self.gzip_unfinished {
            out.push(
                "the gzip stream ends abruptly (the recorder never finished the file); \
                 everything up to the cut was read"
                    .to_string(),
            );
        }
        if self.skipped_unknown > 0 {
            let kinds: Vec<&str> = self.unknown_kinds.iter().map(String::as_str).collect();
            out.push(format!(
                "skipped {} record(s) of kinds this gpudiag does not know ({}); a newer gpudiag \
                 can show them",
                self.skipped_unknown,
                kinds.join(", ")
            ));
        }
        out
    }
}

/// The input after gzip detection; `BufRead` so lines can be read with a bound.
type Input = Box<dyn BufRead + Send>;

/// What reading one raw line produced.
enum RawLine {
    /// End of input; nothing was read.
    Eof,
    /// A line is in the buffer; `terminated` is false when input ended before its newline.
    Line { terminated: bool },
}

/// Reads a recording: the header at open, then one record per call.
pub struct RecordingReader {
    input: Input,
    header: Header,
    stats: ReadStats,
    path: String,
    line: u64,
    buf: Vec<u8>,
    done: bool,
}

impl std::fmt::Debug for RecordingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingReader")
            .field("path", &self.path)
            .field("line", &self.line)
            .field("stats", &self.stats)
            .finish()
    }
}

impl RecordingReader {
    /// Opens a recording, plain or gzip (detected by its magic bytes, not its name), and reads
    /// the header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RecordingError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| RecordingError::Io {
            op: "open",
            path: name.clone(),
            source,
        })?;
        Self::from_reader_named(file, &name)
    }

    /// Reads a recording from any reader; plain or gzip is detected from the first bytes.
    pub fn from_reader(reader: impl Read + Send + 'static) -> Result<Self, RecordingError> {
        Self::from_reader_named(reader, STREAM_NAME)
    }

    /// As [`from_reader`](Self::from_reader), with `name` used in error messages.
    pub fn from_reader_named(
        reader: impl Read + Send + 'static,
        name: &str,
    ) -> Result<Self, RecordingError> {
        let mut reader = reader;
        let magic = read_prefix(&mut reader, 2).map_err(|source| RecordingError::Read {
            path: name.to_string(),
            line: 1,
            source,
        })?;
        let gzip = magic == [0x1f, 0x8b];
        // Put the peeked bytes back in front of the rest.
        let reader = io::Cursor::new(magic).chain(reader);
        let input: Input = if gzip {
            Box::new(BufReader::new(GzDecoder::new(reader)))
        } else {
            Box::new(BufReader::new(reader))
        };
        let mut r = RecordingReader {
            input,
            header: Header::new("", HostInfo::default(), Vec::new(), None),
            stats: ReadStats {
                gzip,
                ..ReadStats::default()
            },
            path: name.to_string(),
            line: 0,
            buf: Vec::new(),
            done: false,
        };
        r.header = r.read_header()?;
        Ok(r)
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// The number of the line last read (1 is the header).
    pub fn line_number(&self) -> u64 {
        self.line
    }

    /// Consumes the reader, returning the header and what was noticed while reading.
    pub fn into_parts(self) -> (Header, ReadStats) {
        (self.header, self.stats)
    }

    /// The next record; `Ok(None)` at the end. After an error about one line (malformed JSON,
    /// invalid UTF-8, too long) the caller may call again to go on with the next line.
    pub fn next_record(&mut self) -> Result<Option<Record>, RecordingError> {
        loop {
            let terminated = match self.read_raw_line()? {
                RawLine::Eof => return Ok(None),
                RawLine::Line { terminated } => terminated,
            };
            let parsed = self.parse_line(terminated);
            self.release_big_buffer();
            if let Some(record) = parsed? {
                self.stats.records += 1;
                return Ok(Some(record));
            }
        }
    }

    fn read_header(&mut self) -> Result<Header, RecordingError> {
        let not_a_recording = |path: &str, reason: &str| RecordingError::NotARecording {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        let raw = match self.read_raw_line() {
            Ok(raw) => raw,
            Err(RecordingError::LineTooLong { .. }) => {
                return Err(not_a_recording(
                    &self.path,
                    "its first line is longer than any recording header",
                ));
            }
            Err(e) => return Err(e),
        };
        if matches!(raw, RawLine::Eof) {
            return Err(not_a_recording(&self.path, "it is empty (no header line)"));
        }
        let Ok(text) = std::str::from_utf8(&self.buf) else {
            return Err(not_a_recording(
                &self.path,
                "its first line is not UTF-8 text",
            ));
        };
        let Ok(value) = serde_json::from_str::<Value>(text) else {
            return Err(not_a_recording(&self.path, "its first line is not JSON"));
        };
        let Value::Object(map) = value else {
            return Err(not_a_recording(
                &self.path,
                "its first line is not a JSON object",
            ));
        };
        match map.get("format") {
            Some(Value::String(f)) if f == FORMAT_NAME => {}
            _ => {
                let reason = match map.get("kind").and_then(Value::as_str) {
                    Some(kind) if kind != "header" => format!(
                        "line 1 is a {kind:?} record; the header (\"format\": \"{FORMAT_NAME}\") \
                         is missing"
                    ),
                    _ => format!("line 1 has no \"format\": \"{FORMAT_NAME}\""),
                };
                return Err(not_a_recording(&self.path, &reason));
            }
        }
        let version = match map.get("version").and_then(Value::as_u64) {
            Some(v) if v >= 1 => v,
            _ => {
                return Err(not_a_recording(
                    &self.path,
                    "the header has no valid \"version\"",
                ));
            }
        };
        if version > u64::from(RECORDING_VERSION) {
            return Err(RecordingError::UnsupportedVersion {
                found: version,
                supported: RECORDING_VERSION,
            });
        }
        let header =
            Header::deserialize(Value::Object(map)).map_err(|e| RecordingError::InvalidRecord {
                path: self.path.clone(),
                line: 1,
                kind: "header".to_string(),
                message: e.to_string(),
            })?;
        self.release_big_buffer();
        Ok(header)
    }

    /// Reads one line into `self.buf` (newline stripped), never more than the line limit.
    fn read_raw_line(&mut self) -> Result<RawLine, RecordingError> {
        self.buf.clear();
        if self.done {
            return Ok(RawLine::Eof);
        }
        let line = self.line + 1;
        // One byte over the limit is enough to tell "too long" from "exactly at the limit".
        let cap = MAX_LINE_BYTES as u64 + 1;
        let result = (&mut self.input).take(cap).read_until(b'\n', &mut self.buf);
        let n = match result {
            Ok(n) => n,
            // A gzip stream cut short (the writer was killed) ends in UnexpectedEof once the
            // decoder runs out of input; what came before it decoded fine, so treat it as the end.
            Err(e) if self.stats.gzip && e.kind() == io::ErrorKind::UnexpectedEof => {
                self.stats.gzip_unfinished = true;
                self.done = true;
                self.buf.len()
            }
            Err(source) => {
                self.done = true;
                return Err(RecordingError::Read {
                    path: self.path.clone(),
                    line,
                    source,
                });
            }
        };
        if n == 0 {
            self.done = true;
            return Ok(RawLine::Eof);
        }
        self.line = line;
        self.stats.lines += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
            return Ok(RawLine::Line { terminated: true });
        }
        if !self.done && self.buf.len() as u64 >= cap {
            self.buf.clear();
            self.skip_rest_of_line()?;
            return Err(RecordingError::LineTooLong {
                path: self.path.clone(),
                line,
                limit: MAX_LINE_BYTES,
            });
        }
        // No newline and under the limit: the input ended.
        self.done = true;
        Ok(RawLine::Line { terminated: false })
    }

    /// Discards input up to and including the next newline, without buffering it.
    fn skip_rest_of_line(&mut self) -> Result<(), RecordingError> {
        loop {
            let available = match self.input.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if self.stats.gzip && e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.stats.gzip_unfinished = true;
                    self.done = true;
                    return Ok(());
                }
                Err(source) => {
                    self.done = true;
                    return Err(RecordingError::Read {
                        path: self.path.clone(),
                        line: self.line,
                        source,
                    });
                }
            };
            if available.is_empty() {
                self.done = true;
                return Ok(());
            }
            match available.iter().position(|&b| b == b'\n') {
                Some(pos) => {
                    self.input.consume(pos + 1);
                    return Ok(());
                }
                None => {
                    let n = available.len();
                    self.input.consume(n);
                }
            }
        }
    }

    /// A line of several MiB should not pin that much memory for the rest of the read.
    fn release_big_buffer(&mut self) {
        if self.buf.capacity() > 1024 * 1024 {
            self.buf = Vec::new();
        }
    }

    /// Parses the line in `self.buf`. `Ok(None)` for blank lines, unknown kinds and a cut-off
    /// last line.
    fn parse_line(&mut self, terminated: bool) -> Result<Option<Record>, RecordingError> {
        let line = self.line;
        let text = match std::str::from_utf8(&self.buf) {
            Ok(t) => t,
            // A cut can fall inside a multi-byte character.
            Err(_) if !terminated => {
                self.stats.truncated_last_line = true;
                return Ok(None);
            }
            Err(e) => {
                return Err(RecordingError::InvalidUtf8 {
                    path: self.path.clone(),
                    line,
                    byte: e.valid_up_to() + 1,
                });
            }
        };
        if text.trim().is_empty() {
            return Ok(None);
        }
        let value = match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            Err(_) if !terminated => {
                self.stats.truncated_last_line = true;
                return Ok(None);
            }
            Err(source) => {
                return Err(RecordingError::Malformed {
                    path: self.path.clone(),
                    line,
                    source,
                });
            }
        };
        let invalid = |kind: &str, message: String| RecordingError::InvalidRecord {
            path: self.path.clone(),
            line,
            kind: kind.to_string(),
            message,
        };
        let Value::Object(mut map) = value else {
            return Err(invalid("?", "a record must be a JSON object".to_string()));
        };
        let kind = match map.remove("kind") {
            Some(Value::String(k)) => k,
            _ => {
                return Err(invalid(
                    "?",
                    "the record has no \"kind\" string".to_string(),
                ));
            }
        };
        let record = match kind.as_str() {
            "sample" => serde_json::from_value(Value::Object(map)).map(Record::Sample),
            "finding" => serde_json::from_value(Value::Object(map)).map(Record::Finding),
            "event" => {
                let sub = map.get("event").and_then(Value::as_str).map(str::to_string);
                match serde_json::from_value(Value::Object(map)) {
                    Ok(e) => Ok(Record::Event(e)),
                    Err(_)
                        if sub
                            .as_deref()
                            .is_some_and(|s| !KNOWN_EVENT_KINDS.contains(&s)) =>
                    {
                        self.note_unknown(format!("event:{}", sub.unwrap_or_default()));
                        return Ok(None);
                    }
                    Err(e) => Err(e),
                }
            }
            "header" => {
                return Err(invalid(
                    "header",
                    "a second header (two recordings joined into one file?)".to_string(),
                ));
            }
            _ => {
                self.note_unknown(kind);
                return Ok(None);
            }
        };
        record.map(Some).map_err(|e| invalid(&kind, e.to_string()))
    }

    fn note_unknown(&mut self, mut kind: String) {
        self.stats.skipped_unknown += 1;
        if self.stats.unknown_kinds.len() < MAX_UNKNOWN_KIND_NAMES {
            // A hostile kind name could be megabytes long; keep a short prefix.
            if kind.len() > 64 {
                let mut end = 64;
                while !kind.is_char_boundary(end) {
                    end -= 1;
                }
                kind.truncate(end);
            }
            self.stats.unknown_kinds.insert(kind);
        }
    }
}

impl Iterator for RecordingReader {
    type Item = Result<Record, RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Reads a whole recording; stops at the first error.
pub fn read_all(
    path: impl AsRef<Path>,
) -> Result<(Header, Vec<Record>, ReadStats), RecordingError> {
    collect(RecordingReader::open(path)?)
}

/// Reads a whole recording from a reader; stops at the first error.
pub fn read_all_from(
    reader: impl Read + Send + 'static,
) -> Result<(Header, Vec<Record>, ReadStats), RecordingError> {
    collect(RecordingReader::from_reader(reader)?)
}

fn collect(
    mut reader: RecordingReader,
) -> Result<(Header, Vec<Record>, ReadStats), RecordingError> {
    let mut records = Vec::new();
    while let Some(r) = reader.next_record()? {
        records.push(r);
    }
    let (header, stats) = reader.into_parts();
    Ok((header, records, stats))
}

/// Reads up to `n` bytes (fewer only at end of input), however the reader splits its reads.
fn read_prefix<R: Read>(reader: &mut R, n: usize) -> io::Result<Vec<u8>> {
    let mut prefix = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match reader.read(&mut prefix[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    prefix.truncate(got);
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::super::test_fixtures::*;
    use super::*;
    use crate::Sample;

    #[test]
    fn unknown_kinds_and_event_kinds_are_skipped_and_counted() {
        let text = format!(
            "{PLAIN_HEADER}\n\
             {{\"kind\":\"probe_result\",\"probe\":\"bandwidth\",\"gb_s\":55.5}}\n\
             {{\"kind\":\"sample\",\"time_ms\":7,\"device\":0,\"gpu_util_pct\":12}}\n\
             \n\
             {{\"kind\":\"event\",\"time_ms\":8,\"device\":0,\"event\":\"clock_jump\",\"by\":3}}\n\
             {{\"kind\":\"probe_result\"}}\n"
        );
        let (_, recs, stats) = read_bytes(text.into_bytes()).unwrap();
        assert_eq!(recs.len(), 1);
        let Record::Sample(s) = &recs[0] else {
            panic!("expected a sample, got {:?}", recs[0]);
        };
        assert_eq!(s.gpu_util_pct, Some(12.0));
        assert_eq!(stats.skipped_unknown, 3);
        let kinds: Vec<&str> = stats.unknown_kinds.iter().map(String::as_str).collect();
        assert_eq!(kinds, ["event:clock_jump", "probe_result"]);
        assert_eq!(stats.warnings().len(), 1);
    }

    #[test]
    fn truncated_last_line_is_tolerated_and_reported() {
        let mut bytes = write_to_bytes(false, &records());
        // Cut in the middle of the last record, as a kill mid-write would.
        bytes.truncate(bytes.len() - 20);
        let (_, recs, stats) = read_bytes(bytes).unwrap();
        assert_eq!(recs, records()[..2].to_vec());
        assert!(stats.truncated_last_line);
        assert!(stats.is_truncated());
        assert_eq!(stats.warnings().len(), 1);
    }

    #[test]
    fn cut_inside_a_multibyte_character_is_truncation_not_bad_utf8() {
        let text = format!("{PLAIN_HEADER}\n{{\"kind\":\"notice\",\"m\":\"caf\u{e9}");
        let mut bytes = text.into_bytes();
        bytes.pop(); // half of the 2-byte 'é'
        let (_, recs, stats) = read_bytes(bytes).unwrap();
        assert!(recs.is_empty());
        assert!(stats.truncated_last_line);
    }

    #[test]
    fn last_line_without_newline_that_parses_is_a_record() {
        let text = format!("{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}");
        let (_, recs, stats) = read_bytes(text.into_bytes()).unwrap();
        assert_eq!(recs, vec![Record::Sample(Sample::new(0, 1))]);
        assert!(!stats.truncated_last_line);
    }

    #[test]
    fn gzip_cut_at_every_byte_never_panics() {
        let bytes = write_to_bytes(true, &records());
        for cut in 0..bytes.len() {
            // Any outcome but a panic is fine; a cut after the header must keep the header.
            if let Ok((h, recs, _)) = read_bytes(bytes[..cut].to_vec()) {
                assert_eq!(h, header());
                assert!(recs.len() <= 3);
            }
        }
    }

    #[test]
    fn corrupt_gzip_is_an_error() {
        let mut bytes = write_to_bytes(true, &records());
        // Flip a byte well past the gzip header and the JSON header line: the CRC (or the
        // deflate decoder) must catch it.
        let at = bytes.len() - 30;
        bytes[at] ^= 0x55;
        let err = read_bytes(bytes).unwrap_err();
        assert!(
            matches!(
                err,
                RecordingError::Read { .. }
                    | RecordingError::Malformed { .. }
                    | RecordingError::InvalidUtf8 { .. }
                    | RecordingError::InvalidRecord { .. }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn future_version_is_unsupported() {
        let text = PLAIN_HEADER.replace("\"version\":1", "\"version\":2") + "\n";
        let err = read_bytes(text.into_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                RecordingError::UnsupportedVersion {
                    found: 2,
                    supported: 1
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("upgrade gpudiag"), "{err}");
    }

    #[test]
    fn not_a_recording() {
        let cases: [&[u8]; 6] = [
            b"",
            b"hello world\nthis is text\n",
            b"[1,2,3]\n",
            b"{\"format\":\"other\",\"version\":1}\n",
            b"{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}\n",
            b"\xff\xfe\x00garbage\n",
        ];
        for case in cases {
            let err = read_bytes(case.to_vec()).unwrap_err();
            assert!(
                matches!(err, RecordingError::NotARecording { .. }),
                "{case:?}: {err:?}"
            );
        }
        let err = read_bytes(b"{\"kind\":\"sample\"}\n".to_vec()).unwrap_err();
        assert!(err.to_string().contains("header"), "{err}");
    }

    #[test]
    fn malformed_line_in_the_middle_is_an_error_with_its_line_and_reading_can_go_on() {
        let text = format!(
            "{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n{{oops\n\
             {{\"kind\":\"sample\",\"time_ms\":2,\"device\":0}}\n"
        );
        let mut r = RecordingReader::from_reader(Cursor::new(text.into_bytes())).unwrap();
        assert!(r.next_record().unwrap().is_some());
        let err = r.next_record().unwrap_err();
        assert!(
            matches!(err, RecordingError::Malformed { line: 3, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("recording line 3: malformed JSON"),
            "{err}"
        );
        let next = r.next_record().unwrap();
        assert_eq!(next, Some(Record::Sample(Sample::new(0, 2))));
        assert_eq!(r.next_record().unwrap(), None);
    }

    #[test]
    fn record_that_does_not_match_its_kind() {
        let text = format!("{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"device\":0}}\n");
        let err = read_bytes(text.into_bytes()).unwrap_err();
        assert!(
            matches!(&err, RecordingError::InvalidRecord { line: 2, kind, .. } if kind == "sample"),
            "{err:?}"
        );
        let text = format!("{PLAIN_HEADER}\n{{\"time_ms\":1}}\n");
        let err = read_bytes(text.into_bytes()).unwrap_err();
        assert!(
            matches!(err, RecordingError::InvalidRecord { line: 2, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn invalid_utf8_names_the_line() {
        let mut bytes =
            format!("{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n")
                .into_bytes();
        bytes.extend_from_slice(b"{\"kind\":\"x\xff\"}\n");
        let err = read_bytes(bytes).unwrap_err();
        assert!(
            matches!(
                err,
                RecordingError::InvalidUtf8 {
                    line: 3,
                    byte: 11,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn overlong_line_is_an_error_and_the_next_line_still_reads() {
        let mut bytes = format!("{PLAIN_HEADER}\n").into_bytes();
        bytes.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        bytes.extend_from_slice(b"\n{\"kind\":\"sample\",\"time_ms\":3,\"device\":1}\n");
        let mut r = RecordingReader::from_reader(Cursor::new(bytes)).unwrap();
        let err = r.next_record().unwrap_err();
        assert!(
            matches!(err, RecordingError::LineTooLong { line: 2, .. }),
            "{err:?}"
        );
        assert_eq!(
            r.next_record().unwrap(),
            Some(Record::Sample(Sample::new(1, 3)))
        );
        assert_eq!(r.line_number(), 3);
    }

    #[test]
    fn line_exactly_at_the_limit_is_accepted() {
        let mut bytes = format!("{PLAIN_HEADER}\n").into_bytes();
        let record = br#"{"kind":"sample","time_ms":3,"device":1}"#;
        // Pad with spaces (valid JSON whitespace) to exactly the limit.
        bytes.extend_from_slice(record);
        bytes.extend(std::iter::repeat_n(b' ', MAX_LINE_BYTES - record.len()));
        bytes.push(b'\n');
        let (_, recs, _) = read_bytes(bytes).unwrap();
        assert_eq!(recs, vec![Record::Sample(Sample::new(1, 3))]);
    }

    #[test]
    fn second_header_is_an_error() {
        let text = format!("{PLAIN_HEADER}\n{PLAIN_HEADER}\n");
        let err = read_bytes(text.into_bytes()).unwrap_err();
        assert!(
            matches!(err, RecordingError::InvalidRecord { line: 2, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn crlf_line_endings_are_accepted() {
        let text =
            format!("{PLAIN_HEADER}\r\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\r\n");
        let (_, recs, _) = read_bytes(text.into_bytes()).unwrap();
        assert_eq!(recs.len(), 1);
    }

    /// A reader that hands out one byte per call, to check gzip detection does not rely on
    /// getting both magic bytes in one read.
    struct Trickle(Cursor<Vec<u8>>);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(1);
            self.0.read(&mut buf[..n])
        }
    }

    #[test]
    fn gzip_detected_from_a_trickling_reader() {
        let bytes = write_to_bytes(true, &records());
        let (_, recs, _) = read_all_from(Trickle(Cursor::new(bytes))).unwrap();
        assert_eq!(recs, records());
    }
}
