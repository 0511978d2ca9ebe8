//! One module per subcommand, each the whole of it: what it reads from the flags, what it asks
//! core for, and what it prints. `check`, `config`, `probe`, `record`, `trace`, `serve` (served by
//! `gpudiag-http`), `report` (the bug-report bundle), `replay`, `run`, `fleet`, `slurm` (what
//! the Slurm prolog and epilog read), `completions`, `man`, and `default_view` (`gpudiag` with
//! no subcommand). `main` only parses the command line and calls one of them.

pub mod check;
pub mod completions;
pub mod config;
pub mod default_view;
pub mod fleet;
pub mod man;
pub mod probe;
pub mod record;
pub mod replay;
pub mod report;
pub mod run;
pub mod serve;
pub mod slurm;
pub mod trace;

use std::io::{IsTerminal, Write};

use gpudiag_model::error::Error;

/// Writes human-readable `text` to stdout with every control character but the newlines made
/// visible: the renderers escape each value from a driver or a recording, and this catches any
/// one they missed before it reaches a terminal. JSON goes through `print`, escaped by itself.
pub fn print_text(text: &str) -> Result<(), Error> {
    print(&gpudiag_model::printable::text(text))
}

/// Writes `text` to stdout; a closed pipe (`gpudiag check | head`) is not an error.
pub fn print(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(|e| Error::io("writing to stdout", e)),
    }
}

/// The terminal UIs need a terminal on both ends; piped or redirected, gpudiag prints text so
/// scripts keep working.
fn interactive() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}
