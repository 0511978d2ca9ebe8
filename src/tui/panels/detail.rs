//! Device detail: the bottleneck verdict with its advice, then time charts of utilisation,
//! memory, power, temperature, clocks and PCIe traffic for the selected GPU, over the zoom
//! window (1m, 5m, 15m, 1h), read from `History`.
//! The x axis ends at the device's newest sample, so a replay charts recorded time. Which
//! fields each chart plots, its title and the top of its axis come from the metric table.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::symbols::Marker;
use ratatui::text::Span;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph};

use crate::tui::app::App;
use crate::tui::format::{self, NA};
use gpudiag_core::history::Window;
use gpudiag_model::metric_table;
use gpudiag_model::sample::{Absent, DeviceInfo, Metric, Sample, TimeMs};
use gpudiag_model::sample::{Ceiling, MetricDef};

/// One chart: its title, the fields it plots, and the top of its y axis.
struct ChartSpec {
    title: String,
    fields: Vec<&'static MetricDef>,
    y_max: Option<f64>,
}

impl ChartSpec {
    /// The chart as the metric table declares it, filled in from the latest sample and the
    /// device's static attributes.
    fn new(chart: metric_table::Chart, s: Option<&Sample>, d: &DeviceInfo) -> Self {
        let fields: Vec<&'static MetricDef> = chart.fields().collect();
        let value = |m: &MetricDef| m.shown(s, d);
        let ceiling = match chart.ceiling() {
            Ceiling::Fixed(v) => Some(v),
            Ceiling::Field(name, device) => gpudiag_model::sample::by_name(name)
                .and_then(value)
                .or_else(|| device(d)),
            Ceiling::Device(device) => device(d),
            Ceiling::Seen => None,
        };
        let first = fields.first().copied();
        let rate = |b: f64| format::rate(Some(b));
        let title = metric_table::expand(chart.title(), |name| {
            let (m, v) = match name {
                "ceiling" => (first?, ceiling),
                _ => {
                    let m = gpudiag_model::sample::by_name(name)?;
                    (m, value(m))
                }
            };
            Some(m.format.show(v?, rate))
        });
        // NVIDIA's two odd cadences, said where they show: NVML's PCIe throughput is a 20 ms
        // window read every few seconds (the Devices row shows the profiling counters' interval
        // mean where the GPU has them, and says so), and the graphics-engine share costs ms of
        // CPU per read, so it is a mean over 10 s that changes that often.
        let nvidia = d
            .vendor
            .as_deref()
            .is_some_and(|v| v.eq_ignore_ascii_case("nvidia"));
        let title = match chart {
            metric_table::Chart::Pcie if nvidia => format!("{title} (20-ms reads)"),
            metric_table::Chart::Profile if nvidia => match title.split_once(" · ") {
                Some((engine, rest)) => format!("{engine} (10-s mean) · {rest}"),
                None => title,
            },
            _ => title,
        };
        let y_max = ceiling.and_then(|c| Some(first?.chart?.scale.apply(c)));
        ChartSpec {
            title,
            fields,
            y_max,
        }
    }
}

/// The Detail tab: the verdict above the charts.
pub fn render(f: &mut Frame, area: Rect, app: &App) {
    draw(f, area, app, true);
}

/// The charts alone, under the device list: the header already carries the verdict there, and
/// the rows are the charts'.
pub fn render_charts(f: &mut Frame, area: Rect, app: &App) {
    draw(f, area, app, false);
}

/// Lines the verdict may take: one for it and one for the advice at 80x24, more when the charts
/// keep room to read.
fn verdict_rows(inner_height: u16) -> usize {
    match inner_height {
        h if h >= 30 => 5,
        h if h >= 12 => 2,
        _ => 1,
    }
}

fn draw(f: &mut Frame, area: Rect, app: &App, with_verdict: bool) {
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
        format::text(&d.label()),
        app.zoom.label()
    );
    let title = format::fit(&title, area.width.saturating_sub(2) as usize);
    let block = Block::bordered().title(Span::styled(title, t.title()));
    let mut inner = block.inner(area);
    f.render_widget(block, area);
    if with_verdict {
        let lines =
            super::verdict::detail_lines(app, d, inner.width as usize, verdict_rows(inner.height));
        let [top, rest] =
            Layout::vertical([Constraint::Length(lines.len() as u16), Constraint::Min(0)])
                .areas(inner);
        f.render_widget(Paragraph::new(lines), top);
        inner = rest;
    }

    let s = app.session.pipeline.latest.get(&d.index);
    // The profiling chart only where the GPU has profiling counters: elsewhere it would be an
    // empty box in every view.
    let profiled = app
        .session
        .pipeline
        .history
        .latest(d.index, Metric::SmActivePct)
        .is_some()
        || app
            .session
            .pipeline
            .history
            .latest(d.index, Metric::GrEngineActivePct)
            .is_some()
        || s.and_then(|s| s.why_absent("sm_active_pct")) == Some(&Absent::NeedsTwoSamples);
    let specs: Vec<ChartSpec> = metric_table::Chart::ALL
        .into_iter()
        .filter(|c| *c != metric_table::Chart::Profile || profiled)
        .map(|c| ChartSpec::new(c, s, d))
        .collect();
    // Two columns of three charts; on a wide, short terminal three columns of two. A seventh
    // chart takes a row of its own.
    let (cols, rows) = if inner.width >= 150 && inner.height < 24 {
        (3, 2)
    } else {
        (2, 3)
    };
    let extra = specs.len().saturating_sub((cols * rows) as usize) as u32;
    let rows = rows + extra;
    let row_areas = Layout::vertical(vec![Constraint::Ratio(1, rows); rows as usize]).split(inner);
    let mut cells = Vec::new();
    for (i, r) in row_areas.iter().enumerate() {
        let n = if (i as u32) < rows - extra { cols } else { 1 };
        let cs = Layout::horizontal(vec![Constraint::Ratio(1, n); n as usize]).split(*r);
        cells.extend(cs.iter().copied());
    }
    let end_ms = app.session.pipeline.history.latest_ms(d.index);
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
            let window = Window::Range {
                start_ms: start,
                end_ms: end,
            };
            spec.fields
                .iter()
                .filter_map(|m| Some((m.series?, m.chart?.scale)))
                .map(|(series, scale)| {
                    let points = app
                        .session
                        .pipeline
                        .history
                        .series_in(device, series, window)
                        .map(|(ts, v)| ((ts as f64 - end as f64) / 1000.0, scale.apply(v)));
                    thin(points, -window_s, dot_columns(area))
                })
                .collect()
        }
    };
    if series.iter().all(Vec::is_empty) {
        // The first field's absence explains the chart's.
        let why = app
            .session
            .pipeline
            .latest
            .get(&device)
            .zip(spec.fields.first())
            .and_then(|(s, m)| s.why_absent(m.name))
            .map_or_else(|| "no data yet".to_owned(), ToString::to_string);
        f.render_widget(
            Paragraph::new(format::fit(
                &format!("{NA}: {why}"),
                area.width.saturating_sub(2) as usize,
            ))
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

/// Braille dots across a chart's plot: two per cell inside the border. A generous bound (the
/// axes take none here, having no labels).
fn dot_columns(area: Rect) -> usize {
    usize::from(area.width.saturating_sub(2)).max(1) * 2
}

/// The points of one series as the chart can show them: in each of `columns` dot columns
/// across `[x_min, 0]`, the first, the lowest, the highest and the last point, in the order
/// they came, so the line enters and leaves each column where it did and spikes and dips
/// survive, while a 10 Hz series over an hour draws a few hundred segments instead of
/// thousands. Series with no more points than that pass through as they are.
fn thin(points: impl Iterator<Item = (f64, f64)>, x_min: f64, columns: usize) -> Vec<(f64, f64)> {
    let points: Vec<(f64, f64)> = points.collect();
    if points.len() <= 4 * columns {
        return points;
    }
    let span = -x_min;
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut current: Option<(usize, ColumnPoints)> = None;
    for p in points.iter().copied() {
        let col = if span > 0.0 {
            (((p.0 - x_min) / span) * columns as f64).clamp(0.0, (columns - 1) as f64) as usize
        } else {
            0
        };
        match &mut current {
            Some((c, column)) if *c == col => column.add(p),
            _ => {
                if let Some((_, column)) = current.take() {
                    column.emit(&mut out);
                }
                current = Some((col, ColumnPoints::new(p)));
            }
        }
    }
    if let Some((_, column)) = current {
        column.emit(&mut out);
    }
    out
}

/// The points of one dot column that `thin` keeps.
struct ColumnPoints {
    first: (f64, f64),
    low: (f64, f64),
    high: (f64, f64),
    last: (f64, f64),
}

impl ColumnPoints {
    fn new(p: (f64, f64)) -> Self {
        ColumnPoints {
            first: p,
            low: p,
            high: p,
            last: p,
        }
    }

    fn add(&mut self, p: (f64, f64)) {
        if p.1 < self.low.1 {
            self.low = p;
        }
        if p.1 > self.high.1 {
            self.high = p;
        }
        self.last = p;
    }

    fn emit(self, out: &mut Vec<(f64, f64)>) {
        let (a, b) = if self.low.0 <= self.high.0 {
            (self.low, self.high)
        } else {
            (self.high, self.low)
        };
        for p in [self.first, a, b, self.last] {
            if out.last() != Some(&p) {
                out.push(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_each_columns_extremes_in_order() {
        // 3600 points over an hour, one spike and one dip, into 100 columns.
        let points: Vec<(f64, f64)> = (0..3600)
            .map(|i| {
                let x = -3600.0 + f64::from(i);
                let y = match i {
                    1000 => 100.0,
                    2000 => -5.0,
                    _ => 50.0,
                };
                (x, y)
            })
            .collect();
        let thinned = thin(points.iter().copied(), -3600.0, 100);
        assert!(thinned.len() <= 400, "{}", thinned.len());
        assert_eq!(thinned.last(), points.last());
        assert!(thinned.contains(&(-2600.0, 100.0)));
        assert!(thinned.contains(&(-1600.0, -5.0)));
        assert!(
            thinned.windows(2).all(|w| w[0].0 <= w[1].0),
            "time order kept"
        );
        assert_eq!(thinned.first(), points.first());
    }

    #[test]
    fn short_series_pass_through() {
        let points = [(-50.0, 1.0), (-30.0, 2.0), (-10.0, 3.0)];
        assert_eq!(thin(points.iter().copied(), -60.0, 100), points.to_vec());
        assert!(thin(std::iter::empty(), -60.0, 100).is_empty());
    }
}
