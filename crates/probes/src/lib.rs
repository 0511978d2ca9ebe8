//! Probes: short GPU workloads (bandwidth, matmul, memory test, launch latency) that measure what
//! this GPU can do now, with only the NVIDIA driver required. Kernels ship as PTX inside the
//! binary (`kernels/`); cuBLASLt is used when present. Results carry parameters, metrics, a
//! verdict, the library or kernel that served each figure and timed spans for the trace.

pub mod bandwidth;
pub mod blas;
pub mod conditions;
pub mod gpu;
pub mod latency;
pub mod matmul;
pub mod memory;
pub mod nccl;
pub mod p2p;
pub mod placement;
pub mod ptx;
pub mod runner;
pub mod suite;
pub mod text;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use gpudiag_model::sample::{TimeMs, now_ms};

/// Environment variable for test-only fault injection (`matmul` corrupts the result before it is
/// verified, `memory` flips a bit after the write pass). Hidden: GPU tests use it to prove that
/// the checks catch what they claim to catch.
pub const TEST_FAULT_ENV: &str = "GPUDIAG_TEST_FAULT";

pub(crate) fn test_fault(which: &str) -> bool {
    std::env::var(TEST_FAULT_ENV).is_ok_and(|v| v.split(',').any(|p| p.trim() == which))
}

/// The probes gpudiag knows, in the order a suite runs them.
pub const PROBE_NAMES: [&str; 6] = ["latency", "bandwidth", "matmul", "memory", "p2p", "nccl"];

/// Probes that run over all selected GPUs at once, after the per-GPU ones.
pub const MULTI_GPU_PROBES: [&str; 2] = ["p2p", "nccl"];

/// What a probe concluded.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Ran and the results are sane (and at or above their floors where the model is known).
    Pass,
    /// Ran, but a figure is below its floor or a check is doubtful.
    Warn,
    /// A check failed: a wrong matmul result, memory mismatches, a leak.
    Fail,
    /// Did not run (a missing library, an unsupported type); `note` says why.
    Skipped,
    /// Could not run to the end: a CUDA error, the deadline, Ctrl-C.
    Error,
}

/// One figure a probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Measurement {
    /// Stable name within the probe, e.g. `h2d_pinned`, `bf16`, `round_trip`.
    pub name: String,
    /// Null when the figure is not a number (NaN or infinite).
    #[schemars(with = "Option<f64>")]
    pub value: f64,
    /// "GB/s" (1e9 bytes), "TFLOP/s", "us", "count", "bytes".
    pub unit: String,
    /// What served it: a library and version or an embedded kernel and its PTX target.
    pub served_by: String,
    /// Every sample behind `value` (the median of them for timings).
    #[schemars(with = "Vec<Option<f64>>")]
    pub samples: Vec<f64>,
    /// What this GPU model should reach, from the reference table; `None` for unknown models or
    /// figures without a reference.
    pub expected: Option<f64>,
    /// `value / expected`.
    pub ratio: Option<f64>,
}

impl Measurement {
    pub fn new(name: &str, value: f64, unit: &str, served_by: &str, samples: Vec<f64>) -> Self {
        Measurement {
            name: name.into(),
            value,
            unit: unit.into(),
            served_by: served_by.into(),
            samples,
            expected: None,
            ratio: None,
        }
    }

    pub fn with_expected(mut self, expected: Option<f64>) -> Self {
        self.expected = expected.filter(|e| *e > 0.0);
        self.ratio = self.expected.map(|e| self.value / e);
        self
    }
}

/// A timed phase of a probe, for the Chrome trace (complete events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Span {
    pub name: String,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub start_ms: TimeMs,
    pub duration_ms: f64,
}

/// Everything one probe produced on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ProbeResult {
    #[schemars(extend("enum" = PROBE_NAMES))]
    pub probe: String,
    /// NVML index of the device.
    pub device: u32,
    pub verdict: Verdict,
    /// Why the verdict is what it is, in one line; `None` for a plain pass.
    pub note: Option<String>,
    /// The inputs: sizes, repetitions, memory share, types.
    pub parameters: serde_json::Map<String, serde_json::Value>,
    pub metrics: Vec<Measurement>,
    /// Extra structured detail (mismatch addresses, ECC counters, telemetry during the run).
    pub details: serde_json::Map<String, serde_json::Value>,
    pub spans: Vec<Span>,
    pub started_ms: TimeMs,
    pub duration_ms: f64,
}

impl ProbeResult {
    pub fn new(probe: &str, device: u32) -> Self {
        ProbeResult {
            probe: probe.into(),
            device,
            verdict: Verdict::Pass,
            note: None,
            parameters: Default::default(),
            metrics: Vec::new(),
            details: Default::default(),
            spans: Vec::new(),
            started_ms: now_ms(),
            duration_ms: 0.0,
        }
    }

    /// Raises the verdict to `v` (Pass < Warn < Fail) and appends `note`.
    pub fn downgrade(&mut self, v: Verdict, note: impl Into<String>) {
        if v > self.verdict {
            self.verdict = v;
        }
        let note = note.into();
        self.note = Some(match self.note.take() {
            Some(old) => format!("{old}; {note}"),
            None => note,
        });
    }

    pub fn param(&mut self, key: &str, v: impl Into<serde_json::Value>) {
        self.parameters.insert(key.into(), v.into());
    }

    pub fn metric(&self, name: &str) -> Option<&Measurement> {
        self.metrics.iter().find(|m| m.name == name)
    }
}

/// Times one phase and records it as a span.
pub struct SpanTimer {
    name: String,
    start_ms: TimeMs,
    start: Instant,
}

impl SpanTimer {
    pub fn start(name: impl Into<String>) -> Self {
        SpanTimer {
            name: name.into(),
            start_ms: now_ms(),
            start: Instant::now(),
        }
    }

    pub fn finish(self, result: &mut ProbeResult) {
        result.spans.push(Span {
            name: self.name,
            start_ms: self.start_ms,
            duration_ms: self.start.elapsed().as_secs_f64() * 1e3,
        });
    }
}

/// Why a probe stopped early.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Cuda(String),
    #[error("stopped: the deadline passed")]
    Deadline,
    #[error("stopped: interrupted")]
    Interrupted,
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Refused(String),
}

/// Deadline and Ctrl-C, checked by probes between steps so they stop cleanly (GPU memory is
/// freed by the buffers' destructors on the way out).
#[derive(Clone)]
pub struct ProbeDeadline {
    pub deadline: Instant,
    pub stop: Arc<AtomicBool>,
}

impl ProbeDeadline {
    pub fn new(budget: Duration, stop: Arc<AtomicBool>) -> Self {
        ProbeDeadline {
            deadline: Instant::now() + budget,
            stop,
        }
    }

    pub fn check(&self) -> Result<(), ProbeError> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(ProbeError::Interrupted);
        }
        if Instant::now() >= self.deadline {
            return Err(ProbeError::Deadline);
        }
        Ok(())
    }
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty or when
/// a value is not finite.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Bytes moved in `ms` milliseconds as GB/s with GB = 1e9 (the nvbandwidth convention).
pub fn gb_per_s(bytes: f64, ms: f64) -> f64 {
    bytes / (ms * 1e-3) / 1e9
}

/// `2·m·n·k` floating-point operations in `ms` milliseconds, as TFLOP/s.
pub fn tflops(m: u64, n: u64, k: u64, ms: f64) -> f64 {
    2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_bad_input() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn units_follow_the_references() {
        // nvbandwidth: 16 copies of 1 GiB in 310 ms.
        let gbps = gb_per_s(16.0 * (1u64 << 30) as f64, 310.0);
        assert!((gbps - 55.42).abs() < 0.01, "{gbps}");
        // 8192^3 in 1.372 ms is about 801 TFLOP/s.
        let tf = tflops(8192, 8192, 8192, 1.372);
        assert!((tf - 801.4).abs() < 0.5, "{tf}");
    }

    #[test]
    fn control_stops_on_ctrl_c_and_at_the_deadline() {
        let stop = Arc::new(AtomicBool::new(false));
        let ctl = ProbeDeadline::new(Duration::from_secs(60), stop.clone());
        assert_eq!(ctl.check(), Ok(()));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(ctl.check(), Err(ProbeError::Interrupted));
        let late = ProbeDeadline::new(Duration::ZERO, Arc::new(AtomicBool::new(false)));
        assert_eq!(late.check(), Err(ProbeError::Deadline));
    }

    #[test]
    fn verdicts_only_get_worse_and_notes_accumulate() {
        let mut r = ProbeResult::new("x", 0);
        r.downgrade(Verdict::Warn, "slow");
        r.downgrade(Verdict::Pass, "fine");
        assert_eq!(r.verdict, Verdict::Warn);
        assert_eq!(r.note.as_deref(), Some("slow; fine"));
        let m = Measurement::new("a", 50.0, "GB/s", "k", vec![]).with_expected(Some(100.0));
        assert_eq!(m.ratio, Some(0.5));
        let m = Measurement::new("a", 50.0, "GB/s", "k", vec![]).with_expected(Some(0.0));
        assert_eq!((m.expected, m.ratio), (None, None));
    }
}
