//! Profiling counters through NVML's GPM (GPU Performance Monitoring, Hopper and newer): SM
//! activity and occupancy, tensor and FP pipes, DRAM bandwidth, PCIe and NVLink bytes, the
//! counters DCGM's profiling fields give, from the driver's own libnvidia-ml (no DCGM needed).
//!
//! GPM values are differences between two samples, so each poll takes a new sample when the
//! previous one is at least `MIN_INTERVAL` old and derives the values of the interval between
//! them; a faster poll repeats the last values. One sample cost about 0.13 ms on an H200, so this
//! runs inside the fast poll, under its deadline, instead of on a thread of its own. The first
//! poll (and so a single read) has no values: `Absent::NeedsTwoSamples`.
//!
//! On a GPU with MIG enabled the device-level sample is refused; each GPU instance is sampled
//! instead and the physical GPU's values are their average weighted by SM count (rates summed).
#![deny(clippy::undocumented_unsafe_blocks)]

use std::time::{Duration, Instant};

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::{Device, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::nvmlGpmSample_t;

use super::{absent_from, mark_absent};
use gpudiag_model::sample::{Absent, PROFILING_FIELDS, Sample};
use gpudiag_model::stats::{self, CallGroup, Counter};

/// GPM refuses intervals shorter than this (NVML's documentation asks for at least 100 ms).
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The graphics-engine share (`GraphicsUtil`, first in `COUNTERS`) alone costs about 1.8 ms of
/// CPU to compute on an H200, the other fifteen together about 0.1 ms: it is measured over
/// intervals of at least this long instead of every poll's.
pub const GRAPHICS_INTERVAL: Duration = Duration::from_secs(10);

/// GPM's byte rates are in MiB/s.
const MIB: f64 = 1024.0 * 1024.0;

/// What each `Sample` field reads, in `PROFILING_FIELDS` order; `true` for a rate (summed over
/// MIG instances and converted from MiB/s) rather than a share.
const COUNTERS: [(GpmMetricId, bool); 16] = [
    (GpmMetricId::GraphicsUtil, false),
    (GpmMetricId::SmUtil, false),
    (GpmMetricId::SmOccupancy, false),
    (GpmMetricId::AnyTensorUtil, false),
    (GpmMetricId::HmmaTensorUtil, false),
    (GpmMetricId::ImmaTensorUtil, false),
    (GpmMetricId::DfmaTensorUtil, false),
    (GpmMetricId::DramBwUtil, false),
    (GpmMetricId::Fp64Util, false),
    (GpmMetricId::Fp32Util, false),
    (GpmMetricId::Fp16Util, false),
    (GpmMetricId::IntegerUtil, false),
    (GpmMetricId::PcieRxPerSec, true),
    (GpmMetricId::PcieTxPerSec, true),
    (GpmMetricId::NvlinkTotalRxPerSec, true),
    (GpmMetricId::NvlinkTotalTxPerSec, true),
];

const _: () = assert!(COUNTERS.len() == PROFILING_FIELDS.len());

/// The values of one interval, in `PROFILING_FIELDS` order.
pub type Values = [Result<f64, Absent>; COUNTERS.len()];

/// A GPM sample kept between polls. `GpmSample` borrows the `Nvml` it came from, which the
/// backend owns behind an `Arc`; the raw handle is kept instead and freed with `release`.
struct Held(nvmlGpmSample_t);

// SAFETY: a GPM sample is a heap buffer owned by libnvidia-ml with no thread affinity
// (nvml-wrapper marks `GpmSample` `Send` too); only the poll, one thread at a time, touches it.
unsafe impl Send for Held {}

/// Where one device's samples come from.
enum Source {
    /// Not known yet: decided at the first poll, under the poll's deadline.
    Unprobed,
    Device,
    /// MIG: each GPU instance, with its SM count as the weight.
    Instances(Vec<(u32, f64)>),
    Unavailable(Absent),
}

/// One device's GPM state.
pub(super) struct GpmDevice {
    source: Source,
    /// The previous sample per source (one, or one per GPU instance) and when it was taken.
    previous: Option<(Vec<Held>, Instant)>,
    /// Samples whose interval has been read, filled again by the next read: allocating and
    /// freeing a sample buffer per read cost about 2 ms of CPU on an H200, the read itself a
    /// few tens of µs.
    spare: Vec<Held>,
    /// The sample the graphics-engine share is measured from, and when it was taken.
    graphics_base: Option<(Vec<Held>, Instant)>,
    /// The last graphics-engine share, over its own longer interval.
    graphics: Result<f64, Absent>,
    last: Result<Values, Absent>,
}

impl GpmDevice {
    pub(super) fn new() -> Self {
        GpmDevice {
            source: Source::Unprobed,
            previous: None,
            spare: Vec::new(),
            graphics_base: None,
            graphics: Err(Absent::NeedsTwoSamples),
            last: Err(Absent::NeedsTwoSamples),
        }
    }

    /// Fills `s`'s profiling fields, taking a new GPM sample when the previous one is old
    /// enough.
    pub(super) fn read(&mut self, nvml: &Nvml, dev: &Device, mig: bool, s: &mut Sample) {
        if let Source::Unprobed = self.source {
            self.source = probe(nvml, dev, mig);
        }
        let now = Instant::now();
        let due = self
            .previous
            .as_ref()
            .is_none_or(|(_, at)| now.duration_since(*at) >= MIN_INTERVAL);
        if due && !matches!(self.source, Source::Unavailable(_)) {
            self.sample(nvml, dev, now);
        }
        let last = match &self.source {
            Source::Unavailable(why) => Err(why.clone()),
            _ => self.last.clone(),
        };
        apply(&last, s);
    }

    fn sample(&mut self, nvml: &Nvml, dev: &Device, now: Instant) {
        stats::add(Counter::GpmSamples, 1);
        let _timed = stats::GroupTimer::start(CallGroup::Gpm);
        let instances: Vec<Option<u32>> = match &self.source {
            Source::Instances(gis) => gis.iter().map(|(gi, _)| Some(*gi)).collect(),
            _ => vec![None],
        };
        let taken: Result<Vec<Held>, NvmlError> = instances
            .iter()
            .map(|gi| self.fill(nvml, dev, *gi))
            .collect();
        let taken = match taken {
            Ok(t) => t,
            Err(e) => {
                self.release(nvml);
                let why = absent_from(&e);
                if why == Absent::NotSupported || why == Absent::NoPermission {
                    self.source = Source::Unavailable(why.clone());
                }
                self.last = Err(why);
                return;
            }
        };
        if let Some((previous, previous_at)) = self.previous.take() {
            let weights: Vec<f64> = match &self.source {
                Source::Instances(gis) => gis.iter().map(|(_, w)| *w).collect(),
                _ => vec![1.0],
            };
            // The first interval reads all sixteen, so even a short window has every value.
            let first = self.graphics == Err(Absent::NeedsTwoSamples);
            let per_poll: Vec<usize> = (usize::from(!first)..COUNTERS.len()).collect();
            let values = metrics_between(nvml, &previous, &taken, &per_poll, &weights);
            self.last = values.map(|mut v| {
                if first {
                    self.graphics = v[0].clone();
                }
                v[0] = self.graphics.clone();
                v
            });
            match self.graphics_base.take() {
                None => self.graphics_base = Some((previous, previous_at)),
                Some((base, base_at)) if now.duration_since(base_at) >= GRAPHICS_INTERVAL => {
                    self.graphics = metrics_between(nvml, &base, &taken, &[0], &weights)
                        .and_then(|v| v[0].clone());
                    if let Ok(v) = &mut self.last {
                        v[0] = self.graphics.clone();
                    }
                    self.spare.extend(base);
                    self.graphics_base = Some((previous, previous_at));
                }
                Some(kept) => {
                    self.graphics_base = Some(kept);
                    self.spare.extend(previous);
                }
            }
        }
        self.previous = Some((taken, now));
    }

    /// A sample of the device (or of GPU instance `gi`) taken now, into a spare buffer when
    /// there is one.
    fn fill(&mut self, nvml: &Nvml, dev: &Device, gi: Option<u32>) -> Result<Held, NvmlError> {
        let Some(held) = self.spare.pop() else {
            let sample = match gi {
                Some(gi) => dev.gpm_mig_sample(gi)?,
                None => dev.gpm_sample()?,
            };
            return Ok(Held(sample.into_handle()));
        };
        let lib = nvml.lib();
        // SAFETY: `held` is a live sample buffer from this `nvml` and the device handle is
        // live; the call only writes into the buffer.
        let rc = unsafe {
            match gi {
                Some(gi) => lib
                    .nvmlGpmMigSampleGet
                    .as_ref()
                    .map(|get| get(dev.handle(), gi, held.0)),
                None => lib
                    .nvmlGpmSampleGet
                    .as_ref()
                    .map(|get| get(dev.handle(), held.0)),
            }
        };
        match rc {
            Ok(0) => Ok(held),
            Ok(code) => {
                drop(adopt(nvml, vec![held]));
                Err(NvmlError::from(code))
            }
            Err(_) => {
                drop(adopt(nvml, vec![held]));
                Err(NvmlError::FailedToLoadSymbol("nvmlGpmSampleGet".into()))
            }
        }
    }

    /// Frees the kept samples; the backend calls it before NVML shuts down.
    pub(super) fn release(&mut self, nvml: &Nvml) {
        if let Some((held, _)) = self.previous.take() {
            drop(adopt(nvml, held));
        }
        if let Some((held, _)) = self.graphics_base.take() {
            drop(adopt(nvml, held));
        }
        drop(adopt(nvml, std::mem::take(&mut self.spare)));
    }
}

/// The metrics at `indices` of `COUNTERS` between two samples per source, combined over the
/// sources by `weights`; the metrics not asked are absent.
fn metrics_between(
    nvml: &Nvml,
    from: &[Held],
    to: &[Held],
    indices: &[usize],
    weights: &[f64],
) -> Result<Values, Absent> {
    let ids: Vec<GpmMetricId> = indices.iter().map(|&i| COUNTERS[i].0).collect();
    let per_source: Result<Vec<_>, NvmlError> = from
        .iter()
        .zip(to)
        .map(|(a, b)| {
            // SAFETY: both handles came from this `nvml` and stay owned by the device state:
            // the wrappers are taken apart again before they could free them.
            let (a, b) = unsafe {
                (
                    GpmSample::from_handle(nvml, a.0),
                    GpmSample::from_handle(nvml, b.0),
                )
            };
            let got = gpm_metrics_get(nvml, &a, &b, &ids);
            a.into_handle();
            b.into_handle();
            // Results in COUNTERS order, the unasked ones as placeholders.
            got.map(|r| {
                let mut full: Vec<_> = COUNTERS
                    .iter()
                    .map(|_| Err(NvmlError::NotSupported))
                    .collect();
                for (&i, value) in indices.iter().zip(r) {
                    full[i] = value;
                }
                full
            })
        })
        .collect();
    per_source
        .map(|results| combine(&results, weights))
        .map_err(|e| absent_from(&e))
}

/// Takes the handles back into `GpmSample`s, which free them when dropped.
fn adopt(nvml: &Nvml, held: Vec<Held>) -> Vec<GpmSample<'_>> {
    held.into_iter()
        // SAFETY: each handle came from `GpmSample::into_handle` on this same `nvml` and is
        // adopted exactly once: `previous` was taken out of its `Option`.
        .map(|Held(h)| unsafe { GpmSample::from_handle(nvml, h) })
        .collect()
}

/// Decides where this device's samples come from.
fn probe(nvml: &Nvml, dev: &Device, mig: bool) -> Source {
    match dev.gpm_support() {
        Ok(true) => {}
        Ok(false) => return Source::Unavailable(Absent::NotSupported),
        Err(e) => return Source::Unavailable(absent_from(&e)),
    }
    if !mig {
        return Source::Device;
    }
    let count = match dev.mig_device_count() {
        Ok(n) => n,
        Err(e) => return Source::Unavailable(absent_from(&e)),
    };
    let instances: Vec<(u32, f64)> = (0..count)
        .filter_map(|i| {
            let m = dev.mig_device_by_index(i).ok()?;
            let sms = m.attributes().ok()?.multiprocessor_count;
            Some((gpu_instance_id(nvml, &m)?, f64::from(sms.max(1))))
        })
        .collect();
    if instances.is_empty() {
        // MIG on, but no instance configured: nothing can run, nothing to profile.
        return Source::Unavailable(Absent::Error(
            "MIG is enabled and no GPU instance could be read".into(),
        ));
    }
    Source::Instances(instances)
}

/// The GPU instance a MIG device belongs to; nvml-wrapper has no wrapper for this call.
fn gpu_instance_id(nvml: &Nvml, mig: &Device) -> Option<u32> {
    let call = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
    let mut id: u32 = 0;
    // SAFETY: the handle is a live MIG device handle from this `nvml`, and `id` outlives the call.
    let rc = unsafe { call(mig.handle(), &mut id) };
    (rc == 0).then_some(id)
}

/// One interval's values from the per-source results: shares averaged by SM weight, rates
/// summed. A metric any source failed to give is absent with the first failure's reason.
fn combine(
    results: &[Vec<Result<nvml_wrapper::struct_wrappers::gpm::GpmMetricResult, NvmlError>>],
    weights: &[f64],
) -> Values {
    let total: f64 = weights.iter().sum();
    std::array::from_fn(|i| {
        let is_rate = COUNTERS[i].1;
        let mut acc = 0.0;
        for (source, w) in results.iter().zip(weights) {
            let v = match source.get(i) {
                Some(Ok(r)) => r.value,
                Some(Err(e)) => return Err(absent_from(e)),
                None => return Err(Absent::NotSupported),
            };
            if !v.is_finite() || v < 0.0 {
                return Err(Absent::Error(format!("GPM returned {v}")));
            }
            acc += if is_rate { v * MIB } else { v * w / total };
        }
        Ok(acc)
    })
}

/// Where each value goes, in `PROFILING_FIELDS` order: direct stores, because this runs on
/// every poll and a lookup in the metric table by name would cost a string search per field.
const SETTERS: [fn(&mut Sample, f64); COUNTERS.len()] = [
    |s, v| s.gr_engine_active_pct = Some(v),
    |s, v| s.sm_active_pct = Some(v),
    |s, v| s.sm_occupancy_pct = Some(v),
    |s, v| s.tensor_active_pct = Some(v),
    |s, v| s.tensor_hmma_active_pct = Some(v),
    |s, v| s.tensor_imma_active_pct = Some(v),
    |s, v| s.tensor_dfma_active_pct = Some(v),
    |s, v| s.dram_active_pct = Some(v),
    |s, v| s.fp64_active_pct = Some(v),
    |s, v| s.fp32_active_pct = Some(v),
    |s, v| s.fp16_active_pct = Some(v),
    |s, v| s.int_active_pct = Some(v),
    |s, v| s.prof_pcie_rx_bytes_per_s = Some(v),
    |s, v| s.prof_pcie_tx_bytes_per_s = Some(v),
    |s, v| s.nvlink_rx_bytes_per_s = Some(v),
    |s, v| s.nvlink_tx_bytes_per_s = Some(v),
];

/// Writes one interval's values (or why there are none) into `s`.
pub(super) fn apply(values: &Result<Values, Absent>, s: &mut Sample) {
    match values {
        Err(why) => mark_absent(&mut s.absent, PROFILING_FIELDS, why),
        Ok(vs) => {
            for ((name, set), v) in PROFILING_FIELDS.iter().zip(SETTERS).zip(vs) {
                match v {
                    Ok(v) => set(s, *v),
                    Err(why) => {
                        s.absent.insert((*name).into(), why.clone());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::struct_wrappers::gpm::{GpmMetricInfo, GpmMetricResult};

    fn results(values: [f64; 16]) -> Vec<Result<GpmMetricResult, NvmlError>> {
        COUNTERS
            .iter()
            .zip(values)
            .map(|((id, _), value)| {
                Ok(GpmMetricResult {
                    metric_id: *id,
                    value,
                    metric_info: GpmMetricInfo {
                        short_name: String::new(),
                        long_name: String::new(),
                        unit: String::new(),
                    },
                })
            })
            .collect()
    }

    #[test]
    fn mig_instances_average_by_sms_and_sum_rates() {
        let mut a = [10.0; 16];
        let mut b = [40.0; 16];
        a[12] = 100.0; // PCIe rx, MiB/s
        b[12] = 50.0;
        // Instances of 16 and 48 SMs: the larger one weighs three times as much.
        let v = combine(&[results(a), results(b)], &[16.0, 48.0]);
        assert_eq!(v[1], Ok(32.5), "SM active");
        assert_eq!(v[12], Ok(150.0 * MIB), "PCIe rx in bytes/s");
    }

    #[test]
    fn a_refused_metric_is_absent_with_its_reason_not_zero() {
        let mut values = [5.0; 16];
        values[1] = f64::NAN;
        let mut r = results(values);
        r[14] = Err(NvmlError::NotSupported);
        let v = combine(&[r], &[1.0]);
        assert_eq!(v[14], Err(Absent::NotSupported));
        assert!(matches!(v[1], Err(Absent::Error(_))));
        let mut s = Sample::default();
        apply(&Ok(v), &mut s);
        assert_eq!(s.sm_active_pct, None);
        assert_eq!(s.sm_occupancy_pct, Some(5.0));
        assert_eq!(s.nvlink_rx_bytes_per_s, None);
        assert_eq!(
            s.absent.get("nvlink_rx_bytes_per_s"),
            Some(&Absent::NotSupported)
        );
    }

    #[test]
    fn each_value_lands_in_the_field_of_its_name() {
        for (i, name) in PROFILING_FIELDS.iter().enumerate() {
            let mut s = Sample::default();
            SETTERS[i](&mut s, 42.0);
            let def = gpudiag_model::sample::by_name(name).unwrap();
            assert_eq!(def.get(&s), Some(42.0), "{name}");
        }
    }

    #[test]
    fn a_single_read_says_why_it_has_no_values() {
        let mut s = Sample::default();
        apply(&GpmDevice::new().last, &mut s);
        for f in PROFILING_FIELDS {
            assert_eq!(s.absent.get(*f), Some(&Absent::NeedsTwoSamples), "{f}");
        }
    }
}
