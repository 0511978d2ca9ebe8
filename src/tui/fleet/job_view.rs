//! One job's GPUs across nodes side by side: rank, SM activity and utilisation (the shipped
//! rules' window averages where they are loaded, else the live figures), the straggler marked,
//! a job that makes no progress said first, the rules' judgement across nodes or a line saying
//! it cannot be had, then what each node's own gpudiag says.

use gpudiag_fleet::model::{Fleet, Gpu, Job, JobGpu, RulesState};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::cells;
use super::state::State;
use super::table::{judgement_words, straggler_words};
use crate::tui::format::{self, NA};
use crate::tui::theme::Theme;
use gpudiag_model::finding::Severity;
use gpudiag_model::job::GpuRole;

pub const RULES_NOT_LOADED: &str = "cross-node verdict: the shipped rules are not loaded in this \
     Prometheus (assets/prometheus/gpudiag-rules.yml); each node's own verdict follows";

pub fn render(f: &mut Frame, area: Rect, state: &State, key: &str, theme: &Theme) {
    let width = usize::from(area.width);
    let lines = match state.fleet.as_ref() {
        None => vec![Line::styled("reading Prometheus…", theme.dim())],
        Some(fleet) => match fleet.jobs.iter().find(|j| j.job_key == key) {
            Some(job) => job_lines(fleet, job, width, theme),
            None => vec![Line::styled(
                format!(
                    "job {} is not in the latest read (it ended, or the filter's selector \
                     leaves it out)",
                    format::text(key)
                ),
                theme.warn(),
            )],
        },
    };
    cells::draw_scrolled(f, area, lines, state.scroll);
}

/// The live GPU a job GPU is, when its node still reports it.
fn live<'a>(fleet: &'a Fleet, jg: &JobGpu) -> Option<&'a Gpu> {
    fleet
        .node(&jg.node)?
        .gpus
        .iter()
        .find(|g| g.uuid.as_deref() == Some(jg.uuid.as_str()))
}

/// A figure from the rules' averages, else the live one, dim to tell them apart.
fn figure(rules: Option<f64>, live: Option<f64>, theme: &Theme) -> (String, Style) {
    match (rules, live) {
        (Some(v), _) => (cells::pct(Some(v)), Style::default()),
        (None, Some(v)) => (cells::pct(Some(v)), theme.dim()),
        (None, None) => (NA.to_owned(), theme.dim()),
    }
}

fn job_lines(fleet: &Fleet, job: &Job, width: usize, theme: &Theme) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let n = job.gpus.len();
    lines.push(Line::from(vec![
        Span::styled(format!("job {}", format::text(&job.job_key)), theme.title()),
        Span::raw(format!(
            " ({}{}) · {n} GPUs on {} node{}: {}",
            format::text(&job.joined_by),
            job.namespace
                .as_deref()
                .map(|ns| format!(", namespace {}", format::text(ns)))
                .unwrap_or_default(),
            job.nodes.len(),
            if job.nodes.len() == 1 { "" } else { "s" },
            format::text(&job.nodes.join(", ")),
        )),
    ]));
    if let Some(stall) = &job.stall {
        lines.push(Line::styled(
            format!("STALLED: {}", format::text(&stall.words())),
            theme.severity(Severity::Fail),
        ));
    }
    match (&fleet.rules, &job.across_nodes) {
        (RulesState::Loaded, Some(a)) => {
            let (text, style) = judgement_words(fleet, job, theme);
            let mut spans = vec![
                Span::raw("across nodes (shipped rules): "),
                Span::styled(text, style),
            ];
            // Several GPUs may straggle together: each is named.
            let named: Vec<String> = a
                .stragglers
                .iter()
                .map(|s| {
                    format!(
                        "{} GPU {}{}",
                        format::text(s.node.as_deref().unwrap_or(NA)),
                        format::text(s.gpu.as_deref().unwrap_or(NA)),
                        s.pace
                            .as_deref()
                            .map(|p| format!(" ({})", format::text(p)))
                            .unwrap_or_default()
                    )
                })
                .collect();
            if !named.is_empty() {
                let what = if named.len() == 1 {
                    "straggler"
                } else {
                    "stragglers"
                };
                spans.push(Span::styled(
                    format!(" · {what} {}", named.join(", ")),
                    theme.warn(),
                ));
            }
            lines.push(Line::from(spans));
        }
        (RulesState::Loaded, None) if !job.doubts.is_empty() => {
            for doubt in &job.doubts {
                lines.extend(
                    format::wrap(
                        &format!("across nodes: not judged: {}", format::text(doubt)),
                        width,
                        "",
                    )
                    .into_iter()
                    .map(|l| Line::styled(l, theme.warn())),
                );
            }
        }
        (RulesState::Loaded, None) => lines.push(Line::styled(
            "across nodes: the shipped rules are loaded but have not judged this job yet \
             (their window is still filling); each node's own verdict follows",
            theme.dim(),
        )),
        (RulesState::NotLoaded, _) => lines.extend(
            format::wrap(RULES_NOT_LOADED, width, "")
                .into_iter()
                .map(|l| Line::styled(l, theme.warn())),
        ),
        (RulesState::Unknown { reason }, _) => lines.push(Line::styled(
            format!(
                "cross-node verdict: unknown, the rules could not be read ({}); each node's \
                 own verdict follows",
                format::text(reason)
            ),
            theme.warn(),
        )),
    }
    lines.push(Line::raw(""));
    let bar_width = width.saturating_sub(70).clamp(10, 30);
    lines.push(Line::styled(
        format!(
            "{:<18} {:>4} {:>5}  {:>6} {:<bar_width$}  {:>5}  {:<18} STRAGGLER",
            "NODE", "GPU", "RANK", "SM", "", "UTIL", "VERDICT"
        ),
        theme.title(),
    ));
    for jg in &job.gpus {
        let gpu = live(fleet, jg);
        let (sm, sm_style) = figure(jg.sm_active_pct, gpu.and_then(|g| g.sm_active_pct), theme);
        let (util, util_style) = figure(jg.util_pct, gpu.and_then(|g| g.util_pct), theme);
        let sm_value = jg.sm_active_pct.or(gpu.and_then(|g| g.sm_active_pct));
        let (verdict, verdict_style) = match gpu {
            Some(g) => cells::verdict(&g.verdict, theme),
            None => ("not in this read".to_owned(), theme.dim()),
        };
        let row_style = if jg.straggler {
            theme.warn()
        } else {
            Style::default()
        };
        let mut spans = vec![
            Span::styled(
                format!(
                    "{:<18} {:>4} {:>5}  ",
                    format::fit(&jg.node, 18),
                    format::fit(jg.gpu.as_deref().unwrap_or(NA), 4),
                    format::fit(jg.rank.as_deref().unwrap_or(NA), 5),
                ),
                row_style,
            ),
            Span::styled(format!("{sm:>6} "), sm_style),
            Span::styled(
                format::bar(sm_value.map(|v| v / 100.0), bar_width),
                theme.level(sm_value.map(|v| v / 100.0)),
            ),
            Span::styled(format!("  {util:>5}  "), util_style),
            Span::styled(format!("{:<18}", format::fit(&verdict, 18)), verdict_style),
        ];
        if jg.straggler {
            spans.push(Span::styled(
                format!(" ◀ {}", straggler_words(job, jg)),
                theme.severity(gpudiag_model::finding::Severity::Warn),
            ));
        } else if jg.role.as_deref() == Some(GpuRole::Waiting.name()) {
            spans.push(Span::styled(" waiting", theme.dim()));
        }
        lines.push(Line::from(spans));
        for alert in gpu.map(|g| g.alerts.as_slice()).unwrap_or_default() {
            lines.push(Line::from(vec![
                Span::raw("      "),
                Span::styled(
                    cells::alert_text(alert),
                    cells::severity_style(alert.severity, theme),
                ),
            ]));
        }
    }
    if job.gpus.iter().any(|jg| jg.sm_active_pct.is_none()) {
        lines.push(Line::styled(
            "dim figures are live readings: the rules' window averages are not there for them",
            theme.dim(),
        ));
    }
    lines.push(Line::raw(""));
    lines.push(Line::styled(
        "each node's own verdict on the job",
        theme.title(),
    ));
    if job.per_node.is_empty() {
        lines.push(Line::styled(
            "  none: no node's gpudiag judged this job (dcgm-exporter only, or too early)",
            theme.dim(),
        ));
    }
    for v in &job.per_node {
        let mut text = format!("  {}: {}", format::text(&v.node), format::text(&v.verdict));
        if let Some(c) = &v.confidence {
            text.push_str(&format!(" ({})", format::text(c)));
        }
        if !v.stragglers.is_empty() {
            let gpus: Vec<String> = v
                .stragglers
                .iter()
                .map(|g| format::text(g.gpu.as_deref().or(g.uuid.as_deref()).unwrap_or(NA)))
                .collect();
            let what = if gpus.len() == 1 { "GPU" } else { "GPUs" };
            text.push_str(&format!(" · straggler {what} {}", gpus.join(", ")));
        }
        let style = if v.verdict == "balanced" {
            theme.verdict(false)
        } else {
            theme.warn()
        };
        lines.push(Line::styled(text, style));
    }
    lines
}
