//! gpudiag's top layer: the command line (`cli`), one module per subcommand (`commands`: each
//! drives core's pipeline into a view, such as the writers of `gpudiag-export`, the `/metrics`
//! server or the check report's text, `check_text`), and the terminal UI (`tui`). Everything
//! below it lives in the workspace's crates (`crates/`): model ← telemetry, probes ← core ←
//! export ← this binary; fleet reads Prometheus.
//!
//! Everything that uses a type (the binary, its tests, benches and fuzz targets) imports it from
//! the crate that defines it; this crate re-exports none of them.

pub mod check_text;
pub mod cli;
pub mod commands;
pub mod format;
pub mod kernels_text;
pub mod probe_run;
pub mod resident;
pub mod schema;
pub mod stop;
pub mod tick_stats;
pub mod tui;
