//! GPU test of the terminal UI: run on a host with an NVIDIA GPU (`.gpu-bundle/run-gpu-tests`),
//! ignored elsewhere. tmux starts `gpudiag` on the real GPUs; the test checks that the device's
//! name and live values appear, walks the panels, and that the UI exits cleanly. Another checks
//! that a probe run from the UI leaves no GPU memory with the UI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/gpu.rs"]
mod gpu;
#[path = "support/tmux.rs"]
mod tmux;

use std::process::Command;
use std::time::Duration;

use gpu::gpudiag_bin;
use tmux::Tmux;

const WAIT: Duration = Duration::from_secs(20);

fn gpu_names() -> Vec<String> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .expect("nvidia-smi runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// A number right before `unit` somewhere on the screen ("61°C" -> 61).
fn value_before(screen: &str, unit: &str) -> Option<f64> {
    screen.split(unit).next().and_then(|before| {
        let digits: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        digits.parse().ok()
    })
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn live_ui_shows_the_gpu_and_exits_cleanly() {
    let tmux = Tmux::start(120, 36, "gpu");
    let names = gpu_names();
    let first = names.first().expect("nvidia-smi lists a GPU");
    tmux.type_line(&format!(
        "S=$(stty -g); {} --interval 250ms; echo \"exit=$?\"; [ \"$(stty -g)\" = \"$S\" ] && echo tty-restored",
        gpudiag_bin()
    ));
    let screen = tmux.wait_for(&["LIVE every 250ms", "[1 Devices]", first.as_str()], WAIT);
    assert!(!screen.contains("REPLAY"), "{screen}");
    // Live values: a temperature, a power draw and an SM clock, as numbers. The first frame
    // comes before the first poll (every value n/a, the static slowdown temperature and clock
    // maximum already there): wait for data, not for the frame.
    // "  61°C  655/700W  SM 1980/1980MHz ...": the draw before the slash is a number.
    let power_draw = |screen: &str| {
        screen
            .lines()
            .find_map(|l| l.split("W  SM ").nth(1).and(l.split("W  SM ").next()))
            .and_then(|before| before.split_whitespace().last())
            .and_then(|t| t.split('/').next())
            .and_then(|n| n.parse::<f64>().ok())
    };
    let screen = tmux.wait_until("a power draw", |s| power_draw(s).is_some(), WAIT);
    let temp = value_before(&screen, "°C").unwrap_or_else(|| panic!("no temperature:\n{screen}"));
    assert!((5.0..120.0).contains(&temp), "{temp}\n{screen}");
    let draw = power_draw(&screen);
    assert!(draw.is_some_and(|w| w > 0.0), "no power draw:\n{screen}");
    let sm = value_before(&screen, "MHz");
    assert!(sm.is_some(), "no SM clock:\n{screen}");
    // The header counts the GPUs nvidia-smi sees ("· 1 GPU", "· 8 GPUs"; tmux trims the
    // line's trailing blanks).
    let gpus = match names.len() {
        1 => "· 1 GPU".to_owned(),
        n => format!("· {n} GPUs"),
    };
    assert!(
        screen
            .lines()
            .any(|l| l.trim_end().ends_with(&gpus) || l.contains(&format!("{gpus} "))),
        "{gpus}\n{screen}"
    );

    tmux.keys(&["2"]);
    tmux.wait_for(&["[2 Detail]", "util", "power", "clocks SM"], WAIT);
    // Slow fields (PCIe throughput, processes) arrive within a couple of seconds.
    std::thread::sleep(Duration::from_secs(3));
    tmux.keys(&["3"]);
    let procs = tmux.wait_for(&["[3 Processes]"], WAIT);
    // A table, "no processes", or the reason the list is absent (never an empty table).
    assert!(
        procs.contains("PID")
            || procs.contains("no processes")
            || procs.contains("process list n/a"),
        "{procs}"
    );
    // The quick suite from the probes panel, while telemetry keeps updating.
    tmux.keys(&["5"]);
    tmux.wait_for(&["No probe run yet", "quick"], WAIT);
    tmux.keys(&["Enter"]);
    let results = tmux.wait_for(
        &["h2d_pinned", "bf16", "mismatches"],
        Duration::from_secs(90),
    );
    // Each probe's verdict line reads "<probe>  <verdict>  <time>".
    let verdicts: Vec<(&str, &str)> = results
        .lines()
        .filter_map(|l| {
            let mut w = l.trim_matches(|c| c == '│' || c == ' ').split_whitespace();
            let probe = w.next()?;
            let verdict = w.next()?;
            ["latency", "bandwidth", "matmul", "memory"]
                .contains(&probe)
                .then_some((probe, verdict))
        })
        .collect();
    assert_eq!(verdicts.len(), 4, "{results}");
    assert!(
        verdicts.iter().all(|(_, v)| *v == "pass"),
        "{verdicts:?}\n{results}"
    );
    tmux.keys(&["Space"]);
    tmux.wait_for(&["PAUSED (live)"], WAIT);
    tmux.keys(&["Space"]);
    tmux.wait_for(&["LIVE every"], WAIT);
    tmux.keys(&["q"]);
    tmux.wait_for(&["exit=0", "tty-restored"], WAIT);
    assert_eq!(tmux.display("#{alternate_on}"), "0");
}

/// MiB in use on each GPU, as nvidia-smi reports it.
fn used_mib() -> Vec<u64> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .expect("nvidia-smi runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// What the Probes panel does, from a process standing in for the UI: the suite runs (in a
/// child `gpudiag probe`), and afterwards this process holds no CUDA context: no GPU memory
/// beyond what was in use before, not in NVML's process list, libcuda never loaded. Run in the
/// UI's own process, the probes left about 500 MiB per GPU until the UI quit.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_probe_run_from_the_ui_leaves_no_gpu_memory_with_the_ui() {
    let before = used_mib();
    let report = gpudiag::probe_run::run_probes_in_child(
        std::path::Path::new(&gpudiag_bin()),
        gpudiag::cli::SuiteName::Quick,
        true,
    )
    .expect("the quick suite runs");
    assert!(
        report.devices.iter().any(|d| !d.results.is_empty()),
        "{report:?}"
    );
    // The driver frees a context a moment after its process exits.
    let start = std::time::Instant::now();
    let mut after = used_mib();
    while after.iter().zip(&before).any(|(a, b)| *a > b + 64)
        && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(200));
        after = used_mib();
    }
    for (gpu, (a, b)) in after.iter().zip(&before).enumerate() {
        assert!(
            *a <= b + 64,
            "GPU {gpu}: {b} MiB in use before, {a} MiB after"
        );
    }
    let me = std::process::id().to_string();
    let apps = Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid", "--format=csv,noheader"])
        .output()
        .expect("nvidia-smi runs");
    let apps = String::from_utf8_lossy(&apps.stdout);
    assert!(!apps.lines().any(|l| l.trim() == me), "{apps}");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains("libcuda.so"),
        "libcuda loaded in the UI's process"
    );
}
