//! The sampler thread: polls a backend on a fixed schedule and hands ticks to whoever listens.
//!
//! The schedule is anchored to the start time (tick n is due at start + n·interval), so a slow
//! poll does not make the whole run drift. The sleep between ticks waits on a channel, so `stop`
//! takes effect at once rather than after the interval. Ticks due while a poll was running late
//! are skipped, not fired back to back, so a stalled driver leaves gaps, not a burst. The
//! session pipeline (in the core crate) checks every tick's plausibility as it ingests it.
//!
//! The channel to the listener holds a bounded number of ticks: a replay polls as fast as it can
//! read, and an unbounded queue in front of a slower listener would end up holding the whole
//! recording.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Backend, BackendError, Pacing, Tick};

/// Ticks waiting for the listener: several seconds of a live run, enough for a replay to stay
/// ahead of the listener without racing away from it.
const QUEUE: usize = 64;

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
        let (tx, rx) = mpsc::sync_channel(QUEUE);
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
                let (tx, rx2) = mpsc::sync_channel(1);
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
        let (_, closed) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.rx, closed));
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

fn run(
    backend: &mut dyn Backend,
    interval: Duration,
    limit: Option<Duration>,
    tx: &SyncSender<SamplerMsg>,
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::{DeviceInfo, HostInfo, Sample};

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
            })
        }
    }

    #[test]
    fn a_self_paced_backend_runs_only_a_bounded_queue_ahead_of_its_listener() {
        let polls = Arc::new(AtomicU64::new(0));
        let backend = Counting {
            polls: polls.clone(),
            host: HostInfo::default(),
        };
        let sampler = Sampler::spawn(Box::new(backend), Duration::from_millis(100), None);
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
            match sampler.rx.recv_timeout(Duration::from_secs(5)) {
                Ok(SamplerMsg::Tick(t)) => assert_eq!(t.samples[0].time_ms, n),
                other => panic!("{other:?}"),
            }
        }
        assert!(sampler.join_within(Duration::from_secs(5)).is_some());
    }
}
