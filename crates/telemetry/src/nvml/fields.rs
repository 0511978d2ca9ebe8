//! Fast fields: the NVML reads cheap enough for every poll, and the decoders from NVML's units
//! and codes to the model's. The decoders are pure functions apart from the calls, so they are
//! tested without a GPU.

use gpudiag_model::decode::throttle_reason_names;
use gpudiag_model::stats::{self, Counter};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::device::Device;
use nvml_wrapper::enum_wrappers::device::{Clock, PerformanceState, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{Bits, NvmlError};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;

use super::{absent_from, read, read_many, read_with};
use gpudiag_model::sample::by_name;
use gpudiag_model::sample::{Absent, AbsentMap, Sample};

/// `Sample` fields read on every poll.
pub(super) const FAST_FIELDS: &[&str] = &[
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_free_bytes",
    "mem_total_bytes",
    "power_w",
    "power_limit_w",
    "temp_gpu_c",
    "temp_mem_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pstate",
    "throttle_reasons",
    "throttle_reason_names",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "fan_pct",
    "encoder_util_pct",
    "decoder_util_pct",
];

/// `Sample` fields copied from `DeviceInfo` by `copy_static` (listed for the coverage test).
#[cfg(test)]
const STATIC_FIELDS: &[&str] = &[
    "temp_slowdown_c",
    "temp_shutdown_c",
    "sm_clock_max_mhz",
    "mem_clock_max_mhz",
    "pcie_gen_max",
    "pcie_width_max",
];

/// Counts one fast-poll driver call (`GPUDIAG_TICK_STATS`).
fn fast<T>(result: T) -> T {
    stats::call(Counter::NvmlFastCalls, result)
}

pub(super) fn read_fast(dev: &Device<'_>, s: &mut Sample) {
    let mut ab = std::mem::take(&mut s.absent);
    let a = &mut ab;

    let util = read_many(
        fast(dev.utilization_rates()),
        &["gpu_util_pct", "mem_util_pct"],
        a,
    );
    s.gpu_util_pct = util.as_ref().map(|u| f64::from(u.gpu));
    s.mem_util_pct = util.map(|u| f64::from(u.memory));

    // The wrapper's memory_info() is nvmlDeviceGetMemoryInfo_v2, whose `used` excludes the
    // driver-reserved memory (as nvidia-smi shows it).
    let mem = read_many(
        fast(dev.memory_info()),
        &["mem_used_bytes", "mem_free_bytes", "mem_total_bytes"],
        a,
    );
    s.mem_used_bytes = mem.as_ref().map(|m| m.used);
    s.mem_free_bytes = mem.as_ref().map(|m| m.free);
    s.mem_total_bytes = mem.map(|m| m.total);

    s.power_w = read(fast(dev.power_usage()), "power_w", a).map(mw_to_w);
    s.power_limit_w = read(fast(dev.enforced_power_limit()), "power_limit_w", a).map(mw_to_w);
    s.temp_gpu_c = read(
        fast(dev.temperature(TemperatureSensor::Gpu)),
        "temp_gpu_c",
        a,
    )
    .map(f64::from);
    s.sm_clock_mhz = read(fast(dev.clock_info(Clock::SM)), "sm_clock_mhz", a);
    s.mem_clock_mhz = read(fast(dev.clock_info(Clock::Memory)), "mem_clock_mhz", a);
    s.pstate = read_with(fast(dev.performance_state()), "pstate", a, |p| {
        pstate_index(p).ok_or_else(|| Absent::Error("performance state unknown".into()))
    });

    let bits = read_many(
        throttle_bits(fast(dev.current_throttle_reasons_strict())),
        &["throttle_reasons", "throttle_reason_names"],
        a,
    );
    s.throttle_reasons = bits;
    s.throttle_reason_names = bits.map(throttle_reason_names);

    // Fan 0 only. Fanless (SXM) parts answer InvalidArg for it: see `fan_absent`.
    s.fan_pct = match fast(dev.fan_speed(0)) {
        Ok(pct) => Some(f64::from(pct)),
        Err(e) => {
            a.insert("fan_pct".into(), fan_absent(&e));
            None
        }
    };
    s.encoder_util_pct = read(fast(dev.encoder_utilization()), "encoder_util_pct", a)
        .map(|u| f64::from(u.utilization));
    s.decoder_util_pct = read(fast(dev.decoder_utilization()), "decoder_util_pct", a)
        .map(|u| f64::from(u.utilization));

    // One driver round trip for the counters.
    let ids: Vec<FieldId> = BatchField::ALL.map(|f| FieldId(f.id())).into();
    apply_field_values(s, a, fast(dev.field_values_for(&ids)));

    s.absent = ab;
}

/// NVML's clock-event reason durations (nanoseconds the clocks were held down for one reason
/// since the driver loaded) and the series each fills, in the order they are asked for after
/// `BatchField::ALL`. The ids are nvml.h's from before driver 580.82 renumbered 251-255; the
/// wrapper translates them for newer drivers.
pub(super) const CLOCK_EVENT_FIELDS: [(u32, &str); 5] = {
    use nvml_wrapper::sys_exports::field_id::*;
    [
        (
            NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
            "throttle_sw_power_cap_s",
        ),
        (
            NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
            "throttle_sync_boost_s",
        ),
        (
            NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
            "throttle_sw_thermal_slowdown_s",
        ),
        (
            NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
            "throttle_hw_thermal_slowdown_s",
        ),
        (
            NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
            "throttle_hw_power_brake_slowdown_s",
        ),
    ]
};

/// The clock-event durations, in seconds, in `CLOCK_EVENT_FIELDS` order; each absent with its
/// reason where the GPU or driver lacks it (never 0). They are cumulative counters, read on
/// the slow cadence: on an H200 (driver 580) asking for these five costs about 160 µs a call,
/// ten times the twelve fast counters together.
pub(super) fn read_clock_events(dev: &Device<'_>) -> [Result<f64, Absent>; 5] {
    let ids: Vec<FieldId> = CLOCK_EVENT_FIELDS.map(|(id, _)| FieldId(id)).into();
    decode_clock_events(dev.field_values_for(&ids).map_err(|e| absent_from(&e)))
}

/// Seconds from NVML's answers for `CLOCK_EVENT_FIELDS` (nanoseconds), or why each is absent.
fn decode_clock_events(
    answers: Result<Vec<Result<FieldValueSample, NvmlError>>, Absent>,
) -> [Result<f64, Absent>; 5] {
    std::array::from_fn(|i| {
        let answer = match &answers {
            Err(why) => Err(why.clone()),
            Ok(values) => match values.get(i) {
                Some(Ok(sample)) => sample.value.as_ref().map_err(absent_from),
                Some(Err(e)) => Err(absent_from(e)),
                None => Err(Absent::Error(
                    "NVML returned fewer field values than asked".into(),
                )),
            },
        };
        answer.and_then(sample_value_u64).map(ns_to_s)
    })
}

/// Stores the clock-event durations in their `Sample` fields, or their reasons in `absent`.
pub(super) fn put_clock_events(s: &mut Sample, values: &[Result<f64, Absent>; 5]) {
    let mut absent = std::mem::take(&mut s.absent);
    store_clock_events(s, &mut absent, values);
    s.absent = absent;
}

fn store_clock_events(s: &mut Sample, ab: &mut AbsentMap, values: &[Result<f64, Absent>; 5]) {
    for ((_, field), value) in CLOCK_EVENT_FIELDS.into_iter().zip(values) {
        let stored = value.clone().and_then(|secs| {
            let def = by_name(field)
                .ok_or_else(|| Absent::Error(format!("{field} is not a Sample field")))?;
            def.set(s, Some(secs))
                .map_err(|e| Absent::Error(format!("cannot store {secs} s: {e:?}")))
        });
        if let Err(why) = stored {
            ab.insert(field.into(), why);
        }
    }
}

/// Counters read in one `nvmlDeviceGetFieldValues` call: one driver round trip instead of
/// twelve, and the only safe route in `nvml-wrapper` 0.13 to memory temperature and remapped
/// rows (it wraps neither `nvmlDeviceGetRemappedRows` nor a memory temperature sensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchField {
    TempMem,
    EccCorrectedVolatile,
    EccUncorrectedVolatile,
    EccCorrectedAggregate,
    EccUncorrectedAggregate,
    RetiredSbe,
    RetiredDbe,
    RetiredPending,
    RemappedCorrectable,
    RemappedUncorrectable,
    RemappedPending,
    RemappedFailure,
}

impl BatchField {
    pub(super) const ALL: [BatchField; 12] = [
        BatchField::TempMem,
        BatchField::EccCorrectedVolatile,
        BatchField::EccUncorrectedVolatile,
        BatchField::EccCorrectedAggregate,
        BatchField::EccUncorrectedAggregate,
        BatchField::RetiredSbe,
        BatchField::RetiredDbe,
        BatchField::RetiredPending,
        BatchField::RemappedCorrectable,
        BatchField::RemappedUncorrectable,
        BatchField::RemappedPending,
        BatchField::RemappedFailure,
    ];

    /// The `NVML_FI_DEV_*` id from nvml.h. All are below 251, so the wrapper's translation of
    /// ids renumbered in driver 580.82 leaves them alone.
    pub(super) fn id(self) -> u32 {
        use nvml_wrapper::sys_exports::field_id::*;
        match self {
            BatchField::TempMem => NVML_FI_DEV_MEMORY_TEMP,
            BatchField::EccCorrectedVolatile => NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            BatchField::EccUncorrectedVolatile => NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            BatchField::EccCorrectedAggregate => NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
            BatchField::EccUncorrectedAggregate => NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
            BatchField::RetiredSbe => NVML_FI_DEV_RETIRED_SBE,
            BatchField::RetiredDbe => NVML_FI_DEV_RETIRED_DBE,
            BatchField::RetiredPending => NVML_FI_DEV_RETIRED_PENDING,
            BatchField::RemappedCorrectable => NVML_FI_DEV_REMAPPED_COR,
            BatchField::RemappedUncorrectable => NVML_FI_DEV_REMAPPED_UNC,
            BatchField::RemappedPending => NVML_FI_DEV_REMAPPED_PENDING,
            BatchField::RemappedFailure => NVML_FI_DEV_REMAPPED_FAILURE,
        }
    }

    /// The `Sample` field it fills.
    pub(super) fn name(self) -> &'static str {
        match self {
            BatchField::TempMem => "temp_mem_c",
            BatchField::EccCorrectedVolatile => "ecc_corrected_volatile",
            BatchField::EccUncorrectedVolatile => "ecc_uncorrected_volatile",
            BatchField::EccCorrectedAggregate => "ecc_corrected_aggregate",
            BatchField::EccUncorrectedAggregate => "ecc_uncorrected_aggregate",
            BatchField::RetiredSbe => "retired_pages_sbe",
            BatchField::RetiredDbe => "retired_pages_dbe",
            BatchField::RetiredPending => "retired_pages_pending",
            BatchField::RemappedCorrectable => "remapped_rows_correctable",
            BatchField::RemappedUncorrectable => "remapped_rows_uncorrectable",
            BatchField::RemappedPending => "remapped_rows_pending",
            BatchField::RemappedFailure => "remapped_rows_failure",
        }
    }

    /// Stores one field value into the sample; counters are unsigned, flags are 0/1.
    fn store(self, s: &mut Sample, v: &SampleValue) -> Result<(), Absent> {
        let count = || sample_value_u64(v);
        let flag = || sample_value_u64(v).map(|x| x != 0);
        match self {
            BatchField::TempMem => s.temp_mem_c = Some(count()? as f64),
            BatchField::EccCorrectedVolatile => s.ecc_corrected_volatile = Some(count()?),
            BatchField::EccUncorrectedVolatile => s.ecc_uncorrected_volatile = Some(count()?),
            BatchField::EccCorrectedAggregate => s.ecc_corrected_aggregate = Some(count()?),
            BatchField::EccUncorrectedAggregate => s.ecc_uncorrected_aggregate = Some(count()?),
            BatchField::RetiredSbe => s.retired_pages_sbe = Some(count()?),
            BatchField::RetiredDbe => s.retired_pages_dbe = Some(count()?),
            BatchField::RetiredPending => s.retired_pages_pending = Some(flag()?),
            BatchField::RemappedCorrectable => s.remapped_rows_correctable = Some(count()?),
            BatchField::RemappedUncorrectable => s.remapped_rows_uncorrectable = Some(count()?),
            BatchField::RemappedPending => s.remapped_rows_pending = Some(flag()?),
            BatchField::RemappedFailure => s.remapped_rows_failure = Some(flag()?),
        }
        Ok(())
    }
}

/// Fills the batched counters from one `field_values_for(BatchField::ALL)` answer. NVML answers
/// in request order, each entry with its own status; the whole call can fail too.
fn apply_field_values(
    s: &mut Sample,
    ab: &mut AbsentMap,
    batch: Result<Vec<Result<FieldValueSample, NvmlError>>, NvmlError>,
) {
    let values = match batch {
        Ok(values) => values,
        Err(e) => {
            let why = absent_from(&e);
            for f in BatchField::ALL {
                ab.insert(f.name().into(), why.clone());
            }
            return;
        }
    };
    for (i, f) in BatchField::ALL.into_iter().enumerate() {
        let stored = match values.get(i) {
            Some(Ok(sample)) => sample
                .value
                .as_ref()
                .map_err(absent_from)
                .and_then(|v| f.store(s, v)),
            Some(Err(e)) => Err(absent_from(e)),
            None => Err(Absent::Error(
                "NVML returned fewer field values than asked".into(),
            )),
        };
        if let Err(why) = stored {
            ab.insert(f.name().into(), why);
        }
    }
}

/// A field value as an unsigned count. Negative or non-finite values are errors, never 0.
fn sample_value_u64(v: &SampleValue) -> Result<u64, Absent> {
    let bad = || Absent::Error(format!("unexpected field value {v:?}"));
    match *v {
        SampleValue::U32(x) => Ok(u64::from(x)),
        SampleValue::U64(x) => Ok(x),
        SampleValue::I64(x) => u64::try_from(x).map_err(|_| bad()),
        SampleValue::F64(x) if x.is_finite() && x >= 0.0 => Ok(x.round() as u64),
        SampleValue::F64(_) => Err(bad()),
    }
}

/// Why fan 0's speed is absent. A fanless part (SXM boards, cooled by the chassis) has no fan
/// index 0, so NVML rejects the index (InvalidArg, seen on an H200) rather than saying
/// NotSupported.
pub(super) fn fan_absent(e: &NvmlError) -> Absent {
    match e {
        NvmlError::InvalidArg => Absent::NotSupported,
        other => absent_from(other),
    }
}

/// The raw clock-event bits. The wrapper's strict call rejects bits it has no flag for, but
/// hands them back in the error, so newer drivers' reasons survive as `unknown_0x...` names.
fn throttle_bits(r: Result<ThrottleReasons, NvmlError>) -> Result<u64, NvmlError> {
    match r {
        Ok(reasons) => Ok(reasons.bits()),
        Err(NvmlError::IncorrectBits(Bits::U64(bits))) => Ok(bits),
        Err(NvmlError::IncorrectBits(Bits::U32(bits))) => Ok(u64::from(bits)),
        Err(e) => Err(e),
    }
}

/// P0..P15 as 0..15; `Unknown` as `None`.
pub fn pstate_index(p: PerformanceState) -> Option<u32> {
    use PerformanceState::*;
    Some(match p {
        Zero => 0,
        One => 1,
        Two => 2,
        Three => 3,
        Four => 4,
        Five => 5,
        Six => 6,
        Seven => 7,
        Eight => 8,
        Nine => 9,
        Ten => 10,
        Eleven => 11,
        Twelve => 12,
        Thirteen => 13,
        Fourteen => 14,
        Fifteen => 15,
        Unknown => return None,
    })
}

/// Milliwatts (NVML power) to watts.
pub fn mw_to_w(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

/// Nanoseconds (NVML clock-event durations) to seconds.
pub fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Millijoules (NVML energy counter) to joules.
pub fn mj_to_j(mj: u64) -> f64 {
    mj as f64 / 1000.0
}

/// NVML PCIe throughput (KB/s) to bytes/s. NVML's KB is 1024 bytes, as nvidia-smi and nvitop
/// read it (they print the same counter as KiB/s).
pub fn kb_per_s_to_bytes(kb: u32) -> f64 {
    f64::from(kb) * 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::DEVICE_INFO_FIELDS;
    use crate::nvml::slow::SLOW_FIELDS;
    use gpudiag_model::decode::THROTTLE_REASONS;
    use gpudiag_model::sample::{DeviceInfo, PROFILING_FIELDS};
    use std::collections::BTreeSet;

    #[test]
    fn throttle_reason_table_matches_wrapper_flags() {
        let known: u64 = THROTTLE_REASONS.iter().map(|(b, _)| b).sum();
        assert_eq!(known, ThrottleReasons::all().bits());
        assert_eq!(ThrottleReasons::SW_POWER_CAP.bits(), 0x4);
        assert_eq!(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN.bits(), 0x80);
    }

    #[test]
    fn throttle_bits_keep_unknown_bits() {
        let both = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_SLOWDOWN;
        assert_eq!(throttle_bits(Ok(both)).ok(), Some(0xc));
        let unknown = Err(NvmlError::IncorrectBits(Bits::U64(0x404)));
        assert_eq!(throttle_bits(unknown).ok(), Some(0x404));
        assert!(matches!(
            throttle_bits(Err(NvmlError::GpuLost)),
            Err(NvmlError::GpuLost)
        ));
    }

    #[test]
    fn pstates_map_to_numbers() {
        assert_eq!(pstate_index(PerformanceState::Zero), Some(0));
        assert_eq!(pstate_index(PerformanceState::Two), Some(2));
        assert_eq!(pstate_index(PerformanceState::Eight), Some(8));
        assert_eq!(pstate_index(PerformanceState::Fifteen), Some(15));
        assert_eq!(pstate_index(PerformanceState::Unknown), None);
    }

    #[test]
    fn unit_conversions() {
        assert_eq!(mw_to_w(700_000), 700.0);
        assert_eq!(mw_to_w(71_234), 71.234);
        assert_eq!(mj_to_j(123_456_789), 123_456.789);
        assert_eq!(kb_per_s_to_bytes(0), 0.0);
        assert_eq!(kb_per_s_to_bytes(1_000), 1_024_000.0);
        // NVML reports up to ~54 GB/s on a Gen5 x16 link: no overflow in the u32 KB/s input.
        assert_eq!(kb_per_s_to_bytes(52_734_375), 54_000_000_000.0);
    }

    fn field(v: Result<SampleValue, NvmlError>) -> Result<FieldValueSample, NvmlError> {
        Ok(FieldValueSample {
            field: FieldId(0),
            timestamp: 0,
            latency: 0,
            value: v,
        })
    }

    #[test]
    fn field_values_fill_counters_and_flags() {
        // An H100 with ECC on: page retirement is replaced by row remapping there.
        let batch = vec![
            field(Ok(SampleValue::U32(41))),     // memory temperature
            field(Ok(SampleValue::U64(3))),      // ECC corrected volatile
            field(Ok(SampleValue::U64(0))),      // ECC uncorrected volatile
            field(Ok(SampleValue::U64(12))),     // ECC corrected aggregate
            field(Ok(SampleValue::I64(1))),      // ECC uncorrected aggregate
            field(Err(NvmlError::NotSupported)), // retired SBE
            field(Err(NvmlError::NotSupported)), // retired DBE
            field(Err(NvmlError::NotSupported)), // retired pending
            field(Ok(SampleValue::U32(2))),      // remapped correctable
            field(Ok(SampleValue::U32(0))),      // remapped uncorrectable
            field(Ok(SampleValue::U32(1))),      // remap pending
            field(Ok(SampleValue::U32(0))),      // remap failure
        ];
        let mut s = Sample::new(0, 1);
        let mut ab = AbsentMap::new();
        apply_field_values(&mut s, &mut ab, Ok(batch));
        assert_eq!(s.temp_mem_c, Some(41.0));
        assert_eq!(s.ecc_corrected_volatile, Some(3));
        assert_eq!(s.ecc_uncorrected_volatile, Some(0));
        assert_eq!(s.ecc_corrected_aggregate, Some(12));
        assert_eq!(s.ecc_uncorrected_aggregate, Some(1));
        assert_eq!(s.retired_pages_sbe, None);
        assert_eq!(s.retired_pages_pending, None);
        assert_eq!(ab.get("retired_pages_sbe"), Some(&Absent::NotSupported));
        assert_eq!(ab.get("retired_pages_dbe"), Some(&Absent::NotSupported));
        assert_eq!(ab.get("retired_pages_pending"), Some(&Absent::NotSupported));
        assert_eq!(s.remapped_rows_correctable, Some(2));
        assert_eq!(s.remapped_rows_uncorrectable, Some(0));
        assert_eq!(s.remapped_rows_pending, Some(true));
        assert_eq!(s.remapped_rows_failure, Some(false));
        assert_eq!(ab.len(), 3);
    }

    #[test]
    fn field_values_failures() {
        // Whole call failed: every batched field absent with the same reason.
        let mut s = Sample::new(0, 1);
        let mut ab = AbsentMap::new();
        apply_field_values(&mut s, &mut ab, Err(NvmlError::GpuLost));
        assert_eq!(ab.len(), BatchField::ALL.len());
        assert!(ab.values().all(|a| *a == Absent::GpuLost));

        // Short answer, a bad value, and a per-field error inside a successful sample.
        let mut ab = AbsentMap::new();
        let batch = vec![
            field(Ok(SampleValue::I64(-5))),
            field(Ok(SampleValue::F64(f64::NAN))),
            field(Ok(SampleValue::U64(0))).map(|mut f| {
                f.value = Err(NvmlError::NoPermission);
                f
            }),
            Err(NvmlError::UnexpectedVariant(9)),
        ];
        apply_field_values(&mut s, &mut ab, Ok(batch));
        assert_eq!(s.temp_mem_c, None);
        assert!(matches!(ab.get("temp_mem_c"), Some(Absent::Error(_))));
        assert!(matches!(
            ab.get("ecc_corrected_volatile"),
            Some(Absent::Error(_))
        ));
        assert_eq!(
            ab.get("ecc_uncorrected_volatile"),
            Some(&Absent::NoPermission)
        );
        assert!(matches!(
            ab.get("ecc_corrected_aggregate"),
            Some(Absent::Error(_))
        ));
        assert!(
            matches!(ab.get("remapped_rows_failure"), Some(Absent::Error(m)) if m.contains("fewer"))
        );
        assert_eq!(ab.len(), BatchField::ALL.len());
    }

    fn apply_clock_events(
        s: &mut Sample,
        ab: &mut AbsentMap,
        answers: Result<Vec<Result<FieldValueSample, NvmlError>>, Absent>,
    ) {
        store_clock_events(s, ab, &decode_clock_events(answers));
    }

    #[test]
    fn clock_event_durations_decode_from_nanoseconds() {
        // An H200 on driver 580: power capped for 1.5 s so far, the others never, and a driver
        // that does not know the power-brake counter.
        let answers = vec![
            field(Ok(SampleValue::U64(1_500_000_000))),
            field(Ok(SampleValue::U64(0))),
            field(Ok(SampleValue::U64(250_000_000))),
            field(Ok(SampleValue::U64(0))),
            field(Err(NvmlError::NotSupported)),
        ];
        let mut s = Sample::new(0, 1);
        let mut ab = AbsentMap::new();
        apply_clock_events(&mut s, &mut ab, Ok(answers));
        assert_eq!(s.throttle_sw_power_cap_s, Some(1.5));
        assert_eq!(s.throttle_sync_boost_s, Some(0.0));
        assert_eq!(s.throttle_sw_thermal_slowdown_s, Some(0.25));
        assert_eq!(s.throttle_hw_thermal_slowdown_s, Some(0.0));
        assert_eq!(s.throttle_hw_power_brake_slowdown_s, None);
        assert_eq!(
            ab.get("throttle_hw_power_brake_slowdown_s"),
            Some(&Absent::NotSupported)
        );
        assert_eq!(ab.len(), 1);

        // A value NVML could not read, a negative one, and an answer cut short.
        let answers = vec![
            field(Ok(SampleValue::U64(0))).map(|mut f| {
                f.value = Err(NvmlError::NoPermission);
                f
            }),
            field(Ok(SampleValue::I64(-1))),
        ];
        let mut s = Sample::new(0, 1);
        let mut ab = AbsentMap::new();
        apply_clock_events(&mut s, &mut ab, Ok(answers));
        assert_eq!(
            ab.get("throttle_sw_power_cap_s"),
            Some(&Absent::NoPermission)
        );
        assert!(matches!(
            ab.get("throttle_sync_boost_s"),
            Some(Absent::Error(_))
        ));
        assert!(matches!(
            ab.get("throttle_hw_power_brake_slowdown_s"),
            Some(Absent::Error(m)) if m.contains("fewer")
        ));
        assert_eq!(ab.len(), CLOCK_EVENT_FIELDS.len());
        assert_eq!(s, Sample::new(0, 1));

        // The whole call failed: every duration absent for its reason.
        let mut ab = AbsentMap::new();
        apply_clock_events(&mut s, &mut ab, Err(Absent::GpuLost));
        assert_eq!(ab.len(), CLOCK_EVENT_FIELDS.len());
        assert!(ab.values().all(|a| *a == Absent::GpuLost));
    }

    #[test]
    fn clock_event_field_ids_are_nvml_constants() {
        let ids: Vec<u32> = CLOCK_EVENT_FIELDS.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [74, 76, 251, 252, 253]);
        for (_, field) in CLOCK_EVENT_FIELDS {
            assert!(super::super::slow::SLOW_FIELDS.contains(&field), "{field}");
            assert!(by_name(field).is_some(), "{field}");
        }
    }

    #[test]
    fn batch_field_ids_are_nvml_constants() {
        let ids: Vec<u32> = BatchField::ALL.iter().map(|f| f.id()).collect();
        assert_eq!(ids, [82, 3, 4, 5, 6, 29, 30, 31, 142, 143, 144, 145]);
        let names: BTreeSet<&str> = BatchField::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), BatchField::ALL.len());
        assert!(names.iter().all(|n| FAST_FIELDS.contains(n)));
    }

    fn keys(v: serde_json::Value) -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn field_lists_cover_the_model() {
        // Every optional Sample value is fast, slow or static: nothing can be forgotten when a
        // device is lost or cannot be opened.
        let mut all = keys(serde_json::to_value(Sample::default()).unwrap());
        for k in ["time_ms", "device"] {
            assert!(all.remove(k));
        }
        let ours: Vec<&str> = [FAST_FIELDS, SLOW_FIELDS, STATIC_FIELDS, PROFILING_FIELDS].concat();
        let ours_set: BTreeSet<String> = ours.iter().map(|s| s.to_string()).collect();
        assert_eq!(ours.len(), ours_set.len(), "a field is listed twice");
        assert_eq!(all, ours_set);

        let mut info = keys(serde_json::to_value(DeviceInfo::default()).unwrap());
        for k in ["index", "vendor"] {
            assert!(info.remove(k));
        }
        let listed: BTreeSet<String> = DEVICE_INFO_FIELDS.iter().map(|s| s.to_string()).collect();
        assert_eq!(info, listed);
    }

    #[test]
    fn static_values_and_reasons_are_copied() {
        let mut info = DeviceInfo {
            temp_slowdown_c: Some(87.0),
            temp_shutdown_c: Some(92.0),
            sm_clock_max_mhz: Some(1980),
            mem_clock_max_mhz: Some(2619),
            pcie_gen_max: Some(5),
            ..DeviceInfo::default()
        };
        info.absent
            .insert("pcie_width_max".into(), Absent::NoPermission);
        let mut s = Sample::new(0, 1);
        s.copy_static_from(&info);
        assert_eq!(s.temp_slowdown_c, Some(87.0));
        assert_eq!(s.temp_shutdown_c, Some(92.0));
        assert_eq!(s.sm_clock_max_mhz, Some(1980));
        assert_eq!(s.mem_clock_max_mhz, Some(2619));
        assert_eq!(s.pcie_gen_max, Some(5));
        assert_eq!(s.pcie_width_max, None);
        assert_eq!(s.why_absent("pcie_width_max"), Some(&Absent::NoPermission));
        assert_eq!(s.absent.len(), 1);
    }
}
