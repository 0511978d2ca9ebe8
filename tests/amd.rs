//! AMD support end to end without an AMD GPU: `check` and `probe` on the fake amdgpu trees in
//! `tests/fixtures/sysfs/` (the sysfs backend and the ROCm SMI loader themselves are tested in
//! `crates/telemetry/tests/amd.rs`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{self, Run, at};

use crate::support::amd_sysfs::{MI300X_GPU, copy_tree};

fn sysfs_root(name: &str) -> PathBuf {
    at("tests/fixtures/sysfs").join(name)
}

/// True on a host with an AMD GPU driver, where "no AMD GPU" does not apply.
fn has_amd_gpu() -> bool {
    Path::new("/dev/kfd").exists()
}

// ---------------------------------------------------------------------------------------------
// The binary on the fixtures

/// `gpudiag ARGS` with `env` set, on no sysfs tree and no kernel log unless `env` gives them.
fn gpudiag(args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = support::gpudiag();
    cmd.env_remove("GPUDIAG_SYSFS_ROOT")
        // This host's kernel log is no part of a fixture (kernel_log.rs covers it).
        .env("GPUDIAG_KMSG_PATH", "");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::of(cmd.args(args))
}

fn report_validator() -> jsonschema::Validator {
    let path = at("assets/schema/check-report.schema.json");
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
    let line = gpudiag(&["check", "--backend", "replay"], &[])
        .one_line_error(2)
        .to_owned();
    assert!(line.contains("--backend replay needs --replay"), "{line}");
    let line = gpudiag(&["check", "--backend", "nvml", "--demo"], &[])
        .one_line_error(2)
        .to_owned();
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
    let line = gpudiag(&["check", "--backend", "rocm"], &[])
        .one_line_error(3)
        .to_owned();
    assert!(line.contains("no AMD GPU"), "{line}");
}

/// A writable copy of the fixture tree `name`, for tests that change it.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    copy_tree(&sysfs_root(name))
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
        let out = support::gpudiag()
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
        let report: gpudiag_core::check::CheckReport = serde_json::from_slice(&out.stdout).unwrap();
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
    let libcuda = gpudiag_model::cuda_libraries::detect_libraries()
        .into_iter()
        .any(|l| l.name == "libcuda" && l.found);
    if libcuda {
        eprintln!("skipped: this host has libcuda");
        return;
    }
    let out = support::gpudiag()
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
