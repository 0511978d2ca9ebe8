//! The job: the GPUs of one job (the ranks of a training run) side by side, the one the others
//! wait for marked, and the verdict on the job with what to do; and the header's one line for
//! it. A data-parallel job runs at its slowest rank's pace, and every GPU of it can read busy
//! alone: only side by side does the straggler stand out, so the figures are the judgement's
//! own window figures (the same as `check --json`'s `jobs[].peers`), not the latest sample.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use crate::tui::app::App;
use crate::tui::format::{self, NA};
use gpudiag_model::job::{GpuRole, JobPattern, JobVerdict, Pace, PeerFigures};

/// How the GPUs of a job are found, for the screen that has none to show.
const HOW_FOUND: &str = "How jobs are found: one Slurm job, one torchrun run \
     (TORCHELASTIC_RUN_ID), one MASTER_ADDR:MASTER_PORT, one Kubernetes pod, or one launcher's \
     children running its executable; where none of these can be read, the processes of one \
     executable form a presumed job.";

/// A straggler's row ends with this, so it shows without colour too (NO_COLOR, captures).
pub const STRAGGLER_MARK: &str = "◀ straggler";

/// A GPU waiting for the job's stragglers ends its row with this, where it fits: each GPU's own
/// verdict reads busy while it waits.
pub const WAITING_MARK: &str = "(waits)";
/// The mark of the rank a stalled job waits for.
pub const MISSING_MARK: &str = "◀ missing";

/// A verdict in words: "communication-bound".
fn pattern(p: JobPattern) -> String {
    p.name().replace('_', "-")
}

/// "GPU 5 (rank 5)", or "GPU 5" where its rank was not read.
fn gpu_name(device: u32, rank: Option<u32>) -> String {
    match rank {
        Some(r) => format!("GPU {device} (rank {r})"),
        None => format!("GPU {device}"),
    }
}

/// The verdict in a few words: "straggler GPU 5 (rank 5), peers wait ~51%", "stragglers GPU 2,
/// 6, peers wait ~48%", "balanced (4 GPUs)". The wait is the first straggler's: the one that sets
/// the pace most.
fn brief(job: &JobVerdict) -> String {
    if let Some(stall) = job.stall.as_ref().filter(|_| job.verdict.stalled()) {
        let whom = match stall.missing.as_slice() {
            [] if !stall.absent_ranks.is_empty() => format!(
                "waits for rank {} (not running)",
                stall
                    .absent_ranks
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            [] => "every rank waits".to_owned(),
            missing => format!(
                "waits for {}",
                missing
                    .iter()
                    .map(|m| gpu_name(m.device, m.rank))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return format!("{} {:.0} s, {whom}", pattern(job.verdict), stall.stuck_s);
    }
    let (first, several) = match (job.stragglers.as_slice(), job.verdict) {
        ([first, rest @ ..], JobPattern::Straggler) => (first, !rest.is_empty()),
        (_, p) => return format!("{} ({} GPUs)", pattern(p), job.members.len()),
    };
    let who = if several {
        let devices: Vec<String> = job
            .stragglers
            .iter()
            .map(|s| s.device.to_string())
            .collect();
        format!("stragglers GPU {}", devices.join(", "))
    } else {
        format!("straggler {}", gpu_name(first.device, first.rank))
    };
    match first.peers_wait_share {
        Some(w) => format!("{who}, peers wait ~{:.0}%", w * 100.0),
        None => {
            let pace = match (first.pace, several) {
                (Pace::Leads, false) => "leads",
                (Pace::Lags, false) => "lags",
                (Pace::Leads, true) => "lead",
                (Pace::Lags, true) => "lag",
            };
            format!("{who} {pace}")
        }
    }
}

/// A verdict that costs the job time reads as a warning; a balanced job as fine.
fn style(app: &App, job: &JobVerdict) -> Style {
    app.theme.verdict(job.verdict != JobPattern::Balanced)
}

/// Whether the header has a line for jobs: a job was judged, or found and not judged yet.
pub fn has_header_line(app: &App) -> bool {
    !app.jobs.is_empty() || !app.jobs_not_judged.is_empty()
}

/// The header's line: "job: straggler GPU 5 (rank 5), peers wait ~50% (high) · torchrun run
/// 7f3c · +1 job", the most concerning job first, fitted to `width` with the count of the
/// others kept whole.
pub fn header_line(app: &App, width: usize) -> Line<'static> {
    let t = app.theme;
    let jobs = app.jobs_by_concern();
    let (head, rest, others) = match jobs.first() {
        Some(job) => {
            let presumed = if job.presumed { " (presumed)" } else { "" };
            (
                Span::styled(format!("job{presumed}: {}", brief(job)), style(app, job)),
                Span::raw(format::text(&format!(
                    " ({}) · {}",
                    job.confidence,
                    job.job.label()
                ))),
                // A job found and not judged is one too.
                jobs.len() - 1 + app.jobs_not_judged.len(),
            )
        }
        None => {
            let Some(why) = app.jobs_not_judged.first() else {
                return Line::default();
            };
            (
                Span::styled("job: not judged yet", t.dim()),
                Span::styled(
                    format::text(&format!(" — {}", super::verdict::without_flags(why))),
                    t.dim(),
                ),
                app.jobs_not_judged.len() - 1,
            )
        }
    };
    let more = match others {
        0 => String::new(),
        1 => " · +1 job".to_owned(),
        n => format!(" · +{n} jobs"),
    };
    let room = width.saturating_sub(format::width_of(&more));
    let mut line = format::fit_line(Line::from(vec![head, rest]), room);
    if !more.is_empty() {
        line.spans.push(Span::styled(more, t.dim()));
    }
    line
}

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let jobs = app.jobs_by_concern();
    let Some(&job) = jobs.get(app.selected_job.min(jobs.len().saturating_sub(1))) else {
        render_none(f, area, app);
        return;
    };
    let t = app.theme;
    let inner_width = usize::from(area.width.saturating_sub(2));
    let inner_height = usize::from(area.height.saturating_sub(2));
    let mut title = format!(
        " Job · {} · {} ({}) · {:.0} s",
        job.job.label(),
        pattern(job.verdict),
        job.confidence,
        (job.end_ms.saturating_sub(job.start_ms)) as f64 / 1000.0
    );
    if jobs.len() > 1 {
        title.push_str(&format!(
            " · {}/{} ↑↓",
            app.selected_job.min(jobs.len() - 1) + 1,
            jobs.len()
        ));
    }
    title.push(' ');
    let block = Block::bordered().title(Span::styled(format::fit(&title, inner_width), t.title()));

    // The wide form where its rows keep their marks whole: cut, they would hide the straggler.
    let wide = inner_width
        >= format::width_of(&columns(&Cells::header(), true))
            + 2
            + format::width_of(STRAGGLER_MARK);
    let mut lines = vec![Line::from(Span::styled(
        format::fit(&columns(&Cells::header(), wide), inner_width),
        t.title(),
    ))];
    // A GPU the verdict lists as a straggler is one whatever its member's role says.
    let role_of = |device: u32| match job.straggler_on(device) {
        Some(_) => Some(GpuRole::Straggler),
        None => job.role_of(device),
    };
    // The rank a stalled job waits for is kept and marked as a straggler is.
    let is_straggler =
        |device: u32| matches!(role_of(device), Some(GpuRole::Straggler | GpuRole::Missing));
    // More GPUs than rows (a large job, a short terminal): every straggler's row stays, the last
    // line says how many are not shown rather than leaving them out silently.
    let rows = inner_height.saturating_sub(1);
    let mut shown: Vec<&gpudiag_model::job::JobMember> = job.members.iter().collect();
    let mut hidden = 0;
    if shown.len() > rows {
        let keep = rows.saturating_sub(1);
        // The stragglers' rows first, the others' in the room left; in the job's order.
        let stragglers = shown.iter().filter(|m| is_straggler(m.device)).count();
        let mut stragglers_left = stragglers.min(keep);
        let mut others_left = keep - stragglers_left;
        shown.retain(|m| {
            let left = if is_straggler(m.device) {
                &mut stragglers_left
            } else {
                &mut others_left
            };
            let keep_it = *left > 0;
            *left = left.saturating_sub(1);
            keep_it
        });
        hidden = job.members.len() - shown.len();
    }
    for m in shown {
        let figures = job.peers.iter().find(|p| p.device == m.device);
        let cells = Cells::of(m, figures);
        let row = columns(&cells, wide);
        let role = role_of(m.device);
        let fits = |mark: &str| format::width_of(&row) + 2 + format::width_of(mark) <= inner_width;
        let row = match role {
            Some(GpuRole::Straggler) if fits(STRAGGLER_MARK) => format!("{row}  {STRAGGLER_MARK}"),
            // Too narrow for the words: the arrow stays, the figures give way to it.
            Some(GpuRole::Straggler) => {
                format!("{} ◀", format::fit(&row, inner_width.saturating_sub(2)))
            }
            Some(GpuRole::Missing) if fits(MISSING_MARK) => format!("{row}  {MISSING_MARK}"),
            Some(GpuRole::Missing) => {
                format!("{} ◀", format::fit(&row, inner_width.saturating_sub(2)))
            }
            Some(GpuRole::Waiting) if fits(WAITING_MARK) => format!("{row}  {WAITING_MARK}"),
            _ => format::fit(&row, inner_width),
        };
        lines.push(if is_straggler(m.device) {
            Line::from(Span::styled(
                row,
                style(app, job).add_modifier(Modifier::BOLD | Modifier::REVERSED),
            ))
        } else {
            Line::from(row)
        });
    }
    if hidden > 0 {
        lines.push(Line::from(Span::styled(
            format::fit(
                &format!("… {hidden} more GPUs of the job: a taller terminal shows them"),
                inner_width,
            ),
            t.warn(),
        )));
    }
    // The GPUs come first and whole: what follows gets the lines they leave.
    let mut notes = Vec::new();
    if let Some(why) = absent_note(app, job, wide) {
        notes.push(Line::from(Span::styled(
            format::fit(&why, inner_width),
            t.dim(),
        )));
    }
    // What makes the grouping doubtful comes before the verdict it weakens.
    for doubt in &job.doubts {
        notes.push(Line::from(Span::styled(
            format::fit(&format!("doubt: {doubt}"), inner_width),
            t.warn(),
        )));
    }
    if job.presumed {
        notes.push(Line::from(Span::styled(
            format::fit(
                "presumed: only their executable ties these processes (no Slurm job, torchrun \
                 run, MASTER_ADDR or pod could be read)",
                inner_width,
            ),
            t.warn(),
        )));
    }
    let room = inner_height.saturating_sub(lines.len() + notes.len());
    lines.extend(notes);
    let head = super::verdict::capped(
        format::wrap(&format::text(&job.title), inner_width, ""),
        (room / 2).max(1).min(room),
        inner_width,
    );
    let room = room.saturating_sub(head.len());
    let advice = super::verdict::capped(
        format::wrap(
            &format::text(&format!("what to do: {}", job.advice)),
            inner_width,
            "  ",
        ),
        room,
        inner_width,
    );
    lines.extend(
        head.into_iter()
            .map(|l| Line::from(Span::styled(l, style(app, job)))),
    );
    lines.extend(advice.into_iter().map(Line::from));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// One row's cells, already formatted.
struct Cells {
    gpu: String,
    rank: String,
    util: String,
    sm: String,
    tensor: String,
    power: String,
    nvlink: String,
    memory: String,
    cpu: String,
    clock: String,
    pcie: String,
    others: String,
    pid: String,
    name: String,
}

impl Cells {
    fn header() -> Cells {
        Cells {
            gpu: "GPU".into(),
            rank: "RANK".into(),
            util: "UTIL".into(),
            sm: "SM ACT".into(),
            tensor: "TENSOR".into(),
            power: "POWER".into(),
            nvlink: "NVLINK".into(),
            memory: "MEMORY".into(),
            cpu: "CPU".into(),
            clock: "SM CLOCK".into(),
            pcie: "PCIE".into(),
            others: "OTHERS".into(),
            pid: "PID".into(),
            name: "PROCESS".into(),
        }
    }

    /// A member's cells; every figure `n/a` where the window had none (or the judgement gave
    /// no figures for the GPU at all).
    fn of(m: &gpudiag_model::job::JobMember, p: Option<&PeerFigures>) -> Cells {
        let pct = |v: Option<f64>| format::num(v, 0, "%");
        let get = |f: fn(&PeerFigures) -> Option<f64>| p.and_then(f);
        Cells {
            gpu: m.device.to_string(),
            rank: format::int(m.rank.or(p.and_then(|p| p.rank))),
            util: pct(get(|p| p.gpu_util_pct)),
            sm: pct(get(|p| p.sm_active_pct)),
            tensor: pct(get(|p| p.tensor_active_pct)),
            power: format::num(get(|p| p.power_w), 0, " W"),
            nvlink: gb_per_s(get(|p| p.nvlink_bytes_per_s)),
            memory: format::bytes(p.and_then(|p| p.job_memory_bytes)),
            cpu: pct(get(|p| p.process_cpu_pct)),
            clock: format::num(get(|p| p.sm_clock_mhz), 0, " MHz"),
            pcie: gb_per_s(get(|p| p.pcie_bytes_per_s)),
            others: p.map_or_else(|| NA.to_owned(), |p| p.other_processes.to_string()),
            pid: m.pid.to_string(),
            name: format::text(m.name.as_deref().unwrap_or(NA)),
        }
    }
}

/// Bytes per second in GB/s (decimal, as NVLink and PCIe are rated).
fn gb_per_s(v: Option<f64>) -> String {
    v.map_or_else(|| NA.to_owned(), |v| format!("{:.1} GB/s", v / 1e9))
}

/// The row as text: numbers right-aligned under their headings; the wide form adds the clock,
/// PCIe, the other processes on the GPU and the job's process.
fn columns(c: &Cells, wide: bool) -> String {
    let mut s = format!(
        "{:>3} {:>4} {:>5} {:>6} {:>6} {:>6} {:>9} {:>9} {:>5}",
        c.gpu, c.rank, c.util, c.sm, c.tensor, c.power, c.nvlink, c.memory, c.cpu
    );
    if wide {
        s.push_str(&format!(
            " {:>8} {:>9} {:>6} {:>8}  {}",
            c.clock,
            c.pcie,
            c.others,
            c.pid,
            format::pad(&c.name, 20)
        ));
    }
    s
}

/// Why figures read n/a, where any do: "n/a: NVLink on GPU 3: not_supported". The judgement
/// gives the window's figure only; the latest sample of the GPU says why the field is absent,
/// else the window simply had no reading.
fn absent_note(app: &App, job: &JobVerdict, wide: bool) -> Option<String> {
    type Figure = fn(&PeerFigures) -> Option<f64>;
    let mut shown: Vec<(&str, &str, Figure)> = vec![
        ("utilisation", "gpu_util_pct", |p| p.gpu_util_pct),
        ("SM active", "sm_active_pct", |p| p.sm_active_pct),
        ("tensor", "tensor_active_pct", |p| p.tensor_active_pct),
        ("power", "power_w", |p| p.power_w),
        ("NVLink", "nvlink_rx_bytes_per_s", |p| p.nvlink_bytes_per_s),
        ("memory", "processes", |p| {
            p.job_memory_bytes.map(|b| b as f64)
        }),
        ("CPU", "processes", |p| p.process_cpu_pct),
    ];
    if wide {
        shown.push(("SM clock", "sm_clock_mhz", |p| p.sm_clock_mhz));
        shown.push(("PCIe", "pcie_rx_bytes_per_s", |p| p.pcie_bytes_per_s));
    }
    let mut parts: Vec<String> = Vec::new();
    for (label, field, get) in shown {
        let missing: Vec<u32> = job
            .members
            .iter()
            .filter(|m| {
                job.peers
                    .iter()
                    .find(|p| p.device == m.device)
                    .and_then(get)
                    .is_none()
            })
            .map(|m| m.device)
            .collect();
        if missing.is_empty() {
            continue;
        }
        let why = missing
            .iter()
            .find_map(|d| app.session.pipeline.latest.get(d)?.why_absent(field))
            .map_or_else(
                || "no reading in the window".to_owned(),
                ToString::to_string,
            );
        let on = if missing.len() == job.members.len() {
            String::new()
        } else {
            let gpus: Vec<String> = missing.iter().map(u32::to_string).collect();
            format!(" on GPU {}", gpus.join(", "))
        };
        parts.push(format!("{label}{on}: {why}"));
    }
    if job.peers.is_empty() {
        parts.insert(0, "the judgement gave no figures".to_owned());
    }
    (!parts.is_empty()).then(|| format::text(&format!("{NA}: {}", parts.join("; "))))
}

/// No job to show: why not, and how jobs are found.
fn render_none(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let width = usize::from(area.width.saturating_sub(2));
    let mut lines: Vec<Line> = Vec::new();
    if app.jobs_not_judged.is_empty() {
        let why = if app.devices.len() < 2 {
            "this source has one GPU".to_owned()
        } else if app.session.pipeline.latest.is_empty() {
            "no telemetry has arrived yet".to_owned()
        } else {
            let read: Vec<&gpudiag_model::sample::Sample> = app
                .session
                .pipeline
                .latest
                .values()
                .filter(|s| s.processes.is_some())
                .collect();
            let busy: Vec<u32> = read
                .iter()
                .filter(|s| s.processes.as_ref().is_some_and(|p| !p.is_empty()))
                .map(|s| s.device)
                .collect();
            match busy.as_slice() {
                _ if read.is_empty() => "no process list has been read yet".to_owned(),
                [] => "no process is using the GPUs".to_owned(),
                [one] => format!("only GPU {one} runs processes"),
                many => format!(
                    "the processes on {} GPUs belong to no common job",
                    many.len()
                ),
            }
        };
        let text = format!("No job of two or more GPUs: {why}.");
        lines.extend(
            format::wrap(&text, width, "")
                .into_iter()
                .map(|l| Line::from(Span::styled(l, t.title()))),
        );
    } else {
        lines.push(Line::from(Span::styled(
            format::fit("A job was found but not judged yet:", width),
            t.title(),
        )));
        for why in &app.jobs_not_judged {
            let why = super::verdict::without_flags(why);
            lines.extend(
                format::wrap(&format::text(why), width, "  ")
                    .into_iter()
                    .map(|l| Line::from(Span::styled(l, t.warn()))),
            );
        }
    }
    lines.push(Line::from(""));
    lines.extend(
        format::wrap(HOW_FOUND, width, "")
            .into_iter()
            .map(Line::from),
    );
    let block = Block::bordered().title(Span::styled(" Job ", t.title()));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_fits_80_columns_with_its_mark() {
        let widest = Cells {
            gpu: "15".into(),
            rank: "127".into(),
            util: "100%".into(),
            sm: "100%".into(),
            tensor: "100%".into(),
            power: "1000 W".into(),
            nvlink: "900.0 GB/s".into(),
            memory: "141.0 GiB".into(),
            cpu: "1600%".into(),
            ..Cells::header()
        };
        let row = format!("{}  {STRAGGLER_MARK}", columns(&widest, false));
        assert!(format::width_of(&row) <= 78, "{row}");
    }
}
