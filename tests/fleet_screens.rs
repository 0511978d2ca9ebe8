//! The fleet UI's screens, drawn into ratatui's `TestBackend` from a real `gpudiag fleet --json`
//! document (tests/fixtures/fleet/three-nodes.json: a down target, an 8-GPU job whose GPU 5 is
//! the straggler, a balanced 2-GPU Slurm job) and variations of it. Each screen is kept as text
//! in assets/screens/fleet-*.txt; the test fails when the UI draws something else.
//! `GPUDIAG_UPDATE_SCREENS=1 cargo nextest run --locked --test e2e fleet_screens::` rewrites them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use gpudiag::tui::fleet::state::{Grouping, Row};
use gpudiag::tui::fleet::worker::Report;
use gpudiag::tui::fleet::{self, State, View};
use gpudiag::tui::theme::Theme;
use gpudiag_fleet::model::{Fleet, GpuVerdict, NodeDetail, Process, RulesState};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::support::at;

const UPDATE: &str = "GPUDIAG_UPDATE_SCREENS";

fn screens_dir() -> PathBuf {
    at("assets/screens")
}

fn fixture() -> Fleet {
    let path = at("tests/fixtures/fleet/three-nodes.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture read 3 s ago, as the UI holds it.
fn state_of(fleet: Fleet) -> State {
    State::new("http://127.0.0.1:19090".into(), Duration::from_secs(5)).with_fleet(fleet, 3000)
}

fn press(state: &mut State, keys: &[KeyCode]) {
    for &k in keys {
        state.on_key(KeyEvent::new(k, KeyModifiers::NONE));
    }
}

fn render(state: &mut State, width: u16, height: u16) -> String {
    state.viewport = (width, height);
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    let theme = Theme { color: false };
    terminal.draw(|f| fleet::draw(f, state, &theme)).unwrap();
    let buf = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width)
            .map(|x| buf[(x, y)].symbol().to_owned())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The fixture with the shipped rules absent: no judgement across nodes, no window averages.
fn without_rules() -> Fleet {
    let mut fleet = fixture();
    fleet.rules = RulesState::NotLoaded;
    for job in &mut fleet.jobs {
        job.across_nodes = None;
        for g in &mut job.gpus {
            g.sm_active_pct = None;
            g.util_pct = None;
        }
    }
    fleet
}

/// The fixture with gpu-node-11 seen through dcgm-exporter only: no verdict, finding or job.
fn dcgm_exporter_only() -> Fleet {
    let mut fleet = fixture();
    let node = fleet
        .nodes
        .iter_mut()
        .find(|n| n.name == "gpu-node-11")
        .unwrap();
    for gpu in &mut node.gpus {
        gpu.verdict = GpuVerdict::DcgmExporterOnly;
        gpu.findings.clear();
        gpu.jobs.clear();
        gpu.tensor_active_pct = None;
        gpu.pod = Some(gpudiag_fleet::model::PodRef {
            namespace: Some("train".into()),
            pod: "bert-0".into(),
            container: None,
        });
    }
    fleet.jobs.retain(|j| j.job_key != "9001");
    fleet.counts.gpus_judged -= 2;
    fleet.counts.gpus_dcgm_exporter_only = 2;
    fleet
}

/// A node's charts and processes as `read_node` gives them: 30 minutes at 15 s, GPU 5 twice as
/// busy as the others, a gap where scrapes failed.
fn detail_of(fleet: &Fleet, node: &str) -> NodeDetail {
    let node = fleet.node(node).unwrap();
    let end = fleet.evaluated_at_ms;
    let start = end - 30 * 60 * 1000;
    let mut charts = BTreeMap::new();
    for (i, gpu) in node.gpus.iter().enumerate() {
        let busy = if gpu.gpu.as_deref() == Some("5") {
            88.0
        } else {
            44.0
        };
        let points = |level: f64| -> Vec<(i64, f64)> {
            (0..=120)
                .filter(|k| !(40..48).contains(k))
                .map(|k| {
                    let ramp = (k as f64 / 20.0).min(1.0);
                    (start + k * 15_000, level * ramp)
                })
                .collect()
        };
        let mut per = BTreeMap::new();
        per.insert("util_pct".to_owned(), points(100.0));
        per.insert("sm_active_pct".to_owned(), points(busy + i as f64 * 0.1));
        per.insert("power_w".to_owned(), points(gpu.power_w.unwrap()));
        per.insert(
            "temperature_c".to_owned(),
            points(gpu.temperature_c.unwrap()),
        );
        per.insert(
            "memory_used_mib".to_owned(),
            points(gpu.memory_used_mib.unwrap()),
        );
        charts.insert(gpu.uuid.clone().unwrap(), per);
    }
    let processes = node
        .gpus
        .iter()
        .map(|g| Process {
            gpu: g.gpu.clone(),
            uuid: g.uuid.clone(),
            pid: format!(
                "{}",
                41000 + g.gpu.as_deref().unwrap().parse::<u32>().unwrap()
            ),
            name: Some("python3".into()),
            user: Some("alice".into()),
            slurm_job: None,
            pod: None,
            memory_used_bytes: Some(62.5 * 1024.0 * 1024.0 * 1024.0),
            sm_util_pct: g.sm_active_pct,
            verdict: Some("waiting_for_peer".into()),
        })
        .collect();
    NodeDetail {
        node: node.name.clone(),
        start_ms: start,
        end_ms: end,
        step_s: 15.0,
        charts,
        processes,
        processes_absent: None,
        degraded: Vec::new(),
        queries: Default::default(),
    }
}

fn failed_read() -> Fleet {
    let mut failed = fixture();
    failed.nodes.clear();
    failed.jobs.clear();
    failed.could_not_run = Some(
        "Prometheus at http://127.0.0.1:19090 answered something else than its API: \
         expected JSON, got text/html"
            .into(),
    );
    failed
}

/// One screen: its file name and the state it draws.
struct Scene {
    name: &'static str,
    width: u16,
    height: u16,
    state: State,
}

fn scenes() -> Vec<Scene> {
    let mut scenes = Vec::new();
    let mut add = |name, width, height, state| {
        scenes.push(Scene {
            name,
            width,
            height,
            state,
        })
    };

    add("fleet-table-120x24", 120, 24, state_of(fixture()));

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Down, KeyCode::Right]);
    add("fleet-table-expanded-120x24", 120, 24, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Down, KeyCode::Right]);
    add("fleet-table-expanded-80x24", 80, 24, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Char('g')]);
    add("fleet-by-job-120x24", 120, 24, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    add("fleet-job-rules-loaded-120x24", 120, 24, s);

    let mut s = state_of(without_rules());
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    add("fleet-job-rules-not-loaded-120x24", 120, 24, s);

    let fleet = fixture();
    let detail = detail_of(&fleet, "dgx-synthetic");
    let mut s = state_of(fleet);
    press(&mut s, &[KeyCode::Down, KeyCode::Enter]);
    s.on_report(Report::Node(Box::new(detail)));
    add("fleet-node-120x40", 120, 40, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Down, KeyCode::Enter]);
    add("fleet-node-loading-120x24", 120, 24, s);

    let fleet = dcgm_exporter_only();
    let mut s = state_of(fleet);
    press(&mut s, &[KeyCode::Char('E')]);
    add("fleet-dcgm-exporter-only-120x24", 120, 24, s);

    let fleet = dcgm_exporter_only();
    let mut detail = detail_of(&fleet, "gpu-node-11");
    detail.processes.clear();
    detail.processes_absent = Some("n/a: dcgm-exporter only".into());
    let mut s = state_of(fleet);
    press(&mut s, &[KeyCode::End, KeyCode::Enter]);
    s.on_report(Report::Node(Box::new(detail)));
    add("fleet-node-dcgm-exporter-only-120x24", 120, 24, s);

    let mut s = state_of(fixture());
    s.on_report(Report::Fleet(Box::new(failed_read())));
    s.now_ms += 42_000;
    add("fleet-error-kept-120x24", 120, 24, s);

    let mut s = State::new("http://127.0.0.1:19090".into(), Duration::from_secs(5));
    s.now_ms = 1_795_689_965_196;
    s.on_report(Report::Fleet(Box::new(failed_read())));
    add("fleet-error-first-read-120x24", 120, 24, s);

    let mut s = State::new("http://127.0.0.1:19090".into(), Duration::from_secs(5));
    s.on_report(Report::ReadStarted);
    // A slow Prometheus: the first read has run for 12 s and the UI says so.
    s.now_ms += 12_000;
    add("fleet-reading-120x24", 120, 24, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Char('a')]);
    add("fleet-alerts-120x24", 120, 24, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Char('/')]);
    for c in "h200".chars() {
        press(&mut s, &[KeyCode::Char(c)]);
    }
    add("fleet-filter-120x24", 120, 24, s);

    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Char('?')]);
    add("fleet-help-80x24", 80, 24, s);

    scenes
}

#[test]
fn committed_screens_match_what_the_ui_draws() {
    let update = std::env::var_os(UPDATE).is_some();
    let dir = screens_dir();
    let mut stale = Vec::new();
    for mut scene in scenes() {
        let text = render(&mut scene.state, scene.width, scene.height);
        let path = dir.join(format!("{}.txt", scene.name));
        if update {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            eprintln!("{} draws now:\n{text}", scene.name);
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date with the UI: {}\nregenerate them: {UPDATE}=1 cargo nextest run --locked \
         --test e2e fleet_screens::",
        stale.join(", ")
    );
}

/// No fleet screen is left behind by a scene that was renamed or removed.
#[test]
fn every_committed_fleet_screen_has_a_scene() {
    let names: Vec<String> = scenes().iter().map(|s| format!("{}.txt", s.name)).collect();
    let orphans: Vec<String> = std::fs::read_dir(screens_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fleet-") && n.ends_with(".txt") && !names.contains(n))
        .collect();
    assert!(orphans.is_empty(), "screens no scene draws: {orphans:?}");
}

fn line_with<'a>(screen: &'a str, needle: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in\n{screen}"))
}

#[test]
fn the_job_view_marks_the_straggler_and_the_rules_judgement() {
    let mut s = state_of(fixture());
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    assert_eq!(s.view, View::Job("synthetic-run".into()));
    let screen = render(&mut s, 120, 24);
    let straggler = line_with(&screen, "◀ straggler");
    assert!(straggler.contains("dgx-synthetic"), "{straggler}");
    assert!(straggler.contains(" 5 "), "{straggler}");
    assert!(straggler.contains("88%"), "{straggler}");
    assert!(screen.contains("across nodes (shipped rules): straggler (firing)"));
    assert!(!screen.contains("not loaded"));

    let mut s = state_of(without_rules());
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    let screen = render(&mut s, 200, 30);
    assert!(
        screen.contains(fleet::job_view::RULES_NOT_LOADED),
        "{screen}"
    );
    // The node's own verdict still names the straggler.
    assert!(line_with(&screen, "◀ straggler").contains("dgx-synthetic"));
    assert!(screen.contains("dgx-synthetic: straggler"), "{screen}");
}

/// A job that makes no progress says so first in its view: the verdict, how long, who judged
/// it and the rank its GPUs wait for, escaped.
#[test]
fn the_job_view_says_first_that_a_job_is_stalled_and_which_rank_it_waits_for() {
    use gpudiag_fleet::model::{JobStall, MissingRank};
    let mut fleet = fixture();
    let job = fleet
        .jobs
        .iter_mut()
        .find(|j| j.job_key == "synthetic-run")
        .unwrap();
    job.stall = Some(JobStall {
        verdict: "rank_stopped".into(),
        nodes: vec!["dgx-synthetic".into()],
        stuck_s: Some(74.6),
        missing: vec![MissingRank {
            node: "dgx-synthetic".into(),
            gpu: Some("5".into()),
            uuid: None,
            rank: Some("5".into()),
            pid: Some("4553\x1b[2J".into()),
            state: Some("stopped".into()),
        }],
        across_nodes: None,
    });
    let mut s = state_of(fleet);
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    assert_eq!(s.view, View::Job("synthetic-run".into()));
    let screen = render(&mut s, 200, 30);
    let stalled = line_with(&screen, "STALLED: ");
    assert!(
        stalled.contains(
            "STALLED: rank_stopped for 75 s, seen by dgx-synthetic; waits for rank 5 (GPU 5 of \
             dgx-synthetic, pid 4553\\x1b[2J, stopped)"
        ),
        "{stalled}"
    );
    let at = |needle: &str| screen.find(needle).unwrap();
    assert!(
        at("STALLED: ") < at("across nodes (shipped rules)"),
        "{screen}"
    );
}

/// Two GPUs of the job lead together: the rules' alerts and the node's roles name both, and
/// the job view marks each; a key whose GPUs repeat a rank is said not judged, and why.
#[test]
fn the_job_view_names_every_straggler_and_a_doubted_key() {
    use gpudiag_fleet::model::{NodeGpu, Straggler};
    let mut fleet = fixture();
    let job = fleet
        .jobs
        .iter_mut()
        .find(|j| j.job_key == "synthetic-run")
        .unwrap();
    let uuid = job.gpus[2].uuid.clone();
    let across = job.across_nodes.as_mut().unwrap();
    across.stragglers.push(Straggler {
        node: Some("dgx-synthetic".into()),
        gpu: Some("2".into()),
        uuid: Some(uuid.clone()),
        pace: Some("leads".into()),
        state: "firing".into(),
    });
    job.per_node[0].stragglers.insert(
        0,
        NodeGpu {
            gpu: Some("2".into()),
            uuid: Some(uuid),
        },
    );
    job.gpus[2].straggler = true;
    job.gpus[2].role = Some("straggler".into());
    let mut s = state_of(fleet.clone());
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    let screen = render(&mut s, 160, 24);
    let marked: Vec<&str> = screen
        .lines()
        .filter(|l| l.contains("◀ straggler (leads)"))
        .collect();
    assert_eq!(marked.len(), 2, "{screen}");
    assert!(
        screen.contains("stragglers dgx-synthetic GPU 5 (leads), dgx-synthetic GPU 2 (leads)"),
        "{screen}"
    );
    assert!(
        screen.contains("dgx-synthetic: straggler (high) · straggler GPUs 2, 5"),
        "{screen}"
    );
    assert!(
        line_with(&screen, "   0     0 ").ends_with("waiting"),
        "{screen}"
    );

    let job = fleet
        .jobs
        .iter_mut()
        .find(|j| j.job_key == "synthetic-run")
        .unwrap();
    job.across_nodes = None;
    job.doubts = vec!["rank 0 held by two GPUs or more: the key joins two jobs".into()];
    let mut s = state_of(fleet);
    press(&mut s, &[KeyCode::Char('g'), KeyCode::Enter]);
    let screen = render(&mut s, 160, 24);
    assert!(
        screen.contains("across nodes: not judged: rank 0 held by two GPUs or more"),
        "{screen}"
    );
}

#[test]
fn dcgm_exporter_only_gpus_say_so_instead_of_a_verdict() {
    let mut s = state_of(dcgm_exporter_only());
    press(&mut s, &[KeyCode::Char('E')]);
    let screen = render(&mut s, 120, 24);
    let gpu = screen
        .lines()
        .find(|l| l.contains("GPU 0") && l.contains("H200"))
        .unwrap();
    assert!(gpu.contains("n/a: dcgm-exporter only"), "{gpu}");
    assert!(gpu.contains("train/bert-0"), "{gpu}");
    // Absent figures are n/a, never 0.
    assert!(gpu.contains("n/a"), "{gpu}");
}

#[test]
fn a_failed_read_is_one_line_over_the_last_good_fleet() {
    let mut s = state_of(fixture());
    s.on_report(Report::Fleet(Box::new(failed_read())));
    let screen = render(&mut s, 120, 24);
    let warn: Vec<&str> = screen.lines().filter(|l| l.starts_with('⚠')).collect();
    assert_eq!(warn.len(), 1, "{screen}");
    assert!(warn[0].contains("answered something else than its API"));
    assert!(line_with(&screen, "last good read").contains("ago"));
    assert!(screen.contains("dgx-synthetic") && screen.contains("10 GPUs"));
}

#[test]
fn control_characters_from_prometheus_are_shown_escaped() {
    let mut fleet = fixture();
    fleet.nodes[1].name = "evil\u{1b}[2Jnode".into();
    fleet.nodes[1].gpus[5].alerts[0].summary = Some("bad\u{7}\nsummary".into());
    let mut s = state_of(fleet);
    press(&mut s, &[KeyCode::Down, KeyCode::Right]);
    let screen = render(&mut s, 120, 24);
    assert!(!screen.contains('\u{1b}') && !screen.contains('\u{7}'));
    assert!(screen.contains("evil\\x1b[2J"), "{screen}");
}

/// 256 nodes of 8 GPUs, each node's GPUs one job, every fourth node's GPU 5 its straggler.
fn large_fleet() -> Fleet {
    let base = fixture();
    let template = base.node("dgx-synthetic").unwrap().clone();
    let job_template = base.jobs[0].clone();
    let mut fleet = base.clone();
    fleet.nodes.clear();
    fleet.jobs.clear();
    for n in 0..256 {
        let mut node = template.clone();
        node.name = format!("node-{n:03}");
        let key = format!("run-{n:03}");
        for gpu in &mut node.gpus {
            let uuid = format!("{}-{n:03}", gpu.uuid.as_deref().unwrap());
            gpu.uuid = Some(uuid);
            for j in &mut gpu.jobs {
                j.job_key = key.clone();
            }
            if n % 4 != 0 {
                gpu.alerts.clear();
            }
        }
        let mut job = job_template.clone();
        job.job_key = key;
        job.nodes = vec![node.name.clone()];
        for g in &mut job.gpus {
            g.node = node.name.clone();
            g.uuid = format!("{}-{n:03}", g.uuid);
        }
        fleet.nodes.push(node);
        fleet.jobs.push(job);
    }
    fleet.counts.nodes = 256;
    fleet.counts.nodes_down = 0;
    fleet.counts.gpus = 2048;
    fleet
}

/// A fleet of 2048 GPUs draws well within a frame's budget: only the rows on screen are built.
#[test]
fn a_2048_gpu_fleet_draws_fast() {
    let mut s = state_of(large_fleet());
    press(&mut s, &[KeyCode::Char('E')]);
    assert!(s.rows().len() > 2048);
    let (w, h) = (200, 50);
    s.viewport = (w, h);
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    let theme = Theme { color: true };
    let frames = 50;
    let mut timings = Vec::new();
    for (i, view) in [(0, "table"), (1, "by job"), (2, "job view")] {
        match i {
            1 => press(&mut s, &[KeyCode::Char('g')]),
            2 => press(&mut s, &[KeyCode::Enter]),
            _ => {}
        }
        let started = Instant::now();
        for k in 0..frames {
            // Move so every frame differs, as scrolling does.
            if i < 2 {
                press(
                    &mut s,
                    &[if k % 2 == 0 {
                        KeyCode::PageDown
                    } else {
                        KeyCode::Down
                    }],
                );
            }
            terminal.draw(|f| fleet::draw(f, &s, &theme)).unwrap();
        }
        let per_frame = started.elapsed() / frames;
        timings.push(format!("{view}: {per_frame:?}"));
        assert!(
            per_frame < Duration::from_millis(100),
            "{view}: {per_frame:?} a frame"
        );
    }
    let screen = render(&mut s, w, h);
    assert!(screen.contains("2048 GPUs"), "{screen}");
    // Rebuilding the rows (a key typed into the filter) over 2048 GPUs.
    let mut s = state_of(large_fleet());
    assert_eq!(s.grouping, Grouping::Node);
    press(&mut s, &[KeyCode::Char('/')]);
    let started = Instant::now();
    for c in "node-2".chars() {
        press(&mut s, &[KeyCode::Char(c)]);
    }
    let per_key = started.elapsed() / 6;
    timings.push(format!("filter key: {per_key:?}"));
    assert!(matches!(s.rows()[0], Row::Node { .. }));
    println!(
        "2048 GPUs, {w}x{h}, per frame ({}): {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        timings.join(", ")
    );
}
