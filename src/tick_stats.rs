//! `GPUDIAG_TICK_STATS=FILE`: where a run's time and memory go, written as JSON at exit.
//!
//! The counters are `gpudiag_model::stats`' (driver calls, process-list reads, pipeline and
//! redraw work, bytes to the terminal), plus heap allocations counted by this binary's global
//! allocator, the process's and each thread's CPU time (from `/proc/self/task`, threads named
//! `gpudiag-sampler`, `nvml-slow-0`, ...), and resident memory. `mark` notes a moment (the first
//! frame, the end of start-up) with the CPU used so far, so start-up and steady state separate.
//! Per-tick figures divide the counters by the ticks taken in.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use gpudiag_model::stats::{self, Counter};

/// The environment variable naming the file the figures go to.
pub const ENV: &str = "GPUDIAG_TICK_STATS";

/// The system allocator, counting allocations while the figures are on. Written by hand: the
/// count must include every thread's allocations at the cost of one atomic load while off, and
/// no allocator crate counts per process at that price.
pub struct CountingAlloc;

// SAFETY: every call goes straight to the system allocator with the same arguments; counting
// touches only atomics and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[inline]
fn count(bytes: usize) {
    if stats::enabled() {
        stats::add(Counter::Allocs, 1);
        stats::add(Counter::AllocBytes, bytes as u64);
    }
}

struct State {
    path: PathBuf,
    started: Instant,
    marks: Vec<serde_json::Value>,
    /// Each thread's CPU time, taken before the threads are stopped (`threads_now`).
    threads: Option<serde_json::Value>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> std::sync::MutexGuard<'static, Option<State>> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Turns the figures on when `GPUDIAG_TICK_STATS` names a file. Call first thing in `main`.
pub fn start_from_env() {
    let Some(path) = std::env::var_os(ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    stats::enable();
    stats::set_mark_hook(mark);
    *state() = Some(State {
        path: path.into(),
        started: Instant::now(),
        marks: Vec::new(),
        threads: None,
    });
}

/// Notes a moment by name, with the wall and CPU time since start and the counters so far.
pub fn mark(name: &str) {
    let mut guard = state();
    let Some(s) = guard.as_mut() else {
        return;
    };
    let (user, system) = process_cpu_s();
    s.marks.push(serde_json::json!({
        "name": name,
        "wall_s": s.started.elapsed().as_secs_f64(),
        "cpu_user_s": user,
        "cpu_system_s": system,
        "rss_kb": status_kb("VmRSS:"),
        "rss_kb_by_mapping": rss_by_mapping(),
        "counters": counters_json(),
    }));
}

/// Resident kB per mapped file (anonymous memory as `[anon]`, heap, stacks by name) from
/// `/proc/self/smaps`, largest first: which library or part of the binary the RSS is.
fn rss_by_mapping() -> serde_json::Value {
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps") else {
        return serde_json::Value::Null;
    };
    let mut by_name: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(kb) = line.strip_prefix("Rss:") {
            let kb: u64 = kb
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            *by_name.entry(current.clone()).or_default() += kb;
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-'))
        {
            // A mapping header: "start-end perms offset dev inode [path]".
            let path = line.split_whitespace().nth(5).unwrap_or("[anon]");
            current = path.rsplit('/').next().unwrap_or(path).to_owned();
        }
    }
    let mut sorted: Vec<(String, u64)> = by_name.into_iter().filter(|(_, kb)| *kb > 0).collect();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.1));
    serde_json::Value::Object(
        sorted
            .into_iter()
            .take(12)
            .map(|(n, kb)| (n, serde_json::json!(kb)))
            .collect(),
    )
}

/// Takes each live thread's CPU time now, before the UI stops its threads.
pub fn threads_now() {
    let mut guard = state();
    if let Some(s) = guard.as_mut() {
        s.threads = Some(thread_cpu());
    }
}

/// Writes the figures to the file named at start; a failure is said on stderr, never fatal.
pub fn finish() {
    let Some(s) = state().take() else {
        return;
    };
    let wall = s.started.elapsed().as_secs_f64();
    let (user, system) = process_cpu_s();
    let snap = stats::snapshot();
    let ticks = snap
        .iter()
        .find(|(n, _)| *n == Counter::Ticks.name())
        .map_or(0, |x| x.1);
    let per_tick: serde_json::Map<String, serde_json::Value> = snap
        .iter()
        .map(|(n, v)| {
            let per = (ticks > 0).then(|| *v as f64 / ticks as f64);
            ((*n).to_owned(), serde_json::json!(per))
        })
        .collect();
    let report = serde_json::json!({
        "wall_s": wall,
        "cpu_user_s": user,
        "cpu_system_s": system,
        "cpu_pct_of_core": 100.0 * (user + system) / wall.max(1e-9),
        "memory_kb": {
            "VmRSS": status_kb("VmRSS:"),
            "VmHWM": status_kb("VmHWM:"),
            "RssAnon": status_kb("RssAnon:"),
            "RssFile": status_kb("RssFile:"),
            "VmStk": status_kb("VmStk:"),
            "Threads": status_kb("Threads:"),
        },
        "counters": counters_json(),
        "call_groups": groups_json(),
        "per_tick": per_tick,
        "marks": s.marks,
        "threads": s.threads.unwrap_or_else(thread_cpu),
    });
    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
    if let Err(e) = std::fs::write(&s.path, text + "\n") {
        eprintln!(
            "gpudiag: could not write {ENV} figures to {}: {e}",
            s.path.display()
        );
    }
}

fn counters_json() -> serde_json::Value {
    stats::snapshot()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), serde_json::json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Driver call groups: calls, wall and thread CPU time in total and per call.
fn groups_json() -> serde_json::Value {
    stats::groups()
        .into_iter()
        .map(|(name, calls, wall_ns, cpu_ns)| {
            let per = |ns: u64| (calls > 0).then(|| ns as f64 / calls as f64 / 1000.0);
            (
                name.to_owned(),
                serde_json::json!({
                    "calls": calls,
                    "wall_ms": wall_ns as f64 / 1e6,
                    "cpu_ms": cpu_ns as f64 / 1e6,
                    "wall_us_per_call": per(wall_ns),
                    "cpu_us_per_call": per(cpu_ns),
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The process's user and system CPU seconds, exited threads included.
fn process_cpu_s() -> (f64, f64) {
    // SAFETY: getrusage only writes the struct we hand it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (f64::NAN, f64::NAN);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// A `/proc/self/status` line's value (kB, or a count for `Threads:`).
fn status_kb(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// `{thread name: {user_s, system_s}}` for every live thread (same names summed).
fn thread_cpu() -> serde_json::Value {
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut out = serde_json::Map::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out.into();
    };
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "tid (comm) state ..." where comm may hold spaces and parentheses: split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // Fields 14 and 15 of stat (utime, stime) are the 12th and 13th after the comm.
        let tick = |i: usize| {
            rest.get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (user, system) = (tick(11) / hz, tick(12) / hz);
        let e = out
            .entry(name)
            .or_insert_with(|| serde_json::json!({"user_s": 0.0, "system_s": 0.0, "count": 0}));
        if let Some(o) = e.as_object_mut() {
            let add = |o: &mut serde_json::Map<String, serde_json::Value>, k: &str, v: f64| {
                let was = o.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
                o.insert(k.into(), serde_json::json!(was + v));
            };
            add(o, "user_s", user);
            add(o, "system_s", system);
            add(o, "count", 1.0);
        }
    }
    out.into()
}
