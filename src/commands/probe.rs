//! `gpudiag probe`, and the probe runs `check --probes` and the terminal UI start.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::{ProbeArgs, SuiteName};
use gpudiag_core::config::Config;
use gpudiag_core::rules;
use gpudiag_model::error::Error;
use gpudiag_model::printable;
use gpudiag_telemetry::{Backend, now_ms};

use super::{print, print_text};

/// Runs a probe suite on the selected GPUs (NVML indices or UUIDs); Ctrl-C stops it cleanly.
pub(super) fn run_probes(
    suite: SuiteName,
    devices: &[String],
    force: bool,
    only: Option<&[String]>,
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // A handler may already be installed (the `probe` command installs its own); then that
    // one's flag is not ours, and Ctrl-C ends the process, whose exit frees the GPU memory.
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
    let init_timeout = Duration::from_secs(20);
    let _watchdog = hang_watchdog(suite, devices.len(), init_timeout);
    run_probes_with(suite, devices, force, only, stop, init_timeout)
}

/// GPUs assumed when `--device` names none, for the hang bound: more than most hosts have.
const HANG_BOUND_GPUS: u32 = 8;
/// Time past a suite's deadline after which a probe still running is taken as hung.
const HANG_GRACE: Duration = Duration::from_secs(30);

/// A probe checks its deadline between steps, but a CUDA synchronisation on a hung GPU never
/// returns to check it, and Ctrl-C only sets a flag. Past (deadline + context timeout + grace)
/// per GPU, the command says so and exits 3 at once: `_exit`, because the normal exit runs
/// CUDA's exit handlers, which would wait on the hung context too. The terminal UI runs probes
/// on a worker thread and stays responsive, so it arms none.
fn hang_watchdog(
    suite: SuiteName,
    devices: usize,
    init_timeout: Duration,
) -> Option<gpudiag_model::deadline::Watchdog> {
    let deadline_s = gpudiag_probes::suite::builtin(suite.as_str())
        .ok()?
        .deadline_s;
    let gpus = if devices == 0 {
        HANG_BOUND_GPUS
    } else {
        u32::try_from(devices).unwrap_or(HANG_BOUND_GPUS)
    };
    let per_gpu = Duration::from_secs_f64(deadline_s.max(0.0)) + init_timeout + HANG_GRACE;
    // One more deadline for the probes over all GPUs together (p2p, nccl).
    let bound = per_gpu * gpus.saturating_add(1);
    gpudiag_model::deadline::Watchdog::arm("gpudiag-probe-watchdog", bound, move || {
        eprintln!(
            "gpudiag: a probe is still inside a CUDA call {} s after its suite's deadline; the \
             GPU looks hung (check the kernel log for XIDs). Giving up (exit code 3).",
            HANG_GRACE.as_secs()
        );
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(gpudiag_model::error::exit::CANNOT_RUN) }
    })
}

/// The probes panel of the terminal UI: a suite on every GPU, refusing busy ones. The UI's own
/// signal handling ends the session; a run in flight stops at its deadline.
pub fn run_probes_in_ui(suite: SuiteName) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    run_probes_with(
        suite,
        &[],
        false,
        None,
        Arc::new(AtomicBool::new(false)),
        Duration::from_secs(20),
    )
}

fn run_probes_with(
    suite: SuiteName,
    devices: &[String],
    force: bool,
    only: Option<&[String]>,
    stop: Arc<AtomicBool>,
    init_timeout: Duration,
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    let name = suite.as_str();
    let s = gpudiag_probes::suite::builtin(name).map_err(Error::Usage)?;
    let result = gpudiag_probes::runner::run(&gpudiag_probes::runner::Options {
        suite_name: name.into(),
        suite: s,
        only: only.map(<[String]>::to_vec).unwrap_or_default(),
        devices: devices.to_vec(),
        force,
        init_timeout,
        stop,
        read_topology: Some(gpudiag_telemetry::nvml::read_topology),
    });
    match result {
        // No CUDA GPU: if the GPUs here are AMD ones, say that plainly rather than "no driver".
        Err(Error::CannotRun(why)) => Err(Error::CannotRun(match amd_gpus_here() {
            Some(names) => format!(
                "{}: this host's GPUs are AMD ({names}); probes run on NVIDIA GPUs for now",
                gpudiag_telemetry::amd::PROBES_UNAVAILABLE
            ),
            None => why,
        })),
        other => other,
    }
}

/// The AMD GPUs the amdgpu driver shows, by name, when there are any.
fn amd_gpus_here() -> Option<String> {
    let root = std::env::var_os(gpudiag_telemetry::amd::sysfs::SYSFS_ROOT_ENV)
        .map_or_else(|| std::path::PathBuf::from("/"), Into::into);
    let backend = gpudiag_telemetry::amd::sysfs::SysfsBackend::open(&root).ok()?;
    let names: Vec<String> = backend
        .devices()
        .iter()
        .filter_map(|d| gpudiag_telemetry::amd::probes_unavailable(d).map(|_| d.label()))
        .collect();
    (!names.is_empty()).then(|| names.join(", "))
}

/// `gpudiag probe`: prints the results; returns the exit code.
pub fn probe(args: &ProbeArgs, stop: Arc<AtomicBool>, config: &Config) -> Result<i32, Error> {
    gpudiag_probes::runner::check_names(&args.names)?;
    let _watchdog = hang_watchdog(args.suite, args.devices.len(), args.init_timeout);
    let mut report = run_probes_with(
        args.suite,
        &args.devices,
        args.force,
        Some(&args.names),
        stop,
        args.init_timeout,
    )?;
    report.findings = rules::peers::compare(&report.devices, config.rules.peers.margin, now_ms());
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::CannotRun(format!("could not serialise the results: {e}")))?;
        print(&format!("{json}\n"))?;
    } else {
        let mut text = gpudiag_probes::text::render(&report);
        for f in &report.findings {
            text.push_str(&format!(
                "[{}] {} — {}\n",
                f.severity,
                printable::line(&f.title),
                printable::line(&f.advice)
            ));
        }
        print_text(&text)?;
    }
    Ok(report.exit_code())
}
