//! `gpudiag slurm`: what the Slurm prolog and epilog (`assets/deploy/slurm/`) need from gpudiag
//! besides the check itself: the job's GPUs as `check --device` values, the prolog's verdict on
//! a check report, and the epilog's job summary.
//!
//! One subcommand for the scripts rather than an output mode of `check`: the verdict and the
//! summary join the report with what only the node knows (the job's GPU list, the driver's
//! `/proc` listing, the kernel log), which a check of a recording must never read; and none of
//! the three opens a GPU. The check that does runs apart, under the scripts' deadline that
//! abandons a gpudiag stuck in the driver; these only read files, so they cannot hang there and
//! need no deadline.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use gpudiag_model::error::{Error, exit};
use gpudiag_model::printable;
use gpudiag_telemetry::kernel_log::{PciAddress, parse_xid};

use crate::cli::{GpuIds, SlurmAction, SlurmArgs, SlurmEpilogArgs};

/// Job GPUs taken at most from one list: a node has a few dozen; more is a corrupt variable.
const MAX_JOB_GPUS: usize = 1024;
/// The most of a check report or a kernel log read: a report is kilobytes, a job's kernel log
/// rarely megabytes; past this the rest is left unread and said so.
const MAX_READ_BYTES: u64 = 64 << 20;
/// An id longer than this is no GPU's name (a UUID is 40 characters).
const MAX_ID_CHARS: usize = 96;
/// XIDs listed at most in a summary: an XID storm must not make a summary of megabytes.
const MAX_XIDS: usize = 1000;

pub fn slurm(args: &SlurmArgs) -> Result<i32, Error> {
    match &args.action {
        SlurmAction::Devices => devices(args),
        SlurmAction::Prolog { report } => {
            let verdict = prolog_verdict(args, report);
            super::print(&format!("{}\n", verdict.line()))?;
            Ok(exit::OK)
        }
        SlurmAction::Epilog(epilog) => epilog_summary(args, epilog),
    }
}

/// `gpudiag slurm devices`: one `--device` value a line.
fn devices(args: &SlurmArgs) -> Result<i32, Error> {
    let gpus = job_gpus(args)?;
    let lines: String = gpus.iter().map(|g| format!("{}\n", g.selector)).collect();
    super::print_text(&lines)?;
    Ok(exit::OK)
}

/// A GPU as the driver lists it in `/proc/driver/nvidia/gpus/<bus>/information`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DriverGpu {
    uuid: Option<String>,
    minor: Option<u32>,
    bus: Option<PciAddress>,
}

/// One GPU of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobGpu {
    /// As the job's list names it: "3", "GPU-…".
    id: String,
    /// What `check --device` is given: the UUID where the driver says it, else the id.
    selector: String,
    /// The driver's entry, where the driver's listing was read and names this GPU. `None` for
    /// an NVML index or a MIG instance (the listing does not name them) and where no listing
    /// could be read: whether the driver knows the GPU is then not known.
    driver: Option<DriverGpu>,
}

/// One item of a job's GPU list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Id {
    Number(u32),
    Uuid(String),
}

/// The job's GPU list and the variable it came from: SLURM_JOB_GPUS (what slurmd gives prologs
/// and epilogs), else CUDA_VISIBLE_DEVICES. `None` when both are unset or empty.
fn job_gpu_list() -> Option<(&'static str, String)> {
    ["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|name| {
            let value = std::env::var_os(name)?.to_string_lossy().into_owned();
            (!value.trim().is_empty()).then_some((name, value))
        })
}

/// A value quoted in a message: escaped, and cut where it is long.
fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(MAX_ID_CHARS).collect();
    let more = if cut.len() < s.len() { "…" } else { "" };
    format!("'{}{more}'", printable::line(&cut))
}

/// Parses a job's GPU list: numbers (`0,1`), ranges (`0-3`), GPU and MIG UUIDs, separated by
/// commas, blanks around each ignored, each GPU once. Anything else is a configuration error
/// naming the item: guessing could check, or drain for, another job's GPU.
fn parse_ids(var: &str, list: &str) -> Result<Vec<Id>, String> {
    let bad = |item: &str, why: &str| {
        format!(
            "job GPU {} (in {var}={}) {why}",
            quoted(item),
            quoted(list.trim())
        )
    };
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 9 && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    let mut ids = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if let Some(n) = number(item) {
            ids.push(Id::Number(n));
        } else if let Some((a, b)) = item
            .split_once('-')
            .and_then(|(a, b)| Some((number(a.trim())?, number(b.trim())?)))
        {
            if a > b || (b - a) as usize >= MAX_JOB_GPUS {
                return Err(bad(item, "is not a range of GPU numbers"));
            }
            ids.extend((a..=b).map(Id::Number));
        } else if is_uuid(item) {
            ids.push(Id::Uuid(item.to_owned()));
        } else {
            return Err(bad(
                item,
                "is neither a number, a range nor a GPU or MIG UUID",
            ));
        }
        if ids.len() > MAX_JOB_GPUS {
            return Err(format!(
                "{var} names more than {MAX_JOB_GPUS} GPUs: not a job's GPU list"
            ));
        }
    }
    let mut seen = BTreeSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    Ok(ids)
}

/// `GPU-<hex and dashes>`, or a MIG instance: `MIG-<hex and dashes>` or the older
/// `MIG-GPU-<uuid>/<gi>/<ci>`.
fn is_uuid(s: &str) -> bool {
    let upper = s.to_ascii_uppercase();
    let (body, extra) = if let Some(b) = upper.strip_prefix("GPU-") {
        (b, "")
    } else if let Some(b) = upper.strip_prefix("MIG-") {
        (b, "/GPU")
    } else {
        return false;
    };
    s.len() <= MAX_ID_CHARS
        && !body.is_empty()
        && body
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == '-' || extra.contains(c) || c.is_ascii_digit())
}

/// The driver's listing: every `*/information` file under `dir`. `Err` says why there is none
/// (no NVIDIA driver here, or a container without its /proc files).
fn driver_listing(dir: &Path) -> Result<Vec<DriverGpu>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("{} cannot be read ({e})", dir.display()))?;
    let mut gpus = Vec::new();
    for entry in entries.flatten().take(MAX_JOB_GPUS) {
        let mut text = String::new();
        let Ok(file) = std::fs::File::open(entry.path().join("information")) else {
            continue;
        };
        if file.take(64 << 10).read_to_string(&mut text).is_err() {
            continue;
        }
        gpus.push(parse_information(&text));
    }
    Ok(gpus)
}

/// One `information` file: `GPU UUID:`, `Device Minor:` and `Bus Location:` lines.
fn parse_information(text: &str) -> DriverGpu {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    DriverGpu {
        uuid: field("GPU UUID").filter(|u| is_uuid(u)),
        minor: field("Device Minor").and_then(|m| m.parse().ok()),
        bus: field("Bus Location").and_then(|b| PciAddress::parse(&b)),
    }
}

/// The job's GPUs, each with what `check --device` is given. `Error::Usage` (exit 2) for a
/// configuration error: a list that does not parse, a UUID or a device minor the driver's
/// listing does not have (gres.conf and the driver disagree). `Error::CannotRun` (exit 3) when
/// which GPU a number is cannot be told: device minors without the driver's listing.
fn job_gpus(args: &SlurmArgs) -> Result<Vec<JobGpu>, Error> {
    let Some((var, list)) = job_gpu_list() else {
        return Ok(Vec::new());
    };
    let ids = parse_ids(var, &list).map_err(Error::Usage)?;
    let listing = driver_listing(&args.proc_gpus);
    let mut gpus = Vec::new();
    for id in ids {
        let gpu = match (&id, &listing) {
            (Id::Number(n), _) if args.ids == GpuIds::Index => JobGpu {
                id: n.to_string(),
                selector: n.to_string(),
                driver: None,
            },
            (Id::Number(n), Ok(listed)) => {
                let Some(entry) = listed.iter().find(|g| g.minor == Some(*n)) else {
                    let minors: BTreeSet<u32> = listed.iter().filter_map(|g| g.minor).collect();
                    return Err(Error::Usage(format!(
                        "job GPU {n} (in {var}) is a device minor the driver does not list \
                         (it lists {}): gres.conf and the driver disagree",
                        list_or_none(minors.iter())
                    )));
                };
                let Some(uuid) = entry.uuid.clone() else {
                    return Err(Error::CannotRun(format!(
                        "the driver lists device minor {n} without a GPU UUID: which GPU it \
                         is cannot be told"
                    )));
                };
                JobGpu {
                    id: n.to_string(),
                    selector: uuid,
                    driver: Some(entry.clone()),
                }
            }
            (Id::Number(n), Err(why)) => {
                return Err(Error::CannotRun(format!(
                    "job GPU {n} (in {var}) is a device minor and {why}: which GPU it is cannot \
                     be told, and taken as an NVML index it could name another job's GPU \
                     (`--ids index`, GPUDIAG_GPU_IDS=index in the Slurm scripts, says the numbers are \
                     NVML indices)"
                )));
            }
            (Id::Uuid(u), Ok(listed)) if u.to_ascii_uppercase().starts_with("GPU-") => {
                let Some(entry) = listed
                    .iter()
                    .find(|g| g.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u)))
                else {
                    return Err(Error::Usage(format!(
                        "job GPU {} (in {var}) is no GPU the driver lists (it lists {}): the \
                         job's GPUs and this node's disagree",
                        quoted(u),
                        list_or_none(listed.iter().filter_map(|g| g.uuid.as_ref()))
                    )));
                };
                JobGpu {
                    id: u.clone(),
                    selector: u.clone(),
                    driver: Some(entry.clone()),
                }
            }
            // A MIG instance (the listing names whole GPUs), or no listing to look in.
            (Id::Uuid(u), _) => JobGpu {
                id: u.clone(),
                selector: u.clone(),
                driver: None,
            },
        };
        gpus.push(gpu);
    }
    Ok(gpus)
}

fn list_or_none<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let all: Vec<String> = items.map(|i| i.to_string()).collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// A check report read back: `Err` says why there is none to act on.
fn read_report(path: &Path) -> Result<Value, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open it ({e})"))?;
    let mut bytes = Vec::new();
    file.take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it ({e})"))?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(format!("larger than {} MiB", MAX_READ_BYTES >> 20));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("empty".into());
    }
    let report: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("not a JSON document ({e})"))?;
    match report.get("status").and_then(Value::as_str) {
        Some(_) => Ok(report),
        None => Err("a JSON document without a status".into()),
    }
}

/// What the prolog acts on: a class its policy table maps to drain or log, the reason a
/// drained node carries (`sinfo -R`), and what to log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    /// `healthy`, `warn`, `fail`, `not_judged`, `could_not_run` (the report's status);
    /// `gpu_lost` (a job GPU the driver lists and NVML does not enumerate); `cannot_tell` (a
    /// job GPU NVML does not enumerate, where whether the driver lists it is not known);
    /// `config_error` (the job's GPU list cannot be used); `tool_error` (no report to read).
    class: &'static str,
    reason: String,
    detail: String,
}

impl Verdict {
    /// One line: the three fields separated by \x1f (a tab is whitespace to `read`, and two in
    /// a row, an empty reason, would merge), each escaped so that no field holds a separator
    /// or a newline. The reason is cut to what `scontrol` and `sinfo -R` show well.
    fn line(&self) -> String {
        let field = |s: &str, max: usize| printable::line(&words_within(s, max)).into_owned();
        format!(
            "{}\x1f{}\x1f{}",
            self.class,
            field(&self.reason, 200),
            field(&self.detail, 2000)
        )
    }
}

/// Short form of a value from a report, for a log line.
fn clean(v: Option<&Value>, max: usize) -> String {
    let s = match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "?".into(),
        Some(other) => other.to_string(),
    };
    words_within(&s, max)
}

/// `s` on one line, at most `max` characters, cut after a whole word with "…" where it is
/// longer: a drain reason cut mid-word ("…the NVIDIA driver installe") reads as a typo.
fn words_within(s: &str, max: usize) -> String {
    let one = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= max {
        return one;
    }
    let room: String = one.chars().take(max.saturating_sub(1)).collect();
    // A single word longer than the room is cut where the room ends.
    let kept = match room.rfind(' ') {
        Some(at) if at > 0 => &room[..at],
        _ => room.as_str(),
    };
    format!("{}…", kept.trim_end_matches([',', ';', ':']))
}

/// `gpudiag slurm prolog --report FILE`.
fn prolog_verdict(args: &SlurmArgs, report: &Path) -> Verdict {
    let gpus = match job_gpus(args) {
        Ok(gpus) => gpus,
        Err(e) => {
            return Verdict {
                class: if matches!(e, Error::CannotRun(_)) {
                    "cannot_tell"
                } else {
                    "config_error"
                },
                reason: "gpudiag: job GPUs unknown".into(),
                detail: e.to_string(),
            };
        }
    };
    let report = match read_report(report) {
        Ok(r) => r,
        Err(why) => {
            return Verdict {
                class: "tool_error",
                reason: "gpudiag: no report".into(),
                detail: format!("no JSON report: {why}"),
            };
        }
    };
    verdict_of(&report, &gpus)
}

fn verdict_of(report: &Value, gpus: &[JobGpu]) -> Verdict {
    let status = report["status"].as_str().unwrap_or_default();
    let empty = Vec::new();
    let devices = report["devices"].as_array().unwrap_or(&empty);
    let not_found: Vec<&str> = report["devices_not_found"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let could_not_run = clean(report.get("could_not_run"), 300);
    if status == "could_not_run" && !not_found.is_empty() {
        let job_gpu = |sel: &str| {
            gpus.iter()
                .find(|g| g.selector.eq_ignore_ascii_case(sel.trim()))
        };
        // Listed by the driver, gone from NVML: fallen off the bus, or the driver lost it.
        let lost: Vec<&JobGpu> = not_found
            .iter()
            .filter_map(|s| job_gpu(s))
            .filter(|g| g.driver.is_some())
            .collect();
        if let Some(first) = lost.first() {
            let bus = first
                .driver
                .as_ref()
                .and_then(|d| d.bus)
                .map_or_else(|| "bus unknown".into(), |b| b.to_string());
            let uuid = if first.id == first.selector {
                String::new()
            } else {
                format!("{}, ", first.selector)
            };
            return Verdict {
                class: "gpu_lost",
                reason: format!(
                    "gpudiag: GPU {} ({uuid}{bus}) listed by the driver, not by NVML",
                    first.id
                ),
                detail: format!(
                    "job GPU(s) {} listed in the driver's /proc files but not enumerated by \
                     NVML: {could_not_run}",
                    lost.iter()
                        .map(|g| g.id.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
        }
        return Verdict {
            class: "cannot_tell",
            reason: "gpudiag: job GPUs not found".into(),
            detail: format!(
                "NVML does not enumerate {} and whether the driver lists them is not known (an \
                 NVML index, a MIG instance, or no /proc/driver/nvidia): {could_not_run}",
                not_found.join(",")
            ),
        };
    }
    let on_gpu = |d: &Value| clean(d.pointer("/info/index"), 20);
    let no_findings: &Vec<Value> = &empty;
    let device_findings = || {
        devices.iter().flat_map(move |d| {
            d["findings"]
                .as_array()
                .unwrap_or(no_findings)
                .iter()
                .map(move |f| (on_gpu(d), f))
        })
    };
    let mut fails: Vec<(Option<String>, &Value)> = device_findings()
        .map(|(gpu, f)| (Some(gpu), f))
        .chain(
            report["host_findings"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|f| (None, f)),
        )
        .filter(|(_, f)| f["severity"] == "fail")
        .collect();
    // An active finding is the reason to drain; a cleared one only if nothing is active.
    fails.sort_by_key(|(_, f)| f["state"] != "active");
    let (class, reason, detail) = match status {
        "fail" => match fails.first() {
            Some((gpu, f)) => {
                let place = gpu
                    .as_ref()
                    .map_or_else(|| " on the host".into(), |g| format!(" on GPU {g}"));
                let detail: Vec<String> = fails
                    .iter()
                    .map(|(g, f)| {
                        let g = g.as_deref().unwrap_or("host");
                        format!(
                            "{} GPU {g}: {}",
                            clean(f.get("id"), 60),
                            clean(f.get("title"), 120)
                        )
                    })
                    .collect();
                (
                    "fail",
                    format!("gpudiag: {}{place}", clean(f.get("id"), 80)),
                    detail.join("; "),
                )
            }
            None => (
                "fail",
                "gpudiag: check failed".into(),
                "status fail without a fail finding".into(),
            ),
        },
        "could_not_run" => (
            "could_not_run",
            format!(
                "gpudiag: could not run: {}",
                words_within(&could_not_run, 80)
            ),
            could_not_run,
        ),
        "not_judged" => {
            let why: Vec<String> = report["not_judged"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .take(5)
                .map(|n| {
                    format!(
                        "{} GPU {}: {}",
                        clean(n.get("rule"), 60),
                        clean(n.get("device"), 20),
                        clean(n.get("reason"), 120)
                    )
                })
                .collect();
            (
                "not_judged",
                "gpudiag: GPUs not judged".into(),
                why.join("; "),
            )
        }
        "healthy" | "warn" => {
            let all: Vec<String> = device_findings()
                .map(|(gpu, f)| format!("{} GPU {gpu}", clean(f.get("id"), 60)))
                .collect();
            (
                if status == "warn" { "warn" } else { "healthy" },
                format!("gpudiag: {status}"),
                all.join("; "),
            )
        }
        other => (
            "tool_error",
            "gpudiag: no report".into(),
            format!(
                "a report of status {}, which this reader does not know",
                quoted(other)
            ),
        ),
    };
    Verdict {
        class,
        reason,
        detail,
    }
}

/// `gpudiag slurm epilog`: the job summary, written to `-o` (through a temporary file beside
/// it, so a reader never sees half a summary); one line on stdout says what it holds.
fn epilog_summary(args: &SlurmArgs, epilog: &SlurmEpilogArgs) -> Result<i32, Error> {
    let (gpus, gpus_error) = match job_gpus(args) {
        Ok(gpus) => (gpus, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let job_list = job_gpu_list().map(|(_, l)| l).unwrap_or_default();
    let report = match (&epilog.check_error, read_report(&epilog.report)) {
        (Some(_), _) => None,
        (None, Ok(r)) => Some(r),
        (None, Err(_)) => None,
    };
    let check_error = match (&epilog.check_error, &report) {
        (Some(e), _) => Some(e.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(format!(
            "no JSON report from gpudiag (exit {}): {}",
            epilog
                .check_exit
                .map_or("unknown".into(), |c| c.to_string()),
            read_report(&epilog.report).err().unwrap_or_default()
        )),
    };
    let empty = Vec::new();
    let devices = report
        .as_ref()
        .and_then(|r| r["devices"].as_array())
        .unwrap_or(&empty);

    // The job's PCI buses: the report's devices are the job's GPUs (checked with --device), the
    // driver's /proc files place those the report lacks. Another job's XIDs stay out; where a
    // job GPU's bus is not known, the XIDs that may be its are listed apart, not counted.
    let report_buses: BTreeSet<PciAddress> = devices
        .iter()
        .filter_map(|d| d.pointer("/info/pci_bus_id")?.as_str())
        .filter_map(PciAddress::parse)
        .collect();
    let driver_buses: BTreeSet<PciAddress> =
        gpus.iter().filter_map(|g| g.driver.as_ref()?.bus).collect();
    let unmapped: Vec<&str> = gpus
        .iter()
        .filter(|g| g.driver.as_ref().and_then(|d| d.bus).is_none())
        .map(|g| g.id.as_str())
        .collect();
    let buses: BTreeSet<PciAddress> = report_buses.union(&driver_buses).copied().collect();
    let unattributed_reason = match &gpus_error {
        Some(e) => Some(format!(
            "the job's GPUs are not known ({e}): the XIDs may be its or another job's"
        )),
        None if !unmapped.is_empty() && report_buses.len() < gpus.len() => Some(format!(
            "job GPU(s) {} not mapped to a PCI bus (no report from gpudiag naming them, no \
             /proc/driver/nvidia entry): the XIDs of other buses may be theirs or another job's",
            unmapped.join(" ")
        )),
        None => None,
    };

    let (xids, other_xids, xids_cut) = match &epilog.kernel_log {
        Some(path) => job_xids(path, epilog, &buses)?,
        None => (Vec::new(), Vec::new(), false),
    };
    let finding = |f: &Value, keys: &[&str]| -> Value {
        keys.iter()
            .map(|k| (k.to_string(), f.get(*k).cloned().unwrap_or(Value::Null)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let check = report.as_ref().map(|r| {
        let mut findings: Vec<Value> = devices
            .iter()
            .flat_map(|d| d["findings"].as_array().unwrap_or(&empty).iter())
            .map(|f| finding(f, &["id", "severity", "device", "state", "title"]))
            .collect();
        findings.extend(
            r["host_findings"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|f| finding(f, &["id", "severity", "state", "title"])),
        );
        json!({
            "status": r.get("status"),
            "exit_code": r.get("exit_code"),
            "could_not_run": r.get("could_not_run"),
            "devices_not_found": r.get("devices_not_found"),
            "findings": findings,
            "report_file": format!("job-{}.check.json", epilog.job),
        })
    });
    // The job's processes are gone by now: what still holds its GPUs was left behind.
    let leftover: Vec<Value> = devices
        .iter()
        .flat_map(|d| {
            d.pointer("/latest/processes")
                .and_then(Value::as_array)
                .unwrap_or(&empty)
                .iter()
                .map(move |p| {
                    json!({
                        "device": d.pointer("/info/index"),
                        "uuid": d.pointer("/info/uuid"),
                        "pid": p.get("pid"),
                        "name": p.get("name"),
                        "user": p.get("user"),
                        "used_memory_bytes": p.get("used_memory_bytes"),
                    })
                })
        })
        .collect();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let summary = json!({
        "kind": "gpudiag-slurm-epilog",
        "version": 1,
        "job_id": epilog.job,
        "user": epilog.user,
        "node": epilog.node,
        "job_gpus": job_list,
        "job_gpus_error": gpus_error,
        "job_start_s": epilog.job_start,
        "epilog_s": now_s,
        "check": check,
        "check_error": check_error,
        "kernel_xids": {
            "source": epilog.kernel_log_source,
            "error": epilog.kernel_log_error,
            // None where no job GPU's bus is known: an empty list would say "no XID".
            "xids": (if buses.is_empty() { Value::Null } else { xids.clone().into() }),
            "not_attributed": unattributed_reason.as_ref().map(|reason| json!({
                "reason": reason,
                "xids": other_xids,
            })),
            "cut_at": xids_cut.then_some(MAX_XIDS),
        },
        "leftover_processes": leftover,
    });
    let text = serde_json::to_string_pretty(&summary)
        .map(gpudiag_model::printable::json_c1)
        .map_err(|e| Error::CannotRun(format!("could not serialise the summary: {e}")))?;
    write_beside(&epilog.output, &format!("{text}\n"))?;
    let status = report
        .as_ref()
        .map_or("no report".into(), |r| clean(r.get("status"), 40));
    let more = if unattributed_reason.is_some() {
        format!(" ({} more not attributed)", other_xids.len())
    } else {
        String::new()
    };
    super::print_text(&format!(
        "status {status}, {} XID(s){more}, {} process(es) left behind\n",
        xids.len(),
        leftover.len()
    ))?;
    Ok(exit::OK)
}

/// Writes `text` to `path` through a temporary file beside it.
fn write_beside(path: &Path, text: &str) -> Result<(), Error> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(
            format!("renaming {} to {}", tmp.display(), path.display()),
            e,
        )
    })
}

/// The kernel log's XIDs since the job began: those on the job's `buses`, and the others.
/// journald filtered by time itself; `dmesg --time-format iso` lines are filtered here. The
/// third value says the lists were cut at [`MAX_XIDS`].
fn job_xids(
    path: &Path,
    epilog: &SlurmEpilogArgs,
    buses: &BTreeSet<PciAddress>,
) -> Result<(Vec<Value>, Vec<Value>, bool), Error> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut bytes = Vec::new();
    file.take(MAX_READ_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let text = String::from_utf8_lossy(&bytes);
    let (mut mine, mut others, mut cut) = (Vec::new(), Vec::new(), false);
    for line in text.lines() {
        let Some((pci, xid)) = parse_xid(line) else {
            continue;
        };
        if epilog.kernel_log_source == "dmesg"
            && let (Some(start), Some(when)) = (
                epilog.job_start,
                line.split_whitespace().next().and_then(iso_seconds),
            )
            && when < start as i64
        {
            continue;
        }
        let list = if buses.contains(&pci) {
            &mut mine
        } else {
            &mut others
        };
        if list.len() >= MAX_XIDS {
            cut = true;
            continue;
        }
        let shown: String = line.trim().chars().take(400).collect();
        list.push(json!({
            "xid": xid,
            "pci": pci.to_string(),
            "line": printable::line(&shown),
        }));
    }
    Ok((mine, others, cut))
}

/// Seconds since the epoch of an ISO 8601 time as `dmesg --time-format iso` writes it
/// (`2026-01-01T00:00:01,123456+00:00`); `None` for anything else.
fn iso_seconds(s: &str) -> Option<i64> {
    let (date, rest) = s.split_once('T')?;
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let zone_at = rest.find(['+', '-', 'Z'])?;
    let (clock, zone) = rest.split_at(zone_at);
    let clock = clock.split([',', '.']).next()?;
    let mut c = clock.split(':');
    let (hh, mm, ss): (i64, i64, i64) = (
        c.next()?.parse().ok()?,
        c.next()?.parse().ok()?,
        c.next()?.parse().ok()?,
    );
    let offset = match zone {
        "Z" => 0,
        _ => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let digits: String = zone[1..].chars().filter(char::is_ascii_digit).collect();
            if digits.len() != 4 {
                return None;
            }
            sign * (digits[..2].parse::<i64>().ok()? * 3600 + digits[2..].parse::<i64>().ok()? * 60)
        }
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss - offset)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reason_is_cut_after_a_whole_word() {
        use super::words_within;
        let why =
            "NVIDIA driver library libnvidia-ml.so.1 not found: is the NVIDIA driver installed?";
        let cut = words_within(why, 70);
        assert_eq!(
            cut,
            "NVIDIA driver library libnvidia-ml.so.1 not found: is the NVIDIA…"
        );
        assert!(cut.chars().count() <= 70);
        assert_eq!(words_within("short  and\nplain", 70), "short and plain");
        assert_eq!(words_within("abcdefghij", 5), "abcd…");
    }

    use super::*;

    #[test]
    fn job_gpu_lists_parse_or_say_which_item_is_wrong() {
        let ids = parse_ids("SLURM_JOB_GPUS", " 0, 2-3 ,,GPU-ab12-cd,3").unwrap();
        assert_eq!(
            ids,
            [
                Id::Number(0),
                Id::Number(2),
                Id::Number(3),
                Id::Uuid("GPU-ab12-cd".into())
            ]
        );
        assert_eq!(
            parse_ids("CUDA_VISIBLE_DEVICES", "MIG-GPU-ab12/1/0").unwrap(),
            [Id::Uuid("MIG-GPU-ab12/1/0".into())]
        );
        for bad in [
            "1;rm",
            "-1",
            "3-1",
            "0-99999",
            "GPU-",
            "gpu0",
            "NoDevFiles",
            "1 2",
        ] {
            let e = parse_ids("SLURM_JOB_GPUS", bad).unwrap_err();
            assert!(e.contains("SLURM_JOB_GPUS"), "{bad}: {e}");
        }
        let e = parse_ids("X", "\u{1b}[31m").unwrap_err();
        assert!(!e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn dmesg_iso_times_read_as_epoch_seconds() {
        assert_eq!(iso_seconds("1970-01-01T00:00:00,000000+00:00"), Some(0));
        assert_eq!(
            iso_seconds("2026-01-01T00:00:01,123456+00:00"),
            Some(1_767_225_601)
        );
        assert_eq!(iso_seconds("2026-01-01T01:00:01+0100"), Some(1_767_225_601));
        assert_eq!(iso_seconds("[ 12.3]"), None);
    }
}
