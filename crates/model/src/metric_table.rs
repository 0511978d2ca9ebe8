//! The metric table's vocabulary. Each telemetry field of a `Sample` is declared once, in the
//! table beside the struct (`sample::METRIC_TABLE`), with what it measures, what values are
//! plausible, which vendors' backends read it and how every view shows it. Sanity checks, fault
//! injection, history, summaries and the exporters iterate that table instead of naming fields,
//! so a new metric is a table entry plus a backend read. `MetricDef`, the macro that builds the
//! table and the lookups over it sit in `sample.rs` beside `Sample`, because each of them names
//! it; this module names nothing of the table, so the two do not depend on each other.
//!
//! Views that compose several fields into one line (the check text, the Detail panel's chart
//! titles) do it with small templates: `{}` is the entry's own value, `{field}` another field's,
//! `|unit` inside the braces is written only after a value that is present and `prefix<` only
//! before one (`{Gen<pcie_gen|}` is "Gen5" or "n/a", never "Genn/a"). Absent values that
//! follow each other with only spaces or slashes between them are written as one "n/a"
//! ("PCIe n/a", not "PCIe n/a n/a"). A view may add names of its own (`{mean}`, `{ceiling}`).

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
    /// `v` as text, without a unit (the template adds it); a rate is written by the view's
    /// `rate`. An absent value is the template's to write, so this takes only present ones.
    pub fn show(self, v: f64, rate: impl Fn(f64) -> String) -> String {
        match self {
            Format::Fixed { decimals, scale } => format!("{:.decimals$}", scale.apply(v)),
            Format::Rate => rate(v),
            Format::Flag => (v != 0.0).to_string(),
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
            Chart::Memory => "memory {mem_used_bytes}/{ceiling| GiB}",
            Chart::Power => "power {power_w}/{power_limit_w| W}",
            Chart::Temperature => {
                "temp {temp_gpu_c|°C} · mem {temp_mem_c|°C} · slowdown {ceiling|°C}"
            }
            Chart::Clocks => "clocks SM {sm_clock_mhz} · mem {mem_clock_mhz| MHz}",
            Chart::Pcie => "PCIe rx {pcie_rx_bytes_per_s} tx {pcie_tx_bytes_per_s| B/s}",
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
    /// `{prefix<name|unit}`: `name` is empty for the entry's own value; `prefix` and `unit`
    /// surround a present value and are left out with an absent one.
    Value {
        prefix: &'a str,
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
        let (prefix, name) = name.split_once('<').unwrap_or(("", name));
        out.push(Piece::Value { prefix, name, unit });
        rest = &rest[open + len + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Literal(rest));
    }
    out
}

/// Fills a template: `value(name)` is a placeholder's value as text, `None` when it is absent.
/// An absent value is written as "n/a" without its prefix or unit, and a run of them with only
/// spaces and slashes between as one "n/a".
pub fn expand(template: &str, mut value: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::new();
    // Where the "n/a" of the run of absent values being written ends.
    let mut absent_run: Option<usize> = None;
    for piece in pieces(template) {
        match piece {
            Piece::Literal(s) => {
                out.push_str(s);
                if !s.chars().all(|c| c == ' ' || c == '/') {
                    absent_run = None;
                }
            }
            Piece::Value { prefix, name, unit } => match (value(name), absent_run) {
                (Some(v), _) => {
                    out.push_str(prefix);
                    out.push_str(&v);
                    out.push_str(unit);
                    absent_run = None;
                }
                // The run's "n/a" stands for this one too: drop the separator before it.
                (None, Some(end)) => out.truncate(end),
                (None, None) => {
                    out.push_str(NOT_AVAILABLE);
                    absent_run = Some(out.len());
                }
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_into_literals_and_values() {
        assert_eq!(
            pieces("util {}% (mean {mean|%}) {Gen<pcie_gen_max}"),
            [
                Piece::Literal("util "),
                Piece::Value {
                    prefix: "",
                    name: "",
                    unit: ""
                },
                Piece::Literal("% (mean "),
                Piece::Value {
                    prefix: "",
                    name: "mean",
                    unit: "%"
                },
                Piece::Literal(") "),
                Piece::Value {
                    prefix: "Gen",
                    name: "pcie_gen_max",
                    unit: ""
                },
            ]
        );
        assert_eq!(pieces("a {b"), [Piece::Literal("a {b")]);
        assert_eq!(expand("x{p<y|!}z", |n| Some(format!("<{n}>"))), "xp<y>!z");
    }

    #[test]
    fn absent_values_drop_their_prefix_and_unit_and_runs_collapse() {
        let known = |n: &str| match n {
            "gen_max" => Some("5".to_owned()),
            "width_max" => Some("16".to_owned()),
            _ => None,
        };
        assert_eq!(
            expand("util {|%} (mean {mean|%})", known),
            "util n/a (mean n/a)"
        );
        assert_eq!(expand("{P<}", known), "n/a");
        assert_eq!(
            expand(
                "PCIe {Gen<gen} {x<width} (max {Gen<gen_max} {x<width_max})",
                known
            ),
            "PCIe n/a (max Gen5 x16)"
        );
        assert_eq!(expand("power {a} / {b| W}", known), "power n/a");
        assert_eq!(expand("{a}/{width_max| W}", known), "n/a/16 W");
        assert_eq!(expand("rx {a} tx {b}", known), "rx n/a tx n/a");
    }

    #[test]
    fn formats_write_present_values() {
        let rate = |b: f64| format!("{b}B/s");
        let fixed = Format::Fixed {
            decimals: 1,
            scale: Scale::Per(GIB),
        };
        assert_eq!(fixed.show(GIB * 1.5, rate), "1.5");
        assert_eq!(Format::Rate.show(3.0, rate), "3B/s");
        assert_eq!(Format::Flag.show(1.0, rate), "true");
        assert_eq!(Format::Flag.show(0.0, rate), "false");
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
