//! Writing a recording. Every line reaches the file before `write` returns (gzip: a sync flush),
//! so a recorder that is killed leaves a file whose lines are all readable; only the gzip
//! trailer and the fsync wait for `finish`.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;

use super::{Header, Record, RecordingError, STREAM_NAME};
use crate::Tick;

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

    /// Writes a tick: its events first, then its samples, which is the order replay groups by,
    /// then its NCCL RAS answers and kernels summary (replay hands them on with the tick after).
    pub fn write_tick(&mut self, tick: &Tick) -> Result<(), RecordingError> {
        let records: Vec<Record> = tick
            .events
            .iter()
            .cloned()
            .map(Record::Event)
            .chain(tick.samples.iter().cloned().map(Record::Sample))
            .chain(tick.ras.iter().cloned().map(Record::Ras))
            .chain(tick.kernels.iter().map(|k| Record::Kernels((**k).clone())))
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

#[cfg(test)]
mod tests {
    use super::super::test_fixtures::*;
    use super::*;
    use gpudiag_model::sample::{Event, EventKind, Sample};

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
            ras: Vec::new(),
            kernels: None,
        };
        w.write_tick(&tick).unwrap();
        w.finish().unwrap();
        let (_, recs, _) = read_bytes(buf.bytes()).unwrap();
        let kinds: Vec<&str> = recs.iter().map(Record::kind).collect();
        assert_eq!(kinds, ["event", "sample", "sample"]);
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
}
