//! What gpudiag's own process reader (`Attributor::process`, as `serve` and the TUI use it)
//! makes of another user's training process, read as a user without capabilities (the systemd
//! unit), with `CAP_SYS_PTRACE`, with it and `CAP_DAC_READ_SEARCH` (docs/attribution.md's
//! drop-in), as root (the Slurm prolog), and as that user under `/proc` mounted `hidepid=2`. The
//! same cases as `benches/proc_visibility.sh`, through the code rather than `cat`. The reader is
//! a thread whose own credentials (and mount namespace, for hidepid) are changed with raw
//! system calls, which on Linux act on the calling thread only; the test process is its own
//! (nextest runs each test in a process of its own).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use gpudiag_model::attribution::FoundIn;
use gpudiag_model::sample::ProcessSample;
use gpudiag_telemetry::attribution::{AttributionOptions, Attributor};

/// Uids no account is likely to have; the reader names users by number where passwd does not.
const OWNER_UID: u32 = 64_011;
const READER_UID: u32 = 64_012;

struct Target {
    child: Child,
    cgroup: Option<std::path::PathBuf>,
    /// The outermost directory this test made, removed last.
    made_from: Option<std::path::PathBuf>,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.cgroup {
            drop_dirs(dir, self.made_from.as_deref());
        }
    }
}

/// A process of `OWNER_UID` with a launcher's environment, moved into a cgroup named as
/// slurmd's v1 plugin names a job's, where a cgroup hierarchy here lets root make one.
fn start_target() -> Target {
    let child = Command::new("sleep")
        .arg("120")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MASTER_ADDR", "10.1.2.3")
        .env("MASTER_PORT", "29500")
        .env("RANK", "3")
        .env("WORLD_SIZE", "8")
        .env("SLURM_JOB_ID", "4242")
        .uid(OWNER_UID)
        .gid(OWNER_UID)
        .spawn()
        .expect("run sleep as another uid");
    let job = format!("slurm/uid_{OWNER_UID}/job_4242/step_0/task_0");
    let mut target = Target {
        child,
        cgroup: None,
        made_from: None,
    };
    for hierarchy in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup",
    ] {
        let dir = std::path::Path::new(hierarchy).join(&job);
        // The outermost directory of the job's path that does not exist yet: ours to remove.
        let made_from = dir
            .ancestors()
            .take_while(|d| !d.exists())
            .last()
            .map(std::path::Path::to_path_buf);
        if std::fs::create_dir_all(&dir).is_ok() {
            if std::fs::write(dir.join("cgroup.procs"), target.child.id().to_string()).is_ok() {
                target.cgroup = Some(dir);
                target.made_from = made_from;
                return target;
            }
            drop_dirs(&dir, made_from.as_deref());
        }
    }
    eprintln!("no cgroup hierarchy here lets root make a job's group: cgroup not checked");
    target
}

/// Removes `dir` and its parents up to `outer`, where they are empty.
fn drop_dirs(dir: &std::path::Path, outer: Option<&std::path::Path>) {
    let Some(outer) = outer else { return };
    for d in dir.ancestors() {
        let _ = std::fs::remove_dir(d);
        if d == outer {
            break;
        }
    }
}

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;

/// Reads `pid` on a thread of its own that first becomes `uid` (when given) keeping only the
/// capabilities `caps` (bit numbers), and mounts its own `/proc` with `hidepid=2` (when asked).
fn read_as(pid: u32, uid: Option<u32>, hidepid: bool) -> ProcessSample {
    read_with_caps(pid, uid, &[], hidepid)
}

fn read_with_caps(pid: u32, uid: Option<u32>, caps: &[u32], hidepid: bool) -> ProcessSample {
    let caps = caps.to_vec();
    std::thread::spawn(move || {
        if hidepid {
            // SAFETY: plain system calls on this thread's own namespace and mounts.
            unsafe {
                assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0, "unshare(CLONE_NEWNS)");
                let root = c"/";
                let none = c"none";
                assert_eq!(
                    libc::mount(
                        none.as_ptr(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null()
                    ),
                    0,
                    "make / private"
                );
                let proc_ = c"proc";
                let at = c"/proc";
                let opts = c"hidepid=2";
                assert_eq!(
                    libc::mount(
                        proc_.as_ptr(),
                        at.as_ptr(),
                        proc_.as_ptr(),
                        0,
                        opts.as_ptr().cast()
                    ),
                    0,
                    "mount proc with hidepid=2: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        if let Some(uid) = uid {
            // SAFETY: the raw system calls change this thread's credentials only (glibc's
            // wrappers would change every thread's). Leaving uid 0 clears the capabilities but
            // those kept: KEEPCAPS keeps the permitted set, capset then sets what stays.
            unsafe {
                assert_eq!(libc::prctl(libc::PR_SET_KEEPCAPS, 1 as libc::c_ulong), 0);
                let no_groups = std::ptr::null::<u32>();
                assert_eq!(libc::syscall(libc::SYS_setgroups, 0, no_groups), 0);
                assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
                let mask = caps.iter().fold(0u32, |m, c| m | 1 << c);
                // _LINUX_CAPABILITY_VERSION_3 for this thread; two 32-bit words of each set
                // (effective, permitted, inheritable).
                let header: [u32; 2] = [0x2008_0522, 0];
                let data: [[u32; 3]; 2] = [[mask, mask, 0], [0, 0, 0]];
                assert_eq!(
                    libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()),
                    0,
                    "capset: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        let attributor = Attributor::new(AttributionOptions::default());
        attributor.process(pid, &attributor.passwd(), &Err("no kubelet".into()))
    })
    .join()
    .expect("the reader thread")
}

#[test]
#[ignore = "needs root (runs processes as other uids, mounts a proc with hidepid=2); CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn another_users_process_as_each_deployment_reads_it() {
    // SAFETY: reads this process's effective uid.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let target = start_target();
    let pid = target.child.id();
    std::thread::sleep(std::time::Duration::from_millis(200));

    // Root (the Slurm prolog): the environment too.
    let root = read_as(pid, None, false);
    let launch = root.launch.as_ref().unwrap();
    assert_eq!(launch.master_addr.as_deref(), Some("10.1.2.3"));
    assert_eq!(launch.rank, Some(3));
    assert_eq!(launch.world_size, Some(8));
    let job = root.attribution.as_ref().unwrap().job.as_ref().unwrap();
    assert_eq!(job.id, "4242");

    // Another user without capabilities (the systemd unit): no environment, no executable
    // link, but the owner, the parent and the cgroup.
    let other = read_as(pid, Some(READER_UID), false);
    let launch = other.launch.as_ref().unwrap();
    assert!(launch.absent.contains_key("environ"), "{launch:?}");
    assert!(launch.absent.contains_key("exe"), "{launch:?}");
    assert_eq!(launch.master_addr, None);
    assert_eq!(launch.rank, None);
    assert!(launch.parent_pid.is_some());
    assert_eq!(other.user.as_deref(), Some(OWNER_UID.to_string().as_str()));
    if target.cgroup.is_some() {
        let job = other.attribution.as_ref().unwrap().job.as_ref().unwrap();
        assert_eq!(job.id, "4242");
        assert_eq!(job.found_in, FoundIn::Cgroup);
    }

    // With CAP_SYS_PTRACE the executable link opens, the environment still not: it is a file of
    // mode 0400. With CAP_DAC_READ_SEARCH as well, everything root reads.
    let ptrace = read_with_caps(pid, Some(READER_UID), &[CAP_SYS_PTRACE], false);
    let launch = ptrace.launch.as_ref().unwrap();
    assert!(launch.exe.is_some(), "{launch:?}");
    assert!(launch.absent.contains_key("environ"), "{launch:?}");
    assert_eq!(launch.rank, None);
    let both = read_with_caps(
        pid,
        Some(READER_UID),
        &[CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH],
        false,
    );
    let launch = both.launch.as_ref().unwrap();
    assert_eq!(launch.rank, Some(3), "{launch:?}");
    assert_eq!(launch.master_addr.as_deref(), Some("10.1.2.3"));

    // The same user under hidepid=2: nothing of the process but its pid.
    let hidden = read_as(pid, Some(READER_UID), true);
    assert_eq!(hidden.user, None);
    assert_eq!(hidden.name, None);
    let launch = hidden.launch.as_ref().unwrap();
    assert_eq!(launch.parent_pid, None);
    assert!(launch.absent.contains_key("environ"));
    assert!(
        hidden
            .attribution
            .as_ref()
            .is_none_or(|a| a.job.is_none() && a.pod.is_none())
    );
    drop(target);
}
