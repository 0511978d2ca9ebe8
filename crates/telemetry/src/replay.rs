//! A `Backend` that plays a recording back, so everything above the backend (history, rules,
//! views) runs on recorded telemetry exactly as on live telemetry.
//!
//! A recording is streamed, never held whole: what a replay keeps is bounded whatever the input
//! (one tick read ahead, a capped seek index, capped recorded findings). Input that can be read
//! again (a regular file, the bundled demo) is read twice: a first pass that reads sample lines
//! only as far as their time learns the time span, the findings the recording carries and where
//! to seek, then the replay reads it for real, going back to a seek point when asked. A stream
//! (a pipe, stdin) is read once, learning those as it goes, and cannot seek backwards.

mod input;
mod ticks;

pub use input::ReplayOptions;

use std::io::{Read, Seek};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::recording::{
    Header, LinePos, Outline, ReadStats, Record, RecordingError, RecordingReader,
};
use super::{Backend, BackendError, Pacing, Playback, ReplayPosition, Tick};
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{DeviceInfo, Event, HostInfo, Sample, TimeMs};
use input::{Opened, Rereadable};
use ticks::{Grouped, Grouper, RecordedFindings, SeekIndex};

/// The longest a single gap between recorded ticks is played as, in wall time. A recorder on a
/// suspended host leaves hours between two ticks; a replay should not sit silent for that long.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// Sleep granularity: the longest an interrupt waits to be noticed.
const SLEEP_SLICE: Duration = Duration::from_millis(50);

pub use crate::Pace;

type Built = Grouped<Sample, Event>;

/// Where a replay's records come from.
enum RecordSource {
    /// Input that can be read again, and the pass reading it now (`None` once it ended).
    Rereadable {
        input: Rereadable,
        reader: Option<RecordingReader>,
    },
    /// One pass over a stream.
    Stream(Option<RecordingReader>),
    /// Records already in memory (tests); positions are indices.
    Memory { records: Vec<Record>, next: usize },
}

/// Plays a recording as a self-paced backend.
/// RAS answers carried between two ticks at most: a live run asks every 15 s at the most, so
/// more is a hostile file.
const MAX_PENDING_RAS: usize = 16;

pub struct ReplayBackend {
    header: Header,
    records: RecordSource,
    grouper: Grouper<Sample, Event>,
    /// The tick the next poll delivers, read ahead.
    peeked: Option<Built>,
    /// NCCL RAS answers read since the last tick delivered, at most [`MAX_PENDING_RAS`]; they
    /// come with the next one (each keeps its own time).
    pending_ras: Vec<gpudiag_model::ras::RasAnswer>,
    /// The latest kernels summary read since the last tick delivered; it comes with the next.
    pending_kernels: Option<Box<gpudiag_model::kernels::RecordedKernels>>,
    /// The records have run out for the grouper.
    drained: bool,
    /// First and last tick in file order, and how many: of the whole recording where a first
    /// pass read it, of what was read so far otherwise.
    start_ms: Option<TimeMs>,
    end_ms: Option<TimeMs>,
    ticks: u64,
    /// Whether `start_ms`, `end_ms` and `ticks` grow as the replay reads (no first pass).
    learning: bool,
    /// The latest time of the ticks this pass delivered or skipped, or that lie before where it
    /// started: a seek to a later time can read on from here.
    consumed_max: Option<TimeMs>,
    /// The number of the tick the next poll delivers.
    next_ordinal: u64,
    index: SeekIndex,
    findings: RecordedFindings,
    /// What passes that ended noticed (each counts only lines no earlier pass did).
    stats: ReadStats,
    /// The furthest line any pass has read.
    read_through: u64,
    pace: Pace,
    /// Time of the tick last delivered (or the seek target).
    current_ms: Option<TimeMs>,
    /// Wall instant at which the recorded time `.1` is due; set on the first paced poll.
    anchor: Option<(Instant, TimeMs)>,
    interrupt: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for ReplayBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayBackend")
            .field("backend", &self.header.backend)
            .field("start_ms", &self.start_ms)
            .field("end_ms", &self.end_ms)
            .field("ticks", &self.ticks)
            .field("current_ms", &self.current_ms)
            .finish()
    }
}

impl ReplayBackend {
    /// Opens a recording (plain or gzip) or a bug-report bundle at `path`, with the default
    /// limits; `-` reads stdin. The content decides what it is, not the name.
    pub fn open(path: impl AsRef<Path>, pace: Pace) -> Result<Self, BackendError> {
        Self::open_with(path, pace, &ReplayOptions::default())
    }

    /// As [`open`](Self::open), under `options`.
    pub fn open_with(
        path: impl AsRef<Path>,
        pace: Pace,
        options: &ReplayOptions,
    ) -> Result<Self, BackendError> {
        check_pace(pace)?;
        match input::open_path(path.as_ref(), options)? {
            Opened::Rereadable(input) => Self::from_rereadable(input, pace),
            Opened::Stream(reader) => Ok(Self::from_stream(*reader, pace)),
        }
    }

    /// Reads a recording or bundle from a stream, once (it cannot seek backwards).
    pub fn from_reader(
        reader: impl Read + Send + 'static,
        pace: Pace,
    ) -> Result<Self, BackendError> {
        check_pace(pace)?;
        let reader = input::open_stream(reader, "recording", &ReplayOptions::default())?;
        Ok(Self::from_stream(reader, pace))
    }

    /// Reads a recording or bundle from input that can be read again (the bundled demo, a
    /// file already open), so it can seek both ways; `name` is what messages call it.
    pub fn from_seekable(
        reader: impl Read + Seek + Send + 'static,
        name: &str,
        pace: Pace,
        options: &ReplayOptions,
    ) -> Result<Self, BackendError> {
        check_pace(pace)?;
        let input = input::open_rereadable(Box::new(reader), name, options)?;
        Self::from_rereadable(input, pace)
    }

    /// A replay of records already read (tests, or a recording held in memory).
    pub fn from_parts(
        header: Header,
        records: Vec<Record>,
        stats: ReadStats,
        pace: Pace,
    ) -> Result<Self, BackendError> {
        check_pace(pace)?;
        let mut r = Self::new(header, RecordSource::Memory { records, next: 0 }, pace);
        r.stats = stats;
        r.prescan()?;
        Ok(r)
    }

    fn new(header: Header, records: RecordSource, pace: Pace) -> Self {
        ReplayBackend {
            header,
            records,
            grouper: Grouper::new(0, None),
            peeked: None,
            pending_ras: Vec::new(),
            pending_kernels: None,
            drained: false,
            start_ms: None,
            end_ms: None,
            ticks: 0,
            learning: false,
            consumed_max: None,
            next_ordinal: 0,
            index: SeekIndex::default(),
            findings: RecordedFindings::default(),
            stats: ReadStats::default(),
            read_through: 0,
            pace,
            current_ms: None,
            anchor: None,
            interrupt: None,
        }
    }

    fn from_stream(reader: RecordingReader, pace: Pace) -> Self {
        let header = reader.header().clone();
        let mut r = Self::new(header, RecordSource::Stream(Some(reader)), pace);
        r.learning = true;
        r
    }

    fn from_rereadable(input: Rereadable, pace: Pace) -> Result<Self, BackendError> {
        let first = input.reader(u64::MAX)?;
        let header = first.header().clone();
        let mut r = Self::new(
            header,
            RecordSource::Rereadable {
                input,
                reader: Some(first),
            },
            pace,
        );
        r.prescan()?;
        Ok(r)
    }

    /// The first pass: the time span, the tick count, the seek index and the recorded
    /// findings, reading sample lines only as far as their time. Leaves the records at the start.
    fn prescan(&mut self) -> Result<(), BackendError> {
        let mut grouper: Grouper<TimeMs, TimeMs> = Grouper::new(0, None);
        let mut last = None;
        let mut take = |g: Grouped<TimeMs, TimeMs>, r: &mut Self| {
            r.index.observe(&g);
            r.start_ms.get_or_insert(g.time);
            r.ticks = g.ordinal + 1;
            last = Some(g.time);
        };
        while let Some((outline, at, len)) = self.next_outline()? {
            match outline {
                Outline::Sample(t) => grouper.sample(t, at),
                Outline::Event(t) => grouper.event(t, at),
                Outline::Finding(f) => self.findings.add(*f, len),
                Outline::Beside => {}
            }
            while let Some(g) = grouper.pop() {
                take(g, self);
            }
        }
        grouper.finish();
        while let Some(g) = grouper.pop() {
            take(g, self);
        }
        self.end_ms = last;
        self.restart_at(None)?;
        Ok(())
    }

    fn next_outline(&mut self) -> Result<Option<(Outline, LinePos, usize)>, RecordingError> {
        match &mut self.records {
            RecordSource::Rereadable { reader, .. } | RecordSource::Stream(reader) => {
                let Some(r) = reader else {
                    return Ok(None);
                };
                Ok(r.next_outline()?
                    .map(|o| (o, r.last_line_pos(), r.last_line_len())))
            }
            RecordSource::Memory { records, next } => {
                let Some(record) = records.get(*next) else {
                    return Ok(None);
                };
                let at = memory_pos(*next);
                *next += 1;
                let outline = match record {
                    Record::Sample(s) => Outline::Sample(s.time_ms),
                    Record::Event(e) => Outline::Event(e.time_ms),
                    Record::Finding(f) => Outline::Finding(Box::new(f.clone())),
                    Record::Ras(_) | Record::Kernels(_) => Outline::Beside,
                };
                Ok(Some((outline, at, 0)))
            }
        }
    }

    /// The next record and where its line starts, from the pass now reading.
    fn next_record(&mut self) -> Result<Option<(Record, LinePos, usize)>, RecordingError> {
        let next = match &mut self.records {
            RecordSource::Rereadable { reader, .. } | RecordSource::Stream(reader) => {
                let Some(r) = reader else {
                    return Ok(None);
                };
                let record = r.next_record();
                self.read_through = self.read_through.max(r.line_number());
                match record? {
                    Some(rec) => Some((rec, r.last_line_pos(), r.last_line_len())),
                    None => {
                        if let Some(done) = reader.take() {
                            self.stats.absorb(done.stats());
                        }
                        None
                    }
                }
            }
            RecordSource::Memory { records, next } => {
                let at = memory_pos(*next);
                let record = records.get(*next).cloned();
                *next += 1;
                record.map(|r| (r, at, 0))
            }
        };
        Ok(next)
    }

    /// Starts a new pass at checkpoint `from` (the start of the recording when `None`).
    fn restart_at(&mut self, from: Option<ticks::Checkpoint>) -> Result<(), BackendError> {
        let (at, ordinal, max_before) =
            from.map_or((None, 0, None), |c| (Some(c.at), c.ordinal, c.max_before));
        match &mut self.records {
            RecordSource::Stream(_) => {
                return Err(BackendError::Unavailable(
                    "a recording read from a pipe cannot seek backwards".into(),
                ));
            }
            RecordSource::Rereadable { input, reader } => {
                if let Some(done) = reader.take() {
                    self.stats.absorb(done.stats());
                }
                let fresh = match at {
                    Some(at) => input.reader_at(&self.header, at, self.read_through)?,
                    None => input.reader(self.read_through)?,
                };
                *reader = Some(fresh);
            }
            RecordSource::Memory { next, .. } => {
                *next = at.map_or(0, |a| a.offset as usize);
            }
        }
        self.grouper = Grouper::new(ordinal, max_before);
        self.peeked = None;
        self.pending_ras.clear();
        self.pending_kernels = None;
        self.drained = false;
        self.consumed_max = max_before;
        self.next_ordinal = ordinal;
        Ok(())
    }

    /// The next tick in file order, rebuilt from the records.
    fn next_tick(&mut self) -> Result<Option<Built>, RecordingError> {
        loop {
            if let Some(g) = self.grouper.pop() {
                if self.learning {
                    self.start_ms.get_or_insert(g.time);
                    self.end_ms = Some(g.time);
                    self.ticks = self.ticks.max(g.ordinal + 1);
                }
                return Ok(Some(g));
            }
            if self.drained {
                return Ok(None);
            }
            match self.next_record()? {
                None => {
                    self.grouper.finish();
                    self.drained = true;
                }
                Some((Record::Sample(s), at, _)) => self.grouper.sample(s, at),
                Some((Record::Event(e), at, _)) => self.grouper.event(e, at),
                // A first pass collected them already, except from a stream.
                Some((Record::Finding(f), _, len)) => {
                    if self.learning {
                        self.findings.add(f, len);
                    }
                }
                Some((Record::Ras(answer), _, _)) => {
                    if self.pending_ras.len() < MAX_PENDING_RAS {
                        self.pending_ras.push(answer);
                    }
                }
                // Each summary is of the whole run so far: the latest stands for the others.
                Some((Record::Kernels(k), _, _)) => self.pending_kernels = Some(Box::new(k)),
            }
        }
    }

    /// The tick the next poll delivers, read ahead if need be.
    fn peek(&mut self) -> Result<Option<&Built>, BackendError> {
        if self.peeked.is_none() {
            self.peeked = self.next_tick()?;
        }
        Ok(self.peeked.as_ref())
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// What the reader noticed so far: lines skipped, kinds unknown, a truncated end.
    pub fn read_stats(&self) -> ReadStats {
        let mut stats = self.stats.clone();
        if let RecordSource::Rereadable {
            reader: Some(r), ..
        }
        | RecordSource::Stream(Some(r)) = &self.records
        {
            stats.absorb(r.stats());
        }
        stats
    }

    pub fn pace(&self) -> Pace {
        self.pace
    }

    /// Changes speed; timing restarts from the next tick, so nothing jumps.
    pub fn set_pace(&mut self, pace: Pace) -> Result<(), BackendError> {
        check_pace(pace)?;
        self.pace = pace;
        self.anchor = None;
        Ok(())
    }

    /// Number of ticks in the recording; from a stream, the number read so far.
    pub fn tick_count(&self) -> u64 {
        self.ticks
    }

    /// Whether the next poll ends the recording (reads ahead one tick to know).
    pub fn at_end(&mut self) -> bool {
        !matches!(self.peek(), Ok(Some(_)))
    }

    /// Whether [`seek_to`](Self::seek_to) can go backwards: not in a recording read from a pipe.
    pub fn can_seek_back(&self) -> bool {
        !matches!(self.records, RecordSource::Stream(_))
    }

    /// Moves so that the next `poll` returns the first tick at or after `time_ms` in file order
    /// (backwards too); past the end, the next poll ends the recording. Pacing restarts from
    /// there. A recording read from a pipe moves forwards only: going back is an error and
    /// leaves it where it was.
    pub fn seek_to(&mut self, time_ms: TimeMs) -> Result<(), BackendError> {
        // Reading on finds that tick when nothing left behind is that late; a seek point further
        // on saves reading up to it.
        let ahead = self.consumed_max.is_none_or(|m| m < time_ms);
        let from = self.index.before(time_ms);
        if !ahead || from.is_some_and(|c| c.ordinal > self.next_ordinal) {
            self.restart_at(from)?;
        }
        loop {
            match self.peek()? {
                Some(t) if t.time >= time_ms => break,
                Some(_) => {
                    self.take_peeked();
                }
                None => break,
            }
        }
        let at = self.position();
        self.current_ms = Some(time_ms.clamp(at.start_ms, at.end_ms));
        self.anchor = None;
        Ok(())
    }

    /// Where the replay stands in recorded time. A recording without ticks reports its creation
    /// time for all three. From a stream, the end is the last tick read so far.
    pub fn position(&self) -> ReplayPosition {
        let start_ms = self.start_ms.unwrap_or(self.header.created_ms);
        ReplayPosition {
            current_ms: self.current_ms.unwrap_or(start_ms),
            start_ms,
            end_ms: self.end_ms.unwrap_or(start_ms),
        }
    }

    /// Moves past the tick read ahead.
    fn take_peeked(&mut self) -> Option<Built> {
        let tick = self.peeked.take()?;
        self.consumed_max = Some(self.consumed_max.map_or(tick.time, |m| m.max(tick.time)));
        self.next_ordinal = tick.ordinal + 1;
        Some(tick)
    }

    /// When the tick recorded at `time_ms` is due, re-anchoring the clock where the recording
    /// jumps backwards or pauses for longer than `MAX_WAIT`.
    fn due(&mut self, time_ms: TimeMs, speed: f64) -> Instant {
        let now = Instant::now();
        let (instant, anchor_ms) = *self.anchor.get_or_insert((now, time_ms));
        if time_ms < anchor_ms {
            self.anchor = Some((now, time_ms));
            return now;
        }
        let offset = Duration::try_from_secs_f64((time_ms - anchor_ms) as f64 / 1000.0 / speed)
            .unwrap_or(Duration::MAX);
        match instant.checked_add(offset) {
            Some(due) if due <= now + MAX_WAIT => due,
            _ => {
                let due = now + MAX_WAIT;
                self.anchor = Some((due, time_ms));
                due
            }
        }
    }

    /// Sleeps until `due` in short slices; false if interrupted first.
    fn sleep_until(&self, due: Instant) -> bool {
        loop {
            if self
                .interrupt
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
            {
                return false;
            }
            let now = Instant::now();
            if now >= due {
                return true;
            }
            std::thread::sleep((due - now).min(SLEEP_SLICE));
        }
    }
}

fn memory_pos(index: usize) -> LinePos {
    LinePos {
        offset: index as u64,
        line: index as u64 + 2,
    }
}

impl Backend for ReplayBackend {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn host(&self) -> &HostInfo {
        &self.header.host
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.header.devices
    }

    fn recorded_findings(&self) -> Vec<Finding> {
        self.findings.list()
    }

    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        self.header.topology.clone()
    }

    fn source_warnings(&self) -> Vec<String> {
        let mut warnings = self.read_stats().warnings();
        warnings.extend(self.findings.warning());
        warnings
    }

    fn pacing(&self) -> Pacing {
        Pacing::SelfPaced
    }

    fn playback(&mut self) -> Option<&mut dyn Playback> {
        Some(self)
    }

    fn poll(&mut self) -> Result<Tick, BackendError> {
        let Some(time_ms) = self.peek()?.map(|t| t.time) else {
            return Err(BackendError::EndOfRecording);
        };
        if let Pace::Recorded { speed } = self.pace {
            let due = self.due(time_ms, speed);
            if !self.sleep_until(due) {
                return Ok(Tick::default());
            }
        }
        let Some(tick) = self.take_peeked() else {
            return Err(BackendError::EndOfRecording);
        };
        self.current_ms = Some(time_ms);
        Ok(Tick {
            samples: tick.samples,
            events: tick.events,
            ras: std::mem::take(&mut self.pending_ras),
            kernels: self.pending_kernels.take(),
        })
    }
}

impl Playback for ReplayBackend {
    fn position(&self) -> ReplayPosition {
        ReplayBackend::position(self)
    }

    fn pace(&self) -> Pace {
        self.pace
    }

    fn set_pace(&mut self, pace: Pace) -> Result<(), BackendError> {
        ReplayBackend::set_pace(self, pace)
    }

    fn seek_to(&mut self, time_ms: TimeMs) -> Result<(), BackendError> {
        ReplayBackend::seek_to(self, time_ms)
    }

    fn at_end(&mut self) -> bool {
        ReplayBackend::at_end(self)
    }

    fn interrupt_waits_on(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = Some(flag);
    }
}

fn check_pace(pace: Pace) -> Result<(), BackendError> {
    match pace {
        Pace::Recorded { speed } if speed.is_nan() || speed <= 0.0 => {
            Err(BackendError::Unavailable(format!(
                "replay speed must be a positive number, not {speed}"
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::finding::{Evidence, Severity};
    use gpudiag_model::sample::{EventKind, Sample};

    fn header() -> Header {
        let mut h = Header::new(
            "nvml",
            HostInfo::default(),
            vec![
                DeviceInfo {
                    index: 0,
                    ..DeviceInfo::default()
                },
                DeviceInfo {
                    index: 1,
                    ..DeviceInfo::default()
                },
            ],
            Some(100),
        );
        h.created_ms = 1000;
        h
    }

    fn xid(time_ms: TimeMs, xid: u64) -> Record {
        Record::Event(Event {
            time_ms,
            device: Some(0),
            kind: EventKind::Xid { xid },
        })
    }

    fn sample(device: u32, time_ms: TimeMs) -> Record {
        Record::Sample(Sample::new(device, time_ms))
    }

    fn finding() -> Record {
        Record::Finding(Finding::new(
            "errors.xid".into(),
            Severity::Fail,
            Some(0),
            1150,
            "XID 48".into(),
            Evidence {
                values: serde_json::Map::new(),
                window_s: 0.0,
                threshold: "any".into(),
            },
            "drain".into(),
        ))
    }

    /// Three ticks of two devices, an XID before the second tick and one among its samples, a
    /// finding, and an XID after the last sample.
    fn records() -> Vec<Record> {
        vec![
            sample(0, 1000),
            sample(1, 1000),
            xid(1050, 13),
            sample(0, 1100),
            xid(1100, 48),
            sample(1, 1100),
            finding(),
            sample(0, 1200),
            sample(1, 1200),
            xid(1250, 79),
        ]
    }

    fn replay(pace: Pace) -> ReplayBackend {
        ReplayBackend::from_parts(header(), records(), ReadStats::default(), pace).unwrap()
    }

    fn at(current_ms: TimeMs, start_ms: TimeMs, end_ms: TimeMs) -> ReplayPosition {
        ReplayPosition {
            current_ms,
            start_ms,
            end_ms,
        }
    }

    fn times(tick: &Tick) -> Vec<(u32, TimeMs)> {
        tick.samples.iter().map(|s| (s.device, s.time_ms)).collect()
    }

    fn xids(tick: &Tick) -> Vec<u64> {
        tick.events
            .iter()
            .map(|e| match e.kind {
                EventKind::Xid { xid } => xid,
                _ => 0,
            })
            .collect()
    }

    #[test]
    fn groups_samples_by_time_with_their_events() {
        let mut r = replay(Pace::AsFastAsPossible);
        assert_eq!(r.name(), "replay");
        assert_eq!(r.pacing(), Pacing::SelfPaced);
        assert_eq!(r.devices().len(), 2);
        assert_eq!(r.tick_count(), 4);
        assert_eq!(r.recorded_findings().len(), 1);
        assert_eq!(r.recorded_findings()[0].id, "errors.xid");

        let t = r.poll().unwrap();
        assert_eq!(times(&t), [(0, 1000), (1, 1000)]);
        assert!(t.events.is_empty());
        let t = r.poll().unwrap();
        assert_eq!(times(&t), [(0, 1100), (1, 1100)]);
        assert_eq!(xids(&t), [13, 48]);
        let t = r.poll().unwrap();
        assert_eq!(times(&t), [(0, 1200), (1, 1200)]);
        assert!(t.events.is_empty());
        // The trailing event gets a tick of its own rather than being lost.
        let t = r.poll().unwrap();
        assert!(t.samples.is_empty());
        assert_eq!(xids(&t), [79]);
        assert!(matches!(r.poll(), Err(BackendError::EndOfRecording)));
        assert!(matches!(r.poll(), Err(BackendError::EndOfRecording)));
        assert_eq!(r.position(), at(1250, 1000, 1250));
    }

    #[test]
    fn recorded_pace_follows_the_recorded_spacing() {
        // 250 ms of recorded time at speed 5 is 50 ms of wall time.
        let mut r = replay(Pace::Recorded { speed: 5.0 });
        let start = Instant::now();
        let mut n = 0;
        while r.poll().is_ok() {
            n += 1;
        }
        let elapsed = start.elapsed();
        assert_eq!(n, 4);
        assert!(elapsed >= Duration::from_millis(50), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }

    #[test]
    fn long_pauses_are_capped() {
        let records = vec![sample(0, 1000), sample(0, 1000 + 3_600_000)];
        let mut r = ReplayBackend::from_parts(
            header(),
            records,
            ReadStats::default(),
            Pace::Recorded { speed: 1.0 },
        )
        .unwrap();
        r.poll().unwrap();
        let due = r.due(1000 + 3_600_000, 1.0);
        assert!(due <= Instant::now() + MAX_WAIT);
        // Times that run backwards are due at once.
        assert!(r.due(500, 1.0) <= Instant::now());
    }

    #[test]
    fn interrupt_cuts_a_wait_short_without_losing_the_tick() {
        let records = vec![sample(0, 1000), sample(0, 9000)];
        let flag = Arc::new(AtomicBool::new(false));
        let mut r = ReplayBackend::from_parts(
            header(),
            records,
            ReadStats::default(),
            Pace::Recorded { speed: 1.0 },
        )
        .unwrap();
        r.interrupt_waits_on(flag.clone());
        assert_eq!(r.poll().unwrap().samples.len(), 1);
        flag.store(true, Ordering::Relaxed);
        let start = Instant::now();
        assert_eq!(r.poll().unwrap(), Tick::default());
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(!r.at_end());
        flag.store(false, Ordering::Relaxed);
        r.set_pace(Pace::AsFastAsPossible).unwrap();
        assert_eq!(times(&r.poll().unwrap()), [(0, 9000)]);
    }

    #[test]
    fn seek_moves_both_ways() {
        let mut r = replay(Pace::AsFastAsPossible);
        assert_eq!(r.position(), at(1000, 1000, 1250));
        r.seek_to(1150).unwrap();
        assert_eq!(r.position(), at(1150, 1000, 1250));
        assert_eq!(times(&r.poll().unwrap()), [(0, 1200), (1, 1200)]);
        assert_eq!(r.position(), at(1200, 1000, 1250));
        r.seek_to(0).unwrap();
        assert_eq!(r.position().current_ms, 1000);
        assert_eq!(times(&r.poll().unwrap()), [(0, 1000), (1, 1000)]);
        r.seek_to(5000).unwrap();
        assert_eq!(r.position().current_ms, 1250);
        assert!(matches!(r.poll(), Err(BackendError::EndOfRecording)));
    }

    #[test]
    fn empty_recording_ends_at_once() {
        let mut r = ReplayBackend::from_parts(
            header(),
            Vec::new(),
            ReadStats::default(),
            Pace::AsFastAsPossible,
        )
        .unwrap();
        assert_eq!(r.position(), at(1000, 1000, 1000));
        assert!(matches!(r.poll(), Err(BackendError::EndOfRecording)));
    }

    #[test]
    fn bad_speed_is_refused() {
        for speed in [0.0, -1.0, f64::NAN] {
            let r = ReplayBackend::from_parts(
                header(),
                Vec::new(),
                ReadStats::default(),
                Pace::Recorded { speed },
            );
            assert!(matches!(r, Err(BackendError::Unavailable(_))), "{speed}");
        }
    }
}
