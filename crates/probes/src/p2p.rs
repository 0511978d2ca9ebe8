//! GPU-to-GPU copies: for every ordered pair, whether the driver grants peer access, the
//! unidirectional and bidirectional bandwidth of copy-engine transfers (`cuMemcpyPeerAsync`,
//! what `p2pBandwidthLatencyTest` and PyTorch's cross-device `copy_` use) and the latency of a
//! small copy. Timed like the bandwidth probe: device events around 16 copies after 4 warm-ups,
//! several samples, the median, GB = 1e9. Every copy is checked: the bytes that arrive must be
//! the sender's pattern, so a broken pair is reported as broken, not as slow.
//!
//! Without peer access the driver stages copies through host memory; the pair is still measured
//! (that is what an application would get) and reported as having peer access off.

use serde::{Deserialize, Serialize};

use cudarc::driver::sys;

use super::bandwidth::{COPIES, rates, time_ops};
use super::gpu::{DeviceBuffer, Event, Gpu, Stream, ck};
use super::suite::P2pParams;
use super::{Measurement, ProbeDeadline, ProbeError, ProbeResult, SpanTimer, Verdict, median};
use gpudiag_model::topology::Topology;

/// Small copies timed back to back for the latency figure.
const LATENCY_COPIES: u32 = 100;
const LATENCY_BYTES: usize = 4;
/// Bytes checked at each end of a received buffer.
const VERIFY_BYTES: usize = 1 << 20;

/// One ordered pair's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerLink {
    /// NVML indices.
    pub src: u32,
    pub dst: u32,
    /// The topology cell for the pair ("NV18", "SYS"), when the topology is known.
    pub connection: Option<String>,
    /// `cuDeviceCanAccessPeer`: the driver lets `src` address `dst`'s memory directly.
    pub peer_access: bool,
    /// Copy-engine bandwidth src → dst, GB/s.
    pub unidirectional_gbps: Option<f64>,
    /// src → dst and dst → src at once, both directions summed, GB/s.
    pub bidirectional_gbps: Option<f64>,
    /// One 4-byte copy, microseconds (median over batches of 100).
    pub latency_us: Option<f64>,
    /// The bytes that arrived were the sender's; `None` when the copy never ran.
    pub verified: Option<bool>,
    pub note: Option<String>,
}

pub fn unidirectional_metric(dst: u32) -> String {
    format!("unidirectional_to_gpu{dst}")
}

pub fn bidirectional_metric(peer: u32) -> String {
    format!("bidirectional_with_gpu{peer}")
}

pub fn latency_metric(dst: u32) -> String {
    format!("latency_to_gpu{dst}")
}

/// Metrics that describe one pair rather than the GPU as a whole; GPUs are compared on the
/// others.
pub fn is_pair_metric(name: &str) -> bool {
    name.contains("_gpu")
}

/// The links of a p2p result, from its details.
pub fn links_of(r: &ProbeResult) -> Vec<PeerLink> {
    r.details
        .get("links")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// A result for each GPU saying why no pair was measured.
pub fn skipped(indices: &[u32], why: &str) -> Vec<ProbeResult> {
    indices
        .iter()
        .map(|i| {
            let mut r = ProbeResult::new("p2p", *i);
            r.verdict = Verdict::Skipped;
            r.note = Some(why.to_owned());
            r
        })
        .collect()
}

/// One GPU's side of the test: a buffer to send from, one to receive into, a stream.
struct Side<'a> {
    index: u32,
    gpu: &'a Gpu,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    stream: Stream,
    pattern: u8,
}

impl Drop for Side<'_> {
    fn drop(&mut self) {
        // The buffers and stream belong to this GPU's context; free them with it current.
        let _ = self.gpu.bind();
        let _ = self.stream.synchronize();
    }
}

fn copy_peer(
    dst: &Side<'_>,
    src: &Side<'_>,
    bytes: usize,
    stream: &Stream,
) -> Result<(), ProbeError> {
    // SAFETY: both buffers are live allocations of at least `bytes` in the named contexts.
    ck(
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst.recv.ptr,
                dst.gpu.raw_context(),
                src.send.ptr,
                src.gpu.raw_context(),
                bytes,
                stream.raw,
            )
        },
        "cuMemcpyPeerAsync",
    )
}

fn can_access_peer(a: &Gpu, b: &Gpu) -> Result<bool, ProbeError> {
    let mut can = 0i32;
    // SAFETY: writes one int; both devices are valid.
    ck(
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.raw_device(), b.raw_device()) },
        "cuDeviceCanAccessPeer",
    )?;
    Ok(can != 0)
}

/// Enables `from`'s access to `to`'s memory; already enabled counts as done.
fn enable_peer(from: &Gpu, to: &Gpu) -> Result<(), ProbeError> {
    from.bind()?;
    // SAFETY: `to`'s context is alive; the flags must be 0.
    let r = unsafe { sys::cuCtxEnablePeerAccess(to.raw_context(), 0) };
    match r {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        other => ck(other, "cuCtxEnablePeerAccess"),
    }
}

/// True when the first and last `VERIFY_BYTES` of `side.recv` all hold `pattern`.
fn received(side: &Side<'_>, bytes: usize, pattern: u8) -> Result<bool, ProbeError> {
    side.gpu.bind()?;
    side.stream.synchronize()?;
    let n = VERIFY_BYTES.min(bytes);
    let mut buf = vec![0u8; n];
    for offset in [0, bytes - n] {
        side.recv.read(offset, &mut buf)?;
        if buf.iter().any(|b| *b != pattern) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Measures every ordered pair of `gpus` (NVML index, context); one result per GPU holding its
/// outgoing links. `budget` caps the bytes a GPU may allocate (two buffers of the copy size).
pub fn run(
    gpus: &[(u32, &Gpu)],
    p: &P2pParams,
    budget: u64,
    topology: Option<&Topology>,
    ctl: &ProbeDeadline,
) -> Vec<ProbeResult> {
    let indices: Vec<u32> = gpus.iter().map(|(i, _)| *i).collect();
    if gpus.len() < 2 {
        return skipped(
            &indices,
            "one GPU: no GPU pair to measure, nothing to compare",
        );
    }
    let bytes = (p.bytes.min(budget / 2) / 16 * 16) as usize;
    if bytes < (1 << 20) {
        return skipped(
            &indices,
            &format!("the memory budget ({budget} bytes) is too small for a peer copy test"),
        );
    }
    let mut results: Vec<ProbeResult> = indices
        .iter()
        .map(|i| {
            let mut r = ProbeResult::new("p2p", *i);
            r.param("bytes", bytes as u64);
            r.param("samples", p.samples);
            r.param("copies_per_sample", COPIES);
            r.param("latency_copies", LATENCY_COPIES);
            r.param("gpus", indices.clone());
            r
        })
        .collect();
    match measure(gpus, p, bytes, topology, ctl, &mut results) {
        Ok(()) => {}
        Err(e) => {
            for r in &mut results {
                let v = match e {
                    ProbeError::Unsupported(_) => Verdict::Skipped,
                    _ => Verdict::Error,
                };
                r.downgrade(v, e.to_string());
            }
        }
    }
    results
}

fn measure(
    gpus: &[(u32, &Gpu)],
    p: &P2pParams,
    bytes: usize,
    topology: Option<&Topology>,
    ctl: &ProbeDeadline,
    results: &mut [ProbeResult],
) -> Result<(), ProbeError> {
    let mut sides = Vec::new();
    for (n, (index, gpu)) in gpus.iter().enumerate() {
        gpu.bind()?;
        let side = Side {
            index: *index,
            gpu,
            send: DeviceBuffer::new(bytes)?,
            recv: DeviceBuffer::new(bytes)?,
            stream: Stream::new()?,
            // Distinct, non-trivial byte per GPU, so a copy from the wrong peer shows.
            pattern: 0x11u8.wrapping_mul(n as u8 + 1) ^ 0x80,
        };
        side.send.memset(side.pattern, &side.stream)?;
        side.recv.memset(0, &side.stream)?;
        side.stream.synchronize()?;
        sides.push(side);
    }
    let mut links: Vec<PeerLink> = Vec::new();
    for s in &sides {
        for d in &sides {
            if s.index == d.index {
                continue;
            }
            let mut link = PeerLink {
                src: s.index,
                dst: d.index,
                connection: topology
                    .and_then(|t| t.pair(s.index, d.index))
                    .map(|p| p.label.clone()),
                peer_access: false,
                unidirectional_gbps: None,
                bidirectional_gbps: None,
                latency_us: None,
                verified: None,
                note: None,
            };
            link.peer_access = can_access_peer(s.gpu, d.gpu)?;
            if link.peer_access
                && let Err(e) = enable_peer(s.gpu, d.gpu)
            {
                link.note = Some(format!("peer access could not be enabled: {e}"));
            }
            links.push(link);
        }
    }
    for link in &mut links {
        ctl.check()?;
        let (Some(s), Some(d)) = (
            sides.iter().find(|x| x.index == link.src),
            sides.iter().find(|x| x.index == link.dst),
        ) else {
            continue;
        };
        let t = SpanTimer::start(format!("gpu{}->gpu{}", link.src, link.dst));
        match one_way(s, d, p, bytes, ctl) {
            Ok((gbps, latency_us, verified)) => {
                link.unidirectional_gbps = Some(gbps);
                link.latency_us = Some(latency_us);
                link.verified = Some(verified);
                if !verified {
                    link.note = Some(join_note(
                        link.note.take(),
                        "the copied bytes differ from what was sent",
                    ));
                }
            }
            Err(e @ (ProbeError::Deadline | ProbeError::Interrupted)) => return Err(e),
            Err(e) => link.note = Some(join_note(link.note.take(), &e.to_string())),
        }
        if let Some(r) = results.iter_mut().find(|r| r.device == link.src) {
            t.finish(r);
        }
    }
    // Both directions at once, once per unordered pair; the figure belongs to both GPUs.
    for a in 0..sides.len() {
        for b in a + 1..sides.len() {
            ctl.check()?;
            let (sa, sb) = (&sides[a], &sides[b]);
            let t = SpanTimer::start(format!("gpu{}<->gpu{}", sa.index, sb.index));
            let outcome = both_ways(sa, sb, p, bytes, ctl);
            for link in links.iter_mut().filter(|l| {
                (l.src, l.dst) == (sa.index, sb.index) || (l.src, l.dst) == (sb.index, sa.index)
            }) {
                match &outcome {
                    Ok(gbps) => link.bidirectional_gbps = Some(*gbps),
                    Err(e) => {
                        link.note =
                            Some(join_note(link.note.take(), &format!("bidirectional: {e}")))
                    }
                }
            }
            if let Err(e @ (ProbeError::Deadline | ProbeError::Interrupted)) = outcome {
                return Err(e);
            }
            if let Some(r) = results.iter_mut().find(|r| r.device == sa.index) {
                t.finish(r);
            }
        }
    }
    let driver = sides
        .first()
        .map(|s| s.gpu.info.driver_cuda_version.clone())
        .unwrap_or_default();
    for r in results.iter_mut() {
        let mine: Vec<PeerLink> = links
            .iter()
            .filter(|l| l.src == r.device)
            .cloned()
            .collect();
        fill_result(r, &mine, &driver);
    }
    Ok(())
}

fn join_note(old: Option<String>, new: &str) -> String {
    match old {
        Some(o) => format!("{o}; {new}"),
        None => new.to_owned(),
    }
}

/// src → dst: (GB/s, µs per small copy, verified).
fn one_way(
    s: &Side<'_>,
    d: &Side<'_>,
    p: &P2pParams,
    bytes: usize,
    ctl: &ProbeDeadline,
) -> Result<(f64, f64, bool), ProbeError> {
    d.gpu.bind()?;
    d.recv.memset(0, &d.stream)?;
    d.stream.synchronize()?;
    s.gpu.bind()?;
    let ms = time_ops(&s.stream, p.samples, ctl, || {
        copy_peer(d, s, bytes, &s.stream)
    })?;
    let gbps = median(&rates(&ms, bytes as f64)).unwrap_or(f64::NAN);
    s.stream.synchronize()?;
    let verified = received(d, bytes, s.pattern)?;
    s.gpu.bind()?;
    let (e0, e1) = (Event::new()?, Event::new()?);
    let mut per_copy_us = Vec::new();
    for _ in 0..p.samples.max(3) {
        ctl.check()?;
        e0.record(&s.stream)?;
        for _ in 0..LATENCY_COPIES {
            copy_peer(d, s, LATENCY_BYTES, &s.stream)?;
        }
        e1.record(&s.stream)?;
        per_copy_us.push(e0.elapsed_ms(&e1)? * 1e3 / f64::from(LATENCY_COPIES));
    }
    let latency = median(&per_copy_us).unwrap_or(f64::NAN);
    Ok((gbps, latency, verified))
}

/// a → b and b → a at once, each on its sender's stream; GB/s of both directions summed.
fn both_ways(
    a: &Side<'_>,
    b: &Side<'_>,
    p: &P2pParams,
    bytes: usize,
    ctl: &ProbeDeadline,
) -> Result<f64, ProbeError> {
    b.gpu.bind()?;
    let b_done = Event::new()?;
    a.gpu.bind()?;
    let start = Event::new()?;
    let ms = time_ops(&a.stream, p.samples, ctl, || {
        // b's stream starts when a's does; a's stream waits for b's copy, so each timed op
        // spans both directions. Each stream is driven with its own context current.
        start.record(&a.stream)?;
        copy_peer(b, a, bytes, &a.stream)?;
        b.gpu.bind()?;
        b.stream.wait(&start)?;
        copy_peer(a, b, bytes, &b.stream)?;
        b_done.record(&b.stream)?;
        a.gpu.bind()?;
        a.stream.wait(&b_done)
    })?;
    a.stream.synchronize()?;
    Ok(median(&rates(&ms, 2.0 * bytes as f64)).unwrap_or(f64::NAN))
}

/// Metrics, details and the verdict of one GPU's outgoing links.
fn fill_result(r: &mut ProbeResult, links: &[PeerLink], driver_cuda: &str) {
    for l in links {
        let served_by = format!(
            "cuMemcpyPeerAsync (libcuda, CUDA {driver_cuda}; {})",
            if l.peer_access {
                "peer access on"
            } else {
                "peer access off: staged through host memory"
            }
        );
        if let Some(v) = l.unidirectional_gbps {
            r.metrics.push(Measurement::new(
                &unidirectional_metric(l.dst),
                v,
                "GB/s",
                &served_by,
                vec![v],
            ));
        }
        if let Some(v) = l.bidirectional_gbps {
            r.metrics.push(Measurement::new(
                &bidirectional_metric(l.dst),
                v,
                "GB/s",
                &served_by,
                vec![v],
            ));
        }
        if let Some(v) = l.latency_us {
            r.metrics.push(Measurement::new(
                &latency_metric(l.dst),
                v,
                "us",
                &served_by,
                vec![v],
            ));
        }
    }
    let mean = |f: fn(&PeerLink) -> Option<f64>| {
        let v: Vec<f64> = links.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    for (name, value) in [
        ("unidirectional_mean", mean(|l| l.unidirectional_gbps)),
        ("bidirectional_mean", mean(|l| l.bidirectional_gbps)),
    ] {
        if let Some(v) = value {
            r.metrics.push(Measurement::new(
                name,
                v,
                "GB/s",
                "mean over this GPU's peers",
                vec![v],
            ));
        }
    }
    r.details.insert(
        "links".into(),
        serde_json::to_value(links).unwrap_or(serde_json::Value::Null),
    );
    judge(r, links);
}

/// Wrong bytes or a failed copy: fail. Peer access off: warn (copies work, through the host,
/// at a fraction of the speed).
pub fn judge(r: &mut ProbeResult, links: &[PeerLink]) {
    for l in links {
        if l.verified == Some(false) || l.unidirectional_gbps.is_none() {
            r.downgrade(
                Verdict::Fail,
                format!(
                    "GPU {} -> GPU {} is broken: {}",
                    l.src,
                    l.dst,
                    l.note.as_deref().unwrap_or("the copy did not complete")
                ),
            );
        } else if !l.peer_access {
            r.downgrade(
                Verdict::Warn,
                format!(
                    "GPU {} -> GPU {}: peer access is off, copies are staged through host memory",
                    l.src, l.dst
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(
        src: u32,
        dst: u32,
        uni: Option<f64>,
        access: bool,
        verified: Option<bool>,
    ) -> PeerLink {
        PeerLink {
            src,
            dst,
            connection: Some("NV18".into()),
            peer_access: access,
            unidirectional_gbps: uni,
            bidirectional_gbps: uni.map(|u| 2.0 * u),
            latency_us: uni.map(|_| 2.5),
            verified,
            note: None,
        }
    }

    #[test]
    fn results_carry_pair_metrics_means_and_links() {
        let mut r = ProbeResult::new("p2p", 0);
        let links = [
            link(0, 1, Some(380.0), true, Some(true)),
            link(0, 2, Some(360.0), true, Some(true)),
        ];
        fill_result(&mut r, &links, "13.0");
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(
            r.metric("unidirectional_to_gpu1").map(|m| m.value),
            Some(380.0)
        );
        assert_eq!(
            r.metric("bidirectional_with_gpu2").map(|m| m.value),
            Some(720.0)
        );
        assert_eq!(
            r.metric("latency_to_gpu1").map(|m| m.unit.as_str()),
            Some("us")
        );
        assert_eq!(
            r.metric("unidirectional_mean").map(|m| m.value),
            Some(370.0)
        );
        assert_eq!(links_of(&r), links.to_vec());
        assert!(is_pair_metric("unidirectional_to_gpu1"));
        assert!(!is_pair_metric("unidirectional_mean"));
    }

    #[test]
    fn a_broken_pair_fails_and_peer_access_off_warns() {
        let mut r = ProbeResult::new("p2p", 0);
        fill_result(
            &mut r,
            &[
                link(0, 1, Some(380.0), true, Some(false)),
                link(0, 2, Some(20.0), false, Some(true)),
            ],
            "13.0",
        );
        assert_eq!(r.verdict, Verdict::Fail);
        let note = r.note.unwrap_or_default();
        assert!(note.contains("GPU 0 -> GPU 1 is broken"), "{note}");
        assert!(
            note.contains("GPU 0 -> GPU 2: peer access is off"),
            "{note}"
        );
        let mut r = ProbeResult::new("p2p", 0);
        fill_result(&mut r, &[link(0, 1, None, true, None)], "13.0");
        assert_eq!(r.verdict, Verdict::Fail);
    }

    #[test]
    fn one_gpu_has_nothing_to_measure() {
        let r = skipped(&[3], "one GPU: no GPU pair to measure, nothing to compare");
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].device, r[0].verdict), (3, Verdict::Skipped));
    }
}
