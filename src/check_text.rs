//! The human-readable form of a check report. Absent values print as "n/a", never as 0. A
//! device's telemetry lines are the text templates of the metric table, line by line. Every
//! string the report carries came from a driver or a recording, so each goes through
//! `printable::line` on its way in.

use std::collections::BTreeMap;
use std::fmt::Write;

use gpudiag_core::check::{CheckReport, DeviceReport};
use gpudiag_core::history::WindowStats;
use gpudiag_model::finding::Finding;
use gpudiag_model::finding::Status;
use gpudiag_model::kernels::RecordedKernels;
use gpudiag_model::metric_table;
use gpudiag_model::printable::line as esc;
use gpudiag_model::sample::MetricDef;
use gpudiag_model::sample::{Absent, METRIC_TABLE, Sample};
use gpudiag_model::verdict::Basis;

use crate::format::clock;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn na(v: Option<&str>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| esc(v).into_owned())
}

fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

fn gib(v: Option<u64>) -> String {
    fixed(v.map(|b| b as f64 / GIB), 1)
}

fn rate(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.1} GB/s", b / 1e9)
    } else {
        format!("{:.0} MB/s", b / 1e6)
    }
}

pub fn render(report: &CheckReport) -> String {
    let mut out = String::new();
    let h = &report.host;
    let _ = writeln!(
        out,
        "gpudiag {} · host {} · driver {} (CUDA {}) · source {}{}",
        report.tool.version,
        na(h.hostname.as_deref()),
        na(h.driver_version.as_deref()),
        na(h.cuda_driver_version.as_deref()),
        esc(&report.source.backend),
        report
            .source
            .recording
            .as_deref()
            .map(|r| format!(" {}", esc(r)))
            .unwrap_or_default(),
    );
    let w = &report.window;
    let _ = writeln!(
        out,
        "window {:.1} s, {} sample tick(s)",
        w.covered_s, w.ticks
    );
    for w in &report.source.warnings {
        let _ = writeln!(out, "note: {}", esc(w));
    }
    render_verdicts(&mut out, report);
    if let Some(libs) = &report.libraries {
        let parts: Vec<String> = libs
            .iter()
            .map(|l| match (&l.found, &l.version) {
                (true, Some(v)) => format!("{} {}", esc(&l.name), esc(v)),
                (true, None) => format!("{} (version unknown)", esc(&l.name)),
                (false, _) => format!("{} not found", esc(&l.name)),
            })
            .collect();
        let _ = writeln!(out, "libraries: {}", parts.join(" · "));
    }
    for d in &report.devices {
        out.push('\n');
        render_device(&mut out, d);
    }
    if let Some(k) = &report.kernels {
        out.push('\n');
        render_kernels(&mut out, k, report.window.requested_s.is_some());
    }
    if let Some(t) = &report.topology {
        out.push('\n');
        out.push_str(&gpudiag_model::topology::render(t));
    }
    if !report.host_findings.is_empty() {
        out.push_str("\nhost findings:\n");
        for f in &report.host_findings {
            let _ = writeln!(
                out,
                "  [{}] {}{}{} — {}",
                f.severity,
                esc(&f.title),
                f.recorded_tag(),
                span_tag(f),
                esc(&f.advice)
            );
        }
    }
    let count = |sev| {
        report
            .devices
            .iter()
            .flat_map(|d| &d.findings)
            .chain(&report.host_findings)
            .filter(|f| f.severity == sev)
            .count()
    };
    use gpudiag_model::finding::Severity::*;
    let _ = writeln!(
        out,
        "\nstatus: {} ({} fail, {} warn, {} info) · exit code {}",
        report.status,
        count(Fail),
        count(Warn),
        count(Info),
        report.exit_code
    );
    match report.status {
        Status::NotJudged => out.push_str(
            "  a GPU gave no reading in the window: gpudiag was blind to it, so \"healthy\" \
             cannot be said (see \"not judged\" above)\n",
        ),
        Status::CouldNotRun => {
            let why = report.could_not_run.as_deref().unwrap_or("no reason given");
            let _ = writeln!(out, "  could not run: {}", esc(why));
        }
        _ => {}
    }
    out
}

/// What `run --kernels` recorded, as `run` printed it at its end, under a line saying which
/// summary it is and whether the verdicts above rest on it.
fn render_kernels(out: &mut String, k: &RecordedKernels, window_cut: bool) {
    let whose = if !k.ended {
        format!(
            "the latest summary, at {}: the recording ends before the command did, so the \
             verdicts above rest on the counters",
            clock(k.time_ms)
        )
    } else if window_cut {
        "the run's own; the verdicts above are of the window and rest on the counters, the \
         kernels on the whole run"
            .to_owned()
    } else {
        "the run's own, as `run` printed it".to_owned()
    };
    let _ = writeln!(out, "kernels recorded by `run --kernels` ({whose}):");
    out.push_str(&crate::kernels_text::kernels_section(&k.summary));
}

/// The metric table's text lines (`MetricDef::text`) that this view treats specially.
const ERRORS_LINE: u8 = 5;
const PROFILING_LINE: u8 = 6;

fn render_device(out: &mut String, d: &DeviceReport) {
    let i = &d.info;
    let _ = writeln!(
        out,
        "GPU {}  {}  {}  {}{}  {} GiB  {}",
        i.index,
        na(i.name.as_deref()),
        na(i.pci_bus_id.as_deref()),
        na(i.architecture.as_deref()),
        // Compute capability is NVIDIA's notion; other vendors simply have none to show.
        i.compute_capability
            .map(|cc| format!(" (cc {cc})"))
            .unwrap_or_default(),
        gib(i.memory_total_bytes),
        na(i.uuid.as_deref()),
    );
    let Some(s) = &d.latest else {
        out.push_str("  no samples\n");
        return;
    };
    let stat = |m: &MetricDef, pick: fn(&WindowStats) -> Option<f64>| {
        m.series
            .and_then(|series| d.summary.get(&series))
            .and_then(pick)
    };
    let mut lines: BTreeMap<u8, Vec<String>> = BTreeMap::new();
    for m in METRIC_TABLE {
        let Some(text) = m.text else { continue };
        let item = metric_table::expand(text.template, |name| {
            let (format, v) = match name {
                "" => (m.format, m.shown(Some(s), i)),
                "mean" => (m.format, stat(m, |w| w.mean)),
                "max" => (m.format, stat(m, |w| w.max)),
                other => match gpudiag_model::sample::by_name(other) {
                    Some(o) => (o.format, o.shown(Some(s), i)),
                    None => (m.format, None),
                },
            };
            v.map(|v| format.show(v, rate))
        });
        lines.entry(text.line).or_default().push(item);
    }
    // Throttle reasons are a list of decoded names, not a value the table formats; they close
    // the memory-errors line.
    if let Some(errors) = lines.get_mut(&ERRORS_LINE) {
        errors.push(format!("throttle: {}", throttle_names(s)));
    }
    // Without profiling counters (no GPM, a single read) one reason says why, once.
    let profiled = METRIC_TABLE
        .iter()
        .filter(|m| m.text.is_some_and(|t| t.line == PROFILING_LINE));
    if profiled.clone().all(|m| m.get(s).is_none()) {
        let why = profiled
            .clone()
            .find_map(|m| s.why_absent(m.name))
            .map_or_else(
                || "not recorded".to_owned(),
                |w| match w {
                    Absent::NotSupported => {
                        "not supported (NVML's GPM counters need a Hopper or newer data-centre GPU)"
                            .to_owned()
                    }
                    w => w.to_string(),
                },
            );
        lines.insert(
            PROFILING_LINE,
            vec![format!("profiling counters n/a: {why}")],
        );
    }
    for items in lines.values() {
        let _ = writeln!(out, "  {}", items.join("  "));
    }
    if let Some(procs) = &s.processes {
        let _ = writeln!(out, "  processes: {}", procs.len());
        for p in procs {
            let _ = writeln!(
                out,
                "    pid {}  {}  {} GiB",
                p.pid,
                na(p.name.as_deref()),
                gib(p.used_memory_bytes)
            );
        }
    }
    if d.findings.is_empty() {
        out.push_str("  findings: none\n");
    }
    for f in &d.findings {
        let _ = writeln!(
            out,
            "  [{}] {}{}{}\n      what to do: {}",
            f.severity,
            esc(&f.title),
            f.recorded_tag(),
            span_tag(f),
            esc(&f.advice)
        );
    }
}

/// What held each GPU back, first: the answer most readers came for.
fn render_verdicts(out: &mut String, report: &CheckReport) {
    // The job first: a GPU waiting for a straggler reads busy on its own.
    for j in &report.jobs {
        for line in job_block(j, &report.job_phases, None) {
            let _ = writeln!(out, "{line}");
        }
    }
    for d in &report.devices {
        let Some(v) = &d.verdict else { continue };
        let _ = writeln!(
            out,
            "verdict GPU {}: {} ({} confidence{}) — {}\n    what to do: {}",
            v.device,
            v.bottleneck,
            v.confidence,
            match v.basis {
                Basis::ProfilingCounters => "",
                Basis::Utilisation => ", utilisation only",
                Basis::Kernels => ", from the kernels recorded",
            },
            esc(&v.title),
            esc(&v.advice)
        );
    }
    for d in report.devices.iter().filter(|d| d.phases.len() > 1) {
        // A window that changed its bottleneck has a verdict that blends them: the phases are
        // the story, so say so where the blend is read.
        let _ = writeln!(
            out,
            "phases GPU {} (the window changed bottleneck {}; the verdict above names the one that held most of it):",
            d.info.index,
            times(d.phases.len() - 1)
        );
        let t0 = d.phases[0].start_ms;
        for p in &d.phases {
            let _ = writeln!(out, "    {}", esc(&phase_line(p, t0)));
        }
    }
    for n in &report.not_judged {
        // Reasons may quote what a recording says (a process name).
        let _ = writeln!(
            out,
            "not judged: {}{} — {}",
            esc(&n.rule),
            n.device.map(|d| format!(" on GPU {d}")).unwrap_or_default(),
            esc(&n.reason)
        );
    }
}

/// A job's verdict in lines: the verdict, the GPUs side by side, how the wait was estimated,
/// what to do. Escaped: titles quote process names.
pub fn job_lines(j: &gpudiag_model::job::JobVerdict) -> Vec<String> {
    let mut lines = vec![format!(
        "job verdict: {} ({} confidence{}) — {}",
        j.verdict,
        j.confidence,
        if j.presumed {
            ", presumed job: no launcher key was readable"
        } else {
            ""
        },
        esc(&j.title)
    )];
    let pct = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.0}%"));
    for p in &j.peers {
        lines.push(format!(
            "    GPU {}{}  util {}  SM {}  tensor {}  power {}  NVLink {}  held {}  CPU {}{}{}",
            p.device,
            p.rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
            pct(p.gpu_util_pct),
            pct(p.sm_active_pct),
            pct(p.tensor_active_pct),
            p.power_w
                .map_or_else(|| "n/a".to_owned(), |w| format!("{w:.0} W")),
            p.nvlink_bytes_per_s.map_or_else(|| "n/a".to_owned(), rate),
            p.job_memory_bytes.map_or_else(
                || "n/a".to_owned(),
                |b| format!("{:.1} GiB", b as f64 / GIB)
            ),
            pct(p.process_cpu_pct),
            if p.other_processes > 0 {
                format!("  +{} other process(es)", p.other_processes)
            } else {
                String::new()
            },
            match j.role_of(p.device) {
                Some(gpudiag_model::job::GpuRole::Straggler) => "  ◀ straggler",
                Some(gpudiag_model::job::GpuRole::Waiting) => "  (waits)",
                Some(gpudiag_model::job::GpuRole::Missing) => "  ◀ missing",
                None => "",
            }
        ));
    }
    // Ranks that must run here and were never seen have no GPU row: a line each all the same.
    for rank in j.stall.iter().flat_map(|s| &s.absent_ranks) {
        lines.push(format!(
            "    rank {rank}  not running on this host  ◀ missing"
        ));
    }
    // The title names one straggler whole; several get a line each, with what sets each apart.
    if let [_, _, ..] = j.stragglers.as_slice() {
        lines.extend(j.stragglers.iter().map(straggler_line));
    }
    // One estimate said once; where the stragglers' differ, each is said with its GPU.
    let estimates: Vec<&str> = j
        .stragglers
        .iter()
        .map(|s| s.wait_estimate.as_str())
        .collect();
    if estimates.iter().all(|e| Some(e) == estimates.first()) {
        if let Some(how) = estimates.first() {
            lines.push(format!("    peers' wait estimated as {}", esc(how)));
        }
    } else {
        for s in &j.stragglers {
            lines.push(format!(
                "    peers' wait for GPU {} estimated as {}",
                s.device,
                esc(&s.wait_estimate)
            ));
        }
    }
    for doubt in &j.doubts {
        lines.push(format!("    doubt: {}", esc(doubt)));
    }
    // NCCL's own view where it was asked; "not asked" says nothing worth a line.
    if let Some(ras) = j
        .ras
        .as_ref()
        .filter(|r| r.not_judged != Some(gpudiag_model::ras::RasNotJudged::NotAsked))
    {
        lines.push(format!("    {}", esc(&ras.summary)));
    }
    lines.push(format!("    what to do: {}", esc(&j.advice)));
    lines
}

/// One of several stragglers: "straggler GPU 6 (rank 6) leads: SM active 90% against its
/// peers' 45%, they wait for it ~50%; another process (pid 812) also holds 4.1 GiB on it".
fn straggler_line(s: &gpudiag_model::job::Straggler) -> String {
    let figure = |v: f64| match s.metric.as_str() {
        "power_w" => format!("{v:.0} W"),
        _ => format!("{v:.0}%"),
    };
    let metric = match s.metric.as_str() {
        "sm_active_pct" => "SM active",
        "gpu_util_pct" => "utilisation",
        "power_w" => "power",
        other => other,
    };
    let mut line = format!(
        "    straggler GPU {}{} {}: {} {} against its peers' {}",
        s.device,
        s.rank.map(|r| format!(" (rank {r})")).unwrap_or_default(),
        match s.pace {
            gpudiag_model::job::Pace::Leads => "leads",
            gpudiag_model::job::Pace::Lags => "lags",
        },
        esc(metric),
        figure(s.value),
        figure(s.peers_median)
    );
    if let Some(w) = s.peers_wait_share {
        line.push_str(&format!(", they wait for it ~{:.0}%", w * 100.0));
    }
    for d in &s.differs {
        line.push_str(&format!("; {}", esc(d)));
    }
    line
}

/// A job's lines ([`job_lines`]), then its phases where its verdict changed, timed from `t0`
/// (else from the first phase). Escaped.
pub fn job_block(
    j: &gpudiag_model::job::JobVerdict,
    all_phases: &[gpudiag_core::check::JobPhases],
    t0: Option<u64>,
) -> Vec<String> {
    let mut lines = job_lines(j);
    let phases = all_phases
        .iter()
        .find(|p| p.job == j.job)
        .map(|p| p.phases.as_slice())
        .unwrap_or_default();
    if phases.len() > 1 {
        lines.push(format!(
            "phases of the job (its verdict changed {}):",
            times(phases.len() - 1)
        ));
        let t0 = t0.unwrap_or(phases[0].start_ms);
        lines.extend(
            phases
                .iter()
                .map(|p| format!("    {}", esc(&job_phase_line(p, t0)))),
        );
    }
    lines
}

/// One phase of a job: "12–58 s  straggler  GPU 2 (rank 2) is the straggler: ...".
pub fn job_phase_line(p: &gpudiag_model::job::JobVerdict, t0: u64) -> String {
    let secs = |t: u64| t.saturating_sub(t0) as f64 / 1000.0;
    let detail = p
        .title
        .find(": ")
        .map_or(p.title.as_str(), |i| &p.title[i + 2..]);
    format!(
        "{:>6.0}–{:<6.0} s  {:<20} {}",
        secs(p.start_ms),
        secs(p.end_ms),
        p.verdict.name(),
        detail
    )
}

/// "once" or "N times".
pub fn times(n: usize) -> String {
    if n == 1 {
        "once".to_owned()
    } else {
        format!("{n} times")
    }
}

/// One phase of a run: "12–58 s  compute_bound  (SM active 96%, ...) · python3 (pid 7)".
pub fn phase_line(p: &gpudiag_model::verdict::Verdict, t0: u64) -> String {
    let secs = |t: u64| t.saturating_sub(t0) as f64 / 1000.0;
    let detail = p
        .title
        .find(" over ")
        .map_or(p.title.as_str(), |i| &p.title[i..]);
    format!(
        "{:>6.0}–{:<6.0} s  {:<20} {}",
        secs(p.start_ms),
        secs(p.end_ms),
        p.bottleneck.name(),
        detail
            .trim_start_matches(" over ")
            .trim_start_matches(|c: char| { c.is_ascii_digit() || matches!(c, ' ' | 's' | ':') })
    )
}

/// When a finding held, where that is more than the moment of the report: " (cleared:
/// 12:00:03–12:00:41 UTC)" for one that no longer holds, " (since 12:00:03 UTC)" for one that
/// has held across evaluations.
fn span_tag(f: &Finding) -> String {
    let (from, to) = (clock(f.time_ms), clock(f.last_seen()));
    if f.is_cleared() {
        if from == to {
            format!(" (cleared: {from} UTC)")
        } else {
            format!(" (cleared: {from}–{to} UTC)")
        }
    } else if f.last_seen() > f.time_ms {
        format!(" (since {from} UTC)")
    } else {
        String::new()
    }
}

fn throttle_names(s: &Sample) -> String {
    match &s.throttle_reason_names {
        None => "n/a".into(),
        Some(n) if n.is_empty() => "none".into(),
        Some(n) => esc(&n.join(", ")).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::job::{
        GpuRole, JobId, JobMember, JobPattern, JobVerdict, JoinedBy, Pace, PeerFigures, Straggler,
    };
    use gpudiag_model::verdict::Confidence;

    fn straggler(device: u32, wait_estimate: &str) -> Straggler {
        Straggler {
            device,
            rank: Some(device),
            pace: Pace::Leads,
            metric: "sm_active_pct".into(),
            value: 90.0,
            peers_median: 47.0,
            peers_wait_share: Some(0.48),
            wait_estimate: wait_estimate.into(),
            differs: Vec::new(),
        }
    }

    /// Four GPUs, GPUs 1 and 3 leading together, the others waiting.
    fn two_stragglers() -> JobVerdict {
        let role = |d| {
            if d % 2 == 1 {
                GpuRole::Straggler
            } else {
                GpuRole::Waiting
            }
        };
        let mut s3 = straggler(3, "1 − peers' SM active / its SM active");
        s3.differs = vec!["another process (pid 812, \x1b[31mx) also holds 4.1 GiB on it".into()];
        JobVerdict {
            job: JobId {
                joined_by: JoinedBy::RunId,
                key: "run-7".into(),
            },
            presumed: false,
            members: (0..4)
                .map(|d| JobMember {
                    device: d,
                    uuid: None,
                    pid: 100 + d,
                    name: Some("python3".into()),
                    rank: Some(d),
                    local_rank: Some(d),
                    role: Some(role(d)),
                })
                .collect(),
            verdict: JobPattern::Straggler,
            confidence: Confidence::Medium,
            start_ms: 0,
            end_ms: 30_000,
            title: "torchrun run run-7 on 4 GPUs: GPUs 1 and 3 are the stragglers".into(),
            advice: "Even out the work of ranks 1 and 3.".into(),
            stragglers: vec![straggler(1, "1 − peers' SM active / its SM active"), s3],
            doubts: vec!["RANK 1 is read on 2 GPUs".into()],
            peers: (0..4)
                .map(|d| PeerFigures {
                    device: d,
                    rank: Some(d),
                    sm_active_pct: Some(if d % 2 == 1 { 90.0 } else { 47.0 }),
                    ..PeerFigures::default()
                })
                .collect(),
            stall: None,
            ras: None,
            evidence: serde_json::Map::new(),
        }
    }

    /// Each straggler is marked and gets its line, every waiting GPU says so, the doubt is
    /// listed, and an estimate the stragglers share is said once.
    #[test]
    fn several_stragglers_each_named_with_the_waiting_gpus_marked() {
        let job = two_stragglers();
        let lines = job_lines(&job);
        let text = lines.join("\n");
        for (device, mark) in [
            (0, "(waits)"),
            (1, "◀ straggler"),
            (2, "(waits)"),
            (3, "◀ straggler"),
        ] {
            let row = lines
                .iter()
                .find(|l| l.starts_with(&format!("    GPU {device} rank {device} ")))
                .unwrap_or_else(|| panic!("no row for GPU {device}:\n{text}"));
            assert!(row.ends_with(mark), "{row}");
        }
        for want in [
            "    straggler GPU 1 (rank 1) leads: SM active 90% against its peers' 47%, they wait \
             for it ~48%",
            "    straggler GPU 3 (rank 3) leads: SM active 90% against its peers' 47%, they wait \
             for it ~48%; another process (pid 812, \\x1b[31mx) also holds 4.1 GiB on it",
            "    doubt: RANK 1 is read on 2 GPUs",
        ] {
            assert!(lines.iter().any(|l| l == want), "no {want:?} in\n{text}");
        }
        assert_eq!(
            text.matches("peers' wait estimated as").count(),
            1,
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text}");

        // Estimates that differ are each said with their GPU.
        let mut job = job;
        job.stragglers[1].wait_estimate = "its peers' utilisation − its own".into();
        let text = job_lines(&job).join("\n");
        assert!(
            text.contains("    peers' wait for GPU 1 estimated as 1 − peers'")
                && text.contains("    peers' wait for GPU 3 estimated as its peers' utilisation"),
            "{text}"
        );
    }

    /// NCCL's view is one line before the advice, escaped; "not asked" adds none.
    #[test]
    fn ras_evidence_is_one_line() {
        use gpudiag_model::ras::{RasEvidence, RasNotJudged};
        let mut job = two_stragglers();
        let evidence = |summary: &str, not_judged| RasEvidence {
            answered_ms: Some(1),
            nccl_version: Some("2.28.9".into()),
            ranks: Vec::new(),
            progress: None,
            lagging: Vec::new(),
            summary: summary.into(),
            not_judged,
        };
        job.ras = Some(evidence(
            "RAS (NCCL 2.28.9): AllReduce launched: 3 ranks up to 41; rank 3 (pid 4553) up to 30\x1b",
            None,
        ));
        let lines = job_lines(&job);
        let at = lines
            .iter()
            .position(|l| l.starts_with("    RAS (NCCL 2.28.9): AllReduce launched"))
            .unwrap_or_else(|| panic!("no RAS line in {lines:#?}"));
        assert!(lines[at + 1].starts_with("    what to do:"), "{lines:#?}");
        assert!(!lines[at].contains('\x1b'), "{}", lines[at]);
        job.ras = Some(evidence("RAS: RAS not asked", Some(RasNotJudged::NotAsked)));
        assert!(!job_lines(&job).iter().any(|l| l.contains("RAS")));
    }

    /// One straggler: the title names it, no line repeats it.
    #[test]
    fn one_straggler_is_named_by_the_title_alone() {
        let mut job = two_stragglers();
        job.stragglers.truncate(1);
        let text = job_lines(&job).join("\n");
        assert!(!text.contains("    straggler GPU"), "{text}");
        assert_eq!(
            text.matches("peers' wait estimated as").count(),
            1,
            "{text}"
        );
    }
}
