//! The recording format: newline-delimited JSON, plain or gzip.
//!
//! Line 1 is a [`Header`] (`"format":"gpudiag-recording"`, a version, host and static device
//! info); every further line is one JSON object whose `kind` says what it is: `sample`, `event`
//! or `finding`, the record's fields flattened beside `kind`. Readers skip kinds they do not know
//! (and count them), so an old gpudiag can read a newer writer's file.
//!
//! Writing pushes every line to disk at once (gzip: a sync flush), so a recorder that is killed
//! leaves a file whose lines are all readable; the reader tolerates the cut-off last line and the
//! missing gzip trailer such a crash leaves, and reports both in [`ReadStats`]. Everything a user
//! hands us is treated as hostile: lines are read with a hard length limit, and bad input is an
//! error with the line number, never a panic.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{DeviceInfo, Event, HostInfo, Sample, Tick, TimeMs};
use gpudiag_model::finding::Finding;

/// The value of the header's `format` field.
pub const FORMAT_NAME: &str = "gpudiag-recording";
/// The newest format version this build reads and the version it writes.
pub const RECORDING_VERSION: u32 = 1;
/// Longest line accepted, newline excluded. A real record is a few KiB; the limit only exists so
/// a hostile or corrupt file cannot make the reader allocate without bound.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// How many distinct unknown kinds [`ReadStats`] remembers by name (the count is exact).
const MAX_UNKNOWN_KIND_NAMES: usize = 16;
/// Event sub-kinds this build knows (`EventKind`'s tags). An `event` line with another tag comes
/// from a newer writer and is skipped like an unknown kind rather than failing the whole file.
const KNOWN_EVENT_KINDS: [&str; 3] = ["xid", "device_lost", "notice"];
/// Name used in messages when reading from or writing to something that is not a named file.
const STREAM_NAME: &str = "recording";

/// Everything that can go wrong reading or writing a recording. Each message is one line that
/// names the file and, when reading, the line.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// Opening, creating, writing or syncing the file failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    /// Reading failed part way (a disk error, a corrupt gzip stream).
    #[error("{path} line {line}: read error: {source}")]
    Read {
        path: String,
        line: u64,
        source: io::Error,
    },
    /// The input is not a gpudiag recording at all (empty, not JSON, another format).
    #[error("{path} is not a gpudiag recording: {reason}")]
    NotARecording { path: String, reason: String },
    /// Written by a newer gpudiag with a format this build does not know.
    #[error(
        "the recording is format version {found}, but this gpudiag reads versions up to \
         {supported}: upgrade gpudiag to read it"
    )]
    UnsupportedVersion { found: u64, supported: u32 },
    #[error("{path} line {line}: not valid UTF-8 (byte {byte} of the line)")]
    InvalidUtf8 {
        path: String,
        line: u64,
        byte: usize,
    },
    #[error("{path} line {line}: longer than the limit of {limit} bytes")]
    LineTooLong {
        path: String,
        line: u64,
        limit: usize,
    },
    /// A line that is not JSON (and is not a cut-off last line).
    #[error("{path} line {line}: malformed JSON: {source}")]
    Malformed {
        path: String,
        line: u64,
        source: serde_json::Error,
    },
    /// Valid JSON that does not match the record its `kind` names.
    #[error("{path} line {line}: invalid {kind} record: {message}")]
    InvalidRecord {
        path: String,
        line: u64,
        kind: String,
        message: String,
    },
    #[error("cannot serialise a record: {0}")]
    Serialize(#[source] serde_json::Error),
}

/// Line 1 of a recording. `kind: "header"` is added when it is written.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields, transform = gpudiag_model::schema::tagged("kind", "header"))]
pub struct Header {
    /// Always [`FORMAT_NAME`].
    #[schemars(extend("const" = FORMAT_NAME))]
    pub format: String,
    #[schemars(range(min = 1))]
    pub version: u32,
    /// When the recording started, ms since the Unix epoch.
    pub created_ms: TimeMs,
    /// The gpudiag version that wrote the file.
    pub tool_version: String,
    /// The backend that produced the telemetry ("nvml", ...).
    #[schemars(length(min = 1))]
    pub backend: String,
    /// The polling interval, when there was a fixed one.
    #[serde(default)]
    pub interval_ms: Option<u64>,
    #[serde(default)]
    pub host: HostInfo,
    #[serde(default)]
    pub devices: Vec<DeviceInfo>,
    /// How the recorded host's GPUs connect; absent in recordings of older versions.
    #[serde(default)]
    #[schemars(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "gpudiag_model::topology::Topology")]
    pub topology: Option<gpudiag_model::topology::Topology>,
}

impl Header {
    /// A header for a recording that starts now, written by this build.
    pub fn new(
        backend: &str,
        host: HostInfo,
        devices: Vec<DeviceInfo>,
        interval_ms: Option<u64>,
    ) -> Self {
        Header {
            format: FORMAT_NAME.to_string(),
            version: RECORDING_VERSION,
            created_ms: super::now_ms(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            backend: backend.to_string(),
            interval_ms,
            host,
            devices,
            topology: None,
        }
    }
}

/// The header as written: the identifying fields first, so `head -c 80` shows what the file is.
#[derive(Serialize)]
struct HeaderLine<'a> {
    format: &'a str,
    version: u32,
    kind: &'static str,
    created_ms: TimeMs,
    tool_version: &'a str,
    backend: &'a str,
    interval_ms: Option<u64>,
    host: &'a HostInfo,
    devices: &'a [DeviceInfo],
    #[serde(skip_serializing_if = "Option::is_none")]
    topology: Option<&'a gpudiag_model::topology::Topology>,
}

impl Serialize for Header {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        HeaderLine {
            format: &self.format,
            version: self.version,
            kind: "header",
            created_ms: self.created_ms,
            tool_version: &self.tool_version,
            backend: &self.backend,
            interval_ms: self.interval_ms,
            host: &self.host,
            devices: &self.devices,
            topology: self.topology.as_ref(),
        }
        .serialize(serializer)
    }
}

/// One line after the header. Serialises with `kind` first and the record's fields beside it.
// Nearly every record is a sample, so boxing the large variant would only add an allocation per line.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Sample(Sample),
    Event(Event),
    Finding(Finding),
}

impl Record {
    /// The `kind` this record is written with.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Sample(_) => "sample",
            Record::Event(_) => "event",
            Record::Finding(_) => "finding",
        }
    }

    pub fn time_ms(&self) -> TimeMs {
        match self {
            Record::Sample(s) => s.time_ms,
            Record::Event(e) => e.time_ms,
            Record::Finding(f) => f.time_ms,
        }
    }
}

impl From<Sample> for Record {
    fn from(s: Sample) -> Self {
        Record::Sample(s)
    }
}

impl From<Event> for Record {
    fn from(e: Event) -> Self {
        Record::Event(e)
    }
}

impl From<Finding> for Record {
    fn from(f: Finding) -> Self {
        Record::Finding(f)
    }
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

enum Sink {
    Plain(Box<dyn Write + Send>),
    Gzip(GzEncoder<Box<dyn Write + Send>>),
}

/// Writes a recording line by line. Each `write` reaches the file before it returns, so nothing
/// already written is lost if the process dies; `finish` (or drop) completes a gzip stream.
pub struct RecordingWriter {
    /// `None` once finished.
    sink: Option<Sink>,
    /// A second handle on the file, kept only to fsync it at the end.
    sync_file: Option<File>,
    path: String,
    buf: Vec<u8>,
    lines: u64,
}

impl std::fmt::Debug for RecordingWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingWriter")
            .field("path", &self.path)
            .field("lines", &self.lines)
            .field("finished", &self.sink.is_none())
            .finish()
    }
}

impl RecordingWriter {
    /// Creates (or truncates) `path` and writes the header. A name ending in `.gz` is written
    /// as gzip.
    pub fn create(path: impl AsRef<Path>, header: &Header) -> Result<Self, RecordingError> {
        Self::create_with(path, header, true)
    }

    /// Like `create`, but with `overwrite == false` refuses (atomically, `O_EXCL`) to replace a
    /// file that exists, so a user's earlier recording is never truncated.
    pub fn create_with(
        path: impl AsRef<Path>,
        header: &Header,
        overwrite: bool,
    ) -> Result<Self, RecordingError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io_err = |source| RecordingError::Io {
            op: "create",
            path: name.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(overwrite)
            .truncate(overwrite)
            .create_new(!overwrite)
            .open(path)
            .map_err(io_err)?;
        let sync_file = file.try_clone().map_err(io_err)?;
        let gzip = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
        let mut w = Self::build(Box::new(file), gzip, name.clone());
        w.sync_file = Some(sync_file);
        w.write_header(header)?;
        Ok(w)
    }

    /// Writes a recording to any writer (tests, pipes); `gzip` chooses the compression.
    pub fn from_writer(
        writer: impl Write + Send + 'static,
        gzip: bool,
        header: &Header,
    ) -> Result<Self, RecordingError> {
        let mut w = Self::build(Box::new(writer), gzip, STREAM_NAME.to_string());
        w.write_header(header)?;
        Ok(w)
    }

    fn build(inner: Box<dyn Write + Send>, gzip: bool, path: String) -> Self {
        let sink = if gzip {
            Sink::Gzip(GzEncoder::new(inner, Compression::default()))
        } else {
            Sink::Plain(inner)
        };
        RecordingWriter {
            sink: Some(sink),
            sync_file: None,
            path,
            buf: Vec::with_capacity(4096),
            lines: 0,
        }
    }

    fn write_header(&mut self, header: &Header) -> Result<(), RecordingError> {
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, header).map_err(RecordingError::Serialize)?;
        self.buf.push(b'\n');
        self.push(1)
    }

    /// Writes one record and pushes it to disk.
    pub fn write(&mut self, record: &Record) -> Result<(), RecordingError> {
        self.write_batch([record])
    }

    /// Writes several records with one flush (e.g. every sample of a tick).
    pub fn write_batch<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Result<(), RecordingError> {
        self.buf.clear();
        let mut n = 0;
        for r in records {
            serde_json::to_writer(&mut self.buf, r).map_err(RecordingError::Serialize)?;
            self.buf.push(b'\n');
            n += 1;
        }
        self.push(n)
    }

    /// Writes a tick: its events first, then its samples, which is the order replay groups by.
    pub fn write_tick(&mut self, tick: &Tick) -> Result<(), RecordingError> {
        let records: Vec<Record> = tick
            .events
            .iter()
            .cloned()
            .map(Record::Event)
            .chain(tick.samples.iter().cloned().map(Record::Sample))
            .collect();
        self.write_batch(&records)
    }

    /// Lines written so far, the header included.
    pub fn lines_written(&self) -> u64 {
        self.lines
    }

    /// Writes `self.buf` (whole lines only) and flushes it through to the file.
    fn push(&mut self, lines: u64) -> Result<(), RecordingError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let result = match self.sink.as_mut() {
            Some(Sink::Plain(w)) => w.write_all(&self.buf).and_then(|()| w.flush()),
            // GzEncoder::flush is a sync flush: the compressed bytes so far form a prefix that
            // decodes to exactly the lines written, even if the trailer never comes.
            Some(Sink::Gzip(w)) => w.write_all(&self.buf).and_then(|()| w.flush()),
            None => Err(io::Error::other("the recording is already finished")),
        };
        result.map_err(|source| RecordingError::Io {
            op: "write",
            path: self.path.clone(),
            source,
        })?;
        self.lines += lines;
        Ok(())
    }

    /// Completes the gzip stream and syncs the file to disk.
    pub fn finish(mut self) -> Result<(), RecordingError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<(), RecordingError> {
        let io_err = |path: &str, source| RecordingError::Io {
            op: "finish",
            path: path.to_string(),
            source,
        };
        match self.sink.take() {
            Some(Sink::Plain(mut w)) => w.flush().map_err(|e| io_err(&self.path, e))?,
            Some(Sink::Gzip(enc)) => {
                let mut w = enc.finish().map_err(|e| io_err(&self.path, e))?;
                w.flush().map_err(|e| io_err(&self.path, e))?;
            }
            None => return Ok(()),
        }
        if let Some(f) = self.sync_file.take() {
            f.sync_all().map_err(|e| io_err(&self.path, e))?;
        }
        Ok(())
    }
}

impl Drop for RecordingWriter {
    fn drop(&mut self) {
        // Best effort: every line is already on disk; this only adds the gzip trailer and fsyncs.
        let _ = self.finish_inner();
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
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::{Absent, EventKind};
    use gpudiag_model::finding::{Evidence, Severity};

    /// A `Write` whose bytes the test can still see after the writer took it.
    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl SharedBuf {
        fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    fn header() -> Header {
        let mut h = Header::new(
            "nvml",
            HostInfo {
                hostname: Some("node7".into()),
                driver_version: Some("580.65.06".into()),
                cuda_driver_version: Some("13.0".into()),
                nvml_version: Some("13.580.65.06".into()),
            },
            vec![DeviceInfo {
                index: 0,
                name: Some("NVIDIA H200".into()),
                memory_total_bytes: Some(150_754_820_096),
                ..DeviceInfo::default()
            }],
            Some(1000),
        );
        h.created_ms = 1_767_225_600_000;
        h
    }

    fn records() -> Vec<Record> {
        let mut s = Sample::new(0, 1_767_225_600_000);
        s.gpu_util_pct = Some(97.0);
        s.power_w = Some(652.25);
        s.mem_used_bytes = Some(120_000_000_000);
        s.throttle_reason_names = Some(vec!["sw_power_cap".into()]);
        s.absent.insert("fan_pct".into(), Absent::NotSupported);
        s.absent.insert(
            "pcie_rx_bytes_per_s".into(),
            Absent::Error("timeout".into()),
        );
        let e = Event {
            time_ms: 1_767_225_600_500,
            device: Some(0),
            kind: EventKind::Xid { xid: 48 },
        };
        let mut values = serde_json::Map::new();
        values.insert("ecc_uncorrected_volatile".into(), 2.into());
        let f = Finding {
            id: "errors.ecc_uncorrectable".into(),
            severity: Severity::Fail,
            device: Some(0),
            time_ms: 1_767_225_601_000,
            title: "uncorrectable ECC errors".into(),
            evidence: Evidence {
                values,
                window_s: 0.0,
                threshold: "> 0".into(),
            },
            advice: "drain the node".into(),
            recorded: false,
        };
        vec![Record::Sample(s), Record::Event(e), Record::Finding(f)]
    }

    fn write_to_bytes(gzip: bool, recs: &[Record]) -> Vec<u8> {
        let buf = SharedBuf::default();
        let mut w = RecordingWriter::from_writer(buf.clone(), gzip, &header()).unwrap();
        for r in recs {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        buf.bytes()
    }

    fn read_bytes(bytes: Vec<u8>) -> Result<(Header, Vec<Record>, ReadStats), RecordingError> {
        read_all_from(Cursor::new(bytes))
    }

    const PLAIN_HEADER: &str = r#"{"format":"gpudiag-recording","version":1,"kind":"header","created_ms":5,"tool_version":"0.1.0","backend":"nvml","interval_ms":null,"host":{},"devices":[]}"#;

    #[test]
    fn round_trip_plain_and_gzip() {
        for gzip in [false, true] {
            let bytes = write_to_bytes(gzip, &records());
            assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), gzip);
            let (h, recs, stats) = read_bytes(bytes).unwrap();
            assert_eq!(h, header());
            assert_eq!(recs, records());
            assert_eq!(stats.records, 3);
            assert_eq!(stats.lines, 4);
            assert_eq!(stats.gzip, gzip);
            assert!(!stats.is_truncated());
            assert!(stats.warnings().is_empty());
        }
    }

    #[test]
    fn lines_have_kind_first_and_fields_flattened() {
        let bytes = write_to_bytes(false, &records());
        let text = String::from_utf8(bytes).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[0].starts_with(r#"{"format":"gpudiag-recording","version":1,"kind":"header","#)
        );
        assert!(lines[1].starts_with(r#"{"kind":"sample","time_ms":1767225600000,"device":0,"#));
        assert!(lines[1].contains(r#""absent":{"fan_pct":"not_supported","#));
        assert_eq!(
            lines[2],
            r#"{"kind":"event","time_ms":1767225600500,"device":0,"event":"xid","xid":48}"#
        );
        assert!(lines[3].starts_with(r#"{"kind":"finding","id":"errors.ecc_uncorrectable","#));
    }

    #[test]
    fn every_write_reaches_the_sink_at_once() {
        for gzip in [false, true] {
            let buf = SharedBuf::default();
            let mut w = RecordingWriter::from_writer(buf.clone(), gzip, &header()).unwrap();
            w.write(&records()[0]).unwrap();
            // Not finished: what is in the sink already decodes to the header and one record.
            let (_, recs, stats) = read_bytes(buf.bytes()).unwrap();
            assert_eq!(recs, vec![records()[0].clone()]);
            assert_eq!(stats.gzip_unfinished, gzip);
            assert!(!stats.truncated_last_line);
            assert_eq!(w.lines_written(), 2);
            drop(w);
            // Drop finished the stream.
            let (_, _, stats) = read_bytes(buf.bytes()).unwrap();
            assert!(!stats.gzip_unfinished);
        }
    }

    #[test]
    fn write_tick_puts_events_before_samples() {
        let buf = SharedBuf::default();
        let mut w = RecordingWriter::from_writer(buf.clone(), false, &header()).unwrap();
        let tick = Tick {
            samples: vec![Sample::new(0, 10), Sample::new(1, 10)],
            events: vec![Event {
                time_ms: 9,
                device: None,
                kind: EventKind::Notice {
                    message: "hi".into(),
                },
            }],
        };
        w.write_tick(&tick).unwrap();
        w.finish().unwrap();
        let (_, recs, _) = read_bytes(buf.bytes()).unwrap();
        let kinds: Vec<&str> = recs.iter().map(Record::kind).collect();
        assert_eq!(kinds, ["event", "sample", "sample"]);
    }

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
    fn gzip_cut_mid_stream_keeps_everything_flushed() {
        let buf = SharedBuf::default();
        let mut w = RecordingWriter::from_writer(buf.clone(), true, &header()).unwrap();
        w.write(&records()[0]).unwrap();
        w.write(&records()[1]).unwrap();
        let flushed = buf.bytes().len();
        w.write(&records()[2]).unwrap();
        let mut bytes = buf.bytes();
        // Somewhere inside the third record's compressed bytes.
        bytes.truncate(flushed + (bytes.len() - flushed) / 2);
        std::mem::forget(w);
        let (_, recs, stats) = read_bytes(bytes).unwrap();
        assert_eq!(recs, records()[..2].to_vec());
        assert!(stats.gzip_unfinished);
        assert!(stats.is_truncated());
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

    #[test]
    fn create_picks_gzip_by_name_and_open_detects_by_content() {
        let dir = tempfile::tempdir().unwrap();
        // A gzip file with a misleading name still reads: detection is by magic bytes.
        let gz = dir.path().join("rec.ndjson.gz");
        let mut w = RecordingWriter::create(&gz, &header()).unwrap();
        w.write(&records()[0]).unwrap();
        w.finish().unwrap();
        let renamed = dir.path().join("rec.ndjson");
        std::fs::rename(&gz, &renamed).unwrap();
        assert_eq!(std::fs::read(&renamed).unwrap()[..2], [0x1f, 0x8b]);
        let (h, recs, stats) = read_all(&renamed).unwrap();
        assert_eq!(h, header());
        assert_eq!(recs, vec![records()[0].clone()]);
        assert!(stats.gzip);

        let missing = dir.path().join("nope.ndjson");
        let err = read_all(&missing).unwrap_err();
        assert!(
            matches!(err, RecordingError::Io { op: "open", .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("nope.ndjson"), "{err}");
    }
}
