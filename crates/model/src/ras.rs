//! NCCL's RAS service as progress evidence: one answer to a status query as gpudiag keeps it
//! (`RasAnswer`), and what a job's verdict shows from the recent answers (`RasEvidence`).
//! Asked by `gpudiag_telemetry::ras`, judged by `gpudiag_core::rules::ras_log`; the protocol and
//! its limits are in `docs/nccl-ras.md`.
//!
//! An answer is what NCCL said, bounded: a few communicators and ranks, short strings, never the
//! raw report beyond a small excerpt. Node addresses are personal data (a bundle redacts them).
//! Pids are as NCCL tells them: `getpid()` inside the job's pid namespace, which is the host pid
//! only where the job shares the host's.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sample::TimeMs;

/// Communicators kept per answer; a job has a handful (world, a few subgroups).
pub const MAX_COMMUNICATORS: usize = 32;
/// Ranks kept per communicator (answered and missing each); the rest are counted, not kept.
pub const MAX_RANKS: usize = 256;
/// Characters kept of any one string NCCL sends (a version, an error line, a node address).
pub const MAX_TEXT_CHARS: usize = 160;
/// Errors and warnings kept per answer.
pub const MAX_NOTES: usize = 16;
/// Characters kept of the raw report where it could not be read, for the user to see why.
pub const MAX_EXCERPT_CHARS: usize = 400;
/// Collective kinds kept per rank (NCCL 2.28 counts five).
pub const MAX_COLLECTIVE_KINDS: usize = 12;

/// The report's form: NCCL 2.28.7 and later answer JSON when asked; older ones only text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RasFormat {
    Json,
    Text,
}

/// Why a query got no usable answer. Stable names (JSON values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RasFailure {
    /// Nothing listens at the address: RAS is off (`NCCL_RAS_ENABLE=0`), the job is gone, or it
    /// listens elsewhere.
    Refused,
    /// The job runs in a network namespace of its own: its RAS port is not the host's.
    OwnNetNamespace,
    /// No complete answer within the deadline.
    TimedOut,
    /// The answer was longer than gpudiag reads.
    TooLarge,
    /// The server closed before the report ended, or answered something that is no RAS report.
    Malformed,
    /// Any other socket error.
    Io,
}

impl RasFailure {
    pub fn name(self) -> &'static str {
        match self {
            RasFailure::Refused => "refused",
            RasFailure::OwnNetNamespace => "own_net_namespace",
            RasFailure::TimedOut => "timed_out",
            RasFailure::TooLarge => "too_large",
            RasFailure::Malformed => "malformed",
            RasFailure::Io => "io",
        }
    }
}

/// Why an answer is missing, in a type and in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasNotAnswered {
    pub failure: RasFailure,
    /// In words, for the user: "connection refused at 127.0.0.1:28028 (is RAS enabled?)".
    pub reason: String,
}

/// One answer of NCCL's RAS service to a status query, as gpudiag keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasAnswer {
    /// When the answer was complete (or given up), ms since the Unix epoch.
    pub time_ms: TimeMs,
    /// How long the query took, connect to close.
    pub took_ms: u64,
    /// The address asked, `host:port` (redactable).
    pub address: String,
    /// The devices of the job the query was made for, by gpudiag's device index: which job
    /// the asker meant (the answer may describe another, see [`RasAnswer::pids`]).
    #[serde(default)]
    pub for_devices: Vec<u32>,
    /// The protocol version the server named (`SERVER PROTOCOL 2`).
    pub protocol: Option<u32>,
    pub format: Option<RasFormat>,
    /// NCCL's version as it names it ("2.28.9+cuda12.9" in text, "2.28.9" in JSON).
    pub nccl_version: Option<String>,
    /// Communicators NCCL reported, before any were left out.
    pub communicators_total: Option<u32>,
    pub communicators: Vec<RasCommunicator>,
    /// Job processes RAS considers dead (unreachable over its own network for a minute).
    pub dead_processes: Option<u32>,
    /// Job processes whose data is missing from the answer.
    pub missing_processes: Option<u32>,
    /// Communication timeouts RAS met while gathering.
    pub timeouts: Option<u32>,
    /// NCCL's errors (init or asynchronous errors per communicator), in words, a few.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// NCCL's warnings (mismatched counts or status), in words, a few.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A short excerpt of a report that could not be read, control characters escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excerpt: Option<String>,
    /// Why there is no usable answer; `None` when it answered.
    pub not_answered: Option<RasNotAnswered>,
}

impl RasAnswer {
    /// An answer that did not come, for `reason`.
    pub fn failed(
        time_ms: TimeMs,
        address: &str,
        for_devices: Vec<u32>,
        failure: RasFailure,
        reason: impl Into<String>,
    ) -> Self {
        RasAnswer {
            time_ms,
            took_ms: 0,
            address: clip(address),
            for_devices,
            protocol: None,
            format: None,
            nccl_version: None,
            communicators_total: None,
            communicators: Vec::new(),
            dead_processes: None,
            missing_processes: None,
            timeouts: None,
            errors: Vec::new(),
            warnings: Vec::new(),
            excerpt: None,
            not_answered: Some(RasNotAnswered {
                failure,
                reason: clip(&reason.into()),
            }),
        }
    }

    /// The answer held to the bounds a live one has (counts of communicators, ranks, notes;
    /// string lengths; control characters escaped): for answers read from a file.
    pub fn bounded(mut self) -> Self {
        let clip_opt = |s: &mut Option<String>| {
            if let Some(v) = s.as_mut() {
                *v = clip(v);
            }
        };
        self.address = clip(&self.address);
        clip_opt(&mut self.nccl_version);
        self.communicators.truncate(MAX_COMMUNICATORS);
        for c in &mut self.communicators {
            c.hash = clip(&c.hash);
            c.ranks.truncate(MAX_RANKS);
            c.missing_ranks.truncate(MAX_RANKS);
            c.count_groups.truncate(MAX_RANKS);
            c.flags.truncate(MAX_NOTES);
            c.flags.iter_mut().for_each(|f| *f = clip(f));
            for g in &mut c.count_groups {
                g.collective = clip(&g.collective);
                g.ranks.truncate(MAX_RANKS);
            }
            for r in c.ranks.iter_mut().chain(c.missing_ranks.iter_mut()) {
                clip_opt(&mut r.node);
                if r.operations.len() > MAX_COLLECTIVE_KINDS
                    || r.operations.keys().any(|k| clip(k) != *k)
                {
                    r.operations = std::mem::take(&mut r.operations)
                        .into_iter()
                        .take(MAX_COLLECTIVE_KINDS)
                        .map(|(k, v)| (clip(&k), v))
                        .collect();
                }
            }
        }
        for notes in [&mut self.errors, &mut self.warnings] {
            notes.truncate(MAX_NOTES);
            notes.iter_mut().for_each(|n| *n = clip(n));
        }
        if let Some(e) = self.excerpt.as_mut() {
            let cut: String = e.chars().take(MAX_EXCERPT_CHARS).collect();
            *e = crate::printable::line(&cut).into_owned();
        }
        if let Some(n) = self.not_answered.as_mut() {
            n.reason = clip(&n.reason);
        }
        self.for_devices.truncate(MAX_RANKS);
        self
    }

    /// Every process id the answer names (as NCCL tells them), answered and missing ranks.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.communicators
            .iter()
            .flat_map(|c| c.ranks.iter().chain(&c.missing_ranks))
            .filter_map(|r| r.pid)
    }
}

/// One NCCL communicator (the world, or a subgroup) as RAS reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasCommunicator {
    /// NCCL's hash of the communicator's id, hex (`0x3f1a...`).
    pub hash: String,
    /// The communicator's rank count.
    pub size: Option<u32>,
    /// Ranks that answered, each with its counts (JSON; text lists only the outliers).
    pub ranks: Vec<RasRank>,
    /// Ranks that did not answer, or answered without this communicator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_ranks: Vec<RasRank>,
    /// Ranks reported but not kept (over [`MAX_RANKS`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ranks_left_out: u32,
    /// The launch counts as NCCL groups them, per collective kind: "3 ranks have launched up
    /// to operation 41", "rank 3 up to operation 30". From JSON they are built from the ranks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub count_groups: Vec<RasCountGroup>,
    /// NCCL's words for the communicator's state: `RUNNING`, `INIT`, `FINALIZE`, `ABORT`, and
    /// its errors `MISMATCH`, `ERROR`, `INCOMPLETE` (text reports name them per group).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

/// Ranks of one communicator that launched the same number of one collective kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasCountGroup {
    /// NCCL's name of the collective kind (`AllReduce`, `Broadcast`, ...).
    pub collective: String,
    /// How many ranks launched exactly `operations`.
    pub ranks_count: u32,
    pub operations: u64,
    /// The ranks named (text reports name only the outliers).
    pub ranks: Vec<u32>,
}

/// One rank of a communicator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasRank {
    pub rank: u32,
    /// The process's id as NCCL tells it (its own pid namespace's).
    pub pid: Option<u32>,
    /// The node's address as RAS knows it (redactable).
    pub node: Option<String>,
    pub cuda_device: Option<u32>,
    /// The NVML index, which is gpudiag's device index on that node.
    pub nvml_device: Option<u32>,
    pub state: RasRankState,
    /// Collective operations launched, per kind (NCCL's names); empty where not reported.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub operations: BTreeMap<String, u64>,
}

impl RasRank {
    /// Collective operations launched, all kinds together; `None` where not reported.
    pub fn operations_total(&self) -> Option<u64> {
        if self.operations.is_empty() {
            return None;
        }
        Some(
            self.operations
                .values()
                .fold(0u64, |a, b| a.saturating_add(*b)),
        )
    }
}

/// A rank's state as RAS tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RasRankState {
    Init,
    Running,
    Finalize,
    Abort,
    /// An initialisation or asynchronous error.
    Error,
    /// It answered, but not as a member of this communicator.
    NoComm,
    /// It did not answer in time.
    Unresponsive,
    /// RAS considers its process dead.
    Dead,
    /// The report does not say.
    Unknown,
}

/// Cuts `s` to [`MAX_TEXT_CHARS`] characters and escapes control characters: what NCCL sends
/// is data, not trusted.
pub fn clip(s: &str) -> String {
    let cut: String = s.chars().take(MAX_TEXT_CHARS).collect();
    let mut out = crate::printable::line(&cut).into_owned();
    if s.chars().nth(MAX_TEXT_CHARS).is_some() {
        out.push('…');
    }
    out
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Whether an answer describes a given job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RasMatch {
    /// It names the job's processes.
    Same,
    /// It names processes, none of them the job's: another job of the same user answered
    /// (every NCCL process of a user listens on the port; connections spread over them).
    Other,
    /// It names no process, or only the job's devices under other pids (a pid namespace).
    Unknown,
}

/// What a job's verdict shows from NCCL's RAS: the latest answer for the job, whether its
/// counts moved, the ranks RAS names behind; or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasEvidence {
    /// When the answer shown came, ms since the Unix epoch.
    pub answered_ms: Option<TimeMs>,
    pub nccl_version: Option<String>,
    /// Collective operations each rank launched, largest communicator, per rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RasRankCount>,
    /// Whether two answers some seconds apart show the counts moving; `None` with fewer than
    /// two answers with counts.
    pub progress: Option<RasProgress>,
    /// The ranks RAS reports behind their peers (fewer operations launched), or dead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lagging: Vec<RasRankCount>,
    /// One line in words: "RAS: 3 ranks launched up to operation 41; rank 3 up to 30 (pid
    /// 4553)". Or why nothing was learnt.
    pub summary: String,
    /// Why there is no evidence, where there is none.
    pub not_judged: Option<RasNotJudged>,
}

/// One rank's count as the verdict shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasRankCount {
    pub rank: u32,
    pub pid: Option<u32>,
    /// gpudiag's device index, where the rank runs on this host.
    pub device: Option<u32>,
    /// Operations launched, all collective kinds; `None` where RAS did not tell.
    pub operations: Option<u64>,
    pub state: RasRankState,
}

/// Counts between two answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RasProgress {
    /// Whether any rank launched more operations in the later answer.
    pub moving: bool,
    /// The two answers compared, ms since the Unix epoch.
    pub from_ms: TimeMs,
    pub to_ms: TimeMs,
}

/// Why a verdict has no RAS evidence. Stable names (JSON values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RasNotJudged {
    /// RAS was not asked yet (a job too small, or no reason to ask).
    NotAsked,
    /// Nothing listens: RAS is not enabled, or the job listens elsewhere.
    NotEnabled,
    /// The job's network namespace is not the host's.
    OwnNetNamespace,
    /// Only another job of the same user answered.
    OtherJob,
    TimedOut,
    /// The answer could not be read (too large, cut short, not a RAS report, a socket error).
    Unreadable,
    /// It answered for the job, with no counts (a text report of a healthy job lists none).
    NoCounts,
}

impl RasAnswer {
    /// Whether the answer describes the job whose processes run as `members` (host pid,
    /// gpudiag's device index) on this host. A pid the answer names that is one of the job's
    /// makes it the job's; pids that are none of them, on none of the job's devices, make it
    /// another job's; the job's devices under other pids may be the job seen from inside a pid
    /// namespace, so that is unknown, as is an answer naming no pid (a healthy text report).
    pub fn matches_job(&self, members: &[(u32, u32)]) -> RasMatch {
        let ranks = || {
            self.communicators
                .iter()
                .flat_map(|c| c.ranks.iter().chain(&c.missing_ranks))
        };
        let mut named_any = false;
        let mut device_overlap = false;
        for r in ranks() {
            let Some(pid) = r.pid else { continue };
            named_any = true;
            if members.iter().any(|&(p, _)| p == pid) {
                return RasMatch::Same;
            }
            if r.nvml_device
                .is_some_and(|d| members.iter().any(|&(_, dev)| dev == d))
            {
                device_overlap = true;
            }
        }
        match (named_any, device_overlap) {
            (false, _) | (true, true) => RasMatch::Unknown,
            (true, false) => RasMatch::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: u32, pid: u32, device: u32) -> RasRank {
        RasRank {
            rank,
            pid: Some(pid),
            node: Some("\u{1b}[2J10.0.0.1".into()),
            cuda_device: Some(device),
            nvml_device: Some(device),
            state: RasRankState::Running,
            operations: (0..40).map(|k| (format!("kind{k}"), 1)).collect(),
        }
    }

    fn answer(ranks: Vec<RasRank>, communicators: usize) -> RasAnswer {
        let mut a = RasAnswer::failed(1, "127.0.0.1:28028", vec![0], RasFailure::Io, "x");
        a.not_answered = None;
        a.errors = vec!["e".repeat(10_000); 100];
        a.communicators = (0..communicators)
            .map(|i| RasCommunicator {
                hash: format!("0x{i:x}"),
                size: None,
                ranks: ranks.clone(),
                missing_ranks: Vec::new(),
                ranks_left_out: 0,
                count_groups: Vec::new(),
                flags: Vec::new(),
            })
            .collect();
        a
    }

    #[test]
    fn an_answer_from_a_file_is_held_to_the_live_bounds() {
        let ranks = (0..1000).map(|r| rank(r, 100 + r, r % 8)).collect();
        let a = answer(ranks, 100).bounded();
        assert_eq!(a.communicators.len(), MAX_COMMUNICATORS);
        assert_eq!(a.communicators[0].ranks.len(), MAX_RANKS);
        let r = &a.communicators[0].ranks[0];
        assert_eq!(r.operations.len(), MAX_COLLECTIVE_KINDS);
        assert!(!r.node.as_deref().unwrap_or_default().contains('\u{1b}'));
        assert_eq!(a.errors.len(), MAX_NOTES);
        assert!(a.errors[0].chars().count() <= MAX_TEXT_CHARS + 1);
    }

    #[test]
    fn an_answer_matches_its_job_by_pid_not_by_device_alone() {
        let a = answer(vec![rank(0, 4550, 0), rank(1, 4551, 1)], 1);
        assert_eq!(a.matches_job(&[(4551, 1), (4552, 2)]), RasMatch::Same);
        assert_eq!(a.matches_job(&[(9000, 4), (9001, 5)]), RasMatch::Other);
        // The job's devices under other pids: perhaps the job seen from a pid namespace.
        assert_eq!(a.matches_job(&[(9000, 0), (9001, 1)]), RasMatch::Unknown);
        assert_eq!(
            answer(Vec::new(), 1).matches_job(&[(1, 0)]),
            RasMatch::Unknown
        );
    }
}
