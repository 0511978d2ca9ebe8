//! The kernel log since boot, and the NVRM XID lines in it.
//!
//! NVML reports an XID only to an event set that was listening when it happened, so a fault
//! from before gpudiag started (the job that died an hour ago) reaches it only through the
//! kernel log, where the driver writes `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen
//! off the bus.`. This module reads that log (the bug-report bundle keeps its NVRM lines, `check`
//! and the terminal UI judge its XIDs) and parses the lines; it never writes or clears it.
//!
//! The log is read from `/dev/kmsg` directly, without blocking: opening it starts at the oldest
//! record the ring buffer still holds, and a read past the newest answers EAGAIN instead of
//! waiting for the next message. Many hosts restrict it (`kernel.dmesg_restrict=1` leaves it to
//! root and CAP_SYSLOG; containers often have no `/dev/kmsg`); the error then says so and the
//! caller reports that it could not look, rather than that it found nothing. Every read is
//! bounded in records, bytes and time, because it runs at the start of every `check`.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpudiag_model::sample::TimeMs;

/// Points the log at a file (or a device such as `/dev/kmsg`) instead of `/dev/kmsg`: records
/// in `/dev/kmsg`'s format (`6,1234,5678901234,-;NVRM: Xid ...`), `dmesg` lines
/// (`[ 5678.901234] NVRM: Xid ...`) or bare messages, one a line. Tests use it; so can a user
/// judging a log saved from another boot (the times are then placed on this host's boot).
/// An empty value turns the kernel log off.
pub const KMSG_PATH_ENV: &str = "GPUDIAG_KMSG_PATH";

/// The kernel's own log device.
pub const KMSG: &str = "/dev/kmsg";

/// Records read at most: the ring buffer is bounded (256 KiB to 32 MiB), this only guards a loop.
pub const MAX_RECORDS: usize = 200_000;
/// Bytes read at most, for a file that is not a ring buffer.
pub const MAX_BYTES: u64 = 32 << 20;
/// How long a read may take before what was read so far is used.
pub const READ_TIMEOUT: Duration = Duration::from_millis(500);
/// XID lines kept at most (the newest): an XID storm must not grow a report without bound.
pub const MAX_XIDS: usize = 10_000;

/// Where the kernel log is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelLogSource {
    /// `/dev/kmsg`.
    System,
    /// A saved log or another device (see [`KMSG_PATH_ENV`]).
    File(PathBuf),
    /// Not read (tests with fake roots; `GPUDIAG_KMSG_PATH` set to nothing).
    Off,
}

impl KernelLogSource {
    /// [`KMSG_PATH_ENV`] when set, else `/dev/kmsg`.
    pub fn from_env() -> Self {
        match std::env::var_os(KMSG_PATH_ENV) {
            Some(p) if p.is_empty() => KernelLogSource::Off,
            Some(p) => KernelLogSource::File(p.into()),
            None => KernelLogSource::System,
        }
    }

    /// What a report names as the source.
    pub fn describe(&self) -> String {
        match self {
            KernelLogSource::System => KMSG.into(),
            KernelLogSource::File(p) => p.display().to_string(),
            KernelLogSource::Off => "nothing (kernel log reading is off)".into(),
        }
    }
}

/// One message of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the kernel logged it, in µs since boot (its printk clock), where the line says.
    pub since_boot_us: Option<u64>,
    /// The message, without the record's header or the `dmesg` time stamp.
    pub text: String,
}

impl LogLine {
    /// The line as `dmesg` prints it: `[ 5678.901234] message` (or the message alone).
    pub fn dmesg_style(&self) -> String {
        match self.since_boot_us {
            Some(us) => format!(
                "[{:>5}.{:06}] {}",
                us / 1_000_000,
                us % 1_000_000,
                self.text
            ),
            None => self.text.clone(),
        }
    }
}

/// The messages a read kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRead {
    /// `/dev/kmsg` or the file read.
    pub source: String,
    pub lines: Vec<LogLine>,
    /// Why the read stopped before the end of the log (a bound), if it did.
    pub truncated: Option<String>,
}

/// Reads the messages for which `keep` holds, oldest first. `Err` says why nothing could be
/// read (permissions, no such device), in words a report can quote.
pub fn read_matching(
    source: &KernelLogSource,
    keep: impl Fn(&str) -> bool,
) -> Result<LogRead, String> {
    let path: &Path = match source {
        KernelLogSource::System => Path::new(KMSG),
        KernelLogSource::File(p) => p,
        KernelLogSource::Off => return Err("kernel log reading is off".into()),
    };
    let started = Instant::now();
    let mut file = open_nonblocking(path).map_err(|e| unreadable(path, &e))?;
    let is_device = file
        .metadata()
        .map(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_char_device()
        })
        .unwrap_or(false);
    let mut out = LogRead {
        source: path.display().to_string(),
        lines: Vec::new(),
        truncated: None,
    };
    if is_device {
        read_records(&mut file, path, &keep, started, &mut out)?;
    } else {
        let mut bytes = Vec::new();
        (&mut file)
            .take(MAX_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| unreadable(path, &e))?;
        if bytes.len() as u64 >= MAX_BYTES {
            out.truncated = Some(format!("read the first {} MiB only", MAX_BYTES >> 20));
        }
        out.lines = String::from_utf8_lossy(&bytes)
            .lines()
            .map(split_line)
            .filter(|(_, text)| keep(text))
            .map(|(since_boot_us, text)| LogLine {
                since_boot_us,
                text: text.to_owned(),
            })
            .collect();
    }
    Ok(out)
}

fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// The reason a read failed, with what usually causes it.
fn unreadable(path: &Path, e: &std::io::Error) -> String {
    let hint = match e.kind() {
        std::io::ErrorKind::PermissionDenied if path == Path::new(KMSG) => {
            let restricted = std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict")
                .is_ok_and(|v| v.trim() == "1");
            if restricted {
                " (kernel.dmesg_restrict=1: only root or CAP_SYSLOG may read the kernel log)"
            } else {
                " (reading the kernel log needs root or CAP_SYSLOG here)"
            }
        }
        std::io::ErrorKind::NotFound if path == Path::new(KMSG) => {
            " (no /dev/kmsg: a container or a sandbox without the kernel log)"
        }
        _ => "",
    };
    format!("{}: {e}{hint}", path.display())
}

/// Reads the ring buffer record by record until EAGAIN (its end) or a bound.
fn read_records(
    file: &mut std::fs::File,
    path: &Path,
    keep: &impl Fn(&str) -> bool,
    started: Instant,
    out: &mut LogRead,
) -> Result<(), String> {
    // One record per read; a buffer smaller than a record is EINVAL, and records are at most a
    // few KiB (message plus continuation lines).
    let mut buf = vec![0u8; 16 * 1024];
    let mut bytes = 0u64;
    for n_read in 0.. {
        if n_read >= MAX_RECORDS {
            out.truncated = Some(format!("stopped after {MAX_RECORDS} records"));
            break;
        }
        if bytes >= MAX_BYTES {
            out.truncated = Some(format!("stopped after {} MiB", MAX_BYTES >> 20));
            break;
        }
        if started.elapsed() > READ_TIMEOUT {
            out.truncated = Some(format!(
                "stopped after {} ms of reading",
                READ_TIMEOUT.as_millis()
            ));
            break;
        }
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                bytes += n as u64;
                let rec = String::from_utf8_lossy(&buf[..n]);
                let (since_boot_us, text) = split_line(rec.lines().next().unwrap_or(""));
                if keep(text) {
                    out.lines.push(LogLine {
                        since_boot_us,
                        text: text.to_owned(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // The ring buffer overwrote records while reading: go on with the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The first read is where a restricted /dev/kmsg says no on some kernels.
            Err(e) if out.lines.is_empty() && bytes == 0 => return Err(unreadable(path, &e)),
            Err(e) => {
                out.truncated = Some(format!("stopped by a read error: {e}"));
                break;
            }
        }
    }
    Ok(())
}

/// One line of a log: a `/dev/kmsg` record (`prio,seq,usec,flags[,...];message`), a `dmesg`
/// line (`[   12.345678] message`), or a bare message.
pub fn parse_line(line: &str) -> LogLine {
    let (since_boot_us, text) = split_line(line);
    LogLine {
        since_boot_us,
        text: text.to_owned(),
    }
}

/// `parse_line` without copying the message: most of a log is filtered out unread.
fn split_line(line: &str) -> (Option<u64>, &str) {
    let line = line.trim_end_matches(['\r', '\n']);
    if let Some((header, message)) = line.split_once(';') {
        let mut fields = header.split(',');
        let prio = fields.next();
        let seq = fields.next();
        let usec = fields.next();
        let numeric = |f: Option<&str>| f.is_some_and(|f| f.parse::<u64>().is_ok());
        if numeric(prio)
            && numeric(seq)
            && let Some(us) = usec.and_then(|u| u.parse::<u64>().ok())
        {
            return (Some(us), message);
        }
    }
    if let Some(rest) = line.strip_prefix('[')
        && let Some((stamp, message)) = rest.split_once(']')
        && let Some(us) = seconds_to_us(stamp.trim())
    {
        return (Some(us), message.trim_start());
    }
    (None, line)
}

/// `5678.901234` (seconds, up to µs) as µs.
fn seconds_to_us(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() || frac.len() > 6 {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    whole.checked_mul(1_000_000)?.checked_add(frac)
}

/// A PCI address to the device: what NVRM prints (`0000:3b:00`) and what NVML reports
/// (`00000000:3B:00.0`) in one comparable form. The function is left out: NVRM omits it and a
/// GPU is function 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
}

impl PciAddress {
    /// Parses `DOMAIN:BUS:DEVICE[.FUNCTION]` (any case, any domain width, an optional `PCI:`
    /// prefix) or `BUS:DEVICE[.FUNCTION]` (domain 0).
    pub fn parse(s: &str) -> Option<PciAddress> {
        let s = s.trim();
        let s = s.strip_prefix("PCI:").unwrap_or(s);
        let s = s.split_once('.').map_or(s, |(a, _)| a);
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return None,
        };
        // Digits only: `from_str_radix` alone would take a sign.
        let hex = |x: &str, max: usize| {
            !x.is_empty() && x.len() <= max && x.bytes().all(|c| c.is_ascii_hexdigit())
        };
        if !(hex(domain, 8) && hex(bus, 2) && hex(device, 2)) {
            return None;
        }
        Some(PciAddress {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u8::from_str_radix(bus, 16).ok()?,
            device: u8::from_str_radix(device, 16).ok()?,
        })
    }
}

impl fmt::Display for PciAddress {
    /// The form NVRM prints: `0000:3b:00`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

/// An XID line of the kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedXid {
    pub pci: PciAddress,
    pub xid: u64,
    pub since_boot_us: Option<u64>,
    /// When it was logged (ms since the epoch), where the line and the boot time say.
    pub time_ms: Option<TimeMs>,
    /// The message, as the driver wrote it.
    pub text: String,
}

/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...` (or `NVRM: Xid (0000:3b:00): 79, ...` from
/// older drivers) as the GPU's address and the XID.
pub fn parse_xid(text: &str) -> Option<(PciAddress, u64)> {
    let rest = &text[text.find("NVRM: Xid")? + "NVRM: Xid".len()..];
    let rest = rest.trim_start().strip_prefix('(')?;
    let (inside, after) = rest.split_once(')')?;
    // The address is the first word; later drivers may add more inside the parentheses.
    let pci = PciAddress::parse(inside.split_whitespace().next()?)?;
    let after = after.trim_start().strip_prefix(':')?.trim_start();
    let digits: &str = &after[..after
        .bytes()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(after.len())];
    Some((pci, digits.parse().ok()?))
}

/// Whether a message is an NVRM XID line (the cheap test before parsing).
pub fn is_xid_line(text: &str) -> bool {
    text.contains("NVRM: Xid")
}

/// The XIDs the kernel logged since boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidLog {
    pub source: String,
    /// Oldest first; the newest [`MAX_XIDS`] at most.
    pub xids: Vec<LoggedXid>,
    /// Boot time (ms since the epoch) the times were placed on; `None` when unknown.
    pub boot_ms: Option<TimeMs>,
    /// Why the read, or the list, stopped short, if it did.
    pub truncated: Option<String>,
}

/// Reads the XIDs of the kernel log. `proc_root` is where `stat` gives the boot time (`/proc`).
pub fn read_xids(source: &KernelLogSource, proc_root: &Path) -> Result<XidLog, String> {
    let read = read_matching(source, is_xid_line)?;
    let boot_ms = boot_time_ms(proc_root);
    let mut xids = xids_in(read.lines, boot_ms);
    let mut truncated = read.truncated;
    if xids.len() > MAX_XIDS {
        let dropped = xids.len() - MAX_XIDS;
        xids.drain(..dropped);
        truncated.get_or_insert(format!("kept the newest {MAX_XIDS} XID lines"));
    }
    Ok(XidLog {
        source: read.source,
        xids,
        boot_ms,
        truncated,
    })
}

/// The XIDs among `lines`, their times placed on `boot_ms`.
pub fn xids_in(
    lines: impl IntoIterator<Item = LogLine>,
    boot_ms: Option<TimeMs>,
) -> Vec<LoggedXid> {
    lines
        .into_iter()
        .filter_map(|l| {
            let (pci, xid) = parse_xid(&l.text)?;
            Some(LoggedXid {
                pci,
                xid,
                since_boot_us: l.since_boot_us,
                time_ms: boot_ms
                    .zip(l.since_boot_us)
                    .map(|(b, us)| b.saturating_add(us / 1000)),
                text: l.text,
            })
        })
        .collect()
}

/// Boot time in ms since the epoch, from `btime` of `/proc/stat` (whole seconds; the kernel's
/// log clock does not run during suspend, so on a host that slept, log times come out early).
pub fn boot_time_ms(proc_root: &Path) -> Option<TimeMs> {
    let stat = std::fs::read_to_string(proc_root.join("stat")).ok()?;
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    secs.checked_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const XID_79: &str = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU \
                          has fallen off the bus.";
    const XID_48: &str = "NVRM: Xid (PCI:0000:19:00): 48, pid=1234, name=python3, An \
                          uncorrectable double bit error (DBE) has been detected on GPU in the \
                          framebuffer at partition 0, subpartition 0.";
    const XID_13: &str = "NVRM: Xid (PCI:0000:19:00): 13, pid=2211, name=python3, Graphics SM \
                          Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address";

    #[test]
    fn xid_lines_of_every_driver_generation_parse() {
        let at = |d, b, v| PciAddress {
            domain: d,
            bus: b,
            device: v,
        };
        assert_eq!(parse_xid(XID_79), Some((at(0, 0x3b, 0), 79)));
        assert_eq!(parse_xid(XID_48), Some((at(0, 0x19, 0), 48)));
        assert_eq!(parse_xid(XID_13), Some((at(0, 0x19, 0), 13)));
        // Older drivers: no `PCI:`, no pid; a second PCI domain.
        assert_eq!(
            parse_xid("NVRM: Xid (0001:C1:00): 31, Ch 00000008, intr 10000000. MMU Fault"),
            Some((at(1, 0xc1, 0), 31))
        );
        assert_eq!(
            parse_xid("NVRM: Xid (PCI:0000:01:00): 79, pid=1122, GPU has fallen off the bus."),
            Some((at(0, 1, 0), 79))
        );
        for not_xid in [
            "NVRM: GPU at PCI:0000:3b:00: GPU-8c41d0e5-2f7a-4b93-86de-15ab3c9e7f42",
            "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
            "NVRM: Xid (PCI:0000:3b:00): , pid=1",
            "NVRM: Xid (PCI:zz:3b:00): 79, pid=1",
            "NVRM: Xid (PCI:0000:3b:00) 79",
        ] {
            assert_eq!(parse_xid(not_xid), None, "{not_xid}");
        }
    }

    #[test]
    fn nvml_and_nvrm_addresses_compare_equal() {
        let nvml = PciAddress::parse("00000000:3B:00.0").unwrap();
        let nvrm = PciAddress::parse("PCI:0000:3b:00").unwrap();
        assert_eq!(nvml, nvrm);
        assert_eq!(nvml.to_string(), "0000:3b:00");
        assert_eq!(PciAddress::parse("3b:00.0"), Some(nvrm));
        assert_ne!(PciAddress::parse("00000001:3B:00.0"), Some(nvrm));
        for bad in [
            "",
            "garbage",
            "0000:3b",
            "0000:3b:00:00",
            "0000:3bb:00",
            "0:g0:00",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn record_dmesg_and_bare_lines_parse() {
        assert_eq!(
            parse_line(&format!("4,1834,3605123456,-;{XID_79}")),
            LogLine {
                since_boot_us: Some(3_605_123_456),
                text: XID_79.into()
            }
        );
        // A record with more header fields (a caller id) still parses.
        assert_eq!(
            parse_line("6,12,5000,-,caller=T1;hello; world").text,
            "hello; world"
        );
        let d = parse_line(&format!("[ 3605.123456] {XID_48}"));
        assert_eq!(d.since_boot_us, Some(3_605_123_456));
        assert_eq!(d.text, XID_48);
        assert_eq!(parse_line("[12.5] x").since_boot_us, Some(12_500_000));
        let bare = parse_line(XID_13);
        assert_eq!(bare.since_boot_us, None);
        assert_eq!(bare.text, XID_13);
        // A message with a semicolon is not a record.
        assert_eq!(parse_line("a;b").text, "a;b");
        assert_eq!(
            parse_line(&format!("4,1834,3605123456,-;{XID_79}")).dmesg_style(),
            format!("[ 3605.123456] {XID_79}")
        );
    }

    #[test]
    fn xids_of_a_saved_log_get_their_gpu_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("kmsg");
        std::fs::write(
            &log,
            format!(
                "6,1,0,-;Linux version 6.8.0\n\
                 4,1833,3600000000,-;{XID_48}\n\
                 4,1834,3605123456,-;{XID_79}\n\
                 4,1835,3606000000,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n\
                 {XID_13}\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("stat"), "cpu 1 2 3\nbtime 1795461061\n").unwrap();
        let got = read_xids(&KernelLogSource::File(log.clone()), dir.path()).unwrap();
        assert_eq!(got.source, log.display().to_string());
        assert_eq!(got.boot_ms, Some(1_795_461_061_000));
        assert_eq!(got.truncated, None);
        let brief: Vec<(String, u64, Option<u64>)> = got
            .xids
            .iter()
            .map(|x| (x.pci.to_string(), x.xid, x.time_ms))
            .collect();
        assert_eq!(
            brief,
            [
                ("0000:19:00".into(), 48, Some(1_795_461_061_000 + 3_600_000)),
                ("0000:3b:00".into(), 79, Some(1_795_461_061_000 + 3_605_123)),
                ("0000:19:00".into(), 13, None),
            ]
        );
        assert_eq!(got.xids[1].text, XID_79);
        // Without a boot time the times are unknown, not made up.
        let no_proc = read_xids(&KernelLogSource::File(log), &dir.path().join("none")).unwrap();
        assert!(no_proc.xids.iter().all(|x| x.time_ms.is_none()));
    }

    #[test]
    fn an_unreadable_log_says_why() {
        let missing = KernelLogSource::File("/nonexistent/kmsg".into());
        let e = read_matching(&missing, |_| true).unwrap_err();
        assert!(e.starts_with("/nonexistent/kmsg: "), "{e}");
        assert_eq!(
            read_matching(&KernelLogSource::Off, |_| true).unwrap_err(),
            "kernel log reading is off"
        );
    }

    #[test]
    fn the_real_log_is_read_to_its_end_or_refused_without_blocking() {
        // Whatever this host allows: either way the call returns promptly.
        let started = Instant::now();
        match read_matching(&KernelLogSource::System, |_| true) {
            Ok(read) => assert_eq!(read.source, KMSG),
            Err(why) => assert!(why.starts_with(KMSG), "{why}"),
        }
        assert!(started.elapsed() < READ_TIMEOUT + Duration::from_secs(2));
    }
}
