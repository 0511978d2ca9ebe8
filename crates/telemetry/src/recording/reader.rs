//! Reading a recording. A recording is a file a user hands us, so it is treated as hostile: lines
//! are read with a hard length limit, and nothing in it can make the reader panic or hold more
//! than one line. Only a file that is not a recording (no header, a newer format) is an error. A
//! recording damaged further in (a crash, a disk error) is read for what it still holds: a bad
//! line is skipped and counted, a stream that stops early (a cut gzip, a read error) ends the
//! read there, kinds from newer writers are skipped and counted, and [`ReadStats`] says so.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

// A recording may be several gzip members end to end (`cat a.gz b.gz`, a writer that appends):
// GzDecoder stops after the first, silently.
use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use serde_json::Value;

use super::{
    EXCERPT_CHARS, FORMAT_NAME, Header, InflateLimit, MAX_LINE_BYTES, RECORDING_VERSION, Record,
    RecordingError, STREAM_NAME, excerpt, tidy_message,
};
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{Event, HostInfo, Sample, TimeMs};

/// How many distinct unknown kinds [`ReadStats`] remembers by name (the count is exact).
const MAX_UNKNOWN_KIND_NAMES: usize = 16;
/// Event sub-kinds this build knows (`EventKind`'s tags). An `event` line with another tag comes
/// from a newer writer and is skipped like an unknown kind rather than counted as damage.
const KNOWN_EVENT_KINDS: [&str; 3] = ["xid", "device_lost", "notice"];

/// How much content that is not a record a reader wades through before it gives up: blank
/// lines, malformed ones, lines too long and kinds this build does not know cost nothing to
/// write but a line of work each to read, so a bundle of a few kilobytes that inflates to a
/// gigabyte of newlines would otherwise keep a replay busy for minutes before it finds no sample.
///
/// It works as a debt: every such line adds one line and its bytes, every record pays off
/// `per_record` lines and `per_record` times its own bytes, and reading stops once the debt
/// passes `lines` or `bytes`. A recording is almost all records (a damaged one has a few bad
/// lines, a newer writer's kinds come a few per sample), so it never comes near; junk can at most
/// add about `per_record` cheap lines of work per record, which keeps it proportionate to what
/// the records themselves cost. Paying off never goes below zero, so a pass started part way
/// through a recording never owes more than one from its start did at the same line: a replay
/// that seeks cannot fail where its first pass passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JunkBudget {
    pub lines: u64,
    pub bytes: u64,
    pub per_record: u64,
}

impl JunkBudget {
    /// About a tenth of a second of blank lines, or 64 MiB of bytes, owed at any point.
    pub(crate) const DEFAULT: JunkBudget = JunkBudget {
        lines: 1 << 20,
        bytes: 64 << 20,
        per_record: 16,
    };
}

/// What a reader owes its [`JunkBudget`] now, and what it has seen of each side.
#[derive(Debug, Clone, Copy, Default)]
struct JunkDebt {
    lines: u64,
    bytes: u64,
    junk_lines: u64,
    records: u64,
}

/// A line that was not read as a record, or where reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// Its number in the recording (1 is the header).
    pub line: u64,
    /// Why, in a few words, quoting at most a short excerpt of the line.
    pub reason: String,
}

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
    /// Lines skipped because they are not a record: not JSON, not UTF-8, longer than
    /// [`MAX_LINE_BYTES`], a record that does not match its kind, a second header.
    pub malformed_lines: u64,
    /// The first of them.
    pub first_malformed: Option<BadLine>,
    /// Reading stopped before this line because the input could not be read further (a disk
    /// error, a corrupt gzip stream); everything before it was read.
    pub read_error: Option<BadLine>,
}

impl ReadStats {
    /// Whether the recording ended abruptly (a crash or kill while recording, a damaged file).
    pub fn is_truncated(&self) -> bool {
        self.truncated_last_line || self.gzip_unfinished || self.read_error.is_some()
    }

    /// One-line notes worth showing a user; empty when the file was read cleanly.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(first) = &self.first_malformed {
            let n = self.malformed_lines;
            out.push(format!(
                "skipped {n} malformed line{} (first at line {}: {})",
                if n == 1 { "" } else { "s" },
                first.line,
                first.reason
            ));
        }
        if let Some(stop) = &self.read_error {
            out.push(format!(
                "reading stopped at line {}: {}; everything before it was read",
                stop.line, stop.reason
            ));
        }
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
            let kinds: Vec<String> = self
                .unknown_kinds
                .iter()
                .map(|k| excerpt(k, EXCERPT_CHARS))
                .collect();
            out.push(format!(
                "skipped {} record(s) of kinds this gpudiag does not know ({}); a newer gpudiag \
                 can show them",
                self.skipped_unknown,
                kinds.join(", ")
            ));
        }
        out
    }

    /// Adds what another pass over the same recording counted (each pass counts only lines no
    /// earlier pass did, so the sums are exact).
    pub(crate) fn absorb(&mut self, other: &ReadStats) {
        self.lines += other.lines;
        self.records += other.records;
        self.skipped_unknown += other.skipped_unknown;
        for kind in &other.unknown_kinds {
            if self.unknown_kinds.len() >= MAX_UNKNOWN_KIND_NAMES {
                break;
            }
            self.unknown_kinds.insert(kind.clone());
        }
        self.truncated_last_line |= other.truncated_last_line;
        self.gzip |= other.gzip;
        self.gzip_unfinished |= other.gzip_unfinished;
        self.malformed_lines += other.malformed_lines;
        self.first_malformed = earliest(self.first_malformed.take(), &other.first_malformed);
        self.read_error = earliest(self.read_error.take(), &other.read_error);
    }
}

fn earliest(a: Option<BadLine>, b: &Option<BadLine>) -> Option<BadLine> {
    match (a, b) {
        (Some(a), Some(b)) if b.line < a.line => Some(b.clone()),
        (Some(a), _) => Some(a),
        (None, b) => b.clone(),
    }
}

/// Where a line starts: its byte offset in the decompressed recording and its number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinePos {
    pub offset: u64,
    pub line: u64,
}

/// A record reduced to what locating ticks needs, read without parsing a whole sample.
#[derive(Debug)]
pub(crate) enum Outline {
    Sample(TimeMs),
    Event(TimeMs),
    Finding(Box<Finding>),
    /// An NCCL RAS answer or a kernels summary: no part of a tick's outline.
    Beside,
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

/// Why a line is not a record; becomes a [`BadLine`] reason.
enum LineProblem {
    TooLong,
    InvalidUtf8 { byte: usize },
    Malformed(serde_json::Error),
    Invalid { kind: String, message: String },
}

impl LineProblem {
    fn reason(&self) -> String {
        match self {
            LineProblem::TooLong => format!("longer than the limit of {MAX_LINE_BYTES} bytes"),
            LineProblem::InvalidUtf8 { byte } => {
                format!("not valid UTF-8 (byte {byte} of the line)")
            }
            LineProblem::Malformed(e) => format!(
                "malformed JSON at column {}: {}",
                e.column(),
                tidy_message(&message_of(e))
            ),
            LineProblem::Invalid { kind, message } => format!(
                "invalid {} record: {}",
                excerpt(kind, EXCERPT_CHARS),
                tidy_message(message)
            ),
        }
    }
}

/// A serde_json message without its " at line 1 column N" tail: the reader parses one line at a
/// time, so that position would contradict the line number the message is given with.
fn message_of(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let tail = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&tail)
        .map_or(text.clone(), str::to_string)
}

/// The first field a record line is read for.
#[derive(Deserialize)]
struct KindOnly<'a> {
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// An event line's sub-kind, read only when the event itself did not parse.
#[derive(Deserialize)]
struct EventTagOnly<'a> {
    #[serde(borrow, default)]
    event: Option<Cow<'a, str>>,
}

/// The kind of a line laid out as the writer does (`{"kind":"sample",...`), read without
/// parsing the line; `None` for any other layout, which the parser then reads.
fn kind_at_start(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(r#"{"kind":""#)?;
    let end = rest.find('"')?;
    let (kind, after) = rest.split_at(end);
    // An escape would make the bytes differ from the value.
    let plain =
        !kind.contains('\\') && (after[1..].starts_with(',') || after[1..].starts_with('}'));
    plain.then_some(kind)
}

/// A sample line as the writer lays it out starts with these bytes and its time; locating ticks
/// reads only that far.
const SAMPLE_PREFIX: &[u8] = br#"{"kind":"sample","time_ms":"#;

fn sample_time_at_start(line: &[u8]) -> Option<TimeMs> {
    let rest = line.strip_prefix(SAMPLE_PREFIX)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if !matches!(rest.get(digits), Some(b',' | b'}')) {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// Reads a recording: the header at open, then one record per call.
pub struct RecordingReader {
    input: Input,
    header: Header,
    stats: ReadStats,
    path: String,
    /// The number of the line last read.
    line: u64,
    /// Bytes of the decompressed input consumed so far.
    offset: u64,
    /// Where the line last read starts, and its length without the newline.
    line_start: u64,
    line_len: usize,
    /// Lines up to this one were counted by an earlier pass over the same recording (a replay
    /// that seeks back reads them again); only later ones are counted here.
    counted_through: u64,
    buf: Vec<u8>,
    done: bool,
    budget: JunkBudget,
    debt: JunkDebt,
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
        if gzip {
            Self::from_decoded(BufReader::new(MultiGzDecoder::new(reader)), name, true, 0)
        } else {
            Self::from_decoded(BufReader::new(reader), name, false, 0)
        }
    }

    /// Reads the header from an input already decompressed (`gzip`: it was, which tells a cut
    /// gzip stream from a damaged one). Lines up to `counted_through` are not counted in the
    /// stats (`u64::MAX`: nothing is).
    pub(crate) fn from_decoded(
        input: impl BufRead + Send + 'static,
        name: &str,
        gzip: bool,
        counted_through: u64,
    ) -> Result<Self, RecordingError> {
        let mut r = Self::resume(
            input,
            name,
            Header::new("", HostInfo::default(), Vec::new(), None),
            gzip,
            LinePos::default(),
            counted_through,
        );
        r.header = r.read_header()?;
        Ok(r)
    }

    /// Goes on reading a recording whose header was read before, from an input positioned at
    /// the start of line `at.line`, `at.offset` bytes into the decompressed recording. Lines up
    /// to `counted_through` are not counted again in the stats.
    pub(crate) fn resume(
        input: impl BufRead + Send + 'static,
        name: &str,
        header: Header,
        gzip: bool,
        at: LinePos,
        counted_through: u64,
    ) -> Self {
        RecordingReader {
            input: Box::new(input),
            header,
            stats: ReadStats {
                gzip,
                ..ReadStats::default()
            },
            path: name.to_string(),
            line: at.line.saturating_sub(1),
            offset: at.offset,
            line_start: at.offset,
            line_len: 0,
            counted_through,
            buf: Vec::new(),
            done: false,
            budget: JunkBudget::DEFAULT,
            debt: JunkDebt::default(),
        }
    }

    /// The same reader under another [`JunkBudget`] (tests use small ones).
    #[cfg(test)]
    pub(crate) fn with_junk_budget(mut self, budget: JunkBudget) -> Self {
        self.budget = budget;
        self
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// The name errors and warnings use for the input.
    pub fn name(&self) -> &str {
        &self.path
    }

    /// The number of the line last read (1 is the header).
    pub fn line_number(&self) -> u64 {
        self.line
    }

    /// Where the line last read starts.
    pub fn last_line_pos(&self) -> LinePos {
        LinePos {
            offset: self.line_start,
            line: self.line,
        }
    }

    /// The length of the line last read, newline excluded.
    pub(crate) fn last_line_len(&self) -> usize {
        self.line_len
    }

    /// Consumes the reader, returning the header and what was noticed while reading.
    pub fn into_parts(self) -> (Header, ReadStats) {
        (self.header, self.stats)
    }

    /// The next record; `Ok(None)` at the end. Lines that are not records are skipped and
    /// counted; input that cannot be read further ends the recording there. Errors are only
    /// those that make the rest meaningless: a bundle that inflates past its limit.
    pub fn next_record(&mut self) -> Result<Option<Record>, RecordingError> {
        loop {
            let Some(terminated) = self.next_line()? else {
                return Ok(None);
            };
            let parsed = self.parse_line(terminated);
            self.release_big_buffer();
            match parsed {
                Ok(Some(record)) => {
                    if self.counting() {
                        self.stats.records += 1;
                    }
                    self.pay_off();
                    return Ok(Some(record));
                }
                Ok(None) => self.owe()?,
                Err(problem) => {
                    self.note_malformed(&problem);
                    self.owe()?;
                }
            }
        }
    }

    /// As [`next_record`](Self::next_record), reading a sample line written the usual way only
    /// as far as its time.
    pub(crate) fn next_outline(&mut self) -> Result<Option<Outline>, RecordingError> {
        loop {
            let Some(terminated) = self.next_line()? else {
                return Ok(None);
            };
            if terminated && let Some(time) = sample_time_at_start(&self.buf) {
                self.pay_off();
                return Ok(Some(Outline::Sample(time)));
            }
            let parsed = self.parse_line(terminated);
            self.release_big_buffer();
            let outline = match parsed {
                Ok(Some(Record::Sample(s))) => Outline::Sample(s.time_ms),
                Ok(Some(Record::Event(e))) => Outline::Event(e.time_ms),
                Ok(Some(Record::Finding(f))) => Outline::Finding(Box::new(f)),
                Ok(Some(Record::Ras(_) | Record::Kernels(_))) => Outline::Beside,
                Ok(None) => {
                    self.owe()?;
                    continue;
                }
                Err(problem) => {
                    self.note_malformed(&problem);
                    self.owe()?;
                    continue;
                }
            };
            self.pay_off();
            return Ok(Some(outline));
        }
    }

    /// Reads the next line into `self.buf`: `Some(terminated)`, or `None` at the end. Lines too
    /// long are skipped here; input that fails part way ends the recording, unless it failed
    /// because a limit on inflated size was passed.
    fn next_line(&mut self) -> Result<Option<bool>, RecordingError> {
        loop {
            match self.read_raw_line() {
                Ok(RawLine::Eof) => return Ok(None),
                Ok(RawLine::Line { terminated }) => return Ok(Some(terminated)),
                Err(Problem::Line(problem)) => {
                    self.note_malformed(&problem);
                    self.owe()?;
                }
                Err(Problem::Read(source)) => {
                    if let Some(limit) = inflate_limit(&source) {
                        return Err(RecordingError::TooLarge {
                            path: self.path.clone(),
                            limit,
                        });
                    }
                    if self.line >= self.counted_through {
                        self.stats.read_error.get_or_insert(BadLine {
                            line: self.line + 1,
                            reason: format!("read error: {}", tidy_message(&source.to_string())),
                        });
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// The line last read carried no record: it adds to the debt, and past the budget reading
    /// stops with an error that says why.
    fn owe(&mut self) -> Result<(), RecordingError> {
        let bytes = self.offset - self.line_start;
        let debt = &mut self.debt;
        debt.junk_lines += 1;
        debt.lines += 1;
        debt.bytes = debt.bytes.saturating_add(bytes);
        if debt.lines <= self.budget.lines && debt.bytes <= self.budget.bytes {
            return Ok(());
        }
        self.done = true;
        Err(RecordingError::MostlyNotRecords {
            path: self.path.clone(),
            line: self.line,
            junk_lines: debt.junk_lines,
            records: debt.records,
            per_record: self.budget.per_record,
        })
    }

    /// The line last read was a record: it pays off some of the debt.
    fn pay_off(&mut self) {
        let bytes = self.offset - self.line_start;
        let per = self.budget.per_record;
        let debt = &mut self.debt;
        debt.records += 1;
        debt.lines = debt.lines.saturating_sub(per);
        debt.bytes = debt.bytes.saturating_sub(bytes.saturating_mul(per));
    }

    fn counting(&self) -> bool {
        self.line > self.counted_through
    }

    fn note_malformed(&mut self, problem: &LineProblem) {
        if !self.counting() {
            return;
        }
        self.stats.malformed_lines += 1;
        if self.stats.first_malformed.is_none() {
            self.stats.first_malformed = Some(BadLine {
                line: self.line,
                reason: problem.reason(),
            });
        }
    }

    fn read_header(&mut self) -> Result<Header, RecordingError> {
        let not_a_recording = |path: &str, reason: &str| RecordingError::NotARecording {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        // The rest of an over-long first line is never read: no header is that long, and
        // `/dev/zero` or a stream of zeros has no newline to skip to.
        let raw = match self.read_raw_line_then(false) {
            Ok(raw) => raw,
            Err(Problem::Line(LineProblem::TooLong)) => {
                return Err(not_a_recording(
                    &self.path,
                    "its first line is longer than any recording header",
                ));
            }
            Err(Problem::Line(_)) => {
                return Err(not_a_recording(&self.path, "its first line is unreadable"));
            }
            Err(Problem::Read(source)) => {
                if let Some(limit) = inflate_limit(&source) {
                    return Err(RecordingError::TooLarge {
                        path: self.path.clone(),
                        limit,
                    });
                }
                return Err(RecordingError::Read {
                    path: self.path.clone(),
                    line: 1,
                    source,
                });
            }
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
                        "line 1 is a \"{}\" record; the header (\"format\": \"{FORMAT_NAME}\") \
                         is missing",
                        excerpt(kind, EXCERPT_CHARS)
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
                message: tidy_message(&e.to_string()),
            })?;
        self.release_big_buffer();
        Ok(header)
    }

    /// Reads one line into `self.buf` (newline stripped), never more than the line limit; the
    /// rest of a longer line is skipped.
    fn read_raw_line(&mut self) -> Result<RawLine, Problem> {
        self.read_raw_line_then(true)
    }

    /// [`read_raw_line`](Self::read_raw_line), skipping the rest of an over-long line only when
    /// `skip_long` (the header's is refused as it stands).
    fn read_raw_line_then(&mut self, skip_long: bool) -> Result<RawLine, Problem> {
        self.buf.clear();
        self.line_len = 0;
        if self.done {
            return Ok(RawLine::Eof);
        }
        // One byte over the limit is enough to tell "too long" from "exactly at the limit".
        let cap = MAX_LINE_BYTES as u64 + 1;
        let result = (&mut self.input).take(cap).read_until(b'\n', &mut self.buf);
        let n = match result {
            Ok(n) => n,
            // A gzip stream cut short (the writer was killed) ends in UnexpectedEof once the
            // decoder runs out of input; what came before it decoded fine, so treat it as the end.
            Err(e) if self.stats.gzip && e.kind() == io::ErrorKind::UnexpectedEof => {
                self.stats.gzip_unfinished |= self.line >= self.counted_through;
                self.done = true;
                self.buf.len()
            }
            Err(source) => {
                self.done = true;
                return Err(Problem::Read(source));
            }
        };
        if n == 0 {
            self.done = true;
            return Ok(RawLine::Eof);
        }
        self.line += 1;
        self.line_start = self.offset;
        self.offset += n as u64;
        if self.counting() {
            self.stats.lines += 1;
        }
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
            self.line_len = self.buf.len();
            return Ok(RawLine::Line { terminated: true });
        }
        if !self.done && self.buf.len() as u64 >= cap {
            self.buf.clear();
            if skip_long {
                // Never further than the junk budget has left: past it the line is owed in
                // full and reading stops, so input with no newline at all (`/dev/zero`) is
                // not read to its end first.
                let left = self.budget.bytes.saturating_sub(self.debt.bytes);
                self.skip_rest_of_line(left.saturating_add(1))?;
            }
            self.line_len = (self.offset - self.line_start) as usize;
            return Err(Problem::Line(LineProblem::TooLong));
        }
        // No newline and under the limit: the input ended.
        self.done = true;
        self.line_len = self.buf.len();
        Ok(RawLine::Line { terminated: false })
    }

    /// Discards input up to and including the next newline, without buffering it, or `limit`
    /// bytes of it, whichever comes first.
    fn skip_rest_of_line(&mut self, limit: u64) -> Result<(), Problem> {
        let mut skipped = 0u64;
        loop {
            if skipped >= limit {
                return Ok(());
            }
            let available = match self.input.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if self.stats.gzip && e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.stats.gzip_unfinished |= self.counting();
                    self.done = true;
                    return Ok(());
                }
                Err(source) => {
                    self.done = true;
                    return Err(Problem::Read(source));
                }
            };
            if available.is_empty() {
                self.done = true;
                return Ok(());
            }
            let room = usize::try_from(limit - skipped).unwrap_or(usize::MAX);
            let available = &available[..available.len().min(room)];
            let (used, end) = match available.iter().position(|&b| b == b'\n') {
                Some(pos) => (pos + 1, true),
                None => (available.len(), false),
            };
            self.input.consume(used);
            self.offset += used as u64;
            skipped += used as u64;
            if end {
                return Ok(());
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
    fn parse_line(&mut self, terminated: bool) -> Result<Option<Record>, LineProblem> {
        let buf = std::mem::take(&mut self.buf);
        let parsed = self.parse_text(&buf, terminated);
        self.buf = buf;
        parsed
    }

    fn parse_text(
        &mut self,
        bytes: &[u8],
        terminated: bool,
    ) -> Result<Option<Record>, LineProblem> {
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            // A cut can fall inside a multi-byte character.
            Err(_) if !terminated => {
                self.note_truncated();
                return Ok(None);
            }
            Err(e) => {
                return Err(LineProblem::InvalidUtf8 {
                    byte: e.valid_up_to() + 1,
                });
            }
        };
        if text.trim().is_empty() {
            return Ok(None);
        }
        let invalid = |kind: &str, message: String| LineProblem::Invalid {
            kind: kind.to_string(),
            message,
        };
        let kind = match kind_at_start(text) {
            // The usual layout names the kind first: no need to parse the line twice.
            Some(kind) => Ok(KindOnly {
                kind: Some(Cow::Borrowed(kind)),
            }),
            None => serde_json::from_str::<KindOnly>(text),
        };
        let kind = match kind {
            Ok(KindOnly { kind: Some(k) }) => k,
            Ok(KindOnly { kind: None }) => {
                return Err(invalid(
                    "?",
                    "the record has no \"kind\" string".to_string(),
                ));
            }
            Err(e) if !terminated && !e.is_data() => {
                self.note_truncated();
                return Ok(None);
            }
            Err(e) if e.is_data() => {
                let message = if text.trim_start().starts_with('{') {
                    "the record has no \"kind\" string"
                } else {
                    "a record must be a JSON object"
                };
                return Err(invalid("?", message.to_string()));
            }
            Err(e) => return Err(LineProblem::Malformed(e)),
        };
        let record = match kind.as_ref() {
            "sample" => serde_json::from_str::<Sample>(text).map(|s| Some(Record::Sample(s))),
            "finding" => serde_json::from_str::<Finding>(text).map(|f| Some(Record::Finding(f))),
            // A file is anyone's: held to the bounds a live answer has.
            "nccl_ras" => serde_json::from_str::<gpudiag_model::ras::RasAnswer>(text)
                .map(|r| Some(Record::Ras(r.bounded()))),
            "kernels" => {
                match serde_json::from_str::<gpudiag_model::kernels::RecordedKernels>(text) {
                    Ok(k) => {
                        if let Some(why) = k.summary.implausible() {
                            return Err(invalid("kernels", why));
                        }
                        Ok(Some(Record::Kernels(
                            gpudiag_model::kernels::RecordedKernels {
                                summary: k.summary.bounded(),
                                ..k
                            },
                        )))
                    }
                    Err(e) => Err(e),
                }
            }
            "event" => match serde_json::from_str::<Event>(text) {
                Ok(e) => Ok(Some(Record::Event(e))),
                Err(e) => {
                    let tag = serde_json::from_str::<EventTagOnly>(text)
                        .ok()
                        .and_then(|t| t.event);
                    match tag {
                        Some(tag) if !KNOWN_EVENT_KINDS.contains(&tag.as_ref()) => {
                            self.note_unknown(&format!("event:{tag}"));
                            return Ok(None);
                        }
                        _ => Err(e),
                    }
                }
            },
            "header" => {
                return Err(invalid(
                    "header",
                    "a second header (two recordings joined into one file?)".to_string(),
                ));
            }
            // Still JSON, or it is damage rather than a newer writer's record.
            other => serde_json::from_str::<serde::de::IgnoredAny>(text).map(|_| {
                self.note_unknown(other);
                None
            }),
        };
        match record {
            Ok(record) => Ok(record),
            Err(e) if (e.is_syntax() || e.is_eof()) && !terminated => {
                self.note_truncated();
                Ok(None)
            }
            Err(e) if e.is_syntax() || e.is_eof() => Err(LineProblem::Malformed(e)),
            Err(e) => Err(invalid(&kind, message_of(&e))),
        }
    }

    fn note_truncated(&mut self) {
        if self.counting() {
            self.stats.truncated_last_line = true;
        }
    }

    fn note_unknown(&mut self, kind: &str) {
        if !self.counting() {
            return;
        }
        self.stats.skipped_unknown += 1;
        if self.stats.unknown_kinds.len() < MAX_UNKNOWN_KIND_NAMES {
            // A hostile kind name could be megabytes long; keep a short prefix.
            self.stats
                .unknown_kinds
                .insert(excerpt(kind, EXCERPT_CHARS));
        }
    }
}

/// Why a raw line could not be had: the line is bad (skip it), or the input is.
enum Problem {
    Line(LineProblem),
    Read(io::Error),
}

/// The limit an inflating reader passed, when that is what `e` reports.
fn inflate_limit(e: &io::Error) -> Option<u64> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<InflateLimit>())
        .map(|l| l.limit)
}

impl Iterator for RecordingReader {
    type Item = Result<Record, RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Reads a whole recording into memory (tests and small files; a replay streams instead).
pub fn read_all(
    path: impl AsRef<Path>,
) -> Result<(Header, Vec<Record>, ReadStats), RecordingError> {
    collect(RecordingReader::open(path)?)
}

/// Reads a whole recording from a reader into memory.
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
pub(crate) fn read_prefix<R: Read>(reader: &mut R, n: usize) -> io::Result<Vec<u8>> {
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
    use gpudiag_model::sample::Sample;

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
        assert_eq!(stats.malformed_lines, 0);
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
        assert_eq!(stats.malformed_lines, 0);
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
    fn corrupt_gzip_keeps_what_came_before_and_says_so() {
        let mut bytes = write_to_bytes(true, &records());
        // Flip a byte well past the gzip header and the JSON header line: the CRC (or the
        // deflate decoder) must catch it, and what decoded before it is still a recording.
        let at = bytes.len() - 30;
        bytes[at] ^= 0x55;
        let (h, recs, stats) = read_bytes(bytes).unwrap();
        assert_eq!(h, header());
        assert!(recs.len() < 3, "{recs:?}");
        assert!(
            stats.read_error.is_some() || stats.malformed_lines > 0,
            "{stats:?}"
        );
        assert!(!stats.warnings().is_empty());
    }

    /// Hands out `good` and then fails, as a disk with a bad sector does.
    struct FailsAfter {
        good: Cursor<Vec<u8>>,
        error: Option<io::Error>,
    }

    impl Read for FailsAfter {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.good.read(buf)? {
                0 => Err(self
                    .error
                    .take()
                    .unwrap_or_else(|| io::Error::other("gone"))),
                n => Ok(n),
            }
        }
    }

    #[test]
    fn read_error_mid_file_ends_the_recording_there_with_a_warning() {
        let text = format!(
            "{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n\
             {{\"kind\":\"sample\",\"time_ms\":2,\"device\":0}}\n"
        );
        let input = FailsAfter {
            good: Cursor::new(text.into_bytes()),
            error: Some(io::Error::from_raw_os_error(5)),
        };
        let (_, recs, stats) = read_all_from(input).unwrap();
        assert_eq!(recs.len(), 2);
        let stop = stats.read_error.clone().unwrap();
        assert_eq!(stop.line, 4);
        assert!(stop.reason.starts_with("read error: "), "{stop:?}");
        assert!(stats.is_truncated());
        let warnings = stats.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("reading stopped at line 4: read error: "));
    }

    /// Counts the bytes taken from the input, so a test can tell how far a reader went.
    struct Counted {
        inner: Cursor<Vec<u8>>,
        read: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl Read for Counted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(n)
        }
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut z, bytes).unwrap();
        z.finish().unwrap()
    }

    /// Two gzip members end to end (`cat a.gz b.gz`) are one recording: the records of the
    /// second were dropped without a word.
    #[test]
    fn every_gzip_member_of_a_recording_is_read() {
        let sample = |t: u32| format!("{{\"kind\":\"sample\",\"time_ms\":{t},\"device\":0}}\n");
        let first = gzip(format!("{PLAIN_HEADER}\n{}{}", sample(1), sample(2)).as_bytes());
        let second = gzip(format!("{}{}", sample(3), sample(4)).as_bytes());
        let mut reader =
            RecordingReader::from_reader(Cursor::new([first, second].concat())).unwrap();
        let mut times = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            if let Record::Sample(s) = record {
                times.push(s.time_ms);
            }
        }
        assert_eq!(times, [1, 2, 3, 4]);
    }

    /// Endless zeros (`/dev/zero`), as the first line or after records, are read no further
    /// than the line limit and the junk budget: reading it to a newline never ended.
    #[test]
    fn input_with_no_newline_is_read_only_as_far_as_the_limits() {
        struct Zeros {
            read: std::sync::Arc<std::sync::atomic::AtomicU64>,
        }
        impl Read for Zeros {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                buf.fill(0);
                self.read
                    .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Ok(buf.len())
            }
        }
        let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let Err(err) = RecordingReader::from_reader(Zeros { read: read.clone() }) else {
            panic!("zeros are no recording");
        };
        assert!(matches!(err, RecordingError::NotARecording { .. }), "{err}");
        let first = read.load(std::sync::atomic::Ordering::Relaxed);
        assert!(first <= 2 * MAX_LINE_BYTES as u64, "{first}");

        let sample = r#"{"kind":"sample","time_ms":1,"device":0}"#;
        let records = Cursor::new(format!("{PLAIN_HEADER}\n{sample}\n").into_bytes());
        let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let input = records.chain(Zeros { read: read.clone() });
        let mut reader = RecordingReader::from_reader(input).unwrap();
        assert!(reader.next_record().unwrap().is_some());
        let err = reader.next_record().expect_err("past the junk budget");
        assert!(
            matches!(err, RecordingError::MostlyNotRecords { .. }),
            "{err}"
        );
        let after = read.load(std::sync::atomic::Ordering::Relaxed);
        let most = JunkBudget::DEFAULT.bytes + 2 * MAX_LINE_BYTES as u64;
        assert!(after <= most, "{after} > {most}");
    }

    /// A header and then nothing but newlines: a few kilobytes gzipped, minutes of work read
    /// to the end. The reader gives up after its budget, having read little of it.
    #[test]
    fn a_recording_of_blank_lines_stops_within_its_budget() {
        let blank = 4usize << 20;
        let mut text = format!("{PLAIN_HEADER}\n").into_bytes();
        text.resize(text.len() + blank, b'\n');
        for input in [text.clone(), gzip(&text)] {
            let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let counted = Counted {
                inner: Cursor::new(input),
                read: read.clone(),
            };
            let mut reader = RecordingReader::from_reader(counted).unwrap();
            let err = match reader.next_outline() {
                Ok(Some(_)) => panic!("no record in there"),
                Ok(None) => panic!("read all {blank} blank lines"),
                Err(e) => e,
            };
            let RecordingError::MostlyNotRecords {
                line,
                junk_lines,
                records,
                ..
            } = err
            else {
                panic!("{err}");
            };
            assert_eq!(records, 0);
            assert_eq!(junk_lines, JunkBudget::DEFAULT.lines + 1);
            assert_eq!(line, junk_lines + 1);
            // The decoder reads ahead a little; nowhere near the 4 MiB.
            let read = read.load(std::sync::atomic::Ordering::Relaxed);
            assert!(read < (JunkBudget::DEFAULT.lines + (256 << 10)), "{read}");
            assert!(reader.next_record().unwrap().is_none(), "it stays stopped");
        }
    }

    #[test]
    fn junk_is_allowed_in_proportion_to_the_records_around_it() {
        let budget = JunkBudget {
            lines: 10,
            bytes: 1 << 20,
            per_record: 3,
        };
        let sample = r#"{"kind":"sample","time_ms":1,"device":0}"#;
        let read = |every: usize, junk: &str| {
            let mut text = format!("{PLAIN_HEADER}\n");
            for _ in 0..100 {
                text.push_str(sample);
                text.push('\n');
                for _ in 0..every {
                    text.push_str(junk);
                    text.push('\n');
                }
            }
            let reader = RecordingReader::from_reader(Cursor::new(text.into_bytes()))
                .unwrap()
                .with_junk_budget(budget);
            collect(reader)
        };
        for junk in ["", "not json", r#"{"kind":"probe_result"}"#] {
            // Three junk lines per record are paid off as they come, however long the file.
            let (_, recs, _) = read(3, junk).unwrap();
            assert_eq!(recs.len(), 100, "{junk:?}");
            // Four are not: one more line of debt with each record, past ten at the eighth.
            let err = read(4, junk).unwrap_err();
            assert!(
                matches!(err, RecordingError::MostlyNotRecords { records: 8, .. }),
                "{junk:?}: {err}"
            );
        }
        // Bytes count too: a few long junk lines pass the byte budget before the line budget.
        let budget = JunkBudget {
            lines: 1000,
            bytes: 64 << 10,
            per_record: 16,
        };
        let long = "x".repeat(30 << 10);
        let text = format!("{PLAIN_HEADER}\n{sample}\n{long}\n{long}\n{long}\n{sample}\n");
        let reader = RecordingReader::from_reader(Cursor::new(text.into_bytes()))
            .unwrap()
            .with_junk_budget(budget);
        let err = collect(reader).unwrap_err();
        assert!(
            matches!(err, RecordingError::MostlyNotRecords { line: 5, .. }),
            "{err}"
        );
        let message = err.to_string();
        assert!(message.contains("line 5: stopped reading"), "{message}");
    }

    #[test]
    fn a_pass_from_part_way_never_fails_where_one_from_the_start_passed() {
        // A replay that seeks starts a pass at a line the first pass read; it must not stop
        // where the first pass went on. Records pay off debt but bank no credit, so a pass
        // that starts later owes at most what the first pass owed at the same line.
        let budget = JunkBudget {
            lines: 4,
            bytes: 1 << 20,
            per_record: 3,
        };
        let sample = r#"{"kind":"sample","time_ms":1,"device":0}"#;
        let body = format!(
            "\n\n\n\n{sample}\n\n\n\n{sample}\n\n\n{sample}\n{sample}\n{sample}\n\n\n\n\n{sample}\n"
        );
        let text = format!("{PLAIN_HEADER}\n{body}");
        let reader = RecordingReader::from_reader(Cursor::new(text.clone().into_bytes()))
            .unwrap()
            .with_junk_budget(budget);
        assert_eq!(collect(reader).unwrap().1.len(), 6);
        // One more blank line in the first run is one too many.
        let over = format!("{PLAIN_HEADER}\n\n{body}");
        let reader = RecordingReader::from_reader(Cursor::new(over.into_bytes()))
            .unwrap()
            .with_junk_budget(budget);
        assert!(collect(reader).is_err());
        let mut offset = PLAIN_HEADER.len() + 1;
        for (i, line) in body.split_inclusive('\n').enumerate() {
            let at = LinePos {
                offset: offset as u64,
                line: i as u64 + 2,
            };
            let rest = text.as_bytes()[offset..].to_vec();
            let resumed = RecordingReader::resume(
                BufReader::new(Cursor::new(rest)),
                "r",
                header(),
                false,
                at,
                0,
            )
            .with_junk_budget(budget);
            assert!(collect(resumed).is_ok(), "from line {}", at.line);
            offset += line.len();
        }
    }

    #[test]
    fn passing_an_inflate_limit_is_an_error_not_damage() {
        let text = format!("{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n");
        let input = FailsAfter {
            good: Cursor::new(text.into_bytes()),
            error: Some(io::Error::other(InflateLimit { limit: 1024 })),
        };
        let mut r = RecordingReader::from_reader(input).unwrap();
        assert!(r.next_record().unwrap().is_some());
        let err = r.next_record().unwrap_err();
        assert!(
            matches!(err, RecordingError::TooLarge { limit: 1024, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("--max-inflated-size"), "{err}");
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
    fn a_huge_kind_on_line_1_is_quoted_short() {
        let kind = "k".repeat(1 << 20);
        let err = read_bytes(format!("{{\"kind\":\"{kind}\"}}\n").into_bytes()).unwrap_err();
        let message = err.to_string();
        assert!(message.len() < 400, "{} bytes", message.len());
        assert!(message.contains(&"k".repeat(EXCERPT_CHARS)), "{message}");
        assert!(message.contains('…'), "{message}");
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted_and_the_first_is_named() {
        let text = format!(
            "{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n{{oops\n\
             {{\"kind\":\"sample\",\"time_ms\":2,\"device\":0}}\n[1]\n\
             {{\"kind\":\"sample\",\"time_ms\":3,\"device\":0}}\n"
        );
        let (_, recs, stats) = read_bytes(text.into_bytes()).unwrap();
        let times: Vec<u64> = recs.iter().map(Record::time_ms).collect();
        assert_eq!(times, [1, 2, 3]);
        assert_eq!(stats.malformed_lines, 2);
        let first = stats.first_malformed.clone().unwrap();
        assert_eq!(first.line, 3);
        assert!(
            first.reason.starts_with("malformed JSON at column 2: "),
            "{first:?}"
        );
        assert!(!first.reason.contains("line 1"), "{first:?}");
        assert!(!stats.is_truncated());
        let warnings = stats.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("skipped 2 malformed lines (first at line 3: malformed JSON"),
            "{warnings:?}"
        );
    }

    #[test]
    fn records_that_do_not_match_their_kind_are_skipped() {
        let text = format!(
            "{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"device\":0}}\n{{\"time_ms\":1}}\n\
             {{\"kind\":7}}\n{{\"kind\":\"sample\",\"time_ms\":4,\"device\":0}}\n"
        );
        let (_, recs, stats) = read_bytes(text.into_bytes()).unwrap();
        assert_eq!(recs, vec![Record::Sample(Sample::new(0, 4))]);
        assert_eq!(stats.malformed_lines, 3);
        let first = stats.first_malformed.clone().unwrap();
        assert_eq!(first.line, 2);
        assert!(
            first
                .reason
                .starts_with("invalid sample record: missing field `time_ms`"),
            "{first:?}"
        );
        assert_eq!(
            stats.warnings()[0],
            "skipped 3 malformed lines (first at line 2: invalid sample record: missing field \
             `time_ms`)"
        );
    }

    #[test]
    fn a_huge_invalid_string_is_quoted_short_with_control_characters_escaped() {
        let value = format!("\u{1b}[2J{}", "A".repeat(1 << 20));
        let line = serde_json::json!({"kind": "sample", "time_ms": 1, "device": 0,
            "gpu_util_pct": value});
        let text = format!("{PLAIN_HEADER}\n{line}\n");
        let (_, recs, stats) = read_bytes(text.into_bytes()).unwrap();
        assert!(recs.is_empty());
        let warning = &stats.warnings()[0];
        assert!(warning.len() < 400, "{} bytes", warning.len());
        assert!(warning.contains("expected f64"), "{warning}");
        assert!(warning.contains('…'), "{warning}");
        assert!(!warning.chars().any(char::is_control), "{warning:?}");

        let kind = format!("x\u{7}{}", "y".repeat(1 << 20));
        let line = serde_json::json!({ "kind": kind });
        let text = format!("{PLAIN_HEADER}\n{line}\n");
        let (_, _, stats) = read_bytes(text.into_bytes()).unwrap();
        let warning = &stats.warnings()[0];
        assert!(warning.len() < 400, "{} bytes", warning.len());
        assert!(warning.contains("x\\x07yyy"), "{warning}");
    }

    #[test]
    fn invalid_utf8_is_skipped_naming_the_byte() {
        let mut bytes =
            format!("{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n")
                .into_bytes();
        bytes.extend_from_slice(b"{\"kind\":\"x\xff\"}\n");
        let (_, recs, stats) = read_bytes(bytes).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(
            stats.first_malformed,
            Some(BadLine {
                line: 3,
                reason: "not valid UTF-8 (byte 11 of the line)".into()
            })
        );
    }

    #[test]
    fn overlong_line_is_skipped_and_the_next_line_still_reads() {
        let mut bytes = format!("{PLAIN_HEADER}\n").into_bytes();
        bytes.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        bytes.extend_from_slice(b"\n{\"kind\":\"sample\",\"time_ms\":3,\"device\":1}\n");
        let mut r = RecordingReader::from_reader(Cursor::new(bytes)).unwrap();
        assert_eq!(
            r.next_record().unwrap(),
            Some(Record::Sample(Sample::new(1, 3)))
        );
        assert_eq!(r.line_number(), 3);
        // The skipped line's bytes still count towards the offsets of those after it.
        assert_eq!(
            r.last_line_pos().offset,
            (PLAIN_HEADER.len() + 1 + MAX_LINE_BYTES + 11) as u64
        );
        let stats = r.stats();
        assert_eq!(stats.malformed_lines, 1);
        assert_eq!(
            stats.first_malformed.as_ref().map(|b| b.line),
            Some(2),
            "{stats:?}"
        );
        assert!(stats.warnings()[0].contains("longer than the limit"));
    }

    #[test]
    fn line_exactly_at_the_limit_is_accepted() {
        let mut bytes = format!("{PLAIN_HEADER}\n").into_bytes();
        let record = br#"{"kind":"sample","time_ms":3,"device":1}"#;
        // Pad with spaces (valid JSON whitespace) to exactly the limit.
        bytes.extend_from_slice(record);
        bytes.extend(std::iter::repeat_n(b' ', MAX_LINE_BYTES - record.len()));
        bytes.push(b'\n');
        let (_, recs, stats) = read_bytes(bytes).unwrap();
        assert_eq!(recs, vec![Record::Sample(Sample::new(1, 3))]);
        assert_eq!(stats.malformed_lines, 0);
    }

    #[test]
    fn second_header_is_a_malformed_line() {
        let text = format!(
            "{PLAIN_HEADER}\n{PLAIN_HEADER}\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\n"
        );
        let (_, recs, stats) = read_bytes(text.into_bytes()).unwrap();
        assert_eq!(recs.len(), 1);
        let first = stats.first_malformed.unwrap();
        assert_eq!(first.line, 2);
        assert!(first.reason.contains("a second header"), "{first:?}");
    }

    #[test]
    fn crlf_line_endings_are_accepted() {
        let text =
            format!("{PLAIN_HEADER}\r\n{{\"kind\":\"sample\",\"time_ms\":1,\"device\":0}}\r\n");
        let (_, recs, _) = read_bytes(text.into_bytes()).unwrap();
        assert_eq!(recs.len(), 1);
    }

    #[test]
    fn outlines_read_sample_times_and_whole_findings() {
        let bytes = write_to_bytes(false, &records());
        let input = BufReader::new(Cursor::new(bytes));
        let mut r = RecordingReader::from_decoded(input, "r", false, u64::MAX).unwrap();
        let mut got = Vec::new();
        while let Some(o) = r.next_outline().unwrap() {
            got.push(match o {
                Outline::Sample(t) => format!("sample {t}"),
                Outline::Event(t) => format!("event {t}"),
                Outline::Finding(f) => format!("finding {}", f.id),
                Outline::Beside => "beside".to_owned(),
            });
        }
        assert_eq!(
            got,
            [
                "sample 1767225600000",
                "event 1767225600500",
                "finding errors.ecc_uncorrectable"
            ]
        );
        assert_eq!(r.stats().lines, 0);
    }

    #[test]
    fn a_resumed_reader_counts_only_lines_past_those_already_counted() {
        let text = format!(
            "{PLAIN_HEADER}\n{{oops\n{{\"kind\":\"sample\",\"time_ms\":2,\"device\":0}}\n{{bad\n"
        );
        let mut first =
            RecordingReader::from_reader(Cursor::new(text.clone().into_bytes())).unwrap();
        assert!(first.next_record().unwrap().is_some());
        let pos = first.last_line_pos();
        assert_eq!(pos.line, 3);
        assert_eq!(first.stats().malformed_lines, 1);

        // Back to line 2, having counted through line 3: only line 4 is new.
        let at = LinePos {
            offset: PLAIN_HEADER.len() as u64 + 1,
            line: 2,
        };
        let mut rest = text.into_bytes();
        rest.drain(..at.offset as usize);
        let input = BufReader::new(Cursor::new(rest));
        let mut again = RecordingReader::resume(input, "r", header(), false, at, pos.line);
        assert_eq!(
            again.next_record().unwrap(),
            Some(Record::Sample(Sample::new(0, 2)))
        );
        assert_eq!(again.last_line_pos(), pos);
        assert_eq!(again.next_record().unwrap(), None);
        let mut total = first.stats().clone();
        total.absorb(again.stats());
        assert_eq!(total.malformed_lines, 2);
        assert_eq!(total.first_malformed.map(|b| b.line), Some(2));
        assert_eq!(total.records, 1);
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
