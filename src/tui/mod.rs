//! The terminal UI: `gpudiag` with no subcommand, `gpudiag --demo` and `gpudiag replay FILE`.
//!
//! The source opens through the session's `open_source`, as for every command, and the
//! telemetry sampler polls it on its own thread; `app` holds the state and turns keys and
//! telemetry into changes and effects (controls for the sampler among them); `event` runs the
//! loop that joins them; `ui` lays out the screen and `panels` draws each part; `terminal` puts
//! the terminal back however the UI ends.

pub mod app;
pub mod event;
pub mod finding_detail;
pub mod fleet;
pub mod format;
pub mod kernels_box;
pub mod layout;
pub mod messages;
pub mod panels;
pub mod session_log;
pub mod terminal;
pub mod theme;
pub mod ui;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use crate::stop::Stop;
use app::{App, AppInit, SourceKind};
use gpudiag_core::config::Config;
use gpudiag_core::host_facts::XidRead;
use gpudiag_core::session::{Origin, Source, SourceSpec, open_source};
use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::error::{Error, exit};
use gpudiag_telemetry::live::LiveBackend;
use gpudiag_telemetry::nvml::DEFAULT_SLOW_INTERVAL;
use gpudiag_telemetry::replay::{Pace, ReplayOptions};
use messages::AppEvent;
use theme::Theme;

/// How long NVML initialisation may take before the UI gives up on live GPUs.
const INIT_TIMEOUT: Duration = Duration::from_secs(10);

/// `gpudiag` in a terminal: live GPUs, or with none, one line saying so and then the demo.
pub fn run_default(
    demo: bool,
    interval: Duration,
    stop: &Stop,
    config: &Config,
) -> Result<i32, Error> {
    if demo {
        return run(open_demo()?, interval, 1.0, None, stop, config, None);
    }
    // NVML reports only XIDs that happen while it listens; earlier ones are in the log, read
    // meanwhile with the CUDA libraries.
    let host_facts = gpudiag_core::host_facts::HostFacts::start();
    match open_live(interval) {
        Ok(source) => {
            crate::tick_stats::mark("source_opened");
            let facts = host_facts.join();
            crate::tick_stats::mark("host_facts_read");
            run(source, interval, 1.0, None, stop, config, Some(facts))
        }
        Err(Error::CannotRun(why)) => {
            let line = format!(
                "no live NVIDIA GPU here ({why}); opening the bundled demo recording \
                 (gpudiag --demo)"
            );
            // Printed before the alternate screen, so it is still there after the UI closes.
            eprintln!("gpudiag: {}", gpudiag_model::printable::line(&line));
            run(open_demo()?, interval, 1.0, Some(line), stop, config, None)
        }
        Err(e) => Err(e),
    }
}

/// `gpudiag replay FILE` in a terminal; a bundle may inflate to `max_inflated_bytes`.
pub fn run_replay(
    path: &Path,
    speed: f64,
    interval: Duration,
    max_inflated_bytes: u64,
    stop: &Stop,
    config: &Config,
) -> Result<i32, Error> {
    // A report bundle replays its recording.
    let spec = spec(
        Origin::File(path.to_path_buf()),
        ReplayOptions { max_inflated_bytes },
    );
    let source = open_source(&spec, Pace::Recorded { speed }, false)?;
    run(source, interval, speed, None, stop, config, None)
}

/// What the UI opens: `origin`, every device, a recording read under `replay`'s limits.
fn spec(origin: Origin, replay: ReplayOptions) -> SourceSpec {
    SourceSpec {
        origin,
        devices: Vec::new(),
        init_timeout: INIT_TIMEOUT,
        poll_timeout: gpudiag_telemetry::poll_deadline::DEFAULT_POLL_TIMEOUT,
        sysfs_root: std::env::var_os(gpudiag_telemetry::amd::sysfs::SYSFS_ROOT_ENV).map(Into::into),
        replay,
        attribution: gpudiag_telemetry::attribution::AttributionOptions::from_env(),
    }
}

fn open_demo() -> Result<Source, Error> {
    let spec = spec(Origin::Demo, ReplayOptions::default());
    open_source(&spec, Pace::Recorded { speed: 1.0 }, false)
}

fn open_live(interval: Duration) -> Result<Source, Error> {
    let spec = spec(Origin::Live(LiveBackend::Auto), ReplayOptions::default());
    let mut source = open_source(&spec, Pace::AsFastAsPossible, false)?;
    // Slow fields (PCIe throughput, processes) need not be read more often than the screen
    // refreshes; faster refreshes keep the backend's own cadence.
    if interval > DEFAULT_SLOW_INTERVAL {
        source.backend.set_slow_interval(interval);
    }
    Ok(source)
}

fn run(
    source: Source,
    interval: Duration,
    speed: f64,
    notice: Option<String>,
    stop: &Stop,
    config: &Config,
    // What the rules judge live GPUs with besides their telemetry: the kernel log's XIDs from
    // before the session and this host's CUDA libraries.
    host_facts: Option<(XidRead, Vec<LibraryInfo>)>,
) -> Result<i32, Error> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| Error::io(what, e)
    };
    let (tx, rx) = mpsc::channel();
    let mut app = App::new(AppInit {
        host: source.backend.host().clone(),
        devices: source.devices(),
        source: match &source.recording {
            Some(name) => SourceKind::Replay { name: name.clone() },
            None => SourceKind::Live,
        },
        backend_name: source
            .recorded_with
            .clone()
            .unwrap_or_else(|| source.backend.name().to_owned()),
        interval,
        theme: Theme::from_env(),
        // A recording's PIDs belong to another machine or another time.
        can_signal: source.is_this_host(),
        topology: source.topology(),
    });
    let (kernel_xids, libraries) = host_facts.unzip();
    app.set_rules(config.rules.clone(), libraries);
    app.set_recorded(source.recorded);
    app.speed = speed;
    if let Some(text) = notice {
        app.show_notice(text);
    }
    if let Some(log) = kernel_xids {
        app.set_kernel_xids(log);
    }
    let mut guard = terminal::TerminalGuard::enter().map_err(io("setting up the terminal"))?;
    let sampler = event::spawn_sampler(source.backend, interval, tx.clone())
        .map_err(io("starting the telemetry thread"))?;
    // SIGTERM (and SIGINT, SIGHUP) end the loop like `q`, so the guard restores the terminal.
    let signal_tx = tx.clone();
    stop.on_signal(move || {
        let _ = signal_tx.send(AppEvent::Terminate);
    });
    event::spawn_input(tx.clone()).map_err(io("starting the input thread"))?;
    event::run_loop(&mut guard.terminal, &mut app, &rx, &tx, &sampler)
        .map_err(io("drawing the terminal UI"))?;
    drop(guard);
    drop(sampler);
    Ok(exit::OK)
}
