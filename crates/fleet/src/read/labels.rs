//! What a series' labels say, read the same way by every decoder: its node, its finding, its
//! severity, its GPU's order.

use std::collections::BTreeSet;

use gpudiag_model::finding::Severity;
use gpudiag_model::prometheus_names::label;

use crate::client::{Client, Series};
use crate::model::FindingRef;

/// Every label the fleet reads from a series; the others are dropped as answers are parsed.
pub(super) const LABELS_READ: [&str; 26] = [
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
    label::ROLE,
    label::STATE,
    label::LEGACY_STRAGGLER_GPU,
    label::LEGACY_STRAGGLER_UUID,
    label::PID,
    label::PROCESS,
    label::USER,
];

/// The host part of an `instance` (`host:port`, `[v6]:port`).
pub(super) fn instance_host(instance: &str) -> &str {
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

/// The node a series is about: its node label, else its target's host.
pub(super) fn node_of(s: &Series, node_label: &str) -> Option<String> {
    s.label(node_label)
        .or_else(|| s.label(label::INSTANCE).map(instance_host))
        .map(str::to_owned)
}

pub(super) fn finding_ref(s: &Series) -> FindingRef {
    FindingRef {
        severity: severity_of(s.label(label::SEVERITY)).unwrap_or(Severity::Info),
        id: s.label(label::ID).unwrap_or("unknown").to_owned(),
    }
}

/// A `severity` label as gpudiag's severity; the common Alertmanager words too.
pub(super) fn severity_of(label: Option<&str>) -> Option<Severity> {
    match label?.to_ascii_lowercase().as_str() {
        "info" | "none" => Some(Severity::Info),
        "warn" | "warning" => Some(Severity::Warn),
        "fail" | "critical" | "error" | "page" => Some(Severity::Fail),
        _ => None,
    }
}

/// Orders GPUs by their numeric index, the unnumbered last.
pub(super) fn gpu_index_key(g: &Option<String>) -> (u64, String) {
    let s = g.clone().unwrap_or_default();
    (s.parse().unwrap_or(u64::MAX), s)
}

/// The GPUs a job matcher selects (by UUID); all when the selector names no job.
pub(crate) struct Chosen(pub(super) Option<BTreeSet<String>>);

impl Chosen {
    pub(super) fn all(&self) -> bool {
        self.0.is_none()
    }

    pub(super) fn keeps(&self, s: &Series) -> bool {
        match &self.0 {
            None => true,
            Some(set) => s.label(label::UUID).is_some_and(|u| set.contains(u)),
        }
    }
}

/// Asks the client to keep only the labels the decoders read (and the node label), so a
/// large answer costs what the fleet uses.
pub(super) fn keep_labels_read(client: &mut Client, node_label: &str) {
    let mut keep: BTreeSet<String> = LABELS_READ.iter().map(|l| (*l).to_owned()).collect();
    keep.insert(node_label.to_owned());
    client.keep_labels(Some(keep));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::answer::series;

    #[test]
    fn instances_give_their_host() {
        assert_eq!(instance_host("node-a:9835"), "node-a");
        assert_eq!(instance_host("[::1]:9835"), "::1");
        assert_eq!(instance_host("node-a"), "node-a");
        assert_eq!(instance_host("::1"), "::1");
    }

    #[test]
    fn the_node_label_names_the_node_else_the_instance_host() {
        let s = series(
            "x",
            &[("instance", "10.0.0.1:9400"), ("Hostname", "n1")],
            1.0,
        );
        assert_eq!(node_of(&s, "Hostname").as_deref(), Some("n1"));
        assert_eq!(node_of(&s, "node").as_deref(), Some("10.0.0.1"));
        assert_eq!(node_of(&series("x", &[], 1.0), "node"), None);
    }

    #[test]
    fn severity_words_of_alertmanager_read() {
        assert_eq!(severity_of(Some("warning")), Some(Severity::Warn));
        assert_eq!(severity_of(Some("critical")), Some(Severity::Fail));
        assert_eq!(severity_of(Some("fail")), Some(Severity::Fail));
        assert_eq!(severity_of(Some("sev1")), None);
        assert_eq!(severity_of(None), None);
    }

    #[test]
    fn a_finding_without_labels_is_an_unknown_info() {
        let f = finding_ref(&series("gpudiag_finding", &[], 1.0));
        assert_eq!((f.id.as_str(), f.severity), ("unknown", Severity::Info));
    }

    #[test]
    fn gpus_sort_by_number_then_name() {
        let mut gpus = [Some("10".to_owned()), None, Some("2".to_owned())];
        gpus.sort_by_key(gpu_index_key);
        assert_eq!(gpus, [Some("2".to_owned()), Some("10".to_owned()), None]);
    }
}
