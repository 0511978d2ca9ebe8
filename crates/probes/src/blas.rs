//! cuBLASLt, loaded at run time from wherever `check` finds it (CUDA 12 or 13), for the matmul
//! probe's vendor-library ceiling. Only the dozen entry points the probe needs are bound; a
//! missing library or `GPUDIAG_DRIVER_ONLY` leaves the built-in kernel to do the work.
//!
//! Bound by hand with libloading rather than through cudarc's `cublaslt` module (checked
//! against cudarc 0.19.10): cudarc's loader tries fixed bare names on the loader's path, built
//! from the CUDA version chosen at compile time (no `libcublasLt.so.13` under our `cuda-12000`),
//! takes no path and no loaded library, so it cannot open the file `cuda_libraries` found (in a
//! PyTorch wheel's `site-packages/nvidia/*/lib`, say); and it panics on first use when nothing
//! opens or a symbol is missing, where a missing library must become a note and the built-in
//! kernel. Its safe `Matmul<f32>` is also fixed to TF32 compute, so it has no plain-fp32
//! ceiling. Revisit when cudarc loads from a given path without panicking.

use std::ffi::c_void;

use super::ProbeError;
use super::gpu::Stream;
use gpudiag_model::cuda_libraries;

type Handle = *mut c_void;
type Status = i32;

/// cudaDataType values.
pub mod dtype {
    pub const R_32F: i32 = 0;
    pub const R_16F: i32 = 2;
    pub const R_16BF: i32 = 14;
    pub const R_8F_E4M3: i32 = 28;
}

/// cublasComputeType_t values.
pub mod compute {
    pub const C32F: i32 = 68;
    pub const C32F_FAST_TF32: i32 = 77;
}

const DESC_TRANSA: i32 = 3;
const DESC_TRANSB: i32 = 4;
const PREF_MAX_WORKSPACE_BYTES: i32 = 1;
const OP_N: i32 = 0;
const OP_T: i32 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
struct HeuristicResult {
    algo: [u64; 8],
    workspace_size: usize,
    state: Status,
    waves_count: f32,
    reserved: [i32; 4],
}

struct Fns {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    get_version: unsafe extern "C" fn() -> usize,
    desc_create: unsafe extern "C" fn(*mut Handle, i32, i32) -> Status,
    desc_set: unsafe extern "C" fn(Handle, i32, *const c_void, usize) -> Status,
    desc_destroy: unsafe extern "C" fn(Handle) -> Status,
    layout_create: unsafe extern "C" fn(*mut Handle, i32, u64, u64, i64) -> Status,
    layout_destroy: unsafe extern "C" fn(Handle) -> Status,
    pref_create: unsafe extern "C" fn(*mut Handle) -> Status,
    pref_set: unsafe extern "C" fn(Handle, i32, *const c_void, usize) -> Status,
    pref_destroy: unsafe extern "C" fn(Handle) -> Status,
    #[allow(clippy::type_complexity)]
    heuristic: unsafe extern "C" fn(
        Handle,
        Handle,
        Handle,
        Handle,
        Handle,
        Handle,
        Handle,
        i32,
        *mut HeuristicResult,
        *mut i32,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        Handle,
        Handle,
        *const c_void,
        u64,
        Handle,
        u64,
        Handle,
        *const c_void,
        u64,
        Handle,
        u64,
        Handle,
        *const c_void,
        *mut c_void,
        usize,
        *mut c_void,
    ) -> Status,
}

/// A loaded cuBLASLt with one handle.
pub struct Lt {
    fns: Fns,
    handle: Handle,
    /// "cuBLASLt 13.1.0 (/usr/local/cuda/lib64/libcublasLt.so.13.1.0.3)".
    pub served_by: String,
    // Kept last so it is dropped after the handle is destroyed.
    _lib: libloading::Library,
}

/// Where cuBLASLt is, or why it is not used.
pub fn locate() -> Result<String, String> {
    if cuda_libraries::driver_only() {
        return Err(format!(
            "cuBLASLt ignored: {} is set",
            cuda_libraries::DRIVER_ONLY_ENV
        ));
    }
    let libs = cuda_libraries::detect_libraries();
    let lt = libs.iter().find(|l| l.name == "libcublasLt");
    match lt {
        Some(l) if l.found => l.path.clone().ok_or_else(|| "cuBLASLt has no path".into()),
        Some(l) => Err(l
            .note
            .clone()
            .unwrap_or_else(|| "cuBLASLt not found".into())),
        None => Err("cuBLASLt not found".into()),
    }
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's type is the documented cuBLASLt prototype.
        *unsafe { $lib.get($name) }
            .map_err(|e| format!("cuBLASLt lacks {}: {e}", stringify!($name)))?
    };
}

impl Lt {
    /// Loads cuBLASLt from `path` and creates a handle.
    pub fn load(path: &str) -> Result<Lt, String> {
        // SAFETY: loading a vendor library runs its initialisers; cuBLASLt's are benign.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("could not load {path}: {e}"))?;
        let fns = Fns {
            create: sym!(lib, b"cublasLtCreate\0"),
            destroy: sym!(lib, b"cublasLtDestroy\0"),
            get_version: sym!(lib, b"cublasLtGetVersion\0"),
            desc_create: sym!(lib, b"cublasLtMatmulDescCreate\0"),
            desc_set: sym!(lib, b"cublasLtMatmulDescSetAttribute\0"),
            desc_destroy: sym!(lib, b"cublasLtMatmulDescDestroy\0"),
            layout_create: sym!(lib, b"cublasLtMatrixLayoutCreate\0"),
            layout_destroy: sym!(lib, b"cublasLtMatrixLayoutDestroy\0"),
            pref_create: sym!(lib, b"cublasLtMatmulPreferenceCreate\0"),
            pref_set: sym!(lib, b"cublasLtMatmulPreferenceSetAttribute\0"),
            pref_destroy: sym!(lib, b"cublasLtMatmulPreferenceDestroy\0"),
            heuristic: sym!(lib, b"cublasLtMatmulAlgoGetHeuristic\0"),
            matmul: sym!(lib, b"cublasLtMatmul\0"),
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle; the CUDA context is current on this thread.
        let st = unsafe { (fns.create)(&mut handle) };
        if st != 0 {
            return Err(format!("cublasLtCreate failed with status {st}"));
        }
        // SAFETY: no arguments.
        let v = unsafe { (fns.get_version)() };
        let served_by = format!("cuBLASLt {} ({path})", version_string(v));
        Ok(Lt {
            fns,
            handle,
            served_by,
            _lib: lib,
        })
    }

    /// Plans D = A·B in the "TN" form: A stored K×M (ld K) and transposed, B stored K×N (ld K),
    /// C and D M×N (ld M), all column-major; the layout fp8 requires and the others accept.
    pub fn plan(&self, g: &GemmSpec, workspace: usize) -> Result<Plan<'_>, ProbeError> {
        let f = &self.fns;
        let err =
            |what: &str, st: Status| ProbeError::Cuda(format!("{what}: cuBLASLt status {st}"));
        let mut p = Plan {
            lt: self,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: None,
        };
        // SAFETY: each call writes one handle or reads a value of the documented type and
        // size; handles are destroyed by Plan's Drop.
        unsafe {
            let st = (f.desc_create)(&mut p.desc, g.compute, dtype::R_32F);
            if st != 0 {
                return Err(err("cublasLtMatmulDescCreate", st));
            }
            for (attr, op) in [(DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)] {
                let st = (f.desc_set)(p.desc, attr, &op as *const i32 as *const c_void, 4);
                if st != 0 {
                    return Err(err("cublasLtMatmulDescSetAttribute", st));
                }
            }
            let (m, n, k) = (g.m, g.n, g.k);
            let shapes = [
                (g.ab_type, k, m, k),
                (g.ab_type, k, n, k),
                (g.cd_type, m, n, m),
            ];
            for (i, (t, rows, cols, ld)) in shapes.into_iter().enumerate() {
                let st = (f.layout_create)(&mut p.layouts[i], t, rows, cols, ld as i64);
                if st != 0 {
                    return Err(err("cublasLtMatrixLayoutCreate", st));
                }
            }
            let mut pref: Handle = std::ptr::null_mut();
            let st = (f.pref_create)(&mut pref);
            if st != 0 {
                return Err(err("cublasLtMatmulPreferenceCreate", st));
            }
            let ws = workspace as u64;
            let st = (f.pref_set)(
                pref,
                PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            );
            let mut res = [HeuristicResult {
                algo: [0; 8],
                workspace_size: 0,
                state: 0,
                waves_count: 0.0,
                reserved: [0; 4],
            }];
            let mut found = 0i32;
            let hst = if st == 0 {
                (f.heuristic)(
                    self.handle,
                    p.desc,
                    p.layouts[0],
                    p.layouts[1],
                    p.layouts[2],
                    p.layouts[2],
                    pref,
                    1,
                    res.as_mut_ptr(),
                    &mut found,
                )
            } else {
                st
            };
            (f.pref_destroy)(pref);
            if hst != 0 || found < 1 {
                return Err(ProbeError::Unsupported(format!(
                    "cuBLASLt has no algorithm for this type on this GPU (status {hst})"
                )));
            }
            p.algo = Some(res[0].algo);
        }
        Ok(p)
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: our handle, destroyed once, before the library is unloaded.
        unsafe { (self.fns.destroy)(self.handle) };
    }
}

/// Types and sizes of one matmul.
#[derive(Debug, Clone, Copy)]
pub struct GemmSpec {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub ab_type: i32,
    pub cd_type: i32,
    pub compute: i32,
}

/// A planned matmul: descriptors and the chosen algorithm.
pub struct Plan<'a> {
    lt: &'a Lt,
    desc: Handle,
    layouts: [Handle; 3],
    algo: Option<[u64; 8]>,
}

impl Plan<'_> {
    /// Enqueues D = A·B on `stream` (C = D, beta = 0).
    pub fn run(
        &self,
        a: u64,
        b: u64,
        d: u64,
        workspace: (u64, usize),
        stream: &Stream,
    ) -> Result<(), ProbeError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let algo = self.algo.as_ref().map_or(std::ptr::null(), |a| a.as_ptr());
        // SAFETY: device pointers come from live allocations sized for this plan; scalars
        // are host fp32 as the scale type says; the stream belongs to the current context.
        let st = unsafe {
            (self.lt.fns.matmul)(
                self.lt.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                a,
                self.layouts[0],
                b,
                self.layouts[1],
                &beta as *const f32 as *const c_void,
                d,
                self.layouts[2],
                d,
                self.layouts[2],
                algo as *const c_void,
                workspace.0 as *mut c_void,
                workspace.1,
                stream.raw as *mut c_void,
            )
        };
        if st != 0 {
            return Err(ProbeError::Cuda(format!("cublasLtMatmul: status {st}")));
        }
        Ok(())
    }
}

impl Drop for Plan<'_> {
    fn drop(&mut self) {
        // SAFETY: handles created in plan(), destroyed once; null ones are skipped.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    (self.lt.fns.layout_destroy)(l);
                }
            }
            if !self.desc.is_null() {
                (self.lt.fns.desc_destroy)(self.desc);
            }
        }
    }
}

/// cuBLASLt's version number (130100, or 120805 for 12.8.5) as "13.1.0".
pub fn version_string(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_like_the_release_names() {
        assert_eq!(version_string(130100), "13.1.0");
        assert_eq!(version_string(120805), "12.8.5");
    }

    #[test]
    fn heuristic_result_has_the_c_layout() {
        assert_eq!(std::mem::size_of::<HeuristicResult>(), 96);
    }
}
