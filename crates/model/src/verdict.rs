//! The bottleneck verdict: what held a GPU (or one process on it) back over a window, with the
//! evidence it rests on, how sure it is, and what to do. Judged by `gpudiag_core::rules::bottleneck`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sample::TimeMs;

/// What bounds the work on a GPU. Stable names: they are JSON values and Prometheus labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    /// The SMs are busy doing arithmetic: the good case.
    ComputeBound,
    /// The SMs are busy waiting on DRAM.
    MemoryBound,
    /// Kernels run most of the time but leave most SMs empty (small grids, one stream).
    Underfilled,
    /// Tiny kernels back to back: launching them costs more than running them.
    LaunchBound,
    /// The GPU waits on the host: input pipeline, Python, sleep.
    HostBound,
    /// Host-device copies dominate.
    CopyBound,
    /// A synchronisation each step (`.item()`, `.cpu()`, `synchronize`) leaves the GPU waiting.
    SyncBound,
    /// A process holds GPU memory and runs nothing.
    IdleHoldingMemory,
    /// Clocks held down by heat or the power supply while work runs.
    Throttled,
    /// Nothing runs and nothing is held.
    Idle,
    /// One GPU of a job that waits for another (the job's straggler) much of the time, spinning
    /// in a collective: its own counters read busy, but the job runs at its peer's pace.
    WaitingForPeer,
}

impl Bottleneck {
    pub const ALL: [Bottleneck; 11] = [
        Bottleneck::ComputeBound,
        Bottleneck::MemoryBound,
        Bottleneck::Underfilled,
        Bottleneck::LaunchBound,
        Bottleneck::HostBound,
        Bottleneck::CopyBound,
        Bottleneck::SyncBound,
        Bottleneck::IdleHoldingMemory,
        Bottleneck::Throttled,
        Bottleneck::Idle,
        Bottleneck::WaitingForPeer,
    ];

    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Bottleneck::ComputeBound => "compute_bound",
            Bottleneck::MemoryBound => "memory_bound",
            Bottleneck::Underfilled => "underfilled",
            Bottleneck::LaunchBound => "launch_bound",
            Bottleneck::HostBound => "host_bound",
            Bottleneck::CopyBound => "copy_bound",
            Bottleneck::SyncBound => "sync_bound",
            Bottleneck::IdleHoldingMemory => "idle_holding_memory",
            Bottleneck::Throttled => "throttled",
            Bottleneck::Idle => "idle",
            Bottleneck::WaitingForPeer => "waiting_for_peer",
        }
    }

    /// Whether the GPU's time is being wasted by the work on it (the verdicts a user should act
    /// on); compute- and memory-bound work uses the GPU, and an idle GPU wastes nobody's.
    pub fn is_waste(self) -> bool {
        !matches!(
            self,
            Bottleneck::ComputeBound | Bottleneck::MemoryBound | Bottleneck::Idle
        )
    }
}

impl std::fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    Low,
    Medium,
    High,
}

impl std::fmt::Display for Confidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        })
    }
}

/// What the verdict was judged from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// SM activity, occupancy, pipe and DRAM counters (NVML GPM, DCGM's profiling fields).
    ProfilingCounters,
    /// NVML utilisation, PCIe and power only: "a kernel ran" cannot tell full SMs from one warp,
    /// so the verdict is weaker.
    Utilisation,
    /// The kernels, copies and synchronisations `run --kernels` recorded: which kernel, copy or
    /// call took the time, measured, so the verdict is the firmest.
    Kernels,
}

impl Basis {
    /// The JSON name, also a Prometheus label value.
    pub fn name(self) -> &'static str {
        match self {
            Basis::ProfilingCounters => "profiling_counters",
            Basis::Utilisation => "utilisation",
            Basis::Kernels => "kernels",
        }
    }
}

/// A process the verdict is about or names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct VerdictProcess {
    pub pid: u32,
    /// Command name (redactable).
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
    /// Its share of SM time as NVML reports it, latest reading.
    #[schemars(range(min = 0, max = 100))]
    pub sm_util_pct: Option<f64>,
    /// Its CPU use over the window, in % of one core (100 = one core busy), from /proc.
    #[schemars(range(min = 0))]
    pub cpu_pct: Option<f64>,
}

/// A verdict on one GPU over one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Verdict {
    pub device: u32,
    pub bottleneck: Bottleneck,
    pub confidence: Confidence,
    pub basis: Basis,
    /// The window judged, ms since the Unix epoch, both ends inclusive.
    pub start_ms: TimeMs,
    pub end_ms: TimeMs,
    /// One line, naming the window and the numbers that decided.
    pub title: String,
    /// The counters and host facts used (window means unless the key says otherwise).
    pub evidence: serde_json::Map<String, serde_json::Value>,
    /// What to do, in order of likely payoff.
    pub advice: String,
    /// The process the verdict is about, when the evidence is per process (it is the only one
    /// holding the GPU); `None` when the verdict is the GPU's and `processes` names who shares it.
    pub pid: Option<u32>,
    /// Processes holding GPU memory in the window.
    pub processes: Vec<VerdictProcess>,
}

impl Verdict {
    /// The window's length in seconds.
    pub fn window_s(&self) -> f64 {
        self.end_ms.saturating_sub(self.start_ms) as f64 / 1000.0
    }
}

/// A rule that could not judge a device in the window, and why: silence is not health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NotJudged {
    /// `verdict`, a finding id such as `memory.possible_leak`, or a family such as `throttle`
    /// when all of its findings lack the same data.
    pub rule: String,
    pub device: Option<u32>,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names Prometheus labels use are the JSON ones, so a dashboard and a check report
    /// agree.
    #[test]
    fn names_are_the_json_values() {
        let json = |v: serde_json::Value| v.as_str().map(str::to_owned);
        for b in Bottleneck::ALL {
            assert_eq!(json(serde_json::json!(b)).as_deref(), Some(b.name()));
        }
        for b in [Basis::ProfilingCounters, Basis::Utilisation, Basis::Kernels] {
            assert_eq!(json(serde_json::json!(b)).as_deref(), Some(b.name()));
        }
        for c in [Confidence::Low, Confidence::Medium, Confidence::High] {
            assert_eq!(json(serde_json::json!(c)), Some(c.to_string()));
        }
    }
}
