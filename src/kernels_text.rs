//! The kernels section `run --kernels` prints at the end: per GPU where its time went, the
//! kernels and copies that took it, the host's waits, and what the collector missed, worded
//! for someone who knows PyTorch rather than CUPTI.

use std::fmt::Write;

use gpudiag_core::kernels::arrivals::{MIN_MATCHED, MIN_WAIT_SHARE, MIN_WAITING_SHARE};
use gpudiag_core::kernels::verdict::{bytes, direction_label, grouped, memory_name};
use gpudiag_model::kernels::{HostMemory, KernelsGpu, KernelsProcess, KernelsSummary};
use gpudiag_model::printable;

/// The kernels listed per GPU in text (the report has more).
const TEXT_KERNELS: usize = 5;
const TEXT_COPIES: usize = 3;

/// The section, each line starting with `gpudiag:` or indented under one.
pub fn kernels_section(s: &KernelsSummary) -> String {
    let mut out = String::new();
    if let Some(why) = &s.not_recorded {
        let _ = writeln!(
            out,
            "gpudiag: kernels: nothing recorded: {}",
            printable::line(why)
        );
        collector_state(&mut out, s);
        return out;
    }
    if let Some(schedule) = &s.sampling {
        let recorded: f64 = s
            .processes
            .iter()
            .filter_map(|p| p.sampling.map(|w| w.recorded_s))
            .fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "gpudiag: kernels: sampled, {} of every {} (CUPTI detached in between, so the cost \
             is paid only then); {} recorded: every time, rate and share below is of the \
             windows",
            whole_seconds(schedule.on_ms),
            whole_seconds(schedule.period_ms),
            duration(recorded)
        );
    }
    for g in &s.gpus {
        gpu_block(&mut out, g, s);
    }
    // Waits of processes whose records reached no GPU listed above (they ran no kernel, or
    // their GPU was past the cap).
    for p in s
        .processes
        .iter()
        .filter(|p| !p.syncs.is_empty() && !s.gpus.iter().any(|g| g.pids.contains(&p.pid)))
    {
        let _ = writeln!(out, "gpudiag: kernels: host waits of pid {}:", p.pid);
        sync_lines(&mut out, p);
    }
    if let Some(l) = &s.nccl_laggard {
        let shares: Vec<String> = l
            .shares
            .iter()
            .map(|(pid, share)| format!("pid {pid} {}", pct(*share)))
            .collect();
        let _ = writeln!(
            out,
            "gpudiag: kernels: pid {} spends {} of its time in NCCL kernels, its peers {}: the \
             others wait for it in their collectives, so it is the slow rank ({})",
            l.pid,
            pct(l.nccl_share),
            pct(l.peers_median_share),
            shares.join(", ")
        );
    }
    if let Some(a) = &s.nccl_arrivals {
        arrivals_line(&mut out, a);
    }
    collector_state(&mut out, s);
    out
}

fn pct(share: f64) -> String {
    let p = share * 100.0;
    if p > 0.0 && p < 1.0 {
        "<1%".into()
    } else {
        format!("{p:.0}%")
    }
}

/// A schedule's length as the user gave it: "1 s", "0.5 s", "20 s".
fn whole_seconds(ms: u32) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{} s", f64::from(ms) / 1e3)
    }
}

/// "1.23 s", "4.5 ms", "12 µs".
fn duration(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

fn gpu_name(g: &KernelsGpu) -> String {
    match (g.index, &g.uuid, &g.only_as) {
        (Some(i), _, _) => format!("GPU {i}"),
        (None, Some(u), _) => printable::line(u).into_owned(),
        (None, None, Some(o)) => format!("CUDA device {} of pid {}", o.cuda_ordinal, o.pid),
        (None, None, None) => "a GPU".into(),
    }
}

fn gpu_block(out: &mut String, g: &KernelsGpu, s: &KernelsSummary) {
    let t = &g.time;
    let share = |x: f64| {
        if t.span_s > 0.0 {
            pct(x / t.span_s)
        } else {
            "–".into()
        }
    };
    let pids: Vec<String> = g.pids.iter().map(u32::to_string).collect();
    // A GPU known only as one process's ordinal already names that process.
    let by = if g.only_as.is_some() && g.pids.len() <= 1 {
        String::new()
    } else {
        format!(" (pid {})", pids.join(", "))
    };
    let _ = writeln!(
        out,
        "gpudiag: kernels on {}{by} over {}{}: compute {} · NCCL {} · copies {} · idle {}",
        gpu_name(g),
        duration(t.span_s),
        if s.sampling.is_some() {
            " recorded"
        } else {
            ""
        },
        share(t.compute_s),
        share(t.nccl_s),
        share(t.copy_s),
        share(t.idle_s)
    );
    if let (Some(rate), Some(mean)) = (g.kernels_per_s, g.mean_kernel_us) {
        let _ = writeln!(
            out,
            "  {} kernels, {} a second, {} on average",
            grouped(g.kernels as f64),
            grouped(rate),
            duration(mean / 1e6)
        );
    }
    if !g.top_kernels.is_empty() {
        let _ = writeln!(out, "  top kernels by GPU time (share of busy time):");
    }
    for k in g.top_kernels.iter().take(TEXT_KERNELS) {
        let mut notes = Vec::new();
        if k.nccl {
            notes.push("NCCL".to_owned());
        }
        if k.in_graphs > 0 {
            notes.push(if k.in_graphs == k.count {
                "CUDA graph".to_owned()
            } else {
                format!("{} in CUDA graphs", grouped(k.in_graphs as f64))
            });
        }
        let grid = |d: [u32; 3]| format!("{}×{}×{}", d[0], d[1], d[2]);
        let _ = writeln!(
            out,
            "    {:>4}  {:>9} × {:>8}  {}  grid {} block {}{}{}",
            pct(k.share_of_busy),
            grouped(k.count as f64),
            duration(k.mean_us / 1e6),
            printable::line(&k.short_name),
            grid(k.grid),
            grid(k.block),
            if k.configs_vary { " (and others)" } else { "" },
            if notes.is_empty() {
                String::new()
            } else {
                format!(" [{}]", notes.join(", "))
            }
        );
    }
    let other = &g.other_kernels;
    if other.count > 0 {
        let _ = writeln!(
            out,
            "    and {} more run{} of other kernels, {}",
            grouped(other.count as f64),
            if other.count == 1 { "" } else { "s" },
            duration(other.total_s)
        );
    }
    for c in g.copies.iter().take(TEXT_COPIES) {
        let rate = c
            .gb_per_s
            .map(|r| format!(" at {r:.1} GB/s"))
            .unwrap_or_default();
        let pageable = if c.host_memory == HostMemory::Pageable {
            " — pageable: the driver stages it and the host waits; pin the memory"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  copies {} {}: {} of {} on average, {}{rate}{pageable}",
            direction_label(c.direction),
            memory_name(c.host_memory),
            grouped(c.count as f64),
            bytes(c.bytes / c.count.max(1)),
            duration(c.total_s)
        );
    }
    if g.sets.count > 0 {
        let _ = writeln!(
            out,
            "  memsets: {}, {}",
            grouped(g.sets.count as f64),
            duration(g.sets.total_s)
        );
    }
    for p in s.processes.iter().filter(|p| g.pids.contains(&p.pid)) {
        sync_lines(out, p);
    }
}

fn sync_lines(out: &mut String, p: &KernelsProcess) {
    for sync in &p.syncs {
        let rate = sync
            .per_s
            .map(|r| format!(" ({} a second)", grouped(r)))
            .unwrap_or_default();
        let blocked = match sync.share_of_host {
            Some(share) => format!(
                ", the host blocked {} in all, {} of its time",
                duration(sync.total_s),
                pct(share)
            ),
            None if !sync.call.blocks_host() => ", a stream waits, not the host".into(),
            None => format!(", the host blocked {} in all", duration(sync.total_s)),
        };
        let _ = writeln!(
            out,
            "  pid {}: {} × {}{rate}{blocked}",
            p.pid,
            grouped(sync.count as f64),
            sync.call_name
        );
    }
}

/// Who arrived last at the collectives every rank ran: the rank named, or that none was.
fn arrivals_line(out: &mut String, a: &gpudiag_model::kernels::NcclArrivals) {
    if a.matched == 0 {
        return;
    }
    let ranks = a.by_pid.len();
    let lead = format!(
        "gpudiag: kernels: NCCL collectives all {ranks} processes ran: {}",
        grouped(a.matched as f64)
    );
    let Some(late) = a
        .waited_for
        .and_then(|pid| a.by_pid.iter().find(|p| p.pid == pid))
    else {
        let most = a
            .by_pid
            .iter()
            .max_by(|x, y| x.peers_waited_s.total_cmp(&y.peers_waited_s));
        let Some((m, share)) = most.and_then(|m| Some((m, a.share_of_waiting(m.pid)?))) else {
            let _ = writeln!(out, "{lead}");
            return;
        };
        // Say which test the rank that caused the most waiting failed.
        let why = if a.matched < MIN_MATCHED {
            format!("too few to tell who the others wait for (under {MIN_MATCHED})")
        } else if share < MIN_WAITING_SHARE {
            format!(
                "no rank caused most of the waiting at them (the most, pid {}, {} of it, \
                 arriving last at {})",
                m.pid,
                pct(share),
                pct(m.last_share)
            )
        } else if m.last_share <= 1.0 / ranks as f64 {
            format!(
                "pid {} caused {} of the waiting but arrived last at only {} of them",
                m.pid,
                pct(share),
                pct(m.last_share)
            )
        } else {
            format!(
                "pid {} caused {} of the waiting (arriving last at {}), but each peer waited \
                 only {} for it in all, under {:.0}% of its time",
                m.pid,
                pct(share),
                pct(m.last_share),
                duration(m.peers_waited_s),
                MIN_WAIT_SHARE * 100.0
            )
        };
        let _ = writeln!(out, "{lead}; {why}: none held the others back");
        return;
    };
    let caused = a
        .share_of_waiting(late.pid)
        .map(|share| format!(", caused {} of the waiting", pct(share)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{lead}; pid {} arrived last at {} of them{caused}, and each peer waited {} for it in \
         all: it is the rank the others wait for",
        late.pid,
        pct(late.last_share),
        duration(late.peers_waited_s)
    );
}

/// Wall-clock time of day, UTC, to the millisecond.
fn clock(unix_ns: u64) -> String {
    let ms = unix_ns / 1_000_000;
    let day_ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1_000 % 60,
        day_ms % 1_000
    )
}

/// What the collector said of itself, where it matters: processes it could not record in,
/// records lost, stepped-aside intervals, processes that ended without a goodbye.
fn collector_state(out: &mut String, s: &KernelsSummary) {
    let hello = s.processes.iter().filter(|p| p.said_hello).count();
    let mut notes = Vec::new();
    for p in &s.processes {
        if let Some(why) = &p.cannot_record {
            notes.push(format!(
                "pid {}: could not record: {}",
                p.pid,
                printable::line(why)
            ));
        }
        let l = p.losses;
        let mut lost = Vec::new();
        if l.cupti_dropped > 0 {
            lost.push(format!(
                "{} dropped by CUPTI (its buffers were full)",
                grouped(l.cupti_dropped as f64)
            ));
        }
        if l.send_dropped > 0 {
            lost.push(format!(
                "{} not sent (gpudiag's socket was full; the command never waits for it)",
                grouped(l.send_dropped as f64)
            ));
        }
        if !lost.is_empty() {
            notes.push(format!("pid {}: records lost: {}", p.pid, lost.join(", ")));
        }
        for a in &p.stepped_aside {
            let to = a.to_unix_ns.map_or_else(|| "its end".to_owned(), clock);
            notes.push(format!(
                "pid {}: another profiler (torch.profiler, Nsight) traced from {} to {to}: \
                 those kernels are in its trace, not here",
                p.pid,
                clock(a.from_unix_ns)
            ));
        }
        if let Some(from) = p.sampling.and_then(|w| w.full_from_unix_ns) {
            notes.push(format!(
                "pid {}: another CUPTI client (torch.profiler, Nsight) appeared at {}: sampling \
                 gave way, and the process was recorded in full from then (and paid for it)",
                p.pid,
                clock(from)
            ));
        }
        if p.said_hello && !p.said_goodbye && p.cannot_record.is_none() {
            notes.push(format!(
                "pid {}: ended without a goodbye (killed, or os._exit): its last second may be \
                 missing",
                p.pid
            ));
        }
    }
    for l in &s.left_out {
        notes.push(format!("left out: {}", printable::line(l)));
    }
    if hello == 0 && notes.is_empty() {
        return;
    }
    // A launcher (torchrun's agent) or a helper initialises CUDA without launching anything:
    // counted apart, so "ran in 3 processes" for a 2-rank job does not read as a stray rank.
    // Under sampling, a process whose windows caught none may still have launched some.
    let without: Vec<_> = s
        .processes
        .iter()
        .filter(|p| p.said_hello && p.kernels == 0 && p.cannot_record.is_none())
        .collect();
    let verb = if without.iter().any(|p| p.sampling.is_some()) {
        "recorded"
    } else {
        "launched"
    };
    let idle_note = match without.len() {
        0 => String::new(),
        n if n == hello => format!(" (none {verb} a kernel)"),
        1 => format!(
            " (1 {verb} no kernel: a launcher such as torchrun's, or a helper, that only \
             initialised CUDA)"
        ),
        n => format!(" ({n} {verb} no kernel: launchers or helpers that only initialised CUDA)"),
    };
    let _ = writeln!(
        out,
        "gpudiag: kernels: the collector ran in {hello} process{}{idle_note}{}",
        if hello == 1 { "" } else { "es" },
        if notes.is_empty() { "" } else { ":" }
    );
    for n in notes {
        let _ = writeln!(out, "  {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_core::kernels::KernelsAggregator;
    use gpudiag_core::kernels::synthetic::{sync_bound_stream, training_stream, two_ranks};

    fn summary_of(streams: &[Vec<gpudiag_model::kernels::CollectorMessage>]) -> KernelsSummary {
        let mut a = KernelsAggregator::default();
        for m in streams.iter().flatten() {
            a.push(m);
        }
        a.summary()
    }

    #[test]
    fn a_training_loop_reads_as_where_the_time_went() {
        let mut s = summary_of(&[training_stream(4242, "GPU-1111"), sync_bound_stream(4300)]);
        s.gpus[0].index = Some(0);
        insta::assert_snapshot!(kernels_section(&s));
    }

    #[test]
    fn a_sampled_run_says_its_windows_and_that_figures_are_of_them() {
        use gpudiag_core::kernels::synthetic::sampled_stream;
        use gpudiag_model::kernels::SampleSchedule;
        let mut a = KernelsAggregator::default();
        a.sampled(SampleSchedule {
            on_ms: 100,
            period_ms: 1000,
        });
        let mut stream = sampled_stream(300);
        stream.push(gpudiag_model::kernels::CollectorMessage::Window {
            pid: 300,
            from_unix_ns: 1_700_000_000_000_000_000 + 2_049_000_000,
            to_unix_ns: None,
            gave_way: true,
        });
        for m in &stream {
            a.push(m);
        }
        let text = kernels_section(&a.summary());
        assert!(
            text.contains(
                "gpudiag: kernels: sampled, 0.1 s of every 1 s (CUPTI detached in between, so \
                 the cost is paid only then); 249.0 ms recorded"
            ),
            "{text}"
        );
        assert!(
            text.contains("over 249.0 ms recorded: compute 50%"),
            "{text}"
        );
        assert!(
            text.contains("pid 300: another CUPTI client (torch.profiler, Nsight) appeared at"),
            "{text}"
        );
    }

    /// Where no rank is named, the line says which test the rank that caused the most waiting
    /// failed, never that no rank caused most of it when one did.
    #[test]
    fn an_unnamed_rank_is_told_apart_by_the_test_it_failed() {
        use gpudiag_model::kernels::{NcclArrival, NcclArrivals};
        let arrivals = |matched, late: (f64, f64)| NcclArrivals {
            matched,
            unmatched: 0,
            by_pid: vec![
                NcclArrival {
                    pid: 300,
                    last: 0,
                    last_share: 1.0 - late.0,
                    peers_waited_s: 0.001,
                },
                NcclArrival {
                    pid: 301,
                    last: 0,
                    last_share: late.0,
                    peers_waited_s: late.1,
                },
            ],
            waited_for: None,
        };
        let line = |a: &NcclArrivals| {
            let mut out = String::new();
            arrivals_line(&mut out, a);
            out
        };
        // Always last, by too little to matter.
        let text = line(&arrivals(100, (1.0, 0.009)));
        assert!(
            text.contains(
                "; pid 301 caused 90% of the waiting (arriving last at 100%), but each peer \
                 waited only 9.0 ms for it in all, under 1% of its time: none held the others \
                 back"
            ),
            "{text}"
        );
        // Most of the waiting, from a few long waits, while last no more often than chance.
        let text = line(&arrivals(100, (0.4, 0.009)));
        assert!(
            text.contains("pid 301 caused 90% of the waiting but arrived last at only 40% of them"),
            "{text}"
        );
        let text = line(&arrivals(100, (0.5, 0.001)));
        assert!(
            text.contains("no rank caused most of the waiting at them (the most, pid"),
            "{text}"
        );
        let text = line(&arrivals(12, (1.0, 0.009)));
        assert!(
            text.contains("too few to tell who the others wait for (under 20)"),
            "{text}"
        );
    }

    #[test]
    fn two_ranks_name_the_slow_one_from_their_nccl_time() {
        let s = summary_of(&[two_ranks()]);
        let text = kernels_section(&s);
        assert!(
            text.contains("pid 201 spends 10% of its time in NCCL kernels, its peers 40%"),
            "{text}"
        );
        assert!(
            text.contains(
                "gpudiag: kernels: NCCL collectives all 2 processes ran: 100; pid 201 arrived \
                 last at 100% of them, caused 100% of the waiting, and each peer waited 300.0 ms \
                 for it in all: it is the rank the others wait for"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_launcher_that_only_initialised_cuda_is_counted_apart_from_the_ranks() {
        use gpudiag_core::kernels::synthetic::hello;
        let s = summary_of(&[vec![hello(199, "GPU-r0")], two_ranks()]);
        let text = kernels_section(&s);
        assert!(
            text.contains(
                "the collector ran in 3 processes (1 launched no kernel: a launcher such as \
                 torchrun's, or a helper, that only initialised CUDA)"
            ),
            "{text}"
        );
        let ranks = kernels_section(&summary_of(&[two_ranks()]));
        assert!(
            ranks.contains("the collector ran in 2 processes\n")
                || ranks.contains("the collector ran in 2 processes:"),
            "{ranks}"
        );
    }

    #[test]
    fn waits_of_a_process_that_ran_no_kernel_are_still_shown() {
        use gpudiag_core::kernels::synthetic::{CLOCK, MS, hello, sync};
        use gpudiag_model::kernels::{CollectorMessage, SyncCall};
        let s = summary_of(&[vec![
            hello(9, "GPU-9"),
            CollectorMessage::Syncs {
                pid: 9,
                clock: CLOCK,
                records: vec![sync(0, 3 * MS, SyncCall::ContextSynchronize)],
            },
        ]]);
        let text = kernels_section(&s);
        assert!(
            text.contains(
                "gpudiag: kernels: host waits of pid 9:\n  pid 9: 1 × cudaDeviceSynchronize"
            ),
            "{text}"
        );
    }

    #[test]
    fn nothing_recorded_says_why() {
        let s = summary_of(&[]);
        assert_eq!(
            kernels_section(&s),
            "gpudiag: kernels: nothing recorded: the collector loaded in no process: the \
             command ran no CUDA, or its launcher did not pass the environment on (docker run, \
             sudo, env -i, a Ray or Dask daemon)\n"
        );
    }
}
