//! A `gpudiag serve` of the test's own on a free loopback port, killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct Served {
    pub child: Child,
    pub addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `gpudiag serve --listen 127.0.0.1:0` with `args` and `envs`, and reads the address it
/// prints on its first line of stderr.
pub fn serve_with(args: &[&str], envs: &[(&str, &str)]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpudiag serve starts");
    let mut line = String::new();
    BufReader::new(child.stderr.take().expect("stderr is piped"))
        .read_line(&mut line)
        .expect("serve says where it listens");
    // "http://ADDR/metrics", or "https://" with --web.config.file.
    let addr = line
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    Served { child, addr }
}

pub fn serve(args: &[&str]) -> Served {
    serve_with(args, &[])
}
