//! Kernel names as a user reads them: demangled (the driver gives Itanium-mangled symbols),
//! and for text shortened to the function's qualified name (PyTorch's elementwise kernels carry
//! a page of template arguments each).

use gpudiag_model::kernels::MAX_KERNEL_NAME_BYTES;

/// The demangled name, or the name as given when it is not a C++ symbol (`extern "C"` kernels,
/// Triton's) or was cut short by the collector.
pub fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") {
        return name.to_owned();
    }
    cpp_demangle::Symbol::new(name.as_bytes())
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| name.to_owned())
}

/// The longest short name text shows.
const SHORT_MAX_CHARS: usize = 96;

/// `void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, …>(int, …)`
/// gives `at::native::vectorized_elementwise_kernel<…>`: no return type, no parameters,
/// template arguments elided.
pub fn shorten(demangled: &str) -> String {
    let mut name = demangled.trim();
    name = name.strip_prefix("void ").unwrap_or(name);
    // The parameter list is the last parenthesised group; `(anonymous namespace)` inside the
    // name stays.
    if name.ends_with(')')
        && let Some(open) = matching_open(name)
        && open > 0
    {
        name = &name[..open];
    }
    let mut out = String::with_capacity(name.len().min(SHORT_MAX_CHARS + 4));
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '<' => {
                if depth == 0 {
                    out.push_str("<…>");
                }
                depth += 1;
            }
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if out.chars().count() > SHORT_MAX_CHARS {
        let cut: String = out.chars().take(SHORT_MAX_CHARS - 1).collect();
        return cut + "…";
    }
    if out.is_empty() {
        return demangled.chars().take(SHORT_MAX_CHARS).collect();
    }
    out
}

/// The byte index of the `(` matching the final `)`.
fn matching_open(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether a kernel is NCCL's: its communication kernels are `ncclDevKernel_…` (NCCL 2.19 on)
/// or `ncclKernel_…`, mangled as `_Z<length>ncclDevKernel_…`.
pub fn is_nccl(name: &str) -> bool {
    let plain = match name.strip_prefix("_Z") {
        Some(rest) => rest.trim_start_matches(|c: char| c.is_ascii_digit()),
        None => name,
    };
    plain.starts_with("ncclDevKernel") || plain.starts_with("ncclKernel")
}

/// `name` cut at `MAX_KERNEL_NAME_BYTES` on a character boundary: the collector caps names,
/// and so does gpudiag, whatever arrives.
pub fn capped(name: &str) -> &str {
    if name.len() <= MAX_KERNEL_NAME_BYTES {
        return name;
    }
    let mut end = MAX_KERNEL_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pytorch_elementwise_kernel_is_demangled_and_shortened() {
        let mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_";
        let full = demangle(mangled);
        assert_eq!(
            full,
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, \
             std::array<char*, (unsigned long)1> >(int, at::native::FillFunctor<float>, std::array<char*, (unsigned long)1>)"
        );
        assert_eq!(
            shorten(&full),
            "at::native::vectorized_elementwise_kernel<…>"
        );
    }

    #[test]
    fn names_that_are_not_cpp_symbols_stay_as_they_are() {
        assert_eq!(demangle("triton_poi_fused_add_0"), "triton_poi_fused_add_0");
        assert_eq!(
            shorten("sm90_xmma_gemm_bf16bf16_bf16f32"),
            "sm90_xmma_gemm_bf16bf16_bf16f32"
        );
        // Cut by the collector: not a whole symbol any more.
        assert_eq!(demangle("_ZN2at6nat…"), "_ZN2at6nat…");
        assert_eq!(
            shorten(
                "void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"
            ),
            "(anonymous namespace)::softmax_warp_forward<…>"
        );
    }

    #[test]
    fn nccl_kernels_are_known_mangled_or_not() {
        assert!(is_nccl(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        ));
        assert!(is_nccl(
            "_Z29ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"
        ));
        assert!(is_nccl("ncclKernel_AllGather_RING_LL_Sum_int8_t"));
        assert!(!is_nccl("_ZN2at6native13reduce_kernelILi512ELi1E"));
        assert!(!is_nccl("my_ncclDevKernel"));
    }

    #[test]
    fn long_names_are_capped_on_a_character_boundary() {
        let long = "é".repeat(MAX_KERNEL_NAME_BYTES);
        let cut = capped(&long);
        assert!(cut.len() <= MAX_KERNEL_NAME_BYTES);
        assert!(long.starts_with(cut));
        let short = shorten(&"x".repeat(500));
        assert_eq!(short.chars().count(), SHORT_MAX_CHARS);
    }
}
