//! Which build of gpudiag this is, set by `build.rs` from git: the version, the commit and
//! whether the tree had changes to tracked files. Bug-report bundles, recordings and reports
//! carry it so a report names the build that made it, not only `0.1.0`.

/// The package version, as in Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The full commit hash the build came from; None for a build outside git (a source tarball).
pub const COMMIT: Option<&str> = non_empty(env!("GPUDIAG_COMMIT"));

/// Whether tracked files differed from the commit; None when that is not known (no git, or the
/// commit given by `GPUDIAG_BUILD_COMMIT`).
pub const DIRTY: Option<bool> = match env!("GPUDIAG_DIRTY").as_bytes() {
    b"true" => Some(true),
    b"false" => Some(false),
    _ => None,
};

/// `0.1.0 (abc123def)`, `0.1.0 (abc123def, dirty)` or `0.1.0 (commit unknown)`: what
/// `--version` prints and what recordings and traces name as their tool version.
pub const LONG_VERSION: &str = env!("GPUDIAG_LONG_VERSION");

const fn non_empty(s: &'static str) -> Option<&'static str> {
    if s.is_empty() { None } else { Some(s) }
}
