//! One look at the fleet: a fixed set of queries, evaluated at one instant, merged into a
//! [`Fleet`]. The device figures come from dcgm-exporter's series names, which both gpudiag and
//! dcgm-exporter write, so a node running either (or both, merged by UUID) is seen; what only
//! gpudiag writes (verdicts, findings, jobs, processes) is read from its own series.
//!
//! A failed core query (the targets, the device figures) makes the whole look `could_not_run`
//! with that one line; a failed optional read (alerts, rules, the rules' job figures) leaves
//! its part out and says so in `degraded`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpudiag_core::check::Status;
use gpudiag_model::finding::Severity;

use gpudiag_model::prometheus_names::{label, rules, series};

use crate::client::{ApiAlert, ApiError, Client, Series};
use crate::model::*;
use crate::selector::{Matcher, Op, Selector, quote};

/// What to read.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub selector: Selector,
    pub node_label: String,
    /// The instant to evaluate at (ms since the epoch); now when `None`.
    pub at_ms: Option<i64>,
}

/// The device series read for the table, and what each becomes.
const DEVICE_SERIES: [&str; 8] = [
    series::DCGM_FI_DEV_GPU_UTIL,
    series::DCGM_FI_PROF_SM_ACTIVE,
    series::DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    series::DCGM_FI_DEV_FB_USED,
    series::DCGM_FI_DEV_FB_FREE,
    series::DCGM_FI_DEV_FB_RESERVED,
    series::DCGM_FI_DEV_POWER_USAGE,
    series::DCGM_FI_DEV_GPU_TEMP,
];

/// gpudiag's own series read for the table.
const GPUDIAG_SERIES: [&str; 6] = [
    series::GPUDIAG_INFO,
    series::GPUDIAG_VERDICT,
    series::GPUDIAG_VERDICT_JUDGED,
    series::GPUDIAG_FINDING,
    series::GPUDIAG_GPU_JOB_INFO,
    series::GPUDIAG_JOB_VERDICT,
];

/// The shipped rules' series the job view reads.
const RULE_SERIES: [&str; 4] = [
    rules::JOB_GPU_SM_ACTIVE_AVG,
    rules::JOB_GPU_GPU_UTIL_PERCENT_AVG,
    rules::JOB_SM_ACTIVE_MEDIAN,
    rules::JOB_SM_ACTIVE_SPREAD,
];

/// The alerts the shipped rules raise; others are shown only when they name a node or GPU of
/// the fleet.
pub const GPUDIAG_ALERTS: [&str; 7] = rules::ALERTS;

/// A rule whose presence means the shipped rules are loaded.
const RULES_MARKER: &str = rules::JOB_GPUS_COUNT;

/// How far back a down target's node name is looked up.
const DOWN_NAME_LOOKBACK: &str = "1h";

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `a|b|c` matching exactly these strings (RE2 metacharacters escaped).
pub fn exact_alternatives<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    values
        .into_iter()
        .map(|v| {
            let mut out = String::with_capacity(v.len());
            for c in v.chars() {
                if "\\.+*?()|[]{}^$".contains(c) {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        })
        .collect::<Vec<_>>()
        .join("|")
}

fn names_matcher(names: &[&str]) -> Matcher {
    Matcher {
        label: label::NAME.to_owned(),
        op: Op::Re,
        value: exact_alternatives(names.iter().copied()),
    }
}

/// `{__name__=~"a|b",instance=~INSTANCES}`: these series of these scrape targets.
fn series_on_instances<'a>(names: impl IntoIterator<Item = &'a str>, instances: &str) -> String {
    format!(
        "{{{}=~{},{}=~{instances}}}",
        label::NAME,
        quote(&exact_alternatives(names)),
        label::INSTANCE
    )
}

/// The host part of an `instance` (`host:port`, `[v6]:port`).
fn instance_host(instance: &str) -> &str {
    if let Some(rest) = instance.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(instance);
    }
    match instance.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':') => {
            host
        }
        _ => instance,
    }
}

/// Every label the fleet reads from a series; the others are dropped as answers are parsed.
const LABELS_READ: [&str; 24] = [
    label::NAME,
    label::INSTANCE,
    label::SCRAPE_JOB,
    label::UUID,
    label::GPU,
    label::MODEL_NAME,
    label::HOSTNAME,
    label::POD,
    label::NAMESPACE,
    label::CONTAINER,
    label::VERDICT,
    label::CONFIDENCE,
    label::BASIS,
    label::ID,
    label::SEVERITY,
    label::JOB_KEY,
    label::JOINED_BY,
    label::SLURM_JOB,
    label::RANK,
    label::STRAGGLER_GPU,
    label::STRAGGLER_UUID,
    label::PID,
    label::PROCESS,
    label::USER,
];

fn keep_labels_read(client: &mut Client, node_label: &str) {
    let mut keep: BTreeSet<String> = LABELS_READ.iter().map(|l| (*l).to_owned()).collect();
    keep.insert(node_label.to_owned());
    client.keep_labels(Some(keep));
}

/// Reads the fleet. Never fails: what went wrong is in the result.
pub fn read_fleet(client: &mut Client, req: &ReadRequest) -> Fleet {
    keep_labels_read(client, &req.node_label);
    let at = req.at_ms.unwrap_or_else(now_ms);
    let mut fleet = Fleet {
        schema_version: FLEET_SCHEMA_VERSION,
        tool: Tool {
            name: "gpudiag".to_owned(),
            version: gpudiag_model::build_info::VERSION.to_owned(),
        },
        prometheus: client.url().to_owned(),
        selector: req.selector.text(),
        node_label: req.node_label.clone(),
        evaluated_at_ms: at,
        evaluated_at: rfc3339(at),
        status: Status::CouldNotRun,
        could_not_run: None,
        counts: Counts::default(),
        nodes: Vec::new(),
        jobs: Vec::new(),
        rules: RulesState::Unknown {
            reason: "not read".to_owned(),
        },
        unplaced_alerts: Vec::new(),
        findings: Vec::new(),
        degraded: Vec::new(),
        queries: QueryCost::default(),
    };
    let started = client.cost.clone();
    match Reader::new(client, req, at).read(&mut fleet) {
        Ok(()) => {}
        Err(e) => {
            fleet.nodes.clear();
            fleet.jobs.clear();
            fleet.findings.clear();
            fleet.could_not_run = Some(e.to_string());
            fleet.status = Status::CouldNotRun;
        }
    }
    fleet.queries = client.cost.since(&started);
    fleet
}

struct Reader<'a> {
    client: &'a mut Client,
    req: &'a ReadRequest,
    at: i64,
}

/// A GPU while its series are gathered, keyed by UUID (else node and index).
#[derive(Default)]
struct GpuDraft {
    node: String,
    gpu: Option<String>,
    uuid: Option<String>,
    model: Option<String>,
    instances: BTreeSet<String>,
    exporters: BTreeSet<Exporter>,
    /// Per series name: (from gpudiag, value); gpudiag's wins over dcgm-exporter's.
    values: BTreeMap<&'static str, (bool, f64)>,
    verdict: Option<GpuVerdict>,
    judged: Option<bool>,
    findings: BTreeSet<FindingRef>,
    jobs: BTreeSet<JobRef>,
    pod: Option<PodRef>,
    alerts: Vec<Alert>,
}

impl<'a> Reader<'a> {
    fn new(client: &'a mut Client, req: &'a ReadRequest, at: i64) -> Self {
        Reader { client, req, at }
    }

    fn instant(&mut self, q: &str) -> Result<Vec<Series>, ApiError> {
        self.client.instant(q, Some(self.at))
    }

    fn node_of(&self, s: &Series) -> Option<String> {
        s.label(&self.req.node_label)
            .or_else(|| s.label(label::INSTANCE).map(instance_host))
            .map(str::to_owned)
    }

    fn read(&mut self, fleet: &mut Fleet) -> Result<(), ApiError> {
        let sel = self.req.selector.clone();
        // The GPUs a job matcher selects, through gpudiag's job info.
        let chosen: Option<BTreeSet<String>> = if sel.job.is_empty() {
            None
        } else {
            let mut all = sel.device.clone();
            all.extend(sel.job.iter().cloned());
            let q = Selector {
                device: all,
                job: Vec::new(),
            }
            .series(series::GPUDIAG_GPU_JOB_INFO, &[]);
            Some(
                self.instant(&q)?
                    .iter()
                    .filter_map(|s| s.label(label::UUID).map(str::to_owned))
                    .collect(),
            )
        };
        let keep = |s: &Series| match &chosen {
            None => true,
            Some(set) => s.label(label::UUID).is_some_and(|u| set.contains(u)),
        };

        // The four core reads at once: the first look at a large fleet waits for the slowest.
        // `up` is read for every target the selector allows and kept below for the scrape jobs
        // that serve GPU series, so a node that went down (its series stale) still shows.
        let ups_query = sel.series(series::UP, &[]);
        let mut core = self
            .client
            .instant_all(
                &[
                    sel.series("", &[names_matcher(&GPUDIAG_SERIES)]),
                    sel.series("", &[names_matcher(&DEVICE_SERIES)]),
                    ups_query.clone(),
                    format!("timestamp({ups_query})"),
                ],
                Some(self.at),
            )
            .into_iter();
        let mut next = || {
            core.next()
                .unwrap_or_else(|| Err(ApiError::Setup("a query went missing".to_owned())))
        };
        let (gpudiag, device, all_ups, all_stamps) = (next()?, next()?, next()?, next()?);
        let gpudiag_instances: BTreeSet<String> = gpudiag
            .iter()
            .filter(|s| s.label(label::NAME) == Some(series::GPUDIAG_INFO))
            .filter_map(|s| s.label(label::INSTANCE).map(str::to_owned))
            .collect();
        let exporter_of = |instance: Option<&str>| match instance {
            Some(i) if gpudiag_instances.contains(i) => Exporter::Gpudiag,
            _ => Exporter::DcgmExporter,
        };

        let mut drafts: BTreeMap<String, GpuDraft> = BTreeMap::new();
        let mut instance_node: BTreeMap<String, String> = BTreeMap::new();
        let mut node_findings: BTreeMap<String, BTreeSet<FindingRef>> = BTreeMap::new();
        let mut node_jobs: Vec<(String, Series)> = Vec::new();
        for s in device.iter().filter(|s| keep(s)) {
            let Some(node) = self.node_of(s) else {
                continue;
            };
            let Some(name) = DEVICE_SERIES
                .iter()
                .find(|n| s.label(label::NAME) == Some(**n))
            else {
                continue;
            };
            let exporter = exporter_of(s.label(label::INSTANCE));
            let d = draft(&mut drafts, &node, s);
            if let Some(i) = s.label(label::INSTANCE) {
                d.instances.insert(i.to_owned());
                instance_node.entry(i.to_owned()).or_insert(node.clone());
            }
            d.exporters.insert(exporter);
            if d.model.is_none() {
                d.model = s.label(label::MODEL_NAME).map(str::to_owned);
            }
            if d.pod.is_none()
                && let Some(pod) = s.label(label::POD)
            {
                d.pod = Some(PodRef {
                    namespace: s.label(label::NAMESPACE).map(str::to_owned),
                    pod: pod.to_owned(),
                    container: s.label(label::CONTAINER).map(str::to_owned),
                });
            }
            let from_gpudiag = exporter == Exporter::Gpudiag;
            let slot = d.values.entry(name).or_insert((from_gpudiag, s.value));
            if from_gpudiag && !slot.0 {
                *slot = (true, s.value);
            }
        }
        for s in gpudiag.iter() {
            let Some(node) = self.node_of(s) else {
                continue;
            };
            if let Some(i) = s.label(label::INSTANCE)
                && (chosen.is_none() || keep(s))
            {
                instance_node.entry(i.to_owned()).or_insert(node.clone());
            }
            let name = s.label(label::NAME).unwrap_or_default();
            if name == series::GPUDIAG_JOB_VERDICT {
                node_jobs.push((node, s.clone()));
                continue;
            }
            let on_gpu = s.label(label::UUID).is_some() || s.label(label::GPU).is_some();
            if name == series::GPUDIAG_FINDING && !on_gpu {
                if chosen.is_none() {
                    node_findings
                        .entry(node)
                        .or_default()
                        .insert(finding_ref(s));
                }
                continue;
            }
            if !on_gpu || !keep(s) || name == series::GPUDIAG_INFO {
                continue;
            }
            // A gpudiag series for a GPU the device query did not return (it reports no
            // utilisation, say) still makes the GPU.
            let d = draft(&mut drafts, &node, s);
            d.exporters.insert(Exporter::Gpudiag);
            if let Some(i) = s.label(label::INSTANCE) {
                d.instances.insert(i.to_owned());
            }
            match name {
                series::GPUDIAG_VERDICT => {
                    d.verdict = Some(GpuVerdict::Judged {
                        bottleneck: s.label(label::VERDICT).unwrap_or("unknown").to_owned(),
                        confidence: s.label(label::CONFIDENCE).map(str::to_owned),
                        basis: s.label(label::BASIS).map(str::to_owned),
                    });
                }
                series::GPUDIAG_VERDICT_JUDGED => d.judged = Some(s.value >= 1.0),
                series::GPUDIAG_FINDING if s.value >= 1.0 => {
                    d.findings.insert(finding_ref(s));
                }
                series::GPUDIAG_GPU_JOB_INFO => {
                    if let Some(key) = s.label(label::JOB_KEY) {
                        d.jobs.insert(JobRef {
                            job_key: key.to_owned(),
                            joined_by: s.label(label::JOINED_BY).unwrap_or("unknown").to_owned(),
                            slurm_job: s.label(label::SLURM_JOB).map(str::to_owned),
                            pod: s.label(label::POD).map(str::to_owned),
                            namespace: s.label(label::NAMESPACE).map(str::to_owned),
                            rank: s.label(label::RANK).map(str::to_owned),
                        });
                    }
                }
                _ => {}
            }
        }

        // The scrape targets: every target of a scrape job that serves GPU series, so a node
        // that went down (its series stale) still shows, and a node_exporter does not.
        let gpu_scrape_jobs: BTreeSet<String> = device
            .iter()
            .chain(gpudiag.iter())
            .filter_map(|s| s.label(label::SCRAPE_JOB).map(str::to_owned))
            .collect();
        let mut targets: Vec<(Series, Option<f64>)> = Vec::new();
        if !gpu_scrape_jobs.is_empty() {
            let of_gpu_job = |s: &Series| {
                s.label(label::SCRAPE_JOB)
                    .is_some_and(|j| gpu_scrape_jobs.contains(j))
            };
            let ups: Vec<Series> = all_ups.into_iter().filter(|s| of_gpu_job(s)).collect();
            let stamps: Vec<Series> = all_stamps.into_iter().filter(|s| of_gpu_job(s)).collect();
            let stamp_of = |s: &Series| {
                stamps
                    .iter()
                    .find(|t| {
                        t.label(label::INSTANCE) == s.label(label::INSTANCE)
                            && t.label(label::SCRAPE_JOB) == s.label(label::SCRAPE_JOB)
                    })
                    .map(|t| t.value)
            };
            // A matcher on a label `up` lacks (Hostname) leaves it empty: the targets of the
            // instances seen are read by instance then.
            let mut ups = ups;
            let seen: BTreeSet<&str> = ups
                .iter()
                .filter_map(|s| s.label(label::INSTANCE))
                .collect();
            let missing: Vec<&str> = instance_node
                .keys()
                .map(String::as_str)
                .filter(|i| !seen.contains(i))
                .collect();
            let mut stamps_missing = Vec::new();
            if !missing.is_empty() {
                let by_instance = format!(
                    "{}{{{}=~{}}}",
                    series::UP,
                    label::INSTANCE,
                    quote(&exact_alternatives(missing.iter().copied()))
                );
                ups.extend(self.instant(&by_instance)?);
                stamps_missing = self.instant(&format!("timestamp({by_instance})"))?;
            }
            for s in ups {
                let stamp = stamp_of(&s).or_else(|| {
                    stamps_missing
                        .iter()
                        .find(|t| t.label(label::INSTANCE) == s.label(label::INSTANCE))
                        .map(|t| t.value)
                });
                targets.push((s, stamp));
            }
        }
        if chosen.is_some() {
            targets.retain(|(s, _)| {
                s.label(label::INSTANCE)
                    .is_some_and(|i| instance_node.contains_key(i))
            });
        }
        // Down targets' series are stale now: their node is named from the last hour.
        let unnamed: Vec<&str> = targets
            .iter()
            .filter_map(|(s, _)| s.label(label::INSTANCE))
            .filter(|i| !instance_node.contains_key(*i))
            .collect();
        if !unnamed.is_empty() {
            let q = format!(
                "group by ({instance}, {label}) (last_over_time({{{name}=~\"{info}|{temp}\",{instance}=~{inst}}}[{DOWN_NAME_LOOKBACK}]))",
                instance = label::INSTANCE,
                name = label::NAME,
                info = series::GPUDIAG_INFO,
                temp = series::DCGM_FI_DEV_GPU_TEMP,
                label = self.req.node_label,
                inst = quote(&exact_alternatives(unnamed.iter().copied())),
            );
            match self.instant(&q) {
                Ok(found) => {
                    for s in &found {
                        if let (Some(i), Some(n)) = (s.label(label::INSTANCE), self.node_of(s)) {
                            instance_node.entry(i.to_owned()).or_insert(n);
                        }
                    }
                }
                Err(e) => fleet
                    .degraded
                    .push(format!("down targets' node names: {e}")),
            }
        }

        // Alerts (now only: Prometheus keeps no history of them over its API), the rules and
        // the rules' job figures, asked at once.
        let alerts_now = (self.at - now_ms()).abs() <= 5 * 60 * 1000;
        let rule_query = format!(
            "{{{}=~{}}}",
            label::NAME,
            quote(&exact_alternatives(RULE_SERIES))
        );
        let at = self.at;
        let (mut for_alerts, mut for_rules, mut for_series) = (
            self.client.clone(),
            self.client.clone(),
            self.client.clone(),
        );
        for c in [&mut for_alerts, &mut for_rules, &mut for_series] {
            c.cost = QueryCost::default();
        }
        let (alerts_read, rule_names, series_read) = std::thread::scope(|scope| {
            let alerts = scope.spawn(|| alerts_now.then(|| for_alerts.alerts()));
            let names = scope.spawn(|| for_rules.rule_names());
            let series = scope.spawn(|| for_series.instant(&rule_query, Some(at)));
            let failed = || ApiError::Setup("a query's thread failed".to_owned());
            (
                alerts.join().unwrap_or_else(|_| Some(Err(failed()))),
                names.join().unwrap_or_else(|_| Err(failed())),
                series.join().unwrap_or_else(|_| Err(failed())),
            )
        });
        for c in [&for_alerts, &for_rules, &for_series] {
            self.client.cost.add(&c.cost);
        }
        let alerts: Vec<ApiAlert> = match alerts_read {
            None => {
                fleet.degraded.push(
                    "alerts: Prometheus gives only the present ones, and --at is more than 5 minutes away"
                        .to_owned(),
                );
                Vec::new()
            }
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                fleet.degraded.push(format!("alerts: {e}"));
                Vec::new()
            }
        };
        let rules_listed = match &rule_names {
            Ok(names) => Some(names.iter().any(|n| n == RULES_MARKER)),
            Err(_) => None,
        };
        let rule_series: Vec<Series> = match series_read {
            _ if rules_listed == Some(false) => Vec::new(),
            Ok(s) => s,
            Err(e) => {
                fleet.degraded.push(format!("the rules' job figures: {e}"));
                Vec::new()
            }
        };
        fleet.rules = match (rules_listed, &rule_names) {
            (Some(true), _) => RulesState::Loaded,
            (Some(false), _) => RulesState::NotLoaded,
            (None, _) if !rule_series.is_empty() => RulesState::Loaded,
            (None, Err(e)) => RulesState::Unknown {
                reason: e.to_string(),
            },
            (None, Ok(_)) => RulesState::NotLoaded,
        };

        assemble(
            fleet,
            drafts,
            targets,
            instance_node,
            node_findings,
            node_jobs,
            alerts,
            rule_series,
            &gpudiag_instances,
            self.at,
            sel.device.is_empty() && sel.job.is_empty(),
        );
        Ok(())
    }
}

fn finding_ref(s: &Series) -> FindingRef {
    FindingRef {
        severity: severity_of(s.label(label::SEVERITY)).unwrap_or(Severity::Info),
        id: s.label(label::ID).unwrap_or("unknown").to_owned(),
    }
}

/// A `severity` label as gpudiag's severity; the common Alertmanager words too.
fn severity_of(label: Option<&str>) -> Option<Severity> {
    match label?.to_ascii_lowercase().as_str() {
        "info" | "none" => Some(Severity::Info),
        "warn" | "warning" => Some(Severity::Warn),
        "fail" | "critical" | "error" | "page" => Some(Severity::Fail),
        _ => None,
    }
}

fn draft<'d>(
    drafts: &'d mut BTreeMap<String, GpuDraft>,
    node: &str,
    s: &Series,
) -> &'d mut GpuDraft {
    let key = match s.label(label::UUID) {
        Some(u) => format!("uuid:{u}"),
        None => format!("node:{node}:{}", s.label(label::GPU).unwrap_or("?")),
    };
    let d = drafts.entry(key).or_default();
    if d.node.is_empty() {
        d.node = node.to_owned();
    }
    if d.gpu.is_none() {
        d.gpu = s.label(label::GPU).map(str::to_owned);
    }
    if d.uuid.is_none() {
        d.uuid = s.label(label::UUID).map(str::to_owned);
    }
    d
}

fn alert_of(a: &ApiAlert, node_label: &str) -> Alert {
    let l = |k: &str| a.labels.get(k).filter(|v| !v.is_empty()).cloned();
    Alert {
        name: l(label::ALERT_NAME).unwrap_or_else(|| "unnamed".to_owned()),
        state: a.state.clone(),
        severity: severity_of(a.labels.get(label::SEVERITY).map(String::as_str)),
        summary: a
            .annotations
            .get(label::SUMMARY)
            .map(|s| s.chars().filter(|c| !c.is_control()).take(300).collect()),
        node: l(node_label)
            .or_else(|| l(label::HOSTNAME))
            .or_else(|| l(label::INSTANCE).map(|i| instance_host(&i).to_owned())),
        gpu: l(label::GPU),
        uuid: l(label::UUID),
        job_key: l(label::JOB_KEY),
        pace: l(label::PACE),
        active_since: a.active_at.clone(),
    }
}

/// The rank a verdict name gives.
fn verdict_rank(v: &GpuVerdict) -> Rank {
    match v {
        GpuVerdict::Judged { bottleneck, .. } => match bottleneck.as_str() {
            "compute_bound" | "memory_bound" => Rank::Good,
            "idle" => Rank::Idle,
            _ => Rank::Held,
        },
        GpuVerdict::NotJudgedYet | GpuVerdict::DcgmExporterOnly => Rank::Unknown,
    }
}

fn severity_rank(s: Severity) -> Rank {
    match s {
        Severity::Info => Rank::Held,
        Severity::Warn => Rank::Warn,
        Severity::Fail => Rank::Fail,
    }
}

fn gpu_index_key(g: &Option<String>) -> (u64, String) {
    let s = g.clone().unwrap_or_default();
    (s.parse().unwrap_or(u64::MAX), s)
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    fleet: &mut Fleet,
    drafts: BTreeMap<String, GpuDraft>,
    targets: Vec<(Series, Option<f64>)>,
    instance_node: BTreeMap<String, String>,
    node_findings: BTreeMap<String, BTreeSet<FindingRef>>,
    node_jobs: Vec<(String, Series)>,
    alerts: Vec<ApiAlert>,
    rule_series: Vec<Series>,
    gpudiag_instances: &BTreeSet<String>,
    at: i64,
    everything: bool,
) {
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let empty_node = |name: &str| Node {
        name: name.to_owned(),
        state: NodeState::Up,
        targets: Vec::new(),
        exporters: Vec::new(),
        gpus: Vec::new(),
        findings: Vec::new(),
        alerts: Vec::new(),
        worst: Rank::Unknown,
    };
    for (s, stamp) in &targets {
        let Some(instance) = s.label(label::INSTANCE) else {
            continue;
        };
        let name = instance_node
            .get(instance)
            .cloned()
            .unwrap_or_else(|| instance_host(instance).to_owned());
        let node = nodes
            .entry(name.clone())
            .or_insert_with(|| empty_node(&name));
        node.targets.push(Target {
            instance: instance.to_owned(),
            scrape_job: s.label(label::SCRAPE_JOB).unwrap_or_default().to_owned(),
            up: s.value >= 1.0,
            exporter: if gpudiag_instances.contains(instance) {
                Some(Exporter::Gpudiag)
            } else if s.value >= 1.0 {
                Some(Exporter::DcgmExporter)
            } else {
                None
            },
            last_scrape_age_s: stamp.map(|t| ((at as f64 / 1000.0) - t).max(0.0)),
        });
    }
    let target_age: BTreeMap<String, f64> = nodes
        .values()
        .flat_map(|n| n.targets.iter())
        .filter_map(|t| Some((t.instance.clone(), t.last_scrape_age_s?)))
        .collect();

    // Alerts: placed on a GPU by UUID, else on a node, else kept aside when they are gpudiag's
    // and no selector narrows the fleet (they may be about what it leaves out).
    let uuids: BTreeSet<String> = drafts.values().filter_map(|d| d.uuid.clone()).collect();
    let mut gpu_alerts: BTreeMap<String, Vec<Alert>> = BTreeMap::new();
    let mut node_alerts: BTreeMap<String, Vec<Alert>> = BTreeMap::new();
    let mut job_alerts: Vec<Alert> = Vec::new();
    let node_names: BTreeSet<String> = drafts
        .values()
        .map(|d| d.node.clone())
        .chain(nodes.keys().cloned())
        .collect();
    for a in &alerts {
        let alert = alert_of(a, &fleet.node_label);
        let ours = GPUDIAG_ALERTS.contains(&alert.name.as_str());
        if alert.job_key.is_some() && ours {
            job_alerts.push(alert.clone());
        }
        if a.state != "firing" {
            continue;
        }
        if let Some(u) = alert.uuid.as_ref().filter(|u| uuids.contains(*u)) {
            gpu_alerts.entry(u.clone()).or_default().push(alert);
        } else if let Some(n) = alert.node.as_ref().filter(|n| node_names.contains(*n)) {
            node_alerts.entry(n.clone()).or_default().push(alert);
        } else if ours && everything {
            fleet.unplaced_alerts.push(alert);
        }
    }

    for (_, d) in drafts {
        let node = nodes
            .entry(d.node.clone())
            .or_insert_with(|| empty_node(&d.node));
        let value = |n: &str| d.values.get(n).map(|(_, v)| *v);
        let used = value(series::DCGM_FI_DEV_FB_USED);
        let total = match (used, value(series::DCGM_FI_DEV_FB_FREE)) {
            (Some(u), Some(f)) => {
                Some(u + f + value(series::DCGM_FI_DEV_FB_RESERVED).unwrap_or(0.0))
            }
            _ => None,
        };
        let has_gpudiag = d.exporters.contains(&Exporter::Gpudiag);
        let verdict = match (d.verdict, has_gpudiag) {
            (Some(v), _) => v,
            (None, true) => GpuVerdict::NotJudgedYet,
            (None, false) => GpuVerdict::DcgmExporterOnly,
        };
        let mut findings: Vec<FindingRef> = d.findings.into_iter().collect();
        findings.sort_by(|a, b| b.cmp(a));
        let mut galerts = d
            .uuid
            .as_ref()
            .and_then(|u| gpu_alerts.remove(u))
            .unwrap_or_default();
        galerts.extend(d.alerts);
        let rank = findings
            .iter()
            .map(|f| severity_rank(f.severity))
            .chain(galerts.iter().filter_map(|a| a.severity.map(severity_rank)))
            .chain([verdict_rank(&verdict)])
            .max()
            .unwrap_or_default();
        let age = d
            .instances
            .iter()
            .filter_map(|i| target_age.get(i).copied())
            .reduce(f64::min);
        for e in &d.exporters {
            if !node.exporters.contains(e) {
                node.exporters.push(*e);
            }
        }
        node.gpus.push(Gpu {
            gpu: d.gpu,
            uuid: d.uuid,
            model: d.model,
            exporters: d.exporters.into_iter().collect(),
            util_pct: value(series::DCGM_FI_DEV_GPU_UTIL),
            sm_active_pct: value(series::DCGM_FI_PROF_SM_ACTIVE).map(|r| r * 100.0),
            tensor_active_pct: value(series::DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).map(|r| r * 100.0),
            memory_used_mib: used,
            memory_total_mib: total,
            power_w: value(series::DCGM_FI_DEV_POWER_USAGE),
            temperature_c: value(series::DCGM_FI_DEV_GPU_TEMP),
            verdict,
            findings,
            jobs: d.jobs.into_iter().collect(),
            pod: d.pod,
            alerts: galerts,
            last_scrape_age_s: age,
            rank,
        });
    }
    for (name, f) in node_findings {
        let node = nodes
            .entry(name.clone())
            .or_insert_with(|| empty_node(&name));
        let mut f: Vec<FindingRef> = f.into_iter().collect();
        f.sort_by(|a, b| b.cmp(a));
        node.findings = f;
    }
    for (name, a) in node_alerts {
        if let Some(node) = nodes.get_mut(&name) {
            node.alerts = a;
        }
    }
    for node in nodes.values_mut() {
        node.gpus.sort_by_key(|g| gpu_index_key(&g.gpu));
        node.exporters.sort();
        let up = node.targets.iter().filter(|t| t.up).count();
        node.state = match (up, node.targets.len()) {
            (_, 0) => NodeState::Up,
            (0, _) => NodeState::Down,
            (u, n) if u < n => NodeState::Partial,
            _ => NodeState::Up,
        };
        let down_rank = match node.state {
            NodeState::Down => Rank::Down,
            NodeState::Partial => Rank::Warn,
            NodeState::Up => Rank::Unknown,
        };
        node.worst = node
            .gpus
            .iter()
            .map(|g| g.rank)
            .chain(node.findings.iter().map(|f| severity_rank(f.severity)))
            .chain(
                node.alerts
                    .iter()
                    .filter_map(|a| a.severity.map(severity_rank)),
            )
            .chain([down_rank])
            .max()
            .unwrap_or_default();
    }
    let mut nodes: Vec<Node> = nodes.into_values().collect();
    nodes.sort_by(|a, b| b.worst.cmp(&a.worst).then_with(|| a.name.cmp(&b.name)));
    fleet.nodes = nodes;

    fleet.jobs = jobs(fleet, node_jobs, &job_alerts, &rule_series);
    findings_and_status(fleet);
}

fn jobs(
    fleet: &Fleet,
    node_jobs: Vec<(String, Series)>,
    job_alerts: &[Alert],
    rule_series: &[Series],
) -> Vec<Job> {
    // The rules' per-GPU averages by (series, UUID, job): looked up once per GPU of a job.
    let per_gpu: std::collections::HashMap<(&str, &str, &str), f64> = rule_series
        .iter()
        .filter_map(|s| {
            Some((
                (
                    s.label(label::NAME)?,
                    s.label(label::UUID)?,
                    s.label(label::JOB_KEY)?,
                ),
                s.value,
            ))
        })
        .collect();
    let mut jobs: BTreeMap<(String, String), Job> = BTreeMap::new();
    // Jobs known from gpudiag's job info; the others are dcgm-exporter pods, which the rules
    // (joined on that info) cannot judge.
    let mut judged_by_rules: BTreeSet<(String, String)> = BTreeSet::new();
    for (node, gpu) in fleet.gpus() {
        for r in &gpu.jobs {
            judged_by_rules.insert((r.job_key.clone(), r.joined_by.clone()));
        }
        let refs: Vec<JobRef> = if gpu.jobs.is_empty() {
            // A GPU seen only through dcgm-exporter's pod labels belongs to its pod.
            gpu.pod
                .iter()
                .map(|p| JobRef {
                    job_key: match &p.namespace {
                        Some(ns) => format!("{ns}/{}", p.pod),
                        None => p.pod.clone(),
                    },
                    joined_by: "pod".to_owned(),
                    slurm_job: None,
                    pod: Some(p.pod.clone()),
                    namespace: p.namespace.clone(),
                    rank: None,
                })
                .collect()
        } else {
            gpu.jobs.clone()
        };
        for r in refs {
            let Some(uuid) = &gpu.uuid else { continue };
            let job = jobs
                .entry((r.job_key.clone(), r.joined_by.clone()))
                .or_insert_with(|| Job {
                    job_key: r.job_key.clone(),
                    joined_by: r.joined_by.clone(),
                    slurm_job: r.slurm_job.clone(),
                    namespace: r.namespace.clone(),
                    nodes: Vec::new(),
                    gpus: Vec::new(),
                    across_nodes: None,
                    per_node: Vec::new(),
                    rank: Rank::Unknown,
                });
            if !job.nodes.contains(&node.name) {
                job.nodes.push(node.name.clone());
            }
            let rule = |name: &str| {
                per_gpu
                    .get(&(name, uuid.as_str(), r.job_key.as_str()))
                    .copied()
            };
            job.gpus.push(JobGpu {
                node: node.name.clone(),
                gpu: gpu.gpu.clone(),
                uuid: uuid.clone(),
                rank: r.rank.clone(),
                sm_active_pct: rule(rules::JOB_GPU_SM_ACTIVE_AVG).map(|v| v * 100.0),
                util_pct: rule(rules::JOB_GPU_GPU_UTIL_PERCENT_AVG),
                straggler: false,
            });
            job.rank = job.rank.max(gpu.rank);
        }
    }
    for (node, s) in node_jobs {
        let (Some(key), Some(by)) = (s.label(label::JOB_KEY), s.label(label::JOINED_BY)) else {
            continue;
        };
        if let Some(job) = jobs.get_mut(&(key.to_owned(), by.to_owned())) {
            job.per_node.push(NodeJobVerdict {
                node,
                verdict: s.label(label::VERDICT).unwrap_or("unknown").to_owned(),
                confidence: s.label(label::CONFIDENCE).map(str::to_owned),
                straggler_gpu: s.label(label::STRAGGLER_GPU).map(str::to_owned),
                straggler_uuid: s.label(label::STRAGGLER_UUID).map(str::to_owned),
            });
        }
    }
    let loaded = fleet.rules.loaded();
    for ((key, by), job) in jobs.iter_mut() {
        job.gpus.sort_by(|a, b| {
            let rank = |g: &JobGpu| g.rank.as_deref().and_then(|r| r.parse::<u64>().ok());
            rank(a)
                .cmp(&rank(b))
                .then_with(|| a.node.cmp(&b.node))
                .then_with(|| gpu_index_key(&a.gpu).cmp(&gpu_index_key(&b.gpu)))
        });
        job.nodes.sort();
        job.per_node.sort_by(|a, b| a.node.cmp(&b.node));
        let mine: Vec<&Alert> = job_alerts
            .iter()
            .filter(|a| a.job_key.as_deref() == Some(key.as_str()))
            .collect();
        let pick = |name: &str| {
            mine.iter()
                .filter(|a| a.name == name)
                .max_by_key(|a| a.state == "firing")
                .copied()
        };
        let job_rule = |name: &str| {
            rule_series
                .iter()
                .find(|s| {
                    s.label(label::NAME) == Some(name)
                        && s.label(label::JOB_KEY) == Some(key.as_str())
                        && s.label(label::JOINED_BY) == Some(by.as_str())
                })
                .map(|s| s.value)
        };
        if loaded && job.gpus.len() >= 2 && judged_by_rules.contains(&(key.clone(), by.clone())) {
            let straggler = pick(rules::ALERT_JOB_STRAGGLER);
            let comm = pick(rules::ALERT_JOB_COMMUNICATION_BOUND);
            let (pattern, state) = match (straggler, comm) {
                (Some(a), _) => ("straggler", Some(a.state.clone())),
                (None, Some(a)) => ("communication_bound", Some(a.state.clone())),
                (None, None) => ("balanced", None),
            };
            job.across_nodes = Some(JobJudgement {
                pattern: pattern.to_owned(),
                state,
                straggler: straggler.map(|a| Straggler {
                    node: a.node.clone(),
                    gpu: a.gpu.clone(),
                    uuid: a.uuid.clone(),
                    pace: a.pace.clone(),
                }),
                sm_active_median_pct: job_rule(rules::JOB_SM_ACTIVE_MEDIAN).map(|v| v * 100.0),
                sm_active_spread: job_rule(rules::JOB_SM_ACTIVE_SPREAD),
            });
            let firing = |a: Option<&Alert>| a.is_some_and(|a| a.state == "firing");
            if firing(straggler) || firing(comm) {
                job.rank = job.rank.max(Rank::Warn);
            } else if straggler.is_some() || comm.is_some() {
                job.rank = job.rank.max(Rank::Held);
            }
        }
        let named: BTreeSet<String> = job
            .across_nodes
            .iter()
            .filter(|j| j.state.as_deref() == Some("firing"))
            .filter_map(|j| j.straggler.as_ref()?.uuid.clone())
            .chain(job.per_node.iter().filter_map(|v| v.straggler_uuid.clone()))
            .collect();
        for g in &mut job.gpus {
            g.straggler = named.contains(&g.uuid);
        }
        if job
            .per_node
            .iter()
            .any(|v| v.verdict != "balanced" && v.verdict != "unknown")
        {
            job.rank = job.rank.max(Rank::Held);
        } else if job.rank < Rank::Good && !job.per_node.is_empty() {
            job.rank = Rank::Good;
        }
    }
    let mut jobs: Vec<Job> = jobs.into_values().collect();
    jobs.sort_by(|a, b| {
        b.rank
            .cmp(&a.rank)
            .then_with(|| b.gpus.len().cmp(&a.gpus.len()))
            .then_with(|| a.job_key.cmp(&b.job_key))
    });
    jobs
}

fn findings_and_status(fleet: &mut Fleet) {
    let mut all: Vec<FleetFinding> = Vec::new();
    let mut counts = Counts::default();
    for node in &fleet.nodes {
        counts.nodes += 1;
        if node.state == NodeState::Down {
            counts.nodes_down += 1;
        }
        for _down in node.targets.iter().filter(|t| !t.up) {
            all.push(FleetFinding {
                severity: Severity::Warn,
                id: "fleet.target_down".to_owned(),
                node: Some(node.name.clone()),
                gpu: None,
                job_key: None,
            });
        }
        for f in &node.findings {
            all.push(FleetFinding {
                severity: f.severity,
                id: f.id.clone(),
                node: Some(node.name.clone()),
                gpu: None,
                job_key: None,
            });
        }
        for a in &node.alerts {
            counts.alerts_firing += 1;
            all.extend(alert_finding(a, Some(&node.name)));
        }
        for g in &node.gpus {
            counts.gpus += 1;
            match g.verdict {
                GpuVerdict::Judged { .. } => counts.gpus_judged += 1,
                GpuVerdict::DcgmExporterOnly => counts.gpus_dcgm_exporter_only += 1,
                GpuVerdict::NotJudgedYet => {}
            }
            for f in &g.findings {
                all.push(FleetFinding {
                    severity: f.severity,
                    id: f.id.clone(),
                    node: Some(node.name.clone()),
                    gpu: g.gpu.clone(),
                    job_key: None,
                });
            }
            for a in &g.alerts {
                counts.alerts_firing += 1;
                all.extend(alert_finding(a, Some(&node.name)));
            }
        }
    }
    for a in &fleet.unplaced_alerts {
        counts.alerts_firing += 1;
        all.extend(alert_finding(a, None));
    }
    all.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.gpu.cmp(&b.gpu))
            .then_with(|| a.id.cmp(&b.id))
    });
    all.dedup();
    let gpudiag_gpus = counts.gpus - counts.gpus_dcgm_exporter_only;
    fleet.status = if counts.gpus == 0 && counts.nodes == 0 {
        fleet.could_not_run = Some(format!(
            "Prometheus at {} holds no GPU series under the selector {} (is `gpudiag serve` or dcgm-exporter scraped?)",
            fleet.prometheus, fleet.selector
        ));
        Status::CouldNotRun
    } else {
        match all.iter().map(|f| f.severity).max() {
            Some(Severity::Fail) => Status::Fail,
            Some(Severity::Warn) => Status::Warn,
            _ if gpudiag_gpus == 0 || counts.gpus_judged == 0 => Status::NotJudged,
            _ => Status::Healthy,
        }
    };
    fleet.counts = counts;
    fleet.findings = all;
}

fn alert_finding(a: &Alert, node: Option<&str>) -> Option<FleetFinding> {
    Some(FleetFinding {
        severity: a.severity?,
        id: format!("alert:{}", a.name),
        node: node.map(str::to_owned).or_else(|| a.node.clone()),
        gpu: a.gpu.clone(),
        job_key: a.job_key.clone(),
    })
}

/// The charts of a node's view: the last `span` before the fleet's instant.
pub const CHART_SERIES: [(&str, &str, f64); 5] = [
    ("util_pct", series::DCGM_FI_DEV_GPU_UTIL, 1.0),
    ("sm_active_pct", series::DCGM_FI_PROF_SM_ACTIVE, 100.0),
    ("power_w", series::DCGM_FI_DEV_POWER_USAGE, 1.0),
    ("memory_used_mib", series::DCGM_FI_DEV_FB_USED, 1.0),
    ("temperature_c", series::DCGM_FI_DEV_GPU_TEMP, 1.0),
];

const PROCESS_SERIES: [&str; 3] = [
    series::GPUDIAG_PROCESS_MEMORY_USED_BYTES,
    series::GPUDIAG_PROCESS_SM_UTIL_PERCENT,
    series::GPUDIAG_PROCESS_VERDICT,
];

/// Reads one node's charts (range queries over `span` before `at_ms`) and its processes.
pub fn read_node(
    client: &mut Client,
    node_label: &str,
    node: &Node,
    at_ms: i64,
    span: Duration,
) -> NodeDetail {
    keep_labels_read(client, node_label);
    let started = client.cost.clone();
    // About 120 points per chart, never finer than 15 s (a typical scrape interval).
    let step = Duration::from_secs_f64((span.as_secs_f64() / 120.0).max(15.0));
    let mut detail = NodeDetail {
        node: node.name.clone(),
        start_ms: at_ms - span.as_millis() as i64,
        end_ms: at_ms,
        step_s: step.as_secs_f64(),
        ..NodeDetail::default()
    };
    let instances: Vec<&str> = node.targets.iter().map(|t| t.instance.as_str()).collect();
    if instances.is_empty() {
        detail
            .degraded
            .push("no scrape target of this node is known".to_owned());
        return detail;
    }
    let inst = quote(&exact_alternatives(instances.iter().copied()));
    let names: Vec<&str> = CHART_SERIES.iter().map(|(_, n, _)| *n).collect();
    let q = series_on_instances(names, &inst);
    match client.range(&q, detail.start_ms, at_ms, step) {
        Ok(series) => {
            for s in series {
                let Some((chart, _, scale)) = CHART_SERIES
                    .iter()
                    .find(|(_, n, _)| s.labels.get(label::NAME).map(String::as_str) == Some(*n))
                else {
                    continue;
                };
                let key = s
                    .labels
                    .get(label::UUID)
                    .or_else(|| s.labels.get(label::GPU))
                    .cloned()
                    .unwrap_or_default();
                let points: Vec<(i64, f64)> =
                    s.points.iter().map(|(t, v)| (*t, v * scale)).collect();
                // gpudiag and dcgm-exporter may both report a GPU: the longer series wins.
                let slot = detail
                    .charts
                    .entry(key)
                    .or_default()
                    .entry((*chart).to_owned())
                    .or_default();
                if points.len() > slot.len() {
                    *slot = points;
                }
            }
        }
        Err(e) => detail.degraded.push(format!("charts: {e}")),
    }
    if !node.exporters.contains(&Exporter::Gpudiag) {
        detail.processes_absent = Some("n/a: dcgm-exporter only".to_owned());
    } else {
        let q = series_on_instances(PROCESS_SERIES, &inst);
        match client.instant(&q, Some(at_ms)) {
            Ok(series) => {
                let mut by_pid: BTreeMap<(String, String), Process> = BTreeMap::new();
                for s in series {
                    let Some(pid) = s.label(label::PID) else {
                        continue;
                    };
                    let uuid = s.label(label::UUID).map(str::to_owned);
                    let p = by_pid
                        .entry((uuid.clone().unwrap_or_default(), pid.to_owned()))
                        .or_insert_with(|| Process {
                            gpu: s.label(label::GPU).map(str::to_owned),
                            uuid,
                            pid: pid.to_owned(),
                            name: s.label(label::PROCESS).map(str::to_owned),
                            user: s.label(label::USER).map(str::to_owned),
                            slurm_job: s.label(label::SLURM_JOB).map(str::to_owned),
                            pod: s.label(label::POD).map(str::to_owned),
                            memory_used_bytes: None,
                            sm_util_pct: None,
                            verdict: None,
                        });
                    match s.label(label::NAME) {
                        Some(series::GPUDIAG_PROCESS_MEMORY_USED_BYTES) => {
                            p.memory_used_bytes = Some(s.value)
                        }
                        Some(series::GPUDIAG_PROCESS_SM_UTIL_PERCENT) => {
                            p.sm_util_pct = Some(s.value)
                        }
                        Some(series::GPUDIAG_PROCESS_VERDICT) => {
                            p.verdict = s.label(label::VERDICT).map(str::to_owned)
                        }
                        _ => {}
                    }
                }
                detail.processes = by_pid.into_values().collect();
                detail.processes.sort_by(|a, b| {
                    gpu_index_key(&a.gpu)
                        .cmp(&gpu_index_key(&b.gpu))
                        .then_with(|| {
                            b.memory_used_bytes
                                .partial_cmp(&a.memory_used_bytes)
                                .unwrap_or(std::cmp::Ordering::Equal)
                        })
                });
                if detail.processes.is_empty() {
                    detail.processes_absent = Some("no GPU process running".to_owned());
                }
            }
            Err(e) => detail.degraded.push(format!("processes: {e}")),
        }
    }
    detail.queries = client.cost.since(&started);
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_give_their_host() {
        assert_eq!(instance_host("node-a:9835"), "node-a");
        assert_eq!(instance_host("[::1]:9835"), "::1");
        assert_eq!(instance_host("node-a"), "node-a");
        assert_eq!(instance_host("::1"), "::1");
    }

    #[test]
    fn alternatives_match_exactly() {
        assert_eq!(exact_alternatives(["a.b:1", "c|d"]), r"a\.b:1|c\|d");
    }

    #[test]
    fn severity_words_of_alertmanager_read() {
        assert_eq!(severity_of(Some("warning")), Some(Severity::Warn));
        assert_eq!(severity_of(Some("critical")), Some(Severity::Fail));
        assert_eq!(severity_of(Some("fail")), Some(Severity::Fail));
        assert_eq!(severity_of(Some("sev1")), None);
        assert_eq!(severity_of(None), None);
    }
}
