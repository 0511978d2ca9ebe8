//! Synthetic collector message streams of the shapes `run --kernels` must tell apart (a
//! sync-bound loop, a launch-bound loop of tiny kernels, pageable copies, two ranks with
//! different NCCL shares), for the tests of every layer that reads them: the aggregation, the
//! report's text and the trace.

use std::sync::Arc;

use gpudiag_model::kernels::{
    ClockPair, CollectorHello, CollectorLosses, CollectorMessage, CopyDirection, CopyRecord,
    CudaDevice, HostMemory, KernelRecord, SetRecord, SyncCall, SyncRecord,
};

/// CUPTI's clock starts at 1 s; the Unix clock at 1.7e18 ns.
pub const CUPTI0: u64 = 1_000_000_000;
pub const UNIX0: u64 = 1_700_000_000_000_000_000;
pub const CLOCK: ClockPair = ClockPair {
    cupti_ns: CUPTI0,
    unix_ns: UNIX0,
};
pub const MS: u64 = 1_000_000;
pub const US: u64 = 1_000;

pub fn hello(pid: u32, uuid: &str) -> CollectorMessage {
    CollectorMessage::Hello(CollectorHello {
        pid,
        parent_pid: 1,
        cupti_api_version: 130_000,
        cupti_source: "already loaded".into(),
        collector_version: 1,
        devices: vec![CudaDevice {
            ordinal: 0,
            uuid: Some(uuid.into()),
        }],
        clock: CLOCK,
    })
}

pub fn kernel(name: &Arc<str>, start: u64, end: u64, stream: u32) -> KernelRecord {
    KernelRecord {
        start_ns: CUPTI0 + start,
        end_ns: CUPTI0 + end,
        device: 0,
        context: 1,
        stream,
        name: name.clone(),
        grid: [128, 1, 1],
        block: [256, 1, 1],
        registers_per_thread: 32,
        shared_memory_bytes: 0,
        graph_id: None,
        correlation_id: 1,
    }
}

pub fn kernels(pid: u32, records: Vec<KernelRecord>) -> CollectorMessage {
    CollectorMessage::Kernels {
        pid,
        clock: CLOCK,
        records,
    }
}

pub fn sync(start: u64, end: u64, call: SyncCall) -> SyncRecord {
    SyncRecord {
        start_ns: CUPTI0 + start,
        end_ns: CUPTI0 + end,
        device: Some(0),
        context: 1,
        stream: Some(7),
        call,
        correlation_id: 2,
    }
}

pub fn copy(start: u64, end: u64, bytes: u64, host_memory: HostMemory) -> CopyRecord {
    CopyRecord {
        start_ns: CUPTI0 + start,
        end_ns: CUPTI0 + end,
        device: 0,
        context: 1,
        stream: 7,
        bytes,
        direction: CopyDirection::HostToDevice,
        host_memory,
        graph_id: None,
        correlation_id: 3,
    }
}

pub fn name(s: &str) -> Arc<str> {
    Arc::from(s)
}

pub const MATMUL: &str = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64";
pub const ADD: &str = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_";
pub const ALLREDUCE: &str =
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)";

/// A loop that does 1 ms of matmul then waits 2 ms in `cudaStreamSynchronize` on the host,
/// while the GPU idles (`.item()` and the Python around it), for 1 s.
pub fn sync_bound_stream(pid: u32) -> Vec<CollectorMessage> {
    let m = name(MATMUL);
    let mut out = vec![hello(pid, "GPU-aaaa")];
    let mut ks = Vec::new();
    let mut ss = Vec::new();
    for step in 0..333u64 {
        let t = step * 3 * MS;
        ks.push(kernel(&m, t, t + MS, 7));
        ss.push(sync(t + 50 * US, t + 2 * MS, SyncCall::StreamSynchronize));
    }
    out.push(kernels(pid, ks));
    out.push(CollectorMessage::Syncs {
        pid,
        clock: CLOCK,
        records: ss,
    });
    out.push(CollectorMessage::Goodbye { pid });
    out
}

/// Tiny kernels back to back with gaps: 4 µs kernels every 10 µs, 100,000 a second.
pub fn launch_bound_stream(pid: u32) -> Vec<CollectorMessage> {
    let add = name(ADD);
    let mut out = vec![hello(pid, "GPU-bbbb")];
    for batch in 0..10u64 {
        let records = (0..10_000u64)
            .map(|i| {
                let t = (batch * 10_000 + i) * 10 * US;
                kernel(&add, t, t + 4 * US, 7)
            })
            .collect();
        out.push(kernels(pid, records));
    }
    out.push(CollectorMessage::Goodbye { pid });
    out
}

/// 64 MiB from pageable memory every 10 ms, each taking 6 ms, and a 1 MiB pinned one; the
/// process never says goodbye.
pub fn pageable_copies_stream(pid: u32) -> Vec<CollectorMessage> {
    let mut records = Vec::new();
    for i in 0..100u64 {
        let t = i * 10 * MS;
        records.push(copy(t, t + 6 * MS, 64 << 20, HostMemory::Pageable));
        records.push(copy(
            t + 6 * MS,
            t + 6 * MS + 100 * US,
            1 << 20,
            HostMemory::Pinned,
        ));
    }
    vec![
        hello(pid, "GPU-cccc"),
        CollectorMessage::Copies {
            pid,
            clock: CLOCK,
            records,
        },
    ]
}

/// Two ranks on two GPUs: rank A waits in its all-reduce 40% of each step, rank B (the slow
/// one) 10%.
pub fn two_ranks() -> Vec<CollectorMessage> {
    let m = name(MATMUL);
    let ar = name(ALLREDUCE);
    let mut out = Vec::new();
    for (pid, uuid, wait) in [(200u32, "GPU-r0", 4 * MS), (201, "GPU-r1", MS)] {
        out.push(hello(pid, uuid));
        let mut records = Vec::new();
        for step in 0..100u64 {
            let t = step * 10 * MS;
            records.push(kernel(&m, t, t + 10 * MS - wait, 7));
            records.push(kernel(&ar, t + 10 * MS - wait, t + 10 * MS, 20));
        }
        out.push(kernels(pid, records));
    }
    out
}

/// A training step as PyTorch runs it, 50 steps of 10 ms on one GPU: the batch copied from
/// pageable memory, a memset, a matmul and 20 small elementwise kernels on stream 7 (one of
/// them replayed from a CUDA graph), an all-reduce on stream 20 overlapping the end of the
/// step, and `.item()` (a stream synchronisation) at the end. The collector stepped aside for
/// torch.profiler over steps 10–12, lost a few records, and the process never said goodbye.
pub fn training_stream(pid: u32, uuid: &str) -> Vec<CollectorMessage> {
    let matmul = name(MATMUL);
    let add = name(ADD);
    let allreduce = name(ALLREDUCE);
    let graphed = name("triton_poi_fused_add_mul_0");
    let mut out = vec![hello(pid, uuid)];
    let mut ks = Vec::new();
    let mut cs = Vec::new();
    let mut sets = Vec::new();
    let mut syncs = Vec::new();
    let mut correlation = 0u32;
    let mut next = || {
        correlation += 1;
        correlation
    };
    for step in (0..50u64).filter(|s| !(10..13).contains(s)) {
        let t = step * 10 * MS;
        cs.push(CopyRecord {
            correlation_id: next(),
            ..copy(t, t + 500 * US, 4 << 20, HostMemory::Pageable)
        });
        sets.push(SetRecord {
            start_ns: CUPTI0 + t + 500 * US,
            end_ns: CUPTI0 + t + 510 * US,
            device: 0,
            context: 1,
            stream: 7,
            bytes: 4096,
            correlation_id: next(),
        });
        ks.push(KernelRecord {
            grid: [132, 1, 1],
            block: [384, 1, 1],
            registers_per_thread: 168,
            shared_memory_bytes: 232_448,
            correlation_id: next(),
            ..kernel(&matmul, t + 600 * US, t + 5_600 * US, 7)
        });
        for i in 0..20u64 {
            let at = t + 5_700 * US + i * 20 * US;
            ks.push(KernelRecord {
                correlation_id: next(),
                ..kernel(&add, at, at + 2 * US, 7)
            });
        }
        ks.push(KernelRecord {
            graph_id: Some(1),
            grid: [4, 1, 1],
            correlation_id: next(),
            ..kernel(&graphed, t + 6_200 * US, t + 6_300 * US, 7)
        });
        ks.push(KernelRecord {
            grid: [24, 1, 1],
            block: [640, 1, 1],
            correlation_id: next(),
            ..kernel(&allreduce, t + 6_200 * US, t + 8_200 * US, 20)
        });
        syncs.push(SyncRecord {
            correlation_id: next(),
            ..sync(t + 6_400 * US, t + 8_300 * US, SyncCall::StreamSynchronize)
        });
    }
    out.push(CollectorMessage::Copies {
        pid,
        clock: CLOCK,
        records: cs,
    });
    out.push(CollectorMessage::Sets {
        pid,
        clock: CLOCK,
        records: sets,
    });
    out.push(kernels(pid, ks));
    out.push(CollectorMessage::Syncs {
        pid,
        clock: CLOCK,
        records: syncs,
    });
    out.push(CollectorMessage::SteppedAside {
        pid,
        from_ns: CUPTI0 + 100 * MS,
        to_ns: Some(CUPTI0 + 130 * MS),
    });
    out.push(CollectorMessage::Losses {
        pid,
        losses: CollectorLosses {
            cupti_dropped: 0,
            send_dropped: 12,
            names_cut: 1,
        },
    });
    out
}

/// A sampling collector (`--kernels=sample`): two closed 100 ms windows a second apart, then
/// one still open when the process ended; in each, 1 ms kernels every 2 ms (half busy), and
/// the second window's end said only after it closed, as the collector says it.
pub fn sampled_stream(pid: u32) -> Vec<CollectorMessage> {
    let m = name(MATMUL);
    let window = |from_ms: u64, to_ms: Option<u64>| CollectorMessage::Window {
        pid,
        from_unix_ns: UNIX0 + from_ms * MS,
        to_unix_ns: to_ms.map(|t| UNIX0 + t * MS),
        gave_way: false,
    };
    let mut out = vec![hello(pid, "GPU-5a5a"), window(0, None)];
    for (from, to, steps) in [(0, Some(100), 50), (1000, Some(1100), 50), (2000, None, 25)] {
        if from > 0 {
            out.push(window(from, None));
        }
        let ks = (0..steps)
            .map(|i| {
                let t = (from + 2 * i) * MS;
                kernel(&m, t, t + MS, 7)
            })
            .collect();
        out.push(kernels(pid, ks));
        if to.is_some() {
            out.push(window(from, to));
        }
    }
    out
}
