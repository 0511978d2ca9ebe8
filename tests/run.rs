//! `gpudiag run -- CMD` without a GPU: the command runs, its exit code comes back, signals are
//! forwarded, output paths are checked before it starts, and gpudiag says it could not watch.
//! Where a test needs gpudiag to watch something (a trace to merge), the fake amdgpu sysfs tree
//! in tests/fixtures stands in for a GPU. (The verdicts themselves are checked on
//! recordings in crates/core/tests/rules.rs and on the GPU host in tests/gpu_run.rs.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::at;
use crate::support::tmux;

/// A bound against hangs, not a timing.
const HANG: Duration = Duration::from_secs(20);

fn gpudiag() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpudiag"));
    // No GPU here; keep the AMD probe off real sysfs so the outcome does not depend on the host.
    c.env("GPUDIAG_SYSFS_ROOT", "/nonexistent-sysfs-root");
    c
}

#[test]
fn the_commands_exit_code_comes_back_and_not_watching_is_said() {
    let out = gpudiag()
        .args(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("err\n"), "{err}");
    assert!(err.contains("exited with code 7"), "{err}");
    assert!(
        err.contains("`sh -c 'echo out; echo err >&2; exit 7'` exited"),
        "{err}"
    );
    assert!(err.contains("could not watch the GPUs"), "{err}");
}

#[test]
fn a_command_that_cannot_start_is_exit_2_with_the_reason() {
    let out = gpudiag()
        .args(["run", "--", "/no/such/program", "--flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot start /no/such/program"), "{err}");
    assert!(err.contains("No such file"), "{err}");
    let out = gpudiag().args(["run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no command is a usage error");
}

#[test]
fn a_signal_that_kills_the_command_is_128_plus_n() {
    let out = gpudiag()
        .args(["run", "--", "sh", "-c", "kill -KILL $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
    assert!(String::from_utf8_lossy(&out.stderr).contains("killed by signal 9"));
}

#[test]
fn sigterm_to_gpudiag_reaches_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("got-term");
    let script = format!(
        "trap 'touch {}; exit 42' TERM; sleep 30 & wait",
        marker.display()
    );
    let mut child = gpudiag()
        .args(["run", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let the shell install its trap.
    std::thread::sleep(Duration::from_millis(700));
    let started = Instant::now();
    unsafe_kill(child.id(), 15);
    let status = child.wait().unwrap();
    assert!(marker.exists(), "the command never saw SIGTERM");
    assert_eq!(status.code(), Some(42));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn report_file_says_what_ran_and_why_nothing_was_watched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let out = gpudiag()
        .args(["run", "--report-file"])
        .arg(&path)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(report["command"], serde_json::json!(["true"]));
    assert_eq!(report["exit_code"], 0);
    assert!(
        report["not_watched"].as_str().unwrap().contains("NVML")
            || report["not_watched"].as_str().unwrap().contains("NVIDIA")
    );
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/schema/run-report.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&report)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

fn assert_valid_run_report(report: &serde_json::Value) {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/schema/run-report.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

/// `--json` is a flag, as on every other command: `run --json sh -c ...` runs `sh`, writes no
/// file named `sh`, and prints the report as the last line of stderr (stdout is the command's).
#[test]
fn json_is_a_flag_that_prints_the_report_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpudiag()
        .current_dir(dir.path())
        .args(["run", "--json", "sh", "-c", "echo out; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "--json took a file name"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap();
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        report["command"],
        serde_json::json!(["sh", "-c", "echo out; exit 3"])
    );
    assert_eq!(report["exit_code"], 3);
    assert!(
        !err.contains("exited with code"),
        "the text summary too: {err}"
    );
    assert_valid_run_report(&report);
    // The old form, `--json FILE -- CMD`, now names FILE as the command: say what changed.
    let out = gpudiag()
        .current_dir(dir.path())
        .args(["run", "--json", "out.json", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use --report-file FILE"), "{err}");
}

/// Each output path that cannot be written is a usage error (2) before the command starts: a
/// directory that does not exist, a path that is a directory (with --force too), a directory no
/// file can be made in (/proc, which refuses root too).
#[test]
fn an_output_path_that_cannot_be_written_stops_before_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let missing = dir.path().join("no-such-dir/out.json");
    let bad: [(&Path, &str); 3] = [
        (&missing, "no-such-dir"),
        (dir.path(), "is a directory"),
        (
            Path::new("/proc/gpudiag-out.json"),
            "cannot create a file in /proc",
        ),
    ];
    for flag in ["--report-file", "--record", "--trace"] {
        for (path, why) in &bad {
            for force in [false, true] {
                let mut c = gpudiag();
                c.args(["run", flag]).arg(path);
                if force {
                    c.arg("--force");
                }
                let out = c.args(["--", "sh", "-c", &script]).output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "{flag} {path:?}: {err}");
                assert!(err.contains(why), "{flag} {path:?}: {err}");
                assert!(!marker.exists(), "{flag} {path:?}: the command ran");
            }
        }
    }
}

/// The command removes the report's directory: gpudiag warns and exits with the command's code.
#[test]
fn a_late_write_failure_keeps_the_commands_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = gpudiag()
        .arg("run")
        .arg("--report-file")
        .arg(sub.join("run.json"))
        .args(["--", "sh", "-c"])
        .arg(format!("rmdir {}; exit 7", sub.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(err.contains("warning: cannot write"), "{err}");
}

fn fake_gpu() -> PathBuf {
    at("tests/fixtures/sysfs/mi300x")
}

/// The command writes a profiler trace that is not one: the merge fails after the run, which is
/// a warning; gpudiag's own trace is kept and the exit code is the command's.
#[test]
fn a_failed_profiler_merge_keeps_the_commands_exit_code_and_gpudiags_trace() {
    let dir = tempfile::tempdir().unwrap();
    let profiler = dir.path().join("prof.pt.trace.json");
    let merged = dir.path().join("merged.json");
    let out = gpudiag()
        .args(["run", "--backend", "sysfs", "--sysfs-root"])
        .arg(fake_gpu())
        .args(["--interval", "50ms", "--trace"])
        .arg(&merged)
        .arg("--profiler-trace")
        .arg(&profiler)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "sleep 0.3; echo garbage > {}; exit 5",
            profiler.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("warning: could not merge"), "{err}");
    let own = dir.path().join("merged.gpudiag.json");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
    assert!(
        trace["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    );
    assert!(!merged.exists());
}

/// Starts `gpudiag run -- sh -c SCRIPT` and waits until the script has written `ready` in `dir`
/// (its traps are set by then).
fn spawn_ready(dir: &Path, script: &str) -> Child {
    let ready = dir.join("ready");
    let mut child = gpudiag()
        .args(["run", "--", "sh", "-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ready.exists() {
        if start.elapsed() > HANG || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("the command never got ready");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("gpudiag did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every signal that would end gpudiag, sent to gpudiag alone, reaches the command once, and
/// gpudiag exits with the command's code (SIGHUP and SIGQUIT used to kill gpudiag and leave the
/// command running under init).
#[test]
fn signals_sent_to_gpudiag_reach_the_command_and_its_code_comes_back() {
    for (name, number) in [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("USR1", 10),
        ("USR2", 12),
        ("ALRM", 14),
        ("TERM", 15),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "trap 'echo {name} >> got; kill $! 2>/dev/null; exit {}' {name}; sleep 30 & \
             touch ready; wait",
            100 + number
        );
        let mut child = spawn_ready(dir.path(), &script);
        unsafe_kill(child.id(), number);
        let status = wait_bounded(&mut child);
        assert_eq!(status.code(), Some(100 + number), "SIG{name}");
        let got = std::fs::read_to_string(dir.path().join("got")).unwrap_or_default();
        assert_eq!(got, format!("{name}\n"), "SIG{name}");
    }
}

/// gpudiag killed outright (SIGKILL: nothing can be forwarded) takes the command with it.
#[test]
fn sigkill_to_gpudiag_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_ready(dir.path(), "echo $$ > pid; touch ready; exec sleep 30");
    let pid: u32 = std::fs::read_to_string(dir.path().join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Let `exec sleep` happen, so the pid is the sleep's.
    std::thread::sleep(Duration::from_millis(200));
    unsafe_kill(child.id(), 9);
    wait_bounded(&mut child);
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > HANG {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the command outlived gpudiag");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Running, and not a zombie waiting for a reaper (init in a container may never reap it).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

fn unsafe_kill(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// In a terminal, Ctrl-\ and Ctrl-C reach the command directly (it stays in the terminal's
/// foreground group), so gpudiag does not send them again: the command sees each once, and
/// gpudiag survives Ctrl-\ (SIGQUIT used to kill it) and exits with the command's code.
#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn terminal_ctrl_backslash_and_ctrl_c_reach_the_command_once() {
    let tmux = tmux::Tmux::start(100, 20, "run-signals");
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_gpudiag");
    tmux.type_line(&format!(
        "cd {}; GPUDIAG_SYSFS_ROOT=/nonexistent {bin} run -- sh -c \"trap 'echo QUIT >> got' \
         QUIT; trap 'echo INT >> got; exit 9' INT; touch ready; while :; do sleep 0.1; done\"; \
         echo \"exit=$?\"",
        dir.path().display()
    ));
    let start = Instant::now();
    while !dir.path().join("ready").exists() {
        assert!(start.elapsed() < HANG, "{}", tmux.capture());
        std::thread::sleep(Duration::from_millis(20));
    }
    tmux.keys(&["C-\\"]);
    let got = dir.path().join("got");
    while !got.exists() {
        assert!(start.elapsed() < HANG, "{}", tmux.capture());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Time for a second, forwarded SIGQUIT to arrive if gpudiag sent one.
    std::thread::sleep(Duration::from_millis(300));
    tmux.keys(&["C-c"]);
    // "exit=" is in the typed command too: wait for a line that starts with it.
    let screen = tmux.wait_until(
        "the exit code",
        |screen| screen.lines().any(|l| l.starts_with("exit=")),
        HANG,
    );
    assert!(screen.contains("exit=9"), "{screen}");
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "QUIT\nINT\n",
        "{screen}"
    );
}

#[test]
fn kernels_gives_the_command_its_collector_and_says_when_no_process_loaded_it() {
    let out = gpudiag()
        .args(["run", "--kernels", "--", "sh", "-c"])
        .arg(
            "test -f \"$CUDA_INJECTION64_PATH\" && test -S \"$GPUDIAG_KERNELS_SOCKET\" && \
             case \"$LD_PRELOAD\" in \"$CUDA_INJECTION64_PATH:/keep.so\") \
             dirname \"$CUDA_INJECTION64_PATH\";; esac",
        )
        .env_remove("CUDA_INJECTION64_PATH")
        .env("LD_PRELOAD", "/keep.so")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(dir.contains("gpudiag-kernels-"), "{dir} / {err}");
    // Removed when gpudiag ends.
    assert!(!Path::new(&dir).exists());
    assert!(err.contains("the collector loaded in no process"), "{err}");
}

#[test]
fn kernels_steps_aside_for_a_tool_that_already_injects_into_cuda() {
    let out = gpudiag()
        .args([
            "run",
            "--kernels",
            "--",
            "sh",
            "-c",
            "echo \"$CUDA_INJECTION64_PATH\"",
        ])
        .env("CUDA_INJECTION64_PATH", "/opt/other/libinjection.so")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/opt/other/libinjection.so\n"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kernels steps aside"), "{err}");
}

/// The whole path without a GPU: the collector gpudiag installs, loaded by a C driver as the
/// CUDA driver would load it, reads records from a stand-in libcupti
/// (crates/kernels/tests/c) and reports them over the socket; gpudiag counts them.
#[test]
fn kernels_counts_what_the_collector_in_the_command_sent() {
    let c = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/kernels");
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libfakecupti.so");
    let driver = dir.path().join("driver");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for args in [
        vec![
            "-shared".to_owned(),
            "-fPIC".into(),
            format!("-I{c}/collector"),
            "-o".into(),
            fake.display().to_string(),
            format!("{c}/tests/c/fake_cupti.c"),
        ],
        vec![
            format!("-I{c}/collector"),
            "-o".into(),
            driver.display().to_string(),
            format!("{c}/tests/c/driver.c"),
            "-ldl".into(),
        ],
    ] {
        let built = Command::new(&cc).args(&args).output().unwrap();
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let out = gpudiag()
        .args(["run", "--kernels", "--", "sh", "-c"])
        .arg(format!(
            "{} \"$CUDA_INJECTION64_PATH\" records 10",
            driver.display()
        ))
        .env("GPUDIAG_CUPTI", &fake)
        .env_remove("CUDA_INJECTION64_PATH")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("  10 kernels, "), "{err}");
    assert!(
        err.contains("kernel_a") && err.contains("kernel_b"),
        "{err}"
    );
    assert!(
        err.contains("copies host→device pageable: 1 of 4 KiB"),
        "{err}"
    );
    assert!(err.contains("1 × cudaStreamSynchronize"), "{err}");
    assert!(
        err.contains("gpudiag: kernels: the collector ran in 1 process"),
        "{err}"
    );
}

/// A `run --kernels --record` recording: a healthy fixture's telemetry with a sync-bound loop's
/// summary as its last line (its top kernel named `kernel` where given), the fixture's GPU
/// matched to the records' (as `run` matches them at its end).
fn kernels_recording(dir: &Path, ended: bool, kernel: Option<&str>) -> PathBuf {
    use gpudiag_core::kernels::KernelsAggregator;
    use gpudiag_core::kernels::synthetic::sync_bound_stream;
    use gpudiag_model::kernels::RecordedKernels;
    use gpudiag_telemetry::recording::Record;
    let mut aggregator = KernelsAggregator::default();
    for m in sync_bound_stream(4242) {
        aggregator.push(&m);
    }
    let mut summary = aggregator.summary();
    summary.gpus[0].uuid = Some("GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11".into());
    summary.gpus[0].index = ended.then_some(0);
    if let Some(name) = kernel {
        summary.gpus[0].top_kernels[0].name = name.into();
        summary.gpus[0].top_kernels[0].short_name = name.into();
    }
    let line = Record::Kernels(RecordedKernels {
        time_ms: 1_767_225_609_000,
        ended,
        summary,
    });
    let mut text = std::fs::read_to_string(crate::support::fixture("healthy.ndjson")).unwrap();
    text.push_str(&serde_json::to_string(&line).unwrap());
    text.push('\n');
    let path = dir.join(if ended { "run.ndjson" } else { "cut.ndjson" });
    std::fs::write(&path, text).unwrap();
    path
}

fn check_json(args: &[&str]) -> serde_json::Value {
    let run = crate::support::run(&[&["check", "--json"], args].concat());
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.json()
}

/// `check` of a `run --kernels` recording reports what the run's records concluded: the
/// summary `run` printed, and the GPU's verdict resting on the records as `run`'s did, the
/// counters' kept in its evidence. Judging only the end of the run, or a recording that ends
/// before the run's own summary, the verdict is the counters' and the text says so.
#[test]
fn check_of_a_kernels_recording_gives_the_runs_summary_and_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let run = kernels_recording(dir.path(), true, None);
    let run = run.to_str().unwrap();

    let report = check_json(&["--replay", run]);
    assert_eq!(report["kernels"]["ended"], true, "{report}");
    assert_eq!(report["kernels"]["summary"]["gpus"][0]["kernels"], 333);
    let verdict = &report["devices"][0]["verdict"];
    assert_eq!(verdict["basis"], "kernels", "{verdict}");
    assert_eq!(verdict["bottleneck"], "sync_bound", "{verdict}");
    assert!(
        verdict["evidence"]["counters_bottleneck"].is_string(),
        "{verdict}"
    );

    let text = crate::support::run(&["check", "--replay", run]).stdout;
    assert!(
        text.contains("kernels recorded by `run --kernels` (the run's own, as `run` printed it):"),
        "{text}"
    );
    assert!(text.contains("× cudaStreamSynchronize"), "{text}");
    assert!(
        text.contains("cudaStreamSynchronize 334 a second"),
        "{text}"
    );

    let window = check_json(&["--replay", run, "--window", "5s"]);
    assert_eq!(window["kernels"]["ended"], true);
    assert_ne!(window["devices"][0]["verdict"]["basis"], "kernels");
    let text = crate::support::run(&["check", "--replay", run, "--window", "5s"]).stdout;
    assert!(
        text.contains("the verdicts above are of the window and rest on the counters"),
        "{text}"
    );

    let cut = kernels_recording(dir.path(), false, None);
    let cut = cut.to_str().unwrap();
    let report = check_json(&["--replay", cut]);
    assert_eq!(report["kernels"]["ended"], false);
    assert_ne!(report["devices"][0]["verdict"]["basis"], "kernels");
    let text = crate::support::run(&["check", "--replay", cut]).stdout;
    assert!(
        text.contains("the recording ends before the command did"),
        "{text}"
    );

    // A recording without --kernels has no `kernels` at all.
    let plain = check_json(&[
        "--replay",
        crate::support::fixture("healthy.ndjson").to_str().unwrap(),
    ]);
    assert!(plain.get("kernels").is_none(), "{plain}");
}

/// A recording is anyone's file: a kernel name carrying terminal escapes reaches `check`'s text
/// escaped.
#[test]
fn check_of_a_kernels_recording_escapes_what_the_recording_says() {
    let dir = tempfile::tempdir().unwrap();
    let run = kernels_recording(dir.path(), true, Some("gemm\u{1b}[2J\u{1b}]0;owned\u{7}"));
    let out = crate::support::run(&["check", "--replay", run.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("kernels recorded by `run --kernels`"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("gemm"), "{}", out.stdout);
    assert!(
        !out.stdout.contains('\u{1b}') && !out.stdout.contains('\u{7}'),
        "{:?}",
        out.stdout
    );
}
