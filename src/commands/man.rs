//! `gpudiag man`: the man page, generated from the clap definition itself, so it cannot fall
//! behind a new flag or subcommand.

use clap::CommandFactory;

use gpudiag_model::error::{Error, exit};

use crate::cli::Cli;

/// `gpudiag man`: prints the page.
pub fn man() -> Result<i32, Error> {
    super::print(&man_page()?)?;
    Ok(exit::OK)
}

/// The roff page: name, synopsis, the global options, each subcommand with its summary, the
/// exit codes and the version with its commit. One page, the one `man gpudiag` finds; each
/// subcommand's flags are in `gpudiag SUBCOMMAND --help`.
pub fn man_page() -> Result<String, Error> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .map_err(|e| Error::io("rendering the man page", e))?;
    // roff built from the command definition, which is UTF-8.
    Ok(String::from_utf8_lossy(&out).into_owned())
}
