//! The job verdict: a job's GPUs compared with each other over a window.
//!
//! A data-parallel job runs at the pace of its slowest rank. The others finish their step first
//! and wait inside a collective, where NCCL keeps a few SMs spinning, so each waiting GPU reads
//! "a kernel ran" all the time and, alone, looks busy. Side by side the GPU they wait for stands
//! out, in one of two ways:
//!
//! - it **leads**: more SM activity (tensor, power) than its peers, because it does more work
//!   each step, or the same work on a GPU that is slower or shared with another process;
//! - it **lags**: its GPU idles while its peers read busy, because its process is late to
//!   launch (short of CPU, a stalled input pipeline).
//!
//! Data-parallel ranks hold the same memory; pipeline stages do not. Where the job's processes
//! hold memory spread widely, a gap in work is the shape of the job (`imbalanced`), not one GPU
//! holding the others back. Where every GPU moves many bytes between GPUs and its tensor pipes
//! idle, the job is `communication_bound`. Otherwise it is `balanced` and each GPU's own verdict
//! stands.
//!
//! Which processes form a job is `identity`'s; the patterns are `detect`'s, one detector each.
//! The thresholds are `[rules.job]`; how they were measured is in `docs/jobs.md`.

mod detect;
mod figures;
mod identity;
mod stall;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::{RuleInput, process_state::ProcessLaunch, round2};
use crate::config::JobConfig;
use crate::history::Window;
pub(crate) use figures::gpu_name;
use figures::pct;
use gpudiag_model::job::{GpuRole, JobId, JobMember, JobPattern, JobVerdict, Straggler};
use gpudiag_model::sample::{Metric, TimeMs};
use gpudiag_model::verdict::{Bottleneck, Confidence, NotJudged, Verdict};

/// Judges one job over `[start, end]`.
fn judge_job(
    input: &RuleInput<'_>,
    launches: &ProcessLaunch,
    job: &JobId,
    members: &[JobMember],
    start: TimeMs,
    end: TimeMs,
) -> Result<JobVerdict, String> {
    let config: &JobConfig = &input.config.job;
    // The job is judged over the time its GPUs worked: NCCL's set-up before the first step and
    // the teardown after the last leave every GPU idle, and averaged in they hide the gap
    // (measured under `run`: a rank short of CPU read 29% against its peers' 58% over the run,
    // 38% against 77% once its first 10 idle seconds were left out).
    let Some((start, end)) = figures::working_span(input, members, start, end) else {
        return Err("its GPUs ran no kernel in the window".to_owned());
    };
    let span_s = end.saturating_sub(start) as f64 / 1000.0;
    if span_s + 0.5 < config.min_window_s {
        return Err(format!(
            "a window of {span_s:.0} s is too short to compare a job's GPUs: a step can last \
             seconds, so each GPU may be caught in a different part of it; judge {:.0} s or more",
            config.min_window_s
        ));
    }
    let pids: BTreeSet<u32> = members.iter().map(|m| m.pid).collect();
    let gpus: Vec<figures::Gpu> = members
        .iter()
        .map(|m| figures::figures_of(input, m, &pids, start, end))
        .collect();
    let Some((work_key, work)) = figures::work_metric(&gpus) else {
        return Err("neither SM active nor power was read on every GPU of the job".to_owned());
    };
    let mut evidence = serde_json::Map::new();
    evidence.insert("compared".into(), json!(work_key));
    evidence.insert("window_s".into(), json!(round2(span_s)));
    let (work_lo, work_hi) = gpus
        .iter()
        .filter_map(|g| work(&g.figures))
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), w| {
            (lo.min(w), hi.max(w))
        });
    evidence.insert(
        "work_spread_ratio".into(),
        json!((work_lo > 0.0).then(|| round2(work_hi / work_lo))),
    );
    evidence.insert("lead_ratio_threshold".into(), json!(config.lead_ratio));
    evidence.insert(
        "lag_util_points_threshold".into(),
        json!(config.lag_util_points),
    );
    let mut comparison = detect::Comparison {
        config,
        gpus,
        work_key,
        work,
        evidence,
    };
    let mut found = None;
    for (name, detector) in detect::DETECTORS {
        if let Some(f) = detector(&mut comparison) {
            comparison.evidence.insert("detector".into(), json!(name));
            found = Some(f);
            break;
        }
    }
    let found = found.unwrap_or_else(|| detect::balanced(&comparison));

    let grouping = Grouping::of(job, members, launches);
    let presumed = grouping.presumed;
    let confidence = grouping.confidence(found.confidence);
    // A straggler's peers wait; they are marked only where the wait is long enough to matter
    // and the job is not a guess that may join strangers.
    let waits = found
        .stragglers
        .first()
        .and_then(|s| s.peers_wait_share)
        .is_some_and(|w| w >= config.waiting_min_share)
        && !presumed;
    let ras = ras_of(input, members, end);
    let members = members
        .iter()
        .map(|m| JobMember {
            role: if found.stragglers.iter().any(|s| s.device == m.device) {
                Some(GpuRole::Straggler)
            } else {
                (waits && !found.stragglers.is_empty()).then_some(GpuRole::Waiting)
            },
            ..m.clone()
        })
        .collect();
    let title = grouping.title(job, comparison.gpus.len(), &found.title);
    let doubts = grouping.doubts;
    Ok(JobVerdict {
        job: job.clone(),
        presumed,
        members,
        verdict: found.pattern,
        confidence,
        start_ms: start,
        end_ms: end,
        title,
        advice: found.advice,
        stragglers: found.stragglers,
        doubts,
        peers: comparison.gpus.iter().map(|g| g.figures.clone()).collect(),
        stall: None,
        ras,
        evidence: comparison.evidence,
    })
}

/// What the grouping itself makes doubtful, shared by every verdict on a job: a presumed job
/// may join strangers, and ranks that disagree may join separate jobs.
struct Grouping {
    presumed: bool,
    doubts: Vec<String>,
}

impl Grouping {
    fn of(job: &JobId, members: &[JobMember], launches: &ProcessLaunch) -> Grouping {
        Grouping {
            presumed: job.joined_by.presumed(),
            doubts: identity::doubts(members, launches),
        }
    }

    /// A detector's confidence, as sure as the grouping allows.
    fn confidence(&self, found: Confidence) -> Confidence {
        if self.presumed {
            Confidence::Low
        } else if !self.doubts.is_empty() {
            lower(found)
        } else {
            found
        }
    }

    /// "Job … on N GPUs: FOUND", with the ranks' disagreement said after it.
    fn title(&self, job: &JobId, gpus: usize, found: &str) -> String {
        let gpus = if gpus == 1 {
            "1 GPU".to_owned()
        } else {
            format!("{gpus} GPUs")
        };
        let mut title = format!("{} on {gpus}: {found}", capitalised(&job.label()));
        if !self.doubts.is_empty() {
            title.push_str(&format!(
                "; but its ranks disagree ({}), so it may join separate jobs",
                self.doubts.join("; ")
            ));
        }
        title
    }
}

/// One step less sure.
fn lower(c: Confidence) -> Confidence {
    match c {
        Confidence::High => Confidence::Medium,
        _ => Confidence::Low,
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Every job of two or more GPUs judged over `[start, end]`, and the jobs that could not be.
pub fn judge_all(
    input: &RuleInput<'_>,
    launches: &ProcessLaunch,
    command: &BTreeSet<u32>,
    start: TimeMs,
    end: TimeMs,
) -> (Vec<JobVerdict>, Vec<NotJudged>) {
    let mut verdicts = Vec::new();
    let mut not_judged = Vec::new();
    if let Some(at) = launches.last_eviction_ms.filter(|&t| t >= start) {
        not_judged.push(NotJudged {
            rule: "job".to_owned(),
            device: None,
            reason: format!(
                "more than {} GPU processes were seen, so {} were evicted from the process \
                 table (the longest unseen and smallest first, every GPU's biggest process \
                 kept), the latest {:.0} s before the window's end: a job may be missing some \
                 of its processes",
                super::process_state::MAX_PROCESSES,
                launches.evicted,
                end.saturating_sub(at) as f64 / 1000.0
            ),
        });
    }
    let with_uuid = |mut m: JobMember| {
        m.uuid = input
            .devices
            .iter()
            .find(|d| d.index == m.device)
            .and_then(|d| d.uuid.clone());
        m
    };
    let groups = identity::group(launches, input.process_memory, start, end, command);
    // A rank that exited before the window began is still one its peers wait for: the stall
    // looks back as far as the process table keeps it.
    let look_back = end.saturating_sub(stall::LOOK_BACK_MS).min(start);
    let with_gone =
        identity::group_with_lone_ranks(launches, input.process_memory, look_back, end, command);
    for (job, members) in with_gone {
        let absent = identity::absent_ranks(&members, launches);
        if members.len() < 2 && absent.ranks.is_empty() {
            continue;
        }
        let ranks: Vec<stall::Rank> = members
            .into_iter()
            .map(|m| {
                let last = launches
                    .seen
                    .get(&(m.device, m.pid))
                    .map(|p| p.last_seen_ms);
                let latest = input.history.latest_ms(m.device).unwrap_or(end).min(end);
                let peak_power_w = input
                    .history
                    .series_in(
                        m.device,
                        Metric::PowerW,
                        Window::Range {
                            start_ms: look_back,
                            end_ms: end,
                        },
                    )
                    .map(|(_, w)| w)
                    .reduce(f64::max);
                stall::Rank {
                    left_ms: last.filter(|&t| t.saturating_add(stall::GONE_AFTER_MS) < latest),
                    peak_power_w,
                    member: with_uuid(m),
                }
            })
            .collect();
        // A job none of whose ranks is there any more has ended, not stalled.
        if ranks.iter().all(|r| r.left_ms.is_some_and(|t| t < start)) {
            continue;
        }
        let seen = stall::detect(input, &ranks, &absent, start, end);
        let current = groups.get(&job);
        match seen {
            stall::Seen::Found(found) => {
                verdicts.push(stalled_verdict(
                    input, launches, &job, &ranks, start, end, *found,
                ));
                continue;
            }
            stall::Seen::TooShort { stuck_s } => {
                not_judged.push(NotJudged {
                    rule: "job".to_owned(),
                    device: None,
                    reason: format!(
                        "{}: its GPUs sat in collectives that move nothing for the whole {:.0} s \
                         seen, and a hang is called after {:.0} s (`hang_after_s`): judge a \
                         longer window",
                        capitalised(&job.label()),
                        stuck_s,
                        input.config.job.hang_after_s
                    ),
                });
                continue;
            }
            stall::Seen::Stuck { since_ms, stuck_s } => {
                if let Some(members) = current {
                    let members: Vec<JobMember> = members.iter().cloned().map(with_uuid).collect();
                    match judge_job(input, launches, &job, &members, start, end) {
                        Ok(mut v) => {
                            v.title.push_str(&format!(
                                "; its GPUs have made no progress for {stuck_s:.0} s (a stall is \
                                 called after {:.0} s)",
                                input.config.job.hang_after_s
                            ));
                            v.evidence.insert("stuck_s".into(), json!(round2(stuck_s)));
                            v.evidence.insert("stuck_since_ms".into(), json!(since_ms));
                            verdicts.push(v);
                        }
                        Err(reason) => not_judged.push(NotJudged {
                            rule: "job".to_owned(),
                            device: None,
                            reason: format!("{}: {reason}", capitalised(&job.label())),
                        }),
                    }
                }
                continue;
            }
            stall::Seen::Moving => {}
        }
        let Some(members) = current else { continue };
        let members: Vec<JobMember> = members.iter().cloned().map(with_uuid).collect();
        match judge_job(input, launches, &job, &members, start, end) {
            Ok(v) => verdicts.push(v),
            Err(reason) => not_judged.push(NotJudged {
                rule: "job".to_owned(),
                device: None,
                reason: format!("{}: {reason}", capitalised(&job.label())),
            }),
        }
    }
    (verdicts, not_judged)
}

/// The verdict on a job that makes no progress.
fn stalled_verdict(
    input: &RuleInput<'_>,
    launches: &ProcessLaunch,
    job: &JobId,
    ranks: &[stall::Rank],
    start: TimeMs,
    end: TimeMs,
    found: stall::StallFound,
) -> JobVerdict {
    let all: Vec<JobMember> = ranks.iter().map(|r| r.member.clone()).collect();
    let grouping = Grouping::of(job, &all, launches);
    let mut confidence = grouping.confidence(found.confidence);
    let missing: BTreeSet<u32> = found.stall.missing.iter().map(|m| m.device).collect();
    let members = all
        .iter()
        .map(|m| JobMember {
            role: if found.stragglers.iter().any(|s| s.device == m.device) {
                Some(GpuRole::Straggler)
            } else if missing.contains(&m.device) {
                Some(GpuRole::Missing)
            } else if found.stall.waiting.contains(&m.device) {
                Some(GpuRole::Waiting)
            } else {
                None
            },
            ..m.clone()
        })
        .collect();
    let mut title = grouping.title(job, all.len(), &found.title);
    // NCCL's own view, where it answered for this job: its counts back the verdict, and counts
    // that moved between two answers contradict it.
    let ras = ras_of(input, &all, end);
    if let Some(r) = ras.as_ref().filter(|r| r.not_judged.is_none()) {
        if r.progress.as_ref().is_some_and(|p| p.moving) {
            confidence = Confidence::Low;
            title.push_str("; but NCCL's RAS saw the job's collectives move between two answers");
        }
        title.push_str(&format!("; {}", r.summary));
    }
    let pids: BTreeSet<u32> = all.iter().map(|m| m.pid).collect();
    JobVerdict {
        job: job.clone(),
        presumed: grouping.presumed,
        members,
        verdict: found.pattern,
        confidence,
        start_ms: start,
        end_ms: end,
        title,
        advice: found.advice,
        stragglers: found.stragglers,
        doubts: grouping.doubts,
        peers: ranks
            .iter()
            .filter(|r| r.left_ms.is_none())
            .map(|r| {
                figures::figures_of(input, &r.member, &pids, found.stall.since_ms, end).figures
            })
            .collect(),
        stall: Some(found.stall),
        ras,
        evidence: found.evidence,
    }
}

/// What NCCL's RAS said about the job, where it was asked: a job never asked carries nothing
/// (most jobs, most of the time: it is asked while the job looks stuck, and slowly otherwise).
fn ras_of(
    input: &RuleInput<'_>,
    members: &[JobMember],
    end: TimeMs,
) -> Option<gpudiag_model::ras::RasEvidence> {
    let evidence = super::ras_log::ras_evidence(input.ras?, members, end);
    (evidence.not_judged != Some(gpudiag_model::ras::RasNotJudged::NotAsked)).then_some(evidence)
}

/// The findings the job verdicts raise, so `check --fail-on`, the findings views and `serve`'s
/// finding series carry them: a straggler is a warning on its GPU (its peers' time is lost),
/// a communication-bound or imbalanced job information on the host. A presumed job's straggler
/// is information: the job may join strangers.
pub fn findings(jobs: &[JobVerdict], config: &JobConfig) -> Vec<gpudiag_model::finding::Finding> {
    use gpudiag_model::finding::{Evidence, Finding, Severity};
    let mut out = Vec::new();
    for j in jobs {
        let job_finding = |id: &str, severity, s: Option<&Straggler>, threshold: String| {
            let mut values = serde_json::Map::new();
            values.insert("job".into(), json!(j.job.label()));
            values.insert("joined_by".into(), json!(j.job.joined_by.name()));
            values.insert("gpus".into(), json!(j.members.len()));
            if let Some(s) = s {
                values.insert("pace".into(), json!(s.pace));
                values.insert(s.metric.clone(), json!(s.value));
                values.insert("peers_median".into(), json!(s.peers_median));
                values.insert("peers_wait_share".into(), json!(s.peers_wait_share));
            }
            if j.stragglers.len() > 1 {
                let devices: Vec<u32> = j.stragglers.iter().map(|s| s.device).collect();
                values.insert("stragglers".into(), json!(devices));
            }
            if !j.doubts.is_empty() {
                values.insert("doubts".into(), json!(j.doubts));
            }
            Finding::new(
                id.to_owned(),
                severity,
                s.map(|s| s.device),
                j.end_ms,
                j.title.clone(),
                Evidence {
                    values,
                    window_s: round2(j.end_ms.saturating_sub(j.start_ms) as f64 / 1000.0),
                    threshold,
                },
                j.advice.clone(),
            )
        };
        match j.verdict {
            // Each straggler's GPU carries the warning: the others' time is lost to each.
            JobPattern::Straggler => {
                let severity = if j.presumed {
                    Severity::Info
                } else {
                    Severity::Warn
                };
                let threshold = format!(
                    "SM active ≥ {}× its peers' median (leads), or utilisation ≥ {} points \
                     below it while they read ≥ {}% (lags)",
                    config.lead_ratio, config.lag_util_points, config.peers_busy_util_pct
                );
                for s in &j.stragglers {
                    out.push(job_finding(
                        "job.straggler",
                        severity,
                        Some(s),
                        threshold.clone(),
                    ));
                }
            }
            JobPattern::CommunicationBound => out.push(job_finding(
                "job.communication_bound",
                Severity::Info,
                None,
                format!(
                    "every GPU ≥ {} GB/s between GPUs with tensor active < {}%",
                    config.communication_min_gb_per_s, config.communication_max_tensor_pct
                ),
            )),
            JobPattern::Imbalanced => out.push(job_finding(
                "job.imbalanced",
                Severity::Info,
                None,
                format!(
                    "memory held spread ≥ {}× and ≥ {} GiB, or work graded across the GPUs",
                    config.memory_spread_ratio, config.memory_spread_min_gib
                ),
            )),
            JobPattern::Balanced => {}
            JobPattern::Hung | JobPattern::RankExited | JobPattern::RankStopped => {
                // The job makes no progress: a failure, but for a presumed job, which may
                // join strangers.
                let severity = if j.presumed {
                    Severity::Warn
                } else {
                    Severity::Fail
                };
                let id = format!("job.{}", j.verdict.name());
                let mut f = job_finding(
                    &id,
                    severity,
                    None,
                    format!(
                        "GPUs in collectives (utilisation ≥ {}%) moving < {} MB/s, tensor and \
                         DRAM ≤ {}%, drawing ≤ {}× the job's working draw, for ≥ {} s",
                        config.hang_spin_util_pct,
                        config.hang_max_link_mb_per_s,
                        config.hang_max_busy_pct,
                        config.hang_power_ratio,
                        config.hang_after_s
                    ),
                );
                if let Some(stall) = &j.stall {
                    let v = &mut f.evidence.values;
                    v.insert("stuck_s".into(), json!(stall.stuck_s));
                    v.insert("since_ms".into(), json!(stall.since_ms));
                    v.insert("waiting".into(), json!(stall.waiting));
                    v.insert(
                        "missing".into(),
                        json!(stall.missing.iter().map(|m| m.device).collect::<Vec<_>>()),
                    );
                    v.insert(
                        "missing_pids".into(),
                        json!(stall.missing.iter().map(|m| m.pid).collect::<Vec<_>>()),
                    );
                    if !stall.absent_ranks.is_empty() {
                        v.insert("absent_ranks".into(), json!(stall.absent_ranks));
                    }
                    // On the missing rank's GPU where there is one: that is the GPU to look at;
                    // else on a waiting one, where a rank that left before gpudiag looked holds it.
                    f.device = stall.missing.first().map(|m| m.device).or_else(|| {
                        (!stall.absent_ranks.is_empty())
                            .then(|| stall.waiting.first().copied())
                            .flatten()
                    });
                }
                out.push(f);
            }
        }
    }
    out
}

/// Rewrites the verdicts of GPUs that their job explains. A GPU that waits for its job's
/// straggler much of the time is not "the good case" however busy its counters read: it gets
/// `waiting_for_peer`, its own verdict kept in the evidence. A communication-bound job's GPUs
/// keep their verdict with the job's reason and advice.
pub fn explain_by_job(verdicts: &mut BTreeMap<u32, Verdict>, jobs: &[JobVerdict]) {
    // A communication-bound job's GPUs run mostly NCCL's kernels, which keep few SMs busy: alone
    // each reads underfilled (or launch- or sync-bound), and that verdict's advice (bigger
    // grids, fewer launches) is not what helps. The verdict stays; its advice becomes the job's.
    for job in jobs
        .iter()
        .filter(|j| j.verdict == JobPattern::CommunicationBound && !j.presumed)
    {
        for m in &job.members {
            let Some(v) = verdicts.get_mut(&m.device) else {
                continue;
            };
            if !matches!(
                v.bottleneck,
                Bottleneck::Underfilled | Bottleneck::LaunchBound | Bottleneck::SyncBound
            ) {
                continue;
            }
            v.evidence
                .insert("job_verdict".into(), json!(job.verdict.name()));
            v.title = format!(
                "{}; its kernels are mostly the collectives of {}, which is communication-bound",
                v.title,
                job.job.label()
            );
            v.advice = format!("See the job's verdict: {}", job.advice);
        }
    }
    // A job that makes no progress: its waiting GPUs' own verdicts (busy, underfilled) say
    // nothing true; the rank they wait for does.
    for job in jobs.iter().filter(|j| !j.presumed) {
        let Some(stall) = &job.stall else { continue };
        if !job.verdict.stalled() {
            continue;
        }
        let whom = if stall.missing.is_empty() && !stall.absent_ranks.is_empty() {
            format!(
                "{} {}, which does not run on this host (it left before gpudiag looked)",
                if stall.absent_ranks.len() == 1 {
                    "rank"
                } else {
                    "ranks"
                },
                stall::names(stall.absent_ranks.iter().map(u32::to_string))
            )
        } else if stall.missing.is_empty() {
            "a rank that never comes (every rank of the job on this host waits)".to_owned()
        } else {
            stall::names(stall.missing.iter().map(|m| gpu_name(m.device, m.rank)))
        };
        for &device in &stall.waiting {
            let Some(v) = verdicts.get_mut(&device) else {
                continue;
            };
            let own = v.bottleneck;
            if own != Bottleneck::WaitingForPeer {
                v.evidence
                    .insert("own_bottleneck".into(), json!(own.name()));
            }
            v.evidence
                .insert("job_verdict".into(), json!(job.verdict.name()));
            v.evidence.insert("stuck_s".into(), json!(stall.stuck_s));
            if let Some(m) = stall.missing.first() {
                v.evidence
                    .insert("waits_for_device".into(), json!(m.device));
            }
            v.title = format!(
                "GPU {device} has waited {:.0} s inside a collective for {whom}: it makes no \
                 progress ({} of {})",
                stall.stuck_s,
                job.verdict.name().replace('_', " "),
                job.job.label()
            );
            v.advice = format!("{} See the job's verdict.", job.advice);
            v.bottleneck = Bottleneck::WaitingForPeer;
            v.confidence = job.confidence;
        }
        for m in &stall.missing {
            let Some(v) = verdicts.get_mut(&m.device) else {
                continue;
            };
            v.evidence
                .insert("job_verdict".into(), json!(job.verdict.name()));
            v.title = format!(
                "{}; the other GPUs of {} wait for it (see the job's verdict)",
                v.title,
                job.job.label()
            );
        }
    }
    // The GPUs the verdict marked waiting (never a presumed job's: it may join strangers).
    for job in jobs.iter().filter(|j| !j.presumed && !j.verdict.stalled()) {
        let Some(share) = job.stragglers.first().and_then(|s| s.peers_wait_share) else {
            continue;
        };
        let (whom, advice) = match job.stragglers.as_slice() {
            [one] => {
                let name = gpu_name(one.device, one.rank);
                (
                    format!("{name}, the straggler of {}", job.job.label()),
                    format!("Speed up {name}, the job's straggler, not this GPU"),
                )
            }
            several => {
                let names = detect::names(several);
                (
                    format!("{names}, the stragglers of {}", job.job.label()),
                    format!("Speed up {names}, the job's stragglers, not this GPU"),
                )
            }
        };
        let waits_for: Vec<u32> = job.stragglers.iter().map(|s| s.device).collect();
        for m in job
            .members
            .iter()
            .filter(|m| m.role == Some(GpuRole::Waiting))
        {
            let Some(v) = verdicts.get_mut(&m.device) else {
                continue;
            };
            if matches!(v.bottleneck, Bottleneck::Idle | Bottleneck::WaitingForPeer) {
                continue;
            }
            let own = v.bottleneck;
            v.evidence
                .insert("own_bottleneck".into(), json!(own.name()));
            v.evidence
                .insert("waits_for_device".into(), json!(waits_for[0]));
            if waits_for.len() > 1 {
                v.evidence
                    .insert("waits_for_devices".into(), json!(waits_for));
            }
            v.evidence.insert("peers_wait_share".into(), json!(share));
            v.title = format!(
                "GPU {} waits for {whom}, about {} of the time; on its own it reads {} ({})",
                m.device,
                pct(share * 100.0),
                own.name().replace('_', "-"),
                super::bottleneck::brief(v)
            );
            v.advice = format!("{advice}: see the job's verdict.");
            v.bottleneck = Bottleneck::WaitingForPeer;
            v.confidence = v.confidence.min(job.confidence);
        }
    }
}

/// Job verdicts over consecutive slices of `[start, end]`, neighbours with the same verdict and
/// straggler merged and judged again over their whole span.
pub fn phases(
    input: &RuleInput<'_>,
    launches: &ProcessLaunch,
    command: &BTreeSet<u32>,
    start: TimeMs,
    end: TimeMs,
) -> BTreeMap<JobId, Vec<JobVerdict>> {
    let step = super::bottleneck::slice_ms(end.saturating_sub(start));
    let mut spans: BTreeMap<JobId, Vec<(JobVerdict, usize)>> = BTreeMap::new();
    // The slice each job was last judged in: a slice it was not judged in (idle, gone) ends
    // its phase.
    let mut last_judged: BTreeMap<JobId, usize> = BTreeMap::new();
    let mut at = start;
    let mut slice = 0usize;
    while at < end {
        let to = at.saturating_add(step).min(end);
        let (verdicts, _) = judge_all(input, launches, command, at, to);
        for v in verdicts {
            let follows = last_judged.insert(v.job.clone(), slice) == slice.checked_sub(1);
            let list = spans.entry(v.job.clone()).or_default();
            match list.last_mut() {
                Some((prev, slices)) if follows && same_phase(prev, &v) => {
                    // A stall's latest reading is its whole stretch so far.
                    if v.verdict.stalled() {
                        let start = prev.start_ms;
                        *prev = v;
                        prev.start_ms = start;
                    } else {
                        prev.end_ms = v.end_ms;
                    }
                    *slices += 1;
                }
                _ => list.push((v, 1)),
            }
        }
        at = to.saturating_add(1);
        slice += 1;
    }
    spans
        .into_iter()
        .map(|(job, list)| {
            let merged = list
                .into_iter()
                .map(|(v, slices)| {
                    if slices == 1 || v.verdict.stalled() {
                        return v;
                    }
                    judge_job(input, launches, &v.job, &v.members, v.start_ms, v.end_ms)
                        .unwrap_or(v)
                })
                .collect();
            (job, fold_stalls(merged, start))
        })
        .collect()
}

/// A stall is called only once it has lasted `hang_after_s`; the phases before it that fall
/// inside its stretch were the same stall, not yet called (a rank that "lags" because it
/// sleeps). They become part of it, so the phases say when the job stopped, not when gpudiag
/// was sure.
fn fold_stalls(phases: Vec<JobVerdict>, start: TimeMs) -> Vec<JobVerdict> {
    let mut out: Vec<JobVerdict> = Vec::with_capacity(phases.len());
    for mut v in phases {
        if let Some(since) = v
            .stall
            .as_ref()
            .filter(|_| v.verdict.stalled())
            .map(|s| s.since_ms.max(start))
        {
            while out.last().is_some_and(|p| p.start_ms >= since) {
                out.pop();
            }
            if let Some(prev) = out.last_mut() {
                prev.end_ms = prev.end_ms.min(since.saturating_sub(1));
            }
            v.start_ms = since;
        }
        out.push(v);
    }
    out
}

fn same_phase(a: &JobVerdict, b: &JobVerdict) -> bool {
    a.verdict == b.verdict
        && a.stragglers
            .iter()
            .map(|s| s.device)
            .eq(b.stragglers.iter().map(|s| s.device))
}
