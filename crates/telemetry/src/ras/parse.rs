//! Reads a RAS report, JSON (NCCL 2.28.7+, `SET FORMAT json`) or the verbose text, into a
//! bounded [`RasAnswer`]. The text's layout is NCCL's `rasClientRunComms`
//! (src/ras/client_support.cc): a communicator table, then `Errors` and `Warnings` sections whose
//! blocks start with `#group-index (hash) KIND` and list outlier ranks as `Rank R -- GPU G managed
//! by process P on node H`. Lines it does not know are skipped; a report with none it knows is
//! `malformed`, with a short excerpt.

use std::collections::BTreeMap;

use serde::Deserialize;

use gpudiag_model::ras::{
    MAX_COLLECTIVE_KINDS, MAX_COMMUNICATORS, MAX_EXCERPT_CHARS, MAX_NOTES, MAX_RANKS, RasAnswer,
    RasCommunicator, RasCountGroup, RasFailure, RasFormat, RasNotAnswered, RasRank, RasRankState,
    clip,
};

/// Ranks named per count group; the rest are counted.
const MAX_GROUP_RANKS: usize = 16;

fn empty(format: RasFormat) -> RasAnswer {
    let mut a = RasAnswer::failed(0, "", Vec::new(), RasFailure::Malformed, "");
    a.not_answered = None;
    a.format = Some(format);
    a
}

fn malformed(mut a: RasAnswer, body: &[u8], why: &str) -> RasAnswer {
    a.not_answered = Some(RasNotAnswered {
        failure: RasFailure::Malformed,
        reason: clip(why),
    });
    let text = String::from_utf8_lossy(body);
    let cut: String = text.chars().take(MAX_EXCERPT_CHARS).collect();
    a.excerpt = Some(gpudiag_model::printable::line(&cut).into_owned());
    a
}

fn note(list: &mut Vec<String>, s: String) {
    if list.len() < MAX_NOTES {
        list.push(clip(&s));
    }
}

#[derive(Deserialize)]
struct JsonReport {
    nccl_version: Option<String>,
    communicators_count: Option<u32>,
    #[serde(default)]
    communicators: Vec<JsonComm>,
    ras: Option<JsonRas>,
}

#[derive(Deserialize)]
struct JsonRas {
    timeouts_count: Option<u32>,
}

#[derive(Deserialize)]
struct JsonComm {
    hash: String,
    size: Option<u32>,
    #[serde(default)]
    ranks: Vec<JsonRank>,
    #[serde(default)]
    missing_ranks: Vec<JsonRank>,
}

#[derive(Deserialize)]
struct JsonRank {
    rank: u32,
    host: Option<String>,
    pid: Option<i64>,
    cuda_dev: Option<i64>,
    nvml_dev: Option<i64>,
    #[serde(default)]
    status: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    collective_counts: BTreeMap<String, u64>,
}

/// NCCL writes -1 for what it does not know.
fn known(n: Option<i64>) -> Option<u32> {
    n.and_then(|n| u32::try_from(n).ok())
}

/// `ncclSuccess` and `ncclInProgress`: the init and async states that are no error.
fn no_error(code: Option<i64>) -> bool {
    matches!(code, None | Some(0) | Some(7))
}

fn json_state(status: &BTreeMap<String, serde_json::Value>, missing: bool) -> RasRankState {
    let flag = |k: &str| status.get(k).and_then(serde_json::Value::as_bool) == Some(true);
    let code = |k: &str| status.get(k).and_then(serde_json::Value::as_i64);
    if missing {
        return if flag("considered_dead") {
            RasRankState::Dead
        } else if flag("unresponsive") {
            RasRankState::Unresponsive
        } else {
            RasRankState::NoComm
        };
    }
    if status.is_empty() {
        RasRankState::Unknown
    } else if flag("abort_flag") {
        RasRankState::Abort
    } else if flag("finalize_called") || flag("destroy_flag") {
        RasRankState::Finalize
    } else if !no_error(code("init_state")) || !no_error(code("async_error")) {
        RasRankState::Error
    } else if code("init_state") == Some(0) {
        RasRankState::Running
    } else {
        RasRankState::Init
    }
}

fn json_rank(r: JsonRank, missing: bool) -> RasRank {
    RasRank {
        rank: r.rank,
        pid: known(r.pid),
        node: r.host.as_deref().filter(|h| *h != "unknown").map(clip),
        cuda_device: known(r.cuda_dev),
        nvml_device: known(r.nvml_dev),
        state: json_state(&r.status, missing),
        operations: r
            .collective_counts
            .into_iter()
            .take(MAX_COLLECTIVE_KINDS)
            .map(|(k, v)| (clip(&k), v))
            .collect(),
    }
}

/// The count groups of each collective kind whose ranks disagree, largest group first, as the
/// text report words them.
fn groups_from_ranks(ranks: &[RasRank]) -> Vec<RasCountGroup> {
    let kinds: std::collections::BTreeSet<&String> =
        ranks.iter().flat_map(|r| r.operations.keys()).collect();
    let mut out = Vec::new();
    for kind in kinds {
        let mut by_count: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for r in ranks {
            if let Some(&n) = r.operations.get(kind) {
                by_count.entry(n).or_default().push(r.rank);
            }
        }
        if by_count.len() < 2 {
            continue;
        }
        let mut groups: Vec<RasCountGroup> = by_count
            .into_iter()
            .map(|(operations, mut rs)| {
                let ranks_count = u32::try_from(rs.len()).unwrap_or(u32::MAX);
                rs.truncate(MAX_GROUP_RANKS);
                RasCountGroup {
                    collective: kind.clone(),
                    ranks_count,
                    operations,
                    ranks: rs,
                }
            })
            .collect();
        // The most ranks first, as NCCL's text orders them; ties the furthest ahead first.
        groups.sort_by_key(|g| std::cmp::Reverse((g.ranks_count, g.operations)));
        out.extend(groups);
    }
    out
}

/// NCCL 2.28.7 to 2.28.9 write a missing rank's `"nvml_dev": N` with no comma before its
/// `"status"` (`jsonWriteMissingRank`; 2.30 adds it): exactly the reports that name a dead or
/// silent rank would not parse. Inserts that one comma, nothing else.
fn repair_missing_comma(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    const KEY: &[u8] = b"\"nvml_dev\":";
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while let Some(at) = find(&body[i..], KEY).map(|p| p + i) {
        let mut j = at + KEY.len();
        while j < body.len() && body[j] == b' ' {
            j += 1;
        }
        while j < body.len() && (body[j] == b'-' || body[j].is_ascii_digit()) {
            j += 1;
        }
        let value_end = j;
        while j < body.len() && body[j].is_ascii_whitespace() {
            j += 1;
        }
        if j < body.len() && body[j] == b'"' && value_end > at + KEY.len() {
            let o = out.get_or_insert_with(|| Vec::with_capacity(body.len() + 64));
            o.extend_from_slice(&body[copied..value_end]);
            o.push(b',');
            copied = value_end;
        }
        i = value_end.max(at + 1);
    }
    match out {
        Some(mut o) => {
            o.extend_from_slice(&body[copied..]);
            std::borrow::Cow::Owned(o)
        }
        None => std::borrow::Cow::Borrowed(body),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A JSON report (`SET FORMAT json` then `STATUS`).
pub fn parse_json(body: &[u8]) -> RasAnswer {
    let mut a = empty(RasFormat::Json);
    let repaired = repair_missing_comma(body);
    let report: JsonReport = match serde_json::from_slice(&repaired) {
        Ok(r) => r,
        Err(e) => {
            return malformed(
                a,
                body,
                &format!(
                    "the JSON report could not be read: {}",
                    crate::recording::tidy_message(&e.to_string())
                ),
            );
        }
    };
    a.nccl_version = report.nccl_version.as_deref().map(clip);
    let total = u32::try_from(report.communicators.len()).unwrap_or(u32::MAX);
    a.communicators_total = Some(report.communicators_count.unwrap_or(total).max(total));
    a.timeouts = report.ras.and_then(|r| r.timeouts_count);
    let mut dead = 0u32;
    let mut missing = 0u32;
    for c in report.communicators.into_iter().take(MAX_COMMUNICATORS) {
        let answered = c.ranks.len() + c.missing_ranks.len();
        let ranks: Vec<RasRank> = c
            .ranks
            .into_iter()
            .take(MAX_RANKS)
            .map(|r| json_rank(r, false))
            .collect();
        let missing_ranks: Vec<RasRank> = c
            .missing_ranks
            .into_iter()
            .take(MAX_RANKS)
            .map(|r| json_rank(r, true))
            .collect();
        dead += missing_ranks
            .iter()
            .filter(|r| r.state == RasRankState::Dead)
            .count() as u32;
        missing += missing_ranks
            .iter()
            .filter(|r| r.state != RasRankState::NoComm)
            .count() as u32;
        let count_groups = groups_from_ranks(&ranks);
        let mut flags = Vec::new();
        if !count_groups.is_empty() {
            flags.push("MISMATCH".to_owned());
        }
        if !missing_ranks.is_empty() {
            flags.push("INCOMPLETE".to_owned());
        }
        if ranks.iter().any(|r| r.state == RasRankState::Error) {
            flags.push("ERROR".to_owned());
        }
        for g in count_groups.iter().skip(1) {
            note(
                &mut a.warnings,
                format!(
                    "communicator {}: {} rank(s) launched up to {} operation {} ({} ranks: {})",
                    clip(&c.hash),
                    g.ranks_count,
                    g.collective,
                    g.operations,
                    count_groups[0].ranks_count,
                    count_groups[0].operations
                ),
            );
        }
        let kept = ranks.len() + missing_ranks.len();
        a.communicators.push(RasCommunicator {
            hash: clip(&c.hash),
            size: c.size,
            ranks_left_out: u32::try_from(answered - kept).unwrap_or(u32::MAX),
            ranks,
            missing_ranks,
            count_groups,
            flags,
        });
    }
    a.dead_processes = Some(dead);
    a.missing_processes = Some(missing);
    a
}

/// `0` or `0 (NVML 2)`: the CUDA and NVML indices.
fn gpu_indices(s: &str) -> (Option<u32>, Option<u32>) {
    let s = s.trim();
    match s.split_once(" (NVML ") {
        Some((cuda, nvml)) => (
            cuda.trim().parse().ok(),
            nvml.trim_end_matches(')').trim().parse().ok(),
        ),
        None => {
            let n = s.parse().ok();
            (n, n)
        }
    }
}

/// `GPU G managed by process P on node H`, the tail of a rank line.
fn rank_tail(tail: &str) -> (Option<u32>, Option<u32>, Option<u32>, Option<String>) {
    let Some(rest) = tail.trim().strip_prefix("GPU ") else {
        return (None, None, None, None);
    };
    let Some((gpu, rest)) = rest.split_once(" managed by process ") else {
        return (None, None, None, None);
    };
    let (cuda, nvml) = gpu_indices(gpu);
    let (pid, node) = match rest.split_once(" on node ") {
        Some((pid, node)) => (pid.trim().parse().ok(), Some(clip(node.trim()))),
        None => (rest.trim().parse().ok(), None),
    };
    (cuda, nvml, pid, node)
}

fn leading_number(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn state_word(s: &str) -> RasRankState {
    match s.trim() {
        "INIT" => RasRankState::Init,
        "RUNNING" => RasRankState::Running,
        "FINALIZE" => RasRankState::Finalize,
        "ABORT" => RasRankState::Abort,
        "NOCOMM" => RasRankState::NoComm,
        _ => RasRankState::Unknown,
    }
}

/// What the lines under a block header describe.
#[derive(Clone, PartialEq)]
enum Block {
    None,
    /// `INCOMPLETE` (missing processes) or `DEAD` (dead processes): `Process P on node ...`.
    Processes {
        dead: bool,
    },
    /// `#g-i (hash) INCOMPLETE`: ranks that did not answer.
    CommIncomplete,
    /// `#g-i (hash) ERROR`.
    CommError,
    /// `#g-i (hash) MISMATCH`, status part; the state the following ranks share.
    CommStatus(RasRankState),
    /// `#g-i (hash) MISMATCH`, counts part: the collective kind and the group's index.
    CommCounts(String, Option<usize>),
}

struct TextReader {
    a: RasAnswer,
    comm: Option<usize>,
    block: Block,
    recognised: bool,
    /// NCCL writes its `Warnings` section last, always: a report without it was cut short.
    complete: bool,
}

impl TextReader {
    fn comm(&mut self) -> Option<&mut RasCommunicator> {
        self.comm.map(|i| &mut self.a.communicators[i])
    }

    fn open_comm(&mut self, hash: &str, flag: &str) {
        let hash = clip(&format!("0x{}", hash.trim_start_matches('0')));
        let idx = match self.a.communicators.iter().position(|c| c.hash == hash) {
            Some(i) => Some(i),
            None if self.a.communicators.len() < MAX_COMMUNICATORS => {
                self.a.communicators.push(RasCommunicator {
                    hash,
                    size: None,
                    ranks: Vec::new(),
                    missing_ranks: Vec::new(),
                    ranks_left_out: 0,
                    count_groups: Vec::new(),
                    flags: Vec::new(),
                });
                Some(self.a.communicators.len() - 1)
            }
            None => None,
        };
        self.comm = idx;
        if let Some(c) = self.comm()
            && !c.flags.iter().any(|f| f == flag)
        {
            c.flags.push(clip(flag));
        }
    }

    /// Adds or updates rank `rank` of the current communicator.
    fn rank(&mut self, rank: u32, tail: &str, missing: bool, state: RasRankState) -> bool {
        let (cuda, nvml, pid, node) = rank_tail(tail);
        let Some(c) = self.comm() else { return false };
        let list = if missing {
            &mut c.missing_ranks
        } else {
            &mut c.ranks
        };
        let at = match list.iter().position(|r| r.rank == rank) {
            Some(i) => i,
            None if list.len() < MAX_RANKS => {
                list.push(RasRank {
                    rank,
                    pid: None,
                    node: None,
                    cuda_device: None,
                    nvml_device: None,
                    state: RasRankState::Unknown,
                    operations: BTreeMap::new(),
                });
                list.len() - 1
            }
            None => {
                c.ranks_left_out = c.ranks_left_out.saturating_add(1);
                return false;
            }
        };
        let r = &mut list[at];
        r.pid = r.pid.or(pid);
        r.node = r.node.take().or(node);
        r.cuda_device = r.cuda_device.or(cuda);
        r.nvml_device = r.nvml_device.or(nvml);
        if state != RasRankState::Unknown {
            r.state = state;
        }
        true
    }

    fn set_operations(&mut self, rank: u32, kind: &str, n: u64) {
        if let Some(c) = self.comm()
            && let Some(r) = c.ranks.iter_mut().find(|r| r.rank == rank)
            && (r.operations.len() < MAX_COLLECTIVE_KINDS || r.operations.contains_key(kind))
        {
            r.operations.insert(clip(kind), n);
        }
    }

    fn group(&mut self, kind: &str, count: u32, operations: u64) -> Option<usize> {
        let c = self.comm()?;
        if c.count_groups.len() >= MAX_RANKS {
            return None;
        }
        c.count_groups.push(RasCountGroup {
            collective: clip(kind),
            ranks_count: count,
            operations,
            ranks: Vec::new(),
        });
        Some(c.count_groups.len() - 1)
    }

    fn add_to_group(&mut self, g: usize, rank: u32) {
        if let Some(c) = self.comm()
            && let Some(group) = c.count_groups.get_mut(g)
            && group.ranks.len() < MAX_GROUP_RANKS
        {
            group.ranks.push(rank);
        }
    }

    fn line(&mut self, raw: &str) {
        let line = raw.trim_end();
        let body = line.trim_start();
        if let Some(v) = body.strip_prefix("NCCL version ") {
            let v = v.split(" compiled with").next().unwrap_or(v);
            self.a.nccl_version = Some(clip(v.trim()));
            self.recognised = true;
            return;
        }
        if body == "Job summary" || body.starts_with("Communicators...") {
            self.recognised = true;
            return;
        }
        if body.starts_with("Group ") && body.contains("Comms") {
            self.recognised = true;
            self.a.communicators_total = Some(0);
            return;
        }
        // A row of the communicator table: group, comms in group, nodes, ranks per node, ranks
        // per comm, ranks in group, status, errors.
        let cols: Vec<&str> = body.split_whitespace().collect();
        if self.a.communicators_total.is_some()
            && self.block == Block::None
            && cols.len() == 8
            && cols[..3].iter().all(|c| c.parse::<u32>().is_ok())
        {
            let n: u32 = cols[1].parse().unwrap_or(0);
            self.a.communicators_total = self.a.communicators_total.map(|t| t.saturating_add(n));
            if cols[7] != "OK" {
                note(
                    &mut self.a.errors,
                    format!(
                        "{n} communicator(s) of {} ranks: {} {}",
                        cols[4], cols[6], cols[7]
                    ),
                );
            }
            return;
        }
        match body {
            "Errors" | "Warnings" => {
                self.complete |= body == "Warnings";
                self.block = Block::None;
                self.comm = None;
                self.recognised = true;
                return;
            }
            "INCOMPLETE" => {
                self.block = Block::Processes { dead: false };
                self.comm = None;
                return;
            }
            "DEAD" => {
                self.block = Block::Processes { dead: true };
                self.comm = None;
                return;
            }
            "TIMEOUT" => {
                self.block = Block::None;
                self.comm = None;
                return;
            }
            _ => {}
        }
        if body.starts_with('#')
            && let Some((_, rest)) = body.split_once(" (")
            && let Some((hash, kind)) = rest.split_once(") ")
        {
            let kind = kind.trim();
            self.open_comm(hash, kind);
            self.block = match kind {
                "INCOMPLETE" => Block::CommIncomplete,
                "ERROR" => Block::CommError,
                _ => Block::CommStatus(RasRankState::Unknown),
            };
            self.recognised = true;
            return;
        }
        if !line.starts_with("  ") {
            return;
        }
        self.indented(body);
    }

    fn indented(&mut self, body: &str) {
        if let Some(rest) = body.strip_prefix("Encountered ") {
            self.a.timeouts = leading_number(rest).and_then(|n| u32::try_from(n).ok());
            return;
        }
        if let Block::Processes { dead } = self.block {
            if let Some(n) = leading_number(body)
                && (body.contains("considered dead") || body.contains("job process"))
            {
                let n = u32::try_from(n).ok();
                if dead {
                    self.a.dead_processes = n;
                }
                return;
            }
            if let Some(rest) = body.strip_prefix("Missing communicator data from ") {
                self.a.missing_processes = leading_number(rest).and_then(|n| u32::try_from(n).ok());
                return;
            }
            if let Some(rest) = body.strip_prefix("Process ") {
                let pid = leading_number(rest);
                let gpus = rest.split(" managing ").nth(1).unwrap_or("").trim();
                if let Some(pid) = pid {
                    let what = if dead {
                        "is considered dead (unreachable over RAS)"
                    } else {
                        "sent no data"
                    };
                    note(&mut self.a.errors, format!("process {pid} ({gpus}) {what}"));
                }
            }
            return;
        }
        if let Some(kind) = body
            .strip_prefix("Communicator ranks have different ")
            .and_then(|r| r.strip_suffix(" operation counts"))
        {
            self.block = Block::CommCounts(kind.to_owned(), None);
            return;
        }
        if body == "Communicator ranks have different status" {
            self.block = Block::CommStatus(RasRankState::Unknown);
            return;
        }
        if body.starts_with("Missing communicator data from ") {
            return;
        }
        if let Some(rest) = body.strip_prefix("Rank ") {
            self.rank_line(rest);
            return;
        }
        let Some(n) = leading_number(body) else {
            return;
        };
        let count = u32::try_from(n).unwrap_or(u32::MAX);
        let words = body.trim_start_matches(|c: char| c.is_ascii_digit()).trim();
        if let Some(ops) = words.strip_prefix("ranks have launched up to operation ")
            && let Block::CommCounts(kind, _) = self.block.clone()
        {
            let ops = leading_number(ops).unwrap_or(0);
            let g = self.group(&kind, count, ops);
            self.block = Block::CommCounts(kind, g);
        } else if words == "ranks have not launched any operations"
            && let Block::CommCounts(kind, _) = self.block.clone()
        {
            let g = self.group(&kind, count, 0);
            self.block = Block::CommCounts(kind, g);
        } else if let Some(s) = words.strip_prefix("ranks have status ") {
            self.block = Block::CommStatus(state_word(s));
        } else if words.starts_with("ranks reported ") {
            let hash = self.comm().map(|c| c.hash.clone()).unwrap_or_default();
            note(&mut self.a.errors, format!("communicator {hash}: {body}"));
        }
    }

    /// After `Rank `: `R -- GPU ...`, `R has launched up to operation N -- GPU ...`,
    /// `R has not launched any operations -- ...`, `R has status S -- ...`, `R reported E -- ...`.
    fn rank_line(&mut self, rest: &str) {
        let Some(rank) = leading_number(rest).and_then(|n| u32::try_from(n).ok()) else {
            return;
        };
        let after = rest.trim_start_matches(|c: char| c.is_ascii_digit());
        let (what, tail) = after.split_once(" -- ").unwrap_or((after, ""));
        let what = what.trim();
        match self.block.clone() {
            Block::CommIncomplete => {
                self.rank(rank, tail, true, RasRankState::Unresponsive);
            }
            Block::CommError => {
                self.rank(rank, tail, false, RasRankState::Error);
                if let Some(e) = what.strip_prefix("reported ") {
                    let hash = self.comm().map(|c| c.hash.clone()).unwrap_or_default();
                    note(
                        &mut self.a.errors,
                        format!("communicator {hash}: rank {rank} reported {e}"),
                    );
                }
            }
            Block::CommStatus(shared) => {
                let state = what.strip_prefix("has status ").map_or(shared, state_word);
                let missing = state == RasRankState::NoComm;
                self.rank(rank, tail, missing, state);
            }
            Block::CommCounts(kind, group) => {
                let ops = if let Some(n) = what.strip_prefix("has launched up to operation ") {
                    leading_number(n)
                } else if what == "has not launched any operations" {
                    Some(0)
                } else {
                    None
                };
                let group = match ops {
                    // A single rank's own line: a group of one.
                    Some(n) => self.group(&kind, 1, n),
                    None => group,
                };
                self.rank(rank, tail, false, RasRankState::Unknown);
                if let Some(g) = group {
                    self.add_to_group(g, rank);
                    let n = self
                        .comm()
                        .and_then(|c| c.count_groups.get(g))
                        .map(|g| g.operations);
                    if let Some(n) = n {
                        self.set_operations(rank, &kind, n);
                    }
                }
                if let Some(n) = ops {
                    let hash = self.comm().map(|c| c.hash.clone()).unwrap_or_default();
                    note(
                        &mut self.a.warnings,
                        format!(
                            "communicator {hash}: rank {rank} launched up to {kind} operation {n}"
                        ),
                    );
                }
            }
            Block::None | Block::Processes { .. } => {}
        }
    }
}

/// A text report (`VERBOSE STATUS` or `STATUS`).
pub fn parse_text(body: &[u8]) -> RasAnswer {
    let text = String::from_utf8_lossy(body);
    let mut r = TextReader {
        a: empty(RasFormat::Text),
        comm: None,
        block: Block::None,
        recognised: false,
        complete: false,
    };
    for line in text.lines() {
        r.line(line);
    }
    if !r.recognised {
        let a = r.a;
        return malformed(a, body, "the answer is no NCCL RAS report");
    }
    if !r.complete {
        let a = r.a;
        return malformed(a, body, "the report ended before its Warnings section");
    }
    r.a
}
