//! Every fault of the fault backend through the whole pipeline, without a GPU: the sampler,
//! history and rules (library level), the terminal UI (state and snapshots), and end to end
//! through the binary with `GPUDIAG_TEST_FAULTS` over recordings: `check --json` (schema-valid),
//! `record` then `check --replay`, `trace` and `serve`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use gpudiag::tui::app::{App, AppInit, Panel, SourceKind};
use gpudiag::tui::theme::Theme;
use gpudiag::tui::ui;
use gpudiag_core::config::RulesConfig;
use gpudiag_core::pipeline::{Pipeline, Sink};
use gpudiag_core::rules::engine::RuleEngine;
use gpudiag_core::session::DEMO_RECORDING;
use gpudiag_model::finding::{Finding, Severity};
use gpudiag_model::sample::{Absent, EventKind, Metric};
use gpudiag_telemetry::fault::{self, FAULTS_ENV, FaultBackend};
use gpudiag_telemetry::poll_deadline::PollDeadline;
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::sampler::{Sampler, SamplerMsg, SamplerOptions};
use gpudiag_telemetry::sanity::{self, Health};
use gpudiag_telemetry::{Backend, Tick};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde_json::Value;

use crate::support::serve::serve_with;
use crate::support::{Run as Out, fixture, root, s};

fn open(name: &str) -> ReplayBackend {
    if name == "demo" {
        ReplayBackend::from_reader(DEMO_RECORDING, Pace::AsFastAsPossible).unwrap()
    } else {
        ReplayBackend::open(fixture(&format!("{name}.ndjson")), Pace::AsFastAsPossible).unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// Library level: fault backend → poll deadline → sampler (plausibility) → history → rules

struct Run {
    pipeline: Pipeline,
    ticks: Vec<Tick>,
    failure: Option<String>,
}

impl Run {
    fn findings(&self) -> Vec<Finding> {
        self.pipeline.engine.raised()
    }

    fn finding(&self, id: &str, device: u32) -> Option<Finding> {
        self.findings()
            .into_iter()
            .find(|f| f.id == id && f.device == Some(device))
    }

    fn ids(&self) -> Vec<(String, Option<u32>)> {
        self.findings()
            .into_iter()
            .map(|f| (f.id, f.device))
            .collect()
    }
}

/// Keeps the ticks a pipeline hands its sink.
struct KeepTicks(Vec<Tick>);

impl Sink for KeepTicks {
    fn on_tick(
        &mut self,
        tick: &Tick,
        _: &[gpudiag_model::finding::Finding],
        _: &Pipeline,
    ) -> Result<(), gpudiag_model::error::Error> {
        self.0.push(tick.clone());
        Ok(())
    }
}

/// Plays `name` through the fault schedule `spec` and the whole pipeline, as `check` does.
fn pipeline(name: &str, spec: &str, poll_timeout: Duration) -> Run {
    let replay = open(name);
    let devices = replay.devices().to_vec();
    let host = replay.host().clone();
    let faulty = FaultBackend::new(Box::new(replay), fault::parse(spec).unwrap());
    let guarded = PollDeadline::new(Box::new(faulty), poll_timeout).unwrap();
    let sampler = Sampler::spawn(
        Box::new(guarded),
        SamplerOptions::new(Duration::from_millis(100), None),
    );
    let mut pipeline = Pipeline::new(RuleEngine::new(
        RulesConfig::default(),
        devices,
        Some(host),
        None,
    ));
    let mut ticks = Vec::new();
    let mut failure = None;
    while let Ok(msg) = sampler.recv() {
        match msg {
            SamplerMsg::Ticks { ticks: polled, .. } => {
                // The ticks as the pipeline passes them on: sanitised.
                let mut keep = KeepTicks(Vec::new());
                for t in polled {
                    pipeline.push_into(t, &mut keep).unwrap();
                }
                ticks.extend(keep.0);
            }
            SamplerMsg::Ended(e) => {
                failure = e.map(|e| e.to_string());
                break;
            }
        }
    }
    pipeline.engine.finish(&pipeline.history);
    Run {
        pipeline,
        ticks,
        failure,
    }
}

fn all_values(run: &Run, device: u32, metric: Metric) -> Vec<f64> {
    run.pipeline
        .history
        .series(device, metric)
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn implausible_values_never_become_numbers_and_are_reported() {
    let run = pipeline(
        "demo",
        "value:temp_gpu_c=1e9@5;value:power_w=-50@6;value:gpu_util_pct=NaN@7;\
         value:mem_util_pct=250@8;value:temp_mem_c=inf@9",
        Duration::from_secs(5),
    );
    assert_eq!(run.failure, None);
    for (metric, ok) in [
        (Metric::TempGpuC, (0.0, 200.0)),
        (Metric::TempMemC, (0.0, 200.0)),
        (Metric::PowerW, (0.0, 5000.0)),
        (Metric::GpuUtilPct, (0.0, 100.0)),
        (Metric::MemUtilPct, (0.0, 100.0)),
    ] {
        let values = all_values(&run, 0, metric);
        assert!(!values.is_empty(), "{metric:?} has no history at all");
        assert!(
            values.iter().all(|v| (ok.0..=ok.1).contains(v)),
            "{metric:?} stored an implausible value: {values:?}"
        );
    }
    // The faulty ticks carry the value as absent, with a reason that quotes it.
    let hot = &run.ticks[5].samples[0];
    assert_eq!(hot.temp_gpu_c, None);
    assert_eq!(
        hot.why_absent("temp_gpu_c"),
        Some(&Absent::Error(
            "implausible value 1e9 °C from the driver".into()
        ))
    );
    assert_eq!(run.ticks[7].samples[0].gpu_util_pct, None);
    let f = run.finding("telemetry.implausible", 0).expect("finding");
    assert_eq!(f.severity, Severity::Warn);
    // The finding keeps the onset (the 1e9 °C tick) and the evidence of the latest occurrence.
    assert_eq!(f.time_ms, hot.time_ms);
    assert!(
        f.evidence.values["temp_mem_c"]
            .as_str()
            .unwrap()
            .contains("inf °C")
    );
    assert!(!f.advice.is_empty());
}

#[test]
fn a_counter_going_backwards_is_dropped_and_gives_no_negative_rate() {
    let run = pipeline(
        "two_gpus",
        "value:pcie_replay_count=1000@1..4#0;value:pcie_replay_count=3@4#0;\
         value:pcie_replay_count=1001@5..#0;value:energy_j=4e7@1..3#1;value:energy_j=10@3#1;\
         value:energy_j=40000001@4..#1",
        Duration::from_secs(5),
    );
    assert_eq!(run.failure, None);
    let replays = all_values(&run, 0, Metric::PcieReplayCount);
    assert!(!replays.contains(&3.0), "{replays:?}");
    assert!(replays.windows(2).all(|w| w[1] >= w[0]), "{replays:?}");
    let energy = all_values(&run, 1, Metric::EnergyJ);
    assert!(!energy.contains(&10.0), "{energy:?}");
    assert!(energy.windows(2).all(|w| w[1] >= w[0]), "{energy:?}");
    let f = run.finding("telemetry.implausible", 0).expect("device 0");
    assert!(
        f.evidence.values["pcie_replay_count"]
            .as_str()
            .unwrap()
            .contains("went backwards from 1000"),
        "{f:?}"
    );
    assert!(run.finding("telemetry.implausible", 1).is_some());
    // No rate rule fired on the dip.
    assert!(run.findings().iter().all(|f| f.id != "pcie.replay_rate"));
}

#[test]
fn a_gpu_lost_mid_session_is_marked_and_graded_once() {
    let run = pipeline("two_gpus", "lost@4#1", Duration::from_secs(5));
    assert_eq!(run.failure, None);
    let lost_at = run.ticks[4].samples[0].time_ms;
    let xid = run.finding("errors.xid_79", 1).expect("xid 79 graded");
    assert_eq!(xid.severity, Severity::Fail);
    let lost = run.finding("device.lost", 1).expect("device.lost");
    assert_eq!(lost.severity, Severity::Fail);
    assert_eq!(lost.time_ms, lost_at);
    assert!(lost.title.contains("GPU 1 is lost"), "{}", lost.title);
    // GPU 0 is untouched.
    assert!(run.finding("device.lost", 0).is_none());
    assert!(run.finding("errors.xid_79", 0).is_none());
    // From the loss on, GPU 1 has no values in history and every field says why.
    let last = run.pipeline.latest.get(&1).unwrap();
    assert_eq!(sanity::worst(last), Some(Health::Lost));
    assert_eq!(last.gpu_util_pct, None);
    assert!(
        run.pipeline
            .history
            .series(1, Metric::GpuUtilPct)
            .all(|(t, _)| t < lost_at)
    );
    assert!(
        run.pipeline
            .history
            .series(0, Metric::GpuUtilPct)
            .any(|(t, _)| t > lost_at)
    );
    let lost_events = run
        .pipeline
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::DeviceLost { .. }))
        .count();
    assert_eq!(lost_events, 1, "lost is announced once");
}

#[test]
fn a_hung_poll_is_marked_stalled_and_the_run_goes_on() {
    let run = pipeline("healthy", "hang:1500ms@2", Duration::from_millis(200));
    assert_eq!(run.failure, None);
    let stalled: Vec<&Tick> = run
        .ticks
        .iter()
        .filter(|t| {
            t.samples
                .iter()
                .any(|s| sanity::worst(s) == Some(Health::Stalled))
        })
        .collect();
    assert!(!stalled.is_empty(), "no stalled tick");
    let s = &stalled[0].samples[0];
    assert_eq!(s.gpu_util_pct, None);
    assert_eq!(
        s.why_absent("gpu_util_pct"),
        Some(&Absent::Error(
            "driver call did not return within 200 ms".into()
        ))
    );
    let f = run
        .finding("telemetry.stalled", 0)
        .expect("stalled finding");
    assert!(
        f.title.contains("did not return within 200 ms"),
        "{}",
        f.title
    );
    // Sampling resumed after the hang: later ticks have values again.
    let after = run
        .ticks
        .iter()
        .skip_while(|t| !std::ptr::eq(*t, stalled[stalled.len() - 1]))
        .skip(1)
        .find(|t| t.samples.iter().any(|s| s.gpu_util_pct.is_some()));
    assert!(after.is_some(), "no values after the stall");
    // The stall is said once as a notice, however many ticks it lasted.
    let notices = run
        .pipeline
        .events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Notice { message } if message.contains("did not return")))
        .count();
    assert_eq!(notices, 1);
}

#[test]
fn a_gpu_that_disappears_and_returns_is_marked_missing_then_back() {
    let run = pipeline("two_gpus", "gone@3..6#1", Duration::from_secs(5));
    assert_eq!(run.failure, None);
    for (i, t) in run.ticks.iter().enumerate() {
        let s = t
            .samples
            .iter()
            .find(|s| s.device == 1)
            .expect("marked, not dropped");
        let missing = sanity::worst(s) == Some(Health::Missing);
        assert_eq!(missing, (3..6).contains(&i), "tick {i}");
    }
    let f = run.finding("device.missing", 1).expect("device.missing");
    assert_eq!(f.severity, Severity::Warn);
    assert!(run.finding("device.missing", 0).is_none());
    // It came back: its newest sample is healthy.
    assert_eq!(sanity::worst(&run.pipeline.latest[&1]), None);
}

#[test]
fn a_field_made_unsupported_is_absent_with_its_reason_and_no_alarm() {
    let run = pipeline("demo", "unsupported:temp_gpu_c@0..", Duration::from_secs(5));
    assert_eq!(run.failure, None);
    assert!(all_values(&run, 0, Metric::TempGpuC).is_empty());
    let last = &run.pipeline.latest[&0];
    assert_eq!(last.temp_gpu_c, None);
    assert_eq!(last.why_absent("temp_gpu_c"), Some(&Absent::NotSupported));
    // Not supported is normal (fans on SXM parts): no health finding, and rules that need the
    // temperature stay quiet instead of judging a 0.
    let ids = run.ids();
    assert!(
        ids.iter()
            .all(|(id, _)| !id.starts_with("telemetry.") && !id.starts_with("device.")),
        "{ids:?}"
    );
    assert!(ids.iter().all(|(id, _)| id != "thermal.near_slowdown"));
}

#[test]
fn time_scheduled_faults_apply_by_wall_time() {
    // A replay played as fast as possible covers its ticks within milliseconds, so a fault from
    // 0 s on hits every tick and one from an hour on hits none.
    let run = pipeline(
        "healthy",
        "value:power_w=-1@0s..#0;value:fan_pct=500@1h..",
        Duration::from_secs(5),
    );
    assert!(all_values(&run, 0, Metric::PowerW).is_empty());
    let f = run.finding("telemetry.implausible", 0).unwrap();
    assert!(f.evidence.values.contains_key("power_w"));
    assert!(!f.evidence.values.contains_key("fan_pct"));
}

// ---------------------------------------------------------------------------------------------
// The terminal UI: the affected device is marked, findings say what happened

fn app_after(name: &str, spec: &str) -> App {
    let run = pipeline(name, spec, Duration::from_secs(5));
    let b = open(name);
    let mut app = App::new(AppInit {
        host: b.host().clone(),
        devices: b.devices().to_vec(),
        source: SourceKind::Replay {
            name: format!("{name}.ndjson"),
        },
        backend_name: b.header().backend.clone(),
        interval: Duration::from_secs(1),
        theme: Theme { color: false },
        can_signal: false,
        topology: None,
    });
    app.on_feed(
        SamplerMsg::Ticks {
            ticks: run.ticks,
            reset: false,
            position: None,
        },
        Instant::now(),
    );
    app.on_feed(SamplerMsg::Ended(None), Instant::now());
    app
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().to_string()
}

#[test]
fn tui_marks_a_lost_gpu_and_lists_the_findings() {
    let mut app = app_after("two_gpus", "lost@4#1;value:temp_gpu_c=1e9@2#0");
    app.panel = Panel::Devices;
    let devices = render(&app, 80, 24);
    assert!(devices.contains("✖ GPU LOST"), "{devices}");
    // GPU 0 is healthy at the end: one marker only.
    assert_eq!(devices.matches("GPU LOST").count(), 1, "{devices}");
    insta::assert_snapshot!("faults_lost_devices_80x24", devices);
    app.panel = Panel::Findings;
    let findings = render(&app, 120, 30);
    assert!(findings.contains("GPU 1 is lost"), "{findings}");
    assert!(findings.contains("XID 79"), "{findings}");
    assert!(
        findings.contains("GPU 0 reported values no working GPU"),
        "{findings}"
    );
    insta::assert_snapshot!("faults_lost_findings_120x30", findings);
}

#[test]
fn tui_marks_stalled_and_missing_gpus() {
    let mut app = app_after("two_gpus", "gone@8..#1");
    app.panel = Panel::Devices;
    let screen = render(&app, 80, 24);
    assert!(screen.contains("✖ MISSING"), "{screen}");
    // A stalled device, as the deadline marks it.
    let stalled = sanity::all_absent(
        0,
        app.session.pipeline.latest[&0].time_ms + 1,
        &sanity::stalled_reason(Duration::from_millis(2000)),
    );
    app.push_tick(Tick {
        samples: vec![stalled],
        events: vec![],
        ras: Vec::new(),
        kernels: None,
    });
    let screen = render(&app, 80, 24);
    assert!(screen.contains("STALLED"), "{screen}");
    assert!(screen.contains("✖ MISSING"), "{screen}");
}

// ---------------------------------------------------------------------------------------------
// End to end: the binary with GPUDIAG_TEST_FAULTS over recordings

/// `gpudiag ARGS` with these faults injected into its backend.
fn gpudiag(faults: &str, args: &[&str]) -> Out {
    Out::of(
        crate::support::gpudiag()
            .env(FAULTS_ENV, faults)
            .args(args)
            .timeout(Duration::from_secs(120)),
    )
}

fn validator(name: &str) -> jsonschema::Validator {
    let path = root().join("assets/schema").join(name);
    let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn assert_valid(v: &jsonschema::Validator, instance: &Value, what: &str) {
    let errors: Vec<String> = v
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}");
}

/// (id, device) of every finding in a check report, devices' and host's.
fn report_findings(report: &Value) -> Vec<(String, Option<u64>, String)> {
    let mut out = Vec::new();
    for d in report["devices"].as_array().unwrap() {
        for f in d["findings"].as_array().unwrap() {
            out.push((
                f["id"].as_str().unwrap().to_owned(),
                f["device"].as_u64(),
                f["severity"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for f in report["host_findings"].as_array().unwrap() {
        out.push((
            f["id"].as_str().unwrap().to_owned(),
            None,
            f["severity"].as_str().unwrap().to_owned(),
        ));
    }
    out
}

fn has(findings: &[(String, Option<u64>, String)], id: &str, device: u64, severity: &str) -> bool {
    findings
        .iter()
        .any(|f| f.0 == id && f.1 == Some(device) && f.2 == severity)
}

#[test]
fn check_json_stays_schema_valid_and_carries_every_fault() {
    let out = gpudiag(
        "value:temp_gpu_c=1e9@5;value:power_w=-50@6;hang:1s@8;lost@300",
        &["check", "--json", "--demo", "--poll-timeout", "100ms"],
    );
    assert_eq!(out.code, 1, "device.lost fails the check: {}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_valid(
        &validator("check-report.schema.json"),
        &report,
        "check report",
    );
    let f = report_findings(&report);
    assert!(has(&f, "telemetry.implausible", 0, "warn"), "{f:?}");
    assert!(has(&f, "telemetry.stalled", 0, "warn"), "{f:?}");
    assert!(has(&f, "device.lost", 0, "fail"), "{f:?}");
    assert!(has(&f, "errors.xid_79", 0, "fail"), "{f:?}");
    // The summary never saw the absurd values.
    let temp_max = report["devices"][0]["summary"]["temp_gpu_c"]["max"]
        .as_f64()
        .unwrap();
    assert!(temp_max < 200.0, "{temp_max}");
    let power_min = report["devices"][0]["summary"]["power_w"]["min"]
        .as_f64()
        .unwrap();
    assert!(power_min >= 0.0, "{power_min}");
    // The end state: the GPU is lost, its values null with the reason.
    let latest = &report["devices"][0]["latest"];
    assert!(latest["gpu_util_pct"].is_null());
    assert_eq!(latest["absent"]["gpu_util_pct"], "gpu_lost");
    // The stall is also a warning of the source, said once.
    let warnings: Vec<&str> = report["source"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|w| w.contains("did not return within 100 ms"))
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", report["source"]["warnings"]);
}

#[test]
fn check_text_says_what_happened() {
    let out = gpudiag(
        "lost@3#1;gone@2..4#0",
        &["check", "--replay", s(&fixture("two_gpus.ndjson"))],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stdout.contains("GPU 1 is lost"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("GPU 0 dropped out of the driver's device list"),
        "{}",
        out.stdout
    );
}

#[test]
fn record_of_a_faulty_run_replays_with_the_same_findings() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("faulty.ndjson");
    let out = gpudiag(
        "value:power_w=-50@10;gone@50..60;hang:1s@100;lost@200",
        &["record", "-o", s(&rec), "--demo", "--poll-timeout", "100ms"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Every line of the recording is valid, and no implausible number was written.
    let v = validator("recording.schema.json");
    let text = std::fs::read_to_string(&rec).unwrap();
    let mut lines = 0;
    for (i, line) in text.lines().enumerate() {
        let value: Value = serde_json::from_str(line).unwrap();
        assert_valid(&v, &value, &format!("line {}", i + 1));
        if value["kind"] == "sample" {
            assert!(
                value["power_w"].as_f64().is_none_or(|p| p >= 0.0),
                "line {}",
                i + 1
            );
        }
        lines += 1;
    }
    assert!(lines > 300, "{lines} lines");
    // Replayed without faults, the recording tells the same story.
    let out = Command::cargo_bin("gpudiag")
        .unwrap()
        .env(
            "XDG_CONFIG_HOME",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-config"),
        )
        .env_remove(FAULTS_ENV)
        .args(["check", "--json", "--replay", s(&rec)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid(
        &validator("check-report.schema.json"),
        &report,
        "replayed check",
    );
    let f = report_findings(&report);
    for (id, severity) in [
        ("telemetry.implausible", "warn"),
        ("device.missing", "warn"),
        ("telemetry.stalled", "warn"),
        ("device.lost", "fail"),
        ("errors.xid_79", "fail"),
    ] {
        assert!(has(&f, id, 0, severity), "{id}: {f:?}");
    }
}

#[test]
fn trace_of_a_faulty_run_is_valid_and_shows_the_faults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let out = gpudiag(
        "value:temp_gpu_c=1e9@3;lost@5#1",
        &[
            "trace",
            "-o",
            s(&path),
            "--replay",
            s(&fixture("two_gpus.ndjson")),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_valid(&validator("chrome-trace.schema.json"), &trace, "trace");
    let events = trace["traceEvents"].as_array().unwrap();
    let text = serde_json::to_string(events).unwrap();
    assert!(text.contains("device.lost"), "no device.lost instant");
    assert!(
        text.contains("telemetry.implausible"),
        "no implausible instant"
    );
    assert!(
        !text.contains("1000000000"),
        "the absurd value reached the trace"
    );
}

fn get(addr: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.") && out.contains(" 200 "), "{out}");
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

#[test]
fn serve_keeps_answering_through_faults() {
    // serve plays a replay at its recorded pace (a tick a second here), so the poll deadline
    // must be longer than that spacing, and the injected hang longer than the deadline.
    let served = serve_with(
        &[
            "--poll-timeout",
            "2s",
            "--replay",
            s(&fixture("two_gpus.ndjson")),
        ],
        &[(FAULTS_ENV, "value:temp_gpu_c=1e9@1#0;hang:4s@2;lost@3#1")],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let body = get(&served.addr);
        if body.lines().any(|l| l == "gpudiag_source_ended 1") || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("gpudiag_source_ended 1"), "{body}");
    for id in ["device.lost", "telemetry.implausible", "telemetry.stalled"] {
        assert!(
            body.lines()
                .any(|l| l.starts_with("gpudiag_finding{") && l.contains(&format!("id=\"{id}\""))),
            "{id} missing: {body}"
        );
    }
    // The lost GPU's values are left out, never exported as 0; GPU 0 goes on.
    let temps: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{"))
        .collect();
    assert_eq!(temps.len(), 1, "{temps:?}");
    assert!(temps[0].contains("gpu=\"0\""), "{temps:?}");
    assert!(
        !body.contains("1e+09") && !body.contains("1000000000"),
        "{body}"
    );
}

#[test]
fn a_bad_schedule_is_a_usage_error_that_quotes_it() {
    let out = gpudiag("value:temp_gpu_c=hot@1", &["check", "--demo"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains(FAULTS_ENV), "{}", out.stderr);
    assert!(
        out.stderr.contains("'hot' is not a number"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_permanently_hung_call_leaves_record_killable_and_its_file_valid() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("hung.ndjson");
    // The hang never ends: every later poll is answered "stalled" at the deadline.
    let mut child = StdCommand::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["record", "-o", s(&rec), "--poll-timeout", "100ms"])
        .args(["--replay", s(&fixture("two_gpus.ndjson"))])
        .env(FAULTS_ENV, "hang:1h@2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until stalled ticks are being written: the poll is stuck for good by then.
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&rec).unwrap_or_default();
        if text.contains("did not return within 100 ms") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no stalled tick recorded: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: signals our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("record did not end after SIGINT with a hung driver call");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    // The file is complete and valid, and replays with the stall as a finding.
    let v = validator("recording.schema.json");
    for (i, line) in std::fs::read_to_string(&rec).unwrap().lines().enumerate() {
        let value: Value = serde_json::from_str(line).unwrap();
        assert_valid(&v, &value, &format!("line {}", i + 1));
    }
    let out = Command::cargo_bin("gpudiag")
        .unwrap()
        .env_remove(FAULTS_ENV)
        .args(["check", "--json", "--replay", s(&rec)])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = report_findings(&report);
    assert!(has(&f, "telemetry.stalled", 0, "warn"), "{f:?}");
    assert!(has(&f, "telemetry.stalled", 1, "warn"), "{f:?}");
}
