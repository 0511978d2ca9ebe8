//! The UI's state and how input and telemetry change it. No terminal here: tests drive an `App`
//! with key events and the sampler's messages and look at the fields, or render it into a
//! `TestBackend`.
//!
//! Side effects (controlling the sampler, signalling a process, writing a file) are returned as
//! `Effect`s for the event loop to carry out, so the state stays pure and testable.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEvent, MouseEventKind};

use super::messages::LOOKBACK;
use super::session_log::SessionLog;
use super::theme::Theme;
use crate::cli::SuiteName;
use gpudiag_core::config::{Config, RulesConfig};
use gpudiag_core::judgement::{self, Span};
use gpudiag_core::session::Session;
use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::finding::{Finding, Severity};
use gpudiag_model::job::{JobPattern, JobVerdict};
use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample, TimeMs};
use gpudiag_model::stats::{self, Counter};
use gpudiag_probes::runner::ProbeReport;
use gpudiag_telemetry::kernel_log::XidLog;
use gpudiag_telemetry::sampler::{SamplerControl, SamplerMsg};
use gpudiag_telemetry::{ReplayPosition, Tick};

/// How the UI's titles place an XID the kernel logged before it started.
pub const BEFORE_SESSION: &str = "before this session";

/// Findings are re-evaluated at most this often: rules look at windows of seconds to minutes,
/// so a faster refresh would only cost CPU.
pub const FINDINGS_EVERY: Duration = Duration::from_secs(1);
/// Events kept for the rules (XIDs and the like are rare; this only bounds a storm).
/// Ticks kept for "save a recording". At 1 s this is over 5 hours; at 100 ms over 30 minutes.
/// The oldest go first, so a long session stays within a bounded amount of memory.
pub const MAX_SESSION_TICKS: usize = 20_000;
/// How far back the process growth rate looks.
const GROWTH_WINDOW_MS: u64 = 60_000;
/// Replay seek steps: arrow keys, and with Shift.
const SEEK_MS: i64 = 10_000;
const SEEK_LONG_MS: i64 = 60_000;
const SPEEDS: [f64; 10] = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// The screens, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Panel {
    Devices,
    Detail,
    Processes,
    Findings,
    Probes,
    Topology,
    /// The job's GPUs side by side and the verdict on the job (j).
    Job,
}

impl Panel {
    pub const ALL: [Panel; 7] = [
        Panel::Devices,
        Panel::Detail,
        Panel::Processes,
        Panel::Findings,
        Panel::Probes,
        Panel::Topology,
        Panel::Job,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Panel::Devices => "Devices",
            Panel::Detail => "Detail",
            Panel::Processes => "Processes",
            Panel::Findings => "Findings",
            Panel::Probes => "Probes",
            Panel::Topology => "Topology",
            Panel::Job => "Job",
        }
    }

    /// The title where the tab bar is too narrow for every full title (80 columns).
    pub fn short_title(self) -> &'static str {
        match self {
            Panel::Topology => "Topo",
            other => other.title(),
        }
    }

    pub fn index(self) -> usize {
        Panel::ALL.iter().position(|&p| p == self).unwrap_or(0)
    }

    fn step(self, by: isize) -> Panel {
        let n = Panel::ALL.len() as isize;
        let i = (self.index() as isize + by).rem_euclid(n) as usize;
        Panel::ALL.get(i).copied().unwrap_or(Panel::Devices)
    }
}

/// The window the detail charts show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zoom {
    M1,
    M5,
    M15,
    H1,
}

impl Zoom {
    const ALL: [Zoom; 4] = [Zoom::M1, Zoom::M5, Zoom::M15, Zoom::H1];

    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Zoom::M1 => 60,
            Zoom::M5 => 300,
            Zoom::M15 => 900,
            Zoom::H1 => 3600,
        })
    }

    pub fn label(self) -> &'static str {
        match self {
            Zoom::M1 => "1m",
            Zoom::M5 => "5m",
            Zoom::M15 => "15m",
            Zoom::H1 => "1h",
        }
    }

    fn step(self, by: isize) -> Zoom {
        let i = Zoom::ALL.iter().position(|&z| z == self).unwrap_or(0) as isize;
        let n = Zoom::ALL.len() as isize;
        Zoom::ALL
            .get((i + by).rem_euclid(n) as usize)
            .copied()
            .unwrap_or(Zoom::M1)
    }
}

/// Process table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcSort {
    Memory,
    Growth,
    Sm,
    Pid,
}

impl ProcSort {
    pub fn label(self) -> &'static str {
        match self {
            ProcSort::Memory => "memory",
            ProcSort::Growth => "growth",
            ProcSort::Sm => "SM %",
            ProcSort::Pid => "PID",
        }
    }

    fn next(self) -> ProcSort {
        match self {
            ProcSort::Memory => ProcSort::Growth,
            ProcSort::Growth => ProcSort::Sm,
            ProcSort::Sm => ProcSort::Pid,
            ProcSort::Pid => ProcSort::Memory,
        }
    }
}

/// The signals a kill sends, in the order it sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillSignal {
    Term,
    Kill,
}

impl KillSignal {
    pub fn name(self) -> &'static str {
        match self {
            KillSignal::Term => "SIGTERM",
            KillSignal::Kill => "SIGKILL",
        }
    }
}

/// A box drawn over the panels.
#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    Help,
    /// One finding's whole evidence and advice (Enter in Findings), scrolled down `scroll`
    /// lines. A copy, so a refresh of the list underneath cannot swap what is being read.
    Finding {
        finding: Box<Finding>,
        scroll: u16,
    },
    /// The kernels the replayed recording of `run --kernels` carries (K), scrolled down
    /// `scroll` lines.
    Kernels {
        scroll: u16,
    },
    /// Waiting for y/n before signalling a process.
    ConfirmKill {
        pid: u32,
        name: String,
        signal: KillSignal,
    },
}

/// What the event loop must do for the app.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Feed(SamplerControl),
    Signal {
        pid: u32,
        signal: KillSignal,
    },
    SaveRecording,
    /// Run this suite on every GPU, in a child process watched by a worker thread; its report
    /// comes back as an event. `force` probes GPUs that other processes use.
    RunProbes {
        suite: SuiteName,
        force: bool,
    },
}

/// Where the telemetry comes from. Only the header (mode), seeking and killing care: panels
/// render the same state either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    Live,
    Replay { name: String },
}

/// The probes panel's state: the suite picked, a run in progress, or the last results.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbesState {
    /// Probes need live GPUs; a recording has none to probe.
    NeedsLive,
    Ready {
        suite: SuiteName,
        last: Option<Result<ProbeReport, String>>,
    },
    Running {
        suite: SuiteName,
        started: Instant,
    },
    /// A run refused GPUs that others use (or whose other users could not be seen); `f`
    /// runs the suite again with them, Esc keeps the results as they are.
    ConfirmForce {
        suite: SuiteName,
        /// The run that refused them, shown under the question.
        report: Box<ProbeReport>,
        /// One line per refused GPU, naming it and how busy it is.
        busy: Vec<String>,
    },
}

/// One row of the process table.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcRow {
    pub device: u32,
    pub pid: u32,
    /// The user every view names for it: its job's, else the one it runs as.
    pub user: Option<String>,
    pub name: Option<String>,
    pub container_id: Option<String>,
    /// Its Slurm job and pod, where the source looked.
    pub attribution: Option<gpudiag_model::attribution::Attribution>,
    pub used_memory_bytes: Option<u64>,
    /// Bytes per second over the last minute; `None` until two reads a second apart exist.
    pub growth_bytes_per_s: Option<f64>,
    pub sm_util_pct: Option<f64>,
}

/// How the process table's content looks right now.
pub enum ProcessView {
    /// No device has delivered a process list yet; the reason the backend gave, if any.
    NotRead(Option<String>),
    Rows(Vec<ProcRow>),
}

/// What the app is created with.
pub struct AppInit {
    pub host: HostInfo,
    pub devices: Vec<DeviceInfo>,
    pub source: SourceKind,
    pub backend_name: String,
    pub interval: Duration,
    pub theme: Theme,
    /// May the user signal processes? Only for live local GPUs: a recording's PIDs belong to
    /// another machine or another time.
    pub can_signal: bool,
    /// How the GPUs connect, where the source knows.
    pub topology: Option<gpudiag_model::topology::Topology>,
}

/// The pipeline's (last tick, tick count) when a judgement was made: it holds while no tick
/// arrives.
type JudgedAt = (Option<TimeMs>, u64);

/// What the UI keeps of a judgement: its findings and its jobs.
#[derive(Clone, Default)]
struct Judged {
    findings: Vec<Finding>,
    jobs: Vec<JobVerdict>,
    jobs_not_judged: Vec<String>,
}

pub struct App {
    pub host: HostInfo,
    pub devices: Vec<DeviceInfo>,
    pub source: SourceKind,
    pub backend_name: String,
    pub interval: Duration,
    pub theme: Theme,
    pub can_signal: bool,
    pub topology: Option<gpudiag_model::topology::Topology>,

    /// The same session as every command, fed tick by tick: its pipeline (sanitised ticks,
    /// history, latest values, the incremental rules), a replayed recording's findings, and the
    /// XIDs the kernel logged before a live session started.
    pub session: Session,
    /// Everything the rules raised this session, worst first, newest first within a severity.
    pub findings: Vec<Finding>,
    /// The verdict on each job of two or more GPUs, from the same judgement as the findings
    /// (over the rolling window while playing, the whole recording at its end).
    pub jobs: Vec<JobVerdict>,
    /// Why a job the rules found could not be judged ("Torchrun run 7f3c: 4 s of data; …").
    pub jobs_not_judged: Vec<String>,
    findings_at: Option<Instant>,
    /// The judgement of the whole recording at its end, and when it was made.
    ended_judgement: Option<(JudgedAt, Judged)>,
    /// Memory readings per (device, pid) within the growth window.
    proc_memory: BTreeMap<(u32, u32), VecDeque<(TimeMs, u64)>>,
    /// Ticks seen this session, oldest first, for saving a recording.
    pub ticks: SessionLog,
    /// Processes already sent SIGTERM: the next kill offers SIGKILL.
    terminated: BTreeSet<u32>,

    pub panel: Panel,
    pub selected_device: usize,
    pub selected_process: usize,
    pub selected_finding: usize,
    /// The job the Job panel shows, by its place in `jobs_by_concern`.
    pub selected_job: usize,
    pub zoom: Zoom,
    pub sort: ProcSort,
    pub paused: bool,
    pub speed: f64,
    pub position: Option<ReplayPosition>,
    /// Why no more data arrives: `Some(None)` at the end of a recording.
    pub ended: Option<Option<String>>,
    pub overlay: Option<Overlay>,
    /// The terminal's (width, height) at the last event, for scrolling boxes within it.
    pub viewport: (u16, u16),
    /// A one-line message in the footer until the next key.
    pub status: Option<String>,
    /// What the session opened instead of what was asked (no live GPU, so the demo), shown
    /// whole on its own lines above the key hints until a key is pressed or `NOTICE_FOR` passed.
    pub notice: Option<(String, std::time::Instant)>,
    pub probes: ProbesState,
    pub quit: bool,
}

/// How long the opening notice stays without a key press: long enough to read twice.
pub const NOTICE_FOR: std::time::Duration = std::time::Duration::from_secs(20);

impl App {
    /// Shows `text` above the key hints from now for `NOTICE_FOR`.
    pub fn show_notice(&mut self, text: String) {
        self.notice = Some((text, std::time::Instant::now() + NOTICE_FOR));
    }

    /// The notice, while it is still shown.
    pub fn current_notice(&self) -> Option<&str> {
        self.notice
            .as_ref()
            .filter(|(_, until)| std::time::Instant::now() < *until)
            .map(|(text, _)| text.as_str())
    }
}

impl From<judgement::Judgement> for Judged {
    fn from(j: judgement::Judgement) -> Self {
        Judged {
            findings: j.findings,
            jobs: j.jobs,
            jobs_not_judged: j
                .not_judged
                .into_iter()
                .filter(|n| n.rule == "job")
                .map(|n| n.reason)
                .collect(),
        }
    }
}

impl App {
    pub fn new(init: AppInit) -> Self {
        let init_is_live = init.source == SourceKind::Live;
        // The header leads with the phase the window ends in, not only the window's blend.
        let session = Session::setup(&Config::default())
            .with_current_phase()
            .retaining(LOOKBACK)
            .fed_from_this_host(init_is_live)
            .fed(init.host.clone(), init.devices.clone());
        App {
            session,
            ended_judgement: None,
            host: init.host,
            devices: init.devices,
            source: init.source,
            backend_name: init.backend_name,
            interval: init.interval,
            theme: init.theme,
            can_signal: init.can_signal,
            topology: init.topology,
            findings: Vec::new(),
            jobs: Vec::new(),
            jobs_not_judged: Vec::new(),
            findings_at: None,
            proc_memory: BTreeMap::new(),
            ticks: SessionLog::new(MAX_SESSION_TICKS),
            terminated: BTreeSet::new(),
            panel: Panel::Devices,
            selected_device: 0,
            selected_process: 0,
            selected_finding: 0,
            selected_job: 0,
            zoom: Zoom::M1,
            sort: ProcSort::Memory,
            paused: false,
            speed: 1.0,
            position: None,
            ended: None,
            overlay: None,
            viewport: (80, 24),
            status: None,
            notice: None,
            probes: if init_is_live {
                ProbesState::Ready {
                    suite: SuiteName::Quick,
                    last: None,
                }
            } else {
                ProbesState::NeedsLive
            },
            quit: false,
        }
    }

    /// Where a key leaves a scrolling box: `None` once it closed it (or quit).
    fn box_key(&mut self, code: KeyCode, scroll: u16, max: u16) -> Option<u16> {
        match super::layout::box_key(code, scroll, max) {
            super::layout::BoxKey::ScrollTo(to) => Some(to),
            super::layout::BoxKey::Close => None,
            super::layout::BoxKey::Quit => {
                self.quit = true;
                None
            }
        }
    }

    /// The latest summary of `run --kernels` the replayed recording carried, up to where it
    /// stands.
    pub fn kernels(&self) -> Option<&gpudiag_model::kernels::RecordedKernels> {
        self.session.pipeline.kernels.as_deref()
    }

    /// Judges with these thresholds (and, live, this host's CUDA libraries) from now on.
    pub fn set_rules(&mut self, rules: RulesConfig, libraries: Option<Vec<LibraryInfo>>) {
        self.session.set_rules(rules, libraries);
    }

    /// Shows the findings a replayed recording carries beside the rules' own.
    pub fn set_recorded(&mut self, findings: Vec<Finding>) {
        self.session.set_recorded(findings);
        self.ended_judgement = None;
    }

    /// Judges the XIDs the kernel logged before the session beside the rules' findings, against
    /// each GPU's present state as it arrives (a GPU lost now makes its past XIDs live again).
    /// A log that could not be read is said in the footer until the next key, not left silent.
    pub fn set_kernel_xids(&mut self, log: Result<XidLog, String>) {
        self.ended_judgement = None;
        if let Err(why) = &log
            && self.status.is_none()
        {
            let n = gpudiag_core::rules::errors::unreadable_log(why, BEFORE_SESSION);
            self.status = Some(format!("not judged: {} — {}", n.rule, n.reason));
        }
        self.session.set_kernel_log(log, BEFORE_SESSION);
    }

    /// The selected device's static info.
    pub fn device(&self) -> Option<&DeviceInfo> {
        self.devices.get(self.selected_device)
    }

    /// Newest data time over all devices: "now" for rules and charts, in recorded time.
    pub fn now_ms(&self) -> Option<TimeMs> {
        self.session
            .pipeline
            .latest
            .values()
            .map(|s| s.time_ms)
            .max()
    }

    /// Applies what the sampler sent. Findings follow at most once per `FINDINGS_EVERY`.
    pub fn on_feed(&mut self, msg: SamplerMsg, now: Instant) {
        match msg {
            SamplerMsg::Ticks {
                ticks,
                reset,
                position,
            } => {
                if reset {
                    self.clear_data();
                }
                for t in ticks {
                    self.push_tick(t);
                }
                if position.is_some() {
                    self.position = position;
                }
                self.ended = None;
                // A seek changes what the findings describe: show it at once.
                if reset {
                    self.findings_at = None;
                }
                self.maybe_refresh_findings(now);
            }
            SamplerMsg::Ended(why) => {
                self.ended = Some(why.map(|e| e.to_string()));
                self.refresh_findings();
                self.findings_at = Some(now);
            }
        }
    }

    fn clear_data(&mut self) {
        self.findings.clear();
        self.jobs.clear();
        self.jobs_not_judged.clear();
        self.session.start_over();
        self.proc_memory.clear();
        self.ticks.clear();
    }

    /// Adds one tick to the pipeline and the session. Cheap per tick: the engine re-judges its
    /// windows only once a second of sample time.
    pub fn push_tick(&mut self, tick: Tick) {
        for s in &tick.samples {
            self.track_processes(s);
        }
        if tick.time_ms().is_some() {
            self.ticks.push(&tick);
        }
        self.session.pipeline.push(tick);
    }

    fn track_processes(&mut self, s: &Sample) {
        // `None` means the slow read has not happened; keep what we know until it does.
        let Some(procs) = &s.processes else {
            return;
        };
        let live: BTreeSet<u32> = procs.iter().map(|p| p.pid).collect();
        self.proc_memory
            .retain(|&(dev, pid), _| dev != s.device || live.contains(&pid));
        for p in procs {
            let Some(used) = p.used_memory_bytes else {
                continue;
            };
            let points = self.proc_memory.entry((s.device, p.pid)).or_default();
            if points.back().is_some_and(|&(t, _)| t >= s.time_ms) {
                continue;
            }
            points.push_back((s.time_ms, used));
            while points
                .front()
                .is_some_and(|&(t, _)| t + GROWTH_WINDOW_MS < s.time_ms)
            {
                points.pop_front();
            }
        }
    }

    fn growth(&self, device: u32, pid: u32) -> Option<f64> {
        let points = self.proc_memory.get(&(device, pid))?;
        let (t0, m0) = *points.front()?;
        let (t1, m1) = *points.back()?;
        // Below a second apart, a rate would be noise.
        if t1 < t0 + 1000 {
            return None;
        }
        Some((m1 as f64 - m0 as f64) / ((t1 - t0) as f64 / 1000.0))
    }

    /// Copies the engine's findings for display: everything raised this session, worst first
    /// so a FAIL is never below an INFO, newest first within a severity. The selection stays
    /// on the finding it was on.
    pub fn refresh_findings(&mut self) {
        let _timed = stats::Timed::start(Counter::FindingsRefreshes, Counter::FindingsNs);
        if self.now_ms().is_none() {
            self.findings.clear();
            self.jobs.clear();
            self.jobs_not_judged.clear();
            return;
        }
        let last_probes = match &self.probes {
            ProbesState::Ready {
                last: Some(Ok(report)),
                ..
            } => Some(report),
            _ => None,
        };
        // At the end of a recording the whole of it is judged, as `check` judges it; once, until
        // more ticks arrive (a seek back).
        let judged = match self.ended {
            Some(_) => {
                let at = (
                    self.session.pipeline.last_ms(),
                    self.session.pipeline.tick_count(),
                );
                match &self.ended_judgement {
                    Some((judged_at, judged)) if *judged_at == at => judged.clone(),
                    _ => {
                        let judged = Judged::from(self.session.judge(Span::whole(), last_probes));
                        self.ended_judgement = Some((at, judged.clone()));
                        judged
                    }
                }
            }
            None => Judged::from(self.session.judge_now(last_probes)),
        };
        let Judged {
            mut findings,
            jobs,
            jobs_not_judged,
        } = judged;
        self.jobs = jobs;
        self.jobs_not_judged = jobs_not_judged;
        self.selected_job = self.selected_job.min(self.jobs.len().saturating_sub(1));
        findings.sort_by_key(|f| std::cmp::Reverse((f.severity, f.time_ms)));
        let key = |f: &Finding| (f.id.clone(), f.device, f.time_ms);
        let was = self.findings.get(self.selected_finding).map(key);
        self.findings = findings;
        if let Some(i) = was.and_then(|k| self.findings.iter().position(|f| key(f) == k)) {
            self.selected_finding = i;
        }
        let n = self.findings.len();
        self.selected_finding = self.selected_finding.min(n.saturating_sub(1));
    }

    /// `refresh_findings`, unless it ran less than `FINDINGS_EVERY` before `now`.
    pub fn maybe_refresh_findings(&mut self, now: Instant) {
        if self
            .findings_at
            .is_some_and(|at| now.saturating_duration_since(at) < FINDINGS_EVERY)
        {
            return;
        }
        self.findings_at = Some(now);
        self.refresh_findings();
    }

    /// The jobs, the most concerning first: a straggler, then communication-bound, imbalanced,
    /// balanced; within a verdict the surer, then the larger job first.
    pub fn jobs_by_concern(&self) -> Vec<&JobVerdict> {
        let mut jobs: Vec<&JobVerdict> = self.jobs.iter().collect();
        let rank = |p: JobPattern| JobPattern::ALL.iter().position(|&q| q == p);
        jobs.sort_by_key(|j| {
            (
                rank(j.verdict),
                std::cmp::Reverse(j.confidence),
                std::cmp::Reverse(j.members.len()),
            )
        });
        jobs
    }

    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// The process table as sorted now.
    pub fn process_view(&self) -> ProcessView {
        let mut any_read = false;
        let mut rows = Vec::new();
        for s in self.session.pipeline.latest.values() {
            let Some(procs) = &s.processes else {
                continue;
            };
            any_read = true;
            rows.extend(procs.iter().map(|p| ProcRow {
                device: s.device,
                pid: p.pid,
                user: p.charged_user().map(str::to_owned),
                name: p.name.clone(),
                container_id: p.container_id.clone(),
                attribution: p.attribution.clone(),
                used_memory_bytes: p.used_memory_bytes,
                growth_bytes_per_s: self.growth(s.device, p.pid),
                sm_util_pct: p.sm_util_pct,
            }));
        }
        if !any_read {
            let why = self
                .session
                .pipeline
                .latest
                .values()
                .find_map(|s| s.why_absent("processes"))
                .map(ToString::to_string);
            return ProcessView::NotRead(why);
        }
        // Absent values sort last whatever the order, so they never pose as the smallest.
        let desc = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => b.total_cmp(&a),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        match self.sort {
            ProcSort::Memory => rows.sort_by(|a, b| {
                desc(
                    a.used_memory_bytes.map(|v| v as f64),
                    b.used_memory_bytes.map(|v| v as f64),
                )
            }),
            ProcSort::Growth => {
                rows.sort_by(|a, b| desc(a.growth_bytes_per_s, b.growth_bytes_per_s))
            }
            ProcSort::Sm => rows.sort_by(|a, b| desc(a.sm_util_pct, b.sm_util_pct)),
            ProcSort::Pid => rows.sort_by_key(|r| (r.pid, r.device)),
        }
        ProcessView::Rows(rows)
    }

    fn process_count(&self) -> usize {
        match self.process_view() {
            ProcessView::Rows(r) => r.len(),
            ProcessView::NotRead(_) => 0,
        }
    }

    /// Moves the selection of the current panel.
    fn select(&mut self, by: isize) {
        let moved = |cur: usize, n: usize| -> usize {
            if n == 0 {
                return 0;
            }
            (cur as isize + by).clamp(0, n as isize - 1) as usize
        };
        match self.panel {
            Panel::Devices | Panel::Detail => {
                self.selected_device = moved(self.selected_device, self.devices.len());
            }
            Panel::Processes => {
                self.selected_process = moved(self.selected_process, self.process_count());
            }
            Panel::Findings => {
                self.selected_finding = moved(self.selected_finding, self.findings.len());
            }
            Panel::Probes => {
                if let ProbesState::Ready { suite, .. } = &mut self.probes {
                    let all = [SuiteName::Quick, SuiteName::Standard, SuiteName::Full];
                    let i = all.iter().position(|s| s == suite).unwrap_or(0);
                    *suite = all[moved(i, all.len())];
                }
            }
            Panel::Topology => {}
            Panel::Job => self.selected_job = moved(self.selected_job, self.jobs.len()),
        }
    }

    /// A probe run finished (or could not start).
    pub fn on_probes(&mut self, mut result: Result<ProbeReport, String>) {
        self.ended_judgement = None;
        if let Ok(report) = &mut result {
            report.findings = gpudiag_core::rules::peers::compare(
                &report.devices,
                self.session.pipeline.engine.config().peers.margin,
                gpudiag_model::sample::now_ms(),
            );
        }
        let suite = match &self.probes {
            ProbesState::Running { suite, .. }
            | ProbesState::Ready { suite, .. }
            | ProbesState::ConfirmForce { suite, .. } => *suite,
            ProbesState::NeedsLive => return,
        };
        if let Ok(report) = &result {
            let busy = self.busy_lines(report);
            if !busy.is_empty() {
                let more = match busy.len() {
                    1 => String::new(),
                    n => format!(" and {} more", n - 1),
                };
                let how = if self.panel == Panel::Probes {
                    "press f to run anyway, Esc to cancel"
                } else {
                    "f in Probes (5) runs anyway"
                };
                self.status = Some(format!("{}{more}: {how}", busy[0]));
                self.probes = ProbesState::ConfirmForce {
                    suite,
                    report: Box::new(report.clone()),
                    busy,
                };
                return;
            }
        }
        self.status = Some(match &result {
            Ok(r) if r.exit_code() == 0 => {
                format!("{} probes finished: all passed", suite.as_str())
            }
            Ok(_) => format!("{} probes finished: see the failures", suite.as_str()),
            Err(e) => format!("probes could not run: {e}"),
        });
        self.probes = ProbesState::Ready {
            suite,
            last: Some(result),
        };
    }

    /// One line for each GPU the report refused in a way forcing overrides: "GPU 0 NVIDIA H200
    /// is busy (2 processes / 87% util)", the utilisation from this session's telemetry.
    pub fn busy_lines(&self, report: &ProbeReport) -> Vec<String> {
        report
            .devices
            .iter()
            .filter(|d| d.forcible)
            .map(|d| {
                let name = d
                    .name
                    .clone()
                    .or_else(|| {
                        let info = self.devices.iter().find(|x| x.index == d.index)?;
                        info.name.clone()
                    })
                    .map_or_else(String::new, |n| format!(" {n}"));
                if d.busy_pids.is_empty() {
                    let why = d.refused.as_deref().unwrap_or("unknown");
                    return format!(
                        "GPU {}{name}: its other users could not be checked ({why})",
                        d.index
                    );
                }
                let n = d.busy_pids.len();
                let util = self
                    .session
                    .pipeline
                    .latest
                    .get(&d.index)
                    .and_then(|s| s.gpu_util_pct)
                    .map_or_else(|| "util n/a".to_owned(), |u| format!("{u:.0}% util"));
                format!(
                    "GPU {}{name} is busy ({n} process{} / {util})",
                    d.index,
                    if n == 1 { "" } else { "es" }
                )
            })
            .collect()
    }

    /// `f` in Probes: from the question, run again with the busy GPUs; from results that
    /// refused some, ask the question again.
    fn force_probes(&mut self) -> Option<Effect> {
        match std::mem::replace(&mut self.probes, ProbesState::NeedsLive) {
            ProbesState::ConfirmForce { suite, .. } => {
                self.probes = ProbesState::Running {
                    suite,
                    started: Instant::now(),
                };
                self.status = Some(format!(
                    "running the {} suite on every GPU, busy ones included",
                    suite.as_str()
                ));
                Some(Effect::RunProbes { suite, force: true })
            }
            ProbesState::Ready {
                suite,
                last: Some(Ok(report)),
            } if report.devices.iter().any(|d| d.forcible) => {
                let busy = self.busy_lines(&report);
                self.probes = ProbesState::ConfirmForce {
                    suite,
                    report: Box::new(report),
                    busy,
                };
                None
            }
            other => {
                self.probes = other;
                self.status = Some("no GPU was refused as busy: nothing to force".into());
                None
            }
        }
    }

    /// Esc in Probes: the question goes, the results it was asked about stay.
    fn cancel_force(&mut self) {
        match std::mem::replace(&mut self.probes, ProbesState::NeedsLive) {
            ProbesState::ConfirmForce { suite, report, .. } => {
                self.status = Some("busy GPUs left alone".into());
                self.probes = ProbesState::Ready {
                    suite,
                    last: Some(Ok(*report)),
                };
            }
            other => self.probes = other,
        }
    }

    /// Handles one key press and says what the event loop must do.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Effect> {
        self.status = None;
        self.notice = None;
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c')) {
            self.quit = true;
            return None;
        }
        match self.overlay.take() {
            Some(Overlay::ConfirmKill { pid, name, signal }) => {
                return if matches!(key.code, KeyCode::Char('y') | KeyCode::Char('Y')) {
                    if signal == KillSignal::Term {
                        self.terminated.insert(pid);
                    }
                    self.status = Some(format!("sending {} to PID {pid} ({name})", signal.name()));
                    Some(Effect::Signal { pid, signal })
                } else {
                    self.status = Some(format!("PID {pid} left alone"));
                    None
                };
            }
            Some(Overlay::Help) => {
                // Any key closes help; q still quits, so the way out is never hidden.
                if matches!(key.code, KeyCode::Char('q')) {
                    self.quit = true;
                }
                return None;
            }
            Some(Overlay::Finding { finding, scroll }) => {
                let view = super::finding_detail::View {
                    theme: self.theme,
                    devices: &self.devices,
                };
                let max = super::finding_detail::detail_scroll_max(view, &finding, self.viewport);
                if let Some(scroll) = self.box_key(key.code, scroll, max) {
                    self.overlay = Some(Overlay::Finding { finding, scroll });
                }
                return None;
            }
            Some(Overlay::Kernels { scroll }) => {
                let max = super::kernels_box::scroll_max(self.kernels(), self.viewport);
                // K closes the box it opened.
                if key.code != KeyCode::Char('K')
                    && let Some(scroll) = self.box_key(key.code, scroll, max)
                {
                    self.overlay = Some(Overlay::Kernels { scroll });
                }
                return None;
            }
            None => {}
        }
        let shift = key.modifiers.contains(KeyModifiers::SHIFT);
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') | KeyCode::F(1) => self.overlay = Some(Overlay::Help),
            KeyCode::Tab => self.panel = self.panel.step(1),
            KeyCode::BackTab => self.panel = self.panel.step(-1),
            KeyCode::Char(c @ '1'..='7') => {
                let i = (c as usize).saturating_sub('1' as usize);
                if let Some(&p) = Panel::ALL.get(i) {
                    self.panel = p;
                }
            }
            KeyCode::Up => self.select(-1),
            KeyCode::Down => self.select(1),
            KeyCode::PageUp => self.select(-10),
            KeyCode::PageDown => self.select(10),
            KeyCode::Home => self.select(isize::MIN / 2),
            KeyCode::End => self.select(isize::MAX / 2),
            KeyCode::Enter if self.panel == Panel::Devices => self.panel = Panel::Detail,
            KeyCode::Enter if self.panel == Panel::Findings => {
                if let Some(f) = self.findings.get(self.selected_finding) {
                    self.overlay = Some(Overlay::Finding {
                        finding: Box::new(f.clone()),
                        scroll: 0,
                    });
                }
            }
            KeyCode::Enter if self.panel == Panel::Probes => {
                if let ProbesState::Ready { suite, .. } = self.probes {
                    self.probes = ProbesState::Running {
                        suite,
                        started: Instant::now(),
                    };
                    return Some(Effect::RunProbes {
                        suite,
                        force: false,
                    });
                }
            }
            KeyCode::Char('f') if self.panel == Panel::Probes => return self.force_probes(),
            KeyCode::Esc if self.panel == Panel::Probes => self.cancel_force(),
            KeyCode::Char(' ') | KeyCode::Char('p') => {
                self.paused = !self.paused;
                return Some(Effect::Feed(SamplerControl::Pause(self.paused)));
            }
            KeyCode::Char('z') => self.zoom = self.zoom.step(1),
            KeyCode::Char('Z') => self.zoom = self.zoom.step(-1),
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                self.status = Some(format!("processes sorted by {}", self.sort.label()));
            }
            KeyCode::Char('j') => self.panel = Panel::Job,
            KeyCode::Char('K') => self.overlay = Some(Overlay::Kernels { scroll: 0 }),
            KeyCode::Char('k') => return self.ask_kill(),
            KeyCode::Char('w') => return Some(Effect::SaveRecording),
            KeyCode::Char('+') | KeyCode::Char('=') => return self.change_speed(1),
            KeyCode::Char('-') => return self.change_speed(-1),
            KeyCode::Left => return self.seek(-if shift { SEEK_LONG_MS } else { SEEK_MS }),
            KeyCode::Right => return self.seek(if shift { SEEK_LONG_MS } else { SEEK_MS }),
            _ => {}
        }
        None
    }

    /// Mouse: the wheel moves the selection, a click on the tab bar switches panels.
    pub fn on_mouse(&mut self, m: MouseEvent, tab_at: impl Fn(u16, u16) -> Option<Panel>) {
        // The wheel scrolls an open finding rather than the list under it.
        if let Some(Overlay::Finding { .. }) = &self.overlay {
            let code = match m.kind {
                MouseEventKind::ScrollUp => KeyCode::Up,
                MouseEventKind::ScrollDown => KeyCode::Down,
                _ => return,
            };
            self.on_key(KeyEvent::new(code, KeyModifiers::NONE));
            return;
        }
        match m.kind {
            MouseEventKind::ScrollUp => self.select(-1),
            MouseEventKind::ScrollDown => self.select(1),
            MouseEventKind::Down(_) => {
                if let Some(p) = tab_at(m.column, m.row) {
                    self.overlay = None;
                    self.panel = p;
                }
            }
            _ => {}
        }
    }

    fn is_replay(&self) -> bool {
        matches!(self.source, SourceKind::Replay { .. })
    }

    fn change_speed(&mut self, by: isize) -> Option<Effect> {
        if !self.is_replay() {
            self.status = Some("speed applies to replays; live data comes as it is".into());
            return None;
        }
        let i = SPEEDS.iter().position(|&s| s >= self.speed).unwrap_or(3) as isize;
        let j = (i + by).clamp(0, SPEEDS.len() as isize - 1) as usize;
        self.speed = SPEEDS.get(j).copied().unwrap_or(1.0);
        self.status = Some(format!("replay speed ×{}", self.speed));
        Some(Effect::Feed(SamplerControl::Speed(self.speed)))
    }

    fn seek(&mut self, delta_ms: i64) -> Option<Effect> {
        if !self.is_replay() {
            self.status = Some("seeking applies to replays".into());
            return None;
        }
        Some(Effect::Feed(SamplerControl::Seek(delta_ms)))
    }

    fn ask_kill(&mut self) -> Option<Effect> {
        if self.panel != Panel::Processes {
            self.status = Some("select a process in the Processes panel (3) to kill it".into());
            return None;
        }
        if !self.can_signal {
            self.status = Some("these processes are from a recording: nothing to kill here".into());
            return None;
        }
        let ProcessView::Rows(rows) = self.process_view() else {
            return None;
        };
        // The list may have shrunk since the selection was made: take the last row then, as
        // the table shows it.
        let row = rows.get(self.selected_process.min(rows.len().saturating_sub(1)))?;
        let signal = if self.terminated.contains(&row.pid) {
            KillSignal::Kill
        } else {
            KillSignal::Term
        };
        self.overlay = Some(Overlay::ConfirmKill {
            pid: row.pid,
            name: row.name.clone().unwrap_or_else(|| "unknown".into()),
            signal,
        });
        None
    }

    /// The replay position as "current/end" elapsed from the start.
    pub fn position_text(&self) -> Option<String> {
        let p = self.position?;
        Some(format!(
            "{}/{}",
            super::format::elapsed(p.current_ms.saturating_sub(p.start_ms)),
            super::format::elapsed(p.end_ms.saturating_sub(p.start_ms))
        ))
    }
}
