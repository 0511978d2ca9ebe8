//! Per-tick cost of the terminal UI without a terminal: the demo recording fed to the app one
//! tick at a time, as the sampler delivers them, and a frame drawn into a 120x36 `TestBackend`
//! after each (the Devices panel, then again with the Detail panel open). This is the work the
//! UI thread does per refresh, minus writing to a real terminal.
//!
//! `cargo bench --locked --bench tui_frame`
use std::time::{Duration, Instant};

use gpudiag::tui::app::{App, AppInit, SourceKind};
use gpudiag::tui::theme::Theme;
use gpudiag::tui::ui;
use gpudiag_core::session::DEMO_RECORDING;
use gpudiag_telemetry::Backend;
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_telemetry::sampler::SamplerMsg;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn main() {
    let rounds = 20;
    let mut ingest = Duration::ZERO;
    let mut draw = Duration::ZERO;
    let mut ticks = 0u32;
    for _ in 0..rounds {
        let Ok(mut b) = ReplayBackend::from_reader(DEMO_RECORDING, Pace::AsFastAsPossible) else {
            eprintln!("the demo recording does not open");
            return;
        };
        let mut app = App::new(AppInit {
            host: b.host().clone(),
            devices: b.devices().to_vec(),
            source: SourceKind::Replay {
                name: "demo".into(),
            },
            backend_name: b.header().backend.clone(),
            interval: Duration::from_millis(100),
            theme: Theme { color: true },
            can_signal: false,
            topology: b.topology(),
        });
        let Ok(mut terminal) = Terminal::new(TestBackend::new(120, 36));
        while let Ok(t) = b.poll() {
            let start = Instant::now();
            app.on_feed(
                SamplerMsg::Ticks {
                    ticks: vec![t],
                    reset: false,
                    position: None,
                },
                Instant::now(),
            );
            ingest += start.elapsed();
            let start = Instant::now();
            let _ = terminal.draw(|f| ui::draw(f, &app));
            draw += start.elapsed();
            ticks += 1;
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(ticks.max(1));
    println!(
        "tui per tick ({ticks} ticks of the demo): ingest {:.1} µs, draw 120x36 {:.1} µs",
        per(ingest),
        per(draw)
    );
}
