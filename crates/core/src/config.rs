//! Thresholds and windows for the rules, from a TOML file.
//!
//! Precedence: `--config PATH` > `GPUDIAG_CONFIG` > `$XDG_CONFIG_HOME/gpudiag/config.toml` (or
//! `~/.config/gpudiag/config.toml`) > built-in defaults. A file only needs the keys it changes;
//! unknown keys are rejected (a misspelt threshold silently ignored is worse than an error), and
//! every error names the file and the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Declares every knob once: its section, name, type, default, the comment lines the default
/// file prints above it (also its documentation) and, for numbers a typo can make absurd, the
/// range `validate` accepts. Generates the section structs, `RulesConfig`, their `Default`s,
/// `DEFAULT_CONFIG_TOML` and the range checks, so a knob cannot be documented, defaulted or
/// checked in one place and forgotten in another.
macro_rules! config_table {
    (
        preamble: $preamble:literal;
        $(
            $(#[$section_attr:meta])*
            [$section:ident] $Section:ident {
                $(
                    $(#[doc = $doc:literal])*
                    $knob:ident: $ty:ty = $default:literal $(, $lo:literal ..= $hi:literal)?;
                )*
            }
        )*
    ) => {
        /// Every rule threshold, one table per family.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
        #[serde(default, deny_unknown_fields)]
        pub struct RulesConfig {
            $( pub $section: $Section, )*
        }

        $(
            $(#[$section_attr])*
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(default, deny_unknown_fields)]
            pub struct $Section {
                $( $(#[doc = $doc])* pub $knob: $ty, )*
            }

            impl Default for $Section {
                fn default() -> Self {
                    $Section { $( $knob: $default, )* }
                }
            }
        )*

        /// The default file, with a comment per key. `tests` check that it parses back to the
        /// defaults.
        pub const DEFAULT_CONFIG_TOML: &str = concat!(
            $preamble,
            $(
                "\n[rules.", stringify!($section), "]\n",
                $( $( "#", $doc, "\n", )* stringify!($knob), " = ", stringify!($default), "\n", )*
            )*
        );

        impl RulesConfig {
            /// Every range-checked key (`rules.section.key`), its value and its range, in the
            /// table's order.
            #[allow(clippy::useless_conversion)]
            fn ranged_keys(&self) -> Vec<(&'static str, f64, f64, f64)> {
                vec![$( $( $(
                    (
                        concat!("rules.", stringify!($section), ".", stringify!($knob)),
                        f64::from(self.$section.$knob),
                        $lo,
                        $hi,
                    ),
                )? )* )*]
            }
        }
    };
}

config_table! {
    preamble: "# gpudiag configuration. Every key is optional: a file needs only what it changes.
# Location: --config PATH, else $GPUDIAG_CONFIG, else $XDG_CONFIG_HOME/gpudiag/config.toml
# (~/.config/gpudiag/config.toml). Unknown keys are an error.
";

    [engine] EngineConfig {
        /// Seconds between evaluations of the windowed rules while sampling.
        eval_interval_s: f64 = 1.0, 0.05..=3600.0;
    }

    [utilisation] UtilisationConfig {
        /// Window (s) over which GPU utilisation is averaged (only the time the process held memory).
        window_s: f64 = 30.0, 1.0..=86400.0;
        // Idleness needs time to show: with less data the rule stays silent.
        /// Minimum data (s) before the rule may fire.
        min_span_s: f64 = 3.0, 0.0..=86400.0;
        /// Fires when a process holds memory and mean utilisation is below this (%).
        min_mean_util_pct: f64 = 50.0, 0.0..=100.0;
        /// A process "holds" the GPU from this much memory (MiB).
        min_process_memory_mib: f64 = 256.0, 0.0..=1e9;
        /// Below this mean utilisation (%) the GPU counts as doing nothing (verdicts idle, idle_holding_memory).
        idle_util_pct: f64 = 5.0, 0.0..=100.0;
        /// SM active / utilisation (0..1) below which running kernels leave most SMs empty (needs profiling counters).
        min_sm_fill: f64 = 0.35, 0.0..=1.0;
        /// A tensor/FP pipe or DRAM at or above this (%) counts as saturated (compute_bound vs memory_bound).
        saturated_pct: f64 = 50.0, 0.0..=100.0;
    }

    [throttle] ThrottleConfig {
        /// Window (s) over which throttle reasons are judged.
        window_s: f64 = 60.0, 1.0..=86400.0;
        /// A sample is under load at or above this utilisation (%).
        load_util_pct: f64 = 50.0, 0.0..=100.0;
        /// HW slowdown, SW/HW thermal, HW power brake: share of the window (0..1) under load to fire.
        min_fraction: f64 = 0.05, 0.0..=1.0;
        /// SW power cap: share of the window (0..1) to be reported (info).
        power_cap_min_fraction: f64 = 0.5, 0.0..=1.0;
    }

    [pcie] PcieConfig {
        /// Window (s) over which the link state is judged.
        window_s: f64 = 60.0, 1.0..=86400.0;
        /// Share (0..1) of active samples with the link below its maximum to fire.
        min_fraction: f64 = 0.5, 0.0..=1.0;
        /// rx + tx at or above this (MB/s) counts as moving data.
        moving_mb_per_s: f64 = 256.0, 0.0..=1e9;
        /// Bit error rate the allowed replay rate is derived from (BER x lane rate x lanes).
        replay_ber: f64 = 1e-12, 0.0..=1.0;
        /// Minimum counter history (s) before the replay rule may fire.
        replay_min_span_s: f64 = 30.0, 0.0..=86400.0;
    }

    [memory] MemoryConfig {
        /// Fires when used memory exceeds this share of total (%)...
        nearly_full_pct: f64 = 95.0, 0.0..=100.0;
        /// ...averaged over this window (s).
        nearly_full_window_s: f64 = 10.0, 1.0..=86400.0;
        /// Window (s) over which a process's memory growth is fitted.
        leak_window_s: f64 = 600.0, 10.0..=86400.0;
        /// Minimum history (s) of a process before it can be called a leak...
        leak_min_span_s: f64 = 120.0, 0.0..=86400.0;
        /// ...or this much (s) when its growth is large and steady and still going in the second half (a
        /// model warming up grows in a few steps and levels off):
        leak_fast_min_span_s: f64 = 20.0, 0.0..=86400.0;
        /// growth of at least this much (MiB)...
        leak_fast_min_growth_mib: f64 = 1024.0, 0.0..=1e9;
        /// ...in at least this many separate increases.
        leak_fast_min_steps: u32 = 8;
        /// Minimum growth rate (MiB per minute).
        leak_min_rate_mib_per_min: f64 = 16.0, 0.0..=1e9;
        /// Minimum total growth over the window (MiB).
        leak_min_growth_mib: f64 = 128.0, 0.0..=1e9;
        /// Minimum fit quality (R squared, 0..1) of the linear growth; a single jump fits badly.
        leak_min_r2: f64 = 0.9, 0.0..=1.0;
        /// Minimum number of separate increases; one allocation is not a trend.
        leak_min_steps: u32 = 4;
    }

    [thermal] ThermalConfig {
        /// Window (s) over which the temperature is averaged.
        window_s: f64 = 10.0, 1.0..=86400.0;
        /// Warns within this many degrees C of the slowdown threshold.
        slowdown_margin_c: f64 = 5.0, 0.0..=100.0;
    }

    [power] PowerConfig {
        // Below 95%: a limit a few watts under the default (rounding, a firmware step) is noise.
        /// Warns when the enforced power limit is below this share (0..1) of the GPU's default.
        min_share_of_default: f64 = 0.95, 0.0..=1.0;
    }

    [peers] PeersConfig {
        /// Probe results (matmul, bandwidth, peer copies) this share (0..1) below the median of the
        /// host's other GPUs of the same model are flagged; likewise a GPU pair's link against the other
        /// links of the same kind (NV18, PIX, ...).
        margin: f64 = 0.10, 0.0..=0.99;
    }

    /// How a job's GPUs are compared. The defaults come from measured runs: see `docs/jobs.md`.
    [job] JobConfig {
        /// The GPUs of one job (a Slurm job, a torchrun run, one pod, one launcher's children) are
        /// compared with each other. Shortest window (s) a job is judged over.
        // A training step can last seconds, and a shorter window may catch every GPU in a
        // different part of it.
        min_window_s: f64 = 10.0, 1.0..=86400.0;
        /// A GPU whose SM active (else power) is at least this multiple of its peers' median leads: the
        /// others wait for it. Measured: balanced jobs lead by at most 1.045, a rank slowed 1.1x by
        /// 1.08 to 1.14 (docs/jobs.md, Sensitivity).
        lead_ratio: f64 = 1.07, 1.0..=100.0;
        /// ... and at least this many points of SM active above them: at the low activity of a job that
        /// mostly communicates, a few points are a large ratio and mean nothing. Measured: balanced
        /// jobs spread by at most 4.1 points, a 1.1x rank on two GPUs leads by 7.4 to 7.6.
        lead_min_sm_points: f64 = 5.0, 0.0..=100.0;
        /// A GPU whose utilisation is this many points below its peers' median, while they read busy,
        /// lags: they wait for it in a collective.
        lag_util_points: f64 = 20.0, 0.0..=100.0;
        // Spinning in a collective reads busy.
        /// Peers' median utilisation (%) at or above which they count as busy.
        peers_busy_util_pct: f64 = 50.0, 0.0..=100.0;
        /// Memory the job's processes hold spread by this ratio (largest / smallest) and this much (GiB):
        /// the GPUs are not replicas (pipeline stages), so a gap in work is imbalance, not a straggler.
        memory_spread_ratio: f64 = 1.25, 1.0..=1e6;
        /// The spread's least size (GiB).
        memory_spread_min_gib: f64 = 1.0, 0.0..=1e6;
        /// Every GPU moving at least this much between GPUs (GB/s, NVLink and PCIe, rx + tx) while its
        /// tensor pipes are active below the share (%) after it: communication-bound.
        communication_min_gb_per_s: f64 = 50.0, 0.0..=1e6;
        /// The tensor-pipe share (%) below which such a GPU computes little.
        communication_max_tensor_pct: f64 = 10.0, 0.0..=100.0;
        /// A straggler's peers wait at least this share (0..1) of the time before their verdicts say so.
        waiting_min_share: f64 = 0.15, 0.0..=1.0;
        /// A job whose GPUs make no progress this long (s) is hung: they sit in collectives that move
        /// nothing while the rank they wait for sleeps, stopped or exited. A shorter window is too short
        /// to call a hang.
        hang_after_s: f64 = 30.0, 1.0..=86400.0;
        /// A GPU spinning in a collective reads utilisation at or above this (%): a kernel runs all the time.
        hang_spin_util_pct: f64 = 80.0, 0.0..=100.0;
        /// ... while it moves less than this between GPUs (MB/s, NVLink and PCIe, rx + tx): a collective
        /// that moves data is progress.
        hang_max_link_mb_per_s: f64 = 100.0, 0.0..=1e9;
        /// ... its tensor pipes and DRAM active below this (%), where the GPU has profiling counters.
        hang_max_busy_pct: f64 = 3.0, 0.0..=100.0;
        /// ... and the job draws at most this share (0..1) of its own working draw before, where that
        /// was seen (a spinning GPU draws a quarter or less of what it drew at work).
        hang_power_ratio: f64 = 0.6, 0.0..=1.0;
        /// A rank using this much CPU (% of one core) while its peers wait makes progress on the host (a
        /// checkpoint, an evaluation, a download): a slow rank, not a hang.
        host_progress_cpu_pct: f64 = 10.0, 0.0..=100000.0;
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub rules: RulesConfig,
}

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

/// The largest configuration file read: every setting with a comment fits in a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a configuration file of at most [`MAX_CONFIG_BYTES`]: `/dev/zero` never ends. A FIFO
/// is refused unopened (opening one waits for a writer); `/dev/null` reads as empty, which
/// scripts use for "no configuration".
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::metadata(path)?.file_type();
    let refused = if kind.is_dir() {
        Some("a directory, not a file")
    } else if kind.is_fifo() {
        Some("a FIFO, not a file (gpudiag would wait for a writer)")
    } else {
        None
    };
    if let Some(why) = refused {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} KiB", MAX_CONFIG_BYTES >> 10),
        ));
    }
    Ok(text)
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
        // An empty GPUDIAG_CONFIG is unset, as shells and most tools read an empty variable.
        let named = explicit.map(Path::to_path_buf).or_else(|| {
            std::env::var_os("GPUDIAG_CONFIG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let (path, required) = match named {
            Some(p) => (p, true),
            None => match default_path() {
                Some(p) => (p, false),
                None => return Ok(Config::default()),
            },
        };
        match read_bounded(&path) {
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
        for (key, value, lo, hi) in self.rules.ranged_keys() {
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
        assert_eq!(keys, 46);
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
