//! A per-poll deadline: a backend whose vendor call hangs must not freeze the sampler or the UI.
//!
//! `PollDeadline` owns the real backend on a worker thread and waits at most `deadline` for each
//! poll. When the worker has not answered, the caller gets a tick in which every device's fields
//! are absent with "driver call did not return within N ms" plus one notice event, and the
//! sampler keeps its cadence. While that call stays stuck no new poll is queued behind it (each
//! later poll answers "stalled" at once); when it finally returns, its stale tick is thrown away
//! and polling resumes. A call that never returns leaves the worker behind, as `deadline.rs`
//! does for initialisation: the process still exits normally when the user quits, because no
//! thread ever waits on the worker without a bound.
//!
//! It also marks a device the backend listed at start but left out of a poll (a GPU that fell
//! out of the driver's device list) with `sanity::MISSING`, so the gap is visible rather than
//! silent. Only live backends (and test faults) run under it: a replay reads memory. A replay
//! under test faults keeps its `Playback` (seek, pace): each request goes to the worker under
//! the same deadline, and none is sent while a poll is stuck.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

use super::replay::Pace;
use super::sanity::{self, MISSING};
use super::{Backend, BackendError, Pacing, Playback, ReplayPosition, Tick};
use gpudiag_model::sample::{Absent, DeviceInfo, Event, EventKind, HostInfo, TimeMs, now_ms};

/// How long one poll of a live backend may take by default. A fast NVML read of every field
/// takes well under a millisecond per GPU; a single read with the slow fields in the poll
/// (`check --window 0`) about 50 ms per GPU.
pub const DEFAULT_POLL_TIMEOUT: Duration = Duration::from_secs(2);

enum Request {
    Poll,
    WaitSlow(Duration, Sender<()>),
    SetSlow(Duration),
    /// Asks NCCL's RAS service (the source runs it on a thread of its own).
    Ras(crate::ras::RasQuery),
    /// Reads the topology; answered on the channel.
    Topology(mpsc::Sender<Option<gpudiag_model::topology::Topology>>),
    /// Runs on the source's playback; the closure answers on a channel of its own.
    Playback(OnPlayback),
}

/// Work for the worker to do on the source's playback.
type OnPlayback = Box<dyn FnOnce(&mut dyn Playback) + Send>;

/// A wrapped replay's playback, reached through the worker.
struct RemotePlayback {
    tx: Sender<Request>,
    deadline: Duration,
    /// A poll is stuck in the worker: a request would only queue behind it.
    poll_stuck: bool,
    /// What was last learned, answered while the worker cannot be asked.
    position: Cell<ReplayPosition>,
    pace: Pace,
}

/// A backend whose polls run on a worker thread under a deadline.
pub struct PollDeadline {
    name: &'static str,
    host: HostInfo,
    devices: Vec<DeviceInfo>,
    pacing: Pacing,
    warnings: Vec<String>,
    recorded: Vec<gpudiag_model::finding::Finding>,
    deadline: Duration,
    tx: Option<Sender<Request>>,
    rx: Receiver<Result<Tick, BackendError>>,
    /// A poll was sent and has not answered yet.
    outstanding: bool,
    /// Consecutive stalled polls, for the notice.
    stalled: u64,
    /// Time of the last tick handed out.
    last_ms: Option<gpudiag_model::sample::TimeMs>,
    /// `None`: the wrapped source has no playback (live hardware).
    playback: Option<RemotePlayback>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl PollDeadline {
    /// Moves `inner` onto a worker thread. Fails only when no thread can be started.
    pub fn new(
        mut inner: Box<dyn Backend>,
        deadline: Duration,
    ) -> Result<PollDeadline, BackendError> {
        let name = inner.name();
        let host = inner.host().clone();
        let devices = inner.devices().to_vec();
        let pacing = inner.pacing();
        let warnings = inner.source_warnings();
        let recorded = inner.recorded_findings();
        let (tx, req_rx) = mpsc::channel::<Request>();
        let playback = inner.playback().map(|p| RemotePlayback {
            tx: tx.clone(),
            deadline,
            poll_stuck: false,
            position: Cell::new(p.position()),
            pace: p.pace(),
        });
        let (resp_tx, rx) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("gpudiag-poll".into())
            .spawn(move || serve(inner, &req_rx, &resp_tx))
            .map_err(|e| {
                BackendError::Unavailable(format!("could not start the polling thread: {e}"))
            })?;
        Ok(PollDeadline {
            name,
            host,
            devices,
            pacing,
            warnings,
            recorded,
            deadline,
            tx: Some(tx),
            rx,
            outstanding: false,
            stalled: 0,
            last_ms: None,
            playback,
            worker: Some(worker),
        })
    }

    fn stalled_tick(&mut self) -> Tick {
        self.stalled += 1;
        // Live: now. A replay: just after its last tick, so recorded time stays coherent.
        let time_ms = match (self.pacing, self.last_ms) {
            (Pacing::SelfPaced, Some(t)) => t + 1,
            _ => now_ms(),
        };
        self.last_ms = Some(time_ms);
        let why = sanity::stalled_reason(self.deadline);
        let samples = self
            .devices
            .iter()
            .map(|d| sanity::all_absent(d.index, time_ms, &why))
            .collect();
        // One notice per stall, not one per tick of it: a recording should say it once.
        let events = if self.stalled == 1 {
            vec![Event {
                time_ms,
                device: None,
                kind: EventKind::Notice {
                    message: format!(
                        "a {} driver call did not return within {} ms; its devices are marked \
                         stalled until it does",
                        self.name,
                        self.deadline.as_millis()
                    ),
                },
            }]
        } else {
            Vec::new()
        };
        Tick {
            samples,
            events,
            ras: Vec::new(),
            kernels: None,
        }
    }

    /// Marks listed devices that the poll left out. An empty tick from a replay means "nothing
    /// yet" (an interrupted wait), not "every GPU gone"; a live poll always lists its GPUs.
    fn mark_missing(&self, tick: &mut Tick) {
        if self.pacing == Pacing::SelfPaced && tick.samples.is_empty() && tick.events.is_empty() {
            return;
        }
        let time_ms = tick
            .samples
            .iter()
            .map(|s| s.time_ms)
            .max()
            .unwrap_or_else(now_ms);
        for d in &self.devices {
            if !tick.samples.iter().any(|s| s.device == d.index) {
                tick.samples.push(sanity::all_absent(
                    d.index,
                    time_ms,
                    &Absent::Error(MISSING.into()),
                ));
            }
        }
        tick.samples.sort_by_key(|s| s.device);
    }
}

fn serve(
    mut inner: Box<dyn Backend>,
    req_rx: &Receiver<Request>,
    resp_tx: &Sender<Result<Tick, BackendError>>,
) {
    for req in req_rx.iter() {
        match req {
            Request::Poll => {
                if resp_tx.send(inner.poll()).is_err() {
                    return;
                }
            }
            Request::WaitSlow(t, done) => {
                inner.wait_for_slow_fields(t);
                let _ = done.send(());
            }
            Request::SetSlow(t) => inner.set_slow_interval(t),
            Request::Ras(q) => inner.request_ras(q),
            Request::Topology(reply) => {
                let _ = reply.send(inner.topology());
            }
            // Without a playback the closure is dropped, and its caller hears no answer.
            Request::Playback(f) => {
                if let Some(p) = inner.playback() {
                    f(p);
                }
            }
        }
    }
}

impl Backend for PollDeadline {
    fn name(&self) -> &'static str {
        self.name
    }

    fn host(&self) -> &HostInfo {
        &self.host
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn pacing(&self) -> Pacing {
        self.pacing
    }

    fn poll(&mut self) -> Result<Tick, BackendError> {
        if self.outstanding {
            // A live caller paces itself, so it hears "stalled" at once; a self-paced caller
            // (a replay under test faults) polls in a loop and must wait, or it would spin.
            let answer = match self.pacing {
                Pacing::Live => self.rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                }),
                Pacing::SelfPaced => self.rx.recv_timeout(self.deadline),
            };
            match answer {
                // The stuck call came back: its tick is stale, poll afresh below.
                Ok(_) => self.outstanding = false,
                Err(RecvTimeoutError::Timeout) => return Ok(self.stalled_tick()),
                Err(RecvTimeoutError::Disconnected) => return Err(died()),
            }
        }
        let Some(tx) = &self.tx else {
            return Err(died());
        };
        if tx.send(Request::Poll).is_err() {
            return Err(died());
        }
        self.outstanding = true;
        match self.rx.recv_timeout(self.deadline) {
            Ok(result) => {
                self.outstanding = false;
                self.stalled = 0;
                let mut tick = result?;
                self.mark_missing(&mut tick);
                if let Some(t) = tick.samples.iter().map(|s| s.time_ms).max() {
                    self.last_ms = Some(t);
                }
                Ok(tick)
            }
            Err(RecvTimeoutError::Timeout) => Ok(self.stalled_tick()),
            Err(RecvTimeoutError::Disconnected) => Err(died()),
        }
    }

    fn source_warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    fn recorded_findings(&self) -> Vec<gpudiag_model::finding::Finding> {
        self.recorded.clone()
    }

    fn wait_for_slow_fields(&self, timeout: Duration) {
        let Some(tx) = &self.tx else {
            return;
        };
        let (done_tx, done_rx) = mpsc::channel();
        if tx.send(Request::WaitSlow(timeout, done_tx)).is_ok() {
            // Bounded here too: a worker stuck in a call never gets to the request.
            let _ = done_rx.recv_timeout(timeout + Duration::from_millis(100));
        }
    }

    fn set_slow_interval(&mut self, interval: Duration) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Request::SetSlow(interval));
        }
    }

    fn request_ras(&mut self, query: crate::ras::RasQuery) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Request::Ras(query));
        }
    }

    fn playback(&mut self) -> Option<&mut dyn Playback> {
        let remote = self.playback.as_mut()?;
        remote.poll_stuck = self.outstanding;
        Some(remote)
    }

    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        let tx = self.tx.as_ref()?;
        let (reply_tx, reply_rx) = mpsc::channel();
        tx.send(Request::Topology(reply_tx)).ok()?;
        // Some hundred NVLink queries on a big host: more than one poll's worth of time, still
        // bounded, since a worker stuck in a call never gets to the request.
        reply_rx
            .recv_timeout(self.deadline + TOPOLOGY_GRACE)
            .ok()
            .flatten()
    }
}

impl RemotePlayback {
    /// Runs `f` on the wrapped source's playback and waits at most the deadline for its answer;
    /// `None` at once while a poll is stuck.
    fn ask<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Playback) -> R + Send + 'static,
    ) -> Option<R> {
        if self.poll_stuck {
            return None;
        }
        let (reply_tx, reply_rx) = mpsc::channel();
        let request = Request::Playback(Box::new(move |p| {
            let _ = reply_tx.send(f(p));
        }));
        self.tx.send(request).ok()?;
        reply_rx.recv_timeout(self.deadline).ok()
    }

    fn busy(&self) -> BackendError {
        BackendError::Unavailable(format!(
            "the replay did not answer within {} ms",
            self.deadline.as_millis()
        ))
    }
}

impl Playback for RemotePlayback {
    fn position(&self) -> ReplayPosition {
        if let Some(position) = self.ask(|p| p.position()) {
            self.position.set(position);
        }
        self.position.get()
    }

    fn pace(&self) -> Pace {
        self.pace
    }

    fn set_pace(&mut self, pace: Pace) -> Result<(), BackendError> {
        self.ask(move |p| p.set_pace(pace))
            .unwrap_or_else(|| Err(self.busy()))?;
        self.pace = pace;
        Ok(())
    }

    fn seek_to(&mut self, time_ms: TimeMs) -> Result<(), BackendError> {
        self.ask(move |p| p.seek_to(time_ms))
            .unwrap_or_else(|| Err(self.busy()))
    }

    /// A worker that does not answer is not at the end: the next poll says how it stands.
    fn at_end(&mut self) -> bool {
        self.ask(|p| p.at_end()).unwrap_or(false)
    }

    fn stalled(&self) -> bool {
        self.poll_stuck
    }

    fn interrupt_waits_on(&mut self, flag: Arc<AtomicBool>) {
        let _ = self.tx.send(Request::Playback(Box::new(move |p| {
            p.interrupt_waits_on(flag);
        })));
    }
}

/// Extra time the topology read may take beyond the poll deadline.
const TOPOLOGY_GRACE: Duration = Duration::from_secs(2);

fn died() -> BackendError {
    BackendError::Unavailable("the polling thread stopped without an answer".into())
}

impl Drop for PollDeadline {
    /// Closes the request channel (the worker ends after its current call) and waits a bounded
    /// while, so the backend's own threads stop before the process exits; a worker stuck in a
    /// vendor call is left behind.
    fn drop(&mut self) {
        // Both senders go, or the worker would wait for requests for ever.
        self.playback = None;
        self.tx = None;
        if let Some(worker) = self.worker.take() {
            let _ = gpudiag_model::deadline::join_within(worker, Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sanity::{Health, worst};
    use gpudiag_model::sample::Sample;

    /// Polls answer at once, except the ones listed, which sleep first.
    struct Slow {
        devices: Vec<DeviceInfo>,
        host: HostInfo,
        n: u32,
        sleep_on: Vec<u32>,
        skip_device_on: Vec<u32>,
    }

    impl Backend for Slow {
        fn name(&self) -> &'static str {
            "slow"
        }
        fn host(&self) -> &HostInfo {
            &self.host
        }
        fn devices(&self) -> &[DeviceInfo] {
            &self.devices
        }
        fn pacing(&self) -> Pacing {
            Pacing::Live
        }
        fn poll(&mut self) -> Result<Tick, BackendError> {
            self.n += 1;
            if self.sleep_on.contains(&self.n) {
                std::thread::sleep(Duration::from_millis(600));
            }
            let mut samples = vec![];
            for d in &self.devices {
                if self.skip_device_on.contains(&self.n) && d.index == 1 {
                    continue;
                }
                let mut s = Sample::new(d.index, u64::from(self.n));
                s.gpu_util_pct = Some(f64::from(self.n));
                samples.push(s);
            }
            Ok(Tick {
                samples,
                events: vec![],
                ras: Vec::new(),
                kernels: None,
            })
        }
        fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
            Some(gpudiag_model::topology::Topology {
                notes: vec![format!("read after {} poll(s)", self.n)],
                ..Default::default()
            })
        }
    }

    fn slow(sleep_on: Vec<u32>, skip_device_on: Vec<u32>) -> Box<dyn Backend> {
        Box::new(Slow {
            devices: (0..2)
                .map(|index| DeviceInfo {
                    index,
                    ..DeviceInfo::default()
                })
                .collect(),
            host: HostInfo::default(),
            n: 0,
            sleep_on,
            skip_device_on,
        })
    }

    #[test]
    fn the_topology_is_read_on_the_worker_that_owns_the_backend() {
        let mut g = PollDeadline::new(slow(vec![], vec![]), Duration::from_secs(5)).unwrap();
        g.poll().unwrap();
        let t = g.topology().expect("forwarded");
        assert_eq!(t.notes, ["read after 1 poll(s)"]);
    }

    #[test]
    fn a_wrapped_replay_keeps_its_playback_and_live_hardware_has_none() {
        use crate::recording::{Header, ReadStats, Record};
        let header = Header::new(
            "nvml",
            HostInfo::default(),
            vec![DeviceInfo::default()],
            None,
        );
        let records = (0..5)
            .map(|i| Record::Sample(Sample::new(0, 1000 + i * 1000)))
            .collect();
        let replay = crate::replay::ReplayBackend::from_parts(
            header,
            records,
            ReadStats::default(),
            Pace::AsFastAsPossible,
        )
        .unwrap();
        let mut g = PollDeadline::new(Box::new(replay), Duration::from_secs(5)).unwrap();
        assert_eq!(g.poll().unwrap().time_ms(), Some(1000));
        let p = g.playback().expect("a replay's playback");
        assert_eq!(p.pace(), Pace::AsFastAsPossible);
        p.seek_to(4000).unwrap();
        assert_eq!(p.position().current_ms, 4000);
        assert!(!p.at_end());
        assert_eq!(g.poll().unwrap().time_ms(), Some(4000));
        let p = g.playback().expect("a replay's playback");
        p.seek_to(2000).unwrap();
        p.set_pace(Pace::Recorded { speed: 1000.0 }).unwrap();
        assert_eq!(p.pace(), Pace::Recorded { speed: 1000.0 });
        assert_eq!(g.poll().unwrap().time_ms(), Some(2000));

        let mut live = PollDeadline::new(slow(vec![], vec![]), Duration::from_secs(5)).unwrap();
        assert!(live.playback().is_none());
    }

    #[test]
    fn a_hung_poll_gives_stalled_ticks_and_polling_resumes() {
        let mut g = PollDeadline::new(slow(vec![2], vec![]), Duration::from_millis(100)).unwrap();
        let first = g.poll().unwrap();
        assert_eq!(first.samples[0].gpu_util_pct, Some(1.0));
        let stalled = g.poll().unwrap();
        assert_eq!(stalled.samples.len(), 2);
        assert!(
            stalled
                .samples
                .iter()
                .all(|s| worst(s) == Some(Health::Stalled))
        );
        assert!(stalled.samples.iter().all(|s| s.gpu_util_pct.is_none()));
        assert_eq!(stalled.events.len(), 1, "one notice per stall");
        // While the call is stuck, polls answer "stalled" without queueing another call.
        let again = g.poll().unwrap();
        assert!(again.events.is_empty());
        assert_eq!(worst(&again.samples[0]), Some(Health::Stalled));
        // Once it returns, its stale tick is dropped and a fresh poll (the third) answers.
        std::thread::sleep(Duration::from_millis(700));
        let back = g.poll().unwrap();
        assert_eq!(back.samples[0].gpu_util_pct, Some(3.0));
        assert_eq!(worst(&back.samples[0]), None);
    }

    #[test]
    fn a_device_left_out_of_a_poll_is_marked_missing() {
        let mut g = PollDeadline::new(slow(vec![], vec![2]), Duration::from_secs(5)).unwrap();
        g.poll().unwrap();
        let t = g.poll().unwrap();
        assert_eq!(t.samples.len(), 2);
        assert_eq!(t.samples[1].device, 1);
        assert_eq!(worst(&t.samples[1]), Some(Health::Missing));
        assert_eq!(worst(&t.samples[0]), None);
        let back = g.poll().unwrap();
        assert_eq!(worst(&back.samples[1]), None);
    }
}
