//! The scrape targets (`up` and when each was last scraped): every target of a scrape job that
//! serves GPU series, so a node that went down (its series stale) still shows, and a
//! node_exporter does not.

use std::collections::{BTreeMap, BTreeSet};

use gpudiag_model::prometheus_names::{label, series};

use super::labels::node_of;
use super::promql::exact_alternatives;
use crate::client::Series;
use crate::selector::quote;

/// How far back a down target's node name is looked up.
const DOWN_NAME_LOOKBACK: &str = "1h";

/// A target's `up` series and the time (s) of its last scrape, when known.
pub(super) struct Target {
    pub series: Series,
    pub stamp: Option<f64>,
}

/// The scrape jobs that serve GPU series.
pub(super) fn gpu_scrape_jobs(device: &[Series], gpudiag: &[Series]) -> BTreeSet<String> {
    device
        .iter()
        .chain(gpudiag)
        .filter_map(|s| s.label(label::SCRAPE_JOB).map(str::to_owned))
        .collect()
}

/// The series of these scrape jobs.
pub(super) fn of_scrape_jobs(answer: &[Series], jobs: &BTreeSet<String>) -> Vec<Series> {
    answer
        .iter()
        .filter(|s| s.label(label::SCRAPE_JOB).is_some_and(|j| jobs.contains(j)))
        .cloned()
        .collect()
}

/// The instances seen in GPU series that `up` did not return.
pub(super) fn instances_missing<'a>(
    ups: &[Series],
    instance_node: &'a BTreeMap<String, String>,
) -> Vec<&'a str> {
    let seen: BTreeSet<&str> = ups
        .iter()
        .filter_map(|s| s.label(label::INSTANCE))
        .collect();
    instance_node
        .keys()
        .map(String::as_str)
        .filter(|i| !seen.contains(i))
        .collect()
}

/// `up` of these instances.
pub(super) fn up_of_instances(instances: &[&str]) -> String {
    format!(
        "{}{{{}=~{}}}",
        series::UP,
        label::INSTANCE,
        quote(&exact_alternatives(instances.iter().copied()))
    )
}

/// Pairs each `up` with its scrape time: by instance and scrape job, else (for the targets
/// read by instance) by instance alone.
pub(super) fn with_stamps(
    ups: Vec<Series>,
    stamps: &[Series],
    by_instance: &[Series],
) -> Vec<Target> {
    let same = |a: &Series, b: &Series, l: &str| a.label(l) == b.label(l);
    ups.into_iter()
        .map(|s| {
            let stamp = stamps
                .iter()
                .find(|t| same(t, &s, label::INSTANCE) && same(t, &s, label::SCRAPE_JOB))
                .or_else(|| by_instance.iter().find(|t| same(t, &s, label::INSTANCE)))
                .map(|t| t.value);
            Target { series: s, stamp }
        })
        .collect()
}

/// The targets whose node no series named.
pub(super) fn unnamed<'a>(
    targets: &'a [Target],
    instance_node: &BTreeMap<String, String>,
) -> Vec<&'a str> {
    targets
        .iter()
        .filter_map(|t| t.series.label(label::INSTANCE))
        .filter(|i| !instance_node.contains_key(*i))
        .collect()
}

/// The node names these instances had over the last hour.
pub(super) fn down_names_query(instances: &[&str], node_label: &str) -> String {
    format!(
        "group by ({instance}, {node_label}) (last_over_time({{{name}=~\"{info}|{temp}\",{instance}=~{inst}}}[{DOWN_NAME_LOOKBACK}]))",
        instance = label::INSTANCE,
        name = label::NAME,
        info = series::GPUDIAG_INFO,
        temp = series::DCGM_FI_DEV_GPU_TEMP,
        inst = quote(&exact_alternatives(instances.iter().copied())),
    )
}

/// Names the instances the answer to `down_names_query` names, keeping names already known.
pub(super) fn name_instances(
    found: &[Series],
    node_label: &str,
    instance_node: &mut BTreeMap<String, String>,
) {
    for s in found {
        if let (Some(i), Some(n)) = (s.label(label::INSTANCE), node_of(s, node_label)) {
            instance_node.entry(i.to_owned()).or_insert(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::series as s;

    #[test]
    fn only_scrape_jobs_with_gpu_series_count() {
        let device = [s("DCGM_FI_DEV_GPU_UTIL", &[("job", "dcgm")], 1.0)];
        let gpudiag = [s("gpudiag_info", &[("job", "gpudiag")], 1.0)];
        let jobs = gpu_scrape_jobs(&device, &gpudiag);
        let ups = [
            s("up", &[("job", "dcgm"), ("instance", "a:9400")], 1.0),
            s("up", &[("job", "node"), ("instance", "a:9100")], 1.0),
            s("up", &[("job", "gpudiag"), ("instance", "b:9835")], 0.0),
        ];
        let kept = of_scrape_jobs(&ups, &jobs);
        let instances: Vec<_> = kept.iter().filter_map(|s| s.label("instance")).collect();
        assert_eq!(instances, ["a:9400", "b:9835"]);
    }

    #[test]
    fn instances_up_lacks_are_asked_by_instance() {
        let ups = [s("up", &[("instance", "a:1")], 1.0)];
        let nodes: BTreeMap<String, String> = [("a:1", "a"), ("b.x:2", "b")]
            .map(|(i, n)| (i.to_owned(), n.to_owned()))
            .into();
        let missing = instances_missing(&ups, &nodes);
        assert_eq!(missing, ["b.x:2"]);
        assert_eq!(up_of_instances(&missing), r#"up{instance=~"b\\.x:2"}"#);
    }

    #[test]
    fn a_stamp_matches_instance_and_job_else_instance_alone() {
        let ups = vec![
            s("up", &[("instance", "a:1"), ("job", "j")], 1.0),
            s("up", &[("instance", "b:1"), ("job", "j")], 0.0),
            s("up", &[("instance", "c:1"), ("job", "j")], 0.0),
        ];
        let stamps = [
            s("", &[("instance", "a:1"), ("job", "other")], 5.0),
            s("", &[("instance", "a:1"), ("job", "j")], 10.0),
        ];
        let by_instance = [s("", &[("instance", "b:1")], 20.0)];
        let targets = with_stamps(ups, &stamps, &by_instance);
        let got: Vec<Option<f64>> = targets.iter().map(|t| t.stamp).collect();
        assert_eq!(got, [Some(10.0), Some(20.0), None]);
    }

    #[test]
    fn down_targets_are_named_from_their_last_series() {
        let targets = vec![
            Target {
                series: s("up", &[("instance", "a:1")], 0.0),
                stamp: None,
            },
            Target {
                series: s("up", &[("instance", "b:1")], 1.0),
                stamp: None,
            },
        ];
        let mut nodes: BTreeMap<String, String> = [("b:1".to_owned(), "b".to_owned())].into();
        let unnamed = unnamed(&targets, &nodes);
        assert_eq!(unnamed, ["a:1"]);
        assert_eq!(
            down_names_query(&unnamed, "Hostname"),
            "group by (instance, Hostname) (last_over_time({__name__=~\"gpudiag_info|DCGM_FI_DEV_GPU_TEMP\",instance=~\"a:1\"}[1h]))"
        );
        let found = [s("", &[("instance", "a:1"), ("Hostname", "node-a")], 1.0)];
        name_instances(&found, "Hostname", &mut nodes);
        assert_eq!(nodes["a:1"], "node-a");
    }
}
