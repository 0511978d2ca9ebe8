//! Findings and configuration through the real binary: the demo's findings, `config --default`,
//! and bad configuration files.

use assert_cmd::Command;
use gpudiag_core::check::CheckReport;
use gpudiag_core::config::{Config, DEFAULT_CONFIG_TOML};
use gpudiag_model::verdict::Bottleneck;

use crate::support;

fn gpudiag() -> Command {
    let mut c = support::gpudiag();
    // A developer's own config file must not change what the tests see.
    c.env_remove("GPUDIAG_CONFIG");
    c
}

fn report(args: &[&str]) -> CheckReport {
    let out = gpudiag().args(args).output().unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_demo_shows_the_leak_the_power_cap_and_the_parked_process_and_nothing_else() {
    // The demo (assets/demo/load.py): input-starved ResNet-18 training, transformer training
    // on tensor cores at the power limit, the same training keeping a view of each output (a
    // leak), then the process parked with all its memory.
    let r = report(&["check", "--demo", "--json"]);
    let mut ids: Vec<&str> = r
        .devices
        .iter()
        .flat_map(|d| &d.findings)
        .chain(&r.host_findings)
        .map(|f| f.id.as_str())
        .collect();
    ids.sort();
    assert_eq!(ids, ["memory.possible_leak", "throttle.sw_power_cap"]);
    // The whole window mixes the phases; the report says how the verdict changed, naming the
    // process that held memory while it idled, and judges the training from the profiling
    // counters.
    let phases: Vec<Bottleneck> = r.devices[0].phases.iter().map(|p| p.bottleneck).collect();
    let training = r.devices[0]
        .phases
        .iter()
        .find(|p| p.bottleneck == Bottleneck::ComputeBound)
        .unwrap_or_else(|| panic!("{phases:?}"));
    assert_eq!(training.basis.name(), "profiling_counters", "{training:?}");
    let parked = r.devices[0]
        .phases
        .iter()
        .find(|p| p.bottleneck == Bottleneck::IdleHoldingMemory)
        .unwrap_or_else(|| panic!("{phases:?}"));
    assert_eq!(parked.pid, Some(477));
    let leak = r.devices[0]
        .findings
        .iter()
        .find(|f| f.id == "memory.possible_leak")
        .unwrap();
    assert!(leak.title.contains("python3 (pid 477)"), "{}", leak.title);
    let cap = r.devices[0]
        .findings
        .iter()
        .find(|f| f.id == "throttle.sw_power_cap")
        .unwrap();
    assert!(cap.evidence.values["power_mean_w"].as_f64().unwrap() > 650.0);
    assert_eq!(r.exit_code, 0);
}

#[test]
fn a_leak_is_judged_only_while_its_process_holds_memory() {
    // The demo's leaking process (pid 477) exits 117 s in; the recording goes on idle. A window
    // of its last tick holds no process: no leak is current there.
    let end = report(&["check", "--demo", "--window", "0", "--json"]);
    let ids: Vec<&str> = end.devices[0]
        .findings
        .iter()
        .map(|f| f.id.as_str())
        .collect();
    assert!(!ids.contains(&"memory.possible_leak"), "{ids:?}");
    // Over the whole recording the leak is reported, and said to have passed.
    let whole = report(&["check", "--demo", "--json"]);
    let leak = whole.devices[0]
        .findings
        .iter()
        .find(|f| f.id == "memory.possible_leak")
        .unwrap();
    assert!(leak.is_cleared(), "{leak:?}");
}

#[test]
fn a_gpu_its_job_marks_as_waiting_is_not_told_to_fix_its_own_kernels() {
    // A 4-GPU job whose rank 3 hangs: GPUs 0-2 wait in NCCL with their SMs mostly empty, which
    // the utilisation rule on its own reads as underfilled ("launch more work per kernel").
    for fixture in [
        "tests/fixtures/jobs/sensitivity/hung4.ndjson.gz",
        "tests/fixtures/jobs/4gpu-slow2.ndjson.gz",
        "tests/fixtures/jobs/2gpu-slow13.ndjson.gz",
    ] {
        let r = report(&["check", "--replay", fixture, "--json"]);
        let mut waiting = 0;
        for d in &r.devices {
            let Some(v) = &d.verdict else { continue };
            if v.bottleneck != Bottleneck::WaitingForPeer {
                continue;
            }
            waiting += 1;
            let low: Vec<&str> = d
                .findings
                .iter()
                .filter(|f| f.id == "utilisation.low")
                .map(|f| f.title.as_str())
                .collect();
            assert!(low.is_empty(), "{fixture} GPU {}: {low:?}", d.info.index);
        }
        assert!(waiting > 0, "{fixture}: no GPU waits for a peer");
    }
}

#[test]
fn config_default_prints_the_documented_defaults() {
    let out = gpudiag().args(["config", "--default"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, DEFAULT_CONFIG_TOML);
    assert_eq!(Config::parse(&text, "printed").unwrap(), Config::default());
}

#[test]
fn a_config_file_changes_the_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("strict.toml");
    // With a threshold of 100% every busy period counts as "low utilisation".
    std::fs::write(&path, "[rules.utilisation]\nmin_mean_util_pct = 100.0\n").unwrap();
    let out = gpudiag()
        .args([
            "check",
            "--json",
            "--replay",
            "tests/fixtures/recordings/two_gpus.ndjson",
        ])
        .output()
        .unwrap();
    let default: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |r: &CheckReport| r.devices[0].verdict.as_ref().map(|v| v.bottleneck);
    // 79% utilised counts as busy by default: compute, the copies overlapping it.
    assert_eq!(verdict(&default), Some(Bottleneck::ComputeBound));
    let out = gpudiag()
        .args(["check", "--json", "--config"])
        .arg(&path)
        .args(["--replay", "tests/fixtures/recordings/two_gpus.ndjson"])
        .output()
        .unwrap();
    let strict: CheckReport = serde_json::from_slice(&out.stdout).unwrap();
    // Below the stricter "busy", the GPU waits, and the copies are what it waits on.
    assert_eq!(verdict(&strict), Some(Bottleneck::CopyBound));
    // The same file through the environment variable.
    let out = gpudiag()
        .env("GPUDIAG_CONFIG", &path)
        .args(["config"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("min_mean_util_pct = 100.0"));
}

#[test]
fn bad_config_files_exit_2_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, key) in [
        (
            "unknown.toml",
            "[rules.memory]\nnearly_ful_pct = 90\n",
            "nearly_ful_pct",
        ),
        (
            "type.toml",
            "[rules.memory]\nnearly_full_pct = \"high\"\n",
            "nearly_full_pct",
        ),
        (
            "range.toml",
            "[rules.memory]\nnearly_full_pct = 150\n",
            "rules.memory.nearly_full_pct",
        ),
        ("table.toml", "[rulez]\n", "rulez"),
        ("syntax.toml", "[rules.memory\n", "syntax.toml"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = gpudiag()
            .args(["check", "--demo", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name), "{name}: {err}");
        assert!(err.contains(key), "{name}: {err}");
        // One error style: every line says it is gpudiag's; a TOML error keeps its lines.
        assert!(err.lines().all(|l| l.starts_with("gpudiag: ")), "{err}");
        assert!(out.stdout.is_empty());
    }
    let out = gpudiag()
        .args(["check", "--demo", "--config", "/nonexistent/gpudiag.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/gpudiag.toml"));
}

#[test]
fn a_config_that_is_a_fifo_a_directory_or_too_large_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "# a comment line\n".repeat(100_000)).unwrap();
    // /dev/zero never ends (it was read until memory ran out); a FIFO waited for a writer.
    let fifo = dir.path().join("fifo.toml");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for (path, why) in [
        (std::path::Path::new("/dev/zero"), "larger than 1024 KiB"),
        (fifo.as_path(), "a FIFO, not a file"),
        (dir.path(), "a directory, not a file"),
        (big.as_path(), "larger than 1024 KiB"),
    ] {
        let out = gpudiag()
            .args(["config", "--config"])
            .arg(path)
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{}: {err}", path.display());
    }
    // /dev/null is no configuration, as scripts use it.
    let out = gpudiag()
        .args(["config", "--config", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // An empty GPUDIAG_CONFIG is unset, not a file named "".
    let out = gpudiag()
        .env("GPUDIAG_CONFIG", "")
        .args(["config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
