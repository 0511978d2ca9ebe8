//! gpudiag: GPU telemetry, probes and diagnostics. The binary is a thin shell over this library.

pub mod cli;
pub mod commands;
pub mod config;
pub mod deadline;
pub mod error;
pub mod export;
pub mod history;
pub mod probes;
pub mod report;
pub mod rules;
pub mod telemetry;
pub mod topology;
pub mod tui;
