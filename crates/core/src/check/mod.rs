//! The check report: the versioned JSON document `gpudiag check --json` prints, and the overall
//! status a scheduler acts on. Its JSON Schema is `assets/schema/check-report.schema.json`.

mod run;

pub use run::{CheckRequest, CheckWindow, NoProbes, ProbeAsk, ProbeRunner, run};

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::history::{History, Window, WindowStats};
use crate::rules::families::is_workload;
use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::error::exit;
use gpudiag_model::finding::Status;
use gpudiag_model::finding::{Finding, Severity};
use gpudiag_model::sample::{DeviceInfo, HostInfo, Metric, Sample, TimeMs};

/// Bumped on any change that removes or retypes a field; adding a field keeps it. Version 2:
/// `status` gains `not_judged` and `could_not_run`, `exit_code` gains 3, and `could_not_run`
/// says why when the check could not run (the document is printed then too).
pub const CHECK_SCHEMA_VERSION: u32 = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    deny_unknown_fields,
    transform = gpudiag_model::schema::added_later("topology"),
    transform = gpudiag_model::schema::added_later("not_judged"),
    transform = gpudiag_model::schema::added_later("could_not_run"),
    transform = gpudiag_model::schema::added_later("jobs"),
    transform = gpudiag_model::schema::added_later("job_phases")
)]
pub struct CheckReport {
    #[schemars(extend("const" = CHECK_SCHEMA_VERSION))]
    pub schema_version: u32,
    pub tool: ToolInfo,
    /// When the report was made, ms since the Unix epoch.
    pub generated_ms: TimeMs,
    pub host: HostInfo,
    pub source: SourceInfo,
    /// CUDA libraries found on this host; `None` when checking a recording (this host's
    /// libraries say nothing about the recorded one).
    pub libraries: Option<Vec<LibraryInfo>>,
    pub window: WindowInfo,
    pub devices: Vec<DeviceReport>,
    /// How the checked GPUs connect (PCIe paths, NVLinks, NUMA); `None` when the source cannot
    /// tell (a recording made before topology was recorded, a non-NVIDIA backend).
    #[serde(default)]
    pub topology: Option<gpudiag_model::topology::Topology>,
    /// Probes over several GPUs at once (the NCCL all-reduce) when `check --probes` ran them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<gpudiag_probes::ProbeResult>")]
    pub host_probes: Option<Vec<gpudiag_probes::ProbeResult>>,
    /// Findings that belong to no single device.
    pub host_findings: Vec<Finding>,
    /// The verdict on each job of two or more GPUs, from comparing its GPUs over the window:
    /// a straggler named, communication-bound, imbalanced or balanced.
    #[serde(default)]
    pub jobs: Vec<gpudiag_model::job::JobVerdict>,
    /// How each job's verdict changed over the window.
    #[serde(default)]
    pub job_phases: Vec<JobPhases>,
    /// What `run --kernels` recorded of the command's kernels, copies and syncs, when the
    /// checked recording carries it (`run --kernels --record`): the latest summary up to the
    /// window's end, `ended` when it is the run's own, written as the command ended. It covers
    /// the run, not the check's window. Judging a whole recording whose summary `ended`, the
    /// GPUs' verdicts and the jobs' rest on it as `run`'s did. Left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<gpudiag_model::kernels::RecordedKernels>,
    /// Rules that could not judge in the window, with the reason: silence is not health.
    #[serde(default)]
    pub not_judged: Vec<gpudiag_model::verdict::NotJudged>,
    /// The worst severity among the findings (info counts as healthy); `not_judged` when no
    /// finding counts and a checked GPU gave no reading at all (nothing about it could be
    /// judged); `could_not_run` when the check could not run (see `could_not_run`).
    pub status: Status,
    /// Why the check could not run (no driver, no GPU, a hung initialisation); present only
    /// with status `could_not_run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub could_not_run: Option<String>,
    /// The `--device` selectors that matched no GPU of the source, when that is why the check
    /// could not run: a GPU the driver no longer enumerates (fallen off the bus), or a name
    /// that is no GPU's here. Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices_not_found: Vec<String>,
    /// The severity at which `status` turns into exit code 1.
    pub fail_on: Severity,
    /// 1 when a finding is at or above `fail_on`; 3 when nothing could be judged or the check
    /// could not run; else 0. Usage errors (exit 2) print no report.
    #[schemars(extend("enum" = [exit::OK, exit::FINDINGS, exit::CANNOT_RUN]))]
    pub exit_code: i32,
}

impl CheckReport {
    /// The report of a check that could not run: no devices, no window, and why. Printed so a
    /// script reading `--json` always gets a document to act on.
    pub fn could_not_run(why: String, backend: &str, fail_on: Severity) -> Self {
        CheckReport {
            schema_version: CHECK_SCHEMA_VERSION,
            tool: ToolInfo::this(),
            generated_ms: gpudiag_model::sample::now_ms(),
            host: HostInfo::default(),
            source: SourceInfo {
                backend: backend.to_owned(),
                recording: None,
                warnings: Vec::new(),
            },
            libraries: None,
            window: WindowInfo {
                requested_s: None,
                covered_s: 0.0,
                ticks: 0,
                start_ms: None,
                end_ms: None,
            },
            devices: Vec::new(),
            topology: None,
            host_probes: None,
            host_findings: Vec::new(),
            jobs: Vec::new(),
            job_phases: Vec::new(),
            kernels: None,
            not_judged: Vec::new(),
            status: Status::CouldNotRun,
            could_not_run: Some(why),
            devices_not_found: Vec::new(),
            fail_on,
            exit_code: exit::CANNOT_RUN,
        }
    }

    /// `not_judged` in place of `healthy` when a checked GPU gave no reading in the window: a
    /// prolog must tell "fine" from "blind". Findings that count keep their status, since they
    /// were judged from what was read.
    pub fn mark_blind_devices(&mut self) {
        let blind: Vec<u32> = self
            .devices
            .iter()
            .filter(|d| d.summary.is_empty() && d.verdict.is_none())
            .map(|d| d.info.index)
            .collect();
        for &device in &blind {
            self.not_judged.push(gpudiag_model::verdict::NotJudged {
                rule: "all".into(),
                device: Some(device),
                reason: "no value of any metric was read in the window: nothing about this \
                         GPU could be judged"
                    .into(),
            });
        }
        if (!blind.is_empty() || self.devices.is_empty()) && self.status == Status::Healthy {
            self.status = Status::NotJudged;
            if self.exit_code == exit::OK {
                self.exit_code = exit::CANNOT_RUN;
            }
        }
    }
}

pub use gpudiag_model::build_info::ToolInfo;

/// How one job's verdict changed over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct JobPhases {
    pub job: gpudiag_model::job::JobId,
    pub phases: Vec<gpudiag_model::job::JobVerdict>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SourceInfo {
    /// "nvml" or "replay".
    #[schemars(length(min = 1))]
    pub backend: String,
    /// The recording checked, for replays (redactable).
    pub recording: Option<String>,
    /// Notes about the source: for replays, a last line cut off by a crash (skipped), record
    /// kinds this version does not know (skipped).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct WindowInfo {
    /// The window asked for, in seconds; `None` means the whole recording.
    #[schemars(range(min = 0))]
    pub requested_s: Option<f64>,
    /// From the first to the last sample, in seconds.
    #[schemars(range(min = 0))]
    pub covered_s: f64,
    pub ticks: u64,
    pub start_ms: Option<TimeMs>,
    pub end_ms: Option<TimeMs>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DeviceReport {
    pub info: DeviceInfo,
    /// The last sample of the window, with the reasons for absent values.
    pub latest: Option<Sample>,
    /// Window statistics per metric; metrics the device never reported are left out.
    pub summary: BTreeMap<Metric, WindowStats>,
    pub findings: Vec<Finding>,
    /// What held the GPU back over the window; `None` when it could not be judged (the reason
    /// is in the report's `not_judged`).
    #[serde(default)]
    pub verdict: Option<gpudiag_model::verdict::Verdict>,
    /// How the verdict changed over the window (slices of at least 10 s, neighbours with the
    /// same verdict merged); empty when the window was too short.
    #[serde(default)]
    pub phases: Vec<gpudiag_model::verdict::Verdict>,
    /// Probe results when `check --probes` ran them; left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "gpudiag_probes::runner::DeviceProbes")]
    pub probes: Option<gpudiag_probes::runner::DeviceProbes>,
}

/// Whether a finding weighs on the status and the exit code. A fault that happened at any time
/// in the window counts even when it has cleared (an ECC error or a thermal slowdown at minute 2
/// of 10 is still a reason to look at the GPU); a workload finding that cleared described a
/// moment, not the window, and the window's own judgement is the one that counts.
pub fn counts(f: &Finding) -> bool {
    !f.is_cleared() || !is_workload(f)
}

/// The worst severity among the `findings` that count, as a status.
pub fn status_of<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Status {
    match findings
        .into_iter()
        .filter(|f| counts(f))
        .map(|f| f.severity)
        .max()
    {
        Some(Severity::Fail) => Status::Fail,
        Some(Severity::Warn) => Status::Warn,
        Some(Severity::Info) | None => Status::Healthy,
    }
}

/// Exit code 1 when any finding that counts is at or above `fail_on`, else 0.
pub fn exit_code_for<'a>(
    findings: impl IntoIterator<Item = &'a Finding>,
    fail_on: Severity,
) -> i32 {
    if findings
        .into_iter()
        .any(|f| counts(f) && f.severity >= fail_on)
    {
        exit::FINDINGS
    } else {
        exit::OK
    }
}

/// Statistics of every series of the metric table for one device over the last `window`
/// (everything held when `None`); series the device never reported are left out.
pub fn summarise(
    history: &History,
    device: u32,
    window: Option<Duration>,
) -> BTreeMap<Metric, WindowStats> {
    let window = window.map_or(Window::All, Window::Last);
    Metric::ALL
        .iter()
        .map(|&m| (m, history.stats(device, m, window)))
        .filter(|(_, s)| s.count > 0)
        .collect()
}

/// Splits findings into per-device lists and host-wide ones.
pub fn split_findings(findings: Vec<Finding>) -> (BTreeMap<u32, Vec<Finding>>, Vec<Finding>) {
    let mut per_device: BTreeMap<u32, Vec<Finding>> = BTreeMap::new();
    let mut host = Vec::new();
    for f in findings {
        match f.device {
            Some(d) => per_device.entry(d).or_default().push(f),
            None => host.push(f),
        }
    }
    (per_device, host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::finding::Evidence;
    use gpudiag_model::finding::FindingState;

    fn finding(severity: Severity) -> Finding {
        Finding::new(
            "errors.x".into(),
            severity,
            Some(0),
            0,
            "t".into(),
            Evidence {
                values: Default::default(),
                window_s: 0.0,
                threshold: "".into(),
            },
            "a".into(),
        )
    }

    #[test]
    fn status_is_the_worst_severity() {
        assert_eq!(status_of(&[]), Status::Healthy);
        assert_eq!(status_of(&[finding(Severity::Info)]), Status::Healthy);
        let mixed = [finding(Severity::Info), finding(Severity::Warn)];
        assert_eq!(status_of(&mixed), Status::Warn);
        assert_eq!(status_of(&[finding(Severity::Fail)]), Status::Fail);
    }

    #[test]
    fn exit_code_follows_fail_on() {
        let warn = [finding(Severity::Warn)];
        assert_eq!(exit_code_for(&warn, Severity::Fail), 0);
        assert_eq!(exit_code_for(&warn, Severity::Warn), 1);
        assert_eq!(exit_code_for(&warn, Severity::Info), 1);
        assert_eq!(exit_code_for(&[], Severity::Info), 0);
    }

    #[test]
    fn a_cleared_fault_counts_and_a_cleared_workload_finding_does_not() {
        let cleared = |id: &str, severity| Finding {
            id: id.into(),
            state: FindingState::Cleared,
            ..finding(severity)
        };
        let fault = [cleared("throttle.hw_slowdown", Severity::Fail)];
        assert_eq!(status_of(&fault), Status::Fail);
        assert_eq!(exit_code_for(&fault, Severity::Fail), 1);
        let workload = [cleared("utilisation.low", Severity::Warn)];
        assert_eq!(status_of(&workload), Status::Healthy);
        assert_eq!(exit_code_for(&workload, Severity::Warn), 0);
        let still = [Finding {
            id: "utilisation.low".into(),
            ..finding(Severity::Warn)
        }];
        assert_eq!(status_of(&still), Status::Warn);
    }
}
