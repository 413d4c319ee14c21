//! The `carma simulate` output the README shows is the real output, byte for byte.
//!
//! README.md holds it in the fenced block right after the line `<!-- simulate-output -->`. This
//! test runs the `carma` binary as the README tells users to (`cargo run -p carma -- simulate`, from
//! the repository root) and compares its standard output with that block. When a change moves the
//! figures, run `cargo run -q -p carma -- simulate` and paste its output over the block.

use std::path::{Path, PathBuf};
use std::process::Command;

const MARKER: &str = "<!-- simulate-output -->";

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent folder")
        .to_path_buf()
}

/// The text between the fences of the block after [`MARKER`], every line with its newline.
fn readme_block(readme: &str) -> Result<String, String> {
    let mut parts = readme.split(MARKER);
    parts.next();
    let after = parts
        .next()
        .ok_or_else(|| format!("README.md has no `{MARKER}` line"))?;
    if parts.next().is_some() {
        return Err(format!("README.md has more than one `{MARKER}` line"));
    }
    let body = after
        .strip_prefix("\n```\n")
        .ok_or_else(|| format!("the line after `{MARKER}` in README.md must open a ``` fence"))?;
    let end = body
        .find("\n```\n")
        .ok_or_else(|| "the block after the marker in README.md is not closed".to_string())?;
    Ok(body[..=end].to_string())
}

/// The first line where `expected` and `actual` differ: (1-based number, expected, actual).
fn first_difference(expected: &str, actual: &str) -> (usize, String, String) {
    let (mut e, mut a) = (expected.lines(), actual.lines());
    for n in 1.. {
        match (e.next(), a.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => break,
            (x, y) => {
                let show =
                    |l: Option<&str>| l.map_or("<no line>".to_string(), |l| format!("{l:?}"));
                return (n, show(x), show(y));
            }
        }
    }
    // Same lines: the difference is in line endings or the final newline.
    (0, format!("{expected:?}"), format!("{actual:?}"))
}

#[test]
fn readme_shows_the_real_simulate_output() {
    let root = repository_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let expected = readme_block(&readme).unwrap_or_else(|e| panic!("{e}"));

    let out = Command::new(env!("CARGO_BIN_EXE_carma"))
        .arg("simulate")
        .current_dir(&root)
        .output()
        .expect("run carma simulate");
    assert!(
        out.status.success(),
        "carma simulate failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let actual = String::from_utf8(out.stdout).expect("carma simulate prints UTF-8");

    if actual != expected {
        let (line, e, a) = first_difference(&expected, &actual);
        panic!(
            "README.md's `carma simulate` block differs from the real output at line {line} of the block:\n\
             README: {e}\n\
             real:   {a}\n\
             Run `cargo run -q -p carma -- simulate` and paste its output over the block after \
             `{MARKER}` in README.md.\n\nThe real output:\n{actual}"
        );
    }
}

#[test]
fn the_block_is_found_by_its_marker() {
    let readme = format!("text\n{MARKER}\n```\nline 1\n\nline 3\n```\nmore\n");
    assert_eq!(readme_block(&readme).unwrap(), "line 1\n\nline 3\n");
    assert!(readme_block("no marker\n").is_err());
    assert!(readme_block(&format!("{MARKER}\ntext\n```\nx\n```\n")).is_err());
    assert!(readme_block(&format!("{MARKER}\n```\nx\n")).is_err());
    let twice = format!("{MARKER}\n```\nx\n```\n{MARKER}\n```\ny\n```\n");
    assert!(readme_block(&twice).is_err());
    assert_eq!(first_difference("a\nb\n", "a\nc\n").0, 2);
    assert_eq!(first_difference("a\n", "a\nb\n").0, 2);
}
