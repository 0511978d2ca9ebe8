//! The sampler thread: polls a backend on a fixed schedule and hands ticks to whoever listens.
//!
//! The schedule is anchored to the start time (tick n is due at start + n·interval), so a slow
//! poll does not make the whole run drift. The sleep between ticks waits on a channel, so `stop`
//! takes effect at once rather than after the interval. Ticks due while a poll was running late
//! are skipped, not fired back to back, so a stalled driver leaves gaps, not a burst. The
//! session pipeline (in the core crate) checks every tick's plausibility as it ingests it.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Backend, BackendError, Pacing, Tick};

/// What the sampler sends.
#[derive(Debug)]
pub enum SamplerMsg {
    Tick(Tick),
    /// The backend failed or the recording ended; no more ticks follow.
    Ended(Option<BackendError>),
}

/// A running sampler. Dropping it stops the thread.
pub struct Sampler {
    stop_tx: Option<Sender<()>>,
    handle: Option<JoinHandle<Box<dyn Backend>>>,
    pub rx: Receiver<SamplerMsg>,
}

impl Sampler {
    /// Starts polling `backend` every `interval` (live backends) or as the replay paces itself.
    /// With `limit`, stops after that much time (live) or after the tick at which `limit` has
    /// elapsed; `Some(Duration::ZERO)` takes exactly one tick.
    pub fn spawn(
        mut backend: Box<dyn Backend>,
        interval: Duration,
        limit: Option<Duration>,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("gpudiag-sampler".into())
            .spawn(move || {
                run(&mut *backend, interval, limit, &tx, &stop_rx);
                backend
            });
        let handle = match handle {
            Ok(h) => Some(h),
            Err(e) => {
                // Without a thread there is nothing to sample; say so through the channel.
                let (tx, rx2) = mpsc::channel();
                let _ = tx.send(SamplerMsg::Ended(Some(BackendError::Unavailable(format!(
                    "could not start the sampler thread: {e}"
                )))));
                return Sampler {
                    stop_tx: None,
                    handle: None,
                    rx: rx2,
                };
            }
        };
        Sampler {
            stop_tx: Some(stop_tx),
            handle,
            rx,
        }
    }

    /// Asks the thread to stop; the next message will be `Ended`.
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
    }

    /// Stops the thread and returns the backend.
    pub fn join(mut self) -> Option<Box<dyn Backend>> {
        self.stop();
        self.handle.take().and_then(|h| h.join().ok())
    }
}

impl Drop for Sampler {
    /// Stops the thread and waits a bounded while for it, so the backend is dropped (and its own
    /// threads stopped) before the process can exit under them; a backend stuck in a vendor call
    /// is left behind after the bound rather than hanging the caller.
    fn drop(&mut self) {
        self.stop();
        if let Some(handle) = self.handle.take() {
            let _ = gpudiag_model::deadline::join_within(handle, Duration::from_secs(2));
        }
    }
}

fn run(
    backend: &mut dyn Backend,
    interval: Duration,
    limit: Option<Duration>,
    tx: &Sender<SamplerMsg>,
    stop_rx: &Receiver<()>,
) {
    let start = Instant::now();
    let self_paced = backend.pacing() == Pacing::SelfPaced;
    let mut first_tick_ms = None;
    let mut n: u32 = 0;
    loop {
        match stop_rx.try_recv() {
            Ok(()) | Err(mpsc::TryRecvError::Disconnected) => {
                let _ = tx.send(SamplerMsg::Ended(None));
                return;
            }
            Err(mpsc::TryRecvError::Empty) => {}
        }
        let tick = match backend.poll() {
            Ok(t) => t,
            Err(BackendError::EndOfRecording) => {
                let _ = tx.send(SamplerMsg::Ended(None));
                return;
            }
            Err(e) => {
                let _ = tx.send(SamplerMsg::Ended(Some(e)));
                return;
            }
        };
        // A replay measures its limit in recorded time, a live run in wall time.
        let elapsed = if self_paced {
            let t = tick.samples.first().map(|s| s.time_ms);
            let first = *first_tick_ms.get_or_insert(t.unwrap_or_default());
            Duration::from_millis(t.unwrap_or(first).saturating_sub(first))
        } else {
            start.elapsed()
        };
        if tx.send(SamplerMsg::Tick(tick)).is_err() {
            return;
        }
        if limit.is_some_and(|l| elapsed >= l) {
            let _ = tx.send(SamplerMsg::Ended(None));
            return;
        }
        if self_paced {
            continue;
        }
        n = n.saturating_add(1);
        // A poll that ran past its slot (a slow or stalled driver call) skips the slots it
        // missed, keeping the schedule's phase.
        let behind = start.elapsed().as_nanos() / interval.as_nanos().max(1);
        let behind = u32::try_from(behind).unwrap_or(u32::MAX);
        if n <= behind {
            n = behind.saturating_add(1);
        }
        let due = start + interval * n;
        let wait = due.saturating_duration_since(Instant::now());
        match stop_rx.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let _ = tx.send(SamplerMsg::Ended(None));
                return;
            }
        }
    }
}
