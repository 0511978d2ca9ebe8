//! The probe kernels' PTX, generated ahead of time by `kernels/gen_ptx.py` (NVRTC 12.0) and
//! embedded, and the choice of the best target a device can load.

/// One embedded PTX module: kernel file name, target (70 = compute_70) and text.
pub struct Ptx {
    pub kernel: &'static str,
    pub arch: u32,
    /// An arch-specific target (compute_90a): its PTX loads on that exact compute capability
    /// only, never on a newer one.
    pub arch_specific: bool,
    pub text: &'static str,
}

macro_rules! ptx {
    ($k:literal, $a:literal) => {
        ptx!($k, $a, "", false)
    };
    ($k:literal, $a:literal, specific) => {
        ptx!($k, $a, "a", true)
    };
    ($k:literal, $a:literal, $suffix:literal, $specific:literal) => {
        Ptx {
            kernel: $k,
            arch: $a,
            arch_specific: $specific,
            text: include_str!(concat!(
                "../../../kernels/ptx/",
                $k,
                ".compute_",
                stringify!($a),
                $suffix,
                ".ptx"
            )),
        }
    };
}

pub const EMBEDDED: &[Ptx] = &[
    ptx!("copy", 70),
    ptx!("copy", 80),
    ptx!("copy", 90),
    ptx!("latency", 70),
    ptx!("latency", 80),
    ptx!("latency", 90),
    ptx!("matmul", 80),
    ptx!("matmul", 90),
    ptx!("matmul_sm90a", 90, specific),
    ptx!("memtest", 70),
    ptx!("memtest", 80),
    ptx!("memtest", 90),
];

/// The highest target in `available` that a device of compute capability `cc` can JIT: PTX for
/// compute_XY runs on any device of capability X.Y or newer.
pub fn best_arch(available: &[u32], cc: (i32, i32)) -> Option<u32> {
    let device = u32::try_from(cc.0 * 10 + cc.1).ok()?;
    available.iter().copied().filter(|&a| a <= device).max()
}

/// The PTX of `kernel` to load on a device of capability `cc`.
pub fn select(kernel: &str, cc: (i32, i32)) -> Option<&'static Ptx> {
    let device = u32::try_from(cc.0 * 10 + cc.1).ok()?;
    let archs: Vec<u32> = EMBEDDED
        .iter()
        .filter(|p| p.kernel == kernel && (!p.arch_specific || p.arch == device))
        .map(|p| p.arch)
        .collect();
    let arch = best_arch(&archs, cc)?;
    EMBEDDED
        .iter()
        .find(|p| p.kernel == kernel && p.arch == arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_loadable_target_is_chosen() {
        let all = [70, 80, 90];
        assert_eq!(best_arch(&all, (9, 0)), Some(90));
        assert_eq!(best_arch(&all, (10, 0)), Some(90));
        assert_eq!(best_arch(&all, (8, 9)), Some(80));
        assert_eq!(best_arch(&all, (8, 6)), Some(80));
        assert_eq!(best_arch(&all, (7, 5)), Some(70));
        assert_eq!(best_arch(&all, (6, 1)), None);
        assert_eq!(best_arch(&[80, 90], (7, 5)), None);
        assert_eq!(best_arch(&[], (9, 0)), None);
    }

    #[test]
    fn every_kernel_is_embedded_for_its_targets() {
        for k in ["copy", "latency", "memtest"] {
            assert_eq!(select(k, (7, 0)).map(|p| p.arch), Some(70), "{k}");
        }
        assert!(select("matmul", (7, 5)).is_none());
        let m = select("matmul", (9, 0)).unwrap();
        assert!(m.text.contains(".target sm_90"));
        for (v, _, _) in crate::matmul::BUILTIN_VARIANTS {
            assert!(m.text.contains(&format!("mma_gemm_bf16_{v}(")), "{v}");
            assert!(m.text.contains(&format!("mma_gemm_f16_{v}(")), "{v}");
        }
    }

    #[test]
    fn the_wgmma_kernel_loads_on_hopper_alone() {
        let h = select("matmul_sm90a", (9, 0)).unwrap();
        assert!(h.text.contains(".target sm_90a"));
        for v in crate::matmul::WGMMA_VARIANTS {
            assert!(h.text.contains(&format!("wgmma_gemm_bf16_{v}(")), "{v}");
            assert!(h.text.contains(&format!("wgmma_gemm_f16_{v}(")), "{v}");
        }
        // sm_90a PTX is not forward compatible: Blackwell and Ada keep the mma.sync kernel.
        for cc in [(8, 0), (8, 9), (10, 0), (12, 0)] {
            assert!(select("matmul_sm90a", cc).is_none(), "{cc:?}");
            assert!(select("matmul", cc).is_some(), "{cc:?}");
        }
    }
}
