//! What a process's command line (`/proc/<pid>/cmdline`, readable by anyone) says about who
//! started it as a worker: Python's `multiprocessing` (spawn and forkserver children run a
//! fixed `-c` program), torchrun (its parent's command line), or a fork of its parent (the same
//! command line). Only this verdict leaves here, never the arguments: they may carry paths,
//! tokens and passwords. The classifiers take the arguments, so they are tested on real
//! command lines without a /proc.

use gpudiag_model::attribution::WorkerOf;

/// A command line longer than this is read only this far (Linux allows about 2 MiB of
/// arguments); the markers looked for sit in the first few arguments.
pub const CMDLINE_LIMIT: u64 = 64 << 10;

/// The arguments of a `/proc/<pid>/cmdline` file (NUL-terminated, each lossily decoded).
pub fn parse_cmdline(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Whose worker a process is, from its arguments and its parent's (`None` where it has no
/// parent to be a worker of: a child of init). A `multiprocessing` child says so itself; a
/// torchrun worker's own command line is the user's script, so its parent's says it; a fork
/// keeps its parent's arguments; anything else is a run of its own (`Nobody`: a sweep agent's
/// trial, a notebook kernel's child). torchrun comes before `multiprocessing`: the launcher that
/// made the process a worker is the stronger fact than how it started it.
pub fn worker_of(child: &[String], parent: Option<&[String]>) -> WorkerOf {
    if parent.is_some_and(runs_torchrun) {
        return WorkerOf::Torchrun;
    }
    if is_multiprocessing_child(child) {
        return WorkerOf::Multiprocessing;
    }
    match parent {
        Some(parent) if !child.is_empty() && parent == child => WorkerOf::Fork,
        _ => WorkerOf::Nobody,
    }
}

/// What torchrun's own command line says of the job it launches, for workers whose environment
/// cannot be read (another user's process, under a service without the right to trace it):
/// `/proc/<pid>/cmdline` is readable by anyone. Only these values leave here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TorchrunJob {
    /// `--rdzv-id`: what its workers' `TORCHELASTIC_RUN_ID` say, the same on every node.
    pub run_id: Option<String>,
    /// `--master-addr` and `--master-port`, which the static rendezvous hands its workers.
    pub master_addr: Option<String>,
    pub master_port: Option<String>,
    /// `--nnodes` × `--nproc-per-node` where both are fixed numbers (an elastic `1:4` is not).
    pub world_size: Option<u32>,
}

/// torchrun's options that take the next argument as their value: the script is the first
/// argument that is neither an option nor such a value.
const TORCHRUN_VALUED: [&str; 16] = [
    "--rdzv-id",
    "--rdzv-endpoint",
    "--rdzv-backend",
    "--rdzv-conf",
    "--master-addr",
    "--master-port",
    "--nnodes",
    "--nproc-per-node",
    "--node-rank",
    "--max-restarts",
    "--monitor-interval",
    "--log-dir",
    "--start-method",
    "--local-addr",
    "--role",
    "--redirects",
];

/// The job a torchrun command line launches; `None` when `args` is not torchrun's.
pub fn torchrun_job(args: &[String]) -> Option<TorchrunJob> {
    if !runs_torchrun(args) {
        return None;
    }
    // torchrun's own options: after the launcher (the program, or the interpreter's module or
    // script argument) and before the user's script, whose arguments are the user's.
    let launcher_at = match python_runs(args) {
        Some(PythonRuns::Module(m)) => args.iter().position(|a| a == m || a.ends_with(m))?,
        Some(PythonRuns::Script(path)) => args.iter().position(|a| a == path)?,
        _ => 0,
    };
    let mut options: Vec<(String, Option<String>)> = Vec::new();
    let mut rest = args[launcher_at + 1..].iter();
    while let Some(arg) = rest.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            break;
        };
        // Both spellings are torchrun's: `--rdzv-id` and `--rdzv_id`.
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_owned())),
            None => (flag.replace('_', "-"), None),
        };
        let value = match inline {
            Some(v) => Some(v),
            None if TORCHRUN_VALUED.contains(&format!("--{name}").as_str()) => rest.next().cloned(),
            None => None,
        };
        options.push((name, value));
    }
    let value = |name: &str| {
        options
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.clone())
    };
    // Anything but one short printable token is not an id this reads.
    let token = |v: Option<String>| {
        v.filter(|v| !v.is_empty() && v.len() <= 256 && v.chars().all(|c| c.is_ascii_graphic()))
    };
    let number = |name: &str| value(name).and_then(|v| v.parse::<u32>().ok());
    let world_size = match (value("nnodes"), number("nproc-per-node")) {
        (Some(nodes), Some(per_node)) => nodes
            .parse::<u32>()
            .ok()
            .and_then(|n| n.checked_mul(per_node)),
        // A run on one node names no --nnodes.
        (None, Some(per_node)) => Some(per_node),
        _ => None,
    }
    .filter(|&w| w > 0);
    Some(TorchrunJob {
        // torchrun's default id, shared by every run that names none.
        run_id: token(value("rdzv-id")).filter(|v| v != "none"),
        master_addr: token(value("master-addr")),
        master_port: token(value("master-port")),
        world_size,
    })
}

/// What a Python interpreter's command line runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PythonRuns<'a> {
    Module(&'a str),
    Code(&'a str),
    Script(&'a str),
}

/// The last component of a path.
fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `python`, `python3`, `python3.12`, with or without a directory.
fn is_python(program: &str) -> bool {
    basename(program).starts_with("python")
}

/// What a Python command line runs: `-m module`, `-c code` or a script, after the
/// interpreter's own options. `None` when `args` is not a Python interpreter's or runs nothing
/// named (an interactive one, or a script on standard input).
fn python_runs(args: &[String]) -> Option<PythonRuns<'_>> {
    let (program, rest) = args.split_first()?;
    if !is_python(program) {
        return None;
    }
    let mut rest = rest.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        match arg {
            "-m" => return rest.next().map(PythonRuns::Module),
            "-c" => return rest.next().map(PythonRuns::Code),
            "--" => return rest.next().map(PythonRuns::Script),
            "-" => return None,
            // The options that take their value as the next argument.
            "-W" | "-X" | "--check-hash-based-pycs" => {
                rest.next();
            }
            _ if arg.starts_with("-m") => return Some(PythonRuns::Module(&arg[2..])),
            _ if arg.starts_with("-c") => return Some(PythonRuns::Code(&arg[2..])),
            _ if arg.starts_with('-') => {}
            script => return Some(PythonRuns::Script(script)),
        }
    }
    None
}

/// A child `multiprocessing` started with the spawn or forkserver method (also
/// `torch.multiprocessing.spawn`): `python -c "from multiprocessing.spawn import spawn_main;
/// spawn_main(…)" --multiprocessing-fork`, or the forkserver's own `python -c "from
/// multiprocessing.forkserver import main; main(…)"`, which the workers it forks keep. A frozen
/// executable's spawn child has `--multiprocessing-fork` as its first argument.
fn is_multiprocessing_child(args: &[String]) -> bool {
    if args.get(1).is_some_and(|a| a == "--multiprocessing-fork") {
        return true;
    }
    match python_runs(args) {
        Some(PythonRuns::Code(code)) => {
            code.contains("from multiprocessing.spawn import spawn_main")
                || code.contains("multiprocessing.forkserver")
                || args.last().is_some_and(|a| a == "--multiprocessing-fork")
        }
        _ => false,
    }
}

/// torchrun, or `torch.distributed.run` or `torch.distributed.launch` by module or by path. An
/// installed `torchrun` is a Python script, so the kernel shows it as the interpreter's first
/// argument (`/usr/bin/python3 /usr/local/bin/torchrun …`).
fn runs_torchrun(args: &[String]) -> bool {
    const MODULES: [&str; 2] = ["torch.distributed.run", "torch.distributed.launch"];
    const SCRIPTS: [&str; 2] = ["torch/distributed/run.py", "torch/distributed/launch.py"];
    let is_launcher_script =
        |path: &str| basename(path) == "torchrun" || SCRIPTS.iter().any(|s| path.ends_with(s));
    match python_runs(args) {
        Some(PythonRuns::Module(m)) => MODULES.contains(&m),
        Some(PythonRuns::Script(path)) => is_launcher_script(path),
        Some(PythonRuns::Code(_)) => false,
        None => args.first().is_some_and(|p| is_launcher_script(p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments of a command line as /proc shows it, NUL-separated and NUL-terminated.
    fn cmdline(args: &[&str]) -> Vec<String> {
        let mut bytes = Vec::new();
        for a in args {
            bytes.extend_from_slice(a.as_bytes());
            bytes.push(0);
        }
        parse_cmdline(&bytes)
    }

    const SPAWN_CODE: &str =
        "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)";

    #[test]
    fn arguments_are_nul_separated_and_lossy() {
        assert_eq!(
            parse_cmdline(b"python3\0-u\0train.py\0"),
            ["python3", "-u", "train.py"]
        );
        // Without the final NUL (a process that rewrote its arguments), and an empty argument.
        assert_eq!(parse_cmdline(b"a\0\0b"), ["a", "", "b"]);
        assert_eq!(parse_cmdline(b"\xffx\0"), ["\u{fffd}x"]);
        assert!(parse_cmdline(b"").is_empty());
        assert!(parse_cmdline(b"\0").is_empty());
    }

    /// The PyTorch DDP tutorial's `mp.spawn`: its children name no launcher variable, their
    /// command line says whose they are.
    #[test]
    fn a_spawn_child_is_a_multiprocessing_worker() {
        let parent = cmdline(&["python", "ddp_tutorial.py"]);
        let child = cmdline(&["python", "-c", SPAWN_CODE, "--multiprocessing-fork"]);
        assert_eq!(worker_of(&child, Some(&parent)), WorkerOf::Multiprocessing);
        // Without a parent, the child still says it.
        assert_eq!(worker_of(&child, None), WorkerOf::Multiprocessing);
        // The interpreter's flags come first (`util._args_from_interpreter_flags`).
        let flagged = cmdline(&[
            "/opt/conda/bin/python3.11",
            "-W",
            "ignore",
            "-X",
            "faulthandler",
            "-c",
            SPAWN_CODE,
            "--multiprocessing-fork",
        ]);
        assert_eq!(worker_of(&flagged, None), WorkerOf::Multiprocessing);
        // A frozen executable's spawn child.
        let frozen = cmdline(&["/opt/app/trainer", "--multiprocessing-fork", "parent_pid=7"]);
        assert_eq!(worker_of(&frozen, None), WorkerOf::Multiprocessing);
    }

    /// The forkserver runs a fixed program; the workers it forks keep its command line.
    #[test]
    fn a_forkserver_worker_is_a_multiprocessing_worker() {
        let forkserver = cmdline(&[
            "/usr/bin/python3",
            "-c",
            "from multiprocessing.forkserver import main; main(10, 11, ['__main__'], \
             **{'sys_path': ['/work'], 'main_path': '/work/train.py'})",
        ]);
        assert_eq!(
            worker_of(&forkserver, Some(&forkserver)),
            WorkerOf::Multiprocessing
        );
    }

    /// torchrun's workers run the user's script (with `-u`): the parent says whose they are,
    /// however torchrun was started.
    #[test]
    fn a_torchrun_worker_is_known_by_its_parent() {
        let worker = cmdline(&["/usr/bin/python3", "-u", "train.py", "--epochs", "3"]);
        for parent in [
            &[
                "/usr/bin/python3",
                "/usr/local/bin/torchrun",
                "--nproc-per-node",
                "4",
                "train.py",
            ][..],
            &[
                "/venv/bin/torchrun",
                "--standalone",
                "--nproc_per_node=8",
                "train.py",
            ],
            &[
                "python",
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "train.py",
            ],
            &[
                "python3",
                "-u",
                "-mtorch.distributed.launch",
                "--use-env",
                "train.py",
            ],
            &[
                "/usr/bin/python3.12",
                "/usr/lib/python3.12/site-packages/torch/distributed/run.py",
                "train.py",
            ],
        ] {
            assert_eq!(
                worker_of(&worker, Some(&cmdline(parent))),
                WorkerOf::Torchrun,
                "{parent:?}"
            );
        }
    }

    /// A sweep agent or a Jupyter kernel starts independent Python children: nothing in the
    /// command lines ties them, and the command lines say so.
    /// The job torchrun launches, from its command line in each form it is started.
    #[test]
    fn torchruns_command_line_names_its_job() {
        let installed = cmdline(&[
            "/usr/bin/python3",
            "/usr/local/bin/torchrun",
            "--nnodes",
            "2",
            "--nproc-per-node=4",
            "--rdzv_id",
            "job-7",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "node-0:29400",
            "train.py",
            "--rdzv-id",
            "not-torchruns",
        ]);
        assert_eq!(
            torchrun_job(&installed),
            Some(TorchrunJob {
                run_id: Some("job-7".into()),
                master_addr: None,
                master_port: None,
                world_size: Some(8),
            })
        );
        let module = cmdline(&[
            "python",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "--master_addr=127.0.0.1",
            "--master-port",
            "29500",
            "ddp.py",
        ]);
        let job = torchrun_job(&module).unwrap();
        assert_eq!(job.run_id, None);
        assert_eq!(job.master_addr.as_deref(), Some("127.0.0.1"));
        assert_eq!(job.master_port.as_deref(), Some("29500"));
        assert_eq!(job.world_size, Some(2));
        // Elastic node counts and torchrun's default id say nothing; a script's own flags are
        // its own; a program that is not torchrun has no job here.
        let elastic = cmdline(&[
            "torchrun",
            "--nnodes=1:4",
            "--nproc-per-node",
            "8",
            "--rdzv-id",
            "none",
            "t.py",
        ]);
        let job = torchrun_job(&elastic).unwrap();
        assert_eq!((job.run_id, job.world_size), (None, None));
        let script_flags = cmdline(&["torchrun", "t.py", "--master-addr", "evil"]);
        assert_eq!(torchrun_job(&script_flags).unwrap().master_addr, None);
        let odd = cmdline(&["torchrun", "--rdzv-id", "a b\u{1b}[2J", "t.py"]);
        assert_eq!(torchrun_job(&odd).unwrap().run_id, None);
        assert_eq!(
            torchrun_job(&cmdline(&["python", "train.py", "--rdzv-id", "x"])),
            None
        );
    }

    #[test]
    fn a_sweep_agents_or_a_kernels_children_are_nobodys_workers() {
        let agent = cmdline(&["python", "sweep.py"]);
        let trial = cmdline(&["python", "train.py", "--lr", "0.1"]);
        assert_eq!(worker_of(&trial, Some(&agent)), WorkerOf::Nobody);
        let kernel = cmdline(&[
            "/opt/conda/bin/python",
            "-m",
            "ipykernel_launcher",
            "-f",
            "/root/.local/share/jupyter/runtime/kernel-3f1c2d.json",
        ]);
        let child = cmdline(&["/opt/conda/bin/python", "finetune.py"]);
        assert_eq!(worker_of(&child, Some(&kernel)), WorkerOf::Nobody);
        // The kernel itself, started by the notebook server.
        let server = cmdline(&["/opt/conda/bin/python", "/opt/conda/bin/jupyter-lab"]);
        assert_eq!(worker_of(&kernel, Some(&server)), WorkerOf::Nobody);
        // Words in a script's arguments are not a launcher.
        let named = cmdline(&["python", "train.py", "--launcher", "torchrun"]);
        assert_eq!(worker_of(&trial, Some(&named)), WorkerOf::Nobody);
        let quoted = cmdline(&["python", "train.py", "--multiprocessing-fork"]);
        assert_eq!(worker_of(&quoted, Some(&agent)), WorkerOf::Nobody);
        // A child of init has no launcher to be a worker of.
        assert_eq!(worker_of(&trial, None), WorkerOf::Nobody);
    }

    #[test]
    fn a_fork_keeps_its_parents_command_line() {
        let trainer = cmdline(&["python", "train.py", "--lr", "0.1"]);
        assert_eq!(worker_of(&trainer, Some(&trainer)), WorkerOf::Fork);
        // Empty command lines (zombies, kernel threads) are not alike.
        assert_eq!(worker_of(&[], Some(&[])), WorkerOf::Nobody);
    }
}
