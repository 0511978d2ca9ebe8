//! `serve --web.config.file`: TLS and basic auth for /metrics, configured the way Prometheus
//! exporters are (prometheus/exporter-toolkit's `web-config.yml`), so one file and one habit
//! serve node_exporter, dcgm-exporter and gpudiag alike:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # PEM chain, leaf first; relative to this file
//!   key_file: server.key           # PEM private key (PKCS#8, PKCS#1 or SEC1)
//!   client_auth_type: RequireAndVerifyClientCert   # optional; NoClientCert by default
//!   client_ca_file: clients-ca.crt # optional; needed to verify client certificates
//!   min_version: TLS12             # optional: TLS12 (default) or TLS13; max_version likewise
//! basic_auth_users:
//!   prometheus: $2y$10$...         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! Keys exporter-toolkit knows but gpudiag does not implement (`cipher_suites`,
//! `http_server_config`, ...) are refused by name rather than ignored: a setting that silently
//! does nothing is how a host ends up less protected than its operator believes. TLS is rustls
//! over ring, built only when the file asks for it, so a plain `serve` pays nothing for it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_norway::Value;
use sha2::{Digest, Sha256};

/// Why a web config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file reads but asks for something wrong; the message names the file.
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

/// What a web config file asks for; both parts are optional, as in exporter-toolkit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WebConfig {
    pub tls: Option<TlsSettings>,
    /// User name to bcrypt hash; empty means no authentication.
    pub users: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_auth: ClientAuth,
    pub client_ca_file: Option<PathBuf>,
    pub min_version: TlsVersion,
    pub max_version: TlsVersion,
}

/// exporter-toolkit's (Go's) client certificate policies that verify what they accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// Keys gpudiag reads, and the ones exporter-toolkit has that gpudiag refuses, with why.
const TOP_KEYS: [&str; 2] = ["tls_server_config", "basic_auth_users"];
const TOP_UNSUPPORTED: [(&str, &str); 2] = [
    (
        "http_server_config",
        "gpudiag serves HTTP/1.1 only and sets no extra headers",
    ),
    ("rate_limit", "gpudiag bounds connections itself"),
];
const TLS_KEYS: [&str; 6] = [
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
];
const TLS_UNSUPPORTED: [(&str, &str); 7] = [
    ("cert", "give the certificate as cert_file"),
    ("key", "give the key as key_file"),
    ("client_ca", "give the client CA as client_ca_file"),
    (
        "cipher_suites",
        "rustls offers only its own safe suites and cannot be narrowed here",
    ),
    (
        "curve_preferences",
        "rustls picks among its own safe key exchanges",
    ),
    (
        "prefer_server_cipher_suites",
        "rustls always follows the server's order",
    ),
    (
        "client_allowed_sans",
        "certificates are checked against client_ca_file only",
    ),
];

impl WebConfig {
    /// Reads and checks a web config file; any problem names the file.
    pub fn load(path: &Path) -> Result<WebConfig, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new(""));
        WebConfig::parse(&text, base).map_err(|message| LoadError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses the YAML text; relative file names are taken relative to `base` (the config
    /// file's folder), as exporter-toolkit does.
    pub fn parse(text: &str, base: &Path) -> Result<WebConfig, String> {
        let root: Value =
            serde_norway::from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
        let top = match root {
            // An empty file asks for nothing, as in exporter-toolkit.
            Value::Null => return Ok(WebConfig::default()),
            Value::Mapping(m) => m,
            _ => {
                return Err(
                    "expected a mapping with tls_server_config and/or basic_auth_users".into(),
                );
            }
        };
        let top = keys_checked(top, "", &TOP_KEYS, &TOP_UNSUPPORTED)?;
        let mut config = WebConfig::default();
        if let Some(v) = top.get("tls_server_config") {
            config.tls = parse_tls(v, base)?;
        }
        if let Some(v) = top.get("basic_auth_users") {
            config.users = parse_users(v)?;
        }
        Ok(config)
    }

    /// The rustls server configuration, when TLS is configured; reads the certificate and
    /// key files.
    pub fn server_config(&self) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
        self.tls.as_ref().map(build_tls).transpose()
    }

    /// The basic-auth checker, when users are configured.
    pub fn basic_auth(&self) -> Option<BasicAuth> {
        (!self.users.is_empty()).then(|| BasicAuth::new(self.users.clone()))
    }
}

/// The mapping's entries by key, after refusing unknown keys and unsupported ones by name.
fn keys_checked(
    m: serde_norway::Mapping,
    prefix: &str,
    known: &[&str],
    unsupported: &[(&str, &str)],
) -> Result<BTreeMap<String, Value>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let Value::String(k) = k else {
            return Err(format!("{prefix}keys must be strings, not {k:?}"));
        };
        if let Some((_, why)) = unsupported.iter().find(|(u, _)| *u == k) {
            return Err(format!(
                "{prefix}{k} is not supported by gpudiag serve ({why}); remove it"
            ));
        }
        if !known.contains(&k.as_str()) {
            return Err(format!(
                "unknown key {prefix}{k}; gpudiag reads {}",
                known
                    .iter()
                    .map(|n| format!("{prefix}{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.insert(k, v);
    }
    Ok(out)
}

fn string(v: &Value, key: &str) -> Result<Option<String>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(format!("{key} must be a string, not {other:?}")),
    }
}

fn parse_tls(v: &Value, base: &Path) -> Result<Option<TlsSettings>, String> {
    let m = match v {
        Value::Null => return Ok(None),
        Value::Mapping(m) => m.clone(),
        other => {
            return Err(format!(
                "tls_server_config must be a mapping, not {other:?}"
            ));
        }
    };
    let m = keys_checked(m, "tls_server_config.", &TLS_KEYS, &TLS_UNSUPPORTED)?;
    let get = |k: &str| -> Result<Option<String>, String> {
        m.get(k)
            .map_or(Ok(None), |v| string(v, &format!("tls_server_config.{k}")))
    };
    let path = |k: &str| -> Result<Option<PathBuf>, String> { Ok(get(k)?.map(|p| base.join(p))) };
    let cert_file = path("cert_file")?
        .ok_or("tls_server_config needs cert_file (the server certificate, PEM)")?;
    let key_file =
        path("key_file")?.ok_or("tls_server_config needs key_file (its private key, PEM)")?;
    let client_ca_file = path("client_ca_file")?;
    let client_auth = match get("client_auth_type")?.as_deref() {
        // exporter-toolkit's default when a client CA is given.
        None if client_ca_file.is_some() => ClientAuth::RequireAndVerifyClientCert,
        None | Some("NoClientCert") => ClientAuth::NoClientCert,
        Some("VerifyClientCertIfGiven") => ClientAuth::VerifyClientCertIfGiven,
        Some("RequireAndVerifyClientCert") => ClientAuth::RequireAndVerifyClientCert,
        Some(t @ ("RequestClientCert" | "RequireAnyClientCert")) => {
            return Err(format!(
                "tls_server_config.client_auth_type {t} accepts client certificates without \
                 verifying them, which gpudiag does not do; use VerifyClientCertIfGiven or \
                 RequireAndVerifyClientCert with client_ca_file"
            ));
        }
        Some(other) => {
            return Err(format!(
                "tls_server_config.client_auth_type {other:?} is not one of NoClientCert, \
                 VerifyClientCertIfGiven, RequireAndVerifyClientCert"
            ));
        }
    };
    if client_auth != ClientAuth::NoClientCert && client_ca_file.is_none() {
        return Err(
            "tls_server_config.client_auth_type verifies client certificates, so it needs \
             client_ca_file (the CA that signed them)"
                .into(),
        );
    }
    let version = |k: &str, default: TlsVersion| -> Result<TlsVersion, String> {
        match get(k)?.as_deref() {
            None => Ok(default),
            Some("TLS12") => Ok(TlsVersion::Tls12),
            Some("TLS13") => Ok(TlsVersion::Tls13),
            Some(v @ ("TLS10" | "TLS11")) => Err(format!(
                "tls_server_config.{k} {v}: TLS 1.0 and 1.1 are broken and not offered; use \
                 TLS12 or TLS13"
            )),
            Some(v) => Err(format!(
                "tls_server_config.{k} {v:?} is not one of TLS12, TLS13"
            )),
        }
    };
    let min_version = version("min_version", TlsVersion::Tls12)?;
    let max_version = version("max_version", TlsVersion::Tls13)?;
    if min_version > max_version {
        return Err("tls_server_config.min_version is above max_version".into());
    }
    Ok(Some(TlsSettings {
        cert_file,
        key_file,
        client_auth,
        client_ca_file,
        min_version,
        max_version,
    }))
}

fn parse_users(v: &Value) -> Result<BTreeMap<String, String>, String> {
    let m = match v {
        Value::Null => return Ok(BTreeMap::new()),
        Value::Mapping(m) => m,
        other => {
            return Err(format!(
                "basic_auth_users must map user names to bcrypt hashes, not {other:?}"
            ));
        }
    };
    let mut users = BTreeMap::new();
    for (user, hash) in m {
        let user = match user {
            Value::String(u) => u.clone(),
            other => return Err(format!("basic_auth_users: {other:?} is not a user name")),
        };
        if user.contains(':') {
            return Err(format!(
                "basic_auth_users: user name {user:?} holds ':', which basic auth cannot carry"
            ));
        }
        let hash = match hash {
            Value::String(h) => h.clone(),
            other => {
                return Err(format!(
                    "basic_auth_users.{user} must be a bcrypt hash, not {other:?}"
                ));
            }
        };
        if hash.parse::<bcrypt::HashParts>().is_err() {
            return Err(format!(
                "basic_auth_users.{user} is not a bcrypt hash ($2y$..., as `htpasswd -nBC 10 \
                 USER` makes); passwords are never stored in clear"
            ));
        }
        users.insert(user, hash);
    }
    Ok(users)
}

fn build_tls(t: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| (t.min_version..=t.max_version).contains(v))
    .map(|(_, p)| p)
    .collect();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&t.cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cert_file {}: {e}", t.cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "cert_file {} holds no PEM certificate",
            t.cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&t.key_file)
        .map_err(|e| format!("key_file {}: {e}", t.key_file.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match (&t.client_ca_file, t.client_auth) {
        (
            Some(ca),
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert,
        ) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("client_ca_file {}: {e}", ca.display()))?;
            let (added, _) = roots.add_parsable_certificates(cas);
            if added == 0 {
                return Err(format!(
                    "client_ca_file {} holds no usable CA certificate",
                    ca.display()
                ));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = if t.client_auth == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("client_ca_file {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        format!(
            "cert_file {} and key_file {}: {e}",
            t.cert_file.display(),
            t.key_file.display()
        )
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks `Authorization: Basic` headers against the configured bcrypt hashes.
///
/// bcrypt is slow on purpose (tens of ms at cost 10), so a password already checked is
/// remembered by a SHA-256 of user, hash and password, as exporter-toolkit does: a scraper
/// every 15 s costs one bcrypt, not one per scrape. Checks run on the answering threads,
/// never on the thread that reads request heads.
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    no_user: String,
    checked: Mutex<HashMap<[u8; 32], bool>>,
}

/// Results remembered at most; past it the memory starts over (one bcrypt each again).
const CHECKED_MAX: usize = 1024;

impl BasicAuth {
    pub fn new(users: BTreeMap<String, String>) -> BasicAuth {
        // Checked for unknown users, at the configured cost, so that a wrong user name takes
        // as long as a wrong password and names cannot be probed by timing.
        let cost = users
            .values()
            .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
            .map(|h| h.get_cost())
            .max()
            .unwrap_or(bcrypt::DEFAULT_COST);
        let no_user = bcrypt::hash("no such user", cost).unwrap_or_default();
        BasicAuth {
            users,
            no_user,
            checked: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an `Authorization` header value carries a configured user's password.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (self.no_user.as_str(), false),
        };
        let key: [u8; 32] = Sha256::new()
            .chain_update(user.as_bytes())
            .chain_update([0])
            .chain_update(hash.as_bytes())
            .chain_update([0])
            .chain_update(password.as_bytes())
            .finalize()
            .into();
        let remembered = self
            .checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied();
        let ok = match remembered {
            Some(ok) => ok,
            None => {
                let ok = bcrypt::verify(&password, hash).unwrap_or(false) && known;
                let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
                if checked.len() >= CHECKED_MAX {
                    checked.clear();
                }
                checked.insert(key, ok);
                ok
            }
        };
        ok && known
    }
}

/// (user, password) from `Basic <base64(user:password)>`; the scheme is case-insensitive.
pub fn basic_credentials(header: &str) -> Option<(String, String)> {
    let (scheme, token) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WebConfig, String> {
        WebConfig::parse(text, Path::new("/etc/gpudiag"))
    }

    #[test]
    fn a_full_file_reads_with_paths_relative_to_it() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let c = parse(&format!(
            "tls_server_config:\n  cert_file: s.crt\n  key_file: /abs/s.key\n  \
             client_ca_file: ca.crt\n  min_version: TLS13\nbasic_auth_users:\n  prom: '{hash}'\n"
        ))
        .unwrap();
        let t = c.tls.unwrap();
        assert_eq!(t.cert_file, Path::new("/etc/gpudiag/s.crt"));
        assert_eq!(t.key_file, Path::new("/abs/s.key"));
        assert_eq!(
            t.client_ca_file.as_deref(),
            Some(Path::new("/etc/gpudiag/ca.crt"))
        );
        // A client CA without a policy means verify, as exporter-toolkit has it.
        assert_eq!(t.client_auth, ClientAuth::RequireAndVerifyClientCert);
        assert_eq!(t.min_version, TlsVersion::Tls13);
        assert_eq!(t.max_version, TlsVersion::Tls13);
        assert_eq!(c.users.get("prom"), Some(&hash));
        assert_eq!(parse("").unwrap(), WebConfig::default());
        assert!(parse("basic_auth_users:\n").unwrap().basic_auth().is_none());
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let colon = format!(
            "basic_auth_users: {{'a:b': '{}'}}\n",
            bcrypt::hash("pw", 4).unwrap()
        );
        let cases = [
            ("tls_server_config: [", "not valid YAML"),
            ("- a\n- b\n", "expected a mapping"),
            ("tls_server_confg: {}\n", "unknown key tls_server_confg"),
            (
                "http_server_config: {http2: false}\n",
                "http_server_config is not supported",
            ),
            ("tls_server_config: {key_file: k}\n", "needs cert_file"),
            ("tls_server_config: {cert_file: c}\n", "needs key_file"),
            (
                "tls_server_config: {cert_file: c, key_file: k, cipher_suites: [X]}\n",
                "tls_server_config.cipher_suites is not supported",
            ),
            (
                "tls_server_config: {cert_file: c, key_file: k, certfile: x}\n",
                "unknown key tls_server_config.certfile",
            ),
            (
                "tls_server_config: {cert_file: c, key_file: k, min_version: TLS10}\n",
                "TLS 1.0 and 1.1",
            ),
            (
                "tls_server_config: {cert_file: c, key_file: k, max_version: TLS99}\n",
                "not one of TLS12, TLS13",
            ),
            (
                "tls_server_config: {cert_file: c, key_file: k, min_version: TLS13, max_version: TLS12}\n",
                "above max_version",
            ),
            (
                "tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAnyClientCert, client_ca_file: ca}\n",
                "without verifying",
            ),
            (
                "tls_server_config: {cert_file: c, key_file: k, client_auth_type: RequireAndVerifyClientCert}\n",
                "needs client_ca_file",
            ),
            ("basic_auth_users: {prom: hunter2}\n", "not a bcrypt hash"),
            ("basic_auth_users: [prom]\n", "must map user names"),
            (colon.as_str(), "holds ':'"),
        ];
        for (text, needle) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn missing_certificate_files_are_named() {
        let c = parse("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n").unwrap();
        let e = c.server_config().unwrap_err();
        assert!(e.contains("/etc/gpudiag/nope.crt"), "{e}");
        assert!(WebConfig::default().server_config().unwrap().is_none());
    }

    #[test]
    fn basic_auth_takes_the_right_password_only() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new([("prom".to_owned(), hash)].into_iter().collect());
        let header = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert!(auth.allows(Some(&header("prom", "s3cret"))));
        // Remembered: the same answer again, from the cache.
        assert!(auth.allows(Some(&header("prom", "s3cret"))));
        assert!(auth.allows(Some(&header("prom", "s3cret").replace("Basic", "basic"))));
        assert!(!auth.allows(Some(&header("prom", "s3cret!"))));
        assert!(!auth.allows(Some(&header("other", "s3cret"))));
        assert!(!auth.allows(Some("Bearer abc")));
        assert!(!auth.allows(Some("Basic !!!")));
        assert!(!auth.allows(None));
        assert_eq!(
            basic_credentials("Basic cHJvbTpwOmFzcw=="),
            Some(("prom".into(), "p:ass".into()))
        );
    }
}
