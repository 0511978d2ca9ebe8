//! One module per subcommand that is more than a call into a writer: `check`, `probe`,
//! `record`, `run`, `completions` and `man`; `trace`, `serve` and `report` are adapters in
//! `export` and `report` over the writers of `gpudiag-export`.

mod check;
mod completions;
pub mod fleet;
mod man;
mod probe;
mod record;
pub mod run;

use std::io::Write;

use gpudiag_model::error::Error;

pub use check::{check, check_request};
pub use completions::completions;
pub use man::man_page;
pub use probe::{probe, run_probes_in_child, run_probes_in_ui};
pub use record::record;
pub use run::run;

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
