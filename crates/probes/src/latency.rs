//! Launch latency: an empty kernel launched many times back to back (host submit cost and
//! device time per kernel), launch-to-completion round trips, and the same through a CUDA graph
//! (the "many small kernels" bottleneck, measured).

use std::time::Instant;

use cudarc::driver::result;
use cudarc::driver::sys;

use super::gpu::{Event, Gpu, launch};
use super::suite::LatencyParams;
use super::{Measurement, ProbeDeadline, ProbeError, ProbeResult, SpanTimer, median};

fn us(ms: f64) -> f64 {
    ms * 1e3
}

pub fn run(
    gpu: &Gpu,
    p: &LatencyParams,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    r.param("launches", p.launches);
    r.param("round_trips", p.round_trips);
    r.param("graph_kernels", p.graph_kernels);
    let m = gpu.module("latency")?;
    let f = m.function("empty_kernel")?;
    let s = &gpu.stream;
    let by = m.served_by.clone();
    let one = |_: ()| launch(f, (1, 1, 1), (1, 1, 1), 0, s, &[]);
    // Warm-up: module load and first-launch costs stay out of the numbers.
    for _ in 0..100 {
        one(())?;
    }
    s.synchronize()?;

    let t = SpanTimer::start("launch back-to-back");
    let (e0, e1) = (Event::new()?, Event::new()?);
    let n = p.launches.max(1);
    e0.record(s)?;
    let host = Instant::now();
    for _ in 0..n {
        one(())?;
    }
    let submit_ms = host.elapsed().as_secs_f64() * 1e3;
    e1.record(s)?;
    let dev_ms = e0.elapsed_ms(&e1)?;
    t.finish(r);
    r.metrics.push(Measurement::new(
        "launch_submit",
        us(submit_ms) / f64::from(n),
        "us",
        &by,
        vec![],
    ));
    r.metrics.push(Measurement::new(
        "launch_throughput",
        us(dev_ms) / f64::from(n),
        "us",
        &by,
        vec![],
    ));
    ctl.check()?;

    let t = SpanTimer::start("round trips");
    let mut rt = Vec::with_capacity(p.round_trips as usize);
    for i in 0..p.round_trips.max(1) {
        let start = Instant::now();
        one(())?;
        s.synchronize()?;
        rt.push(start.elapsed().as_secs_f64() * 1e6);
        if i % 256 == 0 {
            ctl.check()?;
        }
    }
    t.finish(r);
    let v = median(&rt).unwrap_or(f64::NAN);
    r.metrics
        .push(Measurement::new("round_trip", v, "us", &by, vec![]));

    // A graph of `graph_kernels` empty kernels, captured once and replayed.
    let t = SpanTimer::start("graph");
    let k = p.graph_kernels.max(1);
    let exec_many = Graph::capture(s.raw, || {
        for _ in 0..k {
            one(())?;
        }
        Ok(())
    })?;
    let exec_one = Graph::capture(s.raw, || one(()))?;
    exec_many.launch(s.raw)?;
    s.synchronize()?;
    let mut per_kernel = Vec::new();
    for _ in 0..5 {
        e0.record(s)?;
        exec_many.launch(s.raw)?;
        e1.record(s)?;
        per_kernel.push(us(e0.elapsed_ms(&e1)?) / f64::from(k));
    }
    let mut graph_rt = Vec::new();
    for _ in 0..p.round_trips.clamp(1, 1000) {
        let start = Instant::now();
        exec_one.launch(s.raw)?;
        s.synchronize()?;
        graph_rt.push(start.elapsed().as_secs_f64() * 1e6);
    }
    t.finish(r);
    let by_graph = format!("{by} in a CUDA graph");
    r.metrics.push(Measurement::new(
        "graph_per_kernel",
        median(&per_kernel).unwrap_or(f64::NAN),
        "us",
        &by_graph,
        per_kernel,
    ));
    r.metrics.push(Measurement::new(
        "graph_round_trip",
        median(&graph_rt).unwrap_or(f64::NAN),
        "us",
        &by_graph,
        vec![],
    ));
    Ok(())
}

/// An instantiated graph captured from a stream; destroyed on drop.
struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    fn capture(
        stream: sys::CUstream,
        body: impl FnOnce() -> Result<(), ProbeError>,
    ) -> Result<Graph, ProbeError> {
        fn err(w: &'static str) -> impl Fn(cudarc::driver::DriverError) -> ProbeError {
            move |e| ProbeError::Cuda(format!("{w}: {e}"))
        }
        // SAFETY: our stream, captured in thread-local mode and ended below on every path.
        unsafe {
            result::stream::begin_capture(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(err("cuStreamBeginCapture"))?;
        let body_result = body();
        // SAFETY: ends the capture begun above.
        let graph =
            unsafe { result::stream::end_capture(stream) }.map_err(err("cuStreamEndCapture"))?;
        if let Err(e) = body_result {
            // SAFETY: the graph was just created and is not used again.
            let _ = unsafe { result::graph::destroy(graph) };
            return Err(e);
        }
        // SAFETY: a valid graph; the exec is destroyed in Drop.
        let exec =
            match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                Ok(x) => x,
                Err(e) => {
                    // SAFETY: as above.
                    let _ = unsafe { result::graph::destroy(graph) };
                    return Err(err("cuGraphInstantiate")(e));
                }
            };
        Ok(Graph { graph, exec })
    }

    fn launch(&self, stream: sys::CUstream) -> Result<(), ProbeError> {
        // SAFETY: a live exec on our stream.
        unsafe { result::graph::launch(self.exec, stream) }
            .map_err(|e| ProbeError::Cuda(format!("cuGraphLaunch: {e}")))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by capture(), destroyed once.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}
