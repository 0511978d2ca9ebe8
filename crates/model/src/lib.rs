//! gpudiag's data model, shared by every layer above it: what a sample, a device, an event and a
//! finding are, the metric table that declares each telemetry field once, how throttle bits and
//! PCIe links decode, how GPUs connect, which CUDA libraries a host has, what probes ask of the
//! GPUs' state (`gpu_state`, implemented by telemetry), and the exit codes every command maps
//! its errors to. It knows no backend, rule or view (the table says how views show
//! a field, as data), so nothing here can reach up the data flow.
//!
//! It is not free of I/O: `cuda_libraries` reads the loader's directories and
//! `/proc/self/maps` to find the CUDA libraries, and `deadline` runs a call that may hang on a
//! worker thread of its own. Both are facts every layer asks for, and neither needs a backend.

pub mod attribution;
pub mod build_info;
pub mod cuda_libraries;
pub mod deadline;
pub mod decode;
pub mod error;
pub mod finding;
pub mod gpu_state;
pub mod job;
pub mod kernels;
pub mod metric_table;
pub mod printable;
pub mod prometheus_names;
pub mod ras;
pub mod sample;
pub mod schema;
pub mod stats;
pub mod topology;
pub mod units;
pub mod verdict;
