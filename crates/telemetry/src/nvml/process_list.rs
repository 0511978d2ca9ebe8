//! Which processes use a GPU: NVML's compute and graphics lists joined, with what /proc says
//! about each (name, user, container, Slurm job and pod: `attribution`).

use std::collections::HashMap;

use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, ProcessUtilizationSample};

use super::absent_from;
use crate::attribution::{Attributor, GpuPods};
use gpudiag_model::sample::{Absent, ProcessSample};

pub(super) fn read_processes(
    nvml: &Nvml,
    dev: &Device<'_>,
    util_since: &mut Option<u64>,
    attributor: &Attributor,
    gpu_pods: &GpuPods,
) -> Result<Vec<ProcessSample>, Absent> {
    let list = merge_process_lists(
        dev.running_compute_processes(),
        dev.running_graphics_processes(),
    )?;
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let sm_util = match dev.process_utilization_stats(*util_since) {
        Ok(samples) => {
            if let Some(newest) = samples.iter().map(|u| u.timestamp).max() {
                *util_since = Some(newest);
            }
            Some(sm_util_by_pid(&samples))
        }
        // NVML's way of saying no process had any SM activity since `util_since`.
        Err(NvmlError::NotFound) => Some(HashMap::new()),
        // MIG, vGPU and old parts: no per-process utilisation.
        Err(_) => None,
    };
    let passwd = attributor.passwd();
    Ok(list
        .into_iter()
        .map(|(p, kind)| {
            let mut sample = attributor.process(p.pid, &passwd, gpu_pods);
            if sample.name.is_none() {
                // Another PID namespace (gpudiag in a container) hides /proc/<pid>; the driver
                // still knows the name.
                sample.name = nvml
                    .sys_process_name(p.pid, 256)
                    .ok()
                    .and_then(|n| non_empty(basename(&n)));
            }
            sample.kind = Some(kind.into());
            sample.used_memory_bytes = used_memory(&p.used_gpu_memory);
            // NVML lists only processes with non-zero utilisation in the window, so a process
            // missing from a successful answer genuinely had 0 %.
            sample.sm_util_pct = sm_util
                .as_ref()
                .map(|m| m.get(&p.pid).copied().unwrap_or(0.0));
            sample
        })
        .collect())
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

pub(super) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub(super) fn used_memory(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(bytes) => Some(*bytes),
        // NVML_VALUE_NOT_AVAILABLE: e.g. MIG without admin rights, or Windows WDDM.
        UsedGpuMemory::Unavailable => None,
    }
}

/// Joins the compute and graphics process lists. A process in both is reported once, as
/// "compute" (the kind rules care about). Only when both calls fail is the list absent.
fn merge_process_lists(
    compute: Result<Vec<ProcessInfo>, NvmlError>,
    graphics: Result<Vec<ProcessInfo>, NvmlError>,
) -> Result<Vec<(ProcessInfo, &'static str)>, Absent> {
    let (compute, graphics) = match (compute, graphics) {
        (Err(e), Err(_)) => return Err(absent_from(&e)),
        (c, g) => (c.unwrap_or_default(), g.unwrap_or_default()),
    };
    let mut out: Vec<(ProcessInfo, &'static str)> = Vec::new();
    for (p, kind) in compute
        .into_iter()
        .map(|p| (p, "compute"))
        .chain(graphics.into_iter().map(|p| (p, "graphics")))
    {
        if !out.iter().any(|(q, _)| q.pid == p.pid) {
            out.push((p, kind));
        }
    }
    Ok(out)
}

/// Mean SM utilisation per pid over the samples NVML returned.
fn sm_util_by_pid(samples: &[ProcessUtilizationSample]) -> HashMap<u32, f64> {
    let mut sums: HashMap<u32, (f64, u32)> = HashMap::new();
    for s in samples {
        let e = sums.entry(s.pid).or_default();
        e.0 += f64::from(s.sm_util);
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(pid, (sum, n))| (pid, sum / f64::from(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_info(pid: u32, mem: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: mem,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn process_lists_merge() {
        let compute = Ok(vec![
            proc_info(10, UsedGpuMemory::Used(1 << 20)),
            proc_info(11, UsedGpuMemory::Unavailable),
        ]);
        let graphics = Ok(vec![
            proc_info(11, UsedGpuMemory::Used(5)),
            proc_info(12, UsedGpuMemory::Used(7)),
        ]);
        let merged = merge_process_lists(compute, graphics).unwrap();
        let got: Vec<(u32, &str)> = merged.iter().map(|(p, k)| (p.pid, *k)).collect();
        assert_eq!(got, [(10, "compute"), (11, "compute"), (12, "graphics")]);

        let only_compute = merge_process_lists(
            Ok(vec![proc_info(1, UsedGpuMemory::Used(1))]),
            Err(NvmlError::NotSupported),
        )
        .unwrap();
        assert_eq!(only_compute.len(), 1);
        assert_eq!(
            merge_process_lists(Err(NvmlError::NoPermission), Err(NvmlError::NotSupported))
                .unwrap_err(),
            Absent::NoPermission
        );
    }

    #[test]
    fn sm_util_is_averaged_per_pid() {
        let u = |pid, ts, sm| ProcessUtilizationSample {
            pid,
            timestamp: ts,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        };
        let m = sm_util_by_pid(&[u(1, 10, 90), u(2, 10, 5), u(1, 20, 70)]);
        assert_eq!(m.get(&1), Some(&80.0));
        assert_eq!(m.get(&2), Some(&5.0));
        assert_eq!(m.get(&3), None);
    }
}
