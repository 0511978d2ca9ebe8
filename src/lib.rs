//! gpudiag's top layer: the command line (`cli`), one module per subcommand (`commands`: each
//! drives core's pipeline into a view, such as the writers of `gpudiag-export`, the `/metrics`
//! server or the check report's text, `check_text`), and the terminal UI (`tui`). Everything
//! below it lives in the workspace's crates (`crates/`): model ← telemetry, probes ← core ←
//! export ← this binary; fleet reads Prometheus.
//!
//! The binary, benches and fuzz targets import each type from the crate that defines it. The
//! re-exports below remain only for the integration tests that still reach the crates through
//! this one, until they import from the crates too.

pub mod check_text;
pub mod cli;
pub mod commands;
pub mod format;
pub mod schema;
pub mod stop;
pub mod tick_stats;
pub mod tui;

pub use gpudiag_core::{check, config, history, judgement, rules, session};
pub use gpudiag_model::{build_info, cuda_libraries, deadline, error, printable, topology};
pub use gpudiag_probes as probes;
pub use gpudiag_telemetry as telemetry;
