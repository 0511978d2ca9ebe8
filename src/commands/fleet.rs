//! `gpudiag fleet`: the flags made into access to Prometheus and a read request; `--json`
//! prints one look at the fleet, a terminal gets the fleet UI, and anything else (a pipe) a
//! text table of the nodes, after the jobs that make no progress.

use std::path::Path;

use gpudiag_fleet::client::{Access, Client};
use gpudiag_fleet::model::{Fleet, GpuVerdict, Job, JobStall, NodeState};
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
            .map(gpudiag_model::printable::json_c1)
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
    for (job, stall) in fleet
        .jobs
        .iter()
        .filter_map(|j| Some((j, j.stall.as_ref()?)))
    {
        out.push_str(&stalled_job_line(job, stall));
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

/// A job that makes no progress, first: it holds every GPU it has until someone acts.
fn stalled_job_line(job: &Job, stall: &JobStall) -> String {
    format!(
        "STALLED job {} ({}): {}\n",
        printable::line(&job.job_key),
        printable::line(&job.joined_by),
        printable::line(&stall.words()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpudiag_fleet::model::MissingRank;

    fn fixture() -> Fleet {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/fleet/three-nodes.json"
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn stalled_jobs_come_before_the_nodes_with_their_missing_rank_and_how_long() {
        let mut fleet = fixture();
        let quiet = text_table(&fleet);
        assert!(!quiet.contains("STALLED"), "{quiet}");
        fleet.jobs[0].stall = Some(JobStall {
            verdict: "hung".to_owned(),
            nodes: vec!["node-b".to_owned()],
            stuck_s: Some(74.6),
            missing: vec![MissingRank {
                node: "node-b".to_owned(),
                gpu: Some("3".to_owned()),
                uuid: Some("GPU-3".to_owned()),
                rank: Some("7".to_owned()),
                pid: Some("4553".to_owned()),
                state: Some("sleeping\x1b[31m".to_owned()),
            }],
            across_nodes: Some("firing".to_owned()),
        });
        let text = text_table(&fleet);
        let lines: Vec<&str> = text.lines().collect();
        let key = fleet.jobs[0].job_key.clone();
        let stalled = lines.iter().position(|l| l.starts_with("STALLED")).unwrap();
        assert_eq!(
            lines[stalled],
            format!(
                "STALLED job {key} ({}): hung for 75 s, seen by node-b; waits for rank 7 (GPU 3 \
                 of node-b, pid 4553, sleeping\\x1b[31m)",
                fleet.jobs[0].joined_by
            )
        );
        let first_node = lines
            .iter()
            .position(|l| l.starts_with(&fleet.nodes[0].name))
            .unwrap();
        assert!(stalled < first_node, "{text}");
        assert!(!text.contains('\x1b'));

        // Seen only by the rules across nodes, no rank named.
        let stall = fleet.jobs[0].stall.as_mut().unwrap();
        stall.nodes.clear();
        stall.missing.clear();
        stall.stuck_s = None;
        let text = text_table(&fleet);
        assert!(
            text.contains(&format!(
                "STALLED job {key} ({}): hung, seen by the rules' alert across its nodes \
                 (firing); no node names the rank it waits for",
                fleet.jobs[0].joined_by
            )),
            "{text}"
        );
    }
}
