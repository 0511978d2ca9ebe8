//! `gpudiag completions SHELL`: generated from the clap definition itself, so it cannot fall
//! behind a new flag or subcommand.

use clap::CommandFactory;

use gpudiag_model::error::{Error, exit};

use crate::cli::Cli;

/// `gpudiag completions SHELL`: prints the script.
pub fn completions(shell: clap_complete::Shell) -> Result<i32, Error> {
    super::print(&script(shell))?;
    Ok(exit::OK)
}

/// The completion script for `shell`.
pub fn script(shell: clap_complete::Shell) -> String {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gpudiag", &mut out);
    // The script holds only what the command definition holds, which is UTF-8.
    String::from_utf8_lossy(&out).into_owned()
}
