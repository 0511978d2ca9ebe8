//! Plausibility at ingestion, and the reasons that mark a device's telemetry as unhealthy.
//!
//! A sick driver returns garbage before it returns errors: NaN, negative power, a temperature of
//! 10⁹ °C, a counter that runs backwards. Such a value must never reach history, rules, exports or
//! a recording as a number, so the threads that take ticks from a backend (the sampler and the
//! UI's feed) pass every tick through one `Sanitiser` first: an implausible value becomes `None`
//! with an absent reason that quotes it ("implausible value 1e9 °C from the driver").
//!
//! The health reasons travel as `Absent::Error` messages with fixed prefixes rather than new
//! `Absent` variants, so recordings and check reports keep their schema and older readers still
//! read them; `classify` is the one place that recognises them again (rules, the UI's markers).

use std::collections::BTreeMap;

use super::Tick;
use gpudiag_model::metric_table::{Kind, Repr};
use gpudiag_model::sample::MetricDef;
use gpudiag_model::sample::{Absent, LIST_FIELDS, METRIC_TABLE, Sample};

/// Prefix of the reason for a value dropped as implausible.
pub const IMPLAUSIBLE: &str = "implausible value";
/// Prefix of the reason for fields a poll could not read before its deadline.
pub const STALLED: &str = "driver call did not return within";
/// Prefix of the reason for slow fields whose background reader has not finished a round for
/// several slow intervals (an NVML call that does not return there).
pub const SLOW_STUCK: &str = "slow read stuck for";
/// The reason for every field of a device the backend listed at start but not in this poll.
pub const MISSING: &str = "GPU missing from the driver's device list";

/// What an absent reason says about the device's telemetry, beyond "this field is absent".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// The driver returned a value outside the physical range, or a counter went backwards.
    Implausible,
    /// The poll exceeded its deadline: the driver call hung.
    Stalled,
    /// The device was not in the poll at all.
    Missing,
    /// The GPU is lost (fell off the bus).
    Lost,
}

/// Recognises the health reasons (and `GpuLost`) among absent reasons.
pub fn classify(why: &Absent) -> Option<Health> {
    match why {
        Absent::GpuLost => Some(Health::Lost),
        Absent::Error(m) if m.starts_with(IMPLAUSIBLE) => Some(Health::Implausible),
        Absent::Error(m) if m.starts_with(STALLED) || m.starts_with(SLOW_STUCK) => {
            Some(Health::Stalled)
        }
        Absent::Error(m) if m.starts_with(MISSING) => Some(Health::Missing),
        _ => None,
    }
}

/// The worst health state a sample's absent reasons show (lost > missing > stalled >
/// implausible), for a one-word marker.
pub fn worst(s: &Sample) -> Option<Health> {
    s.absent.values().filter_map(classify).max()
}

/// The fields of `s` dropped as implausible, with their reasons.
pub fn implausible_fields(s: &Sample) -> impl Iterator<Item = (&str, &str)> {
    s.absent.iter().filter_map(|(k, v)| match v {
        Absent::Error(m) if m.starts_with(IMPLAUSIBLE) => Some((k.as_str(), m.as_str())),
        _ => None,
    })
}

/// The reason for a stalled poll.
pub fn stalled_reason(deadline: std::time::Duration) -> Absent {
    Absent::Error(format!("{STALLED} {} ms", deadline.as_millis()))
}

/// The reason for slow fields whose reader has been stuck this long.
pub fn slow_stuck_reason(stuck: std::time::Duration) -> Absent {
    Absent::Error(format!("{SLOW_STUCK} {} s", stuck.as_secs()))
}

/// Every field a per-tick sample carries, for marking a whole device absent.
pub const SAMPLE_FIELDS: [&str; METRIC_TABLE.len() + LIST_FIELDS.len()] = {
    let mut fields = [""; METRIC_TABLE.len() + LIST_FIELDS.len()];
    let mut i = 0;
    while i < METRIC_TABLE.len() {
        fields[i] = METRIC_TABLE[i].name;
        i += 1;
    }
    while i < fields.len() {
        fields[i] = LIST_FIELDS[i - METRIC_TABLE.len()];
        i += 1;
    }
    fields
};

/// A sample of `device` at `time_ms` with every field absent for `why`.
pub fn all_absent(device: u32, time_ms: gpudiag_model::sample::TimeMs, why: &Absent) -> Sample {
    let mut s = Sample::new(device, time_ms);
    for f in SAMPLE_FIELDS {
        s.absent.insert(f.to_owned(), why.clone());
    }
    s
}

/// Checks every tick for implausible values. Keeps the last value seen of each counter per
/// device, so a counter that goes backwards is caught; the comparison is with the last value
/// seen, not the last accepted, so a real reset (driver reload) costs one tick, not the rest of
/// the session.
#[derive(Debug, Default)]
pub struct Sanitiser {
    counters: BTreeMap<(u32, &'static str), f64>,
}

impl Sanitiser {
    pub fn new() -> Self {
        Sanitiser::default()
    }

    /// Forgets the counters (a replay seeking backwards starts them afresh).
    pub fn reset(&mut self) {
        self.counters.clear();
    }

    /// Drops implausible values from every sample of `tick`; returns how many were dropped.
    pub fn apply(&mut self, tick: &mut Tick) -> usize {
        tick.samples.iter_mut().map(|s| self.sample(s)).sum()
    }

    /// Drops implausible values from one sample; returns how many were dropped. The table says
    /// what is plausible for each field and which fields are counters.
    pub fn sample(&mut self, s: &mut Sample) -> usize {
        let mut dropped = 0;
        for m in METRIC_TABLE {
            let Some(x) = m.get(s) else {
                continue;
            };
            let why = match m.plausible {
                Some(range) if !range.admits(x) => Some(implausible(&quote(m, x), m.unit.symbol())),
                _ if m.kind == Kind::Counter => self.went_backwards(s.device, m, x),
                _ => None,
            };
            if let Some(why) = why {
                // Clearing a field cannot fail: only storing a number can.
                let _ = m.set(s, None);
                s.absent.insert(m.name.into(), why);
                dropped += 1;
            }
        }
        dropped
    }

    /// A counter below the last value seen of it: the reason to drop it. The value becomes the
    /// new base either way.
    fn went_backwards(&mut self, device: u32, m: &'static MetricDef, x: f64) -> Option<Absent> {
        let last = self.counters.insert((device, m.name), x)?;
        (x < last).then(|| backwards(&quote(m, x), &fmt(last), m.unit.symbol()))
    }
}

fn backwards(now: &str, before: &str, unit: &str) -> Absent {
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    Absent::Error(format!(
        "{IMPLAUSIBLE} {now}{unit} from the driver: the counter went backwards from {before}{unit}"
    ))
}

/// A value as the driver gave it: integers whole, floats short (`fmt`).
fn quote(m: &MetricDef, x: f64) -> String {
    match m.repr {
        Repr::F64 => fmt(x),
        Repr::U64 | Repr::U32 | Repr::Bool => format!("{}", x as u64),
    }
}

fn implausible(value: &str, unit: &str) -> Absent {
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    Absent::Error(format!("{IMPLAUSIBLE} {value}{unit} from the driver"))
}

/// Short and exact enough to recognise: 1e9 rather than 1000000000.
fn fmt(x: f64) -> String {
    if x.is_finite() && x != 0.0 && (x.abs() >= 1e6 || x.abs() < 1e-3) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(s: Sample) -> Tick {
        Tick {
            samples: vec![s],
            events: vec![],
            ras: Vec::new(),
            kernels: None,
        }
    }

    #[test]
    fn absurd_values_become_absent_with_a_reason_that_quotes_them() {
        let mut s = Sample::new(0, 1);
        s.temp_gpu_c = Some(1e9);
        s.power_w = Some(-50.0);
        s.gpu_util_pct = Some(f64::NAN);
        s.mem_util_pct = Some(140.0);
        s.fan_pct = Some(40.0);
        let mut t = tick(s);
        assert_eq!(Sanitiser::new().apply(&mut t), 4);
        let s = &t.samples[0];
        assert_eq!(s.temp_gpu_c, None);
        assert_eq!(s.power_w, None);
        assert_eq!(s.gpu_util_pct, None);
        assert_eq!(s.mem_util_pct, None);
        assert_eq!(s.fan_pct, Some(40.0));
        assert_eq!(
            s.absent["temp_gpu_c"],
            Absent::Error("implausible value 1e9 °C from the driver".into())
        );
        assert_eq!(
            s.absent["power_w"],
            Absent::Error("implausible value -50 W from the driver".into())
        );
        assert_eq!(
            s.absent["gpu_util_pct"],
            Absent::Error("implausible value NaN % from the driver".into())
        );
        assert_eq!(implausible_fields(s).count(), 4);
        assert_eq!(worst(s), Some(Health::Implausible));
    }

    #[test]
    fn plausible_values_pass_untouched() {
        let mut s = Sample::new(0, 1);
        s.temp_gpu_c = Some(-5.0);
        s.power_w = Some(0.0);
        s.gpu_util_pct = Some(100.0);
        s.energy_j = Some(10.0);
        s.pcie_replay_count = Some(0);
        let before = s.clone();
        let mut t = tick(s);
        assert_eq!(Sanitiser::new().apply(&mut t), 0);
        assert_eq!(t.samples[0], before);
    }

    #[test]
    fn a_counter_going_backwards_is_dropped_once_and_rebased() {
        let mut san = Sanitiser::new();
        let mut at = |replays: u64, energy: f64| {
            let mut s = Sample::new(3, 1);
            s.pcie_replay_count = Some(replays);
            s.energy_j = Some(energy);
            let mut t = tick(s);
            san.apply(&mut t);
            t.samples.remove(0)
        };
        assert_eq!(at(100, 500.0).pcie_replay_count, Some(100));
        let back = at(5, 400.0);
        assert_eq!(back.pcie_replay_count, None);
        assert_eq!(back.energy_j, None);
        match &back.absent["pcie_replay_count"] {
            Absent::Error(m) => assert!(m.contains("went backwards from 100"), "{m}"),
            other => panic!("{other:?}"),
        }
        // After a reset the counter counts on from its new base.
        let next = at(6, 401.0);
        assert_eq!(next.pcie_replay_count, Some(6));
        assert_eq!(next.energy_j, Some(401.0));
    }

    #[test]
    fn counters_are_kept_per_device() {
        let mut san = Sanitiser::new();
        let mut a = Sample::new(0, 1);
        a.pcie_replay_count = Some(100);
        let mut b = Sample::new(1, 1);
        b.pcie_replay_count = Some(5);
        let mut t = Tick {
            samples: vec![a, b],
            events: vec![],
            ras: Vec::new(),
            kernels: None,
        };
        assert_eq!(san.apply(&mut t), 0);
    }

    #[test]
    fn classify_knows_each_reason() {
        assert_eq!(classify(&Absent::GpuLost), Some(Health::Lost));
        assert_eq!(
            classify(&stalled_reason(std::time::Duration::from_millis(250))),
            Some(Health::Stalled)
        );
        assert_eq!(
            classify(&Absent::Error(MISSING.into())),
            Some(Health::Missing)
        );
        assert_eq!(classify(&Absent::NotSupported), None);
        assert_eq!(classify(&Absent::Error("Unknown Error".into())), None);
        let s = all_absent(2, 7, &Absent::GpuLost);
        assert_eq!(s.absent.len(), SAMPLE_FIELDS.len());
        assert_eq!(worst(&s), Some(Health::Lost));
    }
}
