//! The ticks of a UI session, kept for "save a recording" (`w`) in little memory: each tick as
//! one JSON line, and every `CHUNK_TICKS` lines compressed together. A sample held as a parsed
//! `Sample` takes a few kilobytes (its absent reasons, process list and decoded names each on
//! the heap); a compressed line takes a few hundred bytes, so the 20,000 ticks a session keeps
//! cost megabytes instead of tens of them, and the oldest chunk goes first when it is full.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use serde::{Deserialize, Serialize};

use gpudiag_model::ras::RasAnswer;
use gpudiag_model::sample::{Event, Sample};
use gpudiag_telemetry::Tick;

/// Ticks compressed together: large enough to compress well (neighbouring samples repeat most
/// of their text), small enough that dropping the oldest chunk loses little.
const CHUNK_TICKS: usize = 128;

/// One tick as the log keeps it.
#[derive(Serialize, Deserialize)]
struct StoredTick {
    samples: Vec<Sample>,
    events: Vec<Event>,
    #[serde(default)]
    ras: Vec<RasAnswer>,
}

/// Borrowed form of [`StoredTick`] for writing, so a tick is not cloned to be kept.
#[derive(Serialize)]
struct StoredTickRef<'a> {
    samples: &'a [Sample],
    events: &'a [Event],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ras: &'a [RasAnswer],
}

struct Chunk {
    ticks: usize,
    deflated: Vec<u8>,
}

/// The session's ticks, oldest first, at most `max_ticks` of them.
pub struct SessionLog {
    max_ticks: usize,
    chunks: VecDeque<Chunk>,
    /// Lines of the chunk being filled, not yet compressed.
    open: Vec<u8>,
    open_ticks: usize,
    /// Ticks held in `chunks`.
    chunked_ticks: usize,
    /// Whether older ticks were dropped to stay within `max_ticks`.
    dropped: bool,
    /// Ticks that could not be stored (a value serde could not write), said when saving.
    unstored: usize,
}

impl SessionLog {
    pub fn new(max_ticks: usize) -> Self {
        SessionLog {
            max_ticks: max_ticks.max(CHUNK_TICKS),
            chunks: VecDeque::new(),
            open: Vec::new(),
            open_ticks: 0,
            chunked_ticks: 0,
            dropped: false,
            unstored: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.chunked_ticks + self.open_ticks
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the oldest ticks of a long session were let go.
    pub fn dropped(&self) -> bool {
        self.dropped
    }

    /// Ticks that could not be kept.
    pub fn unstored(&self) -> usize {
        self.unstored
    }

    pub fn clear(&mut self) {
        *self = SessionLog::new(self.max_ticks);
    }

    pub fn push(&mut self, tick: &Tick) {
        let stored = StoredTickRef {
            samples: &tick.samples,
            events: &tick.events,
            ras: &tick.ras,
        };
        let before = self.open.len();
        if serde_json::to_writer(&mut self.open, &stored).is_err() {
            self.open.truncate(before);
            self.unstored += 1;
            return;
        }
        self.open.push(b'\n');
        self.open_ticks += 1;
        if self.open_ticks >= CHUNK_TICKS {
            self.seal();
        }
        // Whole chunks go, oldest first, once the newest would push past the bound.
        while self.len() > self.max_ticks {
            let Some(old) = self.chunks.pop_front() else {
                break;
            };
            self.chunked_ticks -= old.ticks;
            self.dropped = true;
        }
    }

    /// Compresses the open lines into a chunk.
    fn seal(&mut self) {
        let mut enc = DeflateEncoder::new(Vec::new(), Compression::fast());
        let deflated = enc.write_all(&self.open).and_then(|()| enc.finish());
        match deflated {
            Ok(mut deflated) => {
                deflated.shrink_to_fit();
                self.chunks.push_back(Chunk {
                    ticks: self.open_ticks,
                    deflated,
                });
                self.chunked_ticks += self.open_ticks;
            }
            // Compressing into memory fails only when memory does: those ticks are lost.
            Err(_) => self.unstored += self.open_ticks,
        }
        self.open = Vec::new();
        self.open_ticks = 0;
    }

    /// Calls `f` with every tick, oldest first; stops at the first error `f` returns. A line
    /// that does not read back (it cannot happen for lines this log wrote) is counted and
    /// skipped: the returned number says how many.
    pub fn for_each<E>(&self, mut f: impl FnMut(&Tick) -> Result<(), E>) -> Result<usize, E> {
        let mut unreadable = 0;
        // Ok(false): the line did not read back.
        let mut each_line = |line: &[u8]| -> Result<bool, E> {
            match serde_json::from_slice::<StoredTick>(line) {
                Ok(t) => f(&Tick {
                    samples: t.samples,
                    events: t.events,
                    ras: t.ras,
                    kernels: None,
                })
                .map(|()| true),
                Err(_) => Ok(false),
            }
        };
        for chunk in &self.chunks {
            let mut reader = BufReader::new(DeflateDecoder::new(&chunk.deflated[..]));
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        if !each_line(line.strip_suffix(b"\n").unwrap_or(&line))? {
                            unreadable += 1;
                        }
                    }
                    Err(_) => {
                        unreadable += 1;
                        break;
                    }
                }
            }
        }
        for line in self.open.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if !each_line(line)? {
                unreadable += 1;
            }
        }
        Ok(unreadable)
    }

    /// Bytes the log holds (compressed chunks and the open lines), for tests and benches.
    pub fn held_bytes(&self) -> usize {
        self.open.capacity()
            + self
                .chunks
                .iter()
                .map(|c| c.deflated.capacity())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::sample::{Absent, EventKind, ProcessSample};

    fn tick(i: u64) -> Tick {
        let mut s = Sample::new(0, 1_000_000 + i * 100);
        s.gpu_util_pct = Some((i % 100) as f64);
        s.power_w = Some(123.25 + i as f64 / 8.0);
        s.absent.insert("fan_pct".into(), Absent::NotSupported);
        s.throttle_reason_names = Some(vec!["gpu_idle".into()]);
        let process: Option<ProcessSample> = serde_json::from_value(serde_json::json!({
            "pid": 4242, "name": "python3", "kind": "compute", "used_memory_bytes": 1u64 << 30
        }))
        .ok();
        s.processes = process.map(|p| vec![p]);
        let events = if i.is_multiple_of(50) {
            vec![Event {
                time_ms: s.time_ms,
                device: Some(0),
                kind: EventKind::Xid { xid: 79 },
            }]
        } else {
            Vec::new()
        };
        Tick {
            samples: vec![s],
            events,
            ras: Vec::new(),
            kernels: None,
        }
    }

    fn all(log: &SessionLog) -> Vec<Tick> {
        let mut out = Vec::new();
        let unreadable = log
            .for_each(|t| {
                out.push(t.clone());
                Ok::<(), ()>(())
            })
            .unwrap_or(usize::MAX);
        assert_eq!(unreadable, 0);
        out
    }

    #[test]
    fn ticks_come_back_as_they_went_in() {
        let mut log = SessionLog::new(1000);
        let ticks: Vec<Tick> = (0..300).map(tick).collect();
        for t in &ticks {
            log.push(t);
        }
        assert_eq!(log.len(), 300);
        assert!(!log.dropped());
        assert_eq!(all(&log), ticks);
    }

    #[test]
    fn the_oldest_chunks_go_past_the_bound() {
        let mut log = SessionLog::new(500);
        for i in 0..2000 {
            log.push(&tick(i));
        }
        assert!(
            log.len() <= 500 && log.len() > 500 - CHUNK_TICKS,
            "{}",
            log.len()
        );
        assert!(log.dropped());
        let kept = all(&log);
        assert_eq!(kept.len(), log.len());
        assert_eq!(kept.last(), Some(&tick(1999)));
        // Consecutive, newest last.
        let times: Vec<u64> = kept.iter().map(|t| t.samples[0].time_ms).collect();
        assert!(times.windows(2).all(|w| w[1] == w[0] + 100));
        log.clear();
        assert!(log.is_empty() && !log.dropped());
    }

    #[test]
    fn it_holds_far_less_than_the_samples_themselves() {
        let mut log = SessionLog::new(20_000);
        for i in 0..5000 {
            log.push(&tick(i));
        }
        let json_bytes = serde_json::to_vec(&tick(1).samples).map_or(0, |v| v.len());
        // Under a tenth of the plain JSON, which is itself smaller than the parsed samples.
        assert!(
            log.held_bytes() < 5000 * json_bytes / 10,
            "{} bytes held for 5000 ticks of {json_bytes} bytes of JSON",
            log.held_bytes()
        );
    }

    #[test]
    fn an_error_from_the_caller_stops_the_walk() {
        let mut log = SessionLog::new(1000);
        for i in 0..10 {
            log.push(&tick(i));
        }
        let mut seen = 0;
        let r = log.for_each(|_| {
            seen += 1;
            if seen == 3 { Err("stop") } else { Ok(()) }
        });
        assert_eq!(r, Err("stop"));
        assert_eq!(seen, 3);
    }
}
