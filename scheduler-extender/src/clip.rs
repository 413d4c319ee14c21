//! Request-derived text cut to a bounded length before it goes into a log line, an Event or an
//! error answer (a pod's annotation may be hundreds of KiB).

use std::borrow::Cow;

/// Longest request-derived text written into a log line, an Event or an error
/// answer; longer text is cut by [`clip`].
pub const LOGGED_INPUT_LIMIT: usize = 512;

/// `text` cut to at most [`LOGGED_INPUT_LIMIT`] bytes (on a character
/// boundary), followed by `… (N bytes)` naming the full length when cut: the rule of
/// [`carma_http::health::clip`], which also cuts what a 404 repeats of the request.
pub fn clip(text: &str) -> Cow<'_, str> {
    carma_http::health::clip(text, LOGGED_INPUT_LIMIT)
}
