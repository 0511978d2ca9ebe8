//! Giving back, once start-up is over, the resident pages a long-running view no longer uses.
//!
//! Two kinds make up most of what the terminal UI holds beyond its working set (benches/RESULTS.md,
//! idle memory): heap pages start-up freed (opening the driver, the kernel log, the library
//! search) that glibc keeps, and the read-only pages of the program and its libraries that
//! start-up ran or read (the dynamic linker's relocation tables, the driver library's
//! initialisation) and the kernel mapped 64 kB at a time around each fault. The first go back
//! with `malloc_trim`; the second by dropping this process's mappings of the loaded objects'
//! read-only segments: the pages stay in the page cache, and what the loop uses comes back on
//! its next access. Only segments without write permission are touched, taken from the dynamic
//! linker's own list of loaded objects (`dl_iterate_phdr`), which names an object once its
//! segments are mapped: what is dropped is file content never written, so what comes back is what
//! went. `GPUDIAG_IDLE_TRIM=off` leaves everything as it is (benchmarks compare the two in one
//! run).

/// Hidden: `off` turns the trim off.
pub const TRIM_ENV: &str = "GPUDIAG_IDLE_TRIM";

/// What one trim did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    /// Read-only segments of loaded objects whose pages were dropped.
    pub segments: usize,
    pub bytes: u64,
}

/// A read-only loadable segment of a loaded object, in this process's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    start: u64,
    end: u64,
}

/// Trims once; `None` when turned off or on a platform without these calls.
pub fn trim() -> Option<Trimmed> {
    if std::env::var(TRIM_ENV).is_ok_and(|v| v == "off") {
        return None;
    }
    trim_platform()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_platform() -> Option<Trimmed> {
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    let page = page_size();
    let mut done = Trimmed::default();
    for s in read_only_segments() {
        let Some((start, end)) = whole_pages(s, page) else {
            continue;
        };
        // SAFETY: [start, end) lies inside a loadable segment without write permission of an
        // object the dynamic linker has mapped (whole pages only, so no neighbouring segment is
        // touched). Such pages were never written, and MADV_DONTNEED on a private file mapping
        // refills each one from the same file page at its next access.
        let ok = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                (end - start) as usize,
                libc::MADV_DONTNEED,
            ) == 0
        };
        if ok {
            done.segments += 1;
            done.bytes += end - start;
        }
    }
    Some(done)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_platform() -> Option<Trimmed> {
    None
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// The whole pages inside a segment; `None` when it spans none.
fn whole_pages(s: Segment, page: u64) -> Option<(u64, u64)> {
    let start = s.start.div_ceil(page) * page;
    let end = s.end / page * page;
    (end > start).then_some((start, end))
}

/// The loadable segments without write permission of every object the dynamic linker lists,
/// but the vDSO's (the kernel's, not a file's).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn read_only_segments() -> Vec<Segment> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid info for the call's duration, and `data` is
        // the Vec handed to dl_iterate_phdr below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<Segment>)) };
        let name = if info.dlpi_name.is_null() {
            ""
        } else {
            // SAFETY: a NUL-terminated name owned by the dynamic linker.
            unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
                .to_str()
                .unwrap_or("")
        };
        if name.contains("vdso") || info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: `dlpi_phnum` headers start at `dlpi_phdr`.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        // An object with text relocations had its read-only pages written at load: leave it.
        let dynamic = headers.iter().find(|h| h.p_type == libc::PT_DYNAMIC);
        if dynamic.is_some_and(|d| {
            // SAFETY: the dynamic section of a mapped object, as its header places it.
            unsafe { has_text_relocations(info.dlpi_addr.wrapping_add(d.p_vaddr)) }
        }) {
            return 0;
        }
        for h in headers {
            if h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_W == 0 && h.p_memsz > 0 {
                let start = info.dlpi_addr.wrapping_add(h.p_vaddr);
                out.push(Segment {
                    start,
                    end: start.saturating_add(h.p_filesz.min(h.p_memsz)),
                });
            }
        }
        0
    }
    let mut out: Vec<Segment> = Vec::new();
    // SAFETY: the callback only reads what it is given and pushes into `out`, which outlives
    // the call.
    unsafe {
        libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<Segment>).cast());
    }
    out
}

/// Whether a dynamic section (`Elf64_Dyn` entries up to `DT_NULL`) asks for text relocations.
///
/// # Safety
/// `at` must be the address of a mapped object's dynamic section.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn has_text_relocations(at: u64) -> bool {
    const DT_NULL: i64 = 0;
    const DT_TEXTREL: i64 = 22;
    const DT_FLAGS: i64 = 30;
    const DF_TEXTREL: u64 = 0x4;
    // Far more entries than any object has: a guard against a section without its end.
    const MAX_ENTRIES: usize = 4096;
    let mut p = at as *const [u64; 2];
    for _ in 0..MAX_ENTRIES {
        // SAFETY: within the dynamic section, which ends with a DT_NULL entry.
        let [tag, value] = unsafe { p.read_unaligned() };
        match tag as i64 {
            DT_NULL => return false,
            DT_TEXTREL => return true,
            DT_FLAGS if value & DF_TEXTREL != 0 => return true,
            _ => {}
        }
        // SAFETY: the next entry of the same section.
        p = unsafe { p.add(1) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_pages_inside_a_segment() {
        let s = |start, end| Segment { start, end };
        assert_eq!(
            whole_pages(s(0x1000, 0x5000), 0x1000),
            Some((0x1000, 0x5000))
        );
        assert_eq!(
            whole_pages(s(0x1010, 0x5010), 0x1000),
            Some((0x2000, 0x5000))
        );
        assert_eq!(whole_pages(s(0x1010, 0x1ff0), 0x1000), None);
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_test_binary_and_libc_have_read_only_segments_and_keep_running_without_them() {
        let segments = read_only_segments();
        // This binary's code at least, and libc's.
        assert!(segments.len() >= 2, "{segments:?}");
        let here = the_test_binary_and_libc_have_read_only_segments_and_keep_running_without_them
            as *const () as u64;
        assert!(segments.iter().any(|s| s.start <= here && here < s.end));
        let done = trim().expect("trims on glibc Linux");
        assert!(done.segments >= 2 && done.bytes > 0, "{done:?}");
        // Code and constants come back from the file.
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(v.iter().sum::<u64>(), 5050);
        assert_eq!(format!("{:?}", Some("text")), "Some(\"text\")");
    }
}
