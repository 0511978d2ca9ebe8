//! Bandwidth: host↔device with pinned and pageable memory, both directions at once, and device
//! to device by memcpy, by a copy kernel and by a STREAM triad. Timed the nvbandwidth way:
//! device events around 16 copies after 4 warm-ups, several samples, the median; GB = 1e9.
//! Host buffers are made and copied from a thread kept on the GPU's CPUs (`placement`), as
//! nvbandwidth does, so their pages sit on the GPU's NUMA node.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::gpu::{DeviceBuffer, Event, Gpu, PinnedBuffer, Stream, ck, grid_for, launch};
use super::placement::NearGpu;
use super::suite::{BandwidthParams, ModelRef};
use super::{
    Measurement, ProbeDeadline, ProbeError, ProbeResult, SpanTimer, Verdict, gb_per_s, median,
};

pub const WARMUPS: u32 = 4;
pub const COPIES: u32 = 16;

/// Bytes of one host↔device copy at most, whatever the suite's copy size. At 55 GB/s a copy of
/// 256 MiB takes about 5 ms (80 ms a sample), far past where launch and event costs show, and
/// the probe's host memory stays at two such buffers: with the copy size (1 GiB in `standard`)
/// for two pinned buffers and a pageable one held together, the suite peaked at 3.45 GB.
pub const HOST_BYTES_MAX: usize = 256 << 20;

/// Bytes of a host↔device copy in place of the suite's, for a benchmark's size sweep:
/// `GPUDIAG_PROBE_HOST_BYTES=67108864`. Hidden; still capped by the device buffer's size.
pub const HOST_BYTES_ENV: &str = "GPUDIAG_PROBE_HOST_BYTES";

/// Tests to run in place of the suite's, comma-separated, for a benchmark that wants only some
/// (`GPUDIAG_PROBE_BANDWIDTH_TESTS=h2d_pinned,d2h_pinned`). Hidden.
pub const TESTS_ENV: &str = "GPUDIAG_PROBE_BANDWIDTH_TESTS";

/// Page-locked buffers, made when a test first needs them and freed before the pageable tests,
/// so pinned and pageable host memory are never held at once.
struct PinnedPool {
    bytes: usize,
    buffers: Vec<PinnedBuffer>,
}

impl PinnedPool {
    /// At least `n` buffers.
    fn get(&mut self, n: usize) -> Result<&[PinnedBuffer], ProbeError> {
        while self.buffers.len() < n {
            self.buffers.push(PinnedBuffer::new(self.bytes)?);
        }
        Ok(&self.buffers[..n])
    }

    fn release(&mut self) {
        self.buffers.clear();
    }
}

pub const TESTS: [&str; 8] = [
    "h2d_pinned",
    "d2h_pinned",
    "h2d_pageable",
    "d2h_pageable",
    "bidirectional_pinned",
    "d2d_memcpy",
    "d2d_kernel",
    "triad",
];

/// Times `samples` × (16 ops between events), after 4 warm-up ops; milliseconds per sample.
pub(crate) fn time_ops(
    s: &Stream,
    samples: u32,
    ctl: &ProbeDeadline,
    mut op: impl FnMut() -> Result<(), ProbeError>,
) -> Result<Vec<f64>, ProbeError> {
    for _ in 0..WARMUPS {
        op()?;
    }
    let (e0, e1) = (Event::new()?, Event::new()?);
    let mut out = Vec::new();
    for _ in 0..samples {
        ctl.check()?;
        e0.record(s)?;
        for _ in 0..COPIES {
            op()?;
        }
        e1.record(s)?;
        out.push(e0.elapsed_ms(&e1)?);
    }
    Ok(out)
}

/// GB/s per sample for `bytes` moved per op.
pub(crate) fn rates(ms: &[f64], bytes: f64) -> Vec<f64> {
    ms.iter()
        .map(|t| gb_per_s(bytes * f64::from(COPIES), *t))
        .collect()
}

/// Expected GB/s of a test on a known model: the PCIe link per direction (both for
/// bidirectional), the memory bandwidth for device traffic, half of it for bytes copied.
pub fn expected(test: &str, model: Option<&ModelRef>) -> Option<f64> {
    let m = model?;
    match test {
        "h2d_pinned" | "d2h_pinned" | "h2d_pageable" | "d2h_pageable" => m.pcie_gbps(),
        "bidirectional_pinned" => m.pcie_gbps().map(|g| 2.0 * g),
        "d2d_memcpy" | "d2d_kernel" => Some(m.memory_bandwidth_gbps / 2.0),
        "d2d_memcpy_traffic" | "d2d_kernel_traffic" | "triad" => Some(m.memory_bandwidth_gbps),
        _ => None,
    }
}

pub fn run(
    gpu: &Gpu,
    p: &BandwidthParams,
    budget: u64,
    model: Option<&ModelRef>,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    // Three device buffers at most (triad); 16-byte multiples for the vector kernels.
    let bytes = (p.bytes.min(budget / 3) / 16 * 16) as usize;
    if bytes < (1 << 20) {
        return Err(ProbeError::Refused(format!(
            "the memory budget ({budget} bytes) is too small for a bandwidth test"
        )));
    }
    r.param("bytes", bytes as u64);
    let host_bytes = match std::env::var(HOST_BYTES_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(h) => bytes.min((h / 16 * 16) as usize),
        None => bytes
            .min(HOST_BYTES_MAX)
            .min(p.host_bytes.map_or(usize::MAX, |h| (h / 16 * 16) as usize)),
    }
    .max(16);
    r.param("host_bytes", host_bytes as u64);
    // Before any host buffer is made: its pages come from the node of the CPU that makes it.
    let near = NearGpu::bind(&gpu.info.pci_bus_id);
    let place = &near.placement;
    r.param("host_placement", place.placement);
    if let Some(node) = place.numa_node {
        r.param("gpu_numa_node", node);
    }
    if let Some(cpus) = &place.cpus {
        r.param("host_cpus", cpus.as_str());
    }
    if let Some(why) = &place.why {
        r.param("host_placement_why", why.as_str());
    }
    r.param("samples", p.samples);
    r.param("warmups", WARMUPS);
    r.param("copies_per_sample", COPIES);
    let libcuda = format!(
        "cuMemcpyAsync (libcuda, CUDA {})",
        gpu.info.driver_cuda_version
    );
    let s = &gpu.stream;
    let a = DeviceBuffer::new(bytes)?;
    let b = DeviceBuffer::new(bytes)?;
    a.memset(0x5a, s)?;
    b.memset(0xa5, s)?;
    let only = std::env::var(TESTS_ENV).ok();
    let want = |t: &str| match &only {
        Some(list) => list.split(',').any(|x| x.trim() == t),
        None => p.tests.iter().any(|x| x == t),
    };
    let mut pinned = PinnedPool {
        bytes: host_bytes,
        buffers: Vec::new(),
    };
    let push = |r: &mut ProbeResult, name: &str, samples: Vec<f64>, by: &str| {
        let v = median(&samples).unwrap_or(f64::NAN);
        r.metrics.push(
            Measurement::new(name, v, "GB/s", by, samples).with_expected(expected(name, model)),
        );
    };

    for test in TESTS.iter().filter(|t| want(t)) {
        ctl.check()?;
        let t = SpanTimer::start(*test);
        match *test {
            "h2d_pinned" | "d2h_pinned" => {
                let h = pinned.get(1)?[0].ptr;
                let h2d = *test == "h2d_pinned";
                let ms = time_ops(s, p.samples, ctl, || copy_host(h2d, h, &a, host_bytes, s))?;
                push(r, test, rates(&ms, host_bytes as f64), &libcuda);
            }
            "h2d_pageable" | "d2h_pageable" => {
                s.synchronize()?;
                pinned.release();
                let mut host = vec![0x5au8; host_bytes];
                let h2d = *test == "h2d_pageable";
                let ptr = host.as_mut_ptr() as *mut c_void;
                let ms = time_ops(s, p.samples, ctl, || copy_host(h2d, ptr, &a, host_bytes, s))?;
                s.synchronize()?;
                drop(host);
                push(r, test, rates(&ms, host_bytes as f64), &libcuda);
            }
            "bidirectional_pinned" => {
                let (h1, h2) = match pinned.get(2)? {
                    [h1, h2] => (h1.ptr, h2.ptr),
                    _ => continue,
                };
                let s2 = Stream::new()?;
                let (start, done2) = (Event::new()?, Event::new()?);
                let ms = time_ops(s, p.samples, ctl, || {
                    // One H2D on the main stream and one D2H on a second stream, started
                    // together; the main stream waits for both, so each op spans both.
                    start.record(s)?;
                    s2.wait(&start)?;
                    copy_host(true, h1, &a, host_bytes, s)?;
                    copy_host(false, h2, &b, host_bytes, &s2)?;
                    done2.record(&s2)?;
                    s.wait(&done2)
                })?;
                push(r, test, rates(&ms, 2.0 * host_bytes as f64), &libcuda);
                s.synchronize()?;
                pinned.release();
            }
            "d2d_memcpy" => {
                let ms = time_ops(s, p.samples, ctl, || {
                    // SAFETY: both ranges lie inside live allocations of `bytes`.
                    ck(
                        unsafe { sys::cuMemcpyDtoDAsync_v2(b.ptr, a.ptr, bytes, s.raw) },
                        "cuMemcpyDtoDAsync",
                    )
                })?;
                let copied = rates(&ms, bytes as f64);
                push(
                    r,
                    "d2d_memcpy_traffic",
                    copied.iter().map(|x| 2.0 * x).collect(),
                    &libcuda,
                );
                push(r, test, copied, &libcuda);
            }
            "d2d_kernel" => {
                let m = gpu.module("copy")?;
                let f = m.function("copy_u4")?;
                let n = (bytes / 16) as u64;
                let grid = grid_for(n, 256, gpu.info.multiprocessors);
                let ms = time_ops(s, p.samples, ctl, || {
                    launch(f, (grid, 1, 1), (256, 1, 1), 0, s, &[&a.ptr, &b.ptr, &n])
                })?;
                let copied = rates(&ms, bytes as f64);
                push(
                    r,
                    "d2d_kernel_traffic",
                    copied.iter().map(|x| 2.0 * x).collect(),
                    &m.served_by,
                );
                push(r, test, copied, &m.served_by);
            }
            "triad" => {
                let m = gpu.module("copy")?;
                let f = m.function("triad_f4")?;
                let fill = m.function("fill_f4")?;
                let c = DeviceBuffer::new(bytes)?;
                let n = (bytes / 16) as u64;
                let grid = grid_for(n, 256, gpu.info.multiprocessors);
                for (buf, v) in [(&b, 1.5f32), (&c, 2.5f32)] {
                    launch(fill, (grid, 1, 1), (256, 1, 1), 0, s, &[&buf.ptr, &n, &v])?;
                }
                let scalar = 3.0f32;
                let ms = time_ops(s, p.samples, ctl, || {
                    launch(
                        f,
                        (grid, 1, 1),
                        (256, 1, 1),
                        0,
                        s,
                        &[&a.ptr, &b.ptr, &c.ptr, &scalar, &n],
                    )
                })?;
                // Two reads and one write per element.
                push(r, test, rates(&ms, 3.0 * bytes as f64), &m.served_by);
            }
            _ => {}
        }
        t.finish(r);
    }
    s.synchronize()?;
    drop(pinned);
    drop(near);
    judge(r);
    Ok(())
}

/// Pinned transfers below half of what the link carries, and device traffic below half of the
/// model's peak, are warnings (the pcie rules give the finer verdicts).
fn judge(r: &mut ProbeResult) {
    let low: Vec<String> = r
        .metrics
        .iter()
        .filter(|m| !m.name.contains("pageable"))
        .filter_map(|m| {
            m.ratio
                .filter(|x| *x < 0.5)
                .map(|x| format!("{} at {:.0}% of peak", m.name, x * 100.0))
        })
        .collect();
    if !low.is_empty() {
        r.downgrade(Verdict::Warn, low.join(", "));
    }
}

fn copy_host(
    h2d: bool,
    host: *mut c_void,
    dev: &DeviceBuffer,
    bytes: usize,
    s: &Stream,
) -> Result<(), ProbeError> {
    // SAFETY: `host` points to at least `bytes` bytes owned by the caller for the duration of
    // the timed region (the caller synchronises before freeing it); `dev` holds `bytes`.
    unsafe {
        if h2d {
            ck(
                sys::cuMemcpyHtoDAsync_v2(dev.ptr, host, bytes, s.raw),
                "cuMemcpyHtoDAsync",
            )
        } else {
            ck(
                sys::cuMemcpyDtoHAsync_v2(host, dev.ptr, bytes, s.raw),
                "cuMemcpyDtoHAsync",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{lookup, reference};

    #[test]
    fn expectations_come_from_the_model() {
        let t = reference();
        let h200 = lookup(&t, "NVIDIA H200");
        let pcie = expected("h2d_pinned", h200).unwrap();
        assert!((pcie - 63.0).abs() < 0.1);
        assert_eq!(expected("d2d_memcpy_traffic", h200), Some(4800.0));
        assert_eq!(expected("d2d_memcpy", h200), Some(2400.0));
        assert_eq!(expected("h2d_pinned", None), None);
        assert_eq!(expected("launch", h200), None);
    }

    #[test]
    fn rates_count_every_copy() {
        // 16 copies of 1e9 bytes in 1 s = 16 GB/s.
        assert_eq!(rates(&[1000.0], 1e9), vec![16.0]);
    }
}
