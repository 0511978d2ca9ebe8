//! Jobs that make no progress: real recordings from 4 × H100 (a rank that stopped calling the
//! all-reduce, a rank stopped with SIGSTOP, a rank-0 checkpoint) and cases derived from them (a
//! rank that exited, every rank waiting, no profiling counters, no host side, a window too short),
//! made by `tests/fixtures/make_stall_cases.py`, whose docstring tells what each must get.
//! Replayed through `check --json`, and the text and `run`-style phases where they matter.

use std::path::PathBuf;

use gpudiag_core::check::CheckReport;
use gpudiag_model::finding::Severity;
use gpudiag_model::job::{GpuRole, JobPattern, JobVerdict, Pace};
use gpudiag_model::sample::ProcessState;
use gpudiag_model::verdict::{Bottleneck, Confidence};

use crate::support::at;

fn case(name: &str) -> PathBuf {
    at("tests/fixtures/stalls").join(format!("{name}.ndjson.gz"))
}

/// The report and the exit code of `check --json` over the whole recording.
fn check(name: &str, extra: &[&str]) -> (CheckReport, i32) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--json", "--replay"])
        .arg(case(name))
        .args(extra)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code <= 1,
        "{name}: exit {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), code)
}

fn job_on(report: &CheckReport, device: u32) -> &JobVerdict {
    report
        .jobs
        .iter()
        .find(|j| j.devices().any(|d| d == device))
        .unwrap_or_else(|| panic!("no job on GPU {device}: {:#?}", report.jobs))
}

fn verdict_of(report: &CheckReport, device: u32) -> Bottleneck {
    report
        .devices
        .iter()
        .find(|d| d.info.index == device)
        .and_then(|d| d.verdict.as_ref())
        .map(|v| v.bottleneck)
        .unwrap_or_else(|| panic!("no verdict on GPU {device}"))
}

/// The finding `id` on any device or the host.
fn has_finding(report: &CheckReport, id: &str, severity: Severity) -> bool {
    report
        .devices
        .iter()
        .flat_map(|d| d.findings.iter())
        .chain(report.host_findings.iter())
        .any(|f| f.id == id && f.severity == severity)
}

#[test]
fn a_rank_that_stopped_calling_the_all_reduce_is_hung_and_named_with_its_pid() {
    let (r, code) = check("real-hung", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::Hung, "{}", job.title);
    assert_eq!(job.confidence, Confidence::High);
    let stall = job.stall.as_ref().expect("a stall");
    assert_eq!(stall.waiting, [0, 1, 2]);
    assert_eq!(stall.missing.len(), 1);
    let missing = &stall.missing[0];
    assert_eq!((missing.device, missing.rank), (3, Some(3)));
    assert_eq!(missing.state, Some(ProcessState::Sleeping));
    assert!(missing.cpu_pct.is_some_and(|c| c < 5.0), "{missing:?}");
    assert!(stall.stuck_s >= 30.0, "{stall:?}");
    // Its own draw fell to a third of what it drew at work.
    let ratio = stall.stuck_power_w.unwrap() / stall.working_power_w.unwrap();
    assert!(ratio < 0.5, "{stall:?}");
    assert!(
        job.advice
            .contains(&format!("py-spy dump --pid {}", missing.pid))
    );
    assert!(job.advice.contains("TORCH_NCCL_TRACE_BUFFER_SIZE"));
    assert_eq!(job.role_of(3), Some(GpuRole::Missing));
    for d in 0..3 {
        assert_eq!(job.role_of(d), Some(GpuRole::Waiting));
        assert_eq!(verdict_of(&r, d), Bottleneck::WaitingForPeer);
    }
    assert!(has_finding(&r, "job.hung", Severity::Fail));
    assert_eq!(code, 1, "a hung job fails the check");
}

#[test]
fn a_stopped_rank_is_named_with_how_to_resume_it_and_the_other_job_stays_balanced() {
    let (r, code) = check("real-stopped", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::RankStopped, "{}", job.title);
    let stall = job.stall.as_ref().unwrap();
    let missing = &stall.missing[0];
    assert_eq!(missing.device, 1);
    assert_eq!(missing.state, Some(ProcessState::Stopped));
    assert!(missing.since_ms.is_some());
    assert!(job.advice.contains(&format!("kill -CONT {}", missing.pid)));
    assert_eq!(job_on(&r, 2).verdict, JobPattern::Balanced);
    assert!(has_finding(&r, "job.rank_stopped", Severity::Fail));
    assert_eq!(code, 1);
}

#[test]
fn a_rank_that_exited_is_named_with_when_it_left() {
    let (r, code) = check("exited", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::RankExited, "{}", job.title);
    let stall = job.stall.as_ref().unwrap();
    let missing = &stall.missing[0];
    assert_eq!(missing.device, 1);
    assert!(missing.left_ms.is_some(), "{missing:?}");
    assert!(missing.inspect.is_none(), "nothing left to dump");
    assert!(job.title.contains("exited"), "{}", job.title);
    assert!(has_finding(&r, "job.rank_exited", Severity::Fail));
    assert_eq!(code, 1);
}

#[test]
fn a_rank_zero_checkpoint_is_a_slow_rank_not_a_hang() {
    let (r, code) = check("real-checkpoint", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::Straggler, "{}", job.title);
    assert_eq!(job.stragglers.len(), 1);
    assert_eq!(job.stragglers[0].device, 0);
    assert_eq!(job.stragglers[0].pace, Pace::Lags);
    assert!(job.title.contains("works on the host"), "{}", job.title);
    assert!(job.advice.contains("async"), "{}", job.advice);
    assert_eq!(job_on(&r, 2).verdict, JobPattern::Balanced);
    assert!(!has_finding(&r, "job.hung", Severity::Fail));
    assert_eq!(code, 0, "a slow rank is a warning");
}

#[test]
fn every_rank_waiting_is_hung_with_no_rank_to_blame() {
    let (r, _) = check("all-waiting", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::Hung, "{}", job.title);
    let stall = job.stall.as_ref().unwrap();
    assert!(stall.missing.is_empty());
    assert_eq!(stall.waiting, [0, 1, 2, 3]);
    assert!(job.title.contains("every rank"), "{}", job.title);
}

#[test]
fn without_profiling_counters_a_hang_is_judged_on_power_at_lower_confidence() {
    let (r, _) = check("no-profiling", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::Hung, "{}", job.title);
    assert_eq!(job.confidence, Confidence::Medium);
    assert!(
        job.title.contains("without profiling counters"),
        "{}",
        job.title
    );
}

#[test]
fn without_the_host_side_the_missing_rank_is_still_named_but_not_why() {
    let (r, _) = check("no-host-side", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::Hung, "{}", job.title);
    assert_eq!(job.confidence, Confidence::Medium);
    let missing = &job.stall.as_ref().unwrap().missing[0];
    assert_eq!(missing.device, 3);
    assert_eq!(missing.state, None);
    assert!(job.title.contains("could not be read"), "{}", job.title);
}

#[test]
fn a_window_shorter_than_a_hang_takes_says_so_instead_of_blaming_a_rank() {
    let (r, code) = check("too-short", &[]);
    assert!(
        r.jobs.iter().all(|j| j.verdict != JobPattern::Straggler),
        "{:#?}",
        r.jobs
    );
    assert!(
        r.not_judged
            .iter()
            .any(|n| n.rule == "job" && n.reason.contains("a hang is called after 30 s")),
        "{:#?}",
        r.not_judged
    );
    assert_eq!(code, 0);
}

/// A live `check --window 30s` holds nothing from before the stall: no working draw to compare
/// with, which must not read as "the job draws what it drew at work".
#[test]
fn a_live_window_that_holds_only_the_stall_is_hung() {
    let (r, code) = check("live-window", &[]);
    let job = job_on(&r, 0);
    assert_eq!(job.verdict, JobPattern::Hung, "{}", job.title);
    let stall = job.stall.as_ref().unwrap();
    assert_eq!(stall.missing[0].device, 1);
    assert_eq!(stall.working_power_w, None);
    assert_eq!(code, 1);
}

#[test]
fn the_phases_say_when_the_job_stopped_not_when_it_was_called() {
    let (r, _) = check("real-hung", &[]);
    let phases = &r
        .job_phases
        .iter()
        .find(|p| p.phases.iter().any(|v| v.verdict == JobPattern::Hung))
        .expect("a hung phase")
        .phases;
    let hung = phases.last().unwrap();
    assert_eq!(hung.verdict, JobPattern::Hung);
    let since = hung.stall.as_ref().unwrap().since_ms;
    assert_eq!(hung.start_ms, since.max(r.window.start_ms.unwrap()));
    // Nothing before the stall is called a straggler inside the stall's stretch.
    for p in &phases[..phases.len() - 1] {
        assert!(p.end_ms < since, "{p:#?}");
    }
}

#[test]
fn the_text_names_the_missing_rank_and_marks_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["--config", "/dev/null", "check", "--replay"])
        .arg(case("real-hung"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("job verdict: hung"), "{text}");
    assert!(text.contains("◀ missing"), "{text}");
    assert!(text.contains("asleep with no CPU progress"), "{text}");
}

/// A fresh `check` after a rank of a launcher-less job was killed never sees that rank: the one
/// left spins alone. Its ranks meet at 127.0.0.1, so the rank it lacks must run on this host and
/// does not: it exited before the window.
#[test]
fn a_rank_gone_before_the_window_is_named_by_its_rank() {
    let (r, code) = check("lone-rank", &[]);
    let job = job_on(&r, 2);
    assert_eq!(job.verdict, JobPattern::RankExited, "{}", job.title);
    assert_eq!(job.confidence, Confidence::Medium);
    assert_eq!(job.members.len(), 1);
    assert_eq!(job.members[0].role, Some(GpuRole::Waiting));
    let stall = job.stall.as_ref().unwrap();
    assert!(stall.missing.is_empty());
    assert_eq!(stall.absent_ranks, [1]);
    assert!(
        job.title.contains(
            "waiting for rank 1 of its 2, which does not run: its ranks meet at 127.0.0.1"
        ),
        "{}",
        job.title
    );
    assert_eq!(verdict_of(&r, 2), Bottleneck::WaitingForPeer);
    assert!(has_finding(&r, "job.rank_exited", Severity::Fail));
    // The hung job beside it keeps its own verdict.
    assert_eq!(job_on(&r, 0).verdict, JobPattern::Hung);
    assert_eq!(code, 1);
}
