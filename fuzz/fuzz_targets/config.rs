//! Config files: parse, and a config that parses must print (`gpudiag config`) as TOML that
//! parses back to itself, and must drive the rules over a recording without a panic.
//!
//! Each input is read twice: as the TOML text itself, and as (key, value) pairs set on the
//! default config, 9 bytes each (a key picked by the first, an f64 or integer from the other
//! eight), so every key meets NaN, infinities and extremes quickly rather than only when the
//! mutator happens to spell them in valid TOML.
#![no_main]

use libfuzzer_sys::fuzz_target;

use gpudiag_core::config::Config;

mod common;

/// A small recording with a process, throttling and PCIe traffic, so most rules evaluate.
const RECORDING: &[u8] = include_bytes!("../../tests/fixtures/recordings/all_kinds.ndjson");

fn check(text: &str) {
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
}

/// The default config with the keys and values `data` picks, as TOML text.
fn structured(data: &[u8]) -> Option<String> {
    let mut doc = toml::Table::try_from(Config::default()).ok()?;
    let mut keys: Vec<(String, String)> = Vec::new();
    for (section, table) in doc.get("rules")?.as_table()? {
        for key in table.as_table()?.keys() {
            keys.push((section.clone(), key.clone()));
        }
    }
    let rules = doc.get_mut("rules")?.as_table_mut()?;
    for pair in data.chunks_exact(9) {
        let (section, key) = &keys[usize::from(pair[0]) % keys.len()];
        let bits: [u8; 8] = pair[1..].try_into().ok()?;
        let slot = rules.get_mut(section)?.as_table_mut()?.get_mut(key)?;
        *slot = match slot {
            toml::Value::Integer(_) => toml::Value::Integer(i64::from_le_bytes(bits)),
            _ => toml::Value::Float(f64::from_le_bytes(bits)),
        };
    }
    toml::to_string(&doc).ok()
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
    if let Some(text) = structured(data) {
        // fuzz/keep.sh reads this to keep a crash of the structured reading as a TOML file.
        if std::env::var_os("GPUDIAG_FUZZ_SHOW_CONFIG").is_some() {
            eprintln!("--- structured config ---\n{text}--- end ---");
        }
        check(&text);
    }
});
