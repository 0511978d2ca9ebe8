//! Where the host side of a host↔device copy lives. A pinned buffer's pages come from the NUMA
//! node of the CPU the allocating thread runs on (the kernel's default, local policy); on a host
//! of two sockets a buffer on the socket away from the GPU's root port crosses the socket link on
//! every copy and reads a few GB/s short of the link. nvbandwidth keeps its thread on the GPU's
//! CPUs for the same reason. The GPU's CPUs are its PCI device's `local_cpulist` in sysfs.

use std::path::Path;

/// The knob that keeps the probe thread where it was (the placement before this module), for
/// side-by-side benchmarks: `GPUDIAG_PROBE_HOST_PLACEMENT=inherit`. Hidden.
pub const PLACEMENT_ENV: &str = "GPUDIAG_PROBE_HOST_PLACEMENT";

/// CPU numbers from a kernel CPU list (`0-55,112-167`); `None` on anything else.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    // More CPUs than a cpu_set_t holds cannot be asked for anyway.
    const MAX: usize = 1024;
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse().ok()?, hi.trim().parse().ok()?),
            None => {
                let n: usize = part.trim().parse().ok()?;
                (n, n)
            }
        };
        if lo > hi || hi >= MAX {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The GPU's NUMA node and CPUs as sysfs gives them under `sys_pci` (`/sys/bus/pci/devices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLocality {
    /// `None` where the platform names no node (`-1`: one node, or a VM that hides them).
    pub numa_node: Option<u32>,
    pub cpus: Vec<usize>,
}

pub fn gpu_locality(sys_pci: &Path, pci_bus_id: &str) -> Result<GpuLocality, String> {
    let dir = sys_pci.join(pci_bus_id.to_ascii_lowercase());
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map_err(|e| format!("{}: {e}", dir.join(name).display()))
    };
    let cpus = parse_cpu_list(&read("local_cpulist")?)
        .ok_or_else(|| format!("{}/local_cpulist is not a CPU list", dir.display()))?;
    let numa_node = read("numa_node")
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Ok(GpuLocality { numa_node, cpus })
}

/// A kernel CPU list of `cpus`, for the record.
pub fn cpu_list_text(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// What was done with the calling thread, for the probe's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub numa_node: Option<u32>,
    /// "gpu_local" (moved to the GPU's CPUs), "already_local", or "inherited" with `why`.
    pub placement: &'static str,
    pub cpus: Option<String>,
    pub why: Option<String>,
}

/// Keeps the calling thread on the CPUs near a GPU (those it is allowed of them) while it lives,
/// then gives it back the CPUs it had.
pub struct NearGpu {
    previous: Option<libc::cpu_set_t>,
    pub placement: Placement,
}

impl NearGpu {
    pub fn bind(pci_bus_id: &str) -> NearGpu {
        NearGpu::bind_in(Path::new("/sys/bus/pci/devices"), pci_bus_id)
    }

    fn bind_in(sys_pci: &Path, pci_bus_id: &str) -> NearGpu {
        let inherited = |numa_node, why: String| NearGpu {
            previous: None,
            placement: Placement {
                numa_node,
                placement: "inherited",
                cpus: None,
                why: Some(why),
            },
        };
        if std::env::var(PLACEMENT_ENV).is_ok_and(|v| v == "inherit") {
            return inherited(None, format!("{PLACEMENT_ENV}=inherit"));
        }
        let local = match gpu_locality(sys_pci, pci_bus_id) {
            Ok(l) => l,
            Err(e) => return inherited(None, e),
        };
        let allowed = match current_cpus() {
            Ok(set) => set,
            Err(e) => return inherited(local.numa_node, e),
        };
        let allowed_list: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| is_set(&allowed, c))
            .collect();
        let near: Vec<usize> = local
            .cpus
            .iter()
            .copied()
            .filter(|c| allowed_list.contains(c))
            .collect();
        if near.is_empty() {
            return inherited(
                local.numa_node,
                format!(
                    "none of the GPU's CPUs ({}) is allowed to this process ({})",
                    cpu_list_text(&local.cpus),
                    cpu_list_text(&allowed_list)
                ),
            );
        }
        if near == allowed_list {
            return NearGpu {
                previous: None,
                placement: Placement {
                    numa_node: local.numa_node,
                    placement: "already_local",
                    cpus: Some(cpu_list_text(&near)),
                    why: None,
                },
            };
        }
        // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes inside it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in &near {
            // SAFETY: `c` < CPU_SETSIZE (it came from `allowed_list`).
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the given size.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc != 0 {
            return inherited(
                local.numa_node,
                format!("sched_setaffinity: {}", std::io::Error::last_os_error()),
            );
        }
        NearGpu {
            previous: Some(allowed),
            placement: Placement {
                numa_node: local.numa_node,
                placement: "gpu_local",
                cpus: Some(cpu_list_text(&near)),
                why: None,
            },
        }
    }
}

impl Drop for NearGpu {
    fn drop(&mut self) {
        if let Some(previous) = &self.previous {
            // SAFETY: as in `bind`; restores the set read there.
            let _ =
                unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(previous), previous) };
        }
    }
}

fn current_cpus() -> Result<libc::cpu_set_t, String> {
    // SAFETY: zeroed is a valid empty set; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(set)
}

fn is_set(set: &libc::cpu_set_t, cpu: usize) -> bool {
    // SAFETY: reads inside the set; `cpu` < CPU_SETSIZE by the callers' ranges.
    unsafe { libc::CPU_ISSET(cpu, set) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8\n"), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-99999"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
        assert_eq!(cpu_list_text(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list_text(&[]), "");
    }

    #[test]
    fn locality_from_a_sysfs_tree() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("0000:19:00.0");
        std::fs::create_dir(&dev).unwrap();
        std::fs::write(dev.join("local_cpulist"), "0-55,112-167\n").unwrap();
        std::fs::write(dev.join("numa_node"), "0\n").unwrap();
        let l = gpu_locality(dir.path(), "0000:19:00.0").unwrap();
        assert_eq!(l.numa_node, Some(0));
        assert_eq!(l.cpus.len(), 112);
        // A platform that names no node.
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        assert_eq!(
            gpu_locality(dir.path(), "0000:19:00.0").unwrap().numa_node,
            None
        );
        assert!(gpu_locality(dir.path(), "0000:1a:00.0").is_err());
    }

    #[test]
    fn binding_moves_the_thread_and_gives_its_cpus_back() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("0000:19:00.0");
        std::fs::create_dir(&dev).unwrap();
        std::thread::spawn(move || {
            let before = current_cpus().unwrap();
            let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| is_set(&before, c))
                .collect();
            let first = allowed[0];
            std::fs::write(dev.join("local_cpulist"), format!("{first}\n")).unwrap();
            std::fs::write(dev.join("numa_node"), "1\n").unwrap();
            let near = NearGpu::bind_in(dir.path(), "0000:19:00.0");
            assert_eq!(near.placement.numa_node, Some(1));
            assert_eq!(
                near.placement.cpus.as_deref(),
                Some(first.to_string().as_str())
            );
            let during = current_cpus().unwrap();
            if allowed.len() > 1 {
                assert_eq!(near.placement.placement, "gpu_local");
                assert!(is_set(&during, first) && !is_set(&during, allowed[1]));
            } else {
                assert_eq!(near.placement.placement, "already_local");
            }
            drop(near);
            let after = current_cpus().unwrap();
            assert!(allowed.iter().all(|&c| is_set(&after, c)));

            // A GPU whose sysfs entry is missing: the thread stays, and says why.
            let missing = NearGpu::bind_in(dir.path(), "0000:1a:00.0");
            assert_eq!(missing.placement.placement, "inherited");
            assert!(missing.placement.why.is_some());
        })
        .join()
        .unwrap();
    }
}
