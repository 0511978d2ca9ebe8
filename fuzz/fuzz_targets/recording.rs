//! Recordings, plain and gzip: the first byte picks which (odd: the rest is gzip-compressed
//! first), so both readers see structured NDJSON.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode & 1 == 1 {
        common::gzip(rest)
    } else {
        rest.to_vec()
    };
    common::replay_everything(&file, &gpudiag_core::config::Config::default());
});
