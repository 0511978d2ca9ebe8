//! Every view judges the same data the same way: each fixture recording and the demo go through
//! `check --json`, `trace`, `report`'s bundle, the terminal UI at the recording's end, `serve`'s
//! snapshot once the replay played out, and `run`'s conclusion (through the library, on a
//! replay source: `run` itself watches a live command). Each must give the same findings (id,
//! device, severity) and the same verdict per GPU over the same window, the whole recording;
//! `serve` publishes what is active at the end, so it is compared with the active ones.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpudiag::tui::app::{App, AppInit, SourceKind};
use gpudiag::tui::theme::Theme;
use gpudiag_core::config::Config;
use gpudiag_core::session::{DEMO_RECORDING, Origin, SourceSpec, open_source};
use gpudiag_model::finding::{Finding, FindingState};
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::sampler::SamplerMsg;
use gpudiag_telemetry::{Backend, Tick};
use serde_json::Value;

use crate::support::{self, at};

/// A finding as every view can name it.
type Key = (String, Option<u32>, String);
/// A verdict as every view can name it: (bottleneck, confidence, basis).
type VerdictKey = (String, String, String);
/// The job verdicts as the views that carry them name them: by (joined_by, key), the pattern
/// and the first straggler's device.
type Jobs = BTreeMap<(String, String), (String, Option<u32>)>;

/// The jobs of a serialised list of job verdicts (`check --json`'s `jobs`).
fn jobs_of(list: &Value) -> Jobs {
    list.as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let s = |v: &Value| v.as_str().unwrap().to_owned();
            (
                (s(&j["job"]["joined_by"]), s(&j["job"]["key"])),
                (
                    s(&j["verdict"]),
                    j["stragglers"][0]["device"].as_u64().map(|d| d as u32),
                ),
            )
        })
        .collect()
}

#[derive(Debug, Default, PartialEq)]
struct View {
    findings: BTreeSet<Key>,
    /// The findings still active at the end.
    active: BTreeSet<Key>,
    verdicts: BTreeMap<u32, VerdictKey>,
}

fn key(f: &Finding) -> Key {
    (f.id.clone(), f.device, f.severity.to_string())
}

fn json_key(f: &Value) -> Key {
    (
        f["id"].as_str().unwrap().to_owned(),
        f["device"].as_u64().map(|d| d as u32),
        f["severity"].as_str().unwrap().to_owned(),
    )
}

fn json_verdict(v: &Value) -> VerdictKey {
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    (s("bottleneck"), s("confidence"), s("basis"))
}

fn verdict_key(v: &impl serde::Serialize) -> VerdictKey {
    let json = serde_json::to_value(v).unwrap();
    json_verdict(&json)
}

fn recordings() -> Vec<PathBuf> {
    let root = at("tests/fixtures");
    let mut out: Vec<PathBuf> = ["recordings", "workloads"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root.join(dir)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".ndjson") || name.ends_with(".ndjson.gz")
        })
        .collect();
    out.sort();
    out
}

fn gpudiag(args: &[&str]) -> std::process::Output {
    support::gpudiag()
        .args(["--config", "/dev/null"])
        .args(args)
        .output()
        .unwrap()
}

/// `check --json` over the whole recording.
fn check_view(replay: &[&str]) -> View {
    view_of_check_report(&check_report(replay))
}

fn check_report(replay: &[&str]) -> Value {
    let out = gpudiag(&[&["check", "--json"], replay].concat());
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

fn view_of_check_report(report: &Value) -> View {
    let mut view = View::default();
    let devices = report["devices"].as_array().unwrap();
    let findings = devices
        .iter()
        .flat_map(|d| d["findings"].as_array().unwrap())
        .chain(report["host_findings"].as_array().unwrap());
    for f in findings {
        view.findings.insert(json_key(f));
        if f["state"] == "active" {
            view.active.insert(json_key(f));
        }
    }
    for d in devices {
        if !d["verdict"].is_null() {
            let index = d["info"]["index"].as_u64().unwrap() as u32;
            view.verdicts.insert(index, json_verdict(&d["verdict"]));
        }
    }
    view
}

/// `report`'s bundle: its check report, judged from the bundle's own recording.
fn report_view(replay: &[&str]) -> View {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle.tar.gz");
    let out = gpudiag(&[&["report", "--output", bundle.to_str().unwrap()], replay].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::fs::File::open(&bundle).unwrap();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().ends_with("check-report.json") {
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            return view_of_check_report(&serde_json::from_str(&text).unwrap());
        }
    }
    panic!("the bundle holds no check-report.json");
}

/// `trace`: its findings, and its verdict on the whole capture per GPU.
fn trace_view(replay: &[&str]) -> (BTreeSet<Key>, BTreeMap<u32, VerdictKey>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let out = gpudiag(&[&["trace", "--output", path.to_str().unwrap()], replay].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut findings = BTreeSet::new();
    let mut verdicts = BTreeMap::new();
    for e in trace["traceEvents"].as_array().unwrap() {
        let cat = e["cat"].as_str().unwrap_or_default();
        if cat.starts_with("finding,") {
            findings.insert(json_key(&e["args"]));
        } else if cat == "verdict,overall" {
            let device = e["args"]["device"].as_u64().unwrap() as u32;
            let previous = verdicts.insert(device, json_verdict(&e["args"]));
            assert!(previous.is_none(), "two overall verdicts for GPU {device}");
        }
    }
    (findings, verdicts)
}

fn spec(path: Option<&Path>) -> SourceSpec {
    SourceSpec::new(match path {
        Some(p) => Origin::File(p.to_path_buf()),
        None => Origin::Demo,
    })
}

/// `run`'s conclusion over the recording, from its first sample to its last.
fn run_view(path: Option<&Path>) -> View {
    let source = open_source(&spec(path), Pace::AsFastAsPossible, false).unwrap();
    let concluded = gpudiag::commands::run::conclusion_of(source, &Config::default());
    let mut view = View::default();
    for f in &concluded.findings {
        view.findings.insert(key(f));
        if f.state == FindingState::Active {
            view.active.insert(key(f));
        }
    }
    for d in &concluded.devices {
        if let Some(v) = &d.verdict {
            view.verdicts.insert(d.index, verdict_key(v));
        }
    }
    view
}

/// What `serve` publishes once the replay played out.
fn serve_view(path: Option<&Path>) -> View {
    let source = open_source(&spec(path), Pace::AsFastAsPossible, false).unwrap();
    let snapshot = gpudiag::commands::serve::snapshot_at_end(source, &Config::default());
    assert!(snapshot.source_ended);
    // What a scrape reads: the exposition's finding series.
    let text = gpudiag_export::prometheus::render(&snapshot, Instant::now());
    let mut view = View::default();
    for line in text.lines().filter(|l| l.starts_with("gpudiag_finding{")) {
        // A label starts the set or follows a comma: `pci_bus_id="..."` is not `id`.
        let label = |name: &str| {
            let at = ["{", ","]
                .iter()
                .find_map(|before| line.find(&format!("{before}{name}=\"")))?
                + name.len()
                + 3;
            let end = line[at..].find('"')?;
            Some(line[at..at + end].to_owned())
        };
        view.active.insert((
            label("id").unwrap(),
            label("gpu").map(|g| g.parse().unwrap()),
            label("severity").unwrap(),
        ));
    }
    view.findings = snapshot.findings.iter().map(key).collect();
    view.verdicts = snapshot
        .verdicts
        .iter()
        .map(|(d, v)| (*d, verdict_key(v)))
        .collect();
    view
}

/// The terminal UI once it has played the whole recording: its findings and verdicts, and its
/// jobs.
fn tui_view(path: Option<&Path>) -> (View, Jobs) {
    let mut backend = match path {
        Some(p) => ReplayBackend::open(p, Pace::AsFastAsPossible).unwrap(),
        None => ReplayBackend::from_reader(DEMO_RECORDING, Pace::AsFastAsPossible).unwrap(),
    };
    let mut app = App::new(AppInit {
        host: backend.host().clone(),
        devices: backend.devices().to_vec(),
        source: SourceKind::Replay {
            name: "fixture".into(),
        },
        backend_name: backend.header().backend.clone(),
        interval: Duration::from_secs(1),
        theme: Theme { color: false },
        can_signal: false,
        topology: backend.topology(),
    });
    app.set_recorded(backend.recorded_findings());
    let mut ticks: Vec<Tick> = Vec::new();
    while let Ok(t) = backend.poll() {
        ticks.push(t);
    }
    let position = Some(backend.position());
    app.on_feed(
        SamplerMsg::Ticks {
            ticks,
            reset: false,
            position,
        },
        Instant::now(),
    );
    app.on_feed(SamplerMsg::Ended(None), Instant::now());
    app.refresh_findings();
    let mut view = View::default();
    for f in &app.findings {
        view.findings.insert(key(f));
        if f.state == FindingState::Active {
            view.active.insert(key(f));
        }
    }
    view.verdicts = app
        .session
        .pipeline
        .engine
        .verdicts()
        .iter()
        .map(|(d, v)| (*d, verdict_key(v)))
        .collect();
    (view, jobs_of(&serde_json::to_value(&app.jobs).unwrap()))
}

fn assert_views_agree(name: &str, path: Option<&Path>, with_bundle: bool) {
    let path_str = path.map(|p| p.to_str().unwrap().to_owned());
    let replay: Vec<&str> = match &path_str {
        Some(p) => vec!["--replay", p],
        None => vec!["--demo"],
    };
    let report = check_report(&replay);
    let check = view_of_check_report(&report);
    let (tui, tui_jobs) = tui_view(path);
    let views = [("the terminal UI", tui), ("run", run_view(path))];
    for (view, got) in &views {
        assert_eq!(&check, got, "{name}: check and {view} disagree");
    }
    let check_jobs = jobs_of(&report["jobs"]);
    assert_eq!(
        check_jobs, tui_jobs,
        "{name}: check's and the terminal UI's jobs disagree"
    );
    if name == "job8_straggler.ndjson" {
        let straggler = (
            ("run_id".to_owned(), "synthetic-run".to_owned()),
            ("straggler".to_owned(), Some(5)),
        );
        assert_eq!(
            check_jobs.into_iter().collect::<Vec<_>>(),
            [straggler],
            "{name}"
        );
    }
    let serve = serve_view(path);
    assert_eq!(
        check.active, serve.active,
        "{name}: check's active findings and serve's series disagree"
    );
    assert_eq!(
        check.active, serve.findings,
        "{name}: check's active findings and serve's disagree"
    );
    assert_eq!(check.verdicts, serve.verdicts, "{name}: check and serve");
    let (trace_findings, trace_verdicts) = trace_view(&replay);
    assert_eq!(check.findings, trace_findings, "{name}: check and trace");
    assert_eq!(
        check.verdicts, trace_verdicts,
        "{name}: check's and trace's verdicts"
    );
    if with_bundle && path.is_some() {
        assert_eq!(check, report_view(&replay), "{name}: check and report");
    }
}

#[test]
fn every_view_gives_the_same_findings_and_verdicts_for_every_fixture() {
    let all = recordings();
    assert!(all.len() >= 10, "fixtures: {all:?}");
    for (i, path) in all.iter().enumerate() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // One bundle is enough: it judges its own copy of the recording with check's code.
        assert_views_agree(&name, Some(path), i == 0);
    }
}

#[test]
fn every_view_gives_the_same_findings_and_verdicts_for_the_demo() {
    let check = check_view(&["--demo"]);
    assert!(
        !check.findings.is_empty() && !check.verdicts.is_empty(),
        "the demo has findings and verdicts to compare: {check:?}"
    );
    assert_views_agree("demo", None, false);
}

/// A rule written once reaches every view: the power-limit rule (one file and one entry in the
/// rules' family table) on a GPU capped at 400 W of its 700 W default.
#[test]
fn a_capped_power_limit_reaches_every_view() {
    let root = at("tests/fixtures/recordings");
    let capped = root.join("power_capped.ndjson");
    let check = check_view(&["--replay", capped.to_str().unwrap()]);
    let finding = (
        "power.limit_below_default".to_owned(),
        Some(0),
        "warn".to_owned(),
    );
    assert!(check.findings.contains(&finding), "{check:?}");
    assert!(check.active.contains(&finding), "{check:?}");
    assert_views_agree("power_capped.ndjson", Some(&capped), false);
    // The same GPU at its default limit raises nothing.
    let healthy = check_view(&["--replay", root.join("healthy.ndjson").to_str().unwrap()]);
    assert!(
        !healthy.findings.iter().any(|f| f.0.starts_with("power.")),
        "{healthy:?}"
    );
}
