//! What the tests that stand a small cluster up in a real Prometheus share: the shipped rules
//! with test-length windows, and copies of a recording rewritten as other nodes of one job.

use std::io::Read;
use std::path::Path;

use super::root;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const RULES: &str = "assets/prometheus/gpudiag-rules.yml";

/// The shipped rules with every window and hold shortened for a test that lasts seconds: the
/// file writes them `[5m]`, `[1m]` (a stalled job's), `for: 5m`, `for: 1m` and `for: 30s` for
/// exactly this substitution.
pub fn shortened_rules() -> String {
    let shipped = std::fs::read_to_string(root().join(RULES)).unwrap();
    for written in ["[5m]", "[1m]", "for: 5m", "for: 1m", "for: 30s"] {
        assert!(
            shipped.contains(written),
            "the rules no longer write {written}"
        );
    }
    let short = shipped
        .replace("[5m]", "[10s]")
        .replace("[1m]", "[5s]")
        .replace("for: 5m", "for: 4s")
        .replace("for: 1m", "for: 4s")
        .replace("for: 30s", "for: 2s");
    // Nothing is left that would keep the test waiting minutes.
    for line in short.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(
            !(line.contains("m]") || line.trim_start().starts_with("for:") && line.ends_with('m')),
            "a window the test does not shorten: {line}"
        );
    }
    short
}

/// A Prometheus configuration that scrapes `targets` (host:port) as the job `gpudiag` every
/// second and evaluates the shipped rules, shortened ([`shortened_rules`]), written into `dir`.
pub fn config_with_rules(dir: &Path, targets: &[String]) -> String {
    let rules = dir.join("gpudiag-rules.yml");
    std::fs::write(&rules, shortened_rules()).unwrap();
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n  - job_name: gpudiag\n    scrape_timeout: 1s\n    \
         static_configs:\n      - targets: [{}]\n",
        rules.display(),
        targets.join(", ")
    )
}

/// Reads a recording, plain or gzip.
pub fn read_recording(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut text)
            .unwrap();
        text
    } else {
        String::from_utf8(bytes).unwrap()
    }
}

/// A copy of a recording as another node of the same job would record it: its own host name
/// and GPU UUIDs, the job's Slurm id, and global ranks after those of the nodes before it.
/// `scale_sm` multiplies one GPU's SM activity (a rank given more work than its peers).
pub fn as_node(
    recording: &str,
    host: &str,
    node: u32,
    slurm_job: &str,
    scale_sm: Option<(u64, f64)>,
) -> String {
    let mut out = String::new();
    for line in recording.lines().filter(|l| !l.trim().is_empty()) {
        let mut v: Value = serde_json::from_str(line).unwrap();
        match v["kind"].as_str() {
            Some("header") => {
                v["host"]["hostname"] = host.into();
                for d in v["devices"].as_array_mut().unwrap() {
                    let index = d["index"].as_u64().unwrap();
                    d["uuid"] = format!("GPU-{host}-{index}").into();
                }
            }
            Some("sample") => {
                let device = v["device"].as_u64().unwrap();
                if let Some((gpu, by)) = scale_sm
                    && gpu == device
                    && let Some(sm) = v["sm_active_pct"].as_f64()
                {
                    v["sm_active_pct"] = (sm * by).min(100.0).into();
                }
                for p in v["processes"].as_array_mut().into_iter().flatten() {
                    p["attribution"]["job"]["id"] = slurm_job.into();
                    let local = p["launch"]["local_rank"].as_u64().unwrap();
                    p["launch"]["rank"] = (u64::from(node) * 2 + local).into();
                    p["launch"]["world_size"] = 6.into();
                    p["launch"]["master_addr"] = "node-a".into();
                }
            }
            _ => {}
        }
        out.push_str(&serde_json::to_string(&v).unwrap());
        out.push('\n');
    }
    out
}

/// Polls `f` every half second until it returns something or `within` passes.
pub fn wait_until<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}
