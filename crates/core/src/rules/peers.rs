//! Peer comparison: on a host with several GPUs of one model, a GPU whose probe figures fall
//! more than a margin behind the median of the others is flagged with the numbers, and so is a
//! GPU-to-GPU link that falls behind the other links of the same kind (NV18, PIX, ...).
//!
//! Peers, not a datasheet, are the reference here: GPUs of one host share drivers, cooling and
//! power policy, so a GPU behind its siblings points at that GPU (clocks, a degraded link, a
//! failing part) even where the reference table knows nothing about the model.

use std::collections::BTreeMap;

use serde_json::json;

use super::{round2, shown};
use gpudiag_model::finding::{Evidence, Finding, Severity, values};
use gpudiag_model::sample::TimeMs;
use gpudiag_probes::p2p::{self, PeerLink};
use gpudiag_probes::runner::DeviceProbes;
use gpudiag_probes::{Verdict, median};

/// Units where a larger figure is better; latencies are compared by nobody here.
fn throughput(unit: &str) -> bool {
    matches!(unit, "GB/s" | "TFLOP/s")
}

/// Figures that say something about the GPU itself. Pageable copies are left out: the host's
/// memcpy into a staging buffer sets their pace, and it varies from run to run by a third on an
/// idle H200 host (seen with two GPUs of one host: 9.7 and 13.8 GB/s, D2H), so they would
/// flag healthy GPUs.
fn comparable(metric: &str, unit: &str, value: f64) -> bool {
    throughput(unit)
        && value.is_finite()
        && !p2p::is_pair_metric(metric)
        && !metric.contains("pageable")
}

/// A figure one GPU measured.
struct Figure {
    device: u32,
    value: f64,
}

/// A figure where a GPU is behind its peers.
#[derive(Clone)]
struct Behind {
    /// 0.2 = 20% below the peers' median.
    shortfall: f64,
    probe: String,
    metric: String,
    value: f64,
    peer_median: f64,
    peers: usize,
}

/// Findings for GPUs and links behind their peers. `margin` is a share (0.10: 10% behind).
pub fn compare(probed: &[DeviceProbes], margin: f64, now_ms: TimeMs) -> Vec<Finding> {
    let mut out = slow_gpus(probed, margin, now_ms);
    let links: Vec<PeerLink> = probed
        .iter()
        .flat_map(|d| &d.results)
        .filter(|r| r.probe == "p2p")
        .flat_map(p2p::links_of)
        .collect();
    out.extend(slow_links(&links, margin, now_ms));
    out
}

fn slow_gpus(probed: &[DeviceProbes], margin: f64, now_ms: TimeMs) -> Vec<Finding> {
    // (model, probe, metric) -> every GPU's figure.
    let mut figures: BTreeMap<(String, String, String), Vec<Figure>> = BTreeMap::new();
    for d in probed {
        let Some(model) = d.gpu.as_ref().map(|g| g.name.clone()) else {
            continue;
        };
        for r in d
            .results
            .iter()
            .filter(|r| matches!(r.verdict, Verdict::Pass | Verdict::Warn | Verdict::Fail))
        {
            for m in r
                .metrics
                .iter()
                .filter(|m| comparable(&m.name, &m.unit, m.value))
            {
                figures
                    .entry((model.clone(), r.probe.clone(), m.name.clone()))
                    .or_default()
                    .push(Figure {
                        device: d.index,
                        value: m.value,
                    });
            }
        }
    }
    let mut behind: BTreeMap<u32, Vec<Behind>> = BTreeMap::new();
    for ((_, probe, metric), figs) in &figures {
        if figs.len() < 2 {
            continue;
        }
        for f in figs {
            let peers: Vec<f64> = figs
                .iter()
                .filter(|o| o.device != f.device)
                .map(|o| o.value)
                .collect();
            let Some(med) = median(&peers) else { continue };
            if med > 0.0 && f.value < med * (1.0 - margin) {
                behind.entry(f.device).or_default().push(Behind {
                    shortfall: 1.0 - f.value / med,
                    probe: probe.clone(),
                    metric: metric.clone(),
                    value: f.value,
                    peer_median: med,
                    peers: peers.len(),
                });
            }
        }
    }
    behind
        .into_iter()
        .filter_map(|(device, mut list)| {
            list.sort_by(|a, b| b.shortfall.total_cmp(&a.shortfall));
            let Behind {
                shortfall: short,
                probe,
                metric,
                value,
                peer_median: med,
                peers,
            } = list.first()?.clone();
            let all: Vec<serde_json::Value> = list
                .iter()
                .map(|b| {
                    json!({"probe": b.probe, "metric": b.metric, "value": round2(b.value),
                           "peer_median": round2(b.peer_median),
                           "behind_pct": round2(b.shortfall * 100.0)})
                })
                .collect();
            Some(Finding::new(
                "peers.slow_gpu".into(),
                Severity::Warn,
                Some(device),
                now_ms,
                format!(
                    "GPU {device} is {}% behind its peers on {probe} {metric} ({value:.1} vs a \
                     median of {med:.1} over {peers} other GPU(s) of the same model){}",
                    shown(short * 100.0, 0, f64::gt, margin * 100.0),
                    if list.len() > 1 {
                        format!(", and behind on {} more figure(s)", list.len() - 1)
                    } else {
                        String::new()
                    }
                ),
                Evidence {
                    values: values([
                        ("probe", json!(probe)),
                        ("metric", json!(metric)),
                        ("value", json!(round2(value))),
                        ("peer_median", json!(round2(med))),
                        ("peers", json!(peers)),
                        ("behind", json!(all)),
                    ]),
                    window_s: 0.0,
                    threshold: format!(
                        "more than {:.0}% below the median of the other GPUs of the same model",
                        margin * 100.0
                    ),
                },
                "Compare this GPU's clocks, power limit, temperature and PCIe link with \
                         its peers (gpudiag check); if they match, rerun the probes, then have \
                         the GPU serviced."
                    .into(),
            ))
        })
        .collect()
}

fn slow_links(links: &[PeerLink], margin: f64, now_ms: TimeMs) -> Vec<Finding> {
    let kind = |l: &PeerLink| l.connection.clone().unwrap_or_else(|| "?".into());
    let mut out = Vec::new();
    for l in links {
        let Some(v) = l.unidirectional_gbps.filter(|v| v.is_finite()) else {
            continue;
        };
        let peers: Vec<f64> = links
            .iter()
            .filter(|o| (o.src, o.dst) != (l.src, l.dst) && kind(o) == kind(l))
            .filter_map(|o| o.unidirectional_gbps)
            .collect();
        let Some(med) = median(&peers) else { continue };
        if !(med > 0.0 && v < med * (1.0 - margin)) {
            continue;
        }
        let k = kind(l);
        out.push(Finding::new(
            "peers.slow_link".into(),
            Severity::Warn,
            Some(l.src),
            now_ms,
            format!(
                "Link GPU {} -> GPU {} ({k}) is {}% behind the other {k} links ({v:.1} vs a \
                 median of {med:.1} GB/s over {} link(s))",
                l.src,
                l.dst,
                shown((1.0 - v / med) * 100.0, 0, f64::gt, margin * 100.0),
                peers.len()
            ),
            Evidence {
                values: values([
                    ("src", json!(l.src)),
                    ("dst", json!(l.dst)),
                    ("connection", json!(k)),
                    ("unidirectional_gbps", json!(round2(v))),
                    ("peer_median_gbps", json!(round2(med))),
                    ("links_compared", json!(peers.len())),
                ]),
                window_s: 0.0,
                threshold: format!(
                    "more than {:.0}% below the median of the links of the same kind",
                    margin * 100.0
                ),
            },
            "Check the NVLink state and error counters of both GPUs (gpudiag check, \
                     nvidia-smi nvlink -s -e) and the PCIe path between them; a link running \
                     below its siblings needs the board or cabling looked at."
                .into(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_probes::gpu::GpuInfo;
    use gpudiag_probes::{Measurement, ProbeResult};

    fn gpu(index: u32, name: &str, figures: &[(&str, &str, f64, &str)]) -> DeviceProbes {
        let mut results: Vec<ProbeResult> = Vec::new();
        for (probe, metric, value, unit) in figures {
            let r = match results.iter_mut().find(|r| r.probe == *probe) {
                Some(r) => r,
                None => {
                    results.push(ProbeResult::new(probe, index));
                    results.last_mut().expect("just pushed")
                }
            };
            r.metrics
                .push(Measurement::new(metric, *value, unit, "test", vec![*value]));
        }
        DeviceProbes {
            index,
            gpu: Some(GpuInfo {
                ordinal: index as usize,
                name: name.into(),
                compute_capability: "9.0".into(),
                multiprocessors: 132,
                total_memory_bytes: 1 << 37,
                pci_bus_id: format!("0000:{:02x}:00.0", index),
                driver_cuda_version: "13.0".into(),
                context_ms: 300.0,
            }),
            model: Some("H200".into()),
            refused: None,
            name: None,
            forcible: false,
            busy_pids: Vec::new(),
            results,
        }
    }

    #[test]
    fn one_slow_gpu_among_four_is_flagged_with_its_numbers() {
        let probed: Vec<DeviceProbes> = [801.0, 795.0, 640.0, 806.0]
            .iter()
            .enumerate()
            .map(|(i, tf)| {
                gpu(
                    i as u32,
                    "NVIDIA H200",
                    &[
                        ("matmul", "bf16", *tf, "TFLOP/s"),
                        ("bandwidth", "d2d_memcpy", 2150.0, "GB/s"),
                        ("latency", "launch", 2.0 + i as f64, "us"),
                        // Host-bound and noisy: never compared.
                        ("bandwidth", "d2h_pageable", 14.0 - 2.0 * i as f64, "GB/s"),
                    ],
                )
            })
            .collect();
        let f = compare(&probed, 0.10, 7);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].id, "peers.slow_gpu");
        assert_eq!(f[0].device, Some(2));
        assert!(
            f[0].title
                .contains("GPU 2 is 20% behind its peers on matmul bf16"),
            "{}",
            f[0].title
        );
        assert_eq!(f[0].evidence.values["peer_median"], json!(801.0));
        // Latency grows with the index but is not a throughput: never compared.
        assert!(
            f.iter()
                .all(|x| x.evidence.values["probe"] != json!("latency"))
        );
    }

    #[test]
    fn within_the_margin_and_different_models_are_quiet() {
        let close = vec![
            gpu(0, "NVIDIA H200", &[("matmul", "bf16", 801.0, "TFLOP/s")]),
            gpu(1, "NVIDIA H200", &[("matmul", "bf16", 730.0, "TFLOP/s")]),
        ];
        assert!(compare(&close, 0.10, 0).is_empty());
        let mixed = vec![
            gpu(0, "NVIDIA H200", &[("matmul", "bf16", 801.0, "TFLOP/s")]),
            gpu(1, "NVIDIA L4", &[("matmul", "bf16", 120.0, "TFLOP/s")]),
        ];
        assert!(compare(&mixed, 0.10, 0).is_empty());
        let one = vec![gpu(
            0,
            "NVIDIA H200",
            &[("matmul", "bf16", 100.0, "TFLOP/s")],
        )];
        assert!(compare(&one, 0.10, 0).is_empty());
        // A wider margin tolerates more.
        let slow = vec![
            gpu(0, "NVIDIA H200", &[("matmul", "bf16", 801.0, "TFLOP/s")]),
            gpu(1, "NVIDIA H200", &[("matmul", "bf16", 600.0, "TFLOP/s")]),
        ];
        assert_eq!(compare(&slow, 0.10, 0).len(), 1);
        assert!(compare(&slow, 0.30, 0).is_empty());
    }

    fn link(src: u32, dst: u32, kind: &str, uni: f64) -> PeerLink {
        PeerLink {
            src,
            dst,
            connection: Some(kind.into()),
            peer_access: true,
            unidirectional_gbps: Some(uni),
            bidirectional_gbps: Some(uni * 2.0),
            latency_us: Some(2.0),
            verified: Some(true),
            note: None,
        }
    }

    #[test]
    fn a_slow_link_is_flagged_against_links_of_its_kind() {
        let links = vec![
            link(0, 1, "NV18", 390.0),
            link(1, 0, "NV18", 388.0),
            link(0, 2, "NV18", 250.0),
            link(2, 0, "NV18", 391.0),
            // A PCIe pair is slower by nature and compared only with PCIe pairs.
            link(0, 3, "SYS", 40.0),
            link(3, 0, "SYS", 41.0),
        ];
        let f = slow_links(&links, 0.10, 0);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].id, "peers.slow_link");
        assert!(
            f[0].title
                .starts_with("Link GPU 0 -> GPU 2 (NV18) is 36% behind"),
            "{}",
            f[0].title
        );
        assert_eq!(f[0].evidence.values["peer_median_gbps"], json!(390.0));
    }

    #[test]
    fn p2p_figures_reach_the_comparison_through_the_probe_results() {
        // Two GPUs: each GPU's mean over its peers is comparable; the pair metrics are not.
        let mut probed = vec![gpu(0, "NVIDIA H200", &[]), gpu(1, "NVIDIA H200", &[])];
        for (d, uni) in [(0u32, 390.0), (1u32, 200.0)] {
            let mut r = ProbeResult::new("p2p", d);
            let other = 1 - d;
            r.metrics.push(Measurement::new(
                &p2p::unidirectional_metric(other),
                uni,
                "GB/s",
                "t",
                vec![],
            ));
            r.metrics.push(Measurement::new(
                "unidirectional_mean",
                uni,
                "GB/s",
                "t",
                vec![],
            ));
            r.details.insert(
                "links".into(),
                serde_json::to_value(vec![link(d, other, "NV18", uni)]).expect("serialises"),
            );
            probed[d as usize].results.push(r);
        }
        let f = compare(&probed, 0.10, 0);
        let ids: Vec<(&str, Option<u32>)> = f.iter().map(|x| (x.id.as_str(), x.device)).collect();
        assert_eq!(
            ids,
            [("peers.slow_gpu", Some(1)), ("peers.slow_link", Some(1))]
        );
        assert!(
            f[0].title.contains("p2p unidirectional_mean"),
            "{}",
            f[0].title
        );
    }
}
