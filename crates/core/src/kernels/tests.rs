//! Synthetic message streams: the shapes `run --kernels` must tell apart, and hostile input.

use std::sync::Arc;

use gpudiag_model::kernels::{
    ClockPair, CollectorLosses, CollectorMessage, CudaDevice, HostMemory, KernelRecord, SetRecord,
    SyncCall,
};
use gpudiag_model::verdict::{Basis, Bottleneck};

use super::synthetic::*;
use super::verdict::{evidence_of, judge};
use super::*;

fn aggregate(messages: &[CollectorMessage]) -> KernelsSummary {
    let mut a = KernelsAggregator::default();
    for m in messages {
        a.push(m);
    }
    a.summary()
}

#[test]
fn a_sync_bound_loop_names_the_call_its_rate_and_share() {
    let s = aggregate(&sync_bound_stream(100));
    assert_eq!(s.not_recorded, None);
    let gpu = &s.gpus[0];
    assert_eq!(gpu.uuid.as_deref(), Some("GPU-aaaa"));
    assert_eq!(gpu.kernels, 333);
    let t = gpu.time;
    assert!((t.compute_s - 0.333).abs() < 1e-9, "{t:?}");
    assert!((t.idle_s - (t.span_s - 0.333)).abs() < 1e-9, "{t:?}");
    let p = &s.processes[0];
    assert!(p.said_hello && p.said_goodbye);
    let sync = &p.syncs[0];
    assert_eq!(sync.call, SyncCall::StreamSynchronize);
    assert_eq!(sync.count, 333);
    // The span runs from the hello (CUPTI 0) to the last kernel's end.
    let span = (p.end_unix_ns.unwrap() - p.start_unix_ns.unwrap()) as f64 / 1e9;
    assert!((sync.per_s.unwrap() - 333.0 / span).abs() < 1e-6);
    let share = sync.share_of_host.unwrap();
    assert!((share - 333.0 * 1.95e-3 / span).abs() < 1e-6, "{share}");
    let v = judge(0, gpu, &s.processes, None, 0, 1).unwrap();
    assert_eq!(v.bottleneck, Bottleneck::SyncBound);
    assert_eq!(v.basis, Basis::Kernels);
    assert!(
        v.title
            .starts_with("cudaStreamSynchronize 334 a second, 65% of the host's time"),
        "{}",
        v.title
    );
    assert_eq!(
        evidence_of(&v, "sync_call").unwrap(),
        "cudaStreamSynchronize"
    );
}

#[test]
fn a_launch_bound_loop_gives_the_launch_rate_and_mean_length() {
    let s = aggregate(&launch_bound_stream(7));
    let gpu = &s.gpus[0];
    assert_eq!(gpu.kernels, 100_000);
    let rate = gpu.kernels_per_s.unwrap();
    assert!((rate - 100_000.0).abs() < 100.0, "{rate}");
    assert!((gpu.mean_kernel_us.unwrap() - 4.0).abs() < 1e-9);
    let k = &gpu.top_kernels[0];
    assert_eq!(k.short_name, "at::native::vectorized_elementwise_kernel<…>");
    assert!(
        k.name
            .starts_with("void at::native::vectorized_elementwise_kernel<4,")
    );
    assert!((k.share_of_busy - 1.0).abs() < 1e-9);
    let v = judge(0, gpu, &s.processes, None, 0, 1).unwrap();
    assert_eq!(v.bottleneck, Bottleneck::LaunchBound);
    assert!(
        v.title.starts_with("100,0") && v.title.contains("averaging 4.0 µs"),
        "{}",
        v.title
    );
}

#[test]
fn pageable_copies_are_called_out_by_size() {
    let msgs = pageable_copies_stream(5);
    let s = aggregate(&msgs);
    let gpu = &s.gpus[0];
    assert_eq!(gpu.copies.len(), 2);
    let c = &gpu.copies[0];
    assert_eq!(c.host_memory, HostMemory::Pageable);
    assert_eq!((c.count, c.bytes), (100, 100 * (64 << 20)));
    assert!((c.gb_per_s.unwrap() - (64u64 << 20) as f64 / 6e6).abs() < 1e-6);
    let v = judge(0, gpu, &s.processes, None, 0, 1).unwrap();
    assert_eq!(v.bottleneck, Bottleneck::CopyBound);
    assert!(
        v.title
            .contains("100 pageable host→device copies of 64.0 MiB on average"),
        "{}",
        v.title
    );
    assert!(v.advice.contains("pin_memory=True"));
    // Never said goodbye: killed, or os._exit.
    assert!(!s.processes[0].said_goodbye);
}

#[test]
fn the_rank_with_the_least_nccl_time_is_named() {
    let s = aggregate(&two_ranks());
    let laggard = s.nccl_laggard.clone().unwrap();
    assert_eq!(laggard.pid, 201);
    assert!(
        laggard.peers_median_share > 0.35 && laggard.nccl_share < 0.15,
        "{laggard:?}"
    );
    let gpu = s
        .gpus
        .iter()
        .find(|g| g.uuid.as_deref() == Some("GPU-r0"))
        .unwrap();
    assert!((gpu.time.nccl_s - 0.4).abs() < 1e-6, "{:?}", gpu.time);
    assert!(gpu.top_kernels.iter().any(|k| k.nccl));
    // Shares within the gap: nobody is named.
    assert!(nccl_laggard(&s.processes, 0.5).is_none());
}

#[test]
fn overlapping_streams_count_once_and_nccl_behind_compute_is_compute() {
    let m = name(MATMUL);
    let ar = name(ALLREDUCE);
    let records = vec![
        kernel(&m, 0, 10 * MS, 7),
        kernel(&m, 5 * MS, 15 * MS, 8),
        // Hidden behind the matmuls for 5 ms, alone for 5 ms.
        kernel(&ar, 10 * MS, 20 * MS, 20),
    ];
    let sets = CollectorMessage::Sets {
        pid: 1,
        clock: CLOCK,
        records: vec![SetRecord {
            start_ns: CUPTI0 + 18 * MS,
            end_ns: CUPTI0 + 25 * MS,
            device: 0,
            context: 1,
            stream: 7,
            bytes: 4,
            correlation_id: 9,
        }],
    };
    let s = aggregate(&[hello(1, "GPU-x"), kernels(1, records), sets]);
    let t = s.gpus[0].time;
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(t.span_s, 0.025), "{t:?}");
    assert!(close(t.compute_s, 0.015), "{t:?}");
    assert!(close(t.nccl_s, 0.005), "{t:?}");
    assert!(close(t.copy_s, 0.005), "{t:?}");
    assert!(close(t.idle_s, 0.0), "{t:?}");
    assert_eq!(s.gpus[0].sets.count, 1);
}

#[test]
fn batches_out_of_order_give_the_same_summary() {
    let msgs = launch_bound_stream(7);
    let mut shuffled = msgs.clone();
    // Each pair of batches arrives the later one first (two buffers flushed in either order).
    for i in (1..11).step_by(2) {
        shuffled.swap(i, i + 1);
    }
    let a = aggregate(&msgs);
    let b = aggregate(&shuffled);
    assert_eq!(a.gpus[0].time, b.gpus[0].time);
    assert_eq!(a.gpus[0].kernels, b.gpus[0].kernels);
    assert!(b.left_out.is_empty(), "{:?}", b.left_out);
    // A whole second of 100,000 gaps reversed is more than a union of 32,768 spans holds:
    // what could not be placed is said, not silently dropped.
    let mut reversed = msgs.clone();
    reversed[1..11].reverse();
    let mut small = KernelsAggregator::new(
        Limits {
            gpu_spans: 32_768,
            ..Limits::default()
        },
        false,
    );
    for m in &reversed {
        small.push(m);
    }
    let c = small.summary();
    assert_eq!(c.gpus[0].kernels, 100_000);
    assert!(
        c.left_out.iter().any(|l| l.contains("too late to place")),
        "{:?}",
        c.left_out
    );
}

#[test]
fn a_stepped_aside_interval_and_the_collectors_state_are_reported() {
    let mut msgs = sync_bound_stream(300);
    msgs.pop(); // killed: no goodbye
    msgs.push(CollectorMessage::SteppedAside {
        pid: 300,
        from_ns: CUPTI0 + 100 * MS,
        to_ns: None,
    });
    msgs.push(CollectorMessage::SteppedAside {
        pid: 300,
        from_ns: CUPTI0 + 100 * MS,
        to_ns: Some(CUPTI0 + 150 * MS),
    });
    msgs.push(CollectorMessage::Losses {
        pid: 300,
        losses: CollectorLosses {
            cupti_dropped: 5,
            send_dropped: 2,
            names_cut: 0,
        },
    });
    msgs.push(CollectorMessage::CannotRecord {
        pid: 301,
        why: "no libcupti".into(),
    });
    let s = aggregate(&msgs);
    let p = s.processes.iter().find(|p| p.pid == 300).unwrap();
    assert!(!p.said_goodbye);
    assert_eq!(
        p.stepped_aside,
        vec![SteppedAsideSpan {
            from_unix_ns: UNIX0 + 100 * MS,
            to_unix_ns: Some(UNIX0 + 150 * MS),
        }]
    );
    assert_eq!(p.losses.cupti_dropped, 5);
    let q = s.processes.iter().find(|p| p.pid == 301).unwrap();
    assert_eq!(q.cannot_record.as_deref(), Some("no libcupti"));
}

#[test]
fn nothing_recorded_says_why() {
    let none = aggregate(&[]);
    assert!(none.not_recorded.unwrap().contains("loaded in no process"));
    let refused = aggregate(&[CollectorMessage::CannotRecord {
        pid: 4,
        why: "no libcupti was found".into(),
    }]);
    assert_eq!(
        refused.not_recorded.as_deref(),
        Some("the collector could not record (pid 4: no libcupti was found)")
    );
    let quiet = aggregate(&[hello(4, "GPU-q"), CollectorMessage::Goodbye { pid: 4 }]);
    assert!(quiet.not_recorded.unwrap().contains("ran no kernel"));
}

#[test]
fn the_gpus_are_matched_to_gpudiags_indices_by_uuid() {
    let mut s = aggregate(&sync_bound_stream(100));
    let device = |index, uuid: &str| gpudiag_model::sample::DeviceInfo {
        index,
        uuid: Some(uuid.into()),
        ..Default::default()
    };
    match_devices(&mut s, &[device(0, "GPU-zzzz"), device(3, "GPU-AAAA")], &[]);
    assert_eq!(s.gpus[0].index, Some(3));
}

#[test]
fn a_gpu_without_its_uuid_is_the_one_the_run_saw_its_process_on() {
    let name = name(MATMUL);
    let without_uuid = |pid| {
        vec![
            CollectorMessage::Hello(gpudiag_model::kernels::CollectorHello {
                pid,
                parent_pid: 1,
                cupti_api_version: 130001,
                cupti_source: "already loaded".into(),
                collector_version: 1,
                devices: Vec::new(),
                clock: CLOCK,
            }),
            CollectorMessage::Device {
                pid,
                device: gpudiag_model::kernels::CudaDevice {
                    ordinal: 0,
                    uuid: None,
                },
            },
            kernels(pid, vec![kernel(&name, MS, 2 * MS, 7)]),
        ]
    };
    let mut msgs = without_uuid(10);
    msgs.extend(without_uuid(11));
    let mut s = aggregate(&msgs);
    assert!(s.gpus.iter().all(|g| g.only_as.is_some()));
    let device = |index, uuid: &str| gpudiag_model::sample::DeviceInfo {
        index,
        uuid: Some(uuid.into()),
        ..Default::default()
    };
    // pid 10 was seen on GPU 1 alone; pid 11 on two GPUs, so its ordinal cannot be placed.
    match_devices(
        &mut s,
        &[device(0, "GPU-a"), device(1, "GPU-b")],
        &[(10, 1), (11, 0), (11, 1)],
    );
    let of = |pid| {
        s.gpus
            .iter()
            .find(|g| g.only_as.is_some_and(|o| o.pid == pid))
            .unwrap()
    };
    assert_eq!(of(10).index, Some(1));
    assert_eq!(of(10).uuid.as_deref(), Some("GPU-b"));
    assert_eq!(of(11).index, None);
}

#[test]
fn a_verdict_needs_a_clear_waste_and_leaves_busy_gpus_to_the_counters() {
    let m = name(MATMUL);
    let records = (0..1000u64)
        .map(|i| kernel(&m, i * MS, (i + 1) * MS, 7))
        .collect();
    let s = aggregate(&[hello(1, "GPU-busy"), kernels(1, records)]);
    assert!(judge(0, &s.gpus[0], &s.processes, None, 0, 1).is_none());
}

#[test]
fn hostile_input_never_panics_and_stays_bounded() {
    let limits = Limits {
        gpus: 4,
        processes: 8,
        names_per_gpu: 100,
        gpu_spans: 256,
        process_spans: 64,
        per_process_list: 4,
        windows_per_process: 4,
        kept_records: 1_000,
        nccl_runs_per_process: 16,
        nccl_processes: 2,
    };
    let mut a = KernelsAggregator::new(limits, true);
    a.push(&hello(1, "GPU-h"));
    // Reversed records, extreme times, a clock that jumps back and forth.
    let m = name(MATMUL);
    let mut wild = vec![kernel(&m, 10, 5, 7)];
    wild.push(KernelRecord {
        start_ns: u64::MAX - 1,
        end_ns: u64::MAX,
        ..kernel(&m, 0, 1, 7)
    });
    wild.push(KernelRecord {
        start_ns: 0,
        end_ns: u64::MAX,
        ..kernel(&m, 0, 1, 7)
    });
    for jump in [0, u64::MAX, 1, u64::MAX / 2] {
        a.push(&CollectorMessage::Kernels {
            pid: 1,
            clock: ClockPair {
                cupti_ns: jump,
                unix_ns: u64::MAX - jump,
            },
            records: wild.clone(),
        });
    }
    // 10^6 distinct names, each longer than the cap.
    let long_tail = "x".repeat(gpudiag_model::kernels::MAX_KERNEL_NAME_BYTES + 10);
    for batch in 0..100u64 {
        let records = (0..10_000u64)
            .map(|i| {
                let n: Arc<str> = Arc::from(format!("k{}_{}{long_tail}", batch, i).as_str());
                let t = (batch * 10_000 + i) * 1_000;
                kernel(&n, t, t + 500, (i % 4) as u32)
            })
            .collect();
        a.push(&kernels(1, records));
    }
    // Many processes and GPUs (one per process and ordinal without a UUID).
    for pid in 10..1_000u32 {
        a.push(&CollectorMessage::Device {
            pid,
            device: CudaDevice {
                ordinal: pid,
                uuid: None,
            },
        });
        a.push(&kernels(pid, vec![kernel(&m, 0, 10, 1)]));
        a.push(&CollectorMessage::SteppedAside {
            pid,
            from_ns: 0,
            to_ns: None,
        });
    }
    // Huge counts.
    a.push(&CollectorMessage::Losses {
        pid: 1,
        losses: CollectorLosses {
            cupti_dropped: u64::MAX,
            send_dropped: u64::MAX,
            names_cut: u64::MAX,
        },
    });
    assert!(a.gpus.len() <= 4);
    assert!(a.processes.len() <= 8);
    for g in a.gpus.values() {
        assert!(g.names.len() <= 100);
        assert!(
            g.names
                .keys()
                .all(|n| n.len() <= gpudiag_model::kernels::MAX_KERNEL_NAME_BYTES)
        );
        assert!(g.all.held() <= 257 && g.compute.held() <= 257);
    }
    let kept = a.take_kept().unwrap();
    assert_eq!(kept.records.len(), 1_000);
    assert!(kept.left_out > 990_000);
    let s = a.summary();
    assert!(
        s.left_out
            .iter()
            .any(|l| l.contains("ended before they started"))
    );
    assert!(
        s.left_out
            .iter()
            .any(|l| l.contains("processes past the first 8"))
    );
    assert!(
        s.left_out
            .iter()
            .any(|l| l.contains("GPUs past the first 4"))
    );
    let h = s
        .gpus
        .iter()
        .find(|g| g.uuid.as_deref() == Some("GPU-h"))
        .unwrap();
    assert!(h.other_kernels.past_name_cap > 900_000);
    assert_eq!(h.top_kernels.len(), TOP_KERNELS);
    serde_json::to_string(&s).unwrap();
}

/// A sync-bound stream with `records` of pid 400 slipped in before its goodbye: they must
/// change neither the time split nor the kernel count, and `left_out` must say so, starting
/// with `said`.
fn left_out_whole(records: Vec<gpudiag_model::kernels::KernelRecord>, said: &str) {
    let mut msgs = sync_bound_stream(400);
    let clean = aggregate(&msgs);
    msgs.insert(
        msgs.len() - 1,
        CollectorMessage::Kernels {
            pid: 400,
            clock: CLOCK,
            records,
        },
    );
    let s = aggregate(&msgs);
    assert_eq!(s.gpus[0].time, clean.gpus[0].time);
    assert_eq!(s.gpus[0].kernels, clean.gpus[0].kernels);
    assert!(
        s.left_out.iter().any(|l| l.starts_with(said)),
        "{:?}",
        s.left_out
    );
}

#[test]
fn records_on_another_clock_are_left_out_and_said() {
    // Timed on a clock 21 minutes off its pair (another CUPTI client set its own).
    let name: Arc<str> = Arc::from("kernel_on_another_clock");
    let off = 1_276 * 1_000 * MS;
    left_out_whole(
        vec![kernel(&name, off, off + 5 * US, 7)],
        "1 record(s) timed on another clock",
    );
}

#[test]
fn records_cupti_could_not_time_are_left_out_and_said() {
    // As CUPTI gives a record it could not time: 0 where a time is missing.
    let name: Arc<str> = Arc::from("kernel_without_times");
    let untimed = |start_ns, end_ns| gpudiag_model::kernels::KernelRecord {
        start_ns,
        end_ns,
        ..kernel(&name, 0, 0, 7)
    };
    left_out_whole(
        vec![untimed(0, 0), untimed(0, CUPTI0 + 5 * US)],
        "2 record(s) CUPTI handed over without times",
    );
}

/// Under sampling the time judged is the windows', not the span's: a GPU half busy in each
/// window reads half busy, where the span (mostly outside the windows) would read 90% idle.
#[test]
fn sampled_windows_are_the_time_judged() {
    let mut a = KernelsAggregator::default();
    a.sampled(SampleSchedule {
        on_ms: 100,
        period_ms: 1000,
    });
    for m in sampled_stream(300) {
        a.push(&m);
    }
    let s = a.summary();
    assert_eq!(
        s.sampling,
        Some(SampleSchedule {
            on_ms: 100,
            period_ms: 1000
        })
    );
    let g = &s.gpus[0];
    assert_eq!(g.kernels, 125);
    // Windows within the GPU's span (its first kernel to its last's end, 2,049 ms): 100 +
    // 100 + the open one up to the process's last record, 49 ms.
    let t = g.time;
    assert!((t.span_s - 0.249).abs() < 1e-9, "{t:?}");
    assert!((t.compute_s - 0.125).abs() < 1e-9, "{t:?}");
    assert!((t.idle_s - 0.124).abs() < 1e-9, "{t:?}");
    assert!((g.kernels_per_s.unwrap() - 125.0 / 0.249).abs() < 1e-6);
    let p = &s.processes[0];
    let w = p.sampling.unwrap();
    assert_eq!(w.windows, 3);
    assert!((w.recorded_s - 0.249).abs() < 1e-9, "{w:?}");
    assert_eq!(w.full_from_unix_ns, None);
    // Without sampling the same records read as a mostly idle span.
    let plain = aggregate(
        &sampled_stream(300)
            .into_iter()
            .filter(|m| !matches!(m, CollectorMessage::Window { .. }))
            .collect::<Vec<_>>(),
    );
    assert!(plain.gpus[0].time.idle_s > 1.9, "{:?}", plain.gpus[0].time);
    assert_eq!(plain.sampling, None);
    assert_eq!(plain.processes[0].sampling, None);
}

/// Sampling that gave way to another CUPTI client is said, with when; windows past the cap are
/// still counted; hostile windows (repeated, overlapping) never make the time judged exceed
/// the span.
#[test]
fn sampling_that_gave_way_is_said_and_hostile_windows_stay_bounded() {
    let limits = Limits {
        windows_per_process: 4,
        ..Limits::default()
    };
    let mut a = KernelsAggregator::new(limits, false);
    a.sampled(SampleSchedule::DEFAULT);
    let m = name(MATMUL);
    a.push(&hello(9, "GPU-9"));
    a.push(&kernels(9, vec![kernel(&m, 0, 10 * MS, 1)]));
    for _ in 0..1000 {
        a.push(&CollectorMessage::Window {
            pid: 9,
            from_unix_ns: UNIX0,
            to_unix_ns: Some(UNIX0 + 10 * MS),
            gave_way: false,
        });
    }
    a.push(&CollectorMessage::Window {
        pid: 9,
        from_unix_ns: UNIX0 + 5 * MS,
        to_unix_ns: None,
        gave_way: true,
    });
    let s = a.summary();
    let g = &s.gpus[0];
    assert!(g.time.span_s <= 0.010 + 1e-12, "{:?}", g.time);
    assert!((g.time.compute_s - 0.010).abs() < 1e-12);
    let w = s.processes[0].sampling.unwrap();
    assert_eq!(w.windows, 1001);
    assert_eq!(w.full_from_unix_ns, Some(UNIX0 + 5 * MS));
    assert!(w.recorded_s <= 0.010 + 1e-12, "{w:?}");
}

/// Ranks whose steps take `compute[i]` of matmul then an all-reduce that ends, on every rank,
/// when the slowest arrives (steps of 10 ms; `jitter` shifts every other step's arrivals by
/// that much on alternate ranks, so which arrives last depends on the step).
fn ranks_arriving(compute: &[u64], jitter: u64) -> Vec<CollectorMessage> {
    ranks_arriving_by(compute.len(), |rank, step| {
        let late = if (step + rank as u64).is_multiple_of(2) {
            jitter
        } else {
            0
        };
        compute[rank] + late
    })
}

/// `ranks` ranks whose step `step` takes `compute(rank, step)` of matmul, then an all-reduce
/// that ends at the step's 10 ms, on every rank.
fn ranks_arriving_by(ranks: usize, compute: impl Fn(usize, u64) -> u64) -> Vec<CollectorMessage> {
    let m = name(MATMUL);
    let ar = name(ALLREDUCE);
    let mut out = Vec::new();
    for i in 0..ranks {
        let pid = 300 + i as u32;
        out.push(hello(pid, &format!("GPU-{i}")));
        let mut records = Vec::new();
        for step in 0..100u64 {
            let t = step * 10 * MS;
            let arrive = t + compute(i, step);
            records.push(kernel(&m, t, arrive, 7));
            records.push(kernel(&ar, arrive, t + 10 * MS, 20));
        }
        out.push(kernels(pid, records));
    }
    out
}

#[test]
fn the_rank_that_arrives_last_at_its_collectives_is_the_one_its_peers_wait_for() {
    // The fixture's ranks: pid 201 starts each all-reduce 3 ms after pid 200.
    let s = aggregate(&two_ranks());
    let a = s.nccl_arrivals.as_ref().unwrap();
    assert_eq!((a.matched, a.unmatched), (100, 0));
    assert_eq!(a.waited_for, Some(201));
    let late = a.by_pid.iter().find(|p| p.pid == 201).unwrap();
    assert_eq!((late.last, late.last_share), (100, 1.0));
    assert!((late.peers_waited_s - 0.3).abs() < 1e-9, "{late:?}");

    // A rank 3% slower (9.3 ms of compute against 9.0 of three peers) is named, although its
    // NCCL share is within the shares' threshold of theirs (7% against 10%).
    let s = aggregate(&ranks_arriving(&[9 * MS, 9 * MS, 9_300 * US, 9 * MS], 0));
    let a = s.nccl_arrivals.as_ref().unwrap();
    assert_eq!(a.matched, 100);
    assert_eq!(a.waited_for, Some(302));
    assert_eq!(s.nccl_laggard, None, "{:?}", s.nccl_laggard);

    // Balanced ranks arrive last by turns: nobody is waited for.
    let s = aggregate(&ranks_arriving(&[9 * MS, 9 * MS], 200 * US));
    let a = s.nccl_arrivals.as_ref().unwrap();
    assert_eq!(a.matched, 100);
    assert_eq!(a.waited_for, None);
    assert!(a.by_pid.iter().all(|p| p.last_share == 0.5), "{a:?}");

    // Always last, by 20 µs a step (0.2% of the time): no straggler worth naming.
    let s = aggregate(&ranks_arriving(&[9 * MS, 9 * MS + 20 * US], 0));
    let a = s.nccl_arrivals.as_ref().unwrap();
    assert_eq!(a.by_pid[1].last_share, 1.0);
    assert_eq!(a.waited_for, None);
}

#[test]
fn the_rank_that_causes_most_of_the_waiting_is_named_though_not_always_last() {
    // Late by 300 µs at 7 steps of 10, early by 10 µs at the others (a 4% slower rank on two
    // H200s arrived last at 72% of the all-reduces and caused 96% of the waiting).
    let s = aggregate(&ranks_arriving_by(2, |rank, step| {
        match (rank, step % 10 < 7) {
            (0, _) => 9 * MS,
            (_, true) => 9_300 * US,
            (_, false) => 9 * MS - 10 * US,
        }
    }));
    let a = s.nccl_arrivals.as_ref().unwrap();
    let late = a.by_pid.iter().find(|p| p.pid == 301).unwrap();
    assert!((late.last_share - 0.7).abs() < 1e-9, "{a:?}");
    assert!(a.share_of_waiting(301).unwrap() > 0.95, "{a:?}");
    assert_eq!(a.waited_for, Some(301));

    // Last at 7 steps of 10 by as much as the other is last by at the rest: each causes about
    // its share of the waiting, and neither holds the other back.
    let s = aggregate(&ranks_arriving_by(2, |rank, step| {
        match (rank, step % 10 < 7) {
            (0, _) => 9 * MS,
            (_, true) => 9_300 * US,
            (_, false) => 8_300 * US,
        }
    }));
    let a = s.nccl_arrivals.as_ref().unwrap();
    assert!(a.share_of_waiting(301).unwrap() < 0.75, "{a:?}");
    assert_eq!(a.waited_for, None);
}

#[test]
fn collectives_not_every_rank_ran_are_not_matched() {
    // Different collectives on each rank (a subgroup's, another communicator's): no match,
    // nobody named; a single rank has nothing to compare.
    let mut messages = ranks_arriving(&[9 * MS], 0);
    let other = name("ncclDevKernel_AllGather_RING_LL");
    messages.push(hello(400, "GPU-x"));
    messages.push(kernels(
        400,
        (0..100u64)
            .map(|step| kernel(&other, step * 10 * MS + 9 * MS, (step + 1) * 10 * MS, 20))
            .collect(),
    ));
    let s = aggregate(&messages);
    let a = s.nccl_arrivals.as_ref().unwrap();
    assert_eq!((a.matched, a.unmatched, a.waited_for), (0, 100, None));
    assert_eq!(aggregate(&ranks_arriving(&[9 * MS], 0)).nccl_arrivals, None);
}
