//! Memory: a pattern test over a bounded share of free device memory (0x00, 0xFF, 0xAA, 0x55,
//! walking ones, address-in-address), with the mismatching addresses and the ECC counters
//! before and after; and an allocation-churn check that free memory returns to its baseline.

use serde_json::{Value, json};

use super::gpu::{DeviceBuffer, Gpu, grid_for, launch};
use super::suite::MemoryParams;
use super::{Measurement, ProbeDeadline, ProbeError, ProbeResult, SpanTimer, Verdict, test_fault};

/// (name, mode, pattern) as the memtest kernels take them.
pub const PATTERNS: [(&str, u32, u32); 7] = [
    ("zeros", 0, 0x0000_0000),
    ("ones", 0, 0xFFFF_FFFF),
    ("0xAA", 0, 0xAAAA_AAAA),
    ("0x55", 0, 0x5555_5555),
    ("walking_ones", 1, 0),
    ("address", 2, 0),
    ("address_inverted", 2, 0xFFFF_FFFF),
];

/// Addresses kept per pattern.
const MAX_BAD: u32 = 16;
/// Free memory may differ from its baseline by this much after churn (driver bookkeeping).
const CHURN_SLACK: u64 = 32 << 20;

/// One mismatch: device address of the word and the bits that differ.
pub fn describe_mismatch(base: u64, index: u64, flipped: u64) -> Value {
    json!({"address": format!("{:#x}", base + index * 4), "word_index": index, "flipped_bits": format!("{flipped:#010x}")})
}

pub fn run(
    gpu: &Gpu,
    p: &MemoryParams,
    budget: u64,
    ecc: &dyn Fn() -> Value,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    let bytes = budget / 4 * 4;
    if bytes < (1 << 20) {
        return Err(ProbeError::Refused(format!(
            "the memory budget ({budget} bytes) is too small for a memory test"
        )));
    }
    let words = bytes / 4;
    r.param("bytes_tested", bytes);
    r.param("patterns", PATTERNS.iter().map(|p| p.0).collect::<Vec<_>>());
    r.details.insert("ecc_before".into(), ecc());
    let m = gpu.module("memtest")?;
    let (write, check, flip) = (
        m.function("mem_write")?,
        m.function("mem_check")?,
        m.function("mem_flip_bit")?,
    );
    let s = &gpu.stream;
    let buf = DeviceBuffer::new(bytes as usize)?;
    let counters = DeviceBuffer::new(8 + 16 * MAX_BAD as usize)?;
    let grid = grid_for(words, 256, gpu.info.multiprocessors);
    let mut total = 0u64;
    let mut bad = Vec::new();
    let t_all = SpanTimer::start("patterns");
    let start = std::time::Instant::now();
    for (i, (name, mode, pattern)) in PATTERNS.iter().enumerate() {
        ctl.check()?;
        let t = SpanTimer::start(*name);
        counters.memset(0, s)?;
        launch(
            write,
            (grid, 1, 1),
            (256, 1, 1),
            0,
            s,
            &[&buf.ptr, &words, mode, pattern],
        )?;
        if i == 0 && test_fault("memory") {
            // Test hook: one flipped bit after the write pass, which the check must find.
            let (index, bit) = (words / 2, 5u32);
            launch(flip, (1, 1, 1), (1, 1, 1), 0, s, &[&buf.ptr, &index, &bit])?;
        }
        let err_ptr = counters.ptr;
        let bad_ptr = counters.ptr + 8;
        launch(
            check,
            (grid, 1, 1),
            (256, 1, 1),
            0,
            s,
            &[
                &buf.ptr, &words, mode, pattern, &err_ptr, &bad_ptr, &MAX_BAD,
            ],
        )?;
        s.synchronize()?;
        let mut raw = vec![0u8; 8 + 16 * MAX_BAD as usize];
        counters.read(0, &mut raw)?;
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let n = word(0);
        total += n;
        for k in 0..(n.min(u64::from(MAX_BAD)) as usize) {
            let mut d = describe_mismatch(buf.ptr, word(1 + 2 * k), word(2 + 2 * k));
            if let Some(o) = d.as_object_mut() {
                o.insert("pattern".into(), json!(name));
            }
            bad.push(d);
        }
        t.finish(r);
    }
    t_all.finish(r);
    let secs = start.elapsed().as_secs_f64();
    // Each pattern writes once and reads once.
    let traffic = 2.0 * bytes as f64 * PATTERNS.len() as f64 / secs / 1e9;
    r.metrics.push(Measurement::new(
        "mismatches",
        total as f64,
        "count",
        &m.served_by,
        vec![],
    ));
    r.metrics.push(Measurement::new(
        "pattern_traffic",
        traffic,
        "GB/s",
        &m.served_by,
        vec![],
    ));
    r.details
        .insert("mismatch_addresses".into(), Value::Array(bad));
    r.details.insert("ecc_after".into(), ecc());
    if total > 0 {
        r.downgrade(
            Verdict::Fail,
            format!("{total} word(s) read back differently from what was written"),
        );
    }
    if let Some(d) = ecc_increase(&r.details["ecc_before"], &r.details["ecc_after"]) {
        r.downgrade(
            Verdict::Fail,
            format!("ECC counters rose during the test: {d}"),
        );
    }
    drop(buf);
    churn(gpu, p, budget, ctl, r)
}

/// "uncorrected_volatile +2" for every counter that rose.
pub fn ecc_increase(before: &Value, after: &Value) -> Option<String> {
    let mut rose = Vec::new();
    for k in ["corrected_volatile", "uncorrected_volatile"] {
        if let (Some(a), Some(b)) = (before[k].as_u64(), after[k].as_u64())
            && b > a
        {
            rose.push(format!("{k} +{}", b - a));
        }
    }
    (!rose.is_empty()).then(|| rose.join(", "))
}

/// Allocates and frees chunks of varying size `cycles` times; free memory must come back.
fn churn(
    gpu: &Gpu,
    p: &MemoryParams,
    budget: u64,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    let t = SpanTimer::start("churn");
    gpu.synchronize()?;
    let (baseline, _) = gpu.mem_info()?;
    let chunk = p.churn_bytes.min(budget / 4).max(1 << 20);
    for c in 0..p.churn_cycles {
        ctl.check()?;
        let bufs: Vec<DeviceBuffer> = (0..4u64)
            .map(|i| DeviceBuffer::new((chunk / (1 + (i + u64::from(c)) % 4)) as usize))
            .collect::<Result<_, _>>()?;
        drop(bufs);
    }
    gpu.synchronize()?;
    let (after, _) = gpu.mem_info()?;
    t.finish(r);
    let lost = baseline.saturating_sub(after);
    r.param("churn_cycles", p.churn_cycles);
    r.param("churn_chunk_bytes", chunk);
    r.metrics.push(Measurement::new(
        "churn_free_delta",
        lost as f64,
        "bytes",
        "cuMemAlloc/cuMemFree (libcuda)",
        vec![baseline as f64, after as f64],
    ));
    if lost > CHURN_SLACK {
        r.downgrade(
            Verdict::Warn,
            format!(
                "free memory is {} MiB below its baseline after alloc/free churn",
                lost >> 20
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_name_their_address() {
        let d = describe_mismatch(0x7f00_0000_0000, 3, 0x20);
        assert_eq!(d["address"], "0x7f000000000c");
        assert_eq!(d["flipped_bits"], "0x00000020");
    }

    #[test]
    fn ecc_rises_are_reported_and_absent_counters_are_not() {
        let a = json!({"corrected_volatile": 1, "uncorrected_volatile": 0});
        let b = json!({"corrected_volatile": 1, "uncorrected_volatile": 2});
        assert_eq!(
            ecc_increase(&a, &b).as_deref(),
            Some("uncorrected_volatile +2")
        );
        assert_eq!(ecc_increase(&a, &a), None);
        let none = json!({"corrected_volatile": null, "uncorrected_volatile": null});
        assert_eq!(ecc_increase(&none, &b), None);
    }
}
