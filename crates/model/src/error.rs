//! The error every command ends with, and how each kind maps to the documented exit codes.

/// Exit codes, as documented in `--help` and the README.
pub mod exit {
    /// Healthy, or findings below `--fail-on` only.
    pub const OK: i32 = 0;
    /// A finding at or above `--fail-on`.
    pub const FINDINGS: i32 = 1;
    /// Bad flags or an input file that cannot be read or understood.
    pub const USAGE: i32 = 2;
    /// Could not run: no driver, no library, no GPU (or none matching `--device`), or a vendor
    /// call that hung.
    pub const CANNOT_RUN: i32 = 3;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    CannotRun(String),
    /// `--device` selectors that match no GPU of the source: what was asked cannot be checked
    /// (exit 3, as for no GPU at all). The selectors are kept apart from the message so that
    /// `check --json` can list them for a script to act on (a Slurm prolog tells a GPU the
    /// driver lists but NVML lost from a name nobody knows).
    #[error("{message}")]
    NoSuchDevice {
        selectors: Vec<String>,
        message: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Io { .. } => exit::USAGE,
            Error::CannotRun(_) | Error::NoSuchDevice { .. } => exit::CANNOT_RUN,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
