//! Why a recording or bundle could not be read or written: below the recording format and the
//! `Backend` contract alike, which both name it.

use std::io;

/// Everything that ends reading or writing a recording. Each message is one line that names the
/// file. A bad line in the middle of a recording is not among them: the reader skips it and
/// counts it in [`ReadStats`].
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// Opening, creating, writing or syncing the file failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    /// Reading the header failed (a disk error, a corrupt gzip stream at its start).
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
    /// A header line that says it is one but does not hold what a header must.
    #[error("{path} line {line}: invalid {kind} record: {message}")]
    InvalidRecord {
        path: String,
        line: u64,
        kind: String,
        message: String,
    },
    /// A bug-report bundle gpudiag will not read: no recording in it, or one it cannot pick
    /// safely.
    #[error("{path}: {reason}")]
    BadBundle { path: String, reason: String },
    /// A compressed input inflates past the limit it is read under.
    #[error(
        "{path}: the recording inflates to more than {limit} bytes ({human}), the limit for \
         bundles; pass --max-inflated-size with a larger size to read it anyway",
        human = human_bytes(*limit)
    )]
    TooLarge { path: String, limit: u64 },
    /// The input goes on and on without records (blank lines, junk, unknown kinds): reading
    /// stopped rather than spend minutes on what a small compressed file can inflate to.
    #[error(
        "{path} line {line}: stopped reading: {junk_lines} lines so far are blank, malformed or \
         of unknown kinds against {records} records (a recording is mostly records; gpudiag reads \
         at most about {per_record} such lines per record), so this is not a recording it can use"
    )]
    MostlyNotRecords {
        path: String,
        line: u64,
        junk_lines: u64,
        records: u64,
        per_record: u64,
    },
    #[error("cannot serialise a record: {0}")]
    Serialize(#[source] serde_json::Error),
}

/// `bytes` in the largest binary unit that keeps it at or above 1 ("4 GiB", "512 MiB").
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
