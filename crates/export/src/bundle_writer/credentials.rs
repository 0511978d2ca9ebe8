//! Where a text holds something that looks like a credential: the value of a `password=`,
//! `token:` or `api_key=` setting, the token after `Bearer`, the `user:pass` of a URL, a token
//! with a well-known vendor prefix (`ghp_`, `nvapi-`, `AKIA`...), and long random-looking
//! strings (keys, hashes). GPU UUIDs (`GPU-…`, `MIG-…`) and PCI bus ids are identifiers a bug
//! report needs, and never match.
//!
//! A heuristic: it errs towards redacting, since a bundle is meant to be attached to a public
//! issue and a leaked key costs more than a hidden hash.

use std::ops::Range;

/// Setting names holding one of these (lowercase) hold a credential.
const SECRET_WORDS: [&str; 12] = [
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "api_key",
    "api-key",
    "access_key",
    "private_key",
    "credential",
    "authorization",
];

/// Setting names with one of these as a whole part (`DB_PASS`, `http.auth`) do too; inside
/// longer words they are too common ("bypass", "author").
const SECRET_PARTS: [&str; 3] = ["pass", "pwd", "auth"];

/// HTTP authorization schemes: the credential is the word after them.
const SCHEMES: [&str; 4] = ["bearer", "basic", "digest", "token"];

/// Prefixes of tokens that vendors issue (GitHub, GitLab, Slack, OpenAI, Hugging Face, NVIDIA
/// NGC, AWS, Google), and how many characters follow at least.
const TOKEN_PREFIXES: [(&str, usize); 15] = [
    ("ghp_", 20),
    ("gho_", 20),
    ("ghu_", 20),
    ("ghs_", 20),
    ("ghr_", 20),
    ("github_pat_", 20),
    ("glpat-", 16),
    ("xoxb-", 16),
    ("xoxp-", 16),
    ("sk-", 20),
    ("hf_", 20),
    ("nvapi-", 20),
    ("AKIA", 16),
    ("ASIA", 16),
    ("AIza", 30),
];

/// Random-looking strings shorter than this are left alone: below it, words and numbers
/// pass the character tests too often.
const MIN_RANDOM_LEN: usize = 32;
/// How often a random string switches between upper case, lower case and digits from one
/// character to the next: base64 and base62 keys about 0.4 (0.3 at their rare lowest), names
/// made of words (`PYTORCH_CUDA_ALLOC_CONF`, `ThisIsAnIdentifier2024`) below 0.25.
const MIN_CLASS_SWITCHES: f64 = 0.3;
/// Bits of Shannon entropy per character: keeps out repetitive strings (`a1a1a1...`) that
/// switch often; random strings of 32 characters have above 4.2.
const MIN_ENTROPY: f64 = 4.0;

/// Byte ranges of `text` that hold credentials, sorted and not overlapping.
pub fn find(text: &str) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    settings(text, &mut found);
    bearer(text, &mut found);
    url_userinfo(text, &mut found);
    tokens(text, &mut found);
    found.retain(|r| !r.is_empty() && !is_placeholder(&text[r.clone()]));
    found.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
    let mut merged: Vec<Range<usize>> = Vec::new();
    for r in found {
        match merged.last_mut() {
            Some(last) if r.start < last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// What the redactor writes for a credential, so a second pass leaves it alone.
fn is_placeholder(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
        return false;
    };
    let name = inner.split_once('-').map_or(inner, |(name, n)| {
        if n.chars().all(|c| c.is_ascii_digit()) {
            name
        } else {
            ""
        }
    });
    matches!(name, "secret" | "args")
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| lower.contains(w))
        || lower
            .split(['_', '-', '.'])
            .any(|part| SECRET_PARTS.contains(&part))
}

/// The end of an unquoted value starting at `from`.
fn value_end(text: &str, from: usize) -> usize {
    text[from..]
        .find(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    '"' | '\'' | '&' | ';' | ',' | ')' | ']' | '}' | '<' | '>'
                )
        })
        .map_or(text.len(), |n| from + n)
}

/// `name=value`, `name: value`, `"name": "value"` with a name that says it is secret.
fn settings(text: &str, found: &mut Vec<Range<usize>>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let Some(c) = text[i..].chars().next() else {
            break;
        };
        if !is_name_char(c) {
            i += c.len_utf8();
            continue;
        }
        let start = i;
        let end = text[i..]
            .find(|c: char| !is_name_char(c))
            .map_or(text.len(), |n| i + n);
        i = end;
        if !is_secret_name(&text[start..end]) {
            continue;
        }
        let mut j = end;
        if matches!(bytes.get(j), Some(b'"' | b'\'')) {
            j += 1;
        }
        while bytes.get(j) == Some(&b' ') {
            j += 1;
        }
        match bytes.get(j) {
            Some(b'=') => j += 1,
            // Not `::` (a path in code) nor `://` (a URL scheme).
            Some(b':') if !matches!(bytes.get(j + 1), Some(b':' | b'/')) => j += 1,
            _ => continue,
        }
        while bytes.get(j) == Some(&b' ') {
            j += 1;
        }
        let value = match bytes.get(j) {
            // A placeholder a first pass wrote, which `find` then leaves alone.
            Some(b'[') => {
                j..text[j..]
                    .find(']')
                    .map_or_else(|| value_end(text, j), |n| j + n + 1)
            }
            Some(&q @ (b'"' | b'\'')) => {
                let from = j + 1;
                let to = text[from..]
                    .find(char::from(q))
                    .map_or(text.len(), |n| from + n);
                from..to
            }
            _ => j..value_end(text, j),
        };
        // `Authorization: Bearer abc`: the credential is what follows the scheme.
        let scheme = &text[value.clone()];
        if SCHEMES.iter().any(|s| scheme.eq_ignore_ascii_case(s)) {
            let after = value.end + text[value.end..].len() - text[value.end..].trim_start().len();
            let token = after..value_end(text, after);
            if !token.is_empty() {
                found.push(token);
                i = i.max(after);
                continue;
            }
        }
        i = i.max(value.end);
        found.push(value);
    }
}

/// `Bearer <token>` anywhere (a header in a log line, a curl command).
fn bearer(text: &str, found: &mut Vec<Range<usize>>) {
    let lower = text.to_ascii_lowercase();
    for (at, _) in lower.match_indices("bearer ") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let from = at + "bearer ".len();
        let from = from + text[from..].len() - text[from..].trim_start().len();
        let token = from..value_end(text, from);
        if token.len() >= 8 {
            found.push(token);
        }
    }
}

/// `scheme://user:password@host`: the `user:password` part.
fn url_userinfo(text: &str, found: &mut Vec<Range<usize>>) {
    for (at, _) in text.match_indices("://") {
        let from = at + 3;
        let authority_end = text[from..]
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>')
            })
            .map_or(text.len(), |n| from + n);
        if let Some(n) = text[from..authority_end].rfind('@') {
            found.push(from..from + n);
        }
    }
}

/// Characters of base64 (both alphabets) and hex, but `=`, which only pads a token's end.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '_' | '-')
}

/// Vendor tokens and long random-looking strings.
fn tokens(text: &str, found: &mut Vec<Range<usize>>) {
    let mut i = 0;
    while i < text.len() {
        let Some(c) = text[i..].chars().next() else {
            break;
        };
        if !is_token_char(c) {
            i += c.len_utf8();
            continue;
        }
        let end = text[i..]
            .find(|c: char| !is_token_char(c))
            .map_or(text.len(), |n| i + n);
        let padding = text[end..].len() - text[end..].trim_start_matches('=').len();
        let end = end + padding.min(2);
        let token = &text[i..end];
        // A path's slashes belong to it; a key's may too, but not at its start.
        let piece = token.trim_start_matches('/');
        let from = end - piece.len();
        if is_vendor_token(piece) || looks_random(piece) {
            found.push(from..end);
        }
        i = end;
    }
}

fn is_vendor_token(token: &str) -> bool {
    TOKEN_PREFIXES.iter().any(|(prefix, min)| {
        token
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.len() >= *min)
    })
}

/// `GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11`, `MIG-…` and `MIG-GPU-…/1/0`.
fn is_device_uuid(token: &str) -> bool {
    let Some(rest) = token
        .strip_prefix("MIG-")
        .or_else(|| token.strip_prefix("GPU-"))
    else {
        return false;
    };
    let rest = rest.strip_prefix("GPU-").unwrap_or(rest);
    let uuid = rest.split('/').next().unwrap_or(rest);
    let groups: Vec<&str> = uuid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn looks_random(token: &str) -> bool {
    if token.len() < MIN_RANDOM_LEN || is_device_uuid(token) {
        return false;
    }
    // Hashes and hex keys.
    if token.chars().all(|c| c.is_ascii_hexdigit()) {
        return true;
    }
    token.chars().any(|c| c.is_ascii_digit())
        && token.chars().any(|c| c.is_ascii_alphabetic())
        && token.matches('/').count() <= 2
        && class_switches(token) >= MIN_CLASS_SWITCHES
        && entropy(token) >= MIN_ENTROPY
}

/// The share of neighbouring letters and digits that differ in class (upper, lower, digit).
fn class_switches(s: &str) -> f64 {
    let class = |c: char| match c {
        'A'..='Z' => Some(0),
        'a'..='z' => Some(1),
        '0'..='9' => Some(2),
        _ => None,
    };
    let (mut pairs, mut switches) = (0u32, 0u32);
    for (a, b) in s.chars().zip(s.chars().skip(1)) {
        if let (Some(x), Some(y)) = (class(a), class(b)) {
            pairs += 1;
            switches += u32::from(x != y);
        }
    }
    f64::from(switches) / f64::from(pairs.max(1))
}

/// Shannon entropy of the characters of `s`, in bits per character.
fn entropy(s: &str) -> f64 {
    let mut counts = [0u32; 128];
    let mut n = 0u32;
    for b in s.bytes().filter(u8::is_ascii) {
        counts[usize::from(b)] += 1;
        n += 1;
    }
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / f64::from(n);
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(text: &str) -> Vec<&str> {
        find(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn settings_with_secret_names() {
        assert_eq!(secrets("password=hunter2 rest"), ["hunter2"]);
        assert_eq!(secrets("0,1,password=hunter2,2"), ["hunter2"]);
        assert_eq!(secrets("DB_PASS: 's3cr3t word' ok"), ["s3cr3t word"]);
        assert_eq!(secrets(r#"{"api_key": "abc123"}"#), ["abc123"]);
        assert_eq!(secrets("--auth-token=xyz --batch 4"), ["xyz"]);
        assert_eq!(secrets("passwd:x"), ["x"]);
        assert_eq!(
            secrets("Authorization: Bearer eyJhbGciOi.x.y"),
            ["eyJhbGciOi.x.y"]
        );
        assert_eq!(
            secrets("Authorization: Basic dXNlcjpwYXNz"),
            ["dXNlcjpwYXNz"]
        );
        assert_eq!(secrets("curl -H 'bearer abcdefgh123'"), ["abcdefgh123"]);
        // Placeholders are what a first pass wrote.
        assert!(secrets("password=[secret-1] token=[args-2]").is_empty());
    }

    #[test]
    fn urls_vendor_tokens_and_random_strings() {
        assert_eq!(
            secrets("pip install --index-url https://bob:pa55@pypi.example.org/simple"),
            ["bob:pa55"]
        );
        assert_eq!(
            secrets("key nvapi-AbCdEf0123456789xyzXYZ_-abcdefgh there"),
            ["nvapi-AbCdEf0123456789xyzXYZ_-abcdefgh"]
        );
        assert_eq!(secrets("AKIAIOSFODNN7EXAMPLE"), ["AKIAIOSFODNN7EXAMPLE"]);
        let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(secrets(&format!("commit {sha}.")), [sha]);
        for random in [
            "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbA==",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "q8x2m4k9z7p1w5t3r6y0u2i8o4a1s7d9",
        ] {
            assert_eq!(secrets(&format!("x {random} y")), [random]);
        }
    }

    #[test]
    fn identifiers_and_ordinary_text_are_kept() {
        for text in [
            "GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11",
            "MIG-5c6f1a2b-3d4e-5f60-7182-93a4b5c6d7e8",
            "MIG-GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11/1/0",
            "CUDA_VISIBLE_DEVICES=GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11,1",
            "00000000:19:00.0 0000:81:00.0",
            "3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06",
            "Linux version 6.1.0-37-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC",
            "NVRM: Xid (PCI:0000:19:00): 79, pid=1234, GPU has fallen off the bus.",
            "The GPU waits on the host: pin host memory (pin_memory=True), bypass: yes",
            "max_tokens_per_batch_ThisIsALongIdentifier2024",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512",
            "/opt/NVIDIA/Nsight-Systems-2024.1/target-linux-x64/nsys",
            "https://ui.perfetto.dev chrome://tracing",
        ] {
            assert!(secrets(text).is_empty(), "{text}: {:?}", secrets(text));
        }
    }
}
