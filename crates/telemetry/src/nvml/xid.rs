//! XID errors, from an NVML event set on a thread of their own: NVML hands events only to a
//! waiter, and a wait blocks, so the thread waits in short slices (to notice a stop) and queues
//! what it sees for the next poll. A GPU that cannot deliver XIDs is reported once, as a notice,
//! so its XIDs are not silently missed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;

use super::lock;
use super::slow::SlowShared;
use crate::{DeviceInfo, Event, EventKind, now_ms};

/// How long one wait on the event set may block; bounds how late the thread notices a stop.
const EVENT_WAIT_MS: u32 = 100;

/// Starts the thread that waits on an NVML event set for XID errors of every device and queues
/// them as `Event`s for the next poll. Devices that cannot deliver XID events are reported once,
/// as a notice, instead of silently missing them.
pub(super) fn start_event_thread(
    nvml: &Arc<Nvml>,
    devices: &[DeviceInfo],
    queue: &Arc<Mutex<Vec<Event>>>,
    shared: &Arc<SlowShared>,
) {
    let (nvml, thread_queue, shared) = (Arc::clone(nvml), Arc::clone(queue), Arc::clone(shared));
    let indices: Vec<u32> = devices.iter().map(|d| d.index).collect();
    let spawned = std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || event_loop(&nvml, &indices, &thread_queue, &shared));
    if let Err(e) = spawned {
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

fn event_loop(nvml: &Nvml, indices: &[u32], queue: &Mutex<Vec<Event>>, shared: &SlowShared) {
    let Some(set) = register_xid_devices(nvml, indices, queue) else {
        return;
    };
    let mut failed_before = false;
    while !shared.stopped() {
        match set.wait(EVENT_WAIT_MS) {
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
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    }
}
