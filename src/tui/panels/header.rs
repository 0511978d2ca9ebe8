//! The header: host, driver and CUDA version, the mode (LIVE, REPLAY with position, PAUSED),
//! the finding counts, the bottleneck verdict on the selected GPU (or why there is none), and
//! where GPUs work as one job, the verdict on the job.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::tui::app::{App, SourceKind};
use crate::tui::format::{self, NA};
use gpudiag_model::finding::Severity;

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let h = &app.host;
    let mode = match &app.source {
        SourceKind::Live if app.paused => "PAUSED (live)".to_owned(),
        SourceKind::Live => format!("LIVE every {}", humantime::format_duration(app.interval)),
        SourceKind::Replay { .. } => {
            let pos = app.position_text().unwrap_or_else(|| "loading".into());
            let state = if app.paused {
                "PAUSED REPLAY"
            } else if matches!(app.ended, Some(None)) {
                "REPLAY END"
            } else {
                "REPLAY"
            };
            format!("{state} {pos} ×{}", app.speed)
        }
    };
    let source = match &app.source {
        SourceKind::Live => String::new(),
        SourceKind::Replay { name } => {
            let base = std::path::Path::new(name)
                .file_name()
                .map_or(name.clone(), |b| b.to_string_lossy().into_owned());
            format!(" · {}", format::text(&base))
        }
    };
    // The source's name goes last on the first line: it is the part that may be cut.
    let line1 = Line::from(vec![
        Span::styled("gpudiag", t.title()),
        Span::raw(format!(
            " · {} · driver {} · CUDA {} · {} GPU{}{source}",
            format::text(h.hostname.as_deref().unwrap_or(NA)),
            format::text(h.driver_version.as_deref().unwrap_or(NA)),
            format::text(h.cuda_driver_version.as_deref().unwrap_or(NA)),
            app.devices.len(),
            if app.devices.len() == 1 { "" } else { "s" },
        )),
    ]);
    let mut spans = vec![Span::styled(mode, t.mode(app.paused))];
    if let Some(Some(why)) = &app.ended {
        spans.push(Span::styled(
            format!(" · stopped: {}", format::text(why)),
            t.warn(),
        ));
    }
    spans.push(Span::raw(" · findings "));
    for (i, s) in [Severity::Fail, Severity::Warn, Severity::Info]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            spans.push(Span::raw(" "));
        }
        let n = app.count(s);
        let style = if n > 0 {
            t.severity(s)
        } else {
            ratatui::style::Style::default()
        };
        spans.push(Span::styled(format!("{n} {s}"), style));
    }
    let line3 = match app.device() {
        Some(d) => super::verdict::header_line(app, d, area.width as usize),
        None => Line::from(Span::styled("verdict: no GPU", t.dim())),
    };
    let width = area.width as usize;
    let mut lines = vec![
        format::fit_line(line1, width),
        format::fit_line(Line::from(spans), width),
    ];
    // The job's line goes above the GPU's: a GPU that waits for a straggler is explained by it.
    if super::job::has_header_line(app) {
        lines.push(super::job::header_line(app, width));
    }
    lines.push(line3);
    f.render_widget(Paragraph::new(lines), area);
}
