//! Fault injection (test support): a backend that wraps any other and, on a schedule, makes it
//! misbehave the way sick drivers do, so the whole pipeline can be tested without a GPU.
//!
//! It is compiled into the library so integration tests and end-to-end CLI tests can use it.
//! The binary applies it when the hidden variable `GPUDIAG_TEST_FAULTS` holds a schedule; it
//! wraps whatever source the flags opened (normally `--demo` or `--replay FILE`), and the
//! wrapped source gets the per-poll deadline of live backends (`poll_deadline`).
//!
//! # Schedule
//!
//! Faults are separated by `;`. Each is `WHAT@WHEN` or `WHAT@WHEN#DEVICE` (without `#DEVICE` it
//! hits every device):
//!
//! | WHAT | does |
//! |---|---|
//! | `unsupported:FIELD` | the field is absent with reason `not_supported` |
//! | `value:FIELD=NUMBER` | the field reads NUMBER (`NaN`, `inf`, `-50`, `1e9`; whole numbers for counters) |
//! | `lost` | at the first tick: an XID 79 event and a `device_lost` event; from then on every field is absent with reason `gpu_lost` (the end of WHEN is ignored: lost stays lost) |
//! | `hang:DURATION` | the poll blocks for DURATION (`800ms`, `5s`) before answering |
//! | `gone` | the device is left out of the poll (it left the driver's device list), with a notice event; it returns after WHEN |
//!
//! WHEN counts polls of this backend from 0: `N` (that poll), `N..M` (N up to but not including
//! M), `N..` (from N on). With a unit it is wall time since the first poll: `2s`, `500ms..3s`,
//! `1s..`. FIELD is a `Sample` field name as in recordings (`temp_gpu_c`, `power_w`,
//! `energy_j`, `pcie_replay_count`, ...).
//!
//! Example: `value:temp_gpu_c=1e9@3;hang:5s@6;lost@10#0` reads 10⁹ °C at poll 3, hangs poll 6
//! for five seconds, and loses GPU 0 at poll 10.
//!
//! Over a replay, `--poll-timeout` counts the replay's own wait too: `serve` plays at the
//! recorded pace, so there the timeout must exceed the recorded spacing. A hang that never ends
//! over a replay stalls it for good (a stalled tick per timeout), so a `check --replay` under
//! one runs until stopped; a live check ends with its window as usual.

use std::time::{Duration, Instant};

use super::sanity;
use super::{Backend, BackendError, Pacing, Playback, Tick};
use gpudiag_model::metric_table::{Repr, Unrepresentable};
use gpudiag_model::sample::{Absent, DeviceInfo, Event, EventKind, HostInfo, Sample};

/// The hidden environment variable that holds a fault schedule.
pub const FAULTS_ENV: &str = "GPUDIAG_TEST_FAULTS";

/// What a fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum What {
    Unsupported(String),
    Value(String, f64),
    Lost,
    Hang(Duration),
    Gone,
}

/// When a fault applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum When {
    /// Polls `start..end` (end exclusive; `None` for open-ended).
    Ticks { start: u64, end: Option<u64> },
    /// Wall time since the first poll, `start..end`.
    Time {
        start: Duration,
        end: Option<Duration>,
    },
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub what: What,
    pub when: When,
    /// `None`: every device.
    pub device: Option<u32>,
}

/// Parses a schedule (see the module documentation).
pub fn parse(spec: &str) -> Result<Vec<Fault>, String> {
    spec.split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(parse_one)
        .collect()
}

fn parse_one(s: &str) -> Result<Fault, String> {
    let bad = |why: &str| format!("fault '{s}': {why}");
    let (what, rest) = s
        .split_once('@')
        .ok_or_else(|| bad("needs @WHEN (a poll number or a time)"))?;
    let (when, device) = match rest.split_once('#') {
        Some((w, d)) => (
            w,
            Some(
                d.trim()
                    .parse::<u32>()
                    .map_err(|_| bad("#DEVICE must be a device index"))?,
            ),
        ),
        None => (rest, None),
    };
    let what = what.trim();
    let what = match what.split_once(':') {
        None if what == "lost" => What::Lost,
        None if what == "gone" => What::Gone,
        Some(("unsupported", field)) => {
            let field = field.trim();
            set_field(&mut Sample::default(), field, None).map_err(|e| bad(&e))?;
            What::Unsupported(field.to_owned())
        }
        Some(("value", kv)) => {
            let (field, v) = kv
                .split_once('=')
                .ok_or_else(|| bad("value needs FIELD=NUMBER"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad(&format!("'{}' is not a number", v.trim())))?;
            set_field(&mut Sample::default(), field.trim(), Some(v)).map_err(|e| bad(&e))?;
            What::Value(field.trim().to_owned(), v)
        }
        Some(("hang", d)) => {
            What::Hang(gpudiag_model::units::parse_duration(d).map_err(|e| bad(&e))?)
        }
        _ => {
            return Err(bad(
                "WHAT must be unsupported:FIELD, value:FIELD=NUMBER, lost, hang:DURATION or gone",
            ));
        }
    };
    Ok(Fault {
        what,
        when: parse_when(when.trim()).map_err(|e| bad(&e))?,
        device,
    })
}

fn parse_when(s: &str) -> Result<When, String> {
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (a.trim(), Some(b.trim()).filter(|b| !b.is_empty())),
        None => (s, None),
    };
    let timed = a.chars().last().is_some_and(|c| c.is_ascii_alphabetic());
    if timed {
        let d = |x: &str| {
            humantime::parse_duration(x)
                .map_err(|e| format!("'{x}' is not a poll number or a time like 2s ({e})"))
        };
        return Ok(When::Time {
            start: d(a)?,
            end: b.map(d).transpose()?,
        });
    }
    let n = |x: &str| {
        x.parse::<u64>()
            .map_err(|_| format!("'{x}' is not a poll number or a time like 2s"))
    };
    let start = n(a)?;
    let end = match (s.contains(".."), b) {
        (false, _) => Some(start + 1),
        (true, None) => None,
        (true, Some(b)) => Some(n(b)?),
    };
    Ok(When::Ticks { start, end })
}

/// Sets one numeric sample field by name, converting to the field's type; `None` clears it.
/// Flags are not numbers here: a schedule makes them absent, or leaves them be.
fn set_field(s: &mut Sample, field: &str, v: Option<f64>) -> Result<(), String> {
    let m = gpudiag_model::sample::by_name(field)
        .filter(|m| m.repr != Repr::Bool)
        .ok_or_else(|| format!("no numeric sample field named '{field}'"))?;
    m.set(s, v).map_err(|e| match e {
        Unrepresentable::TooLarge => format!("{field} is too large"),
        Unrepresentable::NotWhole | Unrepresentable::NotAFlag => {
            format!("{field} is a counter: give a whole number >= 0")
        }
    })
}

/// Wraps a backend and applies a fault schedule to its polls.
pub struct FaultBackend {
    inner: Box<dyn Backend>,
    faults: Vec<Fault>,
    polls: u64,
    started: Option<Instant>,
    /// Devices already lost (their events were sent).
    lost: Vec<u32>,
}

impl FaultBackend {
    pub fn new(inner: Box<dyn Backend>, faults: Vec<Fault>) -> Self {
        FaultBackend {
            inner,
            faults,
            polls: 0,
            started: None,
            lost: Vec::new(),
        }
    }

    /// Whether any fault makes a poll block (the caller should guard it with a deadline).
    pub fn hangs(&self) -> bool {
        self.faults.iter().any(|f| matches!(f.what, What::Hang(_)))
    }

    fn active(&self, when: When, poll: u64, elapsed: Duration) -> bool {
        match when {
            When::Ticks { start, end } => poll >= start && end.is_none_or(|e| poll < e),
            When::Time { start, end } => elapsed >= start && end.is_none_or(|e| elapsed < e),
        }
    }
}

/// Wraps `inner` in the schedule held by `GPUDIAG_TEST_FAULTS`, when it is set and not empty.
pub fn from_env(inner: Box<dyn Backend>) -> Result<Box<dyn Backend>, String> {
    match std::env::var(FAULTS_ENV) {
        Ok(spec) if !spec.trim().is_empty() => {
            let faults = parse(&spec).map_err(|e| format!("{FAULTS_ENV}: {e}"))?;
            Ok(Box::new(FaultBackend::new(inner, faults)))
        }
        _ => Ok(inner),
    }
}

/// Whether `GPUDIAG_TEST_FAULTS` holds a schedule.
pub fn env_active() -> bool {
    std::env::var(FAULTS_ENV).is_ok_and(|s| !s.trim().is_empty())
}

impl Backend for FaultBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn host(&self) -> &HostInfo {
        self.inner.host()
    }

    fn devices(&self) -> &[DeviceInfo] {
        self.inner.devices()
    }

    fn pacing(&self) -> Pacing {
        self.inner.pacing()
    }

    fn poll(&mut self) -> Result<Tick, BackendError> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let elapsed = started.elapsed();
        let mut tick = self.inner.poll()?;
        // A replay's wait cut short by a control stands for no poll: counting it would shift the
        // schedule, and a fault added to it would make it look like a tick.
        if self.inner.pacing() == Pacing::SelfPaced && tick == Tick::default() {
            return Ok(tick);
        }
        let poll = self.polls;
        self.polls += 1;
        let time_ms = tick
            .samples
            .iter()
            .map(|s| s.time_ms)
            .max()
            .unwrap_or_else(gpudiag_model::sample::now_ms);
        let active: Vec<Fault> = self
            .faults
            .iter()
            .filter(|f| f.what == What::Lost || self.active(f.when, poll, elapsed))
            .cloned()
            .collect();
        let mut hang = Duration::ZERO;
        for f in &active {
            let hits = |d: u32| f.device.is_none_or(|x| x == d);
            match &f.what {
                What::Unsupported(field) => {
                    for s in tick.samples.iter_mut().filter(|s| hits(s.device)) {
                        let _ = set_field(s, field, None);
                        s.absent.insert(field.clone(), Absent::NotSupported);
                    }
                }
                What::Value(field, v) => {
                    for s in tick.samples.iter_mut().filter(|s| hits(s.device)) {
                        if set_field(s, field, Some(*v)).is_ok() {
                            s.absent.remove(field);
                        }
                    }
                }
                What::Lost => {
                    // Lost from the first poll its schedule reaches, for good.
                    let starts = self.active(f.when, poll, elapsed);
                    for d in self.inner.devices().iter().map(|d| d.index) {
                        if hits(d) && starts && !self.lost.contains(&d) {
                            self.lost.push(d);
                            tick.events.push(Event {
                                time_ms,
                                device: Some(d),
                                kind: EventKind::Xid { xid: 79 },
                            });
                            tick.events.push(Event {
                                time_ms,
                                device: Some(d),
                                kind: EventKind::DeviceLost {
                                    reason: format!("GPU {d} has fallen off the bus (injected)"),
                                },
                            });
                        }
                    }
                }
                What::Hang(d) => hang = hang.max(*d),
                What::Gone => {
                    let before = tick.samples.len();
                    tick.samples.retain(|s| !hits(s.device));
                    // Said in an event too, so a tick left empty still stands for a poll.
                    if tick.samples.len() < before {
                        tick.events.push(Event {
                            time_ms,
                            device: f.device,
                            kind: EventKind::Notice {
                                message: "a GPU left the driver's device list (injected)".into(),
                            },
                        });
                    }
                }
            }
        }
        for s in &mut tick.samples {
            if self.lost.contains(&s.device) {
                *s = sanity::all_absent(s.device, s.time_ms, &Absent::GpuLost);
            }
        }
        if !hang.is_zero() {
            std::thread::sleep(hang);
        }
        Ok(tick)
    }

    fn playback(&mut self) -> Option<&mut dyn Playback> {
        self.inner.playback()
    }

    fn request_ras(&mut self, query: crate::ras::RasQuery) {
        self.inner.request_ras(query);
    }

    fn source_warnings(&self) -> Vec<String> {
        self.inner.source_warnings()
    }

    fn recorded_findings(&self) -> Vec<gpudiag_model::finding::Finding> {
        self.inner.recorded_findings()
    }

    fn wait_for_slow_fields(&self, timeout: Duration) {
        self.inner.wait_for_slow_fields(timeout);
    }

    fn set_slow_interval(&mut self, interval: Duration) {
        self.inner.set_slow_interval(interval);
    }

    fn topology(&self) -> Option<gpudiag_model::topology::Topology> {
        self.inner.topology()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse() {
        let f = parse(
            "value:temp_gpu_c=1e9@3; hang:5s@6..8 ;lost@10#0;gone@2s..;unsupported:fan_pct@0..",
        )
        .unwrap();
        assert_eq!(f.len(), 5);
        assert_eq!(f[0].what, What::Value("temp_gpu_c".into(), 1e9));
        assert_eq!(
            f[0].when,
            When::Ticks {
                start: 3,
                end: Some(4)
            }
        );
        assert_eq!(f[1].what, What::Hang(Duration::from_secs(5)));
        assert_eq!(
            f[1].when,
            When::Ticks {
                start: 6,
                end: Some(8)
            }
        );
        assert_eq!(f[2].device, Some(0));
        assert_eq!(
            f[3].when,
            When::Time {
                start: Duration::from_secs(2),
                end: None
            }
        );
        assert_eq!(
            f[4].when,
            When::Ticks {
                start: 0,
                end: None
            }
        );
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (spec, says) in [
            ("lost", "needs @WHEN"),
            ("value:nope=1@1", "no numeric sample field named 'nope'"),
            ("value:pcie_replay_count=-1@1", "whole number"),
            ("value:power_w=abc@1", "not a number"),
            ("explode@1", "WHAT must be"),
            ("lost@x", "not a poll number"),
            ("lost@1#gpu", "device index"),
        ] {
            let e = parse(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
        assert_eq!(parse("").unwrap(), vec![]);
    }
}
