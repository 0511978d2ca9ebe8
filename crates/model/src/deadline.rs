//! Running a vendor call that may hang (a wedged driver) under a deadline.
//!
//! A blocking C call cannot be cancelled, so the call runs on its own thread and the caller
//! stops waiting at the deadline; the thread is left behind. That is acceptable for calls made
//! once (library initialisation) where the program reports the hang and exits or degrades.
//! Where the blocking call must stay on the caller's thread (CUDA work bound to its context), a
//! `Watchdog` acts instead when it outlives its bound.

use std::sync::mpsc;
use std::time::Duration;

/// The call did not finish in time (or its thread could not start / died).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeadlineError {
    #[error("did not finish within {0:?}")]
    TimedOut(Duration),
    #[error("could not start a thread for it: {0}")]
    Spawn(String),
    #[error("its thread stopped without an answer")]
    Died,
}

/// Runs `f` on a named thread and waits at most `deadline` for its result.
pub fn run_with_deadline<T: Send + 'static>(
    name: &str,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DeadlineError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // The caller may have stopped waiting; nothing to do about that.
            let _ = tx.send(f());
        })
        .map_err(|e| DeadlineError::Spawn(e.to_string()))?;
    match rx.recv_timeout(deadline) {
        Ok(v) => Ok(v),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(DeadlineError::TimedOut(deadline)),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(DeadlineError::Died),
    }
}

/// Waits at most `bound` for a thread to finish and joins it; past the bound the thread is left
/// behind (it may be inside a vendor call a sick driver holds) and `None` comes back.
pub fn join_within<T>(handle: std::thread::JoinHandle<T>, bound: Duration) -> Option<T> {
    if wait_until(bound, || handle.is_finished()) {
        handle.join().ok()
    } else {
        None
    }
}

/// Checks `done` until it holds or `bound` passes; true when it held. The pauses between checks
/// start at 50 µs and double up to 5 ms: a thread told to stop usually ends within a
/// millisecond, and a fixed 5 ms pause made every join at exit cost 5 ms (three of them in a
/// single-read `check`, which is held to a wall time of tens of milliseconds).
pub fn wait_until(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + bound;
    let mut pause = Duration::from_micros(50);
    loop {
        if done() {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Runs an action on its own thread if it is not dropped within its bound. Dropping it disarms
/// it without waiting.
pub struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    /// Arms a watchdog; `None` when no thread could be started (then nothing guards the work).
    pub fn arm(
        name: &str,
        bound: Duration,
        on_expiry: impl FnOnce() + Send + 'static,
    ) -> Option<Watchdog> {
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(bound) {
                    on_expiry();
                }
            })
            .ok()?;
        Some(Watchdog { _disarm: tx })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn wait_until_returns_soon_after_the_condition_holds() {
        let start = Instant::now();
        let until = start + Duration::from_millis(3);
        assert!(wait_until(Duration::from_secs(5), || Instant::now() >= until));
        // Pauses double from 50 µs: the check after 3 ms comes well before a fixed 5 ms step.
        assert!(start.elapsed() < Duration::from_secs(1));
        let start = Instant::now();
        assert!(!wait_until(Duration::from_millis(20), || false));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(20) && waited < Duration::from_secs(2));
    }

    #[test]
    fn join_within_joins_a_finished_thread_and_leaves_a_stuck_one() {
        let quick = std::thread::spawn(|| 7);
        assert_eq!(join_within(quick, Duration::from_secs(5)), Some(7));
        let start = Instant::now();
        let stuck = std::thread::spawn(|| std::thread::sleep(Duration::from_secs(30)));
        assert_eq!(join_within(stuck, Duration::from_millis(100)), None);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_watchdog_fires_when_outlived_and_not_when_dropped() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        let dog = Watchdog::arm("test-dog", Duration::from_millis(20), move || {
            f.store(true, Ordering::SeqCst);
        });
        assert!(dog.is_some());
        let start = Instant::now();
        while !fired.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(fired.load(Ordering::SeqCst));
        drop(dog);

        let (tx, rx) = mpsc::channel();
        let dog = Watchdog::arm("test-dog", Duration::from_millis(200), move || {
            let _ = tx.send(());
        });
        drop(dog);
        // Disarmed: the thread ends without acting, which closes the channel unanswered.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn a_quick_call_returns_its_value() {
        assert_eq!(
            run_with_deadline("quick", Duration::from_secs(5), || 42),
            Ok(42)
        );
    }

    #[test]
    fn a_hung_call_is_abandoned_at_the_deadline() {
        let start = Instant::now();
        let r = run_with_deadline("hung", Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(30));
        });
        assert_eq!(r, Err(DeadlineError::TimedOut(Duration::from_millis(100))));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_panicking_call_is_reported_not_propagated() {
        let r: Result<(), _> = run_with_deadline("panics", Duration::from_secs(5), || {
            panic!("vendor library crashed")
        });
        assert_eq!(r, Err(DeadlineError::Died));
    }
}
