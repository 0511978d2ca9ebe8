//! What gpudiag's own process reader (`Attributor::process`, as `serve` and the TUI use it)
//! makes of another user's training process, read as a user without capabilities (the systemd
//! unit), as root (the Slurm prolog), and as that user under `/proc` mounted `hidepid=2`. The
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
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.cgroup {
            // The job's directories, innermost first; the hierarchy's own root stays.
            for d in dir.ancestors().take(4) {
                let _ = std::fs::remove_dir(d);
            }
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
    let cgroup = [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup",
    ]
    .iter()
    .map(|h| std::path::Path::new(h).join(&job))
    .find(|dir| {
        std::fs::create_dir_all(dir).is_ok()
            && std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).is_ok()
    });
    if cgroup.is_none() {
        eprintln!("no cgroup hierarchy here lets root make a job's group: cgroup not checked");
    }
    Target { child, cgroup }
}

/// Reads `pid` on a thread of its own that first becomes `uid` (when given) and mounts its own
/// `/proc` with `hidepid=2` (when asked).
fn read_as(pid: u32, uid: Option<u32>, hidepid: bool) -> ProcessSample {
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
            // wrappers would change every thread's); leaving uid 0 clears the capabilities.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
                    0
                );
                assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
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
