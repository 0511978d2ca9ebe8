//! The collector on disk: the embedded shared object written into a private directory of its
//! own, removed when gpudiag ends.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The collector (collector/collector.c), compiled by build.rs.
pub static COLLECTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libgpudiag_collector.so"));

/// The collector's file name in its directory.
pub const COLLECTOR_FILE: &str = "libgpudiag_collector.so";
/// The socket's file name in the same directory.
pub const SOCKET_FILE: &str = "collector.sock";

/// A directory only this user can enter (0700), made fresh under a random name; removed with
/// what it holds when dropped.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

/// ld.so splits LD_PRELOAD at spaces and colons, and a socket path has at most 107 bytes.
fn usable(base: &Path) -> bool {
    let text = base.as_os_str().as_encoded_bytes();
    base.is_absolute() && !text.iter().any(|b| b" :\t\n".contains(b)) && text.len() < 60
}

impl PrivateDir {
    /// Under `$XDG_RUNTIME_DIR` (a per-user tmpfs) where it is set and usable, else the temp
    /// directory, else /tmp.
    pub fn create() -> std::io::Result<PrivateDir> {
        let mut bases: Vec<PathBuf> = Vec::new();
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
            bases.push(PathBuf::from(runtime));
        }
        bases.push(std::env::temp_dir());
        bases.push(PathBuf::from("/tmp"));
        let mut last = std::io::Error::other("no usable directory for the kernels collector");
        for base in bases.iter().filter(|b| usable(b)) {
            match Self::create_in(base) {
                Ok(dir) => return Ok(dir),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    pub fn create_in(base: &Path) -> std::io::Result<PrivateDir> {
        use std::hash::{BuildHasher, Hasher};
        for _ in 0..16 {
            // RandomState is seeded from the OS's randomness: a name nobody can guess ahead.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            let path = base.join(format!("gpudiag-kernels-{:016x}", h.finish()));
            // mkdir fails on anything already there, a link included: the directory is ours.
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    let meta = std::fs::symlink_metadata(&path)?;
                    // SAFETY: geteuid takes nothing and cannot fail.
                    let uid = unsafe { libc::geteuid() };
                    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
                        return Err(std::io::Error::other(format!(
                            "{} is not a private directory of ours",
                            path.display()
                        )));
                    }
                    return Ok(PrivateDir { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(
            "could not make a fresh directory name",
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the collector into the directory; its absolute path.
    pub fn install_collector(&self) -> std::io::Result<PathBuf> {
        let path = self.path.join(COLLECTOR_FILE);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o500)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        file.write_all(COLLECTOR)?;
        file.sync_all()?;
        Ok(path)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_is_private_fresh_and_gone_when_dropped() {
        let base = tempfile::tempdir().unwrap();
        let dir = PrivateDir::create_in(base.path()).unwrap();
        let meta = std::fs::metadata(dir.path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        let other = PrivateDir::create_in(base.path()).unwrap();
        assert_ne!(dir.path(), other.path());
        let so = dir.install_collector().unwrap();
        assert_eq!(std::fs::read(&so).unwrap(), COLLECTOR);
        // Written once: a second install refuses to replace it.
        assert!(dir.install_collector().is_err());
        let path = dir.path().to_owned();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn a_base_ld_so_would_split_is_not_used() {
        assert!(!usable(Path::new("/tmp/a b")));
        assert!(!usable(Path::new("/tmp/a:b")));
        assert!(!usable(Path::new("relative")));
        assert!(usable(Path::new("/run/user/1000")));
    }

    #[test]
    fn the_embedded_collector_is_a_shared_object() {
        assert_eq!(&COLLECTOR[..4], b"\x7fELF");
        // ET_DYN
        assert_eq!(COLLECTOR[16], 3);
    }
}
