//! Bug-report bundles (`gpudiag report`'s .tar.gz) as replays. The archive is walked header by
//! header as it streams past, so it reads the same from a file or a pipe, and its recording
//! member is streamed too, never held whole: a bundle of a few kilobytes can inflate to
//! gigabytes, which is also why what it inflates to is capped ([`DEFAULT_MAX_INFLATED`]).
//!
//! Which member is the recording: `recording.ndjson.gz` at the top, after a single leading `./`,
//! or one directory down, since that is what `tar czf` makes of an extracted bundle. A member
//! path that is absolute or climbs out with `..`, a second recording, or a link in its place makes
//! the archive ambiguous or hostile, and it is refused rather than guessed at.

use std::io::{self, Read};

use flate2::read::GzDecoder;

use crate::recording::{EXCERPT_CHARS, InflateLimit, RecordingError, excerpt};

/// The bundle member that holds the recording.
pub const RECORDING: &str = "recording.ndjson.gz";
/// What a bundle may inflate to unless told otherwise (`--max-inflated-size`): far more than any
/// bundle `gpudiag report` writes, far less than a decompression bomb can claim.
pub const DEFAULT_MAX_INFLATED: u64 = 4 << 30;
/// Longest GNU long name or pax header accepted; real ones are a few hundred bytes.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;
const BLOCK: u64 = 512;

/// True when `prefix` starts a gzip stream whose content is a tar archive (ustar magic at 257).
pub(crate) fn is_tar_gz(prefix: &[u8]) -> bool {
    tar_gz_verdict(prefix).unwrap_or(false)
}

/// Whether `prefix` starts a tar.gz, or `None` while it is gzip but too short to tell.
pub(crate) fn tar_gz_verdict(prefix: &[u8]) -> Option<bool> {
    if prefix.len() < 2 || prefix[..2] != [0x1f, 0x8b] {
        return Some(false);
    }
    let mut head = Vec::with_capacity(512);
    let _ = GzDecoder::new(prefix).take(512).read_to_end(&mut head);
    (head.len() >= 262).then(|| &head[257..262] == b"ustar")
}

/// A reader that fails once more than `limit` bytes came through it, with an error the
/// recording reader recognises ([`InflateLimit`]) and never mistakes for a damaged stream.
pub(crate) struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R> Capped<R> {
    pub(crate) fn new(inner: R, limit: u64) -> Self {
        Capped {
            inner,
            left: limit,
            limit,
        }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::other(InflateLimit { limit: self.limit }));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// What a member's path makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathClass {
    /// The recording, where gpudiag looks for it.
    Recording,
    /// A recording deeper down than gpudiag looks.
    DeepRecording,
    /// Absolute, or with a `..` component.
    Unsafe,
    Other,
}

pub(crate) fn classify(path: &str) -> PathClass {
    if path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return PathClass::Unsafe;
    }
    let rest = path.strip_prefix("./").unwrap_or(path);
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [file] if *file == RECORDING => PathClass::Recording,
        [dir, file] if *file == RECORDING && !dir.is_empty() && *dir != "." => PathClass::Recording,
        [.., file] if *file == RECORDING => PathClass::DeepRecording,
        _ => PathClass::Other,
    }
}

/// A member header as the walk met it.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Its path, for messages (lossy UTF-8, not yet shortened).
    pub path: String,
    /// Where its data starts in the decompressed archive, and how long it is.
    pub start: u64,
    pub size: u64,
    /// A plain file (not a directory, link or device).
    pub regular: bool,
}

/// Why walking an archive stopped.
pub(crate) enum WalkError {
    Io(io::Error),
    Bad(String),
}

impl From<io::Error> for WalkError {
    fn from(e: io::Error) -> Self {
        WalkError::Io(e)
    }
}

/// Walks a tar stream member by member; in between, reads the current member's data.
pub(crate) struct TarWalker<R> {
    inner: R,
    /// Bytes of the archive consumed.
    pos: u64,
    /// Bytes of the current member's data not read yet, and the padding after them.
    left: u64,
    pad: u64,
}

impl<R: Read> TarWalker<R> {
    pub(crate) fn new(inner: R) -> Self {
        TarWalker {
            inner,
            pos: 0,
            left: 0,
            pad: 0,
        }
    }

    /// The next member, its data ready to be read; `None` at the end of the archive.
    pub(crate) fn next_member(&mut self) -> Result<Option<Member>, WalkError> {
        let mut long_name: Option<Vec<u8>> = None;
        let mut pax_size: Option<u64> = None;
        loop {
            self.skip(self.left + self.pad)?;
            self.left = 0;
            self.pad = 0;
            let mut block = [0u8; BLOCK as usize];
            let got = fill(&mut self.inner, &mut block)?;
            self.pos += got as u64;
            // A missing end-of-archive marker is common enough (cut downloads) to accept.
            if got == 0 || block.iter().all(|&b| b == 0) {
                return Ok(None);
            }
            if got < block.len() {
                return Err(WalkError::Bad(
                    "the tar archive ends inside a header".into(),
                ));
            }
            let header = tar::Header::from_byte_slice(&block);
            check_sum(header)?;
            let size = match pax_size.take() {
                Some(size) => size,
                None => header
                    .entry_size()
                    .map_err(|e| WalkError::Bad(format!("a tar header has a bad size: {e}")))?,
            };
            self.left = size;
            self.pad = (BLOCK - size % BLOCK) % BLOCK;
            let kind = header.entry_type();
            if kind.is_gnu_longname() {
                long_name = Some(self.read_extension(size)?);
                continue;
            }
            if kind.is_pax_local_extensions() {
                let data = self.read_extension(size)?;
                for ext in tar::PaxExtensions::new(&data).flatten() {
                    match ext.key() {
                        Ok("path") => long_name = Some(ext.value_bytes().to_vec()),
                        Ok("size") => pax_size = ext.value().ok().and_then(|v| v.parse().ok()),
                        _ => {}
                    }
                }
                continue;
            }
            if kind.is_pax_global_extensions() || kind.is_gnu_longlink() {
                continue;
            }
            let raw = long_name
                .take()
                .unwrap_or_else(|| header.path_bytes().into_owned());
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            return Ok(Some(Member {
                path: String::from_utf8_lossy(&raw[..end]).into_owned(),
                start: self.pos,
                size,
                regular: kind.is_file() || kind.is_contiguous(),
            }));
        }
    }

    fn read_extension(&mut self, size: u64) -> Result<Vec<u8>, WalkError> {
        if size > MAX_EXTENSION_BYTES {
            return Err(WalkError::Bad(format!(
                "a tar extension header of {size} bytes (at most {MAX_EXTENSION_BYTES} expected)"
            )));
        }
        let mut data = Vec::new();
        self.read_to_end(&mut data)?;
        if (data.len() as u64) < size {
            return Err(WalkError::Bad(
                "the tar archive ends inside a member".into(),
            ));
        }
        Ok(data)
    }

    fn skip(&mut self, n: u64) -> Result<(), WalkError> {
        let skipped = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        self.pos += skipped;
        if skipped < n {
            return Err(WalkError::Bad(
                "the tar archive ends inside a member".into(),
            ));
        }
        Ok(())
    }
}

impl<R: Read> Read for TarWalker<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.left) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the tar archive ends inside a member",
            ));
        }
        self.left -= n as u64;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Reads until `buf` is full or the input ends; the number of bytes read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A header whose checksum does not match is not a tar header (or a damaged one).
fn check_sum(header: &tar::Header) -> Result<(), WalkError> {
    let bytes = header.as_bytes();
    let sum: u32 = bytes[..148]
        .iter()
        .chain(&bytes[156..])
        .map(|&b| u32::from(b))
        .sum::<u32>()
        + 8 * 32;
    match header.cksum() {
        Ok(expected) if expected == sum => Ok(()),
        _ => Err(WalkError::Bad(
            "a tar header is damaged (checksum mismatch)".into(),
        )),
    }
}

/// Walks `walker` to the recording member, checking every member on the way, and leaves it at
/// the recording's data. With `to_end`, walks the rest of the archive too (for input that can be
/// read again), so a second recording or an unsafe path after the first is found as well.
pub(crate) fn find_recording<R: Read>(
    walker: &mut TarWalker<R>,
    to_end: bool,
    name: &str,
) -> Result<Member, RecordingError> {
    let bad = |reason: String| RecordingError::BadBundle {
        path: name.to_string(),
        reason,
    };
    let quote = |path: &str| format!("\"{}\"", excerpt(path, EXCERPT_CHARS));
    let mut found: Option<Member> = None;
    let mut deep: Option<String> = None;
    loop {
        let member = match walker.next_member() {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(WalkError::Io(e)) => {
                if let Some(limit) = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<InflateLimit>())
                    .map(|l| l.limit)
                {
                    return Err(RecordingError::TooLarge {
                        path: name.to_string(),
                        limit,
                    });
                }
                return Err(bad(format!("unreadable tar.gz: {e}")));
            }
            Err(WalkError::Bad(reason)) => return Err(bad(reason)),
        };
        match classify(&member.path) {
            PathClass::Unsafe => {
                return Err(bad(format!(
                    "the archive has a member named {}, an absolute path or one that climbs out \
                     with \"..\"; gpudiag does not read such archives",
                    quote(&member.path)
                )));
            }
            PathClass::Recording if !member.regular => {
                return Err(bad(format!(
                    "the archive's {} is a link or a directory, not a recording",
                    quote(&member.path)
                )));
            }
            PathClass::Recording => {
                if let Some(first) = &found {
                    return Err(bad(format!(
                        "the archive holds more than one recording ({} and {}), so which one to \
                         read is ambiguous; extract the one you mean and pass it alone",
                        quote(&first.path),
                        quote(&member.path)
                    )));
                }
                if !to_end {
                    return Ok(member);
                }
                found = Some(member);
            }
            PathClass::DeepRecording => {
                deep.get_or_insert(member.path);
            }
            PathClass::Other => {}
        }
    }
    found.ok_or_else(|| {
        let hint = deep.map_or(String::new(), |d| {
            format!(
                " ({} lies deeper than gpudiag looks: at the top, or one directory down)",
                quote(&d)
            )
        });
        RecordingError::NotARecording {
            path: name.to_string(),
            reason: format!("it is a tar.gz archive without {RECORDING}{hint}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_the_recording_may_sit() {
        for ok in [
            "recording.ndjson.gz",
            "./recording.ndjson.gz",
            "report-1/recording.ndjson.gz",
            "./report-1/recording.ndjson.gz",
        ] {
            assert_eq!(classify(ok), PathClass::Recording, "{ok}");
        }
        for deep in ["a/b/recording.ndjson.gz", "././recording.ndjson.gz"] {
            assert_eq!(classify(deep), PathClass::DeepRecording, "{deep}");
        }
        for unsafe_path in [
            "/recording.ndjson.gz",
            "../recording.ndjson.gz",
            "a/../recording.ndjson.gz",
            "/etc/passwd",
            "x/..",
        ] {
            assert_eq!(classify(unsafe_path), PathClass::Unsafe, "{unsafe_path}");
        }
        for other in [
            "README.md",
            "recording.ndjson",
            "./",
            "a/recording.ndjson.gz.txt",
        ] {
            assert_eq!(classify(other), PathClass::Other, "{other}");
        }
    }

    #[test]
    fn capped_reader_stops_past_its_limit() {
        let mut r = Capped::new(io::Cursor::new(vec![7u8; 100]), 64);
        let mut out = Vec::new();
        let err = r.read_to_end(&mut out).unwrap_err();
        let limit = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<InflateLimit>())
            .map(|l| l.limit);
        assert_eq!(limit, Some(64));
        let mut r = Capped::new(io::Cursor::new(vec![7u8; 64]), 64);
        assert_eq!(r.read_to_end(&mut Vec::new()).unwrap(), 64);
    }
}
