//! The job verdict on the cases where it grouped strangers, missed a second straggler or blamed
//! a consequence: crafted recordings (`tests/fixtures/make_job_cases.py`, whose docstring tells
//! each case and what it must get), replayed through `check --json`.

use std::path::PathBuf;

use gpudiag_core::check::CheckReport;
use gpudiag_model::finding::{Finding, Severity};
use gpudiag_model::job::{GpuRole, JobPattern, JobVerdict, JoinedBy, Pace};
use gpudiag_model::verdict::{Bottleneck, Confidence};

use crate::support::at;

fn case(name: &str) -> PathBuf {
    at("tests/fixtures/jobs").join(format!("case-{name}.ndjson.gz"))
}

fn check(name: &str) -> CheckReport {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--json", "--replay"])
        .arg(case(name))
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&out.stdout).unwrap();
    assert_one_truth(name, &report);
    report
}

/// The devices of a job, sorted.
fn devices(job: &JobVerdict) -> Vec<u32> {
    let mut d: Vec<u32> = job.devices().collect();
    d.sort_unstable();
    d
}

/// The devices a job names stragglers, sorted.
fn straggler_devices(job: &JobVerdict) -> Vec<u32> {
    let mut d: Vec<u32> = job.stragglers.iter().map(|s| s.device).collect();
    d.sort_unstable();
    d
}

/// The job holding `device`.
fn job_on(report: &CheckReport, device: u32) -> Option<&JobVerdict> {
    report
        .jobs
        .iter()
        .find(|j| j.devices().any(|d| d == device))
}

/// Every GPU whose own verdict says it waits for a peer.
fn waiting_for_peer(report: &CheckReport) -> Vec<u32> {
    report
        .devices
        .iter()
        .filter(|d| {
            d.verdict
                .as_ref()
                .is_some_and(|v| v.bottleneck == Bottleneck::WaitingForPeer)
        })
        .map(|d| d.info.index)
        .collect()
}

/// One truth per GPU: a GPU's role in its job says it waits exactly where its own verdict does.
fn assert_one_truth(name: &str, report: &CheckReport) {
    let waiting = waiting_for_peer(report);
    for job in &report.jobs {
        for m in &job.members {
            assert_eq!(
                m.role == Some(GpuRole::Waiting),
                waiting.contains(&m.device),
                "{name} GPU {}: role {:?}, GPUs waiting for a peer {waiting:?}",
                m.device,
                m.role
            );
        }
    }
}

/// The findings the job verdicts raised, wherever the report puts them.
fn job_findings(report: &CheckReport) -> Vec<&Finding> {
    report
        .devices
        .iter()
        .flat_map(|d| d.findings.iter())
        .chain(report.host_findings.iter())
        .filter(|f| f.id.starts_with("job."))
        .collect()
}

/// The jobs in words, for a failing assertion's message.
fn told(report: &CheckReport) -> String {
    report
        .jobs
        .iter()
        .map(|j| {
            format!(
                "{} [{}] {:?} {}: {} (roles {:?}, doubts {:?})",
                j.job.key,
                j.job.joined_by.name(),
                devices(j),
                j.verdict,
                j.title,
                j.members
                    .iter()
                    .map(|m| (m.device, m.role))
                    .collect::<Vec<_>>(),
                j.doubts
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn two_pods_on_torchruns_defaults_are_two_jobs_and_one_pods_straggler_keeps_to_its_pod() {
    let r = check("two-pods");
    let jobs = told(&r);
    assert_eq!(r.jobs.len(), 2, "{jobs}");
    let a = job_on(&r, 0).expect(&jobs);
    let b = job_on(&r, 2).expect(&jobs);
    assert_eq!(devices(a), [0, 1], "{jobs}");
    assert_eq!(devices(b), [2, 3], "{jobs}");
    assert_ne!(a.job.key, b.job.key, "{jobs}");
    for job in [a, b] {
        assert!(!job.presumed, "{jobs}");
        assert!(
            job.job.key.contains("@node-pods"),
            "the recording's host: {jobs}"
        );
    }
    assert_eq!(a.verdict, JobPattern::Straggler, "{jobs}");
    assert_eq!(straggler_devices(a), [0], "{jobs}");
    assert_eq!(a.role_of(1), Some(GpuRole::Waiting), "{jobs}");
    assert!(b.stragglers.is_empty(), "{jobs}");
    assert_eq!(b.role_of(2), None, "{jobs}");
    assert_eq!(b.role_of(3), None, "{jobs}");
    let waiting = waiting_for_peer(&r);
    assert!(
        !waiting.contains(&2) && !waiting.contains(&3),
        "pod B's GPUs wait for nobody: {waiting:?}\n{jobs}"
    );
}

#[test]
fn a_sweeps_independent_children_are_no_job_and_two_users_never_one() {
    let r = check("sweep");
    let jobs = told(&r);
    for job in &r.jobs {
        assert!(job.presumed, "{jobs}");
        assert_eq!(job.confidence, Confidence::Low, "{jobs}");
        let d = devices(job);
        let alice = d.iter().any(|&g| g < 2);
        let bob = d.iter().any(|&g| g >= 2);
        assert!(!(alice && bob), "alice's and bob's GPUs in one job: {jobs}");
    }
    for f in job_findings(&r) {
        assert_eq!(f.severity, Severity::Info, "{}: {}", f.id, f.title);
    }
    assert_eq!(waiting_for_peer(&r), Vec::<u32>::new(), "{jobs}");
}

#[test]
fn an_mp_spawn_job_is_joined_by_its_parent_and_its_straggler_named() {
    let r = check("mp-spawn");
    let jobs = told(&r);
    assert_eq!(r.jobs.len(), 1, "{jobs}");
    let job = &r.jobs[0];
    assert_eq!(devices(job), [0, 1, 2, 3], "{jobs}");
    assert_eq!(job.job.joined_by, JoinedBy::Parent, "{jobs}");
    assert!(!job.presumed, "{jobs}");
    assert_eq!(job.verdict, JobPattern::Straggler, "{jobs}");
    assert_eq!(straggler_devices(job), [2], "{jobs}");
    assert_eq!(job.stragglers[0].pace, Pace::Leads, "{jobs}");
    let findings = job_findings(&r);
    let straggler = findings
        .iter()
        .find(|f| f.id == "job.straggler")
        .expect(&jobs);
    assert_eq!(straggler.severity, Severity::Warn, "{}", straggler.title);
    assert_eq!(straggler.device, Some(2));
    for d in [0, 1, 3] {
        assert_eq!(job.role_of(d), Some(GpuRole::Waiting), "GPU {d}: {jobs}");
    }
    assert_eq!(job.role_of(2), Some(GpuRole::Straggler), "{jobs}");
    assert_eq!(waiting_for_peer(&r), [0, 1, 3], "{jobs}");
}

#[test]
fn two_stragglers_of_eight_are_both_named_and_the_six_others_wait() {
    let r = check("two-of-eight");
    let jobs = told(&r);
    assert_eq!(r.jobs.len(), 1, "{jobs}");
    let job = &r.jobs[0];
    assert_eq!(devices(job).len(), 8, "{jobs}");
    assert_eq!(job.job.joined_by, JoinedBy::RunId, "{jobs}");
    assert_eq!(job.verdict, JobPattern::Straggler, "{jobs}");
    assert_eq!(straggler_devices(job), [2, 6], "{jobs}");
    for s in &job.stragglers {
        assert_eq!(s.pace, Pace::Leads, "GPU {}: {jobs}", s.device);
    }
    for d in 0..8 {
        let role = if d == 2 || d == 6 {
            GpuRole::Straggler
        } else {
            GpuRole::Waiting
        };
        assert_eq!(job.role_of(d), Some(role), "GPU {d}: {jobs}");
    }
    assert_eq!(waiting_for_peer(&r), [0, 1, 3, 4, 5, 7], "{jobs}");
    assert!(
        job_findings(&r)
            .iter()
            .any(|f| f.id == "job.straggler" && f.severity == Severity::Warn),
        "{jobs}"
    );
}

#[test]
fn graded_work_is_imbalanced_with_no_straggler() {
    let r = check("graded");
    let jobs = told(&r);
    assert_eq!(r.jobs.len(), 1, "{jobs}");
    let job = &r.jobs[0];
    assert_eq!(devices(job), [0, 1, 2, 3], "{jobs}");
    assert_eq!(job.verdict, JobPattern::Imbalanced, "{jobs}");
    assert!(job.stragglers.is_empty(), "{jobs}");
    assert!(
        job.members
            .iter()
            .all(|m| m.role != Some(GpuRole::Straggler)),
        "{jobs}"
    );
    assert_eq!(waiting_for_peer(&r), Vec::<u32>::new(), "{jobs}");
}

#[test]
fn ranks_that_disagree_are_named_and_lower_the_confidence() {
    let r = check("ranks-disagree");
    let jobs = told(&r);
    assert_eq!(r.jobs.len(), 1, "{jobs}");
    let job = &r.jobs[0];
    assert_eq!(devices(job), [0, 1, 2, 3], "{jobs}");
    let doubts: Vec<String> = job.doubts.iter().map(|d| d.to_lowercase()).collect();
    assert!(
        doubts.iter().any(|d| d.contains("rank 1")),
        "the duplicate rank: {doubts:?}"
    );
    assert!(
        doubts
            .iter()
            .any(|d| d.contains("world size") && d.contains('8') && d.contains('2')),
        "the world sizes: {doubts:?}"
    );
    assert!(job.confidence < Confidence::High, "{jobs}");
}

#[test]
fn a_job_among_two_thousand_processes_keeps_its_gpus_and_the_eviction_is_told() {
    let r = check("many-processes");
    let jobs = told(&r);
    let job = r
        .jobs
        .iter()
        .find(|j| j.job.joined_by == JoinedBy::RunId)
        .expect(&jobs);
    assert_eq!(devices(job), (0..8).collect::<Vec<u32>>(), "{jobs}");
    assert!(
        r.not_judged
            .iter()
            .any(|n| n.reason.to_lowercase().contains("evict")),
        "{:?}",
        r.not_judged
    );
}

#[test]
fn a_straggler_at_the_power_cap_is_not_blamed_on_its_clock() {
    let r = check("power-cap");
    let jobs = told(&r);
    assert_eq!(r.jobs.len(), 1, "{jobs}");
    let job = &r.jobs[0];
    assert_eq!(job.verdict, JobPattern::Straggler, "{jobs}");
    assert_eq!(straggler_devices(job), [1], "{jobs}");
    let s = &job.stragglers[0];
    assert_eq!(s.pace, Pace::Leads, "{jobs}");
    // The cap lowers the clock of the GPU doing more work: a consequence, not a cause.
    for line in &s.differs {
        assert!(
            !line.contains("clock") || line.contains("more work"),
            "{line}"
        );
    }
}

#[test]
fn torchruns_defaults_on_two_hosts_are_each_the_hosts_own_job() {
    for host in ["node-a", "node-b"] {
        let r = check(&format!("defaults-{host}"));
        let jobs = told(&r);
        assert_eq!(r.jobs.len(), 1, "{host}: {jobs}");
        let job = &r.jobs[0];
        assert_eq!(devices(job), [0, 1, 2, 3], "{host}: {jobs}");
        assert_eq!(job.job.joined_by, JoinedBy::MasterAddress, "{host}: {jobs}");
        assert!(job.job.key.ends_with(&format!("@{host}")), "{host}: {jobs}");
        assert_eq!(job.verdict, JobPattern::Balanced, "{host}: {jobs}");
        assert!(job.stragglers.is_empty(), "{host}: {jobs}");
    }
}
