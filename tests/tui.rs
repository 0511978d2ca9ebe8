//! The terminal UI without a terminal: snapshots of every panel rendered into ratatui's
//! `TestBackend` from fixture recordings and the demo, key sequences driving the app state, the
//! UI's sampler on a real recording, and saving a session.

use std::ops::Not;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind};
use gpudiag::tui::app::{
    App, AppInit, Effect, KillSignal, Overlay, Panel, ProcSort, ProcessView, SourceKind, Zoom,
};
use gpudiag::tui::event::{save_recording, spawn_sampler};
use gpudiag::tui::messages::AppEvent;
use gpudiag::tui::theme::Theme;
use gpudiag::tui::ui;
use gpudiag_core::session::DEMO_RECORDING;
use gpudiag_model::finding::Severity;
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::sampler::{SamplerControl, SamplerMsg};
use gpudiag_telemetry::{Backend, ReplayPosition, Tick};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::support::{at, fixture};

fn open(name: &str) -> ReplayBackend {
    if name == "demo" {
        ReplayBackend::from_reader(DEMO_RECORDING, Pace::AsFastAsPossible).unwrap()
    } else {
        ReplayBackend::open(fixture(&format!("{name}.ndjson")), Pace::AsFastAsPossible).unwrap()
    }
}

fn new_app(b: &ReplayBackend, name: &str, can_signal: bool) -> App {
    App::new(AppInit {
        host: b.host().clone(),
        devices: b.devices().to_vec(),
        source: SourceKind::Replay {
            name: name.to_owned(),
        },
        backend_name: b.header().backend.clone(),
        interval: Duration::from_secs(1),
        theme: Theme { color: false },
        can_signal,
        topology: b.topology(),
    })
}

fn all_ticks(b: &mut ReplayBackend) -> Vec<Tick> {
    let mut ticks = Vec::new();
    while let Ok(t) = b.poll() {
        ticks.push(t);
    }
    ticks
}

fn position(b: &ReplayBackend) -> Option<ReplayPosition> {
    Some(b.position())
}

/// An app that has seen the whole recording, as the UI is at its end.
fn loaded(name: &str) -> App {
    loaded_from(open(name), &format!("{name}.ndjson"))
}

/// An app that has seen every tick of the recording but not yet its end: the UI while it plays.
fn playing_from(b: ReplayBackend, name: &str) -> App {
    playing_edited(b, name, |_| {})
}

/// [`playing_from`], the ticks edited by `edit` first.
fn playing_edited(mut b: ReplayBackend, name: &str, edit: impl FnOnce(&mut [Tick])) -> App {
    let mut app = new_app(&b, name, false);
    let mut ticks = all_ticks(&mut b);
    edit(&mut ticks);
    app.on_feed(
        SamplerMsg::Ticks {
            ticks,
            reset: false,
            position: position(&b),
        },
        Instant::now(),
    );
    app
}

fn loaded_from(b: ReplayBackend, name: &str) -> App {
    let mut app = playing_from(b, name);
    app.on_feed(SamplerMsg::Ended(None), Instant::now());
    app
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().to_string()
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn press(app: &mut App, keys: &[KeyCode]) -> Vec<Effect> {
    keys.iter().filter_map(|&k| app.on_key(key(k))).collect()
}

// ---------------------------------------------------------------------------------------------
// Snapshots: every panel, at 80x24 and at 160x48

const SIZES: [(u16, u16); 2] = [(80, 24), (160, 48)];

fn snapshot_panels(name: &str, panels: &[Panel]) {
    let mut app = loaded(name);
    for &panel in panels {
        app.panel = panel;
        for (w, h) in SIZES {
            let screen = render(&app, w, h);
            insta::assert_snapshot!(
                format!("{name}_{}_{w}x{h}", panel.title().to_lowercase()),
                screen
            );
        }
    }
}

#[test]
fn demo_every_panel() {
    snapshot_panels("demo", &Panel::ALL);
}

#[test]
fn two_gpus_devices_detail_and_processes() {
    snapshot_panels(
        "two_gpus",
        &[Panel::Devices, Panel::Detail, Panel::Processes],
    );
}

/// A real two-H200 recording: NV18 between the GPUs, NUMA 0, the CRC counters the driver kept.
#[test]
fn two_h200s_topology_and_devices() {
    snapshot_panels("h200x2", &[Panel::Topology, Panel::Devices]);
    let mut app = loaded("h200x2");
    press(&mut app, &[KeyCode::Char('6')]);
    let screen = render(&app, 80, 24);
    assert!(screen.contains("GPU0       X   NV18"), "{screen}");
}

#[test]
fn processes_while_a_job_runs() {
    let mut b = open("two_gpus");
    let mut app = new_app(&b, "two_gpus.ndjson", false);
    for _ in 0..6 {
        app.push_tick(b.poll().unwrap());
    }
    app.panel = Panel::Processes;
    for (w, h) in SIZES {
        insta::assert_snapshot!(
            format!("two_gpus_processes_running_{w}x{h}"),
            render(&app, w, h)
        );
    }
}

/// Who owns each process: a pod on GPU 0, on the time-sliced GPU 1 a pod its HOSTNAME named,
/// one that no pod could be given, and a Slurm job.
#[test]
fn processes_with_their_jobs_and_pods() {
    let mut b = open("attributed");
    let mut app = new_app(&b, "attributed.ndjson", false);
    for _ in 0..10 {
        app.push_tick(b.poll().unwrap());
    }
    app.panel = Panel::Processes;
    let screen = render(&app, 160, 48);
    insta::assert_snapshot!("attributed_processes_160x48", screen);
    for owner in [
        "ml-team/train-llm-0/trainer",
        "research/notebook-a/lab",
        "pod? 2 share the GPU",
        "job 4242 (bob)",
    ] {
        assert!(screen.contains(owner), "{owner} in\n{screen}");
    }
}

#[test]
fn ecc_error_findings() {
    snapshot_panels("ecc_error", &[Panel::Findings, Panel::Devices]);
}

#[test]
fn sparse_values_show_na() {
    snapshot_panels("sparse", &[Panel::Devices, Panel::Detail, Panel::Processes]);
    let app = loaded("sparse");
    let screen = render(&app, 80, 24);
    // Power is absent in this recording: it must read n/a, never 0.
    assert!(screen.contains("n/a/n/aW"), "{screen}");
    assert!(!screen.contains(" 0/"), "{screen}");
}

/// A GPU with profiling counters: the Detail panel shows the verdict's title and advice above
/// the charts, and the profiling chart among them.
#[test]
fn profiled_detail_shows_the_verdict_above_the_charts() {
    snapshot_panels("profiled", &[Panel::Detail]);
    let mut app = loaded("profiled");
    app.panel = Panel::Detail;
    let screen = render(&app, 160, 48);
    let rows: Vec<&str> = screen.lines().collect();
    // Border, then the title, then the advice, then the first chart.
    let top = rows.iter().position(|r| r.starts_with("\"┌")).unwrap();
    assert!(
        rows[top + 1].contains("compute-bound on tensor cores over 9 s (tensor 72%"),
        "{screen}"
    );
    assert!(
        rows[top + 2].contains("what to do: The GPU does useful work"),
        "{screen}"
    );
    let chart = rows.iter().position(|r| r.contains("┌util")).unwrap();
    let verdict = rows.iter().position(|r| r.contains("what to do")).unwrap();
    assert!(verdict < chart, "{screen}");
    assert!(
        screen.contains("SM active"),
        "the profiling chart: {screen}"
    );
}

/// The text and foreground colour of row `y` of an 80-column render, and the colour and
/// modifiers of the cell at `x` on it.
fn row_and_style(app: &App, y: u16, x: u16) -> (String, ratatui::style::Style) {
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    let buf = terminal.backend().buffer();
    let text: String = (0..80).map(|i| buf[(i, y)].symbol().to_owned()).collect();
    (text, buf[(x, y)].style())
}

/// The header's third line is the selected GPU's verdict, cut to the width; a verdict that
/// wastes the GPU is a warning, good use is green.
#[test]
fn header_verdict_follows_the_selected_gpu_and_marks_waste() {
    use ratatui::style::{Color, Modifier};
    let mut app = loaded("profiled");
    app.theme = Theme { color: true };
    // Its two GPUs run one executable for two users (alice, bob): two runs, no job line.
    let (line, style) = row_and_style(&app, 2, 16);
    assert!(
        line.starts_with("verdict GPU 0: compute_bound (high) — over 9 s (tensor 72%"),
        "{line}"
    );
    assert!(line.ends_with('…'), "cut to 80 columns: {line}");
    assert_eq!(style.fg, Some(Color::Green));
    press(&mut app, &[KeyCode::Down]);
    let (line, style) = row_and_style(&app, 2, 16);
    assert!(
        line.starts_with(
            "verdict GPU 1: underfilled (high) — over 9 s (utilisation 98%, SM active 11%"
        ),
        "{line}"
    );
    assert_eq!(style.fg, Some(Color::Yellow));
    assert!(style.add_modifier.contains(Modifier::BOLD));
    // Past the name the line is plain.
    let (_, rest) = row_and_style(&app, 2, 40);
    assert_eq!(rest.fg, Some(Color::Reset));
}

/// Without a verdict the header says why, dimmed: nothing yet, then too little data (without
/// the note about `check`'s --window flag, which the TUI has no use for).
#[test]
fn header_says_why_there_is_no_verdict_yet() {
    let mut b = open("healthy");
    let mut app = new_app(&b, "healthy.ndjson", false);
    app.theme = Theme { color: true };
    let (line, style) = row_and_style(&app, 2, 0);
    assert_eq!(
        line.trim_end(),
        "verdict GPU 0: not judged yet — waiting for data"
    );
    assert_eq!(style.fg, Some(ratatui::style::Color::DarkGray));
    for _ in 0..2 {
        app.push_tick(b.poll().unwrap());
    }
    let (line, _) = row_and_style(&app, 2, 0);
    assert_eq!(
        line.trim_end(),
        "verdict GPU 0: not judged yet — 1.0 s of data; a verdict needs at least 3 s"
    );
    app.panel = Panel::Detail;
    let screen = render(&app, 80, 24);
    assert!(
        screen.contains("│verdict: not judged yet — 1.0 s of data; a verdict needs at least 3 s"),
        "{screen}"
    );
    for _ in 0..3 {
        app.push_tick(b.poll().unwrap());
    }
    let (line, _) = row_and_style(&app, 2, 0);
    assert!(
        line.starts_with("verdict GPU 0: compute_bound (low, utilisation only)"),
        "{line}"
    );
}

/// Names, commands and findings from a recording show their control characters as visible
/// escapes, the same ones the text output writes, rather than losing them silently.
#[test]
fn control_characters_from_a_recording_show_as_escapes() {
    let path = at("tests/fixtures/hostile/control_chars.ndjson");
    let b = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    let recorded = b.recorded_findings();
    let mut app = loaded_from(b, "control_chars.ndjson");
    app.set_recorded(recorded);
    app.refresh_findings();
    for (panel, visible) in [
        (Panel::Devices, r"0 EVIL\x1b]0;pw"),
        (Panel::Detail, r"0 EVIL\x1b]0;pwned\x07\x1b[2J"),
        (Panel::Processes, r"proc\x1b[2J…\x0d\x0aFAKE [fail] line"),
        (
            Panel::Findings,
            r"recorded\x1b[2J\x0d\x0aFAKE [fail] forged finding",
        ),
        (Panel::Findings, r"do: ring\x07 the bell"),
    ] {
        app.panel = panel;
        let screen = render(&app, 160, 48);
        assert!(
            screen.contains(visible),
            "{panel:?}: missing {visible:?} in\n{screen}"
        );
        assert!(
            screen.contains(r"gpu-node-07\x1b]0;owned host\x07"),
            "{screen}"
        );
    }
}

#[test]
fn help_overlay_snapshot() {
    let mut app = loaded("demo");
    press(&mut app, &[KeyCode::Char('?')]);
    insta::assert_snapshot!("demo_help_80x24", render(&app, 80, 24));
}

/// The help box fits an 80x24 terminal whole: every key and every description on one line,
/// both borders on screen.
#[test]
fn help_fits_80x24_with_nothing_cut() {
    use gpudiag::tui::panels::overlay::KEYS;
    let mut app = loaded("demo");
    press(&mut app, &[KeyCode::Char('?')]);
    let screen = render(&app, 80, 24);
    let lines: Vec<&str> = screen.lines().collect();
    let top = lines
        .iter()
        .position(|l| l.contains("┌ Keys "))
        .unwrap_or_else(|| panic!("no top border: {screen}"));
    let bottom = top + KEYS.len() + 1;
    assert!(
        bottom < lines.len(),
        "the box runs off the screen: {screen}"
    );
    assert!(
        lines[bottom].contains('└') && lines[bottom].contains('┘'),
        "{screen}"
    );
    for (i, (k, what)) in KEYS.iter().enumerate() {
        let line = lines[top + 1 + i];
        assert!(line.contains(what), "{what:?} cut: {line}");
        assert!(line.contains(k), "{k:?} missing: {line}");
    }
}

/// A replay of `run --kernels --record` shows, on K, the latest kernels summary it has reached,
/// scrollable and closed with Esc; the footer offers K only then, and a replay without one says
/// how to record it.
#[test]
fn k_opens_the_kernels_a_run_recording_carries() {
    use gpudiag_core::kernels::KernelsAggregator;
    use gpudiag_core::kernels::synthetic::training_stream;
    use gpudiag_model::kernels::RecordedKernels;

    let mut without = loaded("demo");
    assert!(!render(&without, 120, 36).contains("K:kernels"));
    press(&mut without, &[KeyCode::Char('K')]);
    let screen = render(&without, 120, 36);
    assert!(screen.contains("No kernel records here."), "{screen}");
    press(&mut without, &[KeyCode::Esc]);
    assert_eq!(without.overlay, None);

    let mut aggregator = KernelsAggregator::default();
    for m in training_stream(4242, "GPU-1111") {
        aggregator.push(&m);
    }
    let mut app = playing_edited(open("demo"), "run.ndjson", |ticks| {
        let middle = &mut ticks[ticks.len() / 2];
        middle.kernels = Some(Box::new(RecordedKernels {
            time_ms: middle.time_ms().unwrap(),
            ended: false,
            summary: aggregator.summary(),
        }));
    });
    assert!(render(&app, 120, 36).contains("K:kernels"));
    press(&mut app, &[KeyCode::Char('K')]);
    let screen = render(&app, 120, 36);
    assert!(
        screen.contains("Recorded over the run so far, at"),
        "{screen}"
    );
    assert!(
        screen.contains("kernels on GPU-1111 (pid 4242)"),
        "{screen}"
    );
    assert!(screen.contains("sm90_xmma_gemm"), "{screen}");
    press(&mut app, &[KeyCode::Down, KeyCode::Down]);
    assert!(matches!(app.overlay, Some(Overlay::Kernels { scroll: 2 })));
    press(&mut app, &[KeyCode::Esc]);
    assert_eq!(app.overlay, None);
}

/// The text inside the bordered box whose top border carries `title`, one string per row.
fn boxed_text(screen: &str, title: &str) -> Vec<String> {
    let lines: Vec<&str> = screen.lines().collect();
    let top = lines.iter().position(|l| l.contains(title)).unwrap();
    let left = lines[top].chars().position(|c| c == '┌').unwrap();
    let mut rows = Vec::new();
    for l in &lines[top + 1..] {
        let chars: Vec<char> = l.chars().collect();
        if chars.get(left) == Some(&'└') {
            break;
        }
        let inner: String = chars[left + 1..]
            .iter()
            .take_while(|c| **c != '│')
            .collect();
        rows.push(inner.trim().to_owned());
    }
    rows
}

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn findings_are_worst_first_and_newest_first_within_a_severity() {
    for name in ["ecc_error", "demo", "two_gpus"] {
        let app = loaded(name);
        let keys: Vec<(Severity, u64)> = app
            .findings
            .iter()
            .map(|f| (f.severity, f.time_ms))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(keys, sorted, "{name}");
    }
    // The ECC recording has an older FAIL than its WARN: the FAIL comes first.
    let app = loaded("ecc_error");
    let sev: Vec<Severity> = app.findings.iter().map(|f| f.severity).collect();
    assert_eq!(sev, [Severity::Fail, Severity::Fail, Severity::Warn]);
}

#[test]
fn a_finding_that_passed_is_marked_cleared_in_the_list() {
    // The healthy GPU, hot for its first 5 s of 60 and cool after.
    let healthy = std::fs::read_to_string(fixture("healthy.ndjson")).unwrap();
    let mut lines = healthy.lines();
    let mut text = format!("{}\n", lines.next().unwrap());
    let template: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let t0 = template["time_ms"].as_u64().unwrap();
    for t in 0..60u64 {
        let mut sample = template.clone();
        sample["time_ms"] = (t0 + t * 1000).into();
        sample["temp_gpu_c"] = (if t < 5 { 88.0 } else { 55.0 }).into();
        text.push_str(&format!("{sample}\n"));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spike.ndjson");
    std::fs::write(&path, text).unwrap();
    let b = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    let mut app = loaded_from(b, "spike.ndjson");
    app.refresh_findings();
    app.panel = Panel::Findings;
    let screen = render(&app, 160, 30);
    let line = screen
        .lines()
        .find(|l| l.contains("GPU temperature"))
        .unwrap_or_else(|| panic!("{screen}"));
    assert!(line.contains("· cleared, last seen 00:00:04"), "{line}");
}

#[test]
fn enter_opens_a_findings_whole_evidence_and_advice_and_esc_closes_it() {
    let mut app = loaded("ecc_error");
    press(&mut app, &[KeyCode::Char('4'), KeyCode::Down]);
    let picked = app.findings[1].clone();
    press(&mut app, &[KeyCode::Enter]);
    assert!(
        matches!(&app.overlay, Some(Overlay::Finding { finding, scroll: 0 }) if **finding == picked)
    );
    let screen = render(&app, 80, 24);
    let text = words(&boxed_text(&screen, "┌ Finding ").join(" "));
    // The list cuts the advice at one line; the box holds all of it, and the title and every
    // evidence value.
    let mut list = loaded("ecc_error");
    list.panel = Panel::Findings;
    assert!(render(&list, 80, 24).contains('…'));
    assert!(text.contains(&words(&picked.advice)), "{screen}");
    assert!(text.contains(&words(&picked.title)), "{screen}");
    for (k, _) in &picked.evidence.values {
        assert!(text.contains(k.as_str()), "{k}: {screen}");
    }
    assert!(text.contains(&picked.evidence.threshold), "{screen}");
    // Other keys leave it open; Esc closes it and the selection is where it was.
    press(&mut app, &[KeyCode::Char('z'), KeyCode::Tab]);
    assert!(app.overlay.is_some());
    assert_eq!(app.panel, Panel::Findings);
    press(&mut app, &[KeyCode::Esc]);
    assert_eq!(app.overlay, None);
    assert_eq!(app.selected_finding, 1);
    // Enter on an empty list opens nothing.
    let mut empty = loaded("healthy");
    empty.findings.clear();
    press(&mut empty, &[KeyCode::Char('4'), KeyCode::Enter]);
    assert_eq!(empty.overlay, None);
}

#[test]
fn a_finding_longer_than_the_screen_scrolls_to_its_last_word() {
    let mut app = loaded("ecc_error");
    let mut long = app.findings[0].clone();
    long.advice = (1..=120)
        .map(|i| format!("step{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    long.advice.push_str(" THE-END");
    app.findings.insert(0, long);
    app.selected_finding = 0;
    press(&mut app, &[KeyCode::Char('4'), KeyCode::Enter]);
    let first = render(&app, 80, 24);
    assert!(!first.contains("THE-END"), "{first}");
    press(&mut app, &[KeyCode::Down]);
    assert!(matches!(
        app.overlay,
        Some(Overlay::Finding { scroll: 1, .. })
    ));
    press(&mut app, &[KeyCode::End]);
    let last = render(&app, 80, 24);
    assert!(last.contains("THE-END"), "{last}");
    // Scrolling stops at the end: one Up moves back at once.
    let Some(Overlay::Finding { scroll: end, .. }) = app.overlay.clone() else {
        panic!("closed")
    };
    press(&mut app, &[KeyCode::Down, KeyCode::Down, KeyCode::Up]);
    assert!(matches!(app.overlay, Some(Overlay::Finding { scroll, .. }) if scroll == end - 1));
    press(&mut app, &[KeyCode::Home]);
    assert!(matches!(
        app.overlay,
        Some(Overlay::Finding { scroll: 0, .. })
    ));
}

/// Without a live GPU the UI opens the demo and says why: the whole notice, wrapped on lines of
/// its own, with the key hints still there; a key press (or time) takes it away.
#[test]
fn the_no_gpu_notice_is_whole_and_keeps_the_key_hints() {
    let mut app = loaded("demo");
    let notice = "no live NVIDIA GPU here (NVML could not be loaded: libnvidia-ml.so.1: cannot \
                  open shared object file: No such file or directory); opening the bundled demo \
                  recording (gpudiag --demo)";
    app.show_notice(notice.to_owned());
    let screen = render(&app, 80, 24);
    let rows: Vec<&str> = screen.lines().map(|r| r.trim_matches('"')).collect();
    let footer = rows[rows.len() - 1];
    assert!(
        footer.contains("?:help") && footer.contains("q:quit"),
        "{screen}"
    );
    // The rows just above the hints hold the notice whole, nothing cut.
    let above = rows[rows.len() - 4..rows.len() - 1].join(" ");
    assert_eq!(words(&above), words(notice), "{screen}");
    assert!(rows[rows.len() - 5].contains('┘'), "{screen}");
    press(&mut app, &[KeyCode::Char('2')]);
    let screen = render(&app, 80, 24);
    assert!(!screen.contains("no live NVIDIA GPU"), "{screen}");
}

#[test]
fn tiny_terminal_says_so() {
    let app = loaded("demo");
    let screen = render(&app, 40, 10);
    assert!(screen.contains("needs at least"), "{screen}");
}

#[test]
fn no_color_leaves_colours_out() {
    let app = loaded("ecc_error");
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    terminal.draw(|f| ui::draw(f, &app)).unwrap();
    let buf = terminal.backend().buffer();
    assert!(
        buf.content()
            .iter()
            .all(|c| c.fg == ratatui::style::Color::Reset && c.bg == ratatui::style::Color::Reset)
    );
    let mut coloured = loaded("ecc_error");
    coloured.theme = Theme { color: true };
    terminal.draw(|f| ui::draw(f, &coloured)).unwrap();
    let buf = terminal.backend().buffer();
    assert!(
        buf.content()
            .iter()
            .any(|c| c.fg != ratatui::style::Color::Reset)
    );
}

// ---------------------------------------------------------------------------------------------
// State driven by keys

#[test]
fn tab_and_number_keys_switch_panels() {
    let mut app = loaded("demo");
    assert_eq!(app.panel, Panel::Devices);
    press(&mut app, &[KeyCode::Tab, KeyCode::Tab]);
    assert_eq!(app.panel, Panel::Processes);
    press(
        &mut app,
        &[KeyCode::BackTab, KeyCode::BackTab, KeyCode::BackTab],
    );
    assert_eq!(app.panel, Panel::Job);
    press(&mut app, &[KeyCode::BackTab, KeyCode::BackTab]);
    assert_eq!(app.panel, Panel::Probes);
    press(&mut app, &[KeyCode::Char('6')]);
    assert_eq!(app.panel, Panel::Topology);
    press(&mut app, &[KeyCode::Char('1'), KeyCode::Char('j')]);
    assert_eq!(app.panel, Panel::Job);
    press(&mut app, &[KeyCode::Char('1'), KeyCode::Char('7')]);
    assert_eq!(app.panel, Panel::Job);
    press(&mut app, &[KeyCode::Tab]);
    assert_eq!(app.panel, Panel::Devices);
    press(&mut app, &[KeyCode::Char('4')]);
    assert_eq!(app.panel, Panel::Findings);
    press(&mut app, &[KeyCode::Char('1'), KeyCode::Enter]);
    assert_eq!(app.panel, Panel::Detail);
    assert!(!app.quit);
    press(&mut app, &[KeyCode::Char('q')]);
    assert!(app.quit);
}

#[test]
fn ctrl_c_quits() {
    let mut app = loaded("demo");
    app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert!(app.quit);
}

#[test]
fn pause_tells_the_sampler_and_shows_in_the_header() {
    let mut app = loaded("demo");
    let effects = press(&mut app, &[KeyCode::Char(' ')]);
    assert_eq!(effects, [Effect::Feed(SamplerControl::Pause(true))]);
    assert!(app.paused);
    assert!(render(&app, 80, 24).contains("PAUSED REPLAY 2:05/2:05"));
    let effects = press(&mut app, &[KeyCode::Char('p')]);
    assert_eq!(effects, [Effect::Feed(SamplerControl::Pause(false))]);
    assert!(render(&app, 80, 24).contains("REPLAY END 2:05/2:05"));
}

#[test]
fn help_opens_and_any_key_closes_it() {
    let mut app = loaded("demo");
    press(&mut app, &[KeyCode::Char('?')]);
    assert_eq!(app.overlay, Some(Overlay::Help));
    assert!(render(&app, 80, 24).contains("kill the selected process"));
    // The key that closes help does nothing else.
    press(&mut app, &[KeyCode::Tab]);
    assert_eq!(app.overlay, None);
    assert_eq!(app.panel, Panel::Devices);
    press(&mut app, &[KeyCode::Char('?'), KeyCode::Char('q')]);
    assert!(app.quit);
}

#[test]
fn zoom_cycles_through_the_windows() {
    let mut app = loaded("demo");
    assert_eq!(app.zoom, Zoom::M1);
    press(&mut app, &[KeyCode::Char('z')]);
    assert_eq!(app.zoom, Zoom::M5);
    press(&mut app, &[KeyCode::Char('z'), KeyCode::Char('z')]);
    assert_eq!(app.zoom, Zoom::H1);
    press(&mut app, &[KeyCode::Char('z')]);
    assert_eq!(app.zoom, Zoom::M1);
    press(&mut app, &[KeyCode::Char('Z')]);
    assert_eq!(app.zoom, Zoom::H1);
    app.panel = Panel::Detail;
    assert!(render(&app, 80, 24).contains("last 1h"));
}

#[test]
fn device_selection_moves_and_stops_at_the_ends() {
    let mut app = loaded("two_gpus");
    press(&mut app, &[KeyCode::Down, KeyCode::Down, KeyCode::Down]);
    assert_eq!(app.selected_device, 1);
    press(&mut app, &[KeyCode::Up, KeyCode::Up]);
    assert_eq!(app.selected_device, 0);
    press(&mut app, &[KeyCode::End, KeyCode::Enter]);
    assert_eq!(app.panel, Panel::Detail);
    assert!(render(&app, 80, 24).contains("1 NVIDIA H200 · last"));
}

fn pids(app: &App) -> Vec<u32> {
    match app.process_view() {
        ProcessView::Rows(rows) => rows.iter().map(|r| r.pid).collect(),
        ProcessView::NotRead(why) => panic!("processes not read: {why:?}"),
    }
}

#[test]
fn processes_sort_and_absent_lists_say_why() {
    let mut app = loaded("demo");
    assert_eq!(app.sort, ProcSort::Memory);
    app.panel = Panel::Processes;
    for expected in [
        ProcSort::Growth,
        ProcSort::Sm,
        ProcSort::Pid,
        ProcSort::Memory,
    ] {
        press(&mut app, &[KeyCode::Char('s')]);
        assert_eq!(app.sort, expected);
        assert!(app.status.as_deref().unwrap().contains(expected.label()));
    }
    // Before any process read, the view says why rather than showing an empty table.
    let mut b = open("two_gpus");
    let mut early = new_app(&b, "two_gpus", false);
    early.push_tick(b.poll().unwrap());
    match early.process_view() {
        ProcessView::NotRead(why) => assert_eq!(why.as_deref(), Some("not read yet")),
        ProcessView::Rows(r) => panic!("{r:?}"),
    }
    early.push_tick(b.poll().unwrap());
    assert_eq!(pids(&early), [48213]);
}

#[test]
fn kill_is_refused_for_a_recording() {
    let mut app = loaded("demo");
    app.panel = Panel::Processes;
    let effects = press(&mut app, &[KeyCode::Char('k')]);
    assert!(effects.is_empty());
    assert_eq!(app.overlay, None);
    assert!(app.status.as_deref().unwrap().contains("recording"));
}

#[test]
fn kill_asks_first_then_escalates_to_sigkill() {
    let mut b = open("two_gpus");
    let mut app = new_app(&b, "live-like", true);
    // Midway, while the job still runs.
    for t in all_ticks(&mut b).into_iter().take(6) {
        app.push_tick(t);
    }
    // Only from the Processes panel.
    press(&mut app, &[KeyCode::Char('k')]);
    assert_eq!(app.overlay, None);
    app.panel = Panel::Processes;
    let pid = pids(&app)[0];
    press(&mut app, &[KeyCode::Char('k')]);
    assert_eq!(
        app.overlay,
        Some(Overlay::ConfirmKill {
            pid,
            name: "python3".into(),
            signal: KillSignal::Term
        })
    );
    assert!(render(&app, 80, 24).contains(&format!("Send SIGTERM to PID {pid}")));
    // Anything but y cancels.
    assert!(press(&mut app, &[KeyCode::Char('n')]).is_empty());
    assert_eq!(app.overlay, None);
    let effects = press(&mut app, &[KeyCode::Char('k'), KeyCode::Char('y')]);
    assert_eq!(
        effects,
        [Effect::Signal {
            pid,
            signal: KillSignal::Term
        }]
    );
    // Still there: the next kill offers SIGKILL.
    let effects = press(&mut app, &[KeyCode::Char('k'), KeyCode::Char('y')]);
    assert_eq!(
        effects,
        [Effect::Signal {
            pid,
            signal: KillSignal::Kill
        }]
    );
}

#[test]
fn replay_keys_seek_and_change_speed() {
    let mut app = loaded("demo");
    assert_eq!(
        press(&mut app, &[KeyCode::Left]),
        [Effect::Feed(SamplerControl::Seek(-10_000))]
    );
    let shift_right = KeyEvent::new(KeyCode::Right, KeyModifiers::SHIFT);
    assert_eq!(
        app.on_key(shift_right),
        Some(Effect::Feed(SamplerControl::Seek(60_000)))
    );
    assert_eq!(
        press(&mut app, &[KeyCode::Char('+'), KeyCode::Char('+')]),
        [
            Effect::Feed(SamplerControl::Speed(2.0)),
            Effect::Feed(SamplerControl::Speed(4.0))
        ]
    );
    assert_eq!(
        press(&mut app, &[KeyCode::Char('-')]),
        [Effect::Feed(SamplerControl::Speed(2.0))]
    );
    for _ in 0..20 {
        press(&mut app, &[KeyCode::Char('-')]);
    }
    assert_eq!(app.speed, 0.125);
}

#[test]
fn live_ignores_replay_keys_with_a_message() {
    let b = open("demo");
    let mut app = new_app(&b, "x", true);
    app.source = SourceKind::Live;
    assert!(press(&mut app, &[KeyCode::Left]).is_empty());
    assert!(app.status.as_deref().unwrap().contains("replays"));
    assert!(press(&mut app, &[KeyCode::Char('+')]).is_empty());
    assert!(render(&app, 80, 24).contains("LIVE every 1s"));
    press(&mut app, &[KeyCode::Char(' ')]);
    assert!(render(&app, 80, 24).contains("PAUSED (live)"));
}

#[test]
fn mouse_clicks_tabs_and_scrolls_the_selection() {
    let mut app = loaded("two_gpus");
    let click = |col| MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column: col,
        row: ui::HEADER_ROWS,
        modifiers: KeyModifiers::NONE,
    };
    // " 1 Devices │ 2 Detail │ 3 Processes ..."
    app.on_mouse(click(25), |c, r| ui::tab_at(80, ui::HEADER_ROWS, c, r));
    assert_eq!(app.panel, Panel::Processes);
    app.on_mouse(click(14), |c, r| ui::tab_at(80, ui::HEADER_ROWS, c, r));
    assert_eq!(app.panel, Panel::Detail);
    let wheel = MouseEvent {
        kind: MouseEventKind::ScrollDown,
        column: 10,
        row: 10,
        modifiers: KeyModifiers::NONE,
    };
    app.on_mouse(wheel, |c, r| ui::tab_at(80, ui::HEADER_ROWS, c, r));
    assert_eq!(app.selected_device, 1);
}

#[test]
fn findings_refresh_at_most_once_a_second() {
    let mut b = open("ecc_error");
    let mut app = new_app(&b, "ecc_error", false);
    let ticks = all_ticks(&mut b);
    let (first, rest) = ticks.split_at(1);
    let t0 = Instant::now();
    app.on_feed(
        SamplerMsg::Ticks {
            ticks: first.to_vec(),
            reset: false,
            position: None,
        },
        t0,
    );
    assert!(app.findings.is_empty());
    app.on_feed(
        SamplerMsg::Ticks {
            ticks: rest.to_vec(),
            reset: false,
            position: None,
        },
        t0 + Duration::from_millis(300),
    );
    assert!(app.findings.is_empty(), "evaluated again within a second");
    app.maybe_refresh_findings(t0 + Duration::from_millis(1100));
    assert!(app.count(Severity::Fail) > 0);
    // Worst first, newest first within a severity.
    let order: Vec<(Severity, u64)> = app
        .findings
        .iter()
        .map(|f| (f.severity, f.time_ms))
        .collect();
    let mut sorted = order.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(order, sorted);
    assert!(render(&app, 80, 24).contains(&format!("{} fail", app.count(Severity::Fail))));
}

#[test]
fn a_reset_forgets_the_old_data() {
    let mut app = loaded("ecc_error");
    assert!(!app.findings.is_empty());
    let mut b = open("healthy");
    let ticks = all_ticks(&mut b);
    app.on_feed(
        SamplerMsg::Ticks {
            ticks,
            reset: true,
            position: None,
        },
        Instant::now(),
    );
    assert!(app.findings.is_empty());
    assert_eq!(app.ticks.len(), 10);
}

// ---------------------------------------------------------------------------------------------
// Without a terminal

fn gpudiag(args: &[&str]) -> std::process::Output {
    crate::support::gpudiag().args(args).output().unwrap()
}

#[test]
fn replay_without_a_terminal_prints_the_check_summary() {
    let file = fixture("ecc_error.ndjson");
    let out = gpudiag(&["replay", file.to_str().unwrap()]);
    // The same exit code as `check`: a fail finding is present.
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("XID 48"), "{stdout}");
    assert!(stdout.contains("source replay"), "{stdout}");
}

#[test]
fn bad_interval_and_speed_exit_2_quoting_the_value() {
    let out = gpudiag(&["--interval", "10ms", "--demo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'10ms'"));
    let file = fixture("healthy.ndjson");
    let out = gpudiag(&["replay", file.to_str().unwrap(), "--speed", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'0'"));
}

#[test]
fn replay_of_a_missing_file_exits_2_before_touching_the_terminal() {
    let out = gpudiag(&["replay", "/nonexistent/rec.ndjson"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("gpudiag: "), "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

// ---------------------------------------------------------------------------------------------
// The UI's sampler and saving

fn next_feed(rx: &mpsc::Receiver<AppEvent>) -> SamplerMsg {
    match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
        AppEvent::Feed(m) => m,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_sampler_plays_pauses_and_seeks_a_recording() {
    let b = ReplayBackend::open(fixture("healthy.ndjson"), Pace::Recorded { speed: 1.0 }).unwrap();
    let (tx, rx) = mpsc::channel();
    // Paused before the first tick is due, then seek: the ticks up to the target come at once.
    let sampler = spawn_sampler(Box::new(b), Duration::from_secs(1), tx).unwrap();
    let SamplerMsg::Ticks { ticks, .. } = next_feed(&rx) else {
        panic!("no first tick")
    };
    assert_eq!(ticks.len(), 1);
    sampler.send(SamplerControl::Pause(true));
    sampler.send(SamplerControl::Seek(3_000));
    let mut seen = 1;
    let SamplerMsg::Ticks {
        ticks,
        reset,
        position,
    } = next_feed(&rx)
    else {
        panic!("no seek batch")
    };
    // A second tick may have been due before the pause arrived.
    seen += ticks.len();
    assert!(!reset);
    let p = position.unwrap();
    assert!(p.current_ms >= p.start_ms + 3_000, "{p:?}");
    // Backwards: everything from the start again, flagged as a reset.
    sampler.send(SamplerControl::Seek(-60_000));
    let SamplerMsg::Ticks {
        ticks,
        reset,
        position,
    } = next_feed(&rx)
    else {
        panic!("no reset batch")
    };
    assert!(reset);
    assert_eq!(ticks.len(), 1);
    let p = position.unwrap();
    assert_eq!(p.current_ms, p.start_ms);
    // Fast and unpaused: plays to the end and says so.
    sampler.send(SamplerControl::Speed(1000.0));
    sampler.send(SamplerControl::Pause(false));
    let mut after = 0;
    loop {
        match next_feed(&rx) {
            SamplerMsg::Ticks { ticks, .. } => after += ticks.len(),
            SamplerMsg::Ended(why) => {
                assert!(why.is_none(), "{why:?}");
                break;
            }
        }
    }
    assert_eq!(after, 9);
    assert!(seen >= 4);
}

/// A live-paced backend that counts its polls and fails after `fail_after` of them.
struct FakeLive {
    host: gpudiag_model::sample::HostInfo,
    devices: Vec<gpudiag_model::sample::DeviceInfo>,
    polls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    fail_after: usize,
}

impl Backend for FakeLive {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn host(&self) -> &gpudiag_model::sample::HostInfo {
        &self.host
    }
    fn devices(&self) -> &[gpudiag_model::sample::DeviceInfo] {
        &self.devices
    }
    fn pacing(&self) -> gpudiag_telemetry::Pacing {
        gpudiag_telemetry::Pacing::Live
    }
    fn poll(&mut self) -> Result<Tick, gpudiag_telemetry::BackendError> {
        let n = self.polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n >= self.fail_after {
            return Err(gpudiag_telemetry::BackendError::Unavailable(
                "GPU fell off the bus".into(),
            ));
        }
        let mut s = gpudiag_model::sample::Sample::new(0, gpudiag_model::sample::now_ms());
        s.gpu_util_pct = Some(50.0);
        Ok(Tick {
            samples: vec![s],
            events: Vec::new(),
            ras: Vec::new(),
            kernels: None,
        })
    }
}

#[test]
fn a_live_source_is_polled_on_its_interval_paused_and_its_failure_reported() {
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let backend = FakeLive {
        host: Default::default(),
        devices: vec![Default::default()],
        polls: polls.clone(),
        fail_after: 8,
    };
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let sampler = spawn_sampler(Box::new(backend), Duration::from_millis(50), tx).unwrap();
    for _ in 0..3 {
        let SamplerMsg::Ticks {
            ticks, position, ..
        } = next_feed(&rx)
        else {
            panic!("ended early")
        };
        assert_eq!(ticks.len(), 1);
        assert_eq!(position, None, "live data has no replay position");
    }
    // Three ticks at 50 ms: the first at once, the third about 100 ms later.
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "{:?}",
        start.elapsed()
    );
    sampler.send(SamplerControl::Pause(true));
    std::thread::sleep(Duration::from_millis(100));
    let paused_at = polls.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        polls.load(std::sync::atomic::Ordering::SeqCst),
        paused_at,
        "no polling while paused"
    );
    // Seek and speed mean nothing live; they must not disturb it.
    sampler.send(SamplerControl::Seek(-10_000));
    sampler.send(SamplerControl::Speed(8.0));
    while rx.try_recv().is_ok() {}
    sampler.send(SamplerControl::Pause(false));
    loop {
        match next_feed(&rx) {
            SamplerMsg::Ticks { reset, .. } => assert!(!reset),
            SamplerMsg::Ended(why) => {
                assert_eq!(
                    why.map(|e| e.to_string()).as_deref(),
                    Some("GPU fell off the bus")
                );
                break;
            }
        }
    }
}

#[test]
fn resuming_a_replay_keeps_its_pace() {
    let b = ReplayBackend::open(fixture("healthy.ndjson"), Pace::Recorded { speed: 4.0 }).unwrap();
    let (tx, rx) = mpsc::channel();
    let sampler = spawn_sampler(Box::new(b), Duration::from_secs(1), tx).unwrap();
    assert!(matches!(next_feed(&rx), SamplerMsg::Ticks { .. }));
    sampler.send(SamplerControl::Pause(true));
    // Ticks are 1 s apart at ×4: 250 ms. Pause for several of them.
    std::thread::sleep(Duration::from_millis(1200));
    while rx.try_recv().is_ok() {}
    sampler.send(SamplerControl::Pause(false));
    let start = Instant::now();
    let mut arrivals = Vec::new();
    while arrivals.len() < 3 {
        if let SamplerMsg::Ticks { ticks, .. } = next_feed(&rx) {
            arrivals.extend(ticks.iter().map(|_| start.elapsed()));
        }
    }
    // The pause is not made up for by a burst: the third tick after it comes at the pace.
    assert!(arrivals[2] >= Duration::from_millis(400), "{arrivals:?}");
}

#[test]
fn saving_writes_a_recording_that_replays() {
    let app = loaded("two_gpus");
    let dir = tempfile::tempdir().unwrap();
    let msg = save_recording(&app, dir.path());
    assert!(msg.starts_with("saved 10 ticks to "), "{msg}");
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(file.to_string_lossy().ends_with(".ndjson.gz"));
    let mut back = ReplayBackend::open(&file, Pace::AsFastAsPossible).unwrap();
    assert_eq!(back.devices().len(), 2);
    assert_eq!(all_ticks(&mut back).len(), 10);
    // A second save in the same second must not overwrite the first.
    let again = save_recording(&app, dir.path());
    assert!(again.starts_with("saved 10 ticks"), "{again}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    let empty = new_app(&open("healthy"), "x", false);
    assert!(save_recording(&empty, dir.path()).contains("nothing to save"));
}

// ---------------------------------------------------------------------------------------------
// Probes panel

/// An app over live-looking data (the demo's devices), as a live session starts.
fn live_app() -> App {
    let b = open("demo");
    App::new(AppInit {
        host: b.host().clone(),
        devices: b.devices().to_vec(),
        source: SourceKind::Live,
        backend_name: "nvml".into(),
        interval: Duration::from_secs(1),
        theme: Theme { color: false },
        can_signal: true,
        topology: b.topology(),
    })
}

/// Real probe results: the quick suite on the H200 host (tests/gpu_probes.rs output).
fn h200_quick() -> gpudiag_probes::runner::ProbeReport {
    let text = std::fs::read_to_string(at("tests/fixtures/probes/h200_quick.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn probes_panel_picks_a_suite_runs_it_and_shows_the_verdicts() {
    use gpudiag::cli::SuiteName;
    use gpudiag::tui::app::ProbesState;
    let mut app = live_app();
    press(&mut app, &[KeyCode::Char('5')]);
    assert_eq!(app.panel, Panel::Probes);
    assert!(render(&app, 80, 24).contains("No probe run yet"));
    // Down picks standard; Enter starts it and asks the loop to run it off the UI thread.
    let effects = press(&mut app, &[KeyCode::Down, KeyCode::Enter]);
    assert_eq!(
        effects,
        [Effect::RunProbes {
            suite: SuiteName::Standard,
            force: false
        }]
    );
    assert!(matches!(
        app.probes,
        ProbesState::Running {
            suite: SuiteName::Standard,
            ..
        }
    ));
    assert!(render(&app, 80, 24).contains("standard suite running"));
    // A second Enter while running starts nothing.
    assert!(press(&mut app, &[KeyCode::Enter]).is_empty());
    app.on_probes(Ok(h200_quick()));
    let screen = render(&app, 120, 40);
    assert!(screen.contains("h2d_pinned"), "{screen}");
    assert!(screen.contains("bf16"), "{screen}");
    assert!(screen.contains("(88% of 63.0)"), "{screen}");
    assert!(app.status.as_deref().unwrap().contains("all passed"));
    app.on_probes(Err("the CUDA driver sees no GPU".into()));
    assert!(render(&app, 80, 24).contains("Could not run: the CUDA driver sees no GPU"));
}

/// A run that found GPU 0 busy, as a child `gpudiag probe --json` reports it.
fn busy_report() -> gpudiag_probes::runner::ProbeReport {
    serde_json::from_str(
        r#"{"suite":"quick","devices":[{"index":0,"gpu":null,"model":null,
        "refused":"GPU 0 is in use by pid 4242 (3072 MiB), pid 4243; probes would disturb it and be disturbed",
        "name":"NVIDIA H200","forcible":true,"busy_pids":[4242,4243],"results":[]}]}"#,
    )
    .unwrap()
}

#[test]
fn a_busy_gpu_is_named_and_forcing_is_offered_with_a_confirmation() {
    use gpudiag::cli::SuiteName;
    use gpudiag::tui::app::ProbesState;
    let mut app = live_app();
    let mut b = open("demo");
    for t in all_ticks(&mut b) {
        app.push_tick(t);
    }
    let util = app.session.pipeline.latest[&0].gpu_util_pct.unwrap();
    press(&mut app, &[KeyCode::Char('5'), KeyCode::Enter]);
    app.on_probes(Ok(busy_report()));
    let expected = format!("GPU 0 NVIDIA H200 is busy (2 processes / {util:.0}% util)");
    let ProbesState::ConfirmForce { busy, .. } = &app.probes else {
        panic!("no question asked: {:?}", app.probes)
    };
    assert_eq!(busy, std::slice::from_ref(&expected));
    assert_eq!(
        app.status.as_deref(),
        Some(format!("{expected}: press f to run anyway, Esc to cancel").as_str())
    );
    let wide = render(&app, 120, 30);
    assert!(
        wide.contains(&format!("{expected}: press f to run anyway, Esc to cancel")),
        "{wide}"
    );
    // At 80 columns the question wraps, whole, and so does the refusal under it.
    let screen = render(&app, 80, 24);
    let text = words(&boxed_text(&screen, "┌ Probes ").join(" "));
    assert!(
        text.contains(&format!("{expected}: press f to run anyway, Esc to cancel")),
        "{screen}"
    );
    assert!(
        text.contains("pid 4243; probes would disturb it and be disturbed; f runs it anyway"),
        "{screen}"
    );
    // The GPU is named, never "?", and the remedy is the UI's, not a flag it cannot pass.
    assert!(!screen.contains("GPU 0 ?"), "{screen}");
    assert!(!screen.contains("--force"), "{screen}");
    // f confirms: the suite runs again, forced.
    let effects = press(&mut app, &[KeyCode::Char('f')]);
    assert_eq!(
        effects,
        [Effect::RunProbes {
            suite: SuiteName::Quick,
            force: true
        }]
    );
    assert!(matches!(app.probes, ProbesState::Running { .. }));
    app.on_probes(Ok(h200_quick()));
    assert!(matches!(app.probes, ProbesState::Ready { .. }));

    // Esc declines: the refusal stays on screen, and f asks again before anything runs.
    press(&mut app, &[KeyCode::Enter]);
    app.on_probes(Ok(busy_report()));
    assert!(press(&mut app, &[KeyCode::Esc]).is_empty());
    assert!(matches!(
        app.probes,
        ProbesState::Ready {
            last: Some(Ok(_)),
            ..
        }
    ));
    let declined = render(&app, 100, 24);
    assert!(
        declined.contains("GPU 0 NVIDIA H200 (quick suite"),
        "{declined}"
    );
    assert!(
        declined.contains("f runs it anyway (asks first)"),
        "{declined}"
    );
    assert!(press(&mut app, &[KeyCode::Char('f')]).is_empty());
    assert!(matches!(app.probes, ProbesState::ConfirmForce { .. }));
    // Elsewhere, f is not a probe key.
    press(&mut app, &[KeyCode::Char('1')]);
    assert!(press(&mut app, &[KeyCode::Char('f')]).is_empty());
}

#[test]
fn a_gpu_whose_users_cannot_be_seen_is_offered_too() {
    let app = live_app();
    let mut report = busy_report();
    report.devices[0].busy_pids.clear();
    report.devices[0].name = None;
    report.devices[0].refused =
        Some("could not list the GPU's processes (NVML: Unknown Error)".into());
    let lines = app.busy_lines(&report);
    // The name comes from the telemetry's device list then.
    assert_eq!(
        lines,
        [
            "GPU 0 NVIDIA H200: its other users could not be checked (could not list the GPU's \
          processes (NVML: Unknown Error))"
        ]
    );
    report.devices[0].forcible = false;
    assert!(app.busy_lines(&report).is_empty());
}

/// The panel's runs happen in a child `gpudiag probe --json`: the arguments it gets, its
/// report read back, and its error passed on. A script stands in for the binary.
#[test]
fn probes_run_in_a_child_gpudiag_probe() {
    use gpudiag::cli::SuiteName;
    use gpudiag::probe_run::run_probes_in_child;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let args = dir.path().join("args");
    let report = serde_json::to_string(&busy_report()).unwrap();
    let ok = script(
        "ok",
        &format!(
            "echo \"$@\" > {}\ncat <<'EOF'\n{report}\nEOF\nexit 1",
            args.display()
        ),
    );
    let got = run_probes_in_child(&ok, SuiteName::Standard, true).unwrap();
    assert_eq!(got, busy_report());
    assert_eq!(
        std::fs::read_to_string(&args).unwrap().trim(),
        "--config /dev/null probe --suite standard --json --force"
    );
    let fails = script("fails", "echo 'gpudiag: no GPU here' >&2; exit 3");
    let e = run_probes_in_child(&fails, SuiteName::Quick, false).unwrap_err();
    assert_eq!(e.to_string(), "no GPU here");
    // The real binary on this host: a report, or (no GPU, as in CI) its own reason.
    let real = Path::new(env!("CARGO_BIN_EXE_gpudiag"));
    match run_probes_in_child(real, SuiteName::Quick, false) {
        Ok(r) => assert!(!r.devices.is_empty()),
        Err(e) => assert!(
            e.to_string().contains("libcuda") || e.to_string().contains("GPU"),
            "{e}"
        ),
    }
}

/// Quitting the UI while its probes run stops them: the child gets SIGTERM when the process
/// that started it dies. This test runs itself again as the "UI" (the variable below), which
/// starts a stand-in child and is then killed.
#[test]
fn quitting_the_ui_stops_its_probe_child() {
    use gpudiag::cli::SuiteName;
    use std::os::unix::fs::PermissionsExt;
    if let Some(script) = std::env::var_os("GPUDIAG_TEST_PROBE_CHILD") {
        let _ =
            gpudiag::probe_run::run_probes_in_child(Path::new(&script), SuiteName::Quick, false);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = dir.path().join("probe");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 60\n",
            pidfile.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut ui = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            // The name the test harness knows it by: its path inside the e2e binary.
            "tui::quitting_the_ui_stops_its_probe_child",
            "--exact",
            "--nocapture",
        ])
        .env("GPUDIAG_TEST_PROBE_CHILD", &script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the child never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    ui.kill().unwrap();
    ui.wait().unwrap();
    // Gone, or a zombie waiting for a reaper: either way no longer running.
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with(['Z', 'X']).not())
            })
            .unwrap_or(false)
    };
    while running() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the probe child {pid} outlived the UI"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn probes_need_a_live_source() {
    let mut app = loaded("demo");
    press(&mut app, &[KeyCode::Char('5')]);
    assert!(press(&mut app, &[KeyCode::Enter]).is_empty());
    assert!(render(&app, 80, 24).contains("Probes need live GPUs"));
}

// ---------------------------------------------------------------------------------------------
// An AMD GPU (the MI300X sysfs fixture) in the same panels

#[test]
fn amd_fixture_device_renders_like_any_gpu() {
    use gpudiag_telemetry::amd::sysfs::SysfsBackend;
    let root = at("tests/fixtures/sysfs/mi300x");
    let mut b = SysfsBackend::open(&root).unwrap();
    let mut app = App::new(AppInit {
        host: b.host().clone(),
        devices: b.devices().to_vec(),
        source: SourceKind::Live,
        backend_name: b.name().into(),
        interval: Duration::from_secs(1),
        theme: Theme { color: false },
        can_signal: false,
        topology: b.topology(),
    });
    for _ in 0..3 {
        app.push_tick(b.poll().unwrap());
    }
    app.refresh_findings();
    let screen = render(&app, 120, 30);
    assert!(screen.contains("AMD Instinct MI300X"), "{screen}");
    // Gen4 of a Gen5 link, shown as on NVIDIA; absent values read n/a, never 0.
    assert!(screen.contains("PCIe 4x16(max 5x16)"), "{screen}");
    insta::assert_snapshot!("amd_mi300x_devices_120x30", screen);
    press(&mut app, &[KeyCode::Char('4')]);
    let findings = render(&app, 120, 30);
    assert!(
        findings.contains("AMD GPU: checks that need NVIDIA-only signals"),
        "{findings}"
    );
}

/// A replay shows the findings its recording carried once it has reached them, marked as
/// recorded, and not before.
#[test]
fn recorded_findings_appear_when_the_replay_reaches_them() {
    let mut b = open("healthy");
    let mut app = new_app(&b, "healthy.ndjson", false);
    let ticks = all_ticks(&mut b);
    let first = ticks[0].samples[0].time_ms;
    let carried = gpudiag_model::finding::Finding {
        id: "thermal.near_slowdown".into(),
        severity: gpudiag_model::finding::Severity::Warn,
        device: Some(0),
        time_ms: first + 5000,
        title: "GPU 0 runs within 5 °C of its slowdown temperature".into(),
        evidence: gpudiag_model::finding::Evidence {
            values: serde_json::Map::new(),
            window_s: 10.0,
            threshold: ">= 85 °C".into(),
        },
        advice: "Check the airflow.".into(),
        last_seen_ms: None,
        state: Default::default(),
        recorded: false,
    };
    app.set_recorded(vec![carried]);
    let (early, late): (Vec<Tick>, Vec<Tick>) = ticks
        .into_iter()
        .partition(|t| t.samples.iter().all(|s| s.time_ms < first + 5000));
    app.on_feed(
        SamplerMsg::Ticks {
            ticks: early,
            reset: false,
            position: None,
        },
        Instant::now(),
    );
    app.refresh_findings();
    assert!(app.findings.iter().all(|f| f.id != "thermal.near_slowdown"));
    app.on_feed(
        SamplerMsg::Ticks {
            ticks: late,
            reset: false,
            position: None,
        },
        Instant::now(),
    );
    app.refresh_findings();
    let shown: Vec<_> = app
        .findings
        .iter()
        .filter(|f| f.id == "thermal.near_slowdown")
        .collect();
    assert_eq!(shown.len(), 1);
    assert!(shown[0].recorded);
    app.panel = Panel::Findings;
    assert!(render(&app, 120, 36).contains("(recorded)"));
}

/// A kernel log of XIDs from before the session: XID 79 on GPU 1 (3B:00), a DBE on GPU 0 (19:00).
fn past_xids() -> Result<gpudiag_telemetry::kernel_log::XidLog, String> {
    use gpudiag_telemetry::kernel_log::{KernelLogSource, read_xids};
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("kmsg");
    std::fs::write(
        &log,
        "4,2901,3601877410,-;NVRM: Xid (PCI:0000:19:00): 48, pid=1234, name=python3, An \
         uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at \
         partition 0, subpartition 0.\n\
         4,2950,3605123456,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, \
         GPU has fallen off the bus.\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("stat"), "btime 1767222000\n").unwrap();
    read_xids(&KernelLogSource::File(log), dir.path())
}

#[test]
fn xids_from_before_the_session_are_findings_judged_by_the_gpus_present_state() {
    let mut b = open("gpu_lost");
    let mut app = new_app(&b, "gpu_lost.ndjson", false);
    app.set_kernel_xids(past_xids());
    let ticks = all_ticks(&mut b);
    let severity = |app: &App, id: &str, device: u32| {
        app.findings
            .iter()
            .find(|f| f.id == id && f.device == Some(device))
            .map(|f| f.severity)
    };
    // Before GPU 1 falls off the bus again, both are history.
    app.push_tick(ticks[0].clone());
    app.refresh_findings();
    assert_eq!(
        severity(&app, "errors.past_xid_79", 1),
        Some(Severity::Info)
    );
    assert_eq!(
        severity(&app, "errors.past_xid_48", 0),
        Some(Severity::Info)
    );
    let title = &app
        .findings
        .iter()
        .find(|f| f.id == "errors.past_xid_79")
        .unwrap()
        .title;
    assert_eq!(
        title,
        "XID 79 at 2026-01-01 00:00 UTC (before this session): GPU has fallen off the bus"
    );
    // Once it is lost now, its past XID 79 is live again; GPU 0's DBE stays history.
    for t in ticks.into_iter().skip(1) {
        app.push_tick(t);
    }
    app.refresh_findings();
    assert_eq!(
        severity(&app, "errors.past_xid_79", 1),
        Some(Severity::Fail)
    );
    assert_eq!(
        severity(&app, "errors.past_xid_48", 0),
        Some(Severity::Info)
    );
}

#[test]
fn an_unreadable_kernel_log_is_said_in_the_footer() {
    let b = open("two_gpus");
    let mut app = new_app(&b, "two_gpus.ndjson", false);
    app.set_kernel_xids(Err("/dev/kmsg: Operation not permitted (os error 1)".into()));
    let status = app.status.clone().unwrap();
    assert!(
        status.starts_with("not judged: errors.kernel_log_xid"),
        "{status}"
    );
    assert!(status.contains("before this session"), "{status}");
    assert!(render(&app, 120, 36).contains("not judged: errors.kernel_log_xid"));
}

// ---------------------------------------------------------------------------------------------
// Text fitted to the screen, and the verdict of a window that changed

/// Rows of `screen` whose text runs into the last cell before `edge` columns from the right
/// (the right border, or the screen's edge) without ending in the cut mark: text that ratatui
/// clipped silently.
fn cut_without_a_mark(screen: &str, rows: std::ops::Range<usize>, edge: usize) -> Vec<String> {
    screen
        .lines()
        .map(|l| l.trim_matches('"'))
        .enumerate()
        .filter(|(i, _)| rows.contains(i))
        .filter_map(|(_, l)| {
            let cells: Vec<char> = l.chars().collect();
            let last = *cells.get(cells.len().checked_sub(edge + 1)?)?;
            (last != ' ' && last != '…').then(|| l.to_owned())
        })
        .collect()
}

/// Finding titles, evidence, the header and the footer are cut with "…" at 80 and 120 columns,
/// never silently: the demo's leak finding is longer than 80 columns.
#[test]
fn cut_text_ends_with_a_mark_at_80_and_120_columns() {
    let mut app = loaded("demo");
    app.panel = Panel::Findings;
    for (w, h) in [(80u16, 24u16), (120, 40)] {
        let screen = render(&app, w, h);
        let h = usize::from(h);
        let title = screen
            .lines()
            .find(|l| l.contains("GPU0  python3 (pid 477) on GPU 0 grows steadily"))
            .unwrap_or_else(|| panic!("{screen}"));
        let text = title.trim_matches('"').trim_end_matches('│').trim_end();
        // Too long for 80 columns, whole at 120 (where what follows it, that the leak passed
        // when its process left, is cut with the mark).
        if w == 80 {
            assert!(text.ends_with('…'), "{w}x{h}: {title}");
        } else {
            assert!(text.contains("32388 MiB in 117 s"), "{w}x{h}: {title}");
        }
        let bad = cut_without_a_mark(&screen, 5..h - 2, 1);
        assert!(bad.is_empty(), "{w}x{h} cut silently: {bad:#?}\n{screen}");
        let bad = cut_without_a_mark(&screen, 0..3, 0);
        assert!(bad.is_empty(), "{w}x{h} header cut silently: {bad:#?}");
    }
}

/// A one-device recording in the profiled fixture's format: `util` and `sm` (utilisation and
/// SM active, %) for each second.
fn recording_of(seconds: &[(f64, f64)]) -> Vec<u8> {
    let text = std::fs::read_to_string(fixture("profiled.ndjson")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut header = lines[0].clone();
    let first = header["devices"][0].clone();
    header["devices"] = serde_json::json!([first]);
    // A sample with profiling counters, on device 0.
    let template = lines
        .iter()
        .find(|l| l["device"] == 0 && l["sm_active_pct"].is_number())
        .unwrap();
    let start = template["time_ms"].as_u64().unwrap();
    let mut out = format!("{header}\n");
    for (i, &(util, sm)) in seconds.iter().enumerate() {
        let mut s = template.clone();
        s["time_ms"] = serde_json::json!(start + 1000 * i as u64);
        s["gpu_util_pct"] = serde_json::json!(util);
        s["sm_active_pct"] = serde_json::json!(sm);
        for key in ["sm_occupancy_pct", "gr_engine_active_pct"] {
            s[key] = serde_json::json!(sm);
        }
        for key in [
            "tensor_active_pct",
            "dram_active_pct",
            "fp64_active_pct",
            "fp32_active_pct",
            "fp16_active_pct",
        ] {
            s[key] = serde_json::json!(0.0);
        }
        s["processes"] = serde_json::Value::Null;
        out.push_str(&format!("{s}\n"));
    }
    out.into_bytes()
}

/// Idle for 20 s, then a one-warp spin (utilisation 100%, SM active 1%) for 15 s: while the
/// replay plays, the window's verdict blends the two, so the header leads with the spin ("now
/// underfilled") and gives the blend after it; a window of one phase keeps the one verdict. At
/// the recording's end the header gives the verdict on all of it.
#[test]
fn header_leads_with_the_phase_the_window_ends_in() {
    let mut seconds = vec![(0.0, 0.0); 20];
    seconds.extend([(100.0, 1.0); 15]);
    let b = ReplayBackend::from_reader(
        std::io::Cursor::new(recording_of(&seconds)),
        Pace::AsFastAsPossible,
    )
    .unwrap();
    let mut app = playing_from(b, "spin.ndjson");
    let engine = &app.session.pipeline.engine;
    let window = engine.verdicts()[&0].clone();
    let now = engine
        .current_phase(0)
        .expect("two phases in the window")
        .clone();
    assert_eq!(now.verdict.bottleneck.to_string(), "underfilled");
    // The window's own means blend the idle and the spin (launch-bound); its verdict names
    // what held most of it, the spin, as the phase does.
    assert_eq!(window.bottleneck, now.verdict.bottleneck, "{window:?}");
    assert_eq!(
        window.evidence["whole_window_bottleneck"], "launch_bound",
        "{window:?}"
    );
    // The spin's 15 s, to the 10 s slice phases are judged by.
    assert!((10.0..=20.0).contains(&now.duration_s()), "{now:?}");
    for (w, h) in [(120u16, 40u16), (80, 24)] {
        let screen = render(&app, w, h);
        let line = screen.lines().nth(2).unwrap().trim_matches('"').trim_end();
        let lead = format!(
            "verdict GPU 0: now underfilled, {:.0} s (high) — ",
            now.duration_s()
        );
        assert!(line.starts_with(&lead), "{w}x{h}: {line}");
        assert!(line.contains("utilisation 100%, SM active 1.0%"), "{line}");
        if w == 120 {
            let blend = format!("· over {:.0} s: {} (", window.window_s(), window.bottleneck);
            assert!(line.contains(&blend), "{line}");
        } else {
            assert!(line.ends_with('…'), "{line}");
        }
    }
    // The Detail block speaks of the spin too, with its advice.
    app.panel = Panel::Detail;
    let screen = render(&app, 120, 40);
    let lead = format!("│now, {:.0} s: ", now.duration_s());
    assert!(screen.contains(&lead), "{screen}");
    assert!(
        screen.contains(&format!("what to do: {}", &now.verdict.advice[..20])),
        "{screen}"
    );
    // Spin alone: one phase, one verdict, as before.
    let b = ReplayBackend::from_reader(
        std::io::Cursor::new(recording_of(&[(100.0, 1.0); 35])),
        Pace::AsFastAsPossible,
    )
    .unwrap();
    let app = playing_from(b, "spin.ndjson");
    assert!(app.session.pipeline.engine.current_phase(0).is_none());
    let screen = render(&app, 120, 40);
    let line = screen.lines().nth(2).unwrap();
    assert!(
        line.contains("verdict GPU 0: underfilled (high) — over 30 s"),
        "{line}"
    );
    // At the recording's end the whole of it is judged, as `check` judges it.
    let mut app = app;
    app.on_feed(SamplerMsg::Ended(None), Instant::now());
    app.refresh_findings();
    let whole = app.session.pipeline.engine.verdicts()[&0].clone();
    assert!(whole.window_s() >= 34.0, "{whole:?}");
    let screen = render(&app, 120, 40);
    let line = screen.lines().nth(2).unwrap();
    assert!(
        line.contains(&format!("over {:.0} s", whole.window_s())),
        "{line}"
    );
}

/// The demo's process runs as root in a Slurm job of `demo` (its recording made it so): the
/// Processes panel names the one user `serve`'s per-process series name (so `fleet` too), the
/// job's, rather than a second one.
#[test]
fn the_demo_names_one_user_for_its_process_in_the_ui_and_in_prometheus() {
    let mut b = open("demo");
    let mut app = new_app(&b, "demo", false);
    while let Ok(t) = b.poll() {
        let holds = t
            .samples
            .iter()
            .any(|s| s.processes.as_ref().is_some_and(|p| !p.is_empty()));
        app.push_tick(t);
        if holds {
            break;
        }
    }
    let latest = app.session.pipeline.latest.clone();
    let recorded = latest[&0].processes.as_ref().unwrap()[0].clone();
    assert_eq!(
        recorded.user.as_deref(),
        Some("root"),
        "the recording as made"
    );
    let snapshot = gpudiag_export::prometheus::Snapshot {
        host: b.host().clone(),
        devices: b.devices().to_vec(),
        latest,
        ..Default::default()
    };
    let exposition = gpudiag_export::prometheus::render(&snapshot, Instant::now());
    let series = exposition
        .lines()
        .find(|l| l.starts_with("gpudiag_process_memory_used_bytes{"))
        .expect("a per-process series");
    let label = series
        .split("user=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a user label");
    assert_eq!(label, "demo", "{series}");

    app.panel = Panel::Processes;
    let screen = render(&app, 160, 48);
    let row = screen
        .lines()
        .find(|l| l.contains("python3"))
        .unwrap_or_else(|| panic!("no process row: {screen}"));
    let user = row
        .trim_matches(|c: char| c == '"' || c == '│' || c == '▶' || c.is_whitespace())
        .split_whitespace()
        .nth(2);
    assert_eq!(user, Some(label), "{row}");
    assert!(!row.contains("root"), "{row}");
}

/// The header follows the process's exit: on the demo's first tick whose process list is
/// empty (its process had held 33 GiB idle, then exited), the header no longer calls the GPU
/// idle while holding memory beside "memory 0.0 GiB", but idle since the process left, and
/// stays so to the end of the recording; over the window, idle holding memory stays true.
#[test]
fn the_header_follows_the_process_exit_in_the_demo() {
    let mut b = open("demo");
    let mut app = new_app(&b, "demo", false);
    let mut held = false;
    let mut after_exit = Vec::new();
    while let Ok(t) = b.poll() {
        let listed = t.samples.first().and_then(|s| s.processes.clone());
        app.push_tick(t);
        match listed {
            Some(p) if !p.is_empty() => held = true,
            Some(_) if held => {
                let screen = render(&app, 200, 30);
                let header = screen.lines().nth(2).unwrap_or_default();
                after_exit.push(header.trim_matches(['"', ' ']).to_owned());
            }
            _ => {}
        }
    }
    assert!(after_exit.len() >= 10, "{after_exit:#?}");
    for line in &after_exit {
        assert!(
            line.starts_with("verdict GPU 0: now idle, "),
            "after the exit: {after_exit:#?}"
        );
        assert!(
            !line.contains("now idle_holding_memory"),
            "after the exit: {after_exit:#?}"
        );
    }
    assert!(
        after_exit[0].contains("over 30 s: idle_holding_memory"),
        "{after_exit:#?}"
    );
}

/// At 64 columns the process table drops the user rather than cut the growth's unit into the
/// SM column; at 80 the device list names the throttle reason before the PCIe rates.
#[test]
fn narrow_screens_keep_the_growth_whole_and_name_the_throttle_reason() {
    let mut b = open("two_gpus");
    let mut app = new_app(&b, "two_gpus.ndjson", false);
    for _ in 0..6 {
        app.push_tick(b.poll().unwrap());
    }
    app.panel = Panel::Processes;
    let screen = render(&app, 64, 20);
    assert!(screen.contains("GROWTH 1m"), "{screen}");
    assert!(!screen.contains("USER"), "{screen}");
    let rows: Vec<&str> = screen.lines().filter(|l| l.contains("/s")).collect();
    assert!(!rows.is_empty(), "{screen}");
    for row in rows {
        assert!(row.contains("MiB/s") || row.contains("B/s"), "{row}");
        assert!(!row.contains("MiB/ "), "cut unit: {row}");
    }
    let mut app = loaded("profiled");
    app.panel = Panel::Devices;
    let screen = render(&app, 80, 24);
    assert!(screen.contains("⚠ sw_power_cap"), "{screen}");
}
