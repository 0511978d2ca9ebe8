//! The device list: one two-line row per GPU with utilisation and memory bars, temperature,
//! power against its limit, SM clock against its maximum, the PCIe link and its traffic, and a
//! marker naming the active throttle reason, or, when its telemetry is unhealthy, a marker
//! saying so (lost, missing, stalled, implausible values dropped).

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use crate::tui::app::App;
use crate::tui::format::{self, NA};
use crate::tui::theme::Theme;
use gpudiag_model::finding::Severity;
use gpudiag_model::sample::{Absent, DeviceInfo, Sample};
use gpudiag_telemetry::sanity::{self, Health};

/// Rows each device takes.
const ROWS_PER_DEVICE: u16 = 2;
/// Below the list, the detail charts of the selected device appear when this many rows remain:
/// two GPUs at 80x24 leave 13.
const DETAIL_MIN_ROWS: u16 = 13;

/// The Devices screen: the list, and on a tall terminal the selected device's charts below it.
pub fn render_screen(f: &mut Frame, area: Rect, app: &App) {
    let list_rows = app.devices.len().max(1) as u16 * ROWS_PER_DEVICE + 2;
    if area.height >= list_rows + DETAIL_MIN_ROWS {
        let [list, detail] =
            Layout::vertical([Constraint::Length(list_rows), Constraint::Min(0)]).areas(area);
        render(f, list, app);
        super::detail::render_charts(f, detail, app);
    } else {
        render(f, area, app);
    }
}

/// Throttle reasons that do not slow work down: an idle GPU reports `gpu_idle`.
fn is_benign(reason: &str) -> bool {
    reason == "gpu_idle"
}

/// The throttle marker: the active reasons by name, "throttle n/a" when unknown, nothing when
/// clocks run free.
pub fn throttle_marker(s: Option<&Sample>) -> Option<String> {
    let names = s.and_then(|s| s.throttle_reason_names.as_ref());
    match names {
        None => Some(format!("throttle {NA}")),
        Some(n) => {
            let active: Vec<&str> = n
                .iter()
                .map(String::as_str)
                .filter(|r| !is_benign(r))
                .collect();
            (!active.is_empty()).then(|| format!("⚠ {}", format::text(&active.join(","))))
        }
    }
}

/// The health marker of a device's newest sample: what is wrong with its telemetry, and how bad.
pub fn health_marker(s: Option<&Sample>) -> Option<(&'static str, Severity)> {
    match sanity::worst(s?)? {
        Health::Lost => Some(("✖ GPU LOST", Severity::Fail)),
        Health::Missing => Some(("✖ MISSING", Severity::Fail)),
        Health::Stalled => Some(("⚠ STALLED: driver call hung", Severity::Warn)),
        Health::Implausible => Some(("⚠ implausible values dropped", Severity::Warn)),
    }
}

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let block = Block::bordered().title(Span::styled(" Devices (Enter: detail) ", t.title()));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let width = inner.width as usize;
    let fits = (inner.height / ROWS_PER_DEVICE).max(1) as usize;
    // Scroll so the selected device stays in view.
    let first = app.selected_device.saturating_sub(fits - 1);
    let mut lines = Vec::new();
    if app.devices.is_empty() {
        lines.push(Line::from("no GPUs in this source"));
    }
    for (i, d) in app.devices.iter().enumerate().skip(first).take(fits) {
        let s = app.session.pipeline.latest.get(&d.index);
        let selected = i == app.selected_device;
        let (a, b) = device_lines(d, s, width, &t, selected);
        lines.push(format::fit_line(a, width));
        lines.push(format::fit_line(b, width));
    }
    f.render_widget(Paragraph::new(lines), inner);
}

fn frac(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn device_lines(
    d: &DeviceInfo,
    s: Option<&Sample>,
    width: usize,
    t: &Theme,
    selected: bool,
) -> (Line<'static>, Line<'static>) {
    let util = s.and_then(|s| s.gpu_util_pct);
    let used = s.and_then(|s| s.mem_used_bytes);
    let total = s.and_then(|s| s.mem_total_bytes).or(d.memory_total_bytes);
    let mem_frac = frac(used.map(|v| v as f64), total.map(|v| v as f64));
    let name = format::pad(&d.label(), 16);
    let mem_text = format!("{}/{}G", format::gib(used), format::gib(total));
    // SM active beside utilisation, where the GPU has profiling counters: utilisation says only
    // that a kernel ran, SM active how much of the GPU it kept busy.
    let sm_active = s.and_then(|s| s.sm_active_pct);
    let profiled = sm_active.is_some()
        || s.and_then(|s| s.why_absent("sm_active_pct")) == Some(&Absent::NeedsTwoSamples);
    let sm_text = if profiled {
        format!(" SM {:>4}", format::num(sm_active, 0, "%"))
    } else {
        String::new()
    };
    // marker 2 + name 16 + " util " 6 + " 100%" 5 + SM text + "  mem " 6 + " " 1 + mem text
    let fixed = 2 + 16 + 6 + 5 + sm_text.chars().count() + 6 + 1 + mem_text.chars().count();
    let bar_w = (width.saturating_sub(fixed) / 2).clamp(4, 30);
    let marker = if selected { "▶ " } else { "  " };
    let name_style = if selected {
        t.selected()
    } else {
        ratatui::style::Style::default()
    };
    let line1 = Line::from(vec![
        Span::styled(marker, t.title()),
        Span::styled(name, name_style),
        Span::raw(" util "),
        Span::styled(
            format::bar(util.map(|u| u / 100.0), bar_w),
            t.level(util.map(|u| u / 100.0)),
        ),
        Span::raw(format!(" {:>4}", format::num(util, 0, "%"))),
        Span::styled(sm_text, t.level(sm_active.map(|u| u / 100.0))),
        Span::raw("  mem "),
        Span::styled(format::bar(mem_frac, bar_w), t.level(mem_frac)),
        Span::raw(format!(" {mem_text}")),
    ]);

    let temp = s.and_then(|s| s.temp_gpu_c);
    let slowdown = s.and_then(|s| s.temp_slowdown_c).or(d.temp_slowdown_c);
    let power = s.and_then(|s| s.power_w);
    let limit = s.and_then(|s| s.power_limit_w);
    let sm = s.and_then(|s| s.sm_clock_mhz);
    let sm_max = s.and_then(|s| s.sm_clock_max_mhz).or(d.sm_clock_max_mhz);
    let gen_ = s.and_then(|s| s.pcie_gen);
    let lanes = s.and_then(|s| s.pcie_width);
    let gen_max = s.and_then(|s| s.pcie_gen_max).or(d.pcie_gen_max);
    let lanes_max = s.and_then(|s| s.pcie_width_max).or(d.pcie_width_max);
    let below_max = matches!((gen_, gen_max), (Some(a), Some(b)) if a < b)
        || matches!((lanes, lanes_max), (Some(a), Some(b)) if a < b);
    let mut spans = vec![
        Span::raw("  "),
        Span::styled(
            format!("{:>5}", format::num(temp, 0, "°C")),
            t.level(frac(temp, slowdown)),
        ),
        Span::raw("  "),
        Span::styled(
            format!(
                "{}/{}W",
                format::num(power, 0, ""),
                format::num(limit, 0, "")
            ),
            t.level(frac(power, limit)),
        ),
        Span::raw(format!(
            "  SM {}/{}MHz  PCIe {}x{}",
            format::int(sm),
            format::int(sm_max),
            format::int(gen_),
            format::int(lanes)
        )),
    ];
    if below_max {
        spans.push(Span::styled(
            format!("(max {}x{})", format::int(gen_max), format::int(lanes_max)),
            t.warn(),
        ));
    }
    let mut throttle_shown = false;
    if let Some((m, severity)) = health_marker(s) {
        // Said first and instead of the throttle marker, whose "n/a" would only repeat it.
        spans.insert(0, Span::styled(format!("  {m}"), t.severity(severity)));
    } else if let Some(m) = throttle_marker(s) {
        throttle_shown = true;
        // Before the PCIe rates: at 80 columns the line is cut, and a clock held back says
        // more than the link's traffic.
        let style = if m.starts_with('⚠') {
            t.warn()
        } else {
            t.dim()
        };
        spans.push(Span::raw("  "));
        spans.push(Span::styled(m, style));
    }
    // The profiling counters' PCIe rates cover the whole interval between two samples, NVML's
    // throughput a 20 ms window read every few seconds: the first where the GPU has them.
    let profiled = s.is_some_and(|s| s.prof_pcie_rx_bytes_per_s.is_some());
    let rx = s.and_then(|s| s.prof_pcie_rx_bytes_per_s.or(s.pcie_rx_bytes_per_s));
    let tx = s.and_then(|s| s.prof_pcie_tx_bytes_per_s.or(s.pcie_tx_bytes_per_s));
    // Labelled where it is not the chart's counter, so the two figures do not contradict.
    spans.push(Span::raw(format!(
        "{}rx {} tx {}{}",
        if throttle_shown { "  " } else { " " },
        format::rate(rx),
        format::rate(tx),
        if profiled { " (GPM)" } else { "" }
    )));
    (line1, Line::from(spans))
}
