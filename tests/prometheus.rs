//! A real Prometheus server scrapes `gpudiag serve --replay` (and, over TLS with basic auth, a
//! `serve --web.config.file`) and its HTTP API must return the series with the recording's
//! values and dcgm-exporter's labels. Needs the `prometheus` binary (Debian's package;
//! `.ci/run` installs it): those tests are `#[ignore]`d for it, and fail where it is missing when
//! run on purpose (`--run-ignored only`, as CI does).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::prometheus_api::{Killed, free_port, query};
use crate::support::serve::serve;
use crate::support::{at, tool};

fn value_of(result: &Value) -> f64 {
    result["value"][1].as_str().unwrap().parse().unwrap()
}

/// Waits until `q` returns one series whose value `ok` accepts; returns it.
fn wait_for(prom: &str, q: &str, ok: impl Fn(f64) -> bool, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let r = query(prom, q);
        if let Some(first) = r.first().filter(|s| ok(value_of(s))) {
            return first.clone();
        }
        assert!(Instant::now() < deadline, "{q}: got {r:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Starts Prometheus with these scrape configs (YAML list items) on a free port; its data lives
/// in `dir`.
fn start_prometheus(prometheus: &Path, dir: &Path, scrape_configs: &str) -> (Killed, String) {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n{scrape_configs}"
        ),
    )
    .unwrap();
    let prom = format!("127.0.0.1:{}", free_port());
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Killed(child), prom)
}

/// The same exporter web config Prometheus's own exporters take: Prometheus scrapes over
/// TLS with the right password, and a job with a wrong one is down.
#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_scrapes_serve_over_tls_with_basic_auth() {
    let prometheus = tool("prometheus");
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
    let hash = bcrypt::hash("scrape-me", 4).unwrap();
    let web = dir.path().join("web-config.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    let served = serve(&["--demo", "--web.config.file", web.to_str().unwrap()]);
    let ca = dir.path().join("server.crt");
    let job = |name: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    scrape_interval: 1s\n    \
             scrape_timeout: 1s\n    tls_config:\n      ca_file: {}\n    basic_auth:\n      \
             username: prometheus\n      password: {password}\n    static_configs:\n      \
             - targets: ['{}']\n",
            ca.display(),
            served.addr
        )
    };
    let (_prometheus, prom) = start_prometheus(
        &prometheus,
        dir.path(),
        &format!(
            "{}{}",
            job("gpudiag", "scrape-me"),
            job("intruder", "guess")
        ),
    );
    wait_for(
        &prom,
        "up{job=\"gpudiag\"}",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    let util = wait_for(
        &prom,
        "DCGM_FI_DEV_GPU_UTIL{job=\"gpudiag\"}",
        |_| true,
        Duration::from_secs(30),
    );
    assert_eq!(util["metric"]["modelName"], "NVIDIA H200");
    wait_for(
        &prom,
        "up{job=\"intruder\"}",
        |v| v == 0.0,
        Duration::from_secs(30),
    );
    assert!(query(&prom, "DCGM_FI_DEV_GPU_UTIL{job=\"intruder\"}").is_empty());
}

#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_scrapes_serve() {
    let prometheus = tool("prometheus");
    let fixture = at("tests/fixtures/recordings/two_gpus.ndjson");
    let served = serve(&["--replay", fixture.to_str().expect("a UTF-8 path")]);
    let target = served.addr.clone();

    let dir = tempfile::tempdir().unwrap();
    let (_prometheus, prom) = start_prometheus(
        &prometheus,
        dir.path(),
        &format!(
            "  - job_name: gpudiag\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    );

    // The target is up, and the replay has played out (about 9 s of recorded time), so every
    // series holds the recording's last values.
    wait_for(
        &prom,
        "up{job=\"gpudiag\"}",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    wait_for(
        &prom,
        "gpudiag_source_ended",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    // One more scrape after the end.
    std::thread::sleep(Duration::from_millis(1500));

    let util0 = wait_for(
        &prom,
        "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}",
        |_| true,
        Duration::from_secs(10),
    );
    assert_eq!(value_of(&util0), 0.0);
    let m = &util0["metric"];
    assert_eq!(m["UUID"], "GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11");
    assert_eq!(m["pci_bus_id"], "00000000:19:00.0");
    assert_eq!(m["modelName"], "NVIDIA H200");
    assert_eq!(m["Hostname"], "gpu-node-07");
    assert_eq!(m["job"], "gpudiag");

    let power1 = query(&prom, "DCGM_FI_DEV_POWER_USAGE{gpu=\"1\"}");
    assert_eq!(power1.len(), 1);
    assert_eq!(value_of(&power1[0]), 115.5);
    let energy0 = query(&prom, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\"}");
    assert_eq!(value_of(&energy0[0]), 48_217_115_800.0);
    // 523239424 bytes = 499 MiB.
    let fb = query(&prom, "DCGM_FI_DEV_FB_USED");
    assert_eq!(fb.len(), 2);
    assert!(fb.iter().all(|s| value_of(s) == 499.0), "{fb:?}");
    let xid = query(&prom, "DCGM_FI_DEV_XID_ERRORS{gpu=\"0\"}");
    assert_eq!(value_of(&xid[0]), 31.0);
    let finding = query(&prom, "gpudiag_finding{id=\"errors.xid_31\"}");
    assert_eq!(finding.len(), 1, "{finding:?}");
    assert_eq!(finding[0]["metric"]["severity"], "warn");
    assert_eq!(finding[0]["metric"]["gpu"], "0");
    let warn = query(&prom, "gpudiag_findings{severity=\"warn\"}");
    assert_eq!(value_of(&warn[0]), 1.0);
    // The last sample of GPU 0 has only the idle reason (0x1).
    let idle = query(
        &prom,
        "gpudiag_throttle_reason{gpu=\"0\",reason=\"gpu_idle\"}",
    );
    assert_eq!(value_of(&idle[0]), 1.0);
    let cap = query(
        &prom,
        "gpudiag_throttle_reason{gpu=\"0\",reason=\"sw_power_cap\"}",
    );
    assert_eq!(value_of(&cap[0]), 0.0);
    // The fixture has no fan: the series does not exist rather than reading 0.
    assert!(query(&prom, "gpudiag_fan_speed_percent").is_empty());
}

/// Profiling counters arrive as dcgm-exporter's ratios, the verdict as one series per GPU, and
/// the dashboard's verdict timeline query gives each GPU its bottleneck's number.
#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_scrapes_profiling_ratios_and_verdicts() {
    let prometheus = tool("prometheus");
    let fixture = at("tests/fixtures/recordings/profiled.ndjson");
    let served = serve(&["--replay", fixture.to_str().expect("a UTF-8 path")]);
    let dir = tempfile::tempdir().unwrap();
    let (_prometheus, prom) = start_prometheus(
        &prometheus,
        dir.path(),
        &format!(
            "  - job_name: gpudiag\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['{}']\n",
            served.addr
        ),
    );
    wait_for(
        &prom,
        "gpudiag_source_ended",
        |v| v == 1.0,
        Duration::from_secs(60),
    );
    std::thread::sleep(Duration::from_millis(1500));

    // The last samples: SM active 94.0% and 11.4%.
    let sm0 = query(&prom, "DCGM_FI_PROF_SM_ACTIVE{gpu=\"0\"}");
    assert_eq!(value_of(&sm0[0]), 0.94, "{sm0:?}");
    let sm1 = query(&prom, "DCGM_FI_PROF_SM_ACTIVE{gpu=\"1\"}");
    assert_eq!(value_of(&sm1[0]), 0.114, "{sm1:?}");
    assert_eq!(query(&prom, "DCGM_FI_PROF_DRAM_ACTIVE").len(), 2);

    let verdicts = query(&prom, "gpudiag_verdict");
    assert_eq!(verdicts.len(), 2, "one series per GPU: {verdicts:?}");
    let of = |gpu: &str| {
        verdicts
            .iter()
            .find(|v| v["metric"]["gpu"] == gpu)
            .unwrap_or_else(|| panic!("GPU {gpu}: {verdicts:?}"))
    };
    assert_eq!(of("0")["metric"]["verdict"], "compute_bound");
    let underfilled = &of("1")["metric"];
    assert_eq!(underfilled["verdict"], "underfilled");
    assert_eq!(underfilled["confidence"], "high");
    assert_eq!(underfilled["basis"], "profiling_counters");
    assert_eq!(underfilled["modelName"], "NVIDIA H200");
    assert_eq!(value_of(of("1")), 1.0);
    let judged = query(&prom, "gpudiag_verdict_judged == 1");
    assert_eq!(judged.len(), 2, "{judged:?}");

    let path = at("assets/grafana/gpudiag.json");
    let dash: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let timeline = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "state-timeline")
        .unwrap();
    let expr = timeline["targets"][0]["expr"]
        .as_str()
        .unwrap()
        .replace("$Hostname", ".*")
        .replace("$gpu", ".*");
    let mapped = |n: f64| {
        timeline["fieldConfig"]["defaults"]["mappings"][0]["options"][format!("{n}")]["text"]
            .as_str()
            .map(str::to_owned)
    };
    let mut shown: Vec<(String, Option<String>)> = query(&prom, &expr)
        .iter()
        .map(|r| {
            (
                r["metric"]["gpu"].as_str().unwrap().to_owned(),
                mapped(value_of(r)),
            )
        })
        .collect();
    shown.sort();
    assert_eq!(
        shown,
        [
            ("0".to_owned(), Some("compute_bound".to_owned())),
            ("1".to_owned(), Some("underfilled".to_owned())),
        ]
    );
}

/// Per-process series with their owners (Slurm job, user, pod, namespace, container), the pod
/// labels on the device series of a GPU one pod holds, and the cap on per-process series.
#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_scrapes_per_process_series_with_their_owners() {
    let prometheus = tool("prometheus");
    let fixture = at("tests/fixtures/recordings/attributed.ndjson");
    let fixture = fixture.to_str().expect("a UTF-8 path");
    let served = serve(&["--replay", fixture]);
    let capped = serve(&["--replay", fixture, "--max-process-series", "2"]);
    let dir = tempfile::tempdir().unwrap();
    let (_prometheus, prom) = start_prometheus(
        &prometheus,
        dir.path(),
        &format!(
            "  - job_name: gpudiag\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['{}']\n  \
             - job_name: capped\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['{}']\n",
            served.addr, capped.addr
        ),
    );
    for job in ["gpudiag", "capped"] {
        wait_for(
            &prom,
            &format!("gpudiag_source_ended{{job=\"{job}\"}}"),
            |v| v == 1.0,
            Duration::from_secs(60),
        );
    }
    std::thread::sleep(Duration::from_millis(1500));

    let memory = query(&prom, "gpudiag_process_memory_used_bytes{job=\"gpudiag\"}");
    assert_eq!(memory.len(), 4, "{memory:?}");
    let of = |pid: &str| {
        memory
            .iter()
            .find(|s| s["metric"]["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid}: {memory:?}"))
    };
    let trainer = &of("48213")["metric"];
    assert_eq!(trainer["pod"], "train-llm-0");
    assert_eq!(trainer["namespace"], "ml-team");
    assert_eq!(trainer["container"], "trainer");
    assert_eq!(trainer["user"], "alice");
    assert_eq!(trainer["gpu"], "0");
    // The scrape job keeps its own label: the Slurm job is `slurm_job`.
    assert_eq!(trainer["job"], "gpudiag");
    assert_eq!(value_of(of("48213")), 121_030_000_640.0);
    let slurm = &of("60001")["metric"];
    assert_eq!(slurm["slurm_job"], "4242");
    assert_eq!(slurm["user"], "bob");
    assert!(slurm.get("pod").is_none(), "{slurm:?}");
    // On the time-sliced GPU the process HOSTNAME picked has its pod; the other has none.
    assert_eq!(of("51002")["metric"]["pod"], "notebook-a");
    assert!(of("51077")["metric"].get("pod").is_none());
    let sm = query(
        &prom,
        "gpudiag_process_sm_util_percent{job=\"gpudiag\",pid=\"51002\"}",
    );
    assert_eq!(value_of(&sm[0]), 31.0);
    // GPU 0's verdict is about its only process, which carries it with its owners.
    let verdict = query(&prom, "gpudiag_process_verdict{job=\"gpudiag\"}");
    assert_eq!(verdict.len(), 1, "{verdict:?}");
    assert_eq!(verdict[0]["metric"]["pid"], "48213");
    assert_eq!(verdict[0]["metric"]["pod"], "train-llm-0");
    assert!(verdict[0]["metric"]["verdict"].is_string());

    // dcgm-exporter's Kubernetes mode: the GPU one pod holds carries its labels, the shared one
    // none.
    let util0 = query(&prom, "DCGM_FI_DEV_GPU_UTIL{job=\"gpudiag\",gpu=\"0\"}");
    assert_eq!(util0[0]["metric"]["pod"], "train-llm-0");
    assert_eq!(util0[0]["metric"]["namespace"], "ml-team");
    let util1 = query(&prom, "DCGM_FI_DEV_GPU_UTIL{job=\"gpudiag\",gpu=\"1\"}");
    assert!(util1[0]["metric"].get("pod").is_none(), "{util1:?}");

    // By pod and by job, as the dashboard sums them.
    let by_pod = query(
        &prom,
        "sum by (namespace, pod) (gpudiag_process_memory_used_bytes{job=\"gpudiag\",pod!=\"\"})",
    );
    assert_eq!(by_pod.len(), 2, "{by_pod:?}");
    let dropped = query(&prom, "gpudiag_process_series_dropped{job=\"gpudiag\"}");
    assert_eq!(value_of(&dropped[0]), 0.0);

    // The capped server keeps the two processes holding the most memory and says it cut two.
    let kept = query(&prom, "gpudiag_process_memory_used_bytes{job=\"capped\"}");
    let mut pids: Vec<&str> = kept
        .iter()
        .map(|s| s["metric"]["pid"].as_str().unwrap())
        .collect();
    pids.sort_unstable();
    assert_eq!(pids, ["48213", "51002"]);
    let dropped = query(&prom, "gpudiag_process_series_dropped{job=\"capped\"}");
    assert_eq!(value_of(&dropped[0]), 2.0);
    let counted = query(&prom, "sum(gpudiag_gpu_processes{job=\"capped\"})");
    assert_eq!(value_of(&counted[0]), 4.0);

    // The dashboard's "by job / by pod" row: each of its queries returns the recording's owners.
    let path = at("assets/grafana/gpudiag.json");
    let dash: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let panels = dash["panels"].as_array().unwrap();
    let row = panels
        .iter()
        .position(|p| p["title"] == "By job / by pod")
        .expect("the dashboard has a by job / by pod row");
    let mut checked = 0;
    for panel in panels[row + 1..].iter().take_while(|p| p["type"] != "row") {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$Hostname", ".*")
                .replace("$gpu", ".*");
            let got = query(&prom, &expr);
            let title = panel["title"].as_str().unwrap();
            if title.contains("job") {
                assert!(
                    got.iter().any(|s| s["metric"]["slurm_job"] == "4242"),
                    "{title}: {expr}: {got:?}"
                );
            } else if title.contains("pod") {
                assert!(
                    got.iter().any(|s| s["metric"]["pod"] == "train-llm-0"),
                    "{title}: {expr}: {got:?}"
                );
            } else {
                assert!(!got.is_empty(), "{title}: {expr}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked} queries");
}

/// A recording whose processes carry their Slurm job and launcher variables: `serve` names the
/// job of every GPU (`gpudiag_gpu_job_info`, with ranks) and gives the job its verdict, as a
/// scrape reads them once the replay played out. No Prometheus needed: the exposition itself.
#[test]
fn serve_names_the_job_of_every_gpu_and_judges_it() {
    use gpudiag_core::config::Config;
    use gpudiag_core::session::{Origin, SourceSpec, open_source};
    use gpudiag_telemetry::replay::Pace;
    let fixture = at("tests/fixtures/recordings/job_ranks.ndjson");
    let source = open_source(
        &SourceSpec::new(Origin::File(fixture)),
        Pace::AsFastAsPossible,
        false,
    )
    .unwrap();
    let snapshot = gpudiag::commands::serve::snapshot_at_end(source, &Config::default());
    let text = gpudiag_export::prometheus::render(&snapshot, Instant::now());
    let lines = |name: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect()
    };
    assert_eq!(
        lines("gpudiag_gpu_job_info"),
        [
            "gpudiag_gpu_job_info{UUID=\"GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11\",gpu=\"0\",\
             Hostname=\"gpu-node-11\",job_key=\"9001\",joined_by=\"slurm_job\",\
             slurm_job=\"9001\",rank=\"0\"} 1",
            "gpudiag_gpu_job_info{UUID=\"GPU-8c41d0e5-2f7a-4b93-86de-15ab3c9e7f42\",gpu=\"1\",\
             Hostname=\"gpu-node-11\",job_key=\"9001\",joined_by=\"slurm_job\",\
             slurm_job=\"9001\",rank=\"1\"} 1",
        ]
    );
    assert_eq!(
        lines("gpudiag_gpus_shared_by_jobs"),
        ["gpudiag_gpus_shared_by_jobs{Hostname=\"gpu-node-11\"} 0"]
    );
    // The two ranks keep pace: balanced, with no straggler and no waiting share.
    assert_eq!(
        lines("gpudiag_job_verdict"),
        [
            "gpudiag_job_verdict{Hostname=\"gpu-node-11\",job_key=\"9001\",joined_by=\"slurm_job\",\
          verdict=\"balanced\",confidence=\"medium\"} 1"
        ],
        "{:?}",
        snapshot.jobs
    );
    assert!(lines("gpudiag_job_peers_wait_ratio").is_empty());
}

/// A recording that reads its process lists every ten ticks (job8_straggler: ticks 0, 10, 20
/// and the last), replayed at its own pace: every scrape between two reads still names each
/// GPU's job, as a live serve does between its process reads, instead of dropping
/// `gpudiag_gpu_job_info` for nine scrapes in ten. No Prometheus needed: the scrapes
/// themselves, over about 5 s of the replay's first 10.
#[test]
fn serve_keeps_each_gpus_job_between_the_recordings_process_reads() {
    let fixture = at("tests/fixtures/recordings/job8_straggler.ndjson");
    let served = serve(&["--replay", fixture.to_str().expect("a UTF-8 path")]);
    let scrape = || crate::support::prometheus_api::http_get(&served.addr, "/metrics");
    let count = |text: &str, name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .count()
    };
    let started = Instant::now();
    // The first tick published: every device has its figures.
    while scrape().is_none_or(|t| count(&t, "DCGM_FI_DEV_GPU_UTIL") < 8) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "serve never published"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut scrapes = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let text = scrape().expect("serve answers");
        assert_eq!(
            count(&text, "gpudiag_gpu_job_info"),
            8,
            "scrape {scrapes}, {:?} into the replay:\n{text}",
            started.elapsed()
        );
        assert!(text.contains("job_key=\"synthetic-run\""));
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(400));
    }
    assert!(scrapes >= 8, "{scrapes} scrapes");
}
