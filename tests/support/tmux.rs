//! A tmux server of the test's own, for driving the terminal UI in a real terminal. Shared by
//! the end-to-end tests and the GPU-host test `tests/gpu_tui.rs` (through `#[path]`).
// Each test binary that includes this uses a different part of it.
#![allow(dead_code)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A tmux server of our own (its own socket), killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Panics when tmux is not installed: the tests that drive it are `#[ignore]`d for that
    /// reason, and one run on purpose must not pass having driven nothing.
    pub fn start(width: u16, height: u16, tag: &str) -> Tmux {
        assert!(
            Command::new("tmux").arg("-V").output().is_ok(),
            "tmux is not installed: this test needs it (apt-get install tmux)"
        );
        let t = Tmux {
            socket: format!("gpudiag-test-{}-{tag}", std::process::id()),
        };
        let out = t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "sh",
        ]);
        assert!(out.status.success(), "{out:?}");
        t
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .env_remove("TMUX")
            .output()
            .unwrap()
    }

    /// Types `text` literally, then Enter.
    pub fn type_line(&self, text: &str) {
        self.run(&["send-keys", "-t", "0", "-l", text]);
        self.run(&["send-keys", "-t", "0", "Enter"]);
    }

    /// Sends tmux key names ("Tab", "Space", "q").
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    pub fn capture(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "0"]).stdout).into_owned()
    }

    /// The pane with its SGR escape sequences (colours, bold), as tmux keeps them.
    pub fn capture_styled(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-e", "-t", "0"]).stdout)
            .into_owned()
    }

    pub fn display(&self, format: &str) -> String {
        String::from_utf8_lossy(
            &self
                .run(&["display-message", "-p", "-t", "0", format])
                .stdout,
        )
        .trim()
        .to_owned()
    }

    /// Waits until `ready` holds for the screen; panics with the screen after `timeout`.
    #[allow(dead_code)]
    pub fn wait_until(
        &self,
        what: &str,
        ready: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let start = Instant::now();
        loop {
            let screen = self.capture();
            if ready(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < timeout,
                "waited {timeout:?} for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every needle is on screen; panics with the screen after `timeout`.
    pub fn wait_for(&self, needles: &[&str], timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let screen = self.capture();
            if needles.iter().all(|n| screen.contains(n)) {
                return screen;
            }
            assert!(
                start.elapsed() < timeout,
                "waited {timeout:?} for {needles:?}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Tmux {
    /// Waits until `needle` is gone from the screen (an overlay closed, the UI exited).
    pub fn wait_without(&self, needle: &str, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let screen = self.capture();
            if !screen.contains(needle) {
                return screen;
            }
            assert!(
                start.elapsed() < timeout,
                "waited {timeout:?} for {needle:?} to go; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}
