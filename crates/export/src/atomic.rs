//! Writing an output file so that it appears whole or not at all: a temporary file beside it,
//! renamed over it once written.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use gpudiag_model::error::Error;

/// A usage error when `path` exists and `force` is off.
pub fn refuse_existing(path: &Path, force: bool) -> Result<(), Error> {
    if !force && path.exists() {
        return Err(Error::Usage(format!(
            "{} exists; pass --force to replace it",
            path.display()
        )));
    }
    Ok(())
}

/// Serialises `value` as JSON into `path` atomically.
pub fn write_json_atomic(path: &Path, value: &impl serde::Serialize) -> Result<(), Error> {
    write_atomic(path, |w| {
        let mut out = gpudiag_model::printable::JsonC1::new(&mut *w);
        serde_json::to_writer(&mut out, value).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
        out.flush()
    })
}

/// Writes through `fill` into a temporary file beside `path`, syncs it and renames it over
/// `path`: a reader (or a crash) never sees a half-written file. The temporary file is removed
/// on failure.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<&File>) -> std::io::Result<()>,
) -> Result<(), Error> {
    let tmp = temp_path_for(path);
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let mut w = std::io::BufWriter::new(&file);
        fill(&mut w)?;
        w.flush()?;
        drop(w);
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("cannot write {}", path.display()), e)
    })
}

/// `dir/.name.tmp-PID-N`: hidden, in the same directory (a rename across file systems would
/// copy), and unique per process and call.
fn temp_path_for(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    let tmp = format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(tmp),
        _ => PathBuf::from(tmp),
    }
}
