//! What the tests that change a fake amdgpu sysfs tree (`tests/fixtures/sysfs/`) share: the
//! end-to-end tests and the telemetry crate's own (which take this file with `#[path]`).

use std::path::{Path, PathBuf};

/// A writable copy of the fixture tree at `tree` (symlinks kept), for tests that change it.
pub fn copy_tree(tree: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(tree)
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let root = dir.path().join(tree.file_name().unwrap());
    (dir, root)
}

/// The MI300X's device folder inside its tree.
pub const MI300X_GPU: &str =
    "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0";
