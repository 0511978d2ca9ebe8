//! XID errors, from an NVML event set on a thread of their own: NVML hands events only to a
//! waiter, and a wait blocks, so the thread waits in short slices (to notice a stop) and queues
//! what it sees for the next poll. A GPU that cannot deliver XIDs is reported once, as a notice,
//! so its XIDs are not silently missed.
//!
//! A wait that does not come back (a driver holding the call) would miss XIDs just as silently,
//! so the thread beats a `Heartbeat` each time NVML returns, and `poll()` reports once when the
//! beats stop for `EVENT_STUCK_AFTER`, and once more when they resume.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;

use super::lock;
use super::slow::SlowShared;
use gpudiag_model::sample::{DeviceInfo, Event, EventKind, now_ms};
use gpudiag_model::stats::{self, CallGroup, Counter};

/// How long one wait on the event set may block; bounds how late the thread notices a stop.
/// Short while the backend is young, so a `check` of a second or two exits promptly; then
/// longer, since every return is a driver call and a monitor left running for hours would
/// otherwise make ten a second for nothing.
const EVENT_WAIT_MS: u32 = 100;
const EVENT_WAIT_LONG_MS: u32 = 500;
/// How long the thread waits in short slices before the long ones.
const SHORT_WAITS_FOR: Duration = Duration::from_secs(5);

/// The wait slice for a thread that started `running` ago.
fn wait_slice_ms(running: Duration) -> u32 {
    if running < SHORT_WAITS_FOR {
        EVENT_WAIT_MS
    } else {
        EVENT_WAIT_LONG_MS
    }
}
/// Pause after a failed wait, so a persistent failure does not spin.
const FAILED_WAIT_PAUSE: Duration = Duration::from_secs(5);
/// Silence from the event thread past which it counts as stuck in NVML: well above one wait
/// (500 ms at most) and the pause after a failed one.
pub(super) const EVENT_STUCK_AFTER: Duration = Duration::from_secs(10);

/// When a background thread last came back from the driver; `None` while it is not running
/// (not started, or finished on purpose), which is never "stuck".
#[derive(Debug, Default)]
pub(super) struct Heartbeat(Mutex<Option<Instant>>);

impl Heartbeat {
    pub(super) fn beat(&self) {
        *lock(&self.0) = Some(Instant::now());
    }

    fn stopped(&self) {
        *lock(&self.0) = None;
    }

    /// How long the thread has been silent, once that is more than `limit`.
    pub(super) fn stuck_for(&self, now: Instant, limit: Duration) -> Option<Duration> {
        let last = (*lock(&self.0))?;
        let silent = now.saturating_duration_since(last);
        (silent > limit).then_some(silent)
    }
}

/// The notice to queue for the event thread's state: one when it gets stuck, one when it comes
/// back, nothing in between. `reported` remembers which side of that the last poll saw.
pub(super) fn stuck_notice(stuck: Option<Duration>, reported: &mut bool) -> Option<String> {
    match (stuck, *reported) {
        (Some(d), false) => {
            *reported = true;
            Some(format!(
                "XID events: the event thread has been inside an NVML call for {} s; XIDs \
                 raised meanwhile will only show in the kernel log (dmesg | grep -i xid) until \
                 it returns",
                d.as_secs()
            ))
        }
        (None, true) => {
            *reported = false;
            Some(
                "XID events: the event thread's NVML call returned; XIDs are read again (look in \
                 the kernel log for any raised while it was stuck)"
                    .into(),
            )
        }
        _ => None,
    }
}

/// Starts the thread that waits on an NVML event set for XID errors of every device and queues
/// them as `Event`s for the next poll. Devices that cannot deliver XID events are reported once,
/// as a notice, instead of silently missing them.
pub(super) fn start_event_thread(
    nvml: &Arc<Nvml>,
    devices: &[DeviceInfo],
    queue: &Arc<Mutex<Vec<Event>>>,
    shared: &Arc<SlowShared>,
    beat: &Arc<Heartbeat>,
) {
    let (nvml, thread_queue, shared) = (Arc::clone(nvml), Arc::clone(queue), Arc::clone(shared));
    let thread_beat = Arc::clone(beat);
    let indices: Vec<u32> = devices.iter().map(|d| d.index).collect();
    // From now: registration can hang in the driver as well as a wait.
    beat.beat();
    let spawned = std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || {
            event_loop(&nvml, &indices, &thread_queue, &shared, &thread_beat);
            thread_beat.stopped();
        });
    if let Err(e) = spawned {
        beat.stopped();
        lock(queue).push(notice(
            None,
            format!("XID events are off: could not start their thread: {e}"),
        ));
    }
}

fn notice(device: Option<u32>, message: String) -> Event {
    Event {
        time_ms: now_ms(),
        device,
        kind: EventKind::Notice { message },
    }
}

/// Registers every device that supports XID events on one set. A failed registration frees the
/// set (NVML's rule), so the set is rebuilt with the devices registered before.
fn register_xid_devices<'n>(
    nvml: &'n Nvml,
    indices: &[u32],
    queue: &Mutex<Vec<Event>>,
) -> Option<EventSet<'n>> {
    let mut registered: Vec<u32> = Vec::new();
    let mut set = nvml.create_event_set().ok()?;
    for &index in indices {
        let unsupported = |why: String| {
            notice(
                Some(index),
                format!(
                    "XID events are not available for GPU {index} ({why}); XIDs will only show in the kernel log"
                ),
            )
        };
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                lock(queue).push(unsupported(e.to_string()));
                continue;
            }
        };
        match dev.supported_event_types() {
            Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
            Ok(_) => {
                lock(queue).push(unsupported("not supported by this GPU or driver".into()));
                continue;
            }
            Err(e) => {
                lock(queue).push(unsupported(e.to_string()));
                continue;
            }
        }
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered.push(index);
            }
            Err(e) => {
                lock(queue).push(unsupported(e.error.to_string()));
                set = nvml.create_event_set().ok()?;
                for &again in &registered {
                    let dev = nvml.device_by_index(again).ok()?;
                    set = dev
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .ok()?;
                }
            }
        }
    }
    (!registered.is_empty()).then_some(set)
}

fn event_loop(
    nvml: &Nvml,
    indices: &[u32],
    queue: &Mutex<Vec<Event>>,
    shared: &SlowShared,
    beat: &Heartbeat,
) {
    let Some(set) = register_xid_devices(nvml, indices, queue) else {
        return;
    };
    let mut failed_before = false;
    let started = Instant::now();
    while !shared.stopped() {
        let waited = {
            let _timed = stats::GroupTimer::start(CallGroup::XidWait);
            set.wait(wait_slice_ms(started.elapsed()))
        };
        stats::add(Counter::EventWaits, 1);
        beat.beat();
        match waited {
            Ok(data) => {
                let Some(XidError::Value(xid)) = data.event_data else {
                    continue;
                };
                let device = data.device.index().ok();
                lock(queue).push(Event {
                    time_ms: now_ms(),
                    device,
                    kind: EventKind::Xid { xid },
                });
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                // A lost GPU or a driver problem: the fast path reports it per device; back
                // off so a persistent failure does not spin.
                if !failed_before {
                    failed_before = true;
                    lock(queue).push(notice(
                        None,
                        format!("XID event wait failed: {e}; retrying"),
                    ));
                }
                std::thread::sleep(FAILED_WAIT_PAUSE);
                beat.beat();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_event_thread_is_stuck_and_a_stopped_one_is_not() {
        let beat = Heartbeat::default();
        let limit = EVENT_STUCK_AFTER;
        let later = Instant::now() + limit + Duration::from_secs(2);
        assert_eq!(beat.stuck_for(later, limit), None, "never started");
        beat.beat();
        assert_eq!(beat.stuck_for(Instant::now(), limit), None);
        let stuck = beat.stuck_for(later, limit).unwrap();
        assert!(stuck > limit, "{stuck:?}");
        beat.stopped();
        assert_eq!(beat.stuck_for(later, limit), None, "ended on purpose");
        assert!(FAILED_WAIT_PAUSE + Duration::from_millis(u64::from(EVENT_WAIT_LONG_MS)) < limit);
    }

    #[test]
    fn waits_are_short_at_first_then_long() {
        assert_eq!(wait_slice_ms(Duration::ZERO), EVENT_WAIT_MS);
        assert_eq!(wait_slice_ms(Duration::from_secs(2)), EVENT_WAIT_MS);
        assert_eq!(wait_slice_ms(SHORT_WAITS_FOR), EVENT_WAIT_LONG_MS);
        assert_eq!(wait_slice_ms(Duration::from_secs(3600)), EVENT_WAIT_LONG_MS);
        // The backend's drop waits up to a second for its threads: a long slice still fits.
        const { assert!(EVENT_WAIT_LONG_MS < 1000) };
    }

    #[test]
    fn being_stuck_is_reported_once_and_the_return_once() {
        let mut reported = false;
        assert_eq!(stuck_notice(None, &mut reported), None);
        let first = stuck_notice(Some(Duration::from_secs(12)), &mut reported).unwrap();
        assert!(
            first.contains("12 s") && first.contains("kernel log"),
            "{first}"
        );
        for s in 13..20 {
            assert_eq!(
                stuck_notice(Some(Duration::from_secs(s)), &mut reported),
                None
            );
        }
        let back = stuck_notice(None, &mut reported).unwrap();
        assert!(back.contains("returned"), "{back}");
        assert_eq!(stuck_notice(None, &mut reported), None);
    }
}
