#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The RAS client against a fake RAS server (a listener thread) replaying reports in NCCL's own
//! layout (`tests/fixtures/ras/`), and against hostile servers: huge, trickling, binary, with
//! terminal escapes, closing early, silent.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use gpudiag_model::ras::{RasAnswer, RasFailure, RasFormat, RasMatch, RasRankState};
use gpudiag_telemetry::ras::{RasQuery, matches_job, parse_json, parse_text, query};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/ras")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A capture is the whole stream the server sent; the report is what follows the one-line
/// replies to the handshake, TIMEOUT and SET FORMAT.
fn report_of(capture: &[u8]) -> Vec<u8> {
    let mut rest = capture;
    loop {
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            return rest.to_vec();
        };
        let line = String::from_utf8_lossy(&rest[..end]);
        if line.starts_with("SERVER PROTOCOL") || line.trim() == "OK" || line.starts_with("ERROR") {
            rest = &rest[end + 1..];
        } else {
            return rest.to_vec();
        }
    }
}

#[derive(Clone)]
enum Server {
    /// Speaks the protocol; answers JSON when asked (NCCL 2.28.7+) or refuses it (older).
    Nccl { report: Vec<u8>, json: bool },
    /// Sends these bytes at once, whatever is asked, and closes.
    Raw(Vec<u8>),
    /// The handshake, then bytes without end.
    Endless,
    /// The handshake, then a byte every 50 ms for ever.
    Trickle,
    /// Accepts and says nothing.
    Silent,
    /// Accepts a first connection and never answers it (a stopped process holding the port),
    /// then serves the next as the inner server.
    StoppedThen(Box<Server>),
}

fn serve(server: Server) -> (String, JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        if let Server::StoppedThen(next) = server {
            let (answered, _) = listener.accept().expect("accept");
            let commands = run(*next, answered);
            drop(stream);
            return commands;
        }
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        run(server, stream)
    });
    (addr, handle)
}

/// The commands the client sent, in order.
fn run(server: Server, mut stream: TcpStream) -> Vec<String> {
    let mut commands = Vec::new();
    if let Server::Raw(bytes) = &server {
        let _ = stream.write_all(bytes);
        return commands;
    }
    if let Server::Silent = server {
        std::thread::sleep(Duration::from_secs(4));
        return commands;
    }
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return commands;
        }
        let cmd = line.trim_end().to_owned();
        commands.push(cmd.clone());
        let upper = cmd.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("CLIENT PROTOCOL ") {
            b"SERVER PROTOCOL 2\n"
        } else if upper.starts_with("TIMEOUT ") {
            b"OK\n"
        } else if upper == "SET FORMAT JSON" {
            match &server {
                Server::Nccl { json: false, .. } => b"ERROR: Unknown command set format json\n",
                _ => b"OK\n",
            }
        } else if upper == "STATUS" || upper == "VERBOSE STATUS" {
            match &server {
                Server::Nccl { report, .. } => {
                    let _ = stream.write_all(report);
                }
                Server::Endless => {
                    let chunk = vec![b'x'; 64 * 1024];
                    while stream.write_all(&chunk).is_ok() {}
                }
                Server::Trickle => {
                    for _ in 0..400 {
                        if stream.write_all(b"Rank").is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Server::Raw(_) | Server::Silent | Server::StoppedThen(_) => {}
            }
            return commands;
        } else {
            b"ERROR: Unknown command\n"
        };
        if stream.write_all(reply).is_err() {
            return commands;
        }
    }
}

fn ask(server: Server) -> (RasAnswer, Vec<String>) {
    let (addr, handle) = serve(server);
    let mut q = RasQuery::new(addr, vec![0, 1, 2, 3]);
    q.deadline = Duration::from_secs(2);
    let answer = query(&q);
    (answer, handle.join().expect("server thread"))
}

fn nccl(name: &str, json: bool) -> Server {
    Server::Nccl {
        report: report_of(&fixture(name)),
        json,
    }
}

const JOB: [(u32, u32); 4] = [(4550, 0), (4551, 1), (4552, 2), (4553, 3)];

#[test]
fn a_healthy_job_answers_json_with_every_rank_counted() {
    let (a, commands) = ask(nccl("synthetic-healthy-1-json.txt", true));
    assert_eq!(
        commands,
        [
            "CLIENT PROTOCOL 2",
            "TIMEOUT 5",
            "SET FORMAT json",
            "STATUS"
        ]
    );
    assert_eq!(a.not_answered, None, "{a:?}");
    assert_eq!(a.format, Some(RasFormat::Json));
    assert_eq!(a.protocol, Some(2));
    assert_eq!(a.nccl_version.as_deref(), Some("2.28.9"));
    assert_eq!(a.communicators.len(), 1);
    let c = &a.communicators[0];
    assert_eq!(c.size, Some(4));
    assert_eq!(c.ranks.len(), 4);
    assert!(c.ranks.iter().all(|r| r.state == RasRankState::Running));
    assert_eq!(c.ranks[3].pid, Some(4553));
    assert_eq!(c.ranks[3].nvml_device, Some(3));
    assert_eq!(c.ranks[3].operations.get("AllReduce"), Some(&120));
    assert_eq!(matches_job(&a, &JOB), RasMatch::Same);
}

#[test]
fn a_mismatch_names_the_rank_behind_in_json_and_in_text() {
    let (a, _) = ask(nccl("synthetic-mismatch-1-json.txt", true));
    let c = &a.communicators[0];
    assert!(c.flags.iter().any(|f| f == "MISMATCH"), "{c:?}");
    let behind: Vec<_> = c
        .count_groups
        .iter()
        .filter(|g| g.collective == "AllReduce")
        .map(|g| (g.ranks_count, g.operations, g.ranks.clone()))
        .collect();
    assert_eq!(behind, [(3, 41, vec![0, 1, 2]), (1, 30, vec![3])]);

    let (t, commands) = ask(nccl("synthetic-mismatch-1-verbose.txt", false));
    assert_eq!(
        commands,
        [
            "CLIENT PROTOCOL 2",
            "TIMEOUT 5",
            "SET FORMAT json",
            "VERBOSE STATUS"
        ],
        "an NCCL without JSON is asked the verbose text"
    );
    assert_eq!(t.not_answered, None, "{t:?}");
    assert_eq!(t.format, Some(RasFormat::Text));
    assert_eq!(t.nccl_version.as_deref(), Some("2.28.9+cuda12.9"));
    assert_eq!(t.communicators_total, Some(1));
    let c = &t.communicators[0];
    assert_eq!(c.hash, "0x7f3ad1c2e4b5a6d7");
    let groups: Vec<_> = c
        .count_groups
        .iter()
        .map(|g| (g.ranks_count, g.operations, g.ranks.clone()))
        .collect();
    assert_eq!(groups, [(3, 41, vec![]), (1, 30, vec![3])]);
    assert_eq!(c.ranks[0].pid, Some(4553));
    assert_eq!(c.ranks[0].node.as_deref(), Some("127.0.0.1"));
    assert_eq!(c.ranks[0].operations.get("AllReduce"), Some(&30));
    assert_eq!(matches_job(&t, &JOB), RasMatch::Same);
}

#[test]
fn a_dead_rank_is_read_from_json_as_nccl_228_writes_it_and_from_text() {
    // NCCL 2.28.9's JSON for a missing rank lacks a comma; the parser repairs that one.
    let (a, _) = ask(nccl("synthetic-dead-1-json.txt", true));
    assert_eq!(a.not_answered, None, "{a:?}");
    let c = &a.communicators[0];
    assert_eq!(c.missing_ranks.len(), 1);
    assert_eq!(c.missing_ranks[0].state, RasRankState::Dead);
    assert_eq!(c.missing_ranks[0].pid, Some(4553));
    assert_eq!(a.dead_processes, Some(1));
    assert_eq!(a.timeouts, Some(1));

    let t = parse_text(&report_of(&fixture("synthetic-dead-1-verbose.txt")));
    assert_eq!(t.not_answered, None, "{t:?}");
    assert_eq!(t.dead_processes, Some(1));
    assert_eq!(t.timeouts, Some(1));
    let c = &t.communicators[0];
    assert_eq!(c.missing_ranks[0].rank, 3);
    assert_eq!(c.missing_ranks[0].state, RasRankState::Unresponsive);
    assert!(
        t.errors.iter().any(|e| e.contains("4553")),
        "{:?}",
        t.errors
    );
}

#[test]
fn another_job_of_the_same_user_is_told_apart() {
    let a = parse_json(&report_of(&fixture("synthetic-otherjob-1-json.txt")));
    assert_eq!(a.not_answered, None);
    assert_eq!(matches_job(&a, &JOB), RasMatch::Other);
    // A healthy text report names no pid: it cannot tell.
    let t = parse_text(&report_of(&fixture("synthetic-healthy-1-verbose.txt")));
    assert_eq!(t.not_answered, None, "{t:?}");
    assert_eq!(matches_job(&t, &JOB), RasMatch::Unknown);
}

#[test]
fn several_communicators_are_kept_apart() {
    let a = parse_json(&report_of(&fixture("synthetic-multicomm-1-json.txt")));
    assert_eq!(a.communicators_total, Some(3));
    let sizes: Vec<_> = a.communicators.iter().map(|c| c.size).collect();
    assert_eq!(sizes, [Some(4), Some(2), Some(2)]);
    assert!(a.communicators[1].count_groups.is_empty());
    assert_eq!(a.communicators[2].count_groups.len(), 2);
}

#[test]
fn nothing_listening_is_refused_not_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    let a = query(&RasQuery::new(addr, vec![0]));
    assert_eq!(
        a.not_answered.as_ref().map(|n| n.failure),
        Some(RasFailure::Refused)
    );
}

#[test]
fn localhost_is_asked_on_the_loopback() {
    let (addr, handle) = serve(nccl("synthetic-healthy-1-json.txt", true));
    let port = addr.rsplit_once(':').map(|(_, p)| p.to_owned()).unwrap();
    let a = query(&RasQuery::new(format!("localhost:{port}"), vec![0]));
    handle.join().unwrap();
    assert_eq!(a.not_answered, None, "{a:?}");
    assert_eq!(a.address, format!("localhost:{port}"));
}

#[test]
fn a_host_name_is_not_looked_up() {
    let a = query(&RasQuery::new("ras.example.invalid:28028", vec![0]));
    assert_eq!(
        a.not_answered.as_ref().map(|n| n.failure),
        Some(RasFailure::Io)
    );
}

fn failure(server: Server) -> (RasFailure, RasAnswer, Duration) {
    let (a, _) = ask(server);
    // The query's own time: the server thread may linger after it.
    let took = Duration::from_millis(a.took_ms);
    let f = a.not_answered.as_ref().map(|n| n.failure);
    (f.unwrap_or_else(|| panic!("answered: {a:?}")), a, took)
}

#[test]
fn a_process_that_does_not_answer_the_handshake_is_left_for_another() {
    let (addr, handle) = serve(Server::StoppedThen(Box::new(nccl(
        "synthetic-healthy-1-json.txt",
        true,
    ))));
    let mut q = RasQuery::new(addr, vec![0, 1, 2, 3]);
    q.deadline = Duration::from_secs(5);
    let a = query(&q);
    let commands = handle.join().unwrap();
    assert_eq!(a.not_answered, None, "{a:?}");
    assert_eq!(commands.last().map(String::as_str), Some("STATUS"));
    assert!((1000..3000).contains(&a.took_ms), "{}", a.took_ms);
}

#[test]
fn an_endless_answer_stops_at_the_cap() {
    let (f, _, took) = failure(Server::Endless);
    assert_eq!(f, RasFailure::TooLarge);
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn a_trickle_stops_at_the_deadline() {
    let (f, _, took) = failure(Server::Trickle);
    assert_eq!(f, RasFailure::TimedOut);
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn a_silent_server_stops_at_the_deadline() {
    let (f, _, took) = failure(Server::Silent);
    assert_eq!(f, RasFailure::TimedOut);
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn binary_garbage_is_malformed() {
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    let (f, _, _) = failure(Server::Raw(garbage.clone()));
    assert_eq!(f, RasFailure::Malformed);
    // The same garbage as a report, after a proper handshake.
    let (f, a, _) = failure(Server::Nccl {
        report: garbage,
        json: false,
    });
    assert_eq!(f, RasFailure::Malformed);
    let excerpt = a.excerpt.expect("an excerpt");
    assert!(excerpt.chars().count() <= 4 * 400);
    assert!(!excerpt.chars().any(char::is_control), "{excerpt:?}");
}

#[test]
fn a_report_cut_short_is_malformed() {
    let full = report_of(&fixture("synthetic-mismatch-1-verbose.txt"));
    let (f, _, _) = failure(Server::Nccl {
        report: full[..full.len() / 2].to_vec(),
        json: false,
    });
    assert_eq!(f, RasFailure::Malformed);
    let json = report_of(&fixture("synthetic-healthy-1-json.txt"));
    let (f, _, _) = failure(Server::Nccl {
        report: json[..json.len() / 2].to_vec(),
        json: true,
    });
    assert_eq!(f, RasFailure::Malformed);
}

#[test]
fn terminal_escapes_are_kept_escaped() {
    let report = String::from_utf8(report_of(&fixture("synthetic-mismatch-1-verbose.txt")))
        .expect("utf-8")
        .replace("127.0.0.1", "\u{1b}]0;pwned\u{7}\u{1b}[2J")
        .replace("2.28.9+cuda12.9", "2.28.9\u{1b}[31m");
    let a = parse_text(report.as_bytes());
    assert_eq!(a.not_answered, None, "{a:?}");
    let node = a.communicators[0].ranks[0].node.clone().expect("node");
    assert!(!node.contains('\u{1b}'), "{node:?}");
    assert!(
        !a.nccl_version.expect("version").contains('\u{1b}'),
        "escaped"
    );
    let json = serde_json::to_string(&a.communicators).expect("json");
    assert!(!json.contains("\\u001b"), "{json}");
}

#[test]
fn a_wrong_handshake_is_malformed() {
    let (f, a, _) = failure(Server::Raw(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()));
    assert_eq!(f, RasFailure::Malformed);
    assert!(a.not_answered.expect("reason").reason.contains("handshake"));
}

#[test]
fn answers_go_into_recordings_and_come_back_on_replay() {
    use gpudiag_model::sample::{DeviceInfo, HostInfo, Sample};
    use gpudiag_telemetry::recording::{Header, RecordingWriter};
    use gpudiag_telemetry::replay::{Pace, ReplayBackend};
    use gpudiag_telemetry::{Backend, Tick};

    const T0: u64 = 1_800_000_000_000;
    let mut answer = parse_json(&report_of(&fixture("synthetic-mismatch-1-json.txt")));
    answer.time_ms = T0 + 1_200;
    answer.address = "127.0.0.1:28028".into();
    answer.for_devices = vec![0, 1];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ras.ndjson");
    let devices = (0..2)
        .map(|index| DeviceInfo {
            index,
            ..DeviceInfo::default()
        })
        .collect();
    let header = Header::new("nvml", HostInfo::default(), devices, Some(1000));
    let mut w = RecordingWriter::create(&path, &header).unwrap();
    for i in 0..3u64 {
        w.write_tick(&Tick {
            samples: (0..2).map(|d| Sample::new(d, T0 + i * 1000)).collect(),
            events: Vec::new(),
            ras: if i == 1 {
                vec![answer.clone()]
            } else {
                Vec::new()
            },
            kernels: None,
        })
        .unwrap();
    }
    w.finish().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("\"kind\":\"nccl_ras\"").count(), 1, "{text}");

    let mut replay = ReplayBackend::open(&path, Pace::AsFastAsPossible).unwrap();
    let mut replayed = Vec::new();
    let mut ticks = 0;
    while let Ok(t) = replay.poll() {
        ticks += 1;
        replayed.extend(t.ras);
    }
    assert_eq!(ticks, 3);
    assert_eq!(replayed, vec![answer]);
}

/// Real answers of NCCL 2.28.9 (`tests/fixtures/ras/h100x2/README.txt`): a 2-rank job, pids 983
/// and 985 on GPUs 0 and 1.
mod captured {
    use super::*;

    const JOB2: [(u32, u32); 2] = [(983, 0), (985, 1)];

    fn real(name: &str) -> Vec<u8> {
        fixture(&format!("h100x2/{name}.txt"))
    }

    #[test]
    fn a_healthy_job_in_json_counts_every_rank_alike() {
        let (a, _) = ask(Server::Nccl {
            report: report_of(&real("healthy-1-json")),
            json: true,
        });
        assert_eq!(a.not_answered, None, "{a:?}");
        assert_eq!(a.nccl_version.as_deref(), Some("2.28.9"));
        let c = &a.communicators[0];
        assert_eq!(c.hash, "0xa50f462560a2c036");
        assert_eq!(c.size, Some(2));
        let counts: Vec<_> = c
            .ranks
            .iter()
            .map(|r| {
                (
                    r.rank,
                    r.pid,
                    r.nvml_device,
                    r.operations["AllReduce"],
                    r.state,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [
                (0, Some(983), Some(0), 1790, RasRankState::Running),
                (1, Some(985), Some(1), 1790, RasRankState::Running)
            ]
        );
        assert!(c.count_groups.is_empty());
        assert_eq!(c.ranks[0].node.as_deref(), Some("192.0.2.2"));
        assert_eq!(matches_job(&a, &JOB2), RasMatch::Same);
        // A job of the same user on the host's other GPUs: this answer is not its.
        assert_eq!(matches_job(&a, &[(7001, 2), (7002, 3)]), RasMatch::Other);
    }

    #[test]
    fn a_healthy_text_report_has_no_counts_and_no_pids() {
        for name in ["healthy-1-verbose", "healthy-1-status", "healthy-2-verbose"] {
            let a = parse_text(&report_of(&real(name)));
            assert_eq!(a.not_answered, None, "{name}: {a:?}");
            assert_eq!(a.nccl_version.as_deref(), Some("2.28.9"), "{name}");
            assert_eq!(a.communicators_total, Some(1), "{name}");
            assert!(a.communicators.is_empty(), "{name}: {a:?}");
            assert!(
                a.errors.is_empty() && a.warnings.is_empty(),
                "{name}: {a:?}"
            );
            assert_eq!(matches_job(&a, &JOB2), RasMatch::Unknown);
        }
    }

    #[test]
    fn a_rank_that_stopped_calling_is_one_operation_behind() {
        let a = parse_json(&report_of(&real("mismatch-1-json")));
        let c = &a.communicators[0];
        let groups: Vec<_> = c
            .count_groups
            .iter()
            .map(|g| {
                (
                    g.collective.as_str(),
                    g.ranks_count,
                    g.operations,
                    g.ranks.clone(),
                )
            })
            .collect();
        assert_eq!(
            groups,
            [
                ("AllReduce", 1, 2076, vec![0]),
                ("AllReduce", 1, 2075, vec![1])
            ]
        );
        for name in [
            "mismatch-1-verbose",
            "mismatch-1-status",
            "mismatch-2-verbose",
        ] {
            let t = parse_text(&report_of(&real(name)));
            assert_eq!(t.not_answered, None, "{name}: {t:?}");
            let c = &t.communicators[0];
            assert_eq!(c.hash, "0xa50f462560a2c036", "{name}");
            assert_eq!(c.flags, ["MISMATCH"], "{name}");
            let ranks: Vec<_> = c
                .ranks
                .iter()
                .map(|r| (r.rank, r.pid, r.cuda_device, r.operations["AllReduce"]))
                .collect();
            assert_eq!(
                ranks,
                [(0, Some(983), Some(0), 2076), (1, Some(985), Some(1), 2075)],
                "{name}"
            );
            assert_eq!(matches_job(&t, &JOB2), RasMatch::Same, "{name}");
        }
    }

    #[test]
    fn a_killed_rank_is_silent_then_dead() {
        let first = parse_json(&report_of(&real("dead-1-json")));
        assert_eq!(first.not_answered, None, "{first:?}");
        let c = &first.communicators[0];
        assert_eq!(c.ranks.len(), 1);
        let missing: Vec<_> = c
            .missing_ranks
            .iter()
            .map(|r| (r.rank, r.pid, r.state))
            .collect();
        assert_eq!(missing, [(1, Some(985), RasRankState::Unresponsive)]);
        assert_eq!(first.dead_processes, Some(0));
        assert_eq!(first.missing_processes, Some(1));

        let later = parse_json(&report_of(&real("dead-2-json")));
        assert_eq!(later.not_answered, None, "{later:?}");
        let missing: Vec<_> = later.communicators[0]
            .missing_ranks
            .iter()
            .map(|r| (r.rank, r.state))
            .collect();
        assert_eq!(missing, [(1, RasRankState::Dead)]);
        assert_eq!(later.dead_processes, Some(1));

        let t = parse_text(&report_of(&real("dead-1-verbose")));
        assert_eq!(t.not_answered, None, "{t:?}");
        assert_eq!(t.missing_processes, Some(1));
        assert_eq!(t.dead_processes, None);
        assert_eq!(t.communicators[0].missing_ranks[0].pid, Some(985));
        assert!(
            t.errors.iter().any(|e| e.contains("process 985")),
            "{:?}",
            t.errors
        );

        let t = parse_text(&report_of(&real("dead-2-verbose")));
        assert_eq!(t.dead_processes, Some(1));
        assert!(
            t.errors
                .iter()
                .any(|e| e.contains("process 985") && e.contains("dead")),
            "{:?}",
            t.errors
        );
    }
}

/// The second capture (`tests/fixtures/ras/h100x2/README.txt`): two jobs of one user, several
/// communicators, a stopped rank.
mod captured_more {
    use super::*;

    fn real(name: &str) -> RasAnswer {
        let bytes = report_of(&fixture(&format!("h100x2/{name}.txt")));
        if name.ends_with("-json") {
            parse_json(&bytes)
        } else {
            parse_text(&bytes)
        }
    }

    #[test]
    fn each_of_two_jobs_of_one_user_tells_its_answer_from_the_others() {
        let job_a = [(633, 0)];
        let job_b = [(634, 1)];
        let first = real("twojobs-1-json");
        let second = real("twojobs-2-json");
        assert_eq!(matches_job(&first, &job_a), RasMatch::Same);
        assert_eq!(matches_job(&first, &job_b), RasMatch::Other);
        assert_eq!(matches_job(&second, &job_b), RasMatch::Same);
        assert_eq!(matches_job(&second, &job_a), RasMatch::Other);
    }

    #[test]
    fn several_communicators_of_one_job_each_count_their_own() {
        let a = real("multicomm-1-json");
        assert_eq!(a.communicators_total, Some(2));
        let kinds: Vec<Vec<(&str, u64)>> = a
            .communicators
            .iter()
            .map(|c| {
                c.ranks[0]
                    .operations
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| (k.as_str(), *n))
                    .collect()
            })
            .collect();
        assert_eq!(kinds.len(), 2);
        assert!(
            kinds
                .iter()
                .any(|k| k.iter().any(|(n, _)| *n == "AllReduce"))
        );
        assert!(
            kinds
                .iter()
                .any(|k| k.iter().any(|(n, _)| *n == "Broadcast"))
        );
        let t = real("multicomm-1-verbose");
        assert_eq!(t.not_answered, None, "{t:?}");
        assert_eq!(t.communicators_total, Some(2));
    }

    #[test]
    fn a_stopped_rank_is_missing_from_every_communicator() {
        let a = real("stopped-1-json");
        assert_eq!(a.not_answered, None, "{a:?}");
        assert_eq!(a.communicators.len(), 2);
        for c in &a.communicators {
            let missing: Vec<_> = c
                .missing_ranks
                .iter()
                .map(|r| (r.rank, r.pid, r.state))
                .collect();
            assert_eq!(missing, [(1, Some(670), RasRankState::Unresponsive)]);
        }
    }

    /// NCCL's own text for a stopped rank carried a communicator of garbage: it is kept
    /// bounded, and the real one is still read.
    #[test]
    fn nccls_garbage_ranks_stay_bounded() {
        let t = real("stopped-2-verbose");
        assert_eq!(t.not_answered, None, "{t:?}");
        assert_eq!(t.missing_processes, Some(1));
        let real_comm = t
            .communicators
            .iter()
            .find(|c| c.hash == "0xd88ed0abab795d3f")
            .expect("the world");
        assert_eq!(real_comm.missing_ranks.len(), 1);
        assert_eq!(real_comm.missing_ranks[0].pid, Some(670));
        let garbage = t
            .communicators
            .iter()
            .find(|c| c.hash == "0xffe0000200000001")
            .expect("the garbage one");
        assert!(garbage.missing_ranks.len() <= gpudiag_model::ras::MAX_RANKS);
        assert!(garbage.missing_ranks.iter().all(|r| r.pid.is_none()));
    }
}

/// Real answers of NCCL 2.28.9 on four H100s (`tests/fixtures/ras/h100x4/README.txt`).
mod captured_four {
    use super::*;

    fn real(name: &str) -> RasAnswer {
        let bytes = report_of(&fixture(&format!("h100x4/{name}.txt")));
        if name.ends_with("-json") {
            parse_json(&bytes)
        } else {
            parse_text(&bytes)
        }
    }

    const SCENARIOS: [&str; 12] = [
        "healthy-1",
        "healthy-2",
        "mismatch-1",
        "mismatch-2",
        "twojobs-1",
        "twojobs-2",
        "twojobs-3",
        "twojobs-4",
        "stopkill-1",
        "stopkill-2",
        "multicomm-1",
        "ckpt-pause",
    ];

    #[test]
    fn every_answer_reads_in_every_form() {
        for scenario in SCENARIOS {
            for form in ["json", "verbose", "status"] {
                let name = format!("{scenario}-{form}");
                let a = real(&name);
                assert_eq!(a.not_answered, None, "{name}: {a:?}");
                assert_eq!(
                    a.nccl_version.as_deref().map(|v| v.starts_with("2.28.9")),
                    Some(true),
                    "{name}"
                );
                assert!(a.communicators_total.is_some_and(|n| n >= 1), "{name}");
            }
        }
    }

    #[test]
    fn three_ranks_ahead_and_the_one_that_stopped_calling() {
        let t = real("mismatch-1-verbose");
        let c = &t.communicators[0];
        let groups: Vec<_> = c
            .count_groups
            .iter()
            .map(|g| (g.ranks_count, g.operations, g.ranks.clone()))
            .collect();
        assert_eq!(groups, [(3, 300, vec![]), (1, 299, vec![3])]);
        assert_eq!(c.ranks[0].pid, Some(1098));
        let a = real("mismatch-1-json");
        let all_reduce: Vec<_> = a.communicators[0]
            .ranks
            .iter()
            .map(|r| (r.pid, r.operations["AllReduce"]))
            .collect();
        assert_eq!(
            all_reduce,
            [
                (Some(1095), 300),
                (Some(1096), 300),
                (Some(1097), 300),
                (Some(1098), 299)
            ]
        );
        let healthy = real("healthy-1-json");
        assert!(healthy.communicators[0].count_groups.is_empty());
    }

    /// Two jobs of one user: the answers name one job's pids, and each job tells them apart.
    #[test]
    fn two_jobs_answers_belong_to_one_of_them() {
        let job_a = [(1609, 0), (1610, 1)];
        let job_b = [(1381, 2), (1380, 3)];
        for n in 1..=4 {
            let a = real(&format!("twojobs-{n}-json"));
            assert_eq!(matches_job(&a, &job_b), RasMatch::Same, "twojobs-{n}");
            assert_eq!(matches_job(&a, &job_a), RasMatch::Other, "twojobs-{n}");
        }
        let stopped = real("stopkill-1-json");
        assert_eq!(matches_job(&stopped, &job_a), RasMatch::Same);
        assert_eq!(matches_job(&stopped, &job_b), RasMatch::Other);
        let missing: Vec<_> = stopped.communicators[0]
            .missing_ranks
            .iter()
            .map(|r| (r.rank, r.pid, r.state))
            .collect();
        assert_eq!(missing, [(1, Some(1610), RasRankState::Unresponsive)]);
        let dead = real("stopkill-2-verbose");
        assert_eq!(dead.dead_processes, Some(1));
        assert_eq!(matches_job(&dead, &job_a), RasMatch::Same);
    }

    /// A rank-0 checkpoint: rank 0 one all-reduce behind its waiting peer.
    #[test]
    fn a_checkpointing_rank_zero_is_behind() {
        for name in ["ckpt-pause-json", "ckpt-pause-verbose"] {
            let a = real(name);
            let c = &a.communicators[0];
            let behind: Vec<_> = c
                .count_groups
                .iter()
                .filter(|g| g.collective == "AllReduce")
                .map(|g| (g.operations, g.ranks.clone()))
                .collect();
            assert_eq!(behind, [(227, vec![1]), (226, vec![0])], "{name}");
        }
    }
}
