//! What the tests that run a real Prometheus share: children killed on drop, a free loopback
//! port, starting Prometheus, and instant queries over its HTTP API (plain HTTP/1.0 on
//! loopback: no client crate).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A child process killed on drop, so a failing test leaves nothing running.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `prometheus` on a free loopback port with `config` written as `DIR/NAME.yml` and its
/// TSDB in `DIR/NAME`, plus `extra` flags; returns it (killed on drop) and its address.
pub fn start_prometheus(
    prometheus: &Path,
    dir: &Path,
    config: &str,
    name: &str,
    extra: &[String],
) -> (Killed, String) {
    let file = dir.join(format!("{name}.yml"));
    std::fs::write(&file, config).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", file.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join(name).display()))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--log.level=warn")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Killed(child), addr)
}

/// Percent-encodes a query parameter.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The body of a 200 answer to `GET path`; `None` for any other answer or none.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut c = TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.lines()
        .next()
        .is_some_and(|status| status.contains(" 200 "))
        .then(|| body.to_owned())
}

/// The result vector of an instant query, empty while Prometheus has nothing.
pub fn query(prom: &str, q: &str) -> Vec<Value> {
    let Some(body) = http_get(prom, &format!("/api/v1/query?query={}", encode(q))) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}
