//! The GPU context layer over the CUDA driver API (cudarc, loaded at run time): context creation
//! under a deadline, device buffers, pinned host buffers, streams, events, modules from the
//! embedded PTX and kernel launches. Everything frees itself on drop, so a probe that stops early
//! (deadline, Ctrl-C, error) leaves no GPU memory behind.

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{CudaContext, DriverError, result};
use serde::{Deserialize, Serialize};

use super::ProbeError;
use super::ptx;
use gpudiag_model::deadline::run_with_deadline;

/// Turns a driver error into a probe error that says which call failed.
pub(crate) fn cuda(what: &str) -> impl FnOnce(DriverError) -> ProbeError + '_ {
    move |e| ProbeError::Cuda(format!("{what}: {e}"))
}

/// A raw driver call's result, as a probe error naming the call.
pub(crate) fn ck(r: sys::CUresult, what: &str) -> Result<(), ProbeError> {
    r.result().map_err(cuda(what))
}

/// What the driver says about the device a context was made on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct GpuInfo {
    /// CUDA ordinal (may differ from the NVML index under CUDA_VISIBLE_DEVICES).
    pub ordinal: usize,
    pub name: String,
    /// "9.0".
    pub compute_capability: String,
    pub multiprocessors: i32,
    pub total_memory_bytes: u64,
    /// "0000:19:00.0", lower case, as the driver prints it.
    pub pci_bus_id: String,
    /// The CUDA version the driver supports, "13.0".
    pub driver_cuda_version: String,
    /// How long creating the context took.
    pub context_ms: f64,
}

/// A CUDA context on one device, current on the thread that made it, with one stream.
pub struct Gpu {
    // Fields drop in order: the stream must go before the context is released, or its
    // destruction touches a destroyed context.
    pub stream: Stream,
    pub info: GpuInfo,
    pub cc: (i32, i32),
    ctx: Arc<CudaContext>,
}

/// True when the driver library can be loaded; cudarc would panic on first use otherwise.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda under its usual names; loads nothing else.
    unsafe { sys::is_culib_present() }
}

/// Number of CUDA devices, or why there are none.
pub fn device_count() -> Result<usize, ProbeError> {
    if !driver_present() {
        return Err(ProbeError::Unsupported(
            "libcuda (the NVIDIA driver's CUDA library) was not found".into(),
        ));
    }
    result::init().map_err(cuda("cuInit"))?;
    let n = result::device::get_count().map_err(cuda("cuDeviceGetCount"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The PCI bus id of a CUDA ordinal, lower case ("0000:19:00.0").
pub fn pci_bus_id(ordinal: usize) -> Result<String, ProbeError> {
    let dev = result::device::get(ordinal as i32).map_err(cuda("cuDeviceGet"))?;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer is 32 bytes and its length is passed; the driver NUL-terminates.
    ck(
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "cuDeviceGetPCIBusId",
    )?;
    // SAFETY: NUL-terminated by the driver within the buffer.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().to_ascii_lowercase())
}

/// The device's name as the CUDA driver gives it, without creating a context.
pub fn device_name(ordinal: usize) -> Option<String> {
    let dev = result::device::get(i32::try_from(ordinal).ok()?).ok()?;
    result::device::get_name(dev).ok()
}

/// "00000000:19:00.0" (NVML) and "0000:19:00.0" (CUDA) name the same device.
pub fn same_pci_bus(a: &str, b: &str) -> bool {
    fn norm(s: &str) -> Option<(u64, String)> {
        let (dom, rest) = s.trim().split_once(':')?;
        Some((
            u64::from_str_radix(dom, 16).ok()?,
            rest.to_ascii_lowercase(),
        ))
    }
    matches!((norm(a), norm(b)), (Some(x), Some(y)) if x == y)
}

impl Gpu {
    /// Creates (retains) the primary context of `ordinal`, waiting at most `timeout`: a wedged
    /// driver can hang context creation, and a probe must not hang a scheduler's prolog.
    pub fn open(ordinal: usize, timeout: Duration) -> Result<Gpu, ProbeError> {
        if !driver_present() {
            return Err(ProbeError::Unsupported(
                "libcuda (the NVIDIA driver's CUDA library) was not found".into(),
            ));
        }
        let start = Instant::now();
        let ctx = run_with_deadline("cuda-context", timeout, move || CudaContext::new(ordinal))
            .map_err(|e| ProbeError::Cuda(format!("creating the CUDA context {e}")))?
            .map_err(cuda("creating the CUDA context"))?;
        // The context was made current on the helper thread; make it current here too.
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let context_ms = start.elapsed().as_secs_f64() * 1e3;
        let cc = ctx
            .compute_capability()
            .map_err(cuda("compute capability"))?;
        let mut version = 0i32;
        // SAFETY: writes one int.
        ck(
            unsafe { sys::cuDriverGetVersion(&mut version) },
            "cuDriverGetVersion",
        )?;
        let info = GpuInfo {
            ordinal,
            name: ctx.name().map_err(cuda("cuDeviceGetName"))?,
            compute_capability: format!("{}.{}", cc.0, cc.1),
            multiprocessors: ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(cuda("multiprocessor count"))?,
            total_memory_bytes: ctx.total_mem().map_err(cuda("cuDeviceTotalMem"))? as u64,
            pci_bus_id: pci_bus_id(ordinal)?,
            driver_cuda_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
            context_ms,
        };
        let stream = Stream::new()?;
        Ok(Gpu {
            ctx,
            info,
            cc,
            stream,
        })
    }

    /// Makes this GPU's context current on the calling thread: allocations, streams and events
    /// belong to the context current when they are made, so work on several GPUs switches.
    pub fn bind(&self) -> Result<(), ProbeError> {
        self.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))
    }

    pub fn raw_context(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }

    pub fn raw_device(&self) -> sys::CUdevice {
        self.ctx.cu_device()
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), ProbeError> {
        let (f, t) = self.ctx.mem_get_info().map_err(cuda("cuMemGetInfo"))?;
        Ok((f as u64, t as u64))
    }

    pub fn synchronize(&self) -> Result<(), ProbeError> {
        self.ctx.synchronize().map_err(cuda("cuCtxSynchronize"))
    }

    /// Loads the best embedded PTX of `kernel` for this device.
    pub fn module(&self, kernel: &str) -> Result<Module, ProbeError> {
        let p = ptx::select(kernel, self.cc).ok_or_else(|| {
            ProbeError::Unsupported(format!(
                "no embedded PTX of '{kernel}' runs on compute capability {}",
                self.info.compute_capability
            ))
        })?;
        let text = CString::new(p.text)
            .map_err(|_| ProbeError::Cuda(format!("{kernel} PTX holds a NUL byte")))?;
        // SAFETY: `text` is a NUL-terminated PTX image that outlives the call.
        let m = unsafe { result::module::load_data(text.as_ptr() as *const c_void) }
            .map_err(cuda("cuModuleLoadData"))?;
        Ok(Module {
            raw: m,
            served_by: format!(
                "{kernel} kernel (embedded PTX compute_{}{})",
                p.arch,
                if p.arch_specific { "a" } else { "" }
            ),
        })
    }
}

/// A kernel of a loaded module. Only made by `Module::function`, so the handle is valid while
/// its module lives.
#[derive(Clone, Copy)]
pub struct Function(sys::CUfunction);

/// A loaded module; unloaded on drop.
pub struct Module {
    raw: sys::CUmodule,
    /// "copy kernel (embedded PTX compute_90)".
    pub served_by: String,
}

impl Module {
    pub fn function(&self, name: &str) -> Result<Function, ProbeError> {
        let c = CString::new(name).map_err(|_| ProbeError::Cuda("bad kernel name".into()))?;
        // SAFETY: the module is loaded; the function handle lives as long as the module, and
        // callers keep the module alive while they launch.
        unsafe { result::module::get_function(self.raw, c) }
            .map(Function)
            .map_err(cuda("cuModuleGetFunction"))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by us and unloaded once.
        let _ = unsafe { result::module::unload(self.raw) };
    }
}

/// A non-blocking stream; destroyed on drop.
pub struct Stream {
    pub raw: sys::CUstream,
}

impl Stream {
    pub fn new() -> Result<Stream, ProbeError> {
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(cuda("cuStreamCreate"))?;
        Ok(Stream { raw })
    }

    pub fn synchronize(&self) -> Result<(), ProbeError> {
        // SAFETY: a stream we created.
        unsafe { result::stream::synchronize(self.raw) }.map_err(cuda("cuStreamSynchronize"))
    }

    /// Makes this stream wait for `e`.
    pub fn wait(&self, e: &Event) -> Result<(), ProbeError> {
        // SAFETY: both handles are ours and alive.
        unsafe {
            result::stream::wait_event(
                self.raw,
                e.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(cuda("cuStreamWaitEvent"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once (pending work completes first).
        let _ = unsafe { result::stream::destroy(self.raw) };
    }
}

/// A timing event; destroyed on drop.
pub struct Event {
    raw: sys::CUevent,
}

impl Event {
    pub fn new() -> Result<Event, ProbeError> {
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(cuda("cuEventCreate"))?;
        Ok(Event { raw })
    }

    pub fn record(&self, s: &Stream) -> Result<(), ProbeError> {
        // SAFETY: both handles are ours and alive.
        unsafe { result::event::record(self.raw, s.raw) }.map_err(cuda("cuEventRecord"))
    }

    /// Milliseconds from `self` to `end`, both recorded; waits for `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64, ProbeError> {
        // SAFETY: both events are ours and recorded.
        unsafe {
            result::event::synchronize(end.raw).map_err(cuda("cuEventSynchronize"))?;
            result::event::elapsed(self.raw, end.raw)
                .map(f64::from)
                .map_err(cuda("cuEventElapsedTime"))
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// Device memory from cuMemAlloc (never managed memory); freed on drop.
pub struct DeviceBuffer {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DeviceBuffer {
    pub fn new(bytes: usize) -> Result<DeviceBuffer, ProbeError> {
        // SAFETY: a plain allocation; the pointer is only used through the driver.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| ProbeError::Cuda(format!("cuMemAlloc of {bytes} bytes: {e}")))?;
        Ok(DeviceBuffer { ptr, bytes })
    }

    /// Fills every byte with `v` (to poison outputs before a run).
    pub fn memset(&self, v: u8, s: &Stream) -> Result<(), ProbeError> {
        // SAFETY: within our allocation.
        unsafe { result::memset_d8_async(self.ptr, v, self.bytes, s.raw) }
            .map_err(cuda("cuMemsetD8Async"))
    }

    /// Copies `out.len()` bytes from byte offset `offset` to the host (synchronous).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), ProbeError> {
        if offset + out.len() > self.bytes {
            return Err(ProbeError::Cuda(
                "read past the end of a device buffer".into(),
            ));
        }
        // SAFETY: the range lies inside the allocation and `out` is writable for its length.
        ck(
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    out.as_mut_ptr() as *mut c_void,
                    self.ptr + offset as u64,
                    out.len(),
                )
            },
            "cuMemcpyDtoH",
        )
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by us, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Page-locked host memory (cuMemHostAlloc); freed on drop.
pub struct PinnedBuffer {
    pub ptr: *mut c_void,
    pub bytes: usize,
}

impl PinnedBuffer {
    pub fn new(bytes: usize) -> Result<PinnedBuffer, ProbeError> {
        // SAFETY: a plain pinned allocation of `bytes`.
        let ptr = unsafe { result::malloc_host(bytes.max(1), 0) }
            .map_err(|e| ProbeError::Cuda(format!("cuMemHostAlloc of {bytes} bytes: {e}")))?;
        // Touch it with non-zero data so nothing is timed on fresh zero pages.
        // SAFETY: `ptr` points to `bytes` writable bytes we own.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0x5a, bytes) };
        Ok(PinnedBuffer { ptr, bytes })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by us, freed once.
        let _ = unsafe { result::free_host(self.ptr) };
    }
}

/// A TMA tensor map (the driver's `CUtensorMap`) over a row-major `rows` × `cols` matrix of
/// 2-byte elements in device memory, read in boxes of `box_rows` × `box_cols` into shared memory
/// in the 128-byte swizzle that wgmma's descriptors name. Passed to a kernel by value.
#[repr(transparent)]
pub struct TensorMap(
    // Read only by the driver, through the kernel-argument pointer.
    #[allow(dead_code)] sys::CUtensorMap,
);

impl TensorMap {
    pub fn swizzled_128b(
        ptr: u64,
        rows: u64,
        cols: u64,
        box_rows: u32,
        box_cols: u32,
    ) -> Result<TensorMap, ProbeError> {
        let mut version = 0i32;
        // SAFETY: writes one int.
        ck(
            unsafe { sys::cuDriverGetVersion(&mut version) },
            "cuDriverGetVersion",
        )?;
        // The entry point appeared with CUDA 12.0; calling it through an older driver would
        // fail to resolve the symbol.
        if version < 12000 {
            return Err(ProbeError::Unsupported(format!(
                "tensor maps need a CUDA 12.0 driver (this one is {}.{})",
                version / 1000,
                (version % 1000) / 10
            )));
        }
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let dims: [sys::cuuint64_t; 2] = [cols, rows];
        let strides: [sys::cuuint64_t; 1] = [cols * 2];
        let boxes: [sys::cuuint32_t; 2] = [box_cols, box_rows];
        let element_strides: [sys::cuuint32_t; 2] = [1, 1];
        // SAFETY: every array outlives the call and has the rank's length (strides: rank − 1);
        // `ptr` is a device allocation of at least rows × cols × 2 bytes, owned by the caller for
        // as long as kernels use the map.
        ck(
            unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                    2,
                    ptr as *mut c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    boxes.as_ptr(),
                    element_strides.as_ptr(),
                    sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                    sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            },
            "cuTensorMapEncodeTiled",
        )?;
        Ok(TensorMap(map))
    }
}

/// One kernel argument: a pointer to the value, as cuLaunchKernel wants. Implemented for the
/// scalar types kernels take only: a blanket impl would also match `&dyn KernelArg` itself and
/// hand the driver the address of a reference instead of the value.
pub trait KernelArg {
    fn as_arg(&self) -> *mut c_void;
}

macro_rules! kernel_arg {
    ($($t:ty),*) => {$(
        impl KernelArg for $t {
            fn as_arg(&self) -> *mut c_void {
                self as *const $t as *mut c_void
            }
        }
    )*};
}
kernel_arg!(u64, u32, i32, f32, TensorMap);

/// Launches `f` with `args` (each a reference to a value of the kernel's parameter type).
pub fn launch(
    f: Function,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
    s: &Stream,
    args: &[&dyn KernelArg],
) -> Result<(), ProbeError> {
    let mut params: Vec<*mut c_void> = args.iter().map(|a| KernelArg::as_arg(*a)).collect();
    // SAFETY: `params` points at live values whose types match the kernel's parameters (each
    // caller passes exactly the kernel's signature); cuLaunchKernel copies them before return.
    unsafe { result::launch_kernel(f.0, grid, block, shared_bytes, s.raw, &mut params) }
        .map_err(cuda("cuLaunchKernel"))
}

/// A grid-stride launch shape for `n` elements: enough blocks to fill the GPU several times.
pub fn grid_for(n: u64, block: u32, multiprocessors: i32) -> u32 {
    let needed = n.div_ceil(u64::from(block)).max(1);
    let cap = u64::try_from(multiprocessors.max(1)).unwrap_or(1) * 32;
    u32::try_from(needed.min(cap)).unwrap_or(u32::MAX)
}

/// Bytes of local memory per thread the driver compiled `f` to use: register spills, for a
/// kernel written to keep everything in registers.
pub fn spilled_bytes(f: Function) -> Result<i32, ProbeError> {
    let mut local = 0i32;
    // SAFETY: a valid function handle of a loaded module; writes one int.
    ck(
        unsafe {
            sys::cuFuncGetAttribute(
                &mut local,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                f.0,
            )
        },
        "cuFuncGetAttribute",
    )?;
    Ok(local)
}

/// Raises a kernel's dynamic shared memory limit (needed above 48 KiB).
pub fn set_max_dynamic_shared(f: Function, bytes: i32) -> Result<(), ProbeError> {
    // SAFETY: a valid function handle of a loaded module.
    ck(
        unsafe {
            sys::cuFuncSetAttribute(
                f.0,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
        },
        "cuFuncSetAttribute",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_ids_compare_across_nvml_and_cuda_spellings() {
        assert!(same_pci_bus("00000000:19:00.0", "0000:19:00.0"));
        assert!(same_pci_bus("00000000:AB:00.0", "0000:ab:00.0"));
        assert!(!same_pci_bus("00000000:19:00.0", "0000:1a:00.0"));
        assert!(!same_pci_bus("garbage", "0000:19:00.0"));
    }

    #[test]
    fn kernel_args_point_at_the_values_not_at_references() {
        let (p, n) = (0xdead_beef_u64, 7u32);
        let args: [&dyn KernelArg; 2] = [&p, &n];
        let ptrs: Vec<*mut c_void> = args.iter().map(|a| KernelArg::as_arg(*a)).collect();
        // SAFETY: the pointers point at `p` and `n`, alive here.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u64), 0xdead_beef);
            assert_eq!(*(ptrs[1] as *const u32), 7);
        }
    }

    #[test]
    fn grids_cover_small_inputs_and_cap_large_ones() {
        assert_eq!(grid_for(1, 256, 132), 1);
        assert_eq!(grid_for(1000, 256, 132), 4);
        assert_eq!(grid_for(1 << 30, 256, 132), 132 * 32);
        assert_eq!(grid_for(0, 256, 0), 1);
    }
}
