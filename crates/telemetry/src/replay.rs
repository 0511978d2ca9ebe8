//! A `Backend` that plays a recording back, so everything above the backend (history, rules,
//! views) runs on recorded telemetry exactly as on live telemetry.
//!
//! The whole recording is read at open: recordings are bounded (line limit, file size), and
//! holding the ticks in memory makes seeking trivial. Ticks are rebuilt by grouping consecutive
//! samples with the same `time_ms` (a recorder writes one sample per device per tick) together
//! with the events read before or among them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::recording::{self, Header, ReadStats, Record};
use super::{Backend, BackendError, DeviceInfo, Event, HostInfo, Pacing, Tick, TimeMs};
use gpudiag_model::finding::Finding;

/// The longest a single gap between recorded ticks is played as, in wall time. A recorder on a
/// suspended host leaves hours between two ticks; a replay should not sit silent for that long.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// Sleep granularity: the longest an interrupt waits to be noticed.
const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// How fast a replay plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// At the recorded spacing divided by `speed` (1.0 = real time, 10.0 = ten times faster).
    Recorded { speed: f64 },
    /// Every tick at once, for checks and tests.
    AsFastAsPossible,
}

/// Plays a recording as a self-paced backend.
#[derive(Debug)]
pub struct ReplayBackend {
    header: Header,
    /// Ticks in file order, each with its time (the samples' time, or the last event's).
    ticks: Vec<(TimeMs, Tick)>,
    findings: Vec<Finding>,
    stats: ReadStats,
    pace: Pace,
    /// Index of the next tick to deliver.
    next: usize,
    /// Time of the tick last delivered (or the seek target).
    current_ms: Option<TimeMs>,
    /// Wall instant at which the recorded time `.1` is due; set on the first paced poll.
    anchor: Option<(Instant, TimeMs)>,
    interrupt: Option<Arc<AtomicBool>>,
}

impl ReplayBackend {
    /// Reads the whole recording at `path`.
    pub fn open(path: impl AsRef<Path>, pace: Pace) -> Result<Self, BackendError> {
        let (header, records, stats) = recording::read_all(path)?;
        Self::from_parts(header, records, stats, pace)
    }

    /// Reads a whole recording from memory or any reader (the bundled demo).
    pub fn from_reader(
        reader: impl std::io::Read + Send + 'static,
        pace: Pace,
    ) -> Result<Self, BackendError> {
        let (header, records, stats) = recording::read_all_from(reader)?;
        Self::from_parts(header, records, stats, pace)
    }

    /// A replay of records already read (tests, or a recording held in memory).
    pub fn from_parts(
        header: Header,
        records: Vec<Record>,
        stats: ReadStats,
        pace: Pace,
    ) -> Result<Self, BackendError> {
        check_pace(pace)?;
        let (ticks, findings) = group_ticks(records);
        Ok(ReplayBackend {
            header,
            ticks,
            findings,
            stats,
            pace,
            next: 0,
            current_ms: None,
            anchor: None,
            interrupt: None,
        })
    }

    /// With a flag set from elsewhere (a UI, a signal handler), a `poll` that is waiting for its
    /// tick returns an empty `Tick` within about 50 ms; the tick stays due for the next poll.
    pub fn with_interrupt(mut self, flag: Arc<AtomicBool>) -> Self {
        self.interrupt = Some(flag);
        self
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// What the reader noticed: skipped unknown kinds, a truncated last line.
    pub fn read_stats(&self) -> &ReadStats {
        &self.stats
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

    /// Number of ticks in the recording.
    pub fn tick_count(&self) -> usize {
        self.ticks.len()
    }

    /// Ticks not yet delivered.
    pub fn remaining(&self) -> usize {
        self.ticks.len().saturating_sub(self.next)
    }

    /// Moves so that the next `poll` returns the first tick at or after `time_ms` (backwards too);
    /// past the end, the next poll ends the recording. Pacing restarts from there.
    pub fn seek_to(&mut self, time_ms: TimeMs) {
        self.next = self
            .ticks
            .iter()
            .position(|(t, _)| *t >= time_ms)
            .unwrap_or(self.ticks.len());
        let (_, start, end) = self.position();
        self.current_ms = Some(time_ms.clamp(start, end));
        self.anchor = None;
    }

    /// `(current, start, end)` in recorded time: the tick last delivered (the start before the
    /// first poll), the first tick and the last tick. A recording without ticks reports its
    /// creation time for all three.
    pub fn position(&self) -> (TimeMs, TimeMs, TimeMs) {
        let start = self
            .ticks
            .first()
            .map_or(self.header.created_ms, |(t, _)| *t);
        let end = self.ticks.last().map_or(start, |(t, _)| *t);
        (self.current_ms.unwrap_or(start), start, end)
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
        self.findings.clone()
    }

    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        self.header.topology.clone()
    }

    fn source_warnings(&self) -> Vec<String> {
        self.stats.warnings()
    }

    fn pacing(&self) -> Pacing {
        Pacing::SelfPaced
    }

    fn poll(&mut self) -> Result<Tick, BackendError> {
        let Some(time_ms) = self.ticks.get(self.next).map(|(t, _)| *t) else {
            return Err(BackendError::EndOfRecording);
        };
        if let Pace::Recorded { speed } = self.pace {
            let due = self.due(time_ms, speed);
            if !self.sleep_until(due) {
                return Ok(Tick::default());
            }
        }
        let tick = self
            .ticks
            .get(self.next)
            .map(|(_, tick)| tick.clone())
            .unwrap_or_default();
        self.next += 1;
        self.current_ms = Some(time_ms);
        Ok(tick)
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

/// Rebuilds ticks from records in file order; findings are set aside.
fn group_ticks(records: Vec<Record>) -> (Vec<(TimeMs, Tick)>, Vec<Finding>) {
    let mut ticks: Vec<(TimeMs, Tick)> = Vec::new();
    let mut findings = Vec::new();
    // Events wait here until the next sample shows which tick they belong to.
    let mut pending: Vec<Event> = Vec::new();
    for record in records {
        match record {
            Record::Sample(sample) => {
                let time = sample.time_ms;
                match ticks.last_mut() {
                    Some((t, tick)) if *t == time => {
                        tick.events.append(&mut pending);
                        tick.samples.push(sample);
                    }
                    _ => {
                        ticks.push((
                            time,
                            Tick {
                                samples: vec![sample],
                                events: std::mem::take(&mut pending),
                            },
                        ));
                    }
                }
            }
            Record::Event(event) => pending.push(event),
            Record::Finding(finding) => findings.push(finding),
        }
    }
    // Events after the last sample (an XID just before a crash) must not be lost: they form a
    // tick of their own.
    if let Some(time) = pending.iter().map(|e| e.time_ms).max() {
        ticks.push((
            time,
            Tick {
                samples: Vec::new(),
                events: pending,
            },
        ));
    }
    (ticks, findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventKind, Sample};
    use gpudiag_model::finding::{Evidence, Severity};

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
        Record::Finding(Finding {
            id: "errors.xid".into(),
            severity: Severity::Fail,
            device: Some(0),
            time_ms: 1150,
            title: "XID 48".into(),
            evidence: Evidence {
                values: serde_json::Map::new(),
                window_s: 0.0,
                threshold: "any".into(),
            },
            advice: "drain".into(),
            last_seen_ms: None,
            state: Default::default(),
            recorded: false,
        })
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
        assert_eq!(r.position(), (1250, 1000, 1250));
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
        .unwrap()
        .with_interrupt(flag.clone());
        assert_eq!(r.poll().unwrap().samples.len(), 1);
        flag.store(true, Ordering::Relaxed);
        let start = Instant::now();
        assert_eq!(r.poll().unwrap(), Tick::default());
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(r.remaining(), 1);
        flag.store(false, Ordering::Relaxed);
        r.set_pace(Pace::AsFastAsPossible).unwrap();
        assert_eq!(times(&r.poll().unwrap()), [(0, 9000)]);
    }

    #[test]
    fn seek_moves_both_ways() {
        let mut r = replay(Pace::AsFastAsPossible);
        assert_eq!(r.position(), (1000, 1000, 1250));
        r.seek_to(1150);
        assert_eq!(r.position(), (1150, 1000, 1250));
        assert_eq!(times(&r.poll().unwrap()), [(0, 1200), (1, 1200)]);
        assert_eq!(r.position(), (1200, 1000, 1250));
        r.seek_to(0);
        assert_eq!(r.position().0, 1000);
        assert_eq!(times(&r.poll().unwrap()), [(0, 1000), (1, 1000)]);
        r.seek_to(5000);
        assert_eq!(r.position().0, 1250);
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
        assert_eq!(r.position(), (1000, 1000, 1000));
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
