//! The sampler: the one loop that polls a source. Every command and the terminal UI read their
//! source through it: it runs on a thread of its own, hands ticks to whoever listens (the session
//! pipeline through a bounded queue, the terminal UI through its event channel) and takes
//! controls back: pause, speed, seek and stop. [`read_once`] runs the same loop for one tick on
//! the caller's thread.
//!
//! Live sources are polled on a schedule anchored to the start (tick n is due at
//! start + n·interval), so a slow poll does not make the whole run drift. Ticks due while a poll
//! was running late are skipped, not fired back to back, so a stalled driver leaves gaps, not a
//! burst. The wait between ticks listens for controls, so they take effect at once; a replay
//! paces itself, and its wait for the next tick is cut short (within ~50 ms) when one arrives.
//!
//! Speed and seeking belong to the source's [`Playback`]; live sources have none, and those
//! controls change nothing for them. A seek delivers the ticks it passes over (backwards, those
//! from `lookback` before the target on) in one batch, so a view shows the context of the new
//! position rather than starting empty; at most `max_seek_ticks` of them, the newest, so a dense
//! recording cannot make one batch hold most of it. A recording read from a pipe cannot go back:
//! a backward seek there does nothing. When a recording ends the sampler waits for a seek back or
//! a stop; a live source that fails is done.
//!
//! The queue to a pipeline listener holds a bounded number of ticks: a replay polls as fast as it
//! can read, and an unbounded queue in front of a slower listener would end up holding the whole
//! recording. The session pipeline (in the core crate) checks every tick's plausibility as it
//! ingests it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpudiag_model::stats::{self, Counter};

use super::replay::Pace;
use super::{Backend, BackendError, Pacing, ReplayPosition, Tick};
use gpudiag_model::sample::TimeMs;

/// Ticks waiting for a queue's listener: several seconds of a live run, enough for a replay to
/// stay ahead of the listener without racing away from it.
const QUEUE: usize = 64;

/// What the sampler sends.
#[derive(Debug)]
pub enum SamplerMsg {
    /// Ticks, oldest first: one per poll, or the batch a seek delivers. `reset`: they go back
    /// before what came earlier (a backward seek), so what the listener holds no longer leads up
    /// to them. `position`: where a replay stands after them; `None` for live sources.
    Ticks {
        ticks: Vec<Tick>,
        reset: bool,
        position: Option<ReplayPosition>,
    },
    /// No more ticks for now: the recording ended, the limit passed or the sampler was stopped
    /// (`None`), or the source failed. A recording can still seek back after this.
    Ended(Option<BackendError>),
}

/// What a listener may ask of the sampler.
#[derive(Debug, Clone, PartialEq)]
pub enum SamplerControl {
    /// Stop polling (true) or go on (false).
    Pause(bool),
    /// A replay's speed, 1.0 = as recorded.
    Speed(f64),
    /// Move a replay by this many milliseconds of recorded time.
    Seek(i64),
    /// End the loop; an `Ended` follows unless one came already.
    Stop,
    /// Ask NCCL's RAS service (a live source, on a thread of its own); the answer comes with a
    /// later tick. A replay ignores it: its answers are recorded.
    Ras(crate::ras::RasQuery),
}

/// How the sampler polls.
#[derive(Debug, Clone, Copy)]
pub struct SamplerOptions {
    /// Time between polls of a live source (a replay paces itself).
    pub interval: Duration,
    /// Stop after this much of the source's time: wall time live, recorded time in a replay
    /// (after the tick at which it has passed). `Some(Duration::ZERO)` takes exactly one tick.
    /// With a limit the loop also ends with its source; without one, a recording that ends
    /// waits for a seek back (or a stop).
    pub limit: Option<Duration>,
    /// How much recorded time a backward seek delivers before its target.
    pub lookback: Duration,
    /// Most ticks one seek delivers (the newest).
    pub max_seek_ticks: usize,
}

impl SamplerOptions {
    /// For a listener that never seeks.
    pub fn new(interval: Duration, limit: Option<Duration>) -> Self {
        SamplerOptions {
            interval,
            limit,
            lookback: Duration::ZERO,
            max_seek_ticks: usize::MAX,
        }
    }

    /// With seeks delivering `lookback` of context before a backward target, at most
    /// `max_ticks` ticks.
    pub fn seeking(mut self, lookback: Duration, max_ticks: usize) -> Self {
        self.lookback = lookback;
        self.max_seek_ticks = max_ticks;
        self
    }
}

/// A running sampler. Dropping it stops the thread.
pub struct Sampler {
    controls: Option<Sender<SamplerControl>>,
    /// Set after each control, so a replay waiting for its next tick notices it.
    interrupt: Arc<AtomicBool>,
    handle: Option<JoinHandle<Box<dyn Backend>>>,
    /// The bounded queue [`spawn`](Self::spawn) delivers into; `None` for
    /// [`spawn_into`](Self::spawn_into).
    queue: Option<Receiver<SamplerMsg>>,
}

impl Sampler {
    /// Starts polling `backend` into a bounded queue, read with [`recv`](Self::recv).
    pub fn spawn(backend: Box<dyn Backend>, opts: SamplerOptions) -> Self {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        match Self::spawn_into(backend, opts, move |m| tx.send(m).is_ok()) {
            Ok(mut sampler) => {
                sampler.queue = Some(rx);
                sampler
            }
            Err(e) => {
                // Without a thread there is nothing to sample; say so through the queue.
                let (tx, rx) = mpsc::sync_channel(1);
                let _ = tx.send(SamplerMsg::Ended(Some(BackendError::Unavailable(format!(
                    "could not start the sampler thread: {e}"
                )))));
                Sampler {
                    controls: None,
                    interrupt: Arc::new(AtomicBool::new(false)),
                    handle: None,
                    queue: Some(rx),
                }
            }
        }
    }

    /// Starts polling `backend` into `deliver`, which answers false once its listener has gone:
    /// for a listener that waits on one channel for more than ticks (the terminal UI, whose
    /// input and signals arrive there too).
    pub fn spawn_into(
        mut backend: Box<dyn Backend>,
        opts: SamplerOptions,
        mut deliver: impl FnMut(SamplerMsg) -> bool + Send + 'static,
    ) -> std::io::Result<Self> {
        let (controls, control_rx) = mpsc::channel();
        let interrupt = Arc::new(AtomicBool::new(false));
        let flag = interrupt.clone();
        let handle = std::thread::Builder::new()
            .name("gpudiag-sampler".into())
            .spawn(move || {
                Loop::new(&mut *backend, opts, &control_rx, flag, &mut deliver).run();
                backend
            })?;
        Ok(Sampler {
            controls: Some(controls),
            interrupt,
            handle: Some(handle),
            queue: None,
        })
    }

    /// Hands a control to the loop; a replay waiting for its next tick stops waiting for it.
    pub fn send(&self, c: SamplerControl) {
        if let Some(tx) = &self.controls {
            let _ = tx.send(c);
        }
        // Send first, then wake: the woken loop finds the control waiting.
        self.interrupt.store(true, Ordering::Relaxed);
    }

    /// Asks the loop to stop; the next message will be `Ended` (unless one came already).
    pub fn stop(&mut self) {
        self.send(SamplerControl::Stop);
        self.controls = None;
    }

    /// The next message from the queue; an error once the loop has ended and the queue is
    /// empty, and always for a sampler that delivers elsewhere.
    pub fn recv(&self) -> Result<SamplerMsg, RecvError> {
        self.queue.as_ref().ok_or(RecvError)?.recv()
    }

    /// [`recv`](Self::recv), waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<SamplerMsg, RecvTimeoutError> {
        match &self.queue {
            Some(rx) => rx.recv_timeout(timeout),
            None => Err(RecvTimeoutError::Disconnected),
        }
    }

    /// Stops the thread and returns the backend.
    pub fn join(mut self) -> Option<Box<dyn Backend>> {
        self.stop();
        self.release_queue();
        self.handle.take().and_then(|h| h.join().ok())
    }

    /// As [`join`](Self::join), waiting at most `bound` (a backend stuck in a vendor call is
    /// left behind).
    pub fn join_within(mut self, bound: Duration) -> Option<Box<dyn Backend>> {
        self.stop();
        self.release_queue();
        let handle = self.handle.take()?;
        gpudiag_model::deadline::join_within(handle, bound)
    }

    /// Drops the listener's end of the queue, so a thread blocked on a full queue wakes up
    /// (its send fails) and sees the stop.
    fn release_queue(&mut self) {
        self.queue = None;
    }
}

impl Drop for Sampler {
    /// Stops the thread and waits a bounded while for it, so the backend is dropped (and its own
    /// threads stopped) before the process can exit under them; a backend stuck in a vendor call
    /// is left behind after the bound rather than hanging the caller.
    fn drop(&mut self) {
        self.stop();
        self.release_queue();
        if let Some(handle) = self.handle.take() {
            let _ = gpudiag_model::deadline::join_within(handle, Duration::from_secs(2));
        }
    }
}

/// One tick read through the sampler's loop on the caller's thread, for a single read
/// (`check --window 0`): no thread, since every thread that calls NVML costs resident memory and
/// a single read is held to `nvidia-smi -q`'s footprint, and the backend stays with the caller
/// (its topology is read after the poll). The loop adds a channel and a few branches to the poll.
pub fn read_once(backend: &mut dyn Backend) -> Result<Tick, BackendError> {
    // Kept open for the loop's whole run: a closed control channel ends it before it polls.
    let (_controls, control_rx) = mpsc::channel();
    let mut tick = None;
    let mut failure = None;
    let mut deliver = |m: SamplerMsg| {
        match m {
            SamplerMsg::Ticks { ticks, .. } => tick = tick.take().or(ticks.into_iter().next()),
            SamplerMsg::Ended(e) => failure = e,
        }
        true
    };
    let opts = SamplerOptions::new(Duration::ZERO, Some(Duration::ZERO));
    let interrupt = Arc::new(AtomicBool::new(false));
    Loop::new(backend, opts, &control_rx, interrupt, &mut deliver).run();
    match (tick, failure) {
        (Some(t), _) => Ok(t),
        (None, Some(e)) => Err(e),
        (None, None) => Err(BackendError::EndOfRecording),
    }
}

/// Whether the loop goes on.
enum Flow {
    Go,
    Stop,
}

struct Loop<'a> {
    backend: &'a mut dyn Backend,
    opts: SamplerOptions,
    controls: &'a Receiver<SamplerControl>,
    interrupt: Arc<AtomicBool>,
    deliver: &'a mut dyn FnMut(SamplerMsg) -> bool,
    self_paced: bool,
    paused: bool,
    /// The source ended (or failed) and an `Ended` went out.
    ended: bool,
    /// The live schedule: slot n is due at `anchor + n·interval`.
    anchor: Instant,
    slot: u32,
    /// Where the limit counts from: wall time live, the first tick's recorded time in a replay.
    began: Instant,
    first_tick_ms: Option<TimeMs>,
}

impl<'a> Loop<'a> {
    fn new(
        backend: &'a mut dyn Backend,
        opts: SamplerOptions,
        controls: &'a Receiver<SamplerControl>,
        interrupt: Arc<AtomicBool>,
        deliver: &'a mut dyn FnMut(SamplerMsg) -> bool,
    ) -> Self {
        let self_paced = backend.pacing() == Pacing::SelfPaced;
        let now = Instant::now();
        Loop {
            backend,
            opts,
            controls,
            interrupt,
            deliver,
            self_paced,
            paused: false,
            ended: false,
            anchor: now,
            slot: 0,
            began: now,
            first_tick_ms: None,
        }
    }

    fn run(&mut self) {
        let flag = self.interrupt.clone();
        if let Some(p) = self.backend.playback() {
            p.interrupt_waits_on(flag);
        }
        loop {
            self.interrupt.store(false, Ordering::Relaxed);
            loop {
                match self.controls.try_recv() {
                    Ok(c) => {
                        if let Flow::Stop = self.apply(c) {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if self.paused || self.ended {
                // Nothing to poll: wait for the listener to say something.
                match self.controls.recv() {
                    Ok(c) => {
                        if let Flow::Stop = self.apply(c) {
                            return;
                        }
                        continue;
                    }
                    Err(_) => return,
                }
            }
            if !self.self_paced {
                let due = self.anchor + self.opts.interval * self.slot;
                let wait = due.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    match self.controls.recv_timeout(wait) {
                        Ok(c) => {
                            if let Flow::Stop = self.apply(c) {
                                return;
                            }
                            continue;
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            }
            if let Flow::Stop = self.step() {
                return;
            }
        }
    }

    /// One poll, and what it yields to the listener.
    fn step(&mut self) -> Flow {
        let polled = {
            let _timed = stats::Timed::start(Counter::Polls, Counter::PollNs);
            self.backend.poll()
        };
        if !self.self_paced {
            // A poll that ran past its slot (a slow or stalled driver call) skips the slots it
            // missed, keeping the schedule's phase.
            self.slot = self.slot.saturating_add(1);
            let behind = self.anchor.elapsed().as_nanos() / self.opts.interval.as_nanos().max(1);
            let behind = u32::try_from(behind).unwrap_or(u32::MAX);
            if self.slot <= behind {
                self.slot = behind.saturating_add(1);
            }
        }
        let tick = match polled {
            // A replay's wait cut short by a control: nothing to show.
            Ok(t) if self.self_paced && t == Tick::default() => return Flow::Go,
            Ok(t) => t,
            Err(e) => {
                self.ended = true;
                let failure = match e {
                    BackendError::EndOfRecording => None,
                    other => Some(other),
                };
                if !(self.deliver)(SamplerMsg::Ended(failure)) {
                    return Flow::Stop;
                }
                // A recording can still seek back; a failed live source is done, and so is a
                // limited run.
                let can_go_back = self.opts.limit.is_none() && self.backend.playback().is_some();
                return if can_go_back { Flow::Go } else { Flow::Stop };
            }
        };
        // A replay measures its limit in recorded time, a live run in wall time.
        let elapsed = if self.self_paced {
            let t = tick.samples.first().map(|s| s.time_ms);
            let first = *self.first_tick_ms.get_or_insert(t.unwrap_or_default());
            Duration::from_millis(t.unwrap_or(first).saturating_sub(first))
        } else {
            self.began.elapsed()
        };
        let position = self.backend.playback().map(|p| p.position());
        let delivered = (self.deliver)(SamplerMsg::Ticks {
            ticks: vec![tick],
            reset: false,
            position,
        });
        if !delivered {
            return Flow::Stop;
        }
        if self.opts.limit.is_some_and(|l| elapsed >= l) {
            self.ended = true;
            let _ = (self.deliver)(SamplerMsg::Ended(None));
            return Flow::Stop;
        }
        Flow::Go
    }

    fn apply(&mut self, c: SamplerControl) -> Flow {
        match c {
            SamplerControl::Stop => {
                if !self.ended {
                    let _ = (self.deliver)(SamplerMsg::Ended(None));
                }
                return Flow::Stop;
            }
            SamplerControl::Pause(paused) => {
                self.paused = paused;
                if !paused {
                    self.anchor = Instant::now();
                    self.slot = 0;
                    // Re-anchor a replay's clock, or every tick due during the pause would come
                    // at once.
                    if let Some(p) = self.backend.playback() {
                        let pace = p.pace();
                        let _ = p.set_pace(pace);
                    }
                }
            }
            SamplerControl::Speed(speed) => {
                if let Some(p) = self.backend.playback() {
                    let _ = p.set_pace(Pace::Recorded { speed });
                }
            }
            SamplerControl::Seek(delta_ms) => return self.seek(delta_ms),
            SamplerControl::Ras(query) => self.backend.request_ras(query),
        }
        Flow::Go
    }

    /// Moves a replay by `delta_ms` and delivers what it passed over.
    fn seek(&mut self, delta_ms: i64) -> Flow {
        let Some(p) = self.backend.playback() else {
            return Flow::Go;
        };
        let at = p.position();
        let target = at
            .current_ms
            .saturating_add_signed(delta_ms)
            .clamp(at.start_ms, at.end_ms);
        let reset = delta_ms < 0;
        if !reset && target == at.current_ms {
            return Flow::Go;
        }
        // Everything up to the target at once, then on at the pace it had. A source that cannot
        // change pace now (a guarded replay whose worker is stuck) does not move at all.
        let pace = p.pace();
        if p.set_pace(Pace::AsFastAsPossible).is_err() {
            return Flow::Go;
        }
        if reset {
            let lookback = u64::try_from(self.opts.lookback.as_millis()).unwrap_or(u64::MAX);
            let from = target.saturating_sub(lookback).max(at.start_ms);
            if p.seek_to(from).is_err() {
                let _ = p.set_pace(pace);
                return Flow::Go;
            }
        }
        let mut ticks = VecDeque::new();
        while let Ok(t) = self.backend.poll() {
            let time = t.time_ms();
            // Past a poll that did not answer in time, every further poll of the seek would wait
            // a deadline: the seek ends where the source stands.
            let stalled = self.backend.playback().is_some_and(|p| p.stalled());
            ticks.push_back(t);
            if ticks.len() > self.opts.max_seek_ticks {
                ticks.pop_front();
            }
            if stalled || time.is_some_and(|t| t >= target) {
                break;
            }
        }
        let (position, at_end) = match self.backend.playback() {
            Some(p) => {
                let _ = p.set_pace(pace);
                (Some(p.position()), p.at_end())
            }
            None => (None, true),
        };
        self.ended = at_end;
        let delivered = (self.deliver)(SamplerMsg::Ticks {
            ticks: Vec::from(ticks),
            reset,
            position,
        });
        if !delivered || (self.ended && !(self.deliver)(SamplerMsg::Ended(None))) {
            return Flow::Stop;
        }
        Flow::Go
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::recording::{Header, ReadStats, Record};
    use crate::replay::ReplayBackend;
    use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample};

    /// A self-paced backend with no end, counting its polls.
    struct Counting {
        polls: Arc<AtomicU64>,
        host: HostInfo,
    }

    impl Backend for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn host(&self) -> &HostInfo {
            &self.host
        }
        fn devices(&self) -> &[DeviceInfo] {
            &[]
        }
        fn pacing(&self) -> Pacing {
            Pacing::SelfPaced
        }
        fn poll(&mut self) -> Result<Tick, BackendError> {
            let n = self.polls.fetch_add(1, Ordering::Relaxed);
            Ok(Tick {
                samples: vec![Sample::new(0, n)],
                events: Vec::new(),
                ras: Vec::new(),
                kernels: None,
            })
        }
    }

    fn every_100ms() -> SamplerOptions {
        SamplerOptions::new(Duration::from_millis(100), None)
    }

    #[test]
    fn a_self_paced_backend_runs_only_a_bounded_queue_ahead_of_its_listener() {
        let polls = Arc::new(AtomicU64::new(0));
        let backend = Counting {
            polls: polls.clone(),
            host: HostInfo::default(),
        };
        let sampler = Sampler::spawn(Box::new(backend), every_100ms());
        // Wait until the sampler stops polling: it is blocked on the full queue.
        let mut seen = 0;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let now = polls.load(Ordering::Relaxed);
            if now == seen && now > 0 {
                break;
            }
            seen = now;
            assert!(
                now <= QUEUE as u64 + 2,
                "{now} polls for a queue of {QUEUE}"
            );
        }
        // What it polled is what the listener gets, in order.
        for n in 0..seen {
            match sampler.recv_timeout(Duration::from_secs(5)) {
                Ok(SamplerMsg::Ticks { ticks, .. }) => assert_eq!(ticks[0].samples[0].time_ms, n),
                other => panic!("{other:?}"),
            }
        }
        assert!(sampler.join_within(Duration::from_secs(5)).is_some());
    }

    /// A replay of `n` ticks one second apart, from the records in memory (it can seek back).
    fn replay(n: u64, pace: Pace) -> ReplayBackend {
        let header = Header::new(
            "nvml",
            HostInfo::default(),
            vec![DeviceInfo::default()],
            None,
        );
        let records = (0..n)
            .map(|i| Record::Sample(Sample::new(0, 1_000_000 + i * 1000)))
            .collect();
        ReplayBackend::from_parts(header, records, ReadStats::default(), pace).unwrap()
    }

    /// The same at real time, read once as a stream (it cannot seek back).
    fn streamed(n: u64) -> ReplayBackend {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.ndjson");
        let header = Header::new(
            "nvml",
            HostInfo::default(),
            vec![DeviceInfo::default()],
            None,
        );
        let mut w = crate::recording::RecordingWriter::create(&path, &header).unwrap();
        for i in 0..n {
            w.write(&Record::Sample(Sample::new(0, 1_000_000 + i * 1000)))
                .unwrap();
        }
        w.finish().unwrap();
        let file = std::fs::File::open(&path).unwrap();
        ReplayBackend::from_reader(file, Pace::Recorded { speed: 1.0 }).unwrap()
    }

    fn next(sampler: &Sampler) -> SamplerMsg {
        sampler.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    fn batch(msg: SamplerMsg) -> (Vec<TimeMs>, bool, ReplayPosition) {
        match msg {
            SamplerMsg::Ticks {
                ticks,
                reset,
                position,
            } => (
                ticks.iter().filter_map(Tick::time_ms).collect(),
                reset,
                position.unwrap(),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn seeks_deliver_their_context_in_one_capped_batch() {
        // Slow enough that only the first tick plays; paused, so that no tick follows a seek
        // (a replay plays the tick after a seek at once, then at its pace).
        let opts = every_100ms().seeking(Duration::from_secs(5), 4);
        let sampler = Sampler::spawn(Box::new(replay(100, Pace::Recorded { speed: 0.01 })), opts);
        let (first, _, _) = batch(next(&sampler));
        assert_eq!(first, [1_000_000]);
        sampler.send(SamplerControl::Pause(true));
        // Forwards 30 s: the ticks passed over, the newest four, ending at the target.
        sampler.send(SamplerControl::Seek(30_000));
        let (times, reset, at) = batch(next(&sampler));
        assert!(!reset);
        assert_eq!(times, [1_027_000, 1_028_000, 1_029_000, 1_030_000]);
        assert_eq!(at.current_ms, 1_030_000);
        // Backwards 20 s: from the lookback (5 s) before the target, flagged as a reset; again
        // the newest four.
        sampler.send(SamplerControl::Seek(-20_000));
        let (times, reset, at) = batch(next(&sampler));
        assert!(reset);
        assert_eq!(times, [1_007_000, 1_008_000, 1_009_000, 1_010_000]);
        assert_eq!(at.current_ms, 1_010_000);
        // Past the end: the last ticks, then the end; a seek back plays again.
        sampler.send(SamplerControl::Seek(1_000_000));
        let (times, _, at) = batch(next(&sampler));
        assert_eq!(times.last(), Some(&1_099_000));
        assert_eq!(at.current_ms, at.end_ms);
        assert!(matches!(next(&sampler), SamplerMsg::Ended(None)));
        sampler.send(SamplerControl::Seek(-2_000));
        let (times, reset, _) = batch(next(&sampler));
        assert!(reset);
        assert_eq!(times, [1_094_000, 1_095_000, 1_096_000, 1_097_000]);
        // The speed goes to the replay: fast, it plays to the end at once.
        sampler.send(SamplerControl::Speed(1e6));
        sampler.send(SamplerControl::Pause(false));
        let mut last = None;
        loop {
            match next(&sampler) {
                SamplerMsg::Ticks { ticks, .. } => last = ticks.last().and_then(Tick::time_ms),
                SamplerMsg::Ended(why) => {
                    assert!(why.is_none(), "{why:?}");
                    break;
                }
            }
        }
        assert_eq!(last, Some(1_099_000));
    }

    #[test]
    fn a_stream_seeks_forwards_only_and_controls_cut_its_wait_short() {
        let opts = every_100ms().seeking(Duration::from_secs(5), 100);
        let sampler = Sampler::spawn(Box::new(streamed(20)), opts);
        assert_eq!(batch(next(&sampler)).0, [1_000_000]);
        // The next tick is a second away: controls must not wait for it. A stream knows its end
        // only as far as it has read, so let the sampler read the next tick (it waits with it)
        // before seeking, and do not assert how far the seek goes.
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        sampler.send(SamplerControl::Pause(true));
        sampler.send(SamplerControl::Seek(5_000));
        let (times, reset, _) = batch(next(&sampler));
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
        assert!(!reset);
        assert!(times.iter().all(|&t| t > 1_000_000), "{times:?}");
        // Backwards: a pipe cannot go back, and nothing is delivered.
        sampler.send(SamplerControl::Seek(-3_000));
        match sampler.recv_timeout(Duration::from_millis(1000)) {
            Err(RecvTimeoutError::Timeout) => {}
            other => panic!("a backward seek of a stream delivered {other:?}"),
        }
        // Playing again, the tick after the seek comes at once and the next a second later; a
        // stop ends the wait for it.
        sampler.send(SamplerControl::Pause(false));
        assert!(!batch(next(&sampler)).0.is_empty());
        let start = Instant::now();
        let backend = sampler.join_within(Duration::from_secs(5));
        assert!(backend.is_some());
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_seek_ends_where_a_stuck_source_stands() {
        // A replay (a tick every 500 ms) under a 2 s poll deadline whose eleventh poll hangs for
        // good: the seek meets it.
        let faulty = crate::fault::FaultBackend::new(
            Box::new(replay(100, Pace::Recorded { speed: 2.0 })),
            crate::fault::parse("hang:3600s@10").unwrap(),
        );
        let deadline = Duration::from_secs(2);
        let guarded = crate::poll_deadline::PollDeadline::new(Box::new(faulty), deadline).unwrap();
        let sampler = Sampler::spawn(
            Box::new(guarded),
            every_100ms().seeking(Duration::ZERO, 100),
        );
        assert_eq!(batch(next(&sampler)).0, [1_000_000]);
        sampler.send(SamplerControl::Pause(true));
        let start = Instant::now();
        sampler.send(SamplerControl::Seek(30_000));
        let (times, reset, _) = batch(next(&sampler));
        assert!(start.elapsed() < deadline * 2, "{:?}", start.elapsed());
        assert!(!reset);
        // Nine ticks, then the stalled one, just after them in recorded time.
        let mut expected: Vec<TimeMs> = (1..10).map(|i| 1_000_000 + i * 1000).collect();
        expected.push(1_009_001);
        assert_eq!(times, expected);
        // Stuck, the source cannot seek; the sampler still stops.
        sampler.send(SamplerControl::Seek(-1_000));
        match sampler.recv_timeout(Duration::from_millis(500)) {
            Err(RecvTimeoutError::Timeout) => {}
            other => panic!("a stuck source moved: {other:?}"),
        }
        assert!(sampler.join_within(Duration::from_secs(5)).is_some());
    }

    /// A live backend counting its polls.
    struct Live {
        polls: Arc<AtomicU64>,
        host: HostInfo,
    }

    impl Backend for Live {
        fn name(&self) -> &'static str {
            "live"
        }
        fn host(&self) -> &HostInfo {
            &self.host
        }
        fn devices(&self) -> &[DeviceInfo] {
            &[]
        }
        fn pacing(&self) -> Pacing {
            Pacing::Live
        }
        fn poll(&mut self) -> Result<Tick, BackendError> {
            let n = self.polls.fetch_add(1, Ordering::Relaxed);
            Ok(Tick {
                samples: vec![Sample::new(0, gpudiag_model::sample::now_ms() + n)],
                events: Vec::new(),
                ras: Vec::new(),
                kernels: None,
            })
        }
    }

    #[test]
    fn a_single_read_is_one_tick_of_the_same_loop() {
        let polls = Arc::new(AtomicU64::new(0));
        let mut live = Live {
            polls: polls.clone(),
            host: HostInfo::default(),
        };
        let tick = read_once(&mut live).unwrap();
        assert_eq!(tick.samples.len(), 1);
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        let mut empty = replay(0, Pace::AsFastAsPossible);
        assert!(matches!(
            read_once(&mut empty),
            Err(BackendError::EndOfRecording)
        ));
        let mut r = replay(3, Pace::AsFastAsPossible);
        assert_eq!(read_once(&mut r).unwrap().time_ms(), Some(1_000_000));
    }

    #[test]
    fn a_live_source_ignores_seek_and_speed_and_stops_polling_while_paused() {
        let polls = Arc::new(AtomicU64::new(0));
        let live = Live {
            polls: polls.clone(),
            host: HostInfo::default(),
        };
        let opts = SamplerOptions::new(Duration::from_millis(20), None);
        let sampler = Sampler::spawn(Box::new(live), opts);
        match next(&sampler) {
            SamplerMsg::Ticks { position, .. } => assert_eq!(position, None),
            other => panic!("{other:?}"),
        }
        sampler.send(SamplerControl::Pause(true));
        std::thread::sleep(Duration::from_millis(100));
        while sampler.recv_timeout(Duration::ZERO).is_ok() {}
        let paused_at = polls.load(Ordering::Relaxed);
        sampler.send(SamplerControl::Seek(-10_000));
        sampler.send(SamplerControl::Speed(8.0));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(polls.load(Ordering::Relaxed), paused_at);
        sampler.send(SamplerControl::Pause(false));
        match next(&sampler) {
            SamplerMsg::Ticks { reset, .. } => assert!(!reset),
            other => panic!("{other:?}"),
        }
    }
}
