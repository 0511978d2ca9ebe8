//! The metric table's vocabulary. Each telemetry field of a `Sample` is declared once, in the
//! table beside the struct (`sample::METRICS`), with what it measures, what values are
//! plausible, which vendors' backends read it and how every view shows it. Sanity checks, fault
//! injection, history, summaries and the exporters iterate that table instead of naming fields,
//! so a new metric is a table entry plus a backend read. `MetricDef`, the macro that builds the
//! table and the lookups over it sit in `sample.rs` beside `Sample`, because each of them names
//! it; this module names nothing of the table, so the two do not depend on each other.
//!
//! Views that compose several fields into one line (the check text, the Detail panel's chart
//! titles) do it with small templates: `{}` is the entry's own value, `{field}` another field's,
//! and `|unit` inside the braces is written only after a value that is present ("97%" but
//! "n/a"). A view may add names of its own (`{mean}`, `{ceiling}`).

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
pub const MIB: f64 = 1024.0 * 1024.0;

/// What every view writes for a value that is absent.
pub const NOT_AVAILABLE: &str = "n/a";

/// How a field is stored in `Sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    F64,
    U64,
    U32,
    Bool,
}

/// What a field measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Percent,
    Bytes,
    BytesPerSecond,
    Watts,
    Joules,
    Celsius,
    Megahertz,
    Seconds,
    Lanes,
    /// A count, a level (P-state, PCIe generation) or a bit mask.
    Count,
    Flag,
}

impl Unit {
    /// The symbol a message puts after a value ("1e9 °C"); empty for plain numbers.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Percent => "%",
            Unit::Bytes => "B",
            Unit::BytesPerSecond => "B/s",
            Unit::Watts => "W",
            Unit::Joules => "J",
            Unit::Celsius => "°C",
            Unit::Megahertz => "MHz",
            Unit::Seconds => "s",
            Unit::Lanes => "lanes",
            Unit::Count | Unit::Flag => "",
        }
    }
}

/// Whether a value stands alone or accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Grows until the driver reloads: a value below the last one seen is not a reading.
    Counter,
}

/// The vendors whose backends can read a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vendors {
    pub nvidia: bool,
    pub amd: bool,
}

impl Vendors {
    pub const ALL: Vendors = Vendors {
        nvidia: true,
        amd: true,
    };
    pub const NVIDIA: Vendors = Vendors {
        nvidia: true,
        amd: false,
    };

    pub fn has(self, vendor: Vendor) -> bool {
        match vendor {
            Vendor::Nvidia => self.nvidia,
            Vendor::Amd => self.amd,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// The range a working sensor or driver can report, both ends included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plausible {
    pub min: f64,
    pub max: f64,
}

impl Plausible {
    /// Whether `v` is a reading (NaN and infinities never are).
    pub fn admits(self, v: f64) -> bool {
        v.is_finite() && (self.min..=self.max).contains(&v)
    }
}

/// A unit conversion. Division and multiplication are kept apart because a view's numbers must
/// not change in the last bit when it moves to the table (x / 1e6 is not x * 1e-6).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    One,
    Per(f64),
    Times(f64),
}

impl Scale {
    pub fn apply(self, v: f64) -> f64 {
        match self {
            Scale::One => v,
            Scale::Per(d) => v / d,
            Scale::Times(k) => v * k,
        }
    }
}

/// Rounding after a conversion: it keeps exported numbers short, and in a trace it is what
/// makes an unchanged value compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    Exact,
    Whole,
    Tenth,
}

impl Round {
    pub fn apply(self, v: f64) -> f64 {
        match self {
            Round::Exact => v,
            Round::Whole => v.round(),
            Round::Tenth => (v * 10.0).round() / 10.0,
        }
    }
}

/// How the check text and the terminal UI write a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    /// `decimals` places after `scale` ("1.5" GiB for bytes with `Scale::Per(GIB)`).
    Fixed { decimals: usize, scale: Scale },
    /// A throughput in bytes per second, each view in its own compact style.
    Rate,
    /// `true` or `false`.
    Flag,
}

impl Format {
    /// `v` as text, `unit` after it, or "n/a"; a rate is written by the view's `rate`.
    pub fn show(self, v: Option<f64>, unit: &str, rate: fn(f64) -> String) -> String {
        let Some(v) = v else {
            return NOT_AVAILABLE.to_owned();
        };
        match self {
            Format::Fixed { decimals, scale } => format!("{:.decimals$}{unit}", scale.apply(v)),
            Format::Rate => format!("{}{unit}", rate(v)),
            Format::Flag => format!("{}{unit}", v != 0.0),
        }
    }
}

/// Where a field appears in the check text: on `line` (1 is the first under the device's
/// heading), as `template` says; items of a line keep table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text {
    pub line: u8,
    /// May use `{mean}` and `{max}`: the field's window statistics.
    pub template: &'static str,
}

/// The Detail panel's charts, in the order they fill its grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    Util,
    Memory,
    Power,
    Temperature,
    Clocks,
    Pcie,
    /// The profiling counters: what the SMs, tensor pipes and DRAM did.
    Profile,
}

impl Chart {
    pub const ALL: [Chart; 7] = [
        Chart::Util,
        Chart::Memory,
        Chart::Power,
        Chart::Temperature,
        Chart::Clocks,
        Chart::Pcie,
        Chart::Profile,
    ];

    /// The chart's title; `{ceiling}` is the top of its axis, in the format of its first field.
    pub fn title(self) -> &'static str {
        match self {
            Chart::Util => "util {gpu_util_pct|%} · mem bw {mem_util_pct|%}",
            Chart::Memory => "memory {mem_used_bytes}/{ceiling} GiB",
            Chart::Power => "power {power_w}/{power_limit_w} W",
            Chart::Temperature => {
                "temp {temp_gpu_c|°C} · mem {temp_mem_c|°C} · slowdown {ceiling|°C}"
            }
            Chart::Clocks => "clocks SM {sm_clock_mhz} · mem {mem_clock_mhz} MHz",
            Chart::Pcie => "PCIe rx {pcie_rx_bytes_per_s} tx {pcie_tx_bytes_per_s} B/s",
            Chart::Profile => {
                "engine {gr_engine_active_pct|%} · SM {sm_active_pct|%} · occ \
                 {sm_occupancy_pct|%} · tensor {tensor_active_pct|%} · DRAM {dram_active_pct|%}"
            }
        }
    }
}

/// A field's series on a chart of the Detail panel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plot {
    pub chart: Chart,
    /// Into the unit of the y axis.
    pub scale: Scale,
}

/// A field's place in the Chrome trace: one series of a counter group (one `C` event per
/// group, named `group`, its series the args).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trace {
    pub group: &'static str,
    pub key: &'static str,
    pub scale: Scale,
    pub round: Round,
}

/// A field's Prometheus series; its type is the field's `Kind`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prometheus {
    pub name: &'static str,
    pub help: &'static str,
    pub scale: Scale,
    pub round: Round,
    /// A label that tells this field from the others of the same family.
    pub label: Option<(&'static str, &'static str)>,
}

impl Prometheus {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Prometheus {
            name,
            help,
            scale: Scale::One,
            round: Round::Exact,
            label: None,
        }
    }

    pub const fn scaled(mut self, scale: Scale, round: Round) -> Self {
        self.scale = scale;
        self.round = round;
        self
    }

    pub const fn labelled(mut self, key: &'static str, value: &'static str) -> Self {
        self.label = Some((key, value));
        self
    }
}

/// Why a number cannot be stored in a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrepresentable {
    /// An integer field was given a fraction, a negative number or a non-finite one.
    NotWhole,
    TooLarge,
    /// A flag takes 0 or 1.
    NotAFlag,
}

/// A type a `Sample` field can hold, seen as f64 by the table.
pub trait FieldValue: Copy {
    const REPR: Repr;
    /// Counters beyond 2^53 would lose precision, which no GPU counter reaches.
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Result<Self, Unrepresentable>;
}

impl FieldValue for f64 {
    const REPR: Repr = Repr::F64;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Result<Self, Unrepresentable> {
        Ok(v)
    }
}

impl FieldValue for u64 {
    const REPR: Repr = Repr::U64;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Result<Self, Unrepresentable> {
        if v.is_finite() && v >= 0.0 && v.fract() == 0.0 {
            Ok(v as u64)
        } else {
            Err(Unrepresentable::NotWhole)
        }
    }
}

impl FieldValue for u32 {
    const REPR: Repr = Repr::U32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Result<Self, Unrepresentable> {
        u32::try_from(u64::from_f64(v)?).map_err(|_| Unrepresentable::TooLarge)
    }
}

impl FieldValue for bool {
    const REPR: Repr = Repr::Bool;
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
    fn from_f64(v: f64) -> Result<Self, Unrepresentable> {
        if v == 0.0 {
            Ok(false)
        } else if v == 1.0 {
            Ok(true)
        } else {
            Err(Unrepresentable::NotAFlag)
        }
    }
}

/// One part of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Literal(&'a str),
    /// `{name|unit}`: `name` is empty for the entry's own value; `unit` follows a present value.
    Value {
        name: &'a str,
        unit: &'a str,
    },
}

/// Splits a template into literals and placeholders. A `{` without its `}` is literal text.
pub fn pieces(template: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        if open > 0 {
            out.push(Piece::Literal(&rest[..open]));
        }
        let inner = &rest[open + 1..open + len];
        let (name, unit) = inner.split_once('|').unwrap_or((inner, ""));
        out.push(Piece::Value { name, unit });
        rest = &rest[open + len + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Literal(rest));
    }
    out
}

/// Fills a template: `value(name, unit)` writes each placeholder.
pub fn expand(template: &str, mut value: impl FnMut(&str, &str) -> String) -> String {
    pieces(template)
        .into_iter()
        .map(|p| match p {
            Piece::Literal(s) => s.to_owned(),
            Piece::Value { name, unit } => value(name, unit),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_into_literals_and_values() {
        assert_eq!(
            pieces("util {}% (mean {mean|%})"),
            [
                Piece::Literal("util "),
                Piece::Value { name: "", unit: "" },
                Piece::Literal("% (mean "),
                Piece::Value {
                    name: "mean",
                    unit: "%"
                },
                Piece::Literal(")"),
            ]
        );
        assert_eq!(
            pieces("P{}"),
            [Piece::Literal("P"), Piece::Value { name: "", unit: "" }]
        );
        assert_eq!(pieces("a {b"), [Piece::Literal("a {b")]);
        assert_eq!(expand("x{y|!}z", |n, u| format!("<{n}{u}>")), "x<y!>z");
    }

    #[test]
    fn formats_never_write_0_for_absent() {
        let rate = |b: f64| format!("{b}B/s");
        let fixed = Format::Fixed {
            decimals: 1,
            scale: Scale::Per(GIB),
        };
        assert_eq!(fixed.show(Some(GIB * 1.5), " GiB", rate), "1.5 GiB");
        assert_eq!(fixed.show(None, " GiB", rate), "n/a");
        assert_eq!(Format::Rate.show(Some(3.0), "", rate), "3B/s");
        assert_eq!(Format::Flag.show(Some(1.0), "", rate), "true");
        assert_eq!(Format::Flag.show(Some(0.0), "", rate), "false");
    }

    #[test]
    fn conversions_keep_integers_whole() {
        assert_eq!(u64::from_f64(3.0), Ok(3));
        assert_eq!(u64::from_f64(-1.0), Err(Unrepresentable::NotWhole));
        assert_eq!(u64::from_f64(0.5), Err(Unrepresentable::NotWhole));
        assert_eq!(u64::from_f64(f64::NAN), Err(Unrepresentable::NotWhole));
        assert_eq!(u32::from_f64(5e9), Err(Unrepresentable::TooLarge));
        assert_eq!(bool::from_f64(1.0), Ok(true));
        assert_eq!(bool::from_f64(2.0), Err(Unrepresentable::NotAFlag));
        assert!(f64::from_f64(f64::NAN).is_ok_and(f64::is_nan));
    }

    #[test]
    fn scales_and_rounding() {
        assert_eq!(Scale::Per(MIB).apply(3.0 * MIB), 3.0);
        assert_eq!(Scale::Times(1000.0).apply(1.5), 1500.0);
        assert_eq!(Round::Tenth.apply(300.04), 300.0);
        assert_eq!(Round::Whole.apply(2.5), 3.0);
        assert_eq!(Round::Exact.apply(2.5), 2.5);
    }
}
