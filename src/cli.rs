//! Command-line interface (clap derive). Parsing only; `commands` does the work.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use gpudiag_core::session::{Origin, SourceSpec};
use gpudiag_export::prometheus::process_series::DEFAULT_PROCESS_CAP;
use gpudiag_model::error::Error;
use gpudiag_model::finding::Severity;
use gpudiag_model::units::parse_duration;
use gpudiag_telemetry::attribution::{
    AttributionOptions, DEFAULT_KUBELET_SOCKET, KUBELET_SOCKET_ENV, KubeletOptions,
};
use gpudiag_telemetry::bundle_reader::DEFAULT_MAX_INFLATED;
use gpudiag_telemetry::live::LiveBackend;
use gpudiag_telemetry::replay::ReplayOptions;

/// `gpudiag check`'s footer: examples, then the exit codes a scheduler acts on.
pub const EXIT_CODES_HELP: &str = "\
Examples:
  gpudiag check                         one second of telemetry, then the findings
  gpudiag check --json --fail-on warn   the JSON report; exit 1 on a warning too
  gpudiag check --probes quick          with the quick probe suite (seconds)
  gpudiag check --replay rec.ndjson.gz  a recording or a `gpudiag report` bundle

Exit codes:
  0  healthy, or only findings below --fail-on
  1  a finding at or above --fail-on (default: fail)
  2  usage error: a bad flag, or an input file that cannot be read or understood (not a
     recording, a newer format, a bundle that is ambiguous or inflates past
     --max-inflated-size); a recording damaged part way is read, its bad lines skipped and
     reported as warnings
  3  could not run: no NVIDIA driver or NVML, no GPU, a --device that matches no GPU (the
     report lists it in devices_not_found), NVML initialisation hung, or a probe's CUDA call
     hung well past the suite's deadline (`check --json` still prints a report, status
     could_not_run); or nothing judged: no finding and a GPU gave no reading (status
     not_judged)";

/// `gpudiag --help`'s footer. Plain `gpudiag` has no --fail-on: piped, its summary fails only
/// on a `fail` finding, as `check` does by default.
pub const TOP_HELP: &str = "\
Without a subcommand gpudiag opens the terminal UI on the live GPUs; with none it says so in
one line and opens the bundled demo. When stdin or stdout is not a terminal it prints the check
summary instead (`gpudiag check`), and with no GPU it says why and exits 3 rather than print
the demo's (`gpudiag --demo | cat` asks for that). Each subcommand's --help gives its own
exit codes; these are plain gpudiag's.

Examples:
  gpudiag                         the terminal UI on the live GPUs
  gpudiag --demo                  the bundled demo recording, no GPU needed
  gpudiag --interval 250ms        refresh four times a second

Exit codes:
  0  the terminal UI closed; piped: healthy, or only warn and info findings
  1  piped: a fail finding
  2  usage error: a bad flag or configuration file
  3  piped: could not run (no NVIDIA driver or NVML, no GPU), or nothing judged";

/// A footer with the command's examples above exit codes shared with other commands.
fn examples_then(examples: &str, exit_codes: &str) -> String {
    format!("{examples}\n\n{exit_codes}")
}

const RECORD_EXAMPLES: &str = "\
Examples:
  gpudiag record -o gpus.ndjson.gz --duration 10m   ten minutes of telemetry, gzipped
  gpudiag record -o part.ndjson --replay rec.ndjson.gz --device 0
                                                    one GPU's share of a recording";

const TRACE_EXAMPLES: &str = "\
Examples:
  gpudiag trace -o gpus.json --duration 30s         30 s of live telemetry, for Perfetto UI
  gpudiag trace -o merged.json.gz --replay rec.ndjson.gz --merge step.pt.trace.json.gz
                                                    the recording's tracks in a profiler trace";

const REPORT_EXAMPLES: &str = "\
Examples:
  gpudiag report                                    30 s of live telemetry, redacted
  gpudiag report -o bug.tar.gz --replay rec.ndjson.gz
                                                    a bundle around an existing recording";

/// The footer of the commands that write a file from the telemetry: `record`, `trace`,
/// `report`. None of them judges the GPUs into its exit code; the findings go into the file.
pub const OUTPUT_EXIT_CODES_HELP: &str = "\
Exit codes:
  0  written (Ctrl-C ends a live capture early and still writes it)
  2  usage error: a bad flag, an output file that exists without --force or cannot be
     written, or an input file that cannot be read or understood (not a recording, a newer
     format, a bundle that is ambiguous or inflates past --max-inflated-size)
  3  could not run: no NVIDIA driver or NVML, no GPU (or none matching --device), or NVML
     initialisation hung";

pub const SERVE_EXIT_CODES_HELP: &str = "\
Example:
  gpudiag serve --listen 0.0.0.0:9835 --web.config.file web.yml

Exit codes:
  0  stopped by Ctrl-C or SIGTERM (a replay that ends keeps serving its last values)
  2  usage error: a bad flag, a web config file that cannot be read or asks for what gpudiag
     does not implement, or a --replay input that cannot be read or understood
  3  could not run: no NVIDIA driver or NVML, no GPU (or none matching --device), NVML
     initialisation hung, or the address cannot be listened on";

pub const FLEET_EXIT_CODES_HELP: &str = "\
Examples:
  gpudiag fleet --prometheus http://prometheus:9090
  gpudiag fleet --prometheus http://prometheus:9090 --selector '{slurm_job=\"4242\"}'
  gpudiag fleet --prometheus https://mimir/prometheus --header 'X-Scope-OrgID: gpu' \\
                --bearer-token-file /run/secrets/token --ca-file ca.pem
  gpudiag fleet --prometheus http://prometheus:9090 --json --fail-on warn

Keys: / filters, g groups by node or by job, -> shows a node's GPUs, Enter opens a node or a
job (J the selected GPU's job), Esc goes back, a lists the firing alerts, ? lists the rest,
q quits.

Exit codes:
  0  the terminal UI closed; with --json: no finding or alert at or above --fail-on
  1  with --json: a finding or firing alert at or above --fail-on (default: fail)
  2  usage error: a bad flag, selector or time, or a file named by a flag that cannot be read
  3  could not run: Prometheus cannot be reached, times out, refuses the queries, answers
     something else than its API or a redirect to another origin, or holds no GPU series
     under the selector; --json still prints a document saying why";

/// `replay` has no --fail-on: without a terminal its summary fails only on a `fail` finding.
pub const REPLAY_EXIT_CODES_HELP: &str = "\
Examples:
  gpudiag replay rec.ndjson.gz --speed 10            ten times as fast as recorded
  gpudiag replay gpudiag-report.tar.gz              the recording inside a bug-report bundle

Keys: space pauses, <- and -> seek 10 s (with Shift 60 s), + and - change the speed, ? lists
the rest. The refresh interval is the top-level one: gpudiag --interval 500ms replay FILE.

Exit codes:
  0  the terminal UI closed; without a terminal: healthy, or only warn and info findings
  1  without a terminal: a fail finding
  2  usage error: a bad flag, or a FILE that cannot be read or understood (not a recording,
     a newer format, a bundle that is ambiguous or inflates past --max-inflated-size)
  3  without a terminal: nothing judged (no finding, and a GPU gave no reading)";

pub const CONFIG_HELP: &str = "\
Examples:
  gpudiag config                                    the configuration in effect
  gpudiag config --default > ~/.config/gpudiag/config.toml
                                                    a file to edit, a comment per key

The file read: --config FILE, else $GPUDIAG_CONFIG, else
$XDG_CONFIG_HOME/gpudiag/config.toml (~/.config/gpudiag/config.toml). A file holds only the
keys it changes.

Exit codes:
  0  printed
  2  the file cannot be read, or has an unknown key or a bad value (the error names both)";

#[derive(Debug, Parser)]
#[command(
    name = "gpudiag",
    // The commit and whether the tree was dirty, so a bug report names the build.
    version = gpudiag_model::build_info::LONG_VERSION,
    about = "GPU telemetry, probes and diagnostics: what the GPU is doing and what is wrong",
    after_help = TOP_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Open the bundled demo recording (a real H200 going from idle to full load and back)
    /// instead of live GPUs; without a terminal, print its check summary.
    #[arg(long)]
    pub demo: bool,
    /// Refresh interval of the terminal UI, here and for `replay` (50ms or more).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Rule thresholds from this TOML file instead of $GPUDIAG_CONFIG or
    /// $XDG_CONFIG_HOME/gpudiag/config.toml (see `gpudiag config --default`).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Inventory, environment, a telemetry summary and findings; exit code for schedulers.
    #[command(after_help = EXIT_CODES_HELP)]
    Check(CheckArgs),
    /// Record telemetry to an NDJSON file (gzip when the name ends in .gz).
    #[command(after_help = examples_then(RECORD_EXAMPLES, OUTPUT_EXIT_CODES_HELP))]
    Record(RecordArgs),
    /// Show the configuration (rule thresholds and windows).
    #[command(after_help = CONFIG_HELP)]
    Config(ConfigArgs),
    /// Write a Chrome trace (Perfetto UI, chrome://tracing) of live telemetry or a recording.
    #[command(after_help = examples_then(TRACE_EXAMPLES, OUTPUT_EXIT_CODES_HELP))]
    Trace(TraceArgs),
    /// Write a bug-report bundle (.tar.gz): check report, recording, trace and environment,
    /// with host names, user names, command-line arguments and home paths redacted.
    #[command(after_help = examples_then(REPORT_EXAMPLES, OUTPUT_EXIT_CODES_HELP))]
    Report(ReportArgs),
    /// Serve the telemetry and findings as Prometheus metrics on /metrics.
    #[command(after_help = SERVE_EXIT_CODES_HELP)]
    Serve(ServeArgs),
    /// Open a recording in the terminal UI (play/pause, speed, seeking); without a terminal,
    /// print its check summary.
    #[command(after_help = REPLAY_EXIT_CODES_HELP)]
    Replay(ReplayArgs),
    /// Run a command and watch the GPUs while it runs; when it ends, say on stderr what held
    /// the GPUs back and how that changed over the run. Exits with the command's own code.
    // The command runs on live GPUs: a recording has nothing to watch it with, so the
    // source's replay options are refused (run.rs) and kept out of its help.
    #[command(
        after_help = RUN_EXIT_CODES_HELP,
        mut_arg("replay", |a| a.hide(true)),
        mut_arg("demo", |a| a.hide(true)),
        mut_arg("max_inflated_size", |a| a.hide(true))
    )]
    Run(RunArgs),
    /// The fleet in one terminal: every node's GPUs, verdicts, jobs and alerts read from the
    /// Prometheus that scrapes `gpudiag serve` (or dcgm-exporter); --json prints it once.
    #[command(after_help = FLEET_EXIT_CODES_HELP)]
    Fleet(FleetArgs),
    // The probe list comes from the probe registry, so help cannot fall behind a new probe.
    #[command(about = probe_about(), after_help = PROBE_EXIT_CODES_HELP)]
    Probe(ProbeArgs),
    /// What the Slurm prolog and epilog (assets/deploy/slurm) read from gpudiag besides the
    /// check: the job's GPUs, the prolog's verdict, the epilog's summary. Opens no GPU.
    #[command(after_help = SLURM_HELP)]
    Slurm(SlurmArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(after_help = COMPLETIONS_HELP)]
    Completions(CompletionsArgs),
    /// Print a man page (roff) to stdout: gpudiag(1), or gpudiag-SUBCOMMAND(1); --all writes
    /// them all.
    #[command(after_help = MAN_HELP)]
    Man(ManArgs),
}

pub const COMPLETIONS_HELP: &str = "\
Examples:
  gpudiag completions bash                          the bash script, on stdout

Exit codes:
  0  printed
  2  usage error: a shell gpudiag has no script for

Install:
  bash  gpudiag completions bash > ~/.local/share/bash-completion/completions/gpudiag
  zsh   gpudiag completions zsh > ~/.zfunc/_gpudiag   (with fpath+=~/.zfunc before compinit)
  fish  gpudiag completions fish > ~/.config/fish/completions/gpudiag.fish";

pub const MAN_HELP: &str = "\
Examples:
  gpudiag man check | man -l -                      read gpudiag-check(1) without installing it
  gpudiag man --all pkg/usr/share/man/man1          every page, for a package

Exit codes:
  0  printed, or with --all written (the files are listed on stdout)
  2  usage error: a subcommand that has no page, or a DIR that cannot be created or written

Install:
  gpudiag man --all ~/.cargo/share/man/man1   (man finds them while ~/.cargo/bin is on PATH)";

pub const SLURM_HELP: &str = "\
Examples:
  gpudiag slurm devices                         the job's GPUs as check --device values
  gpudiag slurm prolog --report report.json     the prolog's verdict on a check report
  gpudiag slurm epilog --report report.json --kernel-log klog --job 42 -o job-42.json

The job's GPUs are SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES: numbers (device minors, or NVML
indices with --ids index), ranges (0-3), GPU or MIG UUIDs, separated by commas. A device minor
is mapped to its GPU's UUID through the driver's /proc files, never taken as an NVML index,
which follows PCI order and can name another job's GPU. The prolog's verdict is one line:
CLASS, drain reason and detail separated by the byte 0x1f; CLASS is healthy, warn, fail,
not_judged or could_not_run (the report's status), gpu_lost (a job GPU the driver lists and
NVML does not enumerate), cannot_tell (one NVML does not enumerate where the driver's listing
cannot say), config_error (the job's GPU list cannot be used) or tool_error (no report). The
scripts' policy table is in assets/deploy/README.md.

Exit codes:
  0  done: the GPUs printed (none for a job without GPUs), the verdict printed (whatever it
     is), the summary written
  2  usage or configuration error: a bad flag; a job GPU list that does not parse, or a UUID
     or device minor the driver does not list (devices); a summary that cannot be written
  3  cannot tell the job's GPUs: device minors, and the driver's /proc listing cannot be
     read (devices)";

/// `gpudiag slurm`.
#[derive(Debug, Clone, Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    pub action: SlurmAction,
    /// How the job's GPU list numbers GPUs: `minor` (/dev/nvidiaN, what gres.conf counts by),
    /// or `index` (NVML's index).
    #[arg(long, value_enum, default_value = "minor", global = true)]
    pub ids: GpuIds,
    /// The driver's per-GPU directory, read to map device minors and tell a lost GPU.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/proc/driver/nvidia/gpus",
        global = true
    )]
    pub proc_gpus: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuIds {
    Minor,
    Index,
}

#[derive(Debug, Clone, Subcommand)]
pub enum SlurmAction {
    /// The job's GPUs as `check --device` values, one a line.
    Devices,
    /// The prolog's verdict on a `check --json` report, one line (see below).
    Prolog {
        /// The report `gpudiag check --json` wrote (empty or missing: a tool error).
        #[arg(long, value_name = "FILE")]
        report: PathBuf,
    },
    /// The epilog's job summary (JSON): the post-job check, the job's kernel XIDs, processes
    /// left behind.
    Epilog(Box<SlurmEpilogArgs>),
}

#[derive(Debug, Clone, Args)]
pub struct SlurmEpilogArgs {
    /// The report `gpudiag check --json` wrote (empty or missing: said in check_error).
    #[arg(long, value_name = "FILE")]
    pub report: PathBuf,
    /// Why there is no report to read, when the script knows better (a gpudiag it stopped).
    #[arg(long, value_name = "TEXT")]
    pub check_error: Option<String>,
    /// gpudiag check's exit code, quoted where there is no report.
    #[arg(long, value_name = "CODE", allow_negative_numbers = true)]
    pub check_exit: Option<i32>,
    /// The kernel log since the job began (journalctl -k, or dmesg --time-format iso).
    #[arg(long, value_name = "FILE")]
    pub kernel_log: Option<PathBuf>,
    /// Where the kernel log came from: journalctl, dmesg (its lines before --job-start are left
    /// out) or none.
    #[arg(long, value_name = "NAME", default_value = "none")]
    pub kernel_log_source: String,
    /// Why the kernel log could not be read.
    #[arg(long, value_name = "TEXT")]
    pub kernel_log_error: Option<String>,
    /// When the job began, seconds since the epoch.
    #[arg(long, value_name = "SECONDS")]
    pub job_start: Option<u64>,
    /// The job's id.
    #[arg(long, value_name = "ID")]
    pub job: String,
    /// The job's user.
    #[arg(long, value_name = "NAME", default_value = "")]
    pub user: String,
    /// The node's name.
    #[arg(long, value_name = "NAME", default_value = "")]
    pub node: String,
    /// Where the summary goes (written beside, then renamed).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct ManArgs {
    /// The subcommand whose page to print, gpudiag-SUBCOMMAND(1) [default: gpudiag(1)].
    #[arg(value_name = "SUBCOMMAND", conflicts_with = "all")]
    pub subcommand: Option<String>,
    /// Write every page (gpudiag.1 and a gpudiag-SUBCOMMAND.1 each) into DIR, created if
    /// missing; pages of those names already there are replaced [default: print one page].
    #[arg(long, value_name = "DIR")]
    pub all: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

pub const RUN_EXIT_CODES_HELP: &str = "\
Example:
  gpudiag run -- python train.py --epochs 1

Exit codes:
  the command's own code; 128+N when signal N killed it (as shells report it)
  2  before the command starts only: usage error, an output file (--report-file, --record,
     --trace) that exists without --force, is a directory, or whose directory is missing or
     not writable, or a command that cannot be started (not found, not executable)
Once the command has run, gpudiag exits with its code: a file that cannot be written then, or
a --profiler-trace that cannot be merged (gpudiag's own trace is kept as <trace>.gpudiag.json),
is a warning on stderr.
With no GPU or no NVIDIA driver the command still runs, and gpudiag says it could not watch.
Signals: HUP, INT, QUIT, TERM, USR1, USR2 and ALRM sent to gpudiag are passed to the command
(Ctrl-C and Ctrl-\\ from the terminal reach it directly); if gpudiag is killed outright
(SIGKILL), the command is killed too.";

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    // First, so that it is listed under "Arguments" and not under the last heading a
    // flattened group leaves behind.
    /// The command and its arguments, after `--`.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<std::ffi::OsString>,
    /// Print the run report (verdicts, phases, findings) as one line of JSON on stderr instead
    /// of the text summary; stdout stays the command's (assets/schema/run-report.schema.json).
    #[arg(long)]
    pub json: bool,
    /// Also write the run report as JSON to FILE (assets/schema/run-report.schema.json).
    #[arg(long, value_name = "FILE")]
    pub report_file: Option<PathBuf>,
    /// Also write a recording of the run (gzip when the name ends in .gz); with --kernels, what
    /// it recorded too (`gpudiag replay FILE` shows it on K).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Also write a Chrome trace of the run.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The PyTorch profiler trace the command writes: a file, or the directory a
    /// tensorboard_trace_handler writes into (its *.pt.trace.json[.gz] written during the run
    /// are taken). The --trace file becomes that trace with gpudiag's tracks added; with several,
    /// each gets its own file, named after --trace and the profiler's file.
    #[arg(long, value_name = "PATH", requires = "trace")]
    pub profiler_trace: Option<PathBuf>,
    /// Record the kernels, copies, sets and synchronisations of the command's CUDA processes,
    /// with no code change: a CUPTI collector is loaded into each (CUDA_INJECTION64_PATH and
    /// LD_PRELOAD) and reports to gpudiag. Recording costs what torch.profiler costs, a few µs a
    /// kernel launch: code whose launches set its pace (many tiny kernels, small batches) runs up
    /// to a third slower; code that keeps the GPU busy is barely affected. `--kernels=sample`
    /// records 1s of every 30s and detaches CUPTI in between, so the cost is paid only then;
    /// `sample:ON/PERIOD` picks the windows (e.g. sample:2s/30s). Steps aside while
    /// torch.profiler traces, and for another tool that set CUDA_INJECTION64_PATH.
    /// [default: off; `--kernels` alone is `--kernels=full`]
    #[arg(long, value_name = "MODE", num_args = 0..=1, require_equals = true,
          default_missing_value = "full", value_parser = parse_kernels_mode)]
    pub kernels: Option<KernelsMode>,
    /// Replace the output files if they exist.
    #[arg(long)]
    pub force: bool,
    /// Time between samples (50ms or more; the profiling counters need 100ms or more).
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_interval, help_heading = SOURCE_HEADING)]
    pub interval: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// Print the full default configuration file, a comment per key.
    #[arg(long)]
    pub default: bool,
}

pub const PROBE_EXIT_CODES_HELP: &str = "\
Examples:
  gpudiag probe                                     the quick suite on every idle GPU
  gpudiag probe bandwidth matmul --device 0         two probes on GPU 0
  gpudiag probe --suite standard --json             about a minute, results as JSON

Exit codes:
  0  every probe passed, warned or was skipped
  1  a probe failed (wrong matmul result, memory mismatches) or errored, or a GPU was refused
  2  usage error
  3  could not run: no NVIDIA driver (libcuda) or no GPU, or a CUDA call hung well past the
     suite's deadline";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SuiteName {
    Quick,
    Standard,
    Full,
}

impl SuiteName {
    pub fn as_str(self) -> &'static str {
        match self {
            SuiteName::Quick => "quick",
            SuiteName::Standard => "standard",
            SuiteName::Full => "full",
        }
    }
}

/// The probes gpudiag has, as `gpudiag probe --help` lists them: "latency, bandwidth, ... on
/// each GPU; p2p, nccl over all selected GPUs together".
fn probe_list() -> String {
    let (together, each): (Vec<&str>, Vec<&str>) = gpudiag_probes::PROBE_NAMES
        .iter()
        .partition(|n| gpudiag_probes::MULTI_GPU_PROBES.contains(n));
    let mut out = format!("{} on each GPU", each.join(", "));
    if !together.is_empty() {
        out.push_str(&format!(
            "; {} over all selected GPUs together",
            together.join(", ")
        ));
    }
    out
}

fn probe_about() -> String {
    format!(
        "Run probes ({}) on live GPUs; needs only the driver",
        probe_list()
    )
}

fn probe_names_help() -> String {
    format!(
        "Probes to run ({}); none runs the whole suite",
        probe_list()
    )
}

#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    #[arg(value_name = "NAME", help = probe_names_help())]
    pub names: Vec<String>,
    /// Which suite's sizes and budget to use.
    #[arg(long, value_enum, default_value = "quick")]
    pub suite: SuiteName,
    /// Only these GPUs: an index or a UUID; repeat for several [default: every GPU].
    #[arg(long = "device", value_name = "INDEX|UUID")]
    pub devices: Vec<String>,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Probe a GPU even when other processes are using it.
    #[arg(long)]
    pub force: bool,
    /// How long CUDA context creation may take; past it the GPU is refused (exit code 1).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    pub init_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Info,
    Warn,
    Fail,
}

impl From<FailOn> for Severity {
    fn from(f: FailOn) -> Self {
        match f {
            FailOn::Info => Severity::Info,
            FailOn::Warn => Severity::Warn,
            FailOn::Fail => Severity::Fail,
        }
    }
}

/// The help heading of where telemetry comes from (`SourceArgs`, and each command's interval).
pub const SOURCE_HEADING: &str = "Telemetry source";

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = SOURCE_HEADING)]
pub struct SourceArgs {
    /// Read a recording (NDJSON, plain or gzip) or a `gpudiag report` bundle instead of live
    /// GPUs; `-` reads it from stdin.
    #[arg(long, value_name = "FILE", conflicts_with = "demo")]
    pub replay: Option<PathBuf>,
    /// Use the bundled demo recording instead of live GPUs.
    #[arg(long)]
    pub demo: bool,
    /// Only these GPUs: an index or a UUID; repeat for several [default: every GPU].
    #[arg(long = "device", value_name = "INDEX|UUID")]
    pub devices: Vec<String>,
    /// The most a bundle given to --replay may inflate to (the archive and the recording in it),
    /// e.g. 8GiB; past it gpudiag stops with exit code 2.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_INFLATED_ARG, value_parser = parse_size)]
    pub max_inflated_size: u64,
    /// How long NVML initialisation may take before gpudiag gives up on the GPUs (exit code 3;
    /// `run` runs its command anyway).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub init_timeout: Duration,
    /// How long one poll of the GPUs may take; past it the devices are marked stalled and
    /// sampling goes on (a hung driver call no longer freezes gpudiag).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_poll_timeout)]
    pub poll_timeout: Duration,
    /// Where live telemetry comes from: every vendor found (auto), NVIDIA's NVML, AMD's ROCm
    /// SMI or amdgpu sysfs; `replay` goes with --replay.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Read amdgpu sysfs and /proc under this directory instead of / (fake trees in tests).
    #[arg(long, value_name = "PATH", env = gpudiag_telemetry::amd::sysfs::SYSFS_ROOT_ENV, hide = true)]
    pub sysfs_root: Option<PathBuf>,
    #[command(flatten)]
    pub kubelet: KubeletArgs,
}

/// Where the kubelet is, for the pod, namespace and container of GPU processes.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes pod attribution")]
pub struct KubeletArgs {
    /// The kubelet's pod-resources socket, asked which pods hold each GPU (pod, namespace and
    /// container of GPU processes). Nothing is started when it does not exist.
    #[arg(long, value_name = "PATH", env = KUBELET_SOCKET_ENV, default_value = DEFAULT_KUBELET_SOCKET)]
    pub kubelet_socket: PathBuf,
    /// How long the kubelet may take to answer; past it processes go without pod names, with
    /// the reason.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_kubelet_timeout)]
    pub kubelet_timeout: Duration,
    /// How long the kubelet's answer (or failure) is reused before it is asked again.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub kubelet_cache: Duration,
}

impl Default for KubeletArgs {
    /// What the flags default to, for commands that build their source without them.
    fn default() -> Self {
        let k = AttributionOptions::from_env().kubelet;
        KubeletArgs {
            kubelet_socket: k.socket,
            kubelet_timeout: k.deadline,
            kubelet_cache: k.cache_for,
        }
    }
}

impl SourceArgs {
    /// What to open, checked: `--backend` names a live backend, or `replay` with a recording.
    pub fn spec(&self) -> Result<SourceSpec, Error> {
        let recording = match (&self.replay, self.demo) {
            (_, true) => Some(Origin::Demo),
            (Some(path), false) => Some(Origin::File(path.clone())),
            (None, false) => None,
        };
        let origin = match (self.backend, recording) {
            (BackendChoice::Replay, None) => {
                return Err(Error::Usage(
                    "--backend replay needs --replay FILE (or --demo)".into(),
                ));
            }
            (BackendChoice::Auto | BackendChoice::Replay, Some(origin)) => origin,
            (other, Some(_)) => {
                return Err(Error::Usage(format!(
                    "--backend {} reads live GPUs; it cannot go with --replay or --demo",
                    format!("{other:?}").to_lowercase()
                )));
            }
            (BackendChoice::Auto, None) => Origin::Live(LiveBackend::Auto),
            (BackendChoice::Nvml, None) => Origin::Live(LiveBackend::Nvml),
            (BackendChoice::Rocm, None) => Origin::Live(LiveBackend::Rocm),
            (BackendChoice::Sysfs, None) => Origin::Live(LiveBackend::Sysfs),
        };
        Ok(SourceSpec {
            origin,
            devices: self.devices.clone(),
            init_timeout: self.init_timeout,
            poll_timeout: self.poll_timeout,
            sysfs_root: self.sysfs_root.clone(),
            replay: ReplayOptions {
                max_inflated_bytes: self.max_inflated_size,
            },
            attribution: AttributionOptions {
                kubelet: KubeletOptions {
                    socket: self.kubelet.kubelet_socket.clone(),
                    cache_for: self.kubelet.kubelet_cache,
                    deadline: self.kubelet.kubelet_timeout,
                },
                ..AttributionOptions::default()
            },
        })
    }
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    Auto,
    Nvml,
    Rocm,
    Sysfs,
    Replay,
}

impl BackendChoice {
    /// The name `--backend` takes, as reports name the source.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Nvml => "nvml",
            BackendChoice::Rocm => "rocm",
            BackendChoice::Sysfs => "sysfs",
            BackendChoice::Replay => "replay",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Print the versioned JSON check report (assets/schema/check-report.schema.json) instead
    /// of text.
    #[arg(long)]
    pub json: bool,
    /// Sample live GPUs for this long before summarising (`0` for a single read). With --replay
    /// a window keeps only the recording's end [default: 1s; with --replay, the whole
    /// recording].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub window: Option<Duration>,
    /// Exit with code 1 when a finding of this severity or worse is present.
    #[arg(long, value_enum, default_value = "fail")]
    pub fail_on: FailOn,
    /// Also run a probe suite on each GPU and put the results in the report [default: no
    /// probes].
    #[arg(long, value_enum, value_name = "SUITE", conflicts_with_all = ["replay", "demo"])]
    pub probes: Option<SuiteName>,
    /// With --probes: probe GPUs even when other processes are using them.
    #[arg(long, requires = "probes")]
    pub force: bool,
    /// Time between samples inside the window (50ms or more).
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_interval, help_heading = SOURCE_HEADING)]
    pub interval: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// Where to write (gzip when the name ends in .gz).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Stop after this long [default: record until Ctrl-C; a replay to its end].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// Time between samples (50ms or more).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_interval, help_heading = SOURCE_HEADING)]
    pub interval: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// Where to write the trace (JSON; with --merge, gzip when the name ends in .gz).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// How long to sample live GPUs (a replay is traced whole).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Add the recording's tracks to this PyTorch profiler (Kineto) trace, a .json from
    /// export_chrome_trace or the .json.gz of tensorboard_trace_handler, aligned on its clock;
    /// only the time both cover is added. Needs --replay.
    #[arg(long, value_name = "PROFILER_TRACE", requires = "replay")]
    pub merge: Option<PathBuf>,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// Time between samples (50ms or more).
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_interval, help_heading = SOURCE_HEADING)]
    pub interval: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Where to write the bundle [default: gpudiag-report-<UTC time>.tar.gz].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// How long to record live GPUs (a replay is bundled whole).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Keep host names, user names, command lines and home paths as they are.
    #[arg(long)]
    pub no_redact: bool,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// Time between samples (50ms or more).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_interval, help_heading = SOURCE_HEADING)]
    pub interval: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on; loopback by default (`0.0.0.0:9835` exposes it to the network).
    /// Port 0 picks a free port, printed at start.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9835")]
    pub listen: std::net::SocketAddr,
    /// TLS and basic auth for /metrics from a Prometheus exporter web config file
    /// (exporter-toolkit's web-config.yml: tls_server_config, basic_auth_users with bcrypt
    /// hashes). Listening beyond loopback without both prints a warning [default: plain HTTP,
    /// no password].
    #[arg(long = "web.config.file", value_name = "PATH")]
    pub web_config_file: Option<PathBuf>,
    /// At most this many processes get per-process series (gpudiag_process_*) in one scrape,
    /// those holding the most GPU memory; gpudiag_process_series_dropped counts the rest.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PROCESS_CAP)]
    pub max_process_series: usize,
    /// Time between samples (50ms or more).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval, help_heading = SOURCE_HEADING)]
    pub interval: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// The Prometheus (or Mimir, Thanos, Cortex) base URL: http(s)://HOST:PORT[/PATH], the
    /// part before /api/v1. user:password@ in it is basic auth. Credentials and --header values
    /// go to this URL's origin only: a redirect to another scheme, host or port is not followed
    /// (exit 3, naming the target; give that URL here to read it), one within it is.
    #[arg(long, value_name = "URL", env = "GPUDIAG_PROMETHEUS_URL")]
    pub prometheus: String,
    /// Label matchers every GPU series must meet, e.g. '{cluster="a"}'; matchers on job labels
    /// (slurm_job, job_key, joined_by, rank) pick GPUs through gpudiag_gpu_job_info.
    #[arg(long, value_name = "'{LABEL=\"VALUE\",…}'", default_value = "{}")]
    pub selector: String,
    /// The label naming a node; series without it are named by their instance's host.
    #[arg(long, value_name = "LABEL", default_value = "Hostname")]
    pub node_label: String,
    /// Time between refreshes of the terminal UI (1s or more).
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_fleet_interval)]
    pub interval: Duration,
    /// Evaluate at this instant instead of now: RFC 3339 (2026-11-26T10:00:00Z) or Unix
    /// seconds. Alerts are only known for now [default: now].
    #[arg(long, value_name = "TIME", value_parser = parse_instant)]
    pub at: Option<i64>,
    /// Print the fleet once as JSON (assets/schema/fleet-report.schema.json) and exit.
    #[arg(long)]
    pub json: bool,
    /// With --json: exit 1 when a finding or firing alert at or above this severity is present.
    #[arg(long, value_enum, default_value = "fail")]
    pub fail_on: FailOn,
    /// The deadline of each request to Prometheus, connection included.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_query_timeout)]
    pub query_timeout: Duration,
    /// Basic auth user; the password comes from --basic-auth-password-file or
    /// GPUDIAG_PROMETHEUS_PASSWORD [default: none].
    #[arg(long, value_name = "USER", help_heading = ACCESS_HEADING)]
    pub basic_auth_user: Option<String>,
    /// A file holding the basic auth password (its first line) [default:
    /// GPUDIAG_PROMETHEUS_PASSWORD].
    #[arg(long, value_name = "PATH", requires = "basic_auth_user", help_heading = ACCESS_HEADING)]
    pub basic_auth_password_file: Option<PathBuf>,
    /// A file holding a bearer token (sent as Authorization: Bearer) [default: none].
    #[arg(long, value_name = "PATH", conflicts_with = "basic_auth_user", help_heading = ACCESS_HEADING)]
    pub bearer_token_file: Option<PathBuf>,
    /// PEM certificates to trust for https [default: the bundled public roots (Mozilla's)].
    #[arg(long, value_name = "PATH", help_heading = ACCESS_HEADING)]
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate (chain) for mutual TLS; needs --client-key [default: none].
    #[arg(long, value_name = "PATH", requires = "client_key", help_heading = ACCESS_HEADING)]
    pub client_cert: Option<PathBuf>,
    /// The PEM private key of --client-cert [default: none].
    #[arg(long, value_name = "PATH", requires = "client_cert", help_heading = ACCESS_HEADING)]
    pub client_key: Option<PathBuf>,
    /// An extra request header, 'NAME: VALUE' (repeatable), e.g. 'X-Scope-OrgID: tenant-a';
    /// sent to the --prometheus URL's origin only [default: none].
    #[arg(long = "header", value_name = "'NAME: VALUE'", value_parser = parse_header, help_heading = ACCESS_HEADING)]
    pub headers: Vec<(String, String)>,
}

const ACCESS_HEADING: &str = "Access to Prometheus";

fn parse_fleet_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 15s, 1m)"))?;
    if d < Duration::from_secs(1) {
        return Err("the fleet refreshes at most once a second: give 1s or more".to_owned());
    }
    Ok(d)
}

fn parse_query_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 10s)"))?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(600) {
        return Err("give a timeout from 100ms to 10m".to_owned());
    }
    Ok(d)
}

/// An instant as ms since the epoch: RFC 3339 or Unix seconds (with a fraction).
pub fn parse_instant(s: &str) -> Result<i64, String> {
    let text = s.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && (0.0..1e11).contains(&secs) {
            return Ok((secs * 1000.0).round() as i64);
        }
        return Err(format!("{text}: not a Unix time in seconds"));
    }
    let t = humantime::parse_rfc3339_weak(text).map_err(|e| {
        format!("{text}: {e} (write RFC 3339, 2026-11-26T10:00:00Z, or Unix seconds)")
    })?;
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{text}: before 1970"))?
        .as_millis();
    i64::try_from(ms).map_err(|_| format!("{text}: too far in the future"))
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    let Some((name, value)) = s.split_once(':') else {
        return Err(format!("{s:?}: write a header as 'NAME: VALUE'"));
    };
    let name = name.trim();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{name:?}: not a header name"));
    }
    let value = value.trim();
    if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err(format!("the value of {name} holds control characters"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The recording (NDJSON, plain or gzip) or a `gpudiag report` bundle; `-` reads stdin.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Playback speed: 1 plays as recorded, 10 ten times faster.
    #[arg(long, default_value = "1", value_parser = parse_speed)]
    pub speed: f64,
    /// The most a bundle may inflate to (the archive and the recording in it), e.g. 8GiB; past
    /// it gpudiag stops with exit code 2.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_INFLATED_ARG, value_parser = parse_size)]
    pub max_inflated_size: u64,
}

/// `DEFAULT_MAX_INFLATED` as the flag's default is written.
const DEFAULT_MAX_INFLATED_ARG: &str = "4GiB";
const _: () = assert!(DEFAULT_MAX_INFLATED == 4 << 30);

/// A size in bytes: a number with an optional unit, binary (`KiB`, `MiB`, `GiB`, `TiB`, or `K`,
/// `M`, `G`, `T`) or decimal (`kB`, `MB`, `GB`, `TB`); at least one byte.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let text = s.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "size '{s}' has an unknown unit (use e.g. 512MiB, 4GiB, 8GB)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("size '{s}' must be a number with a unit, such as 4GiB"))?;
    let bytes = value * scale as f64;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!(
            "size '{s}' must be at least 1 byte and below 16 EiB"
        ));
    }
    Ok(bytes as u64)
}

/// A replay speed: a positive number.
pub fn parse_speed(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "speed '{s}' must be a positive number such as 0.5, 1 or 10"
        )),
    }
}

/// A poll deadline: at least 10 ms, since below that a healthy read of several GPUs misses it.
pub fn parse_poll_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(10) {
        return Err(format!("poll timeout '{s}' is below the 10ms minimum"));
    }
    Ok(d)
}

/// How long the kubelet may take: at least 10 ms (a Unix-socket round trip takes well under
/// one), and no more than a minute, since the slow-field reader waits for it.
pub fn parse_kubelet_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(60) {
        return Err(format!("kubelet timeout '{s}' is outside 10ms to 60s"));
    }
    Ok(d)
}

/// What `run --kernels` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelsMode {
    /// Everything, all the time.
    Full,
    /// Only in the schedule's windows, CUPTI detached in between.
    Sample(gpudiag_model::kernels::SampleSchedule),
}

impl KernelsMode {
    pub fn schedule(&self) -> Option<gpudiag_model::kernels::SampleSchedule> {
        match self {
            KernelsMode::Full => None,
            KernelsMode::Sample(s) => Some(*s),
        }
    }
}

/// `full`, `sample` or `sample:ON/PERIOD` (durations). A window shorter than 100 ms would be
/// mostly the attaching and detaching; a period past an hour would leave most runs with one
/// window or none.
pub fn parse_kernels_mode(s: &str) -> Result<KernelsMode, String> {
    use gpudiag_model::kernels::SampleSchedule;
    let t = s.trim();
    if t == "full" {
        return Ok(KernelsMode::Full);
    }
    if t == "sample" {
        return Ok(KernelsMode::Sample(SampleSchedule::DEFAULT));
    }
    let Some(spec) = t.strip_prefix("sample:") else {
        return Err(format!(
            "'{s}' is not a kernels mode: use full, sample, or sample:ON/PERIOD (e.g. sample:1s/30s)"
        ));
    };
    let Some((on, period)) = spec.split_once('/') else {
        return Err(format!(
            "'{s}': give the windows as sample:ON/PERIOD, e.g. sample:1s/30s"
        ));
    };
    let (on, period) = (parse_duration(on)?, parse_duration(period)?);
    if on < Duration::from_millis(100) {
        return Err(format!("'{s}': a window under 100ms records too little"));
    }
    if period <= on {
        return Err(format!("'{s}': the period must be longer than the window"));
    }
    if period > Duration::from_secs(3600) {
        return Err(format!("'{s}': a period over 1h leaves too few windows"));
    }
    Ok(KernelsMode::Sample(SampleSchedule {
        on_ms: on.as_millis() as u32,
        period_ms: period.as_millis() as u32,
    }))
}

/// A sampling interval: at least 50 ms, because NVML's fast fields update no faster than that
/// and polling quicker only costs CPU.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(50) {
        return Err(format!("interval '{s}' is below the 50ms minimum"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn kernels_modes_parse_and_bad_ones_say_what_to_write() {
        use gpudiag_model::kernels::SampleSchedule;
        assert_eq!(parse_kernels_mode("full"), Ok(KernelsMode::Full));
        assert_eq!(
            parse_kernels_mode("sample"),
            Ok(KernelsMode::Sample(SampleSchedule::DEFAULT))
        );
        assert_eq!(
            parse_kernels_mode("sample:500ms/10s"),
            Ok(KernelsMode::Sample(SampleSchedule {
                on_ms: 500,
                period_ms: 10_000
            }))
        );
        for bad in [
            "",
            "yes",
            "sample:",
            "sample:1s",
            "sample:10ms/1s",
            "sample:2s/2s",
            "sample:1s/2h",
            "sample:x/1s",
        ] {
            let e = parse_kernels_mode(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        // Bare `--kernels` is full recording, and takes no value from the command after it.
        let cli =
            Cli::try_parse_from(["gpudiag", "run", "--kernels", "--", "python3", "x.py"]).unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!()
        };
        assert_eq!(run.kernels, Some(KernelsMode::Full));
        assert_eq!(run.command, vec!["python3", "x.py"]);
        let cli = Cli::try_parse_from(["gpudiag", "run", "--kernels=sample", "--", "x"]).unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!()
        };
        assert_eq!(
            run.kernels,
            Some(KernelsMode::Sample(SampleSchedule::DEFAULT))
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").unwrap_err().contains("'soon'"));
        assert!(parse_interval("10ms").is_err());
        assert_eq!(parse_interval("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_speed("2"), Ok(2.0));
        assert!(parse_speed("0").unwrap_err().contains("'0'"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(
            parse_size(DEFAULT_MAX_INFLATED_ARG),
            Ok(DEFAULT_MAX_INFLATED)
        );
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1.5 MiB"), Ok(3 << 19));
        assert_eq!(parse_size("8GB"), Ok(8_000_000_000));
        assert_eq!(parse_size("123"), Ok(123));
        for bad in ["", "0", "-1GiB", "4 parsecs", "GiB", "1e30"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
