//! The conditions a probe runs under: how much memory it may take, whether another process is
//! using the GPU (a busy GPU would disturb the probe and be disturbed by it), and the readings
//! that explain a result (ECC counters before and after, clocks, power and temperature during a
//! run), all asked of the caller's `GpuState` (the telemetry layer's NVML reader): probes never
//! open the driver's management library themselves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use gpudiag_model::gpu_state::{GpuState, GpuUser, StateError};
use serde_json::{Value, json};

/// Bytes a probe may allocate: `share` of free memory, capped at `cap`, rounded down to 2 MiB
/// (the allocation granularity), and never more than free memory minus a 256 MiB reserve for
/// the context and cuBLAS workspaces.
pub fn memory_budget(free: u64, share: f64, cap: u64) -> u64 {
    const MIB2: u64 = 2 << 20;
    const RESERVE: u64 = 256 << 20;
    if share.is_nan() || share <= 0.0 {
        return 0;
    }
    let by_share = (free as f64 * share.min(1.0)) as u64;
    let budget = by_share.min(cap).min(free.saturating_sub(RESERVE));
    budget / MIB2 * MIB2
}

/// Why probes would not run on GPU `index` without `--force`: other processes use it, or
/// whether they do could not be seen. `None` when the GPU is free; the PIDs seen either way.
pub fn refusal(state: &dyn GpuState, index: u32) -> (Option<String>, Vec<u32>) {
    match state.other_processes(index) {
        Ok(others) => (
            busy_refusal(index, &others),
            others.iter().map(|u| u.pid).collect(),
        ),
        Err(StateError::NoDriver(why)) => (
            Some(format!("{why}, so other users of the GPU cannot be seen")),
            Vec::new(),
        ),
        Err(StateError::Failed(e)) => (
            Some(format!("could not list the GPU's processes ({e})")),
            Vec::new(),
        ),
    }
}

/// The refusal message for a busy GPU, or `None` when nobody else is on it. It says why; the
/// caller says how to override it (`--force`, or a key in the terminal UI).
pub fn busy_refusal(index: u32, others: &[GpuUser]) -> Option<String> {
    if others.is_empty() {
        return None;
    }
    let list: Vec<String> = others
        .iter()
        .map(|u| match u.used_bytes {
            Some(b) => format!("pid {} ({} MiB)", u.pid, b >> 20),
            None => format!("pid {}", u.pid),
        })
        .collect();
    Some(format!(
        "GPU {index} is in use by {}; probes would disturb it and be disturbed",
        list.join(", ")
    ))
}

/// Volatile ECC counters (corrected, uncorrected), each `null` where the GPU has no ECC or it is
/// off; `null` as a whole where the GPU could not be read.
pub fn ecc_counters(state: &dyn GpuState, index: u32) -> Value {
    match state.ecc_counts(index) {
        Ok(c) => json!({
            "corrected_volatile": c.corrected_volatile,
            "uncorrected_volatile": c.uncorrected_volatile,
        }),
        Err(_) => Value::Null,
    }
}

/// Samples SM clock, power, temperature and throttle reasons every 100 ms until stopped, so a
/// slow matmul shows whether the GPU was throttling.
pub struct RunTelemetry {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<[Option<f64>; 4]>>>,
}

impl RunTelemetry {
    pub fn start(state: Arc<dyn GpuState>, index: u32) -> RunTelemetry {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("probe-telemetry".into())
            .spawn(move || {
                let mut rows = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    // A GPU that cannot be read at all (no driver) gives no rows, not rows of
                    // nothing.
                    let Ok(r) = state.reading(index) else {
                        break;
                    };
                    rows.push([
                        r.sm_clock_mhz,
                        r.power_w,
                        r.temperature_c,
                        r.throttle_reasons.map(|bits| bits as f64),
                    ]);
                    std::thread::sleep(Duration::from_millis(100));
                }
                rows
            })
            .ok();
        RunTelemetry { stop, thread }
    }

    /// Stops sampling and summarises: min/mean/max per field and the union of throttle bits.
    pub fn finish(mut self) -> Value {
        self.stop.store(true, Ordering::Relaxed);
        let rows = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        summarise_rows(&rows)
    }
}

impl Drop for RunTelemetry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn summarise_rows(rows: &[[Option<f64>; 4]]) -> Value {
    let stat = |i: usize| -> Value {
        let v: Vec<f64> = rows.iter().filter_map(|r| r[i]).collect();
        if v.is_empty() {
            return Value::Null;
        }
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        json!({"min": min, "mean": v.iter().sum::<f64>() / v.len() as f64, "max": max})
    };
    let throttle = rows
        .iter()
        .filter_map(|r| r[3])
        .fold(None, |acc: Option<u64>, b| {
            Some(acc.unwrap_or(0) | b as u64)
        });
    json!({
        "samples": rows.len(),
        "sm_clock_mhz": stat(0),
        "power_w": stat(1),
        "temperature_c": stat(2),
        "throttle_reasons_seen": throttle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::gpu_state::{EccCounts, ListedGpu, RunReading};

    #[test]
    fn budget_is_a_share_capped_and_rounded() {
        let gib = 1u64 << 30;
        assert_eq!(memory_budget(100 * gib, 0.01, u64::MAX), 1024 << 20);
        assert_eq!(memory_budget(100 * gib, 0.5, 2 * gib), 2 * gib);
        // The reserve wins on a nearly full GPU.
        assert_eq!(memory_budget(300 << 20, 0.9, u64::MAX), 44 << 20);
        assert_eq!(memory_budget(100 << 20, 0.9, u64::MAX), 0);
        assert_eq!(memory_budget(100 * gib, 0.0, u64::MAX), 0);
        assert_eq!(memory_budget(100 * gib, f64::NAN, u64::MAX), 0);
        assert_eq!(memory_budget(gib + 12345, 1.0, u64::MAX) % (2 << 20), 0);
    }

    #[test]
    fn a_busy_gpu_is_refused_with_the_processes_named() {
        assert_eq!(busy_refusal(0, &[]), None);
        let users = [
            GpuUser {
                pid: 42,
                used_bytes: Some(3 << 30),
            },
            GpuUser {
                pid: 43,
                used_bytes: None,
            },
        ];
        let msg = busy_refusal(1, &users).unwrap();
        assert!(msg.contains("pid 42 (3072 MiB)") && msg.contains("pid 43"));
    }

    /// A state that answers what it is built with, for the probe runner's decisions.
    struct Fake {
        users: Result<Vec<GpuUser>, StateError>,
    }

    impl GpuState for Fake {
        fn gpus(&self) -> Result<Vec<ListedGpu>, StateError> {
            Ok(Vec::new())
        }
        fn other_processes(&self, _: u32) -> Result<Vec<GpuUser>, StateError> {
            self.users.clone()
        }
        fn ecc_counts(&self, _: u32) -> Result<EccCounts, StateError> {
            Err(StateError::NoDriver("no driver here".into()))
        }
        fn reading(&self, _: u32) -> Result<RunReading, StateError> {
            Ok(RunReading {
                sm_clock_mhz: Some(1980.0),
                power_w: None,
                temperature_c: Some(40.0),
                throttle_reasons: Some(4),
            })
        }
        fn topology(&self, _: &[ListedGpu]) -> Option<gpudiag_model::topology::Topology> {
            None
        }
    }

    #[test]
    fn the_state_decides_refusals_and_fills_the_readings() {
        let busy = Fake {
            users: Ok(vec![GpuUser {
                pid: 7,
                used_bytes: None,
            }]),
        };
        let (why, pids) = refusal(&busy, 0);
        assert!(why.unwrap().contains("pid 7"));
        assert_eq!(pids, [7]);
        let free = Fake { users: Ok(vec![]) };
        assert_eq!(refusal(&free, 0), (None, vec![]));
        let blind = Fake {
            users: Err(StateError::NoDriver(
                "NVML is unavailable (no library)".into(),
            )),
        };
        let (why, pids) = refusal(&blind, 0);
        assert_eq!(
            why.as_deref(),
            Some("NVML is unavailable (no library), so other users of the GPU cannot be seen")
        );
        assert!(pids.is_empty());
        let failing = Fake {
            users: Err(StateError::Failed(
                "NVML process list: Unknown Error".into(),
            )),
        };
        assert_eq!(
            refusal(&failing, 0).0.as_deref(),
            Some("could not list the GPU's processes (NVML process list: Unknown Error)")
        );
        // No driver: the ECC counters are null, not zeros.
        assert_eq!(ecc_counters(&blind, 0), Value::Null);
        let state: Arc<dyn GpuState> = Arc::new(free);
        let tel = RunTelemetry::start(state, 0);
        std::thread::sleep(Duration::from_millis(50));
        let v = tel.finish();
        assert!(v["samples"].as_u64().unwrap() >= 1, "{v}");
        assert_eq!(v["sm_clock_mhz"]["max"], 1980.0);
        assert_eq!(v["power_w"], Value::Null);
        assert_eq!(v["throttle_reasons_seen"], 4);
    }

    #[test]
    fn telemetry_summary_keeps_absent_fields_null() {
        let rows = [
            [Some(1980.0), Some(650.0), None, Some(4.0)],
            [Some(1900.0), Some(700.0), None, Some(1.0)],
        ];
        let v = summarise_rows(&rows);
        assert_eq!(v["sm_clock_mhz"]["min"], 1900.0);
        assert_eq!(v["power_w"]["max"], 700.0);
        assert_eq!(v["temperature_c"], Value::Null);
        assert_eq!(v["throttle_reasons_seen"], 5);
        assert_eq!(summarise_rows(&[])["throttle_reasons_seen"], Value::Null);
    }
}
