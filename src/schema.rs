//! The JSON Schemas of gpudiag's outputs, generated from the Rust types that write them with
//! schemars: the check report ([`CheckReport`]), one line of a recording ([`Header`] or
//! [`Record`]) and the Chrome trace ([`Trace`]). The files in `assets/schema/` are these
//! functions' output, committed so that users and other tools can read them; `tests/schema.rs`
//! fails when they differ, and `GPUDIAG_BLESS=1 cargo nextest run --test e2e schema::` rewrites them.
//!
//! What a type alone does not say comes from `#[schemars(...)]` attributes on the types (closed
//! objects, ranges, patterns, constants) and from the transforms here and in
//! `gpudiag_model::schema`. The schemas describe what gpudiag writes (serialisation), strictly:
//! gpudiag's own readers stay tolerant of fields they do not know.

use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use gpudiag_core::check::CheckReport;
use gpudiag_export::chrome_trace::Trace;
use gpudiag_telemetry::recording::{Header, Record};

/// The file of each schema in `assets/schema/`.
pub const CHECK_REPORT_FILE: &str = "check-report.schema.json";
pub const RECORDING_FILE: &str = "recording.schema.json";
pub const CHROME_TRACE_FILE: &str = "chrome-trace.schema.json";
pub const RUN_REPORT_FILE: &str = "run-report.schema.json";
pub const FLEET_REPORT_FILE: &str = "fleet-report.schema.json";

const FLEET_REPORT_ID: &str = "urn:gpudiag:schema:fleet-report:2";
const FLEET_REPORT_TITLE: &str = "gpudiag fleet report";
const FLEET_REPORT_DESCRIPTION: &str = "The JSON document `gpudiag fleet --json` prints: one \
    look at the nodes, GPUs, jobs and alerts a Prometheus holds (read from `gpudiag serve` and \
    dcgm-exporter series and the shipped rules), schema_version 2 (version 1's job judgement had \
    one `straggler` and a node's verdict `straggler_gpu` and `straggler_UUID`; version 2 lists \
    `stragglers` in both, each with its state or GPU, gives each of a job's GPUs its `role` \
    and each job its `doubts`). Absent values are null, never \
    0; a GPU seen only through dcgm-exporter has the verdict state `dcgm_exporter_only`. \
    Generated from gpudiag's types (src/schema.rs): change those, not this file.";

const RUN_REPORT_ID: &str = "urn:gpudiag:schema:run-report:3";
const RUN_REPORT_TITLE: &str = "gpudiag run report";
const RUN_REPORT_DESCRIPTION: &str = "The JSON document `gpudiag run --json -- CMD` prints on stderr (one line) and `gpudiag run --report-file FILE -- CMD` writes, when the command ends: its exit, the verdict on each GPU it used over the run and how the     verdict changed (phases), the findings, and its processes on the GPUs. and, with `--kernels`, what the kernels, copies and synchronisations recorded (`kernels`). schema_version 3 (version 3 adds `kernels` and the verdict basis `kernels`, a verdict judged from those records; version 1's job verdicts had one `straggler`; version 2 lists `stragglers`, each GPU's `role` and the grouping's `doubts`).     Generated from gpudiag's types (src/schema.rs): change those, not this file.";

const CHECK_REPORT_ID: &str = "urn:gpudiag:schema:check-report:3";
const CHECK_REPORT_TITLE: &str = "gpudiag check report";
const CHECK_REPORT_DESCRIPTION: &str = "The JSON document `gpudiag check --json` prints, \
    schema_version 3 (version 2's job verdicts had one `straggler`; version 3 lists `stragglers`, \
    each GPU's `role` and the grouping's `doubts`. Version 1 lacked the statuses `not_judged` and \
    `could_not_run`). See docs/versions.md. Adding a field keeps schema_version; removing or retyping one bumps it. \
    Absent values are null (with the reason in the `absent` map beside them), never 0. \
    Generated from gpudiag's types (src/schema.rs): change those, not this file.";

const RECORDING_ID: &str = "urn:gpudiag:schema:recording-line:1";
const RECORDING_TITLE: &str = "gpudiag recording line";
const RECORDING_DESCRIPTION: &str = "ONE LINE of a gpudiag recording (newline-delimited JSON, \
    plain or gzip). Line 1 is the header (format \"gpudiag-recording\", version, host, devices); \
    every further line is a sample, an event or a finding, discriminated by `kind`, with the \
    record's fields beside it. This schema covers the kinds of format version 1 exactly as \
    gpudiag writes them. Readers skip lines of kinds (and event sub-kinds) they do not know, so \
    such lines are valid for readers but not covered here; readers also accept a missing optional \
    field as null. Generated from gpudiag's types (src/schema.rs): change those, not this file.";

const CHROME_TRACE_ID: &str = "https://gpudiag.dev/schema/chrome-trace.schema.json";
const CHROME_TRACE_TITLE: &str = "gpudiag Chrome trace";
const CHROME_TRACE_DESCRIPTION: &str = "A Chrome trace written by `gpudiag trace` and inside \
    `gpudiag report` bundles: the Trace Event Format's JSON object form, with otherData.format \
    \"gpudiag-trace\" version 1. One process per GPU (pid = index + 1) and one for the host \
    (pid 1000000), named by metadata events; counters per metric group; findings, XIDs and \
    events as instant events; throttle intervals and probe phases as complete events; with \
    `run --kernels`, kernels, copies, memsets and host waits as complete events in Kineto's \
    layout (otherData.kernel_records counts them). Times are \
    integer microseconds since otherData.start_ms (epoch milliseconds). Generated from gpudiag's \
    types (src/schema.rs): change those, not this file.";

/// Every schema as its file name in `assets/schema/` and its text.
pub fn all() -> [(&'static str, String); 5] {
    [
        (CHECK_REPORT_FILE, check_report()),
        (RECORDING_FILE, recording()),
        (CHROME_TRACE_FILE, chrome_trace()),
        (RUN_REPORT_FILE, run_report()),
        (FLEET_REPORT_FILE, fleet_report()),
    ]
}

/// `fleet-report.schema.json`: what `gpudiag fleet --json` prints.
pub fn fleet_report() -> String {
    let schema = generator().root_schema_for::<gpudiag_fleet::model::Fleet>();
    finish(
        schema.to_value(),
        FLEET_REPORT_ID,
        FLEET_REPORT_TITLE,
        FLEET_REPORT_DESCRIPTION,
    )
}

/// `run-report.schema.json`: what `gpudiag run --json` prints and `--report-file FILE` writes.
pub fn run_report() -> String {
    let schema = generator().root_schema_for::<crate::commands::run::RunReport>();
    finish(
        schema.to_value(),
        RUN_REPORT_ID,
        RUN_REPORT_TITLE,
        RUN_REPORT_DESCRIPTION,
    )
}

/// `check-report.schema.json`: the document `gpudiag check --json` prints.
pub fn check_report() -> String {
    let schema = generator().root_schema_for::<CheckReport>();
    finish(
        schema.to_value(),
        CHECK_REPORT_ID,
        CHECK_REPORT_TITLE,
        CHECK_REPORT_DESCRIPTION,
    )
}

/// `recording.schema.json`: one line of a recording, the header or a record.
pub fn recording() -> String {
    let mut g = generator();
    let header = g.subschema_for::<Header>();
    let record = g.subschema_for::<Record>();
    let defs = g.take_definitions(false);
    // The kinds, for an error that names them when a line has another.
    let mut kinds = vec![json!("header")];
    if let Some(Value::Array(variants)) = defs.get("Record").and_then(|r| r.get("oneOf")) {
        kinds.extend(
            variants
                .iter()
                .filter_map(|v| v.pointer("/properties/kind/const").cloned()),
        );
    }
    let schema = json!({
        "$schema": g.settings().meta_schema,
        "type": "object",
        "required": ["kind"],
        "properties": { "kind": { "type": "string", "enum": kinds } },
        "oneOf": [header, record],
        "$defs": defs,
    });
    finish(schema, RECORDING_ID, RECORDING_TITLE, RECORDING_DESCRIPTION)
}

/// `chrome-trace.schema.json`: the trace `gpudiag trace` writes.
pub fn chrome_trace() -> String {
    let schema = generator().root_schema_for::<Trace>();
    finish(
        schema.to_value(),
        CHROME_TRACE_ID,
        CHROME_TRACE_TITLE,
        CHROME_TRACE_DESCRIPTION,
    )
}

/// Draft 2020-12, for what gpudiag writes: a field that is always serialised is required.
fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
}

/// Names the schema, makes it portable and strict (see [`tidy`]) and prints it.
fn finish(mut value: Value, id: &str, title: &str, description: &str) -> String {
    tidy(&mut value);
    if let Value::Object(root) = &mut value {
        root.insert("$id".into(), id.into());
        root.insert("title".into(), title.into());
        root.insert("description".into(), description.into());
    }
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// Applied to every subschema:
/// - Descriptions come from doc comments: their line breaks become spaces (a blank line, a new
///   paragraph, stays).
/// - schemars' `format`s for Rust's number types (`uint32`, `double`, ...) are not JSON Schema
///   formats, and strict validators refuse unknown ones: they become the range they stand for.
/// - An object closed with `additionalProperties: false` that also takes fields from `oneOf`
///   branches (a flattened enum: an event's `xid`, `reason` or `message`) would refuse those
///   fields, since `additionalProperties` sees only `properties` beside it;
///   `unevaluatedProperties: false` closes it and sees the branches' fields too.
fn tidy(value: &mut Value) {
    match value {
        Value::Object(o) => {
            if let Some(Value::String(d)) = o.get_mut("description") {
                *d = unwrap_lines(d);
            }
            number_format_to_range(o);
            let branches = ["oneOf", "anyOf", "allOf"]
                .iter()
                .any(|k| o.contains_key(*k));
            if branches && o.get("additionalProperties") == Some(&Value::Bool(false)) {
                o.remove("additionalProperties");
                o.insert("unevaluatedProperties".into(), false.into());
            }
            o.values_mut().for_each(tidy);
        }
        Value::Array(a) => a.iter_mut().for_each(tidy),
        _ => {}
    }
}

fn unwrap_lines(text: &str) -> String {
    text.split("\n\n")
        .map(|paragraph| {
            paragraph
                .split('\n')
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn number_format_to_range(o: &mut Map<String, Value>) {
    let range: (Option<Value>, Option<Value>) = match o.get("format").and_then(Value::as_str) {
        Some("uint8") => (Some(0.into()), Some(u8::MAX.into())),
        Some("uint16") => (Some(0.into()), Some(u16::MAX.into())),
        Some("uint32") => (Some(0.into()), Some(u32::MAX.into())),
        Some("uint64" | "uint") => (Some(0.into()), None),
        Some("int32") => (Some(i32::MIN.into()), Some(i32::MAX.into())),
        Some("int64" | "int") => (None, None),
        Some("double" | "float") => (None, None),
        _ => return,
    };
    o.remove("format");
    // A narrower range from an attribute (`pstate` is 0..=15) wins.
    if let Some(min) = range.0 {
        o.entry("minimum").or_insert(min);
    }
    if let Some(max) = range.1 {
        o.entry("maximum").or_insert(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats_become_ranges() {
        let mut v = json!({
            "a": { "type": "integer", "format": "uint32", "minimum": 0 },
            "b": { "type": ["integer", "null"], "format": "uint32", "maximum": 15 },
            "c": { "type": "number", "format": "double" },
            "d": { "type": "string", "format": "date-time" }
        });
        tidy(&mut v);
        assert_eq!(
            v,
            json!({
                "a": { "type": "integer", "minimum": 0, "maximum": 4294967295u32 },
                "b": { "type": ["integer", "null"], "minimum": 0, "maximum": 15 },
                "c": { "type": "number" },
                "d": { "type": "string", "format": "date-time" }
            })
        );
    }

    #[test]
    fn doc_comment_lines_are_joined() {
        let mut v = json!({ "description": "One line\nwrapped.\n\nA paragraph." });
        tidy(&mut v);
        assert_eq!(v["description"], "One line wrapped.\n\nA paragraph.");
    }

    #[test]
    fn a_closed_object_with_branches_is_closed_with_unevaluated_properties() {
        let mut v = json!({
            "type": "object",
            "properties": { "a": {} },
            "oneOf": [{ "properties": { "b": {} } }],
            "additionalProperties": false
        });
        tidy(&mut v);
        assert_eq!(v["unevaluatedProperties"], false);
        assert!(v.get("additionalProperties").is_none());
    }

    #[test]
    fn generation_is_deterministic() {
        assert_eq!(all(), all());
    }
}
