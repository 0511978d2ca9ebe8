//! The event loop: input, the sampler and signals feed one channel; the loop applies each event
//! to the app, carries out the effects it asks for (controls go back to the sampler), and
//! redraws. There is no timer: with nothing arriving the loop sleeps in `recv`, so an idle UI
//! costs nothing between ticks.

use std::path::Path;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use crossterm::event::{Event as InputEvent, KeyEventKind, MouseEventKind};
use ratatui::Terminal;
use ratatui::backend::Backend as TermBackend;

use super::app::{App, Effect, KillSignal, MAX_SESSION_TICKS};
use super::messages::{AppEvent, LOOKBACK};
use super::ui;
use crate::tick_stats;
use gpudiag_model::stats::{self, Counter};
use gpudiag_telemetry::Backend;
use gpudiag_telemetry::recording::{Header, RecordingError, RecordingWriter};
use gpudiag_telemetry::sampler::{Sampler, SamplerControl, SamplerMsg, SamplerOptions};

/// Reads terminal input on its own thread, so waiting for a key never blocks drawing.
pub fn spawn_input(tx: Sender<AppEvent>) -> std::io::Result<()> {
    spawn_input_into(move |read| {
        tx.send(match read {
            Ok(ev) => AppEvent::Input(ev),
            Err(why) => AppEvent::InputClosed(why),
        })
        .is_ok()
    })
}

/// Reads terminal input on its own thread into `sink`, which returns false once nobody
/// listens; a read error is passed on once and ends the thread.
pub fn spawn_input_into(
    mut sink: impl FnMut(Result<InputEvent, String>) -> bool + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("gpudiag-input".into())
        .spawn(move || {
            loop {
                let read = crossterm::event::read().map_err(|e| e.to_string());
                let closed = read.is_err();
                if !sink(read) || closed {
                    return;
                }
            }
        })
        .map(|_| ())
}

/// Starts the sampler that polls `backend` for the UI (live GPUs every `interval`; a replay at
/// its own pace): its ticks, replay positions and end arrive as `AppEvent::Feed`. A backward
/// seek delivers up to `LOOKBACK` before its target, the widest chart window; one seek at most
/// as many ticks as the session keeps.
pub fn spawn_sampler(
    backend: Box<dyn Backend>,
    interval: Duration,
    tx: Sender<AppEvent>,
) -> std::io::Result<Sampler> {
    let opts = SamplerOptions::new(interval, None).seeking(LOOKBACK, MAX_SESSION_TICKS);
    Sampler::spawn_into(backend, opts, move |m| tx.send(AppEvent::Feed(m)).is_ok())
}

/// Most events drained before one redraw: a seek delivers many ticks at once, and drawing
/// after each would only delay the last.
const MAX_BATCH: usize = 512;

/// Runs until the user quits or a terminate signal arrives.
pub fn run_loop<B: TermBackend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    rx: &Receiver<AppEvent>,
    tx: &Sender<AppEvent>,
    sampler: &Sampler,
) -> std::io::Result<()>
where
    B::Error: Into<std::io::Error>,
{
    draw(terminal, app)?;
    tick_stats::mark("first_frame");
    let started = Instant::now();
    let mut trimmed = false;
    while let Ok(first) = rx.recv() {
        stats::add(Counter::LoopWakes, 1);
        let mut next = Some(first);
        let mut n = 0;
        let mut changed = false;
        while let Some(ev) = next.take() {
            changed |= handle(app, ev, sampler, tx, terminal.size().ok());
            if app.quit {
                tick_stats::threads_now();
                return Ok(());
            }
            n += 1;
            if n < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if changed {
            draw(terminal, app)?;
        } else {
            stats::add(Counter::DrawsSkipped, 1);
        }
        // Once start-up's work is behind (the driver opened, the first slow round read, a few
        // frames drawn), give back the pages only it used.
        if !trimmed && started.elapsed() >= TRIM_AFTER {
            trimmed = true;
            crate::resident::trim();
        }
    }
    Ok(())
}

/// When the UI gives back start-up's pages (`crate::resident`): past the first slow-field
/// round and the first few ticks at any refresh.
const TRIM_AFTER: Duration = Duration::from_secs(5);

fn draw<B: TermBackend>(terminal: &mut Terminal<B>, app: &App) -> std::io::Result<()>
where
    B::Error: Into<std::io::Error>,
{
    let _timed = stats::Timed::start(Counter::Draws, Counter::DrawNs);
    terminal
        .draw(|f| ui::draw(f, app))
        .map(|_| ())
        .map_err(Into::into)
}

/// Applies one event; true when it may have changed what the screen shows, so the loop draws
/// only then (a mouse moving over the terminal, with mouse capture on, sends a stream of
/// events that change nothing).
fn handle(
    app: &mut App,
    ev: AppEvent,
    sampler: &Sampler,
    tx: &Sender<AppEvent>,
    size: Option<ratatui::layout::Size>,
) -> bool {
    if let Some(s) = size {
        app.viewport = (s.width, s.height);
    }
    match ev {
        AppEvent::Input(InputEvent::Key(k)) if k.kind != KeyEventKind::Release => {
            if let Some(effect) = app.on_key(k) {
                perform(app, effect, sampler, tx);
            }
        }
        AppEvent::Input(InputEvent::Key(_)) => return false,
        AppEvent::Input(InputEvent::Mouse(m)) => {
            if matches!(
                m.kind,
                MouseEventKind::Moved | MouseEventKind::Drag(_) | MouseEventKind::Up(_)
            ) {
                return false;
            }
            let width = size.map_or(80, |s| s.width);
            let rows = ui::header_rows(app);
            app.on_mouse(m, |col, row| ui::tab_at(width, rows, col, row));
        }
        // A resize needs only the redraw that follows.
        AppEvent::Input(InputEvent::Resize(..)) => {}
        // Focus changes and pastes show nothing.
        AppEvent::Input(_) => return false,
        AppEvent::InputClosed(why) => {
            app.status = Some(format!("terminal input closed: {why}"));
            app.quit = true;
        }
        AppEvent::Feed(msg) => {
            if let SamplerMsg::Ticks { ticks, .. } = &msg {
                stats::add(Counter::Ticks, ticks.len() as u64);
            }
            app.on_feed(msg, Instant::now());
            // NCCL RAS for the jobs that want it, as every command's loop asks.
            let newest = app
                .session
                .pipeline
                .latest
                .values()
                .map(|s| s.time_ms)
                .max();
            if let Some(now) = newest {
                for q in app.session.pipeline.engine.ras_queries(now) {
                    sampler.send(SamplerControl::Ras(q));
                }
            }
        }
        AppEvent::Terminate => app.quit = true,
        AppEvent::Probes(result) => app.on_probes(result),
    }
    true
}

fn perform(app: &mut App, effect: Effect, sampler: &Sampler, tx: &Sender<AppEvent>) {
    match effect {
        Effect::Feed(c) => sampler.send(c),
        Effect::Signal { pid, signal } => app.status = Some(send_signal(pid, signal)),
        Effect::SaveRecording => app.status = Some(save_recording(app, Path::new("."))),
        Effect::RunProbes { suite, force } => {
            // Probes take seconds to minutes: a thread waits for the child process that runs
            // them, so telemetry keeps drawing and shows their effect on clocks, power and
            // temperature as they run.
            let tx = tx.clone();
            let spawned = std::thread::Builder::new()
                .name("gpudiag-probes".into())
                .spawn(move || {
                    let result =
                        crate::probe_run::run_probes_in_ui(suite, force).map_err(|e| e.to_string());
                    let _ = tx.send(AppEvent::Probes(result));
                });
            if let Err(e) = spawned {
                app.on_probes(Err(format!("could not start the probe thread: {e}")));
            }
        }
    }
}

fn send_signal(pid: u32, signal: KillSignal) -> String {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else {
        return format!("PID {pid} is out of range");
    };
    let sig = match signal {
        KillSignal::Term => Signal::SIGTERM,
        KillSignal::Kill => Signal::SIGKILL,
    };
    match kill(Pid::from_raw(raw), sig) {
        Ok(()) if signal == KillSignal::Term => {
            format!("sent SIGTERM to PID {pid}; press k again to send SIGKILL if it stays")
        }
        Ok(()) => format!("sent SIGKILL to PID {pid}"),
        Err(nix::errno::Errno::EPERM) => {
            format!("not allowed to signal PID {pid} (another user's process?)")
        }
        Err(nix::errno::Errno::ESRCH) => format!("PID {pid} has already exited"),
        Err(e) => format!("could not signal PID {pid}: {e}"),
    }
}

/// Writes the session's ticks so far to a new file in `dir` (the UI uses the working
/// directory); returns the message for the footer.
pub fn save_recording(app: &App, dir: &Path) -> String {
    if app.ticks.is_empty() {
        return "nothing to save yet: no telemetry has arrived".into();
    }
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(':', "-");
    let header = Header::new(
        &app.backend_name,
        app.host.clone(),
        app.devices.clone(),
        match app.source {
            super::app::SourceKind::Live => Some(app.interval.as_millis() as u64),
            super::app::SourceKind::Replay { .. } => None,
        },
    );
    // Never overwrite: a second save within the same second gets a numbered name.
    let mut attempt = 1;
    let (path, created) = loop {
        let name = if attempt == 1 {
            format!("gpudiag-{stamp}.ndjson.gz")
        } else {
            format!("gpudiag-{stamp}-{attempt}.ndjson.gz")
        };
        let path = dir.join(name);
        match RecordingWriter::create_with(&path, &header, false) {
            Err(RecordingError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 =>
            {
                attempt += 1;
            }
            other => break (path, other),
        }
    };
    let result = created.and_then(|mut w| {
        let unreadable = app.ticks.for_each(|t| w.write_tick(t))?;
        w.finish()?;
        Ok(unreadable + app.ticks.unstored())
    });
    match result {
        Ok(lost) => {
            let mut note = if app.ticks.dropped() {
                " (the oldest ticks of this long session were not kept)".to_owned()
            } else {
                String::new()
            };
            if lost > 0 {
                note.push_str(&format!(" ({lost} ticks could not be kept)"));
            }
            format!(
                "saved {} ticks to {}{note}",
                app.ticks.len(),
                path.display()
            )
        }
        Err(e) => format!("could not save the recording: {e}"),
    }
}
