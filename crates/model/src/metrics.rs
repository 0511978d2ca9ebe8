//! The metric table's vocabulary. Each telemetry field of a `Sample` is declared once, in the
//! table beside the struct (`sample::METRICS`), with what it measures, what values are
//! plausible, which vendors' backends read it and how every view shows it. Sanity checks, fault
//! injection, history, summaries and the exporters iterate that table instead of naming fields,
//! so a new metric is a table entry plus a backend read.
//!
//! Views that compose several fields into one line (the check text, the Detail panel's chart
//! titles) do it with small templates: `{}` is the entry's own value, `{field}` another field's,
//! and `|unit` inside the braces is written only after a value that is present ("97%" but
//! "n/a"). A view may add names of its own (`{mean}`, `{ceiling}`).

use crate::sample::{DeviceInfo, Metric, Sample};

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
}

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
    pub const ALL: [Chart; 6] = [
        Chart::Util,
        Chart::Memory,
        Chart::Power,
        Chart::Temperature,
        Chart::Clocks,
        Chart::Pcie,
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
        }
    }

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
        }
    }

    /// The fields the chart plots, in table order; the first one's absence explains an empty
    /// chart.
    pub fn fields(self) -> impl Iterator<Item = &'static MetricDef> {
        crate::sample::METRICS
            .iter()
            .filter(move |m| m.chart.is_some_and(|p| p.chart == self))
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

    /// The field's value as text in its own `format`.
    pub fn show(&self, s: &Sample, unit: &str, rate: fn(f64) -> String) -> String {
        self.format.show(self.get(s), unit, rate)
    }
}

/// The table entry of the `Sample` field `name`.
pub fn by_name(name: &str) -> Option<&'static MetricDef> {
    crate::sample::METRICS.iter().find(|m| m.name == name)
}

/// The `Sample` fields a backend of `vendor` has no way to read: those the table gives to other
/// vendors only, and the decoded throttle names wherever the bits are missing (they are one
/// reading, kept in two fields).
pub fn unavailable_on(vendor: Vendor) -> impl Iterator<Item = &'static str> {
    let throttle_bits = by_name("throttle_reasons").is_some_and(|m| !m.vendors.has(vendor));
    crate::sample::METRICS
        .iter()
        .filter(move |m| !m.vendors.has(vendor))
        .map(|m| m.name)
        .chain(throttle_bits.then_some("throttle_reason_names"))
}

/// The trace's counter groups in order of first appearance in the table, each with its fields.
pub fn trace_groups() -> Vec<(&'static str, Vec<&'static MetricDef>)> {
    let mut groups: Vec<(&'static str, Vec<&'static MetricDef>)> = Vec::new();
    for m in crate::sample::METRICS {
        let Some(t) = m.trace else { continue };
        match groups.iter_mut().find(|(g, _)| *g == t.group) {
            Some((_, fields)) => fields.push(m),
            None => groups.push((t.group, vec![m])),
        }
    }
    groups
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

/// Declares the metric table: the `Metric` enum (one variant per field that `=> Variant` makes
/// a history series) and `METRICS`, each entry a `MetricDef` expression completed with the
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
                    $($( Metric::$series => self.$field.map($crate::metrics::FieldValue::to_f64), )?)*
                }
            }
        }

        /// Every value field of `Sample`, in struct order.
        pub const METRICS: &[$crate::metrics::MetricDef] = &[$(
            $crate::metrics::MetricDef {
                name: stringify!($field),
                series: metric_table!(@series $($series)?),
                repr: $crate::metrics::repr_of(|s: &$crate::sample::Sample| s.$field),
                get: |s| s.$field.map($crate::metrics::FieldValue::to_f64),
                set: |s, v| {
                    s.$field = v.map($crate::metrics::FieldValue::from_f64).transpose()?;
                    Ok(())
                },
                ..$def
            },
        )*];
    };
    (@series) => { None };
    (@series $series:ident) => { Some(Metric::$series) };
}

pub(crate) use metric_table;

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
