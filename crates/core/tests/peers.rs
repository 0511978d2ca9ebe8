//! The peer comparison and the GPU-pair results on real figures: the standard suite on both
//! GPUs of a two-H200 host (`tests/fixtures/probes/h200x2_standard.json`, from
//! `gpudiag check --probes standard --json` there), as measured and with one GPU or link made
//! slow, and with one pair broken.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use gpudiag_core::rules::peers::compare;
use gpudiag_model::finding::Severity;
use gpudiag_probes::Verdict;
use gpudiag_probes::p2p::{self, PeerLink};
use gpudiag_probes::runner::{self, ProbeReport};

fn real() -> ProbeReport {
    // The workspace's fixtures, shared with the end-to-end tests.
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/probes/h200x2_standard.json"
    ));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn scale(rep: &mut ProbeReport, device: u32, probe: &str, metric: &str, by: f64) {
    let r = rep.devices[device as usize]
        .results
        .iter_mut()
        .find(|r| r.probe == probe)
        .unwrap();
    let m = r.metrics.iter_mut().find(|m| m.name == metric).unwrap();
    m.value *= by;
}

fn set_links(rep: &mut ProbeReport, device: u32, f: impl Fn(&mut PeerLink)) {
    let r = rep.devices[device as usize]
        .results
        .iter_mut()
        .find(|r| r.probe == "p2p")
        .unwrap();
    let mut links = p2p::links_of(r);
    links.iter_mut().for_each(f);
    r.details
        .insert("links".into(), serde_json::to_value(&links).unwrap());
}

#[test]
fn two_healthy_h200s_raise_nothing() {
    // Measured: bf16 845.6 and 829.9 TFLOP/s, P2P 393.8 and 394.2 GB/s; pageable D2H 13.8
    // and 9.7 GB/s, which is host noise and must not count.
    let rep = real();
    let f = compare(&rep.devices, 0.10, 0);
    assert!(f.is_empty(), "{f:#?}");
    assert!(runner::findings(&rep.devices, 0).is_empty());
    assert!(runner::host_findings(&rep.host, 0).is_empty());
}

#[test]
fn a_gpu_20_percent_slow_at_bf16_is_flagged_with_its_numbers() {
    let mut rep = real();
    scale(&mut rep, 1, "matmul", "bf16", 0.8);
    let f = compare(&rep.devices, 0.10, 0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].id.as_str(), f[0].device), ("peers.slow_gpu", Some(1)));
    assert_eq!(f[0].severity, Severity::Warn);
    assert!(
        f[0].title.starts_with(
            "GPU 1 is 21% behind its peers on matmul bf16 (663.9 vs a median of 845.6"
        ),
        "{}",
        f[0].title
    );
    // A wider margin lets it pass.
    assert!(compare(&rep.devices, 0.25, 0).is_empty());
}

#[test]
fn a_slow_link_is_flagged_and_so_is_its_gpu() {
    let mut rep = real();
    set_links(&mut rep, 1, |l| {
        l.unidirectional_gbps = l.unidirectional_gbps.map(|v| v * 0.5);
    });
    scale(&mut rep, 1, "p2p", "unidirectional_mean", 0.5);
    let f = compare(&rep.devices, 0.10, 0);
    let ids: Vec<(&str, Option<u32>)> = f.iter().map(|x| (x.id.as_str(), x.device)).collect();
    assert_eq!(
        ids,
        [("peers.slow_gpu", Some(1)), ("peers.slow_link", Some(1))]
    );
    assert!(
        f[1].title
            .starts_with("Link GPU 1 -> GPU 0 (NV18) is 50% behind"),
        "{}",
        f[1].title
    );
}

#[test]
fn a_broken_pair_fails_the_probe_and_becomes_a_finding() {
    let mut rep = real();
    set_links(&mut rep, 0, |l| l.verified = Some(false));
    let r = rep.devices[0]
        .results
        .iter_mut()
        .find(|r| r.probe == "p2p")
        .unwrap();
    let links = p2p::links_of(r);
    p2p::judge(r, &links);
    assert_eq!(r.verdict, Verdict::Fail);
    let f = runner::findings(&rep.devices, 0);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].id, "probes.p2p");
    assert_eq!(f[0].severity, Severity::Fail);
    assert!(
        f[0].title.contains("GPU 0 -> GPU 1 is broken"),
        "{}",
        f[0].title
    );
    // The matrix text calls it out.
    let text = gpudiag_probes::text::render(&rep);
    assert!(text.contains("GPU0 -> GPU1: BROKEN"), "{text}");
}

#[test]
fn one_gpu_has_no_peers_to_compare() {
    let mut rep = real();
    rep.devices.truncate(1);
    scale(&mut rep, 0, "matmul", "bf16", 0.1);
    assert!(compare(&rep.devices, 0.10, 0).is_empty());
}

#[test]
fn the_real_report_renders_matrices_and_the_all_reduce() {
    let text = gpudiag_probes::text::render(&real());
    assert!(text.contains("Peer copies, one direction (GB/s)"), "{text}");
    assert!(text.contains("  GPU0           -    393.8"), "{text}");
    assert!(text.contains("All GPUs together"), "{text}");
    assert!(text.contains("busbw_268435456"), "{text}");
}
