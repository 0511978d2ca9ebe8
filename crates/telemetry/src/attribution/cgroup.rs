//! What a `/proc/<pid>/cgroup` path says about its process's owner: the Slurm job slurmd's
//! cgroup plugin made, or the Kubernetes pod and container the kubelet and runtime made. Both
//! cgroup v1 (`N:controller:/path`, one line per hierarchy) and v2 (`0::/path`) lines are read;
//! the parsers take the file's text, so they are tested on real files' contents.

/// A Slurm job as its cgroup path names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmCgroup {
    pub job_id: String,
    pub step: Option<String>,
    /// The `uid_N` component (cgroup v1 layout only; v2 paths name no user).
    pub uid: Option<u32>,
}

/// The cgroup paths of a `/proc/<pid>/cgroup` file.
fn paths(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| line.splitn(3, ':').nth(2))
}

/// The Slurm job in a cgroup file.
///
/// slurmd's cgroup v1 plugin makes `/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>` (the first
/// component is `slurm_<node>` with several slurmd per host); its v2 plugin makes
/// `/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>` (`<node>_slurmstepd.scope`
/// likewise). A `job_<digits>` component counts only below a component that names slurm, so an
/// unrelated cgroup called `job_1` is not taken for one.
pub fn slurm_from_cgroup(text: &str) -> Option<SlurmCgroup> {
    paths(text).find_map(|path| {
        let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let slurm_at = components.iter().position(|c| c.contains("slurm"))?;
        let below = &components[slurm_at + 1..];
        let job_at = below
            .iter()
            .position(|c| c.strip_prefix("job_").is_some_and(all_digits))?;
        let job_id = below[job_at].strip_prefix("job_")?.to_owned();
        let uid = below[..job_at]
            .iter()
            .find_map(|c| c.strip_prefix("uid_")?.parse().ok());
        let step = below[job_at + 1..]
            .iter()
            .find_map(|c| c.strip_prefix("step_"))
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        Some(SlurmCgroup { job_id, step, uid })
    })
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A Kubernetes pod as its cgroup path names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// The pod UID, with dashes (the systemd driver writes underscores).
    pub uid: String,
    /// "containerd", "cri-o" or "docker" when the container's cgroup says which runtime made it.
    pub runtime: Option<&'static str>,
}

/// The pod in a cgroup file.
///
/// The kubelet's systemd driver makes `/kubepods.slice/kubepods-<qos>.slice/
/// kubepods-<qos>-pod<uid with _>.slice/<runtime>-<id>.scope` (guaranteed pods have no QoS
/// level: `kubepods-pod<uid>.slice`); its cgroupfs driver makes `/kubepods/<qos>/pod<uid>/<id>`
/// (`/kubepods/pod<uid>/<id>`). Either may sit below a prefix (kind and nested kubelets use
/// `/kubelet.slice/kubelet-kubepods.slice/...`).
pub fn pod_from_cgroup(text: &str) -> Option<PodCgroup> {
    paths(text).find_map(|path| {
        let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let kubepods_at = components.iter().position(|c| c.contains("kubepods"))?;
        let (pod_at, uid) = components
            .iter()
            .enumerate()
            .skip(kubepods_at)
            .find_map(|(i, c)| Some((i, pod_uid(c)?)))?;
        let runtime = components.get(pod_at + 1).and_then(|c| runtime_of(c));
        Some(PodCgroup { uid, runtime })
    })
}

/// The pod UID in one path component: `pod<uid>` (cgroupfs) or `…-pod<uid_with_underscores>.slice`
/// (systemd).
fn pod_uid(component: &str) -> Option<String> {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    let uid = match name.rfind("-pod") {
        Some(at) if component.ends_with(".slice") => &name[at + 4..],
        _ => name.strip_prefix("pod")?,
    };
    let uid = uid.replace('_', "-");
    is_uid(&uid).then(|| uid.to_ascii_lowercase())
}

/// A UUID as Kubernetes writes pod UIDs: 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The runtime a container's cgroup component names (systemd driver scopes, CRI-O's cgroupfs
/// `crio-<id>`); a bare id (cgroupfs with containerd or Docker) says nothing.
fn runtime_of(component: &str) -> Option<&'static str> {
    const RUNTIMES: [(&str, &str); 5] = [
        ("cri-containerd-", "containerd"),
        ("containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("cri-o-", "cri-o"),
        ("docker-", "docker"),
    ];
    RUNTIMES
        .iter()
        .find(|(prefix, _)| component.starts_with(prefix))
        .map(|(_, runtime)| *runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1d2c3b4a-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn slurm_v1_names_user_job_and_step() {
        let text = "12:pids:/slurm/uid_1000/job_1234/step_0/task_0\n\
                    11:memory:/slurm/uid_1000/job_1234/step_0/task_0\n\
                    1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(
            slurm_from_cgroup(text),
            Some(SlurmCgroup {
                job_id: "1234".into(),
                step: Some("0".into()),
                uid: Some(1000),
            })
        );
        // Several slurmd per host name their hierarchy after the node.
        let multi = "4:devices:/slurm_node07/uid_0/job_77/step_batch\n";
        let job = slurm_from_cgroup(multi).unwrap();
        assert_eq!(
            (job.job_id.as_str(), job.step.as_deref(), job.uid),
            ("77", Some("batch"), Some(0))
        );
    }

    #[test]
    fn slurm_v2_names_job_and_step_but_no_user() {
        let text = "0::/system.slice/slurmstepd.scope/job_98765/step_extern/user/task_0\n";
        assert_eq!(
            slurm_from_cgroup(text),
            Some(SlurmCgroup {
                job_id: "98765".into(),
                step: Some("extern".into()),
                uid: None,
            })
        );
        let node = "0::/system.slice/gpu07_slurmstepd.scope/job_5/step_interactive/user/task_0\n";
        assert_eq!(
            slurm_from_cgroup(node).map(|j| j.job_id),
            Some("5".to_owned())
        );
        // The job's own cgroup, between steps.
        let job_only = "0::/system.slice/slurmstepd.scope/job_5\n";
        assert_eq!(slurm_from_cgroup(job_only).unwrap().step, None);
    }

    #[test]
    fn not_slurm() {
        for text in [
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            // A job_N cgroup that no slurm component is above.
            "0::/batch/job_12/step_0\n",
            "0::/system.slice/slurmd.service\n",
            "0::/system.slice/slurmstepd.scope/job_x/step_0\n",
            "",
        ] {
            assert_eq!(slurm_from_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let underscored = UID.replace('-', "_");
        let containerd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/\
             cri-containerd-{ID}.scope\n"
        );
        assert_eq!(
            pod_from_cgroup(&containerd),
            Some(PodCgroup {
                uid: UID.into(),
                runtime: Some("containerd"),
            })
        );
        let guaranteed_crio =
            format!("0::/kubepods.slice/kubepods-pod{underscored}.slice/crio-{ID}.scope\n");
        assert_eq!(
            pod_from_cgroup(&guaranteed_crio),
            Some(PodCgroup {
                uid: UID.into(),
                runtime: Some("cri-o"),
            })
        );
        let besteffort_docker = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice/\
             docker-{ID}.scope\n"
        );
        assert_eq!(
            pod_from_cgroup(&besteffort_docker).and_then(|p| p.runtime),
            Some("docker")
        );
        // A nested kubelet (kind) below its own slice.
        let kind = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{underscored}.slice/cri-containerd-{ID}.scope\n"
        );
        assert_eq!(pod_from_cgroup(&kind).map(|p| p.uid), Some(UID.to_owned()));
    }

    #[test]
    fn kubernetes_cgroupfs_driver_v1() {
        let text = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{ID}\n11:memory:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        assert_eq!(
            pod_from_cgroup(&text),
            Some(PodCgroup {
                uid: UID.into(),
                runtime: None,
            })
        );
        let guaranteed = format!("4:cpu,cpuacct:/kubepods/pod{UID}/crio-{ID}\n");
        assert_eq!(
            pod_from_cgroup(&guaranteed),
            Some(PodCgroup {
                uid: UID.into(),
                runtime: Some("cri-o"),
            })
        );
        // Upper case UIDs are normalised.
        let upper = format!("0::/kubepods/pod{}/{ID}\n", UID.to_uppercase());
        assert_eq!(pod_from_cgroup(&upper).map(|p| p.uid), Some(UID.to_owned()));
    }

    #[test]
    fn not_kubernetes() {
        for text in [
            format!("0::/system.slice/docker-{ID}.scope\n"),
            "0::/user.slice/user-1000.slice/session-3.scope\n".to_owned(),
            // The QoS slices alone, and a pod component with a broken UID.
            "0::/kubepods.slice/kubepods-burstable.slice\n".to_owned(),
            "0::/kubepods/burstable/pod1d2c3b4a-5e6f\n".to_owned(),
            // A pod UID above any kubepods component is not the kubelet's.
            format!("0::/pod{UID}/kubepods\n"),
        ] {
            assert_eq!(pod_from_cgroup(&text), None, "{text:?}");
        }
    }
}
