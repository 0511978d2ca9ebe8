//! Device detail: time charts of utilisation, memory, power, temperature, clocks and PCIe
//! traffic for the selected GPU, over the zoom window (1m, 5m, 15m, 1h), read from `History`.
//! The x axis ends at the device's newest sample, so a replay charts recorded time.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::symbols::Marker;
use ratatui::text::Span;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph};

use crate::tui::app::App;
use crate::tui::format::{self, NA};
use gpudiag_core::history::Window;
use gpudiag_telemetry::{Metric, TimeMs};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// One chart: its title, the series it plots (scaled), and the top of its y axis.
struct ChartSpec {
    title: String,
    metrics: Vec<(Metric, f64)>,
    y_max: Option<f64>,
    /// The field whose absence explains an empty chart.
    field: Metric,
}

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let Some(d) = app.device() else {
        f.render_widget(
            Paragraph::new("no GPU selected").block(Block::bordered().title(" Detail ")),
            area,
        );
        return;
    };
    let title = format!(
        " {} · last {} (z/Z zoom, ↑↓ device) ",
        d.label(),
        app.zoom.label()
    );
    let block = Block::bordered().title(Span::styled(title, t.title()));
    let inner = block.inner(area);
    f.render_widget(block, area);

    let s = app.pipeline.latest.get(&d.index);
    let v = |m: Metric| s.and_then(|s| s.value(m));
    let total = v(Metric::MemTotalBytes).or(d.memory_total_bytes.map(|b| b as f64));
    let specs = [
        ChartSpec {
            title: format!(
                "util {} · mem bw {}",
                format::num(v(Metric::GpuUtilPct), 0, "%"),
                format::num(v(Metric::MemUtilPct), 0, "%")
            ),
            metrics: vec![(Metric::GpuUtilPct, 1.0), (Metric::MemUtilPct, 1.0)],
            y_max: Some(100.0),
            field: Metric::GpuUtilPct,
        },
        ChartSpec {
            title: format!(
                "memory {}/{} GiB",
                format::num(v(Metric::MemUsedBytes).map(|b| b / GIB), 1, ""),
                format::num(total.map(|b| b / GIB), 1, "")
            ),
            metrics: vec![(Metric::MemUsedBytes, 1.0 / GIB)],
            y_max: total.map(|b| b / GIB),
            field: Metric::MemUsedBytes,
        },
        ChartSpec {
            title: format!(
                "power {}/{} W",
                format::num(v(Metric::PowerW), 0, ""),
                format::num(v(Metric::PowerLimitW), 0, "")
            ),
            metrics: vec![(Metric::PowerW, 1.0)],
            y_max: v(Metric::PowerLimitW).or(d.power_limit_max_w),
            field: Metric::PowerW,
        },
        ChartSpec {
            title: format!(
                "temp {} · mem {} · slowdown {}",
                format::num(v(Metric::TempGpuC), 0, "°C"),
                format::num(v(Metric::TempMemC), 0, "°C"),
                format::num(
                    s.and_then(|s| s.temp_slowdown_c).or(d.temp_slowdown_c),
                    0,
                    "°C"
                )
            ),
            metrics: vec![(Metric::TempGpuC, 1.0), (Metric::TempMemC, 1.0)],
            y_max: s.and_then(|s| s.temp_slowdown_c).or(d.temp_slowdown_c),
            field: Metric::TempGpuC,
        },
        ChartSpec {
            title: format!(
                "clocks SM {} · mem {} MHz",
                format::num(v(Metric::SmClockMhz), 0, ""),
                format::num(v(Metric::MemClockMhz), 0, "")
            ),
            metrics: vec![(Metric::SmClockMhz, 1.0), (Metric::MemClockMhz, 1.0)],
            y_max: [d.sm_clock_max_mhz, d.mem_clock_max_mhz]
                .into_iter()
                .flatten()
                .max()
                .map(f64::from),
            field: Metric::SmClockMhz,
        },
        ChartSpec {
            title: format!(
                "PCIe rx {} tx {} B/s",
                format::rate(v(Metric::PcieRxBytesPerS)),
                format::rate(v(Metric::PcieTxBytesPerS))
            ),
            metrics: vec![
                (Metric::PcieRxBytesPerS, 1.0 / 1e9),
                (Metric::PcieTxBytesPerS, 1.0 / 1e9),
            ],
            y_max: None,
            field: Metric::PcieRxBytesPerS,
        },
    ];
    // Two columns of three charts; on a wide, short terminal three columns of two.
    let (cols, rows) = if inner.width >= 150 && inner.height < 24 {
        (3, 2)
    } else {
        (2, 3)
    };
    let row_areas = Layout::vertical(vec![Constraint::Ratio(1, rows); rows as usize]).split(inner);
    let mut cells = Vec::new();
    for r in row_areas.iter() {
        let cs = Layout::horizontal(vec![Constraint::Ratio(1, cols); cols as usize]).split(*r);
        cells.extend(cs.iter().copied());
    }
    let end_ms = app.pipeline.history.latest_ms(d.index);
    for (spec, cell) in specs.iter().zip(cells) {
        render_chart(f, cell, app, d.index, end_ms, spec);
    }
}

fn render_chart(
    f: &mut Frame,
    area: Rect,
    app: &App,
    device: u32,
    end_ms: Option<TimeMs>,
    spec: &ChartSpec,
) {
    let t = app.theme;
    let block = Block::bordered().title(format::fit(
        &spec.title,
        area.width.saturating_sub(2) as usize,
    ));
    let window_s = app.zoom.duration().as_secs_f64();
    let series: Vec<Vec<(f64, f64)>> = match end_ms {
        None => Vec::new(),
        Some(end) => {
            let start = end.saturating_sub(app.zoom.duration().as_millis() as u64);
            spec.metrics
                .iter()
                .map(|&(m, scale)| {
                    app.pipeline
                        .history
                        .series_in(
                            device,
                            m,
                            Window::Range {
                                start_ms: start,
                                end_ms: end,
                            },
                        )
                        .map(|(ts, v)| ((ts as f64 - end as f64) / 1000.0, v * scale))
                        .collect()
                })
                .collect()
        }
    };
    if series.iter().all(Vec::is_empty) {
        let why = app
            .pipeline
            .latest
            .get(&device)
            .and_then(|s| s.why_absent(spec.field.name()))
            .map_or_else(|| "no data yet".to_owned(), ToString::to_string);
        f.render_widget(
            Paragraph::new(format!("{NA}: {why}"))
                .style(t.dim())
                .block(block),
            area,
        );
        return;
    }
    let seen_max = series.iter().flatten().map(|p| p.1).fold(0.0_f64, f64::max);
    // The top of the axis: the metric's limit when it has one, else what was seen, with room.
    let y_max = spec
        .y_max
        .map_or(seen_max * 1.2, |m| m.max(seen_max))
        .max(f64::EPSILON);
    let datasets: Vec<Dataset> = series
        .iter()
        .enumerate()
        .map(|(i, points)| {
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(t.series(i))
                .data(points)
        })
        .collect();
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(Axis::default().bounds([-window_s, 0.0]))
        .y_axis(Axis::default().bounds([0.0, y_max]));
    f.render_widget(chart, area);
}
