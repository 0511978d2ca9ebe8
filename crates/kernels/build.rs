//! Compiles the collector (collector/collector.c) into a shared object that src/lib.rs embeds.
//!
//! Why a shared object built here and carried inside the binary: the CUDA driver loads the
//! collector with `dlopen` from the path in `CUDA_INJECTION64_PATH`, and glibc will not
//! `dlopen` a PIE executable, so gpudiag itself cannot be that file; installing stays one
//! binary with no CUDA toolkit at build time, so the object travels inside it
//! (`include_bytes!`) and is written at run time into a private directory (a `/proc/PID/fd`
//! path to an in-memory file would not resolve inside a container's PID namespace).
//!
//! The compiler is the one the `cc` crate finds (CC, the target's cross compiler, zig under
//! cargo-zigbuild), run directly because `cc` builds static archives, not shared objects.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let collector = PathBuf::from("collector");
    for file in ["collector.c", "cupti_types.h"] {
        println!("cargo:rerun-if-changed=collector/{file}");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let object = out.join("libgpudiag_collector.so");
    let compiler = match cc::Build::new()
        .cargo_metadata(false)
        .opt_level(2)
        .try_get_compiler()
    {
        Ok(compiler) => compiler,
        Err(e) => fail(&format!(
            "no C compiler found ({e}); gpudiag's kernels collector is C and needs one \
             (install gcc or clang, or set CC)"
        )),
    };
    let mut command: Command = compiler.to_command();
    command
        .args([
            "-std=gnu11",
            "-shared",
            "-fPIC",
            "-O2",
            "-fvisibility=hidden",
            // Fortified calls (`__*_chk`) would raise the glibc the object needs.
            "-U_FORTIFY_SOURCE",
            "-D_FORTIFY_SOURCE=0",
            // Warnings are held at zero by a test (tests/collector.rs), not here: a newer
            // compiler's new warning must not fail someone's `cargo install`.
            "-Wall",
            "-Wextra",
            "-o",
        ])
        .arg(&object)
        .arg(collector.join("collector.c"))
        .args(["-ldl", "-lpthread"]);
    match command.output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => fail(&format!(
            "compiling the kernels collector failed ({command:?}):\n{}",
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(e) => fail(&format!(
            "could not run the C compiler for the kernels collector ({command:?}): {e}"
        )),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
