//! Rebuilding ticks from records as they stream past, and the bounded state a replay keeps
//! about a whole recording: where to seek, and the findings it carries.
//!
//! A tick is a run of consecutive samples with the same time (a recorder writes one sample per
//! device per tick) together with the events read before or among them. Both are capped, so a
//! hostile file (a million samples at one time, an endless run of events) cannot make one tick
//! hold all of it: past the caps the run is cut into several ticks.

use std::collections::{BTreeMap, VecDeque};

use crate::recording::LinePos;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{Event, Sample, TimeMs};

/// More samples in one tick than any host has GPUs: past it, a run of samples with one time is
/// cut into several ticks.
pub(crate) const MAX_SAMPLES_PER_TICK: usize = 4096;
/// Events waiting for the sample that shows their tick; past it they form a tick of their own.
pub(crate) const MAX_PENDING_EVENTS: usize = 1024;
/// Seek points kept; when more would be needed, every other one is dropped, so a seek reads at
/// most a few thousandths of a long recording again.
const MAX_CHECKPOINTS: usize = 4096;
/// Distinct findings (id and device) a replay remembers from a recording.
const MAX_RECORDED_FINDINGS: usize = 1024;
/// A recorded finding's line longer than this is not kept: real ones are a few hundred bytes,
/// and with the cap above this bounds what findings can hold.
const MAX_FINDING_LINE: usize = 16 * 1024;

pub(crate) trait Timed {
    fn time_ms(&self) -> TimeMs;
}

impl Timed for Sample {
    fn time_ms(&self) -> TimeMs {
        self.time_ms
    }
}

impl Timed for Event {
    fn time_ms(&self) -> TimeMs {
        self.time_ms
    }
}

impl Timed for TimeMs {
    fn time_ms(&self) -> TimeMs {
        *self
    }
}

/// One rebuilt tick and where it stands in the recording.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grouped<S, E> {
    /// The samples' time, or the latest event's in a tick of events only.
    pub time: TimeMs,
    /// Where its first record starts: reading from here rebuilds it.
    pub at: LinePos,
    /// Its number, counting from 0 at the start of the recording.
    pub ordinal: u64,
    /// The latest time of any tick before it.
    pub max_before: Option<TimeMs>,
    pub samples: Vec<S>,
    pub events: Vec<E>,
}

/// Builds ticks from samples and events in file order.
pub(crate) struct Grouper<S, E> {
    building: Option<Grouped<S, E>>,
    pending: Vec<E>,
    pending_at: Option<LinePos>,
    ready: VecDeque<Grouped<S, E>>,
    next_ordinal: u64,
    max_emitted: Option<TimeMs>,
}

impl<S: Timed, E: Timed> Grouper<S, E> {
    /// A grouper whose first tick is number `ordinal`, after ticks no later than `max_before`.
    pub(crate) fn new(ordinal: u64, max_before: Option<TimeMs>) -> Self {
        Grouper {
            building: None,
            pending: Vec::new(),
            pending_at: None,
            ready: VecDeque::new(),
            next_ordinal: ordinal,
            max_emitted: max_before,
        }
    }

    pub(crate) fn sample(&mut self, sample: S, at: LinePos) {
        let time = sample.time_ms();
        if let Some(b) = &mut self.building
            && b.time == time
            && b.samples.len() < MAX_SAMPLES_PER_TICK
        {
            b.events.append(&mut self.pending);
            self.pending_at = None;
            b.samples.push(sample);
            return;
        }
        self.emit_building();
        self.building = Some(Grouped {
            time,
            at: self.pending_at.take().unwrap_or(at),
            ordinal: 0,
            max_before: None,
            samples: vec![sample],
            events: std::mem::take(&mut self.pending),
        });
    }

    pub(crate) fn event(&mut self, event: E, at: LinePos) {
        if self.pending.is_empty() {
            self.pending_at = Some(at);
        }
        self.pending.push(event);
        if self.pending.len() >= MAX_PENDING_EVENTS {
            self.emit_building();
            self.emit_pending();
        }
    }

    /// The input ended: what is being built becomes ticks.
    pub(crate) fn finish(&mut self) {
        self.emit_building();
        // Events after the last sample (an XID just before a crash) must not be lost: they form
        // a tick of their own.
        self.emit_pending();
    }

    pub(crate) fn pop(&mut self) -> Option<Grouped<S, E>> {
        self.ready.pop_front()
    }

    fn emit_building(&mut self) {
        if let Some(b) = self.building.take() {
            self.emit(b);
        }
    }

    fn emit_pending(&mut self) {
        let Some(time) = self.pending.iter().map(Timed::time_ms).max() else {
            return;
        };
        let g = Grouped {
            time,
            at: self.pending_at.take().unwrap_or_default(),
            ordinal: 0,
            max_before: None,
            samples: Vec::new(),
            events: std::mem::take(&mut self.pending),
        };
        self.emit(g);
    }

    fn emit(&mut self, mut g: Grouped<S, E>) {
        g.ordinal = self.next_ordinal;
        g.max_before = self.max_emitted;
        self.next_ordinal += 1;
        self.max_emitted = Some(self.max_emitted.map_or(g.time, |m| m.max(g.time)));
        self.ready.push_back(g);
    }
}

/// Where a pass can start rebuilding ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub at: LinePos,
    pub ordinal: u64,
    pub max_before: Option<TimeMs>,
}

/// Seek points over a recording, at most [`MAX_CHECKPOINTS`] of them, evenly spread in ticks.
#[derive(Debug, Clone)]
pub(crate) struct SeekIndex {
    points: Vec<Checkpoint>,
    stride: u64,
}

impl Default for SeekIndex {
    fn default() -> Self {
        SeekIndex {
            points: Vec::new(),
            stride: 1,
        }
    }
}

impl SeekIndex {
    pub(crate) fn observe<S, E>(&mut self, g: &Grouped<S, E>) {
        if !g.ordinal.is_multiple_of(self.stride) {
            return;
        }
        self.points.push(Checkpoint {
            at: g.at,
            ordinal: g.ordinal,
            max_before: g.max_before,
        });
        if self.points.len() > MAX_CHECKPOINTS {
            self.stride *= 2;
            let stride = self.stride;
            self.points.retain(|c| c.ordinal.is_multiple_of(stride));
        }
    }

    /// The last point before which every tick is earlier than `time_ms`, so the first tick at or
    /// after `time_ms` is at or after it. Times need not increase through the file.
    pub(crate) fn before(&self, time_ms: TimeMs) -> Option<Checkpoint> {
        let n = self
            .points
            .partition_point(|c| c.max_before.is_none_or(|m| m < time_ms));
        n.checked_sub(1).map(|i| self.points[i])
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.points.len()
    }
}

/// The findings a recording carries: for each id and device the first and the latest, so a
/// replay reports when a problem began and a window over the end still sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecordedFindings {
    by_key: BTreeMap<(String, Option<u32>), (Finding, Option<Finding>)>,
    ignored: u64,
}

impl RecordedFindings {
    /// `line_len`: the length of the line it was read from.
    pub(crate) fn add(&mut self, f: Finding, line_len: usize) {
        if line_len > MAX_FINDING_LINE {
            self.ignored += 1;
            return;
        }
        let key = (f.id.clone(), f.device);
        if let Some((_, latest)) = self.by_key.get_mut(&key) {
            *latest = Some(f);
        } else if self.by_key.len() < MAX_RECORDED_FINDINGS {
            self.by_key.insert(key, (f, None));
        } else {
            self.ignored += 1;
        }
    }

    /// Oldest first.
    pub(crate) fn list(&self) -> Vec<Finding> {
        let mut out: Vec<Finding> = self
            .by_key
            .values()
            .flat_map(|(first, latest)| std::iter::once(first).chain(latest))
            .cloned()
            .collect();
        out.sort_by_key(|f| f.time_ms);
        out
    }

    pub(crate) fn warning(&self) -> Option<String> {
        (self.ignored > 0).then(|| {
            format!(
                "ignored {} recorded finding(s) beyond the first {MAX_RECORDED_FINDINGS} distinct \
                 ones or longer than {MAX_FINDING_LINE} bytes",
                self.ignored
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: u64) -> LinePos {
        LinePos {
            offset: line * 100,
            line,
        }
    }

    /// Feeds `(kind, time)` records to a grouper: 's' sample, 'e' event.
    fn group(records: &[(char, TimeMs)]) -> Vec<Grouped<TimeMs, TimeMs>> {
        let mut g = Grouper::new(0, None);
        let mut out = Vec::new();
        for (i, &(kind, time)) in records.iter().enumerate() {
            let at = pos(i as u64 + 2);
            match kind {
                's' => g.sample(time, at),
                _ => g.event(time, at),
            }
            out.extend(std::iter::from_fn(|| g.pop()));
        }
        g.finish();
        out.extend(std::iter::from_fn(|| g.pop()));
        out
    }

    #[test]
    fn ticks_start_at_their_first_event_and_know_what_came_before() {
        let ticks = group(&[
            ('s', 10),
            ('s', 10),
            ('e', 15),
            ('s', 20),
            ('e', 20),
            ('s', 20),
            ('s', 5),
            ('e', 30),
        ]);
        let summary: Vec<(TimeMs, u64, u64, Option<TimeMs>, usize, usize)> = ticks
            .iter()
            .map(|t| {
                (
                    t.time,
                    t.at.line,
                    t.ordinal,
                    t.max_before,
                    t.samples.len(),
                    t.events.len(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (10, 2, 0, None, 2, 0),
                (20, 4, 1, Some(10), 2, 2),
                (5, 8, 2, Some(20), 1, 0),
                (30, 9, 3, Some(20), 0, 1),
            ]
        );
    }

    #[test]
    fn runs_past_the_caps_are_cut() {
        let samples: Vec<(char, TimeMs)> = vec![('s', 7); MAX_SAMPLES_PER_TICK + 1];
        let ticks = group(&samples);
        assert_eq!(ticks.len(), 2);
        assert_eq!(ticks[0].samples.len(), MAX_SAMPLES_PER_TICK);
        assert_eq!(ticks[1].samples.len(), 1);

        let events: Vec<(char, TimeMs)> = (0..MAX_PENDING_EVENTS as u64 * 2 + 1)
            .map(|t| ('e', t))
            .collect();
        let ticks = group(&events);
        let sizes: Vec<usize> = ticks.iter().map(|t| t.events.len()).collect();
        assert_eq!(sizes, [MAX_PENDING_EVENTS, MAX_PENDING_EVENTS, 1]);
        assert_eq!(ticks[1].time, 2 * MAX_PENDING_EVENTS as u64 - 1);
    }

    #[test]
    fn the_index_stays_bounded_and_finds_where_to_start() {
        let mut index = SeekIndex::default();
        let mut g: Grouper<TimeMs, TimeMs> = Grouper::new(0, None);
        let n = MAX_CHECKPOINTS as u64 * 5;
        for i in 0..n {
            g.sample(i * 10, pos(i + 2));
            while let Some(t) = g.pop() {
                index.observe(&t);
            }
        }
        assert!(index.len() <= MAX_CHECKPOINTS);
        assert!(index.len() > MAX_CHECKPOINTS / 4);
        let c = index.before(12_345).unwrap();
        assert!(c.max_before.is_some_and(|m| m < 12_345), "{c:?}");
        assert!(12_345 - c.ordinal * 10 <= 10 * 8 * 2, "{c:?}");
        assert_eq!(index.before(0).map(|c| c.ordinal), Some(0));
    }

    #[test]
    fn an_out_of_order_recording_seeks_from_before_any_later_time() {
        let mut index = SeekIndex::default();
        for t in group(&[('s', 100), ('s', 10), ('s', 20), ('s', 30)]) {
            index.observe(&t);
        }
        // The first tick at or after 25 in file order is the one at 100.
        assert_eq!(index.before(25).map(|c| c.ordinal), Some(0));
        assert_eq!(index.before(101).map(|c| c.ordinal), Some(3));
    }
}
