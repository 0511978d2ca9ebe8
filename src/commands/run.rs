//! `gpudiag run -- CMD`: runs a command, watches the GPUs while it runs, attributes what it sees
//! to the command's process tree, and says at the end (on stderr, like `time`) what held the GPUs
//! back and how that changed over the run. Exits with the command's own code.
//!
//! gpudiag makes itself a child subreaper, so a descendant whose parent exits (a launcher that
//! forks workers and returns) is re-parented to gpudiag instead of init and stays in the tree.
//! The command stays in the terminal's process group, so Ctrl-C and Ctrl-\ reach it directly;
//! the signals that would end gpudiag, sent to gpudiag alone, are forwarded (see
//! [`FORWARDED`]), and the command gets SIGKILL if gpudiag dies without forwarding anything.
//!
//! Every output path is checked before the command starts; once it has run, nothing gpudiag
//! fails to write changes the exit code, which is always the command's own.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command as ChildCommand, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cli::RunArgs;
use gpudiag_core::check::ToolInfo;
use gpudiag_core::config::Config;
use gpudiag_core::judgement::Span;
use gpudiag_core::kernels::KernelsAggregator;
use gpudiag_core::pipeline::{Pipeline, Sink};
use gpudiag_core::rules::families::is_workload;
use gpudiag_core::session::{Limit, RunOptions, Session, Source, open_source};
use gpudiag_export::chrome_trace::{Trace, TraceBuilder};
use gpudiag_export::profiler_merge;
use gpudiag_export::{refuse_existing, write_json_atomic};
use gpudiag_kernels::ancestry::descends_from;
use gpudiag_model::error::Error;
use gpudiag_model::finding::Finding;
use gpudiag_model::kernels::KernelsSummary;
use gpudiag_model::printable;
use gpudiag_model::sample::DeviceInfo;
use gpudiag_model::sample::{TimeMs, now_ms};
use gpudiag_model::verdict::{NotJudged, Verdict};
use gpudiag_telemetry::Tick;
use gpudiag_telemetry::recording::{Header, Record, RecordingWriter};
use gpudiag_telemetry::replay::Pace;

/// Bumped on any change that removes or retypes a field of `RunReport`.
pub const RUN_SCHEMA_VERSION: u32 = 3;

/// After the command exits, sampling goes on this long, so the process list shows who still
/// holds a GPU (it refreshes on the slow cadence, about a second).
const AFTER_EXIT: Duration = Duration::from_millis(1500);

/// What `--json` prints on stderr and `--report-file FILE` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RunReport {
    #[schemars(extend("const" = RUN_SCHEMA_VERSION))]
    pub schema_version: u32,
    pub tool: ToolInfo,
    /// The command and its arguments as given (redact before sharing).
    pub command: Vec<String>,
    pub pid: u32,
    pub start_ms: TimeMs,
    pub end_ms: TimeMs,
    /// The command's exit code; `None` when a signal ended it.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Why the GPUs could not be watched (no driver, no GPU); `None` when they were.
    pub not_watched: Option<String>,
    /// Per GPU the command's processes used (every watched GPU when none could be seen): the
    /// verdict over the run and its phases.
    pub devices: Vec<RunDevice>,
    /// The verdict on each job of two or more GPUs, from comparing its GPUs over the run (the
    /// command's ranks: a straggler named, communication-bound, imbalanced or balanced).
    #[serde(default)]
    pub jobs: Vec<gpudiag_model::job::JobVerdict>,
    /// How each job's verdict changed over the run.
    #[serde(default)]
    pub job_phases: Vec<gpudiag_core::check::JobPhases>,
    /// Findings raised while the command ran (faults stay; workload findings cover the run).
    pub findings: Vec<Finding>,
    pub not_judged: Vec<NotJudged>,
    /// Processes of the command's tree seen on a GPU.
    pub gpu_processes: Vec<TreeProcess>,
    /// Descendants still holding GPU memory after the command exited.
    pub still_holding: Vec<TreeProcess>,
    /// The process of the command that left its GPU first, a second or more before the others:
    /// when a launcher tears a job down after one rank dies, the rank that died first is where
    /// to look. `None` where no process left clearly first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_to_leave: Option<FirstToLeave>,
    /// What `--kernels` recorded: per GPU the time split, top kernels and copies, per process
    /// its synchronisations and NCCL share, and the collector's state (`not_recorded` says why
    /// when nothing was). Absent without `--kernels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelsSummary>,
}

/// The process that left its GPU first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct FirstToLeave {
    pub pid: u32,
    pub device: u32,
    /// Its rank, where its launcher's variables were read.
    pub rank: Option<u32>,
    /// When it was last listed on its GPU, ms since the Unix epoch.
    pub left_ms: TimeMs,
    /// How long before the next process left, in seconds.
    pub before_others_s: f64,
}

/// Process lists refresh about once a second: a process that left a second or more before the
/// next one left first; closer than that, the order is not known.
const LEFT_FIRST_MARGIN_MS: u64 = 1_000;

/// The command's process that left its GPU clearly first, of two or more that left before
/// `end_ms`.
fn first_to_leave(
    lifetimes: &BTreeMap<(u32, u32), Lifetime>,
    end_ms: TimeMs,
) -> Option<FirstToLeave> {
    let mut left: Vec<(&(u32, u32), &Lifetime)> = lifetimes
        .iter()
        .filter(|(_, l)| l.last_seen_ms < end_ms.saturating_add(AFTER_EXIT.as_millis() as u64))
        .collect();
    if left.len() < 2 {
        return None;
    }
    left.sort_by_key(|(_, l)| l.last_seen_ms);
    let ((device, pid), first) = left[0];
    let next = left[1].1.last_seen_ms;
    (next >= first.last_seen_ms.saturating_add(LEFT_FIRST_MARGIN_MS)).then(|| FirstToLeave {
        pid: *pid,
        device: *device,
        rank: first.rank,
        left_ms: first.last_seen_ms,
        before_others_s: (next - first.last_seen_ms) as f64 / 1000.0,
    })
}

/// When a process of the command was last listed on a GPU, and its rank.
#[derive(Debug, Clone, Copy)]
struct Lifetime {
    last_seen_ms: TimeMs,
    rank: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RunDevice {
    pub index: u32,
    pub name: Option<String>,
    pub verdict: Option<Verdict>,
    pub phases: Vec<Verdict>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TreeProcess {
    pub pid: u32,
    pub device: u32,
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
}

/// The signals forwarded to the command: those whose default action ends a process and that
/// someone sends to ask the job to stop or to tell it something (a supervisor's SIGTERM, Slurm's
/// `--signal=USR1@60`, `timeout -s ALRM`, a closed terminal's SIGHUP, `kill -QUIT` for a stack
/// dump). They mean something to the command, not to gpudiag. Left at their defaults:
/// SIGPIPE (gpudiag's own stderr closing must not kill the command; Rust ignores it anyway),
/// SIGXCPU and SIGXFSZ (gpudiag's own limits), SIGVTALRM and SIGPROF (timers of a profiler
/// attached to gpudiag), SIGIO, SIGPWR and SIGSTKFLT (nobody sends them to a job), and the
/// real-time signals (glibc uses the first of them internally).
const FORWARDED: [libc::c_int; 7] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

/// Signals caught and not yet forwarded, one bit per number: sent by a process (`kill`).
static SENT: AtomicU64 = AtomicU64::new(0);
/// The same, sent by the kernel to a whole process group: the terminal's Ctrl-C, Ctrl-\ and
/// hangup, which reached the command too while it is still in gpudiag's group.
static FROM_KERNEL: AtomicU64 = AtomicU64::new(0);

extern "C" fn catch(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let bit = 1u64 << (signal as u32 & 63);
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (checked for null anyway).
    let kernel = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    // Lock-free atomics are async-signal-safe.
    if kernel {
        FROM_KERNEL.fetch_or(bit, Ordering::Relaxed);
    } else {
        SENT.fetch_or(bit, Ordering::Relaxed);
    }
}

/// `gpudiag run`. Returns the exit code to end with: the command's own.
pub fn run(args: &RunArgs, config: &Config) -> Result<i32, Error> {
    let Some(program) = args.command.first() else {
        return Err(Error::Usage("gpudiag run needs a command after --".into()));
    };
    if args.source.replay.is_some() || args.source.demo {
        return Err(Error::Usage(
            "gpudiag run watches live GPUs while the command runs; --replay and --demo do not \
             apply (use check --replay)"
                .into(),
        ));
    }
    // Checked now, so a path that cannot be written is a usage error before anything ran,
    // never an exit code that replaces the command's. The files --profiler-trace implies go
    // beside --trace, in the directory checked here.
    for path in [&args.record, &args.trace, &args.report_file]
        .into_iter()
        .flatten()
    {
        check_output(path, args.force)?;
    }
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integers and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let spec = args.source.spec()?;
    let (source, not_watched) = match open_source(&spec, Pace::AsFastAsPossible, false) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e.to_string())),
    };
    // Created before the command starts, so a file that cannot be made is a usage error.
    let writer = match (&source, &args.record) {
        (Some(source), Some(path)) => Some(RecordingWriter::create_with(
            path,
            &header_for(source, args),
            args.force,
        )?),
        _ => None,
    };
    // Caught from before the command exists, so no signal in between ends gpudiag alone;
    // the command starts with the defaults again (exec resets caught signals).
    catch_forwarded_signals();
    let mut command = ChildCommand::new(program);
    command.args(&args.command[1..]);
    // With --record, the recording carries what --kernels saw every few seconds, so a replay
    // (the terminal UI) shows it as the run went.
    let (snapshots_tx, snapshots) = match (&writer, args.kernels) {
        (Some(_), Some(_)) => {
            let (tx, rx) = std::sync::mpsc::channel();
            (Some(tx), Some(rx))
        }
        _ => (None, None),
    };
    let mut kernels = args
        .kernels
        .and_then(|mode| KernelsRun::prepare(args.trace.is_some(), mode.schedule(), snapshots_tx));
    if let Some(k) = &kernels {
        command.envs(k.session.env().iter().map(|(key, value)| (key, value)));
    }
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and
    // getppid, which are async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || die_with_parent(parent));
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            if writer.is_some()
                && let Some(path) = &args.record
            {
                drop(writer);
                let _ = std::fs::remove_file(path);
            }
            // `run --json FILE -- CMD` from before --json became a flag.
            let hint = if args.json && args.command.get(1).is_some_and(|a| a == "--") {
                "; --json takes no file (it prints on stderr): use --report-file FILE"
            } else {
                ""
            };
            return Err(Error::Usage(format!(
                "cannot start {}: {e}{hint}",
                printable::line(&program.to_string_lossy())
            )));
        }
    };
    if let Some(why) = &not_watched {
        eprintln!(
            "gpudiag: could not watch the GPUs ({}); running the command anyway",
            printable::line(why)
        );
    }
    if let Some(k) = &mut kernels {
        k.watch(child.id());
    }
    let start_ms = now_ms();
    let started = Instant::now();
    let started_wall = std::time::SystemTime::now();
    let exit: Arc<Mutex<Option<(ExitStatus, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let child_pid = child.id();
    let watching = source.is_some();
    let waiter = {
        let exit = exit.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("gpudiag-run-wait".into())
            .spawn(move || wait_and_forward(&mut child, &exit, &stop, watching))
            .map_err(|e| Error::CannotRun(format!("could not start a thread: {e}")))?
    };

    let options = WatchOptions::of(args);
    let watched = source.map(|source| watch(source, writer, snapshots, &options, config, &stop));
    let _ = waiter.join();
    let (status, exited_at) = exit
        .lock()
        .ok()
        .and_then(|e| *e)
        .ok_or_else(|| Error::CannotRun("lost track of the command".into()))?;
    let end_ms = start_ms + exited_at.duration_since(started).as_millis() as u64;
    let (exit_code, signal) = exit_parts(status);
    let mut report = RunReport {
        schema_version: RUN_SCHEMA_VERSION,
        tool: ToolInfo::this(),
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: child_pid,
        start_ms,
        end_ms,
        exit_code,
        signal,
        not_watched,
        devices: Vec::new(),
        jobs: Vec::new(),
        job_phases: Vec::new(),
        findings: Vec::new(),
        not_judged: Vec::new(),
        gpu_processes: Vec::new(),
        still_holding: Vec::new(),
        first_to_leave: None,
        kernels: None,
    };
    let mut trace = None;
    let mut devices = Vec::new();
    let mut recording = None;
    if let Some(mut w) = watched {
        trace = w.trace.take();
        recording = w.writer.take();
        devices = w.session.devices.clone();
        w.conclude(&mut report, start_ms, end_ms);
    }
    if let Some(k) = kernels {
        let kept = k.conclude(&mut report, &devices);
        if let (Some(trace), Some(kept)) = (&mut trace, kept) {
            trace.push_kernel_records(&kept);
        }
    }
    if let Some(w) = recording {
        finish_recording(w, report.kernels.as_ref());
    }
    let trace = trace.map(TraceBuilder::finish);
    if args.json {
        // One line, so a reader can pick it out of the command's own stderr.
        match serde_json::to_string(&report) {
            Ok(json) => eprintln!("{json}"),
            Err(e) => warn(&format!("could not serialise the run report: {e}")),
        }
    } else {
        eprint!("{}", printable::text(&summary(&report)));
    }
    // From here on the command has run: a failure is a warning and the exit code stays its own.
    if let Some(path) = &args.report_file
        && let Err(e) = write_json_atomic(path, &report)
    {
        warn(&e.to_string());
    }
    if let (Some(ours), Some(path)) = (&trace, &args.trace)
        && args.profiler_trace.is_none()
        && let Err(e) = write_json_atomic(path, ours)
    {
        warn(&e.to_string());
    }
    // With a profiler trace, gpudiag's is merged into the one the command wrote.
    if let (Some(ours), Some(profiler), Some(path)) = (trace, &args.profiler_trace, &args.trace)
        && let Err(e) = merge_profiler_traces(&ours, profiler, path, started_wall, args.force)
    {
        let own = merged_name(path, Path::new("gpudiag.json"));
        let kept = match write_json_atomic(&own, &ours) {
            Ok(()) => format!(
                "gpudiag's own trace is in {}",
                printable::line(&own.display().to_string())
            ),
            Err(e) => format!("gpudiag's own trace could not be kept either: {e}"),
        };
        warn(&format!("{e}; {kept}"));
    }
    Ok(exit_code.unwrap_or_else(|| 128 + signal.unwrap_or(0)))
}

fn warn(what: &str) {
    eprintln!("gpudiag: warning: {}", printable::line(what));
}

/// A usage error unless `path` can be written at the end of the run: it must not exist (unless
/// `force`) nor be a directory, and its directory must exist and take a new file.
fn check_output(path: &Path, force: bool) -> Result<(), Error> {
    let shown = path.display().to_string();
    let shown = printable::line(&shown);
    // Before refuse_existing: --force cannot replace a directory with a file.
    if path.is_dir() {
        return Err(Error::Usage(format!(
            "{shown} is a directory; give a file name"
        )));
    }
    refuse_existing(path, force)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir_shown = dir.display().to_string();
    let dir_shown = printable::line(&dir_shown);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::Usage(format!(
                "cannot write {shown}: {dir_shown} is not a directory"
            )));
        }
        Err(e) => {
            return Err(Error::Usage(format!(
                "cannot write {shown}: its directory {dir_shown}: {e}"
            )));
        }
    }
    // Making a file is the one test that covers modes, read-only mounts, ACLs and root alike
    // (access(2) says yes to root on a directory nobody can add to, such as /proc).
    let probe = dir.join(format!(".gpudiag-write-test-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(Error::Usage(format!(
            "cannot write {shown}: cannot create a file in {dir_shown}: {e}"
        ))),
    }
}

/// In the child before exec: SIGKILL when gpudiag dies, so a gpudiag killed outright (SIGKILL,
/// the OOM killer, a crash) cannot leave the command running under init. SIGKILL and not
/// SIGTERM: whoever kills gpudiag outright has usually spent the grace period already (its
/// SIGTERM was forwarded), and a command that ignores SIGTERM must not outlive it. The signal
/// follows the thread that forked, and `run` spawns from the main thread, which lives as long
/// as gpudiag.
fn die_with_parent(parent: u32) -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG and getppid take and return plain integers.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // gpudiag died between fork and prctl: the child was re-parented already and no death
        // signal will come.
        if libc::getppid() as u32 != parent {
            return Err(std::io::Error::other(
                "gpudiag ended before the command started",
            ));
        }
    }
    Ok(())
}

/// `--profiler-trace`: merges gpudiag's trace into each profiler trace written during the run
/// (modified in or after the second the run started, since some file systems keep whole
/// seconds). With none, gpudiag's own trace is written to `path` and a warning says so. On an
/// error the caller keeps gpudiag's own trace.
fn merge_profiler_traces(
    ours: &Trace,
    profiler: &std::path::Path,
    path: &std::path::Path,
    started: std::time::SystemTime,
    force: bool,
) -> Result<(), Error> {
    let whole_second = started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| std::time::UNIX_EPOCH + Duration::from_secs(d.as_secs()))
        .unwrap_or(started);
    let found = profiler_merge::written_since(profiler, whole_second)?;
    if found.is_empty() {
        eprintln!(
            "gpudiag: no profiler trace was written to {} during the run; wrote gpudiag's own \
             trace to {}",
            printable::line(&profiler.display().to_string()),
            printable::line(&path.display().to_string())
        );
        return write_json_atomic(path, ours);
    }
    let several = found.len() > 1;
    for input in &found {
        let output = if several {
            merged_name(path, input)
        } else {
            path.to_path_buf()
        };
        if several {
            refuse_existing(&output, force)?;
        }
        match profiler_merge::merge(input, ours, &output) {
            Ok(m) => {
                if let Some(w) = m.warning() {
                    eprintln!(
                        "gpudiag: warning: {}: {w}",
                        printable::line(&input.display().to_string())
                    );
                }
                eprintln!(
                    "gpudiag: merged {} event(s) into {} ({:.3} s of overlap): {}",
                    m.added_events,
                    printable::line(&input.display().to_string()),
                    (m.info.window_end_ms - m.info.window_start_ms) / 1000.0,
                    printable::line(&output.display().to_string())
                );
            }
            Err(e) => {
                return Err(Error::Usage(format!(
                    "could not merge into {}: {e}",
                    input.display()
                )));
            }
        }
    }
    Ok(())
}

/// `merged.json` and `host_1.123.pt.trace.json.gz` give `merged.host_1.123.pt.trace.json.gz`
/// beside `merged.json`.
fn merged_name(path: &std::path::Path, profiler: &std::path::Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
    let stem = name
        .strip_suffix(".json.gz")
        .or_else(|| name.strip_suffix(".json"))
        .or_else(|| name.strip_suffix(".gz"))
        .unwrap_or(&name);
    let other = profiler.file_name().map_or_else(
        || "profiler.json".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    path.with_file_name(format!("{stem}.{other}"))
}

/// Waits for the command, forwarding signals caught meanwhile, then lets sampling run on a
/// little to see who still holds a GPU.
fn wait_and_forward(
    child: &mut Child,
    exit: &Mutex<Option<(ExitStatus, Instant)>>,
    stop: &AtomicBool,
    watching: bool,
) {
    let pid = child.id() as libc::pid_t;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                if let Ok(mut e) = exit.lock() {
                    *e = Some((status, Instant::now()));
                }
                break;
            }
            Ok(None) => {}
            Err(_) => {
                // Waiting failed (it should not): block instead, so the exit is still seen.
                if let Ok(status) = child.wait()
                    && let Ok(mut e) = exit.lock()
                {
                    *e = Some((status, Instant::now()));
                }
                break;
            }
        }
        forward_caught(pid);
        std::thread::sleep(Duration::from_millis(20));
    }
    if watching {
        std::thread::sleep(AFTER_EXIT);
    }
    stop.store(true, Ordering::Relaxed);
}

/// Catches [`FORWARDED`] so they no longer end gpudiag: gpudiag keeps watching until the
/// command has handled them and exited, then exits with its code.
///
/// A handler of its own rather than the process's one `Stop` (ctrlc): forwarding takes seven
/// signals, not three, and each one's `si_code`, to tell a terminal's Ctrl-C (which reached the
/// command already) from a `kill` aimed at gpudiag alone. `main` gives `run` no `Stop`, so no
/// other handler is installed in this process.
fn catch_forwarded_signals() {
    for signal in FORWARDED {
        // SAFETY: a zeroed sigaction is a valid start; `catch` only touches lock-free atomics
        // and the siginfo it is given. SA_RESTART keeps gpudiag's own reads and waits from
        // failing with EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = catch as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Sends the command what was caught since the last call. A signal the kernel sent to a
/// process group (the terminal's Ctrl-C, Ctrl-\, hangup) already reached the command while
/// it is in gpudiag's group; sending it again would deliver it twice. A signal sent to the
/// whole group with kill(-pgid) cannot be told from one sent to gpudiag alone and does arrive
/// twice, as it did before.
fn forward_caught(pid: libc::pid_t) {
    let sent = SENT.swap(0, Ordering::Relaxed);
    let mut from_kernel = FROM_KERNEL.swap(0, Ordering::Relaxed);
    // SAFETY: getpgid and getpgrp take and return plain integers.
    if from_kernel != 0 && unsafe { libc::getpgid(pid) == libc::getpgrp() } {
        from_kernel = 0;
    }
    let pending = sent | from_kernel;
    for signal in FORWARDED {
        if pending & (1u64 << signal) != 0 {
            // SAFETY: kill takes plain integers; `pid` is our own child, not yet reaped.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

fn exit_parts(status: ExitStatus) -> (Option<i32>, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    (status.code(), status.signal())
}

/// What watching produced, kept for the summary at the end.
struct Watched {
    /// The pipeline, the devices watched and the findings the source carried (a recording's;
    /// live sources carry none).
    session: Session,
    tree: ProcessTree,
    warnings: Vec<String>,
    /// gpudiag's trace with the findings in it, finished once `--kernels` has added its
    /// records (they arrive until the command's last process has gone).
    trace: Option<TraceBuilder>,
    /// The recording, finished once `--kernels` has written its summary of the whole run.
    writer: Option<RecordingWriter>,
}

/// Ends the recording: with `--kernels`, the summary of the whole run goes last (its GPUs
/// matched and its verdicts given), so a replay ends on what the report says.
fn finish_recording(
    mut writer: RecordingWriter,
    kernels: Option<&gpudiag_model::kernels::KernelsSummary>,
) {
    if let Some(summary) = kernels {
        let record = Record::Kernels(gpudiag_model::kernels::RecordedKernels {
            time_ms: now_ms(),
            ended: true,
            summary: summary.clone(),
        });
        if let Err(e) = writer.write(&record) {
            warn(&format!("the recording stopped: {e}"));
        }
    }
    if let Err(e) = writer.finish() {
        warn(&format!("the recording could not be finished: {e}"));
    }
}

fn header_for(source: &Source, args: &RunArgs) -> Header {
    let mut header = Header::new(
        source.backend.name(),
        source.backend.host().clone(),
        source.devices(),
        Some(args.interval.as_millis() as u64),
    );
    header.topology = source.topology();
    header
}

/// Samples until `stop`. The command is running: every failure here is a warning, so that
/// gpudiag still waits for the command and exits with its code.
/// How `run` watches: the sampling interval, and whether it builds a trace.
struct WatchOptions<'a> {
    interval: Duration,
    trace: Option<&'a Path>,
}

impl<'a> WatchOptions<'a> {
    fn of(args: &'a RunArgs) -> WatchOptions<'a> {
        WatchOptions {
            interval: args.interval,
            trace: args.trace.as_deref(),
        }
    }
}

fn watch(
    source: Source,
    writer: Option<RecordingWriter>,
    kernels_snapshots: Option<std::sync::mpsc::Receiver<gpudiag_model::kernels::RecordedKernels>>,
    options: &WatchOptions<'_>,
    config: &Config,
    stop: &Arc<AtomicBool>,
) -> Watched {
    let trace = options.trace.map(|_| {
        TraceBuilder::new(
            source.backend.name(),
            None,
            source.backend.host(),
            source.devices(),
        )
    });
    // The command's own time is judged: XIDs the kernel logged before it started are not its.
    let mut session = Session::setup(config).with_libraries().over(source);
    let mut sink = RunSink {
        writer,
        write_failed: None,
        trace,
        tree: ProcessTree::new(std::process::id()),
        kernels_snapshots,
    };
    let opts = RunOptions {
        interval: options.interval,
        limit: Limit::None,
        stop: Some(stop),
    };
    let mut warnings = Vec::new();
    match session.run(&opts, &mut sink) {
        Ok(None) => {}
        Ok(Some(e)) => warnings.push(format!("sampling stopped early: {e}")),
        Err(e) => warnings.push(format!("sampling stopped early: {e}")),
    }
    if let Some(e) = sink.write_failed.take() {
        warn(&format!("the recording stopped: {e}"));
    }
    let trace = sink.trace.take().map(|mut builder| {
        for f in session.pipeline.engine.raised() {
            builder.push_finding(&f);
        }
        builder
    });
    Watched {
        session,
        tree: sink.tree,
        warnings,
        trace,
        writer: sink.writer.take(),
    }
}

impl Watched {
    fn conclude(mut self, report: &mut RunReport, start_ms: TimeMs, end_ms: TimeMs) {
        // The command's own time is judged: sampling went on a moment past its exit to see who
        // still held the GPU.
        let span = Span {
            start_ms: Some(start_ms),
            end_ms: Some(end_ms),
        };
        let command: BTreeSet<u32> = self.tree.seen.keys().map(|&(_, pid)| pid).collect();
        self.session.pipeline.engine.set_command_processes(command);
        let mut judged = self.session.judge(span, None);
        let used: BTreeSet<u32> = self.tree.seen.values().map(|p| p.device).collect();
        for d in &self.session.devices {
            if !used.is_empty() && !used.contains(&d.index) {
                continue;
            }
            report.devices.push(RunDevice {
                index: d.index,
                name: d.name.clone(),
                verdict: judged.verdicts.get(&d.index).cloned(),
                phases: judged.phases.remove(&d.index).unwrap_or_default(),
            });
        }
        report.jobs = judged.jobs;
        report.job_phases = judged
            .job_phases
            .into_iter()
            .map(|(job, phases)| gpudiag_core::check::JobPhases { job, phases })
            .collect();
        report.findings = judged.findings;
        report.not_judged = judged.not_judged;
        report.gpu_processes = self.tree.seen.values().cloned().collect();
        report.still_holding = self.tree.still_holding(&self.session.pipeline, end_ms);
        report.first_to_leave = first_to_leave(&self.tree.lifetimes, end_ms);
        for w in self.warnings {
            report.not_judged.push(NotJudged {
                rule: "run".into(),
                device: None,
                reason: w,
            });
        }
    }
}

/// What `run` concludes, watching a source that ends by itself (a recording) from its first
/// sample to its last: the same watching and judging as a command's run, with no command. It
/// lets `run`'s conclusion be compared with the other views of the same data.
pub fn conclusion_of(source: Source, config: &Config) -> RunConclusion {
    let stop = Arc::new(AtomicBool::new(false));
    let options = WatchOptions {
        interval: Duration::from_millis(100),
        trace: None,
    };
    let watched = watch(source, None, None, &options, config, &stop);
    let (Some(start_ms), Some(end_ms)) = (
        watched.session.pipeline.first_ms(),
        watched.session.pipeline.last_ms(),
    ) else {
        return RunConclusion::default();
    };
    let mut report = RunReport {
        schema_version: RUN_SCHEMA_VERSION,
        tool: ToolInfo::this(),
        command: Vec::new(),
        pid: std::process::id(),
        start_ms,
        end_ms,
        exit_code: None,
        signal: None,
        not_watched: None,
        devices: Vec::new(),
        jobs: Vec::new(),
        job_phases: Vec::new(),
        findings: Vec::new(),
        not_judged: Vec::new(),
        gpu_processes: Vec::new(),
        still_holding: Vec::new(),
        first_to_leave: None,
        kernels: None,
    };
    watched.conclude(&mut report, start_ms, end_ms);
    RunConclusion {
        devices: report.devices,
        findings: report.findings,
        not_judged: report.not_judged,
    }
}

/// The judged part of a run's report.
#[derive(Debug, Clone, Default)]
pub struct RunConclusion {
    pub devices: Vec<RunDevice>,
    pub findings: Vec<Finding>,
    pub not_judged: Vec<NotJudged>,
}

/// The text printed when the command ends.
fn summary(r: &RunReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let took = r.end_ms.saturating_sub(r.start_ms) as f64 / 1000.0;
    let how = match (r.exit_code, r.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".into(),
    };
    let _ = writeln!(
        out,
        "\ngpudiag: `{}` {how} after {took:.1} s",
        printable::line(&shell_words(&r.command))
    );
    if let Some(why) = &r.not_watched {
        let _ = writeln!(out, "gpudiag: the GPUs were not watched: {why}");
        // The kernels were recorded all the same: they need no NVML.
        if let Some(k) = &r.kernels {
            out.push_str(&crate::kernels_text::kernels_section(k));
        }
        return out;
    }
    // A job torn down after one rank died: that rank is where to look.
    if let Some(first) = r.first_to_leave.as_ref().filter(|_| r.exit_code != Some(0)) {
        let _ = writeln!(
            out,
            "gpudiag: GPU {}{} (pid {}) left its GPU first, {:.1} s before the others: if a \
             rank died and the launcher then ended the rest, it is this one; read its log first",
            first.device,
            first.rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
            first.pid,
            first.before_others_s
        );
    }
    // The job first: its GPUs' own verdicts read busy while they wait for a straggler.
    for j in &r.jobs {
        for line in crate::check_text::job_block(j, &r.job_phases, Some(r.start_ms)) {
            let _ = writeln!(out, "gpudiag: {line}");
        }
    }
    for d in &r.devices {
        match &d.verdict {
            Some(v) => {
                let _ = writeln!(
                    out,
                    "gpudiag: GPU {} verdict: {} ({} confidence) — {}\n    what to do: {}",
                    d.index,
                    v.bottleneck,
                    v.confidence,
                    printable::line(&v.title),
                    v.advice
                );
            }
            None => {
                let why = r
                    .not_judged
                    .iter()
                    .find(|n| n.rule == "verdict" && n.device == Some(d.index))
                    .map_or("no data", |n| n.reason.as_str());
                let _ = writeln!(
                    out,
                    "gpudiag: GPU {} not judged: {}",
                    d.index,
                    printable::line(why)
                );
            }
        }
        if d.phases.len() > 1 {
            let _ = writeln!(
                out,
                "  phases (the bottleneck changed {}; the verdict above names the one that held most of it):",
                crate::check_text::times(d.phases.len() - 1)
            );
            let t0 = r.start_ms;
            for p in &d.phases {
                let phase = crate::check_text::phase_line(p, t0);
                let _ = writeln!(out, "    {}", printable::line(&phase));
            }
        }
    }
    for f in r
        .findings
        .iter()
        // Workload findings repeat the verdict above; faults and the rest are news.
        .filter(|f| f.severity > gpudiag_model::finding::Severity::Info && !is_workload(f))
    {
        let _ = writeln!(
            out,
            "gpudiag: [{}] {}",
            f.severity,
            printable::line(&f.title)
        );
    }
    for p in &r.still_holding {
        let _ = writeln!(
            out,
            "gpudiag: still holding GPU {} after the command ended: pid {} {} ({:.1} GiB) — \
             a descendant outlived it; kill it or wait for it to release the GPU",
            p.device,
            p.pid,
            printable::line(p.name.as_deref().unwrap_or("unknown")),
            p.used_memory_bytes.unwrap_or_default() as f64 / (1u64 << 30) as f64
        );
    }
    if let Some(k) = &r.kernels {
        out.push_str(&crate::kernels_text::kernels_section(k));
    }
    out
}

/// `--kernels`: puts what the collectors sent in the report (`aggregator` is `None` when
/// `--kernels` was not given) and, on each GPU whose records show a waste clearly, the verdict
/// they support in place of the counters' (basis `kernels`; the counters' bottleneck stays in
/// its evidence). `devices` are the GPUs watched, to match the records' UUIDs to indices.
pub fn conclude_kernels(
    report: &mut RunReport,
    aggregator: Option<&KernelsAggregator>,
    devices: &[DeviceInfo],
) {
    let Some(aggregator) = aggregator else {
        return;
    };
    let mut summary = aggregator.summary();
    let seen: Vec<(u32, u32)> = report
        .gpu_processes
        .iter()
        .map(|p| (p.pid, p.device))
        .collect();
    gpudiag_core::kernels::match_devices(&mut summary, devices, &seen);
    gpudiag_core::kernels::verdict::conclude(
        &summary,
        report.devices.iter_mut().map(|d| (d.index, &mut d.verdict)),
        &mut report.jobs,
        report.start_ms,
        report.end_ms,
    );
    report.kernels = Some(summary);
}

/// The processes on the GPUs that descend from gpudiag (the command and, through the subreaper,
/// whatever it left behind).
struct ProcessTree {
    root: u32,
    /// pid → whether it descends from `root`, decided once per pid.
    known: BTreeMap<u32, bool>,
    /// (device, pid) → the process as last seen on that GPU.
    seen: BTreeMap<(u32, u32), TreeProcess>,
    /// (device, pid) → when it was last listed there.
    lifetimes: BTreeMap<(u32, u32), Lifetime>,
}

impl ProcessTree {
    fn new(root: u32) -> Self {
        ProcessTree {
            root,
            known: BTreeMap::new(),
            seen: BTreeMap::new(),
            lifetimes: BTreeMap::new(),
        }
    }

    fn observe(&mut self, tick: &Tick) {
        for s in &tick.samples {
            for p in s.processes.iter().flatten() {
                let root = self.root;
                let descends = *self
                    .known
                    .entry(p.pid)
                    .or_insert_with(|| descends_from(p.pid, root));
                if descends {
                    let rank = p.launch.as_ref().and_then(|l| l.rank);
                    let life = self.lifetimes.entry((s.device, p.pid)).or_insert(Lifetime {
                        last_seen_ms: s.time_ms,
                        rank,
                    });
                    life.last_seen_ms = life.last_seen_ms.max(s.time_ms);
                    life.rank = life.rank.or(rank);
                    self.seen.insert(
                        (s.device, p.pid),
                        TreeProcess {
                            pid: p.pid,
                            device: s.device,
                            name: p.name.clone(),
                            used_memory_bytes: p.used_memory_bytes,
                        },
                    );
                }
            }
        }
    }

    /// Tree processes on a GPU in the samples taken after the command ended, still alive.
    fn still_holding(&self, pipeline: &Pipeline, end_ms: TimeMs) -> Vec<TreeProcess> {
        pipeline
            .latest
            .values()
            .filter(|s| s.time_ms > end_ms)
            .flat_map(|s| s.processes.iter().flatten().map(move |p| (s.device, p)))
            .filter(|(d, p)| self.seen.contains_key(&(*d, p.pid)))
            .filter(|(_, p)| std::path::Path::new(&format!("/proc/{}", p.pid)).exists())
            .map(|(d, p)| TreeProcess {
                pid: p.pid,
                device: d,
                name: p.name.clone(),
                used_memory_bytes: p.used_memory_bytes,
            })
            .collect()
    }
}

struct RunSink {
    writer: Option<RecordingWriter>,
    /// Why the recording stopped (a full disk): the verdict goes on without it.
    write_failed: Option<Error>,
    trace: Option<TraceBuilder>,
    tree: ProcessTree,
    /// `--kernels --record`: the summaries the consumer makes as the command runs.
    kernels_snapshots: Option<std::sync::mpsc::Receiver<gpudiag_model::kernels::RecordedKernels>>,
}

impl Sink for RunSink {
    fn on_tick(
        &mut self,
        tick: &Tick,
        raised: &[Finding],
        pipeline: &Pipeline,
    ) -> Result<(), Error> {
        // Each summary is of the whole run so far: only the latest is worth writing.
        let snapshot = self
            .kernels_snapshots
            .as_ref()
            .and_then(|rx| rx.try_iter().last())
            .map(|mut k| {
                let seen: Vec<(u32, u32)> = self.tree.seen.keys().map(|&(d, p)| (p, d)).collect();
                gpudiag_core::kernels::match_devices(
                    &mut k.summary,
                    pipeline.engine.devices(),
                    &seen,
                );
                Record::Kernels(k)
            });
        if let Some(w) = &mut self.writer {
            let written = w.write_tick(tick).and_then(|()| {
                raised
                    .iter()
                    .map(|f| Record::Finding(f.clone()))
                    .chain(snapshot)
                    .try_for_each(|r| w.write(&r))
            });
            if let Err(e) = written {
                self.write_failed = Some(e.into());
                self.writer = None;
            }
        }
        if let Some(t) = &mut self.trace {
            t.push_tick(tick);
        }
        self.tree.observe(tick);
        Ok(())
    }
}

/// How often `--kernels --record` writes the summary so far into the recording. A summary is a
/// few kB to a few hundred (the top kernels of each GPU, each process's waits): every 10 s
/// keeps an hour of recording within tens of MB.
const KERNELS_SNAPSHOT_EVERY: Duration = Duration::from_secs(10);

/// `--kernels`: the collector session and the thread that folds its messages into the
/// aggregate while the command runs.
struct KernelsRun {
    session: gpudiag_kernels::KernelsSession,
    consumer: std::thread::JoinHandle<KernelsAggregator>,
}

impl KernelsRun {
    /// `None`, with a warning saying why, when it cannot record: the command runs anyway.
    /// `keep_records`: every record is kept (up to a cap) for `--trace`.
    /// `snapshots`: where a summary goes every [`KERNELS_SNAPSHOT_EVERY`] while records arrive
    /// (`--record`).
    fn prepare(
        keep_records: bool,
        sampling: Option<gpudiag_model::kernels::SampleSchedule>,
        snapshots: Option<std::sync::mpsc::Sender<gpudiag_model::kernels::RecordedKernels>>,
    ) -> Option<KernelsRun> {
        let prepared = gpudiag_kernels::KernelsSession::prepare(|key| std::env::var_os(key));
        let (mut session, messages) = match prepared {
            Ok(p) => p,
            Err(e) => {
                warn(&e.to_string());
                return None;
            }
        };
        if let Some(schedule) = sampling {
            session.sample(schedule);
        }
        let consumer = std::thread::Builder::new()
            .name("gpudiag-kernels-consume".into())
            .spawn(move || {
                let mut aggregator =
                    KernelsAggregator::new(gpudiag_core::kernels::Limits::default(), keep_records);
                if let Some(schedule) = sampling {
                    aggregator.sampled(schedule);
                }
                let mut last_snapshot = Instant::now();
                let mut changed = false;
                loop {
                    match messages.recv_timeout(Duration::from_secs(1)) {
                        Ok(message) => {
                            aggregator.push(&message);
                            changed = true;
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                    if let Some(tx) = &snapshots
                        && changed
                        && last_snapshot.elapsed() >= KERNELS_SNAPSHOT_EVERY
                    {
                        last_snapshot = Instant::now();
                        changed = false;
                        let _ = tx.send(gpudiag_model::kernels::RecordedKernels {
                            time_ms: now_ms(),
                            ended: false,
                            summary: aggregator.summary(),
                        });
                    }
                }
                aggregator
            });
        match consumer {
            Ok(consumer) => Some(KernelsRun { session, consumer }),
            Err(e) => {
                warn(&format!("--kernels could not start a thread: {e}"));
                None
            }
        }
    }

    fn watch(&mut self, command_pid: u32) {
        if let Err(e) = self.session.watch(command_pid) {
            warn(&e.to_string());
        }
    }

    /// Stops listening, puts what was recorded in the report (and the verdicts it supports),
    /// and hands back the records kept for the trace.
    fn conclude(
        self,
        report: &mut RunReport,
        devices: &[DeviceInfo],
    ) -> Option<gpudiag_core::kernels::KeptRecords> {
        let listener = self.session.stop();
        let Ok(mut aggregator) = self.consumer.join() else {
            warn("--kernels: its consumer thread failed");
            return None;
        };
        conclude_kernels(report, Some(&aggregator), devices);
        if let Some(summary) = &mut report.kernels {
            note_transport(summary, &listener.listener);
        }
        aggregator.take_kept()
    }
}

/// What the socket's side lost or refused goes with the summary; with no process connected
/// at all, that is why nothing was recorded.
fn note_transport(
    summary: &mut KernelsSummary,
    listener: &gpudiag_kernels::listen::ListenerReport,
) {
    let refused = || {
        listener
            .rejected
            .iter()
            .next()
            .map(|(pid, why)| format!(", e.g. pid {pid}: {why}"))
            .unwrap_or_default()
    };
    if listener.connected.is_empty() {
        let mut why = "the collector loaded in no process (no CUDA process ran, or the \
                       variables did not reach it: docker run, sudo and env -i drop them)"
            .to_string();
        if listener.rejected_count > 0 {
            why.push_str(&format!(
                "; {} connection(s) refused{}",
                listener.rejected_count,
                refused()
            ));
        }
        summary.not_recorded = Some(why);
        return;
    }
    if listener.rejected_count > 0 {
        summary.left_out.push(format!(
            "{} connection(s) refused as not the command's{}",
            listener.rejected_count,
            refused()
        ));
    }
    if listener.queue_dropped > 0 {
        summary.left_out.push(format!(
            "{} batch(es) gpudiag could not take in time",
            listener.queue_dropped
        ));
    }
    if listener.malformed > 0 {
        summary.left_out.push(format!(
            "{} malformed message(s) refused{}",
            listener.malformed,
            listener
                .first_malformed
                .as_deref()
                .map(|m| format!(", the first: {m}"))
                .unwrap_or_default()
        ));
    }
    if listener.over_limit > 0 {
        summary.left_out.push(format!(
            "{} connection(s) past the limit were not read",
            listener.over_limit
        ));
    }
}

/// The command as a shell would take it back: an argument with anything but the characters no
/// shell treats specially goes in single quotes (`sh -c 'exit 7'`, not `sh -c exit 7`). Written
/// here: eight lines for a message, where a quoting crate would be a dependency for one line.
fn shell_words(args: &[String]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c);
    args.iter()
        .map(|a| match a.as_str() {
            "" => "''".to_owned(),
            a if a.chars().all(plain) => a.to_owned(),
            a => format!("'{}'", a.replace('\'', "'\\''")),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_shown_as_a_shell_would_take_it_back() {
        let words = |a: &[&str]| shell_words(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(words(&["sh", "-c", "exit 7"]), "sh -c 'exit 7'");
        assert_eq!(
            words(&["python3", "train.py", "--lr=0.1"]),
            "python3 train.py --lr=0.1"
        );
        assert_eq!(words(&["echo", "it's", ""]), "echo 'it'\\''s' ''");
    }

    #[test]
    fn the_process_that_left_a_second_before_the_others_left_first() {
        let life = |last_seen_ms, rank| Lifetime { last_seen_ms, rank };
        let mut lifetimes = BTreeMap::new();
        lifetimes.insert((0, 100), life(10_000, Some(0)));
        lifetimes.insert((1, 101), life(7_000, Some(1)));
        lifetimes.insert((2, 102), life(10_200, Some(2)));
        let first = first_to_leave(&lifetimes, 10_500).unwrap();
        assert_eq!((first.device, first.pid, first.rank), (1, 101, Some(1)));
        assert_eq!(first.before_others_s, 3.0);
        // Within the process lists' cadence the order is not known.
        lifetimes.insert((1, 101), life(9_500, Some(1)));
        assert!(first_to_leave(&lifetimes, 10_500).is_none());
        // One process is no order at all.
        let one: BTreeMap<_, _> = [((0, 100), life(1, None))].into_iter().collect();
        assert!(first_to_leave(&one, 10_500).is_none());
    }

    fn report_with(verdict: Option<Verdict>) -> RunReport {
        RunReport {
            schema_version: RUN_SCHEMA_VERSION,
            tool: ToolInfo::this(),
            command: vec!["python".into(), "train.py".into()],
            pid: 1,
            start_ms: 1_700_000_000_000,
            end_ms: 1_700_000_001_000,
            exit_code: Some(0),
            signal: None,
            not_watched: None,
            devices: vec![RunDevice {
                index: 3,
                name: Some("NVIDIA H100".into()),
                verdict,
                phases: Vec::new(),
            }],
            jobs: Vec::new(),
            job_phases: Vec::new(),
            findings: Vec::new(),
            not_judged: Vec::new(),
            gpu_processes: Vec::new(),
            still_holding: Vec::new(),
            first_to_leave: None,
            kernels: None,
        }
    }

    /// `--kernels --record`: the latest summary made while the command runs goes into the
    /// recording with its GPUs matched to gpudiag's indices, and the run's own summary ends it.
    #[test]
    fn the_recording_carries_the_kernels_as_the_run_went_and_ends_on_the_runs_summary() {
        use gpudiag_core::kernels::synthetic::sync_bound_stream;
        use gpudiag_core::rules::engine::RuleEngine;
        use gpudiag_model::kernels::RecordedKernels;
        use gpudiag_model::sample::{HostInfo, Sample};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ndjson");
        let devices = vec![DeviceInfo {
            index: 3,
            uuid: Some("GPU-aaaa".into()),
            ..DeviceInfo::default()
        }];
        let header = Header::new("nvml", HostInfo::default(), devices.clone(), Some(500));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut sink = RunSink {
            writer: Some(RecordingWriter::create(&path, &header).unwrap()),
            write_failed: None,
            trace: None,
            tree: ProcessTree::new(1),
            kernels_snapshots: Some(rx),
        };
        let mut aggregator = KernelsAggregator::default();
        for m in sync_bound_stream(100) {
            aggregator.push(&m);
        }
        let summary = aggregator.summary();
        assert_eq!(summary.gpus[0].index, None, "matched only when written");
        for time_ms in [1_000, 2_000] {
            tx.send(RecordedKernels {
                time_ms,
                ended: false,
                summary: summary.clone(),
            })
            .unwrap();
        }
        let mut pipeline = Pipeline::new(RuleEngine::new(Default::default(), devices, None, None));
        let tick = Tick {
            samples: vec![Sample::new(3, 2_500)],
            ..Tick::default()
        };
        pipeline.push_into(tick, &mut sink).unwrap();
        finish_recording(sink.writer.take().unwrap(), Some(&summary));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["header", "sample", "kernels", "kernels"]);
        assert_eq!(lines[2]["time_ms"], 2_000);
        assert_eq!(lines[2]["ended"], false);
        assert_eq!(lines[2]["summary"]["gpus"][0]["index"], 3);
        assert_eq!(lines[3]["ended"], true);
    }

    #[test]
    fn kernel_records_that_show_a_waste_give_the_verdict_and_the_rest_stays() {
        use gpudiag_core::kernels::synthetic::sync_bound_stream;
        use gpudiag_model::verdict::{Basis, Bottleneck, Confidence};
        let counters = Verdict {
            device: 3,
            bottleneck: Bottleneck::HostBound,
            confidence: Confidence::Medium,
            basis: Basis::ProfilingCounters,
            start_ms: 1_700_000_000_000,
            end_ms: 1_700_000_001_000,
            title: "the GPU waits on the host".into(),
            evidence: serde_json::Map::new(),
            advice: "look at the host".into(),
            pid: None,
            processes: Vec::new(),
        };
        let devices = [DeviceInfo {
            index: 3,
            uuid: Some("GPU-aaaa".into()),
            ..DeviceInfo::default()
        }];
        let mut aggregator = KernelsAggregator::default();
        for m in sync_bound_stream(100) {
            aggregator.push(&m);
        }
        // Without --kernels nothing changes.
        let mut plain = report_with(Some(counters.clone()));
        conclude_kernels(&mut plain, None, &devices);
        assert_eq!(plain, report_with(Some(counters.clone())));
        assert!(!serde_json::to_string(&plain).unwrap().contains("kernels"));

        let mut report = report_with(Some(counters.clone()));
        conclude_kernels(&mut report, Some(&aggregator), &devices);
        let v = report.devices[0].verdict.as_ref().unwrap();
        assert_eq!(
            (v.bottleneck, v.basis, v.confidence),
            (Bottleneck::SyncBound, Basis::Kernels, Confidence::High)
        );
        assert_eq!((v.start_ms, v.end_ms), (counters.start_ms, counters.end_ms));
        assert_eq!(v.evidence["counters_bottleneck"], "host_bound");
        let kernels = report.kernels.as_ref().unwrap();
        assert_eq!(kernels.gpus[0].index, Some(3));
        let text = summary(&report);
        assert!(
            text.contains(
                "GPU 3 verdict: sync_bound (high confidence) — cudaStreamSynchronize 334 a second"
            ),
            "{text}"
        );
        assert!(
            text.contains("gpudiag: kernels on GPU 3 (pid 100)"),
            "{text}"
        );
        // The report reads back.
        let back: RunReport =
            serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn a_signal_ends_with_128_plus_its_number() {
        use std::os::unix::process::ExitStatusExt;
        let (code, signal) = exit_parts(ExitStatus::from_raw(libc::SIGTERM));
        assert_eq!((code, signal), (None, Some(libc::SIGTERM)));
        let (code, _) = exit_parts(ExitStatus::from_raw(3 << 8));
        assert_eq!(code, Some(3));
    }
}
