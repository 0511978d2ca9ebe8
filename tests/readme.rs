#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The README renders as written: no table broken by a blank line (its rows would show as raw
//! `|` text) and no relative link to a file that does not exist. Read line by line rather than
//! through a Markdown parser: tables and links are the two shapes that broke before, and both
//! are visible at the line level (GitHub's table rule: a table starts with a header row followed
//! by a delimiter row, so a `|` row after a blank line without one is a paragraph).

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

fn is_delimiter_row(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// Lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// Rows starting with `|` that follow neither another row nor start a table (header row then
/// delimiter row): Markdown renders them as a paragraph of raw text.
fn orphan_rows(text: &str) -> Vec<String> {
    let lines = prose_lines(text);
    let mut orphans = Vec::new();
    for (k, &(number, line)) in lines.iter().enumerate() {
        if !line.starts_with('|') {
            continue;
        }
        let previous_is_row = k > 0 && lines[k - 1].1.starts_with('|');
        let starts_a_table = lines
            .get(k + 1)
            .is_some_and(|(_, next)| is_delimiter_row(next));
        if !previous_is_row && !starts_a_table {
            let shown: String = line.chars().take(60).collect();
            orphans.push(format!("line {number}: {shown}"));
        }
    }
    orphans
}

#[test]
fn every_table_row_belongs_to_a_table() {
    let broken = orphan_rows(&readme());
    assert!(
        broken.is_empty(),
        "table rows that render as raw text (a blank line or a missing delimiter row before \
         them):\n{}",
        broken.join("\n")
    );
}

#[test]
fn relative_links_point_at_files_that_exist() {
    let text = readme();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dead = Vec::new();
    for (number, line) in prose_lines(&text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            rest = &after[end..];
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            if !root.join(path).exists() {
                dead.push(format!("line {number}: {target}"));
            }
        }
    }
    assert!(dead.is_empty(), "dead relative links:\n{}", dead.join("\n"));
}

#[test]
fn the_check_catches_a_table_split_by_a_blank_line() {
    let split = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n";
    assert_eq!(orphan_rows(split), vec!["line 5: | 3 | 4 |".to_owned()]);
    let whole = "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n";
    assert!(orphan_rows(whole).is_empty());
}
