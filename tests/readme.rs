//! The README and the documents in docs/ render as written: no table broken by a blank line (its
//! rows would show as raw `|` text), no relative link to a file that does not exist or to a
//! heading a document does not have, and every document reachable from the README's contents
//! and linking back to it. Read line by line rather than through a Markdown parser: tables and
//! links are the two shapes that broke before, and both are visible at the line level (GitHub's
//! table rule: a table starts with a header row followed by a delimiter row, so a `|` row after
//! a blank line without one is a paragraph).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::support::root;

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// README.md and every docs/*.md, relative to the repository root, sorted.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    docs.insert(0, PathBuf::from("README.md"));
    docs
}

fn read(doc: &Path) -> String {
    std::fs::read_to_string(root().join(doc)).unwrap()
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

/// Every `](target)` outside code fences: (line number, target).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((number, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

/// The anchor GitHub gives a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces made hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a document's headings, with GitHub's `-1`, `-2` for repeated ones.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Relative links of `doc` whose file does not exist, or whose `#anchor` names no heading of
/// the Markdown file it points at.
fn dead_links(doc: &Path) -> Vec<String> {
    let text = read(doc);
    let dir = doc.parent().unwrap_or(Path::new(""));
    let mut dead = Vec::new();
    for (number, target) in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            doc.to_path_buf()
        } else {
            dir.join(path)
        };
        let shown = format!("{}:{number}: {target}", doc.display());
        if !root().join(&file).exists() {
            dead.push(shown);
            continue;
        }
        if let Some(anchor) = anchor
            && file.extension().is_some_and(|e| e == "md")
            && !anchors(&read(&file)).iter().any(|a| a == anchor)
        {
            dead.push(format!("{shown} (no such heading)"));
        }
    }
    dead
}

#[test]
fn every_table_row_belongs_to_a_table() {
    let mut broken = Vec::new();
    for doc in documents() {
        for row in orphan_rows(&read(&doc)) {
            broken.push(format!("{}: {row}", doc.display()));
        }
    }
    assert!(
        broken.is_empty(),
        "table rows that render as raw text (a blank line or a missing delimiter row before \
         them):\n{}",
        broken.join("\n")
    );
}

#[test]
fn relative_links_point_at_files_and_headings_that_exist() {
    let dead: Vec<String> = documents().iter().flat_map(|d| dead_links(d)).collect();
    assert!(dead.is_empty(), "dead relative links:\n{}", dead.join("\n"));
}

/// A newcomer finds every document from the README's contents, and can get back from each.
#[test]
fn every_document_is_in_the_contents_and_links_back_to_the_readme() {
    let readme = readme();
    let contents = readme
        .split("\n## Contents\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the README has a Contents section");
    let listed: Vec<String> = links(contents).into_iter().map(|(_, t)| t).collect();
    for doc in documents().iter().skip(1) {
        let name = doc.display().to_string();
        assert!(
            listed.iter().any(|t| t.split('#').next() == Some(&name)),
            "{name} is not in the README's contents"
        );
        assert!(
            links(&read(doc))
                .iter()
                .any(|(_, t)| t.starts_with("../README.md")),
            "{name} has no link back to the README"
        );
    }
}

/// The README's subcommand table names every subcommand the CLI has, and docs/commands.md
/// describes each.
#[test]
fn every_subcommand_is_in_the_readme_and_in_the_command_reference() {
    let readme = readme();
    let table = readme
        .split("\n## Subcommands\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the README has a Subcommands section");
    let reference = read(Path::new("docs/commands.md"));
    let cli = gpudiag::cli::Cli::command();
    let names: Vec<&str> = cli
        .get_subcommands()
        .map(|c| c.get_name())
        .filter(|&n| n != "help")
        .collect();
    assert!(names.contains(&"check"), "{names:?}");
    for name in names {
        let shown = format!("`gpudiag {name}");
        assert!(table.contains(&shown), "the README's table lacks {name}");
        assert!(reference.contains(&shown), "docs/commands.md lacks {name}");
    }
}

#[test]
fn the_check_catches_a_table_split_by_a_blank_line() {
    let split = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n";
    assert_eq!(orphan_rows(split), vec!["line 5: | 3 | 4 |".to_owned()]);
    let whole = "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n";
    assert!(orphan_rows(whole).is_empty());
}

#[test]
fn anchors_are_githubs() {
    let text = "# Protecting `/metrics`: TLS and basic auth\n```\n# not a heading\n```\n\
                ## Absent values: `n/a`, never 0\n## Notes\n## Notes\n#hashtag\n";
    assert_eq!(
        anchors(text),
        [
            "protecting-metrics-tls-and-basic-auth",
            "absent-values-na-never-0",
            "notes",
            "notes-1"
        ]
    );
    assert_eq!(
        links("see [a](b.md#c) and ![d](e.svg)\n```\n[no](f)\n```\n"),
        [(1, "b.md#c".to_owned()), (1, "e.svg".to_owned())]
    );
}
