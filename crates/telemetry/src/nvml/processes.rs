//! Which processes use a GPU: NVML's compute and graphics lists joined, with what /proc says
//! about each (name, user, container). The /proc, cgroup and passwd parsers take file text, not
//! paths, so they are tested on real files' contents without a GPU or a container; the amdgpu
//! sysfs backend uses them too.

use std::collections::HashMap;

use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, ProcessUtilizationSample};

use super::absent_from;
use crate::{Absent, ProcessSample};

pub(super) fn read_processes(
    nvml: &Nvml,
    dev: &Device<'_>,
    util_since: &mut Option<u64>,
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
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    Ok(list
        .into_iter()
        .map(|(p, kind)| {
            let proc_file = |name: &str| std::fs::read_to_string(format!("/proc/{}/{name}", p.pid));
            let name = proc_file("comm")
                .ok()
                .and_then(|c| non_empty(c.trim()))
                .or_else(|| {
                    // Another PID namespace (gpudiag in a container) hides /proc/<pid>;
                    // the driver still knows the name.
                    nvml.sys_process_name(p.pid, 256)
                        .ok()
                        .and_then(|n| non_empty(basename(&n)))
                });
            let status = proc_file("status").ok();
            let user = status.as_deref().and_then(|st| {
                let uid = status_uid(st)?;
                Some(passwd_name(&passwd, uid).unwrap_or_else(|| uid.to_string()))
            });
            let container_pid = status.as_deref().and_then(status_inner_pid);
            let container_id = proc_file("cgroup")
                .ok()
                .and_then(|c| container_id_from_cgroup(&c));
            ProcessSample {
                pid: p.pid,
                name,
                user,
                kind: Some(kind.into()),
                used_memory_bytes: used_memory(&p.used_gpu_memory),
                // NVML lists only processes with non-zero utilisation in the window, so a
                // process missing from a successful answer genuinely had 0 %.
                sm_util_pct: sm_util
                    .as_ref()
                    .map(|m| m.get(&p.pid).copied().unwrap_or(0.0)),
                container_id,
                container_pid,
                cpu_time_s: proc_file("stat")
                    .ok()
                    .and_then(|st| gpudiag_model::sample::stat_cpu_time_s(&st)),
            }
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

/// The container id in a `/proc/<pid>/cgroup` file, if the process runs in a container.
///
/// Looks, deepest path component first, for a 64-hex-digit id, bare (cgroupfs drivers:
/// `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`, `/ecs/<task>/<id>`) or wrapped in a
/// systemd scope (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope`). Host processes (`/user.slice/...`, `/`) give `None`.
pub fn container_id_from_cgroup(text: &str) -> Option<String> {
    const PREFIXES: [&str; 6] = [
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
        "cri-o-",
    ];
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .find_map(|path| {
            path.rsplit('/').find_map(|component| {
                let c = component.strip_suffix(".scope").unwrap_or(component);
                let c = PREFIXES.iter().find_map(|p| c.strip_prefix(p)).unwrap_or(c);
                (c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then(|| c.to_ascii_lowercase())
            })
        })
}

/// The real uid from a `/proc/<pid>/status` file (`Uid:\treal\teffective\tsaved\tfs`).
pub fn status_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}

/// The PID a process has in its innermost PID namespace (the last `NSpid:` entry of
/// `/proc/<pid>/status`), when it is nested at all; `None` for a process in the host namespace.
pub fn status_inner_pid(status: &str) -> Option<u32> {
    let ids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    (ids.len() > 1).then(|| ids.last().copied()).flatten()
}

/// The user name for `uid` in `/etc/passwd` text (`name:password:uid:gid:gecos:home:shell`).
/// Comments, blank lines and NIS `+`/`-` entries are skipped.
pub fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .find_map(|l| {
            let mut parts = l.split(':');
            let name = parts.next()?;
            let line_uid: u32 = parts.nth(1)?.parse().ok()?;
            (line_uid == uid && !name.is_empty()).then(|| name.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID_A: &str = "4bc1e7f1e0a8a0d0c3c3b8f9d7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8";
    const ID_B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

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

    #[test]
    fn container_ids_from_real_cgroup_files() {
        // cgroup v1, Docker with the cgroupfs driver.
        let v1 = format!(
            "12:pids:/docker/{ID_A}\n11:memory:/docker/{ID_A}\n1:name=systemd:/docker/{ID_A}\n"
        );
        assert_eq!(container_id_from_cgroup(&v1).as_deref(), Some(ID_A));
        // cgroup v2, Docker with the systemd driver.
        let v2 = format!("0::/system.slice/docker-{ID_A}.scope\n");
        assert_eq!(container_id_from_cgroup(&v2).as_deref(), Some(ID_A));
        // Kubernetes + containerd, systemd driver.
        let k8s = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1d2c3b4a_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/\
             cri-containerd-{ID_B}.scope\n"
        );
        assert_eq!(container_id_from_cgroup(&k8s).as_deref(), Some(ID_B));
        // Kubernetes, cgroupfs driver (v1).
        let k8s_v1 = format!(
            "11:memory:/kubepods/besteffort/pod1d2c3b4a-5e6f-7a8b-9c0d-1e2f3a4b5c6d/{ID_B}\n"
        );
        assert_eq!(container_id_from_cgroup(&k8s_v1).as_deref(), Some(ID_B));
        // CRI-O.
        let crio =
            format!("0::/kubepods.slice/kubepods-pod1d2c3b4a_5e6f.slice/crio-{ID_A}.scope\n");
        assert_eq!(container_id_from_cgroup(&crio).as_deref(), Some(ID_A));
        // Rootless podman: the scope is not the last component.
        let podman = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID_B}.scope/container\n"
        );
        assert_eq!(container_id_from_cgroup(&podman).as_deref(), Some(ID_B));
        // AWS ECS: task id (32 hex) then container id.
        let ecs = format!("0::/ecs/0123456789abcdef0123456789abcdef/{ID_A}\n");
        assert_eq!(container_id_from_cgroup(&ecs).as_deref(), Some(ID_A));
        // Upper case is normalised.
        let upper = format!("0::/docker/{}\n", ID_A.to_uppercase());
        assert_eq!(container_id_from_cgroup(&upper).as_deref(), Some(ID_A));
    }

    #[test]
    fn host_processes_have_no_container_id() {
        for text in [
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "0::/system.slice/containerd.service\n",
            "12:pids:/user.slice\n11:memory:/\n",
            "",
            // 63 hex digits and a non-hex 64-character name are not ids.
            "0::/docker/4bc1e7f1e0a8a0d0c3c3b8f9d7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f\n",
            "0::/docker/zzc1e7f1e0a8a0d0c3c3b8f9d7e6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8\n",
        ] {
            assert_eq!(container_id_from_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn uid_and_user_lookup() {
        let status = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
                      Pid:\t4242\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\n\
                      Gid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(status_uid(status), Some(1000));
        assert_eq!(status_uid("Name:\tx\n"), None);
        assert_eq!(status_uid("Uid:\tabc\t0\n"), None);

        let passwd = "# comment\nroot:x:0:0:root:/root:/bin/bash\n\n\
                      daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
                      +nisuser::1001:1001:::\nbroken line\n\
                      alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash\n";
        assert_eq!(passwd_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(passwd_name(passwd, 1001), None);
        assert_eq!(passwd_name(passwd, 4242), None);
        assert_eq!(passwd_name("", 0), None);
    }

    #[test]
    fn container_pid_is_the_innermost_nspid() {
        let nested = "Name:\tpython3\nPid:\t48213\nNSpid:\t48213\t57\nUid:\t1000\t1000\n";
        assert_eq!(status_inner_pid(nested), Some(57));
        let doubly = "NSpid:\t900\t300\t7\n";
        assert_eq!(status_inner_pid(doubly), Some(7));
        let host = "Pid:\t1234\nNSpid:\t1234\n";
        assert_eq!(status_inner_pid(host), None);
        assert_eq!(status_inner_pid("Pid:\t1\n"), None);
    }
}
