//! `gpudiag serve`'s HTTP/1.1 server: one route, `/metrics`, whose body the caller renders
//! ([`server::Metrics`]), so this crate knows HTTP and nothing of what the body says.
//! [`server`] accepts connections and reads request heads under fixed limits (a deadline per
//! exchange against slowloris clients, 431 for oversized heads, caps on pending and answering
//! connections, `HEAD`, absolute-form targets); [`web_config`] reads exporter-toolkit's
//! `--web.config.file` (TLS with rustls, basic auth with bcrypt hashes).
//!
//! Hand-written on std, httparse and rustls rather than on hyper: hyper's server needs an async
//! runtime, which would make tokio permanent for `serve`, while the only other async piece (the
//! kubelet client) sits behind the binary's optional `kubernetes` feature. tiny_http was tried
//! first and has no request timeouts ([`server`] says why that matters). The whole request path
//! short of the socket is a pure function, fuzzed by `fuzz/fuzz_targets/http_request.rs`.

pub mod server;
pub mod web_config;
