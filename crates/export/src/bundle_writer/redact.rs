//! Redaction of personal data in a bug-report bundle: host names, user names, command-line
//! arguments, home paths, credentials, Slurm job ids and Kubernetes pod and namespace names are
//! replaced by placeholders (`host-1`, `user-1`, `[args-1]`, `[secret-1]`, `job-1`, `pod-1`,
//! `namespace-1`), the same secret by the same placeholder in every file, so the report stays
//! readable.
//!
//! Two passes over every document: `learn` collects secrets (the host names it is told, user
//! names, names under `/home/`, arguments of process command lines, what `credentials` finds),
//! then `redact` replaces them, whole values and inside other strings (a run id `alice-run-7`,
//! a job key `…@node-a`), so a secret first seen in the last file is still replaced in the
//! first. `redact` also looks for credentials in what it is given, so one that no document
//! showed while learning is still replaced (by `[secret]`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::credentials;

/// Users whose names are words, not personal data; their home directories still get a
/// placeholder, their names elsewhere are left alone.
const SYSTEM_USERS: [&str; 6] = ["root", "nobody", "daemon", "admin", "user", "ubuntu"];
/// Kubernetes' own namespaces: words, not personal data ("default" is in every other line).
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
/// Names shorter than this are not replaced inside other strings: they would hit everything.
/// A value that is the whole name is replaced whatever its length.
const MIN_WORD: usize = 3;
/// Job ids are numbers: shorter ones would hit counts and readings inside other strings.
const MIN_JOB_WORD: usize = 4;
/// Credentials at least this long are replaced wherever they appear, not only where they look
/// like one (a token passed in one file and quoted bare in another); shorter ones could be
/// part of anything.
const MIN_BARE_SECRET: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Host,
    User,
    Args,
    Secret,
    Job,
    Pod,
    Namespace,
}

impl Class {
    fn prefix(self) -> &'static str {
        match self {
            Class::Host => "host",
            Class::User => "user",
            Class::Args => "args",
            Class::Secret => "secret",
            Class::Job => "job",
            Class::Pod => "pod",
            Class::Namespace => "namespace",
        }
    }

    /// What the README calls a secret of this class.
    fn noun(self) -> &'static str {
        match self {
            Class::Host => "host name(s)",
            Class::User => "user name(s)",
            Class::Args => "command-line argument list(s)",
            Class::Secret => "credential(s)",
            Class::Job => "Slurm job id(s)",
            Class::Pod => "pod name(s)",
            Class::Namespace => "namespace name(s)",
        }
    }

    /// The shortest secret of this class replaced inside another string.
    fn min_word(self) -> usize {
        match self {
            Class::Job => MIN_JOB_WORD,
            _ => MIN_WORD,
        }
    }

    /// Written in brackets: arguments and credentials replace part of a value, and the
    /// brackets show where.
    fn bracketed(self) -> bool {
        matches!(self, Class::Args | Class::Secret)
    }
}

/// Maps secrets to placeholders. With `enabled == false` every method leaves data unchanged.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    enabled: bool,
    /// secret → (class, placeholder)
    map: BTreeMap<String, (Class, String)>,
    counts: BTreeMap<Class, usize>,
}

fn is_path_char(c: char) -> bool {
    !(c == '/' || c.is_whitespace() || matches!(c, '"' | '\'' | ':' | ',' | ';' | ')' | ']' | '}'))
}

impl Redactor {
    pub fn new(enabled: bool) -> Self {
        Redactor {
            enabled,
            ..Redactor::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn add(&mut self, class: Class, secret: &str) -> String {
        if let Some((_, p)) = self.map.get(secret) {
            return p.clone();
        }
        let n = self.counts.entry(class).or_default();
        *n += 1;
        let placeholder = if class.bracketed() {
            format!("[{}-{n}]", class.prefix())
        } else {
            format!("{}-{n}", class.prefix())
        };
        self.map
            .insert(secret.to_string(), (class, placeholder.clone()));
        placeholder
    }

    /// A host name (and its first label, for a fully qualified one).
    pub fn learn_host(&mut self, host: &str) {
        let host = host.trim();
        if !self.enabled || host.is_empty() {
            return;
        }
        let placeholder = self.add(Class::Host, host);
        if let Some((short, _)) = host.split_once('.')
            && short.len() >= MIN_WORD
            && !self.map.contains_key(short)
        {
            self.map
                .insert(short.to_string(), (Class::Host, placeholder));
        }
    }

    /// A node's address, `host`, `host:port` or `[v6]:port` (NCCL RAS): its host, unless
    /// loopback or unspecified, which name no machine.
    pub fn learn_address(&mut self, addr: &str) {
        let addr = addr.trim();
        let host = if let Some(rest) = addr.strip_prefix('[') {
            rest.split(']').next().unwrap_or(rest)
        } else if addr.matches(':').count() == 1 {
            addr.split(':').next().unwrap_or(addr)
        } else {
            addr
        };
        if matches!(
            host,
            "" | "localhost" | "127.0.0.1" | "::1" | "0.0.0.0" | "::" | "unknown"
        ) {
            return;
        }
        // An IP address has no short name: "192" of 192.168.1.5 would hit every 192.
        if host.parse::<std::net::IpAddr>().is_ok() {
            if self.enabled {
                self.add(Class::Host, host);
            }
        } else {
            self.learn_host(host);
        }
    }

    pub fn learn_user(&mut self, user: &str) {
        let user = user.trim();
        if self.enabled && !user.is_empty() {
            self.add(Class::User, user);
        }
    }

    pub fn learn_job(&mut self, id: &str) {
        let id = id.trim();
        if self.enabled && !id.is_empty() {
            self.add(Class::Job, id);
        }
    }

    /// A pod's namespace and name; Kubernetes' own namespaces are kept.
    pub fn learn_pod(&mut self, namespace: Option<&str>, name: Option<&str>) {
        if !self.enabled {
            return;
        }
        if let Some(ns) = namespace.map(str::trim)
            && !ns.is_empty()
            && !SYSTEM_NAMESPACES.contains(&ns)
        {
            self.add(Class::Namespace, ns);
        }
        if let Some(name) = name.map(str::trim)
            && !name.is_empty()
        {
            self.add(Class::Pod, name);
        }
    }

    /// A process's owners (`processes[].attribution`) and the pods a GPU is allocated to
    /// (`gpu_pods`, `attribution.pod.sharing`): objects with a `namespace` and a `name`.
    fn learn_owners(&mut self, process: &Value) {
        let Some(a) = process.get("attribution") else {
            return;
        };
        if let Some(job) = a.get("job") {
            if let Some(Value::String(id)) = job.get("id") {
                self.learn_job(id);
            }
            if let Some(Value::String(u)) = job.get("user") {
                self.learn_user(u);
            }
        }
        if let Some(pod) = a.get("pod") {
            self.learn_pod_object(pod);
            if let Some(Value::Array(sharing)) = pod.get("sharing") {
                sharing.iter().for_each(|p| self.learn_pod_object(p));
            }
        }
    }

    fn learn_pod_object(&mut self, pod: &Value) {
        let text = |k: &str| pod.get(k).and_then(Value::as_str);
        self.learn_pod(text("namespace"), text("name"));
    }

    /// A process command line: the arguments after the program are a secret of their own.
    pub fn learn_command(&mut self, command: &str) {
        if !self.enabled {
            return;
        }
        if let Some((_, args)) = command.trim().split_once(char::is_whitespace) {
            let args = args.trim();
            if !args.is_empty() {
                self.add(Class::Args, args);
            }
        }
        self.learn_text(command);
    }

    /// Names of home directories and credentials mentioned in `text`.
    pub fn learn_text(&mut self, text: &str) {
        if !self.enabled {
            return;
        }
        self.learn_credentials(text);
        let mut rest = text;
        while let Some(at) = rest.find("/home/") {
            let after = &rest[at + 6..];
            let name: String = after.chars().take_while(|&c| is_path_char(c)).collect();
            if !name.is_empty() {
                self.learn_user(&name);
            }
            rest = after;
        }
        if contains_root_home(text) {
            self.learn_user("root");
        }
    }

    fn learn_credentials(&mut self, text: &str) {
        for r in credentials::find(text) {
            self.add(Class::Secret, &text[r]);
        }
    }

    /// Learns from every string of a JSON document; `processes[].name` are command lines.
    pub fn learn_value(&mut self, v: &Value) {
        if !self.enabled {
            return;
        }
        match v {
            Value::String(s) => self.learn_text(s),
            Value::Array(a) => a.iter().for_each(|x| self.learn_value(x)),
            Value::Object(m) => {
                if let Some(Value::Array(ps)) = m.get("processes") {
                    for p in ps {
                        if let Some(Value::String(c)) = p.get("name") {
                            self.learn_command(c);
                        }
                        if let Some(Value::String(u)) = p.get("user") {
                            self.learn_user(u);
                        }
                        self.learn_owners(p);
                        // The node a job's ranks meet at is another host of the site;
                        // loopback names nothing.
                        if let Some(Value::String(addr)) =
                            p.get("launch").and_then(|l| l.get("master_addr"))
                            && !matches!(addr.as_str(), "localhost" | "127.0.0.1" | "::1")
                        {
                            self.learn_host(addr);
                        }
                        if let Some(Value::String(addr)) =
                            p.get("launch").and_then(|l| l.get("nccl_ras_addr"))
                        {
                            self.learn_address(addr);
                        }
                    }
                }
                // An NCCL RAS answer names the address asked and every rank's node.
                if let Some(Value::Array(communicators)) = m.get("communicators") {
                    if let Some(Value::String(addr)) = m.get("address") {
                        self.learn_address(addr);
                    }
                    for rank in communicators
                        .iter()
                        .flat_map(|c| ["ranks", "missing_ranks"].map(|k| c.get(k)))
                        .flatten()
                        .filter_map(Value::as_array)
                        .flatten()
                    {
                        if let Some(Value::String(node)) = rank.get("node") {
                            self.learn_address(node);
                        }
                    }
                }
                if let Some(Value::Array(pods)) = m.get("gpu_pods") {
                    pods.iter().for_each(|p| self.learn_pod_object(p));
                }
                for (k, x) in m {
                    self.learn_credentials(k);
                    self.learn_value(x);
                }
            }
            _ => {}
        }
    }

    /// Replaces every secret in `text`.
    pub fn text(&self, text: &str) -> String {
        if !self.enabled {
            return text.to_string();
        }
        // Longest first, so "node1.example.com" wins over "node1".
        let mut secrets: Vec<(&String, &(Class, String))> = self.map.iter().collect();
        secrets.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        // Arguments first: they were learned raw, before any home path or credential in them
        // was replaced.
        let mut out = text.to_string();
        for (secret, (class, placeholder)) in &secrets {
            if *class == Class::Args {
                out = out.replace(secret.as_str(), placeholder);
            }
        }
        for (secret, (class, placeholder)) in &secrets {
            if *class == Class::Secret && secret.len() >= MIN_BARE_SECRET {
                out = out.replace(secret.as_str(), placeholder);
            }
        }
        let out = self.credentials(&out);
        let out = self.home_paths(&out);
        let names: Vec<(&str, &str)> = secrets
            .into_iter()
            .filter(|(secret, (class, _))| match class {
                Class::Args | Class::Secret => false,
                Class::User if SYSTEM_USERS.contains(&secret.as_str()) => false,
                _ => secret.chars().count() >= class.min_word(),
            })
            .map(|(secret, (_, placeholder))| (secret.as_str(), placeholder.as_str()))
            .collect();
        replace_names(&out, &names)
    }

    /// Every credential `text` shows: its learned placeholder, else `[secret]`.
    fn credentials(&self, text: &str) -> String {
        let found = credentials::find(text);
        if found.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for r in found {
            out.push_str(&text[last..r.start]);
            match self.map.get(&text[r.clone()]) {
                Some((Class::Secret, p)) => out.push_str(p),
                _ => out.push_str("[secret]"),
            }
            last = r.end;
        }
        out.push_str(&text[last..]);
        out
    }

    /// `/home/NAME` → `/home/user-N`, `/root` → `/home/user-N` (root's placeholder).
    fn home_paths(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("/home/") {
            out.push_str(&rest[..at + 6]);
            let after = &rest[at + 6..];
            let len: usize = after
                .chars()
                .take_while(|&c| is_path_char(c))
                .map(char::len_utf8)
                .sum();
            let name = &after[..len];
            match self.map.get(name) {
                Some((_, p)) => out.push_str(p),
                None => out.push_str(name),
            }
            rest = &after[len..];
        }
        out.push_str(rest);
        match self.map.get("root") {
            Some((_, p)) if contains_root_home(&out) => replace_root_home(&out, p),
            _ => out,
        }
    }

    /// Redacts every string of a JSON document in place. Object keys are names: only
    /// credentials in them are replaced, since a host or user name can also be a field's name.
    pub fn redact_value(&self, v: &mut Value) {
        if !self.enabled {
            return;
        }
        match v {
            // A value that is a whole secret (a job id, a short pod name) is replaced even where
            // free text would keep it.
            Value::String(s) => match self.map.get(s.as_str()) {
                Some((class, p))
                    if *class != Class::Args
                        && !(*class == Class::User && SYSTEM_USERS.contains(&s.as_str())) =>
                {
                    *s = p.clone();
                }
                _ => {
                    let r = self.text(s);
                    if r != *s {
                        *s = r;
                    }
                }
            },
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            Value::Object(m) => {
                // A RAS report that could not be read may quote node addresses never learned.
                if m.contains_key("communicators")
                    && let Some(excerpt) = m.get_mut("excerpt")
                    && excerpt.is_string()
                {
                    *excerpt = Value::String("[excerpt removed]".into());
                }
                m.values_mut().for_each(|x| self.redact_value(x));
                if m.keys().any(|k| !credentials::find(k).is_empty()) {
                    *m = std::mem::take(m)
                        .into_iter()
                        .map(|(k, x)| (self.credentials(&k), x))
                        .collect();
                }
            }
            _ => {}
        }
    }

    /// What was replaced, by class, for the README: ("host name(s)", 1), ...
    pub fn summary(&self) -> Vec<(&'static str, usize)> {
        self.counts.iter().map(|(c, n)| (c.noun(), *n)).collect()
    }
}

/// Positions of `/root` that are the root home directory (followed by `/`, the end, or a
/// delimiter; preceded by the start or a non-path character).
fn root_home_positions(text: &str) -> Vec<usize> {
    text.match_indices("/root")
        .filter(|(i, _)| {
            let before = text[..*i].chars().next_back();
            let after = text[i + 5..].chars().next();
            before.is_none_or(|c| !is_path_char(c) || c == '=')
                && after.is_none_or(|c| c == '/' || !is_path_char(c))
        })
        .map(|(i, _)| i)
        .collect()
}

fn contains_root_home(text: &str) -> bool {
    !root_home_positions(text).is_empty()
}

fn replace_root_home(text: &str, placeholder: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for i in root_home_positions(text) {
        out.push_str(&text[last..i]);
        out.push_str("/home/");
        out.push_str(placeholder);
        last = i + 5;
    }
    out.push_str(&text[last..]);
    out
}

/// Replaces every name of `names` (longest first) where it stands apart in `text`, in one pass
/// over the text as given: a placeholder written for one name is never read as another
/// (a user called `pod` would otherwise eat `pod-1`).
///
/// A name stands apart where what touches it does not carry it on: a letter next to a
/// letter-edged name or a digit next to a digit-edged one (also across a decimal point or a
/// thousands comma) makes it part of another word or number; anything else is a boundary. So
/// `alice` is found in `alice-run-7`, `alice_exp`, `127.0.0.1:29500@alice` and `alice7`, but not
/// in `malice`; `node1` not in `node10`; the job `4242` not in `14242` or `0.4242`. Substrings
/// would find more, but a three-letter name would then rewrite ordinary words (`sam` in
/// `sample`, `ann` in `annotations`), gpudiag's own vocabulary included, and a recording must
/// still read back after redaction.
fn replace_names(text: &str, names: &[(&str, &str)]) -> String {
    let mut taken: Vec<(usize, usize, &str)> = Vec::new();
    for &(name, placeholder) in names {
        if name.is_empty() {
            continue;
        }
        for (start, _) in text.match_indices(name) {
            let end = start + name.len();
            let overlaps = taken.iter().any(|&(s, e, _)| start < e && s < end);
            if !overlaps && stands_apart(text, start, end) {
                taken.push((start, end, placeholder));
            }
        }
    }
    if taken.is_empty() {
        return text.to_string();
    }
    taken.sort_unstable_by_key(|&(start, _, _)| start);
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end, placeholder) in taken {
        out.push_str(&text[last..start]);
        out.push_str(placeholder);
        last = end;
    }
    out.push_str(&text[last..]);
    out
}

/// Whether `text[start..end]` is not the middle of a longer word or number.
fn stands_apart(text: &str, start: usize, end: usize) -> bool {
    let name = &text[start..end];
    let mut before = text[..start].chars().rev();
    let mut after = text[end..].chars();
    let carried = |edge: Option<char>, next: Option<char>, beyond: Option<char>| {
        let (Some(edge), Some(next)) = (edge, next) else {
            return false;
        };
        (edge.is_alphabetic() && next.is_alphabetic())
            || (edge.is_numeric() && next.is_numeric())
            || (edge.is_numeric()
                && matches!(next, '.' | ',')
                && beyond.is_some_and(char::is_numeric))
    };
    !carried(name.chars().next(), before.next(), before.next())
        && !carried(name.chars().next_back(), after.next(), after.next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn same_secret_same_placeholder_everywhere() {
        let mut r = Redactor::new(true);
        r.learn_host("gpu-node-17.example.org");
        let mut doc = json!({
            "host": "gpu-node-17.example.org",
            "log": "NVRM: gpu-node-17 Xid 79 by /home/alice/bin/train",
            "processes": [{"name": "python /home/alice/x.py --token=hunter2", "user": "alice"}],
            "home": "/root/.cache",
        });
        r.learn_value(&doc);
        r.redact_value(&mut doc);
        let text = doc.to_string();
        for secret in ["gpu-node-17", "alice", "hunter2", "/root"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(doc["host"], "host-1");
        assert_eq!(doc["log"], "NVRM: host-1 Xid 79 by /home/user-1/bin/train");
        assert_eq!(doc["processes"][0]["name"], "python [args-1]");
        assert_eq!(doc["processes"][0]["user"], "user-1");
        let mut launched = serde_json::json!({"processes": [{"pid": 9, "launch": {
            "master_addr": "gpu-node-17.cluster", "master_port": "29500",
            "exe": "/home/carol/venv/bin/python3"}}]});
        let mut r = Redactor::new(true);
        r.learn_value(&launched);
        r.redact_value(&mut launched);
        let launch = &launched["processes"][0]["launch"];
        assert_eq!(launch["master_addr"], "host-1");
        assert_eq!(launch["exe"], "/home/user-1/venv/bin/python3");
        assert_eq!(doc["home"], "/home/user-2/.cache");
    }

    #[test]
    fn nccl_ras_answers_lose_their_nodes_and_excerpts() {
        let mut doc = json!({"kind": "nccl_ras", "address": "10.1.2.3:28028",
            "excerpt": "Rank 3 -- GPU 3 managed by process 4553 on node 10.9.9.9",
            "errors": ["process 4553 (GPU 3) is considered dead"],
            "communicators": [{"hash": "0x1",
                "ranks": [{"rank": 0, "node": "10.1.2.3"}, {"rank": 1, "node": "127.0.0.1"}],
                "missing_ranks": [{"rank": 3, "node": "fe80::1"}]}],
            "processes": [{"pid": 1, "launch": {"nccl_ras_addr": "[fd00::7]:28028"}}]});
        let mut r = Redactor::new(true);
        r.learn_value(&doc);
        r.redact_value(&mut doc);
        let text = doc.to_string();
        for secret in ["10.1.2.3", "10.9.9.9", "fe80::1", "fd00::7"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let address = doc["address"].as_str().unwrap_or_default();
        assert!(
            address.starts_with("host-") && address.ends_with(":28028"),
            "{address}"
        );
        assert_eq!(doc["communicators"][0]["ranks"][1]["node"], "127.0.0.1");
        assert_eq!(doc["excerpt"], "[excerpt removed]");
        assert_eq!(doc["errors"][0], "process 4553 (GPU 3) is considered dead");
    }

    /// Names are personal data inside run ids, pod and job names, master addresses and job
    /// keys too, wherever they stand apart; inside a longer word or number they are not the name.
    #[test]
    fn names_inside_other_strings_are_replaced() {
        let mut r = Redactor::new(true);
        r.learn_user("alice");
        r.learn_host("node-alice7");
        r.learn_host("node1");
        r.learn_job("4242");
        let mut doc = json!({
            "run_id": "alice-run-7",
            "pod": "alice-train-0",
            "key": "127.0.0.1:29500@node-alice7",
            "exp": "alice_exp2 alice7 x.alice",
            "kept": "malice, node10, anode1 is node1",
            "numbers": "14242 0.4242 4,4242 slurm-4242.out",
        });
        r.learn_value(&doc);
        r.redact_value(&mut doc);
        assert_eq!(doc["run_id"], "user-1-run-7");
        assert_eq!(doc["pod"], "user-1-train-0");
        assert_eq!(doc["key"], "127.0.0.1:29500@host-1");
        assert_eq!(doc["exp"], "user-1_exp2 user-17 x.user-1");
        assert_eq!(doc["kept"], "malice, node10, anode1 is host-2");
        assert_eq!(doc["numbers"], "14242 0.4242 4,4242 slurm-job-1.out");
    }

    /// One pass: a placeholder written for one name is not read as another name.
    #[test]
    fn placeholders_are_not_redacted_again() {
        let mut r = Redactor::new(true);
        r.learn_host("pod");
        r.learn_pod(None, Some("train-0"));
        assert_eq!(r.text("pod runs train-0"), "host-1 runs pod-1");
    }

    #[test]
    fn words_inside_other_words_are_kept() {
        let mut r = Redactor::new(true);
        r.learn_user("ann");
        assert_eq!(r.text("annual ann's plan"), "annual user-1's plan");
        assert_eq!(r.text("/rooted /root"), "/rooted /root");
    }

    #[test]
    fn credentials_get_one_placeholder_everywhere_and_gpu_ids_stay() {
        let mut r = Redactor::new(true);
        let uuid = "GPU-3f8a2c71-9b4e-5d06-a1c2-7e9f0b4d2a11";
        let mut doc = json!({
            "env": {"CUDA_VISIBLE_DEVICES": format!("{uuid},1 password=hunter22x")},
            "log": ["NVRM: 0000:19:00.0 passwd: pw1", "the key hunter22x again"],
            "keys": {"token=in-a-key": 1},
        });
        r.learn_value(&doc);
        r.redact_value(&mut doc);
        assert_eq!(
            doc["env"]["CUDA_VISIBLE_DEVICES"],
            format!("{uuid},1 password=[secret-1]")
        );
        // Too short to replace out of context, so only where it looks like a credential.
        assert_eq!(doc["log"][0], "NVRM: 0000:19:00.0 passwd: [secret-3]");
        assert_eq!(doc["log"][1], "the key [secret-1] again");
        assert_eq!(doc["keys"], json!({"token=[secret-2]": 1}));
        assert_eq!(r.text("pw1 stays as a word"), "pw1 stays as a word");
        // One that no document showed while learning is still caught.
        assert_eq!(r.text("late api_key=zzz"), "late api_key=[secret]");
        assert!(r.summary().contains(&("credential(s)", 3)));
    }

    #[test]
    fn jobs_pods_and_namespaces_are_personal_data() {
        let mut r = Redactor::new(true);
        let mut doc = json!({
            "gpu_pods": [{"namespace": "ml-team", "name": "train-llm-0", "containers": ["trainer"]}],
            "processes": [
                {"pid": 7, "name": "python3", "user": "alice", "attribution": {
                    "job": {"id": "4242", "step": "0", "user": "bob", "found_in": "cgroup"},
                    "pod": null}},
                {"pid": 8, "name": "python3", "user": "carol", "attribution": {
                    "job": null,
                    "pod": {"uid": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "name": "a",
                            "namespace": "default", "container": "lab",
                            "sharing": [{"namespace": "default", "name": "a"},
                                        {"namespace": "research", "name": "notebook-b"}]}}},
            ],
            "log": "job 4242 of bob in ml-team/train-llm-0 and research/notebook-b used 100 MiB",
        });
        r.learn_value(&doc);
        r.redact_value(&mut doc);
        let text = doc.to_string();
        for secret in [
            "4242",
            "bob",
            "ml-team",
            "train-llm-0",
            "notebook-b",
            "research",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let job = &doc["processes"][0]["attribution"]["job"];
        assert_eq!(job["id"], "job-1");
        assert!(job["user"].as_str().unwrap().starts_with("user-"));
        let pod = &doc["processes"][1]["attribution"]["pod"];
        // A one-letter pod name is replaced where it is the whole value, not in free text.
        assert!(pod["name"].as_str().unwrap().starts_with("pod-"), "{pod}");
        assert_eq!(pod["namespace"], "default");
        assert_eq!(doc["gpu_pods"][0]["containers"][0], "trainer");
        assert_eq!(
            doc["log"],
            "job job-1 of user-2 in namespace-2/pod-3 and namespace-1/pod-2 used 100 MiB"
        );
        let summary = r.summary();
        assert!(summary.contains(&("Slurm job id(s)", 1)), "{summary:?}");
        assert!(summary.contains(&("pod name(s)", 3)), "{summary:?}");
        assert!(summary.contains(&("namespace name(s)", 2)), "{summary:?}");
    }

    #[test]
    fn disabled_changes_nothing() {
        let mut r = Redactor::new(false);
        r.learn_host("h1.example");
        let mut v = json!({"a": "h1.example /home/bob"});
        r.learn_value(&v);
        r.redact_value(&mut v);
        assert_eq!(v, json!({"a": "h1.example /home/bob"}));
    }
}
