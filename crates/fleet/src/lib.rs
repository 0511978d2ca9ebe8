//! The fleet view: many nodes' GPUs read back from Prometheus, where every node's `gpudiag
//! serve` (or dcgm-exporter) is scraped. Prometheus is the fleet's store and engine; this crate
//! asks it a fixed set of queries, merges what comes back into one [`model::Fleet`] (nodes by
//! their host name, GPUs by UUID, jobs by gpudiag's job key), and never aggregates on its own
//! beyond that. No terminal code lives here: `gpudiag fleet --json` and the terminal UI both
//! draw what [`read::read_fleet`] returns.

pub mod client;
pub mod model;
pub mod read;
pub mod selector;
