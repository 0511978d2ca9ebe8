//! Writing a Chrome trace, plain or merged into a profiler trace.

use std::path::PathBuf;

use gpudiag_model::error::Error;

use crate::atomic::{refuse_existing, write_json_atomic};
use crate::chrome_trace::Trace;
use crate::profiler_merge::{self, MergeSummary};

/// Where and how a Chrome trace is written (`gpudiag trace`'s `--output`, `--force` and
/// `--merge`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceOptions {
    pub output: PathBuf,
    /// Replace `output` if it exists.
    pub force: bool,
    /// A PyTorch profiler trace to add our tracks to; the merged trace is what is written.
    pub merge: Option<PathBuf>,
}

impl TraceOptions {
    /// A usage error when the output exists and may not be replaced; callers ask before they
    /// sample, so a capture is not lost to a refusal at its end.
    pub fn refuse_existing(&self) -> Result<(), Error> {
        refuse_existing(&self.output, self.force)
    }
}

/// Writes `trace` to `opts.output` (atomically), or with `opts.merge` the profiler trace with
/// our tracks added; returns what was merged.
pub fn write_trace(trace: &Trace, opts: &TraceOptions) -> Result<Option<MergeSummary>, Error> {
    match &opts.merge {
        Some(profiler) => Ok(Some(profiler_merge::merge(profiler, trace, &opts.output)?)),
        None => {
            write_json_atomic(&opts.output, trace)?;
            Ok(None)
        }
    }
}
