//! gpudiag's own series per GPU and per node: verdicts, whether a GPU is judged, findings,
//! which jobs hold it, and each node's verdicts on its jobs.

use gpudiag_model::prometheus_names::{label, series};

use super::devices::{Gathered, GpuDraft, draft};
use super::labels::Chosen;
use super::labels::{finding_ref, node_of};
use crate::client::Series;
use crate::model::{Exporter, GpuVerdict, JobRef};

/// gpudiag's own series read for the table.
pub(super) const GPUDIAG_SERIES: [&str; 9] = [
    series::GPUDIAG_INFO,
    series::GPUDIAG_VERDICT,
    series::GPUDIAG_VERDICT_JUDGED,
    series::GPUDIAG_FINDING,
    series::GPUDIAG_GPU_JOB_INFO,
    series::GPUDIAG_JOB_VERDICT,
    series::GPUDIAG_JOB_GPU_ROLE,
    series::GPUDIAG_JOB_STUCK_SECONDS,
    series::GPUDIAG_JOB_MISSING_RANK_INFO,
];

/// A node's own judgement of its jobs, read with the jobs: not figures of a GPU.
const NODE_JOB_SERIES: [&str; 4] = [
    series::GPUDIAG_JOB_VERDICT,
    series::GPUDIAG_JOB_GPU_ROLE,
    series::GPUDIAG_JOB_STUCK_SECONDS,
    series::GPUDIAG_JOB_MISSING_RANK_INFO,
];

/// Adds gpudiag's series to the drafts (a series for a GPU the device query did not return,
/// one that reports no utilisation say, still makes the GPU), the node findings and the job
/// verdicts.
pub(super) fn gather(g: &mut Gathered, gpudiag: &[Series], node_label: &str, chosen: &Chosen) {
    for s in gpudiag {
        let Some(node) = node_of(s, node_label) else {
            continue;
        };
        if let Some(i) = s.label(label::INSTANCE)
            && chosen.keeps(s)
        {
            g.instance_node.entry(i.to_owned()).or_insert(node.clone());
        }
        let name = s.label(label::NAME).unwrap_or_default();
        if NODE_JOB_SERIES.contains(&name) {
            g.node_jobs.push((node, s.clone()));
            continue;
        }
        let on_gpu = s.label(label::UUID).is_some() || s.label(label::GPU).is_some();
        if name == series::GPUDIAG_FINDING && !on_gpu {
            if chosen.all() {
                g.node_findings
                    .entry(node)
                    .or_default()
                    .insert(finding_ref(s));
            }
            continue;
        }
        if !on_gpu || !chosen.keeps(s) || name == series::GPUDIAG_INFO {
            continue;
        }
        // Past the most GPUs a look reads the look fails (`read`): no more drafts are made.
        if g.drafts.len() > super::MAX_GPUS_READ {
            return;
        }
        let d = draft(&mut g.drafts, &g.duplicated, &node, s);
        d.exporters.insert(Exporter::Gpudiag);
        if let Some(i) = s.label(label::INSTANCE) {
            d.instances.insert(i.to_owned());
        }
        apply(d, name, s);
    }
}

/// One of gpudiag's per-GPU series, into its draft.
fn apply(d: &mut GpuDraft, name: &str, s: &Series) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::series as s;
    use gpudiag_model::finding::Severity;

    const GPU: [(&str, &str); 3] = [("instance", "a:9835"), ("UUID", "GPU-1"), ("gpu", "0")];

    fn gathered(answer: &[Series], chosen: Chosen) -> Gathered {
        let mut g = Gathered::default();
        gather(&mut g, answer, "Hostname", &chosen);
        g
    }

    fn on_gpu(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        GPU.iter().chain(extra).copied().collect()
    }

    #[test]
    fn a_verdict_a_finding_and_a_job_land_on_their_gpu() {
        let answer = [
            s(
                series::GPUDIAG_VERDICT,
                &on_gpu(&[("verdict", "idle"), ("confidence", "high")]),
                1.0,
            ),
            s(series::GPUDIAG_VERDICT_JUDGED, &on_gpu(&[]), 1.0),
            s(
                series::GPUDIAG_FINDING,
                &on_gpu(&[("id", "power.x"), ("severity", "warn")]),
                1.0,
            ),
            s(
                series::GPUDIAG_FINDING,
                &on_gpu(&[("id", "gone"), ("severity", "fail")]),
                0.0,
            ),
            s(
                series::GPUDIAG_GPU_JOB_INFO,
                &on_gpu(&[("job_key", "slurm:7"), ("slurm_job", "7")]),
                1.0,
            ),
        ];
        let g = gathered(&answer, Chosen(None));
        let d = &g.drafts["uuid:GPU-1"];
        assert!(matches!(
            &d.verdict,
            Some(GpuVerdict::Judged { bottleneck, confidence, basis: None })
                if bottleneck == "idle" && confidence.as_deref() == Some("high")
        ));
        assert_eq!(d.judged, Some(true));
        let ids: Vec<(&str, Severity)> = d
            .findings
            .iter()
            .map(|f| (f.id.as_str(), f.severity))
            .collect();
        assert_eq!(
            ids,
            [("power.x", Severity::Warn)],
            "a finding at 0 is not active"
        );
        let job = d.jobs.first().unwrap();
        assert_eq!(
            (job.job_key.as_str(), job.joined_by.as_str()),
            ("slurm:7", "unknown")
        );
        assert_eq!(job.slurm_job.as_deref(), Some("7"));
        assert!(d.exporters.contains(&Exporter::Gpudiag));
        assert_eq!(g.instance_node["a:9835"], "a");
    }

    #[test]
    fn node_findings_and_job_verdicts_stay_with_the_node() {
        let answer = [
            s(
                series::GPUDIAG_FINDING,
                &[
                    ("instance", "a:9835"),
                    ("id", "kernel.x"),
                    ("severity", "critical"),
                ],
                1.0,
            ),
            s(
                series::GPUDIAG_JOB_VERDICT,
                &[("instance", "a:9835"), ("job_key", "k")],
                1.0,
            ),
            s(series::GPUDIAG_INFO, &[("instance", "a:9835")], 1.0),
            // A GPU's role in a job goes with the job, and makes no GPU of its own; so do a
            // stalled job's stuck time and the rank it waits for.
            s(
                series::GPUDIAG_JOB_GPU_ROLE,
                &on_gpu(&[("job_key", "k"), ("role", "straggler")]),
                1.0,
            ),
            s(
                series::GPUDIAG_JOB_STUCK_SECONDS,
                &[("instance", "a:9835"), ("job_key", "k")],
                42.0,
            ),
            s(
                series::GPUDIAG_JOB_MISSING_RANK_INFO,
                &on_gpu(&[("job_key", "k"), ("pid", "7"), ("state", "sleeping")]),
                1.0,
            ),
        ];
        let g = gathered(&answer, Chosen(None));
        assert!(
            g.drafts.is_empty(),
            "gpudiag_info and job series make no GPU"
        );
        let f = g.node_findings["a"].first().unwrap();
        assert_eq!((f.id.as_str(), f.severity), ("kernel.x", Severity::Fail));
        assert_eq!(g.node_jobs.len(), 4);
        assert!(g.node_jobs.iter().all(|(node, _)| node == "a"));
    }

    #[test]
    fn a_job_selector_drops_node_findings_and_other_gpus() {
        let chosen = Chosen(Some(["GPU-2".to_owned()].into()));
        let answer = [
            s(
                series::GPUDIAG_FINDING,
                &[("instance", "a:9835"), ("id", "kernel.x")],
                1.0,
            ),
            s(
                series::GPUDIAG_VERDICT,
                &on_gpu(&[("verdict", "idle")]),
                1.0,
            ),
        ];
        let g = gathered(&answer, chosen);
        assert!(g.node_findings.is_empty());
        assert!(g.drafts.is_empty());
        assert!(g.instance_node.is_empty());
    }
}
