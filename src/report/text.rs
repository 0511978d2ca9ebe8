//! The human-readable form of a check report. Absent values print as "n/a", never as 0. A
//! device's telemetry lines are the text templates of the metric table, line by line. Every
//! string the report carries came from a driver or a recording, so each goes through
//! `printable::line` on its way in.

use std::collections::BTreeMap;
use std::fmt::Write;

use gpudiag_core::check::{CheckReport, DeviceReport};
use gpudiag_core::history::WindowStats;
use gpudiag_model::metrics;
use gpudiag_model::printable::line as esc;
use gpudiag_model::sample::MetricDef;
use gpudiag_telemetry::{METRICS, Sample};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn na(v: Option<&str>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| esc(v).into_owned())
}

fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

fn gib(v: Option<u64>) -> String {
    fixed(v.map(|b| b as f64 / GIB), 1)
}

fn rate(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.1} GB/s", b / 1e9)
    } else {
        format!("{:.0} MB/s", b / 1e6)
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
        esc(&report.source.backend),
        report
            .source
            .recording
            .as_deref()
            .map(|r| format!(" {}", esc(r)))
            .unwrap_or_default(),
    );
    let w = &report.window;
    let _ = writeln!(
        out,
        "window {:.1} s, {} sample tick(s)",
        w.covered_s, w.ticks
    );
    for w in &report.source.warnings {
        let _ = writeln!(out, "note: {}", esc(w));
    }
    if let Some(libs) = &report.libraries {
        let parts: Vec<String> = libs
            .iter()
            .map(|l| match (&l.found, &l.version) {
                (true, Some(v)) => format!("{} {}", esc(&l.name), esc(v)),
                (true, None) => format!("{} (version unknown)", esc(&l.name)),
                (false, _) => format!("{} not found", esc(&l.name)),
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
                esc(&f.title),
                f.recorded_tag(),
                esc(&f.advice)
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
    let Some(s) = &d.latest else {
        out.push_str("  no samples\n");
        return;
    };
    let stat = |m: &MetricDef, pick: fn(&WindowStats) -> Option<f64>| {
        m.series
            .and_then(|series| d.summary.get(&series))
            .and_then(pick)
    };
    let mut lines: BTreeMap<u8, Vec<String>> = BTreeMap::new();
    for m in METRICS {
        let Some(text) = m.text else { continue };
        let item = metrics::expand(text.template, |name| {
            let (format, v) = match name {
                "" => (m.format, m.shown(Some(s), i)),
                "mean" => (m.format, stat(m, |w| w.mean)),
                "max" => (m.format, stat(m, |w| w.max)),
                other => match gpudiag_model::sample::by_name(other) {
                    Some(o) => (o.format, o.shown(Some(s), i)),
                    None => (m.format, None),
                },
            };
            v.map(|v| format.show(v, rate))
        });
        lines.entry(text.line).or_default().push(item);
    }
    // Throttle reasons are a list of decoded names, not a value the table formats; they close
    // the last line.
    if let Some(last) = lines.values_mut().next_back() {
        last.push(format!("throttle: {}", throttle_names(s)));
    }
    for items in lines.values() {
        let _ = writeln!(out, "  {}", items.join("  "));
    }
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
            esc(&f.title),
            f.recorded_tag(),
            esc(&f.advice)
        );
    }
}

fn throttle_names(s: &Sample) -> String {
    match &s.throttle_reason_names {
        None => "n/a".into(),
        Some(n) if n.is_empty() => "none".into(),
        Some(n) => esc(&n.join(", ")).into_owned(),
    }
}
