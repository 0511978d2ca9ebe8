//! The terminal UI: `gpudiag` with no subcommand, `gpudiag --demo` and `gpudiag replay FILE`.
//!
//! `app` holds the state and turns keys and telemetry into changes and effects; `feed` owns the
//! backend on its own thread; `event` runs the loop that joins them; `ui` lays out the screen
//! and `panels` draws each part; `terminal` puts the terminal back however the UI ends.

pub mod app;
pub mod event;
pub mod feed;
pub mod format;
pub mod messages;
pub mod panels;
pub mod session_log;
pub mod terminal;
pub mod theme;
pub mod ui;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use app::{App, AppInit, SourceKind};
use feed::{Driver, Feed};
use gpudiag_core::config::Config;
use gpudiag_core::session::{DEMO_NAME, DEMO_RECORDING, Origin, SourceSpec, open_source};
use gpudiag_model::error::{Error, exit};
use gpudiag_telemetry::live::LiveBackend;
use gpudiag_telemetry::nvml::DEFAULT_SLOW_INTERVAL;
use gpudiag_telemetry::replay::{Pace, ReplayBackend, ReplayOptions};
use messages::AppEvent;
use theme::Theme;

/// How long NVML initialisation may take before the UI gives up on live GPUs.
const INIT_TIMEOUT: Duration = Duration::from_secs(10);

/// `gpudiag` in a terminal: live GPUs, or with none, one line saying so and then the demo.
pub fn run_default(demo: bool, interval: Duration, config: &Config) -> Result<i32, Error> {
    if demo {
        return run_replay_source(open_demo()?, DEMO_NAME.into(), interval, 1.0, None, config);
    }
    // NVML reports only XIDs that happen while it listens; earlier ones are in the log, read
    // meanwhile with the CUDA libraries.
    let host_facts = gpudiag_core::host_facts::HostFacts::start();
    match open_live(interval) {
        Ok((driver, init)) => {
            crate::tick_stats::mark("source_opened");
            let (kernel_xids, libraries) = host_facts.join();
            let libraries = Some(libraries);
            crate::tick_stats::mark("host_facts_read");
            let facts = SourceFacts {
                libraries,
                recorded: Vec::new(),
                kernel_xids: Some(kernel_xids),
            };
            run(driver, init, interval, 1.0, None, config, facts)
        }
        Err(Error::CannotRun(why)) => {
            let line = format!(
                "no live NVIDIA GPU here ({why}); opening the bundled demo recording \
                 (gpudiag --demo)"
            );
            // Printed before the alternate screen, so it is still there after the UI closes.
            eprintln!("gpudiag: {}", gpudiag_model::printable::line(&line));
            run_replay_source(
                open_demo()?,
                DEMO_NAME.into(),
                interval,
                1.0,
                Some(line),
                config,
            )
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
    config: &Config,
) -> Result<i32, Error> {
    // A report bundle replays its recording.
    let options = ReplayOptions { max_inflated_bytes };
    let backend = ReplayBackend::open_with(path, Pace::Recorded { speed }, &options)?;
    run_replay_source(
        backend,
        path.display().to_string(),
        interval,
        speed,
        None,
        config,
    )
}

fn open_demo() -> Result<ReplayBackend, Error> {
    Ok(ReplayBackend::from_seekable(
        std::io::Cursor::new(DEMO_RECORDING),
        DEMO_NAME,
        Pace::Recorded { speed: 1.0 },
        &ReplayOptions::default(),
    )?)
}

fn open_live(interval: Duration) -> Result<(Driver, AppInit), Error> {
    let spec = SourceSpec {
        origin: Origin::Live(LiveBackend::Auto),
        devices: Vec::new(),
        init_timeout: INIT_TIMEOUT,
        poll_timeout: gpudiag_telemetry::poll_deadline::DEFAULT_POLL_TIMEOUT,
        sysfs_root: std::env::var_os(gpudiag_telemetry::amd::sysfs::SYSFS_ROOT_ENV).map(Into::into),
        replay: ReplayOptions::default(),
        attribution: gpudiag_telemetry::attribution::AttributionOptions::from_env(),
    };
    let mut source = open_source(&spec, Pace::AsFastAsPossible, false)?;
    // Slow fields (PCIe throughput, processes) need not be read more often than the screen
    // refreshes; faster refreshes keep the backend's own cadence.
    if interval > DEFAULT_SLOW_INTERVAL {
        source.backend.set_slow_interval(interval);
    }
    let init = AppInit {
        host: source.backend.host().clone(),
        devices: source.devices(),
        source: SourceKind::Live,
        backend_name: source.backend.name().to_owned(),
        interval,
        theme: Theme::from_env(),
        can_signal: true,
        topology: source.topology(),
    };
    Ok((Driver::Live(source.backend), init))
}

fn run_replay_source(
    mut backend: ReplayBackend,
    name: String,
    interval: Duration,
    speed: f64,
    notice: Option<String>,
    config: &Config,
) -> Result<i32, Error> {
    backend.set_pace(Pace::Recorded { speed })?;
    let init = AppInit {
        host: backend.header().host.clone(),
        devices: backend.header().devices.clone(),
        source: SourceKind::Replay { name },
        backend_name: backend.header().backend.clone(),
        interval,
        theme: Theme::from_env(),
        can_signal: false,
        topology: backend.header().topology.clone(),
    };
    let recorded = gpudiag_telemetry::Backend::recorded_findings(&backend);
    run(
        Driver::Replay(Box::new(backend)),
        init,
        interval,
        speed,
        notice,
        config,
        SourceFacts {
            libraries: None,
            recorded,
            kernel_xids: None,
        },
    )
}

/// What the rules judge a source with besides its telemetry.
struct SourceFacts {
    /// This host's CUDA libraries, for live GPUs only.
    libraries: Option<Vec<gpudiag_model::cuda_libraries::LibraryInfo>>,
    /// Findings a replayed recording carries.
    recorded: Vec<gpudiag_core::rules::Finding>,
    /// The kernel log's XIDs from before the session, for live GPUs only.
    kernel_xids: Option<Result<gpudiag_telemetry::kernel_log::XidLog, String>>,
}

fn run(
    driver: Driver,
    init: AppInit,
    interval: Duration,
    speed: f64,
    notice: Option<String>,
    config: &Config,
    facts: SourceFacts,
) -> Result<i32, Error> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| Error::io(what, e)
    };
    let (tx, rx) = mpsc::channel();
    let mut app = App::new(init);
    app.set_rules(config.rules.clone(), facts.libraries);
    app.set_recorded(facts.recorded);
    app.speed = speed;
    app.status = notice;
    if let Some(log) = facts.kernel_xids {
        app.set_kernel_xids(log);
    }
    let mut guard = terminal::TerminalGuard::enter().map_err(io("setting up the terminal"))?;
    let feed = Feed::spawn(driver, interval, speed, tx.clone())
        .map_err(io("starting the telemetry thread"))?;
    // SIGTERM (and SIGINT, SIGHUP) end the loop like `q`, so the guard restores the terminal.
    let signal_tx = tx.clone();
    let _ = ctrlc::set_handler(move || {
        let _ = signal_tx.send(AppEvent::Terminate);
    });
    event::spawn_input(tx.clone()).map_err(io("starting the input thread"))?;
    event::run_loop(&mut guard.terminal, &mut app, &rx, &tx, &feed)
        .map_err(io("drawing the terminal UI"))?;
    drop(guard);
    drop(feed);
    Ok(exit::OK)
}
