//! `gpudiag fleet`: the flags made into access to Prometheus and a read request; `--json`
//! prints one look at the fleet, a terminal gets the fleet UI, and anything else (a pipe) a
//! text table of the nodes.

use std::path::Path;

use gpudiag_fleet::client::{Access, Client};
use gpudiag_fleet::model::{Fleet, GpuVerdict, NodeState};
use gpudiag_fleet::read::{ReadRequest, read_fleet};
use gpudiag_fleet::selector::Selector;
use gpudiag_model::error::{Error, exit};
use gpudiag_model::finding::Severity;
use gpudiag_model::finding::Status;
use gpudiag_model::printable;

use crate::cli::FleetArgs;
use crate::stop::Stop;
use crate::tui;

/// The most a file named by an access flag may hold (a token, a PEM bundle).
const MAX_SECRET_FILE: u64 = 1 << 20;

fn read_small(path: &Path, flag: &str) -> Result<Vec<u8>, Error> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("{flag} {}", path.display()), e))?;
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("{flag} {}", path.display()), e))?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(Error::Usage(format!(
            "{flag} {}: larger than 1 MiB, not a token or a PEM file",
            path.display()
        )));
    }
    Ok(bytes)
}

/// The first line of a secret file, without its newline.
fn first_line(path: &Path, flag: &str) -> Result<String, Error> {
    let bytes = read_small(path, flag)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::Usage(format!("{flag} {}: not UTF-8 text", path.display())))?;
    let line = text.lines().next().unwrap_or("").trim().to_owned();
    if line.is_empty() {
        return Err(Error::Usage(format!("{flag} {}: empty", path.display())));
    }
    Ok(line)
}

impl FleetArgs {
    /// How to reach Prometheus, with the named files read.
    pub fn access(&self) -> Result<Access, Error> {
        let mut access = Access::new(&self.prometheus);
        access.timeout = self.query_timeout;
        access.headers = self.headers.clone();
        if let Some(user) = &self.basic_auth_user {
            let password = match &self.basic_auth_password_file {
                Some(p) => first_line(p, "--basic-auth-password-file")?,
                None => std::env::var("GPUDIAG_PROMETHEUS_PASSWORD").map_err(|_| {
                    Error::Usage(
                        "--basic-auth-user needs --basic-auth-password-file or \
                         GPUDIAG_PROMETHEUS_PASSWORD"
                            .to_owned(),
                    )
                })?,
            };
            access.basic_auth = Some((user.clone(), password));
        }
        if let Some(p) = &self.bearer_token_file {
            access.bearer_token = Some(first_line(p, "--bearer-token-file")?);
        }
        if let Some(p) = &self.ca_file {
            access.ca_pem = Some(read_small(p, "--ca-file")?);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            access.client_cert_pem = Some((
                read_small(cert, "--client-cert")?,
                read_small(key, "--client-key")?,
            ));
        }
        Ok(access)
    }

    pub fn request(&self) -> Result<ReadRequest, Error> {
        let selector = Selector::parse(&self.selector).map_err(Error::Usage)?;
        let label_ok = !self.node_label.is_empty()
            && !self.node_label.starts_with(|c: char| c.is_ascii_digit())
            && self
                .node_label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !label_ok {
            return Err(Error::Usage(format!(
                "--node-label {:?}: not a Prometheus label name",
                self.node_label
            )));
        }
        Ok(ReadRequest {
            selector,
            node_label: self.node_label.clone(),
            at_ms: self.at,
        })
    }

    /// A client for the access the flags give; a setup problem (a bad PEM, a bad URL) is a
    /// usage error.
    pub fn client(&self) -> Result<Client, Error> {
        Client::new(&self.access()?).map_err(|e| Error::Usage(e.to_string()))
    }
}

/// `gpudiag fleet`: the terminal UI on a terminal; otherwise (or with --json) one read, printed.
pub fn fleet(args: &FleetArgs, stop: &Stop) -> Result<i32, Error> {
    if args.json || !super::interactive() {
        return fleet_once(args);
    }
    let request = args.request()?;
    let client = args.client()?;
    tui::fleet::run(client, request, args.interval, stop)
}

/// `gpudiag fleet --json`, or the text table: one read, printed, and the exit code.
fn fleet_once(args: &FleetArgs) -> Result<i32, Error> {
    let request = args.request()?;
    let mut client = args.client()?;
    let fleet = read_fleet(&mut client, &request);
    if let Some(why) = &fleet.could_not_run {
        eprint!("{}", printable::error_lines(why));
    }
    if args.json {
        let json = serde_json::to_string_pretty(&fleet)
            .map_err(|e| Error::CannotRun(format!("could not serialise the fleet: {e}")))?;
        super::print(&format!("{json}\n"))?;
    } else {
        super::print_text(&text_table(&fleet))?;
    }
    Ok(exit_code(&fleet, args.fail_on.into()))
}

pub fn exit_code(fleet: &Fleet, fail_on: Severity) -> i32 {
    if fleet.status == Status::CouldNotRun {
        exit::CANNOT_RUN
    } else if fleet.fails(fail_on) {
        exit::FINDINGS
    } else {
        exit::OK
    }
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}{unit}"))
}

/// The fleet as text for a pipe: one line per node, then its GPUs.
pub fn text_table(fleet: &Fleet) -> String {
    let mut out = format!(
        "{} · {} node(s), {} down · {} GPU(s), {} judged, {} dcgm-exporter only · {} alert(s) firing · status {}\n",
        fleet.prometheus,
        fleet.counts.nodes,
        fleet.counts.nodes_down,
        fleet.counts.gpus,
        fleet.counts.gpus_judged,
        fleet.counts.gpus_dcgm_exporter_only,
        fleet.counts.alerts_firing,
        fleet.status
    );
    if let Some(why) = &fleet.could_not_run {
        out.push_str(&format!("could not run: {why}\n"));
        return out;
    }
    for d in &fleet.degraded {
        out.push_str(&format!("note: {d}\n"));
    }
    for node in &fleet.nodes {
        let state = match node.state {
            NodeState::Up => "up",
            NodeState::Partial => "partly down",
            NodeState::Down => "DOWN",
        };
        out.push_str(&format!(
            "{}  {state}  {} GPU(s)\n",
            printable::line(&node.name),
            node.gpus.len()
        ));
        for f in &node.findings {
            out.push_str(&format!("  {} {}\n", f.severity, printable::line(&f.id)));
        }
        for g in &node.gpus {
            let verdict = match &g.verdict {
                GpuVerdict::Judged { bottleneck, .. } => printable::line(bottleneck).into_owned(),
                GpuVerdict::NotJudgedYet => "not judged yet".to_owned(),
                GpuVerdict::DcgmExporterOnly => "n/a: dcgm-exporter only".to_owned(),
            };
            let finding = g
                .findings
                .first()
                .map(|f| format!("  {} {}", f.severity, printable::line(&f.id)))
                .unwrap_or_default();
            out.push_str(&format!(
                "  GPU {:>2}  util {:>4}  SM {:>4}  {:>6}  {:>5}  {verdict}{finding}\n",
                g.gpu.as_deref().unwrap_or("?"),
                opt(g.util_pct, "%"),
                opt(g.sm_active_pct, "%"),
                opt(g.power_w, " W"),
                opt(g.temperature_c, " C"),
            ));
        }
    }
    out
}
