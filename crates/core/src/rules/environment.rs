//! Environment: a driver older than the CUDA libraries in use (the classic container built for
//! a newer CUDA than the host driver), persistence mode off, MIG enabled.
//!
//! The runtime's CUDA version is taken from NVRTC, whose version follows the toolkit's, and only
//! the major version of cuBLAS, whose minor versions run ahead of the toolkit's (CUDA 13.0 ships
//! cuBLAS 13.1).

use serde_json::json;

use super::RuleInput;
use gpudiag_model::cuda_libraries::major_minor;
use gpudiag_model::finding::{Evidence, Finding, Severity, values};

pub fn evaluate(input: &RuleInput<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(cuda_mismatch(input));
    for d in input.devices {
        if d.persistence_mode == Some(false) {
            out.push(Finding::new(
                "environment.persistence_off".into(),
                Severity::Info,
                Some(d.index),
                input.now_ms,
                format!("GPU {} has persistence mode off", d.index),
                Evidence {
                    values: values([("persistence_mode", json!(false))]),
                    window_s: 0.0,
                    threshold: "off".into(),
                },
                "Without persistence the driver tears the GPU state down whenever no \
                         process uses it, adding seconds to every job start and losing ECC/XID \
                         state between jobs. Enable the nvidia-persistenced service."
                    .into(),
            ));
        }
        if d.mig_enabled == Some(true) {
            out.push(Finding::new(
                "environment.mig_enabled".into(),
                Severity::Info,
                Some(d.index),
                input.now_ms,
                format!("GPU {} is in MIG mode", d.index),
                Evidence {
                    values: values([("mig_enabled", json!(true))]),
                    window_s: 0.0,
                    threshold: "on".into(),
                },
                "The GPU is split into MIG instances: each job sees only its slice, \
                         whole-GPU utilisation and some counters are not available per process, \
                         and probes measure one instance. Expected if the node is partitioned on \
                         purpose."
                    .into(),
            ));
        }
    }
    out
}

fn cuda_mismatch(input: &RuleInput<'_>) -> Option<Finding> {
    let driver = input.host?.cuda_driver_version.as_deref()?;
    let (dmaj, dmin) = major_minor(driver)?;
    let libraries = input.libraries?;
    let version_of = |name: &str| {
        libraries
            .iter()
            .find(|l| l.name == name && l.found)
            .and_then(|l| l.version.as_deref())
            .and_then(major_minor)
    };
    let nvrtc = version_of("libnvrtc");
    let cublas_major = ["libcublas", "libcublasLt"]
        .into_iter()
        .filter_map(|n| version_of(n).map(|(major, _)| major))
        .max();
    let newest_major = nvrtc.map(|v| v.0).into_iter().chain(cublas_major).max()?;
    let (severity, runtime, title, advice) = if newest_major > dmaj {
        (
            Severity::Fail,
            format!("{newest_major}.x"),
            format!(
                "the driver supports CUDA {driver} but CUDA {newest_major} libraries are in use"
            ),
            format!(
                "Applications built with CUDA {newest_major} will fail to start here (\"driver \
                 is insufficient for CUDA runtime version\"). Upgrade the host driver to one that \
                 supports CUDA {newest_major}, or use a container built for CUDA {dmaj}."
            ),
        )
    } else if let Some((rmaj, rmin)) = nvrtc.filter(|&(maj, min)| maj == dmaj && min > dmin) {
        (
            Severity::Warn,
            format!("{rmaj}.{rmin}"),
            format!(
                "the driver supports CUDA {driver}, older than the CUDA {rmaj}.{rmin} libraries"
            ),
            format!(
                "Minor-version compatibility lets CUDA {rmaj}.{rmin} applications run, but PTX \
                 built for {rmaj}.{rmin} cannot be JIT-compiled by this driver and newer features \
                 fail. Upgrade the driver to one for CUDA {rmaj}.{rmin} or newer."
            ),
        )
    } else {
        return None;
    };
    Some(Finding::new(
        "environment.cuda_driver_too_old".into(),
        severity,
        None,
        input.now_ms,
        title,
        Evidence {
            values: values([
                ("driver_cuda_version", json!(driver)),
                ("runtime_cuda_version", json!(runtime)),
                ("nvrtc", json!(nvrtc.map(|(a, b)| format!("{a}.{b}")))),
                ("cublas_major", json!(cublas_major)),
            ]),
            window_s: 0.0,
            threshold: "runtime CUDA version <= driver CUDA version".into(),
        },
        advice,
    ))
}
