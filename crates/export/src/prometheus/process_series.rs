//! Per-process series: GPU memory, SM share and the verdict about a process, labelled with who
//! owns it (Slurm job, user, pod, namespace, container) where known, and the pod labels
//! dcgm-exporter's Kubernetes mode puts on device series.
//!
//! Cardinality stays bounded: only the processes of each GPU's latest sample are written, so a
//! process that ended drops out at the next slow read; and at most `ProcessCap` processes get
//! series per scrape (those holding the most GPU memory), with `gpudiag_process_series_dropped`
//! saying how many were left out.
//!
//! The Slurm job is `slurm_job`, not `job`: Prometheus owns the `job` label (the scrape job) and
//! renames a target's own `job` to `exported_job`, or with `honor_labels` lets it replace the
//! scrape job, so a label named `job` would not reach a dashboard as the Slurm job.

use gpudiag_model::attribution::Attribution;
use gpudiag_model::prometheus_names::{label, series};

use super::Snapshot;
use super::exposition::{Exposition, Labels};
use gpudiag_model::metric_table::Kind;
use gpudiag_model::sample::{DeviceInfo, ProcessSample, Sample};

/// The most processes that get series in one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessCap(pub usize);

/// Default of `serve --max-process-series`: a node of 8 GPUs with 64 processes each.
pub const DEFAULT_PROCESS_CAP: usize = 512;

impl Default for ProcessCap {
    fn default() -> Self {
        ProcessCap(DEFAULT_PROCESS_CAP)
    }
}

const POD_LABELS: [&str; 3] = [label::POD, label::NAMESPACE, label::CONTAINER];

/// The pod labels of a device series: dcgm-exporter's `pod`, `namespace` and `container`, when
/// exactly one pod holds the GPU (and `container` when one of its containers does).
pub fn device_pod_labels(s: &Sample) -> Labels {
    let mut l: Labels = Vec::new();
    if let Some([pod]) = s.gpu_pods.as_deref() {
        l.push((label::POD, pod.name.clone()));
        l.push((label::NAMESPACE, pod.namespace.clone()));
        if let [container] = pod.containers.as_slice() {
            l.push((label::CONTAINER, container.clone()));
        }
    }
    l
}

/// The owner labels of one process, only those known.
fn owner_labels(p: &ProcessSample) -> Labels {
    let mut l: Labels = vec![(label::PID, p.pid.to_string())];
    if let Some(name) = &p.name {
        l.push((label::PROCESS, name.clone()));
    }
    let a: Option<&Attribution> = p.attribution.as_ref();
    if let Some(job) = a.and_then(|a| a.job.as_ref()) {
        l.push((label::SLURM_JOB, job.id.clone()));
    }
    if let Some(user) = p.charged_user() {
        l.push((label::USER, user.to_owned()));
    }
    if let Some(pod) = a.and_then(|a| a.pod.as_ref()) {
        if let Some(name) = &pod.name {
            l.push((label::POD, name.clone()));
        }
        if let Some(ns) = &pod.namespace {
            l.push((label::NAMESPACE, ns.clone()));
        }
        if let Some(c) = &pod.container {
            l.push((label::CONTAINER, c.clone()));
        }
    }
    l
}

/// The `cap` processes holding the most memory, with their device and its labels, and how
/// many were left out. Those whose memory is unknown sort after every known amount (`None` is
/// the least), so a cut leaves them out first.
fn heaviest<'a>(
    devices: &'a [(&DeviceInfo, &Sample, Labels)],
    cap: usize,
) -> (Vec<(&'a DeviceInfo, &'a ProcessSample, &'a Labels)>, usize) {
    let mut all: Vec<(&DeviceInfo, &ProcessSample, &Labels)> = devices
        .iter()
        .flat_map(|(d, s, l)| s.processes.iter().flatten().map(move |p| (*d, p, l)))
        .collect();
    all.sort_by_key(|(d, p, _)| (std::cmp::Reverse(p.used_memory_bytes), d.index, p.pid));
    let dropped = all.len().saturating_sub(cap);
    all.truncate(cap);
    (all, dropped)
}

/// Writes the per-process families. `devices` are the judged devices with their labels.
pub(super) fn render(
    x: &mut Exposition,
    snap: &Snapshot,
    devices: &[(&DeviceInfo, &Sample, Labels)],
) {
    let counts: Vec<(Labels, f64)> = devices
        .iter()
        .filter_map(|(_, s, l)| Some((l.clone(), s.processes.as_ref()?.len() as f64)))
        .collect();
    let (all, dropped) = heaviest(devices, snap.process_cap.0);
    let mut memory = Vec::new();
    let mut sm = Vec::new();
    let mut verdicts = Vec::new();
    for (d, p, device_labels) in &all {
        // The process's own pod labels replace the device's (a label may appear once).
        let mut labels: Labels = device_labels
            .iter()
            .filter(|(k, _)| !POD_LABELS.contains(k))
            .cloned()
            .collect();
        labels.extend(owner_labels(p));
        if let Some(bytes) = p.used_memory_bytes {
            memory.push((labels.clone(), bytes as f64));
        }
        if let Some(pct) = p.sm_util_pct {
            sm.push((labels.clone(), pct));
        }
        if let Some(v) = snap.verdicts.get(&d.index).filter(|v| v.pid == Some(p.pid)) {
            labels.push((label::VERDICT, v.bottleneck.name().to_owned()));
            labels.push((label::CONFIDENCE, v.confidence.to_string()));
            labels.push((label::BASIS, v.basis.name().to_owned()));
            verdicts.push((labels, 1.0));
        }
    }
    x.family(
        series::GPUDIAG_GPU_PROCESSES,
        Kind::Gauge,
        "Processes using this GPU at the last read (all of them, whether or not they have \
         per-process series).",
        &counts,
    );
    x.family(
        series::GPUDIAG_PROCESS_MEMORY_USED_BYTES,
        Kind::Gauge,
        "GPU memory this process holds on this GPU (bytes), labelled with its Slurm job, user, \
         pod, namespace and container where known.",
        &memory,
    );
    x.family(
        series::GPUDIAG_PROCESS_SM_UTIL_PERCENT,
        Kind::Gauge,
        "This process's share of the GPU's SM time as the driver reports it (%).",
        &sm,
    );
    x.family(
        series::GPUDIAG_PROCESS_VERDICT,
        Kind::Gauge,
        "1 for the bottleneck verdict about this process (when it is the only one holding the \
         GPU), labelled by the bottleneck (verdict), its confidence and basis.",
        &verdicts,
    );
    let mut cut: Labels = Vec::new();
    if let Some(h) = &snap.host.hostname {
        cut.push((label::HOSTNAME, h.clone()));
    }
    x.family(
        series::GPUDIAG_PROCESS_SERIES_DROPPED,
        Kind::Gauge,
        "Processes left without per-process series in this scrape because more were running \
         than serve --max-process-series allows (those holding the least GPU memory go first); \
         0 when none.",
        &[(cut, dropped as f64)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus::render;
    use gpudiag_model::attribution::{FoundIn, PodAllocation, PodIdentity, SlurmJob};
    use gpudiag_model::sample::HostInfo;
    use std::time::Instant;

    fn process(pid: u32, bytes: u64, attribution: Attribution) -> ProcessSample {
        ProcessSample {
            pid,
            name: Some("python3".into()),
            user: Some("alice".into()),
            kind: Some("compute".into()),
            used_memory_bytes: Some(bytes),
            sm_util_pct: Some(40.0),
            container_id: None,
            container_pid: None,
            cpu_time_s: None,
            attribution: Some(attribution),
            launch: None,
            state: None,
            started_ms: None,
        }
    }

    fn in_pod(name: &str) -> Attribution {
        Attribution {
            pod: Some(PodIdentity {
                name: Some(name.into()),
                namespace: Some("ml".into()),
                container: Some("trainer".into()),
                matched_by: Some(FoundIn::GpuAllocation),
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        }
    }

    fn in_job(id: &str, user: &str) -> Attribution {
        Attribution {
            job: Some(SlurmJob {
                id: id.into(),
                step: Some("0".into()),
                user: Some(user.into()),
                found_in: FoundIn::Cgroup,
            }),
            ..Attribution::default()
        }
    }

    fn pod(name: &str) -> PodAllocation {
        PodAllocation {
            namespace: "ml".into(),
            name: name.into(),
            containers: vec!["trainer".into()],
        }
    }

    /// GPU 0 held by one pod, GPU 1 time-sliced between two, GPU 2 running a Slurm job.
    fn snapshot(cap: usize) -> Snapshot {
        let devices: Vec<DeviceInfo> = (0..3)
            .map(|index| DeviceInfo {
                index,
                uuid: Some(format!("GPU-{index}")),
                ..DeviceInfo::default()
            })
            .collect();
        let mut s0 = Sample::new(0, 1000);
        s0.gpu_util_pct = Some(90.0);
        s0.gpu_pods = Some(vec![pod("train-0")]);
        s0.processes = Some(vec![process(10, 3 << 30, in_pod("train-0"))]);
        let mut s1 = Sample::new(1, 1000);
        s1.gpu_util_pct = Some(50.0);
        s1.gpu_pods = Some(vec![pod("a"), pod("b")]);
        s1.processes = Some(vec![
            process(20, 1 << 30, in_pod("a")),
            process(21, 2 << 30, Attribution::default()),
        ]);
        let mut s2 = Sample::new(2, 1000);
        s2.gpu_util_pct = Some(10.0);
        s2.processes = Some(vec![process(30, 5 << 20, in_job("4242", "bob"))]);
        Snapshot {
            host: HostInfo {
                hostname: Some("node".into()),
                ..HostInfo::default()
            },
            devices,
            latest: [(0, s0), (1, s1), (2, s2)].into_iter().collect(),
            process_cap: ProcessCap(cap),
            ..Snapshot::default()
        }
    }

    fn lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    }

    /// The labels of an exposition line, checking that none repeats.
    fn labels_of(line: &str) -> Vec<(String, String)> {
        let inner = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
        let labels: Vec<(String, String)> = inner
            .split("\",")
            .map(|kv| {
                let (k, v) = kv.split_once("=\"").unwrap();
                (k.to_owned(), v.trim_end_matches('"').to_owned())
            })
            .collect();
        let mut keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "a label repeats in {line}");
        labels
    }

    fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
        labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn device_series_carry_the_pod_only_when_one_pod_holds_the_gpu() {
        let text = render(&snapshot(100), Instant::now());
        let util = lines(&text, series::DCGM_FI_DEV_GPU_UTIL);
        assert_eq!(util.len(), 3);
        let gpu0 = labels_of(util[0]);
        assert_eq!(label(&gpu0, "pod"), Some("train-0"));
        assert_eq!(label(&gpu0, "namespace"), Some("ml"));
        assert_eq!(label(&gpu0, "container"), Some("trainer"));
        for shared_or_none in &util[1..] {
            assert_eq!(label(&labels_of(shared_or_none), "pod"), None);
        }
    }

    #[test]
    fn processes_are_labelled_with_their_owners() {
        let text = render(&snapshot(100), Instant::now());
        let memory = lines(&text, series::GPUDIAG_PROCESS_MEMORY_USED_BYTES);
        assert_eq!(memory.len(), 4);
        // Heaviest first.
        let first = labels_of(memory[0]);
        assert_eq!(label(&first, "pid"), Some("10"));
        assert_eq!(label(&first, "pod"), Some("train-0"));
        assert!(memory[0].ends_with(&format!(" {}", 3u64 << 30)));
        let shared = memory
            .iter()
            .map(|l| labels_of(l))
            .find(|l| label(l, "pid") == Some("21"))
            .unwrap();
        // Its pod is unknown (the GPU is shared): no pod label, and not the device's either.
        assert_eq!(label(&shared, "pod"), None);
        let slurm = memory
            .iter()
            .map(|l| labels_of(l))
            .find(|l| label(l, "pid") == Some("30"))
            .unwrap();
        assert_eq!(label(&slurm, "slurm_job"), Some("4242"));
        assert_eq!(label(&slurm, "user"), Some("bob"));
        assert_eq!(label(&slurm, "gpu"), Some("2"));
        assert_eq!(
            lines(&text, series::GPUDIAG_PROCESS_SM_UTIL_PERCENT).len(),
            4
        );
        assert_eq!(
            lines(&text, series::GPUDIAG_PROCESS_SERIES_DROPPED),
            ["gpudiag_process_series_dropped{Hostname=\"node\"} 0"]
        );
        let counts = lines(&text, series::GPUDIAG_GPU_PROCESSES);
        assert!(counts[1].ends_with(" 2"), "{counts:?}");
    }

    #[test]
    fn the_cap_keeps_the_heaviest_and_says_how_many_it_cut() {
        let text = render(&snapshot(2), Instant::now());
        let pids: Vec<String> = lines(&text, series::GPUDIAG_PROCESS_MEMORY_USED_BYTES)
            .iter()
            .map(|l| label(&labels_of(l), "pid").unwrap().to_owned())
            .collect();
        assert_eq!(pids, ["10", "21"]);
        assert_eq!(
            lines(&text, series::GPUDIAG_PROCESS_SERIES_DROPPED),
            ["gpudiag_process_series_dropped{Hostname=\"node\"} 2"]
        );
        // Every process is still counted per GPU.
        let counts: f64 = lines(&text, series::GPUDIAG_GPU_PROCESSES)
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert_eq!(counts, 4.0);
    }

    #[test]
    fn a_process_that_ended_drops_out() {
        let mut snap = snapshot(100);
        let text = render(&snap, Instant::now());
        assert!(text.contains("pid=\"30\""));
        if let Some(s) = snap.latest.get_mut(&2) {
            s.processes = Some(Vec::new());
        }
        let text = render(&snap, Instant::now());
        assert!(!text.contains("pid=\"30\""));
    }
}
