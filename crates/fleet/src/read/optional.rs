//! The optional reads: the firing alerts and the shipped rules (whether they are loaded, and
//! their per-job figures). A failure leaves its part out and says so in `degraded`.

use gpudiag_model::prometheus_names::{label, rules};

use super::labels::{instance_host, severity_of};
use super::promql::any_of;
use crate::client::{Alerts, ApiAlert, ApiError, MAX_ALERTS_KEPT, Series};
use crate::model::{Alert, Fleet, RulesState};

/// The shipped rules' series the job view reads.
const RULE_SERIES: [&str; 4] = [
    rules::JOB_GPU_SM_ACTIVE_AVG,
    rules::JOB_GPU_GPU_UTIL_PERCENT_AVG,
    rules::JOB_SM_ACTIVE_MEDIAN,
    rules::JOB_SM_ACTIVE_SPREAD,
];

/// The alerts the shipped rules raise; others are shown only when they name a node or GPU of
/// the fleet.
pub const GPUDIAG_ALERTS: [&str; 8] = rules::ALERTS;

/// A rule whose presence means the shipped rules are loaded.
pub(super) const RULES_MARKER: &str = rules::JOB_GPUS_COUNT;

/// The rules' job figures.
pub(super) fn rule_query() -> String {
    any_of(RULE_SERIES)
}

/// The three answers, as they came back.
pub(super) struct Answers {
    /// `None`: not asked, the instant being more than 5 minutes from now.
    pub alerts: Option<Result<Alerts, ApiError>>,
    /// Whether the rules API lists the shipped rules' marker.
    pub rules_listed: Result<bool, ApiError>,
    pub rule_series: Result<Vec<Series>, ApiError>,
}

/// The alerts and the rules' job figures read; the rules' state set on the fleet and what
/// failed added to its `degraded`.
pub(super) fn decode(answers: Answers, fleet: &mut Fleet) -> (Vec<ApiAlert>, Vec<Series>) {
    let alerts = match answers.alerts {
        None => {
            fleet.degraded.push(
                "alerts: Prometheus gives only the present ones, and --at is more than 5 minutes away"
                    .to_owned(),
            );
            Vec::new()
        }
        Some(Ok(a)) => {
            let left = a.total.saturating_sub(a.kept.len() as u64);
            if left > 0 {
                fleet.left_out.alerts = left;
                fleet.degraded.push(format!(
                    "alerts: Prometheus holds {}; the worst {MAX_ALERTS_KEPT} are read (firing \
                     before pending, then by severity), {left} left out",
                    a.total
                ));
            }
            a.kept
        }
        Some(Err(e)) => {
            fleet.degraded.push(format!("alerts: {e}"));
            Vec::new()
        }
    };
    let rules_listed = answers.rules_listed.as_ref().ok().copied();
    let rule_series: Vec<Series> = match answers.rule_series {
        _ if rules_listed == Some(false) => Vec::new(),
        Ok(s) => s,
        Err(e) => {
            fleet.degraded.push(format!("the rules' job figures: {e}"));
            Vec::new()
        }
    };
    fleet.rules = rules_state(rules_listed, &answers.rules_listed, !rule_series.is_empty());
    (alerts, rule_series)
}

/// Loaded when the rules API lists the marker; when it cannot be asked, loaded if their
/// figures are there.
fn rules_state(listed: Option<bool>, names: &Result<bool, ApiError>, figures: bool) -> RulesState {
    match (listed, names) {
        (Some(true), _) => RulesState::Loaded,
        (Some(false), _) => RulesState::NotLoaded,
        (None, _) if figures => RulesState::Loaded,
        (None, Err(e)) => RulesState::Unknown {
            reason: e.to_string(),
        },
        (None, Ok(_)) => RulesState::NotLoaded,
    }
}

/// An alert as the fleet shows it; its node from the node label, else `Hostname`, else the
/// host of its `instance`.
pub(super) fn alert_of(a: &ApiAlert, node_label: &str) -> Alert {
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
        scope: l(label::SCOPE),
        active_since: a.active_at.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::{alert, fleet, series};
    use gpudiag_model::finding::Severity;

    fn failed() -> ApiError {
        ApiError::Setup("down".to_owned())
    }

    #[test]
    fn the_marker_rule_says_the_rules_are_loaded() {
        let mut f = fleet();
        let figure = series(rules::JOB_SM_ACTIVE_MEDIAN, &[("job_key", "k")], 0.5);
        let answers = Answers {
            alerts: Some(Ok(Alerts {
                kept: vec![alert("firing", &[("alertname", "GpuLost")])],
                total: 1,
            })),
            rules_listed: Ok(true),
            rule_series: Ok(vec![figure.clone()]),
        };
        let (alerts, figures) = decode(answers, &mut f);
        assert_eq!((alerts.len(), figures), (1, vec![figure]));
        assert_eq!(f.rules, RulesState::Loaded);
        assert!(f.degraded.is_empty());
    }

    #[test]
    fn without_the_marker_figures_are_ignored() {
        let mut f = fleet();
        let answers = Answers {
            alerts: None,
            rules_listed: Ok(false),
            rule_series: Ok(vec![series(rules::JOB_SM_ACTIVE_MEDIAN, &[], 0.5)]),
        };
        let (_, figures) = decode(answers, &mut f);
        assert!(figures.is_empty());
        assert_eq!(f.rules, RulesState::NotLoaded);
        assert_eq!(f.degraded.len(), 1, "{:?}", f.degraded);
        assert!(f.degraded[0].starts_with("alerts: Prometheus gives only the present ones"));
    }

    #[test]
    fn failed_reads_degrade_and_figures_stand_in_for_the_rules_api() {
        let mut f = fleet();
        let answers = Answers {
            alerts: Some(Err(failed())),
            rules_listed: Err(failed()),
            rule_series: Ok(vec![series(rules::JOB_SM_ACTIVE_MEDIAN, &[], 0.5)]),
        };
        decode(answers, &mut f);
        assert_eq!(f.rules, RulesState::Loaded);
        assert_eq!(f.degraded.len(), 1);

        let mut f = fleet();
        let answers = Answers {
            alerts: Some(Ok(Alerts::default())),
            rules_listed: Err(failed()),
            rule_series: Err(failed()),
        };
        decode(answers, &mut f);
        assert!(matches!(f.rules, RulesState::Unknown { .. }));
        assert!(
            f.degraded[0].starts_with("the rules' job figures: "),
            "{:?}",
            f.degraded
        );
    }

    #[test]
    fn an_alert_finds_its_node_and_keeps_printable_summary() {
        let mut a = alert(
            "firing",
            &[
                ("alertname", "GpuXidError"),
                ("severity", "critical"),
                ("instance", "n1:9835"),
                ("UUID", "GPU-1"),
                ("gpu", ""),
            ],
        );
        a.annotations
            .insert("summary".to_owned(), "xid\n48\u{1b}[31m".to_owned());
        let got = alert_of(&a, "Hostname");
        assert_eq!(got.name, "GpuXidError");
        assert_eq!(got.severity, Some(Severity::Fail));
        assert_eq!(got.node.as_deref(), Some("n1"));
        assert_eq!(got.uuid.as_deref(), Some("GPU-1"));
        assert_eq!(got.gpu, None, "an empty label is no label");
        assert_eq!(got.summary.as_deref(), Some("xid48[31m"));
        assert_eq!(alert_of(&alert("pending", &[]), "Hostname").name, "unnamed");
    }
}
