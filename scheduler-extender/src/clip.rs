//! Request-derived text cut to a bounded length before it goes into a log line, an Event or an
//! error answer (a pod's annotation may be hundreds of KiB).

use std::borrow::Cow;

/// Longest request-derived text written into a log line, an Event or an error
/// answer; longer text is cut by [`clip`].
pub const LOGGED_INPUT_LIMIT: usize = 512;

/// `text` cut to at most [`LOGGED_INPUT_LIMIT`] bytes (on a character
/// boundary), followed by `… (N bytes)` naming the full length when cut.
pub fn clip(text: &str) -> Cow<'_, str> {
    if text.len() <= LOGGED_INPUT_LIMIT {
        return Cow::Borrowed(text);
    }
    let mut end = LOGGED_INPUT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len()))
}
