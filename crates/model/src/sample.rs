//! The telemetry model every backend produces and every view consumes.
//!
//! Absent values are `None`, and the reason they are absent travels beside them in an `absent` map
//! keyed by the same name, so a view can say "not supported" instead of guessing. Nothing here may
//! use 0 or -1 to mean "missing".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::metric_table::{
    Chart, FieldValue, Format, GIB, Kind, MIB, Plausible, Plot, Prometheus, Repr, Round, Scale,
    Text, Trace, Unit, Unrepresentable, Vendor, Vendors,
};
use crate::prometheus_names::{label, series};

// The table's own types: each names `Sample`, so they live beside it, and the vocabulary they are
// built from (`metric_table`) names nothing here.

/// The top of a chart's y axis, in the unit of its fields.
#[derive(Debug, Clone, Copy)]
pub enum Ceiling {
    Fixed(f64),
    /// A field of the latest sample, else an attribute of the device.
    Field(&'static str, fn(&DeviceInfo) -> Option<f64>),
    /// Attributes of the device alone.
    Device(fn(&DeviceInfo) -> Option<f64>),
    /// None: the chart shows what was seen, with room.
    Seen,
}

impl Chart {
    pub fn ceiling(self) -> Ceiling {
        match self {
            Chart::Util => Ceiling::Fixed(100.0),
            Chart::Memory => Ceiling::Field("mem_total_bytes", |d| {
                d.memory_total_bytes.map(|b| b as f64)
            }),
            Chart::Power => Ceiling::Field("power_limit_w", |d| d.power_limit_max_w),
            Chart::Temperature => Ceiling::Field("temp_slowdown_c", |d| d.temp_slowdown_c),
            Chart::Clocks => Ceiling::Device(|d| {
                [d.sm_clock_max_mhz, d.mem_clock_max_mhz]
                    .into_iter()
                    .flatten()
                    .max()
                    .map(f64::from)
            }),
            Chart::Pcie => Ceiling::Seen,
            Chart::Profile => Ceiling::Fixed(100.0),
        }
    }

    /// The fields the chart plots, in table order; the first one's absence explains an empty
    /// chart.
    pub fn fields(self) -> impl Iterator<Item = &'static MetricDef> {
        crate::sample::METRIC_TABLE
            .iter()
            .filter(move |m| m.chart.is_some_and(|p| p.chart == self))
    }
}

/// The representation of the field an accessor reads (used by `metric_table!`).
pub const fn repr_of<T: FieldValue>(_: fn(&Sample) -> Option<T>) -> Repr {
    T::REPR
}

/// One telemetry field, as the table declares it. Built with `gauge` or `counter` and the
/// methods below; `metric_table!` adds the name, the series and the accessors.
#[derive(Clone, Copy)]
pub struct MetricDef {
    /// The `Sample` field and JSON key.
    pub name: &'static str,
    /// The history series it is kept as (and summarised under), if any.
    pub series: Option<Metric>,
    pub repr: Repr,
    pub unit: Unit,
    pub kind: Kind,
    /// What sanity checks let through; `None`: anything the type holds.
    pub plausible: Option<Plausible>,
    pub format: Format,
    pub vendors: Vendors,
    pub text: Option<Text>,
    /// The device's static attribute of the same meaning (the slowdown temperature, the
    /// maximum link generation), which views show where a sample lacks the value.
    pub device: Option<fn(&DeviceInfo) -> Option<f64>>,
    pub chart: Option<Plot>,
    pub trace: Option<Trace>,
    pub prometheus: Option<Prometheus>,
    pub(crate) get: fn(&Sample) -> Option<f64>,
    pub(crate) set: fn(&mut Sample, Option<f64>) -> Result<(), Unrepresentable>,
}

impl std::fmt::Debug for MetricDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricDef")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl MetricDef {
    pub const fn gauge(unit: Unit, vendors: Vendors) -> Self {
        MetricDef::new(unit, Kind::Gauge, vendors)
    }

    pub const fn counter(unit: Unit, vendors: Vendors) -> Self {
        MetricDef::new(unit, Kind::Counter, vendors)
    }

    const fn new(unit: Unit, kind: Kind, vendors: Vendors) -> Self {
        MetricDef {
            name: "",
            series: None,
            repr: Repr::F64,
            unit,
            kind,
            plausible: None,
            format: Format::Fixed {
                decimals: 0,
                scale: Scale::One,
            },
            vendors,
            text: None,
            device: None,
            chart: None,
            trace: None,
            prometheus: None,
            get: |_| None,
            set: |_, _| Ok(()),
        }
    }

    pub const fn plausible(mut self, min: f64, max: f64) -> Self {
        self.plausible = Some(Plausible { min, max });
        self
    }

    pub const fn format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    pub const fn text(mut self, line: u8, template: &'static str) -> Self {
        self.text = Some(Text { line, template });
        self
    }

    pub const fn device(mut self, device: fn(&DeviceInfo) -> Option<f64>) -> Self {
        self.device = Some(device);
        self
    }

    pub const fn chart(mut self, chart: Chart, scale: Scale) -> Self {
        self.chart = Some(Plot { chart, scale });
        self
    }

    pub const fn trace(
        mut self,
        group: &'static str,
        key: &'static str,
        scale: Scale,
        round: Round,
    ) -> Self {
        self.trace = Some(Trace {
            group,
            key,
            scale,
            round,
        });
        self
    }

    pub const fn prometheus(mut self, prometheus: Prometheus) -> Self {
        self.prometheus = Some(prometheus);
        self
    }

    /// The field's value in `s`; flags read as 0 or 1.
    pub fn get(&self, s: &Sample) -> Option<f64> {
        (self.get)(s)
    }

    /// Stores `v` (or clears the field), converted to the field's type.
    pub fn set(&self, s: &mut Sample, v: Option<f64>) -> Result<(), Unrepresentable> {
        (self.set)(s, v)
    }

    /// What a view shows for the field: the sample's value, else the device's static one.
    pub fn shown(&self, s: Option<&Sample>, d: &DeviceInfo) -> Option<f64> {
        s.and_then(|s| self.get(s))
            .or_else(|| self.device.and_then(|device| device(d)))
    }
}

/// The table entry of the `Sample` field `name`.
pub fn by_name(name: &str) -> Option<&'static MetricDef> {
    METRIC_TABLE.iter().find(|m| m.name == name)
}

/// The `Sample` fields a backend of `vendor` has no way to read: those the table gives to other
/// vendors only, and the decoded throttle names wherever the bits are missing (they are one
/// reading, kept in two fields).
pub fn unavailable_on(vendor: Vendor) -> impl Iterator<Item = &'static str> {
    let throttle_bits = by_name("throttle_reasons").is_some_and(|m| !m.vendors.has(vendor));
    METRIC_TABLE
        .iter()
        .filter(move |m| !m.vendors.has(vendor))
        .map(|m| m.name)
        .chain(throttle_bits.then_some("throttle_reason_names"))
}

/// The trace's counter groups in order of first appearance in the table, each with its fields.
pub fn trace_groups() -> Vec<(&'static str, Vec<&'static MetricDef>)> {
    let mut groups: Vec<(&'static str, Vec<&'static MetricDef>)> = Vec::new();
    for m in METRIC_TABLE {
        let Some(t) = m.trace else { continue };
        match groups.iter_mut().find(|(g, _)| *g == t.group) {
            Some((_, fields)) => fields.push(m),
            None => groups.push((t.group, vec![m])),
        }
    }
    groups
}

/// Declares the metric table: the `Metric` enum (one variant per field that `=> Variant` makes
/// a history series) and `METRIC_TABLE`, each entry a `MetricDef` expression completed with the
/// field's name, series, representation and accessors.
macro_rules! metric_table {
    (
        $(#[$attr:meta])*
        pub enum Metric;
        $( $field:ident $(=> $series:ident)? : $def:expr ),* $(,)?
    ) => {
        $(#[$attr])*
        pub enum Metric {
            $($( $series, )?)*
        }

        impl Metric {
            /// Every series, in declaration order (which is also their order in a report).
            pub const ALL: [Metric; Metric::COUNT] = [$($( Metric::$series, )?)*];
            pub const COUNT: usize = [$($( stringify!($series), )?)*].len();
        }

        impl $crate::sample::Sample {
            /// The value of a history series, read straight from its field: the history
            /// calls this for every series of every sample, where an indirect call through
            /// the table cost about 8% of a push.
            pub fn value(&self, metric: Metric) -> Option<f64> {
                match metric {
                    $($( Metric::$series => self.$field.map($crate::metric_table::FieldValue::to_f64), )?)*
                }
            }
        }

        /// Every value field of `Sample`, in struct order.
        pub const METRIC_TABLE: &[$crate::sample::MetricDef] = &[$(
            $crate::sample::MetricDef {
                name: stringify!($field),
                series: metric_table!(@series $($series)?),
                repr: $crate::sample::repr_of(|s: &$crate::sample::Sample| s.$field),
                get: |s| s.$field.map($crate::metric_table::FieldValue::to_f64),
                set: |s, v| {
                    s.$field = v.map($crate::metric_table::FieldValue::from_f64).transpose()?;
                    Ok(())
                },
                ..$def
            },
        )*];
    };
    (@series) => { None };
    (@series $series:ident) => { Some(Metric::$series) };
}

/// Milliseconds since the Unix epoch. One clock for samples, events, probes and traces.
pub type TimeMs = u64;

/// Why a value is missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Absent {
    /// The device or driver does not offer this value (fans on SXM parts, ECC on consumer cards).
    NotSupported,
    /// The caller lacks the privilege to read it.
    NoPermission,
    /// The GPU fell off the bus or stopped answering.
    GpuLost,
    /// A slow field that has not been read yet (it has its own cadence).
    NotYetRead,
    /// A rate or share that needs two readings some time apart (the profiling counters), and
    /// only one was taken (a single read: `check --window 0`).
    NeedsTwoSamples,
    /// The backend has no way to read this value at all (e.g. an AMD-only field on NVML).
    Unavailable,
    /// Any other failure, with the library's message.
    Error(String),
}

impl std::fmt::Display for Absent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Absent::NotSupported => f.write_str("not supported"),
            Absent::NoPermission => f.write_str("no permission"),
            Absent::GpuLost => f.write_str("GPU lost"),
            Absent::NotYetRead => f.write_str("not read yet"),
            Absent::NeedsTwoSamples => f.write_str(
                "needs two samples at least 100 ms apart; a single read has none (use a window)",
            ),
            Absent::Unavailable => f.write_str("unavailable on this backend"),
            Absent::Error(e) => write!(f, "error: {e}"),
        }
    }
}

/// Why-absent map keyed by field name (the serde name of the field).
pub type AbsentMap = BTreeMap<String, Absent>;

/// A compute capability such as 9.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Static attributes of one GPU, read once when the backend opens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, transform = crate::schema::absent_keys)]
pub struct DeviceInfo {
    /// Device index as the backend enumerates it.
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    pub vendor: Option<String>,
    pub architecture: Option<String>,
    pub compute_capability: Option<ComputeCapability>,
    pub serial: Option<String>,
    pub vbios_version: Option<String>,
    pub memory_total_bytes: Option<u64>,
    #[schemars(range(min = 0))]
    pub power_limit_default_w: Option<f64>,
    #[schemars(range(min = 0))]
    pub power_limit_min_w: Option<f64>,
    #[schemars(range(min = 0))]
    pub power_limit_max_w: Option<f64>,
    pub sm_clock_max_mhz: Option<u32>,
    pub mem_clock_max_mhz: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub temp_slowdown_c: Option<f64>,
    pub temp_shutdown_c: Option<f64>,
    pub temp_gpu_max_c: Option<f64>,
    pub temp_mem_max_c: Option<f64>,
    pub ecc_enabled: Option<bool>,
    pub persistence_mode: Option<bool>,
    pub mig_enabled: Option<bool>,
    /// Why each absent value is absent, keyed by the field's name; left out when none is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub absent: AbsentMap,
}

impl DeviceInfo {
    /// A short human label: "0 NVIDIA H200".
    pub fn label(&self) -> String {
        format!(
            "{} {}",
            self.index,
            self.name.as_deref().unwrap_or("unknown GPU")
        )
    }
}

/// One process using a GPU, as seen in one slow-cadence read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    deny_unknown_fields,
    transform = crate::schema::added_later("container_pid"),
    transform = crate::schema::added_later("cpu_time_s"),
    transform = crate::schema::added_later("attribution"),
    transform = crate::schema::added_later("launch"),
    transform = crate::schema::added_later("state"),
    transform = crate::schema::added_later("started_ms")
)]
pub struct ProcessSample {
    pub pid: u32,
    /// Command name (redactable).
    pub name: Option<String>,
    pub user: Option<String>,
    /// "compute" or "graphics".
    #[schemars(extend("enum" = ["compute", "graphics", null]))]
    pub kind: Option<String>,
    pub used_memory_bytes: Option<u64>,
    #[schemars(range(min = 0, max = 100))]
    pub sm_util_pct: Option<f64>,
    /// Container id from the process's cgroup, when it runs in one.
    pub container_id: Option<String>,
    /// The PID inside the process's own PID namespace (the last `NSpid` entry), when it differs
    /// from `pid`: what `ps` shows inside the container.
    #[serde(default)]
    pub container_pid: Option<u32>,
    /// CPU time the process has used since it started (user + system, all threads), from
    /// `/proc/<pid>/stat`: its rate over a window tells a busy host side from a waiting one.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub cpu_time_s: Option<f64>,
    /// Its Slurm job and Kubernetes pod; `None` from sources that do not look (recordings made
    /// before gpudiag did).
    #[serde(default)]
    pub attribution: Option<crate::attribution::Attribution>,
    /// How it was started: its parent and the launcher's variables, which tie the ranks of one
    /// job together; `None` from sources that do not look (recordings made before gpudiag did).
    #[serde(default)]
    pub launch: Option<crate::attribution::Launch>,
    /// What the process was doing when read (`/proc/<pid>/stat`, field 3): a rank its peers
    /// wait for is told apart by it (asleep with no CPU progress: likely hung; stopped; a
    /// zombie; running or in I/O: slow, not hung). Left out where not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ProcessState>,
    /// When the process started, ms since the Unix epoch (`/proc/<pid>/stat` field 22 after
    /// the boot time of `/proc/stat`): a pid reused by a new process has a new start. Left out
    /// where not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<TimeMs>,
}

impl ProcessSample {
    /// The one user a view names for this process: its Slurm job's user where the job names
    /// one (the account the GPU is charged to, and what a scheduler acts on), else the user it
    /// runs as. Every view that shows a single user per process takes this one (the terminal
    /// UI's USER column, `serve`'s `user` label and so `fleet`), so they never name two people
    /// for one process; the check report keeps both (`user`, `attribution.job.user`).
    pub fn charged_user(&self) -> Option<&str> {
        self.attribution
            .as_ref()
            .and_then(|a| a.job.as_ref())
            .and_then(|j| j.user.as_deref())
            .or(self.user.as_deref())
    }
}

/// A process's scheduling state as `/proc/<pid>/stat` gives it. Stable names: JSON values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// `R`: on a CPU or ready to run.
    Running,
    /// `S`: asleep until something wakes it (a lock, a socket, a timer, a GPU event).
    Sleeping,
    /// `D`: waiting in the kernel, usually for I/O (a checkpoint write) or a driver call.
    DiskSleep,
    /// `T` or `t`: stopped by a signal (SIGSTOP, SIGTSTP) or a debugger.
    Stopped,
    /// `Z`: exited, not yet reaped by its parent.
    Zombie,
    /// `X`, `x`: exiting.
    Dead,
    /// `I` (an idle kernel thread), `P`, `W`, `K`: not a user process's state worth telling apart.
    /// Also any name a later gpudiag writes that this one does not know, so an older reader keeps
    /// the sample rather than dropping it.
    #[serde(other)]
    Other,
}

impl ProcessState {
    /// From the state letter.
    pub fn from_letter(c: char) -> Option<Self> {
        Some(match c {
            'R' => ProcessState::Running,
            'S' => ProcessState::Sleeping,
            'D' => ProcessState::DiskSleep,
            'T' | 't' => ProcessState::Stopped,
            'Z' => ProcessState::Zombie,
            'X' | 'x' => ProcessState::Dead,
            'I' | 'P' | 'W' | 'K' => ProcessState::Other,
            _ => return None,
        })
    }

    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            ProcessState::Running => "running",
            ProcessState::Sleeping => "sleeping",
            ProcessState::DiskSleep => "disk_sleep",
            ProcessState::Stopped => "stopped",
            ProcessState::Zombie => "zombie",
            ProcessState::Dead => "dead",
            ProcessState::Other => "other",
        }
    }

    /// Gone or going: it will never call the next collective.
    pub fn exited(self) -> bool {
        matches!(self, ProcessState::Zombie | ProcessState::Dead)
    }
}

/// The state from a `/proc/<pid>/stat` line (field 3).
pub fn stat_state(stat: &str) -> Option<ProcessState> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let letter = rest.split_ascii_whitespace().next()?;
    let mut chars = letter.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(())?;
    ProcessState::from_letter(c)
}

/// When the process started, ms since the Unix epoch: field 22 (`starttime`, in `USER_HZ` ticks
/// after boot) and `btime` of `/proc/stat` (the boot time, s since the epoch).
pub fn stat_started_ms(stat: &str, boot_time_s: u64) -> Option<TimeMs> {
    const MS_PER_TICK: u64 = 10;
    // Field 22 is the 20th after the command name's last ')' (field 3 is the first).
    let rest = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = rest.split_ascii_whitespace().nth(19)?.parse().ok()?;
    boot_time_s
        .checked_mul(1000)?
        .checked_add(ticks.checked_mul(MS_PER_TICK)?)
}

/// `btime` from `/proc/stat`: when the host booted, s since the Unix epoch.
pub fn proc_stat_boot_time_s(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The parent's pid from a `/proc/<pid>/stat` line (field 4).
pub fn stat_parent_pid(stat: &str) -> Option<u32> {
    // Fields resume after the command name's last ')': state, then the parent's pid.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds (user + system) from a `/proc/<pid>/stat` line. The kernel reports them in
/// `USER_HZ` ticks, which the /proc ABI fixes at 100 on every Linux architecture gpudiag runs on.
pub fn stat_cpu_time_s(stat: &str) -> Option<f64> {
    const USER_HZ: f64 = 100.0;
    // The command name (field 2) is in parentheses and may hold spaces or ')': fields resume
    // after the last ')'. utime and stime are fields 14 and 15, so 11th and 12th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// Telemetry of one device at one instant. Every value is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, transform = crate::schema::absent_keys)]
#[schemars(
    transform = crate::schema::added_later("throttle_sw_power_cap_s"),
    transform = crate::schema::added_later("throttle_sync_boost_s"),
    transform = crate::schema::added_later("throttle_sw_thermal_slowdown_s"),
    transform = crate::schema::added_later("throttle_hw_thermal_slowdown_s"),
    transform = crate::schema::added_later("throttle_hw_power_brake_slowdown_s"),
    transform = crate::schema::added_later_each(PROFILING_FIELDS),
    transform = crate::schema::added_later("gpu_pods")
)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub time_ms: TimeMs,
    /// Device index.
    pub device: u32,
    #[schemars(range(min = 0, max = 100))]
    pub gpu_util_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub mem_util_pct: Option<f64>,
    pub mem_used_bytes: Option<u64>,
    pub mem_free_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    #[schemars(range(min = 0))]
    pub power_w: Option<f64>,
    #[schemars(range(min = 0))]
    pub power_limit_w: Option<f64>,
    /// Energy counter since the driver loaded, in joules.
    #[schemars(range(min = 0))]
    pub energy_j: Option<f64>,
    pub temp_gpu_c: Option<f64>,
    pub temp_mem_c: Option<f64>,
    pub temp_slowdown_c: Option<f64>,
    pub temp_shutdown_c: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub mem_clock_max_mhz: Option<u32>,
    /// Performance state, 0 (P0, fastest) to 15.
    #[schemars(range(max = 15))]
    pub pstate: Option<u32>,
    /// NVML clock-event (throttle) reason bits.
    pub throttle_reasons: Option<u64>,
    /// The decoded names of `throttle_reasons`, e.g. `["sw_power_cap"]`.
    pub throttle_reason_names: Option<Vec<String>>,
    /// Seconds the clocks were held down by the software power cap since the driver loaded
    /// (this and the four below are NVML's clock-event reason counters).
    #[schemars(range(min = 0))]
    pub throttle_sw_power_cap_s: Option<f64>,
    /// Seconds held down to match the slowest GPU of a sync-boost group.
    #[schemars(range(min = 0))]
    pub throttle_sync_boost_s: Option<f64>,
    /// Seconds held down to keep GPU and memory below their maximum operating temperatures.
    #[schemars(range(min = 0))]
    pub throttle_sw_thermal_slowdown_s: Option<f64>,
    /// Seconds held down by the hardware thermal slowdown (too hot: clocks halved or lower).
    #[schemars(range(min = 0))]
    pub throttle_hw_thermal_slowdown_s: Option<f64>,
    /// Seconds held down by an external power brake (the board's power supply asserted it).
    #[schemars(range(min = 0))]
    pub throttle_hw_power_brake_slowdown_s: Option<f64>,
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_max: Option<u32>,
    #[schemars(range(min = 0))]
    pub pcie_rx_bytes_per_s: Option<f64>,
    #[schemars(range(min = 0))]
    pub pcie_tx_bytes_per_s: Option<f64>,
    pub pcie_replay_count: Option<u64>,
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub ecc_corrected_aggregate: Option<u64>,
    pub ecc_uncorrected_aggregate: Option<u64>,
    pub retired_pages_sbe: Option<u64>,
    pub retired_pages_dbe: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows_correctable: Option<u64>,
    pub remapped_rows_uncorrectable: Option<u64>,
    pub remapped_rows_pending: Option<bool>,
    pub remapped_rows_failure: Option<bool>,
    /// Fan 0 speed; NVML may report more than 100.
    #[schemars(range(min = 0))]
    pub fan_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub encoder_util_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub decoder_util_pct: Option<f64>,
    // Profiling counters (NVML GPM on Hopper and newer, the counters DCGM's profiling fields
    // read): each is the share of the interval since the previous profiling sample, so a single
    // read has none.
    /// Share of time the graphics/compute engine was busy (GPM `GRAPHICS_UTIL`; on AMD, GFX
    /// activity).
    #[schemars(range(min = 0, max = 100))]
    pub gr_engine_active_pct: Option<f64>,
    /// Share of time an SM had at least one warp resident, averaged over all SMs (GPM
    /// `SM_UTIL`, DCGM's SM_ACTIVE). Unlike `gpu_util_pct`, one warp on one SM reads as ~0.
    #[schemars(range(min = 0, max = 100))]
    pub sm_active_pct: Option<f64>,
    /// Resident warps against the SMs' maximum, averaged over all SMs.
    #[schemars(range(min = 0, max = 100))]
    pub sm_occupancy_pct: Option<f64>,
    /// Share of time any tensor pipe was busy.
    #[schemars(range(min = 0, max = 100))]
    pub tensor_active_pct: Option<f64>,
    /// Tensor pipes busy with half-precision (fp16/bf16/tf32) matrix math.
    #[schemars(range(min = 0, max = 100))]
    pub tensor_hmma_active_pct: Option<f64>,
    /// Tensor pipes busy with integer matrix math.
    #[schemars(range(min = 0, max = 100))]
    pub tensor_imma_active_pct: Option<f64>,
    /// Tensor pipes busy with fp64 matrix math.
    #[schemars(range(min = 0, max = 100))]
    pub tensor_dfma_active_pct: Option<f64>,
    /// Share of the peak DRAM bandwidth used (GPM `DRAM_BW_UTIL`; on AMD, memory-controller
    /// activity).
    #[schemars(range(min = 0, max = 100))]
    pub dram_active_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub fp64_active_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub fp32_active_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub fp16_active_pct: Option<f64>,
    #[schemars(range(min = 0, max = 100))]
    pub int_active_pct: Option<f64>,
    /// PCIe bytes received per second over the profiling interval (cheaper and steadier than
    /// `pcie_rx_bytes_per_s`, which NVML measures over ~20 ms).
    #[schemars(range(min = 0))]
    pub prof_pcie_rx_bytes_per_s: Option<f64>,
    #[schemars(range(min = 0))]
    pub prof_pcie_tx_bytes_per_s: Option<f64>,
    /// NVLink bytes received per second, all links together.
    #[schemars(range(min = 0))]
    pub nvlink_rx_bytes_per_s: Option<f64>,
    #[schemars(range(min = 0))]
    pub nvlink_tx_bytes_per_s: Option<f64>,
    /// `None` until the slow-cadence process read has happened (see `absent`).
    pub processes: Option<Vec<ProcessSample>>,
    /// The pods the kubelet's pod-resources API allocated this GPU to (several when it is
    /// time-sliced); `None` off Kubernetes or when the kubelet did not answer (see `absent`).
    #[serde(default)]
    pub gpu_pods: Option<Vec<crate::attribution::PodAllocation>>,
    /// Why each absent value is absent, keyed by the field's name; left out when none is.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub absent: AbsentMap,
}

metric_table! {
    /// The numeric series a `Sample` carries, for history, summaries and exports: one variant
    /// per table entry marked `=> Variant` below.
    #[derive(
        Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
    )]
    #[serde(rename_all = "snake_case")]
    pub enum Metric;

    // Text lines: 1 load and memory, 2 power and cooling, 3 clocks, 4 PCIe, 5 memory errors.
    gpu_util_pct => GpuUtilPct: MetricDef::gauge(Unit::Percent, Vendors::ALL)
        .plausible(0.0, 100.0)
        .text(1, "util {|%} (mean {mean|%}, max {max|%})")
        .chart(Chart::Util, Scale::One)
        .trace("util %", "gpu", Scale::One, Round::Tenth)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_GPU_UTIL, "GPU utilization (in %).")),
    mem_util_pct => MemUtilPct: MetricDef::gauge(Unit::Percent, Vendors::ALL)
        .plausible(0.0, 100.0)
        .text(1, "mem util {|%}")
        .chart(Chart::Util, Scale::One)
        .trace("util %", "memory", Scale::One, Round::Tenth)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_MEM_COPY_UTIL, "Memory utilization (in %).")),
    mem_used_bytes => MemUsedBytes: MetricDef::gauge(Unit::Bytes, Vendors::ALL)
        .format(IN_GIB)
        .text(1, "memory {} / {mem_total_bytes| GiB}")
        .chart(Chart::Memory, Scale::Per(GIB))
        .trace("memory MiB", "used", Scale::Per(MIB), Round::Whole)
        .prometheus(
            Prometheus::new(series::DCGM_FI_DEV_FB_USED, "Framebuffer memory used (in MiB).")
                .scaled(Scale::Per(MIB), Round::Whole),
        ),
    mem_free_bytes => MemFreeBytes: MetricDef::gauge(Unit::Bytes, Vendors::ALL)
        .format(IN_GIB)
        .trace("memory MiB", "free", Scale::Per(MIB), Round::Whole)
        .prometheus(
            Prometheus::new(series::DCGM_FI_DEV_FB_FREE, "Framebuffer memory free (in MiB).")
                .scaled(Scale::Per(MIB), Round::Whole),
        ),
    mem_total_bytes => MemTotalBytes: MetricDef::gauge(Unit::Bytes, Vendors::ALL)
        .format(IN_GIB)
        .device(|d| d.memory_total_bytes.map(|b| b as f64)),
    // No GPU board draws 5 kW; the largest draw about 1.2 kW.
    power_w => PowerW: MetricDef::gauge(Unit::Watts, Vendors::ALL)
        .plausible(0.0, 5000.0)
        .text(2, "power {} / {power_limit_w| W} (mean {mean| W})")
        .chart(Chart::Power, Scale::One)
        .trace("power W", "draw", Scale::One, Round::Tenth)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_POWER_USAGE, "Power draw (in W).")),
    power_limit_w => PowerLimitW: MetricDef::gauge(Unit::Watts, Vendors::ALL)
        .plausible(0.0, 5000.0)
        .trace("power W", "limit", Scale::One, Round::Tenth)
        .prometheus(Prometheus::new(series::GPUDIAG_POWER_LIMIT_WATTS, "Enforced power limit (W).")),
    energy_j => EnergyJ: MetricDef::counter(Unit::Joules, Vendors::ALL)
        .plausible(0.0, f64::INFINITY)
        .prometheus(
            Prometheus::new(
                series::DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
                "Total energy consumption since boot (in mJ).",
            )
            .scaled(Scale::Times(1000.0), Round::Whole),
        ),
    // Silicon does not run below -40 °C, and every GPU shuts down far below 200 °C.
    temp_gpu_c => TempGpuC: MetricDef::gauge(Unit::Celsius, Vendors::ALL)
        .plausible(-40.0, 200.0)
        .text(2, "temp {| °C} (slowdown {temp_slowdown_c| °C})")
        .chart(Chart::Temperature, Scale::One)
        .trace("temp C", "gpu", Scale::One, Round::Tenth)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_GPU_TEMP, "GPU temperature (in C).")),
    temp_mem_c => TempMemC: MetricDef::gauge(Unit::Celsius, Vendors::ALL)
        .plausible(-40.0, 200.0)
        .chart(Chart::Temperature, Scale::One)
        .trace("temp C", "memory", Scale::One, Round::Tenth)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_MEMORY_TEMP, "Memory temperature (in C).")),
    temp_slowdown_c: MetricDef::gauge(Unit::Celsius, Vendors::ALL)
        .plausible(-40.0, 200.0)
        .device(|d| d.temp_slowdown_c)
        .prometheus(Prometheus::new(
            series::GPUDIAG_TEMPERATURE_SLOWDOWN_CELSIUS,
            "Temperature at which the GPU slows down (in C).",
        )),
    temp_shutdown_c: MetricDef::gauge(Unit::Celsius, Vendors::ALL)
        .plausible(-40.0, 200.0)
        .device(|d| d.temp_shutdown_c),
    // Well above any clock shipped (about 3 GHz SM, 10 GHz effective memory).
    sm_clock_mhz => SmClockMhz: MetricDef::gauge(Unit::Megahertz, Vendors::ALL)
        .plausible(0.0, 100_000.0)
        .text(3, "SM clock {} / {sm_clock_max_mhz| MHz}")
        .chart(Chart::Clocks, Scale::One)
        .trace("clocks MHz", "sm", Scale::One, Round::Exact)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_SM_CLOCK, "SM clock frequency (in MHz).")),
    mem_clock_mhz => MemClockMhz: MetricDef::gauge(Unit::Megahertz, Vendors::ALL)
        .plausible(0.0, 100_000.0)
        .text(3, "memory clock {} / {mem_clock_max_mhz| MHz}")
        .chart(Chart::Clocks, Scale::One)
        .trace("clocks MHz", "memory", Scale::One, Round::Exact)
        .prometheus(Prometheus::new(
            series::DCGM_FI_DEV_MEM_CLOCK,
            "Memory clock frequency (in MHz).",
        )),
    sm_clock_max_mhz: MetricDef::gauge(Unit::Megahertz, Vendors::ALL)
        .plausible(0.0, 100_000.0)
        .device(|d| d.sm_clock_max_mhz.map(f64::from)),
    mem_clock_max_mhz: MetricDef::gauge(Unit::Megahertz, Vendors::ALL)
        .plausible(0.0, 100_000.0)
        .device(|d| d.mem_clock_max_mhz.map(f64::from)),
    // P0..P15 (32 is NVML's "unknown", which the backend maps away).
    pstate => Pstate: MetricDef::gauge(Unit::Count, Vendors::NVIDIA)
        .plausible(0.0, 15.0)
        .text(3, "P-state {P<}")
        .prometheus(Prometheus::new(
            series::GPUDIAG_PERFORMANCE_STATE,
            "Performance state (0 is P0, fastest).",
        )),
    // Exported and traced per reason, decoded (`decode::THROTTLE_REASONS`), not as a number.
    throttle_reasons => ThrottleReasons: MetricDef::gauge(Unit::Count, Vendors::NVIDIA),
    throttle_sw_power_cap_s: THROTTLE_SECONDS
        .trace("throttle s", "sw_power_cap", Scale::One, Round::Tenth)
        .prometheus(THROTTLE_SECONDS_TOTAL.labelled(label::REASON, "sw_power_cap")),
    throttle_sync_boost_s: THROTTLE_SECONDS
        .trace("throttle s", "sync_boost", Scale::One, Round::Tenth)
        .prometheus(THROTTLE_SECONDS_TOTAL.labelled(label::REASON, "sync_boost")),
    throttle_sw_thermal_slowdown_s: THROTTLE_SECONDS
        .trace("throttle s", "sw_thermal_slowdown", Scale::One, Round::Tenth)
        .prometheus(THROTTLE_SECONDS_TOTAL.labelled(label::REASON, "sw_thermal_slowdown")),
    throttle_hw_thermal_slowdown_s: THROTTLE_SECONDS
        .trace("throttle s", "hw_thermal_slowdown", Scale::One, Round::Tenth)
        .prometheus(THROTTLE_SECONDS_TOTAL.labelled(label::REASON, "hw_thermal_slowdown")),
    throttle_hw_power_brake_slowdown_s: THROTTLE_SECONDS
        .trace("throttle s", "hw_power_brake_slowdown", Scale::One, Round::Tenth)
        .prometheus(THROTTLE_SECONDS_TOTAL.labelled(label::REASON, "hw_power_brake_slowdown")),
    pcie_gen => PcieGen: MetricDef::gauge(Unit::Count, Vendors::ALL)
        .plausible(0.0, 16.0)
        .text(
            4,
            "PCIe {Gen<} {x<pcie_width} (max {Gen<pcie_gen_max} {x<pcie_width_max})",
        )
        .prometheus(Prometheus::new(
            series::GPUDIAG_PCIE_LINK_GENERATION,
            "Current PCIe link generation.",
        )),
    pcie_width => PcieWidth: MetricDef::gauge(Unit::Lanes, Vendors::ALL)
        .plausible(0.0, 64.0)
        .prometheus(Prometheus::new(
            series::GPUDIAG_PCIE_LINK_WIDTH,
            "Current PCIe link width (lanes).",
        )),
    pcie_gen_max: MetricDef::gauge(Unit::Count, Vendors::ALL)
        .device(|d| d.pcie_gen_max.map(f64::from))
        .prometheus(Prometheus::new(
            series::GPUDIAG_PCIE_LINK_GENERATION_MAX,
            "Maximum PCIe link generation.",
        )),
    pcie_width_max: MetricDef::gauge(Unit::Lanes, Vendors::ALL)
        .device(|d| d.pcie_width_max.map(f64::from))
        .prometheus(Prometheus::new(
            series::GPUDIAG_PCIE_LINK_WIDTH_MAX,
            "Maximum PCIe link width (lanes).",
        )),
    // PCIe Gen6 x16 carries about 128 GB/s; ten times that is not a reading. NVIDIA only: on
    // AMD, amdgpu's pcie_bw and ROCm SMI's throughput call sleep a second per read.
    pcie_rx_bytes_per_s => PcieRxBytesPerS: MetricDef::gauge(Unit::BytesPerSecond, Vendors::NVIDIA)
        .plausible(0.0, 1.28e12)
        .format(Format::Rate)
        .text(4, "rx {}")
        .chart(Chart::Pcie, Scale::Times(1e-9))
        .trace("PCIe MB/s", "rx", Scale::Per(1e6), Round::Tenth)
        .prometheus(Prometheus::new(
            series::GPUDIAG_PCIE_RX_BYTES_PER_SECOND,
            "PCIe receive throughput (bytes/s), as NVML measures it over about 20 ms.",
        )),
    pcie_tx_bytes_per_s => PcieTxBytesPerS: MetricDef::gauge(Unit::BytesPerSecond, Vendors::NVIDIA)
        .plausible(0.0, 1.28e12)
        .format(Format::Rate)
        .text(4, "tx {}")
        .chart(Chart::Pcie, Scale::Times(1e-9))
        .trace("PCIe MB/s", "tx", Scale::Per(1e6), Round::Tenth)
        .prometheus(Prometheus::new(
            series::GPUDIAG_PCIE_TX_BYTES_PER_SECOND,
            "PCIe transmit throughput (bytes/s), as NVML measures it over about 20 ms.",
        )),
    pcie_replay_count => PcieReplayCount: MetricDef::counter(Unit::Count, Vendors::ALL)
        .text(4, "replays {}")
        .prometheus(Prometheus::new(
            series::DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
            "Total number of PCIe retries.",
        )),
    ecc_corrected_volatile => EccCorrectedVolatile: MetricDef::counter(Unit::Count, Vendors::ALL)
        .text(
            5,
            "ECC volatile {| corrected} / {ecc_uncorrected_volatile| uncorrected}",
        )
        .prometheus(Prometheus::new(
            series::DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
            "Total number of single-bit volatile ECC errors.",
        )),
    ecc_uncorrected_volatile => EccUncorrectedVolatile:
        MetricDef::counter(Unit::Count, Vendors::ALL).prometheus(Prometheus::new(
            series::DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
            "Total number of double-bit volatile ECC errors.",
        )),
    ecc_corrected_aggregate: MetricDef::counter(Unit::Count, Vendors::NVIDIA).prometheus(
        Prometheus::new(
            series::DCGM_FI_DEV_ECC_SBE_AGG_TOTAL,
            "Total number of single-bit persistent ECC errors.",
        ),
    ),
    ecc_uncorrected_aggregate: MetricDef::counter(Unit::Count, Vendors::NVIDIA).prometheus(
        Prometheus::new(
            series::DCGM_FI_DEV_ECC_DBE_AGG_TOTAL,
            "Total number of double-bit persistent ECC errors.",
        ),
    ),
    retired_pages_sbe: MetricDef::counter(Unit::Count, Vendors::NVIDIA).prometheus(
        Prometheus::new(
            series::DCGM_FI_DEV_RETIRED_SBE,
            "Total number of retired pages due to single-bit errors.",
        ),
    ),
    retired_pages_dbe: MetricDef::counter(Unit::Count, Vendors::NVIDIA).prometheus(
        Prometheus::new(
            series::DCGM_FI_DEV_RETIRED_DBE,
            "Total number of retired pages due to double-bit errors.",
        ),
    ),
    retired_pages_pending: MetricDef::gauge(Unit::Flag, Vendors::ALL).format(Format::Flag),
    remapped_rows_correctable: MetricDef::counter(Unit::Count, Vendors::NVIDIA).prometheus(
        Prometheus::new(
            series::DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
            "Number of remapped rows for correctable errors",
        ),
    ),
    remapped_rows_uncorrectable => RemappedRowsUncorrectable:
        MetricDef::counter(Unit::Count, Vendors::NVIDIA).prometheus(Prometheus::new(
            series::DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
            "Number of remapped rows for uncorrectable errors",
        )),
    remapped_rows_pending: MetricDef::gauge(Unit::Flag, Vendors::NVIDIA)
        .format(Format::Flag)
        .text(5, "remap pending {}"),
    remapped_rows_failure: MetricDef::gauge(Unit::Flag, Vendors::NVIDIA)
        .format(Format::Flag)
        .prometheus(Prometheus::new(
            series::DCGM_FI_DEV_ROW_REMAP_FAILURE,
            "Whether remapping of rows has failed",
        )),
    fan_pct => FanPct: MetricDef::gauge(Unit::Percent, Vendors::ALL)
        .plausible(0.0, 100.0)
        .text(2, "fan {|%}")
        .prometheus(Prometheus::new(series::GPUDIAG_FAN_SPEED_PERCENT, "Fan speed (in %).")),
    encoder_util_pct => EncoderUtilPct: MetricDef::gauge(Unit::Percent, Vendors::NVIDIA)
        .plausible(0.0, 100.0)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_ENC_UTIL, "Encoder utilization (in %).")),
    decoder_util_pct => DecoderUtilPct: MetricDef::gauge(Unit::Percent, Vendors::NVIDIA)
        .plausible(0.0, 100.0)
        .prometheus(Prometheus::new(series::DCGM_FI_DEV_DEC_UTIL, "Decoder utilization (in %).")),
    // Profiling counters: percentages here, ratios 0-1 under dcgm-exporter's names.
    gr_engine_active_pct => GrEngineActivePct: MetricDef::gauge(Unit::Percent, Vendors::ALL)
        .plausible(0.0, 100.0)
        .format(ONE_DECIMAL)
        .chart(Chart::Profile, Scale::One)
        .trace("profiling %", "gr_engine", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_GR_ENGINE_ACTIVE,
            "Ratio of time the graphics engine is active.",
        )),
    sm_active_pct => SmActivePct: PROFILED_SHARE
        .text(6, "SM active {|%} (mean {mean|%})")
        .chart(Chart::Profile, Scale::One)
        .trace("profiling %", "sm_active", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_SM_ACTIVE,
            "The ratio of cycles an SM has at least 1 warp assigned.",
        )),
    sm_occupancy_pct => SmOccupancyPct: PROFILED_SHARE
        .text(6, "occupancy {|%} (mean {mean|%})")
        .chart(Chart::Profile, Scale::One)
        .trace("profiling %", "sm_occupancy", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_SM_OCCUPANCY,
            "The ratio of number of warps resident on an SM.",
        )),
    tensor_active_pct => TensorActivePct: PROFILED_SHARE
        .text(6, "tensor {|%} (mean {mean|%})")
        .chart(Chart::Profile, Scale::One)
        .trace("profiling %", "tensor", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
            "Ratio of cycles the tensor (HMMA) pipe is active.",
        )),
    tensor_hmma_active_pct: PROFILED_SHARE
        .trace("profiling %", "tensor_hmma", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE,
            "Ratio of cycles the HMMA tensor pipe is active.",
        )),
    tensor_imma_active_pct: PROFILED_SHARE
        .trace("profiling %", "tensor_imma", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE,
            "Ratio of cycles the IMMA tensor pipe is active.",
        )),
    tensor_dfma_active_pct: PROFILED_SHARE
        .trace("profiling %", "tensor_dfma", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE,
            "Ratio of cycles the FP64 tensor pipe is active.",
        )),
    dram_active_pct => DramActivePct: MetricDef::gauge(Unit::Percent, Vendors::ALL)
        .plausible(0.0, 100.0)
        .format(ONE_DECIMAL)
        .text(6, "DRAM {|%} (mean {mean|%})")
        .chart(Chart::Profile, Scale::One)
        .trace("profiling %", "dram", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_DRAM_ACTIVE,
            "Ratio of cycles the device memory interface is active sending or receiving data.",
        )),
    fp64_active_pct => Fp64ActivePct: PROFILED_SHARE
        .trace("profiling %", "fp64", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_FP64_ACTIVE,
            "Ratio of cycles the fp64 pipes are active.",
        )),
    fp32_active_pct => Fp32ActivePct: PROFILED_SHARE
        .text(6, "FP32 {|%}")
        .trace("profiling %", "fp32", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_FP32_ACTIVE,
            "Ratio of cycles the fp32 pipes are active.",
        )),
    fp16_active_pct => Fp16ActivePct: PROFILED_SHARE
        .trace("profiling %", "fp16", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_FP16_ACTIVE,
            "Ratio of cycles the fp16 pipes are active.",
        )),
    int_active_pct: PROFILED_SHARE
        .trace("profiling %", "int", Scale::One, Round::Tenth)
        .prometheus(ratio(
            series::DCGM_FI_PROF_PIPE_INT_ACTIVE,
            "Ratio of cycles the integer pipe is active.",
        )),
    prof_pcie_rx_bytes_per_s => ProfPcieRxBytesPerS: PROFILED_RATE
        .trace("profiling PCIe MB/s", "rx", Scale::Per(1e6), Round::Tenth)
        .prometheus(Prometheus::new(
            series::DCGM_FI_PROF_PCIE_RX_BYTES,
            "The rate of data received over the PCIe bus - including both protocol headers and \
             data payloads - in bytes per second.",
        )),
    prof_pcie_tx_bytes_per_s => ProfPcieTxBytesPerS: PROFILED_RATE
        .trace("profiling PCIe MB/s", "tx", Scale::Per(1e6), Round::Tenth)
        .prometheus(Prometheus::new(
            series::DCGM_FI_PROF_PCIE_TX_BYTES,
            "The rate of data transmitted over the PCIe bus - including both protocol headers \
             and data payloads - in bytes per second.",
        )),
    nvlink_rx_bytes_per_s => NvlinkRxBytesPerS: PROFILED_RATE
        .trace("NVLink MB/s", "rx", Scale::Per(1e6), Round::Tenth)
        .prometheus(Prometheus::new(
            series::DCGM_FI_PROF_NVLINK_RX_BYTES,
            "The rate of data received over NVLink, not including protocol headers, in bytes \
             per second.",
        )),
    nvlink_tx_bytes_per_s => NvlinkTxBytesPerS: PROFILED_RATE
        .trace("NVLink MB/s", "tx", Scale::Per(1e6), Round::Tenth)
        .prometheus(Prometheus::new(
            series::DCGM_FI_PROF_NVLINK_TX_BYTES,
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes \
             per second.",
        )),
}

/// The profiling counters: read from two NVML GPM samples, so a single read has none.
pub const PROFILING_FIELDS: &[&str] = &[
    "gr_engine_active_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "tensor_hmma_active_pct",
    "tensor_imma_active_pct",
    "tensor_dfma_active_pct",
    "dram_active_pct",
    "fp64_active_pct",
    "fp32_active_pct",
    "fp16_active_pct",
    "int_active_pct",
    "prof_pcie_rx_bytes_per_s",
    "prof_pcie_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
];

/// A profiling counter's share of the interval. NVIDIA only: AMD has engine and memory-controller
/// activity alone (`gr_engine_active_pct`, `dram_active_pct`, declared for all vendors).
const PROFILED_SHARE: MetricDef = MetricDef::gauge(Unit::Percent, Vendors::NVIDIA)
    .plausible(0.0, 100.0)
    .format(ONE_DECIMAL);

/// Small shares (one warp on one SM is 0.8% SM active) need a decimal to read as not zero.
const ONE_DECIMAL: Format = Format::Fixed {
    decimals: 1,
    scale: Scale::One,
};

/// A profiling byte rate. NVLink 5 carries 1.8 TB/s per GPU; ten times that is not a reading.
const PROFILED_RATE: MetricDef = MetricDef::gauge(Unit::BytesPerSecond, Vendors::NVIDIA)
    .plausible(0.0, 1.8e13)
    .format(Format::Rate);

/// A dcgm-exporter profiling series: a ratio 0-1 where gpudiag keeps a percentage.
const fn ratio(name: &'static str, help: &'static str) -> Prometheus {
    Prometheus::new(name, help).scaled(Scale::Per(100.0), Round::Exact)
}

/// A clock-event duration: time held down for one reason, counted by the driver. Not a history
/// series: no rule reads it yet, and the history's memory budget is sized for today's series.
const THROTTLE_SECONDS: MetricDef =
    MetricDef::counter(Unit::Seconds, Vendors::NVIDIA).plausible(0.0, f64::INFINITY);

/// One family for all reasons, labelled like `gpudiag_throttle_reason`.
const THROTTLE_SECONDS_TOTAL: Prometheus = Prometheus::new(
    series::GPUDIAG_THROTTLE_SECONDS_TOTAL,
    "Seconds the clocks were held down for this clock-event (throttle) reason since the driver \
     loaded.",
);

/// Bytes as GiB with one decimal.
const IN_GIB: Format = Format::Fixed {
    decimals: 1,
    scale: Scale::Per(GIB),
};

/// `Sample` fields that hold lists rather than one value, so the table leaves them out.
pub const LIST_FIELDS: [&str; 3] = ["throttle_reason_names", "processes", "gpu_pods"];

/// Where each series sits in `METRIC_TABLE`.
const SERIES_AT: [usize; Metric::COUNT] = {
    let mut at = [0; Metric::COUNT];
    let mut i = 0;
    while i < METRIC_TABLE.len() {
        if let Some(m) = METRIC_TABLE[i].series {
            at[m as usize] = i;
        }
        i += 1;
    }
    at
};

impl Metric {
    /// The serde name, which is also the `Sample` field name.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// The series' entry in the metric table.
    pub fn def(self) -> &'static MetricDef {
        &METRIC_TABLE[SERIES_AT[self as usize]]
    }
}

impl Sample {
    /// An empty sample for `device` at `time_ms`: every value absent.
    pub fn new(device: u32, time_ms: TimeMs) -> Self {
        Sample {
            time_ms,
            device,
            ..Sample::default()
        }
    }

    /// Copies the device's static thresholds and maxima into the sample (with their reasons when
    /// absent), so each sample stands alone for rules and exports, whatever backend made it.
    pub fn copy_static_from(&mut self, info: &DeviceInfo) {
        fn copy<T: Copy>(
            v: Option<T>,
            field: &str,
            info: &DeviceInfo,
            ab: &mut AbsentMap,
        ) -> Option<T> {
            if v.is_none() {
                let why = info
                    .absent
                    .get(field)
                    .cloned()
                    .unwrap_or(Absent::Unavailable);
                ab.insert(field.into(), why);
            }
            v
        }
        let ab = &mut self.absent;
        self.temp_slowdown_c = copy(info.temp_slowdown_c, "temp_slowdown_c", info, ab);
        self.temp_shutdown_c = copy(info.temp_shutdown_c, "temp_shutdown_c", info, ab);
        self.sm_clock_max_mhz = copy(info.sm_clock_max_mhz, "sm_clock_max_mhz", info, ab);
        self.mem_clock_max_mhz = copy(info.mem_clock_max_mhz, "mem_clock_max_mhz", info, ab);
        self.pcie_gen_max = copy(info.pcie_gen_max, "pcie_gen_max", info, ab);
        self.pcie_width_max = copy(info.pcie_width_max, "pcie_width_max", info, ab);
    }

    /// Why `field` is absent, if the backend said.
    pub fn why_absent(&self, field: &str) -> Option<&Absent> {
        self.absent.get(field)
    }
}

/// Something that happened at an instant rather than a value polled each tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Event {
    pub time_ms: TimeMs,
    /// Device index, when the event belongs to one device.
    pub device: Option<u32>,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// An NVIDIA XID error reported by the driver.
    Xid {
        /// The XID code.
        xid: u64,
    },
    /// The device stopped answering (GPU lost) or could not be read.
    DeviceLost { reason: String },
    /// A backend-level notice worth keeping in a recording (e.g. a slow call timed out).
    Notice { message: String },
}

/// Host-level facts a backend knows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct HostInfo {
    /// Host name (redactable).
    pub hostname: Option<String>,
    /// NVIDIA driver version, e.g. "580.65.06".
    pub driver_version: Option<String>,
    /// The newest CUDA version the driver supports, e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
}

/// Wall-clock now in milliseconds since the Unix epoch, never going backwards within a process:
/// a clock stepped back (NTP) would otherwise make the history refuse points until it caught up.
pub fn now_ms() -> TimeMs {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as TimeMs)
        .unwrap_or_default();
    LAST.fetch_max(wall, Ordering::Relaxed).max(wall)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::metric_table::{Piece, pieces};

    fn serde_keys() -> Vec<String> {
        let v = serde_json::to_value(Sample::new(0, 0)).unwrap_or_default();
        let mut keys: Vec<String> = v
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        keys.retain(|k| k != "time_ms" && k != "device");
        keys
    }

    /// A process run as root in a Slurm job of `demo` (as the bundled demo recorded it) is
    /// `demo`'s; outside a job, or in one whose user is unknown, it is the user it runs as.
    #[test]
    fn a_process_is_charged_to_its_jobs_user_else_its_own() {
        let mut p: ProcessSample = serde_json::from_value(serde_json::json!({
            "pid": 477, "name": "python3", "user": "root", "kind": "compute",
            "used_memory_bytes": 1, "sm_util_pct": null, "container_id": null,
            "attribution": {
                "job": {"id": "4242", "step": null, "user": "demo", "found_in": "environ"},
                "pod": null
            }
        }))
        .unwrap();
        assert_eq!(p.charged_user(), Some("demo"));
        if let Some(job) = p.attribution.as_mut().and_then(|a| a.job.as_mut()) {
            job.user = None;
        }
        assert_eq!(p.charged_user(), Some("root"));
        p.attribution = None;
        assert_eq!(p.charged_user(), Some("root"));
        p.user = None;
        assert_eq!(p.charged_user(), None);
    }

    /// A real line of a python rank (pid 4553) asleep, its name holding a space and a ')'.
    const STAT: &str = "4553 (pt_main) thread) S 4500 4553 4500 0 -1 4194560 100 0 0 0 \
                        1234 56 0 0 20 0 12 0 987654 1000000 2000 18446744073709551615";

    #[test]
    fn the_state_and_the_start_are_read_after_the_name() {
        assert_eq!(stat_state(STAT), Some(ProcessState::Sleeping));
        assert_eq!(stat_cpu_time_s(STAT), Some(12.9));
        // Booted at 1_700_000_000 s; started 9876.54 s later.
        assert_eq!(
            stat_started_ms(STAT, 1_700_000_000),
            Some(1_700_000_000_000 + 9_876_540)
        );
        assert_eq!(stat_state("1 (x) T 0"), Some(ProcessState::Stopped));
        assert_eq!(stat_state("1 (x) t 0"), Some(ProcessState::Stopped));
        assert_eq!(stat_state("1 (x) Z 0"), Some(ProcessState::Zombie));
        assert_eq!(stat_state("1 (x) ? 0"), None);
        assert_eq!(stat_state("1 (x) RS 0"), None);
        assert_eq!(stat_state("no parenthesis"), None);
        assert_eq!(stat_started_ms("1 (x) S 0", 1), None);
        assert_eq!(stat_started_ms(STAT, u64::MAX), None);
    }

    #[test]
    fn a_state_this_gpudiag_does_not_know_reads_as_other() {
        let p: ProcessSample =
            serde_json::from_str(r#"{"pid":7,"name":null,"user":null,"kind":null,"used_memory_bytes":null,"sm_util_pct":null,"container_id":null,"state":"parked"}"#)
                .unwrap();
        assert_eq!(p.state, Some(ProcessState::Other));
    }

    #[test]
    fn the_boot_time_is_btime() {
        assert_eq!(
            proc_stat_boot_time_s("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        assert_eq!(proc_stat_boot_time_s("cpu 1\n"), None);
    }

    #[test]
    fn the_table_declares_every_value_field_once() {
        let table: Vec<&str> = METRIC_TABLE.iter().map(|m| m.name).collect();
        let unique: BTreeSet<&str> = table.iter().copied().collect();
        assert_eq!(unique.len(), table.len(), "a field is declared twice");
        let mut covered: BTreeSet<String> = unique.iter().map(|s| s.to_string()).collect();
        covered.extend(LIST_FIELDS.iter().map(|s| s.to_string()));
        let keys: BTreeSet<String> = serde_keys().into_iter().collect();
        assert_eq!(covered, keys);
    }

    #[test]
    fn series_are_named_after_their_fields() {
        assert_eq!(Metric::ALL.len(), Metric::COUNT);
        for (i, m) in Metric::ALL.into_iter().enumerate() {
            assert_eq!(m as usize, i);
            assert_eq!(m.def().series, Some(m));
            assert_eq!(serde_json::to_value(m).ok(), Some(m.name().into()));
        }
        let series = METRIC_TABLE.iter().filter(|m| m.series.is_some()).count();
        assert_eq!(series, Metric::COUNT);
    }

    #[test]
    fn accessors_read_and_write_their_own_field() {
        for m in METRIC_TABLE {
            let mut s = Sample::new(0, 0);
            let one = 1.0;
            assert_eq!(m.set(&mut s, Some(one)), Ok(()), "{}", m.name);
            assert_eq!(m.get(&s), Some(one), "{}", m.name);
            let json = serde_json::to_value(&s).unwrap_or_default();
            let expected = match m.repr {
                Repr::Bool => serde_json::json!(true),
                Repr::F64 => serde_json::json!(1.0),
                Repr::U64 | Repr::U32 => serde_json::json!(1),
            };
            assert_eq!(json[m.name], expected, "{}", m.name);
            assert_eq!(m.set(&mut s, None), Ok(()));
            assert_eq!(m.get(&s), None);
        }
    }

    #[test]
    fn templates_name_only_fields_of_the_table() {
        let check = |template: &str, own: &[&str]| {
            for p in pieces(template) {
                if let Piece::Value { name, .. } = p {
                    assert!(
                        own.contains(&name) || by_name(name).is_some(),
                        "{{{name}}} in {template:?}"
                    );
                }
            }
        };
        for m in METRIC_TABLE {
            if let Some(t) = m.text {
                let stats: &[&str] = if m.series.is_some() {
                    &["", "mean", "max"]
                } else {
                    &[""]
                };
                check(t.template, stats);
            }
        }
        for c in Chart::ALL {
            check(c.title(), &["ceiling"]);
            assert!(c.fields().next().is_some(), "{c:?} plots nothing");
            // Charts plot the history, which keeps series only.
            assert!(c.fields().all(|m| m.series.is_some()), "{c:?}");
            if let Ceiling::Field(name, _) = c.ceiling() {
                assert!(by_name(name).is_some(), "{name}");
            }
        }
    }

    #[test]
    fn amd_backends_mark_nvidia_concepts_unavailable() {
        let amd: BTreeSet<&str> = unavailable_on(Vendor::Amd).collect();
        for nvidia_only in [
            "pstate",
            "throttle_reasons",
            "throttle_reason_names",
            "pcie_rx_bytes_per_s",
            "pcie_tx_bytes_per_s",
            "ecc_corrected_aggregate",
            "ecc_uncorrected_aggregate",
            "retired_pages_sbe",
            "retired_pages_dbe",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
            "encoder_util_pct",
            "decoder_util_pct",
        ] {
            assert!(amd.contains(nvidia_only), "{nvidia_only}");
        }
        for read_on_amd in [
            "gpu_util_pct",
            "energy_j",
            "retired_pages_pending",
            "processes",
        ] {
            assert!(!amd.contains(read_on_amd), "{read_on_amd}");
        }
        assert_eq!(unavailable_on(Vendor::Nvidia).count(), 0);
    }

    #[test]
    fn prometheus_families_agree_on_type_and_help() {
        for a in METRIC_TABLE {
            for b in METRIC_TABLE {
                let (Some(pa), Some(pb)) = (a.prometheus, b.prometheus) else {
                    continue;
                };
                if pa.name == pb.name && a.name != b.name {
                    assert_eq!((a.kind, pa.help), (b.kind, pb.help), "{}", pa.name);
                    assert!(pa.label.is_some() && pa.label != pb.label, "{}", pa.name);
                }
            }
        }
    }
}
