//! Parsing of the units a user writes, shared by the command line and the test fault schedule.

use std::time::Duration;

/// A duration as a user writes it (`250ms`, `10s`, `2m`, or a bare `0`), with an error that
/// says how to write one.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("'{s}' is not a duration ({e}); write it like 250ms, 10s or 2m"))
}
