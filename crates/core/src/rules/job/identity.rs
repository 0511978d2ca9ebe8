//! Which GPU processes form one job, and what makes a grouping doubtful.
//!
//! A job is the GPUs whose processes share a key, strongest first: a Slurm job, a torchrun run
//! id, a master address (qualified by host and network namespace where it names no one place:
//! see `cluster_key`), a pod, the command `gpudiag run` started, one parent whose children's
//! command lines say they are its workers (torchrun, `torch.multiprocessing`, a fork), or one
//! process on several GPUs. A sweep agent, a notebook kernel or a shell start independent runs
//! of one python: their children are never one job on that alone. Where nothing could be read
//! (another user's environment and command line, a recording made before gpudiag looked), the
//! processes of one parent or executable form a presumed job, and its verdict says so.
//! Processes of different users are never one job but by a key every rank carries.

use std::collections::{BTreeMap, BTreeSet};

use crate::rules::process_state::{ProcessLaunch, ProcessMemory, SeenProcess};
use gpudiag_model::job::{JobId, JobMember, JoinedBy, WorkerOf};
use gpudiag_model::sample::TimeMs;

/// The job a process belongs to, by the strongest key it has; `None` where nothing could be
/// read, so only its parent or executable can place it.
fn key_of(pid: u32, p: &SeenProcess, command: &BTreeSet<u32>) -> Option<JobId> {
    if let Some(key) = &p.cluster {
        return Some(key.clone());
    }
    let launch = p.launch.as_ref();
    let id = |joined_by, key: String| Some(JobId { joined_by, key });
    if command.contains(&pid) {
        return id(JoinedBy::Command, "run".to_owned());
    }
    if let Some(l) = launch
        && let Some(parent) = l.parent_pid.filter(|&p| p > 1)
        && l.worker_of.is_some_and(WorkerOf::is_worker)
    {
        return id(JoinedBy::Parent, parent.to_string());
    }
    // Its environment or its command line was read and named no job: a run of its own.
    let looked = launch.is_some_and(|l| {
        !l.absent.contains_key("environ") || l.worker_of == Some(WorkerOf::Nobody)
    });
    looked.then(|| JobId {
        joined_by: JoinedBy::Process,
        key: pid.to_string(),
    })
}

/// A presumed job's key where no launcher key could be read. The parent's pid is readable in
/// another user's `/proc/PID/stat` where the environment is not: processes of one parent are
/// likely one job's ranks, and processes of different parents likely not (two users' runs of
/// one python). Without a parent (a recording made before gpudiag looked), the executable.
fn presumed_key(p: &SeenProcess) -> JobId {
    let launch = p.launch.as_ref();
    let key = match launch.and_then(|l| l.parent_pid).filter(|&pid| pid > 1) {
        Some(parent) => format!("children of pid {parent}"),
        None => launch
            .and_then(|l| l.exe.clone())
            .or_else(|| p.name.clone())
            .unwrap_or_else(|| "an unknown executable".to_owned()),
    };
    JobId {
        joined_by: JoinedBy::SameExecutable,
        key,
    }
}

/// Whether a key ties processes only because they share a parent or an executable, so the
/// processes of two users under it are two jobs.
fn split_by_user(joined_by: JoinedBy) -> bool {
    matches!(joined_by, JoinedBy::Parent | JoinedBy::SameExecutable)
}

/// The jobs of two or more GPUs among the processes seen in `[start, end]`: each job's GPUs,
/// with the job's process on each (the one holding the most memory, where several do).
pub(crate) fn group(
    launches: &ProcessLaunch,
    memory: Option<&ProcessMemory>,
    start: TimeMs,
    end: TimeMs,
    command: &BTreeSet<u32>,
) -> BTreeMap<JobId, Vec<JobMember>> {
    group_of_at_least(launches, memory, start, end, command, 2)
}

/// As [`group`], with the jobs of one GPU too: a rank left alone by peers that are gone.
pub(crate) fn group_with_lone_ranks(
    launches: &ProcessLaunch,
    memory: Option<&ProcessMemory>,
    start: TimeMs,
    end: TimeMs,
    command: &BTreeSet<u32>,
) -> BTreeMap<JobId, Vec<JobMember>> {
    group_of_at_least(launches, memory, start, end, command, 1)
}

/// The ranks of a job that no process on this host carries, where they all must run here: every
/// member's launcher says the ranks meet at a loopback address, which a rank on another host
/// cannot reach. Empty where that cannot be told (a rank or the world size unread, world sizes
/// that disagree, a master address that names a host).
pub(crate) fn absent_ranks(members: &[JobMember], launches: &ProcessLaunch) -> AbsentRanks {
    // More ranks than this on one host is not a job gpudiag could have seen whole.
    const MAX_LOCAL_WORLD: u32 = 1024;
    let none = AbsentRanks::default();
    let mut world = None;
    let mut master = None;
    let mut seen = BTreeSet::new();
    for m in members {
        let Some(launch) = launches
            .seen
            .get(&(m.device, m.pid))
            .and_then(|p| p.launch.as_ref())
        else {
            return none;
        };
        let (Some(rank), Some(w), Some(addr)) =
            (m.rank, launch.world_size, launch.master_addr.as_deref())
        else {
            return none;
        };
        if !is_loopback(addr) || world.is_some_and(|x| x != w) {
            return none;
        }
        world = Some(w);
        master.get_or_insert_with(|| addr.to_owned());
        seen.insert(rank);
    }
    match (world, master) {
        (Some(world), Some(master)) if world <= MAX_LOCAL_WORLD => AbsentRanks {
            ranks: (0..world).filter(|r| !seen.contains(r)).collect(),
            world,
            master,
        },
        _ => none,
    }
}

/// Ranks a job lacks on this host (see [`absent_ranks`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AbsentRanks {
    pub(crate) ranks: Vec<u32>,
    pub(crate) world: u32,
    /// The loopback address the ranks meet at, as the launcher wrote it.
    pub(crate) master: String,
}

fn is_loopback(addr: &str) -> bool {
    let bare = addr.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn group_of_at_least(
    launches: &ProcessLaunch,
    memory: Option<&ProcessMemory>,
    start: TimeMs,
    end: TimeMs,
    command: &BTreeSet<u32>,
    min_gpus: usize,
) -> BTreeMap<JobId, Vec<JobMember>> {
    let held = |device: u32, pid: u32| {
        memory
            .map(|m| m.holders_in(device, start, end, 0.0))
            .and_then(|h| h.into_iter().find(|(p, _, _)| *p == pid).map(|(_, _, b)| b))
            .unwrap_or(0.0)
    };
    type ByDevice = BTreeMap<u32, (f64, JobMember)>;
    let mut jobs: BTreeMap<(JobId, Option<String>), ByDevice> = BTreeMap::new();
    for (&(device, pid), p) in launches.within(start, end) {
        let key = key_of(pid, p, command).unwrap_or_else(|| presumed_key(p));
        let user = split_by_user(key.joined_by)
            .then(|| p.user.clone())
            .flatten();
        let member = JobMember {
            device,
            uuid: None,
            pid,
            name: p.name.clone(),
            rank: p.launch.as_ref().and_then(|l| l.rank),
            local_rank: p.launch.as_ref().and_then(|l| l.local_rank),
            role: None,
        };
        let bytes = held(device, pid);
        let on_device = jobs.entry((key, user)).or_default();
        match on_device.get(&device) {
            Some((most, _)) if *most >= bytes => {}
            _ => {
                on_device.insert(device, (bytes, member));
            }
        }
    }
    let mut users_of: BTreeMap<JobId, usize> = BTreeMap::new();
    for (key, _) in jobs.keys() {
        *users_of.entry(key.clone()).or_default() += 1;
    }
    jobs.into_iter()
        .filter(|(_, gpus)| gpus.len() >= min_gpus)
        .map(|((mut key, user), gpus)| {
            if users_of.get(&key).is_some_and(|&n| n > 1) {
                key.key = format!("{}, user {}", key.key, user.as_deref().unwrap_or("unknown"));
            }
            (key, gpus.into_values().map(|(_, m)| m).collect())
        })
        .collect()
}

/// What the launcher variables of a job's processes contradict, in words: a rank claimed twice,
/// different world sizes, more processes than the world size. One process on several GPUs
/// carries one rank, so processes are counted once.
pub(crate) fn doubts(members: &[JobMember], launches: &ProcessLaunch) -> Vec<String> {
    /// One process's GPUs, rank and world size.
    #[derive(Default)]
    struct Claim {
        devices: Vec<u32>,
        rank: Option<u32>,
        world: Option<u32>,
    }
    let mut by_pid: BTreeMap<u32, Claim> = BTreeMap::new();
    for m in members {
        let launch = launches
            .seen
            .get(&(m.device, m.pid))
            .and_then(|p| p.launch.as_ref());
        let entry = by_pid.entry(m.pid).or_default();
        entry.devices.push(m.device);
        entry.rank = entry.rank.or(m.rank);
        entry.world = entry.world.or(launch.and_then(|l| l.world_size));
    }
    let mut out = Vec::new();
    let mut claims: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for claim in by_pid.values() {
        if let Some(r) = claim.rank {
            claims.entry(r).or_default().extend(&claim.devices);
        }
    }
    for (rank, devices) in claims.iter().filter(|(_, d)| d.len() > 1) {
        out.push(format!(
            "rank {rank} is claimed by the processes on GPUs {}",
            list(devices)
        ));
    }
    let sizes: BTreeSet<u32> = by_pid.values().filter_map(|c| c.world).collect();
    let sizes: Vec<u32> = sizes.into_iter().collect();
    match sizes.as_slice() {
        [] => {}
        &[world] => {
            let processes = by_pid.len();
            if processes > world as usize {
                out.push(format!("{processes} processes for a world size of {world}"));
            }
            let outside: Vec<u32> = claims.keys().copied().filter(|&r| r >= world).collect();
            if !outside.is_empty() {
                out.push(format!(
                    "rank {} is outside a world size of {world}",
                    list(&outside)
                ));
            }
        }
        several => out.push(format!(
            "its processes report different world sizes ({})",
            list(several)
        )),
    }
    out
}

/// "2", "2 and 6", "1, 2 and 3".
pub(crate) fn list(items: &[u32]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!(
            "{} and {last}",
            init.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::attribution::{Attribution, FoundIn, SlurmJob};
    use gpudiag_model::job::Launch;
    use gpudiag_model::job::WorkerOf;
    use gpudiag_model::sample::{ProcessSample, Sample};

    const PYTHON: &str = "/usr/bin/python3.12";

    fn launch(parent: u32, parent_exe: &str, exe: &str) -> Launch {
        Launch {
            parent_pid: Some(parent),
            exe: Some(exe.into()),
            parent_exe: Some(parent_exe.into()),
            ..Launch::default()
        }
    }

    fn process(pid: u32, launch: Option<Launch>) -> ProcessSample {
        ProcessSample {
            pid,
            name: Some("python3".into()),
            user: None,
            kind: Some("compute".into()),
            used_memory_bytes: Some(1 << 30),
            sm_util_pct: None,
            container_id: None,
            container_pid: None,
            cpu_time_s: None,
            attribution: None,
            launch,
            state: None,
            started_ms: None,
        }
    }

    /// Groups processes, one a GPU in order, as seen in one sample each.
    fn jobs_of(processes: Vec<ProcessSample>) -> BTreeMap<JobId, Vec<JobMember>> {
        let mut launches = ProcessLaunch::default();
        for (device, p) in processes.into_iter().enumerate() {
            launches.observe(
                &Sample {
                    processes: Some(vec![p]),
                    ..Sample::new(device as u32, 1_000)
                },
                None,
            );
        }
        group(&launches, None, 0, 2_000, &BTreeSet::new())
    }

    fn joined(jobs: &BTreeMap<JobId, Vec<JobMember>>) -> Vec<(JoinedBy, Vec<u32>)> {
        jobs.iter()
            .map(|(id, m)| (id.joined_by, m.iter().map(|m| m.device).collect()))
            .collect()
    }

    #[test]
    fn torchrun_ranks_are_one_job_by_run_id_and_a_default_id_falls_to_the_master() {
        let rank = |pid, run: &str| {
            let mut l = launch(100, PYTHON, PYTHON);
            l.run_id = Some(run.into());
            l.master_addr = Some("node-0".into());
            l.master_port = Some("29500".into());
            process(pid, Some(l))
        };
        let jobs = jobs_of(vec![rank(101, "7f3c"), rank(102, "7f3c")]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::RunId, vec![0, 1])]);
        let jobs = jobs_of(vec![rank(101, "none"), rank(102, "none")]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::MasterAddress, vec![0, 1])]);
        assert_eq!(jobs.keys().next().unwrap().key, "node-0:29500");
    }

    #[test]
    fn a_shared_shell_or_init_never_joins_jobs() {
        // Two trainings started from one shell, and two under init: four jobs of one GPU.
        let jobs = jobs_of(vec![
            process(11, Some(launch(10, "/usr/bin/bash", PYTHON))),
            process(12, Some(launch(10, "/usr/bin/bash", PYTHON))),
            process(21, Some(launch(1, "/sbin/init", PYTHON))),
            process(22, Some(launch(1, "/sbin/init", PYTHON))),
        ]);
        assert!(jobs.is_empty(), "{jobs:?}");
        // tmux runs a shell too; its server is not python either.
        let jobs = jobs_of(vec![
            process(31, Some(launch(30, "/usr/bin/tmux", PYTHON))),
            process(32, Some(launch(30, "/usr/bin/tmux", PYTHON))),
        ]);
        assert!(jobs.is_empty(), "{jobs:?}");
    }

    fn worker(pid: u32, parent: u32, of: WorkerOf, user: &str) -> ProcessSample {
        let mut l = launch(parent, PYTHON, PYTHON);
        l.worker_of = Some(of);
        let mut p = process(pid, Some(l));
        p.user = Some(user.into());
        p
    }

    #[test]
    fn children_whose_command_lines_name_their_launcher_are_one_job() {
        // torch.multiprocessing.spawn: the children set MASTER_ADDR after they start, so their
        // environment names no job; their command lines say whose workers they are.
        let jobs = jobs_of(vec![
            worker(41, 40, WorkerOf::Multiprocessing, "alice"),
            worker(42, 40, WorkerOf::Multiprocessing, "alice"),
        ]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::Parent, vec![0, 1])]);
        assert_eq!(jobs.keys().next().unwrap().key, "40");
    }

    #[test]
    fn a_sweep_agents_or_a_notebooks_children_are_runs_of_their_own() {
        // A python parent of independent python children: their command lines name no
        // launcher and their environments no job, so each is a run of its own.
        let jobs = jobs_of(vec![
            worker(41, 40, WorkerOf::Nobody, "alice"),
            worker(42, 40, WorkerOf::Nobody, "alice"),
            worker(43, 40, WorkerOf::Nobody, "bob"),
        ]);
        assert!(jobs.is_empty(), "{jobs:?}");
        // A recording made before command lines were read: the same parent and executable no
        // longer tie them (a sweep looks the same), the environment was read: each its own.
        let jobs = jobs_of(vec![
            process(51, Some(launch(50, PYTHON, PYTHON))),
            process(52, Some(launch(50, PYTHON, PYTHON))),
        ]);
        assert!(jobs.is_empty(), "{jobs:?}");
    }

    #[test]
    fn processes_of_two_users_are_never_one_presumed_job() {
        let hidden = |pid, user: &str| {
            let mut l = Launch {
                parent_pid: Some(80),
                ..Launch::default()
            };
            l.absent
                .insert("environ".into(), "another user's process".into());
            let mut p = process(pid, Some(l));
            p.user = Some(user.into());
            p
        };
        let jobs = jobs_of(vec![
            hidden(81, "alice"),
            hidden(82, "alice"),
            hidden(83, "bob"),
            hidden(84, "bob"),
        ]);
        let keys: Vec<(&str, Vec<u32>)> = jobs
            .iter()
            .map(|(k, m)| (k.key.as_str(), m.iter().map(|m| m.device).collect()))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("children of pid 80, user alice", vec![0, 1]),
                ("children of pid 80, user bob", vec![2, 3]),
            ]
        );
    }

    #[test]
    fn ranks_that_disagree_are_named() {
        let rank = |pid, rank, world| {
            let mut l = launch(100, PYTHON, PYTHON);
            l.run_id = Some("7f3c".into());
            l.rank = Some(rank);
            l.world_size = Some(world);
            process(pid, Some(l))
        };
        let mut launches = ProcessLaunch::default();
        let all = [
            rank(101, 0, 4),
            rank(102, 1, 8),
            rank(103, 1, 2),
            rank(104, 1, 4),
        ];
        for (device, p) in all.into_iter().enumerate() {
            launches.observe(
                &Sample {
                    processes: Some(vec![p]),
                    ..Sample::new(device as u32, 1_000)
                },
                None,
            );
        }
        let jobs = group(&launches, None, 0, 2_000, &BTreeSet::new());
        let members = jobs.values().next().unwrap();
        assert_eq!(
            doubts(members, &launches),
            vec![
                "rank 1 is claimed by the processes on GPUs 1, 2 and 3".to_owned(),
                "its processes report different world sizes (2, 4 and 8)".to_owned(),
            ]
        );
        // Agreeing ranks: nothing to doubt.
        let mut fine = ProcessLaunch::default();
        for (device, p) in [rank(201, 0, 2), rank(202, 1, 2)].into_iter().enumerate() {
            fine.observe(
                &Sample {
                    processes: Some(vec![p]),
                    ..Sample::new(device as u32, 1_000)
                },
                None,
            );
        }
        let jobs = group(&fine, None, 0, 2_000, &BTreeSet::new());
        assert!(doubts(jobs.values().next().unwrap(), &fine).is_empty());
    }

    #[test]
    fn a_slurm_job_joins_its_processes_whatever_else_they_carry() {
        let in_job = |pid, parent| {
            let mut p = process(pid, Some(launch(parent, "/usr/bin/bash", PYTHON)));
            p.attribution = Some(Attribution {
                job: Some(SlurmJob {
                    id: "42".into(),
                    step: Some("0".into()),
                    user: None,
                    found_in: FoundIn::Cgroup,
                }),
                ..Attribution::default()
            });
            p
        };
        let jobs = jobs_of(vec![in_job(51, 50), in_job(61, 60)]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::SlurmJob, vec![0, 1])]);
    }

    #[test]
    fn where_nothing_was_readable_one_executable_is_a_presumed_job() {
        let mut unreadable = Launch {
            exe: Some(PYTHON.into()),
            ..Launch::default()
        };
        unreadable
            .absent
            .insert("environ".into(), "another user's process".into());
        // A recording made before gpudiag looked carries no launch at all.
        let jobs = jobs_of(vec![process(71, Some(unreadable)), process(72, None)]);
        // The second is known by its name only, so it is not the same executable.
        assert!(jobs.is_empty(), "{jobs:?}");
        let jobs = jobs_of(vec![process(71, None), process(72, None)]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::SameExecutable, vec![0, 1])]);
        assert!(jobs.keys().next().unwrap().joined_by.presumed());
        // Another user's processes: the environment hidden, the parent readable. One parent
        // presumes one job; two parents, two jobs.
        let hidden = |parent| {
            let mut l = Launch {
                parent_pid: Some(parent),
                ..Launch::default()
            };
            l.absent
                .insert("environ".into(), "another user's process".into());
            l.absent
                .insert("exe".into(), "another user's process".into());
            Some(l)
        };
        let jobs = jobs_of(vec![process(81, hidden(80)), process(82, hidden(80))]);
        assert_eq!(joined(&jobs), vec![(JoinedBy::SameExecutable, vec![0, 1])]);
        let jobs = jobs_of(vec![process(91, hidden(90)), process(93, hidden(92))]);
        assert!(jobs.is_empty(), "{jobs:?}");
    }

    #[test]
    fn the_command_gpudiag_runs_is_one_job() {
        let mut launches = ProcessLaunch::default();
        for (device, pid) in [(0u32, 81u32), (1, 82)] {
            launches.observe(
                &Sample {
                    processes: Some(vec![process(
                        pid,
                        Some(launch(80, "/usr/bin/bash", PYTHON)),
                    )]),
                    ..Sample::new(device, 1_000)
                },
                None,
            );
        }
        let jobs = group(&launches, None, 0, 2_000, &BTreeSet::from([81, 82]));
        assert_eq!(joined(&jobs), vec![(JoinedBy::Command, vec![0, 1])]);
    }
}
