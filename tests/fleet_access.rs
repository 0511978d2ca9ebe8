//! `gpudiag fleet` reaching Prometheus: what it sends (basic auth, a bearer token, a tenant
//! header), and what it does when the other end is down, silent, refuses or answers garbage:
//! one line on stderr and exit code 3, with `--json` still printing a document that says why;
//! never a hang. Then a real Prometheus behind TLS with client certificates and basic auth.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fake_http::{self, Answer, response};
use crate::support::prometheus_api::{free_port, start_prometheus};
use crate::support::tool;

fn fleet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .arg("fleet")
        .args(args)
        .env_remove("GPUDIAG_PROMETHEUS_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `fleet --json` against `url`: the exit code, the document and stderr.
fn fleet_json(url: &str, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["--json", "--prometheus", url];
    if !extra.contains(&"--query-timeout") {
        args.extend(["--query-timeout", "2s"]);
    }
    args.extend_from_slice(extra);
    let out = fleet(&args);
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.code().unwrap_or(-1), doc, stderr(&out))
}

fn assert_one_clear_line(err: &str, needle: &str) {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {err:?}");
    assert!(lines[0].contains(needle), "{needle:?} in {err:?}");
    assert!(!err.contains('\x1b'), "no terminal escapes: {err:?}");
}

/// An empty but valid answer: the fleet has no GPU series.
const EMPTY_VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

#[test]
fn a_prometheus_that_cannot_be_read_is_one_line_and_exit_code_3() {
    let closed = format!("http://127.0.0.1:{}", free_port());
    let garbage = fake_http::start(|_| response("200 OK", "text/plain", "hello, world"));
    let proxy = fake_http::start(|_| {
        response(
            "502 Bad Gateway",
            "text/html",
            "<html><body>\x1b[31mBad gateway</body></html>",
        )
    });
    let not_http = fake_http::start(|_| Answer::Bytes(b"SSH-2.0-OpenSSH_9.2\r\n".to_vec()));
    let wrong_shape = fake_http::start(|_| {
        response(
            "200 OK",
            "application/json",
            r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
        )
    });
    let bad_query = fake_http::start(|_| {
        response(
            "400 Bad Request",
            "application/json",
            r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
        )
    });
    let cases: [(&str, String, &str); 6] = [
        ("down", closed, "cannot reach Prometheus"),
        (
            "garbage",
            format!("http://{}", garbage.addr),
            "not the Prometheus API",
        ),
        (
            "a proxy's error page",
            format!("http://{}", proxy.addr),
            "HTTP 502",
        ),
        (
            "not HTTP",
            format!("http://{}", not_http.addr),
            "Prometheus",
        ),
        (
            "a matrix for an instant query",
            format!("http://{}", wrong_shape.addr),
            "a matrix result",
        ),
        (
            "a refused query",
            format!("http://{}", bad_query.addr),
            "bad_data: parse error",
        ),
    ];
    for (what, url, needle) in cases {
        let (code, doc, err) = fleet_json(&url, &[]);
        assert_eq!(code, 3, "{what}: {err}");
        assert_eq!(doc["status"], "could_not_run", "{what}");
        let why = doc["could_not_run"].as_str().unwrap();
        assert!(why.contains(needle), "{what}: {why}");
        assert!(
            !why.contains('\x1b') && !why.contains('\n'),
            "{what}: {why:?}"
        );
        assert_one_clear_line(&err, needle);
        // Without --json (a pipe): the same line, the same code.
        let out = fleet(&["--prometheus", &url, "--query-timeout", "2s"]);
        assert_eq!(out.status.code(), Some(3), "{what}");
        assert!(stderr(&out).contains(needle), "{what}: {}", stderr(&out));
    }
}

#[test]
fn a_silent_prometheus_times_out_within_the_query_timeout() {
    let silent = fake_http::start(|_| Answer::Silence(Duration::from_secs(30)));
    let started = Instant::now();
    let (code, doc, err) = fleet_json(
        &format!("http://{}", silent.addr),
        &["--query-timeout", "1s"],
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(code, 3);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("did not answer within 1 s"),
        "{doc}"
    );
    assert_one_clear_line(&err, "--query-timeout");
}

#[test]
fn credentials_and_tenant_headers_are_sent_and_never_shown() {
    let server = fake_http::start(|_| response("200 OK", "application/json", EMPTY_VECTOR));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let url = format!("http://{}/prefix/", server.addr);
    let (code, doc, _) = fleet_json(
        &url,
        &[
            "--bearer-token-file",
            token.to_str().unwrap(),
            "--header",
            "X-Scope-OrgID: tenant-a",
        ],
    );
    // Nothing under the selector: could not run, but everything was asked properly.
    assert_eq!(code, 3);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("holds no GPU series"),
        "{doc}"
    );
    let requests = server.requests.lock().unwrap().clone();
    assert!(!requests.is_empty());
    for r in &requests {
        assert!(r.starts_with("GET /prefix/api/v1/"), "{r}");
        let lower = r.to_ascii_lowercase();
        assert!(
            lower.contains("\r\nauthorization: bearer s3cret-token\r\n"),
            "{r}"
        );
        assert!(lower.contains("\r\nx-scope-orgid: tenant-a\r\n"), "{r}");
    }

    // user:password in the URL is basic auth, and the URL is shown without it.
    let url = format!("http://al%40ce:pa%3Ass@{}", server.addr);
    let (_, doc, err) = fleet_json(&url, &[]);
    assert!(
        !doc.to_string().contains("pa:ss") && !doc.to_string().contains("pa%3Ass"),
        "{doc}"
    );
    assert!(!err.contains("pa%3Ass"), "{err}");
    let last = server.requests.lock().unwrap().last().cloned().unwrap();
    // base64("al@ce:pa:ss")
    assert!(
        last.to_ascii_lowercase().contains("authorization: basic ")
            && last.contains("YWxAY2U6cGE6c3M="),
        "{last}"
    );
}

#[test]
fn bad_access_flags_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let cases: [(Vec<&str>, &str); 6] = [
        (vec!["--prometheus", "prom:9090"], "http:// or https://"),
        (
            vec![
                "--prometheus",
                "http://x",
                "--ca-file",
                not_pem.to_str().unwrap(),
            ],
            "--ca-file",
        ),
        (
            vec![
                "--prometheus",
                "http://x",
                "--bearer-token-file",
                empty.to_str().unwrap(),
            ],
            "empty",
        ),
        (
            vec![
                "--prometheus",
                "http://x",
                "--bearer-token-file",
                "/nonexistent/token",
            ],
            "--bearer-token-file",
        ),
        (
            vec!["--prometheus", "http://x", "--selector", "{a=b}"],
            "bad selector",
        ),
        (
            vec!["--prometheus", "http://x", "--header", "no colon"],
            "NAME: VALUE",
        ),
    ];
    for (args, needle) in cases {
        let out = fleet(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    for bad in [
        vec!["--prometheus", "http://x", "--at", "yesterday"],
        vec!["--prometheus", "http://x", "--interval", "10ms"],
        vec![
            "--prometheus",
            "http://x",
            "--basic-auth-password-file",
            "p",
        ],
    ] {
        assert_eq!(fleet(&bad).status.code(), Some(2), "{bad:?}");
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
fn pki(dir: &std::path::Path) -> [PathBuf; 5] {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "fleet test CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf = |names: Vec<String>, usage| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(names).unwrap();
        p.extended_key_usages = vec![usage];
        (p.signed_by(&key, &issuer).unwrap(), key)
    };
    let (server, server_key) = leaf(
        vec!["localhost".into(), "127.0.0.1".into()],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client, client_key) = leaf(
        vec!["gpudiag".into()],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    );
    let files = [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.pem", client.pem()),
        ("client.key", client_key.serialize_pem()),
    ];
    files.map(|(name, text)| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    })
}

/// A real Prometheus that wants TLS, a client certificate signed by its CA, and a password:
/// without any of them the fleet cannot read it; with all of them it reads it (an empty one:
/// no targets, so "holds no GPU series").
#[test]
#[ignore = "needs prometheus; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn a_real_prometheus_behind_tls_client_certificates_and_basic_auth() {
    let prometheus = tool("prometheus");
    let dir = tempfile::tempdir().unwrap();
    let [ca, server, server_key, client, client_key] = pki(dir.path());
    let hash = bcrypt::hash("fleet-pass", 4).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\nbasic_auth_users:\n  admin: {hash}\n",
            server.display(),
            server_key.display(),
            ca.display()
        ),
    )
    .unwrap();
    let (_prometheus, addr) = start_prometheus(
        &prometheus,
        dir.path(),
        "global:\n  scrape_interval: 15s\n",
        "data",
        &[format!("--web.config.file={}", web.display())],
    );
    let password = dir.path().join("password");
    std::fs::write(&password, "fleet-pass\n").unwrap();
    let url = format!("https://{addr}");
    let (ca, client, client_key, password) = (
        ca.to_str().unwrap(),
        client.to_str().unwrap(),
        client_key.to_str().unwrap(),
        password.to_str().unwrap(),
    );
    let all = [
        "--ca-file",
        ca,
        "--client-cert",
        client,
        "--client-key",
        client_key,
        "--basic-auth-user",
        "admin",
        "--basic-auth-password-file",
        password,
    ];
    // Prometheus takes a moment to listen.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (code, doc, _) = loop {
        let got = fleet_json(&url, &all);
        let why = got.1["could_not_run"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if why.contains("holds no GPU series") || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(code, 3);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("holds no GPU series"),
        "with every credential the fleet is read: {doc}"
    );
    // Without the CA: the bundled public roots do not know it.
    let (code, doc, _) = fleet_json(&url, &all[2..]);
    assert_eq!(code, 3);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("cannot reach"),
        "{doc}"
    );
    // Without the client certificate: the handshake is refused.
    let mut no_cert = all[..2].to_vec();
    no_cert.extend_from_slice(&all[6..]);
    let (_, doc, _) = fleet_json(&url, &no_cert);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("cannot reach"),
        "{doc}"
    );
    // Without the password: 401, with a hint.
    let (_, doc, _) = fleet_json(&url, &all[..6]);
    let why = doc["could_not_run"].as_str().unwrap();
    assert!(
        why.contains("HTTP 401") && why.contains("--basic-auth-user"),
        "{why}"
    );
}

/// Labels and alert text are whatever the scraped exporters wrote: terminal escapes, newlines
/// and long strings in a node name or a summary reach neither the terminal nor a second line.
#[test]
fn hostile_labels_and_alerts_are_printed_harmlessly() {
    let evil = "\\u001b]0;pwned\\u0007node\\u001b[2J\\nx";
    let series = format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","Hostname":"{evil}","UUID":"GPU-{long}","gpu":"0","modelName":"{evil}","instance":"i:1","job":"j"}},"value":[1,"50"]}}]}}}}"#,
        long = "x".repeat(5000)
    );
    let alerts = format!(
        r#"{{"status":"success","data":{{"alerts":[{{"labels":{{"alertname":"GpuLost","Hostname":"{evil}","severity":"fail"}},"annotations":{{"summary":"{evil}"}},"state":"firing","activeAt":"2026-11-26T10:00:00Z"}}]}}}}"#
    );
    let server = fake_http::start(move |head| {
        let body = if head.starts_with("GET /api/v1/alerts") {
            alerts.clone()
        } else if head.contains("DCGM_FI_DEV_GPU_UTIL") {
            series.clone()
        } else if head.starts_with("GET /api/v1/rules") {
            r#"{"status":"success","data":{"groups":[]}}"#.to_owned()
        } else {
            EMPTY_VECTOR.to_owned()
        };
        response("200 OK", "application/json", &body)
    });
    let url = format!("http://{}", server.addr);
    let (code, doc, _) = fleet_json(&url, &["--fail-on", "fail"]);
    assert_eq!(code, 1, "the GpuLost alert fails: {doc}");
    assert_eq!(doc["counts"]["gpus"], 1);
    assert_eq!(doc["nodes"][0]["alerts"][0]["name"], "GpuLost");
    let out = fleet(&["--prometheus", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains('\x1b') && !text.contains('\x07'),
        "escapes reached the terminal: {text:?}"
    );
    assert!(
        text.lines().all(|l| !l.starts_with('x')),
        "a newline in a label started a line: {text}"
    );
}

/// A 307 to another host:port must not carry the user's headers or credentials there: the
/// fleet refuses to follow it, names the target, and exits 3. A redirect within the same
/// origin is followed with every header, and a loop ends.
#[test]
fn a_redirect_to_another_origin_carries_no_credentials() {
    let elsewhere = fake_http::start(|_| response("200 OK", "application/json", EMPTY_VECTOR));
    let target = format!("http://{}", elsewhere.addr);
    let to = target.clone();
    let redirector = fake_http::start(move |head| {
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        Answer::Bytes(
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .into_bytes(),
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let credentials = [
        "--bearer-token-file",
        token.to_str().unwrap(),
        "--header",
        "X-Api-Key: key-4711",
        "--header",
        "X-Scope-OrgID: tenant-a",
        "--header",
        "Cookie: session=cookie-4711",
    ];
    let (code, doc, err) = fleet_json(&format!("http://{}", redirector.addr), &credentials);
    let leaked: Vec<String> = elsewhere
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| {
            ["s3cret-token", "key-4711", "tenant-a", "cookie-4711"]
                .iter()
                .any(|secret| r.contains(secret))
        })
        .cloned()
        .collect();
    assert!(
        leaked.is_empty(),
        "credentials reached {target}: {leaked:?}"
    );
    assert_eq!(code, 3, "{err}");
    let why = doc["could_not_run"].as_str().unwrap();
    assert!(
        why.contains("redirected") && why.contains(&target) && why.contains("--prometheus"),
        "{why}"
    );
    assert_one_clear_line(&err, &target);
    // The sent requests all went to the URL given, with the credentials.
    for r in redirector.requests.lock().unwrap().iter() {
        assert!(r.contains("key-4711") && r.contains("s3cret-token"), "{r}");
    }

    // Given the target itself, the user says where the credentials go.
    let (_, doc, _) = fleet_json(&target, &credentials);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("holds no GPU series"),
        "{doc}"
    );

    // The same origin under another path (a proxy that moved its prefix): followed, and the
    // moved request carries every header.
    let moving = fake_http::start(|head| {
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        if path.starts_with("/moved/") {
            response("200 OK", "application/json", EMPTY_VECTOR)
        } else {
            Answer::Bytes(
                format!(
                    "HTTP/1.1 308 Permanent Redirect\r\nLocation: /moved{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .into_bytes(),
            )
        }
    });
    let (code, doc, _) = fleet_json(&format!("http://{}", moving.addr), &credentials);
    assert_eq!(code, 3);
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("holds no GPU series"),
        "{doc}"
    );
    let moved: Vec<String> = moving
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.starts_with("GET /moved/"))
        .cloned()
        .collect();
    assert!(!moved.is_empty());
    for r in &moved {
        let lower = r.to_ascii_lowercase();
        assert!(
            lower.contains("\r\nauthorization: bearer s3cret-token\r\n")
                && lower.contains("\r\nx-api-key: key-4711\r\n"),
            "{r}"
        );
    }

    // A redirect to itself ends.
    let looping = fake_http::start(|head| {
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        Answer::Bytes(
            format!(
                "HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .into_bytes(),
        )
    });
    let (code, doc, err) = fleet_json(&format!("http://{}", looping.addr), &[]);
    assert_eq!(code, 3, "{err}");
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("redirect loop"),
        "{doc}"
    );
}

/// An instant answer of `series`, each a GPU utilisation series whose labels are all ones the
/// fleet keeps (the most it can be made to hold per byte received).
fn vector_of(series: usize) -> Vec<u8> {
    let mut body = String::from(r#"{"status":"success","data":{"resultType":"vector","result":["#);
    for i in 0..series {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","Hostname":"node-{n:06}","UUID":"GPU-{i:012}","gpu":"{g}","instance":"node-{n:06}:9835","job":"gpudiag"}},"value":[1,"50"]}}"#,
            n = i / 8,
            g = i % 8
        ));
    }
    body.push_str("]}}");
    body.into_bytes()
}

/// `gpudiag fleet` with `args`, its peak resident memory (MiB) taken from its own rusage:
/// the exit code, stdout and the peak.
// The child is reaped by `wait4`, which also gives its rusage (`Child::wait` gives no rusage).
#[allow(clippy::zombie_processes)]
fn fleet_peak_rss(args: &[&str]) -> (i32, Vec<u8>, f64) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpudiag"))
        .arg("fleet")
        .args(args)
        .env_remove("GPUDIAG_PROMETHEUS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).unwrap();
        out
    });
    let pid = child.id() as libc::pid_t;
    // SAFETY: wait4 fills the status and rusage it is given; zeroed is a valid rusage.
    let (status, usage) = unsafe {
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        (status, usage)
    };
    let out = reader.join().unwrap();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, out, usage.ru_maxrss as f64 / 1024.0)
}

/// Every core query answered with 40 MiB of series the fleet keeps, four at once: the whole
/// read stays under 128 MB (it held each answer whole, and its copy, and every series: gigabytes),
/// and a fleet larger than one look keeps is exit 3 asking for a narrower selector.
#[test]
fn a_prometheus_answering_at_the_cap_is_read_within_128_mb() {
    // Built on the first request, after gpudiag started: Linux counts a parent's resident set
    // into its child's peak at exec, and this test would then hold the answer.
    let body: std::sync::Arc<std::sync::OnceLock<Vec<u8>>> = Default::default();
    let server = fake_http::start(move |path| {
        if !path.starts_with("GET /api/v1/query?") {
            return response("200 OK", "application/json", EMPTY_VECTOR);
        }
        let body = body.get_or_init(|| vector_of(250_000));
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        Answer::Bytes(answer)
    });
    let url = format!("http://{}", server.addr);
    let (code, out, peak_mib) =
        fleet_peak_rss(&["--json", "--prometheus", &url, "--query-timeout", "60s"]);
    assert!(
        vector_of(250_000).len() > 40 << 20,
        "each answer is over 40 MiB"
    );
    let doc: Value = serde_json::from_slice(&out).unwrap();
    eprintln!("peak RSS {peak_mib:.0} MiB: {}", doc["could_not_run"]);
    assert!(peak_mib * 1.048_576 <= 128.0, "peak RSS {peak_mib:.0} MiB");
    assert_eq!(code, 3, "{doc}");
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("narrow --selector"),
        "{doc}"
    );
}

/// 5,000 firing alerts on one GPU: the worst 1,000 are read and listed, and the document and
/// the text say how many were left out.
#[test]
fn alerts_past_the_cap_are_left_out_and_counted() {
    let gpu = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","Hostname":"node-0","UUID":"GPU-0","gpu":"0","instance":"node-0:9835","job":"gpudiag"},"value":[1,"50"]}]}}"#;
    let alerts: Vec<String> = (0..5000)
        .map(|i| {
            // One in five is critical: those are the ones kept.
            let severity = if i % 5 == 0 { "critical" } else { "warning" };
            format!(
                r#"{{"labels":{{"alertname":"GpuAlert{i}","severity":"{severity}","Hostname":"node-0","UUID":"GPU-0","gpu":"0","rule_group":"g{i}"}},"annotations":{{"summary":"alert {i}","description":"not read"}},"state":"firing","activeAt":"2026-11-27T10:00:00Z","value":"1e+00"}}"#
            )
        })
        .collect();
    let alerts = format!(
        r#"{{"status":"success","data":{{"alerts":[{}]}}}}"#,
        alerts.join(",")
    );
    let server = fake_http::start(move |head| {
        let body = if head.starts_with("GET /api/v1/alerts") {
            alerts.as_str()
        } else if head.contains("DCGM_FI_DEV_GPU_UTIL") {
            gpu
        } else if head.starts_with("GET /api/v1/rules") {
            r#"{"status":"success","data":{"groups":[]}}"#
        } else {
            EMPTY_VECTOR
        };
        response("200 OK", "application/json", body)
    });
    let url = format!("http://{}", server.addr);
    let (code, doc, _) = fleet_json(&url, &[]);
    assert_eq!(code, 1, "the critical alerts fail: {doc}");
    let listed = doc["nodes"][0]["gpus"][0]["alerts"].as_array().unwrap();
    assert_eq!(listed.len(), 1000);
    assert!(
        listed.iter().all(|a| a["severity"] == "fail"),
        "the worst are kept"
    );
    assert_eq!(doc["left_out"]["alerts"], 4000, "{}", doc["left_out"]);
    assert_eq!(doc["counts"]["alerts_firing"], 1000);
    assert!(doc["findings"].as_array().unwrap().len() <= 1000);
    let said = doc["degraded"].to_string();
    assert!(
        said.contains("Prometheus holds 5000") && said.contains("4000 left out"),
        "{said}"
    );

    let out = fleet(&["--prometheus", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("note: alerts: Prometheus holds 5000;") && text.contains("4000 left out"),
        "{text}"
    );
}

/// More GPUs than one look reads (16,384) is exit 3 asking for a narrower selector, however
/// little memory their series take.
#[test]
fn more_gpus_than_a_look_reads_is_exit_3() {
    let device = String::from_utf8(vector_of(16_385)).unwrap();
    let server = fake_http::start(move |head| {
        let body = if head.contains("DCGM_FI_DEV_GPU_UTIL") {
            device.as_str()
        } else if head.starts_with("GET /api/v1/rules") {
            r#"{"status":"success","data":{"groups":[]}}"#
        } else if head.starts_with("GET /api/v1/alerts") {
            r#"{"status":"success","data":{"alerts":[]}}"#
        } else {
            EMPTY_VECTOR
        };
        response("200 OK", "application/json", body)
    });
    let (code, doc, err) = fleet_json(&format!("http://{}", server.addr), &[]);
    assert_eq!(code, 3, "{err}");
    assert!(
        doc["could_not_run"]
            .as_str()
            .unwrap()
            .contains("more than 16384 GPUs under the selector"),
        "{doc}"
    );
}
