//! Reading a bug-report bundle (`gpudiag report`'s .tar.gz) as a replay: its recording member is
//! streamed from the archive, never held whole, since a small bundle can inflate to gigabytes.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use crate::BackendError;
use crate::recording::{RecordingError, RecordingReader};
use crate::replay::{Pace, ReplayBackend};

/// The bundle member that holds the recording.
pub const RECORDING: &str = "recording.ndjson.gz";

/// True when `bytes` start a gzip stream whose content is a tar archive (ustar magic at 257).
fn is_tar_gz(prefix: &[u8]) -> bool {
    if prefix.len() < 2 || prefix[..2] != [0x1f, 0x8b] {
        return false;
    }
    let mut head = Vec::with_capacity(512);
    let _ = GzDecoder::new(prefix).take(512).read_to_end(&mut head);
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// Opens `path` as a replay: a bug-report bundle's recording, or a recording file (plain or
/// gzip). The content decides, not the name.
pub fn open_bundle_recording(path: &Path, pace: Pace) -> Result<ReplayBackend, BackendError> {
    let name = path.display().to_string();
    let io = |op, source| {
        BackendError::Recording(RecordingError::Io {
            op,
            path: name.clone(),
            source,
        })
    };
    let mut file = std::fs::File::open(path).map_err(|e| io("open", e))?;
    let mut prefix = Vec::new();
    (&mut file)
        .take(64 * 1024)
        .read_to_end(&mut prefix)
        .map_err(|e| io("read", e))?;
    if !is_tar_gz(&prefix) {
        return ReplayBackend::open(path, pace);
    }
    let (start, size) = member_span(path, RECORDING)?.ok_or_else(|| {
        BackendError::Recording(RecordingError::NotARecording {
            path: name.clone(),
            reason: format!("it is a tar.gz archive without {RECORDING}"),
        })
    })?;
    // Streamed from a second pass over the file rather than read into memory: a bundle of a
    // few hundred kilobytes can hold a member that inflates to gigabytes.
    let mut tar = GzDecoder::new(std::io::BufReader::new(
        std::fs::File::open(path).map_err(|e| io("open", e))?,
    ));
    let skipped = std::io::copy(&mut (&mut tar).take(start), &mut std::io::sink())
        .map_err(|e| io("read", e))?;
    if skipped < start {
        return Err(BackendError::Recording(RecordingError::NotARecording {
            path: name,
            reason: format!("{RECORDING} lies past the end of the archive"),
        }));
    }
    // Named, so an error says which file it is about.
    let mut reader =
        RecordingReader::from_reader_named(tar.take(size), &format!("{name} ({RECORDING})"))?;
    let mut records = Vec::new();
    while let Some(r) = reader.next_record()? {
        records.push(r);
    }
    let (header, stats) = reader.into_parts();
    ReplayBackend::from_parts(header, records, stats, pace)
}

/// Where a member's bytes start in the decompressed tar stream, and how many there are.
fn member_span(path: &Path, member: &str) -> Result<Option<(u64, u64)>, BackendError> {
    let name = path.display().to_string();
    let bad = |reason: String| {
        BackendError::Recording(RecordingError::NotARecording {
            path: name.clone(),
            reason,
        })
    };
    let file = std::fs::File::open(path).map_err(|source| {
        BackendError::Recording(RecordingError::Io {
            op: "open",
            path: name.clone(),
            source,
        })
    })?;
    let mut archive = tar::Archive::new(GzDecoder::new(std::io::BufReader::new(file)));
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("unreadable tar.gz: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| bad(format!("unreadable tar.gz entry: {e}")))?;
        if entry
            .path()
            .ok()
            .is_some_and(|p| p.as_ref() == Path::new(member))
        {
            return Ok(Some((entry.raw_file_position(), entry.size())));
        }
    }
    Ok(None)
}
