//! Parsers of /proc and /etc/passwd files, shared by the backends that list GPU processes. They
//! take file text, not paths, so they are tested on real files' contents without a GPU or a
//! container.

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
