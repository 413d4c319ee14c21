//! A reader that stops early (`carma simulate | head -1`) closes the pipe under carma's stdout;
//! every command then ends quietly: no panic ("failed printing to stdout: Broken pipe", exit 101)
//! and no error message, exit 0.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};

fn carma(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_carma"));
    c.args(args)
        .env_remove("CARMA_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// What is wrong with how a command ended, if anything.
fn noise(what: &str, out: &Output) -> Option<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let loud = stderr.contains("panicked") || stderr.to_lowercase().contains("broken pipe");
    (out.status.code() == Some(101) || loud || !out.status.success())
        .then(|| format!("{what}: {}\n{stderr}", out.status))
}

/// `carma simulate | head -1`: one line read, then the pipe dropped while carma may still write.
#[test]
fn simulate_piped_into_head() {
    let mut child = carma(&["simulate"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn carma");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read the first line");
    assert!(!first.is_empty(), "no output");
    // the reader is dropped here, as `head -1` exits after its line
    let out = child.wait_with_output().expect("wait for carma");
    if let Some(n) = noise("simulate | head -1", &out) {
        panic!("{n}");
    }
}

/// Each command that prints on stdout, with the pipe's reader gone before it writes (the
/// deterministic form of the race above: `head` may exit before carma has written everything).
#[test]
fn every_printing_command_ends_quietly_on_a_closed_pipe() {
    let state = tempfile::tempdir().unwrap();
    let state = state.path().to_str().unwrap();
    let profile =
        r#"{"family":"cnn","batchSize":64,"parameters":11689512,"activations":2300000,"depth":18}"#;
    let cases: Vec<(&str, Vec<&str>, Option<&str>)> = vec![
        ("simulate", vec!["simulate"], None),
        (
            "simulate --format json",
            vec!["simulate", "--format", "json"],
            None,
        ),
        ("crds", vec!["crds"], None),
        ("version", vec!["version"], None),
        (
            "estimate",
            vec!["estimate", "--profile", "-"],
            Some(profile),
        ),
        (
            "local status --format json",
            vec!["local", "status", "--state-dir", state, "--format", "json"],
            None,
        ),
        (
            "local status",
            vec!["local", "status", "--state-dir", state],
            None,
        ),
        (
            "local report --format json",
            vec!["local", "report", "--state-dir", state, "--format", "json"],
            None,
        ),
    ];
    let mut failures = Vec::new();
    for (what, args, stdin) in cases {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut cmd = carma(&args);
        cmd.stdout(writer);
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().expect("spawn carma");
        drop(cmd);
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            use std::io::Write as _;
            input.write_all(text.as_bytes()).expect("write stdin");
        }
        let mut stderr = Vec::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_end(&mut stderr)
            .expect("read stderr");
        let status = child.wait().expect("wait for carma");
        let out = Output {
            status,
            stdout: Vec::new(),
            stderr,
        };
        failures.extend(noise(what, &out));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
