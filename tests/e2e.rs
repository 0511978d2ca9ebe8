//! The end-to-end tests: the built `gpudiag` binary, its modules and the tools around it
//! (Prometheus, tmux, the deployment files), in one test binary with a module per area; each
//! crate in `crates/` tests itself. The tests that need a GPU are targets of their own
//! (`tests/gpu_*.rs`): `scripts/gpu-tests pack` builds and ships them by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod amd;
mod attribution;
mod cli;
mod deploy;
mod docs_agree;
mod evidence;
mod exports;
mod faults;
mod fleet;
mod fleet_access;
mod fleet_fixtures;
mod fleet_screens;
mod fuzz_regressions;
mod job_cases;
mod job_sensitivity;
mod jobs;
mod judgement;
mod kernel_log;
mod probes_report;
mod proc_visibility;
mod profiler_merge;
mod prometheus;
mod prometheus_rules;
mod readme;
mod release;
mod replay_inputs;
mod rules_cli;
mod run;
mod schema;
mod serve_load;
mod serve_tls;
mod signals;
mod stall_cases;
mod tui;
mod tui_screens;
mod tui_tmux;
mod verdicts;
