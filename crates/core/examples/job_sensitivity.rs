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

/// `LEAD_MIN_SM_POINTS` of crates/core/src/rules/job/detect.rs, which is not a setting.
const LEAD_MIN_SM_POINTS: f64 = 10.0;

const USAGE: &str = "usage: job_sensitivity [--window 10,20,30] [--step 5] \
                     [--set section.key=value]... [--windows-out FILE] RECORDING_OR_DIR...";

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
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

/// What a recording was made to be, from its `.truth.json`.
#[derive(Debug, Clone)]
struct Truth {
    case: String,
    kind: Kind,
    /// The GPU the case is about: slowed, hung, stopped, exited, checkpointing.
    device: Option<u32>,
    /// The rank the case is about, where the file names a rank rather than a GPU.
    rank: Option<u32>,
    /// How much more work the slowed rank does (1.1: 10% more).
    factor: Option<f64>,
    gpus: Option<u32>,
    workload: Option<String>,
    /// When the case begins; before it the job runs balanced. `None`: from the start.
    onset: Option<Onset>,
    /// The recording's GPU model, once read.
    model: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Onset {
    /// Seconds after the recording's first tick.
    AfterStartS(f64),
    /// ms since the Unix epoch.
    AtMs(TimeMs),
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Balanced,
    Slow,
    Hung,
    Stopped,
    Exited,
    Checkpoint,
    TwoJobs,
    Other(String),
}

impl Kind {
    fn from_word(w: &str) -> Kind {
        match w.to_ascii_lowercase().replace(['-', ' '], "_").as_str() {
            "balanced" => Kind::Balanced,
            "slow" | "slowed" | "straggler" | "slow_rank" => Kind::Slow,
            "hung" | "hang" | "hung_collective" => Kind::Hung,
            "stopped" | "sigstop" | "rank_stopped" => Kind::Stopped,
            "exited" | "killed" | "sigkill" | "rank_exited" | "died" => Kind::Exited,
            "checkpoint" | "rank0_pause" | "pause" => Kind::Checkpoint,
            "two_jobs" | "two_job" | "twojobs" => Kind::TwoJobs,
            other => Kind::Other(other.to_owned()),
        }
    }
}

impl Truth {
    /// Reads `path`. Several spellings of each key are taken; keys it does not know are returned
    /// so the caller can say they were not used.
    fn read(path: &Path, fallback_case: &str) -> Result<(Truth, Vec<String>), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let Value::Object(map) = v else {
            return Err(format!("{}: expected a JSON object", path.display()));
        };
        let mut used: Vec<&str> = Vec::new();
        let mut get = |keys: &[&'static str]| -> Option<&Value> {
            keys.iter().find_map(|k| {
                let v = map.get(*k).filter(|v| !v.is_null())?;
                used.push(k);
                Some(v)
            })
        };
        let uint = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as u32);
        let case = get(&["case", "name"])
            .and_then(Value::as_str)
            .unwrap_or(fallback_case)
            .to_owned();
        let device = uint(get(&[
            "device",
            "slow_device",
            "slowed_device",
            "slow_gpu",
            "straggler_device",
            "missing_device",
            "gpu",
        ]));
        let rank = uint(get(&["rank", "slow_rank", "slowed_rank", "missing_rank"]));
        let factor =
            get(&["factor", "slow_factor", "slowdown", "work_factor"]).and_then(Value::as_f64);
        let gpus = uint(get(&["gpus", "n_gpus", "world_size", "nproc"]));
        let workload = get(&["workload", "model"])
            .and_then(Value::as_str)
            .map(str::to_owned);
        let onset = get(&[
            "onset_s",
            "at_s",
            "since_s",
            "from_s",
            "fault_at_s",
            "after_s",
        ])
        .and_then(Value::as_f64)
        .map(Onset::AfterStartS)
        .or_else(|| {
            get(&["onset_ms", "at_ms", "since_ms", "fault_at_ms"])
                .and_then(Value::as_u64)
                .map(Onset::AtMs)
        });
        let kind = get(&["kind", "truth", "expected", "pattern", "fault"])
            .and_then(Value::as_str)
            .map(Kind::from_word);
        let kind = match kind {
            Some(k) => k,
            None if factor.is_some_and(|f| f > 1.0) => Kind::Slow,
            None if device.is_none() && rank.is_none() => Kind::Balanced,
            None => Kind::Other("unstated".to_owned()),
        };
        // Said for people, or by benches/cut_recording.py: nothing to judge by.
        let notes = ["note", "notes", "description", "command", "cut_from_s"];
        let unused = map
            .keys()
            .filter(|k| !used.contains(&k.as_str()) && !notes.contains(&k.as_str()))
            .cloned()
            .collect();
        Ok((
            Truth {
                case,
                kind,
                device,
                rank,
                factor,
                gpus,
                workload,
                onset,
                model: None,
            },
            unused,
        ))
    }

    /// The row a window of the case falls in once the case has begun.
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
            Kind::TwoJobs => "two jobs".to_owned(),
            Kind::Other(w) => w.clone(),
        }
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
    /// The truth row: the case's label, `balanced` before its onset, `transition` across it.
    truth: String,
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
        Kind::Balanced | Kind::TwoJobs => return None,
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

/// Replays one recording, judging every window.
fn measure(
    config: &Config,
    recording: &Path,
    truth: &Truth,
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
        let Some(now) = tick.samples.iter().map(|s| s.time_ms).max() else {
            session.pipeline.push(tick);
            continue;
        };
        session.pipeline.push(tick);
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
            out.push(judge_window(
                &mut session.pipeline,
                truth,
                w,
                t0,
                start,
                now,
            ));
        }
    }
    for w in &session.warnings {
        eprintln!("{}: {w}", recording.display());
    }
    Ok((out, model))
}

fn judge_window(
    pipeline: &mut Pipeline,
    truth: &Truth,
    window_s: u64,
    t0: TimeMs,
    start: TimeMs,
    end: TimeMs,
) -> Window {
    pipeline.engine.finish_within(&pipeline.history, start, end);
    let jobs = pipeline.engine.jobs();
    // The case's GPU, where the truth names a rank: the job's member of that rank.
    let device = truth.device.or_else(|| {
        let rank = truth.rank?;
        jobs.iter()
            .flat_map(|j| j.members.iter())
            .find(|m| m.rank == Some(rank))
            .map(|m| m.device)
    });
    // The job the case is about: the one holding its GPU, else the largest.
    let job = jobs
        .iter()
        .find(|j| device.is_some_and(|d| j.devices().any(|g| g == d)))
        .or_else(|| jobs.iter().max_by_key(|j| j.members.len()));
    let onset = match truth.onset {
        None => None,
        Some(Onset::AtMs(t)) => Some(t),
        Some(Onset::AfterStartS(s)) => Some(t0 + (s * 1000.0).round() as u64),
    };
    let truth_row = match onset {
        Some(t) if end < t => "balanced".to_owned(),
        Some(t) if start < t => "transition".to_owned(),
        _ => truth.label(),
    };
    let kind_now = if truth_row == "balanced" {
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
            .or(job.map(|j| j.members.len() as u32))
            .unwrap_or(0),
        window_s,
        end_s: end.saturating_sub(t0) as f64 / 1000.0,
        truth: truth_row,
        got,
        named_right: named,
        device,
        seen,
        not_judged,
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
        let (mut truth, unused) = Truth::read(truth_file, &stem)?;
        if !unused.is_empty() {
            eprintln!(
                "{}: keys not used: {}",
                truth_file.display(),
                unused.join(", ")
            );
        }
        let (measured, model) = measure(&config, recording, &truth, &args.windows_s, args.step_s)?;
        truth.model = model;
        if measured.is_empty() {
            eprintln!(
                "{}: shorter than the shortest window, no window judged",
                recording.display()
            );
        }
        windows.extend(measured);
        truths.push(truth);
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
            if !rows.contains(&x.truth) {
                rows.push(x.truth.clone());
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
                        .filter(|x| &x.truth == r && x.got == *c)
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
    if row == "balanced" {
        return (0, 0, String::new());
    }
    if let Some(f) = row
        .strip_prefix("slow ")
        .and_then(|f| f.trim_end_matches('×').parse::<f64>().ok())
    {
        return (1, (f * 1000.0) as u64, String::new());
    }
    let rank = match row {
        "slow" => 2,
        "checkpoint" => 3,
        "hung" => 4,
        "stopped" => 5,
        "exited" => 6,
        "transition" => 9,
        _ => 7,
    };
    (rank, 0, row.to_owned())
}

/// The slow rows of the matrix, by factor.
fn slow_rows(windows: &[&Window]) -> Vec<String> {
    let mut rows: Vec<String> = Vec::new();
    for w in windows {
        if w.truth.starts_with("slow") && !rows.contains(&w.truth) {
            rows.push(w.truth.clone());
        }
    }
    rows.sort_by_key(|r| row_order(r));
    rows
}

/// Per window length: how far the balanced windows' top GPU leads at most, against how far each
/// slowed GPU leads at least, in ratio and in SM points; where the two overlap no lead ratio
/// names the slow rank without a false positive.
fn separation(args: &Args, config: &Config, windows: &[Window]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nSeparation: the balanced windows' largest lead (top GPU over the rest's median) and \
         utilisation lag, against each slowed GPU's own lead (lead_ratio now {}, the SM-point \
         floor 10):\n",
        config.rules.job.lead_ratio
    );
    let _ = writeln!(
        out,
        "| window | balanced: lead × max (windows) | balanced: SM gap max (points) | balanced: lag max \
         (points) | slowed GPU: lead × min / median by factor | slowed GPU: SM gap min / median \
         (points) | a ratio that separates |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for &w in &args.windows_s {
        let mine: Vec<&Window> = windows.iter().filter(|x| x.window_s == w).collect();
        let balanced: Vec<&Seen> = mine
            .iter()
            .filter(|x| x.truth == "balanced")
            .filter_map(|x| x.seen.as_ref())
            .collect();
        let max = |v: Vec<f64>| v.into_iter().fold(f64::NAN, f64::max);
        let bal_lead = max(balanced.iter().filter_map(|s| s.lead_ratio).collect());
        let bal_gap = max(balanced.iter().filter_map(|s| s.lead_points).collect());
        let bal_lag = max(balanced.iter().filter_map(|s| s.lag_points).collect());
        let mut leads = Vec::new();
        let mut gaps = Vec::new();
        let mut separates = Vec::new();
        for row in slow_rows(&mine) {
            let seen: Vec<&Seen> = mine
                .iter()
                .filter(|x| x.truth == row)
                .filter_map(|x| x.seen.as_ref())
                .collect();
            let l: Vec<f64> = seen.iter().filter_map(|s| s.case_lead_ratio).collect();
            let g: Vec<f64> = seen.iter().filter_map(|s| s.case_points).collect();
            let lo = l.iter().copied().fold(f64::NAN, f64::min);
            leads.push(format!(
                "{row}: {lo:.3} / {:.3}",
                median(l.iter().copied()).unwrap_or(f64::NAN)
            ));
            if !g.is_empty() {
                gaps.push(format!(
                    "{row}: {:.1} / {:.1}",
                    g.iter().copied().fold(f64::NAN, f64::min),
                    median(g.iter().copied()).unwrap_or(f64::NAN)
                ));
            }
            separates.push(if bal_lead.is_nan() || lo.is_nan() {
                format!("{row}: –")
            } else if lo > bal_lead {
                format!("{row}: ({bal_lead:.3}, {lo:.3}]")
            } else {
                format!("{row}: none (overlap)")
            });
        }
        let f = |v: f64, d: usize| {
            if v.is_nan() {
                "–".to_owned()
            } else {
                format!("{v:.d$}")
            }
        };
        let _ = writeln!(
            out,
            "| {w} s | {} ({}) | {} | {} | {} | {} | {} |",
            f(bal_lead, 3),
            balanced.len(),
            f(bal_gap, 1),
            f(bal_lag, 1),
            leads.join("; "),
            if gaps.is_empty() {
                "–".to_owned()
            } else {
                gaps.join("; ")
            },
            separates.join("; ")
        );
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
/// [`verdict_at`]): the share of each slow case's windows naming its GPU, and of balanced
/// windows given anything but balanced. A what-if: the engine itself, with `--set
/// job.lead_ratio=R`, is the check for the ratio; the point floor is a constant of detect.rs.
fn what_if(args: &Args, config: &Config, windows: &[Window]) -> String {
    const RATIOS: [f64; 8] = [1.04, 1.05, 1.06, 1.07, 1.08, 1.10, 1.12, 1.15];
    const POINTS: [f64; 3] = [10.0, 5.0, 3.0];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nWhat-if on the windows' figures (lead and graded tried again; lag, memory spread and \
         stalls as judged; now lead_ratio {}): its GPU named in slow windows, and false positives \
         in balanced windows:\n",
        config.rules.job.lead_ratio
    );
    // The mirror of the detectors checked against the engine: at today's thresholds it must
    // say what the engine said.
    let disagree: Vec<String> = windows
        .iter()
        .filter_map(|x| {
            let s = x.seen.as_ref()?;
            let mirrored = verdict_at(x, s, config.rules.job.lead_ratio, LEAD_MIN_SM_POINTS);
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
        "At today's thresholds the mirror agrees with the engine in {} of {} judged windows.{}\n",
        windows.iter().filter(|x| x.seen.is_some()).count() - disagree.len(),
        windows.iter().filter(|x| x.seen.is_some()).count(),
        disagree
            .iter()
            .take(10)
            .map(|d| format!("\n- {d}"))
            .collect::<String>()
    );
    for &w in &args.windows_s {
        let mine: Vec<&Window> = windows.iter().filter(|x| x.window_s == w).collect();
        let rows = slow_rows(&mine);
        let balanced: Vec<(&Window, &Seen)> = mine
            .iter()
            .filter(|x| x.truth == "balanced")
            .filter_map(|x| Some((*x, x.seen.as_ref()?)))
            .collect();
        if rows.is_empty() && balanced.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "| {w} s: lead_ratio | SM-point floor | balanced: false positives | {} |",
            rows.join(" named | ") + if rows.is_empty() { "" } else { " named" }
        );
        let _ = writeln!(out, "|---|---|---|{}", "---|".repeat(rows.len()));
        for &points in &POINTS {
            for &ratio in &RATIOS {
                let fp = balanced
                    .iter()
                    .filter(|(x, s)| verdict_at(x, s, ratio, points) != "balanced")
                    .count();
                let named: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        let seen: Vec<(&Window, &Seen)> = mine
                            .iter()
                            .filter(|x| &x.truth == r)
                            .filter_map(|x| Some((*x, x.seen.as_ref()?)))
                            .collect();
                        let n = seen
                            .iter()
                            .filter(|(x, s)| {
                                verdict_at(x, s, ratio, points) == "straggler, its GPU"
                            })
                            .count();
                        format!("{n}/{}", seen.len())
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "| {ratio:.2} | {points} | {fp}/{} | {} |",
                    balanced.len(),
                    named.join(" | ")
                );
            }
        }
        out.push('\n');
    }
    out
}
