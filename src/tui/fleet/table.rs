//! The fleet table: a line per node (or per job), a line per GPU under it when opened, and the
//! firing alerts under what they name. Only the lines on screen are built, so a fleet of
//! thousands of GPUs draws as fast as a small one.

use gpudiag_fleet::model::{Fleet, Gpu, GpuVerdict, Job, JobGpu, Node, NodeState};
use gpudiag_model::finding::Severity;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::cells;
use super::state::{Grouping, Row, State};
use crate::tui::format::{self, NA};
use crate::tui::theme::Theme;

const NAME_WIDTH: usize = 16;
/// Under a job a GPU's line names its node too.
const JOB_NAME_WIDTH: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Name,
    Model,
    Util,
    Sm,
    Tensor,
    Memory,
    Power,
    Temp,
    Verdict,
    Finding,
    Job,
    Age,
}

impl Col {
    fn title(self, grouping: Grouping) -> &'static str {
        match self {
            Col::Name if grouping == Grouping::Job => "JOB / NODE GPU",
            Col::Name => "NODE / GPU",
            Col::Model => "MODEL",
            Col::Util => "UTIL",
            Col::Sm => "SM",
            Col::Tensor => "TENS",
            Col::Memory => "MEM GiB",
            Col::Power => "POWER",
            Col::Temp => "TEMP",
            Col::Verdict => "VERDICT",
            Col::Finding => "WORST FINDING",
            Col::Job if grouping == Grouping::Job => "RANK",
            Col::Job => "JOB / POD",
            Col::Age => "AGE",
        }
    }

    /// Fixed width, or `None` for the columns that share what is left.
    fn width(self, grouping: Grouping) -> Option<usize> {
        match self {
            Col::Name if grouping == Grouping::Job => Some(JOB_NAME_WIDTH),
            Col::Name => Some(NAME_WIDTH),
            Col::Model => Some(12),
            Col::Util | Col::Sm | Col::Tensor | Col::Temp => Some(4),
            Col::Memory => Some(9),
            Col::Power => Some(5),
            Col::Age => Some(4),
            Col::Verdict | Col::Finding | Col::Job => None,
        }
    }

    fn right_aligned(self) -> bool {
        matches!(
            self,
            Col::Util | Col::Sm | Col::Tensor | Col::Memory | Col::Power | Col::Temp | Col::Age
        )
    }
}

const ALL: [Col; 12] = [
    Col::Name,
    Col::Model,
    Col::Util,
    Col::Sm,
    Col::Tensor,
    Col::Memory,
    Col::Power,
    Col::Temp,
    Col::Verdict,
    Col::Finding,
    Col::Job,
    Col::Age,
];

/// Dropped in this order when the terminal is too narrow for every column.
const DROP_ORDER: [Col; 6] = [
    Col::Tensor,
    Col::Model,
    Col::Power,
    Col::Age,
    Col::Memory,
    Col::Temp,
];

/// The narrowest the shared text columns may get before a column is dropped.
const MIN_TEXT: [(Col, usize); 3] = [(Col::Verdict, 16), (Col::Finding, 12), (Col::Job, 10)];

/// The columns that fit `width`, with their widths.
fn layout(width: usize, grouping: Grouping) -> Vec<(Col, usize)> {
    // A job's GPUs are nearly always of one model; the room goes to the rank and straggler.
    let mut cols: Vec<Col> = ALL
        .into_iter()
        .filter(|c| !(grouping == Grouping::Job && *c == Col::Model))
        .collect();
    let fixed = |cols: &[Col]| -> usize {
        cols.iter().filter_map(|c| c.width(grouping)).sum::<usize>() + cols.len().saturating_sub(1)
    };
    let min_text: usize = MIN_TEXT.iter().map(|(_, w)| w).sum();
    for drop in DROP_ORDER {
        if fixed(&cols) + min_text <= width {
            break;
        }
        cols.retain(|c| *c != drop);
    }
    let spare = width.saturating_sub(fixed(&cols));
    // The verdict and finding matter most; the job gets the rest.
    let verdict = (spare * 2 / 5).max(1);
    let finding = (spare / 3).max(1);
    let job = spare.saturating_sub(verdict + finding).max(1);
    cols.into_iter()
        .map(|c| {
            let w = match c {
                Col::Verdict => verdict,
                Col::Finding => finding,
                Col::Job => job,
                _ => c.width(grouping).unwrap_or(1),
            };
            (c, w)
        })
        .collect()
}

/// One cell: its text (printable already) and style.
type Cell = (String, Style);

fn plain(s: String) -> Cell {
    (s, Style::default())
}

/// A line of cells in the columns' widths. With `one_verdict_cell` the verdict takes the
/// finding's column too: a GPU seen only through dcgm-exporter has neither, and
/// "n/a: dcgm-exporter only" says so whole where two cut cells would not.
fn join(
    cells: &[(Col, usize)],
    one_verdict_cell: bool,
    mut cell_of: impl FnMut(Col) -> Cell,
) -> Line<'static> {
    let mut spans = Vec::with_capacity(cells.len() * 2);
    let mut iter = cells.iter().enumerate().peekable();
    while let Some((i, &(col, mut width))) = iter.next() {
        if i > 0 {
            spans.push(Span::raw(" "));
        }
        if one_verdict_cell
            && col == Col::Verdict
            && let Some(&(_, &(Col::Finding, w))) = iter.peek()
        {
            width += 1 + w;
            iter.next();
        }
        let (text, style) = cell_of(col);
        let fitted = format::fit(&text, width);
        let gap = " ".repeat(width.saturating_sub(format::width_of(&fitted)));
        let padded = if col.right_aligned() {
            format!("{gap}{fitted}")
        } else {
            format!("{fitted}{gap}")
        };
        spans.push(Span::styled(padded, style));
    }
    Line::from(spans)
}

pub fn render(f: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    if area.height == 0 {
        return;
    }
    let Some(fleet) = &state.fleet else {
        return;
    };
    let cols = layout(usize::from(area.width), state.grouping);
    let mut lines = Vec::with_capacity(usize::from(area.height));
    lines.push(
        join(&cols, false, |c| {
            (c.title(state.grouping).to_owned(), theme.title())
        })
        .style(Style::default().add_modifier(Modifier::BOLD)),
    );
    let rows = state.rows();
    if rows.is_empty() {
        let why = if fleet.could_not_run.is_some() {
            "nothing read yet: the line above says why; the next read is under way".to_owned()
        } else if fleet.nodes.is_empty() {
            "no node to show".to_owned()
        } else {
            format!(
                "nothing matches the filter \"{}\" (Esc clears it)",
                format::text(&state.filter)
            )
        };
        lines.push(Line::styled(why, theme.dim()));
    }
    let width = usize::from(area.width);
    let visible = usize::from(area.height).saturating_sub(1);
    for (i, row) in rows.iter().enumerate().skip(state.offset).take(visible) {
        let mut line = row_line(fleet, state, *row, &cols, width, theme);
        if i == state.selected {
            line = line.patch_style(theme.selected());
        }
        lines.push(line);
    }
    f.render_widget(Paragraph::new(lines), area);
}

fn row_line(
    fleet: &Fleet,
    state: &State,
    row: Row,
    cols: &[(Col, usize)],
    width: usize,
    theme: &Theme,
) -> Line<'static> {
    match row {
        Row::Node { node } => {
            let node = &fleet.nodes[node];
            let open = state.expanded.contains(&node.name);
            let dcgm_only = !node.gpus.is_empty()
                && node
                    .gpus
                    .iter()
                    .all(|g| g.verdict == GpuVerdict::DcgmExporterOnly)
                && node.alerts.is_empty();
            join(cols, dcgm_only, |c| node_cell(node, c, open, theme))
        }
        Row::Gpu { node, gpu, job } => {
            let n = &fleet.nodes[node];
            let g = &n.gpus[gpu];
            let job = job.map(|j| &fleet.jobs[j]);
            let dcgm_only = g.verdict == GpuVerdict::DcgmExporterOnly && g.alerts.is_empty();
            join(cols, dcgm_only, |c| gpu_cell(n, g, job, c, theme))
        }
        Row::Alert { node, gpu, alert } => {
            let n = &fleet.nodes[node];
            let (a, indent) = match gpu {
                Some(g) => (&n.gpus[g].alerts[alert], "      "),
                None => (&n.alerts[alert], "    "),
            };
            let style = cells::severity_style(a.severity, theme);
            format::fit_line(
                Line::from(vec![
                    Span::raw(indent),
                    Span::styled(cells::alert_text(a), style),
                ]),
                width,
            )
        }
        Row::Job { job } => {
            let j = &fleet.jobs[job];
            let open = !state.collapsed_jobs.contains(&j.job_key);
            format::fit_line(job_line(fleet, j, open, theme), width)
        }
        Row::JobGpuOnly { job, index } => {
            let j = &fleet.jobs[job];
            let jg = &j.gpus[index];
            join(cols, false, |c| job_gpu_only_cell(jg, c, theme))
        }
        Row::NoJob { gpus } => Line::styled(
            format!("▾ no job of two or more GPUs · {gpus} GPU{}", plural(gpus)),
            theme.title(),
        ),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Mean of the figures present; `None` when none is.
fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let (sum, n) = values
        .flatten()
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

fn sum(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values
        .flatten()
        .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

fn max(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().fold(None, |acc: Option<f64>, v| {
        Some(acc.map_or(v, |a| a.max(v)))
    })
}

fn node_cell(node: &Node, col: Col, open: bool, theme: &Theme) -> Cell {
    let gpus = &node.gpus;
    let down = node.state == NodeState::Down;
    match col {
        Col::Name => {
            let mark = if gpus.is_empty() {
                " "
            } else if open {
                "▾"
            } else {
                "▸"
            };
            (
                format!("{mark} {}", format::text(&node.name)),
                cells::rank_style(node.worst, theme).add_modifier(Modifier::BOLD),
            )
        }
        Col::Model => {
            let first = gpus.first().and_then(|g| g.model.as_deref());
            let same = gpus.iter().all(|g| g.model.as_deref() == first);
            let text = match (gpus.len(), first) {
                (0, _) => "no GPU".to_owned(),
                (n, Some(m)) if same => format!("{n}× {}", cells::model(Some(m))),
                (n, _) => format!("{n} GPU{}", plural(n)),
            };
            plain(text)
        }
        Col::Util => plain(cells::pct(mean(gpus.iter().map(|g| g.util_pct)))),
        Col::Sm => plain(cells::pct(mean(gpus.iter().map(|g| g.sm_active_pct)))),
        Col::Tensor => plain(cells::pct(mean(gpus.iter().map(|g| g.tensor_active_pct)))),
        Col::Memory => plain(cells::memory(
            sum(gpus.iter().map(|g| g.memory_used_mib)),
            sum(gpus.iter().map(|g| g.memory_total_mib)),
        )),
        Col::Power => plain(cells::watts(sum(gpus.iter().map(|g| g.power_w)))),
        Col::Temp => plain(cells::celsius(max(gpus.iter().map(|g| g.temperature_c)))),
        Col::Verdict => match node.state {
            NodeState::Down => ("DOWN".to_owned(), theme.severity(Severity::Fail)),
            NodeState::Partial => {
                let up = node.targets.iter().filter(|t| t.up).count();
                (
                    format!("PARTIAL: {up}/{} targets up", node.targets.len()),
                    theme.warn(),
                )
            }
            NodeState::Up => most_common_verdict(gpus, theme),
        },
        Col::Finding => {
            let worst = node
                .findings
                .iter()
                .chain(gpus.iter().flat_map(|g| g.findings.iter()))
                .max_by_key(|f| f.severity);
            let alerts = node.alerts.len() + gpus.iter().map(|g| g.alerts.len()).sum::<usize>();
            let mut parts = Vec::new();
            let mut style = theme.dim();
            if down {
                let downs = node.targets.iter().filter(|t| !t.up).count();
                parts.push(format!("{downs} target{} down", plural(downs)));
                style = theme.severity(Severity::Fail);
            }
            if alerts > 0 {
                parts.push(format!("⚠{alerts}"));
                if !down {
                    style = theme.warn();
                }
            }
            if let Some(f) = worst {
                parts.push(format::text(&f.id));
                style = theme.severity(f.severity);
            }
            if parts.is_empty() {
                parts.push(
                    if gpus
                        .iter()
                        .all(|g| g.verdict == GpuVerdict::DcgmExporterOnly)
                        && !gpus.is_empty()
                    {
                        NA.to_owned()
                    } else {
                        "-".to_owned()
                    },
                );
            }
            (parts.join(" "), style)
        }
        Col::Job => {
            let mut keys: Vec<String> = gpus
                .iter()
                .map(cells::job_or_pod)
                .filter(|k| k != "-")
                .collect();
            keys.sort_unstable();
            keys.dedup();
            plain(match keys.as_slice() {
                [] => "-".to_owned(),
                [one] => one.clone(),
                many => format!("{} jobs", many.len()),
            })
        }
        Col::Age => {
            // A down node's figures are gone: how long ago its targets were last tried says
            // how long it has been so.
            let ages = node.targets.iter().map(|t| t.last_scrape_age_s);
            let age = if down {
                max(ages)
            } else {
                max(gpus.iter().map(|g| g.last_scrape_age_s)).or_else(|| max(ages))
            };
            plain(cells::age(age))
        }
    }
}

/// The verdict most of a node's GPUs share, with how many when they differ: a node of seven
/// GPUs waiting for the eighth reads "waiting_for_peer 7/8", not the odd one out.
fn most_common_verdict(gpus: &[Gpu], theme: &Theme) -> Cell {
    let mut counts: Vec<(&GpuVerdict, usize)> = Vec::new();
    for g in gpus {
        match counts.iter_mut().find(|(v, _)| **v == g.verdict) {
            Some((_, n)) => *n += 1,
            None => counts.push((&g.verdict, 1)),
        }
    }
    let Some(&(verdict, n)) = counts.iter().max_by_key(|(_, n)| *n) else {
        return (NA.to_owned(), theme.dim());
    };
    let (text, style) = cells::verdict(verdict, theme);
    if n == gpus.len() {
        (text, style)
    } else {
        (format!("{n}/{} {text}", gpus.len()), style)
    }
}

fn gpu_cell(node: &Node, gpu: &Gpu, job: Option<&Job>, col: Col, theme: &Theme) -> Cell {
    match col {
        Col::Name => {
            let index = gpu
                .gpu
                .as_deref()
                .map_or_else(|| NA.to_owned(), format::text);
            if job.is_some() {
                // Under a job the node is what tells GPUs apart.
                let room = JOB_NAME_WIDTH.saturating_sub(3 + format::width_of(&index));
                plain(format!("  {} {index}", format::fit(&node.name, room)))
            } else {
                plain(format!("    GPU {index}"))
            }
        }
        Col::Model => plain(cells::model(gpu.model.as_deref())),
        Col::Util => plain(cells::pct(gpu.util_pct)),
        Col::Sm => plain(cells::pct(gpu.sm_active_pct)),
        Col::Tensor => plain(cells::pct(gpu.tensor_active_pct)),
        Col::Memory => plain(cells::memory(gpu.memory_used_mib, gpu.memory_total_mib)),
        Col::Power => plain(cells::watts(gpu.power_w)),
        Col::Temp => plain(cells::celsius(gpu.temperature_c)),
        Col::Verdict => cells::verdict(&gpu.verdict, theme),
        Col::Finding => cells::worst_finding(gpu, theme),
        Col::Job => match job {
            Some(j) => job_rank_cell(j, gpu, theme),
            None => plain(cells::job_or_pod(gpu)),
        },
        Col::Age => plain(cells::age(gpu.last_scrape_age_s)),
    }
}

/// Under a job: the GPU's rank, and the straggler marked.
fn job_rank_cell(job: &Job, gpu: &Gpu, theme: &Theme) -> Cell {
    let jg = job
        .gpus
        .iter()
        .find(|jg| gpu.uuid.as_deref() == Some(jg.uuid.as_str()));
    let rank = jg.and_then(|jg| jg.rank.as_deref()).unwrap_or(NA);
    let text = format::text(rank);
    if jg.is_some_and(|jg| jg.straggler) {
        return (format!("{text} ◀ straggler"), theme.warn());
    }
    plain(text)
}

/// "straggler (leads)" with the pace when the rules named this GPU.
pub fn straggler_words(job: &Job, jg: &JobGpu) -> String {
    match job
        .across_nodes
        .iter()
        .flat_map(|a| &a.stragglers)
        .find(|s| s.uuid.as_deref() == Some(jg.uuid.as_str()))
        .and_then(|s| s.pace.as_deref())
    {
        Some(pace) => format!("straggler ({})", format::text(pace)),
        None => "straggler".to_owned(),
    }
}

fn job_gpu_only_cell(jg: &JobGpu, col: Col, theme: &Theme) -> Cell {
    match col {
        Col::Name => {
            let index = jg.gpu.as_deref().unwrap_or(NA);
            let room = JOB_NAME_WIDTH.saturating_sub(3 + format::width_of(index));
            plain(format!(
                "  {} {}",
                format::fit(&jg.node, room),
                format::text(index)
            ))
        }
        Col::Util => plain(cells::pct(jg.util_pct)),
        Col::Sm => plain(cells::pct(jg.sm_active_pct)),
        Col::Verdict => ("not in this read".to_owned(), theme.dim()),
        Col::Job => {
            let rank = format::text(jg.rank.as_deref().unwrap_or(NA));
            if jg.straggler {
                (format!("{rank} ◀ straggler"), theme.warn())
            } else {
                plain(rank)
            }
        }
        _ => (NA.to_owned(), theme.dim()),
    }
}

/// A job's line: key, what joined it, its size and the judgement.
fn job_line(fleet: &Fleet, job: &Job, open: bool, theme: &Theme) -> Line<'static> {
    let mark = if open { "▾" } else { "▸" };
    let n = job.gpus.len();
    let nodes = job.nodes.len();
    let mut spans = vec![
        Span::styled(
            format!("{mark} {}", format::text(&job.job_key)),
            cells::rank_style(job.rank, theme).add_modifier(Modifier::BOLD),
        ),
        Span::styled(format!(" ({})", format::text(&job.joined_by)), theme.dim()),
        Span::raw(format!(
            " · {n} GPU{} on {nodes} node{}",
            plural(n),
            plural(nodes)
        )),
    ];
    let (text, style) = judgement_words(fleet, job, theme);
    spans.push(Span::raw(" · "));
    spans.push(Span::styled(text, style));
    Line::from(spans)
}

/// The job's verdict in a few words: the rules' judgement, else the nodes' own.
pub fn judgement_words(fleet: &Fleet, job: &Job, theme: &Theme) -> (String, Style) {
    if let Some(a) = &job.across_nodes {
        let mut s = format::text(&a.pattern);
        if let Some(state) = &a.state {
            s.push_str(&format!(" ({})", format::text(state)));
        }
        if let Some(m) = a.sm_active_median_pct {
            s.push_str(&format!(" · median SM {m:.0}%"));
        }
        if let Some(spread) = a.sm_active_spread {
            s.push_str(&format!(" · spread {spread:.2}×"));
        }
        let style = if a.pattern == "balanced" {
            theme.verdict(false)
        } else {
            theme.warn()
        };
        return (s, style);
    }
    let mut verdicts: Vec<&str> = job.per_node.iter().map(|v| v.verdict.as_str()).collect();
    verdicts.sort_unstable();
    verdicts.dedup();
    let nodes_say = if verdicts.is_empty() {
        NA.to_owned()
    } else {
        format::text(&verdicts.join(", "))
    };
    let prefix = if fleet.rules.loaded() {
        "not judged across nodes yet; nodes say"
    } else {
        "rules not loaded; nodes say"
    };
    (format!("{prefix} {nodes_say}"), theme.dim())
}
