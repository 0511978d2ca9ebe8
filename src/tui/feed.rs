//! The telemetry feed: a thread that owns the backend, polls it, and sends ticks to the UI's
//! channel. The UI thread never calls the backend, so a slow NVML call or a replay's wait can
//! only delay data, never input or drawing.
//!
//! FeedControl messages (pause, speed, seek, stop) arrive on a second channel. A replay waiting for
//! its next tick is woken through its interrupt flag, so controls take effect within ~50 ms.
//! Seeking delivers the skipped ticks (and, backwards, up to `LOOKBACK` before the target) in one
//! batch, so the charts show the context of the new position rather than starting empty; at most
//! `MAX_SEEK_TICKS` of them, the newest, so a dense recording cannot make one batch hold most of
//! it. A recording read from a pipe cannot go back: a backward seek there does nothing.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use super::messages::{AppEvent, FeedControl, FeedMsg, LOOKBACK, ReplayPosition, tick_time};
use gpudiag_model::stats::{self, Counter};
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::{Backend, BackendError};

/// Ticks one seek delivers at most: as many as the session keeps.
const MAX_SEEK_TICKS: usize = super::app::MAX_SESSION_TICKS;

/// The source the feed polls. Only the feed distinguishes live from replay: seeking and speed
/// exist only for a recording.
pub enum Driver {
    Live(Box<dyn Backend>),
    Replay(Box<ReplayBackend>),
}

/// Handle on the feed thread.
pub struct Feed {
    ctl: Sender<FeedControl>,
    interrupt: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Feed {
    /// Starts the thread; `interval` paces live backends (replays pace themselves).
    pub fn spawn(
        driver: Driver,
        interval: Duration,
        speed: f64,
        tx: Sender<AppEvent>,
    ) -> std::io::Result<Feed> {
        let (ctl, ctl_rx) = mpsc::channel();
        let interrupt = Arc::new(AtomicBool::new(false));
        let driver = match driver {
            Driver::Replay(r) => Driver::Replay(Box::new((*r).with_interrupt(interrupt.clone()))),
            live => live,
        };
        let mut worker = Worker {
            driver,
            interval,
            speed,
            paused: false,
            at_end: false,
            next_due: Instant::now(),
            tx,
            ctl_rx,
            interrupt: interrupt.clone(),
        };
        let worker = std::thread::Builder::new()
            .name("gpudiag-feed".into())
            .spawn(move || worker.run())?;
        Ok(Feed {
            ctl,
            interrupt,
            worker: Some(worker),
        })
    }

    pub fn send(&self, c: FeedControl) {
        // Send first, then wake: the woken poll finds the control waiting.
        let _ = self.ctl.send(c);
        self.interrupt.store(true, Ordering::Relaxed);
    }
}

impl Drop for Feed {
    /// Stops the worker and waits a bounded while for it, so the backend it owns is dropped
    /// (and its own threads stopped) before the process exits; a backend stuck in a vendor call
    /// is left behind after the bound rather than hanging the exit.
    fn drop(&mut self) {
        self.send(FeedControl::Stop);
        if let Some(worker) = self.worker.take() {
            let _ = gpudiag_model::deadline::join_within(worker, Duration::from_secs(2));
        }
    }
}

struct Worker {
    driver: Driver,
    interval: Duration,
    speed: f64,
    paused: bool,
    at_end: bool,
    next_due: Instant,
    tx: Sender<AppEvent>,
    ctl_rx: Receiver<FeedControl>,
    interrupt: Arc<AtomicBool>,
}

/// Whether the worker goes on after a control.
enum Flow {
    Go,
    Stop,
}

impl Worker {
    fn run(&mut self) {
        loop {
            self.interrupt.store(false, Ordering::Relaxed);
            loop {
                match self.ctl_rx.try_recv() {
                    Ok(c) => {
                        if let Flow::Stop = self.apply(c) {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if self.paused || self.at_end {
                // Nothing to poll: block until the UI says something.
                match self.ctl_rx.recv() {
                    Ok(c) => {
                        if let Flow::Stop = self.apply(c) {
                            return;
                        }
                        continue;
                    }
                    Err(_) => return,
                }
            }
            if !self.step() {
                return;
            }
        }
    }

    /// One poll; false when the UI has gone away.
    fn step(&mut self) -> bool {
        let speed = self.speed;
        let (result, position) = match &mut self.driver {
            Driver::Live(_) => {
                let wait = self.next_due.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    match self.ctl_rx.recv_timeout(wait) {
                        Ok(c) => return !matches!(self.apply(c), Flow::Stop),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return false,
                    }
                }
                // Anchored schedule; after a pause or a slow poll, start afresh from now
                // instead of firing the missed ticks back to back.
                let now = Instant::now();
                self.next_due += self.interval;
                if self.next_due <= now {
                    self.next_due = now + self.interval;
                }
                let _timed = stats::Timed::start(Counter::Polls, Counter::PollNs);
                match &mut self.driver {
                    Driver::Live(backend) => (backend.poll(), None),
                    Driver::Replay(_) => return true,
                }
            }
            Driver::Replay(r) => {
                let result = {
                    let _timed = stats::Timed::start(Counter::Polls, Counter::PollNs);
                    r.poll()
                };
                (result, Some(position(r, speed)))
            }
        };
        match result {
            // An interrupted replay wait: nothing to show.
            Ok(t) if t.samples.is_empty() && t.events.is_empty() => true,
            Ok(t) => send(
                &self.tx,
                FeedMsg::Ticks {
                    ticks: vec![t],
                    reset: false,
                    position,
                },
            ),
            Err(e) => {
                self.at_end = true;
                let why = match e {
                    BackendError::EndOfRecording => None,
                    other => Some(other.to_string()),
                };
                send(&self.tx, FeedMsg::Ended(why))
            }
        }
    }

    fn apply(&mut self, c: FeedControl) -> Flow {
        match c {
            FeedControl::Stop => return Flow::Stop,
            FeedControl::Pause(p) => {
                self.paused = p;
                if !p {
                    self.next_due = Instant::now();
                    // Re-anchor the replay's clock, or every tick due during the pause would
                    // come at once.
                    if let Driver::Replay(r) = &mut self.driver {
                        let _ = r.set_pace(Pace::Recorded { speed: self.speed });
                    }
                }
            }
            FeedControl::Speed(s) => {
                if let Driver::Replay(r) = &mut self.driver
                    && r.set_pace(Pace::Recorded { speed: s }).is_ok()
                {
                    self.speed = s;
                }
            }
            FeedControl::Seek(delta) => {
                if !self.seek(delta) {
                    return Flow::Stop;
                }
            }
        }
        Flow::Go
    }

    /// Moves a replay by `delta_ms`; false when the UI has gone away.
    fn seek(&mut self, delta_ms: i64) -> bool {
        let Driver::Replay(r) = &mut self.driver else {
            return true;
        };
        let (current, start, end) = r.position();
        let target = current.saturating_add_signed(delta_ms).clamp(start, end);
        let reset = delta_ms < 0;
        if reset {
            let from = target
                .saturating_sub(LOOKBACK.as_millis() as u64)
                .max(start);
            if r.seek_to(from).is_err() {
                return true;
            }
        } else if target == current {
            return true;
        }
        // Deliver everything up to the target at once, then play on at the chosen speed.
        let _ = r.set_pace(Pace::AsFastAsPossible);
        let mut ticks = VecDeque::new();
        while let Ok(t) = r.poll() {
            let time = tick_time(&t);
            ticks.push_back(t);
            if ticks.len() > MAX_SEEK_TICKS {
                ticks.pop_front();
            }
            if time.is_some_and(|t| t >= target) {
                break;
            }
        }
        let ticks = Vec::from(ticks);
        let _ = r.set_pace(Pace::Recorded { speed: self.speed });
        self.at_end = r.at_end();
        let position = Some(position(r, self.speed));
        let ok = send(
            &self.tx,
            FeedMsg::Ticks {
                ticks,
                reset,
                position,
            },
        );
        if ok && self.at_end {
            return send(&self.tx, FeedMsg::Ended(None));
        }
        ok
    }
}

fn send(tx: &Sender<AppEvent>, msg: FeedMsg) -> bool {
    tx.send(AppEvent::Feed(msg)).is_ok()
}

fn position(r: &ReplayBackend, speed: f64) -> ReplayPosition {
    let (current_ms, start_ms, end_ms) = r.position();
    ReplayPosition {
        current_ms,
        start_ms,
        end_ms,
        speed,
    }
}
