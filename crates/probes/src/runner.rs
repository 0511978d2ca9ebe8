//! Runs a suite (or named probes) on the selected GPUs: checks first (busy GPU, memory budget),
//! then one context per device, each probe under the suite's deadline and Ctrl-C, results
//! collected even when a probe fails or stops. What the runner knows of the GPUs' state (the
//! driver's numbering, other processes, ECC counters, clocks during a run, topology) it asks of
//! the caller's `GpuState`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::conditions::{self, RunTelemetry};
use super::gpu::{self, Gpu, GpuInfo};
use super::matmul::Engines;
use super::suite::{self, Suite};
use super::{
    PROBE_NAMES, ProbeDeadline, ProbeError, ProbeResult, Verdict, bandwidth, latency, matmul,
    memory, nccl, p2p,
};
use gpudiag_model::error::Error;
use gpudiag_model::finding::{Evidence, Finding, Severity};
use gpudiag_model::gpu_state::{GpuState, ListedGpu};

/// What to run.
pub struct Options {
    pub suite_name: String,
    pub suite: Suite,
    /// Probe names; empty runs the suite's list.
    pub only: Vec<String>,
    /// `--device` selectors (NVML index or UUID); empty selects every GPU.
    pub devices: Vec<String>,
    pub force: bool,
    pub init_timeout: Duration,
    pub stop: Arc<AtomicBool>,
    /// The GPUs' state as the telemetry layer reads it (NVML): the driver's numbering, who
    /// else uses a GPU, ECC counters, clocks during a run, and how the GPUs connect (the
    /// peer-copy probe's labels). Without a driver it says so, and probes run with less context.
    pub gpu_state: Arc<dyn GpuState>,
}

/// Probe results for one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DeviceProbes {
    pub index: u32,
    pub gpu: Option<GpuInfo>,
    /// The reference-table model the GPU matched; `None` for unknown models (no ratios).
    pub model: Option<String>,
    /// Why no probe ran on this GPU (busy, no context).
    pub refused: Option<String>,
    /// NVML's name for the GPU, so a GPU refused before a CUDA context (which names it in
    /// `gpu`) was opened is still named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The refusal is one `--force` overrides: other processes use the GPU (`busy_pids`), or
    /// whether they do could not be seen. Callers word the remedy (a flag, a key).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forcible: bool,
    /// The other processes on the GPU when it was refused as busy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busy_pids: Vec<u32>,
    pub results: Vec<ProbeResult>,
}

/// `gpudiag probe --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub suite: String,
    pub devices: Vec<DeviceProbes>,
    /// Probes over all selected GPUs at once (the NCCL all-reduce); empty when none ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host: Vec<ProbeResult>,
    /// GPUs and links behind their peers (`gpudiag probe` fills it; `check` reports them with
    /// its other findings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

impl ProbeReport {
    /// 1 when a probe failed, errored or a GPU was refused, else 0.
    pub fn exit_code(&self) -> i32 {
        let bad = self.devices.iter().any(|d| {
            d.refused.is_some()
                || d.results
                    .iter()
                    .any(|r| matches!(r.verdict, Verdict::Fail | Verdict::Error))
        });
        i32::from(bad)
    }
}

/// Validates probe names against the known ones.
pub fn check_names(names: &[String]) -> Result<(), Error> {
    match names.iter().find(|n| !PROBE_NAMES.contains(&n.as_str())) {
        Some(n) => Err(Error::Usage(format!(
            "no probe '{n}'; there are {}",
            PROBE_NAMES.join(", ")
        ))),
        None => Ok(()),
    }
}

pub fn run(opts: &Options) -> Result<ProbeReport, Error> {
    check_names(&opts.only)?;
    let count = gpu::device_count().map_err(|e| Error::CannotRun(e.to_string()))?;
    if count == 0 {
        return Err(Error::CannotRun("the CUDA driver sees no GPU".into()));
    }
    // Devices as the driver's management library numbers them (what `check` and nvidia-smi
    // show), each with its CUDA ordinal found by PCI bus id; without it, CUDA ordinals stand in.
    let listed: Vec<(ListedGpu, Option<usize>)> = match opts.gpu_state.gpus() {
        Ok(gpus) => {
            let cuda: Vec<Option<String>> = (0..count).map(|o| gpu::pci_bus_id(o).ok()).collect();
            gpus.into_iter()
                .map(|g| {
                    let ord = g.pci_bus_id.as_deref().and_then(|b| {
                        cuda.iter()
                            .position(|c| c.as_deref().is_some_and(|c| gpu::same_pci_bus(b, c)))
                    });
                    (g, ord)
                })
                .collect()
        }
        Err(_) => (0..count)
            .map(|o| {
                let g = ListedGpu {
                    index: o as u32,
                    ..ListedGpu::default()
                };
                (g, Some(o))
            })
            .collect(),
    };
    let selected: Vec<&(ListedGpu, Option<usize>)> = if opts.devices.is_empty() {
        listed.iter().collect()
    } else {
        opts.devices
            .iter()
            .map(|sel| {
                let sel = sel.trim();
                listed
                    .iter()
                    .find(|(g, _)| {
                        sel.parse::<u32>().is_ok_and(|x| x == g.index)
                            || g.uuid
                                .as_deref()
                                .is_some_and(|u| u.eq_ignore_ascii_case(sel))
                    })
                    .ok_or_else(|| Error::Usage(format!("no GPU matches --device '{sel}'")))
            })
            .collect::<Result<_, _>>()?
    };
    let names: Vec<String> = if opts.only.is_empty() {
        opts.suite.probes.clone()
    } else {
        opts.only.clone()
    };
    let (multi, per_gpu): (Vec<String>, Vec<String>) = names
        .into_iter()
        .partition(|n| super::MULTI_GPU_PROBES.contains(&n.as_str()));
    let names = per_gpu;
    let table = suite::reference();
    let mut devices = Vec::new();
    // Contexts stay open for the probes over several GPUs, which need all of them at once.
    let mut opened: Vec<(u32, usize, Gpu)> = Vec::new();
    for (listed_gpu, ordinal) in selected {
        let index = listed_gpu.index;
        let mut d = DeviceProbes {
            index,
            gpu: None,
            model: None,
            refused: None,
            // Read before any refusal: the CUDA context that names the others may never open.
            name: listed_gpu
                .name
                .clone()
                .or_else(|| (*ordinal).and_then(gpu::device_name)),
            forcible: false,
            busy_pids: Vec::new(),
            results: Vec::new(),
        };
        let Some(ordinal) = *ordinal else {
            d.refused = Some("CUDA does not see this GPU (CUDA_VISIBLE_DEVICES?)".into());
            devices.push(d);
            continue;
        };
        if !opts.force {
            let (refusal, busy_pids) = conditions::refusal(&*opts.gpu_state, index);
            if let Some(why) = refusal {
                d.refused = Some(why);
                d.forcible = true;
                d.busy_pids = busy_pids;
                devices.push(d);
                continue;
            }
        }
        let g = match Gpu::open(ordinal, opts.init_timeout) {
            Ok(g) => g,
            Err(e) => {
                d.refused = Some(format!("no CUDA context: {e}"));
                devices.push(d);
                continue;
            }
        };
        let model = suite::lookup(&table, &g.info.name);
        d.model = model.map(|m| m.model.clone());
        d.gpu = Some(g.info.clone());
        let ctl = ProbeDeadline::new(
            Duration::from_secs_f64(opts.suite.deadline_s),
            opts.stop.clone(),
        );
        for name in &names {
            let mut r = ProbeResult::new(name, index);
            let start = Instant::now();
            r.param("suite", opts.suite_name.as_str());
            let outcome = match ctl.check() {
                Err(e) => Err(e),
                Ok(()) => run_one(&g, name, opts, model, index, &ctl, &mut r),
            };
            match outcome {
                Ok(()) => {}
                Err(ProbeError::Unsupported(why)) => {
                    r.verdict = Verdict::Skipped;
                    r.note = Some(why);
                }
                Err(e) => {
                    r.verdict = Verdict::Error;
                    r.note = Some(e.to_string());
                }
            }
            // Leave nothing queued behind a failed probe.
            let _ = g.synchronize();
            r.duration_ms = start.elapsed().as_secs_f64() * 1e3;
            d.results.push(r);
        }
        devices.push(d);
        if !multi.is_empty() {
            opened.push((index, ordinal, g));
        }
    }
    let host = run_multi(opts, &multi, &listed, &opened, &mut devices);
    Ok(ProbeReport {
        suite: opts.suite_name.clone(),
        devices,
        host,
        findings: Vec::new(),
    })
}

/// The probes over several GPUs (`p2p`, `nccl`) on every GPU that could be probed; p2p results
/// go to each GPU's list, the all-reduce to the host's.
fn run_multi(
    opts: &Options,
    multi: &[String],
    listed: &[(ListedGpu, Option<usize>)],
    opened: &[(u32, usize, Gpu)],
    devices: &mut [DeviceProbes],
) -> Vec<ProbeResult> {
    let mut host = Vec::new();
    if multi.is_empty() {
        return host;
    }
    let ctl = ProbeDeadline::new(
        Duration::from_secs_f64(opts.suite.deadline_s),
        opts.stop.clone(),
    );
    // Every GPU may give the same share of its free memory.
    let budget = opened
        .iter()
        .filter_map(|(_, _, g)| {
            g.bind().ok()?;
            let (free, _) = g.mem_info().ok()?;
            Some(conditions::memory_budget(
                free,
                opts.suite.memory_share,
                u64::MAX,
            ))
        })
        .min()
        .unwrap_or(0);
    for name in multi {
        let start = Instant::now();
        match name.as_str() {
            "p2p" => {
                let gpus: Vec<ListedGpu> = opened
                    .iter()
                    .filter_map(|(i, _, _)| listed.iter().find(|(g, _)| g.index == *i))
                    .map(|(g, _)| g.clone())
                    .collect();
                let topology = opts.gpu_state.topology(&gpus);
                let gpus: Vec<(u32, &Gpu)> = opened.iter().map(|(i, _, g)| (*i, g)).collect();
                let results = p2p::run(&gpus, &opts.suite.p2p, budget, topology.as_ref(), &ctl);
                for mut r in results {
                    r.param("suite", opts.suite_name.as_str());
                    r.duration_ms = start.elapsed().as_secs_f64() * 1e3;
                    if let Some(d) = devices.iter_mut().find(|d| d.index == r.device) {
                        d.results.push(r);
                    }
                }
            }
            "nccl" => {
                let ranks: Vec<nccl::Rank> = opened
                    .iter()
                    .map(|(index, ordinal, _)| nccl::Rank {
                        index: *index,
                        ordinal: *ordinal,
                    })
                    .collect();
                let mut r = nccl::run(&ranks, &opts.suite.nccl, budget, &ctl);
                r.param("suite", opts.suite_name.as_str());
                r.duration_ms = start.elapsed().as_secs_f64() * 1e3;
                host.push(r);
            }
            _ => {}
        }
    }
    for (_, _, g) in opened {
        let _ = g.bind();
        let _ = g.synchronize();
    }
    host
}

fn run_one(
    g: &Gpu,
    name: &str,
    opts: &Options,
    model: Option<&suite::ModelRef>,
    index: u32,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    let s = &opts.suite;
    let (free, _) = g.mem_info()?;
    let budget = conditions::memory_budget(free, s.memory_share, u64::MAX);
    r.param("memory_share", s.memory_share);
    r.param("memory_budget_bytes", budget);
    match name {
        "latency" => latency::run(g, &s.latency, ctl, r),
        "bandwidth" => bandwidth::run(g, &s.bandwidth, budget, model, ctl, r),
        "matmul" => {
            // cuBLASLt is loaded for the matmul alone and unloaded after it: the pages it
            // touches would otherwise stay resident through the bandwidth and memory probes.
            let engines = match (
                s.matmul.skip_cublaslt_at,
                matmul::builtin_share_of_cublaslt(g.cc),
            ) {
                (Some(at), Some((share, kernel))) if share >= at => Engines::not_loaded(format!(
                    "cuBLASLt not loaded: the built-in {kernel} kernel reaches {share:.2}x of it \
                     on this GPU, and this suite spares the library's memory"
                )),
                _ => Engines::open(),
            };
            let tel = || RunTelemetry::start(opts.gpu_state.clone(), index);
            matmul::run(g, &s.matmul, budget, model, &engines, &tel, ctl, r)
        }
        "memory" => {
            let mem_budget = conditions::memory_budget(free, s.memory.share, s.memory.max_bytes);
            r.param("memory_budget_bytes", mem_budget);
            let ecc = || conditions::ecc_counters(&*opts.gpu_state, index);
            memory::run(g, &s.memory, mem_budget, &ecc, ctl, r)
        }
        other => Err(ProbeError::Unsupported(format!("no probe '{other}'"))),
    }
}

/// Findings for failed probes, so `check --probes` exits 1 on a wrong matmul or a bad memory
/// cell until the probe rules of the rules family judge results in detail.
pub fn findings(devices: &[DeviceProbes], now_ms: u64) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in devices {
        if let Some(why) = &d.refused {
            out.push(Finding::new(
                "probes.not_run".into(),
                Severity::Warn,
                Some(d.index),
                now_ms,
                "Probes did not run on this GPU".into(),
                Evidence {
                    values: gpudiag_model::finding::values([("reason", serde_json::json!(why))]),
                    window_s: 0.0,
                    threshold: "probes requested".into(),
                },
                "Run when the GPU is idle, or pass --force to probe a busy GPU.".into(),
            ));
        }
        out.extend(
            d.results
                .iter()
                .filter_map(|r| result_finding(r, Some(d.index), now_ms)),
        );
    }
    out
}

/// Findings for the probes over all GPUs (the all-reduce), which belong to no single GPU.
pub fn host_findings(host: &[ProbeResult], now_ms: u64) -> Vec<Finding> {
    host.iter()
        .filter_map(|r| result_finding(r, None, now_ms))
        .collect()
}

fn result_finding(r: &ProbeResult, device: Option<u32>, now_ms: u64) -> Option<Finding> {
    let (severity, advice) = match r.verdict {
        Verdict::Fail if r.probe == "p2p" => (
            Severity::Fail,
            "A GPU pair copied wrong data or could not copy: drain the node and check the NVLink and PCIe error counters of both GPUs (gpudiag check shows the topology).",
        ),
        Verdict::Warn if r.probe == "p2p" => (
            Severity::Warn,
            "Peer access between these GPUs is off, so copies go through host memory: check the IOMMU/ACS settings, the hypervisor's P2P support and NVIDIA_P2P regkeys.",
        ),
        Verdict::Fail if r.probe == "nccl" => (
            Severity::Fail,
            "NCCL returned wrong sums: drain the node and run the p2p probe to find the pair at fault.",
        ),
        Verdict::Fail if r.probe == "memory" => (
            Severity::Fail,
            "Drain the node: memory returned wrong data. Check ECC and remapped rows, reseat or replace the GPU.",
        ),
        Verdict::Fail => (
            Severity::Fail,
            "The GPU computed a wrong result or leaked memory: drain it and run the full suite.",
        ),
        Verdict::Warn => (
            Severity::Warn,
            "Below what this model should reach: check clocks, throttling, PCIe link.",
        ),
        Verdict::Error => (Severity::Warn, "The probe could not finish: see its note."),
        _ => return None,
    };
    Some(Finding::new(
        format!("probes.{}", r.probe),
        severity,
        device,
        now_ms,
        format!(
            "{} probe: {}",
            r.probe,
            r.note.as_deref().unwrap_or("did not pass")
        ),
        Evidence {
            values: gpudiag_model::finding::values([("verdict", serde_json::json!(r.verdict))]),
            window_s: r.duration_ms / 1e3,
            threshold: "verdict pass".into(),
        },
        advice.into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(verdict: Verdict) -> DeviceProbes {
        let mut r = ProbeResult::new("memory", 0);
        r.verdict = verdict;
        r.note = Some("3 word(s) differ".into());
        DeviceProbes {
            index: 0,
            gpu: None,
            model: None,
            refused: None,
            name: None,
            forcible: false,
            busy_pids: Vec::new(),
            results: vec![r],
        }
    }

    #[test]
    fn failed_probes_become_findings_and_exit_1() {
        let f = findings(&[device(Verdict::Fail)], 5);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "probes.memory");
        assert_eq!(f[0].severity, Severity::Fail);
        assert!(findings(&[device(Verdict::Pass)], 5).is_empty());
        assert!(findings(&[device(Verdict::Skipped)], 5).is_empty());
        let rep = ProbeReport {
            suite: "quick".into(),
            devices: vec![device(Verdict::Fail)],
            host: vec![],
            findings: vec![],
        };
        assert_eq!(rep.exit_code(), 1);
        let rep = ProbeReport {
            suite: "quick".into(),
            devices: vec![device(Verdict::Pass)],
            host: vec![],
            findings: vec![],
        };
        assert_eq!(rep.exit_code(), 0);
    }

    #[test]
    fn unknown_probe_names_are_usage_errors() {
        assert!(check_names(&["matmul".into()]).is_ok());
        assert!(check_names(&["p2p".into(), "nccl".into()]).is_ok());
        let e = check_names(&["p2q".into()]).unwrap_err();
        assert!(e.to_string().contains("no probe 'p2q'"));
    }
}
