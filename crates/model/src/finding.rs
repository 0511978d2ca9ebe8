//! Findings: what a rule or a probe concluded, with the evidence and what to do.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sample::TimeMs;

/// How bad a finding is. Ordered: `Info < Warn < Fail`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
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

// The overall state of a check report (or a fleet, a node): the worst finding that counts, or
// why there is no judgement. Here rather than in core so readers of reports (the fleet view)
// need only the model; no doc comment, which would change the published schemas.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// No findings above `info`, and every checked GPU gave readings to judge.
    Healthy,
    Warn,
    Fail,
    /// No finding, and a checked GPU gave no reading at all: gpudiag was blind to it.
    NotJudged,
    /// The check could not run (no driver, no GPU); the report says why.
    CouldNotRun,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Healthy => "healthy",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::NotJudged => "not_judged",
            Status::CouldNotRun => "could_not_run",
        })
    }
}

/// The numbers behind a finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Evidence {
    /// What was measured, e.g. `{"ecc_uncorrected_volatile": 2}`.
    pub values: serde_json::Map<String, serde_json::Value>,
    /// The window the values cover, in seconds (0 for a single read or an event).
    #[schemars(range(min = 0))]
    pub window_s: f64,
    /// The threshold the rule compared against, in words ("> 0").
    pub threshold: String,
}

/// Whether a finding still held when it was last judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FindingState {
    /// It held at the last evaluation (events and environment facts stay active: an XID does
    /// not heal by being in the past).
    #[default]
    Active,
    /// It held earlier in the window, not at its end.
    Cleared,
}

/// One diagnosis: what is wrong, the evidence, and what to do.
///
/// Its time span is `time_ms` (the onset: the first evaluation or event that raised it, the
/// meaning it always had) to `last_seen_ms`; there is no separate first-seen field because it
/// would always equal `time_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    deny_unknown_fields,
    transform = crate::schema::added_later("state")
)]
pub struct Finding {
    /// Stable identifier, e.g. `errors.ecc_uncorrectable`.
    #[schemars(regex(pattern = r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$"))]
    pub id: String,
    pub severity: Severity,
    /// Device index; `None` for host-wide findings.
    pub device: Option<u32>,
    /// When it was first raised.
    pub time_ms: TimeMs,
    /// The last evaluation (or event) at which it held. Absent for a finding of one moment that
    /// nothing re-judged (a probe result) and in files written before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<TimeMs>,
    /// `cleared` when it no longer held at the end of what was judged; files written before the
    /// field existed read as `active`.
    #[serde(default)]
    pub state: FindingState,
    /// One line.
    #[schemars(length(min = 1))]
    pub title: String,
    pub evidence: Evidence,
    /// What to do.
    #[schemars(length(min = 1))]
    pub advice: String,
    /// Carried by a recording (raised live when it was made) rather than raised by today's rules
    /// over its samples; views show it as such.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recorded: bool,
}

impl Finding {
    /// A finding raised at `time_ms`: active, not yet re-judged (the engine stamps
    /// `last_seen_ms` when it holds again), raised by today's rules rather than carried by a
    /// recording.
    pub fn new(
        id: String,
        severity: Severity,
        device: Option<u32>,
        time_ms: TimeMs,
        title: String,
        evidence: Evidence,
        advice: String,
    ) -> Self {
        Finding {
            id,
            severity,
            device,
            time_ms,
            last_seen_ms: None,
            state: FindingState::Active,
            title,
            evidence,
            advice,
            recorded: false,
        }
    }

    /// " (recorded)" for a finding a recording carried, so text views can tell it apart from
    /// one today's rules raised; empty otherwise.
    pub fn recorded_tag(&self) -> &'static str {
        if self.recorded { " (recorded)" } else { "" }
    }

    /// When it last held: `last_seen_ms`, or the onset where only that is known.
    pub fn last_seen(&self) -> TimeMs {
        self.last_seen_ms.unwrap_or(self.time_ms).max(self.time_ms)
    }

    pub fn is_cleared(&self) -> bool {
        self.state == FindingState::Cleared
    }
}

/// Builds an evidence map from name/value pairs.
pub fn values<const N: usize>(
    pairs: [(&str, serde_json::Value); N],
) -> serde_json::Map<String, serde_json::Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
