//! Which CUDA libraries this host has, and their versions.
//!
//! Every library is opened at run time with `dlopen` (libloading) so the same binary runs on hosts
//! with and without a CUDA toolkit; a library that is missing is reported, never fatal. Versions
//! come from each library's own version call, not from file names, because containers often ship
//! symlinks whose names lie.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One vendor library as found (or not) on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibraryInfo {
    /// Short name: "libcuda", "libnvrtc", "libcublas", "libcublasLt".
    pub name: String,
    pub found: bool,
    /// The file the dynamic loader resolved (redactable: it may contain a home directory).
    pub path: Option<String>,
    /// "13.0", "12.4.5", ...
    pub version: Option<String>,
    /// Why it was not found, or why its version could not be read.
    pub note: Option<String>,
}

/// Environment variable that makes gpudiag act as if the optional CUDA libraries (NVRTC, cuBLAS)
/// were absent, so the driver-only path can be exercised on a host that has a toolkit.
pub const DRIVER_ONLY_ENV: &str = "GPUDIAG_DRIVER_ONLY";

struct Candidate {
    name: &'static str,
    sonames: &'static [&'static str],
    optional: bool,
    read_version: fn(&libloading::Library) -> Result<String, String>,
}

const CANDIDATES: &[Candidate] = &[
    Candidate {
        name: "libcuda",
        sonames: &["libcuda.so.1", "libcuda.so"],
        optional: false,
        read_version: cuda_driver_version,
    },
    Candidate {
        name: "libnvrtc",
        sonames: &[
            "libnvrtc.so",
            "libnvrtc.so.13",
            "libnvrtc.so.12",
            "libnvrtc.so.11.2",
        ],
        optional: true,
        read_version: nvrtc_version,
    },
    Candidate {
        name: "libcublas",
        sonames: &[
            "libcublas.so",
            "libcublas.so.13",
            "libcublas.so.12",
            "libcublas.so.11",
        ],
        optional: true,
        read_version: cublas_version,
    },
    Candidate {
        name: "libcublasLt",
        sonames: &[
            "libcublasLt.so",
            "libcublasLt.so.13",
            "libcublasLt.so.12",
            "libcublasLt.so.11",
        ],
        optional: true,
        read_version: cublaslt_version,
    },
];

/// Directories tried after the loader's own search path, where toolkits usually live.
fn extra_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// Finds and versions every CUDA library gpudiag can use.
pub fn detect_libraries() -> Vec<LibraryInfo> {
    let driver_only = std::env::var_os(DRIVER_ONLY_ENV).is_some_and(|v| !v.is_empty() && v != "0");
    CANDIDATES
        .iter()
        .map(|c| {
            if driver_only && c.optional {
                return LibraryInfo {
                    name: c.name.into(),
                    found: false,
                    path: None,
                    version: None,
                    note: Some(format!("ignored: {DRIVER_ONLY_ENV} is set")),
                };
            }
            probe(c)
        })
        .collect()
}

fn probe(c: &Candidate) -> LibraryInfo {
    let mut tried = Vec::new();
    let dirs = extra_dirs();
    let attempts = c.sonames.iter().map(PathBuf::from).chain(
        dirs.iter()
            .flat_map(|d| c.sonames.iter().map(move |s| d.join(s))),
    );
    for path in attempts {
        // SAFETY: loading a vendor library runs its initialisers; these are NVIDIA's own
        // libraries, which are designed to be dlopened this way.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => {
                let (version, note) = match (c.read_version)(&lib) {
                    Ok(v) => (Some(v), None),
                    Err(e) => (None, Some(e)),
                };
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                let resolved = file.as_deref().and_then(loaded_path);
                return LibraryInfo {
                    name: c.name.into(),
                    found: true,
                    path: resolved.or_else(|| Some(path.display().to_string())),
                    version,
                    note,
                };
            }
            Err(e) => tried.push(e.to_string()),
        }
    }
    LibraryInfo {
        name: c.name.into(),
        found: false,
        path: None,
        version: None,
        note: Some(if c.optional {
            format!(
                "not found ({}); the features that use it are off",
                c.sonames.join(", ")
            )
        } else {
            format!(
                "not found ({}): is the NVIDIA driver installed?",
                c.sonames.join(", ")
            )
        }),
    }
}

/// The path the loader mapped for `file_name`, from /proc/self/maps (Linux has no portable call
/// that maps a handle back to its file).
fn loaded_path(file_name: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    path_in_maps(&maps, file_name)
}

/// Finds a mapped file whose name starts with `file_name` ("libcuda.so.1" → ".../libcuda.so.580.95").
pub fn path_in_maps(maps: &str, file_name: &str) -> Option<String> {
    let stem = file_name.split(".so").next().unwrap_or(file_name);
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(&format!("{stem}.so")))
        })
        .map(str::to_owned)
}

/// "13000" → "13.0"; CUDA encodes versions as 1000·major + 10·minor.
pub fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

type VersionFn = unsafe extern "C" fn(*mut i32) -> i32;

fn cuda_driver_version(lib: &libloading::Library) -> Result<String, String> {
    // SAFETY: cuDriverGetVersion(int*) has this signature in every CUDA release and may be
    // called before cuInit.
    unsafe {
        let f = lib
            .get::<VersionFn>(b"cuDriverGetVersion\0")
            .map_err(|e| e.to_string())?;
        let mut v = 0;
        match f(&mut v) {
            0 => Ok(cuda_version_string(v)),
            rc => Err(format!("cuDriverGetVersion returned {rc}")),
        }
    }
}

fn nvrtc_version(lib: &libloading::Library) -> Result<String, String> {
    // SAFETY: nvrtcVersion(int*, int*) is stable across NVRTC releases.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(*mut i32, *mut i32) -> i32>(b"nvrtcVersion\0")
            .map_err(|e| e.to_string())?;
        let (mut major, mut minor) = (0, 0);
        match f(&mut major, &mut minor) {
            0 => Ok(format!("{major}.{minor}")),
            rc => Err(format!("nvrtcVersion returned {rc}")),
        }
    }
}

fn cublas_version(lib: &libloading::Library) -> Result<String, String> {
    // SAFETY: cublasGetProperty(libraryPropertyType, int*) needs no handle; the property values
    // MAJOR_VERSION=0, MINOR_VERSION=1, PATCH_LEVEL=2 are fixed by library_types.h.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn(i32, *mut i32) -> i32>(b"cublasGetProperty\0")
            .map_err(|e| e.to_string())?;
        let mut parts = [0i32; 3];
        for (prop, slot) in parts.iter_mut().enumerate() {
            let rc = f(prop as i32, slot);
            if rc != 0 {
                return Err(format!("cublasGetProperty returned {rc}"));
            }
        }
        Ok(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
    }
}

fn cublaslt_version(lib: &libloading::Library) -> Result<String, String> {
    // SAFETY: size_t cublasLtGetVersion(void) has been stable since cuBLASLt's first release.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn() -> usize>(b"cublasLtGetVersion\0")
            .map_err(|e| e.to_string())?;
        Ok(cublaslt_version_string(f()))
    }
}

/// cuBLASLt encodes its version as major·10000 + minor·100 + patch (e.g. 130100 → "13.1.0").
pub fn cublaslt_version_string(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

/// The major.minor of a dotted version string, for comparing CUDA versions.
pub fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    let major = it.next()?.trim().parse().ok()?;
    let minor = it.next().map_or(Some(0), |m| m.trim().parse().ok())?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_decode() {
        assert_eq!(cuda_version_string(13000), "13.0");
        assert_eq!(cuda_version_string(12040), "12.4");
        assert_eq!(cuda_version_string(11080), "11.8");
    }

    #[test]
    fn cublaslt_versions_decode() {
        assert_eq!(cublaslt_version_string(130100), "13.1.0");
        assert_eq!(cublaslt_version_string(120802), "12.8.2");
    }

    #[test]
    fn major_minor_parses() {
        assert_eq!(major_minor("13.0"), Some((13, 0)));
        assert_eq!(major_minor("12.4.5"), Some((12, 4)));
        assert_eq!(major_minor("12"), Some((12, 0)));
        assert_eq!(major_minor("x.1"), None);
    }

    #[test]
    fn maps_resolve_real_file() {
        let maps = "7f00-7f01 r-xp 00000000 00:1f 123 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n\
                    7f02-7f03 r-xp 00000000 00:1f 124 /usr/lib/x86_64-linux-gnu/libcudart.so.13\n";
        assert_eq!(
            path_in_maps(maps, "libcuda.so.1").as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")
        );
        assert_eq!(path_in_maps(maps, "libnvrtc.so"), None);
    }

    #[test]
    fn missing_libraries_are_reported_not_fatal() {
        // This CI machine has no CUDA: every library must come back as not found with a note.
        let libs = detect_libraries();
        assert_eq!(libs.len(), 4);
        for l in &libs {
            if !l.found {
                assert!(l.note.is_some(), "{} has no note", l.name);
                assert!(l.version.is_none());
            }
        }
    }
}
