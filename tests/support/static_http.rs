//! A loopback HTTP server that answers every request with one fixed text exposition, standing in
//! for an exporter the tests cannot run (dcgm-exporter needs DCGM and a GPU), so that a real
//! Prometheus can scrape it. Stops on drop.
//!
//! `tests/fixtures/prometheus/dcgm-exporter.prom`, served by it, is dcgm-exporter 3.x/4.x's
//! exposition for one node of four A100-SXM4-80GB: the families of its default counters file
//! (`etc/default-counters.csv`) plus the DCP profiling fields, with their HELP and TYPE lines, the
//! exporter's label order (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`,
//! `DCGM_FI_DRIVER_VERSION`, then the pod mapping's `container`, `namespace`, `pod` on the two GPUs
//! a pod holds) and its value formats (`%d` for integer fields, `%f` for floating-point ones).
//! `DCGM_FI_DEV_XID_ERRORS` carries 4.x's `err_code` and `err_msg`. UUIDs and figures are made up.
// Each test binary that includes this uses a different part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct StaticHttp {
    /// `127.0.0.1:PORT`, as a scrape target.
    pub addr: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for StaticHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The accept loop blocks; a connection of our own wakes it to see the flag.
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `body` as `text/plain; version=0.0.4` to every GET on a free loopback port, one
/// connection at a time, each closed after its answer.
pub fn serve_text(body: String) -> StaticHttp {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    let addr = listener.local_addr().expect("a bound address").to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stopping.load(Ordering::SeqCst) {
                break;
            }
            if let Ok(conn) = conn {
                // A client that stalls or goes away costs one answer, not the server.
                let _ = answer(conn, &body);
            }
        }
    });
    StaticHttp {
        addr,
        stop,
        thread: Some(thread),
    }
}

fn answer(mut conn: TcpStream, body: &str) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers are read to their end so that closing does not reset a client still sending.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let (status, body) = if request.starts_with("GET ") {
        ("200 OK", body)
    } else {
        ("405 Method Not Allowed", "")
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}
