//! Times as the views print them, in text reports and in the terminal UI alike.

use gpudiag_model::sample::TimeMs;

/// Wall-clock time of day in UTC ("14:03:07"); recordings travel between time zones, so the
/// views say UTC rather than guessing the viewer's zone.
pub fn clock(ms: TimeMs) -> String {
    // By arithmetic rather than through a calendar: a recording may carry any time, and a
    // formatter that refuses years past 9999 must not take a view down. UTC has no leap seconds
    // in Unix time, so the time of day is the remainder of a day.
    let s = ms / 1000;
    format!("{:02}:{:02}:{:02}", s / 3600 % 24, s / 60 % 60, s % 60)
}

/// An elapsed time as "m:ss" or "h:mm:ss".
pub fn elapsed(ms: u64) -> String {
    let s = ms / 1000;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(clock(1_767_225_661_000), "00:01:01");
        // Past year 9999, where calendar formatters give up.
        assert_eq!(clock(u64::MAX), "14:25:51");
        assert_eq!(elapsed(88_000), "1:28");
        assert_eq!(elapsed(3_723_000), "1:02:03");
    }
}
