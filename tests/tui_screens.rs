//! The pictures of the terminal UI in the README and docs/tui.md: the UI itself rendered into
//! ratatui's `TestBackend` from the bundled demo recording, then each cell drawn as SVG with its colours and bold, so a picture is what a terminal shows,
//! not a hand-made mock-up. The test fails when a committed picture differs from what the UI
//! draws today; `GPUDIAG_UPDATE_SCREENS=1 cargo nextest run --locked --test e2e
//! tui_screens::` rewrites them (after a UI change, or when the demo recording is made again).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use gpudiag::tui::app::{App, AppInit, Panel, SourceKind};
use gpudiag::tui::theme::Theme;
use gpudiag::tui::ui;
use gpudiag_core::session::{DEMO_NAME, DEMO_RECORDING};
use gpudiag_telemetry::ReplayPosition;
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::sampler::SamplerMsg;
use gpudiag_telemetry::{Backend, Tick};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

use crate::support::at;

const UPDATE: &str = "GPUDIAG_UPDATE_SCREENS";

fn screens_dir() -> PathBuf {
    at("assets/screens")
}

// ---------------------------------------------------------------------------------------------
// The scenes

/// One picture: a file name, what it shows (the SVG's title), and the screen it renders.
struct Scene {
    name: &'static str,
    title: &'static str,
    width: u16,
    height: u16,
    app: App,
}

/// Every picture the docs show. The moment of the demo is chosen from its data (the end of its
/// longest stretch at full load), not a fixed time, so a demo recorded again still gives a
/// busy GPU rather than an idle one.
fn scenes() -> Vec<Scene> {
    let demo = Source::demo;
    let (w, h) = (120, 36);
    let mut scenes = Vec::new();

    let mut app = demo().app_at_full_load();
    app.panel = Panel::Devices;
    scenes.push(Scene {
        name: "devices",
        title: "gpudiag: the Devices panel and the verdict, bundled demo at full load",
        width: w,
        height: h,
        app,
    });

    let mut app = demo().app_at_full_load();
    app.panel = Panel::Detail;
    scenes.push(Scene {
        name: "detail",
        title: "gpudiag: the Detail panel's verdict, advice and charts, bundled demo",
        width: w,
        height: h,
        app,
    });

    let mut app = demo().app_at_full_load();
    app.panel = Panel::Processes;
    scenes.push(Scene {
        name: "processes",
        title: "gpudiag: the Processes panel, bundled demo at full load",
        width: w,
        height: h,
        app,
    });

    // At the end, so the findings of every phase are in.
    let mut app = demo().app_at_end();
    app.panel = Panel::Findings;
    scenes.push(Scene {
        name: "findings",
        title: "gpudiag: the Findings panel, worst first, at the end of the bundled demo",
        width: w,
        height: h,
        app,
    });

    let mut app = demo().app_at_end();
    app.panel = Panel::Findings;
    app.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    scenes.push(Scene {
        name: "finding-detail",
        title: "gpudiag: the worst finding of the bundled demo opened: evidence and advice",
        width: w,
        height: h,
        app,
    });

    // A job's GPUs side by side, at the smallest terminal the UI is made for and a large one.
    for (width, height, name) in [(80, 24, "job-80x24"), (200, 60, "job-200x60")] {
        let mut app = Source::job8().app_at_end();
        app.panel = Panel::Job;
        scenes.push(Scene {
            name,
            title: "gpudiag: the Job panel, eight H100s of one torchrun job side by side, \
                    GPU 5 the straggler (synthetic recording)",
            width,
            height,
            app,
        });
    }
    scenes
}

/// A recording read whole, and how the UI names it in its header.
struct Source {
    backend: ReplayBackend,
    name: String,
    ticks: Vec<Tick>,
    /// The header with fewer devices than the recording's (`only`).
    subset: Option<gpudiag_telemetry::recording::Header>,
}

impl Source {
    fn demo() -> Source {
        let backend = ReplayBackend::from_reader(DEMO_RECORDING, Pace::AsFastAsPossible).unwrap();
        Source::read(backend, DEMO_NAME.to_owned())
    }

    /// A fixture recording from tests/fixtures/recordings.
    fn fixture(file: &str) -> Source {
        let path = at("tests/fixtures/recordings").join(file);
        let backend = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
        Source::read(backend, file.to_owned())
    }

    /// A real recording of a job that stopped making progress (tests/fixtures/stalls).
    fn stall(file: &str) -> Source {
        let path = at("tests/fixtures/stalls").join(file);
        let backend = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
        Source::read(backend, file.to_owned())
    }

    /// Eight H100s of one torchrun job, GPU 5 the straggler (tests/fixtures/make_job_recording.py).
    fn job8() -> Source {
        Source::fixture("job8_straggler.ndjson")
    }

    /// The recording with only the samples of `devices`, as if the host had no other GPU.
    fn only(mut self, devices: &[u32]) -> Source {
        let mut header = self.backend.header().clone();
        header.devices.retain(|d| devices.contains(&d.index));
        for t in &mut self.ticks {
            t.samples.retain(|s| devices.contains(&s.device));
        }
        self.subset = Some(header);
        self
    }

    fn read(mut backend: ReplayBackend, name: String) -> Source {
        let mut ticks = Vec::new();
        while let Ok(t) = backend.poll() {
            ticks.push(t);
        }
        assert!(!ticks.is_empty(), "{name} has no ticks");
        Source {
            backend,
            name,
            ticks,
            subset: None,
        }
    }

    /// The UI as `gpudiag replay` builds it, in colour.
    fn new_app(&self) -> App {
        let b = &self.backend;
        let header = self.subset.as_ref().unwrap_or(b.header());
        let mut app = App::new(AppInit {
            host: header.host.clone(),
            devices: header.devices.clone(),
            source: SourceKind::Replay {
                name: self.name.clone(),
            },
            backend_name: b.header().backend.clone(),
            interval: Duration::from_secs(1),
            theme: Theme { color: true },
            can_signal: false,
            topology: b.header().topology.clone(),
        });
        app.set_recorded(b.recorded_findings());
        app
    }

    /// The UI having played the recording up to and including tick `last`.
    fn app_until(&self, last: usize) -> App {
        let mut app = self.new_app();
        let times: Vec<u64> = self.ticks.iter().filter_map(tick_time).collect();
        let position = ReplayPosition {
            current_ms: tick_time(&self.ticks[last]).unwrap_or_default(),
            start_ms: times.iter().copied().min().unwrap_or_default(),
            end_ms: times.iter().copied().max().unwrap_or_default(),
        };
        app.on_feed(
            SamplerMsg::Ticks {
                ticks: self.ticks[..=last].to_vec(),
                reset: false,
                position: Some(position),
            },
            Instant::now(),
        );
        if last + 1 == self.ticks.len() {
            app.on_feed(SamplerMsg::Ended(None), Instant::now());
        }
        app.refresh_findings();
        app
    }

    fn app_at_end(&self) -> App {
        self.app_until(self.ticks.len() - 1)
    }

    fn app_at_full_load(&self) -> App {
        self.app_until(end_of_longest_full_load(&self.ticks))
    }
}

/// The last tick of the longest run of ticks in which every GPU reads at least 90%
/// utilisation (ticks without samples neither extend nor break a run); the last tick when no
/// GPU ever gets there.
fn end_of_longest_full_load(ticks: &[Tick]) -> usize {
    let (mut best, mut best_len, mut len) = (ticks.len() - 1, 0, 0);
    for (i, t) in ticks.iter().enumerate() {
        if t.samples.is_empty() {
            continue;
        }
        let busy = t
            .samples
            .iter()
            .all(|s| s.gpu_util_pct.is_some_and(|u| u >= 90.0));
        len = if busy { len + 1 } else { 0 };
        if busy && len > best_len {
            (best, best_len) = (i, len);
        }
    }
    best
}

fn render(app: &App, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().buffer().clone()
}

// ---------------------------------------------------------------------------------------------
// Cells to SVG

/// Cell size in pixels: a 15 px monospace font advances about 9 px a character.
const CELL_W: usize = 9;
const CELL_H: usize = 18;
const FONT_PX: usize = 15;
/// Baseline below a row's top: box-drawing and block glyphs then span the whole row, so
/// borders join from row to row.
const BASELINE: usize = 14;
const PAD: usize = 10;
const DEFAULT_FG: &str = "#d4d4d4";
const DEFAULT_BG: &str = "#1e1e1e";

/// A dark terminal palette for the 16 named colours (the ones the UI's theme uses).
fn named(c: Color) -> Option<&'static str> {
    Some(match c {
        Color::Black => "#000000",
        Color::Red => "#cd3131",
        Color::Green => "#0dbc79",
        Color::Yellow => "#e5e510",
        Color::Blue => "#3b8eea",
        Color::Magenta => "#bc3fbc",
        Color::Cyan => "#11a8cd",
        Color::Gray => "#e5e5e5",
        Color::DarkGray => "#808080",
        Color::LightRed => "#f14c4c",
        Color::LightGreen => "#23d18b",
        Color::LightYellow => "#f5f543",
        Color::LightBlue => "#3b8eea",
        Color::LightMagenta => "#d670d6",
        Color::LightCyan => "#29b8db",
        Color::White => "#ffffff",
        _ => return None,
    })
}

/// `None` for the terminal's default colour.
fn hex(c: Color) -> Option<String> {
    const NAMED: [Color; 16] = [
        Color::Black,
        Color::Red,
        Color::Green,
        Color::Yellow,
        Color::Blue,
        Color::Magenta,
        Color::Cyan,
        Color::Gray,
        Color::DarkGray,
        Color::LightRed,
        Color::LightGreen,
        Color::LightYellow,
        Color::LightBlue,
        Color::LightMagenta,
        Color::LightCyan,
        Color::White,
    ];
    match c {
        Color::Reset => None,
        Color::Rgb(r, g, b) => Some(format!("#{r:02x}{g:02x}{b:02x}")),
        // xterm's 256 colours: the 16 named ones, a 6x6x6 cube, then 24 greys.
        Color::Indexed(i @ 0..=15) => named(NAMED[usize::from(i)]).map(str::to_owned),
        Color::Indexed(i @ 16..=231) => {
            let level = |v: u8| if v == 0 { 0 } else { 55 + 40 * v };
            let i = i - 16;
            let (r, g, b) = (level(i / 36), level(i / 6 % 6), level(i % 6));
            Some(format!("#{r:02x}{g:02x}{b:02x}"))
        }
        Color::Indexed(i) => {
            let v = 8 + 10 * (i - 232);
            Some(format!("#{v:02x}{v:02x}{v:02x}"))
        }
        other => named(other).map(str::to_owned),
    }
}

/// What a cell looks like once reverse video is applied.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Look {
    fg: String,
    bg: String,
    bold: bool,
    italic: bool,
    underline: bool,
    dim: bool,
}

fn look(cell: &ratatui::buffer::Cell) -> Look {
    let mut fg = hex(cell.fg).unwrap_or_else(|| DEFAULT_FG.to_owned());
    let mut bg = hex(cell.bg).unwrap_or_else(|| DEFAULT_BG.to_owned());
    if cell.modifier.contains(Modifier::REVERSED) {
        std::mem::swap(&mut fg, &mut bg);
    }
    Look {
        fg,
        bg,
        bold: cell.modifier.contains(Modifier::BOLD),
        italic: cell.modifier.contains(Modifier::ITALIC),
        underline: cell.modifier.contains(Modifier::UNDERLINED),
        dim: cell.modifier.contains(Modifier::DIM),
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            // XML 1.0 allows no other control character, even escaped.
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// The buffer as SVG: a background rectangle per stretch of cells with a colour other than the
/// default, and a text element per stretch with one look. ASCII and other characters go in
/// separate elements, so glyphs a viewer takes from another font (braille, box drawing) can be
/// placed cell by cell without shifting the text around them.
fn svg(buf: &Buffer, title: &str) -> String {
    let area = buf.area;
    let (w, h) = (usize::from(area.width), usize::from(area.height));
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    let mut class_of = |colour: &str| -> String {
        let n = classes.len();
        format!("c{}", *classes.entry(colour.to_owned()).or_insert(n))
    };
    let mut body = String::new();
    for y in 0..h {
        let row: Vec<(String, Look)> = (0..w)
            .map(|x| {
                let cell = &buf[(area.x + x as u16, area.y + y as u16)];
                let symbol = match cell.symbol() {
                    "" => " ",
                    s => s,
                };
                (symbol.to_owned(), look(cell))
            })
            .collect();
        // Backgrounds.
        let mut x = 0;
        while x < w {
            let bg = &row[x].1.bg;
            let start = x;
            while x < w && &row[x].1.bg == bg {
                x += 1;
            }
            if bg != DEFAULT_BG {
                writeln!(
                    body,
                    r#"<rect x="{}" y="{}" width="{}" height="{CELL_H}" fill="{bg}"/>"#,
                    start * CELL_W,
                    y * CELL_H,
                    (x - start) * CELL_W
                )
                .unwrap();
            }
        }
        // Text.
        let mut x = 0;
        while x < w {
            let (ref symbol, ref l) = row[x];
            let ascii = symbol.is_ascii();
            let start = x;
            while x < w && &row[x].1 == l && row[x].0.is_ascii() == ascii {
                x += 1;
            }
            let mut cells: &[(String, Look)] = &row[start..x];
            let mut at = start;
            // Spaces draw nothing unless underlined; trim them so the element is the ink.
            if !l.underline {
                while let [(first, _), rest @ ..] = cells
                    && first == " "
                {
                    cells = rest;
                    at += 1;
                }
                while let [rest @ .., (last, _)] = cells
                    && last == " "
                {
                    cells = rest;
                }
            }
            if cells.is_empty() {
                continue;
            }
            let text: String = cells.iter().map(|(s, _)| s.as_str()).collect();
            let mut class = class_of(&l.fg);
            for (on, name) in [
                (l.bold, "b"),
                (l.italic, "i"),
                (l.underline, "u"),
                (l.dim, "d"),
            ] {
                if on {
                    class.push(' ');
                    class.push_str(name);
                }
            }
            let y = y * CELL_H + BASELINE;
            if ascii {
                // The monospace font's own advance is within a few hundredths of a pixel of
                // the cell; textLength evens out the rest where the viewer supports it.
                writeln!(
                    body,
                    r#"<text x="{}" y="{y}" textLength="{}" class="{class}">{}</text>"#,
                    at * CELL_W,
                    cells.len() * CELL_W,
                    escape(&text)
                )
                .unwrap();
            } else {
                // Braille, blocks and box drawing often come from a fallback font with another
                // advance: each glyph gets its own cell's position, which every viewer honours.
                let xs: Vec<String> = (at..at + cells.len())
                    .map(|c| (c * CELL_W).to_string())
                    .collect();
                writeln!(
                    body,
                    r#"<text x="{}" y="{y}" class="{class}">{}</text>"#,
                    xs.join(" "),
                    escape(&text)
                )
                .unwrap();
            }
        }
    }
    let (width, height) = (w * CELL_W + 2 * PAD, h * CELL_H + 2 * PAD);
    let mut style = String::from(
        "text{white-space:pre}.b{font-weight:bold}.i{font-style:italic}\
         .u{text-decoration:underline}.d{opacity:.6}",
    );
    let mut by_number: Vec<(&String, &usize)> = classes.iter().collect();
    by_number.sort_by_key(|(_, n)| **n);
    for (colour, n) in by_number {
        write!(style, ".c{n}{{fill:{colour}}}").unwrap();
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" xml:space=\"preserve\" width=\"{width}\" \
         height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         font-family=\"'DejaVu Sans Mono',Menlo,Consolas,'Liberation Mono',monospace\" \
         font-size=\"{FONT_PX}\">\n\
         <title>{}</title>\n<style>{style}</style>\n\
         <rect width=\"{width}\" height=\"{height}\" rx=\"6\" fill=\"{DEFAULT_BG}\"/>\n\
         <g transform=\"translate({PAD},{PAD})\">\n{body}</g>\n</svg>\n",
        escape(title)
    )
}

// ---------------------------------------------------------------------------------------------
// Tests

/// Every committed picture is what the UI draws today; with `GPUDIAG_UPDATE_SCREENS` set, the
/// pictures are written instead.
#[test]
fn committed_pictures_match_what_the_ui_draws() {
    let update = std::env::var_os(UPDATE).is_some();
    let dir = screens_dir();
    let mut stale = Vec::new();
    for scene in scenes() {
        let picture = svg(&render(&scene.app, scene.width, scene.height), scene.title);
        let path = dir.join(format!("{}.svg", scene.name));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &picture).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != picture {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date with the UI: {}\nregenerate them: {UPDATE}=1 cargo nextest run --locked \
         --test e2e tui_screens::",
        stale.join(", ")
    );
}

/// No picture is left behind in assets/screens/ by a scene that was renamed or removed.
#[test]
fn every_committed_picture_has_a_scene() {
    let names: Vec<String> = scenes().iter().map(|s| format!("{}.svg", s.name)).collect();
    let orphans: Vec<String> = std::fs::read_dir(screens_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg") && !names.contains(n))
        .collect();
    assert!(orphans.is_empty(), "pictures no scene draws: {orphans:?}");
}

/// The scenes show what their names promise. Only what any demo recording made with
/// assets/demo/load.py shows is asked for, so recording the demo again needs no change here.
#[test]
fn the_scenes_show_what_they_are_named_for() {
    let text = |scene: &Scene| {
        let buf = render(&scene.app, scene.width, scene.height);
        let area = buf.area;
        (0..area.height)
            .map(|y| {
                (0..area.width)
                    .map(|x| buf[(x, y)].symbol().to_owned())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    for scene in scenes() {
        let screen = text(&scene);
        let expected: &[&str] = match scene.name {
            "devices" => &["[1 Devices]", "verdict GPU 0", "util"],
            "detail" => &["[2 Detail]", "what to do", "power"],
            "processes" => &["[3 Processes]", "PID", "python3"],
            "findings" => &["[4 Findings]"],
            "finding-detail" if scene.app.findings.is_empty() => &["[4 Findings]"],
            "finding-detail" => &["┌ Finding ", "Evidence", "What to do"],
            "job-80x24" | "job-200x60" => &["[7 Job]", "job: straggler GPU 5", "◀ straggler"],
            other => panic!("no expectation for scene {other}"),
        };
        for want in expected {
            assert!(
                screen.contains(want),
                "{}: no {want:?} in\n{screen}",
                scene.name
            );
        }
    }
}

/// The screen's rows as text.
fn rows(buf: &Buffer) -> Vec<String> {
    let area = buf.area;
    (0..area.height)
        .map(|y| {
            (0..area.width)
                .map(|x| buf[(x, y)].symbol().to_owned())
                .collect::<String>()
        })
        .collect()
}

/// The Job panel's table: the screen row of each GPU's row ("│  5    5  100%    90% …").
fn job_table(rows: &[String]) -> BTreeMap<u32, usize> {
    let mut table = BTreeMap::new();
    for (y, row) in rows.iter().enumerate() {
        let Some(inner) = row.strip_prefix('│') else {
            continue;
        };
        let cells: Vec<&str> = inner.split_whitespace().collect();
        if let [gpu, rank, util, ..] = cells.as_slice()
            && rank.parse::<u32>().is_ok()
            && (util.ends_with('%') || *util == "n/a")
            && let Ok(gpu) = gpu.parse::<u32>()
        {
            assert!(
                table.insert(gpu, y).is_none(),
                "GPU {gpu} twice:\n{rows:#?}"
            );
        }
    }
    table
}

/// Every GPU of the job has its row, whole, at the smallest size the UI is made for and a
/// large one; the straggler's row alone is marked, in words and in reverse video; the header
/// names the job's verdict.
#[test]
fn the_job_panel_shows_every_gpu_and_marks_the_straggler() {
    let source = Source::job8();
    let mut app = source.app_at_end();
    let job = &app.jobs[0];
    assert_eq!(job.verdict.name(), "straggler", "{job:?}");
    assert_eq!(job.stragglers.first().map(|s| s.device), Some(5), "{job:?}");
    app.panel = Panel::Job;
    for (w, h) in [(80, 24), (200, 60)] {
        let buf = render(&app, w, h);
        let rows = rows(&buf);
        let screen = rows.join("\n");
        assert!(
            rows[2].starts_with("job: straggler GPU 5 (rank 5), peers wait ~50% (high)"),
            "{w}x{h}:\n{screen}"
        );
        assert!(rows[4].contains("[7 Job]"), "{w}x{h}:\n{screen}");
        let table = job_table(&rows);
        assert_eq!(
            table.keys().copied().collect::<Vec<_>>(),
            (0..8).collect::<Vec<u32>>(),
            "{w}x{h}:\n{screen}"
        );
        for (&gpu, &y) in &table {
            let row = &rows[y];
            // Whole: nothing in the row was cut to fit.
            assert!(!row.contains('…'), "GPU {gpu} cut at {w}x{h}:\n{screen}");
            assert_eq!(
                row.contains("◀ straggler"),
                gpu == 5,
                "GPU {gpu} at {w}x{h}:\n{screen}"
            );
            let reversed = buf[(2, y as u16)].modifier.contains(Modifier::REVERSED);
            assert_eq!(reversed, gpu == 5, "GPU {gpu} at {w}x{h}:\n{screen}");
        }
        assert!(
            screen.contains("what to do:"),
            "no advice at {w}x{h}:\n{screen}"
        );
    }
}

/// A hung job: the header says so with how long and whom the job waits for, and the Job panel
/// marks the missing rank (in words and reverse video) and every GPU that waits for it.
#[test]
fn a_hung_job_names_the_rank_it_waits_for_and_marks_the_waiting_gpus() {
    let mut app = Source::stall("real-hung.ndjson.gz").app_at_end();
    let job = &app.jobs[0];
    assert_eq!(job.verdict.name(), "hung", "{job:?}");
    app.panel = Panel::Job;
    for (w, h) in [(80, 24), (200, 60)] {
        let buf = render(&app, w, h);
        let rows = rows(&buf);
        let screen = rows.join("\n");
        assert!(
            rows[2].starts_with("job: hung ") && rows[2].contains("waits for GPU 3 (rank 3)"),
            "{w}x{h}:\n{screen}"
        );
        let table = job_table(&rows);
        assert_eq!(table.len(), 4, "{w}x{h}:\n{screen}");
        for (&gpu, &y) in &table {
            let row = &rows[y];
            let (mark, reversed) = if gpu == 3 {
                ("◀ missing", true)
            } else {
                ("(waits)", false)
            };
            assert!(row.contains(mark), "GPU {gpu} at {w}x{h}:\n{screen}");
            assert_eq!(
                buf[(2, y as u16)].modifier.contains(Modifier::REVERSED),
                reversed,
                "GPU {gpu} at {w}x{h}:\n{screen}"
            );
        }
    }
}

/// On the smallest terminal the UI draws, the GPUs that do not fit are counted, and the
/// straggler's row is never the one left out.
#[test]
fn a_short_terminal_counts_the_gpus_it_leaves_out_but_keeps_the_straggler() {
    let mut app = Source::job8().app_at_end();
    app.panel = Panel::Job;
    for rotate in [0, 6] {
        // Rotated, the straggler comes last among the job's members.
        app.jobs[0].members.rotate_left(rotate);
        let rows = rows(&render(&app, ui::MIN_WIDTH, ui::MIN_HEIGHT));
        let table = job_table(&rows);
        assert_eq!(table.len(), 6, "{rows:#?}");
        assert!(rows[table[&5]].trim_end().ends_with("◀│"), "{rows:#?}");
        assert!(
            rows.iter().any(|r| r.contains("… 2 more GPUs of the job")),
            "{rows:#?}"
        );
    }
}

/// The header's job line stays within 80 columns, the worst job first and the others
/// counted; a GPU waiting for the straggler says so under it.
#[test]
fn the_header_names_the_worst_job_and_counts_the_others() {
    let mut app = Source::job8().app_at_end();
    let rows_at = |app: &App| rows(&render(app, 80, 24));
    let rows = rows_at(&app);
    assert!(
        rows[2].starts_with("job: straggler GPU 5 (rank 5), peers wait ~50%"),
        "{rows:#?}"
    );
    assert!(
        rows[3].starts_with("verdict GPU 0: waiting_for_peer"),
        "{rows:#?}"
    );
    // A second job, balanced: listed first, yet the straggler leads and the other is counted.
    let mut balanced = app.jobs[0].clone();
    balanced.job.key = "another-run".into();
    balanced.verdict = gpudiag_model::job::JobPattern::Balanced;
    balanced.stragglers.clear();
    for m in &mut balanced.members {
        m.role = None;
    }
    app.jobs.insert(0, balanced);
    let rows = rows_at(&app);
    assert!(rows[2].starts_with("job: straggler GPU 5"), "{rows:#?}");
    assert!(rows[2].trim_end().ends_with(" · +1 job"), "{rows:#?}");
    assert!(
        rows.iter()
            .all(|r| gpudiag::tui::format::width_of(r.trim_end()) <= 80),
        "{rows:#?}"
    );
    // The Job panel shows the straggler's job first; ↓ picks the other.
    app.panel = Panel::Job;
    let screen = rows_at(&app).join("\n");
    assert!(
        screen.contains("┌ Job · torchrun run synthetic-run · straggler (high) · 29 s · 1/2 ↑↓"),
        "{screen}"
    );
    app.on_key(KeyEvent::new(KeyCode::Down, KeyModifiers::NONE));
    let screen = rows_at(&app).join("\n");
    assert!(
        screen.contains("┌ Job · torchrun run another-run · balanced (high) · 29 s · 2/2 ↑↓"),
        "{screen}"
    );
    assert!(!screen.contains("◀ straggler"), "{screen}");
    // A job only the executable ties together says so, in the header and the panel.
    app.jobs.retain(|j| j.job.key == "another-run");
    app.jobs[0].presumed = true;
    let rows = rows_at(&app);
    assert!(
        rows[2].starts_with("job (presumed): balanced (8 GPUs)"),
        "{rows:#?}"
    );
    assert!(
        rows.iter()
            .any(|r| r.contains("presumed: only their executable ties")),
        "{rows:#?}"
    );
}

/// The eight-GPU job with GPUs 2 and 5 leading together (a hand-made verdict over the
/// recording's figures) and a doubt about its ranks.
fn two_stragglers() -> App {
    use gpudiag_model::job::GpuRole;
    let mut app = Source::job8().app_at_end();
    let job = &mut app.jobs[0];
    let mut second = job.stragglers[0].clone();
    second.device = 2;
    second.rank = Some(2);
    job.stragglers.insert(0, second);
    let five = job.peers.iter().find(|p| p.device == 5).unwrap().clone();
    for p in job.peers.iter_mut().filter(|p| p.device == 2) {
        *p = gpudiag_model::job::PeerFigures {
            device: 2,
            rank: Some(2),
            ..five.clone()
        };
    }
    for m in &mut job.members {
        m.role = Some(if [2, 5].contains(&m.device) {
            GpuRole::Straggler
        } else {
            GpuRole::Waiting
        });
    }
    job.doubts = vec!["RANK 3 is read on 2 GPUs".into()];
    app
}

/// Several stragglers: the header names each briefly, the panel marks each row and every GPU
/// that waits, and lists the doubt.
#[test]
fn two_stragglers_are_each_named_and_the_waiting_gpus_marked() {
    let mut app = two_stragglers();
    app.panel = Panel::Job;
    for (w, h) in [(80, 24), (120, 36), (200, 60)] {
        let buf = render(&app, w, h);
        let rows = rows(&buf);
        let screen = rows.join("\n");
        assert!(
            rows[2].starts_with("job: stragglers GPU 2, 5, peers wait ~50% (high)"),
            "{w}x{h}:\n{screen}"
        );
        let table = job_table(&rows);
        assert_eq!(table.len(), 8, "{w}x{h}:\n{screen}");
        for (&gpu, &y) in &table {
            let row = rows[y].trim_end().trim_end_matches('│').trim_end();
            let straggler = gpu == 2 || gpu == 5;
            let mark = if straggler {
                "◀ straggler"
            } else {
                "(waits)"
            };
            assert!(row.ends_with(mark), "GPU {gpu} at {w}x{h}:\n{screen}");
            let reversed = buf[(2, y as u16)].modifier.contains(Modifier::REVERSED);
            assert_eq!(reversed, straggler, "GPU {gpu} at {w}x{h}:\n{screen}");
        }
        assert!(
            screen.contains("doubt: RANK 3 is read on 2 GPUs"),
            "{w}x{h}:\n{screen}"
        );
        if (w, h) != (200, 60) {
            insta::assert_snapshot!(format!("job_two_stragglers_{w}x{h}"), screen);
        }
    }
}

/// On the smallest terminal the UI draws, both stragglers' rows stay wherever they come in
/// the job, and the GPUs left out are counted.
#[test]
fn a_short_terminal_keeps_every_stragglers_row() {
    let mut app = two_stragglers();
    app.panel = Panel::Job;
    // The stragglers last among the job's members, then first.
    for order in [[0, 1, 3, 4, 6, 7, 2, 5], [2, 5, 0, 1, 3, 4, 6, 7]] {
        app.jobs[0]
            .members
            .sort_by_key(|m| order.iter().position(|&d| d == m.device));
        let rows = rows(&render(&app, ui::MIN_WIDTH, ui::MIN_HEIGHT));
        let table = job_table(&rows);
        assert_eq!(table.len(), 6, "{rows:#?}");
        for gpu in [2, 5] {
            assert!(
                table
                    .get(&gpu)
                    .is_some_and(|&y| rows[y].trim_end().ends_with("◀│")),
                "GPU {gpu}: {rows:#?}"
            );
        }
        assert!(
            rows.iter().any(|r| r.contains("… 2 more GPUs of the job")),
            "{rows:#?}"
        );
    }
}

/// Two GPUs of the job alone: a straggler between two is still named; two that keep pace are
/// a balanced job. One GPU, or a job too short to judge, says why there is nothing to compare.
#[test]
fn the_job_panel_with_two_gpus_and_with_none() {
    let text = |app: &App| rows(&render(app, 80, 24));

    let mut app = Source::job8().only(&[4, 5]).app_at_end();
    app.panel = Panel::Job;
    let rows = text(&app);
    let table = job_table(&rows);
    assert_eq!(
        table.keys().copied().collect::<Vec<_>>(),
        [4, 5],
        "{rows:#?}"
    );
    assert!(rows[table[&5]].contains("◀ straggler"), "{rows:#?}");
    assert!(
        rows[2].starts_with("job: straggler GPU 5 (rank 5)"),
        "{rows:#?}"
    );

    let mut app = Source::job8().only(&[0, 1]).app_at_end();
    app.panel = Panel::Job;
    let rows = text(&app);
    let table = job_table(&rows);
    assert_eq!(
        table.keys().copied().collect::<Vec<_>>(),
        [0, 1],
        "{rows:#?}"
    );
    assert!(!rows.join("\n").contains("straggler"), "{rows:#?}");
    assert!(rows[2].starts_with("job: balanced (2 GPUs)"), "{rows:#?}");

    let mut app = Source::fixture("healthy.ndjson").app_at_end();
    app.panel = Panel::Job;
    let rows = text(&app);
    let screen = rows.join("\n");
    assert!(
        screen.contains("No job of two or more GPUs: this source has one GPU."),
        "{screen}"
    );
    assert!(
        screen.contains("How jobs are found: one Slurm job"),
        "{screen}"
    );
    // No job, no header line for one: the GPU's verdict keeps its place.
    assert!(rows[2].starts_with("verdict GPU 0"), "{screen}");
    assert!(rows[3].contains("[7 Job]"), "{screen}");

    // Its two GPUs run python3 for two users (alice, bob): two runs, no job.
    let mut app = Source::fixture("profiled.ndjson").app_at_end();
    app.panel = Panel::Job;
    let rows = text(&app);
    assert!(rows[2].starts_with("verdict GPU 0"), "{}", rows.join("\n"));

    // The same for one user: nothing but the executable ties them, over 9 s: too short.
    let one_user = include_str!("fixtures/recordings/profiled.ndjson")
        .replace("\"user\":\"bob\"", "\"user\":\"alice\"");
    let backend = ReplayBackend::from_reader(
        std::io::Cursor::new(one_user.into_bytes()),
        Pace::AsFastAsPossible,
    )
    .unwrap();
    let mut app = Source::read(backend, "profiled.ndjson".to_owned()).app_at_end();
    app.panel = Panel::Job;
    let rows = text(&app);
    let screen = rows.join("\n");
    assert!(
        rows[2].starts_with("job: not judged yet — Presumed job: processes of python3"),
        "{screen}"
    );
    assert!(
        screen.contains("A job was found but not judged yet:"),
        "{screen}"
    );
    assert!(screen.contains("too short"), "{screen}");
}

#[test]
fn the_demo_picture_is_taken_at_full_load() {
    let demo = Source::demo();
    let at = end_of_longest_full_load(&demo.ticks);
    let util = demo.ticks[at].samples[0].gpu_util_pct.unwrap();
    assert!(util >= 90.0, "tick {at}: {util}%");
    assert!(at + 1 < demo.ticks.len(), "the demo ends at full load");
}

#[test]
fn cells_become_rectangles_and_stretched_text() {
    use ratatui::style::Style;
    let mut buf = Buffer::empty(ratatui::layout::Rect::new(0, 0, 8, 2));
    buf.set_string(0, 0, "ok <&>", Style::default().fg(Color::Green));
    buf.set_string(
        1,
        1,
        "██ x",
        Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD),
    );
    let out = svg(&buf, "a \"test\" & <title>");
    assert!(
        out.contains("<title>a \"test\" &amp; &lt;title&gt;</title>"),
        "{out}"
    );
    // Green text, its three characters escaped, stretched to six cells.
    assert!(
        out.contains(r#"<text x="0" y="14" textLength="54" class="c0">ok &lt;&amp;&gt;</text>"#),
        "{out}"
    );
    assert!(out.contains(".c0{fill:#0dbc79}"), "{out}");
    // Reverse video: the default foreground becomes the background of all four cells, the
    // blocks (placed cell by cell) and the x are separate elements in the default background
    // colour, bold.
    assert!(
        out.contains(r##"<rect x="9" y="18" width="36" height="18" fill="#d4d4d4"/>"##),
        "{out}"
    );
    assert!(
        out.contains(r#"<text x="9 18" y="32" class="c1 b">██</text>"#),
        "{out}"
    );
    assert!(
        out.contains(r#"<text x="36" y="32" textLength="9" class="c1 b">x</text>"#),
        "{out}"
    );
    assert!(out.contains(".c1{fill:#1e1e1e}"), "{out}");
    assert!(out.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(out.ends_with("</svg>\n"));
}

#[test]
fn colours_follow_xterm_numbering() {
    assert_eq!(hex(Color::Reset), None);
    assert_eq!(hex(Color::Rgb(1, 2, 255)).as_deref(), Some("#0102ff"));
    assert_eq!(hex(Color::Indexed(1)), hex(Color::Red));
    assert_eq!(hex(Color::Indexed(16)).as_deref(), Some("#000000"));
    assert_eq!(hex(Color::Indexed(231)).as_deref(), Some("#ffffff"));
    assert_eq!(hex(Color::Indexed(232)).as_deref(), Some("#080808"));
    assert_eq!(hex(Color::Indexed(255)).as_deref(), Some("#eeeeee"));
}

/// A tick's time: its newest sample, or its newest event when it carries no sample.
fn tick_time(t: &Tick) -> Option<u64> {
    t.samples
        .iter()
        .map(|s| s.time_ms)
        .max()
        .or_else(|| t.events.iter().map(|e| e.time_ms).max())
}
