//! The terminal UI end to end in a real terminal: tmux runs `gpudiag --demo` from a shell, the
//! test types keys, reads the pane, and checks what a person would see, then that the shell's
//! terminal is back as it was (no alternate screen, no mouse capture, same stty settings).
//!
//! With `GPUDIAG_UPDATE_SCREENS=1` the captures are also written to `assets/screens/`, as the
//! text captures docs/tui.md links to.

use std::time::Duration;

use crate::support::at;
use crate::support::tmux::Tmux;

const WAIT: Duration = Duration::from_secs(15);

fn save_screen(name: &str, screen: &str) {
    if std::env::var_os("GPUDIAG_UPDATE_SCREENS").is_none() {
        return;
    }
    let dir = at("assets/screens");
    std::fs::create_dir_all(&dir).unwrap();
    let text: Vec<&str> = screen.lines().map(str::trim_end).collect();
    std::fs::write(dir.join(format!("{name}.txt")), text.join("\n") + "\n").unwrap();
}

/// The replay position shown in the header, "0:41/1:28".
fn position(screen: &str) -> String {
    screen
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .find(|w| w.contains(":") && w.contains('/'))
        })
        .unwrap_or_default()
        .to_owned()
}

fn walk_the_demo(width: u16, height: u16) {
    let tmux = Tmux::start(width, height, &format!("{width}x{height}"));
    let bin = env!("CARGO_BIN_EXE_gpudiag");
    tmux.type_line(&format!(
        "S=$(stty -g); {bin} --demo; echo \"exit=$?\"; [ \"$(stty -g)\" = \"$S\" ] && echo tty-restored"
    ));
    let screen = tmux.wait_for(&["[1 Devices]", "REPLAY", "NVIDIA H200", "util"], WAIT);
    assert_eq!(tmux.display("#{alternate_on}"), "1", "{screen}");

    // Into the load phase of the demo, then hold it still.
    tmux.keys(&["Right", "Right", "Right", "Right"]);
    tmux.wait_for(&["REPLAY 0:4"], WAIT);
    tmux.keys(&["Space"]);
    let paused = tmux.wait_for(&["PAUSED REPLAY"], WAIT);
    let at = position(&paused);
    std::thread::sleep(Duration::from_millis(1500));
    let still = tmux.capture();
    assert_eq!(
        position(&still),
        at,
        "paused, yet the position moved:\n{still}"
    );
    assert!(still.contains("°C"), "{still}");
    save_screen(&format!("devices-{width}x{height}"), &still);

    let detail = {
        tmux.keys(&["2"]);
        tmux.wait_for(
            &[
                "[2 Detail]",
                "util",
                "memory",
                "power",
                "temp",
                "clocks",
                "PCIe",
            ],
            WAIT,
        )
    };
    save_screen(&format!("detail-{width}x{height}"), &detail);

    tmux.keys(&["Tab"]);
    let procs = tmux.wait_for(&["[3 Processes]", "PID", "python3"], WAIT);
    save_screen(&format!("processes-{width}x{height}"), &procs);

    tmux.keys(&["4"]);
    let findings = tmux.wait_for(&["[4 Findings]"], WAIT);
    save_screen(&format!("findings-{width}x{height}"), &findings);

    tmux.keys(&["5"]);
    let probes = tmux.wait_for(&["[5 Probes]", "Probes need live GPUs"], WAIT);
    save_screen(&format!("probes-{width}x{height}"), &probes);

    tmux.keys(&["?"]);
    let help = tmux.wait_for(&["Keys", "kill the selected process", "quit"], WAIT);
    save_screen(&format!("help-{width}x{height}"), &help);
    tmux.keys(&["Escape"]);
    let closed = tmux.wait_without("kill the selected process", WAIT);
    assert!(closed.contains("[5 Probes]"), "{closed}");

    // Resume, then quit: the shell gets its terminal back exactly as it was.
    tmux.keys(&["Space"]);
    tmux.wait_for(&["REPLAY"], WAIT);
    tmux.keys(&["q"]);
    let after = tmux.wait_for(&["exit=0", "tty-restored"], WAIT);
    assert!(!after.contains("[5 Probes]"), "{after}");
    assert_eq!(tmux.display("#{alternate_on}"), "0");
    assert_eq!(tmux.display("#{mouse_any_flag}"), "0");
    assert_eq!(tmux.display("#{cursor_flag}"), "1");
}

#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn demo_at_80x24() {
    walk_the_demo(80, 24);
}

#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn demo_at_120x36() {
    walk_the_demo(120, 36);
}

#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn replay_of_an_ecc_error_shows_its_findings() {
    let tmux = Tmux::start(80, 24, "replay");
    let bin = env!("CARGO_BIN_EXE_gpudiag");
    let file = at("tests/fixtures/recordings/ecc_error.ndjson");
    tmux.type_line(&format!(
        "{bin} replay {} --speed 64; echo \"exit=$?\"",
        file.display()
    ));
    tmux.wait_for(&["REPLAY END 0:05/0:05 ×64", "2 fail 1 warn"], WAIT);
    tmux.keys(&["4"]);
    let screen = tmux.wait_for(
        &["[4 Findings]", "FAIL", "XID 48", "evidence: xid=48"],
        WAIT,
    );
    save_screen("findings-ecc-error-80x24", &screen);
    // Enter opens the selected (worst) finding whole; Escape closes it.
    tmux.keys(&["Enter"]);
    let detail = tmux.wait_for(&["Evidence", "What to do", "Esc closes"], WAIT);
    save_screen("finding-detail-ecc-error-80x24", &detail);
    tmux.keys(&["Escape"]);
    tmux.wait_without("What to do", WAIT);
    // Paused, seeking back goes to the start and stays there.
    tmux.keys(&["Space", "Left"]);
    tmux.wait_for(&["PAUSED REPLAY 0:00/0:05"], WAIT);
    tmux.keys(&["q"]);
    tmux.wait_for(&["exit=0"], WAIT);
}

/// Whether any SGR sequence in `styled` sets a foreground or background colour.
fn has_colour(styled: &str) -> bool {
    styled.split("\x1b[").skip(1).any(|seq| {
        let Some(params) = seq.split('m').next() else {
            return false;
        };
        params.split(';').any(|p| {
            matches!(
                p.parse::<u32>(),
                Ok(30..=38 | 40..=48 | 90..=97 | 100..=107)
            )
        })
    })
}

#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn no_color_is_respected() {
    for (no_color, coloured) in [(true, false), (false, true)] {
        let tmux = Tmux::start(80, 24, &format!("colour-{no_color}"));
        let bin = env!("CARGO_BIN_EXE_gpudiag");
        let env = if no_color { "NO_COLOR=1 " } else { "" };
        tmux.type_line(&format!("{env}{bin} --demo"));
        tmux.wait_for(&["[1 Devices]", "°C"], WAIT);
        let styled = tmux.capture_styled();
        assert_eq!(
            has_colour(&styled),
            coloured,
            "NO_COLOR={no_color}:\n{styled:?}"
        );
        tmux.keys(&["q"]);
    }
}

#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn sigterm_restores_the_terminal() {
    let tmux = Tmux::start(80, 24, "sigterm");
    let bin = env!("CARGO_BIN_EXE_gpudiag");
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // In the foreground, as a person runs it; the shell writes the PID it is about to exec.
    tmux.type_line(&format!(
        "S=$(stty -g); sh -c 'echo $$ > {}; exec {bin} --demo'; echo \"exit=$?\"; [ \"$(stty -g)\" = \"$S\" ] && echo tty-restored",
        pid_file.display()
    ));
    tmux.wait_for(&["[1 Devices]", "REPLAY"], WAIT);
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    tmux.wait_for(&["exit=0", "tty-restored"], WAIT);
    assert_eq!(tmux.display("#{alternate_on}"), "0");
    assert_eq!(tmux.display("#{mouse_any_flag}"), "0");
}

/// `gpudiag` with no live GPU (this machine has no NVML) opens the demo and says why: the whole
/// notice above the key hints, gone after a key press.
#[test]
#[ignore = "needs tmux; CI runs it: cargo nextest run --run-ignored only -E 'binary(e2e)'"]
fn without_a_gpu_the_notice_is_whole_and_the_hints_stay() {
    let tmux = Tmux::start(80, 24, "nogpu");
    let bin = env!("CARGO_BIN_EXE_gpudiag");
    tmux.type_line(&format!("{bin}; echo \"exit=$?\""));
    let screen = tmux.wait_for(&["[1 Devices]", "no live NVIDIA GPU here", "?:help"], WAIT);
    let words: String = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("opening the bundled demo recording (gpudiag --demo)"),
        "{screen}"
    );
    assert!(screen.contains("q:quit"), "{screen}");
    tmux.keys(&["2"]);
    let after = tmux.wait_without("no live NVIDIA GPU here", WAIT);
    assert!(
        after.contains("[2 Detail]") && after.contains("?:help"),
        "{after}"
    );
    tmux.keys(&["q"]);
    tmux.wait_for(&["exit=0"], WAIT);
}
