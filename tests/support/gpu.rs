//! What the GPU-host tests share: the binary under test (`GPUDIAG_BIN` from the bundle, else
//! cargo's) with the test-only variables cleared, and the number of GPUs nvidia-smi lists.
// Each test binary that includes this uses a different part of it.
#![allow(dead_code)]

use std::process::Command;

/// The binary's path: the bundle's on a GPU host, where cargo's path does not exist.
pub fn gpudiag_bin() -> String {
    std::env::var("GPUDIAG_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpudiag").into())
}

pub fn gpudiag() -> Command {
    let mut c = Command::new(gpudiag_bin());
    c.env_remove("GPUDIAG_TEST_FAULT")
        .env_remove("GPUDIAG_TEST_FAULTS")
        .env_remove("GPUDIAG_DRIVER_ONLY");
    c
}

pub fn gpu_count() -> usize {
    let out = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .expect("nvidia-smi runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .count()
}
