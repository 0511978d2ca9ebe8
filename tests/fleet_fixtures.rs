//! The dcgm-exporter exposition the fleet tests serve beside `gpudiag serve`
//! (`tests/fixtures/prometheus/dcgm-exporter.prom`): it parses as the text format, and a real
//! Prometheus scraping it keeps its four GPUs and their labels.
//!
//! The fixture is dcgm-exporter 3.x/4.x's exposition for one node of four A100-SXM4-80GB: the
//! families of its default counters file (`etc/default-counters.csv`) plus the DCP profiling
//! fields, with their HELP and TYPE lines, the exporter's label order (`gpu`, `UUID`,
//! `pci_bus_id`, `device`, `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`, then the pod
//! mapping's `container`, `namespace`, `pod` on the two GPUs a pod holds) and its value formats
//! (`%d` for integer fields, `%f` for floating-point ones). `DCGM_FI_DEV_XID_ERRORS` carries
//! 4.x's `err_code` and `err_msg`. UUIDs and figures are made up.
//!
//! Needs `promtool` and `prometheus` (Debian's `prometheus` package): the tests are `#[ignore]`d
//! for them, and fail where they are missing when run on purpose (`--run-ignored only`, as CI
//! does).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fake_http::serve_text;
use crate::support::prometheus_api::{query, start_prometheus};
use crate::support::{root, tool};

const FIXTURE: &str = "tests/fixtures/prometheus/dcgm-exporter.prom";
const HOSTNAME: &str = "gpu-a100-07";

fn fixture() -> String {
    std::fs::read_to_string(root().join(FIXTURE)).unwrap()
}

/// dcgm-exporter's names break Prometheus's naming conventions (upper case, counters without
/// `_total`, `modelName`), so `promtool check metrics` reports lint problems (exit 3) on the real
/// thing too; what must hold is that it parses (a parse error exits 1).
#[test]
#[ignore = "needs promtool (apt-get install prometheus); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn the_dcgm_exporter_fixture_parses_as_the_text_format() {
    let promtool = tool("promtool");
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(fixture().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        matches!(out.status.code(), Some(0 | 3)) && !said.contains("error while linting"),
        "promtool check metrics {FIXTURE}: {:?}\n{said}",
        out.status
    );
}

/// Every family of the fixture has its HELP and TYPE lines and one sample per GPU, each GPU with
/// the same labels throughout. Needs no promtool.
#[test]
fn the_dcgm_exporter_fixture_has_four_gpus_in_every_family() {
    let text = fixture();
    let mut families = 0;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("# TYPE ") {
            families += 1;
            let name = name.split(' ').next().unwrap();
            let samples: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .collect();
            assert_eq!(samples.len(), 4, "{name}");
            for (gpu, s) in samples.iter().enumerate() {
                assert!(
                    s.contains(&format!("gpu=\"{gpu}\",UUID=\"GPU-"))
                        && s.contains(&format!("device=\"nvidia{gpu}\""))
                        && s.contains(&format!("Hostname=\"{HOSTNAME}\"")),
                    "{s}"
                );
                assert_eq!(s.contains("pod=\""), gpu < 2, "{s}");
            }
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no HELP"
            );
        }
    }
    assert_eq!(families, 27);
}

/// A real Prometheus scrapes the fixture from a loopback server and keeps its four GPUs with
/// their host name, and the pod mapping on the two GPUs a pod holds. Takes a few seconds.
#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_scrapes_the_dcgm_exporter_fixture() {
    let prometheus = tool("prometheus");
    let exporter = serve_text(fixture());
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n\
         scrape_configs:\n  - job_name: dcgm-exporter\n    scrape_timeout: 1s\n    \
         static_configs:\n      - targets: ['{}']\n",
        exporter.addr
    );
    let (_prometheus, prom) = start_prometheus(&prometheus, dir.path(), &config, "data", &[]);

    let deadline = Instant::now() + Duration::from_secs(20);
    let util: Vec<Value> = loop {
        let r = query(&prom, "DCGM_FI_DEV_GPU_UTIL");
        if r.len() == 4 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus has {} GPU_UTIL series after 20 s",
            r.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut gpus: Vec<&str> = util
        .iter()
        .map(|s| s["metric"]["gpu"].as_str().unwrap())
        .collect();
    gpus.sort_unstable();
    assert_eq!(gpus, ["0", "1", "2", "3"]);
    for s in &util {
        let m = &s["metric"];
        assert_eq!(m["Hostname"], HOSTNAME, "{m}");
        assert_eq!(m["job"], "dcgm-exporter", "{m}");
        assert_eq!(m["instance"], exporter.addr.as_str(), "{m}");
        assert_eq!(m["modelName"], "NVIDIA A100-SXM4-80GB", "{m}");
        let in_pod = m["gpu"] == "0" || m["gpu"] == "1";
        assert_eq!(m["pod"].is_string(), in_pod, "{m}");
    }
    let busy = query(&prom, "DCGM_FI_DEV_GPU_UTIL > 50");
    assert_eq!(busy.len(), 2, "{busy:?}");
    assert!(
        busy.iter()
            .all(|s| s["metric"]["pod"] == "llama-ft-worker-0")
    );
    let up = query(&prom, "up{job=\"dcgm-exporter\"}");
    assert_eq!(up.len(), 1);
    assert_eq!(up[0]["value"][1], "1");

    // The fleet over plain dcgm-exporter: the figures, no verdict, "not judged", exit 0.
    let out = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["fleet", "--json", "--prometheus", &format!("http://{prom}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["status"], "not_judged", "{doc}");
    assert_eq!(doc["counts"]["gpus"], 4);
    assert_eq!(doc["counts"]["gpus_dcgm_exporter_only"], 4);
    assert_eq!(doc["rules"]["state"], "not_loaded");
    let node = &doc["nodes"][0];
    assert_eq!(node["name"], HOSTNAME);
    assert_eq!(node["exporters"], serde_json::json!(["dcgm_exporter"]));
    for g in node["gpus"].as_array().unwrap() {
        assert_eq!(g["verdict"]["state"], "dcgm_exporter_only", "{g}");
        assert!(g["findings"].as_array().unwrap().is_empty(), "{g}");
        assert!(
            g["util_pct"].is_number() && g["memory_total_mib"].is_number(),
            "{g}"
        );
    }
    // Its two pod GPUs are one job, which no rule judges.
    assert_eq!(doc["jobs"][0]["job_key"], "ml-training/llama-ft-worker-0");
    assert!(doc["jobs"][0]["across_nodes"].is_null());
    // Piped, the text says why a verdict is missing.
    let text = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["fleet", "--prometheus", &format!("http://{prom}")])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("n/a: dcgm-exporter only"), "{text}");
    assert!(text.contains("status not_judged"), "{text}");
}
