//! GPU tests of what gpudiag says about several GPUs: topology against `nvidia-smi topo -m`,
//! the peer-copy matrix (plausible, verified, symmetric), the NCCL all-reduce (verified sums,
//! nccl-tests figures), and the one-GPU path, which must say there is nothing to compare. Run
//! on a GPU host (`.gpu-bundle/run-gpu-tests`); each test adapts to the number of GPUs it finds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
use gpu::{gpu_count, gpudiag};
use std::process::{Command, Output};

use gpudiag_core::check::CheckReport;
use gpudiag_probes::Verdict;
use gpudiag_probes::p2p::links_of;
use gpudiag_probes::runner::ProbeReport;

fn probe(args: &[&str]) -> (ProbeReport, Output) {
    let out = gpudiag()
        .arg("probe")
        .args(args)
        .arg("--json")
        .output()
        .expect("gpudiag runs");
    let report: ProbeReport = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a probe report ({e}); exit {:?}; stderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    eprintln!("{}", serde_json::to_string(&report).unwrap());
    (report, out)
}

/// The cells of `nvidia-smi topo -m`: (row GPU, column GPU) -> label, and per GPU its CPU and
/// NUMA affinity columns.
struct SmiTopo {
    cells: Vec<(usize, usize, String)>,
    cpu_affinity: Vec<(usize, String)>,
    numa: Vec<(usize, String)>,
}

fn smi_topo() -> SmiTopo {
    let out = Command::new("nvidia-smi")
        .args(["topo", "-m"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{text}");
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split('\t')
        .map(|s| s.trim().to_owned())
        .collect();
    let gpu_cols: Vec<(usize, usize)> = header
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.strip_prefix("GPU")?.parse().ok().map(|g| (i, g)))
        .collect();
    let col = |name: &str| header.iter().position(|h| h == name);
    let mut topo = SmiTopo {
        cells: vec![],
        cpu_affinity: vec![],
        numa: vec![],
    };
    for l in lines {
        let cells: Vec<&str> = l.split('\t').map(str::trim).collect();
        let Some(row) = cells
            .first()
            .and_then(|c| c.strip_prefix("GPU")?.parse().ok())
        else {
            continue;
        };
        for (i, g) in &gpu_cols {
            if let Some(c) = cells.get(*i) {
                topo.cells.push((row, *g, (*c).to_owned()));
            }
        }
        if let Some(c) = col("CPU Affinity").and_then(|i| cells.get(i)) {
            topo.cpu_affinity.push((row, (*c).to_owned()));
        }
        if let Some(c) = col("NUMA Affinity").and_then(|i| cells.get(i)) {
            topo.numa.push((row, (*c).to_owned()));
        }
    }
    topo
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn topology_matches_nvidia_smi() {
    let out = gpudiag()
        .args(["check", "--json", "--window", "0"])
        .output()
        .unwrap();
    let report: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    let topo = report
        .topology
        .expect("a live NVIDIA check carries the topology");
    eprintln!("{}", serde_json::to_string(&topo).unwrap());
    let n = gpu_count();
    assert_eq!(topo.gpus.len(), n);
    assert_eq!(topo.pairs.len(), n * (n - 1) / 2);
    let smi = smi_topo();
    for p in &topo.pairs {
        let want = smi
            .cells
            .iter()
            .find(|(r, c, _)| (*r, *c) == (p.a as usize, p.b as usize))
            .map(|(_, _, l)| l.clone())
            .expect("nvidia-smi shows the pair");
        assert_eq!(p.label, want, "GPU{}-GPU{}: {p:?}", p.a, p.b);
    }
    for g in &topo.gpus {
        let row = |v: &[(usize, String)]| {
            v.iter()
                .find(|(r, _)| *r == g.index as usize)
                .map(|(_, c)| c.clone())
                .filter(|c| c != "N/A")
        };
        if let Some(cpus) = row(&smi.cpu_affinity) {
            assert_eq!(
                g.cpu_affinity.as_deref(),
                Some(cpus.as_str()),
                "GPU{}",
                g.index
            );
        }
        if let Some(numa) = row(&smi.numa) {
            assert_eq!(
                g.numa_node.map(|x| x.to_string()),
                Some(numa),
                "GPU{}",
                g.index
            );
        }
    }
    // NVLinks up per GPU, as `nvidia-smi nvlink -s` lists them ("Link 3: 26.562 GB/s").
    let out = Command::new("nvidia-smi")
        .args(["nvlink", "-s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{text}");
    let mut up: Vec<usize> = Vec::new();
    for l in text.lines() {
        if l.starts_with("GPU ") {
            up.push(0);
        } else if let Some(n) = up
            .last_mut()
            .filter(|_| l.contains("Link ") && l.contains("GB/s"))
        {
            *n += 1;
        }
    }
    for g in &topo.gpus {
        if let Some(want) = up.get(g.index as usize) {
            assert_eq!(g.active_links(), *want, "GPU{} NVLinks up", g.index);
        }
    }
    // Error counters per GPU against `nvidia-smi nvlink -e` ("Link 0: Replay Errors: 0").
    let out = Command::new("nvidia-smi")
        .args(["nvlink", "-e"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut smi: Vec<[u64; 3]> = Vec::new();
    for l in text.lines() {
        if l.starts_with("GPU ") {
            smi.push([0; 3]);
            continue;
        }
        let Some(sums) = smi.last_mut() else { continue };
        let value = |l: &str| l.rsplit(':').next()?.trim().parse::<u64>().ok();
        for (i, key) in ["Replay Errors", "Recovery Errors", "CRC Errors"]
            .iter()
            .enumerate()
        {
            if l.contains(key) {
                sums[i] += value(l).unwrap_or(0);
            }
        }
    }
    for g in topo.gpus.iter().filter(|g| g.active_links() > 0) {
        let Some(want) = smi.get(g.index as usize) else {
            continue;
        };
        let e = &g.nvlink_errors;
        eprintln!(
            "GPU{}: ours {e:?}, nvidia-smi replay/recovery/CRC {want:?}",
            g.index
        );
        assert_eq!(e.replay, Some(want[0]), "GPU{} replay", g.index);
        assert_eq!(e.recovery, Some(want[1]), "GPU{} recovery", g.index);
        assert!(
            e.crc_flit == Some(want[2]) || e.crc_data == Some(want[2]),
            "GPU{} CRC: ours {e:?}, nvidia-smi {}",
            g.index,
            want[2]
        );
    }
    // The text report shows the matrix (or says there is one GPU).
    let text = gpudiag().args(["check", "--window", "0"]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    if n == 1 {
        assert!(text.contains("no GPU pairs to compare"), "{text}");
    } else {
        assert!(text.contains("Topology:"), "{text}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn p2p_matrix_is_verified_plausible_and_symmetric() {
    let (rep, out) = probe(&["p2p", "--suite", "standard"]);
    let n = gpu_count();
    let results: Vec<_> = rep
        .devices
        .iter()
        .flat_map(|d| d.results.iter().filter(|r| r.probe == "p2p"))
        .collect();
    assert_eq!(results.len(), n);
    if n == 1 {
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(results[0].verdict, Verdict::Skipped);
        assert!(
            results[0]
                .note
                .as_deref()
                .unwrap()
                .contains("nothing to compare")
        );
        return;
    }
    let links: Vec<_> = results.iter().flat_map(|r| links_of(r)).collect();
    assert_eq!(links.len(), n * (n - 1));
    for l in &links {
        assert_eq!(l.verified, Some(true), "{l:?}");
        let uni = l.unidirectional_gbps.unwrap();
        let bi = l.bidirectional_gbps.unwrap();
        let lat = l.latency_us.unwrap();
        // Anything from PCIe Gen3 x8 through host memory (~5 GB/s) to NVLink 5 (~900 GB/s).
        assert!(uni > 3.0 && uni < 1000.0, "{l:?}");
        assert!(bi > uni * 0.9 && bi < 2.2 * uni, "{l:?}");
        assert!(lat > 0.1 && lat < 200.0, "{l:?}");
        let back = links
            .iter()
            .find(|o| (o.src, o.dst) == (l.dst, l.src))
            .unwrap();
        let ratio = uni / back.unidirectional_gbps.unwrap();
        assert!(
            (0.85..1.0 / 0.85).contains(&ratio),
            "asymmetric: {l:?} vs {back:?}"
        );
        if l.peer_access {
            assert!(l.connection.is_some(), "{l:?}");
        }
    }
    let all_on = links.iter().all(|l| l.peer_access);
    for r in &results {
        let want = if all_on { Verdict::Pass } else { Verdict::Warn };
        assert_eq!(r.verdict, want, "{:?}", r.note);
    }
    // The text output draws the matrices.
    let text = gpudiag()
        .args(["probe", "p2p", "--suite", "quick"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Peer copies, one direction (GB/s)"), "{text}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nccl_all_reduce_is_verified() {
    let (rep, out) = probe(&["nccl", "--suite", "standard"]);
    let n = gpu_count();
    assert_eq!(rep.host.len(), 1, "{rep:?}");
    let r = &rep.host[0];
    if n == 1 {
        assert_eq!(r.verdict, Verdict::Skipped);
        assert!(r.note.as_deref().unwrap().contains("nothing to compare"));
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{:?}", r.note);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.note);
    assert_eq!(r.details["verified"], serde_json::json!(true));
    assert_eq!(r.parameters["NCCL_NVLS_ENABLE"], serde_json::json!("0"));
    let busbw: Vec<f64> = r
        .metrics
        .iter()
        .filter(|m| m.name.starts_with("busbw_"))
        .map(|m| m.value)
        .collect();
    assert_eq!(busbw.len(), 3, "{r:?}");
    assert!(busbw.iter().all(|b| *b > 1.0), "{busbw:?}");
    // Bus bandwidth grows with the message size until the links saturate.
    assert!(busbw[2] > busbw[0], "{busbw:?}");
    let algbw = r.metric("algbw_268435456").unwrap().value;
    let bus = r.metric("busbw_268435456").unwrap().value;
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    assert!((bus - algbw * factor).abs() < 1e-6 * bus.max(1.0));
}
