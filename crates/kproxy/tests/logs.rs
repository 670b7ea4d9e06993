//! Logs carry terminal colour codes only on a terminal: not in a file or a pipe (what
//! `kubectl logs` shows), and never under `NO_COLOR`. The real binary, `--write-config-to`
//! (one info line, no root, no kernel).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

use std::process::Command;

const ESC: char = '\u{1b}';

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kproxy-logs-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let dir = scratch("pipe");
    let out = Command::new(env!("CARGO_BIN_EXE_kproxy"))
        .arg(format!("--write-config-to={}", dir.join("config.yaml").display()))
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("wrote the effective configuration"), "the info line: {stderr}");
    assert!(!stderr.contains(ESC), "no colour codes in a pipe: {stderr:?}");
}

/// Runs kproxy with its stderr on a terminal (`script` gives it a pseudo-terminal) and returns
/// what the terminal showed; `None` without `script`.
fn on_a_terminal(no_color: Option<&str>) -> Option<String> {
    let dir = scratch(&format!("tty-{}", no_color.unwrap_or("unset").len()));
    let command = format!("{} --write-config-to={}", env!("CARGO_BIN_EXE_kproxy"), dir.join("config.yaml").display());
    let mut script = Command::new("script");
    script.args(["-q", "-e", "-c", &command, "/dev/null"]);
    match no_color {
        Some(v) => script.env("NO_COLOR", v),
        None => script.env_remove("NO_COLOR"),
    };
    let out = script.output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.ok()?;
    assert!(out.status.success(), "{out:?}");
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn logs_to_a_terminal_are_coloured_unless_no_color_is_set() {
    let Some(coloured) = on_a_terminal(None) else {
        assert!(std::env::var_os("CI").is_none(), "`script` (util-linux) is needed under CI");
        eprintln!("skipped: no `script` to give kproxy a terminal");
        return;
    };
    assert!(coloured.contains("wrote the effective configuration"), "the info line: {coloured:?}");
    assert!(coloured.contains(ESC), "colours on a terminal: {coloured:?}");
    let plain = on_a_terminal(Some("1")).unwrap();
    assert!(plain.contains("wrote the effective configuration"), "the info line: {plain:?}");
    assert!(!plain.contains(ESC), "NO_COLOR=1 turns colours off: {plain:?}");
    let empty = on_a_terminal(Some("")).unwrap();
    assert!(empty.contains(ESC), "an empty NO_COLOR does not (no-color.org): {empty:?}");
}
