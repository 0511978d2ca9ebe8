//! The terminal guard: raw mode, the alternate screen and mouse capture on, and everything put
//! back on drop, on panic (before the previous hook prints, so the message lands on a sane
//! screen) and, through the event loop, on SIGTERM. Restoring twice is harmless.

use std::io::{BufWriter, Stdout, Write, stdout};
use std::sync::atomic::{AtomicBool, Ordering};

use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use crossterm::terminal::{
    Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use gpudiag_model::stats::{self, Counter};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

/// Whether the terminal is in the UI's state, so a panic restores only what was changed.
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub struct TerminalGuard {
    pub terminal: Terminal<CrosstermBackend<BufWriter<CountedStdout>>>,
}

/// One frame's worth of escapes, written in one go: stdout's own buffer is 1 KiB, which made a
/// full redraw of a large terminal a few dozen write calls.
const FRAME_BUFFER: usize = 64 << 10;

/// Stdout, counting the bytes written to it under `GPUDIAG_TICK_STATS`.
pub struct CountedStdout(Stdout);

impl Write for CountedStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(buf)?;
        stats::add(Counter::TerminalBytes, n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl TerminalGuard {
    pub fn enter() -> std::io::Result<Self> {
        install_panic_hook();
        enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        let mut out = stdout();
        // Clear through crossterm rather than `Terminal::clear`, which asks the terminal for the
        // cursor position and waits up to 2 s for an answer some terminals never send.
        if let Err(e) = execute!(
            out,
            EnterAlternateScreen,
            EnableMouseCapture,
            Clear(ClearType::All)
        ) {
            restore();
            return Err(e);
        }
        let out = BufWriter::with_capacity(FRAME_BUFFER, CountedStdout(out));
        let terminal = match Terminal::new(CrosstermBackend::new(out)) {
            Ok(t) => t,
            Err(e) => {
                restore();
                return Err(e);
            }
        };
        let mut guard = TerminalGuard { terminal };
        guard.terminal.hide_cursor()?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts the terminal back as it was; does nothing when it already is.
pub fn restore() {
    if !ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    let _ = disable_raw_mode();
    let _ = execute!(
        stdout(),
        DisableMouseCapture,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

fn install_panic_hook() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook restores the terminal and then runs the hook that was there before, so the
    /// panic message still prints (on a restored screen). nextest runs each test in its own
    /// process, so replacing the global hook here touches no other test.
    #[test]
    fn panic_hook_restores_then_chains_the_previous_hook() {
        static PREVIOUS_RAN: AtomicBool = AtomicBool::new(false);
        std::panic::set_hook(Box::new(|_| PREVIOUS_RAN.store(true, Ordering::SeqCst)));
        install_panic_hook();
        // As if the UI were up.
        ACTIVE.store(true, Ordering::SeqCst);
        let result = std::panic::catch_unwind(|| panic!("boom"));
        assert!(result.is_err());
        assert!(PREVIOUS_RAN.load(Ordering::SeqCst));
        assert!(
            !ACTIVE.load(Ordering::SeqCst),
            "the hook restored the terminal"
        );
        drop(std::panic::take_hook());
    }
}
