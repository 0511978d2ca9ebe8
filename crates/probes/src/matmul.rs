//! Matmul: TFLOP/s for fp32, tf32, fp16, bf16 and fp8 through cuBLASLt when present, and a
//! built-in kernel (bf16/fp16) otherwise: wgmma on Hopper (compute capability 9.0), mma.sync on
//! every other GPU from compute capability 8.0. Inputs are random (small integers over a
//! power of two, exact in every type, generated on the GPU by a hash the host mirrors), the
//! result is checked against a float64 host reference on sampled entries, and clocks, power and
//! temperature are recorded during the timed runs.

use serde_json::json;

use super::blas::{self, GemmSpec, Lt, dtype};
use super::conditions::RunTelemetry;
use super::gpu::{
    DeviceBuffer, Event, Function, Gpu, Module, TensorMap, grid_for, launch,
    set_max_dynamic_shared, spilled_bytes,
};
use super::suite::{MatmulParams, ModelRef};
use super::{
    Measurement, ProbeDeadline, ProbeError, ProbeResult, SpanTimer, Verdict, median, test_fault,
    tflops,
};

const WARMUPS: u32 = 2;
const WORKSPACE: usize = 32 << 20;
const SEED_A: u32 = 0x1234_5678;
const SEED_B: u32 = 0x9abc_def0;

/// One matmul type: how it is stored and computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TypeSpec {
    pub name: &'static str,
    /// fill_matrix dtype code: 0 fp32, 1 bf16, 2 fp16, 3 fp8 e4m3.
    pub fill: i32,
    pub in_bytes: u64,
    /// Output element: 0 fp32, 1 bf16, 2 fp16.
    pub out: i32,
    pub out_bytes: u64,
    /// Relative error allowed (‖out − ref‖ / ‖ref‖ over the sampled entries).
    pub tolerance: f64,
    /// Lowest compute capability with this type on tensor cores (fp32 runs anywhere).
    pub min_cc: (i32, i32),
}

pub const TYPES: [TypeSpec; 5] = [
    TypeSpec {
        name: "fp32",
        fill: 0,
        in_bytes: 4,
        out: 0,
        out_bytes: 4,
        tolerance: 1e-5,
        min_cc: (0, 0),
    },
    TypeSpec {
        name: "tf32",
        fill: 0,
        in_bytes: 4,
        out: 0,
        out_bytes: 4,
        tolerance: 1e-3,
        min_cc: (8, 0),
    },
    TypeSpec {
        name: "fp16",
        fill: 2,
        in_bytes: 2,
        out: 2,
        out_bytes: 2,
        tolerance: 1e-2,
        min_cc: (7, 0),
    },
    TypeSpec {
        name: "bf16",
        fill: 1,
        in_bytes: 2,
        out: 1,
        out_bytes: 2,
        tolerance: 1e-2,
        min_cc: (8, 0),
    },
    TypeSpec {
        name: "fp8",
        fill: 3,
        in_bytes: 1,
        out: 1,
        out_bytes: 2,
        tolerance: 1e-2,
        min_cc: (8, 9),
    },
];

/// Built-in kernel variants: name, K tile, pipeline stages; the fastest on an H200 first. The first is the default; the
/// hidden `GPUDIAG_MMA_VARIANT` picks another (for tuning on a new GPU).
pub const BUILTIN_VARIANTS: [(&str, u32, u32); 3] =
    [("k64s3", 64, 3), ("k32s3", 32, 3), ("k32s4", 32, 4)];

fn builtin_variant(want: &str) -> (&'static str, u32, u32) {
    BUILTIN_VARIANTS
        .iter()
        .copied()
        .find(|v| v.0 == want)
        .unwrap_or(BUILTIN_VARIANTS[0])
}

/// Built-in Hopper kernel variants (kernels/matmul_sm90a.cu), the fastest on an H200 first:
/// 4 pipeline stages with the producer's registers handed to the consumers, and without.
/// `GPUDIAG_MMA_VARIANT` names one of these or of `BUILTIN_VARIANTS` (which forces mma.sync).
pub const WGMMA_VARIANTS: [&str; 2] = ["s4r", "s4"];
const WGMMA_STAGES: u32 = 4;
/// The wgmma kernel's block tile: 128 columns of C (rows of B) by 256 rows of C (rows of A).
const WGMMA_TILE_J: u64 = 128;
const WGMMA_TILE_I: u64 = 256;
const WGMMA_TILE_K: u32 = 64;

/// The Hopper kernel, loaded and ready to launch on the inputs `a` (M×K) and `b` (N×K).
struct HopperKernel {
    _module: Module,
    function: Function,
    map_a: TensorMap,
    map_b: TensorMap,
    shared_bytes: u32,
    served_by: String,
}

fn hopper_kernel(
    gpu: &Gpu,
    ty: &str,
    want: &str,
    (a, b): (u64, u64),
    (m, n, k): (u64, u64, u64),
) -> Result<HopperKernel, ProbeError> {
    if m % WGMMA_TILE_I != 0 || n % WGMMA_TILE_J != 0 || k % u64::from(WGMMA_TILE_K) != 0 {
        return Err(ProbeError::Unsupported(format!(
            "{m}×{n}×{k} is not a multiple of its tile"
        )));
    }
    let variant = WGMMA_VARIANTS
        .iter()
        .copied()
        .find(|v| *v == want)
        .unwrap_or(WGMMA_VARIANTS[0]);
    let module = gpu.module("matmul_sm90a")?;
    let function = module.function(&format!("wgmma_gemm_{ty}_{variant}"))?;
    let shared_bytes = WGMMA_STAGES * (WGMMA_TILE_J + WGMMA_TILE_I) as u32 * WGMMA_TILE_K * 2
        + 1024
        + 16 * WGMMA_STAGES;
    set_max_dynamic_shared(function, shared_bytes as i32)?;
    let spills = spilled_bytes(function)?;
    let map_a = TensorMap::swizzled_128b(a, m, k, WGMMA_TILE_I as u32, WGMMA_TILE_K)?;
    let map_b = TensorMap::swizzled_128b(b, n, k, WGMMA_TILE_J as u32, WGMMA_TILE_K)?;
    // Spills would cost most of the kernel's speed on a new driver's register allocation: say so.
    let spilled = if spills > 0 {
        format!(", {spills} B of registers spilled to local memory")
    } else {
        String::new()
    };
    Ok(HopperKernel {
        served_by: format!("built-in wgmma {variant} {}{spilled}", module.served_by),
        _module: module,
        function,
        map_a,
        map_b,
        shared_bytes,
    })
}

/// "bf16" → (bf16, auto); "bf16/builtin" → (bf16, built-in kernel only).
pub fn parse_case(s: &str) -> Option<(TypeSpec, bool)> {
    let (t, builtin) = match s.split_once('/') {
        Some((t, "builtin")) => (t, true),
        Some(_) => return None,
        None => (s, false),
    };
    let spec = TYPES.iter().copied().find(|x| x.name == t)?;
    (!builtin || matches!(t, "bf16" | "fp16")).then_some((spec, builtin))
}

/// The GPU's fill hash, mirrored for the host reference.
pub fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Element `i` of the matrix with `seed`, as fill_matrix writes it for type code `fill`.
pub fn element(i: u64, seed: u32, fill: i32) -> f64 {
    let h = hash32(hash32((i as u32) ^ hash32((i >> 32) as u32)) ^ seed);
    if fill == 3 {
        f64::from((h % 17) as i32 - 8) / 8.0
    } else {
        f64::from((h % 129) as i32 - 64) / 64.0
    }
}

/// Decodes one output element.
pub fn decode(out: i32, b: &[u8]) -> f64 {
    match out {
        0 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        1 => f64::from(f32::from_bits(
            u32::from(u16::from_le_bytes([b[0], b[1]])) << 16,
        )),
        _ => f16_to_f64(u16::from_le_bytes([b[0], b[1]])),
    }
}

pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f64::from(h & 0x3ff);
    match exp {
        0 => sign * mant * 2f64.powi(-24),
        31 if mant == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + mant / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Reference C(i, j) = Σ_k A(i, k)·B(k, j) with A(i,k) at i·K + k and B(k,j) at j·K + k.
pub fn reference_entry(i: u64, j: u64, k: u64, fill: i32) -> f64 {
    (0..k)
        .map(|kk| element(i * k + kk, SEED_A, fill) * element(j * k + kk, SEED_B, fill))
        .sum()
}

/// Sampled entries (i, j): corners, the diagonal and a hash-spread rest.
pub fn sample_points(m: u64, n: u64, count: u32) -> Vec<(u64, u64)> {
    let mut v = vec![(0, 0), (m - 1, n - 1), (0, n - 1), (m - 1, 0)];
    let mut x = 0x2545_f491u32;
    while v.len() < count.max(4) as usize {
        x = hash32(x.wrapping_add(0x9e37_79b9));
        let i = u64::from(x) % m;
        x = hash32(x);
        v.push((i, u64::from(x) % n));
    }
    v
}

/// ‖got − want‖ / ‖want‖; NaN anywhere fails.
pub fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    if got.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

pub struct Engines {
    pub lt: Option<Lt>,
    /// Why cuBLASLt is not used, when it is not.
    pub lt_note: Option<String>,
}

/// How close the built-in kernel comes to cuBLASLt on a GPU of compute capability `cc`, as
/// measured (bf16, 8192³; benches/RESULTS.md, 2026-11-24: 815.6 against 820.5 TFLOP/s on an
/// H200; at 4096³ it is 0.94×, so a suite that relies on this runs 8192³), and the kernel's
/// name; `None` where it was not measured close.
pub fn builtin_share_of_cublaslt(cc: (i32, i32)) -> Option<(f64, &'static str)> {
    (cc == (9, 0)).then_some((0.99, "wgmma (sm_90a)"))
}

impl Engines {
    pub fn not_loaded(why: String) -> Engines {
        Engines {
            lt: None,
            lt_note: Some(why),
        }
    }

    pub fn open() -> Engines {
        match blas::locate().and_then(|p| Lt::load(&p)) {
            Ok(lt) => Engines {
                lt: Some(lt),
                lt_note: None,
            },
            Err(e) => Engines {
                lt: None,
                lt_note: Some(e),
            },
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    gpu: &Gpu,
    p: &MatmulParams,
    budget: u64,
    model: Option<&ModelRef>,
    engines: &Engines,
    telemetry: &dyn Fn() -> RunTelemetry,
    ctl: &ProbeDeadline,
    r: &mut ProbeResult,
) -> Result<(), ProbeError> {
    // The built-in kernel tiles 128×256×32; sizes are kept to multiples of 256.
    let mut size = p.size / 256 * 256;
    while size >= 256 && 3 * size * size * 4 + WORKSPACE as u64 > budget {
        size -= 256;
    }
    if size < 256 {
        return Err(ProbeError::Refused(format!(
            "the memory budget ({budget} bytes) is too small for a matmul"
        )));
    }
    r.param("m", size);
    r.param("n", size);
    r.param("k", size);
    r.param("iterations", p.iterations);
    r.param("warmups", WARMUPS);
    r.param("layout", "TN: A K×M transposed, B K×N, C M×N, column-major");
    if let Some(n) = &engines.lt_note {
        r.details.insert("cublaslt".into(), json!(n));
    }
    let mut skipped = Vec::new();
    let mut checks = serde_json::Map::new();
    for case in &p.types {
        ctl.check()?;
        let Some((spec, builtin_only)) = parse_case(case) else {
            skipped.push(format!("{case}: unknown type"));
            continue;
        };
        if gpu.cc < spec.min_cc {
            skipped.push(format!(
                "{case}: needs compute capability {}.{}",
                spec.min_cc.0, spec.min_cc.1
            ));
            continue;
        }
        let t = SpanTimer::start(format!("matmul {case}"));
        match one_case(gpu, size, p, spec, builtin_only, engines, telemetry, ctl) {
            Ok(c) => {
                let name = if builtin_only {
                    format!("{}_builtin", spec.name)
                } else {
                    spec.name.to_owned()
                };
                let expected = model.and_then(|m| m.tflops.get(spec.name).copied());
                r.metrics.push(
                    Measurement::new(&name, c.tflops, "TFLOP/s", &c.served_by, c.samples)
                        .with_expected(expected),
                );
                let mut check = json!({"relative_error": c.rel_err, "tolerance": spec.tolerance,
                       "entries_checked": c.checked, "passed": c.rel_err <= spec.tolerance,
                       "telemetry": c.telemetry});
                if let Some(note) = &c.builtin_note {
                    check["builtin_kernel"] = json!(note);
                }
                checks.insert(name.clone(), check);
                if c.rel_err.is_nan() || c.rel_err > spec.tolerance {
                    r.downgrade(
                        Verdict::Fail,
                        format!("{name}: result differs from the reference (relative error {:.2e} > {:.0e})", c.rel_err, spec.tolerance),
                    );
                }
            }
            Err(ProbeError::Unsupported(why)) => skipped.push(format!("{case}: {why}")),
            Err(e) => return Err(e),
        }
        t.finish(r);
    }
    r.details
        .insert("verification".into(), serde_json::Value::Object(checks));
    if !skipped.is_empty() {
        r.details.insert("skipped".into(), json!(skipped));
        if r.metrics.is_empty() {
            r.verdict = Verdict::Skipped;
            r.note = Some(skipped.join("; "));
        }
    }
    Ok(())
}

struct CaseResult {
    tflops: f64,
    samples: Vec<f64>,
    served_by: String,
    rel_err: f64,
    checked: usize,
    telemetry: serde_json::Value,
    /// Why the built-in kernel is not the best one for this GPU, when it is not.
    builtin_note: Option<String>,
}

#[allow(clippy::too_many_arguments)]
fn one_case(
    gpu: &Gpu,
    size: u64,
    p: &MatmulParams,
    spec: TypeSpec,
    builtin_only: bool,
    engines: &Engines,
    telemetry: &dyn Fn() -> RunTelemetry,
    ctl: &ProbeDeadline,
) -> Result<CaseResult, ProbeError> {
    let s = &gpu.stream;
    let (m, n, k) = (size, size, size);
    let use_lt = !builtin_only && engines.lt.is_some();
    if !use_lt && !matches!(spec.name, "bf16" | "fp16") {
        return Err(ProbeError::Unsupported(format!(
            "needs cuBLASLt ({})",
            engines.lt_note.as_deref().unwrap_or("not loaded")
        )));
    }
    let mm = gpu.module("matmul")?;
    let fill = mm.function("fill_matrix")?;
    let a = DeviceBuffer::new((m * k * spec.in_bytes) as usize)?;
    let b = DeviceBuffer::new((k * n * spec.in_bytes) as usize)?;
    let out_bytes = if use_lt { spec.out_bytes } else { 4 };
    let c = DeviceBuffer::new((m * n * out_bytes) as usize)?;
    for (buf, seed, count) in [(&a, SEED_A, m * k), (&b, SEED_B, k * n)] {
        let grid = grid_for(count, 256, gpu.info.multiprocessors);
        launch(
            fill,
            (grid, 1, 1),
            (256, 1, 1),
            0,
            s,
            &[&buf.ptr, &count, &seed, &spec.fill],
        )?;
    }
    // Poison the output so an unwritten entry cannot pass.
    c.memset(0xff, s)?;

    let ws;
    let plan;
    let served_by;
    let builtin_fn;
    let hopper;
    let mut builtin_note = None;
    let mut run: Box<dyn FnMut() -> Result<(), ProbeError> + '_> = if use_lt {
        let lt = engines
            .lt
            .as_ref()
            .ok_or_else(|| ProbeError::Cuda("cuBLASLt vanished".into()))?;
        let (ab_type, cd_type, compute) = match spec.name {
            "fp32" => (dtype::R_32F, dtype::R_32F, blas::compute::C32F),
            "tf32" => (dtype::R_32F, dtype::R_32F, blas::compute::C32F_FAST_TF32),
            "fp16" => (dtype::R_16F, dtype::R_16F, blas::compute::C32F),
            "bf16" => (dtype::R_16BF, dtype::R_16BF, blas::compute::C32F),
            _ => (dtype::R_8F_E4M3, dtype::R_16BF, blas::compute::C32F),
        };
        ws = DeviceBuffer::new(WORKSPACE)?;
        plan = lt.plan(
            &GemmSpec {
                m,
                n,
                k,
                ab_type,
                cd_type,
                compute,
            },
            WORKSPACE,
        )?;
        served_by = lt.served_by.clone();
        let (pa, pb, pc, w) = (a.ptr, b.ptr, c.ptr, (ws.ptr, WORKSPACE));
        let plan = &plan;
        Box::new(move || plan.run(pa, pb, pc, w, s))
    } else {
        let ty = if spec.name == "bf16" { "bf16" } else { "f16" };
        let want = std::env::var("GPUDIAG_MMA_VARIANT").unwrap_or_default();
        let forced_mma = BUILTIN_VARIANTS.iter().any(|v| v.0 == want);
        hopper = if gpu.cc == (9, 0) && !forced_mma {
            match hopper_kernel(gpu, ty, &want, (a.ptr, b.ptr), (m, n, k)) {
                Ok(h) => Some(h),
                Err(e) => {
                    builtin_note = Some(format!("wgmma kernel unavailable, mma.sync used: {e}"));
                    None
                }
            }
        } else {
            None
        };
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let pc = c.ptr;
        if let Some(h) = &hopper {
            served_by = h.served_by.clone();
            let grid = (((m / WGMMA_TILE_I) * (n / WGMMA_TILE_J)) as u32, 1, 1);
            Box::new(move || {
                launch(
                    h.function,
                    grid,
                    (384, 1, 1),
                    h.shared_bytes,
                    s,
                    &[&h.map_a, &h.map_b, &pc, &mi, &ni, &ki],
                )
            })
        } else {
            let (variant, bk, stages) = builtin_variant(&want);
            builtin_fn = mm.function(&format!("mma_gemm_{ty}_{variant}"))?;
            let smem: u32 = stages * (128 + 256) * (bk + 8) * 2;
            set_max_dynamic_shared(builtin_fn, smem as i32)?;
            served_by = format!("built-in mma.sync {variant} {}", mm.served_by);
            // One block per 128×256 tile, rastered by the kernel itself.
            let grid = (((m / 128) * (n / 256)) as u32, 1, 1);
            let f = builtin_fn;
            let (pa, pb) = (a.ptr, b.ptr);
            Box::new(move || {
                launch(
                    f,
                    grid,
                    (256, 1, 1),
                    smem,
                    s,
                    &[&pa, &pb, &pc, &mi, &ni, &ki],
                )
            })
        }
    };
    for _ in 0..WARMUPS {
        run()?;
    }
    s.synchronize()?;
    let tel = telemetry();
    let (e0, e1) = (Event::new()?, Event::new()?);
    let mut samples = Vec::new();
    for i in 0..p.iterations {
        if i % 4 == 0 {
            ctl.check()?;
        }
        e0.record(s)?;
        run()?;
        e1.record(s)?;
        samples.push(tflops(m, n, k, e0.elapsed_ms(&e1)?));
    }
    let telemetry = tel.finish();
    drop(run);
    if test_fault("matmul") {
        // Test hook: a corrupted result, which verification must reject.
        c.memset(0x3c, s)?;
    }
    s.synchronize()?;

    let points = sample_points(m, n, p.verify_samples);
    let mut got = Vec::with_capacity(points.len());
    let mut want = Vec::with_capacity(points.len());
    let out_kind = if use_lt { spec.out } else { 0 };
    let mut bytes = vec![0u8; out_bytes as usize];
    for (i, j) in &points {
        c.read(((j * m + i) * out_bytes) as usize, &mut bytes)?;
        got.push(decode(out_kind, &bytes));
        want.push(reference_entry(*i, *j, k, spec.fill));
    }
    let rel_err = relative_error(&got, &want);
    Ok(CaseResult {
        tflops: median(&samples).unwrap_or(f64::NAN),
        samples,
        served_by,
        rel_err,
        checked: points.len(),
        telemetry,
        builtin_note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse() {
        assert_eq!(
            parse_case("bf16").map(|c| (c.0.name, c.1)),
            Some(("bf16", false))
        );
        assert_eq!(
            parse_case("fp16/builtin").map(|c| (c.0.name, c.1)),
            Some(("fp16", true))
        );
        assert!(parse_case("fp32/builtin").is_none());
        assert!(parse_case("int8").is_none());
        assert!(parse_case("bf16/magic").is_none());
    }

    #[test]
    fn inputs_are_random_small_and_exact() {
        let vals: Vec<f64> = (0..1000).map(|i| element(i, SEED_A, 1)).collect();
        assert!(vals.iter().all(|v| (-1.0..=1.0).contains(v)));
        assert!(
            vals.iter().filter(|v| **v == 0.0).count() < 30,
            "mostly non-zero"
        );
        // Exact in bf16: 64·v is an integer.
        assert!(vals.iter().all(|v| (v * 64.0).fract() == 0.0));
        let fp8: Vec<f64> = (0..1000).map(|i| element(i, SEED_B, 3)).collect();
        assert!(
            fp8.iter()
                .all(|v| (v * 8.0).fract() == 0.0 && v.abs() <= 1.0)
        );
        // Different seeds give different matrices.
        assert_ne!(element(7, SEED_A, 1), element(7, SEED_B, 1));
    }

    #[test]
    fn decoders_match_known_bit_patterns() {
        assert_eq!(decode(0, &1.5f32.to_le_bytes()), 1.5);
        assert_eq!(decode(1, &0x3fc0u16.to_le_bytes()), 1.5);
        assert_eq!(decode(2, &0x3e00u16.to_le_bytes()), 1.5);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
        assert!(f16_to_f64(0x7e00).is_nan());
        // 0xffff poison reads as NaN in bf16 and fp16, and fails verification.
        assert!(decode(1, &[0xff, 0xff]).is_nan());
        assert_eq!(relative_error(&[f64::NAN], &[1.0]), f64::INFINITY);
    }

    #[test]
    fn verification_maths() {
        assert_eq!(relative_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = relative_error(&[1.01, 2.0], &[1.0, 2.0]);
        assert!((e - 0.01 / 5f64.sqrt()).abs() < 1e-12);
        // A tiny case computed by hand against the reference function.
        let k = 3;
        let direct: f64 = (0..k)
            .map(|kk| element(kk, SEED_A, 1) * element(2 * k + kk, SEED_B, 1))
            .sum();
        assert_eq!(reference_entry(0, 2, k, 1), direct);
        let pts = sample_points(256, 512, 64);
        assert_eq!(pts.len(), 64);
        assert!(pts.iter().all(|(i, j)| *i < 256 && *j < 512));
    }
}
