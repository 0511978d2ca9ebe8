//! The GPU state probes ask for (`gpudiag_model::gpu_state::GpuState`), read through NVML: the
//! GPUs NVML lists, the other processes on each, volatile ECC counters, the clocks, power,
//! temperature and throttle reasons a probe runs under, and the topology. Only read, never
//! written. Without NVML every answer says why (`StateError::NoDriver`), and the probes run with
//! less context.

use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;

use gpudiag_model::deadline::{DeadlineError, run_with_deadline};
use gpudiag_model::gpu_state::{EccCounts, GpuState, GpuUser, ListedGpu, RunReading, StateError};
use gpudiag_model::topology::Topology;

use super::process_list::used_memory;
use super::{fmt_secs, init_error_message, mw_to_w, one_line, read_topology};

/// The GPUs' state through NVML, or why NVML cannot be asked.
pub struct NvmlGpuState {
    nvml: Result<Arc<Nvml>, String>,
}

impl NvmlGpuState {
    /// Loads and initialises NVML, waiting at most `init_deadline` (a wedged driver can hang
    /// `nvmlInit`); on failure the state answers every question with the reason.
    pub fn open(init_deadline: Duration) -> Self {
        let nvml = match run_with_deadline("nvml-open", init_deadline, Nvml::init) {
            Ok(Ok(nvml)) => Ok(Arc::new(nvml)),
            Ok(Err(e)) => Err(init_error_message(&e)),
            Err(DeadlineError::TimedOut(_)) => Err(format!(
                "NVML initialisation did not finish within {} s: the NVIDIA driver may be hung \
                 (does nvidia-smi answer?)",
                fmt_secs(init_deadline)
            )),
            Err(e) => Err(format!("NVML initialisation failed: {e}")),
        };
        NvmlGpuState { nvml }
    }

    fn nvml(&self) -> Result<&Nvml, StateError> {
        match &self.nvml {
            Ok(n) => Ok(n),
            Err(why) => Err(StateError::NoDriver(format!("NVML is unavailable ({why})"))),
        }
    }

    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, StateError> {
        self.nvml()?
            .device_by_index(index)
            .map_err(|e| failed(&format!("NVML device {index}"), &e))
    }
}

fn failed(what: &str, e: &NvmlError) -> StateError {
    StateError::Failed(format!("{what}: {}", one_line(&e.to_string())))
}

impl GpuState for NvmlGpuState {
    fn gpus(&self) -> Result<Vec<ListedGpu>, StateError> {
        let nvml = self.nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| failed("NVML device count", &e))?;
        Ok((0..count)
            .map(|index| match nvml.device_by_index(index) {
                Ok(d) => ListedGpu {
                    index,
                    uuid: d.uuid().ok(),
                    pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                    name: d.name().ok(),
                },
                Err(_) => ListedGpu {
                    index,
                    ..ListedGpu::default()
                },
            })
            .collect())
    }

    fn other_processes(&self, index: u32) -> Result<Vec<GpuUser>, StateError> {
        let dev = self.device(index)?;
        let me = std::process::id();
        let compute = dev
            .running_compute_processes()
            .map_err(|e| failed("NVML process list", &e))?;
        // Graphics contexts are listed where the GPU has them; the compute list is what
        // decides whether the GPU could be checked.
        let graphics = dev.running_graphics_processes().unwrap_or_default();
        let mut out: Vec<GpuUser> = Vec::new();
        for p in compute.into_iter().chain(graphics) {
            if p.pid == me || out.iter().any(|u| u.pid == p.pid) {
                continue;
            }
            out.push(GpuUser {
                pid: p.pid,
                used_bytes: used_memory(&p.used_gpu_memory),
            });
        }
        Ok(out)
    }

    fn ecc_counts(&self, index: u32) -> Result<EccCounts, StateError> {
        let dev = self.device(index)?;
        let count = |error| dev.total_ecc_errors(error, EccCounter::Volatile).ok();
        Ok(EccCounts {
            corrected_volatile: count(MemoryError::Corrected),
            uncorrected_volatile: count(MemoryError::Uncorrected),
        })
    }

    fn reading(&self, index: u32) -> Result<RunReading, StateError> {
        let dev = self.device(index)?;
        Ok(RunReading {
            sm_clock_mhz: dev.clock_info(Clock::SM).ok().map(f64::from),
            power_w: dev.power_usage().ok().map(mw_to_w),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            throttle_reasons: dev.current_throttle_reasons().ok().map(|r| r.bits()),
        })
    }

    fn topology(&self, gpus: &[ListedGpu]) -> Option<Topology> {
        let nvml = self.nvml().ok()?;
        let gpus: Vec<(u32, Option<String>)> = gpus
            .iter()
            .map(|g| (g.index, g.pci_bus_id.clone()))
            .collect();
        Some(read_topology(nvml, &gpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver every answer says why; with one (a GPU host), the GPUs are listed.
    #[test]
    fn answers_or_says_why_not() {
        let state = NvmlGpuState::open(Duration::from_secs(20));
        match state.gpus() {
            Ok(gpus) => {
                for g in &gpus {
                    assert!(state.ecc_counts(g.index).is_ok());
                }
            }
            Err(StateError::NoDriver(why)) => {
                assert!(why.starts_with("NVML is unavailable"), "{why}");
                assert!(!why.contains('\n'), "{why}");
                assert!(matches!(
                    state.other_processes(0),
                    Err(StateError::NoDriver(_))
                ));
                assert!(matches!(state.reading(0), Err(StateError::NoDriver(_))));
                assert!(state.topology(&[]).is_none());
            }
            Err(e) => panic!("{e}"),
        }
    }
}
