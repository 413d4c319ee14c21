//! The syntax of one line of an annotated module printout ([`crate::printout`]): a module
//! `(key): [N x ]Type(args)[, n params]`, and the numbers inside its arguments.

use std::borrow::Cow;

use crate::torchsummary::parse_count;

/// A byte of a module's type or key: letters, digits, `_` and `.`.
pub(crate) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.'
}

/// One module line: `(key): [N x ]Type(args)[, n params]` or the root `Type(…`.
pub(crate) struct ModuleLine<'a> {
    /// The `(key)`: empty for the root.
    pub key: &'a str,
    pub repeat: u32,
    pub kind: &'a str,
    /// `Some(args)` for a module closed on its line, `None` for an opening one.
    pub args: Option<&'a str>,
    pub params: Option<u64>,
}

/// Splits a module line. The root has no `(key): ` prefix.
pub(crate) fn module_line(line: &str, is_root: bool) -> Result<ModuleLine<'_>, &'static str> {
    let mut rest = line;
    let mut repeat = 1u32;
    let mut name = "";
    if !is_root {
        let after = rest
            .strip_prefix('(')
            .ok_or("expected `(name): Module(…)` or `)`")?;
        let (key, tail) = after
            .split_once("): ")
            .ok_or("expected `(name): Module(…)` or `)`")?;
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err("module name must be one word");
        }
        name = key;
        rest = tail;
        if let Some((n, tail)) = rest.split_once(" x ")
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            repeat = n.parse().map_err(|_| "repeat count is too large")?;
            if repeat == 0 {
                return Err("repeat count must be at least 1");
            }
            rest = tail;
        }
    }
    let open = rest.find('(').ok_or("expected `Module(`")?;
    let kind = &rest[..open];
    if kind.is_empty() || !kind.bytes().all(is_name_byte) {
        return Err("module type must be a name like `Linear`");
    }
    let body = &rest[open + 1..];
    if body.is_empty() {
        return Ok(ModuleLine {
            key: name,
            repeat,
            kind,
            args: None,
            params: None,
        });
    }
    let close = matching_paren(body).ok_or("unbalanced parentheses")?;
    let params =
        params_suffix(&body[close + 1..]).ok_or("expected `, <n> params` after the module")?;
    Ok(ModuleLine {
        key: name,
        repeat,
        kind,
        args: Some(&body[..close]),
        params: Some(params),
    })
}

/// The printout's lines, trimmed, with their 1-based numbers, a module whose arguments span
/// lines joined into one: a line that opens more parentheses than it closes and does not end
/// with `(` (which opens a container) continues, joined by spaces, until they balance or the text
/// ends. A module's `extra_repr` may hold line breaks: xLSTM's `xLSTMBackend(xLSTMConfig {…})`
/// prints a configuration as JSON, a `ParameterList(…)` one parameter a line.
pub(crate) fn logical_lines(text: &str) -> impl Iterator<Item = (usize, Cow<'_, str>)> {
    let mut lines = text.lines().map(str::trim).enumerate().peekable();
    std::iter::from_fn(move || {
        let (i, first) = lines.next()?;
        let mut depth = paren_depth(first);
        if depth <= 0 || first.ends_with('(') {
            return Some((i + 1, Cow::Borrowed(first)));
        }
        let mut joined = first.to_string();
        while depth > 0
            && let Some((_, next)) = lines.next()
        {
            depth += paren_depth(next);
            joined.push(' ');
            joined.push_str(next);
        }
        Some((i + 1, Cow::Owned(joined)))
    })
}

/// `(` less `)` in `s`.
fn paren_depth(s: &str) -> i64 {
    s.bytes().fold(0, |d, b| match b {
        b'(' => d + 1,
        b')' => d - 1,
        _ => d,
    })
}

/// Index of the `)` that closes an already opened `(` in `s`.
pub(crate) fn matching_paren(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' if depth == 0 => return Some(i),
            b')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `, 1,536 params` → 1536.
pub(crate) fn params_suffix(s: &str) -> Option<u64> {
    let n = s.trim().strip_prefix(',')?.trim().strip_suffix("params")?;
    parse_count(n)
}

/// The `i`-th comma-separated argument as a positive number.
pub(crate) fn positional(args: &str, i: usize) -> Option<u64> {
    positive(args.split(',').nth(i)?)
}

/// The value of `key=` as a positive number.
pub(crate) fn keyword(args: &str, key: &str) -> Option<u64> {
    args.split(',').find_map(|a| {
        let (k, v) = a.split_once('=')?;
        (k.trim() == key).then(|| positive(v)).flatten()
    })
}

/// `(768,), eps=…` or `768, eps=…` → 768.
pub(crate) fn first_dim(args: &str) -> Option<u64> {
    let a = args.trim_start().trim_start_matches(['(', '[']);
    positive(a.split([',', ')', ']']).next()?)
}

pub(crate) fn positive(s: &str) -> Option<u64> {
    s.trim().parse::<u64>().ok().filter(|v| *v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printout::looks_like_printout;

    #[test]
    fn helpers() {
        assert_eq!(params_suffix(", 1,536 params"), Some(1536));
        assert_eq!(params_suffix(" 1,536 params"), None);
        assert_eq!(first_dim("(768,), eps=1e-12"), Some(768));
        assert_eq!(
            keyword("in_features=3, out_features=7, bias=True", "out_features"),
            Some(7)
        );
        assert_eq!(matching_paren("(a)b), x"), Some(4));
        assert!(looks_like_printout("\n  Net(\n"));
        let text = "Net(\n  (a): P(  (0): x\n  (1): y), 2 params\n  (b): Q(\n  ), 0 params\n";
        let lines: Vec<(usize, String)> = logical_lines(text)
            .map(|(n, l)| (n, l.into_owned()))
            .collect();
        assert_eq!(
            lines,
            [
                (1, "Net(".to_string()),
                (2, "(a): P(  (0): x (1): y), 2 params".to_string()),
                (4, "(b): Q(".to_string()),
                (5, "), 0 params".to_string()),
            ]
        );
        assert!(!looks_like_printout(
            "Layer (type)  Output Shape  Param #\n"
        ));
    }
}
