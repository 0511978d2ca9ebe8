//! Colours and emphasis. With `NO_COLOR` set (https://no-color.org) every style keeps only its
//! modifiers (bold, reverse), so severity and selection stay visible on a monochrome terminal.

use ratatui::style::{Color, Modifier, Style};

use gpudiag_model::finding::Severity;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` is set to a non-empty value, as the convention says.
    pub fn from_env() -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Theme { color: !no_color }
    }

    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }

    pub fn title(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn dim(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }

    pub fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }

    pub fn severity(&self, s: Severity) -> Style {
        match s {
            Severity::Info => self.fg(Color::Blue),
            Severity::Warn => self.fg(Color::Yellow).add_modifier(Modifier::BOLD),
            Severity::Fail => self.fg(Color::Red).add_modifier(Modifier::BOLD),
        }
    }

    /// A bar or value coloured by how close it is to its limit.
    pub fn level(&self, frac: Option<f64>) -> Style {
        match frac {
            Some(f) if f >= 0.9 => self.fg(Color::Red),
            Some(f) if f >= 0.7 => self.fg(Color::Yellow),
            Some(_) => self.fg(Color::Green),
            None => self.dim(),
        }
    }

    pub fn mode(&self, paused: bool) -> Style {
        let s = if paused {
            self.fg(Color::Yellow)
        } else {
            self.fg(Color::Green)
        };
        s.add_modifier(Modifier::BOLD)
    }

    /// A bottleneck verdict: one that wastes the GPU as a warning, good use in green.
    pub fn verdict(&self, waste: bool) -> Style {
        if waste {
            self.warn()
        } else {
            self.fg(Color::Green)
        }
    }

    pub fn warn(&self) -> Style {
        self.severity(Severity::Warn)
    }

    pub fn series(&self, n: usize) -> Style {
        const COLORS: [Color; 2] = [Color::Cyan, Color::Magenta];
        self.fg(COLORS[n % COLORS.len()])
    }
}
