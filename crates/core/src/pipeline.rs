//! The one pipeline every command and view feeds its ticks into: history, latest values,
//! events, and the rule engine judging them as they arrive. The session opens sources and runs
//! them into it; the judgement reads what it holds.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use gpudiag_model::error::Error;
use gpudiag_model::finding::Finding;
use gpudiag_model::sample::{Event, Sample, TimeMs};
use gpudiag_model::stats::{self, Counter};
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::sanity::Sanitiser;

use crate::history::History;
use crate::rules::engine::RuleEngine;
use crate::rules::families::{self, Lifetime};

/// The one pipeline every command and view feeds: each tick is sanitised (implausible values
/// dropped), pushed into the history, judged by the rules, handed to the sink, and kept as the
/// latest values and events. Nothing else ingests ticks, so every view of a source agrees.
///
/// What it keeps is bounded however long the source runs: the history bounds itself, tick times
/// are kept only within the retained window (without one, only the first, the last and a count),
/// and events within that window, at most [`MAX_EVENTS`] of them.
pub struct Pipeline {
    pub history: History,
    pub latest: BTreeMap<u32, Sample>,
    /// The time of every tick that carried samples, in order, within the retained window; without
    /// one, the latest only.
    tick_times: VecDeque<TimeMs>,
    /// The first such tick, and how many there were, kept or not.
    first_tick: Option<TimeMs>,
    ticks: u64,
    /// The newest events: those in the retained window, at most `MAX_EVENTS`.
    pub events: Vec<Event>,
    pub engine: RuleEngine,
    /// The latest summary of `run --kernels` a recording carried, up to the latest tick.
    pub kernels: Option<Box<gpudiag_model::kernels::RecordedKernels>>,
    sanitiser: Sanitiser,
    /// Long-running consumers (serve, record, the terminal UI) and a check of a recording's end
    /// keep tick times and events for this long only.
    retain: Option<Duration>,
}

/// Events a pipeline keeps at most: a flood of XIDs (or a hostile recording of nothing else)
/// must not grow it without bound.
pub const MAX_EVENTS: usize = 16_384;
/// Tick times kept at most within a retained window: 14 h at the fastest sampling interval
/// (50 ms). Past it the oldest are forgotten, and the window's first time and count describe the
/// newest ones.
const MAX_TICK_TIMES: usize = 1 << 20;

/// What consumes the pipeline's ticks: a trace being built, a recording being written, the
/// Prometheus snapshot, the terminal UI.
pub trait Sink {
    /// Called once per tick, after the tick was sanitised, pushed into the history and judged
    /// (`raised`: the findings this tick raised), before it becomes the latest values.
    fn on_tick(
        &mut self,
        tick: &Tick,
        raised: &[Finding],
        pipeline: &Pipeline,
    ) -> Result<(), Error>;
}

/// A sink that keeps nothing beyond what the pipeline itself keeps (`check`).
pub struct NoSink;

impl Sink for NoSink {
    fn on_tick(&mut self, _: &Tick, _: &[Finding], _: &Pipeline) -> Result<(), Error> {
        Ok(())
    }
}

impl Pipeline {
    pub fn new(engine: RuleEngine) -> Self {
        Pipeline {
            history: History::default(),
            latest: BTreeMap::new(),
            tick_times: VecDeque::new(),
            first_tick: None,
            ticks: 0,
            events: Vec::new(),
            engine,
            kernels: None,
            sanitiser: Sanitiser::new(),
            retain: None,
        }
    }

    /// Keeps tick times and events for `window` only (the history bounds itself).
    pub fn retaining(mut self, window: Duration) -> Self {
        self.retain = Some(window);
        self
    }

    /// sanitise → history → rules → sink → latest values.
    pub fn push_into(&mut self, mut tick: Tick, sink: &mut dyn Sink) -> Result<(), Error> {
        let _timed = stats::Timed::start(Counter::PipelinePushes, Counter::PipelineNs);
        self.sanitiser.apply(&mut tick);
        if let Some(t) = tick.samples.iter().map(|s| s.time_ms).max() {
            self.first_tick.get_or_insert(t);
            self.ticks += 1;
            if self.retain.is_none() {
                self.tick_times.clear();
            }
            self.tick_times.push_back(t);
            if self.tick_times.len() > MAX_TICK_TIMES {
                self.tick_times.pop_front();
            }
        }
        for s in &tick.samples {
            self.history.push_sample(s);
        }
        let raised = self.engine.on_tick(&self.history, &tick);
        let delivered = sink.on_tick(&tick, &raised, self);
        for s in tick.samples {
            self.latest.insert(s.device, s);
        }
        self.events.extend(tick.events);
        if tick.kernels.is_some() {
            self.kernels = tick.kernels;
        }
        if let Some(window) = self.retain {
            self.keep_last(window);
        }
        if self.events.len() > MAX_EVENTS {
            let excess = self.events.len() - MAX_EVENTS;
            self.events.drain(..excess);
        }
        delivered
    }

    /// `push_into` with no sink.
    pub fn push(&mut self, tick: Tick) {
        let _ = self.push_into(tick, &mut NoSink);
    }

    /// Forgets the sanitiser's memory of counters (a replay seeking backwards: counters going
    /// down are then the seek, not the GPU).
    pub fn rewind(&mut self) {
        self.sanitiser.reset();
    }

    /// Keeps only what falls in `(end − window, end]`, the same half-open window the history's
    /// statistics use, so the report's counts and its summary describe the same samples. Tick
    /// times are in order, so this pops from the front and costs nothing once trimmed: long
    /// sessions call it every tick.
    pub fn keep_last(&mut self, window: Duration) {
        let Some(&end) = self.tick_times.back() else {
            return;
        };
        let start = end.saturating_sub(window.as_millis() as u64);
        while self
            .tick_times
            .front()
            .is_some_and(|&t| t <= start && t != end)
        {
            self.tick_times.pop_front();
        }
        self.events.retain(|e| e.time_ms > start);
        // From here on only the window counts.
        self.retain = Some(window);
        self.first_tick = self.tick_times.front().copied();
        self.ticks = self.tick_times.len() as u64;
    }

    /// The first tick with samples: in the retained window, or of the whole run without one.
    pub fn first_ms(&self) -> Option<TimeMs> {
        match self.retain {
            Some(_) => self.tick_times.front().copied(),
            None => self.first_tick,
        }
    }

    pub fn last_ms(&self) -> Option<TimeMs> {
        self.tick_times.back().copied()
    }

    /// How many ticks carried samples: in the retained window, or in the whole run without one.
    pub fn tick_count(&self) -> u64 {
        match self.retain {
            Some(_) => self.tick_times.len() as u64,
            None => self.ticks,
        }
    }

    /// The findings of a report over `[start, the end]`: those raised in it, plus what is still
    /// active at its end.
    pub fn findings_since(&self, start: TimeMs) -> Vec<Finding> {
        // Events are judged by when they happened; windowed and environment findings by the
        // state at the end, plus those that held at some point of the span.
        let mut out: Vec<Finding> = self
            .engine
            .active()
            .into_iter()
            .filter(|f| {
                let event = families::lifetime(&f.id) == Lifetime::Event;
                f.last_seen() >= start || !event
            })
            .collect();
        for f in self.engine.raised() {
            let seen = out.iter().any(|a| a.id == f.id && a.device == f.device);
            if f.last_seen() >= start && !seen {
                out.push(f);
            }
        }
        crate::rules::sort(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RulesConfig;
    use gpudiag_model::sample::{DeviceInfo, EventKind};

    fn pipeline() -> Pipeline {
        let devices = vec![DeviceInfo {
            index: 0,
            ..DeviceInfo::default()
        }];
        Pipeline::new(RuleEngine::new(RulesConfig::default(), devices, None, None))
    }

    /// One sample and one notice every 100 ms.
    fn tick(i: u64) -> Tick {
        let time_ms = 1_000_000 + i * 100;
        Tick {
            samples: vec![Sample::new(0, time_ms)],
            events: vec![Event {
                time_ms,
                device: None,
                kind: EventKind::Notice {
                    message: format!("tick {i}"),
                },
            }],
            ras: Vec::new(),
            kernels: None,
        }
    }

    #[test]
    fn a_long_run_keeps_counts_not_every_tick_time_and_event() {
        let mut p = pipeline();
        let n = MAX_EVENTS as u64 * 2;
        for i in 0..n {
            p.push(tick(i));
        }
        assert_eq!(p.tick_count(), n);
        assert_eq!(p.first_ms(), Some(1_000_000));
        assert_eq!(p.last_ms(), Some(1_000_000 + (n - 1) * 100));
        assert_eq!(p.tick_times.len(), 1);
        assert_eq!(p.events.len(), MAX_EVENTS);
        // The newest are kept.
        assert_eq!(p.events.last().map(|e| e.time_ms), p.last_ms());
    }

    #[test]
    fn a_retained_window_counts_only_its_ticks() {
        let mut p = pipeline().retaining(Duration::from_secs(10));
        for i in 0..1000 {
            p.push(tick(i));
        }
        // (end − 10 s, end]: 100 ticks.
        assert_eq!(p.tick_count(), 100);
        assert_eq!(p.first_ms(), Some(1_000_000 + 900 * 100));
        assert_eq!(p.events.len(), 100);

        // Trimming a longer window to its end gives the same.
        let mut r = pipeline().retaining(Duration::from_secs(3600));
        for i in 0..1000 {
            r.push(tick(i));
        }
        r.keep_last(Duration::from_secs(10));
        assert_eq!(r.tick_count(), 100);
        assert_eq!(r.first_ms(), Some(1_000_000 + 900 * 100));
    }
}
