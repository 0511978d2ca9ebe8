//! The Prometheus HTTP API, as far as the fleet reads it: instant and range queries, the alerts
//! and the rules, through whatever stands in front (basic auth, a bearer token, TLS with a CA
//! and a client certificate, a tenant header for Mimir, Cortex or Thanos).
//!
//! Every request has a deadline and every answer a size cap; credentials and headers go to the
//! given URL's origin only (a redirect elsewhere is refused). Answers are parsed as they arrive,
//! never held whole: what one look keeps of them (series with the labels asked for, each text
//! once; the worst alerts) is counted against one cap, so no answer, however large or hostile,
//! takes more. Every way it can go wrong (refused, timed out, a 4xx/5xx, a redirect to another
//! origin, an answer that is not Prometheus's JSON, more than a look keeps) is one [`ApiError`]
//! whose text is the one line a user sees.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::model::QueryCost;

/// How to reach Prometheus: from the command line and files named there.
#[derive(Debug, Clone)]
pub struct Access {
    /// Base URL, e.g. `http://prometheus:9090` or a Mimir's `https://mimir/prometheus`.
    pub url: String,
    pub basic_auth: Option<(String, String)>,
    pub bearer_token: Option<String>,
    /// PEM certificates to trust instead of the bundled public roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain and its key.
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub headers: Vec<(String, String)>,
    /// The deadline of each request, connection included.
    pub timeout: Duration,
    /// The largest answer read; a larger one is an error asking for a narrower selector.
    pub max_answer_bytes: u64,
    /// The most one look keeps of every answer together; past it the look is an error asking
    /// for a narrower selector.
    pub max_kept_bytes: u64,
}

/// Same-origin redirects followed for one read before it is called a loop.
const MAX_REDIRECTS: u32 = 10;

/// The default cap on one answer as received: a 2,048-GPU fleet's largest query answers about
/// 3 MB. Answers are parsed as they arrive, so this bounds the time and traffic of a read; what
/// memory holds is bounded by [`DEFAULT_MAX_KEPT_BYTES`].
pub const DEFAULT_MAX_ANSWER_BYTES: u64 = 64 << 20;

impl Access {
    pub fn new(url: &str) -> Access {
        Access {
            url: url.to_owned(),
            basic_auth: None,
            bearer_token: None,
            ca_pem: None,
            client_cert_pem: None,
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
            max_kept_bytes: DEFAULT_MAX_KEPT_BYTES,
        }
    }
}

/// Why a read of Prometheus failed: one line for the user.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ApiError {
    #[error("cannot reach Prometheus at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error(
        "Prometheus at {url} did not answer within {seconds:.0} s ({what}); raise --query-timeout or narrow --selector"
    )]
    Timeout {
        url: String,
        seconds: f64,
        what: String,
    },
    #[error("Prometheus at {url} answered HTTP {status} to {what}{hint}: {detail}")]
    Status {
        url: String,
        status: u16,
        what: String,
        hint: &'static str,
        detail: String,
    },
    #[error(
        "Prometheus at {url} answered {what} with something that is not the Prometheus API: {detail}"
    )]
    Garbage {
        url: String,
        what: String,
        detail: String,
    },
    #[error("Prometheus at {url} refused {what}: {detail}")]
    Refused {
        url: String,
        what: String,
        detail: String,
    },
    #[error(
        "Prometheus at {url} answered {what} with more than {limit_mib} MiB; narrow --selector"
    )]
    TooLarge {
        url: String,
        what: String,
        limit_mib: u64,
    },
    #[error(
        "Prometheus at {url} answered {what} with more than gpudiag keeps of one look ({limit_mib} MiB of series, labels and alerts); narrow --selector"
    )]
    KeptTooMuch {
        url: String,
        what: String,
        limit_mib: u64,
    },
    #[error(
        "Prometheus at {url} holds more than {limit} GPUs under the selector, more than gpudiag reads in one look; narrow --selector"
    )]
    TooManyGpus { url: String, limit: usize },
    /// A redirect elsewhere is not followed: the user's credentials and headers were meant
    /// for the URL they gave, and the target may be anyone.
    #[error(
        "Prometheus at {url} redirected {what} to another origin, {target}; gpudiag does not follow it, so its credentials and headers go nowhere but {url}: if Prometheus is there, give its base URL as --prometheus"
    )]
    Redirected {
        url: String,
        what: String,
        target: String,
    },
    #[error("Prometheus at {url} redirected {what} more than {limit} times (a redirect loop?)")]
    RedirectLoop {
        url: String,
        what: String,
        limit: u32,
    },
    #[error("{0}")]
    Setup(String),
}

/// A client of one Prometheus, counting what it asks. A clone shares the connection pool and
/// what the current look keeps, and counts its queries on its own.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    shown: String,
    auth: Option<String>,
    headers: Vec<(String, String)>,
    timeout: Duration,
    max_answer_bytes: u64,
    /// The labels instant queries keep; all when `None`.
    keep_labels: Option<Arc<BTreeSet<String>>>,
    max_kept_bytes: u64,
    /// What the current look keeps, shared with the clones that read for it.
    kept: Arc<Kept>,
    pub cost: QueryCost,
}

/// A series' labels, each kept once per look however many series carry it (a node's name, a
/// model, a job key): on a large fleet the same few strings label every series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Labels(Vec<(Arc<str>, Arc<str>)>);

impl Labels {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| &**k == name).map(|(_, v)| &**v)
    }

    /// Sets `name` to `value`, replacing what it held.
    pub fn insert(&mut self, name: &str, value: &str) {
        match self.0.iter_mut().find(|(k, _)| &**k == name) {
            Some((_, v)) => *v = Arc::from(value),
            None => self.0.push((Arc::from(name), Arc::from(value))),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for Labels {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(iter: I) -> Labels {
        let mut labels = Labels::default();
        for (k, v) in iter {
            labels.insert(k, v);
        }
        labels
    }
}

/// One series of an instant vector: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Labels,
    pub value: f64,
}

impl Series {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).filter(|v| !v.is_empty())
    }
}

/// One series of a range query: its labels and (ms, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeSeries {
    pub labels: Labels,
    pub points: Vec<(i64, f64)>,
}

/// An alert as `/api/v1/alerts` lists it, with the labels the fleet reads and its summary.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub state: String,
    pub active_at: Option<String>,
}

/// The alerts `/api/v1/alerts` held: the worst [`MAX_ALERTS_KEPT`] of them, and how many
/// there were in all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Alerts {
    pub kept: Vec<ApiAlert>,
    pub total: u64,
}

/// The most alerts one look keeps, worst first (firing before pending, then by severity): a
/// Prometheus holding 200,000 alerts is read in the memory of this many.
pub const MAX_ALERTS_KEPT: usize = 1000;

/// The labels of an alert the fleet reads (its node label aside); the others are dropped as
/// the answer is parsed.
const ALERT_LABELS: [&str; 10] = [
    "alertname",
    "severity",
    "Hostname",
    "instance",
    "gpu",
    "UUID",
    "job_key",
    "pace",
    "scope",
    "node",
];

/// The one annotation the fleet shows, and the most of it kept.
const ALERT_SUMMARY: &str = "summary";
const MAX_SUMMARY_CHARS: usize = 300;

/// The default cap on what one look at the fleet keeps of every answer together (series,
/// labels, alerts), counted as they are parsed: a 2,048-GPU fleet read through gpudiag and
/// dcgm-exporter keeps about 12 MiB (benches/RESULTS.md).
pub const DEFAULT_MAX_KEPT_BYTES: u64 = 48 << 20;

/// The longest string (a label, a summary) an answer may hold: no reader of the fleet needs
/// more, and the parser buffers a string whole.
const MAX_STRING_BYTES: u64 = 64 << 10;

/// What one look keeps, shared by the clients that read at once: the memory its answers hold,
/// counted as they are parsed, and every label string kept once.
#[derive(Debug)]
struct Kept {
    limit: u64,
    used: AtomicU64,
    over: AtomicBool,
    strings: Mutex<HashSet<Arc<str>>>,
}

impl Kept {
    fn new(limit: u64) -> Arc<Kept> {
        Arc::new(Kept {
            limit,
            used: AtomicU64::new(0),
            over: AtomicBool::new(false),
            strings: Mutex::new(HashSet::new()),
        })
    }

    /// Counts `bytes` more kept; false (and from then on `over`) past the limit.
    fn charge(&self, bytes: usize) -> bool {
        let bytes = bytes as u64;
        let ok = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes <= self.limit;
        if !ok {
            self.over.store(true, Ordering::Relaxed);
        }
        ok
    }

    /// Gives back what was counted for something no longer kept.
    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// `s`, shared with every other label that holds the same text; `None` past the limit.
    fn string(&self, s: &str) -> Option<Arc<str>> {
        let mut strings = self.strings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = strings.get(s) {
            return Some(known.clone());
        }
        // The text, its reference counts and its slot in the set.
        if !self.charge(s.len() + 64) {
            return None;
        }
        let kept: Arc<str> = Arc::from(s);
        strings.insert(kept.clone());
        Some(kept)
    }
}

/// Past the limit of what a look keeps: the parse stops with this (the error is replaced by
/// [`ApiError::KeptTooMuch`]).
fn over_limit<E: serde::de::Error>() -> E {
    E::custom("over the limit of what a look keeps")
}

/// What a parse needs beside the text: the labels to keep (all when `None`) and the look's
/// count of what it keeps.
#[derive(Clone, Copy)]
struct Keep<'k> {
    labels: Option<&'k BTreeSet<String>>,
    kept: &'k Kept,
}

/// What a kept series costs beside its strings: its slot in the answer (with the slack of a
/// growing list) and each label's pair of references.
const SERIES_BYTES: usize = 64;
const LABEL_BYTES: usize = 32;

/// A Prometheus API answer, `{"status", "data", "errorType", "error"}`, its data parsed by `S`.
struct Envelope<T> {
    status: String,
    data: Option<T>,
    error_type: Option<String>,
    error: Option<String>,
}

struct EnvelopeSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for EnvelopeSeed<S> {
    type Value = Envelope<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for EnvelopeSeed<S> {
    type Value = Envelope<S::Value>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Prometheus API answer")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seed = Some(self.0);
        let mut out = Envelope {
            status: String::new(),
            data: None,
            error_type: None,
            error: None,
        };
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "status" => out.status = map.next_value()?,
                "errorType" => out.error_type = map.next_value()?,
                "error" => out.error = map.next_value()?,
                "data" => match seed.take() {
                    Some(seed) => out.data = Some(map.next_value_seed(seed)?),
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// A query's `data`: its `resultType` and, parsed by `S` when that type is `expected`, its
/// `result`.
struct ResultSeed<S> {
    expected: &'static str,
    result: S,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for ResultSeed<S> {
    type Value = (String, Option<S::Value>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for ResultSeed<S> {
    type Value = (String, Option<S::Value>);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a query result")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut result_type: Option<String> = None;
        let mut seed = Some(self.result);
        let mut result = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "resultType" => result_type = Some(map.next_value()?),
                // Prometheus writes the type first; a result of another type is not parsed.
                "result" if result_type.as_deref().is_none_or(|t| t == self.expected) => {
                    if let Some(seed) = seed.take() {
                        result = Some(map.next_value_seed(seed)?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((result_type.unwrap_or_default(), result))
    }
}

/// An instant vector, keeping only the labels asked for: on a large fleet the labels nobody
/// reads (`pci_bus_id`, `device`, the driver version, …) are most of the answer.
struct VectorSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for VectorSeed<'_> {
    type Value = Vec<Series>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VectorSeed<'_> {
    type Value = Vec<Series>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of series")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(ItemSeed(self.0))? {
            out.extend(item);
        }
        Ok(out)
    }
}

/// One `{"metric": {…}, "value": [t, "v"]}`; a NaN value makes no series.
struct ItemSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = Option<Series>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = Option<Series>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a series with its metric and value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut labels = Labels::default();
        let mut value: Option<(f64, Cow<'de, str>)> = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "metric" => labels = map.next_value_seed(LabelsSeed(self.0))?,
                "value" => {
                    value = Some(
                        map.next_value::<(f64, Text<'de>)>()
                            .map(|(t, v)| (t, v.0))?,
                    )
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let (_, v) = value.ok_or_else(|| serde::de::Error::missing_field("value"))?;
        let Some(value) = parse_value(&v) else {
            return Ok(None);
        };
        if !self.0.kept.charge(SERIES_BYTES) {
            return Err(over_limit());
        }
        Ok(Some(Series { labels, value }))
    }
}

struct LabelsSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = Labels;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = Labels;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("labels")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let Keep { labels: keep, kept } = self.0;
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if keep.is_none_or(|keep| keep.contains(key.0.as_ref())) {
                let value = map.next_value::<Text<'de>>()?;
                let (Some(k), Some(v)) = (kept.string(&key.0), kept.string(&value.0)) else {
                    return Err(over_limit());
                };
                if !kept.charge(LABEL_BYTES) {
                    return Err(over_limit());
                }
                out.push((k, v));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        out.shrink_to_fit();
        Ok(Labels(out))
    }
}

/// A map key, borrowed from the answer where it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Text::deserialize(d).map(|t| Key(t.0))
    }
}

/// A string, borrowed from the answer where it can be.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A range query's matrix: each series' labels and points.
struct MatrixSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for MatrixSeed<'_> {
    type Value = Vec<RangeSeries>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for MatrixSeed<'_> {
    type Value = Vec<RangeSeries>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of series")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(MatrixItemSeed(self.0))? {
            out.push(item);
        }
        Ok(out)
    }
}

struct MatrixItemSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for MatrixItemSeed<'_> {
    type Value = RangeSeries;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MatrixItemSeed<'_> {
    type Value = RangeSeries;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a series with its metric and values")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        if !self.0.kept.charge(SERIES_BYTES) {
            return Err(over_limit());
        }
        let mut out = RangeSeries {
            labels: Labels::default(),
            points: Vec::new(),
        };
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "metric" => out.labels = map.next_value_seed(LabelsSeed(self.0))?,
                "values" => out.points = map.next_value_seed(PointsSeed(self.0.kept))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// `[[t, "v"], …]` as (ms, value); a NaN is no point.
struct PointsSeed<'k>(&'k Kept);

impl<'de> DeserializeSeed<'de> for PointsSeed<'_> {
    type Value = Vec<(i64, f64)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for PointsSeed<'_> {
    type Value = Vec<(i64, f64)>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of points")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((t, v)) = seq.next_element::<(f64, Text<'de>)>()? {
            if let Some(v) = parse_value(&v.0) {
                // A point and the slack of a growing list.
                if !self.0.charge(32) {
                    return Err(over_limit());
                }
                out.push(((t * 1000.0).round() as i64, v));
            }
        }
        Ok(out)
    }
}

/// `/api/v1/alerts`' data: the worst [`MAX_ALERTS_KEPT`] alerts, with the labels the fleet
/// reads, and how many there were.
struct AlertsSeed<'k> {
    keep: Keep<'k>,
}

impl<'de> DeserializeSeed<'de> for AlertsSeed<'_> {
    type Value = Alerts;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AlertsSeed<'_> {
    type Value = Alerts;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("the alerts")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Alerts::default();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "alerts" => out = map.next_value_seed(AlertListSeed(self.keep))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

struct AlertListSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for AlertListSeed<'_> {
    type Value = Alerts;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

/// How an alert ranks for keeping: firing before pending, then by severity.
fn alert_priority(a: &ApiAlert) -> (bool, u8) {
    let severity = match a.labels.get("severity").map(|s| s.to_ascii_lowercase()) {
        Some(s) if matches!(s.as_str(), "fail" | "critical" | "error" | "page") => 3,
        Some(s) if matches!(s.as_str(), "warn" | "warning") => 2,
        Some(s) if matches!(s.as_str(), "info" | "none") => 1,
        _ => 0,
    };
    (a.state == "firing", severity)
}

/// What an alert kept costs: its strings and their slots.
fn alert_bytes(a: &ApiAlert) -> usize {
    let strings = a
        .labels
        .iter()
        .chain(a.annotations.iter())
        .map(|(k, v)| k.len() + v.len() + 96)
        .sum::<usize>();
    strings + a.state.len() + a.active_at.as_ref().map_or(0, String::len) + 128
}

impl<'de> Visitor<'de> for AlertListSeed<'_> {
    type Value = Alerts;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of alerts")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let kept = self.0.kept;
        let mut out = Alerts::default();
        // Kept in a list twice the cap, cut back to the worst `MAX_ALERTS_KEPT` whenever it
        // fills: the memory of the cap, in the time of a sort every thousand alerts.
        while let Some(alert) = seq.next_element_seed(AlertSeed(self.0))? {
            out.total += 1;
            if !kept.charge(alert_bytes(&alert)) {
                return Err(over_limit());
            }
            out.kept.push(alert);
            if out.kept.len() >= 2 * MAX_ALERTS_KEPT {
                keep_worst(&mut out.kept, kept);
            }
        }
        keep_worst(&mut out.kept, kept);
        Ok(out)
    }
}

/// Cuts `alerts` to the worst [`MAX_ALERTS_KEPT`], the order of equals kept.
fn keep_worst(alerts: &mut Vec<ApiAlert>, kept: &Kept) {
    alerts.sort_by_key(|a| std::cmp::Reverse(alert_priority(a)));
    for gone in alerts.drain(alerts.len().min(MAX_ALERTS_KEPT)..) {
        kept.release(alert_bytes(&gone));
    }
}

struct AlertSeed<'k>(Keep<'k>);

impl<'de> DeserializeSeed<'de> for AlertSeed<'_> {
    type Value = ApiAlert;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AlertSeed<'_> {
    type Value = ApiAlert;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an alert")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let node_label = self.0.labels;
        let wanted =
            |k: &str| ALERT_LABELS.contains(&k) || node_label.is_some_and(|keep| keep.contains(k));
        let mut out = ApiAlert {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            state: String::new(),
            active_at: None,
        };
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "labels" => {
                    out.labels = map.next_value_seed(StringMapSeed {
                        wanted: &wanted,
                        max_chars: usize::MAX,
                    })?
                }
                "annotations" => {
                    out.annotations = map.next_value_seed(StringMapSeed {
                        wanted: &|k: &str| k == ALERT_SUMMARY,
                        max_chars: MAX_SUMMARY_CHARS,
                    })?
                }
                "state" => out.state = map.next_value()?,
                "activeAt" => out.active_at = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// A map of strings, keeping the keys `wanted` says, each value cut to `max_chars`.
struct StringMapSeed<'w> {
    wanted: &'w dyn Fn(&str) -> bool,
    max_chars: usize,
}

impl<'de> DeserializeSeed<'de> for StringMapSeed<'_> {
    type Value = BTreeMap<String, String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StringMapSeed<'_> {
    type Value = BTreeMap<String, String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map of strings")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if (self.wanted)(&key.0) {
                let value = map.next_value::<Text<'de>>()?;
                out.insert(
                    key.0.into_owned(),
                    value.0.chars().take(self.max_chars).collect(),
                );
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// `/api/v1/rules`' data, read for whether one rule is loaded: the rest passes by unkept.
struct RuleSeed<'n>(&'n str);

impl<'de> DeserializeSeed<'de> for RuleSeed<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RuleSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("the rules")
    }
    /// Any `"name": "<the rule>"` at any depth (data.groups[].rules[].name).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            found |= match key.0.as_ref() {
                "groups" | "rules" => map.next_value_seed(RuleSeed(self.0))?,
                "name" => map.next_value::<Text<'de>>()?.0 == self.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    false
                }
            };
        }
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(f) = seq.next_element_seed(RuleSeed(self.0))? {
            found |= f;
        }
        Ok(found)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
}

/// The URL without user and password, for showing.
pub fn shown_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// The user and password of `scheme://user:pass@host`, percent-decoded.
fn url_credentials(url: &str) -> Option<(String, String)> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    Some((percent_decode(user), percent_decode(pass)))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encodes a query parameter value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Seconds since the epoch as Prometheus reads a `time` parameter (ms precision).
fn api_time(ms: i64) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

impl Client {
    pub fn new(access: &Access) -> Result<Client, ApiError> {
        let url = access.url.trim_end_matches('/').to_owned();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ApiError::Setup(format!(
                "--prometheus {}: give an http:// or https:// URL",
                shown_url(&url)
            )));
        }
        let shown = shown_url(&url);
        let credentials = access.basic_auth.clone().or_else(|| url_credentials(&url));
        let auth = match (&access.bearer_token, credentials) {
            (Some(token), _) => Some(format!("Bearer {}", token.trim())),
            (None, Some((user, pass))) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
            )),
            (None, None) => None,
        };
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(pem) = &access.ca_pem {
            let certs = pem_certificates(pem, "--ca-file")?;
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)));
        }
        if let Some((chain, key)) = &access.client_cert_pem {
            let chain = pem_certificates(chain, "--client-cert")?;
            let key = ureq::tls::PrivateKey::from_pem(key).map_err(|e| {
                ApiError::Setup(format!("--client-key: not a PEM private key ({e})"))
            })?;
            tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&chain, key)));
        }
        for (name, value) in &access.headers {
            let bad = |why: &str| ApiError::Setup(format!("--header {name}: {why}"));
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                return Err(bad("not a header name"));
            }
            if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return Err(bad("the value holds control characters"));
            }
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(access.timeout))
            .http_status_as_error(false)
            // ureq would follow a redirect to any host with the --header values (it drops
            // only Authorization and Cookie): `get` follows them itself, same origin only.
            .max_redirects(0)
            .tls_config(tls.build())
            .user_agent(format!("gpudiag/{}", gpudiag_model::build_info::VERSION))
            .build();
        Ok(Client {
            agent: config.into(),
            shown,
            auth,
            headers: access.headers.clone(),
            timeout: access.timeout,
            max_answer_bytes: access.max_answer_bytes,
            keep_labels: None,
            max_kept_bytes: access.max_kept_bytes,
            kept: Kept::new(access.max_kept_bytes),
            cost: QueryCost::default(),
        })
    }

    /// From now on instant queries keep only these labels (and drop the rest as they are
    /// parsed); `None` keeps all.
    pub fn keep_labels(&mut self, labels: Option<BTreeSet<String>>) {
        self.keep_labels = labels.map(Arc::new);
    }

    /// The base URL, without credentials.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Starts a look: what it keeps is counted from nought, apart from the looks before (whose
    /// answers are gone by then). Clones made after share the count.
    pub fn begin_look(&mut self) {
        self.kept = Kept::new(self.max_kept_bytes);
    }

    /// An instant vector at `at_ms` (now when `None`).
    pub fn instant(&mut self, query: &str, at_ms: Option<i64>) -> Result<Vec<Series>, ApiError> {
        let mut params = vec![("query", query.to_owned())];
        if let Some(ms) = at_ms {
            params.push(("time", api_time(ms)));
        }
        let (kept, labels) = (self.kept.clone(), self.keep_labels.clone());
        let keep = Keep {
            labels: labels.as_deref(),
            kept: &kept,
        };
        let seed = ResultSeed {
            expected: "vector",
            result: VectorSeed(keep),
        };
        match self.get("/api/v1/query", &params, query, seed)? {
            (_, Some(series)) => Ok(series),
            (t, None) if t != "vector" => Err(self.garbage(query, format!("a {t} result"))),
            _ => Err(self.garbage(query, "no result".to_owned())),
        }
    }

    /// Instant queries at one instant, asked at once (one connection each) rather than one
    /// after another: the first look at a large fleet waits for the slowest, not for the sum.
    pub fn instant_all(
        &mut self,
        queries: &[String],
        at_ms: Option<i64>,
    ) -> Vec<Result<Vec<Series>, ApiError>> {
        let answers: Vec<(Result<Vec<Series>, ApiError>, QueryCost)> =
            std::thread::scope(|scope| {
                let asked: Vec<_> = queries
                    .iter()
                    .map(|q| {
                        let mut own = self.clone();
                        own.cost = QueryCost::default();
                        scope.spawn(move || {
                            let r = own.instant(q, at_ms);
                            (r, own.cost)
                        })
                    })
                    .collect();
                asked
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            (
                                Err(ApiError::Setup("a query's thread failed".to_owned())),
                                QueryCost::default(),
                            )
                        })
                    })
                    .collect()
            });
        answers
            .into_iter()
            .map(|(r, cost)| {
                self.cost.add(&cost);
                r
            })
            .collect()
    }

    /// A range query over [start, end] at `step`.
    pub fn range(
        &mut self,
        query: &str,
        start_ms: i64,
        end_ms: i64,
        step: Duration,
    ) -> Result<Vec<RangeSeries>, ApiError> {
        let params = [
            ("query", query.to_owned()),
            ("start", api_time(start_ms)),
            ("end", api_time(end_ms)),
            ("step", format!("{:.3}", step.as_secs_f64().max(0.001))),
        ];
        let (kept, labels) = (self.kept.clone(), self.keep_labels.clone());
        let keep = Keep {
            labels: labels.as_deref(),
            kept: &kept,
        };
        let seed = ResultSeed {
            expected: "matrix",
            result: MatrixSeed(keep),
        };
        match self.get("/api/v1/query_range", &params, query, seed)? {
            (_, Some(series)) => Ok(series),
            (t, None) if t != "matrix" => Err(self.garbage(query, format!("a {t} result"))),
            _ => Err(self.garbage(query, "no result".to_owned())),
        }
    }

    /// The alerts Prometheus holds, firing and pending: the worst [`MAX_ALERTS_KEPT`], with
    /// how many there were.
    pub fn alerts(&mut self) -> Result<Alerts, ApiError> {
        let (kept, labels) = (self.kept.clone(), self.keep_labels.clone());
        let keep = Keep {
            labels: labels.as_deref(),
            kept: &kept,
        };
        self.get("/api/v1/alerts", &[], "the alerts", AlertsSeed { keep })
    }

    /// Whether a rule of this name (recording or alerting) is loaded.
    pub fn has_rule(&mut self, name: &str) -> Result<bool, ApiError> {
        self.get("/api/v1/rules", &[], "the rules", RuleSeed(name))
    }

    fn garbage(&self, what: &str, detail: String) -> ApiError {
        ApiError::Garbage {
            url: self.shown.clone(),
            what: short(what),
            detail: short(&detail),
        }
    }

    /// GETs `path` and parses the answer's `data` with `seed` as it arrives: no answer is held
    /// whole, only what the seed keeps.
    fn get<S, T>(
        &mut self,
        path: &str,
        params: &[(&str, String)],
        what: &str,
        seed: S,
    ) -> Result<T, ApiError>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let mut url = format!("{}{path}", self.shown);
        for (i, (k, v)) in params.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(k);
            url.push('=');
            url.push_str(&encode(v));
        }
        let started = Instant::now();
        let answer = self.follow(url, what, started);
        let result = answer.and_then(|(status, body)| self.parse(status, body, what, seed));
        self.cost.seconds += started.elapsed().as_secs_f64();
        result
    }

    /// An answer's body, parsed as it is read: Prometheus's envelope around `seed`'s data on
    /// a 200, its error (or the start of whatever came) otherwise.
    fn parse<S, T>(
        &mut self,
        status: u16,
        mut body: ureq::Body,
        what: &str,
        seed: S,
    ) -> Result<T, ApiError>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let reader = body
            .with_config()
            .limit(if status == 200 {
                self.max_answer_bytes
            } else {
                MAX_ERROR_BODY
            })
            .reader();
        let mut reader = std::io::BufReader::with_capacity(64 << 10, Guarded::new(reader));
        if status != 200 {
            // Prometheus answers 400 and 422 (bad query, bad data) and 503 with its own JSON
            // envelope, whose error says more than the status.
            let mut text = Vec::new();
            let read = (&mut reader).take(MAX_ERROR_BODY).read_to_end(&mut text);
            self.cost.bytes += reader.get_ref().bytes;
            read.map_err(|e| self.read_error(e, what))?;
            let envelope = serde_json::from_slice(&text)
                .ok()
                .and_then(|v: serde_json::Value| {
                    v.get("error").and_then(|e| e.as_str()).map(|error| {
                        let error_type = v.get("errorType").and_then(|t| t.as_str());
                        (error_type.map(str::to_owned), error.to_owned())
                    })
                });
            return Err(match envelope {
                Some((error_type, error)) => self.refused(what, error_type, Some(error)),
                None => ApiError::Status {
                    url: self.shown.clone(),
                    status,
                    what: short(what),
                    hint: match status {
                        401 | 403 => " (check --basic-auth-user, --bearer-token-file or --header)",
                        404 => " (is the URL Prometheus's base, without /api/v1?)",
                        _ => "",
                    },
                    detail: short(&String::from_utf8_lossy(&text)),
                },
            });
        }
        let mut parser = serde_json::Deserializer::from_reader(&mut reader);
        let parsed = EnvelopeSeed(seed)
            .deserialize(&mut parser)
            .and_then(|envelope| parser.end().map(|()| envelope));
        self.cost.bytes += reader.get_ref().bytes;
        match parsed {
            Ok(Envelope {
                status: s,
                data: Some(data),
                ..
            }) if s == "success" => Ok(data),
            Ok(Envelope {
                error_type, error, ..
            }) => Err(self.refused(what, error_type, error)),
            Err(_) if self.kept.over() => Err(ApiError::KeptTooMuch {
                url: self.shown.clone(),
                what: short(what),
                limit_mib: self.max_kept_bytes >> 20,
            }),
            Err(e) if e.is_io() => Err(self.read_error(e.into(), what)),
            Err(e) => Err(self.garbage(what, e.to_string())),
        }
    }

    fn refused(&self, what: &str, error_type: Option<String>, error: Option<String>) -> ApiError {
        ApiError::Refused {
            url: self.shown.clone(),
            what: short(what),
            detail: short(&format!(
                "{}{}",
                error_type.map(|t| format!("{t}: ")).unwrap_or_default(),
                error.unwrap_or_else(|| "no data in the answer".to_owned())
            )),
        }
    }

    /// A failed read of a body: the transport's error, or a string longer than any the fleet
    /// reads.
    fn read_error(&self, e: std::io::Error, what: &str) -> ApiError {
        if e.get_ref().is_some_and(|inner| inner.is::<LongString>()) {
            return self.garbage(what, e.to_string());
        }
        self.transport_error(ureq::Error::from(e), what)
    }

    /// GETs `url`, following same-origin redirects, within one deadline from `started`: the
    /// status and body of the last answer, unread.
    fn follow(
        &mut self,
        mut url: String,
        what: &str,
        started: Instant,
    ) -> Result<(u16, ureq::Body), ApiError> {
        let mut hops = 0;
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            let mut request = self
                .agent
                .get(&url)
                .config()
                .timeout_global(Some(left))
                .build();
            if let Some(auth) = &self.auth {
                request = request.header("Authorization", auth);
            }
            for (name, value) in &self.headers {
                request = request.header(name.as_str(), value.as_str());
            }
            self.cost.count += 1;
            let answer = request.call().map_err(|e| self.transport_error(e, what))?;
            let Some(location) = redirect_location(&answer) else {
                let status = answer.status().as_u16();
                return Ok((status, answer.into_body()));
            };
            let target = resolve_location(&url, &location);
            if !same_origin(&self.shown, &target) {
                return Err(ApiError::Redirected {
                    url: self.shown.clone(),
                    what: short(what),
                    // Where it points, not the query it would repeat.
                    target: short(&shown_url(target.split(['?', '#']).next().unwrap_or(""))),
                });
            }
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(ApiError::RedirectLoop {
                    url: self.shown.clone(),
                    what: short(what),
                    limit: MAX_REDIRECTS,
                });
            }
            url = target;
        }
    }

    fn transport_error(&self, e: ureq::Error, what: &str) -> ApiError {
        match e {
            ureq::Error::Timeout(_) => ApiError::Timeout {
                url: self.shown.clone(),
                seconds: self.timeout.as_secs_f64(),
                what: short(what),
            },
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => ApiError::Timeout {
                url: self.shown.clone(),
                seconds: self.timeout.as_secs_f64(),
                what: short(what),
            },
            ureq::Error::BodyExceedsLimit(_) => ApiError::TooLarge {
                url: self.shown.clone(),
                what: short(what),
                limit_mib: self.max_answer_bytes >> 20,
            },
            ureq::Error::Protocol(p) => ApiError::Garbage {
                url: self.shown.clone(),
                what: short(what),
                detail: format!("not HTTP ({p})"),
            },
            other => ApiError::Unreachable {
                url: self.shown.clone(),
                reason: other.to_string(),
            },
        }
    }
}

/// The most of an error answer (a 4xx or 5xx) read: its first line is all that is shown.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// Why a read stopped at a string longer than [`MAX_STRING_BYTES`].
#[derive(Debug)]
struct LongString;

impl std::fmt::Display for LongString {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a string longer than {} KiB", MAX_STRING_BYTES >> 10)
    }
}

impl std::error::Error for LongString {}

/// A body as read, counting its bytes and stopping at a JSON string longer than
/// [`MAX_STRING_BYTES`]: the parser buffers each string whole, so one 60 MiB label would be
/// held (twice, as its buffer grows) however little of it is kept.
struct Guarded<R> {
    inner: R,
    bytes: u64,
    in_string: bool,
    escaped: bool,
    run: u64,
}

impl<R> Guarded<R> {
    fn new(inner: R) -> Guarded<R> {
        Guarded {
            inner,
            bytes: 0,
            in_string: false,
            escaped: false,
            run: 0,
        }
    }
}

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        for &b in &buf[..n] {
            if self.in_string {
                self.run += 1;
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                if self.run > MAX_STRING_BYTES {
                    return Err(std::io::Error::other(LongString));
                }
            } else if b == b'"' {
                self.in_string = true;
                self.run = 0;
            }
        }
        Ok(n)
    }
}

/// The `Location` of a redirect (301, 302, 303, 307, 308); `None` for any other answer, and
/// for a redirect without one (then it is an HTTP error like any other status).
fn redirect_location(answer: &ureq::http::Response<ureq::Body>) -> Option<String> {
    if !matches!(answer.status().as_u16(), 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let location = answer.headers().get("location")?.to_str().ok()?.trim();
    (!location.is_empty()).then(|| location.to_owned())
}

/// `scheme://authority` of an absolute URL.
fn origin_of(url: &str) -> &str {
    let Some(at) = url.find("://") else {
        return url;
    };
    let rest = &url[at + 3..];
    let end = rest.find(['/', '?', '#']).map_or(url.len(), |i| at + 3 + i);
    &url[..end]
}

/// A `Location` as an absolute URL, read against the URL that answered it (RFC 9110 allows a
/// relative reference).
fn resolve_location(from: &str, location: &str) -> String {
    let has_scheme = location.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    });
    if has_scheme {
        return location.to_owned();
    }
    if let Some(rest) = location.strip_prefix("//") {
        let scheme = from.split_once("://").map_or("http", |(s, _)| s);
        return format!("{scheme}://{rest}");
    }
    let origin = origin_of(from);
    if location.starts_with('/') {
        return format!("{origin}{location}");
    }
    let path = &from[origin.len()..];
    let path = &path[..path.find(['?', '#']).unwrap_or(path.len())];
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    format!("{origin}{dir}{location}")
}

/// Scheme, host and port, each as a browser compares them: the same server, not one that
/// shares a name's suffix or answers on another port.
fn same_origin(a: &str, b: &str) -> bool {
    fn key(url: &str) -> Option<(String, String, u16)> {
        let uri: ureq::http::Uri = origin_of(url).parse().ok()?;
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let port = uri.port_u16().or(match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        })?;
        Some((scheme, uri.host()?.to_ascii_lowercase(), port))
    }
    key(a).is_some_and(|k| Some(k) == key(b))
}

/// Prometheus writes values as strings, with `NaN`, `+Inf` and `-Inf`; a NaN is no value.
fn parse_value(s: &str) -> Option<f64> {
    let v: f64 = match s {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        s => s.parse().ok()?,
    };
    (!v.is_nan()).then_some(v)
}

/// Text from the server, cut to one short printable line.
fn short(s: &str) -> String {
    let line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    let line = line.trim().to_owned();
    if s.chars().count() > 200 {
        format!("{line}…")
    } else {
        line
    }
}

fn pem_certificates(
    pem: &[u8],
    flag: &str,
) -> Result<Vec<ureq::tls::Certificate<'static>>, ApiError> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(ApiError::Setup(format!("{flag}: not PEM ({e})"))),
        }
    }
    if certs.is_empty() {
        return Err(ApiError::Setup(format!(
            "{flag}: no certificate in the file"
        )));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_and_are_read_from_the_url() {
        assert_eq!(
            shown_url("https://al%40ce:p%3Ass@prom:9090/x"),
            "https://prom:9090/x"
        );
        assert_eq!(
            url_credentials("https://al%40ce:p%3Ass@prom:9090/x"),
            Some(("al@ce".to_owned(), "p:ss".to_owned()))
        );
        assert_eq!(url_credentials("http://prom:9090"), None);
    }

    #[test]
    fn values_read_as_prometheus_writes_them() {
        assert_eq!(parse_value("1.5"), Some(1.5));
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_value("NaN"), None);
        assert_eq!(parse_value("x"), None);
        assert_eq!(api_time(1_700_000_000_123), "1700000000.123");
    }

    #[test]
    fn server_text_becomes_one_short_line() {
        let s = short(&format!("a\nb\x1b[31m{}", "x".repeat(300)));
        assert!(!s.contains('\n') && !s.contains('\x1b'));
        assert!(s.chars().count() <= 201);
    }

    #[test]
    fn a_redirect_is_read_against_its_url_and_judged_by_origin() {
        let from = "http://prom:9090/pre/api/v1/query?query=up";
        assert_eq!(
            resolve_location(from, "/other/api/v1/query?x=1"),
            "http://prom:9090/other/api/v1/query?x=1"
        );
        assert_eq!(
            resolve_location(from, "query_range"),
            "http://prom:9090/pre/api/v1/query_range"
        );
        assert_eq!(
            resolve_location(from, "//elsewhere:9090/x"),
            "http://elsewhere:9090/x"
        );
        assert_eq!(
            resolve_location(from, "https://prom:9090/y"),
            "https://prom:9090/y"
        );
        let base = "http://prom:9090/pre";
        assert!(same_origin(base, "http://PROM:9090/elsewhere"));
        assert!(same_origin("http://prom/pre", "http://prom:80/x"));
        assert!(same_origin("https://prom", "https://prom:443/x?y"));
        for other in [
            "https://prom:9090/pre",
            "http://prom:9091/pre",
            "http://prom.evil:9090/pre",
            "http://evil/@prom:9090",
            "http://prom:9090@evil/pre",
            "not a url",
        ] {
            assert!(!same_origin(base, other), "{other}");
        }
    }

    fn keep(kept: &Kept) -> Keep<'_> {
        Keep { labels: None, kept }
    }

    #[test]
    fn the_worst_alerts_are_kept_and_all_counted() {
        let kept = Kept::new(DEFAULT_MAX_KEPT_BYTES);
        let alerts: Vec<String> = (0..2500)
            .map(|i| {
                let (state, severity) = match i % 5 {
                    0 => ("firing", "critical"),
                    1 => ("pending", "critical"),
                    _ => ("firing", "warning"),
                };
                format!(
                    r#"{{"labels":{{"alertname":"A{i}","severity":"{severity}","unread":"x"}},"annotations":{{"summary":"{}","description":"y"}},"state":"{state}"}}"#,
                    "s".repeat(400)
                )
            })
            .collect();
        let text = format!(r#"{{"alerts":[{}]}}"#, alerts.join(","));
        let got = AlertsSeed { keep: keep(&kept) }
            .deserialize(&mut serde_json::Deserializer::from_str(&text))
            .unwrap();
        assert_eq!((got.total, got.kept.len()), (2500, MAX_ALERTS_KEPT));
        let firing_critical = got
            .kept
            .iter()
            .filter(|a| a.state == "firing" && a.labels["severity"] == "critical")
            .count();
        assert_eq!(firing_critical, 500, "all of the worst kind are kept first");
        let a = &got.kept[0];
        assert!(!a.labels.contains_key("unread") && !a.annotations.contains_key("description"));
        assert_eq!(a.annotations["summary"].chars().count(), MAX_SUMMARY_CHARS);
        // What the dropped alerts held is given back.
        let held: usize = got.kept.iter().map(alert_bytes).sum();
        assert_eq!(kept.used.load(Ordering::Relaxed), held as u64);
    }

    #[test]
    fn series_past_what_a_look_keeps_stop_the_parse() {
        let kept = Kept::new(64 << 10);
        let items: Vec<String> = (0..2000)
            .map(|i| format!(r#"{{"metric":{{"UUID":"GPU-{i}"}},"value":[1,"1"]}}"#))
            .collect();
        let text = format!("[{}]", items.join(","));
        let got =
            VectorSeed(keep(&kept)).deserialize(&mut serde_json::Deserializer::from_str(&text));
        assert!(got.is_err() && kept.over());

        // Labels repeated across series are kept once.
        let kept = Kept::new(DEFAULT_MAX_KEPT_BYTES);
        let got = VectorSeed(keep(&kept))
            .deserialize(&mut serde_json::Deserializer::from_str(
                r#"[{"metric":{"Hostname":"n"},"value":[1,"1"]},{"metric":{"Hostname":"n"},"value":[1,"2"]}]"#,
            ))
            .unwrap();
        assert!(Arc::ptr_eq(&got[0].labels.0[0].1, &got[1].labels.0[0].1));
    }

    #[test]
    fn a_string_longer_than_any_read_stops_the_read() {
        let long = format!(r#"{{"a":"{}\"x"}}"#, "y".repeat(MAX_STRING_BYTES as usize));
        let mut out = Vec::new();
        let e = Guarded::new(long.as_bytes())
            .read_to_end(&mut out)
            .unwrap_err();
        assert!(e.get_ref().is_some_and(|i| i.is::<LongString>()), "{e}");
        let fine = format!(
            r#"{{"a":"{}\"","b":"{}"}}"#,
            "y".repeat(60 << 10),
            "z".repeat(60 << 10)
        );
        Guarded::new(fine.as_bytes()).read_to_end(&mut out).unwrap();
    }

    #[test]
    fn the_rules_answer_says_whether_a_rule_is_loaded() {
        let text = r#"{"groups":[{"name":"g","rules":[{"name":"other","labels":{"name":"x"},"alerts":[]},{"name":"gpudiag_job:gpus:count","health":"ok"}]}]}"#;
        let found = |name| {
            RuleSeed(name)
                .deserialize(&mut serde_json::Deserializer::from_str(text))
                .unwrap()
        };
        assert!(found("gpudiag_job:gpus:count"));
        assert!(!found("x"));
    }

    #[test]
    fn a_url_without_a_scheme_is_refused() {
        let e = Client::new(&Access::new("prom:9090")).err();
        assert!(matches!(e, Some(ApiError::Setup(_))), "{e:?}");
    }
}
