//! The deployment files under assets/deploy/, run or loaded as shipped: the Slurm prolog and
//! epilog against a fake `gpudiag` (printing reports the real binary made from the recordings)
//! and a fake `scontrol` that records its arguments; the systemd unit through
//! `systemd-analyze verify`; the Prometheus scrape configs through `promtool check config` and
//! a real Prometheus that loads them; the Kubernetes manifests through `kubernetes-validate
//! --strict` (offline, from the venv `.ci/run` makes), parsed for what the pod must have, and
//! their arguments run by the real `gpudiag serve`; the Containerfile parsed against the
//! repository. The tests that need a tool (systemd-analyze, promtool, prometheus,
//! kubernetes-validate) are `#[ignore]`d with its name, and fail where it is missing when run on
//! purpose (`--run-ignored only`, as CI does).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{at, required_file, tool};

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

/// The fake gpudiag's first line: `gpudiag slurm ...` (what the scripts read besides the check)
/// is the real binary's, not recorded with the check's arguments.
const REAL_SLURM: &str = "case \"$1\" in slurm) exec \"$REAL_GPUDIAG\" \"$@\" ;; esac\n";

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
        let gpudiag = format!(
            "{REAL_SLURM}echo \"$*\" >>\"$FAKE_DIR/gpudiag.args\"\n\
             cat \"$FAKE_DIR/report.json\" 2>/dev/null\nexit \"${{FAKE_RC:-0}}\"\n"
        );
        let fakes = [
            ("gpudiag", gpudiag.as_str()),
            (
                "scontrol",
                "for a in \"$@\"; do printf '%s\\n' \"$a\"; done >>\"$FAKE_DIR/scontrol.args\"\n",
            ),
            (
                "journalctl",
                "[ -z \"${FAKE_NO_JOURNAL:-}\" ] || exit 1\n\
                 echo \"$*\" >>\"$FAKE_DIR/journalctl.args\"\n\
                 echo '2026-01-01T00:00:01+0000 n kernel: NVRM: Xid (PCI:0000:19:00): 48, pid=51007, DBE'\n\
                 echo '2026-01-01T00:00:02+0000 n kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, off the bus'\n\
                 echo '2026-01-01T00:00:03+0000 n kernel: usb 1-1: new device'\n",
            ),
            // The whole ring buffer, one XID of the job's GPU before the job and one after.
            (
                "dmesg",
                "echo '2025-12-31T23:59:59,000001+00:00 NVRM: Xid (PCI:0000:19:00): 31, before'\n\
                 echo '2026-01-01T00:59:59,000001+01:00 NVRM: Xid (PCI:0000:19:00): 94, before'\n\
                 echo '2026-01-01T00:00:05,000001+00:00 NVRM: Xid (PCI:0000:19:00): 48, DBE'\n",
            ),
            // The scripts need no python3: one that is called says so.
            (
                "python3",
                "echo \"$*\" >>\"$FAKE_DIR/python3.called\"\nexit 1\n",
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

    /// Replaces the fake `gpudiag` with a shell script of this body (after it records its
    /// arguments).
    fn gpudiag(&self, body: &str) -> &Node {
        let path = self.path("bin/gpudiag");
        std::fs::write(
            &path,
            format!("#!/bin/sh\n{REAL_SLURM}echo \"$*\" >>\"$FAKE_DIR/gpudiag.args\"\n{body}"),
        )
        .unwrap();
        self
    }

    /// Replaces the fake `gpudiag` with one whose `check` is the real binary's on `recording`
    /// (without `--probes`, which a recording cannot run): the document and the exit code the
    /// real `check --device ...` gives.
    fn real_check_of(&self, recording: &str) -> &Node {
        let path = self.path("bin/gpudiag");
        std::fs::write(
            &path,
            format!(
                "#!/usr/bin/env bash\n{REAL_SLURM}echo \"$*\" >>\"$FAKE_DIR/gpudiag.args\"\n\
                 args=()\nwhile [ $# -gt 0 ]; do\n  case \"$1\" in --probes) shift 2 ;; \
                 *) args+=(\"$1\"); shift ;; esac\ndone\n\
                 exec \"$REAL_GPUDIAG\" \"${{args[@]}}\" --replay {}\n",
                at(&format!("tests/fixtures/recordings/{recording}")).display()
            ),
        )
        .unwrap();
        self
    }

    /// Writes a fake /proc/driver/nvidia/gpus: (bus, uuid, device minor) each.
    fn driver_lists(&self, gpus: &[(&str, &str, u32)]) -> &Node {
        for (bus, uuid, minor) in gpus {
            let dir = self.path(&format!("proc-gpus/{bus}"));
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
        self
    }

    /// Whether anything ran python3.
    fn python3_called(&self) -> bool {
        self.path("python3.called").exists()
    }

    /// Runs assets/deploy/slurm/<script> with bash, as slurmd would, with `envs` on top of a
    /// job environment (job 42 on node07, no syslog, no /proc/driver/nvidia).
    fn run(&self, script: &str, envs: &[(&str, &str)]) -> Ran {
        self.run_within(script, envs, std::time::Duration::from_secs(120))
            .0
    }

    /// As `run`, failing the test if the script has not ended after `limit` (it is killed);
    /// also says how long it took.
    fn run_within(
        &self,
        script: &str,
        envs: &[(&str, &str)],
        limit: std::time::Duration,
    ) -> (Ran, std::time::Duration) {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        // Output to files, not pipes: a process the script leaves behind may hold them open.
        let stderr_path = self.path(&format!("{script}.stderr"));
        let started = std::time::Instant::now();
        let mut child = Command::new("bash")
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
            .env("REAL_GPUDIAG", env!("CARGO_BIN_EXE_gpudiag"))
            // The scripts' defaults are device minors and a node comment; the tests that need
            // either say so, the others name GPUs by NVML index and leave scontrol to drains.
            .env("GPUDIAG_GPU_IDS", "index")
            .env("GPUDIAG_NODE_COMMENT", "0")
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{script} still running after {limit:?}: {}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let took = started.elapsed();
        let read = |name: &str| {
            std::fs::read_to_string(self.path(name))
                .ok()
                .map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
        };
        let ran = Ran {
            code: status.code().unwrap_or(-1),
            stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
            gpudiag_args: read("gpudiag.args").unwrap_or_default(),
            scontrol_args: read("scontrol.args"),
        };
        (ran, took)
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
    node.driver_lists(&[
        ("0000:19:00.0", "GPU-aaaa", 3),
        ("0000:3b:00.0", "GPU-bbbb", 1),
        ("0000:5d:00.0", "GPU-cccc", 0),
    ]);
    node.report(&report_of("healthy.ndjson"));
    let minors = ("GPUDIAG_GPU_IDS", "minor");
    let ran = node.run("prolog", &[minors, ("SLURM_JOB_GPUS", "1,3")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.gpudiag_args.last().unwrap(),
        "check --json --probes quick --fail-on fail --device GPU-bbbb --device GPU-aaaa"
    );
    // A range is read as its numbers.
    let ran = node.run("prolog", &[minors, ("SLURM_JOB_GPUS", "0-1")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.gpudiag_args.last().unwrap(),
        "check --json --probes quick --fail-on fail --device GPU-cccc --device GPU-bbbb"
    );
    // GPUDIAG_GPU_IDS=index takes the numbers as NVML indices; CUDA_VISIBLE_DEVICES is read when
    // SLURM_JOB_GPUS is absent, and UUIDs the driver lists pass through.
    let ran = node.run("prolog", &[("CUDA_VISIBLE_DEVICES", "2, GPU-cccc")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.gpudiag_args.last().unwrap(),
        "check --json --probes quick --fail-on fail --device 2 --device GPU-cccc"
    );
    assert!(!node.python3_called());
}

/// A node whose driver lists the two GPUs of tests/fixtures/recordings/two_gpus.ndjson (minors
/// 0 and 1) and a third at minor 2 that the recording, NVML's view, lacks: fallen off the bus.
fn node_with_a_lost_gpu() -> Node {
    let node = Node::new();
    node.real_check_of("two_gpus.ndjson").driver_lists(&[
        (
            "0000:19:00.0",
            "GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11",
            0,
        ),
        (
            "0000:3b:00.0",
            "GPU-8c41d0e5-2f7a-4b93-86de-15ab3c9e7f42",
            1,
        ),
        (
            "0000:5d:00.0",
            "GPU-0dead000-0000-4000-8000-00000000beef",
            2,
        ),
    ]);
    node
}

#[test]
fn prolog_drains_when_a_job_gpu_the_driver_lists_is_lost_to_nvml() {
    let node = node_with_a_lost_gpu();
    let ran = node.run(
        "prolog",
        &[("GPUDIAG_GPU_IDS", "minor"), ("SLURM_JOB_GPUS", "0,2")],
    );
    assert_eq!(ran.code, 1, "a lost job GPU drains: {}", ran.stderr);
    assert_eq!(
        ran.scontrol_args,
        Some(drain_args(
            "gpudiag: GPU 2 (GPU-0dead000-0000-4000-8000-00000000beef, 0000:5d:00) listed by \
             the driver, not by NVML"
        )),
        "{}",
        ran.stderr
    );
    // The real check was asked for both GPUs by UUID, and named the one it could not find.
    assert_eq!(
        ran.gpudiag_args,
        ["check --json --probes quick --fail-on fail \
          --device GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11 \
          --device GPU-0dead000-0000-4000-8000-00000000beef"]
    );
    assert!(ran.stderr.contains("gpu_lost"), "{}", ran.stderr);
    assert!(!node.python3_called());
}

#[test]
fn check_with_a_device_that_matches_nothing_prints_its_document_and_exits_3() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["check", "--json", "--device", "0", "--device", "GPU-gone"])
        .arg("--replay")
        .arg(at("tests/fixtures/recordings/two_gpus.ndjson"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON document");
    assert_eq!(report["status"], "could_not_run");
    assert_eq!(report["exit_code"], 3);
    assert_eq!(report["devices_not_found"], serde_json::json!(["GPU-gone"]));
    let why = report["could_not_run"].as_str().unwrap();
    assert!(why.contains("no GPU matches --device 'GPU-gone'"), "{why}");
}

#[test]
fn prolog_logs_a_job_gpu_nobody_knows_or_one_it_cannot_place_and_never_drains_for_it() {
    let node = node_with_a_lost_gpu();
    // A UUID the driver does not list: the job's GPUs and the node's disagree (gres, or an id
    // mapping): a configuration error, logged and made loud, and no check of another GPU.
    let ran = node.run(
        "prolog",
        &[(
            "CUDA_VISIBLE_DEVICES",
            "GPU-0000aaaa-0000-4000-8000-000000000001",
        )],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None, "{}", ran.stderr);
    assert!(ran.gpudiag_args.is_empty(), "{:?}", ran.gpudiag_args);
    assert!(
        ran.stderr.contains("config_error") && ran.stderr.contains("is no GPU the driver lists"),
        "{}",
        ran.stderr
    );
    let fault = std::fs::read_to_string(node.path("state/gpudiag-prolog.fault")).unwrap();
    assert!(fault.contains("is no GPU the driver lists"), "{fault}");
    // A device minor the driver does not list: the same.
    let ran = node.run(
        "prolog",
        &[("GPUDIAG_GPU_IDS", "minor"), ("SLURM_JOB_GPUS", "7")],
    );
    assert_eq!((ran.code, &ran.scontrol_args), (0, &None), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("is a device minor the driver does not list (it lists 0, 1, 2)"),
        "{}",
        ran.stderr
    );
    // No /proc/driver/nvidia (a container): a device minor cannot be placed, and is not taken
    // as an NVML index, which could be another job's GPU: nothing is checked, logged.
    let no_proc = ("GPUDIAG_PROC_GPUS", "/nonexistent/gpus");
    let ran = node.run(
        "prolog",
        &[
            no_proc,
            ("GPUDIAG_GPU_IDS", "minor"),
            ("SLURM_JOB_GPUS", "2"),
        ],
    );
    assert_eq!((ran.code, &ran.scontrol_args), (0, &None), "{}", ran.stderr);
    assert!(ran.gpudiag_args.is_empty(), "{:?}", ran.gpudiag_args);
    assert!(ran.stderr.contains("cannot_tell"), "{}", ran.stderr);
    // ... and a UUID NVML does not enumerate, with no listing to say whether the driver has it:
    // lost or never there cannot be told, so it is logged, not drained.
    let ran = node.run(
        "prolog",
        &[
            no_proc,
            ("SLURM_JOB_GPUS", "GPU-0dead000-0000-4000-8000-00000000beef"),
        ],
    );
    assert_eq!((ran.code, &ran.scontrol_args), (0, &None), "{}", ran.stderr);
    assert_eq!(ran.gpudiag_args.len(), 1, "checked: {}", ran.stderr);
    assert!(ran.stderr.contains("cannot_tell"), "{}", ran.stderr);
}

#[test]
fn a_broken_install_is_loud_in_the_log_a_state_file_and_the_node_comment_and_never_drains() {
    let node = Node::new();
    let fault_file = node.path("state/gpudiag-prolog.fault");
    let comment = ("GPUDIAG_NODE_COMMENT", "1");
    // gpudiag not on PATH.
    let missing = ("GPUDIAG_BIN", "gpudiag-not-installed");
    let ran = node.run("prolog", &[comment, missing, ("SLURM_JOB_GPUS", "0")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("gpudiag-not-installed not found"),
        "{}",
        ran.stderr
    );
    let args = ran.scontrol_args.expect("the node's comment is set");
    assert!(!args.iter().any(|a| a.starts_with("state=")), "{args:?}");
    assert!(
        args.iter()
            .any(|a| a.starts_with("comment=gpudiag-prolog: ")
                && a.contains("gpudiag-not-installed not found")),
        "{args:?}"
    );
    assert!(
        std::fs::read_to_string(&fault_file)
            .unwrap()
            .contains("not found")
    );
    // The same fault at the next job: the comment is not set again.
    std::fs::remove_file(node.path("scontrol.args")).unwrap();
    let ran = node.run("prolog", &[comment, missing, ("SLURM_JOB_GPUS", "0")]);
    assert_eq!((ran.code, &ran.scontrol_args), (0, &None), "{}", ran.stderr);
    // Fixed: the first run without a fault clears the file and the comment.
    node.report(&report_of("healthy.ndjson"));
    let ran = node.run("prolog", &[comment, ("SLURM_JOB_GPUS", "0")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.scontrol_args,
        Some(vec![
            "update".into(),
            "nodename=node07".into(),
            "comment=".into()
        ])
    );
    assert!(!fault_file.exists());
    // The epilog: a job id that is not one, and gpudiag missing, are its faults; exit 0.
    std::fs::remove_file(node.path("scontrol.args")).unwrap();
    for envs in [
        vec![("SLURM_JOB_ID", "../x"), ("SLURM_JOB_GPUS", "0")],
        vec![missing, ("SLURM_JOB_GPUS", "0")],
    ] {
        let ran = node.run("epilog", &envs);
        assert_eq!(
            (ran.code, &ran.scontrol_args),
            (0, &None),
            "{envs:?}: {}",
            ran.stderr
        );
        assert!(node.path("state/gpudiag-epilog.fault").exists(), "{envs:?}");
    }
    assert!(!node.python3_called());
}

#[test]
fn check_config_finds_the_slips_and_says_what_the_prolog_would_do_changing_nothing() {
    let node = node_with_a_lost_gpu();
    let ran = |envs: &[(&str, &str)]| {
        let out = Command::new("bash")
            .arg(at("assets/deploy/slurm/prolog"))
            .arg("--check-config")
            .env_clear()
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    node.path("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("FAKE_DIR", node.path(""))
            .env("REAL_GPUDIAG", env!("CARGO_BIN_EXE_gpudiag"))
            .env("GPUDIAG_SLURM_CONF", node.path("no-such.conf"))
            .env("GPUDIAG_PROC_GPUS", node.path("proc-gpus"))
            .env("GPUDIAG_STATE_DIR", node.path("state"))
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // Without a job, every GPU the driver lists stands in: the lost one makes it a drain.
    let (code, out) = ran(&[("GPUDIAG_ON_WARN", "Log")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: configuration: GPUDIAG_ON_WARN='Log' is not one of: drain log"),
        "{out}"
    );
    assert!(out.contains("the driver lists 3 GPU(s)"), "{out}");
    assert!(out.contains("the prolog would: drain (gpu_lost)"), "{out}");
    // The GPUs NVML has, and no slip: exit 0.
    let (code, out) = ran(&[("SLURM_JOB_GPUS", "0,1")]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("problem:"), "{out}");
    assert!(out.contains("the prolog would: "), "{out}");
    // Nothing was changed: no drain, no comment, no state.
    assert!(!node.path("scontrol.args").exists());
    assert!(!node.path("state").exists());
    // The epilog's: its settings and tools.
    let out = Command::new("bash")
        .arg(at("assets/deploy/slurm/epilog"))
        .arg("--check-config")
        .env("GPUDIAG_SLURM_CONF", node.path("no-such.conf"))
        .env("GPUDIAG_BIN", "gpudiag-not-installed")
        .env("GPUDIAG_SYSLOG", "0")
        .env("GPUDIAG_STATE_DIR", node.path("state"))
        .env("GPUDIAG_SUMMARY_DIR", node.path("summaries"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("problem: GPUDIAG_BIN=gpudiag-not-installed is not on PATH"),
        "{text}"
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
    // A typo'd setting falls back to its documented default, said in the log: the check runs
    // as it would without the setting, and nothing is drained for it.
    for (var, value, runs) in [
        (
            "GPUDIAG_ON_NOT_JUDGED",
            "maybe",
            "check --json --probes quick --fail-on fail --device 0",
        ),
        (
            "GPUDIAG_ON_TOOL_ERROR",
            "Drain",
            "check --json --probes quick --fail-on fail --device 0",
        ),
        (
            "GPUDIAG_PROBES",
            "long",
            "check --json --probes quick --fail-on fail --device 0",
        ),
        (
            "GPUDIAG_ON_HUNG",
            "Drain",
            "check --json --probes quick --fail-on fail --device 0",
        ),
    ] {
        let _ = std::fs::remove_file(node.path("gpudiag.args"));
        let ran = node.run(
            "prolog",
            &[("SLURM_JOB_GPUS", "0"), ("FAKE_RC", "2"), (var, value)],
        );
        assert_eq!(ran.code, 0, "{var}={value}: {}", ran.stderr);
        assert_eq!(ran.scontrol_args, None, "{var}={value}: {}", ran.stderr);
        assert!(
            ran.stderr
                .contains(&format!("configuration: {var}='{value}' is not one of")),
            "{var}={value}: {}",
            ran.stderr
        );
        assert_eq!(ran.gpudiag_args, [runs], "{var}={value}");
    }
    // GPUDIAG_GPU_IDS falls back to `minor`, which without the driver's /proc files cannot
    // be placed: nothing is checked, logged.
    let _ = std::fs::remove_file(node.path("gpudiag.args"));
    let ran = node.run(
        "prolog",
        &[("SLURM_JOB_GPUS", "0"), ("GPUDIAG_GPU_IDS", "pci")],
    );
    assert_eq!((ran.code, &ran.scontrol_args), (0, &None), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(
            "configuration: GPUDIAG_GPU_IDS='pci' is not one of: minor index; using minor"
        ),
        "{}",
        ran.stderr
    );
    assert!(ran.gpudiag_args.is_empty());
    // A job GPU list that does not parse: a configuration error, logged, never a drain, and
    // nothing run with it.
    for list in ["1;rm", "-1", "GPU-zz", "0-99999"] {
        let _ = std::fs::remove_file(node.path("gpudiag.args"));
        let ran = node.run("prolog", &[("SLURM_JOB_GPUS", list)]);
        assert_eq!(ran.code, 0, "{list}: {}", ran.stderr);
        assert_eq!(ran.scontrol_args, None, "{list}");
        assert!(
            ran.stderr.contains("config_error") && ran.stderr.contains("in SLURM_JOB_GPUS="),
            "{list}: {}",
            ran.stderr
        );
        assert!(ran.gpudiag_args.is_empty(), "{list} ran gpudiag");
    }
    assert!(!node.python3_called());
}

/// A gpudiag that sleeps forever ignoring SIGTERM (inherited by its child), as one blocked in a
/// call it does not abandon would.
const IGNORES_SIGTERM: &str = "trap '' TERM\nsleep 1000\n";
/// A gpudiag that sleeps forever but ends on SIGTERM.
const NEVER_RETURNS: &str = "sleep 1000\n";
/// A gpudiag stuck in a driver call: the (fake) /proc says it is in uninterruptible sleep, and
/// it does not end on SIGTERM. (Only SIGKILL ends this one; a real one in state D outlives
/// SIGKILL too, and the script leaves it behind.)
const STUCK_IN_THE_DRIVER: &str = "mkdir -p \"$FAKE_DIR/proc/$$\"\n\
    echo \"$$ (gpu diag) D 1 1 1\" >\"$FAKE_DIR/proc/$$/stat\"\n\
    trap '' TERM\nsleep 1000\n";

/// GPUDIAG_TIMEOUT=1, GPUDIAG_KILL_GRACE=1: the script must be done in 1 + 2 x 1 seconds and
/// what its commands take; 20 s leaves room for a loaded machine.
const SHORT_DEADLINE: [(&str, &str); 2] = [("GPUDIAG_TIMEOUT", "1"), ("GPUDIAG_KILL_GRACE", "1")];
const DEADLINE_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

#[test]
fn prolog_stops_a_gpudiag_past_its_deadline_and_only_logs_it() {
    for (what, fake) in [
        ("ignores SIGTERM", IGNORES_SIGTERM),
        ("never returns", NEVER_RETURNS),
    ] {
        let node = Node::new();
        node.gpudiag(fake);
        let mut envs = vec![("SLURM_JOB_GPUS", "0")];
        envs.extend(SHORT_DEADLINE);
        let (ran, took) = node.run_within("prolog", &envs, DEADLINE_LIMIT);
        // Killable means it was not stuck in the driver: gpudiag's fault, a tool error.
        assert_eq!(ran.code, 0, "{what}: {}", ran.stderr);
        assert_eq!(ran.scontrol_args, None, "{what}");
        assert!(
            ran.stderr.contains("timed_out") && ran.stderr.contains("did not finish in 1s"),
            "{what}: {}",
            ran.stderr
        );
        assert!(
            took >= std::time::Duration::from_secs(1),
            "{what}: stopped before its deadline ({took:?})"
        );
        let ran = node.run_within(
            "prolog",
            &[envs.as_slice(), &[("GPUDIAG_ON_TOOL_ERROR", "drain")]].concat(),
            DEADLINE_LIMIT,
        );
        assert_eq!(
            ran.0.scontrol_args,
            Some(drain_args("gpudiag: no report (timed out after 1s)")),
            "{what}: {}",
            ran.0.stderr
        );
    }
}

#[test]
fn prolog_drains_when_gpudiag_hangs_in_the_driver_and_does_not_wait_for_it() {
    let node = Node::new();
    node.gpudiag(STUCK_IN_THE_DRIVER);
    let proc = node.path("proc");
    let proc = proc.to_str().unwrap();
    let mut envs = vec![("SLURM_JOB_GPUS", "0,1"), ("GPUDIAG_PROC", proc)];
    envs.extend(SHORT_DEADLINE);
    let (ran, _) = node.run_within("prolog", &envs, DEADLINE_LIMIT);
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert_eq!(
        ran.scontrol_args,
        Some(drain_args("gpudiag: hung in the driver past 1s (GPUs 0,1)")),
        "{}",
        ran.stderr
    );
    // A site may only log it.
    std::fs::remove_file(node.path("scontrol.args")).unwrap();
    envs.push(("GPUDIAG_ON_HUNG", "log"));
    let (ran, _) = node.run_within("prolog", &envs, DEADLINE_LIMIT);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None);
    assert!(ran.stderr.contains("hung"), "{}", ran.stderr);
    // The epilog says so in the summary, and does not drain either.
    let (ran, _) = node.run_within("epilog", &envs, DEADLINE_LIMIT);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.scontrol_args, None);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(node.path("summaries/job-42.json")).unwrap())
            .unwrap();
    assert_eq!(summary["check"], Value::Null);
    assert_eq!(
        summary["check_error"],
        "gpudiag hung in the driver past 1s and was left behind"
    );
}

#[test]
fn a_timeout_that_is_not_a_number_of_seconds_falls_back_to_the_default_and_says_so() {
    let node = Node::new();
    node.report(&report_of("healthy.ndjson"));
    let ran = node.run(
        "prolog",
        &[("SLURM_JOB_GPUS", "0"), ("GPUDIAG_TIMEOUT", "5m")],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("GPUDIAG_TIMEOUT='5m' is not a number of seconds: using 300"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("healthy"), "{}", ran.stderr);
}

#[test]
fn epilog_attributes_only_the_jobs_xids_when_gpudiag_gives_no_report() {
    // The fake journal has XID 48 on 19:00 and XID 79 on 3b:00; the job has GPU minor 3.
    let node = Node::new();
    let envs = [
        ("SLURM_JOB_GPUS", "3"),
        ("SLURM_JOB_START_TIME", "1767225600"),
        ("FAKE_RC", "2"),
    ];
    let minors = ("GPUDIAG_GPU_IDS", "minor");
    let summary = |node: &Node| -> Value {
        serde_json::from_str(&std::fs::read_to_string(node.path("summaries/job-42.json")).unwrap())
            .unwrap()
    };
    // No report, and GPUs numbered by NVML index, which the driver's files do not name: which
    // bus is the job's is unknown, so no XID is the job's; the node's are listed apart with the
    // reason.
    let ran = node.run("epilog", &envs);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let s = summary(&node);
    assert_eq!(s["check"], Value::Null);
    assert_eq!(s["kernel_xids"]["xids"], Value::Null, "{s}");
    let apart = &s["kernel_xids"]["not_attributed"];
    assert!(
        apart["reason"]
            .as_str()
            .unwrap()
            .contains("job GPU(s) 3 not mapped to a PCI bus"),
        "{apart}"
    );
    let xid_numbers = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x["xid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(xid_numbers(&apart["xids"]), [48, 79]);

    // The driver's /proc files say minor 3 is the GPU at 19:00: its XID only.
    node.driver_lists(&[("0000:19:00.0", "GPU-aaaa", 3)]);
    let ran = node.run("epilog", &[envs[0], envs[1], envs[2], minors]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let s = summary(&node);
    assert_eq!(xid_numbers(&s["kernel_xids"]["xids"]), [48], "{s}");
    assert_eq!(s["kernel_xids"]["not_attributed"], Value::Null);

    // A second job GPU the driver does not list: the job's GPUs are not known (a configuration
    // error, logged), nothing is checked, and no XID is the job's.
    let ran = node.run(
        "epilog",
        &[("SLURM_JOB_GPUS", "3,1"), envs[1], envs[2], minors],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let s = summary(&node);
    assert_eq!(s["kernel_xids"]["xids"], Value::Null, "{s}");
    assert_eq!(
        xid_numbers(&s["kernel_xids"]["not_attributed"]["xids"]),
        [48, 79]
    );
    assert!(
        s["check_error"]
            .as_str()
            .unwrap()
            .starts_with("not checked: "),
        "{s}"
    );
    assert!(!node.python3_called());
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
fn epilog_reads_dmesg_where_journald_cannot_and_keeps_only_what_came_after_the_job_began() {
    let node = Node::new();
    let ran = node.report(&report_of("ecc_error.ndjson")).run(
        "epilog",
        &[
            ("SLURM_JOB_GPUS", "0"),
            ("SLURM_JOB_START_TIME", "1767225600"),
            ("FAKE_NO_JOURNAL", "1"),
        ],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(node.path("summaries/job-42.json")).unwrap())
            .unwrap();
    assert_eq!(summary["kernel_xids"]["source"], "dmesg");
    // 31 and 94 (00:59:59 at +01:00 is 23:59:59 UTC the day before) came before the job.
    let xids: Vec<u64> = summary["kernel_xids"]["xids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["xid"].as_u64().unwrap())
        .collect();
    assert_eq!(xids, [48], "{summary}");
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
    // A job id that is not one stops before a path is made of it, and fails nothing.
    let ran = node.run("epilog", &[gpus, ("SLURM_JOB_ID", "../x")]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stderr.contains("is not a job id"), "{}", ran.stderr);
}

const SYSTEMD_UNIT: &str = "assets/deploy/systemd/gpudiag-serve.service";
const SHIPPED_EXEC_START: &str = "ExecStart=/usr/local/bin/gpudiag serve $GPUDIAG_SERVE_ARGS";

#[test]
fn systemd_unit_restarts_runs_unprivileged_and_reaches_the_gpus() {
    let unit = std::fs::read_to_string(at(SYSTEMD_UNIT)).unwrap();
    assert!(
        unit.contains(SHIPPED_EXEC_START),
        "ExecStart changed: update these tests"
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
}

#[test]
#[ignore = "needs systemd-analyze (apt-get install systemd); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn systemd_unit_verifies_with_the_binary_where_exec_start_points() {
    let unit = std::fs::read_to_string(at(SYSTEMD_UNIT)).unwrap();
    let shipped = SHIPPED_EXEC_START;
    let analyze = tool("systemd-analyze");
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
fn prometheus_targets(config: &str) -> Vec<(String, Value)> {
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
    targets_in_prometheus(&dir.path().join(config))
}

/// `promtool check config` of a scrape config, then a real Prometheus that loads it (its TSDB
/// beside the file): the targets it keeps for the `gpudiag` job, (address, labels).
fn targets_in_prometheus(cfg: &Path) -> Vec<(String, Value)> {
    let promtool = tool("promtool");
    let prometheus = tool("prometheus");
    let dir = cfg.parent().unwrap();
    let config = cfg.display();
    let out = Command::new(&promtool)
        .args(["check", "config"])
        .arg(cfg)
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
                dir.join("tsdb").display()
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
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Prometheus did not load {config} in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs promtool and prometheus (apt-get install prometheus); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn prometheus_loads_the_static_scrape_config() {
    let found = prometheus_targets("prometheus-static.yml");
    let mut instances: Vec<&str> = found.iter().map(|(i, _)| i.as_str()).collect();
    instances.sort_unstable();
    assert_eq!(instances, ["gpu-node-01:9835", "gpu-node-02:9835"]);
    assert!(found.iter().all(|(_, l)| l["cluster"] == "example"));
}

#[test]
#[ignore = "needs promtool and prometheus (apt-get install prometheus); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn prometheus_loads_the_file_sd_scrape_config_and_its_targets_file() {
    let found = prometheus_targets("prometheus-file-sd.yml");
    let mut instances: Vec<&str> = found.iter().map(|(i, _)| i.as_str()).collect();
    instances.sort_unstable();
    assert_eq!(instances, ["gpu-node-01:9835", "gpu-node-02:9835"]);
    assert!(found.iter().all(|(_, l)| l["partition"] == "gpu"));
}

// Kubernetes: assets/deploy/kubernetes/

/// Every document of a YAML file (`---`-separated), as JSON values; empty ones left out.
fn yaml_docs(rel: &str) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(at(rel)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

const MANIFEST: &str = "assets/deploy/kubernetes/gpudiag.yaml";
const SERVICE_MONITOR: &str = "assets/deploy/kubernetes/servicemonitor.yaml";
const CONTAINERFILE: &str = "assets/deploy/kubernetes/Containerfile";

/// The object of `kind` in gpudiag.yaml; exactly one of each kind is shipped.
fn object(kind: &str) -> Value {
    let docs: Vec<Value> = yaml_docs(MANIFEST)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(docs.len(), 1, "one {kind} in {MANIFEST}");
    docs.into_iter().next().unwrap()
}

/// The DaemonSet's pod spec and its `gpudiag` container.
fn pod_and_container() -> (Value, Value) {
    let pod = object("DaemonSet")["spec"]["template"]["spec"].clone();
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container: gpudiag");
    let container = containers[0].clone();
    assert_eq!(container["name"], "gpudiag");
    (pod, container)
}

/// The container's arguments: what the image's entrypoint, the binary, is run with.
fn serve_args(container: &Value) -> Vec<String> {
    assert!(
        container.get("command").is_none(),
        "no command: the image's ENTRYPOINT (the binary) runs, as the Containerfile test checks"
    );
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The value of `--flag VALUE` or `--flag=VALUE` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix(&format!("{flag}=")).map(str::to_owned)
        }
    })
}

/// The container's env as (name, value) pairs.
fn env_of(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .map(|e| {
                    let name = e["name"].as_str().unwrap().to_owned();
                    (name, e["value"].as_str().unwrap_or_default().to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// kubernetes-validate from the venv `.ci/run` makes (or GPUDIAG_KUBERNETES_VALIDATE); `None`
/// with a message where there is none, a failure where CI requires the deploy tools.
fn kubernetes_validate() -> PathBuf {
    let path = std::env::var_os("GPUDIAG_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| at("target/k8s-venv/bin/kubernetes-validate"));
    required_file(
        path,
        "`.ci/run` makes target/k8s-venv from tests/deploy/requirements.txt, or set \
         GPUDIAG_KUBERNETES_VALIDATE",
    )
}

/// The oldest and the newest Kubernetes the manifests are validated against; the newest is the
/// newest the pinned kubernetes-validate bundles.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

/// kubernetes-validate --strict on a file, against each of KUBERNETES_VERSIONS: (exit code,
/// output).
fn validate_manifest(validate: &Path, file: &Path) -> (i32, String) {
    let mut cmd = Command::new(validate);
    cmd.arg("--strict");
    for v in KUBERNETES_VERSIONS {
        cmd.args(["--kubernetes-version", v]);
    }
    let out = cmd.arg(file).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
#[ignore = "needs kubernetes-validate from the venv .ci/run makes (target/k8s-venv); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn kubernetes_manifests_validate_strictly_against_the_api_schemas() {
    let validate = kubernetes_validate();
    let (code, out) = validate_manifest(&validate, &at(MANIFEST));
    assert_eq!(code, 0, "{out}");
    // A kind or apiVersion it has no schema for is only a warning with exit 0: every object
    // must have been checked, against both versions.
    let objects: Vec<String> = yaml_docs(MANIFEST)
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap().to_lowercase(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        objects,
        [
            "namespace/gpudiag",
            "serviceaccount/gpudiag",
            "daemonset/gpudiag",
            "service/gpudiag"
        ]
    );
    for object in &objects {
        for v in KUBERNETES_VERSIONS {
            let minor = v.rsplit_once('.').unwrap().0;
            let line = format!("passed for resource {object} against version {minor}");
            assert!(out.contains(&line), "{line:?} missing: {out}");
        }
    }
    assert!(
        !out.contains("WARN") && !out.contains("ERROR"),
        "kubernetes-validate: {out}"
    );

    // Strict mode rejects a field the API does not have, which the API server would drop
    // (or kubectl refuse) rather than apply: a misspelt hostPID must fail here.
    let text = std::fs::read_to_string(at(MANIFEST)).unwrap();
    assert!(text.contains("hostPID: true"));
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("gpudiag.yaml");
    std::fs::write(&broken, text.replace("hostPID: true", "hostPid: true")).unwrap();
    let (code, out) = validate_manifest(&validate, &broken);
    assert_ne!(code, 0, "a misspelt field passed: {out}");
    assert!(out.contains("'hostPid' was unexpected"), "{out}");
}

#[test]
fn daemonset_sees_every_gpu_without_taking_one() {
    let (pod, container) = pod_and_container();
    // Other containers' processes: NVML names them by host PID, attribution reads their /proc.
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let env = env_of(&container);
    for (name, value) in [
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
    ] {
        assert!(
            env.iter().any(|(n, v)| n == name && v == value),
            "{name}={value} missing from {env:?}"
        );
    }
    // No extended resource anywhere in the pod: a monitor asking for nvidia.com/gpu would take
    // a GPU from the scheduler, and see only that one.
    fn no_gpu_resources(v: &Value, path: &str) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    if k == "resources" {
                        for section in child.as_object().unwrap().values() {
                            for name in section.as_object().into_iter().flat_map(|m| m.keys()) {
                                assert!(
                                    !name.starts_with("nvidia.com/"),
                                    "{path}.resources asks for {name}"
                                );
                            }
                        }
                    }
                    no_gpu_resources(child, &format!("{path}.{k}"));
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    no_gpu_resources(child, &format!("{path}[{i}]"));
                }
            }
            _ => {}
        }
    }
    no_gpu_resources(&pod, "spec.template.spec");
    // Requests and limits of its own all the same: CPU and memory, nothing else.
    for section in ["requests", "limits"] {
        let mut keys: Vec<&String> = container["resources"][section]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["cpu", "memory"], "resources.{section}");
    }
    // On GPU nodes only, tainted or not.
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
    let tolerations = pod["tolerations"].as_array().unwrap();
    assert!(
        tolerations.iter().any(|t| t["key"] == "nvidia.com/gpu"
            && t["operator"] == "Exists"
            && t["effect"] == "NoSchedule"),
        "{tolerations:?}"
    );
    // Least privilege that still works: root for the kubelet's socket, no capability, no
    // escalation, nothing written.
    let sc = &container["securityContext"];
    assert_ne!(pod["hostNetwork"], true);
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(sc["capabilities"].get("add").is_none(), "{sc}");
    assert_eq!(pod["automountServiceAccountToken"], false);
    // Everything in the namespace the file creates.
    for doc in yaml_docs(MANIFEST)
        .iter()
        .chain(&yaml_docs(SERVICE_MONITOR))
    {
        if doc["kind"] != "Namespace" {
            assert_eq!(doc["metadata"]["namespace"], "gpudiag", "{}", doc["kind"]);
        }
    }
    assert_eq!(object("Namespace")["metadata"]["name"], "gpudiag");
}

#[test]
fn daemonset_mounts_the_kubelet_socket_serve_asks() {
    let (pod, container) = pod_and_container();
    // Where serve looks: --kubelet-socket, else GPUDIAG_KUBELET_SOCKET, else its default.
    let args = serve_args(&container);
    let env = env_of(&container);
    let socket = flag_value(&args, "--kubelet-socket")
        .or_else(|| {
            env.iter()
                .find(|(n, _)| n == gpudiag_telemetry::attribution::KUBELET_SOCKET_ENV)
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| gpudiag_telemetry::attribution::DEFAULT_KUBELET_SOCKET.to_owned());
    let dir = Path::new(&socket).parent().unwrap().to_str().unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}, where serve looks for {socket}"));
    assert_eq!(mount["readOnly"], true, "{mount}");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    // The kubelet's own directory (its default --root-dir), where it makes the socket.
    assert_eq!(
        volume["hostPath"]["path"], "/var/lib/kubelet/pod-resources",
        "{volume}"
    );
    assert_eq!(volume["hostPath"]["type"], "Directory");
}

#[test]
fn ports_probes_service_and_service_monitor_agree_with_serve_args() {
    let (pod, container) = pod_and_container();
    let args = serve_args(&container);
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    // The same parser clap uses for --listen (SocketAddr's FromStr); the test below runs the
    // binary with these arguments.
    let listen: std::net::SocketAddr = flag_value(&args, "--listen")
        .expect("--listen: serve's default is loopback, which no probe or scraper reaches")
        .parse()
        .unwrap();
    assert!(listen.ip().is_unspecified(), "{listen}: the pod's IP");
    let ports = container["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "metrics");
    assert_eq!(ports[0]["containerPort"], listen.port());
    // Every probe asks serve's one path, on that port.
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], "/metrics", "{probe}");
        assert!(
            get["port"] == "metrics" || get["port"] == listen.port(),
            "{probe}: {get}"
        );
    }
    // The Service selects the pods and names the port; the ServiceMonitor selects the Service
    // and scrapes that port by name.
    let service = object("Service");
    let pod_labels = object("DaemonSet")["spec"]["template"]["metadata"]["labels"].clone();
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v, "Service selector {k}");
    }
    let service_ports = service["spec"]["ports"].as_array().unwrap();
    assert_eq!(service_ports.len(), 1);
    assert_eq!(service_ports[0]["name"], "metrics");
    assert!(
        service_ports[0]["targetPort"] == "metrics"
            || service_ports[0]["targetPort"] == listen.port()
    );
    let monitors = yaml_docs(SERVICE_MONITOR);
    assert_eq!(monitors.len(), 1);
    let monitor = &monitors[0];
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "ServiceMonitor selector {k}"
        );
    }
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"],
        serde_json::json!([service["metadata"]["namespace"]])
    );
    let endpoints = monitor["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0]["port"], service_ports[0]["name"]);
    assert_eq!(endpoints[0]["path"], "/metrics");
    assert_eq!(endpoints[0]["honorLabels"], true);
    assert_eq!(
        pod["serviceAccountName"],
        object("ServiceAccount")["metadata"]["name"]
    );
}

#[test]
fn daemonset_args_start_the_real_serve_and_its_probe_path_answers() {
    use std::io::{BufRead, BufReader};
    let (_, container) = pod_and_container();
    let mut args = serve_args(&container);
    // The shipped arguments, but on a free loopback port instead of 0.0.0.0:9835: tests run
    // in parallel, on machines other builds share. The shipped address is parsed above.
    let at_listen = args
        .iter()
        .position(|a| a == "--listen")
        .expect("--listen ADDR");
    args[at_listen + 1] = "127.0.0.1:0".into();
    let recording = at("tests/fixtures/recordings/healthy.ndjson");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(&args)
        .arg("--replay")
        .arg(&recording)
        .envs(env_of(&container))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    // Kept open while serve runs: it says on stderr when the recording ends.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    stderr.read_line(&mut line).unwrap();
    let _serve = Killed(child);
    let addr = line
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("serve did not start with {args:?}: {line:?}"));
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let path = container[probe]["httpGet"]["path"].as_str().unwrap();
        let body = http_get(addr, path).unwrap_or_else(|| panic!("{probe} {path}: not 200"));
        assert!(
            body.contains("# TYPE gpudiag_info"),
            "{probe} {path}: {body}"
        );
    }
    // The check means something: a path serve does not answer fails it.
    assert_eq!(http_get(addr, "/healthz"), None);
}

/// A Containerfile's instructions, (KEYWORD, arguments), with continuation lines joined and
/// comment and blank lines left out, as the builder reads them.
fn containerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (keyword, rest) = current.split_once(char::is_whitespace).unwrap();
        out.push((keyword.to_ascii_uppercase(), rest.trim().to_owned()));
        current.clear();
    }
    out
}

/// One build stage: its base image, its name, its instructions after FROM.
struct Stage {
    image: String,
    name: Option<String>,
    steps: Vec<(String, String)>,
}

fn stages(text: &str) -> Vec<Stage> {
    let mut stages: Vec<Stage> = Vec::new();
    for (keyword, rest) in containerfile_instructions(text) {
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_] => None,
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                _ => panic!("FROM {rest}"),
            };
            stages.push(Stage {
                image: words[0].to_owned(),
                name,
                steps: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .expect("FROM first")
                .steps
                .push((keyword, rest));
        }
    }
    stages
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.steps
            .iter()
            .filter(|(k, _)| k == keyword)
            .map(|(_, r)| r.as_str())
            .collect()
    }

    /// Its COPY instructions: (--from stage, sources, destination).
    fn copies(&self) -> Vec<(Option<String>, Vec<String>, String)> {
        self.all("COPY")
            .into_iter()
            .map(|rest| {
                let mut from = None;
                let mut paths = Vec::new();
                for word in rest.split_whitespace() {
                    if let Some(stage) = word.strip_prefix("--from=") {
                        from = Some(stage.to_owned());
                    } else {
                        assert!(!word.starts_with("--"), "COPY flag {word}: teach the test");
                        paths.push(word.to_owned());
                    }
                }
                let dest = paths.pop().unwrap();
                (from, paths, dest)
            })
            .collect()
    }

    /// The one JSON-form ENTRYPOINT or CMD.
    fn exec_form(&self, keyword: &str) -> Vec<String> {
        let all = self.all(keyword);
        assert_eq!(all.len(), 1, "one {keyword}");
        serde_json::from_str(all[0]).unwrap_or_else(|e| panic!("{keyword} in JSON form: {e}"))
    }
}

/// Copies a file, or a directory's contents, from `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
}

/// Every `include_str!`/`include_bytes!` path under `dir` (the first literal of a `concat!`,
/// a directory prefix, stands for the files it names), resolved as rustc does: relative to
/// the including file.
fn compile_time_includes(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            compile_time_includes(&path, found);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for macro_ in ["include_str!(", "include_bytes!("] {
            for (at, _) in text.match_indices(macro_) {
                let rest = &text[at + macro_.len()..];
                // A file the build script writes (the kernels collector) is built, not copied.
                if rest.starts_with("concat!(env!(\"OUT_DIR\")") {
                    continue;
                }
                let literal = rest.split('"').nth(1).unwrap();
                found.push(path.parent().unwrap().join(literal));
            }
        }
    }
}

#[test]
fn containerfile_builds_the_binary_its_entrypoint_runs_from_files_that_exist() {
    let text = std::fs::read_to_string(at(CONTAINERFILE)).unwrap();
    let stages = stages(&text);
    assert_eq!(stages.len(), 2, "a builder and a runtime stage");
    let (builder, runtime) = (&stages[0], &stages[1]);
    let builder_name = builder.name.as_deref().expect("FROM ... AS builder");

    // The builder's Rust is the workspace's rust-version, on the runtime's Debian release, so
    // the binary needs no newer glibc than the runtime has.
    let cargo_toml: toml::Table =
        toml::from_str(&std::fs::read_to_string(at("Cargo.toml")).unwrap()).unwrap();
    let rust_version = cargo_toml["workspace"]["package"]["rust-version"]
        .as_str()
        .unwrap();
    let builder_tag = builder.image.rsplit_once(':').unwrap().1;
    assert!(
        builder.image.contains("/rust:") && builder_tag.starts_with(&format!("{rust_version}-")),
        "{} is not Rust {rust_version}, the workspace's rust-version",
        builder.image
    );
    let runtime_tag = runtime.image.rsplit_once(':').unwrap().1;
    assert!(runtime.image.contains("/debian:"), "{}", runtime.image);
    let release = runtime_tag.split('-').next().unwrap();
    assert!(
        builder_tag.ends_with(&format!("-{release}")),
        "builder {builder_tag} and runtime {runtime_tag} on different Debian releases"
    );
    assert!(
        builder
            .all("RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked")),
        "the builder runs cargo build --release --locked"
    );

    // The runtime copies the binary from where cargo leaves it, and runs it.
    let workdir = builder.all("WORKDIR");
    assert_eq!(workdir.len(), 1);
    let bin = cargo_toml["package"]["name"].as_str().unwrap();
    let built = format!("{}/target/release/{bin}", workdir[0].trim_end_matches('/'));
    let copies = runtime.copies();
    assert_eq!(copies.len(), 1, "the runtime copies the binary only");
    let (from, sources, dest) = &copies[0];
    assert_eq!(from.as_deref(), Some(builder_name));
    assert_eq!(sources, &[built]);
    assert_eq!(runtime.exec_form("ENTRYPOINT"), std::slice::from_ref(dest));
    // `docker run IMAGE` serves as the DaemonSet does.
    let (_, container) = pod_and_container();
    assert_eq!(runtime.exec_form("CMD"), serve_args(&container));

    // What the builder copies from the context exists here, and is exactly what the ignore
    // file lets into the context.
    let context: Vec<(String, String)> = builder
        .copies()
        .into_iter()
        .flat_map(|(from, sources, dest)| {
            assert_eq!(from, None, "the builder copies from the context only");
            sources.into_iter().map(move |s| (s, dest.clone()))
        })
        .collect();
    for (source, _) in &context {
        assert!(at(source).exists(), "COPY {source}: not in the repository");
    }
    let ignore = std::fs::read_to_string(at(&format!("{CONTAINERFILE}.dockerignore"))).unwrap();
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        patterns.first(),
        Some(&"*"),
        "an allowlist: everything out first"
    );
    let mut allowed: Vec<&str> = patterns[1..]
        .iter()
        .map(|p| p.strip_prefix('!').expect("only exceptions after *"))
        .collect();
    let mut copied: Vec<&str> = context.iter().map(|(s, _)| s.as_str()).collect();
    allowed.sort_unstable();
    copied.sort_unstable();
    assert_eq!(
        allowed, copied,
        "the ignore file and the COPY lines disagree"
    );

    // And it is enough to build: the copied context, laid out as in the image, has every
    // target and member Cargo.toml names and a current lock (`cargo fetch` checks both
    // without compiling), and every file the sources include at compile time.
    let image = tempfile::tempdir().unwrap();
    for (source, dest) in &context {
        let dest = dest.trim_start_matches("./");
        let to = if dest.is_empty() || dest.ends_with('/') {
            image
                .path()
                .join(dest)
                .join(Path::new(source).file_name().unwrap())
        } else {
            image.path().join(dest)
        };
        copy_tree(&at(source), &to);
    }
    let host = Command::new(env!("CARGO")).arg("-vV").output().unwrap();
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["fetch", "--locked", "--offline", "--target", &host])
        .current_dir(image.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo fetch in the image's context: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut includes = Vec::new();
    compile_time_includes(image.path(), &mut includes);
    assert!(includes.len() >= 5, "{includes:?}");
    for path in &includes {
        assert!(
            path.exists(),
            "{} is included at compile time but not copied into the image",
            path.display()
        );
    }
}

#[test]
fn service_monitor_validates_against_its_schema() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(at("tests/deploy/servicemonitor.schema.json")).unwrap(),
    )
    .unwrap();
    jsonschema::meta::validate(&schema).unwrap();
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    let monitors = yaml_docs(SERVICE_MONITOR);
    assert_eq!(monitors.len(), 1);
    let errors: Vec<String> = validator
        .iter_errors(&monitors[0])
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    // A misspelt field fails, as kubectl's strict field validation would refuse it.
    let text = std::fs::read_to_string(at(SERVICE_MONITOR)).unwrap();
    let broken: Value =
        serde_norway::from_str(&text.replace("honorLabels:", "honorLabel:")).unwrap();
    assert!(
        !validator.is_valid(&broken),
        "a misspelt honorLabels passed"
    );
}

/// Targets as Kubernetes discovery gives them for the gpudiag namespace (the meta labels
/// Prometheus documents for `role: endpointslice`): the gpudiag Service's `metrics` port on
/// two nodes, another port of the same pod, and another Service's `metrics` port. Loopback
/// addresses stand for pod IPs, so a scrape goes nowhere else.
fn endpoints_discovered(service: &str, port: &str) -> Value {
    let target = |addr: &str, svc: &str, port_name: &str, node: &str, pod: &str| {
        serde_json::json!({
            "targets": [addr],
            "labels": {
                "__meta_kubernetes_namespace": "gpudiag",
                "__meta_kubernetes_service_name": svc,
                "__meta_kubernetes_endpointslice_port_name": port_name,
                "__meta_kubernetes_endpointslice_endpoint_conditions_ready": "true",
                "__meta_kubernetes_pod_name": pod,
                "__meta_kubernetes_pod_node_name": node,
            }
        })
    };
    serde_json::json!([
        target(
            "127.0.0.2:9835",
            service,
            port,
            "gpu-node-01",
            "gpudiag-a1b2c"
        ),
        target(
            "127.0.0.3:9835",
            service,
            port,
            "gpu-node-02",
            "gpudiag-d3e4f"
        ),
        target(
            "127.0.0.2:8080",
            service,
            "debug",
            "gpu-node-01",
            "gpudiag-a1b2c"
        ),
        target(
            "127.0.0.4:9835",
            "another-exporter",
            port,
            "gpu-node-01",
            "x-5g6h7"
        ),
    ])
}

#[test]
#[ignore = "needs promtool and prometheus (apt-get install prometheus); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn prometheus_kubernetes_scrape_config_keeps_one_target_per_gpudiag_pod() {
    let rel = "assets/deploy/prometheus/prometheus-kubernetes.yml";
    let docs = yaml_docs(rel);
    let mut config = docs[0].clone();
    let jobs = config["scrape_configs"].as_array_mut().unwrap();
    assert_eq!(jobs.len(), 1);
    let job = jobs[0].as_object_mut().unwrap();
    assert_eq!(job["job_name"], "gpudiag");
    assert_eq!(job["honor_labels"], true);
    // Discovery of the namespace and Service gpudiag.yaml makes, keeping its named port.
    let service = object("Service");
    let sd = job["kubernetes_sd_configs"].as_array().unwrap();
    assert_eq!(sd.len(), 1);
    assert_eq!(sd[0]["role"], "endpointslice");
    assert_eq!(
        sd[0]["namespaces"]["names"],
        serde_json::json!([service["metadata"]["namespace"]])
    );
    let name = service["metadata"]["name"].as_str().unwrap();
    let port = service["spec"]["ports"][0]["name"].as_str().unwrap();

    // promtool checks the file as shipped where it has Kubernetes discovery; Debian's
    // Prometheus is built without it (client-go is not packaged), so there the file is
    // checked, and loaded, with the discovery replaced by the targets it would give.
    {
        let out = Command::new(tool("promtool"))
            .args(["check", "config"])
            .arg(at(rel))
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if said.contains("field kubernetes_sd_configs not found") {
            eprintln!("note: this promtool has no Kubernetes discovery; checking a copy");
        } else {
            assert!(out.status.success(), "promtool check config {rel}: {said}");
        }
    }
    job.remove("kubernetes_sd_configs");
    job.insert("static_configs".into(), endpoints_discovered(name, port));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("prometheus-kubernetes.yml");
    // JSON is YAML, as Prometheus reads it.
    std::fs::write(&cfg, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let found = targets_in_prometheus(&cfg);
    let mut kept: Vec<(&str, &str)> = found
        .iter()
        .map(|(i, l)| (i.as_str(), l["node"].as_str().unwrap_or("no node label")))
        .collect();
    kept.sort_unstable();
    assert_eq!(
        kept,
        [
            ("127.0.0.2:9835", "gpu-node-01"),
            ("127.0.0.3:9835", "gpu-node-02")
        ]
    );
    // No target label of gpudiag's own pod where gpudiag's `pod`/`namespace` belong.
    for (_, labels) in &found {
        for own in ["pod", "namespace", "container", "service"] {
            assert!(labels.get(own).is_none(), "{own} on the target: {labels}");
        }
    }
}
