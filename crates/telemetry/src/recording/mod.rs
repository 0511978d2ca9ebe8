//! The recording format: newline-delimited JSON, plain or gzip.
//!
//! Line 1 is a [`Header`] (`"format":"gpudiag-recording"`, a version, host and static device
//! info); every further line is one JSON object whose `kind` says what it is: `sample`, `event`,
//! `nccl_ras`
//! or `finding`, the record's fields flattened beside `kind`. Readers skip kinds they do not know
//! (and count them), so an old gpudiag can read a newer writer's file.
//!
//! The format's types live here, and the writer and the reader each in their own file, because
//! each defends something else: the writer that a recorder killed mid-write still leaves a
//! readable file, the reader that a file a user hands us cannot crash it or exhaust its memory.

mod reader;
mod writer;

pub use reader::{BadLine, LinePos, ReadStats, RecordingReader, read_all, read_all_from};
pub(crate) use reader::{Outline, read_prefix};
pub use writer::RecordingWriter;

pub use crate::recording_error::{RecordingError, human_bytes};

use serde::{Deserialize, Serialize};

use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{DeviceInfo, Event, HostInfo, Sample, TimeMs};

/// The value of the header's `format` field.
pub const FORMAT_NAME: &str = "gpudiag-recording";
/// The newest format version this build reads and the version it writes.
pub const RECORDING_VERSION: u32 = 1;
/// Longest line accepted, newline excluded. A real record is a few KiB; the limit only exists so
/// a hostile or corrupt file cannot make the reader allocate without bound.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// Name used in messages when reading from or writing to something that is not a named file.
const STREAM_NAME: &str = "recording";

/// How many characters of a user's text (a line, a kind, a member name) a message quotes.
pub const EXCERPT_CHARS: usize = 80;

/// What a reader wrapped around a decompressor returns once the limit on inflated bytes is
/// passed, so the recording reader can tell it from a damaged stream (which it tolerates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("inflates to more than {limit} bytes")]
pub struct InflateLimit {
    pub limit: u64,
}

/// At most `max_chars` characters of `text`, with control characters escaped and `…` where it
/// was cut: a line or name from a hostile file can be megabytes long or move the cursor, and a
/// message only needs enough of it to be recognised.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    let cut: String = text.chars().take(max_chars).collect();
    let mut out = gpudiag_model::printable::line(&cut).into_owned();
    if text.chars().nth(max_chars).is_some() {
        out.push('…');
    }
    out
}

/// A parser's message made safe to print: serde quotes the offending value whole (a 1 MB string
/// comes back 1 MB long), so every run of text longer than [`EXCERPT_CHARS`] is cut, and the
/// whole stays within a few lines.
pub fn tidy_message(message: &str) -> String {
    let mut out = String::new();
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&excerpt(word, EXCERPT_CHARS));
    }
    excerpt(&out, 4 * EXCERPT_CHARS)
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
    /// The gpudiag build that wrote the file: `0.1.0 (abc123def)`, with `, dirty` when its
    /// tree had changes, or `0.1.0 (commit unknown)`; earlier builds wrote the version alone.
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
            created_ms: gpudiag_model::sample::now_ms(),
            tool_version: gpudiag_model::build_info::LONG_VERSION.to_string(),
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
    /// An answer of NCCL's RAS service (progress evidence of a job).
    #[serde(rename = "nccl_ras")]
    Ras(gpudiag_model::ras::RasAnswer),
    /// What `run --kernels` had recorded of the command's kernels, copies and syncs by then.
    Kernels(gpudiag_model::kernels::RecordedKernels),
}

impl Record {
    /// The `kind` this record is written with.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Sample(_) => "sample",
            Record::Event(_) => "event",
            Record::Finding(_) => "finding",
            Record::Ras(_) => "nccl_ras",
            Record::Kernels(_) => "kernels",
        }
    }

    pub fn time_ms(&self) -> TimeMs {
        match self {
            Record::Sample(s) => s.time_ms,
            Record::Event(e) => e.time_ms,
            Record::Finding(f) => f.time_ms,
            Record::Ras(r) => r.time_ms,
            Record::Kernels(k) => k.time_ms,
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

/// What the writer's and the reader's tests share: a header, one record of each kind, and bytes
/// written or read in memory.
#[cfg(test)]
mod test_fixtures {
    use std::io::{self, Cursor, Write};
    use std::sync::{Arc, Mutex};

    use super::*;
    use gpudiag_model::finding::{Evidence, Severity};
    use gpudiag_model::sample::{Absent, EventKind};

    /// A `Write` whose bytes the test can still see after the writer took it.
    #[derive(Clone, Default)]
    pub(super) struct SharedBuf(Arc<Mutex<Vec<u8>>>);

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
        pub(super) fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    pub(super) fn header() -> Header {
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

    pub(super) fn records() -> Vec<Record> {
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
        let f = Finding::new(
            "errors.ecc_uncorrectable".into(),
            Severity::Fail,
            Some(0),
            1_767_225_601_000,
            "uncorrectable ECC errors".into(),
            Evidence {
                values,
                window_s: 0.0,
                threshold: "> 0".into(),
            },
            "drain the node".into(),
        );
        vec![Record::Sample(s), Record::Event(e), Record::Finding(f)]
    }

    pub(super) fn write_to_bytes(gzip: bool, recs: &[Record]) -> Vec<u8> {
        let buf = SharedBuf::default();
        let mut w = RecordingWriter::from_writer(buf.clone(), gzip, &header()).unwrap();
        for r in recs {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        buf.bytes()
    }

    pub(super) fn read_bytes(
        bytes: Vec<u8>,
    ) -> Result<(Header, Vec<Record>, ReadStats), RecordingError> {
        read_all_from(Cursor::new(bytes))
    }

    pub(super) const PLAIN_HEADER: &str = r#"{"format":"gpudiag-recording","version":1,"kind":"header","created_ms":5,"tool_version":"0.1.0","backend":"nvml","interval_ms":null,"host":{},"devices":[]}"#;
}

#[cfg(test)]
mod tests {
    use super::test_fixtures::*;
    use super::*;

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
