//! `check` judges the XIDs the kernel logged before it started, from a saved log
//! (`GPUDIAG_KMSG_PATH`) of real NVRM lines. The live source is the fake amdgpu tree, the one
//! live backend CI has: placing an XID on a GPU goes by PCI address, whatever the vendor, and
//! the fixture's XIDs on 0000:03:00 are that card's.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

use crate::support::{self, Run, root};

fn kmsg_fixture() -> PathBuf {
    root().join("tests/fixtures/kmsg/xids_since_boot.kmsg")
}

/// `gpudiag ARGS` reading this saved kernel log, with no sysfs tree unless ARGS name one.
fn gpudiag(args: &[&str], kmsg: &Path) -> Run {
    Run::of(
        support::gpudiag()
            .env_remove("GPUDIAG_SYSFS_ROOT")
            .env("GPUDIAG_KMSG_PATH", kmsg)
            .args(args),
    )
}

fn live_check(sysfs: &Path, kmsg: &Path, extra: &[&str]) -> (Value, Run) {
    let mut args = vec![
        "check",
        "--json",
        "--backend",
        "sysfs",
        "--sysfs-root",
        sysfs.to_str().unwrap(),
        "--window",
        "0",
    ];
    args.extend_from_slice(extra);
    let run = gpudiag(&args, kmsg);
    let report = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", run.stdout, run.stderr));
    (report, run)
}

fn mi300x() -> PathBuf {
    root().join("tests/fixtures/sysfs/mi300x")
}

fn findings(report: &Value) -> Vec<&Value> {
    report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["findings"].as_array().unwrap())
        .chain(report["host_findings"].as_array().unwrap())
        .collect()
}

fn finding<'a>(report: &'a Value, id: &str) -> &'a Value {
    findings(report)
        .into_iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {report:#}"))
}

/// This host's boot time: the log's microseconds since boot are placed on it.
fn boot_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let btime: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    btime * 1000
}

fn utc_minute(ms: u64) -> String {
    let t = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string();
    format!("{} {} UTC", &t[..10], &t[11..16])
}

#[test]
fn xids_from_before_the_check_are_reported_as_history_when_the_gpu_recovered() {
    let (report, run) = live_check(&mi300x(), &kmsg_fixture(), &[]);
    assert_eq!(
        run.code, 0,
        "history must not fail the check: {}",
        run.stderr
    );
    let dbe = finding(&report, "errors.past_xid_48");
    assert_eq!(dbe["device"], 0);
    assert_eq!(dbe["severity"], "info");
    let at = boot_ms() + 3_601_877;
    assert_eq!(dbe["time_ms"], at);
    assert_eq!(
        dbe["title"],
        format!(
            "XID 48 at {} (before this check): double-bit ECC error in GPU memory",
            utc_minute(at)
        )
    );
    assert_eq!(dbe["evidence"]["values"]["pci_bus_id"], "0000:03:00");
    assert!(
        dbe["evidence"]["values"]["line"]
            .as_str()
            .unwrap()
            .contains("double bit error (DBE)")
    );
    // Two lines of one XID on one GPU are one finding that counts them.
    let sm = finding(&report, "errors.past_xid_13");
    assert_eq!(sm["severity"], "info");
    assert_eq!(sm["evidence"]["values"]["count"], 2);
    // 0000:3b:00 is no GPU this host lists: host-wide, and a warning, since a GPU that fell off
    // the bus may be gone for good.
    let gone = finding(&report, "errors.past_xid_79");
    assert_eq!(gone["device"], Value::Null);
    assert_eq!(gone["severity"], "warn");
    assert!(
        gone["title"]
            .as_str()
            .unwrap()
            .contains("on PCI 0000:3b:00, a GPU the driver does not list now"),
        "{}",
        gone["title"]
    );
    assert!(
        report["not_judged"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["rule"] != "errors.kernel_log_xid"),
        "{:#}",
        report["not_judged"]
    );
}

#[test]
fn a_past_dbe_fails_the_check_while_its_repair_waits_for_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(mi300x())
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let sysfs = dir.path().join("mi300x");
    std::fs::write(
        sysfs.join(
            "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0/\
             ras/gpu_vram_bad_pages",
        ),
        "0x00004c3e : 0x00001000 : P\n",
    )
    .unwrap();
    let (report, run) = live_check(&sysfs, &kmsg_fixture(), &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(report["status"], "fail");
    let dbe = finding(&report, "errors.past_xid_48");
    assert_eq!(dbe["severity"], "fail");
    assert!(
        dbe["title"]
            .as_str()
            .unwrap()
            .contains("a memory repair still waits for a GPU reset"),
        "{}",
        dbe["title"]
    );
    // An application's exception is not made live by a pending repair.
    assert_eq!(finding(&report, "errors.past_xid_13")["severity"], "info");
}

#[test]
fn an_unreadable_kernel_log_is_not_judged_rather_than_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-kmsg");
    let (report, run) = live_check(&mi300x(), &missing, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        findings(&report)
            .iter()
            .all(|f| !f["id"].as_str().unwrap().starts_with("errors.past_xid")),
    );
    let entry = report["not_judged"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["rule"] == "errors.kernel_log_xid")
        .unwrap_or_else(|| panic!("{:#}", report["not_judged"]));
    assert_eq!(entry["device"], Value::Null);
    let reason = entry["reason"].as_str().unwrap();
    assert!(reason.contains("no-kmsg"), "{reason}");
    assert!(reason.contains("before this check"), "{reason}");
    // The text report says it too.
    let text = gpudiag(
        &[
            "check",
            "--backend",
            "sysfs",
            "--sysfs-root",
            mi300x().to_str().unwrap(),
            "--window",
            "0",
        ],
        &missing,
    );
    assert!(
        text.stdout.contains("not judged: errors.kernel_log_xid"),
        "{}",
        text.stdout
    );
}

#[test]
fn a_replay_never_reads_this_hosts_kernel_log() {
    let recording = root().join("tests/fixtures/recordings/two_gpus.ndjson");
    let run = gpudiag(
        &["check", "--json", "--replay", recording.to_str().unwrap()],
        &kmsg_fixture(),
    );
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert!(
        findings(&report)
            .iter()
            .all(|f| !f["id"].as_str().unwrap().starts_with("errors.past_xid")),
        "{report:#}"
    );
    assert!(
        report["not_judged"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["rule"] != "errors.kernel_log_xid"),
    );
}

#[test]
fn an_xid_storm_is_one_finding_and_a_bounded_read() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("storm.kmsg");
    let mut text = String::new();
    for i in 0..12_000u64 {
        text.push_str(&format!(
            "4,{i},{},-;NVRM: Xid (PCI:0000:03:00): 13, pid=2211, name=python3, Graphics SM \
             Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address\n",
            1_000_000 + i * 10
        ));
    }
    std::fs::write(&log, text).unwrap();
    let started = std::time::Instant::now();
    let (report, run) = live_check(&mi300x(), &log, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(20));
    let storm: Vec<&Value> = findings(&report)
        .into_iter()
        .filter(|f| f["id"] == "errors.past_xid_13")
        .collect();
    assert_eq!(storm.len(), 1);
    // The newest 10,000 lines are kept, and the report says the rest were not.
    assert_eq!(storm[0]["evidence"]["values"]["count"], 10_000);
    assert_eq!(storm[0]["time_ms"], boot_ms() + 1_000 + 119_990 / 1000);
    let partial = report["not_judged"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["rule"] == "errors.kernel_log_xid")
        .unwrap_or_else(|| panic!("{:#}", report["not_judged"]));
    assert!(
        partial["reason"].as_str().unwrap().contains("read in part"),
        "{partial}"
    );
}
