//! A job's verdict beside what `run --kernels` measured of its ranks: each rank's share of time
//! in NCCL kernels. In a data-parallel job every rank waits inside its collectives for the
//! slowest, so the rank with clearly the least NCCL time is the one the others wait for. The
//! counters estimate that wait from utilisation; the records measure it. Where both speak, the
//! job's title says whether they agree, and the shares go in its evidence.

use serde_json::json;

use gpudiag_model::job::{JobPattern, JobVerdict};
use gpudiag_model::kernels::{KernelsProcess, KernelsSummary};

use super::{NCCL_LAGGARD_MIN_GAP, nccl_laggard};
use crate::rules::job::gpu_name;

/// Notes on each job the NCCL shares of its members that the collector recorded (two at
/// least): the shares in its evidence (`nccl_shares`, and `nccl_laggard_pid` where one rank has
/// clearly the least), and one clause on its title saying whether they agree with its verdict.
/// A job that makes no progress gets the evidence only: its stall is the story.
pub fn note_nccl_shares(jobs: &mut [JobVerdict], summary: &KernelsSummary) {
    for job in jobs {
        let members: Vec<(&gpudiag_model::job::JobMember, &KernelsProcess)> = job
            .members
            .iter()
            .filter_map(|m| {
                let p = summary
                    .processes
                    .iter()
                    .find(|p| p.pid == m.pid && p.nccl_s > 0.0 && p.nccl_share.is_some())?;
                Some((m, p))
            })
            .collect();
        if members.len() < 2 {
            continue;
        }
        let shares: Vec<serde_json::Value> = members
            .iter()
            .map(|(m, p)| {
                json!({
                    "device": m.device,
                    "rank": m.rank,
                    "pid": m.pid,
                    "share": p.nccl_share.map(|s| (s * 1000.0).round() / 1000.0),
                })
            })
            .collect();
        job.evidence.insert("nccl_shares".into(), json!(shares));
        let processes: Vec<KernelsProcess> = members.iter().map(|(_, p)| (*p).clone()).collect();
        let laggard = nccl_laggard(&processes, NCCL_LAGGARD_MIN_GAP);
        if let Some(l) = &laggard {
            job.evidence.insert("nccl_laggard_pid".into(), json!(l.pid));
        }
        // The order of arrivals speaks for the job when its collectives were every member's
        // and only theirs.
        let arrivals = summary.nccl_arrivals.as_ref().filter(|a| {
            a.matched > 0
                && a.by_pid.len() == members.len()
                && a.by_pid
                    .iter()
                    .all(|p| members.iter().any(|(m, _)| m.pid == p.pid))
        });
        let waited_for = arrivals.and_then(|a| {
            let pid = a.waited_for?;
            Some((pid, a.by_pid.iter().find(|p| p.pid == pid)?, a.matched))
        });
        if let Some((pid, _, _)) = waited_for {
            job.evidence
                .insert("nccl_waited_for_pid".into(), json!(pid));
        }
        if job.verdict.stalled() {
            continue;
        }
        // The shares speak first; the order of arrivals names a rank too slightly slower for
        // its share to stand out.
        let named_by = match (&laggard, waited_for) {
            (Some(l), _) => Some((
                l.pid,
                format!(
                    "spends {} of its time in NCCL kernels against its peers' {}",
                    pct(l.nccl_share),
                    pct(l.peers_median_share)
                ),
            )),
            (None, Some((pid, arrival, matched))) => Some((
                pid,
                format!(
                    "arrives last at {} of the {matched} collectives its peers ran with it{}",
                    pct(arrival.last_share),
                    arrivals
                        .and_then(|a| a.share_of_waiting(pid))
                        .map(|share| format!(" and causes {} of their waiting", pct(share)))
                        .unwrap_or_default()
                ),
            )),
            (None, None) => None,
        };
        let clause = match named_by {
            Some((pid, measured)) => {
                let Some((m, _)) = members.iter().find(|(m, _)| m.pid == pid) else {
                    continue;
                };
                let who = gpu_name(m.device, m.rank);
                let figures = format!("{who} {measured}");
                let named = job.stragglers.iter().any(|s| s.device == m.device);
                match job.verdict {
                    JobPattern::Straggler if named => {
                        format!("; measured by --kernels: {figures}")
                    }
                    _ => format!(
                        "; but --kernels measured {figures}: the others wait for it in their \
                         collectives"
                    ),
                }
            }
            None if job.verdict == JobPattern::Straggler => {
                "; but --kernels measured no rank with clearly less time in NCCL kernels \
                 than its peers"
                    .to_owned()
            }
            None => continue,
        };
        job.title.push_str(&clause);
    }
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::job::{JobId, JobMember, JoinedBy, Pace, Straggler};
    use gpudiag_model::kernels::CollectorLosses;
    use gpudiag_model::verdict::Confidence;

    fn member(device: u32, pid: u32) -> JobMember {
        JobMember {
            device,
            uuid: None,
            pid,
            name: Some("python3".into()),
            rank: Some(device),
            local_rank: Some(device),
            role: None,
        }
    }

    fn process(pid: u32, share: f64) -> KernelsProcess {
        KernelsProcess {
            pid,
            parent_pid: None,
            said_hello: true,
            said_goodbye: true,
            cupti_source: None,
            cupti_api_version: None,
            cannot_record: None,
            losses: CollectorLosses::default(),
            stepped_aside: Vec::new(),
            sampling: None,
            start_unix_ns: None,
            end_unix_ns: None,
            kernels: 1000,
            nccl_s: share * 10.0,
            nccl_share: Some(share),
            syncs: Vec::new(),
        }
    }

    fn job(verdict: JobPattern, straggler: Option<u32>) -> JobVerdict {
        JobVerdict {
            job: JobId {
                joined_by: JoinedBy::RunId,
                key: "run".into(),
            },
            presumed: false,
            members: vec![member(0, 100), member(1, 101), member(2, 102)],
            verdict,
            confidence: Confidence::Medium,
            start_ms: 0,
            end_ms: 1000,
            title: "job on 3".into(),
            advice: "a".into(),
            stragglers: straggler
                .map(|device| Straggler {
                    device,
                    rank: Some(device),
                    pace: Pace::Leads,
                    metric: "sm_active_pct".into(),
                    value: 90.0,
                    peers_median: 60.0,
                    peers_wait_share: Some(0.3),
                    wait_estimate: "e".into(),
                    differs: Vec::new(),
                })
                .into_iter()
                .collect(),
            doubts: Vec::new(),
            stall: None,
            peers: Vec::new(),
            ras: None,
            evidence: serde_json::Map::new(),
        }
    }

    fn summary(shares: &[(u32, f64)]) -> KernelsSummary {
        KernelsSummary {
            not_recorded: None,
            gpus: Vec::new(),
            processes: shares.iter().map(|&(pid, x)| process(pid, x)).collect(),
            nccl_laggard: None,
            left_out: Vec::new(),
            sampling: None,
            nccl_arrivals: None,
        }
    }

    #[test]
    fn a_straggler_the_nccl_shares_name_too_is_said_to_agree() {
        let mut jobs = vec![job(JobPattern::Straggler, Some(1))];
        note_nccl_shares(
            &mut jobs,
            &summary(&[(100, 0.31), (101, 0.03), (102, 0.30)]),
        );
        let j = &jobs[0];
        assert!(
            j.title.ends_with(
                "; measured by --kernels: GPU 1 (rank 1) spends 3.0% of its time in NCCL \
                 kernels against its peers' 30.5%"
            ),
            "{}",
            j.title
        );
        assert_eq!(j.evidence["nccl_laggard_pid"], json!(101));
        assert_eq!(j.evidence["nccl_shares"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_balanced_job_with_a_clear_laggard_says_so_and_one_without_stays_quiet() {
        let mut jobs = vec![job(JobPattern::Balanced, None)];
        note_nccl_shares(
            &mut jobs,
            &summary(&[(100, 0.31), (101, 0.03), (102, 0.30)]),
        );
        assert!(
            jobs[0]
                .title
                .contains("; but --kernels measured GPU 1 (rank 1) spends 3.0%"),
            "{}",
            jobs[0].title
        );
        let mut jobs = vec![job(JobPattern::Balanced, None)];
        note_nccl_shares(
            &mut jobs,
            &summary(&[(100, 0.05), (101, 0.048), (102, 0.051)]),
        );
        assert_eq!(jobs[0].title, "job on 3");
        assert!(jobs[0].evidence.contains_key("nccl_shares"));
        assert!(!jobs[0].evidence.contains_key("nccl_laggard_pid"));
    }

    #[test]
    fn a_straggler_the_shares_do_not_name_is_doubted_and_strangers_are_not_counted() {
        let mut jobs = vec![job(JobPattern::Straggler, Some(2))];
        // pid 900 is no member of the job: its low share names no one here.
        note_nccl_shares(
            &mut jobs,
            &summary(&[(100, 0.2), (101, 0.21), (102, 0.2), (900, 0.0001)]),
        );
        assert!(
            jobs[0].title.ends_with(
                "; but --kernels measured no rank with clearly less time in NCCL kernels \
                 than its peers"
            ),
            "{}",
            jobs[0].title
        );
        // Fewer than two members with NCCL time: nothing said.
        let mut jobs = vec![job(JobPattern::Straggler, Some(2))];
        note_nccl_shares(&mut jobs, &summary(&[(100, 0.2)]));
        assert_eq!(jobs[0].title, "job on 3");
        assert!(jobs[0].evidence.is_empty());
    }
    /// Shares too close to name anyone, but one rank arrives last at nearly every collective:
    /// the straggler the counters named is confirmed by the order of arrivals.
    #[test]
    fn the_order_of_arrivals_names_a_rank_the_shares_are_too_close_to_name() {
        use gpudiag_model::kernels::{NcclArrival, NcclArrivals};
        let arrival = |pid, last_share| NcclArrival {
            pid,
            last: (last_share * 400.0) as u64,
            last_share,
            peers_waited_s: last_share,
        };
        let mut s = summary(&[(100, 0.10), (101, 0.08), (102, 0.10)]);
        s.nccl_arrivals = Some(NcclArrivals {
            matched: 400,
            unmatched: 0,
            by_pid: vec![arrival(100, 0.05), arrival(101, 0.9), arrival(102, 0.05)],
            waited_for: Some(101),
        });
        let mut jobs = vec![job(JobPattern::Straggler, Some(1))];
        note_nccl_shares(&mut jobs, &s);
        assert!(
            jobs[0].title.ends_with(
                "; measured by --kernels: GPU 1 (rank 1) arrives last at 90.0% of the 400 \
                 collectives its peers ran with it and causes 90.0% of their waiting"
            ),
            "{}",
            jobs[0].title
        );
        assert_eq!(jobs[0].evidence["nccl_waited_for_pid"], json!(101));
        assert!(!jobs[0].evidence.contains_key("nccl_laggard_pid"));
        // Collectives of processes outside the job say nothing of it.
        let mut stranger = s.clone();
        if let Some(a) = &mut stranger.nccl_arrivals {
            a.by_pid.push(arrival(900, 0.0));
        }
        let mut jobs = vec![job(JobPattern::Straggler, Some(1))];
        note_nccl_shares(&mut jobs, &stranger);
        assert!(!jobs[0].evidence.contains_key("nccl_waited_for_pid"));
    }
}
