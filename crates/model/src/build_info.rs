//! Which build of gpudiag this is, set by `build.rs` from git: the version, the commit and
//! whether the tree had changes to tracked files. Bug-report bundles, recordings and reports
//! carry it so a report names the build that made it, not only `0.1.0`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// Which gpudiag made a document: every report names its build the same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ToolInfo {
    #[schemars(extend("const" = "gpudiag"))]
    pub name: String,
    /// The package version ("0.1.0"); the build is named by `commit` and `dirty`.
    #[schemars(length(min = 1))]
    pub version: String,
    /// The full git commit gpudiag was built from; null for a build outside git (a source
    /// tarball). Added within schema version 2: absent in reports of earlier builds.
    // Always written; the schema's skip_serializing_if only leaves it out of `required`, so
    // reports of earlier builds still validate.
    #[serde(default)]
    #[schemars(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Whether tracked files differed from `commit` when it was built; null when not known.
    /// Added within schema version 2: absent in reports of earlier builds.
    #[serde(default)]
    #[schemars(skip_serializing_if = "Option::is_none")]
    pub dirty: Option<bool>,
}

impl ToolInfo {
    pub fn this() -> Self {
        ToolInfo {
            name: "gpudiag".into(),
            version: VERSION.into(),
            commit: COMMIT.map(Into::into),
            dirty: DIRTY,
        }
    }
}

const fn non_empty(s: &'static str) -> Option<&'static str> {
    if s.is_empty() { None } else { Some(s) }
}
