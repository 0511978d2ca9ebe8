//! Which CUDA libraries this host has, and their versions.
//!
//! Libraries are found the way the dynamic loader would find them (LD_LIBRARY_PATH, the
//! directories of /etc/ld.so.conf, the system and toolkit directories) but are NOT loaded:
//! dlopening cuBLAS and cuBLASLt to ask their version costs about 100 ms and 200 MB of resident
//! memory, which would make `check` heavier than `nvidia-smi -q`. The version is read from the
//! file the soname resolves to (libcublas.so.13 → libcublas.so.13.1.0.3), which is how NVIDIA
//! names every release; the probes load the libraries they use and report exact versions then.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One vendor library as found (or not) on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct LibraryInfo {
    /// Short name: "libcuda", "libnvrtc", "libcublas", "libcublasLt".
    #[schemars(length(min = 1))]
    pub name: String,
    pub found: bool,
    /// The file the soname resolves to (redactable: it may contain a home directory).
    pub path: Option<String>,
    /// From the resolved file name: "13.1.0.3" for cuBLAS, the driver version for libcuda.
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
    /// The `nvidia-*` Python wheel that also ships the library: PyTorch users often have NCCL
    /// only there, outside every loader path.
    python_package: Option<&'static str>,
}

const CANDIDATES: &[Candidate] = &[
    Candidate {
        name: "libcuda",
        sonames: &["libcuda.so.1", "libcuda.so"],
        optional: false,
        python_package: None,
    },
    Candidate {
        name: "libnvrtc",
        sonames: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
        optional: true,
        python_package: None,
    },
    Candidate {
        name: "libcublas",
        sonames: &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
        optional: true,
        python_package: None,
    },
    Candidate {
        name: "libcublasLt",
        sonames: &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
        optional: true,
        python_package: None,
    },
    Candidate {
        name: "libnccl",
        sonames: &["libnccl.so.2", "libnccl.so"],
        optional: true,
        python_package: Some("nccl"),
    },
];

/// True when `GPUDIAG_DRIVER_ONLY` asks gpudiag to ignore the optional libraries.
pub fn driver_only() -> bool {
    std::env::var_os(DRIVER_ONLY_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Finds every CUDA library gpudiag can use, without loading any.
pub fn detect_libraries() -> Vec<LibraryInfo> {
    let dirs = search_dirs();
    let driver_only = driver_only();
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
            match c.python_package {
                Some(package) => {
                    let mut with_python = dirs.clone();
                    with_python.extend(python_wheel_lib_dirs(package));
                    locate(c, &with_python)
                }
                None => locate(c, &dirs),
            }
        })
        .collect()
}

/// `lib` folders of NVIDIA's Python wheels for `package` ("nccl"): in the active virtual or
/// conda environment, the system and user site-packages, in that order.
fn python_wheel_lib_dirs(package: &str) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v).join("lib"));
        }
    }
    roots.push(PathBuf::from("/usr/local/lib"));
    roots.push(PathBuf::from("/usr/lib"));
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    let mut dirs = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for site in ["site-packages", "dist-packages"] {
                let nvidia = py.join(site).join("nvidia");
                // CUDA 13 wheels put every library under nvidia/cu13/lib.
                for sub in [package, "cu13", "cu12"] {
                    let d = nvidia.join(sub).join("lib");
                    if d.is_dir() {
                        dirs.push(d);
                    }
                }
            }
        }
    }
    dirs
}

fn locate(c: &Candidate, dirs: &[PathBuf]) -> LibraryInfo {
    let found = c
        .sonames
        .iter()
        .flat_map(|s| dirs.iter().map(move |d| d.join(s)))
        .find(|p| p.is_file());
    let Some(link) = found else {
        let what = c.sonames.join(", ");
        return LibraryInfo {
            name: c.name.into(),
            found: false,
            path: None,
            version: None,
            note: Some(if c.optional {
                format!("not found ({what}); the features that use it are off")
            } else {
                format!("not found ({what}): is the NVIDIA driver installed?")
            }),
        };
    };
    let real = std::fs::canonicalize(&link).unwrap_or_else(|_| link.clone());
    let version = real
        .file_name()
        .and_then(|f| f.to_str())
        .and_then(version_from_file_name);
    LibraryInfo {
        name: c.name.into(),
        found: true,
        path: Some(real.display().to_string()),
        note: version
            .is_none()
            .then(|| format!("{} does not carry a version in its name", real.display())),
        version,
    }
}

/// The directories the dynamic loader searches, in its order, then the usual toolkit places.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
    }
    // The driver's own directory: NVML is loaded by now, and libcuda ships beside it even where
    // that directory is in no loader configuration (containers mount it in).
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        dirs.extend(mapped_dir(&maps, "libnvidia-ml.so"));
    }
    dirs.extend(ld_so_conf_dirs(Path::new("/etc/ld.so.conf"), 0));
    for d in [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The directory of the first mapped file whose name starts with `prefix`.
fn mapped_dir(maps: &str, prefix: &str) -> Option<PathBuf> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(Path::new)
        .find(|p| {
            p.file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(prefix))
        })
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
}

/// Directories listed in an ld.so.conf file, following `include` globs (one level of `*`).
fn ld_so_conf_dirs(file: &Path, depth: u32) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(pattern) = line.strip_prefix("include") {
            if depth < 4 {
                for f in expand_glob(pattern.trim()) {
                    dirs.extend(ld_so_conf_dirs(&f, depth + 1));
                }
            }
        } else if line.starts_with('/') {
            dirs.push(PathBuf::from(line));
        }
    }
    dirs
}

/// Expands a path whose last component may contain one `*` ("/etc/ld.so.conf.d/*.conf"): the
/// only form ld.so.conf uses in practice, so a glob crate is not worth a dependency.
fn expand_glob(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let Some((prefix, suffix)) = name.split_once('*') else {
        return vec![path.to_path_buf()];
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
        })
        .collect();
    files.sort();
    files
}

/// "libcublas.so.13.1.0.3" → "13.1.0.3"; "libcuda.so.580.95.05" → "580.95.05"; a bare
/// "libcuda.so" has no version.
pub fn version_from_file_name(name: &str) -> Option<String> {
    let (_, rest) = name.split_once(".so.")?;
    let ok = !rest.is_empty()
        && rest
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok.then(|| rest.to_owned())
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
    fn versions_come_from_resolved_file_names() {
        assert_eq!(
            version_from_file_name("libcublas.so.13.1.0.3").as_deref(),
            Some("13.1.0.3")
        );
        assert_eq!(
            version_from_file_name("libcuda.so.580.159.04").as_deref(),
            Some("580.159.04")
        );
        assert_eq!(
            version_from_file_name("libnvrtc.so.13").as_deref(),
            Some("13")
        );
        assert_eq!(version_from_file_name("libcuda.so"), None);
        assert_eq!(version_from_file_name("libfoo.so.1.x"), None);
    }

    #[test]
    fn driver_directory_comes_from_the_mapped_nvml() {
        let maps = "7f00-7f01 r-xp 00000000 00:1f 1 /usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04\n\
                    7f02-7f03 r-xp 00000000 00:1f 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n";
        assert_eq!(
            mapped_dir(maps, "libnvidia-ml.so"),
            Some(PathBuf::from("/usr/local/nvidia/lib64"))
        );
        assert_eq!(mapped_dir(maps, "libcuda.so"), None);
    }

    #[test]
    fn major_minor_parses() {
        assert_eq!(major_minor("13.0"), Some((13, 0)));
        assert_eq!(major_minor("12.4.5"), Some((12, 4)));
        assert_eq!(major_minor("12"), Some((12, 0)));
        assert_eq!(major_minor("x.1"), None);
    }

    #[test]
    fn libraries_are_found_through_symlinks_in_ld_so_conf_dirs() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("cuda/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcublas.so.13.1.0.3"), b"").unwrap();
        std::os::unix::fs::symlink("libcublas.so.13.1.0.3", lib.join("libcublas.so.13")).unwrap();
        let conf_d = root.path().join("ld.so.conf.d");
        std::fs::create_dir_all(&conf_d).unwrap();
        std::fs::write(
            conf_d.join("cuda.conf"),
            format!("# toolkit\n{}\n", lib.display()),
        )
        .unwrap();
        let conf = root.path().join("ld.so.conf");
        std::fs::write(&conf, format!("include {}/*.conf\n", conf_d.display())).unwrap();

        let dirs = ld_so_conf_dirs(&conf, 0);
        assert_eq!(dirs, vec![lib.clone()]);
        let cublas = locate(&CANDIDATES[2], &dirs);
        assert!(cublas.found);
        assert_eq!(cublas.version.as_deref(), Some("13.1.0.3"));
        assert!(cublas.path.unwrap().ends_with("libcublas.so.13.1.0.3"));
        let nvrtc = locate(&CANDIDATES[1], &dirs);
        assert!(!nvrtc.found);
        assert!(nvrtc.note.unwrap().contains("features that use it are off"));
    }

    #[test]
    fn missing_libraries_are_reported_not_fatal() {
        let libs = detect_libraries();
        assert_eq!(libs.len(), 5);
        for l in libs.iter().filter(|l| !l.found) {
            assert!(l.note.is_some(), "{} has no note", l.name);
            assert!(l.version.is_none());
        }
    }
}
