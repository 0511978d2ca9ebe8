//! Where a replay's bytes come from and how its recording sits in them. The input is opened once
//! and sniffed from what was read of it (a pipe cannot be opened twice): plain NDJSON, gzip, or
//! a bundle. Input that can be read again (a regular file, bytes in memory) gives the replay
//! passes from any line of the recording; a stream (a pipe, a FIFO, stdin) gives one pass.

use std::io::{self, BufRead, BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::{Arc, Mutex};

use flate2::read::{GzDecoder, MultiGzDecoder};

use crate::bundle_reader::{self, Capped, TarWalker};
use crate::recording::read_prefix;
use crate::recording::{Header, LinePos, RecordingError, RecordingReader};

/// How much of the input is read to tell what it is: enough for a tar.gz's first header.
const SNIFF_BYTES: usize = 64 * 1024;
/// Read buffer for the decompressed recording; lines are a few KiB.
const BUF_BYTES: usize = 64 * 1024;

/// Limits a replay reads its input under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayOptions {
    /// The most a bundle may inflate to, both the archive and the recording in it; past it the
    /// replay fails with [`RecordingError::TooLarge`].
    pub max_inflated_bytes: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            max_inflated_bytes: bundle_reader::DEFAULT_MAX_INFLATED,
        }
    }
}

pub(crate) trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

type Shared = Arc<Mutex<Box<dyn ReadSeek>>>;

/// How the recording sits in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Plain,
    Gzip,
    /// A tar.gz bundle whose recording member's data is at `start` of the decompressed
    /// archive, `size` bytes long, and (`gzip`) itself compressed.
    Bundle {
        start: u64,
        size: u64,
        gzip: bool,
    },
}

/// An input that can be read again: each pass reads it from its own position.
pub(crate) struct Rereadable {
    shared: Shared,
    container: Container,
    name: String,
    limit: u64,
}

/// A reader over the shared input from its own position, so passes do not disturb each other.
struct At {
    shared: Shared,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut input = self
            .shared
            .lock()
            .map_err(|_| io::Error::other("the replay input was poisoned"))?;
        input.seek(SeekFrom::Start(self.pos))?;
        let n = input.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// An opened input: one that can be read again, or the one pass a stream gives.
pub(crate) enum Opened {
    Rereadable(Rereadable),
    Stream(Box<RecordingReader>),
}

/// Opens `path` once: `-` is stdin; a regular file can be read again, anything else (a pipe, a
/// FIFO, `/dev/stdin` on a pipe) is read as it streams.
pub(crate) fn open_path(path: &Path, options: &ReplayOptions) -> Result<Opened, RecordingError> {
    if path.as_os_str() == "-" {
        return open_stream(io::stdin(), "stdin", options).map(|r| Opened::Stream(Box::new(r)));
    }
    let name = path.display().to_string();
    let io_error = |op, source| RecordingError::Io {
        op,
        path: name.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(|e| io_error("open", e))?;
    let regular = file.metadata().map_err(|e| io_error("read", e))?.is_file();
    if regular {
        open_rereadable(Box::new(file), &name, options).map(Opened::Rereadable)
    } else {
        open_stream(file, &name, options).map(|r| Opened::Stream(Box::new(r)))
    }
}

/// Sniffs a stream and reads its header; the recording is then read from it once.
pub(crate) fn open_stream(
    input: impl Read + Send + 'static,
    name: &str,
    options: &ReplayOptions,
) -> Result<RecordingReader, RecordingError> {
    let mut input = input;
    let (prefix, tar_gz) = sniff(&mut input).map_err(|source| RecordingError::Io {
        op: "read",
        path: name.to_string(),
        source,
    })?;
    let whole = Cursor::new(prefix).chain(input);
    if !tar_gz {
        return RecordingReader::from_reader_named(whole, name);
    }
    let limit = options.max_inflated_bytes;
    let mut walker = TarWalker::new(Capped::new(GzDecoder::new(whole), limit));
    bundle_reader::find_recording(&mut walker, false, name)?;
    let member_name = member_name(name);
    let mut member = walker;
    let magic = read_prefix(&mut member, 2).map_err(|source| RecordingError::Read {
        path: member_name.clone(),
        line: 1,
        source,
    })?;
    let gzip = magic == [0x1f, 0x8b];
    let member = Cursor::new(magic).chain(member);
    if gzip {
        let decoded = Capped::new(MultiGzDecoder::new(member), limit);
        let input = BufReader::with_capacity(BUF_BYTES, decoded);
        RecordingReader::from_decoded(input, &member_name, true, 0)
    } else {
        let input = BufReader::with_capacity(BUF_BYTES, member);
        RecordingReader::from_decoded(input, &member_name, false, 0)
    }
}

/// Reads as much of a stream as it takes to tell a bundle from a recording: two bytes when it is
/// not gzip, otherwise until the start of its content shows, so a recording written live into a
/// pipe is read as soon as its first line arrives. Returns what was read and whether it is a
/// bundle.
fn sniff(input: &mut impl Read) -> io::Result<(Vec<u8>, bool)> {
    let mut prefix = read_prefix(input, 2)?;
    if prefix != [0x1f, 0x8b] {
        return Ok((prefix, false));
    }
    let mut chunk = [0u8; 4096];
    while prefix.len() < SNIFF_BYTES {
        if let Some(tar_gz) = bundle_reader::tar_gz_verdict(&prefix) {
            return Ok((prefix, tar_gz));
        }
        match input.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => prefix.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let tar_gz = bundle_reader::is_tar_gz(&prefix);
    Ok((prefix, tar_gz))
}

/// Sniffs an input that can be read again; a bundle is walked to its end here, so that what is
/// wrong with it anywhere is found before anything is replayed.
pub(crate) fn open_rereadable(
    input: Box<dyn ReadSeek>,
    name: &str,
    options: &ReplayOptions,
) -> Result<Rereadable, RecordingError> {
    let shared: Shared = Arc::new(Mutex::new(input));
    let mut prefix = Vec::new();
    At {
        shared: shared.clone(),
        pos: 0,
    }
    .take(SNIFF_BYTES as u64)
    .read_to_end(&mut prefix)
    .map_err(|source| RecordingError::Io {
        op: "read",
        path: name.to_string(),
        source,
    })?;
    let limit = options.max_inflated_bytes;
    let container = if bundle_reader::is_tar_gz(&prefix) {
        let archive = GzDecoder::new(BufReader::with_capacity(
            BUF_BYTES,
            At {
                shared: shared.clone(),
                pos: 0,
            },
        ));
        let mut walker = TarWalker::new(Capped::new(archive, limit));
        let member = bundle_reader::find_recording(&mut walker, true, name)?;
        let mut rereader = Rereadable {
            shared: shared.clone(),
            container: Container::Bundle {
                start: member.start,
                size: member.size,
                gzip: false,
            },
            name: name.to_string(),
            limit,
        };
        let mut magic = Vec::new();
        rereader
            .member()
            .and_then(|m| m.take(2).read_to_end(&mut magic))
            .map_err(|source| RecordingError::Read {
                path: member_name(name),
                line: 1,
                source,
            })?;
        rereader.container = Container::Bundle {
            start: member.start,
            size: member.size,
            gzip: magic == [0x1f, 0x8b],
        };
        return Ok(rereader);
    } else if prefix.starts_with(&[0x1f, 0x8b]) {
        Container::Gzip
    } else {
        Container::Plain
    };
    Ok(Rereadable {
        shared,
        container,
        name: name.to_string(),
        limit,
    })
}

/// The name a bundle's recording goes by in messages.
fn member_name(bundle_name: &str) -> String {
    format!("{bundle_name} ({})", bundle_reader::RECORDING)
}

impl Rereadable {
    /// The name messages about the recording use.
    pub(crate) fn recording_name(&self) -> String {
        match self.container {
            Container::Bundle { .. } => member_name(&self.name),
            _ => self.name.clone(),
        }
    }

    fn gzip(&self) -> bool {
        match self.container {
            Container::Plain => false,
            Container::Gzip => true,
            Container::Bundle { gzip, .. } => gzip,
        }
    }

    /// A bundle's recording member, raw, from its first byte.
    fn member(&self) -> io::Result<Box<dyn Read + Send>> {
        let Container::Bundle { start, size, .. } = self.container else {
            return Err(io::Error::other("not a bundle"));
        };
        let archive = GzDecoder::new(BufReader::with_capacity(
            BUF_BYTES,
            At {
                shared: self.shared.clone(),
                pos: 0,
            },
        ));
        let mut archive = Capped::new(archive, self.limit);
        skip(&mut archive, start)?;
        Ok(Box::new(archive.take(size)))
    }

    /// The decompressed recording from byte `offset` on.
    fn decoded_from(&self, offset: u64) -> io::Result<Box<dyn BufRead + Send>> {
        let at = |pos| At {
            shared: self.shared.clone(),
            pos,
        };
        let mut decoded: Box<dyn Read + Send> = match self.container {
            // Plain bytes are the recording: seek straight to the line.
            Container::Plain => {
                return Ok(Box::new(BufReader::with_capacity(BUF_BYTES, at(offset))));
            }
            // Every member of a recording, as the reader reads it.
            Container::Gzip => Box::new(MultiGzDecoder::new(BufReader::with_capacity(
                BUF_BYTES,
                at(0),
            ))),
            Container::Bundle { gzip: true, .. } => {
                Box::new(Capped::new(MultiGzDecoder::new(self.member()?), self.limit))
            }
            Container::Bundle { gzip: false, .. } => self.member()?,
        };
        // Compressed input has no index into it: inflate from the start and drop what comes
        // before the line. Slow for a seek far in, but memory stays flat.
        skip(&mut decoded, offset)?;
        Ok(Box::new(BufReader::with_capacity(BUF_BYTES, decoded)))
    }

    /// A reader from the start of the recording, its header read; lines up to
    /// `counted_through` were counted by earlier passes (`u64::MAX`: count nothing).
    pub(crate) fn reader(&self, counted_through: u64) -> Result<RecordingReader, RecordingError> {
        let input = self
            .decoded_from(0)
            .map_err(|source| RecordingError::Read {
                path: self.recording_name(),
                line: 1,
                source,
            })?;
        RecordingReader::from_decoded(input, &self.recording_name(), self.gzip(), counted_through)
    }

    /// A reader from the line at `at`, going on from `header`; lines up to `counted_through`
    /// were counted by earlier passes.
    pub(crate) fn reader_at(
        &self,
        header: &Header,
        at: LinePos,
        counted_through: u64,
    ) -> Result<RecordingReader, RecordingError> {
        let input = self
            .decoded_from(at.offset)
            .map_err(|source| RecordingError::Read {
                path: self.recording_name(),
                line: at.line,
                source,
            })?;
        Ok(RecordingReader::resume(
            input,
            &self.recording_name(),
            header.clone(),
            self.gzip(),
            at,
            counted_through,
        ))
    }
}

/// Reads and drops `n` bytes; fewer than `n` is an error (the input changed under the replay).
fn skip(r: &mut impl Read, n: u64) -> io::Result<()> {
    let skipped = io::copy(&mut r.take(n), &mut io::sink())?;
    if skipped < n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the input is shorter than when it was first read",
        ));
    }
    Ok(())
}
