//! One look at the fleet: a fixed set of queries, evaluated at one instant, merged into a
//! [`Fleet`]. The device figures come from dcgm-exporter's series names, which both gpudiag and
//! dcgm-exporter write, so a node running either (or both, merged by UUID) is seen; what only
//! gpudiag writes (verdicts, findings, jobs, processes) is read from its own series.
//!
//! A failed core query (the targets, the device figures) makes the whole look `could_not_run`
//! with that one line; a failed optional read (alerts, rules, the rules' job figures) leaves
//! its part out and says so in `degraded`.
//!
//! `Reader` asks; each series (or concern) has its decoder beside its tests, fed with instant
//! answers: `devices` (dcgm-exporter's figures), `gpudiag_series` (verdicts, findings, job
//! info), `targets` (`up` and scrape ages), `optional` (alerts and the shipped rules),
//! `nodes`, `jobs` and `status` (the merge), `node_detail` (one node's charts and processes).

mod devices;
mod gpudiag_series;
mod jobs;
mod labels;
mod node_detail;
mod nodes;
mod optional;
mod promql;
mod status;
mod targets;

pub use node_detail::{CHART_SERIES, read_node};
pub use optional::GPUDIAG_ALERTS;
pub use promql::exact_alternatives;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpudiag_model::finding::Status;
use gpudiag_model::prometheus_names::{label, series};

use crate::client::{ApiError, Client, Series};
use crate::model::*;
use crate::selector::Selector;
use devices::Gathered;
use gpudiag_model::build_info::ToolInfo;
use labels::{Chosen, keep_labels_read};
use targets::Target as ScrapeTarget;

/// What to read.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub selector: Selector,
    pub node_label: String,
    /// The instant to evaluate at (ms since the epoch); now when `None`.
    pub at_ms: Option<i64>,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Reads the fleet. Never fails: what went wrong is in the result.
pub fn read_fleet(client: &mut Client, req: &ReadRequest) -> Fleet {
    client.begin_look();
    keep_labels_read(client, &req.node_label);
    let at = req.at_ms.unwrap_or_else(now_ms);
    let mut fleet = unread_fleet(client.url(), req, at);
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
    // The strings this look kept go with it, before the fleet is printed or drawn.
    client.begin_look();
    fleet
}

/// The fleet before anything is read: could not run, until it is.
fn unread_fleet(prometheus: &str, req: &ReadRequest, at: i64) -> Fleet {
    Fleet {
        schema_version: FLEET_SCHEMA_VERSION,
        tool: ToolInfo::this(),
        prometheus: prometheus.to_owned(),
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
        left_out: LeftOut::default(),
        queries: QueryCost::default(),
    }
}

/// The most GPUs one look reads; more is an error asking for a narrower selector, as the
/// fleet's listing and its merge hold every GPU they read.
pub const MAX_GPUS_READ: usize = 16_384;

/// The four reads every look needs.
struct CoreAnswers {
    gpudiag: Vec<Series>,
    device: Vec<Series>,
    ups: Vec<Series>,
    stamps: Vec<Series>,
}

struct Reader<'a> {
    client: &'a mut Client,
    req: &'a ReadRequest,
    at: i64,
}

impl<'a> Reader<'a> {
    fn new(client: &'a mut Client, req: &'a ReadRequest, at: i64) -> Self {
        Reader { client, req, at }
    }

    fn instant(&mut self, q: &str) -> Result<Vec<Series>, ApiError> {
        self.client.instant(q, Some(self.at))
    }

    fn read(&mut self, fleet: &mut Fleet) -> Result<(), ApiError> {
        let sel = self.req.selector.clone();
        let chosen = self.chosen(&sel)?;
        let core = self.core(&sel)?;
        let node_label = self.req.node_label.as_str();
        let gpudiag_instances = devices::gpudiag_instances(&core.gpudiag);
        let mut gathered = Gathered {
            duplicated: devices::duplicated_uuids(
                &core.device,
                &core.gpudiag,
                node_label,
                &gpudiag_instances,
            ),
            ..Gathered::default()
        };
        devices::gather(
            &mut gathered,
            &core.device,
            node_label,
            &chosen,
            &gpudiag_instances,
        );
        gpudiag_series::gather(&mut gathered, &core.gpudiag, node_label, &chosen);
        if gathered.drafts.len() > MAX_GPUS_READ {
            return Err(ApiError::TooManyGpus {
                url: self.client.url().to_owned(),
                limit: MAX_GPUS_READ,
            });
        }

        let mut targets = self.scrape_targets(&core, &gathered)?;
        // The series are in the drafts now: their memory goes before the rest is read.
        drop(core);
        if !chosen.all() {
            targets.retain(|t| {
                t.series
                    .label(label::INSTANCE)
                    .is_some_and(|i| gathered.instance_node.contains_key(i))
            });
        }
        self.name_down_targets(&targets, &mut gathered, fleet);
        let optional = self.optional_reads();
        let (alerts, rule_series) = optional::decode(optional, fleet);

        nodes::assemble(
            fleet,
            gathered,
            nodes::Reads {
                targets,
                alerts,
                rule_series,
                gpudiag_instances: &gpudiag_instances,
                at: self.at,
                everything: sel.device.is_empty() && sel.job.is_empty(),
            },
        );
        Ok(())
    }

    /// The GPUs a job matcher selects, through gpudiag's job info.
    fn chosen(&mut self, sel: &Selector) -> Result<Chosen, ApiError> {
        if sel.job.is_empty() {
            return Ok(Chosen(None));
        }
        let mut all = sel.device.clone();
        all.extend(sel.job.iter().cloned());
        let q = Selector {
            device: all,
            job: Vec::new(),
        }
        .series(series::GPUDIAG_GPU_JOB_INFO, &[]);
        let uuids = self
            .instant(&q)?
            .iter()
            .filter_map(|s| s.label(label::UUID).map(str::to_owned))
            .collect();
        Ok(Chosen(Some(uuids)))
    }

    /// The four core reads at once: the first look at a large fleet waits for the slowest.
    /// `up` is read for every target the selector allows and kept later for the scrape jobs
    /// that serve GPU series, so a node that went down (its series stale) still shows.
    fn core(&mut self, sel: &Selector) -> Result<CoreAnswers, ApiError> {
        let ups_query = sel.series(series::UP, &[]);
        let mut answers = self
            .client
            .instant_all(
                &[
                    sel.series(
                        "",
                        &[promql::names_matcher(&gpudiag_series::GPUDIAG_SERIES)],
                    ),
                    sel.series("", &[promql::names_matcher(&devices::DEVICE_SERIES)]),
                    ups_query.clone(),
                    format!("timestamp({ups_query})"),
                ],
                Some(self.at),
            )
            .into_iter();
        let mut next = || {
            answers
                .next()
                .unwrap_or_else(|| Err(ApiError::Setup("a query went missing".to_owned())))
        };
        Ok(CoreAnswers {
            gpudiag: next()?,
            device: next()?,
            ups: next()?,
            stamps: next()?,
        })
    }

    /// Every target of a scrape job that serves GPU series, with its last scrape's time. A
    /// matcher on a label `up` lacks (Hostname) leaves `up` empty: the targets of the
    /// instances seen are read by instance then.
    fn scrape_targets(
        &mut self,
        core: &CoreAnswers,
        gathered: &Gathered,
    ) -> Result<Vec<ScrapeTarget>, ApiError> {
        let jobs = targets::gpu_scrape_jobs(&core.device, &core.gpudiag);
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut ups = targets::of_scrape_jobs(&core.ups, &jobs);
        let stamps = targets::of_scrape_jobs(&core.stamps, &jobs);
        let missing = targets::instances_missing(&ups, &gathered.instance_node);
        let mut stamps_missing = Vec::new();
        if !missing.is_empty() {
            let by_instance = targets::up_of_instances(&missing);
            ups.extend(self.instant(&by_instance)?);
            stamps_missing = self.instant(&format!("timestamp({by_instance})"))?;
        }
        Ok(targets::with_stamps(ups, &stamps, &stamps_missing))
    }

    /// Down targets' series are stale now: their node is named from the last hour.
    fn name_down_targets(
        &mut self,
        targets: &[ScrapeTarget],
        gathered: &mut Gathered,
        fleet: &mut Fleet,
    ) {
        let unnamed = targets::unnamed(targets, &gathered.instance_node);
        if unnamed.is_empty() {
            return;
        }
        let q = targets::down_names_query(&unnamed, &self.req.node_label);
        match self.instant(&q) {
            Ok(found) => {
                targets::name_instances(&found, &self.req.node_label, &mut gathered.instance_node)
            }
            Err(e) => fleet
                .degraded
                .push(format!("down targets' node names: {e}")),
        }
    }

    /// Alerts (now only: Prometheus keeps no history of them over its API), the rules and the
    /// rules' job figures, asked at once.
    fn optional_reads(&mut self) -> optional::Answers {
        let alerts_now = (self.at - now_ms()).abs() <= 5 * 60 * 1000;
        let rule_query = optional::rule_query();
        let at = self.at;
        let (mut for_alerts, mut for_rules, mut for_series) = (
            self.client.clone(),
            self.client.clone(),
            self.client.clone(),
        );
        for c in [&mut for_alerts, &mut for_rules, &mut for_series] {
            c.cost = QueryCost::default();
        }
        let answers = std::thread::scope(|scope| {
            let alerts = scope.spawn(|| alerts_now.then(|| for_alerts.alerts()));
            let listed = scope.spawn(|| for_rules.has_rule(optional::RULES_MARKER));
            let series = scope.spawn(|| for_series.instant(&rule_query, Some(at)));
            let failed = || ApiError::Setup("a query's thread failed".to_owned());
            optional::Answers {
                alerts: alerts.join().unwrap_or_else(|_| Some(Err(failed()))),
                rules_listed: listed.join().unwrap_or_else(|_| Err(failed())),
                rule_series: series.join().unwrap_or_else(|_| Err(failed())),
            }
        });
        for c in [&for_alerts, &for_rules, &for_series] {
            self.client.cost.add(&c.cost);
        }
        answers
    }
}

/// Hand-made instant answers for the decoders' tests.
#[cfg(test)]
pub(crate) mod answer {
    use crate::client::{ApiAlert, Series};
    use crate::model::Fleet;
    use crate::selector::Selector;

    /// A fleet with nothing read yet, its nodes named by `Hostname`.
    pub fn fleet() -> Fleet {
        let req = super::ReadRequest {
            selector: Selector::default(),
            node_label: "Hostname".to_owned(),
            at_ms: Some(0),
        };
        super::unread_fleet("http://prometheus", &req, 0)
    }

    /// A series named `name` with these labels and value.
    pub fn series(name: &str, labels: &[(&str, &str)], value: f64) -> Series {
        let mut s = Series {
            labels: labels.iter().copied().collect(),
            value,
        };
        if !name.is_empty() {
            s.labels.insert("__name__", name);
        }
        s
    }

    pub fn alert(state: &str, labels: &[(&str, &str)]) -> ApiAlert {
        ApiAlert {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            annotations: Default::default(),
            state: state.to_owned(),
            active_at: None,
        }
    }
}
