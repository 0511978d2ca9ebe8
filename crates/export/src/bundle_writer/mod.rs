//! The bug-report bundle (`gpudiag report`): one `.tar.gz` holding a README, the check report,
//! a recording, its Chrome trace and the environment, redacted by default.
//!
//! Everything in the bundle derives from one redacted recording: the capture (or the replayed
//! file) is redacted first ([`prepare`]), and the check report and trace the caller computes
//! from that are redacted the same way when the bundle is written ([`Prepared::write`]), so the
//! same secret has the same placeholder in every file. The archive is written to a temporary
//! file and renamed, so a bundle on disk is always whole. `ReplayBackend::open` reads a bundle
//! (or a plain recording: the content decides) as a replay.

mod credentials;
pub mod host;
pub mod redact;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::Value;

use crate::atomic::write_atomic;
use crate::chrome_trace::Trace;
use gpudiag_core::check::CheckReport;
use gpudiag_model::error::Error;
use gpudiag_telemetry::recording::{Header, Record};
use redact::Redactor;

/// The files of a bundle, in the order they are written.
pub const README: &str = "README.txt";
pub const CHECK_REPORT: &str = "check-report.json";
use gpudiag_telemetry::bundle_reader::RECORDING;
pub const TRACE: &str = "trace.json";
pub const ENVIRONMENT: &str = "environment.json";

/// The default bundle name: `gpudiag-report-2026-11-22T01-02-03Z.tar.gz`.
pub fn default_name() -> PathBuf {
    let t = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    PathBuf::from(format!("gpudiag-report-{}.tar.gz", t.replace(':', "-")))
}

/// What a bundle is made from: a recording held in memory (a fresh capture, a replayed file, or
/// the TUI's session) and where it came from.
#[derive(Debug, Clone)]
pub struct Captured {
    pub header: Header,
    /// Every record, in recording order (events before the samples of their tick).
    pub records: Vec<Record>,
    /// The backend that produced the telemetry ("nvml", "replay").
    pub backend: String,
    /// The recording replayed, if any (redactable).
    pub recording: Option<String>,
    /// The telemetry comes from this host's GPUs now (so PCI topology and libraries apply).
    pub live: bool,
    pub devices: Vec<gpudiag_model::sample::DeviceInfo>,
}

/// How a bundle is written.
#[derive(Debug, Clone)]
pub struct BundleOptions {
    /// Replace host names, user names, command-line arguments and home paths.
    pub redact: bool,
    /// Where this host's facts are read from: the real system but in tests.
    pub roots: host::Roots,
}

fn to_value(v: &impl serde::Serialize) -> Result<Value, Error> {
    serde_json::to_value(v).map_err(|e| Error::CannotRun(format!("cannot serialise: {e}")))
}

fn pretty(v: &Value) -> Result<Vec<u8>, Error> {
    let out = serde_json::to_string_pretty(v)
        .map(gpudiag_model::printable::json_c1)
        .map_err(|e| Error::CannotRun(format!("cannot serialise: {e}")))?;
    Ok(format!("{out}\n").into_bytes())
}

/// The recording as gzip-compressed NDJSON lines.
fn gzip_lines(lines: &[Value]) -> Result<Vec<u8>, Error> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    for l in lines {
        serde_json::to_writer(&mut enc, l)
            .map_err(|e| Error::CannotRun(format!("cannot serialise: {e}")))?;
        enc.write_all(b"\n")
            .map_err(|e| Error::io("compressing the recording", e))?;
    }
    enc.finish()
        .map_err(|e| Error::io("compressing the recording", e))
}

/// A bundle half written: the recording redacted and this host's facts gathered. The caller
/// judges [`Prepared::recording_gz`] (the check report, the trace) and hands the results to
/// [`Prepared::write`]; judging what was redacted keeps every file's placeholders the same.
pub struct Prepared<'a> {
    cap: &'a Captured,
    redactor: Redactor,
    environment: host::Environment,
    env_value: Value,
    recording_gz: Vec<u8>,
    recording_name: Option<String>,
}

/// Redacts `cap` (unless `opts.redact` is off) and gathers this host's facts.
pub fn prepare<'a>(cap: &'a Captured, opts: &BundleOptions) -> Result<Prepared<'a>, Error> {
    let mut redactor = Redactor::new(opts.redact);
    // Host and user names this process knows, besides those the data mentions; the recorded
    // host first, so it is `host-1` whichever machine writes the bundle.
    if let Some(h) = &cap.header.host.hostname {
        redactor.learn_host(h);
    }
    let mut lines = vec![to_value(&cap.header)?];
    for r in &cap.records {
        lines.push(to_value(r)?);
    }
    // The recording's secrets first, so its placeholders do not depend on who writes the bundle.
    for v in &lines {
        redactor.learn_value(v);
    }
    if let Ok(h) = gethostname::gethostname().into_string() {
        redactor.learn_host(&h);
    }
    for var in ["USER", "LOGNAME", "SUDO_USER"] {
        if let Ok(u) = std::env::var(var) {
            redactor.learn_user(&u);
        }
    }
    if let Ok(home) = std::env::var("HOME") {
        redactor.learn_text(&home);
    }
    let environment = host::collect(&opts.roots, &cap.header.host, &cap.devices, cap.live);
    let mut env_value = to_value(&environment)?;
    if let Some(h) = &environment.hostname {
        redactor.learn_host(h);
    }
    let mut recording_name = cap
        .recording
        .clone()
        .map(Value::from)
        .unwrap_or(Value::Null);
    for v in [&env_value, &recording_name] {
        redactor.learn_value(v);
    }
    for v in lines
        .iter_mut()
        .chain([&mut env_value, &mut recording_name])
    {
        redactor.redact_value(v);
    }
    let recording_gz = gzip_lines(&lines)?;
    let recording_name = recording_name.as_str().map(str::to_string);
    Ok(Prepared {
        cap,
        redactor,
        environment,
        env_value,
        recording_gz,
        recording_name,
    })
}

impl Prepared<'_> {
    /// The redacted recording as the bundle holds it (gzip NDJSON), to judge.
    pub fn recording_gz(&self) -> &[u8] {
        &self.recording_gz
    }

    /// The name of the recording replayed, redacted; `None` for a live capture.
    pub fn recording_name(&self) -> Option<&str> {
        self.recording_name.as_deref()
    }

    /// Writes the bundle to `out` (atomically; an existing file is replaced, so callers that
    /// must not overwrite check first) with `check` and `trace` judged from
    /// [`Prepared::recording_gz`].
    pub fn write(self, out: &Path, mut check: CheckReport, mut trace: Trace) -> Result<(), Error> {
        let Prepared {
            cap,
            redactor,
            environment,
            env_value,
            recording_gz,
            recording_name,
        } = self;
        // Judged from a replay of a temporary file, the report would name that file and the
        // replay backend, and leave out the libraries, which are this host's when the capture
        // was live; the bundle says what the telemetry came from.
        check.source.backend = cap.backend.clone();
        check.source.recording = recording_name.clone();
        if cap.live {
            check.libraries = Some(environment.libraries.clone());
        }
        let mut check_value = to_value(&check)?;
        redactor.redact_value(&mut check_value);

        trace.other_data.backend = cap.backend.clone();
        let mut trace_value = to_value(&trace)?;
        redactor.redact_value(&mut trace_value);
        let trace_bytes = serde_json::to_vec(&trace_value)
            .map_err(|e| Error::CannotRun(format!("cannot serialise: {e}")))?;

        let readme = redactor.text(&readme_text(
            cap,
            recording_name.as_deref(),
            &redactor,
            &check,
        ));
        let files: [(&str, Vec<u8>); 5] = [
            (README, readme.into_bytes()),
            (CHECK_REPORT, pretty(&check_value)?),
            (RECORDING, recording_gz),
            (TRACE, trace_bytes),
            (ENVIRONMENT, pretty(&env_value)?),
        ];
        let mtime = gpudiag_model::sample::now_ms() / 1000;
        write_atomic(out, |w| {
            let gz = GzEncoder::new(w, Compression::default());
            let mut tar = tar::Builder::new(gz);
            for (name, bytes) in &files {
                let mut h = tar::Header::new_gnu();
                h.set_size(bytes.len() as u64);
                h.set_mode(0o644);
                h.set_mtime(mtime);
                h.set_entry_type(tar::EntryType::Regular);
                tar.append_data(&mut h, name, bytes.as_slice())?;
            }
            tar.into_inner()?.finish()?;
            Ok(())
        })
    }
}

fn readme_text(
    cap: &Captured,
    recording: Option<&str>,
    redactor: &Redactor,
    check: &CheckReport,
) -> String {
    let source = match recording {
        Some(r) => format!("a replay of the recording {r}"),
        None => format!(
            "{} of live sampling ({} backend)",
            humantime::format_duration(Duration::from_millis(
                check.window.covered_s.max(0.0) as u64 * 1000
            )),
            cap.backend
        ),
    };
    let redaction = if redactor.enabled() {
        let what: Vec<String> = redactor
            .summary()
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        format!(
            "Redacted: host names, user names, command-line arguments, home paths and \
             credentials (passwords, tokens, keys, the user:password of URLs, long random \
             strings) were replaced by placeholders (host-1, user-1, [args-1], [secret-1]), the \
             same value by the same placeholder in every file ({}). Environment variables are \
             kept only where gpudiag knows their meaning (GPU selection, CUDA, NCCL, ROCm, \
             loader and Slurm settings). `gpudiag report --no-redact` keeps the rest as it was.",
            if what.is_empty() {
                "nothing was found to replace".to_string()
            } else {
                what.join(", ")
            }
        )
    } else {
        "Not redacted (--no-redact): host names, user names, command lines, home paths and \
         anything that looks like a credential are as they were. Environment variables are \
         kept only where gpudiag knows their meaning."
            .to_string()
    };
    format!(
        "gpudiag bug-report bundle\n\
         =========================\n\n\
         Written by gpudiag {version} from {source}.\n\
         Devices: {devices}. Status: {status}, {findings} finding(s).\n\n\
         Files:\n\
         - {README}: this file.\n\
         - {CHECK_REPORT}: the check report (`gpudiag check --json`; schema \
           assets/schema/check-report.schema.json).\n\
         - {RECORDING}: the telemetry as a gpudiag recording (gzip NDJSON; schema \
           assets/schema/recording.schema.json).\n\
         - {TRACE}: a Chrome trace of the recording; open it in https://ui.perfetto.dev or \
           chrome://tracing.\n\
         - {ENVIRONMENT}: OS, kernel, CPU, driver and CUDA libraries, the environment \
           variables that steer the GPU stack, container detection, PCI topology and NUMA \
           nodes, kernel log lines about NVRM/Xid.\n\n\
         To look at it on any machine, GPU or not:\n\
         \x20 gpudiag replay THIS_FILE.tar.gz\n\
         \x20 gpudiag check --replay THIS_FILE.tar.gz\n\n\
         {redaction}\n",
        version = gpudiag_model::build_info::LONG_VERSION,
        devices = cap.devices.len(),
        status = check.status,
        findings = check
            .devices
            .iter()
            .map(|d| d.findings.len())
            .sum::<usize>()
            + check.host_findings.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chrome_trace::TraceBuilder;
    use gpudiag_model::finding::Severity;
    use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample};
    use gpudiag_telemetry::kernel_log::KernelLogSource;
    use std::io::Read;

    /// Written from a check report and trace the caller judged, with no command run: every
    /// file in its place, the report naming the captured backend, the host name replaced.
    #[test]
    fn a_bundle_is_written_from_what_the_caller_judged() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostInfo {
            hostname: Some("gpu-node-17".into()),
            ..HostInfo::default()
        };
        let devices = vec![DeviceInfo::default()];
        let cap = Captured {
            header: Header::new("nvml", host.clone(), devices.clone(), Some(100)),
            records: vec![Record::Sample(Sample::new(0, 1000))],
            backend: "nvml".into(),
            recording: None,
            live: false,
            devices: devices.clone(),
        };
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let opts = BundleOptions {
            redact: true,
            roots: host::Roots {
                sys: empty.clone(),
                etc: empty.clone(),
                proc_: empty.clone(),
                root: empty,
                kernel_log: KernelLogSource::Off,
            },
        };
        let prepared = prepare(&cap, &opts).unwrap();
        assert!(!prepared.recording_gz().is_empty());
        assert_eq!(prepared.recording_name(), None);
        let check = CheckReport::could_not_run("judged elsewhere".into(), "replay", Severity::Fail);
        let trace = TraceBuilder::new("replay", None, &host, devices).finish();
        let out = dir.path().join("bundle.tar.gz");
        prepared.write(&out, check, trace).unwrap();

        let file = std::fs::File::open(&out).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
        let mut members = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            if name == RECORDING {
                let mut plain = Vec::new();
                flate2::read::GzDecoder::new(bytes.as_slice())
                    .read_to_end(&mut plain)
                    .unwrap();
                bytes = plain;
            }
            members.push((name, String::from_utf8(bytes).unwrap()));
        }
        let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [README, CHECK_REPORT, RECORDING, TRACE, ENVIRONMENT]);
        let check: Value = serde_json::from_str(&members[1].1).unwrap();
        assert_eq!(check["source"]["backend"], "nvml");
        let trace: Value = serde_json::from_str(&members[3].1).unwrap();
        assert_eq!(trace["otherData"]["backend"], "nvml");
        for (name, text) in &members {
            assert!(!text.contains("gpu-node-17"), "the host name in {name}");
        }
    }
}
