//! Probes: pick a suite, run it on the live GPUs while the other panels keep updating, and read
//! the results against the reference table with their verdicts.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Gauge, Paragraph, Wrap};

use crate::cli::SuiteName;
use crate::tui::app::{App, ProbesState};
use crate::tui::format;
use gpudiag_probes::runner::ProbeReport;

/// Rough wall time of each suite on one GPU, for the progress gauge: the runner reports no
/// intermediate progress, so the gauge shows time against what a suite usually takes.
fn typical_secs(suite: SuiteName) -> f64 {
    match suite {
        SuiteName::Quick => 4.0,
        SuiteName::Standard => 60.0,
        SuiteName::Full => 300.0,
    }
}

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let block = Block::bordered().title(Span::styled(" Probes ", t.title()));
    match &app.probes {
        ProbesState::NeedsLive => {
            let lines = vec![
                Line::from(Span::styled(
                    "Probes need live GPUs: this is a recording.",
                    t.warn(),
                )),
                Line::from(""),
                Line::from(
                    "On a GPU host, open `gpudiag` and run a suite from this panel, or run \
                     `gpudiag probe` / `gpudiag check --probes quick`.",
                ),
            ];
            f.render_widget(
                Paragraph::new(lines).wrap(Wrap { trim: true }).block(block),
                area,
            );
        }
        ProbesState::Running { suite, started } => {
            let inner = block.inner(area);
            f.render_widget(block, area);
            let [gauge_area, text_area] =
                Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(inner);
            let elapsed = started.elapsed().as_secs_f64();
            let ratio = (elapsed / typical_secs(*suite)).min(0.99);
            f.render_widget(
                Gauge::default()
                    .block(Block::bordered().title(format!(
                        " {} suite running · {elapsed:.0} s ",
                        suite.as_str()
                    )))
                    .gauge_style(t.series(0))
                    .ratio(ratio),
                gauge_area,
            );
            f.render_widget(
                Paragraph::new(
                    "Latency, bandwidth, matmul and memory probes run one after the other on \
                     each GPU, in a gpudiag process of their own that takes its GPU memory \
                     with it when it ends. Watch clocks, power and temperature in the Devices \
                     and Detail panels meanwhile.",
                )
                .wrap(Wrap { trim: true }),
                text_area,
            );
        }
        ProbesState::ConfirmForce {
            suite,
            report,
            busy,
        } => {
            // Wrapped here rather than by the paragraph, which must not wrap the result tables.
            let width = usize::from(block.inner(area).width);
            let ask = "press f to run anyway, Esc to cancel";
            let mut question: Vec<String> = match busy.as_slice() {
                [one] => vec![format!("{one}: {ask}")],
                many => many
                    .iter()
                    .cloned()
                    .chain([format!("{ask} (all of them)")])
                    .collect(),
            };
            question.push(format!(
                "f runs the {} suite again on every GPU, these included; their work and the \
                 probes will slow each other down.",
                suite.as_str()
            ));
            let mut lines: Vec<Line> = Vec::new();
            for (i, q) in question.iter().enumerate() {
                let style = if i + 1 < question.len() {
                    t.warn()
                } else {
                    ratatui::style::Style::default()
                };
                lines.extend(
                    format::wrap(q, width, "")
                        .into_iter()
                        .map(|l| Line::from(Span::styled(l, style))),
                );
            }
            lines.push(Line::from(""));
            lines.extend(report_lines(app, report, width));
            f.render_widget(Paragraph::new(lines).block(block), area);
        }
        ProbesState::Ready { suite, last } => {
            let mut lines = vec![Line::from(vec![
                Span::raw("Suite: "),
                suite_span(app, SuiteName::Quick, *suite),
                Span::raw("  "),
                suite_span(app, SuiteName::Standard, *suite),
                Span::raw("  "),
                suite_span(app, SuiteName::Full, *suite),
                Span::raw("   ↑↓ pick · Enter run"),
            ])];
            let width = usize::from(block.inner(area).width);
            let first = lines.remove(0);
            lines.push(format::fit_line(first, width));
            lines.push(Line::from(""));
            // Wrapped here rather than by the paragraph, which must not wrap the result tables.
            match last {
                None => lines.extend(
                    format::wrap(
                        "No probe run yet. quick takes seconds, standard about a minute, full \
                         minutes with the GPU nearly to itself; a GPU other processes use is \
                         refused, and you are asked whether to run on it anyway.",
                        width,
                        "",
                    )
                    .into_iter()
                    .map(Line::from),
                ),
                Some(Err(e)) => lines.extend(
                    format::wrap(
                        &format!("Could not run: {}", format::text(&e.to_string())),
                        width,
                        "",
                    )
                    .into_iter()
                    .map(|l| {
                        Line::from(Span::styled(
                            l,
                            t.severity(gpudiag_model::finding::Severity::Fail),
                        ))
                    }),
                ),
                Some(Ok(report)) => lines.extend(report_lines(app, report, width)),
            }
            f.render_widget(Paragraph::new(lines).block(block), area);
        }
    }
}

/// The results as `gpudiag probe` prints them, failures and warnings coloured, refusals saying
/// how to force here and wrapped to `width` (the tables are cut rather than wrapped, so their
/// columns stay aligned).
fn report_lines(app: &App, report: &ProbeReport, width: usize) -> Vec<Line<'static>> {
    let t = app.theme;
    let mut text = gpudiag_probes::text::render_with_hint(report, "f runs it anyway (asks first)");
    for f in &report.findings {
        text.push_str(&format!("[{}] {}\n", f.severity, f.title));
    }
    let mut lines = Vec::new();
    for l in text.lines() {
        if l.starts_with("  not probed: ") {
            let mut wrapped = format::wrap(l, width, "    ").into_iter();
            if let Some(first) = wrapped.next() {
                // The first line keeps its own two-space indent, not the continuation's.
                lines.push(Line::from(Span::styled(first[2..].to_owned(), t.warn())));
            }
            lines.extend(wrapped.map(|w| Line::from(Span::styled(w, t.warn()))));
            continue;
        }
        let style = if l.contains(" fail") || l.contains(" error") {
            t.severity(gpudiag_model::finding::Severity::Fail)
        } else if l.contains(" warn") {
            t.warn()
        } else {
            ratatui::style::Style::default()
        };
        lines.push(Line::from(Span::styled(format::fit(l, width), style)));
    }
    lines
}

fn suite_span(app: &App, this: SuiteName, picked: SuiteName) -> Span<'static> {
    let label = format!(" {} ", this.as_str());
    if this == picked {
        Span::styled(label, app.theme.selected())
    } else {
        Span::raw(label)
    }
}
