#![allow(clippy::unwrap_used, clippy::expect_used)]
//! AMD support without an AMD GPU: the amdgpu sysfs backend on the fake trees in the workspace's
//! `tests/fixtures/sysfs/`, and the ROCm SMI loader against the real library (Debian's
//! `librocm-smi64-1`, installed by `.ci/run`). `check` on the same trees is tested end to end
//! in the workspace's `tests/amd.rs`.

use std::path::{Path, PathBuf};

use gpudiag_model::sample::{Absent, Sample};
use gpudiag_telemetry::amd::rocm::{self, Library64, LoadError, RocmBackend};
use gpudiag_telemetry::amd::sysfs::SysfsBackend;
use gpudiag_telemetry::{Backend, BackendError};

#[path = "../../../tests/support/amd_sysfs.rs"]
mod amd_sysfs;
use amd_sysfs::{MI300X_GPU, copy_tree};

const GIB: u64 = 1 << 30;

fn sysfs_root(name: &str) -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/sysfs"
    ))
    .join(name)
}

fn one_sample(name: &str) -> (SysfsBackend, Sample) {
    let mut b = SysfsBackend::open(&sysfs_root(name)).unwrap();
    let mut tick = b.poll().unwrap();
    assert_eq!(tick.samples.len(), 1, "one amdgpu card in {name}");
    assert!(tick.events.is_empty());
    let s = tick.samples.remove(0);
    (b, s)
}

// ---------------------------------------------------------------------------------------------
// sysfs fixtures

#[test]
fn mi300x_fixture_device_info() {
    let (b, _) = one_sample("mi300x");
    assert_eq!(b.name(), "sysfs");
    // card1 is the BMC's VGA (ast) and renderD128 the same GPU again: neither is listed.
    assert_eq!(b.devices().len(), 1);
    let d = &b.devices()[0];
    assert_eq!(d.index, 0);
    assert_eq!(d.vendor.as_deref(), Some("AMD"));
    assert_eq!(d.name.as_deref(), Some("AMD Instinct MI300X"));
    assert_eq!(d.architecture.as_deref(), Some("CDNA3"));
    assert_eq!(d.pci_bus_id.as_deref(), Some("0000:03:00.0"));
    assert_eq!(d.uuid.as_deref(), Some("0x9a3f6c2d81b4e057"));
    assert_eq!(d.serial.as_deref(), Some("692351000123"));
    assert_eq!(d.vbios_version.as_deref(), Some("113-M3000100-102"));
    assert_eq!(d.memory_total_bytes, Some(192 * GIB));
    assert_eq!(d.power_limit_default_w, Some(750.0));
    assert_eq!(d.power_limit_min_w, Some(0.0));
    assert_eq!(d.power_limit_max_w, Some(750.0));
    assert_eq!(d.sm_clock_max_mhz, Some(2100));
    assert_eq!(d.mem_clock_max_mhz, Some(1300));
    // The GPU and its slot can both do Gen5 x16.
    assert_eq!(d.pcie_gen_max, Some(5));
    assert_eq!(d.pcie_width_max, Some(16));
    // Junction limits (MI300X has no edge sensor).
    assert_eq!(d.temp_slowdown_c, Some(105.0));
    assert_eq!(d.temp_shutdown_c, Some(110.0));
    assert_eq!(d.temp_mem_max_c, Some(95.0));
    assert_eq!(d.ecc_enabled, Some(true));
    for nvidia_only in ["compute_capability", "persistence_mode", "mig_enabled"] {
        assert_eq!(d.absent.get(nvidia_only), Some(&Absent::Unavailable));
    }
    assert_eq!(d.compute_capability, None);
    let host = b.host();
    assert_eq!(host.driver_version.as_deref(), Some("6.8.0-48-generic"));
    assert_eq!(host.cuda_driver_version, None);
}

#[test]
fn mi300x_fixture_sample() {
    let (_, s) = one_sample("mi300x");
    assert_eq!(s.device, 0);
    assert_eq!(s.gpu_util_pct, Some(87.0));
    assert_eq!(s.mem_util_pct, Some(41.0));
    assert_eq!(s.mem_used_bytes, Some(50 * GIB));
    assert_eq!(s.mem_total_bytes, Some(192 * GIB));
    assert_eq!(s.mem_free_bytes, Some(142 * GIB));
    // power1_input (MI300 has no power1_average).
    assert_eq!(s.power_w, Some(612.0));
    assert_eq!(s.power_limit_w, Some(750.0));
    assert_eq!(s.temp_gpu_c, Some(58.0));
    assert_eq!(s.temp_mem_c, Some(46.0));
    assert_eq!(s.sm_clock_mhz, Some(1420));
    assert_eq!(s.mem_clock_mhz, Some(1300));
    // Downtrained: Gen4 on a Gen5 link.
    assert_eq!((s.pcie_gen, s.pcie_gen_max), (Some(4), Some(5)));
    assert_eq!((s.pcie_width, s.pcie_width_max), (Some(16), Some(16)));
    assert_eq!(s.pcie_replay_count, Some(0));
    assert_eq!(s.ecc_corrected_volatile, Some(2));
    assert_eq!(s.ecc_uncorrected_volatile, Some(0));
    assert_eq!(s.retired_pages_pending, Some(false));
    // No fan on an OAM module, no energy counter in this tree: absent, never 0.
    assert_eq!(s.fan_pct, None);
    assert_eq!(s.why_absent("fan_pct"), Some(&Absent::NotSupported));
    assert_eq!(s.energy_j, None);
    assert_eq!(s.why_absent("energy_j"), Some(&Absent::NotSupported));
    for nvidia_only in ["pstate", "throttle_reasons", "remapped_rows_pending"] {
        assert_eq!(s.why_absent(nvidia_only), Some(&Absent::Unavailable));
    }

    // pid 4242: one client on two descriptors (4 GiB, counted once) and another (1 GiB), and
    // /dev/kfd open: a ROCm compute process (its fdinfo shows no compute engine time);
    // pid 5151: a client holding no VRAM yet. Sockets and /dev/null are not clients.
    let procs = s.processes.as_ref().unwrap();
    assert_eq!(procs.len(), 2, "{procs:?}");
    let p = &procs[0];
    assert_eq!(p.pid, 4242);
    assert_eq!(p.name.as_deref(), Some("python3"));
    assert_eq!(p.user.as_deref(), Some("alice"));
    assert_eq!(p.kind.as_deref(), Some("compute"));
    assert_eq!(p.used_memory_bytes, Some(5 * GIB));
    assert_eq!(p.sm_util_pct, None);
    assert_eq!(
        p.container_id.as_deref(),
        Some("3f0c6a1e2b9d4c8f7a6e5d4c3b2a19081726354453627180f9e8d7c6b5a49382")
    );
    let q = &procs[1];
    assert_eq!((q.pid, q.name.as_deref()), (5151, Some("amd-smi")));
    assert_eq!(q.user.as_deref(), Some("root"));
    assert_eq!(q.used_memory_bytes, Some(0));
    assert_eq!(q.kind, None);
}

#[test]
fn radeon_fixture_behind_amds_switch() {
    let (b, s) = one_sample("radeon");
    let d = &b.devices()[0];
    // No product_name on Radeon boards: the name comes from the device id table.
    assert_eq!(d.name.as_deref(), Some("AMD Radeon RX 7900 XT / XTX"));
    assert_eq!(d.architecture.as_deref(), Some("RDNA3"));
    assert_eq!(d.pci_bus_id.as_deref(), Some("0000:0c:00.0"));
    assert_eq!(d.uuid, None);
    assert_eq!(d.absent.get("uuid"), Some(&Absent::NotSupported));
    assert_eq!(d.serial, None);
    assert_eq!(d.absent.get("serial"), Some(&Absent::NotSupported));
    // No ras directory: ECC is not "off", it is not offered.
    assert_eq!(d.ecc_enabled, None);
    assert_eq!(d.absent.get("ecc_enabled"), Some(&Absent::NotSupported));
    // power1_cap_min is missing from this hwmon.
    assert_eq!(d.power_limit_min_w, None);
    assert_eq!(
        d.absent.get("power_limit_min_w"),
        Some(&Absent::NotSupported)
    );
    assert_eq!(d.power_limit_max_w, Some(347.0));
    // Junction crit is there, junction emergency is not.
    assert_eq!(d.temp_slowdown_c, Some(110.0));
    assert_eq!(d.temp_shutdown_c, None);
    assert_eq!(d.absent.get("temp_shutdown_c"), Some(&Absent::NotSupported));
    assert_eq!(d.sm_clock_max_mhz, Some(2482));
    assert_eq!(b.host().driver_version.as_deref(), Some("6.10.5"));

    // The GPU's own link is the switch-internal Gen4 x16; the slot link (the switch's upstream
    // port) trained at Gen3 x8 of a Gen4 x16 slot.
    assert_eq!((s.pcie_gen, s.pcie_gen_max), (Some(3), Some(4)));
    assert_eq!((s.pcie_width, s.pcie_width_max), (Some(8), Some(16)));
    assert_eq!(s.pcie_replay_count, Some(12));
    // Deep sleep: the S: line is current.
    assert_eq!(s.sm_clock_mhz, Some(19));
    assert_eq!(s.mem_clock_mhz, Some(1249));
    assert_eq!(s.temp_gpu_c, Some(48.0));
    assert_eq!(s.temp_mem_c, Some(52.0));
    assert_eq!(s.power_w, Some(38.0));
    assert_eq!(s.power_limit_w, Some(303.0));
    assert!(
        (s.fan_pct.unwrap() - 30.196).abs() < 1e-3,
        "{:?}",
        s.fan_pct
    );
    assert_eq!(s.gpu_util_pct, Some(3.0));
    assert_eq!(s.ecc_uncorrected_volatile, None);
    assert_eq!(
        s.why_absent("ecc_uncorrected_volatile"),
        Some(&Absent::NotSupported)
    );
    let procs = s.processes.as_ref().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].name.as_deref(), Some("Xorg"));
    assert_eq!(procs[0].kind.as_deref(), Some("graphics"));
    assert_eq!(procs[0].used_memory_bytes, Some(256 << 20));
    assert_eq!(procs[0].container_id, None);
}

#[test]
fn every_absent_sample_field_has_a_reason() {
    for name in ["mi300x", "radeon"] {
        let (_, s) = one_sample(name);
        let json = serde_json::to_value(&s).unwrap();
        for (field, value) in json.as_object().unwrap() {
            if value.is_null() {
                assert!(
                    s.absent.contains_key(field),
                    "{name}: {field} is null without a reason"
                );
            }
        }
        for field in s.absent.keys() {
            assert!(
                json[field].is_null(),
                "{name}: {field} has a value and a reason"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ROCm SMI loader against the real library

/// Where Debian's librocm-smi64-1 puts the library (`.ci/run` installs it).
const DEBIAN_LIBRARY: &str = "/usr/lib/librocm_smi64.so.1";

/// True on a host with an AMD GPU driver, where "no AMD GPU" does not apply.
fn has_amd_gpu() -> bool {
    Path::new("/dev/kfd").exists()
}

#[test]
fn rocm_smi_loads_resolves_every_symbol_and_reports_no_amd_gpu() {
    match Library64::load() {
        Ok(lib) => {
            // `load` resolves every symbol in SYMBOLS or fails: getting here proves them all.
            assert!(rocm::SYMBOLS.len() >= 25);
            // The version picks the struct layouts: it must be known.
            assert!(lib.version.is_some(), "{lib:?}");
            assert!(lib.name.starts_with("librocm_smi64.so") || lib.name.contains("/opt/rocm"));
            eprintln!(
                "loaded {} (library version {:?}), {} symbols resolved",
                lib.name,
                lib.version,
                rocm::SYMBOLS.len()
            );
            if has_amd_gpu() {
                eprintln!("this host has an AMD GPU: the no-GPU path does not apply");
                return;
            }
            let err = lib.init().unwrap_err();
            assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
            assert!(err.to_string().contains("no AMD GPU"), "{err}");
            drop(lib);
            // The backend says the same through its own door, without panicking.
            let err = RocmBackend::open(std::time::Duration::from_secs(10)).unwrap_err();
            assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        Err(LoadError::NotFound(tried)) => {
            assert!(
                !Path::new(DEBIAN_LIBRARY).exists(),
                "{DEBIAN_LIBRARY} exists but did not load: {tried}"
            );
            eprintln!("librocm_smi64 is not installed here; checked the absent path only");
            assert!(tried.contains("librocm_smi64.so"), "{tried}");
            if !has_amd_gpu() {
                let err = RocmBackend::open(std::time::Duration::from_secs(10)).unwrap_err();
                assert!(matches!(err, BackendError::NoDevice(_)), "{err}");
            }
        }
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A card that goes away

/// A writable copy of the fixture tree `name`, for tests that change it.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    copy_tree(&sysfs_root(name))
}

#[test]
fn a_gpu_that_vanishes_is_lost_once() {
    let (_dir, root) = copy_fixture("mi300x");
    let mut b = SysfsBackend::open(&root).unwrap();
    assert!(b.poll().unwrap().events.is_empty());
    std::fs::remove_dir_all(root.join(MI300X_GPU)).unwrap();
    let tick = b.poll().unwrap();
    assert_eq!(tick.events.len(), 1, "{:?}", tick.events);
    assert_eq!(tick.events[0].device, Some(0));
    assert!(
        matches!(&tick.events[0].kind, gpudiag_model::sample::EventKind::DeviceLost { reason }
            if reason.contains("0000:03:00.0")),
        "{:?}",
        tick.events[0]
    );
    let s = &tick.samples[0];
    assert_eq!(s.gpu_util_pct, None);
    assert_eq!(s.why_absent("gpu_util_pct"), Some(&Absent::GpuLost));
    assert!(
        s.absent.values().all(|a| *a == Absent::GpuLost),
        "{:?}",
        s.absent
    );
    // Said once.
    assert!(b.poll().unwrap().events.is_empty());
}
