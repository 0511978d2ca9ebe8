//! Processes on the GPUs: PID, user, command, GPU memory and its growth over the last minute,
//! SM utilisation, and on wide screens who owns each (Slurm job, pod) and its container;
//! sortable (s), and a confirmed kill (k) on live GPUs.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Paragraph, Row, Table, TableState};

use crate::tui::app::{App, ProcessView};
use crate::tui::format::{self, NA};
use gpudiag_model::attribution::{Attribution, PodIdentity};

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let title = format!(" Processes · sorted by {} (s) · k kill ", app.sort.label());
    let block = Block::bordered().title(Span::styled(title, t.title()));
    let rows = match app.process_view() {
        ProcessView::NotRead(why) => {
            let msg = format::fit(
                &format!(
                    "process list {NA}: {}",
                    why.unwrap_or_else(|| "no sample yet".into())
                ),
                area.width.saturating_sub(2) as usize,
            );
            f.render_widget(Paragraph::new(msg).style(t.dim()).block(block), area);
            return;
        }
        ProcessView::Rows(rows) => rows,
    };
    if rows.is_empty() {
        f.render_widget(
            Paragraph::new("no processes are using the GPUs").block(block),
            area,
        );
        return;
    }
    let wide = area.width >= 110;
    // Below this the fixed columns and the command's ten leave no room: the table would cut
    // the growth's unit into the SM column, so the user column goes (wider terminals show it).
    let narrow = area.width < 68;
    // The growth is the mean over the last minute (GROWTH_WINDOW_MS), not this second's.
    let mut header = vec![
        "GPU",
        "PID",
        "USER",
        "COMMAND",
        "GPU MEM",
        "GROWTH 1m",
        "SM",
    ];
    let mut widths = vec![
        Constraint::Length(3),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Min(10),
        Constraint::Length(9),
        Constraint::Length(13),
        Constraint::Length(5),
    ];
    if narrow {
        header.remove(2);
        widths.remove(2);
    }
    if wide {
        header.push("JOB / POD");
        widths.push(Constraint::Length(30));
        header.push("CONTAINER");
        widths.push(Constraint::Length(14));
    }
    // The command column takes what the others leave (inside the border, past the selection
    // marker, between columns); cells are fitted to it here, as the table would cut them
    // without a mark.
    let fixed: u16 = widths
        .iter()
        .map(|c| match c {
            Constraint::Length(n) => *n,
            _ => 0,
        })
        .sum();
    let command_width = usize::from(
        area.width
            .saturating_sub(2 + 2 + fixed + (widths.len() as u16 - 1))
            .max(10),
    );
    let body: Vec<Row> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.device.to_string(),
                r.pid.to_string(),
                format::fit(r.user.as_deref().unwrap_or(NA), 10),
                format::fit(r.name.as_deref().unwrap_or(NA), command_width),
                format::bytes(r.used_memory_bytes),
                format::growth(r.growth_bytes_per_s),
                format::num(r.sm_util_pct, 0, "%"),
            ];
            if narrow {
                cells.remove(2);
            }
            if wide {
                cells.push(format::fit(&owner(r.attribution.as_ref()), 30));
                cells.push(
                    r.container_id
                        .as_deref()
                        .map_or_else(|| "-".to_owned(), |c| format::fit(c, 12)),
                );
            }
            Row::new(cells)
        })
        .collect();
    let table = Table::new(body, widths)
        .header(Row::new(header).style(t.title()))
        .block(block)
        .row_highlight_style(t.selected())
        .highlight_symbol("▶ ");
    let mut state =
        TableState::default().with_selected(Some(app.selected_process.min(rows.len() - 1)));
    f.render_stateful_widget(table, area, &mut state);
}

/// Who owns a process, in one cell: its Slurm job (and the job's user), else its pod as
/// `namespace/name` (and container), else why no pod is named on a GPU pods share, else `-`.
fn owner(a: Option<&Attribution>) -> String {
    let Some(a) = a else {
        return "-".to_owned();
    };
    if let Some(job) = &a.job {
        return match &job.user {
            Some(user) => format!("job {} ({user})", job.id),
            None => format!("job {}", job.id),
        };
    }
    match &a.pod {
        Some(PodIdentity {
            name: Some(name),
            namespace,
            container,
            ..
        }) => {
            let mut s = match namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.clone(),
            };
            if let Some(c) = container {
                s.push('/');
                s.push_str(c);
            }
            s
        }
        Some(pod) if !pod.sharing.is_empty() => {
            format!("pod? {} share the GPU", pod.sharing.len())
        }
        Some(pod) => match &pod.uid {
            Some(uid) => format!("pod {}", &uid[..uid.len().min(8)]),
            None => "pod".to_owned(),
        },
        None => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_model::attribution::{FoundIn, PodName, SlurmJob};

    #[test]
    fn owner_names_the_job_else_the_pod_else_why_not() {
        assert_eq!(owner(None), "-");
        let job = Attribution {
            job: Some(SlurmJob {
                id: "4242".into(),
                step: Some("0".into()),
                user: Some("bob".into()),
                found_in: FoundIn::Cgroup,
            }),
            ..Attribution::default()
        };
        assert_eq!(owner(Some(&job)), "job 4242 (bob)");
        let pod = Attribution {
            pod: Some(PodIdentity {
                name: Some("train-0".into()),
                namespace: Some("ml".into()),
                container: Some("trainer".into()),
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        };
        assert_eq!(owner(Some(&pod)), "ml/train-0/trainer");
        let shared = Attribution {
            pod: Some(PodIdentity {
                uid: Some("0f8fad5b-d9cb-469f-a165-70867728950e".into()),
                sharing: vec![
                    PodName {
                        namespace: "ml".into(),
                        name: "a".into(),
                    },
                    PodName {
                        namespace: "ml".into(),
                        name: "b".into(),
                    },
                ],
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        };
        assert_eq!(owner(Some(&shared)), "pod? 2 share the GPU");
        let unnamed = Attribution {
            pod: Some(PodIdentity {
                uid: Some("0f8fad5b-d9cb-469f-a165-70867728950e".into()),
                ..PodIdentity::default()
            }),
            ..Attribution::default()
        };
        assert_eq!(owner(Some(&unnamed)), "pod 0f8fad5b");
        assert_eq!(owner(Some(&Attribution::default())), "-");
    }
}
