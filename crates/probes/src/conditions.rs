//! The conditions a probe runs under: how much memory it may take, whether another process is
//! using the GPU (a busy GPU would disturb the probe and be disturbed by it), and the NVML
//! readings that explain a result (ECC counters before and after, clocks, power and temperature
//! during a run). NVML is only read here, never written.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
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

/// Processes other than this one that hold the GPU: (pid, used bytes if known).
pub fn other_processes(nvml: &Nvml, index: u32) -> Result<Vec<(u32, Option<u64>)>, String> {
    let dev = nvml
        .device_by_index(index)
        .map_err(|e| format!("NVML device {index}: {e}"))?;
    let me = std::process::id();
    let mut out = Vec::new();
    let compute = dev
        .running_compute_processes()
        .map_err(|e| format!("NVML process list: {e}"))?;
    let graphics = dev.running_graphics_processes().unwrap_or_default();
    for p in compute.into_iter().chain(graphics) {
        if p.pid == me || out.iter().any(|(pid, _)| *pid == p.pid) {
            continue;
        }
        let used = match p.used_gpu_memory {
            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
        };
        out.push((p.pid, used));
    }
    Ok(out)
}

/// The refusal message for a busy GPU, or `None` when nobody else is on it. It says why; the
/// caller says how to override it (`--force`, or a key in the terminal UI).
pub fn busy_refusal(index: u32, others: &[(u32, Option<u64>)]) -> Option<String> {
    if others.is_empty() {
        return None;
    }
    let list: Vec<String> = others
        .iter()
        .map(|(pid, used)| match used {
            Some(b) => format!("pid {pid} ({} MiB)", b >> 20),
            None => format!("pid {pid}"),
        })
        .collect();
    Some(format!(
        "GPU {index} is in use by {}; probes would disturb it and be disturbed",
        list.join(", ")
    ))
}

/// Volatile ECC counters (corrected, uncorrected); `None` where the GPU has no ECC or it is off.
pub fn ecc_counters(nvml: &Nvml, index: u32) -> Value {
    let Ok(dev) = nvml.device_by_index(index) else {
        return Value::Null;
    };
    let c = dev
        .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        .ok();
    let u = dev
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .ok();
    json!({"corrected_volatile": c, "uncorrected_volatile": u})
}

/// Samples SM clock, power, temperature and throttle reasons every 100 ms until stopped, so a
/// slow matmul shows whether the GPU was throttling.
pub struct RunTelemetry {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<[Option<f64>; 4]>>>,
}

impl RunTelemetry {
    pub fn start(nvml: Option<Arc<Nvml>>, index: u32) -> RunTelemetry {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = nvml.and_then(|nvml| {
            std::thread::Builder::new()
                .name("probe-telemetry".into())
                .spawn(move || {
                    let mut rows = Vec::new();
                    let Ok(dev) = nvml.device_by_index(index) else {
                        return rows;
                    };
                    while !flag.load(Ordering::Relaxed) {
                        rows.push([
                            dev.clock_info(Clock::SM).ok().map(f64::from),
                            dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                            dev.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
                            dev.current_throttle_reasons().ok().map(|r| r.bits() as f64),
                        ]);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    rows
                })
                .ok()
        });
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
        let msg = busy_refusal(1, &[(42, Some(3 << 30)), (43, None)]).unwrap();
        assert!(msg.contains("pid 42 (3072 MiB)") && msg.contains("pid 43"));
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
