//! The human-readable form of a check report. Absent values print as "n/a", never as 0.

use std::fmt::Write;

use gpudiag_core::check::{CheckReport, DeviceReport};
use gpudiag_telemetry::{Metric, Sample};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn na<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| v.to_string())
}

fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

fn gib(v: Option<u64>) -> String {
    fixed(v.map(|b| b as f64 / GIB), 1)
}

fn rate(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(b) if b >= 1e9 => format!("{:.1} GB/s", b / 1e9),
        Some(b) => format!("{:.0} MB/s", b / 1e6),
    }
}

pub fn render(report: &CheckReport) -> String {
    let mut out = String::new();
    let h = &report.host;
    let _ = writeln!(
        out,
        "gpudiag {} · host {} · driver {} (CUDA {}) · source {}{}",
        report.tool.version,
        na(h.hostname.as_deref()),
        na(h.driver_version.as_deref()),
        na(h.cuda_driver_version.as_deref()),
        report.source.backend,
        report
            .source
            .recording
            .as_deref()
            .map(|r| format!(" {r}"))
            .unwrap_or_default(),
    );
    let w = &report.window;
    let _ = writeln!(
        out,
        "window {:.1} s, {} sample tick(s)",
        w.covered_s, w.ticks
    );
    for w in &report.source.warnings {
        let _ = writeln!(out, "note: {w}");
    }
    if let Some(libs) = &report.libraries {
        let parts: Vec<String> = libs
            .iter()
            .map(|l| match (&l.found, &l.version) {
                (true, Some(v)) => format!("{} {v}", l.name),
                (true, None) => format!("{} (version unknown)", l.name),
                (false, _) => format!("{} not found", l.name),
            })
            .collect();
        let _ = writeln!(out, "libraries: {}", parts.join(" · "));
    }
    for d in &report.devices {
        out.push('\n');
        render_device(&mut out, d);
    }
    if let Some(t) = &report.topology {
        out.push('\n');
        out.push_str(&gpudiag_model::topology::render(t));
    }
    if !report.host_findings.is_empty() {
        out.push_str("\nhost findings:\n");
        for f in &report.host_findings {
            let _ = writeln!(
                out,
                "  [{}] {}{} — {}",
                f.severity,
                f.title,
                f.recorded_tag(),
                f.advice
            );
        }
    }
    let count = |sev| {
        report
            .devices
            .iter()
            .flat_map(|d| &d.findings)
            .chain(&report.host_findings)
            .filter(|f| f.severity == sev)
            .count()
    };
    use gpudiag_core::rules::Severity::*;
    let _ = writeln!(
        out,
        "\nstatus: {} ({} fail, {} warn, {} info) · exit code {}",
        report.status,
        count(Fail),
        count(Warn),
        count(Info),
        report.exit_code
    );
    out
}

fn render_device(out: &mut String, d: &DeviceReport) {
    let i = &d.info;
    let _ = writeln!(
        out,
        "GPU {}  {}  {}  {}{}  {} GiB  {}",
        i.index,
        na(i.name.as_deref()),
        na(i.pci_bus_id.as_deref()),
        na(i.architecture.as_deref()),
        // Compute capability is NVIDIA's notion; other vendors simply have none to show.
        i.compute_capability
            .map(|cc| format!(" (cc {cc})"))
            .unwrap_or_default(),
        gib(i.memory_total_bytes),
        na(i.uuid.as_deref()),
    );
    let mean = |m: Metric| d.summary.get(&m).and_then(|s| s.mean);
    let max = |m: Metric| d.summary.get(&m).and_then(|s| s.max);
    let Some(s) = &d.latest else {
        out.push_str("  no samples\n");
        return;
    };
    let _ = writeln!(
        out,
        "  util {}% (mean {}%, max {}%)  mem util {}%  memory {} / {} GiB",
        fixed(s.gpu_util_pct, 0),
        fixed(mean(Metric::GpuUtilPct), 0),
        fixed(max(Metric::GpuUtilPct), 0),
        fixed(s.mem_util_pct, 0),
        gib(s.mem_used_bytes),
        gib(s.mem_total_bytes),
    );
    let _ = writeln!(
        out,
        "  power {} / {} W (mean {} W)  temp {} °C (slowdown {} °C)  fan {}",
        fixed(s.power_w, 0),
        fixed(s.power_limit_w, 0),
        fixed(mean(Metric::PowerW), 0),
        fixed(s.temp_gpu_c, 0),
        fixed(s.temp_slowdown_c, 0),
        s.fan_pct
            .map_or_else(|| "n/a".into(), |f| format!("{f:.0}%")),
    );
    let _ = writeln!(
        out,
        "  SM clock {} / {} MHz  memory clock {} / {} MHz  P{}",
        na(s.sm_clock_mhz),
        na(s.sm_clock_max_mhz),
        na(s.mem_clock_mhz),
        na(s.mem_clock_max_mhz),
        na(s.pstate),
    );
    let _ = writeln!(
        out,
        "  PCIe Gen{} x{} (max Gen{} x{})  rx {}  tx {}  replays {}",
        na(s.pcie_gen),
        na(s.pcie_width),
        na(s.pcie_gen_max),
        na(s.pcie_width_max),
        rate(s.pcie_rx_bytes_per_s),
        rate(s.pcie_tx_bytes_per_s),
        na(s.pcie_replay_count),
    );
    let _ = writeln!(
        out,
        "  ECC volatile {} corrected / {} uncorrected  remap pending {}  throttle: {}",
        na(s.ecc_corrected_volatile),
        na(s.ecc_uncorrected_volatile),
        na(s.remapped_rows_pending),
        throttle_names(s),
    );
    if let Some(procs) = &s.processes {
        let _ = writeln!(out, "  processes: {}", procs.len());
        for p in procs {
            let _ = writeln!(
                out,
                "    pid {}  {}  {} GiB",
                p.pid,
                na(p.name.as_deref()),
                gib(p.used_memory_bytes)
            );
        }
    }
    if d.findings.is_empty() {
        out.push_str("  findings: none\n");
    }
    for f in &d.findings {
        let _ = writeln!(
            out,
            "  [{}] {}{}\n      what to do: {}",
            f.severity,
            f.title,
            f.recorded_tag(),
            f.advice
        );
    }
}

fn throttle_names(s: &Sample) -> String {
    match &s.throttle_reason_names {
        None => "n/a".into(),
        Some(n) if n.is_empty() => "none".into(),
        Some(n) => n.join(", "),
    }
}
