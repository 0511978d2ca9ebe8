//! `gpudiag serve`'s request path: the bytes a client sends, in the pieces the fuzzer picks,
//! answered as the connection handler answers them.
#![no_main]

use std::sync::{Arc, OnceLock, RwLock};

use libfuzzer_sys::fuzz_target;

use gpudiag::commands::serve::Exposition;
use gpudiag_http::server::{answer, response_bytes};
use gpudiag_telemetry::Backend;
use gpudiag_telemetry::replay::{Pace, ReplayBackend};
use gpudiag_export::prometheus::Snapshot;

/// The demo recording's last state, as a scrape would see it.
fn exposition() -> &'static Exposition {
    static EXPOSITION: OnceLock<Exposition> = OnceLock::new();
    EXPOSITION.get_or_init(|| {
        let mut replay =
            ReplayBackend::from_reader(gpudiag_core::session::DEMO_RECORDING, Pace::AsFastAsPossible)
                .expect("the demo recording reads");
        let mut snap = Snapshot {
            host: replay.host().clone(),
            devices: replay.devices().to_vec(),
            ..Snapshot::default()
        };
        while let Ok(tick) = replay.poll() {
            for s in tick.samples {
                snap.received.insert(s.device, std::time::Instant::now());
                snap.latest.insert(s.device, s);
            }
        }
        Exposition(Arc::new(RwLock::new(snap)))
    })
}

fuzz_target!(|data: &[u8]| {
    let exposition = exposition();
    // The first byte says where reads split the request; the handler asks after every read.
    let Some((&step, request)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut end = 0;
    while end < request.len() {
        end = (end + step).min(request.len());
        if let Some((status, ctype, body)) = answer(&request[..end], exposition) {
            assert!(
                matches!(status, 200 | 400 | 404 | 405 | 431),
                "unexpected status {status}"
            );
            let bytes = response_bytes(status, ctype, &body);
            assert!(bytes.starts_with(b"HTTP/1.1 "));
            return;
        }
    }
    // An incomplete head is only ever waited on while it is small.
    assert!(
        request.len() <= 16 * 1024,
        "unanswered {} bytes",
        request.len()
    );
});
