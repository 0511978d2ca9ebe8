//! The Prometheus text exposition format (version 0.0.4): metric families with their HELP and
//! TYPE lines, label escaping and value formatting. It knows nothing of GPUs.

use std::fmt::Write as _;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's TYPE: the metric table's gauge or counter, which are Prometheus's.
use gpudiag_model::metric_table::Kind;

fn type_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Gauge => "gauge",
        Kind::Counter => "counter",
    }
}

/// A sample's labels, in the order they are written.
pub type Labels = Vec<(&'static str, String)>;

/// Writes metric families in the text exposition format.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// One family: HELP and TYPE lines, then its samples. A family without samples is left
    /// out entirely.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str, samples: &[(Labels, f64)]) {
        let samples: Vec<&(Labels, f64)> = samples.iter().filter(|(_, v)| v.is_finite()).collect();
        if samples.is_empty() {
            return;
        }
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", type_name(kind));
        for (labels, value) in samples {
            self.out.push_str(name);
            if !labels.is_empty() {
                self.out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
                }
                self.out.push('}');
            }
            let _ = writeln!(self.out, " {}", format_value(*value));
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Label values escape backslash, double quote and line feed.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes backslash and line feed.
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Integers without a fraction; everything else in Rust's shortest round-trip form.
pub fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape_help("x\\y\nz \"q\""), "x\\\\y\\nz \"q\"");
        assert_eq!(format_value(99.0), "99");
        assert_eq!(format_value(689.125), "689.125");
        assert_eq!(format_value(-1.5), "-1.5");
        assert_eq!(format_value(1e20), "100000000000000000000");
    }
}
