//! The query text the fleet sends: exact alternatives of names and instances.

use gpudiag_model::prometheus_names::label;

use crate::selector::{Matcher, Op, quote};

/// `a|b|c` matching exactly these strings (RE2 metacharacters escaped).
pub fn exact_alternatives<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    values
        .into_iter()
        .map(|v| {
            let mut out = String::with_capacity(v.len());
            for c in v.chars() {
                if "\\.+*?()|[]{}^$".contains(c) {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// A matcher for any of these series.
pub(super) fn names_matcher(names: &[&str]) -> Matcher {
    Matcher {
        label: label::NAME.to_owned(),
        op: Op::Re,
        value: exact_alternatives(names.iter().copied()),
    }
}

/// `{__name__=~"a|b"}`: any of these series.
pub(super) fn any_of<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    format!("{{{}=~{}}}", label::NAME, quote(&exact_alternatives(names)))
}

/// `{__name__=~"a|b",instance=~"x|y"}`: any of these series of any of these scrape targets.
pub(super) fn series_on_instances<'a>(
    names: impl IntoIterator<Item = &'a str>,
    instances: &[&str],
) -> String {
    format!(
        "{{{}=~{},{}=~{}}}",
        label::NAME,
        quote(&exact_alternatives(names)),
        label::INSTANCE,
        quote(&exact_alternatives(instances.iter().copied()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternatives_match_exactly() {
        assert_eq!(exact_alternatives(["a.b:1", "c|d"]), r"a\.b:1|c\|d");
    }

    #[test]
    fn series_of_targets_are_one_selector() {
        assert_eq!(any_of(["up"]), r#"{__name__=~"up"}"#);
        assert_eq!(
            series_on_instances(["a", "b"], &["h:1"]),
            r#"{__name__=~"a|b",instance=~"h:1"}"#
        );
    }
}
