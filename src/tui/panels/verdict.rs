//! The bottleneck verdict on the selected GPU, as the header's one line and the Detail panel's
//! block above the charts. Read from the rule engine on every draw: it re-judges the rolling
//! window as ticks arrive, so the verdict follows the data without a refresh of its own.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::tui::app::App;
use crate::tui::format;
use gpudiag_core::rules::bottleneck;
use gpudiag_model::sample::DeviceInfo;
use gpudiag_model::verdict::{Basis, Verdict};

/// What the engine holds for one GPU.
pub enum State<'a> {
    Judged(&'a Verdict),
    /// The engine looked and could not judge; the reason says what is missing.
    NotJudged(&'a str),
    /// No evaluation has covered this GPU yet (before the first tick).
    Waiting,
}

pub fn state(app: &App, device: u32) -> State<'_> {
    let engine = &app.session.pipeline.engine;
    if let Some(v) = engine.verdicts().get(&device) {
        return State::Judged(v);
    }
    engine
        .not_judged()
        .iter()
        .find(|n| n.rule == "verdict" && n.device == Some(device))
        .map_or(State::Waiting, |n| State::NotJudged(&n.reason))
}

/// The verdict's own colour: a wasted GPU stands out, good use reads as fine.
fn style(app: &App, v: &Verdict) -> Style {
    app.theme.verdict(v.bottleneck.is_waste())
}

/// The title without its leading "GPU 0 ": the panel already names the GPU.
fn title(v: &Verdict) -> &str {
    let prefix = format!("GPU {} ", v.device);
    v.title.strip_prefix(&prefix).unwrap_or(&v.title)
}

/// The title from its window on ("over 30 s (utilisation 37%, …) · python3 (pid 7)"): the
/// header already names the bottleneck, which the title's first words only restate.
fn short_title(v: &Verdict) -> &str {
    v.title
        .find(" over ")
        .map_or(title(v), |i| &v.title[i + 1..])
}

fn why_not(state: &State<'_>) -> String {
    match state {
        State::NotJudged(reason) => format!("not judged yet — {}", without_flags(reason)),
        _ => "not judged yet — waiting for data".to_owned(),
    }
}

/// The reason without a closing note that names a command-line flag ("(… use --window)"): the
/// engine words its reasons for `check`, and the TUI has no flag to pass.
pub(crate) fn without_flags(reason: &str) -> &str {
    match reason.find(" (") {
        Some(i) if reason.ends_with(')') && reason[i..].contains("--") => &reason[..i],
        _ => reason,
    }
}

/// The confidence and basis in parentheses: "(low, utilisation only)".
fn strength(v: &Verdict) -> String {
    let basis = match v.basis {
        Basis::ProfilingCounters => "",
        Basis::Utilisation => ", utilisation only",
        Basis::Kernels => ", from the kernels recorded",
    };
    format!("({}{basis})", v.confidence)
}

/// The header's line: "verdict GPU 0: launch_bound (low, utilisation only) — over 30 s: …",
/// fitted to `width`. Where the window holds more than one phase it leads with the one it
/// ends in, and gives the window's blend after it: "verdict GPU 0: now underfilled, 11 s
/// (high) — utilisation 100%, SM active 0.9% · over 30 s: launch_bound (utilisation 36%, …)".
pub fn header_line(app: &App, d: &DeviceInfo, width: usize) -> Line<'static> {
    let t = app.theme;
    let head = format!("verdict GPU {}: ", d.index);
    let line = match state(app, d.index) {
        State::Judged(v) => match app.session.pipeline.engine.current_phase(d.index) {
            Some(now) => Line::from(vec![
                Span::styled(
                    format!("{head}now {}", now.verdict.bottleneck),
                    style(app, &now.verdict),
                ),
                Span::raw(format!(
                    ", {:.0} s {} — {} · over {:.0} s: {} ({})",
                    now.duration_s(),
                    strength(&now.verdict),
                    format::text(&bottleneck::brief(&now.verdict)),
                    v.window_s(),
                    v.bottleneck,
                    format::text(&bottleneck::brief(v)),
                )),
            ]),
            None => Line::from(vec![
                Span::styled(format!("{head}{}", v.bottleneck), style(app, v)),
                Span::raw(format!(
                    " {} — {}",
                    strength(v),
                    format::text(short_title(v))
                )),
            ]),
        },
        other => Line::from(Span::styled(
            format::text(&format!("{head}{}", why_not(&other))),
            t.dim(),
        )),
    };
    format::fit_line(line, width)
}

/// The Detail panel's block: the verdict's whole title (the current phase's, where the window
/// holds several), then what to do, in at most
/// `max_lines` lines of `width` (the title gets up to half of them, at least one). The header
/// right above already names the bottleneck and the confidence. Text that does not fit ends in
/// "…"; `check` carries it whole.
pub fn detail_lines(
    app: &App,
    d: &DeviceInfo,
    width: usize,
    max_lines: usize,
) -> Vec<Line<'static>> {
    if max_lines == 0 || width == 0 {
        return Vec::new();
    }
    let t = app.theme;
    let v = match state(app, d.index) {
        State::Judged(v) => v,
        other => {
            return vec![Line::from(Span::styled(
                format::fit(&format!("verdict: {}", why_not(&other)), width),
                t.dim(),
            ))];
        }
    };
    // Where the window holds several phases, the block speaks of the one it ends in, as the
    // header leads with it: its advice is what applies now.
    let (v, head) = match app.session.pipeline.engine.current_phase(d.index) {
        Some(now) => (
            &now.verdict,
            format!("now, {:.0} s: {}", now.duration_s(), title(&now.verdict)),
        ),
        None => (v, title(v).to_owned()),
    };
    let head = capped(
        format::wrap(&format::text(&head), width, ""),
        (max_lines / 2).max(1),
        width,
    );
    let room = max_lines.saturating_sub(head.len());
    let advice = format!("what to do: {}", format::text(&v.advice));
    let advice = capped(format::wrap(&advice, width, "  "), room, width);
    let style = style(app, v);
    head.into_iter()
        .map(|l| Line::from(Span::styled(l, style)))
        .chain(advice.into_iter().map(Line::from))
        .collect()
}

/// At most `max` of `lines`; when some are dropped, the last one kept ends in "…".
pub(crate) fn capped(mut lines: Vec<String>, max: usize, width: usize) -> Vec<String> {
    if lines.len() <= max {
        return lines;
    }
    lines.truncate(max);
    if let Some(last) = lines.last_mut() {
        *last = format::fit(&format!("{last} …"), width);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lose_only_notes_about_flags() {
        assert_eq!(
            without_flags(
                "1.0 s of data; a verdict needs at least 3 s (a single read: use --window)"
            ),
            "1.0 s of data; a verdict needs at least 3 s"
        );
        let kept = "no utilisation reading in the window (the GPU does not report it)";
        assert_eq!(without_flags(kept), kept);
    }

    #[test]
    fn a_cut_line_says_so() {
        let lines: Vec<String> = ["one two", "three four", "five"].map(String::from).into();
        assert_eq!(capped(lines.clone(), 3, 10), lines);
        assert_eq!(capped(lines.clone(), 2, 20), ["one two", "three four …"]);
        assert_eq!(capped(lines, 2, 10), ["one two", "three fou…"]);
    }
}
