//! The JSON Schemas in `assets/schema/` against real output, and mutations that must fail.
//!
//! The schemas are generated from the Rust types (`src/schema.rs`). After changing a type that
//! a schema covers, regenerate the files and review their diff:
//!
//!     GPUDIAG_BLESS=1 cargo nextest run --test e2e schema::

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use gpudiag_core::check::CheckReport;
use gpudiag_model::finding::Severity;
use gpudiag_model::finding::Status;
use gpudiag_model::sample::{Absent, DeviceInfo, Metric, Sample};
use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use serde_json::{Value, json};

use crate::support::{fixture, gpudiag, root};

const T0: u64 = 1_767_225_600_000;
const REPORT_SCHEMA: &str = "check-report.schema.json";
const RECORDING_SCHEMA: &str = "recording.schema.json";
const TRACE_SCHEMA: &str = "chrome-trace.schema.json";
/// `$defs` both schema files must carry (and, being generated from the same types, identically).
const SHARED_DEFS: [&str; 7] = [
    "Absent",
    "Severity",
    "HostInfo",
    "DeviceInfo",
    "ProcessSample",
    "Evidence",
    "Topology",
];

/// Every recording fixture, sorted, so a new fixture is covered without touching this file:
/// the general ones and the jobs' (measured and crafted).
fn fixture_recordings() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["tests/fixtures/recordings", "tests/fixtures/jobs"]
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(root().join(dir)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ndjson" || e == "gz"))
        .collect();
    out.sort();
    assert!(out.len() >= 6, "fixtures missing: {out:?}");
    out
}

fn load_schema(name: &str) -> Value {
    let path = root().join("assets/schema").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn validator(name: &str) -> Validator {
    jsonschema::draft202012::new(&load_schema(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every error as "pointer: message", including the ones nested in anyOf/oneOf branches, so a
/// test can check where a mutation was caught.
fn describe(e: &ValidationError<'_>, out: &mut Vec<String>) {
    out.push(format!("{}: {e}", e.instance_path()));
    match e.kind() {
        ValidationErrorKind::AnyOf { context }
        | ValidationErrorKind::OneOfNotValid { context }
        | ValidationErrorKind::OneOfMultipleValid { context } => {
            for branch in context {
                for inner in branch {
                    describe(inner, out);
                }
            }
        }
        _ => {}
    }
}

fn errors(v: &Validator, instance: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for e in v.iter_errors(instance) {
        describe(&e, &mut out);
    }
    out
}

fn assert_valid(v: &Validator, instance: &Value, what: &str) {
    let errs = errors(v, instance);
    assert!(
        errs.is_empty(),
        "{what} does not match its schema:\n{}",
        errs.join("\n")
    );
}

/// Asserts that `instance` fails and that one of the errors is at `pointer` and mentions `needle`.
fn assert_rejected(v: &Validator, instance: &Value, pointer: &str, needle: &str) {
    let errs = errors(v, instance);
    assert!(
        errs.iter()
            .any(|e| e.starts_with(&format!("{pointer}: ")) && e.contains(needle)),
        "expected an error at '{pointer}' mentioning {needle:?}, got:\n{}",
        errs.join("\n")
    );
}

/// Runs `gpudiag check --json` with `args`; returns the parsed report and the exit code.
fn check_json(args: &[&str]) -> (Value, i32) {
    let out = gpudiag()
        .args(["check", "--json"])
        .args(args)
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert!(
        code == 0 || code == 1,
        "check {args:?} exited {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check {args:?} printed no JSON ({e})"));
    (report, code)
}

fn replay_report(name: &str, extra: &[&str]) -> Value {
    let path = fixture(name);
    let mut args = vec!["--replay", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    check_json(&args).0
}

/// The lines of a recording, decompressed when it is gzip.
fn recording_lines(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let text = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut s)
            .unwrap();
        s
    } else {
        String::from_utf8(bytes).unwrap()
    };
    text.lines().map(str::to_owned).collect()
}

/// Whether a line is of a kind format version 1 defines (the schema covers only those).
fn covered_kind(line: &Value) -> bool {
    match line["kind"].as_str() {
        Some("header" | "sample" | "finding" | "kernels" | "nccl_ras") => true,
        Some("event") => matches!(
            line["event"].as_str(),
            Some("xid" | "device_lost" | "notice")
        ),
        _ => false,
    }
}

/// Validates every line; returns how many lines each kind had, and the uncovered kinds seen.
fn validate_recording(v: &Validator, path: &Path) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut kinds = BTreeMap::new();
    let mut uncovered = Vec::new();
    for (i, text) in recording_lines(path).iter().enumerate() {
        let line: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), i + 1));
        let kind = line["kind"].as_str().unwrap_or("(none)").to_owned();
        if i == 0 {
            assert_eq!(kind, "header", "{} line 1", path.display());
        }
        if covered_kind(&line) {
            assert_valid(v, &line, &format!("{} line {}", path.display(), i + 1));
        } else {
            // Readers skip these; the schema documents the kinds of version 1 only.
            assert!(
                !errors(v, &line).is_empty(),
                "{} line {}: an unknown kind must not pass the version-1 schema",
                path.display(),
                i + 1
            );
            uncovered.push(kind.clone());
        }
        *kinds.entry(kind).or_insert(0) += 1;
    }
    (kinds, uncovered)
}

// ---------------------------------------------------------------------------------------------
// The schemas themselves

/// The committed files are what the types generate. With `GPUDIAG_BLESS=1` this test rewrites
/// them instead (tests running at the same time may still read the old files: run again).
#[test]
fn committed_schemas_are_generated_from_the_types() {
    let bless = std::env::var_os("GPUDIAG_BLESS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (name, generated) in gpudiag::schema::all() {
        let path = root().join("assets/schema").join(name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed == generated {
            continue;
        }
        if bless {
            std::fs::write(&path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            continue;
        }
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        stale.push(format!("{name} (first difference at line {})", line + 1));
    }
    assert!(
        stale.is_empty(),
        "the committed schemas differ from what the types generate: {}.\n\
         Regenerate them with `GPUDIAG_BLESS=1 cargo nextest run --test e2e schema::` and review the diff.",
        stale.join(", ")
    );
}

#[test]
fn schemas_are_valid_draft_2020_12_documents() {
    for name in [REPORT_SCHEMA, RECORDING_SCHEMA] {
        let schema = load_schema(name);
        if let Err(e) = jsonschema::meta::validate(&schema) {
            panic!("{name} is not a valid JSON Schema: {e}");
        }
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{name}"
        );
        assert!(
            schema["$id"].as_str().is_some_and(|id| !id.is_empty()),
            "{name}"
        );
        assert!(
            schema["description"].as_str().is_some_and(|d| d.len() > 80),
            "{name}"
        );
    }
    let rec = load_schema(RECORDING_SCHEMA);
    let description = rec["description"].as_str().unwrap();
    assert!(description.contains("version 1"), "{description}");
    assert!(description.contains("not covered"), "{description}");
}

#[test]
fn shared_defs_are_identical_in_both_schemas() {
    let report = load_schema(REPORT_SCHEMA);
    let recording = load_schema(RECORDING_SCHEMA);
    let a = report["$defs"].as_object().unwrap();
    let b = recording["$defs"].as_object().unwrap();
    for name in SHARED_DEFS {
        assert!(a.contains_key(name), "{REPORT_SCHEMA} lacks $defs/{name}");
        assert!(
            b.contains_key(name),
            "{RECORDING_SCHEMA} lacks $defs/{name}"
        );
    }
    for (name, def) in a {
        if let Some(other) = b.get(name) {
            assert_eq!(
                def, other,
                "$defs/{name} differs between {REPORT_SCHEMA} and {RECORDING_SCHEMA}"
            );
        }
    }
    // A sample or finding line is the report's Sample or Finding with `kind` beside its fields.
    for (kind, def) in [("sample", "Sample"), ("finding", "Finding")] {
        let mut line = recording["$defs"]["Record"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["properties"]["kind"]["const"] == kind)
            .unwrap_or_else(|| panic!("no {kind} record"))
            .clone();
        let properties = line["properties"].as_object_mut().unwrap();
        assert_eq!(properties.remove("kind").unwrap()["type"], "string");
        let required = line["required"].as_array_mut().unwrap();
        assert_eq!(required.remove(0), "kind");
        assert_eq!(
            line, report["$defs"][def],
            "the {kind} line and $defs/{def}"
        );
    }
}

/// Every object schema is closed: `additionalProperties: false`, or `unevaluatedProperties: false`
/// where fields come from `oneOf` branches too (an event's fields beside `kind` and `event`); the
/// branches of such an object are closed by it. Free-form maps say `additionalProperties` with
/// the schema of their values.
#[test]
fn every_object_in_the_schemas_is_closed() {
    fn walk(path: &str, v: &Value, closed_by_parent: bool, open: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                let is_object = m.get("type") == Some(&json!("object"))
                    || m.get("type")
                        .and_then(Value::as_array)
                        .is_some_and(|t| t.contains(&json!("object")));
                let unevaluated = m.get("unevaluatedProperties") == Some(&json!(false));
                let closed = m
                    .get("additionalProperties")
                    .is_some_and(|a| a != &json!(true))
                    || unevaluated;
                let free_form =
                    m.contains_key("additionalProperties") || path.ends_with("/properties/values");
                if is_object && !closed && !free_form && !closed_by_parent {
                    open.push(path.to_owned());
                }
                let branches = ["oneOf", "anyOf", "allOf"];
                if m.get("additionalProperties") == Some(&json!(false))
                    && branches.iter().any(|k| m.contains_key(*k))
                {
                    // additionalProperties does not see the branches' fields.
                    open.push(format!("{path} (additionalProperties beside {branches:?})"));
                }
                for (k, child) in m {
                    let through = unevaluated && branches.contains(&k.as_str());
                    walk(&format!("{path}/{k}"), child, through, open);
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    walk(&format!("{path}/{i}"), child, closed_by_parent, open);
                }
            }
            _ => {}
        }
    }
    for name in [REPORT_SCHEMA, RECORDING_SCHEMA, TRACE_SCHEMA] {
        let schema = load_schema(name);
        let mut open = Vec::new();
        walk("#", &schema, false, &mut open);
        // The recording's top level only dispatches on `kind`; each branch is closed.
        open.retain(|p| p != "#" || name != RECORDING_SCHEMA);
        assert!(open.is_empty(), "{name}: open object schemas at {open:?}");
    }
}

/// The strings a schema allows: its `enum`, or the `const`s and `enum`s of its `oneOf` branches
/// (an enum whose variants have doc comments), following a `$ref`.
fn allowed_strings(schema: &Value, s: &Value) -> BTreeSet<String> {
    if let Some(r) = s["$ref"].as_str() {
        return allowed_strings(schema, schema.pointer(&r[1..]).unwrap());
    }
    let mut out = BTreeSet::new();
    let mut add = |v: &Value| {
        if let Some(x) = v["const"].as_str() {
            out.insert(x.to_owned());
        }
        for x in v["enum"].as_array().into_iter().flatten() {
            out.insert(x.as_str().unwrap().to_owned());
        }
    };
    add(s);
    for branch in s["oneOf"].as_array().into_iter().flatten() {
        add(branch);
    }
    out
}

/// The enums and field lists in the schema follow the Rust types, so a field added to a struct
/// fails here with a clear message rather than only as an unexpected property somewhere.
#[test]
fn schema_names_follow_the_rust_types() {
    let schema = load_schema(REPORT_SCHEMA);
    let defs = &schema["$defs"];
    let enum_of = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect()
    };
    let strings = |values: Vec<Value>| -> BTreeSet<String> {
        values
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let keys = |v: &Value| -> BTreeSet<String> { v.as_object().unwrap().keys().cloned().collect() };

    // The summary is keyed by metric name, each the name of a Sample field, and nothing else.
    let metrics: BTreeSet<String> = Metric::ALL.iter().map(|m| m.name().to_owned()).collect();
    let summary = &defs["DeviceReport"]["properties"]["summary"];
    assert_eq!(keys(&summary["properties"]), metrics);
    assert_eq!(summary["additionalProperties"], false);
    for m in Metric::ALL {
        assert_eq!(serde_json::to_value(m).unwrap(), json!(m.name()));
    }

    let severities: Vec<Value> = [Severity::Info, Severity::Warn, Severity::Fail]
        .iter()
        .map(|s| serde_json::to_value(s).unwrap())
        .collect();
    assert_eq!(defs["Severity"]["enum"], Value::Array(severities));
    let statuses: Vec<Value> = [
        Status::Healthy,
        Status::Warn,
        Status::Fail,
        Status::NotJudged,
        Status::CouldNotRun,
    ]
    .iter()
    .map(|s| serde_json::to_value(s).unwrap())
    .collect();
    assert_eq!(
        allowed_strings(&schema, &schema["properties"]["status"]),
        strings(statuses)
    );

    let absent_units: Vec<Value> = [
        Absent::NotSupported,
        Absent::NoPermission,
        Absent::GpuLost,
        Absent::NotYetRead,
        Absent::NeedsTwoSamples,
        Absent::Unavailable,
    ]
    .iter()
    .map(|a| serde_json::to_value(a).unwrap())
    .collect();
    assert_eq!(
        allowed_strings(&schema, &defs["Absent"]),
        strings(absent_units)
    );
    assert_eq!(
        serde_json::to_value(Absent::Error("x".into())).unwrap(),
        json!({"error": "x"})
    );

    // Field lists, as sets (JSON objects are unordered): the serialised keys of a default value,
    // where `absent` is skipped because it is empty.
    let names = |v: &Value| -> BTreeSet<String> { enum_of(v).into_iter().collect() };
    let with_absent = |mut k: BTreeSet<String>| {
        k.insert("absent".to_owned());
        k
    };
    let sample_keys = keys(&serde_json::to_value(Sample::new(0, 0)).unwrap());
    let sample_def = &defs["Sample"]["properties"];
    assert_eq!(keys(sample_def), with_absent(sample_keys.clone()));
    let mut absent_keys = sample_keys.clone();
    absent_keys.remove("time_ms");
    absent_keys.remove("device");
    assert_eq!(
        names(&sample_def["absent"]["propertyNames"]["enum"]),
        absent_keys
    );
    for m in Metric::ALL {
        assert!(
            absent_keys.contains(m.name()),
            "{m:?} is not a Sample field"
        );
    }
    let info_keys = keys(&serde_json::to_value(DeviceInfo::default()).unwrap());
    let info_def = &defs["DeviceInfo"]["properties"];
    assert_eq!(keys(info_def), with_absent(info_keys.clone()));
    let mut absent_keys = info_keys;
    absent_keys.remove("index");
    assert_eq!(
        names(&info_def["absent"]["propertyNames"]["enum"]),
        absent_keys
    );
}

// ---------------------------------------------------------------------------------------------
// Real check reports

#[test]
fn check_report_of_every_fixture_validates() {
    let v = validator(REPORT_SCHEMA);
    for path in fixture_recordings() {
        let p = path.to_str().unwrap();
        for extra in [
            &[][..],
            &["--window", "2s"],
            &["--device", "0", "--fail-on", "info"],
        ] {
            let mut args = vec!["--replay", p];
            args.extend_from_slice(extra);
            let (report, code) = check_json(&args);
            assert_valid(&v, &report, &format!("check {args:?}"));
            assert_eq!(report["exit_code"], code, "{args:?}");
            assert_eq!(report["source"]["recording"], p);
            assert!(
                report["devices"].as_array().is_some_and(|d| !d.is_empty()),
                "{args:?}"
            );
        }
    }
}

#[test]
fn check_report_of_the_demo_validates() {
    let v = validator(REPORT_SCHEMA);
    let (report, code) = check_json(&["--demo"]);
    assert_valid(&v, &report, "check --demo");
    assert_eq!(code, 0);
    assert_eq!(report["source"]["backend"], "replay");
    assert_eq!(report["source"]["recording"], "demo.ndjson.gz (bundled)");
    assert_eq!(report["libraries"], Value::Null);
}

#[test]
fn report_deserialises_into_the_typed_report_and_back() {
    let value = replay_report("two_gpus.ndjson", &[]);
    let report: CheckReport = serde_json::from_value(value.clone()).unwrap();
    // The schema, the JSON and the types describe the same document: nothing is lost either way.
    assert_eq!(serde_json::to_value(&report).unwrap(), value);

    // The schema is closed, but gpudiag's readers are not: a newer writer's extra fields, at any
    // level, are ignored.
    let newer = mutated(&value, |r| {
        set(r, "", "extra", json!(1));
        set(r, "/devices/0/info", "extra", json!(1));
        set(r, "/devices/0/latest", "extra", json!(1));
        set(r, "/devices/0/findings/0", "extra", json!(1));
    });
    assert!(!errors(&validator(REPORT_SCHEMA), &newer).is_empty());
    let read: CheckReport = serde_json::from_value(newer).unwrap();
    assert_eq!(read, report);

    assert_eq!(report.schema_version, 3);
    assert_eq!(report.tool.name, "gpudiag");
    assert_eq!(report.tool.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        report.tool.commit.as_deref(),
        gpudiag_model::build_info::COMMIT
    );
    assert_eq!(report.tool.dirty, gpudiag_model::build_info::DIRTY);
    // `tool.commit` and `tool.dirty` came within schema version 2: a report of an earlier build,
    // without them, still validates and reads, as unknown.
    let earlier = mutated(&value, |r| {
        let tool = r["tool"].as_object_mut().unwrap();
        tool.remove("commit");
        tool.remove("dirty");
    });
    assert_eq!(
        errors(&validator(REPORT_SCHEMA), &earlier),
        Vec::<String>::new()
    );
    let read: CheckReport = serde_json::from_value(earlier).unwrap();
    assert_eq!((read.tool.commit, read.tool.dirty), (None, None));
    assert_eq!(report.host.hostname.as_deref(), Some("gpu-node-07"));
    assert_eq!(report.host.driver_version.as_deref(), Some("580.65.06"));
    assert_eq!(report.source.backend, "replay");
    assert!(report.source.warnings.is_empty());
    assert_eq!(report.libraries, None);
    assert_eq!(report.window.requested_s, None);
    assert_eq!(report.window.covered_s, 9.0);
    assert_eq!(report.window.ticks, 10);
    assert_eq!(report.window.start_ms, Some(T0));
    assert_eq!(report.window.end_ms, Some(T0 + 9000));
    assert_eq!(report.status, Status::Warn);
    assert_eq!(report.fail_on, Severity::Fail);
    assert_eq!(report.exit_code, 0);
    assert!(report.host_findings.is_empty());

    assert_eq!(report.devices.len(), 2);
    let d0 = &report.devices[0];
    assert_eq!(d0.info.index, 0);
    assert_eq!(d0.info.name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(
        d0.info.uuid.as_deref(),
        Some("GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11")
    );
    assert_eq!(d0.info.serial, None);
    assert_eq!(d0.info.absent.get("serial"), Some(&Absent::NoPermission));
    let util = &d0.summary[&Metric::GpuUtilPct];
    assert_eq!(util.count, 10);
    assert_eq!(util.max, Some(100.0));
    assert_eq!(util.min, Some(0.0));
    assert_eq!(util.last, Some(0.0));
    assert!((util.mean.unwrap() - 78.8).abs() < 1e-9, "{util:?}");
    assert!(!util.coarse);
    // Fans are absent on this SXM part: left out of the summary, null with a reason in the sample.
    assert!(!d0.summary.contains_key(&Metric::FanPct));
    let latest = d0.latest.as_ref().unwrap();
    assert_eq!(latest.time_ms, T0 + 9000);
    assert_eq!(latest.fan_pct, None);
    assert_eq!(latest.why_absent("fan_pct"), Some(&Absent::NotSupported));
    assert_eq!(latest.power_w, Some(112.3));
    assert_eq!(d0.findings.len(), 2);
    assert_eq!(d0.findings[1].id, "throttle.sw_power_cap");
    let f = &d0.findings[0];
    assert_eq!(f.id, "errors.xid_31");
    assert_eq!(f.severity, Severity::Warn);
    assert_eq!(f.device, Some(0));
    assert_eq!(f.time_ms, T0 + 7420);
    assert_eq!(f.evidence.values["xid"], json!(31));
    assert_eq!(f.evidence.threshold, "event");

    let d1 = &report.devices[1];
    assert_eq!(d1.info.index, 1);
    assert!(d1.findings.is_empty());
    assert_eq!(d1.summary[&Metric::GpuUtilPct].max, Some(0.0));
    assert_eq!(d1.summary[&Metric::SmClockMhz].mean, Some(345.0));
}

/// A live check carries the CUDA libraries found; this host has none, so they come back as not
/// found with a note. The report built from them must still match the schema.
/// A real two-H200 recording carries its topology; the report built from it carries it too,
/// and both match their schemas.
#[test]
fn topology_of_a_two_gpu_host_validates_in_recording_and_report() {
    let rec = validator(RECORDING_SCHEMA);
    let (kinds, problems) = validate_recording(
        &rec,
        &root().join("tests/fixtures/recordings/h200x2.ndjson"),
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(kinds.get("header"), Some(&1));
    let v = validator(REPORT_SCHEMA);
    let value = replay_report("h200x2.ndjson", &[]);
    assert_valid(&v, &value, "report with topology");
    let report: CheckReport = serde_json::from_value(value).unwrap();
    let t = report.topology.expect("topology from the recording");
    assert_eq!(t.pairs.len(), 1);
    assert_eq!(
        (t.pairs[0].label.as_str(), t.pairs[0].nvlinks),
        ("NV18", 18)
    );
    assert_eq!(t.gpus[0].nvlink_errors.replay, Some(0));
    // Recordings without one say nothing rather than an empty topology.
    let old: CheckReport = serde_json::from_value(replay_report("all_kinds.ndjson", &[])).unwrap();
    assert!(old.topology.is_none());
}

/// The standard suite's results from both GPUs of a two-H200 host, p2p per GPU and the NCCL
/// all-reduce for the host, placed in a report as `check --probes` does: schema-valid.
#[test]
fn report_with_multi_gpu_probe_results_validates() {
    let v = validator(REPORT_SCHEMA);
    let mut report: CheckReport =
        serde_json::from_value(replay_report("h200x2.ndjson", &[])).unwrap();
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/probes/h200x2_standard.json")).unwrap();
    let probed: gpudiag_probes::runner::ProbeReport = serde_json::from_str(&text).unwrap();
    for (d, p) in report.devices.iter_mut().zip(&probed.devices) {
        d.probes = Some(p.clone());
    }
    report.host_probes = Some(probed.host.clone());
    let value = serde_json::to_value(&report).unwrap();
    assert_valid(&v, &value, "report with p2p and nccl results");
    assert_eq!(value["devices"][1]["probes"]["results"][4]["probe"], "p2p");
    assert_eq!(value["host_probes"][0]["probe"], "nccl");
    // The schema lists exactly the probes gpudiag knows.
    let schema = load_schema(REPORT_SCHEMA);
    let names: Vec<&str> = schema["$defs"]["ProbeResult"]["properties"]["probe"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(names, gpudiag_probes::PROBE_NAMES);
}

#[test]
fn report_with_this_hosts_libraries_validates() {
    let v = validator(REPORT_SCHEMA);
    let value = replay_report("all_kinds.ndjson", &[]);
    let mut report: CheckReport = serde_json::from_value(value).unwrap();
    let libraries = gpudiag_model::cuda_libraries::detect_libraries();
    assert_eq!(libraries.len(), 5);
    report.libraries = Some(libraries);
    let value = serde_json::to_value(&report).unwrap();
    assert_valid(&v, &value, "report with libraries");
    assert_eq!(value["libraries"][0]["name"], "libcuda");
}

#[test]
fn host_findings_and_every_json_shape_of_a_sample_validate() {
    let v = validator(REPORT_SCHEMA);
    let value = replay_report("all_kinds.ndjson", &[]);
    assert_valid(&v, &value, "all_kinds report");
    let report: CheckReport = serde_json::from_value(value).unwrap();
    assert_eq!(report.host_findings.len(), 1);
    let host = &report.host_findings[0];
    assert_eq!(host.id, "errors.xid_157");
    assert_eq!(host.device, None);
    assert_eq!(host.severity, Severity::Info);
    let d0 = &report.devices[0];
    // Worst first: the device_lost event at the end, then the XID.
    assert_eq!(d0.findings[0].id, "device.lost");
    assert_eq!(d0.findings[1].id, "errors.xid_94");
    let latest = d0.latest.as_ref().unwrap();
    assert_eq!(latest.fan_pct, Some(44.0));
    let procs = latest.processes.as_ref().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(procs[0].kind.as_deref(), Some("graphics"));
    assert_eq!(procs[1].container_id.as_deref(), Some("3c5f0e8b9a7d"));
    assert_eq!(procs[1].used_memory_bytes, None);

    let value = replay_report("sparse.ndjson", &[]);
    assert_valid(&v, &value, "sparse report");
    let report: CheckReport = serde_json::from_value(value).unwrap();
    let latest = report.devices[0].latest.as_ref().unwrap();
    assert_eq!(
        latest.why_absent("pcie_rx_bytes_per_s"),
        Some(&Absent::Error("timed out".into()))
    );
    assert_eq!(report.host.hostname, None);
}

// ---------------------------------------------------------------------------------------------
// Recordings

#[test]
fn every_line_of_every_fixture_recording_validates() {
    let v = validator(RECORDING_SCHEMA);
    let mut seen = BTreeSet::new();
    for path in fixture_recordings() {
        let (kinds, uncovered) = validate_recording(&v, &path);
        seen.extend(kinds.keys().cloned());
        let name = path.file_name().unwrap().to_str().unwrap();
        if name == "newer_kinds.ndjson" {
            assert_eq!(uncovered, ["probe_result", "event"], "{name}");
        } else {
            assert!(uncovered.is_empty(), "{name}: {uncovered:?}");
        }
        assert!(kinds["sample"] >= 3, "{name}: {kinds:?}");
    }
    for kind in ["header", "sample", "event", "finding"] {
        assert!(seen.contains(kind), "no fixture has a {kind} line");
    }
}

/// The summaries `run --kernels --record` writes, a sampled one and one of a job of two ranks
/// among them, are what the schema says a `kernels` line is.
#[test]
fn kernels_lines_validate() {
    use gpudiag_core::kernels::KernelsAggregator;
    use gpudiag_core::kernels::synthetic::{sampled_stream, training_stream, two_ranks};
    use gpudiag_model::kernels::{RecordedKernels, SampleSchedule};
    let v = validator(RECORDING_SCHEMA);
    for (i, stream) in [
        training_stream(4242, "GPU-1111"),
        sampled_stream(7),
        two_ranks(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut a = KernelsAggregator::default();
        if i == 1 {
            a.sampled(SampleSchedule::DEFAULT);
        }
        for m in &stream {
            a.push(m);
        }
        let line = serde_json::to_value(gpudiag_telemetry::recording::Record::Kernels(
            RecordedKernels {
                time_ms: 1_767_225_601_000,
                ended: i == 2,
                summary: a.summary(),
            },
        ))
        .unwrap();
        assert!(covered_kind(&line));
        assert_valid(&v, &line, &format!("kernels line {i}"));
    }
}

/// NCCL RAS answers as a recording carries them (`nccl_ras`), parsed from every captured and
/// synthetic report in tests/fixtures/ras/, are what the schema says.
#[test]
fn nccl_ras_lines_validate() {
    let v = validator(RECORDING_SCHEMA);
    let dir = root().join("tests/fixtures/ras");
    let mut files: Vec<PathBuf> = ["", "h100x2", "h100x4"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(dir.join(sub)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt") && !p.ends_with("README.txt"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for path in files {
        let capture = std::fs::read(&path).unwrap();
        // The captures start with the protocol's exchange; the report follows.
        let text = String::from_utf8_lossy(&capture);
        let report: String = text
            .lines()
            .skip_while(|l| {
                l.starts_with("SERVER PROTOCOL") || l.trim() == "OK" || l.starts_with("ERROR")
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let answer = if name.contains("-json") {
            gpudiag_telemetry::ras::parse_json(report.as_bytes())
        } else {
            gpudiag_telemetry::ras::parse_text(report.as_bytes())
        };
        let line = serde_json::to_value(gpudiag_telemetry::recording::Record::Ras(answer)).unwrap();
        assert!(covered_kind(&line));
        assert_valid(&v, &line, &name);
    }
}

#[test]
fn the_bundled_demo_recording_validates() {
    let v = validator(RECORDING_SCHEMA);
    let (kinds, uncovered) = validate_recording(&v, &root().join("assets/demo/demo.ndjson.gz"));
    assert!(uncovered.is_empty());
    assert_eq!(kinds["header"], 1);
    assert!(kinds["sample"] >= 10, "{kinds:?}");
}

#[test]
fn recording_written_by_record_validates() {
    let v = validator(RECORDING_SCHEMA);
    let dir = tempfile::tempdir().unwrap();
    for (source, out_name, extra) in [
        ("two_gpus.ndjson", "r.ndjson.gz", &[][..]),
        ("two_gpus.ndjson", "one.ndjson", &["--device", "1"][..]),
        ("all_kinds.ndjson", "all.ndjson.gz", &[][..]),
    ] {
        let out = dir.path().join(out_name);
        let src = fixture(source);
        gpudiag()
            .args([
                "record",
                "--replay",
                src.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ])
            .args(extra)
            .assert()
            .code(0);
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(
            bytes.starts_with(&[0x1f, 0x8b]),
            out_name.ends_with(".gz"),
            "{out_name}"
        );
        let (kinds, uncovered) = validate_recording(&v, &out);
        assert!(uncovered.is_empty(), "{out_name}: {uncovered:?}");
        let lines = recording_lines(&out);
        let header: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(header["format"], "gpudiag-recording");
        assert_eq!(header["version"], 1);
        assert_eq!(
            header["tool_version"],
            gpudiag_model::build_info::LONG_VERSION
        );
        match out_name {
            "r.ndjson.gz" => {
                assert_eq!(header["devices"].as_array().unwrap().len(), 2);
                assert_eq!(header["host"]["hostname"], "gpu-node-07");
                assert_eq!(kinds["sample"], 20);
                assert_eq!(kinds["event"], 1);
            }
            "one.ndjson" => {
                assert_eq!(header["devices"].as_array().unwrap().len(), 1);
                assert_eq!(header["devices"][0]["index"], 1);
                assert_eq!(kinds["sample"], 10);
                // The XID belonged to device 0.
                assert!(!kinds.contains_key("event"), "{kinds:?}");
                for l in &lines[1..] {
                    let rec: Value = serde_json::from_str(l).unwrap();
                    assert_eq!(rec["device"], 1, "{l}");
                }
            }
            _ => {
                assert_eq!(kinds["sample"], 3);
                // notice, xid 94, xid 157 and device_lost.
                assert_eq!(kinds["event"], 4);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drift: mutations of real output must fail, which proves the schemas are strict.

fn mutated(base: &Value, f: impl FnOnce(&mut Value)) -> Value {
    let mut v = base.clone();
    f(&mut v);
    v
}

fn remove(v: &mut Value, pointer: &str, key: &str) {
    let removed = v
        .pointer_mut(pointer)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key);
    assert!(removed.is_some(), "{pointer}/{key} was not there to remove");
}

fn set(v: &mut Value, pointer: &str, key: &str, value: Value) {
    v.pointer_mut(pointer)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert(key.to_owned(), value);
}

#[test]
fn report_drift_is_caught() {
    let v = validator(REPORT_SCHEMA);
    let base = replay_report("two_gpus.ndjson", &[]);
    assert_valid(&v, &base, "unmodified report");
    let latest = "/devices/0/latest";
    let latest_absent = format!("{latest}/absent");

    // Unknown properties, at every level.
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            mutated(&base, |r| set(r, "", "extra", json!(1))),
            "",
            "extra",
        ),
        (
            mutated(&base, |r| set(r, "/tool", "branch", json!("main"))),
            "/tool",
            "branch",
        ),
        (
            mutated(&base, |r| set(r, "/host", "kernel", json!("6.8"))),
            "/host",
            "kernel",
        ),
        (
            mutated(&base, |r| set(r, "/window", "ticks_total", json!(3))),
            "/window",
            "ticks_total",
        ),
        (
            mutated(&base, |r| set(r, "/devices/0", "benchmarks", json!([]))),
            "/devices/0",
            "benchmarks",
        ),
        (
            mutated(&base, |r| set(r, "/devices/0/info", "nvlink", json!(4))),
            "/devices/0/info",
            "nvlink",
        ),
        (
            mutated(&base, |r| set(r, latest, "gpu_utilization", json!(5.0))),
            latest,
            "gpu_utilization",
        ),
        (
            mutated(&base, |r| {
                set(r, "/devices/0/findings/0", "fix", json!("x"))
            }),
            "/devices/0/findings/0",
            "fix",
        ),
        (
            mutated(&base, |r| {
                set(r, "/devices/0/findings/0/evidence", "unit", json!("W"))
            }),
            "/devices/0/findings/0/evidence",
            "unit",
        ),
        (
            mutated(&base, |r| {
                set(r, "/devices/0/summary/power_w", "p99", json!(1.0))
            }),
            "/devices/0/summary/power_w",
            "p99",
        ),
        (
            mutated(&base, |r| {
                let stats = r["devices"][0]["summary"]["power_w"].clone();
                set(r, "/devices/0/summary", "gpu_power", stats);
            }),
            "/devices/0/summary",
            "gpu_power",
        ),
        (
            mutated(&base, |r| {
                set(r, &latest_absent, "colour", json!("not_supported"))
            }),
            &latest_absent,
            "colour",
        ),
    ];
    for (instance, pointer, needle) in &cases {
        assert_rejected(&v, instance, pointer, needle);
    }

    // Fields that are always serialised must be there, `null` when absent.
    assert_rejected(
        &v,
        &mutated(&base, |r| remove(r, "", "status")),
        "",
        "status",
    );
    assert_rejected(
        &v,
        &mutated(&base, |r| remove(r, "", "libraries")),
        "",
        "libraries",
    );
    assert_rejected(
        &v,
        &mutated(&base, |r| remove(r, "/window", "ticks")),
        "/window",
        "ticks",
    );
    assert_rejected(
        &v,
        &mutated(&base, |r| remove(r, latest, "fan_pct")),
        latest,
        "fan_pct",
    );
    assert_rejected(
        &v,
        &mutated(&base, |r| remove(r, "/devices/0/info", "uuid")),
        "/devices/0/info",
        "uuid",
    );
    assert_rejected(
        &v,
        &mutated(&base, |r| remove(r, "/devices/0/findings/0", "advice")),
        "/devices/0/findings/0",
        "advice",
    );
    assert_rejected(
        &v,
        &mutated(&base, |r| {
            remove(r, "/devices/0/summary/gpu_util_pct", "coarse")
        }),
        "/devices/0/summary/gpu_util_pct",
        "coarse",
    );

    // Wrong types and values.
    let wrong: Vec<(&str, &str, Value, &str)> = vec![
        ("", "schema_version", json!(1), "/schema_version"),
        ("", "exit_code", json!("0"), "/exit_code"),
        ("", "exit_code", json!(2), "/exit_code"),
        ("", "status", json!("ok"), "/status"),
        ("", "fail_on", json!("error"), "/fail_on"),
        ("", "libraries", json!({}), "/libraries"),
        ("/window", "covered_s", json!(null), "/window/covered_s"),
        (
            "/devices/0/info",
            "index",
            json!(-1),
            "/devices/0/info/index",
        ),
        (
            "/devices/0/info",
            "compute_capability",
            json!("9.0"),
            "/devices/0/info/compute_capability",
        ),
        (
            latest,
            "gpu_util_pct",
            json!("97"),
            "/devices/0/latest/gpu_util_pct",
        ),
        (
            latest,
            "gpu_util_pct",
            json!(101.0),
            "/devices/0/latest/gpu_util_pct",
        ),
        (
            latest,
            "mem_used_bytes",
            json!(-1),
            "/devices/0/latest/mem_used_bytes",
        ),
        (
            latest,
            "mem_used_bytes",
            json!(1.5),
            "/devices/0/latest/mem_used_bytes",
        ),
        (latest, "pstate", json!(16), "/devices/0/latest/pstate"),
        (
            latest,
            "remapped_rows_pending",
            json!(0),
            "/devices/0/latest/remapped_rows_pending",
        ),
        (
            latest,
            "throttle_reason_names",
            json!("gpu_idle"),
            "/devices/0/latest/throttle_reason_names",
        ),
        (
            latest,
            "processes",
            json!([{"pid": 1}]),
            "/devices/0/latest/processes/0",
        ),
        (
            "/devices/0/latest/absent",
            "fan_pct",
            json!("missing"),
            "/devices/0/latest/absent/fan_pct",
        ),
        (
            "/devices/0/latest/absent",
            "fan_pct",
            json!({"error": 5}),
            "/devices/0/latest/absent/fan_pct",
        ),
        (
            "/devices/0/latest/absent",
            "fan_pct",
            json!(null),
            "/devices/0/latest/absent/fan_pct",
        ),
        (
            "/devices/0/findings/0",
            "severity",
            json!("critical"),
            "/devices/0/findings/0/severity",
        ),
        (
            "/devices/0/findings/0",
            "id",
            json!("XID 31"),
            "/devices/0/findings/0/id",
        ),
        (
            "/devices/0/findings/0",
            "device",
            json!("0"),
            "/devices/0/findings/0/device",
        ),
        (
            "/devices/0/summary/gpu_util_pct",
            "count",
            json!(null),
            "/devices/0/summary/gpu_util_pct/count",
        ),
        (
            "/devices/0/summary/gpu_util_pct",
            "r2",
            json!(1.5),
            "/devices/0/summary/gpu_util_pct/r2",
        ),
    ];
    for (parent, key, value, at) in wrong {
        let instance = mutated(&base, |r| set(r, parent, key, value.clone()));
        let errs = errors(&v, &instance);
        assert!(
            errs.iter().any(|e| e.starts_with(&format!("{at}: "))),
            "{parent}/{key} = {value} must fail at {at}, got:\n{}",
            errs.join("\n")
        );
    }

    // An empty absent map is never written (serde skips it), so the schema refuses it too.
    let empty_absent = mutated(&base, |r| set(r, latest, "absent", json!({})));
    assert_rejected(&v, &empty_absent, &latest_absent, "");
}

#[test]
fn recording_line_drift_is_caught() {
    let v = validator(RECORDING_SCHEMA);
    let lines = recording_lines(&fixture("all_kinds.ndjson"));
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let find = |kind: &str, event: Option<&str>| -> Value {
        parsed
            .iter()
            .find(|l| l["kind"] == kind && event.is_none_or(|e| l["event"] == e))
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} {event:?} line"))
    };
    let header = find("header", None);
    // A sample that has a process list.
    let sample = parsed
        .iter()
        .find(|l| l["kind"] == "sample" && l["processes"].is_array())
        .cloned()
        .unwrap();
    let xid = find("event", Some("xid"));
    let lost = find("event", Some("device_lost"));
    let notice = find("event", Some("notice"));
    let finding = find("finding", None);
    for line in [&header, &sample, &xid, &lost, &notice, &finding] {
        assert_valid(&v, line, "unmodified line");
    }

    let bad: Vec<(&str, Value)> = vec![
        (
            "header with another format",
            mutated(&header, |h| set(h, "", "format", json!("other"))),
        ),
        (
            "header version 0",
            mutated(&header, |h| set(h, "", "version", json!(0))),
        ),
        (
            "header version as text",
            mutated(&header, |h| set(h, "", "version", json!("1"))),
        ),
        (
            "header without devices",
            mutated(&header, |h| remove(h, "", "devices")),
        ),
        (
            "header with an extra field",
            mutated(&header, |h| set(h, "", "gpus", json!(1))),
        ),
        (
            "header with an extra device field",
            mutated(&header, |h| set(h, "/devices/0", "bar1", json!(1))),
        ),
        (
            "sample with an extra field",
            mutated(&sample, |s| set(s, "", "sm_util", json!(1))),
        ),
        (
            "sample without device",
            mutated(&sample, |s| remove(s, "", "device")),
        ),
        (
            "sample without a nullable field",
            mutated(&sample, |s| remove(s, "", "pcie_gen")),
        ),
        (
            "sample with a bad process",
            mutated(&sample, |s| set(s, "/processes/0", "kind", json!("cuda"))),
        ),
        (
            "sample with kind finding",
            mutated(&sample, |s| set(s, "", "kind", json!("finding"))),
        ),
        (
            "xid with a reason",
            mutated(&xid, |e| set(e, "", "reason", json!("x"))),
        ),
        (
            "xid without its code",
            mutated(&xid, |e| remove(e, "", "xid")),
        ),
        (
            "xid with a text code",
            mutated(&xid, |e| set(e, "", "xid", json!("48"))),
        ),
        (
            "event without device",
            mutated(&xid, |e| remove(e, "", "device")),
        ),
        (
            "device_lost without reason",
            mutated(&lost, |e| remove(e, "", "reason")),
        ),
        (
            "notice with an xid",
            mutated(&notice, |e| set(e, "", "xid", json!(1))),
        ),
        (
            "finding with a bad severity",
            mutated(&finding, |f| set(f, "", "severity", json!("critical"))),
        ),
        (
            "finding with an extra field",
            mutated(&finding, |f| set(f, "", "rule", json!("x"))),
        ),
        (
            "finding without evidence",
            mutated(&finding, |f| remove(f, "", "evidence")),
        ),
        (
            "line without kind",
            mutated(&sample, |s| remove(s, "", "kind")),
        ),
        (
            "line of an unknown kind",
            json!({"kind": "probe_result", "probe": "bandwidth"}),
        ),
        ("not an object", json!([1, 2, 3])),
    ];
    for (what, line) in bad {
        assert!(
            !errors(&v, &line).is_empty(),
            "{what} must fail the recording schema"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The fleet report

#[test]
fn fleet_reports_validate_and_read_back_into_the_type() {
    let v = validator("fleet-report.schema.json");
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/fleet/three-nodes.json")).unwrap();
    let read: Value = serde_json::from_str(&text).unwrap();
    assert_valid(&v, &read, "tests/fixtures/fleet/three-nodes.json");
    let typed: gpudiag_fleet::model::Fleet = serde_json::from_value(read.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), read);

    // What `fleet --json` prints when Prometheus cannot be reached.
    let out = gpudiag()
        .args(["fleet", "--json", "--prometheus", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid(&v, &doc, "fleet --json against a closed port");
    assert_eq!(doc["status"], "could_not_run");

    let bad = mutated(&read, |r| {
        set(r, "/nodes/1/gpus/0", "util_pct", json!("high"));
    });
    assert_rejected(&v, &bad, "/nodes/1/gpus/0/util_pct", "");
}
