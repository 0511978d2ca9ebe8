//! NCCL's RAS answers as a job's progress evidence: the recent answers of this host (bounded),
//! when to ask again, and what a job's verdict shows from them ([`ras_evidence`]).
//!
//! A status query is a collective over the whole job that, with a dead peer, waits out RAS's
//! own timeouts; so it is asked only for a job of two or more GPUs, often (every
//! [`STUCK_INTERVAL_MS`]) only while the job looks stuck, and otherwise at a slow cadence. Counts
//! differ between healthy ranks mid-step, so "stuck" needs two answers some seconds apart that
//! show no count moving.

use std::collections::{BTreeMap, VecDeque};

use gpudiag_model::job::{JobMember, JobVerdict};
use gpudiag_model::ras::{
    RasAnswer, RasCommunicator, RasEvidence, RasFailure, RasMatch, RasNotJudged, RasProgress,
    RasRankCount, RasRankState,
};
use gpudiag_model::sample::TimeMs;

/// Answers kept: a few minutes of a stuck job asked every 15 s, for a few jobs.
pub const MAX_ANSWERS: usize = 64;
/// Answers older than this are forgotten.
pub const KEEP_MS: TimeMs = 10 * 60 * 1000;
/// How often a job that looks stuck is asked.
pub const STUCK_INTERVAL_MS: TimeMs = 15_000;
/// How often any other job of two or more GPUs is asked.
pub const SLOW_INTERVAL_MS: TimeMs = 120_000;
/// Two answers closer than this do not tell progress (a query itself takes a while).
const MIN_PROGRESS_GAP_MS: TimeMs = 2_000;
/// Two answers further apart than this describe different moments of the job.
const MAX_PROGRESS_GAP_MS: TimeMs = 5 * 60 * 1000;

/// The recent answers of this host, newest last, and when each job (by its devices) was asked.
#[derive(Debug, Clone, Default)]
pub struct RasLog {
    answers: VecDeque<RasAnswer>,
    asked: BTreeMap<Vec<u32>, TimeMs>,
}

impl RasLog {
    pub fn push(&mut self, answer: RasAnswer) {
        let newest = answer.time_ms;
        self.answers.push_back(answer);
        while self.answers.len() > MAX_ANSWERS
            || self
                .answers
                .front()
                .is_some_and(|a| a.time_ms.saturating_add(KEEP_MS) < newest)
        {
            self.answers.pop_front();
        }
    }

    pub fn answers(&self) -> impl DoubleEndedIterator<Item = &RasAnswer> {
        self.answers.iter()
    }

    /// Whether to ask RAS about `verdict`'s job now: a job of two or more GPUs, every
    /// [`STUCK_INTERVAL_MS`] while it is stalled or its evidence carries `stuck_s`, else every
    /// [`SLOW_INTERVAL_MS`].
    pub fn due(&self, verdict: &JobVerdict, now_ms: TimeMs) -> bool {
        let devices = job_devices(&verdict.members);
        if devices.len() < 2 {
            return false;
        }
        let stuck = verdict.verdict.stalled() || verdict.evidence.contains_key("stuck_s");
        let interval = if stuck {
            STUCK_INTERVAL_MS
        } else {
            SLOW_INTERVAL_MS
        };
        self.asked
            .get(&devices)
            .is_none_or(|&last| now_ms.saturating_sub(last) >= interval)
    }

    /// Notes that the job on `devices` was asked at `now_ms`.
    pub fn asked(&mut self, devices: &[u32], now_ms: TimeMs) {
        let mut key = devices.to_vec();
        key.sort_unstable();
        key.dedup();
        self.asked.insert(key, now_ms);
        // Jobs come and go: keep the map as small as the answers' horizon.
        self.asked
            .retain(|_, &mut t| t.saturating_add(KEEP_MS) >= now_ms);
    }
}

fn job_devices(members: &[JobMember]) -> Vec<u32> {
    let mut d: Vec<u32> = members.iter().map(|m| m.device).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// Answers to a query made for this job (or for no job in particular), newest first.
fn for_job<'a>(
    log: &'a RasLog,
    devices: &'a [u32],
    now_ms: TimeMs,
) -> impl Iterator<Item = &'a RasAnswer> + 'a {
    log.answers()
        .rev()
        .filter(move |a| a.time_ms <= now_ms)
        .filter(move |a| {
            a.for_devices.is_empty() || a.for_devices.iter().any(|d| devices.contains(d))
        })
}

/// What `members`' job verdict shows from NCCL's RAS at `now_ms`: the newest answer that is the
/// job's (its counts per rank, the ranks behind), whether two answers seconds apart show
/// progress, or why there is none.
pub fn ras_evidence(log: &RasLog, members: &[JobMember], now_ms: TimeMs) -> RasEvidence {
    let devices = job_devices(members);
    let pairs: Vec<(u32, u32)> = members.iter().map(|m| (m.pid, m.device)).collect();
    let mut newest_failure: Option<&RasAnswer> = None;
    let mut other_job = false;
    let mut chosen: Option<(&RasAnswer, RasMatch)> = None;
    for a in for_job(log, &devices, now_ms) {
        if a.not_answered.is_some() {
            newest_failure.get_or_insert(a);
            continue;
        }
        match a.matches_job(&pairs) {
            RasMatch::Other => other_job = true,
            m => {
                chosen = Some((a, m));
                break;
            }
        }
    }
    let Some((answer, _)) = chosen else {
        let (reason, words) = if other_job {
            (
                RasNotJudged::OtherJob,
                "RAS answered for another job of the same user".to_owned(),
            )
        } else if let Some(f) = newest_failure.and_then(|a| a.not_answered.as_ref()) {
            let reason = match f.failure {
                RasFailure::Refused => RasNotJudged::NotEnabled,
                RasFailure::OwnNetNamespace => RasNotJudged::OwnNetNamespace,
                RasFailure::TimedOut => RasNotJudged::TimedOut,
                RasFailure::TooLarge | RasFailure::Malformed | RasFailure::Io => {
                    RasNotJudged::Unreadable
                }
            };
            (reason, f.reason.clone())
        } else {
            (RasNotJudged::NotAsked, "RAS not asked".to_owned())
        };
        return RasEvidence {
            answered_ms: None,
            nccl_version: None,
            ranks: Vec::new(),
            progress: None,
            lagging: Vec::new(),
            summary: format!("RAS: {words}"),
            not_judged: Some(reason),
        };
    };
    let comm = main_communicator(answer);
    let device_of =
        |pid: Option<u32>| pid.and_then(|p| members.iter().find(|m| m.pid == p).map(|m| m.device));
    let count = |r: &gpudiag_model::ras::RasRank| RasRankCount {
        rank: r.rank,
        pid: r.pid,
        device: device_of(r.pid),
        operations: r.operations_total(),
        state: r.state,
    };
    let ranks: Vec<RasRankCount> = comm
        .map(|c| c.ranks.iter().chain(&c.missing_ranks).map(count).collect())
        .unwrap_or_default();
    let lagging = comm.map(|c| lagging_ranks(c, &count)).unwrap_or_default();
    let progress = progress_since(log, answer, &devices, &pairs);
    let has_counts = comm.is_some_and(|c| {
        !c.count_groups.is_empty() || c.ranks.iter().any(|r| !r.operations.is_empty())
    });
    let mut summary = String::from("RAS");
    if let Some(v) = &answer.nccl_version {
        summary.push_str(&format!(" (NCCL {v})"));
    }
    summary.push_str(": ");
    summary.push_str(&describe_counts(comm));
    if let Some(p) = &progress {
        let apart_s = (p.to_ms.saturating_sub(p.from_ms)) as f64 / 1000.0;
        if p.moving {
            summary.push_str(&format!("; counts moved in {apart_s:.0} s"));
        } else {
            summary.push_str(&format!("; no count moved in {apart_s:.0} s"));
        }
    }
    if let Some(n) = answer.dead_processes.filter(|&n| n > 0) {
        summary.push_str(&format!(
            "; {n} {} considered dead",
            if n == 1 { "process" } else { "processes" }
        ));
    }
    RasEvidence {
        answered_ms: Some(answer.time_ms),
        nccl_version: answer.nccl_version.clone(),
        ranks,
        progress,
        lagging,
        summary,
        not_judged: (!has_counts).then_some(RasNotJudged::NoCounts),
    }
}

/// The job's world: the communicator with the most ranks that answered, then the largest, then
/// the one naming the most processes. Ranks named by no process count last: NCCL 2.28.9 has
/// printed a communicator of 257 garbage ranks "[process information not found]" beside a
/// stopped rank's real one (`tests/fixtures/ras/h100x2/stopped-2-verbose.txt`).
fn main_communicator(a: &RasAnswer) -> Option<&RasCommunicator> {
    a.communicators.iter().max_by_key(|c| {
        let named = c
            .ranks
            .iter()
            .chain(&c.missing_ranks)
            .filter(|r| r.pid.is_some())
            .count();
        (
            c.ranks.len(),
            c.size.unwrap_or(0),
            named,
            c.missing_ranks.len(),
        )
    })
}

/// Ranks in a count group below the collective's highest, and ranks that are dead or did not
/// answer.
fn lagging_ranks(
    c: &RasCommunicator,
    count: &dyn Fn(&gpudiag_model::ras::RasRank) -> RasRankCount,
) -> Vec<RasRankCount> {
    let mut out: Vec<RasRankCount> = Vec::new();
    let mut top: BTreeMap<&str, u64> = BTreeMap::new();
    for g in &c.count_groups {
        let t = top.entry(&g.collective).or_insert(0);
        *t = (*t).max(g.operations);
    }
    for g in &c.count_groups {
        if top
            .get(g.collective.as_str())
            .is_some_and(|&t| g.operations < t)
        {
            for &rank in &g.ranks {
                if out.iter().any(|r| r.rank == rank) {
                    continue;
                }
                let known = c.ranks.iter().find(|r| r.rank == rank);
                let mut rc = known.map(count).unwrap_or(RasRankCount {
                    rank,
                    pid: None,
                    device: None,
                    operations: None,
                    state: RasRankState::Unknown,
                });
                rc.operations = rc.operations.or(Some(g.operations));
                out.push(rc);
            }
        }
    }
    for r in &c.missing_ranks {
        if matches!(r.state, RasRankState::Dead | RasRankState::Unresponsive)
            && !out.iter().any(|o| o.rank == r.rank)
        {
            out.push(count(r));
        }
    }
    out
}

/// "3 ranks launched up to AllReduce 41; rank 3 up to 30 (pid 4553)", or all alike.
fn describe_counts(comm: Option<&RasCommunicator>) -> String {
    let Some(c) = comm else {
        return "no communicator reported".to_owned();
    };
    if let Some(first) = c.count_groups.first() {
        let parts: Vec<String> = c
            .count_groups
            .iter()
            .filter(|g| g.collective == first.collective)
            .take(4)
            .map(|g| {
                let who = match (g.ranks_count, g.ranks.as_slice()) {
                    (1, [r]) => {
                        let pid = c
                            .ranks
                            .iter()
                            .find(|x| x.rank == *r)
                            .and_then(|x| x.pid)
                            .map(|p| format!(" (pid {p})"))
                            .unwrap_or_default();
                        return format!("rank {r}{pid} up to {}", g.operations);
                    }
                    (n, _) => format!("{n} ranks"),
                };
                format!("{who} up to {}", g.operations)
            })
            .collect();
        return format!("{} launched: {}", first.collective, parts.join("; "));
    }
    let totals: Vec<u64> = c
        .ranks
        .iter()
        .filter_map(|r| r.operations_total())
        .collect();
    match totals.first() {
        Some(&n) if totals.iter().all(|&t| t == n) => match totals.len() {
            1 => format!("its one rank seen launched {n} collective operations"),
            ranks => format!("all {ranks} ranks launched {n} collective operations"),
        },
        _ if c.missing_ranks.is_empty() => "no counts reported (healthy text report)".to_owned(),
        _ => format!("{} rank(s) missing", c.missing_ranks.len()),
    }
}

/// Compares `later` with the newest earlier answer for the job, at least
/// [`MIN_PROGRESS_GAP_MS`] older, that has counts for the same communicator.
fn progress_since(
    log: &RasLog,
    later: &RasAnswer,
    devices: &[u32],
    pairs: &[(u32, u32)],
) -> Option<RasProgress> {
    let now = counts_of(later)?;
    for earlier in for_job(log, devices, later.time_ms) {
        let gap = later.time_ms.saturating_sub(earlier.time_ms);
        if gap < MIN_PROGRESS_GAP_MS || earlier.not_answered.is_some() {
            continue;
        }
        if gap > MAX_PROGRESS_GAP_MS {
            break;
        }
        if earlier.matches_job(pairs) == RasMatch::Other {
            continue;
        }
        let Some(before) = counts_of(earlier) else {
            continue;
        };
        let compared: Vec<bool> = now
            .iter()
            .filter_map(|(k, &n)| before.get(k).map(|&b| n > b))
            .collect();
        if compared.is_empty() {
            continue;
        }
        return Some(RasProgress {
            moving: compared.iter().any(|&m| m),
            from_ms: earlier.time_ms,
            to_ms: later.time_ms,
        });
    }
    None
}

/// Counts by (communicator, collective, rank or the group's place): per rank from JSON, per
/// count group from text (whose unnamed majority group is keyed by its rank count).
fn counts_of(a: &RasAnswer) -> Option<BTreeMap<(String, String, String), u64>> {
    let mut out = BTreeMap::new();
    for c in &a.communicators {
        for r in &c.ranks {
            for (kind, &n) in &r.operations {
                out.insert(
                    (c.hash.clone(), kind.clone(), format!("rank {}", r.rank)),
                    n,
                );
            }
        }
        if let Some(top) = c
            .count_groups
            .iter()
            .max_by_key(|g| (g.ranks_count, g.operations))
        {
            out.insert(
                (
                    c.hash.clone(),
                    top.collective.clone(),
                    "most ranks".to_owned(),
                ),
                top.operations,
            );
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::job::{JobId, JobPattern, JoinedBy};
    use gpudiag_model::ras::RasFailure;
    use gpudiag_telemetry::ras::parse_json;

    const T0: TimeMs = 1_800_000_000_000;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/ras")
            .join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The capture starts with the replies to the handshake, TIMEOUT and SET FORMAT.
        let start = bytes
            .iter()
            .position(|&b| b == b'{')
            .expect("a JSON report");
        bytes[start..].to_vec()
    }

    fn answer(name: &str, time_ms: TimeMs) -> RasAnswer {
        let mut a = parse_json(&fixture(name));
        a.time_ms = time_ms;
        a.address = "127.0.0.1:28028".into();
        a.for_devices = vec![0, 1, 2, 3];
        a
    }

    fn members() -> Vec<JobMember> {
        (0..4u32)
            .map(|d| JobMember {
                device: d,
                uuid: None,
                pid: 4550 + d,
                name: None,
                rank: Some(d),
                local_rank: Some(d),
                role: None,
            })
            .collect()
    }

    #[test]
    fn two_mismatched_answers_apart_show_no_progress_and_name_the_rank_behind() {
        let mut log = RasLog::default();
        log.push(answer("synthetic-mismatch-1-json.txt", T0));
        log.push(answer("synthetic-mismatch-2-json.txt", T0 + 5_000));
        let e = ras_evidence(&log, &members(), T0 + 6_000);
        assert_eq!(e.not_judged, None, "{e:?}");
        assert_eq!(e.answered_ms, Some(T0 + 5_000));
        let p = e.progress.expect("progress");
        assert!(!p.moving);
        assert_eq!((p.from_ms, p.to_ms), (T0, T0 + 5_000));
        let behind: Vec<_> = e
            .lagging
            .iter()
            .map(|r| (r.rank, r.pid, r.device))
            .collect();
        assert_eq!(behind, [(3, Some(4553), Some(3))]);
        assert_eq!(
            e.lagging[0].operations,
            Some(31),
            "AllReduce 30 and one Broadcast"
        );
        assert_eq!(e.ranks.len(), 4);
        assert!(
            e.summary.contains("rank 3 (pid 4553) up to 30"),
            "{}",
            e.summary
        );
        assert!(e.summary.contains("no count moved in 5 s"), "{}", e.summary);
    }

    #[test]
    fn a_healthy_job_moves() {
        let mut log = RasLog::default();
        log.push(answer("synthetic-healthy-1-json.txt", T0));
        log.push(answer("synthetic-healthy-2-json.txt", T0 + 3_000));
        let e = ras_evidence(&log, &members(), T0 + 3_000);
        assert!(e.progress.expect("progress").moving);
        assert!(e.summary.contains("counts moved"), "{}", e.summary);
    }

    #[test]
    fn answers_too_close_tell_no_progress() {
        let mut log = RasLog::default();
        log.push(answer("synthetic-mismatch-1-json.txt", T0));
        log.push(answer("synthetic-mismatch-2-json.txt", T0 + 500));
        assert_eq!(ras_evidence(&log, &members(), T0 + 500).progress, None);
    }

    #[test]
    fn a_dead_rank_is_behind() {
        let mut log = RasLog::default();
        log.push(answer("synthetic-dead-1-json.txt", T0));
        let e = ras_evidence(&log, &members(), T0);
        let dead: Vec<_> = e.lagging.iter().map(|r| (r.rank, r.state)).collect();
        assert_eq!(dead, [(3, RasRankState::Dead)]);
    }

    #[test]
    fn another_jobs_answer_is_not_this_jobs() {
        let mut log = RasLog::default();
        log.push(answer("synthetic-otherjob-1-json.txt", T0));
        let e = ras_evidence(&log, &members(), T0);
        assert_eq!(e.not_judged, Some(RasNotJudged::OtherJob));
        assert!(e.ranks.is_empty());
        // An answer of the job's own, older, is still shown.
        let mut log = RasLog::default();
        log.push(answer("synthetic-mismatch-1-json.txt", T0 - 20_000));
        log.push(answer("synthetic-otherjob-1-json.txt", T0));
        assert_eq!(ras_evidence(&log, &members(), T0).not_judged, None);
    }

    #[test]
    fn no_answer_says_why() {
        let log = RasLog::default();
        assert_eq!(
            ras_evidence(&log, &members(), T0).not_judged,
            Some(RasNotJudged::NotAsked)
        );
        let mut log = RasLog::default();
        log.push(RasAnswer::failed(
            T0,
            "127.0.0.1:28028",
            vec![0, 1],
            RasFailure::Refused,
            "nothing listens",
        ));
        let e = ras_evidence(&log, &members(), T0);
        assert_eq!(e.not_judged, Some(RasNotJudged::NotEnabled));
        assert!(e.summary.contains("nothing listens"));
    }

    fn verdict(pattern: JobPattern, members: Vec<JobMember>) -> JobVerdict {
        JobVerdict {
            job: JobId {
                joined_by: JoinedBy::SlurmJob,
                key: "1".into(),
            },
            presumed: false,
            members,
            verdict: pattern,
            confidence: gpudiag_model::verdict::Confidence::High,
            start_ms: T0,
            end_ms: T0,
            title: String::new(),
            advice: String::new(),
            stragglers: Vec::new(),
            doubts: Vec::new(),
            peers: Vec::new(),
            stall: None,
            ras: None,
            evidence: serde_json::Map::new(),
        }
    }

    #[test]
    fn asked_often_only_while_stuck_and_never_for_one_gpu() {
        let mut log = RasLog::default();
        let balanced = verdict(JobPattern::Balanced, members());
        assert!(log.due(&balanced, T0));
        log.asked(&[0, 1, 2, 3], T0);
        assert!(!log.due(&balanced, T0 + STUCK_INTERVAL_MS));
        assert!(log.due(&balanced, T0 + SLOW_INTERVAL_MS));
        let hung = verdict(JobPattern::Hung, members());
        assert!(!log.due(&hung, T0 + STUCK_INTERVAL_MS - 1));
        assert!(log.due(&hung, T0 + STUCK_INTERVAL_MS));
        let mut looks_stuck = verdict(JobPattern::Balanced, members());
        looks_stuck
            .evidence
            .insert("stuck_s".into(), serde_json::json!(12.0));
        assert!(log.due(&looks_stuck, T0 + STUCK_INTERVAL_MS));
        let one = verdict(JobPattern::Hung, members()[..1].to_vec());
        assert!(!log.due(&one, T0 + SLOW_INTERVAL_MS));
    }

    /// Real answers of NCCL 2.28.9 on two H100s (`tests/fixtures/ras/h100x2/`).
    #[test]
    fn real_answers_tell_moving_from_stuck_and_name_the_rank_behind() {
        let members: Vec<JobMember> = [(983, 0), (985, 1)]
            .iter()
            .map(|&(pid, device)| JobMember {
                device,
                uuid: None,
                pid,
                name: None,
                rank: Some(device),
                local_rank: Some(device),
                role: None,
            })
            .collect();
        let at = |name: &str, t: TimeMs| {
            let mut a = answer(&format!("h100x2/{name}.txt"), t);
            a.for_devices = vec![0, 1];
            a
        };
        let mut log = RasLog::default();
        log.push(at("healthy-1-json", T0));
        log.push(at("healthy-2-json", T0 + 3_000));
        let e = ras_evidence(&log, &members, T0 + 3_000);
        assert!(e.progress.as_ref().is_some_and(|p| p.moving), "{e:?}");
        assert!(e.lagging.is_empty(), "{e:?}");
        assert!(
            e.summary.contains("all 2 ranks launched 2075"),
            "{}",
            e.summary
        );

        log.push(at("mismatch-1-json", T0 + 11_000));
        log.push(at("mismatch-2-json", T0 + 15_000));
        let e = ras_evidence(&log, &members, T0 + 15_000);
        let p = e.progress.clone().expect("progress");
        assert!(!p.moving);
        assert_eq!((p.from_ms, p.to_ms), (T0 + 11_000, T0 + 15_000));
        let behind: Vec<_> = e
            .lagging
            .iter()
            .map(|r| (r.rank, r.pid, r.device, r.operations))
            .collect();
        assert_eq!(behind, [(1, Some(985), Some(1), Some(2075))]);

        log.push(at("dead-2-json", T0 + 85_000));
        let e = ras_evidence(&log, &members, T0 + 85_000);
        let dead: Vec<_> = e.lagging.iter().map(|r| (r.rank, r.state)).collect();
        assert_eq!(dead, [(1, RasRankState::Dead)]);
        assert!(e.summary.contains("considered dead"), "{}", e.summary);
    }

    /// Real answers of NCCL 2.28.9 on four H100s (`tests/fixtures/ras/h100x4/`), at the times
    /// they were asked.
    #[test]
    fn four_real_ranks_moving_then_one_stopped_calling_then_a_checkpoint() {
        let job = |pids: &[(u32, u32)]| -> Vec<JobMember> {
            pids.iter()
                .map(|&(pid, device)| JobMember {
                    device,
                    uuid: None,
                    pid,
                    name: None,
                    rank: Some(device),
                    local_rank: Some(device),
                    role: None,
                })
                .collect()
        };
        let at = |name: &str, t: TimeMs, devices: &[u32]| {
            let mut a = answer(&format!("h100x4/{name}-json.txt"), t);
            a.for_devices = devices.to_vec();
            a
        };
        let four = job(&[(1095, 0), (1096, 1), (1097, 2), (1098, 3)]);
        let mut log = RasLog::default();
        log.push(at("healthy-1", 1_795_811_682_959, &[0, 1, 2, 3]));
        log.push(at("healthy-2", 1_795_811_685_961, &[0, 1, 2, 3]));
        let e = ras_evidence(&log, &four, 1_795_811_686_000);
        assert!(e.progress.as_ref().is_some_and(|p| p.moving), "{e:?}");
        log.push(at("mismatch-1", 1_795_811_704_971, &[0, 1, 2, 3]));
        log.push(at("mismatch-2", 1_795_811_707_973, &[0, 1, 2, 3]));
        let e = ras_evidence(&log, &four, 1_795_811_708_000);
        assert!(e.progress.as_ref().is_some_and(|p| !p.moving), "{e:?}");
        let behind: Vec<_> = e
            .lagging
            .iter()
            .map(|r| (r.rank, r.pid, r.device))
            .collect();
        assert_eq!(behind, [(3, Some(1098), Some(3))]);

        // Rank 0 writing a checkpoint: behind, and unchanged 40 s apart, as a hang would be.
        let pair = job(&[(2089, 0), (2090, 1)]);
        let mut log = RasLog::default();
        log.push(at("multicomm-1", 1_795_811_918_564, &[0, 1]));
        log.push(at("ckpt-pause", 1_795_811_958_569, &[0, 1]));
        let e = ras_evidence(&log, &pair, 1_795_811_958_600);
        assert!(e.progress.as_ref().is_some_and(|p| !p.moving), "{e:?}");
        let behind: Vec<_> = e.lagging.iter().map(|r| (r.rank, r.pid)).collect();
        assert_eq!(behind, [(0, Some(2089))]);
    }

    /// A stopped rank's text answer with NCCL's garbage communicator beside the real one.
    #[test]
    fn a_garbage_communicator_is_not_taken_for_the_job() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/ras/h100x2/stopped-2-verbose.txt");
        let bytes = std::fs::read(path).expect("fixture");
        let start = bytes
            .windows(5)
            .position(|w| w == b"NCCL ")
            .expect("a text report");
        let mut a = gpudiag_telemetry::ras::parse_text(&bytes[start..]);
        a.time_ms = T0;
        a.for_devices = vec![0, 1];
        let members: Vec<JobMember> = [(668, 0), (670, 1)]
            .iter()
            .map(|&(pid, device)| JobMember {
                device,
                uuid: None,
                pid,
                name: None,
                rank: Some(device),
                local_rank: Some(device),
                role: None,
            })
            .collect();
        let mut log = RasLog::default();
        log.push(a);
        let e = ras_evidence(&log, &members, T0);
        let behind: Vec<_> = e
            .lagging
            .iter()
            .map(|r| (r.rank, r.pid, r.device))
            .collect();
        assert_eq!(behind, [(1, Some(670), Some(1))], "{e:?}");
        assert_eq!(e.ranks.len(), 1, "{e:?}");
    }

    #[test]
    fn the_log_stays_bounded() {
        let mut log = RasLog::default();
        for i in 0..(MAX_ANSWERS as u64 * 2) {
            log.push(answer("synthetic-healthy-1-json.txt", T0 + i * 1_000));
        }
        assert_eq!(log.answers().count(), MAX_ANSWERS);
        log.push(answer("synthetic-healthy-1-json.txt", T0 + KEEP_MS * 2));
        assert_eq!(log.answers().count(), 1);
    }
}
