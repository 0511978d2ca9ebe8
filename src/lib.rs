//! gpudiag's top layer: the command line, one module per subcommand, the terminal UI, the text
//! report, and the adapters that drive the pipeline into the writers of `gpudiag-export`
//! (Chrome trace, Prometheus, bug-report bundles) and serve `/metrics`. Everything below it
//! lives in the workspace's crates (`crates/`): model ← telemetry, probes ← core ← export ←
//! this binary.
//!
//! The layers below core are re-exported under their old names so integration tests and
//! benches can reach them through one crate; the writers are used from `gpudiag_export` itself.

pub mod cli;
pub mod commands;
pub mod export;
pub mod format;
pub mod report;
pub mod schema;
pub mod tick_stats;
pub mod tui;

pub use gpudiag_core::{check, config, history, judgement, rules, session};
pub use gpudiag_model::{build_info, cuda_libraries, deadline, error, printable, topology};
pub use gpudiag_probes as probes;
pub use gpudiag_telemetry as telemetry;
