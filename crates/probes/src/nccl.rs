//! All-reduce over every selected GPU through NCCL, when libnccl is found at run time.
//!
//! One process drives all GPUs (`ncclCommInitAll`, one communicator per GPU, each all-reduce
//! issued for all GPUs inside one group). Float32 sums of a buffer where GPU r holds r + 1
//! everywhere, so every element of the result must be n(n+1)/2 exactly; the result is checked.
//! Figures follow nccl-tests: algorithm bandwidth = bytes / time per all-reduce, bus bandwidth
//! = algorithm bandwidth × 2(n−1)/n, the traffic each link carries in a ring all-reduce, which
//! makes the number comparable across GPU counts and with the link's speed.
//!
//! NVLink multicast (NVLS) stays off: `main` sets `NCCL_NVLS_ENABLE=0` unless the user set it,
//! because multicast objects can outlive a crashed process and take a shared host's GPUs out
//! of service.
//!
//! NCCL is bound by hand with libloading: seven entry points, found at a path gpudiag locates
//! (also inside NVIDIA's Python wheels, where PyTorch users have it), which cudarc's NCCL
//! loader cannot be pointed at (checked against cudarc 0.19.10: it tries fixed bare names on
//! the loader's path, none of them NCCL's soname `libnccl.so.2`); cudarc's loader also panics
//! when the library is missing, and its `Comm` unwraps in `Drop` and in group calls, where a
//! missing or broken NCCL must become a skipped probe with its reason.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, sys};

use super::gpu::{DeviceBuffer, Stream, cuda};
use super::suite::NcclParams;
use super::{Measurement, ProbeDeadline, ProbeError, ProbeResult, SpanTimer, Verdict, gb_per_s};
use gpudiag_model::cuda_libraries;
use gpudiag_model::deadline::{DeadlineError, run_with_deadline};

/// The NCCL environment variable that turns NVLink multicast (NVLS) off.
pub const NVLS_ENV: &str = "NCCL_NVLS_ENABLE";

const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;
/// Elements checked at each end of every GPU's result.
const VERIFY_ELEMENTS: usize = 1 << 18;

type Comm = *mut c_void;
type NcclResult = c_int;

struct Nccl {
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        sys::CUstream,
    ) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    path: String,
    // Kept last so the functions above never outlive the library.
    _lib: libloading::Library,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's type is the prototype in nccl.h.
        *unsafe { $lib.get($name) }
            .map_err(|e| format!("libnccl lacks {}: {e}", stringify!($name)))?
    };
}

impl Nccl {
    fn load(path: &str) -> Result<Nccl, String> {
        // SAFETY: loading NCCL runs its initialisers, which only set up its own state.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("could not load {path}: {e}"))?;
        Ok(Nccl {
            get_version: sym!(lib, b"ncclGetVersion\0"),
            comm_init_all: sym!(lib, b"ncclCommInitAll\0"),
            comm_destroy: sym!(lib, b"ncclCommDestroy\0"),
            all_reduce: sym!(lib, b"ncclAllReduce\0"),
            group_start: sym!(lib, b"ncclGroupStart\0"),
            group_end: sym!(lib, b"ncclGroupEnd\0"),
            error_string: sym!(lib, b"ncclGetErrorString\0"),
            path: path.to_owned(),
            _lib: lib,
        })
    }

    fn check(&self, r: NcclResult, what: &str) -> Result<(), ProbeError> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static NUL-terminated string for any code.
        let msg = unsafe {
            let p = (self.error_string)(r);
            if p.is_null() {
                format!("error {r}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(ProbeError::Cuda(format!("{what}: {msg}")))
    }

    /// "2.27.3".
    fn version(&self) -> Option<String> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        if unsafe { (self.get_version)(&mut v) } != 0 {
            return None;
        }
        Some(version_string(v))
    }
}

/// NCCL's integer version (major·10000 + minor·100 + patch since 2.9; major·1000 + minor·100 +
/// patch before) as "major.minor.patch".
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// nccl-tests' bus-bandwidth factor for all-reduce over `ranks` GPUs.
pub fn allreduce_bus_factor(ranks: usize) -> f64 {
    if ranks == 0 {
        return 0.0;
    }
    2.0 * (ranks as f64 - 1.0) / ranks as f64
}

/// Where libnccl is, or why it is not used.
pub fn locate() -> Result<String, String> {
    let libs = cuda_libraries::detect_libraries();
    match libs.iter().find(|l| l.name == "libnccl") {
        Some(l) if l.found => l.path.clone().ok_or_else(|| "libnccl has no path".into()),
        Some(l) => Err(l.note.clone().unwrap_or_else(|| "libnccl not found".into())),
        None => Err("libnccl not found".into()),
    }
}

/// One GPU taking part: NVML index and CUDA ordinal.
#[derive(Debug, Clone, Copy)]
pub struct Rank {
    pub index: u32,
    pub ordinal: usize,
}

/// Runs the all-reduce sizes over `ranks` on a worker thread bounded by the suite's deadline:
/// a wedged fabric hangs NCCL calls, and a probe must return.
pub fn run(ranks: &[Rank], p: &NcclParams, budget: u64, ctl: &ProbeDeadline) -> ProbeResult {
    let first = ranks.first().map_or(0, |r| r.index);
    let mut r = ProbeResult::new("nccl", first);
    r.param("gpus", ranks.iter().map(|x| x.index).collect::<Vec<_>>());
    if ranks.len() < 2 {
        r.verdict = Verdict::Skipped;
        r.note = Some("one GPU: no all-reduce to measure, nothing to compare".into());
        return r;
    }
    let path = match locate() {
        Ok(p) => p,
        Err(why) => {
            r.verdict = Verdict::Skipped;
            r.note = Some(format!("NCCL not available: {why}"));
            return r;
        }
    };
    let wait = ctl
        .deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    let (ranks_owned, params, ctl_owned) = (ranks.to_vec(), p.clone(), ctl.clone());
    let mut worker_result = r.clone();
    let outcome = run_with_deadline("nccl", wait, move || {
        let res = measure(
            &path,
            &ranks_owned,
            &params,
            budget,
            &ctl_owned,
            &mut worker_result,
        );
        (res, worker_result)
    });
    match outcome {
        Ok((Ok(()), done)) => done,
        Ok((Err(e), mut done)) => {
            let v = match e {
                ProbeError::Unsupported(_) => Verdict::Skipped,
                _ => Verdict::Error,
            };
            done.downgrade(v, e.to_string());
            done
        }
        Err(DeadlineError::TimedOut(d)) => {
            r.downgrade(
                Verdict::Error,
                format!(
                    "NCCL did not finish within {:.0} s: the GPUs' interconnect may be hung",
                    d.as_secs_f64()
                ),
            );
            r
        }
        Err(e) => {
            r.downgrade(Verdict::Error, e.to_string());
            r
        }
    }
}

/// Per-GPU state; freed with its context current.
struct RankState {
    ctx: std::sync::Arc<CudaContext>,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    stream: Stream,
}

impl Drop for RankState {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}

fn measure(
    path: &str,
    ranks: &[Rank],
    p: &NcclParams,
    budget: u64,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    let nccl = Nccl::load(path).map_err(ProbeError::Unsupported)?;
    let version = nccl.version();
    let served_by = format!("NCCL {} ({})", version.as_deref().unwrap_or("?"), nccl.path);
    r.param("nccl_version", version.clone().unwrap_or_default());
    r.param(
        NVLS_ENV,
        std::env::var(NVLS_ENV).unwrap_or_else(|_| "unset".into()),
    );
    // Out of place: two buffers of the largest size per GPU, within the memory budget.
    let cap = budget / 2 / 4 * 4;
    let sizes: Vec<u64> = p
        .sizes
        .iter()
        .map(|s| (*s).min(cap))
        .filter(|s| *s >= 4)
        .collect();
    let largest = sizes.iter().copied().max().ok_or_else(|| {
        ProbeError::Refused(format!(
            "the memory budget ({budget} bytes) is too small for an all-reduce"
        ))
    })? as usize;
    r.param("sizes", sizes.clone());
    r.param("warmups", p.warmups);
    r.param("iterations", p.iterations);
    let n = ranks.len();
    let mut states = Vec::new();
    for (rank, x) in ranks.iter().enumerate() {
        let ctx = CudaContext::new(x.ordinal).map_err(cuda("creating the CUDA context"))?;
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let state = RankState {
            send: DeviceBuffer::new(largest)?,
            recv: DeviceBuffer::new(largest)?,
            stream: Stream::new()?,
            ctx,
        };
        let value = (rank as f32 + 1.0).to_bits();
        // SAFETY: `largest / 4` 32-bit words lie inside the allocation.
        unsafe { sys::cuMemsetD32Async(state.send.ptr, value, largest / 4, state.stream.raw) }
            .result()
            .map_err(cuda("cuMemsetD32Async"))?;
        state.stream.synchronize()?;
        states.push(state);
    }
    let ordinals: Vec<c_int> = ranks.iter().map(|x| x.ordinal as c_int).collect();
    let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); n];
    let t = SpanTimer::start("ncclCommInitAll");
    // SAFETY: `comms` has room for `n` communicators and `ordinals` lists `n` devices.
    nccl.check(
        unsafe { (nccl.comm_init_all)(comms.as_mut_ptr(), n as c_int, ordinals.as_ptr()) },
        "ncclCommInitAll",
    )?;
    t.finish(r);
    let outcome = all_sizes(&nccl, &states, &comms, &sizes, p, ctl, &served_by, r);
    for c in comms {
        // SAFETY: each communicator was created above and is destroyed once.
        let _ = unsafe { (nccl.comm_destroy)(c) };
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
fn all_sizes(
    nccl: &Nccl,
    states: &[RankState],
    comms: &[Comm],
    sizes: &[u64],
    p: &NcclParams,
    ctl: &ProbeDeadline,
    served_by: &str,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    let n = states.len();
    let expected = (n * (n + 1) / 2) as f32;
    let mut wrong = Vec::new();
    for &bytes in sizes {
        ctl.check()?;
        let count = (bytes / 4) as usize;
        let reduce = || -> Result<(), ProbeError> {
            // SAFETY: group calls bracket one all-reduce per communicator; buffers hold
            // `count` floats on the communicator's GPU and streams belong to those GPUs.
            unsafe {
                nccl.check((nccl.group_start)(), "ncclGroupStart")?;
                for (s, c) in states.iter().zip(comms) {
                    let rc = (nccl.all_reduce)(
                        s.send.ptr as *const c_void,
                        s.recv.ptr as *mut c_void,
                        count,
                        NCCL_FLOAT32,
                        NCCL_SUM,
                        *c,
                        s.stream.raw,
                    );
                    if rc != 0 {
                        let _ = (nccl.group_end)();
                        return nccl.check(rc, "ncclAllReduce");
                    }
                }
                nccl.check((nccl.group_end)(), "ncclGroupEnd")
            }
        };
        let sync = || -> Result<(), ProbeError> {
            for s in states {
                s.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
                s.stream.synchronize()?;
            }
            Ok(())
        };
        let span = SpanTimer::start(format!("all-reduce {bytes} B"));
        for _ in 0..p.warmups {
            reduce()?;
        }
        sync()?;
        ctl.check()?;
        // nccl-tests' timing: the wall clock around the launches and the final wait.
        let start = Instant::now();
        for _ in 0..p.iterations {
            reduce()?;
        }
        sync()?;
        let per_op_ms = start.elapsed().as_secs_f64() * 1e3 / f64::from(p.iterations);
        span.finish(r);
        let algbw = gb_per_s(bytes as f64, per_op_ms);
        let busbw = algbw * allreduce_bus_factor(n);
        r.metrics.push(Measurement::new(
            &format!("algbw_{bytes}"),
            algbw,
            "GB/s",
            served_by,
            vec![algbw],
        ));
        r.metrics.push(Measurement::new(
            &format!("busbw_{bytes}"),
            busbw,
            "GB/s",
            served_by,
            vec![busbw],
        ));
        r.metrics.push(Measurement::new(
            &format!("time_{bytes}"),
            per_op_ms * 1e3,
            "us",
            served_by,
            vec![per_op_ms * 1e3],
        ));
        for (rank, s) in states.iter().enumerate() {
            s.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
            if let Some(bad) = first_wrong(&s.recv, count, expected)? {
                wrong.push(format!(
                    "GPU rank {rank}, {bytes} B: element {} is {} (expected {expected})",
                    bad.0, bad.1
                ));
            }
        }
    }
    r.details
        .insert("verified".into(), serde_json::json!(wrong.is_empty()));
    r.details
        .insert("expected_sum".into(), serde_json::json!(expected));
    if !wrong.is_empty() {
        r.downgrade(
            Verdict::Fail,
            format!("the all-reduce returned wrong sums: {}", wrong.join("; ")),
        );
    }
    Ok(())
}

/// The first element among the first and last `VERIFY_ELEMENTS` that is not `expected`.
fn first_wrong(
    buf: &DeviceBuffer,
    count: usize,
    expected: f32,
) -> Result<Option<(usize, f32)>, ProbeError> {
    let n = VERIFY_ELEMENTS.min(count);
    let mut bytes = vec![0u8; n * 4];
    for start in [0, count - n] {
        buf.read(start * 4, &mut bytes)?;
        for (i, w) in bytes.chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            if v != expected {
                return Ok(Some((start + i, v)));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        // nccl-tests PERFORMANCE.md: all-reduce busbw = algbw * 2(n-1)/n.
        assert_eq!(allreduce_bus_factor(1), 0.0);
        assert_eq!(allreduce_bus_factor(2), 1.0);
        assert_eq!(allreduce_bus_factor(4), 1.5);
        assert!((allreduce_bus_factor(8) - 1.75).abs() < 1e-12);
        assert_eq!(allreduce_bus_factor(0), 0.0);
        // 256 MiB in 1 ms on 8 GPUs: 268.4 GB/s algbw, 469.8 GB/s busbw.
        let algbw = gb_per_s((256u64 << 20) as f64, 1.0);
        assert!((algbw - 268.435).abs() < 0.01, "{algbw}");
        assert!((algbw * allreduce_bus_factor(8) - 469.762).abs() < 0.01);
    }

    #[test]
    fn versions_decode_both_encodings() {
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(2708), "2.7.8");
    }

    #[test]
    fn one_gpu_is_skipped_without_touching_nccl() {
        let ctl = ProbeDeadline::new(
            Duration::from_secs(5),
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        );
        let r = run(
            &[Rank {
                index: 2,
                ordinal: 0,
            }],
            &NcclParams::default(),
            1 << 30,
            &ctl,
        );
        assert_eq!((r.device, r.verdict), (2, Verdict::Skipped));
        assert!(r.note.unwrap_or_default().contains("nothing to compare"));
    }
}
