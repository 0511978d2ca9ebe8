//! One node's detail: its charts (range queries over a span before the fleet's instant) and
//! the processes on its GPUs.

use std::collections::BTreeMap;
use std::time::Duration;

use gpudiag_model::prometheus_names::{label, series};

use super::labels::gpu_index_key;
use super::labels::keep_labels_read;
use super::promql::series_on_instances;
use crate::client::{Client, RangeSeries, Series};
use crate::model::*;

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
    client.begin_look();
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
    let names = CHART_SERIES.iter().map(|(_, n, _)| *n);
    match client.range(
        &series_on_instances(names, &instances),
        detail.start_ms,
        at_ms,
        step,
    ) {
        Ok(series) => add_charts(&mut detail, series),
        Err(e) => detail.degraded.push(format!("charts: {e}")),
    }
    if !node.exporters.contains(&Exporter::Gpudiag) {
        detail.processes_absent = Some("n/a: dcgm-exporter only".to_owned());
    } else {
        let q = series_on_instances(PROCESS_SERIES, &instances);
        match client.instant(&q, Some(at_ms)) {
            Ok(series) => {
                detail.processes = processes(series);
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

/// Each chart series under its GPU (UUID, else index), scaled to the chart's unit; gpudiag
/// and dcgm-exporter may both report a GPU: the longer series wins.
fn add_charts(detail: &mut NodeDetail, answer: Vec<RangeSeries>) {
    for s in answer {
        let name = s.labels.get(label::NAME);
        let Some((chart, _, scale)) = CHART_SERIES.iter().find(|(_, n, _)| name == Some(*n)) else {
            continue;
        };
        let key = s
            .labels
            .get(label::UUID)
            .or_else(|| s.labels.get(label::GPU))
            .unwrap_or_default()
            .to_owned();
        let points: Vec<(i64, f64)> = s.points.iter().map(|(t, v)| (*t, v * scale)).collect();
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

/// The processes the answer names, one per (GPU, pid), by GPU then most memory first.
fn processes(answer: Vec<Series>) -> Vec<Process> {
    let mut by_pid: BTreeMap<(String, String), Process> = BTreeMap::new();
    for s in answer {
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
            Some(series::GPUDIAG_PROCESS_MEMORY_USED_BYTES) => p.memory_used_bytes = Some(s.value),
            Some(series::GPUDIAG_PROCESS_SM_UTIL_PERCENT) => p.sm_util_pct = Some(s.value),
            Some(series::GPUDIAG_PROCESS_VERDICT) => {
                p.verdict = s.label(label::VERDICT).map(str::to_owned)
            }
            _ => {}
        }
    }
    let mut processes: Vec<Process> = by_pid.into_values().collect();
    processes.sort_by(|a, b| {
        gpu_index_key(&a.gpu)
            .cmp(&gpu_index_key(&b.gpu))
            .then_with(|| {
                b.memory_used_bytes
                    .partial_cmp(&a.memory_used_bytes)
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
    });
    processes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::series as s;

    fn range(name: &str, labels: &[(&str, &str)], points: &[(i64, f64)]) -> RangeSeries {
        let mut labels: crate::client::Labels = labels.iter().copied().collect();
        labels.insert("__name__", name);
        RangeSeries {
            labels,
            points: points.to_vec(),
        }
    }

    #[test]
    fn charts_scale_to_their_unit_and_the_longer_exporter_wins() {
        let mut detail = NodeDetail::default();
        add_charts(
            &mut detail,
            vec![
                range(
                    series::DCGM_FI_PROF_SM_ACTIVE,
                    &[("UUID", "GPU-1")],
                    &[(0, 0.5)],
                ),
                range(
                    series::DCGM_FI_DEV_GPU_UTIL,
                    &[("UUID", "GPU-1")],
                    &[(0, 10.0)],
                ),
                range(
                    series::DCGM_FI_DEV_GPU_UTIL,
                    &[("UUID", "GPU-1")],
                    &[(0, 20.0), (15, 30.0)],
                ),
                range(
                    series::DCGM_FI_DEV_POWER_USAGE,
                    &[("gpu", "3")],
                    &[(0, 100.0)],
                ),
                range("DCGM_FI_DEV_SM_CLOCK", &[("UUID", "GPU-1")], &[(0, 1.0)]),
            ],
        );
        let gpu1 = &detail.charts["GPU-1"];
        assert_eq!(gpu1["sm_active_pct"], [(0, 50.0)]);
        assert_eq!(gpu1["util_pct"], [(0, 20.0), (15, 30.0)]);
        assert_eq!(gpu1.len(), 2);
        assert_eq!(detail.charts["3"]["power_w"], [(0, 100.0)]);
    }

    #[test]
    fn a_process_gathers_its_series_and_sorts_by_gpu_then_memory() {
        let p = |name, gpu, uuid, pid, value| {
            s(
                name,
                &[
                    ("gpu", gpu),
                    ("UUID", uuid),
                    ("pid", pid),
                    ("process", "python"),
                    ("verdict", "idle"),
                ],
                value,
            )
        };
        let answer = vec![
            p(
                series::GPUDIAG_PROCESS_MEMORY_USED_BYTES,
                "1",
                "GPU-1",
                "10",
                5.0,
            ),
            p(
                series::GPUDIAG_PROCESS_MEMORY_USED_BYTES,
                "0",
                "GPU-0",
                "11",
                1.0,
            ),
            p(
                series::GPUDIAG_PROCESS_MEMORY_USED_BYTES,
                "0",
                "GPU-0",
                "12",
                9.0,
            ),
            p(
                series::GPUDIAG_PROCESS_SM_UTIL_PERCENT,
                "0",
                "GPU-0",
                "12",
                40.0,
            ),
            p(series::GPUDIAG_PROCESS_VERDICT, "0", "GPU-0", "12", 1.0),
            s(series::GPUDIAG_PROCESS_VERDICT, &[("gpu", "0")], 1.0),
        ];
        let got = processes(answer);
        let pids: Vec<&str> = got.iter().map(|p| p.pid.as_str()).collect();
        assert_eq!(pids, ["12", "11", "10"]);
        assert_eq!(got[0].sm_util_pct, Some(40.0));
        assert_eq!(got[0].verdict.as_deref(), Some("idle"));
        assert_eq!(got[1].verdict, None);
        assert_eq!(got[0].name.as_deref(), Some("python"));
    }
}
