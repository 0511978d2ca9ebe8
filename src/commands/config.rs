//! `gpudiag config`: the configuration in effect, or with `--default` the default file.

use gpudiag_core::config::{Config, DEFAULT_CONFIG_TOML};
use gpudiag_model::error::{Error, exit};

use crate::cli::ConfigArgs;

/// `gpudiag config`. `load` reads the configuration file the command line names; `--default`
/// never calls it, so a broken file does not stop it from printing the default.
pub fn config(
    args: &ConfigArgs,
    load: impl FnOnce() -> Result<Config, Error>,
) -> Result<i32, Error> {
    let text = if args.default {
        DEFAULT_CONFIG_TOML.to_owned()
    } else {
        toml::to_string_pretty(&load()?)
            .map_err(|e| Error::CannotRun(format!("could not print the config: {e}")))?
    };
    super::print(&text)?;
    Ok(exit::OK)
}
