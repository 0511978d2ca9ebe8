//! Whether a process descends from another, read from `/proc`: `run` keeps the GPU processes of
//! the command's tree, and the kernels socket takes collectors only from it.

/// Whether `pid`'s chain of parents reaches `root` (at most 64 steps: trees are shallow, and a
/// bound keeps a malformed /proc from looping).
pub fn descends_from(pid: u32, root: u32) -> bool {
    lineage(pid, root) == Some(true)
}

/// Whether `pid`'s chain of parents reaches `root`; `None` when `pid` itself is already gone
/// (its /proc entry unreadable), so nothing can be said.
pub fn lineage(pid: u32, root: u32) -> Option<bool> {
    if pid == root {
        return Some(true);
    }
    let mut at = parent_of(pid)?;
    for _ in 0..64 {
        if at == root {
            return Some(true);
        }
        match parent_of(at) {
            Some(p) if p > 1 && at > 1 => at = p,
            _ => return Some(false),
        }
    }
    Some(false)
}

/// The parent of `pid`, from `/proc/<pid>/stat`; `None` when it is gone or unreadable.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parent_from_stat(&stat)
}

/// The parent pid (field 4) of a `/proc/<pid>/stat` line; the name before it may hold spaces and
/// parentheses, so fields resume after the last ')'.
pub fn parent_from_stat(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_comes_after_the_last_parenthesis() {
        assert_eq!(parent_from_stat("42 (py) thon) S 7 42 42 0"), Some(7));
        assert_eq!(parent_from_stat("garbage"), None);
    }

    #[test]
    fn our_own_children_descend_from_us_and_init_does_not() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(1, me));
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        // Reaped: nothing can be said of it any more.
        assert_eq!(lineage(pid, me), None);
    }
}
