//! The shipped Prometheus rules (`assets/prometheus/gpudiag-rules.yml`): `promtool check rules`
//! and `promtool test rules` on the unit tests in `tests/prometheus/`, then end to end: a real
//! Prometheus scrapes three `gpudiag serve --replay` standing in for three nodes of one Slurm
//! job, evaluates a copy of the rules with shorter windows, and must fire `GpuJobStraggler` for
//! the one GPU that leads and for no other.
//!
//! Needs `promtool` and `prometheus` (Debian's `prometheus` package): those tests are
//! `#[ignore]`d for them, and fail where they are missing when run on purpose
//! (`--run-ignored only`, as CI does).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::cluster::{RULES, as_node, config_with_rules, read_recording, wait_until};
use crate::support::prometheus_api::{encode, http_get, query, start_prometheus};
use crate::support::serve::serve;
use crate::support::{root, tool};

fn promtool(args: &[&str]) -> String {
    let promtool = tool("promtool");
    let out = Command::new(promtool)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{said}", args.join(" "));
    said
}

#[test]
#[ignore = "needs promtool (apt-get install prometheus); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn the_shipped_rules_pass_promtool_check_and_their_unit_tests() {
    let said = promtool(&["check", "rules", RULES]);
    assert!(said.contains("SUCCESS"), "{said}");
    let mut tests: Vec<PathBuf> = std::fs::read_dir(root().join("tests/prometheus"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yml"))
        .collect();
    tests.sort();
    assert!(!tests.is_empty(), "no tests/prometheus/*.test.yml");
    for t in tests {
        let rel = t.strip_prefix(root()).unwrap().to_str().unwrap().to_owned();
        let said = promtool(&["test", "rules", &rel]);
        assert!(said.contains("SUCCESS"), "{rel}: {said}");
    }
}

/// The rules compare a job's GPUs with the single-host rule's default thresholds
/// (`[rules.job]`), so Prometheus and `gpudiag run` call the same GPU a straggler. Needs no
/// promtool.
#[test]
fn the_rules_use_the_single_host_job_rule_defaults() {
    let rules = std::fs::read_to_string(root().join(RULES)).unwrap();
    let job = gpudiag_core::config::Config::default().rules.job;
    for expected in [
        format!(
            "({} * (gpudiag_job:sm_active:lead_reference > 0))",
            job.lead_ratio
        ),
        format!(
            "(gpudiag_job:sm_active:lead_reference + {:.2})",
            job.lead_min_sm_points / 100.0
        ),
        format!(
            "(gpudiag_job:gpu_util_percent:lag_reference >= {}) - {}",
            job.peers_busy_util_pct, job.lag_util_points
        ),
        format!(
            "(gpudiag_job_gpu:interconnect_bytes_per_second:avg) >= {}e9",
            job.communication_min_gb_per_s
        ),
        format!(
            "(gpudiag_job_gpu:tensor_active:avg) < {})",
            job.communication_max_tensor_pct / 100.0
        ),
        format!(
            "(gpudiag_job_gpu:gpu_util_percent:avg_1m >= {})",
            job.hang_spin_util_pct
        ),
        format!(
            "(gpudiag_job_gpu:interconnect_bytes_per_second:avg_1m < {}e6)",
            job.hang_max_link_mb_per_s
        ),
        format!(
            "(gpudiag_job_gpu:compute_active:avg_1m >= {})",
            job.hang_max_busy_pct / 100.0
        ),
        format!(
            "(gpudiag_job_gpu:interconnect_bytes_per_second:avg_1m >= {}e6)",
            job.hang_max_link_mb_per_s
        ),
    ] {
        assert!(
            rules.contains(&expected),
            "{RULES} does not compare with [rules.job]'s default: {expected}"
        );
    }
}

/// The result of an instant query that must be valid PromQL (an empty result is an answer).
fn query_ok(prom: &str, q: &str) -> Vec<Value> {
    let body = http_get(prom, &format!("/api/v1/query?query={}", encode(q)))
        .unwrap_or_else(|| panic!("{q}: no answer (invalid PromQL?)"));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Every alert Prometheus holds now, pending or firing.
fn alerts(prom: &str) -> Vec<Value> {
    let Some(body) = http_get(prom, "/api/v1/alerts") else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]["alerts"].as_array().cloned().unwrap_or_default()
}

/// Three nodes of Slurm job 77001, two GPUs each; node-c's GPU 0 does twice its peers' SM work.
/// Prometheus must fire `GpuJobStraggler` for that GPU alone, and each node's gpudiag must say
/// the same of its own GPUs (`gpudiag_job_verdict`). Takes 15 to 30 s: the replay plays 14 s
/// (serve then holds the last values), and the shortened rules alert within it.
#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_fires_the_straggler_alert_for_the_gpu_that_leads_across_nodes() {
    let prometheus = tool("prometheus");
    let dir = tempfile::tempdir().unwrap();
    let recording = read_recording(&root().join("tests/fixtures/recordings/job_ranks.ndjson"));
    let nodes = ["node-a", "node-b", "node-c"];
    let mut served = Vec::new();
    for (i, host) in nodes.iter().enumerate() {
        let straggler = (*host == "node-c").then_some((0, 2.0));
        let copy = dir.path().join(format!("{host}.ndjson"));
        std::fs::write(
            &copy,
            as_node(&recording, host, i as u32, "77001", straggler),
        )
        .unwrap();
        served.push(serve(&["--replay", copy.to_str().expect("a UTF-8 path")]));
    }

    let targets: Vec<String> = served.iter().map(|s| s.addr.to_string()).collect();
    let config = config_with_rules(dir.path(), &targets);
    let (_prometheus, prom) = start_prometheus(&prometheus, dir.path(), &config, "data", &[]);

    // Every GPU of the job is seen, with its global rank.
    let info = wait_until(Duration::from_secs(60), "the six GPUs' job info", || {
        let r = query(&prom, "gpudiag_gpu_job_info{job_key=\"77001\"}");
        (r.len() == 6).then_some(r)
    });
    let mut ranks: Vec<u64> = info
        .iter()
        .map(|s| s["metric"]["rank"].as_str().unwrap().parse().unwrap())
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3, 4, 5]);
    assert!(
        info.iter()
            .all(|s| s["metric"]["slurm_job"] == "77001" && s["metric"]["joined_by"] == "slurm_job"),
        "{info:?}"
    );

    let firing = wait_until(Duration::from_secs(90), "GpuJobStraggler to fire", || {
        let all = alerts(&prom);
        let straggling: Vec<Value> = all
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == "GpuJobStraggler")
            .collect();
        straggling
            .iter()
            .any(|a| a["state"] == "firing")
            .then_some(straggling)
    });
    assert_eq!(firing.len(), 1, "one GPU straggles: {firing:?}");
    let labels = &firing[0]["labels"];
    assert_eq!(labels["Hostname"], "node-c", "{labels}");
    assert_eq!(labels["gpu"], "0");
    assert_eq!(labels["UUID"], "GPU-node-c-0");
    assert_eq!(labels["job_key"], "77001");
    assert_eq!(labels["rank"], "4");
    assert_eq!(labels["pace"], "leads");

    // The job's figures across nodes: the median is the balanced GPUs', the spread about 2.
    let median = query(&prom, "gpudiag_job:sm_active:median{job_key=\"77001\"}");
    let median = median[0]["value"][1]
        .as_str()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    assert!((0.40..0.50).contains(&median), "{median}");
    let count = query(&prom, "gpudiag_job:gpus:count{job_key=\"77001\"}");
    assert_eq!(count[0]["value"][1], "6");

    // Each node's gpudiag judged its own two GPUs: node-c names GPU 0, the others are balanced.
    let verdicts = wait_until(Duration::from_secs(30), "three job verdicts", || {
        let r = query(&prom, "gpudiag_job_verdict{job_key=\"77001\"}");
        (r.len() == 3).then_some(r)
    });
    for v in &verdicts {
        let m = &v["metric"];
        let expected = if m["Hostname"] == "node-c" {
            "straggler"
        } else {
            "balanced"
        };
        assert_eq!(m["verdict"], expected, "{m}");
    }
    // node-c's GPU 0 is its straggler, by its role series; no other GPU of the job straggles.
    let stragglers = query(
        &prom,
        "gpudiag_job_gpu_role{job_key=\"77001\",role=\"straggler\"}",
    );
    assert_eq!(stragglers.len(), 1, "{stragglers:?}");
    let m = &stragglers[0]["metric"];
    assert_eq!(
        (&m["Hostname"], &m["gpu"], &m["UUID"]),
        (
            &Value::from("node-c"),
            &Value::from("0"),
            &Value::from("GPU-node-c-0")
        ),
        "{m}"
    );

    // The dashboard's "Job peers" row, for this job: each GPU's figures with its rank, each
    // node's verdict, and the alert.
    let path = root().join("assets/grafana/gpudiag.json");
    let dash: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let variable = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "slurm_job")
        .expect("a slurm_job variable");
    assert_eq!(
        variable["definition"],
        "label_values(gpudiag_gpu_job_info, slurm_job)"
    );
    let panels = dash["panels"].as_array().unwrap();
    let row = panels
        .iter()
        .position(|p| p["title"] == "Job peers")
        .expect("the dashboard has a Job peers row");
    let mut shown = 0;
    for panel in panels[row + 1..].iter().take_while(|p| p["type"] != "row") {
        let title = panel["title"].as_str().unwrap();
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$slurm_job", "77001");
            let got = query_ok(&prom, &expr);
            match panel["type"].as_str() {
                Some("timeseries") => {
                    assert_eq!(got.len(), 6, "{title}: {expr}: {got:?}");
                    assert!(
                        got.iter().all(|s| s["metric"]["rank"].is_string()),
                        "{got:?}"
                    );
                }
                _ if title.starts_with("Job verdict") => assert_eq!(got.len(), 3, "{title}"),
                // node-c's straggler, and its other GPU if its gpudiag finds it waiting.
                _ if title.starts_with("GPU roles") => assert!(
                    got.iter().any(|s| s["metric"]["role"] == "straggler"
                        && s["metric"]["Hostname"] == "node-c"),
                    "{title}: {got:?}"
                ),
                _ if title.contains("alerts") => assert!(
                    got.iter()
                        .any(|s| s["metric"]["alertname"] == "GpuJobStraggler"),
                    "{title}: {got:?}"
                ),
                // The waiting share is node-c's estimate, when it could make one.
                _ => assert!(got.len() <= 1, "{title}: {got:?}"),
            }
            shown += 1;
        }
    }
    assert!(shown >= 6, "{shown} queries in the Job peers row");

    // A few evaluations later, still no other GPU alerts, nor anything about the job as a whole.
    std::thread::sleep(Duration::from_secs(3));
    let others: Vec<Value> = alerts(&prom)
        .into_iter()
        .filter(|a| {
            a["labels"]["alertname"] != "GpuJobStraggler" || a["labels"]["Hostname"] != "node-c"
        })
        .collect();
    assert!(others.is_empty(), "{others:?}");

    // Every rule evaluated: one Prometheus could not (a join that matched twice, a union of
    // series that collide) would only leave its alert silent.
    let body = http_get(&prom, "/api/v1/rules").unwrap();
    let groups: Value = serde_json::from_str(&body).unwrap();
    let mut rules = 0;
    for group in groups["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            assert_eq!(rule["health"], "ok", "{rule}");
            rules += 1;
        }
    }
    assert!(rules >= 20, "{rules} rules loaded");
}
