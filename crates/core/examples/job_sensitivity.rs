//! How sensitive the job verdict is: replays recordings of multi-GPU jobs whose truth is known
//! (a `<name>.truth.json` beside each), and at every `--step` of recorded time judges the job
//! over each `--window` that ends there, as `check --window` would at that moment. Prints per
//! case and window length what the verdict saw (the lead ratio, the lag, the named straggler)
//! and a confusion matrix (truth × verdict) per window length.
//!
//! ```text
//! cargo run -p gpudiag-core --example job_sensitivity -- [--window 10,20,30] [--step 5]
//!     [--set job.lead_ratio=1.08 ...] [--windows-out FILE] RECORDING_OR_DIR ...
//! ```
//!
//! The ticks go through the same pipeline every command uses; each window is judged by the
//! engine's own `finish_within`, the first thing a check's final judgement does, so a window here
//! reads what `check --replay FILE --window W` would read had the recording ended there.
//! `--set` changes a `[rules]` threshold through the configuration parser (`section.key=value`),
//! to see what another threshold would have said. The truth file is described in
//! `docs/jobs.md` ("Sensitivity").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gpudiag_core::config::Config;
use gpudiag_core::pipeline::Pipeline;
use gpudiag_core::session::{Origin, Session, SourceSpec};
use gpudiag_model::job::{JobPattern, JobVerdict, PeerFigures};
use gpudiag_model::sample::TimeMs;
use gpudiag_telemetry::BackendError;
use serde_json::{Value, json};

const USAGE: &str = "usage: job_sensitivity [--window 10,20,30] [--step 5] \
                     [--set section.key=value]... [--windows-out FILE] RECORDING_OR_DIR...";

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e == "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("job_sensitivity: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("job_sensitivity: {e}");
            ExitCode::from(1)
        }
    }
}

struct Args {
    windows_s: Vec<u64>,
    step_s: u64,
    /// `[rules.SECTION] KEY = VALUE` lines, by section.
    set: BTreeMap<String, Vec<String>>,
    windows_out: Option<PathBuf>,
    paths: Vec<PathBuf>,
}

impl Args {
    fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut args = Args {
            windows_s: vec![10, 20, 30],
            step_s: 5,
            set: BTreeMap::new(),
            windows_out: None,
            paths: Vec::new(),
        };
        while let Some(a) = it.next() {
            let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
            match a.as_str() {
                "--window" => {
                    args.windows_s = value("--window")?
                        .split(',')
                        .map(|w| seconds(w.trim()))
                        .collect::<Result<_, _>>()?;
                }
                "--step" => args.step_s = seconds(&value("--step")?)?,
                "--set" => {
                    let v = value("--set")?;
                    let (key, val) = v
                        .split_once('=')
                        .ok_or(format!("--set {v}: expected section.key=value"))?;
                    let (section, knob) = key
                        .split_once('.')
                        .ok_or(format!("--set {v}: expected section.key=value"))?;
                    args.set
                        .entry(section.trim().to_owned())
                        .or_default()
                        .push(format!("{} = {}", knob.trim(), val.trim()));
                }
                "--windows-out" => args.windows_out = Some(value("--windows-out")?.into()),
                "-h" | "--help" => return Err("help".to_owned()),
                flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
                path => args.paths.push(path.into()),
            }
        }
        if args.paths.is_empty() {
            return Err("no recording given".to_owned());
        }
        if args.windows_s.is_empty() {
            return Err("--window: no window given".to_owned());
        }
        Ok(args)
    }

    /// The configuration: the defaults with `--set`'s thresholds, through the parser `gpudiag
    /// --config` uses (so a misspelt key or an absurd value is refused the same way).
    fn config(&self) -> Result<Config, String> {
        let mut text = String::new();
        for (section, lines) in &self.set {
            let _ = writeln!(text, "[rules.{section}]");
            for l in lines {
                let _ = writeln!(text, "{l}");
            }
        }
        Config::parse(&text, "--set").map_err(|e| e.to_string())
    }
}

/// A whole number of seconds, at least one.
fn seconds(s: &str) -> Result<u64, String> {
    match s.trim_end_matches('s').parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s}: expected whole seconds (1 or more)")),
    }
}

/// What one job of a recording was made to be, from the recording's `.truth.json`.
#[derive(Debug, Clone)]
struct Truth {
    /// The recording's name, and the job's GPUs where the recording holds several jobs.
    case: String,
    kind: Kind,
    /// The job's GPUs, where the file lists them.
    gpus: Option<Vec<u32>>,
    /// The GPU the case is about: slowed, hung, stopped, exited, checkpointing.
    device: Option<u32>,
    /// The rank the case is about, where the file names a rank rather than a GPU.
    rank: Option<u32>,
    /// How much more work the slowed rank does (1.1: 10% more).
    factor: Option<f64>,
    workload: Option<String>,
    /// From when the job ran its steady steps, and when it ended (ms since the Unix epoch):
    /// only windows inside are judged.
    ready_ms: Option<TimeMs>,
    end_ms: Option<TimeMs>,
    /// When the case begins (`None`: from `ready_ms`) and ends (a checkpoint's pause); outside
    /// it the job runs balanced.
    stall_from_ms: Option<TimeMs>,
    stall_to_ms: Option<TimeMs>,
    /// The recording's GPU model, once read.
    model: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Balanced,
    Slow,
    Hung,
    Stopped,
    Exited,
    Checkpoint,
    Other(String),
}

impl Kind {
    fn from_word(w: &str) -> Kind {
        match w.to_ascii_lowercase().replace(['-', ' '], "_").as_str() {
            "balanced" => Kind::Balanced,
            "slow" | "slowed" | "straggler" | "slow_rank" => Kind::Slow,
            "hung" | "hang" => Kind::Hung,
            "stopped" | "sigstop" | "rank_stopped" => Kind::Stopped,
            "exited" | "killed" | "sigkill" | "rank_exited" => Kind::Exited,
            "checkpoint" | "pause" => Kind::Checkpoint,
            other => Kind::Other(other.to_owned()),
        }
    }
}

impl Truth {
    /// Reads `path`: `{"jobs": [JOB, ...]}`, or one JOB alone, each JOB an object of `case` (the
    /// kind), `gpus` (a list), `slowed_device` or `missing_device` (or `missing_rank`),
    /// `factor`, `model`, and the times `ready_ms`, `stall_from_ms`, `stall_to_ms`, `end_ms`.
    /// Returns the jobs and the keys not used, so the caller can name them.
    fn read(path: &Path, stem: &str) -> Result<(Vec<Truth>, Vec<String>), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let jobs: Vec<&serde_json::Map<String, Value>> = match &v {
            Value::Object(m) => match m.get("jobs") {
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_object).collect(),
                _ => vec![m],
            },
            _ => Vec::new(),
        };
        if jobs.is_empty() {
            return Err(format!("{}: expected an object with jobs", path.display()));
        }
        let several = jobs.len() > 1;
        let mut unused = Vec::new();
        let mut out = Vec::new();
        for map in jobs {
            let (truth, mut left) = Truth::of(map, stem, several);
            unused.append(&mut left);
            out.push(truth);
        }
        unused.sort();
        unused.dedup();
        Ok((out, unused))
    }

    fn of(map: &serde_json::Map<String, Value>, stem: &str, several: bool) -> (Truth, Vec<String>) {
        let mut used: Vec<&str> = Vec::new();
        let mut get = |keys: &[&'static str]| -> Option<&Value> {
            keys.iter().find_map(|k| {
                let v = map.get(*k).filter(|v| !v.is_null())?;
                used.push(k);
                Some(v)
            })
        };
        let uint = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as u32);
        let gpus: Option<Vec<u32>> = get(&["gpus", "devices"]).and_then(|v| {
            v.as_array().map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|n| n as u32)
                    .collect()
            })
        });
        let device = uint(get(&["slowed_device", "missing_device", "device"]));
        let rank = uint(get(&["missing_rank", "slowed_rank", "rank"]));
        let factor = get(&["factor"]).and_then(Value::as_f64);
        let workload = get(&["model", "workload"])
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut time = |key: &'static str| get(&[key]).and_then(Value::as_u64);
        let ready_ms = time("ready_ms");
        let end_ms = time("end_ms");
        let stall_from_ms = time("stall_from_ms");
        let stall_to_ms = time("stall_to_ms");
        let kind = get(&["case", "kind"])
            .and_then(Value::as_str)
            .map(Kind::from_word)
            .unwrap_or(Kind::Other("unstated".to_owned()));
        // A rank slowed by 1.0 is a balanced job.
        let kind = match kind {
            Kind::Slow if factor.is_some_and(|f| f <= 1.0) => Kind::Balanced,
            k => k,
        };
        // Said for people, or by benches/cut_recording.py: nothing to judge by.
        let notes = ["note", "pid", "cut_from_s"];
        let unused = map
            .keys()
            .filter(|k| !used.contains(&k.as_str()) && !notes.contains(&k.as_str()))
            .cloned()
            .collect();
        let case = match (&gpus, several) {
            (Some(g), true) => format!(
                "{stem} [{}]",
                g.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ),
            _ => stem.to_owned(),
        };
        (
            Truth {
                case,
                kind,
                gpus,
                device,
                rank,
                factor,
                workload,
                ready_ms,
                end_ms,
                stall_from_ms,
                stall_to_ms,
                model: None,
            },
            unused,
        )
    }

    /// The row a window of the case falls in while the case holds.
    fn label(&self) -> String {
        match &self.kind {
            Kind::Balanced => "balanced".to_owned(),
            Kind::Slow => match self.factor {
                Some(f) => format!("slow {}×", trim_float(f)),
                None => "slow".to_owned(),
            },
            Kind::Hung => "hung".to_owned(),
            Kind::Stopped => "stopped".to_owned(),
            Kind::Exited => "exited".to_owned(),
            Kind::Checkpoint => "checkpoint".to_owned(),
            Kind::Other(w) => w.clone(),
        }
    }

    /// The truth row of the window `[start, end]`: `None` outside the job's steady span (its
    /// warm-up, its end), `transition` across the start or end of its stall.
    fn row(&self, start: TimeMs, end: TimeMs) -> Option<String> {
        if self.ready_ms.is_some_and(|r| start < r) || self.end_ms.is_some_and(|e| end > e) {
            return None;
        }
        let Some(from) = self.stall_from_ms else {
            return Some(self.label());
        };
        let to = self.stall_to_ms.unwrap_or(TimeMs::MAX);
        Some(if end < from || start > to {
            "balanced".to_owned()
        } else if start >= from && end <= to {
            self.label()
        } else {
            "transition".to_owned()
        })
    }
}

fn trim_float(f: f64) -> String {
    let s = format!("{f:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// What one window of a case showed.
struct Window {
    case: String,
    gpus: u32,
    window_s: u64,
    /// The window's end, seconds after the recording's first tick.
    end_s: f64,
    /// The truth row: the case's label; `balanced` outside its stall, `transition` across its
    /// start or end.
    truth: String,
    /// The workload the truth names (`?` where it names none).
    workload: String,
    /// The confusion matrix's row: the truth and the workload.
    row: String,
    /// The column: what the job verdict said.
    got: String,
    /// Whether the verdict named the case's GPU as it should (a straggler that GPU alone, or the
    /// GPU a stalled job misses); `None` where the case names no GPU.
    named_right: Option<bool>,
    /// The case's GPU in this window (the truth's, or its rank's GPU).
    device: Option<u32>,
    seen: Option<Seen>,
    /// Why the job was not judged, where it was not.
    not_judged: Option<String>,
    jobs: usize,
}

/// The figures a window's job verdict compared.
struct Seen {
    verdict: JobVerdict,
    work_key: String,
    /// The top GPU's work over the median of the rest's, and which GPU is on top.
    lead_ratio: Option<f64>,
    lead_device: Option<u32>,
    /// The top GPU's SM active minus the rest's median (points), when SM active was compared.
    lead_points: Option<f64>,
    /// The case's GPU's work over the median of the others', and the same as a difference in
    /// SM active (points).
    case_lead_ratio: Option<f64>,
    case_points: Option<f64>,
    /// Each GPU's work figure, by device.
    works: Vec<(u32, f64)>,
    /// The largest gap (points) between a GPU's utilisation and its peers' median, and whose.
    lag_points: Option<f64>,
    lag_device: Option<u32>,
    peers_util_median: Option<f64>,
}

fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

fn work_of(key: &str, p: &PeerFigures) -> Option<f64> {
    match key {
        "sm_active_pct" => p.sm_active_pct,
        "gpu_util_pct" => p.gpu_util_pct,
        _ => p.power_w,
    }
}

impl Seen {
    fn of(verdict: &JobVerdict, case_device: Option<u32>) -> Seen {
        let peers = &verdict.peers;
        let work_key = verdict
            .evidence
            .get("compared")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| {
                if peers.iter().all(|p| p.sm_active_pct.is_some()) {
                    "sm_active_pct".to_owned()
                } else {
                    "power_w".to_owned()
                }
            });
        let works: Vec<(u32, f64)> = peers
            .iter()
            .filter_map(|p| Some((p.device, work_of(&work_key, p)?)))
            .collect();
        let rest_of =
            |device: u32| median(works.iter().filter(|(d, _)| *d != device).map(|&(_, w)| w));
        let top = works
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .filter(|_| works.len() == peers.len() && works.len() >= 2);
        let lead = top.and_then(|(d, w)| {
            let rest = rest_of(d)?;
            Some((d, w, rest))
        });
        let lead_ratio = lead.and_then(|(_, w, rest)| (rest > 0.0).then(|| w / rest));
        let lead_points = lead
            .filter(|_| work_key == "sm_active_pct")
            .map(|(_, w, rest)| w - rest);
        let case = case_device.and_then(|dev| {
            let own = works.iter().find(|(d, _)| *d == dev)?.1;
            Some((own, rest_of(dev)?))
        });
        let case_lead_ratio = case.and_then(|(own, rest)| (rest > 0.0).then(|| own / rest));
        let case_points = case
            .filter(|_| work_key == "sm_active_pct")
            .map(|(own, rest)| own - rest);
        let lag = peers
            .iter()
            .filter_map(|p| {
                let own = p.gpu_util_pct?;
                let others = median(
                    peers
                        .iter()
                        .filter(|q| q.device != p.device)
                        .filter_map(|q| q.gpu_util_pct),
                )?;
                Some((p.device, others - own, others))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        Seen {
            verdict: verdict.clone(),
            work_key,
            lead_ratio,
            lead_device: lead.map(|(d, _, _)| d),
            lead_points,
            case_lead_ratio,
            case_points,
            works,
            lag_points: lag.map(|l| l.1),
            lag_device: lag.map(|l| l.0),
            peers_util_median: lag.map(|l| l.2),
        }
    }
}

/// The columns of the confusion matrix, in order.
const COLUMNS: [&str; 10] = [
    "balanced",
    "straggler, its GPU",
    "straggler, other GPU",
    "imbalanced",
    "communication_bound",
    "hung",
    "rank_stopped",
    "rank_exited",
    "not judged",
    "no job",
];

/// The column a verdict falls in for a case about `device`.
fn column(v: &JobVerdict, device: Option<u32>) -> &'static str {
    match v.verdict {
        JobPattern::Balanced => "balanced",
        JobPattern::Straggler => {
            let named: Vec<u32> = v.stragglers.iter().map(|s| s.device).collect();
            if device.is_some_and(|d| named == [d]) {
                "straggler, its GPU"
            } else {
                "straggler, other GPU"
            }
        }
        JobPattern::Imbalanced => "imbalanced",
        JobPattern::CommunicationBound => "communication_bound",
        JobPattern::Hung => "hung",
        JobPattern::RankStopped => "rank_stopped",
        JobPattern::RankExited => "rank_exited",
    }
}

/// Whether the verdict named the case's GPU as the case wants.
fn named_right(v: &JobVerdict, truth: &Kind, device: Option<u32>) -> Option<bool> {
    let device = device?;
    let missing = |d: u32| {
        v.stall
            .as_ref()
            .is_some_and(|s| s.missing.iter().any(|m| m.device == d))
    };
    Some(match truth {
        Kind::Slow | Kind::Checkpoint | Kind::Other(_) => {
            v.verdict == JobPattern::Straggler
                && v.stragglers.len() == 1
                && v.stragglers[0].device == device
        }
        Kind::Hung => v.verdict == JobPattern::Hung && missing(device),
        Kind::Stopped => v.verdict == JobPattern::RankStopped && missing(device),
        Kind::Exited => v.verdict == JobPattern::RankExited && missing(device),
        Kind::Balanced => return None,
    })
}

/// The truth files given, each with its recording.
fn cases(paths: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|e| recording_stem(e).is_some())
                .collect();
            entries.sort();
            let mut skipped = Vec::new();
            for rec in entries {
                let truth = truth_path(&rec);
                if truth.is_file() {
                    out.push((rec, truth));
                } else {
                    skipped.push(recording_stem(&rec).unwrap_or_default());
                }
            }
            if !skipped.is_empty() {
                eprintln!(
                    "{}: {} recordings without a .truth.json skipped: {}",
                    p.display(),
                    skipped.len(),
                    skipped.join(", ")
                );
            }
        } else {
            let truth = truth_path(p);
            if !truth.is_file() {
                return Err(format!(
                    "{}: no truth file {} beside it",
                    p.display(),
                    truth.display()
                ));
            }
            out.push((p.clone(), truth));
        }
    }
    Ok(out)
}

/// `NAME` of `NAME.ndjson.gz` or `NAME.ndjson`.
fn recording_stem(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(".ndjson.gz")
        .or_else(|| name.strip_suffix(".ndjson"))
        .map(str::to_owned)
}

fn truth_path(recording: &Path) -> PathBuf {
    let stem = recording_stem(recording).unwrap_or_default();
    recording.with_file_name(format!("{stem}.truth.json"))
}

/// Replays one recording, judging every window, and gives each window one row per job of the
/// truth.
fn measure(
    config: &Config,
    recording: &Path,
    truths: &[Truth],
    windows_s: &[u64],
    step_s: u64,
) -> Result<(Vec<Window>, Option<String>), String> {
    let spec = SourceSpec::new(Origin::File(recording.to_path_buf()));
    let mut session = Session::setup(config)
        .open(&spec)
        .map_err(|e| format!("{}: {e}", recording.display()))?;
    let model = session.devices.first().and_then(|d| d.name.clone());
    let Some(mut source) = session.take_source() else {
        return Ok((Vec::new(), model));
    };
    let shortest = windows_s.iter().copied().min().unwrap_or(10) * 1000;
    let step = step_s * 1000;
    let mut first: Option<TimeMs> = None;
    let mut next_end: Option<TimeMs> = None;
    let mut out = Vec::new();
    loop {
        let tick = match source.backend.poll() {
            Ok(t) => t,
            Err(BackendError::EndOfRecording) => break,
            Err(e) => return Err(format!("{}: {e}", recording.display())),
        };
        let tick = source.selected.apply(tick);
        let now = tick.samples.iter().map(|s| s.time_ms).max();
        session.pipeline.push(tick);
        let Some(now) = now else {
            continue;
        };
        let t0 = *first.get_or_insert(now);
        let target = next_end.get_or_insert(t0 + shortest);
        if now < *target {
            continue;
        }
        while *target <= now {
            *target += step;
        }
        for &w in windows_s {
            let w_ms = w * 1000;
            if now < t0 + w_ms {
                continue;
            }
            // `(now − w, now]`, the half-open window `check --window` judges.
            let start = now + 1 - w_ms;
            let rows: Vec<(&Truth, String)> = truths
                .iter()
                .filter_map(|t| Some((t, t.row(start, now)?)))
                .collect();
            if rows.is_empty() {
                continue;
            }
            let p = &mut session.pipeline;
            p.engine.finish_within(&p.history, start, now);
            for (truth, row) in rows {
                out.push(window_of(p, truth, row, w, t0, now));
            }
        }
    }
    for w in &session.warnings {
        eprintln!("{}: {w}", recording.display());
    }
    Ok((out, model))
}

/// What the judgement just made says of `truth`'s job.
fn window_of(
    pipeline: &Pipeline,
    truth: &Truth,
    row: String,
    window_s: u64,
    t0: TimeMs,
    end: TimeMs,
) -> Window {
    let jobs = pipeline.engine.jobs();
    // The job the truth is about: the one on its GPUs, else the one holding its GPU, else the
    // largest.
    let on_gpus = |j: &JobVerdict| {
        truth.gpus.as_ref().is_some_and(|g| {
            let mut d: Vec<u32> = j.devices().collect();
            d.sort_unstable();
            let mut want = g.clone();
            want.sort_unstable();
            d == want
        })
    };
    let holds = |j: &JobVerdict, d: Option<u32>| d.is_some_and(|d| j.devices().any(|g| g == d));
    let job = jobs
        .iter()
        .find(|j| on_gpus(j))
        .or_else(|| jobs.iter().find(|j| holds(j, truth.device)))
        .or_else(|| {
            truth
                .gpus
                .is_none()
                .then(|| jobs.iter().max_by_key(|j| j.members.len()))
                .flatten()
        });
    // The case's GPU, where the truth names a rank only: the job's member of that rank.
    let device = truth.device.or_else(|| {
        let rank = truth.rank?;
        job?.members
            .iter()
            .find(|m| m.rank == Some(rank))
            .map(|m| m.device)
    });
    let kind_now = if row == "balanced" {
        Kind::Balanced
    } else {
        truth.kind.clone()
    };
    let not_judged = pipeline
        .engine
        .not_judged()
        .iter()
        .find(|n| n.rule == "job")
        .map(|n| n.reason.clone());
    let (got, named, seen) = match job {
        Some(v) => (
            column(v, device).to_owned(),
            named_right(v, &kind_now, device),
            Some(Seen::of(v, device)),
        ),
        None if not_judged.is_some() => ("not judged".to_owned(), None, None),
        None => ("no job".to_owned(), None, None),
    };
    Window {
        case: truth.case.clone(),
        gpus: truth
            .gpus
            .as_ref()
            .map(|g| g.len() as u32)
            .or(job.map(|j| j.members.len() as u32))
            .unwrap_or(0),
        window_s,
        end_s: end.saturating_sub(t0) as f64 / 1000.0,
        workload: truth.workload.clone().unwrap_or_else(|| "?".to_owned()),
        row: if row == "transition" {
            row.clone()
        } else {
            format!("{row} ({})", truth.workload.as_deref().unwrap_or("?"))
        },
        truth: row,
        got,
        named_right: named,
        device,
        seen,
        not_judged: job.is_none().then_some(not_judged).flatten(),
        jobs: jobs.len(),
    }
}

fn run(args: &Args) -> Result<(), String> {
    let config = args.config()?;
    let cases = cases(&args.paths)?;
    if cases.is_empty() {
        return Err("no recording with a truth file found".to_owned());
    }
    let mut windows: Vec<Window> = Vec::new();
    let mut truths: Vec<Truth> = Vec::new();
    for (recording, truth_file) in &cases {
        let stem = recording_stem(recording).unwrap_or_default();
        let (mut found, unused) = Truth::read(truth_file, &stem)?;
        if !unused.is_empty() {
            eprintln!(
                "{}: keys not used: {}",
                truth_file.display(),
                unused.join(", ")
            );
        }
        let (measured, model) = measure(&config, recording, &found, &args.windows_s, args.step_s)?;
        if measured.is_empty() {
            eprintln!(
                "{}: no window of its jobs' steady span judged (shorter than the shortest window?)",
                recording.display()
            );
        }
        for t in &mut found {
            t.model = model.clone();
        }
        windows.extend(measured);
        truths.extend(found);
    }
    if let Some(path) = &args.windows_out {
        write_windows(path, &windows).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    print!("{}", report(args, &config, &truths, &windows));
    Ok(())
}

fn write_windows(path: &Path, windows: &[Window]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for w in windows {
        let s = w.seen.as_ref();
        let line = json!({
            "case": w.case,
            "gpus": w.gpus,
            "window_s": w.window_s,
            "end_s": w.end_s,
            "truth": w.truth,
            "got": w.got,
            "named_right": w.named_right,
            "jobs": w.jobs,
            "not_judged": w.not_judged,
            "detector": s.and_then(|s| s.verdict.evidence.get("detector").cloned()),
            "stragglers": s.map(|s| s.verdict.stragglers.iter().map(|x| x.device).collect::<Vec<_>>()),
            "compared": s.map(|s| s.work_key.clone()),
            "lead_ratio": s.and_then(|s| s.lead_ratio),
            "lead_device": s.and_then(|s| s.lead_device),
            "lead_points": s.and_then(|s| s.lead_points),
            "device": w.device,
            "case_lead_ratio": s.and_then(|s| s.case_lead_ratio),
            "case_points": s.and_then(|s| s.case_points),
            "works": s.map(|s| s.works.clone()),
            "lag_points": s.and_then(|s| s.lag_points),
            "lag_device": s.and_then(|s| s.lag_device),
            "peers_util_median": s.and_then(|s| s.peers_util_median),
            "title": s.map(|s| s.verdict.title.clone()),
        });
        writeln!(f, "{line}")?;
    }
    f.flush()
}

/// `min / median / max`, two decimals.
fn spread(values: &[f64]) -> String {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return "–".to_owned();
    }
    v.sort_by(f64::total_cmp);
    let med = median(v.iter().copied()).unwrap_or(f64::NAN);
    format!("{:.2} / {:.2} / {:.2}", v[0], med, v[v.len() - 1])
}

fn report(args: &Args, config: &Config, truths: &[Truth], windows: &[Window]) -> String {
    let mut out = String::new();
    let job = &config.rules.job;
    let _ = writeln!(
        out,
        "Windows of {} s, one ending every {} s of recorded time; thresholds lead_ratio {}, \
         lag_util_points {}, peers_busy_util_pct {}, min_window_s {}, hang_after_s {}.\n",
        args.windows_s
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.step_s,
        job.lead_ratio,
        job.lag_util_points,
        job.peers_busy_util_pct,
        job.min_window_s,
        job.hang_after_s,
    );
    let _ = writeln!(
        out,
        "| case | truth | GPUs | window | windows | lead ×, top GPU / rest: min / median / max | \
         its GPU's lead × | its GPU on top | SM gap (points), median | lag (points), max | \
         its GPU named | false positives (balanced windows) | verdicts |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for t in truths {
        for &w in &args.windows_s {
            let mine: Vec<&Window> = windows
                .iter()
                .filter(|x| x.case == t.case && x.window_s == w)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let seen: Vec<&Seen> = mine.iter().filter_map(|x| x.seen.as_ref()).collect();
            let leads: Vec<f64> = seen.iter().filter_map(|s| s.lead_ratio).collect();
            let case_leads: Vec<f64> = seen.iter().filter_map(|s| s.case_lead_ratio).collect();
            let gaps: Vec<f64> = seen.iter().filter_map(|s| s.lead_points).collect();
            let lags: Vec<f64> = seen.iter().filter_map(|s| s.lag_points).collect();
            let with_device: Vec<(&Seen, u32)> = mine
                .iter()
                .filter_map(|x| Some((x.seen.as_ref()?, x.device?)))
                .collect();
            let on_top = if with_device.is_empty() {
                "–".to_owned()
            } else {
                format!(
                    "{}/{}",
                    with_device
                        .iter()
                        .filter(|(s, d)| s.lead_device == Some(*d))
                        .count(),
                    with_device.len()
                )
            };
            let asked: Vec<bool> = mine
                .iter()
                .filter(|x| x.truth != "balanced" && x.truth != "transition")
                .filter_map(|x| x.named_right)
                .collect();
            let named = if asked.is_empty() {
                "–".to_owned()
            } else {
                format!("{}/{}", asked.iter().filter(|&&b| b).count(), asked.len())
            };
            let balanced: Vec<&&Window> = mine.iter().filter(|x| x.truth == "balanced").collect();
            let fp = if balanced.is_empty() {
                "–".to_owned()
            } else {
                format!(
                    "{}/{}",
                    balanced.iter().filter(|x| x.got != "balanced").count(),
                    balanced.len()
                )
            };
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for x in &mine {
                *counts.entry(x.got.as_str()).or_default() += 1;
            }
            let verdicts = COLUMNS
                .iter()
                .filter_map(|c| counts.get(c).map(|n| format!("{c} {n}")))
                .collect::<Vec<_>>()
                .join(", ");
            let lag_max = lags.iter().copied().fold(f64::NAN, f64::max);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {w} s | {} | {} | {} | {on_top} | {} | {} | {named} | {fp} | {verdicts} |",
                t.case,
                t.label()
                    + &t.workload
                        .as_ref()
                        .map(|w| format!(" ({w})"))
                        .unwrap_or_default(),
                match &t.model {
                    Some(m) => format!("{} × {m}", mine[0].gpus),
                    None => mine[0].gpus.to_string(),
                },
                mine.len(),
                spread(&leads),
                spread(&case_leads),
                median(gaps.iter().copied()).map_or("–".to_owned(), |g| format!("{g:.1}")),
                if lag_max.is_finite() {
                    format!("{lag_max:.1}")
                } else {
                    "–".to_owned()
                },
            );
        }
    }
    for &w in &args.windows_s {
        let mine: Vec<&Window> = windows.iter().filter(|x| x.window_s == w).collect();
        if mine.is_empty() {
            continue;
        }
        let mut rows: Vec<String> = Vec::new();
        for x in &mine {
            if !rows.contains(&x.row) {
                rows.push(x.row.clone());
            }
        }
        rows.sort_by_key(|r| row_order(r));
        let used: Vec<&str> = COLUMNS
            .iter()
            .copied()
            .filter(|c| mine.iter().any(|x| x.got == *c))
            .collect();
        let _ = writeln!(
            out,
            "\nConfusion matrix, {w} s windows (rows: truth, columns: the job verdict):\n"
        );
        let _ = writeln!(out, "| truth \\ verdict | {} |", used.join(" | "));
        let _ = writeln!(out, "|---|{}", "---|".repeat(used.len()));
        for r in &rows {
            let cells: Vec<String> = used
                .iter()
                .map(|c| {
                    mine.iter()
                        .filter(|x| &x.row == r && x.got == *c)
                        .count()
                        .to_string()
                })
                .collect();
            let _ = writeln!(out, "| {r} | {} |", cells.join(" | "));
        }
    }
    out.push_str(&separation(args, config, windows));
    out.push_str(&what_if(args, config, windows));
    let reasons: BTreeMap<String, usize> = windows
        .iter()
        .filter_map(|w| w.not_judged.as_ref())
        .fold(BTreeMap::new(), |mut m, r| {
            // The job's name leads each reason; what follows it is the same across jobs.
            let reason = r.split_once(": ").map_or(r.as_str(), |(_, why)| why);
            *m.entry(reason.to_owned()).or_default() += 1;
            m
        });
    if !reasons.is_empty() {
        let _ = writeln!(out, "\nNot judged, why (windows):\n");
        for (r, n) in reasons {
            let _ = writeln!(out, "- {n}: {r}");
        }
    }
    out
}

/// Balanced first, slow cases by factor, the stalls, then the rest.
fn row_order(row: &str) -> (u8, u64, String) {
    let (label, workload) = row.split_once(" (").unwrap_or((row, ""));
    let workload = workload.trim_end_matches(')').to_owned();
    if label == "balanced" {
        return (0, 0, workload);
    }
    if let Some(f) = label
        .strip_prefix("slow ")
        .and_then(|f| f.trim_end_matches('×').parse::<f64>().ok())
    {
        return (1, (f * 1000.0) as u64, workload);
    }
    let rank = match label {
        "slow" => 2,
        "checkpoint" => 3,
        "hung" => 4,
        "stopped" => 5,
        "exited" => 6,
        "transition" => 9,
        _ => 7,
    };
    (rank, 0, format!("{label} {workload}"))
}

/// The workloads the windows name, in order of first appearance.
fn workloads(windows: &[&Window]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in windows {
        if !out.contains(&w.workload) {
            out.push(w.workload.clone());
        }
    }
    out
}

/// The truths of the slow windows among `windows`, by factor.
fn slow_truths(windows: &[&Window]) -> Vec<String> {
    let mut rows: Vec<String> = Vec::new();
    for w in windows {
        if w.truth.starts_with("slow") && !rows.contains(&w.truth) {
            rows.push(w.truth.clone());
        }
    }
    rows.sort_by_key(|r| row_order(r));
    rows
}

/// Per window length and workload: how far the balanced windows' top GPU leads at most,
/// against how far each slowed GPU leads at least, in ratio and in SM points; where the two
/// overlap no lead ratio names that slow rank without a false positive.
fn separation(args: &Args, config: &Config, windows: &[Window]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nSeparation, per workload: the balanced windows' largest lead (top GPU over the rest's \
         median), SM gap and utilisation lag, against each slowed GPU's own lead (lead_ratio now \
         {}, the SM-point floor {}):\n",
        config.rules.job.lead_ratio, config.rules.job.lead_min_sm_points
    );
    let _ = writeln!(
        out,
        "| window | workload | balanced: lead × max (windows) | balanced: SM gap max (points) | \
         balanced: lag max (points) | slowed GPU: lead × min / median | slowed GPU: SM gap min / \
         median (points) | a lead ratio that separates |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let f = |v: f64, d: usize| {
        if v.is_nan() {
            "–".to_owned()
        } else {
            format!("{v:.d$}")
        }
    };
    let max = |v: Vec<f64>| v.into_iter().fold(f64::NAN, f64::max);
    let min = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::min);
    for &w in &args.windows_s {
        let all: Vec<&Window> = windows.iter().filter(|x| x.window_s == w).collect();
        for load in workloads(&all) {
            let mine: Vec<&Window> = all.iter().copied().filter(|x| x.workload == load).collect();
            let balanced: Vec<&Seen> = mine
                .iter()
                .filter(|x| x.truth == "balanced")
                .filter_map(|x| x.seen.as_ref())
                .collect();
            let bal_lead = max(balanced.iter().filter_map(|s| s.lead_ratio).collect());
            let bal_gap = max(balanced.iter().filter_map(|s| s.lead_points).collect());
            let bal_lag = max(balanced.iter().filter_map(|s| s.lag_points).collect());
            let (mut leads, mut gaps, mut separates) = (Vec::new(), Vec::new(), Vec::new());
            for row in slow_truths(&mine) {
                let seen: Vec<&Seen> = mine
                    .iter()
                    .filter(|x| x.truth == row)
                    .filter_map(|x| x.seen.as_ref())
                    .collect();
                let l: Vec<f64> = seen.iter().filter_map(|s| s.case_lead_ratio).collect();
                let g: Vec<f64> = seen.iter().filter_map(|s| s.case_points).collect();
                let lo = min(&l);
                leads.push(format!(
                    "{row}: {} / {}",
                    f(lo, 3),
                    f(median(l.iter().copied()).unwrap_or(f64::NAN), 3)
                ));
                gaps.push(format!(
                    "{row}: {} / {}",
                    f(min(&g), 1),
                    f(median(g.iter().copied()).unwrap_or(f64::NAN), 1)
                ));
                separates.push(if bal_lead.is_nan() || lo.is_nan() {
                    format!("{row}: no balanced windows to compare")
                } else if lo > bal_lead {
                    format!("{row}: ({bal_lead:.3}, {lo:.3}]")
                } else {
                    format!("{row}: none (overlap)")
                });
            }
            let or_dash = |v: Vec<String>| {
                if v.is_empty() {
                    "–".to_owned()
                } else {
                    v.join("; ")
                }
            };
            let _ = writeln!(
                out,
                "| {w} s | {load} | {} ({}) | {} | {} | {} | {} | {} |",
                f(bal_lead, 3),
                balanced.len(),
                f(bal_gap, 1),
                f(bal_lag, 1),
                or_dash(leads),
                or_dash(gaps),
                or_dash(separates)
            );
        }
    }
    out
}

/// The lead detector's test (`leaders` in crates/core/src/rules/job/detect.rs) on a window's
/// figures, at another ratio and SM-point floor: the fewest GPUs at the top, half the job at
/// most, at `ratio` × the rest's median and `points` above it, alike among themselves while the
/// rest are alike too.
fn leaders_at(works: &[(u32, f64)], sm: bool, ratio: f64, points: f64) -> Option<Vec<u32>> {
    let mut order = works.to_vec();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    let alike = |v: &[(u32, f64)]| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &(_, w)| {
            (lo.min(w), hi.max(w))
        });
        v.len() < 2 || (lo > 0.0 && hi / lo < ratio)
    };
    (1..=(order.len() / 2).max(1)).find_map(|k| {
        let (top, rest) = order.split_at(k);
        let peers = median(rest.iter().map(|&(_, w)| w))?;
        let lowest = top.last()?.1;
        let points_ok = !sm || lowest - peers >= points;
        (peers > 0.0 && lowest / peers >= ratio && points_ok && alike(top) && alike(rest))
            .then(|| top.iter().map(|&(d, _)| d).collect())
    })
}

/// The graded detector's test (`graded` in detect.rs) at another ratio and SM-point floor.
fn graded_at(works: &[(u32, f64)], sm: bool, ratio: f64, points: f64) -> bool {
    if works.len() < 3 {
        return false;
    }
    let (lo, hi) = works
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), &(_, w)| {
            (lo.min(w), hi.max(w))
        });
    let stands_out = works.iter().any(|&(d, w)| {
        median(works.iter().filter(|(e, _)| *e != d).map(|&(_, v)| v))
            .is_some_and(|p| p > 0.0 && w / p >= ratio && (!sm || w - p >= points))
    });
    stands_out && lo > 0.0 && hi / lo >= ratio
}

/// What a window's verdict would be at another lead ratio and SM-point floor: the detectors
/// tried before lead (memory spread, lag) keep the engine's answer, lead and graded are
/// tried again on the figures, and communication keeps the engine's answer if neither fires.
fn verdict_at(w: &Window, s: &Seen, ratio: f64, points: f64) -> &'static str {
    let detector = s.verdict.evidence.get("detector").and_then(Value::as_str);
    if matches!(detector, Some("memory_spread" | "lag")) || s.verdict.stall.is_some() {
        return column(&s.verdict, w.device);
    }
    let sm = s.work_key == "sm_active_pct";
    if s.works.len() < 2 {
        return column(&s.verdict, w.device);
    }
    if let Some(top) = leaders_at(&s.works, sm, ratio, points) {
        return if w.device.is_some_and(|d| top == [d]) {
            "straggler, its GPU"
        } else {
            "straggler, other GPU"
        };
    }
    if graded_at(&s.works, sm, ratio, points) {
        return "imbalanced";
    }
    if detector == Some("communication") {
        return "communication_bound";
    }
    "balanced"
}

/// The verdicts again at other lead ratios and SM-point floors, on each window's figures (see
/// [`verdict_at`]): per row of the confusion matrix, the balanced windows given anything but
/// balanced (false positives) and the slow windows naming their GPU. A what-if: the engine
/// itself, with `--set job.lead_ratio=R`, is the check for the ratio; the point floor is a
/// constant of detect.rs.
fn what_if(args: &Args, config: &Config, windows: &[Window]) -> String {
    const RATIOS: [f64; 7] = [1.04, 1.05, 1.06, 1.07, 1.08, 1.10, 1.15];
    const POINTS: [f64; 3] = [10.0, 5.0, 3.0];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nWhat-if on the windows' figures (lead and graded tried again; lag, memory spread and \
         stalls as judged; now lead_ratio {}): false positives in balanced windows, its GPU \
         named in slow windows:\n",
        config.rules.job.lead_ratio
    );
    // The mirror of the detectors checked against the engine: at today's thresholds it must
    // say what the engine said.
    let judged: Vec<&Window> = windows.iter().filter(|x| x.seen.is_some()).collect();
    let disagree: Vec<String> = judged
        .iter()
        .filter_map(|x| {
            let s = x.seen.as_ref()?;
            let mirrored = verdict_at(
                x,
                s,
                config.rules.job.lead_ratio,
                config.rules.job.lead_min_sm_points,
            );
            (mirrored != x.got).then(|| {
                format!(
                    "{} {} s at {:.0} s: engine {}, mirror {mirrored}",
                    x.case, x.window_s, x.end_s, x.got
                )
            })
        })
        .collect();
    let _ = writeln!(
        out,
        "At the thresholds used the mirror agrees with the engine in {} of {} judged windows.{}\n",
        judged.len() - disagree.len(),
        judged.len(),
        disagree
            .iter()
            .take(10)
            .map(|d| format!("\n- {d}"))
            .collect::<String>()
    );
    for &w in &args.windows_s {
        let mine: Vec<&Window> = judged
            .iter()
            .copied()
            .filter(|x| x.window_s == w && (x.truth == "balanced" || x.truth.starts_with("slow")))
            .collect();
        let mut rows: Vec<String> = Vec::new();
        for x in &mine {
            if !rows.contains(&x.row) {
                rows.push(x.row.clone());
            }
        }
        rows.sort_by_key(|r| row_order(r));
        if rows.is_empty() {
            continue;
        }
        let heads: Vec<String> = rows
            .iter()
            .map(|r| {
                if r.starts_with("balanced") {
                    format!("{r}: FP")
                } else {
                    format!("{r}: named")
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "| {w} s: lead_ratio | SM-point floor | {} |",
            heads.join(" | ")
        );
        let _ = writeln!(out, "|---|---|{}", "---|".repeat(rows.len()));
        for &points in &POINTS {
            for &ratio in &RATIOS {
                let cells: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        let of_row: Vec<&&Window> = mine.iter().filter(|x| &x.row == r).collect();
                        let n = of_row
                            .iter()
                            .filter(|x| {
                                x.seen.as_ref().is_some_and(|s| {
                                    let v = verdict_at(x, s, ratio, points);
                                    if x.truth == "balanced" {
                                        v != "balanced"
                                    } else {
                                        v == "straggler, its GPU"
                                    }
                                })
                            })
                            .count();
                        format!("{n}/{}", of_row.len())
                    })
                    .collect();
                let _ = writeln!(out, "| {ratio:.2} | {points} | {} |", cells.join(" | "));
            }
        }
        out.push('\n');
    }
    out
}
