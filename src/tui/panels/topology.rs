//! Topology: how the GPUs connect (the `nvidia-smi topo -m` matrix with NUMA and CPU affinity),
//! NVLink state and error counts, and pairs whose peer access is off.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};

use crate::tui::app::App;

pub fn render(f: &mut Frame, area: Rect, app: &App) {
    let t = app.theme;
    let block = Block::bordered().title(Span::styled(" Topology ", t.title()));
    let mut lines: Vec<Line> = Vec::new();
    match &app.topology {
        None => lines.push(Line::from(Span::styled(
            "This source does not say how its GPUs connect (a recording made before topology \
             was recorded, or a backend without it).",
            t.dim(),
        ))),
        Some(topo) => {
            for l in gpudiag_model::topology::render(topo).lines() {
                let style = if l.contains("not available") || l.contains("BROKEN") {
                    t.warn()
                } else {
                    ratatui::style::Style::default()
                };
                lines.push(Line::from(Span::styled(l.to_owned(), style)));
            }
            if topo.gpus.len() > 1 {
                lines.push(Line::from(""));
                lines.push(Line::from(Span::styled(
                    "NV# = # NVLinks shared · PIX one PCIe switch · PXB several switches · PHB \
                     host bridge · NODE across host bridges in a NUMA node · SYS across NUMA \
                     nodes. Peer bandwidth: Probes panel (p2p).",
                    t.dim(),
                )));
            }
        }
    }
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block),
        area,
    );
}
