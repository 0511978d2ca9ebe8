#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The committed PTX matches the kernel sources: `kernels/ptx/manifest.toml` records a SHA-256 of
//! each `kernels/*.cu` and of the generator, written by `kernels/gen_ptx.py`. CI has no NVRTC, so
//! it cannot regenerate the PTX; it can tell that a source or the generator changed without it.

use std::path::Path;

use sha2::{Digest, Sha256};

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn committed_ptx_matches_the_kernel_sources() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels"));
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("ptx/manifest.toml")).unwrap()).unwrap();
    assert_eq!(
        manifest["generator_sha256"].as_str().unwrap(),
        sha256(&root.join("gen_ptx.py")),
        "kernels/gen_ptx.py changed: rerun it and commit kernels/ptx/"
    );
    let kernels = manifest["kernel"].as_array().unwrap();
    let mut sources: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .map(|n| n.trim_end_matches(".cu").to_owned())
        .collect();
    sources.sort();
    let listed: Vec<&str> = kernels
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed, sources,
        "every kernel source has PTX, and no PTX lacks a source"
    );
    for k in kernels {
        let name = k["name"].as_str().unwrap();
        assert_eq!(
            k["source_sha256"].as_str().unwrap(),
            sha256(&root.join(format!("{name}.cu"))),
            "kernels/{name}.cu changed: rerun kernels/gen_ptx.py and commit kernels/ptx/"
        );
        for arch in k["archs"].as_array().unwrap() {
            let ptx = root.join(format!("ptx/{name}.{}.ptx", arch.as_str().unwrap()));
            let text = std::fs::read_to_string(&ptx).unwrap();
            let target = arch.as_str().unwrap().replace("compute_", "sm_");
            assert!(
                text.contains(&format!(".target {target}")),
                "{}",
                ptx.display()
            );
        }
    }
}
