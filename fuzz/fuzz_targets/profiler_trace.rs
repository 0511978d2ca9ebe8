//! PyTorch profiler traces handed to `gpudiag trace --merge`: every input ends in a merged trace
//! that parses as JSON with its `traceEvents`, or in a usage error (exit code 2); never a panic.
//! gpudiag's side is a real H200 recording's trace, made once. The first byte picks plain (even)
//! or gzip (odd) for the rest.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;

use gpudiag_core::config::Config;
use gpudiag_model::error::exit;
use gpudiag_export::chrome_trace::Trace;

mod common;

fn ours() -> &'static Trace {
    static TRACE: OnceLock<Trace> = OnceLock::new();
    TRACE.get_or_init(|| {
        let recording = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/profiler/h200_torch2.11/recording.ndjson.gz");
        let spec = common::source(recording).spec().expect("a replay spec");
        let source = gpudiag_core::session::open_source(
            &spec,
            gpudiag_telemetry::replay::Pace::AsFastAsPossible,
            false,
        )
        .expect("the fixture recording opens");
        let stop = AtomicBool::new(false);
        gpudiag::commands::trace::capture_trace(
            source,
            Duration::from_millis(100),
            None,
            Some(&stop),
            &Config::default(),
        )
        .expect("the fixture recording traces")
        .trace
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let input = if first % 2 == 1 {
        common::gzip(rest)
    } else {
        rest.to_vec()
    };
    let path = common::scratch(&input);
    let mut out = Vec::new();
    match gpudiag_export::profiler_merge::merge_into(&path, ours(), &mut out) {
        Ok(_) => {
            let merged: serde_json::Value =
                serde_json::from_slice(&out).expect("a merged trace is JSON");
            assert!(merged["traceEvents"].is_array(), "{merged}");
        }
        Err(e) => assert_eq!(e.exit_code(), exit::USAGE, "{e}"),
    }
});
