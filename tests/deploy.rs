#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The deployment files under assets/deploy/, run or loaded as shipped: the Slurm prolog and
//! epilog against a fake `gpudiag` (printing reports the real binary made from the recordings)
//! and a fake `scontrol` that records its arguments; the systemd unit through
//! `systemd-analyze verify`; the Prometheus scrape configs through `promtool check config` and
//! a real Prometheus that loads them. Tools a test needs are skipped with a message where
//! absent, and fail the test where GPUDIAG_REQUIRE_DEPLOY_TOOLS is set (`.ci/run` sets it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn at(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A tool on PATH, or `None` with a message; a failure where CI requires the deploy tools.
fn tool(name: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !path.is_empty() {
        return Some(PathBuf::from(path));
    }
    assert!(
        std::env::var_os("GPUDIAG_REQUIRE_DEPLOY_TOOLS").is_none(),
        "GPUDIAG_REQUIRE_DEPLOY_TOOLS is set but `{name}` is not on PATH (.ci/run installs it)"
    );
    eprintln!("skipped: `{name}` is not on PATH");
    None
}

/// `gpudiag check --json --replay` of a recording, from the real binary.
fn report_of(recording: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["check", "--json", "--replay"])
        .arg(at(&format!("tests/fixtures/recordings/{recording}")))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).expect("check --json prints a document")
}

/// A report of the given status with no device, as `check --json` prints when it cannot run.
fn report_with_status(status: &str) -> Value {
    let mut r = report_of("healthy.ndjson");
    r["status"] = status.into();
    if status == "could_not_run" {
        r["devices"] = Value::Array(Vec::new());
        r["could_not_run"] = "NVML initialisation hung past --init-timeout".into();
    } else {
        r["not_judged"] = serde_json::json!([
            {"rule": "utilisation.low", "device": 0, "reason": "no reading"}
        ]);
    }
    r["exit_code"] = 3.into();
    r
}

/// A scratch node: fake `gpudiag`, `scontrol` and `journalctl` first on PATH, each recording
/// its arguments; the report the fake gpudiag prints; a state and a summary directory.
struct Node {
    dir: tempfile::TempDir,
}

struct Ran {
    code: i32,
    stderr: String,
    /// The fake gpudiag's arguments, one call a line.
    gpudiag_args: Vec<String>,
    /// The fake scontrol's arguments, one argument a line, or `None` when it was not called.
    scontrol_args: Option<Vec<String>>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let fakes = [
            (
                "gpudiag",
                "echo \"$*\" >>\"$FAKE_DIR/gpudiag.args\"\n\
                 cat \"$FAKE_DIR/report.json\" 2>/dev/null\nexit \"${FAKE_RC:-0}\"\n",
            ),
            (
                "scontrol",
                "for a in \"$@\"; do printf '%s\\n' \"$a\"; done >>\"$FAKE_DIR/scontrol.args\"\n",
            ),
            (
                "journalctl",
                "echo \"$*\" >>\"$FAKE_DIR/journalctl.args\"\n\
                 echo '2026-01-01T00:00:01+0000 n kernel: NVRM: Xid (PCI:0000:19:00): 48, pid=51007, DBE'\n\
                 echo '2026-01-01T00:00:02+0000 n kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, off the bus'\n\
                 echo '2026-01-01T00:00:03+0000 n kernel: usb 1-1: new device'\n",
            ),
        ];
        for (name, body) in fakes {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
            let mut perm = std::fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
            std::fs::set_permissions(&path, perm).unwrap();
        }
        Node { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn report(&self, report: &Value) -> &Node {
        std::fs::write(self.path("report.json"), report.to_string()).unwrap();
        self
    }

    /// Runs assets/deploy/slurm/<script> with bash, as slurmd would, with `envs` on top of a
    /// job environment (job 42 on node07, no syslog, no /proc/driver/nvidia).
    fn run(&self, script: &str, envs: &[(&str, &str)]) -> Ran {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out: Output = Command::new("bash")
            .arg(at(&format!("assets/deploy/slurm/{script}")))
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("FAKE_DIR", self.dir.path())
            .env("SLURM_JOB_ID", "42")
            .env("SLURMD_NODENAME", "node07")
            .env("GPUDIAG_SYSLOG", "0")
            .env("GPUDIAG_SLURM_CONF", self.path("no-such.conf"))
            .env("GPUDIAG_PROC_GPUS", self.path("proc-gpus"))
            .env("GPUDIAG_STATE_DIR", self.path("state"))
            .env("GPUDIAG_SUMMARY_DIR", self.path("summaries"))
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        let read = |name: &str| {
            std::fs::read_to_string(self.path(name))
                .ok()
                .map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
        };
        Ran {
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            gpudiag_args: read("gpudiag.args").unwrap_or_default(),
            scontrol_args: read("scontrol.args"),
        }
    }
}

fn drain_args(reason: &str) -> Vec<String> {
    ["update", "nodename=node07", "state=drain"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("reason={reason}")])
        .collect()
}

#[test]
fn prolog_drains_on_a_failing_report_with_the_finding_as_reason() {
    let report = report_of("ecc_error.ndjson");
    assert_eq!(report["status"], "fail");
    // The reason names the first fail finding of the recording, and its GPU.
    let first = report["devices"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["severity"] == "fail")
        .unwrap();
    let reason = format!(
        "gpudiag: {} on GPU {}",
        first["id"].as_str().unwrap(),
        report["devices"][0]["info"]["index"]
    );
    let node = Node::new();
    let ran = node
        .report(&report)
        .run("prolog", &[("SLURM_JOB_GPUS", "1,3")]);
    assert_eq!(
        ran.code, 1,
        "a drained prolog exits non-zero: {}",
        ran.stderr
    );
    assert_eq!(
        ran.scontrol_args,
        Some(drain_args(&reason)),
        "{}",
        ran.stderr
    );
    assert_eq!(
        ran.gpudiag_args,
        ["check --json --probes quick --fail-on fail --device 1 --device 3"],
        "only the job's GPUs are checked"
    );
}

#[test]
fn prolog_lets_a_healthy_job_run() {
    let report = report_of("healthy.ndjson");
    assert_eq!(report["status"], "healthy");
    let node = Node::new();
    let ran = node
        .report(&report)
        .run("prolog", &[("SLURM_JOB_GPUS", "1,3")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None, "a healthy node is not drained");
    assert_eq!(ran.gpudiag_args.len(), 1);
    assert!(ran.stderr.contains("healthy"), "{}", ran.stderr);
}

#[test]
fn prolog_maps_slurm_gpu_numbers_to_the_uuids_of_those_device_files() {
    let node = Node::new();
    // /proc/driver/nvidia/gpus as the driver writes it: NVML index (PCI order) and device minor
    // differ, so minor 1 is the GPU at 3b:00 and minor 3 the one at 19:00.
    for (bus, uuid, minor) in [
        ("0000:19:00.0", "GPU-aaaa", 3),
        ("0000:3b:00.0", "GPU-bbbb", 1),
        ("0000:5d:00.0", "GPU-cccc", 0),
    ] {
        let dir = node.path(&format!("proc-gpus/{bus}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("information"),
            format!(
                "Model: \t\t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n\
                 Device Minor: \t {minor}\nGPU Excluded:\t No\n"
            ),
        )
        .unwrap();
    }
    node.report(&report_of("healthy.ndjson"));
    let ran = node.run("prolog", &[("SLURM_JOB_GPUS", "1,3")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.gpudiag_args.last().unwrap(),
        "check --json --probes quick --fail-on fail --device GPU-bbbb --device GPU-aaaa"
    );
    // GPUDIAG_GPU_IDS=index takes the numbers as NVML indices; CUDA_VISIBLE_DEVICES is read when
    // SLURM_JOB_GPUS is absent, and UUIDs in it pass through.
    let ran = node.run(
        "prolog",
        &[
            ("GPUDIAG_GPU_IDS", "index"),
            ("CUDA_VISIBLE_DEVICES", "2, GPU-dddd"),
        ],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.gpudiag_args.last().unwrap(),
        "check --json --probes quick --fail-on fail --device 2 --device GPU-dddd"
    );
}

#[test]
fn prolog_policy_for_could_not_run_and_not_judged() {
    let node = Node::new();
    let gpus = ("SLURM_JOB_GPUS", "0");
    // Default: could_not_run drains (the driver is broken), with the reason gpudiag gave.
    let ran = node
        .report(&report_with_status("could_not_run"))
        .run("prolog", &[gpus]);
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert_eq!(
        ran.scontrol_args,
        Some(drain_args(
            "gpudiag: could not run: NVML initialisation hung past --init-timeout"
        ))
    );
    std::fs::remove_file(node.path("scontrol.args")).unwrap();
    let ran = node.run("prolog", &[gpus, ("GPUDIAG_ON_COULD_NOT_RUN", "log")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None);
    assert!(ran.stderr.contains("could_not_run"), "{}", ran.stderr);

    // Default: not_judged only logs; a site may drain on it.
    let ran = node
        .report(&report_with_status("not_judged"))
        .run("prolog", &[gpus]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None);
    assert!(ran.stderr.contains("utilisation.low"), "{}", ran.stderr);
    let ran = node.run("prolog", &[gpus, ("GPUDIAG_ON_NOT_JUDGED", "drain")]);
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert_eq!(
        ran.scontrol_args,
        Some(drain_args("gpudiag: GPUs not judged"))
    );
}

#[test]
fn prolog_does_not_drain_on_a_broken_install_or_a_job_without_gpus() {
    let node = Node::new();
    // gpudiag printing nothing (a usage error, a crash): logged, the job runs.
    let ran = node.run("prolog", &[("SLURM_JOB_GPUS", "0"), ("FAKE_RC", "2")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None);
    assert!(ran.stderr.contains("no report (exit 2)"), "{}", ran.stderr);
    // A job without GPUs: gpudiag is not run at all, so no other job's GPU is looked at.
    std::fs::remove_file(node.path("gpudiag.args")).unwrap();
    let ran = node.run("prolog", &[]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.gpudiag_args.is_empty());
    // Bad settings stop with a message and exit 2 before anything runs.
    for (var, value, says) in [
        (
            "GPUDIAG_ON_NOT_JUDGED",
            "maybe",
            "GPUDIAG_ON_NOT_JUDGED must be",
        ),
        ("GPUDIAG_PROBES", "long", "GPUDIAG_PROBES must be"),
        ("GPUDIAG_GPU_IDS", "pci", "GPUDIAG_GPU_IDS must be"),
        ("SLURM_JOB_GPUS", "1;rm", "is neither a number nor a UUID"),
    ] {
        let ran = node.run("prolog", &[("SLURM_JOB_GPUS", "0"), (var, value)]);
        assert_eq!(ran.code, 2, "{var}={value}: {}", ran.stderr);
        assert!(ran.stderr.contains(says), "{var}={value}: {}", ran.stderr);
        assert!(ran.gpudiag_args.is_empty(), "{var}={value} ran gpudiag");
    }
}

#[test]
fn epilog_writes_the_job_summary() {
    let report = report_of("ecc_error.ndjson");
    let node = Node::new();
    let ran = node.report(&report).run(
        "epilog",
        &[
            ("SLURM_JOB_GPUS", "0"),
            ("SLURM_JOB_USER", "alice"),
            ("SLURM_JOB_START_TIME", "1767225600"),
        ],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None, "the epilog never drains");
    assert_eq!(ran.gpudiag_args, ["check --json --window 1s --device 0"]);
    let journal = std::fs::read_to_string(node.path("journalctl.args")).unwrap();
    assert!(journal.contains("--since @1767225600"), "{journal}");

    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(node.path("summaries/job-42.json")).unwrap())
            .unwrap();
    assert_eq!(summary["job_id"], "42");
    assert_eq!(summary["user"], "alice");
    assert_eq!(summary["node"], "node07");
    assert_eq!(summary["check"]["status"], "fail");
    let ids: Vec<&str> = summary["check"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"errors.ecc_uncorrectable"), "{ids:?}");
    // Only the XID of the job's GPU (19:00), not the other bus's nor the non-XID line.
    let xids = summary["kernel_xids"]["xids"].as_array().unwrap();
    assert_eq!(xids.len(), 1, "{xids:?}");
    assert_eq!(xids[0]["xid"], 48);
    assert_eq!(summary["kernel_xids"]["source"], "journalctl");
    // The recording's process still holds the GPU: left behind.
    let left = summary["leftover_processes"].as_array().unwrap();
    let want = &report["devices"][0]["latest"]["processes"][0];
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["pid"], want["pid"]);
    assert_eq!(left[0]["name"], want["name"]);
    // The full report sits beside the summary.
    let full: Value = serde_json::from_str(
        &std::fs::read_to_string(node.path("summaries/job-42.check.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(full, report);
}

#[test]
fn epilog_start_time_comes_from_the_prolog_when_slurm_gives_none() {
    let node = Node::new();
    node.report(&report_of("healthy.ndjson"));
    let gpus = ("SLURM_JOB_GPUS", "0");
    assert_eq!(node.run("prolog", &[gpus]).code, 0);
    let noted = std::fs::read_to_string(node.path("state/job-42.start")).unwrap();
    let ran = node.run("epilog", &[gpus]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let journal = std::fs::read_to_string(node.path("journalctl.args")).unwrap();
    assert!(
        journal.contains(&format!("--since @{}", noted.trim())),
        "{journal}"
    );
    assert!(
        !node.path("state/job-42.start").exists(),
        "the note is removed"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(node.path("summaries/job-42.json")).unwrap())
            .unwrap();
    assert_eq!(summary["check"]["status"], "healthy");
    // A job id that is not one stops before a path is made of it.
    let ran = node.run("epilog", &[gpus, ("SLURM_JOB_ID", "../x")]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("is not a job id"), "{}", ran.stderr);
}

#[test]
fn systemd_unit_verifies_with_the_binary_where_exec_start_points() {
    let unit = std::fs::read_to_string(at("assets/deploy/systemd/gpudiag-serve.service")).unwrap();
    let shipped = "ExecStart=/usr/local/bin/gpudiag serve $GPUDIAG_SERVE_ARGS";
    assert!(
        unit.contains(shipped),
        "ExecStart changed: update this test"
    );
    for line in [
        "Restart=on-failure",
        "DynamicUser=yes",
        "ProtectSystem=strict",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} missing");
    }
    // No PrivateDevices: NVML must open /dev/nvidia*.
    assert!(!unit.contains("PrivateDevices=yes"));
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    // The unit as shipped, with only the binary's path swapped for the one just built, since
    // verify checks that ExecStart's program exists and is executable.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("gpudiag-serve.service");
    let built = env!("CARGO_BIN_EXE_gpudiag");
    std::fs::write(
        &copy,
        unit.replace(
            shipped,
            &format!("ExecStart={built} serve $GPUDIAG_SERVE_ARGS"),
        ),
    )
    .unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    // verify exits 0 on an unknown or misspelt key, only warning about it: no warning at all.
    assert!(
        !stderr.contains("gpudiag-serve.service"),
        "systemd-analyze verify warned: {stderr}"
    );
    // The same check does fail on a broken unit, so its silence above means something.
    std::fs::write(
        &copy,
        unit.replace(shipped, "ExecStart=/nonexistent/gpudiag serve"),
    )
    .unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(!out.status.success(), "verify accepted a missing binary");
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    c.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

/// A Prometheus killed on drop.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Loads a shipped scrape config into a real Prometheus (and promtool) and returns the
/// targets it discovered for the `gpudiag` job: (address, labels).
fn prometheus_targets(config: &str) -> Option<Vec<(String, Value)>> {
    let promtool = tool("promtool")?;
    let prometheus = tool("prometheus")?;
    // A copy keeps the file layout (targets/ beside the config) and gets a scratch TSDB.
    let dir = tempfile::tempdir().unwrap();
    let src = at("assets/deploy/prometheus");
    std::fs::copy(src.join(config), dir.path().join(config)).unwrap();
    std::fs::create_dir(dir.path().join("targets")).unwrap();
    for entry in std::fs::read_dir(src.join("targets")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dir.path().join("targets").join(entry.file_name()),
        )
        .unwrap();
    }
    let cfg = dir.path().join(config);
    let out = Command::new(&promtool)
        .args(["check", "config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check config {config}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _prom = Killed(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let targets = http_get(&addr, "/api/v1/targets")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .and_then(|v| v["data"]["activeTargets"].as_array().cloned())
            .unwrap_or_default();
        let found: Vec<(String, Value)> = targets
            .iter()
            .filter(|t| t["labels"]["job"] == "gpudiag")
            .map(|t| {
                (
                    t["labels"]["instance"].as_str().unwrap().to_owned(),
                    t["labels"].clone(),
                )
            })
            .collect();
        if !found.is_empty() {
            let cfg = http_get(&addr, "/api/v1/status/config").unwrap();
            assert!(cfg.contains("honor_labels: true"), "{cfg}");
            return Some(found);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Prometheus did not load {config} in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn prometheus_loads_the_static_scrape_config() {
    let Some(found) = prometheus_targets("prometheus-static.yml") else {
        return;
    };
    let mut instances: Vec<&str> = found.iter().map(|(i, _)| i.as_str()).collect();
    instances.sort_unstable();
    assert_eq!(instances, ["gpu-node-01:9835", "gpu-node-02:9835"]);
    assert!(found.iter().all(|(_, l)| l["cluster"] == "example"));
}

#[test]
fn prometheus_loads_the_file_sd_scrape_config_and_its_targets_file() {
    let Some(found) = prometheus_targets("prometheus-file-sd.yml") else {
        return;
    };
    let mut instances: Vec<&str> = found.iter().map(|(i, _)| i.as_str()).collect();
    instances.sort_unstable();
    assert_eq!(instances, ["gpu-node-01:9835", "gpu-node-02:9835"]);
    assert!(found.iter().all(|(_, l)| l["partition"] == "gpu"));
}
