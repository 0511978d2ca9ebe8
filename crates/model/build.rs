//! Which build this is: the commit the workspace was built from and whether the tree had
//! changes, for `--version` and every report (`gpudiag_model::build_info`).
//!
//! A few `git` calls rather than vergen: vergen-gitcl calls the same `git` commands but brings
//! a dozen crates into the lock, and the one thing it would save (finding `.git`) has to be done
//! by hand here anyway, since in a worktree `.git` is a file and HEAD and the index live in the
//! main repository's `.git/worktrees/<name>/`. `git rev-parse --git-path` answers for both.
//!
//! It lives in `gpudiag-model` because every crate that writes a version (telemetry's
//! recordings, core's check report, the binary's reports) depends on it.
//!
//! Without git or outside a repository (a source tarball, `cargo install` from a registry),
//! the commit is unknown. `GPUDIAG_BUILD_COMMIT` names it for builds from a tarball of a known
//! commit (packagers, container builds), and wins over git.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=GPUDIAG_BUILD_COMMIT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();

    let (commit, dirty) = match std::env::var("GPUDIAG_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => (Some(c.trim().to_owned()), None),
        _ => from_git(&manifest_dir),
    };
    let long = match (&commit, dirty) {
        (Some(c), Some(true)) => format!("{version} ({}, dirty)", short(c)),
        (Some(c), _) => format!("{version} ({})", short(c)),
        (None, _) => format!("{version} (commit unknown)"),
    };
    println!(
        "cargo:rustc-env=GPUDIAG_COMMIT={}",
        commit.unwrap_or_default()
    );
    let dirty = dirty.map(|d| d.to_string()).unwrap_or_default();
    println!("cargo:rustc-env=GPUDIAG_DIRTY={dirty}");
    println!("cargo:rustc-env=GPUDIAG_LONG_VERSION={long}");
}

/// Nine hex digits, as `rustc -V` shows its commit: unique in any repository this size, and
/// reports carry the full hash besides.
fn short(commit: &str) -> &str {
    commit.get(..9).unwrap_or(commit)
}

/// The commit and dirtiness of the repository this crate sits in; (None, None) when there is
/// none or `git` cannot say.
fn from_git(manifest_dir: &Path) -> (Option<String>, Option<bool>) {
    // The workspace root, two levels up from crates/model. A tarball unpacked inside some other
    // repository (a home directory kept in git) must not take that repository's commit.
    let Some(root) = manifest_dir.parent().and_then(Path::parent) else {
        return (None, None);
    };
    let Some(top) = git(manifest_dir, &["rev-parse", "--show-toplevel"]) else {
        return (None, None);
    };
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(Path::new(&top), root) {
        return (None, None);
    }

    // Rerun when a commit is made or checked out (HEAD, or the branch it points to, loose or
    // packed) or when the index changes (`git add`, and `git status` refreshing it). An edit
    // not yet staged does not rerun this by itself: the dirty flag is as of the last of those.
    let mut watched = vec![
        "HEAD".to_owned(),
        "index".to_owned(),
        "packed-refs".to_owned(),
    ];
    if let Some(branch) = git(manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in &watched {
        if let Some(p) = git(manifest_dir, &["rev-parse", "--git-path", name]) {
            let p = manifest_dir.join(p);
            // A path that does not exist (no packed-refs yet) would make cargo rerun this on
            // every build.
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }

    let commit = git(manifest_dir, &["rev-parse", "--verify", "-q", "HEAD"]);
    // Tracked files only: build outputs and scratch files a developer leaves about do not make
    // the build any different.
    let dirty = commit.as_ref().and_then(|_| {
        let out = Command::new("git")
            .arg("-C")
            .arg(manifest_dir)
            .args(["status", "--porcelain", "--untracked-files=no"])
            .output()
            .ok()?;
        out.status.success().then_some(!out.stdout.is_empty())
    });
    (commit, dirty)
}

/// `git -C dir args...`'s first line of output, or None when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let line = text.lines().next()?.trim().to_owned();
    (out.status.success() && !line.is_empty()).then_some(line)
}
