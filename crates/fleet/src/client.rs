//! The Prometheus HTTP API, as far as the fleet reads it: instant and range queries, the alerts
//! and the rules, through whatever stands in front (basic auth, a bearer token, TLS with a CA
//! and a client certificate, a tenant header for Mimir, Cortex or Thanos).
//!
//! Every request has a deadline and every answer a size cap; credentials and headers go to the
//! given URL's origin only (a redirect elsewhere is refused). Every way it can go wrong
//! (refused, timed out, a 4xx/5xx, a redirect to another origin, an answer that is not
//! Prometheus's JSON) is one [`ApiError`] whose text is the one line a user sees.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

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
}

/// Same-origin redirects followed for one read before it is called a loop.
const MAX_REDIRECTS: u32 = 10;

/// The default cap on one answer: a 2,048-GPU fleet's largest query answers about 3 MB.
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

/// One series of an instant vector: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Series {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// One series of a range query: its labels and (ms, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeSeries {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(i64, f64)>,
}

/// An alert as `/api/v1/alerts` lists it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ApiAlert {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub state: String,
    #[serde(default, rename = "activeAt")]
    pub active_at: Option<String>,
}

/// A client of one Prometheus, counting what it asks. A clone shares the connection pool and
/// counts on its own.
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
    pub cost: QueryCost,
}

#[derive(Deserialize)]
struct Envelope<T> {
    status: String,
    data: Option<T>,
    #[serde(rename = "errorType")]
    error_type: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct QueryData {
    #[serde(rename = "resultType")]
    result_type: String,
    /// Parsed once its type is known: a large answer is not built as a generic tree first.
    result: Box<serde_json::value::RawValue>,
}

/// An instant vector, parsed keeping only the labels `keep` names (all when `None`): on a large
/// fleet the labels nobody reads (`pci_bus_id`, `device`, the driver version, …) are most of the
/// answer's allocations.
struct VectorSeed<'k>(Option<&'k BTreeSet<String>>);

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
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(item) = seq.next_element_seed(ItemSeed(self.0))? {
            out.extend(item);
        }
        Ok(out)
    }
}

/// One `{"metric": {…}, "value": [t, "v"]}`; a NaN value makes no series.
struct ItemSeed<'k>(Option<&'k BTreeSet<String>>);

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
        let mut labels = BTreeMap::new();
        let mut value: Option<(f64, String)> = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "metric" => labels = map.next_value_seed(LabelsSeed(self.0))?,
                "value" => value = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let (_, v) = value.ok_or_else(|| serde::de::Error::missing_field("value"))?;
        Ok(parse_value(&v).map(|value| Series { labels, value }))
    }
}

struct LabelsSeed<'k>(Option<&'k BTreeSet<String>>);

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = BTreeMap<String, String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = BTreeMap<String, String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("labels")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if self.0.is_none_or(|keep| keep.contains(key.0.as_ref())) {
                out.insert(key.0.into_owned(), map.next_value::<String>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// A map key, borrowed from the answer where it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Deserialize)]
struct MatrixItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

#[derive(Deserialize)]
struct AlertsData {
    #[serde(default)]
    alerts: Vec<ApiAlert>,
}

#[derive(Deserialize)]
struct RulesData {
    #[serde(default)]
    groups: Vec<RuleGroup>,
}

#[derive(Deserialize)]
struct RuleGroup {
    #[serde(default)]
    rules: Vec<RuleItem>,
}

#[derive(Deserialize)]
struct RuleItem {
    #[serde(default)]
    name: String,
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

    /// An instant vector at `at_ms` (now when `None`).
    pub fn instant(&mut self, query: &str, at_ms: Option<i64>) -> Result<Vec<Series>, ApiError> {
        let mut params = vec![("query", query.to_owned())];
        if let Some(ms) = at_ms {
            params.push(("time", api_time(ms)));
        }
        let data: QueryData = self.get("/api/v1/query", &params, query)?;
        if data.result_type != "vector" {
            return Err(self.garbage(query, format!("a {} result", data.result_type)));
        }
        let mut parser = serde_json::Deserializer::from_str(data.result.get());
        VectorSeed(self.keep_labels.as_deref())
            .deserialize(&mut parser)
            .map_err(|e| self.garbage(query, e.to_string()))
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
        let data: QueryData = self.get("/api/v1/query_range", &params, query)?;
        if data.result_type != "matrix" {
            return Err(self.garbage(query, format!("a {} result", data.result_type)));
        }
        let items: Vec<MatrixItem> = serde_json::from_str(data.result.get())
            .map_err(|e| self.garbage(query, e.to_string()))?;
        Ok(items
            .into_iter()
            .map(|i| RangeSeries {
                labels: i.metric,
                points: i
                    .values
                    .into_iter()
                    .filter_map(|(t, v)| Some(((t * 1000.0).round() as i64, parse_value(&v)?)))
                    .collect(),
            })
            .collect())
    }

    /// Every alert Prometheus holds, firing and pending.
    pub fn alerts(&mut self) -> Result<Vec<ApiAlert>, ApiError> {
        let data: AlertsData = self.get("/api/v1/alerts", &[], "the alerts")?;
        Ok(data.alerts)
    }

    /// The names of every rule loaded, recording and alerting.
    pub fn rule_names(&mut self) -> Result<Vec<String>, ApiError> {
        let data: RulesData = self.get("/api/v1/rules", &[], "the rules")?;
        Ok(data
            .groups
            .into_iter()
            .flat_map(|g| g.rules.into_iter().map(|r| r.name))
            .collect())
    }

    fn garbage(&self, what: &str, detail: String) -> ApiError {
        ApiError::Garbage {
            url: self.shown.clone(),
            what: short(what),
            detail: short(&detail),
        }
    }

    fn get<T: DeserializeOwned>(
        &mut self,
        path: &str,
        params: &[(&str, String)],
        what: &str,
    ) -> Result<T, ApiError> {
        let mut url = format!("{}{path}", self.shown);
        for (i, (k, v)) in params.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(k);
            url.push('=');
            url.push_str(&encode(v));
        }
        let started = Instant::now();
        let fetched = self.follow(url, what, started);
        self.cost.seconds += started.elapsed().as_secs_f64();
        let (status, body) = fetched?;
        self.cost.bytes += body.len() as u64;
        // Prometheus answers 400 and 422 (bad query, bad data) and 503 with its own JSON
        // envelope, whose error says more than the status.
        let envelope: Result<Envelope<T>, _> = serde_json::from_slice(&body);
        match envelope {
            Ok(Envelope {
                status: s,
                data: Some(data),
                ..
            }) if s == "success" && status == 200 => Ok(data),
            Ok(Envelope {
                error_type, error, ..
            }) if status == 200 || error.is_some() => Err(ApiError::Refused {
                url: self.shown.clone(),
                what: short(what),
                detail: short(&format!(
                    "{}{}",
                    error_type.map(|t| format!("{t}: ")).unwrap_or_default(),
                    error.unwrap_or_else(|| "no data in the answer".to_owned())
                )),
            }),
            _ if status != 200 => Err(ApiError::Status {
                url: self.shown.clone(),
                status,
                what: short(what),
                hint: match status {
                    401 | 403 => " (check --basic-auth-user, --bearer-token-file or --header)",
                    404 => " (is the URL Prometheus's base, without /api/v1?)",
                    _ => "",
                },
                detail: short(&String::from_utf8_lossy(&body)),
            }),
            Ok(_) => Err(self.garbage(what, "no data".to_owned())),
            Err(e) => Err(self.garbage(what, e.to_string())),
        }
    }

    /// GETs `url`, following same-origin redirects, within one deadline from `started`: the
    /// status and body of the last answer.
    fn follow(
        &mut self,
        mut url: String,
        what: &str,
        started: Instant,
    ) -> Result<(u16, Vec<u8>), ApiError> {
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
            let answer = request
                .call()
                .and_then(|mut answer| {
                    if let Some(location) = redirect_location(&answer) {
                        return Ok(Answer::Redirect(location));
                    }
                    let status = answer.status().as_u16();
                    let body = answer
                        .body_mut()
                        .with_config()
                        .limit(self.max_answer_bytes)
                        .read_to_vec()?;
                    Ok(Answer::Body(status, body))
                })
                .map_err(|e| self.transport_error(e, what))?;
            let location = match answer {
                Answer::Body(status, body) => return Ok((status, body)),
                Answer::Redirect(location) => location,
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

/// What one request brought back: a body, or where to look instead.
enum Answer {
    Body(u16, Vec<u8>),
    Redirect(String),
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

    #[test]
    fn a_url_without_a_scheme_is_refused() {
        let e = Client::new(&Access::new("prom:9090")).err();
        assert!(matches!(e, Some(ApiError::Setup(_))), "{e:?}");
    }
}
