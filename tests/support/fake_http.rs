//! A loopback HTTP server whose answers the test scripts: a fixed body, garbage, silence, or
//! anything else, with every request head it received kept for the test to read. Stops on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the server does with one request, given its head.
pub enum Answer {
    /// Writes these bytes, then closes.
    Bytes(Vec<u8>),
    /// Holds the connection open without a word for this long.
    Silence(Duration),
}

pub struct FakeHttp {
    pub addr: String,
    pub requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop.
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An HTTP/1.1 answer with this status line, content type and body.
pub fn response(status: &str, content_type: &str, body: &str) -> Answer {
    Answer::Bytes(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// Serves `body` as a Prometheus text exposition to every request: an exporter the tests
/// cannot run (dcgm-exporter needs DCGM and a GPU).
pub fn serve_text(body: String) -> FakeHttp {
    start(move |_| response("200 OK", "text/plain; version=0.0.4", &body))
}

/// Every request gets `answer(head)`.
pub fn start(answer: impl Fn(&str) -> Answer + Send + 'static) -> FakeHttp {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, stopped) = (requests.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stopped.load(Ordering::SeqCst) {
                break;
            }
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 64 << 10 {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            seen.lock().unwrap().push(head.clone());
            match answer(&head) {
                Answer::Bytes(b) => {
                    let _ = conn.write_all(&b);
                }
                Answer::Silence(d) => {
                    // Each silent connection waits on its own thread, so the next request
                    // (a retry) is still accepted.
                    std::thread::spawn(move || {
                        std::thread::sleep(d);
                        drop(conn);
                    });
                }
            }
        }
    });
    FakeHttp {
        addr,
        requests,
        stop,
        thread: Some(thread),
    }
}
