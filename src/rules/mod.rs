//! Rules: pure functions over the history and device info that produce findings.

use serde::{Deserialize, Serialize};

use crate::telemetry::TimeMs;

/// How bad a finding is. Ordered: `Info < Warn < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warn,
    Fail,
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Fail => "fail",
        })
    }
}

/// The numbers behind a finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// What was measured, e.g. `{"ecc_uncorrected_volatile": 2}`.
    pub values: serde_json::Map<String, serde_json::Value>,
    /// The window the values cover, in seconds (0 for a single read or an event).
    pub window_s: f64,
    /// The threshold the rule compared against, in words ("> 0").
    pub threshold: String,
}

/// One diagnosis: what is wrong, the evidence, and what to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable identifier, e.g. `errors.ecc_uncorrectable`.
    pub id: String,
    pub severity: Severity,
    /// Device index; `None` for host-wide findings.
    pub device: Option<u32>,
    pub time_ms: TimeMs,
    pub title: String,
    pub evidence: Evidence,
    pub advice: String,
}

pub mod errors;
pub mod vendor;

use std::collections::BTreeMap;

use crate::history::History;
use crate::telemetry::{DeviceInfo, Event, Sample};

/// Everything a rule may look at. Rules are pure: the same input gives the same findings.
pub struct RuleInput<'a> {
    pub devices: &'a [DeviceInfo],
    pub history: &'a History,
    /// The newest sample per device (for flags and counters that are not series).
    pub latest: &'a BTreeMap<u32, Sample>,
    /// Events seen in the window (XIDs, lost devices).
    pub events: &'a [Event],
    /// The time findings are stamped with.
    pub now_ms: TimeMs,
}

/// Runs every rule family. Findings come back worst first, then by device.
pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut findings = errors::evaluate(input);
    findings.extend(vendor::evaluate(input));
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.device.cmp(&b.device)));
    findings
}

/// Builds an evidence map from name/value pairs.
pub(crate) fn values<const N: usize>(
    pairs: [(&str, serde_json::Value); N],
) -> serde_json::Map<String, serde_json::Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
