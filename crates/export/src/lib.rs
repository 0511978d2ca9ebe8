//! gpudiag's writers: the Chrome trace and its merge into a PyTorch profiler trace, the
//! Prometheus text exposition, and the bug-report bundle. They turn what the pipeline produced
//! (ticks, findings, verdicts, a check report) into files and text, and need no terminal: no
//! command line, no terminal UI, no HTTP server. The binary drives the pipeline, builds the
//! options here from its flags and hands the results to these writers.

mod atomic;
pub mod bundle_writer;
pub mod chrome_trace;
mod output;
pub mod profiler_merge;
pub mod prometheus;

pub use atomic::{refuse_existing, write_atomic, write_json_atomic};
pub use output::{TraceOptions, write_trace};
