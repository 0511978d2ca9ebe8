//! The total length of a union of intervals that arrive roughly in order, in bounded memory.
//!
//! Kernels of several streams overlap, so a GPU's busy time is the length of the union of its
//! kernels, not their sum. Records come in per-process buffers, so they are ordered within a
//! buffer but not across processes or buffers: the union keeps its recent part as disjoint
//! spans, and when it holds more than its cap it commits its older half (adds those lengths to
//! a total and forgets them). An interval that starts before what was committed is clipped to
//! it, and counted as late when nothing of it is left.

use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct IntervalUnion {
    /// Disjoint, non-touching spans, start → end, all at or after `committed_until`.
    spans: BTreeMap<u64, u64>,
    committed_ns: u64,
    committed_until: u64,
    cap: usize,
    /// Intervals wholly before what was committed: their time is not counted.
    pub late: u64,
}

impl IntervalUnion {
    pub fn new(cap: usize) -> Self {
        IntervalUnion {
            spans: BTreeMap::new(),
            committed_ns: 0,
            committed_until: 0,
            cap: cap.max(2),
            late: 0,
        }
    }

    /// Adds `[start, end)`; an empty or reversed interval adds nothing.
    pub fn insert(&mut self, start: u64, end: u64) {
        let mut start = start;
        let mut end = end;
        if end <= start {
            return;
        }
        if start < self.committed_until {
            if end <= self.committed_until {
                self.late += 1;
                return;
            }
            start = self.committed_until;
        }
        // The span starting at or before `start` that reaches it absorbs it.
        if let Some((&s, &e)) = self.spans.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
            self.spans.remove(&s);
        }
        // Spans starting inside the new one are absorbed too.
        while let Some((&s, &e)) = self.spans.range(start..=end).next() {
            end = end.max(e);
            self.spans.remove(&s);
        }
        self.spans.insert(start, end);
        if self.spans.len() > self.cap {
            self.commit_older_half();
        }
    }

    fn commit_older_half(&mut self) {
        let keep = self.spans.len() / 2;
        let Some((&split, _)) = self.spans.iter().nth(self.spans.len() - keep) else {
            return;
        };
        let newer = self.spans.split_off(&split);
        let older = std::mem::replace(&mut self.spans, newer);
        for (s, e) in older {
            self.committed_ns = self.committed_ns.saturating_add(e - s);
            self.committed_until = self.committed_until.max(e);
        }
    }

    /// The union's length so far, in ns.
    pub fn total_ns(&self) -> u64 {
        self.spans
            .iter()
            .fold(self.committed_ns, |t, (s, e)| t.saturating_add(e - s))
    }

    /// Spans held now (for the tests of the bound).
    pub fn held(&self) -> usize {
        self.spans.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_and_touching_intervals_count_once() {
        let mut u = IntervalUnion::new(1024);
        u.insert(10, 20);
        u.insert(15, 30);
        u.insert(30, 40);
        u.insert(100, 110);
        u.insert(0, 5);
        u.insert(12, 13);
        assert_eq!(u.total_ns(), 30 + 10 + 5);
        // One interval covering all of them.
        u.insert(0, 200);
        assert_eq!(u.total_ns(), 200);
        assert_eq!(u.held(), 1);
    }

    #[test]
    fn reversed_and_empty_intervals_add_nothing() {
        let mut u = IntervalUnion::new(8);
        u.insert(20, 10);
        u.insert(5, 5);
        assert_eq!(u.total_ns(), 0);
    }

    #[test]
    fn memory_stays_bounded_and_in_order_input_stays_exact() {
        let mut u = IntervalUnion::new(64);
        for i in 0..100_000u64 {
            u.insert(i * 10, i * 10 + 4);
            assert!(u.held() <= 65);
        }
        assert_eq!(u.total_ns(), 400_000);
        assert_eq!(u.late, 0);
    }

    #[test]
    fn out_of_order_within_the_recent_part_is_exact_and_older_is_counted_late() {
        let mut u = IntervalUnion::new(1000);
        // Two processes' buffers, the second arriving after the first.
        for i in 0..400u64 {
            u.insert(i * 10, i * 10 + 6);
        }
        for i in 0..400u64 {
            u.insert(i * 10 + 3, i * 10 + 8);
        }
        assert_eq!(u.total_ns(), 400 * 8);
        let mut small = IntervalUnion::new(4);
        for i in 0..100u64 {
            small.insert(i * 10, i * 10 + 5);
        }
        small.insert(0, 5);
        assert_eq!(small.late, 1);
        assert_eq!(small.total_ns(), 500);
        // Straddling what was committed: the rest is counted.
        let mut straddle = IntervalUnion::new(4);
        for i in 0..10u64 {
            straddle.insert(i * 10, i * 10 + 5);
        }
        let before = straddle.total_ns();
        straddle.insert(0, 1_000);
        assert!(straddle.total_ns() > before);
        assert!(straddle.total_ns() <= 1_000);
    }
}
