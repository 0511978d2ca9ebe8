//! What the end-to-end tests share: where the repository and its fixtures are, the built binary
//! run the way every test runs it, and the tools some tests cannot do without. The GPU-host
//! tests (`tests/gpu_*.rs`, targets of their own) take single files from here with `#[path]`.

pub mod amd_sysfs;
pub mod cluster;
pub mod fake_http;
// The fake kubelet speaks the client's gRPC messages: with the `kubernetes` feature only.
#[cfg(feature = "kubernetes")]
pub mod kubelet;
pub mod prometheus_api;
pub mod serve;
pub mod tmux;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpudiag_core::check::CheckReport;

/// The repository root: fixtures, assets, docs and examples are read from there.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A path inside the repository.
pub fn at(rel: &str) -> PathBuf {
    root().join(rel)
}

/// A recording in `tests/fixtures/recordings/`.
pub fn fixture(name: &str) -> PathBuf {
    at("tests/fixtures/recordings").join(name)
}

/// A damaged or hostile recording in `tests/fixtures/hostile/`.
pub fn hostile(name: &str) -> PathBuf {
    at("tests/fixtures/hostile").join(name)
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The built binary with no user configuration (a developer's own file must not change what
/// the tests see), given a minute to finish.
pub fn gpudiag() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("gpudiag").unwrap();
    cmd.env(
        "XDG_CONFIG_HOME",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-config"),
    )
    .timeout(Duration::from_secs(60));
    cmd
}

/// `gpudiag ARGS` as [`gpudiag`] runs it.
pub fn run(args: &[&str]) -> Run {
    Run::of(gpudiag().args(args))
}

/// What one run of the binary left behind.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Runs `cmd` to the end; its output must be UTF-8, as everything gpudiag prints is.
    pub fn of(cmd: &mut assert_cmd::Command) -> Run {
        let out = cmd.output().unwrap();
        Run {
            code: out.status.code().expect("gpudiag was killed by a signal"),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    }

    /// Stdout read as a check report.
    pub fn report(&self) -> CheckReport {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not a check report ({e}):\n{}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// Stdout read as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap()
    }

    /// Asserts the exit code and that stderr is the single line `gpudiag: ...`; returns it.
    pub fn one_line_error(&self, code: i32) -> &str {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stdout.is_empty(),
            "nothing on stdout on failure: {}",
            self.stdout
        );
        let line = self.stderr.strip_suffix('\n').unwrap_or(&self.stderr);
        assert!(
            !line.contains('\n'),
            "stderr must be one line: {:?}",
            self.stderr
        );
        assert!(line.starts_with("gpudiag: "), "{line}");
        line
    }
}

/// A program a test cannot do without, from PATH. Such tests are `#[ignore]`d with the tool
/// named, so a plain `cargo nextest run` lists them as skipped; run on purpose
/// (`--run-ignored only`, as CI does), a missing tool fails the test here rather than letting
/// it pass having checked nothing.
pub fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH: this test needs it (.ci/run lists the Debian packages \
                 that bring it)"
            )
        })
}

/// A file a test cannot do without, such as a tool in a virtual environment `.ci/run` makes.
pub fn required_file(path: PathBuf, made_by: &str) -> PathBuf {
    assert!(
        path.is_file(),
        "{} does not exist: this test needs it ({made_by})",
        path.display()
    );
    path
}
