//! Config files: parse, and a config that parses must print (`gpudiag config`) as TOML that
//! parses back to itself, and must drive the rules over a recording without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

use gpudiag::config::Config;

mod common;

/// A small recording with a process, throttling and PCIe traffic, so most rules evaluate.
const RECORDING: &[u8] = include_bytes!("../../tests/fixtures/recordings/all_kinds.ndjson");

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::parse(text, "fuzz.toml") else {
        return;
    };
    let printed = toml::to_string_pretty(&config).expect("a config prints");
    let again = Config::parse(&printed, "printed")
        .unwrap_or_else(|e| panic!("printed config does not parse: {e}\n{printed}"));
    assert_eq!(
        again, config,
        "printed config parses to something else:\n{printed}"
    );
    common::replay_everything(RECORDING, &config);
});
