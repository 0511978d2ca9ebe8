//! What the file targets share: a user's file goes through the same calls as
//! `gpudiag check --replay FILE`, `trace --replay FILE` and `serve --replay FILE`, and must end
//! in a report or a usage error (exit code 2), never a panic.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use gpudiag::cli::{BackendChoice, CheckArgs, FailOn, SourceArgs};
use gpudiag_core::config::Config;
use gpudiag_model::error::exit;

/// One file per fuzzing process, rewritten for every input: the commands take a path.
pub fn scratch(data: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gpudiag-fuzz-{}.input", std::process::id()));
    let mut f = std::fs::File::create(&path).expect("scratch file");
    f.write_all(data).expect("scratch write");
    path
}

/// `data` gzip-compressed, so the fuzzer mutates what is inside a `.gz` rather than its
/// checksummed stream.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).expect("gzip in memory");
    enc.finish().expect("gzip in memory")
}

pub fn source(path: PathBuf) -> SourceArgs {
    SourceArgs {
        devices: Vec::new(),
        replay: Some(path),
        demo: false,
        init_timeout: Duration::from_secs(10),
        poll_timeout: Duration::from_secs(2),
        backend: BackendChoice::Replay,
        sysfs_root: None,
        max_inflated_size: gpudiag_telemetry::bundle_reader::DEFAULT_MAX_INFLATED,
        kubelet: gpudiag::cli::KubeletArgs::default(),
    }
}

/// `check --replay`, `check --replay --window` and `trace --replay` over `data`.
pub fn replay_everything(data: &[u8], config: &Config) {
    let path = scratch(data);
    for window in [None, Some(Duration::from_secs(2))] {
        let args = CheckArgs {
            source: source(path.clone()),
            json: true,
            window,
            interval: Duration::from_millis(100),
            fail_on: FailOn::Fail,
            probes: None,
            force: false,
        };
        let report = args
            .request()
            .and_then(|request| {
                gpudiag::commands::check::check_request(&request, &gpudiag::stop::Stop::new(), config)
            });
        match report {
            Ok(report) => {
                let _ = gpudiag::check_text::render(&report);
                serde_json::to_string(&report).expect("a report serialises");
            }
            Err(e) => {
                assert_eq!(
                    e.exit_code(),
                    exit::USAGE,
                    "a bad file is a usage error: {e}"
                );
                // Only the first pass can fail on the file; the second would say the same.
                return;
            }
        }
    }
    let spec = source(path).spec().expect("a replay spec");
    let source = gpudiag_core::session::open_source(
        &spec,
        gpudiag_telemetry::replay::Pace::AsFastAsPossible,
        false,
    )
    .expect("opened once already");
    let stop = AtomicBool::new(false);
    match gpudiag::commands::trace::capture_trace(
        source,
        Duration::from_millis(100),
        None,
        Some(&stop),
        config,
    ) {
        Ok(c) => {
            serde_json::to_string(&c.trace).expect("a trace serialises");
        }
        Err(e) => assert_eq!(e.exit_code(), exit::USAGE, "{e}"),
    }
}
