//! gpudiag's pipeline, between the telemetry sources and the views: the history that keeps
//! every series in bounded memory, the rules that judge it, and the check report they make.

pub mod check;
pub mod config;
pub mod history;
pub mod host_facts;
pub mod judgement;
pub mod kernels;
pub mod pipeline;
pub mod rules;
pub mod session;
