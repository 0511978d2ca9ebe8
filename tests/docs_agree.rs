//! The documents agree with the code where they quote it, so the next drift fails here rather
//! than in a reader's hands: a configuration knob named beside a number gives its default (as
//! `gpudiag config --default` prints it), and a `--flag` shown with `gpudiag SUBCOMMAND` is one
//! that subcommand's --help lists (a `--flag` quoted alone is one of gpudiag's, or another
//! tool's named in [`OTHER_TOOLS_FLAGS`]).
//!
//! What shows how to change a value is not a claim about its default, so it is left alone:
//! fenced code blocks of the documents and code spans holding `=` (`nearly_full_pct = 90`).
//! The documents are docs/*.md, the README and every README under assets/deploy; the knob
//! figures are also read in the shipped Prometheus rules, whose thresholds copy the defaults.
//! The messages the troubleshooting page quotes are ones the code prints.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::support::{root, run as gpudiag};

/// Other tools' flags the documents quote alone, with the tool that takes each.
const OTHER_TOOLS_FLAGS: [(&str, &str); 12] = [
    ("--run-ignored", "cargo nextest"),
    ("--rdzv-id", "torchrun"),
    ("--master-addr", "torchrun"),
    ("--master-port", "torchrun"),
    ("--nnodes", "torchrun"),
    ("--nproc-per-node", "torchrun"),
    ("--standalone", "torchrun"),
    ("--multiprocessing-fork", "Python's multiprocessing"),
    ("--locked", "cargo"),
    ("--web.enable-lifecycle", "prometheus"),
    ("--ignorefile", "podman build"),
    ("--root-dir", "the kubelet"),
];

/// README.md, docs/*.md and the READMEs under assets/deploy, relative to the root, sorted.
fn documents() -> Vec<PathBuf> {
    fn readmes(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                readmes(&path, out);
            } else if path.file_name().is_some_and(|n| n == "README.md") {
                out.push(path);
            }
        }
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    out.push(root().join("README.md"));
    readmes(&root().join("assets/deploy"), &mut out);
    let mut out: Vec<PathBuf> = out
        .into_iter()
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).unwrap()
}

/// Every numeric knob's default by name, then by section (`rules.job`), from the output of
/// `gpudiag config --default`.
fn defaults() -> BTreeMap<String, BTreeMap<String, f64>> {
    fn walk(table: &toml::Table, section: &str, out: &mut BTreeMap<String, BTreeMap<String, f64>>) {
        for (key, value) in table {
            let number = value.as_float().or(value.as_integer().map(|i| i as f64));
            match (value, number) {
                (toml::Value::Table(t), _) if section.is_empty() => walk(t, key, out),
                (toml::Value::Table(t), _) => walk(t, &format!("{section}.{key}"), out),
                (_, Some(n)) => {
                    out.entry(key.clone())
                        .or_default()
                        .insert(section.to_owned(), n);
                }
                _ => {}
            }
        }
    }
    let run = gpudiag(&["config", "--default"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let table: toml::Table = run.stdout.parse().unwrap();
    let mut out = BTreeMap::new();
    walk(&table, "", &mut out);
    assert!(
        out.get("peers_busy_util_pct")
            .is_some_and(|s| s.contains_key("rules.job")),
        "{out:?}"
    );
    out
}

/// The text with its fenced code blocks (in Markdown) and its code spans holding `=` blanked,
/// line breaks kept so line numbers stay.
fn claims(text: &str, markdown: bool) -> String {
    let mut unfenced = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.split_inclusive('\n') {
        let fence = markdown && line.trim_start().starts_with("```");
        fenced ^= fence;
        if fence || fenced {
            unfenced.push_str(if line.ends_with('\n') { "\n" } else { "" });
        } else {
            unfenced.push_str(line);
        }
    }
    let mut out = String::with_capacity(unfenced.len());
    let mut rest = unfenced.as_str();
    while let Some(open) = rest.find('`') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let span = &rest[open..open + close + 2];
        if span.contains('=') {
            out.extend(span.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(span);
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A number at the start of `s`: `50`, `1.15`, `-1`, `1e-12`.
fn leading_number(s: &str) -> Option<f64> {
    let bytes = s.as_bytes();
    let mut end = usize::from(bytes.first() == Some(&b'-'));
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let whole = digits(end);
    if whole == 0 {
        return None;
    }
    end += whole;
    if bytes.get(end) == Some(&b'.') && digits(end + 1) > 0 {
        end += 1 + digits(end + 1);
    }
    if bytes.get(end) == Some(&b'e') {
        let sign = usize::from(bytes.get(end + 1) == Some(&b'-'));
        let exp = digits(end + 1 + sign);
        if exp > 0 {
            end += 1 + sign + exp;
        }
    }
    s[..end].parse().ok()
}

/// Each knob named beside a number in `line`: (the name as written, its section when
/// written as `rules.SECTION.NAME`, the number). A name is a knob's when it is quoted, written
/// with its section, or holds `_` (a bare `margin` is a word).
fn knob_figures<'a>(
    line: &'a str,
    knobs: &BTreeMap<String, BTreeMap<String, f64>>,
) -> Vec<(&'a str, Option<String>, f64)> {
    let is_token = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    let mut out = Vec::new();
    let mut at = 0;
    while at < line.len() {
        let Some(start) = line[at..].find(is_token).map(|i| at + i) else {
            break;
        };
        let len = line[start..]
            .find(|c| !is_token(c))
            .unwrap_or(line.len() - start);
        at = start + len;
        let token = line[start..at].trim_end_matches('.');
        let parts: Vec<&str> = token.split('.').collect();
        let name = parts[parts.len() - 1];
        if !knobs.contains_key(name) {
            continue;
        }
        let section = match parts.as_slice() {
            [_] => None,
            ["rules", section, _] => Some(format!("rules.{section}")),
            _ => continue,
        };
        let quoted = line[..start].ends_with('`');
        if !(quoted || section.is_some() || name.contains('_')) {
            continue;
        }
        let after = line[start + token.len()..]
            .trim_start_matches('`')
            .trim_start();
        let after = after
            .strip_prefix(['=', '(', ':'])
            .unwrap_or(after)
            .trim_start();
        if let Some(number) = leading_number(after) {
            out.push((token, section, number));
        }
    }
    out
}

/// Every knob figure of `text` that is no default of its knob, as a line of the failure.
fn wrong_figures(
    path: &str,
    text: &str,
    markdown: bool,
    knobs: &BTreeMap<String, BTreeMap<String, f64>>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (i, line) in claims(text, markdown).lines().enumerate() {
        for (token, section, number) in knob_figures(line, knobs) {
            let name = token.rsplit('.').next().unwrap_or(token);
            let by_section = &knobs[name];
            // A name in several sections (`window_s`) written without one: any of them.
            let candidates: Vec<f64> = match &section {
                Some(s) => by_section.get(s).copied().into_iter().collect(),
                None => by_section.values().copied().collect(),
            };
            let close = |d: f64| (d - number).abs() <= 1e-9 * d.abs().max(1.0);
            if !candidates.into_iter().any(close) {
                wrong.push(format!(
                    "{path}:{}: {token} {number}, but the default is {}",
                    i + 1,
                    by_section
                        .iter()
                        .map(|(s, d)| format!("{s}.{name} = {d}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    wrong
}

#[test]
fn every_knob_figure_in_the_docs_is_its_default() {
    let knobs = defaults();
    let mut wrong = Vec::new();
    for doc in documents() {
        let path = doc.display().to_string();
        wrong.extend(wrong_figures(&path, &read(&doc), true, &knobs));
    }
    let rules = "assets/prometheus/gpudiag-rules.yml";
    wrong.extend(wrong_figures(rules, &read(Path::new(rules)), false, &knobs));
    assert!(
        wrong.is_empty(),
        "figures that are not the defaults:\n{}",
        wrong.join("\n")
    );
}

/// Each subcommand's long flags as its --help lists them (hidden ones left out), the
/// top-level ones included; under "" the top level's alone.
fn flags_by_subcommand() -> BTreeMap<String, BTreeSet<String>> {
    fn longs(command: &clap::Command, out: &mut BTreeSet<String>) {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long().filter(|_| !arg.is_hide_set()) {
                out.insert(format!("--{long}"));
            }
        }
        for sub in command.get_subcommands() {
            longs(sub, out);
        }
    }
    let mut cli = gpudiag::cli::Cli::command();
    cli.build();
    let mut top: BTreeSet<String> = ["--help", "--version"].map(String::from).into();
    for arg in cli.get_arguments() {
        if let Some(long) = arg.get_long().filter(|_| !arg.is_hide_set()) {
            top.insert(format!("--{long}"));
        }
    }
    let mut out = BTreeMap::new();
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut flags = top.clone();
        longs(sub, &mut flags);
        out.insert(sub.get_name().to_owned(), flags);
    }
    out.insert(String::new(), top);
    out
}

/// Where commands are written: code spans of the prose (one may break across lines) and the
/// lines of fenced code blocks (a `\` at the end joins the next), each with its first line.
fn command_scopes(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut fenced = false;
    let mut joined: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push('\n');
            continue;
        }
        prose.push('\n');
        let (first, mut buf) = joined.take().unwrap_or((i + 1, String::new()));
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                buf.push_str(head);
                buf.push(' ');
                joined = Some((first, buf));
            }
            None => {
                buf.push_str(line);
                out.push((first, buf));
            }
        }
    }
    let mut rest = prose.as_str();
    let mut line = 1;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        out.push((line, span.replace('\n', " ")));
        line += span.matches('\n').count();
        rest = &after[close + 1..];
    }
    out
}

/// The `--flag`s written in `s`, where one starts a word (after a space, `[`, `(`, `|`).
fn flags_in(s: &str) -> Vec<&str> {
    s.match_indices("--")
        .filter(|(i, _)| {
            s[..*i]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'))
        })
        .filter_map(|(i, _)| {
            let word = &s[i + 2..];
            let len = word
                .find(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                })
                .unwrap_or(word.len());
            let flag = s[i..i + 2 + len].trim_end_matches(['.', '-']);
            (flag.len() > 2 && word.starts_with(|c: char| c.is_ascii_lowercase())).then_some(flag)
        })
        .collect()
}

/// Each `gpudiag …` of `scope` with its subcommand ("" for none) and the flags given to it: up
/// to the next command of a pipeline or list, a comment, the next `gpudiag`, or ` -- ` (what
/// follows is `run`'s command and its own flags).
fn gpudiag_commands<'a>(
    scope: &'a str,
    subcommands: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<(&'a str, Vec<&'a str>)> {
    let mut out = Vec::new();
    for (i, _) in scope.match_indices("gpudiag") {
        let before = scope[..i].chars().next_back();
        let after = scope[i + 7..].chars().next();
        let starts = before.is_none_or(|c| c.is_whitespace() || matches!(c, '/' | '(' | '$'));
        if !starts || !after.is_some_and(char::is_whitespace) {
            continue;
        }
        let mut rest = &scope[i + 7..];
        for end in [" | ", " && ", " || ", "; ", " # ", "$(", "gpudiag", " -- "] {
            if let Some(at) = rest.find(end) {
                rest = &rest[..at];
            }
        }
        let sub = rest
            .split_whitespace()
            .find(|w| subcommands.contains_key(*w) && !w.is_empty())
            .unwrap_or("");
        out.push((sub, flags_in(rest)));
    }
    out
}

/// Every flag of `text` that gpudiag does not take where it is written.
fn unknown_flags(
    path: &str,
    text: &str,
    subcommands: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let any: BTreeSet<&str> = subcommands.values().flatten().map(String::as_str).collect();
    let other: BTreeSet<&str> = OTHER_TOOLS_FLAGS.iter().map(|(f, _)| *f).collect();
    let mut wrong = Vec::new();
    for (line, scope) in command_scopes(text) {
        let commands = gpudiag_commands(&scope, subcommands);
        for (sub, flags) in &commands {
            for flag in flags {
                if !subcommands[*sub].contains(*flag) {
                    let shown = if sub.is_empty() { "gpudiag" } else { sub };
                    wrong.push(format!("{path}:{line}: {shown} has no {flag}: {scope}"));
                }
            }
        }
        let alone = scope.trim_start();
        if commands.is_empty()
            && alone.starts_with("--")
            && let Some(flag) = flags_in(alone).first()
            && !any.contains(flag)
            && !other.contains(flag)
        {
            wrong.push(format!(
                "{path}:{line}: no subcommand takes {flag} (another tool's? list it in OTHER_TOOLS_FLAGS)"
            ));
        }
    }
    wrong
}

#[test]
fn every_flag_in_the_docs_is_one_its_subcommand_takes() {
    let subcommands = flags_by_subcommand();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        checked += command_scopes(&text)
            .iter()
            .map(|(_, s)| gpudiag_commands(s, &subcommands).len())
            .sum::<usize>();
        wrong.extend(unknown_flags(
            &doc.display().to_string(),
            &text,
            &subcommands,
        ));
    }
    assert!(checked > 50, "only {checked} gpudiag commands found");
    assert!(
        wrong.is_empty(),
        "flags the CLI does not have:\n{}",
        wrong.join("\n")
    );
}

/// The checks above find a drift where one is written, and leave examples alone.
#[test]
fn the_checks_catch_a_wrong_default_and_an_unknown_flag() {
    let knobs: BTreeMap<String, BTreeMap<String, f64>> = [
        ("peers_busy_util_pct", "rules.job", 50.0),
        ("window_s", "rules.utilisation", 30.0),
        ("window_s", "rules.throttle", 60.0),
        ("margin", "rules.peers", 0.10),
    ]
    .into_iter()
    .fold(BTreeMap::new(), |mut m, (k, s, v)| {
        m.entry(k.to_owned())
            .or_insert_with(BTreeMap::new)
            .insert(s.to_owned(), v);
        m
    });
    let text = "the peers read busy (`peers_busy_util_pct` 80) and\n\
                `rules.throttle.window_s` (30 s) is wrong, `window_s` 60 is right,\n\
                a margin 5 is a word, `peers_busy_util_pct = 70` an example,\n\
                ```toml\npeers_busy_util_pct = 90\n```\n\
                rules.peers.margin 0.1; peers_busy_util_pct: 50.\n";
    let wrong = wrong_figures("t.md", text, true, &knobs);
    assert_eq!(wrong.len(), 2, "{wrong:#?}");
    assert!(
        wrong[0].starts_with("t.md:1: peers_busy_util_pct 80"),
        "{wrong:?}"
    );
    assert!(
        wrong[1].starts_with("t.md:2: rules.throttle.window_s 30"),
        "{wrong:?}"
    );

    let subcommands = flags_by_subcommand();
    let text = "Run `gpudiag fleet --prometheus URL --query-timout 5s | jq` or\n\
                `gpudiag check\n--jsn`; `--no-such-flag` alone, `--locked` is cargo's.\n\
                ```sh\ngpudiag serve --listen 0.0.0.0:9835 \\\n  --max-proces-series 10 # --x\n```\n\
                `cargo test -- --nocapture`, `gpudiag --demo replay` and `--selector`;\n\
                `gpudiag run --kernels -- torchrun --nproc-per-node 2 x.py` is torchrun's.\n";
    let wrong = unknown_flags("t.md", text, &subcommands);
    let found: Vec<&str> = wrong
        .iter()
        .map(|w| w.split(": ").nth(1).unwrap_or(""))
        .collect();
    // The code block's lines come first.
    assert_eq!(
        found,
        [
            "serve has no --max-proces-series",
            "fleet has no --query-timout",
            "check has no --jsn",
            "no subcommand takes --no-such-flag (another tool's? list it in OTHER_TOOLS_FLAGS)",
        ],
        "{wrong:#?}"
    );
    assert!(wrong[0].starts_with("t.md:5: "), "{wrong:?}");
    assert!(wrong[2].starts_with("t.md:2: "), "{wrong:?}");
}

/// The page whose quotes are all gpudiag's messages.
const TROUBLESHOOTING: &str = "docs/troubleshooting.md";

/// The Rust sources of the binary and the crates, test modules left out (each file up to its
/// first `#[cfg(test)]`), with string literals continued by a trailing `\` joined to their
/// next line as the compiler joins them.
fn sources() -> String {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_none_or(|n| n != "tests") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            walk(&src, &mut files);
        }
    }
    let mut out = String::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        out.push_str(&joined_continuations(code));
        out.push('\n');
    }
    out
}

fn joined_continuations(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut continued = false;
    for line in code.lines() {
        let line = if continued { line.trim_start() } else { line };
        match line.strip_suffix('\\') {
            Some(head) => {
                out.push_str(head);
                continued = true;
            }
            None => {
                out.push_str(line);
                out.push('\n');
                continued = false;
            }
        }
    }
    out
}

/// The texts in straight double quotes of a Markdown page's prose (code spans and fenced
/// blocks left out, a quote may break across lines), each with its line.
fn quoted(text: &str) -> Vec<(usize, String)> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            // Code spans say how to type something, not what gpudiag prints.
            let mut in_span = false;
            prose.extend(line.chars().map(|c| {
                if c == '`' {
                    in_span = !in_span;
                }
                if in_span || c == '`' { ' ' } else { c }
            }));
        }
        prose.push('\n');
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    let mut line = 1;
    while let Some(open) = rest.find('"') {
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('"') else { break };
        let quote = &after[..close];
        out.push((line, quote.split_whitespace().collect::<Vec<_>>().join(" ")));
        line += quote.matches('\n').count();
        rest = &after[close + 1..];
    }
    out
}

/// The quotes of `text` that the sources do not print: a piece between two "…" (which stands
/// for what varies) of three characters or more that no source line holds.
fn unprinted(path: &str, text: &str, sources: &str) -> Vec<String> {
    quoted(text)
        .into_iter()
        .filter(|(_, quote)| {
            quote
                .split('…')
                .map(str::trim)
                .filter(|piece| piece.chars().count() >= 3)
                .any(|piece| !sources.contains(piece))
        })
        .map(|(line, quote)| format!("{path}:{line}: \"{quote}\""))
        .collect()
}

#[test]
fn every_message_the_troubleshooting_page_quotes_is_one_gpudiag_prints() {
    let text = read(Path::new(TROUBLESHOOTING));
    let sources = sources();
    assert!(
        quoted(&text).len() >= 15,
        "{TROUBLESHOOTING} quotes fewer messages than it did: {:?}",
        quoted(&text)
    );
    let wrong = unprinted(TROUBLESHOOTING, &text, &sources);
    assert!(
        wrong.is_empty(),
        "messages quoted that the code does not print (reworded in the code?):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_message_check_catches_a_reworded_message() {
    let sources = joined_continuations(
        "let e = format!(\n    \"NVML initialisation did not finish within {} s: the \\\n     \
         driver may be hung\",\n);\n",
    );
    let text = "It says \"NVML initialisation did not finish within … s: the driver may\n\
                be hung\" and then \"NVML init timed out\"; `\"in code\"` is left alone.\n\
                ```\n\"in a block\"\n```\n";
    assert_eq!(
        unprinted("t.md", text, &sources),
        ["t.md:2: \"NVML init timed out\""]
    );
}
