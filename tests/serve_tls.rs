//! `gpudiag serve --web.config.file`: TLS (certificates made here with rcgen) scraped by a real
//! rustls client, basic auth accepted and refused, client certificates, bad files refused with
//! exit code 2, and the warning for listening beyond loopback. Loopback only; durations only
//! keep a broken server from hanging the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::support::serve::{Served, serve};

const HANG: Duration = Duration::from_secs(20);

/// A CA, a server certificate for localhost and 127.0.0.1 and a client certificate, all
/// signed by the CA, written as PEM files into a temporary folder.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertificateDer<'static>,
    client: (CertificateDer<'static>, PrivateKeyDer<'static>),
    /// A client certificate from a CA the server does not know.
    stranger: (CertificateDer<'static>, PrivateKeyDer<'static>),
}

fn leaf(
    names: &[&str],
    usage: rcgen::ExtendedKeyUsagePurpose,
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.extended_key_usages = vec![usage];
    (params.signed_by(&key, issuer).unwrap(), key)
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    (cert, rcgen::Issuer::new(params, key))
}

fn der_key(k: &rcgen::KeyPair) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(k.serialize_der().into())
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let (ca_cert, issuer) = ca("gpudiag test CA");
    let (server, server_key) = leaf(
        &["localhost", "127.0.0.1"],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        &issuer,
    );
    let (client, client_key) = leaf(
        &["prometheus"],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        &issuer,
    );
    let (_, other_issuer) = ca("someone else's CA");
    let (stranger, stranger_key) = leaf(
        &["prometheus"],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        &other_issuer,
    );
    std::fs::write(dir.path().join("server.crt"), server.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), server_key.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca_cert.pem()).unwrap();
    Pki {
        dir,
        ca: ca_cert.der().clone(),
        client: (client.der().clone(), der_key(&client_key)),
        stranger: (stranger.der().clone(), der_key(&stranger_key)),
    }
}

impl Pki {
    /// Writes a web config next to the certificates (so relative names resolve there).
    fn config(&self, text: &str) -> PathBuf {
        let path = self.dir.path().join("web-config.yml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn client(
        &self,
        cert: Option<&(CertificateDer<'static>, PrivateKeyDer<'static>)>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
        Arc::new(match cert {
            Some((c, k)) => builder
                .with_client_auth_cert(vec![c.clone()], k.clone_key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        })
    }
}

const ALL_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// One GET /metrics over TLS; the whole answer, or the error that ended the exchange.
fn https_get(
    addr: &str,
    client: Arc<rustls::ClientConfig>,
    credentials: Option<(&str, &str)>,
) -> std::io::Result<String> {
    let sock = TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(HANG))?;
    sock.set_write_timeout(Some(HANG))?;
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(client, name).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let auth = credentials.map_or(String::new(), |(u, p)| {
        format!(
            "Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    });
    write!(
        tls,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n"
    )?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"))
}

/// Scrapes until the demo's first samples are served.
fn wait_for_samples(
    served: &Served,
    client: &Arc<rustls::ClientConfig>,
    creds: Option<(&str, &str)>,
) {
    let start = Instant::now();
    loop {
        if let Ok(a) = https_get(&served.addr, client.clone(), creds)
            && a.contains("DCGM_FI_DEV_GPU_UTIL")
        {
            return;
        }
        assert!(start.elapsed() < HANG, "no samples served over TLS");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn users(user: &str, password: &str) -> String {
    // Cost 4, the least bcrypt allows: the test checks the scheme, not the work factor.
    let hash = bcrypt::hash(password, 4).unwrap();
    format!("basic_auth_users:\n  {user}: '{hash}'\n")
}

#[test]
fn tls_scrape_with_basic_auth_accepts_the_password_and_refuses_the_rest() {
    let pki = pki();
    let config = pki.config(&format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{}",
        users("prometheus", "s3cret")
    ));
    let served = serve(&["--demo", "--web.config.file", config.to_str().unwrap()]);
    let client = pki.client(None, ALL_VERSIONS);
    let good = Some(("prometheus", "s3cret"));
    wait_for_samples(&served, &client, good);

    let ok = https_get(&served.addr, client.clone(), good).unwrap();
    assert_eq!(status(&ok), 200, "{ok}");
    assert!(ok.contains("modelName=\"NVIDIA H200\""), "{ok}");

    for creds in [
        None,
        Some(("prometheus", "wrong")),
        Some(("nobody", "s3cret")),
    ] {
        let refused = https_get(&served.addr, client.clone(), creds).unwrap();
        assert_eq!(status(&refused), 401, "{creds:?}: {refused}");
        assert!(
            refused.contains("\r\nWWW-Authenticate: Basic"),
            "{creds:?}: {refused}"
        );
        assert!(!refused.contains("DCGM_"), "{refused}");
    }

    // TLS 1.2 is still offered by default (exporter-toolkit's minimum).
    let tls12 = pki.client(None, &[&rustls::version::TLS12]);
    assert_eq!(status(&https_get(&served.addr, tls12, good).unwrap()), 200);

    // Plain HTTP on the TLS port gets no HTTP answer, and the server goes on serving.
    let mut plain = TcpStream::connect(&served.addr).unwrap();
    plain.set_read_timeout(Some(HANG)).unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(
        !out.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(status(&https_get(&served.addr, client, good).unwrap()), 200);
}

#[test]
fn client_certificates_are_verified_against_the_client_ca() {
    let pki = pki();
    let config = pki.config(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  \
         min_version: TLS13\n",
    );
    let served = serve(&["--demo", "--web.config.file", config.to_str().unwrap()]);
    let with_cert = pki.client(Some(&pki.client), ALL_VERSIONS);
    wait_for_samples(&served, &with_cert, None);
    for (what, client) in [
        ("no client certificate", pki.client(None, ALL_VERSIONS)),
        (
            "a certificate of another CA",
            pki.client(Some(&pki.stranger), ALL_VERSIONS),
        ),
        (
            "TLS 1.2 below min_version",
            pki.client(Some(&pki.client), &[&rustls::version::TLS12]),
        ),
    ] {
        let answer = https_get(&served.addr, client, None);
        assert!(
            answer.as_ref().is_err() || !answer.as_ref().unwrap().starts_with("HTTP/"),
            "{what}: {answer:?}"
        );
    }
    assert_eq!(
        status(&https_get(&served.addr, with_cert, None).unwrap()),
        200
    );
}

#[test]
fn silent_and_half_handshakes_do_not_hold_up_a_tls_scrape() {
    let pki = pki();
    let config =
        pki.config("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n");
    let served = serve(&["--demo", "--web.config.file", config.to_str().unwrap()]);
    let client = pki.client(None, ALL_VERSIONS);
    wait_for_samples(&served, &client, None);
    let mut idle = Vec::new();
    for i in 0..40 {
        let mut c = TcpStream::connect(&served.addr).unwrap();
        if i % 2 == 0 {
            // The start of a TLS record that never completes.
            c.write_all(&[0x16, 0x03, 0x01, 0x02]).unwrap();
        }
        idle.push(c);
    }
    let start = Instant::now();
    let answer = https_get(&served.addr, client, None).unwrap();
    assert_eq!(status(&answer), 200);
    // Well under the 5 s the idle ones may hold their descriptors.
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn basic_auth_works_without_tls_too() {
    let pki = pki();
    let config = pki.config(&users("prom", "pw"));
    let served = serve(&["--demo", "--web.config.file", config.to_str().unwrap()]);
    let get = |auth: &str| {
        let mut c = TcpStream::connect(&served.addr).unwrap();
        c.set_read_timeout(Some(HANG)).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    let token = base64::engine::general_purpose::STANDARD.encode("prom:pw");
    let start = Instant::now();
    while !get(&format!("Authorization: Basic {token}\r\n")).contains("DCGM_FI_DEV_GPU_UTIL") {
        assert!(start.elapsed() < HANG, "no samples served");
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = get("");
    assert_eq!(status(&refused), 401, "{refused}");
    assert!(refused.contains("WWW-Authenticate: Basic"), "{refused}");
    // Even a path that does not exist says 401 first: nothing is learnt without the password.
    let mut c = TcpStream::connect(&served.addr).unwrap();
    c.write_all(b"GET /secret HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    assert_eq!(status(&out), 401, "{out}");
}

fn gpudiag_serve(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn bad_web_configs_exit_2_naming_the_problem() {
    let pki = pki();
    let cases: [(&str, &str); 5] = [
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: [TLS_AES_128_GCM_SHA256]}\n",
            "tls_server_config.cipher_suites is not supported",
        ),
        (
            "tls_server_config: {cert_file: missing.crt, key_file: server.key}\n",
            "missing.crt",
        ),
        (
            "tls_server_config: {cert_file: server.key, key_file: server.key}\n",
            "no PEM certificate",
        ),
        ("basic_auth_users: {prom: plaintext}\n", "not a bcrypt hash"),
        ("basic_auth_user: {}\n", "unknown key basic_auth_user"),
    ];
    for (text, needle) in cases {
        let config = pki.config(text);
        let out = gpudiag_serve(&[
            "--demo",
            "--listen",
            "127.0.0.1:0",
            "--web.config.file",
            config.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(needle), "{text}: {err}");
        assert!(err.contains("web-config.yml"), "{text}: {err}");
    }
    let out = gpudiag_serve(&["--demo", "--web.config.file", "/nonexistent/web.yml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/web.yml"));
}

#[test]
fn listening_beyond_loopback_warns_what_is_exposed() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .args(["serve", "--demo", "--listen", "0.0.0.0:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        lines.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines[0].contains("serving metrics on http://0.0.0.0:"),
        "{lines:?}"
    );
    let warning = &lines[1];
    for needle in [
        "warning",
        "every network interface",
        "UUID",
        "--web.config.file",
    ] {
        assert!(warning.contains(needle), "{needle}: {warning}");
    }
}
