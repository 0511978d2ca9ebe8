#![allow(clippy::unwrap_used, clippy::expect_used)]
//! AMD support without an AMD GPU: the amdgpu sysfs backend on the fake trees in
//! `tests/fixtures/sysfs/`, the ROCm SMI loader against the real library (Debian's
//! `librocm-smi64-1`, installed by `.ci/run`), and `check` on the fixtures end to end.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

use gpudiag::telemetry::amd::rocm::{self, Library64, LoadError, RocmBackend};
use gpudiag::telemetry::amd::sysfs::SysfsBackend;
use gpudiag::telemetry::{Absent, Backend, BackendError, Sample};

const GIB: u64 = 1 << 30;

fn sysfs_root(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn one_sample(name: &str) -> (SysfsBackend, Sample) {
    let mut b = SysfsBackend::open(&sysfs_root(name)).unwrap();
    let mut tick = b.poll().unwrap();
    assert_eq!(tick.samples.len(), 1, "one amdgpu card in {name}");
    assert!(tick.events.is_empty());
    let s = tick.samples.remove(0);
    (b, s)
}

// ---------------------------------------------------------------------------------------------
// sysfs fixtures

#[test]
fn mi300x_fixture_device_info() {
    let (b, _) = one_sample("mi300x");
    assert_eq!(b.name(), "sysfs");
    // card1 is the BMC's VGA (ast) and renderD128 the same GPU again: neither is listed.
    assert_eq!(b.devices().len(), 1);
    let d = &b.devices()[0];
    assert_eq!(d.index, 0);
    assert_eq!(d.vendor.as_deref(), Some("AMD"));
    assert_eq!(d.name.as_deref(), Some("AMD Instinct MI300X"));
    assert_eq!(d.architecture.as_deref(), Some("CDNA3"));
    assert_eq!(d.pci_bus_id.as_deref(), Some("0000:03:00.0"));
    assert_eq!(d.uuid.as_deref(), Some("0x9a3f6c2d81b4e057"));
    assert_eq!(d.serial.as_deref(), Some("692351000123"));
    assert_eq!(d.vbios_version.as_deref(), Some("113-M3000100-102"));
    assert_eq!(d.memory_total_bytes, Some(192 * GIB));
    assert_eq!(d.power_limit_default_w, Some(750.0));
    assert_eq!(d.power_limit_min_w, Some(0.0));
    assert_eq!(d.power_limit_max_w, Some(750.0));
    assert_eq!(d.sm_clock_max_mhz, Some(2100));
    assert_eq!(d.mem_clock_max_mhz, Some(1300));
    // The GPU and its slot can both do Gen5 x16.
    assert_eq!(d.pcie_gen_max, Some(5));
    assert_eq!(d.pcie_width_max, Some(16));
    // Junction limits (MI300X has no edge sensor).
    assert_eq!(d.temp_slowdown_c, Some(105.0));
    assert_eq!(d.temp_shutdown_c, Some(110.0));
    assert_eq!(d.temp_mem_max_c, Some(95.0));
    assert_eq!(d.ecc_enabled, Some(true));
    for nvidia_only in ["compute_capability", "persistence_mode", "mig_enabled"] {
        assert_eq!(d.absent.get(nvidia_only), Some(&Absent::Unavailable));
    }
    assert_eq!(d.compute_capability, None);
    let host = b.host();
    assert_eq!(host.driver_version.as_deref(), Some("6.8.0-48-generic"));
    assert_eq!(host.cuda_driver_version, None);
}

#[test]
fn mi300x_fixture_sample() {
    let (_, s) = one_sample("mi300x");
    assert_eq!(s.device, 0);
    assert_eq!(s.gpu_util_pct, Some(87.0));
    assert_eq!(s.mem_util_pct, Some(41.0));
    assert_eq!(s.mem_used_bytes, Some(50 * GIB));
    assert_eq!(s.mem_total_bytes, Some(192 * GIB));
    assert_eq!(s.mem_free_bytes, Some(142 * GIB));
    // power1_input (MI300 has no power1_average).
    assert_eq!(s.power_w, Some(612.0));
    assert_eq!(s.power_limit_w, Some(750.0));
    assert_eq!(s.temp_gpu_c, Some(58.0));
    assert_eq!(s.temp_mem_c, Some(46.0));
    assert_eq!(s.sm_clock_mhz, Some(1420));
    assert_eq!(s.mem_clock_mhz, Some(1300));
    // Downtrained: Gen4 on a Gen5 link.
    assert_eq!((s.pcie_gen, s.pcie_gen_max), (Some(4), Some(5)));
    assert_eq!((s.pcie_width, s.pcie_width_max), (Some(16), Some(16)));
    assert_eq!(s.pcie_replay_count, Some(0));
    assert_eq!(s.ecc_corrected_volatile, Some(2));
    assert_eq!(s.ecc_uncorrected_volatile, Some(0));
    assert_eq!(s.retired_pages_pending, Some(false));
    // No fan on an OAM module, no energy counter in this tree: absent, never 0.
    assert_eq!(s.fan_pct, None);
    assert_eq!(s.why_absent("fan_pct"), Some(&Absent::NotSupported));
    assert_eq!(s.energy_j, None);
    assert_eq!(s.why_absent("energy_j"), Some(&Absent::NotSupported));
    for nvidia_only in ["pstate", "throttle_reasons", "remapped_rows_pending"] {
        assert_eq!(s.why_absent(nvidia_only), Some(&Absent::Unavailable));
    }

    // pid 4242: one client on two descriptors (4 GiB, counted once) and another (1 GiB), and
    // /dev/kfd open: a ROCm compute process (its fdinfo shows no compute engine time);
    // pid 5151: a client holding no VRAM yet. Sockets and /dev/null are not clients.
    let procs = s.processes.as_ref().unwrap();
    assert_eq!(procs.len(), 2, "{procs:?}");
    let p = &procs[0];
    assert_eq!(p.pid, 4242);
    assert_eq!(p.name.as_deref(), Some("python3"));
    assert_eq!(p.user.as_deref(), Some("alice"));
    assert_eq!(p.kind.as_deref(), Some("compute"));
    assert_eq!(p.used_memory_bytes, Some(5 * GIB));
    assert_eq!(p.sm_util_pct, None);
    assert_eq!(
        p.container_id.as_deref(),
        Some("3f0c6a1e2b9d4c8f7a6e5d4c3b2a19081726354453627180f9e8d7c6b5a49382")
    );
    let q = &procs[1];
    assert_eq!((q.pid, q.name.as_deref()), (5151, Some("amd-smi")));
    assert_eq!(q.user.as_deref(), Some("root"));
    assert_eq!(q.used_memory_bytes, Some(0));
    assert_eq!(q.kind, None);
}

#[test]
fn radeon_fixture_behind_amds_switch() {
    let (b, s) = one_sample("radeon");
    let d = &b.devices()[0];
    // No product_name on Radeon boards: the name comes from the device id table.
    assert_eq!(d.name.as_deref(), Some("AMD Radeon RX 7900 XT / XTX"));
    assert_eq!(d.architecture.as_deref(), Some("RDNA3"));
    assert_eq!(d.pci_bus_id.as_deref(), Some("0000:0c:00.0"));
    assert_eq!(d.uuid, None);
    assert_eq!(d.absent.get("uuid"), Some(&Absent::NotSupported));
    assert_eq!(d.serial, None);
    assert_eq!(d.absent.get("serial"), Some(&Absent::NotSupported));
    // No ras directory: ECC is not "off", it is not offered.
    assert_eq!(d.ecc_enabled, None);
    assert_eq!(d.absent.get("ecc_enabled"), Some(&Absent::NotSupported));
    // power1_cap_min is missing from this hwmon.
    assert_eq!(d.power_limit_min_w, None);
    assert_eq!(
        d.absent.get("power_limit_min_w"),
        Some(&Absent::NotSupported)
    );
    assert_eq!(d.power_limit_max_w, Some(347.0));
    // Junction crit is there, junction emergency is not.
    assert_eq!(d.temp_slowdown_c, Some(110.0));
    assert_eq!(d.temp_shutdown_c, None);
    assert_eq!(d.absent.get("temp_shutdown_c"), Some(&Absent::NotSupported));
    assert_eq!(d.sm_clock_max_mhz, Some(2482));
    assert_eq!(b.host().driver_version.as_deref(), Some("6.10.5"));

    // The GPU's own link is the switch-internal Gen4 x16; the slot link (the switch's upstream
    // port) trained at Gen3 x8 of a Gen4 x16 slot.
    assert_eq!((s.pcie_gen, s.pcie_gen_max), (Some(3), Some(4)));
    assert_eq!((s.pcie_width, s.pcie_width_max), (Some(8), Some(16)));
    assert_eq!(s.pcie_replay_count, Some(12));
    // Deep sleep: the S: line is current.
    assert_eq!(s.sm_clock_mhz, Some(19));
    assert_eq!(s.mem_clock_mhz, Some(1249));
    assert_eq!(s.temp_gpu_c, Some(48.0));
    assert_eq!(s.temp_mem_c, Some(52.0));
    assert_eq!(s.power_w, Some(38.0));
    assert_eq!(s.power_limit_w, Some(303.0));
    assert!(
        (s.fan_pct.unwrap() - 30.196).abs() < 1e-3,
        "{:?}",
        s.fan_pct
    );
    assert_eq!(s.gpu_util_pct, Some(3.0));
    assert_eq!(s.ecc_uncorrected_volatile, None);
    assert_eq!(
        s.why_absent("ecc_uncorrected_volatile"),
        Some(&Absent::NotSupported)
    );
    let procs = s.processes.as_ref().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].name.as_deref(), Some("Xorg"));
    assert_eq!(procs[0].kind.as_deref(), Some("graphics"));
    assert_eq!(procs[0].used_memory_bytes, Some(256 << 20));
    assert_eq!(procs[0].container_id, None);
}

#[test]
fn every_absent_sample_field_has_a_reason() {
    for name in ["mi300x", "radeon"] {
        let (_, s) = one_sample(name);
        let json = serde_json::to_value(&s).unwrap();
        for (field, value) in json.as_object().unwrap() {
            if value.is_null() {
                assert!(
                    s.absent.contains_key(field),
                    "{name}: {field} is null without a reason"
                );
            }
        }
        for field in s.absent.keys() {
            assert!(
                json[field].is_null(),
                "{name}: {field} has a value and a reason"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ROCm SMI loader against the real library

/// Where Debian's librocm-smi64-1 puts the library (`.ci/run` installs it).
const DEBIAN_LIBRARY: &str = "/usr/lib/librocm_smi64.so.1";

/// True on a host with an AMD GPU driver, where "no AMD GPU" does not apply.
fn has_amd_gpu() -> bool {
    Path::new("/dev/kfd").exists()
}

#[test]
fn rocm_smi_loads_resolves_every_symbol_and_reports_no_amd_gpu() {
    match Library64::load() {
        Ok(lib) => {
            // `load` resolves every symbol in SYMBOLS or fails: getting here proves them all.
            assert!(rocm::SYMBOLS.len() >= 25);
            // The version picks the struct layouts: it must be known.
            assert!(lib.version.is_some(), "{lib:?}");
            assert!(lib.name.starts_with("librocm_smi64.so") || lib.name.contains("/opt/rocm"));
            eprintln!(
                "loaded {} (library version {:?}), {} symbols resolved",
                lib.name,
                lib.version,
                rocm::SYMBOLS.len()
            );
            if has_amd_gpu() {
                eprintln!("this host has an AMD GPU: the no-GPU path does not apply");
                return;
            }
            let err = lib.init().unwrap_err();
            assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
            assert!(err.to_string().contains("no AMD GPU"), "{err}");
            drop(lib);
            // The backend says the same through its own door, without panicking.
            let err = RocmBackend::open(std::time::Duration::from_secs(10)).unwrap_err();
            assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        Err(LoadError::NotFound(tried)) => {
            assert!(
                !Path::new(DEBIAN_LIBRARY).exists(),
                "{DEBIAN_LIBRARY} exists but did not load: {tried}"
            );
            eprintln!("librocm_smi64 is not installed here; checked the absent path only");
            assert!(tried.contains("librocm_smi64.so"), "{tried}");
            if !has_amd_gpu() {
                let err = RocmBackend::open(std::time::Duration::from_secs(10)).unwrap_err();
                assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
            }
        }
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The binary on the fixtures

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn gpudiag(args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = Command::cargo_bin("gpudiag").unwrap();
    cmd.env(
        "XDG_CONFIG_HOME",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-config"),
    )
    .env_remove("GPUDIAG_SYSFS_ROOT")
    // This host's kernel log is no part of a fixture (tests/kernel_log.rs covers it).
    .env("GPUDIAG_KMSG_PATH", "");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .args(args)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    Run {
        code: out.status.code().expect("killed by a signal"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

impl Run {
    /// Asserts the exit code and a single `gpudiag: ...` line on stderr; returns it.
    fn one_line_error(&self, code: i32) -> String {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(self.stdout.is_empty(), "{}", self.stdout);
        let line = self.stderr.strip_suffix('\n').unwrap_or(&self.stderr);
        assert!(!line.contains('\n'), "one line: {:?}", self.stderr);
        assert!(line.starts_with("gpudiag: "), "{line}");
        line.to_owned()
    }
}

fn report_validator() -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/schema/check-report.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn assert_schema_valid(report: &Value, what: &str) {
    let v = report_validator();
    let errors: Vec<String> = v
        .iter_errors(report)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}:\n{}", errors.join("\n"));
}

fn sysfs_check(name: &str, extra: &[&str]) -> (Value, Run) {
    let root = sysfs_root(name);
    let mut args = vec![
        "check",
        "--json",
        "--backend",
        "sysfs",
        "--sysfs-root",
        root.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let run = gpudiag(&args, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    (serde_json::from_str(&run.stdout).unwrap(), run)
}

#[test]
fn check_json_of_the_mi300x_fixture_is_schema_valid() {
    for window in ["0", "300ms"] {
        let (report, _) = sysfs_check("mi300x", &["--window", window]);
        assert_schema_valid(&report, &format!("mi300x --window {window}"));
        assert_eq!(report["source"]["backend"], "sysfs");
        // The link runs at Gen4 of Gen5 while busy: one read is too little to call it, a few
        // ticks are enough.
        let expected = if window == "0" { "healthy" } else { "warn" };
        assert_eq!(report["status"], expected, "--window {window}");
        let d = &report["devices"][0];
        assert_eq!(d["info"]["vendor"], "AMD");
        assert_eq!(d["info"]["name"], "AMD Instinct MI300X");
        assert_eq!(d["latest"]["pcie_gen"], 4);
        assert_eq!(d["latest"]["pcie_gen_max"], 5);
        assert_eq!(d["latest"]["fan_pct"], Value::Null);
        assert_eq!(d["latest"]["absent"]["fan_pct"], "not_supported");
        assert_eq!(d["summary"]["gpu_util_pct"]["last"], 87.0);
        // The NVIDIA-only checks say they did not run, at info (no effect on the status).
        let findings = d["findings"].as_array().unwrap();
        let ids: Vec<&str> = findings.iter().map(|f| f["id"].as_str().unwrap()).collect();
        if window == "0" {
            assert_eq!(ids, ["vendor.nvidia_only_signals"]);
        } else {
            assert_eq!(ids, ["pcie.link_downtrained", "vendor.nvidia_only_signals"]);
        }
        let vendor = findings.last().unwrap();
        assert_eq!(vendor["severity"], "info");
    }
}

#[test]
fn check_json_of_the_radeon_fixture_is_schema_valid_and_root_comes_from_env() {
    let root = sysfs_root("radeon");
    let run = gpudiag(
        &["check", "--json", "--backend", "sysfs", "--window", "0"],
        &[("GPUDIAG_SYSFS_ROOT", &root)],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_schema_valid(&report, "radeon");
    let latest = &report["devices"][0]["latest"];
    assert_eq!(latest["pcie_width"], 8);
    assert_eq!(latest["pcie_width_max"], 16);
    assert_eq!(latest["sm_clock_mhz"], 19);
    assert_eq!(
        report["devices"][0]["info"]["absent"]["uuid"],
        "not_supported"
    );
}

#[test]
fn fail_on_info_counts_the_nvidia_only_notice() {
    let root = sysfs_root("mi300x");
    let run = gpudiag(
        &[
            "check",
            "--backend",
            "sysfs",
            "--sysfs-root",
            root.to_str().unwrap(),
            "--window",
            "0",
            "--fail-on",
            "info",
        ],
        &[],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("[info] AMD GPU: checks that need NVIDIA-only signals"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_recording_of_the_fixture_replays_like_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("amd.ndjson");
    let root = sysfs_root("mi300x");
    let run = gpudiag(
        &[
            "record",
            "--backend",
            "sysfs",
            "--sysfs-root",
            root.to_str().unwrap(),
            "--duration",
            "300ms",
            "--interval",
            "100ms",
            "-o",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let header: Value = serde_json::from_str(
        std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["backend"], "sysfs");
    assert_eq!(header["devices"][0]["vendor"], "AMD");
    let run = gpudiag(&["check", "--json", "--replay", out.to_str().unwrap()], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_schema_valid(&report, "replay of an AMD recording");
    assert_eq!(report["devices"][0]["info"]["architecture"], "CDNA3");
    assert_eq!(report["devices"][0]["latest"]["processes"][0]["pid"], 4242);
}

#[test]
fn backend_flag_misuse_is_a_usage_error() {
    let line = gpudiag(&["check", "--backend", "replay"], &[]).one_line_error(2);
    assert!(line.contains("--backend replay needs --replay"), "{line}");
    let line = gpudiag(&["check", "--backend", "nvml", "--demo"], &[]).one_line_error(2);
    assert!(line.contains("cannot go with --replay or --demo"), "{line}");
    // clap's own message, with the choices listed.
    let run = gpudiag(&["check", "--backend", "amd"], &[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("'amd'"), "{}", run.stderr);
    assert!(
        run.stderr.contains("auto, nvml, rocm, sysfs, replay"),
        "{}",
        run.stderr
    );
    // --backend replay with a recording is the replay.
    let demo = gpudiag(&["check", "--backend", "replay", "--demo", "--json"], &[]);
    assert_eq!(demo.code, 0, "{}", demo.stderr);
}

#[test]
fn amd_backends_without_an_amd_gpu_exit_3_in_one_line() {
    let empty = tempfile::tempdir().unwrap();
    let run = gpudiag(
        &[
            "check",
            "--backend",
            "sysfs",
            "--sysfs-root",
            empty.path().to_str().unwrap(),
        ],
        &[],
    );
    let line = run.one_line_error(3);
    assert!(line.contains("no GPU driver is loaded"), "{line}");
    if has_amd_gpu() {
        return;
    }
    let line = gpudiag(&["check", "--backend", "rocm"], &[]).one_line_error(3);
    assert!(line.contains("no AMD GPU"), "{line}");
}

/// A writable copy of a fixture tree (symlinks kept), for tests that change it.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(sysfs_root(name))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let root = dir.path().join(name);
    (dir, root)
}

const MI300X_GPU: &str =
    "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0";

#[test]
fn a_gpu_that_vanishes_is_lost_once() {
    let (_dir, root) = copy_fixture("mi300x");
    let mut b = SysfsBackend::open(&root).unwrap();
    assert!(b.poll().unwrap().events.is_empty());
    std::fs::remove_dir_all(root.join(MI300X_GPU)).unwrap();
    let tick = b.poll().unwrap();
    assert_eq!(tick.events.len(), 1, "{:?}", tick.events);
    assert_eq!(tick.events[0].device, Some(0));
    assert!(
        matches!(&tick.events[0].kind, gpudiag::telemetry::EventKind::DeviceLost { reason }
            if reason.contains("0000:03:00.0")),
        "{:?}",
        tick.events[0]
    );
    let s = &tick.samples[0];
    assert_eq!(s.gpu_util_pct, None);
    assert_eq!(s.why_absent("gpu_util_pct"), Some(&Absent::GpuLost));
    assert!(
        s.absent.values().all(|a| *a == Absent::GpuLost),
        "{:?}",
        s.absent
    );
    // Said once.
    assert!(b.poll().unwrap().events.is_empty());
}

#[test]
fn a_page_pending_retirement_warns_that_a_reset_is_needed() {
    let (_dir, root) = copy_fixture("mi300x");
    std::fs::write(
        root.join(MI300X_GPU).join("ras/gpu_vram_bad_pages"),
        "0x000002a1 : 0x00001000 : R\n0x00004c3e : 0x00001000 : P\n",
    )
    .unwrap();
    let run = gpudiag(
        &[
            "check",
            "--json",
            "--backend",
            "sysfs",
            "--sysfs-root",
            root.to_str().unwrap(),
            "--window",
            "0",
            "--fail-on",
            "warn",
        ],
        &[],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_schema_valid(&report, "pending page");
    assert_eq!(report["status"], "warn");
    let ids: Vec<&str> = report["devices"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["errors.reset_pending", "vendor.nvidia_only_signals"]);
}

#[test]
fn downtrained_amd_links_fire_the_pcie_rule_without_p_states() {
    for (fixture, expected) in [("mi300x", "Gen4 x16"), ("radeon", "Gen3 x8")] {
        let out = assert_cmd::Command::cargo_bin("gpudiag")
            .unwrap()
            .args([
                "check",
                "--json",
                "--backend",
                "sysfs",
                "--window",
                "1s",
                "--sysfs-root",
            ])
            .arg(format!("tests/fixtures/sysfs/{fixture}"))
            .output()
            .unwrap();
        let report: gpudiag::check::CheckReport = serde_json::from_slice(&out.stdout).unwrap();
        let link = report.devices[0]
            .findings
            .iter()
            .find(|f| f.id == "pcie.link_downtrained")
            .unwrap_or_else(|| panic!("{fixture}: {:?}", report.devices[0].findings));
        assert!(link.title.contains(expected), "{fixture}: {}", link.title);
    }
}

#[test]
fn probe_on_an_amd_host_says_amd_probes_are_not_available_yet() {
    // Only meaningful where no CUDA driver answers first (CI); on a GPU host probes would run.
    let libcuda = gpudiag::cuda_libraries::detect_libraries()
        .into_iter()
        .any(|l| l.name == "libcuda" && l.found);
    if libcuda {
        eprintln!("skipped: this host has libcuda");
        return;
    }
    let out = assert_cmd::Command::cargo_bin("gpudiag")
        .unwrap()
        .env("GPUDIAG_SYSFS_ROOT", "tests/fixtures/sysfs/mi300x")
        .args(["probe", "--suite", "quick"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AMD probes are not available yet"), "{err}");
    assert!(err.contains("AMD Instinct MI300X"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
