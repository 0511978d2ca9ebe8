//! The live rule driver: feeds ticks to the rules at a bounded cost per tick.
//!
//! Event rules (XIDs) run on the tick that brings the event. Windowed rules run at most once per
//! `eval_interval_s` of sample time, over windows of fixed length, so a tick costs the same after
//! ten hours as after ten seconds. Telemetry health (`health.rs`) looks only at the tick's newest
//! samples and runs on every tick. Environment rules depend only on static facts and run once.

use std::collections::BTreeMap;

use super::bottleneck::{self, CurrentPhase};
use super::families::{self, Cadence, Lifetime, is_workload};
use super::job;
use super::{
    RuleInput,
    process_state::{ProcessCpu, ProcessLaunch, ProcessMemory},
    sort,
};
use crate::config::RulesConfig;
use crate::history::History;
use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::finding::{Finding, FindingState};
use gpudiag_model::job::{JobId, JobVerdict};
use gpudiag_model::ras::{RasAnswer, RasFailure};
use gpudiag_telemetry::ras::RasQuery;

use crate::rules::ras_log::RasLog;
use gpudiag_model::sample::{DeviceInfo, Event, HostInfo, Sample, TimeMs};
use gpudiag_model::verdict::NotJudged;
use gpudiag_model::verdict::{Bottleneck, Verdict};
use gpudiag_telemetry::Tick;

/// A finding's identity across evaluations: the same problem on the same device.
type Key = (String, Option<u32>);

pub struct RuleEngine {
    config: RulesConfig,
    devices: Vec<DeviceInfo>,
    host: Option<HostInfo>,
    libraries: Option<Vec<LibraryInfo>>,
    latest: BTreeMap<u32, Sample>,
    process_memory: ProcessMemory,
    process_cpu: ProcessCpu,
    /// The latest verdict per device over the rolling window.
    verdicts: BTreeMap<u32, Verdict>,
    /// Who started each GPU process, to group GPUs into jobs.
    process_launch: ProcessLaunch,
    /// The latest verdict per job of two or more GPUs over the rolling window.
    jobs: Vec<JobVerdict>,
    /// NCCL RAS answers of this host, recent ones, and when each job was asked.
    ras: RasLog,
    /// The GPU processes of the command `gpudiag run` started: one job.
    command: std::collections::BTreeSet<u32>,
    /// gpudiag's own pid, left out of the GPUs' holders: only where the GPUs are this host's.
    own_pid: Option<u32>,
    /// What the latest evaluation could not judge: the verdict's devices, then the rules'.
    not_judged: Vec<NotJudged>,
    /// Whether each evaluation also finds the phase its window ends in (a few more verdicts
    /// per device: only views that show it ask).
    track_current_phase: bool,
    /// The phase each device's window ends in, where the window holds more than one.
    current_phases: BTreeMap<u32, CurrentPhase>,
    last_eval_ms: Option<TimeMs>,
    environment_done: bool,
    /// Findings of the latest windowed evaluation plus every event finding, by key.
    active: BTreeMap<Key, Finding>,
    /// Every distinct finding raised since the start, in order of onset: `time_ms` is when it
    /// first fired, the rest (`last_seen_ms` included) is from the last evaluation in which it
    /// held.
    raised: Vec<Finding>,
    raised_index: std::collections::HashMap<Key, usize>,
}

impl RuleEngine {
    pub fn new(
        config: RulesConfig,
        devices: Vec<DeviceInfo>,
        host: Option<HostInfo>,
        libraries: Option<Vec<LibraryInfo>>,
    ) -> Self {
        RuleEngine {
            config,
            devices,
            host,
            libraries,
            latest: BTreeMap::new(),
            process_memory: ProcessMemory::default(),
            process_cpu: ProcessCpu::default(),
            verdicts: BTreeMap::new(),
            process_launch: ProcessLaunch::default(),
            jobs: Vec::new(),
            ras: RasLog::default(),
            command: Default::default(),
            own_pid: None,
            not_judged: Vec::new(),
            track_current_phase: false,
            current_phases: BTreeMap::new(),
            last_eval_ms: None,
            environment_done: false,
            active: BTreeMap::new(),
            raised: Vec::new(),
            raised_index: Default::default(),
        }
    }

    /// An engine that leaves gpudiag's own process out of the GPUs' holders (a probe's buffers
    /// are not a job's). Only for this host's live GPUs: a recording's pids are another host's
    /// or another boot's, and one of them may be ours by chance (a fresh container's low pids).
    pub fn excluding_own_process(mut self) -> Self {
        self.own_pid = Some(std::process::id());
        self
    }

    /// An engine that also finds, at each evaluation, the phase each device's window ends in
    /// (see [`RuleEngine::current_phase`]).
    pub fn with_current_phase(mut self) -> Self {
        self.track_current_phase = true;
        self
    }

    /// Takes one tick, already pushed into `history` by the caller. Returns the findings raised
    /// for the first time by this tick.
    pub fn on_tick(&mut self, history: &History, tick: &Tick) -> Vec<Finding> {
        let before = self.raised.len();
        let leak_window = (self.config.memory.leak_window_s * 1000.0) as u64;
        for s in &tick.samples {
            self.process_memory.observe(s, leak_window);
            self.process_cpu.observe(s);
            let host = self.host.as_ref().and_then(|h| h.hostname.as_deref());
            self.process_launch.observe(s, host);
            self.latest.insert(s.device, s.clone());
        }
        for a in &tick.ras {
            self.ras.push(a.clone());
        }
        let now = tick
            .samples
            .iter()
            .map(|s| s.time_ms)
            .chain(tick.events.iter().map(|e| e.time_ms))
            .max();
        if !tick.events.is_empty() {
            let found =
                families::run_cadence(Cadence::Events, &self.input(history, &tick.events, now));
            for f in found {
                self.raise(f);
            }
        }
        // Telemetry health is judged on every tick: a stall or a bad value lasts one tick.
        let found =
            families::run_cadence(Cadence::EveryTick, &self.input(history, &tick.events, now));
        for f in found {
            self.raise(f);
        }
        if !self.environment_done {
            self.environment_done = true;
            let found = families::run_cadence(Cadence::Once, &self.input(history, &[], now));
            for f in found {
                self.raise(f);
            }
        }
        if let Some(now) = now {
            let interval = (self.config.engine.eval_interval_s * 1000.0) as u64;
            // Saturating: a recording may carry any time, up to u64::MAX.
            let due = self
                .last_eval_ms
                .is_none_or(|last| now >= last.saturating_add(interval));
            if due && !tick.samples.is_empty() {
                self.evaluate_windowed(history, now);
            }
        }
        self.raised[before..].to_vec()
    }

    /// Evaluates the windowed rules now, whatever the cadence (the end of a check window).
    pub fn finish(&mut self, history: &History) {
        if let Some(now) = self.latest.values().map(|s| s.time_ms).max() {
            self.evaluate_windowed(history, now);
        }
    }

    /// Judges workload over the whole of `[start_ms, the last sample]` rather than the rolling
    /// windows: what a check or a run reports is about the time it covered, so a workload
    /// finding raised for a moment earlier (five idle seconds before a job started) gives way
    /// to the verdict on the whole window. Faults stay whenever they happened.
    pub fn finish_over(&mut self, history: &History, start_ms: TimeMs) {
        let Some(now) = self.latest.values().map(|s| s.time_ms).max() else {
            return;
        };
        self.finish_within(history, start_ms, now);
    }

    /// `finish_over` for `[start_ms, end_ms]`: a run judged up to its command's exit, though
    /// sampling went on a moment longer to see who still held the GPU.
    pub fn finish_within(&mut self, history: &History, start_ms: TimeMs, end_ms: TimeMs) {
        let now = end_ms;
        self.evaluate_windowed(history, now);
        let input = self.input(history, &[], Some(now));
        let mut judged = self.judge_span(&input, start_ms, now);
        let mut workload: Vec<Finding> = self
            .devices
            .iter()
            .filter_map(|d| {
                super::utilisation::over(&input, Some(&self.process_cpu), d.index, start_ms, now)
            })
            .collect();
        judged.defer_to_jobs(&mut workload);
        // The verdict and the workload rules now speak for the whole window; the other rules'
        // reasons stay those of the evaluation just made.
        let workload_rule = |rule: &str| {
            rule == bottleneck::VERDICT_RULE || families::lifetime(rule) == Lifetime::Workload
        };
        judged.not_judged.extend(input.not_judged.take());
        judged.not_judged.extend(
            self.not_judged
                .drain(..)
                .filter(|n| !workload_rule(&n.rule)),
        );
        self.adopt(judged);
        self.active.retain(|_, f| !is_workload(f));
        self.raised.retain(|f| !is_workload(f));
        self.raised_index = self
            .raised
            .iter()
            .enumerate()
            .map(|(i, f)| ((f.id.clone(), f.device), i))
            .collect();
        for f in workload {
            self.raise(f);
        }
        for f in job::findings(&self.jobs, &self.config.job) {
            self.raise(f);
        }
    }

    /// The device verdicts (with the phase each window ends in, when asked for) and the job
    /// verdicts over `[start_ms, end_ms]`, and what could not be judged: the one judgement
    /// both the rolling evaluation and a report's whole span make.
    fn judge_span(&self, input: &RuleInput<'_>, start_ms: TimeMs, end_ms: TimeMs) -> Judged {
        let (mut verdicts, mut not_judged) =
            bottleneck::judge_all(input, Some(&self.process_cpu), start_ms, end_ms);
        let mut current_phases = self.current_phases(input, &verdicts, start_ms, end_ms);
        let (jobs, unjudged) =
            job::judge_all(input, &self.process_launch, &self.command, start_ms, end_ms);
        job::explain_by_job(&mut verdicts, &jobs);
        // One truth per GPU: a GPU its job marks waiting waits now too, so the phase a view
        // shows as "now" never calls it the good case beside the job's verdict.
        let mut now: BTreeMap<u32, Verdict> = current_phases
            .iter()
            .map(|(&d, p)| (d, p.verdict.clone()))
            .collect();
        job::explain_by_job(&mut now, &jobs);
        for (d, v) in now {
            if let Some(p) = current_phases.get_mut(&d) {
                p.verdict = v;
            }
        }
        not_judged.extend(unjudged);
        Judged {
            verdicts,
            jobs,
            current_phases,
            not_judged,
        }
    }

    /// Makes `judged` the latest judgement, its not-judged entries ordered by device.
    fn adopt(&mut self, mut judged: Judged) {
        judged.not_judged.sort_by_key(|n| n.device);
        self.verdicts = judged.verdicts;
        self.jobs = judged.jobs;
        self.current_phases = judged.current_phases;
        self.not_judged = judged.not_judged;
    }

    /// The phase the window of `device`'s latest verdict ends in, where that window holds
    /// more than one phase; `None` where it holds one (the verdict
    /// says what runs now), where no verdict was reached, or on an engine made without
    /// [`RuleEngine::with_current_phase`].
    pub fn current_phase(&self, device: u32) -> Option<&CurrentPhase> {
        self.current_phases.get(&device)
    }

    /// The phases each judged device's window `[start_ms, end_ms]` ends in, when asked for.
    fn current_phases(
        &self,
        input: &RuleInput<'_>,
        verdicts: &BTreeMap<u32, Verdict>,
        start_ms: TimeMs,
        end_ms: TimeMs,
    ) -> BTreeMap<u32, CurrentPhase> {
        if !self.track_current_phase {
            return BTreeMap::new();
        }
        self.devices
            .iter()
            .filter(|d| verdicts.contains_key(&d.index))
            .filter_map(|d| {
                let cpu = Some(&self.process_cpu);
                bottleneck::current_phase(input, cpu, d, start_ms, end_ms).map(|v| (d.index, v))
            })
            .collect()
    }

    /// The devices judged.
    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    /// The thresholds judged by.
    pub fn config(&self) -> &RulesConfig {
        &self.config
    }

    /// The latest verdict per device (over the rolling window, or the window `finish_over` was
    /// given).
    pub fn verdicts(&self) -> &BTreeMap<u32, Verdict> {
        &self.verdicts
    }

    /// The latest verdict per job of two or more GPUs (over the rolling window, or the window
    /// `finish_over` was given).
    pub fn jobs(&self) -> &[JobVerdict] {
        &self.jobs
    }

    /// How each job's verdict changed over `[start_ms, end_ms]`.
    pub fn job_phases(
        &self,
        history: &History,
        start_ms: TimeMs,
        end_ms: TimeMs,
    ) -> BTreeMap<JobId, Vec<JobVerdict>> {
        let input = self.input(history, &[], Some(end_ms));
        job::phases(
            &input,
            &self.process_launch,
            &self.command,
            start_ms,
            end_ms,
        )
    }

    /// Names the GPU processes of the command `gpudiag run` started (it and its descendants):
    /// one job, where no launcher key says otherwise.
    pub fn set_command_processes(&mut self, pids: std::collections::BTreeSet<u32>) {
        self.command = pids;
    }

    /// What the latest evaluation could not judge, with the reason, by device: for each, the
    /// verdict's entry first (rule `verdict`), then each rule that lacked data (one entry per
    /// rule and device).
    pub fn not_judged(&self) -> &[NotJudged] {
        &self.not_judged
    }

    /// How the verdict on `device` changed over `[start_ms, end_ms]`.
    pub fn phases(
        &self,
        history: &History,
        device: u32,
        start_ms: TimeMs,
        end_ms: TimeMs,
    ) -> Vec<Verdict> {
        let input = self.input(history, &[], Some(end_ms));
        self.devices
            .iter()
            .find(|d| d.index == device)
            .map(|d| bottleneck::phases(&input, Some(&self.process_cpu), d, start_ms, end_ms))
            .unwrap_or_default()
    }

    fn evaluate_windowed(&mut self, history: &History, now: TimeMs) {
        self.last_eval_ms = Some(now);
        let window = (self.config.utilisation.window_s * 1000.0) as u64;
        let input = self.input(history, &[], Some(now));
        let mut judged = self.judge_span(&input, now.saturating_sub(window), now);
        let mut found = families::windowed(&input);
        judged.defer_to_jobs(&mut found);
        judged.not_judged.extend(input.not_judged.take());
        self.adopt(judged);
        // Windowed findings are current state: replace the previous evaluation's, keep events.
        self.active.retain(|_, f| is_sticky(f));
        let job_findings = job::findings(&self.jobs, &self.config.job);
        for f in found.into_iter().chain(job_findings) {
            self.raise(f);
        }
    }

    fn raise(&mut self, f: Finding) {
        let key = (f.id.clone(), f.device);
        let f = Finding {
            last_seen_ms: Some(f.time_ms),
            state: FindingState::Active,
            ..f
        };
        match self.raised_index.get(&key) {
            // A fault that stays once raised keeps what it was raised with (a lost GPU's XID 79,
            // the backend's reason): later ticks only repeat that the GPU is still lost, and
            // add what the first one lacked.
            Some(&i) if is_sticky(&f) => {
                let first = &mut self.raised[i];
                for (k, v) in &f.evidence.values {
                    first.evidence.values.entry(k.clone()).or_insert(v.clone());
                }
                first.last_seen_ms = f.last_seen_ms;
                let kept = first.clone();
                self.active.insert(key, kept);
                return;
            }
            Some(&i) => {
                let onset = self.raised[i].time_ms;
                self.raised[i] = Finding {
                    time_ms: onset,
                    ..f.clone()
                };
            }
            None => {
                self.raised_index.insert(key.clone(), self.raised.len());
                self.raised.push(f.clone());
            }
        }
        self.active.insert(key, f);
    }

    fn input<'a>(
        &'a self,
        history: &'a History,
        events: &'a [Event],
        now: Option<TimeMs>,
    ) -> RuleInput<'a> {
        RuleInput {
            devices: &self.devices,
            history,
            latest: &self.latest,
            events,
            now_ms: now.unwrap_or_default(),
            config: &self.config,
            host: self.host.as_ref(),
            libraries: self.libraries.as_deref(),
            process_memory: Some(&self.process_memory),
            process_cpu: Some(&self.process_cpu),
            ras: Some(&self.ras),
            own_pid: self.own_pid,
            not_judged: Default::default(),
        }
    }

    /// NCCL RAS answers of this host, recent ones.
    pub fn ras_log(&self) -> &RasLog {
        &self.ras
    }

    /// The RAS queries due at `now_ms` for the jobs of the latest evaluation (see
    /// [`RasLog::due`]), each noted as asked. A job whose processes run in a network namespace
    /// of their own cannot be reached from the host: its answer is that reason, logged at once.
    pub fn ras_queries(&mut self, now_ms: TimeMs) -> Vec<RasQuery> {
        let mut queries = Vec::new();
        for v in &self.jobs {
            if !self.ras.due(v, now_ms) {
                continue;
            }
            let devices: Vec<u32> = v.devices().collect();
            self.ras.asked(&devices, now_ms);
            let launches: Vec<&gpudiag_model::job::Launch> = v
                .members
                .iter()
                .filter_map(|m| self.process_launch.seen.get(&(m.device, m.pid)))
                .filter_map(|p| p.launch.as_ref())
                .collect();
            let address = gpudiag_telemetry::ras::address_for(
                launches.iter().find_map(|l| l.nccl_ras_addr.as_deref()),
            );
            let own_namespace = launches.iter().any(|l| {
                matches!(
                    l.net_namespace,
                    Some(gpudiag_model::job::NetNamespace::Own(_))
                )
            });
            if own_namespace {
                self.ras.push(RasAnswer::failed(
                    now_ms,
                    &address,
                    devices,
                    RasFailure::OwnNetNamespace,
                    "the job runs in a network namespace of its own: its RAS port is not the \
                     host's (run gpudiag inside its pod to ask)",
                ));
                continue;
            }
            queries.push(RasQuery::new(address, devices));
        }
        queries
    }

    /// What is wrong now: the latest windowed findings plus every event and environment finding,
    /// worst first, each with its onset and the last time it held.
    pub fn active(&self) -> Vec<Finding> {
        let mut v: Vec<Finding> = self
            .raised
            .iter()
            .filter(|f| self.active.contains_key(&(f.id.clone(), f.device)))
            .cloned()
            .collect();
        sort(&mut v);
        v
    }

    /// Everything raised since the start, once per id and device, worst first: what a check
    /// over a window or a recording reports. Each spans its onset (`time_ms`) to the last
    /// evaluation at which it held, and is `cleared` when the latest evaluation no longer
    /// raised it.
    pub fn raised(&self) -> Vec<Finding> {
        let mut v: Vec<Finding> = self
            .raised
            .iter()
            .map(|f| {
                let held = self.active.contains_key(&(f.id.clone(), f.device));
                Finding {
                    state: if held {
                        FindingState::Active
                    } else {
                        FindingState::Cleared
                    },
                    ..f.clone()
                }
            })
            .collect();
        sort(&mut v);
        v
    }

    /// Sample time of the last windowed evaluation.
    pub fn last_evaluation_ms(&self) -> Option<TimeMs> {
        self.last_eval_ms
    }

    /// Processes with a memory series (for tests and the benchmark).
    pub fn tracked_processes(&self) -> usize {
        self.process_memory.len()
    }
}

/// What one judgement of a span concluded, before the engine adopts it.
struct Judged {
    verdicts: BTreeMap<u32, Verdict>,
    jobs: Vec<JobVerdict>,
    current_phases: BTreeMap<u32, CurrentPhase>,
    not_judged: Vec<NotJudged>,
}

impl Judged {
    /// One diagnosis per GPU: a GPU its job marks as waiting for a peer is not also told to
    /// fix its own kernels or input pipeline (a waiting GPU reads as underfilled or starved by
    /// the host); the job's verdict and findings name the GPU to speed up.
    fn defer_to_jobs(&self, found: &mut Vec<Finding>) {
        found.retain(|f| {
            f.id != super::utilisation::ID
                || f.device.is_none_or(|d| {
                    self.verdicts
                        .get(&d)
                        .is_none_or(|v| v.bottleneck != Bottleneck::WaitingForPeer)
                })
        });
    }
}

/// Event and environment findings stay until the session ends; windowed ones are re-judged.
fn is_sticky(f: &Finding) -> bool {
    families::lifetime(&f.id).is_sticky()
}
