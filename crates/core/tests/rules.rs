//! Every rule against a scenario that makes it fire and a near miss that must stay quiet.
//! Scenarios are built in code by `Scenario`, named for what they show, and fed through the
//! same `RuleEngine` that `check` and the live views use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpudiag_core::config::{Config, RulesConfig};
use gpudiag_core::history::History;
use gpudiag_core::rules::engine::RuleEngine;
use gpudiag_model::cuda_libraries::LibraryInfo;
use gpudiag_model::finding::{Finding, FindingState, Severity};
use gpudiag_model::sample::{
    Absent, ComputeCapability, DeviceInfo, Event, EventKind, HostInfo, ProcessSample, Sample,
};
use gpudiag_telemetry::Tick;

const T0: u64 = 1_767_225_600_000;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn h200() -> DeviceInfo {
    DeviceInfo {
        index: 0,
        uuid: Some("GPU-00000000-0000-0000-0000-000000000000".into()),
        name: Some("NVIDIA H200".into()),
        vendor: Some("NVIDIA".into()),
        architecture: Some("Hopper".into()),
        compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
        memory_total_bytes: Some(141 * GIB),
        power_limit_default_w: Some(700.0),
        sm_clock_max_mhz: Some(1980),
        mem_clock_max_mhz: Some(3201),
        pcie_gen_max: Some(5),
        pcie_width_max: Some(16),
        temp_slowdown_c: Some(89.0),
        temp_shutdown_c: Some(95.0),
        temp_mem_max_c: Some(95.0),
        ecc_enabled: Some(true),
        persistence_mode: Some(true),
        mig_enabled: Some(false),
        ..DeviceInfo::default()
    }
}

fn process(pid: u32, bytes: u64) -> ProcessSample {
    ProcessSample {
        pid,
        name: Some("python3".into()),
        user: Some("alice".into()),
        kind: Some("compute".into()),
        used_memory_bytes: Some(bytes),
        sm_util_pct: None,
        container_id: None,
        container_pid: None,
        cpu_time_s: None,
        attribution: None,
        launch: None,
        state: None,
        started_ms: None,
    }
}

/// A recording built tick by tick: one H200 idling unless a phase says otherwise.
struct Scenario {
    device: DeviceInfo,
    host: HostInfo,
    libraries: Option<Vec<LibraryInfo>>,
    ticks: Vec<Tick>,
    now_ms: u64,
    interval_ms: u64,
    config: RulesConfig,
    /// Judged as this host's live GPUs, where gpudiag's own pid holds no job's memory.
    live: bool,
}

impl Scenario {
    fn new() -> Self {
        Scenario {
            device: h200(),
            host: HostInfo {
                hostname: Some("node".into()),
                driver_version: Some("580.159.04".into()),
                cuda_driver_version: Some("13.0".into()),
                nvml_version: None,
            },
            libraries: None,
            ticks: Vec::new(),
            now_ms: T0,
            interval_ms: 250,
            config: RulesConfig::default(),
            live: false,
        }
    }

    fn idle_sample(&self, time_ms: u64) -> Sample {
        let mut s = Sample::new(0, time_ms);
        s.gpu_util_pct = Some(0.0);
        s.mem_util_pct = Some(0.0);
        s.mem_used_bytes = Some(512 * MIB);
        s.mem_total_bytes = Some(141 * GIB);
        s.power_w = Some(80.0);
        s.power_limit_w = Some(700.0);
        s.temp_gpu_c = Some(35.0);
        s.temp_mem_c = Some(40.0);
        s.temp_slowdown_c = Some(89.0);
        s.sm_clock_mhz = Some(345);
        s.sm_clock_max_mhz = Some(1980);
        s.pstate = Some(0);
        s.throttle_reasons = Some(0x1);
        s.pcie_gen = Some(5);
        s.pcie_width = Some(16);
        s.pcie_gen_max = Some(5);
        s.pcie_width_max = Some(16);
        s.pcie_rx_bytes_per_s = Some(1e6);
        s.pcie_tx_bytes_per_s = Some(1e6);
        s.pcie_replay_count = Some(0);
        s.ecc_uncorrected_volatile = Some(0);
        s.ecc_corrected_volatile = Some(0);
        s.remapped_rows_pending = Some(false);
        s.remapped_rows_failure = Some(false);
        s.processes = Some(Vec::new());
        s
    }

    /// Appends `secs` of ticks; `shape` edits each sample given the seconds since the phase began.
    fn phase(mut self, secs: f64, shape: impl Fn(f64, &mut Sample)) -> Self {
        let n = (secs * 1000.0 / self.interval_ms as f64).round() as u64;
        for i in 0..n {
            let mut s = self.idle_sample(self.now_ms);
            shape(i as f64 * self.interval_ms as f64 / 1000.0, &mut s);
            self.ticks.push(Tick {
                samples: vec![s],
                events: Vec::new(),
                ras: Vec::new(),
                kernels: None,
            });
            self.now_ms += self.interval_ms;
        }
        self
    }

    fn xid(mut self, xid: u64) -> Self {
        self.ticks.push(Tick {
            samples: Vec::new(),
            events: vec![Event {
                time_ms: self.now_ms,
                device: Some(0),
                kind: EventKind::Xid { xid },
            }],
            ras: Vec::new(),
            kernels: None,
        });
        self
    }

    fn with(mut self, edit: impl FnOnce(&mut Self)) -> Self {
        edit(&mut self);
        self
    }

    /// Everything the engine raised over the scenario, as `check` reports it.
    fn findings(&self) -> Vec<Finding> {
        self.judged().raised()
    }

    /// (rule, device, reason) of what the engine could not judge at the end of the scenario.
    fn not_judged(&self) -> Vec<(String, Option<u32>, String)> {
        self.judged()
            .not_judged()
            .iter()
            .map(|n| (n.rule.clone(), n.device, n.reason.clone()))
            .collect()
    }

    /// The engine after every tick and a final evaluation.
    fn judged(&self) -> RuleEngine {
        let mut engine = RuleEngine::new(
            self.config.clone(),
            vec![self.device.clone()],
            Some(self.host.clone()),
            self.libraries.clone(),
        );
        if self.live {
            engine = engine.excluding_own_process();
        }
        let mut history = History::default();
        for t in &self.ticks {
            for s in &t.samples {
                history.push_sample(s);
            }
            engine.on_tick(&history, t);
        }
        engine.finish(&history);
        engine
    }

    fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.findings().into_iter().map(|f| f.id).collect();
        ids.sort();
        ids
    }
}

fn find<'a>(findings: &'a [Finding], id: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no {id} in {findings:#?}"))
}

fn busy(s: &mut Sample) {
    s.gpu_util_pct = Some(97.0);
    s.power_w = Some(450.0);
    s.sm_clock_mhz = Some(1980);
    s.throttle_reasons = Some(0);
}

// ---------------------------------------------------------------------------------------------
// utilisation

#[test]
fn idle_gpu_with_a_process_holding_memory_is_flagged_with_its_pid() {
    let sc = Scenario::new().phase(60.0, |_, s| {
        s.gpu_util_pct = Some(3.0);
        s.processes = Some(vec![process(4321, 8 * GIB)]);
        s.mem_used_bytes = Some(9 * GIB);
    });
    let f = sc.findings();
    let low = find(&f, "utilisation.low");
    assert_eq!(low.severity, Severity::Warn);
    assert_eq!(low.evidence.values["pids"], serde_json::json!([4321]));
    assert_eq!(
        low.evidence.values["gpu_util_mean_pct"],
        serde_json::json!(3.0)
    );
    assert!(low.title.contains("pid 4321"), "{}", low.title);
    assert_eq!(
        low.evidence.values["verdict"],
        serde_json::json!("idle_holding_memory")
    );
    assert!(
        low.advice
            .starts_with("A process holds GPU memory and runs nothing"),
        "{}",
        low.advice
    );
}

/// Live, gpudiag's own process (a probe's buffers) holds no job's memory; in a recording, a
/// process whose pid happens to be ours now (a fresh container's low pids) is the job it was.
#[test]
fn only_live_gpus_leave_gpudiags_own_pid_out_of_the_holders() {
    let ours = std::process::id();
    let recorded = Scenario::new().phase(60.0, |_, s| {
        s.gpu_util_pct = Some(3.0);
        s.processes = Some(vec![process(ours, 8 * GIB)]);
        s.mem_used_bytes = Some(9 * GIB);
    });
    let f = recorded.findings();
    let low = find(&f, "utilisation.low");
    assert_eq!(low.evidence.values["pids"], serde_json::json!([ours]));
    let live = recorded.with(|s| s.live = true);
    assert!(
        !live.ids().contains(&"utilisation.low".to_owned()),
        "{:?}",
        live.ids()
    );
}

#[test]
fn busy_gpu_or_a_tiny_process_or_idle_time_before_the_job_is_not_flagged() {
    let busy_job = Scenario::new().phase(60.0, |_, s| {
        busy(s);
        s.processes = Some(vec![process(1, 8 * GIB)]);
    });
    assert!(!busy_job.ids().contains(&"utilisation.low".to_owned()));
    let tiny = Scenario::new().phase(60.0, |_, s| s.processes = Some(vec![process(2, 64 * MIB)]));
    assert!(!tiny.ids().contains(&"utilisation.low".to_owned()));
    // A job that just started after a long idle stretch is busy for all of its own life.
    let late_start = Scenario::new().phase(50.0, |_, _| {}).phase(10.0, |_, s| {
        busy(s);
        s.processes = Some(vec![process(3, 8 * GIB)]);
    });
    assert!(!late_start.ids().contains(&"utilisation.low".to_owned()));
}

#[test]
fn heavy_host_copies_lead_the_advice() {
    let sc = Scenario::new().phase(60.0, |_, s| {
        s.gpu_util_pct = Some(25.0);
        s.pcie_rx_bytes_per_s = Some(12e9);
        s.processes = Some(vec![process(7, 4 * GIB)]);
    });
    let f = sc.findings();
    let low = find(&f, "utilisation.low");
    assert!(
        low.advice.starts_with("Host-device copies"),
        "{}",
        low.advice
    );
    assert_eq!(
        low.evidence.values["pcie_rx_mean_mb_per_s"],
        serde_json::json!(12000.0)
    );
}

// ---------------------------------------------------------------------------------------------
// throttle

#[test]
fn each_failure_reason_under_load_fails_even_combined_with_others() {
    for (bit, id) in [
        (0x8, "throttle.hw_slowdown"),
        (0x20, "throttle.sw_thermal"),
        (0x40, "throttle.hw_thermal"),
        (0x80, "throttle.hw_power_brake"),
    ] {
        let sc = Scenario::new().phase(60.0, move |_, s| {
            busy(s);
            // Combined with the power cap: each reason is tested on its own bit.
            s.throttle_reasons = Some(bit | 0x4);
        });
        let f = sc.findings();
        let hit = find(&f, id);
        assert_eq!(hit.severity, Severity::Fail, "{id}");
        assert_eq!(
            hit.evidence.values["fraction_under_load"],
            serde_json::json!(1.0)
        );
        assert_eq!(find(&f, "throttle.sw_power_cap").severity, Severity::Info);
    }
}

#[test]
fn failure_reasons_while_idle_and_benign_reasons_never_fire() {
    let idle_slowdown = Scenario::new().phase(60.0, |_, s| s.throttle_reasons = Some(0x8 | 0x1));
    assert!(idle_slowdown.ids().is_empty(), "{:?}", idle_slowdown.ids());
    let benign = Scenario::new().phase(60.0, |_, s| {
        busy(s);
        s.throttle_reasons = Some(0x1 | 0x2 | 0x10 | 0x100);
    });
    assert!(benign.ids().is_empty(), "{:?}", benign.ids());
}

#[test]
fn power_cap_for_most_of_the_window_is_information_with_the_draw() {
    let capped = Scenario::new().phase(60.0, |t, s| {
        busy(s);
        if t >= 12.0 {
            s.throttle_reasons = Some(0x4);
            s.power_w = Some(698.0);
        }
    });
    let f = capped.findings();
    let cap = find(&f, "throttle.sw_power_cap");
    assert_eq!(cap.severity, Severity::Info);
    assert_eq!(
        cap.evidence.values["power_mean_w"],
        serde_json::json!(698.0)
    );
    assert_eq!(
        cap.evidence.values["power_limit_w"],
        serde_json::json!(700.0)
    );
    assert!(
        cap.title
            .contains("runs at its power limit (698 W of 700 W)"),
        "{}",
        cap.title
    );
    let brief = Scenario::new().phase(60.0, |t, s| {
        busy(s);
        if t >= 48.0 {
            s.throttle_reasons = Some(0x4);
        }
    });
    assert!(brief.ids().is_empty(), "{:?}", brief.ids());
}

#[test]
fn a_power_cap_well_below_the_limit_on_average_is_not_called_running_at_the_limit() {
    // The driver caps on its own short-term reading; bursty kernels peak at the limit while
    // the samples average 69% of it (4 x H100 DDP, 481 W of 700 W).
    let bursty = Scenario::new().phase(60.0, |_, s| {
        busy(s);
        s.throttle_reasons = Some(0x4);
        s.power_w = Some(481.0);
    });
    let f = bursty.findings();
    let cap = find(&f, "throttle.sw_power_cap");
    assert!(
        !cap.title.contains("runs at its power limit"),
        "{}",
        cap.title
    );
    assert!(
        cap.title
            .contains("clocks held back by the power cap (481 W mean of its 700 W limit"),
        "{}",
        cap.title
    );
    assert_eq!(
        cap.evidence.values["power_share_of_limit"],
        serde_json::json!(0.69)
    );
}

// ---------------------------------------------------------------------------------------------
// pcie

#[test]
fn a_link_below_its_maximum_while_busy_is_flagged() {
    let gen3 = Scenario::new().phase(60.0, |_, s| {
        busy(s);
        s.pcie_gen = Some(3);
    });
    let f = gen3.findings();
    let link = find(&f, "pcie.link_downtrained");
    assert_eq!(link.evidence.values["pcie_gen"], serde_json::json!(3));
    assert_eq!(link.evidence.values["pcie_gen_max"], serde_json::json!(5));
    // Narrow link while moving data, outside P0.
    let x8 = Scenario::new().phase(60.0, |_, s| {
        s.pstate = Some(2);
        s.pcie_width = Some(8);
        s.pcie_rx_bytes_per_s = Some(3e9);
    });
    let f = x8.findings();
    assert_eq!(
        find(&f, "pcie.link_downtrained").evidence.values["pcie_width"],
        serde_json::json!(8)
    );
}

#[test]
fn an_idle_link_downshifting_is_normal() {
    let idle = Scenario::new().phase(60.0, |_, s| {
        s.pstate = Some(8);
        s.pcie_gen = Some(1);
    });
    assert!(idle.ids().is_empty(), "{:?}", idle.ids());
    let idle_p0 = Scenario::new().phase(60.0, |_, s| s.pcie_gen = Some(1));
    assert!(idle_p0.ids().is_empty(), "{:?}", idle_p0.ids());
}

#[test]
fn replays_faster_than_the_ber_budget_are_flagged_slower_ones_and_resets_not() {
    // 100 replays a minute on Gen5 x16, whose budget is about 31.
    let fast = Scenario::new().phase(120.0, |t, s| {
        s.pcie_replay_count = Some((t * 100.0 / 60.0) as u64)
    });
    let f = fast.findings();
    let r = find(&f, "pcie.replay_rate");
    let rate = r.evidence.values["replays_per_min"].as_f64().unwrap();
    assert!((95.0..=101.0).contains(&rate), "{rate}");
    let slow = Scenario::new().phase(120.0, |t, s| {
        s.pcie_replay_count = Some((t * 10.0 / 60.0) as u64)
    });
    assert!(slow.ids().is_empty(), "{:?}", slow.ids());
    let reset = Scenario::new()
        .phase(60.0, |_, s| s.pcie_replay_count = Some(5000))
        .phase(60.0, |_, s| s.pcie_replay_count = Some(3));
    assert!(reset.ids().is_empty(), "{:?}", reset.ids());
}

// ---------------------------------------------------------------------------------------------
// memory

#[test]
fn nearly_full_memory_warns_and_ninety_percent_does_not() {
    let full = Scenario::new().phase(20.0, |_, s| s.mem_used_bytes = Some(137 * GIB));
    let f = full.findings();
    let m = find(&f, "memory.nearly_full");
    assert!(m.evidence.values["used_pct"].as_f64().unwrap() > 97.0);
    let ninety = Scenario::new().phase(20.0, |_, s| s.mem_used_bytes = Some(127 * GIB));
    assert!(ninety.ids().is_empty(), "{:?}", ninety.ids());
}

#[test]
fn steady_growth_is_a_possible_leak_with_its_rate() {
    // Grows by 50 MiB every 30 s (100 MiB/min) for 10 minutes, GPU busy.
    let mut sc = Scenario::new();
    sc.interval_ms = 1000;
    let sc = sc.phase(600.0, |t, s| {
        busy(s);
        let steps = (t / 30.0).floor() as u64;
        s.processes = Some(vec![process(99, 2 * GIB + steps * 50 * MIB)]);
    });
    let f = sc.findings();
    let leak = find(&f, "memory.possible_leak");
    let rate = leak.evidence.values["rate_mib_per_min"].as_f64().unwrap();
    assert!((90.0..=110.0).contains(&rate), "{rate}");
    assert_eq!(leak.evidence.values["pid"], serde_json::json!(99));
    assert!(leak.title.contains("pid 99"), "{}", leak.title);
}

/// The reason the leak rule gave for not judging, if it gave one.
fn leak_not_judged(sc: &Scenario) -> Option<String> {
    sc.not_judged()
        .into_iter()
        .find(|(rule, device, _)| rule == "memory.possible_leak" && *device == Some(0))
        .map(|(_, _, reason)| reason)
}

#[test]
fn a_fast_steady_leak_is_flagged_within_forty_seconds() {
    // 3.8 GiB/min, seen as a new process-list value every second: 2.5 GiB in 40 s.
    let sc = Scenario::new().phase(40.0, |t, s| {
        busy(s);
        let grown = (t.floor() * 3.8 * 1024.0 / 60.0) as u64 * MIB;
        s.processes = Some(vec![process(77, 2 * GIB + grown)]);
    });
    let f = sc.findings();
    let leak = find(&f, "memory.possible_leak");
    let rate = leak.evidence.values["rate_mib_per_min"].as_f64().unwrap();
    assert!((3600.0..=4000.0).contains(&rate), "{rate}");
    assert!(leak.title.contains("MiB in 39 s"), "{}", leak.title);
    assert_eq!(leak_not_judged(&sc), None);
}

#[test]
fn a_model_warming_up_is_not_a_leak_and_short_slow_growth_is_not_judged() {
    // The caching allocator reserves 12 GiB in ten steps over the first 8 s, then holds it.
    let warm_up = Scenario::new().phase(40.0, |t, s| {
        busy(s);
        let steps = ((t / 0.8).floor() as u64).min(10);
        s.processes = Some(vec![process(88, 4 * GIB + steps * 1200 * MIB)]);
    });
    assert!(
        !warm_up.ids().contains(&"memory.possible_leak".to_owned()),
        "{:?}",
        warm_up.ids()
    );
    let reason = leak_not_judged(&warm_up).expect("a process seen for 40 s is not judged");
    assert!(
        reason.contains("pid 88") && reason.contains("needs 120 s"),
        "{reason}"
    );
    // 100 MiB/min for 40 s may be a leak or not: too little to judge, and the report says so.
    let slow = Scenario::new().phase(40.0, |t, s| {
        busy(s);
        let grown = (t.floor() * 100.0 / 60.0) as u64 * MIB;
        s.processes = Some(vec![process(89, 2 * GIB + grown)]);
    });
    assert!(!slow.ids().contains(&"memory.possible_leak".to_owned()));
    assert!(leak_not_judged(&slow).is_some());
}

#[test]
fn a_single_large_allocation_is_not_a_leak() {
    let mut sc = Scenario::new();
    sc.interval_ms = 1000;
    let sc = sc.phase(600.0, |t, s| {
        busy(s);
        let bytes = if t < 300.0 { 2 * GIB } else { 6 * GIB };
        s.processes = Some(vec![process(99, bytes)]);
    });
    assert!(
        !sc.ids().contains(&"memory.possible_leak".to_owned()),
        "{:?}",
        sc.ids()
    );
}

// ---------------------------------------------------------------------------------------------
// errors

#[test]
fn uncorrectable_ecc_and_xids_are_graded() {
    let sc = Scenario::new()
        .phase(5.0, |_, s| s.ecc_uncorrected_volatile = Some(1))
        .xid(79)
        .xid(13);
    let f = sc.findings();
    assert_eq!(
        find(&f, "errors.ecc_uncorrectable").severity,
        Severity::Fail
    );
    assert_eq!(find(&f, "errors.xid_79").severity, Severity::Fail);
    assert_eq!(find(&f, "errors.xid_13").severity, Severity::Warn);
    assert!(
        find(&f, "errors.xid_79")
            .title
            .contains("fallen off the bus")
    );
}

#[test]
fn an_xid_79_alone_raises_device_lost_once_with_the_xid_as_evidence() {
    // The XID arrives while the GPU still reported values, and later samples still do: the XID
    // is all there is to say the GPU is gone.
    let sc = Scenario::new()
        .phase(2.0, |_, _| {})
        .xid(79)
        .phase(2.0, |_, _| {})
        .xid(79);
    let f = sc.findings();
    let lost: Vec<&Finding> = f.iter().filter(|f| f.id == "device.lost").collect();
    assert_eq!(lost.len(), 1, "{f:?}");
    assert_eq!(lost[0].severity, Severity::Fail);
    assert_eq!(lost[0].device, Some(0));
    assert_eq!(lost[0].time_ms, T0 + 2000);
    assert_eq!(lost[0].evidence.values["xid"], serde_json::json!(79));
    assert_eq!(find(&f, "errors.xid_79").severity, Severity::Fail);
    // Samples that keep saying the GPU is lost after the XID keep the XID as evidence.
    let gone = Scenario::new()
        .phase(2.0, |_, _| {})
        .xid(79)
        .phase(3.0, |_, s| {
            s.gpu_util_pct = None;
            s.absent.insert(
                "gpu_util_pct".into(),
                gpudiag_model::sample::Absent::GpuLost,
            );
        });
    let f = gone.findings();
    let lost: Vec<&Finding> = f.iter().filter(|f| f.id == "device.lost").collect();
    assert_eq!(lost.len(), 1, "{f:?}");
    assert_eq!(
        lost[0].evidence.values["xid"],
        serde_json::json!(79),
        "{:?}",
        lost[0]
    );
    // Other XIDs say nothing about the bus.
    let other = Scenario::new().phase(1.0, |_, _| {}).xid(48).xid(13);
    assert!(
        !other.ids().contains(&"device.lost".to_owned()),
        "{:?}",
        other.ids()
    );
}

#[test]
fn corrected_ecc_errors_alone_are_not_a_finding() {
    let sc = Scenario::new().phase(5.0, |_, s| s.ecc_corrected_volatile = Some(12));
    assert!(sc.ids().is_empty(), "{:?}", sc.ids());
}

#[test]
fn pending_remap_warns_and_remap_failure_fails() {
    let pending = Scenario::new().phase(5.0, |_, s| s.remapped_rows_pending = Some(true));
    assert_eq!(pending.ids(), ["errors.reset_pending"]);
    let failed = Scenario::new().phase(5.0, |_, s| s.remapped_rows_failure = Some(true));
    let f = failed.findings();
    assert_eq!(
        find(&f, "errors.row_remap_failure").severity,
        Severity::Fail
    );
}

// ---------------------------------------------------------------------------------------------
// thermal

#[test]
fn near_the_slowdown_temperature_warns_and_ten_degrees_below_does_not() {
    let hot = Scenario::new().phase(20.0, |_, s| s.temp_gpu_c = Some(86.0));
    let f = hot.findings();
    let t = find(&f, "thermal.near_slowdown");
    assert_eq!(t.evidence.values["limit_c"], serde_json::json!(89.0));
    let warm = Scenario::new().phase(20.0, |_, s| s.temp_gpu_c = Some(79.0));
    assert!(warm.ids().is_empty(), "{:?}", warm.ids());
}

#[test]
fn a_finding_that_passed_is_cleared_with_its_span_and_one_that_holds_stays_active() {
    // Hot for 5 s, then 55 s at 55 °C: the 10 s mean drops below the margin a second later.
    let passed = Scenario::new()
        .phase(5.0, |_, s| s.temp_gpu_c = Some(88.0))
        .phase(55.0, |_, s| s.temp_gpu_c = Some(55.0));
    let f = passed.findings();
    let t = find(&f, "thermal.near_slowdown");
    assert_eq!(t.state, FindingState::Cleared);
    assert_eq!(t.time_ms, T0);
    let last = t.last_seen_ms.expect("the engine stamps when it last held");
    assert!(
        (T0 + 4_000..T0 + 10_000).contains(&last),
        "last seen {} ms in",
        last - T0
    );
    let held = Scenario::new().phase(60.0, |_, s| s.temp_gpu_c = Some(88.0));
    let f = held.findings();
    let t = find(&f, "thermal.near_slowdown");
    assert_eq!(t.state, FindingState::Active);
    assert_eq!(t.time_ms, T0);
    assert!(
        t.last_seen_ms.unwrap() >= T0 + 59_000,
        "{:?}",
        t.last_seen_ms
    );
}

#[test]
fn titles_name_their_window_and_never_round_onto_the_threshold() {
    // 95.03% of the memory is above "> 95%": printed as "95.0%" the title contradicts it.
    let used = (141.0 * GIB as f64 * 0.9503) as u64;
    let full = Scenario::new().phase(20.0, |_, s| s.mem_used_bytes = Some(used));
    let f = full.findings();
    let title = &find(&f, "memory.nearly_full").title;
    assert!(title.contains("95.03% full (mean over 10 s)"), "{title}");
    // A mean utilisation of 49.6% is below "< 50%": it must not print as 50%.
    let low = Scenario::new().phase(60.0, |_, s| {
        s.gpu_util_pct = Some(49.6);
        s.processes = Some(vec![process(5, 8 * GIB)]);
    });
    let f = low.findings();
    let title = &find(&f, "utilisation.low").title;
    assert!(title.contains("utilisation 49%"), "{title}");
    let hot = Scenario::new().phase(20.0, |_, s| s.temp_gpu_c = Some(86.4));
    let f = hot.findings();
    let title = &find(&f, "thermal.near_slowdown").title;
    assert!(
        title.contains("86 °C (mean over 10 s), within 3 °C of its 89 °C limit"),
        "{title}"
    );
}

// ---------------------------------------------------------------------------------------------
// not judged

#[test]
fn rules_without_their_data_say_so_once_per_rule_and_device() {
    let sc = Scenario::new().phase(60.0, |_, s| {
        busy(s);
        s.processes = None;
        s.absent.insert("processes".into(), Absent::NoPermission);
        s.throttle_reasons = None;
        s.absent
            .insert("throttle_reasons".into(), Absent::NotSupported);
        s.pcie_replay_count = None;
        s.ecc_uncorrected_volatile = None;
        s.absent
            .insert("ecc_uncorrected_volatile".into(), Absent::NotSupported);
    });
    let nj = sc.not_judged();
    let reason = |rule: &str| {
        nj.iter()
            .find(|(r, d, _)| r == rule && *d == Some(0))
            .map(|(_, _, why)| why.as_str())
            .unwrap_or_else(|| panic!("no {rule} in {nj:#?}"))
    };
    assert_eq!(
        reason("memory.possible_leak"),
        "no process list (no permission)"
    );
    assert!(reason("utilisation.low").starts_with("no process list (no permission)"));
    assert_eq!(reason("throttle"), "no throttle reasons (not supported)");
    assert!(reason("pcie.replay_rate").starts_with("no PCIe replay counter"));
    assert_eq!(
        reason("errors.ecc_uncorrectable"),
        "no ECC error counters (not supported)"
    );
    let mut keys: Vec<_> = nj.iter().map(|(r, d, _)| (r.clone(), *d)).collect();
    let all = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), all, "{nj:#?}");
}

#[test]
fn a_short_window_says_what_needs_more_time_and_a_long_one_judges_everything() {
    let short = Scenario::new().phase(12.0, |_, s| {
        busy(s);
        s.processes = Some(vec![process(5, 8 * GIB)]);
    });
    let nj = short.not_judged();
    let rules: Vec<&str> = nj.iter().map(|(r, _, _)| r.as_str()).collect();
    assert!(rules.contains(&"pcie.replay_rate"), "{nj:#?}");
    assert!(rules.contains(&"memory.possible_leak"), "{nj:#?}");
    // Three minutes with every field: only what needs profiling counters stays unjudged.
    let long = Scenario::new().phase(180.0, |_, s| {
        busy(s);
        s.processes = Some(vec![process(5, 8 * GIB)]);
    });
    let nj = long.not_judged();
    assert_eq!(
        nj.iter().map(|(r, _, _)| r.as_str()).collect::<Vec<_>>(),
        ["utilisation.low"],
        "{nj:#?}"
    );
    assert!(nj[0].2.contains("no profiling counters"), "{nj:#?}");
}

// ---------------------------------------------------------------------------------------------
// environment

fn lib(name: &str, version: &str) -> LibraryInfo {
    LibraryInfo {
        name: name.into(),
        found: true,
        path: None,
        version: Some(version.into()),
        note: None,
    }
}

#[test]
fn runtime_newer_than_the_driver_fails_and_a_matching_one_is_quiet() {
    let container = Scenario::new()
        .with(|s| {
            s.host.cuda_driver_version = Some("12.4".into());
            s.libraries = Some(vec![
                lib("libnvrtc", "13.0.88"),
                lib("libcublas", "13.1.0.3"),
            ]);
        })
        .phase(2.0, |_, _| {});
    let f = container.findings();
    let m = find(&f, "environment.cuda_driver_too_old");
    assert_eq!(m.severity, Severity::Fail);
    assert_eq!(m.device, None);
    let minor = Scenario::new()
        .with(|s| {
            s.host.cuda_driver_version = Some("12.4".into());
            s.libraries = Some(vec![lib("libnvrtc", "12.8.61")]);
        })
        .phase(2.0, |_, _| {});
    let f = minor.findings();
    assert_eq!(
        find(&f, "environment.cuda_driver_too_old").severity,
        Severity::Warn
    );
    // The H200 host: driver CUDA 13.0, NVRTC 13.0, cuBLAS 13.1 (whose minor runs ahead).
    let matching = Scenario::new()
        .with(|s| {
            s.libraries = Some(vec![
                lib("libnvrtc", "13.0.88"),
                lib("libcublas", "13.1.0.3"),
            ])
        })
        .phase(2.0, |_, _| {});
    assert!(matching.ids().is_empty(), "{:?}", matching.ids());
}

#[test]
fn persistence_off_and_mig_on_are_information() {
    let sc = Scenario::new()
        .with(|s| {
            s.device.persistence_mode = Some(false);
            s.device.mig_enabled = Some(true);
        })
        .phase(2.0, |_, _| {});
    let f = sc.findings();
    assert_eq!(
        find(&f, "environment.persistence_off").severity,
        Severity::Info
    );
    assert_eq!(find(&f, "environment.mig_enabled").severity, Severity::Info);
    let unknown = Scenario::new()
        .with(|s| {
            s.device.persistence_mode = None;
            s.device.mig_enabled = None;
        })
        .phase(2.0, |_, _| {});
    assert!(
        unknown.ids().is_empty(),
        "absent is not 'off': {:?}",
        unknown.ids()
    );
}

// ---------------------------------------------------------------------------------------------
// thresholds come from the config

#[test]
fn thresholds_are_configurable() {
    let sc = Scenario::new().phase(20.0, |_, s| s.temp_gpu_c = Some(79.0));
    assert!(sc.ids().is_empty());
    let config = Config::parse("[rules.thermal]\nslowdown_margin_c = 12\n", "test").unwrap();
    let sc = sc.with(|s| s.config = config.rules);
    assert_eq!(sc.ids(), ["thermal.near_slowdown"]);
}

#[test]
fn per_tick_cost_does_not_depend_on_history_length() {
    // The engine evaluates windowed rules once per eval interval: over 20 minutes of 10 Hz ticks
    // it must have run about 1200 evaluations, not 12000.
    let mut sc = Scenario::new();
    sc.interval_ms = 100;
    let sc = sc.phase(1200.0, |_, s| busy(s));
    let mut engine = RuleEngine::new(sc.config.clone(), vec![sc.device.clone()], None, None);
    let mut history = History::default();
    let mut evaluations = 0;
    let mut last = None;
    for t in &sc.ticks {
        for s in &t.samples {
            history.push_sample(s);
        }
        engine.on_tick(&history, t);
        let eval = engine.last_evaluation_ms();
        if eval != last {
            evaluations += 1;
            last = eval;
        }
    }
    assert!((1150..=1250).contains(&evaluations), "{evaluations}");
}

/// The phase the live views lead with, after each of `scenario`'s ticks up to `upto` of them:
/// (bottleneck, seconds since it began), or `None` where the window is one phase.
fn current_phase_after(scenario: &Scenario, upto: usize) -> Option<(String, f64)> {
    let mut engine = RuleEngine::new(
        scenario.config.clone(),
        vec![scenario.device.clone()],
        Some(scenario.host.clone()),
        None,
    )
    .with_current_phase();
    let mut history = History::default();
    for t in &scenario.ticks[..upto] {
        for s in &t.samples {
            history.push_sample(s);
        }
        engine.on_tick(&history, t);
    }
    engine.finish(&history);
    engine
        .current_phase(0)
        .map(|p| (p.verdict.bottleneck.to_string(), p.duration_s()))
}

/// A process that held 8 GiB on an idle GPU for 25 s exits: from the first process list
/// without it, the phase the live views lead with is `idle` since it left, not the window's
/// `idle_holding_memory`; a GPU busy until its process exited is not called idle on figures
/// from before the exit, and is once the seconds after it can be judged alone.
#[test]
fn a_process_that_exits_ends_its_phase_where_it_left() {
    let held = |_: f64, s: &mut Sample| {
        s.mem_used_bytes = Some(8 * GIB);
        s.processes = Some(vec![process(4242, 8 * GIB)]);
    };
    let parked = Scenario::new().phase(25.0, held).phase(10.0, |_, _| {});
    let exit_tick = 100; // 25 s of ticks at 250 ms
    assert_eq!(current_phase_after(&parked, exit_tick), None, "one phase");
    for after in [1, 4, 12, 40] {
        let (bottleneck, since) =
            current_phase_after(&parked, exit_tick + after).expect("a phase since the exit");
        assert_eq!(bottleneck, "idle", "{after} ticks after the exit");
        assert!(
            since <= after as f64 * 0.25 + 1.0,
            "{after} ticks after the exit, idle for {since} s"
        );
    }

    let busy = |_: f64, s: &mut Sample| {
        held(0.0, s);
        s.gpu_util_pct = Some(100.0);
        s.sm_active_pct = Some(95.0);
        s.sm_occupancy_pct = Some(60.0);
        s.power_w = Some(650.0);
    };
    let training = Scenario::new().phase(25.0, busy).phase(10.0, |_, _| {});
    let just_after = current_phase_after(&training, exit_tick + 2);
    assert_ne!(
        just_after.as_ref().map(|(b, _)| b.as_str()),
        Some("idle"),
        "half a second after a busy process left: {just_after:?}"
    );
    let later = current_phase_after(&training, exit_tick + 20).expect("a phase since the exit");
    assert_eq!(later.0, "idle", "{later:?}");
}
