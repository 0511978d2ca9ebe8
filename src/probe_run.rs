//! Running a probe suite: here, under a watchdog that ends a run hung on its GPU, or in a child
//! `gpudiag probe` process (the terminal UI's way, so the UI never holds a CUDA context). Below
//! both the `probe` and `check --probes` commands and the terminal UI, which all start runs.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cli::SuiteName;
use crate::stop::Stop;
use gpudiag_model::error::Error;
use gpudiag_telemetry::Backend;

/// Runs a probe suite on the selected GPUs (NVML indices or UUIDs); Ctrl-C stops it cleanly.
pub fn run_probes(
    suite: SuiteName,
    devices: &[String],
    force: bool,
    only: Option<&[String]>,
    stop: &Stop,
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    let stop = stop.flag();
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
/// as a child `gpudiag probe`, so this watchdog guards those runs too.
pub fn hang_watchdog(
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

/// The probes panel of the terminal UI: a suite on every GPU (busy ones refused unless
/// `force`), run by a child `gpudiag probe --json` of this same binary.
///
/// A child, because a probe run can leave CUDA state behind that no drop in this process
/// releases: every cudarc object the runner makes is dropped when it returns (`Gpu` releases
/// the primary context it retained), but cuBLASLt and NCCL are built on the CUDA runtime,
/// which retains the primary context of each device it initialises until the process exits or
/// resets the device, and libcuda stays loaded. In the UI's process that kept about 500 MiB of
/// each probed GPU for the rest of the session; the child's contexts end with the child,
/// whatever the libraries do. A hung CUDA call there also cannot wedge the UI, and the child's
/// own watchdog bounds it.
pub fn run_probes_in_ui(
    suite: SuiteName,
    force: bool,
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    // /proc/self/exe is this very binary even if the file was replaced since it started.
    let proc_exe = Path::new("/proc/self/exe");
    let exe = if proc_exe.exists() {
        proc_exe.to_path_buf()
    } else {
        std::env::current_exe()
            .map_err(|e| Error::CannotRun(format!("cannot find gpudiag's own binary: {e}")))?
    };
    run_probes_in_child(&exe, suite, force)
}

/// Runs `exe probe --suite SUITE --json [--force]` and reads its report. The child gets
/// SIGTERM if this process dies first (it then stops at its next probe and frees its GPUs),
/// so quitting the UI mid-run leaves nothing running.
pub fn run_probes_in_child(
    exe: &Path,
    suite: SuiteName,
    force: bool,
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    // The UI applies its own rules to the report (peers margin); the child needs none, and a
    // config file the UI was not started with must not stop it.
    cmd.arg0("gpudiag").args([
        "--config",
        "/dev/null",
        "probe",
        "--suite",
        suite.as_str(),
        "--json",
    ]);
    if force {
        cmd.arg("--force");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the line above took effect.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let out = cmd.output().map_err(|e| {
        Error::CannotRun(format!(
            "could not start the probe process ({}): {e}",
            exe.display()
        ))
    })?;
    child_report(out.status, &out.stdout, &out.stderr)
}

/// What a child `gpudiag probe --json` ended with: its report (exit 0, or 1 when a probe
/// failed or a GPU was refused), else the error it printed.
fn child_report(
    status: std::process::ExitStatus,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<gpudiag_probes::runner::ProbeReport, Error> {
    use std::os::unix::process::ExitStatusExt;
    let said = String::from_utf8_lossy(stderr);
    let said = said
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.strip_prefix("gpudiag: ").unwrap_or(l).to_owned());
    match status.code() {
        Some(0 | 1) => serde_json::from_slice(stdout).map_err(|e| {
            Error::CannotRun(format!(
                "the probe process gave no report ({e}){}",
                said.map(|s| format!(": {s}")).unwrap_or_default()
            ))
        }),
        Some(code) => {
            Err(Error::CannotRun(said.unwrap_or_else(|| {
                format!("the probe process exited with code {code}")
            })))
        }
        None => Err(Error::CannotRun(format!(
            "the probe process was killed by signal {}{}",
            status.signal().unwrap_or(0),
            said.map(|s| format!(" ({s})")).unwrap_or_default()
        ))),
    }
}

pub fn run_probes_with(
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
        gpu_state: Arc::new(gpudiag_telemetry::nvml::NvmlGpuState::open(init_timeout)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn exited(code: i32) -> std::process::ExitStatus {
        std::process::ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn the_childs_report_or_its_last_word_comes_back() {
        let report = r#"{"suite":"quick","devices":[{"index":0,"gpu":null,"model":null,
            "refused":"GPU 0 is in use by pid 7","name":"NVIDIA H200","forcible":true,
            "busy_pids":[7],"results":[]}]}"#;
        // Exit 1 (a GPU refused) still carries the report.
        let r = child_report(exited(1), report.as_bytes(), b"").unwrap();
        assert!(r.devices[0].forcible);
        assert_eq!(r.devices[0].busy_pids, [7]);
        let e = child_report(
            exited(3),
            b"",
            b"gpudiag: note\ngpudiag: the CUDA driver sees no GPU\n\n",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "the CUDA driver sees no GPU");
        let e = child_report(exited(0), b"not json", b"").unwrap_err();
        assert!(e.to_string().contains("gave no report"), "{e}");
        let e = child_report(std::process::ExitStatus::from_raw(9), b"", b"").unwrap_err();
        assert!(e.to_string().contains("signal 9"), "{e}");
    }
}
