//! The fleet's terminal UI (`gpudiag fleet` on a terminal).
//!
//! `worker` owns the Prometheus client on its own thread and reports each read over a channel;
//! `state` holds what is shown and turns keys and reports into changes (and into requests for
//! the worker); the draw files only draw it: `header`, `table` (the fleet, by node or by job),
//! `node_view`, `job_view` and `alerts`. The loop redraws on input and on reports, and once a
//! second for the ages in the header; nothing else wakes it.

pub mod alerts;
pub mod cells;
pub mod header;
pub mod job_view;
pub mod node_view;
pub mod state;
pub mod table;
pub mod worker;

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crossterm::event::{Event as InputEvent, KeyEventKind, MouseEventKind};
use gpudiag_fleet::client::Client;
use gpudiag_fleet::read::{ReadRequest, now_ms};
use gpudiag_model::error::{Error, exit};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};

use super::terminal::TerminalGuard;
use super::theme::Theme;
use crate::stop::Stop;
pub use state::{State, View};
use worker::Report;

enum Event {
    Input(InputEvent),
    InputClosed,
    Report(Report),
    Terminate,
}

/// How often the header's ages are redrawn while nothing else happens.
const AGE_TICK: Duration = Duration::from_secs(1);

pub fn run(
    client: Client,
    request: ReadRequest,
    interval: Duration,
    stop: &Stop,
) -> Result<i32, Error> {
    let io = |what: &'static str| move |e: std::io::Error| Error::io(what, e);
    let theme = Theme::from_env();
    let mut state = State::new(client.url().to_owned(), interval);
    state.now_ms = now_ms();
    let (tx, rx) = mpsc::channel();
    let mut guard = TerminalGuard::enter().map_err(io("setting up the terminal"))?;
    let report_tx = tx.clone();
    let worker = worker::spawn(client, request, interval, move |r| {
        report_tx.send(Event::Report(r)).is_ok()
    })
    .map_err(io("starting the Prometheus reader thread"))?;
    // SIGTERM, SIGINT and SIGHUP end the loop like `q`, so the guard restores the terminal.
    let signal_tx = tx.clone();
    stop.on_signal(move || {
        let _ = signal_tx.send(Event::Terminate);
    });
    let input_tx = tx;
    super::event::spawn_input_into(move |read| {
        input_tx
            .send(match read {
                Ok(ev) => Event::Input(ev),
                Err(_) => Event::InputClosed,
            })
            .is_ok()
    })
    .map_err(io("starting the input thread"))?;

    let terminal = &mut guard.terminal;
    let mut dirty = true;
    let mut shown_second = state.now_ms / 1000;
    loop {
        if dirty {
            if let Ok(size) = terminal.size() {
                state.viewport = (size.width, size.height);
            }
            terminal
                .draw(|f| draw(f, &state, &theme))
                .map_err(io("drawing the terminal UI"))?;
            dirty = false;
        }
        let event = match rx.recv_timeout(AGE_TICK) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        state.now_ms = now_ms();
        match event {
            None => {}
            Some(Event::Input(InputEvent::Key(k))) if k.kind != KeyEventKind::Release => {
                if let Some(ask) = state.on_key(k) {
                    worker.ask(ask);
                }
                dirty = true;
            }
            Some(Event::Input(InputEvent::Resize(..))) => {
                if let Ok(size) = terminal.size() {
                    state.viewport = (size.width, size.height);
                }
                dirty = true;
            }
            Some(Event::Input(InputEvent::Mouse(m))) => {
                let delta = match m.kind {
                    MouseEventKind::ScrollDown => Some(crossterm::event::KeyCode::Down),
                    MouseEventKind::ScrollUp => Some(crossterm::event::KeyCode::Up),
                    _ => None,
                };
                if let Some(code) = delta {
                    let key = crossterm::event::KeyEvent::from(code);
                    if let Some(ask) = state.on_key(key) {
                        worker.ask(ask);
                    }
                    dirty = true;
                }
            }
            Some(Event::Input(_)) => {}
            Some(Event::InputClosed) | Some(Event::Terminate) => state.quit = true,
            Some(Event::Report(r)) => {
                if let Some(ask) = state.on_report(r) {
                    worker.ask(ask);
                }
                dirty = true;
            }
        }
        if state.quit {
            break;
        }
        // The header's ages move once a second; nothing else changes between events.
        let second = state.now_ms / 1000;
        if second != shown_second {
            shown_second = second;
            dirty = true;
        }
    }
    drop(guard);
    drop(worker);
    Ok(exit::OK)
}

/// The whole screen for `state`.
pub fn draw(f: &mut Frame, state: &State, theme: &Theme) {
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(header::HEADER_ROWS),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    header::render(f, head, state, theme);
    match &state.view {
        View::Fleet => table::render(f, body, state, theme),
        View::Node(name) => node_view::render(f, body, state, name, theme),
        View::Job(key) => job_view::render(f, body, state, key, theme),
        View::Alerts => alerts::render(f, body, state, theme),
    }
    header::footer(f, foot, state, theme);
    if state.show_help {
        super::panels::overlay::key_help(f, f.area(), &KEYS, *theme);
    }
}

/// Key, what it does.
pub const KEYS: [(&str, &str); 14] = [
    ("q  Ctrl-C", "quit"),
    ("?", "this help (any key closes it)"),
    ("↑ ↓  PgUp PgDn", "move; scroll a node or job view"),
    ("→  space", "show a node's GPUs (a job's, by job)"),
    ("←", "fold them again"),
    ("E", "show or fold every node's GPUs"),
    ("Enter", "open the node, or the job on a job line"),
    ("J", "open the job of the selected GPU"),
    ("g", "group the table by node or by job"),
    ("/", "filter: node, model, verdict, finding, job…"),
    ("a", "the firing alerts"),
    ("r", "read Prometheus now"),
    ("Esc", "back; clear the filter"),
    ("", "absent values show n/a, never 0"),
];
