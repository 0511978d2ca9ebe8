//! Thresholds and windows for the rules, from a TOML file.
//!
//! Precedence: `--config PATH` > `GPUDIAG_CONFIG` > `$XDG_CONFIG_HOME/gpudiag/config.toml` (or
//! `~/.config/gpudiag/config.toml`) > built-in defaults. A file only needs the keys it changes;
//! unknown keys are rejected (a misspelt threshold silently ignored is worse than an error), and
//! every error names the file and the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub rules: RulesConfig,
}

/// Every rule threshold, one table per family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RulesConfig {
    pub engine: EngineConfig,
    pub utilisation: UtilisationConfig,
    pub throttle: ThrottleConfig,
    pub pcie: PcieConfig,
    pub memory: MemoryConfig,
    pub thermal: ThermalConfig,
    pub power: PowerConfig,
    pub peers: PeersConfig,
    pub job: JobConfig,
}

/// How a job's GPUs are compared. The defaults come from measured runs: see `docs/jobs.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobConfig {
    /// Shortest window (s) a job is judged over: a training step can last seconds, and a
    /// shorter window may catch every GPU in a different part of it.
    pub min_window_s: f64,
    /// A GPU whose SM active (else power) is at least this multiple of its peers' median leads.
    pub lead_ratio: f64,
    /// A GPU whose utilisation is at least this many points below its peers' median, while
    /// they read busy, lags.
    pub lag_util_points: f64,
    /// Peers' median utilisation (%) at or above which they count as busy (spinning in a
    /// collective reads busy).
    pub peers_busy_util_pct: f64,
    /// The job's processes hold memory spread this much (largest / smallest) or more, and by
    /// at least `memory_spread_min_gib`: the GPUs are not replicas.
    pub memory_spread_ratio: f64,
    pub memory_spread_min_gib: f64,
    /// Every GPU moves at least this much over NVLink and PCIe (GB/s, rx + tx)...
    pub communication_min_gb_per_s: f64,
    /// ...while its tensor pipes are active below this (%): communication-bound.
    pub communication_max_tensor_pct: f64,
    /// A straggler's peers wait at least this share (0..1) of the time before their own
    /// verdicts say they wait for it.
    pub waiting_min_share: f64,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            min_window_s: 10.0,
            lead_ratio: 1.15,
            lag_util_points: 20.0,
            peers_busy_util_pct: 50.0,
            memory_spread_ratio: 1.25,
            memory_spread_min_gib: 1.0,
            communication_min_gb_per_s: 50.0,
            communication_max_tensor_pct: 10.0,
            waiting_min_share: 0.15,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PowerConfig {
    /// An enforced power limit below this share (0..1) of the GPU's default is flagged.
    pub min_share_of_default: f64,
}

impl Default for PowerConfig {
    fn default() -> Self {
        // Below 95%: a limit a few watts under the default (rounding, a firmware step) is noise.
        PowerConfig {
            min_share_of_default: 0.95,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeersConfig {
    /// A GPU (or a link) this share (0..1) below the median of its peers of the same model (or
    /// connection) is flagged.
    pub margin: f64,
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig { margin: 0.10 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Seconds between evaluations of the windowed rules during live sampling.
    pub eval_interval_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UtilisationConfig {
    pub window_s: f64,
    /// Less data than this (seconds) and the rule stays silent: idleness needs time to show.
    pub min_span_s: f64,
    pub min_mean_util_pct: f64,
    /// A process counts as holding the GPU from this much memory (MiB).
    pub min_process_memory_mib: f64,
    /// Below this mean utilisation (%) the GPU counts as doing nothing.
    pub idle_util_pct: f64,
    /// SM active over utilisation (0..1) below which the kernels that run leave most SMs
    /// empty (profiling counters only).
    pub min_sm_fill: f64,
    /// A pipe (tensor, FP) or DRAM at or above this share (%) counts as saturated.
    pub saturated_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThrottleConfig {
    pub window_s: f64,
    /// A sample is "under load" at or above this utilisation.
    pub load_util_pct: f64,
    /// Share of the window (0..1) a failure reason must hold under load to fire.
    pub min_fraction: f64,
    /// Share of the window (0..1) the SW power cap must hold to be reported.
    pub power_cap_min_fraction: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PcieConfig {
    pub window_s: f64,
    /// Share of the active samples (0..1) the link must be below its maximum to fire.
    pub min_fraction: f64,
    /// rx + tx at or above this many MB/s counts as moving data.
    pub moving_mb_per_s: f64,
    /// Bit error rate the replay budget is derived from.
    pub replay_ber: f64,
    /// Less counter history than this (seconds) and the replay rule stays silent.
    pub replay_min_span_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    pub nearly_full_pct: f64,
    pub nearly_full_window_s: f64,
    pub leak_window_s: f64,
    /// Less history than this (seconds) and a process is not judged, unless it grows fast and
    /// steadily (the `leak_fast_*` keys).
    pub leak_min_span_s: f64,
    /// History (seconds) enough for a process whose growth is large and steady.
    pub leak_fast_min_span_s: f64,
    /// Growth (MiB) that counts as large for `leak_fast_min_span_s`.
    pub leak_fast_min_growth_mib: f64,
    /// Separate increases that make such growth steady rather than a warm-up.
    pub leak_fast_min_steps: u32,
    /// Growth below this rate (MiB per minute) is not a leak worth a warning.
    pub leak_min_rate_mib_per_min: f64,
    /// Growth must also add up to at least this much over the window (MiB).
    pub leak_min_growth_mib: f64,
    /// Fit quality (R², 0..1) a steady growth must reach; a single jump fits a line badly.
    pub leak_min_r2: f64,
    /// Separate increases the series must show; one allocation is not a trend.
    pub leak_min_steps: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThermalConfig {
    pub window_s: f64,
    /// Warn within this many °C of the slowdown threshold.
    pub slowdown_margin_c: f64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            eval_interval_s: 1.0,
        }
    }
}

impl Default for UtilisationConfig {
    fn default() -> Self {
        UtilisationConfig {
            window_s: 30.0,
            min_span_s: 3.0,
            min_mean_util_pct: 50.0,
            min_process_memory_mib: 256.0,
            idle_util_pct: 5.0,
            min_sm_fill: 0.35,
            saturated_pct: 50.0,
        }
    }
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            window_s: 60.0,
            load_util_pct: 50.0,
            min_fraction: 0.05,
            power_cap_min_fraction: 0.5,
        }
    }
}

impl Default for PcieConfig {
    fn default() -> Self {
        PcieConfig {
            window_s: 60.0,
            min_fraction: 0.5,
            moving_mb_per_s: 256.0,
            replay_ber: 1e-12,
            replay_min_span_s: 30.0,
        }
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            nearly_full_pct: 95.0,
            nearly_full_window_s: 10.0,
            leak_window_s: 600.0,
            leak_min_span_s: 120.0,
            leak_fast_min_span_s: 20.0,
            leak_fast_min_growth_mib: 1024.0,
            leak_fast_min_steps: 8,
            leak_min_rate_mib_per_min: 16.0,
            leak_min_growth_mib: 128.0,
            leak_min_r2: 0.9,
            leak_min_steps: 4,
        }
    }
}

impl Default for ThermalConfig {
    fn default() -> Self {
        ThermalConfig {
            window_s: 10.0,
            slowdown_margin_c: 5.0,
        }
    }
}

/// The default file, with a comment per key. `tests` check that it parses back to the defaults.
pub const DEFAULT_CONFIG_TOML: &str = r#"# gpudiag configuration. Every key is optional: a file needs only what it changes.
# Location: --config PATH, else $GPUDIAG_CONFIG, else $XDG_CONFIG_HOME/gpudiag/config.toml
# (~/.config/gpudiag/config.toml). Unknown keys are an error.

[rules.engine]
# Seconds between evaluations of the windowed rules while sampling.
eval_interval_s = 1.0

[rules.utilisation]
# Window (s) over which GPU utilisation is averaged (only the time the process held memory).
window_s = 30.0
# Minimum data (s) before the rule may fire.
min_span_s = 3.0
# Fires when a process holds memory and mean utilisation is below this (%).
min_mean_util_pct = 50.0
# A process "holds" the GPU from this much memory (MiB).
min_process_memory_mib = 256.0
# Below this mean utilisation (%) the GPU counts as doing nothing (verdicts idle, idle_holding_memory).
idle_util_pct = 5.0
# SM active / utilisation (0..1) below which running kernels leave most SMs empty (needs profiling counters).
min_sm_fill = 0.35
# A tensor/FP pipe or DRAM at or above this (%) counts as saturated (compute_bound vs memory_bound).
saturated_pct = 50.0

[rules.throttle]
# Window (s) over which throttle reasons are judged.
window_s = 60.0
# A sample is under load at or above this utilisation (%).
load_util_pct = 50.0
# HW slowdown, SW/HW thermal, HW power brake: share of the window (0..1) under load to fire.
min_fraction = 0.05
# SW power cap: share of the window (0..1) to be reported (info).
power_cap_min_fraction = 0.5

[rules.pcie]
# Window (s) over which the link state is judged.
window_s = 60.0
# Share (0..1) of active samples with the link below its maximum to fire.
min_fraction = 0.5
# rx + tx at or above this (MB/s) counts as moving data.
moving_mb_per_s = 256.0
# Bit error rate the allowed replay rate is derived from (BER x lane rate x lanes).
replay_ber = 1e-12
# Minimum counter history (s) before the replay rule may fire.
replay_min_span_s = 30.0

[rules.memory]
# Fires when used memory exceeds this share of total (%)...
nearly_full_pct = 95.0
# ...averaged over this window (s).
nearly_full_window_s = 10.0
# Window (s) over which a process's memory growth is fitted.
leak_window_s = 600.0
# Minimum history (s) of a process before it can be called a leak...
leak_min_span_s = 120.0
# ...or this much (s) when its growth is large and steady and still going in the second half (a
# model warming up grows in a few steps and levels off):
leak_fast_min_span_s = 20.0
# growth of at least this much (MiB)...
leak_fast_min_growth_mib = 1024.0
# ...in at least this many separate increases.
leak_fast_min_steps = 8
# Minimum growth rate (MiB per minute).
leak_min_rate_mib_per_min = 16.0
# Minimum total growth over the window (MiB).
leak_min_growth_mib = 128.0
# Minimum fit quality (R squared, 0..1) of the linear growth; a single jump fits badly.
leak_min_r2 = 0.9
# Minimum number of separate increases; one allocation is not a trend.
leak_min_steps = 4

[rules.thermal]
# Window (s) over which the temperature is averaged.
window_s = 10.0
# Warns within this many degrees C of the slowdown threshold.
slowdown_margin_c = 5.0

[rules.power]
# Warns when the enforced power limit is below this share (0..1) of the GPU's default.
min_share_of_default = 0.95

[rules.peers]
# Probe results (matmul, bandwidth, peer copies) this share (0..1) below the median of the
# host's other GPUs of the same model are flagged; likewise a GPU pair's link against the other
# links of the same kind (NV18, PIX, ...).
margin = 0.10

[rules.job]
# The GPUs of one job (a Slurm job, a torchrun run, one pod, one launcher's children) are
# compared with each other. Shortest window (s) a job is judged over.
min_window_s = 10.0
# A GPU whose SM active (else power) is at least this multiple of its peers' median leads: the
# others wait for it.
lead_ratio = 1.15
# A GPU whose utilisation is this many points below its peers' median, while they read busy,
# lags: they wait for it in a collective.
lag_util_points = 20.0
# Peers' median utilisation (%) at or above which they count as busy.
peers_busy_util_pct = 50.0
# Memory the job's processes hold spread by this ratio (largest / smallest) and this much (GiB):
# the GPUs are not replicas (pipeline stages), so a gap in work is imbalance, not a straggler.
memory_spread_ratio = 1.25
# The spread's least size (GiB).
memory_spread_min_gib = 1.0
# Every GPU moving at least this much between GPUs (GB/s, NVLink and PCIe, rx + tx) while its
# tensor pipes are active below the share (%) after it: communication-bound.
communication_min_gb_per_s = 50.0
# The tensor-pipe share (%) below which such a GPU computes little.
communication_max_tensor_pct = 10.0
# A straggler's peers wait at least this share (0..1) of the time before their verdicts say so.
waiting_min_share = 0.15
"#;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Invalid { path: String, message: String },
}

impl Config {
    /// Parses a TOML document; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: origin.to_owned(),
            // Kept multi-line: the source line and the caret under the fault are the point;
            // the binary escapes and prefixes each line as it prints it.
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Loads the configuration the precedence rules select; no file at the default places is
    /// not an error (defaults apply), a named file that cannot be read is.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let named = explicit
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("GPUDIAG_CONFIG").map(PathBuf::from));
        let (path, required) = match named {
            Some(p) => (p, true),
            None => match default_path() {
                Some(p) => (p, false),
                None => return Ok(Config::default()),
            },
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Config::parse(&text, &path.display().to_string()),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Read {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Range checks serde cannot express; each error names the key.
    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let r = &self.rules;
        let checks: [(&str, f64, f64, f64); 39] = [
            (
                "rules.engine.eval_interval_s",
                r.engine.eval_interval_s,
                0.05,
                3600.0,
            ),
            (
                "rules.utilisation.window_s",
                r.utilisation.window_s,
                1.0,
                86400.0,
            ),
            (
                "rules.utilisation.min_span_s",
                r.utilisation.min_span_s,
                0.0,
                86400.0,
            ),
            (
                "rules.utilisation.min_mean_util_pct",
                r.utilisation.min_mean_util_pct,
                0.0,
                100.0,
            ),
            (
                "rules.utilisation.min_process_memory_mib",
                r.utilisation.min_process_memory_mib,
                0.0,
                1e9,
            ),
            (
                "rules.utilisation.idle_util_pct",
                r.utilisation.idle_util_pct,
                0.0,
                100.0,
            ),
            (
                "rules.utilisation.min_sm_fill",
                r.utilisation.min_sm_fill,
                0.0,
                1.0,
            ),
            (
                "rules.utilisation.saturated_pct",
                r.utilisation.saturated_pct,
                0.0,
                100.0,
            ),
            ("rules.throttle.window_s", r.throttle.window_s, 1.0, 86400.0),
            (
                "rules.throttle.load_util_pct",
                r.throttle.load_util_pct,
                0.0,
                100.0,
            ),
            (
                "rules.throttle.min_fraction",
                r.throttle.min_fraction,
                0.0,
                1.0,
            ),
            (
                "rules.throttle.power_cap_min_fraction",
                r.throttle.power_cap_min_fraction,
                0.0,
                1.0,
            ),
            ("rules.pcie.window_s", r.pcie.window_s, 1.0, 86400.0),
            ("rules.pcie.min_fraction", r.pcie.min_fraction, 0.0, 1.0),
            (
                "rules.pcie.moving_mb_per_s",
                r.pcie.moving_mb_per_s,
                0.0,
                1e9,
            ),
            ("rules.pcie.replay_ber", r.pcie.replay_ber, 0.0, 1.0),
            (
                "rules.pcie.replay_min_span_s",
                r.pcie.replay_min_span_s,
                0.0,
                86400.0,
            ),
            (
                "rules.memory.nearly_full_pct",
                r.memory.nearly_full_pct,
                0.0,
                100.0,
            ),
            (
                "rules.memory.nearly_full_window_s",
                r.memory.nearly_full_window_s,
                1.0,
                86400.0,
            ),
            (
                "rules.memory.leak_window_s",
                r.memory.leak_window_s,
                10.0,
                86400.0,
            ),
            (
                "rules.memory.leak_min_span_s",
                r.memory.leak_min_span_s,
                0.0,
                86400.0,
            ),
            (
                "rules.memory.leak_fast_min_span_s",
                r.memory.leak_fast_min_span_s,
                0.0,
                86400.0,
            ),
            (
                "rules.memory.leak_fast_min_growth_mib",
                r.memory.leak_fast_min_growth_mib,
                0.0,
                1e9,
            ),
            ("rules.memory.leak_min_r2", r.memory.leak_min_r2, 0.0, 1.0),
            (
                "rules.memory.leak_min_rate_mib_per_min",
                r.memory.leak_min_rate_mib_per_min,
                0.0,
                1e9,
            ),
            (
                "rules.memory.leak_min_growth_mib",
                r.memory.leak_min_growth_mib,
                0.0,
                1e9,
            ),
            ("rules.thermal.window_s", r.thermal.window_s, 1.0, 86400.0),
            ("rules.peers.margin", r.peers.margin, 0.0, 0.99),
            (
                "rules.power.min_share_of_default",
                r.power.min_share_of_default,
                0.0,
                1.0,
            ),
            (
                "rules.thermal.slowdown_margin_c",
                r.thermal.slowdown_margin_c,
                0.0,
                100.0,
            ),
            ("rules.job.min_window_s", r.job.min_window_s, 1.0, 86400.0),
            ("rules.job.lead_ratio", r.job.lead_ratio, 1.0, 100.0),
            (
                "rules.job.lag_util_points",
                r.job.lag_util_points,
                0.0,
                100.0,
            ),
            (
                "rules.job.peers_busy_util_pct",
                r.job.peers_busy_util_pct,
                0.0,
                100.0,
            ),
            (
                "rules.job.memory_spread_ratio",
                r.job.memory_spread_ratio,
                1.0,
                1e6,
            ),
            (
                "rules.job.memory_spread_min_gib",
                r.job.memory_spread_min_gib,
                0.0,
                1e6,
            ),
            (
                "rules.job.communication_min_gb_per_s",
                r.job.communication_min_gb_per_s,
                0.0,
                1e6,
            ),
            (
                "rules.job.communication_max_tensor_pct",
                r.job.communication_max_tensor_pct,
                0.0,
                100.0,
            ),
            (
                "rules.job.waiting_min_share",
                r.job.waiting_min_share,
                0.0,
                1.0,
            ),
        ];
        for (key, value, lo, hi) in checks {
            if !(lo..=hi).contains(&value) {
                return Err(ConfigError::Invalid {
                    path: origin.to_owned(),
                    message: format!("{key} = {value} is outside {lo}..={hi}"),
                });
            }
        }
        Ok(())
    }
}

/// `$XDG_CONFIG_HOME/gpudiag/config.toml`, else `~/.config/gpudiag/config.toml`.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("gpudiag").join("config.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_default_file_parses_to_the_defaults() {
        let parsed = Config::parse(DEFAULT_CONFIG_TOML, "default").unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn every_default_key_is_documented_by_a_comment() {
        let lines: Vec<&str> = DEFAULT_CONFIG_TOML.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.contains(" = ") && !line.starts_with('#') {
                assert!(lines[i - 1].starts_with('#'), "no comment above {line}");
            }
        }
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults() {
        let c = Config::parse("[rules.utilisation]\nmin_mean_util_pct = 30\n", "t").unwrap();
        assert_eq!(c.rules.utilisation.min_mean_util_pct, 30.0);
        assert_eq!(c.rules.utilisation.window_s, 30.0);
        assert_eq!(c.rules.memory, MemoryConfig::default());
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse("[rules.utilisation]\nmin_util = 30\n", "my.toml").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("my.toml"), "{msg}");
        assert!(msg.contains("min_util"), "{msg}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = Config::parse("[rules.throttle]\nmin_fraction = \"lots\"\n", "c.toml").unwrap_err();
        assert!(e.to_string().contains("min_fraction"), "{e}");
        let e = Config::parse("[rules.throttle]\nmin_fraction = 3.0\n", "c.toml").unwrap_err();
        assert!(
            e.to_string().contains("rules.throttle.min_fraction = 3"),
            "{e}"
        );
    }

    /// Every float key is range-checked: the fuzzer found `nearly_full_window_s = 3.9e140`
    /// unchecked, and a window that large panicked when it became a Duration.
    #[test]
    fn every_float_key_refuses_nan_infinity_and_huge_values() {
        let doc = toml::Table::try_from(Config::default()).unwrap();
        let mut keys = 0;
        for (section, table) in doc["rules"].as_table().unwrap() {
            for (key, value) in table.as_table().unwrap() {
                if !value.is_float() {
                    continue;
                }
                keys += 1;
                for bad in ["nan", "inf", "-inf", "1e300", "-1"] {
                    let text = format!("[rules.{section}]\n{key} = {bad}\n");
                    let e = Config::parse(&text, "c.toml").unwrap_err().to_string();
                    assert!(e.contains(&format!("rules.{section}.{key}")), "{text}: {e}");
                }
            }
        }
        assert_eq!(keys, 39);
    }

    #[test]
    fn a_missing_default_file_is_not_an_error_but_a_named_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        assert!(matches!(
            Config::load(Some(&missing)),
            Err(ConfigError::Read { .. })
        ));
    }
}
