//! Keys, request ids and instance names come from request input: no text output (`list`,
//! `show`, `watch`, `unlock` and its question on a pseudo-terminal) lets them drive the
//! terminal, forge a row or reorder the text.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::{ErrorKind, owner};
use lock_tests::harness::{Kind, spawn_child, unique_key};

use crate::{Fixture, LOCKCTL, Process, Run};

/// Fails when `out` holds a character that drives a terminal (a control character other than
/// the line ends, a bidi control) or a line that starts as the forged row of a key.
fn assert_printable(what: &str, out: &str) {
    for c in out.chars() {
        let raw = (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        assert!(!raw, "{what}: a raw {c:?} in the output: {out:?}");
    }
    assert!(
        !out.lines().any(|l| l.starts_with("FORGED")),
        "{what}: a forged row: {out:?}"
    );
}

/// A pseudo-terminal: (its controlling side, the terminal a process reads from).
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: plain libc calls on a descriptor this function owns; `name` is NUL-terminated
    // by ptsname_r on success
    let (master, path) = unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = std::fs::File::from_raw_fd(fd);
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0, "grantpt");
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        let named = libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len());
        assert_eq!(named, 0, "ptsname_r");
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_owned();
        (master, path)
    };
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    (master, terminal)
}

/// `lockctl unlock args...` with a terminal as stdin, answering `answer` to its question.
async fn unlock_on_a_terminal(config: &Path, args: &[&str], answer: &str) -> Run {
    use std::io::Write;
    let (mut master, terminal) = pty();
    let mut cmd = Command::new(LOCKCTL);
    cmd.arg("--config")
        .arg(config)
        .arg("unlock")
        .args(args)
        .stdin(Stdio::from(terminal))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_child(cmd).expect("start lockctl unlock");
    // the terminal keeps the line until lockctl reads it
    master.write_all(answer.as_bytes()).unwrap();
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
    )
    .await
    .expect("lockctl unlock answers within 20 s")
    .unwrap();
    drop(master);
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The first refresh `lockctl watch` prints (stdout piped: no redraw).
async fn first_watch_block(config: &Path, pattern: &str) -> String {
    let mut cmd = Command::new(LOCKCTL);
    cmd.arg("--config")
        .arg(config)
        .args(["watch", pattern, "--interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = spawn_child(cmd).expect("start lockctl watch");
    let stdout = child.stdout.take().expect("piped stdout");
    let _watch = Process(child);
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || {
            // a block: the header, `N locks held`, a blank line, the table, a blank line
            let mut reader = BufReader::new(stdout);
            let mut block = Vec::new();
            let mut blanks = 0;
            while blanks < 2 {
                let mut line = Vec::new();
                if reader.read_until(b'\n', &mut line).unwrap() == 0 {
                    break;
                }
                blanks += usize::from(line == b"\n");
                block.extend_from_slice(&line);
            }
            String::from_utf8_lossy(&block).into_owned()
        }),
    )
    .await
    .expect("lockctl watch prints a refresh within 20 s")
    .unwrap()
}

/// Keys (and request ids) come from request input: no text output lets them drive the
/// terminal, forge a row or reorder the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_output_escapes_control_characters() {
    let fx = Fixture::new(Kind::Single).await;
    let locks = &fx.locks;
    let base = unique_key("esc");
    // sets the terminal title, clears the screen, colours what follows
    let title = format!("{base}:goods:\x1b]0;pwned\x07\x1b[2J\x1b[31mred\u{9b}31m");
    let forged = format!("{base}:goods:1\nFORGED-ROW  mutex  admin#1  req-1  1  9.9s  1  0");
    let bidi = format!("{base}:goods:\u{202e}fdp.exe\u{2066}");
    let mut guards = Vec::new();
    for key in [&title, &forged, &bidi] {
        let guard = owner::chain("req-\x1b[32m\u{202e}9\r", async {
            locks.lock(key).lease(Duration::from_secs(60)).await
        })
        .await
        .unwrap();
        guards.push(guard);
    }
    // an instance name comes from another service's configuration
    let other = fx.other_service("ops\u{202e}1").await;
    let named = format!("{base}:named");
    let named_guard = other
        .lock(&named)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    // the same key as a read-write lock too: `unlock` without --kind names the key in its error
    let read = locks
        .read(&title)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    let pattern = format!("{base}*");

    let run = fx.lockctl(&["list", &pattern]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_printable("list", &run.stdout);
    assert_eq!(run.stdout.lines().count(), 1 + 5, "{run:?}");
    for shown in [
        "\\x1b]0;pwned\\x07\\x1b[2J",
        "\\nFORGED-ROW",
        "\\u{202e}fdp.exe",
        "req-\\x1b[32m",
        "ops\\u{202e}1",
    ] {
        assert!(run.stdout.contains(shown), "{shown} not in {run:?}");
    }

    for key in [&title, &forged, &bidi] {
        let run = fx.lockctl(&["show", key, "--kind", "mutex"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_printable("show", &run.stdout);
    }
    let run = fx
        .lockctl(&["show", &format!("{base}:free\x1b[2J\n\u{202e}")])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert_printable("show of a free lock", &run.stdout);

    let run = fx.lockctl(&["show", &named]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("instance ops\\u{202e}1"), "{run:?}");
    assert_printable("show of a named holder", &run.stdout);

    let block = first_watch_block(&fx.config, &pattern).await;
    assert!(block.contains("5 locks held"), "{block:?}");
    assert!(block.contains("ops\\u{202e}1"), "{block:?}");
    assert_printable("watch", &block);
    named_guard.release().await.unwrap();

    // several kinds under one key: the error names the key
    let run = fx.lockctl(&["unlock", &title, "--yes"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_printable("unlock of several kinds", &run.stderr);
    read.release().await.unwrap();

    // the question on a terminal, answered no: nothing removed
    for key in [&title, &forged, &bidi] {
        let run = unlock_on_a_terminal(&fx.config, &[key], "n\n").await;
        assert_eq!(run.code, 1, "{run:?}");
        assert!(run.stdout.contains("Force-unlock the mutex"), "{run:?}");
        assert_printable("the unlock prompt", &run.stdout);
        assert!(locks.is_locked(key).await.unwrap());
    }
    // and what --yes removed
    for key in [&title, &forged, &bidi] {
        let run = fx.lockctl(&["unlock", key, "--yes"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_printable("unlock --yes", &run.stdout);
        let run = fx.lockctl(&["unlock", key, "--yes"]).await;
        assert_eq!(run.code, 1, "{run:?}");
        assert_printable("unlock of a free lock", &run.stdout);
    }
    for guard in guards {
        let e = guard.release().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    }
}
