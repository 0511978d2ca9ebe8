//! The process's one handler for SIGINT, SIGTERM and SIGHUP. ctrlc allows one handler per
//! process, so `main` makes one [`Stop`] and hands it to each command that must end cleanly on
//! those signals: captures and servers read its flag, the terminal UIs are woken through it to
//! restore the terminal.
//!
//! The handler is installed when a command first asks for it, not before: until then the
//! signals keep their default action, which ends a command that has nothing to finish (`check`
//! without probes, `config`) at once, as a user pressing Ctrl-C expects. `run` handles its
//! signals itself (see `commands::run`): it forwards seven of them to its command and tells a
//! terminal's Ctrl-C from a `kill`, which needs the signal's origin that ctrlc does not give.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

type Wake = Box<dyn Fn() + Send>;

/// The stop signal: a flag the signals set, and what else they wake.
#[derive(Clone, Default)]
pub struct Stop {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    flag: Arc<AtomicBool>,
    wake: Mutex<Vec<Wake>>,
    installed: OnceLock<()>,
}

impl Shared {
    fn signalled(&self) {
        self.flag.store(true, Ordering::Relaxed);
        for wake in self.wake.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            wake();
        }
    }
}

impl Stop {
    /// A stop signal not yet listened for: the signals keep their default action.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on the signals set the returned flag instead of ending the process.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.listen();
        self.shared.flag.clone()
    }

    /// From now on the signals call `wake` (and set the flag) instead of ending the process.
    pub fn on_signal(&self, wake: impl Fn() + Send + 'static) {
        self.shared
            .wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(wake));
        self.listen();
    }

    fn listen(&self) {
        self.shared.installed.get_or_init(|| {
            let shared = self.shared.clone();
            // ctrlc calls this on a thread of its own, never inside the signal handler, so it
            // may lock and send.
            let _ = ctrlc::set_handler(move || shared.signalled());
        });
    }
}
