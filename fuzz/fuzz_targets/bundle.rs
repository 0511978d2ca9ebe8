//! Bug-report bundles (`check --replay x.tar.gz`): the input is the tar archive, gzip-compressed
//! here, so the fuzzer mutates tar headers and members rather than a checksummed stream.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    common::replay_everything(&common::gzip(data), &gpudiag_core::config::Config::default());
});
