//! This host's kernel-log XIDs and CUDA libraries, read on a thread while the telemetry source
//! opens: neither touches a GPU, and NVML's initialisation is most of a single read's time and
//! of the terminal UI's time to its first frame.

use gpudiag_model::cuda_libraries::{self, LibraryInfo};
use gpudiag_telemetry::kernel_log;

/// This host's kernel-log XIDs and CUDA libraries, read on a thread of their own.
pub enum HostFacts {
    Reading(std::thread::JoinHandle<(XidRead, Vec<LibraryInfo>)>),
    /// No thread could be started: read on the caller's thread at `join`.
    Inline,
}

pub type XidRead = Result<kernel_log::XidLog, String>;

impl HostFacts {
    pub fn start() -> HostFacts {
        std::thread::Builder::new()
            .name("gpudiag-host-facts".into())
            .spawn(read_host_facts)
            .map_or(HostFacts::Inline, HostFacts::Reading)
    }

    pub fn join(self) -> (XidRead, Vec<LibraryInfo>) {
        match self {
            HostFacts::Reading(h) => h.join().unwrap_or_else(|_| {
                (
                    Err("reading the kernel log failed unexpectedly".into()),
                    cuda_libraries::detect_libraries(),
                )
            }),
            HostFacts::Inline => read_host_facts(),
        }
    }
}

fn read_host_facts() -> (XidRead, Vec<LibraryInfo>) {
    (read_kernel_xids(), cuda_libraries::detect_libraries())
}

/// The XIDs this host's kernel logged, or why the log could not be read.
pub fn read_kernel_xids() -> XidRead {
    kernel_log::read_xids(&kernel_log::KernelLogSource::from_env(), "/proc".as_ref())
}
