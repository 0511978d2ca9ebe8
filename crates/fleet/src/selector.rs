//! `--selector '{cluster="a", slurm_job="42"}'`: label matchers, parsed so that each query can
//! carry them beside its own, and so that matchers on job labels (which only gpudiag's job info
//! series carries) pick GPUs through that series instead of emptying every device query.
//!
//! Written by hand: the selector grammar is four operators over quoted strings, and the PromQL
//! parser crates bring a whole expression language (and its dependencies) for it.

use std::fmt;

/// Labels that only `gpudiag_gpu_job_info` carries: a matcher on them selects GPUs by their job.
pub const JOB_LABELS: [&str; 4] = ["job_key", "joined_by", "slurm_job", "rank"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Re,
    NotRe,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Re => "=~",
            Op::NotRe => "!~",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    pub op: Op,
    pub value: String,
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}{}",
            self.label,
            self.op.as_str(),
            quote(&self.value)
        )
    }
}

/// A PromQL string literal: double-quoted, with `\` and `"` escaped (and newlines, which a
/// label value may hold).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The user's selector, split into what every device series can be filtered by and what
/// selects GPUs through their job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub device: Vec<Matcher>,
    pub job: Vec<Matcher>,
}

impl Selector {
    /// Parses `{a="b", c=~"d"}` (braces optional; empty means everything).
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut p = Parser {
            chars: text.trim().chars().collect(),
            at: 0,
        };
        let braced = p.eat('{');
        let mut all = Vec::new();
        loop {
            p.skip_space();
            if p.done() || (braced && p.peek() == Some('}')) {
                break;
            }
            all.push(p.matcher()?);
            p.skip_space();
            if !p.eat(',') {
                break;
            }
        }
        p.skip_space();
        if braced && !p.eat('}') {
            return Err(p.error("a closing `}`"));
        }
        p.skip_space();
        if !p.done() {
            return Err(p.error("the end of the selector"));
        }
        let (job, device) = all
            .into_iter()
            .partition(|m| JOB_LABELS.contains(&m.label.as_str()));
        Ok(Selector { device, job })
    }

    /// `name{own…, device matchers…}`: a vector selector for one metric.
    pub fn series(&self, name: &str, own: &[Matcher]) -> String {
        let inner: Vec<String> = own
            .iter()
            .chain(&self.device)
            .map(ToString::to_string)
            .collect();
        format!("{name}{{{}}}", inner.join(","))
    }

    /// The selector as the user would write it, for the report.
    pub fn text(&self) -> String {
        let inner: Vec<String> = self
            .device
            .iter()
            .chain(&self.job)
            .map(ToString::to_string)
            .collect();
        format!("{{{}}}", inner.join(","))
    }
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn done(&self) -> bool {
        self.at >= self.chars.len()
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        let hit = self.peek() == Some(c);
        if hit {
            self.at += 1;
        }
        hit
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    fn error(&self, wanted: &str) -> String {
        let found = match self.peek() {
            Some(c) => format!("{c:?}"),
            None => "the end".to_owned(),
        };
        format!(
            "bad selector: expected {wanted} at character {}, found {found} (write it like {{Hostname=~\"node-.*\", slurm_job=\"42\"}})",
            self.at + 1
        )
    }

    fn matcher(&mut self) -> Result<Matcher, String> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.at += 1;
        }
        let label: String = self.chars[start..self.at].iter().collect();
        if label.is_empty() || label.starts_with(|c: char| c.is_ascii_digit()) {
            self.at = start;
            return Err(self.error("a label name"));
        }
        self.skip_space();
        let op = if self.eat('=') {
            if self.eat('~') { Op::Re } else { Op::Eq }
        } else if self.eat('!') {
            if self.eat('=') {
                Op::Ne
            } else if self.eat('~') {
                Op::NotRe
            } else {
                return Err(self.error("`!=` or `!~`"));
            }
        } else {
            return Err(self.error("`=`, `!=`, `=~` or `!~`"));
        };
        self.skip_space();
        let value = self.string()?;
        Ok(Matcher { label, op, value })
    }

    fn string(&mut self) -> Result<String, String> {
        let Some(close) = self.peek().filter(|c| matches!(c, '"' | '\'' | '`')) else {
            return Err(self.error("a quoted value"));
        };
        self.at += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error(&format!("the closing {close}")));
            };
            self.at += 1;
            if c == close {
                return Ok(out);
            }
            if c == '\\' && close != '`' {
                let Some(e) = self.peek() else {
                    return Err(self.error("an escaped character"));
                };
                self.at += 1;
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    other => other,
                });
            } else {
                out.push(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_split_into_device_and_job_labels() {
        let s = Selector::parse(r#"{cluster="a", slurm_job = "42",Hostname=~'node-.*',gpu!="7"}"#)
            .unwrap_or_default();
        assert_eq!(
            s.series("DCGM_FI_DEV_GPU_UTIL", &[]),
            r#"DCGM_FI_DEV_GPU_UTIL{cluster="a",Hostname=~"node-.*",gpu!="7"}"#
        );
        assert_eq!(s.job.len(), 1);
        assert_eq!(s.job[0].to_string(), r#"slurm_job="42""#);
    }

    #[test]
    fn empty_and_unbraced_selectors_read() {
        assert_eq!(Selector::parse(""), Ok(Selector::default()));
        assert_eq!(Selector::parse("{}"), Ok(Selector::default()));
        let s = Selector::parse(r#"cluster="a""#).unwrap_or_default();
        assert_eq!(s.text(), r#"{cluster="a"}"#);
    }

    #[test]
    fn values_are_quoted_back_safely() {
        let s = Selector::parse(r#"{a="x\"y\\z"}"#).unwrap_or_default();
        assert_eq!(s.device[0].value, "x\"y\\z");
        assert_eq!(s.series("m", &[]), r#"m{a="x\"y\\z"}"#);
    }

    #[test]
    fn bad_selectors_say_where() {
        for bad in [
            "{a=b}",
            "{a=\"b\"",
            "{=\"b\"}",
            "{a==\"b\"}",
            "{a=\"b\"} or up",
            "{1a=\"b\"}",
            "{a!\"b\"}",
        ] {
            let e = Selector::parse(bad).err().unwrap_or_default();
            assert!(e.starts_with("bad selector: expected"), "{bad}: {e}");
        }
    }
}
