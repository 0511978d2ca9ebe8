//! Job series: which job each GPU works for, the verdict on each job judged on this host, and
//! the part each GPU plays in it (straggler, waiting, or the missing rank of a stalled job);
//! for a job that makes no progress, how long and which ranks its GPUs wait for.
//!
//! A job that spans nodes is judged whole only in Prometheus: each node's gpudiag sees its own
//! GPUs, so `gpudiag_gpu_job_info` names every GPU's job with a key all nodes read alike (the
//! Slurm job, torchrun's run id, the master address or the pod; `cluster_key`), and the shipped
//! rules (`assets/prometheus/gpudiag-rules.yml`) join the device series on it. A multi-node job
//! may hold one GPU per node, so the info series is written for a job of one GPU here too, and
//! it is not cut by `--max-process-series`: it is one series per GPU at most.
//!
//! A GPU running processes of two different jobs (time-slicing, MPS) belongs to neither: joined
//! to one, its counters would be read as that job's alone. It gets no info series and is
//! counted in `gpudiag_gpus_shared_by_jobs`.

use std::collections::BTreeMap;

use gpudiag_model::job::{JobId, MissingRank, cluster_key};
use gpudiag_model::prometheus_names::{label, series};

use super::Snapshot;
use super::exposition::{Exposition, Labels};
use gpudiag_model::metric_table::Kind;
use gpudiag_model::sample::{DeviceInfo, ProcessSample, ProcessState, Sample};

/// The job's process on one GPU, where the GPU runs one job's processes only.
struct GpuJob<'a> {
    job: JobId,
    /// The job's process holding the most memory on the GPU: its rank and owners name the GPU.
    process: &'a ProcessSample,
}

/// Whose processes run on a GPU.
enum Owner<'a> {
    /// No process names a job.
    Nobody,
    One(GpuJob<'a>),
    /// Processes of two jobs or more.
    Shared,
}

fn owner_of<'a>(s: &'a Sample, host: Option<&str>) -> Owner<'a> {
    let mut found: Option<GpuJob<'_>> = None;
    for p in s.processes.iter().flatten() {
        let Some(job) = cluster_key(p.attribution.as_ref(), p.launch.as_ref(), host) else {
            continue;
        };
        match &mut found {
            None => found = Some(GpuJob { job, process: p }),
            Some(g) if g.job != job => return Owner::Shared,
            Some(g) => {
                if p.used_memory_bytes > g.process.used_memory_bytes {
                    g.process = p;
                }
            }
        }
    }
    found.map_or(Owner::Nobody, Owner::One)
}

/// The labels every job series starts with: the host, then the job's key and what it is.
fn job_labels(host: Option<&String>, job: &JobId) -> Labels {
    let mut l: Labels = Vec::new();
    if let Some(h) = host {
        l.push((label::HOSTNAME, h.clone()));
    }
    l.push((label::JOB_KEY, job.key.clone()));
    l.push((label::JOINED_BY, job.joined_by.name().to_owned()));
    l
}

/// Writes the job families. `devices` are the devices with a latest sample, with their labels.
pub(super) fn render(
    x: &mut Exposition,
    snap: &Snapshot,
    devices: &[(&DeviceInfo, &Sample, Labels)],
) {
    gpu_job_series(x, snap, devices);
    job_verdict_series(x, snap);
}

/// Which job each GPU's processes belong to, and how many GPUs several jobs share.
fn gpu_job_series(x: &mut Exposition, snap: &Snapshot, devices: &[(&DeviceInfo, &Sample, Labels)]) {
    let host = snap.host.hostname.as_ref();
    let mut info: Vec<(Labels, f64)> = Vec::new();
    let mut shared = 0usize;
    for (d, s, _) in devices {
        match owner_of(s, host.map(String::as_str)) {
            Owner::One(g) => info.push((gpu_job_labels(d, &g, host), 1.0)),
            Owner::Nobody => {}
            Owner::Shared => shared += 1,
        }
    }
    x.family(
        series::GPUDIAG_GPU_JOB_INFO,
        Kind::Gauge,
        "Always 1: the job this GPU's processes belong to, by a key every node of the job reads \
         alike (job_key; joined_by says which: slurm_job, run_id, master_address or pod), with \
         the Slurm job, pod, namespace and the process's global rank where known. Join device \
         series to it on UUID.",
        &info,
    );
    let mut cut: Labels = Vec::new();
    if let Some(h) = host {
        cut.push((label::HOSTNAME, h.clone()));
    }
    x.family(
        series::GPUDIAG_GPUS_SHARED_BY_JOBS,
        Kind::Gauge,
        "GPUs running processes of more than one job (time-slicing, MPS): they have no \
         gpudiag_gpu_job_info series, since their counters are no one job's; 0 when none.",
        &[(cut, shared as f64)],
    );
}

/// The rules join on `UUID`; `gpu` and `Hostname` say where the GPU is.
fn gpu_job_labels(d: &DeviceInfo, g: &GpuJob<'_>, host: Option<&String>) -> Labels {
    let mut l: Labels = Vec::new();
    if let Some(u) = &d.uuid {
        l.push((label::UUID, u.clone()));
    }
    l.push((label::GPU, d.index.to_string()));
    if let Some(h) = host {
        l.push((label::HOSTNAME, h.clone()));
    }
    l.push((label::JOB_KEY, g.job.key.clone()));
    l.push((label::JOINED_BY, g.job.joined_by.name().to_owned()));
    let a = g.process.attribution.as_ref();
    if let Some(job) = a.and_then(|a| a.job.as_ref()) {
        l.push((label::SLURM_JOB, job.id.clone()));
    }
    if let Some(pod) = a.and_then(|a| a.pod.as_ref()) {
        if let Some(name) = &pod.name {
            l.push((label::POD, name.clone()));
        }
        if let Some(ns) = &pod.namespace {
            l.push((label::NAMESPACE, ns.clone()));
        }
    }
    if let Some(rank) = g.process.launch.as_ref().and_then(|l| l.rank) {
        l.push((label::RANK, rank.to_string()));
    }
    l
}

/// One series per job judged here, its state in bounded labels: seven verdicts and three
/// confidences; and one per GPU of it that plays a part in the verdict (a straggler, waiting
/// for one, or missing from a stalled job), so several stragglers are each named and the GPUs
/// waiting for them are seen. A stalled job also says how long it has made no progress and,
/// per rank its GPUs wait for, that rank's pid and process state: few series, and only while
/// the job is stuck. Free text (title, advice) never becomes a label.
fn job_verdict_series(x: &mut Exposition, snap: &Snapshot) {
    let host = snap.host.hostname.as_ref();
    let mut verdicts: Vec<(Labels, f64)> = Vec::new();
    let mut roles: Vec<(Labels, f64)> = Vec::new();
    let mut waits: Vec<(Labels, f64)> = Vec::new();
    let mut stuck: Vec<(Labels, f64)> = Vec::new();
    let mut missing: Vec<(Labels, f64)> = Vec::new();
    let mut missing_seen = std::collections::BTreeSet::new();
    // Two jobs may not give one series twice: Prometheus would reject the whole scrape.
    let mut seen = std::collections::BTreeSet::new();
    let mut gpus_seen = std::collections::BTreeSet::new();
    let uuids: BTreeMap<u32, &String> = snap
        .devices
        .iter()
        .filter_map(|d| Some((d.index, d.uuid.as_ref()?)))
        .collect();
    for j in &snap.jobs {
        if !seen.insert(&j.job) {
            continue;
        }
        let base = job_labels(host, &j.job);
        let mut l = base.clone();
        l.push((label::VERDICT, j.verdict.name().to_owned()));
        l.push((label::CONFIDENCE, j.confidence.to_string()));
        verdicts.push((l, 1.0));
        for m in &j.members {
            let Some(role) = m.role else { continue };
            if !gpus_seen.insert((&j.job, m.device)) {
                continue;
            }
            let mut l = base.clone();
            // The verdict's own UUID for the member, else the device's.
            if let Some(u) = m.uuid.as_ref().or_else(|| uuids.get(&m.device).copied()) {
                l.push((label::UUID, u.clone()));
            }
            l.push((label::GPU, m.device.to_string()));
            l.push((label::ROLE, role.name().to_owned()));
            roles.push((l, 1.0));
        }
        // The first straggler sets the pace most: its peers' wait is the job's.
        if let Some(share) = j.stragglers.first().and_then(|s| s.peers_wait_share) {
            waits.push((base.clone(), share));
        }
        let Some(stall) = j.stall.as_ref().filter(|_| j.verdict.stalled()) else {
            continue;
        };
        stuck.push((base.clone(), stall.stuck_s));
        for r in &stall.missing {
            if !missing_seen.insert((&j.job, r.device, r.pid)) {
                continue;
            }
            let mut l = base.clone();
            let member_uuid = j
                .members
                .iter()
                .find(|m| m.device == r.device)
                .and_then(|m| m.uuid.as_ref());
            if let Some(u) = member_uuid.or_else(|| uuids.get(&r.device).copied()) {
                l.push((label::UUID, u.clone()));
            }
            l.push((label::GPU, r.device.to_string()));
            if let Some(rank) = r.rank {
                l.push((label::RANK, rank.to_string()));
            }
            l.push((label::PID, r.pid.to_string()));
            if let Some(state) = missing_state(r) {
                l.push((label::STATE, state.to_owned()));
            }
            missing.push((l, 1.0));
        }
        // A rank that must run here and does not (gone before gpudiag looked): no GPU, no pid.
        for &rank in &stall.absent_ranks {
            let mut l = base.clone();
            l.push((label::RANK, rank.to_string()));
            l.push((label::STATE, "absent".to_owned()));
            missing.push((l, 1.0));
        }
    }
    x.family(
        series::GPUDIAG_JOB_VERDICT,
        Kind::Gauge,
        "1 for the verdict on each job of two or more GPUs on this host, judged by comparing its \
         GPUs (straggler, communication_bound, imbalanced, balanced) or finding it makes no \
         progress (hung, rank_exited, rank_stopped), with its confidence. Which GPUs straggle, \
         wait or are missing: gpudiag_job_gpu_role.",
        &verdicts,
    );
    x.family(
        series::GPUDIAG_JOB_GPU_ROLE,
        Kind::Gauge,
        "1 for each GPU of a job judged on this host that plays a part in its verdict: role \
         straggler (the others wait for it; a job may have several), waiting (it waits for the \
         stragglers much of the time, or sits in a collective of a stalled job) or missing (the \
         GPU of the rank a stalled job waits for). GPUs with no part have no series.",
        &roles,
    );
    x.family(
        series::GPUDIAG_JOB_STUCK_SECONDS,
        Kind::Gauge,
        "How long (s) a job judged on this host has made no progress: its GPUs sit in \
         collectives that move nothing (verdict hung, rank_exited or rank_stopped). Absent while \
         the job makes progress.",
        &stuck,
    );
    x.family(
        series::GPUDIAG_JOB_MISSING_RANK_INFO,
        Kind::Gauge,
        "Always 1: a rank a stalled job's GPUs wait for, on this host: its GPU, global rank \
         (where known), host pid and process state (sleeping, stopped, disk_sleep, running, \
         zombie, ... or exited once its process left; absent, with no GPU or pid, for a rank \
         that must run on this host and was never seen). Absent while the job makes progress.",
        &missing,
    );
    x.family(
        series::GPUDIAG_JOB_PEERS_WAIT_RATIO,
        Kind::Gauge,
        "The estimated share of the time (0 to 1) this job's other GPUs on this host wait for its \
         straggler (the one setting the pace most, where there are several); absent when no \
         straggler is named or the share could not be estimated.",
        &waits,
    );
}

/// A missing rank's process state as a label value: `exited` once its process left the GPU,
/// else the state read; none when neither was read.
fn missing_state(r: &MissingRank) -> Option<&'static str> {
    if r.left_ms.is_some() {
        return Some("exited");
    }
    r.state.map(ProcessState::name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus::render;
    use gpudiag_model::attribution::{Attribution, FoundIn, PodIdentity, SlurmJob};
    use gpudiag_model::job::{
        GpuRole, JobMember, JobPattern, JobVerdict, JoinedBy, Launch, Pace, Stall, Straggler,
    };
    use gpudiag_model::sample::HostInfo;
    use gpudiag_model::verdict::Confidence;
    use std::time::Instant;

    fn process(
        pid: u32,
        bytes: u64,
        attribution: Option<Attribution>,
        launch: Option<Launch>,
    ) -> ProcessSample {
        ProcessSample {
            pid,
            name: Some("python3".into()),
            user: Some("carol".into()),
            kind: Some("compute".into()),
            used_memory_bytes: Some(bytes),
            sm_util_pct: Some(40.0),
            container_id: None,
            container_pid: None,
            cpu_time_s: None,
            attribution,
            launch,
            state: None,
            started_ms: None,
        }
    }

    fn slurm(id: &str) -> Option<Attribution> {
        Some(Attribution {
            job: Some(SlurmJob {
                id: id.into(),
                step: Some("0".into()),
                user: Some("carol".into()),
                found_in: FoundIn::Cgroup,
            }),
            ..Attribution::default()
        })
    }

    fn ranked(rank: u32) -> Option<Launch> {
        Some(Launch {
            run_id: Some("rdzv-1".into()),
            rank: Some(rank),
            local_rank: Some(rank % 2),
            ..Launch::default()
        })
    }

    /// GPU 0 and 1: ranks of Slurm job 9001; GPU 2: a pod's one-GPU job; GPU 3: two jobs
    /// time-sliced; GPU 4: a process naming no job; GPU 5: a torchrun job outside Slurm.
    fn snapshot() -> Snapshot {
        let devices: Vec<DeviceInfo> = (0..6)
            .map(|index| DeviceInfo {
                index,
                uuid: Some(format!("GPU-{index}")),
                ..DeviceInfo::default()
            })
            .collect();
        let pod = Attribution {
            pod: Some(PodIdentity {
                name: Some("train-\"0\"".into()),
                namespace: Some("ml".into()),
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        };
        let procs: [Vec<ProcessSample>; 6] = [
            vec![
                process(10, 1 << 30, slurm("9001"), ranked(8)),
                // A helper of the same job holding less: the rank stays the trainer's.
                process(11, 1 << 20, slurm("9001"), ranked(99)),
            ],
            vec![process(12, 1 << 30, slurm("9001"), ranked(9))],
            vec![process(20, 1 << 30, Some(pod), None)],
            vec![
                process(30, 1 << 30, slurm("1"), None),
                process(31, 1 << 30, slurm("2"), None),
            ],
            vec![process(40, 1 << 30, Some(Attribution::default()), None)],
            vec![process(50, 1 << 30, None, ranked(3))],
        ];
        let latest = procs
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut s = Sample::new(i as u32, 1000);
                s.gpu_util_pct = Some(90.0);
                s.processes = Some(p);
                (i as u32, s)
            })
            .collect();
        Snapshot {
            host: HostInfo {
                hostname: Some("node-a".into()),
                ..HostInfo::default()
            },
            devices,
            latest,
            // A cap of one process must not cut the job series.
            process_cap: crate::prometheus::process_series::ProcessCap(1),
            jobs: vec![verdict()],
            ..Snapshot::default()
        }
    }

    fn verdict() -> JobVerdict {
        JobVerdict {
            job: JobId {
                joined_by: JoinedBy::SlurmJob,
                key: "9001".into(),
            },
            presumed: false,
            members: [0u32, 1]
                .iter()
                .map(|&device| JobMember {
                    device,
                    uuid: Some(format!("GPU-{device}")),
                    pid: 10 + device,
                    name: None,
                    rank: Some(8 + device),
                    local_rank: None,
                    role: Some(if device == 1 {
                        GpuRole::Straggler
                    } else {
                        GpuRole::Waiting
                    }),
                })
                .collect(),
            verdict: JobPattern::Straggler,
            confidence: Confidence::High,
            start_ms: 0,
            end_ms: 1000,
            title: "GPU 1 leads".into(),
            advice: "a".into(),
            stragglers: vec![Straggler {
                device: 1,
                rank: Some(9),
                pace: Pace::Leads,
                metric: "sm_active_pct".into(),
                value: 90.0,
                peers_median: 45.0,
                peers_wait_share: Some(0.5),
                wait_estimate: "e".into(),
                differs: Vec::new(),
            }],
            doubts: Vec::new(),
            stall: None,
            peers: Vec::new(),
            ras: None,
            evidence: serde_json::Map::new(),
        }
    }

    fn lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    }

    #[test]
    fn every_gpu_of_a_job_names_it_and_shared_gpus_are_counted() {
        let text = render(&snapshot(), Instant::now());
        assert_eq!(
            lines(&text, series::GPUDIAG_GPU_JOB_INFO),
            [
                "gpudiag_gpu_job_info{UUID=\"GPU-0\",gpu=\"0\",Hostname=\"node-a\",\
                 job_key=\"9001\",joined_by=\"slurm_job\",slurm_job=\"9001\",rank=\"8\"} 1",
                "gpudiag_gpu_job_info{UUID=\"GPU-1\",gpu=\"1\",Hostname=\"node-a\",\
                 job_key=\"9001\",joined_by=\"slurm_job\",slurm_job=\"9001\",rank=\"9\"} 1",
                // A job of one GPU here may be one rank of a job across nodes; label values
                // are escaped.
                "gpudiag_gpu_job_info{UUID=\"GPU-2\",gpu=\"2\",Hostname=\"node-a\",\
                 job_key=\"ml/train-\\\"0\\\"\",joined_by=\"pod\",pod=\"train-\\\"0\\\"\",\
                 namespace=\"ml\"} 1",
                "gpudiag_gpu_job_info{UUID=\"GPU-5\",gpu=\"5\",Hostname=\"node-a\",\
                 job_key=\"rdzv-1\",joined_by=\"run_id\",rank=\"3\"} 1",
            ]
        );
        assert_eq!(
            lines(&text, series::GPUDIAG_GPUS_SHARED_BY_JOBS),
            ["gpudiag_gpus_shared_by_jobs{Hostname=\"node-a\"} 1"]
        );
        assert!(text.contains("# TYPE gpudiag_gpu_job_info gauge"));
    }

    #[test]
    fn the_job_verdict_and_each_gpus_role_name_the_straggler_and_who_waits() {
        let text = render(&snapshot(), Instant::now());
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_VERDICT),
            ["gpudiag_job_verdict{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",verdict=\"straggler\",confidence=\"high\"} 1"]
        );
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_GPU_ROLE),
            [
                "gpudiag_job_gpu_role{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",UUID=\"GPU-0\",gpu=\"0\",role=\"waiting\"} 1",
                "gpudiag_job_gpu_role{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",UUID=\"GPU-1\",gpu=\"1\",role=\"straggler\"} 1",
            ]
        );
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_PEERS_WAIT_RATIO),
            [
                "gpudiag_job_peers_wait_ratio{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\"} 0.5"
            ]
        );
    }

    /// Two GPUs of four lead together: each is named, the other two wait, and the wait ratio
    /// is the first straggler's, the one setting the pace most.
    #[test]
    fn several_stragglers_are_each_named() {
        let mut snap = snapshot();
        let job = &mut snap.jobs[0];
        job.members = (0u32..4)
            .map(|device| JobMember {
                device,
                // A member the verdict knows no UUID of takes its device's.
                uuid: (device != 3).then(|| format!("GPU-{device}")),
                pid: 10 + device,
                name: None,
                rank: Some(device),
                local_rank: None,
                role: Some(if device == 1 || device == 3 {
                    GpuRole::Straggler
                } else {
                    GpuRole::Waiting
                }),
            })
            .collect();
        let mut second = job.stragglers[0].clone();
        second.device = 3;
        second.peers_wait_share = Some(0.3);
        job.stragglers.push(second);
        let text = render(&snap, Instant::now());
        let roles: Vec<(String, String)> = lines(&text, series::GPUDIAG_JOB_GPU_ROLE)
            .iter()
            .map(|l| {
                let value = |name: &str| {
                    let from = l.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                    l[from..].split('"').next().unwrap().to_owned()
                };
                (value("UUID"), value("role"))
            })
            .collect();
        let pair = |u: &str, r: &str| (u.to_owned(), r.to_owned());
        assert_eq!(
            roles,
            [
                pair("GPU-0", "waiting"),
                pair("GPU-1", "straggler"),
                pair("GPU-2", "waiting"),
                pair("GPU-3", "straggler"),
            ]
        );
        assert!(
            text.contains(
                "gpudiag_job_peers_wait_ratio{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\"} 0.5"
            ),
            "{text}"
        );
        assert!(!text.contains("straggler_gpu") && !text.contains("straggler_UUID"));
    }

    #[test]
    fn a_balanced_job_has_no_roles_nor_wait_ratio() {
        let mut snap = snapshot();
        snap.jobs[0].verdict = JobPattern::Balanced;
        snap.jobs[0].stragglers.clear();
        for m in &mut snap.jobs[0].members {
            m.role = None;
        }
        // The same job twice must not write a series twice.
        snap.jobs.push(snap.jobs[0].clone());
        let text = render(&snap, Instant::now());
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_VERDICT),
            ["gpudiag_job_verdict{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",verdict=\"balanced\",confidence=\"high\"} 1"]
        );
        assert!(!text.contains("# TYPE gpudiag_job_gpu_role"));
        assert!(!text.contains("# TYPE gpudiag_job_peers_wait_ratio"));
    }

    /// Job 9001 of four GPUs hung: GPUs 0 to 2 wait in a collective for rank 11, asleep on GPU
    /// 3 (a member the verdict knows no UUID of: its device's is used); and a second job,
    /// rank_exited, whose missing rank's process left and whose other missing rank's state
    /// was not read.
    fn stalled() -> Snapshot {
        let mut snap = snapshot();
        snap.devices.extend((6..8).map(|index| DeviceInfo {
            index,
            uuid: Some(format!("GPU-{index}")),
            ..DeviceInfo::default()
        }));
        let job = &mut snap.jobs[0];
        job.verdict = JobPattern::Hung;
        job.stragglers.clear();
        job.members = (0u32..4)
            .map(|device| JobMember {
                device,
                uuid: (device != 3).then(|| format!("GPU-{device}")),
                pid: 10 + device,
                name: None,
                rank: Some(8 + device),
                local_rank: None,
                role: Some(if device == 3 {
                    GpuRole::Missing
                } else {
                    GpuRole::Waiting
                }),
            })
            .collect();
        job.stall = Some(Stall {
            since_ms: 1_000,
            stuck_s: 41.5,
            waiting: vec![0, 1, 2],
            missing: vec![MissingRank {
                device: 3,
                rank: Some(11),
                pid: 13,
                state: Some(ProcessState::Sleeping),
                left_ms: None,
                since_ms: Some(1_000),
                cpu_pct: Some(0.0),
                inspect: Some("py-spy dump --pid 13".into()),
            }],
            absent_ranks: Vec::new(),
            stuck_power_w: Some(500.0),
            working_power_w: Some(2400.0),
        });
        let mut exited = job.clone();
        exited.job = JobId {
            joined_by: JoinedBy::RunId,
            key: "rdzv-2".into(),
        };
        exited.verdict = JobPattern::RankExited;
        exited.members = Vec::new();
        let stall = exited.stall.as_mut().unwrap();
        stall.stuck_s = 20.0;
        stall.missing = vec![
            MissingRank {
                device: 6,
                rank: None,
                pid: 60,
                state: None,
                left_ms: Some(900),
                since_ms: None,
                cpu_pct: None,
                inspect: None,
            },
            MissingRank {
                device: 7,
                rank: Some(1),
                pid: 70,
                state: None,
                left_ms: None,
                since_ms: None,
                cpu_pct: None,
                inspect: None,
            },
        ];
        snap.jobs.push(exited);
        snap
    }

    #[test]
    fn a_stalled_job_says_how_long_and_names_its_missing_rank() {
        let text = render(&stalled(), Instant::now());
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_VERDICT),
            [
                "gpudiag_job_verdict{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",verdict=\"hung\",confidence=\"high\"} 1",
                "gpudiag_job_verdict{Hostname=\"node-a\",job_key=\"rdzv-2\",\
                 joined_by=\"run_id\",verdict=\"rank_exited\",confidence=\"high\"} 1",
            ]
        );
        let roles = lines(&text, series::GPUDIAG_JOB_GPU_ROLE);
        assert_eq!(roles.len(), 4, "{roles:?}");
        assert_eq!(
            roles[3],
            "gpudiag_job_gpu_role{Hostname=\"node-a\",job_key=\"9001\",\
             joined_by=\"slurm_job\",UUID=\"GPU-3\",gpu=\"3\",role=\"missing\"} 1"
        );
        assert!(roles[..3].iter().all(|l| l.contains("role=\"waiting\"")));
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_STUCK_SECONDS),
            [
                "gpudiag_job_stuck_seconds{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\"} 41.5",
                "gpudiag_job_stuck_seconds{Hostname=\"node-a\",job_key=\"rdzv-2\",\
                 joined_by=\"run_id\"} 20",
            ]
        );
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_MISSING_RANK_INFO),
            [
                "gpudiag_job_missing_rank_info{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",UUID=\"GPU-3\",gpu=\"3\",rank=\"11\",pid=\"13\",\
                 state=\"sleeping\"} 1",
                // Gone from the GPU: exited, whatever state was last read.
                "gpudiag_job_missing_rank_info{Hostname=\"node-a\",job_key=\"rdzv-2\",\
                 joined_by=\"run_id\",UUID=\"GPU-6\",gpu=\"6\",pid=\"60\",\
                 state=\"exited\"} 1",
                // A state not read is no label, never a guess.
                "gpudiag_job_missing_rank_info{Hostname=\"node-a\",job_key=\"rdzv-2\",\
                 joined_by=\"run_id\",UUID=\"GPU-7\",gpu=\"7\",rank=\"1\",pid=\"70\"} 1",
            ]
        );
        assert!(text.contains("# TYPE gpudiag_job_stuck_seconds gauge"));
        assert!(!text.contains("# TYPE gpudiag_job_peers_wait_ratio"));
    }

    /// A rank that must run here and was never seen is named by rank alone.
    #[test]
    fn an_absent_rank_is_a_missing_rank_without_gpu_or_pid() {
        let mut snap = stalled();
        snap.jobs.truncate(1);
        let stall = snap.jobs[0].stall.as_mut().unwrap();
        stall.missing.clear();
        stall.absent_ranks = vec![1, 3];
        let text = render(&snap, Instant::now());
        assert_eq!(
            lines(&text, series::GPUDIAG_JOB_MISSING_RANK_INFO),
            [
                "gpudiag_job_missing_rank_info{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",rank=\"1\",state=\"absent\"} 1",
                "gpudiag_job_missing_rank_info{Hostname=\"node-a\",job_key=\"9001\",\
                 joined_by=\"slurm_job\",rank=\"3\",state=\"absent\"} 1",
            ]
        );
    }

    /// Every stalled pattern, and the missing role, reach the exposition by their names.
    #[test]
    fn every_stalled_verdict_and_role_flows_through() {
        for pattern in JobPattern::ALL.into_iter().filter(|p| p.stalled()) {
            let mut snap = stalled();
            snap.jobs.truncate(1);
            snap.jobs[0].verdict = pattern;
            let text = render(&snap, Instant::now());
            assert!(
                text.contains(&format!("verdict=\"{}\"", pattern.name())),
                "{pattern}: {text}"
            );
            assert_eq!(lines(&text, series::GPUDIAG_JOB_STUCK_SECONDS).len(), 1);
            assert_eq!(lines(&text, series::GPUDIAG_JOB_MISSING_RANK_INFO).len(), 1);
        }
        for role in GpuRole::ALL {
            let mut snap = stalled();
            snap.jobs[0].members[0].role = Some(role);
            let text = render(&snap, Instant::now());
            assert!(
                text.contains(&format!("gpu=\"0\",role=\"{}\"", role.name())),
                "{role:?}"
            );
        }
    }

    /// A job that made progress again writes neither series, even where a stale stall was kept.
    #[test]
    fn a_job_that_makes_progress_has_no_stall_series() {
        let mut snap = stalled();
        for j in &mut snap.jobs {
            j.verdict = JobPattern::Balanced;
        }
        let text = render(&snap, Instant::now());
        assert!(!text.contains("# TYPE gpudiag_job_stuck_seconds"), "{text}");
        assert!(
            !text.contains("# TYPE gpudiag_job_missing_rank_info"),
            "{text}"
        );
    }

    #[test]
    fn nothing_shared_reads_zero_and_no_job_writes_no_info() {
        let snap = Snapshot {
            host: HostInfo {
                hostname: Some("node-b".into()),
                ..HostInfo::default()
            },
            ..Snapshot::default()
        };
        let text = render(&snap, Instant::now());
        assert!(lines(&text, series::GPUDIAG_GPU_JOB_INFO).is_empty());
        assert!(!text.contains("# TYPE gpudiag_job_verdict"));
        assert_eq!(
            lines(&text, series::GPUDIAG_GPUS_SHARED_BY_JOBS),
            ["gpudiag_gpus_shared_by_jobs{Hostname=\"node-b\"} 0"]
        );
    }
}
