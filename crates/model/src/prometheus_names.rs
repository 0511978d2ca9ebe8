//! The Prometheus vocabulary: every series and label name gpudiag writes (`gpudiag serve`'s
//! exposition) and reads back (`gpudiag fleet`), spelt once so the writer and the reader cannot
//! drift apart. The metric table names its series through these constants too.
//!
//! dcgm-exporter's names (`DCGM_FI_*`) are kept exactly, so dashboards and rules built for it
//! work on gpudiag and the fleet view reads a node running either. The shipped recording and
//! alerting rules (`assets/prometheus/`) are part of the vocabulary the fleet reads: their
//! names are here as well.

/// Series names. Each constant is the name itself, upper-cased, so a grep for either finds both.
pub mod series {
    /// Prometheus's own: 1 while a scrape target answers.
    pub const UP: &str = "up";

    // dcgm-exporter's fields.
    pub const DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: &str = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS";
    pub const DCGM_FI_DEV_DEC_UTIL: &str = "DCGM_FI_DEV_DEC_UTIL";
    pub const DCGM_FI_DEV_ECC_DBE_AGG_TOTAL: &str = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL";
    pub const DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: &str = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL";
    pub const DCGM_FI_DEV_ECC_SBE_AGG_TOTAL: &str = "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL";
    pub const DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: &str = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL";
    pub const DCGM_FI_DEV_ENC_UTIL: &str = "DCGM_FI_DEV_ENC_UTIL";
    pub const DCGM_FI_DEV_FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
    pub const DCGM_FI_DEV_FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";
    pub const DCGM_FI_DEV_FB_USED: &str = "DCGM_FI_DEV_FB_USED";
    pub const DCGM_FI_DEV_GPU_TEMP: &str = "DCGM_FI_DEV_GPU_TEMP";
    pub const DCGM_FI_DEV_GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
    pub const DCGM_FI_DEV_MEMORY_TEMP: &str = "DCGM_FI_DEV_MEMORY_TEMP";
    pub const DCGM_FI_DEV_MEM_CLOCK: &str = "DCGM_FI_DEV_MEM_CLOCK";
    pub const DCGM_FI_DEV_MEM_COPY_UTIL: &str = "DCGM_FI_DEV_MEM_COPY_UTIL";
    pub const DCGM_FI_DEV_PCIE_REPLAY_COUNTER: &str = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER";
    pub const DCGM_FI_DEV_POWER_USAGE: &str = "DCGM_FI_DEV_POWER_USAGE";
    pub const DCGM_FI_DEV_RETIRED_DBE: &str = "DCGM_FI_DEV_RETIRED_DBE";
    pub const DCGM_FI_DEV_RETIRED_SBE: &str = "DCGM_FI_DEV_RETIRED_SBE";
    pub const DCGM_FI_DEV_ROW_REMAP_FAILURE: &str = "DCGM_FI_DEV_ROW_REMAP_FAILURE";
    pub const DCGM_FI_DEV_SM_CLOCK: &str = "DCGM_FI_DEV_SM_CLOCK";
    pub const DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: &str = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION";
    pub const DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS: &str =
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS";
    pub const DCGM_FI_DEV_XID_ERRORS: &str = "DCGM_FI_DEV_XID_ERRORS";
    pub const DCGM_FI_PROF_DRAM_ACTIVE: &str = "DCGM_FI_PROF_DRAM_ACTIVE";
    pub const DCGM_FI_PROF_GR_ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
    pub const DCGM_FI_PROF_NVLINK_RX_BYTES: &str = "DCGM_FI_PROF_NVLINK_RX_BYTES";
    pub const DCGM_FI_PROF_NVLINK_TX_BYTES: &str = "DCGM_FI_PROF_NVLINK_TX_BYTES";
    pub const DCGM_FI_PROF_PCIE_RX_BYTES: &str = "DCGM_FI_PROF_PCIE_RX_BYTES";
    pub const DCGM_FI_PROF_PCIE_TX_BYTES: &str = "DCGM_FI_PROF_PCIE_TX_BYTES";
    pub const DCGM_FI_PROF_PIPE_FP16_ACTIVE: &str = "DCGM_FI_PROF_PIPE_FP16_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_FP32_ACTIVE: &str = "DCGM_FI_PROF_PIPE_FP32_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_FP64_ACTIVE: &str = "DCGM_FI_PROF_PIPE_FP64_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_INT_ACTIVE: &str = "DCGM_FI_PROF_PIPE_INT_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: &str = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE: &str = "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE: &str = "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE";
    pub const DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE: &str = "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE";
    pub const DCGM_FI_PROF_SM_ACTIVE: &str = "DCGM_FI_PROF_SM_ACTIVE";
    pub const DCGM_FI_PROF_SM_OCCUPANCY: &str = "DCGM_FI_PROF_SM_OCCUPANCY";

    // gpudiag's own.
    pub const GPUDIAG_FAN_SPEED_PERCENT: &str = "gpudiag_fan_speed_percent";
    pub const GPUDIAG_FINDING: &str = "gpudiag_finding";
    pub const GPUDIAG_FINDINGS: &str = "gpudiag_findings";
    pub const GPUDIAG_GPU_JOB_INFO: &str = "gpudiag_gpu_job_info";
    pub const GPUDIAG_JOB_GPU_ROLE: &str = "gpudiag_job_gpu_role";
    pub const GPUDIAG_JOB_MISSING_RANK_INFO: &str = "gpudiag_job_missing_rank_info";
    pub const GPUDIAG_GPU_PROCESSES: &str = "gpudiag_gpu_processes";
    pub const GPUDIAG_GPUS_SHARED_BY_JOBS: &str = "gpudiag_gpus_shared_by_jobs";
    pub const GPUDIAG_INFO: &str = "gpudiag_info";
    pub const GPUDIAG_JOB_PEERS_WAIT_RATIO: &str = "gpudiag_job_peers_wait_ratio";
    pub const GPUDIAG_JOB_STUCK_SECONDS: &str = "gpudiag_job_stuck_seconds";
    pub const GPUDIAG_JOB_VERDICT: &str = "gpudiag_job_verdict";
    pub const GPUDIAG_PCIE_LINK_GENERATION: &str = "gpudiag_pcie_link_generation";
    pub const GPUDIAG_PCIE_LINK_GENERATION_MAX: &str = "gpudiag_pcie_link_generation_max";
    pub const GPUDIAG_PCIE_LINK_WIDTH: &str = "gpudiag_pcie_link_width";
    pub const GPUDIAG_PCIE_LINK_WIDTH_MAX: &str = "gpudiag_pcie_link_width_max";
    pub const GPUDIAG_PCIE_RX_BYTES_PER_SECOND: &str = "gpudiag_pcie_rx_bytes_per_second";
    pub const GPUDIAG_PCIE_TX_BYTES_PER_SECOND: &str = "gpudiag_pcie_tx_bytes_per_second";
    pub const GPUDIAG_PERFORMANCE_STATE: &str = "gpudiag_performance_state";
    pub const GPUDIAG_POWER_LIMIT_WATTS: &str = "gpudiag_power_limit_watts";
    pub const GPUDIAG_PROCESS_MEMORY_USED_BYTES: &str = "gpudiag_process_memory_used_bytes";
    pub const GPUDIAG_PROCESS_SERIES_DROPPED: &str = "gpudiag_process_series_dropped";
    pub const GPUDIAG_PROCESS_SM_UTIL_PERCENT: &str = "gpudiag_process_sm_util_percent";
    pub const GPUDIAG_PROCESS_VERDICT: &str = "gpudiag_process_verdict";
    pub const GPUDIAG_SAMPLE_AGE_SECONDS: &str = "gpudiag_sample_age_seconds";
    pub const GPUDIAG_SOURCE_ENDED: &str = "gpudiag_source_ended";
    pub const GPUDIAG_TEMPERATURE_SLOWDOWN_CELSIUS: &str = "gpudiag_temperature_slowdown_celsius";
    pub const GPUDIAG_THROTTLE_REASON: &str = "gpudiag_throttle_reason";
    pub const GPUDIAG_THROTTLE_SECONDS_TOTAL: &str = "gpudiag_throttle_seconds_total";
    pub const GPUDIAG_VERDICT: &str = "gpudiag_verdict";
    pub const GPUDIAG_VERDICT_JUDGED: &str = "gpudiag_verdict_judged";
}

/// Label names. dcgm-exporter's device labels (`gpu`, `UUID`, `pci_bus_id`, `modelName`,
/// `Hostname`) and Kubernetes' pod labels keep their spelling; the rest are gpudiag's.
pub mod label {
    /// Prometheus's own: the series name, the scrape target and the scrape job.
    pub const NAME: &str = "__name__";
    pub const INSTANCE: &str = "instance";
    pub const SCRAPE_JOB: &str = "job";

    pub const GPU: &str = "gpu";
    pub const UUID: &str = "UUID";
    pub const PCI_BUS_ID: &str = "pci_bus_id";
    pub const MODEL_NAME: &str = "modelName";
    pub const HOSTNAME: &str = "Hostname";

    pub const POD: &str = "pod";
    pub const NAMESPACE: &str = "namespace";
    pub const CONTAINER: &str = "container";

    pub const VERDICT: &str = "verdict";
    pub const CONFIDENCE: &str = "confidence";
    pub const BASIS: &str = "basis";
    pub const ID: &str = "id";
    pub const SEVERITY: &str = "severity";
    pub const REASON: &str = "reason";

    pub const JOB_KEY: &str = "job_key";
    pub const JOINED_BY: &str = "joined_by";
    pub const SLURM_JOB: &str = "slurm_job";
    pub const RANK: &str = "rank";
    /// A GPU's part in its job's verdict (`straggler`, `waiting`, `missing`):
    /// `gpudiag_job_gpu_role`.
    pub const ROLE: &str = "role";
    /// A missing rank's process state (`sleeping`, `stopped`, ...) or `exited`:
    /// `gpudiag_job_missing_rank_info`.
    pub const STATE: &str = "state";
    /// The one straggler an older gpudiag put on `gpudiag_job_verdict`, before
    /// `gpudiag_job_gpu_role`: no longer written, read by `fleet` only from such nodes.
    pub const LEGACY_STRAGGLER_GPU: &str = "straggler_gpu";
    pub const LEGACY_STRAGGLER_UUID: &str = "straggler_UUID";

    pub const PID: &str = "pid";
    pub const PROCESS: &str = "process";
    pub const USER: &str = "user";

    pub const VERSION: &str = "version";
    pub const REVISION: &str = "revision";
    pub const DRIVER_VERSION: &str = "driver_version";

    /// Alerts' own labels and annotations, as the shipped rules set them.
    pub const ALERT_NAME: &str = "alertname";
    pub const PACE: &str = "pace";
    /// `GpuJobHung`'s: `node` when one node's gpudiag judged the job stalled, `across_nodes`
    /// when the rules saw it on every node's GPUs.
    pub const SCOPE: &str = "scope";
    pub const SUMMARY: &str = "summary";
}

/// What the shipped rules (`assets/prometheus/`) record and raise, as the fleet reads it.
pub mod rules {
    /// Present when the shipped rules are loaded.
    pub const JOB_GPUS_COUNT: &str = "gpudiag_job:gpus:count";
    pub const JOB_GPU_SM_ACTIVE_AVG: &str = "gpudiag_job_gpu:sm_active:avg";
    pub const JOB_GPU_GPU_UTIL_PERCENT_AVG: &str = "gpudiag_job_gpu:gpu_util_percent:avg";
    pub const JOB_SM_ACTIVE_MEDIAN: &str = "gpudiag_job:sm_active:median";
    pub const JOB_SM_ACTIVE_SPREAD: &str = "gpudiag_job:sm_active:spread";

    pub const ALERT_JOB_HUNG: &str = "GpuJobHung";
    pub const ALERT_JOB_STRAGGLER: &str = "GpuJobStraggler";
    pub const ALERT_JOB_COMMUNICATION_BOUND: &str = "GpuJobCommunicationBound";
    pub const ALERT_XID_ERROR: &str = "GpuXidError";
    pub const ALERT_GPU_LOST: &str = "GpuLost";
    pub const ALERT_HARMFUL_THROTTLING: &str = "GpuHarmfulThrottling";
    pub const ALERT_PCIE_LINK_DOWNTRAINED: &str = "GpuPcieLinkDowntrained";
    pub const ALERT_UNCORRECTABLE_MEMORY_ERROR: &str = "GpuUncorrectableMemoryError";

    /// `GpuJobHung`'s `scope` label: one node's gpudiag judged the job stalled, or the rules
    /// saw it across the job's nodes.
    pub const SCOPE_NODE: &str = "node";
    pub const SCOPE_ACROSS_NODES: &str = "across_nodes";

    /// Every alert the shipped rules raise.
    pub const ALERTS: [&str; 8] = [
        ALERT_JOB_HUNG,
        ALERT_JOB_STRAGGLER,
        ALERT_JOB_COMMUNICATION_BOUND,
        ALERT_XID_ERROR,
        ALERT_GPU_LOST,
        ALERT_HARMFUL_THROTTLING,
        ALERT_PCIE_LINK_DOWNTRAINED,
        ALERT_UNCORRECTABLE_MEMORY_ERROR,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped rules file is the other spelling of `rules`: a renamed rule or alert there
    /// must fail here, not leave the fleet view silently empty.
    #[test]
    fn the_shipped_rules_define_every_name_read_back() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/prometheus");
        let mut text = String::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yml" || e == "yaml") {
                text += &std::fs::read_to_string(path).unwrap();
            }
        }
        let recorded = [
            rules::JOB_GPUS_COUNT,
            rules::JOB_GPU_SM_ACTIVE_AVG,
            rules::JOB_GPU_GPU_UTIL_PERCENT_AVG,
            rules::JOB_SM_ACTIVE_MEDIAN,
            rules::JOB_SM_ACTIVE_SPREAD,
        ];
        for name in recorded {
            assert!(text.contains(&format!("record: {name}")), "{name}");
        }
        for name in rules::ALERTS {
            assert!(text.contains(&format!("alert: {name}")), "{name}");
        }
        for scope in [rules::SCOPE_NODE, rules::SCOPE_ACROSS_NODES] {
            assert!(text.contains(&format!("scope: {scope}\n")), "{scope}");
        }
    }
}
